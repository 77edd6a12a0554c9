// What the CPU-vs-GPU op programs (test_cuda, test_cuda_latent, test_cuda_errors)
// share beyond cuda_pair.h: the normalised comparison of a pair's two copies,
// a check of a condition, views at an offset, the groups named on the command
// line, the sampler's model call for a DiT, and a main that runs a program's
// groups in both GPU modes (fp32 for checking, bf16 mixed precision).
//
// Error: ||gpu - cpu|| / ||cpu|| per output; NaN fails.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "cuda_pair.h"
#include "diffusion/gaussian.h"
#include "models/dit.h"

static double g_tol;   // for results computed in the compute dtype
static int g_fail, g_count;

// Compares the GPU's copy of p with the CPU's, prints one line and counts it.
static inline double compare(const char *name, pair p, double tol) {
    float *c = malloc(p.n * 4), *g = get_gpu(p);
    g_cpu->download(g_cpu, c, p.c.p, p.n * 4);
    double num = 0, den = 0;
    int64_t nan = 0;
    for (int64_t i = 0; i < p.n; i++) {
        if (!isfinite(g[i]) || !isfinite(c[i])) { nan++; continue; }
        num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        den += (double)c[i] * c[i];
    }
    double err = nan ? INFINITY : sqrt(num / (den > 0 ? den : 1e-300));
    bool ok = err <= tol;
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %-34s err %.2e  (tol %.0e)%s\n", ok ? "ok" : "FAIL", name, err, tol,
           nan ? "  NaN or unwritten values" : "");
    free(c), free(g);
    return err;
}


// Whether the GPU copies of a and b hold the same bytes, printed and counted.
static inline void expect_same(const char *name, pair a, pair b) {
    size_t bytes = a.n * dc_dtype_size(a.g.dt);
    char *ha = malloc(bytes), *hb = malloc(bytes);
    g_gpu->download(g_gpu, ha, a.g.p, bytes), g_gpu->download(g_gpu, hb, b.g.p, bytes);
    bool ok = a.n == b.n && memcmp(ha, hb, bytes) == 0;
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %s\n", ok ? "ok" : "FAIL", name);
    free(ha), free(hb);
}


// A backward op's weight and bias gradients written (DC_BWD_DW_SET) over
// NaN, sw and sb, against the GPU's added onto zero, aw and ab: the same
// bits, and the CPU's written within tol.
static inline void expect_written(const char *op, pair sw, pair aw, pair sb, pair ab, double tol) {
    char name[160];
    snprintf(name, sizeof name, "%s weights' gradient (fp32 =)", op);
    compare(name, sw, tol);
    snprintf(name, sizeof name, "%s bias's gradient (fp32 =)", op);
    compare(name, sb, tol);
    snprintf(name, sizeof name, "%s gradients written = added to zero, bit for bit", op);
    expect_same(name, sw, aw);
    expect_same(name, sb, ab);
}

// A view `off` elements into a pair (weights and biases are slices of one flat
// buffer, at any offset).
static inline pair offset(pair p, int64_t off) {
    return (pair){dc_buf_at(p.c, off), dc_buf_at(p.g, off), p.n - off};
}

// A check of a condition, printed and counted like a comparison.
static inline void expect(bool ok, const char *what) {
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
}

// The sampler's model call for a DiT.
static inline int eval_dit(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_dit_forward(ctx, out, x, t, cond->y, B);
}

// Groups to run: all, or those named in the second argument ("attention,adaln").
static const char *g_groups = "all";
static inline bool want(const char *group) {
    if (strcmp(g_groups, "all") == 0) return true;
    const char *p = strstr(g_groups, group);
    return p && (p == g_groups || p[-1] == ',');
}

// The program's main: the seed (default: the time) and the groups from the
// command line, then `groups` in each GPU mode. Skips (exit 0 unless a check
// already failed, with a message) where no GPU is present.
static inline int cuda_main(const char *prog, int argc, char **argv, void (*groups)(void)) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    if (argc > 2) g_groups = argv[2];
    g_rng = seed * 2654435761u + 88172645463325252ull;
    printf("%s: seed %llu\n", prog, (unsigned long long)seed);
    g_cpu = dc_backend_cpu_create();
    if (g_cpu->reserve(g_cpu, 16384, 128)) return printf("cpu reserve: %s\n", dc_error()), 1;
    for (int mode = 0; mode < 2; mode++) {
        g_gpu = dc_backend_cuda_create(mode == 0);
        if (!g_gpu) {
            printf("SKIP (no GPU) %s: %s\n", prog, dc_error());
            dc_backend_destroy(g_cpu);
            return g_fail ? 1 : 0;
        }
        g_ct = g_gpu->compute;
        g_tol = g_ct == DC_F32 ? 1e-5 : 1e-2;
        printf("== %s (compute %s) ==\n", g_gpu->name, dc_dtype_name(g_ct));
        groups();
        dc_backend_destroy(g_gpu);
    }
    dc_backend_destroy(g_cpu);
    printf("%s: %d checks, %d failed\n", prog, g_count, g_fail);
    return g_fail ? 1 : 0;
}
