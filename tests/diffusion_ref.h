// What the diffusion-layer programs (test_diffusion, test_sampler) share: the
// check that prints one line, a host-memory backend holding only the ops under
// test, and the independent long-double schedule (the base linear one, the
// respacing of respace.py and the closed forms of a process keeping some of
// its steps) that the references are written against.
#pragma once
#include <fenv.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"  // the ops under test: dc_cpu_randn, ...

typedef long double ld;
static int g_fail;

static void check(const char *name, bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("[%s] %-44s ", ok ? " ok " : "FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok) g_fail++;
}

// ---- a host-memory backend holding only the ops under test ----------------------------
static void *h_alloc(dc_backend *be, size_t n) { (void)be; return calloc(1, n ? n : 1); }
static void h_free(dc_backend *be, void *p) { (void)be; free(p); }
static void h_copy(dc_backend *be, void *d, const void *s, size_t n) { (void)be; memcpy(d, s, n); }
static void h_zero(dc_backend *be, void *d, size_t n) { (void)be; memset(d, 0, n); }
static void h_sync(dc_backend *be) { (void)be; }
static dc_backend test_backend(void) {
    dc_backend be;
    memset(&be, 0, sizeof be);
    be.name = "test-host";
    be.compute = DC_F32;
    be.alloc = h_alloc, be.free = h_free, be.upload = h_copy, be.download = h_copy;
    be.copy = h_copy, be.zero = h_zero, be.sync = h_sync;
    be.randn = dc_cpu_randn, be.q_sample = dc_cpu_q_sample;
    be.diffusion_loss = dc_cpu_diffusion_loss, be.cfg_combine = dc_cpu_cfg_combine;
    be.sampler_step = dc_cpu_sampler_step;
    return be;
}

static float *fbuf(size_t n) { return calloc(n, sizeof(float)); }

// Relative error with a floor, NaN-safe: returns +inf on NaN.
static double relerr(ld a, ld b, ld floor_) {
    ld d = fabsl(a - b), m = fabsl(b) > floor_ ? fabsl(b) : floor_;
    double r = (double)(d / m);
    return r == r ? r : INFINITY;
}

// ---- independent long-double schedule ----------------------------------------------------
typedef struct {
    int n, ts[1000];
    ld abar[1000], abar_prev[1000], beta[1000], pv[1000], clipped[1000], c1[1000], c2[1000];
    ld sra[1000], srm1[1000], sab[1000], s1m[1000];
} ld_proc;

static ld g_base_abar[1000], g_base_beta[1000];

static void ld_base_init(void) {
    ld acc = 1.0L;
    for (int i = 0; i < 1000; i++) {
        g_base_beta[i] = 1e-4L + (0.02L - 1e-4L) * (ld)i / 999.0L;  // exact linspace
        acc *= 1.0L - g_base_beta[i];
        g_base_abar[i] = acc;
    }
}

// Python's round(x): rint in the round-to-nearest-even mode.
static int py_round(double x) {
    fesetround(FE_TONEAREST);
    return (int)nearbyint(x);
}
// respace.py space_timesteps(1000, "N"): the index is accumulated by addition.
static void ref_space(int N, int *out) {
    double stride = N <= 1 ? 1.0 : 999.0 / (double)(N - 1), cur = 0.0;
    for (int i = 0; i < N; i++, cur += stride) out[i] = py_round(cur);
}

// The process keeping steps ts[0..n) of the base one, in closed form:
// abar_k = abar[ts[k]], abar_prev_k = abar[ts[k-1]], beta_k = 1 - abar_k / abar_prev_k.
static void ld_proc_init(ld_proc *p, const int *ts, int n) {
    p->n = n;
    for (int k = 0; k < n; k++) {
        p->ts[k] = ts[k];
        p->abar[k] = g_base_abar[ts[k]];
        p->abar_prev[k] = k ? g_base_abar[ts[k - 1]] : 1.0L;
        p->beta[k] = 1.0L - p->abar[k] / p->abar_prev[k];
        p->pv[k] = p->beta[k] * (1.0L - p->abar_prev[k]) / (1.0L - p->abar[k]);
        p->c1[k] = p->beta[k] * sqrtl(p->abar_prev[k]) / (1.0L - p->abar[k]);
        p->c2[k] = (1.0L - p->abar_prev[k]) * sqrtl(p->abar[k] / p->abar_prev[k]) / (1.0L - p->abar[k]);
        p->sra[k] = 1.0L / sqrtl(p->abar[k]);
        p->srm1[k] = sqrtl((1.0L - p->abar[k]) / p->abar[k]);
        p->sab[k] = sqrtl(p->abar[k]);
        p->s1m[k] = sqrtl(1.0L - p->abar[k]);
    }
    for (int k = 0; k < n; k++) p->clipped[k] = logl(p->pv[k == 0 && n > 1 ? 1 : k]);
}

// The program's last line and exit status.
static int finish(const char *prog) {
    if (g_fail) {
        printf("%s: %d check(s) FAILED\n", prog, g_fail);
        return 1;
    }
    printf("%s: all checks passed\n", prog);
    return 0;
}
