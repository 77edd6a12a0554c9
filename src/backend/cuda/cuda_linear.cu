// Matrix products through cuBLASLt: the forward product with its bias fused
// into the epilogue, and the two backward products (input and weight
// gradients, the latter accumulated in fp32 onto the fp32 gradient buffer).
//
// Row-major X[M,K] is column-major X^T, so every row-major product is issued
// as its transpose: out^T = w op(inp^T) and so on (comments give each one).
// cuBLASLt picks an algorithm per shape; the choice and the descriptors are
// cached, so a step pays the heuristic once per distinct product.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

struct dc_gemm_plan {
    // key
    int m, n, k, lda, ldb, ldd, ta, tb, epi, align;  // epi: a cublasLtEpilogue_t, 0 for none
    dc_dtype ab, d;
    int batch;               // products a call (0 or 1: one), their operands sa, sb, sd elements apart
    int64_t sa, sb, sd;
    // value (ok false: cuBLASLt has no algorithm for this fused product; remembered
    // so the heuristic is not asked again)
    bool ok;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

static cudaDataType_t cuda_type(dc_dtype t) {
    return t == DC_BF16 ? CUDA_R_16BF : t == DC_F16 ? CUDA_R_16F : CUDA_R_32F;
}

// A cuBLASLt call: a failure is recorded like a CUDA error (cuda_ops.h) and
// the calling function returns `ret`.
#define LT_OR(ret, call)                                                                                 \
    do {                                                                                                 \
        cublasStatus_t s_ = (call);                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                               \
            cudaGetLastError();                                                                          \
            dc_cuda_record(be, __func__, __FILE__, __LINE__, "cuBLASLt error: %s, from %s",              \
                           cublasLtGetStatusString(s_), #call);                                          \
            return ret;                                                                                  \
        }                                                                                                \
    } while (0)

// The largest power of two (up to 256) that divides every pointer.
static int common_alignment(const void *const *ptrs, int n) {
    uintptr_t bits = 256;
    for (int i = 0; i < n; i++)
        if (ptrs[i]) bits |= (uintptr_t)ptrs[i];
    return (int)(bits & (~bits + 1));
}

static dc_gemm_plan *find_plan(dc_cuda_ctx *c, const dc_gemm_plan *key) {
    for (int i = 0; i < c->nplans; i++) {
        dc_gemm_plan *p = &c->plans[i];
        if (p->m == key->m && p->n == key->n && p->k == key->k && p->lda == key->lda &&
            p->ldb == key->ldb && p->ldd == key->ldd && p->ta == key->ta && p->tb == key->tb &&
            p->epi == key->epi && p->align == key->align && p->ab == key->ab && p->d == key->d &&
            p->batch == key->batch && p->sa == key->sa && p->sb == key->sb && p->sd == key->sd)
            return p;
    }
    return NULL;
}

static bool uses_aux(int epi) { return epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU; }

// A new plan; ok is false when cuBLASLt has no algorithm for a fused
// epilogue (the caller then runs the plain product and a separate kernel).
// The bias and aux pointers go on the descriptor before the heuristic, which
// reads their alignment. NULL with the error recorded on failure; the plan is
// counted from the start (not ok until the end), so dc_cuda_gemm_free
// releases what a failed one had created.
static dc_gemm_plan *make_plan(dc_backend *be, const dc_gemm_plan *key, const void *bias, const void *aux) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->nplans == c->cap_plans) {
        int cap = c->cap_plans ? 2 * c->cap_plans : 64;
        dc_gemm_plan *t = (dc_gemm_plan *)realloc(c->plans, cap * sizeof *t);
        if (!t) {
            dc_cuda_record(be, __func__, __FILE__, __LINE__, "out of host memory for %d matrix-product plans", cap);
            return NULL;
        }
        c->plans = t, c->cap_plans = cap;
    }
    dc_gemm_plan *p = &c->plans[c->nplans++];
    *p = *key;  // descriptors NULL, ok false
    LT_OR(NULL, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_OR(NULL, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_OR(NULL, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (key->epi) {
        cublasLtEpilogue_t epi = (cublasLtEpilogue_t)key->epi;
        LT_OR(NULL, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    }
    if (bias)
        LT_OR(NULL, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (uses_aux(key->epi)) {  // the GELU input, laid out as D
        int64_t ld = key->ldd;
        int32_t t = cuda_type(key->d);
        LT_OR(NULL, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        LT_OR(NULL, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof t));
        LT_OR(NULL,
              cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    }
    // Stored shapes: A is (ta ? k x m : m x k), B is (tb ? n x k : k x n), D is m x n.
    LT_OR(NULL, cublasLtMatrixLayoutCreate(&p->la, cuda_type(key->ab), key->ta ? key->k : key->m,
                                           key->ta ? key->m : key->k, key->lda));
    LT_OR(NULL, cublasLtMatrixLayoutCreate(&p->lb, cuda_type(key->ab), key->tb ? key->n : key->k,
                                           key->tb ? key->k : key->n, key->ldb));
    LT_OR(NULL, cublasLtMatrixLayoutCreate(&p->ld, cuda_type(key->d), key->m, key->n, key->ldd));
    if (key->batch > 1) {
        const cublasLtMatrixLayout_t lay[3] = {p->la, p->lb, p->ld};
        const int64_t stride[3] = {key->sa, key->sb, key->sd};
        for (int i = 0; i < 3; i++) {
            LT_OR(NULL, cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &key->batch,
                                                         sizeof key->batch));
            LT_OR(NULL, cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &stride[i], sizeof stride[i]));
        }
    }
    cublasLtMatmulPreference_t pref;
    LT_OR(NULL, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->lt_ws_bytes;
    uint32_t al = (uint32_t)key->align;
    const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof al);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && key->epi) return p;
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        dc_cuda_record(be, __func__, __FILE__, __LINE__,
                       "cuBLASLt has no algorithm for a %dx%dx%d %s product (ta %d, tb %d, %d-byte aligned): %s",
                       key->m, key->n, key->k, dc_dtype_name(key->ab), key->ta, key->tb, key->align,
                       cublasLtGetStatusString(st));
        return NULL;
    }
    p->algo = res.algo;
    p->ok = true;
    return p;
}

// Column-major D[m,n] = op(A) op(B) (+ bias[m]) (+ D if accumulate), with
// an optional fused epilogue: GELU_AUX_BIAS (aux = the product plus bias,
// D = gelu(aux)) or DGELU (D = product * gelu'(aux)). Returns false, having
// done nothing, when cuBLASLt offers no algorithm for a fused epilogue
// (bias included), and after an error (recorded): the caller's fallback ops
// then do nothing either, as every op on a failed backend. batch > 1: that
// many products, the i-th one's A, B and D i sa, i sb and i sd elements on.
static bool gemm_batched(dc_backend *be, int m, int n, int k, const void *A, int lda, bool ta, const void *B,
                         int ldb, bool tb, void *D, int ldd, dc_dtype ab, dc_dtype d, const void *bias,
                         bool accumulate, int epi, const void *aux, int batch, int64_t sa, int64_t sb, int64_t sd,
                         float alpha) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->failed) return false;  // a plan a failure left half made must not be used
    const void *ptrs[4] = {A, B, D, aux};  // the bias is checked by the callers (16 bytes)
    dc_gemm_plan key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
    key.ta = ta, key.tb = tb, key.ab = ab, key.d = d;
    key.epi = epi ? epi : bias ? CUBLASLT_EPILOGUE_BIAS : 0;
    key.align = common_alignment(ptrs, 4);
    if (batch > 1) key.batch = batch, key.sa = sa, key.sb = sb, key.sd = sd;
    dc_gemm_plan *p = find_plan(c, &key);
    if (!p) p = make_plan(be, &key, bias, aux);
    if (!p || !p->ok) return false;
    if (bias)
        LT_OR(false, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux)
        LT_OR(false,
              cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    const float beta = accumulate ? 1.0f : 0.0f;
    LT_OR(false, cublasLtMatmul(c->lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, D, p->ld, D, p->ld, &p->algo,
                                c->lt_ws, c->lt_ws_bytes, c->stream));
    return true;
}

static bool gemm_epi(dc_backend *be, int m, int n, int k, const void *A, int lda, bool ta, const void *B,
                     int ldb, bool tb, void *D, int ldd, dc_dtype ab, dc_dtype d, const void *bias,
                     bool accumulate, int epi, const void *aux) {
    return gemm_batched(be, m, n, k, A, lda, ta, B, ldb, tb, D, ldd, ab, d, bias, accumulate, epi, aux, 1, 0, 0, 0,
                        1.0f);
}

extern "C" void dc_cuda_gemm_strided(dc_backend *be, int m, int n, int k, const void *A, int lda, int64_t sa,
                                     bool ta, const void *B, int ldb, int64_t sb, bool tb, void *D, int ldd,
                                     int64_t sd, dc_dtype ab, dc_dtype d, int batch, float alpha) {
    gemm_batched(be, m, n, k, A, lda, ta, B, ldb, tb, D, ldd, ab, d, NULL, false, 0, NULL, batch, sa, sb, sd, alpha);
}

// A plain product (no epilogue: cuBLASLt always has an algorithm for one).
static void gemm(dc_backend *be, int m, int n, int k, const void *A, int lda, bool ta, const void *B,
                 int ldb, bool tb, void *D, int ldd, dc_dtype ab, dc_dtype d, bool accumulate) {
    gemm_epi(be, m, n, k, A, lda, ta, B, ldb, tb, D, ldd, ab, d, NULL, accumulate, 0, NULL);
}

// A bias fuses into the epilogue when its dtype is the output's and it is 16-byte
// aligned (biases are slices of the flat weight buffer, at any offset).
static bool fusable_bias(dc_buf b, dc_buf out) { return b.p && b.dt == out.dt && dc_aligned(b.p, 16); }

// out[M,N] (+)= inp w^T + b: out^T[N,M] = (w as K x N)^T (inp as K x M) in
// column-major terms, the bias in the epilogue where cuBLASLt has one.
static void linear_fwd(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K, int N,
                       bool accumulate) {
    if (inp.dt != w.dt)
        DC_CUDA_FAIL(be, "input and weight dtypes differ (%s, %s)", dc_dtype_name(inp.dt), dc_dtype_name(w.dt));
    bool fused = fusable_bias(b, out) && gemm_epi(be, N, M, K, w.p, K, true, inp.p, K, false, out.p, N, inp.dt,
                                                  out.dt, b.p, accumulate, 0, NULL);
    if (fused) return;
    gemm(be, N, M, K, w.p, K, true, inp.p, K, false, out.p, N, inp.dt, out.dt, accumulate);
    if (b.p) dc_cuda_add_bias(be, out, b, M, N);
}

extern "C" void dc_cuda_linear_fwd(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M,
                                   int K, int N) {
    DC_CUDA_OP(be);  // each entry point marks the profile under its own name
    linear_fwd(be, out, inp, w, b, M, K, N, false);
}

extern "C" void dc_cuda_linear_fwd_acc(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M,
                                       int K, int N) {
    DC_CUDA_OP(be);
    linear_fwd(be, out, inp, w, b, M, K, N, true);
}

extern "C" void dc_cuda_linear_bwd(dc_backend *be, dc_buf dinp, dc_buf dw, dc_buf db, dc_buf dout,
                                   dc_buf inp, dc_buf w, int M, int K, int N, int flags) {
    DC_CUDA_OP(be);
    if (inp.dt != w.dt || dout.dt != w.dt)
        DC_CUDA_FAIL(be, "dout, input and weight dtypes differ (%s, %s, %s)", dc_dtype_name(dout.dt),
                     dc_dtype_name(inp.dt), dc_dtype_name(w.dt));
    const bool set = flags & DC_BWD_DW_SET;
    // dinp^T[K,M] = (w as K x N) (dout as N x M)
    if (dinp.p)
        gemm(be, K, M, N, w.p, K, false, dout.p, N, false, dinp.p, K, dout.dt, dinp.dt, flags & DC_BWD_DX_ADD);
    // dw^T[K,N] += (inp as K x M) (dout as N x M)^T, in fp32 (beta 0 when set:
    // the product is not read back)
    if (dw.p) gemm(be, K, N, M, inp.p, K, false, dout.p, N, true, dw.p, K, dout.dt, dw.dt, !set);
    if (db.p) dc_cuda_bias_grad(be, db, dout, M, N, set);
}

// ---- several products of a few rows (linear_many_fwd) ----
// A UNet's resnets each project the same time embedding: 22 products of 2 to
// 16 rows, each a cuBLAS call of 5-6 us on an H100 that reads its weights
// once. Here one kernel reads them all: a warp an output column of one job,
// its weight row in 16-byte loads with the lanes across K, inp's rows (at
// most kManyRows) from shared memory, the lanes' sums added by a fixed
// butterfly (the same bits every run).
enum { kManyRows = 16, kManyJobs = 32, kManyWarps = 8, kManyCols = 4 };  // kManyCols: columns a warp
struct ManyJobs {
    void *out[kManyJobs];
    const void *w[kManyJobs], *b[kManyJobs];
    int bbf[kManyJobs], N[kManyJobs];
    int start[kManyJobs + 1];  // the jobs' first columns; start[n] all of them
    int n;
};

__global__ void __launch_bounds__(kManyWarps * 32) k_linear_many(const __grid_constant__ ManyJobs J, const uint4 *x,
                                                                 int M, int K) {
    dc_pdl_enter();
    extern __shared__ uint4 xs[];  // x [M, K] bf16
    const int kv = K / 8;
    for (int i = threadIdx.x; i < M * kv; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, total = J.start[J.n];
    for (int cc = 0; cc < kManyCols; cc++) {
        const int col = (blockIdx.x * kManyWarps + warp) * kManyCols + cc;
        if (col >= total) break;
        int i = 0;
        while (col >= J.start[i + 1]) i++;
        const int j = col - J.start[i];
        const uint4 *wr = (const uint4 *)J.w[i] + (int64_t)j * kv;
        float acc[kManyRows];
#pragma unroll
        for (int m = 0; m < kManyRows; m++) acc[m] = 0.0f;
        for (int v = lane; v < kv; v += 32) {
            float wf[8], xf[8];
            dc_unpack8(wf, wr[v]);
#pragma unroll
            for (int m = 0; m < kManyRows; m++) {
                if (m >= M) break;
                dc_unpack8(xf, xs[m * kv + v]);
#pragma unroll
                for (int k = 0; k < 8; k++) acc[m] = fmaf(xf[k], wf[k], acc[m]);
            }
        }
        float mine = 0.0f;
#pragma unroll
        for (int m = 0; m < kManyRows; m++) {
            const float s = dc_warp_sum(acc[m]);
            if (lane == m) mine = s;
        }
        if (lane < M) {
            if (J.b[i]) mine += dc_ld(J.b[i], j, J.bbf[i]);
            ((__nv_bfloat16 *)J.out[i])[(int64_t)lane * J.N[i] + j] = __float2bfloat16(mine);
        }
    }
}

extern "C" void dc_cuda_linear_many_fwd(dc_backend *be, const dc_linear_job *jobs, int n, dc_buf inp, int M,
                                        int K) {
    DC_CUDA_OP(be);
    bool fast = inp.dt == DC_BF16 && M >= 1 && M <= kManyRows && K % 8 == 0 && (size_t)M * K * 2 <= 48 * 1024 &&
                dc_aligned(inp.p, 16);
    for (int i = 0; i < n && fast; i++)
        fast = jobs[i].out.dt == DC_BF16 && jobs[i].w.dt == DC_BF16 && dc_aligned(jobs[i].w.p, 16) &&
               (!jobs[i].b.p || jobs[i].b.dt == DC_BF16 || jobs[i].b.dt == DC_F32) && jobs[i].N >= 1;
    if (!fast) {
        for (int i = 0; i < n; i++) linear_fwd(be, jobs[i].out, inp, jobs[i].w, jobs[i].b, M, K, jobs[i].N, false);
        return;
    }
    for (int i0 = 0; i0 < n; i0 += kManyJobs) {
        ManyJobs J;
        memset(&J, 0, sizeof J);
        J.n = n - i0 < kManyJobs ? n - i0 : kManyJobs;
        for (int i = 0; i < J.n; i++) {
            const dc_linear_job *o = &jobs[i0 + i];
            J.out[i] = o->out.p, J.w[i] = o->w.p, J.b[i] = o->b.p, J.bbf[i] = BF(o->b), J.N[i] = o->N;
            J.start[i + 1] = J.start[i] + o->N;
        }
        const int per = kManyWarps * kManyCols, blocks = (J.start[J.n] + per - 1) / per;
        dc_launch(be, k_linear_many, blocks, kManyWarps * 32, (size_t)M * K * 2, J, (const uint4 *)inp.p, M, K);
    }
}

// pre = inp w^T + b and out = gelu(pre) from one product (fc1 of the MLP).
extern "C" void dc_cuda_linear_gelu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                                        int M, int K, int N) {
    DC_CUDA_OP(be);
    bool fused = fusable_bias(b, out) && pre.dt == out.dt && inp.dt == w.dt && N % 8 == 0 &&
                 gemm_epi(be, N, M, K, w.p, K, true, inp.p, K, false, out.p, N, inp.dt, out.dt, b.p, false,
                          CUBLASLT_EPILOGUE_GELU_AUX_BIAS, pre.p);
    if (fused) return;
    dc_cuda_linear_fwd(be, pre, inp, w, b, M, K, N);
    dc_cuda_gelu_fwd(be, out, pre, (int64_t)M * N);
}

// [h | g] = inp w^T + b, out = h gelu_erf(g): one product with the gate in its
// epilogue where the Hopper kernel takes the call, else the product into pre
// and the GEGLU pass (opts.geglu_sm90 off: always so).
extern "C" bool dc_cuda_linear_geglu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                                         int M, int K, int F) {
    DC_CUDA_OP_OR(be, true);  // a failed backend runs nothing: as if done
    if (be->opts.geglu_sm90 && dc_cuda_geglu_linear_sm90(be, out, inp, w, b, M, K, F)) {
        DC_CUDA_OR(be, true, cudaGetLastError());
        return true;
    }
    if (!pre.p) return false;
    linear_fwd(be, pre, inp, w, b, M, K, 2 * F, false);
    dc_cuda_geglu_fwd(be, out, pre, M, F);
    return true;
}

// The backward of out = fc2(gelu(pre)) down to pre: dpre = (dout w) * gelu'(pre)
// from one product, plus the weight and bias gradients of fc2 (act = gelu(pre)).
extern "C" void dc_cuda_linear_bwd_gelu(dc_backend *be, dc_buf dpre, dc_buf dw, dc_buf db, dc_buf dout,
                                        dc_buf act, dc_buf w, dc_buf pre, dc_buf scratch, int M, int K, int N) {
    DC_CUDA_OP(be);
    bool fused = dpre.dt == pre.dt && dout.dt == w.dt && K % 8 == 0 &&
                 gemm_epi(be, K, M, N, w.p, K, false, dout.p, N, false, dpre.p, K, dout.dt, dpre.dt, NULL, false,
                          CUBLASLT_EPILOGUE_DGELU, pre.p);
    if (fused) {
        dc_cuda_linear_bwd(be, dc_buf_none(), dw, db, dout, act, w, M, K, N, false);
        return;
    }
    dc_cuda_linear_bwd(be, scratch, dw, db, dout, act, w, M, K, N, false);
    dc_cuda_gelu_bwd(be, dpre, scratch, pre, (int64_t)M * K);
}

extern "C" void dc_cuda_gemm_free(dc_cuda_ctx *c) {
    for (int i = 0; i < c->nplans; i++) {  // plans that are not ok hold descriptors too
        dc_gemm_plan *p = &c->plans[i];
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    }
    free(c->plans);
    c->plans = NULL, c->nplans = c->cap_plans = 0;
}

// ---- measured peak -----------------------------------------------------------------------
__global__ void fill_random(void *p, int64_t n, int bf16, uint32_t salt) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ salt;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        dc_st(p, i, (float)(h & 0xffff) / 32768.0f - 1.0f, bf16);
    }
}

// An 8192^3 product in the compute dtype on random data, median of 10 after
// warm-up: the ceiling the engine's TFLOP/s are compared with (MFU). 0 with a
// message when the GPU lacks the memory for it (the backend stays usable), or
// after an error (recorded). Its matrices are not counted as the engine's memory.
#define OK(call) dc_cuda_ok(be, (call), #call, __func__, __FILE__, __LINE__)
extern "C" double dc_cuda_gemm_peak(dc_backend *be) {
    dc_cuda_ctx *c = dc_cuda(be);
    const int n = 8192;
    dc_dtype dt = be->compute;
    size_t bytes = (size_t)n * n * dc_dtype_size(dt);
    if (c->failed) return 0.0;
    void *a = NULL, *b = NULL, *d = NULL;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&d, bytes);
    if (e != cudaSuccess) {
        dc_cuda_fail_alloc("the peak measurement's matrices", 3 * bytes, e);
        cudaFree(a), cudaFree(b), cudaFree(d);
        return 0.0;
    }
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms[10];
    bool ok = OK(cudaEventCreate(&e0)) && OK(cudaEventCreate(&e1));
    if (ok) {
        fill_random<<<1024, 256, 0, c->stream>>>(a, (int64_t)n * n, dt == DC_BF16, 1);
        fill_random<<<1024, 256, 0, c->stream>>>(b, (int64_t)n * n, dt == DC_BF16, 2);
        ok = OK(cudaGetLastError());
    }
    for (int i = -3; i < 10 && ok; i++) {
        ok = OK(cudaEventRecord(e0, c->stream));
        if (ok) gemm(be, n, n, n, a, n, true, b, n, false, d, n, dt, dt, false);
        ok = ok && !c->failed && OK(cudaEventRecord(e1, c->stream)) && OK(cudaEventSynchronize(e1));
        if (ok && i >= 0) ok = OK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b), cudaFree(d);
    if (!ok) return 0.0;
    for (int i = 1; i < 10; i++)  // insertion sort for the median
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    double med = 0.5 * (ms[4] + ms[5]);
    return 2.0 * n * (double)n * n / (med * 1e-3) / 1e12;
}
#undef OK
