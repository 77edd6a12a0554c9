// Stable Diffusion's components written for other programs: tensors under
// the names diffusers or the original single file uses, and the configs of a
// diffusers pipeline folder.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "models/sd_write.h"

// ---- tensors ------------------------------------------------------------------------------

// h[n] floats into a new buffer of dtype dt.
static void *convert(const float *h, int64_t n, dc_dtype dt) {
    void *o = malloc(dc_dtype_size(dt) * (size_t)n);
    if (!o) return NULL;
    if (dt == DC_F32) return memcpy(o, h, sizeof(float) * (size_t)n);
    uint16_t *u = o;
    for (int64_t j = 0; j < n; j++) u[j] = dt == DC_BF16 ? dc_f32_to_bf16(h[j]) : dc_f32_to_f16(h[j]);
    return o;
}

// Takes ownership of data (dtype dt).
static int add_owned(dc_sd_tensors *t, const char *name, int ndim, const int64_t *shape, void *data, dc_dtype dt) {
    if (!data) return dc_fail("out of memory");
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        dc_st_entry *e = realloc(t->e, sizeof *e * (size_t)cap);
        if (e) t->e = e;
        char(*names)[160] = e ? realloc(t->names, sizeof *names * (size_t)cap) : NULL;
        if (names) t->names = names;
        void **bufs = names ? realloc(t->bufs, sizeof *bufs * (size_t)cap) : NULL;
        if (!bufs) return free(data), dc_fail("out of memory");
        t->bufs = bufs, t->cap = cap;
    }
    if (snprintf(t->names[t->n], 160, "%s", name) >= 160) return free(data), dc_fail("tensor name %s is too long", name);
    t->bufs[t->n] = data;
    dc_st_entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    e->dtype = dt, e->ndim = ndim, e->data = data;
    memcpy(e->shape, shape, sizeof(int64_t) * (size_t)ndim);
    return 0;
}

// Parameter i's values as floats in PyTorch's order (from its dtype: F32, or
// F16/BF16 when frozen so; a channels-last kernel permuted back).
static float *host_of(const dc_params *ps, int i) {
    const dc_param *p = &ps->items[i];
    dc_buf b = dc_param_data(ps, i);
    size_t es = dc_dtype_size(b.dt);
    float *h = malloc(sizeof(float) * (size_t)p->numel);
    uint16_t *raw = es == 2 ? malloc(2 * (size_t)p->numel) : NULL;
    if (!h || (es == 2 && !raw)) return free(h), free(raw), dc_fail("out of memory"), NULL;
    ps->be->download(ps->be, es == 2 ? (void *)raw : (void *)h, b.p, es * (size_t)p->numel);
    if (dc_backend_status(ps->be)) return free(h), free(raw), NULL;
    for (int64_t j = 0; raw && j < p->numel; j++) h[j] = b.dt == DC_BF16 ? dc_bf16_to_f32(raw[j]) : dc_f16_to_f32(raw[j]);
    free(raw);
    if (dc_param_from_stored(p, h)) return free(h), NULL;
    return h;
}

typedef struct {
    const char *prefix;
    dc_weight_map map;  // NULL: the parameter's own name
    void *ctx;
    int layers;         // text encoders: parameters of layers from this one on are left out
    bool conv1x1;       // the VAE's single-file attention projections: [C, C] as [C, C, 1, 1]
} naming;

static int name_of(const naming *nm, const char *param, dc_weight_src *src) {
    memset(src, 0, sizeof *src);
    if (nm->map) return nm->map(nm->ctx, param, src);
    snprintf(src->name, sizeof src->name, "%s", param);
    return 0;
}

// Every parameter of ps under nm; parameters mapped to rows of one tensor
// (OpenCLIP's packed q, k, v) are gathered into it in row order.
static int add_params(dc_sd_tensors *t, const dc_params *ps, const naming *nm, dc_dtype dt) {
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        int layer;
        if (sscanf(p->name, "encoder.layers.%d.", &layer) == 1 && layer >= nm->layers) continue;
        dc_weight_src src;
        DC_TRY(name_of(nm, p->name, &src));
        if (src.rows && src.row0) continue;  // gathered with the tensor's first rows
        char full[256];
        if (snprintf(full, sizeof full, "%s%s", nm->prefix, src.name) >= (int)sizeof full)
            return dc_fail("tensor name %s%s is too long", nm->prefix, src.name);
        int64_t shape[DC_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        int ndim = p->ndim;
        if (nm->conv1x1 && strstr(src.name, "mid.attn_1.") && ndim == 2) shape[2] = shape[3] = 1, ndim = 4;
        float *h = NULL;
        if (src.rows) {
            const int64_t row = p->numel / p->shape[0];
            int64_t total = 0;
            for (int k = 0; k < ps->count; k++) {
                dc_weight_src s2;
                if (name_of(nm, ps->items[k].name, &s2) == 0 && !strcmp(s2.name, src.name) && s2.row0 + s2.rows > total)
                    total = s2.row0 + s2.rows;
            }
            h = malloc(sizeof(float) * (size_t)(total * row));
            for (int k = 0; h && k < ps->count; k++) {
                dc_weight_src s2;
                if (name_of(nm, ps->items[k].name, &s2) || strcmp(s2.name, src.name)) continue;
                float *hk = host_of(ps, k);
                if (!hk) return free(h), -1;
                memcpy(h + s2.row0 * row, hk, sizeof(float) * (size_t)(s2.rows * row));
                free(hk);
            }
            if (!h) return dc_fail("out of memory");
            shape[0] = total;
        } else if (!(h = host_of(ps, i))) {
            return -1;
        }
        int64_t n = 1;
        for (int d = 0; d < ndim; d++) n *= shape[d];
        int rc = add_owned(t, full, ndim, shape, convert(h, n, dt), dt);
        free(h);
        DC_TRY(rc);
    }
    return 0;
}

int dc_sd_add_unet(dc_sd_tensors *t, const dc_unet *u, bool original, dc_dtype dt) {
    naming nm = {original ? "model.diffusion_model." : "", original ? dc_unet_weight_map : NULL, (void *)&u->cfg,
                 1 << 30, false};
    return add_params(t, u->base.params, &nm, dt);
}

static int vae_map(void *ctx, const char *param, dc_weight_src *src) { return dc_vae_original_name(ctx, param, src); }

int dc_sd_add_vae(dc_sd_tensors *t, const dc_vae *v, bool original, dc_dtype dt) {
    naming nm = {original ? "first_stage_model." : "", original ? vae_map : NULL, (void *)&v->cfg, 1 << 30, original};
    return add_params(t, &v->params, &nm, dt);
}

int dc_sd_add_text(dc_sd_tensors *t, const dc_clip_text *x, int layers, dc_sd_text_layout lay, dc_dtype dt) {
    static const char *const prefix[] = {"text_model.", "cond_stage_model.transformer.text_model.",
                                         "cond_stage_model.model."};
    naming nm = {prefix[lay], lay == DC_SD_TEXT_SD2 ? dc_clip_text_openclip_name : NULL, (void *)&x->cfg, layers,
                 false};
    return add_params(t, x->params, &nm, dt);
}

int dc_sd_tensors_copy(dc_sd_tensors *t, const char *from, const char *to) {
    const size_t nf = strlen(from);
    for (int i = 0, n = t->n; i < n; i++) {
        if (strncmp(t->names[i], from, nf)) continue;
        char name[256];
        if (snprintf(name, sizeof name, "%s%s", to, t->names[i] + nf) >= (int)sizeof name)
            return dc_fail("tensor name %s%s is too long", to, t->names[i] + nf);
        const dc_st_entry *e = &t->e[i];
        int64_t n_el = 1;
        for (int d = 0; d < e->ndim; d++) n_el *= e->shape[d];
        size_t bytes = dc_dtype_size(e->dtype) * (size_t)n_el;
        void *copy = malloc(bytes);
        if (copy) memcpy(copy, e->data, bytes);
        int64_t shape[DC_ST_MAX_DIMS];
        memcpy(shape, e->shape, sizeof shape);
        DC_TRY(add_owned(t, name, e->ndim, shape, copy, e->dtype));
    }
    return 0;
}

static void tensors_clear(dc_sd_tensors *t) {
    for (int i = 0; i < t->n; i++) free(t->bufs[i]);
    t->n = 0;
}

int dc_sd_tensors_write(dc_sd_tensors *t, const char *path, const dc_kv *kv) {
    for (int i = 0; i < t->n; i++) t->e[i].name = t->names[i];
    int rc = dc_st_write(path, t->e, t->n, kv ? (const char *const *)kv->keys : NULL,
                         kv ? (const char *const *)kv->values : NULL, kv ? kv->n : 0);
    tensors_clear(t);
    return rc;
}

void dc_sd_tensors_free(dc_sd_tensors *t) {
    tensors_clear(t);
    free(t->e), free(t->names), free(t->bufs);
    memset(t, 0, sizeof *t);
}

// ---- configs ------------------------------------------------------------------------------

#define DIFFUSERS_VERSION "0.27.2"  // a release that reads every key written here

// "[a, b, ...]" of n ints.
static void ints(char *b, size_t cap, const int *v, int n) {
    size_t k = (size_t)snprintf(b, cap, "[");
    for (int i = 0; i < n; i++) k += (size_t)snprintf(b + k, cap - k, "%s%d", i ? ", " : "", v[i]);
    snprintf(b + k, cap - k, "]");
}

int dc_sd_write_unet_config(const dc_unet_config *c, const char *path) {
    dc_kv kv = {0};
    if (dc_unet_config_to_kv(c, &kv)) return dc_kv_free(&kv), -1;
    char text[8192];
    size_t k = (size_t)snprintf(text, sizeof text,
                                "{\n  \"_class_name\": \"UNet2DConditionModel\",\n  \"_diffusers_version\": \"%s\",\n"
                                "  \"act_fn\": \"silu\",\n  \"center_input_sample\": false,\n"
                                "  \"downsample_padding\": 1,\n  \"dual_cross_attention\": false,\n"
                                "  \"flip_sin_to_cos\": true,\n  \"freq_shift\": 0,\n  \"mid_block_scale_factor\": 1,\n"
                                "  \"num_class_embeds\": null,\n  \"only_cross_attention\": false,\n"
                                "  \"resnet_time_scale_shift\": \"default\"",
                                DIFFUSERS_VERSION);
    // The metadata entries are config keys with JSON values, but for two:
    // "model" (the class, above), and the prediction (the scheduler's, not
    // the UNet's). diffusers refuses num_attention_heads for this class: the
    // heads go under attention_head_dim, as SD's own configs have them.
    for (int i = 0; i < kv.n; i++) {
        const char *key = kv.keys[i], *value = kv.values[i];
        if (!strcmp(key, "model") || !strcmp(key, "prediction_type")) continue;
        if (!strcmp(key, "num_attention_heads")) key = "attention_head_dim";
        if (!strcmp(key, "sample_size") && !strcmp(value, "0")) value = "null";  // unknown
        char eps[32];  // the float's shortest spelling (1e-05, not 9.99999975e-06)
        if (!strcmp(key, "norm_eps")) snprintf(eps, sizeof eps, "%.7g", (double)c->eps), value = eps;
        k += (size_t)snprintf(text + k, sizeof text - k, ",\n  \"%s\": %s", key, value);
    }
    dc_kv_free(&kv);
    if (k + 4 > sizeof text) return dc_fail("%s: the UNet config is too long", path);
    snprintf(text + k, sizeof text - k, "\n}\n");
    return dc_write_text_file(path, text);
}

int dc_sd_write_vae_config(const dc_vae_config *c, const char *path) {
    char ch[256], text[4096], down[512] = "[", up[512] = "[";
    ints(ch, sizeof ch, c->ch, c->nblocks);
    for (int i = 0; i < c->nblocks; i++)
        strcat(down, i ? ", \"DownEncoderBlock2D\"" : "\"DownEncoderBlock2D\""),
            strcat(up, i ? ", \"UpDecoderBlock2D\"" : "\"UpDecoderBlock2D\"");
    strcat(down, "]"), strcat(up, "]");
    snprintf(text, sizeof text,
             "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"_diffusers_version\": \"%s\",\n  \"act_fn\": \"silu\",\n"
             "  \"in_channels\": %d,\n  \"out_channels\": %d,\n  \"latent_channels\": %d,\n"
             "  \"block_out_channels\": %s,\n  \"layers_per_block\": %d,\n  \"down_block_types\": %s,\n"
             "  \"up_block_types\": %s,\n  \"norm_num_groups\": %d,\n  \"scaling_factor\": %.7g\n}\n",
             DIFFUSERS_VERSION, c->in_channels, c->out_channels, c->latent_channels, ch, c->layers_per_block, down, up,
             c->groups, (double)c->scaling_factor);
    return dc_write_text_file(path, text);
}

int dc_sd_write_text_config(const dc_clip_text_config *c, int layers, dc_dtype dt, const char *path) {
    char text[2048];
    // transformers' names of the activations (quick_gelu, gelu = erf, gelu_new = tanh)
    const char *act = c->act == DC_ACT_QUICK_GELU ? "quick_gelu" : c->act == DC_ACT_GELU_ERF ? "gelu" : "gelu_new";
    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"CLIPTextModel\"],\n  \"model_type\": \"clip_text_model\",\n"
             "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"hidden_size\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n"
             "  \"hidden_act\": \"%s\",\n  \"layer_norm_eps\": %.7g,\n  \"projection_dim\": %d,\n"
             "  \"bos_token_id\": 0,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 1,\n  \"torch_dtype\": \"%s\"\n}\n",
             c->vocab, c->positions, c->width, layers, c->heads, c->ffn, act, (double)c->eps, c->width,
             dt == DC_F16 ? "float16" : dt == DC_BF16 ? "bfloat16" : "float32");
    return dc_write_text_file(path, text);
}

static const char *prediction_name(dc_prediction p) {
    return p == DC_PRED_V ? "v_prediction" : p == DC_PRED_SAMPLE ? "sample" : "epsilon";
}

int dc_sd_write_scheduler_config(const dc_json *base, dc_prediction pred, const char *path) {
    if (!base) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\n  \"_class_name\": \"PNDMScheduler\",\n  \"beta_start\": 0.00085,\n  \"beta_end\": 0.012,\n"
                 "  \"beta_schedule\": \"scaled_linear\",\n  \"num_train_timesteps\": 1000,\n  \"steps_offset\": 1,\n"
                 "  \"set_alpha_to_one\": false,\n  \"clip_sample\": false,\n  \"skip_prk_steps\": true,\n"
                 "  \"prediction_type\": \"%s\"\n}\n",
                 prediction_name(pred));
        return dc_write_text_file(path, text);
    }
    if (base->type != DC_JSON_OBJECT) return dc_fail("%s: the scheduler config is not a JSON object", path);
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    FILE *f = dc_atomic_stream(af);
    int rc = 0, k = 0;
    fputc('{', f);
    for (int i = 0; i < base->nkids && !rc; i++) {
        const dc_json *m = &base->kids[i];
        if (!strcmp(m->key, "prediction_type")) continue;
        fprintf(f, "%s\n  ", k++ ? "," : "");
        rc = dc_json_write_string(f, m->key);
        fputs(": ", f);
        if (!rc) rc = dc_json_write(f, m, 1);
    }
    fprintf(f, "%s\n  \"prediction_type\": \"%s\"\n}\n", k ? "," : "", prediction_name(pred));
    return dc_atomic_end(af, rc == 0);
}

int dc_sd_write_model_index(const char *scheduler_class, bool unet, bool vae, const char *path) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\n  \"_class_name\": \"StableDiffusionPipeline\",\n  \"_diffusers_version\": \"%s\",\n"
             "  \"feature_extractor\": [null, null],\n  \"requires_safety_checker\": false,\n"
             "  \"safety_checker\": [null, null],\n  \"scheduler\": [\"diffusers\", \"%s\"],\n"
             "  \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],\n"
             "  \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"],\n"
             "  \"unet\": %s,\n  \"vae\": %s\n}\n",
             DIFFUSERS_VERSION, scheduler_class, unet ? "[\"diffusers\", \"UNet2DConditionModel\"]" : "[null, null]",
             vae ? "[\"diffusers\", \"AutoencoderKL\"]" : "[null, null]");
    return dc_write_text_file(path, text);
}
