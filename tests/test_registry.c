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
// - a model without activation checkpointing refuses --recompute by name.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "models/model_io.h"
#include "models/registry.h"
#include "nn/params_io.h"

#include "check.h"

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
    CHECK(dc_model_activation_bytes(&m, DC_F32, 4, -1) < 0 && strstr(dc_error(), "Plain"), "activation bytes: %s",
          dc_error());
    char what[32];
    dc_model_describe(&m, what, sizeof what);
    CHECK(!strcmp(what, "Plain"), "describe: %s", what);
}

int main(void) {
    test_presets();
    test_configure();
    test_layout_and_files();
    test_optional_ops();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
