// The noise schedule of latent diffusion (Stable Diffusion 1.x / 2.x) and the
// step ladders its samplers walk, all in float64 on the host.
//
// Schedule (diffusers' schedulers, __init__):
//   betas: "linear" linspace(beta_start, beta_end, T); "scaled_linear" (SD)
//   linspace(sqrt(beta_start), sqrt(beta_end), T)^2; "squaredcos_cap_v2"
//   (GLIDE) beta_i = min(1 - abar((i+1)/T) / abar(i/T), 0.999) with
//   abar(t) = cos((t + 0.008) / 1.008 * pi / 2)^2; or the config's trained_betas.
//   rescale_betas_zero_snr (Lin et al. 2023, algorithm 1): sqrt(acp) shifted so
//   its last value is 0 and scaled so its first is unchanged.
//   alphas_cumprod = cumprod(1 - betas); sigma(t) = sqrt((1 - acp[t]) / acp[t]):
//   x_sigma = x0 + sigma eps is the variance-exploding view of
//   x_t = sqrt(acp) x0 + sqrt(1 - acp) eps (x_sigma = x_t / sqrt(acp)).
// diffusers computes these in float32; the engine in float64 (the tests allow
// for the difference).
//
// Ladders (dc_sd_ladder) follow the set_timesteps of diffusers' classes; the
// sigma <-> t maps and the Karras sigmas are k-diffusion's (k_diffusion/
// external.py DiscreteSchedule, sampling.py get_sigmas_karras), which those
// classes copy.
#pragma once
#include <stdbool.h>
#include "diffusion/schedule.h"
#include "models/model.h"

#define DC_SD_TRAIN_STEPS 1000
#define DC_SD_BETA_START 0.00085
#define DC_SD_BETA_END 0.012

typedef enum { DC_BETAS_LINEAR, DC_BETAS_SCALED_LINEAR, DC_BETAS_SQUAREDCOS } dc_beta_schedule;

// diffusers' timestep_spacing; DC_SPACING_CLASS: the class's default (DDIM
// "leading", Euler, Euler ancestral and DPM-Solver "linspace").
typedef enum { DC_SPACING_LEADING, DC_SPACING_TRAILING, DC_SPACING_LINSPACE, DC_SPACING_CLASS } dc_spacing;

// The settings of a diffusers scheduler_config.json (sd_sched_config.h reads
// and checks the file; the README's "Stable Diffusion" section lists every
// key). Defaults: dc_sd_sched_cfg_default.
typedef struct {
    int T;                          // num_train_timesteps
    double beta_start, beta_end;
    dc_beta_schedule beta_schedule;
    double *trained_betas;          // [T], or NULL (owned: dc_sd_sched_cfg_free)
    bool rescale_zero_snr;          // rescale_betas_zero_snr
    int prediction;                 // prediction_type: DC_PRED_EPS, DC_PRED_V, DC_PRED_SAMPLE, or -1 (not said)
    dc_spacing spacing;             // timestep_spacing
    int steps_offset;               // added to "leading" timesteps
    // EulerDiscreteScheduler
    bool log_linear;                // interpolation_type "log_linear" (else "linear")
    bool continuous_t;              // timestep_type "continuous": v models are fed 0.25 log sigma
    double sigma_min, sigma_max;    // Karras ends when > 0 (else the ladder's own)
    // EulerDiscreteScheduler and DPMSolverMultistepScheduler
    bool final_sigma_min;           // final_sigmas_type "sigma_min" (else "zero")
    // DDIMScheduler
    bool set_alpha_to_one;          // the step after the last uses acp = 1 (else acp[0])
    // DPMSolverMultistepScheduler
    bool lower_order_final, euler_at_final;
    double lambda_min_clipped;      // -inf: none
    // What the file says of the sampling method itself, which the sampler
    // chosen decides (dc_sd_sched_cfg_warnings says what is not followed).
    bool use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas, use_lu_lambdas, use_flow_sigmas;
    int solver_order;               // 2
    bool dpmsolver_pp, midpoint;    // algorithm_type "dpmsolver++", solver_type "midpoint"
    bool thresholding, clip_sample, learned_variance;
    bool schedule_given;            // the file names beta_schedule or trained_betas
    char source[4096];              // the file, for messages ("" for the built-in defaults)
} dc_sd_sched_cfg;

// Stable Diffusion's own scheduler (scheduler_config.json of SD 1.5 and 2.1,
// also used for files that come without one): scaled_linear 0.00085..0.012 over
// 1000 steps, steps_offset 1, set_alpha_to_one false, every other key at the
// diffusers classes' defaults.
void dc_sd_sched_cfg_default(dc_sd_sched_cfg *c);
void dc_sd_sched_cfg_free(dc_sd_sched_cfg *c);

// The discrete schedule of a config (schedule.h; n = T, no GaussianDiffusion
// tables). floor: a last alphas_cumprod of 0 (zero terminal SNR) becomes
// 2^-24, as diffusers' Euler, Euler ancestral and DPM-Solver set it so that
// sigma_max is finite (DDIM keeps the 0).
int dc_schedule_init_cfg(dc_schedule *s, const dc_sd_sched_cfg *c, bool floor);
// The scaled-linear schedule of T steps from beta_start to beta_end.
int dc_schedule_init_scaled_linear(dc_schedule *s, int T, double beta_start, double beta_end);

// diffusers' timestep_spacing, for n inference steps of T (descending, out[n]):
//   LEADING  (SD 1.x/2.x DDIM/PNDM configs): t_k = k * (T / n) + offset, k = n-1..0,
//            T / n an integer division (steps_offset = 1 in those configs);
//   TRAILING: round(T - k * T / n) - 1 for k = 0..n-1 (float stride, numpy round);
//   LINSPACE: round(linspace(0, T - 1, n)) reversed (numpy round: half to even).
// (diffusers applies steps_offset to LEADING only; `offset` is ignored by the others.)
// numpy's arange gives TRAILING one more timestep, -1, for some n (61 of 1000:
// its length is ceil(T / (T / n)) in floating point); it is left out here.
int dc_sd_timesteps(int T, int n, dc_spacing spacing, int offset, int *out);

// k-diffusion DiscreteSchedule.sigma_to_t: the fractional timestep of sigma by
// linear interpolation in log sigma between the two neighbouring training
// sigmas (clamped to [0, T-1]).
double dc_sd_sigma_to_t(const dc_schedule *s, double sigma);
// DiscreteSchedule.t_to_sigma: exp of the log-sigma interpolated at fractional t.
double dc_sd_t_to_sigma(const dc_schedule *s, double t);

// Sigma ladders of n steps, out[n + 1] with out[n] = 0 (descending):
// k-diffusion get_sigmas_karras(n, sigma_min, sigma_max, rho = 7):
//   (smax^(1/rho) + i / (n - 1) (smin^(1/rho) - smax^(1/rho)))^rho, i = 0..n-1;
// (n == 1 gives smax, as torch.linspace(0, 1, 1) = [0].)
int dc_sd_sigmas_karras(int n, double sigma_min, double sigma_max, double rho, double *out);
// DiscreteSchedule.get_sigmas(n): t_to_sigma(linspace(T - 1, 0, n)), then 0 --
// the "Euler a" / "Euler" ladder of k-diffusion and AUTOMATIC1111.
int dc_sd_sigmas_uniform(const dc_schedule *s, int n, double *out);

// The diffusers scheduler classes whose ladders the samplers walk.
typedef enum { DC_SCHED_EULER, DC_SCHED_EULER_ANCESTRAL, DC_SCHED_DDIM, DC_SCHED_DPM_MULTISTEP } dc_sd_class;
const char *dc_sd_class_name(dc_sd_class k);  // "EulerDiscreteScheduler" ...

// The ladder of n steps that class k's set_timesteps(n) makes from config c
// (karras: use_karras_sigmas, Euler and DPM-Solver only; prediction: the one
// the model is run with) on schedule s (made by dc_schedule_init_cfg, with
// floor for every class but DDIM):
//   t[n]         the timesteps the model is fed (DDIM and DPM-Solver: integers)
//   sigma[n + 1] sigma[i] the noise level of step i, sigma[i + 1] the one it
//                steps to (the last: 0, or sigma(0) for final_sigmas_type
//                "sigma_min", or the last of the log-linear ladder);
//                DDIM: sigma(t) of each timestep, then that of the step after
//                the last (DDIM steps from t to t - T / n, as diffusers' does
//                whatever the spacing, and past 0 to acp = 1 or acp[0])
//   init         the start noise's scale, x = init randn, in the class's own
//                space: sigma space for the Euler classes (their
//                init_noise_sigma), 1 for DDIM and DPM-Solver (which work on
//                x_t = x_sigma / sqrt(sigma^2 + 1))
// A timestep outside [0, T) is refused (diffusers' DDIM fails on it, Euler
// clamps: "leading" with steps_offset 1 and n = T).
int dc_sd_ladder(const dc_schedule *s, const dc_sd_sched_cfg *c, dc_sd_class k, bool karras,
                 dc_prediction prediction, int n, double *t, double *sigma, double *init);
