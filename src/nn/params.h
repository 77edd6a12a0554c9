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
// Next (per-parameter dtype, frozen parameters): the design the model
// interface is ready for, not built yet.
// - dc_param gains `dc_dtype dtype` (storage) and `bool frozen`. Trainable and
//   fixed tensors (pos_embed) keep today's flat fp32 layout (master, grad,
//   compute copy, and in the trainer EMA and moments of the same numel), so
//   optimizer passes and checkpoint bytes do not change.
// - Frozen tensors (a text encoder, a VAE, base weights under LoRA, and every
//   tensor of an inference-only model) live in a second arena at byte
//   offsets, each in its own dtype as loaded or cast once to the compute
//   dtype: no fp32 master, no gradient, no EMA or moments. dc_param_w returns
//   them directly; dc_param_grad returns dc_buf_none(), which the backward
//   ops skip while dx still flows (the norms' backward and linear_bwd's db
//   already skip a NULL gradient; linear_bwd's dW needs the same).
// - dc_params_alloc(.., with_grad = false) makes everything frozen, so
//   inference keeps F16/BF16/F32 weights as loaded; dc_params_load reads each
//   tensor into its parameter's dtype (the reader converts any float dtype).
// - Matrix products need weights in the activations' dtype (the backends
//   refuse mixed dtypes), so a frozen F16 weight on a BF16 backend is cast at
//   load; norms and biases stay as the ops take them.
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
} dc_param;

typedef struct {
    dc_param *items;
    int count, cap;
    int64_t numel;
    dc_backend *be;
    dc_buf data;  // [numel] F32
    dc_buf grad;  // [numel] F32, NULL until dc_params_alloc(.., true)
    dc_buf wc;    // [numel] in the backend's compute dtype; NULL when that is F32
    bool stale;   // wc lags behind data
} dc_params;

// Registers a tensor with ndim int dimensions; returns its index, or -1.
int dc_params_add(dc_params *ps, const char *name, bool trainable, int ndim, ...);
int dc_params_alloc(dc_params *ps, dc_backend *be, bool with_grad);
void dc_params_free(dc_params *ps);
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
    return dc_buf_at(ps->grad, ps->items[i].offset);
}
