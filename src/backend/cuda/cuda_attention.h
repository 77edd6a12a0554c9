// Shared by the two attention files: the limits and the launch shape. The
// fp32 path (cuda_attention_f32.cu) is for checking; the bf16 tensor-core
// path and the exported entry points are in cuda_attention.cu.
#pragma once
#include <cuda_runtime.h>

#define ATTN_MAX_DH 128
constexpr int kThreads = 128;  // every attention kernel: 4 warps

// Launch with the same contract as dc_cuda_attn_fwd / _bwd, on fp32 buffers.
void dc_cuda_attn_fwd_f32(cudaStream_t s, float *out, float *lse, const float *qkv, int B, int T, int D, int H);
void dc_cuda_attn_bwd_f32(cudaStream_t s, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int B, int T, int D, int H);

static inline unsigned dc_attn_grid(int B, int H, int T, int rows_per_block) {
    return (unsigned)((long long)B * H * ((T + rows_per_block - 1) / rows_per_block));
}
