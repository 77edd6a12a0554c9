// The SD samplers' ladders against diffusers' own schedulers, and the
// scheduler config reader's refusals.
//
// tests/golden/sd_schedulers.json (tools/sd_scheduler_golden.py) holds, for
// scheduler configs covering every key the engine follows, what diffusers'
// EulerDiscreteScheduler, EulerAncestralDiscreteScheduler, DDIMScheduler and
// DPMSolverMultistepScheduler (with and without Karras sigmas) make of them:
// alphas_cumprod, timesteps, sigmas, init_noise_sigma, and for some the whole
// loop of a synthetic model. Each config is read by the engine's own reader
// (dc_sd_sched_cfg_from_json) and each run planned by dc_ksampler_plan.
//
// Tolerances: diffusers keeps betas, alphas_cumprod and sigmas in float32,
// the engine in float64. A beta rounded to float32 (relative 2^-24, times 3
// for the square of a rounded square root) moves 1 - beta by
// 3 2^-24 beta / (1 - beta) relative, and alphas_cumprod[t] by the sum of
// that over i <= t (up to 6e-5 at the cosine schedule's end, where betas
// reach 0.999); with 2e-6 for the product's own rounding that is the
// allowance acp_tol[t]. sigma = sqrt((1 - acp) / acp) moves by half the
// relative error of acp over 1 - acp, and float32's rounding of acp near 1
// adds 8 2^-24 / (1 - acp) of its own (near t = 0, where 1 - acp = 0.00085,
// that alone is 4e-5): sig_tol. Karras sigmas inherit the errors of the two
// ends they interpolate between. A fractional timestep from log-sigma
// interpolation (sigma_to_t) moves by the sigma's relative error over the
// log-sigma step there (twice, plus 1e-4). Integer timesteps must be equal,
// except where DPM-Solver rounds a value that close to a half (float32
// against float64 may round it the other way). The loops run in float32 on
// both sides: 3e-4 relative to 1 + |x| (50 steps of a model that doubles
// nothing; measured 2e-4 at most).
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "diffusion/ksampler.h"
#include "diffusion/sd_sched_config.h"
#include "diffusion/sd_schedule.h"
#include "io/json.h"
#include "tmpdir.h"

#define GOLDEN "tests/golden/sd_schedulers.json"

// ---- reading the golden file --------------------------------------------------------------
static int arr(const dc_json *o, const char *key, double *out, int cap) {
    const dc_json *a = dc_json_get(o, key);
    if (!a || a->type != DC_JSON_ARRAY || a->nkids > cap) return -1;
    for (int i = 0; i < a->nkids; i++) {
        if (a->kids[i].type != DC_JSON_NUMBER) return -1;
        out[i] = a->kids[i].num;
    }
    return a->nkids;
}

static double num_of(const dc_json *o, const char *key) {
    const dc_json *v = dc_json_get(o, key);
    return v && v->type == DC_JSON_NUMBER ? v->num : NAN;
}

static double relerr(double got, double want) {
    double e = fabs(got - want) / fmax(fabs(want), 1e-30);
    return e == e ? e : INFINITY;
}

// The float32 allowances of a schedule (see the top of the file).
typedef struct {
    const dc_schedule *s;
    double *acp;  // [T] relative, of alphas_cumprod[t]
} tols;

static void tols_init(tols *tl, const dc_schedule *s, bool rescaled) {
    tl->s = s;
    tl->acp = malloc(sizeof(double) * s->T);
    double sum = 0, prev = 1;
    for (int t = 0; t < s->T; t++) {
        double a = s->alphas_cumprod[t], beta = prev > 0 ? 1 - a / prev : 0;
        sum += beta < 1 ? 3 * 0x1p-24 * beta / (1 - beta) : 0;
        tl->acp[t] = 2e-6 + sum;
        // zero terminal SNR: sqrt(acp) - sqrt(acp[T-1]) in float32 loses up to
        // 2 2^-24 absolutely, 4 2^-24 / sqrt(acp) relatively once squared
        if (rescaled && a > 0) tl->acp[t] += 4 * 0x1p-24 / sqrt(a);
        prev = a;
    }
}

// Relative allowance of sigma(t), t fractional (the larger of its neighbours').
static double sig_tol(const tols *tl, double t) {
    const dc_schedule *s = tl->s;
    double worst = 0;
    for (int i = (int)floor(fmax(t, 0)); i <= (int)ceil(fmin(t, s->T - 1)) && i < s->T; i++) {
        double a = s->alphas_cumprod[i];
        worst = fmax(worst, 2e-6 + 0.5 * (tl->acp[i] + 8 * 0x1p-24) / fmax(1 - a, 1e-30));
    }
    return worst;
}

// Allowance of the timestep sigma_to_t(sigma) for sigma off by rel.
static double t_tol(const tols *tl, double t, double rel) {
    const dc_schedule *s = tl->s;
    int lo = (int)floor(fmax(fmin(t, s->T - 2), 0));
    return 2 * rel / (s->log_sigmas[lo + 1] - s->log_sigmas[lo]) + 1e-4;
}

// ---- the synthetic model of the golden loops -----------------------------------------------
enum { NEL = 8 };
static dc_backend *g_be;

static int synth_eval(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    (void)ctx, (void)cond;
    float xs[NEL], ts[1], os[NEL];
    g_be->download(g_be, xs, x.p, sizeof xs);
    g_be->download(g_be, ts, t.p, sizeof(float) * B);
    for (int j = 0; j < NEL; j++) os[j] = 0.5f * xs[j] * cosf(ts[0] / 300) + 0.1f * sinf(ts[0] / 100);
    g_be->upload(g_be, out.p, os, sizeof os);
    return 0;
}

static int run_loop(const dc_ksampler_opts *o, const double *start, float *x_out) {
    float xs[NEL], ctx[2] = {0, 0};
    for (int j = 0; j < NEL; j++) xs[j] = (float)start[j];
    float *dx = g_be->alloc(g_be, sizeof xs), *dc = g_be->alloc(g_be, sizeof ctx);
    g_be->upload(g_be, dx, xs, sizeof xs);
    g_be->upload(g_be, dc, ctx, sizeof ctx);
    dc_ksampler_opts oo = *o;
    oo.x_given = true;  // x holds the golden start noise
    dc_sampler ks;
    int rc = dc_ksampler_init(&ks, g_be, &oo, 2, 2, 2, 1);
    if (!rc) {
        uint32_t idx[1] = {0};
        dc_cond cond = {.ctx = {.p = dc, .dt = DC_F32}, .len = 1, .dim = 2};
        rc = dc_sampler_run(&ks, (dc_buf){.p = dx, .dt = DC_F32}, &cond, idx, 1, synth_eval, NULL, NULL, NULL, NULL);
        dc_sampler_free(&ks);
    }
    g_be->download(g_be, x_out, dx, sizeof xs);
    g_be->free(g_be, dx), g_be->free(g_be, dc);
    return rc ? rc : dc_backend_status(g_be);
}

// ---- one run of the golden file against the engine's plan --------------------------------
typedef struct {
    int runs, loops, end_flips;  // end_flips: runs whose first timestep is the table end's (above)
    double acp, sigma, init, t_frac, loop;  // worst errors over their allowance (loop: relative)
} tally;

static void check_run(const char *cname, const dc_sd_sched_cfg *cfg, const dc_json *r, const double *start,
                      tally *ty) {
    const dc_json *sv = dc_json_get(r, "sampler");
    int n = (int)num_of(r, "steps");
    const char *sampler = sv && dc_json_is_cstr(sv) ? sv->str : "?";
    dc_ksampler_opts o = dc_ksampler_opts_default();
    o.steps = n, o.sched = cfg, o.cfg_scale = 1, o.ctx_len = 1, o.ctx_dim = 2;
    o.prediction = cfg->prediction == DC_PRED_V ? DC_PRED_V : DC_PRED_EPS;
    o.karras = strstr(sampler, "karras") != NULL;
    o.kind = !strncmp(sampler, "euler_a", 7) ? DC_KS_EULER_A : !strncmp(sampler, "euler", 5) ? DC_KS_EULER
             : !strcmp(sampler, "ddim") ? DC_KS_DDIM : DC_KS_DPMPP_2M;
    char name[160];
    snprintf(name, sizeof name, "%s %s %d steps", cname, sampler, n);
    double gt[128], gs[128], tu[128], at[128], ap[128];
    int nt = arr(r, "timesteps", gt, 128), ns = arr(r, "sigmas", gs, 128), nu = arr(r, "t_unrounded", tu, 128);
    // numpy's arange gives "trailing" spacing one more timestep, -1, for some
    // step counts (61 of 1000), which the engine leaves out
    bool extra = nt == n + 1 && gt[n] == -1;
    CHECK(n >= 1 && n <= 100 && (nt == n || extra), "%s: %d timesteps in the golden file", name, nt);
    if (!(n >= 1 && n <= 100 && (nt == n || extra))) return;

    dc_schedule s;
    dc_sample_step plan[100];
    double init = 0;
    int rc = dc_schedule_init_cfg(&s, cfg, o.kind != DC_KS_DDIM);
    if (!rc) rc = dc_ksampler_plan(&s, &o, plan, &init);
    CHECK(rc == 0, "%s: plan: %s", name, dc_error());
    if (rc) return dc_schedule_free(&s);
    ty->runs++;

    tols tl;
    tols_init(&tl, &s, cfg->rescale_zero_snr);
    // sigma's allowance: its own, or for Karras and log-linear sigmas the worst
    // of the ladder's ends too (they interpolate between them)
    double ends = 0;
    if ((o.karras || (o.kind == DC_KS_EULER && cfg->log_linear)) && ns >= n + 1)
        ends = fmax(sig_tol(&tl, dc_sd_sigma_to_t(&s, gs[0])),
                    sig_tol(&tl, dc_sd_sigma_to_t(&s, gs[o.karras ? n - 1 : n])));
    // timesteps
    bool integer = o.kind == DC_KS_DDIM || o.kind == DC_KS_DPMPP_2M;
    bool at_end = false;  // diffusers' float32 put the table's last sigma one step below it
    for (int i = 0; i < n; i++) {
        double d = fabs(plan[i].t - gt[i]);
        double rel = o.kind == DC_KS_DDIM ? 0 : fmax(ends, sig_tol(&tl, dc_sd_sigma_to_t(&s, plan[i].sigma)));
        if (integer) {
            bool flip = nu == n && d == 1 && fabs(fabs(tu[i] - floor(tu[i])) - 0.5) < t_tol(&tl, tu[i], rel);
            // Karras' first sigma is the table's last: the engine takes its
            // timestep, T - 1, exactly; diffusers under numpy 2 works it out
            // in float32, which (where the last sigmas are far apart, as the
            // cosine schedule's 20291 and 700) can land below T - 1.5
            bool end = o.karras && nu == n && i == 0 && plan[i].t == s.T - 1 && gt[i] == s.T - 2 &&
                       fabs(tu[i] - (s.T - 1)) < 1e-6;
            at_end = at_end || end;
            CHECK(plan[i].t == gt[i] || flip || end, "%s: timestep %d is %g, diffusers %g", name, i, plan[i].t,
                  gt[i]);
        } else if (cfg->continuous_t && o.prediction == DC_PRED_V) {  // 0.25 log sigma
            CHECK(d <= 0.25 * rel + 1e-6, "%s: timestep %d is %.6f, diffusers %.6f", name, i, plan[i].t, gt[i]);
        } else {
            double tol = o.karras ? t_tol(&tl, gt[i], rel) : 1e-4;  // else float32 of the same float64
            ty->t_frac = fmax(ty->t_frac, d == d ? d / tol : INFINITY);
            CHECK(d <= tol, "%s: timestep %d is %.6f, diffusers %.6f (allowed %.2e)", name, i, plan[i].t, gt[i], tol);
        }
    }
    if (o.kind == DC_KS_DDIM) {
        int na = arr(r, "acp_t", at, 128), np = arr(r, "acp_prev", ap, 128);
        CHECK(na >= n && np >= n, "%s: acp_t / acp_prev", name);
        for (int i = 0; i < n && na >= n && np >= n; i++) {
            int t = (int)plan[i].t, prev = t - s.T / n;
            double a = s.alphas_cumprod[t], b = 1 / (1 + plan[i].sigma_next * plan[i].sigma_next);
            double e = fmax(at[i] == 0 ? fabs(a) : relerr(a, at[i]) / tl.acp[t],
                            relerr(b, ap[i]) / (prev >= 0 ? tl.acp[prev] : tl.acp[0]));
            ty->acp = fmax(ty->acp, e);
            CHECK(e <= 1, "%s: step %d alphas_cumprod %.9g -> %.9g, diffusers %.9g -> %.9g", name, i, a, b, at[i],
                  ap[i]);
        }
        CHECK(init == 1 && num_of(r, "init_noise_sigma") == 1, "%s: start noise scale %g", name, init);
    } else {
        CHECK(ns >= n + 1, "%s: %d sigmas in the golden file", name, ns);
        if (extra && ns == n + 2) gs[n] = gs[n + 1];  // the step to the extra timestep left out
        for (int i = 0; i <= n && ns >= n + 1; i++) {
            double got = i < n ? plan[i].sigma : plan[n - 1].sigma_next;
            double e = gs[i] == 0 ? fabs(got) : relerr(got, gs[i]);
            double tol = gs[i] == 0 ? 0 : fmax(ends, sig_tol(&tl, dc_sd_sigma_to_t(&s, gs[i])));
            ty->sigma = fmax(ty->sigma, gs[i] == 0 ? e : e / tol);
            CHECK(e <= tol, "%s: sigma %d is %.9g, diffusers %.9g (rel err %.2e, allowed %.2e)", name, i, got, gs[i],
                  e, tol);
        }
        // the start noise: sigma space for the Euler classes; DPM-Solver's x_t = randn is sqrt(sigma0^2 + 1) randn
        double want = num_of(r, "init_noise_sigma");
        if (o.kind == DC_KS_DPMPP_2M) want *= sqrt(gs[0] * gs[0] + 1);
        double e = relerr(init, want), tol = fmax(ends, sig_tol(&tl, dc_sd_sigma_to_t(&s, gs[0])));
        ty->init = fmax(ty->init, e / tol);
        CHECK(e <= tol, "%s: start noise scale %.9g, diffusers %.9g", name, init, want);
    }
    free(tl.acp);
    double want[NEL];
    if (at_end) ty->end_flips++;  // a loop from another first timestep: not comparable
    if (!at_end && arr(r, "out", want, NEL) == NEL) {
        float x[NEL];
        rc = run_loop(&o, start, x);
        double e = rc ? INFINITY : 0;
        for (int j = 0; j < NEL && !rc; j++) {
            double d = fabs(x[j] - want[j]) / (1 + fabs(want[j]));
            e = d > e || d != d ? d : e;
        }
        ty->loops++;
        ty->loop = fmax(ty->loop, e);
        CHECK(e < 3e-4, "%s: sampling loop differs from diffusers' by %.2e%s%s", name, e, rc ? ": " : "",
              rc ? dc_error() : "");
    }
    dc_schedule_free(&s);
}

static void test_golden(void) {
    dc_json_doc doc;
    int rc = dc_json_read_file(&doc, GOLDEN);
    CHECK(rc == 0, "%s: %s (run from the repository root)", GOLDEN, dc_error());
    if (rc) return;
    double idx[64], start[NEL];
    int nidx = arr(doc.root, "acp_index", idx, 64);
    CHECK(nidx > 0 && arr(doc.root, "start", start, NEL) == NEL, "acp_index and start");
    const dc_json *cases = dc_json_get(doc.root, "cases");
    CHECK(cases && cases->type == DC_JSON_ARRAY && cases->nkids >= 20, "cases");
    tally ty = {0};
    for (int c = 0; cases && c < cases->nkids; c++) {
        const dc_json *cs = &cases->kids[c], *nm = dc_json_get(cs, "name"), *runs = dc_json_get(cs, "runs");
        const char *cname = nm && dc_json_is_cstr(nm) ? nm->str : "?";
        dc_sd_sched_cfg cfg;
        rc = dc_sd_sched_cfg_from_json(&cfg, dc_json_get(cs, "config"), cname);
        CHECK(rc == 0, "%s: the config is refused: %s", cname, dc_error());
        if (rc) continue;
        // alphas_cumprod as DDIMScheduler keeps them (no floor at zero SNR)
        double acp[64];
        int na = arr(cs, "alphas_cumprod", acp, 64);
        dc_schedule s;
        tols tl = {0};
        rc = dc_schedule_init_cfg(&s, &cfg, false);
        CHECK(rc == 0, "%s: schedule: %s", cname, dc_error());
        if (!rc) tols_init(&tl, &s, cfg.rescale_zero_snr);
        int checked = 0;
        for (int i = 0; i < na && i < nidx && !rc; i++) {
            int t = (int)idx[i];
            if (t >= s.T) continue;
            double a = s.alphas_cumprod[t], e = acp[i] == 0 ? fabs(a) : relerr(a, acp[i]) / tl.acp[t];
            ty.acp = fmax(ty.acp, e);
            CHECK(e <= 1, "%s: alphas_cumprod[%d] = %.9g, diffusers %.9g (allowed %.2e)", cname, t, a, acp[i],
                  tl.acp[t]);
            checked++;
        }
        CHECK(checked >= 5, "%s: %d alphas_cumprod compared", cname, checked);
        free(tl.acp);
        dc_schedule_free(&s);
        for (int k = 0; runs && runs->type == DC_JSON_ARRAY && k < runs->nkids; k++)
            check_run(cname, &cfg, &runs->kids[k], start, &ty);
        dc_sd_sched_cfg_free(&cfg);
    }
    printf("golden: %d runs, %d loops; worst error over its allowance: alphas_cumprod %.2f, sigma %.2f, start "
           "noise %.2f, fractional t %.2f; loops %.2e; %d Karras ladders whose first timestep diffusers' float32 "
           "put one below the table's end\n", ty.runs, ty.loops, ty.acp, ty.sigma, ty.init, ty.t_frac, ty.loop,
           ty.end_flips);
    CHECK(ty.end_flips <= 6, "%d ladders excused at the table's end", ty.end_flips);
    CHECK(ty.runs >= 250 && ty.loops >= 30, "%d runs and %d loops compared", ty.runs, ty.loops);
    dc_json_free(&doc);
}

// ---- refusals: each names the key and the file ------------------------------------------
static int parse_cfg(const char *text, dc_sd_sched_cfg *c) {
    dc_json_doc doc;
    if (dc_json_parse_opts(&doc, text, strlen(text), 0, DC_JSON_NONFINITE | DC_JSON_UNIQUE_KEYS))
        return dc_fail_ctx("sched.json");
    int rc = dc_sd_sched_cfg_from_json(c, doc.root, "sched.json");
    dc_json_free(&doc);
    return rc;
}

static void test_refusals(void) {
    static const struct { const char *json, *key; } bad[] = {
        {"{\"num_train_timesteps\": -5}", "num_train_timesteps"},
        {"{\"num_train_timesteps\": 1000.5}", "num_train_timesteps"},
        {"{\"num_train_timesteps\": \"1000\"}", "num_train_timesteps"},
        {"{\"beta_start\": \"x\"}", "beta_start"},
        {"{\"beta_start\": 0}", "beta_start"},
        {"{\"beta_end\": 1.5}", "beta_end"},
        {"{\"beta_start\": 0.02, \"beta_end\": 0.01}", "beta_start"},
        {"{\"beta_schedule\": \"cosine\"}", "beta_schedule"},
        {"{\"beta_schedule\": 3}", "beta_schedule"},
        {"{\"prediction_type\": 42}", "prediction_type"},
        {"{\"prediction_type\": \"flow_prediction\"}", "prediction_type"},
        {"{\"prediction_type\": \"v\"}", "prediction_type"},
        {"{\"timestep_spacing\": \"even\"}", "timestep_spacing"},
        {"{\"timestep_spacing\": null}", "timestep_spacing"},
        {"{\"steps_offset\": -1}", "steps_offset"},
        {"{\"steps_offset\": 1000}", "steps_offset"},
        {"{\"rescale_betas_zero_snr\": \"yes\"}", "rescale_betas_zero_snr"},
        {"{\"rescale_betas_zero_snr\": 1}", "rescale_betas_zero_snr"},
        {"{\"trained_betas\": [0.1, 0.2]}", "trained_betas"},
        {"{\"num_train_timesteps\": 2, \"trained_betas\": [0.1, 1.0]}", "trained_betas"},
        {"{\"trained_betas\": \"x\"}", "trained_betas"},
        {"{\"use_karras_sigmas\": \"true\"}", "use_karras_sigmas"},
        {"{\"use_karras_sigmas\": true, \"use_exponential_sigmas\": true}", "use_exponential_sigmas"},
        {"{\"interpolation_type\": \"cubic\"}", "interpolation_type"},
        {"{\"timestep_type\": \"real\"}", "timestep_type"},
        {"{\"final_sigmas_type\": \"one\"}", "final_sigmas_type"},
        {"{\"sigma_min\": -1}", "sigma_min"},
        {"{\"sigma_min\": 5, \"sigma_max\": 2}", "sigma_min"},
        {"{\"set_alpha_to_one\": \"false\"}", "set_alpha_to_one"},
        {"{\"lower_order_final\": 0}", "lower_order_final"},
        {"{\"solver_order\": 4}", "solver_order"},
        {"{\"algorithm_type\": \"ddim\"}", "algorithm_type"},
        {"{\"solver_type\": 2}", "solver_type"},
        {"{\"lambda_min_clipped\": NaN}", "lambda_min_clipped"},
        {"{\"lambda_min_clipped\": \"-inf\"}", "lambda_min_clipped"},
        {"{\"clip_sample\": \"no\"}", "clip_sample"},
        {"{\"_class_name\": 5}", "_class_name"},
        {"[1, 2]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dc_sd_sched_cfg c;
        int rc = parse_cfg(bad[i].json, &c);
        if (!rc) dc_sd_sched_cfg_free(&c);
        CHECK(rc != 0 && strstr(dc_error(), bad[i].key) && strstr(dc_error(), "sched.json"),
              "%s: refused naming '%s' and the file? rc %d: %s", bad[i].json, bad[i].key, rc, dc_error());
    }
    // what is accepted, and read as diffusers reads it
    dc_sd_sched_cfg c;
    int rc = parse_cfg("{\"lambda_min_clipped\": -Infinity, \"use_karras_sigmas\": null, \"sigma_min\": null,"
                       " \"skip_prk_steps\": true, \"anything\": [1]}", &c);
    CHECK(rc == 0 && isinf(c.lambda_min_clipped) && c.lambda_min_clipped < 0 && !c.use_karras_sigmas &&
          c.sigma_min == 0 && c.T == 1000 && c.beta_schedule == DC_BETAS_LINEAR && c.beta_start == 0.0001 &&
          c.set_alpha_to_one && c.steps_offset == 0 && !c.schedule_given,
          "-Infinity, nulls, unknown keys and diffusers' defaults: %s", rc ? dc_error() : "");
    if (!rc) dc_sd_sched_cfg_free(&c);
    rc = parse_cfg("{\"num_train_timesteps\": 3, \"trained_betas\": [0.1, 0.2, 0.3], \"beta_schedule\": \"linear\"}",
                   &c);
    dc_schedule s;
    CHECK(rc == 0 && dc_schedule_init_cfg(&s, &c, true) == 0 && fabs(s.alphas_cumprod[2] - 0.9 * 0.8 * 0.7) < 1e-15,
          "trained_betas win over beta_schedule: %s", dc_error());
    if (!rc) dc_schedule_free(&s), dc_sd_sched_cfg_free(&c);

    // files: a duplicate key names the key and the file; Python's -Infinity is read
    if (tmpdir_make("sd_schedule")) return;
    const char *path = tmp_path("scheduler_config.json");
    FILE *f = fopen(path, "w");
    fputs("{\"beta_schedule\": \"scaled_linear\", \"steps_offset\": 1, \"beta_schedule\": \"linear\"}", f);
    fclose(f);
    rc = dc_sd_sched_cfg_read(&c, path);
    CHECK(rc != 0 && strstr(dc_error(), "beta_schedule") && strstr(dc_error(), path) && strstr(dc_error(), "duplicate"),
          "a duplicate key refused: %s", dc_error());
    f = fopen(path, "w");
    fputs("{\"beta_schedule\": \"scaled_linear\", \"beta_start\": 0.00085, \"beta_end\": 0.012,\n"
          " \"lambda_min_clipped\": -Infinity, \"timestep_spacing\": \"trailing\"}", f);
    fclose(f);
    rc = dc_sd_sched_cfg_read(&c, path);
    CHECK(rc == 0 && c.spacing == DC_SPACING_TRAILING && isinf(c.lambda_min_clipped) && !strcmp(c.source, path),
          "a file as diffusers writes it: %s", rc ? dc_error() : "");
    if (!rc) dc_sd_sched_cfg_free(&c);
    f = fopen(path, "w");
    fputs("{\"beta_start\": \"x\"}", f);
    fclose(f);
    rc = dc_sd_sched_cfg_read(&c, path);
    CHECK(rc != 0 && strstr(dc_error(), "beta_start") && strstr(dc_error(), path), "the file named: %s", dc_error());
    tmpdir_remove();
}

// ---- what a sampler does not follow; what no plan can run ---------------------------------
static void test_warnings_and_plans(void) {
    dc_sd_sched_cfg c;
    char buf[2048];
    int rc = parse_cfg("{\"beta_schedule\": \"scaled_linear\", \"use_karras_sigmas\": true, \"clip_sample\": true,"
                       " \"solver_order\": 3, \"thresholding\": true}", &c);
    CHECK(rc == 0, "config: %s", dc_error());
    int n = dc_sd_sched_cfg_warnings(&c, DC_SCHED_EULER, false, buf, sizeof buf);
    CHECK(n == 1 && strstr(buf, "use_karras_sigmas") && strstr(buf, "sched.json"), "euler: %d: %s", n, buf);
    n = dc_sd_sched_cfg_warnings(&c, DC_SCHED_DPM_MULTISTEP, true, buf, sizeof buf);
    CHECK(n == 2 && strstr(buf, "solver_order") && strstr(buf, "thresholding") && !strstr(buf, "karras"),
          "dpmpp_2m_karras: %d: %s", n, buf);
    n = dc_sd_sched_cfg_warnings(&c, DC_SCHED_DDIM, false, buf, sizeof buf);
    CHECK(n == 2 && strstr(buf, "clip_sample") && strstr(buf, "thresholding"), "ddim: %d: %s", n, buf);
    n = dc_sd_sched_cfg_warnings(&c, DC_SCHED_EULER_ANCESTRAL, false, buf, sizeof buf);
    CHECK(n == 0, "euler_a follows all it reads: %d: %s", n, buf);
    dc_sd_sched_cfg_free(&c);
    rc = parse_cfg("{\"prediction_type\": \"epsilon\"}", &c);
    n = dc_sd_sched_cfg_warnings(&c, DC_SCHED_EULER_ANCESTRAL, false, buf, sizeof buf);
    CHECK(rc == 0 && n == 1 && strstr(buf, "beta_schedule"), "no beta_schedule: %d: %s", n, buf);
    dc_sd_sched_cfg_default(&c);
    n = dc_sd_sched_cfg_warnings(&c, DC_SCHED_DDIM, false, buf, sizeof buf);
    CHECK(n == 0, "SD's own config: %d: %s", n, buf);
    static const struct { const char *name; int pred; } preds[] = {
        {"epsilon", DC_PRED_EPS}, {"v_prediction", DC_PRED_V}, {"sample", DC_PRED_SAMPLE}};
    for (int i = 0; i < 3; i++) {
        char json[96];
        snprintf(json, sizeof json, "{\"beta_schedule\": \"scaled_linear\", \"prediction_type\": \"%s\"}", preds[i].name);
        rc = parse_cfg(json, &c);
        CHECK(rc == 0 && c.prediction == preds[i].pred, "prediction_type %s read: %d", preds[i].name, c.prediction);
        dc_sd_sched_cfg_free(&c);
    }

    // zero terminal SNR with an epsilon model: DDIM cannot start at t = 999
    rc = parse_cfg("{\"beta_schedule\": \"scaled_linear\", \"beta_start\": 0.00085, \"beta_end\": 0.012,"
                   " \"rescale_betas_zero_snr\": true, \"timestep_spacing\": \"trailing\"}", &c);
    dc_ksampler_opts o = dc_ksampler_opts_default();
    o.kind = DC_KS_DDIM, o.steps = 10, o.sched = &c;
    dc_schedule s;
    dc_sample_step plan[1000];
    double init;
    rc = rc ? rc : dc_schedule_init_cfg(&s, &c, false);
    int prc = rc ? 0 : dc_ksampler_plan(&s, &o, plan, &init);
    CHECK(rc == 0 && prc != 0 && strstr(dc_error(), "rescale_betas_zero_snr"), "DDIM, zero SNR, epsilon: %s",
          dc_error());
    o.prediction = DC_PRED_V;
    prc = rc ? -1 : dc_ksampler_plan(&s, &o, plan, &init);
    CHECK(prc == 0 && plan[0].t == 999 && isinf(plan[0].sigma), "DDIM, zero SNR, v: %s", prc ? dc_error() : "");
    if (!rc) dc_schedule_free(&s);
    dc_sd_sched_cfg_free(&c);
    // betas that take alphas_cumprod to 0 long before the end
    rc = parse_cfg("{\"num_train_timesteps\": 5000, \"beta_start\": 0.5, \"beta_end\": 0.9}", &c);
    int src = rc ? 0 : dc_schedule_init_cfg(&s, &c, true);
    CHECK(rc == 0 && src != 0 && strstr(dc_error(), "underflows"), "alphas_cumprod underflowing: %s", dc_error());
    // "leading" with steps_offset 1 reaches t = 1000 at 1000 steps
    dc_sd_sched_cfg_default(&c);
    c.spacing = DC_SPACING_LEADING;
    o = dc_ksampler_opts_default();
    o.steps = 1000, o.sched = &c;
    rc = dc_schedule_init_cfg(&s, &c, true);
    prc = rc ? 0 : dc_ksampler_plan(&s, &o, plan, &init);
    CHECK(rc == 0 && prc != 0 && strstr(dc_error(), "1000") && strstr(dc_error(), "steps_offset"),
          "leading + offset past the schedule: %s", dc_error());
    if (!rc) dc_schedule_free(&s);
}

int main(void) {
    if (dc_backend_create("cpu", &g_be)) {
        printf("test_sd_schedule: no cpu backend: %s\n", dc_error());
        return 1;
    }
    test_golden();
    test_refusals();
    test_warnings_and_plans();
    dc_backend_destroy(g_be);
    printf("test_sd_schedule: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
