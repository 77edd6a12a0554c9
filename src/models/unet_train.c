// The UNet's training path: a forward that keeps what backward reads, and
// the backward, layer by layer, through the backend's ops.
//
// The forward is a list of layers: a resnet (with its transformer, if the
// block has attention), a downsampling conv, or an upsampler (nearest 2x and
// a conv). Each layer's output is kept (outs[l + 1]; outs[0] is conv_in's):
// the down path's outputs are the skips, the rest the inputs of the layers
// after them. Each layer also keeps its intermediates (layer_acts) unless
// it recomputes: layers from `keep` on share one set and run their forward
// again from their kept input just before their backward, which gives the
// same bits as keeping everything.
//
// Backward runs the layers last to first. douts[o] is dL/d outs[o]; a down
// path output gets two shares (from the up resnet that reads it as a skip,
// then from the layer after it), the first written, the second added.
// Parameter units (unet_blocks.h): conv_in with the time embedding, each
// transformer, resnet and resampling conv, the output layers; each unit's
// gradients are finished between its dc_params_unit_begin and _done (a
// layer's transformer, then its resnet), but for unit 0's time embedding,
// whose gradient every resnet adds to: it comes last.
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/unet_train.h"
#include "nn/arena.h"

#define MAX_LAYERS (DC_UNET_MAX_BLOCKS * (2 * DC_UNET_MAX_LAYERS + 3) + 2)
#define MAX_UNITS (DC_UNET_MAX_BLOCKS * (4 * DC_UNET_MAX_LAYERS + 4) + 5)

typedef enum { LAYER_RESNET, LAYER_DOWN, LAYER_UP } layer_kind;

typedef struct {
    layer_kind kind;
    const unet_resnet *res;        // LAYER_RESNET
    const unet_transformer *attn;  // its transformer, or NULL
    const dc_conv2d *conv;         // a resampler's conv
    int conv_unit;                 // its parameter unit
    int H, W;                      // the input's size
    int in, skip;                  // it reads outs[in] (and, an up resnet, [outs[in] | outs[skip]]; else -1)
    int cin, cout;                 // channels of outs[in] and of its output
    int tp;                        // a resnet's index in forward order (its time projection)
} unet_layer;

// One layer's intermediates.
typedef struct {
    unet_resnet_acts r;
    unet_transformer_acts t;
    dc_buf cat;   // an up resnet's input [h | skip], or an upsampler's 2x map (the conv's input)
    dc_buf rout;  // a resnet's output when a transformer follows (the transformer's input)
} layer_acts;

struct dc_unet_train {
    void *base;
    size_t bytes;
    int B;                        // planned for up to B images
    int n;                        // layers
    int keep;                     // layers keeping their intermediates
    bool lean;                    // selective recompute: the pointwise intermediates are lean (unet_blocks.h)
    unet_layer layer[MAX_LAYERS];
    layer_acts acts[MAX_LAYERS];  // from keep on, views of one shared set
    // Where the kept intermediates lie in the arena, at its end in forward
    // order, so that the backward gives the arena up from its end: acts[l]
    // from at[l] (at[keep]: the arena's end), its transformer's from tat[l].
    size_t at[MAX_LAYERS + 1], tat[MAX_LAYERS];
    bool lent;                    // the parameters' gradients lie in the arena too
    dc_buf outs[MAX_LAYERS + 1], douts[MAX_LAYERS + 1];
    unet_time_acts time;
    dc_buf tp[UNET_MAX_RESNETS];  // views of time.tproj (the last forward's B)
    dc_buf dsilu_temb, dtemb, dta, dth;  // [B, 4 ch0]
    dc_buf xin;                   // [B, HW, in_channels] the input, channels-last
    dc_buf a_out, mean, rstd;     // SiLU(conv_norm_out(h)) [B, HW, ch0] and its statistics [B, groups]
    dc_buf y, dy;                 // [B, HW, out_channels] conv_out's output and its gradient
    dc_buf dcat;                  // [B, HW, ci] an up resnet's input gradient
    unet_grad_scratch g;
    dc_buf ctx;                   // the last forward's text [B, len, ctx_dim], in the compute dtype
    dc_buf ctx_c;                 // [B, 77, ctx_dim] where the text is cast when it comes in another
    dc_buf dctx;                  // the last forward's cond.dctx: F32 [B, len, ctx_dim] or none
    int len, fwd_B;
};

// ---- the layers --------------------------------------------------------------------------

static unet_layer resnet_layer(const unet_resnet *r, const unet_transformer *t, int H, int W, int in, int skip,
                               int cin, int tp) {
    unet_layer l = {LAYER_RESNET, r, t, NULL, -1, H, W, in, skip, cin, r->co, tp};
    return l;
}

static unet_layer resample_layer(layer_kind kind, const unet_block *b, int H, int W, int in) {
    unet_layer l = {kind, NULL, NULL, &b->sample, b->sample_unit, H, W, in, -1, b->sample.ci, b->sample.co, -1};
    return l;
}

// The forward's layers in order.
static int list_layers(const dc_unet *m, unet_layer *L) {
    const dc_unet_config *c = &m->cfg;
    const dc_unet_modules *md = m->mods;
    const int N = c->nblocks;
    int n = 0, tp = 0, o = 0;  // o: the output the next layer reads
    int skips[MAX_LAYERS], ns = 0;
    skips[ns++] = 0;
    int C = c->ch[0];
    for (int i = 0; i < N; i++) {
        const unet_block *b = &md->down[i];
        const int H = m->lh >> i, W = m->lw >> i;
        for (int j = 0; j < b->nres; j++) {
            L[n] = resnet_layer(&b->res[j], b->has_attn ? &b->attn[j] : NULL, H, W, o, -1, C, tp++);
            C = b->res[j].co, o = ++n, skips[ns++] = o;
        }
        if (b->sample.w >= 0) {
            L[n] = resample_layer(LAYER_DOWN, b, H, W, o);
            o = ++n, skips[ns++] = o;
        }
    }
    const int Hm = m->lh >> (N - 1), Wm = m->lw >> (N - 1);
    L[n] = resnet_layer(&md->mid.res[0], &md->mid.attn[0], Hm, Wm, o, -1, C, tp++);
    o = ++n;
    L[n] = resnet_layer(&md->mid.res[1], NULL, Hm, Wm, o, -1, md->mid.res[0].co, tp++);
    C = md->mid.res[1].co, o = ++n;
    for (int i = 0; i < N; i++) {
        const unet_block *b = &md->up[i];
        const int H = m->lh >> (N - 1 - i), W = m->lw >> (N - 1 - i);
        for (int j = 0; j < b->nres; j++) {
            L[n] = resnet_layer(&b->res[j], b->has_attn ? &b->attn[j] : NULL, H, W, o, skips[--ns], C, tp++);
            C = b->res[j].co, o = ++n;
        }
        if (b->sample.w >= 0) {
            L[n] = resample_layer(LAYER_UP, b, H, W, o);
            o = ++n;
        }
    }
    return n;
}

int unet_layer_count(const dc_unet *m) {
    unet_layer L[MAX_LAYERS];
    return list_layers(m, L);
}

// ---- the arena (nn/arena.h) ------------------------------------------------------------

static void max_to(int64_t *m, int64_t v) {
    if (v > *m) *m = v;
}

// Layer l's intermediates for B images: the resnet's, then its
// transformer's from *tat (which the resnet's backward no longer reads).
// lean: the SiLU(GroupNorm) maps, the transformer's norms and its GEGLU
// are views of the backward's scratch g (unet_blocks.h).
static void carve_layer(dc_arena *ar, const dc_unet_config *c, const unet_layer *l, layer_acts *k, int B,
                        bool lean, const unet_grad_scratch *g, size_t *tat) {
    const int64_t HW = (int64_t)l->H * l->W, G = (int64_t)B * c->groups;
    memset(k, 0, sizeof *k);
    *tat = ar->used;  // (no transformer: nothing from here)
    if (l->kind == LAYER_UP) k->cat = dc_arena_take(ar, B * 4 * HW * l->cin);
    if (l->kind != LAYER_RESNET) return;
    const unet_resnet *r = l->res;
    if (l->skip >= 0) k->cat = dc_arena_take(ar, B * HW * r->ci);
    k->r.lean = lean;
    k->r.a1 = lean ? g->a : dc_arena_take(ar, B * HW * r->ci);
    k->r.h1 = dc_arena_take(ar, B * HW * r->co);
    k->r.a2 = lean ? g->a : dc_arena_take(ar, B * HW * r->co);
    if (r->shortcut.w >= 0) k->r.sc = dc_arena_take(ar, B * HW * r->co);
    k->r.mean1 = dc_arena_take32(ar, G), k->r.rstd1 = dc_arena_take32(ar, G);
    k->r.mean2 = dc_arena_take32(ar, G), k->r.rstd2 = dc_arena_take32(ar, G);
    *tat = ar->used;  // the transformer's, done with before the resnet's backward begins
    if (!l->attn) return;
    const unet_transformer *t = l->attn;
    const int64_t M = B * HW, MC = M * t->C;
    unet_transformer_acts *a = &k->t;
    k->rout = dc_arena_take(ar, MC);
    dc_buf *maps[] = {&a->x0, &a->x1, &a->x2, &a->x3, &a->att1, &a->q2, &a->att2};
    for (size_t i = 0; i < sizeof maps / sizeof *maps; i++) *maps[i] = dc_arena_take(ar, MC);
    a->lean = lean;
    if (lean) a->t0 = a->n1 = a->n3 = g->dT2, a->n2 = g->dqkv, a->act = g->dpre;
    dc_buf *norms[] = {&a->t0, &a->n1, &a->n2, &a->n3};
    for (size_t i = 0; i < sizeof norms / sizeof *norms && !lean; i++) *norms[i] = dc_arena_take(ar, MC);
    a->qkv = dc_arena_take(ar, 3 * MC);
    a->kv = dc_arena_take(ar, (int64_t)B * DC_UNET_CTX_LEN * 2 * t->C);
    a->pre = dc_arena_take(ar, 8 * MC);
    if (!lean) a->act = dc_arena_take(ar, 4 * MC);
    a->gn_mean = dc_arena_take32(ar, G), a->gn_rstd = dc_arena_take32(ar, G);
    for (int i = 0; i < 3; i++) a->ln_mean[i] = dc_arena_take32(ar, M), a->ln_rstd[i] = dc_arena_take32(ar, M);
    a->lse1 = dc_arena_take32(ar, M * t->heads), a->lse2 = dc_arena_take32(ar, M * t->heads);
}

static void carve(const dc_unet *m, dc_arena *ar, dc_unet_train *a, int B) {
    const dc_unet_config *c = &m->cfg;
    const int64_t td = dc_unet_time_dim(c), HW0 = (int64_t)m->lh * m->lw;
    const int n = a->n;
    unet_time_acts *ta = &a->time;
    int64_t tsum = 0, big = 0, cat = 1, tok = 1, ctx = 1, co = 1;
    for (int l = 0; l < n; l++) {
        const unet_layer *y = &a->layer[l];
        const int64_t HW = (int64_t)y->H * y->W;
        if (y->kind == LAYER_RESNET) {
            tsum += y->res->co;
            max_to(&co, y->res->co);
            max_to(&big, HW * (y->res->ci > y->res->co ? y->res->ci : y->res->co));
            if (y->skip >= 0) max_to(&cat, HW * y->res->ci);
        }
        if (y->kind == LAYER_UP) max_to(&big, 4 * HW * y->cin);
        if (y->attn) max_to(&tok, HW * y->attn->C), max_to(&ctx, DC_UNET_CTX_LEN * 2 * y->attn->C);
    }
    max_to(&big, HW0 * c->ch[0]);
    ta->tfreq = dc_arena_take(ar, (int64_t)B * c->ch[0]);
    ta->th = dc_arena_take(ar, B * td), ta->ta = dc_arena_take(ar, B * td), ta->temb = dc_arena_take(ar, B * td);
    ta->silu_temb = dc_arena_take(ar, B * td), ta->tproj = dc_arena_take(ar, B * tsum);
    a->dsilu_temb = dc_arena_take(ar, B * td), a->dtemb = dc_arena_take(ar, B * td);
    a->dta = dc_arena_take(ar, B * td), a->dth = dc_arena_take(ar, B * td);
    a->xin = dc_arena_take(ar, B * HW0 * c->in_channels);
    a->ctx_c = dc_arena_take(ar, (int64_t)B * DC_UNET_CTX_LEN * c->ctx_dim);
    // The outputs' gradients: a skip (outs[0] and the down path's outputs,
    // which an up resnet reads again) holds its own, as its two shares arrive
    // far apart; any other output's gradient lives only from the backward of
    // the layer after it to its own, so those alternate between two buffers.
    int64_t size[MAX_LAYERS + 1], chain = 1;
    bool skip[MAX_LAYERS + 1] = {true};
    size[0] = HW0 * c->ch[0];
    for (int l = 0; l < n; l++) {
        const unet_layer *y = &a->layer[l];
        const int64_t HWo = y->kind == LAYER_DOWN ? (int64_t)(y->H / 2) * (y->W / 2)
                            : y->kind == LAYER_UP ? 4 * (int64_t)y->H * y->W
                                                  : (int64_t)y->H * y->W;
        size[l + 1] = HWo * y->cout;
        if (y->skip >= 0) skip[y->skip] = true;
    }
    for (int o = 0; o <= n; o++)
        if (!skip[o]) max_to(&chain, size[o]);
    const dc_buf pool[2] = {dc_arena_take(ar, B * chain), dc_arena_take(ar, B * chain)};
    for (int o = 0; o <= n; o++) {
        a->outs[o] = dc_arena_take(ar, B * size[o]);
        a->douts[o] = skip[o] ? dc_arena_take(ar, B * size[o]) : pool[o % 2];
    }
    a->a_out = dc_arena_take(ar, B * HW0 * c->ch[0]);
    a->mean = dc_arena_take32(ar, (int64_t)B * c->groups), a->rstd = dc_arena_take32(ar, (int64_t)B * c->groups);
    a->y = dc_arena_take(ar, B * HW0 * c->out_channels), a->dy = dc_arena_take(ar, B * HW0 * c->out_channels);
    a->dcat = dc_arena_take(ar, B * cat);
    unet_grad_scratch *g = &a->g;
    g->d1 = dc_arena_take(ar, B * big), g->d2 = dc_arena_take(ar, B * big);
    g->a = a->lean ? dc_arena_take(ar, B * big) : dc_buf_none();
    g->dtproj = dc_arena_take(ar, B * co);
    g->dS = dc_arena_take(ar, B * tok), g->dT = dc_arena_take(ar, B * tok), g->dT2 = dc_arena_take(ar, B * tok);
    g->dqkv = dc_arena_take(ar, 3 * B * tok), g->dpre = dc_arena_take(ar, 8 * B * tok);
    g->dact = dc_arena_take(ar, 4 * B * tok), g->dkv = dc_arena_take(ar, B * ctx);
    g->dctx = dc_arena_take(ar, (int64_t)B * DC_UNET_CTX_LEN * c->ctx_dim);
    // the recomputed layers' intermediates overlap: one runs at a time
    const size_t start = ar->used;
    size_t end = start;
    for (int l = a->keep; l < n; l++) {
        ar->used = start;
        carve_layer(ar, c, &a->layer[l], &a->acts[l], B, a->lean, g, &a->tat[l]);
        if (ar->used > end) end = ar->used;
    }
    ar->used = end;
    // the kept intermediates last (above)
    for (int l = 0; l < a->keep; l++) {
        a->at[l] = ar->used;
        carve_layer(ar, c, &a->layer[l], &a->acts[l], B, a->lean, g, &a->tat[l]);
    }
    a->at[a->keep] = ar->used;
}

// For each of the UNet's parameter units, the arena offset from which its
// bytes are done with once the unit's backward begins (nn/params.h,
// dc_params_grad_place): a kept layer's units, the intermediates of the
// layers after it (and a resnet's, its transformer's too); conv_in's and
// the time embedding's, which come last, every kept layer's; none (the
// arena's end) for the output layers' and those of recomputed layers, whose
// shared intermediates live to the end.
static void dead_from(const dc_unet *m, const dc_unet_train *a, int64_t *dead) {
    const int units = dc_params_unit_count(m->base.params);
    for (int u = 0; u < units; u++) dead[u] = (int64_t)a->at[a->keep];
    dead[0] = (int64_t)a->at[0];
    for (int l = 0; l < a->keep; l++) {
        const unet_layer *y = &a->layer[l];
        if (y->kind != LAYER_RESNET) {
            dead[y->conv_unit] = (int64_t)a->at[l + 1];
        } else if (y->attn) {
            dead[y->attn->unit] = (int64_t)a->at[l + 1];
            dead[y->res->unit] = (int64_t)a->tat[l];
        } else {
            dead[y->res->unit] = (int64_t)a->at[l + 1];
        }
    }
}

int unet_train_arena(const dc_unet *m, void **base, size_t *bytes, int64_t *dead, int max_units) {
    if (!m->train) return dc_fail("the UNet is not reserved for training");
    if (dc_params_unit_count(m->base.params) > max_units) return dc_fail("more than %d units", max_units);
    dead_from(m, m->train, dead);
    *base = m->train->base, *bytes = m->train->at[m->train->keep];
    return 0;
}

// The arena's bytes (and *grad_at, where the gradients start) for a plan
// whose gradients lie in it.
static size_t lent_bytes(const dc_unet *m, const dc_unet_train *a, size_t arena, size_t *grad_at) {
    int64_t dead[MAX_UNITS];
    dead_from(m, a, dead);
    return dc_params_grad_place(m->base.params, dead, arena, grad_at);
}

// The plan for keep layers keeping their intermediates (-1 or more than
// there are: all).
static void plan(const dc_unet *m, dc_unet_train *a, int keep, bool selective) {
    memset(a, 0, sizeof *a);
    a->n = list_layers(m, a->layer);
    a->keep = keep < 0 || keep > a->n ? a->n : keep;
    a->lean = selective;
}

int unet_train_lends(const dc_unet *m) {
    if (m->unit0 != 0 || dc_params_unit_count(m->base.params) != m->mods->out_unit + 1)
        return dc_fail("the UNet's gradients lie in its activations' memory only where it is all that trains");
    if (dc_params_unit_count(m->base.params) > MAX_UNITS) return dc_fail("UNet: too many parameter units");
    return 0;
}

int64_t unet_train_bytes(const dc_unet *m, dc_dtype compute, int max_batch, int keep, bool selective, bool lend) {
    if (lend) DC_TRY(unet_train_lends(m));
    dc_unet_train *a = malloc(sizeof *a);
    if (!a) return dc_fail("out of memory");
    plan(m, a, keep, selective);
    dc_arena ar = dc_arena_counting(compute);
    carve(m, &ar, a, max_batch);
    size_t at, bytes = lend ? lent_bytes(m, a, ar.used, &at) : ar.used;
    free(a);
    return (int64_t)bytes;
}

void unet_train_free(dc_unet *m) {
    if (!m->train) return;
    if (m->train->lent) dc_params_lend_grad(m->base.params, NULL);
    if (m->train->base) m->be->free(m->be, m->train->base);
    free(m->train);
    m->train = NULL;
}

int unet_train_reserve(dc_unet *m, int max_batch) {
    dc_backend *be = m->be;
    // the memory of an earlier plan is carved again where it is large enough
    // (a size change, dc_unet_set_size: buckets of pictures change it often)
    // With lent gradients (m->lend_grads): the set's own buffer goes first,
    // so that the two are never held at once.
    dc_params *ps = m->base.params;
    if (m->lend_grads) DC_TRY(unet_train_lends(m));
    void *base = m->train ? m->train->base : NULL;
    const size_t had = m->train ? m->train->bytes : 0;
    if (m->train) free(m->train), m->train = NULL;
    dc_unet_train *a = malloc(sizeof *a);
    if (!a) return base ? be->free(be, base), dc_fail("out of memory") : dc_fail("out of memory");
    plan(m, a, m->keep, m->selective);
    dc_arena ar = dc_arena_counting(be->compute);
    carve(m, &ar, a, max_batch);
    size_t grad_at = 0, bytes = m->lend_grads ? lent_bytes(m, a, ar.used, &grad_at) : ar.used;
    if (ps->grad_lent || m->lend_grads) dc_params_lend_grad(ps, NULL);
    if (base && had < bytes) be->free(be, base), base = NULL;
    a->bytes = base ? had : bytes;
    a->base = base ? base : be->alloc(be, bytes);
    if (!a->base) {
        free(a);
        return dc_fail_ctx("UNet training activations for batch %d (%.1f MiB%s)", max_batch, bytes / 1048576.0,
                           m->lend_grads ? " with the gradients" : "");
    }
    ar = dc_arena_over(a->base, be->compute);
    carve(m, &ar, a, max_batch);
    if (m->lend_grads) dc_params_lend_grad(ps, (char *)a->base + grad_at);
    a->lent = m->lend_grads;
    a->B = max_batch;
    m->train = a;
    return 0;
}

// ---- forward -----------------------------------------------------------------------------

static void layer_fwd(dc_unet *m, int l, int B) {
    dc_unet_train *a = m->train;
    dc_backend *be = m->be;
    const dc_params *ps = m->base.params;
    const unet_layer *y = &a->layer[l];
    const layer_acts *k = &a->acts[l];
    dc_buf x = a->outs[y->in], out = a->outs[l + 1];
    if (y->kind == LAYER_DOWN) {
        unet_conv_fwd(be, ps, y->conv, out, x, B, y->H, y->W);
    } else if (y->kind == LAYER_UP) {
        be->upsample2x_nhwc_fwd(be, k->cat, x, B, y->cin, y->H, y->W);
        unet_conv_fwd(be, ps, y->conv, out, k->cat, B, 2 * y->H, 2 * y->W);
    } else {
        const int64_t HW = (int64_t)y->H * y->W;
        if (y->skip >= 0) {
            be->concat_channels(be, k->cat, x, y->cin, a->outs[y->skip], y->res->ci - y->cin, B * HW);
            x = k->cat;
        }
        const dc_buf r = y->attn ? k->rout : out;
        unet_resnet_fwd(be, ps, y->res, r, x, a->tp[y->tp], B, y->H, y->W, &k->r);
        if (y->attn)
            unet_transformer_fwd(be, ps, y->attn, out, r, B, B, y->H, y->W, a->ctx, a->len, dc_buf_none(), &k->t,
                                 NULL);
    }
}

int unet_train_forward(dc_unet *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    dc_unet_train *a = m->train;
    const dc_unet_config *c = &m->cfg;
    dc_backend *be = m->be;
    const dc_params *ps = m->base.params;
    const dc_unet_modules *md = m->mods;
    const int64_t HW0 = (int64_t)m->lh * m->lw;
    a->ctx = cond->ctx, a->len = cond->len, a->fwd_B = B, a->dctx = cond->dctx;
    if (cond->dctx.p && cond->dctx.dt != DC_F32)
        return dc_fail("UNet: the text's gradient must be F32, not %s", dc_dtype_name(cond->dctx.dt));
    if (cond->ctx.dt != a->ctx_c.dt) {  // the data's fp32 text, cast to the weights' dtype once a forward
        if (cond->len > DC_UNET_CTX_LEN) return dc_fail("UNet: text of %d tokens (at most %d)", cond->len, DC_UNET_CTX_LEN);
        be->cast(be, a->ctx_c, cond->ctx, (int64_t)B * cond->len * c->ctx_dim);
        a->ctx = a->ctx_c;
    }
    unet_time_fwd(be, ps, md, c, &a->time, t, B, a->tp);
    unet_to_nhwc(be, a->xin, x, a->g.d1, B, c->in_channels, HW0);
    unet_conv_fwd(be, ps, &md->conv_in, a->outs[0], a->xin, B, m->lh, m->lw);
    for (int l = 0; l < a->n; l++) layer_fwd(m, l, B);
    dc_group_norm_nhwc_fwd(be, ps, &md->norm_out, a->a_out, a->mean, a->rstd, a->outs[a->n], B, HW0, true);
    unet_conv_fwd(be, ps, &md->conv_out, a->y, a->a_out, B, m->lh, m->lw);
    unet_from_nhwc(be, out, a->y, a->g.d1, B, c->out_channels, HW0);
    return dc_backend_status(be);
}

// ---- backward ----------------------------------------------------------------------------

// Layer l's backward from douts[l + 1] (which it may overwrite) into its
// inputs' gradients; done[o]: douts[o] holds a share already.
// Layer l's backward, each parameter unit it holds handed over in turn.
static int layer_bwd(dc_unet *m, int l, int B, bool *done) {
    dc_unet_train *a = m->train;
    dc_backend *be = m->be;
    dc_params *ps = m->base.params;
    const unet_layer *y = &a->layer[l];
    const layer_acts *k = &a->acts[l];
    const unet_grad_scratch *g = &a->g;
    const dc_buf d = a->douts[l + 1], dx = a->douts[y->in], x = a->outs[y->in];
    const int u0 = m->unit0;
    if (y->kind == LAYER_DOWN) {
        DC_TRY(dc_params_unit_begin(ps, u0 + y->conv_unit));
        const dc_conv2d_shape s = dc_conv2d_shape_of(y->conv, B, y->H, y->W);
        dc_conv2d_bwd(be, ps, y->conv, dx, d, x, &s, done[y->in]);
        DC_TRY(dc_params_unit_done(ps, u0 + y->conv_unit));
    } else if (y->kind == LAYER_UP) {
        assert(!done[y->in]);  // an up block's state has no other reader
        DC_TRY(dc_params_unit_begin(ps, u0 + y->conv_unit));
        const dc_conv2d_shape s = dc_conv2d_shape_of(y->conv, B, 2 * y->H, 2 * y->W);
        dc_conv2d_bwd(be, ps, y->conv, g->d1, d, k->cat, &s, false);
        be->upsample2x_nhwc_bwd(be, dx, g->d1, B, y->cin, y->H, y->W);
        DC_TRY(dc_params_unit_done(ps, u0 + y->conv_unit));
    } else {
        const dc_buf r = y->attn ? k->rout : x;
        if (y->attn) {  // d becomes dL/d(the resnet's output)
            DC_TRY(dc_params_unit_begin(ps, u0 + y->attn->unit));
            unet_transformer_bwd(be, ps, y->attn, d, r, B, y->H, y->W, a->ctx, a->len, a->dctx, &k->t, g);
            DC_TRY(dc_params_unit_done(ps, u0 + y->attn->unit));
        }
        DC_TRY(dc_params_unit_begin(ps, u0 + y->res->unit));
        if (y->skip >= 0) {  // the first shares of both: written, not added
            assert(!done[y->in] && !done[y->skip]);
            unet_resnet_bwd(be, ps, y->res, a->dcat, d, k->cat, &k->r, a->time.silu_temb, a->dsilu_temb, B, y->H,
                            y->W, false, g);
            be->split_channels(be, dx, y->cin, a->douts[y->skip], y->res->ci - y->cin, a->dcat,
                               (int64_t)B * y->H * y->W);
            done[y->skip] = true;
        } else {
            unet_resnet_bwd(be, ps, y->res, dx, d, x, &k->r, a->time.silu_temb, a->dsilu_temb, B, y->H, y->W,
                            done[y->in], g);
        }
        DC_TRY(dc_params_unit_done(ps, u0 + y->res->unit));
    }
    done[y->in] = true;
    return 0;
}

int unet_train_backward(dc_unet *m, dc_buf dout, int B) {
    dc_unet_train *a = m->train;
    if (!a) return dc_fail("UNet backward needs a model created for training and reserved");
    if (B != a->fwd_B) return dc_fail("UNet backward of %d images after a forward of %d", B, a->fwd_B);
    const dc_unet_config *c = &m->cfg;
    dc_backend *be = m->be;
    dc_params *ps = m->base.params;
    const dc_unet_modules *md = m->mods;
    const int64_t HW0 = (int64_t)m->lh * m->lw, td = dc_unet_time_dim(c);
    const int n = a->n, final_unit = md->out_unit;
    bool done[MAX_LAYERS + 1] = {false};

    // conv_out(SiLU(conv_norm_out(h))): dout [B, C, HW] to channels-last
    DC_TRY(dc_params_unit_begin(ps, m->unit0 + final_unit));
    unet_to_nhwc(be, a->dy, dout, a->g.d2, B, c->out_channels, HW0);
    const dc_conv2d_shape so = dc_conv2d_shape_of(&md->conv_out, B, m->lh, m->lw);
    dc_conv2d_bwd(be, ps, &md->conv_out, a->g.d1, a->dy, a->a_out, &so, false);
    dc_group_norm_nhwc_bwd(be, ps, &md->norm_out, a->douts[n], a->g.d1, a->outs[n], a->mean, a->rstd, B, HW0, true,
                           false);
    done[n] = true;
    DC_TRY(dc_params_unit_done(ps, m->unit0 + final_unit));

    be->zero(be, a->dsilu_temb.p, (size_t)(B * td) * dc_dtype_size(a->dsilu_temb.dt));
    if (a->dctx.p) be->zero(be, a->dctx.p, (size_t)B * a->len * c->ctx_dim * sizeof(float));
    for (int l = n - 1; l >= 0; l--) {
        if (l >= a->keep) layer_fwd(m, l, B);  // recompute what backward reads
        DC_TRY(layer_bwd(m, l, B, done));
    }

    // conv_in (the latents take no gradient) and the time embedding
    DC_TRY(dc_params_unit_begin(ps, m->unit0));
    const dc_conv2d_shape si = dc_conv2d_shape_of(&md->conv_in, B, m->lh, m->lw);
    dc_conv2d_bwd(be, ps, &md->conv_in, dc_buf_none(), a->douts[0], a->xin, &si, false);
    const unet_time_acts *ta = &a->time;
    be->silu_bwd(be, a->dtemb, a->dsilu_temb, ta->temb, B * td, false);
    dc_linear_bwd(be, ps, &md->time2, a->dta, a->dtemb, ta->ta, B, false);
    be->silu_bwd(be, a->dth, a->dta, ta->th, B * td, false);
    dc_linear_bwd(be, ps, &md->time1, dc_buf_none(), a->dth, ta->tfreq, B, false);
    DC_TRY(dc_params_unit_done(ps, m->unit0));
    return dc_backend_status(be);
}
