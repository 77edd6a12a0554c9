// What training a LoRA of a Stable Diffusion model needs from its format:
// the layers it adapts and the file it leaves (models/sd_lora.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "models/sd_lora.h"

static const char *const k_target_names[] = {[DC_LORA_ATTN] = "attn", [DC_LORA_TRANSFORMER] = "transformer",
                                             [DC_LORA_ALL] = "all"};

int dc_lora_targets_parse(const char *word, dc_lora_targets *t) {
    for (int i = 0; i <= DC_LORA_ALL; i++)
        if (!strcmp(word, k_target_names[i])) return *t = (dc_lora_targets)i, 0;
    return dc_fail("LoRA targets '%s': choose attn, transformer or all", word);
}

const char *dc_lora_targets_name(dc_lora_targets t) { return k_target_names[t]; }

#define TEXT_PREFIX "text_encoder."

// The module path of a weight of the part (its name less ".weight", less
// the joint set's text prefix), or NULL when it is no 2-D or 4-D weight of it.
static const char *module_of(const dc_param *p, dc_lora_part part, char *buf, size_t cap) {
    const char *name = p->name;
    const size_t L = strlen(name), W = strlen(".weight");
    if ((p->ndim != 2 && p->ndim != 4) || L <= W || strcmp(name + L - W, ".weight")) return NULL;
    const bool prefixed = !strncmp(name, TEXT_PREFIX, strlen(TEXT_PREFIX));
    if (prefixed && part == DC_LORA_UNET) return NULL;
    if (prefixed) name += strlen(TEXT_PREFIX);
    const size_t n = strlen(name) - W;
    if (n >= cap) return NULL;
    memcpy(buf, name, n);
    buf[n] = 0;
    return buf;
}

static bool has(const char *s, const char *part) { return strstr(s, part) != NULL; }

static bool targeted(const char *m, dc_lora_part part, dc_lora_targets t) {
    if (part == DC_LORA_TEXT)
        return !strncmp(m, "encoder.layers.", 15) && (has(m, ".self_attn.") || (t != DC_LORA_ATTN && has(m, ".mlp.")));
    if (has(m, ".attn1.") || has(m, ".attn2.")) return true;
    if (t == DC_LORA_ATTN) return false;
    if (has(m, ".attentions.")) return true;
    return t == DC_LORA_ALL && (has(m, ".resnets.") || has(m, ".downsamplers.") || has(m, ".upsamplers."));
}

int dc_sd_lora_add_targets(dc_lora *l, dc_lora_part part, dc_lora_targets t, int rank, float alpha) {
    const dc_params *ps = l->target;
    char m[DC_PARAM_NAME_MAX];
    for (int i = 0; i < ps->count; i++) {
        const char *mod = module_of(&ps->items[i], part, m, sizeof m);
        if (!mod || !targeted(mod, part, t)) continue;
        // named as the weight is, less ".weight" (a joint set's text prefix kept: a checkpoint tells the parts apart)
        char name[DC_PARAM_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(ps->items[i].name) - 7), ps->items[i].name);
        DC_TRY(dc_lora_add(l, i, name, rank, alpha));
    }
    if (!l->count) return dc_fail("LoRA: no layer of the %s is among its targets (%s)",
                                  part == DC_LORA_UNET ? "UNet" : "text encoder", dc_lora_targets_name(t));
    return 0;
}

// ---- the file

// One layer as a file holds it: its factors in PyTorch's layouts (owned).
typedef struct {
    dc_lora_part part;
    char module[DC_PARAM_NAME_MAX];  // dotted, without the joint set's prefix
    int rank;
    float alpha;
    float *f[2];                     // down, up
    int ndim;
    int64_t shape[2][4];
} layer_out;

typedef struct {
    layer_out *l;
    int n, cap;
} layers_out;

static int layers_add(layers_out *ls, dc_lora_part part, const char *module, float alpha, float *down,
                      const int64_t *dshape, float *up, const int64_t *ushape, int ndim) {
    if (ls->n == ls->cap) {
        const int cap = ls->cap ? 2 * ls->cap : 64;
        layer_out *g = realloc(ls->l, (size_t)cap * sizeof *g);
        if (!g) return free(down), free(up), dc_fail("out of memory");
        ls->l = g, ls->cap = cap;
    }
    layer_out *o = &ls->l[ls->n++];
    memset(o, 0, sizeof *o);
    o->part = part, o->alpha = alpha, o->rank = (int)dshape[0], o->ndim = ndim;
    o->f[0] = down, o->f[1] = up;
    snprintf(o->module, sizeof o->module, "%s", module);
    for (int d = 0; d < ndim; d++) o->shape[0][d] = dshape[d], o->shape[1][d] = ushape[d];
    return 0;
}

static void layers_free(layers_out *ls) {
    for (int i = 0; i < ls->n; i++) free(ls->l[i].f[0]), free(ls->l[i].f[1]);
    free(ls->l);
}

// A file key: "text_encoder.text_model." + a module path + ".lora.down.weight".
#define KEY_CAP (DC_PARAM_NAME_MAX + 48)

// The key of layer o's tensor `what` (kohya: lora_down.weight, lora_up.weight,
// alpha; diffusers: lora.down.weight, lora.up.weight).
static int key_of(const layer_out *o, dc_lora_file_format fmt, const char *what, char *key) {
    int n;
    if (fmt == DC_LORA_FILE_KOHYA) {
        n = snprintf(key, KEY_CAP, "%s", o->part == DC_LORA_UNET ? "lora_unet_" : "lora_te_text_model_");
        for (const char *c = o->module; *c && n < KEY_CAP - 1; c++) key[n++] = *c == '.' ? '_' : *c;
        key[n] = 0;
        n = n + snprintf(key + n, (size_t)(KEY_CAP - n), ".%s", what);
    } else {
        n = snprintf(key, KEY_CAP, "%s%s.%s", o->part == DC_LORA_UNET ? "unet." : "text_encoder.text_model.",
                     o->module, what);
    }
    return n < KEY_CAP ? 0 : dc_fail("LoRA file: the key of %s is too long", o->module);
}

static uint16_t *narrowed(float *h, int64_t n, dc_dtype dt) {
    uint16_t *q = (uint16_t *)h;  // in place: element j is read before it is overwritten
    for (int64_t j = 0; j < n; j++) q[j] = dt == DC_BF16 ? dc_f32_to_bf16(h[j]) : dc_f32_to_f16(h[j]);
    return q;
}

static int write_layers(const char *path, layers_out *ls, dc_lora_file_format fmt, const dc_kv *meta, dc_dtype dt) {
    if (dt != DC_F32 && dt != DC_F16 && dt != DC_BF16) return dc_fail("LoRA file: dtype %s", dc_dtype_name(dt));
    if (!ls->n) return dc_fail("LoRA file %s: no layers to write", path);
    const int per = fmt == DC_LORA_FILE_KOHYA ? 3 : 2;
    dc_st_entry *e = calloc((size_t)(per * ls->n), sizeof *e);
    char(*keys)[KEY_CAP] = calloc((size_t)(per * ls->n), sizeof *keys);
    float *alphas = calloc((size_t)ls->n, sizeof *alphas);
    dc_kv kv = {0};
    int rc = e && keys && alphas ? 0 : dc_fail("out of memory"), k = 0;
    for (int i = 0; !rc && i < ls->n; i++) {
        layer_out *o = &ls->l[i];
        const char *role[2][2] = {{"lora_down.weight", "lora_up.weight"}, {"lora.down.weight", "lora.up.weight"}};
        if (fmt == DC_LORA_FILE_DIFFUSERS) {  // no alpha: its scale goes into up
            const int64_t nu = o->shape[1][0] * o->rank;
            for (int64_t j = 0; j < nu; j++) o->f[1][j] *= o->alpha / (float)o->rank;
        }
        for (int f = 0; f < 2 && !rc; f++, k++) {
            rc = key_of(o, fmt, role[fmt][f], keys[k]);
            int64_t n = 1;
            for (int d = 0; d < o->ndim; d++) n *= o->shape[f][d];
            e[k] = (dc_st_entry){keys[k], dt, o->ndim, {0}, dt == DC_F32 ? (void *)o->f[f] : narrowed(o->f[f], n, dt)};
            for (int d = 0; d < o->ndim; d++) e[k].shape[d] = o->shape[f][d];
        }
        if (!rc && fmt == DC_LORA_FILE_KOHYA) {
            rc = key_of(o, fmt, "alpha", keys[k]);
            alphas[i] = o->alpha;
            e[k] = (dc_st_entry){keys[k], DC_F32, 0, {0}, &alphas[i]}, k++;
        }
    }
    if (!rc && fmt == DC_LORA_FILE_KOHYA)
        rc = dc_kv_set(&kv, "ss_network_module", "networks.lora") ||
             dc_kv_set(&kv, "ss_network_dim", "%d", ls->l[0].rank) ||
             dc_kv_set(&kv, "ss_network_alpha", "%g", (double)ls->l[0].alpha);
    for (int i = 0; !rc && meta && i < meta->n; i++) rc = dc_kv_set(&kv, meta->keys[i], "%s", meta->values[i]);
    if (!rc) rc = dc_st_write(path, e, k, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n);
    free(e), free(keys), free(alphas);
    dc_kv_free(&kv);
    return rc;
}

// Factor i of l as floats in PyTorch's order.
static float *factor(const dc_lora *l, int i) {
    const dc_param *p = &l->params.items[i];
    float *h = malloc((size_t)p->numel * sizeof *h);
    if (!h) return dc_fail("out of memory"), NULL;
    if (dc_download_as_f32(l->params.be, dc_param_data(&l->params, i), h, p->numel) || dc_param_from_stored(p, h))
        return free(h), NULL;
    return h;
}

static int collect(layers_out *ls, const dc_lora *l, dc_lora_part part) {
    char m[DC_PARAM_NAME_MAX];
    for (int i = 0; l && i < l->count; i++) {
        const dc_lora_item *it = &l->items[i];
        const char *mod = module_of(&l->target->items[it->param], part, m, sizeof m);
        if (!mod) return dc_fail("LoRA: %s is no layer a file can name", l->target->items[it->param].name);
        float *down = factor(l, it->down), *up = down ? factor(l, it->up) : NULL;
        if (!up) return free(down), -1;
        const dc_param *pd = &l->params.items[it->down], *pu = &l->params.items[it->up];
        DC_TRY(layers_add(ls, part, mod, it->alpha, down, pd->shape, up, pu->shape, pd->ndim));
    }
    return 0;
}

int dc_sd_lora_write(const char *path, const dc_lora *unet, const dc_lora *text, dc_lora_file_format fmt,
                     const dc_kv *meta, dc_dtype dt) {
    layers_out ls = {0};
    int rc = collect(&ls, unet, DC_LORA_UNET);
    if (!rc) rc = collect(&ls, text, DC_LORA_TEXT);
    if (!rc) rc = write_layers(path, &ls, fmt, meta, dt);
    layers_free(&ls);
    return rc;
}

static bool ends_with(const char *s, const char *tail, size_t *stem) {
    const size_t L = strlen(s), T = strlen(tail);
    if (L <= T || strcmp(s + L - T, tail)) return false;
    *stem = L - T;
    return true;
}

static float *tensor_f32(const dc_st_file *f, const dc_st_tensor *t) {
    float *h = malloc((size_t)t->numel * sizeof *h);
    if (!h) return dc_fail("out of memory"), NULL;
    if (dc_st_read_f32(f, t, h)) return free(h), NULL;
    return h;
}

int dc_sd_lora_write_checkpoint(const dc_st_file *ck, const char *prefix, const char *path,
                                dc_lora_file_format fmt, const dc_kv *meta, dc_dtype dt) {
    const char *a = dc_st_meta(ck, "lora_alpha");
    if (!a) return dc_fail("%s: not a checkpoint of a LoRA run (no lora_alpha)", ck->path);
    const float alpha = strtof(a, NULL);
    layers_out ls = {0};
    const size_t P = strlen(prefix);
    int rc = 0;
    for (int i = 0; !rc && i < ck->count; i++) {
        const dc_st_tensor *d = &ck->tensors[i];
        size_t stem;
        if (strncmp(d->name, prefix, P) || !ends_with(d->name + P, ".lora_down.weight", &stem)) continue;
        if (P == 0 && !strncmp(d->name, "ema.", 4)) continue;  // the raw weights only
        char mod[DC_PARAM_NAME_MAX], upname[DC_PARAM_NAME_MAX + 32];
        snprintf(mod, sizeof mod, "%.*s", (int)stem, d->name + P);
        snprintf(upname, sizeof upname, "%s%s.lora_up.weight", prefix, mod);
        const dc_st_tensor *u = dc_st_find(ck, upname);
        if (!u || d->ndim < 2 || u->ndim != d->ndim) {
            rc = dc_fail("%s: %s has no up factor of its shape", ck->path, d->name);
            break;
        }
        const bool text = !strncmp(mod, TEXT_PREFIX, strlen(TEXT_PREFIX));
        float *down = tensor_f32(ck, d), *up = down ? tensor_f32(ck, u) : NULL;
        rc = up ? layers_add(&ls, text ? DC_LORA_TEXT : DC_LORA_UNET, text ? mod + strlen(TEXT_PREFIX) : mod, alpha,
                             down, d->shape, up, u->shape, d->ndim)
                : (free(down), -1);
    }
    if (!rc) rc = write_layers(path, &ls, fmt, meta, dt);
    layers_free(&ls);
    return rc;
}

// The factors of one part in a checkpoint, added to l and then loaded.
static int read_part(const dc_st_file *ck, const char *prefix, dc_lora *l, bool text, float alpha) {
    const size_t P = strlen(prefix);
    const dc_st_tensor *t[2][1024];
    int n = 0;
    for (int i = 0; i < ck->count; i++) {
        const dc_st_tensor *d = &ck->tensors[i];
        size_t stem;
        if (strncmp(d->name, prefix, P) || !ends_with(d->name + P, ".lora_down.weight", &stem)) continue;
        if ((P == 0 && !strncmp(d->name, "ema.", 4)) || text != !strncmp(d->name + P, TEXT_PREFIX, strlen(TEXT_PREFIX)))
            continue;
        char mod[DC_PARAM_NAME_MAX], name[DC_PARAM_NAME_MAX + 32];
        snprintf(mod, sizeof mod, "%.*s", (int)stem, d->name + P);
        snprintf(name, sizeof name, "%s%s.lora_up.weight", prefix, mod);
        const dc_st_tensor *u = dc_st_find(ck, name);
        // the joint set's names are the encoder's own in a text encoder's set
        snprintf(name, sizeof name, "%s.weight", text ? mod + strlen(TEXT_PREFIX) : mod);
        const int param = dc_params_find(l->target, name);
        if (n == 1024) return dc_fail("%s: more than 1024 LoRA layers in one part", ck->path);
        if (!u || param < 0)
            return dc_fail("%s: %s names no layer of the model (or has no up factor)", ck->path, d->name);
        t[0][n] = d, t[1][n++] = u;
        DC_TRY(dc_lora_add(l, param, mod, (int)d->shape[0], alpha));
    }
    if (!n) return 0;
    DC_TRY(dc_lora_alloc(l, l->target->be, false));
    for (int i = 0; i < n; i++)
        for (int f = 0; f < 2; f++) {
            const int idx = f ? l->items[i].up : l->items[i].down;
            const dc_param *fp = &l->params.items[idx];
            if (t[f][i]->numel != fp->numel) return dc_fail("%s: %s has the wrong shape", ck->path, t[f][i]->name);
            float *h = tensor_f32(ck, t[f][i]);
            int rc = h ? dc_param_to_stored(fp, h) : -1;
            if (!rc) l->target->be->upload(l->target->be, dc_param_data(&l->params, idx).p, h, (size_t)fp->numel * 4);
            free(h);
            DC_TRY(rc);
        }
    return dc_backend_status(l->target->be);
}

int dc_sd_lora_read_checkpoint(const dc_st_file *ck, const char *prefix, dc_lora *unet, dc_lora *text) {
    const char *a = dc_st_meta(ck, "lora_alpha");
    if (!a) return dc_fail("%s: not a checkpoint of a LoRA run (no lora_alpha)", ck->path);
    DC_TRY(read_part(ck, prefix, unet, false, strtof(a, NULL)));
    return text ? read_part(ck, prefix, text, true, strtof(a, NULL)) : 0;
}
