#include "models/sd_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/checkpoint_files.h"
#include "models/unet_text.h"
#include "models/model.h"

const char *dc_sd_part_name(dc_sd_part p) {
    return p == DC_SD_UNET ? "unet" : p == DC_SD_VAE ? "vae" : "text_encoder";
}

// The class diffusers / transformers write in a component's config.json.
static const char *part_class(dc_sd_part p) {
    return p == DC_SD_UNET ? "UNet2DConditionModel" : p == DC_SD_VAE ? "AutoencoderKL" : "CLIPTextModel";
}

// A folder that exists: 1; 0 when there is nothing there (or a file); -1 when
// the path cannot be reached (a loop of symbolic links, no permission).
static int dir_at(const char *path) {
    int e = dc_sd_path_exists(path);
    if (e <= 0) return e;
    bool dir;
    DC_TRY(dc_sd_path_check(path, -1, &dir));
    return dir;
}

static bool has_prefix(const dc_st_file *f, const char *prefix) {
    size_t n = strlen(prefix);
    for (int i = 0; i < f->count; i++)
        if (strncmp(f->tensors[i].name, prefix, n) == 0) return true;
    return false;
}

static int join(char *out, size_t cap, const char *dir, const char *name) {
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap) return dc_fail("path too long: %s/%s", dir, name);
    return 0;
}

// SD 1.x or 2.x from the text encoder's names, else the cross-attention width.
static int version_of(const dc_st_file *f, const char *unet_prefix) {
    if (has_prefix(f, "cond_stage_model.model.")) return 2;
    if (has_prefix(f, "cond_stage_model.transformer.")) return 1;
    char name[256];
    const char *k = unet_prefix[0] ? "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"
                                   : "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight";
    snprintf(name, sizeof name, "%s%s", unet_prefix, k);
    const dc_st_tensor *t = dc_st_find(f, name);
    if (t && t->ndim == 2) return t->shape[1] == 1024 ? 2 : t->shape[1] == 768 ? 1 : 0;
    return 0;
}

// ---- model_index.json ---------------------------------------------------------------------

// The pipelines whose components and use are those of SD 1.x / 2.x text to image.
static const char *const k_pipelines[] = {"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", NULL};

// model_index.json's entry for component `name`: 1 a [library, class] pair
// whose class is checked by want (a prefix; NULL: any ending in "Scheduler"),
// 0 [null, null] (an error unless nullable), -1 absent (when required, an error).
static int index_entry(const dc_json *root, const char *path, const char *name, const char *want, bool required,
                       bool nullable, int *out) {
    const dc_json *v = dc_json_get(root, name);
    *out = -1;
    if (!v) return required ? dc_fail("%s names no %s (a Stable Diffusion pipeline has one)", path, name) : 0;
    if (v->type != DC_JSON_ARRAY || v->nkids != 2)
        return dc_fail("%s: '%s' must be [library, class]", path, name);
    const dc_json *cls = &v->kids[1];
    if (cls->type == DC_JSON_NULL) {
        if (!nullable) return dc_fail("%s: '%s' is null: a Stable Diffusion pipeline needs one", path, name);
        return *out = 0, 0;
    }
    if (!dc_json_is_cstr(cls)) return dc_fail("%s: '%s' must be [library, class]", path, name);
    bool ok = want ? !strncmp(cls->str, want, strlen(want))
                   : strlen(cls->str) > 9 && !strcmp(cls->str + strlen(cls->str) - 9, "Scheduler");
    if (!ok)
        return dc_fail("%s: '%s' is a %.100s, not %s%s", path, name, cls->str, want ? "a " : "a scheduler",
                       want ? want : "");
    return *out = 1, 0;
}

static int read_model_index(dc_sd_model *m) {
    char path[4200];
    m->tokenizer = m->scheduler = -1;
    DC_TRY(join(path, sizeof path, m->path, "model_index.json"));
    int e = dc_sd_path_exists(path);
    if (e <= 0) return e;
    dc_json_doc doc;
    DC_TRY(dc_json_read_file(&doc, path));
    const dc_json *root = doc.root, *cls = dc_json_get(root, "_class_name");
    int rc = root->type == DC_JSON_OBJECT ? 0 : dc_fail("%s: not a JSON object", path);
    if (!rc && !dc_json_is_cstr(cls)) rc = dc_fail("%s: no _class_name (the pipeline's class)", path);
    int k = 0;
    while (!rc && k_pipelines[k] && strcmp(k_pipelines[k], cls->str)) k++;
    if (!rc && !k_pipelines[k])
        rc = dc_fail("%s: _class_name '%.100s' is not a pipeline the engine runs (StableDiffusionPipeline or "
                     "StableDiffusionImg2ImgPipeline: SD 1.x and 2.x)", path, cls->str);
    // A component is the folder of its name: no name that leads out of the model.
    for (int i = 0; !rc && i < root->nkids; i++) {
        const char *key = root->kids[i].key;
        if (root->kids[i].type != DC_JSON_ARRAY || key[0] == '_') continue;
        if (!key[0] || key[0] == '.' || strchr(key, '/') || strchr(key, '\\') || strlen(key) != root->kids[i].key_len)
            rc = dc_fail("%s: component '%.100s' is not a folder name of the model (no '/', no leading '.')", path, key);
    }
    int t;
    if (!rc) rc = index_entry(root, path, "unet", "UNet2DConditionModel", true, true, &m->unet);
    if (!rc) rc = index_entry(root, path, "vae", "AutoencoderKL", true, true, &m->vae);
    if (!rc) rc = index_entry(root, path, "text_encoder", "CLIPTextModel", true, false, &t);
    if (!rc) rc = index_entry(root, path, "tokenizer", "CLIPTokenizer", false, true, &m->tokenizer);
    if (!rc) rc = index_entry(root, path, "scheduler", NULL, false, true, &m->scheduler);
    if (!rc) snprintf(m->pipeline, sizeof m->pipeline, "%s", cls->str);
    dc_json_free(&doc);
    return rc;
}

// ---- a training run ----------------------------------------------------------------------
#define RUN_FORMAT "diffusion.c checkpoint"  // "... v2"; the version is the trainer's concern

// Whether f is a checkpoint the trainer wrote (any model).
static bool is_run_checkpoint(const dc_st_file *f) {
    const char *format = dc_st_meta(f, "format");
    return format && !strncmp(format, RUN_FORMAT, strlen(RUN_FORMAT));
}

// The run's checkpoint (m->file, open) describes a UNet trained on m->base:
// open that, and read the prediction the run trained.
static int open_run(dc_sd_model *m) {
    const dc_st_file *f = &m->file;
    const char *model = dc_st_meta(f, "model"), *base = dc_st_meta(f, "base_model");
    const char *pred = dc_st_meta(f, "prediction");
    m->run = true;
    if (!model || strcmp(model, "UNet2DConditionModel"))
        return dc_fail("%s is a training checkpoint of a %.100s, not of a Stable Diffusion UNet "
                       "(UNet2DConditionModel): sample it with `diffusion sample`", f->path, model ? model : "model");
    m->lora_run = dc_st_meta(f, "lora_rank") != NULL;
    if (!m->lora_run && !dc_st_find(f, "ema.conv_in.weight"))
        return dc_fail("%s: a training checkpoint without the EMA weights (ema.*) of its UNet", f->path);
    if (!base || !base[0])
        return dc_fail("%s: names no base model (metadata 'base_model': the tokenizer, text encoder, scheduler "
                       "and VAE its UNet was trained with)", f->path);
    m->run_prediction = DC_PRED_EPS;
    if (pred && !strcmp(pred, "v_prediction")) m->run_prediction = DC_PRED_V;
    else if (pred && !strcmp(pred, "sample")) m->run_prediction = DC_PRED_SAMPLE;
    else if (pred && strcmp(pred, "epsilon"))
        return dc_fail("%s: metadata 'prediction' = '%.100s' is not epsilon, v_prediction or sample", f->path, pred);
    int e = dc_sd_path_exists(base);
    if (e < 0) return dc_fail_ctx("%s: its base model", f->path);
    if (!e)
        return dc_fail("%s: its base model %s (the tokenizer, text encoder, scheduler and VAE the run uses) is "
                       "missing: put it back there, or make the run self-contained with `diffusion export`",
                       f->path, base);
    if (!(m->base = calloc(1, sizeof *m->base))) return dc_fail("out of memory");
    if (dc_sd_model_open(m->base, base, m->st_flags)) return dc_fail_ctx("%s: its base model", f->path);
    if (m->base->run)
        return dc_fail("%s: its base model %s is itself a training run: name the model that run started from",
                       f->path, base);
    m->version = m->base->version;
    return 0;
}

int dc_sd_model_open(dc_sd_model *m, const char *path, unsigned flags) {
    memset(m, 0, sizeof *m);
    m->tokenizer = m->scheduler = m->unet = m->vae = -1;
    if (snprintf(m->path, sizeof m->path, "%s", path) >= (int)sizeof m->path) return dc_fail("path too long");
    m->st_flags = flags;
    bool dir;
    DC_TRY(dc_sd_path_check(path, -1, &dir));
    if (dir) {
        char index[4200];
        DC_TRY(join(index, sizeof index, path, "model_index.json"));
        int e = dc_sd_path_exists(index);
        if (e < 0) return -1;
        // A folder of checkpoints (and no pipeline's index) is a run folder.
        if (!e && dc_checkpoint_list(path, NULL) > 0) {
            DC_TRY(dc_checkpoint_open(path, flags, &m->file));
            return open_run(m);
        }
        m->folder = true;
        return read_model_index(m);
    }
    DC_TRY(dc_sd_refuse_pickle(path));
    DC_TRY(dc_st_open_opts(&m->file, path, flags));
    if (is_run_checkpoint(&m->file)) return open_run(m);
    m->single = has_prefix(&m->file, "model.diffusion_model.") || has_prefix(&m->file, "first_stage_model.") ||
                has_prefix(&m->file, "cond_stage_model.");
    m->version = version_of(&m->file, m->single ? "model.diffusion_model." : "");
    return 0;
}

bool dc_sd_model_pixel_space(const dc_sd_model *m) {
    if (m->run) return dc_sd_model_pixel_space(m->base);
    if (m->single) return !has_prefix(&m->file, "first_stage_model.");
    if (!m->folder) return false;
    if (m->vae >= 0) return m->vae == 0;
    // No model_index.json: a pipeline folder (text_encoder/ in it) without vae/.
    char sub[4200];
    if (join(sub, sizeof sub, m->path, "vae") || dir_at(sub) != 0) return false;
    return join(sub, sizeof sub, m->path, "text_encoder") == 0 && dir_at(sub) == 1;
}

void dc_sd_model_close(dc_sd_model *m) {
    if (m->base) dc_sd_model_close(m->base), free(m->base);
    dc_st_close(&m->file);
    memset(m, 0, sizeof *m);
}

void dc_sd_source_close(dc_sd_source *s) {
    for (int i = 0; i < s->nfiles_owned; i++) dc_st_close(&s->files[i]);
    dc_json_free(&s->config);
    dc_json_free(&s->index);
    memset(s, 0, sizeof *s);
}

// ---- a component inside a single-file checkpoint ----------------------------------------
static int source_single(dc_sd_source *s, dc_sd_model *m) {
    const dc_st_file *f = &m->file;
    s->w.files = &m->file, s->w.nfiles = 1;
    const char *prefix = NULL;
    s->names = DC_NAMES_ORIGINAL;
    if (s->part == DC_SD_UNET) {
        prefix = "model.diffusion_model.";
    } else if (s->part == DC_SD_VAE) {
        prefix = "first_stage_model.";
    } else if (has_prefix(f, "cond_stage_model.transformer.text_model.")) {
        prefix = "cond_stage_model.transformer.text_model.", s->names = DC_NAMES_DIFFUSERS;  // OpenAI CLIP
    } else if (has_prefix(f, "cond_stage_model.transformer.")) {
        prefix = "cond_stage_model.transformer.", s->names = DC_NAMES_DIFFUSERS;  // older transformers
    } else {
        prefix = "cond_stage_model.model.";  // OpenCLIP
    }
    if (!has_prefix(f, prefix))
        return dc_fail("%s: this checkpoint holds no %s (no tensors under '%s')", f->path, dc_sd_part_name(s->part),
                       prefix);
    snprintf(s->w.prefix, sizeof s->w.prefix, "%s", prefix);
    return 0;
}

// ---- a component's folder ---------------------------------------------------------------
static int check_class(const dc_sd_source *s, const char *where) {
    const dc_json *c = dc_json_get(s->config.root, "_class_name");
    if (c && dc_json_is_cstr(c) && strcmp(c->str, part_class(s->part)) != 0 &&
        !(s->part == DC_SD_TEXT && !strncmp(c->str, "CLIPTextModel", 13)))
        return dc_fail("%s: holds a %s, not the %s (%s) asked for", where, c->str, part_class(s->part),
                       dc_sd_part_name(s->part));
    return 0;
}

static int source_folder(dc_sd_source *s, const dc_sd_model *m) {
    char sub[4096], cfg[4200];
    DC_TRY(join(sub, sizeof sub, m->path, dc_sd_part_name(s->part)));
    int d = dir_at(sub);
    if (d < 0) return -1;
    if (d) {
        snprintf(s->dir, sizeof s->dir, "%s", sub);
    } else {
        // A component's own folder: its config.json names its class.
        DC_TRY(join(cfg, sizeof cfg, m->path, "config.json"));
        int e = dc_sd_path_exists(cfg);
        if (e < 0) return -1;
        if (!e)
            return dc_fail("%s: neither a pipeline folder with %s/, nor a component folder with config.json, nor a "
                           "training run folder (step_NNNNNNN.safetensors)", m->path, dc_sd_part_name(s->part));
        snprintf(s->dir, sizeof s->dir, "%s", m->path);
    }
    DC_TRY(join(cfg, sizeof cfg, s->dir, "config.json"));
    int e = dc_sd_path_exists(cfg);
    if (e < 0) return -1;
    if (e) {
        DC_TRY(dc_json_read_file(&s->config, cfg));
        if (s->config.root->type != DC_JSON_OBJECT) return dc_fail("%s: not a JSON object", cfg);
        DC_TRY(check_class(s, s->dir));
    }
    DC_TRY(dc_sd_pick_weights(s->dir, s->fnames, &s->nfnames, &s->index, s->index_name, sizeof s->index_name));
    s->names = DC_NAMES_DIFFUSERS;
    return 0;
}

int dc_sd_source_open_files(dc_sd_source *s) {
    for (int i = s->nfiles; i < s->nfnames; i++) {
        char file[4400];
        DC_TRY(join(file, sizeof file, s->dir, s->fnames[i]));
        DC_TRY(dc_sd_path_check(file, 0, NULL));
        DC_TRY(dc_sd_refuse_pickle(file));
        DC_TRY(dc_st_open_opts(&s->files[i], file, s->st_flags));
        s->nfiles_owned = s->nfiles = i + 1;
    }
    if (s->nfnames) {
        char ipath[4400];
        snprintf(ipath, sizeof ipath, "%s/%s", s->dir, s->index_name);
        DC_TRY(dc_sd_check_shards(s->files, s->nfiles, dc_json_get(s->index.root, "weight_map"), ipath));
        s->w.files = s->files, s->w.nfiles = s->nfiles;
    }
    if (s->part == DC_SD_TEXT && s->names == DC_NAMES_DIFFUSERS && !s->w.prefix[0] &&
        dc_weights_has(&s->w, "text_model.embeddings.token_embedding.weight"))
        snprintf(s->w.prefix, sizeof s->w.prefix, "text_model.");  // written by transformers 4
    return 0;
}

// ---- one component's weights file on its own ----------------------------------------------
static dc_sd_part part_of_file(const dc_st_file *f, bool *known) {
    *known = true;
    if (dc_st_find(f, "encoder.conv_in.weight") || dc_st_find(f, "decoder.conv_in.weight")) return DC_SD_VAE;
    if (dc_st_find(f, "conv_in.weight")) return DC_SD_UNET;
    if (has_prefix(f, "text_model.") || dc_st_find(f, "embeddings.token_embedding.weight")) return DC_SD_TEXT;
    *known = false;
    return DC_SD_UNET;
}

static int source_file(dc_sd_source *s, dc_sd_model *m) {
    bool known;
    dc_sd_part p = part_of_file(&m->file, &known);
    if (!known)
        return dc_fail("%s: neither a Stable Diffusion checkpoint nor a UNet, VAE or text encoder in diffusers' "
                       "names", m->path);
    if (p != s->part)
        return dc_fail("%s: holds a %s, not the %s asked for", m->path, dc_sd_part_name(p), dc_sd_part_name(s->part));
    s->w.files = &m->file, s->w.nfiles = 1;
    s->names = DC_NAMES_DIFFUSERS;
    // Its config.json, when the file sits in its component folder.
    char dir[4096], cfg[4200];
    snprintf(dir, sizeof dir, "%s", m->path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    DC_TRY(join(cfg, sizeof cfg, dir, "config.json"));
    if (dc_file_exists(cfg)) {
        DC_TRY(dc_json_read_file(&s->config, cfg));
        if (s->config.root->type != DC_JSON_OBJECT) return dc_fail("%s: not a JSON object", cfg);
        if (check_class(s, cfg)) dc_json_free(&s->config);  // another component's config: ignore it
    }
    return 0;
}

// A run's UNet, or the text encoder it trained along: the EMA weights of its
// checkpoint ("ema." + the UNet's names, "ema.text_encoder." + the
// encoder's), the config in its metadata.
static int source_run(dc_sd_source *s, dc_sd_model *m) {
    s->w.files = &m->file, s->w.nfiles = 1;
    snprintf(s->w.prefix, sizeof s->w.prefix, "ema.%s", s->part == DC_SD_TEXT ? DC_UNET_TEXT_PREFIX : "");
    s->names = DC_NAMES_DIFFUSERS;
    s->meta = &m->file;
    return 0;
}

bool dc_sd_run_trains_text(const dc_sd_model *m) {
    return m->run && dc_st_find(&m->file, "ema." DC_UNET_TEXT_PREFIX "embeddings.token_embedding.weight");
}

int dc_sd_source_find(dc_sd_source *s, dc_sd_model *m, dc_sd_part part) {
    const bool own = !m->lora_run && (part == DC_SD_UNET || (part == DC_SD_TEXT && dc_sd_run_trains_text(m)));
    if (m->run && !own) return dc_sd_source_find(s, m->base, part);
    memset(s, 0, sizeof *s);
    s->part = part;
    s->st_flags = m->st_flags;
    if (m->run) return source_run(s, m);
    if (part == DC_SD_VAE && dc_sd_model_pixel_space(m))
        return dc_fail("%s has no VAE: its UNet draws pixels", m->path);
    if (part == DC_SD_UNET && m->unet == 0)
        return dc_fail("%s/model_index.json names no UNet (\"unet\": [null, null]): it is a base to train one from "
                       "(`diffusion train`), not a model that draws", m->path);
    int rc = m->folder ? source_folder(s, m) : m->single ? source_single(s, m) : source_file(s, m);
    // a single file's components carry their names as they are
    if (rc == 0 && !m->folder && !m->single) rc = dc_sd_source_open_files(s);
    if (rc != 0) dc_sd_source_close(s);
    return rc;
}

int dc_sd_source_open(dc_sd_source *s, dc_sd_model *m, dc_sd_part part) {
    DC_TRY(dc_sd_source_find(s, m, part));
    int rc = dc_sd_source_open_files(s);
    if (rc != 0) dc_sd_source_close(s);
    return rc;
}

int dc_sd_scheduler_file(const dc_sd_model *m, char *buf, size_t cap) {
    if (m->run) return dc_sd_scheduler_file(m->base, buf, cap);
    if (!m->folder || m->scheduler == 0) return 1;
    DC_TRY(join(buf, cap, m->path, "scheduler/scheduler_config.json"));
    int e = dc_sd_path_exists(buf);
    if (e < 0) return -1;
    if (!e && m->scheduler == 1)
        return dc_fail("%s/model_index.json names a scheduler, but %s is missing", m->path, buf);
    return e ? 0 : 1;
}

const char *dc_sd_tokenizer_dir(const dc_sd_model *m, char *buf, size_t cap) {
    if (m->run) return dc_sd_tokenizer_dir(m->base, buf, cap);
    if (!m->folder || m->tokenizer == 0) return NULL;
    char vocab[4200];
    if (snprintf(buf, cap, "%s/tokenizer", m->path) >= (int)cap) return NULL;
    snprintf(vocab, sizeof vocab, "%s/vocab.json", buf);
    return dc_file_exists(vocab) ? buf : NULL;
}
