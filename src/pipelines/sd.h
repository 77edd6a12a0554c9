// Stable Diffusion as people run it: text (and an image) in, pictures out.
// Loads the three components from any layout models/sd_source.h reads,
// encodes the prompts, samples latents with diffusion/ksampler.h on the
// ladders the model's scheduler config gives (diffusion/sd_sched_config.h)
// and decodes them (a pixel-space model, without a VAE, samples the pictures
// themselves). The library returns pictures as floats; the CLI writes the
// PNGs.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "diffusion/ksampler.h"
#include "diffusion/sd_sched_config.h"
#include "models/clip_text.h"
#include "models/sd_source.h"
#include "models/unet.h"
#include "models/vae.h"
#include "text/clip_tokenizer.h"

// Attention heads of a UNet: one count for every block (n 1), or one per block.
typedef struct {
    int n;
    int v[8];
} dc_heads;
// Parses "8" or "5,10,20,20"; -1 with a message naming the text.
int dc_heads_parse(const char *s, dc_heads *h);

typedef struct {
    const char *model;   // PATH: pipeline folder, component folder, single file, or a training run
    const char *vocab;   // the tokenizer's vocabulary (NULL: the model's tokenizer/ folder)
    const char *vocab_fallback;  // used when neither is there (NULL: none)
    unsigned st_flags;   // DC_ST_NO_VERIFY ...
    int prediction;      // -1: from the files (a run's checkpoint, the scheduler config; SD 2 single
                         // files: v), else a dc_prediction
    bool encoder;        // load the VAE's encoder too (img2img)
    const dc_heads *unet_heads;  // NULL: from config.json or SD's rules
} dc_sd_open_opts;

typedef struct {
    dc_backend *be;          // set by dc_sd_pipe_load
    dc_sd_model files;
    dc_sd_source src[3];     // text encoder, UNet, VAE (not in pixel space): found by dc_sd_pipe_find
    int nsrc;
    dc_sd_open_opts opts;    // as given to dc_sd_pipe_find (its pointers must outlive the load)
    dc_sd_sched_cfg sched;   // the scheduler config (Stable Diffusion's own when the model has none)
    unsigned warned;         // the samplers whose scheduler-config warnings were given
    int align;               // width and height are multiples of this (the VAE's factor times
                             // 2^(UNet blocks - 1))
    dc_clip_tokenizer tok;
    dc_clip_text *text;
    int text_skip;       // layers of the text encoder not run (1 for SD 2 single files)
    dc_model *unet;
    dc_vae *vae;             // NULL in pixel space
    bool pixels;             // pixel space: no VAE, the UNet samples the pictures
    int version;         // 1 or 2 (0: unknown)
    dc_prediction prediction;  // what the UNet predicts (eps, v or sample)
    int factor;          // the VAE's downsampling factor (8; 1 in pixel space)
    int channels;        // the UNet's input: the VAE's latent channels (4), or 3 in pixel space
    int default_size;    // pixels a side the model was trained at (512, or 768 for SD 2 v)
    char name[128];      // the model's name for the picture's parameters
    // Kept from one call to the next, because freeing any device buffer makes
    // a recorded step graph stale: the prompts' token ids (grown as needed),
    // and the last generation's buffers and sampler with its step graph (sd.c),
    // so a later generation of the same shape replays that graph from its
    // first step. dc_sd_pipe_close frees them.
    dc_buf ids;
    size_t ids_cap;
    struct dc_sd_gen_state *gen;
    struct dc_sd_run_loras *loras;  // applied at run time (dc_sd_pipe_add_lora), or NULL
} dc_sd_pipe;

// Opens a model in two steps, so that a request is checked before gigabytes
// are read: dc_sd_pipe_find reads what describes the model (model_index.json,
// the configs, a single file's header, the scheduler config, the tokenizer)
// and fills version, prediction, factor, align, default_size, name and sched;
// dc_sd_pipe_load then reads the weights onto be. dc_sd_pipe_open does both.
// dc_sd_pipe_close frees what either made.
int dc_sd_pipe_find(dc_sd_pipe *p, const dc_sd_open_opts *o);
int dc_sd_pipe_load(dc_sd_pipe *p, dc_backend *be);
int dc_sd_pipe_open(dc_sd_pipe *p, dc_backend *be, const dc_sd_open_opts *o);
void dc_sd_pipe_close(dc_sd_pipe *p);
// Merges the LoRA file at path (models/sd_lora.h: kohya's, diffusers' or
// PEFT's keys) into the loaded UNet and text encoder, its deltas scaled by
// unet_weight and text_weight (AUTOMATIC1111's multipliers): W += weight
// alpha / rank up @ down, rounded once into each weight's dtype.
int dc_sd_pipe_merge_lora(dc_sd_pipe *p, const char *path, float unet_weight, float text_weight);
// The same LoRA applied at run time instead (nn/adapter.h): the weights stay
// as loaded, and each adapted layer adds weight alpha / rank up(down(x)) to
// its output, the product and its delta rounded apart; up to
// DC_ADAPTERS_MAX files. Before the first generation (its step graphs and
// activations are planned with the deltas).
int dc_sd_pipe_add_lora(dc_sd_pipe *p, const char *path, float unet_weight, float text_weight);

typedef struct {
    const char *prompt, *negative_prompt;  // negative may be NULL (then "")
    int count;               // pictures
    int batch;               // pictures per sampling batch
    int width, height;       // pixels, multiples of align
    dc_ksampler_opts ks;     // sampler, steps, cfg, seed (prediction and ctx filled in)
    const float *init;       // img2img: [3, height, width] in [-1, 1] (NULL: txt2img)
    float strength;          // img2img: the share of the steps run (0..1]
} dc_sd_gen;

// Checks a request against the model (after dc_sd_pipe_find; no weights
// needed): sizes (multiples of align), counts, steps, img2img's strength
// against the steps, and the sampler against the scheduler config (its
// ladder is planned; what the config asks that the sampler does not follow
// is warned about once per sampler). dc_sd_generate checks the same.
int dc_sd_gen_check(dc_sd_pipe *p, const dc_sd_gen *g);

typedef void (*dc_sd_progress_fn)(void *ctx, const char *stage, int done, int total);
// Receives picture `index` ([3, height, width] floats in [-1, 1], unclamped,
// valid during the call) as soon as its batch is decoded; non-zero stops the
// run (its message set).
typedef int (*dc_sd_picture_fn)(void *ctx, int index, const float *image);

// Makes g->count pictures, handing each to on_picture as its batch finishes
// (so a long run keeps what it made, and memory holds one batch). Picture i
// uses the noise of sample index i of g->ks.seed, so a seed gives the same
// pictures at any batch size. The device buffers of a batch stay allocated
// after the call (see dc_sd_pipe), and are used again by the next call of
// the same batch and size.
int dc_sd_generate(dc_sd_pipe *p, const dc_sd_gen *g, dc_sd_picture_fn on_picture, void *ctx,
                   dc_sd_progress_fn progress, void *pctx);

// Embeddings of prompts into ctx[n, 77, D] (backend, compute dtype):
// tokenized (the tokens beyond 75 are cut, with a warning), then the text encoder.
int dc_sd_encode_prompts(dc_sd_pipe *p, const char *const *prompts, int n, dc_buf ctx);

// Component loaders, for `forward --component` and the pipeline: the config
// from config.json or the shapes, then the weights.
int dc_sd_load_text(dc_sd_source *s, dc_backend *be, int *skip, dc_clip_text **out);
int dc_sd_load_vae(dc_sd_source *s, dc_backend *be, bool encoder, bool decoder, dc_vae **out);
// A UNet component's config: a run checkpoint's metadata, config.json, else
// the shapes of its tensors (their files opened) and SD's head rules; heads
// given (NULL: none) take precedence.
int dc_sd_unet_config(const dc_sd_source *s, const dc_heads *heads, dc_unet_config *c);
// heads: NULL, or the UNet's attention heads (one count for every block, or
// one per block) for files whose width no SD rule covers.
int dc_sd_load_unet(dc_sd_source *s, dc_backend *be, int latent_h, int latent_w, const dc_heads *heads,
                    dc_model **out);
