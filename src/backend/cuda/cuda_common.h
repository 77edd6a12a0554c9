// Shared by the CUDA backend's .cu files: error checks, bf16 loads and
// stores, launch helpers. Compiled by nvcc only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/dtype.h"

// Device-side element access for buffers that are either F32 or BF16.
__device__ __forceinline__ float dc_ld(const void *p, int64_t i, int bf16) {
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
__device__ __forceinline__ void dc_st(void *p, int64_t i, float v, int bf16) {
    if (bf16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    else ((float *)p)[i] = v;
}

// Four consecutive values at i (a multiple of 4) of an F32 buffer (16-byte
// aligned) or a BF16 one (8-byte aligned): one vector access instead of four.
__device__ __forceinline__ float4 dc_ld4(const void *p, int64_t i, int bf16) {
    if (!bf16) return *(const float4 *)((const float *)p + i);
    uint2 u = *(const uint2 *)((const __nv_bfloat16 *)p + i);
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void dc_st4(void *p, int64_t i, float4 v, int bf16) {
    if (!bf16) {
        *(float4 *)((float *)p + i) = v;
        return;
    }
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *(uint32_t *)&a, u.y = *(uint32_t *)&b;
    *(uint2 *)((__nv_bfloat16 *)p + i) = u;
}
// The values i .. i+3 that lie below n: a vector access when vec (the
// buffer's alignment allows it) and all four are there, else one by one.
__device__ __forceinline__ float4 dc_ld4_upto(const void *p, int64_t i, int64_t n, int bf16, bool vec) {
    if (vec && i + 4 <= n) return dc_ld4(p, i, bf16);
    float v[4];
    for (int k = 0; k < 4; k++) v[k] = i + k < n ? dc_ld(p, i + k, bf16) : 0.0f;
    return make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void dc_st4_upto(void *p, int64_t i, int64_t n, float4 v, int bf16, bool vec) {
    if (vec && i + 4 <= n) {
        dc_st4(p, i, v, bf16);
        return;
    }
    const float a[4] = {v.x, v.y, v.z, v.w};
    for (int k = 0; k < 4; k++)
        if (i + k < n) dc_st(p, i + k, a[k], bf16);
}

// Sum and max over the 32 lanes of a warp (every lane gets the result).
__device__ __forceinline__ float dc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double dc_warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float dc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Whether a buffer holds bf16 (the kernels' dtype flag), and pointer alignment.
#define BF(b) ((b).dt == DC_BF16)
static inline bool dc_aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }
// Whether a buffer allows dc_ld4 / dc_st4 (at multiples of 4 from its start).
static inline bool dc_vec4(dc_buf b) { return dc_aligned(b.p, b.dt == DC_BF16 ? 8 : 16); }

static inline unsigned dc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 1048576 ? 1048576 : b);
}
