// Checkpoints of a tiny run on the CPU: a saved run restores; nothing
// non-finite (or a negative second moment) is written or read back, and the
// message names the tensor and element; the data set's fingerprint guards a
// resume (refused on change, allowed when asked, a warning for old files);
// absurd recipes are refused before training.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/dit_io.h"
#include "train/trainer.h"

#include "check.h"
#include "tiny_data.h"
#include "tmpdir.h"

static const dc_dit_config k_model = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 1,
                                      .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};

typedef struct {
    dc_backend *be;
    dc_dit m;
    dc_trainer tr;
} run;

static int start(run *r, const dc_dataset *ds) {
    dc_train_config tc = dc_train_config_default();
    tc.batch = tc.micro_batch = 4, tc.steps = 10, tc.lr = 1e-3f;
    memset(r, 0, sizeof *r);
    if (dc_backend_create("cpu", &r->be) || dc_dit_create(&r->m, &k_model, r->be, true) ||
        dc_dit_init_weights(&r->m, 3) || dc_trainer_init(&r->tr, &r->m.base, ds, &tc))
        return -1;
    return 0;
}

static void stop(run *r) {
    dc_trainer_free(&r->tr);
    dc_dit_free(&r->m);
    if (r->be) dc_backend_destroy(r->be);
}

// Restores checkpoint `path` into a fresh run on ds: raw weights, then the rest.
static int resume(const char *path, const dc_dataset *ds, bool allow_change) {
    run r;
    dc_st_file f;
    int rc = start(&r, ds);
    if (rc == 0) rc = dc_st_open(&f, path);
    if (rc == 0) {
        r.tr.allow_data_change = allow_change;
        rc = dc_dit_load_weights(&r.m, &f, "");
        if (rc == 0) rc = dc_trainer_restore(&r.tr, &f);
        dc_st_close(&f);
    }
    stop(&r);
    return rc;
}

// Copies checkpoint src to dst with element `elem` of tensor `name` set to v
// (name NULL: none), leaving out metadata key `drop` (NULL: none); the copy
// carries fresh checksums, so only the loader's own checks can refuse it.
static int rewrite(const char *src, const char *dst, const char *name, int64_t elem, float v, const char *drop) {
    dc_st_file f;
    DC_TRY(dc_st_open(&f, src));
    dc_st_entry *e = calloc((size_t)f.count, sizeof *e);
    const char **mk = calloc((size_t)f.nmeta, sizeof *mk), **mv = calloc((size_t)f.nmeta, sizeof *mv);
    float *copy = NULL;
    int nm = 0;
    for (int i = 0; i < f.count; i++) {
        const dc_st_tensor *t = &f.tensors[i];
        e[i] = (dc_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = f.data + t->begin};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
        if (name && strcmp(t->name, name) == 0) {
            copy = malloc((size_t)(t->end - t->begin));
            memcpy(copy, f.data + t->begin, (size_t)(t->end - t->begin));
            copy[elem] = v;
            e[i].data = copy;
        }
    }
    for (int i = 0; i < f.nmeta; i++)
        if (strncmp(f.meta_keys[i], "checksum.", 9) != 0 && (!drop || strcmp(f.meta_keys[i], drop) != 0))
            mk[nm] = f.meta_keys[i], mv[nm++] = f.meta_values[i];
    int rc = dc_st_write(dst, e, f.count, mk, mv, nm);
    free(e), free(mk), free(mv), free(copy);
    dc_st_close(&f);
    return rc;
}

static void test_checkpoints(void) {
    dc_dataset ds, other;
    tiny_data(&ds, 8), tiny_data(&other, 8);
    other.images[5] += 0.5f;  // one pixel changed on disk
    other.fingerprint = dc_dataset_fingerprint(&other);
    run r;
    const char *ck = tmp_path("step_2.safetensors");
    CHECK(start(&r, &ds) == 0 && dc_trainer_step(&r.tr, NULL) == 0 && dc_trainer_step(&r.tr, NULL) == 0 &&
              dc_trainer_save(&r.tr, ck, NULL) == 0, "train and save: %s", dc_error());
    dc_st_file f;
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)ds.fingerprint);
    CHECK(dc_st_open(&f, ck) == 0 && f.verified && strcmp(dc_st_meta(&f, "format"), "diffusion.c checkpoint v2") == 0 &&
              dc_st_meta(&f, "data_fingerprint") && strcmp(dc_st_meta(&f, "data_fingerprint"), fp) == 0,
          "v2 checkpoint with checksums and the data fingerprint: %s", dc_error());
    // a DiT's objective is the hybrid: no settings of the MSE objective written
    CHECK(!dc_st_meta(&f, "prediction") && !dc_st_meta(&f, "min_snr_gamma") && !dc_st_meta(&f, "noise_offset"),
          "a DiT checkpoint records the MSE objective's settings");
    dc_st_close(&f);
    CHECK(resume(ck, &ds, false) == 0, "resume on the same data: %s", dc_error());
    CHECK(resume(ck, &other, false) != 0 && strstr(dc_error(), "the data set in use changed since the checkpoint") &&
              strstr(dc_error(), "--allow-data-change"), "changed data refused: %s", dc_error());
    CHECK(resume(ck, &other, true) == 0, "changed data allowed when asked: %s", dc_error());
    const char *old = tmp_path("old.safetensors");
    CHECK(rewrite(ck, old, NULL, 0, 0, "data_fingerprint") == 0 && resume(old, &other, false) == 0,
          "a checkpoint without a fingerprint resumes (with a warning): %s", dc_error());

    // Non-finite values and negative second moments are refused on reading,
    // naming the tensor, the element and the parameter it belongs to.
    const dc_params *ps = &r.m.params;
    int q = dc_params_find(ps, "blocks.0.attn.qkv.weight");
    int64_t at = ps->items[q].offset + 5;
    const char *bad = tmp_path("bad.safetensors");
    struct { const char *tensor; int64_t elem; float v; const char *msg; } cases[] = {
        {"train.adam_v", at, NAN, "tensor 'train.adam_v' element"},
        {"train.adam_v", at, -1.0f, "is -1, negative"},
        {"train.adam_m", at, INFINITY, "tensor 'train.adam_m' element"},
        {"ema.blocks.0.attn.qkv.weight", 5, NAN, "tensor 'ema.blocks.0.attn.qkv.weight' element 5 is nan"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = rewrite(ck, bad, cases[i].tensor, cases[i].elem, cases[i].v, NULL);
        CHECK(rc == 0 && resume(bad, &ds, false) != 0 && strstr(dc_error(), "bad.safetensors") &&
                  strstr(dc_error(), cases[i].msg) &&
                  (cases[i].tensor[0] != 't' || strstr(dc_error(), "(parameter 'blocks.0.attn.qkv.weight' element 5)")),
              "%s = %g refused: %s", cases[i].tensor, cases[i].v, dc_error());
    }

    // ... and never written: weights, EMA and moments are checked on saving.
    float nan = NAN, neg = -2.0f, keep;
    const dc_optim_plain *plain = (const dc_optim_plain *)r.tr.opt;
    struct { dc_buf buf; float v; const char *msg; } spoil[] = {
        {r.m.params.data, nan, "tensor 'blocks.0.attn.qkv.weight' element 5 is nan"},
        {plain->ema, nan, "tensor 'ema.blocks.0.attn.qkv.weight' element 5 is nan"},
        {plain->m, nan, "tensor 'train.adam_m' element"},
        {plain->v, neg, "tensor 'train.adam_v' element"},
    };
    const char *no = tmp_path("step_3.safetensors");
    for (size_t i = 0; i < sizeof spoil / sizeof spoil[0]; i++) {
        dc_buf b = dc_buf_at(spoil[i].buf, at);
        r.be->download(r.be, &keep, b.p, sizeof keep);
        r.be->upload(r.be, b.p, &spoil[i].v, sizeof spoil[i].v);
        CHECK(dc_trainer_save(&r.tr, no, NULL) != 0 && strstr(dc_error(), spoil[i].msg) &&
                  strstr(dc_error(), "refusing to write") && access(no, F_OK) != 0,
              "save refused (%zu): %s", i, dc_error());
        r.be->upload(r.be, b.p, &keep, sizeof keep);
    }
    CHECK(dc_trainer_save(&r.tr, no, NULL) == 0, "save after the values are restored: %s", dc_error());
    stop(&r);
    dc_dataset_free(&ds), dc_dataset_free(&other);
}

static void test_recipes(void) {
    dc_train_config c = dc_train_config_default();
    c.weight_decay = 1e30f;
    CHECK(dc_train_config_validate(&c) != 0 && strstr(dc_error(), "--weight-decay 1e+30 with --lr 0.0001"),
          "weight decay 1e30: %s", dc_error());
    c.lr = 0.5f, c.weight_decay = 2.0f;
    CHECK(dc_train_config_validate(&c) != 0 && strstr(dc_error(), "lr * wd < 1"), "lr * wd = 1: %s", dc_error());
    c.weight_decay = 1.9f;
    CHECK(dc_train_config_validate(&c) == 0, "lr * wd = 0.95 is allowed: %s", dc_error());
    c = dc_train_config_default();
    c.adam_eps = INFINITY;
    CHECK(dc_train_config_validate(&c) != 0 && strstr(dc_error(), "--adam-eps"), "infinite eps: %s", dc_error());
    c = dc_train_config_default();
    c.grad_clip = INFINITY;
    CHECK(dc_train_config_validate(&c) != 0 && strstr(dc_error(), "--grad-clip"), "infinite clip: %s", dc_error());
}

int main(void) {
    if (tmpdir_make("ckpt")) return 1;
    test_checkpoints();
    test_recipes();
    tmpdir_remove();
    printf("test_checkpoint: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
