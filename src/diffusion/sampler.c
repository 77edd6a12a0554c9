// The sampling loop. Per step k (spaced index, steps-1 down to 0):
//   with guidance: model([x; x], t, [cond; null]) -> cfg_combine -> (eps, v) of the cond half
//   without:       model(x, t, cond)
//   x <- sampler_step(x, eps, v, z_k)
// As in the official forward_with_cfg, only the conditional half is carried:
// sample.py keeps samples.chunk(2)[0], and each step rebuilds [x; x] from it.
#include "diffusion/sampler.h"

#include <stdlib.h>
#include <string.h>
#include "core/error.h"
#include "core/rng.h"

dc_sampler_opts dc_sampler_opts_default(void) {
    dc_sampler_opts o;
    memset(&o, 0, sizeof o);
    o.steps = 250;
    o.kind = DC_STEP_DDPM;
    o.cfg_scale = 1.0f;
    o.learn_sigma = true;
    o.null_class = 1000;
    return o;
}

void dc_sampler_free(dc_sampler *s) {
    if (!s) return;
    if (s->graph) s->be->graph_free(s->be, s->graph);
    dc_buf *bufs[] = {&s->xin, &s->out, &s->comb, &s->z, &s->t, &s->y, &s->ctx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->p) s->be->free(s->be, bufs[i]->p);
    free(s->t_host);
    free(s->y_host);
    dc_schedule_free(&s->sched);
    memset(s, 0, sizeof *s);
}

int dc_sampler_init(dc_sampler *s, dc_backend *be, const dc_sampler_opts *opt, int C, int H,
                    int W, int max_batch) {
    memset(s, 0, sizeof *s);
    if (C < 1 || H < 1 || W < 1 || max_batch < 1)
        return dc_fail("sampler: bad shape C=%d H=%d W=%d max_batch=%d", C, H, W, max_batch);
    if (opt->kind != DC_STEP_DDPM && opt->kind != DC_STEP_DDIM)
        return dc_fail("sampler: unknown sampler kind %d", (int)opt->kind);
    if (opt->guided_channels < 0 || opt->guided_channels > C)
        return dc_fail("sampler: guided channels %d outside [0, %d]", opt->guided_channels, C);
    if (opt->null_class < 0) return dc_fail("sampler: null class %d < 0", opt->null_class);
    if (opt->ctx_len < 0 || (opt->ctx_len > 0 && opt->ctx_dim < 1))
        return dc_fail("sampler: text embeddings of %d x %d", opt->ctx_len, opt->ctx_dim);
    if (opt->ctx_len > 0 && opt->cfg_scale > 1.0f && !opt->null_ctx.p)
        return dc_fail("sampler: guidance on text needs the unconditional embedding");
    s->be = be;
    s->opt = *opt;
    s->C = C, s->H = H, s->W = W, s->max_batch = max_batch;
    s->OC = opt->learn_sigma ? 2 * C : C;
    s->cfg = opt->cfg_scale > 1.0f;
    s->guided = opt->guided_channels ? opt->guided_channels : C;
    if (dc_schedule_init_dit(&s->sched, DC_DIFFUSION_STEPS, opt->steps) != 0)
        return dc_fail_ctx("sampler: %d steps", opt->steps);
    // Check every step's coefficients once (DDIM eta range) before any work.
    for (int k = 0; k < s->sched.n; k++) {
        dc_step_coef c;
        if (dc_schedule_step_coef(&s->sched, k, opt->kind, opt->eta, opt->learn_sigma, &c)) {
            dc_sampler_free(s);
            return -1;
        }
    }
    size_t img = (size_t)C * H * W, rows = (size_t)(s->cfg ? 2 : 1) * max_batch;
    int rc = dc_buf_alloc(be, &s->out, DC_F32, rows * s->OC * (size_t)H * W, "model output");
    if (!rc) rc = dc_buf_alloc(be, &s->z, DC_F32, (size_t)max_batch * img, "noise");
    if (!rc) rc = dc_buf_alloc(be, &s->t, DC_F32, rows, "timesteps");
    bool text = opt->ctx_len > 0;
    if (!rc && !text) rc = dc_buf_alloc(be, &s->y, DC_I32, rows, "labels");
    if (!rc && text)
        rc = dc_buf_alloc(be, &s->ctx, opt->null_ctx.p ? opt->null_ctx.dt : DC_F32,
                       rows * opt->ctx_len * (size_t)opt->ctx_dim, "text embeddings");
    if (!rc && s->cfg) rc = dc_buf_alloc(be, &s->xin, DC_F32, rows * img, "guided input");
    if (!rc && s->cfg)
        rc = dc_buf_alloc(be, &s->comb, DC_F32, (size_t)max_batch * s->OC * H * W, "guided output");
    if (!rc) {
        s->t_host = malloc(sizeof(float) * rows);
        s->y_host = malloc(sizeof(int32_t) * max_batch);
        if (!s->t_host || !s->y_host) rc = dc_fail("sampler: out of host memory");
        for (int b = 0; !rc && b < max_batch; b++) s->y_host[b] = opt->null_class;  // y_null = [1000] * n
    }
    s->cond = text ? (dc_cond){.ctx = s->ctx, .len = opt->ctx_len, .dim = opt->ctx_dim} : (dc_cond){.y = s->y};
    if (rc) dc_sampler_free(s);
    return rc;
}

// The model's part of one step: the guided input, the forward pass and the
// guidance combine. It reads x, s->t and s->cond and writes s->out (and
// s->comb), all fixed buffers, so a backend can record it once as a graph
// and replay it every step (the CUDA backend does: one launch per step).
typedef struct {
    dc_sampler *s;
    dc_buf x;
    int B;
    dc_eval_fn eval;
    void *ctx;
} model_call;

static int run_model(void *arg) {
    const model_call *mc = arg;
    dc_sampler *s = mc->s;
    dc_backend *be = s->be;
    int64_t HW = (int64_t)s->H * s->W, n = (int64_t)s->C * HW;
    if (!s->cfg) return mc->eval(mc->ctx, s->out, mc->x, s->t, &s->cond, mc->B);
    size_t xbytes = sizeof(float) * (size_t)mc->B * (size_t)n;
    be->copy(be, s->xin.p, mc->x.p, xbytes);
    be->copy(be, dc_buf_at(s->xin, (int64_t)mc->B * n).p, mc->x.p, xbytes);
    DC_TRY(mc->eval(mc->ctx, s->out, s->xin, s->t, &s->cond, 2 * mc->B));
    be->cfg_combine(be, s->comb, s->out, mc->B, s->OC, HW, s->guided, s->opt.cfg_scale);
    return 0;
}

int dc_sample_step_recorded(dc_backend *be, void **graph, bool record, bool first, int (*fn)(void *), void *arg) {
    if (!record || !be->graph_capture || (first && !*graph)) return fn(arg);
    if (!*graph && !(*graph = be->graph_capture(be, fn, arg))) return -1;
    be->graph_launch(be, *graph);
    return 0;
}

// Fills s->cond's rows: the caller's B, then (guidance) B unconditional ones.
static int stage_cond(dc_sampler *s, const dc_cond *cond, int B) {
    dc_backend *be = s->be;
    if (s->opt.ctx_len == 0) {
        if (!cond->y.p) return dc_fail("sampler: the model takes class labels, and none were given");
        be->copy(be, s->y.p, cond->y.p, sizeof(int32_t) * (size_t)B);
        if (s->cfg) be->upload(be, dc_buf_at(s->y, B).p, s->y_host, sizeof(int32_t) * (size_t)B);
        return 0;
    }
    return dc_stage_text_cond(be, s->ctx, cond, s->opt.null_ctx, s->opt.ctx_len, s->opt.ctx_dim, B,
                              s->cfg);
}

int dc_stage_text_cond(dc_backend *be, dc_buf dst, const dc_cond *cond, dc_buf null_ctx, int len,
                       int dim, int B, bool guide) {
    if (!cond->ctx.p || cond->len != len || cond->dim != dim || cond->ctx.dt != dst.dt)
        return dc_fail("sampler: the model takes text embeddings of %d x %d %s, given %d x %d %s", len,
                       dim, dc_dtype_name(dst.dt), cond->len, cond->dim,
                       cond->ctx.p ? dc_dtype_name(cond->ctx.dt) : "(none)");
    int64_t per = (int64_t)len * dim;
    size_t bytes = (size_t)per * dc_dtype_size(dst.dt);
    be->copy(be, dst.p, cond->ctx.p, bytes * (size_t)B);
    for (int b = 0; guide && b < B; b++)
        be->copy(be, dc_buf_at(dst, (int64_t)(B + b) * per).p, null_ctx.p, bytes);
    return 0;
}

int dc_sampler_run(dc_sampler *s, dc_buf x, const dc_cond *cond, const uint32_t *idx, int B,
                   dc_eval_fn eval, void *ctx, dc_sample_progress_fn progress, void *pctx) {
    if (B < 1 || B > s->max_batch)
        return dc_fail("sampler: batch %d outside [1, %d]", B, s->max_batch);
    DC_TRY(stage_cond(s, cond, B));
    dc_backend *be = s->be;
    // A graph from an earlier run may point at buffers the model has since
    // replaced (a new reserve): record afresh in every run.
    if (s->graph) be->graph_free(be, s->graph), s->graph = NULL;
    int64_t HW = (int64_t)s->H * s->W, n = (int64_t)s->C * HW;
    int rows = s->cfg ? 2 * B : B;

    if (!s->opt.x_given)
        be->randn(be, x, idx, B, n, s->opt.seed, DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START);

    int total = s->sched.n;
    for (int k = total - 1; k >= 0; k--) {
        dc_step_coef coef;
        DC_TRY(dc_schedule_step_coef(&s->sched, k, s->opt.kind, s->opt.eta, s->opt.learn_sigma,
                                     &coef));
        // _WrappedModel: the model sees the original timestep of spaced step k
        for (int r = 0; r < rows; r++) s->t_host[r] = (float)s->sched.timestep[k];
        be->upload(be, s->t.p, s->t_host, sizeof(float) * (size_t)rows);

        model_call mc = {s, x, B, eval, ctx};
        if (dc_sample_step_recorded(be, &s->graph, true, k == total - 1, run_model, &mc) != 0)
            return dc_fail_ctx("sampling step %d of %d", total - k, total);
        dc_buf mo = s->cfg ? s->comb : s->out;
        if (coef.add_noise)
            be->randn(be, s->z, idx, B, n, s->opt.seed, (uint32_t)k, DC_STREAM_NOISE);
        be->sampler_step(be, x, mo, s->z, &coef, B, s->C, s->OC, HW);
        if (dc_backend_status(be)) return dc_fail_ctx("sampling step %d of %d", total - k, total);
        if (progress) progress(pctx, total - k, total);
    }
    return dc_backend_status(be);
}
