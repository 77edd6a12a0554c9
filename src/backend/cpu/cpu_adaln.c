// adaLN-Zero: LayerNorm (no affine, eps 1e-6) modulated per sample, and the
// gated residual add, with their backward passes.
//
// mod[B, nchunk*D] holds the per-sample chunks (shift, scale, gate, ...);
// chunk k of sample b starts at mod + (b*nchunk + k)*D. Row statistics are
// two passes in double, so the variance stays accurate when the mean of a row
// dwarfs its spread (the residual stream of a trained DiT does that).
// Sums over tokens (the dmod chunks) are split over (sample, column block),
// never over tokens, so each is summed in one fixed order.
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"

enum { CB = 64 };  // columns per block for the per-sample token sums

static inline const float *chunk(const float *mod, int b, int nchunk, int k, int D) {
    return mod + ((int64_t)b * nchunk + k) * D;
}

void dc_cpu_ln_mod_fwd(dc_backend *be, dc_buf out_, dc_buf mean_, dc_buf rstd_, dc_buf x_,
                       dc_buf mod_, int B, int T, int D, int nchunk, int ch_shift, int ch_scale) {
    (void)be;
    float *out = dc_cpu_f32(out_);                              // [B, T, D]
    float *mean = dc_cpu_f32(mean_), *rstd = dc_cpu_f32(rstd_);  // [B*T]
    const float *x = dc_cpu_f32(x_), *mod = dc_cpu_f32(mod_);   // [B, T, D], [B, nchunk*D]
#pragma omp parallel for schedule(static) if ((int64_t)B * T * D > DC_CPU_PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const int b = bt / T;
        const float *xr = x + (int64_t)bt * D;
        const float *shift = chunk(mod, b, nchunk, ch_shift, D);
        const float *scale = chunk(mod, b, nchunk, ch_scale, D);
        double mu, var;
        dc_cpu_moments(xr, D, &mu, &var);
        const float m = (float)mu, r = dc_ln_rstd(var);
        float *o = out + (int64_t)bt * D;
#pragma omp simd
        for (int d = 0; d < D; d++) o[d] = dc_modulate((xr[d] - m) * r, shift[d], scale[d]);
        mean[bt] = m;
        rstd[bt] = r;
    }
}

void dc_cpu_ln_mod_bwd(dc_backend *be, dc_buf dx_, dc_buf dmod_, dc_buf dout_, dc_buf x_,
                       dc_buf mean_, dc_buf rstd_, dc_buf mod_, int B, int T, int D, int nchunk,
                       int ch_shift, int ch_scale) {
    (void)be;
    float *dx = dc_cpu_f32(dx_), *dmod = dc_cpu_f32(dmod_);           // [B,T,D], [B,nchunk*D]
    const float *dout = dc_cpu_f32(dout_), *x = dc_cpu_f32(x_);       // [B, T, D]
    const float *mean = dc_cpu_f32(mean_), *rstd = dc_cpu_f32(rstd_);  // [B*T]
    const float *mod = dc_cpu_f32(mod_);                              // [B, nchunk*D]
    const int ncb = (D + CB - 1) / CB;
#pragma omp parallel if ((int64_t)B * T * D > DC_CPU_PAR_MIN)
    {
        // dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dout (1 + scale).
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            const float *scale = chunk(mod, bt / T, nchunk, ch_scale, D);
            const float *xr = x + (int64_t)bt * D, *dor = dout + (int64_t)bt * D;
            const float m = mean[bt], r = rstd[bt];
            double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
            for (int d = 0; d < D; d++) {
                float g = dor[d] * (1.0f + scale[d]);
                sg += g;
                sgx += g * ((xr[d] - m) * r);
            }
            const float mg = (float)(sg / D), mgx = (float)(sgx / D);
            float *dxr = dx + (int64_t)bt * D;
#pragma omp simd
            for (int d = 0; d < D; d++)
                dxr[d] += dc_ln_dx(dor[d] * (1.0f + scale[d]), (xr[d] - m) * r, r, mg, mgx);
        }
        // dshift = sum_t dout, dscale = sum_t dout * xhat.
#pragma omp for schedule(static)
        for (int bc = 0; bc < B * ncb; bc++) {
            const int b = bc / ncb, d0 = bc % ncb * CB, nd = D - d0 < CB ? D - d0 : CB;
            float ash[CB] = {0}, asc[CB] = {0};
            for (int t = 0; t < T; t++) {
                const int64_t row = (int64_t)b * T + t;
                const float *xr = x + row * D + d0, *dor = dout + row * D + d0;
                const float m = mean[row], r = rstd[row];
#pragma omp simd
                for (int j = 0; j < nd; j++) {
                    ash[j] += dor[j];
                    asc[j] += dor[j] * ((xr[j] - m) * r);
                }
            }
            float *dsh = dmod + ((int64_t)b * nchunk + ch_shift) * D + d0;
            float *dsc = dmod + ((int64_t)b * nchunk + ch_scale) * D + d0;
            for (int j = 0; j < nd; j++) {
                dsh[j] = ash[j];
                dsc[j] = asc[j];
            }
        }
    }
}

void dc_cpu_gate_res_fwd(dc_backend *be, dc_buf out_, dc_buf x_, dc_buf y_, dc_buf mod_, int B, int T,
                         int D, int nchunk, int ch_gate) {
    (void)be;
    float *out = dc_cpu_f32(out_);                             // [B, T, D], may be x
    const float *x = dc_cpu_f32(x_);                           // [B, T, D]
    const float *y = dc_cpu_f32(y_), *mod = dc_cpu_f32(mod_);  // [B, T, D], [B, nchunk*D]
#pragma omp parallel for schedule(static) if ((int64_t)B * T * D > DC_CPU_PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const float *g = chunk(mod, bt / T, nchunk, ch_gate, D), *yr = y + (int64_t)bt * D;
        const float *xr = x + (int64_t)bt * D;
        float *o = out + (int64_t)bt * D;
#pragma omp simd
        for (int d = 0; d < D; d++) o[d] = xr[d] + g[d] * yr[d];
    }
}

void dc_cpu_gate_res_bwd(dc_backend *be, dc_buf dy_, dc_buf dmod_, dc_buf dx_, dc_buf y_,
                         dc_buf mod_, int B, int T, int D, int nchunk, int ch_gate) {
    (void)be;
    float *dy = dc_cpu_f32(dy_), *dmod = dc_cpu_f32(dmod_);    // [B, T, D], [B, nchunk*D]
    const float *dx = dc_cpu_f32(dx_), *y = dc_cpu_f32(y_);    // [B, T, D]
    const float *mod = dc_cpu_f32(mod_);                       // [B, nchunk*D]
    const int ncb = (D + CB - 1) / CB;
#pragma omp parallel if ((int64_t)B * T * D > DC_CPU_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            const float *g = chunk(mod, bt / T, nchunk, ch_gate, D), *dxr = dx + (int64_t)bt * D;
            float *dyr = dy + (int64_t)bt * D;
#pragma omp simd
            for (int d = 0; d < D; d++) dyr[d] = g[d] * dxr[d];
        }
#pragma omp for schedule(static)
        for (int bc = 0; bc < B * ncb; bc++) {
            const int b = bc / ncb, d0 = bc % ncb * CB, nd = D - d0 < CB ? D - d0 : CB;
            float acc[CB] = {0};
            for (int t = 0; t < T; t++) {
                const int64_t off = ((int64_t)b * T + t) * D + d0;
#pragma omp simd
                for (int j = 0; j < nd; j++) acc[j] += dx[off + j] * y[off + j];
            }
            float *dg = dmod + ((int64_t)b * nchunk + ch_gate) * D + d0;
            for (int j = 0; j < nd; j++) dg[j] = acc[j];
        }
    }
}
