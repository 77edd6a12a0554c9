// The DiT in the model registry: its presets (the official twelve and the
// demo model), configs from entries with overrides, from files, and its
// constructor.
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/dit.h"
#include "models/dit_io.h"

// The demo model: a small DiT for 28x28 Fashion-MNIST, sized to train in
// about ten minutes on two CPU cores.
static const dc_dit_config k_demo = {.input_size = 28, .patch = 4, .in_channels = 1, .hidden = 64, .depth = 6,
                                     .heads = 4, .mlp_hidden = 256, .num_classes = 10, .learn_sigma = true};

static int dit_preset(const char *name, dc_kv *cfg) {
    dc_dit_config c = k_demo;
    if (name && strncmp(name, "DiT-", 4) != 0) return 1;  // another architecture's
    if (name) DC_TRY(dc_dit_config_from_name(name, &c));
    return dc_dit_config_to_kv(&c, cfg);
}

static int dit_configure(const dc_kv *base, const dc_kv *ov, const dc_data_shape *data, dc_kv *out) {
    dc_dit_config c;
    DC_TRY(dc_dit_config_from_kv(base, &c));
    static const char *const known[] = {"input_size", "patch_size", "in_channels", "hidden_size", "depth",
                                        "num_heads",  "mlp_hidden", "num_classes", NULL};
    DC_TRY(dc_model_overrides_known(ov, "DiT", known));
    int v = 0, given;
    DC_TRY(dc_model_override_int(ov, "patch_size", &c.patch, &given));
    DC_TRY(dc_model_override_int(ov, "depth", &c.depth, &given));
    DC_TRY(dc_model_override_int(ov, "hidden_size", &v, &given));
    if (given) c.hidden = v, c.mlp_hidden = 4 * v, c.heads = dc_dit_heads_for_width(v);  // the official ratios
    DC_TRY(dc_model_override_int(ov, "mlp_hidden", &c.mlp_hidden, &given));
    DC_TRY(dc_model_override_int(ov, "num_heads", &c.heads, &given));
    // What the data gives: never the base's (a preset's 32x32x4 and 1000
    // classes are ImageNet's latents), the override's, else the data's.
    int *from_data[] = {&c.input_size, &c.in_channels, &c.num_classes};
    const char *data_keys[] = {"input_size", "in_channels", "num_classes"};
    for (int i = 0; i < 3; i++) {
        *from_data[i] = 0;
        DC_TRY(dc_model_override_int(ov, data_keys[i], from_data[i], &given));
    }
    if (data) {
        if (data->height != data->width || data->frames != 1)
            return dc_fail("images are %dx%d%s; DiT needs square images", data->height, data->width,
                           data->frames != 1 ? " clips" : "");
        if (!c.input_size) c.input_size = data->height;
        if (!c.in_channels) c.in_channels = data->channels;
        if (!c.num_classes) c.num_classes = data->num_classes;
    }
    // Checked as far as it is known: stand-ins that pass fill what the data will give.
    dc_dit_config now = c;
    if (!now.input_size) now.input_size = now.patch;
    if (!now.in_channels) now.in_channels = 1;
    if (!now.num_classes) now.num_classes = 1;
    if (!now.heads) now.heads = 1;
    DC_TRY(dc_dit_config_validate(&now));
    if (!c.heads) return dc_fail("--hidden %d is not in the official table; pass --heads", c.hidden);
    dc_kv_free(out);
    return dc_dit_config_to_kv(&c, out);
}

static int dit_config_of_file(const dc_st_file *f, const char *prefix, int heads, dc_kv *cfg) {
    dc_dit_config c;
    DC_TRY(dc_dit_config_from_file(f, prefix, heads, &c));
    return dc_dit_config_to_kv(&c, cfg);
}

static int dit_create(const dc_kv *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out) {
    dc_dit_config c;
    DC_TRY(dc_dit_config_from_kv(cfg, &c));
    return dc_dit_new(&c, be, grad, out);
}

const dc_model_arch dc_dit_arch = {
    .name = "DiT", .presets_help = "DiT-{S,B,L,XL}/{2,4,8}", .preset = dit_preset, .configure = dit_configure,
    .config_of_file = dit_config_of_file, .create = dit_create,
};
