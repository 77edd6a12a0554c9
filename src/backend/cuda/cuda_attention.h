// Shared by the attention files. One op (backend.h's attention_fwd/_bwd)
// runs through three paths, chosen per call by cuda_attention_op.cu:
//  - bf16 tensor cores (cuda_attention.cu forward, cuda_attention_bwd.cu
//    backward): FlashAttention-2 style, heads of at most ATTN_TC_MAX_DH;
//  - fp32 FMA kernels (cuda_attention_f32.cu), for checking: heads of at most
//    ATTN_F32_MAX_DH;
//  - blocks of queries (or keys) through cuBLASLt products with the scores in
//    a workspace (cuda_attention_big.cu): any head size, either dtype, and
//    values of another size than queries (Dv != Dh). The VAE's one head of 512.
// All three read q, k, v, out in any layout (element strides per sample,
// token and head), with Tq != Tk, a causal mask and any scale. Ahead of them
// the bf16 forward tries Hopper's wgmma kernel (cuda_attention_sm90.cu), the
// few-keys kernel (cuda_attention_short.cu), then cuDNN's
// (cuda_attention_cudnn.cu), and the bf16 backward tries cuDNN's, where the
// call fits those.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/backend.h"

#define ATTN_TC_MAX_DH 160   // bf16 tensor-core kernels (padded to 16, 32, 64, 80, 96, 128, 160)
#define ATTN_F32_MAX_DH 128  // fp32 kernels: each lane owns Dh / 32 accumulator columns
constexpr int kThreads = 128;  // every attention kernel: 4 warps

// One attention call as the kernels see it. Strides are in elements; the
// values of one head are contiguous. dout shares out's layout and dq, dk, dv
// those of q, k, v (backend.h). Passed by value to every kernel.
struct AttnParams {
    const void *q, *k, *v;
    const void *o, *dout;   // backward: the forward's output and its gradient
    void *out;              // forward output
    void *dq, *dk, *dv;     // backward outputs
    float *lse;             // [B, H, Tq]: written by forward, read by backward
    int64_t qb, qt, qh, kb, kt, kh, vb, vt, vh, ob, ot, oh;  // batch, token, head strides
    int B, H, Tq, Tk, Dh, Dv;
    int causal;             // query i sees keys j <= i + (Tk - Tq)
    float scale;
};

// The keys query `row` may see: [0, attn_key_end).
__host__ __device__ __forceinline__ int attn_key_end(const AttnParams &p, int row) {
    return p.causal ? min(p.Tk, row + (p.Tk - p.Tq) + 1) : p.Tk;
}

static inline unsigned dc_attn_grid(int B, int H, int T, int rows_per_block) {
    return (unsigned)((long long)B * H * ((T + rows_per_block - 1) / rows_per_block));
}

// Launchers, on the params' pointers in the path's dtype. vec: 16-byte
// loads are legal (every base, stride and Dh a multiple of 8 elements);
// pair: 4-byte stores of two bf16 are legal for the outputs.
void dc_attn_fwd_bf16(cudaStream_t s, const AttnParams &p, bool vec, bool pair);
void dc_attn_bwd_bf16(cudaStream_t s, const AttnParams &p, bool vec, bool pair);
// Whether the current device gives dc_attn_bwd_bf16's blocks for heads of Dh
// the shared memory they take (heads over 128 need 106 KB: an sm_86 or
// sm_89 GPU opts in to 99 KB at most, an A100 or H100 to more).
bool dc_attn_bwd_bf16_fits(int Dh);
void dc_attn_fwd_f32(cudaStream_t s, const AttnParams &p);
void dc_attn_bwd_f32(cudaStream_t s, const AttnParams &p);

// The product path. bf16: the tensors' dtype. Errors are recorded on be.
// Its scores live in the cuBLASLt workspace (see cuda_attention_big.cu);
// dc_attn_big_fits says whether a block of at least one row fits there.
void dc_attn_big_fwd(dc_backend *be, const AttnParams &p, bool bf16);
void dc_attn_big_bwd(dc_backend *be, const AttnParams &p, bool bf16);
bool dc_attn_big_fits(dc_backend *be, int Tq, int Tk, bool bf16);

// Hopper's flash attention (cuda_attention_sm90.cu): runs the bf16 forward
// and returns true where the device is an sm_90 GPU and the call fits it (no
// mask, Dh == Dv in 17..48 and a multiple of 8, at least 256 keys, 16-byte
// layouts), else returns false having launched nothing.
bool dc_attn_fwd_sm90(dc_backend *be, const AttnParams &p, const dc_attn_shape *shape);

// Attention over at most 128 keys (cuda_attention_short.cu): runs the bf16
// forward and returns true where the call fits it (no mask, Dh == Dv at most
// 48 and a multiple of 8, 16-byte layouts), else returns false having
// launched nothing.
bool dc_attn_fwd_short(dc_backend *be, const AttnParams &p, const dc_attn_shape *shape);

// cuDNN's fused flash attention (cuda_attention_cudnn.cu): runs the bf16
// forward (or backward) and returns true where its graph covers the call and cuDNN has a
// plan for the shape, else returns false and leaves the call to the kernels.
bool dc_cuda_attention_cudnn_fwd(dc_backend *be, const AttnParams *p, const dc_attn_shape *s);
bool dc_cuda_attention_cudnn_bwd(dc_backend *be, const AttnParams *p, const dc_attn_shape *s);
