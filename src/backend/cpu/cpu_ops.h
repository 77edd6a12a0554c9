// Private to the CPU backend: the op functions that fill its dc_backend table
// (signatures exactly as the function pointers in backend.h), its context,
// and the helpers the op files share.
#pragma once
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

// Without -ffast-math glibc does not declare the SIMD variants of its libm
// functions, so every loop calling expf or tanhf (GELU, softmax) runs scalar
// and costs 10x more than the GEMMs around it. Declaring the vector variants
// that libmvec exports (linked through -lm) lets `#pragma omp simd` loops
// vectorise them. tanhf's variant appeared in glibc 2.35.
#if defined(__x86_64__) && defined(__GLIBC__) && defined(_OPENMP)
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#if __GLIBC_PREREQ(2, 35)
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#endif
#endif

// Loops shorter than this run on one thread: a parallel region costs a few
// microseconds, more than the loop itself.
#define DC_CPU_PAR_MIN 32768

// Elementwise loops over n values run as fixed blocks of DC_CPU_BLOCK values,
// each one `omp simd` loop. Which values land in a vector body and which in a
// scalar tail (where libm's scalar expf may differ from libmvec's in the last
// bit) then depends on n alone, so results are the same for any thread count.
#define DC_CPU_BLOCK 4096

// The weight scratch's slots (cpu_weights.c): a matrix, kernel or table;
// a bias or a norm's scale; a norm's shift.
enum { DC_CPU_WIDE_W, DC_CPU_WIDE_B, DC_CPU_WIDE_B2, DC_CPU_WIDE_SLOTS };

// Backend state: per-thread scratch, grown on demand and kept between calls
// so ops do not allocate in the training step.
typedef struct {
    float *scratch;        // [nthreads, scratch_per_thread]
    size_t scratch_per_thread;
    int scratch_threads;
    float *conv_ws;        // im2col columns of one band, shared by all threads (cpu_conv.c)
    size_t conv_ws_floats;
    // F16/BF16 weights widened for the op reading them, one slot per operand,
    // each grown to the largest weight it has held (cpu_weights.c).
    float *wide[DC_CPU_WIDE_SLOTS];
    size_t wide_floats[DC_CPU_WIDE_SLOTS];
    char error[512];       // the first failure of an op (status), "" while none
} dc_cpu_ctx;

// The F32 data of a buffer. Activations are F32 on the CPU: another dtype is a
// bug in the caller, not bad input. (Weights may be F16 or BF16: dc_cpu_weight.)
static inline float *dc_cpu_f32(dc_buf b) {
    assert(b.dt == DC_F32 && "the CPU backend computes in F32 only");
    return (float *)b.p;
}

// With DC_BWD_DW_SET, a backward's weight and bias gradients (nw and nb
// values, where present) start from zero: the ops then add as always, which
// writes the same bits.
static inline void dc_cpu_grad_clear(dc_buf dw, int64_t nw, dc_buf db, int64_t nb, int flags) {
    if (!(flags & DC_BWD_DW_SET)) return;
    if (dw.p) memset(dc_cpu_f32(dw), 0, (size_t)nw * sizeof(float));
    if (db.p) memset(dc_cpu_f32(db), 0, (size_t)nb * sizeof(float));
}

// ---- weights kept as loaded (cpu_weights.c) -----------------------------------
// The n values of weight buffer w as F32: w itself when it is F32; F16 or BF16
// (inference weights kept as loaded, be->half_weights) widened exactly into
// the backend's weight scratch `slot` (DC_CPU_WIDE_*), valid until the next
// call for that slot. So an op computes the same bits from either storage.
// NULL when the scratch cannot be had: the failure is recorded for status and
// the op leaves its outputs as they are.
const float *dc_cpu_weight(dc_backend *be, dc_buf w, int64_t n, int slot);
// dst[n] = the F32, F16 or BF16 values at src (of dtype dt), widened exactly;
// on every thread when n is large (call it outside parallel regions).
void dc_cpu_widen(float *dst, const void *src, dc_dtype dt, int64_t n);
// Records an op's failure (the first one stays) for status to report.
void dc_cpu_fail(dc_backend *be, const char *fmt, ...) DC_PRINTF(2, 3);

// Mean and biased variance of x[0, n), in double, in two passes (mean, then
// squared deviations): the statistics of LayerNorm, adaLN and GroupNorm.
static inline void dc_cpu_moments(const float *x, int64_t n, double *mean, double *var) {
    double s = 0.0, ss = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += x[i];
    const double mu = s / (double)n;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; i++) ss += (x[i] - mu) * (x[i] - mu);
    *mean = mu, *var = ss / (double)n;
}

// The per-thread scratch (`per_thread` floats at most) for a parallel op:
// returns the base; thread t uses base + t * stride (*stride set here). Called
// outside parallel regions; the workspace was allocated by be->reserve.
float *dc_cpu_scratch(dc_backend *be, size_t per_thread, size_t *stride);

// Puts OpenBLAS in single-threaded mode: OpenMP threads call it on slices
// of each product, so there is one thread pool. Nothing else in the process
// should raise OpenBLAS's thread count while a CPU backend is in use.
void dc_cpu_blas_init(void);

// ---- dense layers (cpu_linear.c) ----------------------------------------------
void dc_cpu_linear_fwd(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K,
                       int N);
void dc_cpu_linear_fwd_acc(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b, int M, int K,
                           int N);
void dc_cpu_linear_bwd(dc_backend *be, dc_buf dinp, dc_buf dw, dc_buf db, dc_buf dout,
                       dc_buf inp, dc_buf w, int M, int K, int N, int flags);

// ---- pointwise and embeddings (cpu_pointwise.c) -------------------------------
void dc_cpu_gelu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n);
void dc_cpu_gelu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n);
void dc_cpu_silu_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n);
void dc_cpu_silu_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n,
                     bool accumulate);
void dc_cpu_axpy(dc_backend *be, dc_buf y, dc_buf x, float alpha, int64_t n);
void dc_cpu_clamp(dc_backend *be, dc_buf x, int64_t n, float lo, float hi);
void dc_cpu_add_rows(dc_backend *be, dc_buf x, dc_buf pos, int B, int T, int D);
void dc_cpu_patchify(dc_backend *be, dc_buf out, dc_buf img, int B, int C, int H, int W, int p);
void dc_cpu_unpatchify_fwd(dc_backend *be, dc_buf img, dc_buf tok, int B, int C, int H, int W,
                           int p);
void dc_cpu_unpatchify_bwd(dc_backend *be, dc_buf dtok, dc_buf dimg, int B, int C, int H, int W,
                           int p);
void dc_cpu_timestep_embed(dc_backend *be, dc_buf out, dc_buf t, int B, int half);
void dc_cpu_embed_fwd(dc_backend *be, dc_buf out, dc_buf table, dc_buf idx, int B, int D);
void dc_cpu_embed_bwd(dc_backend *be, dc_buf dtable, dc_buf dout, dc_buf idx, int B, int D);

// ---- adaLN-Zero (cpu_adaln.c) -------------------------------------------------
void dc_cpu_ln_mod_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                       dc_buf mod, int B, int T, int D, int nchunk, int ch_shift, int ch_scale);
void dc_cpu_ln_mod_bwd(dc_backend *be, dc_buf dx, dc_buf dmod, dc_buf dout, dc_buf x,
                       dc_buf mean, dc_buf rstd, dc_buf mod, int B, int T, int D, int nchunk,
                       int ch_shift, int ch_scale);
void dc_cpu_gate_res_fwd(dc_backend *be, dc_buf out, dc_buf x, dc_buf y, dc_buf mod, int B, int T,
                         int D, int nchunk, int ch_gate);
void dc_cpu_gate_res_bwd(dc_backend *be, dc_buf dy, dc_buf dmod, dc_buf dx, dc_buf y,
                         dc_buf mod, int B, int T, int D, int nchunk, int ch_gate);

// ---- attention (cpu_attention.c) ----------------------------------------------
void dc_cpu_attention_fwd(dc_backend *be, dc_buf out, dc_buf lse, dc_buf q, dc_buf k, dc_buf v,
                          const dc_attn_shape *s);
void dc_cpu_attention_bwd(dc_backend *be, dc_buf dq, dc_buf dk, dc_buf dv, dc_buf dout, dc_buf q,
                          dc_buf k, dc_buf v, dc_buf out, dc_buf lse, const dc_attn_shape *s);
// Floats of per-thread scratch attention needs for sequences up to max_tokens.
size_t dc_cpu_attn_scratch(int max_tokens);

// ---- convolution (cpu_conv.c) -------------------------------------------------
// The im2col workspace (floats) the conv of shape s needs, in either layout;
// 0 for a 1x1, stride-1, unpadded conv.
size_t dc_cpu_conv_ws_floats(const dc_conv2d_shape *s);
void dc_cpu_conv2d_fwd(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b,
                       const dc_conv2d_shape *s);
void dc_cpu_conv2d_fwd_res(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, dc_buf r,
                           const dc_conv2d_shape *s);
void dc_cpu_conv2d_bwd(dc_backend *be, dc_buf dx, dc_buf dw, dc_buf db, dc_buf dout, dc_buf x,
                       dc_buf w, const dc_conv2d_shape *s, int flags);

// ---- group norm and affine layer norm (cpu_norm.c) ----------------------------
void dc_cpu_group_norm_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                           dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G, float eps,
                           bool silu);
void dc_cpu_group_norm_nhwc_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                                dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G,
                                float eps, bool silu);
void dc_cpu_group_norm_nhwc_apply(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                                  dc_buf beta, int B, int C, int64_t HW, int G, bool silu);
void dc_cpu_group_norm_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                           dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B,
                           int C, int64_t HW, int G, bool silu, int flags);
void dc_cpu_group_norm_nhwc_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta,
                                dc_buf dout, dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma,
                                dc_buf beta, int B, int C, int64_t HW, int G, bool silu,
                                int flags);
void dc_cpu_layer_norm_fwd(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                           dc_buf gamma, dc_buf beta, int64_t M, int D, float eps);
void dc_cpu_layer_norm_bwd(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                           dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, int64_t M, int D,
                           int flags);

// ---- latent-diffusion pointwise ops (cpu_pointwise.c) --------------------------
void dc_cpu_upsample2x_fwd(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W);
void dc_cpu_upsample2x_bwd(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W);
void dc_cpu_transpose(dc_backend *be, dc_buf out, dc_buf x, int B, int64_t M, int64_t N);
void dc_cpu_add_channel(dc_backend *be, dc_buf x, dc_buf v, int B, int C, int64_t HW);
void dc_cpu_channel_sum(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW);
void dc_cpu_geglu_fwd(dc_backend *be, dc_buf out, dc_buf x, int64_t M, int F);
void dc_cpu_geglu_bwd(dc_backend *be, dc_buf dx, dc_buf out, dc_buf dout, dc_buf x, int64_t M, int F);
void dc_cpu_activation_fwd(dc_backend *be, dc_buf out, dc_buf inp, int64_t n, dc_act act);
void dc_cpu_activation_bwd(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n,
                           dc_act act, bool accumulate);
void dc_cpu_upsample2x_nhwc_fwd(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W);
void dc_cpu_add_nhwc(dc_backend *be, dc_buf x, dc_buf y, dc_buf v, dc_buf bias, int B, int C, int64_t HW);
void dc_cpu_concat_channels(dc_backend *be, dc_buf out, dc_buf a, int C1, dc_buf b, int C2,
                            int64_t M);
void dc_cpu_upsample2x_nhwc_bwd(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W);
void dc_cpu_channel_sum_nhwc(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW);
void dc_cpu_split_channels(dc_backend *be, dc_buf a, int C1, dc_buf b, int C2, dc_buf x, int64_t M);

// ---- diffusion (cpu_diffusion.c) ----------------------------------------------
void dc_cpu_randn(dc_backend *be, dc_buf out, const uint32_t *keys, int B, int64_t n,
                  uint64_t seed, uint32_t step, uint32_t stream);
void dc_cpu_q_sample(dc_backend *be, dc_buf xt, dc_buf x0, dc_buf eps, const float *a,
                     const float *s, int B, int64_t n);
void dc_cpu_diffusion_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0,
                           dc_buf xt, dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                           int64_t HW, float grad_scale);
void dc_cpu_cfg_combine(dc_backend *be, dc_buf dst, dc_buf model_out, int B, int OC, int64_t HW,
                        int guided, float scale);
void dc_cpu_sampler_step(dc_backend *be, dc_buf x, dc_buf out, dc_buf z,
                         const dc_step_coef *coef, int B, int C, int OC, int64_t HW);

// ---- optimisation (cpu_optim.c) -----------------------------------------------
void dc_cpu_linear_many_fwd(dc_backend *be, const dc_linear_job *jobs, int n, dc_buf inp, int M, int K);
bool dc_cpu_linear_geglu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                             int M, int K, int F);
void dc_cpu_linear_gelu_fwd(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                            int M, int K, int N);
void dc_cpu_linear_bwd_gelu(dc_backend *be, dc_buf dpre, dc_buf dw, dc_buf db, dc_buf dout, dc_buf act,
                            dc_buf w, dc_buf pre, dc_buf scratch, int M, int K, int N);
void dc_cpu_adamw(dc_backend *be, dc_buf p, dc_buf grad, dc_buf m, dc_buf v, dc_buf ema,
                  dc_buf pc, dc_buf scale, int64_t n, const dc_adamw_step *h);
void dc_cpu_grad_norm(dc_backend *be, dc_buf out, dc_buf g, int64_t n, float max_norm);
void dc_cpu_cast(dc_backend *be, dc_buf dst, dc_buf src, int64_t n);
