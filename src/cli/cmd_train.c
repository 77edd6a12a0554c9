// diffusion train: train a DiT from scratch or resume a run.
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "io/json.h"
#include "models/dit_io.h"
#include "train/trainer.h"

#define CKPT_PREFIX "step_"

// Ctrl-C or SIGTERM ends the step in progress, writes a checkpoint and exits,
// so an interrupted run loses nothing and continues with --resume.
static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

// Lists the run directory's checkpoints and removes all but the newest keep.
static void prune_checkpoints(const char *dir, int keep) {
    int64_t *steps;
    int n = cli_list_checkpoints(dir, &steps);
    for (int i = 0; i + keep < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/" CKPT_PREFIX "%07lld.safetensors", dir, (long long)steps[i]);
        if (remove(path) != 0) dc_warn("could not remove old checkpoint %s", path);
    }
    free(steps);
}

static int save(const dc_trainer *tr, const char *dir, int keep, int every, const char *data_path) {
    char path[4096];
    snprintf(path, sizeof path, "%s/" CKPT_PREFIX "%07lld.safetensors", dir, (long long)tr->step);
    dc_kv extra = {0};
    int rc = dc_kv_set(&extra, "dataset", "%s", data_path) || dc_kv_set(&extra, "keep", "%d", keep) ||
             dc_kv_set(&extra, "ckpt_every", "%d", every) || dc_trainer_save(tr, path, &extra);
    dc_kv_free(&extra);
    if (rc) return -1;
    prune_checkpoints(dir, keep);
    return 0;
}

int cmd_train(int argc, char **argv) {
    dc_dit_config mc = cli_demo_model();
    // An official model trains with the official recipe; the demo DiT with its own.
    bool official = false;
    for (int i = 1; i < argc; i++) official |= !strcmp(argv[i], "--model") || !strncmp(argv[i], "--model=", 8);
    dc_train_config tc = official ? dc_train_config_default() : cli_demo_train();
    const char *model = NULL, *data_path = DC_FMNIST_DIR, *out = "runs/train", *resume = NULL;
    const char *device = "auto", *precision = "auto";
    int ckpt_every = 500, keep = 3, log_every = 50, threads = 0, heads = 0;
    bool flip = false;
    arg_spec specs[] = {
        {"model", ARG_STR, &model, "NAME", "official config DiT-{S,B,L,XL}/{2,4,8} (default: the small demo DiT)"},
        {"input-size", ARG_INT, &mc.input_size, "N", "image side (pixels or latent cells)"},
        {"in-channels", ARG_INT, &mc.in_channels, "N", "image channels"},
        {"patch", ARG_INT, &mc.patch, "N", "patch size"},
        {"hidden", ARG_INT, &mc.hidden, "N", "width"},
        {"depth", ARG_INT, &mc.depth, "N", "number of DiT blocks"},
        {"heads", ARG_INT, &heads, "N", "attention heads (default: official table or demo)"},
        {"mlp-hidden", ARG_INT, &mc.mlp_hidden, "N", "MLP width (default 4 x hidden)"},
        {"num-classes", ARG_INT, &mc.num_classes, "N", "number of classes"},
        {"data", ARG_STR, &data_path, "PATH", "Fashion-MNIST IDX folder or a .safetensors data set"},
        {"out", ARG_STR, &out, "DIR", "run folder for checkpoints"},
        {"resume", ARG_STR, &resume, "PATH", "continue from a checkpoint file or run folder"},
        {"steps", ARG_INT, &tc.steps, "N", "total optimizer steps of the run"},
        {"batch", ARG_INT, &tc.batch, "N", "global batch (images per step)"},
        {"micro-batch", ARG_INT, &tc.micro_batch, "N", "images per forward/backward (default: --batch)"},
        {"lr", ARG_FLOAT, &tc.lr, "X", "AdamW learning rate"},
        {"beta1", ARG_FLOAT, &tc.beta1, "X", "AdamW beta1"},
        {"beta2", ARG_FLOAT, &tc.beta2, "X", "AdamW beta2"},
        {"adam-eps", ARG_FLOAT, &tc.adam_eps, "X", "AdamW epsilon"},
        {"weight-decay", ARG_FLOAT, &tc.weight_decay, "X", "AdamW decoupled weight decay"},
        {"warmup", ARG_INT, &tc.warmup, "N", "linear learning-rate warmup steps"},
        {"grad-clip", ARG_FLOAT, &tc.grad_clip, "X", "clip the global gradient norm (0: off)"},
        {"ema-decay", ARG_FLOAT, &tc.ema_decay, "X", "EMA decay"},
        {"class-dropout", ARG_FLOAT, &tc.class_dropout, "X", "label dropout for guidance"},
        {"hflip", ARG_FLAG, &flip, NULL, "random horizontal flips"},
        {"seed", ARG_U64, &tc.seed, "N", "seed of every random choice"},
        {"ckpt-every", ARG_INT, &ckpt_every, "N", "write a checkpoint every N steps"},
        {"keep", ARG_INT, &keep, "K", "keep the newest K checkpoints"},
        {"log-every", ARG_INT, &log_every, "N", "log line every N steps when not on a terminal"},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    arg_parser ap = {"diffusion train [flags]",
                     "Trains a class-conditional DiT with the official objective (eps MSE plus the\n"
                     "variational bound for the learned variance, 1000 linear steps, label dropout\n"
                     "for guidance), AdamW and EMA. Without flags it trains the small demo DiT on\n"
                     "Fashion-MNIST. Checkpoints are written atomically into --out and hold all\n"
                     "state: --resume continues bit-exactly.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_fail();
    if (ckpt_every < 1 || keep < 1 || log_every < 1) return dc_fail("--ckpt-every, --keep and --log-every must be positive"), cli_fail();
    if (flip) tc.hflip = true;
    if (!args_given(&ap, "micro-batch")) tc.micro_batch = tc.batch;
    if (resume) {
        // The checkpoint fixes the model and the recipe; these may change.
        static const char *k_free[] = {"resume", "steps", "out", "data", "ckpt-every", "keep",
                                       "log-every", "threads", "device", "precision"};
        for (int i = 0; i < ap.nspecs; i++) {
            bool free_flag = false;
            for (size_t k = 0; k < sizeof k_free / sizeof k_free[0]; k++)
                free_flag |= strcmp(specs[i].name, k_free[k]) == 0;
            if (!free_flag && args_given(&ap, specs[i].name))
                return dc_fail("--%s is fixed by the checkpoint being resumed", specs[i].name), cli_fail();
        }
    } else {
        const char *shape_flags[] = {"input-size", "in-channels", "patch", "hidden", "depth", "heads",
                                     "mlp-hidden", "num-classes"};
        const int shape_values[] = {mc.input_size, mc.in_channels, mc.patch, mc.hidden, mc.depth,
                                    heads, mc.mlp_hidden, mc.num_classes};
        for (int i = 0; i < 8; i++)
            if (args_given(&ap, shape_flags[i]) && shape_values[i] < 1)
                return dc_fail("--%s must be positive", shape_flags[i]), cli_fail();
    }

    dc_backend *be = NULL;
    dc_dataset ds = {0};
    dc_dit m = {0};
    dc_trainer tr = {0};
    dc_st_file ck = {0};
    bool have_ck = false;
    int status = 1;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto fail;

    char ck_path[4096];
    if (resume) {
        if (cli_resolve_checkpoint(resume, ck_path, sizeof ck_path) || dc_st_open(&ck, ck_path)) goto fail;
        have_ck = true;
        int total = tc.steps;
        if (dc_dit_config_from_file(&ck, "", 0, &mc) ||
            dc_train_config_from_kv(&tc, (const char *const *)ck.meta_keys,
                                    (const char *const *)ck.meta_values, ck.nmeta, ck.path))
            goto fail;
        if (args_given(&ap, "steps")) tc.steps = total;
        const char *ds_meta = dc_st_meta(&ck, "dataset");
        static char data_buf[4096];  // outlives the checkpoint file
        if (ds_meta && !args_given(&ap, "data")) {
            snprintf(data_buf, sizeof data_buf, "%s", ds_meta);
            data_path = data_buf;
        }
        static char dir[4096];
        snprintf(dir, sizeof dir, "%s", ck_path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
        if (!args_given(&ap, "out")) out = dir;
        else if (!cli_same_file(out, dir) && cli_list_checkpoints(out, NULL) > 0) {
            dc_fail("%s already holds checkpoints of another run; resume into an empty folder", out);
            goto fail;
        }
        const char *v;
        if (!args_given(&ap, "keep") && (v = dc_st_meta(&ck, "keep"))) keep = atoi(v) > 0 ? atoi(v) : keep;
        if (!args_given(&ap, "ckpt-every") && (v = dc_st_meta(&ck, "ckpt_every")))
            ckpt_every = atoi(v) > 0 ? atoi(v) : ckpt_every;
        if (dc_dataset_load(&ds, data_path, mc.input_size)) goto fail;
    } else {
        // Start from the demo DiT or an official config; the data set gives
        // the image shape and classes; flags given explicitly win over both.
        dc_dit_config flags = mc;
        if (model && dc_dit_config_from_name(model, &mc)) goto fail;
        if (dc_dataset_load(&ds, data_path, args_given(&ap, "input-size") ? flags.input_size : 0)) goto fail;
        if (ds.height != ds.width) { dc_fail("%s: images are %dx%d; DiT needs square images", data_path, ds.height, ds.width); goto fail; }
        mc.in_channels = ds.channels, mc.input_size = ds.height, mc.num_classes = ds.num_classes;
        if (args_given(&ap, "in-channels")) mc.in_channels = flags.in_channels;
        if (args_given(&ap, "num-classes")) mc.num_classes = flags.num_classes;
        if (args_given(&ap, "patch")) mc.patch = flags.patch;
        if (args_given(&ap, "depth")) mc.depth = flags.depth;
        if (args_given(&ap, "hidden")) {
            mc.hidden = flags.hidden, mc.mlp_hidden = 4 * flags.hidden;
            mc.heads = dc_dit_heads_for_width(mc.hidden);
        }
        if (args_given(&ap, "mlp-hidden")) mc.mlp_hidden = flags.mlp_hidden;
        if (heads) mc.heads = heads;
        if (!mc.heads) { dc_fail("--hidden %d is not in the official table; pass --heads", mc.hidden); goto fail; }
    }
    if (dc_train_config_validate(&tc) || dc_dit_config_validate(&mc)) goto fail;
    static char data_abs[4096];
    if (realpath(data_path, data_abs)) data_path = data_abs;
    if (dc_utf8_invalid_at(data_path, strlen(data_path)) >= 0) {
        dc_fail("data path '%s' is not valid UTF-8 (checkpoints record it); rename it", data_path);
        goto fail;
    }
    if (!resume) {
        if (cli_list_checkpoints(out, NULL) > 0) {
            dc_fail("%s already holds checkpoints of a run: continue it with --resume %s, or "
                    "choose another --out", out, out);
            goto fail;
        }
    }
    if (dc_dit_create(&m, &mc, be, true)) goto fail;
    if (have_ck ? dc_dit_load_weights(&m, &ck, "") : dc_dit_init_weights(&m, tc.seed)) goto fail;
    if (dc_trainer_init(&tr, &m, &ds, &tc)) goto fail;
    if (have_ck) {
        if (dc_trainer_restore(&tr, &ck)) goto fail;
        dc_log("resumed %s at step %lld", ck_path, (long long)tr.step);
        dc_st_close(&ck);
        have_ck = false;
    }
    if (dc_mkdir_p(out)) goto fail;
    if (tr.step >= tc.steps) {
        dc_log("the run is already at step %lld of %d; nothing to do (raise --steps)", (long long)tr.step, tc.steps);
        status = 0;
        goto fail;
    }
    dc_log("training DiT depth %d hidden %d heads %d patch %d on %s (%d images, %d classes), %.2fM params",
           mc.depth, mc.hidden, mc.heads, mc.patch, data_path, ds.n, ds.num_classes,
           m.params.numel / 1e6);
    dc_log("batch %d (micro %d), lr %g, %d steps, checkpoints every %d into %s, backend %s",
           tc.batch, tc.micro_batch, tc.lr, tc.steps, ckpt_every, out, be->name);

    double t0 = dc_time_now(), smooth = 0, shown = 0;
    int64_t first = tr.step, seen = first;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (tr.step < tc.steps) {
        // Steps only queue work; the statistics (which wait for the device)
        // are read for a log line, a checkpoint or the end.
        if (dc_trainer_step(&tr, NULL)) goto fail;
        bool last = tr.step == tc.steps, save_now = tr.step % ckpt_every == 0 || last || g_stop;
        bool tty_due = dc_log_is_tty() && dc_time_now() - shown >= 0.25;
        bool log_now = tty_due || tr.step % log_every == 0 || last || tr.step == first + 1;
        if (log_now || save_now) {
            dc_step_stats st;
            if (dc_trainer_stats(&tr, &st)) goto fail;
            // running mean with weight 0.98 per step, over the steps since the last reading
            double w = pow(0.98, (double)(tr.step - seen));
            smooth = seen == first ? st.loss : w * smooth + (1 - w) * st.loss;
            seen = tr.step;
            double el = dc_time_now() - t0, per = el / (double)(tr.step - first);
            char eta[32];
            if (log_now) {
                shown = dc_time_now();
                dc_progress(last, "step %lld/%d  loss %.4f (mse %.4f vb %.4f)  avg %.4f  |g| %.3f  %.1f img/s  ETA %s",
                            (long long)tr.step, tc.steps, st.loss, st.mse, st.vb, smooth, st.grad_norm,
                            tc.batch / per, dc_format_duration(per * (tc.steps - tr.step), eta, sizeof eta));
            }
        }
        if (save_now) {
            if (save(&tr, out, keep, ckpt_every, data_path)) goto fail;
        }
        if (g_stop && !last) {
            dc_log("interrupted: checkpoint of step %lld written to %s; continue with --resume %s",
                   (long long)tr.step, out, out);
            status = 130;
            goto fail;
        }
    }
    dc_log("done: %lld steps in %.1f s; checkpoint %s/" CKPT_PREFIX "%07lld.safetensors",
           (long long)(tr.step - first), dc_time_now() - t0, out, (long long)tr.step);
    status = 0;
fail:
    if (status == 1) cli_fail();
    if (have_ck) dc_st_close(&ck);
    dc_trainer_free(&tr);
    dc_dit_free(&m);
    dc_dataset_free(&ds);
    if (be) dc_backend_destroy(be);
    return status;
}
