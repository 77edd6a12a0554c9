// The streaming data source and its elastic order: each epoch's order is a
// permutation of all samples, fixed by (seed, epoch) and different across
// epochs and seeds; 1, 2, 3, 4 and 6 ranks see, step by step, the same global
// batches in the same order; resuming at any position gives the rest of the
// epoch exactly; blocks mix shards (measured, and against no in-block
// shuffle); the first position's distribution matches the closed form
// enumerated in double; tiny data sets (one shard, fewer samples than a
// block) work; columns are read through the names the caller gives.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/mds.h"
#include "train/stream.h"

#include "check.h"
#include "tmpdir.h"

static const int64_t g_counts[] = {10, 7, 0, 13, 10, 1, 9, 25, 3, 12};
enum { NSH = sizeof g_counts / sizeof g_counts[0], N = 90 };

// The shard of global sample i (data set order).
static int shard_of(const int64_t *counts, int nsh, int64_t i) {
    for (int k = 0; k < nsh; k++) {
        if (i < counts[k]) return k;
        i -= counts[k];
    }
    return -1;
}

static void epoch_order(dc_stream_order *o, int64_t epoch, int64_t *out) {
    for (int64_t p = 0; p < o->n; p++) out[p] = dc_stream_order_at(o, epoch, p);
}

static void check_permutations(void) {
    dc_stream_order o, o2, o3;
    CHECK(dc_stream_order_init(&o, g_counts, NSH, 1234, 16) == 0, "%s", dc_error());
    CHECK(dc_stream_order_init(&o2, g_counts, NSH, 1234, 16) == 0, "%s", dc_error());
    CHECK(dc_stream_order_init(&o3, g_counts, NSH, 1235, 16) == 0, "%s", dc_error());
    CHECK(o.n == N, "%lld samples", (long long)o.n);
    int64_t a[N], b[N], prev[N];
    for (int64_t e = 0; e < 6; e++) {
        epoch_order(&o, e, a);
        int seen[N] = {0}, ok = 1;
        for (int p = 0; p < N; p++) ok &= a[p] >= 0 && a[p] < N && !seen[a[p]]++;
        CHECK(ok, "epoch %lld is not a permutation", (long long)e);
        epoch_order(&o2, e, b);  // a fresh object, same (seed, epoch)
        CHECK(!memcmp(a, b, sizeof a), "epoch %lld differs between two orders of one seed", (long long)e);
        if (e) CHECK(memcmp(a, prev, sizeof a), "epochs %lld and %lld are the same", (long long)e - 1, (long long)e);
        memcpy(prev, a, sizeof a);
        epoch_order(&o3, e, b);
        CHECK(memcmp(a, b, sizeof a), "seeds 1234 and 1235 give epoch %lld the same order", (long long)e);
    }
    // asked out of order (epochs and blocks interleaved), the answers are the same
    epoch_order(&o, 2, a);
    int same = 1;
    for (int p = N - 1; p >= 0; p--) {
        dc_stream_order_at(&o2, 5, p);
        same &= dc_stream_order_at(&o2, 2, p) == a[p];
    }
    CHECK(same, "the order depends on the order it was asked in");
    CHECK(dc_stream_order_at(&o, 0, N) == -1 && dc_stream_order_at(&o, 0, -1) == -1, "out of range");
    dc_stream_order_free(&o);
    dc_stream_order_free(&o2);
    dc_stream_order_free(&o3);
}

// Consecutive positions come from several shards when blocks span several
// shards; with a block of one sample (no shuffle inside blocks) they come
// from one or two, so the measure can tell the two apart.
static double distinct_per_window(int64_t block) {
    int64_t counts[20];
    for (int k = 0; k < 20; k++) counts[k] = 10;
    dc_stream_order o;
    if (dc_stream_order_init(&o, counts, 20, 77, block) != 0) return -1;
    double total = 0;
    int windows = 0;
    for (int64_t e = 0; e < 4; e++)
        for (int64_t p = 0; p + 8 <= o.n; p += 8, windows++) {
            int seen[20] = {0}, d = 0;
            for (int64_t q = p; q < p + 8; q++) d += !seen[shard_of(counts, 20, dc_stream_order_at(&o, e, q))]++;
            total += d;
        }
    dc_stream_order_free(&o);
    return total / windows;
}

static void check_mixing(void) {
    double mixed = distinct_per_window(64), plain = distinct_per_window(1);
    printf("shards per 8 consecutive samples: %.2f with blocks of 64, %.2f without shuffle in blocks\n", mixed, plain);
    CHECK(mixed >= 4.0, "blocks of 64 over shards of 10: %.2f shards per 8 consecutive samples", mixed);
    CHECK(plain <= 2.0, "blocks of 1: %.2f shards per 8 consecutive samples", plain);
    // every block of 64 holds samples of at least 6 shards (64 / 10 spanned)
    int64_t counts[20];
    for (int k = 0; k < 20; k++) counts[k] = 10;
    dc_stream_order o;
    CHECK(dc_stream_order_init(&o, counts, 20, 5, 64) == 0, "%s", dc_error());
    int worst = 20;
    for (int64_t b = 0; b < 3; b++) {
        int seen[20] = {0}, d = 0;
        for (int64_t p = b * 64; p < (b + 1) * 64; p++) d += !seen[shard_of(counts, 20, dc_stream_order_at(&o, 1, p))]++;
        if (d < worst) worst = d;
    }
    CHECK(worst >= 7, "a block of 64 holds samples of only %d shards", worst);
    dc_stream_order_free(&o);
}

// Shards of 2, 3 and 1 samples, blocks of 4: the chance that sample s comes
// first, enumerated over the 3! equally likely shard orders (in a block every
// sample is equally likely first), against 30000 seeds.
static void check_first_distribution(void) {
    const int64_t counts[3] = {2, 3, 1};
    const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    double want[6] = {0};
    for (int k = 0; k < 6; k++) {
        int64_t seq[6], n = 0;
        for (int j = 0; j < 3; j++) {
            int s = orders[k][j];
            int64_t first = s == 0 ? 0 : s == 1 ? 2 : 5;
            for (int64_t i = 0; i < counts[s]; i++) seq[n++] = first + i;
        }
        for (int p = 0; p < 4; p++) want[seq[p]] += 1.0 / 6 / 4;
    }
    enum { SEEDS = 30000 };
    double got[6] = {0};
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        dc_stream_order o;
        if (dc_stream_order_init(&o, counts, 3, seed, 4) != 0) break;
        got[dc_stream_order_at(&o, 3, 0)] += 1.0 / SEEDS;
        dc_stream_order_free(&o);
    }
    for (int s = 0; s < 6; s++) {
        double sigma = sqrt(want[s] * (1 - want[s]) / SEEDS);
        CHECK(fabs(got[s] - want[s]) <= 5 * sigma + 1e-12, "sample %d first: %.4f, closed form %.4f", s, got[s], want[s]);
    }
}

// ---- the data source over real shards

static const char *write_set(const char *name, int nsh, int per_shard) {
    const char *dir = tmp_path(name);
    dc_mds_spec cols[] = {{"lat", "ndarray:float16:2,2"}, {"caption", "str"}, {"id", "int"}};
    // a size limit that puts per_shard samples in each shard: the header,
    // then 4 offset + 4 caption size + 8 lat + 5 caption + 8 id bytes a sample
    dc_mds_writer *w;
    dc_mds_write_opts o = {0, 0};
    size_t config = 0;
    {  // the config's length, from a first shard written and measured
        if (dc_mds_writer_open(&w, tmp_path("probe"), cols, 3, NULL) != 0) return NULL;
        uint16_t h[4] = {0};
        int64_t id = 0;
        dc_mds_value v[3] = {{h, 8, 0, 0, NULL}, {"x0000", 5, 0, 0, NULL}, {&id, 8, 0, 0, NULL}};
        dc_mds_write(w, v);
        dc_mds_writer_finish(w);
        char p[300];
        snprintf(p, sizeof p, "%s/shard.00000.mds", tmp_path("probe"));
        FILE *f = fopen(p, "rb");
        fseek(f, 0, SEEK_END);
        config = (size_t)ftell(f) - 12 - 25;
        fclose(f);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -r '%s'", tmp_path("probe"));
        if (system(cmd) != 0) return NULL;
    }
    o.size_limit = (int64_t)(8 + config + (size_t)per_shard * 29);
    if (dc_mds_writer_open(&w, dir, cols, 3, &o) != 0) return NULL;
    for (int i = 0; i < nsh * per_shard; i++) {
        uint16_t h[4];
        for (int j = 0; j < 4; j++) h[j] = dc_f32_to_f16((float)i + 0.25f * (float)j);
        char cap[16];
        snprintf(cap, sizeof cap, "x%04d", i);
        int64_t id = i;
        dc_mds_value v[3] = {{h, 8, 0, 0, NULL}, {cap, 5, 0, 0, NULL}, {&id, 8, 0, 0, NULL}};
        if (dc_mds_write(w, v) != 0) return dc_mds_writer_free(w), NULL;
    }
    return dc_mds_writer_finish(w) == 0 ? dir : NULL;
}

static void check_stream(void) {
    const char *dir = write_set("set", 5, 10);
    CHECK(dir != NULL, "writing the data set: %s", dc_error());
    if (!dir) return;
    const char *names[] = {"id", "lat", "caption"};
    dc_stream s;
    if (dc_stream_open(&s, dir, names, 3, 42, 16) != 0) {
        CHECK(0, "open: %s", dc_error());
        return;
    }
    CHECK(dc_mds_shards(s.mds) == 5 && s.order.n == 50, "%d shards, %lld samples", dc_mds_shards(s.mds),
          (long long)s.order.n);
    // one rank, 4 epochs of 4 steps of 12 (2 samples left each epoch)
    enum { G = 12, STEPS = 16 };
    int64_t ref[STEPS][G];
    for (int t = 0; t < STEPS; t++) CHECK(dc_stream_next(&s, G, 0, 1, ref[t]) == 0, "%s", dc_error());
    CHECK(s.epoch == 3 && s.pos == 48, "after 16 steps: epoch %lld pos %lld", (long long)s.epoch, (long long)s.pos);
    // ranks 2, 3, 4, 6: the slices joined in rank order are the one-rank batch
    const int rank_counts[] = {2, 3, 4, 6};
    for (int rc = 0; rc < 4; rc++) {
        int R = rank_counts[rc], same = 1;
        dc_stream_seek(&s, 0, 0);
        for (int t = 0; t < STEPS; t++) {
            int64_t got[G];
            int64_t e = s.epoch, p = s.pos;
            for (int r = 0; r < R; r++) {
                s.epoch = e, s.pos = p;  // each rank steps from the same position
                if (dc_stream_next(&s, G, r, R, got + r * (G / R)) != 0) same = 0;
            }
            same &= !memcmp(got, ref[t], sizeof got);
        }
        CHECK(same, "%d ranks see other global batches than one rank", R);
    }
    // resuming at any position of epoch 1 (a multiple of the batch or not) gives the rest of the epoch
    int64_t full[50];
    epoch_order(&s.order, 1, full);
    int resumed = 1;
    for (int64_t p = 0; p <= 50 - 5; p += 3) {
        dc_stream r2;
        if (dc_stream_open(&r2, dir, names, 3, 42, 16) != 0 || dc_stream_seek(&r2, 1, p) != 0) {
            resumed = 0;
            break;
        }
        for (int64_t q = p; q + 5 <= 50; q += 5) {
            int64_t got[5];
            resumed &= dc_stream_next(&r2, 5, 0, 1, got) == 0 && r2.epoch == 1 && !memcmp(got, full + q, sizeof got);
        }
        dc_stream_close(&r2);
    }
    CHECK(resumed, "a resumed stream does not continue the epoch");
    // the columns by the caller's names
    int ok = 1;
    for (int64_t i = 0; i < 50; i += 7) {
        float lat[4];
        dc_mds_array id, cap;
        ok &= dc_stream_read(&s, i) == 0 && dc_stream_column(&s, 0, &id) == 0 && dc_stream_f32(&s, 1, lat, 4) == 0 &&
              dc_stream_column(&s, 2, &cap) == 0;
        int64_t v;
        memcpy(&v, id.values, 8);
        char want[16];
        snprintf(want, sizeof want, "x%04d", (int)i);
        ok &= v == i && cap.count == 5 && !memcmp(cap.values, want, 5);
        for (int j = 0; j < 4; j++) ok &= lat[j] == (float)i + 0.25f * (float)j;  // exact in fp16 below 512
    }
    CHECK(ok, "columns read through the stream differ");
    float four[4];
    CHECK(dc_stream_f32(&s, 1, four, 3) != 0 && strstr(dc_error(), "\"lat\" holds 4 values"), "%s", dc_error());
    CHECK(dc_stream_next(&s, 51, 0, 1, full) != 0, "a batch larger than the data set");
    CHECK(dc_stream_next(&s, 10, 0, 3, full) != 0, "a batch that 3 ranks cannot split");
    dc_stream_close(&s);
    const char *missing[] = {"latents_mean"};
    CHECK(dc_stream_open(&s, dir, missing, 1, 42, 16) != 0 && strstr(dc_error(), "no column \"latents_mean\"") &&
              strstr(dc_error(), "\"caption\""),
          "a missing column: %s", dc_error());
}

// One shard of 3 samples, the default block (far larger): still a shuffle of 3.
static void check_tiny(void) {
    const char *dir = write_set("tiny", 1, 3);
    CHECK(dir != NULL, "writing the tiny set: %s", dc_error());
    if (!dir) return;
    dc_stream s;
    if (dc_stream_open(&s, dir, NULL, 0, 7, DC_STREAM_BLOCK) != 0) {
        CHECK(0, "open: %s", dc_error());
        return;
    }
    CHECK(s.order.n == 3 && s.order.block == 3, "n %lld block %lld", (long long)s.order.n, (long long)s.order.block);
    int differ = 0;
    int64_t first[3];
    for (int e = 0; e < 8; e++) {
        int64_t b[3];
        CHECK(dc_stream_next(&s, 3, 0, 1, b) == 0 && s.epoch == e, "epoch %d: %s", e, dc_error());
        CHECK(b[0] + b[1] + b[2] == 3 && b[0] != b[1] && b[1] != b[2] && b[0] != b[2], "epoch %d not a permutation", e);
        if (e == 0) memcpy(first, b, sizeof b);
        else differ |= memcmp(first, b, sizeof b) != 0;
        int64_t r[3];
        s.pos = 0;
        for (int k = 0; k < 3; k++) dc_stream_next(&s, 3, k, 3, r + k), s.pos = 0;
        CHECK(!memcmp(r, b, sizeof r), "3 ranks of one sample each differ from one rank");
        s.pos = 3;
    }
    CHECK(differ, "8 epochs of 3 samples all in one order");
    dc_stream_close(&s);
}

int main(void) {
    if (tmpdir_make("stream") != 0) return 1;
    check_permutations();
    check_mixing();
    check_first_distribution();
    check_stream();
    check_tiny();
    tmpdir_remove();
    printf("test_stream: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
