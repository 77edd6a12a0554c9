#include "nn/params.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int dc_params_add(dc_params *ps, const char *name, bool trainable, int ndim, ...) {
    if (ndim < 1 || ndim > DC_MAX_DIMS) return dc_fail("parameter %s: bad rank %d", name, ndim);
    const char *prefix = ps->prefix ? ps->prefix : "";
    if (strlen(prefix) + strlen(name) >= DC_PARAM_NAME_MAX) return dc_fail("parameter name too long: %s%s", prefix, name);
    if (ps->count == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 64;
        dc_param *items = realloc(ps->items, cap * sizeof *items);
        if (!items) return dc_fail("out of memory registering %s", name);
        ps->items = items, ps->cap = cap;
    }
    dc_param *p = &ps->items[ps->count];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s%s", prefix, name);
    p->prefix_len = (int)strlen(prefix);
    p->ndim = ndim;
    p->trainable = trainable;
    p->numel = 1;
    va_list ap;
    va_start(ap, ndim);
    for (int d = 0; d < ndim; d++) p->shape[d] = va_arg(ap, int), p->numel *= p->shape[d];
    va_end(ap);
    p->offset = ps->numel;
    ps->numel += p->numel;
    return ps->count++;
}

// [Co, A, Bn] -> [Co, Bn, A] in place through a copy: to the storage order
// A = Ci, Bn = kh kw; back, A = kh kw, Bn = Ci.
static int permute_kernel(const dc_param *p, float *h, bool to_stored) {
    if (!p->channels_last) return 0;
    const int64_t co = p->shape[0], ci = p->shape[1], kk = p->shape[2] * p->shape[3];
    const int64_t A = to_stored ? ci : kk, Bn = to_stored ? kk : ci;
    // One output channel at a time through a small scratch (ci kh kw values,
    // heap memory that is reused, not fresh pages for every tensor).
    float *t = malloc((size_t)(A * Bn) * sizeof *t + 1);
    if (!t) return dc_fail("out of memory permuting %s", p->name);
    for (int64_t o = 0; o < co; o++) {
        float *ho = h + o * A * Bn;
        for (int64_t a = 0; a < A; a++)
            for (int64_t b = 0; b < Bn; b++) t[b * A + a] = ho[a * Bn + b];
        memcpy(ho, t, (size_t)(A * Bn) * sizeof *t);
    }
    free(t);
    return 0;
}
int dc_param_to_stored(const dc_param *p, float *h) { return permute_kernel(p, h, true); }
int dc_param_from_stored(const dc_param *p, float *h) { return permute_kernel(p, h, false); }

int dc_params_freeze(dc_params *ps, int i) {
    if (ps->be) return dc_fail("parameter %s: a set is frozen in part before it is allocated", ps->items[i].name);
    ps->items[i].frozen = true;
    ps->items[i].trainable = false;
    return 0;
}

// Offsets in registration order: the flat layout for trainable and fixed
// parameters, the frozen arena for frozen ones. Unit ends were recorded as
// offsets into the registration-time layout (every parameter flat); each
// moves to the flat offset of the first parameter at or after it.
static void layout(dc_params *ps) {
    int64_t reg = 0, flat = 0, fz = 0;
    int u = 0;
    for (int i = 0; i < ps->count; i++) {
        dc_param *p = &ps->items[i];
        while (u < ps->units && ps->unit_end[u] <= reg) ps->unit_end[u++] = flat;
        reg += p->numel;
        if (p->frozen) p->offset = fz, fz += p->numel;
        else p->offset = flat, flat += p->numel;
    }
    while (u < ps->units) ps->unit_end[u++] = flat;
    ps->numel = flat;
    ps->frozen_numel = fz;
}

// A zeroed device buffer of n elements of dt; none for n = 0.
static int alloc_zero(dc_backend *be, dc_buf *b, int64_t n, dc_dtype dt) {
    size_t bytes = (size_t)n * dc_dtype_size(dt);
    *b = (dc_buf){NULL, dt};
    if (n == 0) return 0;
    b->p = be->alloc(be, bytes);
    if (!b->p) return -1;
    be->zero(be, b->p, bytes);
    return 0;
}

int dc_params_alloc_loaded(dc_params *ps, dc_backend *be, dc_grad_mode grad, dc_dtype loaded) {
    if (ps->be) return dc_fail("the parameters are already allocated");
    layout(ps);
    ps->be = be;
    ps->window = grad == DC_GRAD_WINDOW;
    DC_TRY(alloc_zero(be, &ps->data, ps->numel, DC_F32));
    if (grad == DC_GRAD_BUFFER) DC_TRY(alloc_zero(be, &ps->grad, ps->numel, DC_F32));
    if (be->compute != DC_F32 && ps->numel) {
        ps->wc = (dc_buf){be->alloc(be, (size_t)ps->numel * dc_dtype_size(be->compute)), be->compute};
        if (!ps->wc.p) return -1;
    }
    const bool half = loaded == DC_F16 || loaded == DC_BF16;
    DC_TRY(alloc_zero(be, &ps->frozen, ps->frozen_numel, half && be->half_weights ? loaded : be->compute));
    ps->stale = ps->numel > 0;  // the compute copy is made from the master before it is read
    return 0;
}

int dc_params_alloc(dc_params *ps, dc_backend *be, dc_grad_mode grad) {
    return dc_params_alloc_loaded(ps, be, grad, be->compute);
}

int dc_params_alloc_frozen(dc_params *ps, dc_backend *be, dc_dtype loaded) {
    for (int i = 0; i < ps->count; i++) DC_TRY(dc_params_freeze(ps, i));
    return dc_params_alloc_loaded(ps, be, false, loaded);
}

size_t dc_params_bytes(const dc_params *ps) {
    size_t flat = (ps->data.p ? 4 : 0) + (ps->grad.p && !ps->grad_lent ? 4 : 0) +
                  (ps->wc.p ? dc_dtype_size(ps->wc.dt) : 0);
    return (size_t)ps->numel * flat + (size_t)ps->frozen_numel * dc_dtype_size(ps->frozen.dt);
}

void dc_params_refresh(dc_params *ps) {
    if (ps->wc.p && ps->stale) ps->be->cast(ps->be, ps->wc, ps->data, ps->numel);
    ps->stale = false;
}

void dc_params_free(dc_params *ps) {
    if (ps->be) {
        if (ps->data.p) ps->be->free(ps->be, ps->data.p);
        if (ps->grad.p && !ps->grad_lent) ps->be->free(ps->be, ps->grad.p);
        if (ps->wc.p) ps->be->free(ps->be, ps->wc.p);
        if (ps->frozen.p) ps->be->free(ps->be, ps->frozen.p);
    }
    free(ps->items);
    free(ps->unit_end);
    memset(ps, 0, sizeof *ps);
}

void dc_upload_f32_as(dc_backend *be, dc_buf b, float *h, int64_t n) {
    if (b.dt == DC_F32) {
        be->upload(be, b.p, h, (size_t)n * sizeof *h);
        return;
    }
    uint16_t *u = (uint16_t *)h;  // narrowing in place: element j is read before it is written
    for (int64_t j = 0; j < n; j++) u[j] = b.dt == DC_BF16 ? dc_f32_to_bf16(h[j]) : dc_f32_to_f16(h[j]);
    be->upload(be, b.p, u, (size_t)n * sizeof *u);
}

int dc_download_as_f32(dc_backend *be, dc_buf b, float *h, int64_t n) {
    if (b.dt == DC_F32) {
        be->download(be, h, b.p, (size_t)n * sizeof *h);
    } else {
        // into the upper half of h, widened from the bottom up: h[j] overwrites
        // only halves already read
        uint16_t *u = (uint16_t *)h + n;
        be->download(be, u, b.p, (size_t)n * sizeof *u);
        for (int64_t j = 0; j < n; j++) h[j] = b.dt == DC_BF16 ? dc_bf16_to_f32(u[j]) : dc_f16_to_f32(u[j]);
    }
    return dc_backend_status(be);
}

int dc_params_find(const dc_params *ps, const char *name) {
    for (int i = 0; i < ps->count; i++)
        if (strcmp(ps->items[i].name, name) == 0) return i;
    return -1;
}

int dc_params_end_unit(dc_params *ps) {
    if (ps->numel == (ps->units ? ps->unit_end[ps->units - 1] : 0)) return 0;
    int64_t *e = realloc(ps->unit_end, sizeof *e * (size_t)(ps->units + 1));
    if (!e) return dc_fail("out of memory");
    ps->unit_end = e;
    e[ps->units++] = ps->numel;
    return 0;
}

bool dc_params_next_run(const dc_params *ps, int64_t *pos, int64_t end, int64_t *lo, int64_t *hi) {
    bool open = false;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        if (p->frozen) continue;
        int64_t s = p->offset > *pos ? p->offset : *pos, e = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (s >= e) continue;
        if (!p->trainable) {
            if (open) break;
            continue;
        }
        if (!open) *lo = s, open = true;
        *hi = e;
    }
    if (open) *pos = *hi;
    return open;
}

int dc_params_unit_count(const dc_params *ps) {
    bool tail = ps->numel > (ps->units ? ps->unit_end[ps->units - 1] : 0);
    return ps->units + tail;
}

void dc_params_unit_range(const dc_params *ps, int u, int64_t *lo, int64_t *hi) {
    *lo = u > 0 ? ps->unit_end[u - 1] : 0;
    *hi = u < ps->units ? ps->unit_end[u] : ps->numel;
}

int64_t dc_params_widest_unit(const dc_params *ps) {
    int64_t w = 0;
    for (int u = 0; u < dc_params_unit_count(ps); u++) {
        int64_t lo, hi;
        dc_params_unit_range(ps, u, &lo, &hi);
        w = hi - lo > w ? hi - lo : w;
    }
    return w;
}

// Zeroes the gradients of flat [lo, hi).
static void grad_zero(const dc_params *ps, int64_t lo, int64_t hi) {
    if (hi > lo) ps->be->zero(ps->be, dc_buf_at(ps->grad, lo).p, (size_t)(hi - lo) * sizeof(float));
}

static bool in_unit(const dc_param *p, int64_t lo, int64_t hi) {
    return !p->frozen && p->numel > 0 && p->offset >= lo && p->offset < hi;
}

int dc_params_unit_begin(dc_params *ps, int u) {
    if (ps->grad_lent) {
        // the parameters no op overwrites are zeroed, adjacent ones in one pass
        int64_t lo, hi, run = -1, run_end = -1;
        dc_params_unit_range(ps, u, &lo, &hi);
        for (int i = 0; i < ps->count; i++) {
            dc_param *p = &ps->items[i];
            if (!in_unit(p, lo, hi)) continue;
            p->grad_fresh = p->grad_sets;
            if (p->grad_sets) continue;
            if (p->offset != run_end) grad_zero(ps, run, run_end), run = p->offset;
            run_end = p->offset + p->numel;
        }
        grad_zero(ps, run, run_end);
    }
    return ps->hooks && ps->hooks->unit ? ps->hooks->unit(ps->hooks->ctx, u, false) : 0;
}

int dc_params_unit_done(dc_params *ps, int u) {
    if (ps->grad_lent) {
        int64_t lo, hi;
        dc_params_unit_range(ps, u, &lo, &hi);
        for (int i = 0; i < ps->count; i++)
            if (in_unit(&ps->items[i], lo, hi) && ps->items[i].grad_fresh) dc_params_grad_settle(ps, i);
    }
    return ps->hooks && ps->hooks->unit ? ps->hooks->unit(ps->hooks->ctx, u, true) : 0;
}

void dc_params_grad_settle(const dc_params *ps, int i) {
    dc_param *p = &ps->items[i];
    if (!p->grad_fresh) return;
    grad_zero(ps, p->offset, p->offset + p->numel);
    p->grad_fresh = false;
}

int dc_params_claim_grads(const dc_params *ps, const int *idx, const int64_t *n, int k) {
    // parameter by parameter over each range: first whether all are fresh
    bool all = true, any = false;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < k; j++) {
            if (idx[j] < 0 || ps->items[idx[j]].frozen) continue;
            const int64_t end = ps->items[idx[j]].offset + n[j];
            for (int i = idx[j]; i < ps->count; i++) {
                dc_param *p = &ps->items[i];
                if (p->frozen) continue;
                if (p->offset >= end) break;
                if (pass == 0) all = all && p->grad_fresh, any = true;
                else if (all) p->grad_fresh = false;
                else dc_params_grad_settle(ps, i);
            }
        }
    return all && any ? DC_BWD_DW_SET : 0;
}

size_t dc_params_grad_place(const dc_params *ps, const int64_t *dead_from, size_t arena_bytes, size_t *at) {
    int64_t lo_at = 0;
    for (int u = 0; u < dc_params_unit_count(ps); u++) {
        int64_t lo, hi;
        dc_params_unit_range(ps, u, &lo, &hi);
        if (hi > lo && dead_from[u] - 4 * lo > lo_at) lo_at = dead_from[u] - 4 * lo;
    }
    *at = ((size_t)lo_at + 255) & ~(size_t)255;
    const size_t end = *at + (size_t)ps->numel * sizeof(float);
    return end > arena_bytes ? end : arena_bytes;
}

void dc_params_lend_grad(dc_params *ps, void *at) {
    if (ps->grad.p && !ps->grad_lent) ps->be->free(ps->be, ps->grad.p);
    ps->grad = at ? (dc_buf){at, DC_F32} : dc_buf_none();
    ps->grad_lent = at != NULL;
    for (int i = 0; i < ps->count; i++) ps->items[i].grad_fresh = false;
}
