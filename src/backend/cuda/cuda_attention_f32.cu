// Multi-head self-attention in plain fp32 FMA arithmetic (warp per row, K/V
// staged in shared memory, online softmax; backward as a dK/dV kernel and a dQ
// kernel, no atomics). Exact enough to check the engine against the CPU at
// 1e-4; not fast. Semantics as in cuda_attention.cu.
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_common.h"

// Each lane owns head-dim columns lane, lane+32, lane+64, lane+96 of the
// accumulators (hence Dh <= 128), and, in the score phase, one key (or one
// query) of a 32-wide chunk. Chunk rows in shared memory have an odd stride
// (Dh_max + 1) so that 32 lanes reading column d of 32 different rows hit 32
// different banks.
#define F_CHUNK 32                 // keys (or queries) per shared-memory chunk
#define F_LD (ATTN_MAX_DH + 1)     // padded row stride of chunk tiles
#define F_NC (ATTN_MAX_DH / 32)    // accumulator columns per lane

// acc[r][c] += sum_j coef_j(r) tile[j][lane + 32c] over a chunk of F_CHUNK
// rows: lane j holds coef[r] for chunk row j, broadcast by shuffles. The
// product every kernel ends with (P V, dS K, P^T dO, dS^T Q).
template <int R>
__device__ __forceinline__ void warp_accumulate(float (&acc)[R][F_NC], const float (&coef)[R],
                                                const float (*tile)[F_LD], int lane, int Dh) {
#pragma unroll 4
    for (int j = 0; j < F_CHUNK; j++) {
        float cj[R];
#pragma unroll
        for (int r = 0; r < R; r++) cj[r] = __shfl_sync(0xffffffffu, coef[r], j);
#pragma unroll
        for (int c = 0; c < F_NC; c++) {
            if (lane + 32 * c < Dh) {
                const float v = tile[j][lane + 32 * c];
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][c] = fmaf(cj[r], v, acc[r][c]);
            }
        }
    }
}

// Forward: a block handles 4 warps x F_FR query rows; a warp keeps F_FR rows
// in flight so each K/V value read from shared memory serves several rows.
#define F_FR 4
#define F_FROWS (4 * F_FR)

__global__ void __launch_bounds__(kThreads)
attn_fwd_f32(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ qkv,
             int T, int D, int H, int Dh, float scale) {
    __shared__ float sQ[F_FROWS][ATTN_MAX_DH];
    __shared__ float sK[F_CHUNK][F_LD];
    __shared__ float sV[F_CHUNK][F_LD];

    const int ntiles = (T + F_FROWS - 1) / F_FROWS;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / H, h = bh % H;
    const int q0 = tile * F_FROWS;
    const int64_t ld = 3 * (int64_t)D;
    const float *qg = qkv + (int64_t)b * T * ld + (int64_t)h * Dh, *kg = qg + D, *vg = qg + 2 * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr = warp * F_FR;  // this warp's first row within the block

    for (int e = threadIdx.x; e < F_FROWS * Dh; e += kThreads) {
        const int r = e / Dh, d = e % Dh;
        sQ[r][d] = q0 + r < T ? qg[(q0 + r) * ld + d] : 0.0f;
    }

    float m[F_FR], l[F_FR], o[F_FR][F_NC];
#pragma unroll
    for (int r = 0; r < F_FR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < F_NC; c++) o[r][c] = 0.0f;
    }

    for (int k0 = 0; k0 < T; k0 += F_CHUNK) {
        __syncthreads();  // previous chunk fully consumed (and sQ written, first time)
        for (int e = threadIdx.x; e < F_CHUNK * Dh; e += kThreads) {
            const int j = e / Dh, d = e % Dh;
            const bool ok = k0 + j < T;
            sK[j][d] = ok ? kg[(k0 + j) * ld + d] : 0.0f;
            sV[j][d] = ok ? vg[(k0 + j) * ld + d] : 0.0f;
        }
        __syncthreads();

        // Lane = key k0 + lane: its dot product with each of the warp's rows.
        float sc[F_FR];
#pragma unroll
        for (int r = 0; r < F_FR; r++) sc[r] = 0.0f;
        for (int d = 0; d < Dh; d++) {
            const float kv = sK[lane][d];
#pragma unroll
            for (int r = 0; r < F_FR; r++) sc[r] = fmaf(sQ[wr + r][d], kv, sc[r]);
        }
        const bool key_ok = k0 + lane < T;

        // Online softmax. Every chunk holds at least one valid key, so the new
        // running max is finite and exp(-inf - max) cleanly gives 0.
        float p[F_FR];
#pragma unroll
        for (int r = 0; r < F_FR; r++) {
            const float s = key_ok ? sc[r] * scale : -INFINITY;
            const float mnew = fmaxf(m[r], dc_warp_max(s));
            const float alpha = expf(m[r] - mnew);
            p[r] = expf(s - mnew);
            l[r] = l[r] * alpha + dc_warp_sum(p[r]);
            m[r] = mnew;
#pragma unroll
            for (int c = 0; c < F_NC; c++) o[r][c] *= alpha;
        }

        // o[r][d] += sum_j p_j v_j[d]; invalid keys have p = 0 and v = 0.
        warp_accumulate<F_FR>(o, p, sV, lane, Dh);
    }

#pragma unroll
    for (int r = 0; r < F_FR; r++) {
        const int row = q0 + wr + r;
        if (row >= T) continue;
        float *orow = out + ((int64_t)b * T + row) * D + (int64_t)h * Dh;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int c = 0; c < F_NC; c++)
            if (lane + 32 * c < Dh) orow[lane + 32 * c] = o[r][c] * inv;
        if (lane == 0) lse[(int64_t)bh * T + row] = m[r] + logf(l[r]);
    }
}

// Backward dK/dV: a block handles 4 warps x F_BR keys and loops over all
// queries in chunks of 32 (lane = query). Small F_BR keeps the static shared
// memory under 48 KB at Dh = 128.
#define F_BR 2
#define F_BROWS (4 * F_BR)

// Delta[q] = sum_d dO[q,d] O[q,d] for one query, reduced over the warp.
__device__ __forceinline__ float delta_f32(const float *dorow, const float *orow, int Dh) {
    float acc = 0.0f;
    for (int d = threadIdx.x & 31; d < Dh; d += 32) acc = fmaf(dorow[d], orow[d], acc);
    return dc_warp_sum(acc);
}

__global__ void __launch_bounds__(kThreads)
attn_bwd_dkdv_f32(float *__restrict__ dqkv, const float *__restrict__ dout,
                  const float *__restrict__ qkv, const float *__restrict__ out,
                  const float *__restrict__ lse, int T, int D, int H, int Dh, float scale) {
    __shared__ float sQ[F_CHUNK][F_LD];
    __shared__ float sDO[F_CHUNK][F_LD];
    __shared__ float sK[F_BROWS][ATTN_MAX_DH];
    __shared__ float sV[F_BROWS][ATTN_MAX_DH];
    __shared__ float sLse[F_CHUNK], sDelta[F_CHUNK];

    const int ntiles = (T + F_BROWS - 1) / F_BROWS;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / H, h = bh % H;
    const int k0 = tile * F_BROWS;
    const int64_t ld = 3 * (int64_t)D;
    const float *qg = qkv + (int64_t)b * T * ld + (int64_t)h * Dh, *kg = qg + D, *vg = qg + 2 * D;
    const float *og = out + (int64_t)b * T * D + (int64_t)h * Dh;
    const float *dog = dout + (int64_t)b * T * D + (int64_t)h * Dh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wk = warp * F_BR;  // this warp's first key within the block

    for (int e = threadIdx.x; e < F_BROWS * Dh; e += kThreads) {
        const int j = e / Dh, d = e % Dh;
        const bool ok = k0 + j < T;
        sK[j][d] = ok ? kg[(k0 + j) * ld + d] : 0.0f;
        sV[j][d] = ok ? vg[(k0 + j) * ld + d] : 0.0f;
    }

    float dk[F_BR][F_NC], dv[F_BR][F_NC];
#pragma unroll
    for (int r = 0; r < F_BR; r++)
#pragma unroll
        for (int c = 0; c < F_NC; c++) dk[r][c] = dv[r][c] = 0.0f;

    for (int qs = 0; qs < T; qs += F_CHUNK) {
        __syncthreads();  // previous chunk fully consumed
        for (int e = threadIdx.x; e < F_CHUNK * Dh; e += kThreads) {
            const int i = e / Dh, d = e % Dh;
            const bool ok = qs + i < T;
            sQ[i][d] = ok ? qg[(qs + i) * ld + d] : 0.0f;
            sDO[i][d] = ok ? dog[(int64_t)(qs + i) * D + d] : 0.0f;
        }
        // Each warp computes Delta and loads lse for 8 of the 32 queries.
        // Queries past T get lse = +inf so that their P is exactly 0.
        for (int i = warp * 8; i < warp * 8 + 8; i++) {
            const int q = qs + i;
            const float dl = q < T ? delta_f32(dog + (int64_t)q * D, og + (int64_t)q * D, Dh) : 0.0f;
            if (lane == 0) {
                sDelta[i] = dl;
                sLse[i] = q < T ? lse[(int64_t)bh * T + q] : INFINITY;
            }
        }
        __syncthreads();

        // Lane = query qs + lane against each of the warp's keys.
        float sc[F_BR], dp[F_BR];
#pragma unroll
        for (int r = 0; r < F_BR; r++) sc[r] = dp[r] = 0.0f;
        for (int d = 0; d < Dh; d++) {
            const float qv = sQ[lane][d], dov = sDO[lane][d];
#pragma unroll
            for (int r = 0; r < F_BR; r++) {
                sc[r] = fmaf(qv, sK[wk + r][d], sc[r]);
                dp[r] = fmaf(dov, sV[wk + r][d], dp[r]);
            }
        }
        float p[F_BR], ds[F_BR];
#pragma unroll
        for (int r = 0; r < F_BR; r++) {
            p[r] = expf(sc[r] * scale - sLse[lane]);
            ds[r] = p[r] * (dp[r] - sDelta[lane]);
        }

        // dv[d] += sum_i p_i dO_i[d]; dk[d] += sum_i ds_i q_i[d].
        warp_accumulate<F_BR>(dv, p, sDO, lane, Dh);
        warp_accumulate<F_BR>(dk, ds, sQ, lane, Dh);
    }

#pragma unroll
    for (int r = 0; r < F_BR; r++) {
        const int key = k0 + wk + r;
        if (key >= T) continue;
        float *dkrow = dqkv + ((int64_t)b * T + key) * ld + D + (int64_t)h * Dh;
        float *dvrow = dkrow + D;
#pragma unroll
        for (int c = 0; c < F_NC; c++) {
            if (lane + 32 * c < Dh) {
                dkrow[lane + 32 * c] = dk[r][c] * scale;
                dvrow[lane + 32 * c] = dv[r][c];
            }
        }
    }
}

// Backward dQ: a block handles 4 warps x F_BR query rows and loops over all
// keys in chunks of 32 (lane = key).
__global__ void __launch_bounds__(kThreads)
attn_bwd_dq_f32(float *__restrict__ dqkv, const float *__restrict__ dout,
                const float *__restrict__ qkv, const float *__restrict__ out,
                const float *__restrict__ lse, int T, int D, int H, int Dh, float scale) {
    __shared__ float sK[F_CHUNK][F_LD];
    __shared__ float sV[F_CHUNK][F_LD];
    __shared__ float sQ[F_BROWS][ATTN_MAX_DH];
    __shared__ float sDO[F_BROWS][ATTN_MAX_DH];

    const int ntiles = (T + F_BROWS - 1) / F_BROWS;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / H, h = bh % H;
    const int q0 = tile * F_BROWS;
    const int64_t ld = 3 * (int64_t)D;
    const float *qg = qkv + (int64_t)b * T * ld + (int64_t)h * Dh, *kg = qg + D, *vg = qg + 2 * D;
    const float *og = out + (int64_t)b * T * D + (int64_t)h * Dh;
    const float *dog = dout + (int64_t)b * T * D + (int64_t)h * Dh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr = warp * F_BR;

    for (int e = threadIdx.x; e < F_BROWS * Dh; e += kThreads) {
        const int r = e / Dh, d = e % Dh;
        const bool ok = q0 + r < T;
        sQ[r][d] = ok ? qg[(q0 + r) * ld + d] : 0.0f;
        sDO[r][d] = ok ? dog[(int64_t)(q0 + r) * D + d] : 0.0f;
    }
    // Per-row constants, identical in every lane (warp_sum broadcasts).
    float rlse[F_BR], rdelta[F_BR];
#pragma unroll
    for (int r = 0; r < F_BR; r++) {
        const int q = q0 + wr + r;
        rdelta[r] = q < T ? delta_f32(dog + (int64_t)q * D, og + (int64_t)q * D, Dh) : 0.0f;
        rlse[r] = q < T ? lse[(int64_t)bh * T + q] : 0.0f;
    }

    float dq[F_BR][F_NC];
#pragma unroll
    for (int r = 0; r < F_BR; r++)
#pragma unroll
        for (int c = 0; c < F_NC; c++) dq[r][c] = 0.0f;

    for (int k0 = 0; k0 < T; k0 += F_CHUNK) {
        __syncthreads();
        for (int e = threadIdx.x; e < F_CHUNK * Dh; e += kThreads) {
            const int j = e / Dh, d = e % Dh;
            const bool ok = k0 + j < T;
            sK[j][d] = ok ? kg[(k0 + j) * ld + d] : 0.0f;
            sV[j][d] = ok ? vg[(k0 + j) * ld + d] : 0.0f;
        }
        __syncthreads();

        float sc[F_BR], dp[F_BR];
#pragma unroll
        for (int r = 0; r < F_BR; r++) sc[r] = dp[r] = 0.0f;
        for (int d = 0; d < Dh; d++) {
            const float kv = sK[lane][d], vv = sV[lane][d];
#pragma unroll
            for (int r = 0; r < F_BR; r++) {
                sc[r] = fmaf(sQ[wr + r][d], kv, sc[r]);
                dp[r] = fmaf(sDO[wr + r][d], vv, dp[r]);
            }
        }
        // Keys past T are zero-filled, which would give P = exp(-lse) != 0:
        // mask them explicitly.
        const bool key_ok = k0 + lane < T;
        float ds[F_BR];
#pragma unroll
        for (int r = 0; r < F_BR; r++) {
            const float p = key_ok ? expf(sc[r] * scale - rlse[r]) : 0.0f;
            ds[r] = p * (dp[r] - rdelta[r]);
        }

        warp_accumulate<F_BR>(dq, ds, sK, lane, Dh);
    }

#pragma unroll
    for (int r = 0; r < F_BR; r++) {
        const int q = q0 + wr + r;
        if (q >= T) continue;
        float *dqrow = dqkv + ((int64_t)b * T + q) * ld + (int64_t)h * Dh;
#pragma unroll
        for (int c = 0; c < F_NC; c++)
            if (lane + 32 * c < Dh) dqrow[lane + 32 * c] = dq[r][c] * scale;
    }
}


void dc_cuda_attn_fwd_f32(cudaStream_t s, float *out, float *lse, const float *qkv, int B, int T, int D, int H) {
    const int Dh = D / H;
    attn_fwd_f32<<<dc_attn_grid(B, H, T, F_FROWS), kThreads, 0, s>>>(out, lse, qkv, T, D, H, Dh,
                                                                    1.0f / sqrtf((float)Dh));
}

void dc_cuda_attn_bwd_f32(cudaStream_t s, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int D, int H) {
    const int Dh = D / H;
    const float scale = 1.0f / sqrtf((float)Dh);
    attn_bwd_dkdv_f32<<<dc_attn_grid(B, H, T, F_BROWS), kThreads, 0, s>>>(dqkv, dout, qkv, out, lse, T, D, H, Dh,
                                                                         scale);
    attn_bwd_dq_f32<<<dc_attn_grid(B, H, T, F_BROWS), kThreads, 0, s>>>(dqkv, dout, qkv, out, lse, T, D, H, Dh,
                                                                       scale);
}
