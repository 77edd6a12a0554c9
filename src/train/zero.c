#include "train/zero.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/params_io.h"

// Shard slices start on 64-element boundaries (256 bytes of fp32), which
// keeps every slice that a collective or a vector kernel touches aligned.
#define ZERO_ALIGN 64

// Lays the units out over `size` ranks (into u when not NULL): returns the
// elements of a shard buffer; *bucket: size x the widest unit slice.
static int64_t layout(const dc_params *ps, int size, int rank, dc_zero_unit *u, int64_t *bucket) {
    int64_t slot = 0, widest = 0;
    for (int i = 0; i < dc_params_unit_count(ps); i++) {
        int64_t lo, hi;
        dc_params_unit_range(ps, i, &lo, &hi);
        dc_shard sh = dc_shard_of(hi - lo, size, rank, ZERO_ALIGN);
        if (u) u[i] = (dc_zero_unit){lo, hi - lo, sh, slot};
        slot += sh.per;
        widest = sh.per > widest ? sh.per : widest;
    }
    *bucket = widest * size;
    return slot;
}

int dc_zero_mem_of(const dc_params *ps, int size, int stage, dc_dtype compute, dc_dtype wire, dc_zero_mem *out) {
    if (size < 1) return dc_fail("%d ranks: at least one is needed", size);
    if (stage < 0 || stage > 2) return dc_fail("--zero %d: the stages are 0, 1 and 2", stage);
    DC_TRY(dc_comm_sum_dtype_check(wire));
    int64_t P = ps->numel, bucket, S = layout(ps, size, 0, NULL, &bucket);
    int64_t wc = compute != DC_F32 ? P * (int64_t)dc_dtype_size(compute) : 0;
    const bool bf16 = wire == DC_BF16 && size > 1;  // one rank sends nothing: no bf16 copies
    const int64_t nb = stage == 2 ? DC_ZERO_RING : 1;  // buckets' room
    if (stage == 0) *out = (dc_zero_mem){4 * P + (bf16 ? 2 * P : 0), 4 * P, 8 * P, 4 * P, wc};
    // stage 1: the full gradient, its reduced shard and one bucket; stage 2: the shard and the ring
    else *out = (dc_zero_mem){(stage == 1 ? 4 * P : 0) + 4 * S + nb * 4 * bucket + (bf16 ? nb * 2 * bucket : 0),
                              4 * S, 8 * S, 4 * S, wc + 4 * P};
    return 0;
}

// The compute copy the model reads: the low-precision one, or the fp32 data.
static dc_buf compute_copy(const dc_params *ps) { return ps->wc.p ? ps->wc : ps->data; }

// Reduce-scatters the unit gradients at element `at` of the ring (size x per
// elements): this rank's slice is summed over ranks into `out` (NULL: where
// it lies there). With bf16 on the wire the caller has cast them into wbuf,
// which is what is summed, in place.
static int reduce_scatter_at(dc_zero *z, int64_t at, int64_t per, float *out) {
    const int64_t mine = at + (int64_t)z->comm->rank * per;
    if (z->wire == DC_BF16)
        return dc_comm_reduce_scatter_sum_typed(z->comm, dc_buf_at(z->wbuf, mine).p, dc_buf_at(z->wbuf, at).p, per,
                                                DC_BF16);
    return dc_comm_reduce_scatter_sum(z->comm, out ? out : (float *)dc_buf_at(z->buf, mine).p,
                                      (const float *)dc_buf_at(z->buf, at).p, per);
}

// Settles the oldest unit in flight, once the reduce-scatter that wrote its
// slice is done: added to the gradient shard (a bf16 slice cast back into
// the fp32 ring first), or, for the unit's first slice of the step, already
// in the shard (fp32) or cast straight into it (bf16).
static int settle_oldest(dc_zero *z) {
    const dc_zero_flight f = z->flight[z->head];
    z->head = (z->head + 1) % z->units, z->inflight--;
    const dc_zero_unit *u = &z->u[f.unit];
    DC_TRY(dc_comm_wait(z->comm, f.ticket));
    const int64_t at = f.at + (int64_t)z->comm->rank * u->sh.per;
    dc_buf mine = dc_buf_at(z->buf, at), shard = dc_buf_at(z->grad, u->slot);
    if (f.direct) {
        if (z->wire == DC_BF16) z->be->cast(z->be, shard, dc_buf_at(z->wbuf, at), u->sh.per);
        return 0;
    }
    if (z->wire == DC_BF16) z->be->cast(z->be, mine, dc_buf_at(z->wbuf, at), u->sh.per);
    z->be->axpy(z->be, shard, mine, 1.0f, u->sh.per);
    return 0;
}

// Whether a unit in flight lies in the ring's [at, at + n).
static bool ring_busy(const dc_zero *z, int64_t at, int64_t n) {
    for (int k = 0; k < z->inflight; k++) {
        const dc_zero_flight *f = &z->flight[(z->head + k) % z->units];
        const int64_t len = z->u[f->unit].sh.per * z->comm->size;
        if (f->at < at + n && at < f->at + len) return true;
    }
    return false;
}

// Stage 2's gradient path, called by the model's backward around each unit:
// before, the unit's gradients are pointed into a zeroed stretch of the ring
// (after the last unit's, or from its start when they do not fit before its
// end; units still in flight there are settled first, oldest first); after,
// the stretch is reduce-scattered in place (this rank's slice is summed over
// ranks where it lies), beside the next units' backward where the
// communicator overlaps, and the slice is added to the gradient shard before
// the room is reused, so micro-batches accumulate there (each unit's slices
// in micro-batch order, as with one bucket). A unit's first slice of the step
// goes straight into the shard instead (0 + x is x: the same bits), which
// saves a pass over it and the shard's zeroing.
static int unit_hook(void *ctx, int unit, bool done) {
    dc_zero *z = ctx;
    dc_param_hooks *hk = &z->base.hooks;
    dc_backend *be = z->be;
    if (unit < 0 || unit >= z->units)
        return dc_fail("the model reported gradients of unit %d, but its parameters have %d", unit, z->units);
    const dc_zero_unit *u = &z->u[unit];
    const int64_t per = u->sh.per, n = per * z->comm->size;
    if (!done) {
        const int64_t at = z->pos + n <= z->room ? z->pos : 0;
        // (the queue has as many places as there are units, and with several
        // micro-batches more entries than that could fit in the ring)
        while (z->inflight == z->units || (z->inflight && ring_busy(z, at, n))) DC_TRY(settle_oldest(z));
        be->zero(be, dc_buf_at(z->buf, at).p, (size_t)n * sizeof(float));
        z->at = at;
        hk->win = dc_buf_at(z->buf, at), hk->win_lo = u->lo, hk->win_hi = u->lo + u->len;
        return 0;
    }
    hk->win_lo = hk->win_hi = 0;
    const int64_t at = z->at;
    if (z->wire == DC_BF16) be->cast(be, dc_buf_at(z->wbuf, at), dc_buf_at(z->buf, at), n);
    DC_TRY(dc_backend_status(be));
    const bool direct = z->fresh[unit];
    z->fresh[unit] = false;
    // folding: a later micro-batch's slices continue the shard's sum in rank order
    if (!direct && z->folds)
        return dc_comm_reduce_scatter_add(z->comm, (float *)dc_buf_at(z->grad, u->slot).p,
                                          (const float *)dc_buf_at(z->buf, at).p, per);
    dc_comm_set_async(z->comm, true);
    int rc = reduce_scatter_at(z, at, per, direct ? (float *)dc_buf_at(z->grad, u->slot).p : NULL);
    dc_comm_set_async(z->comm, false);
    DC_TRY(rc);
    z->flight[(z->head + z->inflight++) % z->units] = (dc_zero_flight){unit, at, dc_comm_issued(z->comm), direct};
    z->pos = at + n;
    return 0;
}

// This rank's shard of a full [numel] F32 buffer on the backend into state.
static void take(dc_zero *z, dc_buf state, dc_buf full) {
    for (int i = 0; i < z->units; i++) {
        const dc_zero_unit *u = &z->u[i];
        if (u->sh.count)
            z->be->copy(z->be, dc_buf_at(state, u->slot).p, dc_buf_at(full, u->lo + u->sh.begin).p,
                        (size_t)u->sh.count * sizeof(float));
    }
}

static dc_buf alloc_zeroed(dc_backend *be, int64_t n, dc_dtype dt, int *ok) {
    size_t bytes = (size_t)(n > 0 ? n : 1) * dc_dtype_size(dt);
    dc_buf b = {be->alloc(be, bytes), dt};
    if (b.p) be->zero(be, b.p, bytes);
    else *ok = 0;
    return b;
}
static dc_buf alloc_f32(dc_backend *be, int64_t n, int *ok) { return alloc_zeroed(be, n, DC_F32, ok); }

static int init(dc_zero *z, dc_params *ps, dc_comm *comm, int stage, dc_dtype wire, dc_buf ema, dc_buf m,
                dc_buf v) {
    if (stage < 1 || stage > 2) return dc_fail("ZeRO stage %d: the sharded stages are 1 and 2", stage);
    DC_TRY(dc_comm_sum_dtype_check(wire));
    if (stage == 2 && dc_params_unit_count(ps) < 2)
        return dc_fail("ZeRO stage 2 needs a model whose backward hands over its gradients block by block; "
                       "this one does not (use --zero 1)");
    dc_backend *be = ps->be;
    z->stage = stage, z->comm = comm, z->be = be, z->ps = ps;
    z->wire = comm->size > 1 ? wire : DC_F32;  // one rank sends nothing: nothing to round
    z->folds = z->wire == DC_F32 && dc_comm_continues_sums(comm);
    z->units = dc_params_unit_count(ps);
    z->u = calloc((size_t)z->units, sizeof *z->u);
    z->fresh = calloc((size_t)z->units, sizeof *z->fresh);
    z->flight = calloc((size_t)z->units, sizeof *z->flight);
    if (!z->u || !z->fresh || !z->flight) return dc_fail("out of memory");
    z->shard = layout(ps, comm->size, comm->rank, z->u, &z->bucket);
    int ok = 1;
    z->master = alloc_f32(be, z->shard, &ok), z->m = alloc_f32(be, z->shard, &ok);
    z->v = alloc_f32(be, z->shard, &ok), z->ema = alloc_f32(be, z->shard, &ok);
    z->room = (stage == 2 ? DC_ZERO_RING : 1) * z->bucket;
    z->grad = alloc_f32(be, z->shard, &ok), z->buf = alloc_f32(be, z->room, &ok);
    if (z->wire == DC_BF16) z->wbuf = alloc_zeroed(be, z->room, DC_BF16, &ok);
    z->norms = alloc_f32(be, comm->size, &ok), z->local = alloc_f32(be, 2, &ok);
    if (!ok) return dc_fail_ctx("the ZeRO-%d shards (%.1f MiB)", stage, (double)z->shard * 5 * 4 / 1048576.0);
    take(z, z->master, ps->data);
    take(z, z->ema, ema);
    take(z, z->m, m);
    take(z, z->v, v);
    if (stage == 2) {  // the full gradient buffer gives way to the bucket and the shard
        be->free(be, ps->grad.p);
        ps->grad = dc_buf_none();
        z->base.hooks.unit = unit_hook;
        dc_optimizer_install(&z->base);
    }
    return dc_backend_status(be);
}

static void zero_free(dc_optimizer *o) {
    dc_zero *z = (dc_zero *)o;
    dc_buf *bufs[] = {&z->master, &z->m, &z->v, &z->ema, &z->grad, &z->buf, &z->wbuf, &z->norms, &z->local};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->p) z->be->free(z->be, bufs[i]->p);
    free(z->u), free(z->fresh), free(z->flight);
}

// The gradient shard needs no zeroing: stage 1's first reduce writes every
// unit's part of it, stage 2's first slice of each unit does (unit_hook).
static int zero_begin_step(dc_optimizer *o) {
    dc_zero *z = (dc_zero *)o;
    z->reduced = 0;
    if (z->stage == 2)
        for (int i = 0; i < z->units; i++) z->fresh[i] = true;
    else
        z->be->zero(z->be, z->ps->grad.p, (size_t)z->ps->numel * sizeof(float));
    return 0;
}

static int zero_micro_end(dc_optimizer *o, int round) {
    dc_zero *z = (dc_zero *)o;
    const bool last = round == o->step.rounds - 1;
    if (z->stage == 2) {  // the slices still in flight, oldest first
        if (!last) return 0;
        while (z->inflight) DC_TRY(settle_oldest(z));
        for (int i = 0; i < z->units; i++)  // a unit the backward never handed over has no gradient
            if (z->fresh[i])
                z->be->zero(z->be, dc_buf_at(z->grad, z->u[i].slot).p, (size_t)z->u[i].sh.per * sizeof(float));
        return 0;
    }
    // stage 1: the full gradient reduce-scattered unit by unit, after every
    // micro-batch where the sums fold (into the shard's running sum after the
    // first), else once, after the last
    if (!last && !z->folds) return 0;
    dc_backend *be = z->be;
    const int size = z->comm->size, rank = z->comm->rank;
    const bool add = z->reduced++ > 0;
    for (int i = 0; i < z->units; i++) {
        const dc_zero_unit *u = &z->u[i];
        const int64_t per = u->sh.per;
        if (z->wire == DC_BF16) {  // the unit cast straight into the wire bucket, padded, and this rank's slice back
            be->cast(be, z->wbuf, dc_buf_at(z->ps->grad, u->lo), u->len);
            be->zero(be, dc_buf_at(z->wbuf, u->len).p, (size_t)(per * size - u->len) * sizeof(uint16_t));
            DC_TRY(dc_backend_status(be));
            DC_TRY(reduce_scatter_at(z, 0, per, NULL));
            be->cast(be, dc_buf_at(z->grad, u->slot), dc_buf_at(z->wbuf, (int64_t)rank * per), per);
            continue;
        }
        // the unit, padded with zeros to size x per: slice q goes to rank q, this
        // rank's straight into its part of the shard
        be->copy(be, z->buf.p, dc_buf_at(z->ps->grad, u->lo).p, (size_t)u->len * sizeof(float));
        be->zero(be, dc_buf_at(z->buf, u->len).p, (size_t)(per * size - u->len) * sizeof(float));
        DC_TRY(dc_backend_status(be));
        float *shard = (float *)dc_buf_at(z->grad, u->slot).p;
        DC_TRY(add ? dc_comm_reduce_scatter_add(z->comm, shard, (const float *)z->buf.p, per)
                   : reduce_scatter_at(z, 0, per, shard));
    }
    // the next micro-batch's gradients start from zero
    if (!last) be->zero(be, z->ps->grad.p, (size_t)z->ps->numel * sizeof(float));
    return 0;
}

// AdamW and EMA over the trainable parameters within flat [a, b), whose
// shard copy starts at shard element `at`, in runs of adjacent trainable
// tensors (fixed ones such as pos_embed keep their values).
static void adamw_range(dc_zero *z, int64_t a, int64_t b, int64_t at, dc_buf scale, const dc_adamw_step *h) {
    const dc_params *ps = z->ps;
    dc_backend *be = z->be;
    int64_t pos = a, lo, hi;
    while (dc_params_next_run(ps, &pos, b, &lo, &hi)) {
        int64_t s = at + lo - a;
        be->adamw(be, dc_buf_at(z->master, s), dc_buf_at(z->grad, s), dc_buf_at(z->m, s), dc_buf_at(z->v, s),
                  dc_buf_at(z->ema, s), dc_buf_none(), scale, hi - lo, h);
    }
}

static int zero_finish(dc_optimizer *o, dc_buf gstats) {
    dc_zero *z = (dc_zero *)o;
    const float max_norm = o->step.clip;
    const dc_adamw_step *h = &o->step.h;
    dc_backend *be = z->be;
    dc_params *ps = z->ps;
    const int size = z->comm->size, rank = z->comm->rank;
    // |g| = sqrt(sum over ranks of |shard|^2): grad_norm over the ranks'
    // shard norms gives it, and the clipping factor, without leaving the backend.
    be->grad_norm(be, z->local, z->grad, z->shard, 0.0f);
    DC_TRY(dc_backend_status(be));
    DC_TRY(dc_comm_all_gather(z->comm, z->norms.p, z->local.p, sizeof(float)));
    be->grad_norm(be, gstats, z->norms, size, max_norm);
    // Unit by unit: AdamW and the EMA on this rank's slice, its new weights
    // cast to the compute dtype, and every rank's slices all-gathered beside
    // the next unit's AdamW (where the communicator overlaps). A unit the
    // ranks' slices tile exactly (no padding: a transformer's equal blocks) is gathered in
    // place, straight into the compute copy (this rank's slice cast to its
    // place there); another into a bucket, copied into the compute copy when
    // the bucket comes round again.
    dc_buf cc = compute_copy(ps);
    const size_t es = dc_dtype_size(cc.dt);
    int held[2] = {-1, -1};  // the unit whose gathered weights wait in each bucket
    int64_t ticket[2] = {0, 0}, in_place = 0;
    const int slots = z->room >= 2 * z->bucket ? 2 : 1;  // gathers in flight: buckets of the ring
    for (int i = 0; i < z->units + slots; i++) {
        const int j = i % slots;
        if (held[j] >= 0) {  // the bucket's last unit, gathered: into the compute copy
            const dc_zero_unit *u = &z->u[held[j]];
            DC_TRY(dc_comm_wait(z->comm, ticket[j]));
            be->copy(be, dc_buf_at(cc, u->lo).p, dc_buf_at(z->buf, j * z->bucket).p, (size_t)u->len * es);
            held[j] = -1;
        }
        if (i >= z->units) continue;
        const dc_zero_unit *u = &z->u[i];
        int64_t a = u->lo + u->sh.begin;
        adamw_range(z, a, a + u->sh.count, u->slot, dc_buf_at(gstats, 1), h);
        const bool tiled = (int64_t)size * u->sh.per == u->len;  // gathered in place
        dc_buf gb = tiled ? dc_buf_at(cc, u->lo) : (dc_buf){dc_buf_at(z->buf, j * z->bucket).p, cc.dt};
        dc_buf mine = dc_buf_at(gb, (int64_t)rank * u->sh.per);
        be->cast(be, mine, dc_buf_at(z->master, u->slot), u->sh.per);
        DC_TRY(dc_backend_status(be));
        dc_comm_set_async(z->comm, true);
        int rc = dc_comm_all_gather(z->comm, gb.p, mine.p, (size_t)u->sh.per * es);
        dc_comm_set_async(z->comm, false);
        DC_TRY(rc);
        if (tiled) in_place = dc_comm_issued(z->comm);
        else held[j] = i, ticket[j] = dc_comm_issued(z->comm);
    }
    // what reads the compute copy next waits for the gathers in place too
    if (in_place) DC_TRY(dc_comm_wait(z->comm, in_place));
    return dc_backend_status(be);
}

int dc_zero_gather(dc_zero *z, dc_buf state, float *host) {
    dc_backend *be = z->be;
    for (int i = 0; i < z->units; i++) {
        const dc_zero_unit *u = &z->u[i];
        dc_buf mine = dc_buf_at(z->buf, (int64_t)z->comm->rank * u->sh.per);
        be->copy(be, mine.p, dc_buf_at(state, u->slot).p, (size_t)u->sh.per * sizeof(float));
        DC_TRY(dc_backend_status(be));
        DC_TRY(dc_comm_all_gather(z->comm, z->buf.p, mine.p, (size_t)u->sh.per * sizeof(float)));
        if (host) be->download(be, host + u->lo, z->buf.p, (size_t)u->len * sizeof(float));
    }
    return dc_backend_status(be);
}



static int zero_save(dc_optimizer *o, float *host) {
    dc_zero *z = (dc_zero *)o;
    const int64_t np = o->ps->numel;
    const dc_buf st[DC_STATE_COUNT] = {z->master, z->ema, z->m, z->v};
    for (int b = 0; b < DC_STATE_COUNT; b++) DC_TRY(dc_zero_gather(z, st[b], host ? host + b * np : NULL));
    return 0;
}

// The file's full EMA and moments pass through one full-size buffer, and
// each rank keeps its shard; the master shard comes from the weights loaded
// into the model.
static int zero_restore(dc_optimizer *o, const dc_st_file *f) {
    dc_zero *z = (dc_zero *)o;
    dc_params *ps = o->ps;
    dc_buf full = {z->be->alloc(z->be, (size_t)ps->numel * sizeof(float)), DC_F32};
    if (!full.p) return dc_fail_ctx("restoring %s", f->path);
    // a fixed tensor the file may lack keeps the model's value, as without ZeRO
    z->be->copy(z->be, full.p, ps->data.p, (size_t)ps->numel * sizeof(float));
    int rc = dc_params_load(ps, full, f, "ema.");
    if (!rc) take(z, z->ema, full);
    if (!rc) rc = dc_ckpt_read_moment_buf(ps, f, DC_STATE_M, full);
    if (!rc) take(z, z->m, full);
    if (!rc) rc = dc_ckpt_read_moment_buf(ps, f, DC_STATE_V, full);
    if (!rc) take(z, z->v, full);
    if (!rc) take(z, z->master, ps->data);
    if (!rc) rc = dc_backend_status(z->be);
    z->be->free(z->be, full.p);
    return rc;
}

static const dc_optimizer_ops k_zero = {
    .begin_step = zero_begin_step, .micro_end = zero_micro_end, .finish = zero_finish,
    .save = zero_save, .restore = zero_restore, .free = zero_free,
};

int dc_zero_create(dc_params *ps, dc_comm *comm, int stage, dc_dtype wire, const dc_optim_plain *plain,
                   dc_optimizer **out) {
    *out = NULL;
    dc_zero *z = calloc(1, sizeof *z);
    if (!z) return dc_fail("out of memory");
    z->base = (dc_optimizer){.ops = &k_zero, .ps = ps, .be = ps->be, .hooks = {.ctx = z}};
    // the EMA's shards from the plain state's, or from the weights where it kept none (a decay of 0)
    if (init(z, ps, comm, stage, wire, plain->ema.p ? plain->ema : ps->data, plain->m, plain->v)) {
        dc_optimizer_free(&z->base);
        return -1;
    }
    *out = &z->base;
    return 0;
}
