// The Stable Diffusion UNet against diffusers.
//
// - Golden outputs (tests/golden/sd, made by tools/sd_golden.py with the real
//   diffusers UNet2DConditionModel in float64): tiny UNets with SD's topology,
//   sd1 (1x1-conv projections, 2 layers per block) and sd2 (linear
//   projections, per-block heads, 1 layer per block), loaded from the
//   diffusers folder (BF16 + config.json) and from the original single file
//   (F16, config inferred from the shapes, heads given), run on the CPU.
// - Registration: every name and shape of SD 1.5's and 2.1's UNet in
//   tests/golden/sd/sd_manifest.json (diffusers' own module tree), in order.
// - Config inference on real SD shapes (heads rule), the original-name map on
//   known single-file keys, refusals (missing or mis-shaped tensor, bad
//   config keys, latent sizes), metadata round trip, seeded init, backward.
//
// Usage: test_unet [backend]   (cpu by default; "cuda" and "cuda-fp32" on a GPU)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "buf_up.h"
#include "check.h"
#include "core/error.h"
#include "diffusion/ksampler.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/unet.h"
#include "nerr.h"
#include "nn/weights.h"

#define GOLD "tests/golden/sd"
#define MANIFEST "tests/golden/sd/sd_manifest.json"

// Tolerance on max|a - b| / max|b| of the UNet output against diffusers in
// float64, the weights and inputs being exact in float32. Our float32 forward
// (~150 ops: convs summing up to 864 products, GroupNorm/LayerNorm
// statistics, softmax, and the timestep frequencies in float64 where
// diffusers uses float32) lands at 7e-7 (sd1) and 1e-6 (sd2) on the CPU and
// 9e-7 / 1.2e-6 on "cuda-fp32"; the bound allows ~20x that for another
// summation order. A wrong index, a missing term or a swapped weight gives
// errors of order 1e-2..1.
#define TOL_OUT 2e-5
// With BF16 weights and activations ("cuda"): every stored value is rounded
// to 8 bits of mantissa (relative 2^-9 = 2e-3) across ~150 ops; an H100
// lands at 1.2e-2 (sd1) and 1.7e-2 (sd2).
#define TOL_BF16 5e-2
static double g_tol;

static dc_backend *g_be;

// n host floats into a new backend buffer of dtype dt (F32, or the backend's
// compute dtype for what the model reads).
static dc_buf buf_up(const float *h, int64_t n, dc_dtype dt) { return test_buf_up(g_be, h, n, dt); }
static void buf_down(dc_buf b, float *h, int64_t n) {
    if (b.dt == DC_F32) return g_be->download(g_be, h, b.p, (size_t)n * 4);
    dc_buf f = {g_be->alloc(g_be, (size_t)n * 4), DC_F32};
    g_be->cast(g_be, f, b, n);
    g_be->download(g_be, h, f.p, (size_t)n * 4);
    g_be->free(g_be, f.p);
}


// A backend buffer of dtype dt holding the tensor `name` of f (p NULL if absent).
static dc_buf upload_tensor(const dc_st_file *f, const char *name, dc_dtype dt) {
    const dc_st_tensor *t = dc_st_find(f, name);
    if (!t) return dc_buf_none();
    float *h = malloc((size_t)t->numel * sizeof *h);
    if (!h || dc_st_read_f32(f, t, h)) return free(h), dc_buf_none();
    dc_buf d = buf_up(h, t->numel, dt);
    free(h);
    return d;
}

// Runs the model on io's unet.x, unet.t, unet.context and returns the
// normalised error against unet.out (INFINITY on any failure, printed).
// x and out in dtype io_dt (the compute dtype, or F32 as a sampler hands them).
static double run_golden_io(dc_model *m, const char *io_path, const char *what, dc_dtype io_dt) {
    dc_st_file io;
    if (dc_st_open(&io, io_path)) return printf("  %s: %s\n", what, dc_error()), INFINITY;
    int64_t nout = 0;
    const dc_dtype dt = io_dt;
    dc_buf x = upload_tensor(&io, "unet.x", dt), t = upload_tensor(&io, "unet.t", DC_F32);
    dc_buf ctx = upload_tensor(&io, "unet.context", g_be->compute);
    const dc_st_tensor *ot = dc_st_find(&io, "unet.out");
    double err = INFINITY;
    if (!x.p || !t.p || !ctx.p || !ot) {
        printf("  %s: %s lacks unet.x/t/context/out\n", what, io_path);
        goto done;
    }
    nout = ot->numel;
    const int B = (int)dc_st_find(&io, "unet.x")->shape[0];
    const dc_st_tensor *ct = dc_st_find(&io, "unet.context");
    dc_cond cond = {.ctx = ctx, .len = (int)ct->shape[1], .dim = (int)ct->shape[2]};
    float *want = malloc((size_t)nout * sizeof *want), *got = malloc((size_t)nout * sizeof *got);
    dc_buf out = {g_be->alloc(g_be, (size_t)nout * dc_dtype_size(dt)), dt};
    if (dc_st_read_f32(&io, ot, want) || dc_model_reserve(m, B) || dc_model_forward(m, out, x, t, &cond, B)) {
        printf("  %s: %s\n", what, dc_error());
    } else {
        buf_down(out, got, nout);
        err = nerr(got, want, nout);
    }
    free(want), free(got);
    g_be->free(g_be, out.p);
done:
    if (x.p) g_be->free(g_be, x.p);
    if (t.p) g_be->free(g_be, t.p);
    if (ctx.p) g_be->free(g_be, ctx.p);
    dc_st_close(&io);
    return err;
}

static bool same_config(const dc_unet_config *a, const dc_unet_config *b, bool heads) {
    if (a->in_channels != b->in_channels || a->out_channels != b->out_channels || a->nblocks != b->nblocks ||
        a->layers != b->layers || a->ctx_dim != b->ctx_dim || a->linear_proj != b->linear_proj ||
        a->groups != b->groups || a->eps != b->eps)
        return false;
    for (int i = 0; i < a->nblocks; i++)
        if (a->ch[i] != b->ch[i] || a->attn[i] != b->attn[i] || (heads && a->heads[i] != b->heads[i])) return false;
    return true;
}

// ---- golden files ---------------------------------------------------------------------------

static double run_golden(dc_model *m, const char *io_path, const char *what) {
    double e = run_golden_io(m, io_path, what, g_be->compute);
    if (g_be->compute != DC_F32) {  // a sampler's F32 latents in and out
        double e32 = run_golden_io(m, io_path, what, DC_F32);
        printf("  %s with F32 x and out: error %.2e\n", what, e32);
        if (e32 > e || e32 != e32) e = e32;
    }
    return e;
}

static int eval_unet(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_model_forward(ctx, out, x, t, cond, B);
}
static int prepare_unet(void *ctx, const dc_cond *cond, int B) { return dc_unet_prepare_text(ctx, cond, B); }

// A recorded sampler runs again (a second picture): its graph is replayed
// from the first step and gives the same latents; once a device buffer has
// been freed the graph is no longer valid, is recorded afresh, and still
// gives them.
static int test_graph_kept(dc_sampler *ks, dc_buf x, const dc_cond *cond, const uint32_t *idx, dc_model *m,
                           const float *want, int64_t n, const char *set) {
    float *got = malloc(sizeof(float) * n);
    void *g = ks->graph;
    int rc = 0;
    for (int run = 0; run < 2 && !rc; run++) {
        if (run == 1) {  // a buffer freed: any graph may point at it
            g_be->free(g_be, g_be->alloc(g_be, 4096));
            if (g) CHECK(!g_be->graph_valid(g_be, g), "%s: a graph stays valid after a buffer was freed", set);
        }
        for (int64_t i = 0; i < n; i++) got[i] = NAN;
        rc = dc_sampler_run(ks, x, cond, idx, 2, eval_unet, prepare_unet, m, NULL, NULL);
        if (rc) break;
        buf_down(x, got, n);
        const double e = nerr(got, want, n);  // as below: only a nondeterministic kernel choice may differ
        CHECK(e <= 1e-6, "%s: run %d of a recorded sampler differs from its first by %.3e", set, run + 2, e);
        if (run == 0 && g) CHECK(ks->graph == g, "%s: the second run recorded its graph again", set);
        if (run == 0) printf("  %s: a second run of the sampler: the same latents%s\n", set,
                             g ? ", its graph replayed from the first step" : "");
    }
    free(got);
    return rc;
}

// The text's keys and values prepared ahead (dc_unet_prepare_text) give the
// forward the transformers' own products give; new text written into the same
// buffer and prepared again gives that text's forward, not the old one's; once
// forgotten (cond NULL), new text in that buffer is read afresh.
static void test_prepared_text(dc_model *m, const dc_unet_config *c, const char *set) {
    enum { B = 2, L = 5 };
    const dc_unet *u = dc_unet_of(m);
    const int D = c->ctx_dim, C = c->in_channels;
    const int64_t n = (int64_t)B * C * u->lh * u->lw, nc = (int64_t)B * L * D;
    const size_t cbytes = (size_t)nc * dc_dtype_size(g_be->compute);
    float *hx = malloc(sizeof(float) * n), *hc = malloc(sizeof(float) * nc), *want = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n), ht[B] = {981.0f, 7.0f};
    uint64_t st = 0xc0ffee;
#define NEXT() ((float)((st = st * 6364136223846793005ULL + 1) >> 40) / 16777216.0f)  // [0, 1)
    for (int64_t i = 0; i < n; i++) hx[i] = 2.0f * NEXT() - 1.0f;
    dc_buf x = buf_up(hx, n, DC_F32), t = buf_up(ht, B, DC_F32), out = {g_be->alloc(g_be, sizeof(float) * n), DC_F32};
    dc_buf ctx = {g_be->alloc(g_be, cbytes), g_be->compute};  // where the prepared text lives
    int rc = dc_model_reserve(m, B);
    for (int text = 1; text <= 3 && !rc; text++) {
        for (int64_t i = 0; i < nc; i++) hc[i] = NEXT() - 0.5f;
        dc_buf other = buf_up(hc, nc, g_be->compute);  // the same text in a buffer never prepared
        g_be->copy(g_be, ctx.p, other.p, cbytes);       // new text into the prepared buffer
        dc_cond cp = {.ctx = ctx, .len = L, .dim = D}, co = {.ctx = other, .len = L, .dim = D};
        rc = dc_model_forward(m, out, x, t, &co, B);
        if (!rc) buf_down(out, want, n);
        if (!rc) rc = dc_unet_prepare_text(m, text < 3 ? &cp : NULL, B);
        if (!rc) rc = dc_model_forward(m, out, x, t, &cp, B);
        if (!rc) buf_down(out, got, n);
        if (!rc) {
            const double e = nerr(got, want, n);
            const char *how = text < 3 ? "prepared keys and values" : "after forgetting the prepared ones";
            CHECK(e <= 1e-6, "%s: text %d, %s: differs from the transformers' own products by %.3e", set, text, how,
                  e);
            printf("  %s: text %d, %s: error %.2e against the transformers' own products\n", set, text, how, e);
        }
        g_be->free(g_be, other.p);
    }
#undef NEXT
    CHECK(rc == 0, "%s: prepared text: %s", set, rc ? dc_error() : "");
    g_be->free(g_be, x.p), g_be->free(g_be, t.p), g_be->free(g_be, out.p), g_be->free(g_be, ctx.p);
    free(hx), free(hc), free(want), free(got);
}

// A batch whose halves share x and t (a guided step's, dc_cond's pairs):
// computing what precedes the cross-attention once for both halves gives the
// forward of the whole batch, each half with its own text. Were the shared
// part not copied to the second half, that half would read stale state.
static void test_paired_rows(dc_model *m, const dc_unet_config *c, const char *set) {
    enum { B = 4, L = 5 };
    const dc_unet *u = dc_unet_of(m);
    const int D = c->ctx_dim, C = c->in_channels;
    const int64_t n = (int64_t)B * C * u->lh * u->lw, nc = (int64_t)B * L * D;
    float *hx = malloc(sizeof(float) * n), *hc = malloc(sizeof(float) * nc), *want = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n), ht[B] = {981.0f, 7.0f, 981.0f, 7.0f};
    uint64_t st = 0xfeed;
#define NEXT() ((float)((st = st * 6364136223846793005ULL + 1) >> 40) / 16777216.0f)  // [0, 1)
    for (int64_t i = 0; i < n / 2; i++) hx[i] = hx[i + n / 2] = 2.0f * NEXT() - 1.0f;
    for (int64_t i = 0; i < nc; i++) hc[i] = NEXT() - 0.5f;  // four texts
#undef NEXT
    dc_buf x = buf_up(hx, n, DC_F32), t = buf_up(ht, B, DC_F32), out = {g_be->alloc(g_be, sizeof(float) * n), DC_F32};
    dc_buf ctx = buf_up(hc, nc, g_be->compute);
    dc_cond whole = {.ctx = ctx, .len = L, .dim = D}, paired = whole;
    paired.pairs = B / 2;
    // other values first, so every buffer the paired call should fill holds
    // something else; then the paired call, then the whole batch's
    for (int64_t i = 0; i < n; i++) got[i] = -hx[i];
    dc_buf y = buf_up(got, n, DC_F32);
    int rc = dc_model_reserve(m, B);
    if (!rc) rc = dc_model_forward(m, out, y, t, &whole, B);
    if (!rc) rc = dc_model_forward(m, out, x, t, &paired, B);
    if (!rc) buf_down(out, got, n);
    if (!rc) rc = dc_model_forward(m, out, x, t, &whole, B);
    if (!rc) buf_down(out, want, n);
    CHECK(rc == 0, "%s: paired rows: %s", set, rc ? dc_error() : "");
    if (!rc) {
        // the same ops on the same values, some at half the batch: rounding
        // alone may differ (a kernel chosen by the batch's size)
        const double tol = g_be->compute == DC_F32 ? 1e-5 : 1e-2, e = nerr(got, want, n);
        const double halves = nerr(want + n / 2, want, n / 2);  // the texts differ, so must the halves
        CHECK(e <= tol, "%s: paired rows differ from the whole batch by %.3e", set, e);
        CHECK(halves > 10 * tol, "%s: the halves' outputs agree (%.3e): the texts were not read", set, halves);
        printf("  %s: halves sharing x and t, the shared layers run once: error %.2e (halves apart by %.2e)\n",
               set, e, halves);
    }
    g_be->free(g_be, x.p), g_be->free(g_be, y.p), g_be->free(g_be, t.p), g_be->free(g_be, out.p);
    g_be->free(g_be, ctx.p);
    free(hx), free(hc), free(want), free(got);
}

// Guided sampling whose model calls replay a recorded graph (as txt2img runs
// them) gives what calling the model op by op gives. On a backend without
// graphs both runs are direct (the CPU); a GPU is where this checks capture:
// a model op that uploads, syncs or reads a pointer at capture time would
// make the replays differ or fail.
static void test_recorded_steps(dc_model *m, const dc_unet_config *c, const char *set) {
    enum { B = 2, L = 7, H = 16, W = 16, STEPS = 5 };
    const int D = c->ctx_dim, C = c->in_channels;
    const int64_t n = (int64_t)B * C * H * W;
    float *ctx = malloc(sizeof(float) * B * L * D), *nul = malloc(sizeof(float) * L * D);
    float *r[2] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
    uint64_t st = 0x5eed;
    for (int i = 0; i < B * L * D; i++) ctx[i] = (float)((st = st * 6364136223846793005ULL + 1) >> 40) / 16777216.0f - 0.5f;
    for (int i = 0; i < L * D; i++) nul[i] = (float)((st = st * 6364136223846793005ULL + 1) >> 40) / 16777216.0f - 0.5f;
    dc_buf dctx = buf_up(ctx, (int64_t)B * L * D, g_be->compute), dnul = buf_up(nul, (int64_t)L * D, g_be->compute);
    dc_buf x = {g_be->alloc(g_be, sizeof(float) * n), DC_F32};
    const uint32_t idx[B] = {3, 11};
    int rc = dc_model_reserve(m, 2 * B);
    for (int k = 0; k < 2 && !rc; k++) {
        dc_ksampler_opts o = dc_ksampler_opts_default();
        o.kind = DC_KS_DPMPP_2M, o.karras = true, o.steps = STEPS, o.cfg_scale = 5.0f, o.seed = 42;
        o.ctx_len = L, o.ctx_dim = D, o.null_ctx = dnul, o.graph = k == 1;
        dc_sampler ks;
        rc = dc_ksampler_init(&ks, g_be, &o, C, H, W, B);
        dc_cond cond = {.ctx = dctx, .len = L, .dim = D};
        if (!rc) rc = dc_sampler_run(&ks, x, &cond, idx, B, eval_unet, k == 1 ? prepare_unet : NULL, m, NULL, NULL);
        if (!rc) buf_down(x, r[k], n);
        if (!rc && k == 1) rc = test_graph_kept(&ks, x, &cond, idx, m, r[1], n, set);
        if (!rc) dc_sampler_free(&ks);
    }
    CHECK(rc == 0, "%s: sampling: %s", set, rc ? dc_error() : "");
    if (!rc) {
        double e = nerr(r[1], r[0], n);
        bool same = memcmp(r[0], r[1], sizeof(float) * n) == 0;
        printf("  %s: %d guided steps, recorded%s vs direct: error %.2e%s\n", set, STEPS,
               g_be->graph_capture ? "" : " (no graphs here: both direct)", e, same ? " (bit-identical)" : "");
        // the same kernels on the same inputs: only a nondeterministic kernel choice may differ
        CHECK(e <= 1e-6, "%s: recorded steps differ from direct ones by %.3e", set, e);
    }
    g_be->free(g_be, dctx.p), g_be->free(g_be, dnul.p), g_be->free(g_be, x.p);
    free(ctx), free(nul), free(r[0]), free(r[1]);
}

static void test_golden_diffusers(const char *set) {
    char cfg_path[256], w_path[256], io_path[256];
    snprintf(cfg_path, sizeof cfg_path, GOLD "/%s/diffusers/unet/config.json", set);
    snprintf(w_path, sizeof w_path, GOLD "/%s/diffusers/unet/diffusion_pytorch_model.safetensors", set);
    snprintf(io_path, sizeof io_path, GOLD "/%s/io.safetensors", set);
    dc_unet_config c;
    CHECK(dc_unet_config_from_json_file(&c, cfg_path) == 0, "%s: %s", cfg_path, dc_error());
    dc_st_file f;
    if (dc_st_open(&f, w_path)) {
        printf("  %s: no diffusers weights (%s): the single file covers it\n", set, dc_error());
        return;
    }
    dc_weights w = {.files = &f, .nfiles = 1, .prefix = ""};
    // the shapes alone give the same config (but the heads: see the single-file test)
    dc_unet_config inf;
    CHECK(dc_unet_config_infer(&inf, &w, DC_NAMES_DIFFUSERS) == 0, "infer %s: %s", w_path, dc_error());
    CHECK(same_config(&inf, &c, false), "%s: config inferred from the shapes differs from config.json", set);
    dc_model *m = NULL;
    CHECK(dc_unet_new(&c, g_be, dc_weights_dtype(&w), 16, 16, &m) == 0, "new: %s", dc_error());
    if (!m) return dc_st_close(&f);
    CHECK(dc_unet_load(m, &w, DC_NAMES_DIFFUSERS) == 0, "load %s: %s", w_path, dc_error());
    double e = run_golden(m, io_path, set);
    printf("  %s diffusers (BF16 weights): error %.2e\n", set, e);
    CHECK(e < g_tol, "%s diffusers: error %.3e", set, e);
    test_recorded_steps(m, &c, set);
    test_prepared_text(m, &c, set);
    test_paired_rows(m, &c, set);
    dc_model_free(m);
    dc_st_close(&f);
}

static void test_golden_single(const char *set) {
    char cfg_path[256], w_path[256], io_path[256];
    snprintf(cfg_path, sizeof cfg_path, GOLD "/%s/diffusers/unet/config.json", set);
    snprintf(w_path, sizeof w_path, GOLD "/%s/single.safetensors", set);
    snprintf(io_path, sizeof io_path, GOLD "/%s/io.safetensors", set);
    dc_unet_config want, c;
    CHECK(dc_unet_config_from_json_file(&want, cfg_path) == 0, "%s: %s", cfg_path, dc_error());
    dc_st_file f;
    if (dc_st_open(&f, w_path)) {
        CHECK(0, "%s", dc_error());
        return;
    }
    dc_weights w = {.files = &f, .nfiles = 1, .prefix = "model.diffusion_model."};
    CHECK(dc_unet_config_infer(&c, &w, DC_NAMES_ORIGINAL) == 0, "infer %s: %s", w_path, dc_error());
    CHECK(same_config(&c, &want, false), "%s: config inferred from the single file differs from config.json", set);
    // cross-attention width 128 follows neither SD rule and 32 channels do not
    // split into heads of 64: inference leaves the heads to the caller
    CHECK(dc_unet_config_validate(&c) != 0 && strstr(dc_error(), "head"), "%s: unknown heads not refused: %s",
          set, dc_error());
    memcpy(c.heads, want.heads, sizeof c.heads);
    dc_model *m = NULL;
    CHECK(dc_unet_new(&c, g_be, dc_weights_dtype(&w), 16, 16, &m) == 0, "new: %s", dc_error());
    if (!m) return dc_st_close(&f);
    CHECK(dc_unet_load(m, &w, DC_NAMES_ORIGINAL) == 0, "load %s: %s", w_path, dc_error());
    double e = run_golden(m, io_path, set);
    printf("  %s single file (F16 weights, original names): error %.2e\n", set, e);
    CHECK(e < g_tol, "%s single: error %.3e", set, e);

    // the same weights with one head count wrong must miss the golden output
    // (so the heads really are used as the number of heads)
    dc_unet_config bad = c;
    for (int i = 0; i < bad.nblocks; i++) bad.heads[i] = bad.heads[i] == 1 ? 2 : 1;
    dc_model *mb = NULL;
    if (dc_unet_new(&bad, g_be, dc_weights_dtype(&w), 16, 16, &mb) == 0 &&
        dc_unet_load(mb, &w, DC_NAMES_ORIGINAL) == 0) {
        double eb = run_golden(mb, io_path, set);
        printf("  %s with wrong head counts: error %.2e\n", set, eb);
        CHECK(eb > g_tol, "%s: wrong head counts still match (error %.2e)", set, eb);
    } else {
        CHECK(0, "%s: %s", set, dc_error());
    }
    dc_model_free(mb);

    // another latent size runs after set_size and reserve (no NaN), and
    // sizes the down path cannot halve are refused
    CHECK(dc_unet_set_size(m, 12, 12) != 0, "latent 12x12 (not a multiple of 8) accepted");
    CHECK(dc_unet_set_size(m, 8, 24) == 0, "set_size 8x24: %s", dc_error());
    CHECK(m->info.height == 8 && m->info.width == 24, "info not updated");
    {
        const int B = 1, n = 4 * 8 * 24;
        float *hx = malloc(n * sizeof *hx), *ho = malloc(n * sizeof *ho), ht = 500;
        float *hc = malloc((size_t)77 * c.ctx_dim * sizeof *hc);
        for (int i = 0; i < n; i++) hx[i] = sinf(0.37f * i);
        for (int i = 0; i < 77 * c.ctx_dim; i++) hc[i] = cosf(0.11f * i);
        const dc_dtype cd = g_be->compute;
        dc_buf dx = buf_up(hx, n, cd), dt = buf_up(&ht, 1, DC_F32), dc = buf_up(hc, 77 * c.ctx_dim, cd);
        dc_buf dout = {g_be->alloc(g_be, (size_t)n * dc_dtype_size(cd)), cd};
        dc_cond cond = {.ctx = dc, .len = 77, .dim = c.ctx_dim};
        CHECK(dc_model_forward(m, dout, dx, dt, &cond, B) != 0, "forward ran without a reserve after set_size");
        CHECK(dc_model_reserve(m, 1) == 0, "reserve: %s", dc_error());
        int rc = dc_model_forward(m, dout, dx, dt, &cond, B);
        CHECK(rc == 0, "forward 8x24: %s", dc_error());
        buf_down(dout, ho, n);
        bool finite = true, nonzero = false;
        for (int i = 0; i < n; i++) finite &= isfinite(ho[i]) != 0, nonzero |= ho[i] != 0;
        CHECK(rc == 0 && finite && nonzero, "8x24 output not finite and non-zero");
        // refusals of bad conditioning
        dc_cond wide = cond;
        wide.dim = c.ctx_dim + 1;
        CHECK(dc_model_forward(m, dout, dx, dt, &wide, B) != 0 &&
                  strstr(dc_error(), "wide"), "text of the wrong width accepted");
        dc_cond none = {0};
        CHECK(dc_model_forward(m, dout, dx, dt, &none, B) != 0,
              "forward without text accepted");
        CHECK(dc_model_forward(m, dout, dx, dt, &cond, 2) != 0,
              "batch above the reserve accepted");
        g_be->free(g_be, dx.p), g_be->free(g_be, dout.p), g_be->free(g_be, dt.p), g_be->free(g_be, dc.p);
        free(hx), free(ho), free(hc);
    }
    CHECK(dc_model_backward(m, dc_buf_none(), 1) != 0 && strstr(dc_error(), "created for training"),
          "an inference model's backward did not refuse: %s", dc_error());
    dc_model_free(m);
    dc_st_close(&f);
}

// A copy of file f (tensors under prefix) with tensor `drop` left out, or
// `reshape` given another shape of the same size, parsed from memory.
static int altered_copy(const dc_st_file *f, const char *drop, const char *reshape, dc_st_file *out) {
    dc_st_entry *e = calloc((size_t)f->count, sizeof *e);
    int n = 0;
    for (int i = 0; i < f->count; i++) {
        const dc_st_tensor *t = &f->tensors[i];
        if (drop && strcmp(t->name, drop) == 0) continue;
        e[n] = (dc_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = f->data + t->begin};
        memcpy(e[n].shape, t->shape, sizeof t->shape);
        if (reshape && strcmp(t->name, reshape) == 0) {  // [a, b, ...] -> [a * b, ...]
            e[n].shape[0] *= e[n].shape[1];
            memmove(&e[n].shape[1], &e[n].shape[2], (size_t)(t->ndim - 2) * sizeof e[n].shape[0]);
            e[n].ndim--;
        }
        n++;
    }
    uint8_t *bytes;
    size_t len;
    int rc = dc_st_serialize(e, n, NULL, NULL, 0, &bytes, &len);
    free(e);
    if (rc) return -1;
    rc = dc_st_parse(out, bytes, len, "altered.safetensors");
    free(bytes);
    return rc;
}

static void test_refusals(void) {
    dc_unet_config c;
    dc_st_file f, g;
    if (dc_unet_config_from_json_file(&c, GOLD "/sd1/diffusers/unet/config.json") ||
        dc_st_open(&f, GOLD "/sd1/diffusers/unet/diffusion_pytorch_model.safetensors")) {
        CHECK(0, "%s", dc_error());
        return;
    }
    dc_model *m = NULL;
    CHECK(dc_unet_new(&c, g_be, DC_F32, 16, 16, &m) == 0, "new: %s", dc_error());
    if (!m) return dc_st_close(&f);
    const char *drop = "up_blocks.2.attentions.1.transformer_blocks.0.attn2.to_k.weight";
    if (altered_copy(&f, drop, NULL, &g) == 0) {
        dc_weights w = {.files = &g, .nfiles = 1, .prefix = ""};
        CHECK(dc_unet_load(m, &w, DC_NAMES_DIFFUSERS) != 0 && strstr(dc_error(), drop),
              "missing %s: '%s'", drop, dc_error());
        dc_st_close(&g);
    }
    const char *bent = "mid_block.resnets.1.conv2.weight";
    if (altered_copy(&f, NULL, bent, &g) == 0) {
        dc_weights w = {.files = &g, .nfiles = 1, .prefix = ""};
        CHECK(dc_unet_load(m, &w, DC_NAMES_DIFFUSERS) != 0 && strstr(dc_error(), bent),
              "mis-shaped %s: '%s'", bent, dc_error());
        dc_st_close(&g);
    }
    // original names in a diffusers file: the first missing tensor is named
    dc_weights w = {.files = &f, .nfiles = 1, .prefix = ""};
    CHECK(dc_unet_load(m, &w, DC_NAMES_ORIGINAL) != 0 && strstr(dc_error(), "input_blocks.0.0.weight"),
          "original names in a diffusers file: '%s'", dc_error());
    dc_model_free(m);
    dc_st_close(&f);

    // inference from a file without a UNet names the tensor it looked for
    dc_unet_config inf;
    if (dc_st_open(&f, GOLD "/sd1/single.safetensors") == 0) {
        dc_weights vae = {.files = &f, .nfiles = 1, .prefix = "first_stage_model."};
        CHECK(dc_unet_config_infer(&inf, &vae, DC_NAMES_ORIGINAL) != 0 &&
                  strstr(dc_error(), "first_stage_model.input_blocks.0.0.weight (conv_in.weight)"),
              "inference without a UNet: '%s'", dc_error());
        dc_st_close(&f);
    }

    // config.json keys this engine does not build, and inconsistent ones
    static const char *const bad[][2] = {
        {"{\"class_embed_type\": \"timestep\"}", "class_embed_type"},
        {"{\"transformer_layers_per_block\": 2}", "transformer_layers_per_block"},
        {"{\"resnet_time_scale_shift\": \"scale_shift\"}", "resnet_time_scale_shift"},
        {"{\"block_out_channels\": [320, 640], \"down_block_types\": [\"DownBlock2D\"]}", "down_block_types"},
        {"{\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\", \"CrossAttnUpBlock2D\", \"CrossAttnUpBlock2D\"]}",
         "up_block_types"},
        {"{\"attention_head_dim\": 7, \"cross_attention_dim\": 768}", "heads"},
        {"{\"block_out_channels\": [320, 640, 1280, 1000], \"cross_attention_dim\": 768}", "norm_num_groups"},
        {"{\"_class_name\": \"UNet2DModel\"}", "_class_name"},
        {"{\"only_cross_attention\": [false, true, false, false]}", "only_cross_attention"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dc_json_doc doc;
        dc_unet_config b;
        CHECK(dc_json_parse(&doc, bad[k][0], strlen(bad[k][0]), 0) == 0, "json");
        CHECK(dc_unet_config_from_json(&b, doc.root, "config.json") != 0 && strstr(dc_error(), bad[k][1]),
              "%s accepted or message '%s' lacks '%s'", bad[k][0], dc_error(), bad[k][1]);
        dc_json_free(&doc);
    }
    // per-block lists of the supported value are accepted
    const char *ok = "{\"only_cross_attention\": [false, false, false, false], \"transformer_layers_per_block\": "
                     "[1, 1, 1, 1], \"attention_head_dim\": [5, 10, 20, 20], \"cross_attention_dim\": 1024}";
    dc_json_doc doc;
    dc_unet_config b;
    CHECK(dc_json_parse(&doc, ok, strlen(ok), 0) == 0 && dc_unet_config_from_json(&b, doc.root, "config.json") == 0 &&
              b.heads[1] == 10 && b.ctx_dim == 1024, "per-block lists refused: %s", dc_error());
    dc_json_free(&doc);
}

// ---- full-size SD: registration against the manifest, names, inference ------------------------

// The manifest's config object as a dc_unet_config, through config.json parsing.
static int manifest_config(const dc_json *model, dc_unet_config *c) {
    const dc_json *cfg = dc_json_get(model, "unet_config");
    if (!cfg) return dc_fail("manifest: no unet_config");
    return dc_unet_config_from_json(c, cfg, "sd_manifest.json unet_config");
}

static void test_manifest_model(const char *label, const dc_json *model, bool v2) {
    dc_unet_config c;
    if (manifest_config(model, &c)) { CHECK(0, "%s: %s", label, dc_error()); return; }
    CHECK(c.ctx_dim == (v2 ? 1024 : 768) && c.linear_proj == v2 && c.nblocks == 4 && c.layers == 2 &&
              c.ch[3] == 1280 && c.attn[2] && !c.attn[3],
          "%s: config read wrongly", label);
    const int heads15[4] = {8, 8, 8, 8}, heads21[4] = {5, 10, 20, 20};
    CHECK(memcmp(c.heads, v2 ? heads21 : heads15, sizeof heads15) == 0, "%s: heads %d %d %d %d", label, c.heads[0],
          c.heads[1], c.heads[2], c.heads[3]);
    dc_params ps = {0};
    CHECK(dc_unet_register(&c, &ps) == 0, "%s: register: %s", label, dc_error());
    const dc_json *names = dc_json_get(model, "unet");
    if (!names || names->type != DC_JSON_OBJECT) { CHECK(0, "%s: manifest has no unet list", label); return; }
    CHECK(ps.count == names->nkids, "%s: %d parameters registered, the manifest lists %d", label, ps.count,
          names->nkids);
    int bad = 0;
    for (int i = 0; i < names->nkids && i < ps.count; i++) {
        const dc_json *e = &names->kids[i];
        const dc_param *p = &ps.items[i];
        bool ok = strcmp(p->name, e->key) == 0 && e->type == DC_JSON_ARRAY && e->nkids == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = e->kids[d].num == (double)p->shape[d];
        if (!ok && bad++ < 5) printf("  %s: #%d registered %s, manifest %s\n", label, i, p->name, e->key);
    }
    CHECK(bad == 0, "%s: %d parameters differ from the manifest (name, shape or order)", label, bad);

    // every parameter has an original name, all distinct
    char (*orig)[160] = calloc((size_t)ps.count, sizeof *orig);
    int fails = 0, dups = 0;
    for (int i = 0; i < ps.count; i++)
        if (dc_unet_original_name(&c, ps.items[i].name, orig[i], sizeof orig[i])) fails++;
    for (int i = 0; i < ps.count; i++)
        for (int j = i + 1; j < ps.count; j++) dups += strcmp(orig[i], orig[j]) == 0;
    CHECK(fails == 0 && dups == 0, "%s: %d names without an original name, %d duplicates", label, fails, dups);
    free(orig);
    dc_params_free(&ps);

    // names of SD's single-file checkpoints (as in v1-5-pruned and v2-1_768)
    static const char *const known[][2] = {
        {"conv_in.weight", "input_blocks.0.0.weight"},
        {"time_embedding.linear_2.bias", "time_embed.2.bias"},
        {"down_blocks.0.resnets.1.conv1.weight", "input_blocks.2.0.in_layers.2.weight"},
        {"down_blocks.1.resnets.0.conv_shortcut.weight", "input_blocks.4.0.skip_connection.weight"},
        {"down_blocks.1.attentions.1.proj_in.weight", "input_blocks.5.1.proj_in.weight"},
        {"down_blocks.2.downsamplers.0.conv.weight", "input_blocks.9.0.op.weight"},
        {"down_blocks.3.resnets.1.time_emb_proj.weight", "input_blocks.11.0.emb_layers.1.weight"},
        {"mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
         "middle_block.1.transformer_blocks.0.attn2.to_k.weight"},
        {"mid_block.resnets.1.norm2.bias", "middle_block.2.out_layers.0.bias"},
        {"up_blocks.0.resnets.2.conv2.weight", "output_blocks.2.0.out_layers.3.weight"},
        {"up_blocks.0.upsamplers.0.conv.weight", "output_blocks.2.1.conv.weight"},
        {"up_blocks.1.upsamplers.0.conv.bias", "output_blocks.5.2.conv.bias"},
        {"up_blocks.2.attentions.0.transformer_blocks.0.ff.net.0.proj.weight",
         "output_blocks.6.1.transformer_blocks.0.ff.net.0.proj.weight"},
        {"up_blocks.3.resnets.2.conv_shortcut.bias", "output_blocks.11.0.skip_connection.bias"},
        {"conv_norm_out.weight", "out.0.weight"},
        {"conv_out.bias", "out.2.bias"},
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
        char o[160] = "";
        CHECK(dc_unet_original_name(&c, known[k][0], o, sizeof o) == 0 && strcmp(o, known[k][1]) == 0,
              "%s: %s -> '%s', want %s", label, known[k][0], o, known[k][1]);
    }
}

// A file holding just the tensors config inference probes, with the shapes
// of the manifest (U8, zero-filled: only the shapes matter), under `names`.
static int probe_file(const dc_json *model, const dc_unet_config *c, dc_names names, dc_st_file *out) {
    static const char *const probes[] = {
        "conv_in.weight", "conv_out.weight", "time_embedding.linear_1.weight",
        "down_blocks.0.resnets.0.conv1.weight", "down_blocks.0.resnets.1.conv1.weight",
        "down_blocks.1.resnets.0.conv1.weight", "down_blocks.2.resnets.0.conv1.weight",
        "down_blocks.3.resnets.0.conv1.weight", "down_blocks.0.attentions.0.proj_in.weight",
        "down_blocks.1.attentions.0.proj_in.weight", "down_blocks.2.attentions.0.proj_in.weight",
        "mid_block.attentions.0.proj_in.weight", "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
    };
    enum { NP = sizeof probes / sizeof probes[0] };
    const dc_json *list = dc_json_get(model, "unet");
    dc_st_entry e[NP];
    char nm[NP][160];
    int64_t most = 0;
    for (int k = 0; k < NP; k++) {
        const dc_json *s = dc_json_get(list, probes[k]);
        if (!s) return dc_fail("manifest lacks %s", probes[k]);
        e[k] = (dc_st_entry){.name = nm[k], .dtype = DC_U8, .ndim = s->nkids};
        int64_t n = 1;
        for (int d = 0; d < s->nkids; d++) e[k].shape[d] = (int64_t)s->kids[d].num, n *= e[k].shape[d];
        if (n > most) most = n;
        if (names == DC_NAMES_DIFFUSERS) snprintf(nm[k], sizeof nm[k], "%s", probes[k]);
        else DC_TRY(dc_unet_original_name(c, probes[k], nm[k], sizeof nm[k]));
    }
    uint8_t *zeros = calloc((size_t)most, 1);
    for (int k = 0; k < NP; k++) e[k].data = zeros;
    uint8_t *bytes;
    size_t len;
    int rc = dc_st_serialize(e, NP, NULL, NULL, 0, &bytes, &len);
    free(zeros);
    if (rc) return -1;
    rc = dc_st_parse(out, bytes, len, "probe.safetensors");
    free(bytes);
    return rc;
}

static void test_manifest_inference(const char *label, const dc_json *model) {
    dc_unet_config want, got;
    if (manifest_config(model, &want)) return;
    for (int layout = 0; layout < 2; layout++) {
        dc_names names = layout ? DC_NAMES_ORIGINAL : DC_NAMES_DIFFUSERS;
        dc_st_file f;
        if (probe_file(model, &want, names, &f)) {
            CHECK(0, "%s: probe file: %s", label, dc_error());
            continue;
        }
        dc_weights w = {.files = &f, .nfiles = 1, .prefix = ""};
        CHECK(dc_unet_config_infer(&got, &w, names) == 0, "%s: infer: %s", label, dc_error());
        CHECK(same_config(&got, &want, true), "%s (%s names): inferred config differs from the manifest's "
              "(heads %d %d %d %d)", label, layout ? "original" : "diffusers", got.heads[0], got.heads[1],
              got.heads[2], got.heads[3]);
        dc_st_close(&f);
    }
}

static void test_manifest(void) {
    dc_json_doc doc;
    if (dc_json_read_file(&doc, MANIFEST)) {
        CHECK(0, "%s", dc_error());
        return;
    }
    const char *keys[2] = {"sd1.5", "sd2.1"};
    for (int k = 0; k < 2; k++) {
        const dc_json *model = dc_json_get(doc.root, keys[k]);
        if (!model) {
            CHECK(0, "manifest has no %s", keys[k]);
            continue;
        }
        test_manifest_model(keys[k], model, k == 1);
        test_manifest_inference(keys[k], model);
    }
    dc_json_free(&doc);
}

// ---- metadata, init, memory -----------------------------------------------------------------

// The named configs are SD's published unet/config.json files (tools/configs/).
static void test_named(void) {
    const char *names[] = {"sd1.5", "sd2.1"}, *files[] = {"tools/configs/sd15_unet.json", "tools/configs/sd21_unet.json"};
    for (int k = 0; k < 2; k++) {
        dc_unet_config a, b;
        dc_kv ka = {0}, kb = {0};
        int rc = dc_unet_config_named(names[k], &a) || dc_unet_config_from_json_file(&b, files[k]) ||
                 dc_unet_config_to_kv(&a, &ka) || dc_unet_config_to_kv(&b, &kb);
        bool same = !rc && ka.n == kb.n;
        for (int i = 0; same && i < ka.n; i++) same = !strcmp(ka.keys[i], kb.keys[i]) && !strcmp(ka.values[i], kb.values[i]);
        CHECK(same, "the named config %s is not %s: %s", names[k], files[k], rc ? dc_error() : "an entry differs");
        dc_kv_free(&ka), dc_kv_free(&kb);
    }
    dc_unet_config c;
    CHECK(dc_unet_config_named("sd3", &c) == 1, "an unknown name is not a config");
}

static void test_meta_init(void) {
    dc_unet_config c;
    dc_unet_config_sd15(&c);
    const int heads21[4] = {5, 10, 20, 20};
    c.ctx_dim = 1024, c.linear_proj = true, c.prediction = DC_PRED_V, c.sample_size = 96;
    memcpy(c.heads, heads21, sizeof heads21);
    dc_kv kv = {0};
    CHECK(dc_unet_config_to_kv(&c, &kv) == 0 && strcmp(kv.keys[0], "model") == 0 &&
              strcmp(kv.values[0], "UNet2DConditionModel") == 0, "config_to_kv");
    float one = 1;
    dc_st_entry e = {.name = "x", .dtype = DC_F32, .ndim = 1, .shape = {1}, .data = &one};
    uint8_t *bytes;
    size_t len;
    dc_st_file f;
    dc_unet_config back;
    int rc = dc_st_serialize(&e, 1, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n, &bytes,
                             &len);
    CHECK(rc == 0 && dc_st_parse(&f, bytes, len, "meta.safetensors") == 0, "serialize: %s", dc_error());
    if (rc == 0) {
        CHECK(dc_unet_config_from_meta(&back, &f) == 0, "from_meta: %s", dc_error());
        CHECK(same_config(&back, &c, true) && back.prediction == DC_PRED_V && back.sample_size == 96,
              "metadata round trip changed the config");
        dc_st_close(&f);
        free(bytes);
    }
    dc_kv_free(&kv);

    // seeded init: the same seed gives the same weights, norms start at 1 and 0
    dc_unet_config t;
    if (dc_unet_config_from_json_file(&t, GOLD "/sd1/diffusers/unet/config.json")) return;
    dc_model *a = NULL, *b = NULL;
    CHECK(dc_unet_new(&t, g_be, DC_F32, 16, 16, &a) == 0 && dc_unet_new(&t, g_be, DC_F32, 16, 16, &b) == 0, "new");
    if (!a || !b) return;
    CHECK(dc_model_init_weights(a, 7) == 0 && dc_model_init_weights(b, 7) == 0, "init");
    const dc_params *pa = a->params, *pb = b->params;
    // every weight of an inference model is frozen, in the frozen arena (F32 here)
    const int64_t n = pa->frozen_numel;
    float *ha = malloc((size_t)n * 4), *hb = malloc((size_t)n * 4);
    buf_down(pa->frozen, ha, n);
    buf_down(pb->frozen, hb, n);
    CHECK(memcmp(ha, hb, (size_t)n * 4) == 0, "init with one seed differs between models");
    int ng = dc_params_find(pa, "conv_norm_out.weight"), nb = dc_params_find(pa, "conv_norm_out.bias");
    int cw = dc_params_find(pa, "conv_in.weight");
    CHECK(ng >= 0 && ha[pa->items[ng].offset] == 1 && ha[pa->items[nb].offset] == 0, "norms not at 1 / 0");
    // PyTorch's default: U(-b, b), b = 1/sqrt(fan_in), for a weight and its bias (conv_in: fan_in 4 x 3 x 3)
    int cb = dc_params_find(pa, "conv_in.bias");
    const double bound = 1 / sqrt(36.0);
    double ss = 0, big = 0;
    for (int64_t j = 0; j < pa->items[cw].numel; j++) {
        const double w = ha[pa->items[cw].offset + j];
        ss += w * w, big = fabs(w) > big ? fabs(w) : big;
    }
    double sd = sqrt(ss / (double)pa->items[cw].numel);
    // 1152 draws: the std within 5% of b/sqrt(3), the largest within [0.95 b, b]
    CHECK(fabs(sd / (bound / sqrt(3.0)) - 1) < 0.05 && big <= bound && big > 0.95 * bound,
          "conv_in std %.4f max %.4f, want U(-%.4f, %.4f)", sd, big, bound, bound);
    double bmax = 0, bsum = 0;
    for (int64_t j = 0; j < pa->items[cb].numel; j++)
        bmax = fmax(bmax, fabs(ha[pa->items[cb].offset + j])), bsum += fabs(ha[pa->items[cb].offset + j]);
    CHECK(cb >= 0 && bmax <= bound && bsum > 0.25 * bound * (double)pa->items[cb].numel,
          "conv_in bias: max %.4f, mean |b| %.4f (want U(-%.4f, %.4f))", bmax, bsum / (double)pa->items[cb].numel,
          bound, bound);
    CHECK(dc_model_init_weights(b, 8) == 0, "init");
    buf_down(pb->frozen, hb, n);
    CHECK(memcmp(ha, hb, (size_t)n * 4) != 0, "another seed gives the same weights");
    free(ha), free(hb);

    // multiply-adds grow at least 4x with 4x the pixels (attention more)
    double m16 = dc_model_macs_per_image(a);
    CHECK(dc_unet_set_size(a, 32, 32) == 0, "set_size: %s", dc_error());
    double m32 = dc_model_macs_per_image(a);
    CHECK(m16 > 0 && m32 > 4 * m16 && m32 < 8 * m16, "macs %.3g at 16x16, %.3g at 32x32", m16, m32);
    dc_model_free(a), dc_model_free(b);
}

// test_unet [BACKEND [PATHS]]: PATHS, kernel paths to turn off (backend.h).
int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cpu";
    dc_backend_opts o = dc_backend_opts_default();
    if (argc > 2 && dc_backend_opts_disable(&o, argv[2])) return printf("FAIL %s\n", dc_error()), 1;
    if (dc_backend_create_opts(name, &o, &g_be)) {
        printf("SKIP (no GPU) no %s backend (%s)\n", name, dc_error());
        return strcmp(name, "cpu") == 0;
    }
    g_tol = g_be->compute == DC_F32 ? TOL_OUT : TOL_BF16;
    printf("backend %s (%s activations%s%s), tolerance %.0e\n", name, dc_dtype_name(g_be->compute),
           argc > 2 ? "; off: " : "", argc > 2 ? argv[2] : "", g_tol);
    printf("golden (diffusers layout)\n");
    test_golden_diffusers("sd1");
    test_golden_diffusers("sd2");
    printf("golden (single file)\n");
    test_golden_single("sd1");
    test_golden_single("sd2");
    printf("refusals\n");
    test_refusals();
    printf("full-size SD 1.5 / 2.1 against the manifest\n");
    test_manifest();
    printf("metadata and init\n");
    test_meta_init();
    test_named();
    dc_backend_destroy(g_be);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
