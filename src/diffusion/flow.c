// Rectified flow: the FlowMatchEulerDiscreteScheduler ladder, the flow Euler
// plan and the training pair (see flow.h).
#include "diffusion/flow.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

double dc_flow_shift(double shift, double sigma) { return shift * sigma / (1 + (shift - 1) * sigma); }

int dc_schedule_init_flow(dc_schedule *s, int T, double shift) {
    memset(s, 0, sizeof *s);
    if (T < 1) return dc_fail("flow schedule: %d training steps", T);
    if (!(shift > 0 && isfinite(shift))) return dc_fail("flow schedule: shift %g must be above 0", shift);
    s->tables_ = malloc(sizeof(double) * 2 * (size_t)T);
    if (!s->tables_) return dc_fail("flow schedule: out of memory for %d steps", T);
    s->family = DC_SCHEDULE_FLOW;
    s->n = s->T = T;
    s->shift = shift;
    s->sigmas = s->tables_, s->log_sigmas = s->tables_ + T;
    for (int k = 0; k < T; k++) {  // timesteps linspace(1, T, T) / T, shifted
        s->sigmas[k] = dc_flow_shift(shift, (double)(k + 1) / T);
        s->log_sigmas[k] = log(s->sigmas[k]);
    }
    return 0;
}

int dc_flow_ladder(const dc_schedule *s, int n, double *t, double *sigma) {
    if (s->family != DC_SCHEDULE_FLOW) return dc_fail("flow sampler: the schedule is not a flow's");
    if (n < 1) return dc_fail("flow schedule: %d sampling steps", n);
    const double T = s->T, shift = s->shift;
    // np.linspace(sigma_max T, sigma_min T, n), then the shift once more
    const double hi = dc_schedule_sigma_max(s) * T, lo = dc_schedule_sigma_min(s) * T;
    // np.linspace(hi, lo, n): hi + i step, the last exactly lo
    const double step = n > 1 ? (lo - hi) / (n - 1) : 0;
    for (int i = 0; i < n; i++) {
        double u = (i == n - 1 && n > 1 ? lo : i * step + hi) / T;
        sigma[i] = dc_flow_shift(shift, u);
        t[i] = sigma[i] * T;
    }
    sigma[n] = 0;
    return 0;
}

int dc_flow_plan(const dc_schedule *s, int n, dc_sample_plan *plan) {
    DC_TRY(dc_sample_plan_init(plan, n));
    double *t = malloc(sizeof(double) * n), *sig = malloc(sizeof(double) * (n + 1));
    int rc = t && sig ? dc_flow_ladder(s, n, t, sig) : dc_fail("flow schedule: out of host memory");
    for (int i = 0; i < n && !rc; i++) {
        dc_sample_step *p = &plan->step[i];
        p->update = DC_UPDATE_AFFINE;
        p->sigma = sig[i], p->sigma_next = sig[i + 1];
        p->t = t[i];
        p->c_in = 1;
        p->dx = 0, p->de = 1;                         // d = v
        p->ax = 1, p->ad = sig[i + 1] - sig[i];       // x + (sigma_next - sigma) v
        p->noise_key = (uint32_t)i;
    }
    free(t), free(sig);
    if (rc) dc_sample_plan_free(plan);
    return rc;
}

int dc_flow_training_pair(dc_backend *be, dc_buf xt, dc_buf v, dc_buf x0, dc_buf noise, const float *sigma,
                          int B, int64_t n) {
    if (B < 1 || n < 1) return dc_fail("flow training: %d samples of %lld elements", B, (long long)n);
    float *a = malloc(sizeof(float) * 2 * (size_t)B), *b = a + B;
    if (!a) return dc_fail("flow training: out of host memory");
    for (int i = 0; i < B; i++) a[i] = 1.0f - sigma[i], b[i] = sigma[i];
    be->q_sample(be, xt, x0, noise, a, b, B, n);  // (1 - sigma) x0 + sigma noise
    for (int i = 0; i < B; i++) a[i] = -1.0f, b[i] = 1.0f;
    be->q_sample(be, v, x0, noise, a, b, B, n);   // noise - x0
    free(a);
    return dc_backend_status(be);
}
