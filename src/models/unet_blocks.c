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
// Closes the unit of the module just registered into *unit, counted from
// unit u0 (every module registers parameters, so the unit is never empty).
static int end_unit(dc_params *ps, int u0, int *unit) {
    DC_TRY(dc_params_end_unit(ps));
    *unit = ps->units - 1 - u0;
    return 0;
}

static int block_add(dc_params *ps, unet_block *b, const char *name, const int *rin, int rout, int nres,
                     int nattn, int heads, int sample_stride, const dc_unet_config *c, int u0) {
    char k[NAME_MAX_];
    b->nres = nres, b->has_attn = nattn > 0;
    b->sample = (dc_conv2d){-1, -1, rout, rout, 3, 1, 1, true};
    b->sample_unit = -1;
    for (int j = 0; j < nattn; j++) {
        DC_TRY(transformer_add(ps, &b->attn[j], KEY(k, "%s.attentions.%d", name, j), rout, heads, c));
        DC_TRY(end_unit(ps, u0, &b->attn[j].unit));
    }
    for (int j = 0; j < nres; j++) {
        DC_TRY(resnet_add(ps, &b->res[j], KEY(k, "%s.resnets.%d", name, j), rin[j], rout, dc_unet_time_dim(c), c));
        DC_TRY(end_unit(ps, u0, &b->res[j].unit));
    }
    if (sample_stride == 2)
        DC_TRY(dc_conv2d_add_nhwc(ps, &b->sample, KEY(k, "%s.downsamplers.0.conv", name), rout, rout, 3, 2, 1));
    if (sample_stride == 1)
        DC_TRY(dc_conv2d_add_nhwc(ps, &b->sample, KEY(k, "%s.upsamplers.0.conv", name), rout, rout, 3, 1, 1));
    if (sample_stride == 1 || sample_stride == 2) DC_TRY(end_unit(ps, u0, &b->sample_unit));
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
    const int u0 = ps->units;
    if (dc_conv2d_add_nhwc(ps, &md->conv_in, "conv_in", c->in_channels, c->ch[0], 3, 1, 1) ||
        dc_linear_add(ps, &md->time1, "time_embedding.linear_1", c->ch[0], dc_unet_time_dim(c)) ||
        dc_linear_add(ps, &md->time2, "time_embedding.linear_2", dc_unet_time_dim(c), dc_unet_time_dim(c)) ||
        dc_params_end_unit(ps))
        return -1;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < L; j++) rin[j] = j ? c->ch[i] : c->ch[i ? i - 1 : 0];
        DC_TRY(block_add(ps, &md->down[i], KEY(k, "down_blocks.%d", i), rin, c->ch[i], L, c->attn[i] ? L : 0, c->heads[i],
                         i < N - 1 ? 2 : 0, c, u0));
    }
    for (int i = 0; i < N; i++) {
        const int d = N - 1 - i;  // the down block this one mirrors
        const int out = c->ch[d], prev = c->ch[i ? d + 1 : d], below = c->ch[d ? d - 1 : 0];
        for (int j = 0; j <= L; j++) rin[j] = (j ? out : prev) + (j == L ? below : out);
        DC_TRY(block_add(ps, &md->up[i], KEY(k, "up_blocks.%d", i), rin, out, L + 1, c->attn[d] ? L + 1 : 0, c->heads[d],
                         i < N - 1 ? 1 : 0, c, u0));
    }
    const int top = c->ch[N - 1];
    rin[0] = rin[1] = top;
    // UNetMidBlock2DCrossAttn: resnet, attention, resnet (heads of the last down block)
    DC_TRY(block_add(ps, &md->mid, "mid_block", rin, top, 2, 1, c->heads[N - 1], 0, c, u0));
    if (dc_group_norm_add(ps, &md->norm_out, "conv_norm_out", c->ch[0], c->groups, c->eps) ||
        dc_conv2d_add_nhwc(ps, &md->conv_out, "conv_out", c->ch[0], c->out_channels, 3, 1, 1))
        return -1;
    return end_unit(ps, u0, &md->out_unit);
}

void unet_conv_fwd(dc_backend *be, const dc_params *ps, const dc_conv2d *c, dc_buf y, dc_buf x, int B, int H, int W) {
    const dc_conv2d_shape s = dc_conv2d_shape_of(c, B, H, W);
    dc_conv2d_fwd(be, ps, c, y, x, &s);
}

void unet_to_nhwc(dc_backend *be, dc_buf dst, dc_buf x, dc_buf tmp, int B, int C, int64_t HW) {
    if (x.dt != be->compute) be->cast(be, tmp, x, B * C * HW), x = tmp;
    be->transpose(be, dst, x, B, C, HW);  // [B, C, HW] -> [B, HW, C]
}

void unet_from_nhwc(dc_backend *be, dc_buf out, dc_buf y, dc_buf tmp, int B, int C, int64_t HW) {
    if (out.dt == be->compute) {
        be->transpose(be, out, y, B, HW, C);  // [B, HW, C] -> [B, C, HW]
        return;
    }
    be->transpose(be, tmp, y, B, HW, C);
    be->cast(be, out, tmp, B * C * HW);
}

int unet_resnet_list(const dc_unet_modules *md, int N, const unet_resnet **r) {
    int n = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < md->down[i].nres; j++) r[n++] = &md->down[i].res[j];
    r[n++] = &md->mid.res[0], r[n++] = &md->mid.res[1];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < md->up[i].nres; j++) r[n++] = &md->up[i].res[j];
    return n;
}

// [cos | sin] of t (flip_sin_to_cos, freq_shift 0), Linear-SiLU-Linear, then
// every resnet's projection of its SiLU at once (few rows, many small weights).
void unet_time_fwd(dc_backend *be, const dc_params *ps, const dc_unet_modules *md, const dc_unet_config *c,
                   const unet_time_acts *a, dc_buf t, int B, dc_buf *tp) {
    const int td = dc_unet_time_dim(c);
    be->timestep_embed(be, a->tfreq, t, B, c->ch[0] / 2);
    dc_linear_fwd(be, ps, &md->time1, a->th, a->tfreq, B);
    be->silu_fwd(be, a->ta, a->th, (int64_t)B * td);
    dc_linear_fwd(be, ps, &md->time2, a->temb, a->ta, B);
    be->silu_fwd(be, a->silu_temb, a->temb, (int64_t)B * td);
    const unet_resnet *rl[UNET_MAX_RESNETS];
    dc_linear_job jobs[UNET_MAX_RESNETS];
    const int nr = unet_resnet_list(md, c->nblocks, rl);
    int64_t off = 0;
    bool many = true;  // as one op, unless an adapter adds a delta to one of them
    for (int i = 0; i < nr; off += (int64_t)B * rl[i]->co, i++)
        tp[i] = dc_buf_at(a->tproj, off), many = many && !dc_adapted(ps, rl[i]->temb.w);
    for (int i = 0; i < nr && many; i++) jobs[i] = dc_linear_job_of(ps, &rl[i]->temb, tp[i]);
    if (many) be->linear_many_fwd(be, jobs, nr, a->silu_temb, B, td);
    for (int i = 0; i < nr && !many; i++) dc_linear_fwd(be, ps, &rl[i]->temb, tp[i], a->silu_temb, B);
}

unet_resnet_acts unet_resnet_scratch(const unet_scratch *s) {
    unet_resnet_acts k = {s->r0, s->r1, s->r0, s->r1, s->gn_mean, s->gn_rstd, s->gn_mean, s->gn_rstd, false};
    return k;
}

unet_transformer_acts unet_transformer_scratch(const unet_scratch *s) {
    const dc_buf *tok = s->tok;
    unet_transformer_acts k;
    memset(&k, 0, sizeof k);
    k.t0 = k.n1 = k.n2 = k.n3 = tok[0];
    k.x0 = k.x1 = k.x2 = k.x3 = tok[2];
    k.qkv = tok[3], k.att1 = k.q2 = tok[1], k.att2 = tok[5], k.kv = tok[3];
    k.gn_mean = s->gn_mean, k.gn_rstd = s->gn_rstd;
    for (int i = 0; i < 3; i++) k.ln_mean[i] = s->ln_mean, k.ln_rstd[i] = s->ln_rstd;
    k.lse1 = k.lse2 = s->lse;
    return k;
}

void unet_resnet_fwd(dc_backend *be, const dc_params *ps, const unet_resnet *r, dc_buf out, dc_buf x,
                     dc_buf tproj, int B, int H, int W, const unet_resnet_acts *k) {
    const int64_t HW = (int64_t)H * W;
    const dc_conv2d_shape s3 = dc_conv2d_shape_of(&r->conv1, B, H, W);
    const dc_conv2d_shape s3b = dc_conv2d_shape_of(&r->conv2, B, H, W);
    // The convolutions' biases join the adds that follow them (the time
    // embedding, the residual): one pass over the map fewer each.
    const dc_buf none = dc_buf_none();
    dc_group_norm_nhwc_fwd(be, ps, &r->norm1, k->a1, k->mean1, k->rstd1, x, B, HW, true);
    dc_conv2d_fwd_nobias(be, ps, &r->conv1, k->h1, k->a1, &s3);           // h1 [B, HW, co]
    be->add_nhwc(be, k->h1, none, tproj, dc_conv2d_bias(ps, &r->conv1), B, r->co, HW);
    dc_group_norm_nhwc_fwd(be, ps, &r->norm2, k->a2, k->mean2, k->rstd2, k->h1, B, HW, true);
    dc_conv2d_fwd_nobias(be, ps, &r->conv2, out, k->a2, &s3b);
    dc_buf skip = x;
    if (r->shortcut.w >= 0) {
        const dc_conv2d_shape s1 = dc_conv2d_shape_of(&r->shortcut, B, H, W);
        dc_conv2d_fwd(be, ps, &r->shortcut, k->sc, x, &s1);
        skip = k->sc;
    }
    be->add_nhwc(be, out, skip, none, dc_conv2d_bias(ps, &r->conv2), B, r->co, HW);
}

// Multi-head attention of q [B, Tq, C] over k, v [B, Tk, C] (heads side by
// side in each row; rows of qrow and kvrow elements, so packed projections
// are read in place), its output [B, Tq, C].
static dc_attn_shape attn_shape(int B, int Tq, int Tk, int qrow, int kvrow, int C, int heads) {
    dc_attn_shape a;
    memset(&a, 0, sizeof a);
    a.B = B, a.H = heads, a.Tq = Tq, a.Tk = Tk, a.Dh = a.Dv = C / heads;
    a.q = dc_attn_rows(Tq, qrow, a.Dh);
    a.k = a.v = dc_attn_rows(Tk, kvrow, a.Dh);
    a.out = dc_attn_rows(Tq, C, a.Dh);
    return a;
}

// The projections that run as one product over adjacent weights (q1 | k1 |
// v1 into rows of 3C, k2 | v2 into rows of 2C) run apart where an adapter
// adds a delta to any of them, since it sees each weight alone: their
// outputs are then consecutive [M, C] blocks of the same buffer. A packed
// projection's n parts as the attention reads them: where each starts, and
// the elements from one row to the next.
typedef struct {
    int64_t at[3];
    int row;
} packed;

static bool apart(const dc_params *ps, const dc_linear *part, int n) {
    for (int i = 0; i < n; i++)
        if (dc_adapted(ps, part[i].w)) return true;
    return false;
}

static packed packed_of(const dc_params *ps, const dc_linear *part, int n, int64_t M, int C) {
    const bool a = apart(ps, part, n);
    packed p = {{0, 0, 0}, a ? C : n * C};
    for (int i = 0; i < n; i++) p.at[i] = a ? i * M * C : (int64_t)i * C;
    return p;
}

// y = the n parts' products of x [M, in] (fused: the one product over their weights).
static void packed_fwd(dc_backend *be, const dc_params *ps, const dc_linear *fused, const dc_linear *part, int n,
                       dc_buf y, dc_buf x, int M) {
    if (!apart(ps, part, n)) {
        dc_linear_fwd(be, ps, fused, y, x, M);
        return;
    }
    for (int i = 0; i < n; i++) dc_linear_fwd(be, ps, &part[i], dc_buf_at(y, (int64_t)i * M * part[i].out), x, M);
}

// Its backward: dx = dL/dx (skipped if none), the weights' gradients +=.
static void packed_bwd(dc_backend *be, const dc_params *ps, const dc_linear *fused, const dc_linear *part, int n,
                       dc_buf dx, dc_buf dy, dc_buf x, int M) {
    if (!apart(ps, part, n)) {
        dc_linear_bwd(be, ps, fused, dx, dy, x, M, false);
        return;
    }
    for (int i = 0; i < n; i++)
        dc_linear_bwd(be, ps, &part[i], dx, dc_buf_at(dy, (int64_t)i * M * part[i].out), x, M, i > 0);
}

void unet_text_kv_fwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf kv, dc_buf ctx,
                      int rows) {
    packed_fwd(be, ps, &t->kv2, &t->k2, 2, kv, ctx, rows);
}

void unet_copy_half(dc_backend *be, dc_buf b, int64_t n) {
    const size_t bytes = (size_t)n * dc_dtype_size(b.dt);
    be->copy(be, (char *)b.p + bytes, b.p, bytes);
}

// dst = src where they differ (training keeps each step of the stream).
static void copy_map(dc_backend *be, dc_buf dst, dc_buf src, int64_t n) {
    if (dst.p != src.p) be->copy(be, dst.p, src.p, (size_t)n * dc_dtype_size(dst.dt));
}

void unet_transformer_fwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf out, dc_buf h,
                          int B, int Bs, int H, int W, dc_buf ctx, int len, dc_buf kv,
                          const unet_transformer_acts *k, const unet_scratch *s) {
    const int C = t->C, T = H * W, M = B * T, Ms = Bs * T;
    // up to the cross-attention, on Bs rows (B, or the first of two like halves)
    dc_group_norm_nhwc_fwd(be, ps, &t->norm, k->t0, k->gn_mean, k->gn_rstd, h, Bs, T, false);
    dc_linear_fwd(be, ps, &t->proj_in, k->x0, k->t0, Ms);

    // self-attention: q | k | v from one product as [M, 3C]
    dc_layer_norm_fwd(be, ps, &t->norm1, k->n1, k->ln_mean[0], k->ln_rstd[0], k->x0, Ms);
    packed_fwd(be, ps, &t->qkv1, &t->q1, 3, k->qkv, k->n1, Ms);
    const packed pq = packed_of(ps, &t->q1, 3, Ms, C);
    dc_attn_shape a = attn_shape(Bs, T, T, pq.row, pq.row, C, t->heads);
    be->attention_fwd(be, k->att1, k->lse1, k->qkv, dc_buf_at(k->qkv, pq.at[1]), dc_buf_at(k->qkv, pq.at[2]), &a);
    copy_map(be, k->x1, k->x0, (int64_t)M * C);
    dc_linear_fwd_acc(be, ps, &t->o1, k->x1, k->att1, Ms);  // x += to_out(attention)
    if (Bs < B) {  // the halves part at the text: both get the tokens and the residual
        unet_copy_half(be, k->x1, (int64_t)Ms * C);
        unet_copy_half(be, h, (int64_t)Ms * C);
    }

    // cross-attention: keys and values from the text, k | v from one product
    // [B len, 2C] (or prepared in kv)
    dc_layer_norm_fwd(be, ps, &t->norm2, k->n2, k->ln_mean[1], k->ln_rstd[1], k->x1, M);
    dc_linear_fwd(be, ps, &t->q2, k->q2, k->n2, M);
    if (!kv.p) unet_text_kv_fwd(be, ps, t, k->kv, ctx, B * len), kv = k->kv;
    const packed pkv = packed_of(ps, &t->k2, 2, (int64_t)B * len, C);
    a = attn_shape(B, T, len, C, pkv.row, C, t->heads);
    be->attention_fwd(be, k->att2, k->lse2, k->q2, kv, dc_buf_at(kv, pkv.at[1]), &a);
    copy_map(be, k->x2, k->x1, (int64_t)M * C);
    dc_linear_fwd_acc(be, ps, &t->o2, k->x2, k->att2, M);

    // GEGLU feed-forward. Training keeps the product and its gate; inference
    // runs in one pass where the backend gates in the product's epilogue (the
    // 4C-wide gated layer in the free tok[3] region), else in chunks of rows
    // (each row is independent) so its 8C-wide hidden layer needs only
    // ff_cap elements of scratch
    dc_layer_norm_fwd(be, ps, &t->norm3, k->n3, k->ln_mean[2], k->ln_rstd[2], k->x2, M);
    copy_map(be, k->x3, k->x2, (int64_t)M * C);
    if (k->pre.p) {
        dc_linear_fwd(be, ps, &t->ff1, k->pre, k->n3, M);
        be->geglu_fwd(be, k->act, k->pre, M, 4 * C);
        dc_linear_fwd_acc(be, ps, &t->ff2, k->x3, k->act, M);
    } else {
        const dc_buf *tok = s->tok;
        const bool one = (int64_t)M * 4 * C <= s->hid_cap &&
                         dc_linear_geglu_fwd(be, ps, &t->ff1, tok[3], dc_buf_none(), k->n3, M);
        if (one) dc_linear_fwd_acc(be, ps, &t->ff2, k->x3, tok[3], M);  // x += ff.net.2(gated)
        int rows = (int)(s->ff_cap / (8 * C));
        if (rows > M) rows = M;
        for (int r0 = 0; !one && r0 < M; r0 += rows) {
            const int m = M - r0 < rows ? M - r0 : rows;
            dc_linear_geglu_fwd(be, ps, &t->ff1, s->ff2, s->ff1, dc_buf_at(k->n3, (int64_t)r0 * C), m);  // [m, 4C]
            dc_linear_fwd_acc(be, ps, &t->ff2, dc_buf_at(k->x3, (int64_t)r0 * C), s->ff2, m);  // rows r0.. of x +=
        }
    }

    copy_map(be, out, h, (int64_t)M * C);
    dc_linear_fwd_acc(be, ps, &t->proj_out, out, k->x3, M);  // out = h + proj_out(x)
}

// ---- backward ------------------------------------------------------------------------

void unet_resnet_bwd(dc_backend *be, const dc_params *ps, const unet_resnet *r, dc_buf dx, dc_buf dout, dc_buf x,
                     const unet_resnet_acts *k, dc_buf silu_temb, dc_buf dsilu_temb, int B, int H, int W,
                     bool accumulate, const unet_grad_scratch *g) {
    const int64_t HW = (int64_t)H * W;
    const dc_conv2d_shape s3 = dc_conv2d_shape_of(&r->conv1, B, H, W);
    const dc_conv2d_shape s3b = dc_conv2d_shape_of(&r->conv2, B, H, W);
    // the residual: out = shortcut(x) + conv2(a2) + its bias
    if (r->shortcut.w >= 0) {
        const dc_conv2d_shape s1 = dc_conv2d_shape_of(&r->shortcut, B, H, W);
        dc_conv2d_bwd(be, ps, &r->shortcut, dx, dout, x, &s1, accumulate);
    } else if (accumulate) {
        be->axpy(be, dx, dout, 1.0f, (int64_t)B * HW * r->co);
    } else {
        copy_map(be, dx, dout, (int64_t)B * HW * r->co);
    }
    if (k->lean) dc_group_norm_nhwc_apply(be, ps, &r->norm2, k->a2, k->mean2, k->rstd2, k->h1, B, HW, true);
    dc_conv2d_bwd(be, ps, &r->conv2, g->d1, dout, k->a2, &s3b, false);  // d1 = dL/da2
    dc_group_norm_nhwc_bwd(be, ps, &r->norm2, g->d2, g->d1, k->h1, k->mean2, k->rstd2, B, HW, true,
                           false);  // d2 = dL/dh1
    // h1 = conv1(a1) + its bias + the time projection (broadcast over pixels)
    be->channel_sum_nhwc(be, g->dtproj, g->d2, B, r->co, HW);
    dc_linear_bwd(be, ps, &r->temb, dsilu_temb, g->dtproj, silu_temb, B, true);
    if (k->lean) dc_group_norm_nhwc_apply(be, ps, &r->norm1, k->a1, k->mean1, k->rstd1, x, B, HW, true);
    dc_conv2d_bwd(be, ps, &r->conv1, g->d1, g->d2, k->a1, &s3, false);  // d1 = dL/da1
    dc_group_norm_nhwc_bwd(be, ps, &r->norm1, dx, g->d1, x, k->mean1, k->rstd1, B, HW, true, true);
}

void unet_transformer_bwd(dc_backend *be, const dc_params *ps, const unet_transformer *t, dc_buf dh, dc_buf h,
                          int B, int H, int W, dc_buf ctx, int len, dc_buf dctx, const unet_transformer_acts *k,
                          const unet_grad_scratch *g) {
    const int C = t->C, T = H * W, M = B * T;
    // out = h + proj_out(x3): dS = dL/dx3, then the stream's gradient going back
    dc_linear_bwd(be, ps, &t->proj_out, g->dS, dh, k->x3, M, false);
    // x3 = x2 + ff2(GEGLU(ff1(norm3(x2)))). Lean, act is rebuilt: by the
    // GEGLU's backward, in dact's place as it reads it, between ff2's input
    // gradient and its weights' (where an adapter does not need ff2's input
    // for the delta's); then n3.
    if (k->lean && !dc_adapted(ps, t->ff2.w)) {
        const dc_buf w2 = dc_weight_plain(ps, t->ff2.w), none = dc_buf_none();
        be->linear_bwd(be, g->dact, none, none, g->dS, k->pre, w2, M, t->ff2.in, t->ff2.out, false);
        be->geglu_bwd(be, g->dpre, g->dact, g->dact, k->pre, M, 4 * C);
        const int flags = dc_linear_bwd_flags(ps, &t->ff2, M, false);
        be->linear_bwd(be, none, dc_param_train_grad(ps, t->ff2.w),
                       t->ff2.b >= 0 ? dc_param_train_grad(ps, t->ff2.b) : none, g->dS, g->dact, w2, M, t->ff2.in,
                       t->ff2.out, flags);
    } else {
        if (k->lean) be->geglu_fwd(be, k->act, k->pre, M, 4 * C);
        dc_linear_bwd(be, ps, &t->ff2, g->dact, g->dS, k->act, M, false);
        be->geglu_bwd(be, g->dpre, dc_buf_none(), g->dact, k->pre, M, 4 * C);
    }
    if (k->lean) dc_layer_norm_fwd(be, ps, &t->norm3, k->n3, k->ln_mean[2], k->ln_rstd[2], k->x2, M);
    dc_linear_bwd(be, ps, &t->ff1, g->dT, g->dpre, k->n3, M, false);
    dc_layer_norm_bwd(be, ps, &t->norm3, g->dS, g->dT, k->x2, k->ln_mean[2], k->ln_rstd[2], M, true);
    // x2 = x1 + o2(attention(q2(norm2(x1)), kv2(ctx)))
    dc_linear_bwd(be, ps, &t->o2, g->dT, g->dS, k->att2, M, false);
    const packed pkv = packed_of(ps, &t->k2, 2, (int64_t)B * len, C);
    dc_attn_shape a = attn_shape(B, T, len, C, pkv.row, C, t->heads);
    be->attention_bwd(be, g->dT2, g->dkv, dc_buf_at(g->dkv, pkv.at[1]), g->dT, k->q2, k->kv,
                      dc_buf_at(k->kv, pkv.at[1]), k->att2, k->lse2, &a);
    packed_bwd(be, ps, &t->kv2, &t->k2, 2, dctx.p ? g->dctx : dc_buf_none(), g->dkv, ctx, B * len);
    if (dctx.p) be->axpy(be, dctx, g->dctx, 1.0f, (int64_t)B * len * t->kv2.in);
    if (k->lean) dc_layer_norm_fwd(be, ps, &t->norm2, k->n2, k->ln_mean[1], k->ln_rstd[1], k->x1, M);
    dc_linear_bwd(be, ps, &t->q2, g->dT, g->dT2, k->n2, M, false);
    dc_layer_norm_bwd(be, ps, &t->norm2, g->dS, g->dT, k->x1, k->ln_mean[1], k->ln_rstd[1], M, true);
    // x1 = x0 + o1(attention of qkv1(norm1(x0)))
    dc_linear_bwd(be, ps, &t->o1, g->dT, g->dS, k->att1, M, false);
    const packed pq = packed_of(ps, &t->q1, 3, M, C);
    a = attn_shape(B, T, T, pq.row, pq.row, C, t->heads);
    be->attention_bwd(be, g->dqkv, dc_buf_at(g->dqkv, pq.at[1]), dc_buf_at(g->dqkv, pq.at[2]), g->dT, k->qkv,
                      dc_buf_at(k->qkv, pq.at[1]), dc_buf_at(k->qkv, pq.at[2]), k->att1, k->lse1, &a);
    if (k->lean) dc_layer_norm_fwd(be, ps, &t->norm1, k->n1, k->ln_mean[0], k->ln_rstd[0], k->x0, M);
    packed_bwd(be, ps, &t->qkv1, &t->q1, 3, g->dT, g->dqkv, k->n1, M);
    dc_layer_norm_bwd(be, ps, &t->norm1, g->dS, g->dT, k->x0, k->ln_mean[0], k->ln_rstd[0], M, true);
    // x0 = proj_in(GroupNorm(h)); dh += its share
    if (k->lean) dc_group_norm_nhwc_apply(be, ps, &t->norm, k->t0, k->gn_mean, k->gn_rstd, h, B, T, false);
    dc_linear_bwd(be, ps, &t->proj_in, g->dT, g->dS, k->t0, M, false);
    dc_group_norm_nhwc_bwd(be, ps, &t->norm, dh, g->dT, h, k->gn_mean, k->gn_rstd, B, T, false, true);
}
