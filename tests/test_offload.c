// Optimizer offload (train/offload.h) on the CPU backend, against plain
// training of a tiny DiT. On the CPU the offloaded step runs the same AdamW
// kernel on the same gradient sums, so everything must match bit for bit:
// - weights, EMA, both moments and every step's loss and gradient norm, over
//   several steps with micro-batch accumulation (the running sums go down to
//   the host and back up), with clipping (the norm before any update) and
//   without (each unit updated by the worker thread during backward), with
//   recompute, and with one micro-batch per step;
// - the same with a compute copy beside the fp32 weights, as on a GPU (an
//   fp32 one here, so the CPU's ops read it): offload then keeps only the
//   fixed pos_embed of the fp32 data on the device while it trains, the
//   forward reading that and the compute copy, and gives the model its full
//   fp32 weights back when freed;
// - checkpoints: an offloaded run writes the same file as a plain one, and
//   resumes cross both ways (plain -> offload, offload -> plain) end where the
//   uninterrupted run does;
// - the schedule's settings (dc_offload_settings) change no bit: units
//   updated on the device, units held back, the update finished within its
//   step and the host not paced; out-of-range settings are refused;
// - a model made with no full gradient buffer (DC_GRAD_WINDOW, as `train
//   --offload` makes it) trains to the same bits, with an EMA and with a
//   decay of 0, where offload keeps none and its EMA is the plain run's (the
//   weights); such a model has no gradient buffer, and plain training
//   refuses it naming --offload;
// - refusals: offload with several ranks or with ZeRO, and on a backend
//   without the copy ops, fail with a message naming --offload.
//
// `test_offload cuda-fp32` (or `cuda`) runs the comparisons on the GPU, where
// the copies and the device's share of the update run beside the ops for
// real: offload against plain training there, with the device's share at 0
// (the default), a quarter and all, and with the update finished inside each step or by
// the next forward. The host's AdamW and the device's round differently, so
// there the states must agree to 1e-5 (fp32) or 1e-3 (bf16) of their norm,
// and each step's loss and gradient norm as closely. Without a GPU it says
// so and passes.
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "file_bytes.h"
#include "core/error.h"
#include "dist/comm.h"
#include "models/dit.h"
#include "models/model_io.h"
#include "tmpdir.h"
#include "optim_state.h"
#include "tiny_data.h"
#include "train/trainer.h"

static const dc_dit_config k_model = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 3,
                                      .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};
enum { STEPS = 4, BATCH = 6 };
static const float k_clip = 0.02f;  // below every step's norm here: clipping acts each step

static dc_dataset g_data;
static const char *g_backend = "cpu";
static double g_rel = 0;  // 0: bit for bit (the CPU); else the relative tolerance
static dc_offload_settings g_set;  // how the offloaded runs schedule their work

typedef struct {
    bool offload, wc;             // wc: a compute copy beside the fp32 data (as on a GPU)
    bool window, no_ema;          // made with DC_GRAD_WINDOW; an EMA decay of 0
    int micro, steps, recompute;  // micro-batch, the step to train up to, blocks keeping activations (0: off)
    float clip;
    const char *resume, *save;    // restore this checkpoint first / write one at the end (NULL: no)
    float *state[5];              // weights (the model's), EMA, m, v, and the compute weights at the end
    double loss[STEPS + 1], norm[STEPS + 1];  // each step's statistics, by step number
    int64_t numel;
} job;

// Beside a compute copy offload keeps on the device only the fp32 data's
// prefix holding the fixed tensors (pos_embed, first in DiT's layout).
static void check_shrunk(const dc_trainer *tr) {
    const dc_params *ps = tr->model->params;
    const dc_param *pos = &ps->items[dc_params_find(ps, "pos_embed")];
    CHECK(((const dc_offload *)tr->opt)->shrunk && dc_offload_kept_data(ps) == pos->offset + pos->numel,
          "offload beside a compute copy kept %lld fp32 values, pos_embed ends at %lld",
          (long long)dc_offload_kept_data(ps), (long long)(pos->offset + pos->numel));
}

// After the trainer is freed the model has its full fp32 weights again: the
// trained ones.
static void check_given_back(const dc_dit *m, const job *j) {
    const dc_params *ps = &m->params;
    float *h = malloc(sizeof(float) * (size_t)ps->numel);
    ps->be->download(ps->be, h, ps->data.p, sizeof(float) * (size_t)ps->numel);
    CHECK(memcmp(h, j->state[0], sizeof(float) * (size_t)ps->numel) == 0,
          "the fp32 weights given back after offload are not the trained weights");
    free(h);
}

static int train(job *j) {
    dc_backend *be = NULL;
    dc_dit m;
    dc_trainer tr;
    dc_st_file f;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr), memset(&f, 0, sizeof f);
    bool open = false;
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = j->micro, tc.steps = STEPS, tc.lr = 1e-3f, tc.ema_decay = j->no_ema ? 0 : 0.9f;
    tc.hflip = true, tc.grad_clip = j->clip, tc.offload = j->offload, tc.offload_settings = g_set;
    int rc = dc_backend_create(g_backend, &be);
    if (!rc) rc = dc_dit_create(&m, &k_model, be, j->window ? DC_GRAD_WINDOW : DC_GRAD_BUFFER);
    if (!rc && j->window) CHECK(!m.params.grad.p && dc_params_trains(&m.params), "a model made with DC_GRAD_WINDOW");
    if (!rc && j->wc) {  // dc_params_free frees it
        m.params.wc = (dc_buf){be->alloc(be, sizeof(float) * (size_t)m.params.numel), DC_F32};
        m.params.stale = true;
    }
    if (!rc && j->recompute) rc = dc_dit_set_recompute(&m, j->recompute);
    if (!rc && j->resume) rc = dc_st_open(&f, j->resume), open = rc == 0;
    if (!rc) rc = j->resume ? dc_model_load_weights(&m.base, &f, "") : dc_dit_init_weights(&m, 5);
    if (!rc) rc = dc_trainer_init(&tr, &m.base, &g_data, &tc);
    if (!rc && j->resume) rc = dc_trainer_restore(&tr, &f);
    if (open) dc_st_close(&f);
    while (!rc && tr.step < j->steps) {
        dc_step_stats st;
        rc = dc_trainer_step(&tr, &st);
        if (!rc) j->loss[tr.step] = st.loss, j->norm[tr.step] = st.grad_norm;
    }
    if (!rc && j->save) rc = dc_trainer_save(&tr, j->save, NULL);
    if (!rc) rc = dc_trainer_sync(&tr);  // offload leaves the last units' update running
    if (!rc) j->numel = read_optim_state(&tr, j->state);
    if (!rc && j->offload && j->wc) check_shrunk(&tr);
    dc_trainer_free(&tr);
    if (!rc && j->offload && j->wc) check_given_back(&m, j);
    dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    return rc;
}

static void job_free(job *j) {
    for (int b = 0; b < 5; b++) free(j->state[b]), j->state[b] = NULL;
}

static bool run(job *j, const char *what) {
    int rc = train(j);
    CHECK(rc == 0, "%s: %s", what, rc ? dc_error() : "");
    return rc == 0;
}

// Whether j ended in exactly ref's state, with ref's statistics for steps
// from..to (those j ran).
static void check_close(const job *j, const job *ref, int from, const char *what);

static void check_same(const job *j, const job *ref, int from, const char *what) {
    static const char *names[5] = {"weights", "EMA", "adam_m", "adam_v", "compute weights"};
    if (!j->state[0] || !ref->state[0]) return;
    if (g_rel > 0) {
        check_close(j, ref, from, what);
        return;
    }
    for (int b = 0; b < 5; b++) {
        int64_t diff = 0, first = -1;
        for (int64_t i = 0; i < ref->numel; i++)
            if (memcmp(&j->state[b][i], &ref->state[b][i], sizeof(float)) != 0) diff++, first = first < 0 ? i : first;
        CHECK(diff == 0, "%s: %lld %s differ from the plain run's (first: element %lld, %.9g vs %.9g)", what,
              (long long)diff, names[b], (long long)first, first < 0 ? 0.0 : j->state[b][first],
              first < 0 ? 0.0 : ref->state[b][first]);
    }
    for (int s = from; s <= j->steps; s++) {
        CHECK(isfinite(j->loss[s]) && j->loss[s] == ref->loss[s], "%s: step %d loss %.9g, plain %.9g", what, s,
              j->loss[s], ref->loss[s]);
        // with clipping the norm sets the update: the same pass, the same bits; without,
        // offload combines the units' norms (train/offload.h): fp32 rounding apart
        const double tol = j->clip > 0 ? 0.0 : 1e-6 * fabs(ref->norm[s]);
        CHECK(isfinite(j->norm[s]) && fabs(j->norm[s] - ref->norm[s]) <= tol,
              "%s: step %d gradient norm %.9g, plain %.9g", what, s, j->norm[s], ref->norm[s]);
    }
}

// On a GPU: each state within g_rel of its norm, each step's statistics within g_rel.
static void check_close(const job *j, const job *ref, int from, const char *what) {
    static const char *names[5] = {"weights", "EMA", "adam_m", "adam_v", "compute weights"};
    for (int b = 0; b < 5; b++) {
        double d2 = 0, r2 = 0;
        for (int64_t i = 0; i < ref->numel; i++) {
            double d = (double)j->state[b][i] - ref->state[b][i];
            d2 += d * d, r2 += (double)ref->state[b][i] * ref->state[b][i];
        }
        CHECK(isfinite(d2) && r2 > 0 && sqrt(d2 / r2) <= g_rel, "%s: %s differ from the plain run's by %.3g of their "
              "norm (tolerance %.0e)", what, names[b], sqrt(d2 / r2), g_rel);
    }
    for (int s = from; s <= j->steps; s++) {
        CHECK(isfinite(j->loss[s]) && fabs(j->loss[s] - ref->loss[s]) <= g_rel * fabs(ref->loss[s]),
              "%s: step %d loss %.9g, plain %.9g", what, s, j->loss[s], ref->loss[s]);
        CHECK(isfinite(j->norm[s]) && fabs(j->norm[s] - ref->norm[s]) <= g_rel * fabs(ref->norm[s]),
              "%s: step %d gradient norm %.9g, plain %.9g", what, s, j->norm[s], ref->norm[s]);
    }
}

// Offload against plain training with the same settings (wc: both with a
// compute copy).
static void compare(int micro, float clip, int recompute, bool wc, const char *what) {
    job plain = {.wc = wc, .micro = micro, .steps = STEPS, .clip = clip};
    job off = {.offload = true, .wc = wc, .micro = micro, .steps = STEPS, .clip = clip, .recompute = recompute};
    char name[160];
    snprintf(name, sizeof name, "offload, %s", what);
    if (run(&plain, what) && run(&off, name)) {
        check_same(&off, &plain, 1, name);
        // clipping must have acted, or the test would not tell the two paths apart
        if (clip > 0) CHECK(plain.norm[1] > clip, "%s: the norm %g does not reach the clip %g", what, plain.norm[1], clip);
    }
    job_free(&plain), job_free(&off);
}

// Offload of a model made with no full gradient buffer against plain
// training of one made with it; no_ema: both with an EMA decay of 0.
static void compare_window(bool no_ema, bool wc, const char *what) {
    job plain = {.wc = wc, .micro = 2, .steps = STEPS, .no_ema = no_ema};
    job off = {.offload = true, .window = true, .wc = wc, .micro = 2, .steps = STEPS, .no_ema = no_ema};
    char name[160];
    snprintf(name, sizeof name, "offload, %s", what);
    if (run(&plain, what) && run(&off, name)) {
        check_same(&off, &plain, 1, name);
        if (no_ema)  // the EMA is the weights
            CHECK(!memcmp(plain.state[1], plain.state[0], sizeof(float) * (size_t)plain.numel),
                  "%s: a decay of 0 left an EMA apart from the weights", what);
    }
    job_free(&plain), job_free(&off);
}

// A trainer that fails to start: the message must name --offload.
static void check_refused(int rc, const char *what) {
    CHECK(rc != 0, "%s: accepted", what);
    if (rc) CHECK(strstr(dc_error(), "--offload") != NULL, "%s: the message does not name --offload: %s", what,
                  dc_error());
}

typedef struct {
    int stage;
    int rc;
    char msg[512];
} comm_job;

// Rank 0 records what dc_trainer_set_comm says to offload beside ranks or ZeRO.
static int set_comm_offload(dc_comm *c, void *arg) {
    comm_job *cj = arg;
    dc_backend *be = NULL;
    dc_dit m;
    dc_trainer tr;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr);
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = BATCH, tc.offload = true;
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_dit_create(&m, &k_model, be, true);
    if (!rc) rc = dc_dit_init_weights(&m, 5);
    if (!rc) rc = dc_trainer_init(&tr, &m.base, &g_data, &tc);
    int set = rc ? rc : dc_trainer_set_comm(&tr, c, cj->stage);
    if (c->rank == 0) cj->rc = set, snprintf(cj->msg, sizeof cj->msg, "%s", set ? dc_error() : "");
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    return 0;
}

static void refusals(void) {
    for (int k = 0; k < 2; k++) {
        comm_job cj = {.stage = k ? 1 : 0};
        int ranks = k ? 1 : 2;
        int rc = dc_comm_threads_run(ranks, set_comm_offload, &cj);
        CHECK(rc == 0, "the thread communicator: %s", rc ? dc_error() : "");
        CHECK(cj.rc != 0, "offload on %d ranks with ZeRO %d: accepted", ranks, cj.stage);
        CHECK(strstr(cj.msg, "--offload") != NULL, "offload on %d ranks with ZeRO %d: the message does not name "
              "--offload: %s", ranks, cj.stage, cj.msg);
    }
    // a backend that cannot copy beside its ops
    dc_backend *be = NULL;
    dc_dit m;
    dc_trainer tr;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr);
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = BATCH, tc.offload = true;
    int rc = dc_backend_create("cpu", &be);
    CHECK(rc == 0, "cpu backend: %s", rc ? dc_error() : "");
    if (rc) return;
    be->copy_async = NULL;
    rc = dc_dit_create(&m, &k_model, be, true);
    if (!rc) rc = dc_dit_init_weights(&m, 5);
    CHECK(rc == 0, "model: %s", rc ? dc_error() : "");
    if (!rc) check_refused(dc_trainer_init(&tr, &m.base, &g_data, &tc), "offload on a backend without copy_async");
    CHECK(m.params.grad.p != NULL && m.params.hooks == NULL, "a refused offload changed the parameters");
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    // a model made for offload alone (no gradient buffer) under plain training
    tc.offload = false;
    rc = dc_dit_create(&m, &k_model, be, DC_GRAD_WINDOW);
    if (!rc) rc = dc_dit_init_weights(&m, 5);
    CHECK(rc == 0, "model: %s", rc ? dc_error() : "");
    if (!rc) check_refused(dc_trainer_init(&tr, &m.base, &g_data, &tc), "plain training of a model made for offload");
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    dc_backend_destroy(be);
}

// Settings out of range are refused by the training config's check, naming
// what is wrong; the defaults pass.
static void settings_checked(void) {
    dc_train_config tc = dc_train_config_default();
    CHECK(dc_train_config_validate(&tc) == 0, "the default offload settings refused: %s", dc_error());
    const struct { int hold; double share; const char *msg; } bad[] = {
        {-1, 0.0, "held back"}, {8, 1.5, "share"}, {8, -0.25, "share"}, {8, NAN, "share"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tc.offload_settings = dc_offload_settings_default();
        tc.offload_settings.hold = bad[i].hold, tc.offload_settings.device_share = bad[i].share;
        int rc = dc_train_config_validate(&tc);
        CHECK(rc != 0 && strstr(dc_error(), bad[i].msg), "offload settings hold %d, share %g: %s", bad[i].hold,
              bad[i].share, rc ? dc_error() : "accepted");
    }
}

// Checkpoints: the same file either way, and resumes across.
static void checkpoints(void) {
    if (tmpdir_make("offload")) {
        CHECK(0, "no scratch folder");
        return;
    }
    const char *p2 = tmp_path("plain2.st"), *o2 = tmp_path("off2.st");
    const char *p4 = tmp_path("plain4.st"), *o4 = tmp_path("off4.st");
    job full = {.micro = 2, .steps = STEPS, .clip = k_clip, .save = p4};
    job half_plain = {.micro = 2, .steps = 2, .clip = k_clip, .save = p2};
    job half_off = {.offload = true, .micro = 2, .steps = 2, .clip = k_clip, .save = o2};
    job off_full = {.offload = true, .micro = 2, .steps = STEPS, .clip = k_clip, .save = o4};
    job p_to_o = {.offload = true, .micro = 2, .steps = STEPS, .clip = k_clip, .resume = p2};
    job o_to_p = {.micro = 2, .steps = STEPS, .clip = k_clip, .resume = o2};
    job p_to_o_wc = {.offload = true, .wc = true, .micro = 2, .steps = STEPS, .clip = k_clip, .resume = p2};
    if (run(&full, "plain, 4 steps") && run(&half_plain, "plain, 2 steps") && run(&half_off, "offload, 2 steps") &&
        run(&off_full, "offload, 4 steps")) {
        CHECK(same_file(p2, o2), "after 2 steps the offloaded run's checkpoint differs from the plain run's");
        CHECK(same_file(p4, o4), "after 4 steps the offloaded run's checkpoint differs from the plain run's");
        if (run(&p_to_o, "plain checkpoint resumed with offload")) check_same(&p_to_o, &full, 3, "plain -> offload");
        if (run(&o_to_p, "offloaded checkpoint resumed plain")) check_same(&o_to_p, &full, 3, "offload -> plain");
        if (run(&p_to_o_wc, "plain checkpoint resumed with offload beside a compute copy"))
            check_same(&p_to_o_wc, &full, 3, "plain -> offload, a compute copy");
    }
    job *all[] = {&full, &half_plain, &half_off, &off_full, &p_to_o, &o_to_p, &p_to_o_wc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) job_free(all[i]);
    tmpdir_remove();
}

// The comparisons on a GPU (see the top), at each device share and with the
// update finished in its step or by the next forward.
static int on_gpu(const char *name) {
    dc_backend *be = NULL;
    if (dc_backend_create(name, &be)) {
        printf("SKIP (no GPU) test_offload %s: %s\n", name, dc_error());
        return 0;
    }
    g_rel = be->compute == DC_F32 ? 1e-5 : 1e-3;
    dc_backend_destroy(be);
    g_backend = name;
    static const char *shares[] = {"0", "0.25", "1"};
    for (int i = 0; i < 3; i++)
        for (int defer = 1; defer >= 0; defer--) {
            g_set = dc_offload_settings_default();
            g_set.device_share = atof(shares[i]);
            if (i == 0 && !defer) g_set.hold = 0;
            g_set.defer = defer;
            char what[4][200];
            const char *kind[4] = {"3 micro-batches, no clipping", "one micro-batch, no clipping",
                                   "3 micro-batches, clipping", "2 micro-batches, recompute"};
            for (int k = 0; k < 4; k++)
                snprintf(what[k], sizeof what[k], "%s, device share %s%s%s: %s", name, shares[i],
                         defer ? "" : ", no deferral", i == 0 && !defer ? ", none held back" : "", kind[k]);
            compare(2, 0.0f, 0, false, what[0]);
            compare(BATCH, 0.0f, 0, false, what[1]);
            compare(2, k_clip, 0, false, what[2]);
            compare(3, 0.0f, 1, false, what[3]);
        }
    free(g_data.images), free(g_data.labels);
    printf("test_offload: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}

int main(int argc, char **argv) {
    openblas_set_num_threads(1);
    tiny_data(&g_data, 12);
    g_set = dc_offload_settings_default();
    if (argc > 1) return on_gpu(argv[1]);
    compare(2, 0.0f, 0, false, "3 micro-batches, no clipping");
    compare(2, k_clip, 0, false, "3 micro-batches, clipping");
    compare(BATCH, 0.0f, 0, false, "one micro-batch, no clipping");
    compare(3, 0.0f, 1, false, "2 micro-batches, recompute (1 block keeps its activations)");
    compare(3, k_clip, 1, false, "2 micro-batches, clipping, recompute");
    compare(2, 0.0f, 0, true, "3 micro-batches, no clipping, a compute copy");
    compare(2, k_clip, 1, true, "3 micro-batches, clipping, recompute, a compute copy");
    // every unit updated on the device (two sets of state buffers), and some (one set)
    g_set.device_share = 1;
    compare(2, 0.0f, 0, false, "3 micro-batches, no clipping, every unit on the device");
    compare(BATCH, 0.0f, 1, true, "one micro-batch, recompute, a compute copy, every unit on the device");
    g_set.device_share = 0.25;
    compare(2, 0.0f, 0, false, "3 micro-batches, no clipping, a quarter of the units on the device");
    g_set.device_share = 0;
    // no unit held back to the end of the update, and all but the last
    g_set.hold = 0;
    compare(2, 0.0f, 0, false, "3 micro-batches, no clipping, no unit held back");
    g_set.hold = 1000;
    compare(2, 0.0f, 0, true, "3 micro-batches, no clipping, a compute copy, all units but the last held back");
    g_set.device_share = 0.25;
    compare(BATCH, 0.0f, 0, false,
            "one micro-batch, no clipping, all units but the last held back, a quarter on the device");
    g_set = dc_offload_settings_default();
    // the update finished within each step, the host not paced
    g_set.defer = false, g_set.pace = false;
    compare(2, 0.0f, 0, false, "3 micro-batches, no clipping, no deferral, host not paced");
    compare(2, k_clip, 0, true, "3 micro-batches, clipping, a compute copy, no deferral, host not paced");
    g_set = dc_offload_settings_default();
    compare_window(false, false, "made with no gradient buffer");
    compare_window(true, false, "made with no gradient buffer, no EMA");
    compare_window(true, true, "made with no gradient buffer, no EMA, a compute copy");
    settings_checked();
    checkpoints();
    refusals();
    free(g_data.images), free(g_data.labels);
    printf("test_offload: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
