// The sampling loop (see sampler.h): stage the condition, draw the start
// noise, then per step the model input, the model (recorded as a graph where
// the backend has graphs), guidance, and the plan's update.
#include "diffusion/sampler.h"

#include <stdlib.h>
#include <string.h>
#include "core/error.h"
#include "core/rng.h"

int dc_sample_plan_init(dc_sample_plan *p, int n) {
    memset(p, 0, sizeof *p);
    if (n < 1) return dc_fail("sampler: %d steps", n);
    if (!(p->step = calloc((size_t)n, sizeof *p->step))) return dc_fail("sampler: out of host memory");
    p->n = n;
    p->init_sigma = 1;
    return 0;
}

void dc_sample_plan_free(dc_sample_plan *p) {
    free(p->step);
    memset(p, 0, sizeof *p);
}

void dc_sampler_free(dc_sampler *s) {
    if (!s) return;
    dc_sample_plan_free(&s->plan);
    if (s->graph) s->be->graph_free(s->be, s->graph);
    dc_buf *bufs[] = {&s->xin, &s->out, &s->comb, &s->d, &s->d_prev, &s->z, &s->t, &s->y, &s->ctx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->p) s->be->free(s->be, bufs[i]->p);
    free(s->t_host);
    free(s->y_host);
    free(s->ca);
    free(s->cb);
    memset(s, 0, sizeof *s);
}

int dc_sampler_init_plan(dc_sampler *s, dc_backend *be, const dc_sample_setup *set, dc_sample_plan *plan,
                         int C, int H, int W, int OC, int max_batch) {
    memset(s, 0, sizeof *s);
    s->plan = *plan;  // ours now, whatever happens
    memset(plan, 0, sizeof *plan);
    int rc = 0;
    bool affine = false;
    for (int i = 0; i < s->plan.n; i++) affine |= s->plan.step[i].update == DC_UPDATE_AFFINE;
    if (C < 1 || H < 1 || W < 1 || max_batch < 1 || OC < C)
        rc = dc_fail("sampler: bad shape C=%d H=%d W=%d OC=%d max_batch=%d", C, H, W, OC, max_batch);
    else if (s->plan.n < 1 || s->plan.skip < 0 || s->plan.skip >= s->plan.n)
        rc = dc_fail("sampler: skipping %d of %d steps leaves none to run", s->plan.skip, s->plan.n);
    else if (affine && OC != C)
        rc = dc_fail("sampler: an affine update reads C = %d output channels, the model gives %d", C, OC);
    else if (set->guided_channels < 0 || set->guided_channels > OC)
        rc = dc_fail("sampler: guided channels %d outside [0, %d]", set->guided_channels, OC);
    else if (!(set->cfg_scale == set->cfg_scale))
        rc = dc_fail("sampler: guidance scale is NaN");
    else if (set->null_class < 0)
        rc = dc_fail("sampler: null class %d < 0", set->null_class);
    else if (set->ctx_len < 0 || (set->ctx_len > 0 && set->ctx_dim < 1))
        rc = dc_fail("sampler: text embeddings of %d x %d", set->ctx_len, set->ctx_dim);
    else if (set->ctx_len > 0 && set->guide && !set->null_ctx.p)
        rc = dc_fail("sampler: guidance on text needs the unconditional embedding (of the negative prompt)");
    if (rc) {
        dc_sample_plan_free(&s->plan);
        return rc;
    }
    s->be = be;
    s->set = *set;
    s->C = C, s->H = H, s->W = W, s->OC = OC, s->max_batch = max_batch;
    s->guided = set->guided_channels ? set->guided_channels : C;
    size_t img = (size_t)C * H * W, rows = (size_t)(set->guide ? 2 : 1) * max_batch;
    bool text = set->ctx_len > 0;
    rc = dc_buf_alloc(be, &s->xin, DC_F32, rows * img, "model input");
    if (!rc) rc = dc_buf_alloc(be, &s->out, DC_F32, rows * OC * (size_t)H * W, "model output");
    if (!rc && set->guide)
        rc = dc_buf_alloc(be, &s->comb, DC_F32, (size_t)max_batch * OC * H * W, "guided output");
    if (!rc && affine) rc = dc_buf_alloc(be, &s->d, DC_F32, max_batch * img, "denoised");
    if (!rc && s->plan.keeps_d) rc = dc_buf_alloc(be, &s->d_prev, DC_F32, max_batch * img, "previous denoised");
    if (!rc) rc = dc_buf_alloc(be, &s->z, DC_F32, max_batch * img, "noise");
    if (!rc) rc = dc_buf_alloc(be, &s->t, DC_F32, rows, "timesteps");
    if (!rc && !text) rc = dc_buf_alloc(be, &s->y, DC_I32, rows, "labels");
    if (!rc && text)
        rc = dc_buf_alloc(be, &s->ctx, set->null_ctx.p ? set->null_ctx.dt : DC_F32,
                          rows * set->ctx_len * (size_t)set->ctx_dim, "text embeddings");
    if (!rc) {
        s->t_host = malloc(sizeof(float) * rows);
        s->y_host = malloc(sizeof(int32_t) * max_batch);
        s->ca = malloc(sizeof(float) * max_batch);
        s->cb = malloc(sizeof(float) * max_batch);
        if (!s->t_host || !s->y_host || !s->ca || !s->cb) rc = dc_fail("sampler: out of host memory");
        for (int b = 0; !rc && b < max_batch; b++) s->y_host[b] = set->null_class;  // y_null = [1000] * n
    }
    s->cond = text ? (dc_cond){.ctx = s->ctx, .len = set->ctx_len, .dim = set->ctx_dim} : (dc_cond){.y = s->y};
    if (rc) dc_sampler_free(s);
    return rc;
}

// out = a p + b q for B samples of n elements (out may alias p or q).
static void lin(dc_sampler *s, dc_buf out, dc_buf p, dc_buf q, double a, double b, int B, int64_t n) {
    for (int i = 0; i < B; i++) s->ca[i] = (float)a, s->cb[i] = (float)b;
    s->be->q_sample(s->be, out, p, q, s->ca, s->cb, B, n);
}

// The model's part of one step: it reads s->xin's first B rows, s->t and
// s->cond and writes s->out (and s->comb), fixed buffers all, so a backend
// can record it once as a graph and replay it every step (the CUDA backend
// does: one launch per step).
typedef struct {
    dc_sampler *s;
    int B;
    dc_eval_fn eval;
    void *ctx;
} model_call;

static int run_model(void *arg) {
    const model_call *mc = arg;
    dc_sampler *s = mc->s;
    dc_backend *be = s->be;
    int64_t HW = (int64_t)s->H * s->W, bn = (int64_t)mc->B * s->C * HW;
    if (!s->set.guide) return mc->eval(mc->ctx, s->out, s->xin, s->t, &s->cond, mc->B);
    be->copy(be, dc_buf_at(s->xin, bn).p, s->xin.p, sizeof(float) * (size_t)bn);
    dc_cond cond = s->cond;
    if (s->set.pairs) cond.pairs = mc->B;  // both halves read the same x and t (see dc_cond)
    DC_TRY(mc->eval(mc->ctx, s->out, s->xin, s->t, &cond, 2 * mc->B));
    be->cfg_combine(be, s->comb, s->out, mc->B, s->OC, HW, s->guided, s->set.cfg_scale);
    return 0;
}

// Runs fn(arg), the model's part of a sampling step: directly where `record`
// is off, where the backend has no graphs, or on a run's first step when
// there is no graph yet (that call also warms the model's and the backend's
// caches); otherwise through *graph, recorded on the first call after that
// and replayed. The call's buffers, batch and model stay the same for the
// whole run, and for every later run that is given the same *graph.
static int step_recorded(dc_backend *be, void **graph, bool record, bool first, int (*fn)(void *), void *arg) {
    if (!record || !be->graph_capture || (first && !*graph)) return fn(arg);
    if (!*graph && !(*graph = be->graph_capture(be, fn, arg))) return -1;
    be->graph_launch(be, *graph);
    return 0;
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

// Fills s->cond's rows: the caller's B, then (guidance) B unconditional ones.
static int stage_cond(dc_sampler *s, const dc_cond *cond, int B) {
    dc_backend *be = s->be;
    if (s->set.ctx_len == 0) {
        if (!cond->y.p) return dc_fail("sampler: the model takes class labels, and none were given");
        be->copy(be, s->y.p, cond->y.p, sizeof(int32_t) * (size_t)B);
        if (s->set.guide) be->upload(be, dc_buf_at(s->y, B).p, s->y_host, sizeof(int32_t) * (size_t)B);
        return 0;
    }
    return dc_stage_text_cond(be, s->ctx, cond, s->set.null_ctx, s->set.ctx_len, s->set.ctx_dim, B,
                              s->set.guide);
}

static int run_steps(dc_sampler *s, dc_buf x, const uint32_t *idx, int B, dc_eval_fn eval, void *ctx,
                     dc_sample_progress_fn progress, void *pctx) {
    dc_backend *be = s->be;
    const dc_sample_plan *pl = &s->plan;
    int64_t HW = (int64_t)s->H * s->W, n = (int64_t)s->C * HW, bn = (int64_t)B * n;
    const int rows = s->set.guide ? 2 * B : B, total = pl->n, first = pl->skip;
    // A graph from an earlier run is replayed from the first step when it was
    // recorded at this batch size and the backend has freed no buffer since
    // (the model's and the backend's buffers are the same then); else it is
    // recorded afresh.
    if (s->graph && (s->graph_B != B || !be->graph_valid || !be->graph_valid(be, s->graph)))
        be->graph_free(be, s->graph), s->graph = NULL;
    s->graph_B = B;
    model_call mc = {s, B, eval, ctx};

    if (first > 0) {  // img2img: the clean latents in x get the noise of step `first`
        be->randn(be, s->z, idx, B, n, s->set.seed, DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START);
        lin(s, x, x, s->z, pl->start_a, pl->start_b, B, n);
    } else {
        if (!s->set.x_given)
            be->randn(be, x, idx, B, n, s->set.seed, DC_SAMPLE_START_STEP, DC_STREAM_SAMPLE_START);
        if (pl->init_sigma != 1) lin(s, x, x, x, pl->init_sigma, 0, B, n);
    }

    for (int i = first; i < total; i++) {
        const dc_sample_step *p = &pl->step[i];
        for (int r = 0; r < rows; r++) s->t_host[r] = (float)p->t;
        be->upload(be, s->t.p, s->t_host, sizeof(float) * (size_t)rows);
        lin(s, s->xin, x, x, p->c_in, 0, B, n);
        if (step_recorded(be, &s->graph, s->set.graph, i == first, run_model, &mc) != 0)
            return dc_fail_ctx("sampling step %d of %d", i + 1, total);
        dc_buf mo = s->set.guide ? s->comb : s->out;
        if (p->update == DC_UPDATE_DIT) {
            if (p->noise) be->randn(be, s->z, idx, B, n, s->set.seed, p->noise_key, DC_STREAM_NOISE);
            be->sampler_step(be, x, mo, s->z, &p->dit, B, s->C, s->OC, HW);
        } else {
            lin(s, s->d, x, mo, p->dx, p->de, B, n);
            lin(s, x, x, s->d, p->ax, p->ad, B, n);
            if (p->ao != 0) be->axpy(be, x, s->d_prev, (float)p->ao, bn);
            if (p->noise) {
                be->randn(be, s->z, idx, B, n, s->set.seed, p->noise_key, DC_STREAM_NOISE);
                be->axpy(be, x, s->z, (float)p->an, bn);
            }
            if (pl->keeps_d) {  // this step's d is the next one's d_prev
                dc_buf t = s->d_prev;
                s->d_prev = s->d, s->d = t;
            }
        }
        if (dc_backend_status(be)) return dc_fail_ctx("sampling step %d of %d", i + 1, total);
        if (progress) progress(pctx, i + 1 - first, total - first);
    }
    return dc_backend_status(be);
}

int dc_sampler_run(dc_sampler *s, dc_buf x, const dc_cond *cond, const uint32_t *idx, int B,
                   dc_eval_fn eval, dc_prepare_fn prepare, void *ctx, dc_sample_progress_fn progress,
                   void *pctx) {
    if (B < 1 || B > s->max_batch)
        return dc_fail("sampler: batch %d outside [1, %d]", B, s->max_batch);
    DC_TRY(stage_cond(s, cond, B));
    int rc = prepare ? prepare(ctx, &s->cond, s->set.guide ? 2 * B : B) : 0;
    if (!rc) rc = run_steps(s, x, idx, B, eval, ctx, progress, pctx);
    if (prepare) prepare(ctx, NULL, 0);  // the run is over: what was prepared is forgotten
    return rc;
}
