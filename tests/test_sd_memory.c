// The SD pipeline short of device memory (pipelines/sd.c, plan_for): the
// UNet's and the VAE's activations stay planned side by side while they fit;
// when the next model's plan cannot be had, the other model's activations are
// freed and the plan tried again. Run on the CPU backend with every
// allocation counted here and a cap on the bytes held, on a tiny SD 1.x
// pipeline that tools/sd_random writes (beside this program's folder: the
// golden files' text encoder has too few tokens for the real vocabulary):
// - without a cap, both plans are held at the peak;
// - with a cap below that peak (but above what one model's plan needs), the
//   pictures still come, bit for bit the same, within the cap;
// - with a cap below what the weights and one plan need, generation fails
//   with a message naming the allocation, and nothing crashes.
// And a pipe kept open across calls: a second call of the same shape uses
// the first one's device buffers (it allocates and frees nothing, so a step
// graph recorded by the first stays valid) and makes the same picture; a new
// seed changes the picture and nothing else; a new batch size gets new
// buffers; closing frees everything.
// Reads the shipped vocabulary, data/bpe_simple_vocab_16e6.txt.gz.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "count_alloc.h"
#include "models/unet.h"
#include "pipelines/sd.h"

#define VOCAB "data/bpe_simple_vocab_16e6.txt.gz"
#define SIZE 32  // pixels a side that tiny1's VAE and UNet divide

static char g_model[300];

// ---- one picture ---------------------------------------------------------------------
typedef struct {
    float *img;
    int n;
} picture;

static int keep(void *ctx, int index, const float *image) {
    picture *pic = ctx;
    (void)index;
    memcpy(pic->img, image, sizeof(float) * 3 * SIZE * SIZE);
    pic->n++;
    return 0;
}

// Keeps picture 0 of a batch, counting all.
static int keep_first(void *ctx, int index, const float *image) {
    picture *pic = ctx;
    if (index == 0) memcpy(pic->img, image, sizeof(float) * 3 * SIZE * SIZE);
    pic->n++;
    return 0;
}

// Opens the pipeline on `be` and makes one guided picture into pic; 0 or -1.
// *unet_b, *vae_b: the two models' planned activation bytes.
static int generate(dc_backend *be, picture *pic, int64_t *unet_b, int64_t *vae_b) {
    dc_sd_pipe p;
    memset(&p, 0, sizeof p);
    dc_sd_open_opts oo = {g_model, VOCAB, NULL, 0, -1, false, NULL};
    int rc = dc_sd_pipe_open(&p, be, &oo);
    if (rc == 0) {
        dc_sd_gen g = {"a red cube on a table", "blurry", 1, 1, SIZE, SIZE, dc_ksampler_opts_default(), NULL, 0};
        g.ks.steps = 2, g.ks.kind = DC_KS_EULER_A, g.ks.cfg_scale = 5.0f, g.ks.seed = 7;
        rc = dc_sd_generate(&p, &g, keep, pic, NULL, NULL);
        if (unet_b) *unet_b = (int64_t)dc_unet_activation_bytes(p.unet, 2);
        if (vae_b) *vae_b = (int64_t)dc_vae_activation_bytes(p.vae);
    }
    dc_sd_pipe_close(&p);
    return rc;
}

// Makes `count` guided pictures (batches of `batch`) on an open pipe, the
// first into pic; 0 or -1.
static int generate_on(dc_sd_pipe *p, picture *pic, uint64_t seed, int count, int batch) {
    dc_sd_gen g = {"a red cube on a table", "blurry", count, batch, SIZE, SIZE, dc_ksampler_opts_default(), NULL, 0};
    g.ks.steps = 2, g.ks.kind = DC_KS_EULER_A, g.ks.cfg_scale = 5.0f, g.ks.seed = seed;
    pic->n = 0;
    return dc_sd_generate(p, &g, keep_first, pic, NULL, NULL);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

// 4. The pipe's state across calls (see the top of the file).
static void test_kept_state(counter *k, const float *first) {
    const size_t n = 3 * SIZE * SIZE;
    picture a = {malloc(sizeof(float) * n), 0}, b = {malloc(sizeof(float) * n), 0};
    dc_sd_pipe p;
    memset(&p, 0, sizeof p);
    dc_sd_open_opts oo = {g_model, VOCAB, NULL, 0, -1, false, NULL};
    counter_reset(k, 0);
    int rc = dc_sd_pipe_open(&p, &k->be, &oo);
    if (!rc) rc = generate_on(&p, &a, 7, 1, 1);
    CHECK(rc == 0 && a.n == 1, "first call on an open pipe: %s", rc ? dc_error() : "no picture");
    CHECK(rc == 0 && max_diff(a.img, first, n) == 0, "the open pipe's first picture differs from a fresh pipe's");
    const int64_t allocs = k->allocs, frees = k->frees;
    if (!rc) rc = generate_on(&p, &b, 7, 1, 1);
    CHECK(rc == 0 && b.n == 1, "second call: %s", rc ? dc_error() : "no picture");
    CHECK(k->allocs == allocs && k->frees == frees, "the second call of the same shape allocated %lld and freed "
          "%lld device buffers (none expected)", (long long)(k->allocs - allocs), (long long)(k->frees - frees));
    CHECK(rc == 0 && max_diff(a.img, b.img, n) == 0, "the second call's picture differs from the first's by %g",
          max_diff(a.img, b.img, n));
    if (!rc) rc = generate_on(&p, &b, 8, 1, 1);
    CHECK(rc == 0 && k->allocs == allocs && k->frees == frees, "a new seed: %s, %lld buffers allocated",
          rc ? dc_error() : "ran", (long long)(k->allocs - allocs));
    CHECK(rc == 0 && max_diff(a.img, b.img, n) > 0, "seeds 7 and 8 made the same picture");
    if (!rc) rc = generate_on(&p, &b, 7, 2, 2);
    CHECK(rc == 0 && b.n == 2 && k->allocs > allocs, "a batch of 2 after batches of 1: %s, %lld buffers allocated",
          rc ? dc_error() : "ran", (long long)(k->allocs - allocs));
    CHECK(rc == 0 && max_diff(a.img, b.img, n) < 1e-4, "seed 7's first picture in a batch of 2 differs by %g",
          max_diff(a.img, b.img, n));
    dc_sd_pipe_close(&p);
    CHECK(k->now == 0, "after closing the kept pipe, %lld bytes are still held", (long long)k->now);
    printf("kept pipe: later calls of one shape allocate nothing and repeat their pictures\n");
    free(a.img), free(b.img);
}

// Writes tiny1 with tools/sd_random (BUILD/tools beside BUILD/tests) into a
// new folder under /tmp; 0 or -1.
static int write_model(const char *argv0, char *dir, size_t size) {
    const char *slash = strrchr(argv0, '/');
    int n = slash ? (int)(slash - argv0) : 1;
    char tool[400], cmd[1000];
    snprintf(tool, sizeof tool, "%.*s/../tools/sd_random", n, slash ? argv0 : ".");
    snprintf(dir, size, "/tmp/test_sd_memory.XXXXXX");
    if (!mkdtemp(dir)) return printf("FAIL mkdtemp\n"), -1;
    snprintf(g_model, sizeof g_model, "%s/tiny1", dir);
    snprintf(cmd, sizeof cmd, "'%s' --config tiny1 --layout diffusers --seed 3 --out '%s' > /dev/null", tool, g_model);
    if (system(cmd) != 0) return printf("FAIL %s\n", cmd), -1;
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    struct stat st;
    if (stat(VOCAB, &st) != 0) {
        printf("FAIL %s is absent (it ships with the repository; run from its root)\n", VOCAB);
        return 1;
    }
    char dir[64], rm[128];
    if (write_model(argv[0], dir, sizeof dir)) return 1;
    static counter k;  // large: not on the stack
    if (counter_init(&k)) return printf("FAIL no CPU backend: %s\n", dc_error()), 1;
    const size_t n = 3 * SIZE * SIZE;
    picture a = {malloc(sizeof(float) * n), 0}, b = {malloc(sizeof(float) * n), 0};

    // 1. No cap: both plans are held at the peak.
    int64_t unet_b = 0, vae_b = 0;
    counter_reset(&k, 0);
    int rc = generate(&k.be, &a, &unet_b, &vae_b);
    CHECK(rc == 0 && a.n == 1, "uncapped generation: %s", rc ? dc_error() : "no picture");
    const int64_t peak = k.peak, small = unet_b < vae_b ? unet_b : vae_b;
    CHECK(unet_b > 0 && vae_b > 0, "planned activations: UNet %lld, VAE %lld bytes", (long long)unet_b,
          (long long)vae_b);
    CHECK(k.now == 0, "after closing, %lld bytes are still held", (long long)k.now);
    bool finite = true;
    for (size_t i = 0; i < n; i++) finite = finite && isfinite(a.img[i]);
    CHECK(finite, "the uncapped picture holds NaN or Inf");
    printf("uncapped: peak %lld bytes, UNet activations %lld, VAE activations %lld\n", (long long)peak,
           (long long)unet_b, (long long)vae_b);

    // 2. A cap below that peak by half the smaller plan: the models cannot both
    // keep theirs, so the pipeline must free one for the other.
    counter_reset(&k, peak - small / 2);
    rc = generate(&k.be, &b, NULL, NULL);
    CHECK(rc == 0 && b.n == 1, "generation within %lld bytes (peak %lld less half of %lld): %s", (long long)k.cap,
          (long long)peak, (long long)small, rc ? dc_error() : "no picture");
    CHECK(k.peak <= k.cap, "capped peak %lld above the cap %lld", (long long)k.peak, (long long)k.cap);
    double diff = 0;
    for (size_t i = 0; i < n && rc == 0; i++) diff = fmax(diff, fabs((double)a.img[i] - b.img[i]));
    CHECK(rc == 0 && diff == 0, "capped picture differs from the uncapped one by %g", diff);
    printf("capped at %lld: peak %lld, pictures differ by %g\n", (long long)k.cap, (long long)k.peak, diff);

    // 3. A cap too small for even one plan beside the weights: a clear error.
    counter_reset(&k, peak - small - (unet_b > vae_b ? unet_b : vae_b) / 2);
    dc_error_clear();
    rc = generate(&k.be, &b, NULL, NULL);
    CHECK(rc != 0 && strstr(dc_error(), "test cap"), "generation within %lld bytes: rc %d, message '%s'",
          (long long)k.cap, rc, dc_error());
    CHECK(k.now == 0, "after the failed run, %lld bytes are still held", (long long)k.now);
    printf("too small (%lld): %s\n", (long long)k.cap, dc_error());

    test_kept_state(&k, a.img);

    free(a.img), free(b.img);
    counter_free(&k);
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0) printf("could not remove %s\n", dir);
    printf("%d of %d checks passed\n", g_pass, g_pass + g_fail);
    return g_fail ? 1 : 0;
}
