// The EMA warm-up (dc_train_config.ema_warmup), against diffusers:
// - the decay of every update, for steps 1 to 10^6 and several --ema-decay
//   values, equals diffusers' EMAModel.get_decay (use_ema_warmup False,
//   update_after_step 0, min_decay 0), transcribed below from
//   diffusers/training_utils.py as it counts steps (optimization_step is
//   raised before get_decay reads it), plus values worked out by hand;
//   without the warm-up the decay is --ema-decay from the first step;
// - training a tiny DiT on the CPU, the trainer's EMA after every step is the
//   EMA recomputed here in double from the weights each step left, with
//   those decays (to fp32 rounding, 1e-6); after the first step, whose decay
//   is 0, it is the weights bit for bit; fixed tensors (pos_embed) keep their
//   EMA; without the warm-up the first step's EMA is 0.9 w0 + 0.1 w1;
// - the setting is recorded in the checkpoint's training settings, read back
//   either way, and a checkpoint written before it existed (no
//   "ema_warmup") reads as off, the way it was trained.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "models/dit.h"
#include "tiny_data.h"
#include "train/trainer.h"

// diffusers' EMAModel.get_decay(optimization_step), use_ema_warmup False:
//     step = max(0, optimization_step - self.update_after_step - 1)
//     if step <= 0: return 0.0
//     cur_decay_value = (1 + step) / (10 + step)
//     cur_decay_value = min(cur_decay_value, self.decay)
//     cur_decay_value = max(cur_decay_value, self.min_decay)
// EMAModel.step adds 1 to optimization_step first, so the update after the
// k-th optimizer step reads optimization_step = k.
static double diffusers_decay(long optimization_step, double decay) {
    const long update_after_step = 0;
    const double min_decay = 0.0;
    long step = optimization_step - update_after_step - 1;
    if (step < 0) step = 0;
    if (step <= 0) return 0.0;
    double cur = (1.0 + (double)step) / (10.0 + (double)step);
    cur = cur < decay ? cur : decay;
    return cur > min_decay ? cur : min_decay;
}

static void test_formula(void) {
    const float decays[] = {0.998f, 0.9999f, 0.5f, 0.0f, 1.0f};
    for (size_t i = 0; i < sizeof decays / sizeof *decays; i++) {
        dc_train_config c = dc_train_config_default();
        c.ema_decay = decays[i];
        long bad = 0, bad_off = 0, first = -1;
        for (long k = 1; k <= 1000000; k++) {
            c.ema_warmup = true;
            float got = dc_train_ema_decay(&c, k), want = (float)diffusers_decay(k, (double)decays[i]);
            if (got != want && !bad++) first = k;
            c.ema_warmup = false;
            bad_off += dc_train_ema_decay(&c, k) != decays[i];
        }
        CHECK(bad == 0, "--ema-decay %g: %ld of 10^6 decays differ from diffusers' (first at step %ld)", decays[i],
              bad, first);
        CHECK(bad_off == 0, "--ema-decay %g without warm-up: %ld decays are not %g", decays[i], bad_off, decays[i]);
    }
    // by hand: k / (9 + k) below the cap
    dc_train_config c = dc_train_config_default();
    c.ema_decay = 0.998f;
    const struct { long k; float want; } hand[] = {
        {1, 0.0f}, {2, 2.0f / 11.0f}, {11, 0.55f}, {91, 0.91f}, {991, 0.991f}, {4491, 0.998f}, {100000, 0.998f},
    };
    for (size_t i = 0; i < sizeof hand / sizeof *hand; i++)
        CHECK(dc_train_ema_decay(&c, hand[i].k) == hand[i].want, "step %ld: decay %.9g, want %.9g", hand[i].k,
              dc_train_ema_decay(&c, hand[i].k), hand[i].want);
    CHECK(dc_train_config_default().ema_warmup, "the default recipe has the warm-up");
}

static const dc_dit_config k_model = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 2,
                                      .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};
enum { STEPS = 30 };

// Trains STEPS steps; the trainer's EMA after each against the EMA of the
// weights recomputed in double. Returns the largest relative error.
static double trajectory(bool warmup, const dc_dataset *ds, bool *first_exact, bool *fixed_kept) {
    dc_backend *be = NULL;
    dc_dit m;
    dc_trainer tr;
    memset(&m, 0, sizeof m), memset(&tr, 0, sizeof tr);
    dc_train_config tc = dc_train_config_default();
    tc.batch = tc.micro_batch = 4, tc.steps = STEPS, tc.lr = 1e-2f, tc.ema_decay = 0.9f, tc.ema_warmup = warmup;
    double worst = INFINITY;
    if (dc_backend_create("cpu", &be) || dc_dit_create(&m, &k_model, be, true) || dc_dit_init_weights(&m, 7) ||
        dc_trainer_init(&tr, &m.base, ds, &tc)) {
        printf("setup: %s\n", dc_error());
        goto out;
    }
    const dc_params *ps = m.base.params;
    const int64_t n = ps->numel;
    float *w = malloc(sizeof(float) * (size_t)n), *ema = malloc(sizeof(float) * (size_t)n);
    double *ref = malloc(sizeof(double) * (size_t)n);
    be->download(be, w, ps->data.p, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ref[i] = w[i];  // the EMA starts as the weights
    worst = 0;
    *first_exact = *fixed_kept = true;
    for (int s = 1; s <= STEPS; s++) {
        if (dc_trainer_step(&tr, NULL) || dc_trainer_sync(&tr)) {
            printf("step %d: %s\n", s, dc_error());
            worst = INFINITY;
            break;
        }
        be->download(be, w, ps->data.p, sizeof(float) * (size_t)n);
        be->download(be, ema, ((const dc_optim_plain *)tr.opt)->ema.p, sizeof(float) * (size_t)n);
        const double d = warmup ? diffusers_decay(s, 0.9f) : 0.9f;
        double num = 0, den = 0;
        int64_t pos = 0, lo, hi, at = 0;
        while (dc_params_next_run(ps, &pos, n, &lo, &hi)) {  // trainable runs; the rest is fixed
            for (int64_t i = at; i < lo; i++) *fixed_kept &= ema[i] == (float)ref[i];
            for (int64_t i = lo; i < hi; i++) {
                ref[i] = d * ref[i] + (1 - d) * w[i];
                num = fmax(num, fabs(ema[i] - ref[i])), den = fmax(den, fabs(ref[i]));
                if (s == 1) *first_exact &= memcmp(&ema[i], &w[i], sizeof(float)) == 0;
                if (!isfinite(ema[i])) num = INFINITY;
            }
            at = hi;
        }
        worst = fmax(worst, num / den);
    }
    free(w), free(ema), free(ref);
out:
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    return worst;
}

static void test_training(void) {
    dc_dataset ds;
    tiny_data(&ds, 12);
    bool exact = false, kept = false;
    double e = trajectory(true, &ds, &exact, &kept);
    printf("  with warm-up: the EMA within %.2e of the recomputed one over %d steps\n", e, STEPS);
    CHECK(e < 1e-6, "with warm-up: the EMA is %.2e from the one recomputed from the weights", e);
    CHECK(exact, "with warm-up: the first step's EMA (decay 0) is not the weights bit for bit");
    CHECK(kept, "with warm-up: a fixed tensor's EMA moved");
    double eo = trajectory(false, &ds, &exact, &kept);
    printf("  without: %.2e\n", eo);
    CHECK(eo < 1e-6, "without warm-up: the EMA is %.2e from the one recomputed from the weights", eo);
    CHECK(!exact, "without warm-up: the first step's EMA is the weights (the decay was not applied)");
    dc_dataset_free(&ds);
}

// The setting in the checkpoint's training settings, read back; absent (an
// older checkpoint) it is off.
static void test_recorded(void) {
    for (int on = 0; on <= 1; on++) {
        dc_train_config c = dc_train_config_default(), back = dc_train_config_default();
        c.ema_warmup = on;
        back.ema_warmup = !on;
        dc_kv kv = {0};
        CHECK(dc_train_config_to_kv(&c, &kv) == 0, "to_kv: %s", dc_error());
        CHECK(dc_train_config_from_kv(&back, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n,
                                      "x") == 0 && back.ema_warmup == (bool)on,
              "ema_warmup %d read back as %d (%s)", on, back.ema_warmup, dc_error());
        int kept = 0;  // the same settings without the key
        for (int i = 0; i < kv.n; i++)
            if (strcmp(kv.keys[i], "ema_warmup")) kv.keys[kept] = kv.keys[i], kv.values[kept++] = kv.values[i];
            else free(kv.keys[i]), free(kv.values[i]);
        kv.n = kept;
        back.ema_warmup = true;
        CHECK(dc_train_config_from_kv(&back, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n,
                                      "old") == 0 && !back.ema_warmup,
              "a checkpoint without ema_warmup reads as %d (%s)", back.ema_warmup, dc_error());
        dc_kv_free(&kv);
    }
}

int main(void) {
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
    test_formula();
    test_training();
    test_recorded();
    printf("test_ema: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
