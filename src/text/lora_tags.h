// AUTOMATIC1111's LoRA tags in a prompt: <lora:NAME:TE[:UNET]>, where TE is
// the text encoder's multiplier and UNET the UNet's (the text encoder's when
// left out; both 1 when neither is given), each also as te=X or unet=X
// (A1111's extensions-builtin/Lora/extra_networks_lora.py). The tags are
// taken out of the prompt the model reads; the picture's parameters keep the
// prompt as written, as A1111 does.
#pragma once
#include <stddef.h>

#define DC_LORA_TAGS_MAX 16
#define DC_LORA_TAG_NAME 256

typedef struct {
    char name[DC_LORA_TAG_NAME];  // the file's stem
    float te, unet;
} dc_lora_tag;

// Splits prompt into clean (the prompt without its tags, cap bytes) and the
// tags[*n] it holds, in order; -1 with a message quoting a malformed tag (an
// empty name, a multiplier that is not a number or outside -10..10, more
// than two values, dyn=, more than DC_LORA_TAGS_MAX tags).
int dc_lora_tags_parse(const char *prompt, char *clean, size_t cap, dc_lora_tag *tags, int *n);
