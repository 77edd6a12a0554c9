// The thread communicator (dist/comm.h): every collective on 1 to 7 ranks
// against the sums and copies written out here (exact: the sums run in rank
// order; a reduce-scatter that continues a running total starts from it),
// out of place and in place (as ZeRO runs them), the same result on
// every rank, a failing rank stopping the others with its message instead of
// a hang, and the sharding and batch-split arithmetic. Sums in bf16: the
// ranks' bf16 values added in fp32 in rank order and rounded once (round to
// nearest even), exactly, on 2 and 3 ranks, out of place and in place, with
// a check that rounding after every addition instead would be caught. The
// rounds of micro-batches that ranks accumulate over.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/error.h"
#include "dist/comm.h"

static float value(int rank, int64_t j) { return (float)((rank * 7919 + j * 104729) % 1999) / 997.0f - 1.0f; }

typedef struct {
    int64_t n;
    int bad[64];  // per rank: wrong elements seen
    int grouped[64];  // per rank: reduce_scatter_add's results that total + (the parts' sum) would miss
} job;

static int collectives(dc_comm *c, void *arg) {
    job *jb = arg;
    const int64_t n = jb->n;
    int bad = 0;
    // all_reduce_sum: ((x0 + x1) + x2) ... in rank order
    float *buf = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t j = 0; j < n; j++) buf[j] = value(c->rank, j);
    DC_TRY(dc_comm_all_reduce_sum(c, buf, n));
    for (int64_t j = 0; j < n; j++) {
        float want = value(0, j);
        for (int q = 1; q < c->size; q++) want += value(q, j);
        bad += buf[j] != want;
    }
    // reduce_scatter_sum: rank r gets the sum of slice r
    float *in = malloc(sizeof(float) * (size_t)(n * c->size + 1)), *out = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t j = 0; j < n * c->size; j++) in[j] = value(c->rank + 3, j);
    DC_TRY(dc_comm_reduce_scatter_sum(c, out, in, n));
    for (int64_t j = 0; j < n; j++) {
        float want = value(3, (int64_t)c->rank * n + j);
        for (int q = 1; q < c->size; q++) want += value(q + 3, (int64_t)c->rank * n + j);
        bad += out[j] != want;
    }
    // reduce_scatter_add: this rank's running total first, then slice `rank`
    // of every rank's buffer in rank order (totals larger than the parts, so
    // that another grouping rounds differently)
    for (int64_t j = 0; j < n; j++) out[j] = 64.0f * value(c->rank + 7, j);
    for (int64_t j = 0; j < n * c->size; j++) in[j] = value(c->rank + 4, j);
    DC_TRY(dc_comm_reduce_scatter_add(c, out, in, n));
    for (int64_t j = 0; j < n; j++) {
        float want = 64.0f * value(c->rank + 7, j), part = 0;
        for (int q = 0; q < c->size; q++) want += value(q + 4, (int64_t)c->rank * n + j);
        for (int q = 0; q < c->size; q++) part += value(q + 4, (int64_t)c->rank * n + j);
        bad += out[j] != want;
        jb->grouped[c->rank] += out[j] != 64.0f * value(c->rank + 7, j) + part;
    }
    // all_gather and broadcast
    int mine[3] = {c->rank, c->rank * 10, -c->rank}, all[64 * 3];
    DC_TRY(dc_comm_all_gather(c, all, mine, sizeof mine));
    for (int q = 0; q < c->size; q++) bad += all[3 * q] != q || all[3 * q + 1] != 10 * q || all[3 * q + 2] != -q;
    char msg[32];
    snprintf(msg, sizeof msg, "from rank %d", c->rank);
    const int root = c->size - 1;
    DC_TRY(dc_comm_broadcast(c, msg, sizeof msg, root));
    char want[32];
    snprintf(want, sizeof want, "from rank %d", root);
    bad += strcmp(msg, want) != 0;
    // in place, as ZeRO uses them: reduce_scatter's out is in + rank * n,
    // all_gather's in is out + rank * bytes
    for (int64_t j = 0; j < n * c->size; j++) in[j] = value(c->rank + 5, j);
    float *slice = in + (int64_t)c->rank * n;
    DC_TRY(dc_comm_reduce_scatter_sum(c, slice, in, n));
    for (int64_t j = 0; j < n; j++) {
        float want = value(5, (int64_t)c->rank * n + j);
        for (int q = 1; q < c->size; q++) want += value(q + 5, (int64_t)c->rank * n + j);
        bad += slice[j] != want;
    }
    for (int64_t j = 0; j < n; j++) slice[j] = value(c->rank + 9, j);
    DC_TRY(dc_comm_all_gather(c, in, slice, sizeof(float) * (size_t)n));
    for (int q = 0; q < c->size; q++)
        for (int64_t j = 0; j < n; j++) bad += in[(int64_t)q * n + j] != value(q + 9, j);
    DC_TRY(dc_comm_barrier(c));
    jb->bad[c->rank] = bad;
    free(buf), free(in), free(out);
    return 0;
}

// ---- bf16 sums ------------------------------------------------------------------------
// Rank q's bf16 element j: values of every size and sign, so that sums carry
// into new exponents and lose low bits.
static uint16_t value16(int rank, int64_t j) {
    float scale = (float)(1 << ((rank * 3 + j) % 11));
    return dc_f32_to_bf16(value(rank, j) * scale);
}

// The reference: element j of every rank summed in fp32, rank order, then
// rounded once; *hop: rounded to bf16 after every addition (as a ring does).
static uint16_t want16(int size, int off, int64_t j, uint16_t *hop) {
    float v = dc_bf16_to_f32(value16(off, j)), h = v;
    for (int q = 1; q < size; q++) {
        v += dc_bf16_to_f32(value16(q + off, j));
        h = dc_bf16_to_f32(dc_f32_to_bf16(h + dc_bf16_to_f32(value16(q + off, j))));
    }
    *hop = dc_f32_to_bf16(h);
    return dc_f32_to_bf16(v);
}

typedef struct {
    int64_t n;
    int bad[64];      // per rank: wrong elements seen
    int64_t hop_differs;  // rank 0: elements where rounding every addition gives another result
} job16;

static int collectives_bf16(dc_comm *c, void *arg) {
    job16 *jb = arg;
    const int64_t n = jb->n;
    int bad = 0;
    int64_t differs = 0;
    uint16_t hop;
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)(n + 1));
    for (int64_t j = 0; j < n; j++) buf[j] = value16(c->rank, j);
    DC_TRY(dc_comm_all_reduce_sum_typed(c, buf, n, DC_BF16));
    for (int64_t j = 0; j < n; j++) {
        bad += buf[j] != want16(c->size, 0, j, &hop);
        differs += hop != buf[j];
    }
    // reduce-scatter out of place, then in place (ZeRO's buckets)
    uint16_t *in = malloc(sizeof(uint16_t) * (size_t)(n * c->size + 1)), *out = malloc(sizeof(uint16_t) * (size_t)(n + 1));
    for (int64_t j = 0; j < n * c->size; j++) in[j] = value16(c->rank + 3, j);
    DC_TRY(dc_comm_reduce_scatter_sum_typed(c, out, in, n, DC_BF16));
    for (int64_t j = 0; j < n; j++) bad += out[j] != want16(c->size, 3, (int64_t)c->rank * n + j, &hop);
    for (int64_t j = 0; j < n * c->size; j++) in[j] = value16(c->rank + 5, j);
    uint16_t *slice = in + (int64_t)c->rank * n;
    DC_TRY(dc_comm_reduce_scatter_sum_typed(c, slice, in, n, DC_BF16));
    for (int64_t j = 0; j < n; j++) bad += slice[j] != want16(c->size, 5, (int64_t)c->rank * n + j, &hop);
    // a type the sums do not take is refused on every rank alike
    int32_t ints[2] = {1, 2};
    bad += dc_comm_all_reduce_sum_typed(c, ints, 2, DC_I32) == 0 || !strstr(dc_error(), "I32");
    jb->bad[c->rank] = bad;
    if (c->rank == 0) jb->hop_differs = differs;
    free(buf), free(in), free(out);
    return 0;
}

static void test_bf16_sums(void) {
    const int64_t ns[] = {1, 7, 999, 1001};
    for (int size = 2; size <= 3; size++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
            job16 jb = {ns[b], {0}, 0};
            int rc = dc_comm_threads_run(size, collectives_bf16, &jb);
            int bad = 0;
            for (int r = 0; r < size; r++) bad += jb.bad[r];
            CHECK(rc == 0 && bad == 0, "bf16, %d ranks, n %lld: rc %d (%s), %d wrong values", size, (long long)ns[b],
                  rc, rc ? dc_error() : "", bad);
            // the reference can tell one rounding from one per addition
            if (size == 3 && ns[b] == 1001)
                CHECK(jb.hop_differs > 0, "bf16, 3 ranks: no element where rounding each addition differs (the "
                      "check could not tell)");
        }
}

// Rank 1 finds a NaN at step 3 and stops the job; the others are in a collective.
static int one_fails(dc_comm *c, void *arg) {
    (void)arg;
    float x[4] = {1, 2, 3, 4};
    for (int step = 0; step < 10; step++) {
        if (c->rank == 1 && step == 3) {
            dc_comm_abort(c, "the loss is NaN at step 3");
            return dc_fail("the loss is NaN at step 3");
        }
        DC_TRY(dc_comm_all_reduce_sum(c, x, 4));
    }
    return 0;
}

// Rank 2 returns an error without aborting: the others must not wait for it.
static int one_returns(dc_comm *c, void *arg) {
    (void)arg;
    if (c->rank == 2) return dc_fail("cannot open shard 2 of the data set");
    return dc_comm_barrier(c);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL test_comm: a collective hung (30 s)\n";
    if (write(1, m, sizeof m - 1)) {}
    _exit(1);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(30);
    const int sizes[] = {1, 2, 3, 4, 7};
    const int64_t ns[] = {0, 1, 5, 1000, 1001};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
            job jb = {ns[b], {0}, {0}};
            int rc = dc_comm_threads_run(sizes[a], collectives, &jb);
            int bad = 0, grouped = 0;
            for (int r = 0; r < sizes[a]; r++) bad += jb.bad[r], grouped += jb.grouped[r];
            CHECK(rc == 0 && bad == 0, "%d ranks, n %lld: rc %d (%s), %d wrong values", sizes[a], (long long)ns[b],
                  rc, rc ? dc_error() : "", bad);
            // the check of reduce_scatter_add's order can fail: adding the parts' sum to the total differs
            if (sizes[a] >= 3 && ns[b] == 1000)
                CHECK(grouped > 0, "%d ranks: the running total plus the parts' sum never differs from "
                      "the total grown part by part (the check could not tell)", sizes[a]);
        }
    test_bf16_sums();
    int rc = dc_comm_threads_run(3, one_fails, NULL);
    CHECK(rc != 0 && strstr(dc_error(), "rank 1 of 3 failed: the loss is NaN at step 3"),
          "an aborting rank stops every rank with its message: %s", dc_error());
    rc = dc_comm_threads_run(4, one_returns, NULL);
    CHECK(rc != 0 && strstr(dc_error(), "rank 2 of 4 failed: cannot open shard 2"),
          "a rank that returns an error releases the others: %s", dc_error());
    CHECK(dc_comm_threads_run(0, collectives, NULL) != 0, "0 ranks refused");

    // shards cover [0, n) in rank order without overlap, aligned, equal but the last
    int bad = 0;
    for (int64_t n = 0; n < 300; n += 7)
        for (int size = 1; size <= 8; size++)
            for (int64_t align = 1; align <= 64; align *= 4) {
                int64_t next = 0;
                for (int r = 0; r < size; r++) {
                    dc_shard s = dc_shard_of(n, size, r, align);
                    bad += s.count < 0 || (s.count && s.begin != next) || (n && s.per % align) ||
                           (s.count && s.begin % align) || s.count > s.per;
                    next += s.count;
                }
                bad += next != n || (n && dc_shard_of(n, size, 0, align).per * size < n);
            }
    CHECK(bad == 0, "%d shard layouts wrong", bad);
    // the batch split: the global batch in order, counts within one of each other
    bad = 0;
    for (int batch = 0; batch < 70; batch++)
        for (int size = 1; size <= 9; size++) {
            int next = 0, lo = batch, hi = 0;
            for (int r = 0; r < size; r++) {
                int b, n;
                dc_batch_split(batch, size, r, &b, &n);
                bad += b != next;
                next += n, lo = n < lo ? n : lo, hi = n > hi ? n : hi;
            }
            bad += next != batch || hi - lo > 1;
        }
    CHECK(bad == 0, "%d batch splits wrong", bad);
    // rounds of micro-batches: the global batch in order, at most micro
    // images each, every rank micro of them in each round but a shorter last
    // one (split within one of each other); one rank's micro-batches are
    // the batch cut every micro images, and a batch that is a multiple of
    // size x micro gives size ranks those same micro-batches
    bad = 0;
    for (int batch = 1; batch < 50; batch++)
        for (int size = 1; size <= 7; size++)
            for (int micro = 1; micro <= 12; micro++) {
                const int rounds = dc_batch_rounds(batch, size, micro);
                int next = 0;
                bad += rounds != (batch + size * micro - 1) / (size * micro);
                for (int j = 0; j < rounds; j++) {
                    int lo = micro, hi = 0;
                    for (int r = 0; r < size; r++) {
                        int b, n;
                        dc_batch_round(batch, size, micro, r, j, &b, &n);
                        bad += b != next || n > micro || (j < rounds - 1 && n != micro);
                        bad += size == 1 && (b != j * micro || n != (batch - b < micro ? batch - b : micro));
                        bad += batch % (size * micro) == 0 && (b != (j * size + r) * micro || n != micro);
                        next += n, lo = n < lo ? n : lo, hi = n > hi ? n : hi;
                    }
                    bad += hi - lo > 1;
                }
                int b, n;
                dc_batch_round(batch, size, micro, 0, rounds, &b, &n);
                bad += next != batch || n != 0;
            }
    CHECK(bad == 0, "%d rounds of micro-batches wrong", bad);
    printf("test_comm: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
