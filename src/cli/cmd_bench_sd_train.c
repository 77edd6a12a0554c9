// diffusion bench --sd-train: the speed and memory of training a Stable
// Diffusion UNet (any diffusers unet/config.json, random init) through the
// trainer `diffusion train` runs, on random latents and text embeddings,
// to set beside what tools/sd_train_bench.py measures for diffusers with the
// same config and recipe on the same device.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/args.h"
#include "cli/cli_plan.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/train_ranks.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "diffusion/sd_schedule.h"
#include "models/lora_model.h"
#include "models/registry.h"
#include "models/sd_lora.h"
#include "models/unet.h"
#include "models/unet_text.h"
#include "train/trainer.h"

// Random latents [n, C, h, w] (unit normal, as scaled SD latents are about)
// and, for every sample, random text embeddings [ctx_len, ctx_dim] of which
// every token counts: a step's cost does not depend on the values.
// A model that reads token ids (its text encoder trains) gets embeddings one
// wide, which its source's ids replace (time_steps).
static int random_data(dc_dataset *ds, const dc_model_info *mi, int n) {
    const int dim = mi->cond == DC_COND_TOKENS ? 1 : mi->ctx_dim;
    const int64_t img = dc_model_info_numel(mi), seq = (int64_t)mi->ctx_len * dim;
    *ds = (dc_dataset){.n = n, .channels = mi->channels, .height = mi->height, .width = mi->width,
                       .cond = DC_COND_TEXT, .text_len = mi->ctx_len, .text_dim = dim, .text_null_len = mi->ctx_len};
    ds->images = malloc(sizeof(float) * (size_t)(n * img));
    ds->text = malloc(sizeof(float) * (size_t)(n * seq));
    ds->text_lens = malloc(sizeof(int32_t) * (size_t)n);
    ds->text_null = malloc(sizeof(float) * (size_t)seq);
    if (!ds->images || !ds->text || !ds->text_lens || !ds->text_null)
        return dc_fail("out of memory for %d random latents and text embeddings", n);
    for (int i = 0; i < n; i++) {
        for (int64_t j = 0; j < img; j++) ds->images[i * img + j] = dc_randn_at(1, (uint32_t)i, 0, 0, (uint32_t)j);
        for (int64_t j = 0; j < seq; j++) ds->text[i * seq + j] = dc_randn_at(2, (uint32_t)i, 0, 0, (uint32_t)j);
        ds->text_lens[i] = mi->ctx_len;
    }
    for (int64_t j = 0; j < seq; j++) ds->text_null[j] = dc_randn_at(3, 0, 0, 0, (uint32_t)j);
    return 0;
}

// A caption's token ids for a model that trains its text encoder: BOS,
// random ids of the vocabulary's words, EOS, every one of the 77 counting
// (the cost does not depend on them). The empty prompt where dropped.
static int random_ids(dc_source *s, int64_t idx, bool drop, int32_t *ids, int32_t *len) {
    enum { BOS = 49406, EOS = 49407 };
    const int T = s->text_len;
    for (int i = 0; i < T; i++) {
        const uint32_t word = dc_rand_u32_at(4, (uint32_t)idx, 0, 0, (uint32_t)i) % BOS;
        ids[i] = i == 0 ? BOS : drop || i == T - 1 ? EOS : (int32_t)word;
    }
    *len = drop ? 2 : T;
    return 0;
}

// diffusers' train_text_to_image.py recipe at the learning rate:
// AdamW lr 1e-5, weight decay 1e-2, eps 1e-8, gradients clipped to norm 1,
// EMA 0.9999 with EMAModel's warm-up, epsilon prediction, no caption
// dropout (the script has none). tools/sd_train_bench.py uses the same.
static dc_train_config sd_recipe(int batch, int micro, int steps) {
    dc_train_config tc = dc_train_config_default();
    tc.batch = batch, tc.micro_batch = micro, tc.steps = steps;
    tc.lr = 1e-5f, tc.weight_decay = 1e-2f, tc.grad_clip = 1.0f, tc.class_dropout = 0;
    return tc;
}

typedef struct {
    double sec;         // seconds a timed step
    size_t held, peak;  // device bytes held after the steps and at the peak (0, 0 on the CPU)
    double rss;         // the process's peak resident bytes
} measured;

// Steps of the trainer on the model after `warm` untimed ones: the whole
// optimizer step as `diffusion train` runs it (staging, forward, loss,
// backward, clipping, AdamW, EMA), on each of the job's ranks `batch` images
// of the global batch, their gradients reduced as `diffusion train --zero`
// reduces them. A NaN loss or gradient fails it. What is measured is the
// slowest rank's time and the largest rank's memory.
static int time_steps(train_ranks *job, dc_model *m, dc_backend *be, int batch, int micro, int steps, int warm,
                      int zero, dc_dtype wire, bool offload, bool fused, float ema_decay, measured *out) {
    const int size = job->launch.size;
    *out = (measured){0};
    dc_dataset ds = {0};
    dc_trainer tr = {0};
    dc_schedule sched = {0};
    dc_train_config tc = sd_recipe(batch * size, micro, warm + steps);
    tc.grad_comm = wire, tc.offload = offload, tc.update_in_backward = fused, tc.ema_decay = ema_decay;
    int rc = cli_offload_settings(&tc.offload_settings) || random_data(&ds, &m->info, batch * size);
    // SD's training schedule (scaled_linear 0.00085..0.012, 1000 steps)
    if (!rc) rc = dc_schedule_init_scaled_linear(&sched, 1000, 0.00085, 0.012);
    static dc_source_ops token_ops;  // the data set's, with token ids (a text encoder that trains reads them)
    if (!rc) {
        dc_source src;
        rc = dc_source_dataset(&src, &ds, tc.seed);
        if (!rc && m->info.cond == DC_COND_TOKENS) {
            token_ops = *src.ops, token_ops.ids = random_ids, src.ops = &token_ops;
            src.cond = DC_COND_TOKENS, src.text_len = m->info.ctx_len, src.text_dim = 0;
        }
        if (!rc) rc = dc_trainer_init_source(&tr, m, &src, &sched, &tc);  // takes src and sched
    }
    if (!rc) rc = train_ranks_comm(job, be);
    if (!rc && (job->comm || zero)) rc = dc_trainer_set_comm(&tr, job->comm, zero);
    rc = train_ranks_agree(job, rc == 0, "start");
    double t0 = 0;
    for (int i = 0; i < warm + steps && !rc; i++) {
        if (i == warm) {  // every rank starts the clock together
            rc = dc_trainer_sync(&tr);
            rc = train_ranks_agree(job, rc == 0, "finish the warm-up");
            if (be->profile_restart) be->profile_restart(be);  // a profile of the timed steps alone
            t0 = dc_time_now();
        }
        if (!rc) rc = dc_trainer_step(&tr, NULL);
    }
    if (!rc) rc = dc_trainer_sync(&tr);  // the last step's update too
    if (!rc) {
        out->sec = (dc_time_now() - t0) / steps;
        dc_step_stats st;
        rc = dc_trainer_stats(&tr, &st);
    }
    size_t held = 0, peak = 0;
    if (be->memory) be->memory(be, &held, &peak);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double v[4] = {out->sec, (double)held, (double)peak, ru.ru_maxrss * 1024.0};  // ru_maxrss is in KiB on Linux
    rc = train_ranks_agree(job, rc == 0, "finish the timed steps");
    if (!rc) rc = train_ranks_max(job, v, 4);
    *out = (measured){v[0], (size_t)v[1], (size_t)v[2], v[3]};
    dc_trainer_free(&tr);
    dc_schedule_free(&sched);  // nothing left where the trainer took it
    dc_dataset_free(&ds);
    return rc;
}

// The text encoder SD's UNet reads: CLIP ViT-L/14's (SD 1.x, 768 wide) or
// OpenCLIP ViT-H/14's 23 layers that SD 2.x runs (1024 wide).
static int text_config(const dc_unet_config *uc, dc_clip_text_config *tc) {
    if (uc->ctx_dim == 768)
        *tc = (dc_clip_text_config){49408, 77, 768, 12, 12, 3072, DC_ACT_QUICK_GELU, 1e-5f};
    else if (uc->ctx_dim == 1024)
        *tc = (dc_clip_text_config){49408, 77, 1024, 23, 16, 4096, DC_ACT_GELU_ERF, 1e-5f};
    else
        return dc_fail("--train-text-encoder: no SD text encoder is %d wide (768: SD 1.x, 1024: SD 2.x)", uc->ctx_dim);
    return 0;
}

// The model that trains, random (weights as PyTorch initialises them, a
// LoRA's factors as kohya does): the UNet, or with text the UNet and the text
// encoder; with rank > 0 a LoRA of them over their frozen weights (in the
// compute dtype), as `train --lora [--train-text-encoder]` trains one.
static int bench_model(const dc_kv *mc, dc_backend *be, bool window, bool text, int rank, const char *targets,
                       dc_model **out) {
    dc_unet_config uc;
    dc_clip_text_config tc;
    dc_lora_targets t;
    dc_model *u = NULL;
    DC_TRY(dc_unet_config_from_kv(&uc, mc));
    if (text) DC_TRY(text_config(&uc, &tc));
    const int side = uc.sample_size;
    const dc_grad_mode grad = window ? DC_GRAD_WINDOW : DC_GRAD_BUFFER;
    if (rank == 0) {
        DC_TRY(text ? dc_unet_text_new_train(&uc, &tc, be, grad, side, side, out) : dc_model_create(mc, be, grad, out));
        return dc_model_init_weights(*out, 0);
    }
    DC_TRY(dc_lora_targets_parse(targets, &t));
    if (rank < 1 || rank > 1024) return dc_fail("--lora %d: a rank of 1 to 1024", rank);
    DC_TRY(text ? dc_unet_text_new_frozen_train(&uc, &tc, be, be->compute, side, side, &u)
                : dc_unet_new_frozen_train(&uc, be, be->compute, side, side, &u));
    dc_lora l;
    dc_lora_init(&l, u->params);
    if (dc_model_init_weights(u, 0) || dc_sd_lora_add_targets(&l, DC_LORA_UNET, t, rank, (float)rank) ||
        (text && dc_sd_lora_add_targets(&l, DC_LORA_TEXT, t, rank, (float)rank))) {
        dc_lora_free(&l), dc_model_free(u);
        return -1;
    }
    DC_TRY(dc_lora_model_new(u, &l, NULL, out));
    return dc_model_init_weights(*out, 0);
}

int cmd_bench_sd_train(int argc, char **argv) {
    const char *config = NULL, *device = "auto", *precision = "auto", *grad_comm = "fp32", *max_mem = NULL;
    int size = 0, batch = 8, micro = 0, steps = 10, warm = 3, recompute = -1, threads = 0;
    int ranks = 0, gpus = 0, zero = 0, lora = 0;
    float comm_timeout = 300, ema_decay = dc_train_config_default().ema_decay;
    bool sd_train = false, offload = false, text = false, fused = false, selective = false;
    const char *lora_targets = "transformer";
    arg_spec specs[] = {
        {"sd-train", ARG_FLAG, &sd_train, NULL, "time SD UNet training (this command)"},
        {"unet-config", ARG_STR, &config, "FILE", "the UNet's diffusers config.json (tools/configs/ has SD 1.5's "
                                                  "and 2.1's)"},
        {"size", ARG_INT, &size, "PX", "picture size: latents of PX/8 (default: the config's sample_size x 8)"},
        {"batch", ARG_INT, &batch, "N", "images an optimizer step (per rank with several ranks)"},
        {"micro-batch", ARG_INT, &micro, "N", "images a forward and backward (default: --batch)"},
        {"steps", ARG_INT, &steps, "N", "timed optimizer steps"},
        {"warmup", ARG_INT, &warm, "N", "untimed steps first"},
        {"recompute", ARG_INT, &recompute, "K", "activation checkpointing: the first K layers keep their "
                                                "activations, the others recompute them (default off)"},
        {"selective-recompute", ARG_FLAG, &selective, NULL, "keep no result a norm or activation rebuilds cheaply, as "
                                                            "`train --selective-recompute`"},
        {"lora", ARG_INT, &lora, "RANK", "time a LoRA of rank RANK training over the frozen UNet (its weights in "
                                         "the compute dtype), as `train --lora` does (default: the UNet trains)"},
        {"lora-targets", ARG_STR, &lora_targets, "T", "the LoRA's layers: attn, transformer or all"},
        {"train-text-encoder", ARG_FLAG, &text, NULL, "the text encoder (CLIP ViT-L/14 for a 768-wide UNet, OpenCLIP "
                                                     "ViT-H/14 for 1024) trains along, or its LoRA, reading random "
                                                     "token ids, as `train --train-text-encoder`"},
        {"offload", ARG_FLAG, &offload, NULL, "the fp32 master weights and AdamW moments in host memory, AdamW on the "
                                              "CPU, as `train --offload` (one rank)"},
        {"update-in-backward", ARG_FLAG, &fused, NULL, "update each unit of the weights as soon as its gradients "
                                                       "are done, holding no full gradient buffer (its backward "
                                                       "twice a step, as it clips), as `train --update-in-backward`"},
        {"ema-decay", ARG_FLOAT, &ema_decay, "X", "the EMA's decay, as `train --ema-decay` (0: none kept apart from "
                                                  "the weights)"},
        {"max-gpu-memory", ARG_STR, &max_mem, "SIZE", "cap the GPU memory the engine allocates at SIZE (8G, 7.5GiB): "
                                                      "a step that needs more fails, naming the cap. No plan is "
                                                      "chosen here: give --recompute, --selective-recompute, "
                                                      "--offload or --update-in-backward "
                                                      "(default: off)"},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
        {"gpus", ARG_INT, &gpus, "N", CLI_GPUS_HELP},
        {"ranks", ARG_INT, &ranks, "N", CLI_RANKS_HELP},
        {"zero", ARG_INT, &zero, "S", CLI_ZERO_HELP},
        {"grad-comm", ARG_STR, &grad_comm, "T", CLI_GRAD_COMM_HELP},
        {"comm-timeout", ARG_FLOAT, &comm_timeout, "S", CLI_COMM_TIMEOUT_HELP},
    };
    arg_parser ap = {"diffusion bench --sd-train --unet-config FILE [--size PX] [--batch N] [flags]",
                     "Times training steps of a Stable Diffusion UNet made from a diffusers\n"
                     "config.json with random weights, on random latents [4, PX/8, PX/8] and\n"
                     "random text embeddings [77, cross_attention_dim], through the trainer\n"
                     "`diffusion train` runs: SD's scaled-linear schedule, the epsilon MSE,\n"
                     "AdamW (lr 1e-5, decay 1e-2), clipping at norm 1, EMA. Prints images/s,\n"
                     "ms a step, achieved TFLOP/s (a step counted as 3 forward passes; 1 MAC\n"
                     "= 2 FLOP), MFU against a large matrix product timed on the GPU, and peak\n"
                     "memory (the device's, or the process's on the CPU). With --lora a step\n"
                     "counts as 2 forward passes (the frozen weights take no gradient).\n"
                     "With several ranks (--gpus N, --ranks N, or a launcher's) every rank trains\n"
                     "--batch images a step, their gradients reduced as `diffusion train` reduces\n"
                     "them (--zero S); rank 0 prints the images/s of all ranks and of one, the\n"
                     "slowest rank's time and the largest rank's memory.\n"
                     "tools/sd_train_bench.py measures diffusers on the same workload.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!config) return dc_fail("--unet-config is required"), cli_usage_fail();
    if (size < 0 || size > 4096 || size % 8)
        return dc_fail("--size must be a multiple of 8 up to 4096 (got %d)", size), cli_usage_fail();
    if (batch < 1 || batch > 65535) return dc_fail("--batch must be in 1..65535 (got %d)", batch), cli_usage_fail();
    if (!args_given(&ap, "micro-batch")) micro = batch;
    if (micro < 1 || micro > batch)
        return dc_fail("--micro-batch must be in 1..--batch (got %d)", micro), cli_usage_fail();
    if (steps < 1 || warm < 0)
        return dc_fail("--steps must be positive and --warmup non-negative (got %d, %d)", steps, warm),
               cli_usage_fail();
    if (recompute < -1) return dc_fail("--recompute must be 0 or more (got %d)", recompute), cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    if (train_ranks_check_flags(ranks, gpus, zero, comm_timeout, device)) return cli_usage_fail();
    dc_dtype wire;
    if (train_ranks_grad_comm(grad_comm, &wire)) return cli_usage_fail();
    int64_t cap = 0;
    if (cli_plan_budget(max_mem, &cap)) return cli_usage_fail();

    // ---- several ranks: this process starts them, or is one of them
    train_ranks job;
    int spawn;
    if (train_ranks_plan(&job, ranks, gpus, device, &spawn)) return cli_fail();
    if (spawn) {
        rc = train_ranks_spawn(spawn, argc, argv);
        return rc < 0 ? cli_fail() : rc;
    }
    const int nranks = job.launch.size;
    const bool lead = train_ranks_lead(&job);
    if (train_ranks_select_device(&job, device) || train_ranks_join(&job, comm_timeout)) {
        train_ranks_end(&job);
        return cli_fail();
    }
    dc_kv base = {0}, over = {0}, mc = {0};
    dc_backend *be = NULL;
    dc_model *m = NULL;
    rc = -1;
    if (dc_model_config_of_json(config, &base)) goto done;
    if (size && dc_kv_set(&over, "sample_size", "%d", size / 8)) goto done;
    if (dc_model_configure(&base, &over, NULL, &mc)) goto done;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    if (cap && be->set_memory_cap) be->set_memory_cap(be, (size_t)cap);
    if (bench_model(&mc, be, offload || fused, text, lora, lora_targets, &m)) goto done;
    if (recompute >= 0 && dc_model_set_recompute(m, recompute)) goto done;
    if (dc_model_set_selective(m, selective)) goto done;
    const dc_model_info *mi = &m->info;
    const double macs = dc_model_macs_per_image(m);
    char what[512];
    dc_model_describe(m, what, sizeof what);
    what[strcspn(what, "\n")] = 0;  // its first line: the architecture and its sizes
    if (lead) {
        printf("model   %s: %s\n", config, what);
        printf("        %.1fM parameters; %dx%d pictures, latents %dx%dx%d, text %dx%d; %.4g GFLOP/image forward; "
               "backend %s, %s\n", m->params->numel / 1e6, mi->height * 8, mi->width * 8, mi->channels, mi->height,
               mi->width, mi->ctx_len, mi->ctx_dim, 2 * macs / 1e9, be->name, dc_dtype_name(be->compute));
        if (nranks > 1)
            printf("ranks   %d, %s, ZeRO stage %d, batch %d per rank (%d a step), gradients summed in %s\n", nranks,
                   job.nccl ? "NCCL" : "sockets", zero, batch, batch * nranks, wire == DC_BF16 ? "bf16" : "fp32");
    }
    double peak_tflops = 0;
    if (lead && be->gemm_peak) {
        peak_tflops = be->gemm_peak(be);
        if (peak_tflops <= 0) goto done;
        printf("peak    %.1f TFLOP/s: 8192^3 %s matrix product on this device (MFU is quoted against it)\n",
               peak_tflops, dc_dtype_name(be->compute));
    }
    fflush(stdout);
    measured r;
    if (time_steps(&job, m, be, batch, micro, steps, warm, zero, wire, offload, fused, ema_decay, &r)) goto done;
    // the job's: its global batch, images/s and TFLOP/s of all ranks; MFU a GPU's
    const int global = batch * nranks;
    const double G = 1073741824.0, all = global / r.sec, tf = (lora ? 2 : 3) * 2 * macs * all / 1e12;
    char recomp[48] = "off";
    if (recompute >= 0) snprintf(recomp, sizeof recomp, "keep %d of %d", recompute, mi->blocks);
    if (selective) snprintf(recomp + strlen(recomp), sizeof recomp - strlen(recomp), ", selective");
    if (lead) {
        printf("\n| batch | micro-batch | recompute | img/s | ms/step | TFLOP/s | MFU | peak GiB |\n"
               "|---|---|---|---|---|---|---|---|\n");
        printf("| %d | %d | %s | %.2f | %.2f | %.2f | ", global, micro, recomp, all, r.sec * 1e3, tf);
        if (peak_tflops > 0) printf("%.1f%% |", 100 * tf / nranks / peak_tflops);
        else printf("- |");
        printf(be->memory ? " %.2f (device) |\n" : " %.2f (process RSS) |\n", (be->memory ? r.peak : r.rss) / G);
        printf("sd-train %.2f img/s %.4f s/step %.2f GiB peak\n", all, r.sec, (be->memory ? r.peak : r.rss) / G);
        if (nranks > 1)
            printf("ranks %d: %.2f img/s a rank, the slowest rank's time and the largest rank's memory\n", nranks,
                   all / nranks);
        if (be->memory) printf("device memory held after the steps %.2f GiB\n", r.held / G);
    }
    rc = 0;
done:
    if (rc) {
        train_ranks_abort(&job);  // the others stop too, with this message
        cli_fail();
    }
    train_ranks_end(&job);  // before the backend: NCCL's communicator uses its stream
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
    dc_kv_free(&base), dc_kv_free(&over), dc_kv_free(&mc);
    return rc ? CLI_EXIT_FAILURE : 0;
}
