// Attention in plain fp32 FMA arithmetic (warp per row, K/V staged in shared
// memory, online softmax; backward as a dK/dV kernel and a dQ kernel, no
// atomics), for the cuda-fp32 backend's checking runs: any layout, Tq != Tk,
// causal, any scale, Dh = Dv <= ATTN_F32_MAX_DH. Exact enough to check the
// engine against the CPU at 1e-4; not fast. Semantics as in cuda_attention.cu.
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
#define F_LD (ATTN_F32_MAX_DH + 1)     // padded row stride of chunk tiles
#define F_NC (ATTN_F32_MAX_DH / 32)    // accumulator columns per lane

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
attn_fwd_f32(const AttnParams p) {
    __shared__ float sQ[F_FROWS][ATTN_F32_MAX_DH];
    __shared__ float sK[F_CHUNK][F_LD];
    __shared__ float sV[F_CHUNK][F_LD];

    const int Tq = p.Tq, Dh = p.Dh;
    const float scale = p.scale;
    const int ntiles = (Tq + F_FROWS - 1) / F_FROWS;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / p.H, h = bh % p.H;
    const int q0 = tile * F_FROWS;
    const float *qg = (const float *)p.q + b * p.qb + h * p.qh;
    const float *kg = (const float *)p.k + b * p.kb + h * p.kh;
    const float *vg = (const float *)p.v + b * p.vb + h * p.vh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr = warp * F_FR;  // this warp's first row within the block
    const int kend_block = attn_key_end(p, q0 + F_FROWS - 1);

    for (int e = threadIdx.x; e < F_FROWS * Dh; e += kThreads) {
        const int r = e / Dh, d = e % Dh;
        sQ[r][d] = q0 + r < Tq ? qg[(q0 + r) * p.qt + d] : 0.0f;
    }

    float m[F_FR], l[F_FR], o[F_FR][F_NC];
#pragma unroll
    for (int r = 0; r < F_FR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < F_NC; c++) o[r][c] = 0.0f;
    }

    for (int k0 = 0; k0 < kend_block; k0 += F_CHUNK) {
        __syncthreads();  // previous chunk fully consumed (and sQ written, first time)
        for (int e = threadIdx.x; e < F_CHUNK * Dh; e += kThreads) {
            const int j = e / Dh, d = e % Dh;
            const bool ok = k0 + j < p.Tk;
            sK[j][d] = ok ? kg[(k0 + j) * p.kt + d] : 0.0f;
            sV[j][d] = ok ? vg[(k0 + j) * p.vt + d] : 0.0f;
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

        // Online softmax; keys past Tk or the row's causal limit get -inf.
        // Every row sees key 0, so after the first chunk the running max is
        // finite and exp(-inf - max) cleanly gives 0.
        float pr[F_FR];
#pragma unroll
        for (int r = 0; r < F_FR; r++) {
            const float s = k0 + lane < attn_key_end(p, q0 + wr + r) ? sc[r] * scale : -INFINITY;
            const float mnew = fmaxf(m[r], dc_warp_max(s));
            const float alpha = expf(m[r] - mnew);
            pr[r] = expf(s - mnew);
            l[r] = l[r] * alpha + dc_warp_sum(pr[r]);
            m[r] = mnew;
#pragma unroll
            for (int c = 0; c < F_NC; c++) o[r][c] *= alpha;
        }

        // o[r][d] += sum_j p_j v_j[d]; invalid keys have p = 0 and v = 0.
        warp_accumulate<F_FR>(o, pr, sV, lane, Dh);
    }

#pragma unroll
    for (int r = 0; r < F_FR; r++) {
        const int row = q0 + wr + r;
        if (row >= Tq) continue;
        float *orow = (float *)p.out + b * p.ob + h * p.oh + row * p.ot;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int c = 0; c < F_NC; c++)
            if (lane + 32 * c < Dh) orow[lane + 32 * c] = o[r][c] * inv;
        if (lane == 0) p.lse[(int64_t)bh * Tq + row] = m[r] + logf(l[r]);
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
attn_bwd_dkdv_f32(const AttnParams p) {
    __shared__ float sQ[F_CHUNK][F_LD];
    __shared__ float sDO[F_CHUNK][F_LD];
    __shared__ float sK[F_BROWS][ATTN_F32_MAX_DH];
    __shared__ float sV[F_BROWS][ATTN_F32_MAX_DH];
    __shared__ float sLse[F_CHUNK], sDelta[F_CHUNK];

    const int Tq = p.Tq, Tk = p.Tk, Dh = p.Dh, off = Tk - Tq;
    const float scale = p.scale;
    const int ntiles = (Tk + F_BROWS - 1) / F_BROWS;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / p.H, h = bh % p.H;
    const int k0 = tile * F_BROWS;
    const int64_t ot = p.ot;
    const float *qg = (const float *)p.q + b * p.qb + h * p.qh;
    const float *kg = (const float *)p.k + b * p.kb + h * p.kh;
    const float *vg = (const float *)p.v + b * p.vb + h * p.vh;
    const float *og = (const float *)p.o + b * p.ob + h * p.oh;
    const float *dog = (const float *)p.dout + b * p.ob + h * p.oh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wk = warp * F_BR;  // this warp's first key within the block
    // causal: query q sees key k0 once q + off >= k0
    const int qstart = p.causal ? max(0, k0 - off) / F_CHUNK * F_CHUNK : 0;

    for (int e = threadIdx.x; e < F_BROWS * Dh; e += kThreads) {
        const int j = e / Dh, d = e % Dh;
        const bool ok = k0 + j < Tk;
        sK[j][d] = ok ? kg[(k0 + j) * p.kt + d] : 0.0f;
        sV[j][d] = ok ? vg[(k0 + j) * p.vt + d] : 0.0f;
    }

    float dk[F_BR][F_NC], dv[F_BR][F_NC];
#pragma unroll
    for (int r = 0; r < F_BR; r++)
#pragma unroll
        for (int c = 0; c < F_NC; c++) dk[r][c] = dv[r][c] = 0.0f;

    for (int qs = qstart; qs < Tq; qs += F_CHUNK) {
        __syncthreads();  // previous chunk fully consumed
        for (int e = threadIdx.x; e < F_CHUNK * Dh; e += kThreads) {
            const int i = e / Dh, d = e % Dh;
            const bool ok = qs + i < Tq;
            sQ[i][d] = ok ? qg[(qs + i) * p.qt + d] : 0.0f;
            sDO[i][d] = ok ? dog[(qs + i) * ot + d] : 0.0f;
        }
        // Each warp computes Delta and loads lse for 8 of the 32 queries.
        // Queries past Tq get lse = +inf so that their P is exactly 0.
        for (int i = warp * 8; i < warp * 8 + 8; i++) {
            const int q = qs + i;
            const float dl = q < Tq ? delta_f32(dog + q * ot, og + q * ot, Dh) : 0.0f;
            if (lane == 0) {
                sDelta[i] = dl;
                sLse[i] = q < Tq ? p.lse[(int64_t)bh * Tq + q] : INFINITY;
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
        // causal: no probability where key > query + off
        float pr[F_BR], ds[F_BR];
#pragma unroll
        for (int r = 0; r < F_BR; r++) {
            const bool masked = p.causal && k0 + wk + r > qs + lane + off;
            pr[r] = masked ? 0.0f : expf(sc[r] * scale - sLse[lane]);
            ds[r] = pr[r] * (dp[r] - sDelta[lane]);
        }

        // dv[d] += sum_i p_i dO_i[d]; dk[d] += sum_i ds_i q_i[d].
        warp_accumulate<F_BR>(dv, pr, sDO, lane, Dh);
        warp_accumulate<F_BR>(dk, ds, sQ, lane, Dh);
    }

#pragma unroll
    for (int r = 0; r < F_BR; r++) {
        const int key = k0 + wk + r;
        if (key >= Tk) continue;
        float *dkrow = (float *)p.dk + b * p.kb + h * p.kh + key * p.kt;
        float *dvrow = (float *)p.dv + b * p.vb + h * p.vh + key * p.vt;
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
attn_bwd_dq_f32(const AttnParams p) {
    __shared__ float sK[F_CHUNK][F_LD];
    __shared__ float sV[F_CHUNK][F_LD];
    __shared__ float sQ[F_BROWS][ATTN_F32_MAX_DH];
    __shared__ float sDO[F_BROWS][ATTN_F32_MAX_DH];

    const int Tq = p.Tq, Tk = p.Tk, Dh = p.Dh;
    const float scale = p.scale;
    const int ntiles = (Tq + F_BROWS - 1) / F_BROWS;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / p.H, h = bh % p.H;
    const int q0 = tile * F_BROWS;
    const int64_t ot = p.ot;
    const float *qg = (const float *)p.q + b * p.qb + h * p.qh;
    const float *kg = (const float *)p.k + b * p.kb + h * p.kh;
    const float *vg = (const float *)p.v + b * p.vb + h * p.vh;
    const float *og = (const float *)p.o + b * p.ob + h * p.oh;
    const float *dog = (const float *)p.dout + b * p.ob + h * p.oh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wr = warp * F_BR;
    const int kend_block = attn_key_end(p, q0 + F_BROWS - 1);

    for (int e = threadIdx.x; e < F_BROWS * Dh; e += kThreads) {
        const int r = e / Dh, d = e % Dh;
        const bool ok = q0 + r < Tq;
        sQ[r][d] = ok ? qg[(q0 + r) * p.qt + d] : 0.0f;
        sDO[r][d] = ok ? dog[(q0 + r) * ot + d] : 0.0f;
    }
    // Per-row constants, identical in every lane (warp_sum broadcasts).
    float rlse[F_BR], rdelta[F_BR];
    int rend[F_BR];  // keys each row sees
#pragma unroll
    for (int r = 0; r < F_BR; r++) {
        const int q = q0 + wr + r;
        rdelta[r] = q < Tq ? delta_f32(dog + q * ot, og + q * ot, Dh) : 0.0f;
        rlse[r] = q < Tq ? p.lse[(int64_t)bh * Tq + q] : 0.0f;
        rend[r] = attn_key_end(p, q);
    }

    float dq[F_BR][F_NC];
#pragma unroll
    for (int r = 0; r < F_BR; r++)
#pragma unroll
        for (int c = 0; c < F_NC; c++) dq[r][c] = 0.0f;

    for (int k0 = 0; k0 < kend_block; k0 += F_CHUNK) {
        __syncthreads();
        for (int e = threadIdx.x; e < F_CHUNK * Dh; e += kThreads) {
            const int j = e / Dh, d = e % Dh;
            const bool ok = k0 + j < Tk;
            sK[j][d] = ok ? kg[(k0 + j) * p.kt + d] : 0.0f;
            sV[j][d] = ok ? vg[(k0 + j) * p.vt + d] : 0.0f;
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
        // Keys past the row's end (Tk, or its causal limit) are masked:
        // zero-filled keys would give P = exp(-lse) != 0.
        float ds[F_BR];
#pragma unroll
        for (int r = 0; r < F_BR; r++) {
            const float pr = k0 + lane < rend[r] ? expf(sc[r] * scale - rlse[r]) : 0.0f;
            ds[r] = pr * (dp[r] - rdelta[r]);
        }

        warp_accumulate<F_BR>(dq, ds, sK, lane, Dh);
    }

#pragma unroll
    for (int r = 0; r < F_BR; r++) {
        const int q = q0 + wr + r;
        if (q >= Tq) continue;
        float *dqrow = (float *)p.dq + b * p.qb + h * p.qh + q * p.qt;
#pragma unroll
        for (int c = 0; c < F_NC; c++)
            if (lane + 32 * c < Dh) dqrow[lane + 32 * c] = dq[r][c] * scale;
    }
}


void dc_attn_fwd_f32(cudaStream_t s, const AttnParams &p) {
    attn_fwd_f32<<<dc_attn_grid(p.B, p.H, p.Tq, F_FROWS), kThreads, 0, s>>>(p);
}

void dc_attn_bwd_f32(cudaStream_t s, const AttnParams &p) {
    attn_bwd_dkdv_f32<<<dc_attn_grid(p.B, p.H, p.Tk, F_BROWS), kThreads, 0, s>>>(p);
    attn_bwd_dq_f32<<<dc_attn_grid(p.B, p.H, p.Tq, F_BROWS), kThreads, 0, s>>>(p);
}
