// Copies between device memory and pinned host memory on a second stream,
// so they run beside the ops (offloaded training: gradients go down to the
// host and updated weights come back up while backward goes on).
//
// A copy first waits for the ops queued on the main stream so far (an
// event recorded there), then runs on the copy stream and records its
// ticket's event. The host waits on that event (host_wait, from any
// thread), the main stream on it (wait_ticket). Copies run in the order
// they were issued, so a ticket's event also covers every earlier copy.
#include <stdio.h>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

int dc_cuda_copy_start(dc_cuda_ctx *c) {
    cudaError_t e = cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->copy_after, cudaEventDisableTiming);
    // every slot starts recorded (complete), so a wait on any ticket returns
    for (int i = 0; i < DC_CUDA_COPY_EVENTS && e == cudaSuccess; i++) {
        e = cudaEventCreateWithFlags(&c->copy_ev[i], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(c->copy_ev[i], c->copy_stream);
    }
    if (e != cudaSuccess)
        return cudaGetLastError(), dc_fail("the CUDA GPU could not be used (copy stream: %s)", cudaGetErrorString(e));
    return 0;
}

void dc_cuda_copy_free(dc_cuda_ctx *c) {
    if (c->copy_stream) cudaStreamSynchronize(c->copy_stream);
    for (int i = 0; i < DC_CUDA_COPY_EVENTS; i++)
        if (c->copy_ev[i]) cudaEventDestroy(c->copy_ev[i]);
    if (c->copy_after) cudaEventDestroy(c->copy_after);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
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
    const int64_t t = c->copies + 1;
    cudaEvent_t done = c->copy_ev[t % DC_CUDA_COPY_EVENTS];
    DC_CUDA_OR(be, 0, cudaEventRecord(c->copy_after, c->stream));
    DC_CUDA_OR(be, 0, cudaStreamWaitEvent(c->copy_stream, c->copy_after, 0));
    if (bytes)
        DC_CUDA_OR(be, 0, cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                          c->copy_stream));
    DC_CUDA_OR(be, 0, cudaEventRecord(done, c->copy_stream));
    c->copies = t;
    return t;
}

// Reads the context only for the event, so another host thread may call it;
// an error is this thread's message, not the backend's record.
extern "C" int dc_cuda_host_wait(dc_backend *be, int64_t ticket) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (ticket <= 0) return 0;
    cudaError_t e = cudaEventSynchronize(c->copy_ev[ticket % DC_CUDA_COPY_EVENTS]);
    if (e != cudaSuccess) return dc_fail("CUDA error: %s, waiting for a copy to the host", cudaGetErrorString(e));
    return 0;
}

extern "C" void dc_cuda_wait_ticket(dc_backend *be, int64_t ticket) {
    DC_CUDA_OP(be);
    if (ticket <= 0) return;
    DC_CUDA(be, cudaStreamWaitEvent(dc_cuda(be)->stream, dc_cuda(be)->copy_ev[ticket % DC_CUDA_COPY_EVENTS], 0));
}
