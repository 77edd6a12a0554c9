#include "train/pairs.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"

typedef struct {
    dc_source inst, cls;
    float prior_weight;
} pairs;

// The set sample idx is in, and its index there.
static dc_source *part(dc_source *s, int64_t *idx) {
    pairs *p = s->impl;
    if (*idx < p->inst.n) return &p->inst;
    *idx -= p->inst.n;
    return &p->cls;
}

static int pr_index(dc_source *s, int64_t g, int batch, int64_t *idx) {
    pairs *p = s->impl;
    if (batch < 2 || batch % 2)
        return dc_fail("DreamBooth pairs each instance picture with a class picture: the batch must be even (got %d)",
                       batch);
    const int half = batch / 2;
    const int64_t step = g / batch, k = g % batch;
    if (k < half) return p->inst.ops->index(&p->inst, step * half + k, half, idx);
    DC_TRY(p->cls.ops->index(&p->cls, step * half + (k - half), half, idx));
    *idx += p->inst.n;
    return 0;
}

static int pr_x0(dc_source *s, int64_t idx, bool flip, uint64_t seed, uint32_t key, uint32_t step, float *dst) {
    dc_source *q = part(s, &idx);
    return q->ops->x0(q, idx, flip, seed, key, step, dst);
}

static int pr_cond(dc_source *s, int64_t idx, bool drop, int32_t *label, float *ctx, int32_t *len) {
    dc_source *q = part(s, &idx);
    return q->ops->cond(q, idx, drop, label, ctx, len);
}

static int pr_ids(dc_source *s, int64_t idx, bool drop, int32_t *ids, int32_t *len) {
    dc_source *q = part(s, &idx);
    return q->ops->ids(q, idx, drop, ids, len);
}

static float pr_weight(dc_source *s, int64_t idx) {
    pairs *p = s->impl;
    return idx < p->inst.n ? 2.0f : 2.0f * p->prior_weight;
}

static void pr_close(dc_source *s) {
    pairs *p = s->impl;
    dc_source_close(&p->inst), dc_source_close(&p->cls);
    free(p);
}

static const dc_source_ops k_pairs = {.index = pr_index, .x0 = pr_x0, .cond = pr_cond, .ids = pr_ids,
                                      .weight = pr_weight, .close = pr_close};

int dc_source_pairs(dc_source *s, dc_source *inst, dc_source *cls, float prior_weight) {
    memset(s, 0, sizeof *s);
    pairs *p = calloc(1, sizeof *p);
    if (!p) return dc_source_close(inst), dc_source_close(cls), dc_fail("out of memory");
    p->inst = *inst, p->cls = *cls, p->prior_weight = prior_weight;
    memset(inst, 0, sizeof *inst), memset(cls, 0, sizeof *cls);
    *s = (dc_source){.ops = &k_pairs, .impl = p};
    const dc_source *a = &p->inst, *b = &p->cls;
    int rc = 0;
    if (!(prior_weight >= 0 && prior_weight < 1e6f)) rc = dc_fail("--prior-loss-weight %g: 0 or more", prior_weight);
    else if (!a->n || !b->n) rc = dc_fail("DreamBooth: %s holds no samples", a->n ? b->name : a->name);
    else if (a->ops->size || b->ops->size) rc = dc_fail("DreamBooth's sets are of one size each, not in buckets");
    else if (a->channels != b->channels || a->height != b->height || a->width != b->width || a->cond != b->cond ||
             a->text_len != b->text_len || a->text_dim != b->text_dim || a->flips != b->flips)
        rc = dc_fail("%s and %s hold samples of different kinds (size, channels or text): prepare both for the "
                     "same model at the same size", a->name, b->name);
    if (rc) {
        pr_close(s);
        memset(s, 0, sizeof *s);
        return -1;
    }
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0x44425448u);  // "DBTH"
    dc_xxh64_update_u64(&h, a->fingerprint), dc_xxh64_update_u64(&h, b->fingerprint);
    dc_xxh64_update(&h, &prior_weight, sizeof prior_weight);
    *s = (dc_source){.ops = &k_pairs, .impl = p, .n = a->n + b->n, .channels = a->channels, .height = a->height,
                     .width = a->width, .flips = a->flips, .cond = a->cond, .text_len = a->text_len,
                     .text_dim = a->text_dim, .fingerprint = dc_xxh64_digest(&h), .name = a->name};
    return 0;
}
