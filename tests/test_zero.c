// ZeRO stages 1 and 2 on the thread communicator and the CPU backend, against
// one rank of plain (stage 0) training of a tiny DiT:
// - stages 0, 1 and 2 on 1, 2 and 3 ranks, with gradient clipping active and
//   micro-batch accumulation: weights, EMA and both moments within 1e-6 (the
//   global norm is combined from the shards' norms, so clipping moves the
//   last bits);
// - with clipping off, stages 0, 1 and 2 on 2, 3 and 4 ranks, with one or
//   several micro-batches per rank (and ranks left without images in the
//   last round), are bit-identical to one rank cutting the same
//   micro-batches (each micro-batch's gradients join the step's sum in the
//   global batch's order), and stage 2 with recompute to stage 2 without;
// - checkpoints: a file restored on 2 or 3 ranks and written again is the
//   same bytes; 2 -> 1, 1 -> 2 and 2 -> 3 resumes end within 1e-6 of the
//   uninterrupted run;
// - a rank failing inside a stage-2 bucket fails every rank, without a hang;
// - the per-rank memory accounting: ZeRO-2 on 2 ranks holds at most 60% of
//   ZeRO-0's gradients, master weights, moments and EMA for DiT-S/2, and the
//   accounting matches what the trainer allocates.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "file_bytes.h"
#include "core/error.h"
#include "dist/comm.h"
#include "models/dit.h"
#include "models/model_io.h"
#include "tmpdir.h"
#include "tiny_data.h"
#include "train/trainer.h"
#include "train/zero.h"

// mlp_hidden 80: each block then holds 5376 parameters, which 1, 2 and 3
// ranks' 64-aligned slices tile exactly, so the blocks' weights are gathered
// in place into the compute copy and the embedders and final layer (which
// they do not tile) through a bucket: both paths of dc_zero_update run.
static const dc_dit_config k_model = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 3,
                                      .heads = 2, .mlp_hidden = 80, .num_classes = 2, .learn_sigma = true};
enum { STEPS = 4, BATCH = 6, MAX_RANKS = 4 };
static const float k_clip = 0.02f;  // below every step's norm here: clipping acts each step

static dc_dataset g_data;

typedef struct {
    int stage, micro, steps;  // ZeRO stage, micro-batch, the step to train up to
    float clip;
    const char *resume;       // restore this checkpoint first (NULL: fresh weights)
    bool restore_first;       // restore before dc_trainer_set_comm rather than after
    const char *save;         // write a checkpoint at the end
    int fail_rank, fail_unit; // that rank fails in that unit's bucket (fail_rank 0 never does here)
    int recompute;            // blocks keeping their activations (0: none recompute)
    bool no_ema;              // an EMA decay of 0: the plain state keeps none, ZeRO's shards start from the weights
    float *state[4];          // rank 0's weights, EMA, m, v at the end (gathered)
    int64_t numel;
    double min_norm;          // the smallest gradient norm of the run's steps
    int differ;               // ranks whose compute weights are not rank 0's
    float *rank_w[MAX_RANKS];
    bool mem_ok;              // the accounting matches the shards allocated
    dc_dtype wire;            // gradients between ranks (F32 unless set)
    double loss[STEPS];       // rank 0's step losses
} job;

// Rank `fail_rank`'s hook: fails once unit fail_unit's gradients are done,
// while the other ranks wait in that unit's reduce-scatter.
typedef struct {
    int (*inner)(void *, int, bool);
    void *ctx;
    int unit;
} failing_hook;

static int fail_in_bucket(void *ctx, int unit, bool done) {
    failing_hook *f = ctx;
    if (done && unit == f->unit) return dc_fail("injected failure in the bucket of unit %d", unit);
    return f->inner(f->ctx, unit, done);
}

static int train(dc_comm *c, void *arg) {
    job *j = arg;
    omp_set_num_threads(1);
    dc_backend *be = NULL;
    dc_dit m;
    dc_trainer tr;
    dc_st_file f;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr), memset(&f, 0, sizeof f);
    bool open = false;
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = j->micro, tc.steps = STEPS, tc.lr = 1e-3f, tc.ema_decay = j->no_ema ? 0 : 0.9f;
    tc.hflip = true, tc.grad_clip = j->clip, tc.grad_comm = j->wire;
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_dit_create(&m, &k_model, be, true);
    if (!rc && j->recompute) rc = dc_dit_set_recompute(&m, j->recompute);
    if (!rc && j->resume) rc = dc_st_open(&f, j->resume), open = rc == 0;
    if (!rc) rc = j->resume ? dc_model_load_weights(&m.base, &f, "") : dc_dit_init_weights(&m, 5);
    if (!rc) rc = dc_trainer_init(&tr, &m.base, &g_data, &tc);
    if (!rc && j->resume && j->restore_first) rc = dc_trainer_restore(&tr, &f);
    if (!rc) rc = dc_trainer_set_comm(&tr, c, j->stage);
    if (!rc && j->resume && !j->restore_first) rc = dc_trainer_restore(&tr, &f);
    if (open) dc_st_close(&f);
    dc_param_hooks *hk = m.params.hooks;  // the strategy's (ZeRO-2's), if any
    failing_hook fh = {hk ? hk->unit : NULL, hk ? hk->ctx : NULL, j->fail_unit};
    if (!rc && hk && j->fail_rank == c->rank && c->rank) hk->unit = fail_in_bucket, hk->ctx = &fh;
    double min_norm = INFINITY;
    while (!rc && tr.step < j->steps) {
        dc_step_stats st;
        rc = dc_trainer_step(&tr, &st);
        if (!rc) min_norm = fmin(min_norm, st.grad_norm);
        if (!rc && c->rank == 0 && tr.step <= STEPS) j->loss[tr.step - 1] = st.loss;
    }
    if (!rc && j->save) rc = dc_trainer_save(&tr, j->save, NULL);
    const dc_params *ps = m.base.params;
    int64_t np = ps->numel;
    // the state, gathered (collective), onto rank 0
    float *all = c->rank == 0 && !rc ? malloc(sizeof(float) * DC_STATE_COUNT * (size_t)np) : NULL;
    if (!rc) rc = dc_optimizer_save(tr.opt, all);
    for (int b = 0; b < DC_STATE_COUNT && all && !rc; b++) {
        j->state[b] = malloc(sizeof(float) * (size_t)np);
        memcpy(j->state[b], all + b * np, sizeof(float) * (size_t)np);
    }
    free(all);
    if (!rc) {
        j->rank_w[c->rank] = malloc(sizeof(float) * (size_t)np);
        be->download(be, j->rank_w[c->rank], ps->data.p, sizeof(float) * (size_t)np);
    }
    if (!rc && c->rank == 0) {
        j->numel = np, j->min_norm = min_norm;
        dc_zero_mem mem;
        const dc_zero *z = j->stage ? (const dc_zero *)tr.opt : NULL;
        const dc_optim_plain *plain = j->stage ? NULL : (const dc_optim_plain *)tr.opt;
        // bf16 on the wire: stage 0's copy of the gradients, or a copy of the buckets' room
        const int64_t wire0 = plain && plain->grad16.p ? 2 * np : 0;
        const int64_t wirez = z && z->wbuf.p ? 2 * z->room : 0;
        j->mem_ok = dc_zero_mem_of(ps, c->size, j->stage, be->compute, tc.grad_comm, &mem) == 0 &&
                    (z ? mem.master == 4 * z->shard && mem.moments == 8 * z->shard &&
                             z->room == (j->stage == 2 ? DC_ZERO_RING : 1) * z->bucket &&
                             mem.grads == (j->stage == 1 ? 4 * np : 0) + 4 * z->shard + 4 * z->room + wirez
                       : mem.grads == 4 * np + wire0) &&
                    (tc.grad_comm == DC_F32 || c->size == 1 || wire0 + wirez > 0);
    }
    if (hk && hk->ctx == &fh) hk->unit = fh.inner, hk->ctx = fh.ctx;
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    return rc;
}

static void job_free(job *j) {
    for (int b = 0; b < 4; b++) free(j->state[b]);
    for (int q = 0; q < MAX_RANKS; q++) free(j->rank_w[q]);
}

static double rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (d != d) return INFINITY;
        num = fmax(num, fabs(d)), den = fmax(den, fabs((double)b[i]));
    }
    return num / (den > 0 ? den : 1);
}

// Runs j on `ranks`; the largest error of its state against ref (-1 if it failed).
static double run_against(job *j, int ranks, const job *ref, bool *exact) {
    int rc = dc_comm_threads_run(ranks, train, j);
    CHECK(rc == 0, "stage %d on %d ranks: %s", j->stage, ranks, rc ? dc_error() : "");
    if (rc || !j->state[3]) return -1;
    double e = 0;
    *exact = true;
    for (int b = 0; b < 4; b++) {
        e = fmax(e, rel(j->state[b], ref->state[b], ref->numel));
        *exact = *exact && memcmp(j->state[b], ref->state[b], sizeof(float) * (size_t)ref->numel) == 0;
    }
    int differ = 0;
    for (int q = 0; q < ranks; q++)  // every rank's compute copy is the gathered master
        differ += !j->rank_w[q] || memcmp(j->rank_w[q], j->state[0], sizeof(float) * (size_t)ref->numel) != 0;
    CHECK(differ == 0, "stage %d on %d ranks: %d ranks' weights are not the master's", j->stage, ranks, differ);
    CHECK(j->mem_ok, "stage %d on %d ranks: the memory accounting differs from the allocation", j->stage, ranks);
    return e;
}

// Gradients summed in bf16 (--grad-comm bf16) on 2 ranks against fp32 on 1
// (ref: clipping on, micro-batch 2). Each step's summed gradient carries one
// bf16 rounding, relative 2^-9 = 2e-3 per element; the moments carry it
// (v squared: 4e-3), the weights move by lr x m / sqrt(v), which it changes
// by as little, and the clipping factor (from the rounded gradients' norm)
// by as little again: 1e-2 on every state buffer and on the losses, over
// four steps. The same run in fp32 on 2 ranks must differ from it (the
// option acts). With clipping off and each of 3 ranks' share one
// micro-batch, ZeRO-1 and 2 round and sum the same values as ZeRO-0
// (stage 2 rounds each micro-batch's bucket, here the rank's one): all
// bit-identical.
static void test_bf16_gradients(const job *ref) {
    const float tol = 1e-2f;
    for (int stage = 0; stage <= 2; stage++) {
        job b = {.stage = stage, .micro = 1, .steps = STEPS, .clip = k_clip, .fail_rank = -1, .wire = DC_BF16};
        job f = {.stage = stage, .micro = 1, .steps = STEPS, .clip = k_clip, .fail_rank = -1};
        bool exact, same_as_fp32 = true;
        double e = run_against(&b, 2, ref, &exact);
        double ef = b.state[3] ? run_against(&f, 2, &b, &same_as_fp32) : -1;
        double el = 0;
        for (int s = 0; s < STEPS; s++) el = fmax(el, fabs(b.loss[s] - ref->loss[s]) / fabs(ref->loss[s]));
        printf("  ZeRO-%d, 2 ranks, bf16 gradients: state %.2e, losses %.2e from 1 rank in fp32; %.2e from 2 ranks "
               "in fp32\n", stage, e, el, ef);
        CHECK(e >= 0 && e < tol && el < tol, "ZeRO-%d, bf16 on 2 ranks: state %.2e, losses %.2e from fp32 (tolerance "
              "%g)", stage, e, el, tol);
        CHECK(ef > 0 && !same_as_fp32, "ZeRO-%d, bf16 on 2 ranks: the same state as fp32 (%.2e): the option does "
              "nothing", stage, ef);
        job_free(&b), job_free(&f);
    }
    job z0 = {.stage = 0, .micro = 2, .steps = STEPS, .clip = 0, .fail_rank = -1, .wire = DC_BF16};
    bool exact;
    CHECK(dc_comm_threads_run(3, train, &z0) == 0, "ZeRO-0, bf16 on 3 ranks: %s", dc_error());
    for (int stage = 1; stage <= 2 && z0.state[3]; stage++) {
        job j = {.stage = stage, .micro = 2, .steps = STEPS, .clip = 0, .fail_rank = -1, .wire = DC_BF16};
        double e = run_against(&j, 3, &z0, &exact);
        printf("  ZeRO-%d, bf16 gradients on 3 ranks: %.2e from ZeRO-0's, %s\n", stage, e,
               exact ? "bit-identical" : "not bit-identical");
        CHECK(exact, "ZeRO-%d, bf16 on 3 ranks: %.2e from ZeRO-0, not bit-identical", stage, e);
        job_free(&j);
    }
    job_free(&z0);
    // one rank sends nothing: bf16 changes nothing
    job one = {.stage = 0, .micro = 2, .steps = STEPS, .clip = k_clip, .fail_rank = -1, .wire = DC_BF16};
    double e1 = run_against(&one, 1, ref, &exact);
    CHECK(e1 == 0 && exact, "bf16 on 1 rank: %.2e from fp32, not bit-identical", e1);
    job_free(&one);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL test_zero: a collective hung (60 s)\n";
    if (write(1, m, sizeof m - 1)) {}
    _exit(1);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(60);
    openblas_set_num_threads(1);  // rounding must not depend on the threads beside each rank
    tiny_data(&g_data, 12);
    if (tmpdir_make("zero")) return 1;

    // stages x ranks, clipping on, several micro-batches per rank
    job ref = {.stage = 0, .micro = 2, .steps = STEPS, .clip = k_clip, .fail_rank = -1};
    CHECK(dc_comm_threads_run(1, train, &ref) == 0, "1 rank: %s", dc_error());
    printf("  reference: 1 rank, %lld parameters, smallest gradient norm %.4f (clipped at %g)\n",
           (long long)ref.numel, ref.min_norm, k_clip);
    CHECK(ref.min_norm > k_clip, "clipping acts on every step (smallest norm %g)", ref.min_norm);
    for (int stage = 0; stage <= 2; stage++)
        for (int ranks = 1; ranks <= 3; ranks++) {
            job j = {.stage = stage, .micro = 1, .steps = STEPS, .clip = k_clip, .fail_rank = -1};
            bool exact;
            double e = run_against(&j, ranks, &ref, &exact);
            printf("  ZeRO-%d, %d ranks, micro-batch 1: weights/EMA/m/v within %.2e of 1 rank%s\n", stage, ranks, e,
                   exact ? " (bit-identical)" : "");
            CHECK(e >= 0 && e < 1e-6, "ZeRO-%d on %d ranks: %.2e from 1 rank", stage, ranks, e);
            job_free(&j);
        }
    // Clipping off, the ranks cutting the batch into one rank's micro-batches:
    // every stage adds the same numbers in the same order as one rank, one
    // micro-batch at a time (bit-identical): each rank's 2 images one of one
    // rank's micro-batches of 2; micro-batches of 1 in rounds of 2, 3 and 4
    // images (ranks 2 and 3 of 4 have none in the second round of 4, and
    // still take part in ZeRO-2's reduce-scatters).
    job ref0 = {.stage = 0, .micro = 2, .steps = STEPS, .clip = 0, .fail_rank = -1};
    job ref1 = {.stage = 0, .micro = 1, .steps = STEPS, .clip = 0, .fail_rank = -1};
    CHECK(dc_comm_threads_run(1, train, &ref0) == 0 && dc_comm_threads_run(1, train, &ref1) == 0, "1 rank: %s",
          dc_error());
    bool exact;
    for (int stage = 0; stage <= 2; stage++) {
        job j = {.stage = stage, .micro = 2, .steps = STEPS, .clip = 0, .fail_rank = -1};
        double e = run_against(&j, 3, &ref0, &exact);
        printf("  ZeRO-%d, 3 ranks of 2 images, no clipping: %.2e from 1 rank, %s\n", stage, e,
               exact ? "bit-identical" : "not bit-identical");
        CHECK(exact, "ZeRO-%d, 3 ranks of 2 images: %.2e from 1 rank, not bit-identical", stage, e);
        job_free(&j);
        for (int ranks = 2; ranks <= 4; ranks++) {
            job k = {.stage = stage, .micro = 1, .steps = STEPS, .clip = 0, .fail_rank = -1};
            e = run_against(&k, ranks, &ref1, &exact);
            printf("  ZeRO-%d, %d ranks, micro-batches of 1 image, no clipping: %.2e from 1 rank, %s\n", stage,
                   ranks, e, exact ? "bit-identical" : "not bit-identical");
            CHECK(exact, "ZeRO-%d, %d ranks of micro-batches of 1: %.2e from 1 rank, not bit-identical", stage,
                  ranks, e);
            job_free(&k);
        }
    }
    job_free(&ref1);
    // a decay of 0: one rank keeps no EMA (the weights stand for it); the
    // ranks' EMA shards start from the weights and stay them
    job r0 = {.stage = 0, .micro = 2, .steps = STEPS, .clip = 0, .fail_rank = -1, .no_ema = true};
    CHECK(dc_comm_threads_run(1, train, &r0) == 0, "1 rank, no EMA: %s", dc_error());
    CHECK(r0.state[0] && !memcmp(r0.state[0], r0.state[1], sizeof(float) * (size_t)r0.numel),
          "1 rank, no EMA: the EMA saved is not the weights");
    for (int stage = 1; stage <= 2; stage++) {
        job j = {.stage = stage, .micro = 2, .steps = STEPS, .clip = 0, .fail_rank = -1, .no_ema = true};
        double e = run_against(&j, 3, &r0, &exact);
        CHECK(exact, "ZeRO-%d, 3 ranks, no EMA: %.2e from 1 rank, not bit-identical", stage, e);
        job_free(&j);
    }
    job_free(&r0);
    // stage 2 with activation checkpointing: the recomputed blocks hand over
    // the same gradients
    job plain = {.stage = 2, .micro = 1, .steps = STEPS, .clip = k_clip, .fail_rank = -1};
    job redo = {.stage = 2, .micro = 1, .steps = STEPS, .clip = k_clip, .fail_rank = -1, .recompute = 1};
    CHECK(dc_comm_threads_run(2, train, &plain) == 0, "ZeRO-2 on 2 ranks: %s", dc_error());
    double er = plain.state[3] ? run_against(&redo, 2, &plain, &exact) : -1;
    CHECK(er == 0 && exact, "ZeRO-2 with recompute: %.2e from without, not bit-identical", er);
    job_free(&plain), job_free(&redo);

    test_bf16_gradients(&ref);

    // checkpoints: one file whatever the rank count
    char ck1[256], ck2[256], again2[256], again3[256];
    snprintf(ck1, sizeof ck1, "%s", tmp_path("one.safetensors"));
    snprintf(ck2, sizeof ck2, "%s", tmp_path("two.safetensors"));
    snprintf(again2, sizeof again2, "%s", tmp_path("again2.safetensors"));
    snprintf(again3, sizeof again3, "%s", tmp_path("again3.safetensors"));
    job a = {.stage = 0, .micro = 2, .steps = STEPS / 2, .clip = k_clip, .save = ck1, .fail_rank = -1};
    CHECK(dc_comm_threads_run(1, train, &a) == 0, "1 rank to step %d: %s", STEPS / 2, dc_error());
    job_free(&a);
    // restored onto shards and gathered again, with no step between: the same bytes
    job b2 = {.stage = 2, .micro = 2, .steps = STEPS / 2, .clip = k_clip, .resume = ck1, .save = again2,
              .fail_rank = -1};
    job b3 = {.stage = 1, .micro = 2, .steps = STEPS / 2, .clip = k_clip, .resume = ck1, .restore_first = true,
              .save = again3, .fail_rank = -1};
    CHECK(dc_comm_threads_run(2, train, &b2) == 0, "restore on 2 ranks: %s", dc_error());
    CHECK(dc_comm_threads_run(3, train, &b3) == 0, "restore on 3 ranks: %s", dc_error());
    CHECK(same_file(ck1, again2), "a checkpoint restored on 2 ranks (ZeRO-2) and saved is the same file");
    CHECK(same_file(ck1, again3), "a checkpoint restored on 3 ranks (ZeRO-1) and saved is the same file");
    job_free(&b2), job_free(&b3);
    // resumes against the uninterrupted run (ref)
    job w2 = {.stage = 2, .micro = 1, .steps = STEPS / 2, .clip = k_clip, .save = ck2, .fail_rank = -1};
    CHECK(dc_comm_threads_run(2, train, &w2) == 0, "2 ranks to step %d: %s", STEPS / 2, dc_error());
    job_free(&w2);
    const struct { const char *from, *what; int ranks, stage; bool first; } resumes[] = {
        {ck2, "2 -> 1 (ZeRO-2 -> 0)", 1, 0, true},
        {ck1, "1 -> 2 (ZeRO-0 -> 2)", 2, 2, false},
        {ck2, "2 -> 3 (ZeRO-2 -> 1)", 3, 1, true},
    };
    for (size_t k = 0; k < sizeof resumes / sizeof *resumes; k++) {
        job j = {.stage = resumes[k].stage, .micro = 1, .steps = STEPS, .clip = k_clip, .resume = resumes[k].from,
                 .restore_first = resumes[k].first, .fail_rank = -1};
        bool exact;
        double e = run_against(&j, resumes[k].ranks, &ref, &exact);
        printf("  resume %s: %.2e from the uninterrupted run%s\n", resumes[k].what, e, exact ? " (bit-identical)" : "");
        CHECK(e >= 0 && e < 1e-6, "resume %s: %.2e", resumes[k].what, e);
        job_free(&j);
    }

    // a rank failing in a stage-2 bucket stops every rank
    job bad = {.stage = 2, .micro = 1, .steps = STEPS, .clip = k_clip, .fail_rank = 1, .fail_unit = 2};
    int rc = dc_comm_threads_run(3, train, &bad);
    CHECK(rc != 0 && strstr(dc_error(), "rank 1 of 3 failed") && strstr(dc_error(), "bucket of unit 2"),
          "a failure in a bucket fails every rank with its message: %s", rc ? dc_error() : "it succeeded");
    job_free(&bad);

    // memory: DiT-S/2 (33M parameters), per rank
    dc_backend *be = NULL;
    dc_dit s2;
    dc_dit_config cs;
    memset(&s2, 0, sizeof s2);
    CHECK(dc_backend_create("cpu", &be) == 0 && dc_dit_config_from_name("DiT-S/2", &cs) == 0 &&
          dc_dit_create(&s2, &cs, be, false) == 0, "DiT-S/2: %s", dc_error());
    dc_zero_mem z0, z1, z2;
    printf("  DiT-S/2, %.1fM parameters, per-rank MiB (grads + master + moments + EMA; bf16 compute):\n",
           s2.params.numel / 1e6);
    for (int n = 1; n <= 8; n *= 2) {
        CHECK(dc_zero_mem_of(&s2.params, n, 0, DC_BF16, DC_F32, &z0) == 0 &&
              dc_zero_mem_of(&s2.params, n, 1, DC_BF16, DC_F32, &z1) == 0 &&
              dc_zero_mem_of(&s2.params, n, 2, DC_BF16, DC_F32, &z2) == 0, "accounting: %s", dc_error());
        double s0 = (double)dc_zero_mem_state(&z0);
        printf("    %d ranks: ZeRO-0 %.0f, ZeRO-1 %.0f (%.0f%%), ZeRO-2 %.0f (%.0f%%)\n", n, s0 / 1048576.0,
               dc_zero_mem_state(&z1) / 1048576.0, 100.0 * dc_zero_mem_state(&z1) / s0,
               dc_zero_mem_state(&z2) / 1048576.0, 100.0 * dc_zero_mem_state(&z2) / s0);
        if (n == 2)
            CHECK(dc_zero_mem_state(&z2) <= 0.6 * s0, "ZeRO-2 on 2 ranks: %.1f%% of ZeRO-0",
                  100.0 * dc_zero_mem_state(&z2) / s0);
    }
    CHECK(dc_zero_mem_of(&s2.params, 2, 3, DC_BF16, DC_F32, &z0) != 0, "stage 3 is refused");
    dc_dit_free(&s2);

    // refusals: a stage that does not exist, a device communicator for the CPU
    // backend, a stage set after the first step
    dc_dit m;
    dc_trainer tr;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr);
    dc_train_config tc = dc_train_config_default();
    tc.batch = 2, tc.micro_batch = 2;
    dc_comm gpu = {.rank = 0, .size = 2, .device = true};
    CHECK(dc_dit_create(&m, &k_model, be, true) == 0 && dc_trainer_init(&tr, &m.base, &g_data, &tc) == 0,
          "setup: %s", dc_error());
    CHECK(dc_trainer_set_comm(&tr, &gpu, 3) != 0 && strstr(dc_error(), "--zero 3"), "stage 3: %s", dc_error());
    CHECK(dc_trainer_set_comm(&tr, &gpu, 1) != 0 && strstr(dc_error(), "GPU communicator"), "device comm: %s",
          dc_error());
    dc_step_stats st;
    CHECK(dc_trainer_step(&tr, &st) == 0, "a step: %s", dc_error());
    CHECK(dc_trainer_set_comm(&tr, &gpu, 0) != 0 && strstr(dc_error(), "before the first step"),
          "ranks after a step: %s", dc_error());
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    dc_backend_destroy(be);

    job_free(&ref), job_free(&ref0);
    free(g_data.images), free(g_data.labels);
    tmpdir_remove();
    printf("test_zero: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
