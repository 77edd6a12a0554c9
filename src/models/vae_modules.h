// The VAE's layers as modules (private to vae.c and vae_blocks.c).
#pragma once
#include "models/vae.h"
#include "nn/modules.h"

// diffusers ResnetBlock2D without a time embedding:
// y = shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))), the shortcut a
// 1x1 conv when the channel count changes (conv_shortcut), else identity.
typedef struct {
    dc_group_norm norm1, norm2;
    dc_conv2d conv1, conv2, shortcut;
    bool has_shortcut;
} vae_resnet;

// diffusers Attention as the VAE uses it: one head of C channels over the
// H*W positions, y = x + to_out(attn(to_q(n), to_k(n), to_v(n))),
// n = group_norm(x) as tokens [B, HW, C].
typedef struct {
    dc_group_norm norm;
    dc_linear q, k, v, out;
} vae_attention;

// UNetMidBlock2D: resnets.0, attentions.0, resnets.1 (registered attentions first, as diffusers does).
typedef struct {
    vae_resnet res[2];
    vae_attention attn;
} vae_mid;

typedef struct {
    dc_conv2d conv_in;                                    // in -> ch[0]
    vae_resnet res[DC_VAE_MAX_BLOCKS][DC_VAE_MAX_LAYERS];  // down_blocks.i.resnets.j
    dc_conv2d down[DC_VAE_MAX_BLOCKS];                    // down_blocks.i.downsamplers.0.conv (i < n-1)
    vae_mid mid;
    dc_group_norm norm_out;                               // conv_norm_out
    dc_conv2d conv_out;                                   // ch[n-1] -> 2 latent
} vae_encoder;

typedef struct {
    dc_conv2d conv_in;                                        // latent -> ch[n-1]
    vae_mid mid;
    vae_resnet res[DC_VAE_MAX_BLOCKS][DC_VAE_MAX_LAYERS + 1];  // up_blocks.i.resnets.j
    dc_conv2d up[DC_VAE_MAX_BLOCKS];                          // up_blocks.i.upsamplers.0.conv (i < n-1)
    dc_group_norm norm_out;                                   // conv_norm_out
    dc_conv2d conv_out;                                       // ch[0] -> out
} vae_decoder;

struct dc_vae_modules {
    vae_encoder enc;
    vae_decoder dec;
    dc_conv2d quant_conv;       // 1x1, 2 latent -> 2 latent (encoder side)
    dc_conv2d post_quant_conv;  // 1x1, latent -> latent (decoder side)
};

