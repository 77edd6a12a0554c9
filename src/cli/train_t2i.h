// `diffusion train --model SD_PATH --data SHARDS`: the parts of a training
// run that differ for a text-to-image model. The base SD model gives the
// UNet (its config, and its weights unless --init random), the scheduler
// config, the text encoder that embeds the empty prompt for caption dropout
// and, for the run folder to be a model txt2img loads, everything else: the
// checkpoints record its absolute path as "base_model". The data come from
// the MDS shards `diffusion prepare` wrote (train/shards.h).
#pragma once
#include <stdbool.h>

#include "cli/args.h"
#include "diffusion/schedule.h"
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/sd_lora.h"
#include "pipelines/t2i_base.h"
#include "train/shards.h"
#include "train/source.h"
#include "train/trainer.h"

// The data set's columns as the flags map them (NULL, 0: not given; the
// columns `diffusion prepare` writes). Checkpoints record them, and a
// resumed run takes them from there.
typedef struct {
    const char *latents;  // --latents-column NAME
    const char *text;     // --text-column NAME
    const char *shapes;   // --column-shape NAME=D0,D1,...[,NAME=...]
    const char *dtypes;   // --column-dtype NAME=float16|float32|bfloat16[,...]
    float scale;          // --latent-scale X
} t2i_columns;

#define T2I_MAX_RAW 4

typedef struct {
    char model[4096];       // the base, an absolute path
    t2i_columns cols;       // owned copies
    dc_shards_raw raw[T2I_MAX_RAW];  // the bytes columns' shapes and dtypes (names into cols' copies)
    int nraw;
    char *raw_names;        // the parsed names' storage
    dc_t2i_opts opts;
    dc_t2i_base base;
    // The text encoder trains along with the UNet (--train-text-encoder, or a
    // checkpoint of such a run): the model is a joint one
    // (models/unet_text.h) of this encoder config, reading the captions' ids.
    bool train_text;
    dc_clip_text_config text;
    // A LoRA of the base UNet trains instead of the UNet (--lora RANK, or a
    // checkpoint of such a run): rank 0 for none. The base's weights stay
    // frozen as its files hold them; the run folder's lora.safetensors is
    // the newest checkpoint's LoRA (models/lora_model.h, models/sd_lora.h).
    int lora_rank;
    float lora_alpha;
    dc_lora_targets lora_targets;
    dc_lora_file_format lora_format;
    // DreamBooth with prior preservation (cli/dreambooth.h): the prepared
    // class set, paired with the data (the instance set) in every batch, its
    // loss weighed prior_weight; "" without.
    char class_data[4096];
    float prior_weight;
} t2i_run;

// Whether `model` names an SD model on disk (a file or folder) rather than
// an architecture's preset.
bool t2i_is_model_path(const char *model);

// Opens the base model and the data set's description (vocab: --vocab or
// NULL; cols: the mapping, may be NULL). train_text: the base's text
// encoder trains along with the UNet.
int t2i_open(t2i_run *r, const char *model, const char *data, const char *vocab, const t2i_columns *cols,
             unsigned st_flags, bool train_text);
// What a checkpoint says of the run: whether its text encoder trains (and
// that encoder's config), which replaces what t2i_open took from the base.
int t2i_from_checkpoint(t2i_run *r, const dc_st_file *ck);
// The run's model of config mc on be (NULL: a layout): the UNet, the joint
// model of the UNet and the text encoder, or the LoRA of the base's UNet
// (whose frozen weights it loads), its gradients as grad says (DC_GRAD_WINDOW
// for --offload and --update-in-backward: no full gradient buffer; a LoRA's
// factors always have one).
int t2i_create(const t2i_run *r, const dc_kv *mc, dc_backend *be, dc_grad_mode grad, dc_model **out);
// A new run's weights: the base UNet's (from_base) or random, and the base's
// text encoder when it trains along; a LoRA's factors as kohya starts them.
int t2i_init_weights(t2i_run *r, dc_model *m, bool from_base, uint64_t seed);
void t2i_close(t2i_run *r);
// --lora RANK, --lora-alpha, --lora-targets and --lora-format (NULL, 0: not
// given) into r, checked; rank 0 (a resumed run) sets the format alone.
int t2i_lora_settings(t2i_run *r, int rank, float alpha, const char *targets, const char *format);
// DreamBooth's prior preservation: the prepared class set class_data (""
// or NULL: none) paired with the data in every batch, weighed prior_weight.
int t2i_pair_class(t2i_run *r, const char *class_data, float prior_weight);
// A LoRA run's file, from the checkpoint ck_path just written: lora.safetensors
// beside it, in the run's format, with kohya's ss_ metadata.
int t2i_write_lora(const t2i_run *r, const char *ck_path, int64_t step);
// The mapping a checkpoint recorded (pointing into its metadata).
void t2i_columns_from_checkpoint(t2i_columns *c, const dc_st_file *ck);
// What a checkpoint of the run records of it: the base model's path and the
// mapping given.
int t2i_checkpoint_meta(const t2i_run *r, dc_kv *meta);

// The UNet's config for a new run: unet_config (a diffusers config.json)
// when given, else the base's, with the latent size and channels of the
// data.
int t2i_model_config(t2i_run *r, const char *unet_config, const dc_source *data, dc_kv *cfg);
// The data as a source in the run's order.
int t2i_source(t2i_run *r, uint64_t seed, dc_source *src);
// The schedule the base's scheduler config gives.
int t2i_schedule(t2i_run *r, dc_schedule *s);
// The prediction the scheduler config names (eps when it names none).
dc_prediction t2i_prediction(const t2i_run *r);

// diffusers' text-to-image fine-tuning recipe (train_text_to_image.py with
// its README's full fine-tune: lr 1e-5, batch 16, AdamW weight decay 0.01,
// eps 1e-8, clipping at 1, EMA 0.9999) and 10% caption dropout, as SD was
// trained (and MosaicML's recipe) so that guidance works.
dc_train_config t2i_train_config_default(void);
// --prediction's word (eps, v, sample) into *pred.
int t2i_parse_prediction(const char *word, int *pred);
// The flags that only mean something for one kind of run: those of SD runs
// without --model SD_PATH (sd false), DiT's shape and label flags with one;
// --unet-config with --init base.
int t2i_flags_check(const arg_parser *ap, bool sd, const char *unet_config, const char *init);

// The sampling grid of a checkpoint: each prompt drawn `per_prompt` times
// (seeds 0..per_prompt-1, DDIM, `steps` steps, guidance cfg) by the
// checkpoint as txt2img loads it (its EMA UNet with the base's other
// parts), one row a prompt, written to out (a PNG). be: the training
// backend, whose memory the pipeline shares while it draws.
typedef struct {
    const char *const *prompts;
    int n, per_prompt, steps;
    float cfg;
} t2i_grid_opts;
int t2i_grid(t2i_run *r, const char *ckpt, const char *out, const t2i_grid_opts *g, dc_backend *be);
// The sampling prompts: one a line of a file, or (path NULL) the first
// captions of the data set, up to `max`; *n found. Free with t2i_prompts_free.
int t2i_prompts(t2i_run *r, const char *path, int max, char ***prompts, int *n);
void t2i_prompts_free(char **prompts, int n);
