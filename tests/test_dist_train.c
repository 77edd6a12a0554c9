// Data-parallel training on N ranks (threads, CPU backend) against one rank:
// the same global batches, randomness keyed by each image's place in the
// global batch, gradients summed over ranks. Each micro-batch's gradients
// start from zero and join the step's sum in the global batch's order
// (trainer.h), so wherever N ranks cut the batch into the micro-batches one
// rank cuts (1 to 6 ranks, one or several micro-batches each, ranks left
// without images in the last round) the weights, EMA and losses are bit for
// bit one rank's; where they cut it otherwise, within 1e-6. One rank with
// another micro-batch must differ, or the comparison could not tell.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "dist/comm.h"
#include "models/dit_io.h"
#include "tiny_data.h"
#include "train/trainer.h"

static const dc_dit_config k_model = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 2,
                                      .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};
enum { STEPS = 6, BATCH = 6 };  // three epochs of the 12 images, each with its own order

static dc_dataset g_data;

typedef struct {
    int micro_batch;
    float *weights, *ema;  // rank 0's, at the end
    int64_t numel;
    double loss[STEPS];
    int same;              // ranks whose weights equal rank 0's exactly (counted by rank 0 last)
    float *rank_w[8];
} result;

static int train(dc_comm *c, void *arg) {
    result *res = arg;
    omp_set_num_threads(1);
    dc_backend *be = NULL;
    dc_dit m;
    dc_trainer tr;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr);
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = res->micro_batch, tc.steps = STEPS, tc.lr = 1e-3f, tc.ema_decay = 0.9f;
    tc.hflip = true;
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_dit_create(&m, &k_model, be, true);
    if (!rc) rc = dc_dit_init_weights(&m, 5);
    if (!rc) rc = dc_trainer_init(&tr, &m.base, &g_data, &tc);
    if (!rc) rc = dc_trainer_set_comm(&tr, c, 0);
    for (int s = 0; s < STEPS && !rc; s++) {
        dc_step_stats st;
        rc = dc_trainer_step(&tr, &st);
        if (!rc && c->rank == 0) res->loss[s] = st.loss;
    }
    const dc_params *ps = m.base.params;
    if (!rc) {
        float *w = malloc(sizeof(float) * (size_t)ps->numel);
        be->download(be, w, ps->data.p, sizeof(float) * (size_t)ps->numel);
        res->rank_w[c->rank] = w;
        if (c->rank == 0) {
            res->numel = ps->numel;
            res->weights = w;
            res->ema = malloc(sizeof(float) * (size_t)ps->numel);
            be->download(be, res->ema, ((const dc_optim_plain *)tr.opt)->ema.p, sizeof(float) * (size_t)ps->numel);
        }
    }
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    return rc;
}

static double rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num = fmax(num, fabs(d)), den = fmax(den, fabs((double)b[i]));
        if (d != d) return INFINITY;
    }
    return num / (den > 0 ? den : 1);
}

static int run(result *r, int ranks, int micro) {
    *r = (result){.micro_batch = micro};
    int rc = dc_comm_threads_run(ranks, train, r);
    CHECK(rc == 0, "%d ranks, micro-batch %d: %s", ranks, micro, rc ? dc_error() : "");
    return rc || !r->weights ? -1 : 0;
}

static void result_free(result *r, int ranks) {
    for (int q = 0; q < ranks; q++) free(r->rank_w[q]);
    free(r->ema);
}

int main(void) {
    // Matrix products split their work by the thread count, and so their
    // rounding: one thread each, whatever ranks run beside them.
    openblas_set_num_threads(1);
    tiny_data(&g_data, 12);
    result one[4];  // one rank with micro-batches of 1, 2 and 3
    for (int mb = 1; mb <= 3; mb++) run(&one[mb], 1, mb);
    const struct { int ranks, micro; bool exact; } runs[] = {
        {2, 1, true},   // rounds of 2 images: 3 micro-batches per rank
        {3, 1, true},   // rounds of 3: 2 per rank
        {4, 1, true},   // rounds of 4 and 2: ranks 2 and 3 have none in the second
        {6, 1, true},   // one image each
        {3, 2, true},   // each rank's 2 images one of one rank's micro-batches of 2
        {2, 3, true},
        {4, 2, false},  // 2 + 2 + 1 + 1: one rank's micro-batches of 2 regrouped
    };
    if (one[1].weights && one[2].weights) {  // another grouping of the sums shows
        double e = rel(one[2].weights, one[1].weights, one[1].numel);
        printf("  1 rank, micro-batch 2 against 1: weights %.2e\n", e);
        CHECK(e > 0, "micro-batches of 1 and 2 end bit-identical: the comparison cannot tell sums apart");
    }
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        const result *ref = &one[runs[k].micro];
        result r;
        if (run(&r, runs[k].ranks, runs[k].micro) || !ref->weights) continue;
        double ew = rel(r.weights, ref->weights, ref->numel), ee = rel(r.ema, ref->ema, ref->numel);
        double el = 0;
        for (int s = 0; s < STEPS; s++) el = fmax(el, fabs(r.loss[s] - ref->loss[s]) / fabs(ref->loss[s]));
        int differ = 0;
        for (int q = 1; q < runs[k].ranks; q++)
            differ += r.rank_w[q] && memcmp(r.rank_w[q], r.weights, sizeof(float) * (size_t)ref->numel) != 0;
        const bool same = memcmp(r.weights, ref->weights, sizeof(float) * (size_t)ref->numel) == 0 &&
                          memcmp(r.ema, ref->ema, sizeof(float) * (size_t)ref->numel) == 0 && el == 0;
        printf("  %d ranks, micro-batch %d: weights %.2e, EMA %.2e, losses %.2e from 1 rank%s\n", runs[k].ranks,
               runs[k].micro, ew, ee, el, same ? " (bit-identical)" : "");
        CHECK(differ == 0, "%d ranks: %d ranks end with other weights than rank 0", runs[k].ranks, differ);
        CHECK(ew < 1e-6 && ee < 1e-6 && el < 1e-6, "%d ranks: %.2e from 1 rank", runs[k].ranks, ew);
        if (runs[k].exact)
            CHECK(same, "%d ranks of micro-batch %d: weights %.2e, EMA %.2e, losses %.2e from one rank's, not "
                  "bit-identical", runs[k].ranks, runs[k].micro, ew, ee, el);
        result_free(&r, runs[k].ranks);
    }
    for (int mb = 1; mb <= 3; mb++) result_free(&one[mb], 1);
    free(g_data.images), free(g_data.labels);
    printf("test_dist_train: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
