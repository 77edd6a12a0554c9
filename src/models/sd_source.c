#include "models/sd_source.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fsutil.h"

const char *dc_sd_part_name(dc_sd_part p) {
    return p == DC_SD_UNET ? "unet" : p == DC_SD_VAE ? "vae" : "text_encoder";
}

// The class diffusers / transformers write in a component's config.json.
static const char *part_class(dc_sd_part p) {
    return p == DC_SD_UNET ? "UNet2DConditionModel" : p == DC_SD_VAE ? "AutoencoderKL" : "CLIPTextModel";
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
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

int dc_sd_model_open(dc_sd_model *m, const char *path, unsigned flags) {
    memset(m, 0, sizeof *m);
    if (snprintf(m->path, sizeof m->path, "%s", path) >= (int)sizeof m->path) return dc_fail("path too long");
    m->st_flags = flags;
    if (is_dir(path)) {
        m->folder = true;
        return 0;
    }
    if (!dc_file_exists(path)) return dc_fail("%s: no such file or folder", path);
    DC_TRY(dc_st_open_opts(&m->file, path, flags));
    m->single = has_prefix(&m->file, "model.diffusion_model.") || has_prefix(&m->file, "first_stage_model.") ||
                has_prefix(&m->file, "cond_stage_model.");
    m->version = version_of(&m->file, m->single ? "model.diffusion_model." : "");
    return 0;
}

void dc_sd_model_close(dc_sd_model *m) {
    dc_st_close(&m->file);
    memset(m, 0, sizeof *m);
}

void dc_sd_source_close(dc_sd_source *s) {
    for (int i = 0; i < s->nfiles_owned; i++) dc_st_close(&s->files[i]);
    dc_json_free(&s->config);
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
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

// The weight files of a folder: the shards an index names, else the plain
// file, else the fp16 variant, else the only *.safetensors there.
static int pick_files(dc_sd_source *s, char names[][256], int *count) {
    DIR *d = opendir(s->dir);
    if (!d) return dc_fail("%s: cannot list the folder", s->dir);
    char *all[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64)
        if (ends_with(e->d_name, ".safetensors") && e->d_name[0] != '.') all[n++] = strdup(e->d_name);
    closedir(d);
    qsort(all, (size_t)n, sizeof *all, cmp_str);
    *count = 0;
    const char *plain[] = {"diffusion_pytorch_model.safetensors", "model.safetensors",
                           "diffusion_pytorch_model.fp16.safetensors", "model.fp16.safetensors"};
    for (int k = 0; k < 4 && !*count; k++)
        for (int i = 0; i < n; i++)
            if (!strcmp(all[i], plain[k])) snprintf(names[(*count)++], 256, "%s", all[i]);
    // Shards (name-00001-of-00002.safetensors): all of one variant, in order.
    for (int i = 0; i < n && !*count; i++)
        if (strstr(all[i], "-of-") && !strstr(all[i], ".fp16."))
            for (int j = i; j < n && *count < DC_SD_MAX_FILES; j++)
                if (strstr(all[j], "-of-") && !strstr(all[j], ".fp16.")) snprintf(names[(*count)++], 256, "%s", all[j]);
    for (int i = 0; i < n && !*count; i++)
        if (strstr(all[i], "-of-"))
            for (int j = i; j < n && *count < DC_SD_MAX_FILES; j++)
                if (strstr(all[j], "-of-")) snprintf(names[(*count)++], 256, "%s", all[j]);
    if (!*count && n == 1) snprintf(names[(*count)++], 256, "%s", all[0]);
    int total = n;
    for (int i = 0; i < n; i++) free(all[i]);
    if (!*count)
        return total ? dc_fail("%s: %d *.safetensors files and none of the names diffusers writes "
                               "(diffusion_pytorch_model.safetensors, model.safetensors): name the file instead",
                               s->dir, total)
                     : dc_fail("%s: no *.safetensors weights (files in other formats, such as .bin or .ckpt, "
                               "are not read: save them as safetensors)", s->dir);
    return 0;
}

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
    if (is_dir(sub)) {
        snprintf(s->dir, sizeof s->dir, "%s", sub);
    } else {
        // A component's own folder: its config.json names its class.
        DC_TRY(join(cfg, sizeof cfg, m->path, "config.json"));
        if (!dc_file_exists(cfg))
            return dc_fail("%s: neither a pipeline folder with %s/ nor a component folder with config.json",
                           m->path, dc_sd_part_name(s->part));
        snprintf(s->dir, sizeof s->dir, "%s", m->path);
    }
    DC_TRY(join(cfg, sizeof cfg, s->dir, "config.json"));
    if (dc_file_exists(cfg)) {
        DC_TRY(dc_json_read_file(&s->config, cfg));
        if (s->config.root->type != DC_JSON_OBJECT) return dc_fail("%s: not a JSON object", cfg);
        DC_TRY(check_class(s, s->dir));
    }
    char names[DC_SD_MAX_FILES][256];
    int n;
    DC_TRY(pick_files(s, names, &n));
    for (int i = 0; i < n; i++) {
        char file[4400];
        DC_TRY(join(file, sizeof file, s->dir, names[i]));
        DC_TRY(dc_st_open_opts(&s->files[i], file, m->st_flags));
        s->nfiles_owned = s->nfiles = i + 1;
    }
    s->w.files = s->files, s->w.nfiles = s->nfiles;
    s->names = DC_NAMES_DIFFUSERS;
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

int dc_sd_source_open(dc_sd_source *s, dc_sd_model *m, dc_sd_part part) {
    memset(s, 0, sizeof *s);
    s->part = part;
    int rc = m->folder ? source_folder(s, m) : m->single ? source_single(s, m) : source_file(s, m);
    if (rc == 0 && part == DC_SD_TEXT && s->names == DC_NAMES_DIFFUSERS && !m->single &&
        dc_weights_has(&s->w, "text_model.embeddings.token_embedding.weight"))
        snprintf(s->w.prefix, sizeof s->w.prefix, "text_model.");  // written by transformers 4
    if (rc != 0) dc_sd_source_close(s);
    return rc;
}

int dc_sd_prediction(const dc_sd_model *m, bool *v) {
    if (!m->folder) return 1;
    char cfg[4200];
    DC_TRY(join(cfg, sizeof cfg, m->path, "scheduler/scheduler_config.json"));
    if (!dc_file_exists(cfg)) return 1;
    dc_json_doc doc;
    DC_TRY(dc_json_read_file(&doc, cfg));
    const dc_json *p = dc_json_get(doc.root, "prediction_type");
    int rc = 1;
    if (p && dc_json_is_cstr(p)) {
        if (!strcmp(p->str, "epsilon") || !strcmp(p->str, "v_prediction"))
            *v = p->str[0] == 'v', rc = 0;
        else
            rc = dc_fail("%s: prediction_type '%s' is not supported (epsilon or v_prediction)", cfg, p->str);
    }
    dc_json_free(&doc);
    return rc;
}

const char *dc_sd_tokenizer_dir(const dc_sd_model *m, char *buf, size_t cap) {
    if (!m->folder) return NULL;
    char vocab[4200];
    if (snprintf(buf, cap, "%s/tokenizer", m->path) >= (int)cap) return NULL;
    snprintf(vocab, sizeof vocab, "%s/vocab.json", buf);
    return dc_file_exists(vocab) ? buf : NULL;
}
