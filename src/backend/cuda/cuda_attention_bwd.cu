// Attention backward on bf16 tensor cores, FlashAttention-2 style, for the
// shapes the forward in cuda_attention.cu runs (any layout, Tq != Tk, causal,
// any scale, Dh = Dv <= ATTN_TC_MAX_DH). Two kernels, dK/dV over key tiles and
// dQ over query tiles, with no atomics: results are deterministic. Delta =
// rowsum(dO * O) is recomputed in each kernel because the op has no
// workspace for it. dq, dk, dv are written in the layouts of q, k, v.
#include "backend/cuda/cuda_attention_tc.h"

// ---- dK, dV ------------------------------------------------------------------------
// Block = 64 keys of one (b, h); warp w owns keys 16w..16w+15 and accumulates
// their dK, dV in registers over all query tiles of 64 rows. Everything is
// computed transposed (keys as rows) so no accumulator has to move between
// lanes:
//   S^T = K Q^T, P^T = exp(S^T * scale - lse[q]), dP^T = V dO^T,
//   dS^T = P^T (dP^T - Delta[q]), dV += P^T dO, dK += dS^T Q.
// Delta[q] = sum_d dO[q,d] O[q,d] is computed per query tile from an O tile.
// With a causal mask the block starts at the first query tile that sees its
// first key. CAUSAL is a template argument in both kernels, so the unmasked
// instances (the DiT's training hot path) carry no mask arithmetic.
template <int DP, bool CAUSAL>
__global__ void __launch_bounds__(kThreads, Tune<DP>::dkdv_min_blocks)
attn_bwd_dkdv_bf16(const AttnParams p, float scale_log2, int vec, int pair) {
    constexpr int SST = DP + 8, NT = DP / 8, KT = DP / 16;
    constexpr int BQ = BT;                                  // queries per tile
    constexpr int QC = Tune<DP>::dkdv_qc, CN = QC / 8;      // query chunk, its n-tiles
    constexpr int TPQ = kThreads / BQ;  // threads per query in the Delta reduction
    static_assert(BQ % QC == 0 && QC % 16 == 0, "chunks are whole k-blocks");
    static_assert(kThreads % BQ == 0 && (TPQ & (TPQ - 1)) == 0, "Delta: 2^n threads per query");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = (bf16 *)smem, *sV = sK + BT * SST, *sQ = sV + BT * SST;
    bf16 *sDO = sQ + BQ * SST, *sO = sDO + BQ * SST;
    float *sLse = (float *)(sO + BQ * SST), *sDelta = sLse + BQ;

    const int Tq = p.Tq, Tk = p.Tk, Dh = p.Dh, off = Tk - Tq;
    const int ntiles = (Tk + BT - 1) / BT;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / p.H, h = bh % p.H;
    const int k0 = tile * BT;
    const int64_t ot = p.ot;
    const bf16 *qg = (const bf16 *)p.q + b * p.qb + h * p.qh;
    const bf16 *kg = (const bf16 *)p.k + b * p.kb + h * p.kh;
    const bf16 *vg = (const bf16 *)p.v + b * p.vb + h * p.vh;
    const bf16 *og = (const bf16 *)p.o + b * p.ob + h * p.oh;
    const bf16 *dog = (const bf16 *)p.dout + b * p.ob + h * p.oh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kw = warp * 16;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;
    const int nqt = (Tq + BQ - 1) / BQ;
    // causal: query q sees key k0 once q + off >= k0
    const int qt0 = CAUSAL ? max(0, k0 - off) / BQ : 0;
    const int qs0 = qt0 * BQ;

    load_tile<BT, DP>(sK, kg + k0 * p.kt, p.kt, min(BT, Tk - k0), Dh, vec);
    load_tile<BT, DP>(sV, vg + k0 * p.vt, p.vt, min(BT, Tk - k0), Dh, vec);
    load_tile<BQ, DP>(sQ, qg + qs0 * p.qt, p.qt, min(BQ, Tq - qs0), Dh, vec);
    load_tile<BQ, DP>(sDO, dog + qs0 * ot, ot, min(BQ, Tq - qs0), Dh, vec);
    load_tile<BQ, DP>(sO, og + qs0 * ot, ot, min(BQ, Tq - qs0), Dh, vec);
    cp_async_commit();

    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int i = qt0; i < nqt; i++) {
        const int qs = i * BQ, nq = min(BQ, Tq - qs);
        cp_async_wait<0>();
        __syncthreads();
        {
            // Delta and lse (log2 units) of each query of the tile; queries
            // past Tq get lse = +inf so that their P^T is exactly 0.
            const int qi = threadIdx.x / TPQ, part = threadIdx.x % TPQ;
            float acc = 0.0f;
            for (int d = part; d < Dh; d += TPQ)
                acc = fmaf(__bfloat162float(sDO[qi * SST + d]), __bfloat162float(sO[qi * SST + d]), acc);
#pragma unroll
            for (int o = 1; o < TPQ; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (part == 0) {
                sDelta[qi] = acc;
                sLse[qi] = qi < nq ? p.lse[(int64_t)bh * Tq + qs + qi] * kLog2e : INFINITY;
            }
        }
        __syncthreads();
        // sO is free: fetch the next tile's O while this one is processed.
        if (i + 1 < nqt) load_tile<BQ, DP>(sO, og + (qs + BQ) * ot, ot, min(BQ, Tq - qs - BQ), Dh, vec);
        cp_async_commit();

        // The query columns of S^T are independent (no reduction runs over
        // queries), so the tile is processed in chunks of QC queries: only
        // QC/8 S^T and dP^T tiles are live at once, which buys occupancy.
#pragma unroll 1
        for (int qc = 0; qc < BQ; qc += QC) {
            // S^T = K Q^T: 16 keys x QC queries.
            float st[CN][4];
            warp_abt<CN, KT, SST>(st, sK, kw, sQ, qc, lrow, lcol);
            // P^T; element (n, e) is key k0 + kw + g + 8 * (e >> 1), query
            // qs + qc + 8n + 2t + (e & 1). Causal: 0 where key > query + off,
            // checked only in chunks that reach past the diagonal.
            const bool diag = CAUSAL && k0 + kw + 15 > qs + qc + off;
#pragma unroll
            for (int n = 0; n < CN; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qq = qc + 8 * n + 2 * t + (e & 1);
                    st[n][e] = diag && k0 + kw + g + 8 * (e >> 1) > qs + qq + off
                                   ? 0.0f
                                   : exp2f(st[n][e] * scale_log2 - sLse[qq]);
                }

            // dV += P^T dO: k-blocks of 16 queries; dO tile is [query][dh], read transposed.
            warp_pb<CN / 2, KT, SST>(dv, st, sDO, qc, lrow, lcol);

            // dP^T = V dO^T: 16 keys x QC queries.
            float dpt[CN][4];
            warp_abt<CN, KT, SST>(dpt, sV, kw, sDO, qc, lrow, lcol);
            // dS^T = P^T (dP^T - Delta[q]), in place.
#pragma unroll
            for (int n = 0; n < CN; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dpt[n][e] = st[n][e] * (dpt[n][e] - sDelta[qc + 8 * n + 2 * t + (e & 1)]);

            // dK += dS^T Q: Q tile is [query][dh], read transposed.
            warp_pb<CN / 2, KT, SST>(dk, dpt, sQ, qc, lrow, lcol);
        }
        __syncthreads();  // every warp is done with sQ, sDO, sLse, sDelta
        if (i + 1 < nqt) {
            const int nn = min(BQ, Tq - qs - BQ);
            load_tile<BQ, DP>(sQ, qg + (qs + BQ) * p.qt, p.qt, nn, Dh, vec);
            load_tile<BQ, DP>(sDO, dog + (qs + BQ) * ot, ot, nn, Dh, vec);
        }
        cp_async_commit();
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = k0 + kw + g + 8 * r;
        if (key >= Tk) continue;
        bf16 *dkrow = (bf16 *)p.dk + b * p.kb + h * p.kh + key * p.kt;
        bf16 *dvrow = (bf16 *)p.dv + b * p.vb + h * p.vh + key * p.vt;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int col = 8 * n + 2 * t;
            store_pair(dkrow, col, Dh, dk[n][2 * r] * p.scale, dk[n][2 * r + 1] * p.scale, pair);
            store_pair(dvrow, col, Dh, dv[n][2 * r], dv[n][2 * r + 1], pair);
        }
    }
}

// ---- dQ ------------------------------------------------------------------------------
// Block = 64 queries of one (b, h); warp w owns queries 16w..16w+15 and
// accumulates their dQ over the key tiles they see:
//   S = Q K^T, P = exp(S * scale - lse), dP = dO V^T, dS = P (dP - Delta),
//   dQ += dS K.
template <int DP, bool CAUSAL>
__global__ void __launch_bounds__(kThreads, Tune<DP>::dq_min_blocks)
attn_bwd_dq_bf16(const AttnParams p, float scale_log2, int vec, int pair) {
    constexpr int SST = DP + 8, NT = DP / 8, KT = DP / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sDO = sQ + BT * SST, *sK = sDO + BT * SST, *sV = sK + BT * SST;
    float *sLse = (float *)(sV + BT * SST), *sDelta = sLse + BT;

    const int Tq = p.Tq, Tk = p.Tk, Dh = p.Dh;
    const int ntiles = (Tq + BT - 1) / BT;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / p.H, h = bh % p.H;
    const int q0 = tile * BT, nq = min(BT, Tq - q0);
    const int64_t ot = p.ot;
    const bf16 *qg = (const bf16 *)p.q + b * p.qb + h * p.qh;
    const bf16 *kg = (const bf16 *)p.k + b * p.kb + h * p.kh;
    const bf16 *vg = (const bf16 *)p.v + b * p.vb + h * p.vh;
    const bf16 *og = (const bf16 *)p.o + b * p.ob + h * p.oh;
    const bf16 *dog = (const bf16 *)p.dout + b * p.ob + h * p.oh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = warp * 16;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;
    const int nkt = ((CAUSAL ? attn_key_end(p, q0 + BT - 1) : Tk) + BT - 1) / BT;
    // keys visible to row g of this warp; row g + 8 sees 8 more under a causal mask
    const int kend = CAUSAL ? attn_key_end(p, q0 + wrow + g) : Tk;

    // Prologue: the O tile is only needed for Delta, so it borrows sK.
    load_tile<BT, DP>(sQ, qg + q0 * p.qt, p.qt, nq, Dh, vec);
    load_tile<BT, DP>(sDO, dog + q0 * ot, ot, nq, Dh, vec);
    load_tile<BT, DP>(sK, og + q0 * ot, ot, nq, Dh, vec);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    {
        const int qi = threadIdx.x >> 1, part = threadIdx.x & 1;  // 2 threads per query
        float acc = 0.0f;
        for (int d = part; d < Dh; d += 2)
            acc = fmaf(__bfloat162float(sDO[qi * SST + d]), __bfloat162float(sK[qi * SST + d]), acc);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (part == 0) {
            sDelta[qi] = acc;
            sLse[qi] = qi < nq ? p.lse[(int64_t)bh * Tq + q0 + qi] * kLog2e : 0.0f;  // rows past Tq: unused
        }
    }
    __syncthreads();
    float rlse[2], rdelta[2];  // rows g, g+8 of this warp
#pragma unroll
    for (int r = 0; r < 2; r++) {
        rlse[r] = sLse[wrow + g + 8 * r];
        rdelta[r] = sDelta[wrow + g + 8 * r];
    }
    load_tile<BT, DP>(sK, kg, p.kt, min(BT, Tk), Dh, vec);
    load_tile<BT, DP>(sV, vg, p.vt, min(BT, Tk), Dh, vec);
    cp_async_commit();

    float dq[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BT;
        cp_async_wait<0>();
        __syncthreads();

        // Keys are independent up to the dQ accumulation, so the tile is
        // processed in two chunks of 32 keys: only 4 S and 4 dP tiles are
        // live at once, which buys occupancy.
#pragma unroll 1
        for (int kc = 0; kc < BT; kc += 32) {
            // S = Q K^T: 16 queries x 32 keys.
            float s[4][4];
            warp_abt<4, KT, SST>(s, sQ, wrow, sK, kc, lrow, lcol);
            // P; element (n, e) is row g + 8 * (e >> 1), key k0 + kc + 8n + 2t + (e & 1).
            // Keys past the row's end (Tk, or its causal limit) are masked:
            // zero-filled keys would give exp(-lse) != 0.
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] = k0 + kc + 8 * n + 2 * t + (e & 1) < (e < 2 || !CAUSAL ? kend : min(Tk, kend + 8))
                                  ? exp2f(s[n][e] * scale_log2 - rlse[e >> 1])
                                  : 0.0f;

            // dP = dO V^T: V tile [key][dh] is the B operand as stored.
            float dp[4][4];
            warp_abt<4, KT, SST>(dp, sDO, wrow, sV, kc, lrow, lcol);
            // dS = P (dP - Delta), in place.
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) dp[n][e] = s[n][e] * (dp[n][e] - rdelta[e >> 1]);

            // dQ += dS K: K tile [key][dh], read transposed.
            warp_pb<2, KT, SST>(dq, dp, sK, kc, lrow, lcol);
        }
        __syncthreads();  // every warp is done with sK, sV
        if (j + 1 < nkt) {
            const int nk = min(BT, Tk - k0 - BT);
            load_tile<BT, DP>(sK, kg + (k0 + BT) * p.kt, p.kt, nk, Dh, vec);
            load_tile<BT, DP>(sV, vg + (k0 + BT) * p.vt, p.vt, nk, Dh, vec);
        }
        cp_async_commit();
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = q0 + wrow + g + 8 * r;
        if (row >= Tq) continue;
        bf16 *dqrow = (bf16 *)p.dq + b * p.qb + h * p.qh + row * p.qt;
#pragma unroll
        for (int n = 0; n < NT; n++)
            store_pair(dqrow, 8 * n + 2 * t, Dh, dq[n][2 * r] * p.scale, dq[n][2 * r + 1] * p.scale, pair);
    }
}

// Shared memory of each kernel, in bytes.
template <int DP> static size_t dkdv_smem() {
    return (size_t)5 * BT * (DP + 8) * sizeof(bf16) + 2 * BT * sizeof(float);
}
template <int DP> static size_t dq_smem() {
    return (size_t)4 * BT * (DP + 8) * sizeof(bf16) + 2 * BT * sizeof(float);
}

bool dc_attn_bwd_bf16_fits(int Dh) {
    static int optin[64];  // each device's, asked once (every backward call asks)
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return cudaGetLastError(), false;
    if (!optin[dev] &&
        cudaDeviceGetAttribute(&optin[dev], cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return optin[dev] = 0, cudaGetLastError(), false;
    size_t most = 0;
    attn_dispatch_dp(Dh, [&]<int DP>() { most = dkdv_smem<DP>() > dq_smem<DP>() ? dkdv_smem<DP>() : dq_smem<DP>(); });
    return most <= (size_t)optin[dev];
}

void dc_attn_bwd_bf16(cudaStream_t s, const AttnParams &p, bool vec, bool pair) {
    attn_dispatch_dp(p.Dh, [&]<int DP>() {
        const size_t sm1 = dkdv_smem<DP>(), sm2 = dq_smem<DP>();
        const unsigned gk = dc_attn_grid(p.B, p.H, p.Tk, BT), gq = dc_attn_grid(p.B, p.H, p.Tq, BT);
        const float sl2 = p.scale * kLog2e;
        if (p.causal) {
            allow_smem((const void *)attn_bwd_dkdv_bf16<DP, true>, sm1);
            allow_smem((const void *)attn_bwd_dq_bf16<DP, true>, sm2);
            attn_bwd_dkdv_bf16<DP, true><<<gk, kThreads, sm1, s>>>(p, sl2, vec, pair);
            attn_bwd_dq_bf16<DP, true><<<gq, kThreads, sm2, s>>>(p, sl2, vec, pair);
        } else {
            allow_smem((const void *)attn_bwd_dkdv_bf16<DP, false>, sm1);
            allow_smem((const void *)attn_bwd_dq_bf16<DP, false>, sm2);
            attn_bwd_dkdv_bf16<DP, false><<<gk, kThreads, sm1, s>>>(p, sl2, vec, pair);
            attn_bwd_dq_bf16<DP, false><<<gq, kThreads, sm2, s>>>(p, sl2, vec, pair);
        }
    });
}
