// The CUDA backend: device memory, the one stream every op runs on, pinned
// staging for uploads, graph capture, and the table of ops (copies beside
// the ops, on a second stream, are in cuda_copy.cu).
//
// Nothing here synchronises with the host except download and sync:
// uploads go through a pinned ring buffer, so the host copies its data and
// returns while the device is still busy with earlier work. Errors are
// recorded in the context and reported by status (cuda_ops.h says why).
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sm90.h"
#include "core/error.h"

void dc_cuda_record(dc_backend *be, const char *func, const char *file, int line, const char *fmt, ...) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->failed) return;  // the first error is the cause; later ones are its echoes
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    // the op's name in the table: dc_cuda_linear_fwd and cu_sync read linear_fwd and sync
    const char *op = strncmp(func, "dc_cuda_", 8) == 0 ? func + 8 : strncmp(func, "cu_", 3) == 0 ? func + 3 : func;
    snprintf(c->err, sizeof c->err, "%s in %s (%s:%d)", what, op, file, line);
    c->failed = true;
}

static int cu_status(dc_backend *be) {
    dc_cuda_ctx *c = dc_cuda(be);
    return c->failed ? dc_fail("%s", c->err) : 0;
}

// An allocation failure is not sticky in CUDA: clear it, and leave the backend usable.
int dc_cuda_fail_alloc(const char *what, size_t bytes, cudaError_t e) {
    cudaGetLastError();
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    return dc_fail("GPU allocation of %.1f MiB for %s failed (%s; %.1f MiB free of %.1f MiB)", bytes / 1048576.0,
                   what, cudaGetErrorString(e), fr / 1048576.0, tot / 1048576.0);
}

int dc_cuda_grow(dc_cuda_ctx *c, void **p, size_t *have, size_t bytes, const char *what) {
    if (bytes <= *have) return 0;
    DC_TRY(dc_cuda_check_cap(c, bytes - *have, what));
    c->frees += *p != NULL;  // a graph that uses the old one is stale
    if (*p) cudaFree(*p);  // waits for the work that uses it
    *p = NULL, *have = 0;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) return *p = NULL, dc_cuda_fail_alloc(what, bytes, e);
    *have = bytes;
    dc_cuda_note_peak(c);
    return 0;
}

// ---- memory --------------------------------------------------------------------------
// The ops' own workspaces (the reduction scratch is too small to matter).
static size_t workspace_bytes(const dc_cuda_ctx *c) {
    return c->lt_ws_bytes + c->conv_ws_bytes + c->conv_scratch_bytes + c->sdpa_ws_bytes + c->wino_u_bytes +
           DC_CUDA_NORM_WS * sizeof(double);
}

void dc_cuda_note_peak(dc_cuda_ctx *c) {
    const size_t held = c->bytes_now + workspace_bytes(c);
    if (held > c->bytes_peak) c->bytes_peak = held;
}

bool dc_cuda_fits_cap(const dc_cuda_ctx *c, size_t more) {
    return !c->cap || c->bytes_now + workspace_bytes(c) + more <= c->cap;
}

int dc_cuda_check_cap(const dc_cuda_ctx *c, size_t more, const char *what) {
    if (dc_cuda_fits_cap(c, more)) return 0;
    const size_t held = c->bytes_now + workspace_bytes(c);
    return dc_fail("GPU allocation of %.1f MiB for %s would pass the memory cap (--max-gpu-memory %.2f GiB; %.2f GiB "
                   "held)", more / 1048576.0, what, c->cap / 1073741824.0, held / 1073741824.0);
}

// A host-side table of live allocations keeps the tally of device memory.
static void *cu_alloc(dc_backend *be, size_t bytes) {
    dc_cuda_ctx *c = dc_cuda(be);
    void *p = NULL;
    if (c->failed) return cu_status(be), (void *)NULL;
    if (c->nallocs == c->cap_allocs) {
        int cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        dc_cuda_alloc_rec *t = (dc_cuda_alloc_rec *)realloc(c->allocs, cap * sizeof *t);
        if (!t) return dc_fail("out of host memory for the GPU allocation table"), (void *)NULL;
        c->allocs = t, c->cap_allocs = cap;
    }
    if (dc_cuda_check_cap(c, bytes, "a tensor")) return NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) return dc_cuda_fail_alloc("a tensor", bytes, e), (void *)NULL;
    c->allocs[c->nallocs++] = (dc_cuda_alloc_rec){p, bytes};
    c->bytes_now += bytes;
    dc_cuda_note_peak(c);
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
    c->frees++;
    DC_CUDA(be, cudaFree(p));  // implicitly waits for the work that uses it
}

static void cu_memory(dc_backend *be, size_t *now, size_t *peak) {
    dc_cuda_ctx *c = dc_cuda(be);
    const size_t ws = workspace_bytes(c);  // the ops' own workspaces count too
    if (now) *now = c->bytes_now + ws;
    if (peak) *peak = c->bytes_peak;
}

static void cu_set_memory_cap(dc_backend *be, size_t bytes) { dc_cuda(be)->cap = bytes; }

// Uploads are staged through the ring in pieces of at most an eighth of it:
// the host waits only if the device has not yet consumed the copy made a
// whole ring earlier.
static void upload_piece(dc_backend *be, void *dst, const void *src, size_t bytes);

static void cu_upload(dc_backend *be, void *dst, const void *src, size_t bytes) {
    const size_t part = DC_CUDA_RING_BYTES / 8;
    for (size_t off = 0; off < bytes && !dc_cuda(be)->failed; off += part)
        upload_piece(be, (char *)dst + off, (const char *)src + off, bytes - off < part ? bytes - off : part);
}

static void upload_piece(dc_backend *be, void *dst, const void *src, size_t bytes) {
    dc_cuda_ctx *c = dc_cuda(be);
    const size_t part = DC_CUDA_RING_BYTES / 8;
    size_t slot = c->ring_head / part;
    if (c->ring_head % part + bytes > part) {  // move to the next slot
        slot = (slot + 1) % 8;
        c->ring_head = slot * part;
    }
    if (c->ring_head % part == 0) DC_CUDA(be, cudaEventSynchronize(c->ring_ev[slot]));
    char *stage = c->ring + c->ring_head;
    memcpy(stage, src, bytes);
    DC_CUDA(be, cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, c->stream));
    DC_CUDA(be, cudaEventRecord(c->ring_ev[slot], c->stream));
    c->ring_head += (bytes + 255) & ~(size_t)255;
    if (c->ring_head >= DC_CUDA_RING_BYTES) c->ring_head = 0;
}

// After an error the destination is filled with 0xff bytes (NaN as floats,
// -1 as integers), so a caller that forgets the status check sees no
// plausible numbers.
static void cu_download(dc_backend *be, void *dst, const void *src, size_t bytes) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (bytes == 0) return;
    if (!c->failed && dc_cuda_ok(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
                                 "cudaMemcpyAsync", __func__, __FILE__, __LINE__))
        dc_cuda_ok(be, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __func__, __FILE__, __LINE__);
    if (c->failed) memset(dst, 0xff, bytes);
}

static void cu_copy(dc_backend *be, void *dst, const void *src, size_t bytes) {
    DC_CUDA_OP(be);
    if (bytes && dst != src)
        DC_CUDA(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dc_cuda(be)->stream));
}

static void cu_zero(dc_backend *be, void *dst, size_t bytes) {
    DC_CUDA_OP(be);
    if (bytes) DC_CUDA(be, cudaMemsetAsync(dst, 0, bytes, dc_cuda(be)->stream));
}

// Errors of kernels that ran since the last check surface here.
static void cu_sync(dc_backend *be) {
    DC_CUDA_OP(be);
    DC_CUDA(be, cudaStreamSynchronize(dc_cuda(be)->stream));
}

// Attention keeps no workspace of its own (its product path borrows the
// cuBLASLt workspace between products), so reserving checks that the longest
// sequence fits there (cuda_attention_op.cu).
static int cu_reserve(dc_backend *be, int max_tokens, int head_dim) {
    DC_TRY(cu_status(be));
    return dc_cuda_attention_reserve(be, max_tokens, head_dim);
}

// ---- graphs ---------------------------------------------------------------------------
// A graph remembers how many buffers the context had freed when it was
// recorded: once another is freed, the graph may point at it (graph_valid).
typedef struct {
    cudaGraphExec_t exec;
    uint64_t frees;
} cu_graph;

// An op that fails inside fn is recorded like any other; a capture that
// cudaStreamEndCapture or instantiation refuses is not (nothing ran, and the
// stream is back to normal), so the caller may go on without a graph.
static void *cu_graph_capture(dc_backend *be, int (*fn)(void *arg), void *arg) {
    dc_cuda_ctx *c = dc_cuda(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    if (cu_status(be)) return NULL;
    if (!dc_cuda_ok(be, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture", __func__, __FILE__, __LINE__))
        return cu_status(be), (void *)NULL;
    dc_cuda_prof_capture_begin(c);
    int rc = fn(arg);
    if (rc == 0) rc = cu_status(be);  // fn may not have asked
    if (c->prof) dc_cuda_prof_mark(c, "(graph end)");
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (rc == 0 && e == cudaSuccess) {
        e = cudaGraphInstantiate(&exec, g, 0);
        if (e != cudaSuccess) exec = NULL;
    }
    if (g) cudaGraphDestroy(g);
    dc_cuda_prof_capture_end(c, exec);
    if (rc != 0) {
        cudaGetLastError();  // a capture that fn's failure invalidated leaves an error behind
        return NULL;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        dc_fail("cuda: graph capture failed: %s", cudaGetErrorString(e));
        return NULL;
    }
    cu_graph *g2 = (cu_graph *)malloc(sizeof *g2);
    if (!g2) {
        if (c->prof) dc_cuda_prof_graph_free(c, exec);
        cudaGraphExecDestroy(exec);
        dc_fail("out of host memory for a graph");
        return NULL;
    }
    *g2 = (cu_graph){exec, c->frees};
    return g2;
}

static void cu_graph_launch(dc_backend *be, void *graph) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->failed) return;
    if (c->prof) dc_cuda_prof_mark(c, DC_CUDA_PROF_GRAPH_LAUNCH);
    cu_graph *g = (cu_graph *)graph;
    DC_CUDA(be, cudaGraphLaunch(g->exec, c->stream));
    if (c->prof) dc_cuda_prof_graph_ran(c, g->exec);
}

static void cu_graph_free(dc_backend *be, void *graph) {
    if (!graph) return;
    cu_graph *g = (cu_graph *)graph;
    if (dc_cuda(be)->prof) dc_cuda_prof_graph_free(dc_cuda(be), g->exec);
    cudaGraphExecDestroy(g->exec);
    free(g);
}

static bool cu_graph_valid(dc_backend *be, void *graph) {
    return graph && ((cu_graph *)graph)->frees == dc_cuda(be)->frees;
}

// ---- creation ----------------------------------------------------------------------------
static void cu_destroy(dc_backend *be) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (c->prof) dc_cuda_prof_report(c);
    if (c->stream) cudaStreamSynchronize(c->stream);
    dc_cuda_copy_free(c);
    dc_cuda_gemm_free(c);
    dc_cuda_attention_cudnn_free(c);
    dc_cuda_conv_free(c);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->lt_ws) cudaFree(c->lt_ws);
    if (c->red) cudaFree(c->red);
    if (c->norm_ws) cudaFree(c->norm_ws);
    if (c->ring) cudaFreeHost(c->ring);
    for (int i = 0; i < 8; i++)
        if (c->ring_ev[i]) cudaEventDestroy(c->ring_ev[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaGetLastError();  // what teardown of a failed backend reports must not reach the next one
    free(c->allocs);
    free(c);
    free(be);
}

// Everything a backend holds before its first op; 0, or -1 with a message.
// A GPU that is present but unusable (too old, busy in exclusive mode, full)
// is a clean failure, so "auto" can fall back to the CPU.
static int start(dc_cuda_ctx *c, const dc_backend_opts *o) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    // The kernels use Ampere's bf16 tensor-core and async-copy instructions.
    if (e == cudaSuccess && major < 8)
        return dc_fail("GPU %d has compute capability %d.%d; the CUDA backend needs 8.0 (Ampere) or newer", dev,
                       major, minor);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    // dc_pdl_enter waits only in code built for sm_90 and up: not in compute_80 PTX compiled at load time
    c->pdl = sm90_device();
    if (e != cudaSuccess)
        return cudaGetLastError(), dc_fail("the CUDA GPU could not be used (%s)", cudaGetErrorString(e));
    cublasStatus_t st = cublasLtCreate(&c->lt);
    if (st != CUBLAS_STATUS_SUCCESS) return dc_fail("cuBLASLt could not start (%s)", cublasLtGetStatusString(st));
    c->lt_ws_bytes = (size_t)64 << 20;
    if ((e = cudaMalloc(&c->lt_ws, c->lt_ws_bytes)) != cudaSuccess)
        return dc_cuda_fail_alloc("the matrix-product workspace", c->lt_ws_bytes, e);
    if ((e = cudaMalloc((void **)&c->red, 1024 * sizeof(double))) != cudaSuccess)
        return dc_cuda_fail_alloc("the reduction scratch", 1024 * sizeof(double), e);
    if ((e = cudaMalloc((void **)&c->norm_ws, DC_CUDA_NORM_WS_ALL * sizeof(double))) != cudaSuccess)
        return dc_cuda_fail_alloc("the normalisation workspace", DC_CUDA_NORM_WS * sizeof(double), e);
    if ((e = cudaMallocHost((void **)&c->ring, DC_CUDA_RING_BYTES)) != cudaSuccess) {
        cudaGetLastError();
        return dc_fail("%.1f MiB of pinned host memory for uploads could not be allocated (%s)",
                       DC_CUDA_RING_BYTES / 1048576.0, cudaGetErrorString(e));
    }
    for (int i = 0; i < 8 && e == cudaSuccess; i++) {
        e = cudaEventCreateWithFlags(&c->ring_ev[i], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(c->ring_ev[i], c->stream);
    }
    if (e != cudaSuccess)
        return cudaGetLastError(), dc_fail("the CUDA GPU could not be used (events: %s)", cudaGetErrorString(e));
    DC_TRY(dc_cuda_copy_start(c));
    if (o->profile) dc_cuda_prof_start(c);
    return 0;
}

static void *cu_stream(dc_backend *be) { return (void *)((dc_cuda_ctx *)be->ctx)->stream; }

extern "C" dc_backend *dc_backend_cuda_create_opts(bool fp32, const dc_backend_opts *opts) {
    const dc_backend_opts o = opts ? *opts : dc_backend_opts_default();
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        if (e == cudaSuccess || e == cudaErrorNoDevice) dc_fail("no CUDA GPU present");
        else if (e == cudaErrorInsufficientDriver)  // also what a machine without the driver reports
            dc_fail("no usable CUDA GPU: no NVIDIA driver, or one older than this build's CUDA (%s)",
                    cudaGetErrorString(e));
        else dc_fail("no usable CUDA GPU (%s)", cudaGetErrorString(e));
        return NULL;
    }
    dc_cuda_ctx *c = (dc_cuda_ctx *)calloc(1, sizeof *c);
    dc_backend *be = (dc_backend *)calloc(1, sizeof *be);
    if (!c || !be) {
        free(c), free(be);
        dc_fail("out of host memory creating the CUDA backend");
        return NULL;
    }
    be->ctx = c;
    if (start(c, &o) != 0) {
        cu_destroy(be);
        return NULL;
    }
    *be = (dc_backend){
        .name = fp32 ? "cuda-fp32" : "cuda",
        .ctx = c,
        .opts = o,
        .compute = fp32 ? DC_F32 : DC_BF16,
        .half_weights = false,  // the ops read weights in the compute dtype
        .alloc = cu_alloc,
        .free = cu_free,
        .upload = cu_upload,
        .download = cu_download,
        .copy = cu_copy,
        .zero = cu_zero,
        .cast = dc_cuda_cast,
        .sync = cu_sync,
        .status = cu_status,
        .destroy = cu_destroy,
        .reserve = cu_reserve,
        .linear_fwd = dc_cuda_linear_fwd,
        .linear_fwd_acc = dc_cuda_linear_fwd_acc,
        .linear_many_fwd = dc_cuda_linear_many_fwd,
        .linear_bwd = dc_cuda_linear_bwd,
        .linear_gelu_fwd = dc_cuda_linear_gelu_fwd,
        .linear_geglu_fwd = dc_cuda_linear_geglu_fwd,
        .linear_bwd_gelu = dc_cuda_linear_bwd_gelu,
        .gelu_fwd = dc_cuda_gelu_fwd,
        .gelu_bwd = dc_cuda_gelu_bwd,
        .silu_fwd = dc_cuda_silu_fwd,
        .silu_bwd = dc_cuda_silu_bwd,
        .axpy = dc_cuda_axpy,
        .clamp = dc_cuda_clamp,
        .add_rows = dc_cuda_add_rows,
        .ln_mod_fwd = dc_cuda_ln_mod_fwd,
        .ln_mod_bwd = dc_cuda_ln_mod_bwd,
        .gate_res_fwd = dc_cuda_gate_res_fwd,
        .gate_res_bwd = dc_cuda_gate_res_bwd,
        .attention_fwd = dc_cuda_attention_fwd,  // cuda_attention_op.cu checks the shape, picks the kernels
        .attention_bwd = dc_cuda_attention_bwd,
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
        .reserve_conv = dc_cuda_reserve_conv,
        .conv2d_fwd = dc_cuda_conv2d_fwd,
        .conv2d_fwd_res = dc_cuda_conv2d_fwd_res,
        .conv2d_bwd = dc_cuda_conv2d_bwd,
        .group_norm_fwd = dc_cuda_group_norm_fwd,
        .group_norm_bwd = dc_cuda_group_norm_bwd,
        .layer_norm_fwd = dc_cuda_layer_norm_fwd,
        .layer_norm_bwd = dc_cuda_layer_norm_bwd,
        .upsample2x_fwd = dc_cuda_upsample2x_fwd,
        .upsample2x_bwd = dc_cuda_upsample2x_bwd,
        .geglu_fwd = dc_cuda_geglu_fwd,
        .geglu_bwd = dc_cuda_geglu_bwd,
        .activation_fwd = dc_cuda_activation_fwd,
        .activation_bwd = dc_cuda_activation_bwd,
        .transpose = dc_cuda_transpose,
        .add_channel = dc_cuda_add_channel,
        .channel_sum = dc_cuda_channel_sum,
        .group_norm_nhwc_fwd = dc_cuda_group_norm_nhwc_fwd,
        .group_norm_nhwc_apply = dc_cuda_group_norm_nhwc_apply,
        .upsample2x_nhwc_fwd = dc_cuda_upsample2x_nhwc_fwd,
        .add_nhwc = dc_cuda_add_nhwc,
        .concat_channels = dc_cuda_concat_channels,
        .group_norm_nhwc_bwd = dc_cuda_group_norm_nhwc_bwd,
        .upsample2x_nhwc_bwd = dc_cuda_upsample2x_nhwc_bwd,
        .channel_sum_nhwc = dc_cuda_channel_sum_nhwc,
        .split_channels = dc_cuda_split_channels,
        .memory = cu_memory, .set_memory_cap = cu_set_memory_cap,
        .graph_capture = cu_graph_capture,
        .graph_launch = cu_graph_launch,
        .graph_free = cu_graph_free,
        .graph_valid = cu_graph_valid,
        .gemm_peak = dc_cuda_gemm_peak,
        .energy = dc_cuda_energy,
        .freeze_weights = dc_cuda_freeze_weights,
        .stream = cu_stream,
        .alloc_pinned = dc_cuda_alloc_pinned,
        .free_pinned = dc_cuda_free_pinned,
        .copy_async = dc_cuda_copy_async,
        .host_wait = dc_cuda_host_wait,
        .wait_ticket = dc_cuda_wait_ticket,
        .profile_restart = dc_cuda_prof_restart,
    };
    return be;
}
