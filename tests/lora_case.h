// One adapted layer for the adapter tests (test_adapter on the CPU,
// test_cuda_adapter on a GPU): a linear layer or a convolution (NCHW or
// channels-last) with random weights, input and output gradient, and a
// random LoRA (nonzero down and up) on its weight; run through the modules
// (nn/modules.h) with the LoRA applied at run time or merged; and the same
// layer in double precision on the host, as the reference.
//
// A linear layer is held as a 1 x 1 convolution over B x 1 x 1 maps (rows M =
// B, in = ci, out = co), so one reference serves both.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/adapter.h"
#include "nn/modules.h"

typedef struct {
    const char *what;
    bool conv, nhwc;
    bool frozen;      // the base weight frozen (no gradient), kept as `loaded` where the backend can
    dc_dtype loaded;  // F32, or F16 (values drawn exact in F16)
    int B, ci, co, H, W, k, stride, pad, rank;
    float alpha, multiplier;
} lcase;

typedef struct {
    lcase c;
    dc_backend *be;
    dc_params ps;
    dc_linear lin;
    dc_conv2d cv;
    int w, b;            // the layer's weight and bias in ps
    dc_lora lo;
    dc_conv2d_shape s;   // the layer's shape (a linear layer's as a 1 x 1 convolution)
    int64_t nx, ny, nw, nd, nu;
    // host values, PyTorch's order; x, y, g in the layer's map layout
    float *x, *g, *W, *bias, *down, *up;
    dc_buf xd, yd, gd, dxd;  // on the backend, activations in its compute dtype
} lrun;

static inline uint64_t lcase_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}
// Uniform in [-1, 1), rounded to F16 (so exact in F16, BF16 and F32) when f16.
static inline float lcase_rand(uint64_t *s, bool f16) {
    float v = (float)((double)(lcase_next(s) >> 11) * 0x1p-52 - 1.0);
    return f16 ? dc_f16_to_f32(dc_f32_to_f16(v)) : v;
}
static inline float *lcase_fill(uint64_t *s, int64_t n, float scale, bool f16) {
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = scale * lcase_rand(s, f16);
    return h;
}

// Host values (f32) of n elements to b in its dtype, and back.
static inline void lcase_put(dc_backend *be, dc_buf b, const float *h, int64_t n) {
    float *t = malloc((size_t)n * 4);
    memcpy(t, h, (size_t)n * 4);
    dc_upload_f32_as(be, b, t, n);
    free(t);
}
static inline float *lcase_get(dc_backend *be, dc_buf b, int64_t n) {
    float *h = malloc((size_t)n * 4);
    dc_download_as_f32(be, b, h, n);
    return h;
}
static inline dc_buf lcase_dev(dc_backend *be, int64_t n, dc_dtype dt) {
    dc_buf b = {be->alloc(be, (size_t)n * dc_dtype_size(dt)), dt};
    return b;
}
// Parameter i of ps (host values in PyTorch's order) into its storage.
static inline void lcase_set_param(dc_params *ps, int i, const float *h) {
    const dc_param *p = &ps->items[i];
    float *t = malloc((size_t)p->numel * 4);
    memcpy(t, h, (size_t)p->numel * 4);
    dc_param_to_stored(p, t);
    dc_upload_f32_as(ps->be, dc_param_data(ps, i), t, p->numel);
    free(t);
}
// Parameter i's gradient (fp32, storage order) in PyTorch's order.
static inline float *lcase_grad(dc_params *ps, int i) {
    const dc_param *p = &ps->items[i];
    float *h = lcase_get(ps->be, dc_param_grad(ps, i), p->numel);
    dc_param_from_stored(p, h);
    return h;
}

static inline int lrun_make(lrun *r, dc_backend *be, const lcase *c, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->c = *c, r->be = be;
    const int k = c->conv ? c->k : 1;
    r->s = (dc_conv2d_shape){c->B, c->ci, c->conv ? c->H : 1, c->conv ? c->W : 1, c->co, k, c->conv ? c->stride : 1,
                             c->conv ? c->pad : 0, c->conv ? c->pad : 0, c->conv ? c->pad : 0,
                             c->conv ? c->pad : 0, c->nhwc};
    if (c->conv) {
        DC_TRY(c->nhwc ? dc_conv2d_add_nhwc(&r->ps, &r->cv, "layer", c->ci, c->co, c->k, c->stride, c->pad)
                       : dc_conv2d_add(&r->ps, &r->cv, "layer", c->ci, c->co, c->k, c->stride, c->pad));
        r->w = r->cv.w, r->b = r->cv.b;
    } else {
        DC_TRY(dc_linear_add(&r->ps, &r->lin, "layer", c->ci, c->co));
        r->w = r->lin.w, r->b = r->lin.b;
    }
    if (c->frozen) DC_TRY(dc_params_freeze(&r->ps, r->w));
    DC_TRY(dc_params_alloc_loaded(&r->ps, be, true, c->loaded));
    dc_lora_init(&r->lo, &r->ps);
    r->lo.multiplier = c->multiplier;
    DC_TRY(dc_lora_add(&r->lo, r->w, "layer", c->rank, c->alpha));
    DC_TRY(dc_lora_alloc(&r->lo, be, true));
    const dc_conv2d_shape *s = &r->s;
    r->nx = (int64_t)s->B * s->Ci * s->H * s->W;
    r->ny = (int64_t)s->B * s->Co * dc_conv2d_ho(s) * dc_conv2d_wo(s);
    r->nw = (int64_t)c->co * c->ci * k * k, r->nd = (int64_t)c->rank * c->ci * k * k, r->nu = (int64_t)c->co * c->rank;
    if (c->conv) {
        DC_TRY(be->reserve_conv(be, s, true));
        DC_TRY(dc_lora_reserve_conv(&r->lo, r->w, s, true));
    } else {
        DC_TRY(dc_lora_reserve(&r->lo, c->B));
    }
    const bool f16 = c->loaded == DC_F16;
    r->x = lcase_fill(&seed, r->nx, 1.0f, false), r->g = lcase_fill(&seed, r->ny, 1.0f, false);
    r->W = lcase_fill(&seed, r->nw, 0.5f, f16), r->bias = lcase_fill(&seed, c->co, 0.5f, false);
    r->down = lcase_fill(&seed, r->nd, 0.5f, false), r->up = lcase_fill(&seed, r->nu, 0.5f, false);
    lcase_set_param(&r->ps, r->w, r->W), lcase_set_param(&r->ps, r->b, r->bias);
    lcase_set_param(&r->lo.params, r->lo.items[0].down, r->down);
    lcase_set_param(&r->lo.params, r->lo.items[0].up, r->up);
    dc_params_touch(&r->ps), dc_params_refresh(&r->ps);
    dc_params_touch(&r->lo.params), dc_params_refresh(&r->lo.params);
    r->xd = lcase_dev(be, r->nx, be->compute), r->dxd = lcase_dev(be, r->nx, be->compute);
    r->yd = lcase_dev(be, r->ny, be->compute), r->gd = lcase_dev(be, r->ny, be->compute);
    if (!r->xd.p || !r->dxd.p || !r->yd.p || !r->gd.p) return -1;
    lcase_put(be, r->xd, r->x, r->nx), lcase_put(be, r->gd, r->g, r->ny);
    return dc_backend_status(be);
}

static inline void lrun_free(lrun *r) {
    dc_lora_free(&r->lo);
    dc_buf bufs[] = {r->xd, r->dxd, r->yd, r->gd};
    for (int i = 0; i < 4; i++)
        if (bufs[i].p) r->be->free(r->be, bufs[i].p);
    dc_params_free(&r->ps);
    free(r->x), free(r->g), free(r->W), free(r->bias), free(r->down), free(r->up);
}

// The layer's output, dx, and the gradients of its weight (NULL when frozen)
// and of the LoRA's factors, through the modules; fresh (zeroed) gradients.
typedef struct {
    float *y, *dx, *dw, *ddown, *dup;
} lout;

static inline int lrun_run(lrun *r, lout *o) {
    dc_backend *be = r->be;
    be->zero(be, r->ps.grad.p, (size_t)r->ps.numel * 4);
    be->zero(be, r->lo.params.grad.p, (size_t)r->lo.params.numel * 4);
    if (r->c.conv) {
        dc_conv2d_fwd(be, &r->ps, &r->cv, r->yd, r->xd, &r->s);
        dc_conv2d_bwd(be, &r->ps, &r->cv, r->dxd, r->gd, r->xd, &r->s, false);
    } else {
        dc_linear_fwd(be, &r->ps, &r->lin, r->yd, r->xd, r->c.B);
        dc_linear_bwd(be, &r->ps, &r->lin, r->dxd, r->gd, r->xd, r->c.B, false);
    }
    DC_TRY(dc_backend_status(be));
    o->y = lcase_get(be, r->yd, r->ny), o->dx = lcase_get(be, r->dxd, r->nx);
    o->dw = r->c.frozen ? NULL : lcase_grad(&r->ps, r->w);
    o->ddown = lcase_grad(&r->lo.params, r->lo.items[0].down), o->dup = lcase_grad(&r->lo.params, r->lo.items[0].up);
    return dc_backend_status(be);
}

static inline void lout_free(lout *o) { free(o->y), free(o->dx), free(o->dw), free(o->ddown), free(o->dup); }

// ---- the reference, in double -------------------------------------------------------------

typedef struct {
    double *x, *W, *down, *up;
} lref;

static inline double *lcase_wide(const float *h, int64_t n) {
    double *d = malloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = h[i];
    return d;
}

// y = conv(x, W + s up @ down) + bias, the layer's output in double.
static inline void lref_forward(const lrun *r, const lref *v, double *y) {
    const dc_conv2d_shape *s = &r->s;
    const int K = s->Ci * s->k * s->k, R = r->c.rank, Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s);
    const double sc = r->c.alpha / R * r->c.multiplier;
    double *we = malloc((size_t)r->nw * sizeof *we);  // [co, ci, k, k]
    for (int o = 0; o < s->Co; o++)
        for (int j = 0; j < K; j++) {
            double d = 0;
            for (int q = 0; q < R; q++) d += v->up[o * R + q] * v->down[q * K + j];
            we[o * K + j] = v->W[o * K + j] + sc * d;
        }
    for (int b = 0; b < s->B; b++)
        for (int o = 0; o < s->Co; o++)
            for (int ho = 0; ho < Ho; ho++)
                for (int wo = 0; wo < Wo; wo++) {
                    double acc = r->bias[o];
                    for (int ci = 0; ci < s->Ci; ci++)
                        for (int kh = 0; kh < s->k; kh++)
                            for (int kw = 0; kw < s->k; kw++) {
                                const int h = ho * s->stride + kh - s->pad_t, w = wo * s->stride + kw - s->pad_l;
                                if (h < 0 || h >= s->H || w < 0 || w >= s->W) continue;
                                const int64_t xi = s->nhwc ? (((int64_t)b * s->H + h) * s->W + w) * s->Ci + ci
                                                           : (((int64_t)b * s->Ci + ci) * s->H + h) * s->W + w;
                                acc += we[(o * s->Ci + ci) * s->k * s->k + kh * s->k + kw] * v->x[xi];
                            }
                    const int64_t yi = s->nhwc ? (((int64_t)b * Ho + ho) * Wo + wo) * s->Co + o
                                               : (((int64_t)b * s->Co + o) * Ho + ho) * Wo + wo;
                    y[yi] = acc;
                }
    free(we);
}

// sum over outputs of g * y: the loss whose derivatives the backward computes.
static inline double lref_loss(const lrun *r, const lref *v) {
    double *y = malloc((size_t)r->ny * sizeof *y), L = 0;
    lref_forward(r, v, y);
    for (int64_t i = 0; i < r->ny; i++) L += r->g[i] * y[i];
    free(y);
    return L;
}

// dL/d(t[i]) for every element of t (one of v's arrays) by central differences.
static inline double *lref_fd(const lrun *r, lref *v, double *t, int64_t n) {
    double *d = malloc((size_t)n * sizeof *d);
    const double h = 1e-3;  // L is linear in each value alone (bilinear in up, down): exact up to rounding
    for (int64_t i = 0; i < n; i++) {
        const double t0 = t[i];
        t[i] = t0 + h;
        const double lp = lref_loss(r, v);
        t[i] = t0 - h;
        const double lm = lref_loss(r, v);
        t[i] = t0;
        d[i] = (lp - lm) / (2 * h);
    }
    return d;
}

// max |a - b| / max |b|, or infinity if a holds a NaN or an infinity.
static inline double lcase_err(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num = fmax(num, fabs(a[i] - b[i])), den = fmax(den, fabs(b[i]));
    }
    return num / (den > 0 ? den : 1);
}
static inline double lcase_err_f(const float *a, const float *b, int64_t n) {
    double *w = lcase_wide(b, n);
    double e = lcase_err(a, w, n);
    free(w);
    return e;
}
