// The VAE (diffusers AutoencoderKL) on the CPU, against outside sources:
// - registration: every name and shape of SD 1.5's and 2.1's VAE as
//   sd_manifest.json lists them (diffusers' own classes), in state-dict
//   order, for the whole model and for each half, and the original
//   single-file layout's names;
// - config.json: a valid one read, unsupported ones refused naming the field;
// - golden data from diffusers itself (tests/golden/sd/{sd1,sd2}) when present.
// A small VAE against a float64 reference written from diffusers' definitions
// is in test_vae_reference.c.
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/vae.h"
#include "vae_run.h"

static int parse_json_file(const char *path, dc_json_doc *doc) { return dc_json_read_file(doc, path); }

// ---- registration against sd_manifest.json

#define MANIFEST "tests/golden/sd/sd_manifest.json"

static bool manifest_param_ok(const dc_param *p, const dc_json *e) {
    if (strcmp(p->name, e->key) || e->type != DC_JSON_ARRAY || e->nkids != p->ndim) return false;
    for (int d = 0; d < p->ndim; d++)
        if (e->kids[d].num != (double)p->shape[d]) return false;
    return true;
}

// The parameters of m equal the manifest's entries that `keep` selects, in order.
static void compare_manifest(const char *model, const dc_vae *m, const dc_json *list, const char *half) {
    int k = 0, bad = 0;
    for (int i = 0; i < list->nkids; i++) {
        const char *name = list->kids[i].key;
        bool enc = !strncmp(name, "encoder.", 8) || !strncmp(name, "quant_conv.", 11);
        if ((!strcmp(half, "encoder") && !enc) || (!strcmp(half, "decoder") && enc)) continue;
        if (k >= m->params.count || !manifest_param_ok(&m->params.items[k], &list->kids[i])) {
            if (!bad++) printf("  %s %s: parameter %d is %s, the manifest has %s\n", model, half, k,
                               k < m->params.count ? m->params.items[k].name : "(none)", name);
        }
        k++;
    }
    CHECK(!bad && k == m->params.count, "%s VAE (%s): %d parameters registered, %d in the manifest, %d differ", model,
          half, m->params.count, k, bad);
}

static void test_manifest(dc_backend *be) {
    dc_json_doc doc = {0};
    if (parse_json_file(MANIFEST, &doc)) {
        CHECK(0, "parse %s: %s", MANIFEST, dc_error());
        return;
    }
    const char *models[2] = {"sd1.5", "sd2.1"};
    for (int t = 0; t < 2; t++) {
        const dc_json *sd = dc_json_get(doc.root, models[t]);
        const dc_json *cj = sd ? dc_json_get(sd, "vae_config") : NULL, *list = sd ? dc_json_get(sd, "vae") : NULL;
        dc_vae_config c;
        if (!cj || !list || dc_vae_config_from_json(&c, cj, "vae_config")) {
            CHECK(0, "%s: manifest VAE config: %s", models[t], dc_error());
            continue;
        }
        CHECK(c.nblocks == 4 && c.ch[0] == 128 && c.ch[3] == 512 && c.layers_per_block == 2 && c.groups == 32 &&
                  c.latent_channels == 4 && fabsf(c.scaling_factor - 0.18215f) < 1e-7f && c.eps == 1e-6f,
              "%s: config from vae_config", models[t]);
        const char *halves[3] = {"both", "encoder", "decoder"};
        for (int h = 0; h < 3; h++) {
            dc_vae *m;
            if (dc_vae_create(&m, &c, be, DC_F32, h != 2, h != 1)) {
                CHECK(0, "%s: create: %s", models[t], dc_error());
                continue;
            }
            compare_manifest(models[t], m, list, halves[h]);
            if (h == 0) {
                // Every parameter has an original name, and no two share one.
                int bad = 0;
                char(*names)[160] = calloc((size_t)m->params.count, 160);
                for (int i = 0; i < m->params.count && names; i++) {
                    dc_weight_src s;
                    if (dc_vae_original_name(&c, m->params.items[i].name, &s)) bad++;
                    memcpy(names[i], s.name, 160);
                    for (int j = 0; j < i; j++) bad += !strcmp(names[i], names[j]);
                }
                CHECK(names && !bad, "%s: original names for every parameter, all distinct (%d bad)", models[t], bad);
                free(names);
            }
            dc_vae_free(m);
        }
    }
    dc_json_free(&doc);
}

// Spot checks of the original layout's names (diffusers' convert_ldm_vae_checkpoint).
static void test_names(void) {
    dc_vae_config c = {.nblocks = 4};
    const char *pairs[][2] = {
        {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight", "encoder.down.1.block.0.nin_shortcut.weight"},
        {"encoder.down_blocks.2.downsamplers.0.conv.bias", "encoder.down.2.downsample.conv.bias"},
        {"decoder.up_blocks.0.resnets.2.norm2.weight", "decoder.up.3.block.2.norm2.weight"},
        {"decoder.up_blocks.3.resnets.0.conv_shortcut.bias", "decoder.up.0.block.0.nin_shortcut.bias"},
        {"decoder.up_blocks.2.upsamplers.0.conv.weight", "decoder.up.1.upsample.conv.weight"},
        {"encoder.mid_block.resnets.1.conv2.weight", "encoder.mid.block_2.conv2.weight"},
        {"decoder.mid_block.attentions.0.group_norm.bias", "decoder.mid.attn_1.norm.bias"},
        {"decoder.mid_block.attentions.0.to_q.weight", "decoder.mid.attn_1.q.weight"},
        {"encoder.mid_block.attentions.0.to_out.0.bias", "encoder.mid.attn_1.proj_out.bias"},
        {"encoder.conv_norm_out.weight", "encoder.norm_out.weight"},
        {"decoder.conv_out.bias", "decoder.conv_out.bias"},
        {"post_quant_conv.weight", "post_quant_conv.weight"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        dc_weight_src s;
        CHECK(dc_vae_original_name(&c, pairs[i][0], &s) == 0 && !strcmp(s.name, pairs[i][1]) && s.rows == 0,
              "original name of %s: got %s, want %s", pairs[i][0], s.name, pairs[i][1]);
    }
    dc_weight_src s;
    CHECK(dc_vae_original_name(&c, "decoder.mid_block.attentions.0.to_z.weight", &s) != 0 &&
              strstr(dc_error(), "to_z"), "an unknown name is refused naming it");
}

// ---- config.json

static void test_config_json(void) {
    struct { const char *json, *want; } bad[] = {
        {"{\"block_out_channels\": [32, 64], \"down_block_types\": [\"DownEncoderBlock2D\", \"AttnDownEncoderBlock2D\"]}",
         "AttnDownEncoderBlock2D"},
        {"{\"block_out_channels\": [32, 64], \"up_block_types\": [\"UpDecoderBlock2D\"]}", "up_block_types"},
        {"{\"block_out_channels\": [32, 48]}", "block_out_channels[1] = 48"},
        {"{\"block_out_channels\": [32], \"use_quant_conv\": false}", "use_quant_conv"},
        {"{\"block_out_channels\": [32], \"act_fn\": \"gelu\"}", "act_fn"},
        {"{\"block_out_channels\": [32], \"mid_block_add_attention\": false}", "mid_block_add_attention"},
        {"{\"block_out_channels\": [32], \"layers_per_block\": 1.5}", "layers_per_block"},
        {"[1]", "JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dc_json_doc doc = {0};
        dc_vae_config c;
        int rc = dc_json_parse(&doc, bad[i].json, strlen(bad[i].json), 0);
        if (!rc) rc = dc_vae_config_from_json(&c, doc.root, "vae/config.json");
        else rc = 0;  // a test string that is not JSON: fails below
        CHECK(rc != 0 && strstr(dc_error(), bad[i].want) && strstr(dc_error(), "vae/config.json"),
              "config %s refused naming %s: %s", bad[i].json, bad[i].want, rc ? dc_error() : "(accepted)");
        dc_json_free(&doc);
    }
    const char *good = "{\"block_out_channels\": [64, 128], \"layers_per_block\": 1, \"norm_num_groups\": 16, "
                       "\"scaling_factor\": 0.13025, \"latent_channels\": 4, \"in_channels\": 3, \"out_channels\": 3}";
    dc_json_doc doc = {0};
    dc_vae_config c;
    CHECK(dc_json_parse(&doc, good, strlen(good), 0) == 0 && dc_vae_config_from_json(&c, doc.root, "c") == 0 &&
              c.nblocks == 2 && c.ch[1] == 128 && c.groups == 16 && c.layers_per_block == 1 &&
              fabsf(c.scaling_factor - 0.13025f) < 1e-7f,
          "a valid config read: %s", dc_error());
    dc_json_free(&doc);
}

// ---- golden data from diffusers

// Every .safetensors file of a folder, opened.
static int open_folder(const char *dir, dc_st_file *files, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) && n < cap) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (dc_st_open(&files[n], path)) {
            CHECK(0, "%s", dc_error());
            continue;
        }
        n++;
    }
    closedir(d);
    return n;
}

static float *io_tensor(const dc_st_file *io, const char *name, int64_t numel) {
    const dc_st_tensor *t = dc_st_find(io, name);
    if (!t || t->numel != numel) {
        CHECK(0, "%s: tensor %s missing or not of %lld values", io->path, name, (long long)numel);
        return NULL;
    }
    float *h = malloc((size_t)numel * sizeof *h);
    if (dc_st_read_f32(io, t, h)) return free(h), NULL;
    return h;
}

// Golden outputs are diffusers' in float64; ours are float32 on the CPU and
// land at ~1e-6 to 2e-6 (measured on both sets); the bound allows 10x that.
#define TOL_GOLDEN 2e-5

static void test_golden_dir(dc_backend *be, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/io.safetensors", dir);
    dc_st_file io;
    if (dc_st_open(&io, path)) {
        CHECK(0, "%s", dc_error());
        return;
    }
    const dc_st_tensor *ti = dc_st_find(&io, "vae.image"), *tz = dc_st_find(&io, "vae.z");
    if (!ti || !tz || ti->ndim != 4 || tz->ndim != 4) {
        CHECK(0, "%s: no vae.image / vae.z of 4 dimensions", path);
        dc_st_close(&io);
        return;
    }
    int B = (int)ti->shape[0], H = (int)ti->shape[2], W = (int)ti->shape[3];
    int h = (int)tz->shape[2], w = (int)tz->shape[3];
    int64_t ni = ti->numel, nl = tz->numel;
    float *img = io_tensor(&io, "vae.image", ni), *z = io_tensor(&io, "vae.z", nl);
    float *gm = io_tensor(&io, "vae.mean", nl), *gl = io_tensor(&io, "vae.logvar", nl);
    float *gd = io_tensor(&io, "vae.decoded", ni);  // 3 channels in and out
    dc_json_doc doc = {0};
    dc_vae_config cj;
    snprintf(path, sizeof path, "%s/diffusers/vae/config.json", dir);
    bool have_cfg = !parse_json_file(path, &doc) && !dc_vae_config_from_json(&cj, doc.root, path);
    CHECK(have_cfg, "%s: %s", path, dc_error());
    if (img && z && gm && gl && gd && have_cfg) {
        // diffusers folder (BF16) and the single file (F16, config inferred)
        for (int l = 0; l < 2; l++) {
            dc_st_file files[8];
            int nf;
            if (l == 0) snprintf(path, sizeof path, "%s/diffusers/vae", dir), nf = open_folder(path, files, 8);
            else snprintf(path, sizeof path, "%s/single.safetensors", dir), nf = !dc_st_open(&files[0], path);
            // sd2's folder holds its configs only (tests/golden/sd/README.md);
            // its VAE is checked through the single file.
            if (!nf && l == 0 && strstr(dir, "/sd2")) continue;
            if (!nf) {
                CHECK(0, "%s: %s", path, dc_error());
                continue;
            }
            dc_weights wt = {files, nf, ""};
            snprintf(wt.prefix, sizeof wt.prefix, "%s", l ? "first_stage_model." : "");
            dc_names names = l ? DC_NAMES_ORIGINAL : DC_NAMES_DIFFUSERS;
            dc_vae_config c = cj;
            if (l) {
                CHECK(dc_vae_config_infer(&c, &wt, names) == 0 && same_config(&c, &cj),
                      "%s: config inferred from the shapes equals config.json: %s", path, dc_error());
            } else {
                dc_vae_config inf;
                CHECK(dc_vae_config_infer(&inf, &wt, names) == 0 && same_config(&inf, &cj),
                      "%s: config inferred from the shapes equals config.json: %s", path, dc_error());
            }
            dc_vae *m;
            outputs o = {0};
            int rc = dc_vae_create(&m, &c, be, dc_weights_dtype(&wt), true, true);
            if (!rc) rc = dc_vae_load(m, &wt, names);
            if (!rc && (H != h * dc_vae_factor(&c) || W != w * dc_vae_factor(&c)))
                rc = dc_fail("%s: latent %dx%d does not match the image %dx%d", dir, w, h, W, H);
            if (!rc) rc = run(m, img, z, B, H, W, &o);
            if (!rc) {
                double em = nerr(o.mean, gm, nl), el = nerr(o.logvar, gl, nl), ed = nerr(o.dec, gd, ni);
                CHECK(em < TOL_GOLDEN && el < TOL_GOLDEN && ed < TOL_GOLDEN,
                      "%s vs diffusers: mean %.2e logvar %.2e decoded %.2e", path, em, el, ed);
                printf("  %s: mean %.2e logvar %.2e decoded %.2e\n", path, em, el, ed);
                outputs_free(&o);
            } else {
                CHECK(0, "%s: %s", path, dc_error());
            }
            if (m) dc_vae_free(m);
            for (int i = 0; i < nf; i++) dc_st_close(&files[i]);
        }
    }
    dc_json_free(&doc);
    free(img), free(z), free(gm), free(gl), free(gd);
    dc_st_close(&io);
}

int main(void) {
    dc_backend *be = dc_backend_cpu_create();
    if (!be) return printf("cpu backend: %s\n", dc_error()), 1;
    test_names();
    test_config_json();
    test_manifest(be);
    const char *golden[2] = {"tests/golden/sd/sd1", "tests/golden/sd/sd2"};
    for (int i = 0; i < 2; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/io.safetensors", golden[i]);
        FILE *f = fopen(p, "rb");
        CHECK(f != NULL, "%s is present", p);
        if (!f) continue;
        fclose(f);
        test_golden_dir(be, golden[i]);
    }
    dc_backend_destroy(be);
    printf("test_vae: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
