// Group norm (with its fused SiLU) on the GPU, forward and backward, with the
// per-element formulas shared with the CPU (op_math.h) but for the SiLU's
// exponential and reciprocal (the hardware's approximations), and the per-channel
// sums of channels-last maps, which share the channels-last group norm's
// partial sums. (Affine layer norm is in cuda_layer_norm.cu.)
//
// Every sum is taken in a fixed order, so results never depend on timing:
// threads accumulate strided slices, blocks combine them with a tree, and
// sums across blocks go through partials in the context's norm workspace
// (DC_CUDA_NORM_WS doubles), added by one thread each in index order. No
// atomics.
//
// Group norm works on rows: one block per (sample, channel) row of HW values,
// so large images and small batches still fill the GPU. The group statistics
// are the sums of the group's C/G row partials, which every block of the
// group adds itself in the same order. Its channels-last form (group norm
// forward over x[B, HW, C]) reads along pixels instead: see below.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

enum { NT = 256 };  // threads of a row block

// SiLU and its derivative with the hardware's approximate exponential and
// reciprocal (MUFU.EX2, MUFU.RCP: a few ulp of a float, far below bf16's
// rounding and the tests' fp32 tolerance). With expf and an IEEE division
// the channels-last kernels with SiLU were bound by their instructions, not
// the memory: on an H200, 32x32 maps of 320 channels at batch 64 took 39.6 us
// to apply with SiLU against 27.4 without.
__device__ __forceinline__ float gn_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float gn_silu(float x) { return x * gn_sigmoid(x); }
__device__ __forceinline__ float gn_silu_grad(float x) { return dc_silu_grad_of(x, gn_sigmoid(x)); }

// The sums of a block's threads, in a fixed tree; every thread gets them.
__device__ void block_sum2(double &a, double &b) {
    __shared__ double sa[NT], sb[NT];
    sa[threadIdx.x] = a, sb[threadIdx.x] = b;
    __syncthreads();
#pragma unroll
    for (int k = NT / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sa[threadIdx.x] += sa[threadIdx.x + k], sb[threadIdx.x] += sb[threadIdx.x + k];
        __syncthreads();
    }
    a = sa[0], b = sb[0];
    __syncthreads();  // the arrays may be reused by the caller's next sum
}

// ---- group norm forward ---------------------------------------------------------------
// part[row] = (sum x, sum x^2) over the row's HW values, in double.
__global__ void k_gn_row_stats(double2 *part, const void *x, int xbf, int64_t HW, bool vec) {
    const int64_t row = blockIdx.x, base = row * HW;
    double s = 0.0, ss = 0.0;
    for (int64_t i = 4 * (int64_t)threadIdx.x; i < HW; i += 4 * NT) {
        float4 v = dc_ld4_upto(x, base + i, base + HW, xbf, vec);
        s += (double)v.x + v.y + v.z + v.w;  // values past the row's end read as 0
        ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    block_sum2(s, ss);
    if (threadIdx.x == 0) part[row] = make_double2(s, ss);
}

// The statistics of group g of the piece's sample b from its rows' partials.
__device__ void gn_group_stats(const double2 *part, int b, int C, int G, int g, int64_t HW, float eps, float *mean,
                               float *rstd) {
    const int cg = C / G;
    double s = 0.0, ss = 0.0;
    for (int c = g * cg; c < (g + 1) * cg; c++) {
        double2 p = part[(int64_t)b * C + c];
        s += p.x, ss += p.y;
    }
    double n = (double)cg * HW, mu = s / n, var = ss / n - mu * mu;
    *mean = (float)mu;
    *rstd = dc_norm_rstd(var > 0.0 ? var : 0.0, eps);
}

// One block per (sample, channel) row: out = act(xhat gamma + beta). The
// group's first row writes mean and rstd.
__global__ void k_gn_apply(void *out, int obf, float *mean, float *rstd, const void *x, int xbf, const void *gamma,
                           int gbf, const void *beta, int bbf, const double2 *part, int C, int64_t HW, int G,
                           float eps, bool silu, bool vec) {
    __shared__ float st[2];
    const int row = blockIdx.x, b = row / C, c = row % C, g = c / (C / G);
    if (threadIdx.x == 0) {
        gn_group_stats(part, b, C, G, g, HW, eps, &st[0], &st[1]);
        if (c % (C / G) == 0) mean[(int64_t)b * G + g] = st[0], rstd[(int64_t)b * G + g] = st[1];
    }
    __syncthreads();
    const float mu = st[0], r = st[1], ga = dc_ld(gamma, c, gbf), be = dc_ld(beta, c, bbf);
    const int64_t base = (int64_t)row * HW;
    for (int64_t i = 4 * (int64_t)threadIdx.x; i < HW; i += 4 * NT) {
        float4 v = dc_ld4_upto(x, base + i, base + HW, xbf, vec);
        float y[4] = {v.x, v.y, v.z, v.w};
        for (int k = 0; k < 4; k++) {
            y[k] = dc_norm_affine(dc_norm_xhat(y[k], mu, r), ga, be);
            if (silu) y[k] = gn_silu(y[k]);
        }
        dc_st4_upto(out, base + i, base + HW, make_float4(y[0], y[1], y[2], y[3]), obf, vec);
    }
}

// Samples per piece: the rows' partials of a piece fit the norm workspace.
static int gn_piece(int B, int C) {
    int64_t per = DC_CUDA_NORM_WS / 2 / C;  // two doubles a row
    return per >= B ? B : (int)per;
}

// Whether rows of HW values of every buffer allow 4-wide accesses.
static bool rows_vec(int64_t HW, dc_buf a, dc_buf b, dc_buf c) {
    return HW % 4 == 0 && dc_vec4(a) && (!b.p || dc_vec4(b)) && (!c.p || dc_vec4(c));
}

static bool gn_shape_ok(dc_backend *be, const char *func, int B, int C, int64_t HW, int G, dc_buf mean, dc_buf rstd) {
    if (B < 1 || C < 1 || HW < 1 || G < 1 || C % G != 0) {
        dc_cuda_record(be, func, __FILE__, __LINE__, "group norm of %d channels in %d groups", C, G);
        return false;
    }
    if ((int64_t)B * C > INT32_MAX || C > DC_CUDA_NORM_WS / 2) {
        dc_cuda_record(be, func, __FILE__, __LINE__, "group norm over %d samples of %d channels is too large",
                       B, C);
        return false;
    }
    if (mean.dt != DC_F32 || rstd.dt != DC_F32) {
        dc_cuda_record(be, func, __FILE__, __LINE__, "group norm statistics must be F32 (mean %s, rstd %s)",
                       dc_dtype_name(mean.dt), dc_dtype_name(rstd.dt));
        return false;
    }
    return true;
}

extern "C" void dc_cuda_group_norm_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                                       dc_buf beta, int B, int C, int64_t HW, int G, float eps, bool silu) {
    DC_CUDA_OP(be);
    if (!gn_shape_ok(be, __func__, B, C, HW, G, mean, rstd)) return;
    dc_cuda_ctx *c = dc_cuda(be);
    double2 *part = (double2 *)c->norm_ws;
    const bool vec = rows_vec(HW, x, out, dc_buf_none());
    const int piece = gn_piece(B, C);
    for (int b0 = 0; b0 < B; b0 += piece) {
        const int nb = B - b0 < piece ? B - b0 : piece;
        const int64_t off = (int64_t)b0 * C * HW;
        k_gn_row_stats<<<nb * C, NT, 0, c->stream>>>(part, dc_buf_at(x, off).p, BF(x), HW, vec);
        k_gn_apply<<<nb * C, NT, 0, c->stream>>>(dc_buf_at(out, off).p, BF(out), (float *)mean.p + (int64_t)b0 * G,
                                                 (float *)rstd.p + (int64_t)b0 * G, dc_buf_at(x, off).p, BF(x),
                                                 gamma.p, BF(gamma), beta.p, BF(beta), part, C, HW, G, eps, silu,
                                                 vec);
        DC_CUDA_LAUNCHED(be);
    }
}

// ---- group norm forward, channels-last ---------------------------------------------------
// x[B, HW, C]: a group is C/G consecutive channels of every pixel. Three
// kernels, each reading along rows (a pixel's channels), never across them:
//   1. per (sample, chunk of pixels, channel): (sum x, sum x^2) in double
//      into the norm workspace;
//   2. per (sample, group): mean and rstd from its chunks' and channels' partials;
//   3. out = act(xhat gamma + beta), each thread on fixed channels (their
//      gamma, beta and statistics in registers) down a chunk of pixels.
// The chunks and the order of every sum come from the shape alone: the lanes
// of kernel 1 are GN_RT rows apart whatever the vector width, so the
// alignment of the buffers never changes a bit of the result.
enum { GN_RT = 8 };

// Chunks of kernel 1: of at least min_rows pixels, up to 16384 partials a
// sample, or up to 65536 where that leaves more than 512 pixels a chunk: the
// VAE's 256x256 and 512x512 maps, whose long chunks made few blocks with long
// loops (an H100's 512x512 decode: 6.6 -> 6.2 ms). The shape alone decides.
// The forward's sums take chunks of 128 pixels or more: with 32, SD 2.1's
// group norms at 256 px batch 64 (a thread 4 rows) took 2.95 ms a step on an
// H200, with 128 2.62 ms. The backward's take 64 (its loop not unrolled:
// its threads hold twice the values): with the fast SiLU, 32 took 5.41 ms
// a step and 64 4.90; 128 with the loop unrolled had been slower than 32.
enum { GN_SUM_ROWS = 128, GN_BWD_ROWS = 64 };
static int64_t gn_nhwc_chunks(int64_t HW, int C, int min_rows) {
    int64_t by_ws = 16384 / C > 1 ? 16384 / C : 1;
    if (HW / 512 > by_ws) by_ws = HW / 512 < 65536 / C ? HW / 512 : 65536 / C;
    const int64_t by_rows = (HW + min_rows - 1) / min_rows;
    return by_rows < by_ws ? by_rows : by_ws;
}

// The block's column sums: lane y's (s, ss) of each of a thread's V
// channels added in order of y, written to out[0, V) by lane 0 where live.
template <int V>
__device__ void gn_lanes_store(double2 *out, const double (&s)[V], const double (&ss)[V], bool live) {
    __shared__ double2 red[GN_RT * 32];
    for (int k = 0; k < V; k++) {
        red[threadIdx.y * blockDim.x + threadIdx.x] = make_double2(s[k], ss[k]);
        __syncthreads();
        if (threadIdx.y == 0 && live) {
            double a = 0.0, q = 0.0;
            for (int y = 0; y < GN_RT; y++) {
                const double2 r = red[y * blockDim.x + threadIdx.x];
                a += r.x, q += r.y;
            }
            out[k] = make_double2(a, q);
        }
        __syncthreads();
    }
}

// part[b, chunk, c] = (sum, sum of squares) of x[b, p, c] over the chunk's
// pixels p: lane y of the block sums pixels p0 + y, p0 + y + GN_RT, ...; the
// lanes are then added in order.
template <int V>
__global__ void k_gn_nhwc_part(double2 *part, const void *x, int xbf, int64_t HW, int C, int cols, int64_t rows_per) {
    dc_pdl_enter();
    const int col = blockIdx.y * blockDim.x + threadIdx.x, b = blockIdx.z;
    const int64_t chunk = blockIdx.x, p0 = chunk * rows_per, p1 = p0 + rows_per < HW ? p0 + rows_per : HW;
    double s[V], ss[V];
    for (int k = 0; k < V; k++) s[k] = 0.0, ss[k] = 0.0;
    if (col < cols) {
        const int64_t base = (int64_t)b * HW * C + (int64_t)col * V;
#pragma unroll 4  // several loads in flight; the sums still run in row order
        for (int64_t p = p0 + threadIdx.y; p < p1; p += GN_RT) {
            float v[V];
            dc_ldv<V>(v, x, base + p * C, xbf);
            for (int k = 0; k < V; k++) s[k] += v[k], ss[k] += (double)v[k] * v[k];
        }
    }
    gn_lanes_store<V>(part + ((int64_t)b * gridDim.x + chunk) * C + (int64_t)col * V, s, ss, col < cols);
}

// A block per (sample, group): thread t adds the group's partials t, t +
// GN_ST, ... (chunk-major, then channel), each warp's lanes are added by a
// fixed butterfly and the warps' sums in order. (A warp per group left the
// SD UNet's group norms at 2 rows waiting on its serial loads.)
enum { GN_ST = 128 };
__global__ void __launch_bounds__(GN_ST) k_gn_nhwc_stats(float *mean, float *rstd, const double2 *part, int64_t chunks,
                                                       int C, int G, int64_t HW, float eps) {
    dc_pdl_enter();
    __shared__ double2 wsum[GN_ST / 32];
    const int64_t i = blockIdx.x;  // b G + g
    const int b = (int)(i / G), g = (int)(i % G), cg = C / G, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double s = 0.0, ss = 0.0;
#pragma unroll 4
    for (int64_t e = threadIdx.x; e < chunks * cg; e += GN_ST) {
        const double2 p = part[((int64_t)b * chunks + e / cg) * C + (int64_t)g * cg + e % cg];
        s += p.x, ss += p.y;
    }
    s = dc_warp_sum_d(s), ss = dc_warp_sum_d(ss);
    if (lane == 0) wsum[warp] = make_double2(s, ss);
    __syncthreads();
    if (threadIdx.x == 0) {
        s = 0.0, ss = 0.0;
        for (int w = 0; w < GN_ST / 32; w++) s += wsum[w].x, ss += wsum[w].y;
        const double n = (double)cg * HW, mu = s / n, var = ss / n - mu * mu;
        mean[i] = (float)mu;
        rstd[i] = dc_norm_rstd(var > 0.0 ? var : 0.0, eps);
    }
}

// A block's sample b and its pixels [p0, p1): blockIdx.x = b cps + chunk,
// chunks of rows_per pixels.
struct gn_span {
    int64_t b, p0, p1;
};
__device__ __forceinline__ gn_span gn_span_of(int64_t cps, int64_t rows_per, int64_t HW) {
    const int64_t b = blockIdx.x / cps, p0 = blockIdx.x % cps * rows_per;
    return {b, p0, p0 + rows_per < HW ? p0 + rows_per : HW};
}

// out = act(xhat gamma + beta). Block (chunk of a sample's pixels, tile of
// columns): blockIdx.x = b cps + chunk.
template <int V>
__global__ void k_gn_nhwc_apply(void *out, int obf, const void *x, int xbf, const float *mean, const float *rstd,
                                const void *gamma, int gbf, const void *beta, int bbf, int64_t HW, int C, int G,
                                int cols, int64_t cps, int64_t rows_per, bool silu) {
    dc_pdl_enter();
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const gn_span sp = gn_span_of(cps, rows_per, HW);
    const int64_t b = sp.b, p0 = sp.p0, p1 = sp.p1;
    const int c0 = col * V, cg = C / G;
    float ga[V], be[V], mu[V], r[V];
    for (int k = 0; k < V; k++) {
        const int64_t j = b * G + (c0 + k) / cg;  // the channel's group (V channels may span two)
        ga[k] = dc_ld(gamma, c0 + k, gbf), be[k] = dc_ld(beta, c0 + k, bbf), mu[k] = mean[j], r[k] = rstd[j];
    }
    const int64_t base = b * HW * C + c0;
#pragma unroll 4
    for (int64_t p = p0 + threadIdx.y; p < p1; p += blockDim.y) {
        float v[V];
        dc_ldv<V>(v, x, base + p * C, xbf);
        for (int k = 0; k < V; k++) {
            v[k] = dc_norm_affine(dc_norm_xhat(v[k], mu[k], r[k]), ga[k], be[k]);
            if (silu) v[k] = gn_silu(v[k]);
        }
        dc_stv<V>(out, base + p * C, v, obf);
    }
}

static bool float_bufs(dc_buf a, dc_buf b, dc_buf c, dc_buf d) {
    const dc_buf t[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (t[i].dt != DC_F32 && t[i].dt != DC_BF16) return false;
    return true;
}

// Kernel 3 over nb of the B samples from sample b0: out from x and the
// statistics, chunks of up to eight rows a thread.
static void gn_nhwc_apply(dc_backend *be, dc_buf out, const float *mu, const float *r, dc_buf x, dc_buf gamma,
                          dc_buf beta, int B, int b0, int nb, int C, int64_t HW, int G, int V, bool silu) {
    const dc_rows_geom ga = dc_rows_geom_make(C, V, NT);
    const int64_t rows_apply = dc_rows_chunk(&ga, (int64_t)B * HW, 8), cps = (HW + rows_apply - 1) / rows_apply;
    const int64_t off = (int64_t)b0 * C * HW;
    const dim3 g3((unsigned)(nb * cps), (unsigned)ga.tiles), b3(ga.ct, ga.rt);
    void *op = dc_buf_at(out, off).p;
    const void *xp = dc_buf_at(x, off).p;
    if (V == 8)
        dc_launch(be, k_gn_nhwc_apply<8>, g3, b3, 0, op, BF(out), xp, BF(x), mu, r, gamma.p, BF(gamma), beta.p,
                  BF(beta), HW, C, G, ga.cols, cps, rows_apply, silu);
    else if (V == 4)
        dc_launch(be, k_gn_nhwc_apply<4>, g3, b3, 0, op, BF(out), xp, BF(x), mu, r, gamma.p, BF(gamma), beta.p,
                  BF(beta), HW, C, G, ga.cols, cps, rows_apply, silu);
    else
        dc_launch(be, k_gn_nhwc_apply<1>, g3, b3, 0, op, BF(out), xp, BF(x), mu, r, gamma.p, BF(gamma), beta.p,
                  BF(beta), HW, C, G, ga.cols, cps, rows_apply, silu);
}

extern "C" void dc_cuda_group_norm_nhwc_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                                            dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G, float eps,
                                            bool silu) {
    DC_CUDA_OP(be);
    if (!gn_shape_ok(be, __func__, B, C, HW, G, mean, rstd)) return;
    if (!float_bufs(out, x, gamma, beta))
        DC_CUDA_FAIL(be, "group norm dtypes: x %s, out %s, gamma %s, beta %s (each F32 or BF16)",
                     dc_dtype_name(x.dt), dc_dtype_name(out.dt), dc_dtype_name(gamma.dt), dc_dtype_name(beta.dt));
    dc_cuda_ctx *c = dc_cuda(be);
    double2 *part = (double2 *)c->norm_ws;
    const int V = dc_vec_width(C, x, out, dc_buf_none());
    // kernel 1: chunks of pixels, each thread GN_RT rows from its lane neighbours
    const int64_t chunks = gn_nhwc_chunks(HW, C, GN_SUM_ROWS), rows_per = (HW + chunks - 1) / chunks;
    dc_rows_geom gs = dc_rows_geom_make(C, V, 32);
    gs.rt = GN_RT;
    // samples per piece: their partials fit the whole workspace, and grid.z
    // (65535) holds them (with its first quarter only, SD 2.1's 32x32 maps of
    // 320 channels at batch 64 ran as three pieces of kernels too small to
    // fill the GPU: 94 -> 71 us a call on an H200, the same bits)
    int64_t piece = DC_CUDA_NORM_WS_ALL / 2 / (chunks * C);
    if (piece > 65535) piece = 65535;
    for (int b0 = 0; b0 < B; b0 += (int)piece) {
        const int nb = B - b0 < piece ? B - b0 : (int)piece;
        const int64_t off = (int64_t)b0 * C * HW;
        float *mu = (float *)mean.p + (int64_t)b0 * G, *r = (float *)rstd.p + (int64_t)b0 * G;
        const dim3 g1((unsigned)chunks, (unsigned)gs.tiles, (unsigned)nb), b1(gs.ct, GN_RT);
        const void *xp = dc_buf_at(x, off).p;
        if (V == 8) dc_launch(be, k_gn_nhwc_part<8>, g1, b1, 0, part, xp, BF(x), HW, C, gs.cols, rows_per);
        else if (V == 4) dc_launch(be, k_gn_nhwc_part<4>, g1, b1, 0, part, xp, BF(x), HW, C, gs.cols, rows_per);
        else dc_launch(be, k_gn_nhwc_part<1>, g1, b1, 0, part, xp, BF(x), HW, C, gs.cols, rows_per);
        dc_launch(be, k_gn_nhwc_stats, (unsigned)((int64_t)nb * G), GN_ST, 0, mu, r, part, chunks, C, G, HW, eps);
        gn_nhwc_apply(be, out, mu, r, x, gamma, beta, B, b0, nb, C, HW, G, V, silu);
        DC_CUDA_LAUNCHED(be);
    }
}

extern "C" void dc_cuda_group_norm_nhwc_apply(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                                              dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G, bool silu) {
    DC_CUDA_OP(be);
    if (!gn_shape_ok(be, __func__, B, C, HW, G, mean, rstd)) return;
    if (!float_bufs(out, x, gamma, beta))
        DC_CUDA_FAIL(be, "group norm dtypes: x %s, out %s, gamma %s, beta %s (each F32 or BF16)",
                     dc_dtype_name(x.dt), dc_dtype_name(out.dt), dc_dtype_name(gamma.dt), dc_dtype_name(beta.dt));
    gn_nhwc_apply(be, out, (const float *)mean.p, (const float *)rstd.p, x, gamma, beta, B, 0, B, C, HW, G,
                  dc_vec_width(C, x, out, dc_buf_none()), silu);
    DC_CUDA_LAUNCHED(be);
}

// ---- group norm backward ---------------------------------------------------------------
// With y = xhat gamma + beta (and out = act(y)), dy = dout act'(y): a row's
// (sum dy, sum dy xhat) serve both the parameter gradients (summed over
// samples) and the group means of g = dy gamma that dx needs.
struct gn_elem {
    float xh, dy;
};
__device__ __forceinline__ gn_elem gn_bwd_elem(float x, float d, float mu, float r, float ga, float be, bool silu) {
    float xh = dc_norm_xhat(x, mu, r);
    if (silu) d *= gn_silu_grad(dc_norm_affine(xh, ga, be));
    return {xh, d};
}

__global__ void k_gn_bwd_row_sums(double2 *part, const void *dout, int obf, const void *x, int xbf,
                                  const float *mean, const float *rstd, const void *gamma, int gbf, const void *beta,
                                  int bbf, int C, int64_t HW, int G, bool silu, bool vec) {
    const int row = blockIdx.x, b = row / C, c = row % C, g = c / (C / G);
    const float mu = mean[(int64_t)b * G + g], r = rstd[(int64_t)b * G + g];
    const float ga = dc_ld(gamma, c, gbf), be = silu ? dc_ld(beta, c, bbf) : 0.0f;
    const int64_t base = (int64_t)row * HW;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t i = 4 * (int64_t)threadIdx.x; i < HW; i += 4 * NT) {
        float4 xv = dc_ld4_upto(x, base + i, base + HW, xbf, vec), dv = dc_ld4_upto(dout, base + i, base + HW, obf, vec);
        const float xs[4] = {xv.x, xv.y, xv.z, xv.w}, ds[4] = {dv.x, dv.y, dv.z, dv.w};
        for (int k = 0; k < 4 && i + k < HW; k++) {
            gn_elem e = gn_bwd_elem(xs[k], ds[k], mu, r, ga, be, silu);
            s1 += e.dy, s2 += (double)e.dy * e.xh;
        }
    }
    block_sum2(s1, s2);
    if (threadIdx.x == 0) part[row] = make_double2(s1, s2);
}

// dgamma[c] += sum_b (sum dy xhat) ; dbeta[c] += sum_b (sum dy) (= if set),
// the samples added as dc_lane_sum adds slices.
__global__ void k_gn_bwd_params(void *dgamma, int dgbf, void *dbeta, int dbbf, const double2 *part, int nb, int C,
                                bool set) {
    const int c = blockIdx.x * DC_LS_COLS + threadIdx.x;
    const double *p = (const double *)(part + (c < C ? c : 0));
    const double s1 = dc_lane_sum(p, 2 * (int64_t)C, nb, c < C), s2 = dc_lane_sum(p + 1, 2 * (int64_t)C, nb, c < C);
    if (threadIdx.y || c >= C) return;
    if (dgamma) dc_st(dgamma, c, set ? (float)s2 : dc_ld(dgamma, c, dgbf) + (float)s2, dgbf);
    if (dbeta) dc_st(dbeta, c, set ? (float)s1 : dc_ld(dbeta, c, dbbf) + (float)s1, dbbf);
}
static void gn_bwd_params(dc_backend *be, dc_buf dgamma, dc_buf dbeta, const double2 *part, int nb, int C, bool set) {
    if (!dgamma.p && !dbeta.p) return;
    k_gn_bwd_params<<<dc_lane_grid(C), dc_lane_block(), 0, dc_cuda(be)->stream>>>(dgamma.p, BF(dgamma), dbeta.p,
                                                                                BF(dbeta), part, nb, C, set);
}

// mg = (mean(g), mean(g xhat)) over group g of sample b, g = dy gamma, from
// the rows' partials; thread 0 adds them, in channel order, for the block.
__device__ void gn_group_means(float *mg, const double2 *part, const void *gamma, int gbf, int b, int C, int g, int cg,
                               int64_t HW) {
    if (threadIdx.x == 0) {
        double s1 = 0.0, s2 = 0.0;
        for (int k = g * cg; k < (g + 1) * cg; k++) {
            double2 p = part[(int64_t)b * C + k];
            double gk = dc_ld(gamma, k, gbf);
            s1 += gk * p.x, s2 += gk * p.y;
        }
        double n = (double)cg * HW;
        mg[0] = (float)(s1 / n), mg[1] = (float)(s2 / n);
    }
    __syncthreads();
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) over the group, g = dy gamma.
__global__ void k_gn_bwd_dx(void *dx, int dxbf, const void *dout, int obf, const void *x, int xbf, const float *mean,
                            const float *rstd, const void *gamma, int gbf, const void *beta, int bbf,
                            const double2 *part, int C, int64_t HW, int G, bool silu, bool accumulate, bool vec) {
    __shared__ float mg[2];
    const int row = blockIdx.x, b = row / C, c = row % C, cg = C / G, g = c / cg;
    gn_group_means(mg, part, gamma, gbf, b, C, g, cg, HW);
    const float mu = mean[(int64_t)b * G + g], r = rstd[(int64_t)b * G + g];
    const float ga = dc_ld(gamma, c, gbf), be = silu ? dc_ld(beta, c, bbf) : 0.0f;
    const int64_t base = (int64_t)row * HW;
    for (int64_t i = 4 * (int64_t)threadIdx.x; i < HW; i += 4 * NT) {
        float4 xv = dc_ld4_upto(x, base + i, base + HW, xbf, vec), dv = dc_ld4_upto(dout, base + i, base + HW, obf, vec);
        float4 acc = accumulate ? dc_ld4_upto(dx, base + i, base + HW, dxbf, vec) : make_float4(0, 0, 0, 0);
        const float xs[4] = {xv.x, xv.y, xv.z, xv.w}, ds[4] = {dv.x, dv.y, dv.z, dv.w};
        float o[4] = {acc.x, acc.y, acc.z, acc.w};
        for (int k = 0; k < 4; k++) {
            gn_elem e = gn_bwd_elem(xs[k], ds[k], mu, r, ga, be, silu);
            o[k] += dc_ln_dx(e.dy * ga, e.xh, r, mg[0], mg[1]);
        }
        dc_st4_upto(dx, base + i, base + HW, make_float4(o[0], o[1], o[2], o[3]), dxbf, vec);
    }
}

extern "C" void dc_cuda_group_norm_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout, dc_buf x,
                                       dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B, int C, int64_t HW,
                                       int G, bool silu, int flags) {
    DC_CUDA_OP(be);
    if (!gn_shape_ok(be, __func__, B, C, HW, G, mean, rstd)) return;
    dc_cuda_ctx *c = dc_cuda(be);
    const bool accumulate = flags & DC_BWD_DX_ADD;
    double2 *part = (double2 *)c->norm_ws;
    const bool vec = rows_vec(HW, x, dout, dx);
    const int piece = gn_piece(B, C);
    for (int b0 = 0; b0 < B; b0 += piece) {
        const int nb = B - b0 < piece ? B - b0 : piece;
        const int64_t off = (int64_t)b0 * C * HW;
        const float *mu = (const float *)mean.p + (int64_t)b0 * G, *r = (const float *)rstd.p + (int64_t)b0 * G;
        k_gn_bwd_row_sums<<<nb * C, NT, 0, c->stream>>>(part, dc_buf_at(dout, off).p, BF(dout), dc_buf_at(x, off).p,
                                                        BF(x), mu, r, gamma.p, BF(gamma), beta.p, BF(beta), C, HW, G,
                                                        silu, vec);
        gn_bwd_params(be, dgamma, dbeta, part, nb, C, b0 == 0 && (flags & DC_BWD_DW_SET));
        if (dx.p)
            k_gn_bwd_dx<<<nb * C, NT, 0, c->stream>>>(dc_buf_at(dx, off).p, BF(dx), dc_buf_at(dout, off).p, BF(dout),
                                                      dc_buf_at(x, off).p, BF(x), mu, r, gamma.p, BF(gamma), beta.p,
                                                      BF(beta), part, C, HW, G, silu, accumulate, vec);
        DC_CUDA_LAUNCHED(be);
    }
}

// The backward over channels-last maps x[B, HW, C], read along rows as the
// forward reads them (a block per (sample, channel) reading HW values C
// apart moved a 32-byte sector for every 2-byte value: 1.2 ms a call, 45% of
// the SD 2.1 UNet's training step at 256 px batch 64). Three kernels:
//   1. per (sample, chunk of pixels, channel): (sum dy, sum dy xhat) in
//      double, lanes GN_RT rows apart added in order, as the forward's
//      kernel 1 (the same chunks);
//   2. per (sample, group): each channel's chunks added in order give the
//      rows' partials part[b C + c] (what k_gn_bwd_params reads), then the
//      group's means of g = dy gamma, in channel order, as gn_group_means;
//   3. dx = rstd (g - mean(g) - xhat mean(g xhat)), each thread on fixed
//      channels down a chunk of pixels, as the forward's kernel 3.
// The workspace holds, per piece of nb samples: the rows' partials [nb, C],
// the groups' means [nb, G] and the chunks' partials [nb, chunks, C].
template <int V>
__global__ void k_gn_nhwc_bwd_part(double2 *part, const void *dout, int obf, const void *x, int xbf,
                                   const float *mean, const float *rstd, const void *gamma, int gbf,
                                   const void *beta, int bbf, int64_t HW, int C, int G, int cols, int64_t rows_per,
                                   bool silu) {
    dc_pdl_enter();
    const int col = blockIdx.y * blockDim.x + threadIdx.x, b = blockIdx.z, c0 = col * V, cg = C / G;
    const int64_t chunk = blockIdx.x, p0 = chunk * rows_per, p1 = p0 + rows_per < HW ? p0 + rows_per : HW;
    double s1[V], s2[V];
    for (int k = 0; k < V; k++) s1[k] = 0.0, s2[k] = 0.0;
    if (col < cols) {
        float mu[V], r[V], ga[V], be[V];
        for (int k = 0; k < V; k++) {
            const int64_t j = (int64_t)b * G + (c0 + k) / cg;
            mu[k] = mean[j], r[k] = rstd[j];
            ga[k] = dc_ld(gamma, c0 + k, gbf), be[k] = silu ? dc_ld(beta, c0 + k, bbf) : 0.0f;
        }
        const int64_t base = (int64_t)b * HW * C + c0;
#pragma unroll 1
        for (int64_t p = p0 + threadIdx.y; p < p1; p += GN_RT) {
            float xv[V], dv[V];
            dc_ldv<V>(xv, x, base + p * C, xbf);
            dc_ldv<V>(dv, dout, base + p * C, obf);
            for (int k = 0; k < V; k++) {
                const gn_elem e = gn_bwd_elem(xv[k], dv[k], mu[k], r[k], ga[k], be[k], silu);
                s1[k] += e.dy, s2[k] += (double)e.dy * e.xh;
            }
        }
    }
    gn_lanes_store<V>(part + ((int64_t)b * gridDim.x + chunk) * C + c0, s1, s2, col < cols);
}

// A block per (sample, group): rows[b C + c] = the sum of channel c's
// chunks, in chunk order; mg[b G + g] = (mean(g), mean(g xhat)) when wanted.
enum { GN_BT = 64 };
__global__ void __launch_bounds__(GN_BT) k_gn_nhwc_bwd_rows(double2 *rows, double2 *mg, const double2 *part,
                                                           int64_t chunks, const void *gamma, int gbf, int C, int G,
                                                           int64_t HW) {
    dc_pdl_enter();
    const int b = blockIdx.x / G, g = blockIdx.x % G, cg = C / G;
    for (int k = threadIdx.x; k < cg; k += GN_BT) {
        const int c = g * cg + k;
        double s1 = 0.0, s2 = 0.0;
#pragma unroll 8  // the loads in flight together; the sums in chunk order
        for (int64_t q = 0; q < chunks; q++) {
            const double2 p = part[((int64_t)b * chunks + q) * C + c];
            s1 += p.x, s2 += p.y;
        }
        rows[(int64_t)b * C + c] = make_double2(s1, s2);
    }
    if (!mg) return;
    __syncthreads();  // the block's rows are visible to its thread 0
    if (threadIdx.x == 0) {
        double s1 = 0.0, s2 = 0.0;
        for (int c = g * cg; c < (g + 1) * cg; c++) {
            const double2 p = rows[(int64_t)b * C + c];
            const double gk = dc_ld(gamma, c, gbf);
            s1 += gk * p.x, s2 += gk * p.y;
        }
        const double n = (double)cg * HW;
        mg[blockIdx.x] = make_double2(s1 / n, s2 / n);
    }
}

// dx (+)= rstd (g - mean(g) - xhat mean(g xhat)). Block (chunk of a sample's
// pixels, tile of columns): blockIdx.x = b cps + chunk.
template <int V>
__global__ void k_gn_nhwc_bwd_dx(void *dx, int dxbf, const void *dout, int obf, const void *x, int xbf,
                                 const float *mean, const float *rstd, const void *gamma, int gbf, const void *beta,
                                 int bbf, const double2 *mg, int64_t HW, int C, int G, int cols, int64_t cps,
                                 int64_t rows_per, bool silu, bool accumulate) {
    dc_pdl_enter();
    const int col = blockIdx.y * blockDim.x + threadIdx.x, c0 = col * V, cg = C / G;
    if (col >= cols) return;
    const gn_span sp = gn_span_of(cps, rows_per, HW);
    float mu[V], r[V], ga[V], be[V], m1[V], m2[V];  // each channel's statistics, means of g and parameters
    for (int k = 0; k < V; k++) {
        const int64_t j = sp.b * G + (c0 + k) / cg;
        mu[k] = mean[j], r[k] = rstd[j], m1[k] = (float)mg[j].x, m2[k] = (float)mg[j].y;
        ga[k] = dc_ld(gamma, c0 + k, gbf), be[k] = silu ? dc_ld(beta, c0 + k, bbf) : 0.0f;
    }
    const int64_t base = sp.b * HW * C + c0;
#pragma unroll 4
    for (int64_t p = sp.p0 + threadIdx.y; p < sp.p1; p += blockDim.y) {
        float xv[V], dv[V], o[V];
        dc_ldv<V>(xv, x, base + p * C, xbf);
        dc_ldv<V>(dv, dout, base + p * C, obf);
        if (accumulate) dc_ldv<V>(o, dx, base + p * C, dxbf);
        for (int k = 0; k < V; k++) {
            const gn_elem e = gn_bwd_elem(xv[k], dv[k], mu[k], r[k], ga[k], be[k], silu);
            const float v = dc_ln_dx(e.dy * ga[k], e.xh, r[k], m1[k], m2[k]);
            o[k] = accumulate ? o[k] + v : v;
        }
        dc_stv<V>(dx, base + p * C, o, dxbf);
    }
}

extern "C" void dc_cuda_group_norm_nhwc_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                                            dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B,
                                            int C, int64_t HW, int G, bool silu, int flags) {
    DC_CUDA_OP(be);
    const bool accumulate = flags & DC_BWD_DX_ADD;
    if (!gn_shape_ok(be, __func__, B, C, HW, G, mean, rstd)) return;
    if (!float_bufs(dout, x, gamma, beta) || (dx.p && dx.dt != DC_F32 && dx.dt != DC_BF16))
        DC_CUDA_FAIL(be, "group norm backward dtypes: x %s, dout %s, dx %s, gamma %s, beta %s (each F32 or BF16)",
                     dc_dtype_name(x.dt), dc_dtype_name(dout.dt), dx.p ? dc_dtype_name(dx.dt) : "-",
                     dc_dtype_name(gamma.dt), dc_dtype_name(beta.dt));
    dc_cuda_ctx *c = dc_cuda(be);
    // At most 4 channels a thread (the lanes' order of the sums does not depend
    // on it): kernel 1 with 8 held 16 double sums and 166 registers, so 15% of
    // an H200's warps ran, and kernel 3 96 (SD 2.1's 32x32 maps of 320 to 960
    // channels at batch 64: 209 -> 145, 499 -> 273, 758 -> 449 us a call)
    const int Vw = dc_vec_width(C, x, dout, dx), V = Vw > 4 ? 4 : Vw;
    const int64_t chunks = gn_nhwc_chunks(HW, C, GN_BWD_ROWS), rows_per = (HW + chunks - 1) / chunks;
    dc_rows_geom gs = dc_rows_geom_make(C, V, 32);
    gs.rt = GN_RT;
    const dc_rows_geom ga = dc_rows_geom_make(C, V, NT);
    const int64_t rows_dx = dc_rows_chunk(&ga, (int64_t)B * HW, 8), cps = (HW + rows_dx - 1) / rows_dx;
    int64_t piece = DC_CUDA_NORM_WS_ALL / 2 / (C + G + chunks * C);
    if (piece > 65535) piece = 65535;
    for (int b0 = 0; b0 < B; b0 += (int)piece) {
        const int nb = B - b0 < piece ? B - b0 : (int)piece;
        double2 *rows = (double2 *)c->norm_ws, *mg = rows + (int64_t)nb * C, *part = mg + (int64_t)nb * G;
        const int64_t off = (int64_t)b0 * C * HW;
        const float *mu = (const float *)mean.p + (int64_t)b0 * G, *r = (const float *)rstd.p + (int64_t)b0 * G;
        const void *xp = dc_buf_at(x, off).p, *op = dc_buf_at(dout, off).p;
        const dim3 g1((unsigned)chunks, (unsigned)gs.tiles, (unsigned)nb), b1(gs.ct, GN_RT);
        if (V == 4)
            dc_launch(be, k_gn_nhwc_bwd_part<4>, g1, b1, 0, part, op, BF(dout), xp, BF(x), mu, r, gamma.p,
                      BF(gamma), beta.p, BF(beta), HW, C, G, gs.cols, rows_per, silu);
        else
            dc_launch(be, k_gn_nhwc_bwd_part<1>, g1, b1, 0, part, op, BF(dout), xp, BF(x), mu, r, gamma.p,
                      BF(gamma), beta.p, BF(beta), HW, C, G, gs.cols, rows_per, silu);
        dc_launch(be, k_gn_nhwc_bwd_rows, (unsigned)((int64_t)nb * G), GN_BT, 0, rows, dx.p ? mg : (double2 *)NULL,
                  (const double2 *)part, chunks, gamma.p, BF(gamma), C, G, HW);
        gn_bwd_params(be, dgamma, dbeta, rows, nb, C, b0 == 0 && (flags & DC_BWD_DW_SET));
        if (dx.p) {
            const dim3 g3((unsigned)(nb * cps), (unsigned)ga.tiles), b3(ga.ct, ga.rt);
            void *dp = dc_buf_at(dx, off).p;
            const double2 *m = mg;
            if (V == 4)
                dc_launch(be, k_gn_nhwc_bwd_dx<4>, g3, b3, 0, dp, BF(dx), op, BF(dout), xp, BF(x), mu, r, gamma.p,
                          BF(gamma), beta.p, BF(beta), m, HW, C, G, ga.cols, cps, rows_dx, silu, accumulate);
            else
                dc_launch(be, k_gn_nhwc_bwd_dx<1>, g3, b3, 0, dp, BF(dx), op, BF(dout), xp, BF(x), mu, r, gamma.p,
                          BF(gamma), beta.p, BF(beta), m, HW, C, G, ga.cols, cps, rows_dx, silu, accumulate);
        }
        DC_CUDA_LAUNCHED(be);
    }
}

// ---- channel sums of channels-last maps -----------------------------------------------
// dv[b, c] = sum over pixels of x[b, p, c] (the gradient of a bias broadcast
// over pixels, the UNet's time projection): the group norm forward's kernel 1
// gives the chunks' sums (its sums of squares unused: the pass is bound by
// reading x), then a thread per (sample, channel) adds its chunks in order.
// (A thread per (sample, channel) walking all the pixels left a batch of 16
// 64x64 maps with 5120 threads of 4096 serial loads each: 0.25 ms a call.)
__global__ void k_channel_sum_chunks(void *dv, int vbf, const double2 *part, int64_t chunks, int nb, int C) {
    dc_pdl_enter();
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, b = i / C, c = i % C;
    if (i >= (int64_t)nb * C) return;
    double s = 0.0;
    for (int64_t q = 0; q < chunks; q++) s += part[(b * chunks + q) * C + c].x;
    dc_st(dv, i, (float)s, vbf);
}

extern "C" void dc_cuda_channel_sum_nhwc(dc_backend *be, dc_buf dv, dc_buf x, int B, int C, int64_t HW) {
    DC_CUDA_OP(be);
    if ((dv.dt != DC_F32 && dv.dt != DC_BF16) || (x.dt != DC_F32 && x.dt != DC_BF16))
        DC_CUDA_FAIL(be, "channel_sum_nhwc dtypes: dv %s, dx %s (each F32 or BF16)", dc_dtype_name(dv.dt),
                     dc_dtype_name(x.dt));
    if (B <= 0 || C <= 0) return;
    if (HW < 1) {  // sums of nothing (zero is all zero bits in both dtypes)
        DC_CUDA(be, cudaMemsetAsync(dv.p, 0, (size_t)B * C * dc_dtype_size(dv.dt), dc_cuda(be)->stream));
        return;
    }
    double2 *part = (double2 *)dc_cuda(be)->norm_ws;
    const int V = dc_vec_width(C, x, dc_buf_none(), dc_buf_none());
    const int64_t chunks = gn_nhwc_chunks(HW, C, GN_SUM_ROWS), rows_per = (HW + chunks - 1) / chunks;
    dc_rows_geom gs = dc_rows_geom_make(C, V, 32);
    gs.rt = GN_RT;
    int64_t piece = DC_CUDA_NORM_WS_ALL / 2 / (chunks * C);
    if (piece > 65535) piece = 65535;
    for (int b0 = 0; b0 < B; b0 += (int)piece) {
        const int nb = B - b0 < piece ? B - b0 : (int)piece;
        const void *xp = dc_buf_at(x, (int64_t)b0 * C * HW).p;
        const dim3 g1((unsigned)chunks, (unsigned)gs.tiles, (unsigned)nb), b1(gs.ct, GN_RT);
        if (V == 8) dc_launch(be, k_gn_nhwc_part<8>, g1, b1, 0, part, xp, BF(x), HW, C, gs.cols, rows_per);
        else if (V == 4) dc_launch(be, k_gn_nhwc_part<4>, g1, b1, 0, part, xp, BF(x), HW, C, gs.cols, rows_per);
        else dc_launch(be, k_gn_nhwc_part<1>, g1, b1, 0, part, xp, BF(x), HW, C, gs.cols, rows_per);
        const int64_t n = (int64_t)nb * C;
        dc_launch(be, k_channel_sum_chunks, (unsigned)((n + 255) / 256), 256, 0, dc_buf_at(dv, (int64_t)b0 * C).p,
                  BF(dv), (const double2 *)part, chunks, nb, C);
        DC_CUDA_LAUNCHED(be);
    }
}
