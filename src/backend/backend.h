// The backend interface: memory and every op the engine runs on tensors.
//
// Models, diffusion and training code call only these functions, so a new
// device (CUDA next) is one more table of function pointers. Tensors are
// row-major in PyTorch's dimension order; shapes are passed explicitly
// (llm.c style) and buffers carry their dtype. Pointers marked "host" are
// ordinary CPU memory of a few numbers per sample; everything else lives on
// the backend. Unless a comment says "+=", outputs are overwritten.
// Ops are asynchronous with respect to the host except where they return a
// value to it (download); dc_backend_sync() waits for all of them.
//
// Errors. alloc and reserve fail at once (NULL or -1, message set). The ops
// return nothing: on a GPU a failure (a CUDA or cuBLASLt error, a shape or
// dtype the device cannot run) is only known later, as in CUDA itself, so
// the backend records the first one and every later op does nothing. After
// a sequence of ops, the caller checks dc_backend_status() before trusting
// any result, downloads included: after an error, download and sync leave
// their outputs undefined. The check is a host flag read, never a wait, so
// it belongs at the end of every function that runs ops (a model's forward,
// a sampling step, a training step). Errors a kernel raises while running
// surface at the next check after the device reports them (at the latest,
// the next download or sync). A backend that has failed stays failed:
// destroy it (a new one may work, e.g. after a shape error).
#pragma once
#include <stdbool.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "core/dtype.h"
#include "backend/op_math.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dc_backend dc_backend;

// Where attention finds a tensor: strides in elements between samples,
// tokens and heads; the values of one head are contiguous (stride 1).
typedef struct {
    int64_t batch, token, head;
} dc_attn_layout;

// One attention call. q [B, H, Tq, Dh], k [B, H, Tk, Dh], v [B, H, Tk, Dv],
// out [B, H, Tq, Dv], each in its own layout, so packed qkv [B,T,3D] (DiT),
// separate projections [B,T,D] and head-major [B,H,T,Dh] all run in place.
// causal: query i sees keys j <= i + (Tk - Tq) (aligned at the bottom right,
// as FlashAttention; with Tq == Tk, keys up to i); it needs Tq <= Tk so that
// every query sees a key. scale 0 means 1/sqrt(Dh).
typedef struct dc_attn_shape {
    int B, H, Tq, Tk, Dh, Dv;
    bool causal;
    float scale;
    dc_attn_layout q, k, v, out;
} dc_attn_shape;

// One of several products of the same input (linear_many_fwd):
// out[M, N] = inp @ w[N, K]^T + b[N] (b may be NULL).
typedef struct {
    dc_buf out, w, b;
    int N;
} dc_linear_job;

// The layout of H heads of Dh side by side in rows of `row` elements, T rows
// per sample: [B, T, row] with head h at column offset h*Dh.
static inline dc_attn_layout dc_attn_rows(int T, int64_t row, int Dh) {
    dc_attn_layout l;
    l.batch = (int64_t)T * row, l.token = row, l.head = Dh;
    return l;
}

// Self-attention over packed qkv[B,T,3D] ([q | k | v], each head-major, H
// heads of D/H) into out[B,T,D]: q, k, v are qkv, qkv + D and qkv + 2D.
static inline dc_attn_shape dc_attn_packed(int B, int T, int D, int H) {
    dc_attn_shape s;
    memset(&s, 0, sizeof s);
    s.B = B, s.H = H, s.Tq = s.Tk = T, s.Dh = s.Dv = D / H;
    s.q = s.k = s.v = dc_attn_rows(T, 3 * (int64_t)D, D / H);
    s.out = dc_attn_rows(T, D, D / H);
    return s;
}

static inline float dc_attn_scale(const dc_attn_shape *s) {
    return s->scale != 0.0f ? s->scale : 1.0f / sqrtf((float)s->Dh);
}

// How a backend is to run, given when it is created. The kernel paths below
// each won their measurement and are on by default; each has a path beneath it
// (cuDNN's, or the engine's portable kernels) that turning it off runs, so a
// test can hold the two against each other and a benchmark can compare them.
// The ops read these at every call: a test may switch a path between calls.
// The CPU backend has no choices and ignores them.
typedef struct {
    bool profile;              // time every op on the device; the table is printed at destroy
    bool attention_sm90;       // Hopper attention kernel (heads of 17-48), before cuDNN's
    bool attention_short;      // the kernel for at most 128 keys with heads of at most 48
    bool cudnn_attention;      // cuDNN's fused flash attention (off: the engine's kernels)
    bool cudnn_attention_bwd;  // its backward too (off: the engine's flash backward)
    bool geglu_sm90;           // Hopper GEGLU: the product and the gate in one kernel
    bool winograd;             // Winograd F(4x4, 3x3) for large bf16 3x3 convolutions
} dc_backend_opts;

// Turns off the paths named in a comma-separated list ("winograd,geglu_sm90":
// the field names above); 0, or -1 naming an unknown one.
int dc_backend_opts_disable(dc_backend_opts *o, const char *list);

// Every path on, no profile.
static inline dc_backend_opts dc_backend_opts_default(void) {
    dc_backend_opts o;
    memset(&o, 0, sizeof o);
    o.attention_sm90 = o.attention_short = o.cudnn_attention = o.cudnn_attention_bwd = true;
    o.geglu_sm90 = o.winograd = true;
    return o;
}

// The flags of linear_bwd and conv2d_bwd. DC_BWD_DX_ADD: the input's
// gradient is added to dx (a branch joining a stream), not written.
// DC_BWD_DW_SET: the weights' and bias's gradients are written, not added to
// (the first of a backward: their buffer need not be zeroed first). Writing
// rounds as adding to zero does, so both give the same bits.
enum { DC_BWD_DX_ADD = 1, DC_BWD_DW_SET = 2 };

struct dc_backend {
    const char *name;   // "cpu", "cuda"
    void *ctx;          // backend-private state
    dc_backend_opts opts;  // as given when created
    dc_dtype compute;   // dtype of activations it prefers (DC_F32 on the CPU)
    // Its ops also take F16 and BF16 weights and biases (widened exactly as they
    // read them) beside activations in `compute`, so inference weights may stay
    // as loaded (the CPU). false: weights come in `compute` (a GPU).
    bool half_weights;

    // ---- memory ------------------------------------------------------------
    void *(*alloc)(dc_backend *be, size_t bytes);  // NULL on failure (message set)
    void (*free)(dc_backend *be, void *p);
    void (*upload)(dc_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(dc_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(dc_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(dc_backend *be, void *dst, size_t bytes);
    // dst[n] = src[n] converted to dst's dtype (F32 <-> BF16, or a plain copy)
    void (*cast)(dc_backend *be, dc_buf dst, dc_buf src, int64_t n);
    void (*sync)(dc_backend *be);
    // 0, or -1 with the first recorded error as the message: what failed, in
    // which op, where ("CUDA error: <text>, from <call> in <op> (file:line)";
    // on the CPU, only scratch for widening half-precision weights can fail).
    // NULL where ops cannot fail late.
    int (*status)(dc_backend *be);
    void (*destroy)(dc_backend *be);
    // Allocates the ops' workspace for sequences of up to max_tokens with
    // attention heads of head_dim before any step runs, so no op allocates or
    // fails later. 0 or -1 (message set, e.g. a head size the device lacks).
    int (*reserve)(dc_backend *be, int max_tokens, int head_dim);

    // ---- dense layers --------------------------------------------------------
    // out[M,N] = inp[M,K] @ w[N,K]^T + b[N]   (b may be NULL)
    void (*linear_fwd)(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b,
                       int M, int K, int N);
    // out[M,N] += inp @ w^T + b (b may be NULL): a residual added in the product's
    // epilogue instead of in a pass of its own.
    void (*linear_fwd_acc)(dc_backend *be, dc_buf out, dc_buf inp, dc_buf w, dc_buf b,
                           int M, int K, int N);
    // Several products of one inp[M,K], jobs[i].out = inp @ jobs[i].w^T +
    // jobs[i].b (a UNet's time projections: few rows, many small weights).
    // One kernel on a GPU where the rows are few, else one product a job.
    void (*linear_many_fwd)(dc_backend *be, const dc_linear_job *jobs, int n, dc_buf inp, int M, int K);
    // dinp[M,K] = dout @ w (skipped if dinp.p is NULL; += with DC_BWD_DX_ADD)
    // dw[N,K] += dout^T @ inp ; db[N] += sum_m dout (skipped if NULL; = with
    // DC_BWD_DW_SET). flags: DC_BWD_* (true reads as DC_BWD_DX_ADD).
    void (*linear_bwd)(dc_backend *be, dc_buf dinp, dc_buf dw, dc_buf db, dc_buf dout,
                       dc_buf inp, dc_buf w, int M, int K, int N, int flags);

    // The MLP's fc1 with its GELU: pre = inp @ w^T + b, out = gelu_tanh(pre)
    // (pre is kept for backward). One product with a fused epilogue on a GPU.
    void (*linear_gelu_fwd)(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                            int M, int K, int N);
    // The GEGLU feed-forward's first product and gate: out[M,F] = h * gelu_erf(g)
    // where [h | g] = inp @ w^T + b, w [2F,K], b [2F] (may be NULL). pre
    // [M,2F] is scratch the backend may use for [h | g] (one product with the
    // gate in its epilogue on a Hopper GPU writes none); its contents after
    // the op are unspecified. With pre none, the op runs only where the
    // backend gates in the product (no scratch); it returns whether it ran.
    bool (*linear_geglu_fwd)(dc_backend *be, dc_buf out, dc_buf pre, dc_buf inp, dc_buf w, dc_buf b,
                             int M, int K, int F);
    // Backward of out = fc2(gelu(pre)) down to pre, for fc2 of shape [N,K]:
    // dpre[M,K] = (dout @ w) * gelu'(pre); dw += dout^T @ act; db += sum_m dout,
    // where act = gelu(pre) was fc2's input. scratch [M,K] (compute dtype) may be used.
    void (*linear_bwd_gelu)(dc_backend *be, dc_buf dpre, dc_buf dw, dc_buf db, dc_buf dout,
                            dc_buf act, dc_buf w, dc_buf pre, dc_buf scratch, int M, int K, int N);

    // ---- pointwise -----------------------------------------------------------
    // out = gelu_tanh(inp) ; dinp = dout * gelu'(inp)   (n elements)
    void (*gelu_fwd)(dc_backend *be, dc_buf out, dc_buf inp, int64_t n);
    void (*gelu_bwd)(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n);
    // out = silu(inp) ; dinp (+= if accumulate) = dout * silu'(inp)
    void (*silu_fwd)(dc_backend *be, dc_buf out, dc_buf inp, int64_t n);
    void (*silu_bwd)(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n,
                     bool accumulate);
    // y[n] += alpha * x[n]
    void (*axpy)(dc_backend *be, dc_buf y, dc_buf x, float alpha, int64_t n);
    // x[n] = min(max(x, lo), hi) in place, in x's dtype; a NaN stays NaN (torch.clamp)
    void (*clamp)(dc_backend *be, dc_buf x, int64_t n, float lo, float hi);
    // x[B,T,D] += pos[T,D]  (broadcast over B)
    void (*add_rows)(dc_backend *be, dc_buf x, dc_buf pos, int B, int T, int D);

    // ---- adaLN-Zero ------------------------------------------------------------
    // mod[B, nchunk*D] holds per-sample chunks; chunk k is mod[b, k*D:(k+1)*D].
    // out = LN(x) * (1 + mod[ch_scale]) + mod[ch_shift]; LN without affine, eps 1e-6.
    // mean, rstd [B*T] are saved for backward.
    void (*ln_mod_fwd)(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                       dc_buf mod, int B, int T, int D, int nchunk, int ch_shift, int ch_scale);
    // dx[B,T,D] += ; dmod chunks ch_shift and ch_scale are overwritten (sum over T).
    void (*ln_mod_bwd)(dc_backend *be, dc_buf dx, dc_buf dmod, dc_buf dout, dc_buf x,
                       dc_buf mean, dc_buf rstd, dc_buf mod, int B, int T, int D, int nchunk,
                       int ch_shift, int ch_scale);
    // out[B,T,D] = x + mod[ch_gate] * y  (out may be x itself)
    void (*gate_res_fwd)(dc_backend *be, dc_buf out, dc_buf x, dc_buf y, dc_buf mod, int B, int T,
                         int D, int nchunk, int ch_gate);
    // dy = mod[ch_gate] * dx ; dmod chunk ch_gate = sum_T dx * y (overwritten)
    void (*gate_res_bwd)(dc_backend *be, dc_buf dy, dc_buf dmod, dc_buf dx, dc_buf y,
                         dc_buf mod, int B, int T, int D, int nchunk, int ch_gate);

    // ---- attention -------------------------------------------------------------
    // One op for self-, cross- and causal attention in any layout (see
    // dc_attn_shape below): out = softmax(q k^T * scale + mask) v per (sample,
    // head). lse[B,H,Tq] (F32) keeps the log-sum-exp of each score row, so
    // backward rebuilds the probabilities without a stored Tq x Tk matrix.
    // A shape or layout a device cannot run is recorded as the op's error.
    void (*attention_fwd)(dc_backend *be, dc_buf out, dc_buf lse, dc_buf q, dc_buf k, dc_buf v,
                          const dc_attn_shape *s);
    // dq, dk, dv (overwritten) and dout are laid out as q, k, v and out; for
    // packed qkv, dq/dk/dv point into one dqkv buffer the same way.
    void (*attention_bwd)(dc_backend *be, dc_buf dq, dc_buf dk, dc_buf dv, dc_buf dout, dc_buf q,
                          dc_buf k, dc_buf v, dc_buf out, dc_buf lse, const dc_attn_shape *s);

    // ---- DiT embeddings ----------------------------------------------------------
    // img[B,C,H,W] -> out[B, T, C*p*p], token n = row*(W/p)+col, features in
    // (c, pr, pc) order to match a Conv2d weight [D, C, p, p] viewed as [D, C*p*p].
    void (*patchify)(dc_backend *be, dc_buf out, dc_buf img, int B, int C, int H, int W, int p);
    // tok[B, T, p*p*C] in (pr, pc, c) order -> img[B,C,H,W], and its adjoint
    void (*unpatchify_fwd)(dc_backend *be, dc_buf img, dc_buf tok, int B, int C, int H, int W,
                           int p);
    void (*unpatchify_bwd)(dc_backend *be, dc_buf dtok, dc_buf dimg, int B, int C, int H,
                           int W, int p);
    // out[B, 2*half] = [cos(t f_k) | sin(t f_k)], f_k = exp(-ln(10000) k / half); t float [B]
    void (*timestep_embed)(dc_backend *be, dc_buf out, dc_buf t, int B, int half);
    // out[B,D] = table[idx[b]] ; dtable[idx[b]] += dout[b]   (idx int32 [B])
    void (*embed_fwd)(dc_backend *be, dc_buf out, dc_buf table, dc_buf idx, int B, int D);
    void (*embed_bwd)(dc_backend *be, dc_buf dtable, dc_buf dout, dc_buf idx, int B, int D);

    // ---- diffusion -----------------------------------------------------------------
    // out[B,n]: standard normals, element j of sample b is
    // dc_randn_at(seed, keys[b], step, stream, j) (keys: host [B]).
    void (*randn)(dc_backend *be, dc_buf out, const uint32_t *keys, int B, int64_t n,
                  uint64_t seed, uint32_t step, uint32_t stream);
    // xt = a[b] * x0 + s[b] * eps   (a, s: host [B]; n elements per sample)
    void (*q_sample)(dc_backend *be, dc_buf xt, dc_buf x0, dc_buf eps, const float *a,
                     const float *s, int B, int64_t n);
    // The DiT training loss for a model output out[B, OC, HW]: with learned
    // sigma (OC = 2C) losses[B,2] = (mse, vb) per sample and dout = grad_scale *
    // d(mse + vb)/d out; for an epsilon-only model (OC = C) vb is 0 and dout
    // the gradient of mse alone.
    void (*diffusion_loss)(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0,
                           dc_buf xt, dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                           int64_t HW, float grad_scale);
    // Classifier-free guidance: model_out[2B, OC, HW] holds the conditional
    // half then the unconditional half. dst[B, OC, HW]: channels < guided get
    // u + scale (c - u), the others the conditional values.
    void (*cfg_combine)(dc_backend *be, dc_buf dst, dc_buf model_out, int B, int OC,
                        int64_t HW, int guided, float scale);
    // One reverse step for all B samples, in place on x[B,C,HW], from the model
    // output out[B, OC, HW] (OC = 2C with learned sigma, else C) and noise z.
    void (*sampler_step)(dc_backend *be, dc_buf x, dc_buf out, dc_buf z,
                         const dc_step_coef *coef, int B, int C, int OC, int64_t HW);

    // ---- optimisation --------------------------------------------------------------
    // One pass over n fp32 parameters. AdamW with g = grad * grad_scale:
    // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    // p -= lr (m/bc1 / (sqrt(v/bc2) + eps) + wd p)
    // then, if ema.p: ema = ema_decay ema + (1 - ema_decay) p (fp32),
    // and, if pc.p: pc = p in pc's dtype (the compute copy of the weights).
    // If scale.p, g is also multiplied by scale[0] (F32 on the backend: the
    // clipping factor grad_norm left there, so the host never waits for it).
    void (*adamw)(dc_backend *be, dc_buf p, dc_buf grad, dc_buf m, dc_buf v, dc_buf ema,
                  dc_buf pc, dc_buf scale, int64_t n, const dc_adamw_step *h);
    // Global gradient norm, left on the backend: out[0] = sqrt(sum g^2)
    // (summed in double in a fixed order), out[1] = max_norm / (norm + 1e-6)
    // if max_norm > 0 and norm > max_norm, else 1. out: F32 [2].
    void (*grad_norm)(dc_backend *be, dc_buf out, dc_buf g, int64_t n, float max_norm);

    // ---- latent diffusion: convolutions, group norm, affine layer norm ---------------
    // Shapes as in dc_conv2d_shape (op_math.h). Weights [Co, Ci, k, k] as PyTorch's Conv2d,
    // or [Co, k, k, Ci] with the channels-last maps of s->nhwc.
    // Before the first conv of a shape runs, reserve_conv(shape) sizes the workspace
    // (im2col columns on the CPU, cuDNN's on a GPU) so no conv allocates later;
    // for its forward pass only (inference), or for backward as well.
    int (*reserve_conv)(dc_backend *be, const dc_conv2d_shape *s, bool backward);
    // out[B,Co,Ho,Wo] = conv2d(x, w) + b[Co]   (b may be NULL; out[B,Ho,Wo,Co] if s->nhwc)
    void (*conv2d_fwd)(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b,
                       const dc_conv2d_shape *s);
    // out = conv2d(x, w) + b[Co] + r: a residual branch's last convolution,
    // the residual r (out's shape; overlapping neither out nor x) added in the
    // convolution's epilogue where the backend can, saving a pass over the
    // map. Otherwise the same bits as conv2d_fwd followed by axpy.
    void (*conv2d_fwd_res)(dc_backend *be, dc_buf out, dc_buf x, dc_buf w, dc_buf b, dc_buf r,
                           const dc_conv2d_shape *s);
    // dx[B,Ci,H,W] (skipped if NULL; += with DC_BWD_DX_ADD); dw[Co,Ci,k,k] += ;
    // db[Co] += (skipped if NULL; = with DC_BWD_DW_SET); channels-last dx, dw,
    // dout if s->nhwc. flags as linear_bwd's.
    void (*conv2d_bwd)(dc_backend *be, dc_buf dx, dc_buf dw, dc_buf db, dc_buf dout, dc_buf x,
                       dc_buf w, const dc_conv2d_shape *s, int flags);
    // GroupNorm over G groups of C/G channels (statistics over (C/G) * HW values):
    // out[B,C,HW] = act((x - mean) * rstd * gamma[c] + beta[c]), act = SiLU if silu,
    // else identity. mean, rstd [B, G] (F32) are saved for backward.
    void (*group_norm_fwd)(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                           dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G, float eps,
                           bool silu);
    // dx (+= with DC_BWD_DX_ADD); dgamma[C] += ; dbeta[C] += (both skipped if
    // NULL: frozen; = with DC_BWD_DW_SET). With silu the pre-activation is
    // recomputed from x, mean, rstd, gamma, beta.
    void (*group_norm_bwd)(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                           dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B,
                           int C, int64_t HW, int G, bool silu, int flags);
    // LayerNorm with affine weights over the last dimension D:
    // out[M,D] = (x - mean) * rstd * gamma + beta; mean, rstd [M] (F32) saved.
    void (*layer_norm_fwd)(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                           dc_buf gamma, dc_buf beta, int64_t M, int D, float eps);
    // dx (+= with DC_BWD_DX_ADD); dgamma[D] += ; dbeta[D] += (skipped if NULL;
    // = with DC_BWD_DW_SET)
    void (*layer_norm_bwd)(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                           dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, int64_t M, int D,
                           int flags);
    // out[B,C,2H,2W] = x[B,C,H,W], each value repeated over a 2x2 block (nearest);
    // dx[B,C,H,W] = the sum of dout over its 2x2 block (overwritten).
    void (*upsample2x_fwd)(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W);
    void (*upsample2x_bwd)(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W);
    // GEGLU (diffusers): x[M, 2F] = [h | gate] -> out[M,F] = h * gelu_erf(gate);
    // dx[M, 2F] (overwritten). The backward writes the forward's out too where
    // out is given ([M, F], or none; it may be dout itself, each value read
    // before it is overwritten): the same bits as geglu_fwd, for a backward
    // that did not keep it (selective recompute).
    void (*geglu_fwd)(dc_backend *be, dc_buf out, dc_buf x, int64_t M, int F);
    void (*geglu_bwd)(dc_backend *be, dc_buf dx, dc_buf out, dc_buf dout, dc_buf x, int64_t M, int F);
    // out[n] = act(inp) ; dinp (+= if accumulate) = dout * act'(inp)
    void (*activation_fwd)(dc_backend *be, dc_buf out, dc_buf inp, int64_t n, dc_act act);
    void (*activation_bwd)(dc_backend *be, dc_buf dinp, dc_buf dout, dc_buf inp, int64_t n,
                           dc_act act, bool accumulate);

    // ---- layout ------------------------------------------------------------------------
    // out[B, N, M] = x[B, M, N]: the last two dimensions swapped, e.g. image
    // features [B, C, HW] to tokens [B, HW, C] and back (its own adjoint).
    void (*transpose)(dc_backend *be, dc_buf out, dc_buf x, int B, int64_t M, int64_t N);
    // x[B, C, HW] += v[B, C], v broadcast over HW (a UNet resnet's time embedding);
    // dv[B, C] = sum over HW of dx[B, C, HW] (overwritten): its backward.
    void (*add_channel)(dc_backend *be, dc_buf x, dc_buf v, int B, int C, int64_t HW);
    void (*channel_sum)(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW);

    // ---- channels-last (NHWC) maps: x[B, HW, C] ---------------------------------------
    // The UNet and the VAE keep their maps channels-last: cuDNN's fast convolutions
    // read them as they are, and a pixel's channels are already a token for the
    // attention layers. The same contracts as their NCHW forms above.
    // GroupNorm over x[B, HW, C]: group g is channels [g C/G, (g+1) C/G) of every pixel.
    void (*group_norm_nhwc_fwd)(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x,
                                dc_buf gamma, dc_buf beta, int B, int C, int64_t HW, int G, float eps,
                                bool silu);
    // Its second half alone: out from x and the statistics an earlier
    // group_norm_nhwc_fwd of the same x wrote into mean and rstd (read here),
    // the same bits as that call's out, with one pass over x fewer (a
    // backward rebuilding what it did not keep: selective recompute).
    void (*group_norm_nhwc_apply)(dc_backend *be, dc_buf out, dc_buf mean, dc_buf rstd, dc_buf x, dc_buf gamma,
                                  dc_buf beta, int B, int C, int64_t HW, int G, bool silu);
    // out[B, 2H, 2W, C] = x[B, H, W, C], each pixel repeated over a 2x2 block (nearest).
    void (*upsample2x_nhwc_fwd)(dc_backend *be, dc_buf out, dc_buf x, int B, int C, int H, int W);
    // x[B, HW, C] += y[B, HW, C] + v[B, C] + bias[C], v broadcast over HW and
    // bias over every pixel; each term optional (a buffer with a NULL
    // pointer). bias may be a weight in its loaded dtype. The sum is rounded
    // once into x, so a conv's bias can join the add that follows it (a
    // resnet's time embedding or residual) instead of a pass of its own.
    void (*add_nhwc)(dc_backend *be, dc_buf x, dc_buf y, dc_buf v, dc_buf bias, int B, int C, int64_t HW);
    // out[M, C1 + C2] = [a[M, C1] | b[M, C2]] row by row: torch.cat along channels
    // of channels-last maps (M = B HW). Same dtype throughout; out overlaps neither.
    void (*concat_channels)(dc_backend *be, dc_buf out, dc_buf a, int C1, dc_buf b, int C2, int64_t M);
    // Their backward passes (training the UNet):
    // group_norm_bwd's contract over channels-last dx, dout, x [B, HW, C].
    void (*group_norm_nhwc_bwd)(dc_backend *be, dc_buf dx, dc_buf dgamma, dc_buf dbeta, dc_buf dout,
                                dc_buf x, dc_buf mean, dc_buf rstd, dc_buf gamma, dc_buf beta, int B,
                                int C, int64_t HW, int G, bool silu, int flags);
    // dx[B, H, W, C] = the sum of dout[B, 2H, 2W, C] over each pixel's 2x2 block (overwritten).
    void (*upsample2x_nhwc_bwd)(dc_backend *be, dc_buf dx, dc_buf dout, int B, int C, int H, int W);
    // dv[B, C] = the sum over HW of dx[B, HW, C] (overwritten): add_nhwc's v's gradient.
    void (*channel_sum_nhwc)(dc_backend *be, dc_buf dv, dc_buf dx, int B, int C, int64_t HW);
    // concat_channels' backward: a[M, C1] and b[M, C2] (overwritten) = the two
    // parts of each row of x[M, C1 + C2]. Same dtype throughout; no overlaps.
    void (*split_channels)(dc_backend *be, dc_buf a, int C1, dc_buf b, int C2, dc_buf x, int64_t M);

    // ---- optional: NULL where a backend has no such thing -------------------------
    // Device memory this backend holds now and its peak since creation, in bytes.
    void (*memory)(dc_backend *be, size_t *now, size_t *peak);
    // A hard cap on that memory (0: none): an allocation, a tensor's or an
    // op workspace's, that would take it past the cap fails with a message
    // naming the cap, as the device itself would once full.
    void (*set_memory_cap)(dc_backend *be, size_t bytes);
    // Records the ops that fn(arg) issues (no uploads, downloads or syncs among
    // them) into a graph that graph_launch replays with the same buffers.
    // NULL with a message if fn failed (or an op in it did) or the capture did.
    void *(*graph_capture)(dc_backend *be, int (*fn)(void *arg), void *arg);
    void (*graph_launch)(dc_backend *be, void *graph);
    void (*graph_free)(dc_backend *be, void *graph);
    // Whether a recorded graph may still be replayed: false once any device
    // buffer has been freed or replaced since it was recorded (it may point
    // at one), so a caller can keep a graph across runs safely.
    bool (*graph_valid)(dc_backend *be, void *graph);
    // TFLOP/s of a large matrix product in the compute dtype, timed now (the
    // peak that MFU is quoted against); 0 with a message if it cannot run.
    double (*gemm_peak)(dc_backend *be);
    // The device's energy counter in joules (from an arbitrary origin) and its
    // power limit in watts, for energy a step and mean power over a timed
    // stretch; false where the device cannot tell. First called from one thread.
    bool (*energy)(dc_backend *be, double *joules, double *limit_w);
    // Promises that no weight changes until the next call with false (an
    // inference pipeline's lifetime): meanwhile a backend may keep transforms
    // of weights it has seen, by their address (the CUDA backend keeps each
    // Winograd convolution's transformed weights); false drops them. NULL
    // where a backend keeps nothing.
    void (*freeze_weights)(dc_backend *be, bool frozen);
    // The queue the ops run on (a cudaStream_t), so a communicator's
    // collectives take their place among them.
    void *(*stream)(dc_backend *be);
    // Host memory the device copies to and from beside its ops (offloaded
    // training keeps the optimizer state there). alloc_pinned: page-locked
    // host memory (the CPU: ordinary memory), NULL with a message on failure.
    void *(*alloc_pinned)(dc_backend *be, size_t bytes);
    void (*free_pinned)(dc_backend *be, void *p);
    // Copies bytes between backend memory and pinned host memory (to_host:
    // dst is the host side) on a queue of its direction, once the ops queued
    // so far are done, so it runs beside the ops queued after it and beside
    // copies the other way. Returns a ticket, 0 meaning nothing to wait for
    // (the CPU copies at once and returns 0); a ticket covers the earlier
    // copies of its direction. A copy that must follow one the other way
    // waits through the ops: wait_ticket(that ticket), then copy_async.
    // Failures are recorded as an op's.
    int64_t (*copy_async)(dc_backend *be, void *dst, const void *src, size_t bytes, bool to_host);
    // The calling host thread (any thread) waits until the copy of `ticket`
    // and every earlier one of its direction are done: 0, or -1 with a
    // message (set on the calling thread; nothing is recorded in the backend).
    int (*host_wait)(dc_backend *be, int64_t ticket);
    // The ops queued after this (and so the copies issued after it) wait for
    // the copy of `ticket` and every earlier one of its direction (the host
    // does not wait).
    void (*wait_ticket)(dc_backend *be, int64_t ticket);
    // With an op profile running (opts.profile), forgets what it has
    // counted so far, so a benchmark's warm-up stays out of it.
    void (*profile_restart)(dc_backend *be);
};

// Creates a backend by name: "cpu", "cuda" (bf16 compute, fp32 master
// weights), "cuda-fp32" (fp32 throughout, for checking), or "auto" (the
// fastest present: CUDA when a GPU is there).
int dc_backend_create(const char *name, dc_backend **out);
// The same with options (NULL: dc_backend_opts_default()).
int dc_backend_create_opts(const char *name, const dc_backend_opts *opts, dc_backend **out);
void dc_backend_destroy(dc_backend *be);
dc_backend *dc_backend_cpu_create(void);
// The kernels OpenBLAS chose as the program loaded ("Cooperlake", "Haswell",
// ...; OPENBLAS_CORETYPE overrides its choice).
const char *dc_cpu_blas_core(void);
// NULL with a message when the build has no CUDA or no GPU is present.
// opts NULL: the defaults.
dc_backend *dc_backend_cuda_create_opts(bool fp32, const dc_backend_opts *opts);
static inline dc_backend *dc_backend_cuda_create(bool fp32) { return dc_backend_cuda_create_opts(fp32, NULL); }

static inline void dc_backend_sync(dc_backend *be) { be->sync(be); }

// b = a new backend buffer of `count` elements of dtype dt; `what` names it in
// the message when the backend cannot allocate it.
int dc_buf_alloc(dc_backend *be, dc_buf *b, dc_dtype dt, size_t count, const char *what);
// 0, or -1 with the message of the error the backend recorded (see the top).
static inline int dc_backend_status(dc_backend *be) { return be->status ? be->status(be) : 0; }

#ifdef __cplusplus
}
#endif
