// diffusion bench: training and sampling throughput of a config on synthetic
// data, with achieved FLOP rates and peak memory; training also data parallel
// on several ranks (--gpus N, --ranks N, or a launcher's), through the same
// ranks, communicator and trainer as `diffusion train`.
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
#include "diffusion/gaussian.h"
#include "models/registry.h"
#include "train/trainer.h"
#include "train/zero.h"

static int eval_model(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_model_forward(ctx, out, x, t, cond, B);
}

// Random images in [-1, 1] and labels: the throughput does not depend on content.
static int synthetic_data(dc_dataset *ds, const dc_model_info *c, int n) {
    int64_t img = (int64_t)c->channels * c->height * c->width;
    *ds = (dc_dataset){.n = n, .channels = c->channels, .height = c->height,
                       .width = c->width, .num_classes = c->num_classes};
    ds->images = malloc((size_t)n * img * sizeof(float));
    ds->labels = malloc((size_t)n * sizeof(int32_t));
    if (!ds->images || !ds->labels) return dc_fail("out of memory for synthetic data");
    for (int64_t i = 0; i < n * img; i++)
        ds->images[i] = 2.0f * dc_u32_to_unit(dc_rand_u32_at(1, (uint32_t)(i >> 20), 0, 0, (uint32_t)i)) - 1.0f;
    for (int i = 0; i < n; i++) ds->labels[i] = i % c->num_classes;
    return 0;
}

static double peak_rss_gib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1048576.0;  // ru_maxrss is in KiB on Linux
}

// Peak memory: the device's (what this backend allocated) or the process's.
static void print_memory(dc_backend *be) {
    size_t peak = 0;
    if (be->memory) {
        be->memory(be, NULL, &peak);
        printf("   peak GPU %.2f GiB", peak / 1073741824.0);
    } else {
        printf("   peak RSS %.2f GiB", peak_rss_gib());
    }
}

static double g_peak_tflops;  // measured GEMM ceiling (0: unknown; rank 0 measures it)

// The ZeRO-sharded state per rank (train/zero.h), beside stage 0's: what the
// stage saves is read off this line.
static int print_zero_state(const dc_params *ps, int size, int stage, dc_dtype compute, dc_dtype wire) {
    dc_zero_mem z, z0;
    DC_TRY(dc_zero_mem_of(ps, size, stage, compute, wire, &z));
    DC_TRY(dc_zero_mem_of(ps, size, 0, compute, wire, &z0));
    const double mib = 1048576.0, s = (double)dc_zero_mem_state(&z), s0 = (double)dc_zero_mem_state(&z0);
    printf("zero    stage %d on %d rank%s, per rank: grads %.2f MiB, master %.2f MiB, moments %.2f MiB, "
           "ema %.2f MiB = state %.2f MiB (%.1f%% of stage 0's %.2f MiB); full weight copies %.2f MiB\n",
           stage, size, size == 1 ? "" : "s", z.grads / mib, z.master / mib, z.moments / mib, z.ema / mib,
           s / mib, 100 * s / s0, s0 / mib, z.weights / mib);
    return 0;
}

// Training steps on synthetic data, on every rank of the job: `batch` images
// per rank (as PyTorch DDP counts its batch), so one step is batch x ranks
// images; the gradients are reduced by the trainer's communicator exactly as
// in `diffusion train --zero`. Rank 0 prints.
static int bench_train(train_ranks *job, const dc_kv *mc, dc_backend *be, int batch, int micro, int iters,
                       int warm, int recompute, int zero, bool offload, dc_dtype wire) {
    const int size = job->launch.size;
    const bool lead = train_ranks_lead(job);
    dc_dataset ds = {0};
    dc_model *m = NULL;
    dc_trainer tr = {0};
    dc_train_config tc = dc_train_config_default();
    tc.batch = batch * size, tc.micro_batch = micro;
    tc.steps = iters + warm;
    tc.offload = offload, tc.grad_comm = wire;
    int rc = -1;
    if (cli_offload_settings(&tc.offload_settings) ||
        dc_model_create(mc, be, offload ? DC_GRAD_WINDOW : DC_GRAD_BUFFER, &m) ||
        (recompute >= 0 && dc_model_set_recompute(m, recompute)) ||
        synthetic_data(&ds, &m->info, tc.batch * 4) ||
        dc_model_init_weights(m, 0) || dc_trainer_init(&tr, m, &ds, &tc) || train_ranks_comm(job, be) ||
        ((job->comm || zero) && dc_trainer_set_comm(&tr, job->comm, zero)))
        goto done;
    // Every rank is ready (one that failed has told the others).
    if (train_ranks_agree(job, true, "start")) goto done;
    double t0 = 0;
    for (int i = 0; i < warm + iters; i++) {
        if (i == warm) {  // every rank starts the clock together
            be->sync(be);
            if (dc_backend_status(be) || train_ranks_agree(job, true, "finish the warm-up")) goto done;
            t0 = dc_time_now();
            if (offload) {
                dc_offload *o = (dc_offload *)tr.opt;
                o->busy_s = o->wait_s = 0, o->steps = 0;
            }
        }
        if (dc_trainer_step(&tr, NULL)) goto done;
    }
    if (dc_trainer_sync(&tr)) goto done;  // the last step's update too
    // what this rank measured: seconds a timed step, peak memory (the device's, else the process's
    // RSS), memory held during the steps (-1 without a device); the job's are the largest over the
    // ranks: the slowest rank sets the pace, and memory is quoted for the rank that needs the most
    enum { SEC, PEAK, HELD };
    double r[3] = {(dc_time_now() - t0) / iters, peak_rss_gib() * 1073741824.0, -1};
    if (be->memory) {
        size_t held = 0, peak = 0;
        be->memory(be, &held, &peak);
        r[PEAK] = (double)peak, r[HELD] = (double)held;
    }
    dc_step_stats st;  // a diverged or broken step (NaN loss or gradient) fails the bench
    if (dc_trainer_stats(&tr, &st) || train_ranks_agree(job, true, "finish the timed steps") ||
        train_ranks_max(job, r, 3))
        goto done;
    double dt = r[SEC];
    double flop = 3 * 2 * dc_model_macs_per_image(m) * batch;  // per rank; backward ~ 2x forward
    double tf = flop / dt / 1e12;
    if (lead && size == 1) {
        printf("train   batch %4d   %9.1f img/s   %8.1f ms/step   %8.2f TFLOP/s", batch, batch / dt, dt * 1e3, tf);
    } else if (lead) {
        printf("train   batch %4d x %d ranks   %9.1f img/s total   %9.1f img/s per rank   %8.1f ms/step   "
               "%8.2f TFLOP/s per rank", batch, size, tc.batch / dt, batch / dt, dt * 1e3, tf);
    }
    if (lead) {
        if (g_peak_tflops > 0) printf("   MFU %.1f%%", 100 * tf / g_peak_tflops);
        if (r[HELD] >= 0) printf("   peak GPU %.2f GiB   held %.2f GiB", r[PEAK] / 1073741824.0, r[HELD] / 1073741824.0);
        else printf("   peak RSS %.2f GiB", r[PEAK] / 1073741824.0);
        printf(size > 1 ? " (max over ranks)\n" : "\n");
        if (!offload && print_zero_state(m->params, size, zero, be->compute, wire)) goto done;
        if (offload) {  // what stayed on the device, and what went to the host
            const double mib = 1048576.0, P = (double)m->params->numel;
            printf("offload device: weights %.2f MiB (fp32 kept) + %.2f MiB (compute copy), EMA %.2f MiB, "
                   "unit buffers %.2f MiB; host: master, moments and gradients %.2f MiB\n",
                   4 * (double)(m->params->wc.p ? dc_offload_kept_data(m->params) : m->params->numel) / mib,
                   m->params->wc.p ? P * dc_dtype_size(be->compute) / mib : 0.0, 4 * P / mib,
                   dc_offload_device_bytes_at(m->params, tc.offload_settings.device_share) / mib, 4 * 4 * P / mib);
            const dc_offload *o = (const dc_offload *)tr.opt;
            int64_t lo, dev = 0;
            if (o->dev_units > 0) dc_params_unit_range(m->params, o->dev_units - 1, &lo, &dev);
            printf("offload units: %d of %d (%.0f%% of the parameters) updated on the device, the rest on the CPU\n",
                   o->dev_units, o->units, 100.0 * (double)dev / P);
            if (o->steps)
                printf("offload time: the CPU updates for %.1f ms a step; the host waits %.1f ms a step for the "
                       "updates (after queueing backward, and before each unit's forward)\n",
                       1e3 * o->busy_s / o->steps, 1e3 * o->wait_s / o->steps);
        }
        fflush(stdout);
    }
    rc = 0;
done:
    dc_trainer_free(&tr);
    dc_model_free(m);
    dc_dataset_free(&ds);
    return rc;
}

static int bench_sample(const dc_kv *mc, const dc_model *layout, dc_backend *be, int batch, int steps, float cfg) {
    dc_model *m = NULL;
    dc_sampler s = {0};
    int32_t *y = malloc(batch * sizeof *y);
    uint32_t *idx = malloc(batch * sizeof *idx);
    int64_t img = dc_model_info_numel(&layout->info);
    dc_buf x = {be->alloc(be, batch * img * sizeof(float)), DC_F32};
    dc_buf yd = {be->alloc(be, batch * sizeof(int32_t)), DC_I32};
    int rc = -1, rows = cfg > 1 ? 2 * batch : batch;
    if (!y || !idx || !x.p || !yd.p) { dc_fail("out of memory"); goto done; }
    if (dc_model_create(mc, be, false, &m) || dc_model_init_weights(m, 0) || dc_model_reserve(m, rows)) goto done;
    const dc_model_info *mi = &m->info;
    dc_gaussian_sampler_opts o = dc_gaussian_sampler_opts_default();
    o.steps = steps, o.cfg_scale = cfg, o.learn_sigma = mi->learn_sigma, o.null_class = mi->num_classes;
    for (int i = 0; i < batch; i++) y[i] = i % mi->num_classes, idx[i] = i;
    be->upload(be, yd.p, y, batch * sizeof *y);
    dc_cond cond = {.y = yd};
    if (dc_gaussian_sampler_init(&s, be, &o, mi->channels, mi->height, mi->width, batch)) goto done;
    // warm-up: the first run builds matrix-product plans and (on a GPU) the step's graph
    if (dc_sampler_run(&s, x, &cond, idx, batch, eval_model, NULL, m, NULL, NULL)) goto done;
    be->sync(be);
    double t0 = dc_time_now();
    if (dc_sampler_run(&s, x, &cond, idx, batch, eval_model, NULL, m, NULL, NULL)) goto done;
    be->sync(be);
    if (dc_backend_status(be)) goto done;
    double dt = (dc_time_now() - t0) / steps;
    double flop = 2 * dc_model_macs_per_image(m) * rows;
    printf("sample  batch %4d%s  %9.1f image-steps/s   %8.2f ms/step   %8.2f TFLOP/s", batch,
           cfg > 1 ? " x2 (guidance)" : "", batch / dt, dt * 1e3, flop / dt / 1e12);
    if (be->memory) {  // what sampling holds (the training run before it has freed its share)
        size_t now = 0;
        be->memory(be, &now, NULL);
        printf("   GPU memory %.2f GiB", now / 1073741824.0);
    } else {
        print_memory(be);
    }
    printf("\n");
    fflush(stdout);
    rc = 0;
done:
    if (x.p) be->free(be, x.p);
    if (yd.p) be->free(be, yd.p);
    free(y), free(idx);
    dc_sampler_free(&s);
    dc_model_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *device = "auto", *precision = "auto", *max_mem = NULL, *grad_comm = "fp32";
    int64_t budget = 0;
    int batch = 64, iters = 5, warm = 1, sample_batch = 32, sample_steps = 10, threads = 0, latency = 1;
    int recompute = -1, ranks = 0, gpus = 0, zero = 0;
    float cfg = 4.0f, comm_timeout = 300;
    bool offload = false;
    char h_model[160];
    snprintf(h_model, sizeof h_model, "official config %s (default: the demo model)", dc_model_presets_help());
    arg_spec specs[] = {
        {"model", ARG_STR, &model, "NAME", h_model},
        {"batch", ARG_INT, &batch, "N", "training batch (per rank with several ranks)"},
        {"recompute", ARG_INT, &recompute, "K", "training with activation checkpointing: K blocks keep their "
                                               "activations (default off)"},
        {"iters", ARG_INT, &iters, "N", "timed training steps"},
        {"warmup", ARG_INT, &warm, "N", "untimed training steps first"},
        {"sample-batch", ARG_INT, &sample_batch, "N", "images per sampling step (0: skip sampling)"},
        {"sample-steps", ARG_INT, &sample_steps, "N", "timed sampling steps"},
        {"cfg-scale", ARG_FLOAT, &cfg, "X", "guidance scale while sampling, 0..100 (> 1 doubles the batch)"},
        {"latency", ARG_INT, &latency, "0|1", "also time sampling one image (default 1)"},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
        {"offload", ARG_FLAG, &offload, NULL, "training with the fp32 master weights and AdamW moments in host "
                                              "memory and AdamW on the CPU, the EMA on the device (one rank); "
                                              "prints what the device holds"},
        {"gpus", ARG_INT, &gpus, "N", CLI_GPUS_HELP},
        {"ranks", ARG_INT, &ranks, "N", CLI_RANKS_HELP},
        {"zero", ARG_INT, &zero, "S", CLI_ZERO_HELP},
        {"grad-comm", ARG_STR, &grad_comm, "T", CLI_GRAD_COMM_HELP},
        {"comm-timeout", ARG_FLOAT, &comm_timeout, "S", CLI_COMM_TIMEOUT_HELP},
        {"max-gpu-memory", ARG_STR, &max_mem, "SIZE", "training with the fastest micro-batch, --recompute and "
                                                      "--offload whose predicted peak device memory fits in SIZE "
                                                      "(8G, 7.5GiB, 8000M), printed as the plan; --recompute or "
                                                      "--offload given stay as given. The GPU's allocations are "
                                                      "then capped at SIZE (default: off)"},
    };
    arg_parser ap = {"diffusion bench [--model NAME] [flags]",
                     "Times training steps and sampling steps of a model on synthetic data and\n"
                     "prints images/s, achieved TFLOP/s (a training step counted as 3 forward\n"
                     "passes; 1 MAC = 2 FLOP) and peak memory. On a GPU it first times a large\n"
                     "matrix product in the compute dtype and quotes MFU against it; sampling\n"
                     "runs at --sample-batch and at batch 1 (latency), with guidance.\n"
                     "With several ranks (--gpus N, --ranks N, or a launcher's) it times training\n"
                     "only: every rank trains --batch images a step and the gradients are reduced\n"
                     "as `diffusion train` reduces them (--zero S); rank 0 prints the images/s of\n"
                     "all ranks and of one, MFU per rank, the largest rank's memory and the\n"
                     "per-rank bytes of the state ZeRO shards.\n"
                     "A text-to-image pipeline has its own: see `diffusion --help`.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    // 65535: the most images one forward pass takes (guidance doubles the sampling batch).
    if (batch < 1 || batch > 65535) return dc_fail("--batch must be in 1..65535 (got %d)", batch), cli_usage_fail();
    if (sample_batch < 0 || sample_batch > 32767)
        return dc_fail("--sample-batch must be in 0..32767 (got %d)", sample_batch), cli_usage_fail();
    if (iters < 1 || warm < 0 || sample_steps < 1 || sample_steps > 1000)
        return dc_fail("--iters must be positive, --warmup non-negative and --sample-steps in 1..1000"), cli_usage_fail();
    if (latency != 0 && latency != 1) return dc_fail("--latency must be 0 or 1 (got %d)", latency), cli_usage_fail();
    if (!(cfg >= 0 && cfg <= 100)) return dc_fail("--cfg-scale must be in 0..100 (got %g)", cfg), cli_usage_fail();
    if (train_ranks_check_flags(ranks, gpus, zero, comm_timeout, device)) return cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    if (cli_plan_budget(max_mem, &budget)) return cli_usage_fail();
    dc_dtype wire;
    if (train_ranks_grad_comm(grad_comm, &wire)) return cli_usage_fail();
    dc_kv mc = {0};  // the model's config
    rc = dc_model_preset(model, &mc);  // a name it does not know is a usage error; made again below
    dc_kv_free(&mc);
    if (rc) return cli_usage_fail();

    // ---- several ranks: this process starts them, or is one of them
    train_ranks job;
    int spawn;
    if (train_ranks_plan(&job, ranks, gpus, device, &spawn)) return cli_fail();
    if (spawn) {
        int rc = train_ranks_spawn(spawn, argc, argv);
        return rc < 0 ? cli_fail() : rc;
    }
    const int size = job.launch.size;
    const bool lead = train_ranks_lead(&job);
    if (cli_plan_check_ranks(offload, false, zero, size)) return cli_usage_fail();
    if (train_ranks_select_device(&job, device) || train_ranks_join(&job, comm_timeout)) {
        train_ranks_end(&job);
        return cli_fail();
    }
    dc_backend *be = NULL;
    dc_model *layout = NULL;  // the model sized, nothing allocated
    rc = -1;
    if (dc_model_preset(model, &mc) || dc_model_create(&mc, NULL, DC_GRAD_BUFFER, &layout)) goto done;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    if (lead) {
        char what[512];
        dc_model_describe(layout, what, sizeof what);
        what[strcspn(what, "\n")] = 0;  // its first line: the architecture and its sizes
        printf("model   %s: %s, %.2f GFLOP/image forward; backend %s\n", model ? model : "demo", what,
               2 * dc_model_macs_per_image(layout) / 1e9, be->name);
        if (size > 1)
            printf("ranks   %d, %s, ZeRO stage %d, batch %d per rank (%d per step), gradients summed in %s\n", size,
                   strcmp(be->name, "cpu") ? "NCCL" : "sockets", zero, batch, batch * size,
                   wire == DC_BF16 ? "bf16" : "fp32");
    }
    if (lead && be->gemm_peak) {
        g_peak_tflops = be->gemm_peak(be);
        if (g_peak_tflops <= 0) goto done;
        printf("peak    %.1f TFLOP/s: 8192^3 %s matrix product on this device (MFU is quoted against it)\n",
               g_peak_tflops, dc_dtype_name(be->compute));
    }
    fflush(stdout);
    int micro = batch;
    if (max_mem) {  // the fastest plan that fits; --recompute and --offload given fix their part of it
        char line[256];
        micro = 0;  // bench has no --micro-batch: the plan picks it
        if (cli_plan_choose(layout, be, budget, batch * size, size, zero, wire, false, false, &micro, &recompute,
                            &offload, NULL, NULL, line, sizeof line))
            goto done;
        if (lead) printf("%s\n", line), fflush(stdout);
    }
    rc = bench_train(&job, &mc, be, batch, micro, iters, warm, recompute, zero, offload, wire);
    // Sampling involves no communication: with several ranks it is not timed.
    if (!rc && size == 1 && sample_batch > 0) rc = bench_sample(&mc, layout, be, sample_batch, sample_steps, cfg);
    if (!rc && size == 1 && sample_batch > 1 && latency) rc = bench_sample(&mc, layout, be, 1, sample_steps, cfg);
done:
    if (rc) {
        train_ranks_abort(&job);  // the others stop too, with this message
        cli_fail();
    }
    train_ranks_end(&job);  // before the backend: NCCL's communicator uses its stream
    dc_model_free(layout);
    dc_kv_free(&mc);
    if (be) dc_backend_destroy(be);
    return rc ? CLI_EXIT_FAILURE : 0;
}
