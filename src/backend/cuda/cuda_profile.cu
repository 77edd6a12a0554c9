// opts.profile: where a run's GPU time goes, op by op. Every op records
// an event at its entry (DC_CUDA_OP); the time from one op's event to the
// next is charged to the first, so each op's kernels, copies and library
// calls are counted, and the host's gaps between ops too (launch overhead
// shows as time). The table goes to stderr when the backend is destroyed.
//
// Inside a CUDA graph the marks become event-record nodes of the graph
// (cudaEventRecordExternal), so a graph's ops are timed as the graph runs
// them, without the host's gaps: each launch of a profiled graph waits for
// it and charges its ops (the launch itself is listed apart, its time not
// added to the total). Costs one event record per op and, for graphs, a
// wait per launch: for finding hot spots, not for timing runs.
//
// Beside the GPU's time, each op is charged the host's time from its mark to
// the next op's (its launches and library calls, and the caller's work before
// the next op): an op whose host time exceeds its GPU time starves the GPU
// when it runs outside a graph.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_ops.h"

#define PROF_EVENTS 16384
#define PROF_GEVENTS 8192  // marks inside graphs, over all graphs alive
#define PROF_GRAPHS 16
#define PROF_NAMES 128

struct dc_cuda_prof {
    cudaEvent_t ev[PROF_EVENTS];
    const char *at[PROF_EVENTS];
    int n;
    // graphs: their marks gev[lo, hi) as captured
    cudaEvent_t gev[PROF_GEVENTS];
    const char *gat[PROF_GEVENTS];
    int gn, cap_lo;
    struct { void *exec; int lo, hi; } graphs[PROF_GRAPHS];
    int ngraphs;
    struct { const char *name; long count, host_count; double ms, host_ms; } tab[PROF_NAMES];
    int ntab;
    const char *host_at;  // the op the host's clock runs for, since host_t (seconds)
    double host_t;
};

extern "C" void dc_cuda_prof_start(dc_cuda_ctx *c) {
    c->prof = (dc_cuda_prof *)calloc(1, sizeof *c->prof);
    for (int i = 0; c->prof && i < PROF_EVENTS; i++) cudaEventCreate(&c->prof->ev[i]);
    for (int i = 0; c->prof && i < PROF_GEVENTS; i++) cudaEventCreate(&c->prof->gev[i]);
}

// The table row of an op (a new one if needed), or -1 when the table is full.
static int row_of(dc_cuda_prof *p, const char *name) {
    int i = 0;
    while (i < p->ntab && p->tab[i].name != name && strcmp(p->tab[i].name, name)) i++;
    if (i == p->ntab) {
        if (p->ntab == PROF_NAMES) return -1;
        memset(&p->tab[i], 0, sizeof p->tab[i]);  // a restart leaves old rows behind
        p->tab[p->ntab++].name = name;
    }
    return i;
}

static void charge(dc_cuda_prof *p, const char *name, double ms) {
    const int i = row_of(p, name);
    if (i >= 0) p->tab[i].count++, p->tab[i].ms += ms;
}

// The host's time since the last mark goes to the op that mark opened.
static void charge_host(dc_cuda_prof *p, const char *next) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double now = ts.tv_sec + 1e-9 * ts.tv_nsec;
    const int i = p->host_at ? row_of(p, p->host_at) : -1;
    if (i >= 0) p->tab[i].host_count++, p->tab[i].host_ms += 1e3 * (now - p->host_t);
    p->host_at = next, p->host_t = now;
}

// Charges every closed interval; the last mark opens the next round.
static void flush(dc_cuda_prof *p) {
    if (p->n < 2) return;
    cudaEventSynchronize(p->ev[p->n - 1]);
    for (int i = 0; i + 1 < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]) == cudaSuccess) charge(p, p->at[i], ms);
    }
    cudaEvent_t last = p->ev[p->n - 1];
    p->ev[p->n - 1] = p->ev[0], p->ev[0] = last;
    p->at[0] = p->at[p->n - 1];
    p->n = 1;
    cudaGetLastError();
}

extern "C" void dc_cuda_prof_mark(dc_cuda_ctx *c, const char *op) {
    dc_cuda_prof *p = c->prof;
    charge_host(p, op);
    cudaStreamCaptureStatus st;
    if (cudaStreamIsCapturing(c->stream, &st) != cudaSuccess) return;
    if (st != cudaStreamCaptureStatusNone) {  // a node of the graph being captured
        if (st == cudaStreamCaptureStatusActive && p->gn < PROF_GEVENTS &&
            cudaEventRecordWithFlags(p->gev[p->gn], c->stream, cudaEventRecordExternal) == cudaSuccess)
            p->gat[p->gn++] = op;
        return;
    }
    if (p->n == PROF_EVENTS) flush(p);
    cudaEventRecord(p->ev[p->n], c->stream);
    p->at[p->n++] = op;
}

// Forgets the marks and the table: the next op starts afresh (an event is
// simply recorded again, so nothing needs waiting for). Graphs keep theirs.
extern "C" void dc_cuda_prof_restart(dc_backend *be) {
    dc_cuda_prof *p = dc_cuda(be)->prof;
    if (p) p->n = 0, p->ntab = 0, p->host_at = NULL;
}

// Around a capture: its marks start here, and the graph made of them.
extern "C" void dc_cuda_prof_capture_begin(dc_cuda_ctx *c) {
    if (c->prof) c->prof->cap_lo = c->prof->gn;
}

extern "C" void dc_cuda_prof_capture_end(dc_cuda_ctx *c, void *exec) {
    dc_cuda_prof *p = c->prof;
    if (!p) return;
    if (!exec || p->ngraphs == PROF_GRAPHS || p->gn - p->cap_lo < 2) {  // not profiled: its marks go
        p->gn = p->cap_lo;
        return;
    }
    p->graphs[p->ngraphs].exec = exec, p->graphs[p->ngraphs].lo = p->cap_lo, p->graphs[p->ngraphs].hi = p->gn;
    p->ngraphs++;
}

static int find_graph(dc_cuda_prof *p, void *exec) {
    for (int i = 0; i < p->ngraphs; i++)
        if (p->graphs[i].exec == exec) return i;
    return -1;
}

// After a launch: waits for the graph and charges its ops.
extern "C" void dc_cuda_prof_graph_ran(dc_cuda_ctx *c, void *exec) {
    dc_cuda_prof *p = c->prof;
    const int g = p ? find_graph(p, exec) : -1;
    if (g < 0) return;
    const int lo = p->graphs[g].lo, hi = p->graphs[g].hi;
    cudaEventSynchronize(p->gev[hi - 1]);
    for (int i = lo; i + 1 < hi; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->gev[i], p->gev[i + 1]) == cudaSuccess) charge(p, p->gat[i], ms);
    }
    cudaGetLastError();
}

// A freed graph's marks go; the later graphs' move down.
extern "C" void dc_cuda_prof_graph_free(dc_cuda_ctx *c, void *exec) {
    dc_cuda_prof *p = c->prof;
    const int g = p ? find_graph(p, exec) : -1;
    if (g < 0) return;
    const int lo = p->graphs[g].lo, hi = p->graphs[g].hi, k = hi - lo;
    for (int i = hi; i < p->gn; i++) {  // keep every event: swap the freed ones to the end
        cudaEvent_t e = p->gev[i - k];
        p->gev[i - k] = p->gev[i], p->gat[i - k] = p->gat[i], p->gev[i] = e;
    }
    p->gn -= k;
    for (int i = g; i + 1 < p->ngraphs; i++) p->graphs[i] = p->graphs[i + 1];
    p->ngraphs--;
    for (int i = 0; i < p->ngraphs; i++)
        if (p->graphs[i].lo >= hi) p->graphs[i].lo -= k, p->graphs[i].hi -= k;
}

static int by_time(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? 1 : x > y ? -1 : 0;
}

extern "C" void dc_cuda_prof_report(dc_cuda_ctx *c) {
    dc_cuda_prof *p = c->prof;
    if (!p) return;
    dc_cuda_prof_mark(c, "(end)");
    flush(p);
    double total = 0, (*rows)[2] = (double (*)[2])calloc(p->ntab + 1, sizeof *rows);
    for (int i = 0; i < p->ntab; i++) {  // a graph launch's time is its ops'
        if (strcmp(p->tab[i].name, DC_CUDA_PROF_GRAPH_LAUNCH)) total += p->tab[i].ms;
        rows[i][0] = p->tab[i].ms, rows[i][1] = i;
    }
    qsort(rows, p->ntab, sizeof *rows, by_time);
    fprintf(stderr, "cuda op profile: %.1f ms between the first op and the last\n", total);
    fprintf(stderr, "  %-38s %9s %11s %9s %6s %11s\n", "op", "calls", "total ms", "avg us", "share", "host avg us");
    for (int k = 0; k < p->ntab && k < 30; k++) {
        int i = (int)rows[k][1];
        fprintf(stderr, "  %-38s %9ld %11.2f %9.1f %5.1f%% %11.1f\n", p->tab[i].name, p->tab[i].count, p->tab[i].ms,
                p->tab[i].count ? 1e3 * p->tab[i].ms / p->tab[i].count : 0.0,
                total > 0 ? 100 * p->tab[i].ms / total : 0,
                p->tab[i].host_count ? 1e3 * p->tab[i].host_ms / p->tab[i].host_count : 0.0);
    }
    free(rows);
    for (int i = 0; i < PROF_EVENTS; i++) cudaEventDestroy(p->ev[i]);
    for (int i = 0; i < PROF_GEVENTS; i++) cudaEventDestroy(p->gev[i]);
    free(p);
    c->prof = NULL;
}
