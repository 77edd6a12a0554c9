// Scalar math shared by every backend: the CPU loops and the CUDA kernels
// compile these same inline functions, so the formulas live in one place.
// Also the small per-sample coefficient records the ops take from the host.
#pragma once
#include <math.h>
#include "core/dtype.h"

// ---- activations ------------------------------------------------------------
// GELU, tanh approximation (PyTorch approximate="tanh"):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#define DC_GELU_K 0.7978845608028654f
DC_HD float dc_gelu(float x) {
    float u = DC_GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
DC_HD float dc_gelu_grad(float x) {
    float u = DC_GELU_K * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float du = DC_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}
DC_HD float dc_silu(float x) { return x / (1.0f + expf(-x)); }
// SiLU's derivative at x from s = sigmoid(x) (the GPU's GroupNorm passes its
// own, approximate, sigmoid).
DC_HD float dc_silu_grad_of(float x, float s) { return s * (1.0f + x * (1.0f - s)); }
DC_HD float dc_silu_grad(float x) { return dc_silu_grad_of(x, 1.0f / (1.0f + expf(-x))); }

#define DC_LN_EPS 1e-6f

// ---- layer norm and adaLN modulation -----------------------------------------------
// 1 / sqrt(var + eps) from a row's biased variance (accumulated in double).
DC_HD float dc_ln_rstd(double var) { return (float)(1.0 / sqrt(var + (double)DC_LN_EPS)); }
// DiT's modulate(): x * (1 + scale) + shift.
DC_HD float dc_modulate(float xhat, float shift, float scale) {
    return xhat * (1.0f + scale) + shift;
}
// LayerNorm input gradient of one element, given g = dL/dxhat and the row
// means of g and g * xhat: rstd (g - mean(g) - xhat mean(g xhat)).
DC_HD float dc_ln_dx(float g, float xhat, float rstd, float mean_g, float mean_gx) {
    return rstd * (g - mean_g - xhat * mean_gx);
}

// ---- DiT embeddings ----------------------------------------------------------------
// Timestep embedding frequency f_k = exp(-ln(10000) k / half); the embedding
// is [cos(t f) | sin(t f)]. Double: t f reaches ~1000 radians.
DC_HD double dc_timestep_freq(int k, int half) {
    return exp(-9.210340371976184 * (double)k / (double)half);
}

// ---- latent diffusion (UNet, VAE, text encoders) ------------------------------------
// The activations of the SD family, for activation_fwd / activation_bwd.
typedef enum {
    DC_ACT_SILU,        // x sigmoid(x)
    DC_ACT_GELU_TANH,   // PyTorch gelu(approximate="tanh")
    DC_ACT_GELU_ERF,    // PyTorch gelu(): 0.5 x (1 + erf(x / sqrt 2)) (GEGLU, OpenCLIP)
    DC_ACT_QUICK_GELU,  // x sigmoid(1.702 x) (OpenAI CLIP)
} dc_act;

// A 2-D convolution's shape: x[B, Ci, H, W] * w[Co, Ci, k, k] -> out[B, Co, Ho, Wo]
// with stride `stride` and zero padding pad_t/pad_b/pad_l/pad_r (top, bottom,
// left, right: SD's VAE downsampling pads only bottom and right);
// Ho = (H + pad_t + pad_b - k) / stride + 1, Wo likewise.
// nhwc (channels-last): x[B, H, W, Ci] * w[Co, k, k, Ci] -> out[B, Ho, Wo, Co],
// and the gradients likewise. An int, so the struct has no padding bytes
// (backends compare shapes with memcmp).
typedef struct {
    int B, Ci, H, W, Co, k, stride, pad_t, pad_b, pad_l, pad_r;
    int nhwc;
} dc_conv2d_shape;
DC_HD int dc_conv2d_ho(const dc_conv2d_shape *s) { return (s->H + s->pad_t + s->pad_b - s->k) / s->stride + 1; }
DC_HD int dc_conv2d_wo(const dc_conv2d_shape *s) { return (s->W + s->pad_l + s->pad_r - s->k) / s->stride + 1; }

// GELU, exact (PyTorch gelu()): 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x);
// its derivative is Phi(x) + x phi(x), phi the standard normal density.
#define DC_SQRT1_2 0.7071067811865476f
#define DC_INV_SQRT_2PI 0.3989422804014327f
DC_HD float dc_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * DC_SQRT1_2)); }
DC_HD float dc_gelu_erf_grad(float x) {
    return 0.5f * (1.0f + erff(x * DC_SQRT1_2)) + x * DC_INV_SQRT_2PI * expf(-0.5f * x * x);
}
// QuickGELU (OpenAI CLIP): x sigmoid(1.702 x); derivative s (1 + 1.702 x (1 - s)).
#define DC_QUICK_GELU_K 1.702f
DC_HD float dc_quick_gelu(float x) { return x / (1.0f + expf(-DC_QUICK_GELU_K * x)); }
DC_HD float dc_quick_gelu_grad(float x) {
    float s = 1.0f / (1.0f + expf(-DC_QUICK_GELU_K * x));
    return s * (1.0f + DC_QUICK_GELU_K * x * (1.0f - s));
}
DC_HD float dc_act_fwd(float x, dc_act act) {
    switch (act) {
    case DC_ACT_SILU: return dc_silu(x);
    case DC_ACT_GELU_TANH: return dc_gelu(x);
    case DC_ACT_GELU_ERF: return dc_gelu_erf(x);
    case DC_ACT_QUICK_GELU: return dc_quick_gelu(x);
    }
    return x;
}
DC_HD float dc_act_grad(float x, dc_act act) {
    switch (act) {
    case DC_ACT_SILU: return dc_silu_grad(x);
    case DC_ACT_GELU_TANH: return dc_gelu_grad(x);
    case DC_ACT_GELU_ERF: return dc_gelu_erf_grad(x);
    case DC_ACT_QUICK_GELU: return dc_quick_gelu_grad(x);
    }
    return 1.0f;
}

// Group norm and affine layer norm share the per-element formulas: statistics
// (mean, biased variance) accumulated in double over the group or the row, then
// y = (x - mean) rstd gamma + beta, and in backward, with g = dL/dy gamma
// (times act'(y) when an activation is fused), dx = dc_ln_dx(g, xhat, rstd,
// mean(g), mean(g xhat)) over the same group or row.
DC_HD float dc_norm_rstd(double var, float eps) { return (float)(1.0 / sqrt(var + (double)eps)); }
DC_HD float dc_norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
DC_HD float dc_norm_affine(float xhat, float gamma, float beta) { return xhat * gamma + beta; }

// ---- diffusion ----------------------------------------------------------------
// Per-sample coefficients of the DiT training loss, computed on the host in
// float64 from the schedule at the sample's timestep t (see diffusion/schedule.h).
typedef struct {
    float sqrt_abar, sqrt_1m_abar;        // q_sample: x_t = sqrt_abar x0 + sqrt_1m_abar eps
    float sqrt_recip_abar, sqrt_recipm1_abar;  // x0_hat = a x_t - b eps_hat
    float post_c1, post_c2;               // posterior mean = c1 x0 + c2 x_t
    float post_logvar_clipped;            // log posterior variance (clipped); min_log
    float log_beta;                       // max_log
    int t_is_zero;                        // vb term is the decoder NLL when t == 0
} dc_loss_coef;

// One reverse-process step, the same for every sample of a batch.
typedef enum { DC_STEP_DDPM = 0, DC_STEP_DDIM = 1 } dc_step_kind;
typedef struct {
    int kind;                             // dc_step_kind
    int add_noise;                        // 0 on the last step (t == 0)
    int learn_sigma;                      // variance from the model's v channels
    float sqrt_recip_abar, sqrt_recipm1_abar;  // x0 = a x - b eps
    float post_c1, post_c2;               // DDPM mean = c1 x0 + c2 x
    float min_log, max_log;               // DDPM learned log-variance range
    float fixed_logvar;                   // DDPM log-variance when not learned
    float ddim_sqrt_abar_prev, ddim_dir, ddim_sigma;  // DDIM: x = a x0 + dir eps + sigma z
} dc_step_coef;

// ---- optimisation ---------------------------------------------------------------
// The clipping factor for a gradient of global norm `norm`.
DC_HD float dc_clip_factor(double norm, float max_norm) {
    return max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_corr1, bias_corr2;         // 1 - beta^step
    float grad_scale;                     // applied to the raw gradient (clipping, averaging)
    float ema_decay;                      // EMA of the updated weights (if one is kept)
} dc_adamw_step;

DC_HD void dc_adamw_update(float *p, float *m, float *v, float grad, const dc_adamw_step *h) {
    float g = grad * h->grad_scale;
    float mm = h->beta1 * *m + (1.0f - h->beta1) * g;
    float vv = h->beta2 * *v + (1.0f - h->beta2) * g * g;
    *m = mm;
    *v = vv;
    float mhat = mm / h->bias_corr1, vhat = vv / h->bias_corr2;
    *p -= h->lr * (mhat / (sqrtf(vhat) + h->eps) + h->weight_decay * *p);
}
