// The CLIP text encoder's backward: gradients of L = sum(dout * hidden) for
// a random dout, with respect to every parameter, on small random encoders
// with OpenAI's quick_gelu and OpenCLIP's exact GELU, all layers run and the
// last one skipped (clip skip).
//
// - The training forward gives the inference forward's bits.
// - Finite differences: for every parameter tensor, the directional
//   derivative of L along a random direction, by central differences of the
//   fp32 forward with L summed in double, against the backward's gradient
//   dotted with the direction (embeddings, every layer's LayerNorms,
//   projections and MLP, the final LayerNorm).
// - A second backward adds the same gradients again (+=).
// - Frozen: with the encoder's parameters frozen, backward runs and writes
//   no gradient (LoRA trains through a frozen encoder).
// - The GPU's gradients against the CPU's ("cuda": bf16, "cuda-fp32").
//
// Usage: test_clip_text_grad [cuda|cuda-fp32]
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
#include "models/clip_text.h"

enum { V = 50, T = 9, W = 32, L = 3, H = 2, F = 48, B = 2 };

typedef struct {
    dc_backend *be;
    dc_clip_text *m;
    dc_buf ids, hidden, dout;
    int skip;
    float *hdout;
    int64_t nout;
} rig;

// A trainable encoder with random weights of seed (LayerNorm gains near 1),
// token ids and dout drawn from seed too.
static int rig_open(rig *r, dc_backend *be, dc_act act, int skip, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->be = be, r->skip = skip;
    const dc_clip_text_config c = {V, T, W, L, H, F, act, 1e-5f};
    DC_TRY(dc_clip_text_create_trainable(&r->m, &c, be));
    dc_params *ps = r->m->params;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        float *h = malloc((size_t)p->numel * sizeof *h);
        const bool gain = strstr(p->name, "norm") && strstr(p->name, ".weight");
        const double scale = p->ndim == 2 && !strstr(p->name, "embedding") ? 1.0 / sqrt((double)p->shape[1]) : 0.5;
        for (int64_t j = 0; j < p->numel; j++)
            h[j] = (float)((gain ? 1.0 : 0.0) + scale * dc_randn_at(seed, (uint32_t)i, 0, 0, (uint32_t)j));
        be->upload(be, dc_param_data(ps, i).p, h, (size_t)p->numel * 4);
        free(h);
    }
    dc_params_refresh(ps);
    int32_t hid[B * T];
    for (int j = 0; j < B * T; j++) hid[j] = (int32_t)(dc_philox((uint32_t)j, 0, 0, 0, seed + 1).v[0] % V);
    hid[3] = hid[T + 5];  // a token twice: its embedding row takes two shares
    r->ids = (dc_buf){be->alloc(be, sizeof hid), DC_I32};
    be->upload(be, r->ids.p, hid, sizeof hid);
    r->nout = (int64_t)B * T * W;
    r->hdout = malloc((size_t)r->nout * sizeof *r->hdout);
    for (int64_t j = 0; j < r->nout; j++) r->hdout[j] = dc_randn_at(seed + 2, 0, 0, 0, (uint32_t)j);
    r->dout = test_buf_up(be, r->hdout, r->nout, be->compute);
    r->hidden = (dc_buf){be->alloc(be, (size_t)r->nout * 4), DC_F32};
    DC_TRY(dc_clip_text_reserve(r->m, B));
    return dc_clip_text_train_reserve(r->m, B);
}

static void rig_close(rig *r) {
    dc_backend *be = r->be;
    dc_buf *b[] = {&r->ids, &r->hidden, &r->dout};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++)
        if (b[i]->p) be->free(be, b[i]->p);
    dc_clip_text_free(r->m);
    free(r->hdout);
}

// L = sum(dout * hidden) of a training forward, in double.
static double loss(rig *r) {
    if (dc_clip_text_train_forward(r->m, r->hidden, r->ids, B, r->skip)) return NAN;
    return param_fd_loss(r->be, r->hidden, r->hdout, r->nout);
}

// Every parameter's gradient after `passes` forward-backward passes from zero.
static float *grads(rig *r, int passes) {
    const dc_params *ps = r->m->params;
    r->be->zero(r->be, ps->grad.p, (size_t)ps->numel * 4);
    for (int k = 0; k < passes; k++)
        if (!isfinite(loss(r)) || dc_clip_text_backward(r->m, r->dout)) {
            printf("  backward: %s\n", dc_error());
            return NULL;
        }
    float *g = malloc((size_t)ps->numel * sizeof *g);
    r->be->download(r->be, g, ps->grad.p, (size_t)ps->numel * 4);
    return g;
}

static void set_param(rig *r, int i, const float *h, int64_t n) {
    dc_params *ps = r->m->params;
    r->be->upload(r->be, dc_param_data(ps, i).p, h, (size_t)n * 4);
    dc_params_touch(ps);
    dc_params_refresh(ps);
}

static double rig_loss(void *r) { return loss(r); }
static void rig_set(void *r, int i, const float *h, int64_t n) { set_param(r, i, h, n); }

static void test_cpu(dc_act act, int skip) {
    const char *what = act == DC_ACT_QUICK_GELU ? "quick_gelu" : "gelu";
    rig r;
    if (rig_open(&r, dc_backend_cpu_create(), act, skip, 11 + (uint64_t)skip)) {
        CHECK(0, "%s skip %d: %s", what, skip, dc_error());
        return;
    }
    const dc_params *ps = r.m->params;
    // the training forward against the inference forward: the same ops, the same bits
    float *a = malloc((size_t)r.nout * 4), *b = malloc((size_t)r.nout * 4);
    dc_buf inf = {r.be->alloc(r.be, (size_t)r.nout * 4), DC_F32};
    const double l0 = loss(&r);
    r.be->download(r.be, a, r.hidden.p, (size_t)r.nout * 4);
    CHECK(dc_clip_text_forward(r.m, inf, dc_buf_none(), r.ids, B, skip) == 0, "inference: %s", dc_error());
    r.be->download(r.be, b, inf.p, (size_t)r.nout * 4);
    CHECK(isfinite(l0) && memcmp(a, b, (size_t)r.nout * 4) == 0, "%s skip %d: training and inference forwards differ",
          what, skip);
    r.be->free(r.be, inf.p), free(a), free(b);

    float *g = grads(&r, 1), *g2 = grads(&r, 2);
    CHECK(g && g2, "%s skip %d: gradients", what, skip);
    if (!g || !g2) return free(g), free(g2), rig_close(&r);
    // a second pass adds the same again (in fp32, so up to rounding)
    double d = 0, n2 = 0;
    for (int64_t j = 0; j < ps->numel; j++) d += ((double)g2[j] - 2.0 * g[j]) * (g2[j] - 2.0 * g[j]), n2 += 4.0 * g[j] * g[j];
    CHECK(sqrt(d) <= 1e-6 * sqrt(n2) && n2 > 0, "%s skip %d: two backwards give %.2e of twice one's", what, skip,
          sqrt(d / n2));

    int bad = 0, checked = 0, zero = 0;
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        const int64_t n = p->numel;
        const double gn = sqrt(param_fd_dot(g + p->offset, g + p->offset, n));
        // a skipped layer gets no gradient; every other tensor must get one
        const bool skipped = skip && strstr(p->name, "encoder.layers.") &&
                             atoi(p->name + strlen("encoder.layers.")) >= L - skip;
        if (skipped) {
            zero += gn == 0;
            continue;
        }
        // The key bias adds q.b to every score of a query: softmax drops it,
        // so its true gradient is 0 and differences would measure rounding.
        if (strstr(p->name, "k_proj.bias")) {
            const double all = sqrt(param_fd_dot(g, g, ps->numel));
            checked++;
            if (!(gn < 1e-4 * all) && bad++ < 8) printf("  %s %s: |g| %.3e of a true 0\n", what, p->name, gn);
            continue;
        }
        const param_fd f = param_fd_check(r.be, ps, i, g, 1e-2, rig_loss, rig_set, &r);
        const double fd = f.fd, an = f.an, e = f.err;
        checked++;
        if (!(e < 1e-2) || !(gn > 0)) {  // every other tensor takes a gradient
            if (bad++ < 8) printf("  %s %s: differences %.6e, backward %.6e (|g| %.3e)\n", what, p->name, fd, an, gn);
        }
        if (!(e <= worst)) worst = e, worst_name = p->name;
    }
    printf("  %s, skip %d: %d parameter tensors, worst relative error %.2e (%s)\n", what, skip, checked, worst,
           worst_name);
    const int want = ps->count - 16 * skip;  // a layer holds 16 tensors
    CHECK(bad == 0 && checked == want && checked > 20, "%s skip %d: %d of %d tensors' gradients off", what, skip,
          bad, checked);
    CHECK(zero == ps->count - checked, "%s skip %d: a skipped layer's parameters took a gradient", what, skip);
    free(g), free(g2);
    dc_backend *be = r.be;
    rig_close(&r);
    dc_backend_destroy(be);
}

// An inference encoder (frozen parameters): backward runs through it and
// writes no gradient anywhere.
static void test_frozen(void) {
    dc_backend *be = dc_backend_cpu_create();
    const dc_clip_text_config c = {V, T, W, L, H, F, DC_ACT_QUICK_GELU, 1e-5f};
    dc_clip_text *m = NULL;
    int32_t hid[B * T];
    for (int j = 0; j < B * T; j++) hid[j] = j % V;
    float *h = malloc((size_t)B * T * W * 4);
    for (int j = 0; j < B * T * W; j++) h[j] = dc_randn_at(3, 0, 0, 0, (uint32_t)j);
    dc_buf ids = {be->alloc(be, sizeof hid), DC_I32}, hidden = {be->alloc(be, (size_t)B * T * W * 4), DC_F32};
    dc_buf dout = test_buf_up(be, h, (int64_t)B * T * W, DC_F32);
    be->upload(be, ids.p, hid, sizeof hid);
    int rc = dc_clip_text_create(&m, &c, be, DC_F32);
    if (!rc) {  // random weights into the frozen arena
        const dc_params *ps = m->params;
        float *w = malloc((size_t)ps->frozen_numel * 4);
        for (int64_t j = 0; j < ps->frozen_numel; j++) w[j] = 0.2f * dc_randn_at(4, 0, 0, 0, (uint32_t)j);
        be->upload(be, ps->frozen.p, w, (size_t)ps->frozen_numel * 4);
        free(w);
    }
    CHECK(!rc && dc_clip_text_backward(m, dout) != 0, "backward before a training forward is refused");
    rc = rc ? rc : dc_clip_text_train_reserve(m, B);
    rc = rc ? rc : dc_clip_text_train_forward(m, hidden, ids, B, 0);
    rc = rc ? rc : dc_clip_text_backward(m, dout);
    CHECK(rc == 0 && m->params->numel == 0 && !m->params->grad.p, "a frozen encoder's backward: %s",
          rc ? dc_error() : "ok");
    CHECK(dc_clip_text_train_forward(m, hidden, ids, B + 1, 0) != 0, "a batch over the reserved one is refused");
    be->free(be, ids.p), be->free(be, hidden.p), be->free(be, dout.p), free(h);
    dc_clip_text_free(m);
    dc_backend_destroy(be);
}

static void test_gpu(const char *name) {
    dc_backend *gpu = NULL;
    if (dc_backend_create(name, &gpu)) {
        printf("SKIP (no GPU) no %s backend (%s)\n", name, dc_error());
        return;
    }
    for (int k = 0; k < 2; k++) {
        const dc_act act = k ? DC_ACT_GELU_ERF : DC_ACT_QUICK_GELU;
        rig rc, rg;
        if (rig_open(&rc, dc_backend_cpu_create(), act, k, 9) || rig_open(&rg, gpu, act, k, 9)) {
            CHECK(0, "%s: %s", name, dc_error());
            return;
        }
        float *gc = grads(&rc, 1), *gg = grads(&rg, 1);
        // relative to each tensor's gradient norm: fp32 differs in summation
        // order only; bf16 rounds every activation to 8 bits
        const double tol = gpu->compute == DC_F32 ? 1e-3 : 5e-2;
        char label[64];
        snprintf(label, sizeof label, "skip %d on %s", k, name);
        const int bad = gc && gg ? param_gpu_gaps(rc.m->params, gg, gc, tol, label) : -1;
        CHECK(gc && gg && bad == 0, "%s: %d tensors off", name, bad);
        free(gc), free(gg);
        dc_backend *cpu = rc.be;
        rig_close(&rc), rig_close(&rg);
        dc_backend_destroy(cpu);
    }
    dc_backend_destroy(gpu);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("GPU against CPU (%s)\n", argv[1]);
        test_gpu(argv[1]);
    } else {
        printf("finite differences\n");
        test_cpu(DC_ACT_QUICK_GELU, 0);
        test_cpu(DC_ACT_GELU_ERF, 1);
        printf("frozen encoder\n");
        test_frozen();
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
