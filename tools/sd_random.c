// Random-weight Stable Diffusion models in the layouts people have them, so
// the loaders run on real names and shapes without shipping or downloading
// weights: a diffusers pipeline folder (model_index.json, unet/, vae/,
// text_encoder/ with transformers 4 names, scheduler/), or a single-file
// checkpoint in the original layout (OpenAI CLIP names for SD 1.x, OpenCLIP
// with packed q/k/v for SD 2.x). Both layouts of one config and seed hold the
// same values; the SD 2 single file's text encoder has one layer more than
// the folder's (as real files do), which SD 2 skips. A folder gets tokenizer/
// as CLIP's tokenizer files are (vocab.json, merges.txt, the special tokens;
// SD 2 pads with "!"), made from OpenAI's vocabulary (--vocab, default the
// repository's data/bpe_simple_vocab_16e6.txt.gz), so it runs as a real one.
//
// --config t2i-demo writes the base a text-to-image model is trained from
// scratch on: a diffusers folder with tokenizer/, a small CLIP text encoder
// (width 128, 4 layers of 4 heads, MLP 512, 77 positions, CLIP's 49408
// tokens) initialised as transformers initialises CLIPTextModel, DDPM's
// linear schedule in scheduler/, and neither a UNet (it is trained from a
// config) nor a VAE (it draws pixels): model_index.json names both null.
//
// --config tiny-pixel is tiny1 without a VAE: its UNet draws 16x16 pictures.
//
//   sd_random --config sd1.5|sd2.1|tiny1|tiny2|tiny-pixel|t2i-demo --layout diffusers|single
//             [--dtype f16|bf16|f32] [--seed N] [--vocab BPE] --out PATH
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "models/clip_text.h"
#include "models/sd_write.h"
#include "models/unet.h"
#include "models/vae.h"
#include "text/clip_vocab_files.h"

typedef struct {
    dc_unet_config unet;
    dc_vae_config vae;
    dc_clip_text_config text;  // as the single file holds it
    int version;
    bool has_unet, has_vae;    // (a folder without one names it null in model_index.json)
    bool ddpm;                 // DDPM's linear schedule, transformers' text encoder init (t2i-demo)
} sd_config;

static int config_of(const char *name, sd_config *c) {
    memset(c, 0, sizeof *c);
    dc_unet_config_sd15(&c->unet);
    dc_vae_config v = {3, 3, 4, 4, {128, 256, 512, 512}, 2, 32, 1e-6f, 0.18215f};
    c->vae = v;
    dc_clip_text_config t = {49408, 77, 768, 12, 12, 3072, DC_ACT_QUICK_GELU, 1e-5f};
    c->text = t;
    c->version = 1;
    c->has_unet = c->has_vae = true;
    bool two = !strcmp(name, "sd2.1") || !strcmp(name, "tiny2");
    if (two) {
        c->version = 2;
        c->unet.ctx_dim = 1024, c->unet.linear_proj = true, c->unet.sample_size = 96;
        c->unet.prediction = DC_PRED_V;
        const int heads[4] = {5, 10, 20, 20};
        for (int i = 0; i < 4; i++) c->unet.heads[i] = heads[i];
        c->text.width = 1024, c->text.heads = 16, c->text.layers = 24, c->text.ffn = 4096;
        c->text.act = DC_ACT_GELU_ERF;
    }
    const bool pixel = !strcmp(name, "tiny-pixel");
    if (!strncmp(name, "tiny", 4)) {  // the real topology, small: 32x32 pictures in seconds on a CPU
        c->unet.nblocks = 2;
        c->unet.ch[0] = 64, c->unet.ch[1] = 128;
        c->unet.attn[0] = true, c->unet.attn[1] = false;
        c->unet.heads[0] = 1, c->unet.heads[1] = 2;  // heads of 64, as inference from shapes assumes
        c->unet.layers = two ? 1 : 2;
        c->unet.ctx_dim = 64;
        c->unet.sample_size = 8;
        dc_vae_config tv = {3, 3, 4, 3, {32, 32, 64}, 1, 32, 1e-6f, 0.18215f};
        c->vae = tv;
        c->text.width = 64, c->text.heads = 1, c->text.ffn = 128, c->text.layers = two ? 3 : 2;
        if (pixel) {  // tiny1 drawing 16x16 pictures itself (no VAE)
            c->has_vae = false;
            c->unet.in_channels = c->unet.out_channels = 3, c->unet.sample_size = 16;
        }
        return pixel || !strcmp(name, "tiny1") || two ? 0 : dc_fail("--config %s: no such config", name);
    }
    if (!strcmp(name, "t2i-demo")) {
        dc_clip_text_config demo = {49408, 77, 128, 4, 4, 512, DC_ACT_QUICK_GELU, 1e-5f};
        c->text = demo;
        c->has_unet = c->has_vae = false, c->ddpm = true;
        return 0;
    }
    if (!strcmp(name, "sd1.5") || !strcmp(name, "sd2.1")) return 0;
    return dc_fail("--config %s: choose sd1.5, sd2.1, tiny1, tiny2, tiny-pixel or t2i-demo",
                   name);
}

// Normal(0, 1/fan_in) for matrices, 1 + N(0, 0.1) for norm scales, N(0, 0.05)
// for biases: finite activations through every layer.
static void fill(dc_params *ps, uint64_t seed, uint32_t salt) {
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        float *h = malloc(sizeof(float) * (size_t)p->numel);
        int64_t fan = p->ndim >= 2 ? p->numel / p->shape[0] : 1;
        bool bias = strstr(p->name, "bias") != NULL;
        for (int64_t j = 0; j < p->numel; j++) {
            float n = dc_randn_at(seed, salt, (uint32_t)i, DC_STREAM_INIT, (uint64_t)j);
            h[j] = p->ndim >= 2 ? n / sqrtf((float)fan) : bias ? 0.05f * n : 1.0f + 0.1f * n;
        }
        dc_param_to_stored(p, h);  // the values above are in PyTorch's order, as files hold them
        ps->be->upload(ps->be, dc_param_data(ps, i).p, h, sizeof(float) * (size_t)p->numel);
        free(h);
    }
}

static int run(const char *config, const char *layout, const char *dtype, uint64_t seed, const char *vocab,
               const char *out) {
    sd_config c;
    DC_TRY(config_of(config, &c));
    bool single = !strcmp(layout, "single");
    if (!single && strcmp(layout, "diffusers")) return dc_fail("--layout %s: diffusers or single", layout);
    if (single && !c.has_unet) return dc_fail("--config %s has no UNet: only --layout diffusers", config);
    dc_dtype dt = !strcmp(dtype, "f16") ? DC_F16 : !strcmp(dtype, "bf16") ? DC_BF16 : DC_F32;
    if (dt == DC_F32 && strcmp(dtype, "f32")) return dc_fail("--dtype %s: f16, bf16 or f32", dtype);
    dc_backend *be = dc_backend_cpu_create();
    dc_model *unet = NULL;
    dc_vae *vae = NULL;
    dc_clip_text *text = NULL;
    dc_sd_tensors t = {0};
    int rc = c.has_unet ? dc_unet_new(&c.unet, be, DC_F32, 8, 8, &unet) : 0;
    if (!rc && c.has_vae) rc = dc_vae_create(&vae, &c.vae, be, DC_F32, true, true);
    if (!rc) rc = dc_clip_text_create(&text, &c.text, be, DC_F32);
    if (!rc) {
        if (unet) fill(unet->params, seed, 1);
        if (vae) fill(&vae->params, seed, 2);
        if (c.ddpm) rc = dc_clip_text_init_weights(text, seed);
        else fill(text->params, seed, 3);
    }
    // SD 2's encoder: all layers in the single file, one fewer in the folder.
    const int text_layers = c.version == 2 && !single ? c.text.layers - 1 : c.text.layers;
    char path[4200];
    if (!rc && single) {
        rc = dc_sd_add_unet(&t, dc_unet_of(unet), true, dt) || (vae && dc_sd_add_vae(&t, vae, true, dt)) ||
             dc_sd_add_text(&t, text, text_layers, c.version == 2 ? DC_SD_TEXT_SD2 : DC_SD_TEXT_SD1, dt) ||
             dc_sd_tensors_write(&t, out, NULL);
    } else if (!rc) {
        const char *dirs[] = {"text_encoder", "scheduler", unet ? "unet" : NULL, vae ? "vae" : NULL};
        for (int i = 0; i < 4 && !rc; i++) {
            snprintf(path, sizeof path, "%s/%s", out, dirs[i] ? dirs[i] : "");
            if (dirs[i]) rc = dc_mkdir_p(path);
        }
        snprintf(path, sizeof path, "%s/unet/config.json", out);
        if (!rc && unet) rc = dc_sd_write_unet_config(&c.unet, path);
        snprintf(path, sizeof path, "%s/vae/config.json", out);
        if (!rc && vae) rc = dc_sd_write_vae_config(&c.vae, path);
        snprintf(path, sizeof path, "%s/text_encoder/config.json", out);
        if (!rc) rc = dc_sd_write_text_config(&c.text, text_layers, dt, path);
        snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", out);
        // DDPM's linear betas as diffusers' DDPMScheduler defaults them (t2i-demo), else SD's PNDM
        if (!rc && c.ddpm)
            rc = dc_write_text_file(path, "{\n  \"_class_name\": \"DDPMScheduler\",\n  \"beta_start\": 0.0001,\n"
                                          "  \"beta_end\": 0.02,\n  \"beta_schedule\": \"linear\",\n"
                                          "  \"num_train_timesteps\": 1000,\n  \"clip_sample\": false,\n"
                                          "  \"prediction_type\": \"epsilon\"\n}\n");
        else if (!rc)
            rc = dc_sd_write_scheduler_config(NULL, c.unet.prediction, path);
        snprintf(path, sizeof path, "%s/model_index.json", out);
        if (!rc)
            rc = dc_sd_write_model_index(c.ddpm ? "DDPMScheduler" : "PNDMScheduler", unet != NULL, vae != NULL, path);
        snprintf(path, sizeof path, "%s/tokenizer", out);
        if (!rc) rc = dc_clip_vocab_write_files(vocab, path, c.version == 2);
        snprintf(path, sizeof path, "%s/unet/diffusion_pytorch_model.safetensors", out);
        if (!rc && unet) rc = dc_sd_add_unet(&t, dc_unet_of(unet), false, dt) || dc_sd_tensors_write(&t, path, NULL);
        snprintf(path, sizeof path, "%s/vae/diffusion_pytorch_model.safetensors", out);
        if (!rc && vae) rc = dc_sd_add_vae(&t, vae, false, dt) || dc_sd_tensors_write(&t, path, NULL);
        snprintf(path, sizeof path, "%s/text_encoder/model.safetensors", out);
        if (!rc) rc = dc_sd_add_text(&t, text, text_layers, DC_SD_TEXT_TRANSFORMERS, dt) ||  // transformers 4
                      dc_sd_tensors_write(&t, path, NULL);
    }
    dc_sd_tensors_free(&t);
    dc_model_free(unet);
    if (vae) dc_vae_free(vae);
    if (text) dc_clip_text_free(text);
    dc_backend_destroy(be);
    return rc;
}

int main(int argc, char **argv) {
    const char *config = NULL, *layout = "diffusers", *dtype = "f16", *out = NULL;
    const char *vocab = "data/bpe_simple_vocab_16e6.txt.gz";
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--config")) config = argv[i + 1];
        else if (!strcmp(argv[i], "--layout")) layout = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--vocab")) vocab = argv[i + 1];
        else return fprintf(stderr, "sd_random: unknown flag %s\n", argv[i]), 2;
    }
    if (!config || !out || argc % 2 == 0) {
        fprintf(stderr, "usage: sd_random --config sd1.5|sd2.1|tiny1|tiny2|tiny-pixel|t2i-demo --layout diffusers|single "
                        "[--dtype f16|bf16|f32] [--seed N] [--vocab BPE] --out PATH\n");
        return 2;
    }
    if (run(config, layout, dtype, seed, vocab, out)) {
        fprintf(stderr, "sd_random: %s\n", dc_error());
        return 1;
    }
    return 0;
}
