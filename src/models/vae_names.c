// The VAE's tensors under the original (CompVis / Stability single-file)
// names, from diffusers' names, as diffusers' convert_ldm_vae_checkpoint maps
// them the other way:
//   X.down_blocks.i.resnets.j.*          <- X.down.i.block.j.*  (conv_shortcut <- nin_shortcut)
//   X.down_blocks.i.downsamplers.0.conv  <- X.down.i.downsample.conv
//   X.up_blocks.i.resnets.j.*            <- X.up.(n-1-i).block.j.*  (the original counts from level 0)
//   X.up_blocks.i.upsamplers.0.conv      <- X.up.(n-1-i).upsample.conv
//   X.mid_block.resnets.j                <- X.mid.block_(j+1)
//   X.mid_block.attentions.0.{group_norm, to_q, to_k, to_v, to_out.0}
//                                        <- X.mid.attn_1.{norm, q, k, v, proj_out}
//   X.conv_norm_out                      <- X.norm_out
// The attention projections are 1x1 convolutions [C, C, 1, 1] there, linear
// layers [C, C] here: the loader ignores the size-1 dimensions.
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "models/vae.h"

// A resnet's leaf ("conv1.weight", "conv_shortcut.bias", ...) in the original naming.
static const char *resnet_leaf(const char *leaf, char *buf, size_t n) {
    if (strncmp(leaf, "conv_shortcut.", 14)) return leaf;
    snprintf(buf, n, "nin_shortcut.%s", leaf + 14);
    return buf;
}

static int set(dc_weight_src *src, const char *param, int len) {
    if (len < 0 || len >= (int)sizeof src->name) return dc_fail("VAE parameter name '%s' is too long", param);
    return 0;
}

int dc_vae_original_name(const dc_vae_config *c, const char *param, dc_weight_src *src) {
    memset(src, 0, sizeof *src);
    char *o = src->name, leafbuf[96];
    size_t cap = sizeof src->name;
    if (!strncmp(param, "quant_conv.", 11) || !strncmp(param, "post_quant_conv.", 16))
        return set(src, param, snprintf(o, cap, "%s", param));
    const char *side = !strncmp(param, "encoder.", 8) ? "encoder" : !strncmp(param, "decoder.", 8) ? "decoder" : NULL;
    if (!side) return dc_fail("'%s' is not a VAE parameter", param);
    const char *r = param + 8;  // after "encoder." / "decoder."
    int i = 0, j = 0, at = 0;
    if (sscanf(r, "down_blocks.%d.resnets.%d.%n", &i, &j, &at) == 2 && at)
        return set(src, param, snprintf(o, cap, "%s.down.%d.block.%d.%s", side, i, j,
                                        resnet_leaf(r + at, leafbuf, sizeof leafbuf)));
    if (at = 0, sscanf(r, "down_blocks.%d.downsamplers.0.%n", &i, &at) == 1 && at)
        return set(src, param, snprintf(o, cap, "%s.down.%d.downsample.%s", side, i, r + at));
    if (at = 0, sscanf(r, "up_blocks.%d.resnets.%d.%n", &i, &j, &at) == 2 && at)
        return set(src, param, snprintf(o, cap, "%s.up.%d.block.%d.%s", side, c->nblocks - 1 - i, j,
                                        resnet_leaf(r + at, leafbuf, sizeof leafbuf)));
    if (at = 0, sscanf(r, "up_blocks.%d.upsamplers.0.%n", &i, &at) == 1 && at)
        return set(src, param, snprintf(o, cap, "%s.up.%d.upsample.%s", side, c->nblocks - 1 - i, r + at));
    if (at = 0, sscanf(r, "mid_block.resnets.%d.%n", &j, &at) == 1 && at)
        return set(src, param, snprintf(o, cap, "%s.mid.block_%d.%s", side, j + 1,
                                        resnet_leaf(r + at, leafbuf, sizeof leafbuf)));
    static const char *const attn_new[] = {"group_norm.", "to_q.", "to_k.", "to_v.", "to_out.0."};
    static const char *const attn_old[] = {"norm.", "q.", "k.", "v.", "proj_out."};
    const char *attn = "mid_block.attentions.0.";
    if (!strncmp(r, attn, strlen(attn))) {
        const char *a = r + strlen(attn);
        for (int k = 0; k < 5; k++)
            if (!strncmp(a, attn_new[k], strlen(attn_new[k])))
                return set(src, param, snprintf(o, cap, "%s.mid.attn_1.%s%s", side, attn_old[k],
                                                a + strlen(attn_new[k])));
        return dc_fail("'%s' is not a VAE parameter", param);
    }
    if (!strncmp(r, "conv_norm_out.", 14))
        return set(src, param, snprintf(o, cap, "%s.norm_out.%s", side, r + 14));
    if (!strncmp(r, "conv_in.", 8) || !strncmp(r, "conv_out.", 9))
        return set(src, param, snprintf(o, cap, "%s", param));
    return dc_fail("'%s' is not a VAE parameter", param);
}
