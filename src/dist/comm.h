// Several ranks working on one job, and the collectives they use to share
// it. One rank per GPU through NCCL comes next; here N ranks run as threads
// of one process on the CPU backend, so every multi-rank code path (sharding,
// the data split, gradient reduction, checkpoint gather and scatter) runs in
// every test pass on a machine without GPUs.
//
// Every rank calls the same collectives in the same order with the same
// sizes. Buffers are the rank's own (host memory for the thread
// communicator, device memory for NCCL). Sums are deterministic: element j
// of a result is ((x_0 + x_1) + x_2) + ... in rank order, on every rank and
// in every run.
//
// Faults: a rank that cannot go on calls dc_comm_abort with why; every rank
// then fails its current or next collective with that message instead of
// waiting for it forever.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct dc_comm dc_comm;

typedef struct {
    // The sums take F32 or BF16 elements (dt); any other type fails.
    // buf[n] = the sum of every rank's buf[n], on every rank.
    int (*all_reduce_sum)(dc_comm *c, void *buf, int64_t n, dc_dtype dt);
    // out[n] = the sum over ranks of their in[rank * n .. (rank + 1) * n):
    // rank r receives the sum of slice r (ZeRO's gradient shards).
    int (*reduce_scatter_sum)(dc_comm *c, void *out, const void *in, int64_t n, dc_dtype dt);
    // out[size * bytes] = every rank's in[bytes], in rank order.
    int (*all_gather)(dc_comm *c, void *out, const void *in, size_t bytes);
    // buf = root's buf on every rank.
    int (*broadcast)(dc_comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(dc_comm *c);
    // Marks the job failed with `why` (the first abort's message wins).
    void (*abort)(dc_comm *c, const char *why);

    // ---- overlap: NULL where a collective is complete when it returns (the CPU) ----
    // async true: the collectives issued from now on run beside the backend's
    // later work instead of holding it up (each still starts after everything
    // the backend had queued when it was issued); false: each holds it up again.
    void (*set_async)(dc_comm *c, bool async);
    // How many collectives have been issued so far.
    int64_t (*issued)(dc_comm *c);
    // The backend's work queued from now on waits for the first n collectives.
    int (*wait)(dc_comm *c, int64_t n);

    // ---- a sum that continues one this rank holds: NULL where the sums do not
    // follow rank order (NCCL) ----
    // out[n] = ((out + in_0) + in_1) + ... over ranks in rank order, in_q being
    // slice `rank` of rank q's in[size * n]: out's own value comes first, so
    // a running total grows by each rank's part in turn, exactly as one rank
    // adding the parts one by one (F32; out does not overlap in).
    int (*reduce_scatter_add)(dc_comm *c, float *out, const float *in, int64_t n);
} dc_comm_ops;

struct dc_comm {
    int rank, size;
    bool device;  // buffers are GPU memory (NCCL); else host memory
    const dc_comm_ops *ops;
    void *ctx;  // the implementation's shared state
};

static inline int dc_comm_all_reduce_sum(dc_comm *c, float *buf, int64_t n) {
    return c->ops->all_reduce_sum(c, buf, n, DC_F32);
}
static inline int dc_comm_reduce_scatter_sum(dc_comm *c, float *out, const float *in, int64_t n) {
    return c->ops->reduce_scatter_sum(c, out, in, n, DC_F32);
}
// The same sums of elements of type dt (F32 or BF16: gradients sent in bf16).
static inline int dc_comm_all_reduce_sum_typed(dc_comm *c, void *buf, int64_t n, dc_dtype dt) {
    return c->ops->all_reduce_sum(c, buf, n, dt);
}
static inline int dc_comm_reduce_scatter_sum_typed(dc_comm *c, void *out, const void *in, int64_t n, dc_dtype dt) {
    return c->ops->reduce_scatter_sum(c, out, in, n, dt);
}
static inline int dc_comm_all_gather(dc_comm *c, void *out, const void *in, size_t bytes) {
    return c->ops->all_gather(c, out, in, bytes);
}
static inline int dc_comm_broadcast(dc_comm *c, void *buf, size_t bytes, int root) {
    return c->ops->broadcast(c, buf, bytes, root);
}
static inline int dc_comm_barrier(dc_comm *c) { return c->ops->barrier(c); }
// Whether the communicator continues sums in rank order (dc_comm_ops.reduce_scatter_add).
static inline bool dc_comm_continues_sums(const dc_comm *c) { return c->ops->reduce_scatter_add != NULL; }
static inline int dc_comm_reduce_scatter_add(dc_comm *c, float *out, const float *in, int64_t n) {
    return c->ops->reduce_scatter_add(c, out, in, n);
}
// Overlap where the communicator has it (see dc_comm_ops); elsewhere a
// collective is complete when it returns, so these do nothing.
static inline bool dc_comm_overlaps(const dc_comm *c) { return c->ops->wait != NULL; }
static inline void dc_comm_set_async(dc_comm *c, bool async) {
    if (c->ops->set_async) c->ops->set_async(c, async);
}
static inline int64_t dc_comm_issued(dc_comm *c) { return c->ops->issued ? c->ops->issued(c) : 0; }
static inline int dc_comm_wait(dc_comm *c, int64_t n) { return c->ops->wait ? c->ops->wait(c, n) : 0; }
static inline void dc_comm_abort(dc_comm *c, const char *why) { c->ops->abort(c, why); }

// 0 when the sums take elements of type dt (F32, BF16); else -1 saying so.
int dc_comm_sum_dtype_check(dc_dtype dt);

// Runs fn on `size` threads, rank 0..size-1, each with its communicator;
// returns 0, or -1 with the message of the first rank that failed (a failed
// rank's error, or "rank R failed: ..." when one aborted the others).
typedef int (*dc_rank_fn)(dc_comm *c, void *arg);
int dc_comm_threads_run(int size, dc_rank_fn fn, void *arg);

// ---- sharding -------------------------------------------------------------------------
// n elements split over `size` ranks in equal shards of `per` elements (a
// multiple of `align`, so shards start aligned), the last ones shorter or
// empty: rank r owns [r * per, min((r + 1) * per, n)). Reduce-scatter runs on
// the padded length size * per.
typedef struct {
    int64_t per;            // elements per shard (padded)
    int64_t begin, count;   // this rank's range within the n real elements
} dc_shard;
dc_shard dc_shard_of(int64_t n, int size, int rank, int64_t align);

// The global batch split over ranks: rank r takes `count` samples starting at
// `begin` of the global batch (the first batch % size ranks one more), so the
// union in rank order is the global batch in its order, whatever the size.
void dc_batch_split(int batch, int size, int rank, int *begin, int *count);
// The global batch in rounds of micro-batches (gradient accumulation over
// ranks): each round covers the next size x micro images, and rank r's
// micro-batch in it is its dc_batch_split share of them (every rank `micro`
// images, except in a last, shorter round, split evenly, where a rank may
// get none). The micro-batches in (round, rank) order are the global batch
// in its order: where the batch is a multiple of size x micro they are the
// micro-batches one rank cuts with the same micro, round j's rank r holding
// the (j x size + r)-th. Returns the number of rounds.
int dc_batch_rounds(int batch, int size, int micro);
void dc_batch_round(int batch, int size, int micro, int rank, int round, int *begin, int *count);
