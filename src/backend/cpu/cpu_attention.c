// Multi-head self-attention, forward and backward, one (sample, head) per task.
//
// The matrices are small (T = 64..256 tokens, head dim 32..72), so instead of
// OpenBLAS (whose pthread pool must not be entered from inside an OpenMP
// region) a register-blocked kernel below does the products; each thread owns
// scratch for one head's T x T scores. Backward never sees a stored T x T
// matrix: it rebuilds P = exp(S * scale - lse) from q, k and the saved lse,
// as FlashAttention does.
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

// Eight floats in a GCC vector (one AVX register); the FMA is spelled out
// because -std=c11 forbids the compiler to fuse a * b + c on its own.
typedef float vf __attribute__((vector_size(32)));
#define VW 8
#if defined(__FMA__) && defined(__x86_64__)
#include <immintrin.h>
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
#endif
static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

// c[M,N] = beta * c + alpha * A @ b, with A's element (m, k) at a[m*sam + k*sak]
// (so A or A^T of a row-major matrix), b row-major [K, N] with row stride ldb,
// c with row stride ldc. beta is 0 (overwrite: c may hold garbage) or 1.
// Tiles of up to MR rows x NV vectors keep their accumulators in registers
// over the whole k loop (6 x 2 x 8 floats: 12 of the 16 AVX2 registers).
#define MR 6
#define NV 2
static inline __attribute__((always_inline)) void mm_tile(int mr, int nv, int K, float alpha,
                                                          const float *a, int64_t sam,
                                                          int64_t sak, const float *b,
                                                          int64_t ldb, float beta, float *c,
                                                          int64_t ldc) {
    vf acc[MR][NV] = {{{0}}};
    for (int k = 0; k < K; k++) {
        vf bk[NV];
        for (int v = 0; v < nv; v++) bk[v] = vload(b + k * ldb + v * VW);
        for (int r = 0; r < mr; r++) {
            vf av = {0};
            av += a[r * sam + k * sak];  // broadcast
            for (int v = 0; v < nv; v++) acc[r][v] = vfma(av, bk[v], acc[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) {
            float *cp = c + r * ldc + v * VW;
            vf x = acc[r][v] * alpha;
            vstore(cp, beta == 0.0f ? x : x + vload(cp));
        }
}

static void mm(int M, int N, int K, float alpha, const float *a, int64_t sam, int64_t sak,
               const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    const int nfull = N / (NV * VW) * (NV * VW), nvec = N / VW * VW;
    for (int i0 = 0; i0 < M; i0 += MR) {
        const int mr = M - i0 < MR ? M - i0 : MR;
        const float *ai = a + i0 * sam;
        float *ci = c + (int64_t)i0 * ldc;
        for (int j0 = 0; j0 < nfull; j0 += NV * VW) {
            if (mr == MR)  // the hot case, with every loop bound a constant
                mm_tile(MR, NV, K, alpha, ai, sam, sak, b + j0, ldb, beta, ci + j0, ldc);
            else
                mm_tile(mr, NV, K, alpha, ai, sam, sak, b + j0, ldb, beta, ci + j0, ldc);
        }
        for (int j0 = nfull; j0 < nvec; j0 += VW)
            mm_tile(mr, 1, K, alpha, ai, sam, sak, b + j0, ldb, beta, ci + j0, ldc);
        // Last N % 8 columns, one at a time.
        for (int r = 0; r < mr; r++)
            for (int j = nvec; j < N; j++) {
                float s = 0.0f;
                for (int k = 0; k < K; k++) s = DC_CPU_FMA(ai[r * sam + k * sak], b[k * ldb + j], s);
                float *cp = ci + r * ldc + j;
                *cp = beta == 0.0f ? alpha * s : DC_CPU_FMA(alpha, s, *cp);
            }
    }
}

// dst[Dh, T] = src[T, Dh]^T, src rows ld apart.
static void transpose(float *dst, const float *src, int T, int Dh, int64_t ld) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < Dh; d++) dst[(int64_t)d * T + t] = src[t * ld + d];
}

// Scratch floats per thread: scores and their gradient [T, T], k^T and v^T [Dh, T].
static size_t scratch_floats(int T, int Dh) { return 2 * (size_t)T * T + 2 * (size_t)Dh * T; }

void dc_cpu_attn_fwd(dc_backend *be, dc_buf out_, dc_buf lse_, dc_buf qkv_, int B, int T, int D,
                     int H) {
    float *out = dc_cpu_f32(out_), *lse = dc_cpu_f32(lse_);  // out[B,T,D], lse[B,H,T]
    const float *qkv = dc_cpu_f32(qkv_);                     // [B,T,3D]
    assert(D % H == 0);
    const int Dh = D / H;
    const float scale = 1.0f / sqrtf((float)Dh);
    size_t stride;
    float *scratch = dc_cpu_scratch(be, scratch_floats(T, Dh), &stride);

#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        float *S = scratch + omp_get_thread_num() * stride;  // [T, T]
        float *kt = S + 2 * (size_t)T * T;                   // [Dh, T]
        const float *q = qkv + (int64_t)b * T * 3 * D + h * Dh, *k = q + D, *v = q + 2 * D;
        float *o = out + (int64_t)b * T * D + h * Dh;
        float *l = lse + (int64_t)bh * T;

        transpose(kt, k, T, Dh, 3 * D);
        mm(T, T, Dh, scale, q, 3 * D, 1, kt, T, 0.0f, S, T);
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
        mm(T, Dh, T, 1.0f, S, T, 1, v, 3 * D, 0.0f, o, D);
    }
}

void dc_cpu_attn_bwd(dc_backend *be, dc_buf dqkv_, dc_buf dout_, dc_buf qkv_, dc_buf out_,
                     dc_buf lse_, int B, int T, int D, int H) {
    float *dqkv = dc_cpu_f32(dqkv_);                                          // [B,T,3D]
    const float *dout = dc_cpu_f32(dout_), *out = dc_cpu_f32(out_);           // [B,T,D]
    const float *qkv = dc_cpu_f32(qkv_), *lse = dc_cpu_f32(lse_);             // [B,T,3D], [B,H,T]
    assert(D % H == 0);
    const int Dh = D / H;
    const float scale = 1.0f / sqrtf((float)Dh);
    size_t stride;
    float *scratch = dc_cpu_scratch(be, scratch_floats(T, Dh), &stride);

#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        float *P = scratch + omp_get_thread_num() * stride;  // [T, T]
        float *dP = P + (size_t)T * T;                       // [T, T]
        float *kt = dP + (size_t)T * T, *vt = kt + (size_t)Dh * T;  // [Dh, T] each
        const int64_t ld = 3 * D;
        const float *q = qkv + (int64_t)b * T * ld + h * Dh, *k = q + D, *v = q + 2 * D;
        const float *o = out + (int64_t)b * T * D + h * Dh, *dO = dout + (int64_t)b * T * D + h * Dh;
        float *dq = dqkv + (int64_t)b * T * ld + h * Dh, *dk = dq + D, *dv = dq + 2 * D;
        const float *l = lse + (int64_t)bh * T;

        transpose(kt, k, T, Dh, ld);
        transpose(vt, v, T, Dh, ld);
        mm(T, T, Dh, scale, q, ld, 1, kt, T, 0.0f, P, T);
        for (int i = 0; i < T; i++) {
            float *p = P + (int64_t)i * T, li = l[i];
#pragma omp simd
            for (int j = 0; j < T; j++) p[j] = expf(p[j] - li);
        }
        mm(T, Dh, T, 1.0f, P, 1, T, dO, D, 0.0f, dv, ld);   // dV = P^T dO
        mm(T, T, Dh, 1.0f, dO, D, 1, vt, T, 0.0f, dP, T);   // dP = dO V^T
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
        mm(T, Dh, T, scale, P, T, 1, k, ld, 0.0f, dq, ld);  // dQ = dS K * scale
        mm(T, Dh, T, scale, P, 1, T, q, ld, 0.0f, dk, ld);  // dK = dS^T Q * scale
    }
}
