// The thread communicator: N ranks as threads of one process, sharing their
// buffers through published pointers. A collective is: publish, barrier,
// read the others' buffers, barrier (nobody reuses a buffer another is still
// reading), then write what this rank computed. Sums run in rank order.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm.h"

#define MAX_RANKS 64

typedef struct {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned gen;
    bool failed;
    char why[768];
    const void *ptr[MAX_RANKS];  // each rank's buffer of the current collective
} shared;

// Waits for every rank; -1 (message set) once the job has failed.
static int wait_all(dc_comm *c) {
    shared *sh = c->ctx;
    pthread_mutex_lock(&sh->mu);
    if (!sh->failed && ++sh->arrived == sh->size) {
        sh->arrived = 0, sh->gen++;
        pthread_cond_broadcast(&sh->cv);
    } else {
        unsigned gen = sh->gen;
        while (!sh->failed && gen == sh->gen) pthread_cond_wait(&sh->cv, &sh->mu);
    }
    int rc = sh->failed ? -1 : 0;
    char why[sizeof sh->why];
    if (rc) memcpy(why, sh->why, sizeof why);
    pthread_mutex_unlock(&sh->mu);
    return rc ? dc_fail("%s", why) : 0;
}

static void comm_abort(dc_comm *c, const char *why) {
    shared *sh = c->ctx;
    pthread_mutex_lock(&sh->mu);
    if (!sh->failed) {
        sh->failed = true;
        snprintf(sh->why, sizeof sh->why, "rank %d of %d failed: %s", c->rank, c->size, why);
    }
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

static int publish(dc_comm *c, const void *p) {
    ((shared *)c->ctx)->ptr[c->rank] = p;
    return wait_all(c);
}
static const void *peer(dc_comm *c, int q) { return ((shared *)c->ctx)->ptr[q]; }

int dc_comm_sum_dtype_check(dc_dtype dt) {
    if (dt == DC_F32 || dt == DC_BF16) return 0;
    return dc_fail("a sum over ranks of %s elements: the communicators sum F32 and BF16", dc_dtype_name(dt));
}

// Element j of a buffer of type dt (F32 or BF16), widened to fp32.
static float load(const void *p, dc_dtype dt, int64_t j) {
    return dt == DC_BF16 ? dc_bf16_to_f32(((const uint16_t *)p)[j]) : ((const float *)p)[j];
}
static void store(void *p, dc_dtype dt, int64_t j, float v) {
    if (dt == DC_BF16) ((uint16_t *)p)[j] = dc_f32_to_bf16(v);
    else ((float *)p)[j] = v;
}

// Element `at` of every rank's buffer summed in rank order, in fp32.
static float sum_at(dc_comm *c, dc_dtype dt, int64_t at) {
    float v = load(peer(c, 0), dt, at);
    for (int q = 1; q < c->size; q++) v += load(peer(c, q), dt, at);
    return v;
}

static int all_reduce_sum(dc_comm *c, void *buf, int64_t n, dc_dtype dt) {
    DC_TRY(dc_comm_sum_dtype_check(dt));
    DC_TRY(publish(c, buf));
    const size_t es = dc_dtype_size(dt);
    dc_shard s = dc_shard_of(n, c->size, c->rank, 1);  // this rank sums its slice for everyone
    void *sum = malloc(es * (size_t)(s.count ? s.count : 1));
    if (!sum) {
        comm_abort(c, "out of memory");
        return wait_all(c);
    }
    for (int64_t j = 0; j < s.count; j++) store(sum, dt, j, sum_at(c, dt, s.begin + j));  // one rounding
    int rc = wait_all(c);  // every slice is read before any is written
    for (int q = 0; q < c->size && rc == 0; q++)
        memcpy((char *)peer(c, q) + es * (size_t)s.begin, sum, es * (size_t)s.count);
    free(sum);
    return rc ? rc : wait_all(c);
}

// In place as NCCL allows: out may be in + rank * n. Each rank writes only
// its own slice of its own buffer, which only it reads, element by element
// before writing it.
static int reduce_scatter_sum(dc_comm *c, void *out, const void *in, int64_t n, dc_dtype dt) {
    DC_TRY(dc_comm_sum_dtype_check(dt));
    DC_TRY(publish(c, in));
    const int64_t at = (int64_t)c->rank * n;
    for (int64_t j = 0; j < n; j++) store(out, dt, j, sum_at(c, dt, at + j));
    return wait_all(c);
}

// Each rank continues its own slice's running total: out's value first,
// then every rank's part in rank order.
static int reduce_scatter_add(dc_comm *c, float *out, const float *in, int64_t n) {
    DC_TRY(publish(c, in));
    const int64_t at = (int64_t)c->rank * n;
    for (int64_t j = 0; j < n; j++) {
        float v = out[j];
        for (int q = 0; q < c->size; q++) v += ((const float *)peer(c, q))[at + j];
        out[j] = v;
    }
    return wait_all(c);
}

// In place as NCCL allows: in may be out + rank * bytes (this rank's slot,
// which nobody writes; the others write only their own buffers).
static int all_gather(dc_comm *c, void *out, const void *in, size_t bytes) {
    DC_TRY(publish(c, in));
    for (int q = 0; q < c->size; q++) {
        char *dst = (char *)out + (size_t)q * bytes;
        if (dst != peer(c, q)) memcpy(dst, peer(c, q), bytes);
    }
    return wait_all(c);
}

static int broadcast(dc_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) return dc_fail("broadcast from rank %d of %d", root, c->size);
    DC_TRY(publish(c, buf));
    if (c->rank != root) memcpy(buf, peer(c, root), bytes);
    return wait_all(c);
}

static int barrier(dc_comm *c) { return wait_all(c); }

static const dc_comm_ops k_ops = {all_reduce_sum, reduce_scatter_sum, all_gather, broadcast, barrier, comm_abort,
                                  NULL, NULL, NULL, reduce_scatter_add};

typedef struct {
    dc_comm comm;
    dc_rank_fn fn;
    void *arg;
    int rc;
} rank_job;

static void *rank_main(void *p) {
    rank_job *j = p;
    j->rc = j->fn(&j->comm, j->arg);
    if (j->rc) comm_abort(&j->comm, dc_error());  // nobody waits for this rank any more
    return NULL;
}

int dc_comm_threads_run(int size, dc_rank_fn fn, void *arg) {
    if (size < 1 || size > MAX_RANKS) return dc_fail("%d ranks: the thread communicator runs 1 to %d", size, MAX_RANKS);
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.size = size;
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    rank_job *jobs = calloc((size_t)size, sizeof *jobs);
    pthread_t *th = calloc((size_t)size, sizeof *th);
    int started = 0, rc = 0;
    if (!jobs || !th) rc = dc_fail("out of memory for %d ranks", size);
    for (int r = 0; r < size && !rc; r++, started++) {
        jobs[r] = (rank_job){{.rank = r, .size = size, .ops = &k_ops, .ctx = &sh}, fn, arg, 0};
        if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
            comm_abort(&jobs[r].comm, "could not start a thread");
            rc = dc_fail("could not start the thread of rank %d", r);
        }
    }
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    // The first abort names the root cause: a rank's own error, or its
    // explicit dc_comm_abort; the others failed because of it.
    if (!rc && sh.failed) rc = dc_fail("%s", sh.why);
    pthread_cond_destroy(&sh.cv);
    pthread_mutex_destroy(&sh.mu);
    free(jobs), free(th);
    return rc;
}

// ---- sharding -------------------------------------------------------------------------
dc_shard dc_shard_of(int64_t n, int size, int rank, int64_t align) {
    dc_shard s = {0, 0, 0};
    if (n <= 0 || size < 1 || rank < 0 || rank >= size) return s;
    if (align < 1) align = 1;
    int64_t per = (n + size - 1) / size;
    s.per = (per + align - 1) / align * align;
    int64_t b = (int64_t)rank * s.per, e = b + s.per;
    if (b > n) b = n;
    if (e > n) e = n;
    s.begin = b, s.count = e - b;
    return s;
}

void dc_batch_split(int batch, int size, int rank, int *begin, int *count) {
    if (batch < 0 || size < 1 || rank < 0 || rank >= size) {
        *begin = *count = 0;
        return;
    }
    const int q = batch / size, r = batch % size;
    *count = q + (rank < r);
    *begin = rank * q + (rank < r ? rank : r);
}

int dc_batch_rounds(int batch, int size, int micro) {
    if (batch < 1 || size < 1 || micro < 1) return 0;
    const int64_t per = (int64_t)size * micro;
    return (int)((batch + per - 1) / per);
}

void dc_batch_round(int batch, int size, int micro, int rank, int round, int *begin, int *count) {
    *begin = *count = 0;
    if (round < 0 || round >= dc_batch_rounds(batch, size, micro)) return;
    const int64_t per = (int64_t)size * micro, lo = round * per;
    dc_batch_split((int)(batch - lo < per ? batch - lo : per), size, rank, begin, count);
    *begin += (int)lo;
}
