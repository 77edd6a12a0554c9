#include "models/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/dit.h"
#include "models/model_io.h"
#include "models/unet.h"

// Every architecture this engine builds; the first is the default (the demo
// model, and the reader of plain official state dicts, which carry no
// "model" entry).
static const dc_model_arch *const k_archs[] = {&dc_dit_arch, &dc_unet_arch};
enum { N_ARCHS = sizeof k_archs / sizeof k_archs[0] };

// "DiT, ..." : the names of the architectures built, for messages.
static const char *built(void) {
    static char names[256];
    if (names[0]) return names;
    for (int i = 0, k = 0; i < N_ARCHS && k >= 0 && (size_t)k < sizeof names; i++)
        k += snprintf(names + k, sizeof names - (size_t)k, "%s%s", i ? ", " : "", k_archs[i]->name);
    return names;
}

static const dc_model_arch *find(const char *name) {
    for (int i = 0; i < N_ARCHS; i++)
        if (strcmp(name, k_archs[i]->name) == 0) return k_archs[i];
    return NULL;
}

const dc_model_arch *dc_model_arch_find(const char *name) {
    const dc_model_arch *a = find(name);
    if (!a) dc_fail("the model '%s' is not one this engine builds (it builds: %s)", name, built());
    return a;
}

const char *dc_model_presets_help(void) {
    static char help[256];
    if (help[0]) return help;
    for (int i = 0, k = 0; i < N_ARCHS && k >= 0 && (size_t)k < sizeof help; i++)
        if (k_archs[i]->presets_help)
            k += snprintf(help + k, sizeof help - (size_t)k, "%s%s", k ? ", " : "", k_archs[i]->presets_help);
    return help;
}

int dc_model_preset(const char *name, dc_kv *cfg) {
    dc_kv_free(cfg);
    if (!name) return k_archs[0]->preset(NULL, cfg);
    for (int i = 0; i < N_ARCHS; i++) {
        int rc = k_archs[i]->preset(name, cfg);
        if (rc <= 0) return rc;
    }
    return dc_fail("unknown model '%s' (expected %s)", name, dc_model_presets_help());
}

// The architecture a config's "model" entry names.
static const dc_model_arch *arch_of(const dc_kv *cfg) {
    const char *name = dc_kv_get(cfg, "model");
    if (!name) return dc_fail("a model config without its \"model\" entry"), NULL;
    return dc_model_arch_find(name);
}

int dc_model_configure(const dc_kv *base, const dc_kv *overrides, const dc_data_shape *data, dc_kv *out) {
    const dc_model_arch *a = arch_of(base);
    return a ? a->configure(base, overrides, data, out) : -1;
}

int dc_model_create(const dc_kv *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out) {
    *out = NULL;
    const dc_model_arch *a = arch_of(cfg);
    return a ? a->create(cfg, be, grad, out) : -1;
}

int dc_model_overrides_known(const dc_kv *ov, const char *arch, const char *const *known) {
    for (int i = 0; ov && i < ov->n; i++) {
        bool ok = !strcmp(ov->keys[i], "model") && !strcmp(ov->values[i], arch);
        for (int k = 0; known[k]; k++) ok |= !strcmp(ov->keys[i], known[k]);
        if (!ok) return dc_fail("a %s config has no entry '%s' to set", arch, ov->keys[i]);
    }
    return 0;
}

int dc_model_override_int(const dc_kv *ov, const char *key, int *v, int *given) {
    const char *s = ov ? dc_kv_get(ov, key) : NULL;
    *given = s != NULL;
    if (!s) return 0;
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || *end || x < 1 || x > 1 << 30) return dc_fail("%s = '%s' is not a positive integer", key, s);
    *v = (int)x;
    return 0;
}

int dc_model_config_of_file(const dc_st_file *f, const char *prefix, int heads, dc_kv *cfg) {
    const char *kind = dc_model_kind_of_file(f);
    const dc_model_arch *a = kind ? dc_model_arch_find(kind) : NULL;
    return a ? a->config_of_file(f, prefix, heads, cfg) : -1;
}

int dc_model_config_of_json(const char *path, dc_kv *cfg) {
    dc_kv_free(cfg);
    dc_json_doc doc;
    if (dc_json_read_file(&doc, path)) return -1;
    const dc_json *cls = dc_json_get(doc.root, "_class_name");
    if (!cls) cls = dc_json_get(doc.root, "model");
    int rc;
    if (!cls || !dc_json_is_cstr(cls)) {
        rc = dc_fail("%s: no \"_class_name\" naming the model (this engine builds: %s)", path, built());
    } else {
        const dc_model_arch *a = find(cls->str);
        if (a && a->config_of_json) rc = a->config_of_json(doc.root, path, cfg);
        else rc = dc_fail("%s: the model '%s' is not one this engine builds from a config.json (it builds: %s)", path,
                          cls->str, built());
    }
    dc_json_free(&doc);
    return rc;
}

const char *dc_model_kind_of_file(const dc_st_file *f) {
    const char *kind = dc_st_meta(f, "model");
    if (!kind) return k_archs[0]->name;  // official state dicts carry no metadata; the reader checks the keys
    if (find(kind)) return kind;
    dc_fail("%s: metadata names the model '%s', which this engine does not build (it builds: %s)", f->path, kind,
            built());
    return NULL;
}
