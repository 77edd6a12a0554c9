// libFuzzer harness for the Stable Diffusion components' configs: inferred
// from the tensor shapes of a file (a single-file checkpoint has no config),
// and read from a config.json. Byte 0 picks the mode.
//   shapes (even): then entries [name byte, rank byte, one byte per dimension
//     (0..95)], each naming one of the tensors inference reads (in both
//     layouts, block and layer indices 0..3); the harness writes a valid
//     file with them and parses it as a loader would, then infers the UNet's,
//     the VAE's and the text encoder's configs under both namings;
//   json (odd): the rest is a config.json, read as each component's, and as
//     a scheduler_config.json, whose ladders are then made for every class.
// Whatever is accepted must validate, and then registering the model's
// parameters and mapping every name to the original layout must work; a
// ladder made must hold finite timesteps in the schedule and finite sigmas.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "diffusion/sd_sched_config.h"
#include "diffusion/sd_schedule.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/clip_text.h"
#include "models/unet.h"
#include "models/vae.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const k_templates[] = {
    "conv_in.weight", "conv_out.weight", "time_embedding.linear_1.weight",
    "down_blocks.%d.resnets.%d.conv1.weight", "down_blocks.%d.attentions.%d.proj_in.weight",
    "mid_block.attentions.0.proj_in.weight", "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
    "input_blocks.%d.0.in_layers.2.weight", "input_blocks.%d.1.proj_in.weight", "out.2.weight",
    "input_blocks.0.0.weight", "time_embed.0.weight", "middle_block.1.proj_in.weight",
    "middle_block.1.transformer_blocks.0.attn2.to_k.weight", "input_blocks.%d.1.transformer_blocks.0.attn2.to_k.weight",
    "encoder.conv_in.weight", "encoder.conv_out.weight", "decoder.conv_in.weight", "decoder.conv_out.weight",
    "encoder.down_blocks.%d.resnets.%d.conv1.weight", "decoder.up_blocks.%d.resnets.%d.conv1.weight",
    "encoder.down.%d.block.%d.conv1.weight", "decoder.up.%d.block.%d.conv1.weight",
    "embeddings.token_embedding.weight", "embeddings.position_embedding.weight", "encoder.layers.%d.mlp.fc1.weight",
    "token_embedding.weight", "positional_embedding", "transformer.resblocks.%d.mlp.c_fc.weight",
};
#define NT (int)(sizeof k_templates / sizeof *k_templates)

// Every template with its indices 0..3: name k of the table.
static char g_names[NT * 16][96];
static int g_nnames;

static void make_names(void) {
    for (int t = 0; t < NT; t++) {
        int holes = 0;
        for (const char *p = k_templates[t]; (p = strstr(p, "%d")); p += 2) holes++;
        for (int i = 0; i < (holes ? 4 : 1); i++)
            for (int j = 0; j < (holes > 1 ? 4 : 1); j++)
                snprintf(g_names[g_nnames++], sizeof g_names[0], k_templates[t], i, j);
    }
}

typedef int (*map_fn)(void *ctx, const char *param, dc_weight_src *src);

// The model's names exist and each maps to an original name.
static void map_all(const dc_params *ps, map_fn map, void *ctx) {
    for (int i = 0; i < ps->count; i++) {
        dc_weight_src src;
        memset(&src, 0, sizeof src);
        if (map(ctx, ps->items[i].name, &src) != 0) abort();  // a registered name with no original
    }
}

static int vae_map(void *ctx, const char *param, dc_weight_src *src) {
    return dc_vae_original_name(ctx, param, src);
}

static void check_configs(const dc_weights *w, const dc_json *root) {
    for (int k = 0; k < 2; k++) {
        dc_names names = k ? DC_NAMES_ORIGINAL : DC_NAMES_DIFFUSERS;
        dc_unet_config u;
        if ((root ? dc_unet_config_from_json(&u, root, "config.json") : dc_unet_config_infer(&u, w, names)) == 0 &&
            dc_unet_config_validate(&u) == 0) {
            dc_params ps;
            memset(&ps, 0, sizeof ps);
            if (dc_unet_register(&u, &ps) == 0) map_all(&ps, dc_unet_weight_map, &u);
            dc_params_free(&ps);
        }
        dc_vae_config v;
        int rv = root ? dc_vae_config_from_json(&v, root, "config.json") : dc_vae_config_infer(&v, w, names);
        if (rv == 0 && dc_vae_config_validate(&v) != 0) abort();  // what the reader accepts must validate
        if (rv == 0) {
            char name[96];  // a few names of every block through the map
            for (int i = 0; i < v.nblocks; i++) {
                dc_weight_src src;
                snprintf(name, sizeof name, "decoder.up_blocks.%d.resnets.0.conv1.weight", i);
                memset(&src, 0, sizeof src);
                if (vae_map(&v, name, &src) != 0) abort();
            }
        }
        dc_clip_text_config t;
        int rt = root ? dc_clip_text_config_from_json(&t, root, "config.json") : dc_clip_text_config_infer(&t, w, names);
        if (rt == 0 && dc_clip_text_config_validate(&t) != 0) abort();
        if (rt == 0 && t.layers <= 64) {
            dc_params ps;
            memset(&ps, 0, sizeof ps);
            if (dc_clip_text_params(&ps, &t) == 0) map_all(&ps, dc_clip_text_openclip_name, &t);
            dc_params_free(&ps);
        }
        if (root) break;
    }
    dc_error_clear();
}

// A scheduler config: read; if accepted, every class's ladder of a few step
// counts on its schedule.
static void check_scheduler(const dc_json *root, unsigned steps) {
    dc_sd_sched_cfg c;
    if (dc_sd_sched_cfg_from_json(&c, root, "scheduler_config.json")) return;
    for (int floor = 0; floor < 2; floor++) {
        dc_schedule s;
        if (dc_schedule_init_cfg(&s, &c, floor)) continue;
        const int ns[3] = {1, 2, 1 + (int)(steps % 64)};
        double t[64], sig[65], init;
        for (int k = 0; k < 4; k++)
            for (int karras = 0; karras < 2; karras++)
                for (int j = 0; j < 3; j++) {
                    int n = ns[j] < s.T ? ns[j] : s.T;
                    if (dc_sd_ladder(&s, &c, (dc_sd_class)k, karras, DC_PRED_V, n, t, sig, &init)) continue;
                    for (int i = 0; i < n; i++)
                        if (!(t[i] == t[i] && t[i] <= s.T - 1 && (c.continuous_t || t[i] >= 0))) abort();
                    for (int i = 0; i <= n && k != DC_SCHED_DDIM; i++)
                        if (!(sig[i] >= 0 && sig[i] < INFINITY)) abort();
                    if (!(init > 0 && init < INFINITY)) abort();
                }
        dc_schedule_free(&s);
    }
    dc_sd_sched_cfg_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_nnames) make_names();
    if (size < 1) return 0;
    if (data[0] & 1) {  // a config.json
        dc_json_doc doc;  // as the readers parse them: scheduler configs may hold Python's -Infinity
        if (dc_json_parse_opts(&doc, (const char *)data + 1, size - 1, 0, DC_JSON_UNIQUE_KEYS) == 0 &&
            doc.root->type == DC_JSON_OBJECT)
            check_configs(NULL, doc.root);
        dc_json_free(&doc);
        if (dc_json_parse_opts(&doc, (const char *)data + 1, size - 1, 0, DC_JSON_NONFINITE | DC_JSON_UNIQUE_KEYS) ==
                0 &&
            doc.root->type == DC_JSON_OBJECT)
            check_scheduler(doc.root, data[0] >> 1);
        dc_json_free(&doc);
        dc_error_clear();
        return 0;
    }
    enum { MAXT = 48 };
    dc_st_entry e[MAXT];
    static uint16_t zeros[1 << 17];
    int64_t total = 0;
    int count = 0;
    size_t at = 1;
    bool used[NT * 16] = {false};
    while (at + 2 <= size && count < MAXT) {
        int k = data[at++] % g_nnames, rank = data[at++] % 5;
        if (used[k]) continue;
        used[k] = true;
        e[count] = (dc_st_entry){.name = g_names[k], .dtype = DC_F16, .ndim = rank, .data = zeros};
        int64_t numel = 1;
        for (int d = 0; d < rank; d++) numel *= e[count].shape[d] = at < size ? data[at++] % 96 : 1;
        if ((total += numel) > (int64_t)(sizeof zeros / sizeof zeros[0])) return 0;  // keep runs fast
        count++;
    }
    uint8_t *file;
    size_t len;
    if (dc_st_serialize(e, count, NULL, NULL, 0, &file, &len) != 0) return dc_error_clear(), 0;
    dc_st_file f;
    if (dc_st_parse(&f, file, len, "fuzz.safetensors") != 0) abort();  // the writer's own file
    free(file);
    dc_weights w = {&f, 1, ""};
    check_configs(&w, NULL);
    dc_st_close(&f);
    return 0;
}
