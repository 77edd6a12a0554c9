// Stable Diffusion from a training run, and pixel-space models:
// - a run folder (checkpoints step_NNNNNNN.safetensors as the trainer writes
//   them, the EMA under "ema." deliberately unlike the raw weights, the base
//   model named in "base_model") draws the same pixels as the base folder
//   with its unet/ replaced by the EMA weights, and other pixels than the
//   raw ones; the run's "prediction" overrides the scheduler config's and
//   --prediction overrides both; an unreadable newest checkpoint falls back
//   to the next older one; a missing base, a folder without checkpoints and
//   a DiT's checkpoint are refused with messages that say so;
// - a pixel-space model (tools/sd_random's tiny-pixel: no VAE) draws, in
//   txt2img and img2img, exactly what the sampler gives when it drives the
//   UNet directly (no scaling, no decoding), and a run on it loads;
// - the t2i-demo base (no UNet, no VAE, DDPM's schedule) opens for
//   `prepare` (pixels) and is refused for drawing; its text encoder has the
//   spreads transformers initialises CLIP with, its scheduler DDPM's betas.
// Models come from tools/sd_random beside this program's folder.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/rng.h"
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/unet.h"
#include "pipelines/prepare.h"
#include "pipelines/sd.h"
#include "tmpdir.h"

static int g_fail;
static dc_backend *g_be;

static void check(const char *name, bool ok, const char *detail) {
    printf("[%s] %-64s %s\n", ok ? " ok " : "FAIL", name, detail ? detail : "");
    if (!ok) g_fail++;
}

static int sd_random(const char *argv0, const char *config, const char *out) {
    const char *slash = strrchr(argv0, '/');
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%.*s/../tools/sd_random' --config %s --layout diffusers --dtype f32 --seed 7 "
             "--out '%s' > /dev/null", slash ? (int)(slash - argv0) : 1, slash ? argv0 : ".", config, out);
    return system(cmd) == 0 ? 0 : (printf("FAIL %s\n", cmd), -1);
}

// The UNet weights of base/unet/, read into host floats: names[i], vals[i], shapes in ents[i].
typedef struct {
    dc_st_file f;
    int n;
    dc_st_entry *e;
    char (*names)[160];
    float **v;
} weights;

static int weights_read(weights *w, const char *path) {
    memset(w, 0, sizeof *w);
    DC_TRY(dc_st_open(&w->f, path));
    w->n = w->f.count;
    w->e = calloc((size_t)w->n, sizeof *w->e);
    w->names = calloc((size_t)w->n, sizeof *w->names);
    w->v = calloc((size_t)w->n, sizeof *w->v);
    for (int i = 0; i < w->n; i++) {
        const dc_st_tensor *t = &w->f.tensors[i];
        if (t->dtype != DC_F32) return dc_fail("%s: %s is not F32", path, t->name);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        w->v[i] = malloc(sizeof(float) * (size_t)n);
        DC_TRY(dc_st_read_f32(&w->f, t, w->v[i]));
        snprintf(w->names[i], 160, "%s", t->name);
        w->e[i].dtype = DC_F32, w->e[i].ndim = t->ndim, w->e[i].data = w->v[i];
        memcpy(w->e[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    return 0;
}

static void weights_free(weights *w) {
    for (int i = 0; i < w->n; i++) free(w->v[i]);
    free(w->e), free(w->names), free(w->v);
    dc_st_close(&w->f);
}

static int64_t numel(const dc_st_entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

// The EMA: each weight moved by a random 20% of its spread, so it draws other pictures.
static float *ema_of(const weights *w, int i) {
    int64_t n = numel(&w->e[i]);
    float *o = malloc(sizeof(float) * (size_t)n);
    for (int64_t j = 0; j < n; j++)
        o[j] = w->v[i][j] * (1.0f + 0.2f * dc_randn_at(11, 0, (uint32_t)i, DC_STREAM_INIT, (uint64_t)j)) +
               0.01f * dc_randn_at(11, 1, (uint32_t)i, DC_STREAM_INIT, (uint64_t)j);
    return o;
}

// A checkpoint as dc_trainer_save writes one for a UNet: raw weights under
// their names, the EMA under "ema." + name, the metadata the loader reads
// (model "model" + the UNet's config, "base_model", "prediction" unless
// epsilon) beside the trainer's own.
static int write_run_checkpoint(const char *path, const weights *w, const char *unet_config, const char *base,
                                const char *model, const char *prediction) {
    dc_unet_config c;
    dc_kv kv = {0};
    DC_TRY(dc_unet_config_from_json_file(&c, unet_config));
    int rc = dc_kv_set(&kv, "format", "diffusion.c checkpoint v2");
    if (!rc) rc = dc_unet_config_to_kv(&c, &kv);
    if (!rc && model) rc = dc_kv_set(&kv, "model", "%s", model);
    if (!rc) rc = dc_kv_set(&kv, "lr", "0.0001");
    if (!rc && prediction) rc = dc_kv_set(&kv, "prediction", "%s", prediction);
    if (!rc) rc = dc_kv_set(&kv, "step", "10");
    if (!rc && base) rc = dc_kv_set(&kv, "base_model", "%s", base);
    dc_st_entry *e = calloc((size_t)2 * w->n, sizeof *e);
    char (*names)[170] = calloc((size_t)2 * w->n, sizeof *names);
    float **ema = calloc((size_t)w->n, sizeof *ema);
    for (int i = 0; i < w->n; i++) {
        e[i] = w->e[i], e[w->n + i] = w->e[i];
        snprintf(names[i], 170, "%s", w->names[i]);
        snprintf(names[w->n + i], 170, "ema.%s", w->names[i]);
        e[i].name = names[i], e[w->n + i].name = names[w->n + i];
        e[w->n + i].data = ema[i] = ema_of(w, i);
    }
    if (!rc) rc = dc_st_write(path, e, 2 * w->n, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n);
    for (int i = 0; i < w->n; i++) free(ema[i]);
    free(ema), free(names), free(e);
    dc_kv_free(&kv);
    return rc;
}

// base's unet/ weights replaced by their EMA (what the run should draw with).
static int write_ema_unet(const char *path, const weights *w) {
    dc_st_entry *e = calloc((size_t)w->n, sizeof *e);
    float **ema = calloc((size_t)w->n, sizeof *ema);
    for (int i = 0; i < w->n; i++) e[i] = w->e[i], e[i].name = w->names[i], e[i].data = ema[i] = ema_of(w, i);
    int rc = dc_st_write(path, e, w->n, NULL, NULL, 0);
    for (int i = 0; i < w->n; i++) free(ema[i]);
    free(ema), free(e);
    return rc;
}

// The pictures a model draws (count 2, batch 2, guidance), or NULL with the error printed.
typedef struct {
    float *px;
    int64_t n;
    int size;
    dc_prediction prediction;
    char name[128];
    bool pixels;
} drawn;

static int on_pic(void *ctx, int i, const float *img) {
    drawn *d = ctx;
    memcpy(d->px + i * d->n, img, sizeof(float) * (size_t)d->n);
    return 0;
}

static int draw(const char *model, int prediction, const float *init, drawn *d) {
    memset(d, 0, sizeof *d);
    dc_sd_pipe p;
    dc_sd_open_opts o = {model, NULL, NULL, 0, prediction, init != NULL, NULL};
    if (dc_sd_pipe_open(&p, g_be, &o)) return -1;
    d->size = p.default_size, d->prediction = p.prediction, d->pixels = p.pixels;
    snprintf(d->name, sizeof d->name, "%s", p.name);
    dc_sd_gen g = {"a red square", "blurry", 2, 2, d->size, d->size, dc_ksampler_opts_default(), init, 0.6f};
    g.ks.kind = DC_KS_EULER_A, g.ks.steps = 4, g.ks.cfg_scale = 3.0f, g.ks.seed = 5;
    d->n = (int64_t)3 * d->size * d->size;
    d->px = malloc(sizeof(float) * (size_t)(2 * d->n));
    int rc = dc_sd_generate(&p, &g, on_pic, d, NULL, NULL);
    dc_sd_pipe_close(&p);
    return rc;
}

static bool same(const drawn *a, const drawn *b) {
    if (!a->px || !b->px || a->n != b->n) return false;
    for (int64_t i = 0; i < 2 * a->n; i++)
        if (!isfinite(a->px[i]) || a->px[i] != b->px[i]) return false;
    return true;
}

static double max_diff(const drawn *a, const drawn *b) {
    double m = 0;
    for (int64_t i = 0; a->px && b->px && a->n == b->n && i < 2 * a->n; i++)
        m = fmax(m, fabs((double)a->px[i] - b->px[i]));
    return m;
}

// The first half of a checkpoint: what a crash mid-copy leaves.
static void truncated_copy(const char *from, const char *to) {
    FILE *f = fopen(from, "rb"), *t = fopen(to, "wb");
    long n = f && !fseek(f, 0, SEEK_END) ? ftell(f) / 2 : 0;
    char *buf = malloc((size_t)n + 1);
    if (f && t && buf && !fseek(f, 0, SEEK_SET) && fread(buf, 1, (size_t)n, f) == (size_t)n)
        fwrite(buf, 1, (size_t)n, t);
    free(buf);
    if (f) fclose(f);
    if (t) fclose(t);
}

// open must fail with a message holding `want`.
static void check_refused(const char *name, const char *model, const char *want) {
    dc_sd_pipe p;
    dc_sd_open_opts o = {model, NULL, NULL, 0, -1, false, NULL};
    dc_error_clear();
    int rc = dc_sd_pipe_find(&p, &o);
    if (rc == 0) dc_sd_pipe_close(&p);
    check(name, rc != 0 && strstr(dc_error(), want) != NULL, dc_error());
}

static void test_run(const char *base) {
    char path[1100], unet[1100], ref[1024], run[1024], cmd[2400];
    snprintf(unet, sizeof unet, "%s/unet/diffusion_pytorch_model.safetensors", base);
    weights w;
    if (weights_read(&w, unet)) {
        check("read the base UNet", false, dc_error());
        return;
    }
    snprintf(path, sizeof path, "%s/unet/config.json", base);
    snprintf(run, sizeof run, "%s", tmp_path("run"));
    mkdir(run, 0755);
    char ck10[1200], ck20[1200], ck30[1200];
    snprintf(ck10, sizeof ck10, "%s/step_0000010.safetensors", run);
    snprintf(ck20, sizeof ck20, "%s/step_0000020.safetensors", run);
    snprintf(ck30, sizeof ck30, "%s/step_0000030.safetensors", run);
    int rc = write_run_checkpoint(ck10, &w, path, base, NULL, NULL);
    // the reference: the base with its unet/ holding the EMA
    snprintf(ref, sizeof ref, "%s", tmp_path("ref"));
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", base, ref);
    if (!rc && system(cmd) != 0) rc = dc_fail("%s failed", cmd);
    snprintf(path, sizeof path, "%s/unet/diffusion_pytorch_model.safetensors", ref);
    if (!rc) rc = write_ema_unet(path, &w);
    check("write a run folder and the EMA reference", rc == 0, rc ? dc_error() : NULL);
    drawn r, e, b;
    int r1 = draw(run, -1, NULL, &r);
    check("the run folder draws", r1 == 0, r1 ? dc_error() : NULL);
    int r2 = draw(ref, -1, NULL, &e);
    int r3 = draw(base, -1, NULL, &b);
    check("the references draw", r2 == 0 && r3 == 0, r2 || r3 ? dc_error() : NULL);
    char msg[200];
    snprintf(msg, sizeof msg, "max |run - ema reference| %.3g", max_diff(&r, &e));
    check("run folder == the base with the EMA as its UNet (every value)", same(&r, &e), msg);
    snprintf(msg, sizeof msg, "max |run - raw weights| %.3g", max_diff(&r, &b));
    check("run folder != the raw weights (the EMA is what loads)", !same(&r, &b) && max_diff(&r, &b) > 1e-3, msg);
    check("the run's name is its folder's, its size tiny1's 8 x the VAE's 4",
          !strcmp(r.name, "run") && r.size == e.size && r.size == 8 * 4 && r.prediction == DC_PRED_EPS, r.name);
    drawn f;
    int r4 = draw(ck10, -1, NULL, &f);
    check("one checkpoint file draws the same as its folder", r4 == 0 && same(&f, &r) &&
          !strcmp(f.name, "step_0000010"), r4 ? dc_error() : f.name);
    free(r.px), free(e.px), free(b.px), free(f.px);

    // The run's prediction overrides the scheduler config's; the caller's overrides both.
    snprintf(path, sizeof path, "%s/unet/config.json", base);
    rc = write_run_checkpoint(ck20, &w, path, base, NULL, "v_prediction");
    drawn v, forced;
    int r5 = rc ? rc : draw(run, -1, NULL, &v);
    check("a run trained on v draws with v (its newest checkpoint)", r5 == 0 && v.prediction == DC_PRED_V,
          r5 ? dc_error() : NULL);
    int r6 = draw(run, DC_PRED_EPS, NULL, &forced);
    check("--prediction overrides the run's", r6 == 0 && forced.prediction == DC_PRED_EPS, r6 ? dc_error() : NULL);
    // An unreadable newest checkpoint: the next older one (step 20, v) is used.
    truncated_copy(ck20, ck30);
    drawn fb;
    int r7 = draw(run, -1, NULL, &fb);
    check("an unreadable newest checkpoint falls back to the next older",
          r7 == 0 && fb.prediction == DC_PRED_V && same(&fb, &v), r7 ? dc_error() : NULL);
    free(v.px), free(forced.px), free(fb.px);

    // Errors.
    snprintf(path, sizeof path, "%s", tmp_path("lost"));
    mkdir(path, 0755);
    char ck[1200], cfg[1100];
    snprintf(ck, sizeof ck, "%s/step_0000100.safetensors", path);
    snprintf(cfg, sizeof cfg, "%s/unet/config.json", base);
    const char *gone = "/nonexistent/sd-base-model";
    if (write_run_checkpoint(ck, &w, cfg, gone, NULL, NULL)) check("write a run without its base", false, dc_error());
    check_refused("a missing base model is named, with `diffusion export`", path, gone);
    check_refused("... and the message says how to make the run self-contained", path, "diffusion export");
    snprintf(path, sizeof path, "%s", tmp_path("empty"));
    mkdir(path, 0755);
    check_refused("a folder with no checkpoint is refused", path, "training run folder");
    snprintf(ck, sizeof ck, "%s", tmp_path("dit.safetensors"));
    if (write_run_checkpoint(ck, &w, cfg, base, "DiT-S/2", NULL)) check("write a DiT checkpoint", false, dc_error());
    check_refused("a DiT's checkpoint is refused, naming it", ck, "DiT-S/2");
    weights_free(&w);
}

// The pixel-space model's pictures against the sampler driving its UNet directly.
static int unet_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_model_forward(ctx, out, x, t, cond, B);
}
static int unet_prepare(void *ctx, const dc_cond *cond, int B) { return dc_unet_prepare_text(ctx, cond, B); }

static int direct(const char *model, const float *init, float *out, int *size) {
    dc_sd_pipe p;
    dc_sd_open_opts o = {model, NULL, NULL, 0, -1, false, NULL};
    DC_TRY(dc_sd_pipe_open(&p, g_be, &o));
    const int S = *size = p.default_size, B = 2, T = DC_CLIP_CONTEXT, D = p.text->cfg.width;
    const int64_t n = (int64_t)3 * S * S;
    dc_buf text, cctx, x;
    dc_sampler ks = {0};
    dc_ksampler_opts ko = dc_ksampler_opts_default();
    ko.kind = DC_KS_EULER_A, ko.steps = 4, ko.cfg_scale = 3.0f, ko.seed = 5;
    ko.prediction = p.prediction, ko.sched = &p.sched, ko.ctx_len = T, ko.ctx_dim = D;
    if (init) ko.skip = 4 - (int)(4 * 0.6f);
    int rc = dc_buf_alloc(g_be, &text, g_be->compute, (size_t)2 * T * D, "text");
    if (!rc) rc = dc_buf_alloc(g_be, &cctx, g_be->compute, (size_t)B * T * D, "ctx");
    if (!rc) rc = dc_buf_alloc(g_be, &x, DC_F32, (size_t)B * n, "x");
    const char *prompts[2] = {"a red square", "blurry"};
    if (!rc) rc = dc_sd_encode_prompts(&p, prompts, 2, text);
    for (int i = 0; i < B && !rc; i++)
        g_be->copy(g_be, dc_buf_at(cctx, (int64_t)i * T * D).p, text.p, (size_t)T * D * dc_dtype_size(g_be->compute));
    ko.null_ctx = dc_buf_at(text, (int64_t)T * D);
    if (!rc) rc = dc_ksampler_init(&ks, g_be, &ko, 3, S, S, B);
    if (!rc) rc = dc_unet_set_size(p.unet, S, S);
    if (!rc) rc = dc_model_reserve(p.unet, 2 * B);
    if (!rc && init)
        for (int i = 0; i < B; i++) g_be->upload(g_be, dc_buf_at(x, i * n).p, init, sizeof(float) * (size_t)n);
    uint32_t idx[2] = {0, 1};
    dc_cond cond = {.ctx = cctx, .len = T, .dim = D};
    if (!rc) rc = dc_sampler_run(&ks, x, &cond, idx, B, unet_eval, unet_prepare, p.unet, NULL, NULL);
    if (!rc) g_be->download(g_be, out, x.p, sizeof(float) * (size_t)(B * n)), rc = dc_backend_status(g_be);
    dc_sampler_free(&ks);
    g_be->free(g_be, text.p), g_be->free(g_be, cctx.p), g_be->free(g_be, x.p);
    dc_sd_pipe_close(&p);
    return rc;
}

static void test_pixels(const char *model, const char *base_tiny1) {
    drawn d, di;
    int rc = draw(model, -1, NULL, &d);
    check("a pixel-space model draws (txt2img)", rc == 0 && d.pixels && d.size == 16, rc ? dc_error() : NULL);
    float *ref = malloc(sizeof(float) * 2 * 3 * 16 * 16);
    int S = 0;
    int r2 = direct(model, NULL, ref, &S);
    drawn rd = {ref, 3 * 16 * 16, 16, 0, "", true};
    char msg[200];
    snprintf(msg, sizeof msg, "max diff %.3g", max_diff(&d, &rd));
    check("txt2img == the sampler on the UNet alone (pixels, no scaling)", r2 == 0 && S == 16 && same(&d, &rd),
          r2 ? dc_error() : msg);
    float *init = malloc(sizeof(float) * 3 * 16 * 16);
    for (int i = 0; i < 3 * 16 * 16; i++) init[i] = tanhf(dc_randn_at(3, 0, 0, DC_STREAM_INIT, (uint64_t)i));
    rc = draw(model, -1, init, &di);
    r2 = rc ? rc : direct(model, init, ref, &S);
    snprintf(msg, sizeof msg, "max diff %.3g", max_diff(&di, &rd));
    check("img2img == the sampler started from the picture itself", rc == 0 && r2 == 0 && same(&di, &rd),
          rc || r2 ? dc_error() : msg);
    check("img2img differs from txt2img", !same(&di, &d), NULL);
    free(d.px), free(di.px), free(ref), free(init);

    // A run trained on a pixel-space base loads and draws pixels.
    char cfg[1100], unet[1100], run[1024], ck[1200];
    snprintf(unet, sizeof unet, "%s/unet/diffusion_pytorch_model.safetensors", model);
    snprintf(cfg, sizeof cfg, "%s/unet/config.json", model);
    snprintf(run, sizeof run, "%s", tmp_path("pixel-run"));
    mkdir(run, 0755);
    snprintf(ck, sizeof ck, "%s/step_0000001.safetensors", run);
    weights w;
    rc = weights_read(&w, unet);
    if (!rc) rc = write_run_checkpoint(ck, &w, cfg, model, NULL, NULL);
    drawn pr;
    if (!rc) rc = draw(run, -1, NULL, &pr);
    check("a run on a pixel-space base draws pixels", rc == 0 && pr.pixels && pr.size == 16, rc ? dc_error() : NULL);
    if (!rc) free(pr.px);
    if (w.n) weights_free(&w);
    // A run's UNet must fit its base: a pixel UNet on a latent base is refused.
    snprintf(run, sizeof run, "%s", tmp_path("mismatch"));
    mkdir(run, 0755);
    snprintf(ck, sizeof ck, "%s/step_0000001.safetensors", run);
    rc = weights_read(&w, unet);
    if (!rc) rc = write_run_checkpoint(ck, &w, cfg, base_tiny1, NULL, NULL);
    if (w.n) weights_free(&w);
    check_refused("a pixel UNet on a base with a VAE is refused", run, "channels");
}

// The sample standard deviation of tensor `name` of f, against want (and its mean against 0).
static void check_std(const dc_st_file *f, const char *name, double want, const char *why) {
    const dc_st_tensor *t = dc_st_find(f, name);
    int64_t n = 1;
    for (int d = 0; t && d < t->ndim; d++) n *= t->shape[d];
    float *v = t ? malloc(sizeof(float) * (size_t)n) : NULL;
    double s1 = 0, s2 = 0;
    if (v && dc_st_read_f32(f, t, v) == 0)
        for (int64_t i = 0; i < n; i++) s1 += v[i], s2 += (double)v[i] * v[i];
    const double mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
    char msg[200];
    snprintf(msg, sizeof msg, "std %.5f, want %.5f (%s); mean %.2g over %lld", sd, want, why, mean, (long long)n);
    // n >= 9856 values: the estimate's relative error is about (2n)^-0.5 < 0.8%
    check(name, v && fabs(sd / want - 1) < 0.03 && fabs(mean) < 4 * want / sqrt((double)n), msg);
    free(v);
}

// Every value of tensor `name` equals x (LayerNorm scales 1, biases 0).
static void check_all(const dc_st_file *f, const char *name, float x) {
    const dc_st_tensor *t = dc_st_find(f, name);
    float v[128];
    bool ok = t && t->ndim == 1 && t->shape[0] == 128 && dc_st_read_f32(f, t, v) == 0;
    for (int i = 0; ok && i < 128; i++) ok = v[i] == x;
    check(name, ok, x ? "all 1" : "all 0");
}

static void test_demo(const char *demo) {
    // The text encoder as transformers' CLIPPreTrainedModel._init_weights
    // makes it: d = 128, L = 4.
    char path[1100];
    snprintf(path, sizeof path, "%s/text_encoder/model.safetensors", demo);
    dc_st_file f;
    if (dc_st_open(&f, path)) {
        check("open the t2i-demo text encoder", false, dc_error());
    } else {
        const double d = 128, L = 4;
        check_std(&f, "text_model.embeddings.token_embedding.weight", 0.02, "0.02");
        check_std(&f, "text_model.embeddings.position_embedding.weight", 0.02, "0.02");
        check_std(&f, "text_model.encoder.layers.0.self_attn.q_proj.weight", 1 / sqrt(d * 2 * L), "d^-1/2 (2L)^-1/2");
        check_std(&f, "text_model.encoder.layers.3.self_attn.v_proj.weight", 1 / sqrt(d * 2 * L), "d^-1/2 (2L)^-1/2");
        check_std(&f, "text_model.encoder.layers.1.self_attn.out_proj.weight", 1 / sqrt(d), "d^-1/2");
        check_std(&f, "text_model.encoder.layers.2.mlp.fc1.weight", 1 / sqrt(2 * d), "(2d)^-1/2");
        check_std(&f, "text_model.encoder.layers.2.mlp.fc2.weight", 1 / sqrt(d * 2 * L), "d^-1/2 (2L)^-1/2");
        check_all(&f, "text_model.encoder.layers.0.layer_norm1.weight", 1.0f);
        check_all(&f, "text_model.final_layer_norm.bias", 0.0f);
        check_all(&f, "text_model.encoder.layers.1.self_attn.k_proj.bias", 0.0f);
        dc_st_close(&f);
    }
    // DDPM's schedule: betas linear from 1e-4 to 0.02 over 1000 steps.
    dc_sd_sched_cfg sc;
    dc_schedule s;
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", demo);
    int rc = dc_sd_sched_cfg_read(&sc, path);
    if (!rc) rc = dc_schedule_init_cfg(&s, &sc, false);
    double err = rc ? 1 : 0;
    long double acp = 1;
    for (int i = 0; !rc && i < 1000; i++) {
        acp *= 1 - (0.0001L + (0.02L - 0.0001L) * i / 999);
        err = fmax(err, fabs((double)(s.alphas_cumprod[i] / acp - 1)));
    }
    char msg[120];
    snprintf(msg, sizeof msg, "max relative error of alphas_cumprod %.2g", err);
    check("t2i-demo's scheduler: DDPM's linear betas 1e-4..0.02, 1000 steps", !rc && s.T == 1000 &&
          sc.prediction == DC_PRED_EPS && err < 1e-9, rc ? dc_error() : msg);
    if (!rc) dc_schedule_free(&s), dc_sd_sched_cfg_free(&sc);
    check_refused("the t2i-demo base draws nothing (no UNet)", demo, "names no UNet");
    dc_prepare_models m;
    dc_prepare_opts o = {0};
    o.model = demo;
    rc = dc_prepare_models_load(&m, &o, g_be);
    check("prepare opens the t2i-demo base for pixels (no VAE)", rc == 0 && !m.sd.vae && m.sd.text &&
          m.sd.text->cfg.width == 128 && m.sd.text->cfg.layers == 4 && m.sd.text->cfg.vocab == 49408,
          rc ? dc_error() : NULL);
    if (!rc) dc_prepare_models_close(&m);
}

int main(int argc, char **argv) {
    (void)argc;
    if (tmpdir_make("sd_run")) return 1;
    g_be = dc_backend_cpu_create();
    char tiny1[256], pixel[256], demo[256];
    snprintf(tiny1, sizeof tiny1, "%s", tmp_path("tiny1"));
    snprintf(pixel, sizeof pixel, "%s", tmp_path("tiny-pixel"));
    snprintf(demo, sizeof demo, "%s", tmp_path("t2i-demo"));
    if (sd_random(argv[0], "tiny1", tiny1) || sd_random(argv[0], "tiny-pixel", pixel) ||
        sd_random(argv[0], "t2i-demo", demo))
        return 1;
    test_run(tiny1);
    test_pixels(pixel, tiny1);
    test_demo(demo);
    dc_backend_destroy(g_be);
    tmpdir_remove();
    printf(g_fail ? "FAILED: %d\n" : "all passed\n", g_fail);
    return g_fail ? 1 : 0;
}
