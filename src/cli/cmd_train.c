// diffusion train: train a model from scratch or resume a run.
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli_plan.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/run_folder.h"
#include "cli/train_log.h"
#include "cli/train_ranks.h"
#include "cli/dreambooth.h"
#include "cli/train_t2i.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "io/json.h"
#include "models/model_io.h"
#include "models/registry.h"
#include "train/trainer.h"

// Ctrl-C, SIGTERM, SIGHUP (the terminal closed) and SIGPIPE (the log's reader
// went away, as in `diffusion train 2>&1 | head`) end the step in progress,
// write a checkpoint and exit, so an interrupted run loses nothing and
// continues with --resume. Before training starts there is nothing to save
// and the signal ends the process at once, saying so; after it ends (while
// the process tidies up) it ends the process. The handlers are installed
// before any slow work, so that no signal is ever missed.
enum { BEFORE, TRAINING, AFTER };
static volatile sig_atomic_t g_stop, g_phase = BEFORE;
// Only write() is safe in a handler: whole messages, no formatting.
#define SAY(s) ((void)!write(STDERR_FILENO, s, sizeof s - 1))
#define STOPPED(name) "interrupted (" name ") before the first step: nothing was saved\n"
static void on_signal(int sig) {
    if (g_phase == BEFORE) {
        switch (sig) {
        case SIGINT: SAY(STOPPED("Interrupt")); break;
        case SIGTERM: SAY(STOPPED("Terminated")); break;
        case SIGHUP: SAY(STOPPED("Hangup")); break;
        case SIGPIPE: SAY(STOPPED("Broken pipe")); break;
        }
        _exit(128 + sig);
    }
    if (g_phase == AFTER) _exit(128 + sig);
    g_stop = sig;
}

static void install_signal_handlers(void) {
    // With SIGPIPE handled, a write to the closed pipe fails with EPIPE, which
    // the logging ignores: the run goes on to its checkpoint.
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    cli_handle_signals(on_signal, sigs, (int)(sizeof sigs / sizeof sigs[0]));
}

// The files a run writes or removes in its folder against those it reads: the
// .lock against the data set and the checkpoint resumed, the step_* files
// (checkpoints, their temporaries) against the data set.
static int check_run_outputs(const char *out, const char *resume, const char *data_path) {
    cli_inputs data = {0}, all = {0};
    int bad = cli_inputs_add(&data, "--data", data_path) || cli_inputs_add(&all, "--data", data_path) ||
              cli_inputs_add_checkpoint(&all, "--resume", resume) || cli_check_stdio(&all) ||
              cli_check_folder_outputs(&all, out, ".lock") || cli_check_folder_outputs(&data, out, "step_");
    cli_inputs_free(&data), cli_inputs_free(&all);
    return bad;
}

// Every rank calls it (the save is collective: under ZeRO the shards are
// gathered onto rank 0); rank 0 writes the file. The ranks first agree that
// all of them got here with sound statistics, so a rank that failed this
// step leaves no checkpoint behind, then that rank 0 wrote it. The file
// also records the step's loss (every digit, for comparing runs).
static int save(train_ranks *job, const dc_trainer *tr, const char *dir, int keep, int every, const char *data_path,
                const t2i_run *sd, double loss) {
    DC_TRY(train_ranks_agree(job, true, "reach the checkpoint"));
    char path[4096];
    cli_checkpoint_path(dir, tr->step, path, sizeof path);
    dc_kv extra = {0};
    int rc = dc_kv_set(&extra, "dataset", "%s", data_path) || dc_kv_set(&extra, "keep", "%d", keep) ||
             dc_kv_set(&extra, "ckpt_every", "%d", every) || dc_kv_set(&extra, "loss", "%.17g", loss) ||
             (sd && t2i_checkpoint_meta(sd, &extra)) || dc_trainer_save(tr, path, &extra);
    dc_kv_free(&extra);
    DC_TRY(train_ranks_agree(job, rc == 0, "write the checkpoint"));
    if (train_ranks_lead(job)) cli_prune_checkpoints(dir, keep, tr->step);
    if (train_ranks_lead(job) && sd && sd->lora_rank > 0 && t2i_write_lora(sd, path, tr->step))
        return dc_fail_ctx("%s/lora.safetensors", dir);
    return 0;
}

// The shape flags: entries of the model's config (models/registry.h) that
// override the --model's (or the demo model's). Those the data set gives
// (image side, channels, classes) otherwise come from the data.
static const struct { const char *flag, *key; } k_shape[] = {
    {"input-size", "input_size"}, {"in-channels", "in_channels"}, {"patch", "patch_size"},
    {"hidden", "hidden_size"},    {"depth", "depth"},             {"heads", "num_heads"},
    {"mlp-hidden", "mlp_hidden"}, {"num-classes", "num_classes"},
};
enum { N_SHAPE = sizeof k_shape / sizeof k_shape[0] };

// The config of a new run: the demo model or --model's preset with the shape
// flags given; with data NULL (the data set not read yet) checked as far as
// the flags fix it, else completed with what the data gives.
static int model_config(const char *model, const arg_parser *ap, const int *shape, const dc_data_shape *data,
                        dc_kv *cfg) {
    dc_kv base = {0}, ov = {0};
    int rc = dc_model_preset(model, &base);
    for (int i = 0; i < N_SHAPE && !rc; i++)
        if (args_given(ap, k_shape[i].flag)) rc = dc_kv_set(&ov, k_shape[i].key, "%d", shape[i]);
    if (!rc) rc = dc_model_configure(&base, &ov, data, cfg);
    dc_kv_free(&base), dc_kv_free(&ov);
    return rc;
}

// A text-to-image run's sampling grids: every `every` steps (with a
// checkpoint then), rank 0 draws them from the checkpoint just written.
typedef struct {
    t2i_run *sd;
    t2i_grid_opts opts;
    int every;  // 0: none
    dc_backend *be;
} grids;

static void draw_grid(const grids *g, const char *out, int64_t step) {
    char ckpt[4096], dir[4200], png[4300];
    cli_checkpoint_path(out, step, ckpt, sizeof ckpt);
    snprintf(dir, sizeof dir, "%s/samples", out);
    snprintf(png, sizeof png, "%s/step_%07lld.png", dir, (long long)step);
    double t0 = dc_time_now();
    if (dc_mkdir_p(dir) || t2i_grid(g->sd, ckpt, png, &g->opts, g->be))
        dc_warn("no sampling grid at step %lld: %s", (long long)step, dc_error());
    else
        dc_log("sampling grid of step %lld: %s (%.1f s)", (long long)step, png, dc_time_now() - t0);
}

// The run's steps, with progress lines, checkpoints and signals: 0 when it
// reached its last step, 128 + the signal's number when one stopped it (after
// a checkpoint), -1 on failure; *wrote once a checkpoint is written.
static int run_steps(train_ranks *job, dc_trainer *tr, const dc_train_config *tc, const char *out, int keep,
                     int ckpt_every, int log_every, const char *data_path, const grids *gr, train_log *lg,
                     bool *wrote) {
    const bool lead = train_ranks_lead(job);
    double t0 = dc_time_now(), smooth = 0, shown = 0;
    int64_t first = tr->step, seen = first;
    g_phase = TRAINING;
    while (tr->step < tc->steps) {
        // Steps only queue work; the statistics (which wait for the device)
        // are read for a log line, a checkpoint or the end.
        if (dc_trainer_step(tr, NULL)) return -1;
        // Read once: a signal that arrives later in this step (while logging,
        // say) is acted on after the next one, never between saving and stopping.
        // With several ranks every rank learns every rank's signal here, and
        // all read the statistics at rank 0's moments: they stop together.
        int stop = g_stop, stop_rank;
        bool tty_due = lead && dc_log_is_tty() && dc_time_now() - shown >= 0.25;
        if (train_ranks_step(job, stop, tty_due, &stop, &stop_rank, &tty_due)) return -1;
        bool grid_now = gr->every && tr->step % gr->every == 0;
        bool last = tr->step == tc->steps, save_now = tr->step % ckpt_every == 0 || last || stop || grid_now;
        bool row_now = tr->step % log_every == 0 || last || tr->step == first + 1;  // loss.csv's rows
        bool log_now = tty_due || row_now;
        dc_step_stats st = {0};
        if (log_now || save_now) {
            if (dc_trainer_stats(tr, &st)) return -1;
            // running mean with weight 0.98 per step, over the steps since the last reading
            double w = pow(0.98, (double)(tr->step - seen));
            smooth = seen == first ? st.loss : w * smooth + (1 - w) * st.loss;
            seen = tr->step;
            double el = dc_time_now() - t0, per = el / (double)(tr->step - first);
            char eta[32];
            if (log_now && lead) {
                shown = dc_time_now();
                dc_progress(last, "step %lld/%d  loss %.4f (mse %.4f vb %.4f)  avg %.4f  |g| %.3f  %.1f img/s  ETA %s",
                            (long long)tr->step, tc->steps, st.loss, st.mse, st.vb, smooth, st.grad_norm,
                            tc->batch / per, dc_format_duration(per * (tc->steps - tr->step), eta, sizeof eta));
            }
            if (row_now && lead && train_log_row(lg, tr->step, st.loss, smooth, st.grad_norm, st.lr, tc->batch / per))
                return -1;
        }
        if (save_now) {
            if (save(job, tr, out, keep, ckpt_every, data_path, gr->sd, st.loss)) return -1;
            if (lead && train_log_plot(lg)) dc_warn("the loss plot: %s", dc_error());
            if (lead && grid_now) draw_grid(gr, out, tr->step);
            *wrote = true;
        }
        if (stop && !last) {
            char on[32] = "";
            if (job->rv) snprintf(on, sizeof on, " on rank %d", stop_rank);
            if (lead)
                dc_log("interrupted (%s%s): checkpoint of step %lld written to %s; continue with --resume %s",
                       strsignal(stop), on, (long long)tr->step, out, out);
            return 128 + stop;
        }
    }
    if (lead)
        dc_log("done: %lld steps in %.1f s; checkpoint %s/step_%07lld.safetensors", (long long)(tr->step - first),
               dc_time_now() - t0, out, (long long)tr->step);
    return 0;
}

// The value of --model on the command line (NULL: not given), before parsing.
static const char *model_arg(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model")) return i + 1 < argc ? argv[i + 1] : NULL;
        if (!strncmp(argv[i], "--model=", 8)) return argv[i] + 8;
    }
    return NULL;
}

int cmd_train(int argc, char **argv) {
    install_signal_handlers();
    // An official model trains with the official recipe, a Stable Diffusion
    // model (a path) with diffusers' fine-tuning recipe, the demo model with its own.
    const char *given_model = model_arg(argc, argv);
    bool t2i = t2i_is_model_path(given_model);
    dc_train_config tc = t2i ? t2i_train_config_default() : given_model ? dc_train_config_default() : cli_demo_train();
    const char *model = NULL, *data_path = DC_FMNIST_DIR, *out = "runs/train", *resume = NULL;
    const char *device = "auto", *precision = "auto", *max_mem = NULL, *grad_comm = "fp32", *ema_warmup = NULL;
    const char *unet_config = NULL, *init = NULL, *prediction = NULL, *vocab = NULL, *sample_prompts = NULL;
    int sample_every = -1, sample_steps = 25;  // -1: at every checkpoint
    float sample_cfg = 5.0f;
    float caption_dropout = tc.class_dropout;
    t2i_columns cols = {0};  // the data set's columns, as mapped by flags
    int64_t budget = 0;
    int ckpt_every = 500, keep = 3, log_every = 50, threads = 0, recompute = -1;
    int shape[N_SHAPE] = {0};  // the shape flags' values, as k_shape lists them
    int ranks = 0, gpus = 0, zero = 0;
    float comm_timeout = 300;
    bool flip = false, force = false, allow_data_change = false, no_verify = false, offload = false, fused = false;
    bool selective = false;
    bool train_text = false;
    int lora = 0;  // a LoRA's rank; 0: the UNet itself trains
    float lora_alpha = 0;
    const char *lora_targets = NULL, *lora_format = NULL;
    t2i_dreambooth db = {0};  // DreamBooth: the instance and class pictures (cli/dreambooth.h)
    int class_images = 100, resolution = 0;
    float prior_weight = 1.0f;
    // Shape flags default to the --model's values or the demo model's: say both.
    dc_kv demo = {0};
    if (dc_model_preset(NULL, &demo)) return cli_fail();
    char h_model[256], h_patch[96], h_hidden[96], h_depth[96], h_heads[128];
    snprintf(h_model, sizeof h_model, "a Stable Diffusion model to fine-tune (diffusers folder or single file), or an "
             "official config %s (default: the small demo model)", dc_model_presets_help());
    snprintf(h_patch, sizeof h_patch, "patch size (default: the --model's, else %s)", dc_kv_get(&demo, "patch_size"));
    snprintf(h_hidden, sizeof h_hidden, "width (default: the --model's, else %s)", dc_kv_get(&demo, "hidden_size"));
    snprintf(h_depth, sizeof h_depth, "number of blocks (default: the --model's, else %s)", dc_kv_get(&demo, "depth"));
    snprintf(h_heads, sizeof h_heads, "attention heads (default: the --model's, or the official "
             "table's for --hidden, else %s)", dc_kv_get(&demo, "num_heads"));
    dc_kv_free(&demo);
    arg_spec specs[] = {
        {"model", ARG_STR, &model, "NAME", h_model},
        {"input-size", ARG_INT, &shape[0], "N", "image side; larger than the data's pads it (default: the data's)"},
        {"in-channels", ARG_INT, &shape[1], "N", "image channels (default: the data's)"},
        {"patch", ARG_INT, &shape[2], "N", h_patch},
        {"hidden", ARG_INT, &shape[3], "N", h_hidden},
        {"depth", ARG_INT, &shape[4], "N", h_depth},
        {"heads", ARG_INT, &shape[5], "N", h_heads},
        {"mlp-hidden", ARG_INT, &shape[6], "N", "MLP width (default: 4 x hidden)"},
        {"num-classes", ARG_INT, &shape[7], "N", "number of classes (default: the data's)"},
        {"unet-config", ARG_STR, &unet_config, "FILE", "SD: the UNet to train from scratch, a diffusers config.json, "
                                                        "or sd1.5 or sd2.1 for SD's own (default: the --model's "
                                                        "UNet)"},
        {"init", ARG_STR, &init, "FROM", "SD: the UNet's weights start from the --model's (base) or random "
                                         "(PyTorch's initialisation) (default: base; random with --unet-config)"},
        {"prediction", ARG_STR, &prediction, "P", "SD: what the UNet learns to predict: eps, v or sample (default: "
                                                  "the --model's scheduler config, else eps)"},
        {"min-snr-gamma", ARG_FLOAT, &tc.objective.min_snr_gamma, "X", "SD: Min-SNR loss weighting with gamma X "
                                                                      "(5 is usual; 0: off)"},
        {"noise-offset", ARG_FLOAT, &tc.objective.noise_offset, "X", "SD: noise offset (0.1 is usual; 0: off)"},
        {"caption-dropout", ARG_FLOAT, &caption_dropout, "X", "SD: share of captions replaced by the empty prompt, "
                                                              "for classifier-free guidance"},
        {"train-text-encoder", ARG_FLAG, &train_text, NULL, "SD: train the --model's CLIP text encoder along with "
                                                              "the UNet, on the data's captions (EMA and exports "
                                                              "carry both)"},
        {"lora", ARG_INT, &lora, "RANK", "SD: train a LoRA of rank RANK of the --model's UNet (and text encoder, "
                                         "with --train-text-encoder) instead of the weights, which stay frozen as "
                                         "loaded; RUN/lora.safetensors holds the newest checkpoint's (default lr "
                                         "1e-4)"},
        {"lora-alpha", ARG_FLOAT, &lora_alpha, "A", "SD: the LoRA's alpha, its deltas scaled by A / RANK (default: "
                                                    "RANK, a scale of 1)"},
        {"lora-targets", ARG_STR, &lora_targets, "T", "SD: the layers the LoRA adapts: attn (the attention "
                                                      "projections), transformer (also the feed-forward and "
                                                      "proj_in/out, as kohya does) or all (also the resnets' "
                                                      "and resamplers' convolutions: LoCon) (default: transformer)"},
        {"lora-format", ARG_STR, &lora_format, "F", "SD: lora.safetensors in kohya's format (AUTOMATIC1111, "
                                                    "ComfyUI) or diffusers' (default: kohya)"},
        {"instance-data", ARG_STR, &db.instance_data, "DIR", "SD DreamBooth: pictures of the subject to teach "
                                                             "(its caption files are not read)"},
        {"instance-prompt", ARG_STR, &db.instance_prompt, "TEXT", "SD DreamBooth: their caption, naming the subject "
                                                                  "by a rare token (\"a photo of sks dog\")"},
        {"class-prompt", ARG_STR, &db.class_prompt, "TEXT", "SD DreamBooth: prior preservation on pictures of the "
                                                            "subject's class (\"a photo of a dog\"), drawn by the "
                                                            "--model where --class-data holds too few"},
        {"class-data", ARG_STR, &db.class_data, "DIR", "SD DreamBooth: the class pictures' folder (default: "
                                                       "RUN/dreambooth/class_images)"},
        {"class-images", ARG_INT, &class_images, "N", "SD DreamBooth: the class pictures wanted"},
        {"prior-loss-weight", ARG_FLOAT, &prior_weight, "W", "SD DreamBooth: the class pictures' loss weight"},
        {"resolution", ARG_INT, &resolution, "PX", "SD DreamBooth: the pictures' side (default: the model's)"},
        {"vocab", ARG_STR, &vocab, "PATH", "SD: CLIP vocabulary (default: the model's tokenizer/, else searched)"},
        {"sample-every", ARG_INT, &sample_every, "N", "SD: draw a grid of the sampling prompts into RUN/samples/ "
                                                      "every N steps, from a checkpoint written then (0: never; "
                                                      "default: at every checkpoint)"},
        {"sample-prompts", ARG_STR, &sample_prompts, "FILE", "SD: the grid's prompts, one a line, up to 8 (default: "
                                                            "the first 8 different captions of the data)"},
        {"sample-steps", ARG_INT, &sample_steps, "N", "SD: the grid's DDIM steps"},
        {"sample-cfg", ARG_FLOAT, &sample_cfg, "X", "SD: the grid's guidance scale"},
        {"data", ARG_STR, &data_path, "PATH", "Fashion-MNIST IDX folder or a .safetensors data set; SD: a data "
                                              "set `diffusion prepare` wrote, or MDS shards whose columns the "
                                              "next flags name"},
        {"latents-column", ARG_STR, &cols.latents, "NAME", "SD: the column holding one latent a sample, unscaled "
                                                           "(MosaicML's latents_256); no prepare.json needed"},
        {"text-column", ARG_STR, &cols.text, "NAME", "SD: the column holding the text embeddings (MosaicML's "
                                                     "caption_latents); every position counts"},
        {"column-shape", ARG_STR, &cols.shapes, "NAME=D0,..", "SD: shapes of bytes columns of raw values, e.g. "
                                                              "latents_256=4,32,32 (default for the text column: "
                                                              "the text encoder's, 77,1024 for SD 2)"},
        {"column-dtype", ARG_STR, &cols.dtypes, "NAME=T,..", "SD: value types of bytes columns: float16, float32 or "
                                                             "bfloat16 (default: float16)"},
        {"latent-scale", ARG_FLOAT, &cols.scale, "X", "SD: the VAE scaling factor of a data set without prepare.json "
                                                      "(default: the --model's VAE config's, 0.18215 for SD)"},
        {"out", ARG_STR, &out, "DIR", "run folder for checkpoints"},
        {"resume", ARG_STR, &resume, "PATH", "continue from a checkpoint file or run folder"},
        {"force", ARG_FLAG, &force, NULL, "resume from a checkpoint older than the run's newest (the newer ones are deleted)"},
        {"allow-data-change", ARG_FLAG, &allow_data_change, NULL, "resume on a data set that differs from the checkpoint's"},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
        {"steps", ARG_INT, &tc.steps, "N", "total optimizer steps of the run"},
        {"batch", ARG_INT, &tc.batch, "N", "global batch (images per step)"},
        {"micro-batch", ARG_INT, &tc.micro_batch, "N", "images per forward/backward (default: --batch)"},
        {"recompute", ARG_INT, &recompute, "K", "activation checkpointing: the first K blocks keep their "
                                               "activations, the others recompute theirs in backward (0: all "
                                               "recompute; default off: all keep)"},
        {"selective-recompute", ARG_FLAG, &selective, NULL, "keep no result that a norm or activation rebuilds "
                                                            "cheaply (the backward computes it again: the same "
                                                            "gradients, in less memory, a little slower; a UNet)"},
        {"lr", ARG_FLOAT, &tc.lr, "X", "AdamW learning rate"},
        {"beta1", ARG_FLOAT, &tc.beta1, "X", "AdamW beta1"},
        {"beta2", ARG_FLOAT, &tc.beta2, "X", "AdamW beta2"},
        {"adam-eps", ARG_FLOAT, &tc.adam_eps, "X", "AdamW epsilon"},
        {"weight-decay", ARG_FLOAT, &tc.weight_decay, "X", "AdamW decoupled weight decay"},
        {"warmup", ARG_INT, &tc.warmup, "N", "linear learning-rate warmup steps"},
        {"grad-clip", ARG_FLOAT, &tc.grad_clip, "X", "clip the global gradient norm (0: off)"},
        {"ema-decay", ARG_FLOAT, &tc.ema_decay, "X", "EMA decay (0: the EMA is the weights, and no copy of it is "
                                                     "kept: 4 bytes a parameter less)"},
        {"ema-warmup", ARG_STR, &ema_warmup, "on|off", "EMA warm-up: decay min(--ema-decay, (1 + n) / (10 + n)) "
                                                     "at update n + 1 (the first copies the weights), as "
                                                     "diffusers' EMAModel; off: --ema-decay from the start, as the "
                                                     "official code of Peebles & Xie (default: on)"},
        {"class-dropout", ARG_FLOAT, &tc.class_dropout, "X", "label dropout for guidance"},
        {"hflip", ARG_FLAG, &flip, NULL, "random horizontal flips"},
        {"seed", ARG_U64, &tc.seed, "N", "seed of every random choice"},
        {"ckpt-every", ARG_INT, &ckpt_every, "N", "write a checkpoint every N steps"},
        {"keep", ARG_INT, &keep, "K", "keep the newest K checkpoints"},
        {"log-every", ARG_INT, &log_every, "N", "log line every N steps when not on a terminal"},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
        {"gpus", ARG_INT, &gpus, "N", CLI_GPUS_HELP},
        {"ranks", ARG_INT, &ranks, "N", CLI_RANKS_HELP},
        {"zero", ARG_INT, &zero, "S", CLI_ZERO_HELP},
        {"grad-comm", ARG_STR, &grad_comm, "T", CLI_GRAD_COMM_HELP},
        {"comm-timeout", ARG_FLOAT, &comm_timeout, "S", CLI_COMM_TIMEOUT_HELP},
        {"offload", ARG_FLAG, &offload, NULL, "keep the fp32 master weights and AdamW moments in host memory and "
                                              "run AdamW on the CPU beside the GPU's backward (one rank)"},
        {"update-in-backward", ARG_FLAG, &fused, NULL, "update each unit of the weights as soon as its gradients are "
                                                       "done, holding no full gradient buffer (4 bytes a parameter "
                                                       "less); with --grad-clip a step runs its backward twice, "
                                                       "the first pass for the norm (one rank, no accumulation)"},
        {"max-gpu-memory", ARG_STR, &max_mem, "SIZE", "pick the fastest --micro-batch, --recompute, "
                                                      "--selective-recompute, --offload and "
                                                      "--update-in-backward whose predicted peak device memory fits "
                                                      "in SIZE (8G, 7.5GiB, 8000M) and print the plan; those given "
                                                      "on the command line stay as given. The GPU's allocations are "
                                                      "then capped at SIZE (default: off)"},
    };
    arg_parser ap = {"diffusion train [flags]",
                     "Trains a class-conditional model with the official objective (eps MSE plus the\n"
                     "variational bound for the learned variance, 1000 linear steps, label dropout\n"
                     "for guidance), AdamW and EMA. Without flags it trains the small demo model on\n"
                     "Fashion-MNIST. With --model SD_PATH it fine-tunes that Stable Diffusion model's\n"
                     "UNet (or trains one from scratch: --unet-config, --init random) on the captioned\n"
                     "pictures `diffusion prepare` wrote (--data; or shards mosaicml/streaming wrote,\n"
                     "their columns named by --latents-column and --text-column), with diffusers'\n"
                     "recipe (lr 1e-5, batch 16, weight decay 0.01, clipping at 1, EMA) and 10%\n"
                     "caption dropout; the run folder is a model txt2img loads (its newest\n"
                     "checkpoint's EMA UNet with the base's text encoder, VAE and scheduler), and\n"
                     "each run writes loss.csv and loss.png. Checkpoints are written atomically into\n"
                     "--out and hold all state: --resume continues bit-exactly. One training run at\n"
                     "a time may write into a folder (it holds the folder's .lock file). Ctrl-C,\n"
                     "SIGTERM, SIGHUP and SIGPIPE write a checkpoint and exit with 128 + the\n"
                     "signal's number.\n"
                     "Several ranks (--gpus N, --ranks N, or started by torchrun, mpirun or srun)\n"
                     "split each global batch; rank 0 logs and writes checkpoints, a signal to any\n"
                     "rank checkpoints and stops them all, and a rank that fails or dies stops them\n"
                     "all with its message.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();

    // ---- the command line alone: usage errors (exit 2) before anything happens
    if (args_given(&ap, "sample-every") && sample_every < 0)
        return dc_fail("--sample-every %d: 0 (never) or more", sample_every), cli_usage_fail();
    if (sample_steps < 1 || sample_steps > 1000 || !(sample_cfg >= 1 && sample_cfg <= 100))
        return dc_fail("--sample-steps must be 1..1000 and --sample-cfg 1..100"), cli_usage_fail();
    if (ckpt_every < 1 || keep < 1 || log_every < 1)
        return dc_fail("--ckpt-every, --keep and --log-every must be positive"), cli_usage_fail();
    if (args_given(&ap, "recompute") && recompute < 0)
        return dc_fail("--recompute %d: blocks that keep their activations, 0 or more", recompute), cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    if (cli_plan_budget(max_mem, &budget)) return cli_usage_fail();
    dc_dtype wire;
    if (train_ranks_grad_comm(grad_comm, &wire)) return cli_usage_fail();
    if (flip) tc.hflip = true;
    if (ema_warmup && strcmp(ema_warmup, "on") && strcmp(ema_warmup, "off"))
        return dc_fail("--ema-warmup must be on or off (got '%s')", ema_warmup), cli_usage_fail();
    if (ema_warmup) tc.ema_warmup = strcmp(ema_warmup, "on") == 0;
    if (init && strcmp(init, "base") && strcmp(init, "random"))
        return dc_fail("--init must be base or random (got '%s')", init), cli_usage_fail();
    int pred = -1;  // -1: the scheduler config's
    if (prediction && t2i_parse_prediction(prediction, &pred)) return cli_usage_fail();
    if (t2i_flags_check(&ap, t2i || resume, unet_config, init)) return cli_usage_fail();
    if (args_given(&ap, "caption-dropout")) tc.class_dropout = caption_dropout;
    if (db.instance_data) {  // DreamBooth's recipe (diffusers' train_dreambooth.py): no caption dropout
        if (t2i_dreambooth_flags(&ap, &db, class_images, resolution)) return cli_usage_fail();
        if (!args_given(&ap, "caption-dropout")) tc.class_dropout = 0;
        if (!args_given(&ap, "lr")) tc.lr = lora ? 1e-4f : 5e-6f;
        if (!args_given(&ap, "batch")) tc.batch = db.class_prompt ? 2 : 1;  // an instance and a class picture
    } else if (t2i_dreambooth_flags(&ap, NULL, 0, 0)) {
        return cli_usage_fail();
    }
    if (!args_given(&ap, "micro-batch")) tc.micro_batch = tc.batch;
    if (resume) {
        // The checkpoint fixes the model and the recipe; these may change.
        static const char *k_free[] = {"resume", "steps", "out", "data", "ckpt-every", "keep",
                                       "log-every", "threads", "device", "precision", "force",
                                       "allow-data-change", "no-verify", "recompute", "vocab", "sample-every",
                                       "sample-prompts", "sample-steps", "sample-cfg",
                                       "ranks", "gpus", "zero", "grad-comm", "comm-timeout", "offload",
                                       "update-in-backward", "max-gpu-memory", "lora-format"};
        for (int i = 0; i < ap.nspecs; i++) {
            bool free_flag = false;
            for (size_t k = 0; k < sizeof k_free / sizeof k_free[0]; k++)
                free_flag |= strcmp(specs[i].name, k_free[k]) == 0;
            if (!free_flag && args_given(&ap, specs[i].name))
                return dc_fail("--%s is fixed by the checkpoint being resumed", specs[i].name), cli_usage_fail();
        }
        if (args_given(&ap, "steps") && tc.steps < 1)
            return dc_fail("--steps must be at least 1 (got %d)", tc.steps), cli_usage_fail();
    } else {
        if (force || allow_data_change)
            return dc_fail("--%s only applies with --resume", force ? "force" : "allow-data-change"), cli_usage_fail();
        for (int i = 0; i < N_SHAPE; i++)
            if (args_given(&ap, k_shape[i].flag) && shape[i] < 1)
                return dc_fail("--%s must be positive", k_shape[i].flag), cli_usage_fail();
        if (pred >= 0) tc.objective.prediction = (dc_prediction)pred;
        if (dc_train_config_validate(&tc)) return cli_usage_fail();
        dc_kv checked = {0};
        int bad = !t2i && model_config(model, &ap, shape, NULL, &checked);
        dc_kv_free(&checked);
        if (bad) return cli_usage_fail();
    }
    if (train_ranks_check_flags(ranks, gpus, zero, comm_timeout, device)) return cli_usage_fail();
    unsigned st_flags = no_verify ? DC_ST_NO_VERIFY : 0;

    // ---- several ranks: this process starts them, or is one of them
    train_ranks job;
    int spawn;
    if (train_ranks_plan(&job, ranks, gpus, device, &spawn)) return cli_fail();
    if (spawn) {
        int rc = train_ranks_spawn(spawn, argc, argv);
        return rc < 0 ? cli_fail() : rc;
    }
    const bool lead = train_ranks_lead(&job);
    if (cli_plan_check_ranks(offload, fused, zero, job.launch.size)) return cli_usage_fail();
    if (train_ranks_select_device(&job, device) || train_ranks_join(&job, comm_timeout)) {
        train_ranks_end(&job);
        return cli_fail();
    }

    dc_backend *be = NULL;
    dc_dataset ds = {0};                 // class-labelled data, in memory
    dc_source src = {0};                 // where the samples come from (ds, or shards)
    t2i_run sd = {0};                    // a text-to-image run's base model
    dc_schedule sched = {0};             // its schedule (DiT: the trainer's own)
    dc_model *m = NULL, *layout = NULL;  // layout: the model sized, nothing allocated
    dc_kv mc = {0};                      // the model's config
    dc_trainer tr = {0};
    dc_st_file ck = {0};
    bool have_ck = false, created_out = false, wrote = false;
    int status = 1, lock_fd = -1;
    int64_t ck_step = -1;

    // ---- the run folder: created, locked and known writable before any slow work
    static char src_dir[4096];  // the folder of the checkpoint being resumed
    if (resume) {
        struct stat st;
        if (stat(resume, &st) != 0) { dc_fail("%s: no such file or folder", resume); goto fail; }
        if (S_ISDIR(st.st_mode)) snprintf(src_dir, sizeof src_dir, "%s", resume);
        else cli_parent_dir(resume, src_dir, sizeof src_dir);
        if (!args_given(&ap, "out")) out = src_dir;
    }
    // What the run writes or removes in --out (its .lock, step_* checkpoints and
    // their temporaries) must not be a file it reads: the data set, or (.lock)
    // the checkpoint it resumes, which may well be one of the step_* files.
    if (db.instance_data) data_path = db.instance_data;
    if (lead && check_run_outputs(out, resume, args_given(&ap, "data") || !resume ? data_path : NULL)) goto fail;
    // Rank 0 owns the run folder; the others only read the checkpoint and data.
    if (lead && cli_open_run_folder(out, &lock_fd, &created_out)) goto fail;
    if (lead && !resume && cli_list_checkpoints(out, NULL) > 0) {
        dc_fail("%s already holds checkpoints of a run: continue it with --resume %s, or "
                "choose another --out", out, out);
        goto fail;
    }
    bool same_folder = resume && cli_same_file(out, src_dir);
    if (lead && resume && !same_folder && cli_list_checkpoints(out, NULL) > 0) {
        dc_fail("%s already holds checkpoints of another run; resume into an empty folder", out);
        goto fail;
    }

    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto fail;
    static char db_inst[4096], db_class[4096];  // DreamBooth's prepared sets
    if (db.instance_data) {  // rank 0 draws the class pictures and prepares both sets; the others wait
        const char *fb = NULL;
        if (!vocab && cli_find_vocab(&fb)) dc_error_clear();
        int rc = lead ? t2i_dreambooth_prepare(&db, model, vocab, fb, st_flags, out, be, db_inst, db_class,
                                               sizeof db_inst)
                      : t2i_dreambooth_paths(&db, out, db_inst, db_class, sizeof db_inst);
        if (train_ranks_agree(&job, rc == 0, "prepare DreamBooth's pictures")) goto fail;
        data_path = db_inst;
    }

    if (resume) {
        if (cli_open_checkpoint(resume, st_flags, &ck)) goto fail;
        have_ck = true;
        const char *v = dc_st_meta(&ck, "step");
        ck_step = v ? strtoll(v, NULL, 10) : -1;
        char newer[1024];
        int n_newer = lead && same_folder && ck_step >= 0 ? cli_newer_checkpoints(out, ck_step, newer, sizeof newer) : 0;
        if (n_newer > 0 && cli_same_file(resume, src_dir)) {
            // The run folder was given: the newer files are the unreadable ones
            // that opening it skipped (and reported).
            dc_warn("training continues from step %lld and replaces %s as it reaches %s",
                    (long long)ck_step, newer, n_newer > 1 ? "their steps" : "its step");
            force = false;  // nothing older than the newest readable was asked for
        } else if (n_newer > 0 && !force) {
            dc_fail("%s holds checkpoints newer than %s: %s; resuming from it would overwrite "
                    "them (resume from %s to continue from the newest, or pass --force to discard "
                    "the newer ones)", out, ck.path, newer, out);
            goto fail;
        } else if (n_newer == 0) {
            force = false;  // nothing for --force to remove
        }
        int total = tc.steps;
        const char *base = dc_st_meta(&ck, "base_model");  // a text-to-image run's
        static char base_buf[4096];
        if (base) snprintf(base_buf, sizeof base_buf, "%s", base), model = base_buf;
        t2i = base != NULL;
        if (dc_model_config_of_file(&ck, "", 0, &mc) || (!t2i && dc_model_create(&mc, NULL, DC_GRAD_BUFFER, &layout)) ||
            dc_train_config_from_kv(&tc, (const char *const *)ck.meta_keys,
                                    (const char *const *)ck.meta_values, ck.nmeta, ck.path))
            goto fail;
        if (args_given(&ap, "steps")) tc.steps = total;
        const char *ds_meta = dc_st_meta(&ck, "dataset");
        static char data_buf[4096];  // outlives the checkpoint file
        if (ds_meta && !args_given(&ap, "data")) {
            snprintf(data_buf, sizeof data_buf, "%s", ds_meta);
            data_path = data_buf;
            if (lead && check_run_outputs(out, NULL, data_path)) goto fail;  // the data set the checkpoint names
        }
        if (!args_given(&ap, "keep") && (v = dc_st_meta(&ck, "keep"))) keep = atoi(v) > 0 ? atoi(v) : keep;
        if (!args_given(&ap, "ckpt-every") && (v = dc_st_meta(&ck, "ckpt_every")))
            ckpt_every = atoi(v) > 0 ? atoi(v) : ckpt_every;
        t2i_columns_from_checkpoint(&cols, &ck);
        if (t2i ? t2i_open(&sd, model, data_path, vocab, &cols, st_flags, false) || t2i_from_checkpoint(&sd, &ck) ||
                      t2i_lora_settings(&sd, 0, 0, NULL, lora_format) || t2i_source(&sd, tc.seed, &src) ||
                      t2i_create(&sd, &mc, NULL, DC_GRAD_BUFFER, &layout)
                : dc_dataset_load(&ds, data_path, layout->info.height) || dc_source_dataset(&src, &ds, tc.seed))
            goto fail;
    } else if (t2i) {
        if (t2i_open(&sd, model, data_path, vocab, &cols, st_flags, train_text) ||
            t2i_lora_settings(&sd, lora, lora_alpha, lora_targets, lora_format) ||
            t2i_pair_class(&sd, db_class, prior_weight) || t2i_source(&sd, tc.seed, &src) ||
            t2i_model_config(&sd, unet_config, &src, &mc) || t2i_create(&sd, &mc, NULL, DC_GRAD_BUFFER, &layout))
            goto fail;
        if (lora && !args_given(&ap, "lr")) tc.lr = 1e-4f;  // diffusers' and kohya's LoRA recipes
        if (pred < 0) tc.objective.prediction = t2i_prediction(&sd);
    } else {
        // the data padded to --input-size, when given
        if (dc_dataset_load(&ds, data_path, args_given(&ap, "input-size") ? shape[0] : 0) ||
            dc_source_dataset(&src, &ds, tc.seed))
            goto fail;
        const dc_data_shape given = {ds.channels, 1, ds.height, ds.width, ds.num_classes};
        if (model_config(model, &ap, shape, &given, &mc)) { dc_fail_ctx("%s", data_path); goto fail; }
        if (dc_model_create(&mc, NULL, DC_GRAD_BUFFER, &layout)) goto fail;
    }
    if (dc_train_config_validate(&tc)) goto fail;
    // samples of several sizes (aspect-ratio buckets): memory is planned for the largest
    if (src.ops->size && dc_model_set_size(layout, src.height, src.width)) goto fail;
    static char data_abs[4096];
    if (realpath(data_path, data_abs)) data_path = data_abs;
    if (dc_utf8_invalid_at(data_path, strlen(data_path)) >= 0) {
        dc_fail("data path '%s' is not valid UTF-8 (checkpoints record it); rename it", data_path);
        goto fail;
    }
    if (max_mem) {  // the fastest plan that fits; the flags given (a checkpoint fixes the micro-batch) stay
        char line[256];
        if (!resume && !args_given(&ap, "micro-batch")) tc.micro_batch = 0;  // the plan picks it
        if (cli_plan_choose(layout, be, budget, tc.batch, job.launch.size, zero, wire, tc.ema_decay == 0,
                            tc.grad_clip > 0, &tc.micro_batch, &recompute, &offload, &fused, &selective, line,
                            sizeof line))
            goto fail;
        if (lead) dc_log("%s", line);
    }
    // offload or the update in the backward: the model is made with no full gradient buffer (nn/params.h)
    const dc_grad_mode grad = offload || fused ? DC_GRAD_WINDOW : DC_GRAD_BUFFER;
    if (t2i ? t2i_create(&sd, &mc, be, grad, &m) : dc_model_create(&mc, be, grad, &m)) goto fail;
    if (recompute >= 0 && dc_model_set_recompute(m, recompute)) goto fail;
    if (dc_model_set_selective(m, selective)) goto fail;
    // the weights: the checkpoint's, the base UNet's, or random
    const bool from_base = t2i && !have_ck && !unet_config && !(init && !strcmp(init, "random"));
    if (have_ck ? dc_model_load_weights(m, &ck, "")
                : t2i ? t2i_init_weights(&sd, m, from_base, tc.seed) : dc_model_init_weights(m, tc.seed))
        goto fail;
    tc.offload = offload;  // where the state lives: never recorded, so a checkpoint resumes either way
    tc.update_in_backward = fused;  // when the update runs: not recorded either
    if (cli_offload_settings(&tc.offload_settings)) goto fail;  // how it runs: not recorded either
    tc.grad_comm = wire;   // how gradients travel: not recorded either
    if (t2i && t2i_schedule(&sd, &sched)) goto fail;
    if (dc_trainer_init_source(&tr, m, &src, t2i ? &sched : NULL, &tc)) goto fail;
    if (have_ck) {
        tr.allow_data_change = allow_data_change;
        if (dc_trainer_restore(&tr, &ck)) goto fail;
        if (lead) dc_log("resumed %s at step %lld", ck.path, (long long)tr.step);
        dc_st_close(&ck);
        have_ck = false;
    }
    if (train_ranks_comm(&job, be)) goto fail;
    // ZeRO: the one place the ranks and the stage reach the trainer.
    if ((job.comm || zero) && dc_trainer_set_comm(&tr, job.comm, zero)) goto fail;
    // Every rank is ready (one that failed to get here has told the others),
    // at the same step of the same run.
    if (train_ranks_agree(&job, true, "start") || train_ranks_same(&job, tr.step, "step") ||
        train_ranks_same_settings(&job, m, &tc, tr.data.fingerprint))
        goto fail;
    if (tr.step >= tc.steps) {
        if (lead) dc_log("the run is already at step %lld of %d; nothing to do (raise --steps)", (long long)tr.step, tc.steps);
        status = 0;
        goto fail;
    }
    if (lead && force) cli_remove_newer_checkpoints(out, tr.step);
    if (lead) {
        char what[512];
        dc_model_describe(m, what, sizeof what);
        what[strcspn(what, "\n")] = 0;  // its first line: the architecture and its sizes
        if (t2i && sd.lora_rank > 0)
            dc_log("training a rank-%d LoRA (%s) of %s (frozen, as loaded) on %s (%lld captioned %s), %.2fM params",
                   sd.lora_rank, dc_lora_targets_name(sd.lora_targets), what, data_path, (long long)tr.data.n,
                   sd.base.latents ? "latents" : "pictures", m->params->numel / 1e6);
        else if (t2i)
            dc_log("training %s (from %s) on %s (%lld captioned %s), %.2fM params", what,
                   from_base ? "the base's weights" : have_ck ? "the checkpoint" : "random weights", data_path,
                   (long long)tr.data.n, sd.base.latents ? "latents" : "pictures", m->params->numel / 1e6);
        else
            dc_log("training %s on %s (%d images, %d classes), %.2fM params", what, data_path, ds.n, ds.num_classes,
                   m->params->numel / 1e6);
    }
    if (lead && db.instance_data && db.class_prompt)
        dc_log("DreamBooth: the pictures of %s as \"%s\", each batch half class pictures as \"%s\" (prior loss "
               "weight %g)", db.instance_data, db.instance_prompt, db.class_prompt, (double)sd.prior_weight);
    else if (lead && db.instance_data)
        dc_log("DreamBooth: the pictures of %s as \"%s\" (no prior preservation)", db.instance_data,
               db.instance_prompt);
    if (lead) dc_log("batch %d (micro %d), lr %g, %d steps, checkpoints every %d into %s, backend %s",
                     tc.batch, tc.micro_batch, tc.lr, tc.steps, ckpt_every, out, be->name);
    if (lead && offload) dc_log("offload: master weights and AdamW moments in host memory, AdamW on the CPU");
    if (lead && fused)
        dc_log("updating each unit in the backward, with no full gradient buffer%s",
               tc.grad_clip > 0 ? " (two passes a step: the first finds the norm to clip)" : "");
    if (lead && job.rv)
        dc_log("%d ranks (%s), %s, ZeRO stage %d, gradients summed in %s", job.launch.size, job.launch.launcher,
               job.nccl ? "NCCL" : "sockets", zero, wire == DC_BF16 ? "bf16" : "fp32");

    train_log lg = {0};
    if (lead && train_log_open(&lg, out, tr.step)) goto fail;
    grids gr = {0};
    char **prompts = NULL;
    int nprompts = 0;
    if (t2i && lead && (sample_every < 0 ? ckpt_every : sample_every) > 0) {
        if (t2i_prompts(&sd, sample_prompts, 8, &prompts, &nprompts)) goto fail;
        gr = (grids){&sd, {(const char *const *)prompts, nprompts, 4, sample_steps, sample_cfg},
                     sample_every < 0 ? ckpt_every : sample_every, be};
    } else if (t2i) {
        gr.sd = &sd;
    }
    int r = run_steps(&job, &tr, &tc, out, keep, ckpt_every, log_every, data_path, &gr, &lg, &wrote);
    t2i_prompts_free(prompts, nprompts);
    train_log_close(&lg);
    if (r < 0) goto fail;
    status = r;
fail:
    if (g_phase == TRAINING) g_phase = AFTER;
    if (status == 1) {
        train_ranks_abort(&job);  // the others stop too, with this message
        cli_fail();
    }
    if (have_ck) dc_st_close(&ck);
    dc_trainer_free(&tr);
    train_ranks_end(&job);
    dc_model_free(m), dc_model_free(layout);
    dc_kv_free(&mc);
    dc_source_close(&src), dc_schedule_free(&sched), t2i_close(&sd);
    dc_dataset_free(&ds);
    if (be) dc_backend_destroy(be);
    cli_unlock_run(out, lock_fd, status == 1 && created_out && !wrote);
    return status;
}
