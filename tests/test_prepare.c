// diffusion prepare's library part (pipelines/prepare.h) on a tiny random SD
// model (tools/sd_random) and random pictures:
//   - kohya's bucket resolutions and assignments against a table computed by
//     hand from sd-scripts' make_bucket_resolutions and select_bucket;
//   - every sample's latent moments equal dc_vae_encode's and its text
//     embedding dc_sd_encode_prompts's, each run alone on the picture resized
//     as AUTOMATIC1111's crop mode does, to fp16 (the batch of one against the
//     batches of the run: a last-bit difference of the f32 sum is allowed);
//   - captions, original sizes, token counts, kohya's repeats, an unreadable
//     picture skipped and counted;
//   - a run stopped between batches (by its progress callback) and continued
//     writes the same bytes as one never stopped, with and without buckets;
//   - reading the next batch while one is encoded (opts.overlap) writes the
//     same bytes, stopped and continued too;
//   - the VAE encoder taking a batch's pictures together (opts.vae_batch):
//     every sample again against the components run alone, one at a time;
//   - on a GPU, the CUDA backend's shards against the CPU's: the same samples,
//     captions and sizes, and latents and embeddings within bf16's error, with
//     the pictures encoded one at a time and together.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/mds.h"
#include "io/png.h"
#include "pipelines/prepare.h"
#include "tmpdir.h"

#define VOCAB "data/bpe_simple_vocab_16e6.txt.gz"

static void test_buckets(void) {
    // make_bucket_resolutions((512, 512), 256, 1024, 64), worked by hand: h = min(1024, 262144 // w // 64 * 64)
    static const int want[][2] = {{256, 832}, {256, 896}, {256, 960}, {256, 1024}, {320, 704}, {320, 768},
                                  {384, 640}, {448, 576}, {512, 512}, {576, 448}, {640, 384}, {704, 320},
                                  {768, 320}, {832, 256}, {896, 256}, {960, 256}, {1024, 256}};
    const int nwant = (int)(sizeof want / sizeof want[0]);
    dc_bucket *b;
    int n;
    CHECK(dc_buckets_make(512, 256, 1024, 64, &b, &n) == 0, "buckets: %s", dc_error());
    CHECK(n == nwant, "512: %d buckets, want %d", n, nwant);
    for (int i = 0; i < n && i < nwant; i++)
        CHECK(b[i].width == want[i][0] && b[i].height == want[i][1], "bucket %d: %dx%d, want %dx%d", i, b[i].width,
              b[i].height, want[i][0], want[i][1]);
    // the nearest aspect ratio: 1920/1080 = 1.78 is 0.11 from 640/384 and 0.42 from 704/320;
    // 700/300 = 2.33 is 0.07 from 768/320 = 2.4 and 0.13 from 704/320 = 2.2
    static const int pick[][4] = {{1000, 1000, 512, 512}, {1920, 1080, 640, 384}, {1080, 1920, 384, 640},
                                  {3000, 1000, 832, 256},  {100, 400, 256, 1024},  {1200, 800, 640, 384},
                                  {700, 300, 768, 320},    {5000, 10, 1024, 256}};
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
        int k = dc_bucket_select(b, n, pick[i][0], pick[i][1]);
        CHECK(b[k].width == pick[i][2] && b[k].height == pick[i][3], "%dx%d went to %dx%d, want %dx%d", pick[i][0],
              pick[i][1], b[k].width, b[k].height, pick[i][2], pick[i][3]);
    }
    free(b);
    CHECK(dc_buckets_make(512, 512, 256, 64, &b, &n) != 0, "min side above max side accepted");
}

// A picture of random pixels, w x h.
static void random_png(const char *path, int w, int h, uint64_t seed) {
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) px[i] = (uint8_t)(dc_philox((uint32_t)i, 0, 0, 0, seed).v[0] >> 24);
    if (dc_png_write(path, px, w, h, 3)) printf("FAIL writing %s: %s\n", path, dc_error()), g_fail++;
    free(px);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

// The source: 7 pictures of assorted sizes, one kohya folder with 3 repeats,
// one picture that is no picture.
static void make_source(void) {
    mkdir(tmp_path("src"), 0755), mkdir(tmp_path("src/3_sks cat"), 0755), mkdir(tmp_path("src/more"), 0755);
    static const struct { const char *name; int w, h; const char *caption; } p[] = {
        {"src/a.png", 40, 24, "a photo of a dog"}, {"src/b.png", 24, 48, "an astronaut riding a horse"},
        {"src/c.png", 32, 32, NULL},               {"src/3_sks cat/d.png", 50, 30, NULL},
        {"src/3_sks cat/e.png", 33, 65, "sks cat on a sofa"}, {"src/more/f.png", 64, 20, "a wide field"},
        {"src/more/g.png", 20, 20, "a small square"}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        random_png(tmp_path(p[i].name), p[i].w, p[i].h, 100 + i);
        if (p[i].caption) {
            char cap[64];
            snprintf(cap, sizeof cap, "%.*s.txt", (int)(strlen(p[i].name) - 4), p[i].name);
            write_text(tmp_path(cap), p[i].caption);
        }
    }
    write_text(tmp_path("src/more/broken.png"), "\x89PNG\r\n\x1a\nnot really");
}

static int write_model(const char *argv0, char *model) {
    const char *slash = strrchr(argv0, '/');
    char cmd[1200];
    snprintf(model, 256, "%s", tmp_path("tiny1"));
    snprintf(cmd, sizeof cmd, "'%.*s/../tools/sd_random' --config tiny1 --layout diffusers --seed 5 --out '%s' > /dev/null",
             slash ? (int)(slash - argv0) : 1, slash ? argv0 : ".", model);
    return system(cmd) == 0 ? 0 : (printf("FAIL %s\n", cmd), -1);
}

static bool close_f16(uint16_t a, uint16_t b) {  // equal, or neighbours
    if (a == b) return true;
    float x = dc_f16_to_f32(a), y = dc_f16_to_f32(b);
    return isfinite(x) && isfinite(y) && fabsf(x - y) <= 1e-3f * fmaxf(1.0f, fabsf(y));
}

// Checks every sample of the data set in dir against the components run alone.
static void check_samples(dc_prepare_models *m, const dc_picture_set *set, const char *dir, int size,
                          int64_t want_samples) {
    dc_mds_reader *r;
    if (dc_mds_open(&r, dir)) {
        CHECK(0, "%s: %s", dir, dc_error());
        return;
    }
    CHECK(dc_mds_samples(r) == want_samples, "%s: %lld samples, want %lld", dir, (long long)dc_mds_samples(r),
          (long long)want_samples);
    const int cap = dc_mds_find(r, "caption"), mean = dc_mds_find(r, "latents_mean"),
              logvar = dc_mds_find(r, "latents_logvar"), emb = dc_mds_find(r, "text_embeddings"),
              tok = dc_mds_find(r, "text_tokens"), ow = dc_mds_find(r, "original_width"),
              oh = dc_mds_find(r, "original_height");
    CHECK(cap >= 0 && mean >= 0 && logvar >= 0 && emb >= 0 && tok >= 0 && ow >= 0 && oh >= 0, "columns missing");
    dc_backend *be = m->be;
    const int f = dc_vae_factor(&m->sd.vae->cfg), C = m->sd.vae->cfg.latent_channels, T = 77,
              D = m->sd.text->cfg.width;
    const int64_t lat = (int64_t)C * (size / f) * (size / f), pix = 3ll * size * size;
    float *img = malloc(sizeof(float) * (size_t)pix), *hm = malloc(sizeof(float) * (size_t)lat),
          *hv = malloc(sizeof(float) * (size_t)lat), *hc = malloc(sizeof(float) * (size_t)T * D);
    dc_buf bi, bm, bv, bc;
    dc_buf_alloc(be, &bi, DC_F32, (size_t)pix, "x"), dc_buf_alloc(be, &bm, DC_F32, (size_t)lat, "m");
    dc_buf_alloc(be, &bv, DC_F32, (size_t)lat, "v"), dc_buf_alloc(be, &bc, DC_F32, (size_t)T * D, "c");
    dc_vae_reserve(m->sd.vae, 1, size, size);
    dc_mds_sample s = {0};
    int64_t k = 0;  // the sample
    for (int64_t e = 0; e < set->n && k < dc_mds_samples(r); e++) {
        dc_image pic, fit;
        if (dc_picture_set_read(set, e, &pic, 0, false)) {
            dc_error_clear();
            continue;  // the unreadable one: no sample
        }
        dc_image_fit(&pic, size, size, DC_RESIZE_CROP, &fit);
        dc_image_to_chw(&fit, img);
        be->upload(be, bi.p, img, sizeof(float) * (size_t)pix);
        int rc = dc_vae_encode(m->sd.vae, bm, bv, bi, 1, size, size);
        const char *caption = set->e[e].caption;
        if (!rc) rc = dc_sd_encode_prompts(&m->sd, &caption, 1, bc);
        be->download(be, hm, bm.p, sizeof(float) * (size_t)lat), be->download(be, hv, bv.p, sizeof(float) * (size_t)lat);
        be->download(be, hc, bc.p, sizeof(float) * (size_t)T * D);
        CHECK(rc == 0, "encoding alone: %s", dc_error());
        int32_t ids[77], count;
        dc_clip_tokenize(&m->sd.tok, caption, ids, &count);
        for (int c = 0; c < set->e[e].repeats; c++, k++) {
            if (dc_mds_read(r, k, &s)) {
                CHECK(0, "sample %lld: %s", (long long)k, dc_error());
                break;
            }
            CHECK(s.len[cap] == strlen(caption) && !memcmp(s.data[cap], caption, s.len[cap]), "sample %lld: caption",
                  (long long)k);
            int32_t w, h, t;
            memcpy(&w, s.data[ow], 4), memcpy(&h, s.data[oh], 4), memcpy(&t, s.data[tok], 4);
            CHECK(w == pic.width && h == pic.height, "sample %lld: original size %dx%d, want %dx%d", (long long)k, w, h,
                  pic.width, pic.height);
            CHECK(t == count + 2, "sample %lld: %d tokens, want %d", (long long)k, t, count + 2);
            int bad = 0;
            for (int64_t i = 0; i < lat; i++) {
                uint16_t a, b;
                memcpy(&a, s.data[mean] + 2 * i, 2), memcpy(&b, s.data[logvar] + 2 * i, 2);
                bad += !close_f16(a, dc_f32_to_f16(hm[i])) + !close_f16(b, dc_f32_to_f16(fminf(fmaxf(hv[i], -30), 20)));
            }
            for (int64_t i = 0; i < (int64_t)T * D; i++) {
                uint16_t a;
                memcpy(&a, s.data[emb] + 2 * i, 2);
                bad += !close_f16(a, dc_f32_to_f16(hc[i]));
            }
            CHECK(bad == 0, "sample %lld: %d values differ from the components run alone", (long long)k, bad);
        }
        dc_image_free(&pic), dc_image_free(&fit);
    }
    CHECK(k == dc_mds_samples(r), "%lld samples checked of %lld", (long long)k, (long long)dc_mds_samples(r));
    dc_mds_sample_free(&s);
    dc_mds_close(r);
    be->free(be, bi.p), be->free(be, bm.p), be->free(be, bv.p), be->free(be, bc.p);
    free(img), free(hm), free(hv), free(hc);
}

static int g_stop_after, g_batches;
static int stop_after(void *ctx, int64_t done, int64_t total, int64_t written) {
    (void)ctx, (void)done, (void)total, (void)written;
    return ++g_batches == g_stop_after ? dc_fail("stopped for the test") : 0;
}

static bool same_tree(const char *a, const char *b) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "diff -r '%s' '%s' > /dev/null", a, b);
    return system(cmd) == 0;
}

// Stops after each possible batch in turn, continues, and compares the whole folder.
static void test_resume(dc_prepare_models *m, const dc_picture_set *set, dc_prepare_opts o, const char *whole) {
    dc_prepare_stats st;
    char dir[256];
    for (int stop = 1; stop <= 6; stop++) {
        snprintf(dir, sizeof dir, "%s", tmp_path("stopped"));
        o.overwrite = true;
        g_batches = 0, g_stop_after = stop;
        int rc = dc_prepare_run(m, set, dir, &o, stop_after, NULL, &st);
        if (rc == 0) break;  // fewer batches than that
        dc_error_clear();
        o.overwrite = false;
        g_stop_after = 0;
        rc = dc_prepare_run(m, set, dir, &o, stop_after, NULL, &st);
        CHECK(rc == 0, "continuing after batch %d: %s", stop, dc_error());
        CHECK(st.resumed > 0 || stop == 1, "stopped after batch %d: nothing found written (%lld)", stop,
              (long long)st.resumed);
        CHECK(same_tree(dir, whole), "stopped after batch %d (%s) and continued: not the bytes of one run",
              stop, o.buckets ? "buckets" : "one size");
    }
}

// Every fp16 array column of the two data sets: the normalised error
// |a - b| / |b| of each sample's array.
static void compare_sets(const char *a, const char *b, double tol) {
    dc_mds_reader *ra, *rb;
    if (dc_mds_open(&ra, a) || dc_mds_open(&rb, b)) {
        CHECK(0, "%s", dc_error());
        return;
    }
    CHECK(dc_mds_samples(ra) == dc_mds_samples(rb), "%lld and %lld samples", (long long)dc_mds_samples(ra),
          (long long)dc_mds_samples(rb));
    dc_mds_sample sa = {0}, sb = {0};
    double worst = 0;
    for (int64_t i = 0; i < dc_mds_samples(ra) && i < dc_mds_samples(rb); i++) {
        if (dc_mds_read(ra, i, &sa) || dc_mds_read(rb, i, &sb)) {
            CHECK(0, "%s", dc_error());
            break;
        }
        for (int c = 0; c < dc_mds_columns(ra); c++) {
            const dc_mds_column *col = dc_mds_column_at(ra, c);
            if (col->kind != DC_MDS_NDARRAY || col->dtype != DC_MDS_F16) {
                CHECK(sa.len[c] == sb.len[c] && !memcmp(sa.data[c], sb.data[c], sa.len[c]), "sample %lld: %s differs",
                      (long long)i, col->name);
                continue;
            }
            double num = 0, den = 0;
            for (size_t k = 0; k < sa.len[c] / 2; k++) {
                uint16_t x, y;
                memcpy(&x, sa.data[c] + 2 * k, 2), memcpy(&y, sb.data[c] + 2 * k, 2);
                double d = (double)dc_f16_to_f32(x) - dc_f16_to_f32(y);
                num += d * d, den += (double)dc_f16_to_f32(y) * dc_f16_to_f32(y);
            }
            double e = sqrt(num / (den > 0 ? den : 1));
            if (!(e <= worst)) worst = e;  // NaN sticks
        }
    }
    CHECK(worst <= tol, "CUDA against CPU: normalised error %.3g (tolerance %.3g)", worst, tol);
    printf("CUDA against CPU: worst normalised error %.3g\n", worst);
    dc_mds_sample_free(&sa), dc_mds_sample_free(&sb);
    dc_mds_close(ra), dc_mds_close(rb);
}

int main(int argc, char **argv) {
    (void)argc;
    struct stat sst;
    if (stat(VOCAB, &sst) != 0) return printf("FAIL %s is absent (run from the repository's root)\n", VOCAB), 1;
    test_buckets();
    if (tmpdir_make("prepare")) return 1;
    char model[256];
    if (write_model(argv[0], model)) return tmpdir_remove(), 1;
    make_source();
    dc_picture_set set;
    CHECK(dc_picture_set_scan(&set, tmp_path("src"), NULL) == 0, "scan: %s", dc_error());
    CHECK(set.n == 8 && set.uncaptioned == 2, "%lld pictures, %lld without captions; want 8 and 2",
          (long long)set.n, (long long)set.uncaptioned);
    // d.png in "3_sks cat" takes the class tokens as caption, and 3 repeats
    int64_t samples = 0;
    for (int64_t i = 0; i < set.n; i++) {
        if (strstr(set.e[i].path, "d.png"))
            CHECK(!strcmp(set.e[i].caption, "sks cat") && set.e[i].repeats == 3, "kohya: caption '%s', %d repeats",
                  set.e[i].caption, set.e[i].repeats);
        samples += strstr(set.e[i].path, "broken") ? 0 : set.e[i].repeats;
    }
    dc_backend *be = dc_backend_cpu_create();
    dc_prepare_models m;
    dc_prepare_opts o = {.model = model, .size = 16, .batch = 3, .min_side = 64, .max_side = 192,
                         .shard_bytes = 40000};
    CHECK(dc_prepare_models_load(&m, &o, be) == 0, "load: %s", dc_error());
    dc_prepare_stats st;
    CHECK(dc_prepare_run(&m, &set, tmp_path("whole"), &o, NULL, NULL, &st) == 0, "run: %s", dc_error());
    CHECK(st.samples == samples && st.corrupt == 1 && st.resumed == 0 && st.pictures == 8,
          "stats: %lld samples (want %lld), %lld corrupt (want 1)", (long long)st.samples, (long long)samples,
          (long long)st.corrupt);
    check_samples(&m, &set, tmp_path("whole"), 16, samples);
    struct stat s2;
    CHECK(stat(tmp_path("whole/shard.00002.mds"), &s2) == 0, "shard_bytes: fewer than 3 shards");
    CHECK(stat(tmp_path("whole/prepare.progress.json"), &s2) != 0, "the progress file is left behind");
    CHECK(dc_prepare_run(&m, &set, tmp_path("whole"), &o, NULL, NULL, &st) != 0 && strstr(dc_error(), "--overwrite"),
          "a second run into a finished folder is not refused");
    dc_error_clear();
    test_resume(&m, &set, o, tmp_path("whole"));
    // the next batch read on a thread of its own while one is encoded: the same bytes, stopped or not
    dc_prepare_opts oo = o;
    oo.overlap = true;
    CHECK(dc_prepare_run(&m, &set, tmp_path("overlap"), &oo, NULL, NULL, &st) == 0 &&
              same_tree(tmp_path("overlap"), tmp_path("whole")),
          "reading the next batch while one is encoded: not the bytes of one batch at a time (%s)", dc_error());
    test_resume(&m, &set, oo, tmp_path("whole"));
    // the VAE encoder on a batch's pictures together: each latent as dc_vae_encode's of its picture alone
    dc_prepare_opts ov = o;
    ov.vae_batch = true;
    CHECK(dc_prepare_run(&m, &set, tmp_path("together"), &ov, NULL, NULL, &st) == 0, "pictures together: %s",
          dc_error());
    check_samples(&m, &set, tmp_path("together"), 16, samples);
    // the same with buckets: 64 px sides at an area of 128^2
    dc_prepare_opts ob = o;
    ob.buckets = true, ob.size = 128;
    CHECK(dc_prepare_run(&m, &set, tmp_path("buckets"), &ob, NULL, NULL, &st) == 0, "buckets: %s", dc_error());
    CHECK(st.samples == samples && st.nbuckets == 3, "buckets: %lld samples in %d buckets (want %lld in 3)",
          (long long)st.samples, st.nbuckets, (long long)samples);
    // Buckets of area 128^2, 64-px steps, sides 64..192: 128x128; w = 64: h = min(192, 16384 // 64 // 64 * 64)
    // = 192, so 64x192 and 192x64; w = 192: h = 64, the same pair. Ratios 1/3, 1, 3: a 40x24 (1.67) and
    // d 50x30 (x3) go to 128x128 (0.67 away, 3 is 1.33), with c and g (squares); b 24x48 (0.5) and e 33x65
    // (x3) to 64x192 (0.17 away, 1 is 0.5); f 64x20 (3.2) to 192x64.
    struct { const char *folder; int64_t n; } want[] = {{"buckets/128x128", 1 + 3 + 1 + 1}, {"buckets/192x64", 1},
                                                        {"buckets/64x192", 1 + 3}};
    for (int i = 0; i < 3; i++) {
        dc_mds_reader *r;
        int rc = dc_mds_open(&r, tmp_path(want[i].folder));
        CHECK(rc == 0 && dc_mds_samples(r) == want[i].n, "%s: %lld samples, want %lld", want[i].folder,
              rc ? -1LL : (long long)dc_mds_samples(r), (long long)want[i].n);
        if (!rc) dc_mds_close(r);
    }
    test_resume(&m, &set, ob, tmp_path("buckets"));
    dc_backend *gpu = dc_backend_cuda_create(false);
    if (!gpu) {
        dc_error_clear();
        printf("SKIP (no GPU) prepare on the CUDA backend against the CPU's\n");
    } else {
        dc_prepare_models mg;
        CHECK(dc_prepare_models_load(&mg, &o, gpu) == 0, "load on CUDA: %s", dc_error());
        CHECK(dc_prepare_run(&mg, &set, tmp_path("cuda"), &o, NULL, NULL, &st) == 0, "run on CUDA: %s", dc_error());
        // bf16 compute: 8 bits of mantissa through a few layers
        compare_sets(tmp_path("cuda"), tmp_path("whole"), 3e-2);
        // as the command runs on a GPU: pictures together, the next batch read meanwhile
        dc_prepare_opts og = o;
        og.vae_batch = og.overlap = true;
        CHECK(dc_prepare_run(&mg, &set, tmp_path("cuda_together"), &og, NULL, NULL, &st) == 0,
              "run on CUDA, pictures together: %s", dc_error());
        compare_sets(tmp_path("cuda_together"), tmp_path("whole"), 3e-2);
        dc_prepare_models_close(&mg);
        dc_backend_destroy(gpu);
    }
    dc_prepare_models_close(&m);
    dc_picture_set_free(&set);
    dc_backend_destroy(be);
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
