// cuDNN's fused flash attention (forward, bf16) for the attention op: on
// Hopper its kernels use the wgmma instructions our own kernels do not; in
// diffusers' profile on an H100 it ran SD 1.5's attention in half the time
// our kernels take.
//
// cuDNN offers it as an operation graph (its graph API: cuda_dnn_graph.h)
// that its runtime fusion engine recognises as one kernel:
//
//   S = Q K^T * scale            (matmul, pointwise multiply by a scalar)
//   M = max_j S,  E = exp(S - M),  Z = sum_j E
//   lse = M + log Z              (the op's lse output)
//   O = (E / Z) V                (the probabilities in bf16, then matmul)
//
// Q, K, V and O keep the op's layouts: the graph's tensors take their strides
// (K as K^T by swapping its last two strides). A plan is built the first time
// a shape runs (host work, with cuDNN compiling its kernel) and kept; a shape
// cuDNN declines is remembered and runs on our own kernels, as does every
// call the graph does not cover (fp32, causal, Dh != Dv, unaligned layouts).
//
// On by default (docs/PERFORMANCE.md: SD 1.5's UNet step 41.7 -> 34.7 ms at
// 16 rows on an H100). DC_CUDNN_ATTENTION=0 turns it off, for comparing with
// our kernels; DC_CUDNN_ATTENTION=1 reports on stderr which shapes got a
// plan and which cuDNN declined.
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
} sdpa_key;

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_LSE, UID_SCALE, UID_VIRTUAL = 100 };

struct dc_sdpa_plan {
    sdpa_key key;
    cudnnBackendDescriptor_t plan;  // NULL: cuDNN declined the shape
    int64_t ws;                     // workspace bytes it needs
    dc_dnn_graph *g;                // the graph's descriptors
};

static cudnnBackendDescriptor_t matmul(dc_dnn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                       cudnnBackendDescriptor_t c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = DNN_G_MAKE(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    DNN_G_SET(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    DNN_G_FINISH(g, m);
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    DNN_G_FINISH(g, op);
    return op;
}

// y = x (mode) b, or y = mode(x) where b is NULL.
static cudnnBackendDescriptor_t reduction(dc_dnn_graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = DNN_G_MAKE(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    DNN_G_SET(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    DNN_G_SET(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    DNN_G_FINISH(g, r);
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    DNN_G_FINISH(g, op);
    return op;
}

// The operation graph of one attention shape (see the top of the file).
static cudnnBackendDescriptor_t op_graph(dc_dnn_graph *g, cudnnHandle_t dnn, const sdpa_key *s) {
    const int64_t B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->Dh;
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    const int64_t qd[4] = {B, H, Tq, D}, qs[4] = {s->q.batch, s->q.head, s->q.token, 1};
    const int64_t kd[4] = {B, H, D, Tk}, ks[4] = {s->k.batch, s->k.head, 1, s->k.token};
    const int64_t vd[4] = {B, H, Tk, D}, vs[4] = {s->v.batch, s->v.head, s->v.token, 1};
    const int64_t os[4] = {s->out.batch, s->out.head, s->out.token, 1};
    const int64_t sd[4] = {B, H, Tq, Tk}, ss[4] = {H * Tq * Tk, Tq * Tk, Tk, 1};
    const int64_t rd[4] = {B, H, Tq, 1}, rs[4] = {H * Tq, Tq, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1};
    cudnnBackendDescriptor_t q = dc_dnn_tensor(g, UID_Q, bf, qd, qs, false);
    cudnnBackendDescriptor_t kt = dc_dnn_tensor(g, UID_K, bf, kd, ks, false);
    cudnnBackendDescriptor_t v = dc_dnn_tensor(g, UID_V, bf, vd, vs, false);
    cudnnBackendDescriptor_t o = dc_dnn_tensor(g, UID_O, bf, qd, os, false);
    cudnnBackendDescriptor_t lse = dc_dnn_tensor(g, UID_LSE, f32, rd, rs, false);
    cudnnBackendDescriptor_t scale = dc_dnn_tensor(g, UID_SCALE, f32, one, one, true);
    // the virtual intermediates: scores, their maximum, exponentials, sums, probabilities
    cudnnBackendDescriptor_t s0 = dc_dnn_tensor(g, 0, f32, sd, ss, false), s1 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t mx = dc_dnn_tensor(g, 0, f32, rd, rs, false), s2 = dc_dnn_tensor(g, 0, f32, sd, ss, false);
    cudnnBackendDescriptor_t e = dc_dnn_tensor(g, 0, f32, sd, ss, false), z = dc_dnn_tensor(g, 0, f32, rd, rs, false);
    cudnnBackendDescriptor_t lz = dc_dnn_tensor(g, 0, f32, rd, rs, false), p = dc_dnn_tensor(g, 0, bf, sd, ss, false);
    cudnnBackendDescriptor_t ops[10] = {
        matmul(g, q, kt, s0),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_MUL, s0, scale, s1),
        reduction(g, CUDNN_REDUCE_TENSOR_MAX, s1, mx),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_SUB, s1, mx, s2),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_EXP, s2, NULL, e),
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_LOG, z, NULL, lz),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_ADD, mx, lz, lse),
        dc_dnn_pointwise(g, CUDNN_POINTWISE_DIV, e, z, p),
        matmul(g, p, v, o),
    };
    return dc_dnn_op_graph(g, dnn, ops, 10);
}

// DC_CUDNN_ATTENTION: 0 off; unset or anything else on, 1 also reporting.
static int env_mode(void) {
    const char *e = getenv("DC_CUDNN_ATTENTION");
    return !e ? 1 : strcmp(e, "0") == 0 ? 0 : strcmp(e, "1") == 0 ? 2 : 1;
}

// Whether the graph covers this call: bf16, no mask, one head size, every
// layout in 16-byte steps (cuDNN's alignment) and head sizes cuDNN's flash
// kernels take.
static bool graph_covers(const dc_attn_shape *s, const void *const ptr[4]) {
    if (s->causal || s->Dh != s->Dv || s->Dh % 8 || s->Dh > 256) return false;
    const dc_attn_layout l[4] = {s->q, s->k, s->v, s->out};
    for (int i = 0; i < 4; i++)
        if (l[i].batch % 8 || l[i].token % 8 || l[i].head % 8 || !dc_aligned(ptr[i], 16)) return false;
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
    cudnnBackendDescriptor_t graph = op_graph(g, c->dnn, key);
    if (g->st == CUDNN_STATUS_SUCCESS)
        p->plan = dc_dnn_plan(g, c->dnn, graph, (int64_t)c->conv_ws_bytes, false, &p->ws);
    if (p->plan) p->g = g;
    if (report && p->plan)
        dc_log("cuDNN attention B %d H %d Tq %d Tk %d Dh %d: plan (workspace %lld bytes)", key->B, key->H, key->Tq,
               key->Tk, key->Dh, (long long)p->ws);
    if (report && !p->plan)
        dc_log("cuDNN attention B %d H %d Tq %d Tk %d Dh %d: declined (%s at %s:%d)", key->B, key->H, key->Tq,
               key->Tk, key->Dh, cudnnGetErrorString(g->st), __FILE__, g->line);
    if (!p->plan) dc_dnn_graph_free(g);
    cudaGetLastError();  // a declined build leaves no error behind for the ops after it
    return p;
}

bool dc_cuda_attention_cudnn_fwd(dc_backend *be, const AttnParams *ap, const dc_attn_shape *s) {
    static int mode = -1;
    if (mode < 0) mode = env_mode();
    const void *ptr[4] = {ap->q, ap->k, ap->v, ap->out};
    if (!mode || !graph_covers(s, ptr)) return false;
    sdpa_key key;
    memset(&key, 0, sizeof key);  // the padding too: keys compare with memcmp
    key.B = s->B, key.H = s->H, key.Tq = s->Tq, key.Tk = s->Tk, key.Dh = s->Dh, key.scale = ap->scale;
    key.q = s->q, key.k = s->k, key.v = s->v, key.out = s->out;
    dc_sdpa_plan *p = plan_get(be, &key, mode == 2);
    if (!p || !p->plan) return false;
    dc_cuda_ctx *c = dc_cuda(be);
    float scale = ap->scale;
    const int64_t uids[6] = {UID_Q, UID_K, UID_V, UID_O, UID_LSE, UID_SCALE};
    void *data[6] = {(void *)ap->q, (void *)ap->k, (void *)ap->v, ap->out, ap->lse, &scale};
    void *ws = p->ws ? c->conv_ws : NULL;
    cudnnStatus_t st = dc_dnn_execute(c->dnn, p->plan, 6, uids, data, ws);
    if (st) {
        cudaGetLastError();
        dc_cuda_record(be, __func__, __FILE__, __LINE__, "cuDNN error: %s, from cudnnBackendExecute (attention)",
                       cudnnGetErrorString(st));
    }
    return true;
}

extern "C" void dc_cuda_attention_cudnn_free(dc_cuda_ctx *c) {
    for (int i = 0; i < c->nsdpa; i++) {
        if (c->sdpa[i].plan) cudnnBackendDestroyDescriptor(c->sdpa[i].plan);
        dc_dnn_graph_free(c->sdpa[i].g);
    }
    free(c->sdpa);
    c->sdpa = NULL, c->nsdpa = c->cap_sdpa = 0;
}
