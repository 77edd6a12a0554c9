// One interface above the models: the trainer, the sampler, checkpoints and
// the CLI see a dc_model (its parameters, reserve, forward with a
// conditioning struct, backward) and nothing that names an architecture.
// A model embeds dc_model as its first member and fills `ops` and `info` at
// creation; the factory that picks the architecture from a file is
// models/model_io.h.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "io/kv.h"
#include "nn/params.h"

// What a batch is conditioned on, on the model's backend: class labels for a
// class-conditional model, or text embeddings (one [len, dim] sequence per
// image) for a text-conditioned one. The member a model does not use stays
// empty (p NULL).
typedef struct {
    dc_buf y;       // [B] I32 class labels
    dc_buf ctx;     // [B, len, dim] text embeddings
    int len, dim;
    // pairs > 0 (B = 2 pairs): rows i and i + pairs have the same x and t,
    // and differ in their conditioning alone (a guided step's conditional and
    // unconditional halves), so a model may compute what precedes the
    // conditioning once for both. The caller vouches for it; 0 claims nothing.
    int pairs;
} dc_cond;

typedef enum { DC_COND_LABELS, DC_COND_TEXT } dc_cond_kind;

// What a denoiser's output means: the noise (epsilon), v = sqrt(acp) eps -
// sqrt(1 - acp) x0, the clean sample x0 itself (diffusers' "sample"), or a
// flow model's velocity noise - x0 (rectified flow, diffusion/flow.h). The
// weights cannot tell: a scheduler config or the user says.
typedef enum { DC_PRED_EPS, DC_PRED_V, DC_PRED_SAMPLE, DC_PRED_FLOW } dc_prediction;

// The shapes and conventions the trainer and the sampler build around.
typedef struct {
    int channels, height, width;  // the input x[B, channels, height, width]
    int out_channels;             // out[B, out_channels, height, width]
    bool learn_sigma;             // out is (eps, variance interpolation v): 2 x channels
    dc_cond_kind cond;
    int num_classes;              // DC_COND_LABELS: labels 0..num_classes-1; num_classes is the
                                  // null label (the unconditional input of guidance and dropout)
    int ctx_len, ctx_dim;         // DC_COND_TEXT: the embeddings the model reads
} dc_model_info;

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
    // Releases what the model holds (not the struct itself).
    void (*release)(dc_model *m);
} dc_model_ops;

struct dc_model {
    const dc_model_ops *ops;
    dc_model_info info;
    dc_backend *be;
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
// Releases the model (NULL or never created: nothing to do).
void dc_model_free(dc_model *m);
