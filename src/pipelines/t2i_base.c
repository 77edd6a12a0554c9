#include "pipelines/t2i_base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/json.h"
#include "models/sd_files.h"
#include "models/vae.h"
#include "pipelines/prepare.h"
#include "pipelines/sd.h"

// prepare.json's "buckets": [{"folder": "WxH", ...}, ...], each folder a
// data set of its own below the data set's.
static int read_buckets(dc_t2i_base *b, const dc_json *bk, const char *data, const char *path) {
    if (bk->type != DC_JSON_ARRAY || bk->nkids < 1 || bk->nkids > DC_T2I_MAX_BUCKETS)
        return dc_fail("%s: \"buckets\" is not a list of 1 to %d buckets", path, DC_T2I_MAX_BUCKETS);
    b->buckets = calloc((size_t)bk->nkids, sizeof *b->buckets);
    if (!b->buckets) return dc_fail("out of memory");
    for (int i = 0; i < bk->nkids; i++) {
        const dc_json *f = dc_json_get(&bk->kids[i], "folder");
        int w, h, n = 0;
        if (!dc_json_is_cstr(f) || sscanf(f->str, "%dx%d%n", &w, &h, &n) != 2 || f->str[n])
            return dc_fail("%s: bucket %d has no \"folder\": \"WxH\"", path, i);
        const size_t len = strlen(data) + strlen(f->str) + 2;
        if (!(b->buckets[b->nbuckets] = malloc(len))) return dc_fail("out of memory");
        snprintf(b->buckets[b->nbuckets++], len, "%s/%s", data, f->str);
    }
    return 0;
}

// prepare.json: latents or pixels, and the scaling factor of latents. A data
// set whose latents column is named need not have one.
static int read_prepare_json(dc_t2i_base *b, const dc_t2i_opts *o) {
    const char *data = o->data;
    char path[4200];
    snprintf(path, sizeof path, "%s/prepare.json", data);
    if (o->latents_column && !dc_sd_path_exists(path)) return b->latents = true, 0;
    dc_json_doc doc = {0};
    if (dc_json_read_file(&doc, path))
        return dc_fail_ctx("%s is not a data set `diffusion prepare` wrote (its prepare.json)", data);
    const dc_json *lat = dc_json_get(doc.root, "latents"), *scale = dc_json_get(doc.root, "latent_scaling_factor"),
                  *applied = dc_json_get(doc.root, "latent_scaling_applied");
    int rc = 0;
    if (!lat || (lat->type != DC_JSON_TRUE && lat->type != DC_JSON_FALSE))
        rc = dc_fail("%s: no \"latents\": true or false", path);
    b->latents = !rc && (lat->type == DC_JSON_TRUE || o->latents_column);
    if (!rc && lat->type == DC_JSON_TRUE) {
        if (!scale || scale->type != DC_JSON_NUMBER || !(scale->num > 0) || !isfinite(scale->num))
            rc = dc_fail("%s: latents without a positive \"latent_scaling_factor\"", path);
        else if (applied && applied->type != DC_JSON_FALSE)
            rc = dc_fail("%s: latents already scaled (\"latent_scaling_applied\" is not false): the trainer scales "
                         "them itself", path);
        else
            b->latent_scale = (float)scale->num;
    }
    const dc_json *bk = rc ? NULL : dc_json_get(doc.root, "buckets");
    if (bk && bk->type != DC_JSON_NULL) rc = read_buckets(b, bk, data, path);
    dc_json_free(&doc);
    return rc;
}

// The scaling factor of the base VAE's config (or, for a single file
// without one, of the VAE its tensors describe).
static int vae_scale(dc_t2i_base *b, dc_sd_model *files, const char *model) {
    if (dc_sd_model_pixel_space(files))
        return dc_fail("%s has no VAE whose scaling factor scales the data's latents: give the factor", model);
    dc_sd_source s = {0};
    dc_vae_config c;
    int rc = dc_sd_source_find(&s, files, DC_SD_VAE);
    if (!rc) rc = dc_sd_config(&s) ? dc_vae_config_from_json(&c, dc_sd_config(&s), s.dir) : dc_sd_source_open_files(&s);
    if (!rc && !dc_sd_config(&s)) rc = dc_vae_config_infer(&c, &s.w, s.names);
    if (!rc) b->latent_scale = c.scaling_factor;
    dc_sd_source_close(&s);
    return rc;
}

// The UNet's config (config.json, else its tensors' shapes), or why there is none.
static int unet_config(dc_t2i_base *b, dc_sd_model *files) {
    dc_sd_source s = {0};
    if (dc_sd_source_find(&s, files, DC_SD_UNET)) {
        snprintf(b->no_unet, sizeof b->no_unet, "%s", dc_error());
        return 0;
    }
    int rc = dc_sd_config(&s) ? 0 : dc_sd_source_open_files(&s);  // described by its tensors' shapes
    if (!rc) rc = dc_sd_unet_config(&s, NULL, &b->unet);
    dc_sd_source_close(&s);
    b->has_unet = rc == 0;
    return rc;
}

// "" through the base's text encoder, on the CPU in fp32.
static int embed_empty_prompt(dc_t2i_base *b, const dc_t2i_opts *o) {
    dc_backend *cpu = NULL;
    dc_prepare_models m = {0};
    const dc_prepare_opts po = {.model = o->model, .vocab = o->vocab, .vocab_fallback = o->vocab_fallback, .st_flags = o->st_flags,
                                .no_vae = true};
    DC_TRY(dc_backend_create("cpu", &cpu));
    int rc = dc_prepare_models_load(&m, &po, cpu);
    dc_buf ctx = dc_buf_none();
    if (!rc) {
        b->text_len = m.sd.text->cfg.positions, b->text_dim = m.sd.text->cfg.width;
        b->text = m.sd.text->cfg;
        b->text.layers -= m.sd.text_skip;
        b->tok = m.sd.tok;  // kept: the pipeline's closing forgets it
        m.sd.tok = (dc_clip_tokenizer){.v = NULL};
        b->text_null = malloc(sizeof(float) * (size_t)b->text_len * (size_t)b->text_dim);
        rc = b->text_null ? dc_buf_alloc(cpu, &ctx, DC_F32, (int64_t)b->text_len * b->text_dim, "empty prompt")
                          : dc_fail("out of memory");
    }
    const char *empty = "";
    int32_t ids[DC_CLIP_CONTEXT];
    int count = 0;
    if (!rc) rc = dc_clip_tokenize(&m.sd.tok, empty, ids, &count);
    if (!rc) rc = dc_sd_encode_prompts(&m.sd, &empty, 1, ctx);
    if (!rc) {
        cpu->download(cpu, b->text_null, ctx.p, sizeof(float) * (size_t)b->text_len * (size_t)b->text_dim);
        b->text_null_len = dc_clip_counted(count);  // with BOS and EOS, as prepare counts a caption's
    }
    if (ctx.p) cpu->free(cpu, ctx.p);
    dc_prepare_models_close(&m);
    dc_backend_destroy(cpu);
    return rc;
}

int dc_t2i_base_open(dc_t2i_base *b, const dc_t2i_opts *o) {
    memset(b, 0, sizeof *b);
    dc_sd_sched_cfg_default(&b->sched);
    dc_sd_model files = {0};
    int rc = read_prepare_json(b, o);
    if (!rc && o->latent_scale > 0) {
        if (b->latent_scale > 0 && b->latent_scale != o->latent_scale)
            rc = dc_fail("%s: its prepare.json gives the latents' scaling factor (%g), not %g", o->data,
                         b->latent_scale, o->latent_scale);
        b->latent_scale = o->latent_scale;
    }
    if (!rc) rc = dc_sd_model_open(&files, o->model, o->st_flags);
    if (!rc && b->latents && !(b->latent_scale > 0)) rc = vae_scale(b, &files, o->model);
    if (!rc) rc = unet_config(b, &files);
    char sched[4200];
    int has = rc ? 0 : dc_sd_scheduler_file(&files, sched, sizeof sched);
    if (has < 0) rc = -1;
    if (!rc && has == 0) rc = dc_sd_sched_cfg_read(&b->sched, sched);
    dc_sd_model_close(&files);
    if (!rc) rc = embed_empty_prompt(b, o);
    if (!rc && b->has_unet && b->unet.ctx_dim != b->text_dim)
        rc = dc_fail("%s: the UNet reads text embeddings %d wide, the text encoder makes %d", o->model,
                     b->unet.ctx_dim, b->text_dim);
    if (rc) dc_t2i_base_free(b);
    return rc;
}

void dc_t2i_base_free(dc_t2i_base *b) {
    dc_sd_sched_cfg_free(&b->sched);
    free(b->text_null);
    for (int i = 0; i < b->nbuckets; i++) free(b->buckets[i]);
    free(b->buckets);
    dc_clip_tokenizer_free(&b->tok);
    memset(b, 0, sizeof *b);
}

// The base's component `part` opened, and loaded into the UNet m or the
// text encoder te.
static int load_part(const dc_t2i_opts *o, dc_sd_part part, dc_model *m, dc_clip_text *te) {
    dc_sd_model files = {0};
    dc_sd_source s = {0};
    int rc = dc_sd_model_open(&files, o->model, o->st_flags);
    if (!rc) rc = dc_sd_source_open(&s, &files, part);
    if (!rc) rc = m ? dc_unet_load(m, &s.w, s.names) : dc_clip_text_load(te, &s.w, s.names);
    if (rc) dc_fail_ctx("%s", o->model);
    dc_sd_source_close(&s);
    dc_sd_model_close(&files);
    return rc;
}

int dc_t2i_load_unet(const dc_t2i_opts *o, dc_model *m) { return load_part(o, DC_SD_UNET, m, NULL); }

int dc_t2i_unet_dtype(const dc_t2i_opts *o, dc_dtype *dt) {
    dc_sd_model files = {0};
    dc_sd_source s = {0};
    int rc = dc_sd_model_open(&files, o->model, o->st_flags);
    if (!rc) rc = dc_sd_source_open(&s, &files, DC_SD_UNET);
    if (!rc) *dt = dc_weights_dtype(&s.w);
    if (rc) dc_fail_ctx("%s", o->model);
    dc_sd_source_close(&s);
    dc_sd_model_close(&files);
    return rc;
}

int dc_t2i_load_text(const dc_t2i_opts *o, dc_clip_text *te) { return load_part(o, DC_SD_TEXT, NULL, te); }
