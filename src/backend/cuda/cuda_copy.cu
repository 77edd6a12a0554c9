// Copies between device memory and pinned host memory on streams of their
// own, so they run beside the ops (offloaded training: gradients go down to
// the host and updated weights come back up while backward goes on).
//
// One stream a direction, so copies up and down share the PCIe link both
// ways at once (84.6 GB/s together against 54.6 one way, measured on an
// H100 machine). A copy first waits for the ops queued on the main stream so
// far (an event recorded there), then runs on its direction's stream and
// records its ticket's event. The host waits on that event (host_wait, from
// any thread), the main stream on it (wait_ticket). Copies of one direction
// run in the order they were issued, so a ticket also covers every earlier
// copy of its direction; the two directions are ordered only through the
// main stream. A ticket is 2 seq + direction (1: to the host), seq counting
// that direction's copies from 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

int dc_cuda_copy_start(dc_cuda_ctx *c) {
    cudaError_t e = cudaStreamCreateWithFlags(&c->copy_stream[0], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->copy_stream[1], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->copy_after, cudaEventDisableTiming);
    // Every slot starts recorded (complete), so a wait on any ticket returns.
    // A host waiting on one sleeps rather than spins (BlockingSync): the
    // waiters are the offload's threads, which would otherwise take a core
    // from the CPU's optimizer step running beside them.
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < DC_CUDA_COPY_EVENTS && e == cudaSuccess; i++) {
            e = cudaEventCreateWithFlags(&c->copy_ev[d][i], cudaEventDisableTiming | cudaEventBlockingSync);
            if (e == cudaSuccess) e = cudaEventRecord(c->copy_ev[d][i], c->copy_stream[d]);
        }
    if (e != cudaSuccess)
        return cudaGetLastError(), dc_fail("the CUDA GPU could not be used (copy stream: %s)", cudaGetErrorString(e));
    return 0;
}

void dc_cuda_copy_free(dc_cuda_ctx *c) {
    for (int d = 0; d < 2; d++)
        if (c->copy_stream[d]) cudaStreamSynchronize(c->copy_stream[d]);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < DC_CUDA_COPY_EVENTS; i++)
            if (c->copy_ev[d][i]) cudaEventDestroy(c->copy_ev[d][i]);
    if (c->copy_after) cudaEventDestroy(c->copy_after);
    if (c->copy_stream[1] && c->copy_stream[1] != c->copy_stream[0]) cudaStreamDestroy(c->copy_stream[1]);
    if (c->copy_stream[0]) cudaStreamDestroy(c->copy_stream[0]);
}

// The event of a ticket (> 0).
static cudaEvent_t ticket_event(dc_cuda_ctx *c, int64_t ticket) {
    return c->copy_ev[ticket & 1][(ticket >> 1) % DC_CUDA_COPY_EVENTS];
}

extern "C" void *dc_cuda_alloc_pinned(dc_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();  // not sticky: the backend stays usable
        dc_fail("%.1f MiB of pinned host memory could not be allocated (%s)", bytes / 1048576.0,
                cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

extern "C" void dc_cuda_free_pinned(dc_backend *be, void *p) {
    (void)be;
    if (p) cudaFreeHost(p);  // waits for copies that still use it
}

extern "C" int64_t dc_cuda_copy_async(dc_backend *be, void *dst, const void *src, size_t bytes, bool to_host) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->failed) return 0;
    const int d = to_host ? 1 : 0;
    const int64_t seq = c->copies[d] + 1, t = 2 * seq + d;
    cudaStream_t s = c->copy_stream[d];
    DC_CUDA_OR(be, 0, cudaEventRecord(c->copy_after, c->stream));
    DC_CUDA_OR(be, 0, cudaStreamWaitEvent(s, c->copy_after, 0));
    if (bytes)
        DC_CUDA_OR(be, 0, cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s));
    DC_CUDA_OR(be, 0, cudaEventRecord(ticket_event(c, t), s));
    c->copies[d] = seq;
    return t;
}

// Reads the context only for the event, so another host thread may call it;
// an error is this thread's message, not the backend's record.
extern "C" int dc_cuda_host_wait(dc_backend *be, int64_t ticket) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (ticket <= 0) return 0;
    cudaError_t e = cudaEventSynchronize(ticket_event(c, ticket));
    if (e != cudaSuccess) return dc_fail("CUDA error: %s, waiting for a copy to the host", cudaGetErrorString(e));
    return 0;
}

extern "C" void dc_cuda_wait_ticket(dc_backend *be, int64_t ticket) {
    DC_CUDA_OP(be);
    if (ticket <= 0) return;
    DC_CUDA(be, cudaStreamWaitEvent(dc_cuda(be)->stream, ticket_event(dc_cuda(be), ticket), 0));
}
