// diffusion export of Stable Diffusion runs (pipelines/sd_export.c), on tiny
// random SD 1.x and 2.x bases that tools/sd_random writes (beside this
// program's folder) as a diffusers folder and as a single file, with a
// checkpoint written here: the base's UNet plus one noise as the raw
// weights, another as the EMA, and the metadata dc_trainer_save writes.
// (a) txt2img on the exported folder, on the exported single file and on the
//     base with the checkpoint's UNet loaded in its place gives the same
//     pixels (fp32), for the EMA and for --raw, which differ;
// (b) every tensor of the single file is where the engine's name maps put the
//     model's parameters, with their shapes (OpenCLIP's q, k, v packed, the
//     values checked), every diffusers name is one of SD 1.5's or 2.1's
//     (tests/golden/sd/sd_manifest.json), and known original names (the
//     CompVis layout, written out here) are present with their shapes;
// (c) --half: F16 tensors, half the UNet's bytes, each value the fp16
//     rounding of the fp32 export's;
// (a') a run that trained its text encoder along: the run, its exported
//     folder and single file draw the same pixels, other than the base
//     encoder's; the folder holds the checkpoint's EMA encoder;
// (d) refusals: not a UNet checkpoint, no base_model, a missing base, an
//     existing folder, a pixel-space base as a single file (its folder has no
//     vae/), a missing parent folder, a single-file base without a vocabulary;
//     nothing is left behind;
// and the command line (BIN, default ./diffusion): --help, an export equal to
// the library's, a refusal's exit code.
// Reads the shipped vocabulary, data/bpe_simple_vocab_16e6.txt.gz.
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "io/json.h"
#include "io/kv.h"
#include "models/clip_text.h"
#include "models/unet.h"
#include "models/unet_text.h"
#include "models/vae.h"
#include "pipelines/sd.h"
#include "pipelines/sd_export.h"
#include "tmpdir.h"

#define VOCAB "data/bpe_simple_vocab_16e6.txt.gz"
#define MANIFEST "tests/golden/sd/sd_manifest.json"
#define SIZE 32  // pixels a side that the tiny VAEs and UNets divide
#define NPIX (3 * SIZE * SIZE)

static dc_backend *g_be;
static char g_tool[400];
static dc_json_doc g_manifest;

// Runs a shell command; its exit code (-1 when it did not exit).
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// ---- the checkpoint ---------------------------------------------------------------------------

// A checkpoint of a run from base (the diffusers folder `folder` holds its
// UNet and, with text, the text encoder it trained along): raw = base + 0.05
// n1, EMA = base + 0.05 n2 (n ~ N(0, 1) per element), the encoder's under
// "text_encoder." with its config in the metadata. meta_model, base_model,
// prediction: the entries (NULL: left out).
static int write_checkpoint_of(const char *path, const char *folder, const char *meta_model, const char *base_model,
                               const char *prediction, bool text) {
    char p[4200];
    dc_unet_config c;
    dc_clip_text_config tc;
    snprintf(p, sizeof p, "%s/unet/config.json", folder);
    DC_TRY(dc_unet_config_from_json_file(&c, p));
    dc_st_file f, tf = {0};
    snprintf(p, sizeof p, "%s/unet/diffusion_pytorch_model.safetensors", folder);
    DC_TRY(dc_st_open(&f, p));
    dc_params ps = {0};
    int rc = dc_unet_register(&c, &ps);
    const int nu = ps.count;
    if (text) {
        dc_json_doc doc = {0};
        snprintf(p, sizeof p, "%s/text_encoder/config.json", folder);
        rc = rc || dc_json_read_file(&doc, p) || dc_clip_text_config_from_json(&tc, doc.root, p);
        dc_json_free(&doc);
        snprintf(p, sizeof p, "%s/text_encoder/model.safetensors", folder);
        ps.prefix = DC_UNET_TEXT_PREFIX;
        rc = rc || dc_st_open(&tf, p) || dc_clip_text_params(&ps, &tc);
    }
    const int n = ps.count;
    dc_st_entry *e = calloc(2 * (size_t)n, sizeof *e);
    char(*names)[200] = calloc(2 * (size_t)n, sizeof *names);
    float **bufs = calloc(2 * (size_t)n, sizeof *bufs);
    for (int i = 0; !rc && i < n; i++) {
        const dc_param *q = &ps.items[i];
        char key[300];  // sd_random writes transformers 4's names ("text_model.")
        snprintf(key, sizeof key, "%s%s", i < nu ? "" : "text_model.", q->name + q->prefix_len);
        const dc_st_tensor *t = dc_st_find(i < nu ? &f : &tf, key);
        if (!t) { rc = dc_fail("base has no %s", q->name); break; }
        for (int k = 0; k < 2; k++) {
            float *h = bufs[2 * i + k] = malloc(sizeof(float) * (size_t)q->numel);
            rc = dc_st_read_f32(i < nu ? &f : &tf, t, h);
            for (int64_t j = 0; !rc && j < q->numel; j++)
                h[j] += 0.05f * dc_randn_at(11, (uint32_t)k, (uint32_t)i, DC_STREAM_INIT, (uint32_t)j);
            snprintf(names[2 * i + k], 200, "%s%s", k ? "ema." : "", q->name);
            dc_st_entry *en = &e[2 * i + k];
            en->name = names[2 * i + k], en->dtype = DC_F32, en->ndim = q->ndim, en->data = h;
            memcpy(en->shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
        }
    }
    dc_kv kv = {0};
    if (!rc) rc = dc_unet_config_to_kv(&c, &kv);
    if (!rc && text) rc = dc_clip_text_config_to_kv(&tc, DC_UNET_TEXT_KV, &kv);
    if (!rc && meta_model) rc = dc_kv_set(&kv, "model", "%s", meta_model);
    if (!rc) rc = dc_kv_set(&kv, "format", "diffusion.c checkpoint v2") || dc_kv_set(&kv, "step", "10");
    if (!rc && base_model) rc = dc_kv_set(&kv, "base_model", "%s", base_model);
    if (!rc && prediction) rc = dc_kv_set(&kv, "prediction", "%s", prediction);
    if (!rc && !meta_model) {  // no "model" entry at all
        for (int i = 0; i < kv.n; i++)
            if (!strcmp(kv.keys[i], "model")) free(kv.keys[i]), kv.keys[i] = strdup("architecture");
    }
    if (!rc) rc = dc_st_write(path, e, 2 * n, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n);
    dc_kv_free(&kv);
    for (int i = 0; i < 2 * n; i++) free(bufs[i]);
    free(bufs), free(names), free(e);
    dc_params_free(&ps);
    dc_st_close(&f), dc_st_close(&tf);
    return rc;
}

static int write_checkpoint(const char *path, const char *folder, const char *meta_model, const char *base_model,
                            const char *prediction) {
    return write_checkpoint_of(path, folder, meta_model, base_model, prediction, false);
}

static int export(const char *ckpt, const char *out, bool raw, bool half, const char *vocab, const char **which) {
    dc_st_file f;
    DC_TRY(dc_st_open(&f, ckpt));
    dc_sd_export_opts o = {NULL, raw, half, vocab, 0};
    const char *w = NULL;
    int rc = dc_sd_export(&f, out, &o, g_be, which ? which : &w);
    dc_st_close(&f);
    return rc;
}

// ---- (a) pictures -----------------------------------------------------------------------------

static int keep(void *ctx, int index, const float *image) {
    (void)index;
    memcpy(ctx, image, sizeof(float) * NPIX);
    return 0;
}

// One guided picture of model into img; swap_ckpt: load that checkpoint's
// UNet (prefix "ema." or "") into the model's first. prediction -1: the files'.
static int picture(const char *model, int prediction, const char *swap_ckpt, const char *prefix, float *img) {
    dc_sd_pipe p;
    memset(&p, 0, sizeof p);
    dc_sd_open_opts oo = {model, VOCAB, NULL, 0, prediction, false, NULL};
    int rc = dc_sd_pipe_open(&p, g_be, &oo);
    if (!rc && swap_ckpt) {
        dc_st_file f;
        rc = dc_st_open(&f, swap_ckpt);
        dc_weights w = {&f, 1, {0}};
        snprintf(w.prefix, sizeof w.prefix, "%s", prefix);
        if (!rc) rc = dc_unet_load(p.unet, &w, DC_NAMES_DIFFUSERS), dc_st_close(&f);
    }
    if (!rc) {
        dc_sd_gen g = {"a red cube on a table", "blurry", 1, 1, SIZE, SIZE, dc_ksampler_opts_default(), NULL, 0};
        g.ks.steps = 3, g.ks.kind = DC_KS_EULER, g.ks.cfg_scale = 5.0f, g.ks.seed = 7;
        rc = dc_sd_generate(&p, &g, keep, img, NULL, NULL);
    }
    dc_sd_pipe_close(&p);
    return rc;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = isnan(a[i]) || isnan(b[i]) ? INFINITY : fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

// ---- (b) names and shapes ---------------------------------------------------------------------

// Is the tensor `name` in f with this shape (ndim dims)?
static bool has(const dc_st_file *f, const char *name, int ndim, const int64_t *shape) {
    const dc_st_tensor *t = dc_st_find(f, name);
    if (!t || t->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return false;
    return true;
}

// name with every run of digits as '#': the naming scheme, block numbers aside
// (a tiny model's block may have a tensor that SD's block of that number has
// not: up_blocks.1 changes width in tiny1, not in SD 1.5).
static void scheme(const char *name, char *out, size_t n) {
    size_t k = 0;
    for (const char *c = name; *c && k + 1 < n; c++)
        if (*c < '0' || *c > '9') out[k++] = *c;
        else if (c == name || c[-1] < '0' || c[-1] > '9') out[k++] = '#';
    out[k] = 0;
}

static bool in_manifest(const dc_json *list, const char *name) {
    char a[300], b[300];
    if (!list) return false;
    if (dc_json_get(list, name)) return true;
    scheme(name, a, sizeof a);
    for (int i = 0; i < list->nkids; i++)
        if (scheme(list->kids[i].key, b, sizeof b), !strcmp(a, b)) return true;
    return false;
}

// Every parameter of ps (named as diffusers does) at the place map gives it
// under prefix, with its shape (the leading rows of a packed tensor), and
// named as the manifest's list `part` of the model `sd` names its tensors. Returns the tensors
// of f it accounts for (a packed one once).
static int check_params(const dc_st_file *f, const dc_params *ps, const char *prefix, dc_weight_map map, void *ctx,
                        int layers, const char *sd, const char *part, const char *label) {
    const dc_json *list = dc_json_get(dc_json_get(g_manifest.root, sd), part);
    int found = 0, bad = 0, unnamed = 0;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        int layer;
        if (sscanf(p->name, "encoder.layers.%d.", &layer) == 1 && layer >= layers) continue;
        if (!in_manifest(list, p->name)) unnamed++;
        dc_weight_src src = {{0}, 0, 0};
        if (map && map(ctx, p->name, &src)) { bad++; continue; }
        char name[300];
        snprintf(name, sizeof name, "%s%s", prefix, map ? src.name : p->name);
        const dc_st_tensor *t = dc_st_find(f, name);
        int64_t shape[DC_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        int ndim = p->ndim;
        if (t && t->ndim == 4 && ndim == 2 && strstr(name, "mid.attn_1.")) shape[2] = shape[3] = 1, ndim = 4;
        if (t && src.rows) shape[0] = t->shape[0];  // packed: its rows checked below
        if (!has(f, name, ndim, shape) || (src.rows && t->shape[0] < src.row0 + src.rows)) {
            if (bad++ < 3) printf("  %s: %s (%s) missing or mis-shaped\n", label, name, p->name);
            continue;
        }
        found += src.rows == 0 || src.row0 == 0;
    }
    CHECK(bad == 0, "%s: %d parameters are not where the reader looks", label, bad);
    CHECK(unnamed == 0, "%s: %d parameter names are not in %s's %s list", label, unnamed, sd, part);
    return found;
}

static int vae_map(void *ctx, const char *param, dc_weight_src *src) { return dc_vae_original_name(ctx, param, src); }

// The single file `file` exported from the run on `folder` (the base's
// diffusers folder: its configs and text encoder), in SD `version`.
static void check_single_file(const char *file, const char *folder, const char *ckpt, int version) {
    const char *sd = version == 2 ? "sd2.1" : "sd1.5", *label = version == 2 ? "tiny2 file" : "tiny1 file";
    char p[4200];
    dc_st_file f, ck, te;
    if (dc_st_open(&f, file)) { CHECK(0, "%s: %s", label, dc_error()); return; }
    dc_unet_config uc;
    dc_vae_config vc;
    dc_clip_text_config tc;
    dc_json_doc vdoc = {0}, tdoc = {0};
    snprintf(p, sizeof p, "%s/unet/config.json", folder);
    int rc = dc_unet_config_from_json_file(&uc, p);
    snprintf(p, sizeof p, "%s/vae/config.json", folder);
    if (!rc) rc = dc_json_read_file(&vdoc, p) || dc_vae_config_from_json(&vc, vdoc.root, p);
    snprintf(p, sizeof p, "%s/text_encoder/config.json", folder);
    if (!rc) rc = dc_json_read_file(&tdoc, p) || dc_clip_text_config_from_json(&tc, tdoc.root, p);
    dc_json_free(&vdoc), dc_json_free(&tdoc);
    snprintf(p, sizeof p, "%s/text_encoder/model.safetensors", folder);
    if (!rc) rc = dc_st_open(&ck, ckpt) || dc_st_open(&te, p);
    if (rc) { CHECK(0, "%s: %s", label, dc_error()); dc_st_close(&f); return; }
    // SD 2's single file holds one layer more than the folder (never run)
    dc_clip_text_config tfile = tc;
    tfile.layers += version == 2;
    dc_params up = {0}, tp = {0};
    dc_vae *vae = NULL;
    rc = dc_unet_register(&uc, &up) || dc_clip_text_params(&tp, &tfile) ||
         dc_vae_create(&vae, &vc, g_be, DC_F32, true, true);
    if (rc) { CHECK(0, "%s: %s", label, dc_error()); goto done; }
    int n = check_params(&f, &up, "model.diffusion_model.", dc_unet_weight_map, &uc, 1 << 30, sd, "unet", label);
    n += check_params(&f, &vae->params, "first_stage_model.", vae_map, &vae->cfg, 1 << 30, sd, "vae", label);
    if (version == 2)
        n += check_params(&f, &tp, "cond_stage_model.model.", dc_clip_text_openclip_name, &tfile, tfile.layers, sd,
                          "text_encoder", label);
    else
        n += check_params(&f, &tp, "cond_stage_model.transformer.text_model.", NULL, NULL, tfile.layers, sd,
                          "text_encoder", label);
    CHECK(n == f.count, "%s: %d tensors, %d of them where the reader looks", label, f.count, n);
    // Known names of the CompVis/Stability layout, written out.
    const int64_t W = tc.width, C = vc.ch[vc.nblocks - 1], ch0 = uc.ch[0];
    struct { const char *name; int ndim; int64_t shape[4]; } known[] = {
        {"model.diffusion_model.time_embed.0.weight", 2, {4 * ch0, ch0}},
        {"model.diffusion_model.input_blocks.0.0.weight", 4, {ch0, 4, 3, 3}},
        {"model.diffusion_model.input_blocks.1.1.proj_in.weight", version == 2 ? 2 : 4, {ch0, ch0, 1, 1}},
        {"model.diffusion_model.out.2.weight", 4, {4, ch0, 3, 3}},
        {"first_stage_model.encoder.mid.attn_1.q.weight", 4, {C, C, 1, 1}},
        {"first_stage_model.quant_conv.weight", 4, {8, 8, 1, 1}},
        {"first_stage_model.decoder.norm_out.weight", 1, {vc.ch[0]}},
        {version == 2 ? "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight"
                      : "cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight",
         2, {version == 2 ? 3 * W : W, W}},
        {version == 2 ? "cond_stage_model.model.positional_embedding"
                      : "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight",
         2, {77, W}},
        {version == 2 ? "cond_stage_model.model.ln_final.weight"
                      : "cond_stage_model.transformer.text_model.final_layer_norm.weight",
         1, {W}},
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        CHECK(has(&f, known[k].name, known[k].ndim, known[k].shape), "%s: no %s of the expected shape", label,
              known[k].name);
    if (version == 2) {
        snprintf(p, sizeof p, "cond_stage_model.model.transformer.resblocks.%d.attn.in_proj_weight", tc.layers);
        CHECK(dc_st_find(&f, p) != NULL, "%s: no layer %d (OpenCLIP's last, which SD 2 does not run)", label, tc.layers);
    }
    // Values: the UNet's are the EMA's; OpenCLIP's packed rows W..2W are layer 0's k_proj.
    const dc_st_tensor *a = dc_st_find(&f, "model.diffusion_model.input_blocks.1.1.proj_in.weight");
    const dc_st_tensor *b = dc_st_find(&ck, "ema.down_blocks.0.attentions.0.proj_in.weight");
    float *x = a ? malloc(sizeof(float) * (size_t)a->numel) : NULL, *y = b ? malloc(sizeof(float) * (size_t)b->numel) : NULL;
    CHECK(a && b && a->numel == b->numel && !dc_st_read_f32(&f, a, x) && !dc_st_read_f32(&ck, b, y) &&
              max_diff(x, y, (size_t)a->numel) == 0,
          "%s: the UNet's values are not the EMA's", label);
    free(x), free(y);
    if (version == 2) {
        a = dc_st_find(&f, "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight");
        b = dc_st_find(&te, "text_model.encoder.layers.0.self_attn.k_proj.weight");
        x = a ? malloc(sizeof(float) * (size_t)a->numel) : NULL, y = b ? malloc(sizeof(float) * (size_t)b->numel) : NULL;
        CHECK(a && b && a->numel == 3 * b->numel && !dc_st_read_f32(&f, a, x) && !dc_st_read_f32(&te, b, y) &&
                  max_diff(x + b->numel, y, (size_t)b->numel) == 0,
              "%s: in_proj_weight's rows [W, 2W) are not k_proj's", label);
        free(x), free(y);
    }
    printf("%s: %d tensors where the reader looks; known original names; values\n", label, f.count);
done:
    if (vae) dc_vae_free(vae);
    dc_params_free(&up), dc_params_free(&tp);
    dc_st_close(&f), dc_st_close(&ck), dc_st_close(&te);
}

// ---- (c) --half -------------------------------------------------------------------------------

static void check_half(const char *f32_path, const char *f16_path, const char *label) {
    dc_st_file a, b;
    if (dc_st_open(&a, f32_path) || dc_st_open(&b, f16_path)) { CHECK(0, "%s: %s", label, dc_error()); return; }
    uint64_t bytes32 = 0, bytes16 = 0;
    int bad = 0, wrong_dtype = 0;
    for (int i = 0; i < a.count; i++) {
        const dc_st_tensor *t = &a.tensors[i], *h = dc_st_find(&b, t->name);
        bytes32 += t->end - t->begin;
        if (!h || h->numel != t->numel) { bad++; continue; }
        bytes16 += h->end - h->begin;
        wrong_dtype += h->dtype != DC_F16 || t->dtype != DC_F32;
        float *x = malloc(sizeof(float) * (size_t)t->numel), *y = malloc(sizeof(float) * (size_t)t->numel);
        if (dc_st_read_f32(&a, t, x) || dc_st_read_f32(&b, h, y)) bad++;
        // fp16 rounding: half an ulp, 2^-11 relative (2^-25 absolute below its normal range)
        for (int64_t j = 0; j < t->numel; j++)
            if (!(fabs((double)y[j] - x[j]) <= fabs((double)x[j]) * 0x1p-11 + 0x1p-25)) bad++;
        free(x), free(y);
    }
    CHECK(a.count == b.count && bad == 0, "%s: %d of %d tensors' values are not fp16 roundings", label, bad, a.count);
    CHECK(wrong_dtype == 0, "%s: %d tensors are not F16 (or the fp32 export not F32)", label, wrong_dtype);
    CHECK(bytes32 > 0 && bytes16 * 2 == bytes32, "%s: %llu fp16 bytes for %llu fp32 bytes", label,
          (unsigned long long)bytes16, (unsigned long long)bytes32);
    dc_st_close(&a), dc_st_close(&b);
}

// ---- one config -------------------------------------------------------------------------------

// Reads path's JSON member key (a string) into out; 0 when present.
static int json_member(const char *path, const char *key, char *out, size_t n) {
    dc_json_doc doc;
    if (dc_json_read_file(&doc, path)) return -1;
    const dc_json *v = dc_json_get(doc.root, key);
    int rc = dc_json_is_cstr(v) ? (snprintf(out, n, "%s", v->str), 0) : -1;
    dc_json_free(&doc);
    return rc;
}

// tiny1 runs predict v (its base epsilon), tiny2 runs epsilon (its base v):
// the export's scheduler config must say the run's.
static void test_config(const char *cfg) {
    const int version = cfg[4] - '0';
    const char *pred = version == 1 ? "v_prediction" : NULL;
    const int pred_id = version == 1 ? DC_PRED_V : DC_PRED_EPS;
    char folder[300], single[320];
    snprintf(folder, sizeof folder, "%s", tmp_path(cfg));
    snprintf(single, sizeof single, "%s.safetensors", folder);
    if (sh("'%s' --config %s --layout diffusers --dtype f32 --seed 5 --vocab %s --out '%s' > /dev/null", g_tool, cfg,
           VOCAB, folder) ||
        sh("'%s' --config %s --layout single --dtype f32 --seed 5 --out '%s' > /dev/null", g_tool, cfg, single)) {
        CHECK(0, "sd_random %s", cfg);
        return;
    }
    float *ref = malloc(sizeof(float) * NPIX), *img = malloc(sizeof(float) * NPIX), *raw = malloc(sizeof(float) * NPIX);
    for (int from_single = 0; from_single < 2; from_single++) {
        const char *base = from_single ? single : folder, *kind = from_single ? "single-file base" : "folder base";
        char ckpt[400], out_dir[400], out_file[400], raw_dir[400], half_dir[400], half_file[400];
        snprintf(ckpt, sizeof ckpt, "%s_%d.ckpt.safetensors", folder, from_single);
        snprintf(out_dir, sizeof out_dir, "%s_%d_export", folder, from_single);
        snprintf(out_file, sizeof out_file, "%s_%d_export.safetensors", folder, from_single);
        snprintf(raw_dir, sizeof raw_dir, "%s_%d_raw", folder, from_single);
        snprintf(half_dir, sizeof half_dir, "%s_%d_half", folder, from_single);
        snprintf(half_file, sizeof half_file, "%s_%d_half.safetensors", folder, from_single);
        const char *which = NULL;
        int rc = write_checkpoint(ckpt, folder, "UNet2DConditionModel", base, pred);
        CHECK(rc == 0, "%s %s: checkpoint: %s", cfg, kind, rc ? dc_error() : "");
        rc = rc || export(ckpt, out_dir, false, false, VOCAB, &which);
        CHECK(rc == 0 && which && !strcmp(which, "EMA"), "%s %s: export to a folder: %s", cfg, kind,
              rc ? dc_error() : "not the EMA");
        rc = rc || export(ckpt, out_file, false, false, VOCAB, NULL);
        CHECK(rc == 0, "%s %s: export to a single file: %s", cfg, kind, rc ? dc_error() : "");
        rc = rc || export(ckpt, raw_dir, true, false, VOCAB, &which);
        CHECK(rc == 0 && !strcmp(which, "raw"), "%s %s: --raw export: %s", cfg, kind, rc ? dc_error() : which);
        if (rc) continue;
        // (a) one picture four ways
        char sched[500], got[64] = "";
        snprintf(sched, sizeof sched, "%s/scheduler/scheduler_config.json", out_dir);
        CHECK(json_member(sched, "prediction_type", got, sizeof got) == 0 &&
                  !strcmp(got, pred ? pred : "epsilon"),
              "%s %s: the scheduler's prediction_type is '%s'", cfg, kind, got);
        rc = picture(base, pred_id, ckpt, "ema.", ref);
        CHECK(rc == 0, "%s %s: the base with the EMA UNet: %s", cfg, kind, rc ? dc_error() : "");
        rc = rc || picture(out_dir, -1, NULL, NULL, img);
        CHECK(rc == 0 && max_diff(ref, img, NPIX) == 0, "%s %s: the exported folder's picture differs by %g: %s", cfg,
              kind, rc ? 0 : max_diff(ref, img, NPIX), rc ? dc_error() : "");
        rc = rc || picture(out_file, pred_id, NULL, NULL, img);
        CHECK(rc == 0 && max_diff(ref, img, NPIX) == 0, "%s %s: the exported file's picture differs by %g: %s", cfg,
              kind, rc ? 0 : max_diff(ref, img, NPIX), rc ? dc_error() : "");
        rc = rc || picture(raw_dir, -1, NULL, NULL, raw) || picture(base, pred_id, ckpt, "", img);
        CHECK(rc == 0 && max_diff(raw, img, NPIX) == 0 && max_diff(raw, ref, NPIX) > 1e-3,
              "%s %s: --raw's picture: %g from the base with the raw UNet, %g from the EMA's", cfg, kind,
              rc ? 0 : max_diff(raw, img, NPIX), rc ? 0 : max_diff(raw, ref, NPIX));
        printf("%s %s: the same picture from the exported folder, file and the base with the EMA UNet; --raw's "
               "differs (%.3g)\n", cfg, kind, max_diff(raw, ref, NPIX));
        // (b)
        check_single_file(out_file, folder, ckpt, version);
        // (c)
        rc = export(ckpt, half_dir, false, true, VOCAB, NULL) || export(ckpt, half_file, false, true, VOCAB, NULL);
        CHECK(rc == 0, "%s %s: --half: %s", cfg, kind, rc ? dc_error() : "");
        if (rc) continue;
        char a[500], b[500];
        snprintf(a, sizeof a, "%s/unet/diffusion_pytorch_model.safetensors", out_dir);
        snprintf(b, sizeof b, "%s/unet/diffusion_pytorch_model.safetensors", half_dir);
        check_half(a, b, "--half folder's UNet");
        check_half(out_file, half_file, "--half single file");
        rc = picture(half_dir, -1, NULL, NULL, img);
        CHECK(rc == 0 && max_diff(ref, img, NPIX) < 0.05, "%s %s: the fp16 export's picture differs by %g", cfg, kind,
              rc ? 0 : max_diff(ref, img, NPIX));
    }
    free(ref), free(img), free(raw);
}

// A run that trained its text encoder along: the run itself (its checkpoint
// opened as a model), its export to a folder and to a single file draw the
// same picture, which the base's encoder with the same UNet does not; the
// folder's text_encoder/ holds the checkpoint's EMA encoder. After
// test_config, whose bases it reuses.
static void test_text_trained(const char *cfg) {
    char folder[300], single[320];
    snprintf(folder, sizeof folder, "%s", tmp_path(cfg));
    snprintf(single, sizeof single, "%s.safetensors", folder);
    float *ref = malloc(sizeof(float) * NPIX), *img = malloc(sizeof(float) * NPIX);
    for (int from_single = 0; from_single < 2; from_single++) {
        const char *base = from_single ? single : folder, *kind = from_single ? "single-file base" : "folder base";
        char ckpt[400], out_dir[400], out_file[400], te[500];
        snprintf(ckpt, sizeof ckpt, "%s_%d_text.ckpt.safetensors", folder, from_single);
        snprintf(out_dir, sizeof out_dir, "%s_%d_text_export", folder, from_single);
        snprintf(out_file, sizeof out_file, "%s_%d_text_export.safetensors", folder, from_single);
        snprintf(te, sizeof te, "%s/text_encoder/model.safetensors", out_dir);
        int rc = write_checkpoint_of(ckpt, folder, "UNet2DConditionModel", base, NULL, true) ||
                 export(ckpt, out_dir, false, false, VOCAB, NULL) || export(ckpt, out_file, false, false, VOCAB, NULL);
        CHECK(rc == 0, "%s %s: a run with its text encoder, exported: %s", cfg, kind, rc ? dc_error() : "");
        if (rc) continue;
        rc = picture(ckpt, -1, NULL, NULL, ref);
        CHECK(rc == 0, "%s %s: the run as a model: %s", cfg, kind, rc ? dc_error() : "");
        rc = rc || picture(out_dir, -1, NULL, NULL, img);
        CHECK(rc == 0 && max_diff(ref, img, NPIX) == 0, "%s %s: the exported folder's picture differs from the "
              "run's by %g", cfg, kind, rc ? 0 : max_diff(ref, img, NPIX));
        rc = rc || picture(out_file, DC_PRED_EPS, NULL, NULL, img);
        CHECK(rc == 0 && max_diff(ref, img, NPIX) == 0, "%s %s: the exported file's picture differs from the "
              "run's by %g", cfg, kind, rc ? 0 : max_diff(ref, img, NPIX));
        rc = rc || picture(base, DC_PRED_EPS, ckpt, "ema.", img);
        CHECK(rc == 0 && max_diff(ref, img, NPIX) > 1e-3, "%s %s: the base's encoder draws the run's picture "
              "(%g apart): the trained one is not used", cfg, kind, rc ? 0 : max_diff(ref, img, NPIX));
        // the folder's encoder is the checkpoint's EMA, value for value
        dc_st_file a = {0}, b = {0};
        const char *name = "text_model.embeddings.token_embedding.weight";
        const dc_st_tensor *ta = dc_st_open(&a, te) ? NULL : dc_st_find(&a, name);
        const dc_st_tensor *tb = dc_st_open(&b, ckpt) ? NULL : dc_st_find(&b, "ema." DC_UNET_TEXT_PREFIX "embeddings.token_embedding.weight");
        float *ha = ta && tb && ta->numel == tb->numel ? malloc(sizeof(float) * (size_t)ta->numel) : NULL;
        float *hb = ha ? malloc(sizeof(float) * (size_t)ta->numel) : NULL;
        rc = !hb || dc_st_read_f32(&a, ta, ha) || dc_st_read_f32(&b, tb, hb);
        CHECK(rc == 0 && !memcmp(ha, hb, sizeof(float) * (size_t)ta->numel), "%s %s: the exported folder's %s is not "
              "the checkpoint's EMA", cfg, kind, name);
        free(ha), free(hb);
        dc_st_close(&a), dc_st_close(&b);
    }
    printf("%s: a run with its text encoder: the run, its exported folder and file draw the same picture; the base's "
           "encoder another\n", cfg);
    free(ref), free(img);
}

// ---- (d) refusals -----------------------------------------------------------------------------

static void expect_fail(int rc, const char *want, const char *what) {
    CHECK(rc != 0 && strstr(dc_error(), want), "%s: %s (expected a message with '%s')", what,
          rc ? dc_error() : "accepted", want);
}

// No file or folder named *.tmp.* is left in the scratch folder.
static int leftovers(void) {
    DIR *d = opendir(g_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void test_refusals(void) {
    char folder[300], c2[300], out[300], pix[300];
    snprintf(folder, sizeof folder, "%s", tmp_path("tiny1"));
    snprintf(c2, sizeof c2, "%s", tmp_path("bad.safetensors"));
    int rc = write_checkpoint(c2, folder, "DiT", folder, NULL);
    expect_fail(rc || export(c2, tmp_path("o1"), false, false, VOCAB, NULL), "not a UNet checkpoint", "a DiT checkpoint");
    rc = write_checkpoint(c2, folder, NULL, folder, NULL);
    expect_fail(rc || export(c2, tmp_path("o1"), false, false, VOCAB, NULL), "not a UNet checkpoint", "no model entry");
    rc = write_checkpoint(c2, folder, "UNet2DConditionModel", NULL, NULL);
    expect_fail(rc || export(c2, tmp_path("o1"), false, false, VOCAB, NULL), "base_model", "no base_model");
    rc = write_checkpoint(c2, folder, "UNet2DConditionModel", tmp_path("moved_away"), NULL);
    expect_fail(rc || export(c2, tmp_path("o1"), false, false, VOCAB, NULL), "is missing", "a missing base");
    rc = write_checkpoint(c2, folder, "UNet2DConditionModel", "/nonexistent/base", "x_prediction");
    expect_fail(rc || export(c2, tmp_path("o1"), false, false, VOCAB, NULL), "x_prediction", "a bad prediction");
    // an existing folder is kept as it is
    rc = write_checkpoint(c2, folder, "UNet2DConditionModel", folder, NULL);
    snprintf(out, sizeof out, "%s", tmp_path("exists"));
    rc = rc || dc_mkdir_p(out) || sh("echo keep > '%s/mine.txt'", out);
    expect_fail(rc || export(c2, out, false, false, VOCAB, NULL), "already exists", "an existing folder");
    CHECK(sh("grep -q keep '%s/mine.txt'", out) == 0, "the existing folder's file was touched");
    expect_fail(export(c2, tmp_path("no/such/parent/out"), false, false, VOCAB, NULL), "no/such/parent",
                "a missing parent folder");
    // a single-file base, to a folder, needs the vocabulary for tokenizer/
    rc = write_checkpoint(c2, folder, "UNet2DConditionModel", tmp_path("tiny1.safetensors"), NULL);
    expect_fail(rc || export(c2, tmp_path("o2"), false, false, NULL, NULL), "vocabulary",
                "a single-file base without a vocabulary");
    // pixel space: the base's folder without vae/, model_index.json saying so
    snprintf(pix, sizeof pix, "%s", tmp_path("pixel"));
    rc = sh("cp -r '%s' '%s' && rm -r '%s/vae'", folder, pix, pix);
    char mi[400];
    snprintf(mi, sizeof mi, "%s/model_index.json", pix);
    rc = rc || dc_write_text_file(mi, "{\"_class_name\": \"StableDiffusionPipeline\", \"scheduler\": [\"diffusers\", "
                                      "\"PNDMScheduler\"], \"text_encoder\": [\"transformers\", \"CLIPTextModel\"], "
                                      "\"tokenizer\": [\"transformers\", \"CLIPTokenizer\"], \"unet\": [\"diffusers\", "
                                      "\"UNet2DConditionModel\"], \"vae\": [null, null]}\n");
    rc = rc || write_checkpoint(c2, folder, "UNet2DConditionModel", pix, NULL);
    expect_fail(rc || export(c2, tmp_path("pixel_out.safetensors"), false, false, VOCAB, NULL), "export a folder",
                "a pixel-space model as a single file");
    CHECK(access(tmp_path("pixel_out.safetensors"), F_OK) != 0, "the refused single file was written");
    rc = rc || export(c2, tmp_path("pixel_out"), false, false, VOCAB, NULL);
    CHECK(rc == 0, "a pixel-space model as a folder: %s", rc ? dc_error() : "");
    dc_json_doc doc = {0};
    snprintf(mi, sizeof mi, "%s/model_index.json", tmp_path("pixel_out"));
    const dc_json *v = rc || dc_json_read_file(&doc, mi) ? NULL : dc_json_get(doc.root, "vae");
    CHECK(v && v->type == DC_JSON_ARRAY && v->nkids == 2 && v->kids[0].type == DC_JSON_NULL &&
              v->kids[1].type == DC_JSON_NULL,
          "the pixel-space folder's model_index.json does not say \"vae\": [null, null]");
    dc_json_free(&doc);
    snprintf(mi, sizeof mi, "%s/vae", tmp_path("pixel_out"));
    CHECK(access(mi, F_OK) != 0, "the pixel-space folder has a vae/");
    CHECK(leftovers() == 0, "%d temporary files or folders were left behind", leftovers());
    printf("refusals: not a UNet, no base_model, a missing base, a bad prediction, an existing folder, a missing "
           "parent, no vocabulary, pixel space as one file (as a folder: no vae/)\n");
}

// ---- the command line -------------------------------------------------------------------------

static void test_cli(void) {
    const char *bin = getenv("BIN") ? getenv("BIN") : "./diffusion";
    char folder[300], ck[300], out[300], log[300];
    snprintf(folder, sizeof folder, "%s", tmp_path("tiny1"));
    snprintf(ck, sizeof ck, "%s", tmp_path("run/step_0000010.safetensors"));  // --ckpt names the run folder
    if (dc_mkdir_p(tmp_path("run"))) { CHECK(0, "%s", dc_error()); return; }
    snprintf(out, sizeof out, "%s", tmp_path("cli_out"));
    snprintf(log, sizeof log, "%s", tmp_path("cli.log"));
    CHECK(sh("%s export --help 2>&1 | grep -q 'FILE.safetensors'", bin) == 0, "export --help says nothing of SD");
    int rc = write_checkpoint(ck, folder, "UNet2DConditionModel", folder, NULL);
    CHECK(rc == 0 && sh("%s export --ckpt '%s' --out '%s' > '%s' 2>&1", bin, tmp_path("run"), out, log) == 0,
          "diffusion export of a run folder to a folder failed (%s)", log);
    rc = rc || export(ck, tmp_path("lib_out"), false, false, VOCAB, NULL);
    CHECK(rc == 0 && sh("cmp -s '%s/unet/diffusion_pytorch_model.safetensors' '%s/unet/diffusion_pytorch_model.safetensors'",
                        out, tmp_path("lib_out")) == 0,
          "the command's UNet differs from the library's");
    CHECK(sh("%s export --ckpt '%s' --out '%s' > '%s' 2>&1", bin, ck, out, log) == 1 &&
              sh("grep -q 'already exists' '%s'", log) == 0,
          "a second export over the folder was not refused with exit code 1 (%s)", log);
    CHECK(sh("%s export --ckpt '%s' --out '%s' > '%s' 2>&1", bin, ck, ck, log) != 0 &&
              sh("cmp -s '%s' '%s'", ck, ck) == 0 && access(ck, F_OK) == 0,
          "exporting over the checkpoint itself was not refused");
    printf("command line: --help, the library's bytes, refusals\n");
}

int main(int argc, char **argv) {
    (void)argc;
    struct stat st;
    if (stat(VOCAB, &st) != 0) return printf("FAIL %s is absent (run from the repository's root)\n", VOCAB), 1;
    const char *slash = strrchr(argv[0], '/');
    snprintf(g_tool, sizeof g_tool, "%.*s/../tools/sd_random", slash ? (int)(slash - argv[0]) : 1,
             slash ? argv[0] : ".");
    if (dc_json_read_file(&g_manifest, MANIFEST)) return printf("FAIL %s\n", dc_error()), 1;
    if (tmpdir_make("sd_export") || dc_backend_create("cpu", &g_be)) return printf("FAIL setup: %s\n", dc_error()), 1;
    test_config("tiny1");
    test_config("tiny2");
    test_text_trained("tiny1");
    test_text_trained("tiny2");
    test_refusals();
    test_cli();
    dc_backend_destroy(g_be);
    dc_json_free(&g_manifest);
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
