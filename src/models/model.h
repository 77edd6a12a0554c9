// One interface above the models: the trainer, the sampler, the memory
// planner, checkpoints and the CLI see a dc_model (its parameters, reserve,
// forward with a conditioning struct, backward, sizing) and nothing that
// names an architecture.
//
// How a new model plugs in:
//   1. Embed dc_model as the first member of the model's struct, register
//      its parameters in m->params under their PyTorch state-dict keys, and
//      fill `ops` and `info` at creation.
//   2. Describe its config as metadata entries (config_to_kv, "model" first,
//      the architecture's name) and read them back in a constructor.
//   3. Add one entry to the table in models/registry.c: the name, the
//      constructor from config entries, the config of a file, named presets
//      and their help text. Files (their "model" entry), --model's presets
//      and the shape flags of `train` then reach it by name, and the trainer
//      and planner train and size it through these ops alone.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "io/kv.h"
#include "nn/params.h"

// What a batch is conditioned on, on the model's backend: class labels for a
// class-conditional model, text embeddings (one [len, dim] sequence per
// image) for a text-conditioned one, or token ids (one sequence of len per
// image) for one that embeds its text itself (a UNet trained with its text
// encoder). The member a model does not use stays empty (p NULL).
typedef struct {
    dc_buf y;       // [B] I32 class labels
    dc_buf ctx;     // [B, len, dim] text embeddings
    dc_buf ids;     // [B, len] I32 token ids, each checked against the model's vocabulary
    int len, dim;
    dc_buf lens;    // [B] I32 tokens of each row's ctx that count (the rest is padding), or
                    // none (p NULL): every row counts all len
    // pairs > 0 (B = 2 pairs): rows i and i + pairs have the same x and t,
    // and differ in their conditioning alone (a guided step's conditional and
    // unconditional halves), so a model may compute what precedes the
    // conditioning once for both. The caller vouches for it; 0 claims nothing.
    int pairs;
    // Training a text encoder along (its gradient flows back from the
    // denoiser): where the model's backward writes dL/dctx [B, len, dim],
    // F32, overwritten; none (p NULL): the text takes no gradient.
    dc_buf dctx;
} dc_cond;

typedef enum { DC_COND_LABELS, DC_COND_TEXT, DC_COND_TOKENS } dc_cond_kind;

// What a denoiser's output means: the noise (epsilon), v = sqrt(acp) eps -
// sqrt(1 - acp) x0, the clean sample x0 itself (diffusers' "sample"), or a
// flow model's velocity noise - x0 (rectified flow, diffusion/flow.h). The
// weights cannot tell: a scheduler config or the user says.
typedef enum { DC_PRED_EPS, DC_PRED_V, DC_PRED_SAMPLE, DC_PRED_FLOW } dc_prediction;

// The shapes and conventions the trainer and the sampler build around. The
// latent is general: x[B, channels, frames, height, width], frames 1 for
// images (then x[B, channels, height, width], the same bytes).
typedef struct {
    int channels, frames, height, width;  // the input x
    int out_channels;             // out[B, out_channels, frames, height, width]
    bool learn_sigma;             // out is (eps, variance interpolation v): 2 x channels
    dc_cond_kind cond;
    int num_classes;              // DC_COND_LABELS: labels 0..num_classes-1; num_classes is the
                                  // null label (the unconditional input of guidance and dropout)
    int ctx_len, ctx_dim;         // DC_COND_TEXT: the embeddings the model reads;
                                  // DC_COND_TOKENS: ctx_len ids a row (ctx_dim 0)
    int blocks;                   // the blocks activation checkpointing counts (set_recompute's
                                  // keep runs 0..blocks); 0: the model has none
    // Its backward writes nothing its forward kept (nor dout), so a second
    // backward from the same dout, without a forward between, gives the same
    // gradients: updating in the backward's second pass (train/optimizer.h)
    // then runs the backward alone. Checked by test_update_in_backward.
    bool backward_repeats;
} dc_model_info;

// The elements of one input image (or clip): channels x frames x height x width.
static inline int64_t dc_model_info_numel(const dc_model_info *i) {
    return (int64_t)i->channels * i->frames * i->height * i->width;
}

typedef struct dc_model dc_model;

typedef struct {
    const char *name;  // the architecture, as the "model" metadata entry names it
    // Plans activation memory for batches up to max_batch.
    int (*reserve)(dc_model *m, int max_batch);
    // out = model(x, t[B] float timesteps, cond); the backend's status at its end.
    int (*forward)(dc_model *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B);
    // Accumulates dL/dparams (+=) from dout = dL/dout of the last forward.
    int (*backward)(dc_model *m, dc_buf dout, int B);
    // The config as metadata entries, "model" first.
    int (*config_to_kv)(const dc_model *m, dc_kv *kv);
    // Seeded, deterministic initialisation of every weight.
    int (*init_weights)(dc_model *m, uint64_t seed);
    // Multiply-adds of one image's forward pass.
    double (*macs_per_image)(const dc_model *m);
    // The config for people: lines separated by '\n', the first naming the
    // architecture and its main sizes ("DiT depth 28, hidden 1152, ..."). May be NULL.
    void (*describe)(const dc_model *m, char *buf, size_t n);
    // Training with activation checkpointing: the first `keep` blocks keep
    // their activations, the others recompute theirs in backward (-1: all
    // keep). NULL for a model without it.
    int (*set_recompute)(dc_model *m, int keep);
    // Selective recompute: training keeps no result that a norm or a
    // pointwise op rebuilds cheaply from what is kept (a GroupNorm+SiLU map,
    // a LayerNorm's output, a GEGLU's); the backward computes each again just
    // before it reads it, so the gradients are the same bits, for some time
    // (torch.compile's partitioner and Megatron's selective recompute choose
    // alike). From the next reserve on. NULL: a model without.
    int (*set_selective)(dc_model *m, bool on);
    // The bytes of the activation arena a training reserve for batches of
    // max_batch with `keep` blocks keeping their activations (-1: all), with
    // selective recompute or not, plans on a backend computing in `compute`,
    // without allocating; -1 on a bad batch or a selective recompute the
    // model has not. Works on a layout (a model sized but not allocated), for
    // memory planners. NULL for a model that does not train.
    int64_t (*activation_bytes)(const dc_model *m, dc_dtype compute, int max_batch, int keep, bool selective);
    // Training with the parameters' fp32 gradients inside the activation
    // arena, over the bytes each unit's backward is done with
    // (nn/params.h: dc_params_grad_place), from the next reserve on (lend),
    // or in their own buffer again (the set then has none until it makes
    // one). For a step of one micro-batch whose optimizer zeroes and reads
    // the full gradient buffer; the trainer decides. NULL: a model that
    // cannot.
    int (*lend_grads)(dc_model *m, bool lend);
    // activation_bytes of a plan with the gradients inside: the arena's bytes
    // then. NULL where lend_grads is.
    int64_t (*lent_bytes)(const dc_model *m, dc_dtype compute, int max_batch, int keep, bool selective);
    // The device bytes of weights the model holds that do not train (a
    // LoRA's frozen base) in a backend computing in `compute`, for memory
    // planners; works on a layout. NULL: none.
    int64_t (*frozen_bytes)(const dc_model *m, dc_dtype compute);
    // Changes the input's height and width (of latents or pixels) for the
    // forwards after the next reserve (a trainer on aspect-ratio buckets);
    // info follows. NULL for a model of one size.
    int (*set_size)(dc_model *m, int height, int width);
    // Releases what the model holds (not the struct itself).
    void (*release)(dc_model *m);
} dc_model_ops;

struct dc_model {
    const dc_model_ops *ops;
    dc_model_info info;
    dc_backend *be;     // NULL for a layout: parameters registered, nothing allocated
    dc_params *params;  // weights under their state-dict keys (and gradients when training)
    bool owned;         // allocated by a factory: dc_model_free frees the struct too
};

static inline int dc_model_reserve(dc_model *m, int max_batch) { return m->ops->reserve(m, max_batch); }
static inline int dc_model_forward(dc_model *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond,
                                   int B) {
    return m->ops->forward(m, out, x, t, cond, B);
}
static inline int dc_model_backward(dc_model *m, dc_buf dout, int B) { return m->ops->backward(m, dout, B); }
static inline int dc_model_config_to_kv(const dc_model *m, dc_kv *kv) { return m->ops->config_to_kv(m, kv); }
static inline int dc_model_init_weights(dc_model *m, uint64_t seed) { return m->ops->init_weights(m, seed); }
static inline double dc_model_macs_per_image(const dc_model *m) { return m->ops->macs_per_image(m); }
// The architecture's name alone when it has no describe.
void dc_model_describe(const dc_model *m, char *buf, size_t n);
// -1 with a message naming the architecture when it has no such op.
int dc_model_set_recompute(dc_model *m, int keep);
int64_t dc_model_activation_bytes(const dc_model *m, dc_dtype compute, int max_batch, int keep, bool selective);
// -1 with a message naming the architecture when it has no selective recompute.
int dc_model_set_selective(dc_model *m, bool on);
// Whether the model can hold the gradients in its arena (lend_grads).
static inline bool dc_model_lends(const dc_model *m) { return m->ops->lend_grads && m->ops->lent_bytes; }
// 0 for a model without frozen weights.
int64_t dc_model_frozen_bytes(const dc_model *m, dc_dtype compute);
// The same for set_size (the size it has: nothing to do).
int dc_model_set_size(dc_model *m, int height, int width);
// Releases the model (NULL or never created: nothing to do).
void dc_model_free(dc_model *m);
