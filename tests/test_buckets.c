// The aspect-ratio bucket source (train/buckets.h), on bucket data sets
// written here as `diffusion prepare --buckets` writes them (pixels, text
// embeddings, token counts; several shards a bucket), each sample's pixels
// naming its bucket and its place in it:
// - every global batch comes from one bucket, and the source's size of each
//   of its samples is that bucket's, whose pixels it reads;
// - an epoch visits each bucket's whole batches once (count / batch x batch
//   distinct samples), none of a bucket smaller than a batch, and the
//   buckets take turns (the batches are shuffled);
// - the order is a function of (seed, position, batch): a second source
//   repeats it, another seed does not; the next epoch's is another;
// - the source's height and width are the largest bucket's; the
//   conditioning is the sample's; a data set without a whole batch is
//   refused, and so are buckets of different kinds.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/mds.h"
#include "tmpdir.h"
#include "train/buckets.h"

enum { T = 4, D = 2, NB = 4 };
// the buckets: pixels [3, h, w], samples (the last smaller than a batch of 4)
static const int k_h[NB] = {8, 4, 12, 6}, k_w[NB] = {8, 12, 4, 6}, k_n[NB] = {13, 9, 7, 3};

// Bucket k's data set: sample i's pixels all k * 16 + 1 but the second, i;
// its text [T, D] all i / 8 + k; i % T + 1 tokens; shards of about 300 bytes.
static int write_bucket(const char *dir, int k, int channels) {
    char enc[64];
    snprintf(enc, sizeof enc, "ndarray:uint8:%d,%d,%d", channels, k_h[k], k_w[k]);
    const dc_mds_spec cols[] = {{"pixels", enc}, {"text_embeddings", "ndarray:float16:4,2"}, {"text_tokens", "int32"}};
    const dc_mds_write_opts o = {0, 300};
    dc_mds_writer *w;
    DC_TRY(dc_mds_writer_open(&w, dir, cols, 3, &o));
    const int npx = channels * k_h[k] * k_w[k];
    uint8_t *px = malloc((size_t)npx);
    for (int i = 0; i < k_n[k]; i++) {
        memset(px, k * 16 + 1, (size_t)npx);
        px[1] = (uint8_t)i;
        uint16_t text[T * D];
        for (int j = 0; j < T * D; j++) text[j] = dc_f32_to_f16((float)i / 8 + (float)k);
        const int32_t tokens = i % T + 1;
        const dc_mds_value v[] = {{px, (size_t)npx, DC_MDS_U8, 0, NULL},
                                  {text, sizeof text, DC_MDS_F16, 0, NULL},
                                  {&tokens, 4, 0, 0, NULL}};
        if (dc_mds_write(w, v)) return free(px), dc_mds_writer_free(w), -1;
    }
    free(px);
    return dc_mds_writer_finish(w);
}

static float g_null[T * D];

static int open_source(dc_source *s, const char *const *dirs, int n, uint64_t seed) {
    for (int j = 0; j < T * D; j++) g_null[j] = -1.0f;
    const dc_shards_opts o = {.dir = NULL, .seed = seed, .block = 5, .latent_scale = 1, .text_null = g_null,
                              .text_null_len = 2};
    return dc_source_buckets(s, &o, dirs, n);
}

// Sample idx's bucket and place in it, from its pixels.
static void decode(dc_source *s, int64_t idx, int *bucket, int *place, float *x0) {
    CHECK(s->ops->x0(s, idx, false, 1, 0, 0, x0) == 0, "x0 of %lld: %s", (long long)idx, dc_error());
    *bucket = ((int)lroundf((x0[0] + 1) * 127.5f) - 1) / 16;
    *place = (int)lroundf((x0[1] + 1) * 127.5f);
}

static void test_order(const char *const *dirs) {
    dc_source s, again, other;
    if (open_source(&s, dirs, NB, 7) || open_source(&again, dirs, NB, 7) || open_source(&other, dirs, NB, 8)) {
        CHECK(0, "open: %s", dc_error());
        return;
    }
    CHECK(s.n == 13 + 9 + 7 + 3 && s.height == 8 && s.width == 8 && s.channels == 3 && s.ops->size,
          "%lld samples of %dx%dx%d (the largest bucket's: 8x8)", (long long)s.n, s.channels, s.height, s.width);
    enum { B = 4 };
    const int batches = 13 / B + 9 / B + 7 / B;  // the last bucket holds less than a batch
    const int E = batches * B;
    float *x0 = malloc(sizeof(float) * 3 * 12 * 12);
    int one_bucket = 0, right_size = 0, right_pixels = 0, same = 0, differ = 0, turns = 0, fresh = 0;
    int64_t first_epoch[64];
    for (int e = 0; e < 3; e++) {
        bool seen[NB][16] = {{false}};
        int per[NB] = {0}, last = -1, runs = 0;
        for (int j = 0; j < batches; j++) {
            int bk = -1, ok = 1;
            for (int i = 0; i < B; i++) {
                const int64_t g = (int64_t)e * E + j * B + i;
                int64_t idx, idx2, idx3;
                if (s.ops->index(&s, g, B, &idx) || again.ops->index(&again, g, B, &idx2) ||
                    other.ops->index(&other, g, B, &idx3)) {
                    CHECK(0, "index %lld: %s", (long long)g, dc_error());
                    return;
                }
                same += idx == idx2, differ += idx != idx3;
                int k, place, h, w;
                decode(&s, idx, &k, &place, x0);
                s.ops->size(&s, idx, &h, &w);
                right_size += k >= 0 && k < NB && h == k_h[k] && w == k_w[k];
                right_pixels += k >= 0 && k < NB && place < k_n[k];
                if (i == 0) bk = k;
                ok &= k == bk;
                if (k >= 0 && k < NB && place < 16) {
                    fresh += !seen[k][place];
                    seen[k][place] = true, per[k]++;
                }
                if (e == 0) first_epoch[j * B + i] = idx;
                else if (e == 1 && idx != first_epoch[j * B + i]) differ++;
            }
            one_bucket += ok;
            runs += bk != last, last = bk;
        }
        turns += runs > NB - 1;  // more runs of one bucket than buckets: they take turns
        CHECK(per[0] == 12 && per[1] == 8 && per[2] == 4 && per[3] == 0,
              "epoch %d visits %d, %d, %d, %d samples of the buckets (12, 8, 4, 0 expected)", e, per[0], per[1],
              per[2], per[3]);
    }
    const int total = 3 * E;
    CHECK(one_bucket == 3 * batches, "%d of %d global batches from one bucket", one_bucket, 3 * batches);
    CHECK(right_size == total && right_pixels == total, "sizes %d, pixels %d of %d samples their bucket's",
          right_size, right_pixels, total);
    CHECK(fresh == total, "%d of %d samples new within their epoch", fresh, total);
    CHECK(same == total, "a second source repeats %d of %d positions", same, total);
    CHECK(differ > total / 2, "another seed, or the next epoch, changes only %d positions", differ);
    CHECK(turns == 3, "the buckets take turns in %d of 3 epochs", turns);
    // the conditioning is the sample's: its text and token count
    float ctx[T * D];
    int32_t len;
    int64_t idx;
    int k, place;
    CHECK(s.ops->index(&s, 5, B, &idx) == 0, "index");
    decode(&s, idx, &k, &place, x0);
    CHECK(s.ops->cond(&s, idx, false, NULL, ctx, &len) == 0 && fabsf(ctx[3] - ((float)place / 8 + (float)k)) < 1e-3f &&
              len == place % T + 1,
          "sample %lld's text %g and tokens %d, not bucket %d's sample %d's", (long long)idx, ctx[3], len, k, place);
    CHECK(s.ops->cond(&s, idx, true, NULL, ctx, &len) == 0 && ctx[0] == -1.0f && len == 2,
          "a dropped caption is not the empty prompt's");
    // a batch no bucket fills
    CHECK(s.ops->index(&s, 0, 14, &idx) != 0 && strstr(dc_error(), "global batch of 14"),
          "a batch no bucket holds: %s", dc_error());
    free(x0);
    dc_source_close(&s), dc_source_close(&again), dc_source_close(&other);
}

int main(void) {
    if (tmpdir_make("buckets")) return 1;
    char dirs[NB + 1][256];
    const char *names[NB + 1];
    int rc = 0;
    for (int k = 0; k < NB && !rc; k++) {
        snprintf(dirs[k], sizeof dirs[k], "%s", tmp_path(k == 0 ? "8x8" : k == 1 ? "12x4" : k == 2 ? "4x12" : "6x6"));
        names[k] = dirs[k];
        rc = write_bucket(dirs[k], k, 3);
    }
    snprintf(dirs[NB], sizeof dirs[NB], "%s", tmp_path("gray"));  // one channel: not of the same data set
    names[NB] = dirs[NB];
    rc = rc || write_bucket(dirs[NB], 0, 1);
    CHECK(rc == 0, "writing the buckets: %s", dc_error());
    if (!rc) {
        printf("order\n");
        test_order(names);
        dc_source s;
        CHECK(open_source(&s, names, NB + 1, 7) != 0 && strstr(dc_error(), "different kinds"),
              "buckets of different channels: %s", dc_error());
    }
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
