// The SD sampling loop. Per step (see ksampler.h for the references):
//   with guidance: model([c_in x; c_in x], t, [cond; null]) -> cfg_combine
//   without:       model(c_in x, t, cond)
//   denoised = dx x + de out; x = ax x + ad denoised + ao old + an z
#include "diffusion/ksampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"
#include "core/rng.h"

dc_ksampler_opts dc_ksampler_opts_default(void) {
    dc_ksampler_opts o;
    memset(&o, 0, sizeof o);
    o.kind = DC_KS_EULER_A;
    o.steps = 20;
    o.prediction = DC_PRED_EPS;
    o.cfg_scale = 7.5f;
    o.ctx_len = 77, o.ctx_dim = 768;
    return o;
}

const char *dc_ks_kind_name(dc_ks_kind k) {
    switch (k) {
    case DC_KS_DDIM: return "ddim";
    case DC_KS_EULER: return "euler";
    case DC_KS_EULER_A: return "euler_a";
    case DC_KS_DPMPP_2M: return "dpmpp_2m";
    }
    return "unknown";
}

dc_sd_class dc_ks_class(dc_ks_kind k) {
    return k == DC_KS_DDIM ? DC_SCHED_DDIM : k == DC_KS_EULER ? DC_SCHED_EULER
           : k == DC_KS_EULER_A ? DC_SCHED_EULER_ANCESTRAL : DC_SCHED_DPM_MULTISTEP;
}

static const dc_sd_sched_cfg *sched_of(const dc_ksampler_opts *opt, dc_sd_sched_cfg *def) {
    if (opt->sched) return opt->sched;
    dc_sd_sched_cfg_default(def);
    return def;
}

// diffusers DDIMScheduler.step as scalars. With eps = (x - sqrt(acp) x0) /
// sqrt(1 - acp), its x' = sqrt(acp_prev) x0 + dir eps + std z becomes
// x' = (dir / sqrt(1 - acp)) x + (sqrt(acp_prev) - dir sqrt(acp) / sqrt(1 - acp)) x0 + std z.
static int plan_ddim(const dc_sd_schedule *s, const dc_ksampler_opts *opt, dc_kstep *st) {
    int n = opt->steps, T = s->T;
    dc_sd_sched_cfg def;
    const dc_sd_sched_cfg *c = sched_of(opt, &def);
    double *ts = malloc(sizeof(double) * n), *sig = malloc(sizeof(double) * (n + 1)), init;
    int rc = ts && sig ? 0 : dc_fail("sampler: out of host memory");
    if (!rc) rc = dc_sd_ladder(s, c, DC_SCHED_DDIM, false, opt->prediction, n, ts, sig, &init);
    const double final = c->set_alpha_to_one ? 1.0 : s->alphas_cumprod[0];
    for (int k = 0; k < n && !rc; k++) {
        int t = (int)ts[k], prev = t - T / n;
        double acp = s->alphas_cumprod[t];
        double acp_prev = prev >= 0 ? s->alphas_cumprod[prev] : final;
        if (acp == 0 && opt->prediction != DC_PRED_V) {
            rc = dc_fail("sampler: at timestep %d alphas_cumprod is 0 (rescale_betas_zero_snr in %s): an epsilon "
                         "prediction says nothing of the image there (DDIM needs a v_prediction model)",
                         t, c->source[0] ? c->source : "the scheduler config");
            break;
        }
        double var = (1 - acp_prev) / (1 - acp) * (1 - acp / acp_prev);
        double std = opt->eta * sqrt(var), dir2 = 1 - acp_prev - std * std;
        if (dir2 < 0) {
            rc = dc_fail("sampler: DDIM eta %g too large at timestep %d", opt->eta, t);
            break;
        }
        double dir = sqrt(dir2), sa = sqrt(acp), s1 = sqrt(1 - acp);
        dc_kstep *p = &st[k];
        memset(p, 0, sizeof *p);
        p->sigma = acp > 0 ? s1 / sa : INFINITY;
        p->sigma_next = sqrt((1 - acp_prev) / acp_prev);
        p->t = t;
        p->c_in = 1;
        if (opt->prediction == DC_PRED_V) p->dx = sa, p->de = -s1;  // x0 = sqrt(acp) x - sqrt(1-acp) v
        else p->dx = 1 / sa, p->de = -s1 / sa;                        // x0 = (x - sqrt(1-acp) eps) / sqrt(acp)
        p->ax = dir / s1;
        p->ad = sqrt(acp_prev) - dir * sa / s1;
        p->an = std;
        p->noise = opt->eta > 0;
    }
    free(ts), free(sig);
    return rc;
}

static int plan_k(const dc_sd_schedule *s, const dc_ksampler_opts *opt, dc_kstep *st,
                  double *init_sigma) {
    int n = opt->steps;
    dc_sd_sched_cfg def;
    const dc_sd_sched_cfg *c = sched_of(opt, &def);
    const bool dpm = opt->kind == DC_KS_DPMPP_2M, custom = opt->sigmas != NULL;
    double *sig = malloc(sizeof(double) * (n + 1)), *ts = malloc(sizeof(double) * n), init = 0;
    if (!sig || !ts) return free(sig), free(ts), dc_fail("sampler: out of host memory");
    int rc = 0;
    // DPM++ 2M's last step is of first order into sigma 0 and, in diffusers'
    // class, when lower_order_final with fewer than 15 steps or euler_at_final
    bool first_order_last = false;
    if (custom) {  // k-diffusion: the ladder given, t = sigma_to_t(sigma), x = sigmas[0] randn
        memcpy(sig, opt->sigmas, sizeof(double) * (n + 1));
        for (int i = 0; i < n; i++) ts[i] = dc_sd_sigma_to_t(s, sig[i]);
        for (int i = 0; i <= n && !rc; i++)
            if (!(sig[i] >= 0 && isfinite(sig[i])) || (i < n && !(sig[i] > 0 && sig[i] >= sig[i + 1])))
                rc = dc_fail("sampler: sigma %d of the ladder given is %g (a descending ladder above 0, its "
                             "last at least 0)", i, sig[i]);
        init = sig[0];
    } else {
        rc = dc_sd_ladder(s, c, dc_ks_class(opt->kind), opt->karras, opt->prediction, n, ts, sig, &init);
        if (dpm) init *= sqrt(sig[0] * sig[0] + 1);  // x_t = randn: x = x_t sqrt(sigma^2 + 1)
        first_order_last = c->euler_at_final || (c->lower_order_final && n < 15);
    }
    for (int i = 0; i < n && !rc; i++) {
        double sg = sig[i], sn = sig[i + 1];
        dc_kstep *p = &st[i];
        memset(p, 0, sizeof *p);
        p->sigma = sg, p->sigma_next = sn;
        p->t = ts[i];
        p->c_in = 1 / sqrt(sg * sg + 1);
        if (opt->prediction == DC_PRED_V) p->dx = 1 / (sg * sg + 1), p->de = -sg * p->c_in;
        else p->dx = 1, p->de = -sg;
        switch (opt->kind) {
        case DC_KS_EULER:  // x + (x - den) / s * (sn - s)
            p->ax = sn / sg, p->ad = 1 - sn / sg;
            break;
        case DC_KS_EULER_A: {  // get_ancestral_step(s, sn, eta = 1), then x + d (s_down - s)
            // (upstream's min(sn, .) only binds for eta > 1)
            double up = fmin(sn, sqrt(sn * sn * (sg * sg - sn * sn) / (sg * sg)));
            double down = sqrt(sn * sn - up * up);
            p->ax = down / sg, p->ad = 1 - down / sg;
            p->an = up;
            p->noise = sn > 0;
            break;
        }
        case DC_KS_DPMPP_2M: {
            // t = -log sigma; h = t_next - t; x = (sn / s) x - expm1(-h) D, where
            // D = denoised on a first-order step, else
            // (1 + 1/(2r)) denoised - 1/(2r) old, r = h_last / h.
            if (sn == 0) {
                p->ax = 0, p->ad = 1;
                break;
            }
            double h = log(sg) - log(sn), e = -expm1(-h);
            p->ax = sn / sg;
            if (i == opt->skip || (i == n - 1 && first_order_last)) {  // the first step run, or the last
                p->ad = e;
            } else {
                double r = (log(sig[i - 1]) - log(sg)) / h;
                p->ad = e * (1 + 1 / (2 * r));
                p->ao = -e / (2 * r);
            }
            if (i == n - 1 && !custom) {  // DPM-Solver's result is x_t = x / sqrt(sn^2 + 1)
                double back = 1 / sqrt(sn * sn + 1);
                p->ax *= back, p->ad *= back, p->ao *= back;
            }
            break;
        }
        default: rc = dc_fail("sampler: unknown sampler %d", (int)opt->kind);
        }
    }
    if (!rc) *init_sigma = init;
    free(sig), free(ts);
    return rc;
}

int dc_ksampler_plan(const dc_sd_schedule *s, const dc_ksampler_opts *opt, dc_kstep *steps,
                     double *init_sigma) {
    if (opt->steps < 1 || opt->steps > s->T)
        return dc_fail("sampler: %d steps outside [1, %d]", opt->steps, s->T);
    if (opt->skip < 0 || opt->skip >= opt->steps)
        return dc_fail("sampler: skipping %d of %d steps leaves none to run", opt->skip, opt->steps);
    if (opt->prediction != DC_PRED_EPS && opt->prediction != DC_PRED_V)
        return dc_fail("sampler: unknown prediction type %d", (int)opt->prediction);
    if (opt->kind == DC_KS_DDIM) {
        if (opt->sigmas) return dc_fail("sampler: DDIM walks timesteps, not a ladder of sigmas");
        if (!(opt->eta >= 0)) return dc_fail("sampler: DDIM eta %g must be >= 0", opt->eta);
        *init_sigma = 1;
        return plan_ddim(s, opt, steps);
    }
    return plan_k(s, opt, steps, init_sigma);
}

void dc_ksampler_free(dc_ksampler *s) {
    if (!s) return;
    dc_buf *bufs[] = {&s->xin, &s->out, &s->comb, &s->den, &s->old, &s->z, &s->t, &s->ctx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->p) s->be->free(s->be, bufs[i]->p);
    if (s->graph) s->be->graph_free(s->be, s->graph);
    free(s->t_host);
    free(s->ca);
    free(s->cb);
    free(s->plan);
    dc_sd_schedule_free(&s->sched);
    memset(s, 0, sizeof *s);
}

int dc_ksampler_init(dc_ksampler *s, dc_backend *be, const dc_ksampler_opts *opt, int C, int H,
                     int W, int max_batch) {
    memset(s, 0, sizeof *s);
    if (C < 1 || H < 1 || W < 1 || max_batch < 1)
        return dc_fail("sampler: bad shape C=%d H=%d W=%d max_batch=%d", C, H, W, max_batch);
    if (opt->ctx_len < 1 || opt->ctx_dim < 1)
        return dc_fail("sampler: text embeddings of %d x %d", opt->ctx_len, opt->ctx_dim);
    if (!(opt->cfg_scale == opt->cfg_scale)) return dc_fail("sampler: guidance scale is NaN");
    bool cfg = opt->cfg_scale != 1.0f;
    if (cfg && !opt->null_ctx.p)
        return dc_fail("sampler: guidance needs the unconditional (negative prompt) embedding");
    s->be = be;
    s->opt = *opt;
    s->C = C, s->H = H, s->W = W, s->max_batch = max_batch;
    s->cfg = cfg;
    dc_sd_sched_cfg def;
    if (dc_sd_schedule_init_cfg(&s->sched, sched_of(opt, &def), opt->kind != DC_KS_DDIM)) return -1;
    int rc = 0;
    if (opt->steps < 1 || opt->steps > s->sched.T)
        rc = dc_fail("sampler: %d steps outside [1, %d]", opt->steps, s->sched.T);
    if (!rc && !(s->plan = malloc(sizeof(dc_kstep) * opt->steps)))
        rc = dc_fail("sampler: out of host memory");
    if (!rc) rc = dc_ksampler_plan(&s->sched, opt, s->plan, &s->init_sigma);
    size_t img = (size_t)C * H * W, rows = (size_t)(cfg ? 2 : 1) * max_batch;
    if (!rc) rc = dc_buf_alloc(be, &s->xin, DC_F32, rows * img, "model input");
    if (!rc) rc = dc_buf_alloc(be, &s->out, DC_F32, rows * img, "model output");
    if (!rc && cfg) rc = dc_buf_alloc(be, &s->comb, DC_F32, max_batch * img, "guided output");
    if (!rc) rc = dc_buf_alloc(be, &s->den, DC_F32, max_batch * img, "denoised");
    if (!rc && opt->kind == DC_KS_DPMPP_2M)
        rc = dc_buf_alloc(be, &s->old, DC_F32, max_batch * img, "previous denoised");
    if (!rc) rc = dc_buf_alloc(be, &s->z, DC_F32, max_batch * img, "noise");
    if (!rc) rc = dc_buf_alloc(be, &s->t, DC_F32, rows, "timesteps");
    if (!rc)
        rc = dc_buf_alloc(be, &s->ctx, opt->null_ctx.p ? opt->null_ctx.dt : DC_F32,
                       rows * opt->ctx_len * (size_t)opt->ctx_dim, "text embeddings");
    if (!rc) {
        s->t_host = malloc(sizeof(float) * rows);
        s->ca = malloc(sizeof(float) * max_batch);
        s->cb = malloc(sizeof(float) * max_batch);
        if (!s->t_host || !s->ca || !s->cb) rc = dc_fail("sampler: out of host memory");
    }
    s->cond = (dc_cond){.ctx = s->ctx, .len = opt->ctx_len, .dim = opt->ctx_dim};
    if (rc) dc_ksampler_free(s);
    return rc;
}

// out = a p + b q for B samples of n elements (out may alias p or q).
static void lin(dc_ksampler *s, dc_buf out, dc_buf p, dc_buf q, double a, double b, int B,
                int64_t n) {
    for (int i = 0; i < B; i++) s->ca[i] = (float)a, s->cb[i] = (float)b;
    s->be->q_sample(s->be, out, p, q, s->ca, s->cb, B, n);
}

// The model's part of a step: it reads s->xin's first B rows, s->t and s->cond
// and writes s->out and (guidance) s->comb, fixed buffers all, so a backend
// can record it once and replay it.
typedef struct {
    dc_ksampler *s;
    int B;
    dc_eval_fn eval;
    void *ctx;
} model_call;

static int run_model(void *arg) {
    const model_call *mc = arg;
    dc_ksampler *s = mc->s;
    dc_backend *be = s->be;
    int64_t HW = (int64_t)s->H * s->W, bn = (int64_t)mc->B * s->C * HW;
    if (!s->cfg) return mc->eval(mc->ctx, s->out, s->xin, s->t, &s->cond, mc->B);
    be->copy(be, dc_buf_at(s->xin, bn).p, s->xin.p, sizeof(float) * (size_t)bn);
    dc_cond cond = s->cond;
    cond.pairs = mc->B;  // both halves read the same x and t (see dc_cond)
    DC_TRY(mc->eval(mc->ctx, s->out, s->xin, s->t, &cond, 2 * mc->B));
    be->cfg_combine(be, s->comb, s->out, mc->B, s->C, HW, s->C, s->opt.cfg_scale);
    return 0;
}

static int run_steps(dc_ksampler *s, dc_buf x, const uint32_t *idx, int B, dc_eval_fn eval, void *ctx,
                     dc_sample_progress_fn progress, void *pctx);

int dc_ksampler_run(dc_ksampler *s, dc_buf x, const dc_cond *cond, const uint32_t *idx, int B,
                    dc_eval_fn eval, dc_prepare_fn prepare, void *ctx, dc_sample_progress_fn progress,
                    void *pctx) {
    if (B < 1 || B > s->max_batch)
        return dc_fail("sampler: batch %d outside [1, %d]", B, s->max_batch);
    DC_TRY(dc_stage_text_cond(s->be, s->ctx, cond, s->opt.null_ctx, s->opt.ctx_len, s->opt.ctx_dim, B, s->cfg));
    int rc = prepare ? prepare(ctx, &s->cond, s->cfg ? 2 * B : B) : 0;
    if (!rc) rc = run_steps(s, x, idx, B, eval, ctx, progress, pctx);
    if (prepare) prepare(ctx, NULL, 0);  // the run is over: what was prepared is forgotten
    return rc;
}

static int run_steps(dc_ksampler *s, dc_buf x, const uint32_t *idx, int B, dc_eval_fn eval, void *ctx,
                     dc_sample_progress_fn progress, void *pctx) {
    dc_backend *be = s->be;
    int64_t HW = (int64_t)s->H * s->W, n = (int64_t)s->C * HW, bn = (int64_t)B * n;
    int total = s->opt.steps;
    // A graph from an earlier run is replayed from the first step when it was
    // recorded at this batch size and the backend has freed no buffer since
    // (the model's and the backend's buffers are the same then); else it is
    // recorded afresh.
    if (s->graph && (s->graph_B != B || !be->graph_valid || !be->graph_valid(be, s->graph)))
        be->graph_free(be, s->graph), s->graph = NULL;
    s->graph_B = B;
    model_call mc = {s, B, eval, ctx};

    const int first = s->opt.skip;
    if (first > 0) {  // img2img: clean latents in x get the noise of step `first`
        const dc_kstep *p = &s->plan[first];
        be->randn(be, s->z, idx, B, n, s->opt.seed, DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START);
        double a = 1, b = p->sigma;  // k-samplers: x + sigma z
        if (s->opt.kind == DC_KS_DDIM)  // sqrt(acp) x + sqrt(1 - acp) z (acp may be 0: sigma inf)
            a = 1 / sqrt(1 + p->sigma * p->sigma), b = sqrt(1 - a * a);
        lin(s, x, x, s->z, a, b, B, n);
    } else {
        if (!s->opt.x_given)
            be->randn(be, x, idx, B, n, s->opt.seed, DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START);
        if (s->init_sigma != 1) lin(s, x, x, x, s->init_sigma, 0, B, n);
    }

    for (int i = first; i < total; i++) {
        const dc_kstep *p = &s->plan[i];
        int rows = s->cfg ? 2 * B : B;
        for (int r = 0; r < rows; r++) s->t_host[r] = (float)p->t;
        be->upload(be, s->t.p, s->t_host, sizeof(float) * (size_t)rows);
        lin(s, s->xin, x, x, p->c_in, 0, B, n);
        if (dc_sample_step_recorded(be, &s->graph, s->opt.graph, i == first, run_model, &mc) != 0) return dc_fail_ctx("sampling step %d of %d", i + 1, total);
        dc_buf mo = s->cfg ? s->comb : s->out;
        lin(s, s->den, x, mo, p->dx, p->de, B, n);
        lin(s, x, x, s->den, p->ax, p->ad, B, n);
        if (p->ao != 0) be->axpy(be, x, s->old, (float)p->ao, bn);
        if (p->noise) {
            be->randn(be, s->z, idx, B, n, s->opt.seed, (uint32_t)i, DC_STREAM_NOISE);
            be->axpy(be, x, s->z, (float)p->an, bn);
        }
        if (s->opt.kind == DC_KS_DPMPP_2M) {  // this step's denoised is the next one's old
            dc_buf t = s->old;
            s->old = s->den, s->den = t;
        }
        if (dc_backend_status(be)) return dc_fail_ctx("sampling step %d of %d", i + 1, total);
        if (progress) progress(pctx, i + 1 - first, total - first);
    }
    return dc_backend_status(be);
}
