// Samplers of latent diffusion (Stable Diffusion), independent of the model:
// DDIM, Euler, Euler ancestral and DPM++ 2M, with classifier-free guidance on
// text embeddings and a negative prompt, for epsilon- or v-predicting
// discrete-time models on the schedule a diffusers scheduler config gives
// (sd_schedule.h).
//
// Each runs the ladder of the diffusers class of its name, made from the
// config as that class's from_config and set_timesteps make it
// (dc_sd_ladder): timesteps, sigmas and start noise equal diffusers' for the
// same config and number of steps.
//   ddim             DDIMScheduler (step as DDIMScheduler.step; eta as there)
//   euler            EulerDiscreteScheduler
//   euler_a          EulerAncestralDiscreteScheduler
//   dpmpp_2m         DPMSolverMultistepScheduler (dpmsolver++, order 2, midpoint)
//   dpmpp_2m_karras  the same with use_karras_sigmas
// The updates of Euler, Euler a and DPM++ 2M are k-diffusion's sample_euler (no
// churn), sample_euler_ancestral (eta 1, s_noise 1) and sample_dpmpp_2m, which
// those classes compute too, over the model wrapped as k-diffusion's
// DiscreteEpsDDPMDenoiser / DiscreteVDDPMDenoiser (external.py): the model
// sees c_in x = x / sqrt(sigma^2 + 1) at the ladder's timestep, and
// denoised = x - sigma eps, or for v: x / (sigma^2 + 1) - sigma v / sqrt(sigma^2 + 1).
// x lives in sigma space (x = x_t sqrt(sigma^2 + 1)) for the k-samplers, so
// DPM-Solver's start x_t = randn is x = sqrt(sigma_0^2 + 1) randn here, and its
// result at a last sigma above 0 is scaled back to x_t. DPM++ 2M takes a first
// order step first and, as DPMSolverMultistepScheduler does, last (when
// lower_order_final with fewer than 15 steps, euler_at_final, or a last sigma
// of 0).
// Given a ladder of sigmas (opts.sigmas), the k-samplers run it as k-diffusion
// does (AUTOMATIC1111's "Euler a", "Euler", "DPM++ 2M Karras" with
// get_sigmas / get_sigmas_karras): t = sigma_to_t(sigma) (log-sigma
// interpolation), x = sigmas[0] randn, DPM++ 2M first order only first and
// into sigma 0.
// Guidance u + scale (c - u) on the model output equals AUTOMATIC1111's on the
// denoised values: denoised is affine in the output with the same coefficients.
//
// Every step is one affine update of the sampling loop (sampler.h):
//   denoised = dx x + de out           (out: the guided model output, eps or v)
//   x'       = ax x + ad denoised + ao old_denoised + an z
// composed from the backend's q_sample (a p + s q) and axpy ops; its noise
// is keyed by the step's index in sampling order (0-based, skipped steps
// counted).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "diffusion/sampler.h"
#include "diffusion/sd_schedule.h"
#include "models/model.h"

typedef enum { DC_KS_DDIM, DC_KS_EULER, DC_KS_EULER_A, DC_KS_DPMPP_2M } dc_ks_kind;

typedef struct {
    dc_ks_kind kind;
    int steps;
    bool karras;            // Euler, DPM++ 2M: Karras sigmas (use_karras_sigmas)
    float eta;              // DDIM only
    const dc_sd_sched_cfg *sched;  // the scheduler config (NULL: Stable Diffusion's, dc_sd_sched_cfg_default)
    const double *sigmas;   // NULL, or the k-samplers' ladder to run as k-diffusion does ([steps + 1],
                            // descending; then neither sched's spacing nor karras is read)
    dc_prediction prediction;
    float cfg_scale;        // guidance when != 1: out = u + scale (c - u)
    uint64_t seed;
    int ctx_len, ctx_dim;   // the text embeddings the model reads, [ctx_len, ctx_dim] per image
    dc_buf null_ctx;        // the negative prompt's (or ""'s) embedding, on the backend
    bool x_given;           // x already holds the start noise (unscaled randn): skip drawing it
    bool graph;             // eval issues backend ops only (no uploads, downloads or syncs): the
                            // model's part of a step (guided input, eval, guidance) is recorded
                            // on the second step as a graph and replayed, where the backend has
                            // graphs (about 1500 launches a UNet step become one)
    int skip;               // img2img: the first `skip` steps of the plan are not run. x holds
                            // the clean latents, which get the start noise at the level of step
                            // `skip` (k-samplers: x + sigma z; DDIM: sqrt(acp) x + sqrt(1-acp) z,
                            // diffusers' add_noise), z the start noise of each sample; DPM++ 2M
                            // treats step `skip` as its first (AUTOMATIC1111 and diffusers run
                            // the tail of the ladder the same way).
} dc_ksampler_opts;

// Euler a, 20 steps, epsilon, guidance 7.5, SD 1.x text embeddings (77 x 768).
dc_ksampler_opts dc_ksampler_opts_default(void);
const char *dc_ks_kind_name(dc_ks_kind k);

// The dc_sd_class whose ladder sampler k runs.
dc_sd_class dc_ks_class(dc_ks_kind k);

// The plan of a whole run on schedule s (dc_schedule_init_cfg of opt's
// config, with floor but for DDIM): steps[n] for n = opt->steps and the start
// noise's scale (*init_sigma: in sigma space for the k-samplers, 1 for DDIM).
int dc_ksampler_plan(const dc_schedule *s, const dc_ksampler_opts *opt, dc_sample_step *steps,
                     double *init_sigma);

// The sampler of opt on the loop: the SD schedule of opt's config, its plan,
// and the scratch for batches up to max_batch of C x H x W latents. Run it
// with dc_sampler_run (opt.ctx_len x opt.ctx_dim embeddings), free it with
// dc_sampler_free.
int dc_ksampler_init(dc_sampler *s, dc_backend *be, const dc_ksampler_opts *opt, int C, int H,
                     int W, int max_batch);
