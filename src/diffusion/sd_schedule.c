#include "diffusion/sd_schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

void dc_sd_schedule_free(dc_sd_schedule *s) {
    if (!s) return;
    free(s->alphas_cumprod);
    free(s->sigmas);
    free(s->log_sigmas);
    memset(s, 0, sizeof *s);
}

int dc_sd_schedule_init(dc_sd_schedule *s, int T, double beta_start, double beta_end) {
    memset(s, 0, sizeof *s);
    if (T < 2) return dc_fail("schedule: %d training steps (need at least 2)", T);
    if (!(beta_start > 0 && beta_end < 1 && beta_start <= beta_end))
        return dc_fail("schedule: betas %g..%g outside (0, 1)", beta_start, beta_end);
    s->T = T;
    s->alphas_cumprod = malloc(sizeof(double) * T);
    s->sigmas = malloc(sizeof(double) * T);
    s->log_sigmas = malloc(sizeof(double) * T);
    if (!s->alphas_cumprod || !s->sigmas || !s->log_sigmas) {
        dc_sd_schedule_free(s);
        return dc_fail("schedule: out of host memory");
    }
    double a = sqrt(beta_start), b = sqrt(beta_end), acp = 1.0;
    for (int i = 0; i < T; i++) {
        // torch.linspace: start + i * step, the last element exactly `end`
        double r = i == T - 1 ? b : a + (b - a) * (double)i / (double)(T - 1);
        acp *= 1.0 - r * r;
        s->alphas_cumprod[i] = acp;
        s->sigmas[i] = sqrt((1.0 - acp) / acp);
        s->log_sigmas[i] = log(s->sigmas[i]);
    }
    return 0;
}

int dc_sd_timesteps(int T, int n, dc_spacing spacing, int offset, int *out) {
    if (n < 1 || n > T) return dc_fail("schedule: %d sampling steps outside [1, %d]", n, T);
    for (int k = 0; k < n; k++) {
        int t;
        switch (spacing) {
        case DC_SPACING_LEADING: t = (n - 1 - k) * (T / n) + offset; break;
        case DC_SPACING_TRAILING: t = (int)nearbyint((double)T - k * ((double)T / n)) - 1; break;
        case DC_SPACING_LINSPACE:
            t = (int)nearbyint(n == 1 ? 0.0 : (double)(T - 1) * (n - 1 - k) / (n - 1));
            break;
        default: return dc_fail("schedule: unknown timestep spacing %d", (int)spacing);
        }
        if (t < 0 || t >= T)
            return dc_fail("schedule: timestep %d outside [0, %d) (offset %d)", t, T, offset);
        out[k] = t;
    }
    return 0;
}

double dc_sd_sigma_to_t(const dc_sd_schedule *s, double sigma) {
    // dists = log_sigma - log_sigmas; low_idx = last index with dists >= 0,
    // clamped to T - 2; w = (low - log_sigma) / (low - high) clamped to [0, 1].
    double ls = log(sigma);
    int low = 0;
    for (int i = 0; i < s->T; i++)
        if (ls - s->log_sigmas[i] >= 0) low = i;
    if (low > s->T - 2) low = s->T - 2;
    double lo = s->log_sigmas[low], hi = s->log_sigmas[low + 1];
    double w = (lo - ls) / (lo - hi);
    w = w < 0 ? 0 : w > 1 ? 1 : w;
    return (1.0 - w) * low + w * (low + 1);
}

double dc_sd_t_to_sigma(const dc_sd_schedule *s, double t) {
    int low = (int)floor(t), high = (int)ceil(t);
    double w = t - low;
    return exp((1.0 - w) * s->log_sigmas[low] + w * s->log_sigmas[high]);
}

int dc_sd_sigmas_karras(int n, double sigma_min, double sigma_max, double rho, double *out) {
    if (n < 1) return dc_fail("schedule: %d sampling steps", n);
    if (!(sigma_min > 0 && sigma_max >= sigma_min && rho > 0))
        return dc_fail("schedule: Karras sigmas from %g to %g (rho %g)", sigma_min, sigma_max, rho);
    double max_inv = pow(sigma_max, 1.0 / rho), min_inv = pow(sigma_min, 1.0 / rho);
    for (int i = 0; i < n; i++) {
        double ramp = n == 1 ? 0.0 : (double)i / (n - 1);
        out[i] = pow(max_inv + ramp * (min_inv - max_inv), rho);
    }
    out[n] = 0.0;
    return 0;
}

int dc_sd_sigmas_uniform(const dc_sd_schedule *s, int n, double *out) {
    if (n < 1) return dc_fail("schedule: %d sampling steps", n);
    for (int i = 0; i < n; i++) {
        double t = n == 1 ? s->T - 1 : (double)(s->T - 1) * (n - 1 - i) / (n - 1);
        out[i] = dc_sd_t_to_sigma(s, t);
    }
    out[n] = 0.0;
    return 0;
}
