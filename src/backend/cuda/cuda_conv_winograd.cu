// Winograd's F(2x2, 3x3) for bf16 channels-last 3x3 convolutions of stride
// 1 and padding 1: each 2x2 block of outputs (a tile) takes 16 products a
// channel pair where the direct convolution takes 36, so a convolution costs
// 16 batched matrix products of 4/9 the multiply-adds, plus three passes:
//
//   U[e][co][ci] = (G g G^T)[e]        the weights: each call, or kept while frozen (below)
//   V[e][t][ci]  = (B^T d B)[e]        d: the 4x4 input patch of tile t (zeros outside)
//   M[e]         = V[e] U[e]^T         cuBLASLt, 16 products [T, Ci] x [Ci, Co], fp32 accumulation
//   out[tile t]  = A^T M[.][t] A + b   the 2x2 outputs
//
// with G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], B^T = [1 0 -1 0; 0 1 1 0;
// 0 -1 1 0; 0 1 0 -1], A^T = [1 1 1 0; 0 1 -1 -1]. U, V and M are bf16 (the
// transforms compute in fp32): a convolution's error is about three times the
// direct one's (5e-3 against 1.6e-3 relative in test_cuda_latent), while SD
// 1.5's UNet at 16 rows stays at 1.50e-2 from diffusers' fp32 (1.49e-2
// without; fp16 U and V planes with fp32 M gave 1.50e-2 as well and more
// energy).
//
// On an H100 under its power limit a convolution's cost is its energy; the
// planes' memory passes cost about what the saved multiplications do at the
// 64x64 level of SD's UNet, so Winograd runs only where it measured cheaper:
// at least 640 input channels, maps of at most 32x32, at least 1024 tiles
// (SD 1.x's 16-row step: the 32x32 and 16x16 levels; a batch of one picture
// never). DC_WINOGRAD=0 turns it off. The planes live in the convolution
// workspace, grown at reserve (about 0.4 GB at SD 1.x's 16 rows).
//
// While the weights are frozen (freeze_weights: an inference pipeline), each
// convolution's U is made once, on its first call outside a graph's capture,
// and kept by the weights' address (about 0.85 GB for SD 1.x at 16 rows):
// the per-call transform wrote and read about 1.4 GB a 16-row step.
// DC_WINOGRAD_KEEP=0 makes U each call all the same.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

namespace {

constexpr int kTPB = 256;
constexpr int kCh = 4;  // channels a thread of the transforms

int64_t tiles(const dc_conv2d_shape *s) { return (int64_t)s->B * ((s->H + 1) / 2) * ((s->W + 1) / 2); }
int64_t round256(int64_t n) { return (n + 255) & ~(int64_t)255; }
int64_t u_bytes(const dc_conv2d_shape *s) { return round256((int64_t)16 * s->Co * s->Ci * 2); }
int64_t v_bytes(const dc_conv2d_shape *s) { return round256(16 * tiles(s) * s->Ci * 2); }
int64_t m_bytes(const dc_conv2d_shape *s) { return round256(16 * tiles(s) * s->Co * 2); }

struct bf4 {
    __nv_bfloat162 a, b;
};
__device__ __forceinline__ void load4(float *f, const __nv_bfloat16 *p) {
    const bf4 v = *(const bf4 *)p;
    const float2 x = __bfloat1622float2(v.a), y = __bfloat1622float2(v.b);
    f[0] = x.x, f[1] = x.y, f[2] = y.x, f[3] = y.y;
}
__device__ __forceinline__ void store4(__nv_bfloat16 *p, const float *f) {
    bf4 v;
    v.a = __floats2bfloat162_rn(f[0], f[1]), v.b = __floats2bfloat162_rn(f[2], f[3]);
    *(bf4 *)p = v;
}

// U[e][co][ci] from w[co][kh][kw][ci]: a thread a (co, ci).
__global__ void k_wino_weights(__nv_bfloat16 *U, const __nv_bfloat16 *w, int Co, int Ci) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, n = (int64_t)Co * Ci;
    if (i >= n) return;
    const int64_t co = i / Ci, ci = i % Ci;
    float g[3][3], t[4][3];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) g[a][b] = __bfloat162float(w[(co * 9 + a * 3 + b) * Ci + ci]);
    for (int b = 0; b < 3; b++) {  // G g
        t[0][b] = g[0][b];
        t[1][b] = 0.5f * (g[0][b] + g[1][b] + g[2][b]);
        t[2][b] = 0.5f * (g[0][b] - g[1][b] + g[2][b]);
        t[3][b] = g[2][b];
    }
    for (int a = 0; a < 4; a++) {  // (G g) G^T
        const float u[4] = {t[a][0], 0.5f * (t[a][0] + t[a][1] + t[a][2]), 0.5f * (t[a][0] - t[a][1] + t[a][2]),
                            t[a][2]};
        for (int b = 0; b < 4; b++) U[(a * 4 + b) * n + i] = __float2bfloat16(u[b]);
    }
}

// One row (or column) of B^T d: out[0..3] from d[0..3].
__device__ __forceinline__ void bt(float o[4], float d0, float d1, float d2, float d3) {
    o[0] = d0 - d2, o[1] = d1 + d2, o[2] = d2 - d1, o[3] = d1 - d3;
}

// V[e][t][ci..ci+3] from tile t's 4x4 patch of x[B, H, W, Ci]: a thread a
// tile and 4 channels, consecutive threads along the channels.
__global__ void k_wino_input(__nv_bfloat16 *V, const __nv_bfloat16 *x, int B, int H, int W, int Ci) {
    const int th = (H + 1) / 2, tw = (W + 1) / 2, cg = Ci / kCh;
    const int64_t T = (int64_t)B * th * tw, i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= T * cg) return;
    const int64_t t = i / cg;
    const int ci = (int)(i % cg) * kCh, tx = (int)(t % tw), ty = (int)(t / tw % th), b = (int)(t / ((int64_t)tw * th));
    float e[4][4][kCh];  // B^T d, row by row of the patch's columns
    for (int c = 0; c < 4; c++) {
        float d[4][kCh];
        const int xx = 2 * tx - 1 + c;
        for (int r = 0; r < 4; r++) {
            const int yy = 2 * ty - 1 + r;
            if (yy >= 0 && yy < H && xx >= 0 && xx < W) load4(d[r], x + (((int64_t)b * H + yy) * W + xx) * Ci + ci);
            else
                for (int k = 0; k < kCh; k++) d[r][k] = 0.0f;
        }
        for (int k = 0; k < kCh; k++) {
            float o[4];
            bt(o, d[0][k], d[1][k], d[2][k], d[3][k]);
            for (int a = 0; a < 4; a++) e[a][c][k] = o[a];
        }
    }
    const int64_t plane = T * Ci;
    for (int a = 0; a < 4; a++) {
        float v[4][kCh];
        for (int k = 0; k < kCh; k++) {
            float o[4];
            bt(o, e[a][0][k], e[a][1][k], e[a][2][k], e[a][3][k]);
            for (int c = 0; c < 4; c++) v[c][k] = o[c];
        }
        for (int c = 0; c < 4; c++) store4(V + (a * 4 + c) * plane + t * Ci + ci, v[c]);
    }
}

// out[b, 2ty + i, 2tx + j, co..co+3] = (A^T M A)[i][j] + bias: a thread a tile
// and 4 channels. BIAS: 0 none, 1 F32, 2 BF16.
template <int BIAS>
__global__ void k_wino_output(__nv_bfloat16 *out, const __nv_bfloat16 *M, const void *bias, int B, int H, int W,
                              int Co) {
    const int th = (H + 1) / 2, tw = (W + 1) / 2, cg = Co / kCh;
    const int64_t T = (int64_t)B * th * tw, i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= T * cg) return;
    const int64_t t = i / cg;
    const int co = (int)(i % cg) * kCh, tx = (int)(t % tw), ty = (int)(t / tw % th), b = (int)(t / ((int64_t)tw * th));
    const int64_t plane = T * Co;
    float y[2][2][kCh] = {};
    for (int a = 0; a < 4; a++)
        for (int c = 0; c < 4; c++) {
            float m[kCh];
            load4(m, M + (a * 4 + c) * plane + t * Co + co);
            // A^T's rows: output 0 takes inputs 0, 1, 2; output 1 takes 1, -2, -3
            const float ra[2] = {a < 3 ? 1.0f : 0.0f, a == 0 ? 0.0f : a == 1 ? 1.0f : -1.0f};
            const float rc[2] = {c < 3 ? 1.0f : 0.0f, c == 0 ? 0.0f : c == 1 ? 1.0f : -1.0f};
            for (int p = 0; p < 2; p++)
                for (int q = 0; q < 2; q++)
                    for (int k = 0; k < kCh; k++) y[p][q][k] = fmaf(ra[p] * rc[q], m[k], y[p][q][k]);
        }
    float bv[kCh] = {};
    if (BIAS == 1)
        for (int k = 0; k < kCh; k++) bv[k] = ((const float *)bias)[co + k];
    if (BIAS == 2) load4(bv, (const __nv_bfloat16 *)bias + co);
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 2; q++) {
            const int yy = 2 * ty + p, xx = 2 * tx + q;
            if (yy >= H || xx >= W) continue;
            float o[kCh];
            for (int k = 0; k < kCh; k++) o[k] = y[p][q][k] + bv[k];
            store4(out + (((int64_t)b * H + yy) * W + xx) * Co + co, o);
        }
}

// U of weights w (shape s) into U, on the stream.
void make_u(dc_cuda_ctx *c, void *U, const void *w, const dc_conv2d_shape *s) {
    const int64_t nw = (int64_t)s->Co * s->Ci;
    k_wino_weights<<<dc_blocks(nw, kTPB), kTPB, 0, c->stream>>>((__nv_bfloat16 *)U, (const __nv_bfloat16 *)w, s->Co,
                                                                s->Ci);
}

}  // namespace

struct dc_wino_u {
    const void *w;  // the weights' address, and their shape
    int Co, Ci;
    void *U;        // [16][Co][Ci] bf16
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
    if (cudaMalloc(&U, bytes) != cudaSuccess) return cudaGetLastError(), (const void *)NULL;  // made each call then
    make_u(c, U, w, s);
    c->wino_u[c->nwino_u++] = (dc_wino_u){w, s->Co, s->Ci, U};
    c->wino_u_bytes += bytes;
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
    c->frozen = frozen && dc_env_on("DC_WINOGRAD_KEEP");  // =0: U made each call all the same
}

extern "C" size_t dc_cuda_winograd_ws(const dc_conv2d_shape *s, dc_dtype dt) {
    const bool fits = dt == DC_BF16 && s->nhwc && s->k == 3 && s->stride == 1 && s->pad_t == 1 && s->pad_b == 1 &&
                      s->pad_l == 1 && s->pad_r == 1 && s->Ci % 8 == 0 && s->Co % 8 == 0;
    // where it measured cheaper than cuDNN (above)
    const bool pays = s->Ci >= 640 && (int64_t)s->H * s->W <= 1024 && tiles(s) >= 1024 && tiles(s) <= INT32_MAX;
    if (!fits || !pays || !dc_env_on("DC_WINOGRAD")) return 0;
    return (size_t)(u_bytes(s) + v_bytes(s) + m_bytes(s));
}

extern "C" bool dc_cuda_conv_winograd(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b,
                                      const dc_conv2d_shape *s) {
    dc_cuda_ctx *c = dc_cuda(be);
    const size_t need = dc_cuda_winograd_ws(s, x.dt);
    if (!need || need > c->conv_ws_bytes || (b.p && b.dt != DC_BF16 && b.dt != DC_F32) || !dc_aligned(x.p, 8) ||
        !dc_aligned(out.p, 8) || (b.dt == DC_BF16 && b.p && !dc_aligned(b.p, 8)))
        return false;
    if (c->prof) dc_cuda_prof_mark(c, "conv2d_fwd: Winograd F(2x2, 3x3)");
    const int64_t T = tiles(s), nw = (int64_t)s->Co * s->Ci;
    const void *U = c->frozen ? kept_u(c, w.p, s) : NULL;
    __nv_bfloat16 *V = (__nv_bfloat16 *)((char *)c->conv_ws + u_bytes(s));
    __nv_bfloat16 *M = (__nv_bfloat16 *)((char *)c->conv_ws + u_bytes(s) + v_bytes(s));
    if (!U) make_u(c, c->conv_ws, w.p, s), U = c->conv_ws;
    k_wino_input<<<dc_blocks(T * (s->Ci / kCh), kTPB), kTPB, 0, c->stream>>>(V, (const __nv_bfloat16 *)x.p, s->B,
                                                                              s->H, s->W, s->Ci);
    // column-major M_e[Co, T] = (U_e as Ci x Co)^T (V_e as Ci x T)
    dc_cuda_gemm_strided(be, s->Co, (int)T, s->Ci, U, s->Ci, nw, true, V, s->Ci, T * s->Ci, false, M, s->Co,
                         T * s->Co, DC_BF16, DC_BF16, 16);
    const unsigned blocks = dc_blocks(T * (s->Co / kCh), kTPB);
    __nv_bfloat16 *o = (__nv_bfloat16 *)out.p;
    if (!b.p) k_wino_output<0><<<blocks, kTPB, 0, c->stream>>>(o, M, NULL, s->B, s->H, s->W, s->Co);
    else if (b.dt == DC_F32) k_wino_output<1><<<blocks, kTPB, 0, c->stream>>>(o, M, b.p, s->B, s->H, s->W, s->Co);
    else k_wino_output<2><<<blocks, kTPB, 0, c->stream>>>(o, M, b.p, s->B, s->H, s->W, s->Co);
    return true;
}
