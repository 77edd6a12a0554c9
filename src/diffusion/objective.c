#include "diffusion/objective.h"

#include <math.h>
#include <stdlib.h>
#include "core/error.h"
#include "core/rng.h"

enum { CHUNK = 256 };  // samples per host scratch chunk

int dc_mse_objective_validate(const dc_mse_objective *o) {
    if (o->prediction != DC_PRED_EPS && o->prediction != DC_PRED_V && o->prediction != DC_PRED_SAMPLE)
        return dc_fail("objective: prediction %d is not epsilon, v or sample", (int)o->prediction);
    if (!(o->min_snr_gamma >= 0 && isfinite(o->min_snr_gamma)))
        return dc_fail("objective: Min-SNR gamma %g must be finite and >= 0", o->min_snr_gamma);
    if (!(o->noise_offset >= 0 && isfinite(o->noise_offset)))
        return dc_fail("objective: noise offset %g must be finite and >= 0", o->noise_offset);
    return 0;
}

// Min-SNR-gamma's weight at alphas_cumprod acp (diffusers' compute_snr and
// train_text_to_image.py). At snr 0 (a zero-terminal-SNR schedule's last
// step) the epsilon weight min(snr, gamma) / snr takes its limit, 1, where
// diffusers divides 0 by 0.
static double snr_weight(const dc_mse_objective *o, double acp) {
    if (o->min_snr_gamma <= 0) return 1.0;
    double snr = acp / (1.0 - acp), m = fmin(snr, (double)o->min_snr_gamma);
    switch (o->prediction) {
    case DC_PRED_EPS: return snr > 0 ? m / snr : 1.0;
    case DC_PRED_V: return m / (snr + 1.0);
    default: return m;
    }
}

// eps += noise_offset randn(B, C, 1, 1): each channel's offset broadcast over
// its HW elements in scratch, then added in one pass.
static int add_offset(dc_backend *be, const dc_mse_objective *o, dc_buf eps, dc_buf scratch, const uint32_t *keys,
                      int B, int C, int64_t HW, uint64_t seed, uint32_t step) {
    float *h = malloc(sizeof(float) * (size_t)C * (size_t)HW);
    if (!h) return dc_fail("objective: out of host memory for the noise offset");
    for (int b = 0; b < B; b++) {
        for (int c = 0; c < C; c++) {
            float v = (float)(o->noise_offset * dc_randn_at(seed, keys[b], step, DC_STREAM_NOISE_OFFSET, (uint32_t)c));
            for (int64_t i = 0; i < HW; i++) h[c * HW + i] = v;
        }
        // upload reads the host array before returning, so it can be refilled
        be->upload(be, dc_buf_at(scratch, (int64_t)b * C * HW).p, h, sizeof(float) * (size_t)C * (size_t)HW);
    }
    free(h);
    be->axpy(be, eps, scratch, 1.0f, (int64_t)B * C * HW);
    return 0;
}

int dc_mse_objective_prepare(dc_backend *be, const dc_mse_objective *o, const dc_schedule *s, dc_buf xt,
                             dc_buf eps, dc_buf target, dc_buf t_model, float *weight, dc_buf x0, dc_buf scratch,
                             const int *t, const uint32_t *keys, int B, int C, int64_t HW, uint64_t seed,
                             uint32_t step) {
    DC_TRY(dc_mse_objective_validate(o));
    if (B < 1 || C < 1 || HW < 1) return dc_fail("objective: bad shape B=%d C=%d HW=%lld", B, C, (long long)HW);
    if (!s->alphas_cumprod) return dc_fail("objective: the schedule has no alphas_cumprod (a discrete one is needed)");
    for (int b = 0; b < B; b++)
        if (t[b] < 0 || t[b] >= s->n) return dc_fail("objective: timestep %d outside [0, %d)", t[b], s->n);
    const int64_t n = (int64_t)C * HW;
    be->randn(be, eps, keys, B, n, seed, step, DC_STREAM_TRAIN_NOISE);
    if (o->noise_offset > 0) DC_TRY(add_offset(be, o, eps, scratch, keys, B, C, HW, seed, step));
    float a[CHUNK], sd[CHUNK], one[CHUNK], zero[CHUNK], neg[CHUNK], tm[CHUNK];
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        for (int i = 0; i < nb; i++) {
            double acp = s->alphas_cumprod[t[b0 + i]];
            a[i] = (float)sqrt(acp);
            sd[i] = (float)sqrt(1.0 - acp);
            neg[i] = -sd[i];
            one[i] = 1.0f, zero[i] = 0.0f;
            tm[i] = (float)(s->timestep ? s->timestep[t[b0 + i]] : t[b0 + i]);
            weight[b0 + i] = (float)snr_weight(o, acp);
        }
        int64_t off = (int64_t)b0 * n;
        dc_buf x0c = dc_buf_at(x0, off), ec = dc_buf_at(eps, off), tc = dc_buf_at(target, off);
        be->q_sample(be, dc_buf_at(xt, off), x0c, ec, a, sd, nb, n);
        switch (o->prediction) {
        case DC_PRED_EPS: be->q_sample(be, tc, ec, ec, one, zero, nb, n); break;
        case DC_PRED_V: be->q_sample(be, tc, ec, x0c, a, neg, nb, n); break;  // sqrt(acp) eps - sqrt(1-acp) x0
        default: be->q_sample(be, tc, x0c, x0c, one, zero, nb, n); break;
        }
        if (t_model.p) be->upload(be, dc_buf_at(t_model, b0).p, tm, sizeof(float) * (size_t)nb);
    }
    return dc_backend_status(be);
}

int dc_mse_objective_loss(dc_backend *be, dc_buf dout, dc_buf losses, dc_buf out, dc_buf target,
                          const float *weight, int B, int C, int64_t HW, float grad_scale) {
    if (B < 1 || C < 1 || HW < 1) return dc_fail("objective: bad shape B=%d C=%d HW=%lld", B, C, (long long)HW);
    dc_loss_coef coef[CHUNK] = {{0}};  // read only by the learned-sigma term, which OC = C leaves out
    float zero[CHUNK] = {0};
    for (int b0 = 0; b0 < B; b0 += CHUNK) {
        int nb = B - b0 < CHUNK ? B - b0 : CHUNK;
        int64_t off = (int64_t)b0 * C * HW;
        dc_buf dc = dout.p ? dc_buf_at(dout, off) : dout, lc = losses.p ? dc_buf_at(losses, 2 * (int64_t)b0) : losses;
        // the unweighted mean squared error and its gradient (the loss op with no variance channels)
        be->diffusion_loss(be, dc, lc, dc_buf_at(out, off), dc_buf_at(target, off), dc_buf_at(target, off),
                           dc_buf_at(target, off), coef, nb, C, C, HW, grad_scale);
        // each sample's rows scaled by its weight: x = w x + 0 x
        if (dc.p) be->q_sample(be, dc, dc, dc, weight + b0, zero, nb, (int64_t)C * HW);
        if (lc.p) be->q_sample(be, lc, lc, lc, weight + b0, zero, nb, 2);
    }
    return dc_backend_status(be);
}
