#include "train/shards.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "core/rng.h"
#include "train/stream.h"

// What x0 is read from.
typedef enum {
    X0_DIST,    // latents_mean, latents_logvar: a latent drawn each visit
    X0_SINGLE,  // one stored latent
    X0_PIXELS,  // uint8 pixels
} x0_kind;

enum { MAX_COLS = 4 };  // x0, logvar, text, tokens (or x0, logvar, caption)

// How one of the stream's columns is read.
typedef struct {
    const char *name;  // while opening (the caller's string)
    bool raw;        // a bytes column of raw values
    dc_dtype dtype;  // raw: DC_F16, DC_BF16 or DC_F32
    int64_t count;   // values a sample
} column;

typedef struct {
    dc_stream st;
    x0_kind kind;
    float scale;
    int64_t numel;      // one sample's x0
    float *scratch;     // [numel] logvar, or the pixels before a flip
    float *text_null;   // [T, D] (embeddings)
    int text_null_len;
    const dc_clip_tokenizer *tok;  // token ids of the captions, or NULL
    int32_t null_ids[DC_CLIP_CONTEXT];  // the empty prompt's (tok)
    char *caption;      // a caption as a C string (tok)
    int64_t caption_cap;
    int ncols;
    column cols[MAX_COLS];  // the stream's columns: x0 first
    int col_logvar, col_text, col_tokens, col_caption;  // -1: none
    int64_t read;       // the sample st holds, -1 none
    char *dir;
} shards;

static int has_column(const dc_mds_reader *r, const char *name) {
    for (int i = 0; i < dc_mds_columns(r); i++)
        if (!strcmp(dc_mds_column_at(r, i)->name, name)) return 1;
    return 0;
}

static int read_sample(shards *sh, int64_t idx) {
    if (sh->read == idx) return 0;
    sh->read = -1;
    DC_TRY(dc_stream_read(&sh->st, idx));
    sh->read = idx;
    return 0;
}

static int sh_index(dc_source *s, int64_t g, int batch, int64_t *idx) {
    shards *sh = s->impl;
    int64_t epoch_len = s->n / batch * batch;
    if (epoch_len == 0)
        return dc_fail("%s: %lld samples cannot fill one global batch of %d", s->name, (long long)s->n, batch);
    *idx = dc_stream_order_at(&sh->st.order, g / epoch_len, g % epoch_len);
    return 0;
}

// Stream column k of sample idx (read) as floats: an ndarray's values, or a
// bytes column's raw values once its length is checked.
static int column_f32(shards *sh, int k, int64_t idx, float *dst) {
    const column *c = &sh->cols[k];
    if (!c->raw) return dc_stream_f32(&sh->st, k, dst, c->count);
    dc_mds_array a;
    DC_TRY(dc_stream_column(&sh->st, k, &a));
    const size_t size = dc_dtype_size(c->dtype);
    if (a.count != c->count * (int64_t)size)
        return dc_fail("%s: sample %lld: column \"%s\" holds %lld bytes; %lld %s values are %lld", sh->dir,
                       (long long)idx, dc_mds_column_at(sh->st.mds, sh->st.col[k])->name, (long long)a.count, (long long)c->count, dc_dtype_name(c->dtype),
                       (long long)(c->count * (int64_t)size));
    const uint8_t *b = a.values;  // unaligned, little-endian
    for (int64_t j = 0; j < c->count; j++, b += size) {
        uint16_t h;
        if (c->dtype == DC_F32) memcpy(&dst[j], b, 4);
        else memcpy(&h, b, 2), dst[j] = c->dtype == DC_F16 ? dc_f16_to_f32(h) : dc_bf16_to_f32(h);
    }
    return 0;
}

static int sh_x0(dc_source *s, int64_t idx, bool flip, uint64_t seed, uint32_t key, uint32_t step, float *dst) {
    shards *sh = s->impl;
    DC_TRY(read_sample(sh, idx));
    if (sh->kind != X0_PIXELS) {
        DC_TRY(column_f32(sh, 0, idx, dst));
        if (sh->kind == X0_SINGLE) {
            for (int64_t j = 0; j < sh->numel; j++) dst[j] *= sh->scale;
            return 0;
        }
        DC_TRY(column_f32(sh, sh->col_logvar, idx, sh->scratch));
        for (int64_t j = 0; j < sh->numel; j++)
            dst[j] = sh->scale * (dst[j] + expf(0.5f * sh->scratch[j]) *
                                               dc_randn_at(seed, key, step, DC_STREAM_LATENT, (uint32_t)j));
        return 0;
    }
    float *px = flip ? sh->scratch : dst;
    DC_TRY(column_f32(sh, 0, idx, px));
    for (int64_t j = 0; j < sh->numel; j++) px[j] = px[j] / 127.5f - 1.0f;
    if (flip) dc_mirror_rows(dst, px, (int64_t)s->channels * s->height, s->width);
    return 0;
}

static int sh_cond(dc_source *s, int64_t idx, bool drop, int32_t *label, float *ctx, int32_t *len) {
    (void)label;  // shards carry text
    shards *sh = s->impl;
    const int64_t seq = (int64_t)s->text_len * s->text_dim;
    if (drop) {
        memcpy(ctx, sh->text_null, (size_t)seq * sizeof *ctx);
        *len = sh->text_null_len;
        return 0;
    }
    DC_TRY(read_sample(sh, idx));
    DC_TRY(column_f32(sh, sh->col_text, idx, ctx));
    if (sh->col_tokens < 0) return *len = s->text_len, 0;
    float tokens;
    DC_TRY(column_f32(sh, sh->col_tokens, idx, &tokens));
    if (!(tokens >= 1 && tokens <= s->text_len))
        return dc_fail("%s: sample %lld counts %g tokens of %d", s->name, (long long)idx, tokens, s->text_len);
    *len = (int32_t)tokens;
    return 0;
}

static int sh_ids(dc_source *s, int64_t idx, bool drop, int32_t *ids, int32_t *len) {
    shards *sh = s->impl;
    int n;
    if (drop) {
        memcpy(ids, sh->null_ids, sizeof sh->null_ids);
        return *len = dc_clip_counted(0), 0;
    }
    DC_TRY(read_sample(sh, idx));
    dc_mds_array a;
    DC_TRY(dc_stream_column(&sh->st, sh->col_caption, &a));
    if (memchr(a.values, 0, (size_t)a.count))
        return dc_fail("%s: sample %lld: its caption holds a NUL byte", s->name, (long long)idx);
    if (a.count + 1 > sh->caption_cap) {
        char *c = realloc(sh->caption, (size_t)a.count + 1);
        if (!c) return dc_fail("out of memory");
        sh->caption = c, sh->caption_cap = a.count + 1;
    }
    memcpy(sh->caption, a.values, (size_t)a.count);
    sh->caption[a.count] = 0;
    if (dc_clip_tokenize(sh->tok, sh->caption, ids, &n))
        return dc_fail_ctx("%s: sample %lld's caption", s->name, (long long)idx);
    *len = dc_clip_counted(n);
    return 0;
}

static void sh_close(dc_source *s) {
    shards *sh = s->impl;
    dc_stream_close(&sh->st);
    free(sh->scratch), free(sh->text_null), free(sh->caption), free(sh->dir);
    free(sh);
}

static const dc_source_ops k_shards = {.index = sh_index, .x0 = sh_x0, .cond = sh_cond, .ids = sh_ids,
                                       .close = sh_close};

static const dc_shards_raw *find_raw(const dc_shards_opts *o, const char *name) {
    for (int i = 0; i < o->nraw; i++)
        if (!strcmp(o->raw[i].name, name)) return &o->raw[i];
    return NULL;
}

// Column `name` as the stream's next column: its shape of `ndim` dimensions
// from its ndarray encoding or, for bytes, from the raw values given.
static int add_column(shards *sh, const dc_mds_reader *r, const dc_shards_opts *o, const char *name, int ndim,
                      int64_t *shape) {
    int k = dc_mds_find(r, name);
    if (k < 0) return dc_fail_ctx("%s", o->dir);
    const dc_mds_column *c = dc_mds_column_at(r, k);
    const dc_shards_raw *raw = find_raw(o, name);
    column *col = &sh->cols[sh->ncols++];
    *col = (column){.name = name, .raw = c->kind == DC_MDS_BYTES};
    if (col->raw) {
        if (!raw)
            return dc_fail("%s: column \"%s\" holds bytes: its values' dtype and shape (%d dimensions) must be "
                           "given", o->dir, name, ndim);
        if (raw->ndim != ndim)
            return dc_fail("%s: column \"%s\": a shape of %d dimensions given, %d expected", o->dir, name,
                           raw->ndim, ndim);
        if (raw->dtype != DC_F16 && raw->dtype != DC_BF16 && raw->dtype != DC_F32)
            return dc_fail("%s: column \"%s\": raw values are float16, bfloat16 or float32", o->dir, name);
        col->dtype = raw->dtype;
        memcpy(shape, raw->shape, (size_t)ndim * sizeof *shape);
    } else {
        if (raw)
            return dc_fail("%s: column \"%s\" is \"%s\", which gives its own dtype and shape (one is given only "
                           "for bytes columns)", o->dir, name, c->encoding);
        if (c->kind != DC_MDS_NDARRAY || c->ndim != ndim)
            return dc_fail("%s: column \"%s\" is \"%s\"; an ndarray of %d fixed dimensions is expected", o->dir,
                           name, c->encoding, ndim);
        memcpy(shape, c->shape, (size_t)ndim * sizeof *shape);
    }
    col->count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || shape[i] > 65536)
            return dc_fail("%s: column \"%s\": dimension %d is %lld", o->dir, name, i, (long long)shape[i]);
        col->count *= shape[i];
    }
    return 0;
}

// A scalar column (the token counts).
static int add_scalar(shards *sh, const dc_mds_reader *r, const dc_shards_opts *o, const char *name) {
    int k = dc_mds_find(r, name);
    if (k < 0) return dc_fail_ctx("%s", o->dir);
    sh->cols[sh->ncols++] = (column){.name = name, .count = 1};
    return 0;
}

// What the samples are and which columns hold them: x0's and the text's
// shapes from the columns' encodings or the raw shapes given.
static int describe(dc_source *s, shards *sh, const dc_mds_reader *r, const dc_shards_opts *o) {
    sh->col_logvar = sh->col_text = sh->col_tokens = sh->col_caption = -1;
    sh->kind = o->latents_column ? X0_SINGLE : has_column(r, "latents_mean") ? X0_DIST : X0_PIXELS;
    if (sh->kind == X0_PIXELS && !has_column(r, "pixels"))
        return dc_fail("%s: neither latents (latents_mean, latents_logvar) nor pixels to train on", o->dir);
    const char *x0 = o->latents_column ? o->latents_column : sh->kind == X0_DIST ? "latents_mean" : "pixels";
    int64_t x[3], t[2];
    DC_TRY(add_column(sh, r, o, x0, 3, x));
    if (sh->kind == X0_DIST) {
        int64_t lv[3];
        sh->col_logvar = sh->ncols;
        DC_TRY(add_column(sh, r, o, "latents_logvar", 3, lv));
        if (memcmp(lv, x, sizeof x)) return dc_fail("%s: latents_logvar's shape is not latents_mean's", o->dir);
    }
    if (o->tok) {  // the captions, tokenized as they are read
        const int k = dc_mds_find(r, "caption");
        if (k < 0) return dc_fail("%s: no caption column: a text encoder that trains reads the captions", o->dir);
        if (dc_mds_column_at(r, k)->kind != DC_MDS_STR)
            return dc_fail("%s: column \"caption\" is \"%s\", not str", o->dir, dc_mds_column_at(r, k)->encoding);
        sh->col_caption = sh->ncols;
        sh->cols[sh->ncols++] = (column){.name = "caption"};
        t[0] = DC_CLIP_CONTEXT, t[1] = 0;
    } else if (!o->text_column && (!has_column(r, "text_embeddings") || !has_column(r, "text_tokens")))
        return dc_fail("%s: no text_embeddings and text_tokens columns: text conditioning needs them", o->dir);
    if (!o->tok) {
        sh->col_text = sh->ncols;
        DC_TRY(add_column(sh, r, o, o->text_column ? o->text_column : "text_embeddings", 2, t));
    }
    if (!o->tok && !o->text_column) {
        sh->col_tokens = sh->ncols;
        DC_TRY(add_scalar(sh, r, o, "text_tokens"));
    }
    for (int i = 0; i < o->nraw; i++) {
        bool read = false;
        for (int k = 0; k < sh->ncols; k++) read |= !strcmp(sh->cols[k].name, o->raw[i].name);
        if (!read) return dc_fail("%s: a shape is given for column \"%s\", which is not read", o->dir, o->raw[i].name);
    }
    if (x[0] > 64 || t[0] > 4096) return dc_fail("%s: implausible shapes", o->dir);
    s->channels = (int)x[0], s->height = (int)x[1], s->width = (int)x[2];
    s->text_len = (int)t[0], s->text_dim = (int)t[1];
    sh->numel = x[0] * x[1] * x[2];
    return 0;
}

// Raw shapes that do not fit the bytes are refused at once (every sample is
// checked again when read): the first sample read whole.
static int check_first(dc_source *s) {
    shards *sh = s->impl;
    float *ctx = malloc(((size_t)s->text_len * (size_t)s->text_dim + 1) * sizeof *ctx);
    float *x0 = malloc((size_t)sh->numel * sizeof *x0);
    int32_t len, ids[DC_CLIP_CONTEXT];
    int rc = !x0 || !ctx ? dc_fail("out of memory")
             : s->ops->x0(s, 0, false, 0, 0, 0, x0) ||
                       (sh->tok ? s->ops->ids(s, 0, false, ids, &len) : s->ops->cond(s, 0, false, NULL, ctx, &len))
                   ? -1
                   : 0;
    free(x0), free(ctx);
    return rc;
}

// xxHash64 of index.json (every shard's name, size and sample count), the
// shapes, the latent scale and the empty prompt; with a mapping given, the
// columns read and how (the data sets `diffusion prepare` writes hash as
// they always have).
static int fingerprint(const dc_shards_opts *o, const dc_source *s, const shards *sh, uint64_t *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/index.json", o->dir);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    char *text = malloc((size_t)size + 1);
    int rc = text ? dc_read_exact(fd, text, (size_t)size, path) : dc_fail("%s: out of memory", path);
    close(fd);
    if (rc) return free(text), -1;
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0);
    dc_xxh64_update(&h, text, (size_t)size);
    free(text);
    int64_t dims[6] = {s->n, s->channels, s->height, s->width, s->text_len, s->text_dim};
    for (int i = 0; i < 6; i++) dc_xxh64_update_u64(&h, (uint64_t)dims[i]);
    dc_xxh64_update(&h, &sh->scale, sizeof sh->scale);
    if (sh->tok) {  // the captions' ids: the empty prompt's, and that they are ids
        dc_xxh64_update(&h, sh->null_ids, sizeof sh->null_ids);
        dc_xxh64_update(&h, "ids", 3);
    } else {
        dc_xxh64_update(&h, sh->text_null, (size_t)s->text_len * s->text_dim * sizeof *sh->text_null);
        dc_xxh64_update_u64(&h, (uint64_t)sh->text_null_len);
    }
    if (o->latents_column || o->text_column || o->nraw) {
        dc_xxh64_update_u64(&h, (uint64_t)sh->kind);
        for (int k = 0; k < sh->ncols; k++) {
            const column *c = &sh->cols[k];
            dc_xxh64_update(&h, c->name, strlen(c->name) + 1);
            dc_xxh64_update_u64(&h, c->raw ? 1u + (uint64_t)c->dtype : 0);
        }
    }
    *out = dc_xxh64_digest(&h);
    return 0;
}

int dc_source_shards(dc_source *s, const dc_shards_opts *o) {
    memset(s, 0, sizeof *s);
    shards *sh = calloc(1, sizeof *sh);
    if (!sh) return dc_fail("out of memory");
    *s = (dc_source){.ops = &k_shards, .cond = o->tok ? DC_COND_TOKENS : DC_COND_TEXT, .impl = sh};
    sh->read = -1, sh->tok = o->tok;
    dc_mds_reader *r = NULL;
    int rc = dc_mds_open(&r, o->dir);
    if (!rc) rc = describe(s, sh, r, o);
    if (r) dc_mds_close(r);
    const bool latents = sh->kind != X0_PIXELS;
    if (!rc && latents && !(o->latent_scale > 0 && isfinite(o->latent_scale)))
        rc = dc_fail("%s: latents need the VAE's scaling factor (got %g)", o->dir, o->latent_scale);
    if (!rc && !o->tok && (!o->text_null || o->text_null_len < 1 || o->text_null_len > s->text_len))
        rc = dc_fail("%s: the empty prompt's embeddings and length (1..%d) are needed", o->dir, s->text_len);
    if (!rc && o->tok) rc = dc_clip_tokenize(o->tok, "", sh->null_ids, NULL);
    const size_t seq = (size_t)s->text_len * (size_t)s->text_dim;
    if (!rc) {
        sh->scale = latents ? o->latent_scale : 1.0f;
        sh->scratch = malloc((size_t)sh->numel * sizeof *sh->scratch);
        sh->text_null = o->tok ? NULL : malloc(seq * sizeof *sh->text_null);
        sh->dir = strdup(o->dir);
        rc = sh->scratch && (o->tok || sh->text_null) && sh->dir ? 0 : dc_fail("out of memory");
    }
    if (!rc) {
        if (sh->text_null) memcpy(sh->text_null, o->text_null, seq * sizeof *sh->text_null);
        // without token counts every position counts, the empty prompt's too
        sh->text_null_len = sh->col_tokens < 0 ? s->text_len : o->text_null_len;
        const char *names[MAX_COLS];
        for (int k = 0; k < sh->ncols; k++) names[k] = sh->cols[k].name;
        rc = dc_stream_open(&sh->st, o->dir, names, sh->ncols, o->seed, o->block);
    }
    if (!rc) {
        s->n = sh->st.order.n, s->flips = sh->kind == X0_PIXELS, s->name = sh->dir;
        rc = fingerprint(o, s, sh, &s->fingerprint);
    }
    if (!rc && (o->nraw || o->tok)) rc = check_first(s);
    for (int k = 0; k < sh->ncols; k++) sh->cols[k].name = NULL;  // the caller's strings: messages use the stream's
    if (rc) {
        if (sh->st.mds) dc_stream_close(&sh->st);
        free(sh->scratch), free(sh->text_null), free(sh->caption), free(sh->dir), free(sh);
        memset(s, 0, sizeof *s);
    }
    return rc;
}
