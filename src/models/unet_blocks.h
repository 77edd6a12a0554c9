// The UNet's building blocks as modules (parameter handles registered under
// diffusers' names) and their forward passes: ResnetBlock2D, Transformer2DModel
// with one BasicTransformerBlock, and the down/mid/up blocks that hold them.
// Internal to the UNet (models/unet.c plans the memory these run in).
#pragma once
#include "models/unet.h"
#include "nn/modules.h"

#define UNET_MAX_RESNETS (2 * DC_UNET_MAX_BLOCKS * (DC_UNET_MAX_LAYERS + 1) + 2)

// ResnetBlock2D: out = conv_shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))
// + time_emb_proj(SiLU(temb))))), the shortcut a 1x1 conv when ci != co, else x.
typedef struct {
    dc_group_norm norm1, norm2;
    dc_conv2d conv1, conv2;
    dc_linear temb;       // time_emb_proj: [co, 4 ch0]
    dc_conv2d shortcut;   // conv_shortcut (w = -1 when ci == co)
    int ci, co;
    int unit;             // its parameter unit, counted from the UNet's first
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
    int unit;  // its parameter unit, counted from the UNet's first
} unet_transformer;

// A down, mid or up block: nres resnets, each followed by a transformer when
// has_attn, and the resampling conv (w = -1 when the block has none).
typedef struct {
    unet_resnet res[DC_UNET_MAX_LAYERS + 1];
    unet_transformer attn[DC_UNET_MAX_LAYERS + 1];
    int nres;
    bool has_attn;
    dc_conv2d sample;  // downsamplers.0.conv (stride 2) or upsamplers.0.conv
    int sample_unit;   // its parameter unit
} unet_block;

struct dc_unet_modules {
    dc_conv2d conv_in;
    dc_linear time1, time2;  // time_embedding.linear_1, linear_2
    unet_block down[DC_UNET_MAX_BLOCKS], up[DC_UNET_MAX_BLOCKS], mid;
    dc_group_norm norm_out;  // conv_norm_out
    dc_conv2d conv_out;
    int out_unit;            // the output layers' parameter unit (conv_in's is 0)
};

// Registers every module of config c in diffusers' state-dict order.
// Parameter units (nn/params.h), counted from the UNet's first: conv_in with
// the time embedding, then each transformer, resnet and resampling conv on
// its own (diffusers' order keeps a layer's transformer and resnet apart),
// then the output layers. Units this small keep the buffers that offload and
// ZeRO-2 size by the widest unit small: SD 1.5's widest block holds 258M
// parameters, its widest module 49M.
int unet_modules_add(dc_params *ps, dc_unet_modules *md, const dc_unet_config *c);

// y = conv c of x[B, H, W, ci] (with its bias).
void unet_conv_fwd(dc_backend *be, const dc_params *ps, const dc_conv2d *c, dc_buf y, dc_buf x, int B, int H, int W);
// dst[B, HW, C] (compute dtype) = x[B, C, HW] (F32 or the compute dtype:
// a sampler's state), cast through tmp [B C HW] where it must be.
void unet_to_nhwc(dc_backend *be, dc_buf dst, dc_buf x, dc_buf tmp, int B, int C, int64_t HW);
// out[B, C, HW] (F32 or the compute dtype) = y[B, HW, C], through tmp the same way.
void unet_from_nhwc(dc_backend *be, dc_buf out, dc_buf y, dc_buf tmp, int B, int C, int64_t HW);

// The resnets in the order the forward runs them (down, mid, up): n of them.
int unet_resnet_list(const dc_unet_modules *md, int N, const unet_resnet **r);

// The time embedding's buffers ([B, 4 ch0] unless said).
typedef struct {
    dc_buf tfreq;      // [B, ch0] sinusoidal features
    dc_buf th, ta;     // linear_1's output, its SiLU
    dc_buf temb;       // linear_2's output
    dc_buf silu_temb;  // SiLU(temb): every resnet's time_emb_proj reads it
    dc_buf tproj;      // [B, sum of co] every resnet's time_emb_proj output, in forward order
} unet_time_acts;

// The time embedding of t[B] and every resnet's projection of it: tp[i]
// [B, co] (views into a->tproj) for the i-th resnet the forward runs.
void unet_time_fwd(dc_backend *be, const dc_params *ps, const dc_unet_modules *md, const dc_unet_config *c,
                   const unet_time_acts *a, dc_buf t, int B, dc_buf *tp);

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

// Where a resnet's intermediate maps go: scratch in inference (a1 and a2
// one buffer, h1 and sc another, the statistics shared), or buffers that a
// training forward keeps for backward. Maps [B, HW, ci or co], statistics
// [B, groups] F32.
typedef struct {
    dc_buf a1;              // SiLU(norm1(x)): conv1's input
    dc_buf h1;              // conv1(a1) + bias + time projection: norm2's input
    dc_buf a2;              // SiLU(norm2(h1)): conv2's input
    dc_buf sc;              // conv_shortcut(x) (not read by backward)
    dc_buf mean1, rstd1, mean2, rstd2;
    // Training keeps neither a1 nor a2 (one scratch buffer, the backward's
    // a): the backward computes each again from what it kept, h1 and the
    // statistics, just before it reads it. The same bits, as torch.compile
    // rebuilds pointwise results rather than keep them.
    bool lean;
} unet_resnet_acts;

// A transformer's intermediates, the same way: in inference the stream
// x0..x3 is one buffer added to in place, the norms' outputs one buffer, the
// statistics shared, and the feed-forward runs as unet_scratch allows (pre
// none); a training forward keeps each ([M, C] unless said, M = B HW).
typedef struct {
    dc_buf t0;                           // GroupNorm(h): proj_in's input
    dc_buf x0, x1, x2, x3;               // the token stream after proj_in, attn1, attn2, ff
    dc_buf n1, n2, n3;                   // norm1..3 of the stream
    dc_buf qkv;                          // [M, 3C] attn1's q | k | v
    dc_buf att1, q2, att2;               // attention outputs, attn2's queries
    dc_buf kv;                           // [B len, 2C] attn2's k | v of the text (none: prepared)
    dc_buf pre, act;                     // [M, 8C] ff.net.0.proj's output, [M, 4C] its GEGLU
    dc_buf gn_mean, gn_rstd;             // [B, groups] F32
    dc_buf ln_mean[3], ln_rstd[3];       // [M] F32
    dc_buf lse1, lse2;                   // [B, heads, HW] F32
    // Training keeps none of t0, n1..n3 and act: t0, n1 and n3 are the
    // backward's dT2, n2 its dqkv and act its dpre, and the backward computes
    // each again (the norm from its input and statistics, the GEGLU from
    // pre) just before it reads it.
    bool lean;
} unet_transformer_acts;

// The acts of a resnet and a transformer in inference: views of the scratch.
unet_resnet_acts unet_resnet_scratch(const unet_scratch *s);
unet_transformer_acts unet_transformer_scratch(const unet_scratch *s);

// out[B, H, W, co] = resnet(x[B, H, W, ci]) (channels-last maps); tproj
// [B, co] is its time_emb_proj of SiLU(the time embedding), computed ahead.
void unet_resnet_fwd(dc_backend *be, const dc_params *ps, const unet_resnet *r, dc_buf out, dc_buf x,
                     dc_buf tproj, int B, int H, int W, const unet_resnet_acts *k);
// out[B, H, W, C] = h + transformer(h, ctx[B, len, ctx_dim]); out may be h
// (in place). k->kv none: its keys and values of ctx are in kv [B len, 2C]
// (prepared), else none and it computes them into s's scratch. Bs, the
// rows the layers before the cross-attention run on: B, or B / 2 where h's
// two halves are the same on entry (only the first is read; that part's
// result is copied to the second: see dc_cond's pairs).
void unet_transformer_fwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf out, dc_buf h,
                          int B, int Bs, int H, int W, dc_buf ctx, int len, dc_buf kv,
                          const unet_transformer_acts *k, const unet_scratch *s);
// The text's keys and values for t's cross-attention, kv [rows, 2C] (rows =
// B len) from ctx [rows, ctx_dim]: k | v in each row, or, where an adapter
// adds a delta to k2 or v2, k's [rows, C] block and then v's.
void unet_text_kv_fwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf kv, dc_buf ctx,
                      int rows);
// b's first n elements copied over its next n (a batch's first half to its second).
void unet_copy_half(dc_backend *be, dc_buf b, int64_t n);

// Scratch of the backward passes, in the compute dtype: d1, d2 [B, HW,
// max(ci, co)] for a resnet, dt [B, ci, HW] (an up resnet's concat);
// dS, dT, dT2 [M, C], dqkv [M, 3C], dpre [M, 8C], dact [M, 4C], dkv [B len,
// 2C], dctx [B len, ctx_dim] (one transformer's share of the text's gradient)
// for a transformer; dtproj [B, co]; a [B, HW, max(ci, co)], a lean
// resnet's a1 or a2.
typedef struct {
    dc_buf d1, d2, dtproj, a;
    dc_buf dS, dT, dT2, dqkv, dpre, dact, dkv, dctx;
} unet_grad_scratch;

// Backward of unet_resnet_fwd from dout = dL/dout (read only): dx = dL/dx
// (+= if accumulate), the parameters' gradients +=, and dsilu_temb [B, 4
// ch0] += the time projection's share (its input silu_temb).
void unet_resnet_bwd(dc_backend *be, const dc_params *ps, const unet_resnet *r, dc_buf dx, dc_buf dout, dc_buf x,
                     const unet_resnet_acts *k, dc_buf silu_temb, dc_buf dsilu_temb, int B, int H, int W,
                     bool accumulate, const unet_grad_scratch *g);
// Backward of unet_transformer_fwd (training: out not h, Bs = B, kv
// computed): dh holds dL/dout on entry and dL/dh on return; dctx (F32
// [B, len, ctx_dim], or none) += the text's gradient.
void unet_transformer_bwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf dh, dc_buf h,
                          int B, int H, int W, dc_buf ctx, int len, dc_buf dctx, const unet_transformer_acts *k,
                          const unet_grad_scratch *g);
