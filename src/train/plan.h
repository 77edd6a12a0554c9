// Training within a device memory budget: predicts the peak device bytes of
// a training plan (micro-batch, activation checkpointing, optimizer offload)
// for any dc_model and picks the fastest plan that fits, as Colossal-AI searches for
// the fastest plan within a memory budget.
//
// The prediction adds what the trainer and the model allocate on the backend,
// in the order they allocate it (train/trainer.c, train/offload.c,
// train/zero.c, nn/params.c, the model's activation_bytes), and takes the larger of two
// moments: setting up (the model made with a full gradient buffer, before
// offload or ZeRO take it over) and a step (the activation arena reserved at
// the first step). `fixed` is what the backend holds of its own (the CUDA
// backend's matrix-product and normalisation workspaces; nothing on the CPU).
//
// Cost model, relative step time (1: everything on the device, all blocks
// keeping their activations, the rank's share in one micro-batch):
//   (1 + r / 3) x (1 + 2 / mb) / (1 + 2 / share)  [+ 1.30 + 0.65 (n - 1) with offload]
//   [x 1.02 updating in the backward; when that clips, x 5/3 (x 2 for a model
//   whose backward does not repeat)] [x 1.03 with selective recompute]
// r: the fraction of blocks that recompute (their forward runs again: a third
// of a block's forward + backward); 2 / mb: each micro-batch costs about two
// images' worth of fixed work (kernel launches, reading every weight once);
// offload: the XL/2 transformer at batch 64 on an H200 trained at 38% of the plain speed
// with --offload --recompute 0, 1 / 0.38 = 4/3 + 1.30; each of the n
// micro-batches after the first copies the running gradient sums down and up
// again (8 bytes a parameter, train/offload.h), about half that traffic and
// update again. The offload figures were measured while the host still kept
// the EMA (44 bytes a parameter a step, now 36); not yet measured since.
// Updating in the backward (train/optimizer.h) runs each backward twice where
// it clips (a forward and two backwards, 5 forwards' worth instead of 3; the
// forward too, x 2, where the model's backward does not repeat), and
// otherwise launches three small ops a unit more (x 1.02: a plan takes it only
// where memory asks for it).
// Selective recompute: SD 2.1's UNet at 256 px, batch 64, on an H200 took
// 99.9 ms a step against 97.2 (x 1.03; x 1.02 at 512 px, batch 16).
// Estimates, not measurements of each plan: they order plans.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "models/model.h"

// Parses a memory size: a positive number with a binary unit, K, M, G or T,
// optionally followed by "iB" ("8G", "8GiB", "7.5G", "8000MiB"). Bytes out.
int dc_parse_size(const char *s, int64_t *bytes);

typedef struct {
    int micro_batch;  // images per forward/backward
    int keep;         // blocks keeping their activations (info.blocks: all, no recompute)
    bool offload;     // optimizer state on the host
    bool fused;       // the update in the backward: no full gradient buffer (one rank, mb = batch)
    bool selective;   // selective recompute (dc_model_ops.set_selective): the cheap intermediates rebuilt
} dc_train_plan;

// The device bytes of a plan, by what holds them (at the step's peak).
typedef struct {
    int64_t weights;      // fp32 parameters (offload beside a compute copy: the fixed ones) + the compute copy
                          // + the frozen weights that do not train (a LoRA's base: dc_model_frozen_bytes)
    int64_t grads;        // the full gradient buffer, or offload's unit buffers / ZeRO's buckets (+ shard) /
                          // the window and norms of updating in the backward
    int64_t optimizer;    // AdamW moments, EMA (and ZeRO's master shard) on the device
    int64_t trainer;      // the micro-batch's images, outputs, timesteps, labels; the step's losses
    int64_t activations;  // the model's activation arena
    int64_t fixed;        // the backend's own workspaces
    int64_t setup;        // the peak while setting up (before the first step)
    int64_t peak;         // max(setup, the sum of the above)
} dc_plan_mem;

// What the planner is given: the model, where it runs, the batch and ranks,
// and which dimensions the command line fixed.
typedef struct {
    const dc_model *model;  // sized only: a layout (models/registry.h) serves, no weights allocated
    dc_dtype compute;  // the backend's compute dtype (bf16 on a GPU, f32 on the CPU)
    int64_t fixed;     // the backend's own workspaces, in bytes
    int batch;         // global batch
    int ranks;         // data-parallel ranks (1: one)
    int zero;          // ZeRO stage over the ranks (0, 1, 2)
    int micro_batch;   // fixed by the user, or 0: the planner chooses
    int keep;          // fixed blocks keeping activations (model->info.blocks: all), or -1: the planner chooses
    int offload;       // fixed 0 or 1, or -1: the planner chooses (never with several ranks or ZeRO)
    int fused;         // updating in the backward: the same (only with the batch in one micro-batch)
    int selective;     // selective recompute: the same (only for a model that has it)
    bool clips;        // gradients are clipped: updating in the backward takes two passes
    dc_dtype grad_comm;  // gradients between ranks: DC_F32 (0), or DC_BF16 (bf16 copies on the device)
    bool no_ema;         // an EMA decay of 0: no EMA is kept apart from the weights (it is them)
    bool folds;          // the backend sums micro-batches apart (dc_trainer_folds: the CPU), which at stage 0
                         // takes a second gradient buffer where a rank runs several a step
    bool grads_apart;    // dc_train_config.grads_apart: the gradients never in the activation arena
} dc_plan_request;

// The peak device bytes of plan p for the request's model and batch.
int dc_plan_predict(const dc_plan_request *r, const dc_train_plan *p, dc_plan_mem *out);
// The relative step time of p (the cost model above).
double dc_plan_cost(const dc_plan_request *r, const dc_train_plan *p);
// The fastest plan whose peak fits in budget bytes (ties: the smaller peak);
// runner_up (may be NULL) gets the next fastest, micro_batch 0 if none. Fails
// naming the smallest plan's bytes when nothing fits.
int dc_plan_choose(const dc_plan_request *r, int64_t budget, dc_train_plan *best, dc_plan_mem *best_mem,
                   dc_train_plan *runner_up);
// "plan: micro-batch 64, recompute 3 (3 of 28 blocks keep activations), offload yes: predicted
// peak 7.41 GiB of 8.00 GiB" into buf.
void dc_plan_describe(const dc_plan_request *r, const dc_train_plan *p, const dc_plan_mem *m, int64_t budget,
                      char *buf, size_t n);
