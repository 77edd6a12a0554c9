// The model registry (models/registry.h) and the sizing half of the seam:
// - presets: "DiT-XL/2" and the demo model give the official numbers (the
//   DiT paper's table), typed here by hand; an unknown name is refused naming
//   the presets;
// - configure: shape overrides with their derived entries (a width brings
//   its MLP and the official head count), the data's entries (image side,
//   channels, classes) from the data or the overrides, never from the preset;
//   non-square data, an unknown entry and a width outside the table refused;
// - a config made from entries, written to a file and read back through the
//   registry, is the same list of entries;
// - a layout (be NULL) registers the same parameters, in the same order and
//   with the same shapes, as the allocated model, with nothing allocated;
//   its parameter count is the closed form of the DiT's layers;
// - a model without activation checkpointing refuses --recompute by name;
// - the SD UNet: a diffusers config.json read through the registry gives the
//   file's entries; its layout registers exactly dc_unet_register's
//   parameters and allocates nothing, and sizes its activations as the
//   allocated model does; the registry's model computes, bit for bit, the
//   forward of one made with dc_unet_new from the same config and weights;
//   configure takes the latent shape from data unless overridden; a config
//   written as file metadata reads back the same; one made for training has
//   gradients; an unknown class and an unknown override are refused by name.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/model_io.h"
#include "models/registry.h"
#include "models/unet.h"
#include "nn/params_io.h"

#include "check.h"
#include "tmpdir.h"

static int entry(const dc_kv *kv, const char *key) {
    const char *v = dc_kv_get(kv, key);
    return v ? atoi(v) : -1;
}

static void test_presets(void) {
    dc_kv cfg = {0};
    CHECK(dc_model_preset("DiT-XL/2", &cfg) == 0, "DiT-XL/2: %s", dc_error());
    CHECK(!strcmp(cfg.keys[0], "model") && !strcmp(cfg.values[0], "DiT"), "the \"model\" entry first");
    CHECK(entry(&cfg, "depth") == 28 && entry(&cfg, "hidden_size") == 1152 && entry(&cfg, "num_heads") == 16 &&
              entry(&cfg, "patch_size") == 2 && entry(&cfg, "input_size") == 32 && entry(&cfg, "in_channels") == 4 &&
              entry(&cfg, "mlp_hidden") == 4608 && entry(&cfg, "num_classes") == 1000 &&
              !strcmp(dc_kv_get(&cfg, "learn_sigma"), "true"),
          "DiT-XL/2's entries");
    CHECK(dc_model_preset("DiT-S/8", &cfg) == 0 && entry(&cfg, "depth") == 12 && entry(&cfg, "hidden_size") == 384 &&
              entry(&cfg, "num_heads") == 6 && entry(&cfg, "patch_size") == 8,
          "DiT-S/8's entries");
    CHECK(dc_model_preset(NULL, &cfg) == 0 && entry(&cfg, "input_size") == 28 && entry(&cfg, "depth") == 6 &&
              entry(&cfg, "hidden_size") == 64 && entry(&cfg, "num_classes") == 10,
          "the demo model's entries");
    const char *bad[] = {"DiT-Q/3", "UNet-XL", "", "DiT-XL/2x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(dc_model_preset(bad[i], &cfg) != 0 && strstr(dc_error(), "unknown model") &&
                  strstr(dc_error(), "DiT-{S,B,L,XL}/{2,4,8}"),
              "'%s': %s", bad[i], dc_error());
    CHECK(strstr(dc_model_presets_help(), "DiT-{S,B,L,XL}/{2,4,8}") != NULL, "presets help: %s",
          dc_model_presets_help());
    dc_kv_free(&cfg);
}

static void test_configure(void) {
    dc_kv base = {0}, ov = {0}, out = {0};
    dc_model_preset("DiT-B/4", &base);
    // a width brings its MLP and the table's heads; the data's entries stay 0 without data
    dc_kv_set(&ov, "hidden_size", "384");
    CHECK(dc_model_configure(&base, &ov, NULL, &out) == 0 && entry(&out, "hidden_size") == 384 &&
              entry(&out, "mlp_hidden") == 1536 && entry(&out, "num_heads") == 6 && entry(&out, "depth") == 12 &&
              entry(&out, "patch_size") == 4 && entry(&out, "input_size") == 0 && entry(&out, "num_classes") == 0,
          "hidden 384: %s", dc_error());
    // given heads and MLP win over the derived ones, whatever the order given
    dc_kv_set(&ov, "mlp_hidden", "100"), dc_kv_set(&ov, "num_heads", "3");
    const dc_data_shape data = {.channels = 3, .frames = 1, .height = 16, .width = 16, .num_classes = 7};
    CHECK(dc_model_configure(&base, &ov, &data, &out) == 0 && entry(&out, "mlp_hidden") == 100 &&
              entry(&out, "num_heads") == 3 && entry(&out, "input_size") == 16 && entry(&out, "in_channels") == 3 &&
              entry(&out, "num_classes") == 7,
          "with data: %s", dc_error());
    // the overrides of the data's entries win over the data
    dc_kv_set(&ov, "input_size", "32"), dc_kv_set(&ov, "num_classes", "9");
    CHECK(dc_model_configure(&base, &ov, &data, &out) == 0 && entry(&out, "input_size") == 32 &&
              entry(&out, "num_classes") == 9 && entry(&out, "in_channels") == 3,
          "overrides over data: %s", dc_error());
    const dc_data_shape wide = {.channels = 1, .frames = 1, .height = 16, .width = 20, .num_classes = 2};
    dc_kv plain = {0};
    CHECK(dc_model_configure(&base, &plain, &wide, &out) != 0 && strstr(dc_error(), "needs square images"),
          "16x20 data: %s", dc_error());
    dc_kv_set(&plain, "hidden_size", "100");
    CHECK(dc_model_configure(&base, &plain, NULL, &out) != 0 && strstr(dc_error(), "pass --heads"),
          "width outside the table: %s", dc_error());
    dc_kv_set(&plain, "num_heads", "4");
    CHECK(dc_model_configure(&base, &plain, NULL, &out) == 0 && entry(&out, "num_heads") == 4, "width 100, 4 heads: %s",
          dc_error());
    dc_kv_set(&plain, "num_heads", "3");
    CHECK(dc_model_configure(&base, &plain, NULL, &out) != 0 && strstr(dc_error(), "not divisible"),
          "width 100, 3 heads: %s", dc_error());
    dc_kv_free(&plain);
    dc_kv_set(&plain, "layers", "4");
    CHECK(dc_model_configure(&base, &plain, NULL, &out) != 0 && strstr(dc_error(), "'layers'"), "unknown entry: %s",
          dc_error());
    dc_kv_free(&plain), dc_kv_free(&base), dc_kv_free(&ov), dc_kv_free(&out);
}

// The parameters of one DiT, in closed form: the embedders, depth blocks and
// the final layer of the official model (pos_embed included).
static int64_t dit_params(int64_t C, int64_t S, int64_t p, int64_t D, int64_t L, int64_t F, int64_t K, int64_t OC) {
    int64_t T = (S / p) * (S / p);
    int64_t embed = T * D + (D * C * p * p + D) + (256 * D + D) + (D * D + D) + (K + 1) * D;
    int64_t block = (3 * D * D + 3 * D) + (D * D + D) + (F * D + F) + (D * F + D) + (6 * D * D + 6 * D);
    int64_t final = (p * p * OC * D + p * p * OC) + (2 * D * D + 2 * D);
    return embed + L * block + final;
}

static void test_layout_and_files(void) {
    dc_backend *be = NULL;
    if (dc_backend_create("cpu", &be)) {
        CHECK(0, "backend: %s", dc_error());
        return;
    }
    dc_kv cfg = {0}, ov = {0}, back = {0};
    dc_model_preset(NULL, &cfg);
    dc_kv_set(&ov, "depth", "3"), dc_kv_set(&ov, "hidden_size", "48"), dc_kv_set(&ov, "num_heads", "4");
    const dc_data_shape data = {.channels = 2, .frames = 1, .height = 12, .width = 12, .num_classes = 5};
    dc_kv full = {0};
    CHECK(dc_model_configure(&cfg, &ov, &data, &full) == 0, "configure: %s", dc_error());
    dc_model *lay = NULL, *m = NULL;
    CHECK(dc_model_create(&full, NULL, false, &lay) == 0 && dc_model_create(&full, be, true, &m) == 0,
          "create: %s", dc_error());
    if (lay && m) {
        const dc_params *a = lay->params, *b = m->params;
        bool same = a->count == b->count && a->numel == b->numel && !memcmp(&lay->info, &m->info, sizeof m->info);
        for (int i = 0; same && i < a->count; i++)
            same = !strcmp(a->items[i].name, b->items[i].name) && a->items[i].offset == b->items[i].offset &&
                   a->items[i].numel == b->items[i].numel && a->items[i].trainable == b->items[i].trainable;
        CHECK(same, "the layout's parameters and info are the allocated model's");
        CHECK(!a->data.p && !a->grad.p && lay->be == NULL && b->data.p && b->grad.p, "the layout allocates nothing");
        int64_t want = dit_params(2, 12, 4, 48, 3, 192, 5, 4);
        CHECK(a->numel == want, "%lld parameters, the closed form gives %lld", (long long)a->numel, (long long)want);
        const dc_model_info *mi = &lay->info;
        CHECK(mi->channels == 2 && mi->frames == 1 && mi->height == 12 && mi->width == 12 && mi->out_channels == 4 &&
                  mi->blocks == 3 && mi->cond == DC_COND_LABELS && mi->num_classes == 5,
              "the layout's info");
        char what[256];
        dc_model_describe(lay, what, sizeof what);
        CHECK(strstr(what, "DiT depth 3, hidden 48, heads 4, patch 4, input 12x12x2") == what, "describe: %s", what);
        // the config to a file and back through the registry: the same entries
        dc_kv kv = {0};
        uint8_t *mem = NULL;
        size_t len = 0;
        dc_st_file f;
        int n = m->params->count;
        float *host = malloc((size_t)m->params->numel * sizeof *host);
        dc_st_entry *e = calloc((size_t)n, sizeof *e);
        char (*names)[128] = calloc((size_t)n, sizeof *names);
        CHECK(dc_model_init_weights(m, 3) == 0 && dc_params_entries(m->params, m->params->data, "", host, e, names) == 0 &&
                  dc_model_config_to_kv(m, &kv) == 0 &&
                  dc_st_serialize(e, n, (const char *const *)kv.keys, (const char *const *)kv.values, kv.n, &mem,
                                  &len) == 0 &&
                  dc_st_parse(&f, mem, len, "m.safetensors") == 0,
              "write: %s", dc_error());
        CHECK(dc_model_config_of_file(&f, "", 0, &back) == 0 && back.n == full.n, "read: %s", dc_error());
        bool equal = back.n == full.n;
        for (int i = 0; equal && i < full.n; i++)
            equal = !strcmp(back.keys[i], full.keys[i]) && !strcmp(back.values[i], full.values[i]);
        CHECK(equal, "the file's config is the one written");
        dc_st_close(&f);
        free(mem), free(host), free(e), free(names);
        dc_kv_free(&kv);
    }
    // a config naming an architecture that is not built
    dc_kv_set(&full, "model", "Transformer3D");
    dc_model *none = NULL;
    CHECK(dc_model_create(&full, be, false, &none) != 0 && !none && strstr(dc_error(), "'Transformer3D'") &&
              strstr(dc_error(), "it builds: DiT"),
          "unknown architecture: %s", dc_error());
    dc_model_free(lay), dc_model_free(m);
    dc_kv_free(&cfg), dc_kv_free(&ov), dc_kv_free(&full), dc_kv_free(&back);
    dc_backend_destroy(be);
}

// A model whose ops leave the optional ones out: the seam says so by name.
static void release_nothing(dc_model *m) { (void)m; }
static void test_optional_ops(void) {
    static const dc_model_ops ops = {.name = "Plain", .release = release_nothing};
    dc_model m = {.ops = &ops};
    CHECK(dc_model_set_recompute(&m, 1) != 0 && strstr(dc_error(), "a Plain has no activation checkpointing"),
          "recompute: %s", dc_error());
    CHECK(dc_model_activation_bytes(&m, DC_F32, 4, -1, false) < 0 && strstr(dc_error(), "Plain"),
          "activation bytes: %s", dc_error());
    char what[32];
    dc_model_describe(&m, what, sizeof what);
    CHECK(!strcmp(what, "Plain"), "describe: %s", what);
}

// tiny1 of tools/sd_random.c: SD 1.x's topology, two small blocks.
static const char k_tiny_unet[] =
    "{\"_class_name\": \"UNet2DConditionModel\", \"_diffusers_version\": \"0.21.4\", \"act_fn\": \"silu\",\n"
    " \"in_channels\": 4, \"out_channels\": 4, \"block_out_channels\": [64, 128], \"layers_per_block\": 2,\n"
    " \"down_block_types\": [\"CrossAttnDownBlock2D\", \"DownBlock2D\"],\n"
    " \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\"], \"attention_head_dim\": [1, 2],\n"
    " \"cross_attention_dim\": 64, \"norm_num_groups\": 32, \"norm_eps\": 1e-05, \"sample_size\": 8,\n"
    " \"use_linear_projection\": false, \"center_input_sample\": false}\n";

static int write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    if (!fp) return -1;
    int rc = fputs(text, fp) < 0;
    return fclose(fp) || rc ? -1 : 0;
}

static bool same_entries(const dc_kv *a, const dc_kv *b) {
    bool same = a->n == b->n;
    for (int i = 0; same && i < a->n; i++) same = !strcmp(a->keys[i], b->keys[i]) && !strcmp(a->values[i], b->values[i]);
    return same;
}

static void test_unet_config_json(dc_kv *cfg) {
    const char *path = tmp_path("config.json");
    CHECK(write_text(path, k_tiny_unet) == 0 && dc_model_config_of_json(path, cfg) == 0, "config.json: %s",
          dc_error());
    const char *s;
    CHECK(cfg->n > 0 && !strcmp(cfg->keys[0], "model") && !strcmp(cfg->values[0], "UNet2DConditionModel"),
          "the \"model\" entry first");
    CHECK(entry(cfg, "in_channels") == 4 && entry(cfg, "out_channels") == 4 && entry(cfg, "layers_per_block") == 2 &&
              entry(cfg, "cross_attention_dim") == 64 && entry(cfg, "norm_num_groups") == 32 &&
              entry(cfg, "sample_size") == 8,
          "the integer entries");
    CHECK((s = dc_kv_get(cfg, "block_out_channels")) && !strcmp(s, "[64, 128]"), "block_out_channels: %s", s);
    CHECK((s = dc_kv_get(cfg, "num_attention_heads")) && !strcmp(s, "[1, 2]"), "heads: %s", s);
    CHECK((s = dc_kv_get(cfg, "down_block_types")) && !strcmp(s, "[\"CrossAttnDownBlock2D\", \"DownBlock2D\"]"),
          "down blocks: %s", s);
    CHECK((s = dc_kv_get(cfg, "up_block_types")) && !strcmp(s, "[\"UpBlock2D\", \"CrossAttnUpBlock2D\"]"),
          "up blocks: %s", s);
    CHECK((s = dc_kv_get(cfg, "use_linear_projection")) && !strcmp(s, "false") &&
              (s = dc_kv_get(cfg, "norm_eps")) && (float)atof(s) == 1e-5f &&
              (s = dc_kv_get(cfg, "prediction_type")) && !strcmp(s, "epsilon"),
          "projection, eps, prediction");
    // an unknown class, a class without a config.json reader, no class at all
    dc_kv none = {0};
    const char *bad[][2] = {
        {"{\"_class_name\": \"UNet3DConditionModel\", \"in_channels\": 4}", "'UNet3DConditionModel'"},
        {"{\"model\": \"DiT\", \"depth\": 4}", "'DiT'"},
        {"{\"in_channels\": 4}", "no \"_class_name\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = tmp_path("bad.json");
        CHECK(write_text(p, bad[i][0]) == 0 && dc_model_config_of_json(p, &none) != 0 && strstr(dc_error(), p) &&
                  strstr(dc_error(), bad[i][1]) && strstr(dc_error(), "DiT, UNet2DConditionModel"),
              "%s: %s", bad[i][0], dc_error());
    }
    dc_kv_free(&none);
}

static void test_unet_configure(const dc_kv *cfg) {
    dc_kv ov = {0}, out = {0};
    const dc_data_shape data = {.channels = 3, .frames = 1, .height = 16, .width = 16};
    CHECK(dc_model_configure(cfg, &ov, &data, &out) == 0 && entry(&out, "in_channels") == 3 &&
              entry(&out, "sample_size") == 16 && entry(&out, "out_channels") == 4,
          "from data: %s", dc_error());
    dc_kv_set(&ov, "sample_size", "32"), dc_kv_set(&ov, "in_channels", "8"), dc_kv_set(&ov, "cross_attention_dim", "96");
    CHECK(dc_model_configure(cfg, &ov, &data, &out) == 0 && entry(&out, "in_channels") == 8 &&
              entry(&out, "sample_size") == 32 && entry(&out, "cross_attention_dim") == 96 &&
              entry(&out, "layers_per_block") == 2,
          "overrides over data: %s", dc_error());
    CHECK(dc_model_configure(cfg, NULL, NULL, &out) == 0 && same_entries(&out, cfg), "no overrides: the base");
    const dc_data_shape wide = {.channels = 4, .frames = 1, .height = 16, .width = 20};
    CHECK(dc_model_configure(cfg, NULL, &wide, &out) != 0 && strstr(dc_error(), "square"), "16x20: %s", dc_error());
    dc_kv_set(&ov, "layers_per_block", "3");
    CHECK(dc_model_configure(cfg, &ov, NULL, &out) != 0 && strstr(dc_error(), "'layers_per_block'"),
          "unknown override: %s", dc_error());
    dc_kv_free(&ov);
    dc_kv_set(&ov, "out_channels", "0");
    CHECK(dc_model_configure(cfg, &ov, NULL, &out) != 0 && strstr(dc_error(), "out_channels"), "out_channels 0: %s",
          dc_error());
    dc_kv_free(&ov), dc_kv_free(&out);
}

// Random weights: N(0, 1/fan_in) matrices, 1 + N(0, 0.1) scales and N(0, 0.05)
// biases, so every layer's output is far from zero.
static void fill_random(dc_model *m, uint64_t seed) {
    const dc_params *ps = m->params;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        float *h = malloc(sizeof(float) * (size_t)p->numel);
        const int64_t fan = p->ndim >= 2 ? p->numel / p->shape[0] : 1;
        const bool bias = strstr(p->name, "bias") != NULL;
        for (int64_t j = 0; j < p->numel; j++) {
            float n = dc_randn_at(seed, (uint32_t)i, 0, DC_STREAM_INIT, (uint32_t)j);
            h[j] = p->ndim >= 2 ? n / sqrtf((float)fan) : bias ? 0.05f * n : 1.0f + 0.1f * n;
        }
        dc_param_to_stored(p, h);
        m->be->upload(m->be, dc_param_data(ps, i).p, h, sizeof(float) * (size_t)p->numel);
        free(h);
    }
    dc_params_touch(m->params);
}

// out = m(x, t, text) for B = 2 random latents, timesteps and texts, on the host.
static int unet_run(dc_model *m, dc_backend *be, float *out) {
    enum { B = 2, L = 5, D = 64, N = B * 4 * 8 * 8 };
    float hx[N], ht[B] = {917.0f, 31.0f}, hc[B * L * D];
    for (int j = 0; j < N; j++) hx[j] = dc_randn_at(11, 1, 0, DC_STREAM_INIT, (uint32_t)j);
    for (int j = 0; j < B * L * D; j++) hc[j] = dc_randn_at(11, 2, 0, DC_STREAM_INIT, (uint32_t)j);
    dc_buf x = {be->alloc(be, sizeof hx), DC_F32}, t = {be->alloc(be, sizeof ht), DC_F32},
           ctx = {be->alloc(be, sizeof hc), DC_F32}, o = {be->alloc(be, sizeof hx), DC_F32};
    be->upload(be, x.p, hx, sizeof hx), be->upload(be, t.p, ht, sizeof ht), be->upload(be, ctx.p, hc, sizeof hc);
    const dc_cond cond = {.ctx = ctx, .len = L, .dim = D};
    int rc = dc_model_reserve(m, B) || dc_model_forward(m, o, x, t, &cond, B);
    if (!rc) be->download(be, out, o.p, sizeof hx), dc_backend_sync(be), rc = dc_backend_status(be);
    be->free(be, x.p), be->free(be, t.p), be->free(be, ctx.p), be->free(be, o.p);
    return rc;
}

static void test_unet_models(const dc_kv *cfg) {
    dc_backend *be = NULL;
    if (dc_backend_create("cpu", &be)) {
        CHECK(0, "backend: %s", dc_error());
        return;
    }
    dc_unet_config c;
    dc_params want = {0};
    dc_model *lay = NULL, *m = NULL, *direct = NULL;
    CHECK(dc_unet_config_from_kv(&c, cfg) == 0 && dc_unet_register(&c, &want) == 0, "register: %s", dc_error());
    CHECK(dc_model_create(cfg, NULL, false, &lay) == 0 && dc_model_create(cfg, be, false, &m) == 0 &&
              dc_unet_new(&c, be, DC_F32, 8, 8, &direct) == 0,
          "create: %s", dc_error());
    if (lay && m && direct) {
        const dc_params *a = lay->params;
        bool same = a->count == want.count && a->numel == want.numel && want.count > 100;
        for (int i = 0; same && i < a->count; i++) {
            const dc_param *p = &a->items[i], *q = &want.items[i];
            same = !strcmp(p->name, q->name) && p->ndim == q->ndim && p->numel == q->numel &&
                   !memcmp(p->shape, q->shape, sizeof(p->shape[0]) * (size_t)p->ndim);
        }
        CHECK(same, "the layout registers dc_unet_register's %d parameters (%d)", want.count, a->count);
        CHECK(lay->be == NULL && !a->data.p && !a->frozen.p && !a->grad.p && lay->params->be == NULL,
              "the layout allocates nothing");
        const dc_model_info *li = &lay->info;
        CHECK(li->channels == 4 && li->height == 8 && li->width == 8 && li->out_channels == 4 &&
                  li->cond == DC_COND_TEXT && li->ctx_dim == 64 && !memcmp(li, &m->info, sizeof *li),
              "the layout's info");
        for (int b = 1; b <= 3; b += 2) {
            int64_t bytes = dc_model_activation_bytes(lay, DC_F32, b, -1, false);
            CHECK(bytes > 0 && bytes == (int64_t)dc_unet_activation_bytes(m, b), "batch %d: %lld activation bytes",
                  b, (long long)bytes);
        }
        CHECK(dc_model_activation_bytes(lay, DC_F32, 0, -1, false) < 0, "batch 0 refused");
        CHECK(dc_model_macs_per_image(lay) == dc_model_macs_per_image(direct) && dc_model_macs_per_image(lay) > 0,
              "macs");
        char what[256];
        dc_model_describe(lay, what, sizeof what);
        CHECK(strstr(what, "UNet2DConditionModel channels 64 128, 2 layers per block, heads 1 2, latent 8x8x4") == what,
              "describe: %s", what);
        CHECK(dc_model_reserve(lay, 1) != 0 && strstr(dc_error(), "layout"), "a layout does not run: %s", dc_error());
        // the same weights in both: the same forward, bit for bit
        fill_random(m, 5), fill_random(direct, 5);
        enum { N = 2 * 4 * 8 * 8 };
        float *got = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N);
        CHECK(unet_run(m, be, got) == 0 && unet_run(direct, be, ref) == 0, "forward: %s", dc_error());
        bool finite = true, moved = false;
        for (int j = 0; j < N; j++) finite &= got[j] == got[j] && got[j] - got[j] == 0, moved |= got[j] != 0;
        CHECK(finite && moved && !memcmp(got, ref, sizeof(float) * N),
              "the registry's model computes the forward of dc_unet_new's");
        free(got), free(ref);
    }
    dc_model *trained = NULL;
    CHECK(dc_model_create(cfg, be, true, &trained) == 0 && trained && trained->params->grad.p,
          "a UNet for training has gradients: %s", dc_error());
    dc_model_free(trained);
    dc_model_free(lay), dc_model_free(m), dc_model_free(direct);
    dc_params_free(&want);
    dc_backend_destroy(be);
}

// The config as file metadata and back through the registry: the same entries
// (heads > 0 setting every block's head count).
static void test_unet_file(const dc_kv *cfg) {
    uint8_t *mem = NULL;
    size_t len = 0;
    dc_st_file f;
    dc_kv back = {0};
    if (dc_st_serialize(NULL, 0, (const char *const *)cfg->keys, (const char *const *)cfg->values, cfg->n, &mem,
                        &len) ||
        dc_st_parse(&f, mem, len, "unet.safetensors")) {
        CHECK(0, "write: %s", dc_error());
        free(mem);
        return;
    }
    CHECK(dc_model_config_of_file(&f, "", 0, &back) == 0 && same_entries(&back, cfg), "read back: %s", dc_error());
    const char *h;
    CHECK(dc_model_config_of_file(&f, "", 4, &back) == 0 && (h = dc_kv_get(&back, "num_attention_heads")) &&
              !strcmp(h, "[4, 4]"),
          "--heads 4: %s", dc_error());
    dc_st_close(&f);
    free(mem);
    dc_kv_free(&back);
}

static void test_unet(void) {
    if (tmpdir_make("registry")) {
        CHECK(0, "no scratch folder");
        return;
    }
    dc_kv cfg = {0};
    test_unet_config_json(&cfg);
    if (cfg.n) {
        test_unet_configure(&cfg);
        test_unet_models(&cfg);
        test_unet_file(&cfg);
    }
    dc_kv_free(&cfg);
    tmpdir_remove();
}

int main(void) {
    test_presets();
    test_configure();
    test_layout_and_files();
    test_optional_ops();
    test_unet();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
