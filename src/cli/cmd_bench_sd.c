// diffusion bench --sd MODEL: Stable Diffusion's speed and memory, each
// part alone (text encoder, one guided UNet step, VAE decode) and whole
// pictures (a 50-step image at batch 1, and a batch, each the repeat of a
// call as a program that makes pictures one call after another sees them),
// beside the figures tools/sd_pytorch.py measures for diffusers on the same
// device.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "models/unet.h"
#include "pipelines/sd.h"


static size_t peak_bytes(dc_backend *be) {
    size_t peak = 0;
    if (be->memory) be->memory(be, NULL, &peak);
    return peak;
}

// Whether the comma-separated list names `part` (or is "all").
static bool has_part(const char *list, const char *part) {
    if (!strcmp(list, "all")) return true;
    size_t n = strlen(part);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, part, n)) return true;
        p += len + (e != NULL);
    }
    return false;
}

// A timed stretch: its start on the clock and on the device's energy
// counter (NAN where the backend cannot tell). Started after a sync.
typedef struct { double t, e; } stopwatch;

static stopwatch watch_start(dc_backend *be) {
    double j, limit;
    return (stopwatch){dc_time_now(), be->energy && be->energy(be, &j, &limit) ? j : NAN};
}

// Seconds a unit of the n since w (after a sync), and joules a unit where
// known (NAN under half a second: the counter moves in steps of
// milliseconds to tens of them).
static double watch_stop(dc_backend *be, stopwatch w, int n, double *joules) {
    const double sec = dc_time_now() - w.t, e = sec >= 0.5 ? watch_start(be).e : NAN;
    if (joules) *joules = (e - w.e) / n;
    return sec / n;
}

// "   J, mean W" after a line's figures, where the energy is known.
static void print_energy(double joules, double sec) {
    if (isfinite(joules)) printf("   %6.2f J  %4.0f W", joules, joules / sec);
    printf("\n");
}

// A step within a run of `steps` steps (seconds all), from a like run of 2
// (seconds two), and what the run costs besides its steps.
static void print_within(double all, double two, int steps) {
    const double per = (all - two) / (steps - 2);
    printf("  %-44s %9.2f ms a step, %.1f ms besides\n", "  within it (from 2 and all steps)", per * 1e3,
           (all - steps * per) * 1e3);
}

typedef struct {
    dc_model *m;
    dc_buf out, x, t;
    dc_cond cond;
    int rows;
} unet_call;

static int unet_call_run(void *arg) {
    unet_call *u = arg;
    return dc_model_forward(u->m, u->out, u->x, u->t, &u->cond, u->rows);
}

// Seconds per call of one guided UNet step at `rows` rows (2 per picture),
// replayed as a recorded graph where the backend has graphs, with the text's
// keys and values prepared once, as the sampler runs it (DC_CUDA_PROFILE=1:
// op by op, so each op is timed). text: [2, T, D], the encoded prompt and
// negative prompt, each given to half the rows, as in a guided picture (the
// tensor cores draw more power on real values than on zeros: an H100's
// 16-row step ran 1.3 ms slower inside pictures than on a zero text).
static int time_unet(dc_sd_pipe *p, dc_buf text, int rows, int h, int w, int iters, double *sec,
                     double *joules) {
    dc_backend *be = p->be;
    const int D = p->text->cfg.width, T = DC_CLIP_CONTEXT;
    const int64_t n = (int64_t)rows * 4 * h * w;
    dc_buf x = {0}, out = {0}, t = {0}, ctx = {0};
    int rc = dc_unet_set_size(p->unet, h, w);
    if (!rc) rc = dc_model_reserve(p->unet, rows);
    if (!rc) rc = dc_buf_alloc(be, &x, DC_F32, (size_t)n, "x");
    if (!rc) rc = dc_buf_alloc(be, &out, DC_F32, (size_t)n, "out");
    if (!rc) rc = dc_buf_alloc(be, &t, DC_F32, (size_t)rows, "t");
    if (!rc) rc = dc_buf_alloc(be, &ctx, be->compute, (size_t)rows * T * D, "ctx");
    if (!rc) {
        uint32_t *keys = malloc(sizeof(uint32_t) * (size_t)rows);
        float *tv = malloc(sizeof(float) * (size_t)rows);
        // the two halves' x alike, as a guided step has them (dc_cond's pairs)
        for (int i = 0; i < rows; i++) keys[i] = (uint32_t)(i % (rows / 2)), tv[i] = 500.0f;
        be->randn(be, x, keys, rows, 4 * (int64_t)h * w, 1, 0, 0);
        be->upload(be, t.p, tv, sizeof(float) * (size_t)rows);
        const size_t row_bytes = (size_t)T * D * dc_dtype_size(be->compute);
        for (int i = 0; i < rows; i++)
            be->copy(be, (char *)ctx.p + i * row_bytes, (const char *)text.p + (i < rows / 2 ? 0 : row_bytes),
                     row_bytes);
        free(keys), free(tv);
        unet_call u = {p->unet, out, x, t, {.ctx = ctx, .len = T, .dim = D, .pairs = rows / 2}, rows};
        const bool graph = be->graph_capture != NULL;  // a profile times the graph's ops too
        void *g = NULL;
        rc = dc_unet_prepare_text(p->unet, &u.cond, rows);
        for (int i = 0; i < 2 && !rc; i++) rc = unet_call_run(&u);  // warm-up
        if (!rc && graph && !(g = be->graph_capture(be, unet_call_run, &u))) rc = -1;
        if (be->profile_restart) be->profile_restart(be);  // a profile of the timed calls alone
        be->sync(be);
        const stopwatch sw = watch_start(be);
        for (int i = 0; i < iters && !rc; i++) {
            if (g) be->graph_launch(be, g);
            else rc = unet_call_run(&u);
        }
        be->sync(be);
        *sec = watch_stop(be, sw, iters, joules);
        if (g) be->graph_free(be, g);
        dc_unet_prepare_text(p->unet, NULL, 0);  // ctx is freed below
        if (!rc) rc = dc_backend_status(be);
    }
    dc_buf all[] = {x, out, t, ctx};
    for (int i = 0; i < 4; i++)
        if (all[i].p) be->free(be, all[i].p);
    return rc;
}

// B pictures decoded in one call: seconds and joules (where known) a call.
static int time_decode(dc_sd_pipe *p, int B, int H, int W, int iters, double *sec, double *joules) {
    dc_backend *be = p->be;
    const int f = p->factor, h = H / f, w = W / f;
    dc_buf z = {0}, img = {0};
    int rc = dc_vae_reserve(p->vae, B, H, W);
    if (!rc) rc = dc_buf_alloc(be, &z, be->compute, (size_t)B * 4 * h * w, "z");
    if (!rc) rc = dc_buf_alloc(be, &img, be->compute, (size_t)B * 3 * H * W, "image");
    if (!rc) {
        be->zero(be, z.p, (size_t)B * 4 * h * w * dc_dtype_size(be->compute));
        stopwatch sw = {0, NAN};
        for (int i = 0; i < iters + 1 && !rc; i++) {
            if (i == 1 && be->profile_restart) be->profile_restart(be);  // a profile of the timed calls alone
            if (i == 1) be->sync(be), sw = watch_start(be);
            rc = dc_vae_decode(p->vae, img, z, B, h, w);
        }
        be->sync(be);
        *sec = watch_stop(be, sw, iters, joules);
    }
    if (z.p) be->free(be, z.p);
    if (img.p) be->free(be, img.p);
    return rc;
}

// Seconds (and joules, where known) of count pictures.
static int time_pictures(dc_sd_pipe *p, int count, int batch, int steps, int size, double *sec, double *joules) {
    dc_sd_gen g = {"a photo of an astronaut riding a horse on mars", "", count, batch, size, size,
                   dc_ksampler_opts_default(), NULL, 0};
    g.ks.steps = steps, g.ks.kind = DC_KS_EULER_A;
    p->be->sync(p->be);
    const stopwatch sw = watch_start(p->be);
    int rc = dc_sd_generate(p, &g, NULL, NULL, NULL, NULL);  // pictures downloaded, not kept: it ends synced
    *sec = watch_stop(p->be, sw, 1, joules);
    return rc;
}

// The second of two like calls (its buffers and its step graph kept from
// the first): the steady cost of count pictures.
static int time_repeat(dc_sd_pipe *p, int count, int batch, int steps, int size, double *sec, double *joules) {
    return time_pictures(p, count, batch, steps, size, sec, NULL) ||
           time_pictures(p, count, batch, steps, size, sec, joules);
}

int cmd_bench_sd(int argc, char **argv) {
    const char *model = NULL, *vocab = NULL, *device = "auto", *precision = "auto", *parts = "all";
    int size = 0, steps = 50, batch = 8, iters = 20, threads = 0;
    arg_spec specs[] = {
        {"sd", ARG_STR, &model, "PATH", "Stable Diffusion model (folder or single file)"},
        {"vocab", ARG_STR, &vocab, "PATH", "CLIP vocabulary when the model has no tokenizer/"},
        {"size", ARG_INT, &size, "PX", "picture size (default: the model's)"},
        {"steps", ARG_INT, &steps, "N", "sampling steps of a whole picture"},
        {"batch", ARG_INT, &batch, "N", "pictures of the batch measurement (0: skip it)"},
        {"iters", ARG_INT, &iters, "N", "timed calls of each part"},
        {"parts", ARG_STR, &parts, "LIST", "all, or some of text,unet,vae,picture (unet: both batches; "
                                           "unet1, unetN: one; with DC_CUDA_PROFILE=1, one part's op profile)"},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    arg_parser ap = {"diffusion bench --sd PATH [--size PX] [--steps N] [--batch N]",
                     "Times Stable Diffusion: the text encoder, one guided UNet step, the VAE\n"
                     "decoder, a whole picture (guidance 7.5, Euler a) and a batch of pictures,\n"
                     "and the peak device memory. Pictures are timed as the second of two like\n"
                     "calls (the steady cost, when the GPU replays the step graph the first\n"
                     "recorded); the first of its shape is printed too. Where the GPU reports\n"
                     "its energy, stretches of half a second or more also print joules and mean\n"
                     "watts (a GPU held at its power limit runs as fast as its energy allows).",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!model) return dc_fail("--sd is required"), cli_usage_fail();
    if (steps < 1 || steps > 1000 || batch < 0 || batch > 64 || iters < 1 || size < 0 || size > 4096)
        return dc_fail("--steps, --batch, --iters or --size out of range"), cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    for (const char *q = parts; strcmp(parts, "all") && *q;) {
        size_t len = strcspn(q, ",");
        static const char *known[] = {"text", "unet", "unet1", "unetN", "vae", "picture"};
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            ok |= strlen(known[i]) == len && !strncmp(q, known[i], len);
        if (!ok)
            return dc_fail("--parts %s: '%.*s' is not a part (all, or text, unet, unet1, unetN, vae, picture)",
                           parts, (int)len, q), cli_usage_fail();
        q += len + (q[len] == ',');
    }
    dc_backend *be = NULL;
    dc_sd_pipe p = {0};
    dc_buf ctx = {0};  // the two prompts' text embeddings
    const char *fallback = NULL;
    int status = 1;
    if (!vocab && cli_find_vocab(&fallback)) dc_error_clear();
    cli_inputs ins = {0};  // it writes only its report: never into the weights (>> model.safetensors)
    int bad = cli_inputs_add(&ins, "--sd", model) || cli_inputs_add(&ins, "--vocab", vocab ? vocab : fallback) ||
              cli_check_stdio(&ins);
    cli_inputs_free(&ins);
    if (bad) goto done;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    double t0 = dc_time_now();
    dc_sd_open_opts oo = {model, vocab, fallback, DC_ST_NO_VERIFY, -1, false, NULL};
    if (dc_sd_pipe_open(&p, be, &oo)) goto done;
    double load = dc_time_now() - t0;
    if (!size) size = p.default_size;
#define PART(x) has_part(parts, x)
    const int h = size / p.factor, w = size / p.factor;
    printf("SD %s on %s (%s), %dx%d, loaded in %.1f s",
           p.version == 2 ? "2.x" : p.version == 1 ? "1.x" : "(version unknown)", be->name,
           dc_dtype_name(be->compute), size, size, load);
    double joules, limit_w;
    if (be->energy && be->energy(be, &joules, &limit_w)) printf("; the device's power limit %.0f W", limit_w);
    printf("\n");
    // the text encoder: two prompts (the prompt and the negative one)
    if (dc_buf_alloc(be, &ctx, be->compute, (size_t)2 * DC_CLIP_CONTEXT * p.text->cfg.width, "ctx")) goto done;
    const char *prompts[2] = {"a photo of an astronaut riding a horse on mars", ""};
    double tt = 0;
    if (!PART("text") && dc_sd_encode_prompts(&p, prompts, 2, ctx)) goto done;  // the UNet's text
    for (int i = 0; PART("text") && i < iters + 1; i++) {
        if (i == 1) be->sync(be), tt = dc_time_now();
        if (dc_sd_encode_prompts(&p, prompts, 2, ctx)) goto done;
    }
    be->sync(be);
    tt = (dc_time_now() - tt) / iters;
    if (PART("text")) printf("  %-44s %9.2f ms\n", "text encoder, prompt + negative", tt * 1e3);
    double u1 = 0, u8 = 0, dec = 0, pic = 0, bat = 0;
    if (PART("unet") || PART("unet1")) {
        if (time_unet(&p, ctx, 2, h, w, iters, &u1, &joules)) goto done;
        double macs = dc_model_macs_per_image(p.unet) * 2;
        printf("  %-44s %9.2f ms  %6.1f TFLOP/s", "UNet step, batch 1 with guidance (2 rows)", u1 * 1e3,
               2 * macs / u1 / 1e12);
        print_energy(joules, u1);
    }
    if ((PART("unet") || PART("unetN")) && batch > 0) {
        double macs = dc_model_macs_per_image(p.unet) * 2;
        if (time_unet(&p, ctx, 2 * batch, h, w, iters, &u8, &joules)) goto done;
        char what[64];
        snprintf(what, sizeof what, "UNet step, batch %d with guidance (%d rows)", batch, 2 * batch);
        printf("  %-44s %9.2f ms  %6.1f TFLOP/s", what, u8 * 1e3, 2 * macs * batch / u8 / 1e12);
        print_energy(joules, u8);
    }
    if (PART("vae")) {
        if (time_decode(&p, 1, size, size, iters, &dec, &joules)) goto done;
        printf("  %-44s %9.2f ms", "VAE decode, one picture", dec * 1e3);
        print_energy(joules, dec);
        if (batch > 1) {
            double decb;
            if (time_decode(&p, batch, size, size, iters, &decb, &joules)) goto done;
            char what[64];
            snprintf(what, sizeof what, "VAE decode, %d pictures in one call", batch);
            printf("  %-44s %9.2f ms", what, decb * 1e3);
            print_energy(joules, decb);
        }
    }
    if (!PART("picture")) goto memory;
    // Whole pictures. A call whose shape and sampler the last call had uses
    // its buffers again and replays its recorded step graph from the first
    // step; any other records the graph afresh (pipelines/sd.h). So each
    // measurement is the repeat of a call: the steady cost. After a warm-up
    // (cuDNN's plans), 2 steps and `steps` steps: their difference is the
    // cost of a step within a picture, the rest what a picture costs besides.
    double pic2, first = 0;
    if (time_repeat(&p, 1, 1, 2, size, &pic2, NULL)) goto done;
    if (be->profile_restart) be->profile_restart(be);  // a profile of the timed pictures alone
    if (time_pictures(&p, 1, 1, steps, size, &first, NULL) || time_pictures(&p, 1, 1, steps, size, &pic, &joules))
        goto done;
    char what[96];
    snprintf(what, sizeof what, "whole picture, %d steps (text, UNet, VAE)", steps);
    printf("  %-44s %9.3f s", what, pic);
    print_energy(joules, pic);
    if (steps > 2) print_within(pic, pic2, steps);
    if (be->graph_capture) printf("  %-44s %9.3f s\n", "  the first of its shape (records the graph)", first);
    if (batch > 0) {
        if (time_repeat(&p, batch, batch, steps, size, &bat, &joules)) goto done;
        snprintf(what, sizeof what, "%d pictures in one batch, %d steps", batch, steps);
        printf("  %-44s %9.3f s   %.2f pictures/s", what, bat, batch / bat);
        print_energy(joules, bat);
        double bat2;
        if (steps > 2) {
            if (time_repeat(&p, batch, batch, 2, size, &bat2, NULL)) goto done;
            print_within(bat, bat2, steps);
        }
    }
memory:
    if (be->memory) {
        // where the peak goes: weights, the activations planned last, the rest
        // (the backend's workspaces, the generation's buffers)
        const double G = 1073741824.0;
        const dc_unet *un = dc_unet_of(p.unet);
        size_t wu = dc_params_bytes(un->base.params), wv = dc_params_bytes(&p.vae->params), wt = dc_params_bytes(p.text->params);
        size_t au = un->max_batch ? dc_unet_activation_bytes(p.unet, un->max_batch) : 0;
        size_t av = dc_vae_activation_bytes(p.vae), peak = peak_bytes(be);
        printf("  %-44s %9.2f GiB\n", "peak device memory", peak / G);
        printf("    weights: UNet %.2f, VAE %.2f, text encoder %.2f GiB; activations: UNet %.2f (%d rows), VAE "
               "%.2f GiB\n", wu / G, wv / G, wt / G, au / G, un->max_batch, av / G);
    }
    status = 0;
done:
    if (status) cli_fail();
    if (ctx.p) be->free(be, ctx.p);
    dc_sd_pipe_close(&p);
    if (be) dc_backend_destroy(be);
    return status;
}
