// The training memory planner (train/plan.h):
// - memory sizes parse with binary units and junk is refused;
// - on the CPU backend, whose every allocation is counted here by wrapping its
//   alloc and free, the predicted peak equals the bytes the trainer and model
//   really hold at their peak (setting up and over two steps), for plans with
//   and without offload (the model made with no full gradient buffer, as
//   `train --offload` makes it; with an EMA and with a decay of 0, which keeps
//   none), recompute and accumulation (whose micro-batches the
//   CPU sums apart, in a second gradient buffer at stage 0), and updating in
//   the backward (no full gradient buffer; a unit's window); the activation prediction
//   equals the arena dc_dit_reserve allocates; and on 2 ranks (threads, each
//   rank's backend counted on its own) for ZeRO stages 0, 1 and 2 with the
//   gradients summed in fp32 and in bf16 (whose bf16 copies the plan adds);
// - the planner never picks a slower plan for a larger budget, refuses a budget
//   below the smallest plan naming its size, and for DiT-XL/2 at batch 64 in
//   bf16 with 8 GiB picks offload with recompute, predicted under 8 GiB;
// - for a DreamBooth step of SD 1.5's UNet (batch 1, no EMA, clipping) a
//   budget between the plans picks updating in the backward, which needs 4
//   bytes a parameter less than the plain plan, and no budget that fits the
//   plain plan does; without clipping it costs 2% more than the plain plan,
//   with clipping 5/3 (its backward twice); a fused plan on several ranks or with accumulation is refused;
// - a LoRA's plan counts its frozen base's weights beside the factors' state.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "dist/comm.h"
#include "models/dit.h"
#include "models/lora_model.h"
#include "models/registry.h"
#include "models/sd_lora.h"
#include "models/unet.h"
#include "tiny_data.h"
#include "train/plan.h"
#include "train/trainer.h"

#define GIB 1073741824.0
// The CUDA backend's own workspaces: 64 MiB for cuBLASLt, 4 MiB of doubles for
// the normalisations (cuda_backend.cu), as its memory() counts them.
static const int64_t k_cuda_fixed = (64 << 20) + (1 << 19) * 8;

static void test_sizes(void) {
    struct { const char *s; int64_t want; } ok[] = {
        {"8G", 8LL << 30}, {"8GiB", 8LL << 30}, {"7.5G", 15LL << 29}, {"8000M", 8000LL << 20},
        {"8000MiB", 8000LL << 20}, {"512k", 512LL << 10}, {"1T", 1LL << 40},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t b = 0;
        int rc = dc_parse_size(ok[i].s, &b);
        CHECK(rc == 0 && b == ok[i].want, "'%s' -> %lld (rc %d), want %lld", ok[i].s, (long long)b, rc,
              (long long)ok[i].want);
    }
    const char *bad[] = {"", "8", "G", "8X", "-1G", "0G", "8GB", "8Gi", "8 G", " 8G", "nanG", "infG", "1e30G", "8G8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t b = -7;
        CHECK(dc_parse_size(bad[i], &b) != 0 && b == -7, "'%s' was accepted as %lld bytes", bad[i], (long long)b);
    }
}

#include "count_alloc.h"

static const dc_dit_config k_tiny = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 3,
                                     .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};
enum { BATCH = 6 };
static dc_model *g_tiny;  // k_tiny as a layout: sized, nothing allocated (what the planner is given)

// Trains two steps of plan p on the counted backend, the model made as
// `train` makes it (for offload with no full gradient buffer); no_ema: an
// EMA decay of 0. The peak it held.
static int64_t measured_peak(counter *k, const dc_dataset *ds, const dc_train_plan *p, bool no_ema) {
    dc_backend *be = &k->be;
    counter_reset(k, 0);
    dc_model *m = NULL;
    dc_trainer tr = {0};
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = p->micro_batch, tc.steps = 2, tc.offload = p->offload;
    tc.update_in_backward = p->fused, tc.grad_clip = p->fused ? 0.5f : 0;  // (two passes: the same bytes)
    if (no_ema) tc.ema_decay = 0;
    int64_t peak = -1;
    if (!dc_dit_new(&k_tiny, be, p->offload || p->fused ? DC_GRAD_WINDOW : DC_GRAD_BUFFER, &m) &&
        !dc_model_set_recompute(m, p->keep) &&
        !dc_model_init_weights(m, 1) && !dc_trainer_init(&tr, m, ds, &tc) && !dc_trainer_step(&tr, NULL) &&
        !dc_trainer_step(&tr, NULL))
        peak = k->peak;
    else
        printf("training failed: %s\n", dc_error());
    dc_trainer_free(&tr);
    dc_model_free(m);
    CHECK(k->now == 0, "%lld bytes still held after freeing everything", (long long)k->now);
    return peak;
}

static void test_exact_on_cpu(void) {
    static counter k;  // large: not on the stack
    if (counter_init(&k)) return;
    dc_dataset ds;
    tiny_data(&ds, 12);
    dc_plan_request r = {.model = g_tiny, .compute = k.be.compute, .fixed = 0, .batch = BATCH, .ranks = 1,
                         .zero = 0, .micro_batch = 0, .keep = -1, .offload = -1, .folds = true};
    const dc_train_plan plans[] = {{6, 3, false, false, false}, {6, 0, false, false, false},
                                   {3, 1, false, false, false}, {2, 3, true, false, false},
                                   {6, 0, true, false, false},  {1, 2, true, false, false},
                                   {4, 0, false, false, false}, {6, 3, false, true, false},
                                   {6, 0, false, true, false}};
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        const dc_train_plan *p = &plans[i];
        dc_plan_mem pm;
        for (int no_ema = 0; no_ema < 2; no_ema++) {  // a decay of 0: offload keeps no EMA
            r.no_ema = no_ema;
            CHECK(dc_plan_predict(&r, p, &pm) == 0, "predict: %s", dc_error());
            int64_t got = measured_peak(&k, &ds, p, no_ema);
            CHECK(got == pm.peak, "micro %d keep %d offload %d fused %d no EMA %d: predicted %lld bytes, the backend "
                  "held %lld", p->micro_batch, p->keep, p->offload, p->fused, no_ema, (long long)pm.peak,
                  (long long)got);
        }
        // the arena alone: what the reserve allocates
        dc_model *m = NULL;
        counter_reset(&k, 0);
        if (dc_dit_new(&k_tiny, &k.be, true, &m) == 0) {
            int64_t before = k.now;
            CHECK(dc_model_set_recompute(m, p->keep) == 0 && dc_model_reserve(m, p->micro_batch) == 0,
                  "reserve: %s", dc_error());
            CHECK(k.now - before == pm.activations, "keep %d micro %d: arena %lld bytes, predicted %lld", p->keep,
                  p->micro_batch, (long long)(k.now - before), (long long)pm.activations);
        }
        dc_model_free(m);
    }
    dc_dataset_free(&ds);
    counter_free(&k);
}

// ---- several ranks: each rank's backend counted on its own --------------------------
typedef struct {
    dc_plan_request r;
    dc_train_plan p;
    const dc_dataset *ds;
    int64_t peak[2];  // each rank's
} ranks_job;

// Two steps of the job's plan on this rank's counted backend.
static int rank_train(dc_comm *c, void *arg) {
    ranks_job *j = arg;
    counter *k = malloc(sizeof *k);
    if (!k || counter_init(k)) return free(k), dc_fail("no CPU backend");
    dc_model *m = NULL;
    dc_trainer tr = {0};
    dc_train_config tc = dc_train_config_default();
    tc.batch = j->r.batch, tc.micro_batch = j->p.micro_batch, tc.steps = 2, tc.grad_comm = j->r.grad_comm;
    int rc = dc_dit_new(&k_tiny, &k->be, true, &m) || dc_model_set_recompute(m, j->p.keep) ||
             dc_model_init_weights(m, 1) || dc_trainer_init(&tr, m, j->ds, &tc) ||
             dc_trainer_set_comm(&tr, c, j->r.zero) || dc_trainer_step(&tr, NULL) || dc_trainer_step(&tr, NULL);
    j->peak[c->rank] = rc ? -1 : k->peak;
    dc_trainer_free(&tr);
    dc_model_free(m);
    if (!rc && k->now != 0) rc = dc_fail("rank %d: %lld bytes still held after freeing everything", c->rank,
                                         (long long)k->now);
    counter_free(k);
    free(k);
    return rc ? -1 : 0;
}

static void test_ranks_on_cpu(void) {
    dc_dataset ds;
    tiny_data(&ds, 12);
    const dc_train_plan plans[] = {{3, 3, false, false, false}, {2, 1, false, false, false}};
    for (int zero = 0; zero <= 2; zero++)
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
                ranks_job j = {.r = {.model = g_tiny, .compute = DC_F32, .fixed = 0, .batch = BATCH, .ranks = 2,
                                     .zero = zero, .micro_batch = 0, .keep = -1, .offload = 0,
                                     .grad_comm = bf16 ? DC_BF16 : DC_F32, .folds = true},
                               .p = plans[i], .ds = &ds, .peak = {-1, -1}};
                dc_plan_mem pm, p32;
                dc_plan_request r32 = j.r;
                r32.grad_comm = DC_F32;
                CHECK(dc_plan_predict(&j.r, &j.p, &pm) == 0 && dc_plan_predict(&r32, &j.p, &p32) == 0, "predict: %s",
                      dc_error());
                if (bf16)  // the bf16 copies sit beside the fp32 gradients
                    CHECK(pm.grads > p32.grads && pm.peak > p32.peak, "ZeRO-%d: bf16 gradients predicted no larger",
                          zero);
                int rc = dc_comm_threads_run(2, rank_train, &j);
                CHECK(rc == 0 && j.peak[0] == pm.peak && j.peak[1] == pm.peak,
                      "2 ranks, ZeRO-%d, %s gradients, micro %d keep %d: predicted %lld bytes, the ranks held %lld "
                      "and %lld (%s)", zero, bf16 ? "bf16" : "fp32", j.p.micro_batch, j.p.keep, (long long)pm.peak,
                      (long long)j.peak[0], (long long)j.peak[1], rc ? dc_error() : "");
            }
    dc_dataset_free(&ds);
}

// DiT-XL/2 at batch 64 in bf16 on one GPU (xl: its layout, from the registry's preset).
static dc_plan_request xl_request(const dc_model *xl) {
    return (dc_plan_request){.model = xl, .compute = DC_BF16, .fixed = k_cuda_fixed, .batch = 64, .ranks = 1,
                             .zero = 0, .micro_batch = 0, .keep = -1, .offload = -1};
}

static void test_xl(void) {
    dc_kv cfg = {0};
    dc_model *xl = NULL;
    if (dc_model_preset("DiT-XL/2", &cfg) || dc_model_create(&cfg, NULL, false, &xl)) {
        CHECK(0, "DiT-XL/2's layout: %s", dc_error());
        dc_kv_free(&cfg);
        return;
    }
    dc_kv_free(&cfg);
    CHECK(xl->params->numel == 675129632 && xl->info.blocks == 28 && !xl->params->data.p,
          "DiT-XL/2's layout: %lld parameters, %d blocks, data %p", (long long)xl->params->numel, xl->info.blocks,
          xl->params->data.p);
    dc_plan_request r = xl_request(xl);
    const int D = xl->info.blocks;
    // the settings measured on an H200 and an H100 (peak device memory as the backend counts it;
    // offload's 7.52 GiB with the EMA on the device and no unit updated there, 2026-11-23)
    struct { dc_train_plan p; double measured; } h200[] = {{{64, D, false, false, false}, 34.29},
                                                           {{64, 0, true, false, false}, 7.52}};
    for (int i = 0; i < 2; i++) {
        dc_plan_mem m;
        CHECK(dc_plan_predict(&r, &h200[i].p, &m) == 0, "predict: %s", dc_error());
        printf("DiT-XL/2 batch 64 keep %d offload %d: predicted %.2f GiB (weights %.2f, grads %.2f, optimizer "
               "%.2f, trainer %.3f, activations %.2f, fixed %.3f; setup %.2f), measured %.2f GiB\n",
               h200[i].p.keep, h200[i].p.offload, m.peak / GIB, m.weights / GIB, m.grads / GIB, m.optimizer / GIB,
               m.trainer / GIB, m.activations / GIB, m.fixed / GIB, m.setup / GIB, h200[i].measured);
        CHECK(fabs(m.peak / GIB / h200[i].measured - 1) < 0.03, "prediction %.2f GiB is not within 3%% of %.2f",
              m.peak / GIB, h200[i].measured);
    }
    dc_train_plan best, second;
    dc_plan_mem bm;
    int64_t budget = 8LL << 30;
    CHECK(dc_plan_choose(&r, budget, &best, &bm, &second) == 0, "8 GiB: %s", dc_error());
    char line[256];
    dc_plan_describe(&r, &best, &bm, budget, line, sizeof line);
    printf("8 GiB: %s\n", line);
    CHECK(best.offload && best.keep < D && bm.peak <= budget, "8 GiB chose offload %d keep %d (%.2f GiB)",
          best.offload, best.keep, bm.peak / GIB);
    CHECK(best.micro_batch == 64, "8 GiB: micro-batch %d, but 64 fits with offload + recompute", best.micro_batch);
    CHECK(strstr(line, "offload yes") && strstr(line, "of 8.00 GiB"), "describe: %s", line);
    // 40 GiB: everything on the GPU, nothing recomputed
    CHECK(dc_plan_choose(&r, 40LL << 30, &best, &bm, NULL) == 0 && !best.offload && best.keep == D &&
          best.micro_batch == 64, "40 GiB chose micro %d keep %d offload %d", best.micro_batch, best.keep,
          best.offload);
    // monotonic: a larger budget never gives a slower plan, and the plan fits
    double last = INFINITY;
    int fitted = 0;
    for (double g = 1; g <= 40; g += 0.125) {
        int64_t b = (int64_t)(g * GIB);
        if (dc_plan_choose(&r, b, &best, &bm, NULL)) {
            CHECK(fitted == 0, "%.3f GiB refused after a smaller budget fitted", g);
            continue;
        }
        fitted++;
        double c = dc_plan_cost(&r, &best);
        CHECK(c <= last + 1e-12 && bm.peak <= b, "%.3f GiB: cost %.4f after %.4f, peak %.2f GiB", g, c, last,
              bm.peak / GIB);
        last = c;
    }
    CHECK(fitted > 100, "only %d budgets fitted", fitted);
    // below the smallest plan: refused, naming its size
    CHECK(dc_plan_choose(&r, 1LL << 30, &best, &bm, NULL) != 0 && strstr(dc_error(), "the smallest needs"),
          "1 GiB: %s", dc_error());
    // fixed dimensions stay fixed
    r.offload = 0, r.micro_batch = 16;
    CHECK(dc_plan_choose(&r, 16LL << 30, &best, &bm, NULL) == 0 && !best.offload && best.micro_batch == 16,
          "fixed: micro %d offload %d (%s)", best.micro_batch, best.offload, dc_error());
    r = xl_request(xl);
    r.ranks = 2;  // several ranks: never offload
    CHECK(dc_plan_choose(&r, 80LL << 30, &best, &bm, NULL) == 0 && !best.offload && best.micro_batch == 32,
          "2 ranks: micro %d offload %d", best.micro_batch, best.offload);
    dc_model_free(xl);
}

// A LoRA over a frozen UNet (a layout, as `train --lora` gives the planner):
// the plan holds the factors' training state, the frozen weights in the
// compute dtype (dc_model_frozen_bytes), and the UNet's activations with the
// deltas' scratch beside them.
static void test_lora_layout(void) {
    dc_unet_config c;
    dc_model *u = NULL, *w = NULL;
    dc_lora l;
    int rc = dc_unet_config_from_json_file(&c, "tests/golden/sd/sd1/diffusers/unet/config.json") ||
             dc_unet_new_frozen_train(&c, NULL, DC_F16, 16, 16, &u);
    if (!rc) dc_lora_init(&l, u->params);
    if (!rc) rc = dc_sd_lora_add_targets(&l, DC_LORA_UNET, DC_LORA_TRANSFORMER, 4, 4) || dc_lora_model_new(u, &l, NULL, &w);
    if (rc) {
        CHECK(0, "LoRA layout: %s", dc_error());
        return;
    }
    int64_t frozen = 0;
    for (int i = 0; i < u->params->count; i++) frozen += u->params->items[i].numel;
    const int64_t P = w->params->numel;
    dc_plan_request r = {.model = w, .compute = DC_BF16, .fixed = 0, .batch = 2, .ranks = 1, .zero = 0,
                         .micro_batch = 0, .keep = -1, .offload = -1, .folds = true};
    const dc_train_plan p = {2, w->info.blocks, false, false, false};
    dc_plan_mem pm;
    CHECK(dc_plan_predict(&r, &p, &pm) == 0 && pm.weights == 6 * P + 2 * frozen && P > 0 && P < frozen / 10 &&
              pm.optimizer == 12 * P && pm.activations > dc_model_activation_bytes(u, DC_BF16, 2, -1, false),
          "a LoRA's plan: the factors' state (%lld), the frozen weights in bf16 (%lld), the activations and scratch",
          (long long)P, (long long)frozen);
    dc_model_free(w);
}

// A training UNet's layout from a config in tools/configs, latents lat x lat
// (NULL, counted as a failure, if it cannot be made).
static dc_model *unet_layout(const char *config, int lat) {
    dc_unet_config c;
    dc_model *u = NULL;
    if (dc_unet_config_from_json_file(&c, config) || dc_unet_new_train(&c, NULL, DC_GRAD_BUFFER, lat, lat, &u)) {
        CHECK(0, "%s's UNet layout: %s", config, dc_error());
        return NULL;
    }
    return u;
}

// SD 2.1's UNet at 256 px, batch 64, bf16, with the EMA: the gradients in
// the activation arena save 2.8 of their 3.2 GiB, and selective recompute
// 3.6 GiB more (the README's figures; the arena's last layers
// are done with before the units with most parameters begin).
static void test_sd21_lent(void) {
    dc_model *u = unet_layout("tools/configs/sd21_unet.json", 32);
    if (!u) return;
    const int D = u->info.blocks;
    dc_plan_request r = {.model = u, .compute = DC_BF16, .fixed = k_cuda_fixed, .batch = 64, .ranks = 1,
                         .micro_batch = 64, .keep = D, .offload = 0, .fused = 0, .clips = true, .grads_apart = true};
    const dc_train_plan plain = {64, D, false, false, false};
    dc_plan_mem apart, lent;
    CHECK(dc_plan_predict(&r, &plain, &apart) == 0, "predict: %s", dc_error());
    r.grads_apart = false;
    CHECK(dc_plan_predict(&r, &plain, &lent) == 0, "predict: %s", dc_error());
    const int64_t P = u->params->numel;
    printf("SD 2.1 at 256 px, batch 64: %.2f GiB, the gradients in the activations' memory %.2f GiB\n",
           apart.peak / GIB, lent.peak / GIB);
    CHECK(apart.peak - lent.peak > 2.75 * GIB && lent.grads == 0, "the gradients in the arena saved %lld of %lld bytes",
          (long long)(apart.peak - lent.peak), (long long)(4 * P));
    // selective recompute: about 3.6 GiB less again, chosen where the budget asks for it
    const dc_train_plan sel = {64, D, false, false, true};
    dc_plan_mem sm, bm;
    CHECK(dc_plan_predict(&r, &sel, &sm) == 0 && lent.peak - sm.peak > 3.5 * GIB, "selective recompute: %lld bytes",
          (long long)sm.peak);
    printf("SD 2.1 at 256 px, batch 64, selective recompute: %.2f GiB\n", sm.peak / GIB);
    dc_train_plan best;
    r.selective = -1;  // (the blocks all keeping theirs)
    CHECK(dc_plan_choose(&r, (lent.peak + sm.peak) / 2, &best, &bm, NULL) == 0 && best.selective &&
              best.keep == D && bm.peak == sm.peak,
          "a budget between: selective %d, keep %d (%s)", best.selective, best.keep, dc_error());
    char line[256];
    dc_plan_describe(&r, &best, &bm, 0, line, sizeof line);
    CHECK(strstr(line, "recompute off (all 28 blocks keep activations), selective recompute") != NULL, "%s", line);
    CHECK(dc_plan_choose(&r, lent.peak, &best, &bm, NULL) == 0 && !best.selective, "the lent plan's budget: "
          "selective %d", best.selective);
    r.selective = 0;
    // several micro-batches a step keep them apart
    r.micro_batch = 32;
    const dc_train_plan two = {32, D, false, false, false};
    CHECK(dc_plan_predict(&r, &two, &lent) == 0 && lent.grads == 4 * P, "two micro-batches: grads %lld bytes",
          (long long)lent.grads);
    dc_model_free(u);
}

// DreamBooth's step: SD 1.5's UNet at 512 px, batch 1, bf16, no EMA, clipping.
static void test_dreambooth(void) {
    dc_model *u = unet_layout("tools/configs/sd15_unet.json", 64);
    if (!u) return;
    const int D = u->info.blocks;
    dc_plan_request r = {.model = u, .compute = DC_BF16, .fixed = k_cuda_fixed, .batch = 1, .ranks = 1, .zero = 0,
                         .micro_batch = 0, .keep = D, .offload = 0, .fused = -1, .no_ema = true, .clips = true,
                         .grads_apart = true};
    const dc_train_plan plain = {1, D, false, false, false}, fused = {1, D, false, true, false};
    dc_plan_mem pm, fm, lm;
    CHECK(dc_plan_predict(&r, &plain, &pm) == 0 && dc_plan_predict(&r, &fused, &fm) == 0, "predict: %s", dc_error());
    // plain training's gradients in the activations' memory (the default) save part of what fused does
    r.grads_apart = false;
    CHECK(dc_plan_predict(&r, &plain, &lm) == 0 && lm.peak < pm.peak && lm.peak > fm.peak,
          "plain with its gradients in the arena: %lld bytes (apart %lld, fused %lld)", (long long)lm.peak,
          (long long)pm.peak, (long long)fm.peak);
    r.grads_apart = true;
    const int64_t P = u->params->numel;
    printf("SD 1.5 DreamBooth step: plain %.2f GiB, updated in the backward %.2f GiB (%.0fM parameters)\n",
           pm.peak / GIB, fm.peak / GIB, P / 1e6);
    CHECK(pm.peak - fm.peak > 4 * P - 4 * dc_params_widest_unit(u->params) - 4096 && fm.peak < pm.peak,
          "updating in the backward predicted %lld bytes, plain %lld", (long long)fm.peak, (long long)pm.peak);
    dc_train_plan best;
    dc_plan_mem bm;
    const int64_t between = (pm.peak + fm.peak) / 2;
    CHECK(dc_plan_choose(&r, between, &best, &bm, NULL) == 0 && best.fused && bm.peak == fm.peak,
          "a budget between the plans chose fused %d (%s)", best.fused, dc_error());
    char line[256];
    dc_plan_describe(&r, &best, &bm, between, line, sizeof line);
    CHECK(strstr(line, "updated in the backward (two passes: clipping)") != NULL, "describe: %s", line);
    CHECK(dc_plan_choose(&r, pm.peak, &best, &bm, NULL) == 0 && !best.fused, "the plain plan's budget chose fused");
    CHECK(fabs(dc_plan_cost(&r, &fused) / dc_plan_cost(&r, &plain) - 5.0 / 3) < 1e-9,
          "clipping: fused not 5/3 of plain (its backward repeats)");
    r.clips = false;
    CHECK(fabs(dc_plan_cost(&r, &fused) / dc_plan_cost(&r, &plain) - 1.02) < 1e-9, "no clipping: fused not 1.02x");
    // refused: two ranks, accumulation (fixed, or in the plan given), beside offload
    r.fused = 1, r.ranks = 2;
    CHECK(dc_plan_choose(&r, 1LL << 40, &best, &bm, NULL) != 0 && strstr(dc_error(), "one rank"), "2 ranks: %s",
          dc_error());
    r.ranks = 1, r.batch = 4, r.micro_batch = 2;
    CHECK(dc_plan_choose(&r, 1LL << 40, &best, &bm, NULL) != 0 && strstr(dc_error(), "one micro-batch"),
          "accumulation: %s", dc_error());
    const dc_train_plan accum = {2, D, false, true, false};
    CHECK(dc_plan_predict(&r, &accum, &bm) != 0, "a fused plan with 2 micro-batches predicted");
    r.micro_batch = 0, r.offload = 1;
    CHECK(dc_plan_choose(&r, 1LL << 40, &best, &bm, NULL) != 0 && strstr(dc_error(), "--offload"), "offload: %s",
          dc_error());
    dc_model_free(u);
}

int main(void) {
    if (dc_dit_new(&k_tiny, NULL, false, &g_tiny)) return printf("layout: %s\n", dc_error()), 1;
    test_lora_layout();
    test_sizes();
    test_exact_on_cpu();
    test_ranks_on_cpu();
    test_xl();
    test_dreambooth();
    test_sd21_lent();
    dc_model_free(g_tiny);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
