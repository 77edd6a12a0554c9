// Optimiser ops on the GPU: AdamW fused with the EMA update and the refresh
// of the bf16 compute copy (one pass over the parameters, reading p, g, m, v,
// ema and writing p, m, v, ema, pc), and the gradient's sum of squares.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"

__global__ void k_adamw(float *p, const float *g, float *m, float *v, float *ema, void *pc, int pcbf,
                        int64_t n, dc_adamw_step h) {
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
                              int64_t n, const dc_adamw_step *h) {
    if (n <= 0) return;
    k_adamw<<<dc_blocks(n, 256), 256, 0, dc_cuda(be)->stream>>>((float *)p.p, (const float *)grad.p, (float *)m.p,
                                                                (float *)v.p, (float *)ema.p, pc.p,
                                                                pc.dt == DC_BF16, n, *h);
    DC_CUDA_LAUNCHED();
}

// A fixed grid of NB blocks, each summing a fixed slice in double; the host
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

extern "C" double dc_cuda_sumsq(dc_backend *be, dc_buf x, int64_t n) {
    dc_cuda_ctx *c = dc_cuda(be);
    if (n <= 0) return 0.0;
    k_sumsq<<<NB, TPB, 0, c->stream>>>(c->red, x.p, x.dt == DC_BF16, n);
    DC_CUDA_LAUNCHED();
    DC_CUDA(cudaMemcpyAsync(c->red_host, c->red, NB * sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    DC_CUDA(cudaStreamSynchronize(c->stream));
    double s = 0.0;
    for (int i = 0; i < NB; i++) s += c->red_host[i];
    return s;
}
