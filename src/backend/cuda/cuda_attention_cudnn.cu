// cuDNN's fused flash attention (bf16, forward and backward) for the
// attention op: on Hopper its kernels use the wgmma instructions our own
// kernels do not; in diffusers' profile on an H100 it ran SD 1.5's attention
// in half the time our kernels take.
//
// cuDNN offers it as an operation graph (its graph API: cuda_dnn_graph.h)
// that its runtime fusion engine recognises as one kernel. Forward:
//
//   S = Q K^T * scale            (matmul, pointwise multiply by a scalar)
//   M = max_j S,  E = exp(S - M),  Z = sum_j E
//   lse = M + log Z              (the op's lse output)
//   O = (E / Z) V                (the probabilities in bf16, then matmul)
//
// Backward, from the forward's lse (the graph cuDNN's frontend builds):
//
//   D = sum_d dO * O             (a row's sum, kept in the workspace)
//   P = exp(Q K^T * scale - lse)
//   dV = P^T dO                  (P in bf16)
//   dS = P * (dO V^T - D) * scale
//   dK = dS^T Q,  dQ = dS K      (dS in bf16)
//
// dQ is written by its product directly, which makes cuDNN run its
// deterministic kernel (the scores' gradients staged in its workspace; the
// frontend's other form, dQ summed in fp32 with atomics, measured no faster
// on DiT-XL/2). opts.cudnn_attention_bwd off keeps the backward on our kernels.
//
// Q, K, V and O keep the op's layouts: the graph's tensors take their strides
// (K as K^T by swapping its last two strides). A plan is built the first time
// a shape runs (host work, with cuDNN compiling its kernels): each engine
// configuration its heuristics offer (up to SDPA_CANDIDATES) runs on the
// call's own tensors, timed, and a clearly faster one replaces the first
// (see choose). The plans get a workspace of their own, which cuDNN's
// fastest kernels need: for DiT-XL/2's heads of 72 the forward ran an sm80
// kernel at 163 us a call within no workspace, and runs an sm90 one at
// 89 us. A shape cuDNN declines is remembered and runs on our own kernels,
// as does every call the graph does not cover (fp32, causal, Dh != Dv,
// unaligned layouts).
//
// On by default (docs/PERFORMANCE.md: SD 1.5's UNet step 41.7 -> 34.7 ms at
// 16 rows on an H100). opts.cudnn_attention off turns it off, for comparing
// with our kernels; with opts.profile, stderr tells which shapes got a plan,
// the time of each plan offered, and which shapes cuDNN declined.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_dnn_graph.h"
#include "backend/cuda/cuda_ops.h"
#include "core/log.h"

// What a plan is for: the whole call but its pointers.
typedef struct {
    int B, H, Tq, Tk, Dh;
    float scale;
    dc_attn_layout q, k, v, out;
    int bwd;  // 0 forward, 1 backward
} sdpa_key;

enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_LSE, UID_SCALE,
    UID_DO, UID_DQ, UID_DK, UID_DV, UID_ONE, UID_DSUM,
    UID_VIRTUAL = 100
};

// The largest cuDNN workspace a plan may ask for (the backward's
// deterministic kernel keeps the scores' gradients there: 2 bytes a score).
#define SDPA_WS_MAX ((int64_t)1 << 30)
// Engine configurations tried for a new shape.
#define SDPA_CANDIDATES 8

struct dc_sdpa_plan {
    sdpa_key key;
    cudnnBackendDescriptor_t plan;  // NULL: cuDNN declined the shape
    int64_t ws;                     // cuDNN's workspace bytes
    dc_dnn_graph *g;                // the graph's descriptors
    // until the first call has timed them: the plans to choose from
    cudnnBackendDescriptor_t cand[SDPA_CANDIDATES];
    int64_t cand_ws[SDPA_CANDIDATES];
    int ncand;
};

static const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
static const int64_t one[4] = {1, 1, 1, 1};

// What both graphs share: the shapes and strides of Q (O takes Q's shape),
// K^T, O, the scores and the rows' statistics, and the tensors Q, K^T, O,
// lse and the scale.
typedef struct {
    int64_t qd[4], qs[4], ktd[4], kts[4], os[4], sd[4], ss[4], rd[4], rs[4];
    cudnnBackendDescriptor_t q, kt, o, lse, scale;
} sdpa_common;

static sdpa_common common_of(dc_dnn_graph *g, const sdpa_key *s) {
    const int64_t B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->Dh;
    sdpa_common c = {
        {B, H, Tq, D},       {s->q.batch, s->q.head, s->q.token, 1},  // Q
        {B, H, D, Tk},       {s->k.batch, s->k.head, 1, s->k.token},  // K^T
        {s->out.batch, s->out.head, s->out.token, 1},                 // O
        {B, H, Tq, Tk},      {H * Tq * Tk, Tq * Tk, Tk, 1},            // scores
        {B, H, Tq, 1},       {H * Tq, Tq, 1, 1},                       // rows
        NULL, NULL, NULL, NULL, NULL,                                 // the tensors, below
    };
    c.q = dc_dnn_tensor(g, UID_Q, bf, c.qd, c.qs, false);
    c.kt = dc_dnn_tensor(g, UID_K, bf, c.ktd, c.kts, false);
    c.o = dc_dnn_tensor(g, UID_O, bf, c.qd, c.os, false);
    c.lse = dc_dnn_tensor(g, UID_LSE, f32, c.rd, c.rs, false);
    c.scale = dc_dnn_tensor(g, UID_SCALE, f32, one, one, true);
    return c;
}

// The forward graph of one attention shape (see the top of the file).
static cudnnBackendDescriptor_t fwd_graph(dc_dnn_graph *g, cudnnHandle_t dnn, const sdpa_key *s) {
    const sdpa_common c = common_of(g, s);
    const int64_t *sd = c.sd, *ss = c.ss, *rd = c.rd, *rs = c.rs;
    const int64_t vd[4] = {s->B, s->H, s->Tk, s->Dh}, vs[4] = {s->v.batch, s->v.head, s->v.token, 1};
    cudnnBackendDescriptor_t q = c.q, kt = c.kt, o = c.o, lse = c.lse, scale = c.scale;
    cudnnBackendDescriptor_t v = dc_dnn_tensor(g, UID_V, bf, vd, vs, false);
    // the virtual intermediates: scores, their maximum, exponentials, sums, probabilities
    cudnnBackendDescriptor_t s0 = dc_dnn_tensor(g, 0, f32, sd, ss, false), s1 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t mx = dc_dnn_tensor(g, 0, f32, rd, rs, false), s2 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t e = dc_dnn_tensor(g, 0, f32, sd, ss, false), z = dc_dnn_tensor(g, 0, f32, rd, rs, false);
    cudnnBackendDescriptor_t lz = dc_dnn_tensor(g, 0, f32, rd, rs, false), p = dc_dnn_tensor(g, 0, bf, sd, ss, false);
    cudnnBackendDescriptor_t ops[10] = {
        dc_dnn_matmul(g, q, kt, s0),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, s0, scale, s1),
        dc_dnn_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s1, mx),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_SUB, s1, mx, s2),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_EXP, s2, NULL, e),
        dc_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_LOG, z, NULL, lz),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_ADD, mx, lz, lse),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_DIV, e, z, p),
        dc_dnn_matmul(g, p, v, o),
    };
    return dc_dnn_op_graph(g, dnn, ops, 10);
}

// The backward graph of one attention shape (see the top of the file), op
// for op as cuDNN's frontend builds it, which is the form its fusion engine
// recognises. dq, dk, dv share the layouts of q, k, v; dout that of out.
static cudnnBackendDescriptor_t bwd_graph(dc_dnn_graph *g, cudnnHandle_t dnn, const sdpa_key *s) {
    const int64_t B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->Dh;
    const sdpa_common c = common_of(g, s);
    const int64_t *qd = c.qd, *qs = c.qs, *sd = c.sd, *ss = c.ss, *rd = c.rd, *rs = c.rs;
    const int64_t kd[4] = {B, H, Tk, D}, ks[4] = {s->k.batch, s->k.head, s->k.token, 1};
    const int64_t vs[4] = {s->v.batch, s->v.head, s->v.token, 1}, vts[4] = {s->v.batch, s->v.head, 1, s->v.token};
    const int64_t std_[4] = {B, H, Tk, Tq}, sts[4] = {H * Tq * Tk, Tq * Tk, 1, Tk};  // scores transposed
    const int64_t pd[4] = {B, H, Tq, D}, ps[4] = {H * Tq * D, Tq * D, H * D, 1};     // dO * O
    cudnnBackendDescriptor_t q = c.q, kt = c.kt, o = c.o, lse = c.lse, scale = c.scale;
    cudnnBackendDescriptor_t vt = dc_dnn_tensor(g, UID_V, bf, c.ktd, vts, false);
    cudnnBackendDescriptor_t dout = dc_dnn_tensor(g, UID_DO, bf, qd, c.os, false);
    cudnnBackendDescriptor_t unit = dc_dnn_tensor(g, UID_ONE, f32, one, one, true);
    cudnnBackendDescriptor_t dq = dc_dnn_tensor(g, UID_DQ, bf, qd, qs, false);
    cudnnBackendDescriptor_t dk = dc_dnn_tensor(g, UID_DK, bf, kd, ks, false);
    cudnnBackendDescriptor_t dv = dc_dnn_tensor(g, UID_DV, bf, kd, vs, false);
    cudnnBackendDescriptor_t dsum = dc_dnn_tensor(g, UID_DSUM, f32, rd, rs, false);
    // the virtual intermediates
    cudnnBackendDescriptor_t prod = dc_dnn_tensor(g, 0, f32, pd, ps, false);
    cudnnBackendDescriptor_t red = dc_dnn_tensor(g, 0, f32, rd, rs, false);
    cudnnBackendDescriptor_t s0 = dc_dnn_tensor(g, 0, f32, sd, ss, false), s1 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t s2 = dc_dnn_tensor(g, 0, f32, sd, ss, false), e = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t pt = dc_dnn_tensor(g, 0, bf, std_, sts, false);
    cudnnBackendDescriptor_t dp = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t dp1 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t dp2 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t ds = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t dst = dc_dnn_tensor(g, 0, bf, std_, sts, false);
    cudnnBackendDescriptor_t k = dc_dnn_tensor(g, 0, bf, kd, ks, false);
    cudnnBackendDescriptor_t ops[17] = {
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, dout, o, prod),
        dc_dnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, prod, red),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, red, unit, dsum),
        dc_dnn_matmul(g, q, kt, s0),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, s0, scale, s1),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_SUB, s1, lse, s2),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_EXP, s2, NULL, e),
        dc_dnn_reshape(g, e, pt),
        dc_dnn_matmul(g, pt, dout, dv),
        dc_dnn_matmul(g, dout, vt, dp),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_SUB, dp, dsum, dp1),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, dp1, e, dp2),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, dp2, scale, ds),
        dc_dnn_reshape(g, ds, dst),
        dc_dnn_matmul(g, dst, q, dk),
        dc_dnn_reshape(g, kt, k),
        dc_dnn_matmul(g, ds, k, dq),
    };
    return dc_dnn_op_graph(g, dnn, ops, 17);
}

// The scratch (c->sdpa_ws): the backward's row sums D, then cuDNN's
// workspace from a 256-byte boundary.
static int64_t rows_bytes(const sdpa_key *k) {
    return k->bwd ? ((int64_t)k->B * k->H * k->Tq * 4 + 255) / 256 * 256 : 0;
}

// Whether the graph covers this call: bf16, no mask, one head size, every
// layout in 16-byte steps and the n tensors on 16-byte boundaries (cuDNN's
// alignment), and head sizes cuDNN's flash kernels take.
static bool graph_covers(const dc_attn_shape *s, const void *const *ptr, int n) {
    if (s->causal || s->Dh != s->Dv || s->Dh % 8 || s->Dh > 256) return false;
    const dc_attn_layout l[4] = {s->q, s->k, s->v, s->out};
    for (int i = 0; i < 4; i++)
        if (l[i].batch % 8 || l[i].token % 8 || l[i].head % 8) return false;
    for (int i = 0; i < n; i++)
        if (!dc_aligned(ptr[i], 16)) return false;
    return true;
}

static dc_sdpa_plan *plan_get(dc_backend *be, const sdpa_key *key, bool report) {
    dc_cuda_ctx *c = dc_cuda(be);
    for (int i = 0; i < c->nsdpa; i++)
        if (!memcmp(&c->sdpa[i].key, key, sizeof *key)) return &c->sdpa[i];
    // Building a plan may load or compile kernels, which a stream being
    // captured into a CUDA graph does not allow: such a call runs on our
    // kernels, and the shape gets its plan the next time it runs uncaptured.
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) return NULL;
    if (c->nsdpa == c->cap_sdpa) {
        int cap = c->cap_sdpa ? 2 * c->cap_sdpa : 16;
        dc_sdpa_plan *grown = (dc_sdpa_plan *)realloc(c->sdpa, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        c->sdpa = grown, c->cap_sdpa = cap;
    }
    dc_sdpa_plan *p = &c->sdpa[c->nsdpa++];
    memset(p, 0, sizeof *p);
    p->key = *key;
    dc_dnn_graph *g = (dc_dnn_graph *)calloc(1, sizeof *g);
    if (!g || dc_cuda_dnn_start(c) != 0) return free(g), p;  // no cuDNN: the plan stays empty
    g->next_uid = UID_VIRTUAL;
    cudnnBackendDescriptor_t graph = key->bwd ? bwd_graph(g, c->dnn, key) : fwd_graph(g, c->dnn, key);
    if (g->st == CUDNN_STATUS_SUCCESS)
        p->ncand = dc_dnn_plans(g, c->dnn, graph, SDPA_WS_MAX, key->bwd, p->cand, p->cand_ws, SDPA_CANDIDATES);
    int64_t most = 0;
    for (int i = 0; i < p->ncand; i++) most = p->cand_ws[i] > most ? p->cand_ws[i] : most;
    if (p->ncand && dc_cuda_grow(c, &c->sdpa_ws, &c->sdpa_ws_bytes, (size_t)(rows_bytes(key) + most),
                                 "cuDNN's attention workspace")) {
        if (report) dc_log("%s", dc_error());
        for (int i = 0; i < p->ncand; i++) cudnnBackendDestroyDescriptor(p->cand[i]);
        p->ncand = 0;
    }
    if (p->ncand) p->g = g, p->plan = p->cand[0], p->ws = p->cand_ws[0];
    const char *what = key->bwd ? "backward" : "forward";
    if (report && p->plan)
        dc_log("cuDNN attention %s B %d H %d Tq %d Tk %d Dh %d: %d plans", what, key->B, key->H, key->Tq, key->Tk,
               key->Dh, p->ncand);
    if (report && !p->plan)
        dc_log("cuDNN attention %s B %d H %d Tq %d Tk %d Dh %d: declined (%s at %s:%d)", what, key->B, key->H,
               key->Tq, key->Tk, key->Dh, cudnnGetErrorString(g->st), __FILE__, g->line);
    if (!p->plan) dc_dnn_graph_free(g);
    cudaGetLastError();  // a declined build leaves no error behind for the ops after it
    return p;
}

static sdpa_key key_of(const AttnParams *ap, const dc_attn_shape *s, int bwd) {
    sdpa_key key;
    memset(&key, 0, sizeof key);  // the padding too: keys compare with memcmp
    key.B = s->B, key.H = s->H, key.Tq = s->Tq, key.Tk = s->Tk, key.Dh = s->Dh, key.scale = ap->scale;
    key.q = s->q, key.k = s->k, key.v = s->v, key.out = s->out;
    key.bwd = bwd;
    return key;
}

static void run(dc_backend *be, cudnnBackendDescriptor_t plan, int n, const int64_t *uids, void *const *data,
                void *ws) {
    cudnnStatus_t st = dc_dnn_execute(dc_cuda(be)->dnn, plan, n, uids, data, ws);
    if (st) {
        cudaGetLastError();
        dc_cuda_record(be, __func__, __FILE__, __LINE__, "cuDNN error: %s, from cudnnBackendExecute (attention)",
                       cudnnGetErrorString(st));
    }
}

// Keeps the stream busy for about `cycles` GPU clocks, so that the runs
// queued behind it start back to back: their timing is then the GPU's alone,
// not the host's time to launch them (which exceeds a small shape's kernel).
__global__ void k_hold(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// The first call of a shape with several plans: each runs on the call's
// tensors (once to load its kernel, then timed over three runs queued behind
// k_hold). The heuristics' first plan is kept unless another is faster by
// more than a tenth, then the fastest: a near tie does not flip between runs
// (and with it the last bits of the results). The outputs are written again
// by the call afterwards.
static void choose(dc_backend *be, dc_sdpa_plan *p, int n, const int64_t *uids, void *const *data, void *ws,
                   bool report) {
    dc_cuda_ctx *c = dc_cuda(be);
    cudaEvent_t ev[2] = {NULL, NULL};
    const bool timing = p->ncand > 1 && cudaEventCreate(&ev[0]) == cudaSuccess &&
                        cudaEventCreate(&ev[1]) == cudaSuccess;
    cudaGetLastError();
    int best = 0;
    float best_ms = -1, first_ms = -1;
    for (int i = 0; timing && i < p->ncand && !c->failed; i++) {
        float ms = -1;
        bool warm = dc_dnn_execute(c->dnn, p->cand[i], n, uids, data, ws) == CUDNN_STATUS_SUCCESS;
        if (warm) k_hold<<<1, 1, 0, c->stream>>>(400000);  // about 0.2 ms: longer than 3 launches
        if (warm && cudaEventRecord(ev[0], c->stream) == cudaSuccess) {
            bool ok = true;
            for (int r = 0; r < 3 && ok; r++) ok = dc_dnn_execute(c->dnn, p->cand[i], n, uids, data, ws) == 0;
            if (ok && cudaEventRecord(ev[1], c->stream) == cudaSuccess && cudaEventSynchronize(ev[1]) == cudaSuccess)
                cudaEventElapsedTime(&ms, ev[0], ev[1]);
        }
        cudaGetLastError();  // a plan that fails to run is not chosen
        if (report) dc_log("  plan %d: %.1f us a call%s", i, ms >= 0 ? ms * 1000 / 3 : 0.0, ms < 0 ? " (failed)" : "");
        if (i == 0) first_ms = ms;
        const bool clear = first_ms < 0 || ms < 0.9f * first_ms;  // plan 0 failed, or a clear gain
        if (ms >= 0 && (best_ms < 0 || (clear && ms < best_ms))) best = i, best_ms = ms;
    }
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    for (int i = 0; i < p->ncand; i++)
        if (i != best) cudnnBackendDestroyDescriptor(p->cand[i]);
    p->plan = p->cand[best], p->ws = p->cand_ws[best], p->ncand = 0;
}

bool dc_cuda_attention_cudnn_fwd(dc_backend *be, const AttnParams *ap, const dc_attn_shape *s) {
    const bool report = be->opts.profile;
    const void *ptr[4] = {ap->q, ap->k, ap->v, ap->out};
    if (!be->opts.cudnn_attention || !graph_covers(s, ptr, 4)) return false;
    const sdpa_key key = key_of(ap, s, 0);
    dc_sdpa_plan *p = plan_get(be, &key, report);
    if (!p || !p->plan) return false;
    float scale = ap->scale;
    const int64_t uids[6] = {UID_Q, UID_K, UID_V, UID_O, UID_LSE, UID_SCALE};
    void *data[6] = {(void *)ap->q, (void *)ap->k, (void *)ap->v, ap->out, ap->lse, &scale};
    void *ws = dc_cuda(be)->sdpa_ws;
    if (p->ncand) choose(be, p, 6, uids, data, ws, report);
    run(be, p->plan, 6, uids, data, p->ws ? ws : NULL);
    return true;
}

// The backward's plan for the longest slice of the batch that cuDNN takes:
// the deterministic kernel keeps 2 bytes a score in its workspace, so a call
// whose workspace would pass SDPA_WS_MAX (SD 2.1's self-attention over 4096
// tokens at batch 16: 2.7 GB) runs as consecutive slices of its samples,
// each the same plan. NULL, or *slice 0: run on our kernels.
static dc_sdpa_plan *bwd_plan(dc_backend *be, sdpa_key *key, int *slice, bool report) {
    const int B = key->B;
    for (int n = B; n >= 1; n--) {
        if (B % n) continue;
        key->B = n;
        dc_sdpa_plan *p = plan_get(be, key, report);
        if (!p) return NULL;
        if (p->plan) return *slice = n, p;
    }
    return NULL;
}

bool dc_cuda_attention_cudnn_bwd(dc_backend *be, const AttnParams *ap, const dc_attn_shape *s) {
    const bool report = be->opts.profile;
    const void *ptr[8] = {ap->q, ap->k, ap->v, ap->o, ap->dq, ap->dk, ap->dv, ap->dout};
    if (!be->opts.cudnn_attention || !be->opts.cudnn_attention_bwd || !graph_covers(s, ptr, 8)) return false;
    sdpa_key key = key_of(ap, s, 1);
    int n = 0;
    dc_sdpa_plan *p = bwd_plan(be, &key, &n, report);
    if (!p) return false;
    char *rows = (char *)dc_cuda(be)->sdpa_ws, *ws = rows + rows_bytes(&key);
    float scale = ap->scale, unit = 1.0f;
    const int64_t uids[12] = {UID_Q,   UID_K,  UID_V,  UID_O,  UID_DO,  UID_LSE,
                              UID_SCALE, UID_ONE, UID_DQ, UID_DK, UID_DV, UID_DSUM};
    typedef __nv_bfloat16 bf16;
    for (int b = 0; b < s->B; b += n) {
        const int64_t q = b * s->q.batch, k = b * s->k.batch, v = b * s->v.batch, o = b * s->out.batch;
        void *data[12] = {(bf16 *)ap->q + q, (bf16 *)ap->k + k,  (bf16 *)ap->v + v,  (bf16 *)ap->o + o,
                          (bf16 *)ap->dout + o, ap->lse + (int64_t)b * s->H * s->Tq, &scale, &unit,
                          (bf16 *)ap->dq + q, (bf16 *)ap->dk + k, (bf16 *)ap->dv + v, rows};
        if (p->ncand) choose(be, p, 12, uids, data, ws, report);
        run(be, p->plan, 12, uids, data, p->ws ? ws : NULL);
    }
    return true;
}

extern "C" void dc_cuda_attention_cudnn_free(dc_cuda_ctx *c) {
    for (int i = 0; i < c->nsdpa; i++) {
        dc_sdpa_plan *p = &c->sdpa[i];
        if (p->ncand)
            for (int j = 0; j < p->ncand; j++) cudnnBackendDestroyDescriptor(p->cand[j]);
        else if (p->plan)
            cudnnBackendDestroyDescriptor(p->plan);
        dc_dnn_graph_free(p->g);
    }
    free(c->sdpa);
    c->sdpa = NULL, c->nsdpa = c->cap_sdpa = 0;
    if (c->sdpa_ws) cudaFree(c->sdpa_ws);
    c->sdpa_ws = NULL, c->sdpa_ws_bytes = 0;
}
