// A LoRA file for a Stable Diffusion 1.x/2.x model, read into adapters
// (nn/adapter.h) over the model's UNet and text encoder parameters: every
// tensor of the file is a down or up factor or an alpha of one layer
// (models/sd_lora_keys.h names the formats), each layer's factors agree with
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
