// A trained Stable Diffusion UNet made into a model other programs load: the
// UNet of a training checkpoint (its EMA, or the raw weights) joined with the
// text encoder, tokenizer, scheduler and VAE of the model it was trained from
// (the checkpoint's "base_model"), written as
//   - a diffusers pipeline folder (model_index.json, unet/, text_encoder/,
//     tokenizer/, scheduler/, vae/), which diffusers' from_pretrained and
//     this engine load; or
//   - one safetensors file in the original layout (model.diffusion_model.*,
//     first_stage_model.*, cond_stage_model.* as SD 1.x or 2.x has it), which
//     AUTOMATIC1111, diffusers' from_single_file and this engine load.
// The scheduler config says the run's prediction (the checkpoint's
// "prediction" entry; absent: epsilon). A pixel-space base (no VAE) can only
// be a folder (with "vae": [null, null]).
#pragma once
#include <stdbool.h>
#include "backend/backend.h"
#include "io/safetensors.h"

typedef struct {
    const char *base;   // the base model (NULL: the checkpoint's "base_model")
    bool raw;           // the raw weights rather than the EMA
    bool half;          // fp16 (else the UNet in fp32, the other parts in their own dtype)
    const char *vocab;  // OpenAI's BPE file, for the tokenizer/ of a folder made from a
                        // single-file base (which holds none); NULL refuses that case
    unsigned st_flags;  // DC_ST_NO_VERIFY ...
} dc_sd_export_opts;

// True when out names one file (ends in .safetensors), false for a folder.
bool dc_sd_export_is_file(const char *out);
// Writes the export of checkpoint ckpt to out: a file atomically, a folder
// built under out.tmp.PID and renamed to out, which must not exist (a file
// may be replaced). be: where the weights are loaded (the CPU backend). On
// failure nothing is left at out. *which: "EMA" or "raw".
int dc_sd_export(const dc_st_file *ckpt, const char *out, const dc_sd_export_opts *o, dc_backend *be,
                 const char **which);
// A base model with LoRA files merged into its UNet and text encoder (at
// weights[i]: models/sd_lora.h), written as an export is: the UNet in fp32
// (or fp16 with o->half), the text encoder as loaded, the other parts and
// the scheduler config (its prediction unchanged) the base's. o->base is
// not read; base is not a training run.
int dc_sd_lora_merge_write(const char *base, const char *const *loras, const float *weights, int n, const char *out,
                           const dc_sd_export_opts *o, dc_backend *be);
