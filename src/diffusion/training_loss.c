// Diffusion side of a training step: timesteps, noise, x_t, loss records and
// the loss op. No allocation: host scratch is fixed-size and used in chunks.
#include "diffusion/training_loss.h"

#include <assert.h>
#include "core/error.h"
#include "core/rng.h"

enum { CHUNK = 256 };  // samples per host scratch chunk

void dc_diffusion_draw_timesteps(int *t, const uint32_t *keys, int B, int n_steps, uint64_t seed,
                                 uint32_t step) {
    assert(n_steps >= 1);
    uint32_t range = (uint32_t)n_steps;
    uint32_t threshold = (uint32_t)(-range) % range;  // 2^32 mod range
    for (int b = 0; b < B; b++) {
        // Lemire (2019): hi32(x * range) is uniform once the low word's
        // biased zone [0, 2^32 mod range) is rejected.
        for (uint32_t j = 0;; j++) {
            uint32_t x = dc_rand_u32_at(seed, keys[b], step, DC_STREAM_TIMESTEP, j);
            uint64_t m = (uint64_t)x * range;
            if ((uint32_t)m >= threshold) {
                t[b] = (int)(m >> 32);
                break;
            }
        }
    }
}

int dc_diffusion_prepare_batch(dc_backend *be, const dc_schedule *s, dc_buf xt, dc_buf eps,
                               dc_buf t_model, dc_loss_coef *coef, dc_buf x0, const int *t,
                               const uint32_t *keys, int B, int64_t n, uint64_t seed,
                               uint32_t step) {
    if (B < 1 || n < 1) return dc_fail("diffusion batch: bad shape B=%d n=%lld", B, (long long)n);
    for (int b = 0; b < B; b++)
        DC_TRY(dc_schedule_loss_coef(s, t[b], &coef[b]));
    be->randn(be, eps, keys, B, n, seed, step, DC_STREAM_TRAIN_NOISE);
    float a[CHUNK], sd[CHUNK], tm[CHUNK];
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        for (int i = 0; i < nb; i++) {
            a[i] = coef[b0 + i].sqrt_abar;
            sd[i] = coef[b0 + i].sqrt_1m_abar;
            tm[i] = (float)s->timestep[t[b0 + i]];
        }
        int64_t off = (int64_t)b0 * n;
        be->q_sample(be, dc_buf_at(xt, off), dc_buf_at(x0, off), dc_buf_at(eps, off), a, sd, nb, n);
        // upload reads the host array before returning, so the chunk can be reused
        if (t_model.p) be->upload(be, dc_buf_at(t_model, b0).p, tm, sizeof(float) * (size_t)nb);
    }
    return 0;
}

int dc_diffusion_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf x0,
                      dc_buf xt, dc_buf eps, const dc_loss_coef *coef, int B, int C, int OC,
                      int64_t HW, float grad_scale, double *mse_sum, double *vb_sum) {
    if (B < 1 || C < 1 || HW < 1 || (OC != C && OC != 2 * C))
        return dc_fail("diffusion loss: bad shape B=%d C=%d OC=%d HW=%lld", B, C, OC, (long long)HW);
    if ((mse_sum || vb_sum) && !losses.p)
        return dc_fail("diffusion loss: sums requested without a losses buffer");
    be->diffusion_loss(be, dout, losses, out, x0, xt, eps, coef, B, C, OC, HW, grad_scale);
    if (!mse_sum && !vb_sum) return dc_backend_status(be);
    double ms = 0.0, vs = 0.0;
    float host[2 * CHUNK];
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        be->download(be, host, dc_buf_at(losses, 2 * (int64_t)b0).p, sizeof(float) * 2 * (size_t)nb);
        for (int i = 0; i < nb; i++) {
            ms += host[2 * i];
            vs += host[2 * i + 1];
        }
    }
    DC_TRY(dc_backend_status(be));
    if (mse_sum) *mse_sum = ms;
    if (vb_sum) *vb_sum = vs;
    return 0;
}
