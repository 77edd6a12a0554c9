// A UNet trained with its text encoder (models/unet_text.h), on the tiny SD
// 1.x set of tests/golden/sd (its UNet with GroupNorms of 8 groups, its
// CLIP text encoder of width 128 and 3 layers), random token ids and a
// random loss direction:
//
// - Composition: the joint model's output equals the UNet run on the text
//   encoder's output for the same ids (each model on its own), and its
//   gradients are theirs: the UNet's, and the encoder's from the text's
//   gradient the UNet's backward leaves.
// - Finite differences: for every parameter tensor of the encoder and the
//   UNet's input and output layers, the directional derivative of L = sum(dout * out) along a
//   random direction, by central differences of the fp32 forward, against
//   the backward's.
// - One set: the UNet's names, then "text_encoder." + the encoder's; the
//   UNet's units and one more for the encoder, each announced once by
//   backward; the config entries carry the encoder's config back.
// - A layout (no backend) sizes the activations: the UNet's and the encoder's.
//
// Usage: test_unet_text             the CPU checks above
//        test_unet_text cuda        the GPU's gradients against the CPU's
//        test_unet_text cuda-fp32   (bf16 and fp32 tolerances)
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
#include "io/json.h"
#include "io/safetensors.h"
#include "models/unet_text.h"
#include "nn/weights.h"

#define SET "tests/golden/sd/sd1"

typedef struct {
    dc_backend *be;
    dc_unet_config uc;
    dc_clip_text_config tc;
    dc_st_file unet_file, text_file;
    dc_model *m;          // the joint model
    dc_buf x, t, ids, out, dout;
    dc_cond cond;
    int B;
    int64_t nout;
    float *hdout;
    int32_t *hids;
} rig;

static int configs(rig *r) {
    DC_TRY(dc_unet_config_from_json_file(&r->uc, SET "/diffusers/unet/config.json"));
    r->uc.groups = 8;  // 32 groups of 32 channels would make per-channel constants vanish (test_unet_grad)
    dc_json_doc doc;
    DC_TRY(dc_json_read_file(&doc, SET "/diffusers/text_encoder/config.json"));
    int rc = dc_clip_text_config_from_json(&r->tc, doc.root, "text_encoder/config.json");
    dc_json_free(&doc);
    return rc;
}

// The golden UNet and encoder's weights into the UNet u and encoder te
// (either in a joint set or on their own).
static int load(rig *r, dc_model *u, dc_clip_text *te) {
    dc_weights uw = {.files = &r->unet_file, .nfiles = 1, .prefix = "model.diffusion_model."};
    dc_weights tw = {.files = &r->text_file, .nfiles = 1, .prefix = ""};
    snprintf(tw.prefix, sizeof tw.prefix, "%s", dc_clip_text_prefix(&tw));
    return dc_unet_load(u, &uw, DC_NAMES_ORIGINAL) || dc_clip_text_load(te, &tw, DC_NAMES_DIFFUSERS) ? -1 : 0;
}

static float *randn_host(int64_t n, uint64_t seed) {
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; h && i < n; i++) h[i] = dc_randn_at(seed, 0, 0, 0, (uint32_t)i);
    return h;
}

// B images of 16x16 with random ids of the encoder's vocabulary.
static int rig_open(rig *r, dc_backend *be, int B, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->be = be, r->B = B;
    DC_TRY(configs(r));
    DC_TRY(dc_st_open(&r->unet_file, SET "/single.safetensors"));
    DC_TRY(dc_st_open(&r->text_file, SET "/diffusers/text_encoder/model.safetensors"));
    const int side = 16, T = r->tc.positions;
    DC_TRY(dc_unet_text_new_train(&r->uc, &r->tc, be, DC_GRAD_BUFFER, side, side, &r->m));
    DC_TRY(load(r, dc_unet_text_unet(r->m), dc_unet_text_encoder(r->m)));
    r->nout = (int64_t)B * 4 * side * side;
    float *hx = randn_host(r->nout, seed + 1), ht[4] = {321.0f, 17.0f, 905.0f, 4.0f};
    r->hids = malloc(sizeof(int32_t) * (size_t)(B * T));
    for (int i = 0; i < B * T; i++) r->hids[i] = (int32_t)(dc_rand_u32_at(seed, 5, 0, 0, (uint32_t)i) % r->tc.vocab);
    r->x = test_buf_up(be, hx, r->nout, DC_F32), r->t = test_buf_up(be, ht, B, DC_F32);
    r->ids = (dc_buf){be->alloc(be, sizeof(int32_t) * (size_t)(B * T)), DC_I32};
    be->upload(be, r->ids.p, r->hids, sizeof(int32_t) * (size_t)(B * T));
    r->cond = (dc_cond){.ids = r->ids, .len = T};
    r->hdout = randn_host(r->nout, seed);
    r->dout = test_buf_up(be, r->hdout, r->nout, DC_F32);
    r->out = (dc_buf){be->alloc(be, (size_t)r->nout * 4), DC_F32};
    free(hx);
    return dc_model_reserve(r->m, B);
}

static void rig_close(rig *r) {
    dc_buf *b[] = {&r->x, &r->t, &r->ids, &r->out, &r->dout};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++)
        if (b[i]->p) r->be->free(r->be, b[i]->p);
    dc_model_free(r->m);
    dc_st_close(&r->unet_file), dc_st_close(&r->text_file);
    free(r->hdout), free(r->hids);
}

static double loss(rig *r) {
    return param_fd_model_loss(r->m, r->out, r->x, r->t, &r->cond, r->B, r->hdout, r->nout);
}

static float *grads(rig *r) {
    return param_fd_model_grads(r->m, r->out, r->x, r->t, &r->cond, r->B, r->hdout, r->dout, r->nout);
}

static double rig_loss(void *r) { return loss(r); }
static void rig_set(void *ctx, int i, const float *h, int64_t n) {
    rig *r = ctx;
    dc_params *ps = r->m->params;
    r->be->upload(r->be, dc_param_data(ps, i).p, h, (size_t)n * 4);
    dc_params_touch(ps);
}

// ---- composition -------------------------------------------------------------------------------

static double max_abs(const float *a, const float *b, int64_t n, double *scale) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), s = fmax(s, fabs((double)b[i]));
    *scale = s;
    return d;
}

static void test_composition(void) {
    rig r;
    dc_backend *be = dc_backend_cpu_create();
    if (rig_open(&r, be, 2, 3)) {
        CHECK(0, "joint model: %s", dc_error());
        return;
    }
    float *g = grads(&r);
    float *out = malloc((size_t)r.nout * 4);
    be->download(be, out, r.out.p, (size_t)r.nout * 4);
    // the same weights in a UNet and an encoder of their own
    dc_model *u = NULL;
    dc_clip_text *te = NULL;
    const int T = r.tc.positions, W = r.tc.width;
    const int64_t nctx = (int64_t)r.B * T * W;
    int rc = dc_unet_new_train(&r.uc, be, DC_GRAD_BUFFER, 16, 16, &u) || dc_clip_text_create_trainable(&te, &r.tc, be) ||
             load(&r, u, te) || dc_model_reserve(u, r.B) || dc_clip_text_train_reserve(te, r.B);
    dc_buf ctx = {be->alloc(be, (size_t)nctx * 4), DC_F32}, dctx = {be->alloc(be, (size_t)nctx * 4), DC_F32};
    dc_buf out2 = {be->alloc(be, (size_t)r.nout * 4), DC_F32};
    if (!rc) {
        be->zero(be, u->params->grad.p, (size_t)u->params->numel * 4);
        be->zero(be, te->params->grad.p, (size_t)te->params->numel * 4);
        dc_cond c = {.ctx = ctx, .len = T, .dim = W, .dctx = dctx};
        rc = dc_clip_text_train_forward(te, ctx, r.ids, r.B, 0) || dc_model_forward(u, out2, r.x, r.t, &c, r.B) ||
             dc_model_backward(u, r.dout, r.B) || dc_clip_text_backward(te, dctx);
    }
    CHECK(rc == 0 && g, "the parts on their own: %s", dc_error());
    if (rc == 0 && g) {
        float *o2 = malloc((size_t)r.nout * 4);
        be->download(be, o2, out2.p, (size_t)r.nout * 4);
        double scale, d = max_abs(out, o2, r.nout, &scale);
        CHECK(d <= 1e-6 * scale && scale > 0, "the joint output differs from the UNet's on the encoder's: %.3e of %.3e",
              d, scale);
        // the joint set: the UNet's parameters, then the encoder's
        const dc_params *ps = r.m->params, *pu = u->params, *pt = te->params;
        const int64_t nu = pu->numel, nt = pt->numel;
        float *gu = malloc((size_t)nu * 4), *gt = malloc((size_t)nt * 4);
        be->download(be, gu, pu->grad.p, (size_t)nu * 4);
        be->download(be, gt, pt->grad.p, (size_t)nt * 4);
        double su, st, du = max_abs(g, gu, nu, &su), dt = max_abs(g + nu, gt, nt, &st);
        printf("  output %.1e, UNet gradients %.1e, encoder gradients %.1e off (of %.1e, %.1e, %.1e)\n", d, du, dt,
               scale, su, st);
        CHECK(ps->numel == nu + nt && du <= 1e-6 * su && dt <= 1e-6 * st && st > 0,
              "joint gradients differ from the parts': UNet %.3e of %.3e, encoder %.3e of %.3e", du, su, dt, st);
        bool names = ps->count == pu->count + pt->count;
        for (int i = 0; names && i < ps->count; i++) {
            const char *own = i < pu->count ? pu->items[i].name : pt->items[i - pu->count].name;
            char want[DC_PARAM_NAME_MAX + 16];
            snprintf(want, sizeof want, "%s%s", i < pu->count ? "" : DC_UNET_TEXT_PREFIX, own);
            names = !strcmp(ps->items[i].name, want) && !strcmp(ps->items[i].name + ps->items[i].prefix_len, own);
        }
        CHECK(names, "the joint set's names are not the UNet's, then text_encoder. + the encoder's");
        free(o2), free(gu), free(gt);
    }
    be->free(be, ctx.p), be->free(be, dctx.p), be->free(be, out2.p);
    dc_model_free(u), dc_clip_text_free(te);
    free(g), free(out);
    rig_close(&r);
    dc_backend_destroy(be);
}

// ---- finite differences ------------------------------------------------------------------------

static void test_fd(void) {
    rig r;
    dc_backend *be = dc_backend_cpu_create();
    if (rig_open(&r, be, 1, 11)) {
        CHECK(0, "joint model: %s", dc_error());
        return;
    }
    const dc_params *ps = r.m->params;
    float *g = grads(&r);
    CHECK(g != NULL, "gradients");
    int bad = 0, checked = 0, text = 0;
    double worst = 0;
    for (int i = 0; g && i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        const bool in_text = p->prefix_len > 0;
        // every encoder tensor, through the UNet; of the UNet's (each checked
        // by test_unet_grad) its input and output layers
        if (!in_text && !strstr(p->name, "conv_in.") && !strstr(p->name, "conv_out.")) continue;
        // The key bias adds q.b to every score of a query: softmax drops it,
        // so its true gradient is 0 and differences would measure rounding.
        if (strstr(p->name, "k_proj.bias")) {
            const double all = sqrt(param_fd_dot(g, g, ps->numel)), gn = sqrt(param_fd_dot(g + p->offset, g + p->offset, p->numel));
            checked++, text++;
            if (!(gn < 1e-4 * all) && bad++ < 8) printf("  %s: |g| %.3e of a true 0\n", p->name, gn);
            continue;
        }
        const param_fd f = param_fd_check(be, ps, i, g, 1e-2, rig_loss, rig_set, &r);
        checked++, text += in_text;
        if (!(f.err < 2e-2) && bad++ < 8)
            printf("  %s: differences %.6e, backward %.6e (|g| %.3e)\n", p->name, f.fd, f.an, f.gn);
        if (!(f.err <= worst)) worst = f.err;
    }
    printf("  %d tensors (%d of the encoder), worst relative error %.2e\n", checked, text, worst);
    CHECK(g && bad == 0 && text == 4 + 16 * r.tc.layers && checked == text + 4, "%d of %d tensors' gradients off",
          bad, checked);
    free(g);
    rig_close(&r);
    dc_backend_destroy(be);
}

// ---- units, config, layout -----------------------------------------------------------------------

typedef struct {
    int begun[256], done[256], open;
    bool order_ok;
} unit_log;

static int log_unit(void *ctx, int unit, bool done) {
    unit_log *l = ctx;
    if (unit < 0 || unit >= 256) return l->order_ok = false, 0;
    if (done ? l->open != unit : l->open != -1) l->order_ok = false;
    (done ? l->done : l->begun)[unit]++;
    l->open = done ? -1 : unit;
    return 0;
}

static void test_set(void) {
    rig r;
    dc_backend *be = dc_backend_cpu_create();
    if (rig_open(&r, be, 1, 7)) {
        CHECK(0, "joint model: %s", dc_error());
        return;
    }
    dc_params *ps = r.m->params;
    // the UNet's (unet_blocks.h): conv_in with the time embedding, each
    // transformer, resnet and resampling conv, the output layers
    int unet_units = 5;  // and the mid block's transformer and two resnets
    for (int i = 0; i < r.uc.nblocks; i++)
        unet_units += (2 * r.uc.layers + 1) * (r.uc.attn[i] ? 2 : 1) + 2 * (i < r.uc.nblocks - 1);
    const int units = dc_params_unit_count(ps);
    unit_log l = {.open = -1, .order_ok = true};
    dc_param_hooks hk = {.ctx = &l, .unit = log_unit};
    float *g0 = grads(&r);
    ps->hooks = &hk;
    float *g = grads(&r);
    ps->hooks = NULL;
    bool once = true;
    for (int u = 0; u < units && u < 256; u++) once &= l.begun[u] == 1 && l.done[u] == 1;
    int64_t lo, hi;
    dc_params_unit_range(ps, units - 1, &lo, &hi);
    const int first_text = dc_params_find(ps, DC_UNET_TEXT_PREFIX "embeddings.token_embedding.weight");
    CHECK(units == unet_units + 1 && first_text >= 0 && lo == ps->items[first_text].offset && hi == ps->numel,
          "%d units (the UNet's %d and the encoder's), the last [%lld, %lld)", units, unet_units, (long long)lo,
          (long long)hi);
    CHECK(once && l.order_ok && l.open == -1, "backward announces each of %d units once, in order", units);
    CHECK(g && g0 && !memcmp(g, g0, (size_t)ps->numel * 4), "the hooks change the gradients");
    free(g), free(g0);

    // the config entries: the UNet's, and the encoder's back from them
    dc_kv kv = {0};
    dc_clip_text_config back;
    int rc = dc_model_config_to_kv(r.m, &kv);
    CHECK(rc == 0 && !strcmp(dc_kv_get(&kv, "model"), "UNet2DConditionModel") &&
              dc_unet_text_config_of((const char *const *)kv.keys, (const char *const *)kv.values, kv.n, "test",
                                     &back) == 0 &&
              !memcmp(&back, &r.tc, sizeof back),
          "the config entries do not carry the encoder's config: %s", dc_error());
    dc_kv unet_kv = {0};
    CHECK(dc_model_config_to_kv(dc_unet_text_unet(r.m), &unet_kv) == 0 &&
              dc_unet_text_config_of((const char *const *)unet_kv.keys, (const char *const *)unet_kv.values,
                                     unet_kv.n, "test", &back) == 1,
          "a UNet's entries alone say that no encoder trains");
    dc_kv_free(&kv), dc_kv_free(&unet_kv);

    // a layout sizes what reserve allocates: the UNet's and the encoder's activations, and the text between
    dc_model *lay = NULL;
    rc = dc_unet_text_new_train(&r.uc, &r.tc, NULL, DC_GRAD_BUFFER, 16, 16, &lay);
    const int64_t joint = rc ? -1 : dc_model_activation_bytes(lay, DC_F32, 4, -1, false);
    const int64_t unet = dc_model_activation_bytes(dc_unet_text_unet(r.m), DC_F32, 4, -1, false);
    const int64_t text = dc_clip_text_train_bytes(&r.tc, DC_F32, 4);
    CHECK(rc == 0 && lay->params->numel == ps->numel && !lay->params->data.p && unet > 0 && text > 0 &&
              joint == unet + text + 2 * 4LL * r.tc.positions * r.tc.width * 4,
          "a layout's activation bytes %lld: the UNet's %lld and the encoder's %lld", (long long)joint,
          (long long)unet, (long long)text);
    dc_model_free(lay);
    // an encoder whose width is not the UNet's cross-attention's is refused
    dc_clip_text_config wide = r.tc;
    wide.width *= 2;
    CHECK(dc_unet_text_new_train(&r.uc, &wide, NULL, DC_GRAD_BUFFER, 16, 16, &lay) != 0 && strstr(dc_error(), "cross-attention"),
          "an encoder of another width is refused: %s", dc_error());
    rig_close(&r);
    dc_backend_destroy(be);
}

// ---- the GPU against the CPU ----------------------------------------------------------------------

static void test_gpu(const char *name) {
    dc_backend *gpu = NULL;
    if (dc_backend_create(name, &gpu)) {
        printf("SKIP (no GPU) no %s backend (%s)\n", name, dc_error());
        return;
    }
    rig rc, rg;
    dc_backend *cpu = dc_backend_cpu_create();
    if (rig_open(&rc, cpu, 2, 9) || rig_open(&rg, gpu, 2, 9)) {
        CHECK(0, "joint model: %s", dc_error());
        return;
    }
    float *gc = grads(&rc), *gg = grads(&rg);
    // relative to each tensor's gradient norm: fp32 differs in summation order
    // only; in bf16 the UNet reads text the encoder computed in bf16 too, so
    // their roundings add up (test_unet_grad's 8e-2 for the UNet alone)
    const double tol = gpu->compute == DC_F32 ? 1e-3 : 1.2e-1;
    const int bad = gc && gg ? param_gpu_gaps(rc.m->params, gg, gc, tol, name) : -1;
    CHECK(gc && gg && bad == 0, "%s: %d tensors off", name, bad);
    free(gc), free(gg);
    rig_close(&rc), rig_close(&rg);
    dc_backend_destroy(cpu), dc_backend_destroy(gpu);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("GPU against CPU (%s)\n", argv[1]);
        test_gpu(argv[1]);
    } else {
        printf("composition\n");
        test_composition();
        printf("finite differences\n");
        test_fd();
        printf("one set: names, units, config, layout\n");
        test_set();
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
