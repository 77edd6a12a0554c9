// The CLIP text encoder of Stable Diffusion: transformers' CLIPTextModel
// (the text tower alone, no projection): inference, and the training
// forward and backward (below).
//
// SD 1.x: OpenAI CLIP ViT-L/14 (vocab 49408, 77 positions, width 768, 12
// layers of 12 heads, MLP 3072, quick_gelu). SD 2.x: OpenCLIP ViT-H (width
// 1024, 16 heads, MLP 4096, exact GELU; 24 layers in single files, 23 in
// diffusers folders, which drop the last layer SD 2 never uses). A layer is
//   x = x + out_proj(causal_self_attention(layer_norm1(x)))
//   x = x + fc2(act(fc1(layer_norm2(x))))
// after x = token_embedding[ids] + position_embedding[0..T-1]; the output is
// final_layer_norm(x). LayerNorm eps 1e-5, attention scale 1/sqrt(64).
//
// Parameters are registered under transformers 5 names (no "text_model."
// prefix): embeddings.*, encoder.layers.N.*, final_layer_norm.*. Files that
// use OpenCLIP's names (SD 2.x single files) load through
// dc_clip_text_openclip_name.
#pragma once
#include <stdint.h>
#include "backend/backend.h"
#include "io/json.h"
#include "io/kv.h"
#include "nn/params.h"
#include "nn/weights.h"

typedef struct {
    int vocab;      // token embedding rows (49408)
    int positions;  // T: every sequence is this long (77)
    int width;      // W
    int layers;     // L
    int heads;      // H (head size W / H, 64 in both SD encoders)
    int ffn;        // MLP hidden width F
    dc_act act;     // DC_ACT_QUICK_GELU (OpenAI CLIP) or DC_ACT_GELU_ERF (OpenCLIP)
    float eps;      // LayerNorm eps (1e-5)
} dc_clip_text_config;

// The config from a transformers config.json (a CLIPTextConfig, or a
// CLIPConfig's "text_config"): vocab_size, max_position_embeddings,
// hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
// hidden_act, layer_norm_eps; a key left out takes CLIPTextConfig's default,
// as transformers does. path names the file in messages.
int dc_clip_text_config_from_json(dc_clip_text_config *c, const dc_json *root, const char *path);
// The config from the tensor shapes of w (prefix already set) in the naming
// scheme names: DC_NAMES_DIFFUSERS for transformers names, DC_NAMES_ORIGINAL
// for OpenCLIP's. The shapes cannot show the head count or the activation:
// heads = W / 64 (both SD encoders); OpenCLIP names mean exact GELU; with
// transformers names, widths of 1024 and more (OpenCLIP ViT-H and bigG
// converted by diffusers) mean exact GELU, narrower ones OpenAI's quick_gelu.
int dc_clip_text_config_infer(dc_clip_text_config *c, const dc_weights *w, dc_names names);
int dc_clip_text_config_validate(const dc_clip_text_config *c);
// The config as metadata entries under transformers' config.json names,
// each after prefix ("text_encoder_": a UNet's checkpoint that trains its
// encoder), and back from entries (keys/values, n of them; what names them
// in messages). Checked.
int dc_clip_text_config_to_kv(const dc_clip_text_config *c, const char *prefix, dc_kv *kv);
int dc_clip_text_config_from_kv(dc_clip_text_config *c, const char *prefix, const char *const *keys,
                                const char *const *values, int n, const char *what);

// Where transformers names start below w's prefix: "text_model." when the
// files hold text_model.embeddings.token_embedding.weight (transformers 4,
// and SD 1.x single files under "cond_stage_model.transformer."), else ""
// (transformers 5). Append it to the prefix before inferring or loading.
const char *dc_clip_text_prefix(const dc_weights *w);

// A dc_weight_map from our names to OpenCLIP's (ctx: the dc_clip_text_config):
// token_embedding.weight, positional_embedding, transformer.resblocks.N.
// {ln_1, ln_2, attn.in_proj_weight / in_proj_bias (q, k, v packed in that
// order along the rows), attn.out_proj, mlp.c_fc, mlp.c_proj}, ln_final.
int dc_clip_text_openclip_name(void *ctx, const char *param, dc_weight_src *src);

typedef struct dc_clip_text_modules dc_clip_text_modules;
typedef struct dc_clip_text_acts dc_clip_text_acts;
typedef struct dc_clip_text_train dc_clip_text_train;

typedef struct {
    dc_clip_text_config cfg;
    dc_backend *be;
    dc_params *params;           // transformers names, state-dict order: &own, or a joint set
    dc_params own;               // its parameters, unless registered into a joint set
    int first, end;              // its parameters in *params: [first, end)
    int unit;                    // the set's unit holding them (one unit: the whole encoder)
    dc_clip_text_modules *mods;  // its layers, as modules holding parameter handles
    dc_clip_text_acts *acts;     // activations planned for up to max_batch sequences
    int max_batch;
    const void *adapter;         // the parameters' adapter when reserved: one attached since is reserved again
    dc_clip_text_train *train;   // a training forward's activations, or NULL
} dc_clip_text;

// Registers the parameters and allocates them frozen, kept in `loaded` where
// the backend can (dc_params_alloc_frozen; the files' dtype from
// dc_weights_dtype, or DC_F32); load weights next.
int dc_clip_text_create(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be, dc_dtype loaded);
// Registers into ps (empty) the names and shapes dc_clip_text_create
// registers, allocating nothing: for listing and checking names.
int dc_clip_text_params(dc_params *ps, const dc_clip_text_config *c);
// Initialises every weight as transformers initialises a CLIPTextModel
// (CLIPPreTrainedModel._init_weights in transformers/models/clip/
// modeling_clip.py, initializer_factor 1): embeddings N(0, 0.02); the q, k
// and v projections N(0, d^-0.5 (2L)^-0.5), the output projection
// N(0, d^-0.5); the MLP's fc1 N(0, (2d)^-0.5) and fc2 N(0, d^-0.5 (2L)^-0.5);
// LayerNorms 1 and 0; every bias 0 (d the width, L the layers). Seeded:
// parameter i's element j is keyed (seed, 3, i, j).
int dc_clip_text_init_weights(dc_clip_text *m, uint64_t seed);
// Loads every parameter from w (its prefix set: "", "text_model.",
// "cond_stage_model.transformer.text_model." for transformers names;
// "cond_stage_model.model." for OpenCLIP names with DC_NAMES_ORIGINAL).
// A missing or mis-shaped tensor is refused naming it; tensors the model
// does not use (text_projection, logit_scale, later layers) are ignored.
int dc_clip_text_load(dc_clip_text *m, const dc_weights *w, dc_names names);
// Plans the activations for batches of up to max_batch sequences of
// cfg.positions tokens.
int dc_clip_text_reserve(dc_clip_text *m, int max_batch);
// Runs layers 0 .. layers-1-skip over ids[B, T] (I32 on the backend, T =
// positions, each in [0, vocab): see dc_clip_text_check_ids). Outputs, each
// [B, T, W] on the backend in its own dtype, or p NULL when not wanted:
//   hidden      = final_layer_norm(output of the last layer run);
//   penultimate = the stream entering that last layer, without the final
//                 LayerNorm (with skip 0, transformers' hidden_states[-2]).
// SD 1.x conditions on hidden with skip 0; SD 2.x on hidden with skip 0 from
// a 23-layer diffusers encoder, or skip 1 from a 24-layer single file (the
// same numbers). 0 <= skip < layers.
int dc_clip_text_forward(dc_clip_text *m, dc_buf hidden, dc_buf penultimate, dc_buf ids, int B, int skip);
// 0, or -1 naming the first id outside [0, vocab) and its place: the
// embedding ops do not check, so callers check ids on the host before upload.
int dc_clip_text_check_ids(const int32_t *ids, int64_t n, int vocab);
void dc_clip_text_free(dc_clip_text *m);
// Multiply-adds of one sequence through every layer (projections, MLP,
// and the causal half of the attention products), for benchmarks.
double dc_clip_text_macs(const dc_clip_text *m);

// ---- training (clip_text_train.c)
//
// A training forward keeps every layer's activations (about 12 W + 4 F
// values a token a layer, mostly in the compute dtype), and the backward
// runs the layers last to first: dL/dparams += for the parameters that
// train, while dL/d(stream) flows through frozen ones too (LoRA adapts a
// frozen encoder through the set's adapter).

// dc_clip_text_create with every parameter trainable: an fp32 master copy
// and its gradient (and a compute copy where the backend computes in
// another dtype). Load or initialise the weights next.
int dc_clip_text_create_trainable(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be);
// The same, its parameters registered into `set` (a joint set: a UNet and
// the text encoder it reads, trained as one) as one more unit, each name
// after set->prefix ("text_encoder."); the caller allocates the set once
// every model of it is registered, and frees it after them. Nothing runs
// before the set is allocated.
int dc_clip_text_create_in(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be, dc_params *set);
// Plans what a training forward keeps for batches of up to max_batch sequences.
int dc_clip_text_train_reserve(dc_clip_text *m, int max_batch);
// Bytes dc_clip_text_train_reserve allocates for max_batch on a backend
// computing in `compute`, without allocating.
int64_t dc_clip_text_train_bytes(const dc_clip_text_config *c, dc_dtype compute, int max_batch);
// hidden [B, T, W] (any float dtype) = final_layer_norm(output of layers
// 0 .. layers-1-skip), as dc_clip_text_forward, keeping what backward reads.
int dc_clip_text_train_forward(dc_clip_text *m, dc_buf hidden, dc_buf ids, int B, int skip);
// dL/dparams += from dhidden [B, T, W] (any float dtype) = dL/dhidden of the
// last training forward.
int dc_clip_text_backward(dc_clip_text *m, dc_buf dhidden);
