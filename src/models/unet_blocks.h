// The UNet's building blocks as modules (parameter handles registered under
// diffusers' names) and their forward passes: ResnetBlock2D, Transformer2DModel
// with one BasicTransformerBlock, and the down/mid/up blocks that hold them.
// Internal to the UNet (models/unet.c plans the memory these run in).
#pragma once
#include "models/unet.h"
#include "nn/modules.h"

// ResnetBlock2D: out = conv_shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))
// + time_emb_proj(SiLU(temb))))), the shortcut a 1x1 conv when ci != co, else x.
typedef struct {
    dc_group_norm norm1, norm2;
    dc_conv2d conv1, conv2;
    dc_linear temb;       // time_emb_proj: [co, 4 ch0]
    dc_conv2d shortcut;   // conv_shortcut (w = -1 when ci == co)
    int ci, co;
} unet_resnet;

// Transformer2DModel with one BasicTransformerBlock over C channels:
// h += proj_out(block(proj_in(tokens(GroupNorm(h))))), where block is
// x += attn1(LN1 x); x += attn2(LN2 x, ctx); x += ff(LN3 x), ff = Linear(4C -> C)
// of GEGLU(Linear(C -> 8C)). proj_in/out are 1x1 convs in SD 1.x (weights
// [C, C, 1, 1]) and Linear layers in SD 2.x: the same product on tokens.
typedef struct {
    dc_group_norm norm;   // 32 groups, eps 1e-6
    dc_linear proj_in, proj_out;
    dc_layer_norm norm1, norm2, norm3;  // eps 1e-5
    dc_linear q1, k1, v1, o1;           // attn1: self-attention (no bias but to_out.0)
    dc_linear q2, k2, v2, o2;           // attn2: k, v read the text [len, ctx_dim]
    dc_linear qkv1, kv2;                // [q1 | k1 | v1] and [k2 | v2]: their weights lie side by
                                        // side in the parameters, so each set runs as one product
    dc_linear ff1, ff2;                 // ff.net.0.proj [8C, C], ff.net.2 [C, 4C]
    int C, heads;
} unet_transformer;

// A down, mid or up block: nres resnets, each followed by a transformer when
// has_attn, and the resampling conv (w = -1 when the block has none).
typedef struct {
    unet_resnet res[DC_UNET_MAX_LAYERS + 1];
    unet_transformer attn[DC_UNET_MAX_LAYERS + 1];
    int nres;
    bool has_attn;
    dc_conv2d sample;  // downsamplers.0.conv (stride 2) or upsamplers.0.conv
} unet_block;

struct dc_unet_modules {
    dc_conv2d conv_in;
    dc_linear time1, time2;  // time_embedding.linear_1, linear_2
    unet_block down[DC_UNET_MAX_BLOCKS], up[DC_UNET_MAX_BLOCKS], mid;
    dc_group_norm norm_out;  // conv_norm_out
    dc_conv2d conv_out;
};

// Registers every module of config c in diffusers' state-dict order.
int unet_modules_add(dc_params *ps, dc_unet_modules *md, const dc_unet_config *c);

// Scratch the blocks run in, planned by the model (sizes per batch of B).
// The resnet view (cat, r0, r1) and the transformer view (tok[], ff1, ff2)
// overlap: a block uses one of them at a time.
typedef struct {
    dc_buf silu_temb;        // [B, 4 ch0] SiLU(time embedding), every resnet's time projection's input
    dc_buf tproj;            // [B, sum of co] every resnet's time_emb_proj output, in forward order
    dc_buf gn_mean, gn_rstd; // [B, groups] F32
    dc_buf cat;              // [B, ci, HW] an up resnet's input [h | skip]
    dc_buf r0, r1;           // [B, max(ci, co), HW] (r0 also a 2x upsampled image)
    dc_buf tok[6];           // [B, max(HW, len), C] token-sized slabs; tok[3..5] and ff1 are one
                             // region (hid_cap elements), where self-attention's packed
                             // [B, HW, 3C] q | k | v goes, or a one-pass feed-forward's [B HW, 4C]
    dc_buf ln_mean, ln_rstd; // [B HW] F32
    dc_buf lse;              // [B, heads, HW] F32
    dc_buf ff1, ff2;         // [ff_rows, 8C], [ff_rows, 4C]: the feed-forward in row chunks
    int64_t ff_cap;          // elements of ff1
    int64_t hid_cap;         // elements of the region from tok[3]
} unet_scratch;

// out[B, H, W, co] = resnet(x[B, H, W, ci]) (channels-last maps); tproj
// [B, co] is its time_emb_proj of SiLU(the time embedding), computed ahead.
void unet_resnet_fwd(dc_backend *be, const dc_params *ps, const unet_resnet *r, dc_buf out, dc_buf x,
                     dc_buf tproj, int B, int H, int W, const unet_scratch *s);
// h[B, H, W, C] += transformer(h, ctx[B, len, ctx_dim]), in place; kv
// [B len, 2C] its keys and values of ctx where prepared, else none. Bs, the
// rows the layers before the cross-attention run on: B, or B / 2 where h's
// two halves are the same on entry (only the first is read; that part's
// result is copied to the second: see dc_cond's pairs).
void unet_transformer_fwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf h, int B,
                          int Bs, int H, int W, dc_buf ctx, int len, dc_buf kv, const unet_scratch *s);
// b's first n elements copied over its next n (a batch's first half to its second).
void unet_copy_half(dc_backend *be, dc_buf b, int64_t n);
