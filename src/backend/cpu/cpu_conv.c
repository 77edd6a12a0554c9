// 2-D convolution (PyTorch's Conv2d) as im2col + OpenBLAS GEMM, forward and
// backward, on NCHW maps or (s->nhwc) channels-last ones.
//
// NCHW: per image, the output rows are cut into bands. A band's input patches
// are unfolded into col[K = Ci*k*k, P = rows*Wo] (the workspace reserve_conv
// sized) and out[Co, band] = w[Co, K] @ col. Backward unfolds the same band:
// dw[Co, K] += dout[Co, band] @ col^T, then dcol = w^T @ dout[Co, band]
// overwrites col and is folded back onto dx (col2im). Bands keep the
// workspace to a few MiB whatever the image size (a 512x512 VAE layer would
// need 1-2 GiB of columns at once). A 1x1, stride-1, unpadded conv is a GEMM
// on x itself and needs no workspace.
//
// Channels-last is the same method transposed: col[P, K = k*k*Ci] holds one
// output pixel per row with its taps in (ky, kx, ci) order, the order of the
// weight's rows w[Co, k, k, Ci], so each tap is a contiguous copy of a pixel's
// channels; out[band, Co] = col @ w^T, dw += dout[band, Co]^T @ col and
// dcol = dout @ w. The workspace is the same size in both layouts.
//
// Determinism: bands and GEMM tiles are cut from the shape alone, never from
// the thread count; each tile is one single-threaded OpenBLAS call (see
// dc_cpu_blas_init) and every sum over bands or images runs in a fixed order,
// so results are bitwise the same for any number of threads.
#include <cblas.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

// Floats of im2col columns per band: 8 MiB, a band of 11 rows at 64x64 with
// 320 channels (K = 2880), or 3 rows at 512x512 with 128. Halving it or
// doubling it changes a 320-channel 64x64 conv's speed by a few percent;
// a quarter of it (one row of 64 there) makes the products too thin.
#define COL_BAND_FLOATS (1 << 21)
// GEMM tiles: TN output columns; TM rows as well when fewer than MIN_TILES
// column tiles would leave threads idle. Each tile repacks its share of the
// other operand, which costs about 1/(2 TM) (or 1/(2 TN)) of the product.
enum { TN = 256, TM = 128, MIN_TILES = 8 };

static bool is_direct(const dc_conv2d_shape *s) {
    return s->k == 1 && s->stride == 1 && !s->pad_t && !s->pad_b && !s->pad_l && !s->pad_r;
}

// Output rows per band, from the shape alone.
static int band_rows(const dc_conv2d_shape *s) {
    const int Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s);
    if (is_direct(s)) return Ho;
    const int64_t rows = COL_BAND_FLOATS / ((int64_t)s->Ci * s->k * s->k * Wo);
    return rows < 1 ? 1 : rows > Ho ? Ho : (int)rows;
}

// K * rows * Wo floats in either layout ([K, P] or [P, K] columns).
size_t dc_cpu_conv_ws_floats(const dc_conv2d_shape *s) {
    if (is_direct(s)) return 0;
    return (size_t)s->Ci * s->k * s->k * band_rows(s) * dc_conv2d_wo(s);
}

static float *workspace(dc_backend *be, const dc_conv2d_shape *s) {
    dc_cpu_ctx *ctx = be->ctx;
    // Sized by reserve_conv before the first conv of this shape; a shortfall is a caller's bug.
    assert(dc_cpu_conv_ws_floats(s) <= ctx->conv_ws_floats && "reserve_conv was not called");
    return ctx->conv_ws;
}

// Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta C, in tiles run in parallel.
// With bias, each tile's C starts as the bias and the product is added to it:
// bias[m] along row m (NCHW: a channel per row), or with bias_cols bias[n]
// down column n (channels-last: a channel per column).
static void gemm_tiles(bool ta, bool tb, int M, int N, int K, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc, const float *bias,
                       bool bias_cols) {
    const int ntn = (N + TN - 1) / TN, tm = ntn >= MIN_TILES ? M : TM;
    const int ntm = (M + tm - 1) / tm;
    const enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
#pragma omp parallel for schedule(dynamic) if ((int64_t)M * N * K > DC_CPU_PAR_MIN)
    for (int t = 0; t < ntm * ntn; t++) {
        const int m0 = t / ntn * tm, n0 = t % ntn * TN;
        const int mc = M - m0 < tm ? M - m0 : tm, nc = N - n0 < TN ? N - n0 : TN;
        float *c = C + (int64_t)m0 * ldc + n0;
        float bt = beta;
        if (bias) {
            for (int m = 0; m < mc; m++)
                for (int n = 0; n < nc; n++)
                    c[(int64_t)m * ldc + n] = bias_cols ? bias[n0 + n] : bias[m0 + m];
            bt = 1.0f;
        }
        const float *a = ta ? A + m0 : A + (int64_t)m0 * lda;
        const float *b = tb ? B + (int64_t)n0 * ldb : B + n0;
        cblas_sgemm(CblasRowMajor, opa, opb, mc, nc, K, 1.0f, a, lda, b, ldb, bt, c, ldc);
    }
}

// The output columns [lo, hi) whose tap kx reads inside the image row:
// 0 <= wo*stride - pad_l + kx < W.
static void tap_range(const dc_conv2d_shape *s, int Wo, int kx, int *lo, int *hi) {
    const int first = s->pad_l - kx, last = s->W - 1 + s->pad_l - kx;  // bounds on wo*stride
    int l = first <= 0 ? 0 : (first + s->stride - 1) / s->stride;
    int h = last < 0 ? 0 : last / s->stride + 1;
    h = h < Wo ? h : Wo;
    *lo = l < h ? l : h;
    *hi = h;
}

// ---- NCHW: x[B, Ci, H, W], w[Co, Ci, k, k], out[B, Co, Ho, Wo] ------------------------------

// col[(ci*k + ky)*k + kx, r*Wo + wo] = x[ci, (ho0+r)*stride - pad_t + ky,
// wo*stride - pad_l + kx], 0 in the padding; rows r < nr of the band.
static void im2col(float *col, const float *x, const dc_conv2d_shape *s, int Wo, int ho0,
                   int nr) {
    const int k = s->k, K = s->Ci * k * k, H = s->H, W = s->W, st = s->stride;
    const int64_t P = (int64_t)nr * Wo;
#pragma omp parallel for schedule(static) if (K * P > DC_CPU_PAR_MIN)
    for (int row = 0; row < K; row++) {
        const int ci = row / (k * k), ky = row / k % k, kx = row % k;
        const float *xc = x + (int64_t)ci * H * W;
        float *c = col + row * P;
        int lo, hi;
        tap_range(s, Wo, kx, &lo, &hi);
        for (int r = 0; r < nr; r++) {
            const int iy = (ho0 + r) * st - s->pad_t + ky;
            float *dst = c + (int64_t)r * Wo;
            if (iy < 0 || iy >= H || lo == hi) {
                memset(dst, 0, (size_t)Wo * sizeof(float));
                continue;
            }
            const float *src = xc + (int64_t)iy * W + (lo * st - s->pad_l + kx);  // x at wo = lo
            for (int wo = 0; wo < lo; wo++) dst[wo] = 0.0f;
            if (st == 1) memcpy(dst + lo, src, (size_t)(hi - lo) * sizeof(float));
            else
                for (int wo = lo; wo < hi; wo++) dst[wo] = src[(int64_t)(wo - lo) * st];
            for (int wo = hi; wo < Wo; wo++) dst[wo] = 0.0f;
        }
    }
}

// The adjoint of im2col: dx[ci, iy, ix] += every col entry that read it.
// Parallel over input channels, each summing its taps in one fixed order.
static void col2im(float *dx, const float *col, const dc_conv2d_shape *s, int Wo, int ho0,
                   int nr) {
    const int k = s->k, H = s->H, W = s->W, st = s->stride;
    const int64_t P = (int64_t)nr * Wo;
#pragma omp parallel for schedule(static) if ((int64_t)s->Ci * k * k * P > DC_CPU_PAR_MIN)
    for (int ci = 0; ci < s->Ci; ci++) {
        float *dxc = dx + (int64_t)ci * H * W;
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                const float *c = col + ((int64_t)(ci * k + ky) * k + kx) * P;
                int lo, hi;
                tap_range(s, Wo, kx, &lo, &hi);
                if (lo == hi) continue;  // this tap reads only padding
                for (int r = 0; r < nr; r++) {
                    const int iy = (ho0 + r) * st - s->pad_t + ky;
                    if (iy < 0 || iy >= H) continue;
                    float *d = dxc + (int64_t)iy * W + (lo * st - s->pad_l + kx);  // at wo = lo
                    const float *src = c + (int64_t)r * Wo;
                    for (int wo = lo; wo < hi; wo++) d[(int64_t)(wo - lo) * st] += src[wo];
                }
            }
    }
}

// ---- channels-last: x[B, H, W, Ci], w[Co, k, k, Ci], out[B, Ho, Wo, Co] ----------------------

// col[r*Wo + wo, (ky*k + kx)*Ci + ci] = x[(ho0+r)*stride - pad_t + ky,
// wo*stride - pad_l + kx, ci], 0 in the padding; rows r < nr of the band.
// The taps kx of one ky read neighbouring pixels of one input row, which are
// contiguous channels-last: one copy per (pixel, ky).
static void im2col_nhwc(float *col, const float *x, const dc_conv2d_shape *s, int Wo, int ho0,
                        int nr) {
    const int k = s->k, Ci = s->Ci, K = k * k * Ci, st = s->stride;
    const int64_t P = (int64_t)nr * Wo;
#pragma omp parallel for schedule(static) if (K * P > DC_CPU_PAR_MIN)
    for (int64_t p = 0; p < P; p++) {
        const int iy0 = (ho0 + (int)(p / Wo)) * st - s->pad_t;
        const int ix0 = (int)(p % Wo) * st - s->pad_l;
        // The taps [lo, hi) that land inside the row.
        const int lo = ix0 < 0 ? -ix0 : 0, hi = s->W - ix0 < k ? s->W - ix0 : k;
        for (int ky = 0; ky < k; ky++) {
            float *c = col + p * K + (int64_t)ky * k * Ci;
            const int iy = iy0 + ky;
            if (iy < 0 || iy >= s->H || lo >= hi) {
                memset(c, 0, (size_t)k * Ci * sizeof(float));
                continue;
            }
            memset(c, 0, (size_t)lo * Ci * sizeof(float));
            memcpy(c + (int64_t)lo * Ci, x + ((int64_t)iy * s->W + ix0 + lo) * Ci,
                   (size_t)(hi - lo) * Ci * sizeof(float));
            memset(c + (int64_t)hi * Ci, 0, (size_t)(k - hi) * Ci * sizeof(float));
        }
    }
}

// Channels per unit of col2im_nhwc's work: a few cache lines of a pixel.
enum { CC = 64 };

// The adjoint of im2col_nhwc: dx[iy, ix, ci] += every col entry that read it.
// Parallel over (input row, chunk of CC channels): each unit owns its part of
// dx and sums the taps into it in one fixed order (ky, then kx).
static void col2im_nhwc(float *dx, const float *col, const dc_conv2d_shape *s, int Wo, int ho0,
                        int nr) {
    const int k = s->k, Ci = s->Ci, K = k * k * Ci, st = s->stride;
    // The input rows the band reads: [y0, y1).
    const int first = ho0 * st - s->pad_t, last = (ho0 + nr - 1) * st - s->pad_t + k;
    const int y0 = first < 0 ? 0 : first, y1 = last < s->H ? last : s->H;
    const int ncc = (Ci + CC - 1) / CC, units = y1 > y0 ? (y1 - y0) * ncc : 0;
#pragma omp parallel for schedule(static) if ((int64_t)K * nr * Wo > DC_CPU_PAR_MIN)
    for (int u = 0; u < units; u++) {
        const int iy = y0 + u / ncc, c0 = u % ncc * CC, nc = Ci - c0 < CC ? Ci - c0 : CC;
        float *dr = dx + (int64_t)iy * s->W * Ci + c0;
        for (int ky = 0; ky < k; ky++) {
            const int t = iy + s->pad_t - ky;  // (ho0 + r) * stride for the band row r that read iy
            if (t < 0 || t % st) continue;
            const int r = t / st - ho0;
            if (r < 0 || r >= nr) continue;
            for (int kx = 0; kx < k; kx++) {
                int lo, hi;
                tap_range(s, Wo, kx, &lo, &hi);
                const float *c = col + (int64_t)r * Wo * K + (ky * k + kx) * Ci + c0;
                for (int wo = lo; wo < hi; wo++) {
                    float *d = dr + (int64_t)(wo * st - s->pad_l + kx) * Ci;
                    const float *src = c + (int64_t)wo * K;
#pragma omp simd
                    for (int j = 0; j < nc; j++) d[j] += src[j];
                }
            }
        }
    }
}

static void conv2d_nhwc_fwd(dc_backend *be, float *out, const float *x, const float *w,
                            const float *bias, const dc_conv2d_shape *s) {
    // out [B, Ho, Wo, Co], x [B, H, W, Ci], w [Co, k, k, Ci], bias [Co] or NULL
    const int Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s), K = s->k * s->k * s->Ci;
    const int Co = s->Co, rows = band_rows(s);
    const bool direct = is_direct(s);
    float *col = direct ? NULL : workspace(be, s);              // [rows*Wo, K]
    for (int b = 0; b < s->B; b++) {
        const float *xb = x + (int64_t)b * s->H * s->W * s->Ci;
        float *ob = out + (int64_t)b * Ho * Wo * Co;
        for (int ho0 = 0; ho0 < Ho; ho0 += rows) {
            const int nr = Ho - ho0 < rows ? Ho - ho0 : rows, P = nr * Wo;
            if (!direct) im2col_nhwc(col, xb, s, Wo, ho0, nr);
            // out[band, Co] = cols[band, K] @ w[Co, K]^T (+ bias); direct: cols = x
            gemm_tiles(false, true, P, Co, K, direct ? xb + (int64_t)ho0 * Wo * K : col, K, w, K,
                       0.0f, ob + (int64_t)ho0 * Wo * Co, Co, bias, true);
        }
    }
}

// Channels per block of the bias gradient's sums: a cache line of them.
enum { DB_CB = 16 };

static void conv2d_nhwc_bwd(dc_backend *be, float *dx, float *dw, float *db, const float *dout,
                            const float *x, const float *w, const dc_conv2d_shape *s,
                            bool accumulate) {
    // dx [B, H, W, Ci] or NULL, dw [Co, k, k, Ci] or NULL, db [Co] or NULL, dout [B, Ho, Wo, Co]
    const int Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s), K = s->k * s->k * s->Ci;
    const int Co = s->Co, rows = band_rows(s);
    const int64_t nxi = (int64_t)s->H * s->W * s->Ci, nob = (int64_t)Ho * Wo * Co;
    const bool direct = is_direct(s);
    float *col = direct || (!dx && !dw) ? NULL : workspace(be, s);  // [rows*Wo, K]
    for (int b = 0; b < s->B && (dx || dw); b++) {
        const float *xb = x + b * nxi, *dob = dout + b * nob;
        float *dxb = dx ? dx + b * nxi : NULL;
        // col2im adds into dx: start from zero unless accumulating.
        if (dxb && !direct && !accumulate) memset(dxb, 0, (size_t)nxi * sizeof(float));
        for (int ho0 = 0; ho0 < Ho; ho0 += rows) {
            const int nr = Ho - ho0 < rows ? Ho - ho0 : rows, P = nr * Wo;
            const float *dband = dob + (int64_t)ho0 * Wo * Co;  // [P, Co]
            if (dw) {  // dw[Co, K] += dout[band, Co]^T @ cols[band, K]
                if (!direct) im2col_nhwc(col, xb, s, Wo, ho0, nr);
                gemm_tiles(true, false, Co, K, P, dband, Co,
                           direct ? xb + (int64_t)ho0 * Wo * K : col, K, 1.0f, dw, K, NULL, false);
            }
            if (!dxb) continue;
            if (direct) {  // dx[band, Ci] (+)= dout[band, Co] @ w[Co, Ci]
                gemm_tiles(false, false, P, K, Co, dband, Co, w, K, accumulate ? 1.0f : 0.0f,
                           dxb + (int64_t)ho0 * Wo * K, K, NULL, false);
            } else {  // dcols[band, K] = dout[band, Co] @ w[Co, K], folded onto dx
                gemm_tiles(false, false, P, K, Co, dband, Co, w, K, 0.0f, col, K, NULL, false);
                col2im_nhwc(dxb, col, s, Wo, ho0, nr);
            }
        }
    }
    if (db) {  // db[Co] += sum over every pixel of every image, per block of channels in order
        const int64_t npix = (int64_t)s->B * Ho * Wo;
        const int ncb = (Co + DB_CB - 1) / DB_CB;
#pragma omp parallel for schedule(static) if (npix * Co > DC_CPU_PAR_MIN)
        for (int cb = 0; cb < ncb; cb++) {
            const int c0 = cb * DB_CB, nc = Co - c0 < DB_CB ? Co - c0 : DB_CB;
            double acc[DB_CB] = {0};
            for (int64_t p = 0; p < npix; p++) {
                const float *d = dout + p * Co + c0;
#pragma omp simd
                for (int j = 0; j < nc; j++) acc[j] += d[j];
            }
            for (int j = 0; j < nc; j++) db[c0 + j] += (float)acc[j];
        }
    }
}

// ---- the backend's entry points: the NCHW method, or the channels-last one above ----------
// The kernel and bias may be F16 or BF16 (weights kept as loaded): widened
// once per call, before the bands and images that reuse them.

void dc_cpu_conv2d_fwd(dc_backend *be, dc_buf out_, dc_buf x_, dc_buf w_, dc_buf b_,
                       const dc_conv2d_shape *s) {
    // Shapes of NCHW maps; channels-last ones (s->nhwc) as in conv2d_nhwc_fwd.
    const int64_t nw = (int64_t)s->Co * s->Ci * s->k * s->k;
    float *out = dc_cpu_f32(out_);                                         // [B, Co, Ho, Wo]
    const float *x = dc_cpu_f32(x_);                                       // [B, Ci, H, W]
    const float *w = dc_cpu_weight(be, w_, nw, DC_CPU_WIDE_W);             // [Co, Ci, k, k]
    const float *bias = b_.p ? dc_cpu_weight(be, b_, s->Co, DC_CPU_WIDE_B) : NULL;  // [Co]
    if (!w || (b_.p && !bias)) return;  // no scratch to widen them: recorded for status
    if (s->nhwc) {
        conv2d_nhwc_fwd(be, out, x, w, bias, s);
        return;
    }
    const int Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s), K = s->Ci * s->k * s->k;
    const int HWo = Ho * Wo, rows = band_rows(s);
    const bool direct = is_direct(s);
    float *col = direct ? NULL : workspace(be, s);              // [K, rows*Wo]
    for (int b = 0; b < s->B; b++) {
        const float *xb = x + (int64_t)b * s->Ci * s->H * s->W;
        float *ob = out + (int64_t)b * s->Co * HWo;
        for (int ho0 = 0; ho0 < Ho; ho0 += rows) {
            const int nr = Ho - ho0 < rows ? Ho - ho0 : rows, P = nr * Wo;
            if (!direct) im2col(col, xb, s, Wo, ho0, nr);
            // out[Co, band] = w[Co, K] @ cols[K, band] (+ bias)
            gemm_tiles(false, false, s->Co, P, K, w, K, direct ? xb + (int64_t)ho0 * Wo : col,
                       direct ? HWo : P, 0.0f, ob + (int64_t)ho0 * Wo, HWo, bias, false);
        }
    }
}

// The residual added after the convolution: the CPU gains nothing from
// fusing it, and the sum rounds as conv2d_fwd and axpy do.
void dc_cpu_conv2d_fwd_res(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, dc_buf r,
                           const dc_conv2d_shape *s) {
    dc_cpu_conv2d_fwd(be, out, x, w, b, s);
    dc_cpu_axpy(be, out, r, 1.0f, (int64_t)s->B * s->Co * dc_conv2d_ho(s) * dc_conv2d_wo(s));
}

void dc_cpu_conv2d_bwd(dc_backend *be, dc_buf dx_, dc_buf dw_, dc_buf db_, dc_buf dout_,
                       dc_buf x_, dc_buf w_, const dc_conv2d_shape *s, int flags) {
    const bool accumulate = flags & DC_BWD_DX_ADD;
    dc_cpu_grad_clear(dw_, (int64_t)s->Co * s->Ci * s->k * s->k, db_, s->Co, flags);
    // Shapes of NCHW maps; channels-last ones (s->nhwc) as in conv2d_nhwc_bwd.
    float *dx = dx_.p ? dc_cpu_f32(dx_) : NULL;                 // [B, Ci, H, W]
    float *dw = dw_.p ? dc_cpu_f32(dw_) : NULL;                 // [Co, Ci, k, k]
    float *db = db_.p ? dc_cpu_f32(db_) : NULL;                 // [Co]
    const float *dout = dc_cpu_f32(dout_);                      // [B, Co, Ho, Wo]
    const float *x = dc_cpu_f32(x_);
    // The kernel is read for dx alone.
    const float *w = dx ? dc_cpu_weight(be, w_, (int64_t)s->Co * s->Ci * s->k * s->k, DC_CPU_WIDE_W) : NULL;
    if (dx && !w) return;  // recorded for status
    if (s->nhwc) {
        conv2d_nhwc_bwd(be, dx, dw, db, dout, x, w, s, accumulate);
        return;
    }
    const int Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s), K = s->Ci * s->k * s->k;
    const int HWo = Ho * Wo, rows = band_rows(s), Co = s->Co;
    const int64_t HWi = (int64_t)s->H * s->W;
    const bool direct = is_direct(s);
    float *col = direct || (!dx && !dw) ? NULL : workspace(be, s);  // [K, rows*Wo]
    for (int b = 0; b < s->B && (dx || dw); b++) {
        const float *xb = x + (int64_t)b * s->Ci * HWi, *dob = dout + (int64_t)b * Co * HWo;
        float *dxb = dx ? dx + (int64_t)b * s->Ci * HWi : NULL;
        // col2im adds into dx: start from zero unless accumulating.
        if (dxb && !direct && !accumulate) memset(dxb, 0, (size_t)(s->Ci * HWi) * sizeof(float));
        for (int ho0 = 0; ho0 < Ho; ho0 += rows) {
            const int nr = Ho - ho0 < rows ? Ho - ho0 : rows, P = nr * Wo;
            const float *dband = dob + (int64_t)ho0 * Wo;       // [Co, P], row stride HWo
            if (dw) {  // dw[Co, K] += dout[Co, band] @ cols[K, band]^T
                if (!direct) im2col(col, xb, s, Wo, ho0, nr);
                gemm_tiles(false, true, Co, K, P, dband, HWo,
                           direct ? xb + (int64_t)ho0 * Wo : col, direct ? HWo : P, 1.0f, dw, K,
                           NULL, false);
            }
            if (!dxb) continue;
            if (direct) {  // dx[Ci, band] (+)= w^T[Ci, Co] @ dout[Co, band]
                gemm_tiles(true, false, K, P, Co, w, K, dband, HWo, accumulate ? 1.0f : 0.0f,
                           dxb + (int64_t)ho0 * Wo, HWo, NULL, false);
            } else {  // dcols[K, band] = w^T @ dout[Co, band], folded onto dx
                gemm_tiles(true, false, K, P, Co, w, K, dband, HWo, 0.0f, col, P, NULL, false);
                col2im(dxb, col, s, Wo, ho0, nr);
            }
        }
    }
    if (db) {  // db[Co] += sum over images and pixels, per channel in a fixed order
#pragma omp parallel for schedule(static) if ((int64_t)s->B * Co * HWo > DC_CPU_PAR_MIN)
        for (int co = 0; co < Co; co++) {
            double acc = 0.0;
            for (int b = 0; b < s->B; b++) {
                const float *d = dout + ((int64_t)b * Co + co) * HWo;
#pragma omp simd reduction(+ : acc)
                for (int i = 0; i < HWo; i++) acc += d[i];
            }
            db[co] += (float)acc;
        }
    }
}
