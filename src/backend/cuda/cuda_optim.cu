// Optimiser ops on the GPU: AdamW fused with the EMA update and the refresh
// of the bf16 compute copy (one pass over the parameters, reading p, g, m, v,
// ema and writing p, m, v, ema, pc), and the global gradient norm with its
// clipping factor, which stay on the device for AdamW to read.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

__global__ void k_adamw(float *p, const float *g, float *m, float *v, float *ema, void *pc, int pcbf,
                        const float *scale, int64_t n, dc_adamw_step h) {
    if (scale) h.grad_scale *= *scale;
    const float keep = h.ema_decay, take = 1.0f - h.ema_decay;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float pp = p[i], mm = m[i], vv = v[i];
        dc_adamw_update(&pp, &mm, &vv, g[i], &h);
        p[i] = pp, m[i] = mm, v[i] = vv;
        if (ema) ema[i] = keep * ema[i] + take * pp;
        if (pc) dc_st(pc, i, pp, pcbf);
    }
}

// The same per element, four at a time with 16-byte accesses (p, g, m, v,
// ema 16-byte aligned; pc bf16 and 8-byte aligned, or absent).
__global__ void k_adamw_v4(float4 *p, const float4 *g, float4 *m, float4 *v, float4 *ema, uint2 *pc,
                           const float *scale, int64_t n4, dc_adamw_step h) {
    if (scale) h.grad_scale *= *scale;
    const float keep = h.ema_decay, take = 1.0f - h.ema_decay;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 pp = p[i], mm = m[i], vv = v[i];
        const float4 gg = g[i];
        dc_adamw_update(&pp.x, &mm.x, &vv.x, gg.x, &h), dc_adamw_update(&pp.y, &mm.y, &vv.y, gg.y, &h);
        dc_adamw_update(&pp.z, &mm.z, &vv.z, gg.z, &h), dc_adamw_update(&pp.w, &mm.w, &vv.w, gg.w, &h);
        p[i] = pp, m[i] = mm, v[i] = vv;
        if (ema) {
            float4 e = ema[i];
            e.x = keep * e.x + take * pp.x, e.y = keep * e.y + take * pp.y;
            e.z = keep * e.z + take * pp.z, e.w = keep * e.w + take * pp.w;
            ema[i] = e;
        }
        if (pc) {
            __nv_bfloat162 a = __floats2bfloat162_rn(pp.x, pp.y), b = __floats2bfloat162_rn(pp.z, pp.w);
            pc[i] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
        }
    }
}

extern "C" void dc_cuda_adamw(dc_backend *be, dc_buf p, dc_buf grad, dc_buf m, dc_buf v, dc_buf ema, dc_buf pc,
                              dc_buf scale, int64_t n, const dc_adamw_step *h) {
    DC_CUDA_OP(be);
    if (n <= 0) return;
    cudaStream_t s = dc_cuda(be)->stream;
    const void *a16[5] = {p.p, grad.p, m.p, v.p, ema.p};
    bool vec = !pc.p || (pc.dt == DC_BF16 && dc_aligned(pc.p, 8));
    for (int i = 0; i < 5; i++) vec = vec && dc_aligned(a16[i], 16);
    const int64_t n4 = vec ? n / 4 : 0, done = 4 * n4;
    if (n4)
        k_adamw_v4<<<dc_blocks(n4, 256), 256, 0, s>>>((float4 *)p.p, (const float4 *)grad.p, (float4 *)m.p,
                                                      (float4 *)v.p, (float4 *)ema.p, (uint2 *)pc.p,
                                                      (const float *)scale.p, n4, *h);
    if (done < n) {  // the elements the vector kernel leaves (or all of them)
        const int64_t es = pc.dt == DC_BF16 ? 2 : 4;
        k_adamw<<<dc_blocks(n - done, 256), 256, 0, s>>>(
            (float *)p.p + done, (const float *)grad.p + done, (float *)m.p + done, (float *)v.p + done,
            ema.p ? (float *)ema.p + done : NULL, pc.p ? (char *)pc.p + done * es : NULL, pc.dt == DC_BF16,
            (const float *)scale.p, n - done, *h);
    }
    DC_CUDA_LAUNCHED(be);
}

// A fixed grid of NB blocks, each summing a fixed slice in double; one thread
// adds the NB partials in order. The result does not depend on timing.
enum { NB = 512, TPB = 256 };

// part[blockIdx.x] = the sum of the block's threads' s, added in a fixed tree.
__device__ void block_sum_to(double *part, double s) {
    __shared__ double sm[TPB];
    sm[threadIdx.x] = s;
    __syncthreads();
    for (int k = TPB / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sm[threadIdx.x] += sm[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sm[0];
}

__global__ void k_sumsq(double *part, const void *x, int bf, int64_t n) {
    int64_t per = (n + NB - 1) / NB, i0 = blockIdx.x * per, i1 = min(n, i0 + per);
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += TPB) {
        double t = dc_ld(x, i, bf);
        s += t * t;
    }
    block_sum_to(part, s);
}

// The same slices for an fp32 x (16-byte aligned), read four at a time; each
// slice starts on a multiple of 4.
__global__ void k_sumsq_f4(double *part, const float *x, int64_t n) {
    const int64_t per = ((n + NB - 1) / NB + 3) / 4 * 4, i0 = blockIdx.x * per, i1 = min(n, i0 + per);
    double s = 0.0;
    if (i1 > i0) {
        const int64_t v1 = i0 + (i1 - i0) / 4 * 4;
        for (int64_t i = i0 + 4 * threadIdx.x; i < v1; i += 4 * TPB) {
            const float4 t = *(const float4 *)(x + i);
            s += (double)t.x * t.x + (double)t.y * t.y + (double)t.z * t.z + (double)t.w * t.w;
        }
        for (int64_t i = v1 + threadIdx.x; i < i1; i += TPB) s += (double)x[i] * x[i];
    }
    block_sum_to(part, s);
}

// One thread adds the NB partials in order and writes [norm, clip factor].
__global__ void k_norm_finish(float *out, const double *part, float max_norm) {
    double s = 0.0;
    for (int i = 0; i < NB; i++) s += part[i];
    double norm = sqrt(s);
    out[0] = (float)norm;
    out[1] = dc_clip_factor(norm, max_norm);
}

extern "C" void dc_cuda_grad_norm(dc_backend *be, dc_buf out, dc_buf g, int64_t n, float max_norm) {
    DC_CUDA_OP(be);
    dc_cuda_ctx *c = dc_cuda(be);
    if (g.dt == DC_F32 && dc_aligned(g.p, 16))
        k_sumsq_f4<<<NB, TPB, 0, c->stream>>>(c->red, (const float *)g.p, n);
    else
        k_sumsq<<<NB, TPB, 0, c->stream>>>(c->red, g.p, g.dt == DC_BF16, n);
    k_norm_finish<<<1, 1, 0, c->stream>>>((float *)out.p, c->red, max_norm);
    DC_CUDA_LAUNCHED(be);
}
