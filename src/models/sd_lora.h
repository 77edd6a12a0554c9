// A LoRA file for a Stable Diffusion 1.x/2.x model, read into adapters
// (nn/adapter.h) over the model's UNet and text encoder parameters: every
// tensor of the file is a down or up factor or an alpha of one layer
// (models/sd_lora_keys.h names the formats), or a LyCORIS LoHa's or LoKr's
// tensor, read as the exact LoRA that gives its delta (models/lycoris.h).
// Each layer's factors agree with
// its weight's shape (a linear layer's down [rank, in] and up [out, rank]; a
// convolution's (LoCon) down [rank, ci, k, k] and up [co, rank, 1, 1]), and
// anything else is refused naming the tensor. A missing alpha means alpha =
// rank (a scale of 1), as kohya and diffusers read it.
#pragma once
#include "io/safetensors.h"
#include "nn/adapter.h"

// Reads f into unet and text (each dc_lora_init'ed over its part's
// parameters, which live on their backend; text may be NULL when the model
// has no text encoder to adapt: a file with text encoder keys is then
// refused), allocates the factors on the parts' backends and loads them. The
// multiplier is left to the caller (dc_lora.multiplier).
int dc_sd_lora_read(const dc_st_file *f, dc_lora *unet, dc_lora *text);

// ---- making LoRAs (models/sd_lora_train.c) ----------------------------------------------

#include "io/kv.h"
#include "models/sd_lora_keys.h"

// The layers a LoRA of an SD model trains, as the tools people use choose them:
//   attn         the attention projections (to_q, to_k, to_v, to_out.0 of
//                attn1 and attn2): diffusers' train_text_to_image_lora;
//   transformer  every linear (or 1x1) layer inside the transformers: the
//                attention, the feed-forward (ff.net.0.proj, ff.net.2),
//                proj_in and proj_out: kohya's default;
//   all          those and the resnets' (conv1, conv2, conv_shortcut,
//                time_emb_proj) and the resamplers' convolutions: kohya's
//                LoCon (conv_dim).
// In the text encoder: the attention's q, k, v, out_proj (attn), and the
// MLP's fc1, fc2 too (transformer, all), in every encoder layer.
typedef enum { DC_LORA_ATTN, DC_LORA_TRANSFORMER, DC_LORA_ALL } dc_lora_targets;

int dc_lora_targets_parse(const char *word, dc_lora_targets *t);
const char *dc_lora_targets_name(dc_lora_targets t);

// Adds a delta of rank `rank` and alpha `alpha` to every layer of l's target
// (the UNet's or the text encoder's parameters, per part; a joint set's
// "text_encoder." names count as the encoder's) that t names. Each item is
// named after its weight's module, as dc_sd_lora_read names them.
int dc_sd_lora_add_targets(dc_lora *l, dc_lora_part part, dc_lora_targets t, int rank, float alpha);

// The two forms a LoRA file is written in:
//   kohya      lora_unet_<path> / lora_te_text_model_<path> (the module path,
//              '.' written '_') .lora_down.weight, .lora_up.weight and
//              .alpha; the metadata ss_network_module, ss_network_dim and
//              ss_network_alpha (AUTOMATIC1111, ComfyUI and kohya read it);
//   diffusers  unet.<path> / text_encoder.text_model.<path>
//              .lora.down.weight, .lora.up.weight with alpha / rank folded
//              into up (diffusers' load_lora_weights reads a scale of 1).
typedef enum { DC_LORA_FILE_KOHYA, DC_LORA_FILE_DIFFUSERS } dc_lora_file_format;

// Writes LoRAs (either may be NULL) as one file: factors in PyTorch's
// layouts, in dtype dt (F32, F16 or BF16), then meta's entries. Atomic, as
// dc_st_write.
int dc_sd_lora_write(const char *path, const dc_lora *unet, const dc_lora *text, dc_lora_file_format fmt,
                     const dc_kv *meta, dc_dtype dt);
// The same from a checkpoint of a LoRA run (models/lora_model.h): its
// factors under prefix ("" the raw ones, "ema." the EMA's), named after
// their weights ("text_encoder." ones the text encoder's), and its
// "lora_alpha".
int dc_sd_lora_write_checkpoint(const dc_st_file *ck, const char *prefix, const char *path,
                                dc_lora_file_format fmt, const dc_kv *meta, dc_dtype dt);
// Reads a LoRA run's checkpoint's factors under prefix into LoRAs over the
// UNet's and the text encoder's parameters (text may be NULL when the run
// trained none of it), as dc_sd_lora_read reads a file.
int dc_sd_lora_read_checkpoint(const dc_st_file *ck, const char *prefix, dc_lora *unet, dc_lora *text);
