// diffusion export for Stable Diffusion runs: see sd_export.h.
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "models/sd_lora.h"
#include "models/sd_write.h"
#include "models/unet_text.h"
#include "pipelines/sd.h"
#include "pipelines/sd_export.h"
#include "text/clip_vocab_files.h"

bool dc_sd_export_is_file(const char *out) {
    size_t n = strlen(out), k = strlen(".safetensors");
    return n >= k && !strcmp(out + n - k, ".safetensors");
}

// What the export works from.
typedef struct {
    const dc_st_file *ckpt;
    const dc_sd_export_opts *o;
    dc_backend *be;
    const char *base;
    bool base_folder;   // a diffusers folder (else a single file)
    bool pixel;         // no VAE: the UNet reads pixels
    dc_prediction pred;
    dc_model *unet;
    dc_clip_text *text;  // the base's, or the checkpoint's when it trained one along, when loaded
    bool text_trained;   // the checkpoint holds a text encoder trained along with its UNet
    const char *prefix;  // of the checkpoint's weights: "ema." or ""
    int text_skip;       // its layers that SD does not run (SD 2 single files: the last)
    bool openclip;       // SD 2's text encoder (OpenCLIP ViT-H: GELU), else OpenAI's CLIP (quick GELU)
    dc_vae *vae;
} job;

static int path_join(char *out, size_t cap, const char *a, const char *b) {
    if (snprintf(out, cap, "%s/%s", a, b) >= (int)cap) return dc_fail("path %s/%s is too long", a, b);
    return 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// ---- the checkpoint -----------------------------------------------------------------------

static int read_checkpoint(job *j, const char **which) {
    const dc_st_file *f = j->ckpt;
    const char *model = dc_st_meta(f, "model");
    if (!model || strcmp(model, "UNet2DConditionModel"))
        return dc_fail("%s: not a UNet checkpoint (its \"model\" is %s%s%s; Stable Diffusion runs hold "
                       "UNet2DConditionModel)", f->path, model ? "\"" : "", model ? model : "not given", model ? "\"" : "");
    const char *pred = dc_st_meta(f, "prediction");
    j->pred = !pred || !strcmp(pred, "epsilon") ? DC_PRED_EPS : !strcmp(pred, "v_prediction") ? DC_PRED_V
              : !strcmp(pred, "sample")          ? DC_PRED_SAMPLE
                                                 : (dc_prediction)-1;
    if ((int)j->pred < 0) return dc_fail("%s: prediction \"%s\" is not epsilon, v_prediction or sample", f->path, pred);
    j->base = j->o->base ? j->o->base : dc_st_meta(f, "base_model");
    if (!j->base || !*j->base)
        return dc_fail("%s has no \"base_model\" entry: the model whose text encoder, tokenizer, scheduler and VAE "
                       "the run used is not known (give it with --base)", f->path);
    struct stat st;
    if (stat(j->base, &st) != 0)
        return dc_fail("the base model %s (the checkpoint's \"base_model\") is missing: %s%s", j->base,
                       strerror(errno), j->o->base ? "" : " (give its new place with --base)");
    j->base_folder = S_ISDIR(st.st_mode);
    bool ema = false;
    for (int i = 0; i < f->count && !ema; i++) ema = !strncmp(f->tensors[i].name, "ema.", 4);
    const char *prefix = j->prefix = ema && !j->o->raw ? "ema." : "";
    *which = *prefix ? "EMA" : "raw";
    char name[128];
    snprintf(name, sizeof name, "%s" DC_UNET_TEXT_PREFIX "embeddings.token_embedding.weight", prefix);
    j->text_trained = dc_st_find(f, name) != NULL;
    dc_unet_config c;
    DC_TRY(dc_unet_config_from_meta(&c, f));
    const int size = 1 << (c.nblocks - 1);  // any latent size: nothing runs
    DC_TRY(dc_unet_new(&c, j->be, DC_F32, size, size, &j->unet));
    dc_weights w = {(dc_st_file *)f, 1, {0}};
    snprintf(w.prefix, sizeof w.prefix, "%s", prefix);
    return dc_unet_load(j->unet, &w, DC_NAMES_DIFFUSERS);
}

// A folder base without a VAE: model_index.json says "vae": [null, null], or there is no vae/.
static int find_pixel_space(job *j) {
    char path[4200];
    DC_TRY(path_join(path, sizeof path, j->base, "vae"));
    if (!is_dir(path)) return j->pixel = true, 0;
    DC_TRY(path_join(path, sizeof path, j->base, "model_index.json"));
    if (access(path, F_OK) != 0) return 0;
    dc_json_doc doc;
    DC_TRY(dc_json_read_file(&doc, path));
    const dc_json *v = dc_json_get(doc.root, "vae");
    j->pixel = v && v->type == DC_JSON_ARRAY && v->nkids == 2 && v->kids[1].type == DC_JSON_NULL;
    dc_json_free(&doc);
    return 0;
}

// The text encoder the checkpoint trained along with its UNet, in place of
// the base's: its config from the metadata, its weights under prefix +
// "text_encoder.", all its layers run.
static int checkpoint_text(job *j) {
    const dc_st_file *f = j->ckpt;
    dc_clip_text_config c;
    const int rc = dc_unet_text_config_of((const char *const *)f->meta_keys, (const char *const *)f->meta_values,
                                          f->nmeta, f->path, &c);
    if (rc) return rc < 0 ? -1 : dc_fail("%s: its text encoder's config is not in its metadata", f->path);
    dc_clip_text_free(j->text), j->text = NULL;
    DC_TRY(dc_clip_text_create(&j->text, &c, j->be, DC_F32));
    dc_weights w = {(dc_st_file *)f, 1, {0}};
    snprintf(w.prefix, sizeof w.prefix, "%s" DC_UNET_TEXT_PREFIX, j->prefix);
    j->text_skip = 0;
    return dc_clip_text_load(j->text, &w, DC_NAMES_DIFFUSERS);
}

// The base's text encoder (or the checkpoint's) and (vae) VAE, through the engine's readers.
static int load_base(job *j, bool vae) {
    dc_sd_model m;
    dc_sd_source s = {0};
    DC_TRY(dc_sd_model_open(&m, j->base, j->o->st_flags));
    int rc = 0;
    if (!j->text) {  // else loaded already (and a LoRA merged into it)
        rc = dc_sd_source_open(&s, &m, DC_SD_TEXT);
        if (!rc) rc = dc_sd_load_text(&s, j->be, &j->text_skip, &j->text);
        if (!rc) j->openclip = s.names == DC_NAMES_ORIGINAL || j->text->cfg.act != DC_ACT_QUICK_GELU;
        if (!rc && j->text_trained) rc = checkpoint_text(j);
        dc_sd_source_close(&s);
    }
    if (!rc && vae) rc = dc_sd_source_open(&s, &m, DC_SD_VAE);
    if (!rc && vae) rc = dc_sd_load_vae(&s, j->be, true, true, &j->vae);
    dc_sd_source_close(&s);
    dc_sd_model_close(&m);
    return rc;
}

// The dtype a part is written in: fp16 with --half, else as loaded.
static dc_dtype part_dtype(const job *j, const dc_params *ps) { return j->o->half ? DC_F16 : ps->frozen.dt; }

// ---- a single file ------------------------------------------------------------------------

static int export_file(job *j, const char *out) {
    if (j->pixel)
        return dc_fail("%s: the base model %s has no VAE (a pixel-space model); the single-file layout has no "
                       "place for one without first_stage_model: export a folder instead (an --out without "
                       ".safetensors)", out, j->base);
    DC_TRY(load_base(j, true));
    dc_sd_tensors t = {0};
    const dc_unet *u = dc_unet_of(j->unet);
    const dc_clip_text_config *tc = &j->text->cfg;
    int rc = dc_sd_add_unet(&t, u, true, j->o->half ? DC_F16 : DC_F32);
    if (!rc) rc = dc_sd_add_vae(&t, j->vae, true, part_dtype(j, &j->vae->params));
    if (!rc) rc = dc_sd_add_text(&t, j->text, tc->layers, j->openclip ? DC_SD_TEXT_SD2 : DC_SD_TEXT_SD1,
                                 part_dtype(j, j->text->params));
    // SD 2 runs OpenCLIP's layers but the last, which single files hold and
    // readers skip; a folder holds only those run: its last layer stands in
    // for the one never run.
    if (!rc && j->openclip && j->text_skip == 0) {
        char from[96], to[96];
        snprintf(from, sizeof from, "cond_stage_model.model.transformer.resblocks.%d.", tc->layers - 1);
        snprintf(to, sizeof to, "cond_stage_model.model.transformer.resblocks.%d.", tc->layers);
        rc = dc_sd_tensors_copy(&t, from, to);
    }
    dc_kv kv = {0};
    if (!rc) rc = dc_kv_set(&kv, "prediction_type", "%s",
                            j->pred == DC_PRED_V ? "v_prediction" : j->pred == DC_PRED_SAMPLE ? "sample" : "epsilon");
    if (!rc) rc = dc_sd_tensors_write(&t, out, &kv);
    dc_kv_free(&kv);
    dc_sd_tensors_free(&t);
    // Single files carry no scheduler config: readers take SD 2's for v, SD 1's for epsilon.
    if (!rc && j->pred != (j->openclip ? DC_PRED_V : DC_PRED_EPS))
        dc_warn("%s: a single file does not say what its UNet predicts; programs assume %s for SD %d files, this "
                "one predicts %s: tell them (diffusion txt2img --prediction, a .yaml beside it for AUTOMATIC1111)",
                out, j->openclip ? "v" : "epsilon", j->openclip ? 2 : 1,
                j->pred == DC_PRED_V ? "v" : j->pred == DC_PRED_SAMPLE ? "the sample" : "epsilon");
    return rc;
}

// ---- a folder -----------------------------------------------------------------------------

static int copy_file(const char *from, const char *to) {
    int64_t size;
    int fd = dc_open_regular(from, &size);
    if (fd < 0) return -1;
    FILE *f = fopen(to, "wb");
    if (!f) return close(fd), dc_fail("%s: cannot create: %s", to, strerror(errno));
    static char buf[1 << 20];
    int rc = 0;
    for (int64_t done = 0; done < size && !rc; ) {
        size_t n = size - done < (int64_t)sizeof buf ? (size_t)(size - done) : sizeof buf;
        rc = dc_read_exact(fd, buf, n, from);
        if (!rc && fwrite(buf, 1, n, f) != n) rc = dc_fail("%s: write failed: %s", to, strerror(errno));
        done += (int64_t)n;
    }
    close(fd);
    if (fclose(f) != 0 && !rc) rc = dc_fail("%s: write failed: %s", to, strerror(errno));
    return rc;
}

// The configs, tokenizer files and safetensors weights of a component
// folder (not its pickles or other formats, which no reader here needs).
static bool wanted(const char *name) {
    static const char *const ends[] = {".json", ".txt", ".safetensors"};
    size_t n = strlen(name);
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(ends[i]);
        if (n > k && !strcmp(name + n - k, ends[i])) return true;
    }
    return false;
}

static int copy_component(const job *j, const char *dir, const char *part) {
    char from[4200], to[4200], a[4400], b[4400];
    DC_TRY(path_join(from, sizeof from, j->base, part));
    DC_TRY(path_join(to, sizeof to, dir, part));
    DIR *d = opendir(from);
    if (!d) return dc_fail("%s: cannot read the base model's %s: %s", from, part, strerror(errno));
    int rc = dc_mkdir_p(to), copied = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (!wanted(e->d_name)) continue;
        rc = path_join(a, sizeof a, from, e->d_name) || path_join(b, sizeof b, to, e->d_name) || copy_file(a, b);
        copied++;
    }
    closedir(d);
    if (!rc && !copied) rc = dc_fail("%s holds no config or weights to copy", from);
    return rc;
}

// scheduler/: the base's config (its class kept) with the run's prediction,
// or SD's own for a base without one.
static int write_scheduler(const job *j, const char *dir, char *cls, size_t cap) {
    char path[4200], out[4200];
    DC_TRY(path_join(out, sizeof out, dir, "scheduler"));
    DC_TRY(dc_mkdir_p(out));
    DC_TRY(path_join(out, sizeof out, dir, "scheduler/scheduler_config.json"));
    snprintf(cls, cap, "PNDMScheduler");
    if (!j->base_folder) return dc_sd_write_scheduler_config(NULL, j->pred, out);
    DC_TRY(path_join(path, sizeof path, j->base, "scheduler/scheduler_config.json"));
    if (access(path, F_OK) != 0) return dc_sd_write_scheduler_config(NULL, j->pred, out);
    dc_json_doc doc;
    DC_TRY(dc_json_read_file_opts(&doc, path, DC_JSON_NONFINITE));
    const dc_json *c = dc_json_get(doc.root, "_class_name");
    if (dc_json_is_cstr(c)) snprintf(cls, cap, "%s", c->str);
    int rc = dc_sd_write_scheduler_config(doc.root, j->pred, out);
    dc_json_free(&doc);
    return rc;
}

// text_encoder/ (config.json, model.safetensors) of the encoder loaded.
static int write_text(job *j, const char *dir) {
    char path[4200];
    dc_sd_tensors t = {0};
    const int layers = j->text->cfg.layers - j->text_skip;  // those SD runs, as diffusers' folders hold
    const dc_dtype tdt = part_dtype(j, j->text->params);
    int rc = path_join(path, sizeof path, dir, "text_encoder") || dc_mkdir_p(path);
    if (!rc) rc = path_join(path, sizeof path, dir, "text_encoder/config.json") ||
                  dc_sd_write_text_config(&j->text->cfg, layers, tdt, path);
    if (!rc) rc = path_join(path, sizeof path, dir, "text_encoder/model.safetensors") ||
                  dc_sd_add_text(&t, j->text, layers, DC_SD_TEXT_TRANSFORMERS, tdt) ||
                  dc_sd_tensors_write(&t, path, NULL);
    dc_sd_tensors_free(&t);
    return rc;
}

// text_encoder/, tokenizer/ and vae/ made from a single-file base.
static int write_parts(job *j, const char *dir) {
    if (!j->o->vocab)
        return dc_fail("%s holds no tokenizer: a CLIP vocabulary is needed to write tokenizer/", j->base);
    DC_TRY(load_base(j, true));
    char path[4200];
    dc_sd_tensors t = {0};
    const dc_dtype vdt = part_dtype(j, &j->vae->params);
    int rc = write_text(j, dir);
    if (!rc) rc = path_join(path, sizeof path, dir, "vae") || dc_mkdir_p(path);
    if (!rc) rc = path_join(path, sizeof path, dir, "vae/config.json") || dc_sd_write_vae_config(&j->vae->cfg, path);
    if (!rc) rc = path_join(path, sizeof path, dir, "vae/diffusion_pytorch_model.safetensors") ||
                  dc_sd_add_vae(&t, j->vae, false, vdt) || dc_sd_tensors_write(&t, path, NULL);
    if (!rc) rc = path_join(path, sizeof path, dir, "tokenizer") ||
                  dc_clip_vocab_write_files(j->o->vocab, path, j->openclip);
    dc_sd_tensors_free(&t);
    return rc;
}

static int write_folder(job *j, const char *dir) {
    char path[4200], cls[128];
    dc_sd_tensors t = {0};
    const dc_unet *u = dc_unet_of(j->unet);
    DC_TRY(path_join(path, sizeof path, dir, "unet"));
    DC_TRY(dc_mkdir_p(path));
    DC_TRY(path_join(path, sizeof path, dir, "unet/config.json"));
    DC_TRY(dc_sd_write_unet_config(&u->cfg, path));
    DC_TRY(path_join(path, sizeof path, dir, "unet/diffusion_pytorch_model.safetensors"));
    int rc = dc_sd_add_unet(&t, u, false, j->o->half ? DC_F16 : DC_F32) || dc_sd_tensors_write(&t, path, NULL);
    dc_sd_tensors_free(&t);
    DC_TRY(rc);
    if (j->base_folder) {
        // the encoder the run trained, else the base's as it is
        DC_TRY(j->text_trained ? load_base(j, false) || write_text(j, dir) : copy_component(j, dir, "text_encoder"));
        DC_TRY(copy_component(j, dir, "tokenizer"));
        if (!j->pixel) DC_TRY(copy_component(j, dir, "vae"));
    } else {
        DC_TRY(write_parts(j, dir));
    }
    DC_TRY(write_scheduler(j, dir, cls, sizeof cls));
    DC_TRY(path_join(path, sizeof path, dir, "model_index.json"));
    return dc_sd_write_model_index(cls, true, !j->pixel, path);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int export_folder(job *j, const char *out) {
    struct stat st;
    if (lstat(out, &st) == 0)
        return dc_fail("%s already exists: remove it or choose another name (a folder is not replaced)", out);
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid()) >= (int)sizeof tmp)
        return dc_fail("%s: path too long", out);
    if (mkdir(tmp, 0777) != 0) return dc_fail("%s: cannot create: %s", tmp, strerror(errno));
    int rc = write_folder(j, tmp);
    if (!rc && rename(tmp, out) != 0) rc = dc_fail("%s: cannot rename to %s: %s", tmp, out, strerror(errno));
    if (rc) nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}

// ---- a base with LoRAs merged ------------------------------------------------------------

// The base's UNet (in fp32) and text encoder, each LoRA merged into both,
// and the base's own prediction (what its scheduler config says).
static int merge_base(job *j, const char *const *loras, const float *weights, int n) {
    struct stat st;
    if (stat(j->base, &st) != 0) return dc_fail("%s: %s", j->base, strerror(errno));
    j->base_folder = S_ISDIR(st.st_mode);
    dc_sd_pipe p;
    const dc_sd_open_opts po = {.model = j->base, .vocab = j->o->vocab, .st_flags = j->o->st_flags, .prediction = -1};
    DC_TRY(dc_sd_pipe_find(&p, &po));
    j->pred = p.prediction;
    const bool run = p.files.run;
    dc_sd_pipe_close(&p);
    if (run) return dc_fail("%s is a training run: export it (diffusion export), then merge into that", j->base);
    dc_sd_model m;
    dc_sd_source s = {0};
    DC_TRY(dc_sd_model_open(&m, j->base, j->o->st_flags));
    int rc = dc_sd_source_open(&s, &m, DC_SD_UNET);
    dc_unet_config c;
    if (!rc) rc = dc_sd_unet_config(&s, NULL, &c);
    if (!rc) rc = dc_unet_new(&c, j->be, DC_F32, 1 << (c.nblocks - 1), 1 << (c.nblocks - 1), &j->unet);
    if (!rc) rc = dc_unet_load(j->unet, &s.w, s.names);
    dc_sd_source_close(&s);
    dc_sd_model_close(&m);
    if (!rc) rc = load_base(j, false);  // the text encoder
    j->text_trained = true;             // written from j->text, as merged
    for (int i = 0; i < n && !rc; i++) {
        dc_st_file f;
        dc_lora lu, lt;
        DC_TRY(dc_st_open(&f, loras[i]));
        dc_lora_init(&lu, j->unet->params), dc_lora_init(&lt, j->text->params);
        lu.multiplier = lt.multiplier = weights[i];
        rc = dc_sd_lora_read(&f, &lu, &lt);
        if (!rc && lu.count) rc = dc_lora_merge(&lu);
        if (!rc && lt.count) rc = dc_lora_merge(&lt);
        dc_lora_free(&lu), dc_lora_free(&lt);
        dc_st_close(&f);
    }
    return rc;
}

// Writes the job's model to out (rc: how getting it went), then frees it.
static int write_job(job *j, int rc, const char *out) {
    if (!rc && j->base_folder) rc = find_pixel_space(j);
    if (!rc) rc = dc_sd_export_is_file(out) ? export_file(j, out) : export_folder(j, out);
    dc_model_free(j->unet);
    if (j->text) dc_clip_text_free(j->text);
    if (j->vae) dc_vae_free(j->vae);
    return rc;
}

int dc_sd_lora_merge_write(const char *base, const char *const *loras, const float *weights, int n, const char *out,
                           const dc_sd_export_opts *o, dc_backend *be) {
    job j = {.o = o, .be = be, .base = base};
    return write_job(&j, merge_base(&j, loras, weights, n), out);
}

int dc_sd_export(const dc_st_file *ckpt, const char *out, const dc_sd_export_opts *o, dc_backend *be,
                 const char **which) {
    job j = {.ckpt = ckpt, .o = o, .be = be};
    return write_job(&j, read_checkpoint(&j, which), out);
}
