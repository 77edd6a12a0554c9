// The NCCL communicator: one rank per GPU, collectives on device buffers
// ordered with the CUDA backend's stream. libnccl.so.2 is opened at run time
// (dlopen), so the program starts, and one GPU trains, without NCCL.
//
// Collectives run on a stream of their own, each after the backend's work
// queued before it; the backend's stream waits for each (in order, as if it
// ran them) unless dc_comm_set_async lets them overlap its later work.
//
// No rank may hang: NCCL waits for ever on a peer that died. A watchdog
// thread watches the rendezvous connections (a dead or failed peer), NCCL's
// asynchronous errors, and the age of the oldest unfinished collective (an
// event recorded after each); on any of these it aborts the NCCL
// communicator (the kernels waiting on it return) and records why, which the
// next collective, and dc_comm_nccl_free, report.
//
// Sums follow NCCL's algorithm (ring or tree), not rank order: bit-identical
// from run to run on the same machine, equal to the CPU's to float rounding.
// Sums in bf16 (ncclBfloat16, NCCL 2.10 or newer) round to bf16 after every
// hop of the ring, not once as the CPU communicators do: N ranks add N - 1
// roundings of relative size 2^-9 to each element.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "dist/comm_net.h"

typedef struct {
    void *lib;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                   cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
} nccl_api;

static nccl_api g_nccl;

static int load_nccl(void) {
    if (g_nccl.lib) return 0;
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef DC_NCCL_DIR
    if (!lib) lib = dlopen(DC_NCCL_DIR "/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#endif
    if (!lib)
        return dc_fail("several GPUs need NCCL, and libnccl.so.2 could not be loaded (%s): install NCCL "
                       "(Debian/Ubuntu: libnccl2) or add its folder to LD_LIBRARY_PATH", dlerror());
    nccl_api a = {.lib = lib};
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&a.get_unique_id, "ncclGetUniqueId"},     {(void **)&a.comm_init_rank, "ncclCommInitRank"},
        {(void **)&a.comm_abort, "ncclCommAbort"},          {(void **)&a.comm_destroy, "ncclCommDestroy"},
        {(void **)&a.get_async_error, "ncclCommGetAsyncError"}, {(void **)&a.error_string, "ncclGetErrorString"},
        {(void **)&a.all_reduce, "ncclAllReduce"},          {(void **)&a.reduce_scatter, "ncclReduceScatter"},
        {(void **)&a.all_gather, "ncclAllGather"},          {(void **)&a.broadcast, "ncclBroadcast"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        *syms[i].fn = dlsym(lib, syms[i].name);
        if (!*syms[i].fn) {
            dlclose(lib);
            return dc_fail("libnccl.so.2 lacks %s: NCCL 2.7 or newer is needed", syms[i].name);
        }
    }
    g_nccl = a;
    return 0;
}

int dc_comm_nccl_gpu_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return dc_fail("no GPU is visible (%s)", cudaGetErrorString(e));
    if (e != cudaSuccess) return dc_fail("counting GPUs: %s", cudaGetErrorString(e));
    return n;
}

int dc_comm_nccl_select_device(int local_rank) {
    int n = dc_comm_nccl_gpu_count();
    if (n < 0) return -1;
    if (local_rank >= n)
        return dc_fail("local rank %d needs GPU %d, but this host has %d GPU%s: start at most %d ranks per host",
                       local_rank, local_rank, n, n == 1 ? "" : "s", n);
    cudaError_t e = cudaSetDevice(local_rank);
    return e == cudaSuccess ? 0 : dc_fail("selecting GPU %d: %s", local_rank, cudaGetErrorString(e));
}

#define FIN_RING 64

typedef struct {
    dc_rendezvous *rv;
    ncclComm_t nc;
    cudaStream_t main;      // the backend's queue
    cudaStream_t stream;    // the collectives' own queue, so they can run beside the backend's work
    cudaEvent_t ready;      // recorded on main before each collective: it starts after that work
    cudaEvent_t fin[FIN_RING];  // collective k's end is fin[k % FIN_RING]
    int64_t issued;         // collectives issued
    bool async;             // dc_comm_set_async: main does not wait for each collective
    cudaEvent_t done;       // recorded after the newest collective
    double pending_since;   // when the oldest unfinished collective was enqueued (0: none)
    pthread_t watchdog;
    pthread_mutex_t mu;
    volatile int stop;
    bool aborted;
    char why[1024];
} nccl_ctx;

// Marks the job failed and aborts the NCCL communicator (once).
static void nccl_fail(nccl_ctx *x, const char *why) {
    pthread_mutex_lock(&x->mu);
    if (!x->aborted) {
        x->aborted = true;
        snprintf(x->why, sizeof x->why, "%s", why);
        g_nccl.comm_abort(x->nc);
    }
    pthread_mutex_unlock(&x->mu);
}

static void *watchdog(void *arg) {
    nccl_ctx *x = arg;
    const double limit = dc_rendezvous_timeout(x->rv);
    while (!x->stop) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&x->mu);
        bool aborted = x->aborted;
        double since = x->pending_since;
        pthread_mutex_unlock(&x->mu);
        if (aborted) break;
        char why[1024] = "";
        ncclResult_t ae = ncclSuccess;
        if (dc_rendezvous_check(x->rv)) {
            snprintf(why, sizeof why, "%s", dc_error());
        } else if (g_nccl.get_async_error(x->nc, &ae) == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) {
            snprintf(why, sizeof why, "NCCL: %s", g_nccl.error_string(ae));
            dc_rendezvous_abort(x->rv, why);
        } else if (since > 0) {
            if (cudaEventQuery(x->done) == cudaSuccess) {
                pthread_mutex_lock(&x->mu);
                x->pending_since = 0;
                pthread_mutex_unlock(&x->mu);
            } else if (dc_time_now() - since > limit) {
                snprintf(why, sizeof why, "a collective has not finished in %.0f s: a peer GPU or its network is "
                         "stuck", limit);
                dc_rendezvous_abort(x->rv, why);
            }
        }
        if (why[0]) nccl_fail(x, why);
    }
    return NULL;
}

static nccl_ctx *ctx_of(dc_comm *c) { return c->ctx; }

// Before a collective: its queue waits for the backend's work queued so far.
static cudaStream_t begin(nccl_ctx *x) {
    cudaEventRecord(x->ready, x->main);
    cudaStreamWaitEvent(x->stream, x->ready, 0);
    return x->stream;
}

// After enqueueing a collective: its status, and the clock the watchdog reads.
static int enqueued(dc_comm *c, ncclResult_t r, const char *what) {
    nccl_ctx *x = ctx_of(c);
    pthread_mutex_lock(&x->mu);
    bool aborted = x->aborted;
    char why[1024];
    memcpy(why, x->why, sizeof why);
    if (!aborted && r == ncclSuccess) {
        cudaEvent_t fin = x->fin[x->issued++ % FIN_RING];
        cudaEventRecord(fin, x->stream);
        if (!x->async) cudaStreamWaitEvent(x->main, fin, 0);  // in order, as if on main
        cudaEventRecord(x->done, x->stream);
        if (x->pending_since == 0) x->pending_since = dc_time_now();
    }
    pthread_mutex_unlock(&x->mu);
    if (aborted) return dc_fail("%s", why);
    if (r != ncclSuccess) {
        char msg[1024];
        snprintf(msg, sizeof msg, "NCCL %s: %s", what, g_nccl.error_string(r));
        dc_rendezvous_abort(x->rv, msg);
        nccl_fail(x, msg);
        return dc_fail("%s", msg);
    }
    return 0;
}

static int check_open(dc_comm *c) {
    nccl_ctx *x = ctx_of(c);
    pthread_mutex_lock(&x->mu);
    bool aborted = x->aborted;
    char why[1024];
    memcpy(why, x->why, sizeof why);
    pthread_mutex_unlock(&x->mu);
    return aborted ? dc_fail("%s", why) : 0;
}

// F32 or BF16 (dc_comm_sum_dtype_check has refused the rest).
static ncclDataType_t nccl_type(dc_dtype dt) { return dt == DC_BF16 ? ncclBfloat16 : ncclFloat32; }

static int all_reduce_sum(dc_comm *c, void *buf, int64_t n, dc_dtype dt) {
    DC_TRY(dc_comm_sum_dtype_check(dt));
    DC_TRY(check_open(c));
    nccl_ctx *x = ctx_of(c);
    return enqueued(c, g_nccl.all_reduce(buf, buf, (size_t)n, nccl_type(dt), ncclSum, x->nc, begin(x)),
                    "all-reduce");
}

static int reduce_scatter_sum(dc_comm *c, void *out, const void *in, int64_t n, dc_dtype dt) {
    DC_TRY(dc_comm_sum_dtype_check(dt));
    DC_TRY(check_open(c));
    nccl_ctx *x = ctx_of(c);
    return enqueued(c, g_nccl.reduce_scatter(in, out, (size_t)n, nccl_type(dt), ncclSum, x->nc, begin(x)),
                    "reduce-scatter");
}

static int all_gather(dc_comm *c, void *out, const void *in, size_t bytes) {
    DC_TRY(check_open(c));
    nccl_ctx *x = ctx_of(c);
    return enqueued(c, g_nccl.all_gather(in, out, bytes, ncclUint8, x->nc, begin(x)), "all-gather");
}

static int broadcast(dc_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) return dc_fail("broadcast from rank %d of %d", root, c->size);
    DC_TRY(check_open(c));
    nccl_ctx *x = ctx_of(c);
    return enqueued(c, g_nccl.broadcast(buf, buf, bytes, ncclUint8, root, x->nc, begin(x)), "broadcast");
}

// The host channel: every rank has enqueued its work up to here. (Device
// order comes from the stream itself.)
static int barrier(dc_comm *c) {
    DC_TRY(check_open(c));
    char none[1] = {0};
    return dc_rendezvous_all_gather(ctx_of(c)->rv, none, none, 0);
}

static void comm_abort(dc_comm *c, const char *why) {
    nccl_ctx *x = ctx_of(c);
    char msg[1024];
    snprintf(msg, sizeof msg, "rank %d of %d failed: %s", c->rank, c->size, why);
    dc_rendezvous_abort(x->rv, why);
    nccl_fail(x, msg);
}

static void set_async(dc_comm *c, bool async) { ctx_of(c)->async = async; }

static int64_t issued(dc_comm *c) { return ctx_of(c)->issued; }

// Events are reused every FIN_RING collectives: waiting on the newest of the
// first n covers the older ones (one queue runs them in order).
static int wait_for(dc_comm *c, int64_t n) {
    nccl_ctx *x = ctx_of(c);
    if (n > x->issued) return dc_fail("waiting for collective %lld, but %lld were issued", (long long)n,
                                      (long long)x->issued);
    if (n > 0) cudaStreamWaitEvent(x->main, x->fin[(n - 1) % FIN_RING], 0);
    return check_open(c);
}

// No reduce_scatter_add: NCCL's sums follow its ring, not rank order.
static const dc_comm_ops k_ops = {all_reduce_sum, reduce_scatter_sum, all_gather, broadcast, barrier, comm_abort,
                                  set_async, issued, wait_for, NULL};

// The stream and events (those created: the rest are NULL).
static void release_cuda(nccl_ctx *x) {
    if (x->done) cudaEventDestroy(x->done);
    if (x->ready) cudaEventDestroy(x->ready);
    for (int i = 0; i < FIN_RING; i++)
        if (x->fin[i]) cudaEventDestroy(x->fin[i]);
    if (x->stream) cudaStreamDestroy(x->stream);
}

int dc_comm_nccl_create(dc_rendezvous *rv, void *stream, dc_comm **out) {
    *out = NULL;
    DC_TRY(load_nccl());
    const int rank = dc_rendezvous_rank(rv), size = dc_rendezvous_size(rv);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        ncclResult_t r = g_nccl.get_unique_id(&id);
        if (r != ncclSuccess) {
            dc_fail("ncclGetUniqueId: %s", g_nccl.error_string(r));
            dc_rendezvous_abort(rv, dc_error());
            return -1;
        }
    }
    DC_TRY(dc_rendezvous_broadcast(rv, &id, sizeof id));
    nccl_ctx *x = calloc(1, sizeof *x);
    dc_comm *c = calloc(1, sizeof *c);
    if (!x || !c) {
        free(x), free(c);
        return dc_fail("out of memory");
    }
    x->rv = rv, x->main = (cudaStream_t)stream;
    pthread_mutex_init(&x->mu, NULL);
    // ncclCommInitRank blocks until every rank has called it; a rank that
    // fails before then is seen by the others through the rendezvous only
    // afterwards, so it says why first.
    ncclResult_t r = g_nccl.comm_init_rank(&x->nc, size, id, rank);
    cudaError_t e = r == ncclSuccess ? cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming) : cudaSuccess;
    if (r == ncclSuccess && e == cudaSuccess) e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (r == ncclSuccess && e == cudaSuccess) e = cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming);
    for (int i = 0; i < FIN_RING && r == ncclSuccess && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&x->fin[i], cudaEventDisableTiming);
    if (r != ncclSuccess || e != cudaSuccess) {
        dc_fail("starting NCCL on rank %d of %d: %s", rank, size,
                r != ncclSuccess ? g_nccl.error_string(r) : cudaGetErrorString(e));
        dc_rendezvous_abort(rv, dc_error());
        if (r == ncclSuccess) g_nccl.comm_destroy(x->nc);
        release_cuda(x);
        pthread_mutex_destroy(&x->mu);
        free(x), free(c);
        return -1;
    }
    if (pthread_create(&x->watchdog, NULL, watchdog, x) != 0) {
        g_nccl.comm_destroy(x->nc);
        release_cuda(x);
        pthread_mutex_destroy(&x->mu);
        free(x), free(c);
        return dc_fail("could not start the NCCL watchdog thread");
    }
    *c = (dc_comm){rank, size, true, &k_ops, x};
    *out = c;
    return 0;
}

void dc_comm_nccl_free(dc_comm *c) {
    if (!c) return;
    nccl_ctx *x = ctx_of(c);
    x->stop = 1;
    pthread_join(x->watchdog, NULL);
    // An aborted communicator is already released by ncclCommAbort.
    if (!x->aborted) g_nccl.comm_destroy(x->nc);
    release_cuda(x);
    pthread_mutex_destroy(&x->mu);
    free(x), free(c);
}
