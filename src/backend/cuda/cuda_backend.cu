// The CUDA backend: device memory, the one stream every op runs on, pinned
// staging for uploads, graph capture, and the table of ops.
//
// Nothing here synchronises with the host except download and sync:
// uploads go through a pinned ring buffer, so the host copies its data and
// returns while the device is still busy with earlier work.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

void dc_cuda_fatal(const char *what, const char *msg, const char *file, int line) {
    fprintf(stderr, "diffusion: CUDA error: %s\n  in %s (%s:%d)\n", msg, what, file, line);
    abort();
}

// ---- memory --------------------------------------------------------------------------
// A host-side table of live allocations keeps the tally of device memory.
static void *cu_alloc(dc_backend *be, size_t bytes) {
    dc_cuda_ctx *c = dc_cuda(be);
    void *p = NULL;
    if (c->nallocs == c->cap_allocs) {
        int cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        dc_cuda_alloc_rec *t = (dc_cuda_alloc_rec *)realloc(c->allocs, cap * sizeof *t);
        if (!t) return dc_fail("out of memory"), (void *)NULL;
        c->allocs = t, c->cap_allocs = cap;
    }
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky: later calls still work
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        dc_fail("GPU allocation of %.1f MiB failed (%s; %.1f MiB free of %.1f MiB)", bytes / 1048576.0,
                cudaGetErrorString(e), fr / 1048576.0, tot / 1048576.0);
        return NULL;
    }
    c->allocs[c->nallocs++] = (dc_cuda_alloc_rec){p, bytes};
    c->bytes_now += bytes;
    if (c->bytes_now > c->bytes_peak) c->bytes_peak = c->bytes_now;
    return p;
}

static void cu_free(dc_backend *be, void *p) {
    if (!p) return;
    dc_cuda_ctx *c = dc_cuda(be);
    for (int i = 0; i < c->nallocs; i++) {
        if (c->allocs[i].p != p) continue;
        c->bytes_now -= c->allocs[i].bytes;
        c->allocs[i] = c->allocs[--c->nallocs];
        break;
    }
    DC_CUDA(cudaFree(p));  // implicitly waits for the work that uses it
}

static void cu_memory(dc_backend *be, size_t *now, size_t *peak) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (now) *now = c->bytes_now + c->lt_ws_bytes;
    if (peak) *peak = c->bytes_peak + c->lt_ws_bytes;
}

// Uploads are staged through the ring in pieces of at most an eighth of it:
// the host waits only if the device has not yet consumed the copy made a
// whole ring earlier.
static void upload_piece(dc_cuda_ctx *c, void *dst, const void *src, size_t bytes);

static void cu_upload(dc_backend *be, void *dst, const void *src, size_t bytes) {
    dc_cuda_ctx *c = dc_cuda(be);
    const size_t part = DC_CUDA_RING_BYTES / 8;
    for (size_t off = 0; off < bytes; off += part)
        upload_piece(c, (char *)dst + off, (const char *)src + off, bytes - off < part ? bytes - off : part);
}

static void upload_piece(dc_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
    const size_t part = DC_CUDA_RING_BYTES / 8;
    size_t slot = c->ring_head / part;
    if (c->ring_head % part + bytes > part) {  // move to the next slot
        slot = (slot + 1) % 8;
        c->ring_head = slot * part;
    }
    if (c->ring_head % part == 0) DC_CUDA(cudaEventSynchronize(c->ring_ev[slot]));
    char *stage = c->ring + c->ring_head;
    memcpy(stage, src, bytes);
    DC_CUDA(cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, c->stream));
    DC_CUDA(cudaEventRecord(c->ring_ev[slot], c->stream));
    c->ring_head += (bytes + 255) & ~(size_t)255;
    if (c->ring_head >= DC_CUDA_RING_BYTES) c->ring_head = 0;
}

static void cu_download(dc_backend *be, void *dst, const void *src, size_t bytes) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (bytes == 0) return;
    DC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    DC_CUDA(cudaStreamSynchronize(c->stream));
}

static void cu_copy(dc_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        DC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dc_cuda(be)->stream));
}

static void cu_zero(dc_backend *be, void *dst, size_t bytes) {
    if (bytes) DC_CUDA(cudaMemsetAsync(dst, 0, bytes, dc_cuda(be)->stream));
}

static void cu_sync(dc_backend *be) { DC_CUDA(cudaStreamSynchronize(dc_cuda(be)->stream)); }

// Attention keeps no workspace (the kernels rebuild what they need), so
// reserving only checks that the shape is supported.
static int cu_reserve(dc_backend *be, int max_tokens, int head_dim) {
    (void)be;
    if (max_tokens < 1) return dc_fail("cuda: reserve for %d tokens", max_tokens);
    if (head_dim < 1 || head_dim > dc_cuda_attn_max_head_dim())
        return dc_fail("cuda: attention head size %d is not supported (at most %d: use more heads)", head_dim,
                       dc_cuda_attn_max_head_dim());
    return 0;
}

// ---- graphs ---------------------------------------------------------------------------
static void *cu_graph_capture(dc_backend *be, int (*fn)(void *arg), void *arg) {
    dc_cuda_ctx *c = dc_cuda(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    DC_CUDA(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    int rc = fn(arg);
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (rc != 0) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();  // a capture that fn's failure invalidated leaves an error behind
        return NULL;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        dc_fail("cuda: graph capture failed: %s", cudaGetErrorString(e));
        return NULL;
    }
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dc_fail("cuda: graph instantiation failed: %s", cudaGetErrorString(e));
        return NULL;
    }
    return exec;
}

static void cu_graph_launch(dc_backend *be, void *graph) {
    DC_CUDA(cudaGraphLaunch((cudaGraphExec_t)graph, dc_cuda(be)->stream));
}

static void cu_graph_free(dc_backend *be, void *graph) {
    (void)be;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

// ---- attention adapters ------------------------------------------------------------------
static void cu_attn_fwd(dc_backend *be, dc_buf out, dc_buf lse, dc_buf qkv, int B, int T, int D, int H) {
    int rc = dc_cuda_attn_fwd(dc_cuda(be)->stream, out.p, (float *)lse.p, qkv.p, B, T, D, H,
                              qkv.dt == DC_BF16);
    if (rc) dc_cuda_fatal("attn_fwd", "unsupported head size", __FILE__, __LINE__);
    DC_CUDA_LAUNCHED();
}

static void cu_attn_bwd(dc_backend *be, dc_buf dqkv, dc_buf dout, dc_buf qkv, dc_buf out, dc_buf lse,
                        int B, int T, int D, int H) {
    int rc = dc_cuda_attn_bwd(dc_cuda(be)->stream, dqkv.p, dout.p, qkv.p, out.p, (const float *)lse.p,
                              B, T, D, H, qkv.dt == DC_BF16);
    if (rc) dc_cuda_fatal("attn_bwd", "unsupported head size", __FILE__, __LINE__);
    DC_CUDA_LAUNCHED();
}

// ---- creation ----------------------------------------------------------------------------
static void cu_destroy(dc_backend *be) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->stream) cudaStreamSynchronize(c->stream);
    dc_cuda_gemm_free(c);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->lt_ws) cudaFree(c->lt_ws);
    if (c->red) cudaFree(c->red);
    if (c->ring) cudaFreeHost(c->ring);
    for (int i = 0; i < 8; i++)
        if (c->ring_ev[i]) cudaEventDestroy(c->ring_ev[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->allocs);
    free(c);
    free(be);
}

extern "C" dc_backend *dc_backend_cuda_create(bool fp32) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        dc_fail("no CUDA GPU present (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NULL;
    }
    dc_cuda_ctx *c = (dc_cuda_ctx *)calloc(1, sizeof *c);
    dc_backend *be = (dc_backend *)calloc(1, sizeof *be);
    if (!c || !be) {
        free(c), free(be);
        dc_fail("out of memory");
        return NULL;
    }
    // A GPU that is present but unusable (busy in exclusive mode, full) is a
    // clean failure, so "auto" can fall back to the CPU.
    be->ctx = c;
    c->lt_ws_bytes = (size_t)64 << 20;
    const char *step = "stream";
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) step = "cuBLASLt", e = cublasLtCreate(&c->lt) == CUBLAS_STATUS_SUCCESS ? cudaSuccess
                                                                                                : cudaErrorUnknown;
    if (e == cudaSuccess) step = "workspace", e = cudaMalloc(&c->lt_ws, c->lt_ws_bytes);
    if (e == cudaSuccess) step = "reduction buffer", e = cudaMalloc((void **)&c->red, 1024 * sizeof(double));
    if (e == cudaSuccess) step = "pinned upload buffer", e = cudaMallocHost((void **)&c->ring, DC_CUDA_RING_BYTES);
    for (int i = 0; i < 8 && e == cudaSuccess; i++) {
        step = "events";
        e = cudaEventCreateWithFlags(&c->ring_ev[i], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(c->ring_ev[i], c->stream);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        dc_fail("the CUDA GPU could not be used (%s: %s)", step, cudaGetErrorString(e));
        cu_destroy(be);
        return NULL;
    }
    *be = (dc_backend){
        .name = fp32 ? "cuda-fp32" : "cuda",
        .ctx = c,
        .compute = fp32 ? DC_F32 : DC_BF16,
        .alloc = cu_alloc,
        .free = cu_free,
        .upload = cu_upload,
        .download = cu_download,
        .copy = cu_copy,
        .zero = cu_zero,
        .cast = dc_cuda_cast,
        .sync = cu_sync,
        .destroy = cu_destroy,
        .reserve = cu_reserve,
        .linear_fwd = dc_cuda_linear_fwd,
        .linear_bwd = dc_cuda_linear_bwd,
        .linear_gelu_fwd = dc_cuda_linear_gelu_fwd,
        .linear_bwd_gelu = dc_cuda_linear_bwd_gelu,
        .gelu_fwd = dc_cuda_gelu_fwd,
        .gelu_bwd = dc_cuda_gelu_bwd,
        .silu_fwd = dc_cuda_silu_fwd,
        .silu_bwd = dc_cuda_silu_bwd,
        .axpy = dc_cuda_axpy,
        .add_rows = dc_cuda_add_rows,
        .ln_mod_fwd = dc_cuda_ln_mod_fwd,
        .ln_mod_bwd = dc_cuda_ln_mod_bwd,
        .gate_res_fwd = dc_cuda_gate_res_fwd,
        .gate_res_bwd = dc_cuda_gate_res_bwd,
        .attn_fwd = cu_attn_fwd,
        .attn_bwd = cu_attn_bwd,
        .patchify = dc_cuda_patchify,
        .unpatchify_fwd = dc_cuda_unpatchify_fwd,
        .unpatchify_bwd = dc_cuda_unpatchify_bwd,
        .timestep_embed = dc_cuda_timestep_embed,
        .embed_fwd = dc_cuda_embed_fwd,
        .embed_bwd = dc_cuda_embed_bwd,
        .randn = dc_cuda_randn,
        .q_sample = dc_cuda_q_sample,
        .diffusion_loss = dc_cuda_diffusion_loss,
        .cfg_combine = dc_cuda_cfg_combine,
        .sampler_step = dc_cuda_sampler_step,
        .adamw = dc_cuda_adamw,
        .grad_norm = dc_cuda_grad_norm,
        .memory = cu_memory,
        .graph_capture = cu_graph_capture,
        .graph_launch = cu_graph_launch,
        .graph_free = cu_graph_free,
        .gemm_peak = dc_cuda_gemm_peak,
    };
    return be;
}
