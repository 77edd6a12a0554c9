// The sampling loop of the engine, the only one: independent of the model (a
// callback gives the model output for a batch) and of the diffusion family (a
// plan of per-step host records says what each step does with that output).
//
// Where a new piece goes:
//   a schedule (noise levels)   schedule.h  DiT's GaussianDiffusion (betas, respacing)
//                               sd_schedule.h  diffusers' discrete 1000-step schedules
//                               flow.h      rectified flow (continuous sigma in [0, 1], shift)
//   a sampler                   a plan maker: dc_schedule_plan (gaussian.c: DiT's DDPM and
//                               DDIM), dc_ksampler_plan (ksampler.c: SD's DDIM, Euler,
//                               Euler a, DPM++ 2M), dc_flow_plan (flow.c: flow Euler).
//                               Its steps are affine updates; a new update kind is needed
//                               only where the update is not affine in the model output
//                               (DiT's learned variance is such a one).
//   the loop                    here, dc_sampler_run.
//
// Per step i of the plan (from plan.skip to plan.n - 1):
//   input:  xin = c_in x (with guidance twice: [xin; xin])
//   model:  out = model(xin, t, cond), or with guidance model([xin; xin], t, [cond; null])
//           and out = u + scale (c - u) on the guided channels (cfg_combine)
//   update: DC_UPDATE_AFFINE  d = dx x + de out
//                             x = ax x + ad d + ao d_prev + an z   (d_prev: the last step's d)
//           DC_UPDATE_DIT     the backend's sampler_step with the step's dc_step_coef: the
//                             official DiT p_sample (learned or fixed variance) or ddim_sample
// As in the official forward_with_cfg, only the conditional half is carried:
// each step rebuilds [xin; xin] from x.
//
// Noise is keyed per sample, never per batch position, so a seed gives the
// same image whatever the batch size or the order of the batch:
//   start x of sample i: randn(seed, key = i, step = DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START)
//     (img2img: the noise added to the clean latents)
//   z of a step:         randn(seed, key = i, step = the step's noise_key, DC_STREAM_NOISE)
// where noise_key is, as each family always keyed it, DiT's spaced step k
// (counting down from steps-1; its last step, k = 0, adds no noise) and for
// the others the step's 0-based index in sampling order.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "backend/op_math.h"
#include "models/model.h"

#define DC_SAMPLE_START_STEP 0xFFFFFFFFu

typedef enum { DC_UPDATE_AFFINE, DC_UPDATE_DIT } dc_update_kind;

// One step of a plan, host scalars (float64; cast to float when an op reads them).
typedef struct {
    dc_update_kind update;
    double sigma, sigma_next;  // the noise level of the step and of the one it steps to (x = x0 + sigma
                               // eps in the variance-exploding view; flow: x = (1 - sigma) x0 + sigma
                               // noise); DDIM: sigma of t (inf at zero SNR)
    double t;                  // the timestep the model is fed
    double c_in;               // the model's input is c_in x
    double dx, de;             // DC_UPDATE_AFFINE: d = dx x + de out
    double ax, ad, ao, an;     //   x' = ax x + ad d + ao d_prev + an z
    bool noise;                // draw z this step
    uint32_t noise_key;        // z's step key (see above)
    dc_step_coef dit;          // DC_UPDATE_DIT: the backend's record
} dc_sample_step;

// A whole run.
typedef struct {
    int n;                     // steps
    dc_sample_step *step;      // [n], owned (dc_sample_plan_free)
    double init_sigma;         // start x = init_sigma randn
    int skip;                  // img2img: steps 0..skip-1 are not run; x holds clean latents, which
    double start_a, start_b;   // become start_a x + start_b z (z the start noise), the noise level of
                               // step `skip`
    bool keeps_d;              // some update reads d_prev (a multistep method)
} dc_sample_plan;

// A plan of n steps, every one zero. 0 or -1 (message set).
int dc_sample_plan_init(dc_sample_plan *p, int n);
void dc_sample_plan_free(dc_sample_plan *p);

// out[B, OC, H, W] = model(x[B, C, H, W], t[B] float timesteps, cond of B
// rows), all on the backend; x is read-only. Returns 0 or -1 (message set).
typedef int (*dc_eval_fn)(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B);
// The model's work that depends on the condition alone (a UNet's keys and
// values of the text), done once a run before its first step, on cond as the
// steps read it (B rows); with cond NULL, after the last step: forget it. 0
// or -1 (message set).
typedef int (*dc_prepare_fn)(void *ctx, const dc_cond *cond, int B);
// Called after each step with step = 1..total (the steps run).
typedef void (*dc_sample_progress_fn)(void *ctx, int step, int total);

// How the loop runs the model, whatever the plan.
typedef struct {
    bool guide;           // classifier-free guidance (the batch doubled)
    float cfg_scale;      // out = u + cfg_scale (c - u)
    int guided_channels;  // output channels that get guidance: 0 = the first C (the prediction)
    // The unconditional half of guidance, as the model is conditioned:
    int null_class;       // class labels (ctx_len == 0): the null label
    int ctx_len, ctx_dim; // text (ctx_len > 0): embeddings of [ctx_len, ctx_dim] per image,
    dc_buf null_ctx;      // and the unconditional one [ctx_len, ctx_dim] on the backend
    bool pairs;           // tell the model that the guided halves share x and t (dc_cond.pairs)
    bool graph;           // eval issues backend ops only (no uploads, downloads or syncs): the
                          // model's part of a step is recorded on the second step as a graph
                          // and replayed, where the backend has graphs
    uint64_t seed;
    bool x_given;         // x already holds the start noise (unscaled randn): skip drawing it
} dc_sample_setup;

typedef struct {
    dc_backend *be;
    dc_sample_setup set;
    dc_sample_plan plan;
    int C, H, W, OC, max_batch;
    int guided;         // channels guided (resolved from set.guided_channels)
    dc_buf xin;         // [rows, C, H, W] the model's input (rows = 2 max_batch with guidance)
    dc_buf out;         // [rows, OC, H, W] model output
    dc_buf comb;        // [max_batch, OC, H, W] guided output (guidance only)
    dc_buf d, d_prev;   // [max_batch, C, H, W] the affine update's d, this step's and the last's
    dc_buf z;           // [max_batch, C, H, W] step noise
    dc_buf t;           // [rows] F32 model timesteps
    dc_buf y;           // [rows] I32 labels (label conditioning)
    dc_buf ctx;         // [rows, L, D] embeddings (text conditioning)
    dc_cond cond;       // what the model sees: y or ctx, staged from the caller's each run
    float *t_host;      // [rows] host staging for t
    int32_t *y_host;    // [max_batch] null labels, the unconditional half
    float *ca, *cb;     // [max_batch] per-sample coefficients for q_sample
    void *graph;        // the recorded model call (set.graph), kept across runs while valid
    int graph_B;        // the batch it was recorded at
} dc_sampler;

// A sampler that runs `plan` (taken over: freed with the sampler, also on
// failure) for batches up to max_batch of C x H x W images, the model giving
// OC channels; allocates all scratch once.
int dc_sampler_init_plan(dc_sampler *s, dc_backend *be, const dc_sample_setup *set, dc_sample_plan *plan,
                         int C, int H, int W, int OC, int max_batch);
void dc_sampler_free(dc_sampler *s);

// Samples B images into x[B, C, H, W] (backend) conditioned on cond (B rows
// on the backend: labels, or embeddings when set.ctx_len > 0) whose global
// sample indices are idx[B] (host; they key all the noise). With guidance
// the model sees [cond; null] (set.null_class or set.null_ctx). prepare (may
// be NULL) runs once after the condition is staged; progress may be NULL.
// Fails as soon as the backend reports an error (checked after every step,
// without waiting for the device).
int dc_sampler_run(dc_sampler *s, dc_buf x, const dc_cond *cond, const uint32_t *idx, int B,
                   dc_eval_fn eval, dc_prepare_fn prepare, void *ctx, dc_sample_progress_fn progress,
                   void *pctx);

// The text half of guidance: copies cond's B embeddings [B, len, dim] into dst,
// then, if guide, B copies of the unconditional embedding null_ctx after them
// ([cond; null]). Fails, naming both, if cond's shape or dtype is not dst's.
int dc_stage_text_cond(dc_backend *be, dc_buf dst, const dc_cond *cond, dc_buf null_ctx, int len,
                       int dim, int B, bool guide);
