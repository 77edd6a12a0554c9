// Plain training (ZeRO stage 0, train/optimizer.h): the full fp32 weights,
// moments and EMA on every rank, AdamW replicated. On one rank nothing
// travels; on several the step's gradients are summed by an all-reduce:
// - folding (the CPU backend, fp32 on the wire): once a round, rank 0
//   adding the step's sum so far to its micro-batch's gradients and the
//   others following in rank order, so the sum grows by one micro-batch at
//   a time in the global batch's order, as on one rank (train/trainer.h);
// - where the communicator overlaps (NCCL): in the last round each unit as
//   soon as its backward is done, beside the backward of the units before
//   it (the units tile the parameters, so this sums all of them);
// - else once, after the last round; with --grad-comm bf16 through a bf16
//   copy of the gradients, cast back once every sum is done.
#include <stdlib.h>

#include "core/error.h"
#include "nn/params_io.h"
#include "train/optimizer.h"

static dc_optim_plain *plain_of(dc_optimizer *o) { return (dc_optim_plain *)o; }

// Folding apart: the micro-batches after the first write into gmicro.
static bool apart(const dc_optim_plain *p) { return p->fold && p->base.step.rounds > 1; }
// Folding over ranks in fp32: the sum over ranks once a round.
static bool each_round(const dc_optim_plain *p) { return p->fold && p->comm && !p->grad16.p; }

// --grad-comm bf16: the gradients [lo, hi) cast into grad16 and summed there
// over ranks (beside the backend's later work where the communicator
// overlaps); micro_end casts grad16 back once every sum is done.
static int all_reduce_bf16(dc_optim_plain *p, int64_t lo, int64_t hi) {
    dc_backend *be = p->base.be;
    dc_buf wire = dc_buf_at(p->grad16, lo);
    be->cast(be, wire, dc_buf_at(p->base.ps->grad, lo), hi - lo);
    DC_TRY(dc_backend_status(be));
    dc_comm_set_async(p->comm, true);
    int rc = dc_comm_all_reduce_sum_typed(p->comm, wire.p, hi - lo, DC_BF16);
    dc_comm_set_async(p->comm, false);
    return rc;
}

// The unit hook where the communicator overlaps: in the step's last round
// each unit's gradients are all-reduced as soon as its backward is done.
static int all_reduce_unit(void *ctx, int unit, bool done) {
    dc_optim_plain *p = ctx;
    if (!done || !p->overlap_now) return 0;
    dc_params *ps = p->base.ps;
    int64_t lo, hi;
    dc_params_unit_range(ps, unit, &lo, &hi);
    if (p->grad16.p) return all_reduce_bf16(p, lo, hi);
    DC_TRY(dc_backend_status(p->base.be));
    dc_comm_set_async(p->comm, true);
    int rc = dc_comm_all_reduce_sum(p->comm, (float *)dc_buf_at(ps->grad, lo).p, hi - lo);
    dc_comm_set_async(p->comm, false);
    return rc;
}

// ---- updating in the backward (train/optimizer.h) ----------------------------------------

// The unit hook: before unit u's backward its gradients get the zeroed
// window; after it, its norm is noted (in the pass that finds the norm, or
// the only pass) and it is updated (in the pass that updates).
static int fused_unit(void *ctx, int u, bool done) {
    dc_optim_plain *p = ctx;
    dc_optimizer *o = &p->base;
    dc_backend *be = o->be;
    dc_params *ps = o->ps;
    int64_t lo, hi;
    dc_params_unit_range(ps, u, &lo, &hi);
    if (!done) {
        be->zero(be, p->gunit.p, (size_t)(hi - lo) * sizeof(float));
        o->hooks.win = p->gunit, o->hooks.win_lo = lo, o->hooks.win_hi = hi;
        return 0;
    }
    o->hooks.win_lo = o->hooks.win_hi = 0;
    const bool clips = o->passes == 2;
    if (p->units_done >= dc_params_unit_count(ps))
        return dc_fail("the model's backward handed over more units than its %d", dc_params_unit_count(ps));
    if (!clips || p->pass == 0)  // its norm at the next place: out[1] (a 1) is the next unit's place
        be->grad_norm(be, dc_buf_at(p->unorm, p->units_done), p->gunit, hi - lo, 0.0f);
    p->units_done++;
    if (clips && p->pass == 0) return 0;
    int64_t pos = lo, off, end;
    while (dc_params_next_run(ps, &pos, hi, &off, &end))
        be->adamw(be, dc_buf_at(ps->data, off), dc_buf_at(p->gunit, off - lo), dc_buf_at(p->m, off),
                  dc_buf_at(p->v, off), dc_buf_at(p->ema, off), dc_buf_at(ps->wc, off),
                  clips ? dc_buf_at(p->stats, 1) : dc_buf_none(), end - off, &o->step.h);
    return 0;
}

static int fused_begin_step(dc_optim_plain *p) {
    dc_optimizer *o = &p->base;
    if (o->step.rounds != 1)
        return dc_fail("updating in the backward takes the step's images in one micro-batch (its gradients are "
                       "never held whole to add another's to): %d rounds", o->step.rounds);
    o->passes = o->step.clip > 0 ? 2 : 1;
    p->pass = 0;
    o->hooks.win_lo = o->hooks.win_hi = 0;  // (a failed step may have left the window set)
    return 0;
}

// After a pass: every unit must have been handed over once; the first of two
// passes leaves the global norm and clipping factor for the second.
static int fused_pass_end(dc_optim_plain *p) {
    dc_optimizer *o = &p->base;
    const int units = dc_params_unit_count(o->ps);
    if (p->units_done != units)
        return dc_fail("the model's backward handed over %d of its %d units: it cannot update in the backward",
                       p->units_done, units);
    if (o->passes == 2 && p->pass == 0) o->be->grad_norm(o->be, p->stats, p->unorm, units, o->step.clip);
    p->pass++;
    return 0;
}

static int plain_begin_step(dc_optimizer *o) {
    dc_optim_plain *p = plain_of(o);
    dc_backend *be = o->be;
    if (p->fused) return fused_begin_step(p);
    if (apart(p) && !p->gmicro.p) {  // the first step: the batch's rounds are fixed from here
        p->gmicro = (dc_buf){be->alloc(be, (size_t)o->ps->numel * sizeof(float)), DC_F32};
        if (!p->gmicro.p) return dc_fail_ctx("a second gradient buffer for the step's micro-batches");
    }
    p->overlap_now = false;
    o->hooks.win_lo = o->hooks.win_hi = 0;  // (a failed step may have left the window set)
    if (!o->ps->grad_lent) be->zero(be, o->ps->grad.p, (size_t)o->ps->numel * sizeof(float));
    return 0;
}

static int plain_micro_begin(dc_optimizer *o, int round) {
    dc_optim_plain *p = plain_of(o);
    const bool last = round == o->step.rounds - 1;
    // (a rank without images in the last round calls no hook: no overlap then)
    p->overlap_now = p->overlaps && last && o->step.last_round_full;
    p->units_done = 0;
    if (apart(p) && round > 0) {  // this micro-batch's gradients apart from the step's sum
        o->be->zero(o->be, p->gmicro.p, (size_t)o->ps->numel * sizeof(float));
        o->hooks.win = p->gmicro, o->hooks.win_lo = 0, o->hooks.win_hi = o->ps->numel;
    }
    return 0;
}

// The sum over ranks after the step's last round, where it was not summed
// each round.
static int sum_last(dc_optim_plain *p) {
    dc_backend *be = p->base.be;
    dc_params *ps = p->base.ps;
    const int64_t np = ps->numel;
    DC_TRY(dc_backend_status(be));
    if (!p->overlap_now && p->grad16.p) DC_TRY(all_reduce_bf16(p, 0, np));
    else if (!p->overlap_now) DC_TRY(dc_comm_all_reduce_sum(p->comm, (float *)ps->grad.p, np));
    // the overlapped sums, and the bf16 ones, done before AdamW reads the gradients
    if (p->overlap_now || p->grad16.p) DC_TRY(dc_comm_wait(p->comm, dc_comm_issued(p->comm)));
    if (p->grad16.p) be->cast(be, ps->grad, p->grad16, np);  // the bf16 sums back in fp32
    return 0;
}

static int plain_micro_end(dc_optimizer *o, int round) {
    dc_optim_plain *p = plain_of(o);
    dc_backend *be = o->be;
    dc_params *ps = o->ps;
    const int64_t np = ps->numel;
    if (p->fused) return fused_pass_end(p);
    const bool window = o->hooks.win_hi > 0, last = round == o->step.rounds - 1;
    o->hooks.win_lo = o->hooks.win_hi = 0;
    if (each_round(p)) {
        DC_TRY(dc_backend_status(be));
        dc_buf g = window ? p->gmicro : ps->grad;  // this micro-batch's gradients
        if (window && p->comm->rank == 0) be->axpy(be, g, ps->grad, 1.0f, np);
        DC_TRY(dc_comm_all_reduce_sum(p->comm, (float *)g.p, np));
        if (window) {  // the sum now lies in the other buffer: they trade places
            p->gmicro = ps->grad;
            ps->grad = g;
        }
        return 0;
    }
    if (window) be->axpy(be, ps->grad, p->gmicro, 1.0f, np);
    return last && p->comm ? sum_last(p) : 0;
}

static int plain_finish(dc_optimizer *o, dc_buf gstats) {
    dc_optim_plain *p = plain_of(o);
    dc_backend *be = o->be;
    dc_params *ps = o->ps;
    const int64_t np = ps->numel;
    if (p->fused) {  // updated already: the norm and factor of the units' norms
        if (o->passes == 2) be->copy(be, gstats.p, p->stats.p, 2 * sizeof(float));
        else be->grad_norm(be, gstats, p->unorm, dc_params_unit_count(ps), o->step.clip);
        return dc_backend_status(be);
    }
    // the norm and the clipping factor stay on the backend; AdamW reads the factor
    be->grad_norm(be, gstats, ps->grad, np, o->step.clip);
    // AdamW, EMA and the compute copy in one pass over each run of trainable
    // parameters (fixed ones such as pos_embed keep their EMA and compute copy).
    int64_t pos = 0, off, end;
    while (dc_params_next_run(ps, &pos, np, &off, &end))
        be->adamw(be, dc_buf_at(ps->data, off), dc_buf_at(ps->grad, off), dc_buf_at(p->m, off),
                  dc_buf_at(p->v, off), dc_buf_at(p->ema, off), dc_buf_at(ps->wc, off), dc_buf_at(gstats, 1),
                  end - off, &o->step.h);
    return dc_backend_status(be);  // a host flag: no wait
}

static int plain_save(dc_optimizer *o, float *host) {
    dc_optim_plain *p = plain_of(o);
    const int64_t np = o->ps->numel;
    const dc_buf st[DC_STATE_COUNT] = {o->ps->data, p->ema.p ? p->ema : o->ps->data, p->m, p->v};  // none: the weights
    for (int b = 0; b < DC_STATE_COUNT && host; b++)
        o->be->download(o->be, host + b * np, st[b].p, (size_t)np * sizeof(float));
    return dc_backend_status(o->be);  // a device error, not a diverged run
}

static int plain_restore(dc_optimizer *o, const dc_st_file *f) {
    dc_optim_plain *p = plain_of(o);
    if (p->ema.p) DC_TRY(dc_params_load(o->ps, p->ema, f, "ema."));  // else the weights, loaded already
    DC_TRY(dc_ckpt_read_moment_buf(o->ps, f, DC_STATE_M, p->m));
    return dc_ckpt_read_moment_buf(o->ps, f, DC_STATE_V, p->v);
}

static void plain_free(dc_optimizer *o) {
    dc_optim_plain *p = plain_of(o);
    dc_buf *bufs[] = {&p->ema, &p->m, &p->v, &p->gmicro, &p->grad16, &p->gunit, &p->unorm, &p->stats};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->p) o->be->free(o->be, bufs[i]->p);
}

static const dc_optimizer_ops k_plain = {
    .begin_step = plain_begin_step, .micro_begin = plain_micro_begin, .micro_end = plain_micro_end,
    .finish = plain_finish, .save = plain_save, .restore = plain_restore, .free = plain_free,
};

// The unit-sized window, the units' norms and the factor of updating in the
// backward; the set's full gradient buffer, if it has one, goes.
static int fused_init(dc_optim_plain *p) {
    dc_params *ps = p->base.ps;
    dc_backend *be = p->base.be;
    const int units = dc_params_unit_count(ps);
    p->fused = true;
    p->gunit = (dc_buf){be->alloc(be, (size_t)dc_params_widest_unit(ps) * sizeof(float)), DC_F32};
    p->unorm = (dc_buf){be->alloc(be, (size_t)(units + 1) * sizeof(float)), DC_F32};
    p->stats = (dc_buf){be->alloc(be, 2 * sizeof(float)), DC_F32};
    if (!p->gunit.p || !p->unorm.p || !p->stats.p) return dc_fail_ctx("a unit's gradient window");
    if (ps->grad.p) be->free(be, ps->grad.p);
    ps->grad = dc_buf_none();
    p->base.hooks.unit = fused_unit;
    return 0;
}

int dc_optim_plain_create(dc_params *ps, bool fold, bool ema, bool fused, dc_optimizer **out) {
    *out = NULL;
    if (!ps->grad.p && !fused)
        return dc_fail("the model was made with no gradient buffer: it trains through --offload or by updating in "
                       "the backward");
    if (ps->hooks) return dc_fail("the parameters' gradients are already taken");
    dc_optim_plain *p = calloc(1, sizeof *p);
    if (!p) return dc_fail("out of memory");
    dc_backend *be = ps->be;
    p->base = (dc_optimizer){.ops = &k_plain, .ps = ps, .be = be, .hooks = {.ctx = p}};
    p->fold = fold;
    const size_t bytes = (size_t)ps->numel * sizeof(float);
    dc_buf *bufs[] = {&p->m, &p->v, &p->ema};
    for (int i = 0; i < (ema ? 3 : 2); i++) {
        *bufs[i] = (dc_buf){be->alloc(be, bytes), DC_F32};
        if (!bufs[i]->p) {
            dc_optimizer_free(&p->base);
            return dc_fail("out of memory for the training state");
        }
    }
    p->base.lends = !fused;
    if (fused && fused_init(p)) {
        dc_optimizer_free(&p->base);
        return -1;
    }
    if (ema) be->copy(be, p->ema.p, ps->data.p, bytes);
    be->zero(be, p->m.p, bytes);
    be->zero(be, p->v.p, bytes);
    dc_optimizer_install(&p->base);
    *out = &p->base;
    return 0;
}

int dc_optim_plain_set_comm(dc_optimizer *o, dc_comm *comm, dc_dtype wire) {
    dc_optim_plain *p = plain_of(o);
    if (p->fused && comm->size > 1)
        return dc_fail("updating in the backward runs on one rank for now (the units' gradients are never summed "
                       "over ranks)");
    if (comm->size > 1 && wire == DC_BF16) {
        p->grad16 = (dc_buf){o->be->alloc(o->be, (size_t)o->ps->numel * dc_dtype_size(DC_BF16)), DC_BF16};
        if (!p->grad16.p) return dc_fail_ctx("the bf16 copy of the gradients for --grad-comm bf16");
    }
    p->comm = comm;
    p->overlaps = !each_round(p) && dc_comm_overlaps(comm) && dc_params_unit_count(o->ps) > 1;
    if (p->overlaps) o->hooks.unit = all_reduce_unit;
    return 0;
}
