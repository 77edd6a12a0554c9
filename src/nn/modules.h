// Layers as modules: a struct of parameter handles (indices into a model's
// dc_params, registered under PyTorch state-dict names) with _fwd/_bwd
// functions that run the backend's ops on them. A model is built by adding
// modules in its state dict's order; a new block type is one more module,
// not new index arithmetic.
#pragma once
#include <stdbool.h>
#include "backend/backend.h"
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

int dc_linear_add(dc_params *ps, dc_linear *l, const char *name, int in, int out);
// A stride-p convolution over non-overlapping p x p patches of C channels,
// which is a linear layer on the patch vectors (the weight keeps Conv2d's shape).
int dc_linear_add_patch_conv(dc_params *ps, dc_linear *l, const char *name, int C, int p, int out);
int dc_embedding_add(dc_params *ps, dc_embedding *e, const char *name, int rows, int dim);

// Matrix products read the compute copy of the weights; gradients are fp32.
static inline void dc_linear_fwd(dc_backend *be, const dc_params *ps, const dc_linear *l, dc_buf y,
                                 dc_buf x, int M) {
    be->linear_fwd(be, y, x, dc_param_w(ps, l->w), dc_param_w(ps, l->b), M, l->in, l->out);
}
// dx = dy W (skipped if dx.p is NULL; += if accumulate); dW, db +=.
static inline void dc_linear_bwd(dc_backend *be, const dc_params *ps, const dc_linear *l, dc_buf dx,
                                 dc_buf dy, dc_buf x, int M, bool accumulate) {
    be->linear_bwd(be, dx, dc_param_grad(ps, l->w), dc_param_grad(ps, l->b), dy, x, dc_param_w(ps, l->w), M,
                   l->in, l->out, accumulate);
}
// The MLP pair fc2(gelu(fc1(x))) through the backend's fused ops: forward
// keeps fc1's output (pre) and its GELU (act); backward goes from dL/dy down
// to dL/dpre, accumulating fc2's gradients (scratch as linear_bwd_gelu's).
static inline void dc_linear_gelu_fwd(dc_backend *be, const dc_params *ps, const dc_linear *fc1, dc_buf act,
                                      dc_buf pre, dc_buf x, int M) {
    be->linear_gelu_fwd(be, act, pre, x, dc_param_w(ps, fc1->w), dc_param_w(ps, fc1->b), M, fc1->in, fc1->out);
}
static inline void dc_linear_bwd_gelu(dc_backend *be, const dc_params *ps, const dc_linear *fc2, dc_buf dpre,
                                      dc_buf dy, dc_buf act, dc_buf pre, dc_buf scratch, int M) {
    be->linear_bwd_gelu(be, dpre, dc_param_grad(ps, fc2->w), dc_param_grad(ps, fc2->b), dy, act,
                        dc_param_w(ps, fc2->w), pre, scratch, M, fc2->in, fc2->out);
}
static inline void dc_embedding_fwd(dc_backend *be, const dc_params *ps, const dc_embedding *e, dc_buf y,
                                    dc_buf idx, int B) {
    be->embed_fwd(be, y, dc_param_w(ps, e->table), idx, B, e->dim);
}
static inline void dc_embedding_bwd(dc_backend *be, const dc_params *ps, const dc_embedding *e, dc_buf dy,
                                    dc_buf idx, int B) {
    be->embed_bwd(be, dc_param_grad(ps, e->table), dy, idx, B, e->dim);
}
