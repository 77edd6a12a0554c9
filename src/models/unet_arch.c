// The SD UNet in the model registry: configs from entries with overrides,
// from files and from diffusers' unet/config.json, and its constructor. It
// has no named presets: its configs come from the files it reads.
#include <string.h>

#include "core/error.h"
#include "models/unet.h"

static int unet_preset(const char *name, dc_kv *cfg) {
    (void)name, (void)cfg;
    return 1;  // none of its own: another architecture's name
}

static int unet_configure(const dc_kv *base, const dc_kv *ov, const dc_data_shape *data, dc_kv *out) {
    dc_unet_config c;
    DC_TRY(dc_unet_config_from_kv(&c, base));
    static const char *const known[] = {"in_channels", "out_channels", "sample_size", "cross_attention_dim", NULL};
    DC_TRY(dc_model_overrides_known(ov, "UNet2DConditionModel", known));
    int in_given, side_given, given;
    DC_TRY(dc_model_override_int(ov, "in_channels", &c.in_channels, &in_given));
    DC_TRY(dc_model_override_int(ov, "out_channels", &c.out_channels, &given));
    DC_TRY(dc_model_override_int(ov, "sample_size", &c.sample_size, &side_given));
    DC_TRY(dc_model_override_int(ov, "cross_attention_dim", &c.ctx_dim, &given));
    // the data's latents give what was not set by hand
    if (data) {
        if (data->height != data->width || data->frames != 1)
            return dc_fail("latents are %dx%d%s; the UNet needs square latents", data->height, data->width,
                           data->frames != 1 ? " clips" : "");
        if (!in_given) c.in_channels = data->channels;
        if (!side_given) c.sample_size = data->height;
    }
    DC_TRY(dc_unet_config_validate(&c));
    dc_kv_free(out);
    return dc_unet_config_to_kv(&c, out);
}

static int unet_config_of_file(const dc_st_file *f, const char *prefix, int heads, dc_kv *cfg) {
    (void)prefix;  // the config is the file's metadata, whatever the tensors' prefix
    dc_unet_config c;
    DC_TRY(dc_unet_config_from_meta(&c, f));
    for (int i = 0; heads > 0 && i < c.nblocks; i++) c.heads[i] = heads;
    DC_TRY(dc_unet_config_validate(&c));
    return dc_unet_config_to_kv(&c, cfg);
}

static int unet_config_of_json(const dc_json *root, const char *path, dc_kv *cfg) {
    dc_unet_config c;
    DC_TRY(dc_unet_config_from_json(&c, root, path));
    return dc_unet_config_to_kv(&c, cfg);
}

static int unet_create(const dc_kv *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out) {
    *out = NULL;
    dc_unet_config c;
    DC_TRY(dc_unet_config_from_kv(&c, cfg));
    if (c.sample_size < 1)
        return dc_fail("a UNet config without its latent size (sample_size): give it, or data to take it from");
    if (grad) return dc_unet_new_train(&c, be, grad, c.sample_size, c.sample_size, out);
    return dc_unet_new(&c, be, DC_F32, c.sample_size, c.sample_size, out);
}

const dc_model_arch dc_unet_arch = {
    .name = "UNet2DConditionModel", .presets_help = NULL, .preset = unet_preset, .configure = unet_configure,
    .config_of_file = unet_config_of_file, .config_of_json = unet_config_of_json, .create = unet_create,
};
