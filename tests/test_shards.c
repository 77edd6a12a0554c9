// The MDS shard data source (train/shards.h): latents drawn from their
// stored distribution against a double-precision reference, pixels mapped to
// [-1, 1] and mirrored, text and the empty prompt for dropped captions, and
// the order against the stream's own epoch-by-epoch batches (dc_stream_next);
// MosaicML's layout (single latents and text embeddings as raw values in
// bytes columns, named by the caller), plain and zstd, every raw dtype,
// against values decoded independently, and its refusals.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/mds.h"
#include "train/shards.h"
#include "train/stream.h"

#include "check.h"
#include "tmpdir.h"

enum { N = 11, C = 4, H = 3, W = 5, T = 6, D = 7, PX = 3 * H * W };

static float rnd(uint32_t a, uint32_t b) { return dc_randn_at(4242, a, b, 0, 0); }

// Sample i's values as written (fp16 bits for the float columns).
static uint16_t mean_h(int i, int j) { return dc_f32_to_f16(rnd((uint32_t)i, (uint32_t)j)); }
static uint16_t logvar_h(int i, int j) { return dc_f32_to_f16(-2.0f + 0.5f * rnd((uint32_t)i, 1000u + (uint32_t)j)); }
static uint16_t text_h(int i, int j) { return dc_f32_to_f16(rnd((uint32_t)i, 5000u + (uint32_t)j)); }
static int32_t tokens(int i) { return 1 + (int32_t)(dc_rand_u32_at(9, (uint32_t)i, 0, 0, 0) % T); }
static uint8_t pixel(int i, int j) { return (uint8_t)(dc_rand_u32_at(8, (uint32_t)i, (uint32_t)j, 0, 0) & 255); }

static const char *write_set(const char *name, int latents) {
    char enc_x[64], enc_t[64];
    snprintf(enc_x, sizeof enc_x, latents ? "ndarray:float16:%d,%d,%d" : "ndarray:uint8:3,%d,%d", C, H, W);
    if (!latents) snprintf(enc_x, sizeof enc_x, "ndarray:uint8:3,%d,%d", H, W);
    snprintf(enc_t, sizeof enc_t, "ndarray:float16:%d,%d", T, D);
    dc_mds_spec lat[] = {{"latents_mean", enc_x}, {"latents_logvar", enc_x}, {"text_embeddings", enc_t},
                         {"text_tokens", "int32"}, {"caption", "str"}};
    dc_mds_spec pix[] = {{"pixels", enc_x}, {"text_embeddings", enc_t}, {"text_tokens", "int32"}};
    dc_mds_write_opts o = {0, 700};  // a few samples a shard
    dc_mds_writer *w;
    const char *dir = tmp_path(name);
    if (dc_mds_writer_open(&w, dir, latents ? lat : pix, latents ? 5 : 3, &o)) return NULL;
    for (int i = 0; i < N; i++) {
        uint16_t m[C * H * W], lv[C * H * W], t[T * D];
        uint8_t px[PX];
        for (int j = 0; j < C * H * W; j++) m[j] = mean_h(i, j), lv[j] = logvar_h(i, j);
        for (int j = 0; j < T * D; j++) t[j] = text_h(i, j);
        for (int j = 0; j < PX; j++) px[j] = pixel(i, j);
        int32_t tok = tokens(i);
        dc_mds_value vl[5] = {{m, sizeof m, 0, 0, NULL}, {lv, sizeof lv, 0, 0, NULL}, {t, sizeof t, 0, 0, NULL},
                              {&tok, 4, 0, 0, NULL}, {"a cat", 5, 0, 0, NULL}};
        dc_mds_value vp[3] = {{px, sizeof px, 0, 0, NULL}, {t, sizeof t, 0, 0, NULL}, {&tok, 4, 0, 0, NULL}};
        if (dc_mds_write(w, latents ? vl : vp)) return dc_mds_writer_free(w), NULL;
    }
    return dc_mds_writer_finish(w) ? NULL : dir;
}

static float g_null[T * D];

static dc_shards_opts opts(const char *dir) {
    return (dc_shards_opts){.dir = dir, .seed = 31, .block = 4, .latent_scale = 0.18215f, .text_null = g_null,
                            .text_null_len = 2};
}

// Positions g of a run with global batch B against dc_stream_next's batches,
// which end each epoch where a whole batch no longer fits.
static void check_order(dc_source *s, const char *dir, int B) {
    dc_stream st;
    CHECK(dc_stream_open(&st, dir, NULL, 0, 31, 4) == 0, "stream: %s", dc_error());
    int bad = 0;
    int64_t want[8], got;
    for (int64_t g = 0; g < 5 * N; g += B) {
        CHECK(dc_stream_next(&st, B, 0, 1, want) == 0, "next: %s", dc_error());
        for (int i = 0; i < B; i++) bad += s->ops->index(s, g + i, B, &got) != 0 || got != want[i];
    }
    CHECK(bad == 0, "batch %d: %d positions differ from the stream's batches", B, bad);
    dc_stream_close(&st);
}

static void check_latents(const char *dir) {
    dc_source s;
    dc_shards_opts o = opts(dir);
    CHECK(dc_source_shards(&s, &o) == 0, "open: %s", dc_error());
    if (!s.ops) return;
    CHECK(s.n == N && s.channels == C && s.height == H && s.width == W && s.text_len == T && s.text_dim == D &&
              !s.flips && s.cond == DC_COND_TEXT && s.fingerprint != 0,
          "shape %lld %dx%dx%d text %dx%d flips %d", (long long)s.n, s.channels, s.height, s.width, s.text_len,
          s.text_dim, s.flips);
    check_order(&s, dir, 3);
    check_order(&s, dir, 4);
    float x[C * H * W], again[C * H * W];
    double worst = 0;
    int nan = 0;
    for (int i = 0; i < N; i++) {
        uint32_t key = (uint32_t)(i * 7 % 5), step = (uint32_t)(3 + i);
        CHECK(s.ops->x0(&s, i, false, 99, key, step, x) == 0, "x0 %d: %s", i, dc_error());
        for (int j = 0; j < C * H * W; j++) {
            double m = dc_f16_to_f32(mean_h(i, j)), lv = dc_f16_to_f32(logvar_h(i, j));
            double want = 0.18215 * (m + exp(lv / 2) * dc_randn_at(99, key, step, DC_STREAM_LATENT, (uint32_t)j));
            nan += !isfinite(x[j]);
            double e = fabs(x[j] - want) / (fabs(want) + 1e-3);
            if (!(e <= worst)) worst = e;
        }
    }
    CHECK(nan == 0 && worst < 1e-5, "latents: %d non-finite, worst relative error %g", nan, worst);
    // the same keys draw the same latent; another step another one
    CHECK(s.ops->x0(&s, 2, false, 99, 1, 7, x) == 0 && s.ops->x0(&s, 5, false, 99, 1, 7, again) == 0 &&
              s.ops->x0(&s, 2, false, 99, 1, 7, again) == 0 && !memcmp(x, again, sizeof x),
          "a latent drawn twice with the same keys differs");
    CHECK(s.ops->x0(&s, 2, false, 99, 1, 8, again) == 0 && memcmp(x, again, sizeof x), "another step, the same latent");
    // text, and the empty prompt for a dropped caption
    float ctx[T * D];
    int32_t len;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        CHECK(s.ops->cond(&s, i, false, NULL, ctx, &len) == 0, "cond %d: %s", i, dc_error());
        for (int j = 0; j < T * D; j++) bad += ctx[j] != dc_f16_to_f32(text_h(i, j));
        bad += len != tokens(i);
        CHECK(s.ops->cond(&s, i, true, NULL, ctx, &len) == 0, "dropped %d", i);
        bad += memcmp(ctx, g_null, sizeof ctx) != 0 || len != 2;
    }
    CHECK(bad == 0, "%d conditioning values differ", bad);
    // the fingerprint sees the empty prompt and the scale
    uint64_t f0 = s.fingerprint;
    dc_source_close(&s);
    g_null[5] += 0.25f;
    CHECK(dc_source_shards(&s, &o) == 0 && s.fingerprint != f0, "another empty prompt, the same fingerprint");
    g_null[5] -= 0.25f;
    dc_source_close(&s);
    o.latent_scale = 0.13025f;
    CHECK(dc_source_shards(&s, &o) == 0 && s.fingerprint != f0, "another scale, the same fingerprint");
    dc_source_close(&s);
    o.latent_scale = 0;
    CHECK(dc_source_shards(&s, &o) != 0 && strstr(dc_error(), "scaling factor"), "no scale: %s", dc_error());
    o = opts(dir), o.text_null = NULL;
    CHECK(dc_source_shards(&s, &o) != 0 && strstr(dc_error(), "empty prompt"), "no empty prompt: %s", dc_error());
    CHECK(s.ops == NULL, "a failed open leaves a source");
}

static void check_pixels(const char *dir) {
    dc_source s;
    dc_shards_opts o = opts(dir);
    o.latent_scale = 0;  // not needed for pixels
    CHECK(dc_source_shards(&s, &o) == 0, "open: %s", dc_error());
    if (!s.ops) return;
    CHECK(s.channels == 3 && s.height == H && s.width == W && s.flips, "pixels: %dx%dx%d flips %d", s.channels,
          s.height, s.width, s.flips);
    float x[PX];
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int flip = 0; flip < 2; flip++) {
            CHECK(s.ops->x0(&s, i, flip, 1, 0, 0, x) == 0, "x0 %d: %s", i, dc_error());
            for (int r = 0; r < 3 * H; r++)
                for (int c = 0; c < W; c++) {
                    double want = pixel(i, r * W + (flip ? W - 1 - c : c)) / 127.5 - 1;
                    bad += fabs(x[r * W + c] - want) > 1e-6 || !isfinite(x[r * W + c]);
                }
        }
    CHECK(bad == 0, "%d pixel values differ", bad);
    dc_source_close(&s);
}

// ---- MosaicML's layout: "bytes" columns of raw values

// Raw value j of sample i's column (salt tells the columns apart), stored as dt.
static void put_raw(uint8_t *out, dc_dtype dt, int i, uint32_t salt, int64_t j) {
    float v = rnd((uint32_t)i, salt + (uint32_t)j);
    uint16_t h = dt == DC_F16 ? dc_f32_to_f16(v) : dc_f32_to_bf16(v);
    if (dt == DC_F32) memcpy(out + 4 * j, &v, 4);
    else memcpy(out + 2 * j, &h, 2);
}

// The value stored, decoded here from its bits (IEEE half and bfloat16 by hand).
static double raw_ref(dc_dtype dt, int i, uint32_t salt, int64_t j) {
    float v = rnd((uint32_t)i, salt + (uint32_t)j);
    if (dt == DC_F32) return v;
    uint16_t h = dt == DC_F16 ? dc_f32_to_f16(v) : dc_f32_to_bf16(v);
    if (dt == DC_BF16) {
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double mag = e == 0 ? ldexp(m, -24) : e == 31 ? NAN : ldexp(1024 + m, e - 25);
    return h >> 15 ? -mag : mag;
}

enum { SALT_LAT = 20000, SALT_TEXT = 30000, SHORT = 5 };

// latents_256 [C, H, W] and caption_latents [T, D] as raw bytes, and a
// caption; with `cut` sample SHORT's latents lack their last 2 bytes.
static char *write_mosaic(const char *name, int zstd, dc_dtype lat, dc_dtype text, int cut) {
    dc_mds_spec cols[] = {{"latents_256", "bytes"}, {"caption_latents", "bytes"}, {"caption", "str"}};
    dc_mds_write_opts o = {zstd ? 3 : 0, 900};
    dc_mds_writer *w;
    const char *dir = tmp_path(name);
    if (dc_mds_writer_open(&w, dir, cols, 3, &o)) return NULL;
    for (int i = 0; i < N; i++) {
        uint8_t l[C * H * W * 4], t[T * D * 4];
        for (int j = 0; j < C * H * W; j++) put_raw(l, lat, i, SALT_LAT, j);
        for (int j = 0; j < T * D; j++) put_raw(t, text, i, SALT_TEXT, j);
        size_t nl = (size_t)C * H * W * dc_dtype_size(lat) - (cut && i == SHORT ? 2 : 0);
        dc_mds_value v[3] = {{l, nl, 0, 0, NULL}, {t, (size_t)T * D * dc_dtype_size(text), 0, 0, NULL},
                             {"a dog", 5, 0, 0, NULL}};
        if (dc_mds_write(w, v)) return dc_mds_writer_free(w), NULL;
    }
    return dc_mds_writer_finish(w) ? NULL : strdup(dir);
}

static dc_shards_raw g_raw[3];

static dc_shards_opts mosaic_opts(const char *dir, dc_dtype lat, dc_dtype text) {
    g_raw[0] = (dc_shards_raw){"latents_256", lat, 3, {C, H, W}};
    g_raw[1] = (dc_shards_raw){"caption_latents", text, 2, {T, D}};
    dc_shards_opts o = opts(dir);
    o.latents_column = "latents_256", o.text_column = "caption_latents", o.raw = g_raw, o.nraw = 2;
    return o;
}

// x0 = scale * the stored latent (no draw: any keys give it), the text as
// stored with every position counting, the empty prompt's too.
static uint64_t check_mosaic(const char *dir, dc_dtype lat, dc_dtype text) {
    dc_source s;
    dc_shards_opts o = mosaic_opts(dir, lat, text);
    CHECK(dc_source_shards(&s, &o) == 0, "%s: open: %s", dir, dc_error());
    if (!s.ops) return 0;
    CHECK(s.n == N && s.channels == C && s.height == H && s.width == W && s.text_len == T && s.text_dim == D &&
              !s.flips && s.fingerprint != 0,
          "shape %lld %dx%dx%d text %dx%d flips %d", (long long)s.n, s.channels, s.height, s.width, s.text_len,
          s.text_dim, s.flips);
    check_order(&s, dir, 4);
    float x[C * H * W], again[C * H * W], ctx[T * D];
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        CHECK(s.ops->x0(&s, i, false, 99, (uint32_t)i, 3, x) == 0 && s.ops->x0(&s, i, false, 7, 2, 9, again) == 0,
              "x0 %d: %s", i, dc_error());
        bad += memcmp(x, again, sizeof x) != 0;
        for (int j = 0; j < C * H * W; j++) {
            double want = 0.18215 * raw_ref(lat, i, SALT_LAT, j), e = fabs(x[j] - want) / (fabs(want) + 1e-6);
            if (!(e <= worst)) worst = e;
        }
        int32_t len;
        CHECK(s.ops->cond(&s, i, false, NULL, ctx, &len) == 0, "cond %d: %s", i, dc_error());
        for (int j = 0; j < T * D; j++) bad += !(ctx[j] == raw_ref(text, i, SALT_TEXT, j));
        bad += len != T;
        CHECK(s.ops->cond(&s, i, true, NULL, ctx, &len) == 0, "dropped %d", i);
        bad += memcmp(ctx, g_null, sizeof ctx) != 0 || len != T;
    }
    CHECK(worst < 1e-6, "%s: x0 against scale * the stored latent: worst relative error %g", dir, worst);
    CHECK(bad == 0, "%s: %d values differ (text, token counts, or x0 drawn anew)", dir, bad);
    uint64_t f = s.fingerprint;
    dc_source_close(&s);
    return f;
}

// Opening with o fails with a message holding both words.
static void expect_refused(const dc_shards_opts *o, const char *what, const char *a, const char *b) {
    dc_source s;
    int rc = dc_source_shards(&s, o);
    CHECK(rc != 0 && strstr(dc_error(), a) && strstr(dc_error(), b) && !s.ops, "%s: rc %d, '%s'", what, rc,
          rc ? dc_error() : "");
    if (!rc) dc_source_close(&s);
}

static void check_mosaic_refusals(const char *dir, const char *cut, const char *prepared) {
    dc_shards_opts o = mosaic_opts(dir, DC_F16, DC_F16);
    o.nraw = 1;
    expect_refused(&o, "a bytes column without a shape", "caption_latents", "bytes");
    o = mosaic_opts(dir, DC_F16, DC_F16), g_raw[0].ndim = 2;
    expect_refused(&o, "a latent shape of 2 dimensions", "latents_256", "2 dimensions");
    o = mosaic_opts(dir, DC_F16, DC_F16), o.nraw = 3, g_raw[2] = (dc_shards_raw){"caption", DC_F16, 1, {5}};
    expect_refused(&o, "a shape for a column not read", "caption", "not read");
    o = mosaic_opts(dir, DC_F16, DC_I32);
    expect_refused(&o, "an int32 raw column", "caption_latents", "float16");
    o = mosaic_opts(dir, DC_F16, DC_F16), o.latents_column = "latents_512";
    expect_refused(&o, "a missing column", "latents_512", "latents_256");
    // a shape that does not match the bytes: refused at once (the first sample is read)
    o = mosaic_opts(dir, DC_F16, DC_F16), g_raw[0].shape[2] = W + 1;
    expect_refused(&o, "a shape too large", "sample 0", "column \"latents_256\" holds");
    o = mosaic_opts(dir, DC_F16, DC_F32);
    expect_refused(&o, "float16 text read as float32", "sample 0", "column \"caption_latents\" holds");
    dc_source s;
    float x[C * H * W];
    // one sample short of bytes: that one refused, naming it
    o = mosaic_opts(cut, DC_F16, DC_F16);
    CHECK(dc_source_shards(&s, &o) == 0, "open: %s", dc_error());
    if (s.ops) {
        CHECK(s.ops->x0(&s, SHORT - 1, false, 1, 0, 0, x) == 0, "a whole sample: %s", dc_error());
        CHECK(s.ops->x0(&s, SHORT, false, 1, 0, 0, x) != 0 && strstr(dc_error(), "sample 5") &&
                  strstr(dc_error(), "latents_256"),
              "a short sample: '%s'", dc_error());
        dc_source_close(&s);
    }
    // a shape given for an ndarray column, whose encoding gives it
    o = opts(prepared), o.latents_column = "latents_mean", o.raw = g_raw, o.nraw = 1;
    g_raw[0] = (dc_shards_raw){"latents_mean", DC_F16, 3, {C, H, W}};
    expect_refused(&o, "a shape for an ndarray", "latents_mean", "its own dtype and shape");
}

// prepare's set read with its mean as a single latent: x0 = scale * mean, no
// draw, and a fingerprint of its own.
static void check_mean_as_latent(const char *dir) {
    dc_source s, plain;
    dc_shards_opts o = opts(dir);
    CHECK(dc_source_shards(&plain, &o) == 0, "open: %s", dc_error());
    o.latents_column = "latents_mean";
    CHECK(dc_source_shards(&s, &o) == 0, "open: %s", dc_error());
    if (!s.ops || !plain.ops) return;
    CHECK(s.fingerprint != plain.fingerprint, "a latents column given, the same fingerprint");
    float x[C * H * W];
    int bad = 0;
    for (int i = 0; i < N; i++) {
        CHECK(s.ops->x0(&s, i, false, 5, 1, 2, x) == 0, "x0 %d: %s", i, dc_error());
        for (int j = 0; j < C * H * W; j++)
            bad += !(fabs(x[j] - 0.18215 * dc_f16_to_f32(mean_h(i, j))) <= 1e-7 * (1 + fabs(x[j])));
        int32_t len;
        float ctx[T * D];
        CHECK(s.ops->cond(&s, i, false, NULL, ctx, &len) == 0, "cond");
        bad += len != tokens(i);  // the token counts still count: the text column is prepare's
    }
    CHECK(bad == 0, "%d values of the mean as x0 differ", bad);
    dc_source_close(&s), dc_source_close(&plain);
}

static void check_mosaic_sets(const char *prepared) {
    char *plain = write_mosaic("mosaic", 0, DC_F16, DC_F16, 0), *zst = write_mosaic("mosaic_zstd", 1, DC_BF16, DC_F32, 0),
         *cut = write_mosaic("mosaic_cut", 0, DC_F16, DC_F16, 1);
    CHECK(plain && zst && cut, "writing MosaicML's layout: %s", dc_error());
    if (plain && zst && cut) {
        uint64_t f = check_mosaic(plain, DC_F16, DC_F16);
        check_mosaic(zst, DC_BF16, DC_F32);
        // the same bytes read as another dtype: another fingerprint
        dc_source s;
        dc_shards_opts o = mosaic_opts(plain, DC_BF16, DC_F16);
        CHECK(dc_source_shards(&s, &o) == 0 && s.fingerprint != f, "another dtype, the same fingerprint");
        if (s.ops) dc_source_close(&s);
        check_mosaic_refusals(plain, cut, prepared);
    }
    free(plain), free(zst), free(cut);
}

int main(void) {
    if (tmpdir_make("shards")) return 1;
    for (int j = 0; j < T * D; j++) g_null[j] = rnd(777, (uint32_t)j);
    const char *lat = write_set("latents", 1);
    CHECK(lat != NULL, "writing latents: %s", dc_error());
    if (lat) check_latents(lat);
    char *prepared = lat ? strdup(lat) : NULL;
    if (prepared) check_mean_as_latent(prepared), check_mosaic_sets(prepared);
    free(prepared);
    const char *pix = write_set("pixels", 0);
    CHECK(pix != NULL, "writing pixels: %s", dc_error());
    if (pix) check_pixels(pix);
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
