#include "train/buckets.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"
#include "core/rng.h"
#include "train/stream.h"

#define TAG_BATCHES 0x424B5431u  // "BKT1": the shuffle of an epoch's batches

typedef struct {
    uint64_t seed;       // the run's: keys the shuffle of each epoch's batches
    int n;
    dc_source *sub;      // [n] each bucket's shards
    int64_t *first;      // [n + 1] the buckets' first sample in this source's numbering
    int batch;           // the global batch the epoch's batches were cut for (0: none yet)
    int64_t epoch;       // the epoch `order` holds, -1 none
    int64_t nbatches;    // batches an epoch
    int64_t *order;      // [nbatches] this epoch's batches: bucket << 32 | its batch number
} buckets;

// The bucket holding sample idx.
static int bucket_of(const buckets *b, int64_t idx) {
    int lo = 0, hi = b->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->first[mid] <= idx) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The batches of an epoch for global batches of `batch` (each bucket's whole
// ones), counted once a batch size.
static int count_batches(buckets *b, int batch) {
    if (b->batch == batch) return 0;
    int64_t most = 0;
    b->nbatches = 0;
    for (int k = 0; k < b->n; k++) {
        b->nbatches += b->sub[k].n / batch;
        if (b->sub[k].n > most) most = b->sub[k].n;
    }
    if (b->nbatches == 0)
        return dc_fail("%s: no bucket fills a global batch of %d samples (the largest holds %lld)", b->sub[0].name,
                       batch, (long long)most);
    free(b->order);
    if (!(b->order = malloc((size_t)b->nbatches * sizeof *b->order))) return dc_fail("out of memory");
    b->batch = batch, b->epoch = -1;
    return 0;
}

// Epoch e's batches in their order, drawn from (seed, e).
static void order_epoch(buckets *b, int64_t e) {
    if (b->epoch == e) return;
    int64_t j = 0;
    for (int k = 0; k < b->n; k++)
        for (int64_t q = 0; q < b->sub[k].n / b->batch; q++) b->order[j++] = (int64_t)k << 32 | q;
    for (int64_t i = b->nbatches - 1; i > 0; i--) {
        int64_t r = (int64_t)dc_stream_uniform_below(b->seed, (uint64_t)i, (uint32_t)e, TAG_BATCHES, (uint64_t)i + 1);
        int64_t t = b->order[i];
        b->order[i] = b->order[r], b->order[r] = t;
    }
    b->epoch = e;
}

static int bk_index(dc_source *s, int64_t g, int batch, int64_t *idx) {
    buckets *b = s->impl;
    DC_TRY(count_batches(b, batch));
    const int64_t epoch_len = b->nbatches * batch, e = g / epoch_len, p = g % epoch_len;
    order_epoch(b, e);
    const int k = (int)(b->order[p / batch] >> 32);
    const int64_t q = b->order[p / batch] & 0xffffffff;
    dc_source *sub = &b->sub[k];
    // the bucket's own elastic order, in which its epoch e runs over its whole batches
    const int64_t sub_len = sub->n / batch * batch;
    int64_t local;
    DC_TRY(sub->ops->index(sub, e * sub_len + q * batch + p % batch, batch, &local));
    *idx = b->first[k] + local;
    return 0;
}

static int bk_x0(dc_source *s, int64_t idx, bool flip, uint64_t seed, uint32_t key, uint32_t step, float *dst) {
    buckets *b = s->impl;
    const int k = bucket_of(b, idx);
    return b->sub[k].ops->x0(&b->sub[k], idx - b->first[k], flip, seed, key, step, dst);
}

static int bk_cond(dc_source *s, int64_t idx, bool drop, int32_t *label, float *ctx, int32_t *len) {
    buckets *b = s->impl;
    const int k = bucket_of(b, idx);
    return b->sub[k].ops->cond(&b->sub[k], idx - b->first[k], drop, label, ctx, len);
}

static int bk_ids(dc_source *s, int64_t idx, bool drop, int32_t *ids, int32_t *len) {
    buckets *b = s->impl;
    const int k = bucket_of(b, idx);
    return b->sub[k].ops->ids(&b->sub[k], idx - b->first[k], drop, ids, len);
}

static void bk_size(dc_source *s, int64_t idx, int *height, int *width) {
    buckets *b = s->impl;
    const dc_source *sub = &b->sub[bucket_of(b, idx)];
    *height = sub->height, *width = sub->width;
}

static void bk_close(dc_source *s) {
    buckets *b = s->impl;
    for (int k = 0; k < b->n; k++) dc_source_close(&b->sub[k]);
    free(b->sub), free(b->first), free(b->order), free(b);
}

static const dc_source_ops k_buckets = {.index = bk_index, .x0 = bk_x0, .cond = bk_cond, .ids = bk_ids,
                                        .size = bk_size, .close = bk_close};

int dc_source_buckets(dc_source *s, const dc_shards_opts *o, const char *const *dirs, int n) {
    memset(s, 0, sizeof *s);
    if (n < 1) return dc_fail("a bucketed data set without buckets");
    buckets *m = calloc(1, sizeof *m);
    if (!m) return dc_fail("out of memory");
    *s = (dc_source){.ops = &k_buckets, .impl = m};
    m->seed = o->seed, m->n = n, m->epoch = -1;
    m->sub = calloc((size_t)n, sizeof *m->sub);
    m->first = calloc((size_t)n + 1, sizeof *m->first);
    int rc = m->sub && m->first ? 0 : dc_fail("out of memory");
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0);
    int64_t area = 0;
    for (int k = 0; k < n && !rc; k++) {
        dc_shards_opts ok = *o;
        ok.dir = dirs[k];
        // each bucket's order its own: the run's seed mixed with its index
        const dc_u32x4 r = dc_philox((uint32_t)k, 0, 0, 0x424B5430u, o->seed);
        ok.seed = (uint64_t)r.v[0] << 32 | r.v[1];
        dc_source *sub = &m->sub[k];
        if ((rc = dc_source_shards(sub, &ok))) {
            m->n = k;  // those opened are closed
            break;
        }
        const dc_source *a = &m->sub[0];
        if (sub->channels != a->channels || sub->cond != a->cond || sub->text_len != a->text_len ||
            sub->text_dim != a->text_dim || sub->flips != a->flips) {
            rc = dc_fail("%s and %s hold samples of different kinds (channels, text): not buckets of one data set",
                         a->name, sub->name);
            m->n = k + 1;
            break;
        }
        m->first[k + 1] = m->first[k] + sub->n;
        dc_xxh64_update_u64(&h, sub->fingerprint);
        if ((int64_t)sub->height * sub->width > area) {  // the largest bucket sizes the buffers
            area = (int64_t)sub->height * sub->width;
            s->height = sub->height, s->width = sub->width;
        }
    }
    if (rc) {
        bk_close(s);
        memset(s, 0, sizeof *s);
        return -1;
    }
    const dc_source *a = &m->sub[0];
    s->n = m->first[n], s->channels = a->channels, s->flips = a->flips, s->cond = a->cond;
    s->text_len = a->text_len, s->text_dim = a->text_dim, s->name = a->name;
    s->fingerprint = dc_xxh64_digest(&h);
    return 0;
}
