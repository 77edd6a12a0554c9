// Optimiser-side ops over the flat parameter buffers: AdamW with EMA, gradient norm.
#include <math.h>
#include <stdint.h>

#include "backend/cpu/cpu_ops.h"

void dc_cpu_adamw(dc_backend *be, dc_buf p_, dc_buf grad_, dc_buf m_, dc_buf v_, dc_buf ema_,
                  dc_buf pc_, dc_buf scale, int64_t n, const dc_adamw_step *h) {
    float *p = dc_cpu_f32(p_), *m = dc_cpu_f32(m_), *v = dc_cpu_f32(v_);  // [n] each
    const float *g = dc_cpu_f32(grad_);                                   // [n]
    float *ema = ema_.p ? dc_cpu_f32(ema_) : NULL;
    dc_adamw_step hs = *h;  // a local copy lets the loop keep it in registers
    if (scale.p) hs.grad_scale *= *dc_cpu_f32(scale);
    const float keep = hs.ema_decay, take = 1.0f - hs.ema_decay;
    if (ema) {
#pragma omp parallel for simd schedule(static) if (n > DC_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            dc_adamw_update(&p[i], &m[i], &v[i], g[i], &hs);
            ema[i] = keep * ema[i] + take * p[i];
        }
    } else {
#pragma omp parallel for simd schedule(static) if (n > DC_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) dc_adamw_update(&p[i], &m[i], &v[i], g[i], &hs);
    }
    if (pc_.p) dc_cpu_cast(be, pc_, p_, n);
}

// Fixed blocks, each summed in order, then the block sums in order: the
// result is the same for any thread count (gradient clipping depends on it,
// and exact resume depends on clipping).
static double sumsq(const float *x, int64_t n) {
    enum { NB = 256 };
    double part[NB];
    const int64_t bs = (n + NB - 1) / NB;
#pragma omp parallel for schedule(static) if (n > DC_CPU_PAR_MIN)
    for (int k = 0; k < NB; k++) {
        const int64_t i0 = k * bs, i1 = i0 + bs < n ? i0 + bs : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    double s = 0.0;
    for (int k = 0; k < NB; k++) s += part[k];
    return s;
}

void dc_cpu_grad_norm(dc_backend *be, dc_buf out, dc_buf g, int64_t n, float max_norm) {
    (void)be;
    float *o = dc_cpu_f32(out);
    double norm = sqrt(sumsq(dc_cpu_f32(g), n));
    o[0] = (float)norm;
    o[1] = dc_clip_factor(norm, max_norm);
}
