#include "models/sd_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/lycoris.h"
#include "models/sd_lora_keys.h"

// One adapted layer's tensors in the file, and a LoHa's or LoKr's factors
// as a LoRA's (models/lycoris.h; host, PyTorch's layouts).
typedef struct {
    int param;
    const dc_st_tensor *t[DC_LORA_ROLES];  // by dc_lora_role
    float *down, *up;
} layer_tensors;

typedef struct {
    dc_lora *lora;
    dc_lora_modules mods;
    layer_tensors *layers;
    int n;
} part_state;

static layer_tensors *layer_of(part_state *p, int param) {
    for (int i = 0; i < p->n; i++)
        if (p->layers[i].param == param) return &p->layers[i];
    layer_tensors *l = &p->layers[p->n++];
    l->param = param;
    return l;
}

// Whether factor t fits weight w as role (down or up) at rank r.
static bool fits(const dc_st_tensor *t, const dc_param *w, dc_lora_role role, int64_t r) {
    if (t->ndim != w->ndim) return false;
    if (w->ndim == 2)
        return role == DC_LORA_DOWN ? t->shape[0] == r && t->shape[1] == w->shape[1]
                                    : t->shape[0] == w->shape[0] && t->shape[1] == r;
    return role == DC_LORA_DOWN ? t->shape[0] == r && t->shape[1] == w->shape[1] && t->shape[2] == w->shape[2] &&
                                      t->shape[3] == w->shape[3]
                                : t->shape[0] == w->shape[0] && t->shape[1] == r && t->shape[2] == 1 &&
                                      t->shape[3] == 1;
}

static void shape_text(const dc_st_tensor *t, char *buf, size_t n) {
    int k = snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && k > 0 && (size_t)k < n; d++) k += snprintf(buf + k, n - (size_t)k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
}

// The file's alpha of a layer, or `none` where it has none; 0 with *a.
static int read_alpha(const dc_st_file *f, const dc_st_tensor *alpha, float none, float *a) {
    *a = none;
    if (!alpha) return 0;
    if (alpha->numel != 1 || dc_st_read_f32(f, alpha, a)) return dc_fail_ctx("%s: %s, a scalar", f->path, alpha->name);
    if (!(*a == *a) || *a == 0) return dc_fail("%s: %s is %g", f->path, alpha->name, *a);
    return 0;
}

// Layer l of a LoRA: its rank and alpha, its factors checked against w.
static int lora_layer(const dc_st_file *f, const layer_tensors *l, const dc_param *w, int *rank, float *alpha) {
    const dc_st_tensor *down = l->t[DC_LORA_DOWN], *up = l->t[DC_LORA_UP];
    if (!down || !up) return dc_fail("%s: the LoRA of %s has no %s factor", f->path, w->name, down ? "up" : "down");
    const int64_t r = down->shape[0];
    char sd[96], su[96];
    shape_text(down, sd, sizeof sd), shape_text(up, su, sizeof su);
    if (down->ndim < 2 || r < 1 || !fits(down, w, DC_LORA_DOWN, r) || !fits(up, w, DC_LORA_UP, r))
        return dc_fail("%s: the LoRA of %s (%s, a %dD weight of %lld x %lld) has factors %s and %s that do not "
                       "fit it", f->path, w->name, down->name, w->ndim, (long long)w->shape[0],
                       (long long)w->shape[1], sd, su);
    *rank = (int)r;
    return read_alpha(f, l->t[DC_LORA_ALPHA], (float)r, alpha);
}

// Layer l of a LoHa or LoKr: its factors as a LoRA's (into l), its rank, and
// the alpha that gives the adapter's alpha / rank its scale, the file's
// alpha / dim (1 where either is unknown).
static int lycoris_layer(const dc_st_file *f, dc_delta_kind kind, layer_tensors *l, const dc_param *w, int *rank,
                         float *alpha) {
    int dim = 0;
    float a;
    DC_TRY(dc_lycoris_factors(f, kind, (const dc_st_tensor *const *)l->t, w, rank, &dim, &l->down, &l->up));
    DC_TRY(read_alpha(f, l->t[DC_LORA_ALPHA], 0, &a));
    *alpha = (float)*rank * (a != 0 && dim > 0 ? a / (float)dim : 1.0f);
    return 0;
}

// The layers of part p: each checked, added to the LoRA, then the factors allocated and loaded.
static int load_part(const dc_st_file *f, part_state *p) {
    dc_params *target = p->lora->target;
    for (int i = 0; i < p->n; i++) {
        layer_tensors *l = &p->layers[i];
        const dc_param *w = &target->items[l->param];
        const int kind = dc_lycoris_kind((const dc_st_tensor *const *)l->t, w->name);
        if (kind < 0) return dc_fail_ctx("%s", f->path);
        int r;
        float a;
        DC_TRY(kind == DC_DELTA_LORA ? lora_layer(f, l, w, &r, &a) : lycoris_layer(f, kind, l, w, &r, &a));
        char name[DC_PARAM_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(w->name) - strlen(".weight")), w->name);
        DC_TRY(dc_lora_add(p->lora, l->param, name, r, a));
    }
    DC_TRY(dc_lora_alloc(p->lora, target->be, false));
    for (int i = 0; i < p->lora->count; i++) {
        const dc_lora_item *it = &p->lora->items[i];
        const layer_tensors *l = &p->layers[i];  // the items were added in the layers' order
        const int idx[2] = {it->down, it->up};
        float *made[2] = {l->down, l->up};  // a LoHa's or LoKr's, made already
        for (int k = 0; k < 2; k++) {
            const dc_param *fp = &p->lora->params.items[idx[k]];
            float *h = made[k] ? made[k] : malloc((size_t)fp->numel * sizeof *h);
            int rc = made[k] ? 0 : h ? dc_st_read_f32(f, l->t[k], h) : dc_fail("out of memory");
            if (!rc) rc = dc_param_to_stored(fp, h);  // a channels-last kernel's down
            if (!rc) target->be->upload(target->be, dc_param_data(&p->lora->params, idx[k]).p, h, (size_t)fp->numel * 4);
            if (!made[k]) free(h);
            DC_TRY(rc);
        }
    }
    return dc_backend_status(target->be);
}

int dc_sd_lora_read(const dc_st_file *f, dc_lora *unet, dc_lora *text) {
    part_state parts[2] = {{unet, {0}, NULL, 0}, {text, {0}, NULL, 0}};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        if (!parts[k].lora) continue;
        rc = dc_lora_modules_init(&parts[k].mods, parts[k].lora->target);
        if (!rc && !(parts[k].layers = calloc((size_t)f->count + 1, sizeof *parts[k].layers)))
            rc = dc_fail("out of memory");
    }
    for (int i = 0; i < f->count && !rc; i++) {
        dc_lora_key key;
        if ((rc = dc_lora_key_parse(f->tensors[i].name, &key))) break;
        part_state *p = &parts[key.part == DC_LORA_UNET ? 0 : 1];
        if (!p->lora) {
            rc = dc_fail("%s: %s is for a text encoder, and this model has none to adapt", f->path, f->tensors[i].name);
            break;
        }
        const int param = dc_lora_modules_find(&p->mods, &key);
        if (param < 0) {
            rc = dc_fail_ctx("%s (tensor %s)", f->path, f->tensors[i].name);
            break;
        }
        layer_tensors *l = layer_of(p, param);
        if (l->t[key.role]) {
            rc = dc_fail("%s: %s and %s are the same factor of one layer", f->path, l->t[key.role]->name,
                         f->tensors[i].name);
            break;
        }
        l->t[key.role] = &f->tensors[i];
    }
    for (int k = 0; k < 2 && !rc; k++)
        if (parts[k].lora) rc = load_part(f, &parts[k]);
    for (int k = 0; k < 2; k++) {
        dc_lora_modules_free(&parts[k].mods);
        for (int i = 0; i < parts[k].n; i++) free(parts[k].layers[i].down), free(parts[k].layers[i].up);
        free(parts[k].layers);
    }
    return rc;
}
