// Winograd's F(4x4, 3x3) for bf16 channels-last 3x3 convolutions of stride
// 1 and padding 1: each 4x4 block of outputs (a tile) takes 36 products a
// channel pair where the direct convolution takes 144, so a convolution costs
// 36 batched matrix products of a quarter of the multiply-adds, plus three
// passes:
//
//   U[e][co][ci] = (G g G^T)[e]        the weights (fp16), each call or kept (below)
//   V[e][t][ci]  = (B^T d B)[e]        d: tile t's 6x6 input patch, zeros outside (fp16)
//   M[e]         = V[e] U[e]^T / 16    cuBLASLt, 36 products [T, Ci] x [Ci, Co] (fp16)
//   out[tile t]  = A^T 16 M[.][t] A + b   the 4x4 outputs (bf16)
//
// with the points 0, 1, -1, 2, -2 (Lavin and Gray): G = [1/4 0 0; -1/6 -1/6
// -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1], B^T = [4 0 -5 0
// 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0
// 1], A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]. The
// transforms compute in fp32. Their constants reach 5 and 8, so the planes are
// fp16 (bf16 would lose ten times the precision), with fp32 accumulation in
// the products: a convolution's error is 2.5 times the direct one's (4.1e-3
// against 1.6e-3 relative in test_cuda_latent; 3.5e-3 with fp32 M, which
// moved twice the bytes; F(2x2, 3x3) with bf16 planes, tried first, 5e-3),
// and SD 1.5's UNet at 16 rows stays at 1.5e-2 from diffusers' fp32 (1.49e-2
// without).
//
// On an H100 under its power limit a convolution's cost is its energy; the
// planes' memory passes cost about what the saved multiplications do for 320
// channels at the 64x64 level of SD's UNet, so Winograd runs only where it
// measured cheaper: at least 640 input channels, maps of at most 64x64, at
// least 1024 2x2 blocks of outputs, and maps larger than 32x32 only in batches
// of at least 8 (SD 1.x's 16-row step: the 640- and 960-channel convolutions
// of the 64x64 level and all of the 32x32 and 16x16 levels'; at 2 rows the
// 64x64 level's measured no faster and would add 0.14 GB to one picture's
// memory; the 8x8 level's products are too small to pay). opts.winograd off
// turns it off. The planes live in the convolution workspace, grown at reserve
// (about 0.4 GB at SD 1.x's 16 rows).
//
// While the weights are frozen (freeze_weights: an inference pipeline), each
// convolution's U is made once, on its first call outside a graph's capture,
// and kept by the weights' address (about 2 GB for SD 1.x at 16 rows): made
// each call, U is about 3.5 GB written and read a 16-row step.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

namespace {

constexpr int kTPB = 256;
// U is made kScale times larger and V as much smaller (powers of two: exact),
// so V's fp16 holds maps up to about 2e4 in magnitude (its transform gains up
// to 100 times) where unscaled it would overflow above about 650.
constexpr float kScale = 32.0f;
// M is stored kMScale times smaller (the products' alpha) and scaled back as
// the output transform reads it: its fp16 then holds values up to about 1e6,
// and loses precision only below about 1e-3 (an absolute error under 1e-6).
constexpr float kMScale = 16.0f;

int64_t blocks2(const dc_conv2d_shape *s) { return (int64_t)s->B * ((s->H + 1) / 2) * ((s->W + 1) / 2); }
int64_t tiles(const dc_conv2d_shape *s) { return (int64_t)s->B * ((s->H + 3) / 4) * ((s->W + 3) / 4); }
int64_t round256(int64_t n) { return (n + 255) & ~(int64_t)255; }
int64_t u_bytes(const dc_conv2d_shape *s) { return round256((int64_t)36 * s->Co * s->Ci * 2); }
int64_t v_bytes(const dc_conv2d_shape *s) { return round256(36 * tiles(s) * s->Ci * 2); }
int64_t m_bytes(const dc_conv2d_shape *s) { return round256(36 * tiles(s) * s->Co * 2); }

// One column (or row) of G g: out[0..5] from g[0..2].
__device__ __forceinline__ void g6(float o[6], float g0, float g1, float g2) {
    o[0] = 0.25f * g0, o[1] = -(g0 + g1 + g2) / 6.0f, o[2] = -(g0 - g1 + g2) / 6.0f;
    o[3] = g0 / 24.0f + g1 / 12.0f + g2 / 6.0f, o[4] = g0 / 24.0f - g1 / 12.0f + g2 / 6.0f, o[5] = g2;
}
// U[e][co][ci] from w[co][kh][kw][ci]: a thread a (co, ci).
__global__ void k_wino_weights(__half *U, const __nv_bfloat16 *w, int Co, int Ci) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, n = (int64_t)Co * Ci;
    if (i >= n) return;
    const int64_t co = i / Ci, ci = i % Ci;
    float g[3][3], t[6][3];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) g[a][b] = __bfloat162float(w[(co * 9 + a * 3 + b) * Ci + ci]);
    for (int b = 0; b < 3; b++) {
        float o[6];
        g6(o, g[0][b], g[1][b], g[2][b]);
        for (int a = 0; a < 6; a++) t[a][b] = o[a];
    }
    for (int a = 0; a < 6; a++) {
        float u[6];
        g6(u, t[a][0], t[a][1], t[a][2]);
        for (int b = 0; b < 6; b++) U[(a * 6 + b) * n + i] = __float2half(kScale * u[b]);
    }
}
// B^T's rows: out[0..5] from d[0..5]
__device__ __forceinline__ void bt6(float o[6], const float d[6]) {
    o[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
    o[1] = -4.0f * (d[1] + d[2]) + d[3] + d[4];
    o[2] = 4.0f * (d[1] - d[2]) - d[3] + d[4];
    o[3] = 2.0f * (d[3] - d[1]) - d[2] + d[4];
    o[4] = 2.0f * (d[1] - d[3]) - d[2] + d[4];
    o[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
}
// Thread i's tile t and first channel pair ch: consecutive threads along the
// channels (32-bit: the rule keeps tiles x channels below 2^31).
__device__ __forceinline__ void tile_of(unsigned i, int cg, int th, int tw, unsigned *t, int *ch, int *b, int *ty,
                                        int *tx) {
    *t = i / cg, *ch = (int)(i - *t * cg) * 2;
    const unsigned r = *t / tw;
    *tx = (int)(*t - r * tw), *ty = (int)(r % th), *b = (int)(r / th);
}
// The input transform's blocks: kTX tiles side by side and kCG channels. The
// block first copies their 6 x (4 kTX + 2) patch of pixels into shared memory
// in 16-byte pieces (each input value is read about 1.7 times instead of 2.25,
// and in whole 128-byte lines); a thread then transforms one tile's 2 channels.
constexpr int kTX = 4, kCG = 64, kPW = 4 * kTX + 2, kInTPB = kTX * kCG / 2;
struct in_grid {
    int th, tw, ntx, ncg;  // tile rows and columns, blocks along a tile row and along the channels
};
__host__ __device__ inline in_grid in_grid_of(int H, int W, int Ci) {
    const int tw = (W + 3) / 4;
    return {(H + 3) / 4, tw, (tw + kTX - 1) / kTX, (Ci + kCG - 1) / kCG};
}

// V[e][t][ci, ci+1] from tile t's 6x6 patch of x[B, H, W, Ci] (16-byte aligned,
// Ci a multiple of 8).
__global__ void __launch_bounds__(kInTPB) k_wino_input(__half *V, const __nv_bfloat16 *x, int B, int H, int W,
                                                        int Ci) {
    __shared__ uint4 patch[6][kPW][kCG / 8];
    const in_grid gr = in_grid_of(H, W, Ci);
    const int th = gr.th, tw = gr.tw, ntx = gr.ntx, ncg = gr.ncg;
    unsigned blk = blockIdx.x;
    const int g = (int)(blk % ncg), txg = (int)(blk / ncg % ntx);
    blk /= (unsigned)ncg * ntx;
    const int ty = (int)(blk % th), b = (int)(blk / th), ch0 = g * kCG;
    const __nv_bfloat16 *xb = x + (size_t)b * H * W * Ci;
    for (int j = threadIdx.x; j < 6 * kPW * (kCG / 8); j += kInTPB) {
        const int v = j % (kCG / 8), c = j / (kCG / 8) % kPW, r = j / (kCG / 8 * kPW);
        const int yy = 4 * ty - 1 + r, xx = 4 * kTX * txg - 1 + c, ch = ch0 + 8 * v;
        uint4 q = make_uint4(0, 0, 0, 0);
        if (yy >= 0 && yy < H && xx >= 0 && xx < W && ch < Ci)
            q = __ldg((const uint4 *)(xb + ((size_t)yy * W + xx) * Ci + ch));
        patch[r][c][v] = q;
    }
    __syncthreads();
    const int txl = threadIdx.x / (kCG / 2), cp = threadIdx.x % (kCG / 2), tx = kTX * txg + txl, ci = ch0 + 2 * cp;
    if (tx >= tw || ci >= Ci) return;
    const unsigned t = ((unsigned)b * th + ty) * tw + tx, T = (unsigned)B * th * tw;
    const unsigned *ps = (const unsigned *)patch;  // bf16 pairs: [6][kPW][kCG / 2]
    unsigned raw[6][6];
#pragma unroll
    for (int r = 0; r < 6; r++)
#pragma unroll
        for (int c = 0; c < 6; c++) raw[r][c] = ps[(r * kPW + 4 * txl + c) * (kCG / 2) + cp];
    float e[6][6][2];
#pragma unroll
    for (int c = 0; c < 6; c++) {
        float d[2][6];
#pragma unroll
        for (int r = 0; r < 6; r++) {
            const float2 v = __bfloat1622float2(*(const __nv_bfloat162 *)&raw[r][c]);
            d[0][r] = v.x, d[1][r] = v.y;
        }
        for (int k = 0; k < 2; k++) {
            float o[6];
            bt6(o, d[k]);
            for (int a = 0; a < 6; a++) e[a][c][k] = o[a];
        }
    }
    const size_t plane = (size_t)T * Ci, at = (size_t)t * Ci + ci;
#pragma unroll
    for (int a = 0; a < 6; a++) {
        float o[2][6];
        for (int k = 0; k < 2; k++) {
            float r[6];
            for (int c = 0; c < 6; c++) r[c] = e[a][c][k];
            bt6(o[k], r);
        }
        for (int c = 0; c < 6; c++)
            *(__half2 *)(V + (a * 6 + c) * plane + at) =
                __floats2half2_rn(o[0][c] / kScale, o[1][c] / kScale);
    }
}
// A^T's rows: y[0..3] from m[0..5]
__device__ __forceinline__ void at6(float y[4], const float m[6]) {
    y[0] = m[0] + m[1] + m[2] + m[3] + m[4];
    y[1] = m[1] - m[2] + 2.0f * (m[3] - m[4]);
    y[2] = m[1] + m[2] + 4.0f * (m[3] + m[4]);
    y[3] = m[1] - m[2] + 8.0f * (m[3] - m[4]) + m[5];
}
// out[b, 4ty + p, 4tx + q, co, co+1] = (A^T M A)[p][q] + bias: a thread a tile
// and 2 channels. BIAS: 0 none, 1 F32, 2 BF16.
template <int BIAS>
__global__ void k_wino_output(__nv_bfloat16 *out, const __half *M, const void *bias, int B, int H, int W, int Co) {
    const int th = (H + 3) / 4, tw = (W + 3) / 4, cg = Co / 2;
    const unsigned T = (unsigned)B * th * tw, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * cg) return;
    unsigned t;
    int co, b, ty, tx;
    tile_of(i, cg, th, tw, &t, &co, &b, &ty, &tx);
    const size_t plane = (size_t)T * Co, at = (size_t)t * Co + co;
    unsigned raw[36];  // the tile's fp16 pairs of the 36 planes, loaded first
#pragma unroll
    for (int j = 0; j < 36; j++) raw[j] = __ldg((const unsigned *)(M + j * plane + at));
    float e[4][6][2];  // A^T M, row by row of the planes' columns
#pragma unroll
    for (int c = 0; c < 6; c++) {
        float m[2][6];
#pragma unroll
        for (int a = 0; a < 6; a++) {
            const float2 v = __half22float2(*(const __half2 *)&raw[a * 6 + c]);
            m[0][a] = v.x * kMScale, m[1][a] = v.y * kMScale;
        }
        for (int k = 0; k < 2; k++) {
            float y[4];
            at6(y, m[k]);
            for (int p = 0; p < 4; p++) e[p][c][k] = y[p];
        }
    }
    float bv[2] = {0.0f, 0.0f};
    if (BIAS == 1) bv[0] = ((const float *)bias)[co], bv[1] = ((const float *)bias)[co + 1];
    if (BIAS == 2) {
        const float2 v = __bfloat1622float2(*(const __nv_bfloat162 *)((const __nv_bfloat16 *)bias + co));
        bv[0] = v.x, bv[1] = v.y;
    }
    for (int p = 0; p < 4; p++) {
        float y[2][4];
        for (int k = 0; k < 2; k++) {
            float r[6];
            for (int c = 0; c < 6; c++) r[c] = e[p][c][k];
            at6(y[k], r);
        }
        const int yy = 4 * ty + p;
        if (yy >= H) continue;
        for (int q = 0; q < 4; q++) {
            const int xx = 4 * tx + q;
            if (xx >= W) continue;
            *(__nv_bfloat162 *)(out + (((size_t)b * H + yy) * W + xx) * Co + co) =
                __floats2bfloat162_rn(y[0][q] + bv[0], y[1][q] + bv[1]);
        }
    }
}

// U of weights w (shape s) into U, on the stream.
void make_u(dc_cuda_ctx *c, void *U, const void *w, const dc_conv2d_shape *s) {
    const int64_t nw = (int64_t)s->Co * s->Ci;
    k_wino_weights<<<dc_blocks(nw, kTPB), kTPB, 0, c->stream>>>((__half *)U, (const __nv_bfloat16 *)w, s->Co, s->Ci);
}

}  // namespace

struct dc_wino_u {
    const void *w;  // the weights' address, and their shape
    int Co, Ci;
    void *U;        // [36][Co][Ci] fp16, kScale times the transform
};

// The kept U of weights w (shape s), made now if it is not kept yet and the
// stream is not being captured; NULL where none is kept (the caller makes U
// in the workspace).
static const void *kept_u(dc_cuda_ctx *c, const void *w, const dc_conv2d_shape *s) {
    for (int i = 0; i < c->nwino_u; i++)
        if (c->wino_u[i].w == w && c->wino_u[i].Co == s->Co && c->wino_u[i].Ci == s->Ci) return c->wino_u[i].U;
    cudaStreamCaptureStatus cap;
    if (cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) return NULL;
    if (c->nwino_u == c->cap_wino_u) {
        const int n = c->cap_wino_u ? 2 * c->cap_wino_u : 32;
        dc_wino_u *t = (dc_wino_u *)realloc(c->wino_u, n * sizeof *t);
        if (!t) return NULL;
        c->wino_u = t, c->cap_wino_u = n;
    }
    const size_t bytes = (size_t)u_bytes(s);
    void *U = NULL;
    if (!dc_cuda_fits_cap(c, bytes)) return NULL;  // made each call then
    if (cudaMalloc(&U, bytes) != cudaSuccess) return cudaGetLastError(), (const void *)NULL;
    make_u(c, U, w, s);
    c->wino_u[c->nwino_u++] = (dc_wino_u){w, s->Co, s->Ci, U};
    c->wino_u_bytes += bytes;
    dc_cuda_note_peak(c);
    return U;
}

extern "C" void dc_cuda_wino_free(dc_cuda_ctx *c) {
    for (int i = 0; i < c->nwino_u; i++) cudaFree(c->wino_u[i].U);  // waits for the work that uses it
    c->frees += c->nwino_u > 0;  // a graph that reads one is stale
    free(c->wino_u);
    c->wino_u = NULL, c->nwino_u = c->cap_wino_u = 0, c->wino_u_bytes = 0;
}

extern "C" void dc_cuda_freeze_weights(dc_backend *be, bool frozen) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (!frozen) dc_cuda_wino_free(c);
    c->frozen = frozen;
}

extern "C" size_t dc_cuda_winograd_ws(const dc_backend *be, const dc_conv2d_shape *s, dc_dtype dt) {
    const bool fits = dt == DC_BF16 && s->nhwc && s->k == 3 && s->stride == 1 && s->pad_t == 1 && s->pad_b == 1 &&
                      s->pad_l == 1 && s->pad_r == 1 && s->Ci % 8 == 0 && s->Co % 8 == 0;
    // where it measured cheaper than cuDNN (above)
    const int64_t hw = (int64_t)s->H * s->W;
    const bool pays = s->Ci >= 640 && hw <= 4096 && (hw <= 1024 || s->B >= 8) && blocks2(s) >= 1024 &&
                      tiles(s) * (s->Ci > s->Co ? s->Ci : s->Co) / 2 <= INT32_MAX;
    if (!fits || !pays || !be->opts.winograd) return 0;
    return (size_t)(u_bytes(s) + v_bytes(s) + m_bytes(s));
}

extern "C" bool dc_cuda_conv_winograd(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b,
                                      const dc_conv2d_shape *s) {
    dc_cuda_ctx *c = dc_cuda(be);
    const size_t need = dc_cuda_winograd_ws(be, s, x.dt);
    if (!need || need > c->conv_ws_bytes || (b.p && b.dt != DC_BF16 && b.dt != DC_F32) || !dc_aligned(x.p, 16) ||
        !dc_aligned(out.p, 4) || (b.dt == DC_BF16 && b.p && !dc_aligned(b.p, 4)))
        return false;
    if (c->prof) dc_cuda_prof_mark(c, "conv2d_fwd: Winograd F(4x4, 3x3)");
    const int64_t T = tiles(s), nw = (int64_t)s->Co * s->Ci;
    const void *U = c->frozen ? kept_u(c, w.p, s) : NULL;
    __half *V = (__half *)((char *)c->conv_ws + u_bytes(s));
    __half *M = (__half *)((char *)c->conv_ws + u_bytes(s) + v_bytes(s));
    if (!U) make_u(c, c->conv_ws, w.p, s), U = c->conv_ws;
    const in_grid gr = in_grid_of(s->H, s->W, s->Ci);
    const unsigned in_blocks = (unsigned)s->B * gr.th * gr.ntx * gr.ncg;
    k_wino_input<<<in_blocks, kInTPB, 0, c->stream>>>(V, (const __nv_bfloat16 *)x.p, s->B, s->H, s->W, s->Ci);
    // column-major M_e[Co, T] = (U_e as Ci x Co)^T (V_e as Ci x T)
    dc_cuda_gemm_strided(be, s->Co, (int)T, s->Ci, U, s->Ci, nw, true, V, s->Ci, T * s->Ci, false, M, s->Co,
                         T * s->Co, DC_F16, DC_F16, 36, 1.0f / kMScale);
    const unsigned blocks = dc_blocks(T * (s->Co / 2), kTPB);
    __nv_bfloat16 *o = (__nv_bfloat16 *)out.p;
    if (!b.p) k_wino_output<0><<<blocks, kTPB, 0, c->stream>>>(o, M, NULL, s->B, s->H, s->W, s->Co);
    else if (b.dt == DC_F32) k_wino_output<1><<<blocks, kTPB, 0, c->stream>>>(o, M, b.p, s->B, s->H, s->W, s->Co);
    else k_wino_output<2><<<blocks, kTPB, 0, c->stream>>>(o, M, b.p, s->B, s->H, s->W, s->Co);
    return true;
}
