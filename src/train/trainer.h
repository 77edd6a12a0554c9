// Training a diffusion model (any dc_model) with the official DiT objective:
// AdamW, optional warmup and gradient clipping, gradient accumulation up to a
// global batch, EMA.
//
// Every random choice is a pure function of the seed and the image's place:
// the data order of (seed, epoch), and flips, label dropout, timesteps and
// noise of (seed, index in the global batch, step). With the weights, EMA and
// AdamW moments in a checkpoint, that makes resuming exact.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "diffusion/schedule.h"
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "dist/comm.h"
#include "train/data.h"

typedef struct {
    int steps;            // optimizer steps of the whole run
    int batch;            // global batch: images per optimizer step
    int micro_batch;      // images per forward/backward (gradient accumulation)
    float lr, beta1, beta2, adam_eps, weight_decay;
    int warmup;           // steps of linear lr warmup (0: none)
    float grad_clip;      // max global gradient norm (0: no clipping)
    float ema_decay;
    float class_dropout;  // probability of replacing a label by the null class
    bool hflip;           // random horizontal flips
    uint64_t seed;
} dc_train_config;

// The official DiT recipe (lr 1e-4, betas 0.9/0.999, no decay, EMA 0.9999,
// batch 256, dropout 0.1).
dc_train_config dc_train_config_default(void);
// Checks every setting is finite and in range; also that lr * weight_decay
// < 1, since decoupled decay scales each weight by 1 - lr * wd per step and
// at 1 or more wipes out or flips the sign of every weight.
int dc_train_config_validate(const dc_train_config *c);
int dc_train_config_to_kv(const dc_train_config *c, dc_kv *kv);
int dc_train_config_from_kv(dc_train_config *c, const char *const *keys,
                            const char *const *values, int n, const char *file);

typedef struct {
    double loss, mse, vb;  // means over the step's images
    double grad_norm;      // global L2 norm before clipping
    float lr;
} dc_step_stats;

typedef struct {
    dc_train_config cfg;
    dc_model *model;
    dc_backend *be;
    const dc_dataset *data;
    dc_order order;
    dc_schedule sched;
    dc_buf ema, adam_m, adam_v;  // [numel] F32, same layout as the parameters
    int64_t step;                // optimizer steps done
    int64_t samples_seen;        // images consumed (the data position)
    // one micro-batch on the backend
    dc_buf x0, xt, eps, out, dout;  // [mb, C, H, W] (out, dout: [mb, OC, H, W])
    dc_buf losses;                  // [batch, 2] (mse, vb) of the last step
    dc_buf gstats;                  // [2] its gradient norm and clipping factor
    float last_lr;
    bool allow_data_change;         // restore: accept a data set whose fingerprint differs
    dc_comm *comm;                  // several ranks (data parallel), or NULL: one
    dc_buf t, y;                    // [mb] float timesteps, int32 labels
    dc_cond cond;                   // the micro-batch's conditioning (labels y)
    // host staging
    float *h_x0;
    int *h_t;
    int32_t *h_y;
    uint32_t *h_keys;
    dc_loss_coef *h_coef;
    float *h_losses;
} dc_trainer;

// Sets up training of `model` (created with gradients) on `data`; the EMA
// starts as an exact copy of the weights, the moments at zero. Models
// conditioned on class labels train with label dropout to the null label.
int dc_trainer_init(dc_trainer *tr, dc_model *model, const dc_dataset *data,
                    const dc_train_config *cfg);
// Data parallel over comm's ranks (before the first step; each rank has its
// own trainer, model replica and backend, the same config and seed). Rank r
// runs its part of every global batch (dc_batch_split), micro_batch images
// at a time, with the randomness of each image's place in the global batch,
// so the run does not depend on the rank count (to float rounding; bit for
// bit where the shares group the sums as one rank's micro-batches do, the
// thread counts are fixed and the BLAS sums each product from zero); the
// gradients and losses are
// summed over ranks and every rank takes the same AdamW and EMA step
// (replicated; the sharded ZeRO stages come next). The thread communicator
// needs the CPU backend, whose buffers are host memory.
int dc_trainer_set_comm(dc_trainer *tr, dc_comm *comm);
void dc_trainer_free(dc_trainer *tr);
// One optimizer step over cfg.batch images. With stats NULL it only queues
// work on the backend (no waiting); otherwise it also reads the step's
// statistics, as dc_trainer_stats.
int dc_trainer_step(dc_trainer *tr, dc_step_stats *stats);
// Waits for the last step and reads its losses and gradient norm; fails if
// either has become NaN or infinite (the run diverged by that step).
int dc_trainer_stats(dc_trainer *tr, dc_step_stats *stats);

// Checkpoints: raw weights under the official keys, EMA under "ema.<key>",
// AdamW moments as "train.adam_m" / "train.adam_v", and model config,
// training config, position (step, samples_seen) and the data set's
// fingerprint ("data_fingerprint", 16 hex digits) in __metadata__, with
// "format" = "diffusion.c checkpoint v2" and checksums (io/safetensors.h).
// Written atomically. `extra` adds metadata (may be NULL). Refuses, naming
// the tensor and element, to write a NaN or infinity in any tensor or a
// negative second moment: a diverged run leaves no checkpoint that hides it.
int dc_trainer_save(const dc_trainer *tr, const char *path, const dc_kv *extra);
// Restores EMA, moments and position from a checkpoint whose raw weights
// have already been loaded into the model. Rejects non-finite values (and a
// negative adam_v) naming the tensor and element, and a data set whose
// fingerprint differs from the checkpoint's unless tr->allow_data_change
// (then it warns); a checkpoint without a fingerprint (older) only warns.
int dc_trainer_restore(dc_trainer *tr, const dc_st_file *f);
