// CPU diffusion ops: randn, q_sample, the DiT training loss, classifier-free
// guidance and one reverse step. The formulas live in backend/diffusion_math.h;
// these are the loops. OpenMP with static schedules only, and every sum runs
// in a fixed order inside one thread, so results do not depend on the thread
// count. Small loops (sampling tiny images) stay on one thread (DC_CPU_PAR_MIN).
#include "backend/cpu/cpu_ops.h"

#include <stdint.h>
#include "backend/diffusion_math.h"
#include "core/rng.h"

static inline float *f32(dc_buf b) {
    assert(b.p == NULL || b.dt == DC_F32);  // the CPU backend computes in fp32
    return (float *)b.p;
}

// out[B, n]: element j of row b is dc_randn_at(seed, keys[b], step, stream, j).
// One Philox block gives four normals, so the loop walks blocks of 4 and
// repeats dc_randn_at's arithmetic exactly (bit-identical results).
void dc_cpu_randn(dc_backend *be, dc_buf out, const uint32_t *keys, int B, int64_t n,
                  uint64_t seed, uint32_t step, uint32_t stream) {
    (void)be;
    float *o = f32(out);
    int64_t nblk = (n + 3) / 4, total = (int64_t)B * nblk;
#pragma omp parallel for schedule(static) if (4 * total >= DC_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        int b = (int)(i / nblk);
        int64_t blk = i % nblk;
        dc_u32x4 r = dc_philox((uint32_t)blk, keys[b], step, stream, seed);
        float *row = o + (int64_t)b * n;
        for (int pair = 0; pair < 2; pair++) {
            int64_t j = blk * 4 + pair * 2;
            if (j >= n) break;
            float u1 = dc_u32_to_unit(r.v[2 * pair]), u2 = dc_u32_to_unit(r.v[2 * pair + 1]);
            float rad = sqrtf(-2.0f * logf(u1)), th = 6.283185307179586f * u2;
            row[j] = rad * cosf(th);
            if (j + 1 < n) row[j + 1] = rad * sinf(th);
        }
    }
}

void dc_cpu_q_sample(dc_backend *be, dc_buf xt, dc_buf x0, dc_buf eps, const float *a,
                     const float *s, int B, int64_t n) {
    (void)be;
    float *o = f32(xt);
    const float *x = f32(x0), *e = f32(eps);
    int64_t total = (int64_t)B * n;
#pragma omp parallel for schedule(static) if (total >= DC_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        int b = (int)(i / n);
        o[i] = dc_q_sample_elem(a[b], x[i], s[b], e[i]);
    }
}

// losses[b] = (mse_b, vb_b), mse_b = mean (eps - eps_hat)^2 and vb_b = mean
// vb_elem / ln 2 over C*HW; dout = grad_scale * d(mse_b + vb_b)/d out:
// channels [0, C) carry the mse gradient w.r.t. eps_hat, channels [C, 2C) the
// vb gradient w.r.t. v. An epsilon-only output (OC = C) has no v: vb_b = 0.
// One sample per iteration, summed in double.
void dc_cpu_diffusion_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0,
                           dc_buf xt, dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                           int64_t HW, float grad_scale) {
    (void)be;
    assert(OC == C || OC == 2 * C);
    bool sigma = OC == 2 * C;
    float *g = f32(dout), *l = f32(losses);
    const float *o = f32(out), *x = f32(x0), *xtp = f32(xt), *e = f32(eps);
    int64_t N = (int64_t)C * HW;
    double inv_n = 1.0 / (double)N, inv_n_ln2 = inv_n / DC_LN2;
#pragma omp parallel for schedule(static) if ((int64_t)B * N >= DC_CPU_PAR_MIN)
    for (int b = 0; b < B; b++) {
        const dc_loss_coef *c = &coef[b];
        const float *eh = o + (int64_t)b * OC * HW, *v = eh + N;
        const float *x0b = x + (int64_t)b * N, *xtb = xtp + (int64_t)b * N, *eb = e + (int64_t)b * N;
        float *ge = g ? g + (int64_t)b * OC * HW : NULL, *gv = ge && sigma ? ge + N : NULL;
        double mse = 0.0, vb = 0.0;
        for (int64_t i = 0; i < N; i++) {
            double dm, dv = 0.0;
            mse += dc_loss_mse_elem(eb[i], eh[i], &dm);
            if (sigma) vb += dc_loss_vb_elem(c, eh[i], v[i], x0b[i], xtb[i], &dv);
            if (ge) ge[i] = (float)(grad_scale * dm * inv_n);
            if (gv) gv[i] = (float)(grad_scale * dv * inv_n_ln2);
        }
        if (l) {
            l[2 * b] = (float)(mse * inv_n);
            l[2 * b + 1] = (float)(vb * inv_n_ln2);
        }
    }
}

// model_out[2B, OC, HW] = [conditional; unconditional] -> dst[B, OC, HW]
void dc_cpu_cfg_combine(dc_backend *be, dc_buf dst, dc_buf model_out, int B, int OC, int64_t HW,
                        int guided, float scale) {
    (void)be;
    float *d = f32(dst);
    const float *cond = f32(model_out), *unc = cond + (int64_t)B * OC * HW;
    int64_t total = (int64_t)B * OC * HW;
#pragma omp parallel for schedule(static) if (total >= DC_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        int ch = (int)((i / HW) % OC);
        d[i] = ch < guided ? dc_cfg_elem(cond[i], unc[i], scale) : cond[i];
    }
}

// x[B, C, HW] <- one reverse step; eps = out[:, :C], v = out[:, C:2C] when
// learn_sigma (OC = 2C). z is read only when coef->add_noise.
void dc_cpu_sampler_step(dc_backend *be, dc_buf x, dc_buf out, dc_buf z, const dc_step_coef *coef,
                         int B, int C, int OC, int64_t HW) {
    (void)be;
    float *xp = f32(x);
    const float *o = f32(out), *zp = f32(z);
    assert(OC == C || OC == 2 * C);
    assert(!coef->add_noise || zp);
    assert(!(coef->learn_sigma && coef->kind == DC_STEP_DDPM) || OC == 2 * C);
    int64_t N = (int64_t)C * HW, total = (int64_t)B * N;
    const dc_step_coef cf = *coef;
#pragma omp parallel for schedule(static) if (total >= DC_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        int64_t b = i / N, r = i % N;
        const float *ob = o + b * OC * HW;
        float v = OC == 2 * C ? ob[N + r] : 0.0f;
        float zi = cf.add_noise ? zp[i] : 0.0f;
        xp[i] = dc_step_elem(&cf, xp[i], ob[r], v, zi);
    }
}
