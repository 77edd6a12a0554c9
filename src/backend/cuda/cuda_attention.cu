// Attention forward on bf16 tensor cores, FlashAttention-2 style: the
// Tq x Tk score matrix never reaches global memory. Semantics match
// src/backend/cpu/cpu_attention.c for any dc_attn_shape whose heads fit
// (Dh = Dv <= ATTN_TC_MAX_DH):
//   out[b, h, i] = softmax_j(q_i . k_j * scale + mask) v_j, keys j < Tk,
//   masked (causal) where j > i + Tk - Tq;
//   lse[b, h, i] = the natural log-sum-exp of that row of scaled scores.
// q, k, v and out are read and written in place through their strides, so
// packed qkv (DiT), separate projections and packed kv (cross-attention) all
// run without copies.
//
// mma.sync m16n8k16 (bf16 in, fp32 accumulate, fp32 softmax); Dh is padded
// to a compile-time DP (multiple of 16) with zeros in shared memory, so Dh =
// 72 (DiT-XL) runs as DP = 80 and SD's 40 as 48. Fragment layouts and tile
// helpers are in cuda_attention_tc.h; backward is cuda_attention_bwd.cu.
#include "backend/cuda/cuda_attention_tc.h"

// Block = 64 queries of one (b, h); warp w owns queries 16w..16w+15 and runs
// the whole online softmax for them in registers. K and V have one buffer
// each, loaded in separate cp.async groups so that V_j streams in during
// S = Q K_j^T and K_{j+1} during the softmax and P V_j. With a causal mask
// (CAUSAL: an instance of its own, so the DiT's unmasked hot path carries no
// mask arithmetic) the block stops at the last key its last query sees.
template <int DP, bool CAUSAL>
__global__ void __launch_bounds__(kThreads, Tune<DP>::fwd_min_blocks)
attn_fwd_bf16(const AttnParams p, float scale_log2, int vec, int pair) {
    constexpr int SST = DP + 8, NT = DP / 8, KT = DP / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sK = sQ + BT * SST, *sV = sK + BT * SST;

    const int Tq = p.Tq, Tk = p.Tk, Dh = p.Dh;
    const int ntiles = (Tq + BT - 1) / BT;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / p.H, h = bh % p.H;
    const int q0 = tile * BT;
    const bf16 *qg = (const bf16 *)p.q + b * p.qb + h * p.qh;
    const bf16 *kg = (const bf16 *)p.k + b * p.kb + h * p.kh;
    const bf16 *vg = (const bf16 *)p.v + b * p.vb + h * p.vh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = warp * 16;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;  // ldmatrix address within a 16x16 block
    const int nkt = ((CAUSAL ? attn_key_end(p, q0 + BT - 1) : Tk) + BT - 1) / BT;
    // keys visible to row g of this warp (Tk without a mask); row g + 8 sees
    // 8 more under a causal mask
    const int kend = CAUSAL ? attn_key_end(p, q0 + wrow + g) : Tk;

    load_tile<BT, DP>(sQ, qg + q0 * p.qt, p.qt, min(BT, Tq - q0), Dh, vec);
    load_tile<BT, DP>(sK, kg, p.kt, min(BT, Tk), Dh, vec);
    cp_async_commit();

    uint32_t qf[KT][4];            // this warp's Q rows as A fragments, loaded once
    float o[NT][4];                // O accumulators: rows g, g+8 x DP columns
    float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units) of rows g, g+8
    float l[2] = {0.0f, 0.0f};     // running sum, this thread's columns only
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BT;
        load_tile<BT, DP>(sV, vg + k0 * p.vt, p.vt, min(BT, Tk - k0), Dh, vec);
        cp_async_commit();
        cp_async_wait<1>();  // Q and K_j have landed; V_j may still be in flight
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < KT; kk++)
                ldsm_x4(qf[kk], smem_u32(sQ + (wrow + lrow) * SST + kk * 16 + lcol));
        }

        // S = Q K^T for 16 rows x 64 keys (8 n-tiles).
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t r[4];
                ldsm_x4(r, smem_u32(sK + (np * 16 + lrow) * SST + kk * 16 + lcol));
                mma_bf16(s[2 * np], qf[kk], r[0], r[2]);
                mma_bf16(s[2 * np + 1], qf[kk], r[1], r[3]);
            }
        }
        __syncthreads();  // every warp is done with sK
        if (j + 1 < nkt) load_tile<BT, DP>(sK, kg + (k0 + BT) * p.kt, p.kt, min(BT, Tk - k0 - BT), Dh, vec);
        cp_async_commit();  // possibly empty: keeps the group count uniform

        // Online softmax in base 2 (scale_log2 = scale * log2 e). Element
        // (n, e) is row g + 8 * (e >> 1), key k0 + 8n + 2t + (e & 1). Keys
        // past Tk or past the row's causal limit get -inf. Every row sees
        // key 0, so after the first tile the max is finite (the first tile's
        // alpha = exp2(-inf) = 0), and a later tile a row sees none of
        // leaves it unchanged.
        const bool mask = k0 + BT > kend;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[n][e] * scale_log2;
                if (mask && k0 + 8 * n + 2 * t + (e & 1) >= (e < 2 || !CAUSAL ? kend : min(Tk, kend + 8)))
                    v = -INFINITY;
                s[n][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            // The 4 lanes of a quad (same g) share the row.
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            alpha[r] = exp2f(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float pr = exp2f(s[n][e] - m[e >> 1]);
                s[n][e] = pr;
                l[e >> 1] += pr;
            }
        }

        cp_async_wait<1>();  // V_j has landed; K_{j+1} may still be in flight
        __syncthreads();
        // O += P V: k-blocks of 16 keys; V tile is [key][dh], read transposed.
        warp_pb<4, KT, SST>(o, s, sV, 0, lrow, lcol);
        __syncthreads();  // every warp is done with sV before the next load
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = q0 + wrow + g + 8 * r;
        if (row >= Tq) continue;
        const float inv = 1.0f / l[r];
        bf16 *orow = (bf16 *)p.out + b * p.ob + h * p.oh + row * p.ot;
#pragma unroll
        for (int n = 0; n < NT; n++)
            store_pair(orow, 8 * n + 2 * t, Dh, o[n][2 * r] * inv, o[n][2 * r + 1] * inv, pair);
        if (t == 0) p.lse[(int64_t)bh * Tq + row] = (m[r] + log2f(l[r])) * kLn2;
    }
}

template <int DP> static size_t fwd_smem() { return (size_t)3 * BT * (DP + 8) * sizeof(bf16); }

void dc_attn_fwd_bf16(cudaStream_t s, const AttnParams &p, bool vec, bool pair) {
    attn_dispatch_dp(p.Dh, [&]<int DP>() {
        const size_t sm = fwd_smem<DP>();
        const unsigned grid = dc_attn_grid(p.B, p.H, p.Tq, BT);
        const float sl2 = p.scale * kLog2e;
        if (p.causal) {
            allow_smem((const void *)attn_fwd_bf16<DP, true>, sm);
            attn_fwd_bf16<DP, true><<<grid, kThreads, sm, s>>>(p, sl2, vec, pair);
        } else {
            allow_smem((const void *)attn_fwd_bf16<DP, false>, sm);
            attn_fwd_bf16<DP, false><<<grid, kThreads, sm, s>>>(p, sl2, vec, pair);
        }
    });
}
