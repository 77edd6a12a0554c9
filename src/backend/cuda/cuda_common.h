// Shared by the CUDA backend's .cu files: error checks, bf16 loads and
// stores, launch helpers. Compiled by nvcc only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

// The shared-memory address of a generic pointer into shared memory (what
// cp.async, ldmatrix, mbarrier and TMA instructions take).
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

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
// A column's sum over n slices, p[0], p[ld], ..., p[(n-1) ld], by a block
// of DC_LS_COLS columns x DC_LS_LANES lanes (threadIdx.y): lane y adds
// slices y, y + DC_LS_LANES, ... in order, then the lanes' sums are added in
// order. Every thread calls it; lane 0 gets the sum. (A thread a column,
// adding all the slices, waited on its serial loads: 8-10 us a call where
// the columns were few.)
enum { DC_LS_COLS = 32, DC_LS_LANES = 8 };
template <typename T>
__device__ T dc_lane_sum(const T *p, int64_t ld, int n, bool live) {
    __shared__ T red[DC_LS_LANES][DC_LS_COLS];
    T s = 0;
    if (live)
#pragma unroll 4
        for (int k = threadIdx.y; k < n; k += DC_LS_LANES) s += p[(int64_t)k * ld];
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    T t = 0;
    if (threadIdx.y == 0)
        for (int y = 0; y < DC_LS_LANES; y++) t += red[y][threadIdx.x];
    __syncthreads();  // red is free for the next call
    return t;
}
static inline dim3 dc_lane_grid(int cols) { return dim3((unsigned)((cols + DC_LS_COLS - 1) / DC_LS_COLS)); }
static inline dim3 dc_lane_block(void) { return dim3(DC_LS_COLS, DC_LS_LANES); }

__device__ __forceinline__ float dc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Whether a buffer holds bf16 (the kernels' dtype flag), and pointer alignment.
#define BF(b) ((b).dt == DC_BF16)
static inline bool dc_aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }
// The current device's SM count (0 if it cannot be asked), asked once a device.
static inline int dc_cuda_sm_count(void) {
    static int known[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!known[dev] && cudaDeviceGetAttribute(&known[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        known[dev] = 0;
    return known[dev];
}
// Whether a buffer allows dc_ld4 / dc_st4 (at multiples of 4 from its start).
static inline bool dc_vec4(dc_buf b) { return dc_aligned(b.p, b.dt == DC_BF16 ? 8 : 16); }

static inline unsigned dc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 1048576 ? 1048576 : b);
}

// The 8 bf16 values of a 16-byte vector, as floats.
__device__ __forceinline__ void dc_unpack8(float (&f)[8], uint4 u) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 t = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}

// ---- programmatic dependent launch -------------------------------------------------------
// On Hopper a kernel started by dc_launch (cuda_ops.h) may be launched while
// the kernel ahead of it in the stream, or in a recorded step graph, drains
// its last blocks: the launch's latency hides behind that tail. Such a
// kernel calls dc_pdl_enter() before it touches global memory: it lets the
// kernel after it launch early in turn (that one still waits for this one to
// finish), then waits until the kernel ahead has finished and its writes are
// visible. For a kernel launched the plain way both return at once.
__device__ __forceinline__ void dc_pdl_enter(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
#endif
}

// ---- channels-last maps ------------------------------------------------------------------
// V consecutive values at i (a multiple of V) into v: V = 1, 4 (dc_ld4's
// alignment) or 8 (16-byte aligned buffers: one 16-byte access in BF16, two in F32).
template <int V>
__device__ __forceinline__ void dc_ldv(float (&v)[V], const void *p, int64_t i, int bf16) {
    if constexpr (V == 1) {
        v[0] = dc_ld(p, i, bf16);
    } else if constexpr (V == 4) {
        float4 a = dc_ld4(p, i, bf16);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
        static_assert(V == 8, "1, 4 or 8 values");
        if (bf16) {
            dc_unpack8(v, *(const uint4 *)((const __nv_bfloat16 *)p + i));
        } else {
            float4 a = *(const float4 *)((const float *)p + i), b = *(const float4 *)((const float *)p + i + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
    }
}
template <int V>
__device__ __forceinline__ void dc_stv(void *p, int64_t i, const float (&v)[V], int bf16) {
    if constexpr (V == 1) {
        dc_st(p, i, v[0], bf16);
    } else if constexpr (V == 4) {
        dc_st4(p, i, make_float4(v[0], v[1], v[2], v[3]), bf16);
    } else {
        static_assert(V == 8, "1, 4 or 8 values");
        if (bf16) {
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
                w[k] = *(uint32_t *)&h;
            }
            *(uint4 *)((__nv_bfloat16 *)p + i) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
            *(float4 *)((float *)p + i) = make_float4(v[0], v[1], v[2], v[3]);
            *(float4 *)((float *)p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
}

// The widest access (8, 4 or 1 values) at every multiple of it along rows of
// C channels that C and the buffers' alignment allow (buffers with a NULL
// pointer are not counted).
static inline int dc_vec_width(int C, dc_buf a, dc_buf b, dc_buf c) {
    const dc_buf bufs[3] = {a, b, c};
    bool v8 = C % 8 == 0, v4 = C % 4 == 0;
    for (int i = 0; i < 3; i++)
        if (bufs[i].p) v8 = v8 && dc_aligned(bufs[i].p, 16), v4 = v4 && dc_vec4(bufs[i]);
    return v8 ? 8 : v4 ? 4 : 1;
}

// Maps [rows, C] (a pixel's channels contiguous, the rows its pixels) are
// walked with each thread on V fixed channels, so what belongs to a channel
// (a bias, gamma and beta) is loaded once, and a stride of rows, so no index
// is divided per element. A block is ct x rt threads (blockDim.x, blockDim.y):
// ct columns of V channels side by side (a warp reads along a row), rt rows
// at a time; `tiles` blocks side by side cover rows of more than one block's columns.
typedef struct {
    int V, cols, ct, rt, tiles;  // cols = C / V
} dc_rows_geom;
static inline dc_rows_geom dc_rows_geom_make(int C, int V, int threads) {
    dc_rows_geom g;
    g.V = V, g.cols = C / V;
    g.tiles = (g.cols + threads - 1) / threads;
    g.ct = (g.cols + g.tiles - 1) / g.tiles;
    g.rt = threads / g.ct;
    return g;
}
// Rows a block takes: up to `per` rows a thread, fewer while that leaves the
// GPU fewer than about a thousand blocks (a batch of two 64x64 maps in eight-
// row chunks made 172 blocks, too few loads in flight to approach the
// memory's bandwidth). `rows` counts all of the maps' rows.
static inline int64_t dc_rows_chunk(const dc_rows_geom *g, int64_t rows, int per) {
    while (per > 1 && (rows + (int64_t)per * g->rt - 1) / ((int64_t)per * g->rt) * g->tiles < 1024) per /= 2;
    return (int64_t)per * g->rt;
}
