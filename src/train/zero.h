// ZeRO stages 1 and 2 (Rajbhandari et al. 2020): each rank keeps only its
// shard of the fp32 master weights, the AdamW moments and the EMA, runs the
// optimizer on that shard, and all-gathers the updated weights into every
// rank's compute copy. Stage 2 also shards the gradients: backward hands over
// each unit (a transformer block, say) as soon as its gradients are complete,
// they are reduce-scattered from one bucket, and the rank accumulates only its
// shard. The buckets travel as fp32, or as bf16 (half the bytes; summed in
// bf16 by the communicator): then each is cast into a bf16 wire bucket
// before its reduce-scatter, and this rank's slice cast back to fp32 after.
//
// Layout: the parameters' units (nn/params.h) are sharded one by one, as
// FSDP shards each flat parameter: unit u of len elements gives every rank
// dc_shard_of(len, size, rank, 64), so each unit's reduce-scatter and
// all-gather moves equal, aligned slices. A rank's shard buffers are its
// slices of every unit back to back (`per` elements each, padding zero).
//
// Buffers are the backend's (device memory on a GPU): everything here goes
// through backend ops and the communicator, never the host, except the
// checkpoint gather, which downloads onto rank 0.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "nn/params.h"
#include "train/optimizer.h"

typedef struct {
    int64_t lo, len;  // the unit's flat range [lo, lo + len)
    dc_shard sh;      // this rank's part of it: [lo + sh.begin, + sh.count), sh.per per rank
    int64_t slot;     // where that part starts in the shard buffers
} dc_zero_unit;

// A unit whose reduce-scatter is in flight (stage 2): where in the ring its
// gradients lie, the collective to wait for, and whether its slice went (or
// goes, as bf16) straight into the shard.
typedef struct {
    int unit;
    int64_t at, ticket;
    bool direct;
} dc_zero_flight;

// Stage 2's ring holds this many of the widest unit's buckets.
enum { DC_ZERO_RING = 2 };

typedef struct {
    dc_optimizer base;  // the strategy (train/optimizer.h); stage 2 installs its unit hook and window
    int stage;  // 1 or 2
    dc_comm *comm;
    dc_backend *be;
    dc_params *ps;
    int units;
    dc_zero_unit *u;                // [units]
    int64_t shard;                  // elements of each shard buffer (the sum of the units' per)
    int64_t bucket;                 // size x the largest per: one unit, all ranks' slices
    dc_buf master, m, v, ema, grad;  // [shard] F32: weights, AdamW moments, EMA, reduced gradients
    int64_t room;                   // elements of buf and wbuf: one bucket (stage 1) or DC_ZERO_RING of them
    dc_buf buf;                     // [room] F32: units' gradients in flight, or a gather
    dc_dtype wire;                  // the gradients' type in the reduce-scatter: F32 or BF16
    dc_buf wbuf;                    // [room] BF16: the gradients as sent with wire BF16 (else none)
    // Stage 2 keeps the units' gradients in flight in buf as a ring, each unit
    // taking size x its own per: where the communicator overlaps (a GPU), unit
    // k's reduce-scatter runs beside the next units' backward, and its slice
    // is added to the shard when the ring needs its room again (or at the
    // end), oldest first. Small units take little room, so more of them are
    // in flight than two whole buckets would hold.
    dc_zero_flight *flight;         // [units] the units in flight, a queue from flight[head]
    int head, inflight;
    int64_t pos;                    // where in buf the next unit's gradients go
    int64_t at;                     // where the unit between its two hooks has them
    bool *fresh;                    // [units] stage 2: no gradients of the unit reduced yet this step
    // Folding (the thread and socket communicators, fp32 gradients): every
    // micro-batch's gradients are reduce-scattered as it ends, a later one's
    // slices continuing the shard's sum in rank order (reduce_scatter_add),
    // so the shard grows by one micro-batch at a time in the global batch's
    // order, as the CPU trainer's stage 0 sums (train/trainer.h). Else stage 1
    // accumulates in place and reduces once, stage 2 adds each micro-batch's
    // reduced slices to the shard.
    bool folds;
    int reduced;                    // stage 1: reductions this step
    dc_buf norms;                   // [size] F32: every rank's gradient shard norm
    dc_buf local;                   // [2] F32: this rank's (grad_norm's output)
} dc_zero;

// Per-rank bytes of the training state for `stage` on `size` ranks (the
// memory table and the GPU memory planner). grads: the full buffer (stage 0),
// the full buffer, its reduced shard and a bucket (stage 1), or the shard and
// the ring (stage 2); master, moments (m and v) and ema: full (stage 0) or
// the shard. weights: the full copies the model reads besides an fp32 master:
// the compute copy when `compute` is not F32 (stage 0), and, from stage 1, the
// full fp32 buffer the parameters keep (on the CPU it is the compute copy).
// With gradients sent as bf16 (wire BF16) over several ranks, grads also
// holds the bf16 copies sent: the full buffer's (stage 0, the trainer's) or
// each bucket's.
typedef struct {
    int64_t grads, master, moments, ema, weights;
} dc_zero_mem;
int dc_zero_mem_of(const dc_params *ps, int size, int stage, dc_dtype compute, dc_dtype wire, dc_zero_mem *out);
// grads + master + moments + ema: the share that ZeRO shards.
static inline int64_t dc_zero_mem_state(const dc_zero_mem *m) {
    return m->grads + m->master + m->moments + m->ema;
}

// The strategy for stage 1 or 2, its shards taken from plain's full EMA and
// moments and the parameters' weights (plain stays as it was: the caller
// frees it). Stage 2 frees the full gradient buffer and takes the
// parameters' hooks. wire: the gradients' type on the communicator, F32 or
// BF16.
//
// Its steps: begin_step puts the gradient shard (and stage 1's full
// gradient) at zero; micro_end after each round's backward: stage 1
// reduce-scatters the full gradient unit by unit (folding: every round, into
// the shard's sum after the first, and zeroes the full gradient for the
// next; else after the last only), stage 2 (which did it in backward) adds
// the last slices in flight after the last; finish: the global gradient norm
// and clipping factor, AdamW and EMA on the shard, then the weights
// all-gathered into the compute copy.
int dc_zero_create(dc_params *ps, dc_comm *comm, int stage, dc_dtype wire, const dc_optim_plain *plain,
                   dc_optimizer **out);
// Collective: the full [numel] F32 state (a shard buffer of z) into host on
// rank 0 (host may be NULL elsewhere), one unit at a time.
int dc_zero_gather(dc_zero *z, dc_buf state, float *host);
