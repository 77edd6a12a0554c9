#include "pipelines/sd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "models/sd_lora.h"
#include "models/unet.h"
#include "models/unet_text.h"
#include "text/unicode.h"

// ---- components ---------------------------------------------------------------------------
int dc_sd_load_text(dc_sd_source *s, dc_backend *be, int *skip, dc_clip_text **out) {
    *out = NULL;
    dc_clip_text_config c;
    const dc_st_file *m = s->meta;  // a run's checkpoint, whose metadata holds the trained encoder's config
    if (m) {
        const int rc = dc_unet_text_config_of((const char *const *)m->meta_keys, (const char *const *)m->meta_values,
                                              m->nmeta, m->path, &c);
        if (rc) return rc < 0 ? -1 : dc_fail("%s: its text encoder's config is not in its metadata", m->path);
    } else if (dc_sd_config(s))
        DC_TRY(dc_clip_text_config_from_json(&c, dc_sd_config(s), s->dir));
    else
        DC_TRY(dc_clip_text_config_infer(&c, &s->w, s->names));
    // SD 2 conditions on layer 23 of OpenCLIP's 24 through the final LayerNorm:
    // a single file holds all 24, diffusers' folder only the 23 it uses.
    *skip = s->names == DC_NAMES_ORIGINAL && c.layers > 1 ? 1 : 0;
    DC_TRY(dc_clip_text_create(out, &c, be, dc_weights_dtype(&s->w)));
    if (dc_clip_text_load(*out, &s->w, s->names)) {
        dc_clip_text_free(*out), *out = NULL;
        return -1;
    }
    return 0;
}

int dc_sd_load_vae(dc_sd_source *s, dc_backend *be, bool encoder, bool decoder, dc_vae **out) {
    *out = NULL;
    dc_vae_config c;
    if (dc_sd_config(s))
        DC_TRY(dc_vae_config_from_json(&c, dc_sd_config(s), s->dir));
    else
        DC_TRY(dc_vae_config_infer(&c, &s->w, s->names));
    DC_TRY(dc_vae_create(out, &c, be, dc_weights_dtype(&s->w), encoder, decoder));
    if (dc_vae_load(*out, &s->w, s->names)) {
        dc_vae_free(*out), *out = NULL;
        return -1;
    }
    return 0;
}

int dc_heads_parse(const char *s, dc_heads *h) {
    memset(h, 0, sizeof *h);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 4096 || h->n == 8 || (*end && *end != ','))
            return dc_fail("heads '%s': a count (8) or one per block (5,10,20,20), each 1 to 4096", s);
        h->v[h->n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return h->n ? 0 : dc_fail("heads '%s': empty", s);
}

// A UNet's config: config.json, else the shapes (and SD's head rules), the
// heads given taking precedence.
int dc_sd_unet_config(const dc_sd_source *s, const dc_heads *heads, dc_unet_config *c) {
    if (s->meta)
        DC_TRY(dc_unet_config_from_meta(c, s->meta));
    else if (dc_sd_config(s))
        DC_TRY(dc_unet_config_from_json(c, dc_sd_config(s), s->dir));
    else
        DC_TRY(dc_unet_config_infer(c, &s->w, s->names));
    if (heads && heads->n) {
        if (heads->n != 1 && heads->n != c->nblocks)
            return dc_fail("%d head counts given for a UNet of %d blocks (give one, or one per block)", heads->n,
                           c->nblocks);
        for (int i = 0; i < c->nblocks; i++) c->heads[i] = heads->v[heads->n == 1 ? 0 : i];
        DC_TRY(dc_unet_config_validate(c));
    }
    return 0;
}

int dc_sd_load_unet(dc_sd_source *s, dc_backend *be, int latent_h, int latent_w, const dc_heads *heads,
                    dc_model **out) {
    *out = NULL;
    dc_unet_config c;
    DC_TRY(dc_sd_unet_config(s, heads, &c));
    DC_TRY(dc_unet_new(&c, be, dc_weights_dtype(&s->w), latent_h, latent_w, out));
    if (dc_unet_load(*out, &s->w, s->names)) {
        dc_model_free(*out), *out = NULL;
        return -1;
    }
    return 0;
}

// ---- the pipeline -------------------------------------------------------------------------
// The model's name as A1111 gives a checkpoint's: a file's name without its
// weights extension (v1-5-pruned.safetensors -> v1-5-pruned), a folder's name
// whole (stable-diffusion-v1.5/ stays stable-diffusion-v1.5). It goes into a
// PNG text chunk, which holds text: a byte that is not UTF-8 and a control
// character become '?', and a long name is cut where a character ends.
static void model_name(dc_sd_pipe *p, const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    struct stat st;
    const size_t ext = strlen(".safetensors");
    if (n > ext && strcasecmp(buf + n - ext, ".safetensors") == 0 && stat(buf, &st) == 0 && !S_ISDIR(st.st_mode))
        buf[n -= ext] = 0;
    const unsigned char *s = (const unsigned char *)(strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf);
    size_t k = 0, left = strlen((const char *)s);
    while (*s) {
        uint32_t c;
        size_t len = dc_utf8_get(s, left, &c);
        if (!len || c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0)) c = '?', len = len ? len : 1;
        if (k + (c == '?' ? 1 : len) >= sizeof p->name) break;
        if (c == '?') p->name[k++] = '?';
        else memcpy(p->name + k, s, len), k += len;
        s += len, left -= len;
    }
    p->name[k] = 0;
}

// The sizes and prediction a model's configs give, before any weight is read.
static int describe(dc_sd_pipe *p, const dc_sd_open_opts *o) {
    dc_sd_source *text = &p->src[0], *unet = &p->src[1], *vae = p->pixels ? NULL : &p->src[2];
    // A component without config.json is described by its tensors' shapes: their
    // headers are read (the data stays where it is).
    for (int i = 0; i < p->nsrc; i++)
        if (!dc_sd_config(&p->src[i])) DC_TRY(dc_sd_source_open_files(&p->src[i]));
    dc_clip_text_config tc;
    dc_unet_config uc;
    dc_vae_config vc;
    if (dc_sd_config(text)) DC_TRY(dc_clip_text_config_from_json(&tc, dc_sd_config(text), text->dir));
    else DC_TRY(dc_clip_text_config_infer(&tc, &text->w, text->names));
    DC_TRY(dc_sd_unet_config(unet, o->unet_heads, &uc));
    if (dc_unet_config_validate(&uc)) return dc_fail_ctx("%s", unet->dir[0] ? unet->dir : o->model);
    if (vae && dc_sd_config(vae)) DC_TRY(dc_vae_config_from_json(&vc, dc_sd_config(vae), vae->dir));
    else if (vae) DC_TRY(dc_vae_config_infer(&vc, &vae->w, vae->names));
    if (uc.ctx_dim != tc.width)
        return dc_fail("%s: the UNet reads text embeddings %d wide, the text encoder makes %d", o->model, uc.ctx_dim,
                       tc.width);
    p->version = p->files.version ? p->files.version : uc.ctx_dim == 1024 ? 2 : uc.ctx_dim == 768 ? 1 : 0;
    // The scheduler config: every key checked; SD's own when the model has none.
    char sched[4200];
    int rc = dc_sd_scheduler_file(&p->files, sched, sizeof sched);
    if (rc < 0) return -1;
    if (rc == 0) DC_TRY(dc_sd_sched_cfg_read(&p->sched, sched));
    if (o->prediction >= 0) p->prediction = (dc_prediction)o->prediction;
    else if (p->files.run) p->prediction = (dc_prediction)p->files.run_prediction;  // the run trained it so
    else if (p->sched.prediction >= 0) p->prediction = (dc_prediction)p->sched.prediction;
    else p->prediction = p->files.single && p->version == 2 ? DC_PRED_V : DC_PRED_EPS;  // SD 2.x 768-v, as diffusers assumes
    const bool v = p->prediction == DC_PRED_V;
    p->factor = vae ? dc_vae_factor(&vc) : 1;
    p->channels = vae ? vc.latent_channels : 3;
    if (uc.in_channels != p->channels || uc.out_channels != p->channels)
        return dc_fail("%s: the UNet reads %d and makes %d channels, %s %d", o->model, uc.in_channels,
                       uc.out_channels, vae ? "the VAE's latents have" : "pictures (no VAE: pixel space) have",
                       p->channels);
    p->align = p->factor * (1 << (uc.nblocks - 1));
    p->default_size = uc.sample_size > 0 ? uc.sample_size * p->factor : v && p->version == 2 ? 768 : 512;
    return 0;
}

int dc_sd_pipe_find(dc_sd_pipe *p, const dc_sd_open_opts *o) {
    memset(p, 0, sizeof *p);
    dc_sd_sched_cfg_default(&p->sched);
    p->opts = *o;
    model_name(p, o->model);
    // Every component is found before anything loads, so a missing one is
    // reported before minutes of reading the others.
    const dc_sd_part parts[3] = {DC_SD_TEXT, DC_SD_UNET, DC_SD_VAE};
    int rc = dc_sd_model_open(&p->files, o->model, o->st_flags);
    p->pixels = !rc && dc_sd_model_pixel_space(&p->files);
    const int nparts = p->pixels ? 2 : 3;
    for (; !rc && p->nsrc < nparts; p->nsrc++)
        if ((rc = dc_sd_source_find(&p->src[p->nsrc], &p->files, parts[p->nsrc]))) break;
    if (!rc) rc = describe(p, o);
    // The tokenizer: the vocabulary given, the pipeline's own, or the fallback.
    char tokdir[4200];
    const char *vocab = o->vocab ? o->vocab : rc ? NULL : dc_sd_tokenizer_dir(&p->files, tokdir, sizeof tokdir);
    if (!vocab) vocab = o->vocab_fallback;
    if (!rc && !vocab)
        rc = dc_fail("%s has no tokenizer/ folder%s: give the CLIP vocabulary (--vocab "
                     "bpe_simple_vocab_16e6.txt.gz, or a tokenizer folder)", o->model,
                     p->files.tokenizer == 1 ? " (model_index.json names one)" : "");
    if (!rc) rc = dc_clip_tokenizer_load(&p->tok, vocab);
    if (rc) dc_sd_pipe_close(p);
    return rc;
}

// Merges the LoRA of f: a LoRA file, or a LoRA run's checkpoint (run).
static int merge_lora(dc_sd_pipe *p, const dc_st_file *f, bool run, float unet_weight, float text_weight) {
    dc_lora lu, lt;
    dc_lora_init(&lu, p->unet->params), dc_lora_init(&lt, p->text->params);
    lu.multiplier = unet_weight, lt.multiplier = text_weight;
    // the backend's copies made from the weights (Winograd's kernels) go, and come back from the merged ones
    if (p->be->freeze_weights) p->be->freeze_weights(p->be, false);
    int rc = run ? dc_sd_lora_read_checkpoint(f, "", &lu, &lt) : dc_sd_lora_read(f, &lu, &lt);
    if (!rc && lu.count) rc = dc_lora_merge(&lu);
    if (!rc && lt.count) rc = dc_lora_merge(&lt);
    if (p->be->freeze_weights) p->be->freeze_weights(p->be, true);
    dc_lora_free(&lu), dc_lora_free(&lt);
    return rc;  // the messages name the file
}

int dc_sd_pipe_load(dc_sd_pipe *p, dc_backend *be) {
    p->be = be;
    int rc = 0;
    for (int i = 0; i < p->nsrc && !rc; i++) rc = dc_sd_source_open_files(&p->src[i]);
    if (!rc) rc = dc_sd_load_text(&p->src[0], be, &p->text_skip, &p->text);
    if (!rc) rc = dc_sd_load_unet(&p->src[1], be, 64, 64, p->opts.unet_heads, &p->unet);
    if (!rc && !p->pixels) rc = dc_sd_load_vae(&p->src[2], be, p->opts.encoder, true, &p->vae);
    // the weights are loaded: their files are no longer needed
    for (int i = 0; i < p->nsrc; i++) dc_sd_source_close(&p->src[i]);
    p->nsrc = 0;
    if (rc) return -1;
    if (be->freeze_weights) be->freeze_weights(be, true);  // inference: the weights stay as loaded
    // a LoRA run: the base's weights with the checkpoint's LoRA in them
    return p->files.run && p->files.lora_run ? merge_lora(p, &p->files.file, true, 1.0f, 1.0f) : 0;
}

int dc_sd_pipe_open(dc_sd_pipe *p, dc_backend *be, const dc_sd_open_opts *o) {
    DC_TRY(dc_sd_pipe_find(p, o));
    if (dc_sd_pipe_load(p, be)) return dc_sd_pipe_close(p), -1;
    return 0;
}

int dc_sd_pipe_merge_lora(dc_sd_pipe *p, const char *path, float unet_weight, float text_weight) {
    if (!p->be || !p->unet || !p->text) return dc_fail("LoRA %s: the model is not loaded", path);
    dc_st_file f;
    DC_TRY(dc_st_open(&f, path));
    const int rc = merge_lora(p, &f, false, unet_weight, text_weight);
    dc_st_close(&f);
    return rc;
}

// LoRAs applied at run time: one adapter of each file over each part, the
// files' adapters stacked on the part's parameters.
struct dc_sd_run_loras {
    dc_lora unet[DC_ADAPTERS_MAX], text[DC_ADAPTERS_MAX];
    int n;
    dc_adapter_stack us, ts;
};

int dc_sd_pipe_add_lora(dc_sd_pipe *p, const char *path, float unet_weight, float text_weight) {
    if (!p->be || !p->unet || !p->text) return dc_fail("LoRA %s: the model is not loaded", path);
    if (p->gen) return dc_fail("LoRA %s: added after the model drew (its step graphs do not know it)", path);
    struct dc_sd_run_loras *r = p->loras;
    if (!r) {
        if (!(r = p->loras = calloc(1, sizeof *r))) return dc_fail("out of memory");
        dc_adapter_stack_init(&r->us), dc_adapter_stack_init(&r->ts);
    }
    if (r->n == DC_ADAPTERS_MAX) return dc_fail("LoRA %s: more than %d LoRAs at run time", path, DC_ADAPTERS_MAX);
    dc_lora *lu = &r->unet[r->n], *lt = &r->text[r->n];
    dc_lora_init(lu, p->unet->params), dc_lora_init(lt, p->text->params);
    lu->multiplier = unet_weight, lt->multiplier = text_weight;
    dc_st_file f;
    int rc = dc_st_open(&f, path);
    if (!rc) {
        rc = dc_sd_lora_read(&f, lu, lt);
        dc_st_close(&f);
    }
    if (!rc && lu->count) rc = dc_adapter_stack_add(&r->us, &lu->base);
    if (!rc && lt->count) rc = dc_adapter_stack_add(&r->ts, &lt->base);
    if (rc) return dc_lora_free(lu), dc_lora_free(lt), -1;
    r->n++;
    p->unet->params->adapter = r->us.n ? &r->us.base : NULL;
    p->text->params->adapter = r->ts.n ? &r->ts.base : NULL;
    return 0;
}

static void run_loras_free(dc_sd_pipe *p) {
    struct dc_sd_run_loras *r = p->loras;
    if (!r) return;
    if (p->unet) p->unet->params->adapter = NULL;
    if (p->text) p->text->params->adapter = NULL;
    for (int i = 0; i < r->n; i++) dc_lora_free(&r->unet[i]), dc_lora_free(&r->text[i]);
    free(r);
    p->loras = NULL;
}

static void state_free(dc_sd_pipe *p);

void dc_sd_pipe_close(dc_sd_pipe *p) {
    if (p->be) {
        if (p->be->freeze_weights) p->be->freeze_weights(p->be, false);
        state_free(p);
        if (p->ids.p) p->be->free(p->be, p->ids.p);
        run_loras_free(p);
    }
    if (p->text) dc_clip_text_free(p->text);
    dc_model_free(p->unet);
    if (p->vae) dc_vae_free(p->vae);
    dc_clip_tokenizer_free(&p->tok);
    for (int i = 0; i < p->nsrc; i++) dc_sd_source_close(&p->src[i]);
    dc_sd_sched_cfg_free(&p->sched);
    dc_sd_model_close(&p->files);
    memset(p, 0, sizeof *p);
}

int dc_sd_encode_prompts(dc_sd_pipe *p, const char *const *prompts, int n, dc_buf ctx) {
    dc_backend *be = p->be;
    const int T = p->text->cfg.positions;
    if (T != DC_CLIP_CONTEXT)
        return dc_fail("the text encoder reads %d positions; prompts are %d tokens", T, DC_CLIP_CONTEXT);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * T);
    if (!ids) return dc_fail("out of memory");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int count;
        rc = dc_clip_tokenize(&p->tok, prompts[i] ? prompts[i] : "", ids + (size_t)i * T, &count);
        if (!rc && count > DC_CLIP_CONTEXT - 2)
            dc_warn("the prompt has %d tokens; only the first %d are used: \"%.60s%s\"", count,
                    DC_CLIP_CONTEXT - 2, prompts[i], strlen(prompts[i]) > 60 ? "..." : "");
    }
    if (!rc) rc = dc_clip_text_check_ids(ids, (int64_t)n * T, p->text->cfg.vocab);
    const size_t count = (size_t)n * T;
    if (!rc && count > p->ids_cap) {  // grown, and kept (see dc_sd_pipe)
        if (p->ids.p) be->free(be, p->ids.p), p->ids = dc_buf_none(), p->ids_cap = 0;
        rc = dc_buf_alloc(be, &p->ids, DC_I32, count, "token ids");
        if (!rc) p->ids_cap = count;
    }
    if (!rc) rc = dc_clip_text_reserve(p->text, n);
    if (!rc) {
        be->upload(be, p->ids.p, ids, sizeof(int32_t) * count);
        rc = dc_clip_text_forward(p->text, ctx, dc_buf_none(), p->ids, n, p->text_skip);
    }
    free(ids);
    return rc;
}

// ---- generation ---------------------------------------------------------------------------
static int unet_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_model_forward(ctx, out, x, t, cond, B);
}
static int unet_prepare(void *ctx, const dc_cond *cond, int B) { return dc_unet_prepare_text(ctx, cond, B); }

typedef struct {
    dc_sd_progress_fn fn;
    void *ctx;
    int done0, total;  // steps before this batch, all steps
} step_progress;

static void on_step(void *ctx, int step, int total) {
    (void)total;
    step_progress *sp = ctx;
    if (sp->fn) sp->fn(sp->ctx, "sampling", sp->done0 + step, sp->total);
}

// The buffers of one generation, freed together.
typedef struct {
    dc_buf text;   // [2, 77, D]: the prompt, then the negative prompt
    dc_buf cctx;   // [batch, 77, D] the prompt's embedding per picture
    dc_buf x;      // [batch, C, h, w] latents, or pictures in pixel space (F32)
    // with a VAE:
    dc_buf zc;     // [batch, C, h, w] the decoder's input (compute dtype)
    dc_buf img;    // [batch, 3, H, W] decoded (compute dtype)
    dc_buf imgf;   // [batch, 3, H, W] decoded (F32)
    dc_buf init;   // [1, 3, H, W] img2img input (compute dtype), and its latent moments:
    dc_buf mean, logvar;
} gen_bufs;

static void gen_free(dc_backend *be, gen_bufs *b) {
    dc_buf *all[] = {&b->text, &b->cctx, &b->x, &b->zc, &b->img, &b->imgf, &b->init, &b->mean, &b->logvar};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]->p) be->free(be, all[i]->p);
    memset(b, 0, sizeof *b);
}

// A generation's device state, kept by the pipe for the next call (see
// dc_sd_pipe): the buffers of a batch of B pictures of h x w latents (with
// img2img's or not), and the sampler, made for the options in ks.opt.
typedef struct dc_sd_gen_state {
    gen_bufs b;
    int B, h, w;
    bool init;
    dc_sampler ks;         // ks.be is NULL until made
    dc_ksampler_opts opt;  // what ks was made for
} dc_sd_gen_state;

static void state_free(dc_sd_pipe *p) {
    if (!p->gen) return;
    dc_sampler_free(&p->gen->ks);
    gen_free(p->be, &p->gen->b);
    free(p->gen);
    p->gen = NULL;
}

// Whether a sampler made for a runs as one made for b would: all but the
// seed, which a run reads as it goes.
static bool same_sampler(const dc_ksampler_opts *a, const dc_ksampler_opts *b) {
    return a->kind == b->kind && a->steps == b->steps && a->karras == b->karras && a->eta == b->eta &&
           a->sched == b->sched && a->sigmas == b->sigmas && a->prediction == b->prediction &&
           a->cfg_scale == b->cfg_scale && a->ctx_len == b->ctx_len && a->ctx_dim == b->ctx_dim &&
           a->null_ctx.p == b->null_ctx.p && a->null_ctx.dt == b->null_ctx.dt && a->x_given == b->x_given &&
           a->graph == b->graph && a->skip == b->skip;
}

// The buffers for B pictures of h x w latents: the last call's where its
// shape was the same, else new ones.
static int state_buffers(dc_sd_pipe *p, int B, int h, int w, bool init, int64_t lat, int64_t pix, int T, int D) {
    dc_sd_gen_state *st = p->gen;
    if (st && st->B == B && st->h == h && st->w == w && st->init == init) return 0;
    state_free(p);
    if (!(st = p->gen = calloc(1, sizeof *st))) return dc_fail("out of host memory");
    st->B = B, st->h = h, st->w = w, st->init = init;
    dc_backend *be = p->be;
    const dc_dtype ct = be->compute;
    gen_bufs *b = &st->b;
    int rc = dc_buf_alloc(be, &b->text, ct, (size_t)2 * T * D, "text embeddings");
    if (!rc) rc = dc_buf_alloc(be, &b->cctx, ct, (size_t)B * T * D, "prompt embeddings");
    if (!rc) rc = dc_buf_alloc(be, &b->x, DC_F32, (size_t)B * lat, p->vae ? "latents" : "pictures");
    const bool vae = p->vae != NULL, enc = vae && init;
    if (!rc && vae) rc = dc_buf_alloc(be, &b->zc, ct, (size_t)B * lat, "decoder input");
    if (!rc && vae) rc = dc_buf_alloc(be, &b->img, ct, (size_t)B * pix, "decoded pictures");
    if (!rc && vae) rc = dc_buf_alloc(be, &b->imgf, DC_F32, (size_t)B * pix, "decoded pictures (f32)");
    if (!rc && enc) rc = dc_buf_alloc(be, &b->init, ct, (size_t)pix, "input picture");
    if (!rc && enc) rc = dc_buf_alloc(be, &b->mean, ct, (size_t)lat, "latent mean");
    if (!rc && enc) rc = dc_buf_alloc(be, &b->logvar, ct, (size_t)lat, "latent log-variance");
    if (rc) state_free(p);
    return rc;
}

// The sampler for options o: the last call's (with o's seed) where it was
// made for the same options, else a new one.
static int state_sampler(dc_sd_pipe *p, const dc_ksampler_opts *o, int C, int h, int w, int B) {
    dc_sd_gen_state *st = p->gen;
    if (st->ks.be && same_sampler(&st->opt, o)) {
        st->opt.seed = st->ks.set.seed = o->seed;
        return 0;
    }
    dc_sampler_free(&st->ks);
    st->opt = *o;
    return dc_ksampler_init(&st->ks, p->be, o, C, h, w, B);
}

// img2img: the clean latents of picture i, z = (mean + exp(logvar / 2) n) * scaling
// with n keyed by the picture (diffusers' latent_dist.sample()).
static void init_latents(float *lat, const float *mean, const float *logvar, int64_t n, uint64_t seed,
                         uint32_t key, float scaling) {
    for (int64_t j = 0; j < n; j++)
        lat[j] = (mean[j] + expf(0.5f * logvar[j]) * dc_randn_at(seed, key, 0, DC_STREAM_INIT, j)) * scaling;
}

// Plans the activations of the UNet (for `rows` rows) or of the VAE (batch B
// of height x width pictures; none in pixel space) before that model runs. Both stay planned while
// the device has room for both, so batches after the first plan nothing; when
// one does not fit beside the other, the other's are freed and planned again
// when next needed (the peak is then the larger of the two, not their sum).
static int plan_for(dc_sd_pipe *p, bool unet, int rows, int B, int height, int width) {
    if (!unet && !p->vae) return 0;
    int rc = unet ? dc_model_reserve(p->unet, rows) : dc_vae_reserve(p->vae, B, height, width);
    if (rc == 0) return 0;
    dc_error_clear();
    if (unet && p->vae) dc_vae_release(p->vae);
    else dc_unet_release(p->unet);
    return unet ? dc_model_reserve(p->unet, rows) : dc_vae_reserve(p->vae, B, height, width);
}

// The steps img2img leaves out: the first steps - (int)(steps * strength), as
// diffusers' img2img pipelines skip them.
static int img2img_skip(const dc_sd_gen *g, int *skip) {
    int runs = (int)(g->ks.steps * g->strength);
    if (!(g->strength > 0 && g->strength <= 1) || runs < 1)
        return dc_fail("strength %g of %d steps runs no step (at least 1 / steps)", g->strength, g->ks.steps);
    *skip = g->ks.steps - runs;
    return 0;
}

int dc_sd_gen_check(dc_sd_pipe *p, const dc_sd_gen *g) {
    const int f = p->factor, align = p->align;
    if (g->width < align || g->height < align || g->width % align || g->height % align)
        return dc_fail("width and height must be multiples of %d (the VAE's factor %d times the UNet's %d "
                       "downsamplings): %dx%d", align, f, align / f, g->width, g->height);
    if (g->count < 1 || g->batch < 1) return dc_fail("%d pictures in batches of %d", g->count, g->batch);
    if (g->init && !p->pixels && !p->opts.encoder) return dc_fail("img2img needs the VAE's encoder (open with encoder)");
    dc_ksampler_opts o = g->ks;
    o.prediction = p->prediction;
    o.sched = &p->sched;
    if (g->init) DC_TRY(img2img_skip(g, &o.skip));
    if (o.steps < 1 || o.steps > p->sched.T)
        return dc_fail("%d steps: between 1 and the schedule's %d", o.steps, p->sched.T);
    // The plan of the whole run, as the sampler will make it.
    dc_schedule s;
    dc_sample_step *plan = malloc(sizeof(dc_sample_step) * (size_t)o.steps);
    double init;
    int rc = plan ? 0 : dc_fail("out of host memory");
    if (!rc) rc = dc_schedule_init_cfg(&s, &p->sched, o.kind != DC_KS_DDIM);
    if (!rc) rc = dc_ksampler_plan(&s, &o, plan, &init), dc_schedule_free(&s);
    free(plan);
    if (rc) return -1;
    // What the scheduler config asks that this sampler does not follow, once.
    const unsigned bit = 1u << (2 * o.kind + (o.karras ? 1 : 0));
    char warn[2048];
    if (!(p->warned & bit) && dc_sd_sched_cfg_warnings(&p->sched, dc_ks_class(o.kind), o.karras, warn, sizeof warn)) {
        for (char *line = warn, *nl; *line; line = nl + 1) {
            if (!(nl = strchr(line, '\n'))) break;
            *nl = 0;
            dc_warn("%s", line);
        }
    }
    p->warned |= bit;
    return 0;
}

int dc_sd_generate(dc_sd_pipe *p, const dc_sd_gen *g, dc_sd_picture_fn on_picture, void *ctx,
                   dc_sd_progress_fn progress, void *pctx) {
    dc_backend *be = p->be;
    if (!be || !p->unet) return dc_fail("the model's weights are not loaded (dc_sd_pipe_load)");
    DC_TRY(dc_sd_gen_check(p, g));
    const int f = p->factor;
    const int h = g->height / f, w = g->width / f, B = g->batch < g->count ? g->batch : g->count;
    const int D = p->text->cfg.width, T = DC_CLIP_CONTEXT, C = p->channels;
    const int64_t lat = (int64_t)C * h * w, pix = (int64_t)3 * g->height * g->width;
    const dc_dtype ct = be->compute;
    const float scaling = p->vae ? p->vae->cfg.scaling_factor : 1.0f;
    float *hl = NULL, *hm = NULL, *hv = NULL, *pics = malloc(sizeof(float) * (size_t)B * pix);
    int rc = pics ? 0 : dc_fail("out of memory for %d pictures of %dx%d", B, g->width, g->height);

    // The device buffers and the sampler: the last call's where this call's
    // shape and options are the same (see dc_sd_pipe).
    dc_ksampler_opts o = g->ks;
    o.prediction = p->prediction;
    o.sched = &p->sched;
    o.ctx_len = T, o.ctx_dim = D;
    o.graph = true;  // the UNet forward issues backend ops only
    if (g->init && !rc) rc = img2img_skip(g, &o.skip);
    if (!rc) rc = dc_unet_set_size(p->unet, h, w);
    if (!rc) rc = state_buffers(p, B, h, w, g->init != NULL, lat, pix, T, D);
    gen_bufs b = rc ? (gen_bufs){0} : p->gen->b;
    if (!rc) o.null_ctx = dc_buf_at(b.text, (int64_t)T * D);
    if (!rc) rc = state_sampler(p, &o, C, h, w, B);
    dc_sampler *ks = rc ? NULL : &p->gen->ks;

    // Text: the prompt and the negative prompt in one pass.
    const char *texts[2] = {g->prompt ? g->prompt : "", g->negative_prompt ? g->negative_prompt : ""};
    if (progress) progress(pctx, "text", 0, 1);
    if (!rc) rc = dc_sd_encode_prompts(p, texts, 2, b.text);
    for (int i = 0; i < B && !rc; i++)
        be->copy(be, dc_buf_at(b.cctx, (int64_t)i * T * D).p, b.text.p, (size_t)T * D * dc_dtype_size(ct));
    // Sampling needs the UNet's activations, decoding the VAE's (see plan_for).
    const int rows = o.cfg_scale != 1.0f ? 2 * B : B;

    // img2img in pixel space: the picture is where sampling starts.
    if (!rc && g->init && !p->vae && !(hl = malloc(sizeof(float) * (size_t)lat * B))) rc = dc_fail("out of memory");
    // img2img: the input's latent moments, once.
    if (!rc && g->init && p->vae) {
        if (progress) progress(pctx, "encode", 0, 1);
        hl = malloc(sizeof(float) * (size_t)lat * B), hm = malloc(sizeof(float) * (size_t)lat);
        hv = malloc(sizeof(float) * (size_t)lat);
        if (!rc && (!hl || !hm || !hv)) rc = dc_fail("out of memory");
        if (!rc) rc = plan_for(p, false, rows, B, g->height, g->width);
        if (!rc) {
            be->upload(be, b.imgf.p, g->init, sizeof(float) * (size_t)pix);
            be->cast(be, b.init, b.imgf, pix);
            rc = dc_vae_encode(p->vae, b.mean, b.logvar, b.init, 1, g->height, g->width);
        }
        if (!rc) {
            be->cast(be, b.x, b.mean, lat);
            be->download(be, hm, b.x.p, sizeof(float) * (size_t)lat);
            be->cast(be, b.x, b.logvar, lat);
            be->download(be, hv, b.x.p, sizeof(float) * (size_t)lat);
            rc = dc_backend_status(be);
        }
    }

    // Both models' plans before the first batch, where they fit together: a
    // plan made later (the VAE's, after the first batch's sampling) could
    // replace a workspace the recorded step graph uses, which would then be
    // recorded again for the second batch.
    if (!rc) rc = plan_for(p, true, rows, B, g->height, g->width);
    if (!rc) rc = plan_for(p, false, rows, B, g->height, g->width);
    step_progress sp = {progress, pctx, 0, (o.steps - o.skip) * ((g->count + B - 1) / B)};
    for (int i0 = 0; i0 < g->count && !rc; i0 += B) {
        const int n = g->count - i0 < B ? g->count - i0 : B;
        uint32_t idx[256];
        if (n > 256) {
            rc = dc_fail("batch %d: at most 256 pictures per batch", n);
            break;
        }
        for (int i = 0; i < n; i++) idx[i] = (uint32_t)(i0 + i);
        if (g->init) {
            for (int i = 0; i < n; i++) {
                if (p->vae) init_latents(hl + i * lat, hm, hv, lat, o.seed, idx[i], scaling);
                else memcpy(hl + i * lat, g->init, sizeof(float) * (size_t)lat);
            }
            be->upload(be, b.x.p, hl, sizeof(float) * (size_t)n * lat);
        }
        dc_cond cond = {.ctx = b.cctx, .len = T, .dim = D};
        rc = plan_for(p, true, rows, B, g->height, g->width);
        if (!rc) rc = dc_sampler_run(ks, b.x, &cond, idx, n, unet_eval, unet_prepare, p->unet, on_step, &sp);
        sp.done0 += o.steps - o.skip;
        if (!rc) rc = plan_for(p, false, rows, B, g->height, g->width);
        if (rc) break;
        if (p->vae) {
            // Decode: z / scaling in the compute dtype, then back to f32 pictures.
            if (progress) progress(pctx, "decode", i0, g->count);
            be->axpy(be, b.x, b.x, 1.0f / scaling - 1.0f, (int64_t)n * lat);
            be->cast(be, b.zc, b.x, (int64_t)n * lat);
            rc = dc_vae_decode(p->vae, b.img, b.zc, n, h, w);
            if (!rc) be->cast(be, b.imgf, b.img, (int64_t)n * pix);
        }
        if (!rc) {
            be->download(be, pics, (p->vae ? b.imgf : b.x).p, sizeof(float) * (size_t)n * pix);
            rc = dc_backend_status(be);
        }
        for (int i = 0; i < n && !rc && on_picture; i++) rc = on_picture(ctx, i0 + i, pics + (size_t)i * pix);
    }
    if (!rc && progress) progress(pctx, "done", g->count, g->count);
    if (rc) state_free(p);  // a failed call's state is not used again
    free(hl), free(hm), free(hv), free(pics);
    return rc;
}
