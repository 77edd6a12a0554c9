#include "train/offload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/log.h"
#include "nn/params_io.h"

dc_offload_settings dc_offload_settings_default(void) {
    return (dc_offload_settings){.defer = true, .pace = true, .hold = 8, .device_share = 0.0};
}

int dc_offload_settings_validate(const dc_offload_settings *s) {
    if (s->hold < 0) return dc_fail("offload: the units held back must be 0 or more (got %d)", s->hold);
    if (!(s->device_share >= 0 && s->device_share <= 1))
        return dc_fail("offload: the device's share must be in [0, 1] (got %g)", s->device_share);
    return 0;
}

int dc_offload_device_units(const dc_params *ps, double device_share) {
    const double want = device_share * (double)ps->numel;
    const int n = dc_params_unit_count(ps);
    int k = 0;
    for (int64_t lo, hi; k < n; k++) {
        dc_params_unit_range(ps, k, &lo, &hi);
        if ((double)lo >= want) break;
    }
    return k;
}

// The units [lo, hi) the worker takes only when no other is queued
// (offload.h): the ones before the forward's last unit, back until they hold
// `hold` times `widest` elements; 0: none.
static void held_units(const dc_params *ps, int64_t widest, int hold, int *lo, int *hi) {
    const int n = dc_params_unit_count(ps);
    const double want = (double)hold * (double)widest;
    int u = n - 1;
    for (int64_t held = 0, a, b; u > 0 && held < want; held += b - a) dc_params_unit_range(ps, --u, &a, &b);
    *lo = u, *hi = n - 1;
}

// Sets of device state buffers: two where every unit is updated on the device.
static int state_sets(const dc_params *ps, int dev_units) {
    return dev_units == dc_params_unit_count(ps) ? 2 : 1;
}

// How many unit-sized device buffers offload allocates: two gradient
// buckets, the staging buffer and zeros, and three a state set (a unit's
// master and moments) where units are updated on the device.
static int unit_buffer_count(const dc_params *ps, int dev_units) {
    return 4 + (dev_units > 0 ? 3 * state_sets(ps, dev_units) : 0);
}

// The unit-sized device buffers o uses, into b: the buckets, the staging
// buffer and zeros, then (units updated on the device) each set's master and
// moments. Returns how many.
static int unit_buffers(dc_offload *o, dc_buf *b[10]) {
    dc_buf *all[10] = {&o->bucket[0],   &o->bucket[1],   &o->stage,       &o->zeros,       &o->state[0][0],
                       &o->state[0][1], &o->state[0][2], &o->state[1][0], &o->state[1][1], &o->state[1][2]};
    const int n = unit_buffer_count(o->ps, o->dev_units);
    memcpy(b, all, sizeof(dc_buf *) * (size_t)n);
    return n;
}

int64_t dc_offload_device_bytes_at(const dc_params *ps, double device_share) {
    // the unit-sized buffers, and two norms a unit
    const int64_t units = unit_buffer_count(ps, dc_offload_device_units(ps, device_share));
    return (units * dc_params_widest_unit(ps) + 2 * (int64_t)dc_params_unit_count(ps)) * (int64_t)sizeof(float);
}

int64_t dc_offload_kept_data(const dc_params *ps) {
    int64_t end = 0;
    for (int i = 0; i < ps->count; i++)
        if (!ps->items[i].trainable) end = ps->items[i].offset + ps->items[i].numel;
    return end;
}

// A host view of n floats for the CPU kernels (which read only .p).
static dc_buf host(float *p) { return (dc_buf){p, DC_F32}; }

// AdamW over the trainable parameters of unit u, in runs of adjacent
// trainable tensors (fixed ones such as pos_embed keep their values), with
// the CPU backend's kernel: the same arithmetic as the non-offloaded step.
// No EMA here: the device keeps it (land).
static void update_unit(dc_offload *o, int u) {
    const dc_params *ps = o->ps;
    int64_t a, b;
    dc_params_unit_range(ps, u, &a, &b);
    dc_buf scale = host(&o->factor);
    int64_t pos = a, lo, hi;
    while (dc_params_next_run(ps, &pos, b, &lo, &hi))  // the backend argument only casts a compute copy: none here
        dc_cpu_adamw(NULL, host(o->master + lo), host(o->grad + lo), host(o->m + lo), host(o->v + lo),
                     dc_buf_none(), dc_buf_none(), scale, hi - lo, &o->h);
}

// The next queued unit the worker updates (under the lock): the first one
// not held back (offload.h), else the first one; the others keep their order.
static int take_next(dc_offload *o) {
    int k = o->taken;
    while (k < o->ntodo && o->todo[k] >= o->hold_lo && o->todo[k] < o->hold_hi) k++;
    if (k == o->ntodo) k = o->taken;
    const int u = o->todo[k];
    memmove(o->todo + o->taken + 1, o->todo + o->taken, (size_t)(k - o->taken) * sizeof *o->todo);
    o->todo[o->taken++] = u;
    return u;
}

// The worker: takes queued units in order (but see take_next), waits for
// each one's gradients to reach the host, updates it and hands it back to
// the main thread, which alone issues device work.
static void *worker(void *arg) {
    dc_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->stop && o->taken == o->ntodo) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        int u = take_next(o);
        bool skip = o->failed;
        pthread_mutex_unlock(&o->mu);
        int rc = skip ? -1 : o->be->host_wait(o->be, o->ticket[u]);
        if (rc == 0) {
            double t0 = dc_time_now();
            update_unit(o, u);
            o->busy_s += dc_time_now() - t0;  // read by the main thread only between steps
        }
        pthread_mutex_lock(&o->mu);
        if (rc != 0 && !o->failed) {
            o->failed = true;
            snprintf(o->err, sizeof o->err, "%s", dc_error());
        }
        o->done[o->ndone++] = u;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static void enqueue(dc_offload *o, int u) {
    pthread_mutex_lock(&o->mu);
    o->todo[o->ntodo++] = u;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

// The weights the forward reads: the compute copy, or the fp32 data itself.
static dc_buf compute_copy(const dc_params *ps) { return ps->wc.p ? ps->wc : ps->data; }

// The backend's AdamW, EMA and cast over unit u's runs of trainable tensors
// (fixed ones keep their values), as the plain step runs it: w, g, m and v
// hold the unit from its first element, the EMA and compute copy are the
// model's.
static void unit_adamw(dc_offload *o, int u, dc_buf w, dc_buf g, dc_buf m, dc_buf v, const dc_adamw_step *h) {
    const dc_params *ps = o->ps;
    const dc_buf wc = compute_copy(ps);
    int64_t a, b, lo, hi;
    dc_params_unit_range(ps, u, &a, &b);
    int64_t pos = a;
    while (dc_params_next_run(ps, &pos, b, &lo, &hi))
        o->be->adamw(o->be, dc_buf_at(w, lo - a), dc_buf_at(g, lo - a), dc_buf_at(m, lo - a), dc_buf_at(v, lo - a),
                     dc_buf_at(o->ema, lo), dc_buf_at(wc, lo), dc_buf_none(), hi - lo, h);
}

// The staged unit into the EMA and the compute copy, once its copy up is
// done (the device's queue waits; the host does not). Over the unit's runs
// of trainable tensors, as the plain step's adamw: with lr 0 on zero
// gradients and moments it leaves the staged weights as they are, and its
// EMA and cast are the plain step's arithmetic.
static void land(dc_offload *o) {
    o->be->wait_ticket(o->be, o->up);
    unit_adamw(o, o->staged, o->stage, o->zeros, o->zeros, o->zeros, &o->keep);
    o->landed[o->staged] = true;
    o->nlanded++;
    o->staged = -1;
}

// Unit u's new weights up into the staging buffer; the unit it held lands
// first, its copy having run beside the work queued since. copy_async starts
// only once the ops queued so far are done, so the copy never overwrites
// what a landing reads. One buffer: a second would give each copy longer
// before the queue waits for it (until the unit after next comes up), at one
// more unit of device memory; with the CPU's update the slower side, the
// units come up more slowly than a unit's copy takes.
static void stage_unit(dc_offload *o, int u) {
    if (o->staged >= 0) land(o);
    int64_t lo, hi;
    dc_params_unit_range(o->ps, u, &lo, &hi);
    o->up = o->be->copy_async(o->be, o->stage.p, o->master + lo, (size_t)(hi - lo) * sizeof(float), false);
    o->staged = u;
}

// Stages the units the worker has updated since the last call; with until
// >= 0, waits until that unit is staged, and with all, until every queued
// unit is (either stops early once the worker failed and is through).
static void send_updated(dc_offload *o, int until, bool all) {
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->sent < o->ndone) {
            int u = o->done[o->sent++];
            if (o->failed) continue;
            pthread_mutex_unlock(&o->mu);  // the worker goes on meanwhile
            stage_unit(o, u);
            pthread_mutex_lock(&o->mu);
            if (u == until) goto out;
        }
        if (o->ndone == o->ntodo || (until < 0 && !all)) break;
        pthread_cond_wait(&o->cv, &o->mu);
    }
out:
    pthread_mutex_unlock(&o->mu);
}

static bool worker_failed(dc_offload *o) {
    pthread_mutex_lock(&o->mu);
    bool failed = o->failed;
    pthread_mutex_unlock(&o->mu);
    return failed;
}

// The settings dc_offload_micro armed become the update's, once the last
// update is all landed (the worker reads them until then).
static void begin_update(dc_offload *o) {
    o->h = o->next_h;
    o->overlap = o->next_overlap;
    // land's pass: zero gradients and moments make a zero update (lr 0 besides)
    o->keep = (dc_adamw_step){.lr = 0.0f, .eps = 1.0f, .bias_corr1 = 1.0f, .bias_corr2 = 1.0f, .grad_scale = 1.0f,
                              .ema_decay = o->h.ema_decay};
    o->factor = 1.0f;
    memset(o->landed, 0, (size_t)o->units * sizeof *o->landed);
    o->nlanded = 0;
    pthread_mutex_lock(&o->mu);
    o->ntodo = o->taken = o->ndone = o->sent = 0;
    pthread_mutex_unlock(&o->mu);
    o->armed = false;
}

// Unit u of the last update (u < 0: every unit) updated and landed; the
// update is over once every unit has landed.
static int settle(dc_offload *o, int u) {
    double t0 = dc_time_now();
    if (u < 0 || !o->landed[u]) {
        if (u < 0 || o->staged != u) send_updated(o, u, u < 0);
        if (worker_failed(o)) return dc_fail("--offload: %s", o->err);
        if (o->staged >= 0 && (u < 0 || o->staged == u)) land(o);
        // the device's units back on the host (their copies down)
        if (u < 0 && o->be->host_wait(o->be, o->dev_down)) return dc_fail_ctx("--offload");
        if (u >= 0 && !o->landed[u]) return dc_fail("--offload: the model's forward read unit %d, which the update "
                                                     "never reached", u);
    }
    o->wait_s += dc_time_now() - t0;
    if (o->nlanded == o->units) {
        o->pending = false;
        if (o->armed) begin_update(o);
    }
    return dc_backend_status(o->be);
}

static int drain(dc_offload *o) { return o->pending ? settle(o, -1) : 0; }

// The forward's call before it reads unit u: the last update's unit landed.
static int use_hook(void *ctx, int unit) {
    dc_offload *o = ctx;
    if (unit < 0 || unit >= o->units)
        return dc_fail("the model's forward read unit %d, but its parameters have %d", unit, o->units);
    return o->pending ? settle(o, unit) : 0;
}

// Unit u's master and moments between the host and its set of device
// buffers; the last copy's ticket.
static int64_t copy_state(dc_offload *o, int u, bool to_host) {
    int64_t lo, hi;
    dc_params_unit_range(o->ps, u, &lo, &hi);
    const size_t bytes = (size_t)(hi - lo) * sizeof(float);
    float *host[3] = {o->master, o->m, o->v};
    const dc_buf *dev = o->state[u % o->nsets];
    int64_t t = 0;
    for (int b = 0; b < 3; b++)
        t = to_host ? o->be->copy_async(o->be, host[b] + lo, dev[b].p, bytes, true)
                    : o->be->copy_async(o->be, dev[b].p, host[b] + lo, bytes, false);
    return t;
}

// A unit updated on the device (offload.h): its master and moments up into
// its set of device buffers, once the last unit of that set has been copied
// down out of them (copies up and down run on streams of their own: the
// main stream orders them).
static void state_up(dc_offload *o, int u) {
    o->be->wait_ticket(o->be, o->set_down[u % o->nsets]);
    o->dev_up = copy_state(o, u, false);
}

// The plain step's AdamW, EMA and cast for unit u on the device, from its
// gradients in `grad` and its state brought up by state_up; the new master
// and moments then go back to the host (dev_down). The unit has landed.
static void update_on_device(dc_offload *o, int u, dc_buf grad) {
    o->be->wait_ticket(o->be, o->dev_up);
    const dc_buf *st = o->state[u % o->nsets];  // master, m, v
    unit_adamw(o, u, st[0], grad, st[1], st[2], &o->h);
    o->dev_down = o->set_down[u % o->nsets] = copy_state(o, u, true);
    o->landed[u] = true;
    o->nlanded++;
}

// Called by the model's backward around each unit: before, the unit's
// gradients are pointed into a bucket holding zeros (the first micro-batch)
// or the unit's running sum (later ones); after, the bucket goes to the host
// beside the next unit's backward, and in the step's last micro-batch the
// worker updates the unit once it is there.
static int unit_hook(void *ctx, int unit, bool done) {
    dc_offload *o = ctx;
    dc_params *ps = o->ps;
    dc_backend *be = o->be;
    if (unit < 0 || unit >= o->units)
        return dc_fail("the model reported gradients of unit %d, but its parameters have %d", unit, o->units);
    int64_t lo, hi;
    dc_params_unit_range(ps, unit, &lo, &hi);
    const size_t bytes = (size_t)(hi - lo) * sizeof(float);
    const int j = o->next;
    if (!done) {
        // the host's gradients and the units' settings are the last update's until it is over
        if (o->pending) DC_TRY(drain(o));
        be->wait_ticket(be, o->down[j]);  // the bucket's last unit has reached the host
        if (o->micro == 0 || o->fold) {
            be->zero(be, o->bucket[j].p, bytes);
        } else {  // the running sum back up, once the last micro-batch's copy down has written it
            be->wait_ticket(be, o->ticket[unit]);
            be->wait_ticket(be, be->copy_async(be, o->bucket[j].p, o->grad + lo, bytes, false));
        }
        o->base.hooks.win = o->bucket[j], o->base.hooks.win_lo = lo, o->base.hooks.win_hi = hi;
        // a unit updated on the device: its state goes up beside its backward
        if (o->last && o->overlap && unit < o->dev_units) state_up(o, unit);
        return dc_backend_status(be);
    }
    o->base.hooks.win_lo = o->base.hooks.win_hi = 0;
    // folding: the step's running sum plus this micro-batch's gradients (T + g,
    // the plain trainer's addition), read where the host keeps it
    if (o->fold && o->micro > 0) be->axpy(be, o->bucket[j], host(o->grad + lo), 1.0f, hi - lo);
    // the norm that overlapped steps report, per unit on the device: a pass
    // over the host's gradients would come after the last update
    if (o->last && o->overlap) be->grad_norm(be, dc_buf_at(o->unorm, 2 * unit), o->bucket[j], hi - lo, 0.0f);
    const bool on_device = o->last && o->overlap && unit < o->dev_units;
    if (on_device) {
        update_on_device(o, unit, o->bucket[j]);
        o->down[j] = 0;  // the bucket's gradients stay here
    } else {
        o->down[j] = be->copy_async(be, o->grad + lo, o->bucket[j].p, bytes, true);
        o->ticket[unit] = o->down[j];
    }
    o->next = 1 - j;
    if (o->last) {
        if (o->overlap && !on_device) {
            enqueue(o, unit);
            // paced: the host waits until the device has the last unit's gradients
            // out, so the units the worker has updated since go up and land
            // between this backward's units rather than after all of it
            if (o->set.pace && be->host_wait(be, o->down[1 - j])) return dc_fail_ctx("--offload");
        }
        send_updated(o, -1, false);
    }
    return dc_backend_status(be);
}

// Where a compute copy exists, the fp32 data shrinks to `kept`, the prefix
// holding the fixed tensors (the forward may read those in fp32); the rest
// of the weights is the host master's.
static void keep_fixed_only(dc_offload *o, dc_buf kept) {
    dc_params *ps = o->ps;
    dc_backend *be = o->be;
    if (kept.p) be->copy(be, kept.p, ps->data.p, (size_t)dc_offload_kept_data(ps) * sizeof(float));
    be->free(be, ps->data.p);
    ps->data = kept;
    o->shrunk = true;
}

// The parameters' full fp32 data back, holding the master's weights.
static void restore_data(dc_offload *o) {
    dc_params *ps = o->ps;
    dc_backend *be = o->be;
    const size_t bytes = (size_t)ps->numel * sizeof(float);
    dc_buf full = {be->alloc(be, bytes), DC_F32};
    if (full.p) be->upload(be, full.p, o->master, bytes);
    else dc_warn("--offload: no device memory to give the model its fp32 weights back (%s)", dc_error());
    if (ps->data.p) be->free(be, ps->data.p);
    ps->data = full;
    o->shrunk = false;
    dc_params_touch(ps);
}

// Sets up o (zeroed; on failure the caller frees it).
static int init(dc_offload *o, dc_params *ps, dc_backend *be, bool fold, bool ema, const dc_offload_settings *set) {
    DC_TRY(dc_offload_settings_validate(set));
    if (fold && strcmp(be->name, "cpu") != 0)
        return dc_fail("--offload: the %s backend cannot add the host's gradient sums on the device", be->name);
    if (!be->alloc_pinned || !be->copy_async || !be->host_wait || !be->wait_ticket)
        return dc_fail("--offload: the %s backend cannot copy beside its ops", be->name);
    if (dc_params_unit_count(ps) < 2)
        return dc_fail("--offload needs a model whose backward hands over its gradients block by block; "
                       "this one does not");
    if ((!ps->grad.p && !ps->window) || ps->hooks)
        return dc_fail("--offload: the parameters' gradients are already taken");
    o->be = be, o->ps = ps, o->units = dc_params_unit_count(ps), o->fold = fold, o->set = *set;
    o->widest = dc_params_widest_unit(ps);
    held_units(ps, o->widest, set->hold, &o->hold_lo, &o->hold_hi);
    o->staged = -1;
    const size_t bytes = (size_t)ps->numel * sizeof(float), wbytes = (size_t)o->widest * sizeof(float);
    float **host_bufs[] = {&o->master, &o->m, &o->v, &o->grad};
    for (size_t i = 0; i < sizeof host_bufs / sizeof *host_bufs; i++)
        if (!(*host_bufs[i] = be->alloc_pinned(be, bytes)))
            return dc_fail_ctx("--offload: the host copy of the optimizer state (4 x %.1f MiB)", bytes / 1048576.0);
    o->ticket = calloc((size_t)o->units, sizeof *o->ticket);
    o->unorm_host = calloc((size_t)o->units * 2, sizeof *o->unorm_host);
    o->todo = calloc((size_t)o->units, sizeof *o->todo), o->done = calloc((size_t)o->units, sizeof *o->done);
    o->landed = calloc((size_t)o->units, sizeof *o->landed);
    if (!o->ticket || !o->todo || !o->done || !o->unorm_host || !o->landed)
        return dc_fail("out of memory");
    o->dev_units = dc_offload_device_units(ps, set->device_share);
    o->nsets = state_sets(ps, o->dev_units);
    dc_buf *unit_bufs[10];
    for (int i = 0, n = unit_buffers(o, unit_bufs); i < n; i++) {
        *unit_bufs[i] = (dc_buf){be->alloc(be, wbytes), DC_F32};
        if (!unit_bufs[i]->p) return dc_fail_ctx("--offload: a unit-sized device buffer");
    }
    o->unorm = (dc_buf){be->alloc(be, (size_t)o->units * 2 * sizeof(float)), DC_F32};
    if (!o->unorm.p) return dc_fail_ctx("--offload: the units' gradient norms");
    const int64_t nkept = ps->wc.p ? dc_offload_kept_data(ps) : 0;
    dc_buf kept = {nkept ? be->alloc(be, (size_t)nkept * sizeof(float)) : NULL, DC_F32};
    if (nkept && !kept.p) return dc_fail_ctx("--offload: the fixed tensors' fp32 values");
    be->zero(be, o->zeros.p, wbytes);
    be->download(be, o->master, ps->data.p, bytes);
    if (dc_backend_status(be)) {
        if (kept.p) be->free(be, kept.p);
        return -1;
    }
    memset(o->m, 0, bytes), memset(o->v, 0, bytes), memset(o->grad, 0, bytes);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, worker, o) != 0) {
        pthread_mutex_destroy(&o->mu), pthread_cond_destroy(&o->cv);
        if (kept.p) be->free(be, kept.p);
        return dc_fail("--offload: could not start the optimizer thread");
    }
    o->running = true;
    // the buckets replace the full gradient buffer, which becomes the EMA
    // (an exact copy of the weights, as the plain trainer's starts) where
    // there is one and an EMA is kept
    if (ema && ps->grad.p) {
        o->ema = ps->grad;
        be->copy(be, o->ema.p, ps->data.p, bytes);
    } else if (ps->grad.p) {
        be->free(be, ps->grad.p);
    }
    ps->grad = dc_buf_none();
    o->base.hooks.unit = unit_hook;
    if (ps->forward_uses_units) o->base.hooks.use = use_hook;
    dc_optimizer_install(&o->base);
    // the compute copy holds the weights now; from here only the updates write it
    dc_params_refresh(ps);
    if (ps->wc.p) keep_fixed_only(o, kept);
    if (ema && !o->ema.p) {  // made last, once the fp32 data has shrunk: from the master
        o->ema = (dc_buf){be->alloc(be, bytes), DC_F32};
        if (!o->ema.p) return dc_fail_ctx("--offload: the EMA (%.1f MiB)", bytes / 1048576.0);
        be->upload(be, o->ema.p, o->master, bytes);
    }
    if (dc_backend_status(be)) return -1;
    return 0;
}

static void offload_free(dc_optimizer *base) {
    dc_offload *o = (dc_offload *)base;
    if (o->pending && drain(o))
        dc_warn("--offload: the last update did not complete (%s)", dc_error());
    if (o->running) {
        pthread_mutex_lock(&o->mu);
        o->stop = true;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
        pthread_mutex_destroy(&o->mu), pthread_cond_destroy(&o->cv);
    }
    dc_backend *be = o->be;
    if (be) {
        be->sync(be);  // no copy still reads or writes what is freed here
        dc_buf *dev_bufs[12] = {&o->unorm, &o->ema};
        const int n = 2 + unit_buffers(o, dev_bufs + 2);
        for (int i = 0; i < n; i++)
            if (dev_bufs[i]->p) be->free(be, dev_bufs[i]->p);
        if (o->shrunk) restore_data(o);  // the EMA's room, freed above, takes it
        float *host_bufs[] = {o->master, o->m, o->v, o->grad};
        for (size_t i = 0; i < sizeof host_bufs / sizeof *host_bufs; i++)
            if (host_bufs[i]) be->free_pinned(be, host_bufs[i]);
    }
    free(o->ticket), free(o->todo), free(o->done), free(o->unorm_host), free(o->landed);
}

// offload's master on the host is the weights: nothing else may write them
static int offload_begin_step(dc_optimizer *base) {
    if (base->ps->stale)
        return dc_fail("--offload: the model's weights were written after the trainer took them (load them before "
                       "dc_trainer_init)");
    return 0;
}

static int offload_micro_begin(dc_optimizer *base, int round) {
    dc_offload *o = (dc_offload *)base;
    // a forward that does not announce its units reads the weights whole
    if (!o->ps->forward_uses_units) DC_TRY(drain(o));
    o->micro = round, o->last = round == base->step.rounds - 1;
    if (!o->last) return 0;
    // each unit updated as its gradients arrive, unless clipping needs them all first
    o->next_h = base->step.h, o->next_overlap = base->step.clip == 0, o->armed = true;
    if (!o->pending) begin_update(o);
    return 0;
}

// The units the worker has not started, in forward order: backward queued
// them last to first, and the next forward waits for them first to last.
static void in_forward_order(dc_offload *o) {
    pthread_mutex_lock(&o->mu);
    for (int i = o->taken + 1; i < o->ntodo; i++)  // insertion sort: a few dozen units
        for (int j = i; j > o->taken && o->todo[j - 1] > o->todo[j]; j--) {
            int t = o->todo[j];
            o->todo[j] = o->todo[j - 1], o->todo[j - 1] = t;
        }
    pthread_mutex_unlock(&o->mu);
}

static int offload_finish(dc_optimizer *base, dc_buf gstats) {
    dc_offload *o = (dc_offload *)base;
    const float max_norm = base->step.clip;
    dc_backend *be = o->be;
    DC_TRY(dc_backend_status(be));
    float stats[2];
    if (!o->overlap) {  // clipping: the global norm of all gradients first
        for (int u = 0; u < o->units; u++)
            if (be->host_wait(be, o->ticket[u])) return dc_fail_ctx("--offload");
        dc_cpu_grad_norm(NULL, host(stats), host(o->grad), o->ps->numel, max_norm);
        o->factor = stats[1];
        for (int u = 0; u < o->units; u++) enqueue(o, u);
    } else if (o->ntodo + o->dev_units != o->units) {  // read without the lock: only this thread queues
        return dc_fail("--offload: the model handed over the gradients of %d of its %d units",
                       o->ntodo + o->dev_units, o->units);
    }
    double t0 = dc_time_now();
    if (o->overlap) {  // the norm only reports: the units' norms, combined in unit order
        // (read before staging the last units: this waits for the backward and
        // the landings queued in it, not for the copies up queued after it)
        be->download(be, o->unorm_host, o->unorm.p, (size_t)o->units * 2 * sizeof(float));
        DC_TRY(dc_backend_status(be));
        double ss = 0.0;
        for (int u = 0; u < o->units; u++) ss += (double)o->unorm_host[2 * u] * o->unorm_host[2 * u];
        stats[0] = (float)sqrt(ss);
        stats[1] = dc_clip_factor(sqrt(ss), max_norm);
    }
    in_forward_order(o);
    send_updated(o, -1, false);
    o->pending = true;  // the next forward lands the rest (dc_offload_drain for anything else)
    o->wait_s += dc_time_now() - t0;
    o->steps++;
    if (worker_failed(o)) return dc_fail("--offload: %s", o->err);
    if (!o->set.defer) DC_TRY(settle(o, -1));
    be->upload(be, gstats.p, stats, sizeof stats);
    return dc_backend_status(be);
}

static int offload_drain(dc_optimizer *base) { return drain((dc_offload *)base); }

// The host copy and the device's EMA, once the last update is over.
static int offload_save(dc_optimizer *base, float *host) {
    dc_offload *o = (dc_offload *)base;
    DC_TRY(drain(o));
    if (!host) return 0;
    const int64_t np = o->ps->numel;
    // no EMA: a decay of 0, where it is the weights
    const float *st[DC_STATE_COUNT] = {o->master, o->ema.p ? NULL : o->master, o->m, o->v};
    for (int b = 0; b < DC_STATE_COUNT; b++)
        if (st[b]) memcpy(host + b * np, st[b], (size_t)np * sizeof(float));
    if (o->ema.p) o->be->download(o->be, host + DC_STATE_EMA * np, o->ema.p, (size_t)np * sizeof(float));
    return dc_backend_status(o->be);
}

// The EMA into its device buffer, as without offload; the moments straight
// into the host copy. The master is already the weights the model loaded
// (taken at init).
static int offload_restore(dc_optimizer *base, const dc_st_file *f) {
    dc_offload *o = (dc_offload *)base;
    DC_TRY(drain(o));  // no update may still write what is read in here
    if (o->ema.p) DC_TRY(dc_params_load(o->ps, o->ema, f, "ema."));  // else the weights, as the master holds them
    DC_TRY(dc_ckpt_read_moment(o->ps, f, DC_STATE_M, o->m));
    DC_TRY(dc_ckpt_read_moment(o->ps, f, DC_STATE_V, o->v));
    return dc_backend_status(o->be);
}

static const dc_optimizer_ops k_offload = {
    .begin_step = offload_begin_step, .micro_begin = offload_micro_begin, .finish = offload_finish,
    .drain = offload_drain, .save = offload_save, .restore = offload_restore, .free = offload_free,
};

int dc_offload_create(dc_params *ps, dc_backend *be, bool fold, bool ema, const dc_offload_settings *set,
                      dc_optimizer **out) {
    *out = NULL;
    dc_offload *o = calloc(1, sizeof *o);
    if (!o) return dc_fail("out of host memory for --offload");
    o->base = (dc_optimizer){.ops = &k_offload, .ps = ps, .be = be, .hooks = {.ctx = o}};
    if (init(o, ps, be, fold, ema, set)) {
        dc_optimizer_free(&o->base);
        return -1;
    }
    *out = &o->base;
    return 0;
}
