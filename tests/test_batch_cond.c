// A training batch's conditioning from the data source (train/batch_cond.h):
// - label data: each staged row on the backend is the sample's label, or the
//   null label where dropped;
// - text data: each row's embeddings and length are the sample's, or the
//   empty prompt's where dropped, read back from the backend and compared
//   with the data set's arrays element by element (fresh random values);
// - a text data set's fingerprint covers its embeddings, lengths and empty
//   prompt;
// - the trainer refuses data whose conditioning is not the model's, naming
//   both kinds.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/dit.h"
#include "train/batch_cond.h"
#include "train/trainer.h"

#include "check.h"
#include "tiny_data.h"

enum { N = 9, ROWS = 5, LEN = 7, DIM = 6 };

static float rnd(uint32_t i) { return dc_randn_at(77, i, 0, 0, 0); }

// Rows: samples 8, 3, 3, 0, 5, the second and the fifth dropped.
static const int64_t k_idx[ROWS] = {8, 3, 3, 0, 5};
static const bool k_drop[ROWS] = {false, true, false, false, true};

static void test_labels(dc_backend *be) {
    dc_dataset ds;
    tiny_data(&ds, N);
    for (int i = 0; i < N; i++) ds.labels[i] = (int32_t)(dc_rand_u32_at(5, (uint32_t)i, 0, 0, 0) % 2);
    dc_batch_cond c;
    dc_source src;
    CHECK(dc_source_dataset(&src, &ds, 1) == 0, "source: %s", dc_error());
    CHECK(dc_batch_cond_init(&c, &src, be, ROWS) == 0 && c.dev.y.p && !c.dev.ctx.p, "init: %s", dc_error());
    for (int i = 0; i < ROWS; i++) CHECK(dc_batch_cond_set(&c, &src, i, k_idx[i], k_drop[i], 2) == 0, "row %d", i);
    dc_batch_cond_upload(&c, be, ROWS);
    int32_t got[ROWS];
    be->download(be, got, c.dev.y.p, sizeof got);
    for (int i = 0; i < ROWS; i++) {
        int32_t want = k_drop[i] ? 2 : ds.labels[k_idx[i]];
        CHECK(got[i] == want, "row %d: label %d, want %d", i, got[i], want);
    }
    dc_batch_cond_free(&c, be);
    dc_source_close(&src);
    dc_dataset_free(&ds);
}

// tiny_data's images with text conditioning: random embeddings and lengths.
static void text_data(dc_dataset *ds) {
    tiny_data(ds, N);
    ds->cond = DC_COND_TEXT, ds->text_len = LEN, ds->text_dim = DIM;
    ds->text = malloc(sizeof(float) * N * LEN * DIM);
    ds->text_lens = malloc(sizeof(int32_t) * N);
    ds->text_null = malloc(sizeof(float) * LEN * DIM);
    for (int i = 0; i < N * LEN * DIM; i++) ds->text[i] = rnd((uint32_t)i);
    for (int i = 0; i < N; i++) ds->text_lens[i] = 1 + (int32_t)(dc_rand_u32_at(6, (uint32_t)i, 0, 0, 0) % LEN);
    for (int i = 0; i < LEN * DIM; i++) ds->text_null[i] = rnd(100000 + (uint32_t)i);
    ds->text_null_len = 2;
    ds->fingerprint = dc_dataset_fingerprint(ds);
}

static void test_text(dc_backend *be) {
    dc_dataset ds;
    text_data(&ds);
    dc_batch_cond c;
    dc_source src;
    CHECK(dc_source_dataset(&src, &ds, 1) == 0, "source: %s", dc_error());
    CHECK(dc_batch_cond_init(&c, &src, be, ROWS) == 0 && !c.dev.y.p && c.dev.len == LEN && c.dev.dim == DIM,
          "init: %s", dc_error());
    for (int i = 0; i < ROWS; i++) CHECK(dc_batch_cond_set(&c, &src, i, k_idx[i], k_drop[i], 0) == 0, "row %d", i);
    dc_batch_cond_upload(&c, be, ROWS);
    float *ctx = malloc(sizeof(float) * ROWS * LEN * DIM);
    int32_t lens[ROWS];
    be->download(be, ctx, c.dev.ctx.p, sizeof(float) * ROWS * LEN * DIM);
    be->download(be, lens, c.dev.lens.p, sizeof lens);
    for (int i = 0; i < ROWS; i++) {
        int bad = 0;
        for (int j = 0; j < LEN * DIM; j++) {
            float want = k_drop[i] ? ds.text_null[j] : ds.text[(k_idx[i] * LEN * DIM) + j];
            bad += ctx[i * LEN * DIM + j] != want;
        }
        int32_t want_len = k_drop[i] ? ds.text_null_len : ds.text_lens[k_idx[i]];
        CHECK(bad == 0 && lens[i] == want_len, "row %d: %d embedding values differ, length %d (want %d)", i, bad,
              lens[i], want_len);
    }
    free(ctx);
    dc_batch_cond_free(&c, be);
    dc_source_close(&src);
    // the fingerprint sees each part of the text
    uint64_t f0 = ds.fingerprint;
    float *parts[] = {&ds.text[N * LEN * DIM - 1], &ds.text_null[3]};
    for (int k = 0; k < 2; k++) {
        float keep = *parts[k];
        *parts[k] += 0.5f;
        CHECK(dc_dataset_fingerprint(&ds) != f0, "a changed %s leaves the fingerprint", k ? "empty prompt" : "caption");
        *parts[k] = keep;
    }
    ds.text_lens[4] = ds.text_lens[4] % LEN + 1;
    CHECK(dc_dataset_fingerprint(&ds) != f0, "a changed length leaves the fingerprint");
    dc_dataset_free(&ds);
}

static void test_kinds(dc_backend *be) {
    const dc_dit_config cfg = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 1,
                               .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};
    dc_model *m = NULL;
    dc_dataset ds;
    text_data(&ds);
    dc_trainer tr = {0};
    dc_train_config tc = dc_train_config_default();
    tc.batch = 4, tc.micro_batch = 4;
    CHECK(dc_dit_new(&cfg, be, true, &m) == 0, "model: %s", dc_error());
    CHECK(m && dc_trainer_init(&tr, m, &ds, &tc) != 0 &&
              strstr(dc_error(), "this DiT is conditioned on class labels, but the data set carries text"),
          "text data for a label model: %s", dc_error());
    dc_dataset_free(&ds);
    tiny_data(&ds, N);
    CHECK(m && dc_trainer_init(&tr, m, &ds, &tc) == 0 && tr.cond.dev.y.p, "label data: %s", dc_error());
    dc_trainer_free(&tr);
    tc.objective.prediction = DC_PRED_V;
    CHECK(m && dc_trainer_init(&tr, m, &ds, &tc) != 0 && strstr(dc_error(), "learns its variance"),
          "v prediction for a learned-sigma model: %s", dc_error());
    dc_dataset_free(&ds);
    dc_model_free(m);
}

int main(void) {
    dc_backend *be = NULL;
    if (dc_backend_create("cpu", &be)) return printf("backend: %s\n", dc_error()), 1;
    test_labels(be);
    test_text(be);
    test_kinds(be);
    dc_backend_destroy(be);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
