// Rectified flow: the FlowMatchEulerDiscreteScheduler ladder against values
// computed in double precision from diffusers' formulas, the flow Euler
// sampler on the sampling loop against the exact ODE solution for Gaussian
// data, and the training pair against naive double code.
//
// The ladder's reference values: diffusers/schedulers/
// scheduling_flow_match_euler_discrete.py, __init__ (sigmas = shift s / (1 +
// (shift - 1) s) over s = linspace(1, T, T)[::-1] / T) and set_timesteps
// (timesteps = linspace(sigma_max T, sigma_min T, n), shifted once more,
// timesteps = sigmas T, a final sigma 0), evaluated in Python floats
// (float64; diffusers itself rounds them to float32, 6e-8 relative).
//
// The closed form: for data x0 ~ N(mu, s^2) per element and x_sigma = (1 -
// sigma) x0 + sigma n, x_sigma ~ N(m, V) with m = (1 - sigma) mu and V = (1 -
// sigma)^2 s^2 + sigma^2, and the exact velocity E[n - x0 | x] is
//   v(x, sigma) = (sigma - (1 - sigma) s^2) / V (x - m) - mu.
// Along its ODE, (x - m) / sqrt(V) stays constant, so the start x = z at
// sigma 1 ends at mu + s z at sigma 0. Euler's method is of first order: its
// error at the end shrinks as 1 / steps.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "core/rng.h"
#include "diffusion/flow.h"
#include "diffusion/sampler.h"

enum { B = 3, N = 40 };  // samples, elements per sample (C 2, H 4, W 5)

static double frand(uint32_t key, uint32_t j) { return dc_randn_at(20261128, key, 0, 7, j); }

static void test_ladder(void) {
    struct {
        double shift;
        int n;
        double t[5], sigma[6];
    } want[] = {
        {3.0, 4, {1000.0, 857.6923076923075, 602.1505376344084, 8.92857142857143},
         {1.0, 0.8576923076923075, 0.6021505376344084, 0.00892857142857143, 0.0}},
        {1.0, 3, {1000.0, 500.49999999999994, 1.0}, {1.0, 0.5005, 0.001, 0.0}},
        {7.0, 5, {1000.0, 954.9472355010372, 876.514215080346, 705.772629098763, 46.755725190839705},
         {1.0, 0.9549472355010372, 0.8765142150803461, 0.705772629098763, 0.0467557251908397, 0.0}},
    };
    for (size_t c = 0; c < sizeof want / sizeof want[0]; c++) {
        dc_schedule f;
        double t[5], sig[6], e = 0;
        int n = want[c].n, rc = dc_schedule_init_flow(&f, 1000, want[c].shift);
        if (!rc) rc = dc_flow_ladder(&f, n, t, sig);
        for (int i = 0; i <= n && !rc; i++) {
            if (i < n) e = fmax(e, fabs(t[i] - want[c].t[i]) / want[c].t[i]);
            e = fmax(e, fabs(sig[i] - want[c].sigma[i]) / fmax(want[c].sigma[i], 1e-300));
        }
        CHECK(rc == 0 && e <= 1e-13, "flow ladder shift %g, %d steps: relative error %.3e (%s)", want[c].shift,
              n, e, rc ? dc_error() : "ran");
        dc_schedule_free(&f);
    }
    // One step: sigma_max alone, which the shift keeps at 1.
    dc_schedule f;
    double t[2], sig[2];
    int rc = dc_schedule_init_flow(&f, 1000, 3.0);
    CHECK(rc == 0 && dc_flow_ladder(&f, 1, t, sig) == 0 && t[0] == 1000 && sig[0] == 1 && sig[1] == 0,
          "flow ladder of one step: t %g, sigmas %g %g", t[0], sig[0], sig[1]);
    CHECK(rc == 0 && dc_flow_ladder(&f, 0, t, sig) != 0, "0 steps are refused");
    dc_schedule_free(&f);
    CHECK(dc_schedule_init_flow(&f, 1000, 0) != 0, "a shift of 0 is refused");
    // A discrete schedule is not a flow's.
    CHECK(dc_schedule_init_gaussian(&f, 1000, 10) == 0 && dc_flow_ladder(&f, 4, t, sig) != 0,
          "a flow ladder on a discrete schedule is refused");
    dc_schedule_free(&f);
}

// The oracle model: the exact velocity of N(mu, s^2) data, per element.
typedef struct {
    dc_backend *be;
    double mu[N], s[N];
    int T, evals;
} oracle;

static double velocity(const oracle *o, int j, double x, double sigma) {
    double m = (1 - sigma) * o->mu[j], s2 = o->s[j] * o->s[j];
    double V = (1 - sigma) * (1 - sigma) * s2 + sigma * sigma;
    return (sigma - (1 - sigma) * s2) / V * (x - m) - o->mu[j];
}

static int oracle_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int rows) {
    (void)cond;
    oracle *o = ctx;
    float xs[B * N], ts[B], vs[B * N];
    o->be->download(o->be, xs, x.p, sizeof(float) * rows * N);
    o->be->download(o->be, ts, t.p, sizeof(float) * rows);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < N; j++) vs[r * N + j] = (float)velocity(o, j, xs[r * N + j], ts[r] / (double)o->T);
    o->be->upload(o->be, out.p, vs, sizeof(float) * rows * N);
    o->evals++;
    return 0;
}

// The flow Euler sampler of `steps` on the loop from start noise z; returns
// the largest error against the exact endpoint mu + s z and (in *vs_ref)
// against the same Euler method in double precision.
static double run_flow(dc_backend *be, oracle *o, double shift, int steps, const float *z, double *vs_ref) {
    dc_schedule f;
    dc_sample_plan plan;
    dc_sampler smp;
    dc_sample_setup set = {.seed = 1, .x_given = true};
    float x[B * N];
    int32_t y[B] = {0, 1, 2};
    uint32_t idx[B] = {0, 1, 2};
    dc_buf xd, yd;
    int rc = dc_schedule_init_flow(&f, o->T, shift);
    if (!rc) rc = dc_flow_plan(&f, steps, &plan);
    if (!rc) rc = dc_sampler_init_plan(&smp, be, &set, &plan, 2, 4, 5, 2, B);
    if (rc) {
        CHECK(false, "flow sampler of %d steps: %s", steps, dc_error());
        dc_schedule_free(&f);
        return INFINITY;
    }
    dc_buf_alloc(be, &xd, DC_F32, B * N, "x");
    dc_buf_alloc(be, &yd, DC_I32, B, "labels");
    be->upload(be, xd.p, z, sizeof x);
    be->upload(be, yd.p, y, sizeof y);
    dc_cond cond = {.y = yd};
    o->evals = 0;
    rc = dc_sampler_run(&smp, xd, &cond, idx, B, oracle_eval, NULL, o, NULL, NULL);
    be->download(be, x, xd.p, sizeof x);
    CHECK(rc == 0 && o->evals == steps, "flow sampler of %d steps ran %d evaluations (%s)", steps, o->evals,
          rc ? dc_error() : "ok");
    // The double-precision Euler reference over the same ladder.
    double *t = malloc(sizeof(double) * steps), *sig = malloc(sizeof(double) * (steps + 1));
    dc_flow_ladder(&f, steps, t, sig);
    double err = 0, dref = 0;
    for (int i = 0; i < B * N; i++) {
        int j = i % N;
        double xr = z[i];
        for (int k = 0; k < steps; k++) xr += (sig[k + 1] - sig[k]) * velocity(o, j, xr, sig[k]);
        double exact = o->mu[j] + o->s[j] * z[i];
        err = fmax(err, isfinite(x[i]) ? fabs(x[i] - exact) : INFINITY);
        dref = fmax(dref, isfinite(x[i]) ? fabs(x[i] - xr) / (1 + fabs(xr)) : INFINITY);
    }
    free(t), free(sig);
    dc_schedule_free(&f);
    be->free(be, xd.p), be->free(be, yd.p);
    dc_sampler_free(&smp);
    *vs_ref = dref;
    return err;
}

static void test_sampler(dc_backend *be) {
    oracle o = {.be = be, .T = 1000};
    for (int j = 0; j < N; j++) o.mu[j] = frand(1, j), o.s[j] = 0.3 + fabs(frand(2, j));
    float z[B * N];
    for (int i = 0; i < B * N; i++) z[i] = (float)frand(3, i);
    for (int q = 0; q < 2; q++) {
        double shift = q ? 3.0 : 1.0, prev = 0;
        for (int steps = 8; steps <= 512; steps *= 4) {
            double dref = INFINITY, err = run_flow(be, &o, shift, steps, z, &dref);
            // float32 against float64: each step rounds x (2^-24) and the
            // model's sigma, read back from a float timestep (2^-24 relative)
            CHECK(dref <= 1e-6 * steps + 1e-6, "flow Euler, shift %g, %d steps: %.3e from the double Euler", shift,
                  steps, dref);
            // first order: the error times the steps stays bounded (measured
            // 6.0 to 6.3 on this data), and 4 times the steps leave about a
            // quarter of the error
            CHECK(err * steps <= 8, "flow Euler, shift %g, %d steps: %.3e from the exact ODE solution", shift,
                  steps, err);
            if (prev > 0)
                CHECK(err < prev / 3, "flow Euler, shift %g: %d steps end %.3e from the exact ODE solution, %d "
                      "steps %.3e (first order: about a quarter)", shift, steps, err, steps / 4, prev);
            printf("  shift %g, %3d steps: %.3e from the exact endpoint, %.1e from double Euler\n", shift, steps,
                   err, dref);
            prev = err;
        }
    }
}

static void test_training_pair(dc_backend *be) {
    enum { n = 33 };
    float x0[B * n], noise[B * n], sigma[B] = {0.0f, 0.37f, 1.0f}, xt[B * n], v[B * n];
    for (int i = 0; i < B * n; i++) x0[i] = (float)frand(4, i), noise[i] = (float)frand(5, i);
    sigma[0] = (float)(0.5 + 0.4 * frand(6, 0) / 4);  // fresh, inside (0, 1)
    dc_buf a, b, c, d;
    dc_buf_alloc(be, &a, DC_F32, B * n, "x0");
    dc_buf_alloc(be, &b, DC_F32, B * n, "noise");
    dc_buf_alloc(be, &c, DC_F32, B * n, "xt");
    dc_buf_alloc(be, &d, DC_F32, B * n, "v");
    be->upload(be, a.p, x0, sizeof x0);
    be->upload(be, b.p, noise, sizeof noise);
    int rc = dc_flow_training_pair(be, c, d, a, b, sigma, B, n);
    be->download(be, xt, c.p, sizeof xt);
    be->download(be, v, d.p, sizeof v);
    double ex = 0, ev = 0;
    for (int i = 0; i < B * n; i++) {
        double s = sigma[i / n], wx = (1 - s) * x0[i] + s * noise[i], wv = (double)noise[i] - x0[i];
        double scale = fabs(x0[i]) + fabs(noise[i]);
        ex = fmax(ex, isfinite(xt[i]) ? fabs(xt[i] - wx) / scale : INFINITY);
        ev = fmax(ev, isfinite(v[i]) ? fabs(v[i] - wv) / scale : INFINITY);
    }
    // two roundings of float32 products and one of the sum
    CHECK(rc == 0 && ex <= 4 * 0x1p-24 && ev <= 2 * 0x1p-24,
          "flow training pair: x_t %.3e, v %.3e relative to |x0| + |noise| (%s)", ex, ev, rc ? dc_error() : "ok");
    be->free(be, a.p), be->free(be, b.p), be->free(be, c.p), be->free(be, d.p);
}

// The loop refuses a plan it cannot run: an affine update over a model
// whose output has more channels than x (a learned variance), or an img2img
// skip that leaves no step.
static void test_refusals(dc_backend *be) {
    dc_schedule f;
    dc_sample_plan plan;
    dc_sampler smp;
    dc_sample_setup set = {.seed = 1};
    CHECK(dc_schedule_init_flow(&f, 1000, 3.0) == 0, "flow schedule: %s", dc_error());
    bool rej = dc_flow_plan(&f, 4, &plan) == 0 && dc_sampler_init_plan(&smp, be, &set, &plan, 2, 4, 5, 4, 1) != 0;
    CHECK(rej && plan.step == NULL, "an affine plan on a model of 2C output channels is refused (and taken over)");
    rej = dc_flow_plan(&f, 4, &plan) == 0 && (plan.skip = 4, dc_sampler_init_plan(&smp, be, &set, &plan, 2, 4, 5, 2, 1) != 0);
    CHECK(rej, "skipping every step is refused");
    dc_schedule_free(&f);
}

int main(void) {
    dc_backend *be;
    if (dc_backend_create("cpu", &be)) {
        printf("test_flow: no cpu backend: %s\n", dc_error());
        return 1;
    }
    test_ladder();
    test_sampler(be);
    test_training_pair(be);
    test_refusals(be);
    dc_backend_destroy(be);
    printf("test_flow: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
