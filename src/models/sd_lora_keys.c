#include "models/sd_lora_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

// Whether s ends with suffix; *stem_len the length before it.
static bool ends(const char *s, const char *suffix, size_t *stem_len) {
    const size_t n = strlen(s), m = strlen(suffix);
    if (n <= m || strcmp(s + n - m, suffix)) return false;
    *stem_len = n - m;
    return true;
}

static int set_module(dc_lora_key *k, const char *name, const char *s, size_t len) {
    if (len == 0 || len >= sizeof k->module) return dc_fail("LoRA key %s: no module path in it", name);
    memcpy(k->module, s, len);
    k->module[len] = 0;
    return 0;
}

static const char *const k_tucker[] = {".hada_t1", ".hada_t2", ".lokr_t2", ".lora_mid"};

// kohya's lora_unet_<path>.<role> and lora_te_text_model_<path>.<role>.
static int parse_kohya(const char *name, const char *rest, dc_lora_key *k) {
    static const struct { const char *suffix; dc_lora_role role; } roles[] = {
        {".lora_down.weight", DC_LORA_DOWN}, {".lora_up.weight", DC_LORA_UP}, {".alpha", DC_LORA_ALPHA},
        {".hada_w1_a", DC_LORA_HADA_W1A},    {".hada_w1_b", DC_LORA_HADA_W1B}, {".hada_w2_a", DC_LORA_HADA_W2A},
        {".hada_w2_b", DC_LORA_HADA_W2B},    {".lokr_w1", DC_LORA_LOKR_W1},    {".lokr_w1_a", DC_LORA_LOKR_W1A},
        {".lokr_w1_b", DC_LORA_LOKR_W1B},    {".lokr_w2", DC_LORA_LOKR_W2},    {".lokr_w2_a", DC_LORA_LOKR_W2A},
        {".lokr_w2_b", DC_LORA_LOKR_W2B}};
    k->format = DC_LORA_KOHYA;
    if (k->part == DC_LORA_TEXT) {
        if (!starts(rest, "text_model_"))
            return dc_fail("LoRA key %s: a text encoder key of kohya's form starts lora_te_text_model_", name);
        rest += strlen("text_model_");
    }
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++) {
        size_t len;
        if (ends(rest, roles[i].suffix, &len)) {
            k->role = roles[i].role;
            return set_module(k, name, rest, len);
        }
    }
    for (size_t i = 0; i < sizeof k_tucker / sizeof *k_tucker; i++)
        if (strstr(rest, k_tucker[i]))
            return dc_fail("LoRA key %s: a LyCORIS Tucker core (hada_t1/t2, lokr_t2, lora_mid), which is not read: "
                           "LoHa and LoKr without one are", name);
    return dc_fail("LoRA key %s: not a lora_down, lora_up or alpha tensor, nor LyCORIS's hada_ or lokr_ ones", name);
}

// diffusers', PEFT's and the attention processors' unet.<path>.<role> and
// text_encoder.[text_model.]<path>.<role>.
static int parse_dotted(const char *name, const char *rest, dc_lora_key *k) {
    static const struct { const char *suffix; dc_lora_format format; dc_lora_role role; } roles[] = {
        {".lora.down.weight", DC_LORA_DIFFUSERS, DC_LORA_DOWN}, {".lora.up.weight", DC_LORA_DIFFUSERS, DC_LORA_UP},
        {".lora_A.weight", DC_LORA_PEFT, DC_LORA_DOWN},         {".lora_B.weight", DC_LORA_PEFT, DC_LORA_UP},
        {".lora_A.default.weight", DC_LORA_PEFT, DC_LORA_DOWN}, {".lora_B.default.weight", DC_LORA_PEFT, DC_LORA_UP},
        {".lora_linear_layer.down.weight", DC_LORA_DIFFUSERS, DC_LORA_DOWN},
        {".lora_linear_layer.up.weight", DC_LORA_DIFFUSERS, DC_LORA_UP},
        {".alpha", DC_LORA_DIFFUSERS, DC_LORA_ALPHA}};
    if (k->part == DC_LORA_TEXT && starts(rest, "text_model.")) rest += strlen("text_model.");
    // the attention processors': <block>.attnN.processor.to_q_lora.down.weight
    const char *proc = strstr(rest, ".processor.");
    if (proc) {
        static const struct { const char *leaf, *module; } leaves[] = {
            {"to_q_lora", "to_q"}, {"to_k_lora", "to_k"}, {"to_v_lora", "to_v"}, {"to_out_lora", "to_out.0"}};
        const char *leaf = proc + strlen(".processor.");
        for (size_t i = 0; i < sizeof leaves / sizeof *leaves; i++) {
            const size_t n = strlen(leaves[i].leaf);
            if (strncmp(leaf, leaves[i].leaf, n)) continue;
            const char *role = leaf + n;
            if (strcmp(role, ".down.weight") && strcmp(role, ".up.weight")) break;
            k->format = DC_LORA_PROCESSOR;
            k->role = role[1] == 'd' ? DC_LORA_DOWN : DC_LORA_UP;
            const int len = snprintf(k->module, sizeof k->module, "%.*s.%s", (int)(proc - rest), rest,
                                     leaves[i].module);
            return len > 0 && (size_t)len < sizeof k->module ? 0 : dc_fail("LoRA key %s: too long", name);
        }
        return dc_fail("LoRA key %s: not an attention processor's to_q/to_k/to_v/to_out LoRA tensor", name);
    }
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++) {
        size_t len;
        if (ends(rest, roles[i].suffix, &len)) {
            k->format = roles[i].format, k->role = roles[i].role;
            return set_module(k, name, rest, len);
        }
    }
    return dc_fail("LoRA key %s: not a lora down or up weight (lora.down, lora_A, ...) or an alpha", name);
}

int dc_lora_key_parse(const char *name, dc_lora_key *k) {
    memset(k, 0, sizeof *k);
    if (starts(name, "lora_te1_") || starts(name, "lora_te2_"))
        return dc_fail("LoRA key %s: an SDXL LoRA (two text encoders); SD 1.x and 2.x LoRAs are read", name);
    if (starts(name, "lora_unet_")) return k->part = DC_LORA_UNET, parse_kohya(name, name + strlen("lora_unet_"), k);
    if (starts(name, "lora_te_")) return k->part = DC_LORA_TEXT, parse_kohya(name, name + strlen("lora_te_"), k);
    if (starts(name, "unet.")) return k->part = DC_LORA_UNET, parse_dotted(name, name + strlen("unet."), k);
    if (starts(name, "text_encoder."))
        return k->part = DC_LORA_TEXT, parse_dotted(name, name + strlen("text_encoder."), k);
    return dc_fail("LoRA key %s: neither kohya's (lora_unet_, lora_te_) nor diffusers' (unet., text_encoder.)", name);
}

// ---- the modules of a model part

static int by_under(const void *a, const void *b) {
    return strcmp(((const struct dc_lora_module *)a)->under, ((const struct dc_lora_module *)b)->under);
}

int dc_lora_modules_init(dc_lora_modules *t, const dc_params *ps) {
    memset(t, 0, sizeof *t);
    t->ps = ps;
    if (!(t->mods = calloc((size_t)ps->count + 1, sizeof *t->mods))) return dc_fail("out of memory");
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        size_t len;
        if ((p->ndim != 2 && p->ndim != 4) || !ends(p->name, ".weight", &len)) continue;
        struct dc_lora_module *m = &t->mods[t->n++];
        m->param = i;
        for (size_t j = 0; j < len; j++) m->under[j] = p->name[j] == '.' ? '_' : p->name[j];
        m->under[len] = 0;
    }
    qsort(t->mods, (size_t)t->n, sizeof *t->mods, by_under);
    for (int i = 1; i < t->n; i++)
        if (!strcmp(t->mods[i - 1].under, t->mods[i].under)) {
            const char *a = ps->items[t->mods[i - 1].param].name, *b = ps->items[t->mods[i].param].name;
            dc_lora_modules_free(t);
            return dc_fail("LoRA names: %s and %s read the same with '_' for '.'", a, b);
        }
    return 0;
}

void dc_lora_modules_free(dc_lora_modules *t) {
    free(t->mods);
    memset(t, 0, sizeof *t);
}

int dc_lora_modules_find(const dc_lora_modules *t, const dc_lora_key *k) {
    const char *part = k->part == DC_LORA_UNET ? "UNet" : "text encoder";
    if (k->format == DC_LORA_KOHYA) {
        struct dc_lora_module key;
        snprintf(key.under, sizeof key.under, "%s", k->module);
        const struct dc_lora_module *m = bsearch(&key, t->mods, (size_t)t->n, sizeof *t->mods, by_under);
        if (m) return m->param;
        return dc_fail("LoRA module %s%s: the %s has no such layer",
                       k->part == DC_LORA_UNET ? "lora_unet_" : "lora_te_text_model_", k->module, part);
    }
    char name[DC_PARAM_NAME_MAX + 8];
    snprintf(name, sizeof name, "%s.weight", k->module);
    const int i = dc_params_find(t->ps, name);
    if (i >= 0 && (t->ps->items[i].ndim == 2 || t->ps->items[i].ndim == 4)) return i;
    return dc_fail("LoRA module %s: the %s has no such layer", k->module, part);
}
