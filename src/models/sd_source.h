// Where the components of a Stable Diffusion model are, in the layouts
// people have them, without a converter:
//   - a diffusers pipeline folder (model_index.json, unet/, vae/,
//     text_encoder/, tokenizer/, scheduler/; with or without model_index.json;
//     when there, its _class_name must be StableDiffusionPipeline or
//     StableDiffusionImg2ImgPipeline, and it names each component's folder
//     and class, which must be those of SD),
//   - one component's folder (config.json and its *.safetensors, possibly
//     sharded or an fp16 variant), or that component's weights file alone,
//   - a single-file checkpoint in the original layout (model.diffusion_model.*,
//     first_stage_model.*, cond_stage_model.transformer.* for SD 1.x or
//     cond_stage_model.model.* (OpenCLIP) for SD 2.x),
//   - a training run of this engine: its folder (checkpoints
//     step_NNNNNNN.safetensors, the newest readable one taken) or one of its
//     checkpoints, told from other files by its metadata ("format" =
//     "diffusion.c checkpoint v2", "model" = "UNet2DConditionModel"). The
//     UNet is the checkpoint's EMA ("ema." + diffusers' names, the config in
//     the metadata), and so is the text encoder of a run that trained it
//     along ("ema.text_encoder." + transformers' names: models/unet_text.h);
//     every other component is that of the model its "base_model" entry
//     names, opened as any of the layouts above. A run that trained a LoRA
//     ("lora_rank" in its metadata) is the base with the checkpoint's LoRA
//     merged (models/sd_lora.h).
// A model may be pixel-space (no VAE: model_index.json's "vae" is [null,
// null], or a pipeline folder or single file holds none): its UNet draws the
// pictures themselves, as DeepFloyd IF's does.
// A dc_sd_source says, for one component, which files hold it, under which
// key prefix and naming, and its config.json when there is one. Large files
// are mapped (io/safetensors.h), so nothing is read into memory twice.
// Weight files are found (models/sd_files.h: one file, an index's shards,
// shards without an index) before any is opened, so a request can be checked
// against the configs before gigabytes are read.
#pragma once
#include <stdbool.h>
#include "io/json.h"
#include "io/safetensors.h"
#include "models/sd_files.h"
#include "nn/weights.h"

typedef enum { DC_SD_UNET, DC_SD_VAE, DC_SD_TEXT } dc_sd_part;
const char *dc_sd_part_name(dc_sd_part p);  // "unet", "vae", "text_encoder"

typedef struct dc_sd_model {
    char path[4096];        // what the user named
    bool folder;            // a pipeline folder (else a single file, or a component on its own)
    bool single;            // a single-file checkpoint holding every component
    int version;            // 1 or 2 when the files say (text encoder names or cross-attention
                            // width), else 0
    dc_st_file file;        // the single file (or a component's lone file)
    unsigned st_flags;      // DC_ST_NO_VERIFY ...
    char pipeline[128];     // model_index.json's _class_name ("" without the file)
    int tokenizer, scheduler;  // model_index.json names the component (1), null (0), or nothing (-1)
    int unet, vae;          // the same for the UNet (null: a base to train one from scratch) and
                            // the VAE (null: pixel space)
    // A training run: `file` is the checkpoint used, `base` the model it names.
    bool run;
    bool lora_run;          // a run that trained a LoRA: every component is the base's, and the
                            // checkpoint's LoRA (its raw factors) goes into its UNet and text encoder
    struct dc_sd_model *base;  // owned
    int run_prediction;     // the run's "prediction" (absent: epsilon), a dc_prediction
} dc_sd_model;

typedef struct {
    dc_sd_part part;
    dc_st_file files[DC_SD_MAX_FILES];  // owned when nfiles_owned
    int nfiles, nfiles_owned;
    dc_weights w;            // files + prefix
    dc_names names;          // the naming scheme of the keys
    dc_json_doc config;      // config.json (root NULL when there is none)
    const dc_st_file *meta;  // a file whose metadata holds the config (a run's checkpoint), or NULL
    char dir[4096];          // the component's folder ("" for a single file)
    // a folder's weight files, found by dc_sd_source_find, opened by
    // dc_sd_source_open_files: file names in dir, and the index naming them
    char fnames[DC_SD_MAX_FILES][256];
    int nfnames;
    dc_json_doc index;
    char index_name[256];
    unsigned st_flags;
} dc_sd_source;

// Opens PATH (any layout above; a single file's header is read, a folder's
// model_index.json checked; a run's checkpoint and its base model opened).
// A pickle (.ckpt, .bin) is refused, saying how to convert it. flags:
// DC_ST_NO_VERIFY to skip checksums.
int dc_sd_model_open(dc_sd_model *m, const char *path, unsigned flags);
// Whether m is a training run whose text encoder trained along with its UNet.
bool dc_sd_run_trains_text(const dc_sd_model *m);
// Whether the model has no VAE (see above): its pictures are the UNet's
// samples, 3 channels in [-1, 1].
bool dc_sd_model_pixel_space(const dc_sd_model *m);
void dc_sd_model_close(dc_sd_model *m);
// The source of one component: dc_sd_source_find (its config, and which
// files hold it: a folder's are not opened yet), then
// dc_sd_source_open_files (their headers; shards checked against each other
// and their index); dc_sd_source_open does both. A component the files do not
// hold is refused naming what was looked for. The source may point into m's
// single file: close it before m.
int dc_sd_source_find(dc_sd_source *s, dc_sd_model *m, dc_sd_part part);
int dc_sd_source_open_files(dc_sd_source *s);
int dc_sd_source_open(dc_sd_source *s, dc_sd_model *m, dc_sd_part part);
void dc_sd_source_close(dc_sd_source *s);
// The config root, or NULL when the component came without config.json.
static inline const dc_json *dc_sd_config(const dc_sd_source *s) { return s->config.root; }

// The scheduler config of a pipeline folder (a run's: its base model's): 0 with its path in buf
// (scheduler/scheduler_config.json); 1 when there is none (a single file, no
// scheduler/ folder, or model_index.json naming no scheduler); -1 when
// model_index.json names a scheduler whose config is missing, or the path
// cannot be reached.
int dc_sd_scheduler_file(const dc_sd_model *m, char *buf, size_t cap);
// The tokenizer folder of a pipeline (tokenizer/ holding vocab.json; a run's:
// its base model's), or NULL.
const char *dc_sd_tokenizer_dir(const dc_sd_model *m, char *buf, size_t cap);
