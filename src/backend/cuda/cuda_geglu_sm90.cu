// The GEGLU feed-forward's first product with the gate in its epilogue, on
// Hopper (bf16): out[M, F] = (x w_h^T + b_h) * gelu_erf(x w_g^T + b_g), where
// w = [w_h; w_g] is the [2F, K] weight of the projection and b = [b_h; b_g].
// Unfused, the product writes [M, 2F] and the GEGLU pass reads it back; here
// those values live only in registers. On an H100 at SD 1.x's 16-row step its
// 35 calls take 3.66 ms against 2.68 (cuBLAS) + 1.67 (the pass).
//
// A persistent block an SM takes tiles of 256 rows x 64 output columns: two
// consumer warpgroups of 128 rows, each two wgmma m64n128 a 16-wide step of K
// whose B operand is the 64 rows of w_h and the 64 rows of w_g for those
// columns, stacked (so a lane's accumulators hold h in 8-column blocks 0-7
// and the matching gate in blocks 8-15). A producer warp brings stages of 64
// K-columns (x: 256 rows, w: two boxes of 64 rows) through a ring of kStages
// with the TMA, in the 128-byte swizzle (cuda_sm90.h), counting stages across
// tiles so the next tile's first stages land during this one's epilogue; full
// and empty mbarriers as in cuda_attention_sm90.cu. Rows past M and columns
// past K are zeros from the TMA; the epilogue adds the biases, applies the
// gate and stores bf16 pairs.
//
// What bounds it is the epilogue: about 20 instructions an output, issued by
// the consumer warps while the tensor cores wait (Nsight Compute: tensor pipe
// 33%, issue slots 31%, L2 59% on the 64x64 level's call). Measured on the
// 16-row step, per call: the first version (128 x 64 tiles, two blocks an SM,
// erff) 116.5 us; persistent with a cheaper gelu 111.3; two warpgroups taking
// turns at the tensor cores on tiles of their own (ping-pong) 110.3; one
// wgmma m64n256 a step on 128 x 128 tiles 118.7; this one 104.6.
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
constexpr int kStages = 4;                      // 192 KB: one block an SM
constexpr int kRowBytes = 128;
constexpr int kABytes = kBM * kRowBytes;        // 32 KB
constexpr int kBBytes = 2 * kBF * kRowBytes;    // 16 KB: 64 rows of w_h, 64 of w_g
constexpr int kThreadsGeglu = 2 * 128 + 32;     // two consumer warpgroups, a producer warp

struct GegluSmem {
    alignas(1024) uint8_t a[kStages][kABytes];
    alignas(1024) uint8_t b[kStages][kBBytes];
    uint64_t full[kStages], empty[kStages];
};
constexpr size_t kSmemBytes = sizeof(GegluSmem) + 1024;

struct GegluParams {
    __nv_bfloat16 *out;
    const void *bias;  // [2F] or NULL
    int M, F;
    int nk;  // stages of kBK columns of K
};

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

template <int BIAS>
__global__ void __launch_bounds__(kThreadsGeglu, 1)
    geglu_fwd_sm90(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw, const GegluParams p) {
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
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    dc_pdl_enter();

    // Tiles (256 rows x 64 outputs, outputs fastest) go round the blocks;
    // the ring's stages are counted across tiles, so the producer loads the
    // next tile's first stages while the consumers run this one's epilogue.
    if (wg == 2) {  // the producer warp
        if (lane == 0) {
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

    // One stage's products stay in flight while the next stage's are issued;
    // a stage goes back to the producer once its products are done.
    auto release = [&](int it) {
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&sm.empty[it % kStages]));
    };
    const int g = lane / 4, t = lane % 4;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int f0 = tile % nf * kBF, m0 = tile / nf * kBM;
        float acc[2][64];  // rows 0-63 and 64-127 of this warpgroup's 128
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

        // Epilogue: lane 4g + t of warp w holds rows 16w + g (+8) of each
        // half, columns 8n + 2t (+1): h for n < 8, the gate of the same
        // column at n + 8.
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const int col = f0 + 8 * n + 2 * t;
            const float2 bh = bias_pair<BIAS>(p.bias, col), bg = bias_pair<BIAS>(p.bias, p.F + col);
#pragma unroll
            for (int mh = 0; mh < 2; mh++) {
                const float *a = acc[mh];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = m0 + wg * 128 + mh * 64 + 16 * (warp % 4) + g + 8 * r;
                    if (row >= p.M) continue;
                    const float v0 = (a[4 * n + 2 * r] + bh.x) * gelu_erf_fast(a[4 * (n + 8) + 2 * r] + bg.x);
                    const float v1 = (a[4 * n + 2 * r + 1] + bh.y) * gelu_erf_fast(a[4 * (n + 8) + 2 * r + 1] + bg.y);
                    *reinterpret_cast<__nv_bfloat162 *>(p.out + (int64_t)row * p.F + col) = __floats2bfloat162_rn(v0, v1);
                }
            }
        }
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
        dc_launch(be, kernel, grid, kThreadsGeglu, kSmemBytes, tx, tw, p);
    };
    if (!b.p) launch(geglu_fwd_sm90<0>);
    else if (b.dt == DC_F32) launch(geglu_fwd_sm90<1>);
    else launch(geglu_fwd_sm90<2>);
    return true;
}
