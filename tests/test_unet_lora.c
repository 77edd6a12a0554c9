// LoRAs of an SD UNet at run time and in training (nn/adapter.h,
// models/lora_model.h, models/sd_lora.h), on the CPU in fp32, over the tiny
// SD 1.x UNet of tests/golden/sd/sd1 (1x1 proj_in, channels-last convolutions):
//  - the targets: attn, transformer and all adapt the layers kohya and
//    diffusers name, counted from the model's own parameters;
//  - a random LoRA on every target (some of q | k | v and k | v adapted
//    alone, which the UNet then runs apart; the GEGLU's product; the time
//    projections; the resnets' convolutions) applied at run time gives the
//    output of the same LoRA merged into the weights: an inference forward
//    with a guided pair and the text prepared, and a training forward
//    through the frozen UNet;
//  - training: the factors' gradients through the frozen UNet against
//    central differences of the loss (param_fd.h), every factor, and
//    against their closed form from the adapted weights' gradients (dup =
//    s dW down^T, ddown = s up^T dW); the frozen weights take none;
//    init_weights gives the base model's output;
//  - the text encoder's LoRA (attention and MLP) at run time against merged;
//  - a LoRA of the UNet and the text encoder together (the joint model):
//    through the frozen joint model, the factor gradients of the trainable
//    one, bit for bit, and their closed form in both parts;
//  - kohya's file and diffusers': written, their keys (and kohya's
//    metadata) as those tools write them, read back (dc_sd_lora_read) and
//    merged into an inference UNet, the output of the trained run-time LoRA.
// With an argument (cuda, cuda-fp32): the wrapper's output and factor
// gradients on that GPU backend against the CPU's (skips without a GPU).
//
//   build/tests/test_unet_lora [backend]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf_up.h"
#include "check.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/clip_text.h"
#include "models/lora_model.h"
#include "models/sd_lora.h"
#include "io/json.h"
#include "models/unet.h"
#include "models/unet_text.h"
#include "param_fd.h"
#include "backend/backend.h"
#include "tmpdir.h"

#define GOLD "tests/golden/sd/sd1"
#define SIDE 16
#define LEN 12

static dc_backend *g_be;
static dc_unet_config g_cfg;
static dc_st_file g_wf;

typedef struct {
    dc_buf x, t, ctx, out, dout;
    float *hdout;
    int64_t n;
    int B;
} inputs;

static float *randn_host(int64_t n, uint64_t seed, float scale) {
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t j = 0; j < n; j++) h[j] = scale * dc_randn_at(seed, 0, 0, 0, (uint32_t)j);
    return h;
}

// B images of noise, timesteps, text and a random dL/dout.
static void inputs_make(inputs *in, int B) {
    in->B = B, in->n = (int64_t)B * 4 * SIDE * SIDE;
    float *hx = randn_host(in->n, 1, 1), *hc = randn_host((int64_t)B * LEN * g_cfg.ctx_dim, 2, 1);
    float ht[2] = {321.0f, 321.0f};
    if (B == 2) memcpy(hx + in->n / 2, hx, (size_t)in->n / 2 * 4);  // a guided pair: the same x and t
    in->x = test_buf_up(g_be, hx, in->n, DC_F32), in->t = test_buf_up(g_be, ht, B, DC_F32);
    in->ctx = test_buf_up(g_be, hc, (int64_t)B * LEN * g_cfg.ctx_dim, DC_F32);
    in->hdout = randn_host(in->n, 3, 1);
    in->dout = test_buf_up(g_be, in->hdout, in->n, DC_F32);
    in->out = (dc_buf){g_be->alloc(g_be, (size_t)in->n * 4), DC_F32};
    free(hx), free(hc);
}

static void inputs_free(inputs *in) {
    dc_buf *b[] = {&in->x, &in->t, &in->ctx, &in->out, &in->dout};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) g_be->free(g_be, b[i]->p);
    free(in->hdout);
}

static dc_cond cond_of(const inputs *in, int pairs) {
    return (dc_cond){.ctx = in->ctx, .len = LEN, .dim = g_cfg.ctx_dim, .pairs = pairs};
}

// The tiny UNet with the golden weights: for inference, or to train through.
enum { INFER, FROZEN_TRAIN, TRAIN };
static dc_model *unet_open(int mode) {
    dc_model *m = NULL;
    dc_weights w = {.files = &g_wf, .nfiles = 1, .prefix = "model.diffusion_model."};
    int rc = mode == FROZEN_TRAIN ? dc_unet_new_frozen_train(&g_cfg, g_be, DC_F32, SIDE, SIDE, &m)
             : mode == TRAIN      ? dc_unet_new_train(&g_cfg, g_be, DC_GRAD_BUFFER, SIDE, SIDE, &m)
                                  : dc_unet_new(&g_cfg, g_be, DC_F32, SIDE, SIDE, &m);
    if (!rc) rc = dc_unet_load(m, &w, DC_NAMES_ORIGINAL);
    if (rc) printf("set-up: %s\n", dc_error()), dc_model_free(m), m = NULL;
    return m;
}

// Random factors for every item of l (allocated): the deltas are not small.
static void randomize(dc_lora *l, uint64_t seed) {
    for (int i = 0; i < l->params.count; i++) {
        const dc_param *p = &l->params.items[i];
        float *h = randn_host(p->numel, seed * 1000 + (uint64_t)i, 0.1f);
        g_be->upload(g_be, dc_param_data(&l->params, i).p, h, (size_t)p->numel * 4);
        free(h);
    }
    dc_params_touch(&l->params);
}

// The same factors in l as in src (the same items, in order).
static void copy_factors(dc_lora *l, const dc_lora *src) {
    for (int i = 0; i < l->params.count; i++)
        g_be->copy(g_be, dc_param_data(&l->params, i).p, dc_param_data(&src->params, i).p,
                   (size_t)l->params.items[i].numel * 4);
    dc_params_touch(&l->params);
}

static float *download(dc_buf b, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    g_be->download(g_be, h, b.p, (size_t)n * 4);
    return h;
}

// ||a - b|| / ||b||, NaN-failing.
static double rel_err(const float *a, const float *b, int64_t n) {
    double d = 0, nb = 0;
    for (int64_t j = 0; j < n; j++) d += ((double)a[j] - b[j]) * ((double)a[j] - b[j]), nb += (double)b[j] * b[j];
    const double e = sqrt(d / (nb + 1e-30));
    return e == e ? e : INFINITY;
}

static float *forward(dc_model *m, const inputs *in, int pairs, bool prepare) {
    const dc_cond c = cond_of(in, pairs);
    if (dc_model_reserve(m, in->B) || (prepare && dc_unet_prepare_text(m, &c, in->B)) ||
        dc_model_forward(m, in->out, in->x, in->t, &c, in->B)) {
        printf("  forward: %s\n", dc_error());
        return NULL;
    }
    return download(in->out, in->n);
}

static int count_named(const dc_params *ps, const char *part) {
    int n = 0;
    for (int i = 0; i < ps->count; i++) n += strstr(ps->items[i].name, part) != NULL;
    return n;
}

static void test_targets(void) {
    dc_model *u = unet_open(INFER);
    if (!u) {
        CHECK(0, "targets: %s", dc_error());
        return;
    }
    const int nt = count_named(u->params, "attn1.to_q.weight"), nr = count_named(u->params, "time_emb_proj.weight");
    const int nsc = count_named(u->params, "conv_shortcut.weight"), nsamp = count_named(u->params, "samplers.0.conv.weight");
    const int want[3] = {8 * nt, 12 * nt, 12 * nt + 3 * nr + nsc + nsamp};
    for (int t = DC_LORA_ATTN; t <= DC_LORA_ALL; t++) {
        dc_lora l;
        dc_lora_init(&l, u->params);
        const int rc = dc_sd_lora_add_targets(&l, DC_LORA_UNET, (dc_lora_targets)t, 4, 4);
        CHECK(rc == 0 && l.count == want[t], "targets %s: %d layers, want %d (%s)", dc_lora_targets_name(t), l.count,
              want[t], rc ? dc_error() : "");
        dc_lora_free(&l);
    }
    dc_lora_targets t;
    CHECK(dc_lora_targets_parse("convs", &t) != 0 && strstr(dc_error(), "attn, transformer or all"),
          "an unknown target refused: '%s'", dc_error());
    dc_model_free(u);
}

// A LoRA over m's parameters on every "all" target but v1's and k2's (so
// that q | k | v and k | v are adapted in part), rank 3, alpha 6.
static int lora_make(dc_lora *l, dc_model *m) {
    dc_lora all;
    dc_lora_init(&all, m->params), dc_lora_init(l, m->params);
    int rc = dc_sd_lora_add_targets(&all, DC_LORA_UNET, DC_LORA_ALL, 3, 6.0f);
    for (int i = 0; !rc && i < all.count; i++) {
        const char *name = m->params->items[all.items[i].param].name;
        if (strstr(name, "attn1.to_v") || strstr(name, "attn2.to_k")) continue;
        char mod[DC_PARAM_NAME_MAX];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(name) - 7), name);
        rc = dc_lora_add(l, all.items[i].param, mod, 3, 6.0f);
    }
    dc_lora_free(&all);
    return rc;
}

typedef struct {
    dc_model *m;
    inputs *in;
} fd_ctx;

static double fd_loss(void *c) {
    fd_ctx *f = c;
    const dc_cond cd = cond_of(f->in, 0);
    return param_fd_model_loss(f->m, f->in->out, f->in->x, f->in->t, &cd, f->in->B, f->in->hdout, f->in->n);
}

static void fd_put(void *c, int i, const float *h, int64_t n) {
    fd_ctx *f = c;
    g_be->upload(g_be, dc_param_data(f->m->params, i).p, h, (size_t)n * 4);
    dc_params_touch(f->m->params);
}

// Parameter i of ps (its gradient if grad, else its values) in PyTorch's order.
static double *param_host(const dc_params *ps, int i, bool grad) {
    const dc_param *p = &ps->items[i];
    float *h = download(grad ? dc_param_grad(ps, i) : dc_param_data(ps, i), p->numel);
    dc_param_from_stored(p, h);
    double *d = malloc((size_t)p->numel * sizeof *d);
    for (int64_t j = 0; j < p->numel; j++) d[j] = h[j];
    free(h);
    return d;
}

// The worst error of l's factor gradients against their closed form from
// the gradients of the weights they adapt (ps, after a backward): with W' =
// W + s up down, dL/dup = s dW down^T and dL/ddown = s up^T dW, conv kernels
// as [out, ci k k].
static double closed_form_worst(const dc_params *ps, const dc_lora *l) {
    double worst = 0;
    for (int k = 0; k < l->count; k++) {
        const dc_lora_item *it = &l->items[k];
        const dc_param *w = &ps->items[it->param];
        const int64_t out = w->shape[0], K = w->numel / out, r = it->rank;
        double *dW = param_host(ps, it->param, true), *down = param_host(&l->params, it->down, false);
        double *up = param_host(&l->params, it->up, false), *gd = param_host(&l->params, it->down, true);
        double *gu = param_host(&l->params, it->up, true);
        const double sc = it->alpha / r * l->multiplier;
        double e2 = 0, n2 = 0;
        for (int64_t o = 0; o < out; o++)
            for (int64_t j = 0; j < r; j++) {  // dup[o, j] = s sum_q dW[o, q] down[j, q]
                double want = 0;
                for (int64_t q = 0; q < K; q++) want += dW[o * K + q] * down[j * K + q];
                want *= sc, e2 += (gu[o * r + j] - want) * (gu[o * r + j] - want), n2 += want * want;
            }
        for (int64_t j = 0; j < r; j++)
            for (int64_t q = 0; q < K; q++) {  // ddown[j, q] = s sum_o up[o, j] dW[o, q]
                double want = 0;
                for (int64_t o = 0; o < out; o++) want += up[o * r + j] * dW[o * K + q];
                want *= sc, e2 += (gd[j * K + q] - want) * (gd[j * K + q] - want), n2 += want * want;
            }
        const double e = sqrt(e2 / (n2 + 1e-30));
        if (!(e <= worst)) worst = e;
        free(dW), free(down), free(up), free(gd), free(gu);
    }
    return worst;
}

// The factors' gradients against their closed form (a trainable UNet with
// the LoRA at run time, whose weight gradients are the UNet backward's,
// held against differences in test_unet_grad).
static void test_closed_form(const dc_lora *trained, const inputs *in) {
    dc_model *u = unet_open(TRAIN);
    dc_lora l;
    int rc = u ? lora_make(&l, u) || dc_lora_alloc(&l, g_be, true) : -1;
    if (rc) {
        CHECK(0, "closed form set-up: %s", dc_error());
        dc_model_free(u);
        return;
    }
    copy_factors(&l, trained);
    dc_lora_attach(&l);
    g_be->zero(g_be, l.params.grad.p, (size_t)l.params.numel * 4);
    const dc_cond c = cond_of(in, 0);
    float *g = dc_model_reserve(u, 1) ? NULL
               : param_fd_model_grads(u, in->out, in->x, in->t, &c, 1, in->hdout, in->dout, in->n);
    const double worst = g ? closed_form_worst(u->params, &l) : INFINITY;
    printf("  closed form: worst factor gradient error %.2e over %d layers\n", worst, l.count);
    CHECK(g && worst < 1e-4, "factor gradients against their closed form from dW: worst %.2e", worst);
    free(g);
    dc_lora_free(&l);
    dc_model_free(u);
}

// A LoRA of the UNet and the text encoder trained together (the joint
// model, models/unet_text.h), random weights: through the frozen joint model
// (the LoRA wrapper) the factors' gradients are those of the same LoRA on
// the trainable joint model, and there they have their closed form from the
// adapted weights' gradients, in both parts.
static void test_joint(void) {
    dc_clip_text_config tc;
    dc_json_doc doc;
    int rc = dc_json_read_file(&doc, GOLD "/diffusers/text_encoder/config.json");
    if (!rc) rc = dc_clip_text_config_from_json(&tc, doc.root, "text_encoder/config.json"), dc_json_free(&doc);
    dc_model *tr = NULL, *fz = NULL, *wr = NULL;
    dc_lora lt, lf;
    if (!rc) rc = dc_unet_text_new_train(&g_cfg, &tc, g_be, DC_GRAD_BUFFER, SIDE, SIDE, &tr) ||
                  dc_unet_text_new_frozen_train(&g_cfg, &tc, g_be, DC_F32, SIDE, SIDE, &fz) ||
                  dc_model_init_weights(tr, 3) || dc_model_init_weights(fz, 3);
    for (int k = 0; k < 2 && !rc; k++) {
        dc_lora *l = k ? &lf : &lt;
        dc_lora_init(l, (k ? fz : tr)->params);
        rc = dc_sd_lora_add_targets(l, DC_LORA_UNET, DC_LORA_TRANSFORMER, 3, 6.0f) ||
             dc_sd_lora_add_targets(l, DC_LORA_TEXT, DC_LORA_TRANSFORMER, 3, 6.0f);
    }
    if (!rc) rc = dc_lora_alloc(&lt, g_be, true) || dc_lora_model_new(fz, &lf, NULL, &wr);
    fz = NULL;  // the wrapper's
    if (rc) {
        CHECK(0, "joint set-up: %s", dc_error());
        dc_model_free(tr), dc_model_free(wr);
        return;
    }
    dc_lora *lw = dc_lora_model_lora(wr);
    randomize(&lt, 13), randomize(lw, 13);
    dc_lora_attach(&lt);
    int ntext = 0;
    for (int i = 0; i < lt.count; i++) ntext += !strncmp(tr->params->items[lt.items[i].param].name, "text_encoder.", 13);
    CHECK(ntext == 6 * tc.layers, "the text encoder's layers adapted: %d, want %d", ntext, 6 * tc.layers);
    inputs in;
    inputs_make(&in, 1);
    int32_t ids[77];
    for (int j = 0; j < tc.positions && j < 77; j++) ids[j] = (int32_t)(dc_rand_u32_at(7, 0, 0, 0, (uint32_t)j) % tc.vocab);
    dc_buf id = {g_be->alloc(g_be, sizeof(int32_t) * (size_t)tc.positions), DC_I32};
    g_be->upload(g_be, id.p, ids, sizeof(int32_t) * (size_t)tc.positions);
    const dc_cond c = {.ids = id, .len = tc.positions};
    float *gt = NULL, *gw = NULL;
    g_be->zero(g_be, lt.params.grad.p, (size_t)lt.params.numel * 4);
    if (!dc_model_reserve(tr, 1) && !dc_model_reserve(wr, 1)) {
        gt = param_fd_model_grads(tr, in.out, in.x, in.t, &c, 1, in.hdout, in.dout, in.n);
        gw = param_fd_model_grads(wr, in.out, in.x, in.t, &c, 1, in.hdout, in.dout, in.n);
    }
    float *ft = gt ? download(lt.params.grad, lt.params.numel) : NULL;
    CHECK(ft && gw && lt.params.numel == lw->params.numel && !memcmp(ft, gw, (size_t)lt.params.numel * 4),
          "through frozen weights: the factors' gradients of the trainable joint model, bit for bit");
    const double worst = gt ? closed_form_worst(tr->params, &lt) : INFINITY;
    printf("  joint model: worst factor gradient error %.2e against the closed form over %d layers (%d of the "
           "text encoder)\n", worst, lt.count, ntext);
    CHECK(gt && worst < 1e-4, "joint model: factor gradients against their closed form: worst %.2e", worst);
    free(gt), free(gw), free(ft);
    g_be->free(g_be, id.p);
    inputs_free(&in);
    dc_lora_free(&lt);
    dc_model_free(tr), dc_model_free(wr);
}

static void test_lora(void) {
    inputs pair, one;
    inputs_make(&pair, 2), inputs_make(&one, 1);
    dc_model *inf = unet_open(INFER), *fr = unet_open(FROZEN_TRAIN), *tm = NULL;
    dc_lora li, lt;
    int rc = inf && fr ? 0 : -1;
    if (!rc) rc = lora_make(&li, inf) || dc_lora_alloc(&li, g_be, false);
    if (!rc) rc = lora_make(&lt, fr) || dc_lora_model_new(fr, &lt, NULL, &tm);
    fr = NULL;  // the wrapper owns it now
    if (rc) {
        CHECK(0, "LoRA set-up: %s", dc_error());
        dc_model_free(inf), dc_model_free(tm);
        return;
    }
    dc_lora *tl = dc_lora_model_lora(tm);
    printf("  %d layers adapted, %lld factor values\n", tl->count, (long long)tl->params.numel);

    // init: up zero, so the wrapper's forward is the frozen base's
    float *base = forward(inf, &one, 0, false);
    CHECK(dc_model_init_weights(tm, 5) == 0, "init: %s", dc_error());
    float *init = forward(tm, &one, 0, false);
    CHECK(base && init && rel_err(init, base, one.n) < 1e-6, "initialised LoRA: the base's output, err %.2e",
          base && init ? rel_err(init, base, one.n) : -1.0);
    free(init);

    // run time against merged: inference (guided pair, text prepared) and training
    randomize(tl, 9);
    copy_factors(&li, tl);
    dc_lora_attach(&li);
    float *rt_pair = forward(inf, &pair, 1, true), *rt_one = forward(inf, &one, 0, false);
    float *tr_one = forward(tm, &one, 0, false);
    dc_lora_detach(&li);
    CHECK(dc_lora_merge(&li) == 0, "merge: %s", dc_error());
    float *mg_pair = forward(inf, &pair, 1, true), *mg_one = forward(inf, &one, 0, false);
    const bool got = rt_pair && rt_one && tr_one && mg_pair && mg_one && base;
    CHECK(got && rel_err(rt_pair, mg_pair, pair.n) < 1e-5, "guided pair, text prepared: run time against merged %.2e",
          got ? rel_err(rt_pair, mg_pair, pair.n) : -1.0);
    CHECK(got && rel_err(rt_one, mg_one, one.n) < 1e-5, "inference: run time against merged %.2e",
          got ? rel_err(rt_one, mg_one, one.n) : -1.0);
    CHECK(got && rel_err(tr_one, mg_one, one.n) < 1e-5, "training forward against merged %.2e",
          got ? rel_err(tr_one, mg_one, one.n) : -1.0);
    CHECK(got && rel_err(mg_one, base, one.n) > 1e-2, "the LoRA changes the output (%.2e)",
          got ? rel_err(mg_one, base, one.n) : -1.0);
    free(rt_pair), free(rt_one), free(tr_one), free(mg_pair);

    // gradients of every factor against central differences
    const dc_cond c1 = cond_of(&one, 0);
    float *g = param_fd_model_grads(tm, one.out, one.x, one.t, &c1, 1, one.hdout, one.dout, one.n);
    fd_ctx f = {tm, &one};
    double worst = 0;
    int bad = 0, worst_i = 0;
    for (int i = 0; g && i < tl->params.count; i++) {
        const param_fd r = param_fd_check(g_be, tm->params, i, g, 5e-2, fd_loss, fd_put, &f);
        if (!(r.err < 3e-2) && bad++ < 12)
            printf("  %s: differences %.6g, backward %.6g (err %.2e)\n", tm->params->items[i].name, r.fd, r.an, r.err);
        if (!(r.err <= worst)) worst = r.err, worst_i = i;
    }
    printf("  factor gradients: worst error against the differences %.2e (%s; tolerance 3e-2)\n", worst,
           tm->params->items[worst_i].name);
    CHECK(g && bad == 0, "factor gradients against differences: %d of %d off, worst %.2e", bad, tl->params.count,
          worst);
    CHECK(dc_lora_model_inner(tm)->params->grad.p == NULL, "the frozen UNet holds no gradient");
    free(g);
    test_closed_form(tl, &one);

    // kohya's file: keys, metadata, read back and merged
    const char *path = tmp_path("lora.safetensors");
    dc_kv meta = {0};
    dc_kv_set(&meta, "ss_v2", "False");
    CHECK(dc_sd_lora_write(path, tl, NULL, DC_LORA_FILE_KOHYA, &meta, DC_F32) == 0, "write: %s", dc_error());
    dc_st_file lf;
    if (dc_st_open(&lf, path) == 0) {
        const char *k = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
        char name[200];
        snprintf(name, sizeof name, "%s.lora_down.weight", k);
        const dc_st_tensor *d = dc_st_find(&lf, name);
        snprintf(name, sizeof name, "%s.alpha", k);
        const dc_st_tensor *a = dc_st_find(&lf, name);
        float alpha = 0;
        CHECK(d && d->ndim == 2 && d->shape[0] == 3 && a && a->ndim == 0 && dc_st_read_f32(&lf, a, &alpha) == 0 &&
                  alpha == 6.0f, "kohya's keys: %s.lora_down.weight [3, in] and a scalar alpha 6", k);
        CHECK(lf.count == 3 * tl->count, "kohya's file: %d tensors for %d layers", lf.count, tl->count);
        const char *dim = dc_st_meta(&lf, "ss_network_dim"), *al = dc_st_meta(&lf, "ss_network_alpha");
        const char *v2 = dc_st_meta(&lf, "ss_v2");
        CHECK(dim && !strcmp(dim, "3") && al && !strcmp(al, "6") && v2 && !strcmp(v2, "False"),
              "kohya's metadata: ss_network_dim %s, ss_network_alpha %s, ss_v2 %s", dim ? dim : "-", al ? al : "-",
              v2 ? v2 : "-");
        // diffusers' form: alpha / rank folded into up, no alpha tensors
        const char *pd = tmp_path("diffusers.safetensors");
        CHECK(dc_sd_lora_write(pd, tl, NULL, DC_LORA_FILE_DIFFUSERS, NULL, DC_F32) == 0, "write: %s", dc_error());
        dc_st_file df;
        const bool dok = dc_st_open(&df, pd) == 0;
        CHECK(dok && df.count == 2 * tl->count &&
                  dc_st_find(&df, "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora.down.weight"),
              "diffusers' keys: unet.<path>.lora.down.weight, two tensors a layer");
        for (int f = 0; f < 2; f++) {
            dc_model *again = unet_open(INFER);
            dc_lora lr;
            dc_lora_init(&lr, again ? again->params : NULL);
            int r2 = again && (f == 0 || dok) ? dc_sd_lora_read(f == 0 ? &lf : &df, &lr, NULL) : -1;
            if (!r2) r2 = dc_lora_merge(&lr);
            float *back = r2 ? NULL : forward(again, &one, 0, false);
            // the trained run-time output was mg_one's (the same factors)
            CHECK(back && rel_err(back, mg_one, one.n) < 1e-5, "%s's file read and merged: the trained output, err %.2e",
                  f == 0 ? "kohya" : "diffusers", back ? rel_err(back, mg_one, one.n) : -1.0);
            free(back);
            dc_lora_free(&lr);
            dc_model_free(again);
        }
        if (dok) dc_st_close(&df);
        dc_st_close(&lf);
    } else {
        CHECK(0, "open the written file: %s", dc_error());
    }
    dc_kv_free(&meta);
    free(mg_one), free(base);
    dc_lora_free(&li);
    dc_model_free(inf), dc_model_free(tm);
    inputs_free(&pair), inputs_free(&one);
}

// The text encoder the same way: a random LoRA on every transformer target
// (attention and MLP) at run time against merged, over hidden and the
// penultimate stream.
static void test_text(void) {
    const dc_clip_text_config tc = {64, 8, 32, 2, 2, 48, DC_ACT_QUICK_GELU, 1e-5f};
    dc_clip_text *te = NULL;
    dc_lora l;
    int rc = dc_clip_text_create(&te, &tc, g_be, DC_F32) || dc_clip_text_init_weights(te, 4);
    if (!rc) dc_lora_init(&l, te->params);
    if (!rc) rc = dc_sd_lora_add_targets(&l, DC_LORA_TEXT, DC_LORA_TRANSFORMER, 3, 6.0f) || dc_lora_alloc(&l, g_be, false);
    if (rc) {
        CHECK(0, "text set-up: %s", dc_error());
        dc_clip_text_free(te);
        return;
    }
    CHECK(l.count == 6 * tc.layers, "text targets: %d layers, want 6 a layer", l.count);
    randomize(&l, 11);
    const int B = 2, T = tc.positions;
    int32_t ids[2 * 8];
    for (int j = 0; j < B * T; j++) ids[j] = (j * 7 + 3) % tc.vocab;
    dc_buf id = {g_be->alloc(g_be, sizeof ids), DC_I32};
    g_be->upload(g_be, id.p, ids, sizeof ids);
    const int64_t n = (int64_t)B * T * tc.width;
    dc_buf h = {g_be->alloc(g_be, (size_t)n * 4), DC_F32}, pen = {g_be->alloc(g_be, (size_t)n * 4), DC_F32};
    float *got[2][2] = {{0}};
    for (int merged = 0; merged < 2; merged++) {
        if (merged) dc_lora_detach(&l), rc = dc_lora_merge(&l);
        else dc_lora_attach(&l);
        if (!rc) rc = dc_clip_text_reserve(te, B) || dc_clip_text_forward(te, h, pen, id, B, 0);
        if (!rc) got[merged][0] = download(h, n), got[merged][1] = download(pen, n);
    }
    CHECK(!rc && rel_err(got[0][0], got[1][0], n) < 1e-5 && rel_err(got[0][1], got[1][1], n) < 1e-5,
          "text encoder: run time against merged %.2e (hidden), %.2e (penultimate)",
          rc ? -1.0 : rel_err(got[0][0], got[1][0], n), rc ? -1.0 : rel_err(got[0][1], got[1][1], n));
    for (int i = 0; i < 2; i++) free(got[i][0]), free(got[i][1]);
    g_be->free(g_be, id.p), g_be->free(g_be, h.p), g_be->free(g_be, pen.p);
    dc_lora_free(&l);
    dc_clip_text_free(te);
}

// One forward and backward of the LoRA wrapper on backend be (its inputs and
// factors the same on every backend): the output and the factors' gradients
// (the LoRA set's flat layout) on the host; *ps the set, for names.
static int wrapper_run(dc_backend *be, float **out, float **g, dc_model **keep) {
    g_be = be;
    inputs in;
    inputs_make(&in, 1);
    if (be->compute != DC_F32) {  // the text in the compute dtype, as a pipeline gives it
        float *hc = download(in.ctx, (int64_t)LEN * g_cfg.ctx_dim);
        be->free(be, in.ctx.p);
        in.ctx = test_buf_up(be, hc, (int64_t)LEN * g_cfg.ctx_dim, be->compute);
        free(hc);
    }
    dc_model *fr = unet_open(FROZEN_TRAIN), *tm = NULL;
    dc_lora l;
    int rc = fr ? lora_make(&l, fr) || dc_lora_model_new(fr, &l, NULL, &tm) : -1;
    if (!rc) {
        randomize(dc_lora_model_lora(tm), 9);
        const dc_cond c = cond_of(&in, 0);
        rc = dc_model_reserve(tm, 1);
        *g = rc ? NULL : param_fd_model_grads(tm, in.out, in.x, in.t, &c, 1, in.hdout, in.dout, in.n);
        *out = *g ? download(in.out, in.n) : NULL;
        rc = *g ? 0 : -1;
    }
    inputs_free(&in);
    *keep = tm;
    return rc;
}

// The wrapper on a GPU against the CPU: the output and every factor's
// gradient, relative to its norm (fp32: the order of sums; bf16: every
// activation and the frozen weights rounded to 8 bits).
static void test_gpu(const char *name) {
    dc_backend *gpu = NULL, *cpu = dc_backend_cpu_create();
    if (dc_backend_create(name, &gpu)) {
        printf("SKIP (no GPU) no %s backend (%s)\n", name, dc_error());
        dc_backend_destroy(cpu);
        return;
    }
    float *oc = NULL, *gc = NULL, *og = NULL, *gg = NULL;
    dc_model *mc = NULL, *mg = NULL;
    const int rc = wrapper_run(cpu, &oc, &gc, &mc) || wrapper_run(gpu, &og, &gg, &mg);
    const double tol = gpu->compute == DC_F32 ? 1e-3 : 8e-2;
    const int64_t n = (int64_t)4 * SIDE * SIDE;
    CHECK(!rc && rel_err(og, oc, n) < tol / 4, "%s: the output against the CPU's %.2e", name,
          rc ? -1.0 : rel_err(og, oc, n));
    char label[64];
    snprintf(label, sizeof label, "LoRA factors on %s", name);
    const int bad = rc ? -1 : param_gpu_gaps(mc->params, gg, gc, tol, label);
    CHECK(bad == 0, "%s: %d factor gradients off", name, bad);
    free(oc), free(gc), free(og), free(gg);
    g_be = gpu, dc_model_free(mg);
    g_be = cpu, dc_model_free(mc);
    dc_backend_destroy(gpu), dc_backend_destroy(cpu);
}

int main(int argc, char **argv) {
    if (argc > 1) {  // GPU against CPU
        if (dc_unet_config_from_json_file(&g_cfg, GOLD "/diffusers/unet/config.json") ||
            dc_st_open(&g_wf, GOLD "/single.safetensors")) {
            printf("FAIL set-up: %s\n", dc_error());
            return 1;
        }
        g_cfg.groups = 8;
        test_gpu(argv[1]);
        dc_st_close(&g_wf);
        printf("%d passed, %d failed\n", g_pass, g_fail);
        return g_fail != 0;
    }
    if (tmpdir_make("unet_lora")) return 1;
    g_be = dc_backend_cpu_create();
    if (dc_unet_config_from_json_file(&g_cfg, GOLD "/diffusers/unet/config.json") ||
        dc_st_open(&g_wf, GOLD "/single.safetensors")) {
        printf("FAIL set-up: %s\n", dc_error());
        return 1;
    }
    // 8 groups of 4 channels: with the config's 32 of one, GroupNorm takes
    // out whatever the time projections add, and their gradients are zero
    g_cfg.groups = 8;
    test_targets();
    test_lora();
    test_text();
    test_joint();
    dc_st_close(&g_wf);
    dc_backend_destroy(g_be);
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
