// The streaming data source and its elastic order (see stream.h).
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "train/stream.h"

// Philox's last counter word for this order's draws: apart from the counters
// the other shuffles and noises of a run use (small stream numbers).
#define TAG_SHARDS 0x4D445331u  // "MDS1"
#define TAG_BLOCK 0x4D445332u   // "MDS2"

// 64 random bits times bound, keeping the high word (Lemire), with the
// rejection that removes the bias.
uint64_t dc_stream_uniform_below(uint64_t seed, uint64_t i, uint32_t a, uint32_t tag, uint64_t bound) {
    for (uint32_t attempt = 0;; attempt++) {
        dc_u32x4 r = dc_philox((uint32_t)i, (uint32_t)(i >> 32) ^ (attempt << 16), a, tag, seed);
        uint64_t x = (uint64_t)r.v[0] << 32 | r.v[1];
        unsigned __int128 m = (unsigned __int128)x * bound;
        if ((uint64_t)m >= (0 - bound) % bound) return (uint64_t)(m >> 64);
    }
}

int dc_stream_order_init(dc_stream_order *o, const int64_t *counts, int nshards, uint64_t seed, int64_t block) {
    memset(o, 0, sizeof *o);
    o->epoch = o->perm_block = o->perm_epoch = -1;
    if (nshards < 1 || block < 1 || block > (1 << 30))
        return dc_fail("data order: %d shards, block of %lld samples", nshards, (long long)block);
    o->first = malloc(((size_t)nshards + 1) * sizeof *o->first);
    o->vstart = malloc(((size_t)nshards + 1) * sizeof *o->vstart);
    o->visit = malloc((size_t)nshards * sizeof *o->visit);
    if (!o->first || !o->vstart || !o->visit) return dc_stream_order_free(o), dc_fail("out of memory");
    o->first[0] = 0;
    for (int k = 0; k < nshards; k++) {
        if (counts[k] < 0 || counts[k] > (1ll << 40) - o->first[k])
            return dc_stream_order_free(o), dc_fail("data order: shard %d has %lld samples", k, (long long)counts[k]);
        o->first[k + 1] = o->first[k] + counts[k];
    }
    o->nshards = nshards;
    o->n = o->first[nshards];
    if (o->n < 1) return dc_stream_order_free(o), dc_fail("data order: no samples");
    o->seed = seed;
    o->block = block < o->n ? block : o->n;
    if (!(o->perm = malloc((size_t)o->block * sizeof *o->perm))) return dc_stream_order_free(o), dc_fail("out of memory");
    return 0;
}

void dc_stream_order_free(dc_stream_order *o) {
    free(o->first);
    free(o->vstart);
    free(o->visit);
    free(o->perm);
    memset(o, 0, sizeof *o);
}

// Step 1: this epoch's shard order (Fisher-Yates) and where each visited
// shard starts in the epoch's sequence.
static void order_shards(dc_stream_order *o, int64_t epoch) {
    for (int k = 0; k < o->nshards; k++) o->visit[k] = k;
    for (int k = o->nshards - 1; k > 0; k--) {
        int j = (int)dc_stream_uniform_below(o->seed, (uint64_t)k, (uint32_t)epoch, TAG_SHARDS, (uint64_t)k + 1);
        int t = o->visit[k];
        o->visit[k] = o->visit[j], o->visit[j] = t;
    }
    o->vstart[0] = 0;
    for (int k = 0; k < o->nshards; k++)
        o->vstart[k + 1] = o->vstart[k] + o->first[o->visit[k] + 1] - o->first[o->visit[k]];
    o->epoch = epoch;
}

// Step 2: block b's shuffle, its draws keyed by (epoch, block) through the
// draw index's high bits, so that no two blocks share a stream.
static void order_block(dc_stream_order *o, int64_t epoch, int64_t b) {
    int64_t base = b * o->block, len = o->n - base < o->block ? o->n - base : o->block;
    for (int64_t i = 0; i < len; i++) o->perm[i] = (uint32_t)i;
    for (int64_t i = len - 1; i > 0; i--) {
        uint64_t j = dc_stream_uniform_below(o->seed, (uint64_t)b << 32 | (uint64_t)i, (uint32_t)epoch, TAG_BLOCK, (uint64_t)i + 1);
        uint32_t t = o->perm[i];
        o->perm[i] = o->perm[j], o->perm[j] = t;
    }
    o->perm_block = b;
    o->perm_epoch = epoch;
}

int64_t dc_stream_order_at(dc_stream_order *o, int64_t epoch, int64_t pos) {
    if (pos < 0 || pos >= o->n) return -1;
    if (o->epoch != epoch) order_shards(o, epoch);
    int64_t b = pos / o->block;
    if (o->perm_block != b || o->perm_epoch != epoch) order_block(o, epoch, b);
    int64_t v = b * o->block + o->perm[pos - b * o->block];
    // the visited shard holding v: the last whose start is <= v (never an
    // empty one, whose start is the next shard's)
    int lo = 0, hi = o->nshards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (o->vstart[mid] <= v) lo = mid;
        else hi = mid - 1;
    }
    return o->first[o->visit[lo]] + (v - o->vstart[lo]);
}

int dc_stream_order_batch(dc_stream_order *o, int64_t epoch, int64_t pos, int64_t global, int rank, int ranks,
                          int64_t *out) {
    if (ranks < 1 || rank < 0 || rank >= ranks || global < 1 || global % ranks)
        return dc_fail("data order: a global batch of %lld does not split over %d ranks", (long long)global, ranks);
    if (pos < 0 || pos > o->n - global)
        return dc_fail("data order: a batch of %lld at position %lld of an epoch of %lld samples", (long long)global,
                       (long long)pos, (long long)o->n);
    int64_t per = global / ranks, at = pos + rank * per;
    for (int64_t i = 0; i < per; i++) out[i] = dc_stream_order_at(o, epoch, at + i);
    return 0;
}

// ---- the data source

int dc_stream_open(dc_stream *s, const char *dir, const char *const *columns, int ncols, uint64_t seed,
                   int64_t block) {
    memset(s, 0, sizeof *s);
    DC_TRY(dc_mds_open(&s->mds, dir));
    int nsh = dc_mds_shards(s->mds);
    int64_t *counts = malloc((size_t)nsh * sizeof *counts);
    s->col = malloc((size_t)(ncols > 0 ? ncols : 1) * sizeof *s->col);
    int rc = counts && s->col ? 0 : dc_fail("out of memory");
    for (int k = 0; k < nsh && rc == 0; k++) counts[k] = dc_mds_shard(s->mds, k).samples;
    if (rc == 0) rc = dc_stream_order_init(&s->order, counts, nsh, seed, block);
    free(counts);
    for (int i = 0; i < ncols && rc == 0; i++) rc = (s->col[i] = dc_mds_find(s->mds, columns[i])) < 0 ? -1 : 0;
    s->ncols = ncols;
    if (rc) dc_stream_close(s);
    return rc;
}

void dc_stream_close(dc_stream *s) {
    dc_mds_close(s->mds);
    dc_stream_order_free(&s->order);
    dc_mds_sample_free(&s->sample);
    free(s->col);
    memset(s, 0, sizeof *s);
}

int dc_stream_seek(dc_stream *s, int64_t epoch, int64_t pos) {
    if (epoch < 0 || epoch > UINT32_MAX || pos < 0 || pos > s->order.n)
        return dc_fail("data position: epoch %lld, sample %lld of %lld", (long long)epoch, (long long)pos,
                       (long long)s->order.n);
    s->epoch = epoch;
    s->pos = pos;
    return 0;
}

int dc_stream_next(dc_stream *s, int64_t global, int rank, int ranks, int64_t *samples) {
    if (global > s->order.n)
        return dc_fail("a global batch of %lld is larger than the data set (%lld samples)", (long long)global,
                       (long long)s->order.n);
    if (s->pos + global > s->order.n) s->epoch++, s->pos = 0;
    DC_TRY(dc_stream_order_batch(&s->order, s->epoch, s->pos, global, rank, ranks, samples));
    s->pos += global;
    return 0;
}

int dc_stream_read(dc_stream *s, int64_t i) { return dc_mds_read(s->mds, i, &s->sample); }

int dc_stream_column(const dc_stream *s, int k, dc_mds_array *out) {
    if (k < 0 || k >= s->ncols || !s->sample.ncols) return dc_fail("stream: no column %d of a sample read", k);
    int c = s->col[k];
    return dc_mds_decode(dc_mds_column_at(s->mds, c), s->sample.data[c], s->sample.len[c], out);
}

int dc_stream_f32(const dc_stream *s, int k, float *dst, int64_t count) {
    dc_mds_array a;
    DC_TRY(dc_stream_column(s, k, &a));
    if (a.count != count)
        return dc_fail("column \"%s\" holds %lld values, %lld expected", dc_mds_column_at(s->mds, s->col[k])->name,
                       (long long)a.count, (long long)count);
    dc_mds_to_f32(&a, dst);
    return 0;
}
