// The socket communicator: collectives over the rendezvous connections.
// Rank 0 receives each rank's buffer in rank order and adds it into its
// own, element by element, which is the thread communicator's
// ((x_0 + x_1) + x_2) + ... ; then it sends the result to every rank.
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm_net.h"

static dc_rendezvous *rv_of(dc_comm *c) { return c->ctx; }

static void add_sink(void *ctx, const void *piece, size_t offset, size_t len) {
    float *dst = (float *)((char *)ctx + offset);
    const float *src = piece;  // pieces hold whole floats: their sizes are multiples of 4
    for (size_t j = 0; j < len / sizeof(float); j++) dst[j] += src[j];
}

static int all_reduce_sum(dc_comm *c, float *buf, int64_t n) {
    dc_rendezvous *rv = rv_of(c);
    size_t bytes = sizeof(float) * (size_t)n;
    if (c->rank != 0) return dc_rv_send(rv, 0, buf, bytes) || dc_rv_recv(rv, 0, buf, bytes) ? -1 : 0;
    for (int q = 1; q < c->size; q++) DC_TRY(dc_rv_recv_stream(rv, q, bytes, add_sink, buf));
    for (int q = 1; q < c->size; q++) DC_TRY(dc_rv_send(rv, q, buf, bytes));
    return 0;
}

static int reduce_scatter_sum(dc_comm *c, float *out, const float *in, int64_t n) {
    dc_rendezvous *rv = rv_of(c);
    size_t slice = sizeof(float) * (size_t)n, all = slice * (size_t)c->size;
    if (c->rank != 0) return dc_rv_send(rv, 0, in, all) || dc_rv_recv(rv, 0, out, slice) ? -1 : 0;
    float *sum = malloc(all ? all : 1);
    if (!sum) {
        dc_fail("out of memory for a reduce-scatter of %lld floats", (long long)n * c->size);
        dc_comm_abort(c, dc_error());
        return -1;
    }
    memcpy(sum, in, all);
    int rc = 0;
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_recv_stream(rv, q, all, add_sink, sum);
    for (int q = 1; q < c->size && !rc; q++) rc = dc_rv_send(rv, q, sum + (size_t)q * n, slice);
    if (!rc) memcpy(out, sum, slice);
    free(sum);
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
                                  NULL, NULL, NULL};

int dc_comm_socket_create(dc_rendezvous *rv, dc_comm **out) {
    dc_comm *c = calloc(1, sizeof *c);
    if (!c) return dc_fail("out of memory");
    *c = (dc_comm){dc_rendezvous_rank(rv), dc_rendezvous_size(rv), false, &k_ops, rv};
    *out = c;
    return 0;
}

void dc_comm_socket_free(dc_comm *c) { free(c); }
