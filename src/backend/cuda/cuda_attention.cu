// Multi-head self-attention, forward and backward, FlashAttention-2 style:
// the T x T score matrix never reaches global memory. Semantics match
// src/backend/cpu/cpu_attention.c:
//   qkv[B,T,3D] = [q | k | v] per token, each H heads of Dh = D/H columns;
//   out[B,T,D]  = softmax(q k^T * scale) v per head, scale = 1/sqrt(Dh);
//   lse[B,H,T]  = natural log-sum-exp of each row of the scaled scores;
//   backward overwrites dqkv[B,T,3D] with [dq | dk | dv].
//
// Two paths, chosen by the element type:
//  - fp32: cuda_attention_f32.cu, plain FMA kernels for checking.
//  - bf16 (this file): tensor cores through mma.sync m16n8k16 (bf16 in, fp32 accumulate,
//    fp32 softmax). Dh is padded to a compile-time DP (multiple of 16) with
//    zeros in shared memory, so Dh = 72 (DiT-XL) runs as DP = 80.
// Backward is two kernels (dK/dV over key tiles, dQ over query tiles), with
// no atomics: results are deterministic. Delta = rowsum(dO * O) is recomputed
// in-kernel because the contract gives no workspace.
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_common.h"

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ============================================================================
// bf16 tensor-core path
// ============================================================================
// Tiles are 64 rows (tokens) x DP columns (head dim, zero-padded) of bf16 in
// shared memory with row stride DP + 8 elements. The 8-element pad makes the
// stride (DP/2 + 4) 32-bit words; DP/2 is a multiple of 8, so 8 consecutive
// rows start in 8 distinct 4-bank groups and every ldmatrix phase (8 rows x
// 16 bytes) is conflict-free. Rows stay 16-byte aligned for cp.async and
// ldmatrix.
//
// mma.sync.m16n8k16 fragments (lane = 4*g + t):
//   A 16x16 row-major: a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..),
//                      a2 = (row g, k 2t+8..),   a3 = (row g+8, k 2t+8..)
//   B 16x8  (k x n):   b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g)
//   C 16x8  fp32:      c0,c1 = (row g, cols 2t, 2t+1), c2,c3 = (row g+8, same)
// Each 32-bit register packs two bf16, the lower k/column index in the low
// half. A C tile pair covering columns 16j..16j+15 is therefore exactly the A
// fragment of k-block j: the softmax probabilities feed the next product
// straight from registers.
//
// All fragments come from shared memory through ldmatrix.x4, which loads the
// four 8x8 matrices of a 16x16 block at (row0, col0). Lane l supplies the
// address of block row (l & 15), block column 8 * (l >> 4), so the matrices are
// m0 = rows 0-7/cols 0-7, m1 = rows 8-15/cols 0-7, m2 = rows 0-7/cols 8-15,
// m3 = rows 8-15/cols 8-15. Without .trans a lane receives (row g, cols 2t,
// 2t+1) of each matrix; with .trans, (rows 2t, 2t+1, col g). Hence:
//   A operand, tile stored [m][k]:        {m0, m1, m2, m3} = {a0, a1, a2, a3}
//   B operand, tile stored [n][k] (K, V, Q, dO rows when the product contracts
//     over the head dim), block at (n0, k0):
//       n-tile n0: {m0, m2}, n-tile n0 + 8: {m1, m3}
//   B operand, tile stored [k][n] (.trans; V, dO, Q, K when the product
//     contracts over tokens), block at (k0, n0):
//       n-tile n0: {m0, m1}, n-tile n0 + 8: {m2, m3}
#define BT 64  // tokens per tile (queries or keys) and per block

// Per-DP tuning, measured on an H100 at DiT shapes. min_blocks caps the
// registers per thread (65536 / (128 * min_blocks)); each value is the
// highest occupancy at which ptxas still needs no spills. The dK/dV kernel
// walks each 64-query tile in chunks of dkdv_qc queries: 32 is faster (fewer
// K/V fragment reloads) but at DP = 80 needs 16 to fit 3 blocks per SM.
template <int DP> struct Tune {
    static constexpr int fwd_min_blocks = DP <= 64 ? 4 : 3;
    static constexpr int dkdv_min_blocks = DP <= 80 ? 3 : 2;
    static constexpr int dq_min_blocks = DP <= 96 ? 4 : 3;
    static constexpr int dkdv_qc = DP == 80 ? 16 : 32;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronous; bytes past src_bytes (0 or 16) are
// zero-filled, which pads rows past T and columns past Dh for free.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a * b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<uint32_t *>(&v);
}

// A fragment of k-block j from a row of C tiles: tiles 2j and 2j+1 hold
// columns 16j..16j+7 and 16j+8..16j+15 (see the layout note above).
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

// Warp-level products over bf16 tiles in shared memory, row stride SST,
// ldmatrix addresses lrow = lane & 15, lcol = (lane >> 4) * 8.
// acc[N][4] = A B^T: A is the 16 rows from row ra of sA, B the 8N rows from
// row rb of sB, both stored
// [row][head dim] and contracted over KT blocks of 16 head-dim columns.
template <int N, int KT, int SST>
__device__ __forceinline__ void warp_abt(float (&acc)[N][4], const bf16 *sA, int ra, const bf16 *sB, int rb, int lrow,
                                         int lcol) {
#pragma unroll
    for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a[4];
        ldsm_x4(a, smem_u32(sA + (ra + lrow) * SST + kk * 16 + lcol));
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            uint32_t r[4];
            ldsm_x4(r, smem_u32(sB + (rb + np * 16 + lrow) * SST + kk * 16 + lcol));
            mma_bf16(acc[2 * np], a, r[0], r[2]);
            mma_bf16(acc[2 * np + 1], a, r[1], r[3]);
        }
    }
}

// acc[2 ND][4] += P B: P is 16 rows x 16 KP tokens held as score accumulators
// p[2 KP][4] (the C -> A fragment trick), B the token rows from row rb of sB, stored
// [token][head dim] and read transposed, ND blocks of 16 head-dim columns.
template <int KP, int ND, int SST, int NA, int NP>
__device__ __forceinline__ void warp_pb(float (&acc)[NA][4], const float (&p)[NP][4], const bf16 *sB, int rb,
                                        int lrow, int lcol) {
    static_assert(NA >= 2 * ND && NP >= 2 * KP, "fragment arrays too small");
#pragma unroll
    for (int kp = 0; kp < KP; kp++) {
        uint32_t a[4];
        c_to_a(a, p[2 * kp], p[2 * kp + 1]);
#pragma unroll
        for (int nd = 0; nd < ND; nd++) {
            uint32_t r[4];
            ldsm_x4_t(r, smem_u32(sB + (rb + kp * 16 + lrow) * SST + nd * 16 + lcol));
            mma_bf16(acc[2 * nd], a, r[0], r[1]);
            mma_bf16(acc[2 * nd + 1], a, r[2], r[3]);
        }
    }
}

// Copies rows [0, nrows) x cols [0, Dh) of a global bf16 tile (row stride ld
// elements) into a ROWS x DP shared tile (row stride DP + 8), zero elsewhere.
// vec: 16-byte cp.async (needs Dh % 8 == 0, ld % 8 == 0 and a 16-byte aligned
// base; then a chunk is entirely inside or outside [0, Dh)); the caller
// commits and waits. Otherwise a synchronous element-wise fallback that any
// Dh takes; a later __syncthreads publishes it.
template <int ROWS, int DP>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, int64_t ld, int nrows, int Dh,
                                          bool vec) {
    constexpr int SST = DP + 8;
    if (vec) {
        constexpr int CPR = DP / 8;  // 16-byte chunks per row
#pragma unroll 2
        for (int c = threadIdx.x; c < ROWS * CPR; c += kThreads) {
            const int r = c / CPR, col = (c % CPR) * 8;
            const bool ok = r < nrows && col < Dh;
            cp_async16(smem_u32(s + r * SST + col), ok ? g + r * ld + col : g, ok ? 16 : 0);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * DP; e += kThreads) {
            const int r = e / DP, col = e % DP;
            s[r * SST + col] = (r < nrows && col < Dh) ? g[r * ld + col] : __float2bfloat16(0.0f);
        }
    }
}

// Writes fragment columns of one row: v0, v1 go to columns col, col + 1 (col
// even). pair: Dh even and the row 4-byte aligned, so one 32-bit store covers
// both (col < Dh then implies col + 1 < Dh).
__device__ __forceinline__ void store_pair(bf16 *row, int col, int Dh, float v0, float v1,
                                           bool pair) {
    if (pair) {
        if (col < Dh) *reinterpret_cast<__nv_bfloat162 *>(row + col) = __floats2bfloat162_rn(v0, v1);
    } else {
        if (col < Dh) row[col] = __float2bfloat16(v0);
        if (col + 1 < Dh) row[col + 1] = __float2bfloat16(v1);
    }
}

// ---- forward -----------------------------------------------------------------
// Block = 64 queries of one (b, h); warp w owns queries 16w..16w+15 and runs
// the whole online softmax for them in registers. K and V have one buffer
// each, loaded in separate cp.async groups so that V_j streams in during
// S = Q K_j^T and K_{j+1} during the softmax and P V_j.
template <int DP>
__global__ void __launch_bounds__(kThreads, Tune<DP>::fwd_min_blocks)
attn_fwd_bf16(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ qkv,
              int T, int D, int H, int Dh, float scale_log2, int vec, int pair) {
    constexpr int SST = DP + 8, NT = DP / 8, KT = DP / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sK = sQ + BT * SST, *sV = sK + BT * SST;

    const int ntiles = (T + BT - 1) / BT;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / H, h = bh % H;
    const int q0 = tile * BT;
    const int64_t ld = 3 * (int64_t)D;
    const bf16 *qg = qkv + (int64_t)b * T * ld + (int64_t)h * Dh, *kg = qg + D, *vg = qg + 2 * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = warp * 16;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;  // ldmatrix address within a 16x16 block
    const int nkt = (T + BT - 1) / BT;

    load_tile<BT, DP>(sQ, qg + q0 * ld, ld, min(BT, T - q0), Dh, vec);
    load_tile<BT, DP>(sK, kg, ld, min(BT, T), Dh, vec);
    cp_async_commit();

    uint32_t qf[KT][4];            // this warp's Q rows as A fragments, loaded once
    float o[NT][4];                // O accumulators: rows g, g+8 x DP columns
    float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units) of rows g, g+8
    float l[2] = {0.0f, 0.0f};     // running sum, this thread's columns only
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BT;
        load_tile<BT, DP>(sV, vg + k0 * ld, ld, min(BT, T - k0), Dh, vec);
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
        if (j + 1 < nkt) load_tile<BT, DP>(sK, kg + (k0 + BT) * ld, ld, min(BT, T - k0 - BT), Dh, vec);
        cp_async_commit();  // possibly empty: keeps the group count uniform

        // Online softmax in base 2 (scale_log2 = scale * log2 e). Element
        // (n, e) is row g + 8 * (e >> 1), key k0 + 8n + 2t + (e & 1).
        // Each tile holds at least one key < T, so the new max is finite and
        // the first tile's alpha = exp2(-inf) = 0.
        const bool tail = k0 + BT > T;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[n][e] * scale_log2;
                if (tail && k0 + 8 * n + 2 * t + (e & 1) >= T) v = -INFINITY;
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
                const float p = exp2f(s[n][e] - m[e >> 1]);
                s[n][e] = p;
                l[e >> 1] += p;
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
        if (row >= T) continue;
        const float inv = 1.0f / l[r];
        bf16 *orow = out + ((int64_t)b * T + row) * D + (int64_t)h * Dh;
#pragma unroll
        for (int n = 0; n < NT; n++)
            store_pair(orow, 8 * n + 2 * t, Dh, o[n][2 * r] * inv, o[n][2 * r + 1] * inv, pair);
        if (t == 0) lse[(int64_t)bh * T + row] = (m[r] + log2f(l[r])) * kLn2;
    }
}

// ---- backward: dK, dV ----------------------------------------------------------
// Block = 64 keys of one (b, h); warp w owns keys 16w..16w+15 and accumulates
// their dK, dV in registers over all query tiles of 64 rows. Everything is
// computed transposed (keys as rows) so no accumulator has to move between
// lanes:
//   S^T = K Q^T, P^T = exp(S^T * scale - lse[q]), dP^T = V dO^T,
//   dS^T = P^T (dP^T - Delta[q]), dV += P^T dO, dK += dS^T Q.
// Delta[q] = sum_d dO[q,d] O[q,d] is computed per query tile from an O tile.
template <int DP>
__global__ void __launch_bounds__(kThreads, Tune<DP>::dkdv_min_blocks)
attn_bwd_dkdv_bf16(bf16 *__restrict__ dqkv, const bf16 *__restrict__ dout,
                   const bf16 *__restrict__ qkv, const bf16 *__restrict__ out,
                   const float *__restrict__ lse, int T, int D, int H, int Dh, float scale,
                   float scale_log2, int vec, int pair) {
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

    const int ntiles = (T + BT - 1) / BT;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / H, h = bh % H;
    const int k0 = tile * BT;
    const int64_t ld = 3 * (int64_t)D;
    const bf16 *qg = qkv + (int64_t)b * T * ld + (int64_t)h * Dh, *kg = qg + D, *vg = qg + 2 * D;
    const bf16 *og = out + (int64_t)b * T * D + (int64_t)h * Dh;
    const bf16 *dog = dout + (int64_t)b * T * D + (int64_t)h * Dh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kw = warp * 16;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;
    const int nqt = (T + BQ - 1) / BQ;

    load_tile<BT, DP>(sK, kg + k0 * ld, ld, min(BT, T - k0), Dh, vec);
    load_tile<BT, DP>(sV, vg + k0 * ld, ld, min(BT, T - k0), Dh, vec);
    load_tile<BQ, DP>(sQ, qg, ld, min(BQ, T), Dh, vec);
    load_tile<BQ, DP>(sDO, dog, D, min(BQ, T), Dh, vec);
    load_tile<BQ, DP>(sO, og, D, min(BQ, T), Dh, vec);
    cp_async_commit();

    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int i = 0; i < nqt; i++) {
        const int qs = i * BQ, nq = min(BQ, T - qs);
        cp_async_wait<0>();
        __syncthreads();
        {
            // Delta and lse (log2 units) of each query of the tile; queries
            // past T get lse = +inf so that their P^T is exactly 0.
            const int qi = threadIdx.x / TPQ, part = threadIdx.x % TPQ;
            float acc = 0.0f;
            for (int d = part; d < Dh; d += TPQ)
                acc = fmaf(__bfloat162float(sDO[qi * SST + d]), __bfloat162float(sO[qi * SST + d]), acc);
#pragma unroll
            for (int off = 1; off < TPQ; off <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
            if (part == 0) {
                sDelta[qi] = acc;
                sLse[qi] = qi < nq ? lse[(int64_t)bh * T + qs + qi] * kLog2e : INFINITY;
            }
        }
        __syncthreads();
        // sO is free: fetch the next tile's O while this one is processed.
        if (i + 1 < nqt) load_tile<BQ, DP>(sO, og + (int64_t)(qs + BQ) * D, D, min(BQ, T - qs - BQ), Dh, vec);
        cp_async_commit();

        // The query columns of S^T are independent (no reduction runs over
        // queries), so the tile is processed in chunks of QC queries: only
        // QC/8 S^T and dP^T tiles are live at once, which buys occupancy.
#pragma unroll 1
        for (int qc = 0; qc < BQ; qc += QC) {
            // S^T = K Q^T: 16 keys x QC queries.
            float st[CN][4];
            warp_abt<CN, KT, SST>(st, sK, kw, sQ, qc, lrow, lcol);
            // P^T; element (n, e) is key kw + g + 8 * (e >> 1), query
            // qs + qc + 8n + 2t + (e & 1).
#pragma unroll
            for (int n = 0; n < CN; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    st[n][e] = exp2f(st[n][e] * scale_log2 - sLse[qc + 8 * n + 2 * t + (e & 1)]);

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
            const int nn = min(BQ, T - qs - BQ);
            load_tile<BQ, DP>(sQ, qg + (qs + BQ) * ld, ld, nn, Dh, vec);
            load_tile<BQ, DP>(sDO, dog + (int64_t)(qs + BQ) * D, D, nn, Dh, vec);
        }
        cp_async_commit();
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = k0 + kw + g + 8 * r;
        if (key >= T) continue;
        bf16 *dkrow = dqkv + ((int64_t)b * T + key) * ld + D + (int64_t)h * Dh;
        bf16 *dvrow = dkrow + D;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int col = 8 * n + 2 * t;
            store_pair(dkrow, col, Dh, dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale, pair);
            store_pair(dvrow, col, Dh, dv[n][2 * r], dv[n][2 * r + 1], pair);
        }
    }
}

// ---- backward: dQ ------------------------------------------------------------
// Block = 64 queries of one (b, h); warp w owns queries 16w..16w+15 and
// accumulates their dQ over all key tiles:
//   S = Q K^T, P = exp(S * scale - lse), dP = dO V^T, dS = P (dP - Delta),
//   dQ += dS K.
template <int DP>
__global__ void __launch_bounds__(kThreads, Tune<DP>::dq_min_blocks)
attn_bwd_dq_bf16(bf16 *__restrict__ dqkv, const bf16 *__restrict__ dout,
                 const bf16 *__restrict__ qkv, const bf16 *__restrict__ out,
                 const float *__restrict__ lse, int T, int D, int H, int Dh, float scale,
                 float scale_log2, int vec, int pair) {
    constexpr int SST = DP + 8, NT = DP / 8, KT = DP / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem, *sDO = sQ + BT * SST, *sK = sDO + BT * SST, *sV = sK + BT * SST;
    float *sLse = (float *)(sV + BT * SST), *sDelta = sLse + BT;

    const int ntiles = (T + BT - 1) / BT;
    const int tile = blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
    const int b = bh / H, h = bh % H;
    const int q0 = tile * BT, nq = min(BT, T - q0);
    const int64_t ld = 3 * (int64_t)D;
    const bf16 *qg = qkv + (int64_t)b * T * ld + (int64_t)h * Dh, *kg = qg + D, *vg = qg + 2 * D;
    const bf16 *og = out + (int64_t)b * T * D + (int64_t)h * Dh;
    const bf16 *dog = dout + (int64_t)b * T * D + (int64_t)h * Dh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = warp * 16;
    const int lrow = lane & 15, lcol = (lane >> 4) * 8;
    const int nkt = (T + BT - 1) / BT;

    // Prologue: the O tile is only needed for Delta, so it borrows sK.
    load_tile<BT, DP>(sQ, qg + q0 * ld, ld, nq, Dh, vec);
    load_tile<BT, DP>(sDO, dog + (int64_t)q0 * D, D, nq, Dh, vec);
    load_tile<BT, DP>(sK, og + (int64_t)q0 * D, D, nq, Dh, vec);
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
            sLse[qi] = qi < nq ? lse[(int64_t)bh * T + q0 + qi] * kLog2e : 0.0f;  // rows past T: unused
        }
    }
    __syncthreads();
    float rlse[2], rdelta[2];  // rows g, g+8 of this warp
#pragma unroll
    for (int r = 0; r < 2; r++) {
        rlse[r] = sLse[wrow + g + 8 * r];
        rdelta[r] = sDelta[wrow + g + 8 * r];
    }
    load_tile<BT, DP>(sK, kg, ld, min(BT, T), Dh, vec);
    load_tile<BT, DP>(sV, vg, ld, min(BT, T), Dh, vec);
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
            // Zero-filled keys past T would give exp(-lse) != 0: mask them.
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] = k0 + kc + 8 * n + 2 * t + (e & 1) < T
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
            const int nk = min(BT, T - k0 - BT);
            load_tile<BT, DP>(sK, kg + (k0 + BT) * ld, ld, nk, Dh, vec);
            load_tile<BT, DP>(sV, vg + (k0 + BT) * ld, ld, nk, Dh, vec);
        }
        cp_async_commit();
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = q0 + wrow + g + 8 * r;
        if (row >= T) continue;
        bf16 *dqrow = dqkv + ((int64_t)b * T + row) * ld + (int64_t)h * Dh;
#pragma unroll
        for (int n = 0; n < NT; n++)
            store_pair(dqrow, 8 * n + 2 * t, Dh, dq[n][2 * r] * scale, dq[n][2 * r + 1] * scale, pair);
    }
}

// ============================================================================
// host side
// ============================================================================
// Shared memory of each bf16 kernel, in bytes.
template <int DP> static size_t fwd_smem() { return (size_t)3 * BT * (DP + 8) * sizeof(bf16); }
template <int DP> static size_t dkdv_smem() {
    return (size_t)5 * BT * (DP + 8) * sizeof(bf16) + 2 * BT * sizeof(float);
}
template <int DP> static size_t dq_smem() {
    return (size_t)4 * BT * (DP + 8) * sizeof(bf16) + 2 * BT * sizeof(float);
}

// Blocks that need more than the default 48 KB of dynamic shared memory must
// opt in. Setting it at every launch is cheap, per current device, and legal
// during stream capture (it is not a stream operation).
static void allow_smem(const void *kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

static int pick_dp(int Dh) {
    return Dh <= 16 ? 16 : Dh <= 32 ? 32 : Dh <= 64 ? 64 : Dh <= 80 ? 80 : Dh <= 96 ? 96 : 128;
}

struct AttnArgs {
    cudaStream_t s;
    unsigned grid;
    int T, D, H, Dh, vec, pair;
    float scale;
};

template <int DP>
static void launch_fwd(const AttnArgs &a, void *out, float *lse, const void *qkv) {
    const size_t sm = fwd_smem<DP>();
    allow_smem((const void *)attn_fwd_bf16<DP>, sm);
    attn_fwd_bf16<DP><<<a.grid, kThreads, sm, a.s>>>((bf16 *)out, lse, (const bf16 *)qkv, a.T,
                                                      a.D, a.H, a.Dh, a.scale * kLog2e, a.vec,
                                                      a.pair);
}

template <int DP>
static void launch_bwd(const AttnArgs &a, void *dqkv, const void *dout, const void *qkv,
                       const void *out, const float *lse) {
    const size_t sm1 = dkdv_smem<DP>(), sm2 = dq_smem<DP>();
    allow_smem((const void *)attn_bwd_dkdv_bf16<DP>, sm1);
    allow_smem((const void *)attn_bwd_dq_bf16<DP>, sm2);
    attn_bwd_dkdv_bf16<DP><<<a.grid, kThreads, sm1, a.s>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, (const bf16 *)out, lse, a.T, a.D,
        a.H, a.Dh, a.scale, a.scale * kLog2e, a.vec, a.pair);
    attn_bwd_dq_bf16<DP><<<a.grid, kThreads, sm2, a.s>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, (const bf16 *)out, lse, a.T, a.D,
        a.H, a.Dh, a.scale, a.scale * kLog2e, a.vec, a.pair);
}

extern "C" int dc_cuda_attn_max_head_dim(void) { return ATTN_MAX_DH; }

// -1: a shape the kernels don't support; 0: nothing to do; 1: launch.
static int check_shape(int B, int T, int D, int H) {
    if (H <= 0 || D <= 0 || D % H != 0 || D / H > ATTN_MAX_DH) return -1;
    return B > 0 && T > 0;
}

static AttnArgs args_for(cudaStream_t s, int B, int T, int D, int H) {
    AttnArgs a;
    a.s = s, a.T = T, a.D = D, a.H = H, a.Dh = D / H;
    a.scale = 1.0f / sqrtf((float)a.Dh);
    a.grid = dc_attn_grid(B, H, T, BT);
    return a;
}

extern "C" int dc_cuda_attn_fwd(cudaStream_t s, void *out, float *lse, const void *qkv, int B,
                                int T, int D, int H, int bf16_io) {
    int ok = check_shape(B, T, D, H);
    if (ok <= 0) return ok;
    if (!bf16_io) {
        dc_cuda_attn_fwd_f32(s, (float *)out, lse, (const float *)qkv, B, T, D, H);
        return 0;
    }
    AttnArgs a = args_for(s, B, T, D, H);
    a.vec = a.Dh % 8 == 0 && dc_aligned(qkv, 16);  // Dh % 8 == 0 makes D and 3D multiples of 8 too
    a.pair = a.Dh % 2 == 0 && dc_aligned(out, 4);
    switch (pick_dp(a.Dh)) {
    case 16: launch_fwd<16>(a, out, lse, qkv); break;
    case 32: launch_fwd<32>(a, out, lse, qkv); break;
    case 64: launch_fwd<64>(a, out, lse, qkv); break;
    case 80: launch_fwd<80>(a, out, lse, qkv); break;
    case 96: launch_fwd<96>(a, out, lse, qkv); break;
    default: launch_fwd<128>(a, out, lse, qkv); break;
    }
    return 0;
}

extern "C" int dc_cuda_attn_bwd(cudaStream_t s, void *dqkv, const void *dout, const void *qkv,
                                const void *out, const float *lse, int B, int T, int D, int H,
                                int bf16_io) {
    int ok = check_shape(B, T, D, H);
    if (ok <= 0) return ok;
    if (!bf16_io) {
        dc_cuda_attn_bwd_f32(s, (float *)dqkv, (const float *)dout, (const float *)qkv, (const float *)out, lse, B,
                             T, D, H);
        return 0;
    }
    AttnArgs a = args_for(s, B, T, D, H);
    a.vec = a.Dh % 8 == 0 && dc_aligned(qkv, 16) && dc_aligned(dout, 16) && dc_aligned(out, 16);
    a.pair = a.Dh % 2 == 0 && dc_aligned(dqkv, 4);
    switch (pick_dp(a.Dh)) {
    case 16: launch_bwd<16>(a, dqkv, dout, qkv, out, lse); break;
    case 32: launch_bwd<32>(a, dqkv, dout, qkv, out, lse); break;
    case 64: launch_bwd<64>(a, dqkv, dout, qkv, out, lse); break;
    case 80: launch_bwd<80>(a, dqkv, dout, qkv, out, lse); break;
    case 96: launch_bwd<96>(a, dqkv, dout, qkv, out, lse); break;
    default: launch_bwd<128>(a, dqkv, dout, qkv, out, lse); break;
    }
    return 0;
}
