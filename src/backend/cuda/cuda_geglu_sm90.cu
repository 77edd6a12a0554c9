// The GEGLU feed-forward's first product with the gate in its epilogue, on
// Hopper (bf16): out[M, F] = (x w_h^T + b_h) * gelu_erf(x w_g^T + b_g), where
// w = [w_h; w_g] is the [2F, K] weight of the projection and b = [b_h; b_g].
// Unfused, the product writes [M, 2F] and the GEGLU pass reads it back; here
// those values live only in registers. On an H100 at SD 1.x's 16-row step its
// 35 calls take 4.11 ms against 2.68 (cuBLAS) + 1.67 (the pass): its product
// runs at about 390 TFLOP/s where cuBLAS's reaches 600, so wider tiles and a
// persistent schedule are what would make it a real gain.
//
// A block computes 128 rows x 64 output columns: two consumer warpgroups of
// 64 rows, each one wgmma m64n128 a 16-wide step of K whose B operand is the
// 64 rows of w_h and the 64 rows of w_g for those columns, stacked (so a
// lane's accumulators hold h in 8-column blocks 0-7 and the matching gate in
// blocks 8-15). A producer warp brings stages of 64 K-columns (x: 128 rows,
// w: two boxes of 64 rows) through a ring of kStages with the TMA, in the
// 128-byte swizzle (cuda_sm90.h); full and empty mbarriers as in
// cuda_attention_sm90.cu. Two blocks share an SM, so one's epilogue runs
// beside the other's products. Rows past M and columns past K are zeros from
// the TMA; the epilogue adds the biases, applies the gate and stores bf16
// pairs.
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sm90.h"
#include "backend/op_math.h"

namespace {

constexpr int kBM = 128;                        // rows a block
constexpr int kBF = 64;                         // output columns a block
constexpr int kBK = 64;                         // K a stage: one 128-byte swizzle row
constexpr int kStages = 3;                      // 96 KB: two blocks an SM (one's epilogue, the other's products)
constexpr int kRowBytes = 128;
constexpr int kABytes = kBM * kRowBytes;        // 16 KB
constexpr int kBBytes = 2 * kBF * kRowBytes;    // 16 KB: 64 rows of w_h, 64 of w_g
constexpr int kThreadsGeglu = 2 * 128 + 32;

struct GegluSmem {
    alignas(1024) uint8_t a[kStages][kABytes];
    alignas(1024) uint8_t b[kStages][kBBytes];
    uint64_t full[kStages], empty[kStages];
};
constexpr size_t kSmemBytes = sizeof(GegluSmem) + 1024;

struct GegluParams {
    __nv_bfloat16 *out;
    const void *bias;  // [2F] or NULL
    int bias_bf16;
    int M, K, F;
    int nk;  // stages of kBK columns of K
};

__global__ void __launch_bounds__(kThreadsGeglu, 2)
    geglu_fwd_sm90(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw, const GegluParams p) {
#if SM90_BODY
    extern __shared__ uint8_t smem_raw[];
    GegluSmem &sm = *reinterpret_cast<GegluSmem *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    const int f0 = blockIdx.x * kBF, m0 = blockIdx.y * kBM;
    const int nk = p.nk;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(smem_u32(&sm.full[s]), 1);
            mbar_init(smem_u32(&sm.empty[s]), 8);  // every consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 2) {  // the producer warp
        if (lane == 0) {
            for (int kt = 0; kt < nk; kt++) {
                const int s = kt % kStages, use = kt / kStages;
                if (use > 0) mbar_wait(smem_u32(&sm.empty[s]), (use - 1) & 1);
                const uint32_t bar = smem_u32(&sm.full[s]);
                mbar_expect_tx(bar, kABytes + kBBytes);
                tma_load_2d(smem_u32(sm.a[s]), &tx, kt * kBK, m0, bar);
                tma_load_2d(smem_u32(sm.b[s]), &tw, kt * kBK, f0, bar);
                tma_load_2d(smem_u32(sm.b[s]) + kBF * kRowBytes, &tw, kt * kBK, p.F + f0, bar);
            }
        }
        return;
    }

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    // One stage's products stay in flight while the next stage's are issued;
    // a stage goes back to the producer once its products are done.
    auto release = [&](int kt) {
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&sm.empty[kt % kStages]));
    };
    for (int kt = 0; kt < nk; kt++) {
        const int s = kt % kStages;
        mbar_wait(smem_u32(&sm.full[s]), (kt / kStages) & 1);
        const uint64_t da = sw128_desc(smem_u32(sm.a[s]) + wg * 64 * kRowBytes);
        const uint64_t db = sw128_desc(smem_u32(sm.b[s]));
        reg_fence(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; kk++) wgmma_ss_n128(acc, da + 2 * kk, db + 2 * kk, kt > 0 || kk > 0);
        wgmma_commit();
        wgmma_wait<1>();
        reg_fence(acc);
        if (kt > 0) release(kt - 1);
    }
    wgmma_wait<0>();
    reg_fence(acc);
    release(nk - 1);

    // Epilogue: lane 4g + t of warp w holds rows 16w + g (+8), columns
    // 8n + 2t (+1): h for n < 8, the gate of the same column at n + 8.
    const int g = lane / 4, t = lane % 4;
    const int row0 = m0 + wg * 64 + 16 * (warp % 4) + g;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        const int col = f0 + 8 * n + 2 * t;
        float bh[2] = {0.0f, 0.0f}, bg[2] = {0.0f, 0.0f};
        if (p.bias) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                bh[e] = dc_ld(p.bias, col + e, p.bias_bf16);
                bg[e] = dc_ld(p.bias, p.F + col + e, p.bias_bf16);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row0 + 8 * r;
            if (row >= p.M) continue;
            const float v0 = (acc[4 * n + 2 * r] + bh[0]) * dc_gelu_erf(acc[4 * (n + 8) + 2 * r] + bg[0]);
            const float v1 = (acc[4 * n + 2 * r + 1] + bh[1]) * dc_gelu_erf(acc[4 * (n + 8) + 2 * r + 1] + bg[1]);
            *reinterpret_cast<__nv_bfloat162 *>(p.out + (int64_t)row * p.F + col) = __floats2bfloat162_rn(v0, v1);
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

// The current device's SM count, asked once a device.
static int sm_count(void) {
    static int known[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!known[dev] && cudaDeviceGetAttribute(&known[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        known[dev] = 0;
    return known[dev];
}

}  // namespace

extern "C" bool dc_cuda_geglu_linear_sm90(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K,
                                          int F) {
    if (out.dt != DC_BF16 || inp.dt != DC_BF16 || w.dt != DC_BF16 || (b.p && b.dt != DC_BF16 && b.dt != DC_F32))
        return false;
    if (M < 1 || K < 16 || K % 8 || F % kBF || (int64_t)F * 2 > INT32_MAX || M > 65535 * kBM) return false;
    if (!dc_aligned(out.p, 16) || !dc_aligned(inp.p, 16) || !dc_aligned(w.p, 16) || !sm90_device()) return false;
    // Fewer blocks than four waves of two an SM run slower than cuBLAS's
    // product and the GEGLU pass (SD's 2-row step, 320 blocks a call: 6.44 ->
    // 6.55 ms fused; its 16-row step, 2560 a call: 32.8 -> 32.5 ms).
    const int64_t blocks = (int64_t)(F / kBF) * ((M + kBM - 1) / kBM);
    if (blocks < 8LL * sm_count()) return false;
    CUtensorMap tx, tw;
    if (!make_map_2d(&tx, inp.p, M, K, kBM) || !make_map_2d(&tw, w.p, 2 * (int64_t)F, K, kBF)) return false;
    GegluParams p;
    memset(&p, 0, sizeof p);
    p.out = (__nv_bfloat16 *)out.p, p.bias = b.p, p.bias_bf16 = b.p && b.dt == DC_BF16;
    p.M = M, p.K = K, p.F = F, p.nk = (K + kBK - 1) / kBK;
    // More than 48 KB of shared memory: opted into at every launch (cheap, per
    // current device, legal during stream capture).
    cudaFuncSetAttribute((const void *)geglu_fwd_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
    const dim3 grid((unsigned)(F / kBF), (unsigned)((M + kBM - 1) / kBM));
    geglu_fwd_sm90<<<grid, kThreadsGeglu, kSmemBytes, dc_cuda(be)->stream>>>(tx, tw, p);
    return true;
}
