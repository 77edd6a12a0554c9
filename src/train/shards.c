#include "train/shards.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "core/rng.h"
#include "train/stream.h"

enum { COL_X0, COL_LOGVAR, COL_TEXT, COL_TOKENS };  // the stream's columns (no logvar for pixels)

typedef struct {
    dc_stream st;
    bool latents;
    float scale;
    int64_t numel;      // one sample's x0
    float *scratch;     // [numel] logvar, or the pixels before a flip
    float *text_null;   // [T, D]
    int text_null_len;
    int col_text, col_tokens;
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

static int sh_x0(dc_source *s, int64_t idx, bool flip, uint64_t seed, uint32_t key, uint32_t step, float *dst) {
    shards *sh = s->impl;
    DC_TRY(read_sample(sh, idx));
    if (sh->latents) {
        DC_TRY(dc_stream_f32(&sh->st, COL_X0, dst, sh->numel));
        DC_TRY(dc_stream_f32(&sh->st, COL_LOGVAR, sh->scratch, sh->numel));
        for (int64_t j = 0; j < sh->numel; j++)
            dst[j] = sh->scale * (dst[j] + expf(0.5f * sh->scratch[j]) *
                                               dc_randn_at(seed, key, step, DC_STREAM_LATENT, (uint32_t)j));
        return 0;
    }
    float *px = flip ? sh->scratch : dst;
    DC_TRY(dc_stream_f32(&sh->st, COL_X0, px, sh->numel));
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
    DC_TRY(dc_stream_f32(&sh->st, sh->col_text, ctx, seq));
    float tokens;
    DC_TRY(dc_stream_f32(&sh->st, sh->col_tokens, &tokens, 1));
    if (!(tokens >= 1 && tokens <= s->text_len))
        return dc_fail("%s: sample %lld counts %g tokens of %d", s->name, (long long)idx, tokens, s->text_len);
    *len = (int32_t)tokens;
    return 0;
}

static void sh_close(dc_source *s) {
    shards *sh = s->impl;
    dc_stream_close(&sh->st);
    free(sh->scratch), free(sh->text_null), free(sh->dir);
    free(sh);
}

static const dc_source_ops k_shards = {sh_index, sh_x0, sh_cond, sh_close};

// A column's static shape of `ndim` dimensions, or an error naming it.
static int static_shape(const dc_mds_reader *r, const char *dir, const char *name, int ndim, int64_t *shape) {
    int k = dc_mds_find(r, name);
    if (k < 0) return dc_fail_ctx("%s", dir);
    const dc_mds_column *c = dc_mds_column_at(r, k);
    if (c->kind != DC_MDS_NDARRAY || c->ndim != ndim)
        return dc_fail("%s: column \"%s\" is \"%s\"; an ndarray of %d fixed dimensions is expected", dir, name,
                       c->encoding, ndim);
    memcpy(shape, c->shape, (size_t)ndim * sizeof *shape);
    return 0;
}

// What the samples are: x0's and the text's shapes from the columns' encodings.
static int describe(dc_source *s, shards *sh, const dc_shards_opts *o) {
    dc_mds_reader *r;
    DC_TRY(dc_mds_open(&r, o->dir));
    int64_t x[3], t[2];
    sh->latents = has_column(r, "latents_mean");
    int rc = !sh->latents && !has_column(r, "pixels")
                 ? dc_fail("%s: neither latents (latents_mean, latents_logvar) nor pixels to train on", o->dir)
                 : 0;
    if (!rc) rc = static_shape(r, o->dir, sh->latents ? "latents_mean" : "pixels", 3, x);
    if (!rc && sh->latents) {
        int64_t lv[3];
        rc = static_shape(r, o->dir, "latents_logvar", 3, lv);
        if (!rc && memcmp(lv, x, sizeof x)) rc = dc_fail("%s: latents_logvar's shape is not latents_mean's", o->dir);
    }
    if (!rc && (!has_column(r, "text_embeddings") || !has_column(r, "text_tokens")))
        rc = dc_fail("%s: no text_embeddings and text_tokens columns: text conditioning needs them", o->dir);
    if (!rc) rc = static_shape(r, o->dir, "text_embeddings", 2, t);
    dc_mds_close(r);
    DC_TRY(rc);
    if (x[0] > 64 || x[1] > 65536 || x[2] > 65536 || t[0] > 4096 || t[1] > 65536)
        return dc_fail("%s: implausible shapes", o->dir);
    s->channels = (int)x[0], s->height = (int)x[1], s->width = (int)x[2];
    s->text_len = (int)t[0], s->text_dim = (int)t[1];
    sh->numel = x[0] * x[1] * x[2];
    return 0;
}

// xxHash64 of index.json (every shard's name, size and sample count), the
// shapes, the latent scale and the empty prompt.
static int fingerprint(const char *dir, const dc_source *s, const shards *sh, uint64_t *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/index.json", dir);
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
    dc_xxh64_update(&h, sh->text_null, (size_t)s->text_len * s->text_dim * sizeof *sh->text_null);
    dc_xxh64_update_u64(&h, (uint64_t)sh->text_null_len);
    *out = dc_xxh64_digest(&h);
    return 0;
}

int dc_source_shards(dc_source *s, const dc_shards_opts *o) {
    memset(s, 0, sizeof *s);
    shards *sh = calloc(1, sizeof *sh);
    if (!sh) return dc_fail("out of memory");
    *s = (dc_source){.ops = &k_shards, .cond = DC_COND_TEXT, .impl = sh};
    sh->read = -1;
    int rc = describe(s, sh, o);
    if (!rc && sh->latents && !(o->latent_scale > 0 && isfinite(o->latent_scale)))
        rc = dc_fail("%s: latents need the VAE's scaling factor (got %g)", o->dir, o->latent_scale);
    if (!rc && (!o->text_null || o->text_null_len < 1 || o->text_null_len > s->text_len))
        rc = dc_fail("%s: the empty prompt's embeddings and length (1..%d) are needed", o->dir, s->text_len);
    const size_t seq = (size_t)s->text_len * (size_t)s->text_dim;
    if (!rc) {
        sh->scale = sh->latents ? o->latent_scale : 1.0f;
        sh->scratch = malloc((size_t)sh->numel * sizeof *sh->scratch);
        sh->text_null = malloc(seq * sizeof *sh->text_null);
        sh->dir = strdup(o->dir);
        rc = sh->scratch && sh->text_null && sh->dir ? 0 : dc_fail("out of memory");
    }
    if (!rc) {
        memcpy(sh->text_null, o->text_null, seq * sizeof *sh->text_null);
        sh->text_null_len = o->text_null_len;
        const char *cols_latent[] = {"latents_mean", "latents_logvar", "text_embeddings", "text_tokens"};
        const char *cols_pixels[] = {"pixels", "text_embeddings", "text_tokens"};
        sh->col_text = sh->latents ? COL_TEXT : COL_TEXT - 1;
        sh->col_tokens = sh->col_text + 1;
        rc = sh->latents ? dc_stream_open(&sh->st, o->dir, cols_latent, 4, o->seed, o->block)
                         : dc_stream_open(&sh->st, o->dir, cols_pixels, 3, o->seed, o->block);
    }
    if (!rc) {
        s->n = sh->st.order.n, s->flips = !sh->latents, s->name = sh->dir;
        rc = fingerprint(o->dir, s, sh, &s->fingerprint);
    }
    if (rc) {
        if (sh->st.mds) dc_stream_close(&sh->st);
        free(sh->scratch), free(sh->text_null), free(sh->dir), free(sh);
        memset(s, 0, sizeof *s);
    }
    return rc;
}
