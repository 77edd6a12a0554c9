#include "diffusion/gaussian.h"

#include <string.h>
#include "core/error.h"

int dc_schedule_plan(const dc_schedule *s, dc_step_kind kind, double eta, bool learn_sigma,
                     dc_sample_plan *plan) {
    if (!s->betas) return dc_fail("sampler: DiT's DDPM and DDIM run on a schedule made from betas");
    DC_TRY(dc_sample_plan_init(plan, s->n));
    for (int i = 0; i < s->n; i++) {
        int k = s->n - 1 - i;
        dc_sample_step *p = &plan->step[i];
        if (dc_schedule_step_coef(s, k, kind, eta, learn_sigma, &p->dit) != 0) {
            dc_sample_plan_free(plan);
            return -1;
        }
        p->update = DC_UPDATE_DIT;
        p->t = s->timestep[k];
        p->c_in = 1;
        p->sigma = s->sigmas[k];
        p->sigma_next = k > 0 ? s->sigmas[k - 1] : 0;
        p->noise = p->dit.add_noise;
        p->noise_key = (uint32_t)k;
    }
    return 0;
}

dc_gaussian_sampler_opts dc_gaussian_sampler_opts_default(void) {
    dc_gaussian_sampler_opts o;
    memset(&o, 0, sizeof o);
    o.steps = 250;
    o.kind = DC_STEP_DDPM;
    o.cfg_scale = 1.0f;
    o.learn_sigma = true;
    o.null_class = 1000;
    return o;
}

int dc_gaussian_sampler_init(dc_sampler *s, dc_backend *be, const dc_gaussian_sampler_opts *opt, int C, int H,
                        int W, int max_batch) {
    memset(s, 0, sizeof *s);
    if (opt->kind != DC_STEP_DDPM && opt->kind != DC_STEP_DDIM)
        return dc_fail("sampler: unknown sampler kind %d", (int)opt->kind);
    dc_schedule sched;
    if (dc_schedule_init_gaussian(&sched, DC_DIFFUSION_STEPS, opt->steps) != 0)
        return dc_fail_ctx("sampler: %d steps", opt->steps);
    dc_sample_plan plan;
    int rc = dc_schedule_plan(&sched, opt->kind, opt->eta, opt->learn_sigma, &plan);
    dc_schedule_free(&sched);
    if (rc) return rc;
    dc_sample_setup set = {
        .guide = opt->cfg_scale > 1.0f, .cfg_scale = opt->cfg_scale, .guided_channels = opt->guided_channels,
        .null_class = opt->null_class, .ctx_len = opt->ctx_len, .ctx_dim = opt->ctx_dim,
        .null_ctx = opt->null_ctx, .graph = true, .seed = opt->seed, .x_given = opt->x_given};
    if (opt->guided_channels > C) {  // the guided channels are eps channels
        dc_sample_plan_free(&plan);
        return dc_fail("sampler: guided channels %d outside [0, %d]", opt->guided_channels, C);
    }
    return dc_sampler_init_plan(s, be, &set, &plan, C, H, W, opt->learn_sigma ? 2 * C : C, max_batch);
}
