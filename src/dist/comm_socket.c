// The socket communicator: collectives over the rendezvous connections.
// Rank 0 receives each rank's buffer in rank order and adds it into its
// own, element by element, which is the thread communicator's
// ((x_0 + x_1) + x_2) + ... ; then it sends the result to every rank. Sums
// in bf16 add into an fp32 copy and round once, at the end. A sum that
// continues a running total starts from the total's slice, sent first.
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm_net.h"

static dc_rendezvous *rv_of(dc_comm *c) { return c->ctx; }

// Rank 0's running sum (fp32) of the buffers arriving as dt.
typedef struct {
    float *acc;
    dc_dtype dt;
} sum_sink;

static void add_sink(void *ctx, const void *piece, size_t offset, size_t len) {
    const sum_sink *s = ctx;
    // pieces hold whole elements (64 KiB each, then the rest of the buffer)
    if (s->dt == DC_BF16) {
        float *dst = s->acc + offset / 2;
        const uint16_t *src = piece;
        for (size_t j = 0; j < len / 2; j++) dst[j] += dc_bf16_to_f32(src[j]);
    } else {
        float *dst = s->acc + offset / 4;
        const float *src = piece;
        for (size_t j = 0; j < len / 4; j++) dst[j] += src[j];
    }
}

// n elements of type dt as a new fp32 array (NULL when out of memory).
static float *widen(const void *src, int64_t n, dc_dtype dt) {
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!f) return NULL;
    if (dt == DC_F32) memcpy(f, src, sizeof(float) * (size_t)n);
    else
        for (int64_t j = 0; j < n; j++) f[j] = dc_bf16_to_f32(((const uint16_t *)src)[j]);
    return f;
}

static int out_of_memory(dc_comm *c, int64_t n) {
    dc_fail("out of memory for a sum of %lld elements over ranks", (long long)n);
    dc_comm_abort(c, dc_error());
    return -1;
}

static int all_reduce_sum(dc_comm *c, void *buf, int64_t n, dc_dtype dt) {
    DC_TRY(dc_comm_sum_dtype_check(dt));
    dc_rendezvous *rv = rv_of(c);
    size_t bytes = dc_dtype_size(dt) * (size_t)n;
    if (c->rank != 0) return dc_rv_send(rv, 0, buf, bytes) || dc_rv_recv(rv, 0, buf, bytes) ? -1 : 0;
    sum_sink s = {dt == DC_F32 ? buf : widen(buf, n, dt), dt};  // fp32 sums straight into buf
    if (!s.acc) return out_of_memory(c, n);
    int rc = 0;
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_recv_stream(rv, q, bytes, add_sink, &s);
    if (dt == DC_BF16) {
        for (int64_t j = 0; j < n; j++) ((uint16_t *)buf)[j] = dc_f32_to_bf16(s.acc[j]);
        free(s.acc);
    }
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_send(rv, q, buf, bytes);
    return rc;
}

static int reduce_scatter_sum(dc_comm *c, void *out, const void *in, int64_t n, dc_dtype dt) {
    DC_TRY(dc_comm_sum_dtype_check(dt));
    dc_rendezvous *rv = rv_of(c);
    const size_t es = dc_dtype_size(dt), slice = es * (size_t)n, all = slice * (size_t)c->size;
    if (c->rank != 0) return dc_rv_send(rv, 0, in, all) || dc_rv_recv(rv, 0, out, slice) ? -1 : 0;
    const int64_t total = n * c->size;
    sum_sink s = {widen(in, total, dt), dt};
    char *sum = dt == DC_F32 ? (char *)s.acc : malloc(all ? all : 1);  // what is sent: the sums as dt
    if (!s.acc || !sum) {
        free(s.acc);
        if (sum != (char *)s.acc) free(sum);
        return out_of_memory(c, total);
    }
    int rc = 0;
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_recv_stream(rv, q, all, add_sink, &s);
    if (dt == DC_BF16)
        for (int64_t j = 0; j < total; j++) ((uint16_t *)sum)[j] = dc_f32_to_bf16(s.acc[j]);
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_send(rv, q, sum + (size_t)q * slice, slice);
    if (!rc) memcpy(out, sum, slice);
    if (sum != (char *)s.acc) free(sum);
    free(s.acc);
    return rc;
}

// Every rank sends rank 0 its running total's slice, then its buffer; rank 0
// starts each slice's sum from that total and adds the buffers in rank order.
static int reduce_scatter_add(dc_comm *c, float *out, const float *in, int64_t n) {
    dc_rendezvous *rv = rv_of(c);
    const size_t slice = sizeof(float) * (size_t)n, all = slice * (size_t)c->size;
    if (c->rank != 0)
        return dc_rv_send(rv, 0, out, slice) || dc_rv_send(rv, 0, in, all) || dc_rv_recv(rv, 0, out, slice) ? -1 : 0;
    const int64_t total = n * c->size;
    sum_sink s = {malloc(all ? all : 1), DC_F32};
    if (!s.acc) return out_of_memory(c, total);
    memcpy(s.acc, out, slice);
    int rc = 0;
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_recv(rv, q, s.acc + (int64_t)q * n, slice);
    for (int64_t j = 0; j < total && !rc; j++) s.acc[j] += in[j];
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_recv_stream(rv, q, all, add_sink, &s);
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_send(rv, q, s.acc + (int64_t)q * n, slice);
    if (!rc) memcpy(out, s.acc, slice);
    free(s.acc);
    return rc;
}

static int all_gather(dc_comm *c, void *out, const void *in, size_t bytes) {
    return dc_rendezvous_all_gather(rv_of(c), in, out, bytes);
}

static int broadcast(dc_comm *c, void *buf, size_t bytes, int root) {
    dc_rendezvous *rv = rv_of(c);
    if (root < 0 || root >= c->size) return dc_fail("broadcast from rank %d of %d", root, c->size);
    if (root == 0) return dc_rendezvous_broadcast(rv, buf, bytes);
    // Through rank 0, the hub of the star.
    if (c->rank == root) return dc_rv_send(rv, 0, buf, bytes);
    if (c->rank != 0) return dc_rv_recv(rv, 0, buf, bytes);
    DC_TRY(dc_rv_recv(rv, root, buf, bytes));
    for (int q = 1; q < c->size; q++)
        if (q != root) DC_TRY(dc_rv_send(rv, q, buf, bytes));
    return 0;
}

static int barrier(dc_comm *c) {
    char none[1] = {0};
    return dc_rendezvous_all_gather(rv_of(c), none, none, 0);
}

static void comm_abort(dc_comm *c, const char *why) { dc_rendezvous_abort(rv_of(c), why); }

static const dc_comm_ops k_ops = {all_reduce_sum, reduce_scatter_sum, all_gather, broadcast, barrier, comm_abort,
                                  NULL, NULL, NULL, reduce_scatter_add};

int dc_comm_socket_create(dc_rendezvous *rv, dc_comm **out) {
    dc_comm *c = calloc(1, sizeof *c);
    if (!c) return dc_fail("out of memory");
    *c = (dc_comm){dc_rendezvous_rank(rv), dc_rendezvous_size(rv), false, &k_ops, rv};
    *out = c;
    return 0;
}

void dc_comm_socket_free(dc_comm *c) { free(c); }
