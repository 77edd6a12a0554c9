// Rectified flow (flow matching), the continuous-time family of text-to-video
// DiTs (SD3, Flux, Wan, HunyuanVideo): the data x0 and the noise n are joined
// by a straight line,
//   x_sigma = (1 - sigma) x0 + sigma n,   sigma in [0, 1],
// and the model predicts its velocity v = dx/dsigma = n - x0. Sampling walks
// sigma from 1 (pure noise) to 0 along the ODE dx/dsigma = v.
//
// The ladder is diffusers' FlowMatchEulerDiscreteScheduler's (without
// dynamic shifting, shift_terminal or Karras sigmas): in __init__
//   sigmas = shift s / (1 + (shift - 1) s),  s = linspace(1, T, T)[::-1] / T,
// whose ends are sigma_max = 1 and sigma_min = shift / (T + shift - 1); then
// set_timesteps(n):
//   t = linspace(sigma_max T, sigma_min T, n); s = t / T;
//   sigma = shift s / (1 + (shift - 1) s) (the shift applied once more, as
//   there); timesteps = sigma T; sigmas = [sigma, 0].
// diffusers keeps these in float32, the engine in float64.
// Its step is the Euler step x' = x + (sigma_next - sigma) v.
// The schedule (dc_schedule_init_flow, schedule.h) holds __init__'s sigmas,
// ascending (sigmas[k] that of training timestep k + 1); T is
// num_train_timesteps, and the model is fed t = T sigma.
#pragma once
#include "backend/backend.h"
#include "diffusion/sampler.h"
#include "diffusion/schedule.h"

// shift sigma / (1 + (shift - 1) sigma): the time shift of SD3 (and of
// diffusers' class), which maps [0, 1] onto itself. A shift above 1 spends
// more of the steps at high noise.
double dc_flow_shift(double shift, double sigma);

// The ladder of n steps on flow schedule s: t[n] (fed to the model) and
// sigma[n + 1] (the last 0).
int dc_flow_ladder(const dc_schedule *s, int n, double *t, double *sigma);

// The flow Euler sampler's plan of n steps (sampler.h): start x = randn (at
// sigma 1), the model fed c_in x = x at t, and per step the affine update with
// d = out (the velocity) and x' = x + (sigma_next - sigma) d. Its noise is
// the start noise alone.
int dc_flow_plan(const dc_schedule *s, int n, dc_sample_plan *plan);

// What a flow model trains on, for B samples of n elements with noise levels
// sigma[B] (host): the model input xt = (1 - sigma) x0 + sigma noise and the
// velocity target v = noise - x0 (both on the backend, neither aliasing x0 or
// noise).
int dc_flow_training_pair(dc_backend *be, dc_buf xt, dc_buf v, dc_buf x0, dc_buf noise, const float *sigma,
                          int B, int64_t n);
