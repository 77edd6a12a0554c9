// Shared by the op tests (test_ops.c: the DiT ops; test_ops_latent.c and
// test_ops_ff.c: the ops of latent diffusion): their start and end, fresh random inputs, backend buffers pre-filled with
// NaN, normalised errors, finite differences, SKIP for ops a backend lacks,
// and the thread-count check. Tolerances are justified in test_ops.c.
#pragma once
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"

#define TOL_FWD 1e-5
#define TOL_FD 1e-3
#define FD_H 1e-3

static dc_backend *g_be;
static int g_fail, g_count, g_skip;

// ---- random numbers (splitmix64: independent of the engine's Philox) -------------
static uint64_t g_rng;
static inline uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double rnd(double lo, double hi) { return lo + (hi - lo) * (rnd_u64() >> 11) * 0x1p-53; }
static inline float *host_rand(int64_t n, double lo, double hi) {
    float *x = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)rnd(lo, hi);
    return x;
}
static inline double *to_d(const float *x, int64_t n) {
    double *d = malloc(n * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

// ---- device buffers, all freed at the end of each test ---------------------------
static void *g_dev[64];
static int g_ndev;
static inline dc_buf dev_alloc(int64_t n) {
    void *p = g_be->alloc(g_be, (size_t)n * sizeof(float));
    if (!p) {
        printf("alloc failed: %s\n", dc_error());
        exit(1);
    }
    g_dev[g_ndev++] = p;
    return dc_buf_f32(p);
}
static inline dc_buf dev_from(const float *h, int64_t n) {
    dc_buf b = dev_alloc(n);
    g_be->upload(g_be, b.p, h, (size_t)n * sizeof(float));
    return b;
}
static inline dc_buf dev_nan(int64_t n) {
    float *h = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    dc_buf b = dev_from(h, n);
    free(h);
    return b;
}
static inline dc_buf dev_zero(int64_t n) {
    float *h = calloc(n, sizeof(float));
    dc_buf b = dev_from(h, n);
    free(h);
    return b;
}
static inline float *dev_get(dc_buf b, int64_t n) {  // caller frees
    float *h = malloc(n * sizeof(float));
    dc_backend_sync(g_be);
    g_be->download(g_be, h, b.p, (size_t)n * sizeof(float));
    return h;
}
static inline void dev_free_all(void) {
    while (g_ndev) g_be->free(g_be, g_dev[--g_ndev]);
}

// ---- checks ------------------------------------------------------------------------
static inline void report(const char *name, double err, double tol) {
    bool ok = err <= tol;  // false for NaN
    g_count++;
    if (!ok) g_fail++;
    printf("%-34s err %.2e  tol %.0e  %s\n", name, err, tol, ok ? "PASS" : "FAIL");
}
static inline double nerr(const float *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (isnan(got[i]) || isnan(ref[i])) return NAN;
        num = e > num ? e : num;
        den = fabs(ref[i]) > den ? fabs(ref[i]) : den;
    }
    return num / (den > 1e-6 ? den : 1e-6);
}
static inline void check(const char *name, const float *got, const double *ref, int64_t n, double tol) {
    report(name, nerr(got, ref, n), tol);
}
// Bitwise equality (copies, permutations, untouched memory, repeatability).
static inline void check_same(const char *name, const float *a, const float *b, int64_t n) {
    report(name, memcmp(a, b, n * sizeof(float)) == 0 ? 0.0 : INFINITY, 0.0);
}
// A backward op's weight and bias gradients written (DC_BWD_DW_SET) over
// NaN, sw and sb, against the same op's added onto zero, aw and ab (nw and
// nb values): the same bits.
static inline void check_written(const char *name, dc_buf sw, dc_buf aw, int64_t nw, dc_buf sb, dc_buf ab,
                                 int64_t nb) {
    float *s1 = dev_get(sw, nw), *a1 = dev_get(aw, nw), *s2 = dev_get(sb, nb), *a2 = dev_get(ab, nb);
    bool same = !memcmp(s1, a1, (size_t)nw * 4) && !memcmp(s2, a2, (size_t)nb * 4);
    report(name, same ? 0.0 : INFINITY, 0.0);
    free(s1), free(a1), free(s2), free(a2);
}

// ---- finite differences ----------------------------------------------------------
// L(x) for the reference of one op; FD perturbs one input array in place.
typedef double (*loss_fn)(void *ctx);

// Compares got[i] with (L(x + h e_i) - L(x - h e_i)) / 2h at the first and
// last few coordinates and `nrand` random ones.
static inline double fd_err(loss_fn L, void *ctx, double *x, int64_t n, const float *got, int nrand) {
    double num = 0, den = 0;
    int total = n < 8 + nrand ? (int)n : 8 + nrand;
    for (int s = 0; s < total; s++) {
        int64_t i = n <= 8 + nrand ? s : s < 4 ? s : s < 8 ? n - 8 + s : (int64_t)(rnd_u64() % n);
        double xi = x[i];
        x[i] = xi + FD_H;
        double lp = L(ctx);
        x[i] = xi - FD_H;
        double lm = L(ctx);
        x[i] = xi;
        double g = (lp - lm) / (2 * FD_H);
        if (isnan(got[i])) return NAN;
        num = fabs(got[i] - g) > num ? fabs(got[i] - g) : num;
        den = fabs(g) > den ? fabs(g) : den;
    }
    return num / (den > 1e-6 ? den : 1e-6);
}

static inline double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// ---- ops a backend lacks; thread counts -------------------------------------------------
// An op a backend does not have (NULL in its table) is reported, never run.
static inline bool have(const char *what, bool present) {
    if (!present) {
        g_skip++;
        printf("%-34s SKIP: backend %s has no such op\n", what, g_be->name);
    }
    return present;
}

// The CPU backend's results must not depend on its thread count: the body of
// `for (int k = 0; other_threads(k); k++)` runs with 1 thread, then with 3
// (more threads than this test may have cores: an uneven split), and must
// give the bits the default count gave. Restores the count; other backends skip.
static inline bool other_threads(int k) {
    static int saved;
    if (strcmp(g_be->name, "cpu") != 0) return false;
    if (k == 0) saved = omp_get_max_threads();
    if (k < 2) {
        omp_set_num_threads(k == 0 ? 1 : 3);
        return true;
    }
    omp_set_num_threads(saved);
    return false;
}
static inline const char *threads_tag(int k) { return k == 0 ? "1 thread" : "3 threads"; }


static inline double ref_gelu(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static inline double ref_silu(double x) { return x / (1 + exp(-x)); }

// A program's start: argv [seed] [backend] (the clock and "cpu" by default)
// into *seed and g_be; 0, or -1 with a message where the backend cannot be made.
static inline int ops_start(const char *prog, int argc, char **argv, uint64_t *seed_out) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    *seed_out = seed;
    const char *name = argc > 2 ? argv[2] : "cpu";
    g_rng = seed;
    if (dc_backend_create(name, &g_be) != 0) {
        printf("cannot create backend %s: %s\n", name, dc_error());
        return -1;
    }
    printf("%s: backend %s, seed %llu\n", prog, g_be->name, (unsigned long long)seed);
    return 0;
}

// A program's end: the count of checks (and of op groups skipped); its exit status.
static inline int ops_finish(uint64_t seed) {
    printf("%d of %d checks passed (seed %llu)", g_count - g_fail, g_count, (unsigned long long)seed);
    if (g_skip) printf("; %d op group(s) SKIPPED: not on this backend", g_skip);
    printf("\n");
    dc_backend_destroy(g_be);
    return g_fail ? 1 : 0;
}
