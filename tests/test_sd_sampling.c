// Tests of the latent-diffusion sampling math: the scaled-linear schedule,
// sigma tables, timestep spacings and Karras sigmas against long-double
// recomputations and known values; DDIM, Euler, Euler a and DPM++ 2M run on
// the CPU backend against float64 transcriptions of the reference loops
// (diffusers DDIMScheduler.step, k-diffusion sample_euler /
// sample_euler_ancestral / sample_dpmpp_2m, on k-diffusion's ladders, which
// the k-samplers are given as sigmas) written here, with a synthetic
// model whose exact prediction is known in closed form; convergence to that
// distribution, v-prediction, guidance and batch-size independence.
// Prints one line per check; exits 1 on any failure (NaN fails).
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "diffusion/ksampler.h"
#include "diffusion/sd_schedule.h"

typedef long double ld;
static int g_fail;

static void check(const char *name, bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("[%s] %-48s ", ok ? " ok " : "FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok) g_fail++;
}

// ---- independent schedule (long double) ---------------------------------------------
static ld g_acp[1000], g_logsig[1000];

static void ref_schedule(void) {
    ld a = sqrtl(0.00085L), b = sqrtl(0.012L), acc = 1;
    for (int i = 0; i < 1000; i++) {
        ld r = a + (b - a) * i / 999.0L;
        acc *= 1 - r * r;
        g_acp[i] = acc;
        g_logsig[i] = logl(sqrtl((1 - acc) / acc));
    }
}

// k-diffusion DiscreteSchedule.sigma_to_t / t_to_sigma, transcribed.
static double ref_sigma_to_t(double sigma) {
    ld ls = logl(sigma);
    int low = 0;
    for (int i = 0; i < 1000; i++)
        if (ls - g_logsig[i] >= 0) low = i;  // (dists >= 0).cumsum().argmax()
    if (low > 998) low = 998;
    ld w = (g_logsig[low] - ls) / (g_logsig[low] - g_logsig[low + 1]);
    w = w < 0 ? 0 : w > 1 ? 1 : w;
    return (double)((1 - w) * low + w * (low + 1));
}
static double ref_t_to_sigma(double t) {
    int lo = (int)floor(t), hi = (int)ceil(t);
    ld w = t - lo;
    return (double)expl((1 - w) * g_logsig[lo] + w * g_logsig[hi]);
}

static void test_schedule(void) {
    dc_schedule s;
    int rc = dc_schedule_init_scaled_linear(&s, 1000, DC_SD_BETA_START, DC_SD_BETA_END);
    check("scaled-linear schedule builds", rc == 0, "rc %d", rc);
    if (rc) return;
    double worst = 0, worst_sig = 0;
    for (int i = 0; i < 1000; i++) {
        double e = fabs((double)((s.alphas_cumprod[i] - g_acp[i]) / g_acp[i]));
        double es = fabs(s.log_sigmas[i] - (double)g_logsig[i]);
        worst = e > worst || e != e ? e : worst;
        worst_sig = es > worst_sig || es != es ? es : worst_sig;
    }
    check("alphas_cumprod == long-double recomputation", worst < 1e-13, "max rel err %.2e", worst);
    check("log sigmas == long-double recomputation", worst_sig < 1e-12, "max abs err %.2e", worst_sig);
    check("acp[0] = 1 - 0.00085", fabs(s.alphas_cumprod[0] - 0.99915) < 1e-15, "%.17g",
          s.alphas_cumprod[0]);
    check("acp[999] ~ 0.0047", fabs(s.alphas_cumprod[999] - 0.0047) < 1e-4, "%.6g",
          s.alphas_cumprod[999]);
    check("sigma_max ~ 14.6146", fabs(dc_schedule_sigma_max(&s) - 14.6146) < 1e-4, "%.6f",
          dc_schedule_sigma_max(&s));
    check("sigma_min ~ 0.0292", fabs(dc_schedule_sigma_min(&s) - 0.0292) < 1e-4, "%.6f",
          dc_schedule_sigma_min(&s));

    double te = 0;
    for (int i = 0; i < 1000; i++) {
        double e = fabs(dc_sd_sigma_to_t(&s, s.sigmas[i]) - i);
        te = e > te || e != e ? e : te;
    }
    check("sigma_to_t(sigma(t)) == t", te < 1e-9, "max err %.2e", te);
    double re = 0;
    for (double sg = 0.03; sg < 14.6; sg *= 1.37) {
        double t = dc_sd_sigma_to_t(&s, sg), tr = ref_sigma_to_t(sg);
        double e = fabs(t - tr) + fabs(dc_sd_t_to_sigma(&s, t) - sg) / sg;
        e += fabs(dc_sd_t_to_sigma(&s, t) - ref_t_to_sigma(t)) / sg;
        re = e > re || e != e ? e : re;
    }
    check("sigma_to_t / t_to_sigma == transcription", re < 1e-9, "max err %.2e", re);

    double k[11];
    rc = dc_sd_sigmas_karras(10, dc_schedule_sigma_min(&s), dc_schedule_sigma_max(&s), 7, k);
    double ke = 0;
    ld mi = powl(dc_schedule_sigma_min(&s), 1 / 7.0L), ma = powl(dc_schedule_sigma_max(&s), 1 / 7.0L);
    for (int i = 0; i < 10; i++) {
        ld r = powl(ma + (ld)i / 9 * (mi - ma), 7);
        double e = fabs((double)((k[i] - r) / r));
        ke = e > ke || e != e ? e : ke;
    }
    check("Karras sigmas n=10 == formula", rc == 0 && ke < 1e-13 && k[10] == 0 &&
          fabs(k[0] - dc_schedule_sigma_max(&s)) < 1e-12 && fabs(k[9] - dc_schedule_sigma_min(&s)) < 1e-14,
          "max rel err %.2e, %.6f .. %.6f, %g", ke, k[0], k[9], k[10]);

    int ts[50];
    rc = dc_sd_timesteps(1000, 50, DC_SPACING_LEADING, 1, ts);
    bool ok = rc == 0;
    for (int i = 0; i < 50; i++) ok = ok && ts[i] == 981 - 20 * i;
    check("DDIM leading n=50, offset 1: 981, 961, .., 1", ok, "%d %d .. %d", ts[0], ts[1], ts[49]);
    rc = dc_sd_timesteps(1000, 10, DC_SPACING_TRAILING, 0, ts);
    check("trailing n=10: 999, 899, .., 99", rc == 0 && ts[0] == 999 && ts[1] == 899 && ts[9] == 99,
          "%d %d .. %d", ts[0], ts[1], ts[9]);
    rc = dc_sd_timesteps(1000, 4, DC_SPACING_LINSPACE, 0, ts);
    check("linspace n=4: 999, 666, 333, 0", rc == 0 && ts[0] == 999 && ts[1] == 666 &&
          ts[2] == 333 && ts[3] == 0, "%d %d %d %d", ts[0], ts[1], ts[2], ts[3]);
    rc = dc_sd_timesteps(1000, 1001, DC_SPACING_LEADING, 1, ts);
    check("1001 steps of 1000 refused", rc != 0, "%s", dc_error());
    dc_schedule_free(&s);
}

// ---- a synthetic model ----------------------------------------------------------------
// Data x0 ~ N(mu, S0^2) per element, mu read from the conditioning (ctx[r, 0, 0]).
// In sigma space x = x0 + sigma eps, so E[eps | x] = sigma (x - mu) / (S0^2 + sigma^2),
// and the model sees x_t = sqrt(acp) x with acp = 1 / (1 + sigma^2), sigma = sigma(t).
#define S0 0.5
static int g_nel;  // elements per sample the model sees
typedef struct {
    dc_prediction pred;
    int evals;
    dc_backend *be;
} synth;

static double synth_out(dc_prediction pred, double xt, double t, double mu) {
    double sg = ref_t_to_sigma(t), acp = 1 / (1 + sg * sg);
    double x = xt / sqrt(acp), eps = sg * (x - mu) / (S0 * S0 + sg * sg);
    // eps = sqrt(acp) v + sqrt(1 - acp) x_t
    if (pred == DC_PRED_SAMPLE) return x - sg * eps;  // x0 (x = x0 + sigma eps)
    return pred == DC_PRED_V ? (eps - sqrt(1 - acp) * xt) / sqrt(acp) : eps;
}

// The model runs on the host: its input comes down from the backend and its
// output goes back up (plain copies on the CPU backend).
static int synth_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    synth *m = ctx;
    m->evals++;
    int64_t per = (int64_t)cond->len * cond->dim, nx = (int64_t)B * g_nel;
    float *xp = malloc(sizeof(float) * nx), *op = malloc(sizeof(float) * nx);
    float *tp = malloc(sizeof(float) * B), *cp = malloc(sizeof(float) * B * per);
    m->be->download(m->be, xp, x.p, sizeof(float) * nx);
    m->be->download(m->be, tp, t.p, sizeof(float) * B);
    m->be->download(m->be, cp, cond->ctx.p, sizeof(float) * B * per);
    for (int r = 0; r < B; r++)
        for (int j = 0; j < g_nel; j++)
            op[r * g_nel + j] = (float)synth_out(m->pred, xp[r * g_nel + j], tp[r], cp[r * per]);
    m->be->upload(m->be, out.p, op, sizeof(float) * nx);
    free(xp), free(op), free(tp), free(cp);
    return 0;
}

// ---- float64 transcriptions of the reference loops ------------------------------------
typedef struct {
    dc_ks_kind kind;
    int steps;
    bool karras;
    double eta;
    dc_prediction pred;
    double scale, mu_u;  // guidance (scale != 1) against the null mu_u
    uint64_t seed;
    int skip;            // img2img: steps not run; the clean latents are g_init
} ref_cfg;

static float g_init[64];  // img2img: the clean latents of every sample (NPER values)

static double ref_model(const ref_cfg *c, double xin, double t, double mu) {
    double tf = (float)t;  // the model is fed float timesteps, as in PyTorch
    double co = synth_out(c->pred, xin, tf, mu);
    if (c->scale == 1) return co;
    double u = synth_out(c->pred, xin, tf, c->mu_u);
    return u + c->scale * (co - u);
}

// DiscreteEpsDDPMDenoiser / DiscreteVDDPMDenoiser forward for one element.
static double ref_denoise(const ref_cfg *c, double x, double sigma, double mu) {
    double c_in = 1 / sqrt(sigma * sigma + 1);
    double out = ref_model(c, x * c_in, ref_sigma_to_t(sigma), mu);
    if (c->pred == DC_PRED_SAMPLE) return out;
    if (c->pred == DC_PRED_V) {
        double c_skip = 1 / (sigma * sigma + 1), c_out = -sigma * c_in;
        return x * c_skip + out * c_out;
    }
    return x - sigma * out;
}

// Noise of the transcription: Philox as the sampler draws it, or given
// (start[n], then steps[i * n + j] for step i) as in a golden file.
static double ref_noise(const ref_cfg *c, uint32_t key, const double *given, int i, int j, int n) {
    if (given) return i < 0 ? given[j] : given[n + i * n + j];
    return i < 0 ? dc_randn_at(c->seed, key, DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START, j)
                 : dc_randn_at(c->seed, key, i, DC_STREAM_NOISE, j);
}

// k-diffusion's ladders: get_sigmas_karras between the schedule's ends, or
// DiscreteSchedule.get_sigmas (t_to_sigma of linspace(999, 0, N)); sig[N + 1].
static void ref_ladder(const ref_cfg *c, double *sig) {
    int N = c->steps;
    for (int i = 0; i < N; i++) {
        if (c->karras) {
            ld mi = powl(expl(g_logsig[0]), 1 / 7.0L), ma = powl(expl(g_logsig[999]), 1 / 7.0L);
            ld ramp = N == 1 ? 0 : (ld)i / (N - 1);
            sig[i] = (double)powl(ma + ramp * (mi - ma), 7);
        } else {
            sig[i] = ref_t_to_sigma(N == 1 ? 999 : 999.0 - 999.0 * i / (N - 1));
        }
    }
    sig[N] = 0;
}

// One sample (key) of n elements; returns x in out[n]. given: NULL or the noise.
static void ref_run_noise(const ref_cfg *c, uint32_t key, double mu, int n, double *x,
                          const double *given) {
    int N = c->steps;
    double *den = malloc(sizeof(double) * n), *old = malloc(sizeof(double) * n);
    if (c->kind == DC_KS_DDIM) {
        for (int j = 0; j < n; j++) x[j] = ref_noise(c, key, given, -1, j, n);
        if (c->skip) {  // diffusers' add_noise at the first timestep run
            double acp = (double)g_acp[(N - 1 - c->skip) * (1000 / N) + 1];
            for (int j = 0; j < n; j++) x[j] = sqrt(acp) * g_init[j] + sqrt(1 - acp) * x[j];
        }
        for (int i = c->skip; i < N; i++) {
            int t = (N - 1 - i) * (1000 / N) + 1, prev = t - 1000 / N;
            double acp = (double)g_acp[t], acp_prev = (double)(prev >= 0 ? g_acp[prev] : g_acp[0]);
            double var = (1 - acp_prev) / (1 - acp) * (1 - acp / acp_prev);
            double std = c->eta * sqrt(var);
            for (int j = 0; j < n; j++) {
                double o = ref_model(c, x[j], t, mu), x0, eps;
                if (c->pred == DC_PRED_V) {
                    x0 = sqrt(acp) * x[j] - sqrt(1 - acp) * o;
                    eps = sqrt(acp) * o + sqrt(1 - acp) * x[j];
                } else if (c->pred == DC_PRED_SAMPLE) {
                    x0 = o;
                    eps = (x[j] - sqrt(acp) * o) / sqrt(1 - acp);
                } else {
                    x0 = (x[j] - sqrt(1 - acp) * o) / sqrt(acp);
                    eps = o;
                }
                double dir = sqrt(1 - acp_prev - std * std) * eps;
                x[j] = sqrt(acp_prev) * x0 + dir;
                if (c->eta > 0) x[j] += std * ref_noise(c, key, given, i, j, n);
            }
        }
        free(den), free(old);
        return;
    }
    double *sig = malloc(sizeof(double) * (N + 1));
    ref_ladder(c, sig);
    for (int j = 0; j < n; j++)  // img2img (A1111): init + noise * sigmas[first]
        x[j] = ref_noise(c, key, given, -1, j, n) * sig[c->skip] + (c->skip ? g_init[j] : 0);
    bool have_old = false;
    for (int i = c->skip; i < N; i++) {
        double s = sig[i], sn = sig[i + 1];
        for (int j = 0; j < n; j++) den[j] = ref_denoise(c, x[j], s, mu);
        if (c->kind == DC_KS_EULER) {
            for (int j = 0; j < n; j++) {
                double d = (x[j] - den[j]) / s;  // to_d
                x[j] = x[j] + d * (sn - s);
            }
        } else if (c->kind == DC_KS_EULER_A) {
            double up = fmin(sn, sqrt(sn * sn * (s * s - sn * sn) / (s * s)));
            double down = sqrt(sn * sn - up * up);
            for (int j = 0; j < n; j++) {
                double d = (x[j] - den[j]) / s;
                x[j] = x[j] + d * (down - s);
                if (sn > 0) x[j] += ref_noise(c, key, given, i, j, n) * up;
            }
        } else {  // sample_dpmpp_2m
            double t = -log(s), t_next = -log(sn), h = t_next - t;
            for (int j = 0; j < n; j++) {
                if (!have_old || sn == 0) {
                    x[j] = (exp(-t_next) / exp(-t)) * x[j] - expm1(-h) * den[j];
                } else {
                    double h_last = t - (-log(sig[i - 1])), r = h_last / h;
                    double dd = (1 + 1 / (2 * r)) * den[j] - (1 / (2 * r)) * old[j];
                    x[j] = (exp(-t_next) / exp(-t)) * x[j] - expm1(-h) * dd;
                }
                old[j] = den[j];
            }
            have_old = true;
        }
    }
    free(sig), free(den), free(old);
}
static void ref_run(const ref_cfg *c, uint32_t key, double mu, int n, double *x) {
    ref_run_noise(c, key, mu, n, x, NULL);
}

// ---- the sampler under test -------------------------------------------------------------
enum { C = 4, H = 4, W = 4, NPER = C * H * W, LEN = 2, DIM = 3 };

static const float *g_x_start;  // when set, the start noise run_ks hands the sampler

// Runs the sampler for B samples with keys idx and conditional means mu[b];
// x_out[B * NPER]. Returns the run's rc.
static int run_ks(dc_backend *be, const ref_cfg *c, int max_batch, int B, const uint32_t *idx,
                  const double *mu, float *x_out, bool with_null, int *evals) {
    dc_ksampler_opts o = dc_ksampler_opts_default();
    o.kind = c->kind, o.steps = c->steps, o.eta = (float)c->eta;
    // the k-samplers walk k-diffusion's ladder, as the transcription does
    // (diffusers' ladders are tested against diffusers in test_sd_schedule)
    double *sig = malloc(sizeof(double) * ((c->steps > 0 ? c->steps : 0) + 1));
    if (c->kind != DC_KS_DDIM && c->steps > 0) ref_ladder(c, sig), o.sigmas = sig;
    o.prediction = c->pred, o.cfg_scale = (float)c->scale, o.seed = c->seed;
    o.ctx_len = LEN, o.ctx_dim = DIM;
    o.skip = c->skip;
    float nullv[LEN * DIM], *cv = calloc((size_t)B * LEN * DIM, sizeof(float));
    for (int k = 0; k < LEN * DIM; k++) nullv[k] = (float)(k ? 9 : c->mu_u);
    for (int b = 0; b < B; b++) cv[b * LEN * DIM] = (float)mu[b];
    // everything the sampler reads lives on the backend
    size_t xbytes = sizeof(float) * (size_t)B * NPER;
    float *dx = be->alloc(be, xbytes), *dc = be->alloc(be, sizeof(float) * B * LEN * DIM);
    float *dn = be->alloc(be, sizeof nullv);
    be->upload(be, dc, cv, sizeof(float) * B * LEN * DIM);
    be->upload(be, dn, nullv, sizeof nullv);
    if (with_null) o.null_ctx = (dc_buf){.p = dn, .dt = DC_F32};
    if (g_x_start) {
        o.x_given = true;
        be->upload(be, dx, g_x_start, xbytes);
    }
    for (int b = 0; c->skip && b < B; b++) be->upload(be, dx + b * NPER, g_init, sizeof(float) * NPER);
    dc_sampler ks;
    synth m = {c->pred, 0, be};
    g_nel = NPER;
    int rc = dc_ksampler_init(&ks, be, &o, C, H, W, max_batch);
    if (!rc) {
        dc_cond cond = {.ctx = {.p = dc, .dt = DC_F32}, .len = LEN, .dim = DIM};
        rc = dc_sampler_run(&ks, (dc_buf){.p = dx, .dt = DC_F32}, &cond, idx, B, synth_eval, NULL, &m,
                             NULL, NULL);
        dc_sampler_free(&ks);
    }
    be->download(be, x_out, dx, xbytes);
    if (!rc) rc = dc_backend_status(be);
    be->free(be, dx), be->free(be, dc), be->free(be, dn);
    if (evals) *evals = m.evals;
    free(cv), free(sig);
    return rc;
}

static double max_err_vs_ref(const ref_cfg *c, int B, const uint32_t *idx, const double *mu,
                             const float *x) {
    double *r = malloc(sizeof(double) * NPER), worst = 0;
    for (int b = 0; b < B; b++) {
        ref_run(c, idx[b], mu[b], NPER, r);
        for (int j = 0; j < NPER; j++) {
            double e = fabs(x[b * NPER + j] - r[j]) / (1 + fabs(r[j]));
            worst = e > worst || e != e ? e : worst;
        }
    }
    free(r);
    return worst;
}

static void test_vs_reference(dc_backend *be) {
    static const struct { const char *name; ref_cfg c; } cases[] = {
        {"DDIM eta 0, eps, cfg 3", {DC_KS_DDIM, 20, false, 0.0, DC_PRED_EPS, 3.0, -0.4, 11, 0}},
        {"DDIM eta 1, v, cfg 3", {DC_KS_DDIM, 25, false, 1.0, DC_PRED_V, 3.0, -0.4, 12, 0}},
        {"DDIM eta 0, eps, 50 steps, no cfg", {DC_KS_DDIM, 50, false, 0.0, DC_PRED_EPS, 1.0, 0, 13, 0}},
        {"Euler, eps, cfg 3", {DC_KS_EULER, 20, false, 0, DC_PRED_EPS, 3.0, -0.4, 14, 0}},
        {"Euler Karras, v, cfg 3", {DC_KS_EULER, 15, true, 0, DC_PRED_V, 3.0, -0.4, 15, 0}},
        {"Euler a, eps, cfg 3", {DC_KS_EULER_A, 20, false, 0, DC_PRED_EPS, 3.0, -0.4, 16, 0}},
        {"Euler a Karras, v, no cfg", {DC_KS_EULER_A, 12, true, 0, DC_PRED_V, 1.0, 0, 17, 0}},
        {"DPM++ 2M Karras, eps, cfg 7.5", {DC_KS_DPMPP_2M, 20, true, 0, DC_PRED_EPS, 7.5, -0.4, 18, 0}},
        {"DPM++ 2M, v, cfg 3", {DC_KS_DPMPP_2M, 10, false, 0, DC_PRED_V, 3.0, -0.4, 19, 0}},
        {"DDIM eta 0.5, x0, cfg 3", {DC_KS_DDIM, 20, false, 0.5, DC_PRED_SAMPLE, 3.0, -0.4, 23, 0}},
        {"Euler, x0, cfg 2", {DC_KS_EULER, 15, false, 0, DC_PRED_SAMPLE, 2.0, 0.2, 24, 0}},
        {"DPM++ 2M Karras, x0, no cfg", {DC_KS_DPMPP_2M, 12, true, 0, DC_PRED_SAMPLE, 1.0, 0, 25, 0}},
        {"DPM++ 2M Karras, 1 step", {DC_KS_DPMPP_2M, 1, true, 0, DC_PRED_EPS, 1.0, 0, 20, 0}},
        // img2img: the tail of the ladder from noised clean latents
        {"img2img DDIM, eps, 12 of 20", {DC_KS_DDIM, 20, false, 0.0, DC_PRED_EPS, 3.0, -0.4, 21, 8}},
        {"img2img Euler a, v, 5 of 15", {DC_KS_EULER_A, 15, false, 0, DC_PRED_V, 3.0, -0.4, 22, 10}},
        {"img2img DPM++ 2M Karras, 14 of 20", {DC_KS_DPMPP_2M, 20, true, 0, DC_PRED_EPS, 7.5, -0.4, 23, 6}},
        {"img2img Euler, last step only", {DC_KS_EULER, 10, false, 0, DC_PRED_EPS, 1.0, 0, 24, 9}},
    };
    for (int j = 0; j < NPER; j++) g_init[j] = (float)sin(0.7 * j) * 0.8f;
    uint32_t idx[3] = {0, 5, 2};
    double mu[3] = {0.3, -0.2, 1.1};
    float *x = calloc(3 * NPER, sizeof(float));
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const ref_cfg *c = &cases[k].c;
        int evals = 0;
        int rc = run_ks(be, c, 3, 3, idx, mu, x, c->scale != 1, &evals);
        double e = rc ? INFINITY : max_err_vs_ref(c, 3, idx, mu, x);
        char name[96];
        snprintf(name, sizeof name, "%s == transcription", cases[k].name);
        check(name, rc == 0 && e < 2e-5 && evals == c->steps - c->skip, "max rel err %.2e, %d model calls%s%s",
              e, evals, rc ? ": " : "", rc ? dc_error() : "");
    }
    free(x);
}

// With many steps every sampler should land on the data distribution N(mu, S0^2).
// Euler a is a first-order SDE solver: its std falls short by ~7% at 100
// uniform steps (the transcription agrees), so it gets 500.
static void test_distribution(dc_backend *be) {
    static const struct { const char *name; ref_cfg c; } cases[] = {
        {"DDIM 100 steps", {DC_KS_DDIM, 100, false, 0.0, DC_PRED_EPS, 1.0, 0, 31, 0}},
        {"Euler 100 steps", {DC_KS_EULER, 100, false, 0, DC_PRED_EPS, 1.0, 0, 32, 0}},
        {"Euler a 500 steps (v)", {DC_KS_EULER_A, 500, false, 0, DC_PRED_V, 1.0, 0, 33, 0}},
        {"DPM++ 2M Karras 30 steps", {DC_KS_DPMPP_2M, 30, true, 0, DC_PRED_EPS, 1.0, 0, 34, 0}},
    };
    enum { B = 64 };
    uint32_t idx[B];
    double mu[B];
    for (int b = 0; b < B; b++) idx[b] = b, mu[b] = 0.3;
    float *x = calloc(B * NPER, sizeof(float));
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int rc = run_ks(be, &cases[k].c, B, B, idx, mu, x, false, NULL);
        double s1 = 0, s2 = 0;
        for (int i = 0; i < B * NPER; i++) s1 += x[i], s2 += (double)x[i] * x[i];
        double m = s1 / (B * NPER), sd = sqrt(s2 / (B * NPER) - m * m);
        char name[96];
        snprintf(name, sizeof name, "%s: samples ~ N(0.3, 0.5^2)", cases[k].name);
        // 4096 draws: the mean's standard error is 0.008, the std's 0.006
        check(name, rc == 0 && fabs(m - 0.3) < 0.03 && fabs(sd - S0) < 0.03, "mean %.4f std %.4f", m, sd);
    }
    free(x);
}

// A v- or x0-predicting model of the same data gives the eps model's
// samples: the sampler's v -> denoised (x0 -> denoised) conversion inverts
// the model's eps -> v (eps -> x0).
static void test_v_roundtrip(dc_backend *be) {
    dc_ks_kind kinds[] = {DC_KS_DDIM, DC_KS_EULER, DC_KS_EULER_A, DC_KS_DPMPP_2M};
    uint32_t idx[2] = {3, 4};
    double mu[2] = {0.3, -0.7};
    float *xe = calloc(2 * NPER, sizeof(float)), *xv = calloc(2 * NPER, sizeof(float));
    for (int k = 0; k < 8; k++) {
        const dc_prediction pred = k < 4 ? DC_PRED_V : DC_PRED_SAMPLE;
        ref_cfg c = {kinds[k % 4], 12, k % 4 == 3, 0.5, DC_PRED_EPS, 2.0, 0.1, 41, 0};
        int rc = run_ks(be, &c, 2, 2, idx, mu, xe, true, NULL);
        c.pred = pred;
        rc |= run_ks(be, &c, 2, 2, idx, mu, xv, true, NULL);
        double e = 0;
        for (int i = 0; i < 2 * NPER; i++) {
            double d = fabs(xe[i] - xv[i]) / (1 + fabs(xe[i]));
            e = d > e || d != d ? d : e;
        }
        char name[96];
        snprintf(name, sizeof name, "%s: %s model == eps model", dc_ks_kind_name(kinds[k % 4]),
                 pred == DC_PRED_V ? "v" : "x0");
        check(name, rc == 0 && e < 2e-5, "max rel diff %.2e", e);
    }
    free(xe), free(xv);
}

// Sample i's picture depends on (seed, i) only: batches of 8, 3 and 1 agree bitwise.
static void test_batch_invariance(dc_backend *be) {
    dc_ks_kind kinds[] = {DC_KS_DDIM, DC_KS_EULER_A, DC_KS_DPMPP_2M};
    enum { N = 8 };
    uint32_t idx[N];
    double mu[N];
    for (int b = 0; b < N; b++) idx[b] = 100 + 7 * b, mu[b] = 0.1 * b - 0.3;
    float *x8 = calloc(N * NPER, sizeof(float)), *xs = calloc(N * NPER, sizeof(float));
    for (int k = 0; k < 3; k++) {
        ref_cfg c = {kinds[k], 8, true, 1.0, DC_PRED_EPS, 5.0, -0.4, 51, 0};
        int rc = run_ks(be, &c, N, N, idx, mu, x8, true, NULL);
        for (int b = 0; b < N && !rc; b += 3) {  // batches of 3, 3, 2
            int nb = N - b < 3 ? N - b : 3;
            rc = run_ks(be, &c, 3, nb, idx + b, mu + b, xs + b * NPER, true, NULL);
        }
        bool same3 = rc == 0 && !memcmp(x8, xs, sizeof(float) * N * NPER);
        for (int b = 0; b < N && !rc; b++)
            rc = run_ks(be, &c, 1, 1, idx + b, mu + b, xs + b * NPER, true, NULL);
        bool same1 = rc == 0 && !memcmp(x8, xs, sizeof(float) * N * NPER);
        char name[96];
        snprintf(name, sizeof name, "%s: batch 8 == 3 == 1 (bitwise)", dc_ks_kind_name(kinds[k]));
        check(name, same3 && same1, "batch 3 %s, batch 1 %s", same3 ? "same" : "DIFFERS",
              same1 ? "same" : "DIFFERS");
    }
    free(x8), free(xs);
}

// Guidance 1 is the conditional model alone (the batch is not doubled), and
// a scale other than 1 does change the samples.
static void test_guidance_one(dc_backend *be) {
    uint32_t idx[2] = {1, 2};
    double mu[2] = {0.3, 0.6};
    float *a = calloc(2 * NPER, sizeof(float)), *b = calloc(2 * NPER, sizeof(float));
    ref_cfg c = {DC_KS_EULER_A, 10, true, 0, DC_PRED_EPS, 1.0, -0.4, 61, 0};
    int ea = 0, eb = 0;
    int rc = run_ks(be, &c, 2, 2, idx, mu, a, true, &ea);
    rc |= run_ks(be, &c, 2, 2, idx, mu, b, false, &eb);
    double e = rc ? INFINITY : max_err_vs_ref(&c, 2, idx, mu, b);
    check("guidance 1 with a negative prompt == none", rc == 0 && !memcmp(a, b, sizeof(float) * 2 * NPER) &&
          e < 2e-5, "max rel err vs conditional-only transcription %.2e", e);
    c.scale = 1.5;
    rc = run_ks(be, &c, 2, 2, idx, mu, b, true, NULL);
    check("guidance 1.5 differs from 1", rc == 0 && memcmp(a, b, sizeof(float) * 2 * NPER) != 0, "rc %d", rc);
    free(a), free(b);
}

static void test_errors(dc_backend *be) {
    uint32_t idx[2] = {0, 1};
    double mu[2] = {0, 0};
    float x[2 * NPER];
    ref_cfg c = {DC_KS_EULER, 0, false, 0, DC_PRED_EPS, 1.0, 0, 1, 0};
    int rc = run_ks(be, &c, 1, 1, idx, mu, x, false, NULL);
    check("0 steps refused", rc != 0, "%s", dc_error());
    c.steps = 5, c.scale = 4;
    rc = run_ks(be, &c, 1, 1, idx, mu, x, false, NULL);
    check("guidance without a negative prompt refused", rc != 0, "%s", dc_error());
    c.kind = DC_KS_DDIM, c.scale = 1, c.eta = 3;
    rc = run_ks(be, &c, 1, 1, idx, mu, x, false, NULL);
    check("DDIM eta 3 refused", rc != 0, "%s", dc_error());
    c.eta = 0;
    rc = run_ks(be, &c, 1, 2, idx, mu, x, false, NULL);
    check("batch over max_batch refused", rc != 0, "%s", dc_error());
    c.pred = DC_PRED_FLOW;
    rc = run_ks(be, &c, 1, 1, idx, mu, x, false, NULL);
    check("a flow model on DDIM refused", rc != 0 && strstr(dc_error(), "flow"), "%s", dc_error());
}

// ---- golden trajectories of k-diffusion itself (tools/sd_sampling_reference.py) ----------
#define GOLDEN "tests/golden/sd_ksampling.txt"
static bool read_vals(FILE *f, const char *tag, double *v, int n) {
    char word[32];
    if (fscanf(f, "%31s", word) != 1 || strcmp(word, tag)) return false;
    if (!strcmp(tag, "noise") && fscanf(f, "%*d") != 0) return false;
    for (int j = 0; j < n; j++)
        if (fscanf(f, "%lf", &v[j]) != 1) return false;
    return true;
}

static void test_golden(dc_backend *be) {
    FILE *f = fopen(GOLDEN, "r");
    check("golden file " GOLDEN " opens", f != NULL, "run from the repository root");
    if (!f) return;
    char line[256];
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        char name[64], kind[16], pred[8];
        int karras, steps, n;
        double scale, mu, mu_u;
        if (sscanf(line, "case %63s %15s %d %7s %lf %lf %lf %d %d", name, kind, &karras, pred, &scale,
                   &mu, &mu_u, &steps, &n) != 9)
            continue;
        ref_cfg c = {!strcmp(kind, "euler") ? DC_KS_EULER : !strcmp(kind, "euler_a") ? DC_KS_EULER_A
                                                                                     : DC_KS_DPMPP_2M,
                     steps, karras != 0, 0, !strcmp(pred, "v") ? DC_PRED_V : DC_PRED_EPS, scale, mu_u, 0, 0};
        bool noisy = c.kind == DC_KS_EULER_A, ok = n == NPER / 4 && steps > 0 && steps <= 100;
        double *given = calloc((size_t)(steps + 1) * NPER, sizeof(double)), *out = calloc(NPER, sizeof(double));
        ok = ok && read_vals(f, "start", given, n);
        for (int i = 0; ok && noisy && i < steps; i++) ok = read_vals(f, "noise", given + n + i * n, n);
        ok = ok && read_vals(f, "out", out, n);
        char cname[128];
        snprintf(cname, sizeof cname, "golden %s parses", name);
        check(cname, ok, "%d elements, %d steps", n, steps);
        if (!ok) {
            free(given), free(out);
            break;
        }
        cases++;
        double *r = calloc(n, sizeof(double)), e = 0;
        ref_run_noise(&c, 0, mu, n, r, given);
        for (int j = 0; j < n; j++) {
            double d = fabs(r[j] - out[j]) / (1 + fabs(out[j]));
            e = d > e || d != d ? d : e;
        }
        snprintf(cname, sizeof cname, "transcription == k-diffusion: %s", name);
        check(cname, e < 1e-6, "max rel err %.2e", e);
        if (!noisy) {  // the sampler itself, from the same start noise (4 copies fill C x H x W)
            float start[NPER], x[NPER];
            for (int j = 0; j < NPER; j++) start[j] = (float)given[j % n];
            g_x_start = start;
            uint32_t idx[1] = {0};
            int rc = run_ks(be, &c, 1, 1, idx, &mu, x, scale != 1, NULL);
            g_x_start = NULL;
            e = rc ? INFINITY : 0;
            for (int j = 0; !rc && j < NPER; j++) {
                double d = fabs(x[j] - out[j % n]) / (1 + fabs(out[j % n]));
                e = d > e || d != d ? d : e;
            }
            snprintf(cname, sizeof cname, "sampler == k-diffusion: %s", name);
            check(cname, rc == 0 && e < 2e-5, "max rel err %.2e", e);
        }
        free(r), free(given), free(out);
    }
    fclose(f);
    check("golden cases read", cases == 6, "%d", cases);
}

// argv[1]: the backend to run the samplers on (default "cpu"; "cuda-fp32" on a GPU).
int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cpu";
    ref_schedule();
    test_schedule();
    dc_backend *be = NULL;
    if (dc_backend_create(name, &be) != 0) {
        printf("test_sd_sampling: no %s backend: %s\n", name, dc_error());
        return 1;
    }
    printf("samplers on the %s backend\n", be->name);
    test_vs_reference(be);
    test_distribution(be);
    test_v_roundtrip(be);
    test_batch_invariance(be);
    test_guidance_one(be);
    test_errors(be);
    test_golden(be);
    dc_backend_destroy(be);
    if (g_fail) {
        printf("test_sd_sampling: %d check(s) FAILED\n", g_fail);
        return 1;
    }
    printf("test_sd_sampling: all checks passed\n");
    return 0;
}
