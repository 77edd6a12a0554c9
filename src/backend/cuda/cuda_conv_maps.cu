// Convolutions' passes over their maps: the zero-padded copy of an input
// that cuDNN cannot pad as the layer does (asymmetric padding) and the crop
// of its gradient, and the bias added and its gradient summed (cuda_conv.h).
#include "backend/cuda/cuda_conv.h"

// ---- padding ------------------------------------------------------------------------------
// Both layouts are maps [N, H, W, C]: channels-first ones with N = B Ci and
// C = 1, channels-last ones with N = B. A thread takes V channels of a pixel.

// xp[N, Hp, Wp, C] = x[N, H, W, C] placed at (pad_t, pad_l), zeros around it;
// n = N Hp Wp C / V.
template <int V>
__global__ void k_conv_pad(void *xp, const void *x, int bf, int H, int W, int C, int Hp, int Wp, int pt, int pl,
                           int64_t n) {
    const int cols = C / V;
    GRID_STRIDE(t, n) {
        const int c = (int)(t % cols) * V;
        const int64_t pix = t / cols, img = pix / ((int64_t)Hp * Wp);
        const int j = (int)(pix % Wp) - pl, r = (int)(pix / Wp % Hp) - pt;
        float v[V] = {};
        if (r >= 0 && r < H && j >= 0 && j < W) dc_ldv<V>(v, x, ((img * H + r) * W + j) * C + c, bf);
        dc_stv<V>(xp, pix * C + c, v, bf);
    }
}

// dx[N, H, W, C] (+)= the window of dxp[N, Hp, Wp, C] at (pad_t, pad_l); n = N H W C / V.
template <int V>
__global__ void k_conv_crop(void *dx, const void *dxp, int bf, int H, int W, int C, int Hp, int Wp, int pt, int pl,
                            bool accumulate, int64_t n) {
    const int cols = C / V;
    GRID_STRIDE(t, n) {
        const int c = (int)(t % cols) * V;
        const int64_t pix = t / cols, img = pix / ((int64_t)H * W);
        const int j = (int)(pix % W), r = (int)(pix / W % H);
        float v[V];
        dc_ldv<V>(v, dxp, ((img * Hp + r + pt) * Wp + j + pl) * C + c, bf);
        if (accumulate) {
            float a[V];
            dc_ldv<V>(a, dx, pix * C + c, bf);
            for (int k = 0; k < V; k++) v[k] += a[k];
        }
        dc_stv<V>(dx, pix * C + c, v, bf);
    }
}

// The maps' [N, H, W, C] view of a shape (see above), and the padded sides.
typedef struct {
    int64_t N;
    int C, Hp, Wp;
} pad_geom;

static pad_geom pad_view(const dc_conv2d_shape *s) {
    pad_geom g = {s->nhwc ? s->B : (int64_t)s->B * s->Ci, s->nhwc ? s->Ci : 1, s->H + s->pad_t + s->pad_b,
                  s->W + s->pad_l + s->pad_r};
    return g;
}

// Copies x into the scratch, zero-padded, for a plan that pads asymmetrically;
// returns the input cuDNN reads.
const void *dc_conv_input(dc_backend *be, const dc_conv_plan *p, dc_buf x) {
    if (!p->padded) return x.p;
    dc_cuda_ctx *c = dc_cuda(be);
    const dc_conv2d_shape *s = &p->s;
    const pad_geom g = pad_view(s);
    const int64_t N = g.N;
    const int C = g.C, Hp = g.Hp, Wp = g.Wp;
    void *xp = c->conv_scratch;  // the scratch's head (scratch_fwd_bytes)
    const dc_buf xpb = {xp, x.dt};
    const int V = dc_vec_width(C, x, xpb, dc_buf_none());
    const int64_t n = N * Hp * Wp * (C / V);
    if (V == 8)
        k_conv_pad<8><<<dc_blocks(n, TPB), TPB, 0, c->stream>>>(xp, x.p, BF(x), s->H, s->W, C, Hp, Wp, s->pad_t,
                                                                s->pad_l, n);
    else if (V == 4)
        k_conv_pad<4><<<dc_blocks(n, TPB), TPB, 0, c->stream>>>(xp, x.p, BF(x), s->H, s->W, C, Hp, Wp, s->pad_t,
                                                                s->pad_l, n);
    else
        k_conv_pad<1><<<dc_blocks(n, TPB), TPB, 0, c->stream>>>(xp, x.p, BF(x), s->H, s->W, C, Hp, Wp, s->pad_t,
                                                                s->pad_l, n);
    return xp;
}

// dx (+)= the window of the padded input gradient dxp.
void dc_conv_crop(dc_backend *be, const dc_conv_plan *p, dc_buf dx, const void *dxp, bool accumulate) {
    dc_cuda_ctx *c = dc_cuda(be);
    const dc_conv2d_shape *s = &p->s;
    const pad_geom g = pad_view(s);
    const int64_t N = g.N;
    const int C = g.C, Hp = g.Hp, Wp = g.Wp;
    const dc_buf dxpb = {(void *)dxp, dx.dt};
    const int V = dc_vec_width(C, dx, dxpb, dc_buf_none());
    const int64_t n = N * s->H * s->W * (C / V);
    if (V == 8)
        k_conv_crop<8><<<dc_blocks(n, TPB), TPB, 0, c->stream>>>(dx.p, dxp, BF(dx), s->H, s->W, C, Hp, Wp, s->pad_t,
                                                                 s->pad_l, accumulate, n);
    else if (V == 4)
        k_conv_crop<4><<<dc_blocks(n, TPB), TPB, 0, c->stream>>>(dx.p, dxp, BF(dx), s->H, s->W, C, Hp, Wp, s->pad_t,
                                                                 s->pad_l, accumulate, n);
    else
        k_conv_crop<1><<<dc_blocks(n, TPB), TPB, 0, c->stream>>>(dx.p, dxp, BF(dx), s->H, s->W, C, Hp, Wp, s->pad_t,
                                                                 s->pad_l, accumulate, n);
}

// ---- bias ---------------------------------------------------------------------------------
// out[B, Co, HW] += b[co]; four values a thread, of one channel when HW % 4 == 0.
__global__ void k_conv_bias(void *out, int obf, const void *b, int bbf, int Co, int64_t HW, int64_t n, bool vec) {
    GRID_STRIDE(t, (n + 3) / 4) {
        int64_t i = 4 * t;
        float4 v = dc_ld4_upto(out, i, n, obf, vec);
        float a[4] = {v.x, v.y, v.z, v.w};
        for (int k = 0; k < 4; k++) a[k] += dc_ld(b, ((i + k) / HW) % Co, bbf);
        dc_st4_upto(out, i, n, make_float4(a[0], a[1], a[2], a[3]), obf, vec);
    }
}

// out[M, Co] += b[Co] (channels-last: M = B Ho Wo rows). A thread keeps its V
// channels' bias (read one by one, once: b may lie at any offset) and walks
// the rows of its block's chunk (dc_rows_geom).
template <int V>
__global__ void k_conv_bias_nhwc(void *out, int obf, const void *b, int bbf, int64_t M, int Co, int cols,
                                 int64_t chunk) {
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const int c = col * V;
    float bv[V];
    for (int k = 0; k < V; k++) bv[k] = dc_ld(b, c + k, bbf);
    const int64_t r0 = blockIdx.x * chunk, r1 = r0 + chunk < M ? r0 + chunk : M;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
        float v[V];
        dc_ldv<V>(v, out, r * Co + c, obf);
        for (int k = 0; k < V; k++) v[k] += bv[k];
        dc_stv<V>(out, r * Co + c, v, obf);
    }
}

void dc_conv_bias(dc_backend *be, dc_buf out, dc_buf b, const dc_conv2d_shape *s) {
    cudaStream_t st = dc_cuda(be)->stream;
    const int64_t HW = (int64_t)dc_conv2d_ho(s) * dc_conv2d_wo(s);
    if (!s->nhwc) {
        const int64_t n = (int64_t)s->B * s->Co * HW;
        k_conv_bias<<<dc_blocks((n + 3) / 4, TPB), TPB, 0, st>>>(out.p, BF(out), b.p, BF(b), s->Co, HW, n,
                                                                HW % 4 == 0 && dc_vec4(out));
        return;
    }
    const int64_t M = s->B * HW;
    const dc_rows_geom g = dc_rows_geom_make(s->Co, dc_vec_width(s->Co, out, dc_buf_none(), dc_buf_none()), TPB);
    const int64_t chunk = dc_rows_chunk(&g, M, 8);
    const dim3 grid((unsigned)((M + chunk - 1) / chunk), (unsigned)g.tiles), block(g.ct, g.rt);
    if (g.V == 8)
        k_conv_bias_nhwc<8><<<grid, block, 0, st>>>(out.p, BF(out), b.p, BF(b), M, s->Co, g.cols, chunk);
    else if (g.V == 4)
        k_conv_bias_nhwc<4><<<grid, block, 0, st>>>(out.p, BF(out), b.p, BF(b), M, s->Co, g.cols, chunk);
    else
        k_conv_bias_nhwc<1><<<grid, block, 0, st>>>(out.p, BF(out), b.p, BF(b), M, s->Co, g.cols, chunk);
}

// db[co] += (= if set) sum over b and pixels of dout[b, co, :]: one block per channel,
// threads over pixels, a fixed tree over threads.
__global__ void k_conv_bias_grad(void *db, int dbbf, const void *dout, int gbf, int B, int Co, int64_t HW, bool set) {
    __shared__ double sm[TPB];
    const int co = blockIdx.x;
    double s = 0.0;
    for (int b = 0; b < B; b++) {
        const int64_t base = ((int64_t)b * Co + co) * HW;
        for (int64_t i = threadIdx.x; i < HW; i += TPB) s += dc_ld(dout, base + i, gbf);
    }
    sm[threadIdx.x] = s;
    __syncthreads();
    for (int k = TPB / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sm[threadIdx.x] += sm[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) dc_st(db, co, set ? (float)sm[0] : dc_ld(db, co, dbbf) + (float)sm[0], dbbf);
}

// Channels-last: part[slice, co] = the sum of dout[m, co] over the slice's
// rows m. A block takes 32 channels (a warp along a row) and 8 row lanes,
// combined in lane order.
__global__ void k_conv_bias_grad_nhwc(double *part, const void *dout, int gbf, int64_t M, int Co, int64_t rows_per) {
    __shared__ double acc[8][33];
    const int co = blockIdx.x * 32 + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per, r1 = r0 + rows_per < M ? r0 + rows_per : M;
    double s = 0.0;
    if (co < Co)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += dc_ld(dout, r * Co + co, gbf);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && co < Co) {
        double t = 0.0;
        for (int y = 0; y < 8; y++) t += acc[y][threadIdx.x];
        part[(int64_t)blockIdx.y * Co + co] = t;
    }
}

// db[co] += the slices' partial sums (= if set), added as dc_lane_sum adds them.
__global__ void k_conv_bias_grad_sum(void *db, int dbbf, const double *part, int slices, int Co, bool set) {
    const int co = blockIdx.x * DC_LS_COLS + threadIdx.x;
    const double t = dc_lane_sum(part + (co < Co ? co : 0), Co, slices, co < Co);
    if (threadIdx.y == 0 && co < Co) dc_st(db, co, set ? (float)t : dc_ld(db, co, dbbf) + (float)t, dbbf);
}

void dc_conv_bias_grad(dc_backend *be, dc_buf db, dc_buf dout, const dc_conv2d_shape *s, bool set) {
    dc_cuda_ctx *c = dc_cuda(be);
    const int64_t HW = (int64_t)dc_conv2d_ho(s) * dc_conv2d_wo(s);
    if (!s->nhwc) {
        k_conv_bias_grad<<<s->Co, TPB, 0, c->stream>>>(db.p, BF(db), dout.p, BF(dout), s->B, s->Co, HW, set);
        return;
    }
    // slices of at least 256 rows, cut from the shape alone
    const int64_t M = s->B * HW;
    const int64_t slices = (M + 255) / 256 < (int64_t)DB_SLICES ? (M + 255) / 256 : (int64_t)DB_SLICES;
    const int64_t rows_per = (M + slices - 1) / slices;
    double *part = (double *)((char *)c->conv_scratch + scratch_db_offset(s));
    k_conv_bias_grad_nhwc<<<dim3((s->Co + 31) / 32, (unsigned)slices), dim3(32, 8), 0, c->stream>>>(
        part, dout.p, BF(dout), M, s->Co, rows_per);
    k_conv_bias_grad_sum<<<dc_lane_grid(s->Co), dc_lane_block(), 0, c->stream>>>(db.p, BF(db), part, (int)slices,
                                                                                 s->Co, set);
}
