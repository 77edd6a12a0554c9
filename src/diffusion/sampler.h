// Sampling loop, independent of the model: a callback gives the model output
// for a batch, the backend ops do the rest. It is the official DiT sample.py
// path: create_diffusion(str(steps)), p_sample_loop (or ddim_sample_loop)
// with clip_denoised=False and forward_with_cfg when guidance is on.
//
// Noise is keyed per sample, never per batch position, so a seed gives the
// same image whatever the batch size or the order of the batch:
//   start x of sample i: randn(seed, key = i, step = DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START)
//   z of spaced step k:  randn(seed, key = i, step = k, DC_STREAM_NOISE)
// (k counts down from steps-1; the last step, k = 0, adds no noise.)
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "diffusion/schedule.h"
#include "models/model.h"

#define DC_SAMPLE_START_STEP 0xFFFFFFFFu

// out[B, OC, H, W] = model(x[B, C, H, W], t[B] float original timesteps,
// cond of B rows), all on the backend; x is read-only (it may be the
// sampler's state). Returns 0 or -1 (message set).
typedef int (*dc_eval_fn)(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B);
// The model's work that depends on the condition alone (a UNet's keys and
// values of the text), done once a run before its first step, on cond as the
// steps read it (B rows); with cond NULL, after the last step: forget it. 0
// or -1 (message set).
typedef int (*dc_prepare_fn)(void *ctx, const dc_cond *cond, int B);
// Called after each step with step = 1..total.
typedef void (*dc_sample_progress_fn)(void *ctx, int step, int total);

typedef struct {
    int steps;            // respaced sampling steps (official default 250)
    dc_step_kind kind;    // DC_STEP_DDPM (ancestral, p_sample) or DC_STEP_DDIM
    float eta;            // DDIM only: 0 deterministic, 1 DDPM-like noise
    float cfg_scale;      // classifier-free guidance; <= 1 means none (batch not doubled)
    int guided_channels;  // eps channels that get guidance: 0 = all C; 3 = the official
                          // forward_with_cfg quirk (guides channels 0..2 of 4)
    uint64_t seed;
    bool learn_sigma;     // model outputs 2C channels (eps, v); else C with FIXED_LARGE variance
    // The unconditional half of guidance, as the model is conditioned:
    int null_class;       // class labels: the null label (num_classes in DiT)
    int ctx_len, ctx_dim; // text (ctx_len > 0): embeddings of [ctx_len, ctx_dim] per image,
    dc_buf null_ctx;      // and the unconditional one [ctx_len, ctx_dim] (e.g. of ""), on the backend
    bool x_given;         // x already holds the start noise: skip drawing it
} dc_sampler_opts;

// 250 DDPM steps, no guidance, learned sigma, seed 0, null class 1000.
dc_sampler_opts dc_sampler_opts_default(void);

typedef struct {
    dc_backend *be;
    dc_sampler_opts opt;
    dc_schedule sched;  // the respaced process (opt.steps steps of the 1000-step one)
    int C, H, W, OC, max_batch;
    bool cfg;           // opt.cfg_scale > 1
    int guided;         // channels guided (resolved from opt.guided_channels)
    dc_buf xin;         // [2*max_batch, C, H, W] x duplicated for guidance (cfg only)
    dc_buf out;         // [(cfg ? 2 : 1) * max_batch, OC, H, W] model output
    dc_buf comb;        // [max_batch, OC, H, W] guided output (cfg only)
    dc_buf z;           // [max_batch, C, H, W] step noise
    dc_buf t;           // [(cfg ? 2 : 1) * max_batch] F32 model timesteps
    dc_buf y;           // [(cfg ? 2 : 1) * max_batch] I32 labels (label conditioning)
    dc_buf ctx;         // [(cfg ? 2 : 1) * max_batch, L, D] embeddings (text conditioning)
    dc_cond cond;       // what the model sees: y or ctx, rebuilt from the caller's each run
    float *t_host;      // host staging for t
    int32_t *y_host;    // [max_batch] null labels, the unconditional half
    void *graph;        // the model's part of a step, recorded for the current run
                        // (backends with graphs)
} dc_sampler;

// Builds the respaced schedule and allocates all scratch once for batches up
// to max_batch of C x H x W images.
int dc_sampler_init(dc_sampler *s, dc_backend *be, const dc_sampler_opts *opt, int C, int H,
                    int W, int max_batch);
void dc_sampler_free(dc_sampler *s);

// Samples B images into x[B, C, H, W] (backend) conditioned on cond (B rows
// on the backend: labels, or embeddings when opt.ctx_len > 0) whose global
// sample indices are idx[B] (host; they key all the noise). With guidance
// the model sees [cond; null] (opt.null_class or opt.null_ctx).
// progress may be NULL. Fails as soon as the backend reports an error
// (checked after every step, without waiting for the device).
int dc_sampler_run(dc_sampler *s, dc_buf x, const dc_cond *cond, const uint32_t *idx, int B,
                   dc_eval_fn eval, void *ctx, dc_sample_progress_fn progress, void *pctx);

// Runs fn(arg), the model's part of a sampling step: directly where `record`
// is off, where the backend has no graphs, or on a run's first step when
// there is no graph yet (that call also warms the model's and the backend's
// caches); otherwise through *graph, recorded on the first call after that
// and replayed. The call's buffers, batch and model stay the same for the
// whole run, and for every later run that is given the same *graph.
int dc_sample_step_recorded(dc_backend *be, void **graph, bool record, bool first, int (*fn)(void *), void *arg);
// The text half of guidance: copies cond's B embeddings [B, len, dim] into dst,
// then, if guide, B copies of the unconditional embedding null_ctx after them
// ([cond; null]). Fails, naming both, if cond's shape or dtype is not dst's.
int dc_stage_text_cond(dc_backend *be, dc_buf dst, const dc_cond *cond, dc_buf null_ctx, int len,
                       int dim, int B, bool guide);
