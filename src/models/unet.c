// The UNet as a dc_model: creation, the inference activation plan and
// forward, and the model interface. The blocks themselves are in
// unet_blocks.c; training's forward and backward in unet_train.c.
//
// Memory. Forward allocates nothing: reserve plans one arena of
//   time embedding and statistics (small),
//   skips:   every down-path output, kept until its up block consumes it,
//   p0, p1:  the mid and up path's hidden state, ping-ponged,
//   scratch: what one block needs while it runs, sized by the largest block;
//            a resnet's view (concat, two temporaries) and a transformer's
//            (six token slabs and the feed-forward's row chunks) overlap,
//            since a block uses one at a time.
// Maps are channels-last (unet_blocks.c); the caller's x and out are
// [B, C, H, W] as PyTorch's, transposed at the two ends.
// For SD 1.5 at 64x64 latents the scratch is ~11.8M values per image either
// way (an up resnet's 960-channel concat, or the level-0 transformer), the
// skips 6.6M, p0 and p1 2.6M each.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "models/unet_train.h"
#include "nn/arena.h"

#define MAX_SKIPS (1 + DC_UNET_MAX_BLOCKS * (DC_UNET_MAX_LAYERS + 1))
#define MAX_CONVS 256
#define MAX_ATTNS (2 * DC_UNET_MAX_BLOCKS * (DC_UNET_MAX_LAYERS + 1) + 1)

// Every convolution and transformer of one forward at the model's latent
// size, with the largest buffers each part of the arena must hold, in values
// per image. One walk of the topology serves reserve, macs and the arena.
typedef struct {
    struct { const dc_conv2d *c; int H, W; } conv[MAX_CONVS];
    struct { const unet_transformer *t; int H, W; } attn[MAX_ATTNS];
    int nconv, nattn, nskip;
    int64_t skip[MAX_SKIPS];
    int64_t R, cat, S, P;      // resnet temporaries, concat, token slab, stream
    int64_t HW, lse, cmax;     // tokens, heads x tokens, channels (largest of each)
    int64_t tsum;              // the resnets' time projections: channels of all
    int64_t kvsum;             // the transformers' text keys and values: 2C of all
} unet_plan;

struct dc_unet_acts {
    void *base;
    size_t bytes;
    dc_buf tfreq;                // [B, ch0] sinusoidal features
    dc_buf th, ta, temb;         // [B, 4 ch0] time MLP hidden, its SiLU, output
    unet_scratch s;
    dc_buf skip[MAX_SKIPS];      // down-path outputs
    int nskip;
    dc_buf p0, p1;               // mid/up hidden state
    dc_buf kv;                   // [B, len, 2C] a transformer, in forward order: the
                                 // text's keys and values (dc_unet_prepare_text)
};

static void max_to(int64_t *m, int64_t v) {
    if (v > *m) *m = v;
}

static void plan_conv(unet_plan *p, const dc_conv2d *c, int H, int W) {
    if (p->nconv < MAX_CONVS) p->conv[p->nconv].c = c, p->conv[p->nconv].H = H, p->conv[p->nconv++].W = W;
}

// The transformers in the order the forward runs them: n of them.
static int transformer_list(const dc_unet_modules *md, int N, const unet_transformer **t) {
    int n = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; md->down[i].has_attn && j < md->down[i].nres; j++) t[n++] = &md->down[i].attn[j];
    t[n++] = &md->mid.attn[0];
    for (int i = 0; i < N; i++)
        for (int j = 0; md->up[i].has_attn && j < md->up[i].nres; j++) t[n++] = &md->up[i].attn[j];
    return n;
}

static void plan_resnet(unet_plan *p, const unet_resnet *r, int H, int W, bool cat) {
    const int64_t HW = (int64_t)H * W;
    p->tsum += r->co;
    plan_conv(p, &r->conv1, H, W);
    plan_conv(p, &r->conv2, H, W);
    if (r->shortcut.w >= 0) plan_conv(p, &r->shortcut, H, W);
    max_to(&p->R, (r->ci > r->co ? r->ci : r->co) * HW);
    if (cat) max_to(&p->cat, r->ci * HW);
    max_to(&p->cmax, r->ci > r->co ? r->ci : r->co);
}

static void plan_attn(unet_plan *p, const unet_transformer *t, int H, int W) {
    const int64_t HW = (int64_t)H * W;
    if (p->nattn < MAX_ATTNS) p->attn[p->nattn].t = t, p->attn[p->nattn].H = H, p->attn[p->nattn++].W = W;
    max_to(&p->S, (HW > DC_UNET_CTX_LEN ? HW : DC_UNET_CTX_LEN) * t->C);
    max_to(&p->HW, HW);
    max_to(&p->lse, t->heads * HW);
    p->kvsum += 2 * t->C;
}

static void make_plan(const dc_unet *m, unet_plan *p) {
    const dc_unet_config *c = &m->cfg;
    const dc_unet_modules *md = m->mods;
    const int N = c->nblocks;
    memset(p, 0, sizeof *p);
    plan_conv(p, &md->conv_in, m->lh, m->lw);
    p->skip[p->nskip++] = (int64_t)c->ch[0] * m->lh * m->lw;
    for (int i = 0; i < N; i++) {
        const unet_block *b = &md->down[i];
        const int H = m->lh >> i, W = m->lw >> i;
        for (int j = 0; j < b->nres; j++) {
            plan_resnet(p, &b->res[j], H, W, false);
            if (b->has_attn) plan_attn(p, &b->attn[j], H, W);
            p->skip[p->nskip++] = (int64_t)b->res[j].co * H * W;
        }
        if (b->sample.w >= 0) {
            plan_conv(p, &b->sample, H, W);
            p->skip[p->nskip++] = (int64_t)b->sample.co * (H / 2) * (W / 2);
        }
    }
    const int Hm = m->lh >> (N - 1), Wm = m->lw >> (N - 1);
    plan_resnet(p, &md->mid.res[0], Hm, Wm, false);
    plan_attn(p, &md->mid.attn[0], Hm, Wm);
    plan_resnet(p, &md->mid.res[1], Hm, Wm, false);
    max_to(&p->P, (int64_t)md->mid.res[1].co * Hm * Wm);
    for (int i = 0; i < N; i++) {
        const unet_block *b = &md->up[i];
        const int H = m->lh >> (N - 1 - i), W = m->lw >> (N - 1 - i);
        for (int j = 0; j < b->nres; j++) {
            plan_resnet(p, &b->res[j], H, W, true);
            if (b->has_attn) plan_attn(p, &b->attn[j], H, W);
            max_to(&p->P, (int64_t)b->res[j].co * H * W);
        }
        if (b->sample.w >= 0) {  // nearest 2x into scratch r0, then the conv into the stream
            plan_conv(p, &b->sample, 2 * H, 2 * W);
            max_to(&p->R, (int64_t)b->sample.ci * 4 * H * W);
            max_to(&p->P, (int64_t)b->sample.co * 4 * H * W);
        }
    }
    max_to(&p->R, (int64_t)md->norm_out.C * m->lh * m->lw);
    plan_conv(p, &md->conv_out, m->lh, m->lw);
}

// ---- the arena (nn/arena.h) ------------------------------------------------------------

static void carve(const dc_unet *m, const unet_plan *p, dc_arena *ar, dc_unet_acts *a, int B) {
    const dc_unet_config *c = &m->cfg;
    const int64_t td = dc_unet_time_dim(c);
    unet_scratch *s = &a->s;
    a->tfreq = dc_arena_take(ar, (int64_t)B * c->ch[0]);
    a->th = dc_arena_take(ar, B * td), a->ta = dc_arena_take(ar, B * td), a->temb = dc_arena_take(ar, B * td);
    s->silu_temb = dc_arena_take(ar, B * td);
    s->tproj = dc_arena_take(ar, B * p->tsum);
    s->gn_mean = dc_arena_take_dt(ar, (int64_t)B * c->groups, DC_F32);
    s->gn_rstd = dc_arena_take_dt(ar, (int64_t)B * c->groups, DC_F32);
    s->ln_mean = dc_arena_take_dt(ar, B * (p->HW ? p->HW : 1), DC_F32);
    s->ln_rstd = dc_arena_take_dt(ar, B * (p->HW ? p->HW : 1), DC_F32);
    s->lse = dc_arena_take_dt(ar, B * (p->lse ? p->lse : 1), DC_F32);
    a->nskip = p->nskip;
    for (int k = 0; k < p->nskip; k++) a->skip[k] = dc_arena_take(ar, B * p->skip[k]);
    a->p0 = dc_arena_take(ar, B * p->P), a->p1 = dc_arena_take(ar, B * p->P);
    // the scratch union: the resnet view, then the transformer view over the same bytes
    const size_t start = ar->used;
    s->cat = dc_arena_take(ar, B * (p->cat ? p->cat : 1));
    s->r0 = dc_arena_take(ar, B * p->R), s->r1 = dc_arena_take(ar, B * p->R);
    const size_t resnet_end = ar->used;
    ar->used = start;
    const int64_t slab = B * (p->S ? p->S : 1);
    for (int k = 0; k < 3; k++) s->tok[k] = dc_arena_take(ar, slab);
    // one region: a packed [B, HW, 3C] q | k | v, then the feed-forward's
    // hidden layer in chunks of rows (two slabs' worth); the whole region
    // holds the gated [B HW, 4C] of a feed-forward run in one pass
    s->ff_cap = 2 * B * (p->S ? p->S : 8 * p->cmax);
    s->tok[3] = dc_arena_take(ar, 3 * slab + s->ff_cap);
    s->tok[4] = dc_buf_at(s->tok[3], slab), s->tok[5] = dc_buf_at(s->tok[3], 2 * slab);
    s->ff1 = dc_buf_at(s->tok[3], 3 * slab), s->ff2 = dc_arena_take(ar, s->ff_cap / 2);
    s->hid_cap = 3 * slab + s->ff_cap;
    if (ar->used < resnet_end) ar->used = resnet_end;
    a->kv = dc_arena_take(ar, B * DC_UNET_CTX_LEN * p->kvsum);
}

// Forgets the plan: the next reserve makes another. Training's memory stays
// (unet_train_reserve carves the next plan in it where it is large enough: a
// size change, buckets of pictures, comes often); inference's goes.
static void drop_plan(dc_unet *m) {
    m->max_batch = 0;
    m->kv_ctx = NULL;
    if (!m->acts) return;
    if (m->acts->base) m->be->free(m->be, m->acts->base);
    free(m->acts);
    m->acts = NULL;
}

static void free_acts(dc_unet *m) {
    drop_plan(m);
    unet_train_free(m);
}

// The arena's bytes for max_batch in `compute`: the plan alone, nothing
// allocated (a layout has no backend).
static size_t acts_bytes(const dc_unet *m, dc_dtype compute, int max_batch) {
    unet_plan p;
    dc_unet_acts a;
    make_plan(m, &p);
    memset(&a, 0, sizeof a);
    dc_arena ar = dc_arena_counting(compute);
    carve(m, &p, &ar, &a, max_batch);
    return ar.used;
}

size_t dc_unet_activation_bytes(const dc_model *mm, int max_batch) {
    const dc_unet *m = (const dc_unet *)mm;
    if (m->trains)
        return (size_t)unet_train_bytes(m, m->be->compute, max_batch, m->keep, m->selective, m->lend_grads);
    return acts_bytes(m, m->be->compute, max_batch);
}

// The model interface's planner: the arena reserve allocates, the training
// one (keep layers keeping their activations) for a model made to train,
// else the inference one.
static int64_t unet_activation_bytes(const dc_model *mm, dc_dtype compute, int max_batch, int keep, bool selective) {
    const dc_unet *m = (const dc_unet *)mm;
    if (max_batch < 1 || max_batch > 65535) return dc_fail("batch %d: 1 to 65535 images per forward", max_batch);
    if (m->trains) return unet_train_bytes(m, compute, max_batch, keep, selective, false);
    return (int64_t)acts_bytes(m, compute, max_batch);
}

static int unet_set_recompute(dc_model *mm, int keep) {
    dc_unet *m = (dc_unet *)mm;
    if (keep < -1) return dc_fail("recompute: %d layers keeping their activations", keep);
    if (keep != m->keep) {
        free_acts(m);  // replanned by the next reserve
        m->keep = keep;
    }
    return 0;
}

static int64_t unet_lent_bytes(const dc_model *mm, dc_dtype compute, int max_batch, int keep, bool selective) {
    const dc_unet *m = (const dc_unet *)mm;
    if (!m->trains) return dc_fail("a UNet made for inference has no gradients");
    if (max_batch < 1 || max_batch > 65535) return dc_fail("batch %d: 1 to 65535 images per forward", max_batch);
    return unet_train_bytes(m, compute, max_batch, keep, selective, true);
}

// A setting of the training plan: a change is replanned by the next reserve.
static int set_plan_flag(dc_unet *m, bool *flag, bool on) {
    if (on != *flag) free_acts(m), *flag = on;
    return 0;
}

static int unet_set_selective(dc_model *mm, bool on) {
    dc_unet *m = (dc_unet *)mm;
    if (on && !m->trains) return dc_fail("a UNet made for inference keeps nothing for a backward");
    return set_plan_flag(m, &m->selective, on);
}

static int unet_lend_grads(dc_model *mm, bool lend) {
    dc_unet *m = (dc_unet *)mm;
    if (lend && !m->trains) return dc_fail("a UNet made for inference has no gradients to hold");
    if (lend) DC_TRY(unet_train_lends(m));
    return set_plan_flag(m, &m->lend_grads, lend);
}

static int unet_reserve(dc_model *mm, int max_batch) {
    dc_unet *m = (dc_unet *)mm;
    dc_backend *be = m->be;
    if (!be) return dc_fail("a UNet layout (sized, not allocated) cannot run");
    if (max_batch < 1) return dc_fail("batch size must be at least 1");
    if (max_batch > 65535) return dc_fail("batch %d is too large: at most 65535 images per forward", max_batch);
    if ((m->acts || m->train) && m->max_batch >= max_batch && m->adapter == m->base.params->adapter) return 0;
    const bool training = m->trains;
    unet_plan p;
    make_plan(m, &p);
    // ops index with int: every buffer must hold fewer than 2^31 values
    int64_t big = p.R > p.cat ? p.R : p.cat;
    max_to(&big, 3 * p.S), max_to(&big, p.P);  // the packed q | k | v
    for (int k = 0; k < p.nskip; k++) max_to(&big, p.skip[k]);
    if ((int64_t)max_batch * big > INT32_MAX)
        return dc_fail("batch %d of %dx%d latents is too large for this UNet (a buffer over 2^31 values)",
                       max_batch, m->lh, m->lw);
    for (int i = 0; i < p.nconv; i++) {
        dc_conv2d_shape s = dc_conv2d_shape_of(p.conv[i].c, max_batch, p.conv[i].H, p.conv[i].W);
        DC_TRY(dc_conv2d_reserve(be, m->base.params, p.conv[i].c, &s, training));
    }
    const int64_t tokens = (int64_t)m->lh * m->lw;  // the most rows a linear layer takes a sample
    DC_TRY(dc_adapter_reserve_rows(m->base.params, max_batch * (tokens > DC_UNET_CTX_LEN ? tokens : DC_UNET_CTX_LEN)));
    for (int i = 0; i < p.nattn; i++) {
        const unet_transformer *t = p.attn[i].t;
        int T = p.attn[i].H * p.attn[i].W;
        DC_TRY(be->reserve(be, T > DC_UNET_CTX_LEN ? T : DC_UNET_CTX_LEN, t->C / t->heads));
    }
    drop_plan(m);
    if (training) {
        DC_TRY(unet_train_reserve(m, max_batch));
        m->max_batch = max_batch, m->adapter = m->base.params->adapter;
        return 0;
    }
    dc_unet_acts *a = calloc(1, sizeof *a);
    if (!a) return dc_fail("out of memory");
    dc_arena ar = dc_arena_counting(be->compute);
    carve(m, &p, &ar, a, max_batch);
    a->bytes = ar.used;
    a->base = be->alloc(be, ar.used);
    if (!a->base) {
        free(a);
        return dc_fail_ctx("UNet activations for batch %d (%.1f MiB)", max_batch, ar.used / 1048576.0);
    }
    ar = dc_arena_over(a->base, be->compute);
    carve(m, &p, &ar, a, max_batch);
    m->acts = a;
    m->max_batch = max_batch, m->adapter = m->base.params->adapter;
    return 0;
}

// ---- forward --------------------------------------------------------------------------

static int check_call(const dc_unet *m, const dc_cond *cond, int B) {
    const dc_unet_config *c = &m->cfg;
    if ((!m->acts && !m->train) || B < 1 || B > m->max_batch)
        return dc_fail("UNet: batch %d exceeds the reserved batch %d", B, m->max_batch);
    if (!cond || !cond->ctx.p) return dc_fail("the UNet is conditioned on text embeddings, and none were given");
    if (cond->dim != c->ctx_dim)
        return dc_fail("UNet: text embeddings are %d wide, the model's cross-attention reads %d", cond->dim,
                       c->ctx_dim);
    if (cond->len < 1 || cond->len > DC_UNET_CTX_LEN)
        return dc_fail("UNet: text of %d tokens (1 to %d supported)", cond->len, DC_UNET_CTX_LEN);
    return 0;
}

// Transformer i's slice of the text's keys and values, [B len, 2C] (in
// forward order; *off advances past it).
static dc_buf kv_slice(const dc_unet *m, const unet_transformer *t, int B, int len, int64_t *off) {
    const dc_buf b = dc_buf_at(m->acts->kv, *off);
    *off += (int64_t)B * len * 2 * t->C;
    return b;
}

int dc_unet_prepare_text(dc_model *mm, const dc_cond *cond, int B) {
    dc_unet *m = dc_unet_of(mm);
    if (!m) return dc_fail("dc_unet_prepare_text: not a UNet");
    m->kv_ctx = NULL;
    if (!cond || m->train) return 0;  // training computes each transformer's own
    DC_TRY(check_call(m, cond, B));
    const unet_transformer *tl[MAX_ATTNS];
    const int n = transformer_list(m->mods, m->cfg.nblocks, tl);
    int64_t off = 0;
    for (int i = 0; i < n; i++)
        unet_text_kv_fwd(m->be, m->base.params, tl[i], kv_slice(m, tl[i], B, cond->len, &off), cond->ctx,
                         B * cond->len);
    DC_TRY(dc_backend_status(m->be));
    m->kv_ctx = cond->ctx.p, m->kv_B = B, m->kv_len = cond->len;
    return 0;
}

static int unet_forward(dc_model *mm, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    dc_unet *m = (dc_unet *)mm;
    const dc_unet_config *c = &m->cfg;
    DC_TRY(check_call(m, cond, B));
    if (m->train) {
        dc_params_refresh(m->base.params);
        return unet_train_forward(m, out, x, t, cond, B);
    }
    dc_backend *be = m->be;
    const dc_params *ps = m->base.params;
    const dc_unet_modules *md = m->mods;
    dc_unet_acts *a = m->acts;
    const unet_scratch *s = &a->s;
    const int N = c->nblocks, len = cond->len;

    // time embedding, and every resnet's projection of it: tp[i] for the i-th
    const unet_time_acts ta = {a->tfreq, a->th, a->ta, a->temb, s->silu_temb, s->tproj};
    dc_buf tp[UNET_MAX_RESNETS];
    unet_time_fwd(be, ps, md, c, &ta, t, B, tp);
    const unet_resnet_acts ra = unet_resnet_scratch(s);
    const unet_transformer_acts tk = unet_transformer_scratch(s);
    int ri = 0;
    // the text's keys and values: prepared, or each transformer's own product
    const bool kv_ready = m->kv_ctx == cond->ctx.p && m->kv_B == B && m->kv_len == len;
    int64_t kvo = 0;
#define KV(t) (kv_ready ? kv_slice(m, (t), B, len, &kvo) : dc_buf_none())

    // down path: every output is kept as a skip
    // x and out may be F32 (a sampler's state) while the layers run in the
    // compute dtype: cast and transpose through the scratch, which is free at both ends.
    // A guided step's halves (rows i and i + pairs) share x and t, so
    // everything before the first cross-attention is the same in both: it
    // runs on the first half (Bs rows), and at the first transformer's
    // cross-attention the finished skips and the state are copied to the
    // second (SD: conv_in, the first resnet and the first self-attention).
    const int Bs = cond->pairs > 0 && 2 * cond->pairs == B && md->down[0].has_attn ? cond->pairs : B;
    const int64_t HW0 = (int64_t)m->lh * m->lw;
    unet_to_nhwc(be, s->r0, x, s->r1, Bs, c->in_channels, HW0);
    int k = 0;
    unet_conv_fwd(be, ps, &md->conv_in, a->skip[k], s->r0, Bs, m->lh, m->lw);
    dc_buf h = a->skip[k++];
    for (int i = 0; i < N; i++) {
        const unet_block *b = &md->down[i];
        const int H = m->lh >> i, W = m->lw >> i;
        for (int j = 0; j < b->nres; j++) {
            const int rows = i == 0 && j == 0 ? Bs : B;  // the first resnet may run on one half
            unet_resnet_fwd(be, ps, &b->res[j], a->skip[k], h, tp[ri++], rows, H, W, &ra);
            if (rows < B) unet_copy_half(be, a->skip[0], (int64_t)Bs * HW0 * md->conv_in.co);
            if (b->has_attn)
                unet_transformer_fwd(be, ps, &b->attn[j], a->skip[k], a->skip[k], B, rows, H, W, cond->ctx, len,
                                     KV(&b->attn[j]), &tk, s);
            h = a->skip[k++];
        }
        if (b->sample.w >= 0) {
            unet_conv_fwd(be, ps, &b->sample, a->skip[k], h, B, H, W);
            h = a->skip[k++];
        }
    }

    // mid block: resnet, attention, resnet
    const int Hm = m->lh >> (N - 1), Wm = m->lw >> (N - 1);
    unet_resnet_fwd(be, ps, &md->mid.res[0], a->p0, h, tp[ri++], B, Hm, Wm, &ra);
    unet_transformer_fwd(be, ps, &md->mid.attn[0], a->p0, a->p0, B, B, Hm, Wm, cond->ctx, len, KV(&md->mid.attn[0]),
                         &tk, s);
    unet_resnet_fwd(be, ps, &md->mid.res[1], a->p1, a->p0, tp[ri++], B, Hm, Wm, &ra);
    h = a->p1;
    int C = md->mid.res[1].co;

    // up path: each resnet reads [h | the latest unconsumed skip]
    for (int i = 0; i < N; i++) {
        const unet_block *b = &md->up[i];
        const int H = m->lh >> (N - 1 - i), W = m->lw >> (N - 1 - i);
        for (int j = 0; j < b->nres; j++) {
            const unet_resnet *r = &b->res[j];
            dc_buf dst = h.p == a->p0.p ? a->p1 : a->p0;
            k--;
            be->concat_channels(be, s->cat, h, C, a->skip[k], r->ci - C, (int64_t)B * H * W);
            unet_resnet_fwd(be, ps, r, dst, s->cat, tp[ri++], B, H, W, &ra);
            if (b->has_attn)
                unet_transformer_fwd(be, ps, &b->attn[j], dst, dst, B, B, H, W, cond->ctx, len, KV(&b->attn[j]), &tk, s);
            h = dst, C = r->co;
        }
        if (b->sample.w >= 0) {  // nearest 2x, then a 3x3 conv
            dc_buf dst = h.p == a->p0.p ? a->p1 : a->p0;
            be->upsample2x_nhwc_fwd(be, s->r0, h, B, C, H, W);
            unet_conv_fwd(be, ps, &b->sample, dst, s->r0, B, 2 * H, 2 * W);
            h = dst;
        }
    }

#undef KV
    dc_group_norm_nhwc_fwd(be, ps, &md->norm_out, s->r0, s->gn_mean, s->gn_rstd, h, B, HW0, true);
    unet_conv_fwd(be, ps, &md->conv_out, s->r1, s->r0, B, m->lh, m->lw);
    unet_from_nhwc(be, out, s->r1, s->r0, B, c->out_channels, HW0);
    return dc_backend_status(be);
}

static int unet_backward(dc_model *mm, dc_buf dout, int B) { return unet_train_backward((dc_unet *)mm, dout, B); }

// ---- weights --------------------------------------------------------------------------

// PyTorch's default initialisation, which diffusers' UNet2DConditionModel
// keeps (nn.Linear and nn.Conv2d reset_parameters: kaiming_uniform_ with
// a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and biases from the
// same range; GroupNorm and LayerNorm 1 and 0), drawn uniformly from a
// stream keyed by the parameter's index: deterministic, whatever the backend.
// A bias belongs to the tensor of its name with ".weight": a 1-D one is a
// norm's scale, whose shift starts at 0.
static float init_bound(const dc_params *ps, const dc_param *p) {
    const size_t L = strlen(p->name);
    char w[256];
    if (p->ndim > 1) return 1.0f / sqrtf((float)(p->numel / p->shape[0]));  // fan_in: all but the output dim
    if (L < 5 || strcmp(p->name + L - 5, ".bias") || L - 5 + 8 > sizeof w) return 0;
    snprintf(w, sizeof w, "%.*s.weight", (int)(L - 5), p->name);
    const int k = dc_params_find(ps, w);
    const dc_param *q = k >= 0 ? &ps->items[k] : NULL;
    return q && q->ndim > 1 ? init_bound(ps, q) : 0;
}

static int unet_init(dc_model *mm, uint64_t seed) {
    dc_unet *m = (dc_unet *)mm;
    dc_params *ps = m->base.params;
    if (!m->be) return dc_fail("a UNet layout (sized, not allocated) has no weights to initialise");
    for (int i = m->first; i < m->end; i++) {
        const dc_param *p = &ps->items[i];
        const dc_dtype dt = dc_param_data(ps, i).dt;
        const size_t n = (size_t)p->numel;
        float *h = malloc(n * sizeof *h);
        if (!h) return dc_fail("out of memory initialising %s", p->name);
        const size_t L = strlen(p->name);
        const bool norm_scale = p->ndim == 1 && L > 7 && strcmp(p->name + L - 7, ".weight") == 0;
        const float bound = init_bound(ps, p);
        for (size_t j = 0; j < n; j++)
            h[j] = norm_scale ? 1.0f
                              : bound * (2 * dc_u32_to_unit(dc_rand_u32_at(seed, (uint32_t)(i - m->first), 0, DC_STREAM_INIT,
                                                                           (uint32_t)j)) - 1);
        if (dc_param_to_stored(p, h)) return free(h), -1;  // drawn in PyTorch's order, whatever the layout
        // frozen weights live in the compute dtype: convert on the host
        if (dt == DC_BF16 || dt == DC_F16) {
            uint16_t *q = (uint16_t *)h;  // narrowing in place: element j is read before it is overwritten
            for (size_t j = 0; j < n; j++) q[j] = dt == DC_BF16 ? dc_f32_to_bf16(h[j]) : dc_f32_to_f16(h[j]);
        } else if (dt != DC_F32) {
            free(h);
            return dc_fail("UNet: cannot initialise weights stored as %s", dc_dtype_name(dt));
        }
        m->be->upload(m->be, dc_param_data(ps, i).p, h, n * dc_dtype_size(dt));  // staged: h may go
        free(h);
    }
    dc_params_touch(ps);
    return dc_backend_status(m->be);
}

int dc_unet_load(dc_model *mm, const dc_weights *w, dc_names names) {
    dc_unet *m = dc_unet_of(mm);
    if (!m) return dc_fail("not a UNet");
    return dc_params_load_weights_range(m->base.params, m->first, m->end, w,
                                        names == DC_NAMES_ORIGINAL ? dc_unet_weight_map : NULL, (void *)&m->cfg);
}

// ---- the model interface ---------------------------------------------------------------------

static double linear_macs(const dc_linear *l, int64_t rows) { return (double)rows * l->in * l->out; }

static double unet_macs(const dc_model *mm) {
    const dc_unet *m = (const dc_unet *)mm;
    unet_plan p;
    make_plan(m, &p);
    double macs = linear_macs(&m->mods->time1, 1) + linear_macs(&m->mods->time2, 1);
    for (int i = 0; i < p.nconv; i++) {
        const dc_conv2d *c = p.conv[i].c;
        const int Ho = (p.conv[i].H + 2 * c->pad - c->k) / c->stride + 1;
        const int Wo = (p.conv[i].W + 2 * c->pad - c->k) / c->stride + 1;
        macs += (double)c->co * c->ci * c->k * c->k * Ho * Wo;
    }
    for (int i = 0; i < p.nattn; i++) {
        const unet_transformer *t = p.attn[i].t;
        const double T = (double)p.attn[i].H * p.attn[i].W, C = t->C, len = DC_UNET_CTX_LEN;
        macs += T * C * C * 7 + T * C * 12 * C;            // proj in/out, q1 k1 v1 o1 q2 o2; ff
        macs += len * m->cfg.ctx_dim * C * 2;              // cross k, v
        macs += 2 * T * T * C + 2 * T * len * C;           // scores and values
    }
    return macs;
}

static int unet_config_kv(const dc_model *mm, dc_kv *kv) { return dc_unet_config_to_kv(&((const dc_unet *)mm)->cfg, kv); }

static void unet_describe(const dc_model *mm, char *buf, size_t n) {
    const dc_unet *m = (const dc_unet *)mm;
    const dc_unet_config *c = &m->cfg;
    char ch[64] = "", heads[64] = "";
    for (int i = 0, a = 0, b = 0; i < c->nblocks; i++) {
        a += snprintf(ch + a, sizeof ch - (size_t)a, "%s%d", i ? " " : "", c->ch[i]);
        b += snprintf(heads + b, sizeof heads - (size_t)b, "%s%d", i ? " " : "", c->heads[i]);
    }
    snprintf(buf, n,
             "UNet2DConditionModel channels %s, %d layers per block, heads %s, latent %dx%dx%d\n"
             "cross-attention %d wide, %s projections, %d groups",
             ch, c->layers, heads, m->lh, m->lw, c->in_channels, c->ctx_dim, c->linear_proj ? "linear" : "1x1 conv",
             c->groups);
}

static void unet_release(dc_model *mm) {
    dc_unet *m = (dc_unet *)mm;
    free_acts(m);
    dc_params_free(&m->own);  // a joint set is its owner's to free
    free(m->mods);
    m->mods = NULL;
}

static const dc_model_ops unet_ops = {
    .name = "UNet2DConditionModel", .reserve = unet_reserve, .forward = unet_forward,
    .backward = unet_backward, .config_to_kv = unet_config_kv, .init_weights = unet_init,
    .macs_per_image = unet_macs, .describe = unet_describe, .activation_bytes = unet_activation_bytes,
    .set_recompute = unet_set_recompute, .set_selective = unet_set_selective, .lend_grads = unet_lend_grads,
    .lent_bytes = unet_lent_bytes, .set_size = dc_unet_set_size, .release = unet_release,
};

dc_unet *dc_unet_of(dc_model *m) { return m && m->ops == &unet_ops ? (dc_unet *)m : NULL; }

static int check_size(const dc_unet_config *c, int lh, int lw) {
    const int f = 1 << (c->nblocks - 1);
    if (lh < f || lw < f || lh % f || lw % f || lh > 65536 || lw > 65536)
        return dc_fail("latent size %dx%d: the UNet needs multiples of %d (images of multiples of %d pixels)",
                       lh, lw, f, 8 * f);
    return 0;
}

int dc_unet_set_size(dc_model *mm, int latent_h, int latent_w) {
    dc_unet *m = dc_unet_of(mm);
    if (!m) return dc_fail("not a UNet");
    DC_TRY(check_size(&m->cfg, latent_h, latent_w));
    if (latent_h == m->lh && latent_w == m->lw) return 0;
    drop_plan(m);
    m->lh = latent_h, m->lw = latent_w;
    m->base.info.height = latent_h, m->base.info.width = latent_w;
    return 0;
}

void dc_unet_release(dc_model *mm) {
    dc_unet *m = dc_unet_of(mm);
    if (m) free_acts(m);
}

int dc_unet_register(const dc_unet_config *c, dc_params *ps) {
    DC_TRY(dc_unet_config_validate(c));
    dc_unet_modules *md = calloc(1, sizeof *md);
    if (!md) return dc_fail("out of memory");
    int rc = unet_modules_add(ps, md, c);
    free(md);
    return rc;
}

// set NULL: the model's own parameters, allocated here; else registered into
// the joint set, which its owner allocates.
// frozen: weights as in inference, though it trains.
static int unet_new(const dc_unet_config *c, dc_backend *be, dc_dtype loaded, dc_grad_mode grad, bool frozen,
                    int latent_h, int latent_w, dc_params *set, dc_model **out) {
    *out = NULL;
    DC_TRY(dc_unet_config_validate(c));
    DC_TRY(check_size(c, latent_h, latent_w));
    dc_unet *m = calloc(1, sizeof *m);
    if (!m) return dc_fail("out of memory");
    m->cfg = *c;
    m->be = be;
    m->lh = latent_h, m->lw = latent_w;
    m->trains = grad != DC_GRAD_NONE, m->keep = -1;
    m->base = (dc_model){
        .ops = &unet_ops, .be = be, .params = set ? set : &m->own, .owned = true,
        .info = {.channels = c->in_channels, .frames = 1, .height = latent_h, .width = latent_w,
                 .out_channels = c->out_channels, .cond = DC_COND_TEXT, .ctx_len = DC_UNET_CTX_LEN,
                 .ctx_dim = c->ctx_dim},
    };
    m->mods = calloc(1, sizeof *m->mods);
    if (!m->mods) return free(m), dc_fail("out of memory");
    // a layout (be NULL) stops at the registered parameters
    dc_params *ps = m->base.params;
    m->first = ps->count, m->unit0 = ps->units;
    int rc = unet_modules_add(ps, m->mods, c);
    m->end = ps->count;
    const bool alloc = be && !set;
    if (rc || (alloc && (grad && !frozen ? dc_params_alloc(ps, be, grad) : dc_params_alloc_frozen(ps, be, loaded)))) {
        unet_release(&m->base);
        free(m);
        return -1;
    }
    m->base.info.blocks = unet_layer_count(m);
    m->base.info.backward_repeats = true;  // (models/unet_train.c writes only gradients and its shared recompute set)
    *out = &m->base;
    return 0;
}

int dc_unet_new(const dc_unet_config *c, dc_backend *be, dc_dtype loaded, int latent_h, int latent_w,
                dc_model **out) {
    return unet_new(c, be, loaded, DC_GRAD_NONE, true, latent_h, latent_w, NULL, out);
}

int dc_unet_new_train(const dc_unet_config *c, dc_backend *be, dc_grad_mode grad, int latent_h, int latent_w,
                      dc_model **out) {
    if (grad == DC_GRAD_NONE) return dc_fail("a UNet made to train takes gradients");
    return unet_new(c, be, DC_F32, grad, false, latent_h, latent_w, NULL, out);
}

int dc_unet_new_frozen_train(const dc_unet_config *c, dc_backend *be, dc_dtype loaded, int latent_h, int latent_w,
                             dc_model **out) {
    return unet_new(c, be, loaded, DC_GRAD_BUFFER, true, latent_h, latent_w, NULL, out);
}

int dc_unet_new_train_in(const dc_unet_config *c, dc_backend *be, int latent_h, int latent_w, dc_params *set,
                         dc_model **out) {
    return unet_new(c, be, DC_F32, DC_GRAD_BUFFER, false, latent_h, latent_w, set, out);
}
