// Training a LoRA of a frozen model: a dc_model whose parameters are the
// LoRA's factors (nn/adapter.h) and whose forward and backward are the
// frozen model's, with the deltas applied at run time. The trainer, the
// optimizer, ZeRO, the EMA and checkpoints see the factors alone: the base
// weights stay as loaded (F16 or BF16 where they come so), with no master
// copy, gradient or moments.
//
// The inner model must run a training forward and backward through frozen
// weights (dc_unet_new_frozen_train), and its parameter set must be the
// LoRA's target. The factors are one parameter unit.
#pragma once
#include "models/model.h"
#include "nn/adapter.h"

// The wrapper over inner (owned from here on, freed with it, also on
// failure) and the LoRA over inner's parameters, its items added (not yet
// allocated): allocates the factors with gradients on inner's backend and
// attaches the LoRA (a layout, inner sized but not allocated, gives one). config_to_kv writes inner's config, then the LoRA's
// rank ("lora_rank"), alpha ("lora_alpha") and extra (key, value) entries
// the caller names (its targets); init_weights draws the factors as kohya
// and PEFT do: down kaiming-uniform (a = sqrt 5: U(+-1/sqrt(fan_in))), up
// zero, so training starts from the base model itself.
int dc_lora_model_new(dc_model *inner, dc_lora *lora, const dc_kv *extra, dc_model **out);
// The LoRA a wrapper trains (NULL for another model), and its frozen model.
dc_lora *dc_lora_model_lora(dc_model *m);
dc_model *dc_lora_model_inner(dc_model *m);
