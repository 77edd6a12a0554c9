// How a Stable Diffusion model folder is read before its weights:
// model_index.json (the pipeline's class, each component's folder and
// class), config files with a duplicate key, the scheduler config (a bad
// value refused by key and file, a good one followed), sharded weights
// (an index's shards, a missing or conflicting shard), pickles, symbolic link
// loops, and a request (size, steps, strength, sampler) checked against the
// configs before any weight is read: a model whose weights are garbage still
// gets the size error, and only the load trips on them.
//
// Models are the golden sd1 pipeline's configs (tests/golden/sd/sd1) with its
// weights linked or replaced; the tokenizer is OpenAI's vocabulary the
// repository ships (data/).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/error.h"
#include "core/log.h"
#include "models/sd_files.h"
#include "models/sd_source.h"
#include "pipelines/sd.h"
#include "tmpdir.h"

#define GOLD "tests/golden/sd/sd1/diffusers"
#define VOCAB "data/bpe_simple_vocab_16e6.txt.gz"

static char g_root[512];  // the repository (absolute), for links into the golden files

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return perror(path), (void)0;
    fputs(text, f);
    fclose(f);
}

static void sh(const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0) printf("warning: '%s' failed\n", cmd);
}

static bool has(const char *msg, const char *a, const char *b) {
    return strstr(msg, a) && (!b || strstr(msg, b));
}

// A copy of the golden sd1 pipeline in tmp/<name>: configs copied, weights
// linked (garbage: 4 KB of random bytes instead).
static const char *model_copy(const char *name, bool garbage) {
    const char *dir = tmp_path(name);
    static char keep[4][256];
    static int k;
    char *out = keep[k++ & 3];
    snprintf(out, 256, "%s", dir);
    sh("rm -rf '%s' && mkdir -p '%s'", out, out);
    sh("cp -r '" GOLD "/.' '%s'%s", out, "");
    const char *w[] = {"unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                       "text_encoder/model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char path[600], src[1100];
        snprintf(path, sizeof path, "%s/%s", out, w[i]);
        unlink(path);
        if (garbage) {
            sh("head -c 4096 /dev/urandom > '%s'%s", path, "");
        } else {
            snprintf(src, sizeof src, "%s/" GOLD "/%s", g_root, w[i]);
            if (symlink(src, path)) perror(path);
        }
    }
    return out;
}

static int find(dc_sd_pipe *p, const char *model) {
    dc_sd_open_opts o = {model, VOCAB, NULL, 0, -1, true, NULL};
    return dc_sd_pipe_find(p, &o);
}

// ---- model_index.json ---------------------------------------------------------------------
static void test_model_index(void) {
    static const struct { const char *json, *want, *want2; } bad[] = {
        {"{\"_class_name\": \"StableDiffusionXLPipeline\", \"unet\": [\"diffusers\", \"UNet2DConditionModel\"]}",
         "StableDiffusionXLPipeline", "_class_name"},
        {"{\"unet\": [\"diffusers\", \"UNet2DConditionModel\"]}", "_class_name", NULL},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"vae\": [\"diffusers\", \"AutoencoderKL\"],"
         " \"text_encoder\": [\"transformers\", \"CLIPTextModel\"]}", "names no unet", NULL},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"unet\": [\"diffusers\", \"AutoencoderKL\"],"
         " \"vae\": [\"diffusers\", \"AutoencoderKL\"], \"text_encoder\": [\"transformers\", \"CLIPTextModel\"]}",
         "'unet'", "AutoencoderKL"},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"unet\": [null, null],"
         " \"vae\": [\"diffusers\", \"AutoencoderKL\"], \"text_encoder\": [null, null]}",
         "'text_encoder' is null", NULL},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"unet\": \"UNet2DConditionModel\"}", "'unet'",
         "[library, class]"},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"../unet\": [\"diffusers\", \"UNet2DConditionModel\"]}",
         "'../unet'", "folder name"},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"_class_name\": \"StableDiffusionPipeline\"}",
         "duplicate key '_class_name'", "model_index.json"},
        {"{\"_class_name\": \"StableDiffusionPipeline\", \"unet\": [\"diffusers\", \"UNet2DConditionModel\"],"
         " \"vae\": [\"diffusers\", \"AutoencoderKL\"], \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],"
         " \"scheduler\": [\"diffusers\", \"CLIPTokenizer\"]}", "'scheduler'", "CLIPTokenizer"},
    };
    const char *m = model_copy("index", false);
    char path[600];
    snprintf(path, sizeof path, "%s/model_index.json", m);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put(path, bad[i].json);
        dc_sd_model md;
        int rc = dc_sd_model_open(&md, m, 0);
        if (!rc) dc_sd_model_close(&md);
        CHECK(rc != 0 && has(dc_error(), bad[i].want, bad[i].want2) && strstr(dc_error(), "model_index.json"),
              "model_index.json %s: refused naming '%s'? %s", bad[i].json, bad[i].want, rc ? dc_error() : "accepted");
    }
    // A UNet named null (a base to train one from): the model opens, and the
    // UNet is refused when asked for, naming model_index.json.
    put(path, "{\"_class_name\": \"StableDiffusionPipeline\", \"unet\": [null, null],"
              " \"vae\": [\"diffusers\", \"AutoencoderKL\"], \"text_encoder\": [\"transformers\", \"CLIPTextModel\"]}");
    {
        dc_sd_model md;
        dc_sd_source src;
        int rc = dc_sd_model_open(&md, m, 0), rs = rc ? 0 : dc_sd_source_find(&src, &md, DC_SD_UNET);
        CHECK(rc == 0 && md.unet == 0 && rs != 0 && has(dc_error(), "names no UNet", "model_index.json"),
              "a UNet named null: opens, refused when asked for? %s", dc_error());
        if (!rc) dc_sd_model_close(&md);
    }
    // SD 1.5's own, with its safety checker and its flag; the tokenizer and
    // scheduler named null
    put(path, "{\"_class_name\": \"StableDiffusionPipeline\", \"_diffusers_version\": \"0.6.0\","
              " \"feature_extractor\": [\"transformers\", \"CLIPImageProcessor\"], \"requires_safety_checker\": true,"
              " \"safety_checker\": [\"stable_diffusion\", \"StableDiffusionSafetyChecker\"],"
              " \"scheduler\": [null, null], \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],"
              " \"tokenizer\": [null, null], \"unet\": [\"diffusers\", \"UNet2DConditionModel\"],"
              " \"vae\": [\"diffusers\", \"AutoencoderKL\"]}");
    dc_sd_model md;
    char buf[4200];
    int rc = dc_sd_model_open(&md, m, 0);
    CHECK(rc == 0 && !strcmp(md.pipeline, "StableDiffusionPipeline") && md.tokenizer == 0 && md.scheduler == 0 &&
              !dc_sd_tokenizer_dir(&md, buf, sizeof buf) && dc_sd_scheduler_file(&md, buf, sizeof buf) == 1,
          "SD 1.5's model_index.json: %s", rc ? dc_error() : "");
    if (!rc) dc_sd_model_close(&md);
    // a scheduler named but its config gone
    put(path, "{\"_class_name\": \"StableDiffusionImg2ImgPipeline\", \"scheduler\": [\"diffusers\", \"PNDMScheduler\"],"
              " \"text_encoder\": [\"transformers\", \"CLIPTextModel\"], \"unet\": [\"diffusers\", \"UNet2DConditionModel\"],"
              " \"vae\": [\"diffusers\", \"AutoencoderKL\"]}");
    snprintf(buf, sizeof buf, "%s/scheduler/scheduler_config.json", m);
    unlink(buf);
    rc = dc_sd_model_open(&md, m, 0);
    CHECK(rc == 0 && dc_sd_scheduler_file(&md, buf, sizeof buf) < 0 && has(dc_error(), "names a scheduler", "missing"),
          "a named scheduler's config missing: %s", dc_error());
    if (!rc) dc_sd_model_close(&md);

    // a duplicate key in a component's config.json names the key and the file
    m = model_copy("dupkey", false);
    snprintf(path, sizeof path, "%s/vae/config.json", m);
    put(path, "{\"_class_name\": \"AutoencoderKL\", \"latent_channels\": 4, \"latent_channels\": 8}");
    rc = dc_sd_model_open(&md, m, 0);
    dc_sd_source s;
    int src = rc ? -1 : dc_sd_source_find(&s, &md, DC_SD_VAE);
    CHECK(rc == 0 && src != 0 && has(dc_error(), "duplicate key 'latent_channels'", "vae/config.json"),
          "duplicate key in vae/config.json: %s", dc_error());
    if (!rc) dc_sd_model_close(&md);
}

// ---- weight files -------------------------------------------------------------------------
static void tensor_file(const char *path, const char *a, const char *b) {
    float v[2] = {1, 2};
    dc_st_entry e[2] = {{.name = a, .dtype = DC_F32, .ndim = 1, .shape = {2}, .data = v},
                        {.name = b, .dtype = DC_F32, .ndim = 1, .shape = {2}, .data = v}};
    if (dc_st_write(path, e, b ? 2 : 1, NULL, NULL, 0)) printf("warning: %s\n", dc_error());
}

// Opens component folder dir as a VAE source (no config: any tensors do).
static int open_dir(const char *dir, dc_sd_source *s, int *nfiles) {
    dc_sd_model md;
    int rc = dc_sd_model_open(&md, dir, 0);
    if (!rc) {
        char cfg[600];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        put(cfg, "{\"_class_name\": \"AutoencoderKL\"}");
        rc = dc_sd_source_open(s, &md, DC_SD_VAE);
        if (!rc) *nfiles = s->nfiles, dc_sd_source_close(s);
        dc_sd_model_close(&md);
    }
    return rc;
}

static void test_shards(void) {
    char d[600], p[700];
    dc_sd_source s;
    int nf = 0;
    // an index and its two shards, a stray third file beside them that nothing names
    snprintf(d, sizeof d, "%s", tmp_path("shards"));
    sh("mkdir -p '%s'%s", d, "");
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", d);
    tensor_file(p, "a", "b");
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", d);
    tensor_file(p, "c", NULL);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", d);
    put(p, "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {\"a\": \"diffusion_pytorch_model-00001-of-00002.safetensors\","
           " \"b\": \"diffusion_pytorch_model-00001-of-00002.safetensors\","
           " \"c\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"}}");
    int rc = open_dir(d, &s, &nf);
    CHECK(rc == 0 && nf == 2, "an index and its shards: %d files: %s", nf, rc ? dc_error() : "");
    // the index puts a tensor in the other shard
    put(p, "{\"weight_map\": {\"a\": \"diffusion_pytorch_model-00002-of-00002.safetensors\","
           " \"c\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"}}");
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "'a'", "index says diffusion_pytorch_model-00002-of-00002"),
          "a tensor where the index does not say: %s", dc_error());
    // a shard the index names is missing: named
    put(p, "{\"weight_map\": {\"a\": \"diffusion_pytorch_model-00001-of-00002.safetensors\","
           " \"z\": \"diffusion_pytorch_model-00003-of-00003.safetensors\"}}");
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "diffusion_pytorch_model-00003-of-00003.safetensors", "missing"),
          "a missing shard named: %s", dc_error());
    // a shard path that leaves the folder
    put(p, "{\"weight_map\": {\"a\": \"../diffusion_pytorch_model-00001-of-00002.safetensors\"}}");
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "../diffusion_pytorch_model", "of the folder"), "a shard outside: %s", dc_error());
    put(p, "{\"weight_map\": {\"a\": \"/etc/passwd.safetensors\"}}");
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "/etc/passwd", "of the folder"), "an absolute shard: %s", dc_error());
    // the same tensor in two shards
    put(p, "{\"weight_map\": {\"a\": \"diffusion_pytorch_model-00001-of-00002.safetensors\","
           " \"c\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"}}");
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", d);
    tensor_file(p, "c", "b");
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "'b'", "two shards"), "a conflicting tensor: %s", dc_error());
    // no index: the set must be whole, and one
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", d);
    unlink(p);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", d);
    tensor_file(p, "c", NULL);
    rc = open_dir(d, &s, &nf);
    CHECK(rc == 0 && nf == 2, "shards without an index: %s", rc ? dc_error() : "");
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", d);
    unlink(p);
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "diffusion_pytorch_model-00001-of-00002.safetensors", "missing"),
          "a missing shard without an index: %s", dc_error());
    tensor_file(p, "a", "b");
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00003-of-00003.safetensors", d);
    tensor_file(p, "c", NULL);
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "two sets", "index"), "an extra shard of another set: %s", dc_error());
    unlink(p);
    // a shard that is a loop of symbolic links
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", d);
    unlink(p);
    if (symlink(p, p)) perror(p);
    rc = open_dir(d, &s, &nf);
    CHECK(rc != 0 && has(dc_error(), "loop of symbolic links", "00002-of-00002"), "a link loop: %s", dc_error());
}

static void test_pickles_and_links(void) {
    char d[600], p[700];
    snprintf(d, sizeof d, "%s", tmp_path("files"));
    sh("mkdir -p '%s'%s", d, "");
    // PyTorch's zip format and a bare pickle: named as such, with how to convert
    snprintf(p, sizeof p, "%s/model.ckpt", d);
    put(p, "PK\003\004 a zip's first bytes");
    dc_sd_model md;
    int rc = dc_sd_model_open(&md, p, 0);
    CHECK(rc != 0 && has(dc_error(), "not a safetensors file", "zip") && has(dc_error(), "save_file", "weights_only"),
          "a .ckpt in PyTorch's zip format: %s", dc_error());
    snprintf(p, sizeof p, "%s/model.bin", d);
    put(p, "\x80\x02}q\x00.");
    rc = dc_sd_model_open(&md, p, 0);
    CHECK(rc != 0 && has(dc_error(), "not a safetensors file", "pickle (protocol 2)") && strstr(dc_error(), "convert"),
          "a bare pickle .bin: %s", dc_error());
    snprintf(p, sizeof p, "%s/notes.txt", d);
    put(p, "hello, this is text and no pickle");
    rc = dc_sd_model_open(&md, p, 0);
    CHECK(rc != 0 && strstr(dc_error(), "not a safetensors file") && !strstr(dc_error(), "pickle"),
          "other bytes are no pickle: %s", dc_error());
    // a component folder with only a pickle
    const char *m = model_copy("binfolder", false);
    snprintf(p, sizeof p, "%s/unet/diffusion_pytorch_model.safetensors", m);
    unlink(p);
    snprintf(p, sizeof p, "%s/unet/diffusion_pytorch_model.bin", m);
    put(p, "PK\003\004....");
    rc = dc_sd_model_open(&md, m, 0);
    dc_sd_source s;
    int src = rc ? -1 : dc_sd_source_find(&s, &md, DC_SD_UNET);
    CHECK(rc == 0 && src != 0 && has(dc_error(), "diffusion_pytorch_model.bin", "zip") && strstr(dc_error(), "convert"),
          "a folder holding a pickle: %s", dc_error());
    if (!rc) dc_sd_model_close(&md);
    // loops of symbolic links: the model, and a component folder
    snprintf(p, sizeof p, "%s/loop", d);
    if (symlink(p, p)) perror(p);
    rc = dc_sd_model_open(&md, p, 0);
    CHECK(rc != 0 && has(dc_error(), "loop of symbolic links", "/loop"), "the model a link loop: %s", dc_error());
    m = model_copy("looped", false);
    snprintf(p, sizeof p, "%s/vae", m);
    sh("rm -rf '%s'%s", p, "");
    if (symlink(p, p)) perror(p);
    rc = dc_sd_model_open(&md, m, 0);
    src = rc ? -1 : dc_sd_source_find(&s, &md, DC_SD_VAE);
    CHECK(rc == 0 && src != 0 && has(dc_error(), "loop of symbolic links", "/vae"), "vae/ a link loop: %s",
          dc_error());
    if (!rc) dc_sd_model_close(&md);
    // a link that leads out of the model is followed (the Hugging Face cache is made of them)
    m = model_copy("linked", false);
    rc = dc_sd_model_open(&md, m, 0);
    src = rc ? -1 : dc_sd_source_open(&s, &md, DC_SD_UNET);
    CHECK(rc == 0 && src == 0 && s.nfiles == 1, "weights linked from elsewhere: %s", dc_error());
    if (src == 0) dc_sd_source_close(&s);
    if (!rc) dc_sd_model_close(&md);
}

// ---- the request, checked before the weights ----------------------------------------------
static void test_request(void) {
    if (access(VOCAB, R_OK) != 0) {
        CHECK(0, "%s not found (run from the repository's root)", VOCAB);
        return;
    }
    const char *m = model_copy("garbage", true);
    dc_sd_pipe p;
    int rc = find(&p, m);
    CHECK(rc == 0 && p.factor == 8 && p.align == 64 && p.default_size == 128 && p.prediction == DC_PRED_EPS && !p.unet,
          "configs read, no weights: factor %d align %d size %d: %s", p.factor, p.align, p.default_size,
          rc ? dc_error() : "");
    dc_sd_gen g = {"x", NULL, 1, 1, 100, 64, dc_ksampler_opts_default(), NULL, 0};
    if (!rc) {
        CHECK(dc_sd_gen_check(&p, &g) != 0 && has(dc_error(), "multiples of 64", "100x64"), "width 100: %s",
              dc_error());
        g.width = 0;
        CHECK(dc_sd_gen_check(&p, &g) != 0 && strstr(dc_error(), "0x64"), "width 0: %s", dc_error());
        g.width = 64, g.ks.steps = 1001;
        CHECK(dc_sd_gen_check(&p, &g) != 0 && strstr(dc_error(), "1001 steps"), "1001 steps: %s", dc_error());
        g.ks.steps = 10, g.strength = 0.05f;
        float pic[3] = {0};
        g.init = pic;
        CHECK(dc_sd_gen_check(&p, &g) != 0 && strstr(dc_error(), "runs no step"), "strength 0.05 of 10: %s",
              dc_error());
        g.strength = 0.5f;
        CHECK(dc_sd_gen_check(&p, &g) == 0, "img2img 5 of 10 steps: %s", dc_error());
        g.init = NULL;
        // only the load reads the weights, and trips on them
        dc_backend *be = NULL;
        if (dc_backend_create("cpu", &be) == 0) {
            rc = dc_sd_pipe_load(&p, be);
            CHECK(rc != 0 && strstr(dc_error(), "not a safetensors file"), "the load reads the garbage: %s", dc_error());
            dc_sd_pipe_close(&p);
            dc_backend_destroy(be);
        }
    }
    dc_sd_pipe_close(&p);

    // the scheduler config: refused by key and file; followed
    m = model_copy("sched", false);
    char path[600];
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", m);
    put(path, "{\"beta_schedule\": \"scaled_linear\", \"prediction_type\": 42}");
    rc = find(&p, m);
    CHECK(rc != 0 && has(dc_error(), "prediction_type", "scheduler/scheduler_config.json"), "prediction_type 42: %s",
          dc_error());
    put(path, "{\"beta_schedule\": \"scaled_linear\", \"num_train_timesteps\": -5}");
    rc = find(&p, m);
    CHECK(rc != 0 && has(dc_error(), "num_train_timesteps", "scheduler_config.json"), "num_train_timesteps -5: %s",
          dc_error());
    put(path, "{\"beta_schedule\": \"scaled_linear\", \"beta_start\": 0.00085, \"beta_end\": 0.012,"
              " \"prediction_type\": \"v_prediction\", \"num_train_timesteps\": 500, \"timestep_spacing\": \"trailing\","
              " \"rescale_betas_zero_snr\": true}");
    rc = find(&p, m);
    CHECK(rc == 0 && p.prediction == DC_PRED_V && p.sched.T == 500 && p.sched.spacing == DC_SPACING_TRAILING && p.sched.rescale_zero_snr,
          "a v-prediction, zero-SNR, 500-step config followed: %s", rc ? dc_error() : "");
    if (!rc) {
        g = (dc_sd_gen){"x", NULL, 1, 1, 64, 64, dc_ksampler_opts_default(), NULL, 0};
        g.ks.steps = 600;
        CHECK(dc_sd_gen_check(&p, &g) != 0 && strstr(dc_error(), "500"), "600 steps of 500: %s", dc_error());
        g.ks.steps = 20, g.ks.kind = DC_KS_DDIM;
        CHECK(dc_sd_gen_check(&p, &g) == 0, "DDIM on v at zero SNR: %s", dc_error());
    }
    dc_sd_pipe_close(&p);
    dc_sd_open_opts o = {m, VOCAB, NULL, 0, 0, false, NULL};  // --prediction eps over the config's v
    rc = dc_sd_pipe_find(&p, &o);
    g = (dc_sd_gen){"x", NULL, 1, 1, 64, 64, dc_ksampler_opts_default(), NULL, 0};
    g.ks.steps = 20, g.ks.kind = DC_KS_DDIM;
    CHECK(rc == 0 && p.prediction == DC_PRED_EPS && dc_sd_gen_check(&p, &g) != 0 && strstr(dc_error(), "rescale_betas_zero_snr"),
          "DDIM on epsilon at zero SNR refused before the weights: %s", dc_error());
    dc_sd_pipe_close(&p);
}

int main(void) {
    if (!getcwd(g_root, sizeof g_root) || access(GOLD "/model_index.json", R_OK) != 0) {
        printf("test_sd_config: run from the repository root (%s not found)\n", GOLD);
        return 1;
    }
    if (tmpdir_make("sd_config")) return 1;
    test_model_index();
    test_shards();
    test_pickles_and_links();
    test_request();
    tmpdir_remove();
    printf("test_sd_config: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
