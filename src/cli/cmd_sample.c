// diffusion sample: class-conditional samples into a PNG grid (one row per
// class, in the order asked), one PNG per sample and/or a safetensors file.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "diffusion/gaussian.h"
#include "io/png.h"
#include "io/png_params.h"
#include "text/unicode.h"

#define MAX_CLASSES 1024

static int eval_model(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_model_forward(ctx, out, x, t, cond, B);
}

typedef struct { double t0; int done_images, total_images, batch_images; } progress_ctx;

static void on_step(void *ctx, int step, int total) {
    progress_ctx *p = ctx;
    if (!dc_log_is_tty() && step != total) return;  // piped: one line per batch
    double el = dc_time_now() - p->t0;
    double frac = (p->done_images + p->batch_images * (double)step / total) / p->total_images;
    char eta[32];
    dc_progress(false, "sampling: images %d-%d of %d, step %d/%d, ETA %s", p->done_images + 1,
                p->done_images + p->batch_images, p->total_images, step, total,
                dc_format_duration(frac > 0 ? el / frac - el : 0, eta, sizeof eta));
}

// "all", or a comma list of class ids and ranges ("0-9", "3,5,7"). With
// num_classes INT_MAX (the model not yet loaded) it checks only the syntax.
static int parse_classes(const char *s, int num_classes, int *out, int *n) {
    *n = 0;
    if (!strcmp(s, "all") && num_classes == INT_MAX) return 0;
    if (!strcmp(s, "all")) {
        if (num_classes > MAX_CLASSES) return dc_fail("--classes all: too many classes; list them");
        for (int c = 0; c < num_classes; c++) out[(*n)++] = c;
        return 0;
    }
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return dc_fail("--classes: cannot read '%s'", s);
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p) return dc_fail("--classes: cannot read '%s'", s);
        }
        if (a > b) return dc_fail("--classes: %ld-%ld is a reversed range (write %ld-%ld)", a, b, b, a);
        if (a < 0 || b >= num_classes) {
            long bad = a < 0 ? a : b;
            if (num_classes == INT_MAX) return dc_fail("--classes: class %ld is negative", bad);
            return dc_fail("--classes: class %ld is outside the model's classes 0..%d", bad, num_classes - 1);
        }
        for (long c = a; c <= b; c++) {
            if (*n == MAX_CLASSES) return dc_fail("--classes: too many classes");
            for (int k = 0; k < *n; k++)
                if (out[k] == c) return dc_fail("--classes: class %ld is listed twice", c);
            out[(*n)++] = (int)c;
        }
        if (*end == ',') end++;
        else if (*end) return dc_fail("--classes: cannot read '%s'", s);
        p = end;
    }
    return *n ? 0 : dc_fail("--classes: empty list");
}

#define CFG_MAX 100

static void sample_path(const char *dir, int cls, int i, char *out, int n) {
    snprintf(out, n, "%s/class%d_%d.png", dir, cls, i);
}

// --out-dir before the model loads: not an existing file, and short enough
// for the names inside it.
static int check_out_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) return dc_fail("--out-dir %s exists and is not a folder", dir);
    if (strlen(dir) > 3900) return dc_fail("--out-dir %s: the path is too long", dir);
    return 0;
}

// The sample files of an existing --out-dir: none may be a folder, device or
// pipe, and the longest name must be writable there.
static int check_out_files(const char *dir, const int *classes, int ncls, int per_class) {
    char path[4096];
    int widest = 0;
    for (int k = 0; k < ncls; k++) {
        if (classes[k] > classes[widest]) widest = k;
        for (int i = 0; i < per_class; i++) {
            struct stat st;
            sample_path(dir, classes[k], i, path, sizeof path);
            if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
                return dc_fail("%s exists and is not a regular file; choose another --out-dir", path);
        }
    }
    sample_path(dir, classes[widest], per_class - 1, path, sizeof path);
    return cli_probe_write(path);
}

// The AUTOMATIC1111-style `parameters` text of a PNG, adapted to class
// labels: the prompt names the class(es); the image's index joins the seed,
// since a sample depends on both. NULL out of memory (message set).
static char *png_parameters(const char *prompt, const dc_gaussian_sampler_opts *so, const char *sampler, int W,
                            int H, const char *ckpt, const char *which, int index) {
    // the checkpoint's file (or run folder's) name, as A1111 names the model
    char model[256];
    snprintf(model, sizeof model, "%s", ckpt);
    for (size_t n = strlen(model); n > 1 && model[n - 1] == '/'; n--) model[n - 1] = 0;
    char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    // A file name need not be text: control bytes, and every non-ASCII byte
    // of a name that is not UTF-8, become '?' (a PNG text chunk holds text).
    dc_ustr u = {0};
    int utf8 = dc_utf8_decode(base, strlen(base), "checkpoint name", &u) == 0;
    dc_ustr_free(&u);
    for (char *p = base; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || (!utf8 && (unsigned char)*p >= 0x80)) *p = '?';
    char extra[160];
    int k = snprintf(extra, sizeof extra, "Weights: %s, Guided channels: %s", which,
                     so->guided_channels ? "3" : "all");
    if (so->kind == DC_STEP_DDIM) k += snprintf(extra + k, sizeof extra - (size_t)k, ", Eta: %g", so->eta);
    if (index >= 0) snprintf(extra + k, sizeof extra - (size_t)k, ", Sample index: %d", index);
    dc_gen_params g = {.prompt = prompt, .steps = so->steps, .sampler = sampler, .cfg_scale = so->cfg_scale,
                       .seed = so->seed, .width = W, .height = H, .model = base, .extra = extra};
    char *s = dc_gen_params_format(&g);
    if (!s) dc_fail("out of memory");
    return s;
}

int cmd_sample(int argc, char **argv) {
    const char *ckpt = "runs/train", *classes_s = NULL, *grid = NULL, *out_dir = NULL;
    const char *sampler = "ddpm", *cfg_channels = "all", *device = "auto", *precision = "auto", *tensor_out = NULL;
    dc_gaussian_sampler_opts so = dc_gaussian_sampler_opts_default();
    int per_class = 8, batch = 16, heads = 0, threads = 0, grid_cols = 0;
    bool raw = false, no_verify = false;
    so.cfg_scale = 4.0f;
    arg_spec specs[] = {
        {"ckpt", ARG_STR, &ckpt, "PATH", "checkpoint, run folder (newest checkpoint) or official weights"},
        {"classes", ARG_STR, &classes_s, "LIST", "classes, e.g. 0-9 or 3,5,7 (default: all, if <= 20)"},
        {"per-class", ARG_INT, &per_class, "N", "samples per class"},
        {"grid", ARG_STR, &grid, "PNG", "write a grid, one row per class"},
        {"grid-cols", ARG_INT, &grid_cols, "N", "samples per grid row (default: all of the class's)"},
        {"out-dir", ARG_STR, &out_dir, "DIR", "write class{c}_{i}.png per sample"},
        {"tensor-out", ARG_STR, &tensor_out, "PATH", "write the raw samples as safetensors 'samples'"},
        {"steps", ARG_INT, &so.steps, "N", "sampling steps (respaced from 1000)"},
        {"sampler", ARG_STR, &sampler, "NAME", "ddpm (ancestral) or ddim"},
        {"eta", ARG_FLOAT, &so.eta, "X", "DDIM eta (0: deterministic)"},
        {"cfg-scale", ARG_FLOAT, &so.cfg_scale, "X", "classifier-free guidance scale, 0..100 (1: none)"},
        {"cfg-channels", ARG_STR, &cfg_channels, "all|3", "guide all eps channels, or only the first 3 as the official code"},
        {"seed", ARG_U64, &so.seed, "N", "noise seed (an image depends only on seed and its index)"},
        {"batch", ARG_INT, &batch, "N", "images per model call (doubled with guidance)"},
        {"raw", ARG_FLAG, &raw, NULL, "use raw weights instead of EMA"},
        {"heads", ARG_INT, &heads, "N", CLI_HEADS_HELP},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    arg_parser ap = {"diffusion sample [--ckpt PATH] --grid PNG | --out-dir DIR | --tensor-out FILE [flags]",
                     "Draws class-conditional samples with the official DDPM sampler (or DDIM),\n"
                     "classifier-free guidance on all channels by default, from EMA weights,\n"
                     "into any of a PNG grid, one PNG per sample and a safetensors file.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!strcmp(sampler, "ddpm")) so.kind = DC_STEP_DDPM;
    else if (!strcmp(sampler, "ddim")) so.kind = DC_STEP_DDIM;
    else return dc_fail("--sampler must be ddpm or ddim (got '%s')", sampler), cli_usage_fail();
    if (!strcmp(cfg_channels, "all")) so.guided_channels = 0;
    else if (!strcmp(cfg_channels, "3")) so.guided_channels = 3;
    else return dc_fail("--cfg-channels must be all or 3 (got '%s')", cfg_channels), cli_usage_fail();
    if (so.steps < 1 || so.steps > 1000) return dc_fail("--steps must be in 1..1000"), cli_usage_fail();
    if (per_class < 1 || batch < 1) return dc_fail("--per-class and --batch must be positive"), cli_usage_fail();
    if (grid_cols < 0) return dc_fail("--grid-cols must be positive (or 0: all of a class's samples)"), cli_usage_fail();
    if (!(so.eta >= 0)) return dc_fail("--eta must be non-negative (got %g)", so.eta), cli_usage_fail();
    // Past a scale of about 100 guidance only amplifies noise; a huge one overflows to inf.
    if (!(so.cfg_scale >= 0 && so.cfg_scale <= CFG_MAX))
        return dc_fail("--cfg-scale must be in 0..%d (got %g; 1: no guidance)", CFG_MAX, so.cfg_scale), cli_usage_fail();
    if (!grid && !out_dir && !tensor_out)
        return dc_fail("sample needs somewhere to write: --grid PNG, --out-dir DIR and/or --tensor-out "
                       "FILE"), cli_usage_fail();
    if (grid && tensor_out && !strcmp(grid, tensor_out))
        return dc_fail("--grid and --tensor-out name the same file %s", grid), cli_usage_fail();
    int classes[MAX_CLASSES], ncls = 0;
    if ((classes_s && parse_classes(classes_s, INT_MAX, classes, &ncls)) || cli_check_heads(heads) ||
        cli_check_device_flags(threads, device, precision))
        return cli_usage_fail();
    cli_inputs ins = {0};
    int bad = cli_inputs_add_checkpoint(&ins, "--ckpt", ckpt) || cli_check_stdio(&ins) ||
              (grid && cli_check_output(grid, &ins)) || (tensor_out && cli_check_output(tensor_out, &ins)) ||
              (out_dir && (check_out_dir(out_dir) || cli_check_folder_outputs(&ins, out_dir, "class")));
    cli_inputs_free(&ins);
    if (bad) return cli_fail();
    unsigned st_flags = no_verify ? DC_ST_NO_VERIFY : 0;

    dc_backend *be = NULL;
    dc_model *m = NULL;
    dc_sampler s = {0};
    dc_buf x = {0}, yd = {0};
    float *all = NULL;
    int32_t *y = NULL;
    uint32_t *idx = NULL;
    int status = 1;
    const char *which;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    if (cli_load_model(ckpt, raw, heads, st_flags, be, &m, &which)) goto done;
    const dc_model_info *c = &m->info;
    if (c->cond != DC_COND_LABELS) {
        dc_fail("%s is a text-conditioned %s; this command samples class-conditional models", ckpt, m->ops->name);
        goto done;
    }
    if (!classes_s && c->num_classes > 20) {
        dc_fail("the model has %d classes: choose some with --classes", c->num_classes);
        goto done;
    }
    if (parse_classes(classes_s ? classes_s : "all", c->num_classes, classes, &ncls)) goto done;
    if ((grid || out_dir) && c->channels != 1 && c->channels != 3) {
        dc_fail("the model makes %d-channel images; PNG needs 1 or 3 (use --tensor-out)", c->channels);
        goto done;
    }
    so.learn_sigma = c->learn_sigma;
    so.null_class = c->num_classes;
    if ((int64_t)ncls * per_class > 1000000) {
        dc_fail("%d classes x %d per class is over 1000000 samples; sample in parts", ncls, per_class);
        goto done;
    }
    // Every file is checked before the sampling, which may take hours.
    if (out_dir && (dc_mkdir_p(out_dir) || check_out_files(out_dir, classes, ncls, per_class))) goto done;
    int N = ncls * per_class, H = c->height, W = c->width, C = c->channels;
    int64_t img = (int64_t)C * H * W;
    if (batch > N) batch = N;
    if (dc_model_reserve(m, so.cfg_scale > 1 ? 2 * batch : batch)) goto done;
    if (dc_gaussian_sampler_init(&s, be, &so, C, H, W, batch)) goto done;
    x = (dc_buf){be->alloc(be, (size_t)batch * img * 4), DC_F32};
    yd = (dc_buf){be->alloc(be, (size_t)batch * sizeof(int32_t)), DC_I32};
    all = malloc((size_t)N * img * sizeof *all);
    y = malloc(N * sizeof *y), idx = malloc(N * sizeof *idx);
    if (!x.p || !yd.p || !all || !y || !idx) { dc_fail("out of memory"); goto done; }
    for (int i = 0; i < N; i++) y[i] = classes[i / per_class], idx[i] = (uint32_t)i;
    dc_log("sampling %d images (%d classes x %d) with %s weights of %s: %s %d steps, guidance %g, seed %llu",
           N, ncls, per_class, which, ckpt, sampler, so.steps, so.cfg_scale, (unsigned long long)so.seed);
    progress_ctx pc = {dc_time_now(), 0, N, 0};
    for (int i0 = 0; i0 < N; i0 += batch) {
        int n = N - i0 < batch ? N - i0 : batch;
        pc.done_images = i0, pc.batch_images = n;
        be->upload(be, yd.p, y + i0, (size_t)n * sizeof(int32_t));
        dc_cond cond = {.y = yd};
        if (dc_sampler_run(&s, x, &cond, idx + i0, n, eval_model, NULL, m, on_step, &pc)) goto done;
        be->download(be, all + i0 * img, x.p, (size_t)n * img * 4);
        if (dc_backend_status(be)) goto done;
    }
    double el = dc_time_now() - pc.t0;
    dc_progress(true, "sampled %d images in %.1f s (%.2f images/s, %.1f image-steps/s)", N, el,
                N / el, (double)N * so.steps / el);
    const char *sampler_name = so.kind == DC_STEP_DDIM ? "DDIM" : "DDPM";
    if (out_dir) {
        for (int i = 0; i < N; i++) {
            char path[4096], prompt[32];
            sample_path(out_dir, y[i], i % per_class, path, sizeof path);
            snprintf(prompt, sizeof prompt, "class %d", y[i]);
            char *par = png_parameters(prompt, &so, sampler_name, W, H, ckpt, which, i);
            dc_png_text t = {DC_PNG_PARAMETERS_KEY, par};
            int wrc = par ? dc_png_write_grid_text(path, all + i * img, 1, C, H, W, 1, 1, &t, 1) : -1;
            free(par);
            if (wrc) goto done;
        }
        dc_log("samples: %s/class{c}_{i}.png (%d files)", out_dir, N);
    }
    if (tensor_out) {
        dc_st_entry e[2] = {
            {.name = "samples", .dtype = DC_F32, .ndim = 4, .shape = {N, C, H, W}, .data = all},
            {.name = "labels", .dtype = DC_I32, .ndim = 1, .shape = {N}, .data = y},
        };
        if (dc_st_write(tensor_out, e, 2, NULL, NULL, 0)) goto done;
        dc_log("tensors: %s", tensor_out);
    }
    if (grid) {
        // The first `cols` samples of each class make its row.
        int cols = grid_cols > 0 && grid_cols < per_class ? grid_cols : per_class;
        for (int r = 0; r < ncls; r++)
            memmove(all + (int64_t)r * cols * img, all + (int64_t)r * per_class * img,
                    (size_t)cols * img * sizeof *all);
        // "classes 0, 3, 7": one row each
        char *prompt = malloc((size_t)ncls * 12 + 16), *par = NULL;
        if (prompt) {
            int k = sprintf(prompt, "class%s", ncls > 1 ? "es" : "");
            for (int r = 0; r < ncls; r++) k += sprintf(prompt + k, "%s %d", r ? "," : "", classes[r]);
            par = png_parameters(prompt, &so, sampler_name, W, H, ckpt, which, -1);
        } else dc_fail("out of memory");
        dc_png_text t = {DC_PNG_PARAMETERS_KEY, par};
        int wrc = par ? dc_png_write_grid_text(grid, all, ncls * cols, C, H, W, ncls, cols, &t, 1) : -1;
        free(prompt), free(par);
        if (wrc) goto done;
        dc_log("grid: %s (%d rows x %d)", grid, ncls, cols);
    }
    status = 0;
done:
    if (status) cli_fail();
    if (x.p) be->free(be, x.p);
    if (yd.p) be->free(be, yd.p);
    free(all), free(y), free(idx);
    dc_sampler_free(&s);
    dc_model_free(m);
    if (be) dc_backend_destroy(be);
    return status;
}
