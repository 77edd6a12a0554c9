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

extern "C" void dc_cuda_adamw(dc_backend *be, dc_buf p, dc_buf grad, dc_buf m, dc_buf v, dc_buf ema, dc_buf pc,
                              dc_buf scale, int64_t n, const dc_adamw_step *h) {
    DC_CUDA_OP(be);
    if (n <= 0) return;
    k_adamw<<<dc_blocks(n, 256), 256, 0, dc_cuda(be)->stream>>>((float *)p.p, (const float *)grad.p, (float *)m.p,
                                                                (float *)v.p, (float *)ema.p, pc.p,
                                                                pc.dt == DC_BF16, (const float *)scale.p, n, *h);
    DC_CUDA_LAUNCHED(be);
}

// A fixed grid of NB blocks, each summing a fixed slice in double; one thread
// adds the NB partials in order. The result does not depend on timing.
enum { NB = 512, TPB = 256 };
__global__ void k_sumsq(double *part, const void *x, int bf, int64_t n) {
    __shared__ double sm[TPB];
    int64_t per = (n + NB - 1) / NB, i0 = blockIdx.x * per, i1 = min(n, i0 + per);
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += TPB) {
        double t = dc_ld(x, i, bf);
        s += t * t;
    }
    sm[threadIdx.x] = s;
    __syncthreads();
    for (int k = TPB / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sm[threadIdx.x] += sm[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sm[0];
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
    k_sumsq<<<NB, TPB, 0, c->stream>>>(c->red, g.p, g.dt == DC_BF16, n);
    k_norm_finish<<<1, 1, 0, c->stream>>>((float *)out.p, c->red, max_norm);
    DC_CUDA_LAUNCHED(be);
}
