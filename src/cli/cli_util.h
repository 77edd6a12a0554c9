// Helpers shared by the subcommands: defaults, threads, devices, output
// checks, and loading a model for inference.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "train/trainer.h"

// The recipe of the built-in default model (the registry's demo model, a
// small one for 28x28 Fashion-MNIST), sized to train in about ten minutes on
// two CPU cores.
dc_train_config cli_demo_train(void);

// Sets OpenMP and OpenBLAS threads (0: all cores).
int cli_set_threads(int threads);
// Checks the values of --threads, --device and --precision without starting
// anything, so that a typo is a usage error before any work.
int cli_check_device_flags(int threads, const char *device, const char *precision);
// The backend for --device (auto, cuda, cpu) and --precision (auto, bf16,
// fp32): auto picks the GPU when one is present, bf16 on it, fp32 on the CPU.
int cli_backend(const char *device, const char *precision, dc_backend **be);
// --offload's tuning (train/offload.h) from the environment, for measuring,
// over the defaults: DC_OFFLOAD_DEFER=0 finishes each update within its
// step, DC_OFFLOAD_PACE=0 lets the host run ahead of the device in backward,
// DC_OFFLOAD_HOLD=N holds N widest units' worth back, DC_OFFLOAD_DEVICE_SHARE=X
// updates that share of the parameters on the device. Unset or empty: the
// default; a malformed value fails, naming the variable.
int cli_offload_settings(dc_offload_settings *s);
#define CLI_DEVICE_HELP "auto (GPU if present), cuda or cpu"
#define CLI_PRECISION_HELP "GPU compute: auto (bf16), bf16 or fp32 (for checking)"
#define CLI_NO_VERIFY_HELP "skip checksum verification (faster on multi-GB files)"
// The data-parallel flags of train and bench.
#define CLI_GPUS_HELP                                                                                      \
    "data parallel on N GPUs of this machine: starts N ranks, one per GPU, through NCCL (under torchrun, " \
    "mpirun or srun: the launcher starts them)"
#define CLI_RANKS_HELP                                                                                     \
    "data parallel on N processes of this machine on any device (with --device cpu they share gradients " \
    "over local sockets)"
#define CLI_ZERO_HELP                                                                                      \
    "ZeRO stage over the ranks: 0 replicates the optimizer, 1 shards AdamW and EMA state, 2 also the "    \
    "gradients (needs several ranks)"
#define CLI_GRAD_COMM_HELP                                                                                 \
    "how gradients travel between ranks: fp32, or bf16 (half the gradient bytes on the wire, for one bf16 " \
    "rounding of each step's summed gradients; with one rank it changes nothing)"
#define CLI_COMM_TIMEOUT_HELP                                                                              \
    "seconds a rank waits for the others (to start, or in a step) before it calls the job hung and stops"
#define CLI_HEADS_HELP "heads, for widths outside the official table (default: from the table)"
// --heads of the inference commands: 0 (the official table) or a head count.
int cli_check_heads(int heads);

bool cli_same_file(const char *a, const char *b);
// Can a file be written at path? Creates and removes the temporary file that
// an atomic write of path would use: that catches a missing or read-only
// folder (for root too) and a name too long for the file system.
int cli_probe_write(const char *path);

// The files a command reads, so that no output of it replaces one: each known
// by device and inode, so that another name for it (a hard link, a symbolic
// link, a path through other folders) is caught as well. A folder counts as
// every regular file under it, CLI_INPUT_DEPTH levels deep (a diffusers
// model's unet/diffusion_pytorch_model.safetensors, a run folder's
// checkpoints), symbolic links followed, at most CLI_INPUT_FILES files.
#define CLI_INPUT_DEPTH 4
#define CLI_INPUT_FILES 100000
typedef struct {
    struct cli_input {
        unsigned long long dev, ino;
        const char *flag;  // the flag that named it ("--model")
        char *path;        // as reached: the flag's path, or a file under its folder
    } *v;
    int n, cap;
} cli_inputs;
// Adds what flag names at path (a file or a folder); a path that does not
// exist adds nothing (reading it will fail with its own message). -1 only
// out of memory.
int cli_inputs_add(cli_inputs *in, const char *flag, const char *path);
// The same for a checkpoint or a training run's folder, of which only the
// checkpoints (step_*) are read: other files there (an exported model, a
// grid) may be replaced.
int cli_inputs_add_checkpoint(cli_inputs *in, const char *flag, const char *path);
void cli_inputs_free(cli_inputs *in);
// Refuses (naming both) an output path that is one of the inputs, and a
// standard output or error that is one (`>> weights.safetensors`).
int cli_check_not_input(const cli_inputs *in, const char *path);
int cli_check_stdio(const cli_inputs *in);
// The entries of folder dir whose names start with prefix, which a command
// writes or removes there: none may be an input.
int cli_check_folder_outputs(const cli_inputs *in, const char *dir, const char *prefix);
// An output file the command may write, checked before any work: it is not
// one of the inputs (in, may be NULL), not a training checkpoint, not an
// existing folder, device or pipe (writing would replace it with a regular
// file), and it can be written.
int cli_check_output(const char *path, const cli_inputs *in);
// Opens weights for inference: a checkpoint (EMA weights unless raw), a run
// folder (its newest readable checkpoint) or a plain official-key file.
// st_flags as for dc_st_open_opts.
int cli_load_model(const char *path, bool raw, int heads, unsigned st_flags, dc_backend *be,
                   dc_model **m, const char **which);

// The CLIP vocabulary when no --vocab is given: $DIFFUSION_VOCAB, else the
// first of ./bpe_simple_vocab_16e6.txt.gz, data/ beside the running binary
// (a checkout), ../share/diffusion/ beside it (an installation),
// /usr/local/share/diffusion/ and /usr/share/diffusion/ that exists; -1 with
// a message naming them all.
#define CLI_VOCAB_NAME "bpe_simple_vocab_16e6.txt.gz"
int cli_find_vocab(const char **path);

// Installs handler for each of the n signals (SA_RESTART: reads and writes
// go on after it returns), for commands that stop cleanly between steps.
void cli_handle_signals(void (*handler)(int), const int *sigs, int n);

// --lora FILE[:WEIGHT]: the file (into path[cap]) and its weight (1 unless a
// number follows the last ':', -10..10).
int cli_lora_arg(const char *arg, char *path, size_t cap, float *weight);
// A model written as a diffusers folder or one .safetensors file (export,
// lora merge) at out: a file may be replaced, a folder must not exist yet,
// and neither may be one of the inputs in.
int cli_check_model_output(const cli_inputs *in, const char *out);
