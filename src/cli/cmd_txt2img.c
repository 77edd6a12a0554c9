// diffusion txt2img / img2img: Stable Diffusion pictures from a prompt (and
// a picture), each PNG carrying how it was made in AUTOMATIC1111's format.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/model_hash.h"
#include "core/error.h"
#include "core/log.h"
#include "io/image.h"
#include "io/png.h"
#include "io/png_params.h"
#include "pipelines/sd.h"
#include "text/lora_tags.h"

#define MAX_PICTURES 10000
#define MAX_SIDE 4096  // --width, --height

#define NO_MODEL_HELP                                                                                     \
    "--model is required: the engine ships no weights and downloads none. Give it your Stable\n"         \
    "Diffusion 1.x or 2.x files: a diffusers folder (model_index.json, unet/, vae/, text_encoder/,\n"     \
    "tokenizer/; *.safetensors in F32, F16 or BF16) or a single-file checkpoint in the original\n"        \
    "layout (v1-5-pruned-emaonly.safetensors, v2-1_768-ema-pruned.safetensors). A single file needs\n"    \
    "the CLIP vocabulary too (--vocab, or bpe_simple_vocab_16e6.txt.gz in /usr/share/diffusion/).\n"      \
    "See the README, section \"Stable Diffusion\"."

static const struct {
    const char *id, *a1111;
    dc_ks_kind kind;
    bool karras;
} k_samplers[] = {
    {"euler_a", "Euler a", DC_KS_EULER_A, false},     {"euler", "Euler", DC_KS_EULER, false},
    {"ddim", "DDIM", DC_KS_DDIM, false},              {"dpmpp_2m", "DPM++ 2M", DC_KS_DPMPP_2M, false},
    {"dpmpp_2m_karras", "DPM++ 2M Karras", DC_KS_DPMPP_2M, true},
};
#define NSAMPLERS (int)(sizeof k_samplers / sizeof *k_samplers)

typedef struct { double t0; } progress_ctx;

static void on_progress(void *ctx, const char *stage, int done, int total) {
    progress_ctx *p = ctx;
    double el = dc_time_now() - p->t0;
    if (strcmp(stage, "sampling") != 0) {
        if (!strcmp(stage, "done")) dc_progress(true, "made %d picture%s in %.1f s", total, total == 1 ? "" : "s", el);
        else dc_progress(false, "%s...", stage);
        return;
    }
    if (!dc_log_is_tty() && done != total) return;
    char eta[32];
    double frac = (double)done / total;
    dc_progress(false, "sampling: step %d/%d, %.2f steps/s, ETA %s", done, total, done / (el > 0 ? el : 1),
                dc_format_duration(frac > 0 ? el / frac - el : 0, eta, sizeof eta));
}

// out.png, or out-<i>.png for picture i of several.
static void picture_path(char *buf, size_t cap, const char *out, int i, int count) {
    if (count == 1) {
        snprintf(buf, cap, "%s", out);
        return;
    }
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (!dot || (slash && dot < slash)) dot = out + strlen(out);
    snprintf(buf, cap, "%.*s-%d%s", (int)(dot - out), out, i, dot);
}

static int write_picture(const char *path, const float *img, int H, int W, const char *params) {
    uint8_t *px = malloc((size_t)3 * H * W);
    if (!px) return dc_fail("out of memory");
    const int64_t plane = (int64_t)H * W;
    for (int64_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) px[i * 3 + c] = dc_pixel_u8(img[c * plane + i]);
    dc_png_text t = {DC_PNG_PARAMETERS_KEY, params};
    int rc = dc_png_write_text(path, px, W, H, 3, &t, 1);
    free(px);
    return rc;
}

// Writes each picture as soon as its batch is decoded, with how it was made.
typedef struct {
    const char *out;
    int count, width, height;
    const dc_sd_pipe *pipe;
    const dc_sd_gen *g;
    const char *sampler;  // AUTOMATIC1111's name
    bool img2img;
    const char *model_hash;  // "" when it could not be had
    const char *lora_hashes; // AUTOMATIC1111's "Lora hashes" value, or ""
    const char *prompt;      // as written, <lora:...> tags and all
} writer;

static int write_one(void *ctx, int i, const float *image) {
    const writer *w = ctx;
    const dc_sd_gen *g = w->g;
    char extra[1400] = "", path[4200];
    int k = 0;
    if (w->img2img) k += snprintf(extra + k, sizeof extra - (size_t)k, "Denoising strength: %g", g->strength);
    if (g->ks.kind == DC_KS_DDIM && g->ks.eta > 0)
        k += snprintf(extra + k, sizeof extra - (size_t)k, "%sEta: %g", k ? ", " : "", g->ks.eta);
    if (w->lora_hashes[0])
        k += snprintf(extra + k, sizeof extra - (size_t)k, "%sLora hashes: \"%s\"", k ? ", " : "", w->lora_hashes);
    if (w->count > 1) snprintf(extra + k, sizeof extra - (size_t)k, "%sBatch pos: %d", k ? ", " : "", i);
    dc_gen_params gp = {.prompt = w->prompt, .negative_prompt = g->negative_prompt, .steps = g->ks.steps,
                        .sampler = w->sampler, .cfg_scale = g->ks.cfg_scale, .seed = g->ks.seed, .width = w->width,
                        .height = w->height, .model_hash = w->model_hash, .model = w->pipe->name,
                        .extra = extra[0] ? extra : NULL};
    char *params = dc_gen_params_format(&gp);
    if (!params) return dc_fail("out of memory");
    picture_path(path, sizeof path, w->out, i, w->count);
    int rc = write_picture(path, image, w->height, w->width, params);
    free(params);
    if (rc == 0) dc_log("wrote %s", path);
    return rc;
}

// The --init picture as [3, height, width] floats in [-1, 1] (*out; free it),
// resized to *width x *height as `mode` says; a side given as 0 takes the
// picture's own. What can be refused from the header (a picture over the
// budget, or a side of it over what the command makes) is refused before
// anything is decoded.
static int load_init(const char *path, int *width, int *height, dc_resize_mode mode, float **out) {
    *out = NULL;
    dc_image pic;
    DC_TRY(dc_image_probe(path, &pic));
    const int w = *width ? *width : pic.width, h = *height ? *height : pic.height;
    if (w > MAX_SIDE || h > MAX_SIDE)
        return dc_fail("%s is %dx%d, and img2img makes pictures of up to %d a side: give --width and --height (each "
                       "a multiple of 64) to resize it", path, pic.width, pic.height, MAX_SIDE);
    DC_TRY(dc_image_read(path, &pic, DC_IMAGE_MAX_PIXELS));
    const bool same = w == pic.width && h == pic.height;  // used as it is
    dc_image fit = {0};
    int rc = same ? 0 : dc_image_fit(&pic, w, h, mode, &fit);
    if (rc == 0) {
        if (same) dc_log("%s: %s, %dx%d", path, dc_image_format_name(pic.format), w, h);
        else
            dc_log("%s: %s, %dx%d, resized to %dx%d (%s)", path, dc_image_format_name(pic.format), pic.width,
                   pic.height, w, h, dc_resize_mode_name(mode));
        *out = malloc(sizeof **out * 3 * (size_t)w * h);
        if (*out) dc_image_to_chw(same ? &pic : &fit, *out);
        else rc = dc_fail("out of memory for the picture");
    }
    dc_image_free(&fit), dc_image_free(&pic);
    if (rc == 0) *width = w, *height = h;
    return rc;
}

// The LoRAs to merge: --lora's files and the prompt's <lora:NAME:...> tags
// (NAME.safetensors in --lora-dir), with their multipliers.
typedef struct {
    char path[ARGS_MAX_LIST + DC_LORA_TAGS_MAX][4096];
    float unet[ARGS_MAX_LIST + DC_LORA_TAGS_MAX], text[ARGS_MAX_LIST + DC_LORA_TAGS_MAX];
    int n;
} lora_set;

static int lora_set_make(lora_set *ls, const arg_list *flags, const dc_lora_tag *tags, int ntags, const char *dir) {
    ls->n = 0;
    for (int i = 0; i < flags->n; i++, ls->n++) {
        DC_TRY(cli_lora_arg(flags->v[i], ls->path[ls->n], sizeof ls->path[0], &ls->unet[ls->n]));
        ls->text[ls->n] = ls->unet[ls->n];
    }
    if (ntags && !dir)
        return dc_fail("the prompt's <lora:%s:...> needs --lora-dir DIR (the folder of %s.safetensors)", tags[0].name,
                       tags[0].name);
    for (int i = 0; i < ntags; i++, ls->n++) {
        if (strchr(tags[i].name, '/')) return dc_fail("<lora:%s>: a name, not a path", tags[i].name);
        const int len = snprintf(ls->path[ls->n], sizeof ls->path[0], "%s/%s.safetensors", dir, tags[i].name);
        if (len < 0 || (size_t)len >= sizeof ls->path[0]) return dc_fail("--lora-dir %s: too long a path", dir);
        if (access(ls->path[ls->n], R_OK))
            return dc_fail("<lora:%s>: %s cannot be read (%s)", tags[i].name, ls->path[ls->n], strerror(errno));
        ls->unet[ls->n] = tags[i].unet, ls->text[ls->n] = tags[i].te;
    }
    return 0;
}

// The LoRAs applied to the loaded model at run time, or merged into its
// weights, and AUTOMATIC1111's "Lora hashes" of them ("name: hash, ...";
// name: the file's stem) into hashes.
static int apply_loras(dc_sd_pipe *pipe, const lora_set *ls, bool merge, char *hashes, size_t cap) {
    size_t k = 0;
    hashes[0] = 0;
    for (int i = 0; i < ls->n; i++) {
        const char *path = ls->path[i], *how = merge ? "merging" : "applying";
        char hash[13];
        if (ls->unet[i] == ls->text[i]) dc_log("%s LoRA %s at weight %g", how, path, ls->unet[i]);
        else dc_log("%s LoRA %s at weight %g (UNet), %g (text encoder)", how, path, ls->unet[i], ls->text[i]);
        DC_TRY(merge ? dc_sd_pipe_merge_lora(pipe, path, ls->unet[i], ls->text[i])
                     : dc_sd_pipe_add_lora(pipe, path, ls->unet[i], ls->text[i]));
        if (cli_lora_hash(path, hash)) return -1;
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path, *dot = strrchr(base, '.');
        const int stem = dot && dot > base ? (int)(dot - base) : (int)strlen(base);
        const int n = snprintf(hashes + k, cap - k, "%s%.*s: %s", k ? ", " : "", stem, base, hash);
        if (n < 0 || (k += (size_t)n) >= cap) return dc_fail("--lora: too many LoRAs to name in a picture");
    }
    return 0;
}

static int run(int argc, char **argv, bool img2img) {
    const char *model = NULL, *prompt = NULL, *negative = "", *sampler = "euler_a", *out = NULL;
    const char *vocab = NULL, *prediction = "auto", *device = "auto", *precision = "auto", *init_path = NULL;
    const char *heads_text = NULL, *resize_text = "resize";
    int steps = 20, width = 0, height = 0, count = 1, batch = 1, threads = 0;
    float cfg = 7.5f, eta = 0.0f, strength = 0.75f;
    arg_list loras = {0};
    const char *lora_dir = NULL;
    uint64_t seed = 0;
    bool no_verify = false, lora_merge = false;
    arg_spec specs[] = {
        {"model", ARG_STR, &model, "PATH", "diffusers folder or single-file checkpoint (SD 1.x, 2.x), or a training "
                                           "run's folder or checkpoint (its EMA UNet on its base model)"},
        {"prompt", ARG_STR, &prompt, "TEXT", "what to draw"},
        {"negative-prompt", ARG_STR, &negative, "TEXT", "what to steer away from (default empty)"},
        {"init", ARG_STR, &init_path, "PICTURE", "the picture to start from: PNG, JPEG or WebP, any size"},
        {"resize-mode", ARG_STR, &resize_text, "MODE", "--init to --width x --height as AUTOMATIC1111: resize "
                                                       "(stretch), crop (cover) or fill (fit, edges stretched)"},
        {"strength", ARG_FLOAT, &strength, "X", "how much of the picture is redrawn, in (0, 1]"},
        {"steps", ARG_INT, &steps, "N", "sampling steps"},
        {"cfg-scale", ARG_FLOAT, &cfg, "X", "classifier-free guidance scale (1: none)"},
        {"sampler", ARG_STR, &sampler, "NAME", "euler_a, euler, ddim, dpmpp_2m or dpmpp_2m_karras"},
        {"eta", ARG_FLOAT, &eta, "X", "DDIM eta (0: deterministic)"},
        {"seed", ARG_U64, &seed, "N", "noise seed: the same seed gives the same pictures"},
        {"width", ARG_INT, &width, "PX", img2img ? "width, a multiple of 64 (default: the picture's)"
                                                 : "width, a multiple of 64 (default: the model's size)"},
        {"height", ARG_INT, &height, "PX", img2img ? "height, a multiple of 64 (default: the picture's)"
                                                   : "height, a multiple of 64 (default: the model's size)"},
        {"count", ARG_INT, &count, "N", "pictures to make"},
        {"batch", ARG_INT, &batch, "N", "pictures per pass (faster, more memory)"},
        {"out", ARG_STR, &out, "PATH", "PNG to write (several: PATH-0.png, PATH-1.png, ...)"},
        {"vocab", ARG_STR, &vocab, "PATH", "CLIP vocabulary (default: the model's tokenizer/, else searched)"},
        {"lora", ARG_LIST, &loras, "FILE[:W]", "a LoRA (kohya's, diffusers' or PEFT's safetensors; LoCon too) applied to "
                                               "the UNet and text encoder at weight W (default 1); repeatable"},
        {"lora-dir", ARG_STR, &lora_dir, "DIR", "where the prompt's <lora:NAME:W> tags find NAME.safetensors"},
        {"lora-merge", ARG_FLAG, &lora_merge, NULL, "merge the LoRAs into the weights (faster steps) instead of "
                                                    "applying them at run time"},
        {"prediction", ARG_STR, &prediction, "P", "auto, eps, v or sample (x0) (default auto: the scheduler "
                                                  "config; SD 2 single files: v)"},
        {"unet-heads", ARG_STR, &heads_text, "LIST", "UNet attention heads, 8 or 5,10,20,20 (default: config.json, "
                                                     "else SD's rules)"},
        {"no-verify", ARG_FLAG, &no_verify, NULL, CLI_NO_VERIFY_HELP},
        {"threads", ARG_INT, &threads, "N", "CPU threads (default: all cores)"},
        {"device", ARG_STR, &device, "NAME", CLI_DEVICE_HELP},
        {"precision", ARG_STR, &precision, "P", CLI_PRECISION_HELP},
    };
    int nspecs = (int)(sizeof specs / sizeof specs[0]);
    arg_spec *sp = specs;
    arg_spec t2i[sizeof specs / sizeof specs[0]];
    if (!img2img) {  // txt2img has no --init, --resize-mode or --strength
        int k = 0;
        for (int i = 0; i < nspecs; i++)
            if (strcmp(specs[i].name, "init") && strcmp(specs[i].name, "resize-mode") &&
                strcmp(specs[i].name, "strength"))
                t2i[k++] = specs[i];
        sp = t2i, nspecs = k;
    }
    arg_parser ap = {img2img ? "diffusion img2img --model PATH --init PICTURE --prompt TEXT --out OUT.png"
                             : "diffusion txt2img --model PATH --prompt TEXT --out OUT.png",
                     img2img ? "Redraws a picture with Stable Diffusion: the picture (PNG, JPEG or WebP;\n"
                               "transparency composited over white) is resized to --width x --height,\n"
                               "encoded, noised to --strength and denoised toward the prompt. The PNG says\n"
                               "how it was made (AUTOMATIC1111's 'parameters' text)."
                             : "Draws pictures with Stable Diffusion 1.x or 2.x from a prompt. Each PNG says\n"
                               "how it was made (AUTOMATIC1111's 'parameters' text); picture i of a seed is\n"
                               "the same whatever --batch.",
                     sp, nspecs, 0, {0}, 0, {0}};
    int rc = args_parse(&ap, argc, argv);
    if (rc) return rc > 0 ? 0 : cli_usage_fail();
    if (!model) return dc_fail(NO_MODEL_HELP), cli_usage_fail();
    if (!prompt || !out) return dc_fail("--prompt and --out are required (see --help)"), cli_usage_fail();
    if (img2img && !init_path) return dc_fail("--init is required (see --help)"), cli_usage_fail();
    int si = -1;
    for (int i = 0; i < NSAMPLERS; i++)
        if (!strcmp(sampler, k_samplers[i].id)) si = i;
    if (si < 0)
        return dc_fail("--sampler %s: choose euler_a, euler, ddim, dpmpp_2m or dpmpp_2m_karras", sampler),
               cli_usage_fail();
    int pred = !strcmp(prediction, "auto")     ? -1
               : !strcmp(prediction, "eps")    ? DC_PRED_EPS
               : !strcmp(prediction, "v")      ? DC_PRED_V
               : !strcmp(prediction, "sample") ? DC_PRED_SAMPLE
                                               : -2;
    if (pred == -2) return dc_fail("--prediction %s: choose auto, eps, v or sample", prediction), cli_usage_fail();
    if (steps < 1 || steps > 1000) return dc_fail("--steps %d: between 1 and 1000", steps), cli_usage_fail();
    if (!(cfg >= 1 && cfg <= 100)) return dc_fail("--cfg-scale %g: between 1 and 100", cfg), cli_usage_fail();
    if (!(eta >= 0 && eta <= 1)) return dc_fail("--eta %g: between 0 and 1", eta), cli_usage_fail();
    if (!(strength > 0 && strength <= 1)) return dc_fail("--strength %g: in (0, 1]", strength), cli_usage_fail();
    if (count < 1 || count > MAX_PICTURES) return dc_fail("--count %d: 1 to %d", count, MAX_PICTURES), cli_usage_fail();
    if (batch < 1 || batch > 64) return dc_fail("--batch %d: 1 to 64", batch), cli_usage_fail();
    // 0 stands for the model's size only when the flag is left out
    if ((args_given(&ap, "width") && (width < 1 || width > MAX_SIDE)) ||
        (args_given(&ap, "height") && (height < 1 || height > MAX_SIDE)))
        return dc_fail("--width/--height %dx%d: 1 to %d, multiples of 64 (leave them out for the model's size)",
                       width, height, MAX_SIDE), cli_usage_fail();
    dc_resize_mode resize_mode;
    if (dc_resize_mode_parse(resize_text, &resize_mode)) return cli_usage_fail();
    dc_heads heads = {0};
    if (heads_text && dc_heads_parse(heads_text, &heads)) return cli_usage_fail();
    if (cli_check_device_flags(threads, device, precision)) return cli_usage_fail();
    // the prompt the model reads holds no <lora:...> tags; the picture's parameters keep them
    dc_lora_tag tags[DC_LORA_TAGS_MAX];
    int ntags = 0;
    char *clean = malloc(strlen(prompt) + 1);
    static lora_set ls;
    if (!clean) return dc_fail("out of memory"), cli_fail();
    if (dc_lora_tags_parse(prompt, clean, strlen(prompt) + 1, tags, &ntags) ||
        lora_set_make(&ls, &loras, tags, ntags, lora_dir))
        return free(clean), cli_usage_fail();
    // No picture may replace a file the command reads: the model (every file
    // of a folder), the vocabulary, the init picture.
    const char *fallback = NULL;
    if (!vocab && cli_find_vocab(&fallback)) dc_error_clear();
    cli_inputs ins = {0};
    int bad = cli_inputs_add(&ins, "--model", model) ||
              cli_inputs_add(&ins, vocab ? "--vocab" : "the CLIP vocabulary", vocab ? vocab : fallback) ||
              cli_inputs_add(&ins, "--init", init_path);
    for (int i = 0; i < ls.n && !bad; i++) bad = cli_inputs_add(&ins, "--lora", ls.path[i]);
    bad = bad || cli_check_stdio(&ins);
    char path[4200];
    for (int i = 0; i < count && !bad; i++) {
        picture_path(path, sizeof path, out, i, count);
        bad = cli_check_output(path, &ins);
    }
    cli_inputs_free(&ins);
    if (bad) return free(clean), cli_fail();

    dc_backend *be = NULL;
    dc_sd_pipe pipe = {0};
    float *init = NULL;  // [3, height, width]
    int status = 1;
    if (img2img && load_init(init_path, &width, &height, resize_mode, &init)) goto done;
    dc_sd_open_opts oo = {model, vocab, fallback, no_verify ? DC_ST_NO_VERIFY : 0, pred, img2img,
                          heads_text ? &heads : NULL};
    if (dc_sd_pipe_find(&pipe, &oo)) goto done;  // the configs: the request is checked before any weight is read
    if (!width) width = pipe.default_size;
    if (!height) height = pipe.default_size;
    dc_sd_gen g = {clean, negative, count, batch, width, height, dc_ksampler_opts_default(),
                   init, strength};
    g.ks.kind = k_samplers[si].kind, g.ks.karras = k_samplers[si].karras, g.ks.steps = steps;
    g.ks.cfg_scale = cfg, g.ks.eta = eta, g.ks.seed = seed;
    if (dc_sd_gen_check(&pipe, &g)) goto done;
    if (cli_set_threads(threads) || cli_backend(device, precision, &be)) goto done;
    dc_log("loading %s on %s", model, be->name);
    if (dc_sd_pipe_load(&pipe, be)) goto done;
    dc_log("SD %s%s (%s), %dx%d, %s, %d steps, guidance %g, seed %llu",
           pipe.version == 1 ? "1.x" : pipe.version == 2 ? "2.x" : "(version unknown)",
           pipe.pixels ? " in pixel space" : "",
           pipe.prediction == DC_PRED_V ? "v-prediction" : pipe.prediction == DC_PRED_SAMPLE ? "x0-prediction" : "epsilon", width, height, k_samplers[si].a1111, steps, cfg,
           (unsigned long long)seed);
    char lora_hashes[1024];
    if (apply_loras(&pipe, &ls, lora_merge, lora_hashes, sizeof lora_hashes)) goto done;
    char model_hash[11] = "";
    if (cli_model_hash(&pipe.files, model_hash)) {  // the pictures are still worth having
        dc_warn("the pictures will carry no Model hash: %s", dc_error());
        dc_error_clear();
    }
    writer wr = {out, count, width, height, &pipe, &g, k_samplers[si].a1111, img2img, model_hash, lora_hashes, prompt};
    progress_ctx pc = {dc_time_now()};
    if (dc_sd_generate(&pipe, &g, write_one, &wr, on_progress, &pc)) goto done;
    status = 0;
done:
    if (status) cli_fail();
    free(init), free(clean);
    dc_sd_pipe_close(&pipe);
    if (be) dc_backend_destroy(be);
    return status;
}

int cmd_txt2img(int argc, char **argv) { return run(argc, argv, false); }
int cmd_img2img(int argc, char **argv) { return run(argc, argv, true); }
