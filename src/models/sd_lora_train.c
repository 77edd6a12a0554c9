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
        if (mod && targeted(mod, part, t)) DC_TRY(dc_lora_add(l, i, mod, rank, alpha));
    }
    if (!l->count) return dc_fail("LoRA: no layer of the %s is among its targets (%s)",
                                  part == DC_LORA_UNET ? "UNet" : "text encoder", dc_lora_targets_name(t));
    return 0;
}

// ---- kohya's file

// A file key: "lora_te_text_model_" + a module path + ".lora_down.weight".
#define KEY_CAP (DC_PARAM_NAME_MAX + 40)

typedef struct {
    dc_st_entry *e;
    char (*names)[KEY_CAP];
    void **data;
    int n, cap;
} entries;

// Appends tensor name (of n values h, ndim and shape) in dtype dt; takes h.
static int put(entries *es, const char *name, float *h, int64_t n, int ndim, const int64_t *shape, dc_dtype dt) {
    if (es->n == es->cap) return free(h), dc_fail("LoRA file: more tensors than planned");
    const int k = es->n++;
    if (snprintf(es->names[k], sizeof es->names[k], "%s", name) >= (int)sizeof es->names[k])
        return free(h), dc_fail("LoRA file: the key %s is too long", name);
    if (dt != DC_F32) {
        uint16_t *q = (uint16_t *)h;  // narrowed in place: element j is read before it is overwritten
        for (int64_t j = 0; j < n; j++) q[j] = dt == DC_BF16 ? dc_f32_to_bf16(h[j]) : dc_f32_to_f16(h[j]);
    }
    es->data[k] = h;
    es->e[k] = (dc_st_entry){es->names[k], dt, ndim, {0}, h};
    for (int d = 0; d < ndim; d++) es->e[k].shape[d] = shape[d];
    return 0;
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

static int put_part(entries *es, const dc_lora *l, dc_lora_part part, dc_dtype dt) {
    char m[DC_PARAM_NAME_MAX], key[KEY_CAP], full[KEY_CAP];
    for (int i = 0; l && i < l->count; i++) {
        const dc_lora_item *it = &l->items[i];
        const char *mod = module_of(&l->target->items[it->param], part, m, sizeof m);
        if (!mod) return dc_fail("LoRA: %s is no layer a file can name", l->target->items[it->param].name);
        int n = snprintf(key, sizeof key, "%s", part == DC_LORA_UNET ? "lora_unet_" : "lora_te_text_model_");
        for (const char *c = mod; *c && n < (int)sizeof key - 1; c++) key[n++] = *c == '.' ? '_' : *c;
        key[n] = 0;
        const char *role[2] = {"lora_down.weight", "lora_up.weight"};
        const int idx[2] = {it->down, it->up};
        for (int k = 0; k < 2; k++) {
            const dc_param *p = &l->params.items[idx[k]];
            float *h = factor(l, idx[k]);
            snprintf(full, sizeof full, "%.*s.%s", (int)(sizeof full - 20), key, role[k]);
            if (!h || put(es, full, h, p->numel, p->ndim, p->shape, dt)) return -1;
        }
        float *a = malloc(sizeof *a);
        snprintf(full, sizeof full, "%.*s.alpha", (int)(sizeof full - 20), key);
        if (!a) return dc_fail("out of memory");
        *a = it->alpha;
        DC_TRY(put(es, full, a, 1, 0, NULL, dt));
    }
    return 0;
}

int dc_sd_lora_write_kohya(const char *path, const dc_lora *unet, const dc_lora *text, const dc_kv *meta,
                           dc_dtype dt) {
    if (dt != DC_F32 && dt != DC_F16 && dt != DC_BF16) return dc_fail("LoRA file: dtype %s", dc_dtype_name(dt));
    const dc_lora *first = unet && unet->count ? unet : text;
    if (!first || !first->count) return dc_fail("LoRA file %s: no layers to write", path);
    entries es = {0};
    es.cap = 3 * ((unet ? unet->count : 0) + (text ? text->count : 0));
    es.e = calloc((size_t)es.cap, sizeof *es.e), es.names = calloc((size_t)es.cap, sizeof *es.names);
    es.data = calloc((size_t)es.cap, sizeof *es.data);
    dc_kv kv = {0};
    int rc = es.e && es.names && es.data ? 0 : dc_fail("out of memory");
    if (!rc) rc = put_part(&es, unet, DC_LORA_UNET, dt);
    if (!rc) rc = put_part(&es, text, DC_LORA_TEXT, dt);
    if (!rc)
        rc = dc_kv_set(&kv, "ss_network_module", "networks.lora") ||
             dc_kv_set(&kv, "ss_network_dim", "%d", first->items[0].rank) ||
             dc_kv_set(&kv, "ss_network_alpha", "%g", (double)first->items[0].alpha);
    for (int i = 0; !rc && meta && i < meta->n; i++) rc = dc_kv_set(&kv, meta->keys[i], "%s", meta->values[i]);
    if (!rc) rc = dc_st_write(path, es.e, es.n, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n);
    for (int i = 0; i < es.n; i++) free(es.data[i]);
    free(es.e), free(es.names), free(es.data);
    dc_kv_free(&kv);
    return rc;
}
