// The Stable Diffusion UNet (diffusers' UNet2DConditionModel, SD 1.x and
// 2.x) as a dc_model: eps (or v) = unet(latents x[B,4,h,w], timesteps t[B],
// text embeddings ctx[B,len,ctx_dim]). Created for inference (frozen
// weights, nn/params.h) or for training (dc_unet_new_train).
//
// Layout (diffusers names; L = layers per block, N blocks of channels ch[i]):
//   conv_in 3x3 -> time_embedding (sinusoidal ch[0] -> Linear-SiLU-Linear to 4 ch[0])
//   down_blocks.i: L x (resnet [+ Transformer2D]) then a stride-2 conv (not the last)
//   mid_block: resnet, Transformer2D, resnet
//   up_blocks.i: L+1 x (concat skip, resnet [+ Transformer2D]) then nearest 2x + conv
//   conv_norm_out (GroupNorm + SiLU) -> conv_out 3x3
// Every down-path output (conv_in's, each layer's, each downsampler's) is a
// skip connection that the up blocks consume in reverse order.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "io/json.h"
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "models/registry.h"
#include "nn/params.h"
#include "nn/weights.h"

#define DC_UNET_MAX_BLOCKS 6
#define DC_UNET_MAX_LAYERS 4
#define DC_UNET_CTX_LEN 77  // the text encoders' sequence length

// dc_prediction (models/model.h): what the network's output means. The UNet
// cannot tell: the scheduler's config (prediction_type) or the user says it.

typedef struct {
    int in_channels, out_channels;  // 4, 4
    int nblocks;                    // len(block_out_channels): 4
    int ch[DC_UNET_MAX_BLOCKS];     // block_out_channels: 320 640 1280 1280
    int layers;                     // layers_per_block: 2
    bool attn[DC_UNET_MAX_BLOCKS];  // down block i has cross-attention (up block N-1-i mirrors it)
    int heads[DC_UNET_MAX_BLOCKS];  // attention heads of down block i (the mid block uses the
                                    // last; up block N-1-i the same as down block i)
    int ctx_dim;                    // cross_attention_dim: 768 (SD 1.x), 1024 (SD 2.x)
    int groups;                     // norm_num_groups: 32
    float eps;                      // norm_eps of the resnets and conv_norm_out: 1e-5
    bool linear_proj;               // use_linear_projection: proj_in/out are Linear (SD 2.x)
                                    // rather than 1x1 convs [C, C, 1, 1] (SD 1.x)
    bool upcast_attention;          // recorded from config.json (every backend's attention
                                    // accumulates scores and softmax in fp32 anyway)
    int sample_size;                // the latent size the model was trained at (0: unknown)
    dc_prediction prediction;       // set by the caller from the scheduler's config
} dc_unet_config;

// SD 1.5's config (the others differ in ctx_dim, heads and linear_proj).
void dc_unet_config_sd15(dc_unet_config *c);
// A named config: "sd1.5" (SD 1.x's UNet) or "sd2.1" (SD 2.x's, at 768 px):
// 0, or 1 when name is neither.
int dc_unet_config_named(const char *name, dc_unet_config *c);
// Checks the config; the message names the field at fault.
int dc_unet_config_validate(const dc_unet_config *c);
// The time embedding's width: 4 ch[0].
static inline int dc_unet_time_dim(const dc_unet_config *c) { return 4 * c->ch[0]; }

// From a diffusers unet/config.json already parsed (root: its object; path
// for messages). Keys that change the computation in ways this engine does
// not build (class embeddings, several transformer layers per block,
// "scale_shift" time conditioning, ...) are refused by name.
int dc_unet_config_from_json(dc_unet_config *c, const dc_json *root, const char *path);
// Reads and parses the file at path (config.json).
int dc_unet_config_from_json_file(dc_unet_config *c, const char *path);
// Inferred from the tensor shapes of w under `names`: channels from the
// convolutions, layers per block and blocks by counting, cross-attention
// width from attn2.to_k, linear or 1x1-conv projections from proj_in's rank.
// Heads are not in any shape; the rule is SD's: cross-attention width 768
// (SD 1.x) has 8 heads in every block, any other width heads of 64 channels
// (SD 2.x: 5, 10, 20, 20). Where the channels do not split into heads of 64,
// heads stay 0 and the caller must set c->heads (validation says so).
// GroupNorm groups and eps take SD's values (32, 1e-5).
int dc_unet_config_infer(dc_unet_config *c, const dc_weights *w, dc_names names);
// The config as metadata entries: "model" = "UNet2DConditionModel", then
// diffusers config keys with JSON values ("block_out_channels" = "[320, 640, 1280, 1280]").
int dc_unet_config_to_kv(const dc_unet_config *c, dc_kv *kv);
// The config back from such metadata (a file this engine wrote).
int dc_unet_config_from_meta(dc_unet_config *c, const dc_st_file *f);
// The config back from such entries (a model registry config).
int dc_unet_config_from_kv(dc_unet_config *c, const dc_kv *kv);

// The original single-file (CompVis/Stability) name of the diffusers
// parameter `param` ("down_blocks.1.resnets.0.conv1.weight" ->
// "input_blocks.4.0.in_layers.2.weight"), without the file's prefix.
int dc_unet_original_name(const dc_unet_config *c, const char *param, char *out, size_t n);
// The same as a dc_weight_map (ctx: the const dc_unet_config *).
int dc_unet_weight_map(void *ctx, const char *param, dc_weight_src *src);

typedef struct dc_unet_modules dc_unet_modules;
typedef struct dc_unet_acts dc_unet_acts;
typedef struct dc_unet_train dc_unet_train;

typedef struct {
    dc_model base;       // first: the trainer, sampler and CLI see &m->base
    dc_unet_config cfg;
    dc_backend *be;
    dc_params own;       // its parameters (diffusers state-dict keys, in state-dict order), unless
                         // it trains in a joint set (dc_unet_new_train_in): base.params is the set
    int first, end;      // its parameters in base.params: [first, end)
    int unit0;           // the set's unit of its first (units of a joint set follow on)
    dc_unet_modules *mods;
    dc_unet_acts *acts;  // inference: planned by reserve for up to max_batch
    dc_unet_train *train;  // training: what the forward keeps for backward (unet_train.c)
    bool trains;         // created to train (dc_unet_new_train, _frozen_train)
    int keep;            // training: the layers keeping their activations (-1: all; set_recompute)
    bool selective;      // training: selective recompute (set_selective)
    bool lend_grads;     // training: the gradients lie in the activations' memory (lend_grads)
    int max_batch;
    const void *adapter; // the parameters' adapter when reserved: one attached since is reserved again
    int lh, lw;          // latent height and width
    const void *kv_ctx;  // the text whose keys and values are ready (dc_unet_prepare_text), or NULL
    int kv_B, kv_len;    // its rows and tokens
} dc_unet;

// Creates the model with frozen weights (zeros until loaded or initialised),
// kept in `loaded` where the backend can (dc_params_alloc_frozen; the files'
// dtype from dc_weights_dtype, or DC_F32), for latents of lh x lw (multiples
// of 2^(nblocks-1)). info: 4 channels in and out, DC_COND_TEXT with ctx_len
// 77 and ctx_dim. be NULL creates a layout: parameters registered, nothing
// allocated (sizing: activation bytes, macs, config). Free with dc_model_free.
int dc_unet_new(const dc_unet_config *c, dc_backend *be, dc_dtype loaded, int latent_h, int latent_w,
                dc_model **out);
// The same with trainable parameters (fp32 masters, and gradients as grad
// says: DC_GRAD_BUFFER, or DC_GRAD_WINDOW for optimizer offload) for
// training: the forward keeps what backward reads, and
// backward accumulates every parameter's gradient (the latents take none;
// the text does where the forward's cond.dctx asks for it). Parameter units:
// conv_in with the time embedding, each transformer, resnet and resampling
// conv, the output layers (unet_blocks.h). info.blocks
// counts the layers set_recompute's keep runs over (resnets with their
// transformers, resamplers); recomputed layers give the same gradients.
int dc_unet_new_train(const dc_unet_config *c, dc_backend *be, dc_grad_mode grad, int latent_h, int latent_w,
                      dc_model **out);
// Training through a frozen UNet (LoRA: the deltas' factors train, nn/adapter.h):
// its weights as dc_unet_new keeps them (the loaded dtype, no master, no
// gradient), its forward keeping what backward reads, and its backward
// taking dL/dx through every layer to the adapter's factors and the text.
int dc_unet_new_frozen_train(const dc_unet_config *c, dc_backend *be, dc_dtype loaded, int latent_h, int latent_w,
                             dc_model **out);
// The same, its parameters registered into `set` (a joint set, which the
// caller allocates once every model of it is registered, and frees after
// them) under their own names and units. Nothing runs before the set is
// allocated.
int dc_unet_new_train_in(const dc_unet_config *c, dc_backend *be, int latent_h, int latent_w, dc_params *set,
                         dc_model **out);
// Registers the parameters of config c into ps (names and shapes, in
// diffusers' state-dict order) without allocating them: listings, checks.
int dc_unet_register(const dc_unet_config *c, dc_params *ps);
// The UNet behind a model, or NULL when it is another architecture.
dc_unet *dc_unet_of(dc_model *m);
// Changes the latent size, releasing the planned activations (reserve again).
int dc_unet_set_size(dc_model *m, int latent_h, int latent_w);
// Frees the planned activations (reserve again before the next forward).
void dc_unet_release(dc_model *m);
// Loads every weight from w under `names` (diffusers keys or the original
// single-file keys), refusing a missing or mis-shaped tensor by name.
int dc_unet_load(dc_model *m, const dc_weights *w, dc_names names);
// Computes every transformer's keys and values of the text cond->ctx (B rows)
// once, for the forwards that follow with the same cond buffer and B: a
// sampler calls it after it writes the text, before its first step. Writing
// other text into that buffer needs another call; cond NULL forgets the text
// (call it before the buffer is freed). 0 or -1 (message set).
int dc_unet_prepare_text(dc_model *m, const dc_cond *cond, int B);
// Bytes of the activations planned for max_batch at the current size (for
// memory budgets: the inference arena, or a training model's); the
// backend's own workspaces come on top.
size_t dc_unet_activation_bytes(const dc_model *m, int max_batch);

// The UNet in the model registry (models/registry.h).
extern const dc_model_arch dc_unet_arch;
