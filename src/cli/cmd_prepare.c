// diffusion prepare: captioned pictures to MDS shards of latents and text
// embeddings (pipelines/prepare.h), with progress, and a run that continues
// where a stopped one left off.
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "io/picture_set.h"
#include "pipelines/prepare.h"

// Ctrl-C, SIGTERM and SIGHUP end the run after the batch in progress; what
// the finished shards hold is on disk, and the same command continues.
static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }


// The rate is measured from the end of the first batch (the models' first
// run includes their set-up, and a continued run starts part-way).
typedef struct {
    double t0;
    int64_t start;  // pictures done at t0; -1 before the first batch
} progress_ctx;

static int on_progress(void *ctx, int64_t done, int64_t total, int64_t written) {
    progress_ctx *p = ctx;
    if (g_stop) return dc_fail("stopped by signal %d: the same command continues from the last shard written", (int)g_stop);
    if (p->start < 0) p->start = done, p->t0 = dc_time_now();
    if (!dc_log_is_tty() && done != total) return 0;
    const double el = dc_time_now() - p->t0, rate = el > 0 ? (double)(done - p->start) / el : 0;
    char eta[32] = "-";
    if (rate > 0) dc_format_duration((double)(total - done) / rate, eta, sizeof eta);
    dc_progress(done == total, "encoding: %lld/%lld pictures, %lld samples written, %.1f pictures/s, ETA %s",
                (long long)done, (long long)total, (long long)written, rate, eta);
    return 0;
}

int cmd_prepare(int argc, char **argv) {
    const char *data = NULL, *out = NULL, *model = NULL, *vae = "auto", *vocab = NULL, *caption_ext = NULL;
    const char *caption_column = "text", *device = "auto", *precision = "auto";
    int size = 512, min_side = 256, max_side = 1024, batch = 8, shard_bytes = 1 << 26, zstd = 0, threads = 0;
    bool buckets = false, overwrite = false, no_verify = false;
    arg_spec specs[] = {
        {"data", ARG_STR, &data, "PATH", "a folder of pictures (captions in same-stem .txt/.caption files; kohya's "
                                         "N_name folders; or metadata.jsonl), or a webdataset .tar"},
        {"out", ARG_STR, &out, "DIR", "the data set folder to write (MDS: index.json, shard.NNNNN.mds)"},
        {"model", ARG_STR, &model, "PATH", "the SD model whose text encoder and VAE encode (diffusers folder or "
                                           "single file)"},
        {"vae", ARG_STR, &vae, "NAME", "auto (the model's VAE: latents) or none (the pixels themselves, for "
                                       "pixel-space models)"},
        {"size", ARG_INT, &size, "PX", "pictures resized to cover PX x PX and centre-cropped (with --buckets: "
                                       "the buckets' area, PX x PX)"},
        {"buckets", ARG_FLAG, &buckets, NULL, "kohya's aspect-ratio buckets (64-px steps): one data set a bucket, "
                                              "in DIR/WxH/"},
        {"min-side", ARG_INT, &min_side, "PX", "--buckets: the shortest side"},
        {"max-side", ARG_INT, &max_side, "PX", "--buckets: the longest side"},
        {"batch", ARG_INT, &batch, "N", "pictures encoded at once"},
        {"caption-ext", ARG_STR, &caption_ext, "EXT", "caption files' extension (default .txt, then .caption)"},
        {"caption-column", ARG_STR, &caption_column, "NAME", "metadata.jsonl's caption column"},
        {"shard-bytes", ARG_INT, &shard_bytes, "N", "bytes per shard before the next starts"},
        {"zstd", ARG_INT, &zstd, "LEVEL", "compress the shards with zstd at LEVEL 1..22 (0: not)"},
        {"overwrite", ARG_FLAG, &overwrite, NULL, "start over, removing what an earlier run wrote in DIR (without it, "
                                                  "an unfinished run is continued)"},
        {"vocab", ARG_STR, &vocab, "PATH", "CLIP vocabulary (default: the model's tokenizer/, else searched)"},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    arg_parser ap = {"diffusion prepare --data PICTURES --model SD_PATH --out DIR",
                     "Encodes captioned pictures once for text-to-image training: each picture is resized\n"
                     "and cropped, encoded by the model's VAE (the latent mean and log-variance, fp16,\n"
                     "not multiplied by the VAE's scaling factor) and its caption by the text encoder\n"
                     "(fp16), and written with the caption and the original size to MDS shards, the\n"
                     "format of MosaicML streaming. Unreadable pictures are skipped with a warning.\n"
                     "A stopped run (Ctrl-C, a kill) continues when the same command is given again.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!data || !out || !model) return dc_fail("--data, --model and --out are required (see --help)"), cli_usage_fail();
    if (strcmp(vae, "auto") && strcmp(vae, "none")) return dc_fail("--vae %s: auto or none", vae), cli_usage_fail();
    if (batch < 1 || batch > 4096) return dc_fail("--batch %d: 1 to 4096", batch), cli_usage_fail();
    if (size < 8 || size > 16384) return dc_fail("--size %d: 8 to 16384", size), cli_usage_fail();
    if (shard_bytes < 1024) return dc_fail("--shard-bytes %d: at least 1024", shard_bytes), cli_usage_fail();
    if (zstd < 0 || zstd > 22) return dc_fail("--zstd %d: 0 to 22", zstd), cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    const char *fallback = NULL;
    if (!vocab && cli_find_vocab(&fallback)) dc_error_clear();
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    cli_handle_signals(on_signal, sigs, 3);

    dc_picture_set set;
    dc_picture_set_opts so = {caption_ext, caption_column, NULL};
    if (dc_picture_set_scan(&set, data, &so)) return cli_fail();
    dc_log("%s: %lld pictures%s", data, (long long)set.n, set.uncaptioned ? "" : ", every one captioned");
    dc_backend *be = NULL;
    dc_prepare_models m = {0};
    dc_prepare_opts o = {model, vocab, fallback, no_verify ? DC_ST_NO_VERIFY : 0, !strcmp(vae, "none"), size,
                         buckets, min_side, max_side, batch, 0, shard_bytes, zstd, overwrite, false, false};
    dc_prepare_stats st = {0};
    int status = CLI_EXIT_FAILURE;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    o.overlap = strcmp(be->name, "cpu") != 0;  // on the CPU both would share the same cores
    // A GPU runs few large calls faster than many small ones; the CPU keeps one image's memory.
    o.vae_batch = strcmp(be->name, "cpu") != 0;
    dc_log("loading the text encoder%s of %s on %s", o.no_vae ? "" : " and the VAE", model, be->name);
    if (dc_prepare_models_load(&m, &o, be)) goto done;
    progress_ctx pc = {0, -1};
    if (dc_prepare_run(&m, &set, out, &o, on_progress, &pc, &st)) {
        if (g_stop) status = 128 + (int)g_stop;
        goto done;
    }
    if (st.resumed) dc_log("continued a stopped run: %lld samples were written before", (long long)st.resumed);
    dc_log("wrote %s: %lld samples from %lld pictures", out, (long long)st.samples, (long long)st.pictures);
    if (buckets) dc_log("in %d buckets, a folder WxH each (listed in %s/prepare.json)", st.nbuckets, out);
    if (st.corrupt) dc_warn("%lld unreadable pictures were skipped (each named above)", (long long)st.corrupt);
    if (set.uncaptioned) dc_warn("%lld pictures had no caption and were given an empty one", (long long)set.uncaptioned);
    status = 0;
done:
    if (status) fprintf(stderr, "error: %s\n", dc_error());
    dc_prepare_models_close(&m);
    dc_picture_set_free(&set);
    if (be) dc_backend_destroy(be);
    return status;
}
