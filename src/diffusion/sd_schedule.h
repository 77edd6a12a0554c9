// The noise schedule of latent diffusion (Stable Diffusion 1.x / 2.x) and the
// sigma tables the k-diffusion samplers walk, all in float64 on the host.
//
// Schedule ("scaled_linear", diffusers' DDPMScheduler / the LDM configs):
//   betas = linspace(sqrt(beta_start), sqrt(beta_end), T)^2, T = 1000,
//   beta_start 0.00085, beta_end 0.012; alphas_cumprod = cumprod(1 - betas);
//   sigma(t) = sqrt((1 - acp[t]) / acp[t]): x_sigma = x0 + sigma eps is the
//   variance-exploding view of x_t = sqrt(acp) x0 + sqrt(1 - acp) eps
//   (x_sigma = x_t / sqrt(acp)).
// Timestep spacings follow diffusers' set_timesteps; the sigma <-> t maps and
// the Karras sigmas follow k-diffusion (k_diffusion/external.py DiscreteSchedule,
// k_diffusion/sampling.py get_sigmas_karras).
#pragma once

#define DC_SD_TRAIN_STEPS 1000
#define DC_SD_BETA_START 0.00085
#define DC_SD_BETA_END 0.012

typedef struct {
    int T;                   // training steps (1000)
    double *alphas_cumprod;  // [T]
    double *sigmas;          // [T] ascending: sigma(0) = sigma_min ... sigma(T-1) = sigma_max
    double *log_sigmas;      // [T]
} dc_sd_schedule;

// The scaled-linear schedule of T steps from beta_start to beta_end.
int dc_sd_schedule_init(dc_sd_schedule *s, int T, double beta_start, double beta_end);
void dc_sd_schedule_free(dc_sd_schedule *s);
static inline double dc_sd_sigma_min(const dc_sd_schedule *s) { return s->sigmas[0]; }
static inline double dc_sd_sigma_max(const dc_sd_schedule *s) { return s->sigmas[s->T - 1]; }

// diffusers' timestep_spacing, for n inference steps of T (descending, out[n]):
//   LEADING  (SD 1.x/2.x DDIM/PNDM configs): t_k = k * (T / n) + offset, k = n-1..0,
//            T / n an integer division (steps_offset = 1 in those configs);
//   TRAILING: round(T - k * T / n) - 1 for k = 0..n-1 (float stride, numpy round);
//   LINSPACE: round(linspace(0, T - 1, n)) reversed (numpy round: half to even).
// (diffusers applies steps_offset to LEADING only; `offset` is ignored by the others.)
typedef enum { DC_SPACING_LEADING, DC_SPACING_TRAILING, DC_SPACING_LINSPACE } dc_spacing;
int dc_sd_timesteps(int T, int n, dc_spacing spacing, int offset, int *out);

// k-diffusion DiscreteSchedule.sigma_to_t: the fractional timestep of sigma by
// linear interpolation in log sigma between the two neighbouring training
// sigmas (clamped to [0, T-1]).
double dc_sd_sigma_to_t(const dc_sd_schedule *s, double sigma);
// DiscreteSchedule.t_to_sigma: exp of the log-sigma interpolated at fractional t.
double dc_sd_t_to_sigma(const dc_sd_schedule *s, double t);

// Sigma ladders of n steps, out[n + 1] with out[n] = 0 (descending):
// k-diffusion get_sigmas_karras(n, sigma_min, sigma_max, rho = 7):
//   (smax^(1/rho) + i / (n - 1) (smin^(1/rho) - smax^(1/rho)))^rho, i = 0..n-1;
// (n == 1 gives smax, as torch.linspace(0, 1, 1) = [0].)
int dc_sd_sigmas_karras(int n, double sigma_min, double sigma_max, double rho, double *out);
// DiscreteSchedule.get_sigmas(n): t_to_sigma(linspace(T - 1, 0, n)), then 0 --
// the "Euler a" / "Euler" ladder of AUTOMATIC1111 without Karras.
int dc_sd_sigmas_uniform(const dc_sd_schedule *s, int n, double *out);
