// The epsilon / v / sample training objective (diffusion/objective.h) on the
// CPU backend against float64 transcriptions of diffusers' training step
// (train_text_to_image.py: noise with its offset, add_noise, the target of
// each prediction type, compute_snr and the Min-SNR weights, the per-sample
// mean squared error): x_t, targets, weights, losses and gradients on fresh
// random inputs; the draws depend on the sample's key alone (a batch cut in
// two gives the same bytes); zero terminal SNR; refusals.
// Prints one line per check; exits 1 on any failure (NaN fails).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "diffusion/objective.h"
#include "diffusion/sd_schedule.h"

static int g_fail, g_pass;
#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (cond) g_pass++;                                    \
        else g_fail++;                                         \
        printf("%s ", (cond) ? "[ ok ]" : "[FAIL]");           \
        printf(__VA_ARGS__);                                   \
        printf("\n");                                          \
    } while (0)

enum { B = 5, C = 4, HW = 37, N = C * HW };
static const uint64_t SEED = 20261128;
static const uint32_t STEP = 17;

static double urand(uint32_t i) { return dc_randn_at(99, i, 0, 0, 0); }

// max |a - b| / (1 + |b|); NaN counts as infinite
static double rel_err(const float *a, const double *b, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / (1 + fabs(b[i]));
        if (!(d <= e)) e = d != d ? INFINITY : d;
    }
    return e;
}

typedef struct {
    float *xt, *eps, *target, *tm, w[B];
} prepared;

static int prepare(dc_backend *be, const dc_mse_objective *o, const dc_schedule *s, const float *x0h, const int *t,
                   const uint32_t *keys, int nb, prepared *p) {
    size_t bytes = sizeof(float) * (size_t)nb * N;
    dc_buf x0 = {be->alloc(be, bytes), DC_F32}, xt = {be->alloc(be, bytes), DC_F32},
           eps = {be->alloc(be, bytes), DC_F32}, tg = {be->alloc(be, bytes), DC_F32},
           sc = {be->alloc(be, bytes), DC_F32}, tm = {be->alloc(be, sizeof(float) * nb), DC_F32};
    be->upload(be, x0.p, x0h, bytes);
    int rc = dc_mse_objective_prepare(be, o, s, xt, eps, tg, tm, p->w, x0, sc, t, keys, nb, C, HW, SEED, STEP);
    p->xt = malloc(bytes), p->eps = malloc(bytes), p->target = malloc(bytes), p->tm = malloc(sizeof(float) * nb);
    be->download(be, p->xt, xt.p, bytes);
    be->download(be, p->eps, eps.p, bytes);
    be->download(be, p->target, tg.p, bytes);
    be->download(be, p->tm, tm.p, sizeof(float) * nb);
    dc_buf all[] = {x0, xt, eps, tg, sc, tm};
    for (int i = 0; i < 6; i++) be->free(be, all[i].p);
    return rc;
}

static void unprepare(prepared *p) { free(p->xt), free(p->eps), free(p->target), free(p->tm); }

// One prediction type and its options against the float64 transcription.
static void test_case(dc_backend *be, const dc_schedule *s, dc_prediction pred, float gamma, float offset,
                      const char *name) {
    dc_mse_objective o = {pred, gamma, offset};
    float x0[B * N];
    int t[B];
    uint32_t keys[B];
    for (int i = 0; i < B * N; i++) x0[i] = (float)urand(1000 + (uint32_t)i + 7919u * (uint32_t)pred);
    for (int b = 0; b < B; b++) t[b] = (int)((uint32_t)(fabs(urand(50 + b)) * 331) % 1000), keys[b] = 11 + 3 * b;
    t[0] = 0, t[1] = 999;  // both ends
    prepared p;
    int rc = prepare(be, &o, s, x0, t, keys, B, &p);
    double xt_r[B * N], eps_r[B * N], tg_r[B * N], w_r[B];
    for (int b = 0; b < B; b++) {
        double acp = s->alphas_cumprod[t[b]], sa = sqrt(acp), s1 = sqrt(1 - acp);
        double snr = (sa / s1) * (sa / s1);  // compute_snr
        double m = fmin(snr, gamma);
        w_r[b] = gamma <= 0 ? 1 : pred == DC_PRED_EPS ? m / snr : pred == DC_PRED_V ? m / (snr + 1) : m;
        for (int j = 0; j < N; j++) {
            int i = b * N + j;
            double e = dc_randn_at(SEED, keys[b], STEP, DC_STREAM_TRAIN_NOISE, (uint32_t)j);
            if (offset > 0) e += (double)offset * dc_randn_at(SEED, keys[b], STEP, DC_STREAM_NOISE_OFFSET, (uint32_t)(j / HW));
            eps_r[i] = e;
            xt_r[i] = sa * x0[i] + s1 * e;
            tg_r[i] = pred == DC_PRED_EPS ? e : pred == DC_PRED_V ? sa * e - s1 * x0[i] : x0[i];
        }
    }
    double tm_r[B];
    for (int b = 0; b < B; b++) tm_r[b] = t[b];
    CHECK(rc == 0, "%s: prepare runs (%s)", name, rc ? dc_error() : "ok");
    CHECK(rel_err(p.eps, eps_r, B * N) < 1e-6, "%s: noise == randn%s: %.2e", name, offset > 0 ? " + offset randn(B,C,1,1)" : "",
          rel_err(p.eps, eps_r, B * N));
    CHECK(rel_err(p.xt, xt_r, B * N) < 2e-6, "%s: x_t == add_noise: %.2e", name, rel_err(p.xt, xt_r, B * N));
    CHECK(rel_err(p.target, tg_r, B * N) < 2e-6, "%s: target: %.2e", name, rel_err(p.target, tg_r, B * N));
    CHECK(rel_err(p.tm, tm_r, B) == 0, "%s: the model's timesteps are t", name);
    CHECK(rel_err(p.w, w_r, B) < 1e-6, "%s: weights (%g .. %g): %.2e", name, p.w[0], p.w[1], rel_err(p.w, w_r, B));
    if (offset > 0) {  // each channel's offset is one value over its HW elements
        double spread = 0;
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++) {
                double first = p.eps[b * N + c * HW] - dc_randn_at(SEED, keys[b], STEP, DC_STREAM_TRAIN_NOISE, (uint32_t)(c * HW));
                for (int i = 1; i < HW; i++) {
                    double d = p.eps[b * N + c * HW + i] - dc_randn_at(SEED, keys[b], STEP, DC_STREAM_TRAIN_NOISE, (uint32_t)(c * HW + i));
                    spread = fmax(spread, fabs(d - first));
                }
            }
        CHECK(spread < 1e-6, "%s: the offset is constant over a channel: %.2e", name, spread);
    }

    // the loss against its transcription: w_b mean((out - target)^2), gradient 2 w_b (out - target) / N / batch
    float out[B * N], dout[B * N], losses[2 * B];
    for (int i = 0; i < B * N; i++) out[i] = p.target[i] + (float)(0.5 * urand(20000 + (uint32_t)i));
    size_t bytes = sizeof out;
    dc_buf ob = {be->alloc(be, bytes), DC_F32}, tb = {be->alloc(be, bytes), DC_F32}, db = {be->alloc(be, bytes), DC_F32},
           lb = {be->alloc(be, sizeof losses), DC_F32};
    be->upload(be, ob.p, out, bytes);
    be->upload(be, tb.p, p.target, bytes);
    const float gs = 1.0f / 12;
    rc = dc_mse_objective_loss(be, db, lb, ob, tb, p.w, B, C, HW, gs);
    be->download(be, dout, db.p, bytes);
    be->download(be, losses, lb.p, sizeof losses);
    double l_r[2 * B], d_r[B * N];
    for (int b = 0; b < B; b++) {
        double se = 0;
        for (int j = 0; j < N; j++) {
            double d = (double)out[b * N + j] - p.target[b * N + j];
            se += d * d;
            d_r[b * N + j] = gs * p.w[b] * 2 * d / N;
        }
        l_r[2 * b] = p.w[b] * se / N, l_r[2 * b + 1] = 0;
    }
    CHECK(rc == 0 && rel_err(losses, l_r, 2 * B) < 1e-5, "%s: losses == w mse: %.2e", name, rel_err(losses, l_r, 2 * B));
    CHECK(rc == 0 && rel_err(dout, d_r, B * N) < 1e-5, "%s: dout == d loss / d out: %.2e", name, rel_err(dout, d_r, B * N));
    // and against central differences of the transcription, in float64, along a random direction
    double dir_dot = 0, fd = 0, h = 1e-4;
    for (int b = 0; b < B; b++) {
        double lp = 0, lm = 0;
        for (int j = 0; j < N; j++) {
            double v = urand(40000 + (uint32_t)(b * N + j)), d = (double)out[b * N + j] - p.target[b * N + j];
            lp += (d + h * v) * (d + h * v), lm += (d - h * v) * (d - h * v);
            dir_dot += dout[b * N + j] * v;
        }
        fd += gs * p.w[b] * (lp - lm) / N / (2 * h);
    }
    CHECK(fabs(dir_dot - fd) < 1e-5 * (1 + fabs(fd)), "%s: dout along a direction == central differences (%.6g vs %.6g)",
          name, dir_dot, fd);
    dc_buf all[] = {ob, tb, db, lb};
    for (int i = 0; i < 4; i++) be->free(be, all[i].p);

    // a batch cut in two gives the same bytes: every draw is keyed by the sample
    prepared a, c;
    int rc2 = prepare(be, &o, s, x0, t, keys, 2, &a) | prepare(be, &o, s, x0 + 2 * N, t + 2, keys + 2, B - 2, &c);
    bool same = rc2 == 0 && !memcmp(a.xt, p.xt, sizeof(float) * 2 * N) && !memcmp(c.xt, p.xt + 2 * N, sizeof(float) * (B - 2) * N) &&
                !memcmp(a.target, p.target, sizeof(float) * 2 * N) && !memcmp(c.target, p.target + 2 * N, sizeof(float) * (B - 2) * N);
    CHECK(same, "%s: batches of 2 and 3 give the batch of 5's bytes", name);
    unprepare(&a), unprepare(&c), unprepare(&p);
}

int main(void) {
    dc_backend *be = dc_backend_cpu_create();
    if (!be) return printf("FAIL no CPU backend: %s\n", dc_error()), 1;
    dc_schedule s;
    if (dc_schedule_init_scaled_linear(&s, 1000, 0.00085, 0.012)) return printf("FAIL schedule: %s\n", dc_error()), 1;
    test_case(be, &s, DC_PRED_EPS, 0, 0, "epsilon");
    test_case(be, &s, DC_PRED_EPS, 5, 0.1f, "epsilon, Min-SNR 5, offset 0.1");
    test_case(be, &s, DC_PRED_V, 5, 0, "v, Min-SNR 5");
    test_case(be, &s, DC_PRED_SAMPLE, 3, 0.05f, "sample, Min-SNR 3, offset 0.05");
    dc_schedule_free(&s);

    // zero terminal SNR (the last beta 1): the epsilon weight takes its limit 1, not 0/0
    double betas[1000];
    for (int i = 0; i < 1000; i++) betas[i] = i == 999 ? 1.0 : 0.0001 + 0.02 * i / 999.0;
    int rc = dc_schedule_init_betas(&s, betas, NULL, 1000, 1000);
    CHECK(rc == 0 && s.alphas_cumprod[999] == 0, "a schedule whose last alphas_cumprod is 0");
    if (rc == 0) {
        dc_mse_objective o = {DC_PRED_EPS, 5, 0};
        float x0[N];
        for (int i = 0; i < N; i++) x0[i] = (float)urand(70000 + i);
        int t = 999;
        uint32_t key = 3;
        prepared p;
        rc = prepare(be, &o, &s, x0, &t, &key, 1, &p);
        CHECK(rc == 0 && p.w[0] == 1.0f, "zero SNR: the epsilon weight is 1 (%g)", p.w[0]);
        unprepare(&p);
        dc_schedule_free(&s);
    }

    // refusals
    dc_mse_objective bad[] = {{DC_PRED_FLOW, 0, 0}, {DC_PRED_EPS, -1, 0}, {DC_PRED_EPS, NAN, 0}, {DC_PRED_V, 0, -0.1f},
                              {DC_PRED_V, 0, INFINITY}};
    const char *what[] = {"a flow model's velocity", "gamma -1", "gamma NaN", "offset -0.1", "offset inf"};
    for (int i = 0; i < 5; i++) {
        rc = dc_mse_objective_validate(&bad[i]);
        CHECK(rc != 0, "%s refused: %s", what[i], rc ? dc_error() : "accepted");
    }
    dc_backend_destroy(be);
    printf("test_objective: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
