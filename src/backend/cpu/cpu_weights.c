// Inference weights kept as loaded: F16 or BF16 parameters (nn/params.h,
// frozen sets) widened to F32 as an op reads them, so the ops compute exactly
// what they compute from F32 storage (every F16 and BF16 value is a float)
// while the model holds 2 bytes a weight.
//
// An op widens one whole weight into a slot of the backend's scratch and runs
// its usual products on it, unchanged: cutting a product into blocks of
// widened rows would let OpenBLAS pick other kernels and orders at the edges,
// and the results would no longer be the same bits. Each slot keeps the
// largest weight it has held (a 3x3 convolution of 1280 channels, 59 MB, in
// SD's UNet), so after the first step nothing is allocated.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_ops.h"

// Values per unit of the parallel widening: large enough that a thread's
// share streams (64 KiB of F32), small enough to spread a bias-sized weight.
#define WIDEN_CHUNK 16384

static void widen_f16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    // vcvtph2ps is exact, as dc_f16_to_f32 (subnormals included).
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = dc_f16_to_f32(src[i]);
}

static void widen_bf16(float *dst, const uint16_t *src, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = dc_bf16_to_f32(src[i]);
}

static void widen_run(float *dst, const void *src, dc_dtype dt, int64_t n) {
    if (dt == DC_F16) widen_f16(dst, src, n);
    else if (dt == DC_BF16) widen_bf16(dst, src, n);
    else memcpy(dst, src, (size_t)n * sizeof(float));
}

void dc_cpu_widen(float *dst, const void *src, dc_dtype dt, int64_t n) {
    assert((dt == DC_F32 || dt == DC_F16 || dt == DC_BF16) && "CPU weights are F32, F16 or BF16");
    const size_t es = dc_dtype_size(dt);
    const int64_t chunks = (n + WIDEN_CHUNK - 1) / WIDEN_CHUNK;
#pragma omp parallel for schedule(static) if (n > 2 * WIDEN_CHUNK)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i = c * WIDEN_CHUNK, len = n - i < WIDEN_CHUNK ? n - i : WIDEN_CHUNK;
        widen_run(dst + i, (const char *)src + i * es, dt, len);
    }
}

const float *dc_cpu_weight(dc_backend *be, dc_buf w, int64_t n, int slot) {
    if (w.dt == DC_F32) return w.p;
    dc_cpu_ctx *ctx = be->ctx;
    assert(slot >= 0 && slot < DC_CPU_WIDE_SLOTS);
    if ((size_t)n > ctx->wide_floats[slot]) {
        // A workspace like the others (cpu_backend.c), not the backend's
        // memory. The old contents are not needed: freed first, so the two
        // never coexist.
        free(ctx->wide[slot]);
        const size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
        ctx->wide[slot] = aligned_alloc(64, bytes);
        ctx->wide_floats[slot] = ctx->wide[slot] ? (size_t)n : 0;
        if (!ctx->wide[slot]) {
            dc_cpu_fail(be, "cpu backend: out of memory for %.1f MiB to widen %s weights", bytes / 1048576.0,
                        dc_dtype_name(w.dt));
            return NULL;
        }
    }
    dc_cpu_widen(ctx->wide[slot], w.p, w.dt, n);
    return ctx->wide[slot];
}

void dc_cpu_fail(dc_backend *be, const char *fmt, ...) {
    dc_cpu_ctx *ctx = be->ctx;
    if (ctx->error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
}
