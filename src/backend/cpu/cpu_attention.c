// Multi-head self-attention, forward and backward, one (sample, head) per task.
//
// Each task runs its small products (T = 64..256 tokens, head dim 32..72)
// through single-threaded OpenBLAS, reading q, k, v in place through leading
// dimensions, with T x T scores in per-thread scratch. On AVX-512 that runs
// 2-3x faster than a hand-blocked C kernel (about 120 against 50 GFLOP/s on
// two cores). Backward never sees a stored T x T matrix: it rebuilds
// P = exp(S * scale - lse) from q, k and the saved lse, as FlashAttention does.
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_ops.h"

// Row-major c[M,N] = alpha op(a)[M,K] op(b)[K,N] + beta c on this thread alone.
static void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

void dc_cpu_attn_fwd(dc_backend *be, dc_buf out_, dc_buf lse_, dc_buf qkv_, int B, int T, int D,
                     int H) {
    float *out = dc_cpu_f32(out_), *lse = dc_cpu_f32(lse_);  // out[B,T,D], lse[B,H,T]
    const float *qkv = dc_cpu_f32(qkv_);                     // [B,T,3D]
    assert(D % H == 0);
    const int Dh = D / H;
    const int64_t ld = 3 * D;
    const float scale = 1.0f / sqrtf((float)Dh);
    size_t stride;
    float *scratch = dc_cpu_scratch(be, (size_t)T * T, &stride);

#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        float *S = scratch + omp_get_thread_num() * stride;  // [T, T] scores, then P
        const float *q = qkv + (int64_t)b * T * ld + h * Dh, *k = q + D, *v = q + 2 * D;
        float *o = out + (int64_t)b * T * D + h * Dh;        // [T, Dh] with row stride D
        float *l = lse + (int64_t)bh * T;

        gemm(false, true, T, T, Dh, scale, q, ld, k, ld, 0.0f, S, T);  // S = q k^T * scale
        // Stable softmax per row; lse = max + log(sum exp(s - max)).
        for (int i = 0; i < T; i++) {
            float *s = S + (int64_t)i * T, mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
            for (int j = 0; j < T; j++) mx = s[j] > mx ? s[j] : mx;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < T; j++) {
                s[j] = expf(s[j] - mx);
                sum += s[j];
            }
            const float inv = 1.0f / sum;
#pragma omp simd
            for (int j = 0; j < T; j++) s[j] *= inv;
            l[i] = mx + logf(sum);
        }
        gemm(false, false, T, Dh, T, 1.0f, S, T, v, ld, 0.0f, o, D);  // out = P v
    }
}

void dc_cpu_attn_bwd(dc_backend *be, dc_buf dqkv_, dc_buf dout_, dc_buf qkv_, dc_buf out_,
                     dc_buf lse_, int B, int T, int D, int H) {
    float *dqkv = dc_cpu_f32(dqkv_);                                 // [B,T,3D]
    const float *dout = dc_cpu_f32(dout_), *out = dc_cpu_f32(out_);  // [B,T,D]
    const float *qkv = dc_cpu_f32(qkv_), *lse = dc_cpu_f32(lse_);    // [B,T,3D], [B,H,T]
    assert(D % H == 0);
    const int Dh = D / H;
    const int64_t ld = 3 * D;
    const float scale = 1.0f / sqrtf((float)Dh);
    size_t stride;
    float *scratch = dc_cpu_scratch(be, 2 * (size_t)T * T, &stride);

#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        float *P = scratch + omp_get_thread_num() * stride;  // [T, T] P, then dS
        float *dP = P + (size_t)T * T;                       // [T, T]
        const float *q = qkv + (int64_t)b * T * ld + h * Dh, *k = q + D, *v = q + 2 * D;
        const float *o = out + (int64_t)b * T * D + h * Dh, *dO = dout + (int64_t)b * T * D + h * Dh;
        float *dq = dqkv + (int64_t)b * T * ld + h * Dh, *dk = dq + D, *dv = dq + 2 * D;
        const float *l = lse + (int64_t)bh * T;

        gemm(false, true, T, T, Dh, scale, q, ld, k, ld, 0.0f, P, T);
        for (int i = 0; i < T; i++) {
            float *p = P + (int64_t)i * T, li = l[i];
#pragma omp simd
            for (int j = 0; j < T; j++) p[j] = expf(p[j] - li);
        }
        gemm(true, false, T, Dh, T, 1.0f, P, T, dO, D, 0.0f, dv, ld);   // dV = P^T dO
        gemm(false, true, T, T, Dh, 1.0f, dO, D, v, ld, 0.0f, dP, T);   // dP = dO v^T
        // Softmax backward: dS = P * (dP - rowsum(dO * O)), written over P.
        for (int i = 0; i < T; i++) {
            const float *oi = o + (int64_t)i * D, *doi = dO + (int64_t)i * D;
            float di = 0.0f;
#pragma omp simd reduction(+ : di)
            for (int d = 0; d < Dh; d++) di += oi[d] * doi[d];
            float *p = P + (int64_t)i * T, *dp = dP + (int64_t)i * T;
#pragma omp simd
            for (int j = 0; j < T; j++) p[j] *= dp[j] - di;
        }
        gemm(false, false, T, Dh, T, scale, P, T, k, ld, 0.0f, dq, ld);  // dQ = dS k * scale
        gemm(true, false, T, Dh, T, scale, P, T, q, ld, 0.0f, dk, ld);   // dK = dS^T q * scale
    }
}
