// UNet configs: SD 1.5's defaults, checks, diffusers' config.json, inference
// from tensor shapes, and metadata entries.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "models/unet.h"

void dc_unet_config_sd15(dc_unet_config *c) {
    memset(c, 0, sizeof *c);
    c->in_channels = c->out_channels = 4;
    c->nblocks = 4;
    const int ch[4] = {320, 640, 1280, 1280};
    for (int i = 0; i < 4; i++) c->ch[i] = ch[i], c->attn[i] = i < 3, c->heads[i] = 8;
    c->layers = 2;
    c->ctx_dim = 768;
    c->groups = 32;
    c->eps = 1e-5f;
    c->sample_size = 64;
    c->prediction = DC_PRED_EPS;
}

int dc_unet_config_named(const char *name, dc_unet_config *c) {
    const bool two = !strcmp(name, "sd2.1");
    if (!two && strcmp(name, "sd1.5")) return 1;
    dc_unet_config_sd15(c);
    if (two) {  // OpenCLIP's 1024-wide text, heads of 64 channels, linear projections, 768 px
        c->ctx_dim = 1024, c->linear_proj = true, c->upcast_attention = true, c->sample_size = 96;
        for (int i = 0; i < c->nblocks; i++) c->heads[i] = c->ch[i] / 64;
    }
    return 0;
}

int dc_unet_config_validate(const dc_unet_config *c) {
    if (c->nblocks < 1 || c->nblocks > DC_UNET_MAX_BLOCKS)
        return dc_fail("UNet config: %d blocks (block_out_channels), 1 to %d supported", c->nblocks,
                       DC_UNET_MAX_BLOCKS);
    if (c->layers < 1 || c->layers > DC_UNET_MAX_LAYERS)
        return dc_fail("UNet config: layers_per_block %d, 1 to %d supported", c->layers, DC_UNET_MAX_LAYERS);
    if (c->in_channels < 1 || c->out_channels < 1 || c->in_channels > 4096 || c->out_channels > 4096)
        return dc_fail("UNet config: in_channels %d / out_channels %d", c->in_channels, c->out_channels);
    if (c->groups < 1) return dc_fail("UNet config: norm_num_groups %d", c->groups);
    if (!(c->eps > 0 && c->eps < 1)) return dc_fail("UNet config: norm_eps %g", (double)c->eps);
    if (c->ctx_dim < 1 || c->ctx_dim > 65536) return dc_fail("UNet config: cross_attention_dim %d", c->ctx_dim);
    if (c->ch[0] % 2) return dc_fail("UNet config: block_out_channels[0] = %d must be even (sin | cos)", c->ch[0]);
    for (int i = 0; i < c->nblocks; i++) {
        if (c->ch[i] < 1 || c->ch[i] > 65536 || c->ch[i] % c->groups)
            return dc_fail("UNet config: block_out_channels[%d] = %d is not a positive multiple of "
                           "norm_num_groups %d", i, c->ch[i], c->groups);
        // the mid block's attention uses the last block's heads
        bool used = c->attn[i] || i == c->nblocks - 1;
        if (used && (c->heads[i] < 1 || c->ch[i] % c->heads[i]))
            return dc_fail("UNet config: block %d has %d channels and %d attention heads%s", i, c->ch[i],
                           c->heads[i], c->heads[i] < 1 ? " (the head count is not in the weights: give it)" : "");
    }
    return 0;
}

// ---- config.json ------------------------------------------------------------------------

// A JSON integer in [lo, hi] into *out; absent or null keeps *out.
static int json_int(const dc_json *root, const char *key, int lo, int hi, int *out, const char *path) {
    const dc_json *v = dc_json_get(root, key);
    int64_t x;
    if (!v || v->type == DC_JSON_NULL) return 0;
    if (dc_json_get_i64(v, &x) || x < lo || x > hi)
        return dc_fail("%s: '%s' must be an integer from %d to %d", path, key, lo, hi);
    *out = (int)x;
    return 0;
}

// An integer or a list of nblocks integers (per block) into out[].
static int json_ints(const dc_json *root, const char *key, int n, int lo, int hi, int *out, bool *given,
                     const char *path) {
    const dc_json *v = dc_json_get(root, key);
    *given = v && v->type != DC_JSON_NULL;
    if (!*given) return 0;
    if (v->type != DC_JSON_ARRAY) {
        int x = 0;
        DC_TRY(json_int(root, key, lo, hi, &x, path));
        for (int i = 0; i < n; i++) out[i] = x;
        return 0;
    }
    if (v->nkids != n) return dc_fail("%s: '%s' has %d entries for %d blocks", path, key, v->nkids, n);
    for (int i = 0; i < n; i++) {
        int64_t x;
        if (dc_json_get_i64(&v->kids[i], &x) || x < lo || x > hi)
            return dc_fail("%s: '%s'[%d] must be an integer from %d to %d", path, key, i, lo, hi);
        out[i] = (int)x;
    }
    return 0;
}

static int json_bool(const dc_json *root, const char *key, bool *out, const char *path) {
    const dc_json *v = dc_json_get(root, key);
    if (!v || v->type == DC_JSON_NULL) return 0;
    if (v->type != DC_JSON_TRUE && v->type != DC_JSON_FALSE) return dc_fail("%s: '%s' must be true or false", path, key);
    *out = v->type == DC_JSON_TRUE;
    return 0;
}

// The string value of key, or def when absent or null; NULL (message set) if not a string.
static const char *json_str(const dc_json *root, const char *key, const char *def, const char *path) {
    const dc_json *v = dc_json_get(root, key);
    if (!v || v->type == DC_JSON_NULL) return def;
    if (!dc_json_is_cstr(v)) return dc_fail("%s: '%s' must be a string", path, key), NULL;
    return v->str;
}

// Keys whose non-default values change the network in ways this engine does
// not build: (key, the value SD uses; NULL: must be absent or null).
static int refuse_unsupported(const dc_json *root, const char *path) {
    static const char *const k_str[][2] = {
        {"act_fn", "silu"}, {"resnet_time_scale_shift", "default"}, {"time_embedding_type", "positional"},
        {"mid_block_type", "UNetMidBlock2DCrossAttn"}, {"attention_type", "default"},
        {"class_embed_type", NULL}, {"addition_embed_type", NULL}, {"encoder_hid_dim_type", NULL},
        {"time_embedding_act_fn", NULL}, {"timestep_post_act", NULL}, {"cross_attention_norm", NULL},
    };
    for (size_t k = 0; k < sizeof k_str / sizeof k_str[0]; k++) {
        const dc_json *v = dc_json_get(root, k_str[k][0]);
        if (!v || v->type == DC_JSON_NULL) continue;
        if (!k_str[k][1] || !dc_json_is_cstr(v) || strcmp(v->str, k_str[k][1]) != 0)
            return dc_fail("%s: '%s' = %s%s%s is not supported (Stable Diffusion 1.x/2.x UNets use %s)", path,
                           k_str[k][0], dc_json_is_cstr(v) ? "\"" : "", dc_json_is_cstr(v) ? v->str : "(not a string)",
                           dc_json_is_cstr(v) ? "\"" : "", k_str[k][1] ? k_str[k][1] : "none");
    }
    static const char *const k_null[] = {"num_class_embeds", "encoder_hid_dim", "time_cond_proj_dim",
                                         "projection_class_embeddings_input_dim", "time_embedding_dim",
                                         "addition_time_embed_dim", "reverse_transformer_layers_per_block"};
    for (size_t k = 0; k < sizeof k_null / sizeof k_null[0]; k++) {
        const dc_json *v = dc_json_get(root, k_null[k]);
        if (v && v->type != DC_JSON_NULL) return dc_fail("%s: '%s' is not supported (it must be null)", path, k_null[k]);
    }
    // booleans that must be false, and numbers with one supported value
    static const char *const k_false[] = {"center_input_sample", "dual_cross_attention", "only_cross_attention",
                                          "mid_block_only_cross_attention", "class_embeddings_concat",
                                          "resnet_skip_time_act"};
    for (size_t k = 0; k < sizeof k_false / sizeof k_false[0]; k++) {
        const dc_json *v = dc_json_get(root, k_false[k]);
        bool on = false;
        if (v && v->type == DC_JSON_ARRAY)  // per block
            for (int i = 0; i < v->nkids; i++) on |= v->kids[i].type != DC_JSON_FALSE;
        else
            DC_TRY(json_bool(root, k_false[k], &on, path));
        if (on) return dc_fail("%s: '%s' = true is not supported", path, k_false[k]);
    }
    static const struct { const char *key; double value; } k_num[] = {
        {"freq_shift", 0}, {"conv_in_kernel", 3}, {"conv_out_kernel", 3}, {"downsample_padding", 1},
        {"mid_block_scale_factor", 1}, {"resnet_out_scale_factor", 1}, {"transformer_layers_per_block", 1},
    };
    for (size_t k = 0; k < sizeof k_num / sizeof k_num[0]; k++) {
        const dc_json *v = dc_json_get(root, k_num[k].key);
        if (!v || v->type == DC_JSON_NULL) continue;
        bool ok = v->type == DC_JSON_NUMBER && v->num == k_num[k].value;
        if (v->type == DC_JSON_ARRAY) {  // per block: every entry must be the value
            ok = true;
            for (int i = 0; i < v->nkids; i++) ok &= v->kids[i].type == DC_JSON_NUMBER && v->kids[i].num == k_num[k].value;
        }
        if (!ok) return dc_fail("%s: '%s' must be %g (other values are not supported)", path, k_num[k].key, k_num[k].value);
    }
    bool flip = true;
    DC_TRY(json_bool(root, "flip_sin_to_cos", &flip, path));
    if (!flip) return dc_fail("%s: 'flip_sin_to_cos' = false is not supported", path);
    return 0;
}

int dc_unet_config_from_json(dc_unet_config *c, const dc_json *root, const char *path) {
    dc_unet_config_sd15(c);
    c->sample_size = 0;
    if (!root || root->type != DC_JSON_OBJECT) return dc_fail("%s: not a JSON object", path);
    const char *cls = json_str(root, "_class_name", "UNet2DConditionModel", path);
    if (!cls) return -1;
    if (strcmp(cls, "UNet2DConditionModel") != 0)
        return dc_fail("%s: '_class_name' is '%s', not UNet2DConditionModel", path, cls);
    DC_TRY(refuse_unsupported(root, path));

    const dc_json *bo = dc_json_get(root, "block_out_channels");
    if (bo && bo->type != DC_JSON_NULL) {
        if (bo->type != DC_JSON_ARRAY || bo->nkids < 1 || bo->nkids > DC_UNET_MAX_BLOCKS)
            return dc_fail("%s: 'block_out_channels' must be a list of 1 to %d integers", path, DC_UNET_MAX_BLOCKS);
        c->nblocks = bo->nkids;
        bool given;
        DC_TRY(json_ints(root, "block_out_channels", c->nblocks, 1, 65536, c->ch, &given, path));
    }
    const int N = c->nblocks;
    int tmp[DC_UNET_MAX_BLOCKS];
    bool given;
    DC_TRY(json_int(root, "in_channels", 1, 4096, &c->in_channels, path));
    DC_TRY(json_int(root, "out_channels", 1, 4096, &c->out_channels, path));
    DC_TRY(json_ints(root, "layers_per_block", N, 1, DC_UNET_MAX_LAYERS, tmp, &given, path));
    if (given) {
        for (int i = 1; i < N; i++)
            if (tmp[i] != tmp[0]) return dc_fail("%s: 'layers_per_block' differing per block is not supported", path);
        c->layers = tmp[0];
    }
    c->ctx_dim = 1280;  // diffusers' default when the key is absent
    DC_TRY(json_ints(root, "cross_attention_dim", N, 1, 65536, tmp, &given, path));
    if (given) {
        for (int i = 1; i < N; i++)
            if (tmp[i] != tmp[0]) return dc_fail("%s: 'cross_attention_dim' differing per block is not supported", path);
        c->ctx_dim = tmp[0];
    }
    // attention_head_dim is, for these models, the number of heads (a naming
    // slip diffusers keeps); num_attention_heads, when given, takes precedence
    DC_TRY(json_ints(root, "attention_head_dim", N, 1, 65536, c->heads, &given, path));
    DC_TRY(json_ints(root, "num_attention_heads", N, 1, 65536, tmp, &given, path));
    if (given) memcpy(c->heads, tmp, sizeof tmp);
    DC_TRY(json_int(root, "norm_num_groups", 1, 65536, &c->groups, path));
    const dc_json *eps = dc_json_get(root, "norm_eps");
    if (eps && eps->type != DC_JSON_NULL) {
        if (eps->type != DC_JSON_NUMBER || !(eps->num > 0 && eps->num < 1))
            return dc_fail("%s: 'norm_eps' must be a number between 0 and 1", path);
        c->eps = (float)eps->num;
    }
    DC_TRY(json_bool(root, "use_linear_projection", &c->linear_proj, path));
    DC_TRY(json_bool(root, "upcast_attention", &c->upcast_attention, path));
    DC_TRY(json_int(root, "sample_size", 0, 65536, &c->sample_size, path));

    // block types: cross-attention down blocks, mirrored by the up blocks
    const dc_json *down = dc_json_get(root, "down_block_types"), *up = dc_json_get(root, "up_block_types");
    if (down && down->type != DC_JSON_NULL) {
        if (down->type != DC_JSON_ARRAY || down->nkids != N)
            return dc_fail("%s: 'down_block_types' must list %d block types", path, N);
        for (int i = 0; i < N; i++) {
            const dc_json *v = &down->kids[i];
            if (dc_json_is_cstr(v) && strcmp(v->str, "CrossAttnDownBlock2D") == 0) c->attn[i] = true;
            else if (dc_json_is_cstr(v) && strcmp(v->str, "DownBlock2D") == 0) c->attn[i] = false;
            else return dc_fail("%s: 'down_block_types'[%d] is not CrossAttnDownBlock2D or DownBlock2D", path, i);
        }
    } else if (N != 4) {
        return dc_fail("%s: 'down_block_types' is missing", path);
    }
    if (up && up->type != DC_JSON_NULL) {
        if (up->type != DC_JSON_ARRAY || up->nkids != N)
            return dc_fail("%s: 'up_block_types' must list %d block types", path, N);
        for (int i = 0; i < N; i++) {
            const char *want = c->attn[N - 1 - i] ? "CrossAttnUpBlock2D" : "UpBlock2D";
            if (!dc_json_is_cstr(&up->kids[i]) || strcmp(up->kids[i].str, want) != 0)
                return dc_fail("%s: 'up_block_types'[%d] must be %s, mirroring down block %d", path, i, want,
                               N - 1 - i);
        }
    }
    if (dc_unet_config_validate(c)) return dc_fail_ctx("%s", path);
    return 0;
}

int dc_unet_config_from_json_file(dc_unet_config *c, const char *path) {
    int64_t size = 0;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    if (size > (1 << 20)) return close(fd), dc_fail("%s: larger than 1 MiB: not a UNet config.json", path);
    char *text = malloc((size_t)size + 1);
    if (!text) return close(fd), dc_fail("%s: out of memory", path);
    int rc = dc_read_exact(fd, text, (size_t)size, path);
    close(fd);
    dc_json_doc doc;
    if (!rc && (rc = dc_json_parse(&doc, text, (size_t)size, 0)) != 0) dc_fail_ctx("%s", path);
    free(text);
    if (rc) return -1;
    rc = dc_unet_config_from_json(c, doc.root, path);
    dc_json_free(&doc);
    return rc;
}

// ---- inference from tensor shapes ---------------------------------------------------------

// Dimension d of the canonical tensor `name` as stored under `names` (-1 if absent).
static int64_t dim_of(const dc_weights *w, dc_names names, const dc_unet_config *c, const char *name, int d) {
    char orig[160];
    if (names == DC_NAMES_DIFFUSERS) return dc_weights_dim(w, name, d);
    if (dc_unet_original_name(c, name, orig, sizeof orig)) return dc_error_clear(), -1;
    return dc_weights_dim(w, orig, d);
}

// A positive dimension that must be there: the message names the tensor.
static int need_dim(const dc_weights *w, dc_names names, const dc_unet_config *c, const char *name, int d,
                    int64_t hi, int *out) {
    int64_t v = dim_of(w, names, c, name, d);
    if (v < 1 || v > hi) {
        char orig[160] = "";
        if (names == DC_NAMES_ORIGINAL && dc_unet_original_name(c, name, orig, sizeof orig)) dc_error_clear();
        return dc_fail("UNet weights: %s%s%s%s%s (dimension %d) %s", w->prefix, orig[0] ? orig : name,
                       orig[0] ? " (" : "", orig[0] ? name : "", orig[0] ? ")" : "", d,
                       v < 0 ? "is missing: not a Stable Diffusion UNet" : "has an unusable size");
    }
    *out = (int)v;
    return 0;
}

int dc_unet_config_infer(dc_unet_config *c, const dc_weights *w, dc_names names) {
    char name[128];
    dc_unet_config_sd15(c);
    c->sample_size = 0;
    DC_TRY(need_dim(w, names, c, "conv_in.weight", 0, 65536, &c->ch[0]));
    DC_TRY(need_dim(w, names, c, "conv_in.weight", 1, 4096, &c->in_channels));
    DC_TRY(need_dim(w, names, c, "conv_out.weight", 0, 4096, &c->out_channels));
    int td;
    DC_TRY(need_dim(w, names, c, "time_embedding.linear_1.weight", 0, 1 << 20, &td));
    if (td != 4 * c->ch[0])
        return dc_fail("UNet weights: the time embedding is %d wide, not 4 x %d channels", td, c->ch[0]);

    // layers per block: resnets in the first down block. In the original
    // layout the first downsampler sits right after them (input_blocks.{L+1}.0.op).
    int L = 0;
    for (int j = 0; j <= DC_UNET_MAX_LAYERS; j++) {
        bool res;
        if (names == DC_NAMES_DIFFUSERS) {
            snprintf(name, sizeof name, "down_blocks.0.resnets.%d.conv1.weight", j);
            res = dc_weights_has(w, name);
        } else {
            snprintf(name, sizeof name, "input_blocks.%d.0.in_layers.2.weight", j + 1);
            res = dc_weights_has(w, name);
        }
        if (!res) break;
        L = j + 1;
    }
    if (L < 1 || L > DC_UNET_MAX_LAYERS)
        return dc_fail("UNet weights: %d resnets in the first down block (1 to %d supported)", L, DC_UNET_MAX_LAYERS);
    c->layers = L;

    // blocks, their channels, and which have attention
    int N = 0;
    for (int i = 0; i <= DC_UNET_MAX_BLOCKS; i++) {
        snprintf(name, sizeof name, "down_blocks.%d.resnets.0.conv1.weight", i);
        if (dim_of(w, names, c, name, 0) < 1) break;
        if (i == DC_UNET_MAX_BLOCKS) return dc_fail("UNet weights: more than %d down blocks", DC_UNET_MAX_BLOCKS);
        DC_TRY(need_dim(w, names, c, name, 0, 65536, &c->ch[i]));
        snprintf(name, sizeof name, "down_blocks.%d.attentions.0.proj_in.weight", i);
        c->attn[i] = dim_of(w, names, c, name, 0) > 0;
        N = i + 1;
    }
    c->nblocks = N;
    for (int i = N; i < DC_UNET_MAX_BLOCKS; i++) c->ch[i] = 0, c->attn[i] = false;

    // cross-attention width and projection kind from the mid block's attention
    DC_TRY(need_dim(w, names, c, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight", 1, 65536,
                    &c->ctx_dim));
    int pin;
    DC_TRY(need_dim(w, names, c, "mid_block.attentions.0.proj_in.weight", 0, 65536, &pin));
    c->linear_proj = dim_of(w, names, c, "mid_block.attentions.0.proj_in.weight", 2) < 0;

    // heads: SD 1.x (text 768 wide) has 8 heads everywhere; SD 2.x (1024)
    // and later fine-tunes heads of 64 channels
    for (int i = 0; i < N; i++)
        c->heads[i] = c->ctx_dim == 768 ? 8 : c->ch[i] % 64 == 0 ? c->ch[i] / 64 : 0;
    for (int i = N; i < DC_UNET_MAX_BLOCKS; i++) c->heads[i] = 0;
    return 0;
}

// ---- metadata -------------------------------------------------------------------------------

static void list_text(char *out, size_t n, const int *v, int count) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < count && used < n; i++) used += (size_t)snprintf(out + used, n - used, "%s%d", i ? ", " : "", v[i]);
    if (used < n) snprintf(out + used, n - used, "]");
}

int dc_unet_config_to_kv(const dc_unet_config *c, dc_kv *kv) {
    char buf[256];
    const int N = c->nblocks;
    DC_TRY(dc_kv_set(kv, "model", "UNet2DConditionModel"));
    DC_TRY(dc_kv_set(kv, "in_channels", "%d", c->in_channels));
    DC_TRY(dc_kv_set(kv, "out_channels", "%d", c->out_channels));
    list_text(buf, sizeof buf, c->ch, N);
    DC_TRY(dc_kv_set(kv, "block_out_channels", "%s", buf));
    DC_TRY(dc_kv_set(kv, "layers_per_block", "%d", c->layers));
    size_t used = (size_t)snprintf(buf, sizeof buf, "[");
    for (int i = 0; i < N; i++)
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s\"%s\"", i ? ", " : "",
                                 c->attn[i] ? "CrossAttnDownBlock2D" : "DownBlock2D");
    snprintf(buf + used, sizeof buf - used, "]");
    DC_TRY(dc_kv_set(kv, "down_block_types", "%s", buf));
    used = (size_t)snprintf(buf, sizeof buf, "[");
    for (int i = 0; i < N; i++)
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s\"%s\"", i ? ", " : "",
                                 c->attn[N - 1 - i] ? "CrossAttnUpBlock2D" : "UpBlock2D");
    snprintf(buf + used, sizeof buf - used, "]");
    DC_TRY(dc_kv_set(kv, "up_block_types", "%s", buf));
    list_text(buf, sizeof buf, c->heads, N);
    DC_TRY(dc_kv_set(kv, "num_attention_heads", "%s", buf));
    DC_TRY(dc_kv_set(kv, "cross_attention_dim", "%d", c->ctx_dim));
    DC_TRY(dc_kv_set(kv, "norm_num_groups", "%d", c->groups));
    DC_TRY(dc_kv_set(kv, "norm_eps", "%.9g", (double)c->eps));
    DC_TRY(dc_kv_set(kv, "use_linear_projection", "%s", c->linear_proj ? "true" : "false"));
    DC_TRY(dc_kv_set(kv, "upcast_attention", "%s", c->upcast_attention ? "true" : "false"));
    DC_TRY(dc_kv_set(kv, "sample_size", "%d", c->sample_size));
    return dc_kv_set(kv, "prediction_type", "%s",
                     c->prediction == DC_PRED_V ? "v_prediction" : c->prediction == DC_PRED_SAMPLE ? "sample" : "epsilon");
}

// The metadata entries are config.json keys with JSON values: put them back
// together as one JSON object and read it as a config.json. get(src, key)
// gives an entry's value or NULL; what names the source in messages.
static int config_of_entries(dc_unet_config *c, const char *(*get)(const void *src, const char *key),
                             const void *src, const char *what) {
    static const char *const k_keys[] = {
        "in_channels", "out_channels", "block_out_channels", "layers_per_block", "down_block_types",
        "up_block_types", "num_attention_heads", "cross_attention_dim", "norm_num_groups", "norm_eps",
        "use_linear_projection", "upcast_attention", "sample_size",
    };
    const char *model = get(src, "model");
    if (!model || strcmp(model, "UNet2DConditionModel") != 0)
        return dc_fail("%s does not describe a UNet2DConditionModel", what);
    size_t cap = 64, used = 0;
    for (size_t k = 0; k < sizeof k_keys / sizeof k_keys[0]; k++) {
        const char *v = get(src, k_keys[k]);
        if (!v) return dc_fail("%s has no '%s'", what, k_keys[k]);
        cap += strlen(k_keys[k]) + strlen(v) + 8;
    }
    char *text = malloc(cap);
    if (!text) return dc_fail("out of memory");
    used += (size_t)snprintf(text, cap, "{");
    for (size_t k = 0; k < sizeof k_keys / sizeof k_keys[0]; k++)
        used += (size_t)snprintf(text + used, cap - used, "%s\"%s\": %s", k ? ", " : "", k_keys[k],
                                 get(src, k_keys[k]));
    used += (size_t)snprintf(text + used, cap - used, "}");
    dc_json_doc doc;
    int rc = dc_json_parse(&doc, text, used, 0);
    free(text);
    if (rc) return dc_fail_ctx("%s", what);
    rc = dc_unet_config_from_json(c, doc.root, what);
    dc_json_free(&doc);
    if (rc) return -1;
    const char *pred = get(src, "prediction_type");
    if (pred && strcmp(pred, "v_prediction") == 0) c->prediction = DC_PRED_V;
    else if (pred && strcmp(pred, "sample") == 0) c->prediction = DC_PRED_SAMPLE;
    else if (pred && strcmp(pred, "epsilon") != 0)
        return dc_fail("%s: 'prediction_type' = '%s' (epsilon, v_prediction or sample)", what, pred);
    return 0;
}

static const char *file_entry(const void *f, const char *key) { return dc_st_meta(f, key); }
static const char *kv_entry(const void *kv, const char *key) { return dc_kv_get(kv, key); }

int dc_unet_config_from_meta(dc_unet_config *c, const dc_st_file *f) {
    char what[512];
    snprintf(what, sizeof what, "%s: metadata", f->path);
    return config_of_entries(c, file_entry, f, what);
}

int dc_unet_config_from_kv(dc_unet_config *c, const dc_kv *kv) {
    return config_of_entries(c, kv_entry, kv, "a UNet config");
}
