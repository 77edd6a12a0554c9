#include "train/plan.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm.h"
#include "train/offload.h"
#include "train/trainer.h"
#include "train/zero.h"

#define GIB 1073741824.0

int dc_parse_size(const char *s, int64_t *bytes) {
    char *end = NULL;
    errno = 0;
    double v = s && *s && !isspace((unsigned char)*s) ? strtod(s, &end) : NAN;
    if (!end || end == s || errno || !isfinite(v) || !(v > 0))
        return dc_fail("'%s' is not a memory size (a positive number and a unit: 8G, 7.5GiB, 8000M)", s ? s : "");
    static const char units[] = "KMGT";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (!u || !(end[1] == 0 || !strcmp(end + 1, "iB")))
        return dc_fail("'%s': the size needs a unit K, M, G or T (binary: G = GiB = 2^30 bytes), as in 8G or "
                       "8000MiB", s);
    double b = v * pow(1024.0, (double)(u - units + 1));
    if (b < 1 || b > 9.0e18) return dc_fail("'%s' is not a usable memory size", s);
    *bytes = (int64_t)b;
    return 0;
}

// "7.41 GiB", or "12.3 MiB" below a GiB.
static const char *size_str(int64_t b, char *buf) {
    if (b >= GIB) snprintf(buf, 32, "%.2f GiB", b / GIB);
    else snprintf(buf, 32, "%.1f MiB", b / 1048576.0);
    return buf;
}

// The images one rank trains per step (rank 0's share: the largest).
static int share_of(const dc_plan_request *r) {
    int begin, count;
    dc_batch_split(r->batch, r->ranks, 0, &begin, &count);
    return count;
}

int dc_plan_predict(const dc_plan_request *r, const dc_train_plan *p, dc_plan_mem *out) {
    const dc_model_info *mi = &r->model->info;
    if (p->micro_batch < 1 || p->micro_batch > r->batch || p->keep < 0 || p->keep > mi->blocks)
        return dc_fail("plan: micro-batch %d of %d, %d of %d blocks keeping activations", p->micro_batch,
                       r->batch, p->keep, mi->blocks);
    if (p->offload && (r->ranks > 1 || r->zero))
        return dc_fail("--offload runs on one rank for now: it cannot be combined with %s",
                       r->zero ? "--zero" : "several ranks");
    if (p->fused && (r->ranks > 1 || r->zero || p->offload || p->micro_batch != r->batch))
        return dc_fail("plan: updating in the backward runs on one rank, without --offload, with the batch in one "
                       "micro-batch");
    const dc_params *ps = r->model->params;
    const int64_t P = ps->numel, mb = p->micro_batch;
    dc_plan_mem m = {0};
    // nn/params.c: the fp32 parameters, their gradients, the compute copy
    m.weights = 4 * P + (r->compute != DC_F32 ? P * (int64_t)dc_dtype_size(r->compute) : 0);
    m.weights += dc_model_frozen_bytes(r->model, r->compute);  // a LoRA's frozen base
    const int64_t full_grad = 4 * P;
    const int64_t full_state = (r->no_ema ? 8 : 12) * P;  // AdamW's m and v, and the EMA unless its decay is 0
    // train/trainer.c: x0, xt, eps [mb, C, F, H, W], out, dout [mb, OC, F, H, W] F32, the
    // MSE objective's target [mb, C, F, H, W] (not the hybrid's), t [mb], the step's losses
    // [batch, 2] and gstats [2]; train/batch_cond.c: the labels [mb], or the text [mb, len,
    // dim] or its ids [mb, len] with their lengths [mb]
    int64_t img = dc_model_info_numel(mi), oimg = img / mi->channels * mi->out_channels;
    const int64_t cond = mi->cond == DC_COND_LABELS ? mb
                         : mi->cond == DC_COND_TEXT ? mb * ((int64_t)mi->ctx_len * mi->ctx_dim + 1)
                                                    : mb * ((int64_t)mi->ctx_len + 1);
    m.trainer = 4 * ((mi->learn_sigma ? 3 : 4) * mb * img + 2 * mb * oimg + mb + cond + 2 * (int64_t)r->batch + 2);
    // plain training with a step of one micro-batch: the gradients in the
    // activation arena (train/trainer.h), their own buffer freed as it is reserved
    const int rounds = dc_batch_rounds(r->batch, r->ranks, p->micro_batch);
    const bool lent =
        !p->offload && !p->fused && r->zero == 0 && dc_trainer_lends(r->model, r->grads_apart, rounds, true);
    m.activations = lent ? r->model->ops->lent_bytes(r->model, r->compute, p->micro_batch, p->keep, p->selective)
                         : dc_model_activation_bytes(r->model, r->compute, p->micro_batch, p->keep, p->selective);
    m.fixed = r->fixed;
    int rc = 0;
    if (m.activations < 0) rc = dc_fail("plan: the activations of micro-batch %d", p->micro_batch);
    if (!rc && p->offload) {
        // train/offload.c: the model made with no full gradient buffer
        // (DC_GRAD_WINDOW); unit-sized buffers (gradient buckets, staging,
        // zeros) and, beside a compute copy, the fixed tensors' fp32 prefix,
        // all allocated before the fp32 data shrinks to that prefix; then
        // the EMA, unless its decay is 0
        const int64_t kept = r->compute != DC_F32 ? 4 * dc_offload_kept_data(ps) : 0;
        m.grads = dc_offload_device_bytes(ps);
        m.optimizer = r->no_ema ? 0 : full_grad;
        m.setup = m.weights + m.grads + kept + m.fixed;
        if (r->compute != DC_F32) m.weights += kept - 4 * P;
    } else if (!rc && p->fused) {
        // train/optim_plain.c: the model made with no full gradient buffer
        // (DC_GRAD_WINDOW); AdamW's state, then the unit-sized window, the
        // units' norms and the clipping statistics
        m.grads = 4 * (dc_params_widest_unit(ps) + dc_params_unit_count(ps) + 1 + 2);
        m.optimizer = full_state;
        m.setup = m.weights + m.grads + m.optimizer + m.trainer + m.fixed;
    } else if (!rc && r->zero == 0) {
        // AdamW m, v and the EMA (none at a decay of 0); with bf16 gradients between ranks, their
        // bf16 copy [P] (train/trainer.c, set with the communicator)
        const bool bf16 = r->grad_comm == DC_BF16 && r->ranks > 1;
        m.grads = full_grad + (bf16 ? 2 * P : 0), m.optimizer = full_state;
        m.setup = m.weights + m.grads + m.optimizer + m.trainer + m.fixed;
        if (lent) m.grads -= full_grad;
        // folding: the micro-batches after a rank's first take a second gradient buffer (at the first step)
        if (r->folds && rounds > 1) m.grads += full_grad;
    } else if (!rc) {
        // train/zero.c: five shard buffers (master, m, v, EMA, gradients), one
        // bucket (stage 2: a ring of DC_ZERO_RING) and with bf16 gradients
        // between ranks a bf16 copy of it, the norms; they join the full
        // state, which is then freed (and stage 2's full gradient buffer)
        dc_zero_mem z;  // stage 2's figures give the shard S (master: 4 S) and the ring (grads: 4 S + 4 ring)
        rc = dc_zero_mem_of(ps, r->ranks, 2, r->compute, DC_F32, &z);
        const int nb = r->zero == 2 ? DC_ZERO_RING : 1;
        int64_t S4 = z.master, bucket4 = (z.grads - z.master) / DC_ZERO_RING;
        int64_t buckets = nb * bucket4 + (r->grad_comm == DC_BF16 && r->ranks > 1 ? nb * bucket4 / 2 : 0);
        int64_t zallocs = 5 * S4 + buckets + 4 * (int64_t)r->ranks + 8;
        m.grads = S4 + buckets + (r->zero == 1 ? full_grad : 0);
        m.optimizer = zallocs - S4 - buckets;
        m.setup = m.weights + full_grad + full_state + m.trainer + zallocs + m.fixed;
    }
    DC_TRY(rc);
    int64_t step = m.weights + m.grads + m.optimizer + m.trainer + m.activations + m.fixed;
    m.peak = step > m.setup ? step : m.setup;
    *out = m;
    return 0;
}

double dc_plan_cost(const dc_plan_request *r, const dc_train_plan *p) {
    const int share = share_of(r), micro = (share + p->micro_batch - 1) / p->micro_batch;
    const int blocks = r->model->info.blocks;
    const double recomputed = blocks ? (double)(blocks - p->keep) / blocks : 0;
    double t = (1 + recomputed / 3) * (1 + 2.0 / p->micro_batch) / (1 + 2.0 / share) * (p->selective ? 1.03 : 1);
    // a step's forward and backward are 3 forwards' worth; clipping repeats the backward (2), or all
    if (p->fused) return t * (!r->clips ? 1.02 : r->model->info.backward_repeats ? 5.0 / 3 : 2.0);
    return p->offload ? t + 1.30 + 0.65 * (micro - 1) : t;
}

int dc_plan_choose(const dc_plan_request *r, int64_t budget, dc_train_plan *best, dc_plan_mem *best_mem,
                   dc_train_plan *runner_up) {
    const int D = r->model->info.blocks, share = share_of(r);
    if (r->batch < 1 || r->ranks < 1 || share < 1)
        return dc_fail("plan: batch %d on %d ranks", r->batch, r->ranks);
    bool may_offload = r->ranks == 1 && r->zero == 0;
    int off_lo = r->offload >= 0 ? r->offload : 0, off_hi = r->offload >= 0 ? r->offload : may_offload;
    int keep_lo = r->keep >= 0 ? r->keep : 0, keep_hi = r->keep >= 0 ? r->keep : D;
    // updating in the backward: one rank, never beside offload, the batch in one micro-batch
    const bool may_fuse = may_offload && r->offload != 1 && (r->micro_batch <= 0 || r->micro_batch == r->batch);
    if (r->fused == 1 && !may_fuse)
        return dc_fail("updating in the backward runs on one rank, without --offload, with the batch in one "
                       "micro-batch");
    int fuse_lo = r->fused >= 0 ? r->fused : 0, fuse_hi = r->fused >= 0 ? r->fused : may_fuse;
    const bool has_sel = r->model->ops->set_selective != NULL;
    if (r->selective == 1 && !has_sel) return dc_fail("a %s has no selective recompute", r->model->ops->name);
    int sel_lo = r->selective >= 0 ? r->selective : 0, sel_hi = r->selective >= 0 ? r->selective : has_sel;
    dc_train_plan none = {0}, small = {0};
    dc_plan_mem smallest = {.peak = INT64_MAX};
    double best_cost = INFINITY, second_cost = INFINITY;
    *best = none;
    if (runner_up) *runner_up = none;
    // micro-batch: the user's, or the rank's share halved down to 1
    for (int mb = r->micro_batch > 0 ? r->micro_batch : share; mb >= 1; mb = r->micro_batch > 0 ? 0 : mb / 2)
        for (int keep = keep_hi; keep >= keep_lo; keep--)
            for (int off = off_lo; off <= off_hi; off++)
                for (int fuse = fuse_lo; fuse <= fuse_hi; fuse++)
                    for (int sel = sel_lo; sel <= sel_hi; sel++) {
                        if (fuse && (off || mb != r->batch)) continue;
                        dc_train_plan p = {mb, keep, off == 1, fuse == 1, sel == 1};
                        dc_plan_mem m;
                        DC_TRY(dc_plan_predict(r, &p, &m));
                        if (m.peak < smallest.peak) smallest = m, small = p;
                        if (m.peak > budget) continue;
                        double cost = dc_plan_cost(r, &p);
                        bool better = cost < best_cost - 1e-12 || (cost < best_cost + 1e-12 && m.peak < best_mem->peak);
                        if (best->micro_batch && better) {
                            if (runner_up) *runner_up = *best;
                            second_cost = best_cost;
                        } else if (!better && cost < second_cost && runner_up) {
                            *runner_up = p, second_cost = cost;
                        }
                        if (!best->micro_batch || better) *best = p, *best_mem = m, best_cost = cost;
                    }
    if (best->micro_batch) return 0;
    char what[256];
    dc_plan_describe(r, &small, &smallest, 0, what, sizeof what);
    char b1[32], b2[32];
    return dc_fail("--max-gpu-memory %s: no training plan fits; the smallest needs %s (%s)", size_str(budget, b1),
                   size_str(smallest.peak, b2), what + strlen("plan: "));
}

void dc_plan_describe(const dc_plan_request *r, const dc_train_plan *p, const dc_plan_mem *m, int64_t budget,
                      char *buf, size_t n) {
    const int D = r->model->info.blocks;
    char rec[96];
    if (p->keep >= D) snprintf(rec, sizeof rec, "recompute off (all %d blocks keep activations)", D);
    else snprintf(rec, sizeof rec, "recompute %d (%d of %d blocks keep activations)", p->keep, p->keep, D);
    char b1[32], b2[32];
    const char *fused = !p->fused ? "" : r->clips ? ", updated in the backward (two passes: clipping)"
                                                   : ", updated in the backward";
    int k = snprintf(buf, n, "plan: micro-batch %d, %s%s, offload %s%s: predicted peak %s", p->micro_batch, rec,
                     p->selective ? ", selective recompute" : "", p->offload ? "yes" : "no", fused,
                     size_str(m->peak, b1));
    if (budget > 0 && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, " of %s", size_str(budget, b2));
}
