// Shared by the CPU-vs-GPU test programs (test_cuda, test_cuda_latent,
// test_cuda_errors, test_cuda_attention): the two backends, a fresh-input
// generator, and tensors held on both, the CPU copy in fp32 and the GPU copy in
// the GPU's compute dtype (g_ct). (The functions are inline so that a program
// using only some of them compiles without warnings.)
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/error.h"

static dc_backend *g_cpu, *g_gpu;
static dc_dtype g_ct;  // the GPU's compute dtype

// ---- random numbers and buffers ------------------------------------------------------------
static uint64_t g_rng;
static inline double rnd(double lo, double hi) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (g_rng >> 11) * 0x1p-53;
}

// A tensor on both backends: the CPU copy in fp32, the GPU copy in dt.
typedef struct { dc_buf c, g; int64_t n; } pair;
static void *g_allocs[256][2];
static int g_nallocs;

static inline pair make(int64_t n, dc_dtype dt) {
    pair p = {{g_cpu->alloc(g_cpu, n * 4), DC_F32}, {g_gpu->alloc(g_gpu, n * dc_dtype_size(dt)), dt}, n};
    if (!p.c.p || !p.g.p) { printf("allocation failed: %s\n", dc_error()); exit(1); }
    g_allocs[g_nallocs][0] = p.c.p, g_allocs[g_nallocs][1] = p.g.p, g_nallocs++;
    return p;
}

// Writes host values (rounded to the GPU dtype) to both copies.
static inline void put(pair p, const float *h) {
    float *r = calloc(p.n, 4);
    uint16_t *b = malloc(p.n * 2);
    for (int64_t i = 0; i < p.n; i++) {
        r[i] = h[i];
        if (p.g.dt == DC_BF16) b[i] = dc_f32_to_bf16(h[i]), r[i] = dc_bf16_to_f32(b[i]);
    }
    g_cpu->upload(g_cpu, p.c.p, r, p.n * 4);
    g_gpu->upload(g_gpu, p.g.p, p.g.dt == DC_BF16 ? (void *)b : (void *)r, p.n * dc_dtype_size(p.g.dt));
    free(r), free(b);
}

static inline pair rand_pair(int64_t n, dc_dtype dt, double lo, double hi) {
    pair p = make(n, dt);
    float *h = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = (float)rnd(lo, hi);
    put(p, h);
    free(h);
    return p;
}

// NaN on both sides: an output the op fails to write shows up as NaN.
static inline pair nan_pair(int64_t n, dc_dtype dt) {
    pair p = make(n, dt);
    float *h = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    put(p, h);
    free(h);
    return p;
}

static inline float *get_gpu(pair p) {
    float *h = malloc(p.n * 4);
    if (p.g.dt == DC_BF16) {
        uint16_t *b = malloc(p.n * 2);
        g_gpu->download(g_gpu, b, p.g.p, p.n * 2);
        for (int64_t i = 0; i < p.n; i++) h[i] = dc_bf16_to_f32(b[i]);
        free(b);
    } else {
        g_gpu->download(g_gpu, h, p.g.p, p.n * 4);
    }
    return h;
}

// Frees every pair made since the last release.
static inline void release(void) {
    for (int i = 0; i < g_nallocs; i++) {
        g_cpu->free(g_cpu, g_allocs[i][0]);
        g_gpu->free(g_gpu, g_allocs[i][1]);
    }
    g_nallocs = 0;
}
