// A UNet trained together with the CLIP text encoder it reads: one dc_model
// whose conditioning is token ids (DC_COND_TOKENS). For DreamBooth's and
// LoRA's --train-text-encoder, and for a model trained from scratch whose
// frozen encoder proves too weak to tell its captions apart.
//
// Its parameters are one joint set (nn/params.h): the UNet's under their own
// names and units, then the encoder's under "text_encoder." + transformers'
// names as one unit more. So the optimizer (and ZeRO, offload), clipping,
// the EMA and checkpoints treat both as one model, with no code of their own.
//
// forward runs the encoder's training forward over the ids (the hidden
// states after its final LayerNorm, which SD conditions on) and the UNet's
// forward over those; backward runs the UNet's backward, which leaves the
// text's gradient, then the encoder's. Its config entries are the UNet's
// with the encoder's after them ("text_encoder_" + config.json's names), so
// a checkpoint still reads as a UNet's, and says that its encoder trains.
#pragma once
#include "models/clip_text.h"
#include "models/unet.h"

#define DC_UNET_TEXT_PREFIX "text_encoder."  // the encoder's names in the joint set
#define DC_UNET_TEXT_KV "text_encoder_"      // its config entries

// A UNet of config uc for latents lh x lw with the encoder tc (the layers SD
// runs: SD 2's single files hold one more, which is left out), trainable
// with gradients as grad says (nn/params.h), on be; be NULL: a layout (registered, nothing allocated). The encoder's
// vocabulary must hold every id the data give. Free with dc_model_free.
int dc_unet_text_new_train(const dc_unet_config *uc, const dc_clip_text_config *tc, dc_backend *be,
                           dc_grad_mode grad, int latent_h, int latent_w, dc_model **out);
// The same trained through: every weight frozen as loaded (no master, no
// gradient), the forward keeping what backward reads, and the backward
// taking the gradient through both parts to their adapters (a LoRA of the
// UNet and the text encoder, models/lora_model.h).
int dc_unet_text_new_frozen_train(const dc_unet_config *uc, const dc_clip_text_config *tc, dc_backend *be,
                                  dc_dtype loaded, int latent_h, int latent_w, dc_model **out);
// The encoder's config that a config's entries (a checkpoint's metadata)
// hold: 0, or 1 when they hold none (a UNet trained alone).
int dc_unet_text_config_of(const char *const *keys, const char *const *values, int n, const char *what,
                           dc_clip_text_config *tc);
// The parts of a joint model; NULL when m is not one.
dc_model *dc_unet_text_unet(dc_model *m);
dc_clip_text *dc_unet_text_encoder(dc_model *m);
