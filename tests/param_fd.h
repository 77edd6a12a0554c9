// Central differences of a model's loss along a random direction of one
// parameter tensor, for the gradient tests: L(w0 + eps v) and L(w0 - eps v)
// with v normal draws keyed by the tensor's index and eps `step` times the
// tensor's rms (at least 0.05), against the backward's <g, v>. The error is
// taken relative to |<g, v>| + |g|: <g, v> for normal v is of the size of
// |g|, so a direction nearly orthogonal to g does not demand more than the
// differences can give.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"
#include "core/rng.h"
#include "models/model.h"
#include "nn/params.h"

typedef struct {
    double fd, an;  // the differences' derivative, the backward's <g, v>
    double gn;      // |g| of the tensor
    double err;     // |fd - an| / (|an| + |g|)
} param_fd;

static inline double param_fd_dot(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// L = sum(dout * out) in double, out the n F32 values of a backend buffer.
static inline double param_fd_loss(dc_backend *be, dc_buf out, const float *dout, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return NAN;
    be->download(be, h, out.p, (size_t)n * 4);
    const double s = param_fd_dot(dout, h, n);
    free(h);
    return s;
}

// |a - b| and |b| of n values (a GPU's gradients against the CPU's), in double.
static inline void param_gap(const float *a, const float *b, int64_t n, double *diff, double *norm) {
    double d = 0, nb = 0;
    for (int64_t j = 0; j < n; j++) d += ((double)a[j] - b[j]) * ((double)a[j] - b[j]), nb += (double)b[j] * b[j];
    *diff = sqrt(d), *norm = sqrt(nb);
}

// Parameter i of ps (its master weights on be); g: every parameter's
// gradient in the flat layout. loss(ctx) runs a forward and returns L;
// set(ctx, i, h, n) writes parameter i's master weights (and refreshes what
// the forward reads).
static inline param_fd param_fd_check(dc_backend *be, const dc_params *ps, int i, const float *g, double step,
                                      double (*loss)(void *), void (*set)(void *, int, const float *, int64_t),
                                      void *ctx) {
    const int64_t n = ps->items[i].numel;
    const float *gi = g + ps->items[i].offset;
    float *w0 = malloc((size_t)n * 4), *w = malloc((size_t)n * 4), *v = malloc((size_t)n * 4);
    be->download(be, w0, dc_param_data(ps, i).p, (size_t)n * 4);
    const double rms = sqrt(param_fd_dot(w0, w0, n) / (double)n);
    const double eps = step * (rms > 0.05 ? rms : 0.05);
    for (int64_t j = 0; j < n; j++) v[j] = dc_randn_at(77, (uint32_t)i, 0, 1, (uint32_t)j);
    for (int64_t j = 0; j < n; j++) w[j] = (float)(w0[j] + eps * v[j]);
    set(ctx, i, w, n);
    const double lp = loss(ctx);
    for (int64_t j = 0; j < n; j++) w[j] = (float)(w0[j] - eps * v[j]);
    set(ctx, i, w, n);
    const double lm = loss(ctx);
    set(ctx, i, w0, n);
    param_fd r = {(lp - lm) / (2 * eps), param_fd_dot(gi, v, n), sqrt(param_fd_dot(gi, gi, n)), 0};
    r.err = fabs(r.fd - r.an) / (fabs(r.an) + r.gn + 1e-6);
    free(w0), free(w), free(v);
    return r;
}

// L = sum(dout * out) of a forward of m (out n F32 values), in double; NaN
// when the forward fails.
static inline double param_fd_model_loss(dc_model *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B,
                                         const float *hdout, int64_t n) {
    if (dc_model_forward(m, out, x, t, cond, B)) return NAN;
    return param_fd_loss(m->be, out, hdout, n);
}

// Every parameter's gradient of that L (the flat layout, on the host) after
// one forward and backward (dout: hdout on the backend); NULL, with the
// message printed, when either fails.
static inline float *param_fd_model_grads(dc_model *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B,
                                          const float *hdout, dc_buf dout, int64_t n) {
    const dc_params *ps = m->params;
    m->be->zero(m->be, ps->grad.p, (size_t)ps->numel * 4);
    if (!isfinite(param_fd_model_loss(m, out, x, t, cond, B, hdout, n)) || dc_model_backward(m, dout, B)) {
        printf("  backward: %s\n", dc_error());
        return NULL;
    }
    float *g = malloc((size_t)ps->numel * sizeof *g);
    if (g) m->be->download(m->be, g, ps->grad.p, (size_t)ps->numel * 4);
    return g;
}

// A GPU's gradients gg against the CPU's gc (ps's flat layout): each
// tensor's gap relative to its own norm, or for a key bias (whose true
// gradient is 0: both sides are rounding) to the whole gradient's; a tensor
// 0 on both sides (a layer not run) is passed over. Prints the first 8
// tensors over tol and the worst gap (label names the case); returns how
// many are over tol.
static inline int param_gpu_gaps(const dc_params *ps, const float *gg, const float *gc, double tol, const char *label) {
    const double all = sqrt(param_fd_dot(gc, gc, ps->numel));
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        double d, nb;
        param_gap(gg + p->offset, gc + p->offset, p->numel, &d, &nb);
        if (nb == 0 && d == 0) continue;
        const double e = d / (strstr(p->name, "k_proj.bias") ? all : nb + 1e-12);
        if (!(e < tol) && bad++ < 8) printf("  %s %s: GPU against CPU %.2e\n", label, p->name, e);
        if (!(e <= worst)) worst = e;
    }
    printf("  %s: worst gradient error %.2e of the norm (tolerance %.0e)\n", label, worst, tol);
    return bad;
}
