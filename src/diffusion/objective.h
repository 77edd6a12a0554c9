// The training objective of a model that predicts the noise, v or the clean
// sample on a discrete schedule, as diffusers' train_text_to_image.py and
// kohya's scripts train Stable Diffusion: a mean squared error against the
// prediction's target, each sample weighed by Min-SNR-gamma (optional), with
// the noise offset (optional) added to the noise. DiT's objective, the
// learned-sigma hybrid of GaussianDiffusion, is training_loss.h's.
//
//   t      ~ U{0 .. T-1}                               dc_diffusion_draw_timesteps
//   eps    = randn + noise_offset randn(B, C, 1, 1)
//   x_t    = sqrt(acp_t) x0 + sqrt(1 - acp_t) eps
//   target = eps (epsilon), sqrt(acp_t) eps - sqrt(1 - acp_t) x0 (v), x0 (sample)
//   snr_t  = acp_t / (1 - acp_t)
//   w_t    = min(snr_t, gamma) / snr_t (epsilon), / (snr_t + 1) (v), min(snr_t, gamma) (sample); 1 without gamma
//   loss   = mean_b w_b mean((out_b - target_b)^2)
//
// Every draw is keyed by (seed, key = the sample's place in the global batch,
// step), so a batch gives the same numbers however it is cut into
// micro-batches or spread over ranks:
//   eps element j of sample b:   randn(seed, keys[b], step, DC_STREAM_TRAIN_NOISE, j)
//   offset of channel c of b:    randn(seed, keys[b], step, DC_STREAM_NOISE_OFFSET, c)
#pragma once
#include <stdint.h>
#include "backend/backend.h"
#include "diffusion/schedule.h"
#include "models/model.h"

typedef struct {
    dc_prediction prediction;  // DC_PRED_EPS, DC_PRED_V or DC_PRED_SAMPLE
    float min_snr_gamma;       // > 0: Min-SNR weighting with this gamma (5 recommended); 0: none
    float noise_offset;        // > 0: diffusers' and kohya's noise offset (0.1 is common); 0: none
} dc_mse_objective;

// Checks the prediction and that gamma and the offset are finite and >= 0.
int dc_mse_objective_validate(const dc_mse_objective *o);

// One micro-batch's inputs and targets, for x0[B, C, HW] and host timesteps
// t[B] (indices of s, a discrete schedule of T steps): eps, xt and target
// [B, C, HW] on the backend, t_model[B] = s->timestep[t[b]] as floats (skipped
// if NULL), weight[B] on the host. scratch [B, C, HW] F32 holds the offset's
// broadcast (unused without an offset).
int dc_mse_objective_prepare(dc_backend *be, const dc_mse_objective *o, const dc_schedule *s, dc_buf xt,
                             dc_buf eps, dc_buf target, dc_buf t_model, float *weight, dc_buf x0, dc_buf scratch,
                             const int *t, const uint32_t *keys, int B, int C, int64_t HW, uint64_t seed,
                             uint32_t step);

// losses[B, 2] = (w_b mse_b, 0) and dout[B, C, HW] = grad_scale w_b d mse_b /
// d out (each skipped if NULL), mse_b the mean of (out_b - target_b)^2 over
// its C HW elements; grad_scale = 1 / (global batch) gives the gradient of the
// batch mean.
int dc_mse_objective_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf target,
                          const float *weight, int B, int C, int64_t HW, float grad_scale);
