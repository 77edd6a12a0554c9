// The plans of SD's samplers (see ksampler.h for the references), run by the
// sampling loop of sampler.h.
#include "diffusion/ksampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

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
static int plan_ddim(const dc_schedule *s, const dc_ksampler_opts *opt, dc_sample_step *st) {
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
        if (acp == 0 && opt->prediction == DC_PRED_EPS) {
            rc = dc_fail("sampler: at timestep %d alphas_cumprod is 0 (rescale_betas_zero_snr in %s): an epsilon "
                         "prediction says nothing of the image there (DDIM needs a v_prediction or sample model)",
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
        dc_sample_step *p = &st[k];
        memset(p, 0, sizeof *p);
        p->noise_key = (uint32_t)k;
        p->sigma = acp > 0 ? s1 / sa : INFINITY;
        p->sigma_next = sqrt((1 - acp_prev) / acp_prev);
        p->t = t;
        p->c_in = 1;
        if (opt->prediction == DC_PRED_V) p->dx = sa, p->de = -s1;  // x0 = sqrt(acp) x - sqrt(1-acp) v
        else if (opt->prediction == DC_PRED_SAMPLE) p->dx = 0, p->de = 1;  // x0 given
        else p->dx = 1 / sa, p->de = -s1 / sa;                        // x0 = (x - sqrt(1-acp) eps) / sqrt(acp)
        p->ax = dir / s1;
        p->ad = sqrt(acp_prev) - dir * sa / s1;
        p->an = std;
        p->noise = opt->eta > 0;
    }
    free(ts), free(sig);
    return rc;
}

static int plan_k(const dc_schedule *s, const dc_ksampler_opts *opt, dc_sample_step *st,
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
        dc_sample_step *p = &st[i];
        memset(p, 0, sizeof *p);
        p->noise_key = (uint32_t)i;
        p->sigma = sg, p->sigma_next = sn;
        p->t = ts[i];
        p->c_in = 1 / sqrt(sg * sg + 1);
        if (opt->prediction == DC_PRED_V) p->dx = 1 / (sg * sg + 1), p->de = -sg * p->c_in;
        else if (opt->prediction == DC_PRED_SAMPLE) p->dx = 0, p->de = 1;  // denoised given
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

int dc_ksampler_plan(const dc_schedule *s, const dc_ksampler_opts *opt, dc_sample_step *steps,
                     double *init_sigma) {
    if (opt->steps < 1 || opt->steps > s->T)
        return dc_fail("sampler: %d steps outside [1, %d]", opt->steps, s->T);
    if (opt->skip < 0 || opt->skip >= opt->steps)
        return dc_fail("sampler: skipping %d of %d steps leaves none to run", opt->skip, opt->steps);
    if (opt->prediction == DC_PRED_FLOW)
        return dc_fail("sampler: a flow model's velocity needs a flow schedule and its Euler sampler (diffusion/flow.h), "
                       "not %s", dc_ks_kind_name(opt->kind));
    if (opt->prediction != DC_PRED_EPS && opt->prediction != DC_PRED_V && opt->prediction != DC_PRED_SAMPLE)
        return dc_fail("sampler: unknown prediction type %d", (int)opt->prediction);
    if (opt->kind == DC_KS_DDIM) {
        if (opt->sigmas) return dc_fail("sampler: DDIM walks timesteps, not a ladder of sigmas");
        if (!(opt->eta >= 0)) return dc_fail("sampler: DDIM eta %g must be >= 0", opt->eta);
        *init_sigma = 1;
        return plan_ddim(s, opt, steps);
    }
    return plan_k(s, opt, steps, init_sigma);
}

int dc_ksampler_init(dc_sampler *s, dc_backend *be, const dc_ksampler_opts *opt, int C, int H,
                     int W, int max_batch) {
    memset(s, 0, sizeof *s);
    if (opt->ctx_len < 1 || opt->ctx_dim < 1)
        return dc_fail("sampler: text embeddings of %d x %d", opt->ctx_len, opt->ctx_dim);
    dc_sd_sched_cfg def;
    dc_schedule sched;
    DC_TRY(dc_schedule_init_cfg(&sched, sched_of(opt, &def), opt->kind != DC_KS_DDIM));
    dc_sample_plan plan = {0};
    int rc = opt->steps < 1 || opt->steps > sched.T
                 ? dc_fail("sampler: %d steps outside [1, %d]", opt->steps, sched.T)
                 : dc_sample_plan_init(&plan, opt->steps);
    if (!rc) rc = dc_ksampler_plan(&sched, opt, plan.step, &plan.init_sigma);
    if (!rc && opt->skip > 0) {  // img2img: the clean latents get the noise of step `skip`
        const dc_sample_step *p = &plan.step[opt->skip];
        plan.skip = opt->skip;
        plan.start_a = 1, plan.start_b = p->sigma;  // k-samplers: x + sigma z
        if (opt->kind == DC_KS_DDIM)  // sqrt(acp) x + sqrt(1 - acp) z (acp may be 0: sigma inf)
            plan.start_a = 1 / sqrt(1 + p->sigma * p->sigma), plan.start_b = sqrt(1 - plan.start_a * plan.start_a);
    }
    plan.keeps_d = opt->kind == DC_KS_DPMPP_2M;
    dc_schedule_free(&sched);
    if (rc) {
        dc_sample_plan_free(&plan);
        return rc;
    }
    dc_sample_setup set = {.guide = opt->cfg_scale != 1.0f, .cfg_scale = opt->cfg_scale,
                           .ctx_len = opt->ctx_len, .ctx_dim = opt->ctx_dim, .null_ctx = opt->null_ctx,
                           .pairs = true, .graph = opt->graph, .seed = opt->seed, .x_given = opt->x_given};
    return dc_sampler_init_plan(s, be, &set, &plan, C, H, W, C, max_batch);
}
