// The CLIP text encoder's files: its config from a transformers config.json
// or from tensor shapes, where transformers names start in a file, and the
// map from our (transformers) names to OpenCLIP's, which SD 2.x single-file
// checkpoints use under "cond_stage_model.model.".
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/clip_text.h"

// Bounds that keep every size below int range (see dc_clip_text_reserve).
#define MAX_VOCAB (1 << 24)
#define MAX_POSITIONS 4096
#define MAX_WIDTH 65536
#define MAX_LAYERS 1024
#define MAX_FFN (16 * MAX_WIDTH)
#define HEAD_DIM 64  // both SD encoders (ViT-L/14: 768 / 12; ViT-H: 1024 / 16)

int dc_clip_text_config_validate(const dc_clip_text_config *c) {
    if (c->vocab < 1 || c->vocab > MAX_VOCAB) return dc_fail("vocabulary of %d tokens is out of range (1..%d)", c->vocab, MAX_VOCAB);
    if (c->positions < 1 || c->positions > MAX_POSITIONS)
        return dc_fail("%d positions is out of range (1..%d)", c->positions, MAX_POSITIONS);
    if (c->width < 1 || c->width > MAX_WIDTH) return dc_fail("width %d is out of range (1..%d)", c->width, MAX_WIDTH);
    if (c->heads < 1 || c->width % c->heads)
        return dc_fail("width %d is not divisible by %d attention heads", c->width, c->heads);
    if (c->layers < 1 || c->layers > MAX_LAYERS) return dc_fail("%d layers is out of range (1..%d)", c->layers, MAX_LAYERS);
    if (c->ffn < 1 || c->ffn > MAX_FFN) return dc_fail("MLP width %d is out of range (1..%d)", c->ffn, MAX_FFN);
    if (c->act != DC_ACT_QUICK_GELU && c->act != DC_ACT_GELU_ERF && c->act != DC_ACT_GELU_TANH)
        return dc_fail("activation %d is not one CLIP uses", (int)c->act);
    if (!(c->eps > 0.0f && c->eps < 1.0f)) return dc_fail("LayerNorm eps %g is out of range (0, 1)", c->eps);
    return 0;
}

// ---- config.json

// An integer member in [lo, hi], or *out untouched when the key is absent.
static int json_int(const dc_json *o, const char *key, int lo, int hi, int *out, const char *path) {
    const dc_json *v = dc_json_get(o, key);
    if (!v) return 0;
    int64_t x;
    if (v->type != DC_JSON_NUMBER || dc_json_get_i64(v, &x))
        return dc_fail("%s: '%s' is not an integer", path, key);
    if (x < lo || x > hi) return dc_fail("%s: '%s' = %lld is out of range (%d..%d)", path, key, (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

// transformers' ACT2FN names: "gelu" is the exact (erf) GELU.
static int act_of_name(const char *name, dc_act *out, const char *path) {
    if (strcmp(name, "quick_gelu") == 0) *out = DC_ACT_QUICK_GELU;
    else if (strcmp(name, "gelu") == 0) *out = DC_ACT_GELU_ERF;
    else if (strcmp(name, "gelu_new") == 0 || strcmp(name, "gelu_pytorch_tanh") == 0) *out = DC_ACT_GELU_TANH;
    else return dc_fail("%s: hidden_act '%s' is not supported (quick_gelu, gelu, gelu_new)", path, name);
    return 0;
}

static int json_act(const dc_json *o, dc_act *out, const char *path) {
    const dc_json *v = dc_json_get(o, "hidden_act");
    if (!v) return 0;
    if (!dc_json_is_cstr(v)) return dc_fail("%s: 'hidden_act' is not a string", path);
    return act_of_name(v->str, out, path);
}

// The entries of dc_clip_text_config_to_kv, in its order.
static const char *const k_kv_keys[] = {"vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers",
                                        "num_attention_heads", "intermediate_size", "hidden_act", "layer_norm_eps"};

int dc_clip_text_config_to_kv(const dc_clip_text_config *c, const char *prefix, dc_kv *kv) {
    const int v[] = {c->vocab, c->positions, c->width, c->layers, c->heads, c->ffn};
    const char *act = c->act == DC_ACT_QUICK_GELU ? "quick_gelu" : c->act == DC_ACT_GELU_ERF ? "gelu" : "gelu_new";
    char key[128];
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "%s%s", prefix, k_kv_keys[i]);
        int rc = i < 6 ? dc_kv_set(kv, key, "%d", v[i]) : i == 6 ? dc_kv_set(kv, key, "%s", act)
                                                              : dc_kv_set(kv, key, "%.9g", (double)c->eps);
        DC_TRY(rc);
    }
    return 0;
}

int dc_clip_text_config_from_kv(dc_clip_text_config *c, const char *prefix, const char *const *keys,
                                const char *const *values, int n, const char *what) {
    const char *got[8] = {0};
    for (int i = 0; i < 8; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s%s", prefix, k_kv_keys[i]);
        for (int k = 0; k < n && !got[i]; k++)
            if (!strcmp(keys[k], key)) got[i] = values[k];
        if (!got[i]) return dc_fail("%s: no \"%s\" entry", what, key);
    }
    int *v[] = {&c->vocab, &c->positions, &c->width, &c->layers, &c->heads, &c->ffn};
    for (int i = 0; i < 6; i++) {
        char *end;
        long x = strtol(got[i], &end, 10);
        if (end == got[i] || *end || x < 1 || x > 1 << 20)
            return dc_fail("%s: \"%s%s\" = '%s' is not a size", what, prefix, k_kv_keys[i], got[i]);
        *v[i] = (int)x;
    }
    char *end;
    c->eps = strtof(got[7], &end);
    if (end == got[7] || *end) return dc_fail("%s: \"%slayer_norm_eps\" = '%s' is not a number", what, prefix, got[7]);
    DC_TRY(act_of_name(got[6], &c->act, what));
    return dc_clip_text_config_validate(c);
}

int dc_clip_text_config_from_json(dc_clip_text_config *c, const dc_json *root, const char *path) {
    if (!root || root->type != DC_JSON_OBJECT) return dc_fail("%s: not a JSON object", path);
    const dc_json *text = dc_json_get(root, "text_config");  // a whole CLIPConfig
    if (text && text->type == DC_JSON_OBJECT) root = text;
    // CLIPTextConfig's defaults, which transformers gives a key left out
    *c = (dc_clip_text_config){.vocab = 49408, .positions = 77, .width = 512, .layers = 12, .heads = 8,
                               .ffn = 2048, .act = DC_ACT_QUICK_GELU, .eps = 1e-5f};
    DC_TRY(json_int(root, "vocab_size", 1, MAX_VOCAB, &c->vocab, path));
    DC_TRY(json_int(root, "max_position_embeddings", 1, MAX_POSITIONS, &c->positions, path));
    DC_TRY(json_int(root, "hidden_size", 1, MAX_WIDTH, &c->width, path));
    DC_TRY(json_int(root, "num_hidden_layers", 1, MAX_LAYERS, &c->layers, path));
    DC_TRY(json_int(root, "num_attention_heads", 1, MAX_WIDTH, &c->heads, path));
    DC_TRY(json_int(root, "intermediate_size", 1, MAX_FFN, &c->ffn, path));
    DC_TRY(json_act(root, &c->act, path));
    const dc_json *eps = dc_json_get(root, "layer_norm_eps");
    if (eps) {
        if (eps->type != DC_JSON_NUMBER || !(eps->num > 0.0 && eps->num < 1.0))
            return dc_fail("%s: 'layer_norm_eps' is not a number in (0, 1)", path);
        c->eps = (float)eps->num;
    }
    if (dc_clip_text_config_validate(c)) return dc_fail_ctx("%s", path);
    return 0;
}

// ---- config from shapes

static const char *weights_path(const dc_weights *w) { return w->nfiles ? w->files[0].path : "weights"; }

// Tensor prefix + name of rank 2, or NULL with a message.
static const dc_st_tensor *need2(const dc_weights *w, const char *name) {
    const dc_st_tensor *t = dc_weights_find(w, name, NULL);
    if (!t) return dc_fail("%s: no tensor '%s%s' (not a CLIP text encoder, or another prefix?)", weights_path(w), w->prefix, name), NULL;
    if (t->ndim != 2)
        return dc_fail("%s: tensor '%s%s' has rank %d, expected 2", weights_path(w), w->prefix, name, t->ndim), NULL;
    return t;
}

// Dimension d of t as an int in [lo, hi]: every shape from a file is checked
// before any arithmetic on it.
static int dim_in(const dc_weights *w, const dc_st_tensor *t, int d, int64_t lo, int64_t hi, const char *what, int *out) {
    int64_t v = t->shape[d];
    if (v < lo || v > hi)
        return dc_fail("%s: tensor '%s' has %s %lld (dimension %d), outside %lld..%lld", weights_path(w), t->name,
                       what, (long long)v, d, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

// One more than the highest N among tensors named prefix + start + "N.".
static int count_layers(const dc_weights *w, const char *start, int *layers) {
    size_t np = strlen(w->prefix), ns = strlen(start);
    *layers = 0;
    for (int i = 0; i < w->nfiles; i++)
        for (int j = 0; j < w->files[i].count; j++) {
            const char *name = w->files[i].tensors[j].name;
            if (strncmp(name, w->prefix, np) || strncmp(name + np, start, ns)) continue;
            const char *s = name + np + ns;
            long n = 0;
            int digits = 0;
            for (; *s >= '0' && *s <= '9' && n <= MAX_LAYERS; s++, digits++) n = 10 * n + (*s - '0');
            if (!digits || *s != '.') continue;  // not a layer tensor
            if (n >= MAX_LAYERS)
                return dc_fail("%s: tensor '%s' is of a layer past the %d supported", w->files[i].path, name, MAX_LAYERS);
            if (n + 1 > *layers) *layers = (int)n + 1;
        }
    if (*layers == 0) return dc_fail("%s: no tensors named '%s%s<N>.*' (no layers)", weights_path(w), w->prefix, start);
    return 0;
}

int dc_clip_text_config_infer(dc_clip_text_config *c, const dc_weights *w, dc_names names) {
    bool openclip = names == DC_NAMES_ORIGINAL;
    const char *tok_name = openclip ? "token_embedding.weight" : "embeddings.token_embedding.weight";
    const char *pos_name = openclip ? "positional_embedding" : "embeddings.position_embedding.weight";
    const char *fc1_name = openclip ? "transformer.resblocks.0.mlp.c_fc.weight" : "encoder.layers.0.mlp.fc1.weight";
    const char *layers = openclip ? "transformer.resblocks." : "encoder.layers.";
    const dc_st_tensor *tok = need2(w, tok_name), *pos = tok ? need2(w, pos_name) : NULL;
    const dc_st_tensor *fc1 = pos ? need2(w, fc1_name) : NULL;
    if (!fc1) return -1;
    memset(c, 0, sizeof *c);
    int pw = 0, fw = 0;
    // token table [V, W]; positions [T, W]; fc1 [F, W]
    DC_TRY(dim_in(w, tok, 0, 1, MAX_VOCAB, "vocabulary size", &c->vocab));
    DC_TRY(dim_in(w, tok, 1, HEAD_DIM, MAX_WIDTH, "width", &c->width));
    DC_TRY(dim_in(w, pos, 0, 1, MAX_POSITIONS, "positions", &c->positions));
    DC_TRY(dim_in(w, pos, 1, 1, MAX_WIDTH, "width", &pw));
    DC_TRY(dim_in(w, fc1, 0, 1, MAX_FFN, "MLP width", &c->ffn));
    DC_TRY(dim_in(w, fc1, 1, 1, MAX_WIDTH, "width", &fw));
    if (pw != c->width || fw != c->width)
        return dc_fail("%s: widths disagree: token embedding %d, positions %d, MLP input %d", weights_path(w), c->width,
                       pw, fw);
    if (c->width % HEAD_DIM)
        return dc_fail("%s: width %d is not a multiple of the head size %d (the head count cannot be inferred; "
                       "give a config.json)", weights_path(w), c->width, HEAD_DIM);
    DC_TRY(count_layers(w, layers, &c->layers));
    c->heads = c->width / HEAD_DIM;
    c->act = openclip || c->width >= 1024 ? DC_ACT_GELU_ERF : DC_ACT_QUICK_GELU;
    c->eps = 1e-5f;
    return dc_clip_text_config_validate(c);
}

const char *dc_clip_text_prefix(const dc_weights *w) {
    return dc_weights_has(w, "text_model.embeddings.token_embedding.weight") ? "text_model." : "";
}

// ---- OpenCLIP names

// src = name, all rows (rows 0) or rows [row0, row0 + rows).
static int set(dc_weight_src *src, const char *param, int64_t row0, int64_t rows, const char *fmt, ...)
    DC_PRINTF(5, 6);
static int set(dc_weight_src *src, const char *param, int64_t row0, int64_t rows, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(src->name, sizeof src->name, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof src->name) return dc_fail("parameter %s: source name too long", param);
    src->row0 = row0, src->rows = rows;
    return 0;
}

int dc_clip_text_openclip_name(void *ctx, const char *param, dc_weight_src *src) {
    const dc_clip_text_config *c = ctx;
    if (strcmp(param, "embeddings.token_embedding.weight") == 0) return set(src, param, 0, 0, "token_embedding.weight");
    if (strcmp(param, "embeddings.position_embedding.weight") == 0) return set(src, param, 0, 0, "positional_embedding");
    if (strncmp(param, "final_layer_norm.", 17) == 0) return set(src, param, 0, 0, "ln_final.%s", param + 17);
    // encoder.layers.N.<module>.<leaf>: module self_attn.x_proj, layer_normK or mlp.fcK; leaf weight or bias
    int l = -1, used = 0;
    sscanf(param, "encoder.layers.%d.%n", &l, &used);
    const char *rest = param + used, *dot = strrchr(param, '.');
    char module[32];
    if (l < 0 || used == 0 || dot <= rest || (size_t)(dot - rest) >= sizeof module)
        return dc_fail("parameter %s has no OpenCLIP name", param);
    memcpy(module, rest, (size_t)(dot - rest));
    module[dot - rest] = 0;
    const char *leaf = dot + 1;
    const int64_t W = c->width;
    static const char *const qkv[3] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
    for (int i = 0; i < 3; i++)  // in_proj_{weight,bias} [3W, ...]: rows [iW, (i+1)W) for q, k, v
        if (strcmp(module, qkv[i]) == 0)
            return set(src, param, i * W, W, "transformer.resblocks.%d.attn.in_proj_%s", l, leaf);
    static const char *const pairs[][2] = {
        {"self_attn.out_proj", "attn.out_proj"}, {"layer_norm1", "ln_1"}, {"layer_norm2", "ln_2"},
        {"mlp.fc1", "mlp.c_fc"},                 {"mlp.fc2", "mlp.c_proj"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (strcmp(module, pairs[i][0]) == 0)
            return set(src, param, 0, 0, "transformer.resblocks.%d.%s.%s", l, pairs[i][1], leaf);
    return dc_fail("parameter %s has no OpenCLIP name", param);
}
