// Elementwise ops and the DiT embeddings: activations, axpy, positional add,
// patchify / unpatchify, timestep and label embeddings; and the latent
// diffusion ones: the activation of a given kind, GEGLU, nearest 2x upsampling,
// layout changes and per-channel adds, for NCHW and channels-last maps.
//
// Activation loops are `omp simd` so expf, tanhf and erff vectorise through
// libmvec (see cpu_ops.h), in fixed blocks so that results do not depend on the
// thread count; the formulas themselves are the shared ones in op_math.h.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

// Runs STMT for i in [0, n) in fixed blocks of DC_CPU_BLOCK (see cpu_ops.h):
// blocks over threads, each block one vectorised loop.
#define BLOCKED(n, STMT)                                                           \
    do {                                                                           \
        const int64_t n_ = (n), nb_ = (n_ + DC_CPU_BLOCK - 1) / DC_CPU_BLOCK;      \
        _Pragma("omp parallel for schedule(static) if (n_ > DC_CPU_PAR_MIN)")      \
        for (int64_t b_ = 0; b_ < nb_; b_++) {                                     \
            const int64_t e_ = b_ < nb_ - 1 ? (b_ + 1) * DC_CPU_BLOCK : n_;        \
            _Pragma("omp simd")                                                    \
            for (int64_t i = b_ * DC_CPU_BLOCK; i < e_; i++) STMT;                 \
        }                                                                          \
    } while (0)

void dc_cpu_gelu_fwd(dc_backend *be, dc_buf out_, dc_buf inp_, int64_t n) {
    (void)be;
    float *out = dc_cpu_f32(out_);
    const float *inp = dc_cpu_f32(inp_);
    BLOCKED(n, out[i] = dc_gelu(inp[i]));
}

void dc_cpu_gelu_bwd(dc_backend *be, dc_buf dinp_, dc_buf dout_, dc_buf inp_, int64_t n) {
    (void)be;
    float *dinp = dc_cpu_f32(dinp_);
    const float *dout = dc_cpu_f32(dout_), *inp = dc_cpu_f32(inp_);
    BLOCKED(n, dinp[i] = dout[i] * dc_gelu_grad(inp[i]));
}

void dc_cpu_silu_fwd(dc_backend *be, dc_buf out_, dc_buf inp_, int64_t n) {
    (void)be;
    float *out = dc_cpu_f32(out_);
    const float *inp = dc_cpu_f32(inp_);
    BLOCKED(n, out[i] = dc_silu(inp[i]));
}

void dc_cpu_silu_bwd(dc_backend *be, dc_buf dinp_, dc_buf dout_, dc_buf inp_, int64_t n,
                     bool accumulate) {
    (void)be;
    float *dinp = dc_cpu_f32(dinp_);
    const float *dout = dc_cpu_f32(dout_), *inp = dc_cpu_f32(inp_);
    if (accumulate) BLOCKED(n, dinp[i] += dout[i] * dc_silu_grad(inp[i]));
    else BLOCKED(n, dinp[i] = dout[i] * dc_silu_grad(inp[i]));
}

void dc_cpu_axpy(dc_backend *be, dc_buf y_, dc_buf x_, float alpha, int64_t n) {
    (void)be;
    float *y = dc_cpu_f32(y_);
    const float *x = dc_cpu_f32(x_);
#pragma omp parallel for simd schedule(static) if (n > DC_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void dc_cpu_clamp(dc_backend *be, dc_buf x_, int64_t n, float lo, float hi) {
    (void)be;
    float *x = dc_cpu_f32(x_);
#pragma omp parallel for schedule(static) if (n > DC_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];  // (NaN fails both)
}

// pos may be F16 or BF16 (a position embedding kept as loaded).
void dc_cpu_add_rows(dc_backend *be, dc_buf x_, dc_buf pos_, int B, int T, int D) {
    float *x = dc_cpu_f32(x_);                                                 // [B, T, D]
    const float *pos = dc_cpu_weight(be, pos_, (int64_t)T * D, DC_CPU_WIDE_W);  // [T, D]
    if (!pos) return;  // no scratch to widen it: recorded for status
#pragma omp parallel for schedule(static) if ((int64_t)B * T * D > DC_CPU_PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        float *xr = x + (int64_t)bt * D;
        const float *pr = pos + (int64_t)(bt % T) * D;
#pragma omp simd
        for (int d = 0; d < D; d++) xr[d] += pr[d];
    }
}

// ---- patches ------------------------------------------------------------------
// Token n = gy * (W/p) + gx covers pixels (gy*p + py, gx*p + px).

void dc_cpu_patchify(dc_backend *be, dc_buf out_, dc_buf img_, int B, int C, int H, int W,
                     int p) {
    (void)be;
    float *out = dc_cpu_f32(out_);        // [B, T, C*p*p], features (c, py, px)
    const float *img = dc_cpu_f32(img_);  // [B, C, H, W]
    assert(H % p == 0 && W % p == 0);
    const int gh = H / p, gw = W / p, F = C * p * p;
#pragma omp parallel for schedule(static) if ((int64_t)B * C * H * W > DC_CPU_PAR_MIN)
    for (int bg = 0; bg < B * gh; bg++) {
        const int b = bg / gh, gy = bg % gh;
        for (int gx = 0; gx < gw; gx++) {
            float *o = out + ((int64_t)b * gh * gw + (int64_t)gy * gw + gx) * F;
            for (int c = 0; c < C; c++)
                for (int py = 0; py < p; py++) {
                    const float *src = img + (((int64_t)b * C + c) * H + gy * p + py) * W + gx * p;
                    memcpy(o + (c * p + py) * p, src, (size_t)p * sizeof(float));
                }
        }
    }
}

void dc_cpu_unpatchify_fwd(dc_backend *be, dc_buf img_, dc_buf tok_, int B, int C, int H, int W,
                           int p) {
    (void)be;
    float *img = dc_cpu_f32(img_);        // [B, C, H, W]
    const float *tok = dc_cpu_f32(tok_);  // [B, T, p*p*C], features (py, px, c)
    assert(H % p == 0 && W % p == 0);
    const int gw = W / p, F = p * p * C;
#pragma omp parallel for schedule(static) if ((int64_t)B * C * H * W > DC_CPU_PAR_MIN)
    for (int bcy = 0; bcy < B * C * H; bcy++) {
        const int y = bcy % H, c = bcy / H % C, b = bcy / H / C;
        const float *trow = tok + ((int64_t)b * (H / p) + y / p) * gw * F + (y % p) * p * C + c;
        float *irow = img + (int64_t)bcy * W;
        for (int x = 0; x < W; x++) irow[x] = trow[(x / p) * F + (x % p) * C];
    }
}

// The adjoint of unpatchify_fwd: the same permutation read the other way.
void dc_cpu_unpatchify_bwd(dc_backend *be, dc_buf dtok_, dc_buf dimg_, int B, int C, int H,
                           int W, int p) {
    (void)be;
    float *dtok = dc_cpu_f32(dtok_);        // [B, T, p*p*C]
    const float *dimg = dc_cpu_f32(dimg_);  // [B, C, H, W]
    assert(H % p == 0 && W % p == 0);
    const int gw = W / p, F = p * p * C;
#pragma omp parallel for schedule(static) if ((int64_t)B * C * H * W > DC_CPU_PAR_MIN)
    for (int bcy = 0; bcy < B * C * H; bcy++) {
        const int y = bcy % H, c = bcy / H % C, b = bcy / H / C;
        float *trow = dtok + ((int64_t)b * (H / p) + y / p) * gw * F + (y % p) * p * C + c;
        const float *irow = dimg + (int64_t)bcy * W;
        for (int x = 0; x < W; x++) trow[(x / p) * F + (x % p) * C] = irow[x];
    }
}

// ---- conditioning embeddings ---------------------------------------------------

// In double throughout: t f_k reaches 1000 radians, where float32 arithmetic
// would already be off by ~1e-4; this gives the formula rounded once.
void dc_cpu_timestep_embed(dc_backend *be, dc_buf out_, dc_buf t_, int B, int half) {
    (void)be;
    float *out = dc_cpu_f32(out_);    // [B, 2*half]
    const float *t = dc_cpu_f32(t_);  // [B]
    for (int b = 0; b < B; b++)
        for (int k = 0; k < half; k++) {
            double arg = (double)t[b] * dc_timestep_freq(k, half);
            out[(int64_t)b * 2 * half + k] = (float)cos(arg);
            out[(int64_t)b * 2 * half + half + k] = (float)sin(arg);
        }
}

static const int32_t *idx_i32(dc_buf idx) {
    assert(idx.dt == DC_I32 && "embedding indices are int32");
    return (const int32_t *)idx.p;
}

// The table may be F16 or BF16 (kept as loaded): only the rows looked up are widened.
void dc_cpu_embed_fwd(dc_backend *be, dc_buf out_, dc_buf table_, dc_buf idx_, int B, int D) {
    (void)be;
    float *out = dc_cpu_f32(out_);       // [B, D]
    const int32_t *idx = idx_i32(idx_);  // [B]; table [rows, D]
    const size_t row = (size_t)D * dc_dtype_size(table_.dt);
    for (int b = 0; b < B; b++) {
        assert(idx[b] >= 0);
        dc_cpu_widen(out + (int64_t)b * D, (const char *)table_.p + idx[b] * row, table_.dt, D);
    }
}

// Serial over b: samples sharing a label add into the same row, in batch order.
void dc_cpu_embed_bwd(dc_backend *be, dc_buf dtable_, dc_buf dout_, dc_buf idx_, int B, int D) {
    (void)be;
    float *dtable = dc_cpu_f32(dtable_);    // [rows, D]
    const float *dout = dc_cpu_f32(dout_);  // [B, D]
    const int32_t *idx = idx_i32(idx_);     // [B]
    for (int b = 0; b < B; b++) {
        assert(idx[b] >= 0);
        float *row = dtable + (int64_t)idx[b] * D;
        const float *g = dout + (int64_t)b * D;
#pragma omp simd
        for (int d = 0; d < D; d++) row[d] += g[d];
    }
}

// The one CPU op that sees BF16: converting weights or activations for
// another backend's checks and for files.
void dc_cpu_cast(dc_backend *be, dc_buf dst, dc_buf src, int64_t n) {
    (void)be;
    if (dst.dt == src.dt) {
        if (n && dst.p != src.p) memmove(dst.p, src.p, (size_t)n * dc_dtype_size(dst.dt));
    } else if (dst.dt == DC_BF16 && src.dt == DC_F32) {
        uint16_t *d = dst.p;
        const float *s = src.p;
#pragma omp parallel for schedule(static) if (n > DC_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] = dc_f32_to_bf16(s[i]);
    } else if (dst.dt == DC_F32 && src.dt == DC_BF16) {
        float *d = dst.p;
        const uint16_t *s = src.p;
#pragma omp parallel for schedule(static) if (n > DC_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) d[i] = dc_bf16_to_f32(s[i]);
    } else {
        assert(!"cast: unsupported dtype pair");
    }
}

// ---- latent diffusion: activations, GEGLU, upsampling ----------------------------

// One loop per activation, so each vectorises with its own libm calls.
#define ACT_SWITCH(act, BODY)                                                        \
    switch (act) {                                                                    \
    case DC_ACT_SILU: BODY(dc_silu, dc_silu_grad); break;                             \
    case DC_ACT_GELU_TANH: BODY(dc_gelu, dc_gelu_grad); break;                        \
    case DC_ACT_GELU_ERF: BODY(dc_gelu_erf, dc_gelu_erf_grad); break;                 \
    case DC_ACT_QUICK_GELU: BODY(dc_quick_gelu, dc_quick_gelu_grad); break;           \
    default: assert(!"unknown activation");                                           \
    }

void dc_cpu_activation_fwd(dc_backend *be, dc_buf out_, dc_buf inp_, int64_t n, dc_act act) {
    (void)be;
    float *out = dc_cpu_f32(out_);
    const float *inp = dc_cpu_f32(inp_);
#define FWD(F, DF) BLOCKED(n, out[i] = F(inp[i]))
    ACT_SWITCH(act, FWD)
#undef FWD
}

void dc_cpu_activation_bwd(dc_backend *be, dc_buf dinp_, dc_buf dout_, dc_buf inp_, int64_t n,
                           dc_act act, bool accumulate) {
    (void)be;
    float *dinp = dc_cpu_f32(dinp_);
    const float *dout = dc_cpu_f32(dout_), *inp = dc_cpu_f32(inp_);
    if (accumulate) {
#define BWD_ACC(F, DF) BLOCKED(n, dinp[i] += dout[i] * DF(inp[i]))
        ACT_SWITCH(act, BWD_ACC)
#undef BWD_ACC
    } else {
#define BWD(F, DF) BLOCKED(n, dinp[i] = dout[i] * DF(inp[i]))
        ACT_SWITCH(act, BWD)
#undef BWD
    }
}

// GEGLU as diffusers' GEGLU: x[m] = [h | gate] (the projection's two halves).
void dc_cpu_geglu_fwd(dc_backend *be, dc_buf out_, dc_buf x_, int64_t M, int F) {
    (void)be;
    float *out = dc_cpu_f32(out_);    // [M, F]
    const float *x = dc_cpu_f32(x_);  // [M, 2F]
#pragma omp parallel for schedule(static) if (M * F > DC_CPU_PAR_MIN)
    for (int64_t m = 0; m < M; m++) {
        const float *h = x + m * 2 * F, *gate = h + F;
        float *o = out + m * F;
#pragma omp simd
        for (int f = 0; f < F; f++) o[f] = h[f] * dc_gelu_erf(gate[f]);
    }
}

// dh = dout gelu(gate), dgate = dout h gelu'(gate); out = h gelu(gate)
// where given (it may be dout: each d[f] is read before o[f] is written).
void dc_cpu_geglu_bwd(dc_backend *be, dc_buf dx_, dc_buf out_, dc_buf dout_, dc_buf x_, int64_t M, int F) {
    (void)be;
    float *dx = dc_cpu_f32(dx_), *out = out_.p ? dc_cpu_f32(out_) : NULL;  // [M, 2F], [M, F]
    const float *dout = dc_cpu_f32(dout_), *x = dc_cpu_f32(x_);           // [M, F], [M, 2F]
#pragma omp parallel for schedule(static) if (M * F > DC_CPU_PAR_MIN)
    for (int64_t m = 0; m < M; m++) {
        const float *h = x + m * 2 * F, *gate = h + F, *d = dout + m * F;
        float *dh = dx + m * 2 * F, *dgate = dh + F;
#pragma omp simd
        for (int f = 0; f < F; f++) {
            dh[f] = d[f] * dc_gelu_erf(gate[f]);
            dgate[f] = d[f] * h[f] * dc_gelu_erf_grad(gate[f]);
        }
        if (!out) continue;
        float *o = out + m * F;  // after the row's dout is read; geglu_fwd's loop, for its bits
#pragma omp simd
        for (int f = 0; f < F; f++) o[f] = h[f] * dc_gelu_erf(gate[f]);
    }
}

void dc_cpu_upsample2x_fwd(dc_backend *be, dc_buf out_, dc_buf x_, int B, int C, int H, int W) {
    (void)be;
    float *out = dc_cpu_f32(out_);    // [B, C, 2H, 2W]
    const float *x = dc_cpu_f32(x_);  // [B, C, H, W]
    const int64_t rows = (int64_t)B * C * H;
#pragma omp parallel for schedule(static) if (rows * W * 4 > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {  // input row r fills output rows 2r and 2r+1
        const float *xr = x + r * W;
        float *o0 = out + 2 * r * 2 * W, *o1 = o0 + 2 * W;
        for (int w = 0; w < W; w++) o0[2 * w] = o0[2 * w + 1] = xr[w];
        memcpy(o1, o0, (size_t)2 * W * sizeof(float));
    }
}

void dc_cpu_upsample2x_bwd(dc_backend *be, dc_buf dx_, dc_buf dout_, int B, int C, int H, int W) {
    (void)be;
    float *dx = dc_cpu_f32(dx_);            // [B, C, H, W]
    const float *dout = dc_cpu_f32(dout_);  // [B, C, 2H, 2W]
    const int64_t rows = (int64_t)B * C * H;
#pragma omp parallel for schedule(static) if (rows * W * 4 > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *d0 = dout + 2 * r * 2 * W, *d1 = d0 + 2 * W;
        float *dxr = dx + r * W;
#pragma omp simd
        for (int w = 0; w < W; w++)
            dxr[w] = (d0[2 * w] + d0[2 * w + 1]) + (d1[2 * w] + d1[2 * w + 1]);
    }
}

// ---- layout ----------------------------------------------------------------------------
// Blocks of 32 x 32 keep both the rows read and the rows written in cache.
void dc_cpu_transpose(dc_backend *be, dc_buf out_, dc_buf x_, int B, int64_t M, int64_t N) {
    (void)be;
    float *out = dc_cpu_f32(out_);    // [B, N, M]
    const float *x = dc_cpu_f32(x_);  // [B, M, N]
    enum { TB = 32 };
    const int64_t mb = (M + TB - 1) / TB, nb = (N + TB - 1) / TB, tiles = (int64_t)B * mb * nb;
#pragma omp parallel for schedule(static) if (B * M * N > DC_CPU_PAR_MIN)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t b = t / (mb * nb), i0 = (t / nb % mb) * TB, j0 = t % nb * TB;
        const float *xb = x + b * M * N;
        float *ob = out + b * M * N;
        for (int64_t i = i0; i < i0 + TB && i < M; i++)
            for (int64_t j = j0; j < j0 + TB && j < N; j++) ob[j * M + i] = xb[i * N + j];
    }
}

void dc_cpu_add_channel(dc_backend *be, dc_buf x_, dc_buf v_, int B, int C, int64_t HW) {
    (void)be;
    float *x = dc_cpu_f32(x_);        // [B, C, HW]
    const float *v = dc_cpu_f32(v_);  // [B, C]
    const int64_t rows = (int64_t)B * C;
#pragma omp parallel for schedule(static) if (rows * HW > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * HW;
        const float a = v[r];
#pragma omp simd
        for (int64_t i = 0; i < HW; i++) xr[i] += a;
    }
}

// Summed in double: HW reaches 16384 and more.
void dc_cpu_channel_sum(dc_backend *be, dc_buf dv_, dc_buf dx_, int B, int C, int64_t HW) {
    (void)be;
    float *dv = dc_cpu_f32(dv_);        // [B, C]
    const float *dx = dc_cpu_f32(dx_);  // [B, C, HW]
    const int64_t rows = (int64_t)B * C;
#pragma omp parallel for schedule(static) if (rows * HW > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t i = 0; i < HW; i++) s += dx[r * HW + i];
        dv[r] = (float)s;
    }
}

// ---- channels-last maps: x[B, HW, C] ------------------------------------------------------

// Input row r of x[B*H, W, C] fills output rows 2r and 2r+1: each pixel's C
// channels twice side by side, then the whole row once more.
void dc_cpu_upsample2x_nhwc_fwd(dc_backend *be, dc_buf out_, dc_buf x_, int B, int C, int H,
                                int W) {
    (void)be;
    float *out = dc_cpu_f32(out_);    // [B, 2H, 2W, C]
    const float *x = dc_cpu_f32(x_);  // [B, H, W, C]
    const int64_t rows = (int64_t)B * H, rc = (int64_t)W * C;  // rc: floats of one input row
    const size_t px = (size_t)C * sizeof(float);
#pragma omp parallel for schedule(static) if (rows * rc * 4 > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * rc;
        float *o0 = out + 2 * r * 2 * rc, *o1 = o0 + 2 * rc;
        for (int w = 0; w < W; w++) {
            memcpy(o0 + (int64_t)2 * w * C, xr + (int64_t)w * C, px);
            memcpy(o0 + (int64_t)(2 * w + 1) * C, xr + (int64_t)w * C, px);
        }
        memcpy(o1, o0, (size_t)2 * rc * sizeof(float));
    }
}

void dc_cpu_add_nhwc(dc_backend *be, dc_buf x_, dc_buf y_, dc_buf v_, dc_buf bias_, int B, int C, int64_t HW) {
    float *x = dc_cpu_f32(x_);                          // [B, HW, C]
    const float *y = y_.p ? dc_cpu_f32(y_) : NULL;      // [B, HW, C]
    const float *v = v_.p ? dc_cpu_f32(v_) : NULL;      // [B, C]
    const float *bias = bias_.p ? dc_cpu_weight(be, bias_, C, DC_CPU_WIDE_B) : NULL;  // [C]
    if (bias_.p && !bias) return;                       // recorded for status
    // a[b, c] = v[b, c] + bias[c] first, then x + (y + a), as the GPU adds them
    float *a = calloc((size_t)B * C, sizeof(float));
    if (!a) {
        dc_cpu_fail(be, "add_nhwc: out of memory for %d x %d sums", B, C);
        return;
    }
    for (int64_t i = 0; i < (int64_t)B * C; i++) a[i] = (v ? v[i] : 0.0f) + (bias ? bias[i % C] : 0.0f);
    const int64_t rows = (int64_t)B * HW;
#pragma omp parallel for schedule(static) if (rows * C > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * C;
        const float *ab = a + r / HW * C, *yr = y ? y + r * C : NULL;
        if (yr) {
#pragma omp simd
            for (int c = 0; c < C; c++) xr[c] += yr[c] + ab[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++) xr[c] += ab[c];
        }
    }
    free(a);
}

// torch.cat([a, b], dim=1) of channels-last maps: each row of out is a row of
// a followed by a row of b.
void dc_cpu_concat_channels(dc_backend *be, dc_buf out_, dc_buf a_, int C1, dc_buf b_, int C2,
                            int64_t M) {
    (void)be;
    float *out = dc_cpu_f32(out_);                            // [M, C1 + C2]
    const float *a = dc_cpu_f32(a_), *b = dc_cpu_f32(b_);     // [M, C1], [M, C2]
    const int64_t C = (int64_t)C1 + C2;
#pragma omp parallel for schedule(static) if (M * C > DC_CPU_PAR_MIN)
    for (int64_t m = 0; m < M; m++) {
        memcpy(out + m * C, a + m * C1, (size_t)C1 * sizeof(float));
        memcpy(out + m * C + C1, b + m * C2, (size_t)C2 * sizeof(float));
    }
}

// Backward passes of the channels-last ops above (training the UNet).

// Each input pixel's gradient: its 2x2 block of dout, summed in a fixed order.
void dc_cpu_upsample2x_nhwc_bwd(dc_backend *be, dc_buf dx_, dc_buf dout_, int B, int C, int H,
                                int W) {
    (void)be;
    float *dx = dc_cpu_f32(dx_);            // [B, H, W, C]
    const float *dout = dc_cpu_f32(dout_);  // [B, 2H, 2W, C]
    const int64_t rows = (int64_t)B * H, orow = (int64_t)2 * W * C;  // orow: floats of one output row
#pragma omp parallel for schedule(static) if (rows * W * C * 4 > DC_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *o0 = dout + 2 * r * orow, *o1 = o0 + orow;
        for (int w = 0; w < W; w++) {
            float *d = dx + (r * W + w) * C;
            const int64_t a = (int64_t)2 * w * C;
#pragma omp simd
            for (int c = 0; c < C; c++) d[c] = o0[a + c] + o0[a + C + c] + o1[a + c] + o1[a + C + c];
        }
    }
}

// Summed in double over pixels in order, a channel per lane.
void dc_cpu_channel_sum_nhwc(dc_backend *be, dc_buf dv_, dc_buf dx_, int B, int C, int64_t HW) {
    (void)be;
    float *dv = dc_cpu_f32(dv_);        // [B, C]
    const float *dx = dc_cpu_f32(dx_);  // [B, HW, C]
#pragma omp parallel for schedule(static) if ((int64_t)B * C * HW > DC_CPU_PAR_MIN)
    for (int64_t bc = 0; bc < (int64_t)B * C; bc++) {
        const int64_t b = bc / C, c = bc % C;
        double s = 0;
        for (int64_t p = 0; p < HW; p++) s += dx[(b * HW + p) * C + c];
        dv[bc] = (float)s;
    }
}

void dc_cpu_split_channels(dc_backend *be, dc_buf a_, int C1, dc_buf b_, int C2, dc_buf x_,
                           int64_t M) {
    (void)be;
    float *a = a_.p ? dc_cpu_f32(a_) : NULL;  // [M, C1]
    float *b = dc_cpu_f32(b_);                // [M, C2]
    const float *x = dc_cpu_f32(x_);          // [M, C1 + C2]
    const int64_t C = (int64_t)C1 + C2;
#pragma omp parallel for schedule(static) if (M * C > DC_CPU_PAR_MIN)
    for (int64_t m = 0; m < M; m++) {
        if (a) memcpy(a + m * C1, x + m * C, (size_t)C1 * sizeof(float));
        memcpy(b + m * C2, x + m * C + C1, (size_t)C2 * sizeof(float));
    }
}
