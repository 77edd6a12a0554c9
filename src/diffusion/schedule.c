// Discrete schedules' tables, and DiT's: GaussianDiffusion.__init__
// mirrored operation by operation (numpy evaluates left to right, elementwise
// in float64), so the tables match the official ones to the last bit wherever
// libm and numpy agree on sqrt/log; respacing.
#include "diffusion/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

void dc_schedule_free(dc_schedule *s) {
    if (!s) return;
    free(s->tables_);
    free(s->timestep);
    memset(s, 0, sizeof *s);
}

int dc_schedule_alloc(dc_schedule *s, int n, int T, bool gaussian) {
    memset(s, 0, sizeof *s);
    if (n < 1) return dc_fail("diffusion schedule: %d steps (need at least 1)", n);
    double **tabs[] = {
        &s->alphas_cumprod, &s->sigmas, &s->log_sigmas,  // every discrete schedule
        &s->betas, &s->log_betas, &s->alphas_cumprod_prev, &s->sqrt_alphas_cumprod,
        &s->sqrt_one_minus_alphas_cumprod, &s->sqrt_recip_alphas_cumprod,
        &s->sqrt_recipm1_alphas_cumprod, &s->posterior_variance, &s->posterior_log_variance_clipped,
        &s->posterior_mean_coef1, &s->posterior_mean_coef2, &s->fixed_large_log_variance};
    const int ntab = gaussian ? (int)(sizeof tabs / sizeof tabs[0]) : 3;
    s->tables_ = calloc((size_t)ntab * n, sizeof(double));
    s->timestep = malloc(sizeof(int) * (size_t)n);
    if (!s->tables_ || !s->timestep) {
        dc_schedule_free(s);
        return dc_fail("diffusion schedule: out of memory for %d steps", n);
    }
    for (int k = 0; k < ntab; k++) *tabs[k] = s->tables_ + (size_t)k * n;
    for (int i = 0; i < n; i++) s->timestep[i] = i;
    s->family = DC_SCHEDULE_DISCRETE;
    s->n = n;
    s->T = T;
    return 0;
}

void dc_schedule_fill_sigmas(dc_schedule *s) {
    for (int i = 0; i < s->n; i++) {
        double acp = s->alphas_cumprod[i];
        s->sigmas[i] = acp > 0 ? sqrt((1.0 - acp) / acp) : INFINITY;
        s->log_sigmas[i] = log(s->sigmas[i]);
    }
}

int dc_schedule_init_betas(dc_schedule *s, const double *betas, const int *timestep, int n,
                           int T) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < n; i++)
        if (!(betas[i] > 0.0 && betas[i] <= 1.0))
            return dc_fail("diffusion schedule: beta[%d] = %g is outside (0, 1]", i, betas[i]);
    DC_TRY(dc_schedule_alloc(s, n, T, true));

    for (int i = 0; i < n; i++) {
        if (timestep) s->timestep[i] = timestep[i];
        s->betas[i] = betas[i];
        s->log_betas[i] = log(betas[i]);
    }
    // alphas = 1 - betas; alphas_cumprod = np.cumprod(alphas) (sequential products)
    double acc = 1.0;
    for (int i = 0; i < n; i++) {
        double alpha = 1.0 - s->betas[i];
        acc = i == 0 ? alpha : acc * alpha;
        s->alphas_cumprod[i] = acc;
        s->alphas_cumprod_prev[i] = i == 0 ? 1.0 : s->alphas_cumprod[i - 1];
    }
    for (int i = 0; i < n; i++) {
        double b = s->betas[i], ab = s->alphas_cumprod[i], abp = s->alphas_cumprod_prev[i];
        s->sqrt_alphas_cumprod[i] = sqrt(ab);
        s->sqrt_one_minus_alphas_cumprod[i] = sqrt(1.0 - ab);
        s->sqrt_recip_alphas_cumprod[i] = sqrt(1.0 / ab);
        s->sqrt_recipm1_alphas_cumprod[i] = sqrt(1.0 / ab - 1.0);
        s->posterior_variance[i] = b * (1.0 - abp) / (1.0 - ab);
        s->posterior_mean_coef1[i] = b * sqrt(abp) / (1.0 - ab);
        s->posterior_mean_coef2[i] = (1.0 - abp) * sqrt(1.0 - b) / (1.0 - ab);
    }
    // "log calculation clipped because the posterior variance is 0 at the
    // beginning of the diffusion chain": log([pv[1], pv[1:]]). Upstream leaves
    // it empty for a 1-step process; there log(beta[0]) stands in (its only
    // step adds no noise, so sampling never reads it).
    for (int i = 0; i < n; i++) {
        if (n == 1) {
            s->posterior_log_variance_clipped[i] = s->log_betas[0];
            s->fixed_large_log_variance[i] = s->log_betas[0];
            continue;
        }
        s->posterior_log_variance_clipped[i] = log(s->posterior_variance[i == 0 ? 1 : i]);
        s->fixed_large_log_variance[i] = log(i == 0 ? s->posterior_variance[1] : s->betas[i]);
    }
    dc_schedule_fill_sigmas(s);
    return 0;
}

int dc_schedule_init_linear(dc_schedule *s, int T) {
    memset(s, 0, sizeof *s);
    if (T < 2) return dc_fail("diffusion schedule: linear betas need at least 2 steps, got %d", T);
    double *betas = malloc(sizeof(double) * (size_t)T);
    if (!betas) return dc_fail("diffusion schedule: out of memory for %d steps", T);
    // get_named_beta_schedule: scale = 1000 / T; np.linspace(start, stop, T)
    // computes arange(T) * step + start with step = (stop - start) / (T - 1)
    // and then sets the last value to stop exactly.
    double scale = 1000.0 / T, start = scale * 0.0001, stop = scale * 0.02;
    double step = (stop - start) / (double)(T - 1);
    for (int i = 0; i < T; i++) {
        double y = (double)i * step;
        betas[i] = y + start;
    }
    betas[T - 1] = stop;
    int rc = dc_schedule_init_betas(s, betas, NULL, T, T);
    free(betas);
    return rc;
}

// Python's round(): nearest integer, ties to even. rint() does the same in the
// default rounding mode, but the tie rule is spelled out so it does not
// depend on the floating-point environment.
static long round_half_even(double x) {
    double f = floor(x), d = x - f;
    long i = (long)f;
    if (d > 0.5) return i + 1;
    if (d < 0.5) return i;
    return (i % 2 == 0) ? i : i + 1;
}

int dc_space_timesteps(int T, int N, int *out) {
    if (N < 1 || N > T)
        return dc_fail("respacing: cannot take %d sampling steps from %d diffusion steps", N, T);
    double frac_stride = N <= 1 ? 1.0 : (double)(T - 1) / (double)(N - 1);
    double cur = 0.0;
    for (int i = 0; i < N; i++) {
        out[i] = (int)round_half_even(cur);
        cur += frac_stride;
    }
    // A stride >= 1 keeps them strictly ascending (no duplicates for the set()).
    for (int i = 1; i < N; i++)
        if (out[i] <= out[i - 1]) return dc_fail("respacing: steps not ascending at %d", i);
    return 0;
}

int dc_schedule_respace(dc_schedule *out, const dc_schedule *base, int steps) {
    memset(out, 0, sizeof *out);
    int *keep = malloc(sizeof(int) * (size_t)(steps > 0 ? steps : 1));
    double *betas = malloc(sizeof(double) * (size_t)(steps > 0 ? steps : 1));
    int *orig = malloc(sizeof(int) * (size_t)(steps > 0 ? steps : 1));
    int rc = -1;
    if (!keep || !betas || !orig) {
        dc_fail("respacing: out of memory");
        goto done;
    }
    if (dc_space_timesteps(base->n, steps, keep) != 0) goto done;
    // SpacedDiffusion.__init__: new_betas.append(1 - alpha_cumprod / last_alpha_cumprod)
    double last = 1.0;
    for (int k = 0; k < steps; k++) {
        double ab = base->alphas_cumprod[keep[k]];
        betas[k] = 1.0 - ab / last;
        last = ab;
        orig[k] = base->timestep[keep[k]];
    }
    rc = dc_schedule_init_betas(out, betas, orig, steps, base->T);
done:
    free(keep);
    free(betas);
    free(orig);
    return rc;
}

int dc_schedule_init_gaussian(dc_schedule *s, int T, int steps) {
    dc_schedule base;
    DC_TRY(dc_schedule_init_linear(&base, T));
    int rc = dc_schedule_respace(s, &base, steps);
    dc_schedule_free(&base);
    return rc;
}

int dc_schedule_loss_coef(const dc_schedule *s, int t, dc_loss_coef *c) {
    if (t < 0 || t >= s->n)
        return dc_fail("diffusion loss: timestep %d outside [0, %d)", t, s->n);
    // _extract_into_tensor: float64 table -> .float()
    c->sqrt_abar = (float)s->sqrt_alphas_cumprod[t];
    c->sqrt_1m_abar = (float)s->sqrt_one_minus_alphas_cumprod[t];
    c->sqrt_recip_abar = (float)s->sqrt_recip_alphas_cumprod[t];
    c->sqrt_recipm1_abar = (float)s->sqrt_recipm1_alphas_cumprod[t];
    c->post_c1 = (float)s->posterior_mean_coef1[t];
    c->post_c2 = (float)s->posterior_mean_coef2[t];
    c->post_logvar_clipped = (float)s->posterior_log_variance_clipped[t];
    c->log_beta = (float)s->log_betas[t];
    c->t_is_zero = t == 0;
    return 0;
}

int dc_schedule_step_coef(const dc_schedule *s, int k, dc_step_kind kind, double eta,
                          bool learn_sigma, dc_step_coef *c) {
    if (k < 0 || k >= s->n) return dc_fail("sampler: step %d outside [0, %d)", k, s->n);
    if (kind != DC_STEP_DDPM && kind != DC_STEP_DDIM)
        return dc_fail("sampler: unknown step kind %d", (int)kind);
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->learn_sigma = learn_sigma;
    c->sqrt_recip_abar = (float)s->sqrt_recip_alphas_cumprod[k];
    c->sqrt_recipm1_abar = (float)s->sqrt_recipm1_alphas_cumprod[k];
    c->post_c1 = (float)s->posterior_mean_coef1[k];
    c->post_c2 = (float)s->posterior_mean_coef2[k];
    c->min_log = (float)s->posterior_log_variance_clipped[k];
    c->max_log = (float)s->log_betas[k];
    c->fixed_logvar = (float)s->fixed_large_log_variance[k];
    if (kind == DC_STEP_DDPM) {
        c->add_noise = k != 0;  // nonzero_mask = (t != 0)
        return 0;
    }
    if (!(eta >= 0.0)) return dc_fail("sampler: DDIM eta %g must be >= 0", eta);
    // ddim_sample: sigma = eta sqrt((1 - abar_prev) / (1 - abar)) sqrt(1 - abar / abar_prev)
    double ab = s->alphas_cumprod[k], abp = s->alphas_cumprod_prev[k];
    double sigma = eta * sqrt((1.0 - abp) / (1.0 - ab)) * sqrt(1.0 - ab / abp);
    double dir2 = 1.0 - abp - sigma * sigma;
    if (dir2 < 0.0)
        return dc_fail("sampler: DDIM eta %g too large at step %d (1 - abar_prev - sigma^2 < 0)",
                       eta, k);
    c->ddim_sqrt_abar_prev = (float)sqrt(abp);
    c->ddim_dir = (float)sqrt(dir2);
    c->ddim_sigma = (float)sigma;
    c->add_noise = k != 0 && sigma > 0.0;
    return 0;
}
