// Element types. Every buffer carries one, so bf16/fp16 storage on an
// accelerator needs no redesign; the CPU backend computes in F32.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DC_F32, DC_F16, DC_BF16, DC_F64, DC_I64, DC_I32, DC_I16, DC_I8, DC_U8, DC_BOOL,
    DC_F8_E4M3, DC_F8_E5M2, DC_U16, DC_U32, DC_U64, DC_DTYPE_COUNT
} dc_dtype;

size_t dc_dtype_size(dc_dtype t);
const char *dc_dtype_name(dc_dtype t);           // safetensors spelling: "F32", "BF16", ...
int dc_dtype_parse(const char *s, dc_dtype *out);  // 0 or -1 (no message)

// Marks scalar math shared by host loops and device kernels.
#ifdef __CUDACC__
#define DC_HD __host__ __device__ __forceinline__
#else
#define DC_HD static inline
#endif

DC_HD float dc_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays NaN.
DC_HD uint16_t dc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// Exact, by bits (no libm call: loading a model converts a billion of them).
DC_HD float dc_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);      // inf, NaN (payload kept)
    else if (exp) u = sign | ((exp + 112u) << 23) | (man << 13);  // normal: rebias 15 -> 127
    else {                                                       // zero and subnormals: man 2^-24
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t dc_f32_to_f16(float f);

// A block of memory owned by one backend, with its element type.
typedef struct {
    void *p;
    dc_dtype dt;
} dc_buf;

static inline dc_buf dc_buf_f32(float *p) { return (dc_buf){p, DC_F32}; }
static inline dc_buf dc_buf_none(void) { return (dc_buf){NULL, DC_F32}; }
// The buffer advanced by n elements of its own type.
static inline dc_buf dc_buf_at(dc_buf b, int64_t n) {
    return (dc_buf){b.p ? (char *)b.p + n * (int64_t)dc_dtype_size(b.dt) : NULL, b.dt};
}

#ifdef __cplusplus
}
#endif
