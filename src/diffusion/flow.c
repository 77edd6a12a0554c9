// Rectified flow: the FlowMatchEulerDiscreteScheduler ladder, the flow Euler
// plan and the training pair (see flow.h).
#include "diffusion/flow.h"

#include <math.h>
#include <stdlib.h>
#include "core/error.h"

double dc_flow_shift(double shift, double sigma) { return shift * sigma / (1 + (shift - 1) * sigma); }

int dc_flow_ladder(const dc_flow_sched *f, int n, double *t, double *sigma) {
    if (f->T < 1) return dc_fail("flow schedule: %d training steps", f->T);
    if (!(f->shift > 0 && isfinite(f->shift))) return dc_fail("flow schedule: shift %g must be above 0", f->shift);
    if (n < 1) return dc_fail("flow schedule: %d sampling steps", n);
    const double T = f->T;
    const double hi = dc_flow_shift(f->shift, 1.0) * T, lo = dc_flow_shift(f->shift, 1.0 / T) * T;
    // np.linspace(hi, lo, n): hi + i step, the last exactly lo
    const double step = n > 1 ? (lo - hi) / (n - 1) : 0;
    for (int i = 0; i < n; i++) {
        double s = (i == n - 1 && n > 1 ? lo : i * step + hi) / T;
        sigma[i] = dc_flow_shift(f->shift, s);
        t[i] = sigma[i] * T;
    }
    sigma[n] = 0;
    return 0;
}

int dc_flow_plan(const dc_flow_sched *f, int n, dc_sample_plan *plan) {
    DC_TRY(dc_sample_plan_init(plan, n));
    double *t = malloc(sizeof(double) * n), *sig = malloc(sizeof(double) * (n + 1));
    int rc = t && sig ? dc_flow_ladder(f, n, t, sig) : dc_fail("flow schedule: out of host memory");
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
