// Attention through matrix products, for heads the fused kernels cannot hold
// in registers (the SD VAE's one head of 512), values of another size than
// queries (Dv != Dh), and fp32 heads over ATTN_F32_MAX_DH. Same semantics
// as the fused kernels (cuda_attention.cu), either dtype.
//
// Per (sample, head), a block of rows of the score matrix at a time:
//   forward, blocks of queries:  S = scale Q_c K^T (fp32), P = softmax(S)
//     (masked), lse; O_c = P V.
//   backward, blocks of keys:    S^T = scale K_c Q^T, P^T = exp(S^T - lse),
//     dV_c = P^T dO, dP^T = V_c dO^T, dS^T = P^T (dP^T - Delta), dK_c = scale dS^T Q;
//   then blocks of queries:      S, P, dP = dO_c V^T, dS, dQ_c = scale dS K.
// Every output row is produced by one product over the whole other sequence,
// so nothing is accumulated across blocks: full fp32 accumulation inside the
// products and deterministic results, at the price of computing S twice in
// backward (as the fused kernels do). The products are cuBLASLt's (tensor
// cores for bf16, plain fp32 for fp32), issued without cuBLASLt workspace, so
// that the backend's cuBLASLt workspace, idle between products on the one
// stream, holds the score blocks: this path allocates nothing.
#include <string.h>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

// Bytes of workspace per score element: S and dP in fp32 and, for bf16, P
// (then dS) in bf16 for the products. fp32 keeps P and dS in place.
static size_t bytes_per_score(bool bf16, bool backward) {
    return (backward ? 8 : 4) + (bf16 ? 2 : 0);
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Rows of a block of scores over `cols` columns (stored with ld round_up(cols, 8))
// that fit in the workspace beside Delta [Tq]; 0 if not even one.
static int64_t block_rows(size_t ws_bytes, int Tq, int64_t cols, bool bf16, bool backward) {
    const int64_t fixed = round_up((int64_t)Tq * 4, 256) + 3 * 256;  // Delta, alignment slack
    if ((int64_t)ws_bytes <= fixed) return 0;
    return ((int64_t)ws_bytes - fixed) / (round_up(cols, 8) * (int64_t)bytes_per_score(bf16, backward));
}

bool dc_attn_big_fits(dc_backend *be, int Tq, int Tk, bool bf16) {
    const size_t ws = dc_cuda(be)->lt_ws_bytes;
    const int64_t c = Tq > Tk ? Tq : Tk;
    return block_rows(ws, Tq, c, bf16, true) >= 1 && block_rows(ws, Tq, c, bf16, false) >= 1;
}

// ---- kernels on blocks of scores ------------------------------------------------------------
// A block is R rows x C columns (ld) of scores; rows are queries q0 + r and
// columns keys (trans = 0), or rows keys k0 + r and columns queries (trans = 1).
struct Block {
    int R, C;
    int64_t ld;
    int trans, first;  // first: q0 (trans 0) or k0 (trans 1)
};
__device__ __forceinline__ void block_qk(const Block &bl, int r, int c, int &q, int &k) {
    q = bl.trans ? c : bl.first + r;
    k = bl.trans ? bl.first + r : c;
}

// Forward softmax of score rows (queries), one block of threads per row:
// pc[r] = exp(s[r] - lse) (masked keys 0) in the compute dtype, lse[q0 + r].
__global__ void big_softmax(const float *__restrict__ s, void *pc, int bf16, float *__restrict__ lse,
                           const AttnParams p, Block bl) {
    __shared__ float sm[32], sl[32];
    const int r = blockIdx.x, q = bl.first + r, kend = attn_key_end(p, q);
    const float *row = s + r * bl.ld;
    float m = -INFINITY, l = 0.0f;  // this thread's running max and sum
    for (int j = threadIdx.x; j < kend; j += blockDim.x) {
        const float v = row[j];
        if (v > m) l = l * expf(m - v) + 1.0f, m = v;
        else l += expf(v - m);
    }
    // combine (m, l) over the warp, then over the warps
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        const float mn = fmaxf(m, m2);
        l = (mn == -INFINITY ? 0.0f : l * expf(m - mn) + l2 * expf(m2 - mn)), m = mn;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) sm[warp] = m, sl[warp] = l;
    __syncthreads();
    m = -INFINITY, l = 0.0f;
    for (int w = 0; w < nw; w++) {
        const float mn = fmaxf(m, sm[w]);
        l = mn == -INFINITY ? 0.0f : l * expf(m - mn) + sl[w] * expf(sm[w] - mn), m = mn;
    }
    const float L = m + logf(l);  // every row sees key 0: finite
    for (int j = threadIdx.x; j < bl.C; j += blockDim.x)
        dc_st(pc, r * bl.ld + j, j < kend ? expf(row[j] - L) : 0.0f, bf16);
    if (threadIdx.x == 0) lse[q] = L;
}

// P = exp(S - lse[q]) (masked: 0), in place in s (fp32) and into pc.
__global__ void big_probs(float *s, void *pc, int bf16, const float *__restrict__ lse, const AttnParams p,
                          Block bl) {
    const int64_t n = (int64_t)bl.R * bl.C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / bl.C), c = (int)(i % bl.C);
        int q, k;
        block_qk(bl, r, c, q, k);
        const int64_t e = r * bl.ld + c;
        const float v = k < attn_key_end(p, q) ? expf(s[e] - lse[q]) : 0.0f;
        s[e] = v;
        dc_st(pc, e, v, bf16);
    }
}

// dS = P (dP - Delta[q]) into ds (the compute dtype; may be dp itself).
__global__ void big_dscores(const float *__restrict__ pr, const float *dp, void *ds, int bf16,
                            const float *__restrict__ delta, Block bl) {
    const int64_t n = (int64_t)bl.R * bl.C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / bl.C), c = (int)(i % bl.C);
        int q, k;
        block_qk(bl, r, c, q, k);
        const int64_t e = r * bl.ld + c;
        dc_st(ds, e, pr[e] * (dp[e] - delta[q]), bf16);
    }
}

// Delta[q] = sum_d dO[q, d] O[q, d] for the queries of one (sample, head): a warp per query.
__global__ void big_delta(float *delta, const void *o, const void *dout, int64_t ot, int Tq, int Dv, int bf16) {
    const int q = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (q >= Tq) return;
    float acc = 0.0f;
    for (int d = lane; d < Dv; d += 32) acc = fmaf(dc_ld(dout, q * ot + d, bf16), dc_ld(o, q * ot + d, bf16), acc);
    acc = dc_warp_sum(acc);
    if (lane == 0) delta[q] = acc;
}

// ---- products -------------------------------------------------------------------------------
#define LT_CHECK(call)                                                                                  \
    do {                                                                                                \
        cublasStatus_t s_ = (call);                                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                              \
            cudaGetLastError();                                                                         \
            dc_cuda_record(be, __func__, __FILE__, __LINE__, "cuBLASLt error: %s, from %s",             \
                           cublasLtGetStatusString(s_), #call);                                         \
            goto done;                                                                                  \
        }                                                                                               \
    } while (0)

// The largest power of two (up to 256) dividing every address and row stride, in bytes.
static int alignment(const uintptr_t *v, int n) {
    uintptr_t bits = 256;
    for (int i = 0; i < n; i++) bits |= v[i];
    return (int)(bits & (~bits + 1));
}

// Row-major C[M,N] = alpha op(A) op(B), op(A) = A [M,K] (or A^T, A stored
// [K,M], if ta), op(B) = B [K,N] (or B^T, B stored [N,K], if tb), A and B in
// dtype ab, C in dtype cd. Issued as the column-major C^T = op(B)^T op(A)^T.
static void gemm(dc_backend *be, bool ta, bool tb, int M, int N, int K, float alpha, const void *A, int64_t lda,
                 const void *B, int64_t ldb, void *C, int64_t ldc, dc_dtype ab, dc_dtype cd) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->failed) return;
    const cudaDataType_t tab = ab == DC_BF16 ? CUDA_R_16BF : CUDA_R_32F, tc = cd == DC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const size_t es = dc_dtype_size(ab);
    const uintptr_t at[6] = {(uintptr_t)A, (uintptr_t)B, (uintptr_t)C, (uintptr_t)(lda * es), (uintptr_t)(ldb * es),
                             (uintptr_t)(ldc * dc_dtype_size(cd))};
    const uint32_t al = (uint32_t)alignment(at, 6);
    const uint64_t no_ws = 0;
    const float beta = 0.0f;
    LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    // column-major A' = B (N x K, or K x N stored), B' = A, D' = C^T (N x M)
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, tab, tb ? K : N, tb ? N : K, ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, tab, ta ? M : K, ta ? K : M, lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lc, tc, N, M, ldc));
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_ws, sizeof no_ws));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    if (!found) {
        dc_cuda_record(be, __func__, __FILE__, __LINE__, "cuBLASLt has no algorithm for a %dx%dx%d %s attention product",
                       M, N, K, dc_dtype_name(ab));
        goto done;
    }
    LT_CHECK(cublasLtMatmul(c->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res.algo, NULL, 0, c->stream));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
}

// ---- the op ---------------------------------------------------------------------------------
// The workspace carved for one (sample, head): Delta [Tq], S and dP fp32,
// P/dS in the compute dtype (fp32: P in S, dS in dP).
struct Work {
    float *delta, *s, *dp;
    void *pc;
};
static Work carve(dc_backend *be, int Tq, int64_t rows, int64_t ld, bool bf16, bool backward) {
    char *w = (char *)dc_cuda(be)->lt_ws;
    Work k;
    k.delta = (float *)w;
    w += round_up((int64_t)Tq * 4, 256);
    k.s = (float *)w;
    w += round_up(rows * ld * 4, 256);
    k.dp = backward ? (float *)w : NULL;
    if (backward) w += round_up(rows * ld * 4, 256);
    k.pc = bf16 ? (void *)w : (void *)k.s;
    return k;
}

static unsigned grid_for(int64_t n) { return dc_blocks(n, 256) > 4096 ? 4096 : dc_blocks(n, 256); }

#define BIG_LAUNCHED(be)                                                                                \
    do {                                                                                                \
        if (!dc_cuda_ok(be, cudaGetLastError(), "a kernel launch", __func__, __FILE__, __LINE__)) return; \
    } while (0)

void dc_attn_big_fwd(dc_backend *be, const AttnParams &p, bool bf16) {
    const dc_dtype dt = bf16 ? DC_BF16 : DC_F32;
    const size_t es = dc_dtype_size(dt);
    const int64_t ld = round_up(p.Tk, 8);
    int64_t rows = block_rows(dc_cuda(be)->lt_ws_bytes, p.Tq, p.Tk, bf16, false);
    if (rows > p.Tq) rows = p.Tq;
    const Work w = carve(be, p.Tq, rows, ld, bf16, false);
    cudaStream_t st = dc_cuda(be)->stream;
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++) {
            const char *q = (const char *)p.q + (b * p.qb + h * p.qh) * es;
            const char *k = (const char *)p.k + (b * p.kb + h * p.kh) * es;
            const char *v = (const char *)p.v + (b * p.vb + h * p.vh) * es;
            char *o = (char *)p.out + (b * p.ob + h * p.oh) * es;
            float *lse = p.lse + ((int64_t)b * p.H + h) * p.Tq;
            for (int q0 = 0; q0 < p.Tq; q0 += (int)rows) {
                const int n = (int)(p.Tq - q0 < rows ? p.Tq - q0 : rows);
                const Block bl = {n, p.Tk, ld, 0, q0};
                gemm(be, false, true, n, p.Tk, p.Dh, p.scale, q + q0 * p.qt * es, p.qt, k, p.kt, w.s, ld, dt, DC_F32);
                big_softmax<<<n, 256, 0, st>>>(w.s, w.pc, bf16, lse, p, bl);
                BIG_LAUNCHED(be);
                gemm(be, false, false, n, p.Dv, p.Tk, 1.0f, w.pc, ld, v, p.vt, o + q0 * p.ot * es, p.ot, dt, dt);
            }
        }
}

void dc_attn_big_bwd(dc_backend *be, const AttnParams &p, bool bf16) {
    const dc_dtype dt = bf16 ? DC_BF16 : DC_F32;
    const size_t es = dc_dtype_size(dt);
    const int64_t c = p.Tq > p.Tk ? p.Tq : p.Tk;
    int64_t rows = block_rows(dc_cuda(be)->lt_ws_bytes, p.Tq, c, bf16, true);
    if (rows > c) rows = c;
    cudaStream_t st = dc_cuda(be)->stream;
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++) {
            const char *q = (const char *)p.q + (b * p.qb + h * p.qh) * es;
            const char *k = (const char *)p.k + (b * p.kb + h * p.kh) * es;
            const char *v = (const char *)p.v + (b * p.vb + h * p.vh) * es;
            const char *o = (const char *)p.o + (b * p.ob + h * p.oh) * es;
            const char *dout = (const char *)p.dout + (b * p.ob + h * p.oh) * es;
            char *dq = (char *)p.dq + (b * p.qb + h * p.qh) * es;
            char *dk = (char *)p.dk + (b * p.kb + h * p.kh) * es;
            char *dv = (char *)p.dv + (b * p.vb + h * p.vh) * es;
            const float *lse = p.lse + ((int64_t)b * p.H + h) * p.Tq;

            // blocks of keys: rows k0.., columns all queries
            int64_t ld = round_up(p.Tq, 8);
            Work w = carve(be, p.Tq, rows, ld, bf16, true);
            big_delta<<<(p.Tq + 7) / 8, 256, 0, st>>>(w.delta, o, dout, p.ot, p.Tq, p.Dv, bf16);
            BIG_LAUNCHED(be);
            for (int k0 = 0; k0 < p.Tk; k0 += (int)rows) {
                const int n = (int)(p.Tk - k0 < rows ? p.Tk - k0 : rows);
                const Block bl = {n, p.Tq, ld, 1, k0};
                const int64_t ne = (int64_t)n * ld;
                gemm(be, false, true, n, p.Tq, p.Dh, p.scale, k + k0 * p.kt * es, p.kt, q, p.qt, w.s, ld, dt, DC_F32);
                big_probs<<<grid_for(ne), 256, 0, st>>>(w.s, w.pc, bf16, lse, p, bl);
                BIG_LAUNCHED(be);
                gemm(be, false, false, n, p.Dv, p.Tq, 1.0f, w.pc, ld, dout, p.ot, dv + k0 * p.vt * es, p.vt, dt, dt);
                gemm(be, false, true, n, p.Tq, p.Dv, 1.0f, v + k0 * p.vt * es, p.vt, dout, p.ot, w.dp, ld, dt, DC_F32);
                void *ds = bf16 ? w.pc : (void *)w.dp;  // P's copy is no longer needed
                big_dscores<<<grid_for(ne), 256, 0, st>>>(w.s, w.dp, ds, bf16, w.delta, bl);
                BIG_LAUNCHED(be);
                gemm(be, false, false, n, p.Dh, p.Tq, p.scale, ds, ld, q, p.qt, dk + k0 * p.kt * es, p.kt, dt, dt);
            }
            // blocks of queries: rows q0.., columns all keys
            ld = round_up(p.Tk, 8);
            w = carve(be, p.Tq, rows, ld, bf16, true);
            for (int q0 = 0; q0 < p.Tq; q0 += (int)rows) {
                const int n = (int)(p.Tq - q0 < rows ? p.Tq - q0 : rows);
                const Block bl = {n, p.Tk, ld, 0, q0};
                const int64_t ne = (int64_t)n * ld;
                gemm(be, false, true, n, p.Tk, p.Dh, p.scale, q + q0 * p.qt * es, p.qt, k, p.kt, w.s, ld, dt, DC_F32);
                big_probs<<<grid_for(ne), 256, 0, st>>>(w.s, w.pc, bf16, lse, p, bl);
                BIG_LAUNCHED(be);
                gemm(be, false, true, n, p.Tk, p.Dv, 1.0f, dout + q0 * p.ot * es, p.ot, v, p.vt, w.dp, ld, dt, DC_F32);
                void *ds = bf16 ? w.pc : (void *)w.dp;
                big_dscores<<<grid_for(ne), 256, 0, st>>>(w.s, w.dp, ds, bf16, w.delta, bl);
                BIG_LAUNCHED(be);
                gemm(be, false, false, n, p.Dh, p.Tk, p.scale, ds, ld, k, p.kt, dq + q0 * p.qt * es, p.qt, dt, dt);
            }
        }
}
