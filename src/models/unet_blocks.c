// The UNet's blocks: registration under diffusers' names (unet_2d_blocks.py,
// resnet.py, transformer_2d.py, attention.py) and forward passes as backend
// ops. Maps are channels-last, [B, H, W, C] = [B, HW, C]: the convolutions
// read them as they are (weights stored [co, k, k, ci]), and a map is already
// the transformer's tokens. B images, HW = H W pixels, T = HW tokens.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "models/unet_blocks.h"

#define NAME_MAX_ 160

// A module name formatted into buf. Names here are far shorter than buf; one
// that were cut would still be longer than the parameter table takes, which
// refuses it.
static const char *key_fmt(char *buf, size_t n, const char *fmt, ...) DC_PRINTF(3, 4);
static const char *key_fmt(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}
#define KEY(buf, ...) key_fmt(buf, sizeof buf, __VA_ARGS__)

static int resnet_add(dc_params *ps, unet_resnet *r, const char *name, int ci, int co, int tdim,
                      const dc_unet_config *c) {
    char k[NAME_MAX_];
    r->ci = ci, r->co = co;
    r->shortcut = (dc_conv2d){-1, -1, ci, co, 1, 1, 0, true};
    if (dc_group_norm_add(ps, &r->norm1, KEY(k, "%s.norm1", name), ci, c->groups, c->eps) ||
        dc_conv2d_add_nhwc(ps, &r->conv1, KEY(k, "%s.conv1", name), ci, co, 3, 1, 1) ||
        dc_linear_add(ps, &r->temb, KEY(k, "%s.time_emb_proj", name), tdim, co) ||
        dc_group_norm_add(ps, &r->norm2, KEY(k, "%s.norm2", name), co, c->groups, c->eps) ||
        dc_conv2d_add_nhwc(ps, &r->conv2, KEY(k, "%s.conv2", name), co, co, 3, 1, 1))
        return -1;
    if (ci != co && dc_conv2d_add_nhwc(ps, &r->shortcut, KEY(k, "%s.conv_shortcut", name), ci, co, 1, 1, 0)) return -1;
    return 0;
}

// proj_in / proj_out: a Linear [C, C] in SD 2.x, a 1x1 conv [C, C, 1, 1] in
// SD 1.x; both are the same product on tokens, so both run as a dc_linear.
static int proj_add(dc_params *ps, dc_linear *l, const char *name, int C, bool linear) {
    return linear ? dc_linear_add(ps, l, name, C, C) : dc_linear_add_patch_conv(ps, l, name, C, 1, C);
}

static int transformer_add(dc_params *ps, unet_transformer *t, const char *name, int C, int heads,
                           const dc_unet_config *c) {
    char k[NAME_MAX_];
    const int ctx = c->ctx_dim;
    t->C = C, t->heads = heads;
#define TB(leaf) KEY(k, "%s.transformer_blocks.0." leaf, name)
    if (dc_group_norm_add(ps, &t->norm, KEY(k, "%s.norm", name), C, c->groups, 1e-6f) ||
        proj_add(ps, &t->proj_in, KEY(k, "%s.proj_in", name), C, c->linear_proj) ||
        dc_layer_norm_add(ps, &t->norm1, TB("norm1"), C, 1e-5f) ||
        dc_linear_add_nobias(ps, &t->q1, TB("attn1.to_q"), C, C) ||
        dc_linear_add_nobias(ps, &t->k1, TB("attn1.to_k"), C, C) ||
        dc_linear_add_nobias(ps, &t->v1, TB("attn1.to_v"), C, C) ||
        dc_linear_add(ps, &t->o1, TB("attn1.to_out.0"), C, C) ||
        dc_layer_norm_add(ps, &t->norm2, TB("norm2"), C, 1e-5f) ||
        dc_linear_add_nobias(ps, &t->q2, TB("attn2.to_q"), C, C) ||
        dc_linear_add_nobias(ps, &t->k2, TB("attn2.to_k"), ctx, C) ||
        dc_linear_add_nobias(ps, &t->v2, TB("attn2.to_v"), ctx, C) ||
        dc_linear_add(ps, &t->o2, TB("attn2.to_out.0"), C, C) ||
        dc_layer_norm_add(ps, &t->norm3, TB("norm3"), C, 1e-5f) ||
        dc_linear_add(ps, &t->ff1, TB("ff.net.0.proj"), C, 8 * C) ||
        dc_linear_add(ps, &t->ff2, TB("ff.net.2"), 4 * C, C) ||
        proj_add(ps, &t->proj_out, KEY(k, "%s.proj_out", name), C, c->linear_proj))
        return -1;
#undef TB
    // registered one after the other without biases, so the weights of q1, k1,
    // v1 (and of k2, v2) are adjacent rows of one matrix
    const dc_param *it = ps->items;
    if (it[t->k1.w].offset != it[t->q1.w].offset + (int64_t)C * C ||
        it[t->v1.w].offset != it[t->k1.w].offset + (int64_t)C * C ||
        it[t->v2.w].offset != it[t->k2.w].offset + (int64_t)C * ctx)
        return dc_fail("%s: the attention projections are not adjacent in the parameters", name);
    t->qkv1 = (dc_linear){t->q1.w, -1, C, 3 * C};
    t->kv2 = (dc_linear){t->k2.w, -1, ctx, 2 * C};
    return 0;
}

// A block's modules in diffusers' order: attentions, resnets, resampler.
// rin[j], rout: resnet j's channels; nattn transformers (0, nres, or 1 in the
// mid block); sample_stride 2 (down), 1 (up), 0 (none).
static int block_add(dc_params *ps, unet_block *b, const char *name, const int *rin, int rout, int nres,
                     int nattn, int heads, int sample_stride, const dc_unet_config *c) {
    char k[NAME_MAX_];
    b->nres = nres, b->has_attn = nattn > 0;
    b->sample = (dc_conv2d){-1, -1, rout, rout, 3, 1, 1, true};
    for (int j = 0; j < nattn; j++)
        DC_TRY(transformer_add(ps, &b->attn[j], KEY(k, "%s.attentions.%d", name, j), rout, heads, c));
    for (int j = 0; j < nres; j++)
        DC_TRY(resnet_add(ps, &b->res[j], KEY(k, "%s.resnets.%d", name, j), rin[j], rout, dc_unet_time_dim(c), c));
    if (sample_stride == 2)
        DC_TRY(dc_conv2d_add_nhwc(ps, &b->sample, KEY(k, "%s.downsamplers.0.conv", name), rout, rout, 3, 2, 1));
    if (sample_stride == 1)
        DC_TRY(dc_conv2d_add_nhwc(ps, &b->sample, KEY(k, "%s.upsamplers.0.conv", name), rout, rout, 3, 1, 1));
    return 0;
}

// Channels as UNet2DConditionModel.__init__ sets them: down block i goes
// ch[i-1] -> ch[i]; up block i (reversed channels rc) has L+1 resnets, the
// first reading the previous up block's rc[i-1] (rc[0] for i = 0), the last
// the skip of the down block below, rc[min(i+1, N-1)] channels.
int unet_modules_add(dc_params *ps, dc_unet_modules *md, const dc_unet_config *c) {
    char k[NAME_MAX_];
    const int N = c->nblocks, L = c->layers;
    int rin[DC_UNET_MAX_LAYERS + 1];
    if (dc_conv2d_add_nhwc(ps, &md->conv_in, "conv_in", c->in_channels, c->ch[0], 3, 1, 1) ||
        dc_linear_add(ps, &md->time1, "time_embedding.linear_1", c->ch[0], dc_unet_time_dim(c)) ||
        dc_linear_add(ps, &md->time2, "time_embedding.linear_2", dc_unet_time_dim(c), dc_unet_time_dim(c)))
        return -1;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < L; j++) rin[j] = j ? c->ch[i] : c->ch[i ? i - 1 : 0];
        DC_TRY(block_add(ps, &md->down[i], KEY(k, "down_blocks.%d", i), rin, c->ch[i], L, c->attn[i] ? L : 0, c->heads[i],
                         i < N - 1 ? 2 : 0, c));
    }
    for (int i = 0; i < N; i++) {
        const int d = N - 1 - i;  // the down block this one mirrors
        const int out = c->ch[d], prev = c->ch[i ? d + 1 : d], below = c->ch[d ? d - 1 : 0];
        for (int j = 0; j <= L; j++) rin[j] = (j ? out : prev) + (j == L ? below : out);
        DC_TRY(block_add(ps, &md->up[i], KEY(k, "up_blocks.%d", i), rin, out, L + 1, c->attn[d] ? L + 1 : 0, c->heads[d],
                         i < N - 1 ? 1 : 0, c));
    }
    const int top = c->ch[N - 1];
    rin[0] = rin[1] = top;
    // UNetMidBlock2DCrossAttn: resnet, attention, resnet (heads of the last down block)
    DC_TRY(block_add(ps, &md->mid, "mid_block", rin, top, 2, 1, c->heads[N - 1], 0, c));
    if (dc_group_norm_add(ps, &md->norm_out, "conv_norm_out", c->ch[0], c->groups, c->eps) ||
        dc_conv2d_add_nhwc(ps, &md->conv_out, "conv_out", c->ch[0], c->out_channels, 3, 1, 1))
        return -1;
    return 0;
}

void unet_resnet_fwd(dc_backend *be, const dc_params *ps, const unet_resnet *r, dc_buf out, dc_buf x,
                     dc_buf tproj, int B, int H, int W, const unet_scratch *s) {
    const int64_t HW = (int64_t)H * W;
    const dc_conv2d_shape s3 = dc_conv2d_shape_of(&r->conv1, B, H, W);
    const dc_conv2d_shape s3b = dc_conv2d_shape_of(&r->conv2, B, H, W);
    // The convolutions' biases join the adds that follow them (the time
    // embedding, the residual): one pass over the map fewer each.
    const dc_buf none = dc_buf_none();
    dc_group_norm_nhwc_fwd(be, ps, &r->norm1, s->r0, s->gn_mean, s->gn_rstd, x, B, HW, true);
    dc_conv2d_fwd_nobias(be, ps, &r->conv1, s->r1, s->r0, &s3);           // r1 [B, HW, co]
    be->add_nhwc(be, s->r1, none, tproj, dc_conv2d_bias(ps, &r->conv1), B, r->co, HW);
    dc_group_norm_nhwc_fwd(be, ps, &r->norm2, s->r0, s->gn_mean, s->gn_rstd, s->r1, B, HW, true);
    dc_conv2d_fwd_nobias(be, ps, &r->conv2, out, s->r0, &s3b);
    dc_buf skip = x;
    if (r->shortcut.w >= 0) {
        const dc_conv2d_shape s1 = dc_conv2d_shape_of(&r->shortcut, B, H, W);
        dc_conv2d_fwd(be, ps, &r->shortcut, s->r1, x, &s1);
        skip = s->r1;
    }
    be->add_nhwc(be, out, skip, none, dc_conv2d_bias(ps, &r->conv2), B, r->co, HW);
}

// Multi-head attention of q [B, Tq, C] over k, v [B, Tk, C] (heads side by
// side in each row; rows of qrow and kvrow elements, so packed projections
// are read in place) into out [B, Tq, C].
static void attend(dc_backend *be, dc_buf out, dc_buf lse, dc_buf q, dc_buf k, dc_buf v, int B, int Tq, int Tk,
                   int qrow, int kvrow, int C, int heads) {
    dc_attn_shape a;
    memset(&a, 0, sizeof a);
    a.B = B, a.H = heads, a.Tq = Tq, a.Tk = Tk, a.Dh = a.Dv = C / heads;
    a.q = dc_attn_rows(Tq, qrow, a.Dh);
    a.k = a.v = dc_attn_rows(Tk, kvrow, a.Dh);
    a.out = dc_attn_rows(Tq, C, a.Dh);
    be->attention_fwd(be, out, lse, q, k, v, &a);
}

void unet_copy_half(dc_backend *be, dc_buf b, int64_t n) {
    const size_t bytes = (size_t)n * dc_dtype_size(b.dt);
    be->copy(be, (char *)b.p + bytes, b.p, bytes);
}

void unet_transformer_fwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf h, int B,
                          int Bs, int H, int W, dc_buf ctx, int len, dc_buf kv, const unet_scratch *s) {
    const int C = t->C, T = H * W, M = B * T, Ms = Bs * T;
    const dc_buf *tok = s->tok;
    dc_buf x = tok[2];  // [B, T, C] the token stream
    // up to the cross-attention, on Bs rows (B, or the first of two like halves)
    dc_group_norm_nhwc_fwd(be, ps, &t->norm, tok[0], s->gn_mean, s->gn_rstd, h, Bs, T, false);
    dc_linear_fwd(be, ps, &t->proj_in, x, tok[0], Ms);

    // self-attention: q | k | v from one product into tok[3..5] as [M, 3C]
    dc_layer_norm_fwd(be, ps, &t->norm1, tok[0], s->ln_mean, s->ln_rstd, x, Ms);
    dc_linear_fwd(be, ps, &t->qkv1, tok[3], tok[0], Ms);
    attend(be, tok[1], s->lse, tok[3], dc_buf_at(tok[3], C), dc_buf_at(tok[3], 2 * C), Bs, T, T, 3 * C, 3 * C, C,
           t->heads);
    dc_linear_fwd_acc(be, ps, &t->o1, x, tok[1], Ms);  // x += to_out(attention)
    if (Bs < B) {  // the halves part at the text: both get the tokens and the residual
        unet_copy_half(be, x, (int64_t)Ms * C);
        unet_copy_half(be, h, (int64_t)Ms * C);
    }

    // cross-attention: keys and values from the text, k | v from one product
    // [B len, 2C] (or prepared in kv)
    dc_layer_norm_fwd(be, ps, &t->norm2, tok[0], s->ln_mean, s->ln_rstd, x, M);
    dc_linear_fwd(be, ps, &t->q2, tok[1], tok[0], M);
    if (!kv.p) dc_linear_fwd(be, ps, &t->kv2, tok[3], ctx, B * len), kv = tok[3];
    attend(be, tok[5], s->lse, tok[1], kv, dc_buf_at(kv, C), B, T, len, C, 2 * C, C, t->heads);
    dc_linear_fwd_acc(be, ps, &t->o2, x, tok[5], M);

    // GEGLU feed-forward: in one pass where the backend gates in the
    // product's epilogue (the 4C-wide gated layer in the free tok[3] region);
    // else in chunks of rows (each row is independent) so its 8C-wide
    // hidden layer needs only ff_cap elements of scratch
    dc_layer_norm_fwd(be, ps, &t->norm3, tok[0], s->ln_mean, s->ln_rstd, x, M);
    const bool one = (int64_t)M * 4 * C <= s->hid_cap &&
                     dc_linear_geglu_fwd(be, ps, &t->ff1, tok[3], dc_buf_none(), tok[0], M);
    if (one) dc_linear_fwd_acc(be, ps, &t->ff2, x, tok[3], M);  // x += ff.net.2(gated)
    int rows = (int)(s->ff_cap / (8 * C));
    if (rows > M) rows = M;
    for (int r0 = 0; !one && r0 < M; r0 += rows) {
        const int m = M - r0 < rows ? M - r0 : rows;
        dc_linear_geglu_fwd(be, ps, &t->ff1, s->ff2, s->ff1, dc_buf_at(tok[0], (int64_t)r0 * C), m);  // [m, 4C]
        dc_linear_fwd_acc(be, ps, &t->ff2, dc_buf_at(x, (int64_t)r0 * C), s->ff2, m);  // rows r0.. of x +=
    }

    dc_linear_fwd_acc(be, ps, &t->proj_out, h, x, M);  // h += proj_out(x)
}
