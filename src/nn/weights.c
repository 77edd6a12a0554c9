#include "nn/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const dc_st_tensor *dc_weights_find(const dc_weights *w, const char *name, const dc_st_file **file) {
    char full[256];
    if (snprintf(full, sizeof full, "%s%s", w->prefix, name) >= (int)sizeof full) return NULL;
    for (int i = 0; i < w->nfiles; i++) {
        const dc_st_tensor *t = dc_st_find(&w->files[i], full);
        if (t) {
            if (file) *file = &w->files[i];
            return t;
        }
    }
    return NULL;
}

int64_t dc_weights_dim(const dc_weights *w, const char *name, int d) {
    const dc_st_tensor *t = dc_weights_find(w, name, NULL);
    return t && d >= 0 && d < t->ndim ? t->shape[d] : -1;
}

int dc_weights_count_prefix(const dc_weights *w, const char *start) {
    size_t np = strlen(w->prefix), ns = strlen(start);
    int n = 0;
    for (int i = 0; i < w->nfiles; i++)
        for (int j = 0; j < w->files[i].count; j++) {
            const char *name = w->files[i].tensors[j].name;
            n += strncmp(name, w->prefix, np) == 0 && strncmp(name + np, start, ns) == 0;
        }
    return n;
}

static bool is_float(dc_dtype t) {
    return t == DC_F32 || t == DC_F16 || t == DC_BF16 || t == DC_F64 || t == DC_F8_E4M3 || t == DC_F8_E5M2;
}

dc_dtype dc_weights_dtype(const dc_weights *w) {
    size_t np = strlen(w->prefix);
    dc_dtype common = DC_DTYPE_COUNT;  // none seen yet
    for (int i = 0; i < w->nfiles; i++)
        for (int j = 0; j < w->files[i].count; j++) {
            const dc_st_tensor *t = &w->files[i].tensors[j];
            if (strncmp(t->name, w->prefix, np) != 0 || !is_float(t->dtype)) continue;
            if (common != DC_DTYPE_COUNT && t->dtype != common) return DC_F32;
            common = t->dtype;
        }
    return common == DC_F16 || common == DC_BF16 ? common : DC_F32;
}

// The dimensions other than 1, so [Co, Ci, 1, 1] and [Co, Ci] compare equal.
static int squeeze(int ndim, const int64_t *shape, int64_t *out) {
    int n = 0;
    for (int d = 0; d < ndim; d++)
        if (shape[d] != 1) out[n++] = shape[d];
    return n;
}

static void shape_str(char *s, size_t cap, int ndim, const int64_t *shape) {
    s[0] = 0;
    for (int d = 0; d < ndim; d++)
        snprintf(s + strlen(s), cap - strlen(s), "%s%lld", d ? ", " : "", (long long)shape[d]);
}

// Host scratch for one tensor's values, grown as needed and kept across the
// tensors of a load (fresh pages for each tensor cost more than the copying).
typedef struct {
    float *p;
    size_t cap;  // floats
} scratch;

static float *scratch_get(scratch *s, size_t n) {
    if (n <= s->cap) return s->p;
    float *p = realloc(s->p, n * sizeof *p);
    if (!p) return NULL;
    s->p = p, s->cap = n;
    return p;
}

static int load_one(dc_params *ps, int i, const dc_weights *w, const dc_weight_src *src, scratch *sc) {
    const dc_param *p = &ps->items[i];
    const dc_st_file *f = NULL;
    const dc_st_tensor *t = dc_weights_find(w, src->name, &f);
    const char *file = w->nfiles ? w->files[0].path : "weights";
    if (!t) {
        if (!p->trainable && !p->frozen) return 0;  // fixed: computed at creation
        return dc_fail("%s: missing tensor '%s%s' (for %s)", file, w->prefix, src->name, p->name);
    }
    int64_t shape[DC_ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    int64_t rows = src->rows ? src->rows : t->ndim ? t->shape[0] : 1;
    if (src->rows && (t->ndim < 1 || src->row0 < 0 || src->row0 + src->rows > t->shape[0]))
        return dc_fail("%s: tensor '%s%s' has no rows %lld..%lld (for %s)", f->path, w->prefix, src->name,
                       (long long)src->row0, (long long)(src->row0 + src->rows - 1), p->name);
    if (src->rows) shape[0] = rows;
    int64_t a[DC_ST_MAX_DIMS], b[DC_ST_MAX_DIMS];
    int na = squeeze(t->ndim, shape, a), nb = squeeze(p->ndim, p->shape, b);
    bool same = na == nb;
    for (int d = 0; same && d < na; d++) same = a[d] == b[d];
    if (!same) {
        char want[96], got[96];
        shape_str(want, sizeof want, p->ndim, p->shape);
        shape_str(got, sizeof got, t->ndim, shape);
        return dc_fail("%s: tensor '%s%s' has shape [%s]%s, the model needs [%s] for %s", f->path, w->prefix,
                       src->name, got, src->rows ? " in the rows it takes" : "", want, p->name);
    }
    // Frozen weights kept as loaded (narrower than the backend computes in)
    // hold the file's values as they are: a tensor of another dtype would be
    // rounded (or overflow).
    const dc_dtype dt = dc_param_data(ps, i).dt;
    if (p->frozen && dt != ps->be->compute && t->dtype != dt)
        return dc_fail("%s: tensor '%s%s' is %s, but the model was created to keep its weights as %s, as "
                       "loaded (a model whose files mix dtypes is created F32)", f->path, w->prefix, src->name,
                       dc_dtype_name(t->dtype), dc_dtype_name(dt));
    int64_t row_elems = t->shape[0] ? t->numel / t->shape[0] : 0;
    float *h = scratch_get(sc, (size_t)(src->rows ? t->numel : p->numel) + 1);
    if (!h) return dc_fail("out of memory loading %s", src->name);
    if (dc_st_read_f32(f, t, h)) return -1;
    float *v = src->rows ? h + src->row0 * row_elems : h;
    for (int64_t j = 0; j < p->numel; j++)
        if (!isfinite(v[j])) {
            float bad = v[j];
            long long at = (long long)(j + (v - h));
            return dc_fail("%s: tensor '%s%s' element %lld is %g: weights must be finite (the file is damaged, "
                           "or the run that wrote it diverged)", f->path, w->prefix, src->name, at, bad);
        }
    if (v != h) memmove(h, v, (size_t)p->numel * sizeof *h);
    if (dc_param_to_stored(p, h)) return -1;
    dc_upload_f32_as(ps->be, dc_param_data(ps, i), h, p->numel);
    return 0;
}

int dc_params_load_weights_range(dc_params *ps, int lo, int hi, const dc_weights *w, dc_weight_map map, void *ctx) {
    scratch sc = {NULL, 0};
    int rc = 0;
    for (int i = lo; i < hi && !rc; i++) {
        dc_weight_src src = {{0}, 0, 0};
        const char *own = ps->items[i].name + ps->items[i].prefix_len;
        if (map) {
            rc = map(ctx, own, &src);
        } else {
            snprintf(src.name, sizeof src.name, "%s", own);
        }
        if (!rc) rc = load_one(ps, i, w, &src, &sc);
    }
    free(sc.p);
    if (rc) return rc;
    dc_params_touch(ps);
    return dc_backend_status(ps->be);
}

int dc_params_load_weights(dc_params *ps, const dc_weights *w, dc_weight_map map, void *ctx) {
    return dc_params_load_weights_range(ps, 0, ps->count, w, map, ctx);
}
