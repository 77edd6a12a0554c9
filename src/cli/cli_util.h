// Helpers shared by the subcommands: defaults, threads, checkpoint lookup,
// and loading a model for inference.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "train/trainer.h"

// The built-in default: a small DiT for 32x32 Fashion-MNIST and its recipe,
// sized to train in about ten minutes on two CPU cores.
dc_dit_config cli_demo_model(void);
dc_train_config cli_demo_train(void);

// Sets OpenMP and OpenBLAS threads (0: all cores).
int cli_set_threads(int threads);
// The backend for --device (auto, cuda, cpu) and --precision (auto, bf16,
// fp32): auto picks the GPU when one is present, bf16 on it, fp32 on the CPU.
int cli_backend(const char *device, const char *precision, dc_backend **be);
#define CLI_DEVICE_HELP "auto (GPU if present), cuda or cpu"
#define CLI_PRECISION_HELP "GPU compute: auto (bf16), bf16 or fp32 (for checking)"
// Steps of the run folder's step_NNNNNNN.safetensors files, ascending, into a
// new array *steps (free it; pass NULL to only count); returns the count.
int cli_list_checkpoints(const char *dir, int64_t **steps);
// A checkpoint file, or the newest checkpoint of a run folder.
int cli_resolve_checkpoint(const char *path, char *out, int n);
bool cli_same_file(const char *a, const char *b);
// An output path the command may write: its folder exists and is writable, it
// is not the input file, and it is not a training checkpoint.
int cli_check_output(const char *path, const char *input);
// Opens weights for inference: a checkpoint (EMA weights unless raw), a run
// folder (its newest checkpoint) or a plain official-key file.
int cli_load_model(const char *path, bool raw, int heads, dc_backend *be, dc_dit *m,
                   const char **which);
