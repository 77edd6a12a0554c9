// GaussianDiffusion's samplers (guided-diffusion's, which ADM and DiT's
// sample.py run): the ancestral DDPM (p_sample, with a learned or fixed
// variance) and DDIM plans on a respaced schedule made from betas, run by the
// one sampling loop (sampler.h) as its other plan makers' are (ksampler.h,
// flow.h).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/op_math.h"
#include "diffusion/sampler.h"
#include "diffusion/schedule.h"

// The sampling plan on s (sampler.h): step i runs spaced step k = n-1-i with
// the backend's sampler_step (DC_UPDATE_DIT) and the record of
// dc_schedule_step_coef, the model fed the original timestep timestep[k]
// (_WrappedModel), its noise keyed k. DiT's DDIM stays this op rather than
// the affine DDIM of the other plans: its float operations differ, and so
// would the samples.
int dc_schedule_plan(const dc_schedule *s, dc_step_kind kind, double eta, bool learn_sigma,
                     dc_sample_plan *plan);

// create_diffusion(str(steps)), p_sample_loop (or ddim_sample_loop) with
// clip_denoised=False and forward_with_cfg when guidance is on: the sampler
// of models trained with the learned-sigma objective (diffusion/training_loss.h).
typedef struct {
    int steps;            // respaced sampling steps (official default 250)
    dc_step_kind kind;    // DC_STEP_DDPM (ancestral, p_sample) or DC_STEP_DDIM
    float eta;            // DDIM only: 0 deterministic, 1 DDPM-like noise
    float cfg_scale;      // classifier-free guidance; <= 1 means none (batch not doubled)
    int guided_channels;  // eps channels that get guidance: 0 = all C; 3 = the official
                          // forward_with_cfg quirk (guides channels 0..2 of 4)
    uint64_t seed;
    bool learn_sigma;     // model outputs 2C channels (eps, v); else C with FIXED_LARGE variance
    int null_class;       // class labels: the null label (num_classes in DiT)
    int ctx_len, ctx_dim; // text (ctx_len > 0): embeddings of [ctx_len, ctx_dim] per image,
    dc_buf null_ctx;      // and the unconditional one [ctx_len, ctx_dim] (e.g. of ""), on the backend
    bool x_given;         // x already holds the start noise: skip drawing it
} dc_gaussian_sampler_opts;

// 250 DDPM steps, no guidance, learned sigma, seed 0, null class 1000.
dc_gaussian_sampler_opts dc_gaussian_sampler_opts_default(void);

// The GaussianDiffusion sampler: the respaced schedule's plan (dc_schedule_plan) on the
// loop, for batches up to max_batch of C x H x W images.
int dc_gaussian_sampler_init(dc_sampler *s, dc_backend *be, const dc_gaussian_sampler_opts *opt, int C, int H,
                        int W, int max_batch);
