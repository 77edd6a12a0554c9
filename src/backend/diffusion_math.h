// Scalar formulas of the diffusion ops (q_sample, the DiT training loss,
// classifier-free guidance, reverse steps), shared by the CPU loops in
// backend/cpu/cpu_diffusion.c and the CUDA kernels, so each lives once.
// Sources: guided_diffusion/gaussian_diffusion.py and diffusion_utils.py as
// the official DiT code copies them.
//
// Precision: the sampler and q_sample formulas are float, in PyTorch's order
// of operations. The loss terms are double per element: the KL of two nearly
// equal Gaussians is a difference of O(1) terms that nearly cancel
// (-1 + d + exp(-d) ~ d^2 / 2), which float32 resolves only to ~1e-7.
#pragma once
#include <math.h>
#include "backend/op_math.h"

#define DC_LN2 0.693147180559945309417
#define DC_SQRT_2_OVER_PI 0.797884560802865355880
#define DC_NLL_BIN (1.0 / 255.0)  // half-width of an 8-bit pixel bin on [-1, 1]
#define DC_NLL_CLAMP 1e-12        // probabilities are clamped to this before log()

// ---- forward process -----------------------------------------------------------
// x_t = sqrt(abar) x0 + sqrt(1 - abar) eps
DC_HD float dc_q_sample_elem(float sqrt_abar, float x0, float sqrt_1m_abar, float eps) {
    return sqrt_abar * x0 + sqrt_1m_abar * eps;
}

// ---- classifier-free guidance ------------------------------------------------------
// forward_with_cfg: half_eps = uncond + scale (cond - uncond)
DC_HD float dc_cfg_elem(float cond, float uncond, float scale) {
    return uncond + scale * (cond - uncond);
}

// ---- training loss ------------------------------------------------------------------
// LEARNED_RANGE variance: the model's v in [-1, 1] interpolates the log
// variance between the posterior's (min) and beta's (max).
DC_HD double dc_learned_logvar(double v, double min_log, double max_log) {
    double frac = (v + 1.0) / 2.0;
    return frac * max_log + (1.0 - frac) * min_log;
}

// normal_kl: KL(N(m1, e^lv1) || N(m2, e^lv2)) in nats
DC_HD double dc_normal_kl(double m1, double lv1, double m2, double lv2) {
    double dm = m1 - m2;
    return 0.5 * (-1.0 + lv2 - lv1 + exp(lv1 - lv2) + dm * dm * exp(-lv2));
}
// d normal_kl / d lv2
DC_HD double dc_normal_kl_dlv2(double m1, double lv1, double m2, double lv2) {
    double dm = m1 - m2;
    return 0.5 * (1.0 - exp(lv1 - lv2) - dm * dm * exp(-lv2));
}

// approx_standard_normal_cdf: 0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
DC_HD double dc_approx_cdf(double x) {
    return 0.5 * (1.0 + tanh(DC_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
}
// its derivative: 0.5 (1 - tanh^2(u)) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
DC_HD double dc_approx_cdf_grad(double x) {
    double th = tanh(DC_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 - th * th) * DC_SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
}

// discretized_gaussian_log_likelihood for one element, in nats, and its
// derivative with respect to log_scale (*dls). The edge tests compare x with
// -0.999 / 0.999 in float as PyTorch does on a float32 tensor; where a clamp
// at 1e-12 is active the derivative is 0 (clamp passes gradient where >= min).
DC_HD double dc_discretized_gaussian_loglik(float x, double mean, double log_scale,
                                            double *dls) {
    double centered = (double)x - mean;
    double inv_stdv = exp(-log_scale);
    double plus_in = inv_stdv * (centered + DC_NLL_BIN);
    double min_in = inv_stdv * (centered - DC_NLL_BIN);
    double cdf_plus = dc_approx_cdf(plus_in), cdf_min = dc_approx_cdf(min_in);
    // d(in)/d(log_scale) = -in
    double dplus = -dc_approx_cdf_grad(plus_in) * plus_in;
    double dmin = -dc_approx_cdf_grad(min_in) * min_in;
    if (x < -0.999f) {  // log_cdf_plus
        *dls = cdf_plus >= DC_NLL_CLAMP ? dplus / cdf_plus : 0.0;
        return log(cdf_plus >= DC_NLL_CLAMP ? cdf_plus : DC_NLL_CLAMP);
    }
    if (x > 0.999f) {  // log_one_minus_cdf_min
        double om = 1.0 - cdf_min;
        *dls = om >= DC_NLL_CLAMP ? -dmin / om : 0.0;
        return log(om >= DC_NLL_CLAMP ? om : DC_NLL_CLAMP);
    }
    double delta = cdf_plus - cdf_min;
    *dls = delta >= DC_NLL_CLAMP ? (dplus - dmin) / delta : 0.0;
    return log(delta >= DC_NLL_CLAMP ? delta : DC_NLL_CLAMP);
}

// mse term of one element, (eps - eps_hat)^2, and d/d eps_hat (*d).
DC_HD double dc_loss_mse_elem(float eps, float eps_hat, double *d) {
    double diff = (double)eps - (double)eps_hat;
    *d = -2.0 * diff;
    return diff * diff;
}

// vb term of one element, in nats (the op divides the per-sample sum by
// C*H*W and ln 2), and d/dv (*d). The model mean uses eps_hat detached
// (frozen_out), so no derivative reaches eps_hat:
//   x0_hat = sqrt_recip_abar x_t - sqrt_recipm1_abar eps_hat
//   true   = (c1 x0 + c2 x_t, post_logvar_clipped);  model = (c1 x0_hat + c2 x_t, logvar(v))
//   t > 0:  normal_kl(true, model);  t == 0: -loglik(x0; model mean, 0.5 logvar(v)).
DC_HD double dc_loss_vb_elem(const dc_loss_coef *c, float eps_hat, float v, float x0, float xt,
                             double *d) {
    double min_log = c->post_logvar_clipped, max_log = c->log_beta;
    double lv = dc_learned_logvar(v, min_log, max_log);
    double dlv_dv = 0.5 * (max_log - min_log);
    double x0_hat = (double)c->sqrt_recip_abar * xt - (double)c->sqrt_recipm1_abar * eps_hat;
    double model_mean = (double)c->post_c1 * x0_hat + (double)c->post_c2 * xt;
    if (!c->t_is_zero) {
        double true_mean = (double)c->post_c1 * x0 + (double)c->post_c2 * xt;
        *d = dc_normal_kl_dlv2(true_mean, min_log, model_mean, lv) * dlv_dv;
        return dc_normal_kl(true_mean, min_log, model_mean, lv);
    }
    double dls;
    double ll = dc_discretized_gaussian_loglik(x0, model_mean, 0.5 * lv, &dls);
    *d = -dls * 0.5 * dlv_dv;
    return -ll;
}

// ---- reverse steps ---------------------------------------------------------------------
// p_sample with clip_denoised=False, model output (eps, v):
//   x0 = sqrt_recip_abar x - sqrt_recipm1_abar eps;  mean = c1 x0 + c2 x
//   x' = mean + [add_noise] exp(0.5 logvar) z,  logvar learned-range or FIXED_LARGE.
// z is read only when noise is added, so it may be garbage otherwise.
DC_HD float dc_step_ddpm_elem(const dc_step_coef *c, float x, float eps, float v, float z) {
    float x0 = c->sqrt_recip_abar * x - c->sqrt_recipm1_abar * eps;
    float mean = c->post_c1 * x0 + c->post_c2 * x;
    if (!c->add_noise) return mean;
    float lv = c->fixed_logvar;
    if (c->learn_sigma) {
        float frac = (v + 1.0f) / 2.0f;
        lv = frac * c->max_log + (1.0f - frac) * c->min_log;
    }
    return mean + expf(0.5f * lv) * z;
}

// ddim_sample with clip_denoised=False: eps is re-derived from x0 as upstream
// does (_predict_eps_from_xstart), then
//   x' = sqrt(abar_prev) x0 + sqrt(1 - abar_prev - sigma^2) eps' + [add_noise] sigma z.
DC_HD float dc_step_ddim_elem(const dc_step_coef *c, float x, float eps, float z) {
    float x0 = c->sqrt_recip_abar * x - c->sqrt_recipm1_abar * eps;
    float eps2 = (c->sqrt_recip_abar * x - x0) / c->sqrt_recipm1_abar;
    float out = x0 * c->ddim_sqrt_abar_prev + c->ddim_dir * eps2;
    return c->add_noise ? out + c->ddim_sigma * z : out;
}

DC_HD float dc_step_elem(const dc_step_coef *c, float x, float eps, float v, float z) {
    return c->kind == DC_STEP_DDIM ? dc_step_ddim_elem(c, x, eps, z)
                                   : dc_step_ddpm_elem(c, x, eps, v, z);
}
