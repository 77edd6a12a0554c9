// bf16 tensor-core building blocks of the FlashAttention-2 style kernels
// (cuda_attention.cu forward, cuda_attention_bwd.cu backward): mma.sync
// m16n8k16 (bf16 in, fp32 accumulate), ldmatrix, cp.async, tile loads and
// stores, and the per-head-size tuning. Compiled by nvcc only.
#pragma once
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
// K/V fragment reloads) but at DP = 80 needs 16 to fit 3 blocks per SM. At
// DP = 160 (SD 1.5's deep heads) the dK and dV accumulators alone take 160
// registers, so one block per SM and chunks of 16.
template <int DP> struct Tune {
    static constexpr int fwd_min_blocks = DP <= 64 ? 4 : DP <= 128 ? 3 : 2;
    static constexpr int dkdv_min_blocks = DP <= 80 ? 3 : DP <= 128 ? 2 : 1;
    static constexpr int dq_min_blocks = DP <= 96 ? 4 : DP <= 128 ? 3 : 2;
    static constexpr int dkdv_qc = DP == 80 || DP > 128 ? 16 : 32;
};

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


// Blocks that need more than the default 48 KB of dynamic shared memory must
// opt in. Setting it at every launch is cheap, per current device, and legal
// during stream capture (it is not a stream operation).
static inline void allow_smem(const void *kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

// The padded head size DP of the kernel instance that runs heads of Dh.
static inline int attn_pick_dp(int Dh) {
    return Dh <= 16 ? 16 : Dh <= 32 ? 32 : Dh <= 48 ? 48 : Dh <= 64 ? 64 : Dh <= 80 ? 80 : Dh <= 96 ? 96
                                                                                    : Dh <= 128 ? 128 : 160;
}

// Calls f.template operator()<DP>() for the instance that runs heads of Dh.
template <class F> static inline void attn_dispatch_dp(int Dh, F &&f) {
    switch (attn_pick_dp(Dh)) {
    case 16: f.template operator()<16>(); break;
    case 32: f.template operator()<32>(); break;
    case 48: f.template operator()<48>(); break;  // SD 1.x's heads of 40
    case 64: f.template operator()<64>(); break;
    case 80: f.template operator()<80>(); break;
    case 96: f.template operator()<96>(); break;
    case 128: f.template operator()<128>(); break;
    default: f.template operator()<160>(); break;
    }
}
