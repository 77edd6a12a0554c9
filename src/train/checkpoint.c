// Training checkpoints: one safetensors file holding everything a run needs
// to continue bit-exactly (see dc_trainer_save in trainer.h).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/dit_io.h"
#include "train/trainer.h"

int dc_trainer_save(const dc_trainer *tr, const char *path, const dc_kv *extra) {
    const dc_dit *m = tr->model;
    const dc_params *ps = &m->params;
    int n = ps->count, total = 2 * n + 2;
    int64_t np = ps->numel;
    float *host = malloc((size_t)np * 4 * sizeof(float));
    dc_st_entry *e = calloc(total, sizeof *e);
    char (*names)[128] = calloc(2 * n, sizeof *names);
    dc_kv kv = {0};
    int rc = -1;
    if (!host || !e || !names) {
        dc_fail("out of memory writing %s", path);
        goto done;
    }
    dc_dit_weight_entries(m, ps->data, "", host, e, names);
    dc_dit_weight_entries(m, tr->ema, "ema.", host + np, e + n, names + n);
    tr->be->download(tr->be, host + 2 * np, tr->adam_m.p, (size_t)np * sizeof(float));
    tr->be->download(tr->be, host + 3 * np, tr->adam_v.p, (size_t)np * sizeof(float));
    e[2 * n] = (dc_st_entry){.name = "train.adam_m", .dtype = DC_F32, .ndim = 1, .shape = {np}, .data = host + 2 * np};
    e[2 * n + 1] = (dc_st_entry){.name = "train.adam_v", .dtype = DC_F32, .ndim = 1, .shape = {np}, .data = host + 3 * np};
    if (dc_kv_set(&kv, "format", "diffusion.c checkpoint v1") || dc_dit_config_to_kv(&m->cfg, &kv) ||
        dc_train_config_to_kv(&tr->cfg, &kv) ||
        dc_kv_set(&kv, "step", "%" PRId64, tr->step) ||
        dc_kv_set(&kv, "samples_seen", "%" PRId64, tr->samples_seen))
        goto done;
    for (int i = 0; extra && i < extra->n; i++)
        if (dc_kv_set(&kv, extra->keys[i], "%s", extra->values[i])) goto done;
    rc = dc_st_write(path, e, total, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n);
done:
    dc_kv_free(&kv);
    free(host), free(e), free(names);
    return rc;
}

static int read_flat(const dc_trainer *tr, const dc_st_file *f, const char *name, dc_buf dst) {
    const dc_st_tensor *t = dc_st_find(f, name);
    int64_t np = tr->model->params.numel;
    if (!t) return dc_fail("%s: no tensor '%s' (not a training checkpoint?)", f->path, name);
    if (t->ndim != 1 || t->shape[0] != np)
        return dc_fail("%s: tensor '%s' has %lld values, the model has %lld parameters", f->path,
                       name, (long long)t->numel, (long long)np);
    float *h = malloc((size_t)np * sizeof *h + 1);
    if (!h) return dc_fail("out of memory");
    if (dc_st_read_f32(f, t, h)) return free(h), -1;
    tr->be->upload(tr->be, dst.p, h, (size_t)np * sizeof *h);
    free(h);
    return 0;
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

int dc_trainer_restore(dc_trainer *tr, const dc_st_file *f) {
    dc_dit ema_view = *tr->model;  // same parameter table, EMA storage
    ema_view.params.data = tr->ema;
    DC_TRY(dc_dit_load_weights(&ema_view, f, "ema."));
    DC_TRY(read_flat(tr, f, "train.adam_m", tr->adam_m));
    DC_TRY(read_flat(tr, f, "train.adam_v", tr->adam_v));
    DC_TRY(meta_i64(f, "step", &tr->step));
    DC_TRY(meta_i64(f, "samples_seen", &tr->samples_seen));
    return 0;
}
