// Writing Stable Diffusion's components in the layouts other programs load:
// each component's tensors under diffusers' (transformers') names, for a
// pipeline folder, or under the original single-file names (CompVis and
// Stability: model.diffusion_model.*, first_stage_model.*,
// cond_stage_model.*); and the config.json files of a diffusers pipeline
// folder. The reverse of what models/sd_source.h reads, through the same
// name maps (dc_unet_weight_map, dc_vae_original_name,
// dc_clip_text_openclip_name), so a file written here loads back unchanged.
#pragma once
#include <stdbool.h>
#include "io/json.h"
#include "io/safetensors.h"
#include "models/clip_text.h"
#include "models/unet.h"
#include "models/vae.h"
#include "nn/params.h"

// Tensors being gathered for one safetensors file: names and host copies of
// the data in the file's dtype.
typedef struct {
    dc_st_entry *e;
    char (*names)[160];
    void **bufs;
    int n, cap;
} dc_sd_tensors;

// The layouts of the text encoder's tensors.
typedef enum {
    DC_SD_TEXT_TRANSFORMERS,  // text_encoder/model.safetensors: "text_model." + transformers names
    DC_SD_TEXT_SD1,           // single file, OpenAI CLIP: "cond_stage_model.transformer.text_model." + the same
    DC_SD_TEXT_SD2,           // single file, OpenCLIP: "cond_stage_model.model." + OpenCLIP names,
                              // q, k, v packed into in_proj_weight / in_proj_bias
} dc_sd_text_layout;

// The UNet's parameters in dtype dt: diffusers names, or (original) the
// single file's under "model.diffusion_model.".
int dc_sd_add_unet(dc_sd_tensors *t, const dc_unet *u, bool original, dc_dtype dt);
// The VAE's: diffusers names, or the single file's under "first_stage_model."
// (its attention projections as 1x1 convolutions, as the original has them).
int dc_sd_add_vae(dc_sd_tensors *t, const dc_vae *v, bool original, dc_dtype dt);
// The text encoder's first `layers` layers (its embeddings and final norm
// always) in layout lay.
int dc_sd_add_text(dc_sd_tensors *t, const dc_clip_text *x, int layers, dc_sd_text_layout lay, dc_dtype dt);
// Adds a copy of every tensor whose name starts with `from`, the start
// replaced by `to` (a layer that a reader expects but never runs).
int dc_sd_tensors_copy(dc_sd_tensors *t, const char *from, const char *to);
// Writes the tensors gathered (with the metadata entries kv, may be NULL) to
// path, atomically, and empties t for the next file.
int dc_sd_tensors_write(dc_sd_tensors *t, const char *path, const dc_kv *kv);
void dc_sd_tensors_free(dc_sd_tensors *t);

// unet/config.json: every key diffusers' UNet2DConditionModel reads for SD
// 1.x/2.x (its defaults spelled out), the heads under attention_head_dim (as
// diffusers names them for these models).
int dc_sd_write_unet_config(const dc_unet_config *c, const char *path);
// vae/config.json (AutoencoderKL).
int dc_sd_write_vae_config(const dc_vae_config *c, const char *path);
// text_encoder/config.json (transformers' CLIPTextModel) with `layers` layers,
// its torch_dtype that of dt.
int dc_sd_write_text_config(const dc_clip_text_config *c, int layers, dc_dtype dt, const char *path);
// scheduler/scheduler_config.json: base (a parsed scheduler config) with its
// prediction_type set to pred's; base NULL: Stable Diffusion's own (PNDM,
// scaled-linear betas from 0.00085 to 0.012, steps offset 1).
int dc_sd_write_scheduler_config(const dc_json *base, dc_prediction pred, const char *path);
// model_index.json of a StableDiffusionPipeline folder; unet false for a
// folder without one (a base to train one from scratch), vae false for a
// pixel-space model ("vae": [null, null]).
int dc_sd_write_model_index(const char *scheduler_class, bool unet, bool vae, const char *path);
