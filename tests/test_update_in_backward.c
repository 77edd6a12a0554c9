// Updating in the backward (train/optimizer.h: dc_optim_plain's fused mode,
// `train --update-in-backward`) against plain training, on the CPU backend,
// for a tiny DiT (learned sigma: the hybrid objective) and a tiny
// text-conditioned UNet (SD's topology: resnets, transformers, resamplers,
// skips, each its own unit, and the time embedding's unit last):
// - without clipping each unit is updated by the same AdamW kernel on the
//   same gradients as plain training, so weights, EMA, both moments, the
//   compute copy and every step's loss are the same bits (the norm, summed
//   unit by unit, within 1e-6); the checkpoints are the same file, and
//   resumes cross both ways (plain -> fused, fused -> plain) end where the
//   uninterrupted run does;
// - with clipping (below every step's norm, so it acts each step) the step
//   takes two passes and ends within 1e-6 of plain training's state (the
//   clipping factor comes from norms summed in another order); with
//   recompute; with an EMA decay of 0 and a compute copy beside the fp32
//   data, as on a GPU;
// - the model holds no full gradient buffer: made with DC_GRAD_WINDOW, or
//   made with one, which the trainer frees;
// - a model that says its backward repeats (dc_model_info.backward_repeats:
//   the UNet, which the second pass then runs without its forward) gives
//   the same gradients, bit for bit, from a second backward without a
//   forward between, with and without recompute (the UNet and the DiT);
// - refusals, naming what is wrong: gradient accumulation (a micro-batch
//   smaller than the batch), --offload beside it, several ranks.
//
// - the gradients in the activations' memory (train/trainer.h:
//   grads_apart false, the default): the UNet's plain training, with steps
//   of one micro-batch, holds them in its arena, and its weights, EMA,
//   moments, losses and norms are the same bits as with them apart (also
//   with clipping and recompute, and on a GPU); a micro-batch smaller than
//   the batch, and the DiT (which cannot), keep them apart. Where each
//   unit's gradients may go rests on the UNet's word for which of its arena's
//   bytes each unit's backward is done with: filled with NaN as each unit
//   begins, they leave the gradients the same bits (every layer keeping its
//   intermediates, and some recomputing theirs). The planner's prediction
//   of the peak (train/plan.h) is what the CPU backend counts, either way
//   (and with selective recompute).
//
// `test_update_in_backward cuda-fp32` (or `cuda`) runs the comparisons on a
// GPU, where the states must agree within 1e-5 (fp32) or 1e-3 (bf16) of
// their norm, as test_offload's do. Without a GPU it says so and passes.
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "file_bytes.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "models/dit.h"
#include "models/model_io.h"
#include "models/registry.h"
#include "models/unet_train.h"
#include "nn/modules.h"
#include "optim_state.h"
#include "tiny_data.h"
#include "tmpdir.h"
#include "count_alloc.h"
#include "train/plan.h"
#include "train/trainer.h"

enum { STEPS = 4, BATCH = 4, T = 77, D = 64 };

static const dc_dit_config k_dit = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 16, .depth = 3,
                                    .heads = 2, .mlp_hidden = 32, .num_classes = 2, .learn_sigma = true};
static const char k_unet[] =
    "{\"_class_name\": \"UNet2DConditionModel\", \"act_fn\": \"silu\",\n"
    " \"in_channels\": 4, \"out_channels\": 4, \"block_out_channels\": [32, 64], \"layers_per_block\": 1,\n"
    " \"down_block_types\": [\"CrossAttnDownBlock2D\", \"DownBlock2D\"],\n"
    " \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\"], \"attention_head_dim\": [1, 2],\n"
    " \"cross_attention_dim\": 64, \"norm_num_groups\": 32, \"norm_eps\": 1e-05, \"sample_size\": 8,\n"
    " \"use_linear_projection\": false, \"center_input_sample\": false}\n";
static const float k_clip = 0.02f;  // below every step's norm here

static dc_dataset g_dit_data, g_unet_data;
static dc_kv g_unet_cfg;
static const char *g_backend = "cpu";
static double g_rel = 0;  // 0: bit for bit (the CPU); else the relative tolerance

typedef struct {
    bool unet;                    // the UNet, else the DiT
    bool fused, window, wc;       // update in the backward; made with DC_GRAD_WINDOW; a compute copy beside
    bool no_ema, offload;
    bool apart;                   // dc_train_config.grads_apart
    int micro, steps, recompute;  // micro-batch (0: the batch); the step to train up to; blocks keeping activations
    float clip;
    const char *resume, *save;
    float *state[5];              // weights, EMA, m, v, and the compute weights at the end
    double loss[STEPS + 1], norm[STEPS + 1];
    int passes;                   // the last step's
    bool grad_held;               // the model held a full gradient buffer while it trained
    bool lent;                    // its gradients lay in its activation arena
    int64_t numel;
} job;

// A text data set for the UNet: n latents [4, 8, 8] and embeddings [77, 64].
static void unet_data(dc_dataset *ds, int n) {
    *ds = (dc_dataset){.n = n, .channels = 4, .height = 8, .width = 8, .cond = DC_COND_TEXT, .text_len = T,
                       .text_dim = D, .text_null_len = T};
    ds->images = malloc(sizeof(float) * (size_t)n * 256);
    ds->text = malloc(sizeof(float) * (size_t)n * T * D);
    ds->text_lens = malloc(sizeof(int32_t) * (size_t)n);
    ds->text_null = malloc(sizeof(float) * T * D);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 256; j++) ds->images[i * 256 + j] = dc_randn_at(71, (uint32_t)i, 0, 0, (uint32_t)j);
        for (int j = 0; j < T * D; j++) ds->text[(int64_t)i * T * D + j] = dc_randn_at(72, (uint32_t)i, 0, 0, (uint32_t)j);
        ds->text_lens[i] = T;
    }
    for (int j = 0; j < T * D; j++) ds->text_null[j] = dc_randn_at(73, 0, 0, 0, (uint32_t)j);
    ds->fingerprint = dc_dataset_fingerprint(ds);
}


static int make_model(const job *j, dc_backend *be, dc_model **m) {
    const dc_grad_mode grad = j->window ? DC_GRAD_WINDOW : DC_GRAD_BUFFER;
    return j->unet ? dc_model_create(&g_unet_cfg, be, grad, m) : dc_dit_new(&k_dit, be, grad, m);
}

static int train(job *j) {
    dc_backend *be = NULL;
    dc_model *m = NULL;
    dc_trainer tr = {0};
    dc_st_file f = {0};
    bool open = false;
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = j->micro ? j->micro : BATCH, tc.steps = STEPS, tc.lr = 1e-3f;
    tc.ema_decay = j->no_ema ? 0 : 0.9f, tc.grad_clip = j->clip, tc.seed = 3;
    tc.update_in_backward = j->fused, tc.offload = j->offload, tc.grads_apart = j->apart;
    int rc = dc_backend_create(g_backend, &be);
    if (!rc) rc = make_model(j, be, &m);
    if (!rc && j->wc && m->params->wc.p == NULL) {  // dc_params_free frees it
        m->params->wc = (dc_buf){be->alloc(be, sizeof(float) * (size_t)m->params->numel), DC_F32};
        m->params->stale = true;
    }
    if (!rc && j->recompute) rc = dc_model_set_recompute(m, j->recompute);
    if (!rc && j->resume) rc = dc_st_open(&f, j->resume), open = rc == 0;
    if (!rc) rc = j->resume ? dc_model_load_weights(m, &f, "") : dc_model_init_weights(m, 5);
    if (!rc) rc = dc_trainer_init(&tr, m, j->unet ? &g_unet_data : &g_dit_data, &tc);
    if (!rc && j->resume) rc = dc_trainer_restore(&tr, &f);
    if (open) dc_st_close(&f);
    while (!rc && tr.step < j->steps) {
        dc_step_stats st;
        rc = dc_trainer_step(&tr, &st);
        if (!rc) j->loss[tr.step] = st.loss, j->norm[tr.step] = st.grad_norm, j->passes = tr.opt->passes;
        if (!rc) j->grad_held = j->grad_held || m->params->grad.p != NULL;
        if (!rc) j->lent = j->lent || m->params->grad_lent;
    }
    if (!rc && j->save) rc = dc_trainer_save(&tr, j->save, NULL);
    if (!rc) rc = dc_trainer_sync(&tr);
    if (!rc) j->numel = read_optim_state(&tr, j->state);
    dc_trainer_free(&tr);
    dc_model_free(m);
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

// j's state and statistics against ref's for steps from..j->steps: bit for
// bit where tol is 0, else each state within tol of its norm; the losses the
// same (bit for bit on the CPU), the norms within 1e-6 (g_rel on a GPU).
static void check_against(const job *j, const job *ref, int from, double tol, const char *what) {
    static const char *names[5] = {"weights", "EMA", "adam_m", "adam_v", "compute weights"};
    if (!j->state[0] || !ref->state[0]) return;
    for (int b = 0; b < 5; b++) {
        double d2 = 0, r2 = 0;
        int64_t diff = 0;
        for (int64_t i = 0; i < ref->numel; i++) {
            double d = (double)j->state[b][i] - ref->state[b][i];
            d2 += d * d, r2 += (double)ref->state[b][i] * ref->state[b][i];
            diff += memcmp(&j->state[b][i], &ref->state[b][i], sizeof(float)) != 0;
        }
        if (tol == 0)
            CHECK(diff == 0, "%s: %lld %s differ from plain training's", what, (long long)diff, names[b]);
        else
            CHECK(isfinite(d2) && r2 > 0 && sqrt(d2 / r2) <= tol, "%s: %s differ from plain training's by %.3g of "
                  "their norm (tolerance %.0e)", what, names[b], sqrt(d2 / r2), tol);
    }
    const double lt = g_rel, nt = g_rel > 0 ? g_rel : 1e-6;
    for (int s = from; s <= j->steps; s++) {
        CHECK(isfinite(j->loss[s]) && fabs(j->loss[s] - ref->loss[s]) <= lt * fabs(ref->loss[s]),
              "%s: step %d loss %.9g, plain %.9g", what, s, j->loss[s], ref->loss[s]);
        CHECK(isfinite(j->norm[s]) && fabs(j->norm[s] - ref->norm[s]) <= nt * fabs(ref->norm[s]),
              "%s: step %d gradient norm %.9g, plain %.9g", what, s, j->norm[s], ref->norm[s]);
    }
}

// Fused against plain training with the same settings.
static void compare(bool unet, float clip, int recompute, bool window, bool wc, bool no_ema, const char *what) {
    job plain = {.unet = unet, .steps = STEPS, .clip = clip, .recompute = recompute, .wc = wc, .no_ema = no_ema};
    job fused = plain;
    fused.fused = true, fused.window = window;
    char name[200];
    snprintf(name, sizeof name, "%s: %s, updating in the backward", unet ? "UNet" : "DiT", what);
    if (run(&plain, what) && run(&fused, name)) {
        check_against(&fused, &plain, 1, clip > 0 || g_rel > 0 ? (g_rel > 0 ? g_rel : 1e-6) : 0.0, name);
        CHECK(fused.passes == (clip > 0 ? 2 : 1), "%s: %d passes a step", name, fused.passes);
        CHECK(!fused.grad_held, "%s: the model held a full gradient buffer", name);
        if (clip > 0) CHECK(plain.norm[1] > clip, "%s: the norm %g does not reach the clip %g", what, plain.norm[1], clip);
    }
    job_free(&plain), job_free(&fused);
}

// Plain training with the gradients in the activation arena (the default)
// against the same with them apart: the same bits, on a GPU too.
static void lending(bool unet, int micro, float clip, int recompute, const char *what) {
    job lent = {.unet = unet, .steps = STEPS, .micro = micro, .clip = clip, .recompute = recompute};
    job apart = lent;
    apart.apart = true;
    char name[200];
    snprintf(name, sizeof name, "%s: %s, the gradients apart", unet ? "UNet" : "DiT", what);
    if (run(&lent, what) && run(&apart, name)) {
        check_against(&lent, &apart, 1, 0.0, what);
        const bool lends = unet && !micro;
        CHECK(lent.lent == lends, "%s: the gradients %s the activations' memory", what,
              lent.lent ? "lay in" : "not in");
        CHECK(!apart.lent && apart.grad_held, "%s: the gradients were not apart", name);
    }
    job_free(&lent), job_free(&apart);
}

// The UNet's arena, poisoned as its backward goes: from each unit's begin,
// the bytes the UNet says it is done with hold NaN.
enum { MAX_UNITS = 64 };
typedef struct {
    char *base;
    size_t bytes;
    int64_t dead[MAX_UNITS];
    int poisoned;
} poison;

static int poison_unit(void *ctx, int u, bool done) {
    poison *p = ctx;
    if (done || (size_t)p->dead[u] >= p->bytes) return 0;
    memset(p->base + p->dead[u], 0xff, p->bytes - (size_t)p->dead[u]);  // NaN in every dtype (CPU memory)
    p->poisoned++;
    return 0;
}

// One forward and two backwards of the tiny UNet (keep: layers keeping their
// intermediates), the second with the arena poisoned: the same gradients.
static void dead_memory(int keep) {
    dc_backend *be = NULL;
    dc_model *m = NULL;
    const int64_t nx = BATCH * 256, nc = (int64_t)BATCH * T * D;
    float *h = malloc(sizeof(float) * (size_t)nc), *g[2] = {NULL, NULL};
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_model_create(&g_unet_cfg, be, DC_GRAD_BUFFER, &m);
    if (!rc) rc = dc_model_init_weights(m, 5);
    if (!rc) rc = dc_model_set_recompute(m, keep);
    if (!rc) rc = dc_model_reserve(m, BATCH);
    dc_buf x = {0}, t = {0}, out = {0}, dout = {0}, ctx = {0};
    if (!rc) {
        x = (dc_buf){be->alloc(be, 4 * nx), DC_F32}, out = (dc_buf){be->alloc(be, 4 * nx), DC_F32};
        dout = (dc_buf){be->alloc(be, 4 * nx), DC_F32}, ctx = (dc_buf){be->alloc(be, 4 * nc), DC_F32};
        t = (dc_buf){be->alloc(be, 4 * BATCH), DC_F32};
        for (int64_t i = 0; i < nc; i++) h[i] = dc_randn_at(81, 0, 0, 0, (uint64_t)i);
        be->upload(be, ctx.p, h, 4 * nc);
        for (int64_t i = 0; i < nx; i++) h[i] = dc_randn_at(82, 0, 0, 0, (uint64_t)i);
        be->upload(be, x.p, h, 4 * nx);
        for (int64_t i = 0; i < nx; i++) h[i] = dc_randn_at(83, 0, 0, 0, (uint64_t)i);
        be->upload(be, dout.p, h, 4 * nx);
        const float ht[BATCH] = {3, 250, 600, 999};
        be->upload(be, t.p, ht, sizeof ht);
    }
    const dc_cond cond = {.ctx = ctx, .len = T, .dim = D};
    poison p = {0};
    dc_param_hooks hooks = {.unit = poison_unit, .ctx = &p};
    dc_params *ps = rc ? NULL : m->params;
    if (!rc) rc = unet_train_arena((const dc_unet *)m, (void **)&p.base, &p.bytes, p.dead, MAX_UNITS);
    for (int pass = 0; pass < 2 && !rc; pass++) {
        be->zero(be, ps->grad.p, sizeof(float) * (size_t)ps->numel);
        rc = dc_model_forward(m, out, x, t, &cond, BATCH);
        ps->hooks = pass ? &hooks : NULL;
        if (!rc) rc = dc_model_backward(m, dout, BATCH);
        ps->hooks = NULL;
        g[pass] = malloc(sizeof(float) * (size_t)ps->numel);
        if (!rc) rc = dc_download_as_f32(be, ps->grad, g[pass], ps->numel);
    }
    CHECK(rc == 0, "the UNet's backward, keep %d: %s", keep, rc ? dc_error() : "");
    if (!rc) {
        int64_t diff = 0;
        for (int64_t i = 0; i < ps->numel; i++) diff += !isfinite(g[1][i]) || memcmp(&g[0][i], &g[1][i], 4) != 0;
        CHECK(diff == 0 && p.poisoned > 0, "keep %d: %lld gradients changed with the done-with bytes poisoned "
              "(%d units poisoned)", keep, (long long)diff, p.poisoned);
    }
    dc_buf bufs[] = {x, t, out, dout, ctx};
    for (int i = 0; i < 5 && be; i++)
        if (bufs[i].p) be->free(be, bufs[i].p);
    free(h), free(g[0]), free(g[1]);
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
}

// The bookkeeping of lent gradients (nn/params.h): as a unit begins, the
// gradients no op overwrites are zeroed and the others marked fresh; an
// op's first write over fresh ones overwrites (all of a fused range, or
// none: then the fresh ones are zeroed), a gradient read or added to first
// is zeroed then, and one nothing wrote is zeroed as the unit is done.
static void fresh_gradients(void) {
    dc_backend *be = NULL;
    dc_params ps = {0};
    dc_linear q, k, v, o;
    dc_embedding e;  // its gradient is added into: zeroed as the unit begins
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_linear_add_nobias(&ps, &q, "q", 3, 2) || dc_linear_add_nobias(&ps, &k, "k", 3, 2) ||
                  dc_linear_add_nobias(&ps, &v, "v", 3, 2) || dc_embedding_add(&ps, &e, "emb", 2, 4) ||
                  dc_linear_add(&ps, &o, "o", 2, 2) || dc_params_alloc(&ps, be, DC_GRAD_NONE);
    float *arena = malloc(sizeof(float) * (size_t)ps.numel);
    CHECK(rc == 0 && arena, "a set of parameters: %s", rc ? dc_error() : "");
    if (rc || !arena) goto done;
    for (int64_t i = 0; i < ps.numel; i++) arena[i] = NAN;  // the arena's dead bytes
    dc_params_lend_grad(&ps, arena);
    const float *g = arena;
    CHECK(dc_params_unit_begin(&ps, 0) == 0, "unit begins");
    const int64_t n_e = ps.items[e.table].offset, n_o = ps.items[o.w].offset;
    CHECK(g[n_e] == 0 && g[n_e + 7] == 0 && isnan(g[0]) && isnan(g[n_o]) && ps.items[q.w].grad_fresh,
          "the embedding's gradients zeroed, the linear layers' fresh and untouched");
    // q, k, v as one product: all fresh, so written; a second claim adds
    const int qkv[1] = {q.w};
    const int64_t n6[1] = {18}, n2[1] = {6};
    CHECK(dc_params_claim_grads(&ps, qkv, n6, 1) == DC_BWD_DW_SET && !ps.items[v.w].grad_fresh,
          "q, k, v fresh together: written");
    CHECK(dc_params_claim_grads(&ps, qkv, n6, 1) == 0 && isnan(g[0]), "claimed again: added to");
    // o's weight fresh beside its bias read first: zeroed, and the product adds
    dc_buf ob = dc_param_train_grad(&ps, o.b);
    CHECK(ob.p == arena + ps.items[o.b].offset && g[ps.items[o.b].offset] == 0 && ps.items[o.w].grad_fresh,
          "a fresh gradient read first is zeroed");
    const int ow[2] = {o.w, o.b};
    const int64_t own[2] = {4, 2};
    CHECK(dc_params_claim_grads(&ps, ow, own, 2) == 0 && g[n_o] == 0 && g[n_o + 3] == 0 && !ps.items[o.w].grad_fresh,
          "weight fresh, bias not: the weight zeroed and added to");
    // k claimed alone, already taken; nothing fresh is left for done
    CHECK(dc_params_claim_grads(&ps, &k.w, n2, 1) == 0, "k taken with q");
    ps.items[v.w].grad_fresh = true, arena[ps.items[v.w].offset] = NAN;  // as if nothing wrote v
    CHECK(dc_params_unit_done(&ps, 0) == 0 && g[ps.items[v.w].offset] == 0 && !ps.items[v.w].grad_fresh,
          "a fresh gradient nothing wrote is zeroed as its unit is done");
    dc_params_lend_grad(&ps, NULL);
done:
    dc_params_free(&ps);
    free(arena);
    if (be) dc_backend_destroy(be);
}

// Two steps of plain training on the counted CPU backend, the gradients in
// the arena or apart: the peak the planner predicts (all layers keeping
// their intermediates, or keep of them); the first under the second.
static void planned_peak(int keep, bool selective) {
    static counter k;  // large: not on the stack
    if (counter_init(&k)) return;
    int64_t peak[2] = {0, 0};
    for (int apart = 0; apart < 2; apart++) {
        counter_reset(&k, 0);
        dc_model *m = NULL;
        dc_trainer tr = {0};
        dc_train_config tc = dc_train_config_default();
        tc.batch = tc.micro_batch = BATCH, tc.steps = 2, tc.ema_decay = 0.9f, tc.grad_clip = k_clip;
        tc.grads_apart = apart;
        int rc = dc_model_create(&g_unet_cfg, &k.be, DC_GRAD_BUFFER, &m);
        const int D = rc ? 0 : m->info.blocks;
        if (!rc) rc = dc_model_set_recompute(m, keep < 0 ? D : keep);
        if (!rc) rc = dc_model_set_selective(m, selective);
        if (!rc) rc = dc_model_init_weights(m, 5);
        if (!rc) rc = dc_trainer_init(&tr, m, &g_unet_data, &tc);
        for (int s = 0; s < 2 && !rc; s++) rc = dc_trainer_step(&tr, NULL);
        CHECK(rc == 0, "training on the counted backend: %s", rc ? dc_error() : "");
        if (!rc) {
            peak[apart] = k.peak;
            dc_plan_request r = {.model = m, .compute = k.be.compute, .batch = BATCH, .ranks = 1,
                                 .micro_batch = BATCH, .keep = keep < 0 ? D : keep, .offload = 0, .fused = 0,
                                 .clips = true, .folds = true, .grads_apart = apart};
            const dc_train_plan p = {BATCH, r.keep, false, false, selective};
            dc_plan_mem pm;
            CHECK(dc_plan_predict(&r, &p, &pm) == 0 && pm.peak == k.peak, "keep %d%s, the gradients %s: predicted "
                  "%lld bytes, the backend held %lld", keep, selective ? ", selective" : "",
                  apart ? "apart" : "in the arena", (long long)pm.peak, (long long)k.peak);
        }
        dc_trainer_free(&tr);
        dc_model_free(m);
    }
    CHECK(peak[0] < peak[1], "keep %d: the gradients in the arena held %lld bytes, apart %lld", keep,
          (long long)peak[0], (long long)peak[1]);
    counter_free(&k);
}

// Checkpoints: the same file either way (without clipping), and resumes across.
static void checkpoints(bool unet) {
    const char *p2 = tmp_path("plain2.st"), *f2 = tmp_path("fused2.st"), *p4 = tmp_path("plain4.st");
    const char *f4 = tmp_path("fused4.st");
    job full = {.unet = unet, .steps = STEPS, .save = p4};
    job half_plain = {.unet = unet, .steps = 2, .save = p2};
    job half_fused = {.unet = unet, .fused = true, .window = true, .steps = 2, .save = f2};
    job fused_full = {.unet = unet, .fused = true, .window = true, .steps = STEPS, .save = f4};
    job p_to_f = {.unet = unet, .fused = true, .window = true, .steps = STEPS, .resume = p2};
    job f_to_p = {.unet = unet, .steps = STEPS, .resume = f2};
    const char *m = unet ? "UNet" : "DiT";
    if (run(&full, "plain, 4 steps") && run(&half_plain, "plain, 2 steps") && run(&half_fused, "fused, 2 steps") &&
        run(&fused_full, "fused, 4 steps")) {
        CHECK(same_file(p2, f2), "%s: after 2 steps updating in the backward wrote another checkpoint", m);
        CHECK(same_file(p4, f4), "%s: after 4 steps updating in the backward wrote another checkpoint", m);
        if (run(&p_to_f, "plain checkpoint resumed, updating in the backward")) check_against(&p_to_f, &full, 3, 0, "plain -> fused");
        if (run(&f_to_p, "fused checkpoint resumed plain")) check_against(&f_to_p, &full, 3, 0, "fused -> plain");
    }
    job *all[] = {&full, &half_plain, &half_fused, &fused_full, &p_to_f, &f_to_p};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) job_free(all[i]);
}

// A second backward from the same dout, without a forward, against the
// first: the same gradients bit for bit where the model says its backward
// repeats. (keep: blocks keeping activations, -1 all.)
static void backward_repeats(bool unet, int keep) {
    dc_backend *be = NULL;
    dc_model *m = NULL;
    job j = {.unet = unet};
    int rc = dc_backend_create(g_backend, &be);
    if (!rc) rc = make_model(&j, be, &m);
    if (!rc) rc = dc_model_init_weights(m, 9);
    if (!rc && keep >= 0) rc = dc_model_set_recompute(m, keep);
    if (!rc) rc = dc_model_reserve(m, 2);
    CHECK(rc == 0, "model: %s", rc ? dc_error() : "");
    if (rc) {
        dc_model_free(m);
        if (be) dc_backend_destroy(be);
        return;
    }
    const dc_model_info *mi = &m->info;
    const int B = 2;
    const int64_t img = dc_model_info_numel(mi), oimg = img / mi->channels * mi->out_channels;
    float *h = malloc(sizeof(float) * (size_t)(B * (img > T * D ? img : T * D)));
    dc_buf x = {be->alloc(be, sizeof(float) * (size_t)(B * img)), DC_F32};
    dc_buf out = {be->alloc(be, sizeof(float) * (size_t)(B * oimg)), DC_F32};
    dc_buf dout = {be->alloc(be, sizeof(float) * (size_t)(B * oimg)), DC_F32};
    dc_buf t = {be->alloc(be, sizeof(float) * B), DC_F32};
    dc_cond cond = {0};
    for (int64_t i = 0; i < B * img; i++) h[i] = dc_randn_at(81, 0, 0, 0, (uint32_t)i);
    be->upload(be, x.p, h, sizeof(float) * (size_t)(B * img));
    for (int64_t i = 0; i < B * oimg; i++) h[i] = dc_randn_at(82, 0, 0, 0, (uint32_t)i);
    be->upload(be, dout.p, h, sizeof(float) * (size_t)(B * oimg));
    const float ts[2] = {17, 640};
    be->upload(be, t.p, ts, sizeof ts);
    if (unet) {
        cond.len = T, cond.dim = D;
        cond.ctx = (dc_buf){be->alloc(be, sizeof(float) * (size_t)(B * T * D)), DC_F32};
        for (int64_t i = 0; i < B * T * D; i++) h[i] = dc_randn_at(83, 0, 0, 0, (uint32_t)i);
        be->upload(be, cond.ctx.p, h, sizeof(float) * (size_t)(B * T * D));
    } else {
        const int32_t y[2] = {0, 1};
        cond.y = (dc_buf){be->alloc(be, sizeof y), DC_I32};
        be->upload(be, cond.y.p, y, sizeof y);
    }
    dc_params *ps = m->params;
    const size_t gb = sizeof(float) * (size_t)ps->numel;
    float *g1 = malloc(gb), *g2 = malloc(gb);
    // every weight random (DiT's zero-initialised modulation would leave most gradients 0)
    for (int64_t i = 0; i < ps->numel; i++) g1[i] = 0.05f * dc_randn_at(84, 0, 0, 0, (uint32_t)i);
    be->upload(be, ps->data.p, g1, gb);
    dc_params_touch(ps);
    be->zero(be, ps->grad.p, gb);
    rc = dc_model_forward(m, out, x, t, &cond, B);
    if (!rc) rc = dc_model_backward(m, dout, B);
    if (!rc) be->download(be, g1, ps->grad.p, gb);
    if (!rc) be->zero(be, ps->grad.p, gb), rc = dc_model_backward(m, dout, B);
    if (!rc) be->download(be, g2, ps->grad.p, gb), rc = dc_backend_status(be);
    CHECK(rc == 0, "backward twice: %s", rc ? dc_error() : "");
    int64_t diff = 0, nonzero = 0;
    for (int64_t i = 0; !rc && i < ps->numel; i++) diff += memcmp(&g1[i], &g2[i], sizeof(float)) != 0, nonzero += g1[i] != 0;
    const char *name = unet ? "UNet" : "DiT";
    if (!rc && mi->backward_repeats)
        CHECK(diff == 0 && nonzero > ps->numel / 2, "%s, keep %d: a second backward changed %lld of %lld gradients "
              "(%lld non-zero), but the model says its backward repeats", name, keep, (long long)diff,
              (long long)ps->numel, (long long)nonzero);
    else if (!rc)
        printf("  %s, keep %d: does not say its backward repeats; a second backward changed %lld gradients\n", name,
               keep, (long long)diff);
    CHECK(mi->backward_repeats, "the %s no longer says its backward repeats", name);
    free(h), free(g1), free(g2);
    dc_buf bufs[] = {x, out, dout, t, cond.ctx, cond.y};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i].p) be->free(be, bufs[i].p);
    dc_model_free(m);
    dc_backend_destroy(be);
}

static void check_refused(job *j, const char *want, const char *what) {
    int rc = train(j);
    CHECK(rc != 0, "%s: accepted", what);
    if (rc) CHECK(strstr(dc_error(), want) != NULL, "%s: the message does not say '%s': %s", what, want, dc_error());
    job_free(j);
}

typedef struct {
    int rc;
    char msg[512];
} comm_job;

// Rank 0 records what dc_trainer_set_comm says to updating in the backward on two ranks.
static int set_comm_fused(dc_comm *c, void *arg) {
    comm_job *cj = arg;
    dc_backend *be = NULL;
    dc_model *m = NULL;
    dc_trainer tr = {0};
    dc_train_config tc = dc_train_config_default();
    tc.batch = BATCH, tc.micro_batch = BATCH, tc.update_in_backward = true;
    job j = {0};
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = make_model(&j, be, &m);
    if (!rc) rc = dc_model_init_weights(m, 5);
    if (!rc) rc = dc_trainer_init(&tr, m, &g_dit_data, &tc);
    int set = rc ? rc : dc_trainer_set_comm(&tr, c, 0);
    if (c->rank == 0) cj->rc = set, snprintf(cj->msg, sizeof cj->msg, "%s", set ? dc_error() : "");
    dc_trainer_free(&tr);
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
    return 0;
}

static void refusals(void) {
    job accum = {.fused = true, .window = true, .steps = 1, .micro = 2};
    check_refused(&accum, "one micro-batch", "updating in the backward with 2 micro-batches a step");
    job offload = {.fused = true, .offload = true, .steps = 1};
    check_refused(&offload, "--offload", "updating in the backward beside --offload");
    job plain_window = {.window = true, .steps = 1};
    check_refused(&plain_window, "no gradient buffer", "plain training of a model made without a gradient buffer");
    comm_job cj = {0};
    int rc = dc_comm_threads_run(2, set_comm_fused, &cj);
    CHECK(rc == 0, "the thread communicator: %s", rc ? dc_error() : "");
    CHECK(cj.rc != 0 && strstr(cj.msg, "one rank"), "updating in the backward on 2 ranks: %s",
          cj.rc ? cj.msg : "accepted");
}

static void all_comparisons(void) {
    for (int u = 0; u < 2; u++) {
        backward_repeats(u, -1);
        backward_repeats(u, 1);
        compare(u, 0.0f, 0, true, false, false, "no clipping");
        compare(u, 0.0f, 0, false, false, false, "no clipping, made with a gradient buffer");
        compare(u, k_clip, 0, true, false, false, "clipping");
        compare(u, k_clip, 1, true, true, false, "clipping, recompute, a compute copy");
        compare(u, 0.0f, 1, true, true, true, "no clipping, recompute, a compute copy, no EMA");
    }
    lending(true, 0, 0.0f, 0, "plain training");
    lending(true, 0, k_clip, 0, "plain training, clipping");
    lending(true, 0, k_clip, 2, "plain training, clipping, recompute");
    lending(true, BATCH / 2, 0.0f, 0, "plain training, two micro-batches");
    lending(false, 0, 0.0f, 0, "plain training");
}

static int on_gpu(const char *name) {
    dc_backend *be = NULL;
    if (dc_backend_create(name, &be)) {
        printf("SKIP (no GPU) test_update_in_backward %s: %s\n", name, dc_error());
        return 0;
    }
    g_rel = be->compute == DC_F32 ? 1e-5 : 1e-3;
    dc_backend_destroy(be);
    g_backend = name;
    all_comparisons();
    printf("test_update_in_backward %s: %d passed, %d failed\n", name, g_pass, g_fail);
    return g_fail != 0;
}

int main(int argc, char **argv) {
    openblas_set_num_threads(1);
    tiny_data(&g_dit_data, 8);
    unet_data(&g_unet_data, 8);
    if (tmpdir_make("update_in_backward")) return 1;
    FILE *fp = fopen(tmp_path("config.json"), "w");
    CHECK(fp && fputs(k_unet, fp) >= 0 && !fclose(fp), "config.json");
    CHECK(dc_model_config_of_json(tmp_path("config.json"), &g_unet_cfg) == 0, "config: %s", dc_error());
    int rc;
    if (argc > 1) {
        rc = on_gpu(argv[1]);
    } else {
        all_comparisons();
        checkpoints(false);
        checkpoints(true);
        refusals();
        fresh_gradients();
        dead_memory(-1);
        dead_memory(2);
        planned_peak(-1, false);
        planned_peak(2, false);
        planned_peak(-1, true);
        printf("test_update_in_backward: %d passed, %d failed\n", g_pass, g_fail);
        rc = g_fail != 0;
    }
    tmpdir_remove();
    dc_dataset_free(&g_dit_data), dc_dataset_free(&g_unet_data);
    dc_kv_free(&g_unet_cfg);
    return rc;
}
