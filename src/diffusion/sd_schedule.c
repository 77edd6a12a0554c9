#include "diffusion/sd_schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

void dc_sd_sched_cfg_default(dc_sd_sched_cfg *c) {
    memset(c, 0, sizeof *c);
    c->T = DC_SD_TRAIN_STEPS;
    c->beta_start = DC_SD_BETA_START, c->beta_end = DC_SD_BETA_END;
    c->beta_schedule = DC_BETAS_SCALED_LINEAR;
    c->prediction = -1;
    c->spacing = DC_SPACING_CLASS;
    c->steps_offset = 1;
    c->lower_order_final = true;
    c->lambda_min_clipped = -INFINITY;
    c->solver_order = 2;
    c->dpmsolver_pp = c->midpoint = true;
    c->schedule_given = true;
}

void dc_sd_sched_cfg_free(dc_sd_sched_cfg *c) {
    free(c->trained_betas);
    c->trained_betas = NULL;
}

const char *dc_sd_class_name(dc_sd_class k) {
    switch (k) {
    case DC_SCHED_EULER: return "EulerDiscreteScheduler";
    case DC_SCHED_EULER_ANCESTRAL: return "EulerAncestralDiscreteScheduler";
    case DC_SCHED_DDIM: return "DDIMScheduler";
    case DC_SCHED_DPM_MULTISTEP: return "DPMSolverMultistepScheduler";
    }
    return "unknown";
}

// The GLIDE cosine schedule's abar (betas_for_alpha_bar, "cosine").
static double abar_cos(double t) {
    double c = cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
}

int dc_schedule_init_cfg(dc_schedule *s, const dc_sd_sched_cfg *c, bool floor) {
    memset(s, 0, sizeof *s);
    const int T = c->T;
    if (T < 2) return dc_fail("schedule: %d training steps (need at least 2)", T);
    if (!c->trained_betas && c->beta_schedule != DC_BETAS_SQUAREDCOS &&
        !(c->beta_start > 0 && c->beta_end < 1 && c->beta_start <= c->beta_end))
        return dc_fail("schedule: betas %g..%g outside (0, 1)", c->beta_start, c->beta_end);
    DC_TRY(dc_schedule_alloc(s, T, T, false));
    double *acp = s->alphas_cumprod, a = sqrt(c->beta_start), b = sqrt(c->beta_end), prod = 1.0;
    for (int i = 0; i < T; i++) {
        // torch.linspace: start + i * step, the last element exactly `end`
        double f = (double)i / (double)(T - 1), beta;
        if (c->trained_betas) {
            beta = c->trained_betas[i];
        } else if (c->beta_schedule == DC_BETAS_LINEAR) {
            beta = i == T - 1 ? c->beta_end : c->beta_start + (c->beta_end - c->beta_start) * f;
        } else if (c->beta_schedule == DC_BETAS_SCALED_LINEAR) {
            double r = i == T - 1 ? b : a + (b - a) * f;
            beta = r * r;
        } else {
            beta = fmin(1 - abar_cos((double)(i + 1) / T) / abar_cos((double)i / T), 0.999);
        }
        if (!(beta > 0 && beta < 1)) {
            dc_schedule_free(s);
            return dc_fail("schedule: beta %d is %g, outside (0, 1)", i, beta);
        }
        prod *= 1.0 - beta;
        acp[i] = prod;
    }
    if (c->rescale_zero_snr) {
        // rescale_zero_terminal_snr: sqrt(acp) - sqrt(acp[T-1]), scaled back to
        // sqrt(acp[0]) at 0; then betas again from the ratios, and their cumprod.
        double s0 = sqrt(acp[0]), sT = sqrt(acp[T - 1]), prev = 1.0;
        prod = 1.0;
        for (int i = 0; i < T; i++) {
            double q = (sqrt(acp[i]) - sT) * s0 / (s0 - sT), ab = q * q;
            double alpha = i == 0 ? ab : ab / prev;
            prev = ab;
            prod *= alpha;
            acp[i] = prod;
        }
        acp[T - 1] = 0.0;  // exactly, as q is
        if (floor) acp[T - 1] = 0x1p-24;  // "FP16 smallest positive subnormal"
    }
    for (int i = 0; i < T - (c->rescale_zero_snr ? 1 : 0); i++)
        if (!(acp[i] > 0)) {
            dc_schedule_free(s);
            return dc_fail("schedule: alphas_cumprod underflows to 0 at timestep %d of %d (betas too large)", i, T);
        }
    dc_schedule_fill_sigmas(s);
    return 0;
}

int dc_schedule_init_scaled_linear(dc_schedule *s, int T, double beta_start, double beta_end) {
    dc_sd_sched_cfg c;
    dc_sd_sched_cfg_default(&c);
    c.T = T, c.beta_start = beta_start, c.beta_end = beta_end;
    return dc_schedule_init_cfg(s, &c, true);
}

// numpy's linspace(0, stop, num)[i]: i * (stop / (num - 1)), the last exactly stop.
static double np_linspace(double stop, int num, int i) {
    if (num == 1) return 0.0;
    return i == num - 1 ? stop : i * (stop / (num - 1));
}

// The length of numpy's arange(start, 0, -step).
static long np_arange_len(double start, double step) { return (long)ceil(start / step); }

int dc_sd_timesteps(int T, int n, dc_spacing spacing, int offset, int *out) {
    if (n < 1 || n > T) return dc_fail("schedule: %d sampling steps outside [1, %d]", n, T);
    for (int k = 0; k < n; k++) {
        int t;
        switch (spacing) {
        case DC_SPACING_LEADING: t = (n - 1 - k) * (T / n) + offset; break;
        case DC_SPACING_TRAILING: t = (int)nearbyint((double)T - k * ((double)T / n)) - 1; break;
        case DC_SPACING_LINSPACE: t = (int)nearbyint(np_linspace(T - 1, n, n - 1 - k)); break;
        default: return dc_fail("schedule: unknown timestep spacing %d", (int)spacing);
        }
        if (t < 0 || t >= T)
            return dc_fail("schedule: timestep %d outside [0, %d) (%d steps, steps_offset %d)", t, T, n, offset);
        out[k] = t;
    }
    return 0;
}

double dc_sd_sigma_to_t(const dc_schedule *s, double sigma) {
    // dists = log_sigma - log_sigmas; low_idx = last index with dists >= 0,
    // clamped to T - 2; w = (low - log_sigma) / (low - high) clamped to [0, 1].
    double ls = log(fmax(sigma, 1e-10));
    int low = 0;
    for (int i = 0; i < s->T; i++)
        if (ls - s->log_sigmas[i] >= 0) low = i;
    if (low > s->T - 2) low = s->T - 2;
    double lo = s->log_sigmas[low], hi = s->log_sigmas[low + 1];
    double w = (lo - ls) / (lo - hi);
    w = w < 0 ? 0 : w > 1 ? 1 : w;
    return (1.0 - w) * low + w * (low + 1);
}

double dc_sd_t_to_sigma(const dc_schedule *s, double t) {
    int low = (int)floor(t), high = (int)ceil(t);
    double w = t - low;
    return exp((1.0 - w) * s->log_sigmas[low] + w * s->log_sigmas[high]);
}

int dc_sd_sigmas_karras(int n, double sigma_min, double sigma_max, double rho, double *out) {
    if (n < 1) return dc_fail("schedule: %d sampling steps", n);
    if (!(sigma_min > 0 && sigma_max >= sigma_min && rho > 0 && isfinite(sigma_max)))
        return dc_fail("schedule: Karras sigmas from %g to %g (rho %g)", sigma_min, sigma_max, rho);
    double max_inv = pow(sigma_max, 1.0 / rho), min_inv = pow(sigma_min, 1.0 / rho);
    for (int i = 0; i < n; i++) {
        double ramp = np_linspace(1.0, n, i);
        out[i] = pow(max_inv + ramp * (min_inv - max_inv), rho);
    }
    out[n] = 0.0;
    return 0;
}

int dc_sd_sigmas_uniform(const dc_schedule *s, int n, double *out) {
    if (n < 1) return dc_fail("schedule: %d sampling steps", n);
    for (int i = 0; i < n; i++) {
        double t = n == 1 ? s->T - 1 : (double)(s->T - 1) * (n - 1 - i) / (n - 1);
        out[i] = dc_sd_t_to_sigma(s, t);
    }
    out[n] = 0.0;
    return 0;
}

// ---- the ladders of diffusers' classes ---------------------------------------------------

// np.interp(t, arange(T), sigmas): linear in t, clamped at the ends.
static double interp_sigma(const dc_schedule *s, double t) {
    if (t <= 0) return s->sigmas[0];
    if (t >= s->T - 1) return s->sigmas[s->T - 1];
    int lo = (int)floor(t);
    return s->sigmas[lo] + (t - lo) * (s->sigmas[lo + 1] - s->sigmas[lo]);
}

// Timesteps of the Euler classes (float; linspace in float32 as numpy's dtype
// there), DDIM (integers) and DPM-Solver (n + 1 points less the last, from
// `last` = T less the steps lambda_min_clipped removes).
static int class_timesteps(const dc_sd_sched_cfg *c, dc_sd_class k, dc_spacing sp, int n, int last, double *t) {
    const int T = c->T;
    if (k == DC_SCHED_DPM_MULTISTEP) {
        if (sp == DC_SPACING_TRAILING && np_arange_len(last, (double)T / n) < n)
            return dc_fail("%s: lambda_min_clipped %g leaves %ld timesteps for %d steps with trailing spacing",
                           c->source[0] ? c->source : "scheduler", c->lambda_min_clipped,
                           np_arange_len(last, (double)T / n), n);
        for (int i = 0; i < n; i++) {
            if (sp == DC_SPACING_LINSPACE) t[i] = nearbyint(np_linspace(last - 1, n + 1, n - i));
            else if (sp == DC_SPACING_LEADING) t[i] = (double)(n - i) * (last / (n + 1)) + c->steps_offset;
            else t[i] = nearbyint(last - i * ((double)T / n)) - 1;
        }
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (sp == DC_SPACING_LEADING) t[i] = (double)(n - 1 - i) * (T / n) + c->steps_offset;
        else if (sp == DC_SPACING_TRAILING) t[i] = nearbyint((double)T - i * ((double)T / n)) - 1;
        else if (k == DC_SCHED_DDIM) t[i] = nearbyint(np_linspace(T - 1, n, n - 1 - i));
        else t[i] = (float)np_linspace(T - 1, n, n - 1 - i);
    }
    return 0;
}

int dc_sd_ladder(const dc_schedule *s, const dc_sd_sched_cfg *c, dc_sd_class k, bool karras,
                 dc_prediction prediction, int n, double *t, double *sigma, double *init) {
    const int T = s->T;
    const char *src = c->source[0] ? c->source : "scheduler";
    if (n < 1 || n > T) return dc_fail("%s: %d sampling steps outside [1, %d]", src, n, T);
    if (karras && k != DC_SCHED_EULER && k != DC_SCHED_DPM_MULTISTEP)
        return dc_fail("%s has no Karras sigmas", dc_sd_class_name(k));
    dc_spacing sp = c->spacing != DC_SPACING_CLASS ? c->spacing
                    : k == DC_SCHED_DDIM            ? DC_SPACING_LEADING
                                                    : DC_SPACING_LINSPACE;
    // DPM-Solver: the timesteps whose lambda = log(alpha / sigma) is below
    // lambda_min_clipped are left out (searchsorted over the ascending flip).
    int last = T;
    if (k == DC_SCHED_DPM_MULTISTEP)
        for (int i = 0; i < T; i++)
            if (-s->log_sigmas[i] < c->lambda_min_clipped) last = i < last ? i : last;
    DC_TRY(class_timesteps(c, k, sp, n, last, t));
    for (int i = 0; i < n; i++)
        if (!(t[i] >= 0 && t[i] <= T - 1))
            return dc_fail("%s: %d steps with %s spacing and steps_offset %d reach timestep %g, outside [0, %d]",
                           src, n, sp == DC_SPACING_LEADING ? "leading" : sp == DC_SPACING_TRAILING ? "trailing"
                                                                                                 : "linspace",
                           c->steps_offset, t[i], T - 1);
    const double sigma0 = s->sigmas[0];  // final_sigmas_type "sigma_min"

    if (k == DC_SCHED_DDIM) {
        double final = c->set_alpha_to_one ? 1.0 : s->alphas_cumprod[0];
        for (int i = 0; i < n; i++) sigma[i] = s->sigmas[(int)t[i]];
        int prev = (int)t[n - 1] - T / n;
        double acp_prev = prev >= 0 ? s->alphas_cumprod[prev] : final;
        sigma[n] = sqrt((1 - acp_prev) / acp_prev);
        *init = 1;
        return 0;
    }

    if (k == DC_SCHED_EULER && c->log_linear) {
        // torch.linspace(log sigma_max, log sigma_min, n + 1).exp(): n + 1
        // sigmas for n timesteps, the last a step target (diffusers then
        // appends the final one, which no step reaches)
        double a = s->log_sigmas[T - 1], b = s->log_sigmas[0];
        for (int i = 0; i <= n; i++) sigma[i] = exp(i == n ? b : a + (b - a) * i / n);
    } else {
        for (int i = 0; i < n; i++) sigma[i] = interp_sigma(s, t[i]);
    }
    if (karras) {
        // _convert_to_karras on that ladder (Euler) or on the whole schedule
        // (DPM-Solver); the config's sigma_min / sigma_max when given
        double lo = k == DC_SCHED_EULER ? sigma[c->log_linear ? n : n - 1] : s->sigmas[0];
        // Euler: numpy's extra "trailing" timestep (see dc_sd_timesteps), left
        // out of the ladder, is still the last of the sigmas Karras starts from
        if (k == DC_SCHED_EULER && !c->log_linear && sp == DC_SPACING_TRAILING &&
            np_arange_len(T, (double)T / n) > n)
            lo = interp_sigma(s, nearbyint(T - n * ((double)T / n)) - 1);
        double hi = k == DC_SCHED_EULER ? sigma[0] : s->sigmas[T - 1];
        if (c->sigma_min > 0) lo = c->sigma_min;
        if (c->sigma_max > 0) hi = c->sigma_max;
        DC_TRY(dc_sd_sigmas_karras(n, lo, hi, 7.0, sigma));
        for (int i = 0; i < n; i++) {
            t[i] = dc_sd_sigma_to_t(s, sigma[i]);
            // DPM-Solver rounds them (but for the cosine schedule, whose int64
            // cast truncates)
            if (k == DC_SCHED_DPM_MULTISTEP)
                t[i] = c->beta_schedule == DC_BETAS_SQUAREDCOS && !c->trained_betas ? trunc(t[i]) : nearbyint(t[i]);
            else
                t[i] = (float)t[i];
        }
    }
    if (karras || !(k == DC_SCHED_EULER && c->log_linear))
        sigma[n] = k != DC_SCHED_EULER_ANCESTRAL && c->final_sigma_min ? sigma0 : 0.0;
    if (k == DC_SCHED_EULER && c->continuous_t && prediction == DC_PRED_V)
        for (int i = 0; i < n; i++) t[i] = 0.25 * log((float)sigma[i]);

    if (k == DC_SCHED_DPM_MULTISTEP) {
        *init = 1;
    } else {
        // init_noise_sigma: the largest sigma, or sqrt(max^2 + 1) for "leading"
        double mx = 0;
        for (int i = 0; i <= n; i++) mx = fmax(mx, sigma[i]);
        *init = sp == DC_SPACING_LEADING ? sqrt(mx * mx + 1) : mx;
    }
    for (int i = 0; i <= n; i++)
        if (!(sigma[i] >= 0 && isfinite(sigma[i])))
            return dc_fail("%s: sigma %g at step %d of %d", src, sigma[i], i, n);
    return 0;
}
