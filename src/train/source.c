#include "train/source.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    const dc_dataset *ds;
    dc_order order;
} in_memory;

static int mem_index(dc_source *s, int64_t g, int batch, int64_t *idx) {
    (void)batch;
    in_memory *m = s->impl;
    *idx = dc_order_get(&m->order, (uint64_t)(g / s->n), g % s->n);
    return 0;
}

static int mem_x0(dc_source *s, int64_t idx, bool flip, uint64_t seed, uint32_t key, uint32_t step, float *dst) {
    (void)seed, (void)key, (void)step;
    dc_dataset_get(((in_memory *)s->impl)->ds, idx, dst, flip);
    return 0;
}

static int mem_cond(dc_source *s, int64_t idx, bool drop, int32_t *label, float *ctx, int32_t *len) {
    const dc_dataset *ds = ((in_memory *)s->impl)->ds;
    if (ds->cond == DC_COND_LABELS) {
        *label = ds->labels[idx];
        return 0;
    }
    const size_t seq = (size_t)ds->text_len * (size_t)ds->text_dim;
    memcpy(ctx, drop ? ds->text_null : ds->text + (size_t)idx * seq, seq * sizeof *ctx);
    *len = drop ? ds->text_null_len : ds->text_lens[idx];
    return 0;
}

static void mem_close(dc_source *s) {
    in_memory *m = s->impl;
    dc_order_free(&m->order);
    free(m);
}

static const dc_source_ops k_in_memory = {.index = mem_index, .x0 = mem_x0, .cond = mem_cond, .close = mem_close};

int dc_source_dataset(dc_source *s, const dc_dataset *ds, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (ds->cond == DC_COND_TEXT && (ds->text_len < 1 || ds->text_dim < 1 || !ds->text || !ds->text_lens ||
                                     !ds->text_null))
        return dc_fail("a text data set without its embeddings, lengths and empty prompt");
    in_memory *m = calloc(1, sizeof *m);
    if (!m) return dc_fail("out of memory");
    m->ds = ds;
    if (dc_order_init(&m->order, ds->n, seed)) return free(m), -1;
    *s = (dc_source){.ops = &k_in_memory, .n = ds->n, .channels = ds->channels, .height = ds->height,
                     .width = ds->width, .flips = true, .cond = ds->cond, .num_classes = ds->num_classes,
                     .text_len = ds->text_len, .text_dim = ds->text_dim, .fingerprint = ds->fingerprint,
                     .name = ds->source ? ds->source : "in use", .impl = m};
    return 0;
}

void dc_source_close(dc_source *s) {
    if (s->ops) s->ops->close(s);
    memset(s, 0, sizeof *s);
}
