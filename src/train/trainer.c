#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "diffusion/training_loss.h"
#include "train/zero.h"

dc_train_config dc_train_config_default(void) {
    return (dc_train_config){
        .steps = 1000, .batch = 256, .micro_batch = 256, .lr = 1e-4f, .beta1 = 0.9f,
        .beta2 = 0.999f, .adam_eps = 1e-8f, .weight_decay = 0.0f, .warmup = 0,
        .grad_clip = 0.0f, .ema_decay = 0.9999f, .ema_warmup = true, .class_dropout = 0.1f, .hflip = false,
        .seed = 0, .objective = {DC_PRED_EPS, 0, 0}, .offload = false,
        .offload_settings = dc_offload_settings_default(), .grad_comm = DC_F32,
    };
}

// diffusers' EMAModel.get_decay with use_ema_warmup False, update_after_step
// 0 and min_decay 0: at its optimization_step k, n = k - 1; 0 for n <= 0,
// else min(decay, (1 + n) / (10 + n)), in double, then used in fp32.
float dc_train_ema_decay(const dc_train_config *c, int64_t step) {
    if (!c->ema_warmup) return c->ema_decay;
    const double n = (double)(step - 1);
    if (n <= 0) return 0.0f;
    const double d = (1 + n) / (10 + n);
    return (float)(d < c->ema_decay ? d : c->ema_decay);
}

int dc_train_config_validate(const dc_train_config *c) {
    if (c->steps < 1) return dc_fail("--steps must be at least 1 (got %d)", c->steps);
    if (c->batch < 1) return dc_fail("--batch must be at least 1 (got %d)", c->batch);
    if (c->micro_batch < 1 || c->micro_batch > c->batch)
        return dc_fail("--micro-batch must be between 1 and --batch (got %d)", c->micro_batch);
    if (!(c->lr > 0 && c->lr < 1)) return dc_fail("--lr must be in (0, 1) (got %g)", c->lr);
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return dc_fail("Adam betas must be in [0, 1)");
    if (!(c->adam_eps > 0 && isfinite(c->adam_eps))) return dc_fail("--adam-eps must be positive and finite");
    if (!(c->weight_decay >= 0 && isfinite(c->weight_decay)))
        return dc_fail("--weight-decay must be non-negative and finite");
    if (!((double)c->lr * c->weight_decay < 1))
        return dc_fail("--weight-decay %g with --lr %g: decoupled decay multiplies every weight by 1 - lr * wd = "
                       "%g each step, which must stay positive (lr * wd < 1; typical wd is 0 to 0.1)",
                       c->weight_decay, c->lr, 1 - (double)c->lr * c->weight_decay);
    if (c->warmup < 0) return dc_fail("--warmup must be non-negative");
    if (!(c->grad_clip >= 0 && isfinite(c->grad_clip))) return dc_fail("--grad-clip must be non-negative and finite");
    if (!(c->ema_decay >= 0 && c->ema_decay <= 1)) return dc_fail("--ema-decay must be in [0, 1]");
    if (!(c->class_dropout >= 0 && c->class_dropout < 1))
        return dc_fail("--class-dropout must be in [0, 1)");
    if (dc_mse_objective_validate(&c->objective)) return -1;
    if (c->grad_comm != DC_F32 && c->grad_comm != DC_BF16)
        return dc_fail("--grad-comm %s: gradients travel as fp32 or bf16", dc_dtype_name(c->grad_comm));
    if (c->update_in_backward && c->offload)
        return dc_fail("updating in the backward and --offload are two ways of placing the update: choose one");
    if (c->update_in_backward && c->micro_batch != c->batch)
        return dc_fail("updating in the backward takes the batch in one micro-batch (no accumulation: a step's "
                       "gradients are never held whole): micro-batch %d of batch %d", c->micro_batch, c->batch);
    return dc_offload_settings_validate(&c->offload_settings);
}

// The objective's predictions as checkpoints name them.
static const char *const k_predictions[] = {[DC_PRED_EPS] = "epsilon", [DC_PRED_V] = "v_prediction",
                                            [DC_PRED_SAMPLE] = "sample"};

// The shortest decimal that reads back as exactly f (at most 9 digits), so
// a resumed run uses bit-identical settings and people read "0.0005".
static const char *exact(float f, char *buf) {
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, 32, "%.*g", digits, f);
        if (strtof(buf, NULL) == f) break;
    }
    return buf;
}

int dc_train_config_to_kv(const dc_train_config *c, dc_kv *kv) {
    char b[32];
    DC_TRY(dc_kv_set(kv, "steps", "%d", c->steps));
    DC_TRY(dc_kv_set(kv, "batch", "%d", c->batch));
    DC_TRY(dc_kv_set(kv, "micro_batch", "%d", c->micro_batch));
    DC_TRY(dc_kv_set(kv, "lr", "%s", exact(c->lr, b)));
    DC_TRY(dc_kv_set(kv, "beta1", "%s", exact(c->beta1, b)));
    DC_TRY(dc_kv_set(kv, "beta2", "%s", exact(c->beta2, b)));
    DC_TRY(dc_kv_set(kv, "adam_eps", "%s", exact(c->adam_eps, b)));
    DC_TRY(dc_kv_set(kv, "weight_decay", "%s", exact(c->weight_decay, b)));
    DC_TRY(dc_kv_set(kv, "warmup", "%d", c->warmup));
    DC_TRY(dc_kv_set(kv, "grad_clip", "%s", exact(c->grad_clip, b)));
    DC_TRY(dc_kv_set(kv, "ema_decay", "%s", exact(c->ema_decay, b)));
    DC_TRY(dc_kv_set(kv, "ema_warmup", "%s", c->ema_warmup ? "true" : "false"));
    DC_TRY(dc_kv_set(kv, "class_dropout", "%s", exact(c->class_dropout, b)));
    DC_TRY(dc_kv_set(kv, "hflip", "%s", c->hflip ? "true" : "false"));
    DC_TRY(dc_kv_set(kv, "seed", "%llu", (unsigned long long)c->seed));
    // the objective's settings only where not the default: DiT checkpoints stay as they were
    const dc_mse_objective *o = &c->objective;
    if (o->prediction != DC_PRED_EPS) DC_TRY(dc_kv_set(kv, "prediction", "%s", k_predictions[o->prediction]));
    if (o->min_snr_gamma != 0) DC_TRY(dc_kv_set(kv, "min_snr_gamma", "%s", exact(o->min_snr_gamma, b)));
    if (o->noise_offset != 0) DC_TRY(dc_kv_set(kv, "noise_offset", "%s", exact(o->noise_offset, b)));
    return 0;
}

static const char *find_kv(const char *const *k, const char *const *v, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(k[i], key) == 0) return v[i];
    return NULL;
}

int dc_train_config_from_kv(dc_train_config *c, const char *const *k, const char *const *v,
                            int n, const char *file) {
    struct { const char *key; char kind; void *dst; } fields[] = {
        {"steps", 'i', &c->steps}, {"batch", 'i', &c->batch}, {"micro_batch", 'i', &c->micro_batch},
        {"lr", 'f', &c->lr}, {"beta1", 'f', &c->beta1}, {"beta2", 'f', &c->beta2},
        {"adam_eps", 'f', &c->adam_eps}, {"weight_decay", 'f', &c->weight_decay},
        {"warmup", 'i', &c->warmup}, {"grad_clip", 'f', &c->grad_clip},
        {"ema_decay", 'f', &c->ema_decay}, {"class_dropout", 'f', &c->class_dropout},
        {"hflip", 'b', &c->hflip}, {"seed", 'u', &c->seed}, {"ema_warmup", 'b', &c->ema_warmup},
        {"min_snr_gamma", 'f', &c->objective.min_snr_gamma}, {"noise_offset", 'f', &c->objective.noise_offset},
    };
    static const char *const optional = " ema_warmup min_snr_gamma noise_offset ";
    // Checkpoints written before the EMA warm-up existed trained without it;
    // the objective's settings are there only where not the default.
    c->ema_warmup = false;
    c->objective = (dc_mse_objective){DC_PRED_EPS, 0, 0};
    const char *pred = find_kv(k, v, n, "prediction");
    for (int p = 0; pred && p <= DC_PRED_SAMPLE; p++)
        if (!strcmp(pred, k_predictions[p])) c->objective.prediction = (dc_prediction)p, pred = NULL;
    if (pred) return dc_fail("%s: metadata 'prediction' = '%s' is not epsilon, v_prediction or sample", file, pred);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *s = find_kv(k, v, n, fields[i].key);
        char word[32];
        snprintf(word, sizeof word, " %s ", fields[i].key);
        if (!s && strstr(optional, word)) continue;
        if (!s) return dc_fail("%s: no training setting '%s' in metadata (not a training checkpoint?)", file, fields[i].key);
        char *end = NULL;
        switch (fields[i].kind) {
        case 'i': *(int *)fields[i].dst = (int)strtol(s, &end, 10); break;
        case 'f': *(float *)fields[i].dst = strtof(s, &end); break;
        case 'u': *(uint64_t *)fields[i].dst = strtoull(s, &end, 10); break;
        case 'b':
            *(bool *)fields[i].dst = strcmp(s, "true") == 0;
            end = (char *)s + ((!strcmp(s, "true") || !strcmp(s, "false")) ? strlen(s) : 0);
            break;
        }
        if (end == s || *end) return dc_fail("%s: metadata '%s' = '%s' is malformed", file, fields[i].key, s);
    }
    return dc_train_config_validate(c) ? dc_fail_ctx("%s", file) : 0;
}

bool dc_trainer_folds(const dc_backend *be) { return strcmp(be->name, "cpu") == 0; }

static dc_buf alloc_buf(dc_backend *be, int64_t n, dc_dtype dt, int *ok) {
    dc_buf b = {be->alloc(be, (size_t)n * dc_dtype_size(dt)), dt};
    if (!b.p) *ok = 0;
    return b;
}

int dc_trainer_init(dc_trainer *tr, dc_model *model, const dc_dataset *data,
                    const dc_train_config *cfg) {
    memset(tr, 0, sizeof *tr);
    dc_source src;
    DC_TRY(dc_source_dataset(&src, data, cfg->seed));
    return dc_trainer_init_source(tr, model, &src, NULL, cfg);
}

// Whether the source's samples are what the model reads.
static int check_source(const dc_model *model, const dc_source *data, const dc_train_config *cfg) {
    const dc_model_info *mi = &model->info;
    if (!dc_params_trains(model->params)) return dc_fail("the model was not created for training");
    if (data->channels != mi->channels || data->height != mi->height || data->width != mi->width)
        return dc_fail("data images are %dx%dx%d but the model takes %dx%dx%d", data->channels,
                       data->height, data->width, mi->channels, mi->height, mi->width);
    if (mi->frames != 1) return dc_fail("the model takes %d frames a sample; the data holds images", mi->frames);
    const dc_mse_objective *o = &cfg->objective;
    if (mi->learn_sigma && (o->prediction != DC_PRED_EPS || o->min_snr_gamma != 0 || o->noise_offset != 0))
        return dc_fail("this %s learns its variance and trains on the hybrid objective, which predicts eps with "
                       "neither Min-SNR weighting nor a noise offset", model->ops->name);
    if (!mi->learn_sigma && mi->out_channels != mi->channels)
        return dc_fail("this %s predicts %d channels of %d: the MSE objective needs one for each", model->ops->name,
                       mi->out_channels, mi->channels);
    if (cfg->hflip && !data->flips)
        return dc_fail("%s holds latents, which cannot be mirrored as pictures are: train without flips",
                       data->name);
    // The data must carry what the model is conditioned on.
    static const char *const what[] = {[DC_COND_LABELS] = "class labels", [DC_COND_TEXT] = "text embeddings",
                                       [DC_COND_TOKENS] = "token ids"};
    if (mi->cond != data->cond)
        return dc_fail("this %s is conditioned on %s, but the data set carries %s", model->ops->name, what[mi->cond],
                       what[data->cond]);
    if (mi->cond == DC_COND_LABELS && data->num_classes > mi->num_classes)
        return dc_fail("data has %d classes but the model only %d", data->num_classes, mi->num_classes);
    if (mi->cond == DC_COND_TEXT && (data->text_len != mi->ctx_len || data->text_dim != mi->ctx_dim))
        return dc_fail("the data's text embeddings are %d x %d but the %s reads %d x %d", data->text_len,
                       data->text_dim, model->ops->name, mi->ctx_len, mi->ctx_dim);
    if (mi->cond == DC_COND_TOKENS && data->text_len != mi->ctx_len)
        return dc_fail("the data's captions are %d token ids but the %s reads %d", data->text_len, model->ops->name,
                       mi->ctx_len);
    return 0;
}

int dc_trainer_init_source(dc_trainer *tr, dc_model *model, dc_source *src, dc_schedule *sched,
                           const dc_train_config *cfg) {
    memset(tr, 0, sizeof *tr);
    tr->data = *src;
    memset(src, 0, sizeof *src);
    int rc = sched ? 0 : dc_schedule_init_gaussian(&tr->sched, DC_DIFFUSION_STEPS, DC_DIFFUSION_STEPS);
    if (sched) tr->sched = *sched, memset(sched, 0, sizeof *sched);
    if (!rc && tr->sched.family != DC_SCHEDULE_DISCRETE)
        rc = dc_fail("training needs a discrete schedule (timesteps over alphas_cumprod)");
    if (!rc && model->info.learn_sigma && !tr->sched.posterior_mean_coef1)
        rc = dc_fail("a model that learns its variance trains on a schedule made from betas (with the posterior's "
                     "tables)");
    // samples of several sizes (buckets): the model starts at the largest, which sizes the buffers
    if (!rc && tr->data.ops->size) rc = dc_model_set_size(model, tr->data.height, tr->data.width);
    if (rc || dc_train_config_validate(cfg) || check_source(model, &tr->data, cfg)) {
        dc_schedule_free(&tr->sched);
        dc_source_close(&tr->data);
        return -1;
    }
    const dc_model_info *mi = &model->info;
    tr->cfg = *cfg, tr->model = model, tr->be = model->be;
    dc_backend *be = tr->be;
    const bool fold = dc_trainer_folds(be);
    // The activations are planned at the first step, after offload or ZeRO
    // (dc_trainer_set_comm) have taken over the full gradient buffer and the
    // moments they shard or move: those never sit beside the activations.
    // offload: the master and moments on the host, the EMA in the gradient buffer.
    // a decay of 0 keeps no EMA apart from the weights (it is them)
    const bool ema = cfg->ema_decay > 0;
    if (cfg->offload ? dc_offload_create(model->params, be, fold, ema, &cfg->offload_settings, &tr->opt)
                     : dc_optim_plain_create(model->params, fold, ema, cfg->update_in_backward, &tr->opt)) {
        dc_trainer_free(tr);
        return -1;
    }

    int64_t mb = cfg->micro_batch;
    int64_t img = dc_model_info_numel(mi), oimg = img / mi->channels * mi->out_channels;
    int ok = 1;
    tr->x0 = alloc_buf(be, mb * img, DC_F32, &ok);
    tr->xt = alloc_buf(be, mb * img, DC_F32, &ok);
    tr->eps = alloc_buf(be, mb * img, DC_F32, &ok);
    tr->out = alloc_buf(be, mb * oimg, DC_F32, &ok);
    tr->dout = alloc_buf(be, mb * oimg, DC_F32, &ok);
    tr->losses = alloc_buf(be, (int64_t)cfg->batch * 2, DC_F32, &ok);
    tr->gstats = alloc_buf(be, 2, DC_F32, &ok);
    tr->h_losses = malloc((size_t)cfg->batch * 2 * sizeof(float));
    tr->t = alloc_buf(be, mb, DC_F32, &ok);
    if (!mi->learn_sigma) tr->target = alloc_buf(be, mb * img, DC_F32, &ok);
    tr->h_weight = malloc(mb * sizeof(float));
    tr->h_sample_weight = malloc(mb * sizeof(float));
    if (dc_batch_cond_init(&tr->cond, &tr->data, be, (int)mb)) return dc_trainer_free(tr), -1;
    tr->h_x0 = malloc(mb * img * sizeof(float));
    tr->h_t = malloc(mb * sizeof(int));
    tr->h_keys = malloc(mb * sizeof(uint32_t));
    tr->h_coef = malloc(mb * sizeof(dc_loss_coef));
    if (!ok || !tr->h_x0 || !tr->h_t || !tr->h_losses || !tr->h_keys || !tr->h_coef || !tr->h_weight ||
        !tr->h_sample_weight) {
        dc_trainer_free(tr);
        return dc_fail("out of memory for the training state");
    }
    return 0;
}

void dc_trainer_free(dc_trainer *tr) {
    dc_backend *be = tr->be;
    dc_optimizer_free(tr->opt);
    if (be) {
        dc_buf *bufs[] = {&tr->x0,     &tr->xt,     &tr->eps, &tr->out,   &tr->dout,
                          &tr->losses, &tr->gstats, &tr->t,   &tr->target};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]->p) be->free(be, bufs[i]->p);
        dc_batch_cond_free(&tr->cond, be);
        dc_schedule_free(&tr->sched);
    }
    dc_source_close(&tr->data);
    free(tr->h_x0), free(tr->h_t);
    free(tr->h_keys), free(tr->h_coef), free(tr->h_losses), free(tr->h_weight), free(tr->h_sample_weight);
    memset(tr, 0, sizeof *tr);
}

// Stages images done .. done+n-1 of the current step: data position,
// flips and conditioning with dropout, each drawn from (seed, index in the global batch,
// step), the keying the diffusion draws use too.
static int stage_micro_batch(dc_trainer *tr, int done, int n) {
    dc_source *src = &tr->data;
    const dc_train_config *c = &tr->cfg;
    const int64_t img = dc_model_info_numel(&tr->model->info);  // the step's size (step_size)
    uint32_t step = (uint32_t)tr->step;
    for (int i = 0; i < n; i++) {
        uint32_t key = (uint32_t)(done + i);
        int64_t idx;
        DC_TRY(src->ops->index(src, tr->samples_seen + done + i, c->batch, &idx));
        bool flip = c->hflip && (dc_rand_u32_at(c->seed, key, step, DC_STREAM_FLIP, 0) & 1);
        DC_TRY(src->ops->x0(src, idx, flip, c->seed, key, step, tr->h_x0 + i * img));
        float u = dc_u32_to_unit(dc_rand_u32_at(c->seed, key, step, DC_STREAM_DROPOUT, 0));
        DC_TRY(dc_batch_cond_set(&tr->cond, src, i, idx, u < c->class_dropout, tr->model->info.num_classes));
        tr->h_keys[i] = key;
        tr->h_sample_weight[i] = src->ops->weight ? src->ops->weight(src, idx) : 1.0f;
    }
    return 0;
}

int dc_trainer_set_comm(dc_trainer *tr, dc_comm *comm, int zero_stage) {
    if (zero_stage < 0 || zero_stage > 2) return dc_fail("--zero %d: the stages are 0, 1 and 2", zero_stage);
    if (tr->started || tr->comm) return dc_fail("the ranks and the ZeRO stage are set once, before the first step");
    if (!comm) {
        if (zero_stage) return dc_fail("ZeRO stage %d needs a communicator", zero_stage);
        return 0;
    }
    bool cpu = strcmp(tr->be->name, "cpu") == 0;
    if ((comm->size > 1 || zero_stage) && !comm->device && !cpu)
        return dc_fail("training on %d ranks on the %s backend needs NCCL (the thread communicator shares host "
                       "memory: use --device cpu)", comm->size, tr->be->name);
    if ((comm->size > 1 || zero_stage) && comm->device && cpu)
        return dc_fail("a GPU communicator cannot run the CPU backend's ranks (use the thread communicator)");
    if (comm->size == 1 && zero_stage == 0) return 0;  // one rank, nothing shared
    if (tr->cfg.offload || tr->cfg.update_in_backward)
        return dc_fail("%s runs on one rank for now: it cannot be combined with %s",
                       tr->cfg.offload ? "--offload" : "updating in the backward",
                       comm->size > 1 ? "several ranks" : "--zero");
    dc_params *ps = tr->model->params;
    if (zero_stage == 0) {
        DC_TRY(dc_optim_plain_set_comm(tr->opt, comm, tr->cfg.grad_comm));
        tr->comm = comm;
        return 0;
    }
    // the shards replace the full buffers
    dc_optimizer *z;
    DC_TRY(dc_zero_create(ps, comm, zero_stage, tr->cfg.grad_comm, (const dc_optim_plain *)tr->opt, &z));
    dc_optimizer_free(tr->opt);
    tr->opt = z;
    tr->comm = comm;
    return 0;
}

// The gradient units of a backward with no images (a rank the last round of
// micro-batches leaves without any): what the strategy's unit hook does
// around each (ZeRO-2's reduce-scatters, which the other ranks take part
// in), in the order a backward hands the units over, last to first.
static int idle_units(dc_params *ps) {
    for (int u = dc_params_unit_count(ps) - 1; u >= 0; u--) {
        DC_TRY(dc_params_unit_begin(ps, u));
        DC_TRY(dc_params_unit_done(ps, u));
    }
    return 0;
}

// Forward, loss and backward of images done .. done+n-1 of the step's global
// batch; again: the step's second pass over its one micro-batch, for a model
// whose backward repeats (dc_model_info.backward_repeats): the backward alone.
static int micro_batch(dc_trainer *tr, int done, int n, bool again) {
    dc_backend *be = tr->be;
    dc_model *m = tr->model;
    if (again) return dc_model_backward(m, tr->dout, n);
    const dc_train_config *c = &tr->cfg;
    const dc_model_info *mi = &m->info;
    const int C = mi->channels;
    const int64_t HW = (int64_t)mi->frames * mi->height * mi->width;  // a channel's elements
    DC_TRY(stage_micro_batch(tr, done, n));
    be->upload(be, tr->x0.p, tr->h_x0, (size_t)n * C * HW * sizeof(float));
    dc_batch_cond_upload(&tr->cond, be, n);
    dc_diffusion_draw_timesteps(tr->h_t, tr->h_keys, n, tr->sched.n, c->seed, (uint32_t)tr->step);
    dc_buf losses = dc_buf_at(tr->losses, 2 * (int64_t)done);
    if (!mi->learn_sigma) {  // the MSE objective; dout is free until the loss: the offset's scratch
        DC_TRY(dc_mse_objective_prepare(be, &c->objective, &tr->sched, tr->xt, tr->eps, tr->target, tr->t,
                                        tr->h_weight, tr->x0, tr->dout, tr->h_t, tr->h_keys, n, C, HW, c->seed,
                                        (uint32_t)tr->step));
        for (int b = 0; b < n; b++) tr->h_weight[b] *= tr->h_sample_weight[b];
        DC_TRY(dc_model_forward(m, tr->out, tr->xt, tr->t, &tr->cond.dev, n));
        DC_TRY(dc_mse_objective_loss(be, tr->dout, losses, tr->out, tr->target, tr->h_weight, n, C, HW,
                                     1.0f / c->batch));
        return dc_model_backward(m, tr->dout, n);
    }
    for (int b = 0; b < n; b++)
        if (tr->h_sample_weight[b] != 1.0f)
            return dc_fail("%s: samples of weights other than 1 need the MSE objective (a model without a learned "
                           "variance)", tr->data.name);
    DC_TRY(dc_diffusion_prepare_batch(be, &tr->sched, tr->xt, tr->eps, tr->t, tr->h_coef, tr->x0, tr->h_t,
                                      tr->h_keys, n, C * HW, c->seed, (uint32_t)tr->step));
    DC_TRY(dc_model_forward(m, tr->out, tr->xt, tr->t, &tr->cond.dev, n));
    // d(mean over the global batch)/d out: each image weighs 1 / batch
    DC_TRY(dc_diffusion_loss(be, tr->dout, losses, tr->out, tr->x0, tr->xt,
                             tr->eps, tr->h_coef, n, C, mi->out_channels, HW, 1.0f / c->batch, NULL, NULL));
    return dc_model_backward(m, tr->dout, n);
}

// Samples of several sizes (buckets): the model takes the size of this
// step's, which its whole global batch shares (the source's promise); *changed
// when that is another than the last step's.
static int step_size(dc_trainer *tr, bool *changed) {
    dc_source *src = &tr->data;
    const dc_model_info *mi = &tr->model->info;
    int64_t idx;
    int h, w;
    DC_TRY(src->ops->index(src, tr->samples_seen, tr->cfg.batch, &idx));
    src->ops->size(src, idx, &h, &w);
    *changed = h != mi->height || w != mi->width;
    return *changed ? dc_model_set_size(tr->model, h, w) : 0;
}

bool dc_trainer_lends(const dc_model *m, bool grads_apart, int rounds, bool optimizer_lends) {
    return optimizer_lends && rounds == 1 && !grads_apart && dc_model_lends(m);
}

// Before the first reserve (the ranks and the rounds are fixed from here):
// the gradients into the model's arena where they can lie there.
static int lend_grads(dc_trainer *tr, int rounds) {
    dc_model *m = tr->model;
    if (!dc_trainer_lends(m, tr->cfg.grads_apart, rounds, tr->opt->lends)) return 0;
    return m->ops->lend_grads(m, true);
}

int dc_trainer_step(dc_trainer *tr, dc_step_stats *st) {
    dc_backend *be = tr->be;
    dc_model *m = tr->model;
    const dc_train_config *c = &tr->cfg;
    // The step's micro-batches: rounds of one per rank (dc_batch_round), each
    // image keyed by its place in the global batch.
    const int size = tr->comm ? tr->comm->size : 1, rank = tr->comm ? tr->comm->rank : 0;
    const int rounds = dc_batch_rounds(c->batch, size, c->micro_batch);
    int last_first, last_n;  // the last rank's part of the last round
    dc_batch_round(c->batch, size, c->micro_batch, size - 1, rounds - 1, &last_first, &last_n);
    int64_t s = tr->step + 1;
    float lr = c->warmup > 0 && s < c->warmup ? c->lr * (float)s / c->warmup : c->lr;
    const dc_optim_step os = {
        .h = {lr, c->beta1, c->beta2, c->adam_eps, c->weight_decay, 1.0f - powf(c->beta1, (float)s),
              1.0f - powf(c->beta2, (float)s), 1.0f, dc_train_ema_decay(c, s)},
        .clip = c->grad_clip, .rounds = rounds, .last_round_full = last_n > 0};
    // Nothing here waits for the backend: losses and the gradient norm stay
    // there until dc_trainer_stats reads them.
    DC_TRY(dc_optimizer_begin_step(tr->opt, &os));
    bool resized = false;
    if (tr->data.ops->size) DC_TRY(step_size(tr, &resized));
    if (!tr->started) DC_TRY(lend_grads(tr, rounds));
    if (!tr->started || resized) DC_TRY(dc_model_reserve(m, c->micro_batch));
    tr->started = true;
    tr->last_lr = lr;
    if (tr->comm) be->zero(be, tr->losses.p, (size_t)c->batch * 2 * sizeof(float));  // summed over ranks below
    for (int pass = 0; pass < tr->opt->passes; pass++)  // (two: the first finds the norm, train/optimizer.h)
        for (int j = 0; j < rounds; j++) {
            int done, n;
            dc_batch_round(c->batch, size, c->micro_batch, rank, j, &done, &n);
            const bool again = pass > 0 && rounds == 1 && m->info.backward_repeats;
            DC_TRY(dc_optimizer_micro_begin(tr->opt, j));
            DC_TRY(n > 0 ? micro_batch(tr, done, n, again) : idle_units(m->params));
            DC_TRY(dc_optimizer_micro_end(tr->opt, j));
        }
    if (tr->comm) {  // every rank's losses, summed in rank order
        DC_TRY(dc_backend_status(be));
        DC_TRY(dc_comm_all_reduce_sum(tr->comm, (float *)tr->losses.p, 2 * (int64_t)c->batch));
    }
    DC_TRY(dc_optimizer_finish(tr->opt, tr->gstats));
    tr->step = s;
    tr->samples_seen += c->batch;
    return st ? dc_trainer_stats(tr, st) : 0;
}

int dc_trainer_sync(dc_trainer *tr) {
    DC_TRY(dc_optimizer_drain(tr->opt));
    tr->be->sync(tr->be);
    return dc_backend_status(tr->be);
}

// Names a non-finite value for a message ("%g" prints a NaN as "-nan" or "nan"
// depending on its sign bit, which means nothing to the reader).
static const char *nonfinite(double v) { return isnan(v) ? "NaN" : v > 0 ? "infinite" : "-infinite"; }

int dc_trainer_stats(dc_trainer *tr, dc_step_stats *st) {
    dc_backend *be = tr->be;
    int B = tr->cfg.batch;
    float g[2];
    be->download(be, tr->h_losses, tr->losses.p, (size_t)B * 2 * sizeof(float));
    be->download(be, g, tr->gstats.p, sizeof g);
    DC_TRY(dc_backend_status(be));  // a device error is not a diverged run
    double mse = 0, vb = 0;
    for (int i = 0; i < B; i++) mse += tr->h_losses[2 * i], vb += tr->h_losses[2 * i + 1];
    *st = (dc_step_stats){(mse + vb) / B, mse / B, vb / B, g[0], tr->last_lr};
    if (!isfinite(mse + vb))
        return dc_fail("loss became %s by step %lld; lower --lr or enable --grad-clip", nonfinite(mse + vb),
                       (long long)tr->step);
    if (!isfinite(g[0]))
        return dc_fail("gradient norm became %s by step %lld; lower --lr or enable --grad-clip", nonfinite(g[0]),
                       (long long)tr->step);
    // AdamW's second moment holds g^2 in float32, which overflows once an
    // element passes 1.8e19: a norm (after clipping) that large has already
    // made it infinite, though the loss and the norm are still finite.
    float used = tr->cfg.grad_clip > 0 && g[0] > tr->cfg.grad_clip ? tr->cfg.grad_clip : g[0];
    if (used > 1e19f)
        return dc_fail("gradient norm became %g by step %lld, beyond what AdamW's moments hold in float32; lower "
                       "--lr or enable --grad-clip", g[0], (long long)tr->step);
    return 0;
}
