// libFuzzer harness for LoRA files and tags (models/sd_lora.h,
// text/lora_tags.h). Byte 0 picks the mode:
//   file (even): the rest is a safetensors file, read into LoRAs over a small
//     SD 1.x UNet (tests/golden/sd/sd1's config) and text encoder, whose
//     parameters are registered and allocated once; whatever is accepted
//     must merge, and unmerge;
//   tags (odd): the rest is a prompt, split into its text and its
//     <lora:NAME:TE[:UNET]> tags; what is accepted holds at most 16 tags,
//     names of at least one character, multipliers in -10..10, and a text no
//     longer than the prompt.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"
#include "models/clip_text.h"
#include "models/sd_lora.h"
#include "models/unet.h"
#include "text/lora_tags.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dc_backend *g_be;
static dc_params g_unet, g_text;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    g_be = dc_backend_cpu_create();
    dc_unet_config c;
    const dc_clip_text_config t = {64, 8, 32, 2, 2, 48, DC_ACT_QUICK_GELU, 1e-5f};
    if (dc_unet_config_from_json_file(&c, "tests/golden/sd/sd1/diffusers/unet/config.json") ||
        dc_unet_register(&c, &g_unet) || dc_params_alloc_frozen(&g_unet, g_be, DC_F32) ||
        dc_clip_text_params(&g_text, &t) || dc_params_alloc_frozen(&g_text, g_be, DC_F32)) {
        fprintf(stderr, "fuzz_lora: %s\n", dc_error());
        abort();
    }
    return 0;
}

static void check_file(const uint8_t *data, size_t size) {
    dc_st_file f;
    if (dc_st_parse(&f, data, size, "fuzz.safetensors")) return;
    dc_lora lu, lt;
    dc_lora_init(&lu, &g_unet), dc_lora_init(&lt, &g_text);
    if (dc_sd_lora_read(&f, &lu, &lt) == 0) {
        if ((lu.count && (dc_lora_merge(&lu) || dc_lora_unmerge(&lu))) ||
            (lt.count && (dc_lora_merge(&lt) || dc_lora_unmerge(&lt)))) {
            fprintf(stderr, "an accepted LoRA did not merge: %s\n", dc_error());
            abort();
        }
    }
    dc_lora_free(&lu), dc_lora_free(&lt);
    dc_st_close(&f);
}

static void check_tags(const uint8_t *data, size_t size) {
    char *prompt = malloc(size + 1), *clean = malloc(size + 1);
    if (!prompt || !clean) abort();
    memcpy(prompt, data, size);
    prompt[size] = 0;
    dc_lora_tag tags[DC_LORA_TAGS_MAX];
    int n = -1;
    if (dc_lora_tags_parse(prompt, clean, size + 1, tags, &n) == 0) {
        if (n < 0 || n > DC_LORA_TAGS_MAX || strlen(clean) > strlen(prompt)) abort();
        for (int i = 0; i < n; i++)
            if (!tags[i].name[0] || !(fabsf(tags[i].te) <= 10) || !(fabsf(tags[i].unet) <= 10)) abort();
    }
    free(prompt), free(clean);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) check_tags(data + 1, size - 1);
    else check_file(data + 1, size - 1);
    dc_error_clear();
    return 0;
}
