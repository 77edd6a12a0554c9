// Training a diffusion model (any dc_model) with the objective of Peebles &
// Xie's official code (eps MSE plus the variational bound of a learned
// variance) where the model learns its variance, otherwise the eps, v or
// sample MSE of diffusers' and kohya's scripts (diffusion/objective.h):
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

#include "diffusion/objective.h"
#include "diffusion/schedule.h"
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "dist/comm.h"
#include "train/batch_cond.h"
#include "train/data.h"
#include "train/offload.h"
#include "train/source.h"
#include "train/optimizer.h"

typedef struct {
    int steps;            // optimizer steps of the whole run
    int batch;            // global batch: images per optimizer step
    int micro_batch;      // images per forward/backward (gradient accumulation)
    float lr, beta1, beta2, adam_eps, weight_decay;
    int warmup;           // steps of linear lr warmup (0: none)
    float grad_clip;      // max global gradient norm (0: no clipping)
    float ema_decay;
    // EMA warm-up (diffusers' EMAModel without use_ema_warmup): the update
    // after optimizer step k (1-based) decays by min(ema_decay, k / (9 + k)),
    // diffusers' (1 + n) / (10 + n) with n = k - 1, so the first update copies
    // the weights and the EMA follows a short run's weights instead of holding
    // on to the initial ones. false: ema_decay from the first step, as the
    // official code of Peebles & Xie does.
    bool ema_warmup;
    float class_dropout;  // probability of replacing a label by the null class
    bool hflip;           // random horizontal flips
    uint64_t seed;
    // The objective of a model without a learned sigma (diffusion/objective.h):
    // its prediction (eps by default, v, sample), Min-SNR gamma and noise
    // offset (0: none). A learned-sigma model (DiT) trains on the hybrid
    // objective of Peebles & Xie, which predicts eps with neither. Written
    // to checkpoints only when not the default, so older ones read as before.
    dc_mse_objective objective;
    // Where the optimizer runs, not part of the recipe (checkpoints do not
    // record it, and a run may resume either way): the fp32 master weights
    // and moments in host memory with AdamW on the CPU, beside the device's
    // backward; the EMA stays on the device (train/offload.h). The model's
    // weights are loaded before dc_trainer_init. One rank only, for now.
    bool offload;
    dc_offload_settings offload_settings;  // how it schedules its work (not recorded either)
    // Update each parameter unit within the backward, as soon as its
    // gradients are done, holding no full gradient buffer (train/optimizer.h:
    // dc_optim_plain's fused mode; two passes a step where it clips). Not
    // part of the recipe either. One rank, the batch in one micro-batch,
    // without offload; the model is best made with DC_GRAD_WINDOW (a full
    // gradient buffer it has is freed).
    bool update_in_backward;
    // How the gradients travel between ranks, also not part of the recipe:
    // DC_F32, or DC_BF16 (half the bytes): each gradient bucket is cast to
    // bf16, summed over ranks in bf16, and cast back to fp32 where the
    // optimizer reads it, so each step's summed gradient carries a bf16
    // rounding (relative 2^-9). With one rank nothing travels and it changes
    // nothing.
    dc_dtype grad_comm;
    // Where a step is one micro-batch on each rank and the optimizer reads
    // the full gradient buffer (plain training, any ranks at ZeRO stage 0),
    // the gradients lie in the model's activation arena, over the bytes its
    // backward is done with (dc_model_ops.lend_grads), when the model can:
    // the same bits in less memory. true keeps them in their own buffer
    // (to compare). Not part of the recipe.
    bool grads_apart;
} dc_train_config;

// Whether the trainer lays the gradients in the model's activation arena
// (unless dc_train_config.grads_apart): for steps of `rounds` micro-batch
// rounds, with an optimizer that lends (dc_optimizer.lends), the planner's
// rule too.
bool dc_trainer_lends(const dc_model *m, bool grads_apart, int rounds, bool optimizer_lends);

// Whether training on `be` folds its micro-batches' gradients in one fixed
// order (dc_optim_plain.fold): the CPU backend.
bool dc_trainer_folds(const dc_backend *be);

// The official recipe of Peebles & Xie (lr 1e-4, betas 0.9/0.999, no decay, EMA 0.9999,
// batch 256, dropout 0.1), with the EMA warm-up: its decay reaches 0.9999 at
// step 89991, after which a run's EMA approaches the official code's by a
// factor 0.9999 a step (e^-31 by step 400K, the paper's length).
dc_train_config dc_train_config_default(void);
// The EMA decay of the update after optimizer step `step` (1-based).
float dc_train_ema_decay(const dc_train_config *c, int64_t step);
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
    dc_source data;             // where the samples come from (the trainer's: it closes it)
    dc_schedule sched;
    // The optimizer strategy holding the master weights, moments and EMA:
    // plain (ZeRO stage 0), ZeRO 1 or 2 (dc_trainer_set_comm), or offload
    // (cfg.offload); train/optimizer.h.
    dc_optimizer *opt;
    int64_t step;                // optimizer steps done
    int64_t samples_seen;        // images consumed (the data position)
    // one micro-batch on the backend
    dc_buf x0, xt, eps, out, dout;  // [mb, C, H, W] (out, dout: [mb, OC, H, W])
    dc_buf target;                  // [mb, C, H, W] the MSE objective's target (NULL for the hybrid)
    dc_buf losses;                  // [batch, 2] (mse, vb) of the last step
    dc_buf gstats;                  // [2] its gradient norm and clipping factor
    float last_lr;
    bool allow_data_change;         // restore: accept a data set whose fingerprint differs
    dc_comm *comm;                  // several ranks (data parallel), or NULL: one
    bool started;                   // a step ran: the ranks are fixed
    dc_buf t;                       // [mb] float timesteps
    dc_batch_cond cond;             // the micro-batch's conditioning, staged from the data (cond.dev)
    // host staging
    float *h_x0;
    int *h_t;
    uint32_t *h_keys;
    dc_loss_coef *h_coef;           // the hybrid's
    float *h_weight;                // [mb] the MSE objective's
    float *h_sample_weight;         // [mb] the source's for each sample (1 unless it weighs them)
    float *h_losses;
} dc_trainer;

// Sets up training of `model` (created with gradients) on `data`, which must
// carry the conditioning the model reads (class labels, or text embeddings
// of the model's length and width); the EMA starts as an exact copy of the
// weights, the moments at zero. Dropout (class_dropout) replaces a label by
// the null label, a caption by the empty prompt.
int dc_trainer_init(dc_trainer *tr, dc_model *model, const dc_dataset *data,
                    const dc_train_config *cfg);
// The same from any data source (train/source.h), which the trainer takes
// over: it closes it in dc_trainer_free, or here on failure. Random flips
// (cfg->hflip) need a source of pictures.
// sched: the schedule the model trains on, also taken over (NULL: DiT's
// linear schedule of 1000 steps; an SD UNet's comes from its scheduler
// config, dc_schedule_init_cfg).
int dc_trainer_init_source(dc_trainer *tr, dc_model *model, dc_source *src, dc_schedule *sched,
                           const dc_train_config *cfg);
// Data parallel over comm's ranks with ZeRO stage zero_stage (0, 1 or 2),
// before the first step of this process (before or after dc_trainer_restore;
// each rank has its own trainer, model replica and backend, the same config
// and seed, and the same weights loaded). The global batch is run in rounds
// of one micro-batch per rank (dc_batch_round: round j's rank r takes the
// next micro_batch images after ranks 0..r-1), each image with the
// randomness of its place in the global batch; the gradients and losses are
// summed over ranks and every rank takes the same AdamW and EMA step.
//
// On the CPU (fold) the sum does not depend on the rank count at all: each
// micro-batch's gradients start from zero, and the step's sum grows by one
// micro-batch at a time in the global batch's order. One rank adds them as
// they come; several ranks sum each round as it ends, rank 0 adding the sum
// so far to its micro-batch and the others following in rank order (stage 0:
// an all-reduce; ZeRO: reduce_scatter_add). So N ranks write one rank's
// checkpoint bit for bit wherever they cut the batch into the same
// micro-batches (a batch that is a multiple of N x micro_batch; one rank
// with micro_batch = batch / N when the ranks take one each) and every rank
// runs the same thread count. The cost: stage 0 keeps a second gradient
// buffer where a rank runs several micro-batches, and several ranks then
// sum once a round instead of once a step. On a GPU micro-batches
// accumulate in place and NCCL sums in its own order: equal to float
// rounding.
//
// Stage 0 replicates AdamW and the EMA. Stages 1 and 2 (train/zero.h) keep
// only this rank's shard of the fp32 master weights, moments and EMA, sum
// the gradients with a reduce-scatter (stage 2: block by block during
// backward, holding no full gradient buffer), clip by the global norm and
// all-gather the updated weights into the compute copy. The weights match
// stage 0 to float rounding: the global norm is combined from the shards'
// norms, so with clipping off they are bit-identical. A stage above 0 on one
// rank runs the sharded code with one shard. The communicator's buffers must
// be where the backend's are: a host-memory communicator (threads) needs the
// CPU backend, a device one (NCCL) a GPU backend. With cfg.grad_comm BF16 on
// several ranks the gradients are summed in bf16 (stage 0 holds a bf16 copy
// of the full gradient buffer for it, ZeRO bf16 copies of its buckets); the
// weights then differ from fp32 sums by the gradients' bf16 rounding, and
// stages 0 and 1 sum once a step (stage 0 after folding each rank's
// micro-batches, stage 1 after accumulating them in place), stage 2 once a
// micro-batch.
int dc_trainer_set_comm(dc_trainer *tr, dc_comm *comm, int zero_stage);
void dc_trainer_free(dc_trainer *tr);
// One optimizer step over cfg.batch images. With stats NULL it only queues
// work on the backend (no waiting; with offload the host does wait for the
// CPU's AdamW of the units the backward handed over, and the next step's
// forward for the rest); otherwise it also reads the step's statistics, as
// dc_trainer_stats.
int dc_trainer_step(dc_trainer *tr, dc_step_stats *stats);
// Finishes what the last step left running on the host (offload's update
// of the last units) and waits for the backend: the weights, the EMA and
// the optimizer state then hold the step's result. Checkpoints do it
// themselves.
int dc_trainer_sync(dc_trainer *tr);
// Waits for the last step and reads its losses and gradient norm; fails if
// either has become NaN or infinite (the run diverged by that step).
int dc_trainer_stats(dc_trainer *tr, dc_step_stats *stats);

// Checkpoints: raw weights under the official keys, EMA under "ema.<key>",
// AdamW moments as "train.adam_m" / "train.adam_v", and model config,
// training config, position (step, samples_seen) and the data set's
// fingerprint ("data_fingerprint", 16 hex digits) in __metadata__, with
// "format" = "diffusion.c checkpoint v2" and checksums (io/safetensors.h).
// Written atomically. `extra` adds metadata (may be NULL). With several
// ranks every rank calls it (under ZeRO it gathers the shards onto rank 0,
// unit by unit) and rank 0 alone writes: the same file, byte for byte, as
// one rank with the same state writes; the others return 0. Refuses, naming
// the tensor and element, to write a NaN or infinity in any tensor or a
// negative second moment: a diverged run leaves no checkpoint that hides it.
int dc_trainer_save(const dc_trainer *tr, const char *path, const dc_kv *extra);
// Restores EMA, moments and position from a checkpoint whose raw weights
// have already been loaded into the model (on any rank count: under ZeRO
// each rank takes its shard, whatever count wrote the file). Rejects non-finite values (and a
// negative adam_v) naming the tensor and element, and a data set whose
// fingerprint differs from the checkpoint's unless tr->allow_data_change
// (then it warns); a checkpoint without a fingerprint (older) only warns.
// With offload the moments go to the host copy and the EMA to offload's
// device buffer; the file is the same either way, so a run resumes with or
// without offload whichever wrote it.
int dc_trainer_restore(dc_trainer *tr, const dc_st_file *f);
