// The diffusion side of one DiT training step (GaussianDiffusion.training_losses
// with LEARNED_RANGE variance and LossType.MSE, as the official train.py runs it):
//
//   t    ~ U{0 .. n-1}                        dc_diffusion_draw_timesteps
//   eps  ~ N(0, I); x_t = q_sample(x0, t, eps)  dc_diffusion_prepare_batch
//   out  = model(x_t, timestep[t], y)          (the caller)
//   loss = mean_b (mse_b + vb_b) and d loss / d out   dc_diffusion_loss
//
// Every random draw is keyed by (seed, key = the sample's index in the global
// batch, step = training step), so a batch gives the same numbers however it
// is split over micro-batches or GPUs.
#pragma once
#include <stdint.h>
#include "backend/backend.h"
#include "diffusion/schedule.h"

// t[b] uniform on [0, n_steps) (torch.randint in train.py), from Philox stream
// DC_STREAM_TIMESTEP keyed by (seed, keys[b], step): Lemire's multiply-shift
// with rejection over the block's words, so it is exactly uniform.
void dc_diffusion_draw_timesteps(int *t, const uint32_t *keys, int B, int n_steps, uint64_t seed,
                                 uint32_t step);

// For x0[B, n] and host timesteps t[B] (step indices of s; s is the training
// schedule, dc_schedule_init_gaussian(s, 1000, 1000)):
//   eps[B, n]    = randn keyed (seed, keys[b], step, DC_STREAM_TRAIN_NOISE)
//   xt[B, n]     = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps
//   t_model[B]   = float(s->timestep[t[b]]), the model's timestep input (skipped if NULL)
//   coef[B]      = dc_schedule_loss_coef(s, t[b]) (host), for dc_diffusion_loss
int dc_diffusion_prepare_batch(dc_backend *be, const dc_schedule *s, dc_buf xt, dc_buf eps,
                               dc_buf t_model, dc_loss_coef *coef, dc_buf x0, const int *t,
                               const uint32_t *keys, int B, int64_t n, uint64_t seed,
                               uint32_t step);

// For the model output out[B, OC, HW] (eps_hat then, with learned sigma, v;
// OC = 2C, or OC = C for an epsilon-only model whose vb is 0):
//   losses[B, 2] = (mse_b, vb_b) on the backend (skipped if NULL)
//   dout[B, OC, HW] = grad_scale * d(mse_b + vb_b) / d out (skipped if NULL);
//   grad_scale = 1 / (global batch) gives the gradient of the batch mean.
// If mse_sum / vb_sum are not NULL, losses are downloaded (a sync) and their
// sums over the B samples returned.
int dc_diffusion_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0,
                      dc_buf xt, dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                      int64_t HW, float grad_scale, double *mse_sum, double *vb_sum);
