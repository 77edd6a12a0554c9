// The SD UNet's backward: gradients of L = sum(dout * unet(x, t, ctx)) for a
// random dout, with respect to every parameter, on the tiny sd1 and sd2
// UNets of tests/golden/sd (SD 1.x's and 2.x's topology: resnets with the
// time embedding, transformers with cross-attention and GEGLU, down- and
// upsampling, skip concatenation), their weights and inputs.
//
// - Finite differences: for every parameter tensor, the directional
//   derivative of L along a random direction, by central differences of the
//   fp32 forward with L summed in double, against the backward's gradient
//   dotted with the direction. Every module's parameters are a tensor here,
//   so each module's backward is checked (resnet, transformer, resamplers,
//   time embedding, input and output layers).
// - Golden gradients from diffusers' own autograd in float64
//   (tests/golden/sd/<set>/grad.safetensors, made by tools/sd_grad_golden.py):
//   sampled values and the norm of every parameter's gradient.
// - The text's gradient (cond.dctx, for a text encoder trained along): the
//   directional derivative of L along a random direction of the text, by
//   central differences, against dctx; a second backward overwrites it.
// - Recompute: gradients with K layers keeping their activations (several
//   K) are bit-identical to keeping all, the text's too.
// - Units: backward announces every parameter unit once, begin then done.
//
// Usage: test_unet_grad            the CPU checks above
//        test_unet_grad cuda       the GPU's gradients against the CPU's (and
//                                  with selective recompute, the same bits)
//        test_unet_grad cuda-fp32  (bf16 and fp32 tolerances)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "buf_up.h"
#include "check.h"
#include "param_fd.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "models/unet.h"
#include "nn/weights.h"

#define GOLD "tests/golden/sd"

// A trainable UNet of a golden set, loaded, with its inputs.
typedef struct {
    dc_backend *be;
    dc_model *m;
    dc_st_file wf;
    dc_buf x, t, ctx, out, dout;  // x, out, dout F32 [B, 4, 16, 16]
    dc_cond cond;
    int B;
    int64_t nout;
    float *hdout;                 // dout on the host
} rig;

static dc_buf up_tensor(dc_backend *be, const dc_st_file *f, const char *name, dc_dtype dt, int64_t *n) {
    const dc_st_tensor *t = dc_st_find(f, name);
    if (!t) return dc_buf_none();
    float *h = malloc((size_t)t->numel * sizeof *h);
    if (!h || dc_st_read_f32(f, t, h)) return free(h), dc_buf_none();
    dc_buf d = test_buf_up(be, h, t->numel, dt);
    if (n) *n = t->numel;
    free(h);
    return d;
}

// n normal draws of seed.
static float *randn_host(int64_t n, uint64_t seed) {
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; h && i < n; i++) h[i] = dc_randn_at(seed, 0, 0, 0, (uint32_t)i);
    return h;
}

// The set's UNet with GroupNorms of 8 groups: the sets' 32 groups of 32
// channels normalise each channel alone, which makes every per-channel
// constant (the time embedding's projection, conv1's bias) vanish from the
// output, and their gradients 0. The weights are the same shapes either way.
// io: the set's inputs (2 images of 16x16); else one random image of 16x16
// with 16 tokens of text (finite differences run many forwards). dout: the
// given values, else normal draws of seed.
static int rig_open(rig *r, dc_backend *be, const char *set, bool io_inputs, const float *dout, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->be = be;
    char path[256];
    dc_unet_config c;
    snprintf(path, sizeof path, GOLD "/%s/diffusers/unet/config.json", set);
    DC_TRY(dc_unet_config_from_json_file(&c, path));
    c.groups = 8;
    snprintf(path, sizeof path, GOLD "/%s/single.safetensors", set);
    DC_TRY(dc_st_open(&r->wf, path));
    dc_weights w = {.files = &r->wf, .nfiles = 1, .prefix = "model.diffusion_model."};
    const int side = 16;
    DC_TRY(dc_unet_new_train(&c, be, DC_GRAD_BUFFER, side, side, &r->m));
    DC_TRY(dc_unet_load(r->m, &w, DC_NAMES_ORIGINAL));
    if (io_inputs) {
        dc_st_file io;
        snprintf(path, sizeof path, GOLD "/%s/io.safetensors", set);
        DC_TRY(dc_st_open(&io, path));
        r->x = up_tensor(be, &io, "unet.x", DC_F32, &r->nout);
        r->t = up_tensor(be, &io, "unet.t", DC_F32, NULL);
        r->ctx = up_tensor(be, &io, "unet.context", be->compute, NULL);
        const dc_st_tensor *ct = dc_st_find(&io, "unet.context");
        r->B = (int)dc_st_find(&io, "unet.x")->shape[0];
        r->cond = (dc_cond){.ctx = r->ctx, .len = (int)ct->shape[1], .dim = (int)ct->shape[2]};
        dc_st_close(&io);
    } else {
        const int len = 16;
        r->B = 1, r->nout = 4 * side * side;
        float *hx = randn_host(r->nout, seed + 1), *hc = randn_host(len * c.ctx_dim, seed + 2), ht = 321.0f;
        r->x = test_buf_up(be, hx, r->nout, DC_F32), r->t = test_buf_up(be, &ht, 1, DC_F32);
        r->ctx = test_buf_up(be, hc, len * c.ctx_dim, be->compute);
        r->cond = (dc_cond){.ctx = r->ctx, .len = len, .dim = c.ctx_dim};
        free(hx), free(hc);
    }
    r->hdout = dout ? malloc((size_t)r->nout * sizeof *r->hdout) : randn_host(r->nout, seed);
    if (dout) memcpy(r->hdout, dout, (size_t)r->nout * sizeof *r->hdout);
    r->dout = test_buf_up(be, r->hdout, r->nout, DC_F32);
    r->out = (dc_buf){be->alloc(be, (size_t)r->nout * 4), DC_F32};
    return dc_model_reserve(r->m, r->B);
}

static void rig_close(rig *r) {
    dc_backend *be = r->be;
    dc_buf *b[] = {&r->x, &r->t, &r->ctx, &r->out, &r->dout};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++)
        if (b[i]->p) be->free(be, b[i]->p);
    dc_model_free(r->m);
    dc_st_close(&r->wf);
    free(r->hdout);
}

// L = sum(dout * out) of a forward, in double.
static double loss(rig *r) {
    return param_fd_model_loss(r->m, r->out, r->x, r->t, &r->cond, r->B, r->hdout, r->nout);
}

// Every parameter's gradient (storage order, F32) after one forward and backward.
static float *grads(rig *r) {
    return param_fd_model_grads(r->m, r->out, r->x, r->t, &r->cond, r->B, r->hdout, r->dout, r->nout);
}

// ---- finite differences ----------------------------------------------------------------

// The master weights of parameter i set to h (n values) on the backend.
static void set_param(rig *r, int i, const float *h, int64_t n) {
    dc_params *ps = r->m->params;
    r->be->upload(r->be, dc_param_data(ps, i).p, h, (size_t)n * 4);
    dc_params_touch(ps);
}

static double rig_loss(void *r) { return loss(r); }
static void rig_set(void *r, int i, const float *h, int64_t n) { set_param(r, i, h, n); }

static void test_fd(const char *set) {
    rig r;
    if (rig_open(&r, dc_backend_cpu_create(), set, false, NULL, 11)) {
        CHECK(0, "%s: %s", set, dc_error());
        return;
    }
    const dc_params *ps = r.m->params;
    float *g = grads(&r);
    CHECK(g != NULL, "%s: gradients", set);
    if (!g) return rig_close(&r);
    int bad = 0, checked = 0;
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        // steps of 3% of the tensor's scale: the loss's fp32 rounding,
        // divided by the step, stays below 1e-2 of the derivative (at 0.4%
        // it reached 1e-1 at the 2x2 bottom, where GroupNorm normalises 16
        // values), and truncation too (worst 9e-3 on sd1, 4e-3 on sd2)
        const param_fd f = param_fd_check(r.be, ps, i, g, 3e-2, rig_loss, rig_set, &r);
        const double fd = f.fd, an = f.an, gn = f.gn, e = f.err;
        checked++;
        if (!(e < 2e-2)) {
            if (bad++ < 8) printf("  %s %s: differences %.6e, backward %.6e (|g| %.3e)\n", set, p->name, fd, an, gn);
        }
        if (!(e <= worst)) worst = e, worst_name = p->name;
    }
    printf("  %s: %d parameter tensors, worst relative error %.2e (%s)\n", set, checked, worst, worst_name);
    CHECK(bad == 0 && checked == ps->count && checked > 100, "%s: %d of %d tensors' gradients off", set, bad,
          checked);
    free(g);
    dc_backend *be = r.be;
    rig_close(&r);
    dc_backend_destroy(be);
}

// The text's gradient against central differences of L along a random
// direction of the text (F32 on the CPU).
static void test_ctx_fd(const char *set) {
    rig r;
    if (rig_open(&r, dc_backend_cpu_create(), set, false, NULL, 13)) {
        CHECK(0, "%s: %s", set, dc_error());
        return;
    }
    const int64_t n = (int64_t)r.B * r.cond.len * r.cond.dim;
    r.cond.dctx = (dc_buf){r.be->alloc(r.be, (size_t)n * 4), DC_F32};
    float *c0 = malloc((size_t)n * 4), *c = malloc((size_t)n * 4), *v = malloc((size_t)n * 4);
    float *d = malloc((size_t)n * 4), *d2 = malloc((size_t)n * 4);
    r.be->download(r.be, c0, r.ctx.p, (size_t)n * 4);
    float *g = grads(&r);
    r.be->download(r.be, d, r.cond.dctx.p, (size_t)n * 4);
    free(g), g = grads(&r);  // a second backward writes the same, not twice it
    r.be->download(r.be, d2, r.cond.dctx.p, (size_t)n * 4);
    CHECK(g && memcmp(d, d2, (size_t)n * 4) == 0, "%s: a second backward changes the text's gradient", set);
    const double eps = 3e-2;
    for (int64_t j = 0; j < n; j++) v[j] = dc_randn_at(78, 0, 0, 1, (uint32_t)j);
    for (int64_t j = 0; j < n; j++) c[j] = (float)(c0[j] + eps * v[j]);
    r.be->upload(r.be, r.ctx.p, c, (size_t)n * 4);
    const double lp = loss(&r);
    for (int64_t j = 0; j < n; j++) c[j] = (float)(c0[j] - eps * v[j]);
    r.be->upload(r.be, r.ctx.p, c, (size_t)n * 4);
    const double lm = loss(&r);
    const double fd = (lp - lm) / (2 * eps), an = param_fd_dot(d, v, n), dn = sqrt(param_fd_dot(d, d, n));
    const double e = fabs(fd - an) / (fabs(an) + dn + 1e-6);
    printf("  %s: the text's gradient: differences %.6e, backward %.6e (|dctx| %.3e), error %.2e\n", set, fd, an, dn,
           e);
    CHECK(e < 2e-2 && dn > 0, "%s: the text's gradient is off (%.2e)", set, e);
    free(g), free(c0), free(c), free(v), free(d), free(d2);
    r.be->free(r.be, r.cond.dctx.p);
    dc_backend *be = r.be;
    rig_close(&r);
    dc_backend_destroy(be);
}

// ---- golden gradients (diffusers' autograd) -------------------------------------------------

static void test_golden(const char *set) {
    char path[256];
    snprintf(path, sizeof path, GOLD "/%s/grad.safetensors", set);
    dc_st_file gf;
    if (dc_st_open(&gf, path)) {  // they ship with the repository: a missing file is a failure
        CHECK(0, "%s: golden gradients (%s; tools/sd_grad_golden.py makes them): %s", set, path, dc_error());
        return;
    }
    const dc_st_tensor *dt = dc_st_find(&gf, "dout");
    float *dout = dt ? malloc((size_t)dt->numel * 4) : NULL;
    rig r;
    if (!dout || dc_st_read_f32(&gf, dt, dout) || rig_open(&r, dc_backend_cpu_create(), set, true, dout, 0)) {
        CHECK(0, "%s: %s", set, dc_error());
        free(dout), dc_st_close(&gf);
        return;
    }
    const dc_params *ps = r.m->params;
    float *g = grads(&r);
    int bad = 0, found = 0;
    double worst = 0;
    for (int i = 0; g && i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        char nn[200];
        snprintf(nn, sizeof nn, "norm.%s", p->name);
        const dc_st_tensor *st = dc_st_find(&gf, p->name), *sn = dc_st_find(&gf, nn);
        if (!st || !sn) continue;
        found++;
        float *want = malloc((size_t)st->numel * 4), *h = malloc((size_t)p->numel * 4), norm;
        memcpy(h, g + p->offset, (size_t)p->numel * 4);
        dc_param_from_stored(p, h);  // PyTorch's order, as the samples are indexed
        dc_st_read_f32(&gf, st, want);
        dc_st_read_f32(&gf, sn, &norm);
        const int64_t k = st->numel;
        double e = 0;
        for (int64_t j = 0; j < k; j++) {
            const double d = fabs((double)h[j * p->numel / k] - want[j]);
            if (!(d <= e)) e = d;
        }
        // relative to the tensor's gradient scale (its rms): fp32's backward
        // through ~300 ops lands far below; a wrong term gives order 1
        const double scale = norm / sqrt((double)p->numel) + 1e-12;
        const double en = fabs(sqrt(param_fd_dot(h, h, p->numel)) - norm) / (norm + 1e-12);
        e /= scale;
        if (!(e < 1e-3 && en < 1e-4)) {
            if (bad++ < 8) printf("  %s %s: sample error %.2e of the rms, norm error %.2e\n", set, p->name, e, en);
        }
        if (!(e <= worst)) worst = e;
        free(want), free(h);
    }
    printf("  %s: golden gradients of %d tensors, worst %.2e of the rms\n", set, found, worst);
    CHECK(g && bad == 0 && found == ps->count, "%s: %d bad, %d of %d tensors in the golden file", set, bad, found,
          ps->count);
    free(g), free(dout);
    dc_st_close(&gf);
    dc_backend *be = r.be;
    rig_close(&r);
    dc_backend_destroy(be);
}

// ---- recompute and units -----------------------------------------------------------------

typedef struct {
    int calls[256][2];
    int n;
    int open;  // the unit begun and not done, or -1
    bool order_ok;
} unit_log;

static int log_unit(void *ctx, int unit, bool done) {
    unit_log *l = ctx;
    if (l->n < 256) l->calls[l->n][0] = unit, l->calls[l->n][1] = done;
    l->n++;
    if (done ? l->open != unit : l->open != -1) l->order_ok = false;
    l->open = done ? -1 : unit;
    return 0;
}

// unet_blocks.h's units: conv_in with the time embedding, each transformer,
// resnet and resampling conv, the output layers.
static int unet_units(const dc_unet_config *c) {
    const int N = c->nblocks, L = c->layers;
    int n = 2 + 3;  // and the mid block's transformer and two resnets
    for (int i = 0; i < N; i++)
        n += (2 * L + 1) * (c->attn[i] ? 2 : 1) + 2 * (i < N - 1);  // down block i and the up block mirroring it
    return n;
}

static void test_recompute_units(const char *set) {
    rig r;
    if (rig_open(&r, dc_backend_cpu_create(), set, true, NULL, 5)) {
        CHECK(0, "%s: %s", set, dc_error());
        return;
    }
    dc_params *ps = r.m->params;
    const int n = r.m->info.blocks;
    const int64_t nctx = (int64_t)r.B * r.cond.len * r.cond.dim;
    r.cond.dctx = (dc_buf){r.be->alloc(r.be, (size_t)nctx * 4), DC_F32};
    float *dall = malloc((size_t)nctx * 4), *dk = malloc((size_t)nctx * 4);
    float *all = grads(&r);
    r.be->download(r.be, dall, r.cond.dctx.p, (size_t)nctx * 4);
    CHECK(all != NULL && n > 10, "%s: gradients, %d layers", set, n);
    // the planner's bytes are reserve's: fewer with fewer layers keeping theirs
    const int64_t b_all = dc_model_activation_bytes(r.m, r.be->compute, r.B, -1, false);
    const int64_t b_none = dc_model_activation_bytes(r.m, r.be->compute, r.B, 0, false);
    CHECK(b_all > 0 && b_none > 0 && b_none < b_all && (size_t)b_all == dc_unet_activation_bytes(r.m, r.B),
          "%s: training activation bytes %lld (all keeping), %lld (none)", set, (long long)b_all, (long long)b_none);
    const int keeps[] = {0, 1, n / 2, n - 1};
    for (int i = 0; all && i < 4; i++) {
        CHECK(dc_model_set_recompute(r.m, keeps[i]) == 0 && dc_model_reserve(r.m, r.B) == 0, "recompute: %s",
              dc_error());
        float *g = grads(&r);
        r.be->download(r.be, dk, r.cond.dctx.p, (size_t)nctx * 4);
        CHECK(g && memcmp(g, all, (size_t)ps->numel * 4) == 0 && memcmp(dk, dall, (size_t)nctx * 4) == 0,
              "%s: gradients with %d of %d layers keeping their activations differ from keeping all", set, keeps[i],
              n);
        free(g);
    }
    printf("  %s: recompute with 0, 1, %d, %d of %d layers keeping: the same bits\n", set, n / 2, n - 1, n);
    // selective recompute: the cheap intermediates rebuilt, the same bits in less memory
    const int64_t b_sel = dc_model_activation_bytes(r.m, r.be->compute, r.B, -1, true);
    CHECK(b_sel > 0 && b_sel < b_all, "%s: selective recompute's arena %lld bytes, keeping all %lld", set,
          (long long)b_sel, (long long)b_all);
    const int skeeps[] = {-1, 0, n / 2};
    for (int i = 0; all && i < 3; i++) {
        CHECK(dc_model_set_selective(r.m, true) == 0 && dc_model_set_recompute(r.m, skeeps[i]) == 0 &&
                  dc_model_reserve(r.m, r.B) == 0,
              "selective recompute: %s", dc_error());
        float *g = grads(&r);
        r.be->download(r.be, dk, r.cond.dctx.p, (size_t)nctx * 4);
        CHECK(g && memcmp(g, all, (size_t)ps->numel * 4) == 0 && memcmp(dk, dall, (size_t)nctx * 4) == 0,
              "%s: gradients with selective recompute, %d layers keeping, differ from keeping all", set, skeeps[i]);
        free(g);
    }
    CHECK(dc_model_set_selective(r.m, false) == 0 && dc_model_set_recompute(r.m, -1) == 0 &&
              dc_model_reserve(r.m, r.B) == 0,
          "back: %s", dc_error());
    printf("  %s: selective recompute (all, 0 and %d layers keeping): the same bits, arena %lld -> %lld bytes\n", set,
           n / 2, (long long)b_all, (long long)b_sel);

    unit_log l = {.open = -1, .order_ok = true};
    dc_param_hooks hk = {.ctx = &l, .unit = log_unit};
    ps->hooks = &hk;
    float *g = grads(&r);
    ps->hooks = NULL;
    const int units = dc_params_unit_count(ps);
    bool each_once = l.n == 2 * units;
    for (int u = 0; each_once && u < units; u++) {
        int seen = 0;
        for (int k = 0; k < l.n; k++) seen += l.calls[k][0] == u;
        each_once = seen == 2;
    }
    const int want = unet_units(&dc_unet_of(r.m)->cfg);
    CHECK(g && units == want && l.n <= 256, "%s: %d units (expected %d)", set, units, want);
    CHECK(each_once && l.order_ok && l.open == -1, "%s: %d unit calls for %d units, in order %d", set, l.n, units,
          l.order_ok);
    CHECK(g && all && memcmp(g, all, (size_t)ps->numel * 4) == 0, "%s: hooks change the gradients", set);
    free(g), free(all), free(dall), free(dk);
    r.be->free(r.be, r.cond.dctx.p);
    dc_backend *be = r.be;
    rig_close(&r);
    dc_backend_destroy(be);
}

// ---- the GPU against the CPU ------------------------------------------------------------------

static void test_gpu(const char *name, const char *set) {
    dc_backend *gpu = NULL;
    if (dc_backend_create(name, &gpu)) {
        printf("SKIP (no GPU) no %s backend (%s)\n", name, dc_error());
        return;
    }
    rig rc, rg;
    if (rig_open(&rc, dc_backend_cpu_create(), set, true, NULL, 9) || rig_open(&rg, gpu, set, true, NULL, 9)) {
        CHECK(0, "%s: %s", set, dc_error());
        return;
    }
    const int64_t nctx = (int64_t)rc.B * rc.cond.len * rc.cond.dim;
    rc.cond.dctx = (dc_buf){rc.be->alloc(rc.be, (size_t)nctx * 4), DC_F32};
    rg.cond.dctx = (dc_buf){gpu->alloc(gpu, (size_t)nctx * 4), DC_F32};
    float *gc = grads(&rc), *gg = grads(&rg);
    // relative to each tensor's gradient norm: fp32 ("cuda-fp32") differs in
    // summation order only; bf16 ("cuda") rounds every activation to 8 bits
    const double tol = gpu->compute == DC_F32 ? 1e-3 : 8e-2;
    float *dc = malloc((size_t)nctx * 4), *dg = malloc((size_t)nctx * 4);
    rc.be->download(rc.be, dc, rc.cond.dctx.p, (size_t)nctx * 4);
    gpu->download(gpu, dg, rg.cond.dctx.p, (size_t)nctx * 4);
    double dd, dn;
    param_gap(dg, dc, nctx, &dd, &dn);
    printf("  %s on %s: the text's gradient %.2e of its norm off\n", set, name, dd / dn);
    CHECK(dn > 0 && dd < tol * dn, "%s on %s: the text's gradient is %.2e off", set, name, dd / dn);
    free(dc), free(dg);
    rc.be->free(rc.be, rc.cond.dctx.p), gpu->free(gpu, rg.cond.dctx.p);
    rc.cond.dctx = rg.cond.dctx = dc_buf_none();  // (the parameters' gradients do not depend on it)
    char label[64];
    snprintf(label, sizeof label, "%s on %s", set, name);
    const int bad = gc && gg ? param_gpu_gaps(rc.m->params, gg, gc, tol, label) : -1;
    CHECK(gc && gg && bad == 0, "%s on %s: %d tensors off", set, name, bad);
    // selective recompute on the GPU: the same bits as keeping everything
    if (gg) {
        dc_params *ps = rg.m->params;
        CHECK(dc_model_set_selective(rg.m, true) == 0 && dc_model_reserve(rg.m, rg.B) == 0, "selective: %s",
              dc_error());
        float *gs = grads(&rg);
        CHECK(gs && memcmp(gs, gg, (size_t)ps->numel * 4) == 0, "%s on %s: selective recompute changed the "
              "gradients", set, name);
        free(gs);
    }
    free(gc), free(gg);
    dc_backend *cpu = rc.be;
    rig_close(&rc), rig_close(&rg);
    dc_backend_destroy(cpu), dc_backend_destroy(gpu);
}

int main(int argc, char **argv) {
    const char *sets[] = {"sd1", "sd2"};
    if (argc > 1) {
        printf("GPU against CPU (%s)\n", argv[1]);
        for (int s = 0; s < 2; s++) test_gpu(argv[1], sets[s]);
    } else {
        for (int s = 0; s < 2; s++) {
            printf("%s: finite differences\n", sets[s]);
            test_fd(sets[s]);
            test_ctx_fd(sets[s]);
            printf("%s: golden gradients\n", sets[s]);
            test_golden(sets[s]);
            printf("%s: recompute and units\n", sets[s]);
            test_recompute_units(sets[s]);
        }
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
