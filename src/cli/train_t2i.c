#include "cli/train_t2i.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli_util.h"
#include "cli/run_folder.h"
#include "core/error.h"
#include "diffusion/sd_schedule.h"
#include "models/lora_model.h"
#include "models/registry.h"
#include "models/unet_text.h"
#include "io/mds.h"
#include "io/png.h"
#include "pipelines/sd.h"
#include "train/buckets.h"
#include "train/pairs.h"
#include "train/shards.h"
#include "train/stream.h"

bool t2i_is_model_path(const char *model) {
    struct stat st;
    return model && stat(model, &st) == 0;
}

// The bytes column `name`'s entry, added when new.
static dc_shards_raw *raw_entry(t2i_run *r, const char *name) {
    for (int i = 0; i < r->nraw; i++)
        if (!strcmp(r->raw[i].name, name)) return &r->raw[i];
    if (r->nraw == T2I_MAX_RAW) return dc_fail("shapes or dtypes of more than %d columns", T2I_MAX_RAW), NULL;
    r->raw[r->nraw] = (dc_shards_raw){.name = name, .dtype = DC_F16};
    return &r->raw[r->nraw++];
}

// --column-shape's value (s, a copy to cut up; given: as typed, for messages):
// NAME=D0,D1,... once a column, one after another.
static int parse_shapes(t2i_run *r, char *s, const char *given) {
    dc_shards_raw *cur = NULL;
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (eq) {
            *eq = 0;
            if (!*tok) return dc_fail("--column-shape %s: a column name before '='", given);
            if (!(cur = raw_entry(r, tok))) return -1;
            if (cur->ndim) return dc_fail("--column-shape %s: column \"%s\" given twice", given, tok);
            tok = eq + 1;
        }
        char *end;
        long long d = strtoll(tok, &end, 10);
        if (!cur || end == tok || *end || d < 1 || d > 65536 || cur->ndim == DC_SHARDS_MAX_DIMS)
            return dc_fail("--column-shape %s: NAME=D0,D1,... (1 to %d dimensions of 1..65536) expected", given,
                           DC_SHARDS_MAX_DIMS);
        cur->shape[cur->ndim++] = d;
    }
    return cur ? 0 : dc_fail("--column-shape '%s': NAME=D0,D1,... expected", given);
}

// --column-dtype's value: NAME=TYPE, comma-separated.
static int parse_dtypes(t2i_run *r, char *s, const char *given) {
    static const struct { const char *name; dc_dtype dt; } k_types[] = {
        {"float16", DC_F16}, {"bfloat16", DC_BF16}, {"float32", DC_F32}};
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok) return dc_fail("--column-dtype %s: NAME=float16|float32|bfloat16 expected", given);
        *eq = 0;
        dc_shards_raw *e = raw_entry(r, tok);
        if (!e) return -1;
        size_t k = 0;
        while (k < 3 && strcmp(eq + 1, k_types[k].name)) k++;
        if (k == 3) return dc_fail("--column-dtype %s: \"%s\" is not float16, float32 or bfloat16", given, eq + 1);
        e->dtype = k_types[k].dt;
    }
    return 0;
}

static char *copy(const char *s) { return s ? strdup(s) : NULL; }

// Keeps copies of the mapping and parses its shapes and dtypes.
static int set_columns(t2i_run *r, const t2i_columns *c) {
    r->cols = (t2i_columns){copy(c->latents), copy(c->text), copy(c->shapes), copy(c->dtypes), c->scale};
    const size_t ns = c->shapes ? strlen(c->shapes) + 1 : 0, nd = c->dtypes ? strlen(c->dtypes) + 1 : 0;
    r->raw_names = malloc(ns + nd + 1);
    if (!r->raw_names || (c->latents && !r->cols.latents) || (c->text && !r->cols.text) ||
        (c->shapes && !r->cols.shapes) || (c->dtypes && !r->cols.dtypes))
        return dc_fail("out of memory");
    if (c->latents && !*c->latents) return dc_fail("--latents-column: a column name expected");
    if (c->text && !*c->text) return dc_fail("--text-column: a column name expected");
    if (c->scale && !(c->scale > 0 && isfinite(c->scale)))
        return dc_fail("--latent-scale %g: a positive scaling factor expected", c->scale);
    if (c->shapes) DC_TRY(parse_shapes(r, memcpy(r->raw_names, c->shapes, ns), c->shapes));
    if (c->dtypes) DC_TRY(parse_dtypes(r, memcpy(r->raw_names + ns, c->dtypes, nd), c->dtypes));
    return 0;
}

// The text encoder must know every id the tokenizer gives.
static int check_vocab(const t2i_run *r) {
    if (!r->train_text || r->base.tok.n_vocab <= r->text.vocab) return 0;
    return dc_fail("the tokenizer has %d tokens but the text encoder's embedding only %d rows", r->base.tok.n_vocab,
                   r->text.vocab);
}

int t2i_open(t2i_run *r, const char *model, const char *data, const char *vocab, const t2i_columns *cols,
             unsigned st_flags, bool train_text) {
    memset(r, 0, sizeof *r);
    if (!realpath(model, r->model)) return dc_fail("%s: cannot resolve the path", model);
    DC_TRY(set_columns(r, cols ? cols : &(t2i_columns){0}));
    const char *fallback = NULL;
    if (!vocab && cli_find_vocab(&fallback)) dc_error_clear();
    r->opts = (dc_t2i_opts){r->model, data, vocab, fallback, st_flags, r->cols.latents, r->cols.scale};
    DC_TRY(dc_t2i_base_open(&r->base, &r->opts));
    r->train_text = train_text, r->text = r->base.text;
    if (train_text && (r->cols.text || r->cols.latents))
        return dc_fail("--train-text-encoder reads the captions (the data's caption column), not text embeddings "
                       "or another data set's columns");
    return check_vocab(r);
}

int t2i_from_checkpoint(t2i_run *r, const dc_st_file *ck) {
    const int rc = dc_unet_text_config_of((const char *const *)ck->meta_keys, (const char *const *)ck->meta_values,
                                          ck->nmeta, ck->path, &r->text);
    if (rc < 0) return -1;
    r->train_text = rc == 0;
    const char *cls = dc_st_meta(ck, "dreambooth_class_data"), *prior = dc_st_meta(ck, "prior_loss_weight");
    if (cls && (strlen(cls) >= sizeof r->class_data || !prior))
        return dc_fail("%s: a DreamBooth run's checkpoint without a sound class data set and prior weight", ck->path);
    if (cls) snprintf(r->class_data, sizeof r->class_data, "%s", cls), r->prior_weight = strtof(prior, NULL);
    const char *rank = dc_st_meta(ck, "lora_rank"), *alpha = dc_st_meta(ck, "lora_alpha");
    const char *targets = dc_st_meta(ck, "lora_targets");
    if (rank) {
        r->lora_rank = atoi(rank), r->lora_alpha = alpha ? strtof(alpha, NULL) : 0;
        if (r->lora_rank < 1 || !(r->lora_alpha > 0) || !targets || dc_lora_targets_parse(targets, &r->lora_targets))
            return dc_fail("%s: a LoRA run's checkpoint without a sound lora_rank, lora_alpha and lora_targets",
                           ck->path);
    }
    return check_vocab(r);
}

// The LoRA of the base's UNet (and text encoder, when it trains along),
// frozen as its files hold them.
static int lora_create(const t2i_run *r, const dc_kv *mc, dc_backend *be, dc_model **out) {
    dc_unet_config uc;
    dc_dtype dt = DC_F32;
    dc_model *u = NULL;
    DC_TRY(dc_unet_config_from_kv(&uc, mc));
    DC_TRY(dc_t2i_unet_dtype(&r->opts, &dt));
    DC_TRY(r->train_text ? dc_unet_text_new_frozen_train(&uc, &r->text, be, dt, uc.sample_size, uc.sample_size, &u)
                         : dc_unet_new_frozen_train(&uc, be, dt, uc.sample_size, uc.sample_size, &u));
    dc_lora l;
    dc_lora_init(&l, u->params);
    dc_kv extra = {0};
    dc_model *unet = r->train_text ? dc_unet_text_unet(u) : u;
    int rc = (be && dc_t2i_load_unet(&r->opts, unet)) ||
             (be && r->train_text && dc_t2i_load_text(&r->opts, dc_unet_text_encoder(u))) ||
             dc_sd_lora_add_targets(&l, DC_LORA_UNET, r->lora_targets, r->lora_rank, r->lora_alpha) ||
             (r->train_text && dc_sd_lora_add_targets(&l, DC_LORA_TEXT, r->lora_targets, r->lora_rank, r->lora_alpha)) ||
             dc_kv_set(&extra, "lora_targets", "%s", dc_lora_targets_name(r->lora_targets));
    if (rc) dc_lora_free(&l), dc_model_free(u);
    else rc = dc_lora_model_new(u, &l, &extra, out);
    dc_kv_free(&extra);
    return rc;
}

int t2i_create(const t2i_run *r, const dc_kv *mc, dc_backend *be, dc_grad_mode grad, dc_model **out) {
    if (r->lora_rank > 0) return lora_create(r, mc, be, out);
    if (!r->train_text) return dc_model_create(mc, be, grad, out);  // a layout too: its activations are training's
    dc_unet_config uc;
    DC_TRY(dc_unet_config_from_kv(&uc, mc));
    return dc_unet_text_new_train(&uc, &r->text, be, grad, uc.sample_size, uc.sample_size, out);
}

int t2i_init_weights(t2i_run *r, dc_model *m, bool from_base, uint64_t seed) {
    if (r->lora_rank > 0) return dc_model_init_weights(m, seed);  // the base's weights are in already
    dc_model *unet = r->train_text ? dc_unet_text_unet(m) : m;
    DC_TRY(from_base ? dc_t2i_load_unet(&r->opts, unet) : dc_model_init_weights(m, seed));
    return r->train_text ? dc_t2i_load_text(&r->opts, dc_unet_text_encoder(m)) : 0;
}

void t2i_close(t2i_run *r) {
    dc_t2i_base_free(&r->base);
    free((char *)r->cols.latents), free((char *)r->cols.text), free((char *)r->cols.shapes);
    free((char *)r->cols.dtypes), free(r->raw_names);
    memset(r, 0, sizeof *r);
}

int t2i_write_lora(const t2i_run *r, const char *ck_path, int64_t step) {
    char dir[4096], path[4200], name[256];
    cli_parent_dir(ck_path, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/lora.safetensors", dir);
    const char *slash = strrchr(dir, '/'), *base = strrchr(r->model, '/');
    snprintf(name, sizeof name, "%.200s", slash ? slash + 1 : dir);
    const bool v2 = r->base.text_dim == 1024;  // OpenCLIP's width: SD 2.x
    dc_kv meta = {0};
    dc_st_file ck;
    int rc = dc_kv_set(&meta, "ss_v2", "%s", v2 ? "True" : "False") ||
             dc_kv_set(&meta, "ss_base_model_version", "%s", v2 ? "sd_v2" : "sd_v1") ||
             dc_kv_set(&meta, "ss_output_name", "%s", name) ||
             dc_kv_set(&meta, "ss_sd_model_name", "%s", base ? base + 1 : r->model) ||
             dc_kv_set(&meta, "ss_steps", "%lld", (long long)step) ||
             (r->lora_targets == DC_LORA_ALL &&
              dc_kv_set(&meta, "ss_network_args", "{\"conv_dim\": \"%d\", \"conv_alpha\": \"%g\"}", r->lora_rank,
                        (double)r->lora_alpha));
    if (!rc && !(rc = dc_st_open(&ck, ck_path))) {
        rc = dc_sd_lora_write_checkpoint(&ck, "", path, r->lora_format, &meta, DC_F32);
        dc_st_close(&ck);
    }
    dc_kv_free(&meta);
    return rc;
}

// The checkpoint's metadata keys of the mapping.
#define META_LATENTS "data_latents_column"
#define META_TEXT "data_text_column"
#define META_SHAPES "data_column_shapes"
#define META_DTYPES "data_column_dtypes"
#define META_SCALE "data_latent_scale"

void t2i_columns_from_checkpoint(t2i_columns *c, const dc_st_file *ck) {
    const char *scale = dc_st_meta(ck, META_SCALE);
    *c = (t2i_columns){dc_st_meta(ck, META_LATENTS), dc_st_meta(ck, META_TEXT), dc_st_meta(ck, META_SHAPES),
                       dc_st_meta(ck, META_DTYPES), scale ? strtof(scale, NULL) : 0};
}

int t2i_checkpoint_meta(const t2i_run *r, dc_kv *meta) {
    const t2i_columns *c = &r->cols;
    return dc_kv_set(meta, "base_model", "%s", r->model) ||
           (r->class_data[0] && (dc_kv_set(meta, "dreambooth_class_data", "%s", r->class_data) ||
                                 dc_kv_set(meta, "prior_loss_weight", "%.9g", (double)r->prior_weight))) ||
           (c->latents && dc_kv_set(meta, META_LATENTS, "%s", c->latents)) ||
           (c->text && dc_kv_set(meta, META_TEXT, "%s", c->text)) ||
           (c->shapes && dc_kv_set(meta, META_SHAPES, "%s", c->shapes)) ||
           (c->dtypes && dc_kv_set(meta, META_DTYPES, "%s", c->dtypes)) ||
           (c->scale > 0 && dc_kv_set(meta, META_SCALE, "%.9g", (double)c->scale));
}

int t2i_model_config(t2i_run *r, const char *unet_config, const dc_source *data, dc_kv *cfg) {
    dc_kv base = {0}, none = {0};
    int rc;
    dc_unet_config named;
    if (unet_config && !t2i_is_model_path(unet_config) && dc_unet_config_named(unet_config, &named) == 0) {
        rc = dc_unet_config_to_kv(&named, &base);  // SD's own UNet, by name
    } else if (unet_config) {
        rc = dc_model_config_of_json(unet_config, &base);
    } else if (r->base.has_unet) {
        rc = dc_unet_config_to_kv(&r->base.unet, &base);
    } else {
        rc = dc_fail("%s holds no UNet (%s): give the one to train from scratch with --unet-config config.json",
                     r->model, r->base.no_unet);
    }
    // the data's side and channels replace the config's sample_size and in_channels
    // (buckets: the largest bucket's longer side, the size it draws at by default)
    const int side = data->height > data->width ? data->height : data->width;
    const dc_data_shape given = {data->channels, 1, side, side, 0};
    if (!rc) rc = dc_model_configure(&base, &none, &given, cfg);
    dc_unet_config c;
    if (!rc && !(rc = dc_unet_config_from_kv(&c, cfg)) && c.ctx_dim != r->base.text_dim)
        rc = dc_fail("the UNet's cross-attention reads text %d wide, but %s's text encoder makes it %d wide",
                     c.ctx_dim, r->model, r->base.text_dim);
    if (rc) dc_fail_ctx("%s", unet_config ? unet_config : r->model);
    dc_kv_free(&base);
    return rc;
}

// A text column of bytes takes the text encoder's [positions, width]
// unless its shape is given; every other bytes column's must be.
static int complete_shapes(t2i_run *r) {
    dc_shards_raw *text = NULL;
    for (int i = 0; i < r->nraw; i++) {
        if (r->cols.text && !strcmp(r->raw[i].name, r->cols.text)) text = &r->raw[i];
        else if (!r->raw[i].ndim) return dc_fail("--column-dtype %s: its shape is not given (--column-shape)", r->raw[i].name);
    }
    if (!r->cols.text || (text && text->ndim)) return 0;
    dc_mds_reader *mr;
    DC_TRY(dc_mds_open(&mr, r->opts.data));
    const int k = dc_mds_find(mr, r->cols.text);
    const bool bytes = k >= 0 && dc_mds_column_at(mr, k)->kind == DC_MDS_BYTES;
    dc_mds_close(mr);
    if (k < 0) return dc_fail_ctx("%s", r->opts.data);
    if (bytes && !text && !(text = raw_entry(r, r->cols.text))) return -1;
    if (text) *text = (dc_shards_raw){text->name, text->dtype, 2, {r->base.text_len, r->base.text_dim}};
    return 0;
}

int t2i_source(t2i_run *r, uint64_t seed, dc_source *src) {
    const dc_t2i_base *b = &r->base;
    DC_TRY(complete_shapes(r));
    const dc_shards_opts o = {r->opts.data, seed, DC_STREAM_BLOCK, b->latent_scale, b->text_null, b->text_null_len,
                              r->cols.latents, r->cols.text, r->raw, r->nraw, r->train_text ? &b->tok : NULL};
    if (b->nbuckets) return dc_source_buckets(src, &o, (const char *const *)b->buckets, b->nbuckets);
    if (!r->class_data[0]) return dc_source_shards(src, &o);
    // DreamBooth: the class set in an order of its own, paired with the instance set
    dc_source inst, cls;
    dc_shards_opts oc = o;
    oc.dir = r->class_data, oc.seed = seed ^ 0x636c617373ull;  // "class"
    DC_TRY(dc_source_shards(&inst, &o));
    if (dc_source_shards(&cls, &oc)) return dc_source_close(&inst), -1;
    return dc_source_pairs(src, &inst, &cls, r->prior_weight);
}

int t2i_schedule(t2i_run *r, dc_schedule *s) {
    // Training reads alphas_cumprod as they are: no floor under a zero terminal SNR.
    return dc_schedule_init_cfg(s, &r->base.sched, false);
}

dc_prediction t2i_prediction(const t2i_run *r) {
    return r->base.sched.prediction >= 0 ? (dc_prediction)r->base.sched.prediction : DC_PRED_EPS;
}

dc_train_config t2i_train_config_default(void) {
    dc_train_config c = dc_train_config_default();
    c.batch = c.micro_batch = 16;
    c.lr = 1e-5f, c.weight_decay = 0.01f, c.grad_clip = 1.0f;
    return c;
}

int t2i_pair_class(t2i_run *r, const char *class_data, float prior_weight) {
    if (!class_data || !class_data[0]) return 0;
    if (strlen(class_data) >= sizeof r->class_data) return dc_fail("%s: too long a path", class_data);
    if (!(prior_weight >= 0 && isfinite(prior_weight)))
        return dc_fail("--prior-loss-weight %g: 0 or more", (double)prior_weight);
    snprintf(r->class_data, sizeof r->class_data, "%s", class_data);
    r->prior_weight = prior_weight;
    return 0;
}

int t2i_lora_settings(t2i_run *r, int rank, float alpha, const char *targets, const char *format) {
    if (rank < 0 || rank > 1024) return dc_fail("--lora %d: a rank of 1 to 1024", rank);
    if (alpha < 0 || !isfinite(alpha)) return dc_fail("--lora-alpha %g: a positive number", (double)alpha);
    if (format && strcmp(format, "kohya") && strcmp(format, "diffusers"))
        return dc_fail("--lora-format %s: kohya or diffusers", format);
    r->lora_format = format && !strcmp(format, "diffusers") ? DC_LORA_FILE_DIFFUSERS : DC_LORA_FILE_KOHYA;
    if (!rank) return 0;  // a resumed run: the checkpoint says the rest
    r->lora_rank = rank, r->lora_alpha = alpha > 0 ? alpha : (float)rank;
    r->lora_targets = DC_LORA_TRANSFORMER;
    return targets ? dc_lora_targets_parse(targets, &r->lora_targets) : 0;
}

int t2i_parse_prediction(const char *word, int *pred) {
    static const char *const names[] = {[DC_PRED_EPS] = "eps", [DC_PRED_V] = "v", [DC_PRED_SAMPLE] = "sample"};
    for (int p = 0; p <= DC_PRED_SAMPLE; p++)
        if (!strcmp(word, names[p])) return *pred = p, 0;
    return dc_fail("--prediction %s: choose eps, v or sample", word);
}

int t2i_flags_check(const arg_parser *ap, bool sd, const char *unet_config, const char *init) {
    static const char *const sd_only[] = {"unet-config", "init", "caption-dropout", "vocab", "train-text-encoder",
                                          "lora", "lora-alpha", "lora-targets", "lora-format", "instance-data",
                                          "instance-prompt", "class-prompt", "class-data", "class-images",
                                          "prior-loss-weight", "resolution",
                                          "sample-every", "sample-prompts", "sample-steps", "sample-cfg",
                                          "latents-column", "text-column", "column-shape", "column-dtype",
                                          "latent-scale"};
    static const char *const dit_only[] = {"input-size", "in-channels", "patch", "hidden", "depth",
                                           "heads", "mlp-hidden", "num-classes", "class-dropout"};
    for (size_t i = 0; i < sizeof sd_only / sizeof *sd_only && !sd; i++)
        if (args_given(ap, sd_only[i]))
            return dc_fail("--%s is for Stable Diffusion models (--model SD_PATH)", sd_only[i]);
    for (size_t i = 0; i < sizeof dit_only / sizeof *dit_only && sd; i++)
        if (args_given(ap, dit_only[i]))
            return dc_fail("--%s is not for Stable Diffusion models: %s", dit_only[i],
                           strcmp(dit_only[i], "class-dropout") ? "the UNet's shape comes from its config "
                                                                  "(--unet-config)" : "use --caption-dropout");
    if (unet_config && init && !strcmp(init, "base"))
        return dc_fail("--unet-config trains a new UNet from scratch: its weights start random (--init random)");
    static const char *const lora_only[] = {"lora-alpha", "lora-targets", "lora-format"};
    const bool lora = args_given(ap, "lora");
    for (size_t i = 0; i < sizeof lora_only / sizeof *lora_only && !lora; i++)
        if (args_given(ap, lora_only[i]) && (strcmp(lora_only[i], "lora-format") || !args_given(ap, "resume")))
            return dc_fail("--%s is for a LoRA run (--lora RANK)", lora_only[i]);
    if (lora && (unet_config || (init && strcmp(init, "base"))))
        return dc_fail("--lora adapts the --model's UNet as it is: it cannot start from %s",
                       unet_config ? "another UNet (--unet-config)" : "random weights (--init random)");
    return 0;
}

// ---- sampling grids

typedef struct {
    float *imgs;  // [n, 3, H, W]
    int64_t numel, base;
} grid_sink;

static int take_picture(void *ctx, int index, const float *image) {
    grid_sink *g = ctx;
    memcpy(g->imgs + (size_t)(g->base + index) * (size_t)g->numel, image, sizeof(float) * (size_t)g->numel);
    return 0;
}

int t2i_grid(t2i_run *r, const char *ckpt, const char *out, const t2i_grid_opts *g, dc_backend *be) {
    dc_sd_pipe p;
    // a LoRA run draws with the base and the LoRA its checkpoint wrote beside it
    const dc_sd_open_opts o = {.model = r->lora_rank > 0 ? r->model : ckpt, .vocab = r->opts.vocab,
                               .vocab_fallback = r->opts.vocab_fallback, .st_flags = r->opts.st_flags,
                               .prediction = -1};
    DC_TRY(dc_sd_pipe_open(&p, be, &o));
    if (r->lora_rank > 0) {
        char dir[4096], lora[4200];
        cli_parent_dir(ckpt, dir, sizeof dir);
        snprintf(lora, sizeof lora, "%s/lora.safetensors", dir);
        if (dc_sd_pipe_merge_lora(&p, lora, 1.0f, 1.0f)) return dc_sd_pipe_close(&p), -1;
    }
    const int side = p.default_size;
    grid_sink sink = {malloc(sizeof(float) * 3 * (size_t)side * side * (size_t)(g->n * g->per_prompt)),
                      3 * (int64_t)side * side, 0};
    int rc = sink.imgs ? 0 : dc_fail("out of memory");
    for (int i = 0; i < g->n && !rc; i++) {
        dc_sd_gen gen = {g->prompts[i], NULL, g->per_prompt, g->per_prompt, side, side, dc_ksampler_opts_default(),
                         NULL, 1};
        gen.ks.kind = DC_KS_DDIM, gen.ks.steps = g->steps, gen.ks.cfg_scale = g->cfg, gen.ks.seed = 0;
        sink.base = (int64_t)i * g->per_prompt;
        rc = dc_sd_generate(&p, &gen, take_picture, &sink, NULL, NULL);
    }
    if (!rc) rc = dc_png_write_grid(out, sink.imgs, g->n * g->per_prompt, 3, side, side, g->n, g->per_prompt);
    free(sink.imgs);
    dc_sd_pipe_close(&p);
    return rc;
}

void t2i_prompts_free(char **prompts, int n) {
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
}

static int add_prompt(char ***list, int *n, const char *s, size_t len) {
    for (int i = 0; i < *n; i++)
        if (strlen((*list)[i]) == len && !memcmp((*list)[i], s, len)) return 0;  // each once
    char *copy = strndup(s, len);
    if (!copy) return dc_fail("out of memory");
    (*list)[(*n)++] = copy;
    return 0;
}

int t2i_prompts(t2i_run *r, const char *path, int max, char ***prompts, int *n) {
    *n = 0;
    *prompts = calloc((size_t)max, sizeof **prompts);
    if (!*prompts) return dc_fail("out of memory");
    int rc = 0;
    if (path) {
        FILE *f = fopen(path, "r");
        if (!f) return t2i_prompts_free(*prompts, 0), dc_fail("%s: cannot open", path);
        char line[1024];
        while (!rc && *n < max && fgets(line, sizeof line, f)) {
            size_t len = strcspn(line, "\r\n");
            if (len) rc = add_prompt(prompts, n, line, len);
        }
        fclose(f);
        if (!rc && !*n) rc = dc_fail("%s: no prompts (one a line)", path);
    } else {
        dc_mds_reader *mr = NULL;
        dc_mds_sample smp = {0};
        // a bucketed data set's captions: its first bucket's
        rc = dc_mds_open(&mr, r->base.nbuckets ? r->base.buckets[0] : r->opts.data);
        const int col = rc ? -1 : dc_mds_find(mr, "caption");
        if (!rc && col < 0) rc = dc_fail("%s: no caption column to take sampling prompts from: give --sample-prompts",
                                         r->opts.data);
        for (int64_t i = 0; !rc && *n < max && i < dc_mds_samples(mr) && i < 1000; i++)
            if (!(rc = dc_mds_read(mr, i, &smp)) && smp.len[col])
                rc = add_prompt(prompts, n, (const char *)smp.data[col], smp.len[col]);
        dc_mds_sample_free(&smp);
        if (mr) dc_mds_close(mr);
    }
    if (rc) t2i_prompts_free(*prompts, *n), *prompts = NULL, *n = 0;
    return rc;
}
