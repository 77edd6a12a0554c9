// Diffusion ops on the GPU: randn, q_sample, the DiT training loss,
// classifier-free guidance and one reverse step. The formulas are the CPU's
// (diffusion_math.h), so both backends compute the same function; randn
// draws bit-identical numbers from the same Philox counters.
//
// Per-sample numbers from the host (keys, coefficients) travel inside the
// kernel's parameters, CHUNK samples per launch: no upload, no sync, and a
// captured graph would carry them.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/diffusion_math.h"
#include "core/rng.h"

enum { CHUNK = 64 };

typedef struct { uint32_t v[CHUNK]; } keys_t;
typedef struct { float a[CHUNK], s[CHUNK]; } qs_t;
typedef struct { dc_loss_coef c[CHUNK]; } coefs_t;

static cudaStream_t S(dc_backend *be) { return dc_cuda(be)->stream; }

// One thread per Philox block of 4 normals, exactly as dc_randn_at.
__global__ void k_randn(void *out, int obf, keys_t keys, int nb, int64_t n, uint64_t seed, uint32_t step,
                        uint32_t stream) {
    int64_t nblk = (n + 3) / 4, total = (int64_t)nb * nblk;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int b = (int)(i / nblk);
        int64_t blk = i % nblk;
        dc_u32x4 r = dc_philox((uint32_t)blk, keys.v[b], step, stream, seed);
        int64_t row = (int64_t)b * n;
        for (int pair = 0; pair < 2; pair++) {
            int64_t j = blk * 4 + pair * 2;
            if (j >= n) break;
            float u1 = dc_u32_to_unit(r.v[2 * pair]), u2 = dc_u32_to_unit(r.v[2 * pair + 1]);
            float rad = sqrtf(-2.0f * logf(u1)), th = 6.283185307179586f * u2;
            dc_st(out, row + j, rad * cosf(th), obf);
            if (j + 1 < n) dc_st(out, row + j + 1, rad * sinf(th), obf);
        }
    }
}

extern "C" void dc_cuda_randn(dc_backend *be, dc_buf out, const uint32_t *keys, int B, int64_t n, uint64_t seed,
                              uint32_t step, uint32_t stream) {
    DC_CUDA_OP(be);
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        keys_t k;
        memcpy(k.v, keys + b0, nb * sizeof(uint32_t));
        int64_t total = (int64_t)nb * ((n + 3) / 4);
        k_randn<<<dc_blocks(total, 256), 256, 0, S(be)>>>(dc_buf_at(out, (int64_t)b0 * n).p, BF(out), k, nb, n,
                                                          seed, step, stream);
    }
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_q_sample(void *xt, int obf, const void *x0, int xbf, const void *eps, int ebf, qs_t c, int nb,
                           int64_t n) {
    int64_t total = (int64_t)nb * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int b = (int)(i / n);
        dc_st(xt, i, dc_q_sample_elem(c.a[b], dc_ld(x0, i, xbf), c.s[b], dc_ld(eps, i, ebf)), obf);
    }
}

extern "C" void dc_cuda_q_sample(dc_backend *be, dc_buf xt, dc_buf x0, dc_buf eps, const float *a, const float *s,
                                 int B, int64_t n) {
    DC_CUDA_OP(be);
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        qs_t c;
        memcpy(c.a, a + b0, nb * sizeof(float));
        memcpy(c.s, s + b0, nb * sizeof(float));
        int64_t off = (int64_t)b0 * n;
        k_q_sample<<<dc_blocks((int64_t)nb * n, 256), 256, 0, S(be)>>>(
            dc_buf_at(xt, off).p, BF(xt), dc_buf_at(x0, off).p, BF(x0), dc_buf_at(eps, off).p, BF(eps), c, nb, n);
    }
    DC_CUDA_LAUNCHED(be);
}

// One block per sample: per-element terms and gradients, the two sums in
// double reduced in a fixed tree (deterministic).
enum { LOSS_TPB = 256 };
__global__ void k_diffusion_loss(void *dout, int gbf, float *losses, const void *out, int obf, const void *x0,
                                 int xbf, const void *xt, int tbf, const void *eps, int ebf, coefs_t coefs,
                                 int64_t N, bool sigma, float grad_scale) {
    __shared__ double sm[2][LOSS_TPB];
    int b = blockIdx.x;
    const dc_loss_coef *c = &coefs.c[b];
    double inv_n = 1.0 / (double)N, inv_n_ln2 = inv_n / DC_LN2;
    int64_t ob = (int64_t)b * (sigma ? 2 : 1) * N, xb = (int64_t)b * N;
    double mse = 0.0, vb = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += LOSS_TPB) {
        float eh = dc_ld(out, ob + i, obf);
        double dm, dv = 0.0;
        mse += dc_loss_mse_elem(dc_ld(eps, xb + i, ebf), eh, &dm);
        if (sigma)
            vb += dc_loss_vb_elem(c, eh, dc_ld(out, ob + N + i, obf), dc_ld(x0, xb + i, xbf),
                                  dc_ld(xt, xb + i, tbf), &dv);
        if (dout) {
            dc_st(dout, ob + i, (float)(grad_scale * dm * inv_n), gbf);
            if (sigma) dc_st(dout, ob + N + i, (float)(grad_scale * dv * inv_n_ln2), gbf);
        }
    }
    sm[0][threadIdx.x] = mse, sm[1][threadIdx.x] = vb;
    __syncthreads();
    for (int s = LOSS_TPB / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sm[0][threadIdx.x] += sm[0][threadIdx.x + s];
            sm[1][threadIdx.x] += sm[1][threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && losses) {
        losses[2 * b] = (float)(sm[0][0] * inv_n);
        losses[2 * b + 1] = (float)(sm[1][0] * inv_n_ln2);
    }
}

extern "C" void dc_cuda_diffusion_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0, dc_buf xt,
                                       dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                                       int64_t HW, float grad_scale) {
    DC_CUDA_OP(be);
    int64_t N = (int64_t)C * HW, ON = (int64_t)OC * HW;
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        coefs_t c;
        memcpy(c.c, coef + b0, nb * sizeof(dc_loss_coef));
        k_diffusion_loss<<<nb, LOSS_TPB, 0, S(be)>>>(
            dout.p ? dc_buf_at(dout, (int64_t)b0 * ON).p : NULL, BF(dout),
            losses.p ? (float *)losses.p + 2 * b0 : NULL, dc_buf_at(out, (int64_t)b0 * ON).p, BF(out),
            dc_buf_at(x0, (int64_t)b0 * N).p, BF(x0), dc_buf_at(xt, (int64_t)b0 * N).p, BF(xt),
            dc_buf_at(eps, (int64_t)b0 * N).p, BF(eps), c, N, OC == 2 * C, grad_scale);
    }
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_cfg_combine(void *dst, int dbf, const void *mo, int mbf, int64_t half, int OC, int64_t HW,
                              int guided, float scale) {
    dc_pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < half; i += (int64_t)gridDim.x * blockDim.x) {
        int ch = (int)((i / HW) % OC);
        float cond = dc_ld(mo, i, mbf);
        dc_st(dst, i, ch < guided ? dc_cfg_elem(cond, dc_ld(mo, half + i, mbf), scale) : cond, dbf);
    }
}

extern "C" void dc_cuda_cfg_combine(dc_backend *be, dc_buf dst, dc_buf model_out, int B, int OC, int64_t HW,
                                    int guided, float scale) {
    DC_CUDA_OP(be);
    int64_t half = (int64_t)B * OC * HW;
    dc_launch(be, k_cfg_combine, dc_blocks(half, 256), 256, 0, dst.p, BF(dst), model_out.p, BF(model_out), half, OC, HW,
              guided, scale);
    DC_CUDA_LAUNCHED(be);
}

__global__ void k_sampler_step(void *x, int xbf, const void *out, int obf, const void *z, int zbf, dc_step_coef c,
                               int C, int OC, int64_t HW, int64_t total) {
    dc_pdl_enter();
    int64_t N = (int64_t)C * HW;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = i / N, r = i % N, ob = b * OC * HW;
        float v = OC == 2 * C ? dc_ld(out, ob + N + r, obf) : 0.0f;
        float zz = c.add_noise ? dc_ld(z, i, zbf) : 0.0f;
        dc_st(x, i, dc_step_elem(&c, dc_ld(x, i, xbf), dc_ld(out, ob + r, obf), v, zz), xbf);
    }
}

extern "C" void dc_cuda_sampler_step(dc_backend *be, dc_buf x, dc_buf out, dc_buf z, const dc_step_coef *coef,
                                     int B, int C, int OC, int64_t HW) {
    DC_CUDA_OP(be);
    int64_t total = (int64_t)B * C * HW;
    dc_launch(be, k_sampler_step, dc_blocks(total, 256), 256, 0, x.p, BF(x), out.p, BF(out), z.p, BF(z), *coef, C, OC,
              HW, total);
    DC_CUDA_LAUNCHED(be);
}
