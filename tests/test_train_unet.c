// Training a text-conditioned UNet (tools/sd_random's tiny1 topology through
// the registry, random init) from MDS shards of latent distributions, with
// the MSE objective (v prediction, Min-SNR and a noise offset) on SD's
// scaled-linear schedule:
//   - the loss falls;
//   - a run stopped mid-epoch and resumed from its checkpoint writes the
//     uninterrupted run's checkpoint byte for byte (and a checkpoint restored
//     and saved at once is the same file);
//   - 2 CPU ranks (threads) write one rank's checkpoint byte for byte;
//   - rows whose caption is dropped get the empty prompt's embeddings, the
//     others their sample's.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "diffusion/sd_schedule.h"
#include "dist/comm.h"
#include "io/mds.h"
#include "models/model_io.h"
#include "models/registry.h"
#include "train/shards.h"
#include "train/trainer.h"

#include "check.h"
#include "file_bytes.h"
#include "tmpdir.h"

enum { N = 10, C = 4, S = 8, T = 77, D = 64, BATCH = 4, STEPS = 12, CUT = 5 };

static const char k_tiny_unet[] =
    "{\"_class_name\": \"UNet2DConditionModel\", \"act_fn\": \"silu\",\n"
    " \"in_channels\": 4, \"out_channels\": 4, \"block_out_channels\": [64, 128], \"layers_per_block\": 2,\n"
    " \"down_block_types\": [\"CrossAttnDownBlock2D\", \"DownBlock2D\"],\n"
    " \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\"], \"attention_head_dim\": [1, 2],\n"
    " \"cross_attention_dim\": 64, \"norm_num_groups\": 32, \"norm_eps\": 1e-05, \"sample_size\": 8,\n"
    " \"use_linear_projection\": false, \"center_input_sample\": false}\n";

static dc_kv g_cfg;
static char g_shards[256];
static float g_null[T * D];

// Two kinds of picture, told apart by their caption: a latent mean of +0.8 or
// -0.8 with a per-sample pattern, and a small spread.
static float caption(int i, int j) { return dc_randn_at(61, (uint32_t)(i % 2), 0, 0, (uint32_t)j); }

static const char *write_shards(void) {
    char ex[64], et[64];
    snprintf(ex, sizeof ex, "ndarray:float16:%d,%d,%d", C, S, S);
    snprintf(et, sizeof et, "ndarray:float16:%d,%d", T, D);
    dc_mds_spec cols[] = {{"latents_mean", ex}, {"latents_logvar", ex}, {"text_embeddings", et},
                          {"text_tokens", "int32"}};
    dc_mds_write_opts o = {0, 30000};  // about 3 samples a shard
    dc_mds_writer *w;
    const char *dir = tmp_path("shards");
    if (dc_mds_writer_open(&w, dir, cols, 4, &o)) return NULL;
    for (int i = 0; i < N; i++) {
        static uint16_t m[C * S * S], lv[C * S * S], t[T * D];
        for (int j = 0; j < C * S * S; j++) {
            m[j] = dc_f32_to_f16((i % 2 ? 0.8f : -0.8f) + 0.1f * dc_randn_at(62, (uint32_t)i, 0, 0, (uint32_t)j));
            lv[j] = dc_f32_to_f16(-5.0f + dc_randn_at(63, (uint32_t)i, 0, 0, (uint32_t)j));
        }
        for (int j = 0; j < T * D; j++) t[j] = dc_f32_to_f16(caption(i, j));
        int32_t tok = 3 + i % 4;
        dc_mds_value v[4] = {{m, sizeof m, 0, 0, NULL}, {lv, sizeof lv, 0, 0, NULL}, {t, sizeof t, 0, 0, NULL},
                             {&tok, 4, 0, 0, NULL}};
        if (dc_mds_write(w, v)) return dc_mds_writer_free(w), NULL;
    }
    return dc_mds_writer_finish(w) ? NULL : dir;
}

static dc_train_config config(void) {
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = 1, tc.steps = STEPS, tc.lr = 1e-3f, tc.ema_decay = 0.9f, tc.seed = 17;
    tc.class_dropout = 0.3f;
    tc.objective = (dc_mse_objective){DC_PRED_V, 5.0f, 0.1f};
    return tc;
}

typedef struct {
    int from, to;         // steps to run
    const char *resume;   // checkpoint to start from, or NULL (random init)
    const char *save;     // checkpoint written at the end (rank 0)
    double loss[STEPS];
    int dropped, kept, bad_rows;  // rows checked (check_row), and those with the wrong embeddings
} job;

// The row step s staged last (micro-batches of 1: the global batch's last
// image): dropped, its embeddings are the empty prompt's, else its caption's
// (one of two).
static void check_row(dc_trainer *tr, job *j, int s) {
    {
        const float *ctx = tr->cond.ctx;
        bool is_null = !memcmp(ctx, g_null, sizeof g_null) && tr->cond.lens[0] == 7;
        int kind = -1;
        for (int k = 0; k < 2 && kind < 0; k++) {
            bool same = true;
            for (int q = 0; q < T * D && same; q++) same = ctx[q] == dc_f16_to_f32(dc_f32_to_f16(caption(k, q)));
            if (same) kind = k;
        }
        float u = dc_u32_to_unit(dc_rand_u32_at(tr->cfg.seed, BATCH - 1, (uint32_t)s, DC_STREAM_DROPOUT, 0));
        bool drop = u < tr->cfg.class_dropout;
        j->dropped += drop, j->kept += !drop;
        j->bad_rows += drop ? !is_null : (is_null || kind < 0);
    }
}

static int train(dc_comm *comm, void *arg) {
    job *j = arg;
    omp_set_num_threads(1);
    dc_backend *be = NULL;
    dc_model *m = NULL;
    dc_trainer tr = {0};
    dc_source src = {0};
    dc_schedule sched = {0};
    dc_st_file f;
    bool open = false;
    dc_train_config tc = config();
    const dc_shards_opts so = {.dir = g_shards, .seed = tc.seed, .block = 4, .latent_scale = 0.18215f,
                               .text_null = g_null, .text_null_len = 7};
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_model_create(&g_cfg, be, true, &m);
    if (!rc && j->resume) rc = dc_st_open(&f, j->resume), open = !rc;
    if (!rc) rc = open ? dc_model_load_weights(m, &f, "") : dc_model_init_weights(m, 5);
    if (!rc) rc = dc_source_shards(&src, &so);
    if (!rc) rc = dc_schedule_init_scaled_linear(&sched, 1000, 0.00085, 0.012);
    if (!rc) rc = dc_trainer_init_source(&tr, m, &src, &sched, &tc);
    if (!rc && open) rc = dc_trainer_restore(&tr, &f);
    if (!rc && comm) rc = dc_trainer_set_comm(&tr, comm, 0);
    for (int s = j->from; s < j->to && !rc; s++) {
        dc_step_stats st;
        rc = dc_trainer_step(&tr, &st);
        if (!rc && !comm) check_row(&tr, j, s);
        if (!rc && (!comm || comm->rank == 0)) j->loss[s] = st.loss;
    }
    if (!rc && j->save) rc = dc_trainer_save(&tr, j->save, NULL);
    if (open) dc_st_close(&f);
    dc_trainer_free(&tr);
    dc_source_close(&src), dc_schedule_free(&sched);
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
    return rc;
}

int main(void) {
    openblas_set_num_threads(1);  // the same rounding in every rank
    if (tmpdir_make("train_unet")) return 1;
    for (int j = 0; j < T * D; j++) g_null[j] = dc_randn_at(60, 0, 0, 0, (uint32_t)j);
    const char *dir = write_shards();
    CHECK(dir != NULL, "shards: %s", dc_error());
    snprintf(g_shards, sizeof g_shards, "%s", dir ? dir : "");
    FILE *fp = fopen(tmp_path("config.json"), "w");
    CHECK(fp && fputs(k_tiny_unet, fp) >= 0 && !fclose(fp), "config.json");
    CHECK(dc_model_config_of_json(tmp_path("config.json"), &g_cfg) == 0, "config: %s", dc_error());
    if (g_fail) return 1;

    // latents are no pictures to mirror
    {
        dc_backend *be = NULL;
        dc_model *m = NULL;
        dc_source src;
        dc_trainer tr;
        dc_train_config tc = config();
        tc.hflip = true;
        const dc_shards_opts so = {.dir = g_shards, .block = 4, .latent_scale = 1, .text_null = g_null,
                                   .text_null_len = 1};
        CHECK(dc_backend_create("cpu", &be) == 0 && dc_model_create(&g_cfg, be, true, &m) == 0 &&
                  dc_source_shards(&src, &so) == 0 && dc_trainer_init_source(&tr, m, &src, NULL, &tc) != 0 &&
                  strstr(dc_error(), "cannot be mirrored") && !src.ops,
              "flips of latents: %s", dc_error());
        dc_model_free(m);
        if (be) dc_backend_destroy(be);
    }
    // the whole run
    job whole = {.from = 0, .to = STEPS, .save = tmp_path("whole.ckpt")};
    CHECK(train(NULL, &whole) == 0, "whole run: %s", dc_error());
    double first = 0, last = 0;
    for (int s = 0; s < 3; s++) first += whole.loss[s] / 3, last += whole.loss[STEPS - 1 - s] / 3;
    printf("  loss %.4f over the first 3 steps, %.4f over the last 3\n", first, last);
    CHECK(isfinite(first) && isfinite(last) && last < 0.8 * first, "the loss does not fall: %g to %g", first, last);
    CHECK(whole.kept > 0 && whole.dropped > 0 && whole.bad_rows == 0,
          "caption dropout: %d rows dropped, %d kept, %d with the wrong embeddings", whole.dropped, whole.kept,
          whole.bad_rows);
    // the objective's settings in the checkpoint, and read back
    dc_st_file f;
    if (dc_st_open(&f, tmp_path("whole.ckpt")) == 0) {
        const char *p = dc_st_meta(&f, "prediction"), *g = dc_st_meta(&f, "min_snr_gamma"),
                   *o = dc_st_meta(&f, "noise_offset");
        CHECK(p && g && o && !strcmp(p, "v_prediction") && !strcmp(g, "5") && !strcmp(o, "0.1"),
              "checkpoint: prediction %s, gamma %s, offset %s", p, g, o);
        dc_train_config back, want = config();
        CHECK(dc_train_config_from_kv(&back, (const char *const *)f.meta_keys, (const char *const *)f.meta_values,
                                      f.nmeta, "whole.ckpt") == 0 &&
                  back.objective.prediction == DC_PRED_V && back.objective.min_snr_gamma == 5.0f &&
                  back.objective.noise_offset == want.objective.noise_offset,
              "the objective read back: %s", dc_error());
        dc_st_close(&f);
    } else
        CHECK(0, "open: %s", dc_error());
    // stopped after CUT steps (mid-epoch: 10 samples make 2 batches of 4 an epoch) and resumed
    job head = {.from = 0, .to = CUT, .save = tmp_path("head.ckpt")};
    job tail = {.from = CUT, .to = STEPS, .resume = tmp_path("head.ckpt"), .save = tmp_path("resumed.ckpt")};
    CHECK(train(NULL, &head) == 0 && train(NULL, &tail) == 0, "resumed run: %s", dc_error());
    // restored and saved at once: the same file (the convolutions' kernels,
    // stored channels-last, go to the file in PyTorch's order and back)
    job again = {.from = CUT, .to = CUT, .resume = tmp_path("head.ckpt"), .save = tmp_path("again.ckpt")};
    CHECK(train(NULL, &again) == 0 && same_file(tmp_path("head.ckpt"), tmp_path("again.ckpt")),
          "a checkpoint restored and saved again differs: %s", dc_error());
    CHECK(same_file(tmp_path("whole.ckpt"), tmp_path("resumed.ckpt")),
          "the resumed run's checkpoint differs from the uninterrupted run's");
    // 2 ranks, one micro-batch of 1 each a round: one rank's micro-batches
    job two = {.from = 0, .to = STEPS, .save = tmp_path("two.ckpt")};
    CHECK(dc_comm_threads_run(2, train, &two) == 0, "2 ranks: %s", dc_error());
    CHECK(same_file(tmp_path("whole.ckpt"), tmp_path("two.ckpt")), "2 ranks' checkpoint differs from one rank's");
    CHECK(!same_file(tmp_path("whole.ckpt"), tmp_path("head.ckpt")), "the comparison cannot tell checkpoints apart");
    dc_kv_free(&g_cfg);
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
