// A model's parameters: named tensors (PyTorch state-dict keys, in the
// model's registration order) laid out back to back in one flat fp32 buffer,
// with a gradient buffer of the same layout. One flat buffer lets the
// optimizer, EMA, clipping and checkpoints treat all weights in one pass.
//
// Mixed precision: the fp32 buffer is the master copy. When the backend
// computes in another dtype (bf16 on a GPU), a compute copy `wc` of the same
// layout feeds the matrix products; the optimizer rewrites it in its pass,
// and anything else that writes the master copy marks it stale.
//
// Frozen sets (dc_params_alloc_frozen): every tensor of an inference-only
// model (the SD UNet, VAE and text encoder today) lives once, with no fp32
// master, gradient or compute copy: dc_param_w and dc_param_data both return
// it, dc_param_grad returns an empty buffer. It is kept in the dtype it was
// loaded in where the backend's ops read such weights (F16 or BF16 files stay
// 2 bytes a weight on the CPU, whose ops widen them as they read them), else
// in the backend's compute dtype (on a BF16 device F16 is rounded to BF16
// once, at load: the ops take one activation dtype).
//
// Next, for fine-tuning (LoRA, a frozen VAE beside a training UNet): one set
// holding both kinds, trainable tensors in today's flat fp32 layout and
// frozen ones in a second arena in their own dtype, so optimizer passes and
// checkpoint bytes do not change; the backward ops already skip NULL weight
// gradients while dx still flows.
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
    int64_t offset, numel;  // in elements, into the flat buffers
    bool trainable;         // false for fixed tensors such as pos_embed
    // A 4-d kernel [Co, Ci, kh, kw] (its shape as PyTorch's) stored
    // channels-last, [Co, kh, kw, Ci], for convolutions over channels-last
    // maps. Whatever moves values between files and storage permutes them
    // (dc_param_to_stored / dc_param_from_stored).
    bool channels_last;
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

typedef struct {
    dc_param *items;
    int count, cap;
    int64_t numel;
    dc_backend *be;
    dc_buf data;  // [numel] F32 (frozen: see dc_params_alloc_frozen)
    dc_buf grad;  // [numel] F32, NULL until dc_params_alloc(.., true)
    dc_buf wc;    // [numel] in the backend's compute dtype; NULL when that is F32
    bool stale;   // wc lags behind data
    bool frozen;  // dc_params_alloc_frozen: data is the only copy
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
} dc_params;

// Registers a tensor with ndim int dimensions; returns its index, or -1.
int dc_params_add(dc_params *ps, const char *name, bool trainable, int ndim, ...);
int dc_params_alloc(dc_params *ps, dc_backend *be, bool with_grad);
// Inference: one copy of the weights, with no fp32 master, no gradient and no
// compute copy; dc_param_w and dc_param_data return the same storage. Such a
// set never trains. loaded: the dtype the weights come in (dc_weights_dtype).
// They are stored in it when it is F16 or BF16 and the backend's ops read such
// weights (be->half_weights: the CPU), else in the compute dtype (F32 on the
// CPU, BF16 on a GPU).
int dc_params_alloc_frozen(dc_params *ps, dc_backend *be, dc_dtype loaded);
void dc_params_free(dc_params *ps);
// p's values h (numel floats) from PyTorch's order to the storage order, and
// back; nothing to do unless p->channels_last. -1 with a message if the
// scratch cannot be had.
int dc_param_to_stored(const dc_param *p, float *h);
int dc_param_from_stored(const dc_param *p, float *h);
int dc_params_find(const dc_params *ps, const char *name);  // index or -1
static inline dc_buf dc_param_data(const dc_params *ps, int i) {
    return dc_buf_at(ps->data, ps->items[i].offset);
}
// The weights as matrix products read them: the compute copy if there is one.
static inline dc_buf dc_param_w(const dc_params *ps, int i) {
    return dc_buf_at(ps->wc.p ? ps->wc : ps->data, ps->items[i].offset);
}
// Brings the compute copy up to date after the master copy was written.
void dc_params_refresh(dc_params *ps);
static inline void dc_params_touch(dc_params *ps) { ps->stale = true; }
static inline dc_buf dc_param_grad(const dc_params *ps, int i) {
    int64_t o = ps->items[i].offset;
    const dc_param_hooks *h = ps->hooks;
    if (h && o >= h->win_lo && o < h->win_hi) return dc_buf_at(h->win, o - h->win_lo);
    return dc_buf_at(ps->grad, o);
}
// Whether the set takes gradients (allocated with them, or through an
// optimizer's window).
static inline bool dc_params_trains(const dc_params *ps) { return ps->grad.p || ps->hooks; }

// Closes the current unit at the parameters registered so far (a model calls
// it after each block; an empty unit is not recorded).
int dc_params_end_unit(dc_params *ps);
// Unit u's flat range [*lo, *hi); the parameters after the last marked unit
// form one more.
int dc_params_unit_count(const dc_params *ps);
// The optimizer's runs: the next run of adjacent trainable tensors in flat
// [*pos, end), as [*lo, *hi) (clipped to it), with *pos moved past it; false
// when none is left. Fixed tensors (pos_embed) end a run, so they keep their
// values. Walk [a, b) with *pos = a and end = b.
bool dc_params_next_run(const dc_params *ps, int64_t *pos, int64_t end, int64_t *lo, int64_t *hi);
void dc_params_unit_range(const dc_params *ps, int u, int64_t *lo, int64_t *hi);
// What a model's backward calls around unit u's gradients (dc_param_hooks.unit).
static inline int dc_params_unit_begin(dc_params *ps, int u) {
    return ps->hooks && ps->hooks->unit ? ps->hooks->unit(ps->hooks->ctx, u, false) : 0;
}
static inline int dc_params_unit_done(dc_params *ps, int u) {
    return ps->hooks && ps->hooks->unit ? ps->hooks->unit(ps->hooks->ctx, u, true) : 0;
}
// What a model's forward calls before reading unit u's weights (dc_param_hooks.use).
static inline int dc_params_unit_use(const dc_params *ps, int u) {
    return ps->hooks && ps->hooks->use ? ps->hooks->use(ps->hooks->ctx, u) : 0;
}
