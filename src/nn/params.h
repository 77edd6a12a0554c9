// A model's parameters: named tensors (PyTorch state-dict keys, in the
// model's registration order), each of one of three kinds:
//   trainable: laid out back to back in one flat fp32 buffer (the master
//     copy), with a gradient buffer of the same layout. One flat buffer lets
//     the optimizer, EMA, clipping and checkpoints treat all weights in one pass.
//   fixed (trainable false, such as DiT's pos_embed): in the same flat
//     layout, kept in checkpoints and the EMA, never updated.
//   frozen (dc_params_freeze): outside the flat layout, stored once in a
//     second arena in the dtype the weights are loaded in, with no master
//     copy, gradient or compute copy, and never in an optimizer pass or the
//     EMA. The backward ops skip its (empty) gradient while dx still flows.
// So a fine-tuning set (a trainable UNet beside a frozen VAE, or LoRA
// factors beside frozen base weights) keeps today's optimizer passes and
// checkpoint bytes for what trains, and 2 bytes a weight for what does not.
//
// Mixed precision: the fp32 buffer is the master copy. When the backend
// computes in another dtype (bf16 on a GPU), a compute copy `wc` of the same
// layout feeds the matrix products; the optimizer rewrites it in its pass,
// and anything else that writes the master copy marks it stale.
//
// The frozen arena's dtype is the one the weights come in where the
// backend's ops read such weights (F16 or BF16 files stay 2 bytes a weight on
// the CPU, whose ops widen them as they read them), else the backend's
// compute dtype (on a BF16 device F16 is rounded to BF16 once, at load: the
// ops take one activation dtype). An inference model (the SD UNet, VAE and
// text encoder) is a set whose every parameter is frozen
// (dc_params_alloc_frozen): its flat buffers are empty.
//
// Layers read a parameter through a weight descriptor (dc_weight: data,
// dtype, shape, optional scales), and may carry an adapter (nn/adapter.h)
// that linear and convolution layers ask for a delta to their weight.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"

#define DC_PARAM_NAME_MAX 96
#define DC_MAX_DIMS 8

typedef struct {
    char name[DC_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[DC_MAX_DIMS];
    int64_t offset, numel;  // in elements, into the flat buffers (frozen: into the frozen arena)
    bool trainable;         // false for fixed tensors such as pos_embed, and for frozen ones
    bool frozen;            // in the frozen arena (dc_params_freeze)
    // A 4-d kernel [Co, Ci, kh, kw] (its shape as PyTorch's) stored
    // channels-last, [Co, kh, kw, Ci], for convolutions over channels-last
    // maps. Whatever moves values between files and storage permutes them
    // (dc_param_to_stored / dc_param_from_stored).
    bool channels_last;
    // In a joint set (two models trained as one: a UNet and its text
    // encoder), the length of the prefix the set put before the model's own
    // name ("text_encoder."): the model's files know it as name + prefix_len.
    int prefix_len;
    // Its layer's backward writes its gradient through an op that can
    // overwrite (DC_BWD_DW_SET: linear and convolution weights and biases).
    bool grad_sets;
    // With lent gradients: its gradient holds nothing yet in this backward
    // (its unit began), so the first write overwrites; one that is read or
    // added to first is zeroed then (dc_param_train_grad), and one no op
    // writes is zeroed as its unit is done.
    bool grad_fresh;
} dc_param;

// The door through which an optimizer strategy (train/optimizer.h) follows
// a model's backward and forward unit by unit, without the parameters
// knowing which strategy it is.
typedef struct {
    // Called by the model's backward before (done false) and after (done
    // true) the backward of each unit it marked; NULL: nothing to do.
    int (*unit)(void *ctx, int unit, bool done);
    // Called by the model's forward before it first reads unit u's weights
    // (dc_params_unit_use), when the model marks forward_uses_units: an
    // optimizer that finishes the last step's update while the next forward
    // runs (train/offload.c) makes that forward wait per unit. NULL: none.
    int (*use)(void *ctx, int unit);
    void *ctx;
    // The gradient window: parameters in [win_lo, win_hi) take their
    // gradients from win (element win_lo at win.p) instead of grad. Sharded
    // training points one unit at a time into a bucket, so no full-size
    // gradient buffer is held (grad.p is then NULL); plain training on the
    // CPU points a micro-batch's gradients apart from the step's sum.
    dc_buf win;
    int64_t win_lo, win_hi;
} dc_param_hooks;

typedef struct dc_adapter dc_adapter;  // nn/adapter.h

// How a set is made for training (dc_params_alloc): not at all, with the
// full fp32 gradient buffer, or through an optimizer's gradient window only
// (optimizer offload, train/offload.h: unit-sized buckets), so that no full
// buffer is ever made. `true` and `false` read as the first two.
typedef enum { DC_GRAD_NONE = 0, DC_GRAD_BUFFER = 1, DC_GRAD_WINDOW = 2 } dc_grad_mode;

typedef struct {
    dc_param *items;
    int count, cap;
    int64_t numel;  // of the flat layout (trainable and fixed parameters)
    dc_backend *be;
    dc_buf data;  // [numel] F32; NULL when numel is 0
    dc_buf grad;  // [numel] F32, NULL unless allocated with DC_GRAD_BUFFER
    // grad lies in memory the set does not own (dc_params_lend_grad): a
    // model's activation arena, over bytes its backward is done with. Each
    // unit's gradients are then made fresh or zeroed as that unit's backward
    // begins (dc_params_unit_begin).
    bool grad_lent;
    bool window;  // allocated with DC_GRAD_WINDOW: trains, its gradients only through an optimizer's hooks
    dc_buf wc;    // [numel] in the backend's compute dtype; NULL when that is F32
    bool stale;   // wc lags behind data
    dc_buf frozen;         // [frozen_numel] the frozen parameters, in one dtype (see above)
    int64_t frozen_numel;
    dc_adapter *adapter;   // asked by linear and conv layers for deltas; NULL: none (not owned)
    // Units: runs of parameters whose gradients are complete together (a
    // transformer block's, once its backward is done), in registration order.
    // unit u is [unit_end[u-1], unit_end[u]) (unit_end[-1] = 0); a model that
    // marks none has one unit, all of it.
    int64_t *unit_end;
    int units;
    // What the optimizer strategy (train/optimizer.h) installs to follow the
    // gradients unit by unit; NULL: none, and every gradient is in grad.
    dc_param_hooks *hooks;
    bool forward_uses_units;  // the model's forward calls dc_params_unit_use for every unit, in order
    // Registration puts this before each name (NULL: nothing): a joint set
    // keeps its models' names apart ("text_encoder." + the encoder's own).
    const char *prefix;
} dc_params;

// Registers a tensor with ndim int dimensions under ps->prefix + name;
// returns its index, or -1.
int dc_params_add(dc_params *ps, const char *name, bool trainable, int ndim, ...);
// Makes parameter i frozen (see above); before the set is allocated.
int dc_params_freeze(dc_params *ps, int i);
// Lays out and allocates the set: trainable and fixed parameters in the
// flat buffers (zeroed; the gradient too with DC_GRAD_BUFFER), frozen ones in the
// frozen arena (zeroed). loaded: the dtype the frozen ones come in
// (dc_weights_dtype); they are kept in it when it is F16 or BF16 and the
// backend's ops read such weights (be->half_weights: the CPU), else in the
// compute dtype (F32 on the CPU, BF16 on a GPU). Unit ends move with the
// layout. Once only.
int dc_params_alloc_loaded(dc_params *ps, dc_backend *be, dc_grad_mode grad, dc_dtype loaded);
// The same with frozen parameters in the compute dtype.
int dc_params_alloc(dc_params *ps, dc_backend *be, dc_grad_mode grad);
// Inference: every parameter frozen, so one copy of the weights, with no fp32
// master, no gradient and no compute copy. Such a set never trains.
int dc_params_alloc_frozen(dc_params *ps, dc_backend *be, dc_dtype loaded);
// Device bytes the set's parameters take (master, gradient, compute copy and
// frozen arena).
size_t dc_params_bytes(const dc_params *ps);
void dc_params_free(dc_params *ps);
// p's values h (numel floats) from PyTorch's order to the storage order, and
// back; nothing to do unless p->channels_last. -1 with a message if the
// scratch cannot be had.
int dc_param_to_stored(const dc_param *p, float *h);
int dc_param_from_stored(const dc_param *p, float *h);
int dc_params_find(const dc_params *ps, const char *name);  // index or -1
// n host values h (overwritten) to b in b's dtype (F32, or F16 or BF16
// rounded once), uploaded; and n values of b (any of those) as floats in h.
void dc_upload_f32_as(dc_backend *be, dc_buf b, float *h, int64_t n);
int dc_download_as_f32(dc_backend *be, dc_buf b, float *h, int64_t n);
// Where parameter i's values live: its fp32 master, or its frozen copy.
static inline dc_buf dc_param_data(const dc_params *ps, int i) {
    return dc_buf_at(ps->items[i].frozen ? ps->frozen : ps->data, ps->items[i].offset);
}
// A weight as layers read it: its values in their dtype, PyTorch's shape (the
// values in storage order: channels-last kernels as dc_param says), and the
// scales of a quantised dtype (none yet: int8 weights will carry them, and an
// op without a path for them refuses them).
typedef struct {
    dc_buf data;
    int ndim;
    int64_t shape[DC_MAX_DIMS];
    bool channels_last;
    dc_buf scales;  // NULL: none
} dc_weight;
// Parameter i as matrix products read it: the compute copy if there is one,
// else the master or the frozen copy.
static inline dc_weight dc_param_weight(const dc_params *ps, int i) {
    const dc_param *p = &ps->items[i];
    dc_weight w = {dc_buf_at(p->frozen ? ps->frozen : ps->wc.p ? ps->wc : ps->data, p->offset), p->ndim, {0},
                   p->channels_last, {NULL, DC_F32}};
    for (int d = 0; d < p->ndim; d++) w.shape[d] = p->shape[d];
    return w;
}
static inline dc_buf dc_param_w(const dc_params *ps, int i) { return dc_param_weight(ps, i).data; }
// Brings the compute copy up to date after the master copy was written.
void dc_params_refresh(dc_params *ps);
static inline void dc_params_touch(dc_params *ps) { ps->stale = true; }
static inline dc_buf dc_param_grad(const dc_params *ps, int i) {
    int64_t o = ps->items[i].offset;
    const dc_param_hooks *h = ps->hooks;
    if (h && o >= h->win_lo && o < h->win_hi) return dc_buf_at(h->win, o - h->win_lo);
    return dc_buf_at(ps->grad, o);
}
void dc_params_grad_settle(const dc_params *ps, int i);
// The gradient a layer's backward adds parameter i's into: an empty buffer
// for a frozen parameter (the ops skip it).
static inline dc_buf dc_param_train_grad(const dc_params *ps, int i) {
    if (ps->items[i].frozen) return dc_buf_none();
    if (ps->items[i].grad_fresh) dc_params_grad_settle(ps, i);
    return dc_param_grad(ps, i);
}
// A backward op's first write into the gradients of k ranges of whole
// parameters, range j the n[j] values from parameter idx[j]'s (idx[j] < 0 or
// frozen: none): DC_BWD_DW_SET when every one is fresh, so the op overwrites;
// else 0, the fresh ones zeroed, so it adds. Fresh no more either way.
int dc_params_claim_grads(const dc_params *ps, const int *idx, const int64_t *n, int k);
// Whether the set takes gradients (allocated with them, or through an
// optimizer's window).
static inline bool dc_params_trains(const dc_params *ps) { return ps->grad.p || ps->hooks || ps->window; }

// Closes the current unit at the parameters registered so far (a model calls
// it after each block; an empty unit is not recorded).
int dc_params_end_unit(dc_params *ps);
// Unit u's flat range [*lo, *hi); the parameters after the last marked unit
// form one more.
int dc_params_unit_count(const dc_params *ps);
// The optimizer's runs: the next run of adjacent trainable tensors in flat
// [*pos, end), as [*lo, *hi) (clipped to it), with *pos moved past it; false
// when none is left. Fixed tensors (pos_embed) end a run, so they keep their
// values; frozen ones are not in the flat layout. Walk [a, b) with *pos = a
// and end = b.
bool dc_params_next_run(const dc_params *ps, int64_t *pos, int64_t end, int64_t *lo, int64_t *hi);
void dc_params_unit_range(const dc_params *ps, int u, int64_t *lo, int64_t *hi);
// The most parameters a unit holds.
int64_t dc_params_widest_unit(const dc_params *ps);
// What a model's backward calls around unit u's gradients (dc_param_hooks.unit).
// With lent gradients, begin zeroes the unit's (its grad_sets parameters
// are marked fresh instead) and done zeroes those still fresh.
int dc_params_unit_begin(dc_params *ps, int u);
int dc_params_unit_done(dc_params *ps, int u);

// The gradients in a model's activation arena. As its backward goes, a
// model gives up its arena from the end: once unit u's backward is about to
// begin, the bytes from dead_from[u] on are read and written no more in
// that backward. The fp32 gradients can then lie in those bytes (and past
// them), so that the arena and the gradients take less than both apart:
// *at, the byte offset (a multiple of 256) where they start, the lowest at
// which every unit's gradients lie wholly at or beyond its dead_from[u];
// returns the bytes the arena must then have (at least arena_bytes). As the
// next forward writes the arena again, the gradients live from their unit's
// backward to the step's update: for a step of one micro-batch.
size_t dc_params_grad_place(const dc_params *ps, const int64_t *dead_from, size_t arena_bytes, size_t *at);
// Points the gradients at numel floats the caller owns, freeing the set's own
// buffer (grad_lent), or (at NULL) at none.
void dc_params_lend_grad(dc_params *ps, void *at);
// What a model's forward calls before reading unit u's weights (dc_param_hooks.use).
static inline int dc_params_unit_use(const dc_params *ps, int u) {
    return ps->hooks && ps->hooks->use ? ps->hooks->use(ps->hooks->ctx, u) : 0;
}
