// LoRA files against diffusers' own loader (golden files by
// tools/lora_golden.py, tests/golden/lora/README.md): one random LoRA of the
// tiny SD 1.x model in kohya's, PEFT's and the older diffusers form, on 9
// UNet layers (attention, feed-forward, 1x1-conv projections, a 3x3 conv
// (LoCon), a time projection) and 5 text encoder layers, with ranks 2-4 and
// alphas 1-8 (one missing). For each file, read as `txt2img --lora` reads it:
// - at run time, the UNet's output on io.safetensors' inputs and the text
//   encoder's last hidden state within 1e-5 of diffusers' (float64, PEFT's
//   layers at run time);
// - merged (--lora-merge), every adapted weight within 1e-6 of diffusers'
//   after fuse_lora.
// The kohya file is held to what diffusers makes of the PEFT file (the same
// factors with alpha / rank folded in): diffusers' own reading of kohya's
// alphas departs from kohya's (the README says where); the engine reads them
// as kohya and AUTOMATIC1111 do. The golden kohya results are checked to
// depart on just those layers, so the test notices if they stop to.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "io/json.h"
#include "models/clip_text.h"
#include "models/sd_lora.h"
#include "models/unet.h"
#include "nerr.h"
#include "param_host.h"

#define GOLD "tests/golden/sd/sd1"
#define LG "tests/golden/lora"

typedef struct {
    dc_backend *be;
    dc_model *unet;
    dc_clip_text *text;
    dc_st_file uf, tf, io, golden;
} rig;

static int rig_open(rig *r) {
    memset(r, 0, sizeof *r);
    r->be = dc_backend_cpu_create();
    dc_unet_config uc;
    dc_clip_text_config tc;
    dc_json_doc doc;
    DC_TRY(dc_unet_config_from_json_file(&uc, GOLD "/diffusers/unet/config.json"));
    DC_TRY(dc_json_read_file(&doc, GOLD "/diffusers/text_encoder/config.json"));
    int rc = dc_clip_text_config_from_json(&tc, doc.root, "text_encoder/config.json");
    dc_json_free(&doc);
    DC_TRY(rc);
    DC_TRY(dc_st_open(&r->uf, GOLD "/diffusers/unet/diffusion_pytorch_model.safetensors"));
    DC_TRY(dc_st_open(&r->tf, GOLD "/diffusers/text_encoder/model.safetensors"));
    DC_TRY(dc_st_open(&r->io, GOLD "/io.safetensors"));
    DC_TRY(dc_st_open(&r->golden, LG "/golden.safetensors"));
    dc_weights uw = {.files = &r->uf, .nfiles = 1}, tw = {.files = &r->tf, .nfiles = 1};
    snprintf(tw.prefix, sizeof tw.prefix, "%s", dc_clip_text_prefix(&tw));
    // fp32 weights: the BF16 values exactly, merged without rounding to BF16
    DC_TRY(dc_unet_new(&uc, r->be, DC_F32, 16, 16, &r->unet));
    DC_TRY(dc_unet_load(r->unet, &uw, DC_NAMES_DIFFUSERS));
    DC_TRY(dc_clip_text_create(&r->text, &tc, r->be, DC_F32));
    return dc_clip_text_load(r->text, &tw, DC_NAMES_DIFFUSERS);
}

static void rig_close(rig *r) {
    dc_model_free(r->unet);
    dc_clip_text_free(r->text);
    dc_st_close(&r->uf), dc_st_close(&r->tf), dc_st_close(&r->io), dc_st_close(&r->golden);
    dc_backend_destroy(r->be);
}

// Tensor `name` of f as floats (malloc'd; *n its size), or NULL.
static float *tensor(const dc_st_file *f, const char *name, int64_t *n) {
    const dc_st_tensor *t = dc_st_find(f, name);
    float *h = t ? malloc((size_t)t->numel * sizeof *h) : NULL;
    if (h && dc_st_read_f32(f, t, h)) free(h), h = NULL;
    if (h && n) *n = t->numel;
    return h;
}

static dc_buf up(dc_backend *be, const float *h, int64_t n) {
    dc_buf b = {be->alloc(be, (size_t)n * 4), DC_F32};
    be->upload(be, b.p, h, (size_t)n * 4);
    return b;
}

// The UNet's output and the text encoder's last hidden state on io's inputs
// against the golden ref.unet.out and ref.text.hidden: the larger error.
static double run_time(rig *r, const char *ref) {
    dc_backend *be = r->be;
    int64_t nx = 0, nt = 0, nc = 0, no = 0, nh = 0;
    float *x = tensor(&r->io, "unet.x", &nx), *t = tensor(&r->io, "unet.t", &nt);
    float *ctx = tensor(&r->io, "unet.context", &nc);
    const dc_st_tensor *it = dc_st_find(&r->io, "text.ids");
    const int64_t ni = it ? it->numel : 0;
    int64_t *ids = ni ? malloc((size_t)ni * sizeof *ids) : NULL;
    if (ids && dc_st_read_i64(&r->io, it, ids)) free(ids), ids = NULL;
    char name[96];
    snprintf(name, sizeof name, "%s.unet.out", ref);
    float *want_out = tensor(&r->golden, name, &no);
    snprintf(name, sizeof name, "%s.text.hidden", ref);
    float *want_hidden = tensor(&r->golden, name, &nh);
    double err = INFINITY;
    if (x && t && ctx && ids && want_out && want_hidden) {
        const int B = 2, T = (int)(ni / B);
        int32_t *id32 = malloc((size_t)ni * sizeof *id32);
        for (int64_t i = 0; i < ni; i++) id32[i] = (int32_t)ids[i];
        dc_buf bx = up(be, x, nx), bt = up(be, t, nt), bc = up(be, ctx, nc);
        dc_buf bo = {be->alloc(be, (size_t)no * 4), DC_F32}, bh = {be->alloc(be, (size_t)nh * 4), DC_F32};
        dc_buf bi = {be->alloc(be, (size_t)ni * 4), DC_I32};
        be->upload(be, bi.p, id32, (size_t)ni * 4);
        dc_cond cond = {.ctx = bc, .len = T, .dim = (int)(nc / B / T)};
        float *out = malloc((size_t)no * 4), *hidden = malloc((size_t)nh * 4);
        if (dc_model_reserve(r->unet, B) || dc_model_forward(r->unet, bo, bx, bt, &cond, B) ||
            dc_clip_text_reserve(r->text, B) || dc_clip_text_forward(r->text, bh, dc_buf_none(), bi, B, 0)) {
            printf("  run time: %s\n", dc_error());
        } else {
            be->download(be, out, bo.p, (size_t)no * 4), be->download(be, hidden, bh.p, (size_t)nh * 4);
            const double eu = nerr(out, want_out, no), et = nerr(hidden, want_hidden, nh);
            printf("  run time: the UNet's output within %.2e, the text encoder's within %.2e of %s's golden\n", eu,
                   et, ref);
            err = fmax(eu, et);
        }
        dc_buf bufs[] = {bx, bt, bc, bo, bh, bi};
        for (int i = 0; i < 6; i++) be->free(be, bufs[i].p);
        free(id32), free(out), free(hidden);
    }
    free(x), free(t), free(ctx), free(ids), free(want_out), free(want_hidden);
    return err;
}

// Every golden ref.fused.<part>.<path>.weight against the merged weight: the
// worst error relative to the weight's largest value; *n the weights compared.
static double merged(rig *r, const char *ref, int *n) {
    char pre[64];
    const int np = snprintf(pre, sizeof pre, "%s.fused.", ref);
    double worst = 0;
    *n = 0;
    for (int i = 0; i < r->golden.count; i++) {
        const char *g = r->golden.tensors[i].name;
        if (strncmp(g, pre, (size_t)np)) continue;
        const bool unet = !strncmp(g + np, "unet.", 5);
        const char *path = g + np + 5;
        if (!unet && !strncmp(path, "text_model.", 11)) path += 11;  // transformers 5 names
        int64_t k = 0;
        float *want = tensor(&r->golden, g, &k), *got = param_host(unet ? r->unet->params : r->text->params, path, NULL);
        const double e = got && want ? nerr(got, want, k) : INFINITY;
        if (!(e <= worst)) worst = e;
        free(want), free(got);
        (*n)++;
    }
    return worst;
}

// The layers where diffusers' golden of the kohya file departs from the PEFT
// file's (by more than rounding): its count, their names into `which`.
static int kohya_departures(rig *r, char *which, size_t size) {
    int n = 0;
    which[0] = 0;
    for (int i = 0; i < r->golden.count; i++) {
        const char *g = r->golden.tensors[i].name;
        if (strncmp(g, "kohya.fused.", 12)) continue;
        char other[200];
        snprintf(other, sizeof other, "peft.%s", g + 6);
        int64_t k = 0;
        float *a = tensor(&r->golden, g, &k), *b = tensor(&r->golden, other, NULL);
        if (a && b && nerr(a, b, k) > 1e-6) {
            const char *leaf = strrchr(g, '.') - 1;
            while (leaf > g && *leaf != '.') leaf--;
            while (leaf > g && leaf[-1] != '.') leaf--;  // the module's last two parts
            const size_t used = strlen(which);
            snprintf(which + used, size - used, "%s%s", n ? ", " : "", leaf);
            n++;
        }
        free(a), free(b);
    }
    return n;
}

int main(void) {
    rig r;
    static const char *const formats[] = {"kohya", "peft", "diffusers"};
    for (int f = 0; f < 3; f++) {
        const char *fmt = formats[f], *ref = f == 0 ? "peft" : fmt;
        // fresh models, planned for their run before the LoRA is attached (reserved again then)
        if (rig_open(&r) || dc_model_reserve(r.unet, 2) || dc_clip_text_reserve(r.text, 2)) {
            printf("FAIL set-up: %s\n", dc_error());
            return 1;
        }
        char path[128];
        snprintf(path, sizeof path, LG "/%s.safetensors", fmt);
        printf("%s (against diffusers' %s golden)\n", fmt, ref);
        dc_st_file lf;
        dc_lora lu, lt;
        dc_lora_init(&lu, r.unet->params), dc_lora_init(&lt, r.text->params);
        int rc = dc_st_open(&lf, path);
        if (!rc) rc = dc_sd_lora_read(&lf, &lu, &lt), dc_st_close(&lf);
        CHECK(rc == 0 && lu.count == 9 && lt.count == 5, "%s: read (%d UNet, %d text encoder layers): %s", fmt,
              lu.count, lt.count, rc ? dc_error() : "");
        if (rc) {
            rig_close(&r);
            continue;
        }
        dc_lora_attach(&lu), dc_lora_attach(&lt);
        const double e = run_time(&r, ref);
        CHECK(e < 1e-5, "%s at run time: %.2e from diffusers'", fmt, e);
        dc_lora_detach(&lu), dc_lora_detach(&lt);
        int n = 0;
        rc = dc_lora_merge(&lu) || dc_lora_merge(&lt);
        const double m = rc ? INFINITY : merged(&r, ref, &n);
        printf("  merged: %d weights within %.2e of diffusers' fused ones\n", n, m);
        CHECK(rc == 0 && n == 14 && m < 1e-6, "%s merged: %d weights, worst %.2e (%s)", fmt, n, m,
              rc ? dc_error() : "");
        dc_lora_free(&lu), dc_lora_free(&lt);
        rig_close(&r);
    }
    if (rig_open(&r)) return printf("FAIL set-up: %s\n", dc_error()), 1;
    char which[1024];
    const int d = kohya_departures(&r, which, sizeof which);
    printf("diffusers' reading of the kohya file departs from the PEFT file's on %d layers: %s\n", d, which);
    CHECK(d == 4, "diffusers' kohya golden departs on %d layers, the README names 4", d);
    rig_close(&r);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
