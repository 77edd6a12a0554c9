// The GEGLU feed-forward's first product with the gate in its epilogue, on
// Hopper (bf16): out[M, F] = (x w_h^T + b_h) * gelu_erf(x w_g^T + b_g), where
// w = [w_h; w_g] is the [2F, K] weight of the projection and b = [b_h; b_g].
// Unfused, the product writes [M, 2F] and the GEGLU pass reads it back; here
// those values stay on the chip (registers, then shared memory).
//
// A persistent block an SM takes tiles of 256 rows x 64 output columns: two
// consumer warpgroups of 128 rows, each two wgmma m64n128 a 16-wide step of K
// whose B operand is the 64 rows of w_h and the 64 rows of w_g for those
// columns, stacked (so a lane's accumulators hold h in 8-column blocks 0-7
// and the matching gate in blocks 8-15). A producer warp brings stages of 64
// K-columns (x: 256 rows, w: two boxes of 64 rows) through a ring of kStages
// with the TMA, in the 128-byte swizzle (cuda_sm90.h), counting stages across
// tiles; full and empty mbarriers as in cuda_attention_sm90.cu. Rows past M
// and columns past K are zeros from the TMA.
//
// The epilogue runs on warpgroups of its own: the consumers hand each tile's
// h and gate to them through shared memory (bf16 pairs, as the unfused
// product would store them) and go on with the next tile's products while
// the epilogue adds the biases, applies the gate and stores.
//
// Measured on SD 1.x's 16-row step (H100, per call at the 64x64 level, M
// 65536, K 320, F 1280): the first version (128 x 64 tiles, two blocks an SM,
// the epilogue in the consumers, erff) 4 x 116.5 us; persistent with a
// cheaper gelu 4 x 111.3; two warpgroups taking turns at the tensor cores
// (ping-pong) 4 x 110.3; one wgmma m64n256 a step on 128 x 128 tiles 4 x
// 118.7; 256 x 64 tiles 297; with x resident in shared memory 320; this one
// (the epilogue on two warpgroups of its own) 280, and at the 32x32 level
// 192 against 218.
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sm90.h"
#include "backend/op_math.h"

namespace {

constexpr int kBM = 256;                        // rows a tile: 128 a consumer warpgroup
constexpr int kBF = 64;                         // output columns a tile
constexpr int kBK = 64;                         // K a stage: one 128-byte swizzle row
constexpr int kRowBytes = 128;
constexpr int kABytes = kBM * kRowBytes;        // 32 KB
constexpr int kBBytes = 2 * kBF * kRowBytes;    // 16 KB: 64 rows of w_h, 64 of w_g
constexpr int kStages = 3;                      // 144 KB of stages + 64 KB handed over: one block an SM
constexpr int kThreads = 5 * 128;               // two consumer, two epilogue and a producer warpgroup
constexpr int kPairs = 64;                      // bf16 pairs a consumer thread hands over a tile

struct GegluParams {
    __nv_bfloat16 *out;
    const void *bias;  // [2F] or NULL
    int M, F;
    int nk;  // stages of kBK columns of K
};

struct GegluSmem {
    alignas(1024) uint8_t a[kStages][kABytes];
    alignas(1024) uint8_t b[kStages][kBBytes];
    uint32_t hg[kPairs * 256];  // pair j of consumer thread c at j * 256 + c
    uint64_t full[kStages], empty[kStages], hg_full, hg_empty;
};
constexpr size_t kSmemBytes = sizeof(GegluSmem) + 1024;

#if SM90_BODY
// gelu(x) = x Phi(x), Phi from Abramowitz and Stegun 7.1.25 (erf within
// 2.5e-5, so Phi within 1.3e-5: a 300th of the bf16 output's rounding): 13
// instructions where erff's two branches take about 30.
__device__ __forceinline__ float gelu_erf_fast(float x) {
    float t, e;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(0.47047f * 0.70710678f, fabsf(x), 1.0f)));
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-0.72134752f * x * x));  // exp(-x^2 / 2)
    // half of erfc(|x| / sqrt 2): the polynomial's coefficients halved
    const float q = e * t * fmaf(fmaf(0.3739278f, t, -0.0479399f), t, 0.1740121f);
    return x * (x >= 0.0f ? 1.0f - q : q);
}
#endif

// The bias pair of columns col, col + 1 (even): BIAS 0 none, 1 F32, 2 BF16.
template <int BIAS> __device__ __forceinline__ float2 bias_pair(const void *b, int col) {
    if (BIAS == 1) return *reinterpret_cast<const float2 *>(reinterpret_cast<const float *>(b) + col);
    if (BIAS == 2) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(
        reinterpret_cast<const __nv_bfloat16 *>(b) + col));
    return make_float2(0.0f, 0.0f);
}

// Consumer thread c's accumulator pair (rows half mh, column block n, row
// r) goes to hg as pair j = (16 mh + n) 2 + r; epilogue warpgroup 2 + w
// applies the gate for consumer warpgroup w's pairs, thread for thread.
template <int BIAS>
__global__ void __launch_bounds__(kThreads, 1)
    geglu_fwd_sm90(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
                   const GegluParams p) {
#if SM90_BODY
    extern __shared__ uint8_t smem_raw[];
    GegluSmem &sm = *reinterpret_cast<GegluSmem *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    const int nk = p.nk, nf = p.F / kBF, tiles = nf * ((p.M + kBM - 1) / kBM);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(smem_u32(&sm.full[s]), 1);
            mbar_init(smem_u32(&sm.empty[s]), 8);  // every consumer warp
        }
        mbar_init(smem_u32(&sm.hg_full), 256);   // every consumer thread
        mbar_init(smem_u32(&sm.hg_empty), 256);  // every epilogue thread
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    dc_pdl_enter();

    // Registers: 96 a thread at launch, moved to the consumers' accumulators
    // (160) from the producer (24) and the epilogue (64): the moves balance.
    if (wg == 4) {  // the producer warpgroup: one thread issues the loads
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (warp == 16 && lane == 0) {
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int f0 = tile % nf * kBF, m0 = tile / nf * kBM;
                for (int kt = 0; kt < nk; kt++, it++) {
                    const int s = it % kStages, use = it / kStages;
                    if (use > 0) mbar_wait(smem_u32(&sm.empty[s]), (use - 1) & 1);
                    const uint32_t bar = smem_u32(&sm.full[s]);
                    mbar_expect_tx(bar, kABytes + kBBytes);
                    tma_load_2d(smem_u32(sm.a[s]), &tx, kt * kBK, m0, bar);
                    tma_load_2d(smem_u32(sm.b[s]), &tw, kt * kBK, f0, bar);
                    tma_load_2d(smem_u32(sm.b[s]) + kBF * kRowBytes, &tw, kt * kBK, p.F + f0, bar);
                }
            }
        }
        return;
    }
    const int g = lane / 4, t = lane % 4;
    if (wg >= 2) {  // the epilogue warpgroups: wg 2 + cw takes consumer warpgroup cw's rows
        asm volatile("setmaxnreg.dec.sync.aligned.u32 64;\n");
        const int cw = wg - 2, c = threadIdx.x - 256, w4 = (c % 128) / 32;
        int tc = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, tc++) {
            const int f0 = tile % nf * kBF, m0 = tile / nf * kBM;
            mbar_wait(smem_u32(&sm.hg_full), tc & 1);
#pragma unroll
            for (int q = 0; q < 4; q++) {  // rows half, row
                const int mh = q >> 1, r = q & 1;
                const int row = m0 + cw * 128 + mh * 64 + 16 * w4 + g + 8 * r;
                uint32_t hw[8], gw[8];
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    hw[n] = sm.hg[((16 * mh + n) * 2 + r) * 256 + c];
                    gw[n] = sm.hg[((16 * mh + n + 8) * 2 + r) * 256 + c];
                }
                if (row >= p.M) continue;
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    const int col = f0 + 8 * n + 2 * t;
                    const float2 bh = bias_pair<BIAS>(p.bias, col), bg = bias_pair<BIAS>(p.bias, p.F + col);
                    const float2 h = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&hw[n]));
                    const float2 gt = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&gw[n]));
                    const float v0 = (h.x + bh.x) * gelu_erf_fast(gt.x + bg.x);
                    const float v1 = (h.y + bh.y) * gelu_erf_fast(gt.y + bg.y);
                    *reinterpret_cast<__nv_bfloat162 *>(p.out + (int64_t)row * p.F + col) =
                        __floats2bfloat162_rn(v0, v1);
                }
            }
            mbar_arrive(smem_u32(&sm.hg_empty));
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n");
    auto release = [&](int it) {
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&sm.empty[it % kStages]));
    };
    int it = 0, tc = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, tc++) {
        float acc[2][64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[0][i] = acc[1][i] = 0.0f;
        for (int kt = 0; kt < nk; kt++, it++) {
            const int s = it % kStages;
            mbar_wait(smem_u32(&sm.full[s]), (it / kStages) & 1);
            const uint64_t da = sw128_desc(smem_u32(sm.a[s]) + wg * 128 * kRowBytes);
            const uint64_t db = sw128_desc(smem_u32(sm.b[s]));
            reg_fence(acc[0]), reg_fence(acc[1]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kBK / 16; kk++) {
                wgmma_ss_n128(acc[0], da + 2 * kk, db + 2 * kk, kt > 0 || kk > 0);
                wgmma_ss_n128(acc[1], da + ((64 * kRowBytes) >> 4) + 2 * kk, db + 2 * kk, kt > 0 || kk > 0);
            }
            wgmma_commit();
            wgmma_wait<1>();
            reg_fence(acc[0]), reg_fence(acc[1]);
            if (kt > 0) release(it - 1);
        }
        wgmma_wait<0>();
        reg_fence(acc[0]), reg_fence(acc[1]);
        release(it - 1);
        // hand the tile over once the epilogue has taken the previous one
        if (tc > 0) mbar_wait(smem_u32(&sm.hg_empty), (tc - 1) & 1);
        const int c = threadIdx.x;
#pragma unroll
        for (int mh = 0; mh < 2; mh++)
#pragma unroll
            for (int n = 0; n < 16; n++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const __nv_bfloat162 v = __floats2bfloat162_rn(acc[mh][4 * n + 2 * r], acc[mh][4 * n + 2 * r + 1]);
                    sm.hg[((16 * mh + n) * 2 + r) * 256 + c] = *reinterpret_cast<const uint32_t *>(&v);
                }
        mbar_arrive(smem_u32(&sm.hg_full));
    }
#endif
}

// A 2-dimensional tensor map over a row-major bf16 matrix [rows, cols], boxes
// of box_rows x 64 columns in the 128-byte swizzle, zeros out of bounds.
static bool make_map_2d(CUtensorMap *map, const void *base, int64_t rows, int64_t cols, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = sm90_encode_fn();
    if (!enc) return false;
    const cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, estride[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dim, stride, box, estride,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

extern "C" bool dc_cuda_geglu_linear_sm90(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K,
                                          int F) {
    if (out.dt != DC_BF16 || inp.dt != DC_BF16 || w.dt != DC_BF16 || (b.p && b.dt != DC_BF16 && b.dt != DC_F32))
        return false;
    if (M < 1 || K < 16 || K % 8 || F % kBF || (int64_t)F * 2 > INT32_MAX) return false;
    if (!dc_aligned(out.p, 16) || !dc_aligned(inp.p, 16) || !dc_aligned(w.p, 16) || !dc_aligned(b.p, 8) ||
        !sm90_device())
        return false;
    // Fewer tiles than four an SM run slower than cuBLAS's product and the
    // GEGLU pass (SD's 2-row step, 160 tiles of this size a call: 6.44 ->
    // 6.55 ms fused with the first version of this kernel).
    const int64_t tiles = (int64_t)(F / kBF) * ((M + kBM - 1) / kBM);
    if (tiles < 4LL * dc_cuda_sm_count() || tiles > INT32_MAX) return false;
    CUtensorMap tx, tw;
    if (!make_map_2d(&tx, inp.p, M, K, kBM) || !make_map_2d(&tw, w.p, 2 * (int64_t)F, K, kBF)) return false;
    GegluParams p;
    memset(&p, 0, sizeof p);
    p.out = (__nv_bfloat16 *)out.p, p.bias = b.p;
    p.M = M, p.F = F, p.nk = (K + kBK - 1) / kBK;
    // Persistent: a block an SM, each taking every grid-th tile.
    const unsigned grid = (unsigned)(tiles < dc_cuda_sm_count() ? tiles : dc_cuda_sm_count());
    auto launch = [&](auto kernel) {
        // More than 48 KB of shared memory: opted into at every launch
        // (cheap, per current device, legal during stream capture).
        cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
        dc_launch(be, kernel, grid, kThreads, kSmemBytes, tx, tw, p);
    };
    if (!b.p) launch(geglu_fwd_sm90<0>);
    else if (b.dt == DC_F32) launch(geglu_fwd_sm90<1>);
    else launch(geglu_fwd_sm90<2>);
    return true;
}
