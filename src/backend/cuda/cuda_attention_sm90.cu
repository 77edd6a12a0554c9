// Hopper's flash attention forward (bf16, heads of 17 to 48, no mask, at
// least 256 keys): the attention op's first choice on an sm_90 GPU where a
// call fits, ahead of cuDNN's. SD 1.x's heads of 40 are its reason: cuDNN
// runs them as 64 wide, this kernel as 48 (S = Q K^T over 3 steps of 16
// columns, O = P V 48 wide). On an H100 the 64x64 level's self-attention at
// 16 rows takes 1.14 ms a call against cuDNN's 1.19 (docs/PERFORMANCE.md).
//
// A block takes 192 queries of one head: three consumer warpgroups of 64
// query rows and one producer warp. The producer brings Q once and K, V
// tiles of 128 keys through a two-stage ring with the tensor memory
// accelerator (TMA: its tensor maps take the op's strides, pad the head to
// 64 columns and the last tiles with zeros, and lay rows out in the 128-byte
// swizzle the wgmma instructions read). Each consumer warpgroup, a key tile
// at a time:
//
//   S = Q K^T          wgmma, both from shared memory, fp32 in registers
//   online softmax     in registers (row max across the 4 lanes of a quad)
//   O += P V           wgmma, P from registers as bf16, V from shared memory
//
// Barriers (mbarrier): full[s] is armed by the producer with the tile's byte
// count and completed by the TMA; empty[s] collects one arrival from every
// consumer warp once its products have read the stage.
//
// Fragment layouts: a wgmma accumulator of 64 x N gives warp w of the
// warpgroup rows 16w .. 16w+15, and within them the mma.sync m16n8 layout
// for every 8 columns (lane = 4g + t: row g, columns 2t, 2t+1 in registers
// 4n, 4n+1; row g+8 in 4n+2, 4n+3). The A operand from registers is the
// mma.sync A fragment of the warp's 16 rows, so two adjacent 8-column blocks
// of S are one 16-key block of P (cuda_attention_tc.h, c_to_a).
//
// Shared memory holds rows of 64 bf16 in the 128-byte swizzle (cuda_sm90.h):
// Q and K are read K-major (the head dim contiguous), V N-major (the
// transpose bit of the P V product).
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_tc.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sm90.h"

namespace {

constexpr int kBN = 128;                      // keys a tile
constexpr int kStages = 2;                    // K and V ring depth
constexpr int kMinKeys = 256;                 // fewer (SD's cross-attention to 77) run faster on cuDNN's
constexpr int kRowBytes = 128;                // 64 bf16: the swizzle's row
constexpr int kTileBytes = kBN * kRowBytes;   // one K or V tile: 16 KB

constexpr int kWG = 3;                         // consumer warpgroups a block, 64 queries each
constexpr int kBM = 64 * kWG;                  // queries a block
constexpr int kThreadsSm90 = 128 * kWG + 32;   // + the producer warp

struct Sm90Smem {
    alignas(1024) uint8_t q[kBM * kRowBytes];
    alignas(1024) uint8_t k[kStages][kTileBytes];
    alignas(1024) uint8_t v[kStages][kTileBytes];
    uint64_t q_full, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];
};
constexpr size_t kSmemBytes = sizeof(Sm90Smem) + 1024;  // + room to align the base

// Where the token, head and sample coordinates go in a tensor map (its
// dimensions 1..3, sorted by stride; dimension 0 is the head's columns).
struct MapDims {
    int t, h, b;
};
struct Sm90Params {
    MapDims q, k, v;
    bf16 *out;
    float *lse;
    int64_t ob, ot, oh;
    int H, Tq, Tk, Dh;
    float sl2;  // scale * log2(e)
};

#if SM90_BODY
__device__ __forceinline__ void tile_coords(int (&c)[4], MapDims d, int t, int h, int b) {
    c[0] = 0, c[1] = c[2] = c[3] = 0;
#pragma unroll
    for (int i = 1; i < 4; i++) c[i] = i == d.t ? t : i == d.h ? h : b;
}

// 2^x in one MUFU.EX2 (inputs below -126 flush to 0; exp2f adds a range fix).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// The same for A fragments a product may still be reading.
__device__ __forceinline__ void reg_fence_u(uint32_t (&a)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) asm volatile("" : "+r"(a[i][k])::"memory");
}

// d[16] += A B: A 64x16 from registers (a: the mma.sync A fragment of each
// warp's 16 rows), B 16x32 from shared memory, stored N-major (transposed).
__device__ __forceinline__ void wgmma_rs_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// d[24] += A B: A 64x16 from registers (a: the mma.sync A fragment of each
// warp's 16 rows), B 16x48 from shared memory, stored N-major (transposed).
__device__ __forceinline__ void wgmma_rs_n48(float (&d)[24], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23"
        "}, {%24, %25, %26, %27}, %28, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

#endif  // SM90_BODY

template <int DN> __device__ __forceinline__ void wgmma_pv(float (&o)[DN / 2], const uint32_t (&a)[4], uint64_t db) {
#if SM90_BODY
    if constexpr (DN == 32) wgmma_rs_n32(o, a, db);
    else wgmma_rs_n48(o, a, db);
#endif
}

#if SM90_BODY
// S = Q K^T for one tile: KS wgmmas over 16 head columns each, committed.
template <int KS> __device__ __forceinline__ void qk_issue(float (&sc)[64], uint64_t dq, uint64_t dk) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KS; kk++) wgmma_ss_n128(sc, dq + 2 * kk, dk + 2 * kk, kk);
    wgmma_commit();
}
// O += P V for one tile: 8 wgmmas over 16 keys each, committed.
template <int DN> __device__ __forceinline__ void pv_issue(float (&o)[DN / 2], const uint32_t (&pa)[8][4], uint64_t dv) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++) wgmma_pv<DN>(o, pa[kk], dv + kk * (2048 >> 4));
    wgmma_commit();
}
template <int DN> __device__ __forceinline__ void rescale(float (&o)[DN / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < DN / 8; n++) {
        o[4 * n] *= alpha[0], o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1], o[4 * n + 3] *= alpha[1];
    }
}
// The online softmax of one tile of scores (keys k0 .. k0 + 127, those past
// Tk masked), in place: the new row max m (raw scores; scale > 0), alpha =
// the factor for what came before, l the running row sums (this lane's
// columns; only where `sums`), and sc = 2^(s sl2 - m sl2): one FFMA and one
// MUFU.EX2 a score.
template <bool sums>
__device__ __forceinline__ void softmax_exp(float (&sc)[64], float (&m)[2], float (&l)[2], float (&alpha)[2], int k0,
                                            int Tk, int t, float sl2) {
    if (k0 + kBN > Tk) {
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (k0 + 8 * n + 2 * t + (e & 1) >= Tk) sc[4 * n + e] = -INFINITY;
    }
    // Row maxima and sums as trees, not chains of dependent instructions.
    float mx[2], ms[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v[16];
#pragma unroll
        for (int n = 0; n < 16; n++) v[n] = fmaxf(sc[4 * n + 2 * r], sc[4 * n + 2 * r + 1]);
#pragma unroll
        for (int n = 0; n < 8; n++) v[n] = fmaxf(v[n], v[n + 8]);
#pragma unroll
        for (int n = 0; n < 4; n++) v[n] = fmaxf(v[n], v[n + 4]);
        mx[r] = fmaxf(m[r], fmaxf(fmaxf(v[0], v[2]), fmaxf(v[1], v[3])));
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        alpha[r] = fast_exp2((m[r] - mx[r]) * sl2);
        m[r] = mx[r];
        ms[r] = mx[r] * sl2;
        l[r] *= alpha[r];
    }
    float part[2][4] = {};
#pragma unroll
    for (int n = 0; n < 16; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float x = fmaf(sc[4 * n + e], sl2, -ms[e >> 1]);
            const float pr = fast_exp2(x);
            sc[4 * n + e] = pr;
            if (sums) part[e >> 1][(n & 1) * 2 + (e & 1)] += pr;
        }
    }
    if (sums)
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] += (part[r][0] + part[r][1]) + (part[r][2] + part[r][3]);
}
// P as the bf16 A fragments of the PV product: 8-column blocks 2k and 2k+1
// of the scores are the 16 keys of step k.
__device__ __forceinline__ void pack_p(const float (&sc)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
    for (int n = 0; n < 16; n++) {
        pa[n / 2][2 * (n & 1)] = pack_bf16(sc[4 * n], sc[4 * n + 1]);
        pa[n / 2][2 * (n & 1) + 1] = pack_bf16(sc[4 * n + 2], sc[4 * n + 3]);
    }
}
#endif

// KS: 16-column steps of the head in S = Q K^T; DN: the head's columns in
// O (32 or 48, at least Dh). ONES (Dh = DN - 8): the row sums of P come from
// the P V product itself, through a column of ones written into V's first
// spare column (the TMA fills columns Dh.. with zeros; O's column DN - 8 is
// rescaled with the rest of O), instead of one FADD a score. The kernel is
// bound by issuing its softmax beside the products, so the FADDs cost: SD
// 1.x's 16-row step takes 0.25-0.45 ms less (docs/PERFORMANCE.md). Every
// consumer warpgroup writes the ones (the same bytes) before its own P V.
template <int KS, int DN, bool ONES>
__global__ void __launch_bounds__(kThreadsSm90, 1)
    attn_fwd_sm90(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, const Sm90Params p) {
#if SM90_BODY
    extern __shared__ uint8_t smem_raw[];
    Sm90Smem &sm = *reinterpret_cast<Sm90Smem *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    const int q0 = blockIdx.x * kBM, h = blockIdx.y, b = blockIdx.z;
    const int ntiles = (p.Tk + kBN - 1) / kBN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;

    if (threadIdx.x == 0) {
        mbar_init(smem_u32(&sm.q_full), 1);
        for (int s = 0; s < kStages; s++) {
            mbar_init(smem_u32(&sm.k_full[s]), 1);
            mbar_init(smem_u32(&sm.v_full[s]), 1);
            mbar_init(smem_u32(&sm.k_empty[s]), 4 * kWG);
            mbar_init(smem_u32(&sm.v_empty[s]), 4 * kWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    dc_pdl_enter();

    if (wg == kWG) {  // the producer warp: one lane issues every copy
        if (lane == 0) {
            int c[4];
            tile_coords(c, p.q, q0, h, b);
            mbar_expect_tx(smem_u32(&sm.q_full), kBM * kRowBytes);
            tma_load_4d(smem_u32(sm.q), &tq, c, smem_u32(&sm.q_full));
            for (int j = 0; j < ntiles; j++) {
                const int s = j % kStages, use = j / kStages;
                if (use > 0) mbar_wait(smem_u32(&sm.k_empty[s]), (use - 1) & 1);
                tile_coords(c, p.k, j * kBN, h, b);
                mbar_expect_tx(smem_u32(&sm.k_full[s]), kTileBytes);
                tma_load_4d(smem_u32(sm.k[s]), &tk, c, smem_u32(&sm.k_full[s]));
                if (use > 0) mbar_wait(smem_u32(&sm.v_empty[s]), (use - 1) & 1);
                tile_coords(c, p.v, j * kBN, h, b);
                mbar_expect_tx(smem_u32(&sm.v_full[s]), kTileBytes);
                tma_load_4d(smem_u32(sm.v[s]), &tv, c, smem_u32(&sm.v_full[s]));
            }
        }
        return;
    }

    const int g = lane / 4, t = lane % 4, wrow = 16 * (warp % 4);
    float o[DN / 2], sc[64];
#pragma unroll
    for (int i = 0; i < DN / 2; i++) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    const uint64_t dq = sw128_desc(smem_u32(sm.q + wg * 64 * kRowBytes));
    uint32_t pa[8][4];
    mbar_wait(smem_u32(&sm.q_full), 0);
    auto k_desc = [&](int j) { return sw128_desc(smem_u32(sm.k[j % kStages])); };
    auto v_desc = [&](int j) { return sw128_desc(smem_u32(sm.v[j % kStages])); };
    auto full = [&](uint64_t *bars, int j) { mbar_wait(smem_u32(&bars[j % kStages]), (j / kStages) & 1); };
    auto release = [&](uint64_t *bars, int j) {  // one arrival a warp, once every lane is done
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&bars[j % kStages]));
    };

    for (int j = 0; j < ntiles; j++) {
        full(sm.k_full, j);
        qk_issue<KS>(sc, dq, k_desc(j));
        wgmma_wait<0>();
        reg_fence(sc);
        release(sm.k_empty, j);
        softmax_exp<!ONES>(sc, m, l, alpha, j * kBN, p.Tk, t, p.sl2);
        pack_p(sc, pa);
        // once the row maxima settle, most tiles leave them (alpha = 1): a warp
        // whose rows all kept theirs skips multiplying O by 1
        if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) rescale<DN>(o, alpha);
        full(sm.v_full, j);
        if (ONES) {  // column DN - 8 of the tile's keys to 1: O's column DN - 8 sums P
            const int row = threadIdx.x % 128;
            uint8_t *vt = sm.v[j % kStages] + row * kRowBytes + (((DN / 8 - 1) ^ (row & 7)) << 4);
            *reinterpret_cast<uint16_t *>(vt) = 0x3F80;  // bf16 1.0
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            // the warpgroup's own named barrier, by immediate: a register id
            // makes ptxas reserve all 16
            if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
            else if (wg == 1) asm volatile("bar.sync 2, 128;\n" ::: "memory");
            else asm volatile("bar.sync 3, 128;\n" ::: "memory");
        }
        pv_issue<DN>(o, pa, v_desc(j));
        wgmma_wait<0>();
        reg_fence(o), reg_fence_u(pa);
        release(sm.v_empty, j);
    }

    const int64_t bh = (int64_t)b * p.H + h;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (ONES) {  // the row's sum sits in column DN - 8: lane t = 0 of its quad, element 2r of the last block
            l[r] = __shfl_sync(0xffffffffu, o[4 * (DN / 8 - 1) + 2 * r], lane & ~3);
        } else {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        const int row = q0 + wg * 64 + wrow + g + 8 * r;
        if (row >= p.Tq) continue;
        const float inv = 1.0f / l[r];
        bf16 *orow = p.out + b * p.ob + h * p.oh + row * p.ot;
#pragma unroll
        for (int n = 0; n < DN / 8; n++) {
            const int col = 8 * n + 2 * t;
            if (col < p.Dh)
                *reinterpret_cast<__nv_bfloat162 *>(orow + col) =
                    __floats2bfloat162_rn(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
        }
        if (t == 0 && p.lse) p.lse[bh * p.Tq + row] = (m[r] * p.sl2 + log2f(l[r])) * kLn2;
    }
#endif
}

// A tensor map over one operand, [B, H, T, Dh] in layout l at base, boxes of
// `rows` tokens x 64 columns of one head, 128-byte swizzle, zeros out of
// bounds. Its dimensions 1..3 are token, head and sample sorted by stride;
// d says where each went. False where the TMA cannot take the layout.
static bool make_map(CUtensorMap *map, MapDims *d, const void *base, dc_attn_layout l, int B, int H, int T, int Dh,
                     int rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = sm90_encode_fn();
    if (!enc) return false;
    struct { int64_t stride; int64_t size; int which; } dim[3] = {{l.token, T, 0}, {l.head, H, 1}, {l.batch, B, 2}};
    for (int i = 0; i < 3; i++)  // sort by stride (a sample of one token or head has any stride)
        for (int k = i + 1; k < 3; k++)
            if (dim[k].stride < dim[i].stride) {
                auto x = dim[i];
                dim[i] = dim[k], dim[k] = x;
            }
    cuuint64_t gdim[4] = {(cuuint64_t)Dh, 0, 0, 0}, gstride[3];
    cuuint32_t box[4] = {64, 1, 1, 1}, estride[4] = {1, 1, 1, 1};
    for (int i = 0; i < 3; i++) {
        const int64_t bytes = dim[i].stride * (int64_t)sizeof(bf16);
        if (bytes <= 0 || bytes % 16 || bytes >= ((int64_t)1 << 40)) return false;
        gdim[i + 1] = (cuuint64_t)dim[i].size, gstride[i] = (cuuint64_t)bytes;
        if (dim[i].which == 0) box[i + 1] = (cuuint32_t)rows, d->t = i + 1;
        if (dim[i].which == 1) d->h = i + 1;
        if (dim[i].which == 2) d->b = i + 1;
    }
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void *>(base), gdim, gstride, box, estride,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool dc_attn_fwd_sm90(dc_backend *be, const AttnParams &ap, const dc_attn_shape *s) {
    if (s->causal || s->Dh != s->Dv || s->Dh <= 16 || s->Dh > 48 || s->Dh % 8) return false;
    if (s->Tk < kMinKeys || s->H > 65535 || s->B > 65535) return false;  // grid y and z
    const dc_attn_layout l[4] = {s->q, s->k, s->v, s->out};
    const void *ptr[4] = {ap.q, ap.k, ap.v, ap.out};
    for (int i = 0; i < 4; i++)
        if (l[i].batch % 8 || l[i].token % 8 || l[i].head % 8 || !dc_aligned(ptr[i], 16)) return false;
    if (!sm90_device()) return false;
    Sm90Params p;
    memset(&p, 0, sizeof p);
    CUtensorMap mq, mk, mv;
    if (!make_map(&mq, &p.q, ap.q, s->q, s->B, s->H, s->Tq, s->Dh, kBM) ||
        !make_map(&mk, &p.k, ap.k, s->k, s->B, s->H, s->Tk, s->Dh, kBN) ||
        !make_map(&mv, &p.v, ap.v, s->v, s->B, s->H, s->Tk, s->Dh, kBN))
        return false;
    p.out = (bf16 *)ap.out, p.lse = ap.lse;
    p.ob = ap.ob, p.ot = ap.ot, p.oh = ap.oh;
    p.H = s->H, p.Tq = s->Tq, p.Tk = s->Tk, p.Dh = s->Dh;
    p.sl2 = ap.scale * kLog2e;
    const dim3 grid((unsigned)((s->Tq + kBM - 1) / kBM), (unsigned)s->H, (unsigned)s->B);
    auto launch = [&](auto kernel) {
        allow_smem((const void *)kernel, kSmemBytes);
        dc_launch(be, kernel, grid, kThreadsSm90, kSmemBytes, mq, mk, mv, p);
    };
    // a spare column (heads of 24 or 40) carries the row sums through P V
    if (s->Dh <= 32) s->Dh == 24 ? launch(attn_fwd_sm90<2, 32, true>) : launch(attn_fwd_sm90<2, 32, false>);
    else s->Dh == 40 ? launch(attn_fwd_sm90<3, 48, true>) : launch(attn_fwd_sm90<3, 48, false>);
    return true;
}
