// Layers as modules: a struct of parameter handles (indices into a model's
// dc_params, registered under PyTorch state-dict names) with _fwd/_bwd
// functions that run the backend's ops on them. A model is built by adding
// modules in its state dict's order; a new block type is one more module,
// not new index arithmetic.
//
// Linear and convolution layers read their weight through its descriptor
// (dc_param_weight) and ask the set's adapter for a delta (nn/adapter.h):
// an adapted layer adds the adapter's output in forward and its share of dx
// in backward. Fused ops that cannot take a delta between the product and
// what follows run unfused for an adapted layer; the two that cannot run
// unfused (linear_many_fwd's jobs, the GEGLU gate) take merged deltas only.
#pragma once
#include <assert.h>
#include <stdbool.h>
#include "backend/backend.h"
#include "nn/adapter.h"
#include "nn/params.h"

// y[M, out] = x[M, in] W^T + b: "<name>.weight" [out, in] (or the 4-D kernel
// of a patch convolution, [out, C, p, p] with in = C p p), "<name>.bias" [out].
typedef struct {
    int w, b;
    int in, out;
} dc_linear;

// y[B, dim] = table[idx[b]]: "<name>.weight" [rows, dim].
typedef struct {
    int table;
    int rows, dim;
} dc_embedding;

// 2-D convolution with a k x k kernel, `stride` and symmetric zero padding
// `pad`: "<name>.weight" [co, ci, k, k], "<name>.bias" [co]. nhwc: over
// channels-last maps, the kernel stored [co, k, k, ci] (dc_param.channels_last).
typedef struct {
    int w, b;
    int ci, co, k, stride, pad;
    bool nhwc;
} dc_conv2d;

// GroupNorm over `groups` groups of C channels (eps as the model's config):
// "<name>.weight" [C], "<name>.bias" [C].
typedef struct {
    int w, b;
    int C, groups;
    float eps;
} dc_group_norm;

// LayerNorm over the last dimension D with affine weights: "<name>.weight"
// [D], "<name>.bias" [D].
typedef struct {
    int w, b;
    int D;
    float eps;
} dc_layer_norm;

int dc_linear_add(dc_params *ps, dc_linear *l, const char *name, int in, int out);
// A linear layer without bias (attention projections in the UNet and VAE).
int dc_linear_add_nobias(dc_params *ps, dc_linear *l, const char *name, int in, int out);
int dc_conv2d_add(dc_params *ps, dc_conv2d *c, const char *name, int ci, int co, int k, int stride, int pad);
// The same convolution over channels-last maps x[B, H, W, ci] -> y[B, Ho, Wo, co].
int dc_conv2d_add_nhwc(dc_params *ps, dc_conv2d *c, const char *name, int ci, int co, int k, int stride, int pad);
int dc_group_norm_add(dc_params *ps, dc_group_norm *n, const char *name, int C, int groups, float eps);
int dc_layer_norm_add(dc_params *ps, dc_layer_norm *n, const char *name, int D, float eps);

// The shape of conv c over x[B, ci, H, W] (symmetric padding; x[B, H, W, ci] if c->nhwc).
static inline dc_conv2d_shape dc_conv2d_shape_of(const dc_conv2d *c, int B, int H, int W) {
    dc_conv2d_shape s = {B, c->ci, H, W, c->co, c->k, c->stride, c->pad, c->pad, c->pad, c->pad, c->nhwc};
    return s;
}
// A stride-p convolution over non-overlapping p x p patches of C channels,
// which is a linear layer on the patch vectors (the weight keeps Conv2d's shape).
int dc_linear_add_patch_conv(dc_params *ps, dc_linear *l, const char *name, int C, int p, int out);
int dc_embedding_add(dc_params *ps, dc_embedding *e, const char *name, int rows, int dim);

// The weight a product reads. No op has a path for quantised weights with
// scales yet, and nothing makes such a weight: one that reached an op would be
// a programmer's error, never silently read without its scales.
static inline dc_buf dc_weight_plain(const dc_params *ps, int i) {
    dc_weight w = dc_param_weight(ps, i);
    assert(!w.scales.p && "a weight with scales reached an op that has no path for them");
    return w.data;
}
static inline dc_buf dc_bias_of(const dc_params *ps, int b) { return b >= 0 ? dc_param_w(ps, b) : dc_buf_none(); }

// Matrix products read the compute copy of the weights; gradients are fp32.
static inline void dc_linear_fwd(dc_backend *be, const dc_params *ps, const dc_linear *l, dc_buf y,
                                 dc_buf x, int M) {
    be->linear_fwd(be, y, x, dc_weight_plain(ps, l->w), dc_bias_of(ps, l->b), M, l->in, l->out);
    if (dc_adapted(ps, l->w)) ps->adapter->ops->linear_fwd(ps->adapter, be, l->w, y, x, M, l->in, l->out);
}
// y += x W^T + b: a residual branch's last product, added in its epilogue.
static inline void dc_linear_fwd_acc(dc_backend *be, const dc_params *ps, const dc_linear *l, dc_buf y,
                                     dc_buf x, int M) {
    be->linear_fwd_acc(be, y, x, dc_weight_plain(ps, l->w), dc_bias_of(ps, l->b), M, l->in, l->out);
    if (dc_adapted(ps, l->w)) ps->adapter->ops->linear_fwd(ps->adapter, be, l->w, y, x, M, l->in, l->out);
}
// The flags of a backward op writing the gradients of a layer's weights w
// (nw values) and bias b (nb; b < 0: none) over `rows` rows of input
// (dc_params_claim_grads: overwritten where they are fresh, when there are
// rows); dx_add: += into dx.
static inline int dc_bwd_flags(const dc_params *ps, int w, int64_t nw, int b, int64_t nb, int64_t rows, bool dx_add) {
    const int idx[2] = {w, b};
    const int64_t n[2] = {nw, nb};
    return (dx_add ? DC_BWD_DX_ADD : 0) | (rows > 0 ? dc_params_claim_grads(ps, idx, n, 2) : 0);
}
static inline int dc_linear_bwd_flags(const dc_params *ps, const dc_linear *l, int M, bool dx_add) {
    return dc_bwd_flags(ps, l->w, (int64_t)l->in * l->out, l->b, l->out, M, dx_add);
}
// dx = dy W (skipped if dx.p is NULL; += if accumulate); dW, db += (skipped
// for frozen parameters).
static inline void dc_linear_bwd(dc_backend *be, const dc_params *ps, const dc_linear *l, dc_buf dx,
                                 dc_buf dy, dc_buf x, int M, bool accumulate) {
    const int flags = dc_linear_bwd_flags(ps, l, M, accumulate);
    be->linear_bwd(be, dx, dc_param_train_grad(ps, l->w), l->b >= 0 ? dc_param_train_grad(ps, l->b) : dc_buf_none(),
                   dy, x, dc_weight_plain(ps, l->w), M, l->in, l->out, flags);
    if (dc_adapted(ps, l->w)) ps->adapter->ops->linear_bwd(ps->adapter, be, l->w, dx, dy, x, M, l->in, l->out);
}
// A product of l as one of linear_many_fwd's jobs, into out (merged deltas only).
static inline dc_linear_job dc_linear_job_of(const dc_params *ps, const dc_linear *l, dc_buf out) {
    assert(!dc_adapted(ps, l->w) && "linear_many_fwd takes merged deltas only");
    dc_linear_job j = {out, dc_weight_plain(ps, l->w), dc_bias_of(ps, l->b), l->out};
    return j;
}
// The GEGLU feed-forward's first product and its gate (linear_geglu_fwd): y[M, out/2]
// = h * gelu_erf(g) where [h | g] = x W^T + b; pre [M, out] is the backend's
// scratch. With pre none it runs only where the backend needs none: whether
// it ran (never for an adapted layer, which runs the product with its delta
// into pre, then the gate).
static inline bool dc_linear_geglu_fwd(dc_backend *be, const dc_params *ps, const dc_linear *l, dc_buf y,
                                       dc_buf pre, dc_buf x, int M) {
    if (dc_adapted(ps, l->w)) {  // the delta joins the product before the gate
        if (!pre.p) return false;
        dc_linear_fwd(be, ps, l, pre, x, M);
        be->geglu_fwd(be, y, pre, M, l->out / 2);
        return true;
    }
    return be->linear_geglu_fwd(be, y, pre, x, dc_weight_plain(ps, l->w), dc_bias_of(ps, l->b), M, l->in, l->out / 2);
}
// The MLP pair fc2(gelu(fc1(x))) through the backend's fused ops: forward
// keeps fc1's output (pre) and its GELU (act); backward goes from dL/dy down
// to dL/dpre, accumulating fc2's gradients (scratch as linear_bwd_gelu's).
// An adapted layer runs the product, its delta and the GELU apart.
static inline void dc_linear_gelu_fwd(dc_backend *be, const dc_params *ps, const dc_linear *fc1, dc_buf act,
                                      dc_buf pre, dc_buf x, int M) {
    if (dc_adapted(ps, fc1->w)) {
        dc_linear_fwd(be, ps, fc1, pre, x, M);
        be->gelu_fwd(be, act, pre, (int64_t)M * fc1->out);
        return;
    }
    be->linear_gelu_fwd(be, act, pre, x, dc_weight_plain(ps, fc1->w), dc_param_w(ps, fc1->b), M, fc1->in, fc1->out);
}
static inline void dc_linear_bwd_gelu(dc_backend *be, const dc_params *ps, const dc_linear *fc2, dc_buf dpre,
                                      dc_buf dy, dc_buf act, dc_buf pre, dc_buf scratch, int M) {
    if (dc_adapted(ps, fc2->w)) {  // dact = dy (W + delta) in scratch, then through the GELU
        dc_linear_bwd(be, ps, fc2, scratch, dy, act, M, false);
        be->gelu_bwd(be, dpre, scratch, pre, (int64_t)M * fc2->in);
        return;
    }
    be->linear_bwd_gelu(be, dpre, dc_param_train_grad(ps, fc2->w), dc_param_train_grad(ps, fc2->b), dy, act,
                        dc_weight_plain(ps, fc2->w), pre, scratch, M, fc2->in, fc2->out);
}
// What a model's reserve calls for the convolution c of shape s: the
// backend's plans, and the adapter's room for its delta.
static inline int dc_conv2d_reserve(dc_backend *be, const dc_params *ps, const dc_conv2d *c,
                                    const dc_conv2d_shape *s, bool backward) {
    int rc = be->reserve_conv(be, s, backward);
    if (!rc && dc_adapted(ps, c->w)) rc = ps->adapter->ops->reserve_conv(ps->adapter, c->w, s, backward);
    return rc;
}
// The adapter's room for the deltas of linear layers of up to `rows` rows.
static inline int dc_adapter_reserve_rows(const dc_params *ps, int64_t rows) {
    return ps->adapter ? ps->adapter->ops->reserve_rows(ps->adapter, rows) : 0;
}
// y = conv(x) + b over the shape s (dc_conv2d_shape_of, or asymmetric padding
// for the VAE's downsampling); reserve_conv(s) must have run.
static inline void dc_conv2d_fwd(dc_backend *be, const dc_params *ps, const dc_conv2d *c, dc_buf y, dc_buf x,
                                 const dc_conv2d_shape *s) {
    be->conv2d_fwd(be, y, x, dc_weight_plain(ps, c->w), dc_param_w(ps, c->b), s);
    if (dc_adapted(ps, c->w)) ps->adapter->ops->conv_fwd(ps->adapter, be, c->w, y, x, s);
}
// y = conv(x) without the bias, which the caller adds in the op that follows
// (add_nhwc with dc_conv2d_bias).
static inline void dc_conv2d_fwd_nobias(dc_backend *be, const dc_params *ps, const dc_conv2d *c, dc_buf y, dc_buf x,
                                        const dc_conv2d_shape *s) {
    be->conv2d_fwd(be, y, x, dc_weight_plain(ps, c->w), dc_buf_none(), s);
    if (dc_adapted(ps, c->w)) ps->adapter->ops->conv_fwd(ps->adapter, be, c->w, y, x, s);
}
static inline dc_buf dc_conv2d_bias(const dc_params *ps, const dc_conv2d *c) { return dc_bias_of(ps, c->b); }
static inline void dc_conv2d_bwd(dc_backend *be, const dc_params *ps, const dc_conv2d *c, dc_buf dx, dc_buf dy,
                                 dc_buf x, const dc_conv2d_shape *s, bool accumulate) {
    const int flags = dc_bwd_flags(ps, c->w, (int64_t)c->co * c->ci * c->k * c->k, c->b, c->co, s->B, accumulate);
    be->conv2d_bwd(be, dx, dc_param_train_grad(ps, c->w), dc_param_train_grad(ps, c->b), dy, x,
                   dc_weight_plain(ps, c->w), s, flags);
    if (dc_adapted(ps, c->w)) ps->adapter->ops->conv_bwd(ps->adapter, be, c->w, dx, dy, x, s);
}
// y[B,C,HW] = GroupNorm(x) (then SiLU if silu); mean, rstd [B, groups] F32.
static inline void dc_group_norm_fwd(dc_backend *be, const dc_params *ps, const dc_group_norm *n, dc_buf y,
                                     dc_buf mean, dc_buf rstd, dc_buf x, int B, int64_t HW, bool silu) {
    be->group_norm_fwd(be, y, mean, rstd, x, dc_param_w(ps, n->w), dc_param_w(ps, n->b), B, n->C, HW, n->groups,
                       n->eps, silu);
}
// The same over channels-last maps y, x [B, HW, C].
static inline void dc_group_norm_nhwc_fwd(dc_backend *be, const dc_params *ps, const dc_group_norm *n, dc_buf y,
                                          dc_buf mean, dc_buf rstd, dc_buf x, int B, int64_t HW, bool silu) {
    be->group_norm_nhwc_fwd(be, y, mean, rstd, x, dc_param_w(ps, n->w), dc_param_w(ps, n->b), B, n->C, HW,
                            n->groups, n->eps, silu);
}
// dx (+= if accumulate) from dy = dL/dy of y = act(GroupNorm(x)) over
// channels-last maps, with the statistics its forward kept; dgamma, dbeta +=
// (skipped for frozen parameters).
static inline void dc_group_norm_nhwc_bwd(dc_backend *be, const dc_params *ps, const dc_group_norm *n, dc_buf dx,
                                          dc_buf dy, dc_buf x, dc_buf mean, dc_buf rstd, int B, int64_t HW, bool silu,
                                          bool accumulate) {
    const int flags = dc_bwd_flags(ps, n->w, n->C, n->b, n->C, B * HW, accumulate);
    be->group_norm_nhwc_bwd(be, dx, dc_param_train_grad(ps, n->w), dc_param_train_grad(ps, n->b), dy, x, mean, rstd,
                            dc_param_w(ps, n->w), dc_param_w(ps, n->b), B, n->C, HW, n->groups, silu, flags);
}
// y from x and the statistics dc_group_norm_nhwc_fwd of the same x kept (group_norm_nhwc_apply).
static inline void dc_group_norm_nhwc_apply(dc_backend *be, const dc_params *ps, const dc_group_norm *n, dc_buf y,
                                            dc_buf mean, dc_buf rstd, dc_buf x, int B, int64_t HW, bool silu) {
    be->group_norm_nhwc_apply(be, y, mean, rstd, x, dc_param_w(ps, n->w), dc_param_w(ps, n->b), B, n->C, HW,
                              n->groups, silu);
}
// y[M,D] = LayerNorm(x); mean, rstd [M] F32.
static inline void dc_layer_norm_fwd(dc_backend *be, const dc_params *ps, const dc_layer_norm *n, dc_buf y,
                                     dc_buf mean, dc_buf rstd, dc_buf x, int64_t M) {
    be->layer_norm_fwd(be, y, mean, rstd, x, dc_param_w(ps, n->w), dc_param_w(ps, n->b), M, n->D, n->eps);
}
// dx (+= if accumulate) from dy = dL/dy of y = LayerNorm(x); dgamma, dbeta +=
// (skipped for frozen parameters).
static inline void dc_layer_norm_bwd(dc_backend *be, const dc_params *ps, const dc_layer_norm *n, dc_buf dx,
                                     dc_buf dy, dc_buf x, dc_buf mean, dc_buf rstd, int64_t M, bool accumulate) {
    const int flags = dc_bwd_flags(ps, n->w, n->D, n->b, n->D, M, accumulate);
    be->layer_norm_bwd(be, dx, dc_param_train_grad(ps, n->w), dc_param_train_grad(ps, n->b), dy, x, mean, rstd,
                       dc_param_w(ps, n->w), M, n->D, flags);
}
static inline void dc_embedding_fwd(dc_backend *be, const dc_params *ps, const dc_embedding *e, dc_buf y,
                                    dc_buf idx, int B) {
    be->embed_fwd(be, y, dc_param_w(ps, e->table), idx, B, e->dim);
}
static inline void dc_embedding_bwd(dc_backend *be, const dc_params *ps, const dc_embedding *e, dc_buf dy,
                                    dc_buf idx, int B) {
    if (!ps->items[e->table].frozen) be->embed_bwd(be, dc_param_grad(ps, e->table), dy, idx, B, e->dim);
}
