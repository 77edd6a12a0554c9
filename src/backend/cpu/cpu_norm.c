// GroupNorm (with an optional fused SiLU) and LayerNorm with affine weights,
// forward and backward: the norms of the SD UNet, VAE and text encoders; and
// GroupNorm's forward over channels-last maps.
//
// Statistics are two passes in double (mean, then the centred variance), so
// the variance stays accurate when a group's mean dwarfs its spread. Every
// sum is taken by one thread in one fixed order: groups and rows are split
// over threads, and the sums over the batch (dgamma, dbeta) run per channel
// or per column block, never split, so results do not depend on the thread
// count. The element formulas are the shared ones in op_math.h. The affine
// weights may be F16 or BF16 (weights kept as loaded): widened once per call.
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"

enum { CB = 64 };  // columns per block for the layer norm's sums over rows

// ---- group norm -------------------------------------------------------------------
// x[B, C, HW]; group g of sample b is the (C/G) * HW contiguous values from
// channel g * C/G on.

void dc_cpu_group_norm_fwd(dc_backend *be, dc_buf out_, dc_buf mean_, dc_buf rstd_, dc_buf x_,
                           dc_buf gamma_, dc_buf beta_, int B, int C, int64_t HW, int G, float eps,
                           bool silu) {
    float *out = dc_cpu_f32(out_);                                    // [B, C, HW]
    float *mean = dc_cpu_f32(mean_), *rstd = dc_cpu_f32(rstd_);       // [B, G]
    const float *x = dc_cpu_f32(x_);                                  // [B, C, HW]
    const float *gamma = dc_cpu_weight(be, gamma_, C, DC_CPU_WIDE_B);  // [C]
    const float *beta = dc_cpu_weight(be, beta_, C, DC_CPU_WIDE_B2);   // [C]
    if (!gamma || !beta) return;  // no scratch to widen them: recorded for status
    assert(C % G == 0);
    const int Cg = C / G;
    const int64_t n = Cg * HW;
#pragma omp parallel for schedule(static) if ((int64_t)B * C * HW > DC_CPU_PAR_MIN)
    for (int bg = 0; bg < B * G; bg++) {
        const float *xg = x + (int64_t)bg * n;
        double mu, var;
        dc_cpu_moments(xg, n, &mu, &var);
        const float m = (float)mu, r = dc_norm_rstd(var, eps);
        mean[bg] = m;
        rstd[bg] = r;
        for (int j = 0; j < Cg; j++) {
            const int c = bg % G * Cg + j;
            const float ga = gamma[c], be = beta[c];
            const float *xc = xg + j * HW;
            float *o = out + (int64_t)bg * n + j * HW;
            if (silu) {
#pragma omp simd
                for (int64_t i = 0; i < HW; i++)
                    o[i] = dc_silu(dc_norm_affine(dc_norm_xhat(xc[i], m, r), ga, be));
            } else {
#pragma omp simd
                for (int64_t i = 0; i < HW; i++)
                    o[i] = dc_norm_affine(dc_norm_xhat(xc[i], m, r), ga, be);
            }
        }
    }
}

// dL/dy for y = xhat gamma + beta: dout, times silu'(y) when SiLU was fused
// (y recomputed from the saved statistics rather than stored).
static inline float group_dy(float dout, float xhat, float ga, float be, bool silu) {
    return silu ? dout * dc_silu_grad(dc_norm_affine(xhat, ga, be)) : dout;
}

// A group norm backward's buffers as floats: dx, dgamma, dbeta NULL where
// skipped; gamma widened, and beta where SiLU reads it. False where a
// weight could not be widened (recorded for status).
typedef struct {
    float *dx, *dgamma, *dbeta;
    const float *dout, *x, *mean, *rstd, *gamma, *beta;
} gn_bwd_bufs;

static bool gn_bwd_bufs_of(dc_backend *be, gn_bwd_bufs *u, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                           dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int C, int G, bool silu) {
    assert(C % G == 0);
    (void)G;
    u->dx = dx.p ? dc_cpu_f32(dx) : NULL;
    u->dgamma = dgamma.p ? dc_cpu_f32(dgamma) : NULL;
    u->dbeta = dbeta.p ? dc_cpu_f32(dbeta) : NULL;
    u->dout = dc_cpu_f32(dout), u->x = dc_cpu_f32(x);
    u->mean = dc_cpu_f32(mean), u->rstd = dc_cpu_f32(rstd);
    u->gamma = dc_cpu_weight(be, gamma, C, DC_CPU_WIDE_B);
    u->beta = silu ? dc_cpu_weight(be, beta, C, DC_CPU_WIDE_B2) : NULL;
    return u->gamma && (!silu || u->beta);
}

void dc_cpu_group_norm_bwd(dc_backend *be, dc_buf dx_, dc_buf dgamma_, dc_buf dbeta_,
                           dc_buf dout_, dc_buf x_, dc_buf mean_, dc_buf rstd_, dc_buf gamma_,
                           dc_buf beta_, int B, int C, int64_t HW, int G, bool silu,
                           int flags) {
    const bool accumulate = flags & DC_BWD_DX_ADD;
    dc_cpu_grad_clear(dgamma_, C, dbeta_, C, flags);
    gn_bwd_bufs u;
    if (!gn_bwd_bufs_of(be, &u, dx_, dgamma_, dbeta_, dout_, x_, mean_, rstd_, gamma_, beta_, C, G, silu)) return;
    float *dx = u.dx, *dgamma = u.dgamma, *dbeta = u.dbeta;     // [B, C, HW], [C], [C]
    const float *dout = u.dout, *x = u.x;                       // [B, C, HW]
    const float *mean = u.mean, *rstd = u.rstd;                 // [B, G]
    const float *gamma = u.gamma, *beta = u.beta;               // [C]
    const int Cg = C / G;
    const int64_t n = Cg * HW;
#pragma omp parallel if ((int64_t)B * C * HW > DC_CPU_PAR_MIN)
    {
        // dx = rstd (g - mean(g) - xhat mean(g xhat)) over the group, g = dy gamma.
#pragma omp for schedule(static)
        for (int bg = 0; bg < (dx ? B * G : 0); bg++) {
            const float m = mean[bg], r = rstd[bg];
            double sg = 0.0, sgx = 0.0;
            for (int j = 0; j < Cg; j++) {
                const int c = bg % G * Cg + j;
                const float ga = gamma[c], be = silu ? beta[c] : 0.0f;
                const int64_t off = (int64_t)bg * n + j * HW;
                const float *xc = x + off, *dc = dout + off;
                double a = 0.0, e = 0.0;
#pragma omp simd reduction(+ : a, e)
                for (int64_t i = 0; i < HW; i++) {
                    const float xh = dc_norm_xhat(xc[i], m, r);
                    const float dy = group_dy(dc[i], xh, ga, be, silu);
                    a += dy;
                    e += dy * xh;
                }
                sg += ga * a;
                sgx += ga * e;
            }
            const float mg = (float)(sg / n), mgx = (float)(sgx / n);
            for (int j = 0; j < Cg; j++) {
                const int c = bg % G * Cg + j;
                const float ga = gamma[c], be = silu ? beta[c] : 0.0f;
                const int64_t off = (int64_t)bg * n + j * HW;
                const float *xc = x + off, *dc = dout + off;
                float *d = dx + off;
#pragma omp simd
                for (int64_t i = 0; i < HW; i++) {
                    const float xh = dc_norm_xhat(xc[i], m, r);
                    const float dy = group_dy(dc[i], xh, ga, be, silu);
                    const float v = dc_ln_dx(dy * ga, xh, r, mg, mgx);
                    d[i] = accumulate ? d[i] + v : v;
                }
            }
        }
        // dbeta[c] += sum dy, dgamma[c] += sum dy xhat, over the batch and pixels.
#pragma omp for schedule(static)
        for (int c = 0; c < (dgamma || dbeta ? C : 0); c++) {
            const int g = c / Cg;
            const float ga = gamma[c], be = silu ? beta[c] : 0.0f;
            double a = 0.0, e = 0.0;
            for (int b = 0; b < B; b++) {
                const int64_t off = ((int64_t)b * C + c) * HW;
                const float *xc = x + off, *dc = dout + off;
                const float m = mean[b * G + g], r = rstd[b * G + g];
#pragma omp simd reduction(+ : a, e)
                for (int64_t i = 0; i < HW; i++) {
                    const float xh = dc_norm_xhat(xc[i], m, r);
                    const float dy = group_dy(dc[i], xh, ga, be, silu);
                    a += dy;
                    e += dy * xh;
                }
            }
            if (dbeta) dbeta[c] += (float)a;
            if (dgamma) dgamma[c] += (float)e;
        }
    }
}

// ---- group norm over channels-last maps --------------------------------------------
// x[B, HW, C]: group g of sample b is channels [g C/G, (g+1) C/G) of each of
// its HW pixels, a run of only C/G (often 4 or 10) values per pixel. So that
// loops run over long contiguous stretches, statistics are summed per channel
// over pixels in order, several whole groups side by side (channels are
// vector lanes), then per group over its channels in order; the
// normalisation runs over blocks of pixels, a row of channels at a time.

// Channels summed side by side (whole groups, or slices of a wider group);
// pixels and channels of one step of the normalisation.
enum { GN_SC = 32, GN_PB = 64, GN_CH = 256 };

// Mean and rstd of groups [g0, g1) (g1 - g0 <= GN_SC) of one image x[HW, C]
// with Cg channels each: two passes in double, as dc_cpu_moments.
static void group_stats_nhwc(const float *x, int C, int64_t HW, int Cg, int g0, int g1,
                             float eps, float *mean, float *rstd) {
    const int c0 = g0 * Cg, c1 = g1 * Cg;
    const double n = (double)Cg * HW;
    double s[GN_SC] = {0}, ss[GN_SC] = {0};  // per group of [g0, g1)
    for (int a = c0; a < c1; a += GN_SC) {
        const int len = c1 - a < GN_SC ? c1 - a : GN_SC;
        double acc[GN_SC] = {0};  // per channel of the slice [a, a + len)
        for (int64_t p = 0; p < HW; p++) {
            const float *xp = x + p * C + a;
#pragma omp simd
            for (int j = 0; j < len; j++) acc[j] += xp[j];
        }
        for (int j = 0; j < len; j++) s[(a + j) / Cg - g0] += acc[j];
    }
    for (int a = c0; a < c1; a += GN_SC) {
        const int len = c1 - a < GN_SC ? c1 - a : GN_SC;
        double acc[GN_SC] = {0}, mu[GN_SC];
        for (int j = 0; j < len; j++) mu[j] = s[(a + j) / Cg - g0] / n;
        for (int64_t p = 0; p < HW; p++) {
            const float *xp = x + p * C + a;
#pragma omp simd
            for (int j = 0; j < len; j++) acc[j] += (xp[j] - mu[j]) * (xp[j] - mu[j]);
        }
        for (int j = 0; j < len; j++) ss[(a + j) / Cg - g0] += acc[j];
    }
    for (int g = g0; g < g1; g++) {
        mean[g] = (float)(s[g - g0] / n);
        rstd[g] = dc_norm_rstd(ss[g - g0] / n, eps);
    }
}

// out = act(xhat gamma + beta) from the statistics in mean and rstd, in row
// blocks (the group statistics spread over channels, so each row is one
// vector loop); inside a parallel region.
static void group_apply_nhwc(float *out, const float *mean, const float *rstd, const float *x, const float *gamma,
                             const float *beta, int B, int C, int64_t HW, int G, bool silu) {
    const int Cg = C / G;
    const int64_t nblk = (HW + GN_PB - 1) / GN_PB;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < B * nblk; u++) {
        const int64_t b = u / nblk, p0 = u % nblk * GN_PB;
        const int64_t p1 = p0 + GN_PB < HW ? p0 + GN_PB : HW;
        for (int a = 0; a < C; a += GN_CH) {
            const int len = C - a < GN_CH ? C - a : GN_CH;
            const float *ga = gamma + a, *bt = beta + a;
            float m[GN_CH], r[GN_CH];
            for (int j = 0; j < len; j++) {
                m[j] = mean[b * G + (a + j) / Cg];
                r[j] = rstd[b * G + (a + j) / Cg];
            }
            for (int64_t p = p0; p < p1; p++) {
                const float *xr = x + (b * HW + p) * C + a;
                float *o = out + (b * HW + p) * C + a;
                if (silu) {
#pragma omp simd
                    for (int j = 0; j < len; j++)
                        o[j] = dc_silu(dc_norm_affine(dc_norm_xhat(xr[j], m[j], r[j]), ga[j], bt[j]));
                } else {
#pragma omp simd
                    for (int j = 0; j < len; j++) o[j] = dc_norm_affine(dc_norm_xhat(xr[j], m[j], r[j]), ga[j], bt[j]);
                }
            }
        }
    }
}

void dc_cpu_group_norm_nhwc_fwd(dc_backend *be, dc_buf out_, dc_buf mean_, dc_buf rstd_,
                                dc_buf x_, dc_buf gamma_, dc_buf beta_, int B, int C, int64_t HW,
                                int G, float eps, bool silu) {
    float *out = dc_cpu_f32(out_);                                    // [B, HW, C]
    float *mean = dc_cpu_f32(mean_), *rstd = dc_cpu_f32(rstd_);       // [B, G]
    const float *x = dc_cpu_f32(x_);                                  // [B, HW, C]
    const float *gamma = dc_cpu_weight(be, gamma_, C, DC_CPU_WIDE_B);  // [C]
    const float *beta = dc_cpu_weight(be, beta_, C, DC_CPU_WIDE_B2);   // [C]
    if (!gamma || !beta) return;  // no scratch to widen them: recorded for status
    assert(C % G == 0);
    const int Cg = C / G, gpu = Cg < GN_SC ? GN_SC / Cg : 1;  // groups per statistics unit
    const int nu = (G + gpu - 1) / gpu;
#pragma omp parallel if ((int64_t)B * C * HW > DC_CPU_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int u = 0; u < B * nu; u++) {
            const int b = u / nu, g0 = u % nu * gpu, g1 = g0 + gpu < G ? g0 + gpu : G;
            group_stats_nhwc(x + (int64_t)b * HW * C, C, HW, Cg, g0, g1, eps, mean + b * G,
                             rstd + b * G);
        }
        group_apply_nhwc(out, mean, rstd, x, gamma, beta, B, C, HW, G, silu);
    }
}

void dc_cpu_group_norm_nhwc_apply(dc_backend *be, dc_buf out_, dc_buf mean_, dc_buf rstd_, dc_buf x_, dc_buf gamma_,
                                  dc_buf beta_, int B, int C, int64_t HW, int G, bool silu) {
    const float *gamma = dc_cpu_weight(be, gamma_, C, DC_CPU_WIDE_B);  // [C]
    const float *beta = dc_cpu_weight(be, beta_, C, DC_CPU_WIDE_B2);   // [C]
    if (!gamma || !beta) return;  // recorded for status
    assert(C % G == 0);
#pragma omp parallel if ((int64_t)B * C * HW > DC_CPU_PAR_MIN)
    group_apply_nhwc(dc_cpu_f32(out_), dc_cpu_f32(mean_), dc_cpu_f32(rstd_), dc_cpu_f32(x_), gamma, beta, B, C, HW,
                     G, silu);
}

// The backward over channels-last maps: the same formulas as
// dc_cpu_group_norm_bwd, with the group's values a run of C/G channels in
// each of HW pixels. Per image, a group's two sums (sum g, sum g xhat) are
// taken over its pixels in order; dgamma and dbeta per channel over the batch
// and pixels in order, so results do not depend on the thread count.
// One row of C channels of the channels-last backward: a, e += dy and
// dy xhat (sums), or dx = (+=) the row's gradient (mg, mgx: the group means
// of g and g xhat per channel). m, r, mg, mgx are per channel (the group's
// values repeated), so the loops run along the row without an index division.
static inline void gn_nhwc_row_sums(const float *restrict x, const float *restrict dout, const float *restrict m,
                                    const float *restrict r, const float *restrict ga, const float *restrict bt,
                                    double *restrict a, double *restrict e, int C, bool silu) {
#pragma omp simd
    for (int c = 0; c < C; c++) {
        const float xh = dc_norm_xhat(x[c], m[c], r[c]);
        const float dy = group_dy(dout[c], xh, ga[c], silu ? bt[c] : 0.0f, silu);
        a[c] += dy;
        e[c] += dy * xh;
    }
}
static inline void gn_nhwc_row_dx(float *restrict dx, const float *restrict x, const float *restrict dout,
                                  const float *restrict m, const float *restrict r, const float *restrict mg,
                                  const float *restrict mgx, const float *restrict ga, const float *restrict bt, int C,
                                  bool silu, bool accumulate) {
#pragma omp simd
    for (int c = 0; c < C; c++) {
        const float xh = dc_norm_xhat(x[c], m[c], r[c]);
        const float dy = group_dy(dout[c], xh, ga[c], silu ? bt[c] : 0.0f, silu);
        const float v = dc_ln_dx(dy * ga[c], xh, r[c], mg[c], mgx[c]);
        dx[c] = accumulate ? dx[c] + v : v;
    }
}

// Channels-last: one pass along each sample's rows of C takes the per
// (sample, channel) sums A = sum dy and E = sum dy xhat over the pixels (each
// sample by one thread, in pixel order, in double), from which the group
// means of g = dy gamma and the parameter gradients follow; a second pass
// writes dx. Both walk memory in order, a row of C channels at a time.
void dc_cpu_group_norm_nhwc_bwd(dc_backend *be, dc_buf dx_, dc_buf dgamma_, dc_buf dbeta_,
                                dc_buf dout_, dc_buf x_, dc_buf mean_, dc_buf rstd_, dc_buf gamma_,
                                dc_buf beta_, int B, int C, int64_t HW, int G, bool silu,
                                int flags) {
    const bool accumulate = flags & DC_BWD_DX_ADD;
    dc_cpu_grad_clear(dgamma_, C, dbeta_, C, flags);
    gn_bwd_bufs u;
    if (!gn_bwd_bufs_of(be, &u, dx_, dgamma_, dbeta_, dout_, x_, mean_, rstd_, gamma_, beta_, C, G, silu)) return;
    // dx, dout, x [B, HW, C]; mean, rstd [B, G]; dgamma, dbeta, gamma, beta [C]
    const int Cg = C / G;
    const double n = (double)Cg * HW;
    const size_t BC = (size_t)B * C;
    double *A = calloc(2 * BC, sizeof *A), *E = A + BC;
    float *st = malloc(sizeof(float) * 4 * BC);  // per (sample, channel): mean, rstd, mean g, mean g xhat
    if (!A || !st) {
        free(A), free(st);
        dc_cpu_fail(be, "group_norm_nhwc_bwd: out of memory for %d x %d sums", B, C);
        return;
    }
    float *mc = st, *rc = st + BC, *mg = st + 2 * BC, *mgx = st + 3 * BC;
    const float *bt = silu ? u.beta : u.gamma;  // read only with silu
#pragma omp parallel if ((int64_t)B * C * HW > DC_CPU_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            const size_t o = (size_t)b * C;
            for (int c = 0; c < C; c++) mc[o + c] = u.mean[b * G + c / Cg], rc[o + c] = u.rstd[b * G + c / Cg];
            for (int64_t p = 0; p < HW; p++) {
                const int64_t row = ((int64_t)b * HW + p) * C;
                gn_nhwc_row_sums(u.x + row, u.dout + row, mc + o, rc + o, u.gamma, bt, A + o, E + o, C, silu);
            }
            for (int g = 0; g < G; g++) {
                double sg = 0.0, sgx = 0.0;
                for (int c = g * Cg; c < (g + 1) * Cg; c++) sg += u.gamma[c] * A[o + c], sgx += u.gamma[c] * E[o + c];
                for (int c = g * Cg; c < (g + 1) * Cg; c++) mg[o + c] = (float)(sg / n), mgx[o + c] = (float)(sgx / n);
            }
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < (u.dx ? (int64_t)B * HW : 0); row++) {
            const size_t o = (size_t)(row / HW) * C;
            gn_nhwc_row_dx(u.dx + row * C, u.x + row * C, u.dout + row * C, mc + o, rc + o, mg + o, mgx + o, u.gamma,
                           bt, C, silu, accumulate);
        }
    }
    for (int c = 0; c < C; c++) {  // the samples' sums in order
        double sa = 0.0, se = 0.0;
        for (int b = 0; b < B; b++) sa += A[(size_t)b * C + c], se += E[(size_t)b * C + c];
        if (u.dbeta) u.dbeta[c] += (float)sa;
        if (u.dgamma) u.dgamma[c] += (float)se;
    }
    free(A), free(st);
}

// ---- layer norm -------------------------------------------------------------------

void dc_cpu_layer_norm_fwd(dc_backend *be, dc_buf out_, dc_buf mean_, dc_buf rstd_, dc_buf x_,
                           dc_buf gamma_, dc_buf beta_, int64_t M, int D, float eps) {
    float *out = dc_cpu_f32(out_);                                    // [M, D]
    float *mean = dc_cpu_f32(mean_), *rstd = dc_cpu_f32(rstd_);       // [M]
    const float *x = dc_cpu_f32(x_);                                  // [M, D]
    const float *gamma = dc_cpu_weight(be, gamma_, D, DC_CPU_WIDE_B);  // [D]
    const float *beta = dc_cpu_weight(be, beta_, D, DC_CPU_WIDE_B2);   // [D]
    if (!gamma || !beta) return;  // no scratch to widen them: recorded for status
#pragma omp parallel for schedule(static) if (M * D > DC_CPU_PAR_MIN)
    for (int64_t row = 0; row < M; row++) {
        const float *xr = x + row * D;
        double mu, var;
        dc_cpu_moments(xr, D, &mu, &var);
        const float m = (float)mu, r = dc_norm_rstd(var, eps);
        float *o = out + row * D;
#pragma omp simd
        for (int d = 0; d < D; d++)
            o[d] = dc_norm_affine(dc_norm_xhat(xr[d], m, r), gamma[d], beta[d]);
        mean[row] = m;
        rstd[row] = r;
    }
}

void dc_cpu_layer_norm_bwd(dc_backend *be, dc_buf dx_, dc_buf dgamma_, dc_buf dbeta_,
                           dc_buf dout_, dc_buf x_, dc_buf mean_, dc_buf rstd_, dc_buf gamma_,
                           int64_t M, int D, int flags) {
    const bool accumulate = flags & DC_BWD_DX_ADD;
    dc_cpu_grad_clear(dgamma_, D, dbeta_, D, flags);
    float *dx = dx_.p ? dc_cpu_f32(dx_) : NULL;                       // [M, D]
    float *dgamma = dgamma_.p ? dc_cpu_f32(dgamma_) : NULL;           // [D]
    float *dbeta = dbeta_.p ? dc_cpu_f32(dbeta_) : NULL;              // [D]
    const float *dout = dc_cpu_f32(dout_), *x = dc_cpu_f32(x_);       // [M, D]
    const float *mean = dc_cpu_f32(mean_), *rstd = dc_cpu_f32(rstd_);  // [M]
    const float *gamma = dc_cpu_weight(be, gamma_, D, DC_CPU_WIDE_B);  // [D]
    if (!gamma) return;  // recorded for status
    const int ncb = (D + CB - 1) / CB;
#pragma omp parallel if (M * D > DC_CPU_PAR_MIN)
    {
        // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout gamma.
#pragma omp for schedule(static)
        for (int64_t row = 0; row < (dx ? M : 0); row++) {
            const float *xr = x + row * D, *dor = dout + row * D;
            const float m = mean[row], r = rstd[row];
            double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
            for (int d = 0; d < D; d++) {
                const float g = dor[d] * gamma[d];
                sg += g;
                sgx += g * dc_norm_xhat(xr[d], m, r);
            }
            const float mg = (float)(sg / D), mgx = (float)(sgx / D);
            float *dxr = dx + row * D;
            if (accumulate) {
#pragma omp simd
                for (int d = 0; d < D; d++)
                    dxr[d] += dc_ln_dx(dor[d] * gamma[d], dc_norm_xhat(xr[d], m, r), r, mg, mgx);
            } else {
#pragma omp simd
                for (int d = 0; d < D; d++)
                    dxr[d] = dc_ln_dx(dor[d] * gamma[d], dc_norm_xhat(xr[d], m, r), r, mg, mgx);
            }
        }
        // dbeta = sum_rows dout, dgamma = sum_rows dout xhat, per column block.
#pragma omp for schedule(static)
        for (int cb = 0; cb < (dgamma || dbeta ? ncb : 0); cb++) {
            const int d0 = cb * CB, nd = D - d0 < CB ? D - d0 : CB;
            double a[CB] = {0}, e[CB] = {0};
            for (int64_t row = 0; row < M; row++) {
                const float *xr = x + row * D + d0, *dor = dout + row * D + d0;
                const float m = mean[row], r = rstd[row];
#pragma omp simd
                for (int j = 0; j < nd; j++) {
                    a[j] += dor[j];
                    e[j] += dor[j] * dc_norm_xhat(xr[j], m, r);
                }
            }
            for (int j = 0; j < nd; j++) {
                if (dbeta) dbeta[d0 + j] += (float)a[j];
                if (dgamma) dgamma[d0 + j] += (float)e[j];
            }
        }
    }
}
