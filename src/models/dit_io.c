#include "models/dit_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/params_io.h"

int dc_dit_config_to_kv(const dc_dit_config *c, dc_kv *kv) {
    DC_TRY(dc_kv_set(kv, "model", "DiT"));
    DC_TRY(dc_kv_set(kv, "input_size", "%d", c->input_size));
    DC_TRY(dc_kv_set(kv, "patch_size", "%d", c->patch));
    DC_TRY(dc_kv_set(kv, "in_channels", "%d", c->in_channels));
    DC_TRY(dc_kv_set(kv, "hidden_size", "%d", c->hidden));
    DC_TRY(dc_kv_set(kv, "depth", "%d", c->depth));
    DC_TRY(dc_kv_set(kv, "num_heads", "%d", c->heads));
    DC_TRY(dc_kv_set(kv, "mlp_hidden", "%d", c->mlp_hidden));
    DC_TRY(dc_kv_set(kv, "num_classes", "%d", c->num_classes));
    return dc_kv_set(kv, "learn_sigma", "%s", c->learn_sigma ? "true" : "false");
}

// Config entries looked up by key: a file's metadata or a dc_kv.
typedef const char *(*entry_fn)(const void *src, const char *key);
static const char *file_entry(const void *f, const char *key) { return dc_st_meta(f, key); }
static const char *kv_entry(const void *kv, const char *key) { return dc_kv_get(kv, key); }

static int entry_int(entry_fn get, const void *src, const char *where, const char *key, int *out) {
    const char *s = get(src, key);
    if (!s) return dc_fail("%s: metadata has no '%s'", where, key);
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 0 || v > 1 << 30)
        return dc_fail("%s: metadata '%s' = '%s' is not a valid integer", where, key, s);
    *out = (int)v;
    return 0;
}

// The config's entries, unchecked (0 where an entry is 0: "the data's").
static int config_of_entries(entry_fn get, const void *src, const char *where, dc_dit_config *c) {
    memset(c, 0, sizeof *c);
    DC_TRY(entry_int(get, src, where, "input_size", &c->input_size));
    DC_TRY(entry_int(get, src, where, "patch_size", &c->patch));
    DC_TRY(entry_int(get, src, where, "in_channels", &c->in_channels));
    DC_TRY(entry_int(get, src, where, "hidden_size", &c->hidden));
    DC_TRY(entry_int(get, src, where, "depth", &c->depth));
    DC_TRY(entry_int(get, src, where, "num_heads", &c->heads));
    DC_TRY(entry_int(get, src, where, "mlp_hidden", &c->mlp_hidden));
    DC_TRY(entry_int(get, src, where, "num_classes", &c->num_classes));
    const char *s = get(src, "learn_sigma");
    if (!s || (strcmp(s, "true") && strcmp(s, "false")))
        return dc_fail("%s: metadata 'learn_sigma' must be true or false", where);
    c->learn_sigma = strcmp(s, "true") == 0;
    return 0;
}

int dc_dit_config_from_kv(const dc_kv *kv, dc_dit_config *c) {
    DC_TRY(config_of_entries(kv_entry, kv, "model config", c));
    return dc_dit_config_validate(c);
}

static const dc_st_tensor *need(const dc_st_file *f, const char *prefix, const char *key,
                                int ndim) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, key);
    const dc_st_tensor *t = dc_st_find(f, name);
    if (!t) return dc_fail("%s: no tensor '%s' (not a DiT checkpoint?)", f->path, name), NULL;
    if (t->ndim != ndim) return dc_fail("%s: tensor '%s' has rank %d, expected %d", f->path, name, t->ndim, ndim), NULL;
    return t;
}

// Dimension d of t as an int in [lo, hi]. Every shape read from a file goes
// through here before any arithmetic: a zero patch would divide by zero, and
// a dimension of 2^32 would become 0 when cast to int.
static int dim_in(const dc_st_file *f, const dc_st_tensor *t, int d, int64_t lo, int64_t hi,
                  const char *what, int *out) {
    int64_t v = t->shape[d];
    if (v < lo || v > hi)
        return dc_fail("%s: tensor '%s' has %s %lld (dimension %d), outside %lld..%lld", f->path, t->name, what,
                       (long long)v, d, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

// The width of t's input (its last dimension) must be the model's width.
static int takes_width(const dc_st_file *f, const dc_st_tensor *t, int hidden) {
    if (t->shape[t->ndim - 1] != hidden)
        return dc_fail("%s: tensor '%s' has width %lld, but x_embedder gives %d", f->path, t->name,
                       (long long)t->shape[t->ndim - 1], hidden);
    return 0;
}

// Limits as in dc_dit_config_validate, so that nothing overflows below.
#define MAX_HIDDEN 65536
#define MAX_CHANNELS 1024
#define MAX_PATCH 64
#define MAX_TOKENS 4096
#define MAX_DEPTH 1024
#define MAX_MLP (16 * MAX_HIDDEN)
#define MAX_CLASSES 1000000

static int infer_from_shapes(const dc_st_file *f, const char *pre, int heads, dc_dit_config *c) {
    const dc_st_tensor *xe = need(f, pre, "x_embedder.proj.weight", 4);
    const dc_st_tensor *pos = need(f, pre, "pos_embed", 3);
    const dc_st_tensor *fc1 = need(f, pre, "blocks.0.mlp.fc1.weight", 2);
    const dc_st_tensor *yt = need(f, pre, "y_embedder.embedding_table.weight", 2);
    const dc_st_tensor *fl = need(f, pre, "final_layer.linear.weight", 2);
    if (!xe || !pos || !fc1 || !yt || !fl) return -1;
    memset(c, 0, sizeof *c);
    int tokens = 0, classes = 0, out_rows = 0, one = 0;
    // x_embedder.proj.weight [D, C, p, p]; pos_embed [1, T, D]; fc1 [F, D];
    // y table [classes + 1, D]; final layer [p * p * OC, D]
    DC_TRY(dim_in(f, xe, 0, 4, MAX_HIDDEN, "hidden width", &c->hidden));
    DC_TRY(dim_in(f, xe, 1, 1, MAX_CHANNELS, "input channels", &c->in_channels));
    DC_TRY(dim_in(f, xe, 2, 1, MAX_PATCH, "patch size", &c->patch));
    if (xe->shape[3] != xe->shape[2]) return dc_fail("%s: x_embedder kernel is not square", f->path);
    DC_TRY(dim_in(f, pos, 0, 1, 1, "batch dimension", &one));
    DC_TRY(dim_in(f, pos, 1, 1, MAX_TOKENS, "tokens", &tokens));
    DC_TRY(takes_width(f, pos, c->hidden));
    DC_TRY(dim_in(f, fc1, 0, 1, MAX_MLP, "MLP width", &c->mlp_hidden));
    DC_TRY(takes_width(f, fc1, c->hidden));
    DC_TRY(dim_in(f, yt, 0, 2, MAX_CLASSES + 1, "rows (classes + 1)", &classes));
    DC_TRY(takes_width(f, yt, c->hidden));
    DC_TRY(dim_in(f, fl, 0, 1, 2 * MAX_CHANNELS * MAX_PATCH * MAX_PATCH, "rows", &out_rows));
    DC_TRY(takes_width(f, fl, c->hidden));
    int grid = (int)lround(sqrt((double)tokens));
    if (grid * grid != tokens) return dc_fail("%s: pos_embed has %d tokens, not a square grid", f->path, tokens);
    c->input_size = grid * c->patch;
    c->num_classes = classes - 1;
    for (;; c->depth++) {
        char key[96];
        snprintf(key, sizeof key, "%sblocks.%d.attn.qkv.weight", pre, c->depth);
        if (!dc_st_find(f, key)) break;
        if (c->depth == MAX_DEPTH) return dc_fail("%s: more than %d blocks", f->path, MAX_DEPTH);
    }
    int pp = c->patch * c->patch;
    if (out_rows == 2 * pp * c->in_channels) c->learn_sigma = true;
    else if (out_rows != pp * c->in_channels)
        return dc_fail("%s: final layer emits %d values per token; expected %d or %d", f->path, out_rows,
                       pp * c->in_channels, 2 * pp * c->in_channels);
    c->heads = heads > 0 ? heads : dc_dit_heads_for_width(c->hidden);
    if (!c->heads)
        return dc_fail("%s: hidden width %d is not in the official table; pass --heads", f->path, c->hidden);
    return dc_dit_config_validate(c) ? dc_fail_ctx("%s: inferred config", f->path) : 0;
}

// A config from metadata must describe the tensors the file holds: a model is
// allocated from it before any tensor is read, so a damaged or edited config
// must not ask for more than the file brings.
static int check_against_shapes(const dc_st_file *f, const char *pre, const dc_dit_config *c) {
    dc_dit_config s;
    DC_TRY(infer_from_shapes(f, pre, c->heads, &s));
    struct { const char *key; int meta, shapes; } k[] = {
        {"input_size", c->input_size, s.input_size}, {"patch_size", c->patch, s.patch},
        {"in_channels", c->in_channels, s.in_channels}, {"hidden_size", c->hidden, s.hidden},
        {"depth", c->depth, s.depth}, {"mlp_hidden", c->mlp_hidden, s.mlp_hidden},
        {"num_classes", c->num_classes, s.num_classes}, {"learn_sigma", c->learn_sigma, s.learn_sigma},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].meta != k[i].shapes)
            return dc_fail("%s: metadata '%s' is %d but the tensors give %d", f->path, k[i].key, k[i].meta,
                           k[i].shapes);
    return 0;
}

int dc_dit_config_from_file(const dc_st_file *f, const char *prefix, int heads, dc_dit_config *c) {
    if (!dc_st_meta(f, "hidden_size")) return infer_from_shapes(f, prefix, heads, c);
    DC_TRY(config_of_entries(file_entry, f, f->path, c));
    if (heads > 0) c->heads = heads;
    if (dc_dit_config_validate(c)) return dc_fail_ctx("%s: bad config in metadata", f->path);
    return check_against_shapes(f, prefix, c);
}

int dc_dit_load_weights(dc_dit *m, const dc_st_file *f, const char *prefix) {
    DC_TRY(dc_params_load(&m->params, m->params.data, f, prefix));
    dc_params_touch(&m->params);
    return 0;
}

int dc_dit_weight_entries(const dc_dit *m, dc_buf src, const char *prefix, float *host,
                          dc_st_entry *entries, char (*names)[128]) {
    return dc_params_entries(&m->params, src, prefix, host, entries, names);
}
