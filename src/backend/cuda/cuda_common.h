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

// Sum and max over the 32 lanes of a warp (every lane gets the result).
__device__ __forceinline__ float dc_warp_sum(float v) {
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

static inline unsigned dc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 1048576 ? 1048576 : b);
}
