// Central differences of a model's loss along a random direction of one
// parameter tensor, for the gradient tests: L(w0 + eps v) and L(w0 - eps v)
// with v normal draws keyed by the tensor's index and eps `step` times the
// tensor's rms (at least 0.05), against the backward's <g, v>. The error is
// taken relative to |<g, v>| + |g|: <g, v> for normal v is of the size of
// |g|, so a direction nearly orthogonal to g does not demand more than the
// differences can give.
#pragma once
#include <math.h>
#include <stdlib.h>
#include "core/rng.h"
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
