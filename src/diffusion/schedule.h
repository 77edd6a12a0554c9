// The noise schedule: one type for every diffusion family the engine runs.
//
//   DC_SCHEDULE_DISCRETE  T timesteps of a variance-preserving process,
//       x_t = sqrt(acp[t]) x0 + sqrt(1 - acp[t]) eps, or in the
//       variance-exploding view x_sigma = x_t / sqrt(acp) = x0 + sigma eps with
//       sigma = sqrt((1 - acp) / acp). Made from betas as the official DiT
//       code (GaussianDiffusion, respacing: this file) or from a diffusers
//       scheduler config (dc_schedule_init_cfg, sd_schedule.h).
//   DC_SCHEDULE_FLOW  rectified flow, continuous sigma in [0, 1]:
//       x_sigma = (1 - sigma) x0 + sigma noise, with a time shift
//       (dc_schedule_init_flow, flow.h).
//
// What the model predicts (eps, v, the velocity of a flow) is the model's
// (models/model.h dc_prediction, the sampler's options); the samplers' plans
// turn it into the denoised estimate (sampler.h says where a new one goes).
//
// The DiT tables mirror guided_diffusion/gaussian_diffusion.py and respace.py:
// every table in float64, computed in the same order as numpy, and cast to
// float only when a per-sample record for an op is filled. Such a schedule is
// one process of n steps: the 1000-step base process, or a respaced one
// (SpacedDiffusion) whose step k stands for original timestep timestep[k] --
// the value the model is fed.
#pragma once
#include <stdbool.h>
#include "backend/op_math.h"

#define DC_DIFFUSION_STEPS 1000  // the official diffusion_steps

typedef enum { DC_SCHEDULE_DISCRETE, DC_SCHEDULE_FLOW } dc_schedule_family;

typedef struct {
    dc_schedule_family family;
    int n;          // steps of this schedule: every table is [n]
    int T;          // training timesteps (of the base process a respaced one was spaced from)
    int *timestep;  // discrete: original timestep of step k (identity but for a respaced process)
    // Every family: the noise level of step k, ascending in k (sigmas[0] the
    // smallest). Discrete: sqrt((1 - acp) / acp), inf where acp is 0 (zero
    // terminal SNR); flow: the shifted sigma of training timestep k + 1.
    double *sigmas, *log_sigmas;
    double shift;   // flow: sigma' = shift sigma / (1 + (shift - 1) sigma)
    double *alphas_cumprod;  // discrete
    // GaussianDiffusion's own tables (official names), in schedules made from
    // betas (dc_schedule_init_betas and those built on it; NULL in others):
    double *betas, *log_betas;
    double *alphas_cumprod_prev;
    double *sqrt_alphas_cumprod, *sqrt_one_minus_alphas_cumprod;
    double *sqrt_recip_alphas_cumprod, *sqrt_recipm1_alphas_cumprod;
    double *posterior_variance, *posterior_log_variance_clipped;
    double *posterior_mean_coef1, *posterior_mean_coef2;
    double *fixed_large_log_variance;  // log([pv[1], betas[1:]]), the fixed variance DiT uses
                                       // when sigma is not learned (ModelVarType.FIXED_LARGE)
    double *tables_;  // the one block that holds every table
} dc_schedule;

// The rectified-flow schedule of T training timesteps and a shift > 0 (the
// sigmas of diffusers' FlowMatchEulerDiscreteScheduler.__init__).
int dc_schedule_init_flow(dc_schedule *s, int T, double shift);
static inline double dc_schedule_sigma_min(const dc_schedule *s) { return s->sigmas[0]; }
static inline double dc_schedule_sigma_max(const dc_schedule *s) { return s->sigmas[s->n - 1]; }

// A process from its betas (GaussianDiffusion.__init__); timestep may be NULL
// (identity). Betas must lie in (0, 1].
int dc_schedule_init_betas(dc_schedule *s, const double *betas, const int *timestep, int n, int T);
// The base process of T steps with get_named_beta_schedule("linear", T):
// betas = np.linspace(scale * 1e-4, scale * 0.02, T), scale = 1000 / T.
int dc_schedule_init_linear(dc_schedule *s, int T);
// SpacedDiffusion(space_timesteps(base->n, str(steps))): keeps the chosen
// steps of base with betas 1 - abar_i / abar_(previous kept), so the kept
// alphas_cumprod are exactly the base ones. `out` must not alias `base`.
int dc_schedule_respace(dc_schedule *out, const dc_schedule *base, int steps);
// What guided-diffusion's create_diffusion(str(steps)) builds (DiT's and
// ADM's schedule): the linear T-step process respaced
// to `steps`. Training uses steps = T, as create_diffusion("") does (the
// respaced betas differ from the linspace ones in the last bits).
int dc_schedule_init_gaussian(dc_schedule *s, int T, int steps);
void dc_schedule_free(dc_schedule *s);

// space_timesteps(T, "N") of respace.py, one section: frac_stride =
// (T - 1) / (N - 1) (1 when N == 1); the index is accumulated by repeated
// addition (cur += frac_stride) and rounded half to even as Python's round().
// Note: for some N (e.g. 999) this differs from round(i * frac_stride).
// out[N] is ascending. Fails unless 1 <= N <= T.
int dc_space_timesteps(int T, int N, int *out);

// A discrete schedule of n steps whose tables are allocated (zero), the
// timesteps the identity, for a constructor to fill: the GaussianDiffusion
// tables too when `gaussian`. On failure s has nothing to free.
int dc_schedule_alloc(dc_schedule *s, int n, int T, bool gaussian);
// sigmas and log_sigmas from alphas_cumprod.
void dc_schedule_fill_sigmas(dc_schedule *s);

// The DiT training-loss record of step t of s (for the training schedule,
// t is the original timestep).
int dc_schedule_loss_coef(const dc_schedule *s, int t, dc_loss_coef *c);
// The reverse-step record for step index k of s (k = n-1 first, down to 0):
// ancestral DDPM (p_sample) or DDIM with eta (ddim_sample), no clipping.
int dc_schedule_step_coef(const dc_schedule *s, int k, dc_step_kind kind, double eta,
                          bool learn_sigma, dc_step_coef *c);
