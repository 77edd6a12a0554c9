// DiT: the class-conditional Diffusion Transformer of Peebles & Xie (2023),
// exactly as the official code builds it (adaLN-Zero blocks, learned sigma,
// fixed 2-D sin-cos positions), with explicit forward and backward passes.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "models/model.h"
#include "models/registry.h"
#include "nn/params.h"

typedef struct {
    int input_size;   // H = W of the input (latent) image
    int patch;        // p
    int in_channels;  // C
    int hidden;       // D
    int depth;        // number of blocks
    int heads;        // H
    int mlp_hidden;   // fc1 width (mlp_ratio * D, 4D officially)
    int num_classes;  // the embedding table has num_classes + 1 rows (last = null class)
    bool learn_sigma; // output 2C channels: eps then the variance interpolation v
} dc_dit_config;

// Fills cfg for an official name ("DiT-XL/2" ... "DiT-S/8") with the official
// defaults (32x32x4 input, 1000 classes, learned sigma).
int dc_dit_config_from_name(const char *name, dc_dit_config *cfg);
// Checks the config; message names the offending field.
int dc_dit_config_validate(const dc_dit_config *cfg);
// The official table maps hidden width to heads (1152, 1024 -> 16; 768 -> 12; 384 -> 6).
int dc_dit_heads_for_width(int hidden);
static inline int dc_dit_out_channels(const dc_dit_config *c) {
    return c->learn_sigma ? 2 * c->in_channels : c->in_channels;
}
static inline int dc_dit_tokens(const dc_dit_config *c) {
    return (c->input_size / c->patch) * (c->input_size / c->patch);
}
// Multiply-adds of one image's forward pass (the DiT paper's "Gflops").
double dc_dit_macs_per_image(const dc_dit_config *c);

typedef struct dc_dit_acts dc_dit_acts;
typedef struct dc_dit_modules dc_dit_modules;  // its layers, as modules holding parameter handles

// A DiT is a dc_model (base, first): the trainer, sampler and checkpoints
// reach it through &m->base; the dc_dit_* functions are its own API.
typedef struct {
    dc_model base;
    dc_dit_config cfg;
    dc_backend *be;
    dc_params params;  // official state-dict keys, registration order = official order
    dc_dit_modules *mods;
    dc_dit_acts *acts; // activations planned for up to max_batch images
    int max_batch;
    int keep;          // training: blocks 0..keep-1 keep their activations for backward;
                       // the others keep only their input and run forward again inside
                       // backward (activation checkpointing). -1: every block keeps them.
} dc_dit;

// Registers the parameters and allocates them (and gradients if training).
// Weights start as zeros with pos_embed filled; call dc_dit_init_weights or load.
int dc_dit_create(dc_dit *m, const dc_dit_config *cfg, dc_backend *be, dc_grad_mode grad);
void dc_dit_free(dc_dit *m);
// The official initialisation (xavier-uniform linears, zero adaLN and final
// layer, N(0, 0.02) label table and timestep MLP), seeded and deterministic.
int dc_dit_init_weights(dc_dit *m, uint64_t seed);
// Plans activation memory for batches up to max_batch (training keeps what
// backward needs).
int dc_dit_reserve(dc_dit *m, int max_batch);
// Activation checkpointing for training: `keep` blocks (the first ones) keep
// their activations, the rest recompute theirs in backward from the block's
// input (-1: none recompute). The recomputed forward runs the same ops on the
// same inputs, so gradients are bit-identical; it costs one more forward of
// those blocks and saves all but one fp32 [B, T, D] stream of each. Replans
// the activations (reserve again).
int dc_dit_set_recompute(dc_dit *m, int keep);
// out[B, OC, H, W] = model(x[B, C, H, W], t[B] float timesteps, y[B] int32 labels).
// All buffers live on the model's backend. B <= max_batch. Like every
// function here that runs ops, returns the backend's status at its end
// (dc_backend_status: a failed op is an error, found without waiting).
int dc_dit_forward(dc_dit *m, dc_buf out, dc_buf x, dc_buf t, dc_buf y, int B);
// Given dout = dL/dout of the last forward, accumulates dL/dparams into
// m->params.grad (+=, so micro-batches sum). The parameters' units (unit 0
// the embedders, 1 + l block l, depth + 1 the final layer) are announced to
// the parameters' unit hook before and after their gradients are computed,
// final layer first, so sharded training can take each as it completes.
int dc_dit_backward(dc_dit *m, dc_buf dout, int B);
// Creates a DiT on the heap as a dc_model that dc_model_free releases whole;
// be NULL creates a layout (parameters registered, nothing allocated: for
// sizing, models/registry.h).
int dc_dit_new(const dc_dit_config *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out);
// The DiT behind a model, or NULL when it is another architecture.
dc_dit *dc_dit_of(dc_model *m);
// The DiT's entry in the model registry (models/dit_arch.c).
extern const dc_model_arch dc_dit_arch;
