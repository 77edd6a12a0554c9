// The activation arena: a model's activations and scratch, named buffers
// carved out of one backend allocation, so that forward and backward
// allocate nothing. A model's carve function runs twice over the same plan:
// first over an arena with no base, which only counts the bytes (what reserve
// allocates, and what the memory planner is told), then over the allocation,
// which places every buffer at the same offset. Each buffer starts on a
// 256-byte boundary (what every kernel's vector loads and cuBLASLt want).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct {
    char *base;   // NULL: counting only
    size_t used;  // bytes carved so far
    dc_dtype dt;  // the dtype of dc_arena_take (the backend's compute dtype)
} dc_arena;

static inline dc_arena dc_arena_counting(dc_dtype dt) {
    dc_arena a = {NULL, 0, dt};
    return a;
}
static inline dc_arena dc_arena_over(void *base, dc_dtype dt) {
    dc_arena a = {(char *)base, 0, dt};
    return a;
}
// n values of dt (with no base: a buffer with a NULL pointer).
static inline dc_buf dc_arena_take_dt(dc_arena *a, int64_t n, dc_dtype dt) {
    size_t bytes = ((size_t)n * dc_dtype_size(dt) + 255) & ~(size_t)255;
    dc_buf b = {a->base ? a->base + a->used : NULL, dt};
    a->used += bytes;
    return b;
}
static inline dc_buf dc_arena_take(dc_arena *a, int64_t n) { return dc_arena_take_dt(a, n, a->dt); }
// fp32 whatever the compute dtype: residual streams, saved statistics, lse.
static inline dc_buf dc_arena_take32(dc_arena *a, int64_t n) { return dc_arena_take_dt(a, n, DC_F32); }
