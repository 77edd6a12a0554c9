#include "nn/params_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static void shape_str(char *s, size_t cap, int ndim, const int64_t *shape) {
    s[0] = 0;
    for (int d = 0; d < ndim; d++)
        snprintf(s + strlen(s), cap - strlen(s), "%s%lld", d ? ", " : "", (long long)shape[d]);
}

int dc_params_load(const dc_params *ps, dc_buf dst, const dc_st_file *f, const char *prefix) {
    dc_backend *be = ps->be;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        if (p->frozen) continue;  // not in the flat layout: loaded by dc_params_load_weights
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        const dc_st_tensor *t = dc_st_find(f, name);
        if (!t) {
            if (!p->trainable) continue;  // fixed: computed at creation
            return dc_fail("%s: missing tensor '%s'", f->path, name);
        }
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            char want[96], got[96];
            shape_str(want, sizeof want, p->ndim, p->shape);
            shape_str(got, sizeof got, t->ndim, t->shape);
            return dc_fail("%s: tensor '%s' has shape [%s], the model needs [%s]", f->path, name, got, want);
        }
        float *h = malloc((size_t)p->numel * sizeof *h + 1);
        if (!h) return dc_fail("out of memory loading %s", name);
        if (dc_st_read_f32(f, t, h)) return free(h), -1;
        for (int64_t j = 0; j < p->numel; j++)
            if (!isfinite(h[j])) {
                float v = h[j];
                free(h);
                return dc_fail("%s: tensor '%s' element %lld is %g: weights must be finite (the run that wrote "
                               "them diverged, or the file is damaged)", f->path, name, (long long)j, v);
            }
        if (dc_param_to_stored(p, h)) return free(h), -1;
        be->upload(be, dc_buf_at(dst, p->offset).p, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
    return 0;
}

int dc_params_entries(const dc_params *ps, dc_buf src, const char *prefix, float *host,
                      dc_st_entry *entries, char (*names)[128]) {
    ps->be->download(ps->be, host, src.p, (size_t)ps->numel * sizeof(float));
    DC_TRY(dc_backend_status(ps->be));
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        if (p->frozen) return dc_fail("%s is frozen: it has no place in the flat buffer written", p->name);
        snprintf(names[i], 128, "%s%s", prefix, p->name);
        dc_st_entry *e = &entries[i];
        memset(e, 0, sizeof *e);
        e->name = names[i];
        e->dtype = DC_F32;
        e->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) e->shape[d] = p->shape[d];
        e->data = host + p->offset;
        DC_TRY(dc_param_from_stored(p, host + p->offset));
    }
    return 0;
}
