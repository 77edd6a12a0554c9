// The CUDA backend's private interface: its context and the op functions
// that cuda_backend.cu puts in the dc_backend table. Each .cu file holds one
// family of ops; all run on the context's one stream, asynchronously.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

#define DC_CUDA_RING_BYTES ((size_t)32 << 20)  // pinned staging for uploads

// Events of the asynchronous copy ring (copy_async's tickets).
#define DC_CUDA_COPY_EVENTS 256

// Doubles in the normalisation workspace (group and layer norm partial sums):
// all of it for the channels-last group norm's partials, the first
// DC_CUDA_NORM_WS for every other op's.
#define DC_CUDA_NORM_WS ((int64_t)1 << 19)
#define DC_CUDA_NORM_WS_ALL ((int64_t)1 << 21)

typedef struct dc_gemm_plan dc_gemm_plan;
typedef struct dc_conv_plan dc_conv_plan;
typedef struct dc_sdpa_plan dc_sdpa_plan;
typedef struct { void *p; size_t bytes; } dc_cuda_alloc_rec;
typedef struct dc_cuda_prof dc_cuda_prof;

typedef struct {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;              // cuBLASLt workspace
    size_t lt_ws_bytes;
    dc_gemm_plan *plans;      // cached matmul descriptors and algorithms
    int nplans, cap_plans;
    double *red;              // reduction scratch (gradient-norm partials)
    double *norm_ws;          // [DC_CUDA_NORM_WS_ALL] group / layer norm partial sums
    cudnnHandle_t dnn;        // cuDNN, started by the first reserve_conv
    dc_conv_plan *conv_plans; // cached conv descriptors and algorithms
    int nconv_plans, cap_conv_plans;
    void *conv_ws;            // cuDNN's workspace (grown by reserve_conv)
    size_t conv_ws_bytes;
    dc_sdpa_plan *sdpa;       // cuDNN's attention plans (cuda_attention_cudnn.cu)
    int nsdpa, cap_sdpa;
    void *sdpa_ws;            // their workspace and the backward's row sums (grown as plans are made)
    size_t sdpa_ws_bytes;
    bool frozen;              // freeze_weights: the weights do not change (an inference pipeline's life)
    struct dc_wino_u *wino_u; // then, Winograd's transformed weights by their weights' address
    int nwino_u, cap_wino_u;
    size_t wino_u_bytes;
    void *conv_scratch;       // conv weight and bias gradients, padded inputs (grown by reserve_conv)
    size_t conv_scratch_bytes;
    char *ring;               // pinned upload staging ring
    size_t ring_head;
    cudaEvent_t ring_ev[8];   // the last copy out of each eighth of the ring
    // Copies between device and pinned host memory beside the ops
    // (copy_async, cuda_copy.cu): a stream a direction ([0] up, [1] down),
    // which first waits for the ops queued so far (copy_after), and a ring of
    // events a direction, the copy seq recorded in copy_ev[d][seq %
    // DC_CUDA_COPY_EVENTS]. A slot reused by a later copy makes a wait on the
    // older ticket wait for the later one too: longer, never wrong.
    cudaStream_t copy_stream[2];
    cudaEvent_t copy_after;
    cudaEvent_t copy_ev[2][DC_CUDA_COPY_EVENTS];
    int64_t copies[2];        // copies issued a direction
    dc_cuda_alloc_rec *allocs;     // live allocations
    int nallocs, cap_allocs;
    size_t bytes_now;              // device memory we hold in tensors (the workspaces apart)
    size_t bytes_peak;             // the most of it and the workspaces together
    size_t cap;                    // a hard cap on it, workspaces included (0: none)
    uint64_t frees;           // device buffers freed or replaced so far (a graph's validity)
    bool failed;              // an op has failed: err says how, and nothing runs any more
    char err[512];
    dc_cuda_prof *prof;       // opts.profile: per-op GPU time (cuda_profile.cu), else NULL
    bool pdl;                 // dc_launch may overlap a launch with the kernel ahead (Hopper)
} dc_cuda_ctx;

static inline dc_cuda_ctx *dc_cuda(dc_backend *be) { return (dc_cuda_ctx *)be->ctx; }

#ifdef __cplusplus
extern "C" {
#endif

// Errors. Ops return nothing and run asynchronously, like the CUDA calls
// inside them, so a failure is recorded in the backend's context rather than
// returned: the first one is kept (CUDA's text, the op, file:line), every op
// called afterwards returns at once without touching the device, and
// dc_backend_status() hands the message to the caller. The record belongs to
// the context, not to the process, so another backend (a second GPU, or a
// fresh one after an error that left the device usable) is unaffected. It is
// never cleared: the op sequence was cut short, so no buffer it was to write
// can be trusted. A kernel's own fault (an illegal address) surfaces at the
// next check, so the op named is where it was seen, not always its cause
// (CUDA_LAUNCH_BLOCKING=1 makes them the same). Each macro records and then
// returns from the calling function (with `ret` where that has a value).
void dc_cuda_record(dc_backend *be, const char *func, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static inline bool dc_cuda_ok(dc_backend *be, cudaError_t e, const char *call, const char *func,
                              const char *file, int line) {
    if (e == cudaSuccess) return true;
    cudaGetLastError();  // else a later check would find this error again, even on another backend
    dc_cuda_record(be, func, file, line, "CUDA error: %s, from %s", cudaGetErrorString(e), call);
    return false;
}
#define DC_CUDA_OR(be, ret, call)                                                   \
    do {                                                                            \
        if (!dc_cuda_ok((be), (call), #call, __func__, __FILE__, __LINE__)) return ret; \
    } while (0)
#define DC_CUDA(be, call) DC_CUDA_OR(be, , call)
// After a launch: catches bad launch configurations (and any error an
// earlier kernel left behind) with a host call, no wait.
#define DC_CUDA_LAUNCHED(be) DC_CUDA(be, cudaGetLastError())
// Records a failure of the op's own (a shape or dtype it cannot run) and returns.
#define DC_CUDA_FAIL(be, ...)                                                       \
    do {                                                                            \
        dc_cuda_record((be), __func__, __FILE__, __LINE__, __VA_ARGS__);            \
        return;                                                                     \
    } while (0)
// First line of every op: nothing runs on a backend that has failed (and,
// when profiling, the op's start is marked); DC_CUDA_OP_OR for an op that
// returns ret then.
#define DC_CUDA_OP_OR(be, ret)                                                      \
    do {                                                                            \
        if (dc_cuda(be)->failed) return ret;                                        \
        if (dc_cuda(be)->prof) dc_cuda_prof_mark(dc_cuda(be), __func__);            \
    } while (0)
#define DC_CUDA_OP(be) DC_CUDA_OP_OR(be, )
void dc_cuda_prof_start(dc_cuda_ctx *c);
void dc_cuda_prof_mark(dc_cuda_ctx *c, const char *op);
void dc_cuda_prof_report(dc_cuda_ctx *c);
void dc_cuda_prof_restart(dc_backend *be);
#define DC_CUDA_PROF_GRAPH_LAUNCH "(graph launches: their ops are listed)"
void dc_cuda_prof_capture_begin(dc_cuda_ctx *c);
void dc_cuda_prof_capture_end(dc_cuda_ctx *c, void *exec);  // exec NULL: the capture failed
void dc_cuda_prof_graph_ran(dc_cuda_ctx *c, void *exec);
void dc_cuda_prof_graph_free(dc_cuda_ctx *c, void *exec);

// Fails (-1, message set) for memory the GPU could not give: how much was
// asked for, for what, and how much is free. Not recorded: the backend stays usable.
int dc_cuda_fail_alloc(const char *what, size_t bytes, cudaError_t e);
// Replaces *p by a buffer of `bytes` if it is smaller (grow-only; the old one
// is freed once the work that uses it is done): 0, or -1 with a message if
// the GPU cannot give it (the old one is gone then too).
int dc_cuda_grow(dc_cuda_ctx *c, void **p, size_t *have, size_t bytes, const char *what);
// Whether `more` bytes fit under the memory cap (set_memory_cap), and the
// same failing with a message naming `what` where they do not.
bool dc_cuda_fits_cap(const dc_cuda_ctx *c, size_t more);
int dc_cuda_check_cap(const dc_cuda_ctx *c, size_t more, const char *what);
// Records the tensors and workspaces held now toward the peak.
void dc_cuda_note_peak(dc_cuda_ctx *c);

// ---- copies beside the ops (cuda_copy.cu) ----
// The copy stream and its events (0, or -1 with a message); freed by dc_cuda_copy_free.
int dc_cuda_copy_start(dc_cuda_ctx *c);
void dc_cuda_copy_free(dc_cuda_ctx *c);
void *dc_cuda_alloc_pinned(dc_backend *be, size_t bytes);
void dc_cuda_free_pinned(dc_backend *be, void *p);
int64_t dc_cuda_copy_async(dc_backend *be, void *dst, const void *src, size_t bytes, bool to_host);
int dc_cuda_host_wait(dc_backend *be, int64_t ticket);
void dc_cuda_wait_ticket(dc_backend *be, int64_t ticket);

// ---- matrix products (cuda_linear.cu) ----
void dc_cuda_linear_fwd(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K, int N);
void dc_cuda_linear_fwd_acc(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K,
                            int N);
void dc_cuda_linear_bwd(dc_backend *be, dc_buf dinp, dc_buf dw, dc_buf db, dc_buf dout, dc_buf inp,
                        dc_buf w, int M, int K, int N, int flags);
void dc_cuda_linear_many_fwd(dc_backend *be, const dc_linear_job *jobs, int n, dc_buf inp, int M, int K);
bool dc_cuda_linear_geglu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b, int M,
                              int K, int F);
// The fused kernel on Hopper (cuda_geglu_sm90.cu): true where it ran, false
// (nothing launched) where the device or the call does not fit it.
bool dc_cuda_geglu_linear_sm90(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K, int F);
void dc_cuda_linear_gelu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b, int M,
                             int K, int N);
void dc_cuda_linear_bwd_gelu(dc_backend *be, dc_buf dpre, dc_buf dw, dc_buf db, dc_buf dout, dc_buf act, dc_buf w,
                             dc_buf pre, dc_buf scratch, int M, int K, int N);
void dc_cuda_gemm_free(dc_cuda_ctx *c);
// Times a large bf16 (or fp32) product and returns its TFLOP/s: the peak MFU is measured against.
double dc_cuda_gemm_peak(dc_backend *be);
// batch column-major products D_i[m,n] = alpha op(A_i) op(B_i), the i-th
// operands sa, sb, sd elements after the first (cuBLASLt, fp32 accumulation).
void dc_cuda_gemm_strided(dc_backend *be, int m, int n, int k, const void *A, int lda, int64_t sa, bool ta,
                          const void *B, int ldb, int64_t sb, bool tb, void *D, int ldd, int64_t sd, dc_dtype ab,
                          dc_dtype d, int batch, float alpha);
bool dc_cuda_energy(dc_backend *be, double *joules, double *limit_w);

// ---- pointwise and embeddings (cuda_pointwise.cu) ----
void dc_cuda_cast(dc_backend *be, dc_buf dst, dc_buf src, int64_t n);
void dc_cuda_gelu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n);
void dc_cuda_gelu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n);
void dc_cuda_silu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n);
void dc_cuda_silu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n, bool accumulate);
void dc_cuda_axpy(dc_backend *be, dc_buf y, dc_buf x, float alpha, int64_t n);
void dc_cuda_clamp(dc_backend *be, dc_buf x, int64_t n, float lo, float hi);
void dc_cuda_add_rows(dc_backend *be, dc_buf x, dc_buf pos, int B, int T, int D);
void dc_cuda_patchify(dc_backend *be, dc_buf out, dc_buf img, int B, int C, int H, int W, int p);
void dc_cuda_unpatchify_fwd(dc_backend *be, dc_buf img, dc_buf tok, int B, int C, int H, int W, int p);
void dc_cuda_unpatchify_bwd(dc_backend *be, dc_buf dtok, dc_buf dimg, int B, int C, int H, int W, int p);
void dc_cuda_timestep_embed(dc_backend *be, dc_buf out, dc_buf t, int B, int half);
void dc_cuda_embed_fwd(dc_backend *be, dc_buf out, dc_buf table, dc_buf idx, int B, int D);
void dc_cuda_embed_bwd(dc_backend *be, dc_buf dtable, dc_buf dout, dc_buf idx, int B, int D);
// out[M,N] += b[N] (bias added outside a matrix product); db[N] += sum_m dout[m, :]
// (= if set)
void dc_cuda_add_bias(dc_backend *be, dc_buf out, dc_buf b, int M, int N);
void dc_cuda_bias_grad(dc_backend *be, dc_buf db, dc_buf dout, int M, int N, bool set);

// ---- latent diffusion pointwise ops (cuda_pointwise.cu) ----
void dc_cuda_activation_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n, dc_act act);
void dc_cuda_activation_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n, dc_act act,
                            bool accumulate);
void dc_cuda_geglu_fwd(dc_backend *be, dc_buf out, dc_buf x, int64_t M, int F);
void dc_cuda_geglu_bwd(dc_backend *be, dc_buf dx, dc_buf out, dc_buf dout, dc_buf x, int64_t M, int F);
void dc_cuda_upsample2x_fwd(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W);
void dc_cuda_upsample2x_bwd(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W);
void dc_cuda_transpose(dc_backend *be, dc_buf out, dc_buf x, int B, int64_t M, int64_t N);
void dc_cuda_add_channel(dc_backend *be, dc_buf x, dc_buf v, int B, int C, int64_t HW);
void dc_cuda_channel_sum(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW);

// ---- channels-last maps (cuda_pointwise.cu; group norm in cuda_group_norm.cu) ----
void dc_cuda_upsample2x_nhwc_fwd(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W);
void dc_cuda_add_nhwc(dc_backend *be, dc_buf x, dc_buf y, dc_buf v, dc_buf bias, int B, int C, int64_t HW);
void dc_cuda_concat_channels(dc_backend *be, dc_buf out, dc_buf a, int C1, dc_buf b, int C2, int64_t M);
void dc_cuda_upsample2x_nhwc_bwd(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W);
void dc_cuda_channel_sum_nhwc(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW);
void dc_cuda_split_channels(dc_backend *be, dc_buf a, int C1, dc_buf b, int C2, dc_buf x, int64_t M);
void dc_cuda_group_norm_nhwc_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout, dc_buf x,
                                 dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B, int C, int64_t HW,
                                 int G, bool silu, int flags);

// ---- convolutions through cuDNN (cuda_conv.cu) ----
int dc_cuda_reserve_conv(dc_backend *be, const dc_conv2d_shape *s, bool backward);
// Winograd's F(4x4, 3x3) forward (cuda_conv_winograd.cu): the workspace bytes
// it needs for shape s in dtype dt (0: the shape runs on cuDNN), and the
// convolution itself, false (nothing done) where it does not apply or the
// workspace is short.
size_t dc_cuda_winograd_ws(const dc_backend *be, const dc_conv2d_shape *s, dc_dtype dt);
bool dc_cuda_conv_winograd(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, const dc_conv2d_shape *s);
void dc_cuda_freeze_weights(dc_backend *be, bool frozen);
void dc_cuda_wino_free(dc_cuda_ctx *c);  // the kept transforms, at unfreeze and teardown
void dc_cuda_conv2d_fwd(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, const dc_conv2d_shape *s);
void dc_cuda_conv2d_fwd_res(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, dc_buf r,
                            const dc_conv2d_shape *s);
void dc_cuda_conv2d_bwd(dc_backend *be, dc_buf dx, dc_buf dw, dc_buf db, dc_buf dout, dc_buf x, dc_buf w,
                        const dc_conv2d_shape *s, int flags);
// Releases the plans, cuDNN and the conv workspaces.
void dc_cuda_conv_free(dc_cuda_ctx *c);
// Starts cuDNN on the backend's stream if it is not running: 0, or -1 with a message.
int dc_cuda_dnn_start(dc_cuda_ctx *c);
// Releases cuDNN's attention plans and workspace (before dc_cuda_conv_free ends cuDNN).
void dc_cuda_attention_cudnn_free(dc_cuda_ctx *c);

// ---- group norm (cuda_group_norm.cu) and affine layer norm (cuda_layer_norm.cu) ----
void dc_cuda_group_norm_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                            dc_buf beta, int B, int C, int64_t HW, int G, float eps, bool silu);
void dc_cuda_group_norm_nhwc_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                                 dc_buf beta, int B, int C, int64_t HW, int G, float eps, bool silu);
void dc_cuda_group_norm_nhwc_apply(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                                   dc_buf beta, int B, int C, int64_t HW, int G, bool silu);
void dc_cuda_group_norm_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout, dc_buf x,
                            dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G,
                            bool silu, int flags);
void dc_cuda_layer_norm_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                            dc_buf beta, int64_t M, int D, float eps);
void dc_cuda_layer_norm_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout, dc_buf x,
                            dc_buf mean, dc_buf rstd, dc_buf gamma, int64_t M, int D, int flags);

// ---- adaLN (cuda_adaln.cu) ----
void dc_cuda_ln_mod_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf mod,
                        int B, int T, int D, int nchunk, int ch_shift, int ch_scale);
void dc_cuda_ln_mod_bwd(dc_backend *be, dc_buf dx, dc_buf dmod, dc_buf dout, dc_buf x, dc_buf mean,
                        dc_buf rstd, dc_buf mod, int B, int T, int D, int nchunk, int ch_shift,
                        int ch_scale);
void dc_cuda_gate_res_fwd(dc_backend *be, dc_buf out, dc_buf x, dc_buf y, dc_buf mod, int B, int T, int D,
                          int nchunk, int ch_gate);
void dc_cuda_gate_res_bwd(dc_backend *be, dc_buf dy, dc_buf dmod, dc_buf dx, dc_buf y, dc_buf mod,
                          int B, int T, int D, int nchunk, int ch_gate);

// ---- attention (cuda_attention_op.cu) ----
void dc_cuda_attention_fwd(dc_backend *be, dc_buf out, dc_buf lse, dc_buf q, dc_buf k, dc_buf v,
                           const dc_attn_shape *s);
void dc_cuda_attention_bwd(dc_backend *be, dc_buf dq, dc_buf dk, dc_buf dv, dc_buf dout, dc_buf q,
                           dc_buf k, dc_buf v, dc_buf out, dc_buf lse, const dc_attn_shape *s);
int dc_cuda_attention_reserve(dc_backend *be, int max_tokens, int head_dim);

// ---- diffusion (cuda_diffusion.cu) ----
void dc_cuda_randn(dc_backend *be, dc_buf out, const uint32_t *keys, int B, int64_t n, uint64_t seed,
                   uint32_t step, uint32_t stream);
void dc_cuda_q_sample(dc_backend *be, dc_buf xt, dc_buf x0, dc_buf eps, const float *a, const float *s,
                      int B, int64_t n);
void dc_cuda_diffusion_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0,
                            dc_buf xt, dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                            int64_t HW, float grad_scale);
void dc_cuda_cfg_combine(dc_backend *be, dc_buf dst, dc_buf model_out, int B, int OC, int64_t HW,
                         int guided, float scale);
void dc_cuda_sampler_step(dc_backend *be, dc_buf x, dc_buf out, dc_buf z, const dc_step_coef *coef,
                          int B, int C, int OC, int64_t HW);

// ---- optimisation (cuda_optim.cu) ----
void dc_cuda_adamw(dc_backend *be, dc_buf p, dc_buf grad, dc_buf m, dc_buf v, dc_buf ema, dc_buf pc,
                   dc_buf scale, int64_t n, const dc_adamw_step *h);
void dc_cuda_grad_norm(dc_backend *be, dc_buf out, dc_buf g, int64_t n, float max_norm);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
// Launches kernel k on the backend's stream, where the device allows with
// programmatic dependent launch: k must call dc_pdl_enter() (cuda_common.h)
// before it touches global memory. A failed launch is recorded, as
// DC_CUDA_LAUNCHED records one.
template <typename... P, typename... A>
static inline void dc_launch(dc_backend *be, void (*k)(P...), dim3 grid, dim3 block, size_t smem, A... args) {
    dc_cuda_ctx *c = dc_cuda(be);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = c->stream;
    cfg.attrs = at, cfg.numAttrs = c->pdl ? 1 : 0;
    dc_cuda_ok(be, cudaLaunchKernelEx(&cfg, k, args...), "cudaLaunchKernelEx", __func__, __FILE__, __LINE__);
}
#endif
