// Training checkpoints: one safetensors file holding everything a run needs
// to continue bit-exactly (see dc_trainer_save in trainer.h).
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "nn/params_io.h"
#include "train/trainer.h"

// v2: every tensor and the metadata carry checksums, and the data set's
// fingerprint is recorded; a v2 file without checksums is refused as edited.
#define CKPT_FORMAT "diffusion.c checkpoint v2"

// The first element of x[0, n) that is NaN or infinite (or negative, with
// nonneg), or -1. In parallel: a 675M-parameter model's checkpoint holds 2.7 G values.
static int64_t first_bad(const float *x, int64_t n, bool nonneg) {
    int64_t bad = INT64_MAX;
    #pragma omp parallel for reduction(min : bad)
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0)) bad = i < bad ? i : bad;
    return bad == INT64_MAX ? -1 : bad;
}

// The parameter holding flat element i, and the element's place in it.
static const dc_param *param_at(const dc_params *ps, int64_t i, int64_t *elem) {
    for (int k = 0; k < ps->count; k++)
        if (i >= ps->items[k].offset && i < ps->items[k].offset + ps->items[k].numel) {
            *elem = i - ps->items[k].offset;
            return &ps->items[k];
        }
    *elem = i;
    return &ps->items[0];  // not reached: the parameters tile the flat buffer
}

// The four flat buffers of a checkpoint, as host copies laid out back to back.
static const struct { const char *name, *prefix; bool nonneg; } k_state[DC_STATE_COUNT] = {
    {"weights", "", false}, {"EMA weights", "ema.", false},
    {"train.adam_m", NULL, false}, {"train.adam_v", NULL, true},
};

// Names the first value of buffer b (host[np]) that no checkpoint may hold.
static int check_values(const dc_params *ps, int b, const float *host, const char *file, const char *why) {
    int64_t i = first_bad(host, ps->numel, k_state[b].nonneg), e;
    if (i < 0) return 0;
    const dc_param *p = param_at(ps, i, &e);
    const char *kind = isfinite(host[i]) ? "negative (a second moment cannot be)" : "not finite";
    if (k_state[b].prefix)
        return dc_fail("%s: tensor '%s%s' element %lld is %g, %s; %s", file, k_state[b].prefix, p->name,
                       (long long)e, host[i], kind, why);
    return dc_fail("%s: tensor '%s' element %lld (parameter '%s' element %lld) is %g, %s; %s", file,
                   k_state[b].name, (long long)i, p->name, (long long)e, host[i], kind, why);
}

// One entry per parameter, named prefix + key, pointing into host[numel],
// whose values go from the storage order to PyTorch's (a channels-last
// kernel's), the order loading expects.
static int entries_of(const dc_params *ps, const char *prefix, float *host, dc_st_entry *entries,
                      char (*names)[128]) {
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        snprintf(names[i], 128, "%s%s", prefix, p->name);
        dc_st_entry *e = &entries[i];
        memset(e, 0, sizeof *e);
        e->name = names[i], e->dtype = DC_F32, e->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) e->shape[d] = p->shape[d];
        e->data = host + p->offset;
        DC_TRY(dc_param_from_stored(p, host + p->offset));
    }
    return 0;
}

int dc_trainer_save(const dc_trainer *tr, const char *path, const dc_kv *extra) {
    const dc_model *m = tr->model;
    const dc_params *ps = m->params;
    int n = ps->count, total = 2 * n + 2;
    int64_t np = ps->numel;
    // Rank 0 writes the file; the others only hand over their shards.
    if (tr->comm && tr->comm->rank != 0) return dc_optimizer_save(tr->opt, NULL);
    float *host = malloc((size_t)np * 4 * sizeof(float));
    dc_st_entry *e = calloc(total, sizeof *e);
    char (*names)[128] = calloc(2 * n, sizeof *names);
    dc_kv kv = {0};
    int rc = -1;
    if (!host || !e || !names) {
        // the others are in the gather: stop them too
        if (tr->comm) dc_comm_abort(tr->comm, "out of memory for the checkpoint on rank 0");
        dc_fail("out of memory writing %s", path);
        goto done;
    }
    if (dc_optimizer_save(tr->opt, host) || entries_of(ps, "", host, e, names) ||
        entries_of(ps, "ema.", host + np, e + n, names + n))
        goto done;
    // A checkpoint of a diverged run would only carry the damage forward.
    for (int b = 0; b < DC_STATE_COUNT; b++)
        if (check_values(ps, b, host + b * np, path,
                         "refusing to write the checkpoint: the run diverged (lower --lr or enable --grad-clip)"))
            goto done;
    e[2 * n] = (dc_st_entry){.name = "train.adam_m", .dtype = DC_F32, .ndim = 1, .shape = {np}, .data = host + 2 * np};
    e[2 * n + 1] = (dc_st_entry){.name = "train.adam_v", .dtype = DC_F32, .ndim = 1, .shape = {np}, .data = host + 3 * np};
    if (dc_kv_set(&kv, "format", CKPT_FORMAT) || dc_model_config_to_kv(m, &kv) ||
        dc_train_config_to_kv(&tr->cfg, &kv) ||
        dc_kv_set(&kv, "step", "%" PRId64, tr->step) ||
        dc_kv_set(&kv, "samples_seen", "%" PRId64, tr->samples_seen) ||
        dc_kv_set(&kv, "data_fingerprint", "%016" PRIx64, tr->data.fingerprint))
        goto done;
    for (int i = 0; extra && i < extra->n; i++)
        if (dc_kv_set(&kv, extra->keys[i], "%s", extra->values[i])) goto done;
    rc = dc_st_write(path, e, total, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n);
done:
    dc_kv_free(&kv);
    free(host), free(e), free(names);
    return rc;
}

int dc_ckpt_read_moment(const dc_params *ps, const dc_st_file *f, dc_optim_state which, float *host) {
    const char *name = k_state[which].name;
    const dc_st_tensor *t = dc_st_find(f, name);
    if (!t) return dc_fail("%s: no tensor '%s' (not a training checkpoint?)", f->path, name);
    if (t->ndim != 1 || t->shape[0] != ps->numel)
        return dc_fail("%s: tensor '%s' has %lld values, the model has %lld parameters", f->path,
                       name, (long long)t->numel, (long long)ps->numel);
    if (dc_st_read_f32(f, t, host)) return -1;
    return check_values(ps, which, host, f->path, "the file is damaged or was edited");
}

int dc_ckpt_read_moment_buf(const dc_params *ps, const dc_st_file *f, dc_optim_state which, dc_buf dst) {
    float *h = malloc((size_t)ps->numel * sizeof *h + 1);
    if (!h) return dc_fail("out of memory");
    int rc = dc_ckpt_read_moment(ps, f, which, h);
    if (!rc) ps->be->upload(ps->be, dst.p, h, (size_t)ps->numel * sizeof *h);
    free(h);
    return rc;
}

static int meta_i64(const dc_st_file *f, const char *key, int64_t *out) {
    const char *s = dc_st_meta(f, key);
    char *end;
    if (!s) return dc_fail("%s: metadata has no '%s' (not a training checkpoint?)", f->path, key);
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < 0) return dc_fail("%s: metadata '%s' = '%s' is malformed", f->path, key, s);
    *out = v;
    return 0;
}

// Resuming on other data silently breaks exactness: the checkpoint's
// fingerprint of its data set must match the one loaded now.
static int check_data(const dc_trainer *tr, const dc_st_file *f) {
    const dc_source *d = &tr->data;
    const char *name = d->name;
    const char *s = dc_st_meta(f, "data_fingerprint");
    if (!s) {
        dc_warn("%s records no data fingerprint (an older checkpoint): cannot check that the data set %s is "
                "the one it was trained on", f->path, name);
        return 0;
    }
    char *end;
    unsigned long long v = strtoull(s, &end, 16);
    if (strlen(s) != 16 || *end) return dc_fail("%s: metadata 'data_fingerprint' = '%s' is malformed", f->path, s);
    if (v == d->fingerprint) return 0;
    if (tr->allow_data_change) {
        dc_warn("the data set %s changed since %s was written (fingerprint %016llx, checkpoint %016llx); "
                "continuing as asked, so the run is no longer an exact continuation", name, f->path,
                (unsigned long long)d->fingerprint, v);
        return 0;
    }
    return dc_fail("the data set %s changed since the checkpoint %s was written (fingerprint %016llx, checkpoint "
                   "%016llx); pass --allow-data-change to continue anyway", name, f->path,
                   (unsigned long long)d->fingerprint, v);
}

int dc_trainer_restore(dc_trainer *tr, const dc_st_file *f) {
    DC_TRY(check_data(tr, f));
    DC_TRY(dc_optimizer_restore(tr->opt, f));
    DC_TRY(meta_i64(f, "step", &tr->step));
    DC_TRY(meta_i64(f, "samples_seen", &tr->samples_seen));
    return 0;
}
