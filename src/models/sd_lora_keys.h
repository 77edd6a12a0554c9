// The names LoRA files give the layers of a Stable Diffusion 1.x/2.x UNet and
// CLIP text encoder, in the formats people trade, mapped to the engine's
// parameters (diffusers' UNet keys, transformers 5's text encoder keys):
//
//   kohya (sd-scripts, AUTOMATIC1111, ComfyUI):
//     lora_unet_<diffusers module path, '.' written '_'>.{lora_down,lora_up}.weight, .alpha
//     lora_te_text_model_<transformers module path, '.' written '_'>.{...}
//     (lora_down [rank, in] or a k x k conv to rank, lora_up [out, rank] or a
//     1 x 1 conv; LoCon's conv layers use the same names)
//   diffusers (save_lora_weights): unet.<path>.lora.down.weight / .lora.up.weight,
//     text_encoder.[text_model.]<path>.lora.{down,up}.weight (or, as older
//     diffusers wrote the text encoder's, .lora_linear_layer.{down,up}.weight),
//     optional .alpha
//   PEFT: the same paths with .lora_A.weight (down) / .lora_B.weight (up), and
//     unet.<path>.alpha where kept
//   the old attention-processor form: unet.<...>.attn1.processor.to_q_lora.down.weight
//     (to_q, to_k, to_v, to_out.0 as to_out_lora)
//   LyCORIS (kohya's names): LoHa's .hada_w1_a, .hada_w1_b, .hada_w2_a,
//     .hada_w2_b and LoKr's .lokr_w1 (or .lokr_w1_a, .lokr_w1_b) and .lokr_w2
//     (or .lokr_w2_a, .lokr_w2_b), with .alpha (models/lycoris.h); their
//     Tucker cores (.hada_t1, .hada_t2, .lokr_t2) and LoCon's .lora_mid are
//     refused by name
//
// kohya's underscores make the path ambiguous to read back, so names resolve
// against the model's own modules: each weight's module path with '.' written
// '_' is looked up (two modules that would collide are refused when the table
// is built). A key that names no layer of the model is an error naming it,
// never skipped.
#pragma once
#include <stdbool.h>
#include "nn/params.h"

typedef enum { DC_LORA_UNET, DC_LORA_TEXT } dc_lora_part;
typedef enum { DC_LORA_KOHYA, DC_LORA_DIFFUSERS, DC_LORA_PEFT, DC_LORA_PROCESSOR } dc_lora_format;
typedef enum {
    DC_LORA_DOWN, DC_LORA_UP, DC_LORA_ALPHA,
    DC_LORA_HADA_W1A, DC_LORA_HADA_W1B, DC_LORA_HADA_W2A, DC_LORA_HADA_W2B,  // LoHa
    DC_LORA_LOKR_W1, DC_LORA_LOKR_W1A, DC_LORA_LOKR_W1B,                     // LoKr
    DC_LORA_LOKR_W2, DC_LORA_LOKR_W2A, DC_LORA_LOKR_W2B,
    DC_LORA_ROLES
} dc_lora_role;

// One tensor name of a LoRA file, read.
typedef struct {
    dc_lora_part part;
    dc_lora_format format;
    dc_lora_role role;
    char module[DC_PARAM_NAME_MAX];  // kohya: the underscored path; else the dotted module path
} dc_lora_key;

// Reads a tensor name: 0 and *k, or -1 with a message naming it when it is
// no LoRA key of an SD 1.x/2.x UNet or text encoder (SDXL's lora_te1_/
// lora_te2_ and LyCORIS's Tucker cores are named as not supported).
int dc_lora_key_parse(const char *name, dc_lora_key *k);

// A model part's modules by the names LoRA files use: for every 2-D or 4-D
// weight "<module>.weight" of ps, its dotted path and its underscored path.
typedef struct {
    const dc_params *ps;
    int n;
    struct dc_lora_module {
        int param;                           // the weight's index in ps
        char under[DC_PARAM_NAME_MAX];       // "down_blocks_0_attentions_0_proj_in"
    } *mods;
} dc_lora_modules;

// The table for ps (not copied: it must outlive the table); -1 when two
// modules would read the same underscored (an ambiguous kohya name).
int dc_lora_modules_init(dc_lora_modules *t, const dc_params *ps);
void dc_lora_modules_free(dc_lora_modules *t);
// The weight parameter k names (its part already chosen by the caller), or -1
// with a message naming the key's module.
int dc_lora_modules_find(const dc_lora_modules *t, const dc_lora_key *k);
