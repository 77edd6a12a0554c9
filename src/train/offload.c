#include "train/offload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/log.h"

static int64_t widest_unit(const dc_params *ps) {
    int64_t w = 0;
    for (int u = 0; u < dc_params_unit_count(ps); u++) {
        int64_t lo, hi;
        dc_params_unit_range(ps, u, &lo, &hi);
        w = hi - lo > w ? hi - lo : w;
    }
    return w;
}

int64_t dc_offload_device_bytes(const dc_params *ps) {
    return (2 * widest_unit(ps) + 2 * (int64_t)dc_params_unit_count(ps)) * (int64_t)sizeof(float);
}

// A host view of n floats for the CPU kernels (which read only .p).
static dc_buf host(float *p) { return (dc_buf){p, DC_F32}; }

// AdamW + EMA over the trainable parameters of unit u, in runs of adjacent
// trainable tensors (fixed ones such as pos_embed keep their values), with
// the CPU backend's kernel: the same arithmetic as the non-offloaded step.
static void update_unit(dc_offload *o, int u) {
    const dc_params *ps = o->ps;
    int64_t a, b;
    dc_params_unit_range(ps, u, &a, &b);
    dc_buf scale = host(&o->factor);
    int64_t pos = a, lo, hi;
    while (dc_params_next_run(ps, &pos, b, &lo, &hi))  // the backend argument only casts a compute copy: none here
        dc_cpu_adamw(NULL, host(o->master + lo), host(o->grad + lo), host(o->m + lo), host(o->v + lo),
                     host(o->ema + lo), dc_buf_none(), scale, hi - lo, &o->h);
}

// The worker: takes queued units in order, waits for each one's gradients
// to reach the host, updates it and hands it back to the main thread, which
// alone issues device work.
static void *worker(void *arg) {
    dc_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->stop && o->taken == o->ntodo) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        int u = o->todo[o->taken++];
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

// Copies the units the worker has updated since the last call up into the
// parameters' data (wait: until every queued unit is done).
static void send_updated(dc_offload *o, bool wait) {
    dc_params *ps = o->ps;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->sent < o->ndone) {
            int u = o->done[o->sent++];
            if (o->failed) continue;
            pthread_mutex_unlock(&o->mu);  // the worker goes on meanwhile
            int64_t lo, hi;
            dc_params_unit_range(ps, u, &lo, &hi);
            o->up = o->be->copy_async(o->be, dc_buf_at(ps->data, lo).p, o->master + lo,
                                      (size_t)(hi - lo) * sizeof(float), false);
            pthread_mutex_lock(&o->mu);
        }
        if (!wait || o->ndone == o->ntodo) break;
        pthread_cond_wait(&o->cv, &o->mu);
    }
    pthread_mutex_unlock(&o->mu);
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
        be->wait_ticket(be, o->down[j]);  // the bucket's last unit has reached the host
        if (o->micro == 0) be->zero(be, o->bucket[j].p, bytes);
        else be->wait_ticket(be, be->copy_async(be, o->bucket[j].p, o->grad + lo, bytes, false));
        ps->win = o->bucket[j], ps->win_lo = lo, ps->win_hi = hi;
        return dc_backend_status(be);
    }
    ps->win_lo = ps->win_hi = 0;
    // the norm that overlapped steps report, per unit on the device: a pass
    // over the host's gradients would come after the last update
    if (o->last && o->overlap) be->grad_norm(be, dc_buf_at(o->unorm, 2 * unit), o->bucket[j], hi - lo, 0.0f);
    o->down[j] = be->copy_async(be, o->grad + lo, o->bucket[j].p, bytes, true);
    o->next = 1 - j;
    if (o->last) {
        o->ticket[unit] = o->down[j];
        if (o->overlap) enqueue(o, unit);
        send_updated(o, false);
    }
    return dc_backend_status(be);
}

int dc_offload_init(dc_offload *o, dc_params *ps, dc_backend *be) {
    memset(o, 0, sizeof *o);
    if (!be->alloc_pinned || !be->copy_async || !be->host_wait || !be->wait_ticket)
        return dc_fail("--offload: the %s backend cannot copy beside its ops", be->name);
    if (dc_params_unit_count(ps) < 2)
        return dc_fail("--offload needs a model whose backward hands over its gradients block by block; "
                       "this one does not");
    if (!ps->grad.p || ps->unit_hook) return dc_fail("--offload: the parameters' gradients are already taken");
    o->be = be, o->ps = ps, o->units = dc_params_unit_count(ps);
    o->widest = widest_unit(ps);
    const size_t bytes = (size_t)ps->numel * sizeof(float);
    float **host_bufs[] = {&o->master, &o->m, &o->v, &o->ema, &o->grad};
    for (size_t i = 0; i < sizeof host_bufs / sizeof *host_bufs; i++)
        if (!(*host_bufs[i] = be->alloc_pinned(be, bytes))) {
            dc_offload_free(o);
            return dc_fail_ctx("--offload: the host copy of the optimizer state (5 x %.1f MiB)", bytes / 1048576.0);
        }
    o->ticket = calloc((size_t)o->units, sizeof *o->ticket);
    o->unorm_host = calloc((size_t)o->units * 2, sizeof *o->unorm_host);
    o->todo = calloc((size_t)o->units, sizeof *o->todo), o->done = calloc((size_t)o->units, sizeof *o->done);
    if (!o->ticket || !o->todo || !o->done || !o->unorm_host) return dc_offload_free(o), dc_fail("out of memory");
    for (int j = 0; j < 2; j++) {
        o->bucket[j] = (dc_buf){be->alloc(be, (size_t)o->widest * sizeof(float)), DC_F32};
        if (!o->bucket[j].p) return dc_offload_free(o), dc_fail_ctx("--offload: a gradient bucket");
    }
    o->unorm = (dc_buf){be->alloc(be, (size_t)o->units * 2 * sizeof(float)), DC_F32};
    if (!o->unorm.p) return dc_offload_free(o), dc_fail_ctx("--offload: the units' gradient norms");
    be->download(be, o->master, ps->data.p, bytes);
    DC_TRY(dc_backend_status(be));
    memcpy(o->ema, o->master, bytes);  // the EMA starts as an exact copy of the weights
    memset(o->m, 0, bytes), memset(o->v, 0, bytes), memset(o->grad, 0, bytes);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, worker, o) != 0) {
        pthread_mutex_destroy(&o->mu), pthread_cond_destroy(&o->cv);
        dc_offload_free(o);
        return dc_fail("--offload: could not start the optimizer thread");
    }
    o->running = true;
    // the buckets replace the full gradient buffer
    be->free(be, ps->grad.p);
    ps->grad = dc_buf_none();
    ps->sharded_grad = true;
    ps->unit_hook = unit_hook, ps->hook_ctx = o;
    return 0;
}

void dc_offload_free(dc_offload *o) {
    if (o->running) {
        pthread_mutex_lock(&o->mu);
        o->stop = true;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
        pthread_mutex_destroy(&o->mu), pthread_cond_destroy(&o->cv);
    }
    if (o->ps && o->ps->hook_ctx == o) {
        o->ps->unit_hook = NULL, o->ps->hook_ctx = NULL;
        o->ps->win_lo = o->ps->win_hi = 0;
    }
    dc_backend *be = o->be;
    if (be) {
        be->sync(be);  // no copy still reads or writes what is freed here
        float *host_bufs[] = {o->master, o->m, o->v, o->ema, o->grad};
        for (size_t i = 0; i < sizeof host_bufs / sizeof *host_bufs; i++)
            if (host_bufs[i]) be->free_pinned(be, host_bufs[i]);
        for (int j = 0; j < 2; j++)
            if (o->bucket[j].p) be->free(be, o->bucket[j].p);
        if (o->unorm.p) be->free(be, o->unorm.p);
    }
    free(o->ticket), free(o->todo), free(o->done), free(o->unorm_host);
    memset(o, 0, sizeof *o);
}

void dc_offload_micro(dc_offload *o, int micro, bool last, bool overlap, const dc_adamw_step *h) {
    o->micro = micro, o->last = last, o->overlap = last && overlap;
    if (!last) return;
    o->h = *h;
    o->factor = 1.0f;
    pthread_mutex_lock(&o->mu);
    o->ntodo = o->taken = o->ndone = o->sent = 0;
    pthread_mutex_unlock(&o->mu);
}

int dc_offload_finish(dc_offload *o, dc_buf gstats, float max_norm) {
    dc_backend *be = o->be;
    DC_TRY(dc_backend_status(be));
    float stats[2];
    if (!o->overlap) {  // clipping: the global norm of all gradients first
        for (int u = 0; u < o->units; u++)
            if (be->host_wait(be, o->ticket[u])) return dc_fail_ctx("--offload");
        dc_cpu_grad_norm(NULL, host(stats), host(o->grad), o->ps->numel, max_norm);
        o->factor = stats[1];
        for (int u = 0; u < o->units; u++) enqueue(o, u);
    } else if (o->ntodo != o->units) {  // read without the lock: only this thread queues
        return dc_fail("--offload: the model handed over the gradients of %d of its %d units", o->ntodo, o->units);
    }
    double t0 = dc_time_now();
    send_updated(o, true);
    o->wait_s += dc_time_now() - t0;
    o->steps++;
    pthread_mutex_lock(&o->mu);
    bool failed = o->failed;
    pthread_mutex_unlock(&o->mu);
    if (failed) return dc_fail("--offload: %s", o->err);
    if (o->overlap) {  // the norm only reports: the units' norms, combined in unit order
        // (the queue holds no copy up yet, so this waits for backward alone)
        be->download(be, o->unorm_host, o->unorm.p, (size_t)o->units * 2 * sizeof(float));
        DC_TRY(dc_backend_status(be));
        double ss = 0.0;
        for (int u = 0; u < o->units; u++) ss += (double)o->unorm_host[2 * u] * o->unorm_host[2 * u];
        stats[0] = (float)sqrt(ss);
        stats[1] = dc_clip_factor(sqrt(ss), max_norm);
    }
    // the next forward reads the new weights: the queue waits for the last copy up
    be->wait_ticket(be, o->up);
    dc_params_touch(o->ps);
    dc_params_refresh(o->ps);
    be->upload(be, gstats.p, stats, sizeof stats);
    return dc_backend_status(be);
}
