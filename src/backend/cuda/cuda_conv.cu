// 2-D convolutions through cuDNN (its convolution API: forward, backward
// data, backward filter) on channels-first maps (NCHW, as PyTorch lays them
// out) or channels-last ones (NHWC: x[B, H, W, Ci], w[Co, k, k, Ci],
// out[B, Ho, Wo, Co], s->nhwc). cuDNN's tensor-core kernels are NHWC ones, so
// the models keep their maps channels-last and cuDNN reads them as they are;
// the NCHW form stays for checking and for callers that have such maps.
//
// Plans. reserve_conv makes, for a shape in the backend's compute dtype, the
// descriptors and the three algorithms, and grows the workspace to what the
// forward pass needs, or all three (backward): inference never holds the
// backward passes' workspace or the weight-gradient scratch. Ops find the plan in a cache, so no op allocates (a reserved shape in
// another dtype gets a plan within the workspace there; a shape never
// reserved is an error that says so). Algorithms must be deterministic. In
// fp32 (the checking mode) and for backward they come from cuDNN's
// heuristics, the same every run, and so do channels-last bf16 forward
// passes (as fast as timed picks, and the same bits every run); channels-first
// bf16 forward passes take the fastest of a timing run at reserve (cudnnFind:
// the heuristics' picks ran several times slower there), or among those within
// 3% of it the one needing the least workspace, so two runs may pick
// different (each deterministic) algorithms and differ in the last bits.
// Channels-last bf16 forward passes also get a plan of cuDNN's graph API
// (its heuristics' first deterministic choice, the same every run), which
// they run by: the legacy call costs the host about 160 us a call on an
// H100 machine, which made eager steps and recording a step graph slow.
// A bf16 bias joins that graph as a pointwise add in the convolution's
// epilogue (cuDNN runs the same precompiled kernels with it): SD 1.x's
// 16-row step lost its 0.33 ms of bias passes (31.40 -> 31.09-31.23 ms on an
// H100). A shape whose graph cuDNN declines keeps the separate pass.
// conv2d_fwd_res adds a residual map in that epilogue too (bias and residual
// summed in fp32 with the product, rounded once): the VAE's resnets lose
// their residual add passes. Its graph is made at the shape's first such
// call (host work only, within the workspace reserved), so reserving costs
// nothing for shapes that never take a residual.
// Large bf16 3x3 convolutions of stride 1 (640 channels or more at SD's
// 64x64 to 16x16 levels, at batch 8) run Winograd's F(4x4, 3x3) instead
// (cuda_conv_winograd.cu).
// fp32 convs run with FMA math only (no TF32), so the fp32 mode checks as
// tightly as the CPU; bf16 convs
// use tensor cores with fp32 accumulation. A layout cuDNN has no qualifying
// algorithm for is an error that names it: maps are never transposed here.
// Memory: the scratch holds a padded copy of the largest asymmetrically
// padded input reserved (4 bytes a value).
//
// Padding. cuDNN pads symmetrically; SD's VAE downsampling pads (0,1,0,1).
// A conv with asymmetric padding copies its input, zero-padded, into the conv
// scratch and runs cuDNN unpadded; its input gradient comes back padded into
// the same place and is cropped. Those passes and the bias's are in
// cuda_conv_maps.cu.
//
// Gradients. dw accumulates (+=) in its own dtype, normally fp32: cuDNN writes
// the gradient in the weights' dtype into the scratch and a kernel adds it,
// or stores it with DC_BWD_DW_SET (with bf16 weights it is rounded to bf16
// first, as under PyTorch's autocast). db is a fixed-order sum over batch and
// pixels, added or stored the same way; dx is written by
// cuDNN directly, blended with beta = 1 when accumulating (or cropped, and
// added, from the padded gradient).
//
// cuDNN 9 keeps this API, marked deprecated in favour of its graph API; it
// keeps the code short.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_dnn_graph.h"
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

// The most workspace reserve lets one algorithm ask for: cuDNN's fastest
// choices (FFT) can want gigabytes.
#define CONV_WS_MAX ((size_t)256 << 20)


static size_t scratch_bytes(const dc_conv2d_shape *s, bool backward) {
    if (!backward) return (size_t)scratch_fwd_bytes(s);
    return (size_t)(scratch_db_offset(s) + (s->nhwc ? round256((int64_t)DB_SLICES * s->Co * (int64_t)sizeof(double)) : 0));
}

// Workspace bytes plan p's forward pass needs, or all three passes.
static size_t op_ws(const dc_conv_plan *p, bool backward) {
    return backward && p->ws_bwd > p->ws_fwd ? p->ws_bwd : p->ws_fwd;
}

static void shape_text(const dc_conv2d_shape *s, char *buf, size_t n) {
    snprintf(buf, n,
             "%d images of %d channels %dx%d to %d channels, kernel %d, stride %d, padding %d,%d,%d,%d "
             "(top, bottom, left, right), %s",
             s->B, s->Ci, s->H, s->W, s->Co, s->k, s->stride, s->pad_t, s->pad_b, s->pad_l, s->pad_r,
             s->nhwc ? "channels-last (NHWC)" : "channels-first (NCHW)");
}

// A shape cuDNN's 4-d descriptors (int sizes) can take; else false with why.
static bool shape_ok(const dc_conv2d_shape *s, char *err, size_t n) {
    char t[240];
    shape_text(s, t, sizeof t);
    if (s->nhwc != 0 && s->nhwc != 1) {  // an uninitialised field would key a plan of its own
        snprintf(err, n, "conv2d: invalid layout flag nhwc = %d (0 or 1): %s", s->nhwc, t);
        return false;
    }
    if (s->B < 1 || s->Ci < 1 || s->Co < 1 || s->H < 1 || s->W < 1 || s->k < 1 || s->stride < 1 || s->pad_t < 0 ||
        s->pad_b < 0 || s->pad_l < 0 || s->pad_r < 0 || s->pad_t >= s->k || s->pad_b >= s->k || s->pad_l >= s->k ||
        s->pad_r >= s->k || dc_conv2d_ho(s) < 1 || dc_conv2d_wo(s) < 1) {
        snprintf(err, n, "conv2d: invalid shape: %s", t);
        return false;
    }
    int64_t ni = (int64_t)s->B * s->Ci * (s->H + s->pad_t + s->pad_b) * (s->W + s->pad_l + s->pad_r);
    int64_t no = (int64_t)s->B * s->Co * dc_conv2d_ho(s) * dc_conv2d_wo(s);
    if (ni > INT32_MAX || no > INT32_MAX || dw_numel(s) > INT32_MAX) {
        snprintf(err, n, "conv2d: %s: a batch of more than 2^31 values is too large for one convolution", t);
        return false;
    }
    return true;
}

static void plan_free(dc_conv_plan *p) {
    if (p->gplan) cudnnBackendDestroyDescriptor(p->gplan);
    dc_dnn_graph_free(p->g);
    if (p->gplan_b) cudnnBackendDestroyDescriptor(p->gplan_b);
    dc_dnn_graph_free(p->g_b);
    if (p->gplan_r) cudnnBackendDestroyDescriptor(p->gplan_r);
    dc_dnn_graph_free(p->g_r);
    if (p->xd) cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd) cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd) cudnnDestroyFilterDescriptor(p->wd);
    if (p->cd) cudnnDestroyConvolutionDescriptor(p->cd);
}

// A cuDNN call while making a plan: false with the message in err.
#define DNN_MAKE(call)                                                                                   \
    do {                                                                                                 \
        cudnnStatus_t st_ = (call);                                                                      \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                               \
            snprintf(err, errn, "cuDNN error: %s, from %s", cudnnGetErrorString(st_), #call);            \
            return false;                                                                                \
        }                                                                                                \
    } while (0)

// Whether one of cuDNN's ranked choices qualifies: it runs, is deterministic,
// and in fp32 uses no tensor-core math.
template <typename Perf>
static bool usable(const Perf &r, bool fp32) {
    if (r.status != CUDNN_STATUS_SUCCESS || r.determinism != CUDNN_DETERMINISTIC) return false;
    return !fp32 || (r.mathType != CUDNN_TENSOR_OP_MATH && r.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

enum { UID_X = 1, UID_W, UID_Y, UID_B, UID_R, UID_VIRTUAL };

// What a graph adds to the product in its epilogue.
typedef enum { GRAPH_PLAIN, GRAPH_BIAS, GRAPH_BIAS_RES } graph_kind;

// The forward convolution as a graph of x, w and y (channels-last strides,
// the shape cuDNN sees: hi x wi, padding ph, pw), with bias: y = conv + b (b
// bf16 [Co], added in fp32 before y is rounded), with bias and residual: y =
// conv + b + r (r bf16, y's shape), and its plan, where cuDNN offers a
// deterministic one within limit bytes of workspace (into p->gplan,
// p->gplan_b or p->gplan_r); else p keeps the legacy call (and the separate
// passes).
static void graph_plan(cudnnHandle_t h, const dc_conv2d_shape *s, int hi, int wi, int ph, int pw, size_t limit,
                       graph_kind kind, dc_conv_plan *p) {
    dc_dnn_graph *g = (dc_dnn_graph *)calloc(1, sizeof *g);
    if (!g) return;
    g->next_uid = UID_VIRTUAL;
    const int64_t B = s->B, ci = s->Ci, co = s->Co, k = s->k, ho = dc_conv2d_ho(s), wo = dc_conv2d_wo(s);
    const int64_t xd[4] = {B, ci, hi, wi}, xs[4] = {hi * wi * ci, 1, wi * ci, ci};
    const int64_t wd[4] = {co, ci, k, k}, ws[4] = {k * k * ci, 1, k * ci, ci};
    const int64_t yd[4] = {B, co, ho, wo}, ys[4] = {ho * wo * co, 1, wo * co, co};
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t x = dc_dnn_tensor(g, UID_X, bf, xd, xs, false);
    cudnnBackendDescriptor_t w = dc_dnn_tensor(g, UID_W, bf, wd, ws, false);
    cudnnBackendDescriptor_t y = dc_dnn_tensor(g, UID_Y, bf, yd, ys, false);
    const bool bias = kind != GRAPH_PLAIN;
    cudnnBackendDescriptor_t yc = bias ? dc_dnn_tensor(g, 0, f32, yd, ys, false) : y;  // the product, fp32
    cudnnBackendDescriptor_t cd = dc_dnn_conv(g, s->stride, ph, pw);
    const float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yc);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    DNN_G_FINISH(g, op);
    cudnnBackendDescriptor_t ops[3] = {op, NULL, NULL};
    int nops = 1;
    if (bias) {
        const int64_t bd[4] = {1, co, 1, 1}, bs[4] = {co, 1, co, co};
        // with a residual, the product plus bias stays in fp32 for the second add
        cudnnBackendDescriptor_t yb = kind == GRAPH_BIAS_RES ? dc_dnn_tensor(g, 0, f32, yd, ys, false) : y;
        ops[nops++] = dc_dnn_pointwise(g, CUDNN_POINTWISE_ADD, yc, dc_dnn_tensor(g, UID_B, bf, bd, bs, false), yb);
        if (kind == GRAPH_BIAS_RES)
            ops[nops++] = dc_dnn_pointwise(g, CUDNN_POINTWISE_ADD, yb, dc_dnn_tensor(g, UID_R, bf, yd, ys, false), y);
    }
    cudnnBackendDescriptor_t graph = dc_dnn_op_graph(g, h, ops, nops);
    int64_t ws_bytes = 0;
    cudnnBackendDescriptor_t plan = NULL;
    if (g->st == CUDNN_STATUS_SUCCESS) plan = dc_dnn_plan(g, h, graph, (int64_t)limit, true, &ws_bytes);
    if (!plan) {
        dc_dnn_graph_free(g);
        cudaGetLastError();  // a declined build leaves no error behind
        return;
    }
    if (kind == GRAPH_BIAS_RES) p->gplan_r = plan, p->g_r = g;
    else if (bias) p->gplan_b = plan, p->g_b = g;
    else p->gplan = plan, p->g = g;
    if ((size_t)ws_bytes > p->ws_fwd) p->ws_fwd = (size_t)ws_bytes;  // any of the calls may run
}

// Fills p (zeroed by the caller, freed by it on failure) for shape s in dtype
// dt, with algorithms whose workspace is at most limit bytes.
static bool plan_make(cudnnHandle_t h, const dc_conv2d_shape *s, dc_dtype dt, size_t limit, dc_conv_plan *p,
                      char *err, size_t errn) {
    const bool fp32 = dt == DC_F32;
    const cudnnDataType_t ty = fp32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16;
    // bf16 needs TENSOR_OP_MATH for tensor cores (DEFAULT_MATH gives FMA kernels, about 60 TFLOP/s)
    const cudnnMathType_t base = fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    // x, y [N, C, H, W] and w [K, C, R, S] in cuDNN's terms, stored in that
    // order or channels-last (w then [K, R, S, C]): the layout is the format alone
    const cudnnTensorFormat_t fmt = s->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    p->s = *s, p->dt = dt, p->padded = padded(s);
    const int hi = p->padded ? s->H + s->pad_t + s->pad_b : s->H, wi = p->padded ? s->W + s->pad_l + s->pad_r : s->W;
    const int ph = p->padded ? 0 : s->pad_t, pw = p->padded ? 0 : s->pad_l;
    const int ho = dc_conv2d_ho(s), wo = dc_conv2d_wo(s);
    DNN_MAKE(cudnnCreateTensorDescriptor(&p->xd));
    DNN_MAKE(cudnnSetTensor4dDescriptor(p->xd, fmt, ty, s->B, s->Ci, hi, wi));
    DNN_MAKE(cudnnCreateFilterDescriptor(&p->wd));
    DNN_MAKE(cudnnSetFilter4dDescriptor(p->wd, ty, fmt, s->Co, s->Ci, s->k, s->k));
    DNN_MAKE(cudnnCreateConvolutionDescriptor(&p->cd));
    DNN_MAKE(cudnnSetConvolution2dDescriptor(p->cd, ph, pw, s->stride, s->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT));
    DNN_MAKE(cudnnSetConvolutionMathType(p->cd, base));
    int n = 0, c = 0, oh = 0, ow = 0;
    DNN_MAKE(cudnnGetConvolution2dForwardOutputDim(p->cd, p->xd, p->wd, &n, &c, &oh, &ow));
    if (n != s->B || c != s->Co || oh != ho || ow != wo) {
        snprintf(err, errn, "cuDNN computes a %dx%dx%dx%d output where %dx%dx%dx%d is expected", n, c, oh, ow, s->B,
                 s->Co, ho, wo);
        return false;
    }
    DNN_MAKE(cudnnCreateTensorDescriptor(&p->yd));
    DNN_MAKE(cudnnSetTensor4dDescriptor(p->yd, fmt, ty, s->B, s->Co, ho, wo));

    // Each pass takes the first qualifying choice whose workspace fits; the
    // math type a choice was ranked with is set again before it runs.
    size_t ws = 0;
    bool found = false;
    cudnnConvolutionFwdAlgoPerf_t f[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    DNN_MAKE(cudnnSetConvolutionMathType(p->cd, base));  // rank for the base math
    // Heuristics give the same choice every run (the same bits); channels-last
    // bf16 picks run as fast as timed ones (SD 1.5's UNet and VAE on an H100),
    // channels-first ones 3-10x slower, so those alone are timed here
    const bool timed = !fp32 && !s->nhwc;
    if (!timed)
        DNN_MAKE(cudnnGetConvolutionForwardAlgorithm_v7(h, p->xd, p->wd, p->cd, p->yd,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, f));
    else
        DNN_MAKE(cudnnFindConvolutionForwardAlgorithm(h, p->xd, p->wd, p->cd, p->yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                      &n, f));
    // Find ranks by time: after the fastest, a choice within 3% of it that
    // needs less workspace is taken instead (memory for nothing measurable)
    float fastest = 0.0f;
    for (int i = 0; i < n && !(found && !timed); i++) {
        cudnnMathType_t m = fp32 ? base : f[i].mathType;
        if (!usable(f[i], fp32) || cudnnSetConvolutionMathType(p->cd, m) != CUDNN_STATUS_SUCCESS ||
            cudnnGetConvolutionForwardWorkspaceSize(h, p->xd, p->wd, p->cd, p->yd, f[i].algo, &ws) !=
                CUDNN_STATUS_SUCCESS ||
            ws > limit || (found && (f[i].time > 1.03f * fastest || ws >= p->ws_fwd)))
            continue;
        if (!found) fastest = f[i].time;
        p->fwd = f[i].algo, p->math_fwd = m, p->ws_fwd = ws, found = true;
    }
    if (found && !fp32 && s->nhwc) {
        graph_plan(h, s, hi, wi, ph, pw, limit, GRAPH_PLAIN, p);
        if (p->gplan) graph_plan(h, s, hi, wi, ph, pw, limit, GRAPH_BIAS, p);
    }
    const char *pass = "forward";
    if (found) {
        found = false, pass = "backward-data";
        cudnnConvolutionBwdDataAlgoPerf_t d[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        DNN_MAKE(cudnnSetConvolutionMathType(p->cd, base));  // rank for the base math
        DNN_MAKE(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->wd, p->yd, p->cd, p->xd,
                                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, d));
        for (int i = 0; i < n && !found; i++) {
            cudnnMathType_t m = fp32 ? base : d[i].mathType;
            if (!usable(d[i], fp32) || cudnnSetConvolutionMathType(p->cd, m) != CUDNN_STATUS_SUCCESS ||
                cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->wd, p->yd, p->cd, p->xd, d[i].algo, &ws) !=
                    CUDNN_STATUS_SUCCESS ||
                ws > limit)
                continue;
            p->bwd_data = d[i].algo, p->math_data = m, p->ws_bwd = ws, found = true;
        }
    }
    if (found) {
        found = false, pass = "backward-filter";
        cudnnConvolutionBwdFilterAlgoPerf_t w[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        DNN_MAKE(cudnnSetConvolutionMathType(p->cd, base));  // rank for the base math
        DNN_MAKE(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->xd, p->yd, p->cd, p->wd,
                                                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, w));
        for (int i = 0; i < n && !found; i++) {
            cudnnMathType_t m = fp32 ? base : w[i].mathType;
            if (!usable(w[i], fp32) || cudnnSetConvolutionMathType(p->cd, m) != CUDNN_STATUS_SUCCESS ||
                cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->xd, p->yd, p->cd, p->wd, w[i].algo, &ws) !=
                    CUDNN_STATUS_SUCCESS ||
                ws > limit)
                continue;
            p->bwd_filter = w[i].algo, p->math_filter = m, found = true;
            if (ws > p->ws_bwd) p->ws_bwd = ws;
        }
    }
    if (!found) {
        char t[240];
        shape_text(s, t, sizeof t);
        snprintf(strcmp(pass, "forward") ? p->bwd_missing : err, strcmp(pass, "forward") ? sizeof p->bwd_missing : errn,
                 "cuDNN offers no deterministic %s %s algorithm within %.1f MiB of workspace for %s", pass,
                 dc_dtype_name(dt), limit / 1048576.0, t);
        return strcmp(pass, "forward") != 0;  // a convolution without backward still runs forward
    }
    return true;
}

static dc_conv_plan *plan_find(dc_cuda_ctx *c, const dc_conv2d_shape *s, dc_dtype dt) {
    for (int i = 0; i < c->nconv_plans; i++)
        if (c->conv_plans[i].dt == dt && memcmp(&c->conv_plans[i].s, s, sizeof *s) == 0) return &c->conv_plans[i];
    return NULL;
}

// The cached plan, or a new one within `limit` bytes of workspace; NULL with
// the message in err.
static dc_conv_plan *plan_get(dc_cuda_ctx *c, const dc_conv2d_shape *s, dc_dtype dt, size_t limit, char *err,
                              size_t errn) {
    dc_conv_plan *p = plan_find(c, s, dt);
    if (p) return p;
    if (!shape_ok(s, err, errn)) return NULL;
    if (c->nconv_plans == c->cap_conv_plans) {
        int cap = c->cap_conv_plans ? 2 * c->cap_conv_plans : 32;
        dc_conv_plan *t = (dc_conv_plan *)realloc(c->conv_plans, cap * sizeof *t);
        if (!t) {
            snprintf(err, errn, "out of host memory for %d convolution plans", cap);
            return NULL;
        }
        c->conv_plans = t, c->cap_conv_plans = cap;
    }
    dc_conv_plan np;
    memset(&np, 0, sizeof np);
    if (!plan_make(c->dnn, s, dt, limit, &np, err, errn)) {
        plan_free(&np);
        return NULL;
    }
    c->conv_plans[c->nconv_plans] = np;
    return &c->conv_plans[c->nconv_plans++];
}

extern "C" void dc_cuda_conv_free(dc_cuda_ctx *c) {
    dc_cuda_wino_free(c);
    for (int i = 0; i < c->nconv_plans; i++) plan_free(&c->conv_plans[i]);
    free(c->conv_plans);
    c->conv_plans = NULL, c->nconv_plans = c->cap_conv_plans = 0;
    if (c->dnn) cudnnDestroy(c->dnn);
    c->dnn = NULL;
    if (c->conv_ws) cudaFree(c->conv_ws);
    if (c->conv_scratch) cudaFree(c->conv_scratch);
    c->conv_ws = c->conv_scratch = NULL, c->conv_ws_bytes = c->conv_scratch_bytes = 0;
    c->frees++;
}

extern "C" int dc_cuda_dnn_start(dc_cuda_ctx *c) {
    if (c->dnn) return 0;
    cudnnStatus_t st = cudnnCreate(&c->dnn);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(c->dnn, c->stream);
    if (st == CUDNN_STATUS_SUCCESS) return 0;
    if (c->dnn) cudnnDestroy(c->dnn);
    c->dnn = NULL;
    cudaGetLastError();
    return dc_fail("cuDNN could not start (%s)", cudnnGetErrorString(st));
}

extern "C" int dc_cuda_reserve_conv(dc_backend *be, const dc_conv2d_shape *s, bool backward) {
    dc_cuda_ctx *c = dc_cuda(be);
    char err[400];
    if (c->failed) return dc_fail("%s", c->err);
    if (!shape_ok(s, err, sizeof err)) return dc_fail("%s", err);
    DC_TRY(dc_cuda_dnn_start(c));
    size_t limit = c->conv_ws_bytes > CONV_WS_MAX ? c->conv_ws_bytes : CONV_WS_MAX;
    dc_conv_plan *p = plan_get(c, s, be->compute, limit, err, sizeof err);
    if (!p) return cudaGetLastError(), dc_fail("%s", err);
    size_t ws = op_ws(p, backward), wino = dc_cuda_winograd_ws(be, s, be->compute);
    DC_TRY(dc_cuda_grow(c, &c->conv_ws, &c->conv_ws_bytes, wino > ws ? wino : ws, "the convolution workspace"));
    DC_TRY(dc_cuda_grow(c, &c->conv_scratch, &c->conv_scratch_bytes, scratch_bytes(s, backward),
                        "the convolution scratch"));
    return 0;
}

// A cuDNN call inside an op: a failure is recorded like a CUDA error.
#define DNN(call)                                                                                        \
    do {                                                                                                 \
        cudnnStatus_t st_ = (call);                                                                      \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                               \
            cudaGetLastError();                                                                          \
            dc_cuda_record(be, __func__, __FILE__, __LINE__, "cuDNN error: %s, from %s",                 \
                           cudnnGetErrorString(st_), #call);                                             \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

// Whether the workspace and scratch hold what plan p's forward (or backward) needs.
static bool fits(const dc_cuda_ctx *c, const dc_conv_plan *p, bool backward) {
    return op_ws(p, backward) <= c->conv_ws_bytes && scratch_bytes(&p->s, backward) <= c->conv_scratch_bytes;
}

// The plan an op runs: made by reserve_conv, or now (host work only) for a
// dtype reserve_conv did not make it for, within the workspace and scratch
// there. NULL with the error recorded.
static dc_conv_plan *op_plan(dc_backend *be, const char *func, const dc_conv2d_shape *s, dc_dtype dt,
                             bool backward) {
    dc_cuda_ctx *c = dc_cuda(be);
    char err[400], t[240];
    dc_conv_plan *p = plan_find(c, s, dt);
    if (p && fits(c, p, backward)) return p;
    shape_text(s, t, sizeof t);
    if (p) {  // reserved for forward only, or its reserve_conv failed to grow the workspace
        dc_cuda_record(be, func, __FILE__, __LINE__, "conv2d of %s was not reserved%s (reserve_conv)", t,
                       backward && fits(c, p, false) ? " for backward" : "");
        return NULL;
    }
    if (!shape_ok(s, err, sizeof err)) {
        dc_cuda_record(be, func, __FILE__, __LINE__, "%s", err);
        return NULL;
    }
    if (!c->dnn || scratch_bytes(s, backward) > c->conv_scratch_bytes) {
        dc_cuda_record(be, func, __FILE__, __LINE__, "conv2d of %s was not reserved (reserve_conv)", t);
        return NULL;
    }
    p = plan_get(c, s, dt, c->conv_ws_bytes, err, sizeof err);
    if (!p) dc_cuda_record(be, func, __FILE__, __LINE__, "%s (the shape was not reserved in %s)", err, dc_dtype_name(dt));
    return p;
}

static bool float_type(dc_dtype t) { return t == DC_F32 || t == DC_BF16; }

// y[n] += x[n] (= if set)
__global__ void k_conv_add(void *y, int ybf, const void *x, int xbf, int64_t n, bool set) {
    GRID_STRIDE(i, n) dc_st(y, i, set ? dc_ld(x, i, xbf) : dc_ld(y, i, ybf) + dc_ld(x, i, xbf), ybf);
}

// The same for fp32 y and bf16 x, eight values a thread (16-byte loads of x,
// y 16-byte aligned): the weights' gradients of a UNet's convolutions.
__global__ void k_conv_add_v8(float4 *y, const uint4 *x, int64_t n8, bool set) {
    GRID_STRIDE(i, n8) {
        float v[8];
        dc_unpack8(v, x[i]);
        float4 a = make_float4(v[0], v[1], v[2], v[3]), b = make_float4(v[4], v[5], v[6], v[7]);
        if (!set) {
            const float4 p = y[2 * i], q = y[2 * i + 1];
            a.x += p.x, a.y += p.y, a.z += p.z, a.w += p.w, b.x += q.x, b.y += q.y, b.z += q.z, b.w += q.w;
        }
        y[2 * i] = a, y[2 * i + 1] = b;
    }
}

// y += x (= if set): the scratch's gradient in the weights' dtype into dw.
static void conv_add(dc_backend *be, dc_buf y, const void *x, dc_dtype xdt, int64_t n, bool set) {
    cudaStream_t st = dc_cuda(be)->stream;
    const int64_t n8 = y.dt == DC_F32 && xdt == DC_BF16 && dc_aligned(y.p, 16) && dc_aligned(x, 16) ? n / 8 : 0;
    if (n8) k_conv_add_v8<<<dc_blocks(n8, TPB), TPB, 0, st>>>((float4 *)y.p, (const uint4 *)x, n8, set);
    if (n8 * 8 < n)
        k_conv_add<<<dc_blocks(n - n8 * 8, TPB), TPB, 0, st>>>(dc_buf_at(y, n8 * 8).p, BF(y),
                                                               (const char *)x + n8 * 8 * dc_dtype_size(xdt),
                                                               xdt == DC_BF16, n - n8 * 8, set);
}

// ---- the ops --------------------------------------------------------------------------------
extern "C" void dc_cuda_conv2d_fwd(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b,
                                   const dc_conv2d_shape *s) {
    DC_CUDA_OP(be);
    dc_cuda_ctx *c = dc_cuda(be);
    if (!float_type(x.dt) || w.dt != x.dt || out.dt != x.dt || (b.p && !float_type(b.dt)))
        DC_CUDA_FAIL(be, "conv2d dtypes: x %s, w %s, out %s (one of F32, BF16 for all three), b %s",
                     dc_dtype_name(x.dt), dc_dtype_name(w.dt), dc_dtype_name(out.dt), dc_dtype_name(b.dt));
    dc_conv_plan *p = op_plan(be, __func__, s, x.dt, false);
    if (!p) return;
    if (dc_cuda_conv_winograd(be, out, x, w, b, s)) {  // where it spends less (cuda_conv_winograd.cu)
        DC_CUDA_LAUNCHED(be);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    const void *xin = dc_conv_input(be, p, x);
    const bool graph = p->gplan && dc_aligned(xin, 16) && dc_aligned(w.p, 16) && dc_aligned(out.p, 16);
    if (graph && b.p && b.dt == DC_BF16 && p->gplan_b && dc_aligned(b.p, 16)) {
        if (c->prof) dc_cuda_prof_mark(c, "conv2d_fwd: cuDNN graph with bias (NHWC)");
        const int64_t uids[4] = {UID_X, UID_W, UID_Y, UID_B};
        void *const data[4] = {(void *)xin, w.p, out.p, b.p};
        DNN(dc_dnn_execute(c->dnn, p->gplan_b, 4, uids, data, c->conv_ws));
        b = dc_buf_none();  // added
    } else if (graph) {
        if (c->prof) dc_cuda_prof_mark(c, "conv2d_fwd: cuDNN graph (NHWC)");
        const int64_t uids[3] = {UID_X, UID_W, UID_Y};
        void *const data[3] = {(void *)xin, w.p, out.p};
        DNN(dc_dnn_execute(c->dnn, p->gplan, 3, uids, data, c->conv_ws));
    } else {
        if (c->prof) dc_cuda_prof_mark(c, s->nhwc ? "conv2d_fwd: cuDNN (NHWC)" : "conv2d_fwd: cuDNN (NCHW)");
        DNN(cudnnSetConvolutionMathType(p->cd, p->math_fwd));
        DNN(cudnnConvolutionForward(c->dnn, &one, p->xd, xin, p->wd, w.p, p->cd, p->fwd, c->conv_ws,
                                    c->conv_ws_bytes, &zero, p->yd, out.p));
    }
    if (b.p) {
        if (c->prof) dc_cuda_prof_mark(c, "conv2d_fwd: bias");
        dc_conv_bias(be, out, b, s);
    }
    DC_CUDA_LAUNCHED(be);
}

// The residual joins the bias in the graph's epilogue where the shape has a
// graph (bf16 channels-last, symmetric padding, a bf16 bias, every buffer
// 16-byte aligned); elsewhere the convolution runs as conv2d_fwd does and an
// add pass follows.
extern "C" void dc_cuda_conv2d_fwd_res(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, dc_buf r,
                                       const dc_conv2d_shape *s) {
    DC_CUDA_OP(be);
    dc_cuda_ctx *c = dc_cuda(be);
    if (r.dt != out.dt)
        DC_CUDA_FAIL(be, "conv2d_fwd_res: the residual is %s, the output %s", dc_dtype_name(r.dt),
                     dc_dtype_name(out.dt));
    dc_conv_plan *p = plan_find(c, s, x.dt);
    const bool fused = p && p->gplan && !p->padded && fits(c, p, false) && w.dt == x.dt && out.dt == x.dt &&
                       b.p && b.dt == DC_BF16 && dc_aligned(x.p, 16) && dc_aligned(w.p, 16) &&
                       dc_aligned(out.p, 16) && dc_aligned(b.p, 16) && dc_aligned(r.p, 16);
    if (fused && !p->res_tried) {
        p->res_tried = true;
        graph_plan(c->dnn, s, s->H, s->W, s->pad_t, s->pad_l, c->conv_ws_bytes, GRAPH_BIAS_RES, p);
    }
    if (fused && p->gplan_r) {
        if (c->prof) dc_cuda_prof_mark(c, "conv2d_fwd_res: cuDNN graph with bias and residual (NHWC)");
        const int64_t uids[5] = {UID_X, UID_W, UID_Y, UID_B, UID_R};
        void *const data[5] = {x.p, w.p, out.p, b.p, r.p};
        DNN(dc_dnn_execute(c->dnn, p->gplan_r, 5, uids, data, c->conv_ws));
        DC_CUDA_LAUNCHED(be);
        return;
    }
    dc_cuda_conv2d_fwd(be, out, x, w, b, s);
    dc_cuda_axpy(be, out, r, 1.0f, (int64_t)s->B * s->Co * dc_conv2d_ho(s) * dc_conv2d_wo(s));
}

extern "C" void dc_cuda_conv2d_bwd(dc_backend *be, dc_buf dx, dc_buf dw, dc_buf db, dc_buf dout, dc_buf x, dc_buf w,
                                   const dc_conv2d_shape *s, int flags) {
    DC_CUDA_OP(be);
    dc_cuda_ctx *c = dc_cuda(be);
    const bool accumulate = flags & DC_BWD_DX_ADD, set = flags & DC_BWD_DW_SET;
    if (!float_type(x.dt) || w.dt != x.dt || dout.dt != x.dt || (dx.p && dx.dt != x.dt) ||
        (dw.p && !float_type(dw.dt)) || (db.p && !float_type(db.dt)))
        DC_CUDA_FAIL(be,
                     "conv2d backward dtypes: x %s, w %s, dout %s, dx %s (one of F32, BF16 for all four), "
                     "dw %s, db %s",
                     dc_dtype_name(x.dt), dc_dtype_name(w.dt), dc_dtype_name(dout.dt), dc_dtype_name(dx.dt),
                     dc_dtype_name(dw.dt), dc_dtype_name(db.dt));
    dc_conv_plan *p = op_plan(be, __func__, s, x.dt, true);
    if (!p) return;
    if (p->bwd_missing[0]) DC_CUDA_FAIL(be, "%s", p->bwd_missing);
    const float one = 1.0f, zero = 0.0f;
    if (db.p) dc_conv_bias_grad(be, db, dout, s, set);
    if (dw.p) {
        // into the scratch in the weights' dtype (and layout), then added to dw (or written)
        void *dws = (char *)c->conv_scratch + scratch_dw_offset(s);
        const void *xin = dc_conv_input(be, p, x);
        DNN(cudnnSetConvolutionMathType(p->cd, p->math_filter));
        DNN(cudnnConvolutionBackwardFilter(c->dnn, &one, p->xd, xin, p->yd, dout.p, p->cd, p->bwd_filter, c->conv_ws,
                                           c->conv_ws_bytes, &zero, p->wd, dws));
        conv_add(be, dw, dws, w.dt, dw_numel(s), set);
    }
    if (dx.p) {
        DNN(cudnnSetConvolutionMathType(p->cd, p->math_data));
        if (!p->padded) {
            const float beta = accumulate ? 1.0f : 0.0f;
            DNN(cudnnConvolutionBackwardData(c->dnn, &one, p->wd, w.p, p->yd, dout.p, p->cd, p->bwd_data, c->conv_ws,
                                             c->conv_ws_bytes, &beta, p->xd, dx.p));
        } else {
            // the padded gradient over the padded input (which dw no longer needs), then its window
            void *dxp = c->conv_scratch;
            DNN(cudnnConvolutionBackwardData(c->dnn, &one, p->wd, w.p, p->yd, dout.p, p->cd, p->bwd_data, c->conv_ws,
                                             c->conv_ws_bytes, &zero, p->xd, dxp));
            dc_conv_crop(be, p, dx, dxp, accumulate);
        }
    }
    DC_CUDA_LAUNCHED(be);
}
