// The optimizer strategy: where AdamW's state lives and how a step's
// gradients reach it. Three implementations of one interface:
//   plain   (below, optim_plain.c): every rank holds the full fp32 weights,
//           moments and EMA (ZeRO stage 0), gradients summed over ranks by
//           an all-reduce;
//   ZeRO    (zero.h): stages 1 and 2, each rank holding its shard;
//   offload (offload.h): the master and moments in host memory, AdamW on
//           the CPU beside the device's backward.
// The trainer runs one path for all: begin_step, then per micro-batch round
// micro_begin, the forward and backward, micro_end, and finish; a strategy
// that asks for two passes (o->passes) gets those rounds twice. Within the
// backward (and the next forward, for offload) the strategy follows the
// model unit by unit through the hooks it installs in the parameters
// (dc_param_hooks: a unit's gradients are about to be written / are ready,
// a unit is about to be read); the parameters know nothing else of it.
//
// A checkpoint sees the state as four full flat buffers in the parameters'
// layout (dc_optim_state), whatever holds them: save gathers them onto rank
// 0's host, restore reads them from a file into wherever they live.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "io/safetensors.h"
#include "nn/params.h"

// The four flat [numel] F32 buffers of the optimizer's state, in this order
// in a checkpoint's host copy (host + which * numel).
typedef enum { DC_STATE_WEIGHTS, DC_STATE_EMA, DC_STATE_M, DC_STATE_V, DC_STATE_COUNT } dc_optim_state;

// What one optimizer step does, fixed at its start.
typedef struct {
    dc_adamw_step h;       // AdamW's and the EMA's settings for this step
    float clip;            // max global gradient norm (0: no clipping)
    int rounds;            // micro-batch rounds (dc_batch_rounds): one micro-batch per rank each
    bool last_round_full;  // every rank has images in the last round (else some run idle_units)
} dc_optim_step;

typedef struct dc_optimizer dc_optimizer;

typedef struct {
    // The step's start, o->step set (the first also sets up what needs the
    // round count).
    int (*begin_step)(dc_optimizer *o);
    // Around each round's forward and backward (NULL: nothing to do).
    int (*micro_begin)(dc_optimizer *o, int round);
    int (*micro_end)(dc_optimizer *o, int round);
    // After the last round: the global norm and clipping factor into gstats
    // ([2] F32 on the backend, as grad_norm writes them), then AdamW, the
    // EMA and the compute copy (offload may leave units of that to the next
    // forward: drain).
    int (*finish)(dc_optimizer *o, dc_buf gstats);
    // Completes what finish left running (NULL: nothing ever is).
    int (*drain)(dc_optimizer *o);
    // Collective: the state into host[DC_STATE_COUNT * numel] on rank 0
    // (host NULL elsewhere), once every update is complete.
    int (*save)(dc_optimizer *o, float *host);
    // The EMA and moments from a checkpoint whose raw weights the model
    // already holds (the master is taken from them); every rank reads the
    // file and keeps what it holds.
    int (*restore)(dc_optimizer *o, const dc_st_file *f);
    void (*free)(dc_optimizer *o);
} dc_optimizer_ops;

// The part every strategy shares; each one's struct starts with it.
struct dc_optimizer {
    const dc_optimizer_ops *ops;
    dc_params *ps;
    dc_backend *be;
    dc_param_hooks hooks;  // what it installs in ps->hooks (while ps->hooks points here)
    dc_optim_step step;    // the step in progress
    // The forward and backward passes over the step's micro-batches, set by
    // begin_step: 1, or 2 for an update within the backward that clips (the
    // first pass finds the global norm, the second updates with it).
    int passes;
    // It reads the set's full gradient buffer after the backward, and zeroes
    // it at the step's start only where the set owns it: where a step has
    // one micro-batch, the model may hold the gradients in its activations'
    // memory (dc_model_ops.lend_grads), the units zeroed as their backward
    // begins.
    bool lends;
};

// Points the parameters' hooks at o's (uninstall: when they are o's, none).
void dc_optimizer_install(dc_optimizer *o);
void dc_optimizer_uninstall(dc_optimizer *o);

static inline int dc_optimizer_begin_step(dc_optimizer *o, const dc_optim_step *s) {
    o->step = *s;
    o->passes = 1;
    return o->ops->begin_step(o);
}
static inline int dc_optimizer_micro_begin(dc_optimizer *o, int round) {
    return o->ops->micro_begin ? o->ops->micro_begin(o, round) : 0;
}
static inline int dc_optimizer_micro_end(dc_optimizer *o, int round) {
    return o->ops->micro_end ? o->ops->micro_end(o, round) : 0;
}
static inline int dc_optimizer_finish(dc_optimizer *o, dc_buf gstats) { return o->ops->finish(o, gstats); }
static inline int dc_optimizer_drain(dc_optimizer *o) { return o->ops->drain ? o->ops->drain(o) : 0; }
static inline int dc_optimizer_save(dc_optimizer *o, float *host) { return o->ops->save(o, host); }
static inline int dc_optimizer_restore(dc_optimizer *o, const dc_st_file *f) { return o->ops->restore(o, f); }
// Frees the strategy and o itself (NULL: nothing).
void dc_optimizer_free(dc_optimizer *o);

// What the strategies' restore reads besides the EMA (dc_params_load under
// "ema."): the moment `which` (DC_STATE_M or DC_STATE_V) of checkpoint f
// into host[numel], refusing a non-finite value or a negative second moment
// with the tensor and element named (checkpoint.c).
int dc_ckpt_read_moment(const dc_params *ps, const dc_st_file *f, dc_optim_state which, float *host);
// The same into a [numel] F32 buffer on the backend.
int dc_ckpt_read_moment_buf(const dc_params *ps, const dc_st_file *f, dc_optim_state which, dc_buf dst);

// Plain training (ZeRO stage 0): the full EMA and moments on the backend.
//
// Updating in the backward (`fused`, one rank, the whole batch in one
// micro-batch): no full gradient buffer is held. Each unit's gradients go
// into one unit-sized window and AdamW (with the EMA and the compute copy)
// updates the unit as soon as its backward is done, so the unit's weights are
// new before the backward of the units ahead of it, which never read them, as
// LOMO (Lv et al. 2023) and PyTorch's optimizer-in-backward do. That saves 4
// bytes a parameter. Clipping needs the global norm before any update, so a
// step that clips runs the micro-batch twice (LOMO's two passes): the first
// backward sums the units' squared norms, the second updates with the
// clipping factor. Every draw of a step is keyed by (seed, image, step), so
// both passes see the same batch and noise and compute the same gradients
// (a model whose backward repeats, dc_model_info.backward_repeats, runs only
// its backward in the second pass: 5 forwards' worth a step instead of 6);
// the norm is summed unit by unit, in another order than over the full
// buffer, so the clipping factor may differ from plain training's in its
// last bits.
typedef struct {
    dc_optimizer base;
    dc_buf ema, m, v;  // [numel] F32, the parameters' layout; no EMA at a decay of 0 (it is the weights)
    dc_comm *comm;     // several ranks (dc_optim_plain_set_comm), or NULL
    // The CPU backend sums the step's gradients in one fixed order whatever
    // the ranks: each micro-batch's gradients computed from zero and added to
    // the step's sum in the global batch's order, (((g0 + g1) + g2) + ...).
    // A GPU accumulates micro-batches in place (no extra pass).
    bool fold;
    dc_buf gmicro;     // [numel] F32: with fold and several rounds a step, where the
                       // micro-batches after the first write (the gradient window)
    dc_buf grad16;     // [numel] BF16: the gradients as sent with --grad-comm bf16 on several ranks
    // Where the communicator overlaps (NCCL): the last round's backward
    // all-reduces each unit as it finishes; set per step.
    bool overlaps, overlap_now;
    bool fused;        // updates in the backward (above)
    dc_buf gunit;      // [widest unit] F32: its gradient window
    dc_buf unorm;      // [units + 1] F32: the units' gradient norms in the order they finished, then 1
    dc_buf stats;      // [2] F32: the global norm and clipping factor, from the first of two passes
    int pass, units_done;
} dc_optim_plain;

// The EMA an exact copy of the parameters' weights, the moments zero. fold:
// dc_trainer_folds. fused: update in the backward (above); a full gradient
// buffer the set holds is freed. Without it the set must have one.
int dc_optim_plain_create(dc_params *ps, bool fold, bool ema, bool fused, dc_optimizer **out);
// Data parallel over comm's ranks, the gradients summed in wire (F32 or
// BF16) over them.
int dc_optim_plain_set_comm(dc_optimizer *o, dc_comm *comm, dc_dtype wire);
