// What the convolution files share (cuda_conv.cu: plans and the ops;
// cuda_conv_maps.cu: padding and bias passes over the maps): a plan, the
// layout of the conv scratch, and the map passes.
#pragma once
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_dnn_graph.h"
#include "backend/cuda/cuda_ops.h"

struct dc_conv_plan {
    dc_conv2d_shape s;  // key: shape, layout and dtype (of x, w, out and their gradients)
    dc_dtype dt;
    bool padded;        // asymmetric: cuDNN sees the input padded by us
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    cudnnMathType_t math_fwd, math_data, math_filter;
    size_t ws_fwd, ws_bwd;  // workspace bytes forward needs, and the larger of the backward passes'
    // bf16 channels-last forward through cuDNN's graph API (NULL: none; the
    // legacy call runs): a plan made once, run with a fraction of the host
    // time of the legacy call, which dominates recording a UNet step
    cudnnBackendDescriptor_t gplan;
    dc_dnn_graph *g;
    // the same with a bf16 bias added in the convolution's epilogue (NULL:
    // none; the bias pass runs after the plan above)
    cudnnBackendDescriptor_t gplan_b;
    dc_dnn_graph *g_b;
    // with a bf16 bias and a residual map added in the epilogue
    // (conv2d_fwd_res; NULL: none, or not tried yet)
    cudnnBackendDescriptor_t gplan_r;
    dc_dnn_graph *g_r;
    bool res_tried;
    char bwd_missing[320];  // empty, or why backward cannot run (forward still can: inference
                            // of large fp32 convs where no deterministic backward fits)
};

#define GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
enum { TPB = 256 };
// Row slices of a channels-last bias gradient (partial sums in the scratch).
enum { DB_SLICES = 32 };

static inline bool padded(const dc_conv2d_shape *s) { return s->pad_t != s->pad_b || s->pad_l != s->pad_r; }
static inline int64_t round256(int64_t n) { return (n + 255) & ~(int64_t)255; }
static inline int64_t dw_numel(const dc_conv2d_shape *s) { return (int64_t)s->Co * s->Ci * s->k * s->k; }

// Scratch: (asymmetric padding) the padded input or input gradient, which
// forward needs too, then for backward the weight gradient as cuDNN writes
// it and the slices' partial sums of a channels-last bias gradient; sized
// for 4-byte values whatever the dtype.
static inline int64_t scratch_fwd_bytes(const dc_conv2d_shape *s) {
    if (!padded(s)) return 0;
    return round256((int64_t)s->B * s->Ci * (s->H + s->pad_t + s->pad_b) * (s->W + s->pad_l + s->pad_r) * 4);
}
static inline int64_t scratch_dw_offset(const dc_conv2d_shape *s) { return scratch_fwd_bytes(s); }
static inline int64_t scratch_db_offset(const dc_conv2d_shape *s) {
    return scratch_dw_offset(s) + round256(dw_numel(s) * 4);
}

// x, or (a plan that pads asymmetrically) x copied zero-padded into the scratch.
const void *dc_conv_input(dc_backend *be, const dc_conv_plan *p, dc_buf x);
// dx (+= with accumulate) = the padded gradient dxp cropped.
void dc_conv_crop(dc_backend *be, const dc_conv_plan *p, dc_buf dx, const void *dxp, bool accumulate);
// out += b per output channel.
void dc_conv_bias(dc_backend *be, dc_buf out, dc_buf b, const dc_conv2d_shape *s);
// db += the sum of dout over batch and pixels, in a fixed order.
void dc_conv_bias_grad(dc_backend *be, dc_buf db, dc_buf dout, const dc_conv2d_shape *s, bool set);
