// Where `train` and `bench` keep the training state: --offload and --zero
// checked against the job's ranks, and --max-gpu-memory's plan (train/plan.h)
// with the flags the user gave fixing their part of it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "models/model.h"

// --max-gpu-memory SIZE in bytes into *budget (untouched when size is NULL:
// the flag was not given); -1 naming the flag.
int cli_plan_budget(const char *size, int64_t *budget);

// --offload, --update-in-backward (fused) and --zero S against the ranks of
// the job and each other: the first two run on one rank, apart, and ZeRO
// needs several.
int cli_plan_check_ranks(bool offload, bool fused, int zero, int ranks);

// The fastest plan whose predicted peak device memory fits in budget, for
// the model m (a layout serves: models/registry.h) trained on be with batch images a step (all ranks together)
// over `ranks` ranks at ZeRO stage `zero`, gradients summed in `grad_comm`
// (F32 or BF16: its buffers are counted), an EMA kept unless no_ema (a decay
// of 0, where it is the weights), clipping or not (updating in the backward
// then takes two passes). In: what the command line fixed, *micro_batch (0:
// free), *recompute (-1: free), *offload, *fused and *selective (false:
// free; fused or selective NULL: not offered). Out: the plan, *recompute -1
// when every block keeps its activations; line
// gets its description ("plan: micro-batch 64, ...") for the command to print.
// The backend's allocations are then capped at budget (set_memory_cap, where
// it has one): the plan is a prediction, the cap holds the run to it.
int cli_plan_choose(const dc_model *m, dc_backend *be, int64_t budget, int batch, int ranks, int zero,
                    dc_dtype grad_comm, bool no_ema, bool clips, int *micro_batch, int *recompute, bool *offload,
                    bool *fused, bool *selective, char *line, size_t n);
