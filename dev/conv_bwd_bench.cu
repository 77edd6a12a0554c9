// Exploration, not part of the engine: times cuDNN's deterministic choices
// for the convolutions' two backward passes (data and filter) at the shapes
// of SD 2.1's UNet training at 256 px (latents 32x32), batch 64 by default,
// bf16 channels-last maps with fp32 accumulation, as cuda_conv.cu runs them:
//
//   heur   the legacy API's first deterministic heuristic choice (what the engine runs)
//   find   the legacy API's fastest deterministic choice, timed (cudnnFind*Ex)
//   g1     the graph API's first deterministic engine configuration (heuristics mode A)
//   gbest  the fastest of the graph API's deterministic configurations (modes A and B)
//
// Each alternative's output is compared with heur's (relative max difference)
// so that a faster configuration computing something else shows. Weighted by
// each shape's count in a step, the totals say what a better choice might be
// worth. Read them with care: a call's time here is the GPU's or the host's,
// whichever is longer, and a legacy call costs the host about 0.1 ms, so at
// short shapes (the 1x1 convolutions, the 4x4 maps) heur and find measure the
// host. In a training step the host runs ahead of the GPU and that time is
// hidden: the graphs' 24.7 -> 19.6 ms here gave no step time at all
// (docs/PERFORMANCE.md, 2026-11-29).
//
//   nvcc -O2 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc dev/conv_bwd_bench.cu \
//        src/backend/cuda/cuda_dnn_graph.cu -lcudnn -o conv_bwd_bench
//   ./conv_bwd_bench [--batch N] [--calls N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_dnn_graph.h"

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_) {                                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define DK(x)                                                                                        \
    do {                                                                                             \
        cudnnStatus_t s_ = (x);                                                                      \
        if (s_) {                                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudnnGetErrorString(s_));     \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

typedef struct {
    int hw, ci, co, k, stride, count;
} shape;

// The UNet's convolutions at 32x32 latents: conv_in, the down path's resnets,
// shortcuts and downsamplers, the mid block, the up path's resnets over the
// concatenated skips, their shortcuts and upsamplers, conv_out.
static const shape k_shapes[] = {
    {32, 4, 320, 3, 1, 1},     {32, 320, 320, 3, 1, 7},   {32, 320, 320, 3, 2, 1},   {16, 320, 640, 3, 1, 1},
    {16, 640, 640, 3, 1, 6},   {16, 320, 640, 1, 1, 1},   {16, 640, 640, 3, 2, 1},   {8, 640, 1280, 3, 1, 1},
    {8, 1280, 1280, 3, 1, 7},  {8, 640, 1280, 1, 1, 1},   {8, 1280, 1280, 3, 2, 1},  {4, 1280, 1280, 3, 1, 11},
    {4, 2560, 1280, 3, 1, 3},  {4, 2560, 1280, 1, 1, 3},  {8, 2560, 1280, 3, 1, 2},  {8, 1920, 1280, 3, 1, 1},
    {8, 2560, 1280, 1, 1, 2},  {8, 1920, 1280, 1, 1, 1},  {16, 1280, 1280, 3, 1, 1}, {16, 1920, 640, 3, 1, 1},
    {16, 1280, 640, 3, 1, 1},  {16, 960, 640, 3, 1, 1},   {16, 1920, 640, 1, 1, 1},  {16, 1280, 640, 1, 1, 1},
    {16, 960, 640, 1, 1, 1},   {32, 640, 640, 3, 1, 1},   {32, 960, 320, 3, 1, 1},   {32, 640, 320, 3, 1, 2},
    {32, 960, 320, 1, 1, 1},   {32, 640, 320, 1, 1, 2},   {32, 320, 4, 3, 1, 1},
};
enum { NSHAPES = sizeof k_shapes / sizeof k_shapes[0] };
static const size_t WS_MAX = (size_t)256 << 20;  // the engine's per-algorithm limit
enum { UID_X = 1, UID_W, UID_Y };

static __global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        p[i] = __float2bfloat16(scale * ((float)(h & 0xffffff) / 8388608.0f - 1.0f));
    }
}

static int g_calls = 20;
static cudaEvent_t g_e0, g_e1;

// Microseconds a call of f (after one warm-up call), the median of 3 rounds.
template <typename F>
static float time_us(F f) {
    f();
    CK(cudaDeviceSynchronize());
    float r[3];
    for (int round = 0; round < 3; round++) {
        CK(cudaEventRecord(g_e0));
        for (int i = 0; i < g_calls; i++) f();
        CK(cudaEventRecord(g_e1));
        CK(cudaEventSynchronize(g_e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, g_e0, g_e1));
        r[round] = 1000.0f * ms / g_calls;
    }
    float a = fminf(r[0], r[1]), b = fmaxf(r[0], r[1]);
    return r[2] < a ? a : r[2] > b ? b : r[2];
}

// max |a - b| / max |b| over n bf16 values.
static double rel_diff(const __nv_bfloat16 *a, const __nv_bfloat16 *b, size_t n) {
    std::vector<__nv_bfloat16> ha(n), hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = __bfloat162float(ha[i]), y = __bfloat162float(hb[i]);
        if (x != x) return INFINITY;
        d = fmax(d, fabs(x - y)), m = fmax(m, fabs(y));
    }
    return m > 0 ? d / m : INFINITY;
}

// The graph of one backward pass (data: dx from w, dy; filter: dw from x, dy).
static cudnnBackendDescriptor_t bwd_graph(dc_dnn_graph *g, cudnnHandle_t h, const shape *s, int B, bool data) {
    const int64_t ci = s->ci, co = s->co, k = s->k, hi = s->hw, pad = k / 2, ho = (hi + 2 * pad - k) / s->stride + 1;
    const int64_t xd[4] = {B, ci, hi, hi}, xs[4] = {hi * hi * ci, 1, hi * ci, ci};
    const int64_t wd[4] = {co, ci, k, k}, ws[4] = {k * k * ci, 1, k * ci, ci};
    const int64_t yd[4] = {B, co, ho, ho}, ys[4] = {ho * ho * co, 1, ho * co, co};
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16;
    cudnnBackendDescriptor_t x = dc_dnn_tensor(g, UID_X, bf, xd, xs, false);
    cudnnBackendDescriptor_t w = dc_dnn_tensor(g, UID_W, bf, wd, ws, false);
    cudnnBackendDescriptor_t y = dc_dnn_tensor(g, UID_Y, bf, yd, ys, false);
    cudnnBackendDescriptor_t cd = dc_dnn_conv(g, s->stride, pad, pad);
    const float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op;
    if (data) {
        op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    } else {
        op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &cd);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
        DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    }
    DNN_G_FINISH(g, op);
    return dc_dnn_op_graph(g, h, &op, 1);
}

// The deterministic plans within WS_MAX that heuristics `mode` offers (up to
// 16 configurations), appended to out.
static void graph_plans(cudnnHandle_t h, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                        std::vector<cudnnBackendDescriptor_t> &out) {
    enum { MAX_CFG = 16 };
    cudnnBackendDescriptor_t heur = NULL, cfg[MAX_CFG];
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur)) return;
    int64_t n = 0;
    for (int i = 0; i < MAX_CFG; i++) cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[i]);
    if (!cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                  &graph) &&
        !cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) &&
        !cudnnBackendFinalize(heur) &&
        !cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFG, &n,
                                  cfg)) {
        for (int64_t i = 0; i < n; i++) {
            if (dc_dnn_nondeterministic(cfg[i])) continue;
            cudnnBackendDescriptor_t plan = NULL;
            int64_t cnt = 0, need = 0;
            cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
            if (!st) st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
            if (!st)
                st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
            if (!st) st = cudnnBackendFinalize(plan);
            if (!st)
                st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                              &cnt, &need);
            if (!st && need <= (int64_t)WS_MAX) out.push_back(plan);
            else if (plan) cudnnBackendDestroyDescriptor(plan);
        }
    }
    for (int i = 0; i < MAX_CFG; i++) cudnnBackendDestroyDescriptor(cfg[i]);
    cudnnBackendDestroyDescriptor(heur);
    cudaGetLastError();
}

// The legacy API's choices of one pass: among perf's n results, deterministic
// ones whose workspace (need(algo), under the result's math type) fits
// WS_MAX, the first (heuristics: ranked) or the fastest (cudnnFind: timed);
// -1 if none, else the algorithm, its math type into *m.
template <typename Perf, typename Need>
static int pick(const Perf *p, int n, bool fastest, cudnnConvolutionDescriptor_t cd, Need need,
                cudnnMathType_t *m) {
    int best = -1;
    for (int j = 0; j < n && !(best >= 0 && !fastest); j++) {
        if (p[j].status || p[j].determinism != CUDNN_DETERMINISTIC) continue;
        cudnnSetConvolutionMathType(cd, p[j].mathType);
        if (need(p[j].algo) > WS_MAX || (best >= 0 && p[j].time >= p[best].time)) continue;
        best = j;
    }
    if (best < 0) return -1;
    *m = p[best].mathType;
    return p[best].algo;
}

typedef struct {
    float heur, find, g1, gbest;
    int heur_algo, find_algo;
    double diff_find, diff_g;
} result;

int main(int argc, char **argv) {
    int B = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc) g_calls = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: conv_bwd_bench [--batch N] [--calls N]\n");
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "conv_bwd_bench: no GPU\n");
        return 1;
    }
    cudnnHandle_t h;
    DK(cudnnCreate(&h));
    CK(cudaEventCreate(&g_e0));
    CK(cudaEventCreate(&g_e1));
    size_t maxx = 0, maxw = 0, maxy = 0;
    for (int i = 0; i < NSHAPES; i++) {
        const shape *s = &k_shapes[i];
        size_t ho = (s->hw + 2 * (s->k / 2) - s->k) / s->stride + 1;
        maxx = std::max(maxx, (size_t)B * s->hw * s->hw * s->ci);
        maxy = std::max(maxy, (size_t)B * ho * ho * s->co);
        maxw = std::max(maxw, (size_t)s->co * s->k * s->k * s->ci);
    }
    __nv_bfloat16 *x, *dx, *dx2, *w, *dw, *dw2, *dy;
    void *wsp;
    CK(cudaMalloc(&x, maxx * 2)); CK(cudaMalloc(&dx, maxx * 2)); CK(cudaMalloc(&dx2, maxx * 2));
    CK(cudaMalloc(&w, maxw * 2)); CK(cudaMalloc(&dw, maxw * 2)); CK(cudaMalloc(&dw2, maxw * 2));
    CK(cudaMalloc(&dy, maxy * 2)); CK(cudaMalloc(&wsp, WS_MAX));
    fill<<<1024, 256>>>(x, maxx, 1, 1.0f), fill<<<1024, 256>>>(w, maxw, 2, 0.05f), fill<<<1024, 256>>>(dy, maxy, 3, 1.0f);
    CK(cudaGetLastError());
    double tot[2][4] = {{0}};
    printf("%-22s %5s | %-38s | %-38s\n", "shape (hw ci co k s)", "count", "data: heur find g1 gbest (us)",
           "filter: heur find g1 gbest (us)");
    for (int i = 0; i < NSHAPES; i++) {
        const shape *s = &k_shapes[i];
        const int pad = s->k / 2, ho = (s->hw + 2 * pad - s->k) / s->stride + 1;
        const size_t nx = (size_t)B * s->hw * s->hw * s->ci, nw = (size_t)s->co * s->k * s->k * s->ci;
        cudnnTensorDescriptor_t xd, yd;
        cudnnFilterDescriptor_t wd;
        cudnnConvolutionDescriptor_t cd;
        DK(cudnnCreateTensorDescriptor(&xd)); DK(cudnnCreateTensorDescriptor(&yd));
        DK(cudnnCreateFilterDescriptor(&wd)); DK(cudnnCreateConvolutionDescriptor(&cd));
        DK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, B, s->ci, s->hw, s->hw));
        DK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, B, s->co, ho, ho));
        DK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC, s->co, s->ci, s->k, s->k));
        DK(cudnnSetConvolution2dDescriptor(cd, pad, pad, s->stride, s->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT));
        DK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
        const float one = 1.0f, zero = 0.0f;
        result r[2];
        for (int pass = 0; pass < 2; pass++) {  // 0 data, 1 filter
            const bool data = pass == 0;
            result *q = &r[pass];
            memset(q, 0, sizeof *q);
            q->heur_algo = q->find_algo = -1;
            __nv_bfloat16 *out = data ? dx : dw, *out2 = data ? dx2 : dw2;
            const size_t nout = data ? nx : nw;
            // the legacy calls: the pass with algorithm a (math type set) into o
            auto run = [&](int a, void *o) {
                if (data)
                    DK(cudnnConvolutionBackwardData(h, &one, wd, w, yd, dy, cd, (cudnnConvolutionBwdDataAlgo_t)a, wsp,
                                                    WS_MAX, &zero, xd, o));
                else
                    DK(cudnnConvolutionBackwardFilter(h, &one, xd, x, yd, dy, cd, (cudnnConvolutionBwdFilterAlgo_t)a,
                                                      wsp, WS_MAX, &zero, wd, o));
            };
            auto need_data = [&](cudnnConvolutionBwdDataAlgo_t a) {
                size_t b = SIZE_MAX;
                return cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, a, &b) ? SIZE_MAX : b;
            };
            auto need_filter = [&](cudnnConvolutionBwdFilterAlgo_t a) {
                size_t b = SIZE_MAX;
                return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, a, &b) ? SIZE_MAX : b;
            };
            // the engine's choice (the heuristics' first deterministic one within the limit), and the
            // fastest deterministic one timed by cudnnFind
            int n = 0;
            cudnnMathType_t hm = CUDNN_TENSOR_OP_MATH, fm = CUDNN_TENSOR_OP_MATH;
            if (data) {
                cudnnConvolutionBwdDataAlgoPerf_t p[16];
                DK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wd, yd, cd, xd, 16, &n, p));
                q->heur_algo = pick(p, n, false, cd, need_data, &hm);
                DK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
                DK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, wd, w, yd, dy, cd, xd, out2, 16, &n, p, wsp,
                                                               WS_MAX));
                q->find_algo = pick(p, n, true, cd, need_data, &fm);
            } else {
                cudnnConvolutionBwdFilterAlgoPerf_t p[16];
                DK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, xd, yd, cd, wd, 16, &n, p));
                q->heur_algo = pick(p, n, false, cd, need_filter, &hm);
                DK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
                DK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, xd, x, yd, dy, cd, wd, out2, 16, &n, p, wsp,
                                                                 WS_MAX));
                q->find_algo = pick(p, n, true, cd, need_filter, &fm);
            }
            if (q->heur_algo < 0) {
                fprintf(stderr, "shape %d: no heuristic %s algorithm\n", i, data ? "data" : "filter");
                return 1;
            }
            DK(cudnnSetConvolutionMathType(cd, hm));
            q->heur = time_us([&] { run(q->heur_algo, out); });
            if (q->find_algo >= 0) {
                DK(cudnnSetConvolutionMathType(cd, fm));
                q->find = time_us([&] { run(q->find_algo, out2); });
                q->diff_find = rel_diff(out2, out, nout);
            }
            // the graph API's deterministic configurations
            dc_dnn_graph *g = (dc_dnn_graph *)calloc(1, sizeof *g);
            g->next_uid = 100;
            cudnnBackendDescriptor_t graph = bwd_graph(g, h, s, B, data);
            std::vector<cudnnBackendDescriptor_t> plans;
            if (g->st == CUDNN_STATUS_SUCCESS) {
                graph_plans(h, graph, CUDNN_HEUR_MODE_A, plans);
                graph_plans(h, graph, CUDNN_HEUR_MODE_B, plans);
            } else fprintf(stderr, "shape %d %s: graph failed at line %d: %s\n", i, data ? "data" : "filter", g->line,
                         cudnnGetErrorString(g->st));
            q->gbest = 0;
            for (size_t j = 0; j < plans.size(); j++) {
                const int64_t uids[3] = {UID_X, UID_W, UID_Y};
                void *const ptr[3] = {data ? (void *)out2 : (void *)x, data ? (void *)w : (void *)out2, (void *)dy};
                float t = time_us([&] { DK(dc_dnn_execute(h, plans[j], 3, uids, ptr, wsp)); });
                if (j == 0) q->g1 = t;
                if (q->gbest == 0 || t < q->gbest) {
                    q->gbest = t;
                    q->diff_g = rel_diff(out2, out, nout);
                }
            }
            for (auto p : plans) cudnnBackendDestroyDescriptor(p);
            dc_dnn_graph_free(g);
            cudaGetLastError();
            double *t = tot[pass];
            t[0] += s->count * q->heur, t[1] += s->count * (q->find_algo >= 0 ? fminf(q->find, q->heur) : q->heur);
            t[2] += s->count * (q->g1 > 0 ? q->g1 : q->heur), t[3] += s->count * (q->gbest > 0 ? q->gbest : q->heur);
        }
        char name[64];
        snprintf(name, sizeof name, "%d %d %d %d %d", s->hw, s->ci, s->co, s->k, s->stride);
        printf("%-22s %5d | a%d %6.1f a%d %6.1f %6.1f %6.1f (%.0e %.0e) | a%d %6.1f a%d %6.1f %6.1f %6.1f (%.0e %.0e)\n",
               name, s->count, r[0].heur_algo, r[0].heur, r[0].find_algo, r[0].find, r[0].g1, r[0].gbest,
               r[0].diff_find, r[0].diff_g, r[1].heur_algo, r[1].heur, r[1].find_algo, r[1].find, r[1].g1, r[1].gbest,
               r[1].diff_find, r[1].diff_g);
        fflush(stdout);
        cudnnDestroyTensorDescriptor(xd), cudnnDestroyTensorDescriptor(yd);
        cudnnDestroyFilterDescriptor(wd), cudnnDestroyConvolutionDescriptor(cd);
    }
    printf("\nstep totals, ms (each shape x its count): heur / best of find / graph first / graph best\n");
    printf("data:   %.2f / %.2f / %.2f / %.2f\n", tot[0][0] / 1000, tot[0][1] / 1000, tot[0][2] / 1000,
           tot[0][3] / 1000);
    printf("filter: %.2f / %.2f / %.2f / %.2f\n", tot[1][0] / 1000, tot[1][1] / 1000, tot[1][2] / 1000,
           tot[1][3] / 1000);
    return 0;
}
