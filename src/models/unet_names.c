// The UNet's names in original single-file checkpoints (CompVis/Stability
// LDM layout, under "model.diffusion_model."), as diffusers'
// loaders/single_file_utils.py (convert_ldm_unet_checkpoint) maps them, with
// L = layers per block:
//   conv_in                          input_blocks.0.0
//   time_embedding.linear_1 / _2     time_embed.0 / .2
//   down_blocks.i.resnets.j          input_blocks.{(L+1) i + j + 1}.0
//   down_blocks.i.attentions.j       input_blocks.{(L+1) i + j + 1}.1
//   down_blocks.i.downsamplers.0.conv  input_blocks.{(L+1)(i+1)}.0.op
//   mid_block.resnets.0 / attentions.0 / resnets.1   middle_block.0 / .1 / .2
//   up_blocks.i.resnets.j            output_blocks.{(L+1) i + j}.0
//   up_blocks.i.attentions.j         output_blocks.{(L+1) i + j}.1
//   up_blocks.i.upsamplers.0.conv    output_blocks.{(L+1) i + L}.{1, or 2 after an attention}.conv
//   conv_norm_out / conv_out         out.0 / out.2
// Inside a resnet: norm1 in_layers.0, conv1 in_layers.2, time_emb_proj
// emb_layers.1, norm2 out_layers.0, conv2 out_layers.3, conv_shortcut
// skip_connection. Inside an attention the names are diffusers' own.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "models/unet.h"

static const char *const k_resnet[][2] = {
    {"norm1.", "in_layers.0."},   {"conv1.", "in_layers.2."},  {"time_emb_proj.", "emb_layers.1."},
    {"norm2.", "out_layers.0."},  {"conv2.", "out_layers.3."}, {"conv_shortcut.", "skip_connection."},
};

static int put(char *out, size_t n, const char *param, const char *fmt, ...) DC_PRINTF(4, 5);
static int put(char *out, size_t n, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= n) return dc_fail("UNet parameter %s: its original name is too long", param);
    return 0;
}

// "<base>.<resnet leaf in LDM names>"
static int resnet_name(char *out, size_t n, const char *param, const char *base, const char *rest) {
    for (size_t i = 0; i < sizeof k_resnet / sizeof k_resnet[0]; i++) {
        size_t l = strlen(k_resnet[i][0]);
        if (strncmp(rest, k_resnet[i][0], l) == 0) return put(out, n, param, "%s.%s%s", base, k_resnet[i][1], rest + l);
    }
    return dc_fail("UNet parameter %s: not a resnet tensor", param);
}

// Parses "<head>.<i>.<mid>.<j>.<rest>" (mid such as "resnets"); j may be absent
// when mid has no index ("downsamplers.0.conv" is given as mid with j = 0).
static bool split(const char *param, const char *head, const char *mid, int *i, int *j, const char **rest) {
    char fmt[96];
    int pos = -1;
    if (snprintf(fmt, sizeof fmt, "%s.%%d.%s.%%d.%%n", head, mid) >= (int)sizeof fmt) return false;
    if (sscanf(param, fmt, i, j, &pos) != 2 || pos < 0) return false;
    *rest = param + pos;
    return *i >= 0 && *j >= 0;
}

int dc_unet_original_name(const dc_unet_config *c, const char *param, char *out, size_t n) {
    const int L1 = c->layers + 1;
    static const char *const k_plain[][2] = {
        {"conv_in.", "input_blocks.0.0."},         {"time_embedding.linear_1.", "time_embed.0."},
        {"time_embedding.linear_2.", "time_embed.2."}, {"conv_norm_out.", "out.0."},
        {"conv_out.", "out.2."},
    };
    for (size_t k = 0; k < sizeof k_plain / sizeof k_plain[0]; k++) {
        size_t l = strlen(k_plain[k][0]);
        if (strncmp(param, k_plain[k][0], l) == 0) return put(out, n, param, "%s%s", k_plain[k][1], param + l);
    }
    int i, j;
    const char *rest;
    char base[64];
    if (split(param, "down_blocks", "resnets", &i, &j, &rest)) {
        snprintf(base, sizeof base, "input_blocks.%d.0", L1 * i + j + 1);
        return resnet_name(out, n, param, base, rest);
    }
    if (split(param, "down_blocks", "attentions", &i, &j, &rest))
        return put(out, n, param, "input_blocks.%d.1.%s", L1 * i + j + 1, rest);
    if (split(param, "down_blocks", "downsamplers", &i, &j, &rest) && j == 0 && strncmp(rest, "conv.", 5) == 0)
        return put(out, n, param, "input_blocks.%d.0.op.%s", L1 * (i + 1), rest + 5);
    int pos = -1;
    if (sscanf(param, "mid_block.resnets.%d.%n", &j, &pos) == 1 && pos > 0 && (j == 0 || j == 1)) {
        rest = param + pos;
        snprintf(base, sizeof base, "middle_block.%d", 2 * j);
        return resnet_name(out, n, param, base, rest);
    }
    if (strncmp(param, "mid_block.attentions.0.", 23) == 0)
        return put(out, n, param, "middle_block.1.%s", param + 23);
    if (split(param, "up_blocks", "resnets", &i, &j, &rest)) {
        snprintf(base, sizeof base, "output_blocks.%d.0", L1 * i + j);
        return resnet_name(out, n, param, base, rest);
    }
    if (split(param, "up_blocks", "attentions", &i, &j, &rest))
        return put(out, n, param, "output_blocks.%d.1.%s", L1 * i + j, rest);
    if (split(param, "up_blocks", "upsamplers", &i, &j, &rest) && j == 0 && strncmp(rest, "conv.", 5) == 0) {
        // after the block's last resnet (.0) and its attention (.1) when it has one
        const int d = c->nblocks - 1 - i;
        const bool attn = d >= 0 && d < DC_UNET_MAX_BLOCKS && c->attn[d];
        return put(out, n, param, "output_blocks.%d.%d.conv.%s", L1 * i + c->layers, attn ? 2 : 1, rest + 5);
    }
    return dc_fail("UNet parameter %s has no original single-file name", param);
}

int dc_unet_weight_map(void *ctx, const char *param, dc_weight_src *src) {
    memset(src, 0, sizeof *src);
    return dc_unet_original_name(ctx, param, src->name, sizeof src->name);
}
