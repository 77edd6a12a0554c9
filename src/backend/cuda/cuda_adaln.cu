// adaLN-Zero on the GPU: LayerNorm fused with the per-sample modulation, the
// gated residual add, and their backward passes.
//
// Row kernels give each token row to one warp (fp32 statistics, two passes
// over a row that stays in L1). Sums over tokens (the dmod chunks): the fast
// backward takes them from its own loads into per-block partials, summed in
// a second small kernel; the general one gives each block 32 columns of one
// sample, walked by 8 row lanes. Both combine in a fixed order:
// deterministic, no atomics.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

enum { ROWS_PER_BLOCK = 8 };

__global__ void k_ln_mod_fwd(void *out, int obf, float *mean, float *rstd, const void *x, int xbf,
                             const void *mod, int mbf, int rows, int T, int D, int nchunk, int ch_shift,
                             int ch_scale) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= rows) return;
    int b = row / T;
    int64_t base = (int64_t)row * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += dc_ld(x, base + d, xbf);
    float mu = dc_warp_sum(s) / D;
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) {
        float t = dc_ld(x, base + d, xbf) - mu;
        ss += t * t;
    }
    float r = dc_ln_rstd(dc_warp_sum(ss) / D);
    int64_t sh = ((int64_t)b * nchunk + ch_shift) * D, sc = ((int64_t)b * nchunk + ch_scale) * D;
    for (int d = lane; d < D; d += 32) {
        float xh = (dc_ld(x, base + d, xbf) - mu) * r;
        dc_st(out, base + d, dc_modulate(xh, dc_ld(mod, sh + d, mbf), dc_ld(mod, sc + d, mbf)), obf);
    }
    if (lane == 0) mean[row] = mu, rstd[row] = r;
}

// ---- the mixed-precision fast path ---------------------------------------------------
// fp32 stream x, bf16 out/dout/mod, D % 4 == 0 and D <= 4 * 32 * VMAX: a warp
// holds its row in registers (VPL float4 a lane), so each tensor is read once,
// with 16-byte (stream) and 8-byte (bf16) accesses.
enum { VMAX = 12 };

__device__ __forceinline__ float4 ld_bf4(const __nv_bfloat16 *p) {
    uint2 u = *(const uint2 *)p;
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void st_bf4(__nv_bfloat16 *p, float4 v) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *(uint32_t *)&a, u.y = *(uint32_t *)&b;
    *(uint2 *)p = u;
}

template <int VPL>
__global__ void k_ln_mod_fwd_v4(__nv_bfloat16 *out, float *mean, float *rstd, const float *x,
                                const __nv_bfloat16 *mod, int rows, int T, int D, int nchunk, int ch_shift,
                                int ch_scale) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= rows) return;
    int b = row / T, D4 = D / 4;
    const float4 *xr = (const float4 *)(x + (int64_t)row * D);
    float4 v[VPL];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        int j = lane + 32 * k;
        v[k] = j < D4 ? xr[j] : make_float4(0, 0, 0, 0);
        s += v[k].x + v[k].y + v[k].z + v[k].w;
    }
    float mu = dc_warp_sum(s) / D, ss = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        if (lane + 32 * k >= D4) continue;
        float a = v[k].x - mu, bb = v[k].y - mu, c = v[k].z - mu, d = v[k].w - mu;
        ss += a * a + bb * bb + c * c + d * d;
    }
    float r = dc_ln_rstd(dc_warp_sum(ss) / D);
    const __nv_bfloat16 *sh = mod + ((int64_t)b * nchunk + ch_shift) * D, *sc = mod + ((int64_t)b * nchunk + ch_scale) * D;
    __nv_bfloat16 *o = out + (int64_t)row * D;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        int j = lane + 32 * k;
        if (j >= D4) continue;
        float4 h = ld_bf4(sh + 4 * j), c = ld_bf4(sc + 4 * j);
        st_bf4(o + 4 * j, make_float4(dc_modulate((v[k].x - mu) * r, h.x, c.x), dc_modulate((v[k].y - mu) * r, h.y, c.y),
                                      dc_modulate((v[k].z - mu) * r, h.z, c.z), dc_modulate((v[k].w - mu) * r, h.w, c.w)));
    }
    if (lane == 0) mean[row] = mu, rstd[row] = r;
}

// The backward in one pass (fast path): dx += rstd (g - mean(g) - xhat
// mean(g xhat)) row by row as above, and the modulation's sums over tokens
// (dshift = sum_t dout, dscale = sum_t dout xhat) from the same loads. A block
// (4 warps) takes `rb` token rows of one sample, a warp every fourth; each
// lane keeps its columns' running sums in its own shared-memory slots, and
// the block writes the sum of its warps (in warp order) to
// part[b][chunk][2][D]. k_ln_mod_dmod_sum adds the chunks in order:
// deterministic, no atomics.
enum { BWD_WARPS = 4, BWD_ROWS = 16 };
// the widest row the fast path takes (VMAX float4 a lane) keeps the partial
// sums within the 48 KB of shared memory a launch gets without opting in
static_assert(BWD_WARPS * 2 * (4 * 32 * VMAX) * sizeof(float) <= 48 * 1024, "adaLN backward's shared memory");

template <int VPL>
__global__ void __launch_bounds__(32 * BWD_WARPS)
    k_ln_mod_bwd_v4(float *dx, float *part, const __nv_bfloat16 *dout, const float *x, const float *mean,
                    const float *rstd, const __nv_bfloat16 *mod, int T, int D, int nchunk, int ch_scale, int rb) {
    extern __shared__ float4 acc[];  // [BWD_WARPS][2][D / 4]
    const int b = blockIdx.y, lane = threadIdx.x, warp = threadIdx.y, D4 = D / 4;
    float4 *a0 = acc + (int64_t)warp * 2 * D4, *a1 = a0 + D4;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        const int j = lane + 32 * k;
        if (j < D4) a0[j] = a1[j] = make_float4(0, 0, 0, 0);
    }
    const __nv_bfloat16 *sc = mod + ((int64_t)b * nchunk + ch_scale) * D;
    const int t1 = min(T, (int)(blockIdx.x + 1) * rb);
    for (int t = blockIdx.x * rb + warp; t < t1; t += BWD_WARPS) {
        const int64_t row = (int64_t)b * T + t;
        const float4 *xr = (const float4 *)(x + row * D);
        const __nv_bfloat16 *gr = dout + row * D;
        const float mu = mean[row], r = rstd[row];
        float4 g[VPL], xh[VPL];
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < VPL; k++) {
            const int j = lane + 32 * k;
            if (j >= D4) { g[k] = xh[k] = make_float4(0, 0, 0, 0); continue; }
            const float4 go = ld_bf4(gr + 4 * j), c = ld_bf4(sc + 4 * j), xv = xr[j];
            xh[k] = make_float4((xv.x - mu) * r, (xv.y - mu) * r, (xv.z - mu) * r, (xv.w - mu) * r);
            float4 s0 = a0[j], s1 = a1[j];
            s0.x += go.x, s0.y += go.y, s0.z += go.z, s0.w += go.w;
            s1.x += go.x * xh[k].x, s1.y += go.y * xh[k].y, s1.z += go.z * xh[k].z, s1.w += go.w * xh[k].w;
            a0[j] = s0, a1[j] = s1;
            g[k] = make_float4(go.x * (1.0f + c.x), go.y * (1.0f + c.y), go.z * (1.0f + c.z), go.w * (1.0f + c.w));
            sg += g[k].x + g[k].y + g[k].z + g[k].w;
            sgx += g[k].x * xh[k].x + g[k].y * xh[k].y + g[k].z * xh[k].z + g[k].w * xh[k].w;
        }
        const float mg = dc_warp_sum(sg) / D, mgx = dc_warp_sum(sgx) / D;
        float4 *dr = (float4 *)(dx + row * D);
#pragma unroll
        for (int k = 0; k < VPL; k++) {
            const int j = lane + 32 * k;
            if (j >= D4) continue;
            float4 d = dr[j];
            d.x += dc_ln_dx(g[k].x, xh[k].x, r, mg, mgx), d.y += dc_ln_dx(g[k].y, xh[k].y, r, mg, mgx);
            d.z += dc_ln_dx(g[k].z, xh[k].z, r, mg, mgx), d.w += dc_ln_dx(g[k].w, xh[k].w, r, mg, mgx);
            dr[j] = d;
        }
    }
    __syncthreads();
    float4 *out = (float4 *)part + ((int64_t)b * gridDim.x + blockIdx.x) * 2 * D4;
    for (int i = warp * 32 + lane; i < 2 * D4; i += 32 * BWD_WARPS) {
        float4 v = acc[i];
        for (int w = 1; w < BWD_WARPS; w++) {
            const float4 u = acc[(int64_t)w * 2 * D4 + i];
            v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
        }
        out[i] = v;
    }
}

// dmod's shift and scale chunks of sample blockIdx.y: the sums of the
// blocks' partials, in chunk order.
__global__ void k_ln_mod_dmod_sum(void *dmod, int dmbf, const float *part, int nparts, int D, int nchunk,
                                  int ch_shift, int ch_scale) {
    const int b = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 2 * D) return;
    float s = 0.0f;
    for (int c = 0; c < nparts; c++) s += part[((int64_t)b * nparts + c) * 2 * D + i];
    const int ch = i < D ? ch_shift : ch_scale;
    dc_st(dmod, ((int64_t)b * nchunk + ch) * D + i % D, s, dmbf);
}

// Lanes' float4 count for the fast path, or 0 when the shapes or dtypes don't fit it.
static int fast_vpl(int D, dc_buf stream, dc_buf act, dc_buf mod) {
    if (stream.dt != DC_F32 || act.dt != DC_BF16 || mod.dt != DC_BF16 || D % 4 != 0) return 0;
    if (!dc_aligned(stream.p, 16) || !dc_aligned(act.p, 8) || !dc_aligned(mod.p, 8)) return 0;
    int vpl = (D / 4 + 31) / 32;
    return vpl <= VMAX ? vpl : 0;
}

#define VPL_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12)

extern "C" void dc_cuda_ln_mod_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf mod,
                                   int B, int T, int D, int nchunk, int ch_shift, int ch_scale) {
    DC_CUDA_OP(be);
    int rows = B * T;
    dim3 block(32, ROWS_PER_BLOCK), grid((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    cudaStream_t s = dc_cuda(be)->stream;
    switch (fast_vpl(D, x, out, mod)) {
#define FWD_CASE(V)                                                                                        \
    case V:                                                                                                \
        k_ln_mod_fwd_v4<V><<<grid, block, 0, s>>>((__nv_bfloat16 *)out.p, (float *)mean.p, (float *)rstd.p, \
                                                  (const float *)x.p, (const __nv_bfloat16 *)mod.p, rows, T, D, \
                                                  nchunk, ch_shift, ch_scale);                             \
        DC_CUDA_LAUNCHED(be);                                                                              \
        return;
        VPL_CASES(FWD_CASE)
#undef FWD_CASE
    default: break;
    }
    k_ln_mod_fwd<<<grid, block, 0, s>>>(out.p, BF(out), (float *)mean.p, (float *)rstd.p, x.p,
                                                          BF(x), mod.p, BF(mod), rows, T, D, nchunk, ch_shift,
                                                          ch_scale);
    DC_CUDA_LAUNCHED(be);
}

// dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dout (1 + scale)
__global__ void k_ln_mod_bwd_dx(void *dx, int dxbf, const void *dout, int gbf, const void *x, int xbf,
                                const float *mean, const float *rstd, const void *mod, int mbf, int rows,
                                int T, int D, int nchunk, int ch_scale) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (row >= rows) return;
    int b = row / T;
    int64_t base = (int64_t)row * D, sc = ((int64_t)b * nchunk + ch_scale) * D;
    float mu = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int d = lane; d < D; d += 32) {
        float g = dc_ld(dout, base + d, gbf) * (1.0f + dc_ld(mod, sc + d, mbf));
        float xh = (dc_ld(x, base + d, xbf) - mu) * r;
        sg += g, sgx += g * xh;
    }
    float mg = dc_warp_sum(sg) / D, mgx = dc_warp_sum(sgx) / D;
    for (int d = lane; d < D; d += 32) {
        float g = dc_ld(dout, base + d, gbf) * (1.0f + dc_ld(mod, sc + d, mbf));
        float xh = (dc_ld(x, base + d, xbf) - mu) * r;
        dc_st(dx, base + d, dc_ld(dx, base + d, dxbf) + dc_ln_dx(g, xh, r, mg, mgx), dxbf);
    }
}

// dshift[b,d] = sum_t dout ; dscale[b,d] = sum_t dout xhat  (overwritten)
__global__ void k_ln_mod_bwd_dmod(void *dmod, int dmbf, const void *dout, int gbf, const void *x, int xbf,
                                  const float *mean, const float *rstd, int T, int D, int nchunk, int ch_shift,
                                  int ch_scale) {
    __shared__ float acc[2][8][33];
    int d = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;
    float s0 = 0.0f, s1 = 0.0f;
    if (d < D)
        for (int t = threadIdx.y; t < T; t += 8) {
            int64_t row = (int64_t)b * T + t, i = row * D + d;
            float g = dc_ld(dout, i, gbf);
            s0 += g;
            s1 += g * (dc_ld(x, i, xbf) - mean[row]) * rstd[row];
        }
    acc[0][threadIdx.y][threadIdx.x] = s0;
    acc[1][threadIdx.y][threadIdx.x] = s1;
    __syncthreads();
    if (threadIdx.y < 2 && d < D) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += acc[threadIdx.y][y][threadIdx.x];
        int ch = threadIdx.y == 0 ? ch_shift : ch_scale;
        dc_st(dmod, ((int64_t)b * nchunk + ch) * D + d, t, dmbf);
    }
}

extern "C" void dc_cuda_ln_mod_bwd(dc_backend *be, dc_buf dx, dc_buf dmod, dc_buf dout, dc_buf x, dc_buf mean,
                                   dc_buf rstd, dc_buf mod, int B, int T, int D, int nchunk, int ch_shift,
                                   int ch_scale) {
    DC_CUDA_OP(be);
    cudaStream_t s = dc_cuda(be)->stream;
    int rows = B * T;
    dim3 block(32, ROWS_PER_BLOCK), grid((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    int vpl = fast_vpl(D, x, dout, mod);
    if (dx.dt != DC_F32 || !dc_aligned(dx.p, 16)) vpl = 0;
    // the fast path's partial sums live in the norm workspace: chunks of
    // BWD_ROWS rows, fewer (longer) where that would not fit
    const int64_t room = DC_CUDA_NORM_WS * (int64_t)(sizeof(double) / sizeof(float)) / ((int64_t)B * 2 * D);
    const int nparts = (int)(room < (T + BWD_ROWS - 1) / BWD_ROWS ? room : (T + BWD_ROWS - 1) / BWD_ROWS);
    if (nparts < 1) vpl = 0;
    if (vpl) {
        const int rb = (T + nparts - 1) / nparts;
        float *part = (float *)dc_cuda(be)->norm_ws;
        const dim3 grid_f((T + rb - 1) / rb, B), block_f(32, BWD_WARPS);
        const size_t smem = (size_t)BWD_WARPS * 2 * D * sizeof(float);
        switch (vpl) {
#define BWD_CASE(V)                                                                                          \
    case V:                                                                                                  \
        k_ln_mod_bwd_v4<V><<<grid_f, block_f, smem, s>>>((float *)dx.p, part, (const __nv_bfloat16 *)dout.p,   \
                                                         (const float *)x.p, (const float *)mean.p,           \
                                                         (const float *)rstd.p, (const __nv_bfloat16 *)mod.p, \
                                                         T, D, nchunk, ch_scale, rb);                         \
        break;
            VPL_CASES(BWD_CASE)
#undef BWD_CASE
        }
        k_ln_mod_dmod_sum<<<dim3((2 * D + 255) / 256, B), 256, 0, s>>>(dmod.p, BF(dmod), part, grid_f.x, D, nchunk,
                                                                        ch_shift, ch_scale);
        DC_CUDA_LAUNCHED(be);
        return;
    }
    k_ln_mod_bwd_dx<<<grid, block, 0, s>>>(dx.p, BF(dx), dout.p, BF(dout), x.p, BF(x), (const float *)mean.p,
                                           (const float *)rstd.p, mod.p, BF(mod), rows, T, D, nchunk, ch_scale);
    dim3 g2((D + 31) / 32, B), b2(32, 8);
    k_ln_mod_bwd_dmod<<<g2, b2, 0, s>>>(dmod.p, BF(dmod), dout.p, BF(dout), x.p, BF(x), (const float *)mean.p,
                                        (const float *)rstd.p, T, D, nchunk, ch_shift, ch_scale);
    DC_CUDA_LAUNCHED(be);
}

// out[b,t,:] = x[b,t,:] + gate[b,:] * y[b,t,:]
__global__ void k_gate_res_fwd(void *out, int obf, const void *x, int xbf, const void *y, int ybf, const void *mod,
                               int mbf, int T, int D, int nchunk, int ch_gate, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(i % D);
        int64_t b = i / ((int64_t)T * D);
        float g = dc_ld(mod, (b * nchunk + ch_gate) * D + d, mbf);
        dc_st(out, i, dc_ld(x, i, xbf) + g * dc_ld(y, i, ybf), obf);
    }
}

// The mixed-precision case (fp32 stream, bf16 branch and gate), four
// elements a thread: 16-byte stream accesses, 8-byte branch accesses.
__global__ void k_gate_res_fwd_v4(float4 *out, const float4 *x, const uint2 *y, const __nv_bfloat16 *mod, int T,
                                  int D, int nchunk, int ch_gate, int64_t n4) {
    int D4 = D / 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(i % D4) * 4;
        int64_t b = i / ((int64_t)T * D4);
        const __nv_bfloat16 *g = mod + (b * nchunk + ch_gate) * D + d;
        uint2 yv = y[i];
        float2 y01 = __bfloat1622float2(*(const __nv_bfloat162 *)&yv.x);
        float2 y23 = __bfloat1622float2(*(const __nv_bfloat162 *)&yv.y);
        float2 g01 = __bfloat1622float2(*(const __nv_bfloat162 *)g);
        float2 g23 = __bfloat1622float2(*(const __nv_bfloat162 *)(g + 2));
        float4 xv = x[i];
        out[i] = make_float4(xv.x + g01.x * y01.x, xv.y + g01.y * y01.y, xv.z + g23.x * y23.x, xv.w + g23.y * y23.y);
    }
}

extern "C" void dc_cuda_gate_res_fwd(dc_backend *be, dc_buf out, dc_buf x, dc_buf y, dc_buf mod, int B, int T,
                                     int D, int nchunk, int ch_gate) {
    DC_CUDA_OP(be);
    int64_t n = (int64_t)B * T * D;
    cudaStream_t s = dc_cuda(be)->stream;
    if (out.dt == DC_F32 && x.dt == DC_F32 && y.dt == DC_BF16 && mod.dt == DC_BF16 && D % 4 == 0 &&
        dc_aligned(out.p, 16) && dc_aligned(x.p, 16) && dc_aligned(y.p, 8) && dc_aligned(mod.p, 8)) {
        k_gate_res_fwd_v4<<<dc_blocks(n / 4, 256), 256, 0, s>>>((float4 *)out.p, (const float4 *)x.p,
                                                              (const uint2 *)y.p, (const __nv_bfloat16 *)mod.p, T,
                                                              D, nchunk, ch_gate, n / 4);
    } else {
        k_gate_res_fwd<<<dc_blocks(n, 256), 256, 0, s>>>(out.p, BF(out), x.p, BF(x), y.p, BF(y), mod.p, BF(mod), T,
                                                         D, nchunk, ch_gate, n);
    }
    DC_CUDA_LAUNCHED(be);
}

// dy = gate dx (all rows); dgate[b,d] = sum_t dx y. One block covers 32
// columns of one sample over all its tokens and does both.
__global__ void k_gate_res_bwd(void *dy, int dybf, void *dmod, int dmbf, const void *dx, int dxbf, const void *y,
                               int ybf, const void *mod, int mbf, int T, int D, int nchunk, int ch_gate) {
    __shared__ float acc[8][33];
    int d = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;
    float s = 0.0f;
    if (d < D) {
        int64_t gi = ((int64_t)b * nchunk + ch_gate) * D + d;
        float g = dc_ld(mod, gi, mbf);
        for (int t = threadIdx.y; t < T; t += 8) {
            int64_t i = ((int64_t)b * T + t) * D + d;
            float gx = dc_ld(dx, i, dxbf);
            dc_st(dy, i, g * gx, dybf);
            s += gx * dc_ld(y, i, ybf);
        }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && d < D) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += acc[k][threadIdx.x];
        dc_st(dmod, ((int64_t)b * nchunk + ch_gate) * D + d, t, dmbf);
    }
}

// The mixed-precision case, two columns a thread: 8-byte stream reads,
// 4-byte bf16 reads and writes.
__global__ void k_gate_res_bwd_v2(__nv_bfloat162 *dy, __nv_bfloat16 *dmod, const float2 *dx, const __nv_bfloat162 *y,
                                  const __nv_bfloat16 *mod, int T, int D, int nchunk, int ch_gate) {
    __shared__ float2 acc[8][33];
    int c2 = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y, D2 = D / 2;
    float2 s = make_float2(0.0f, 0.0f);
    if (c2 < D2) {
        int64_t gi = ((int64_t)b * nchunk + ch_gate) * D + 2 * c2;
        float2 g = __bfloat1622float2(*(const __nv_bfloat162 *)(mod + gi));
        for (int t = threadIdx.y; t < T; t += 8) {
            int64_t i = ((int64_t)b * T + t) * D2 + c2;
            float2 gx = dx[i], yv = __bfloat1622float2(y[i]);
            dy[i] = __floats2bfloat162_rn(g.x * gx.x, g.y * gx.y);
            s.x += gx.x * yv.x, s.y += gx.y * yv.y;
        }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c2 < D2) {
        float2 t = make_float2(0.0f, 0.0f);
        for (int k = 0; k < 8; k++) t.x += acc[k][threadIdx.x].x, t.y += acc[k][threadIdx.x].y;
        *(__nv_bfloat162 *)(dmod + ((int64_t)b * nchunk + ch_gate) * D + 2 * c2) = __floats2bfloat162_rn(t.x, t.y);
    }
}

extern "C" void dc_cuda_gate_res_bwd(dc_backend *be, dc_buf dy, dc_buf dmod, dc_buf dx, dc_buf y, dc_buf mod,
                                     int B, int T, int D, int nchunk, int ch_gate) {
    DC_CUDA_OP(be);
    cudaStream_t s = dc_cuda(be)->stream;
    if (dy.dt == DC_BF16 && dmod.dt == DC_BF16 && dx.dt == DC_F32 && y.dt == DC_BF16 && mod.dt == DC_BF16 &&
        D % 2 == 0 && dc_aligned(dy.p, 4) && dc_aligned(dmod.p, 4) && dc_aligned(y.p, 4) && dc_aligned(mod.p, 4) &&
        dc_aligned(dx.p, 8)) {
        dim3 grid((D / 2 + 31) / 32, B), block(32, 8);
        k_gate_res_bwd_v2<<<grid, block, 0, s>>>((__nv_bfloat162 *)dy.p, (__nv_bfloat16 *)dmod.p, (const float2 *)dx.p,
                                                 (const __nv_bfloat162 *)y.p, (const __nv_bfloat16 *)mod.p, T, D,
                                                 nchunk, ch_gate);
        DC_CUDA_LAUNCHED(be);
        return;
    }
    dim3 grid((D + 31) / 32, B), block(32, 8);
    k_gate_res_bwd<<<grid, block, 0, s>>>(dy.p, BF(dy), dmod.p, BF(dmod), dx.p, BF(dx), y.p, BF(y),
                                                            mod.p, BF(mod), T, D, nchunk, ch_gate);
    DC_CUDA_LAUNCHED(be);
}
