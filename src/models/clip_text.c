// The CLIP text encoder's forward pass, written as explicit calls of backend
// ops so the same code runs on every backend.
//
// Shapes: B sequences of T = positions tokens, W width, H heads of Dh = W/H,
// F MLP width, BT = B * T rows. The residual stream stays F32 (as under
// PyTorch autocast); the other activations take the backend's compute dtype.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "models/clip_text_layers.h"
#include "nn/arena.h"

// One set of activations that every layer reuses (inference keeps nothing).
struct dc_clip_text_acts {
    void *base;
    clip_layer_bufs b;        // x_in = x_mid = x_out: the F32 stream, updated in place;
                              // h1 = h2, and one set of statistics
};

// Registers the modules in state-dict order into ps; md->layers holds c->layers.
static int build_modules(const dc_clip_text_config *c, dc_params *ps, dc_clip_text_modules *md) {
    int W = c->width, F = c->ffn;
    if (dc_embedding_add(ps, &md->tok, "embeddings.token_embedding", c->vocab, W) ||
        dc_embedding_add(ps, &md->pos, "embeddings.position_embedding", c->positions, W))
        return -1;
    for (int l = 0; l < c->layers; l++) {
        clip_layer *y = &md->layers[l];
        char name[DC_PARAM_NAME_MAX];
#define LAYER_KEY(leaf) (snprintf(name, sizeof name, "encoder.layers.%d." leaf, l), name)
        if (dc_linear_add(ps, &y->k, LAYER_KEY("self_attn.k_proj"), W, W) ||
            dc_linear_add(ps, &y->v, LAYER_KEY("self_attn.v_proj"), W, W) ||
            dc_linear_add(ps, &y->q, LAYER_KEY("self_attn.q_proj"), W, W) ||
            dc_linear_add(ps, &y->out, LAYER_KEY("self_attn.out_proj"), W, W) ||
            dc_layer_norm_add(ps, &y->ln1, LAYER_KEY("layer_norm1"), W, c->eps) ||
            dc_linear_add(ps, &y->fc1, LAYER_KEY("mlp.fc1"), W, F) ||
            dc_linear_add(ps, &y->fc2, LAYER_KEY("mlp.fc2"), F, W) ||
            dc_layer_norm_add(ps, &y->ln2, LAYER_KEY("layer_norm2"), W, c->eps))
            return -1;
#undef LAYER_KEY
    }
    return dc_layer_norm_add(ps, &md->final_ln, "final_layer_norm", W, c->eps);
}

static dc_clip_text_modules *modules_new(const dc_clip_text_config *c) {
    dc_clip_text_modules *md = calloc(1, sizeof *md);
    if (!md || !(md->layers = calloc((size_t)c->layers, sizeof *md->layers))) {
        free(md);
        return dc_fail("out of memory"), NULL;
    }
    return md;
}

static void modules_free(dc_clip_text_modules *md) {
    if (md) free(md->layers), free(md);
}

int dc_clip_text_params(dc_params *ps, const dc_clip_text_config *c) {
    DC_TRY(dc_clip_text_config_validate(c));
    dc_clip_text_modules *md = modules_new(c);
    if (!md) return -1;
    int rc = build_modules(c, ps, md);
    modules_free(md);
    return rc;
}

// Frozen (inference) or trainable parameters, its own (set NULL: allocated
// here) or registered into a joint set.
static int create(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be, dc_dtype loaded, bool trainable,
                  dc_params *set) {
    *out = NULL;
    DC_TRY(dc_clip_text_config_validate(c));
    dc_clip_text *m = calloc(1, sizeof *m);
    if (!m) return dc_fail("out of memory");
    m->cfg = *c;
    m->be = be;
    dc_params *ps = m->params = set ? set : &m->own;
    m->first = ps->count, m->unit = ps->units;
    int rc = !(m->mods = modules_new(c)) || build_modules(c, ps, m->mods) || dc_params_end_unit(ps);
    m->end = ps->count;
    if (rc || (!set && (trainable ? dc_params_alloc(ps, be, true) : dc_params_alloc_frozen(ps, be, loaded)))) {
        dc_clip_text_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int dc_clip_text_create(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be, dc_dtype loaded) {
    return create(out, c, be, loaded, false, NULL);
}

int dc_clip_text_create_trainable(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be) {
    return create(out, c, be, DC_F32, true, NULL);
}

int dc_clip_text_create_in(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be, dc_params *set) {
    return create(out, c, be, DC_F32, true, set);
}

int dc_clip_text_load(dc_clip_text *m, const dc_weights *w, dc_names names) {
    dc_weight_map map = names == DC_NAMES_ORIGINAL ? dc_clip_text_openclip_name : NULL;
    return dc_params_load_weights_range(m->params, m->first, m->end, w, map, &m->cfg);
}

int dc_clip_text_init_weights(dc_clip_text *m, uint64_t seed) {
    dc_params *ps = m->params;
    const double d = m->cfg.width, L = m->cfg.layers;
    const double proj = 1 / sqrt(d) / sqrt(2 * L), out = 1 / sqrt(d), fc1 = 1 / sqrt(2 * d);
    for (int i = m->first; i < m->end; i++) {
        const dc_param *p = &ps->items[i];
        const char *n = p->name + p->prefix_len;
        double std = 0, one = 0;  // values N(0, std^2) + one
        if (strstr(n, "embedding.weight")) std = 0.02;
        else if (strstr(n, "_proj.weight")) std = strstr(n, "out_proj") ? out : proj;
        else if (strstr(n, "fc1.weight")) std = fc1;
        else if (strstr(n, "fc2.weight")) std = proj;
        else if (strstr(n, "layer_norm") && strstr(n, ".weight")) one = 1;
        float *h = malloc(sizeof(float) * (size_t)p->numel);
        if (!h) return dc_fail("out of memory initialising %s", p->name);
        for (int64_t j = 0; j < p->numel; j++)
            h[j] = (float)(one + std * dc_randn_at(seed, 3, (uint32_t)(i - m->first), DC_STREAM_INIT, (uint64_t)j));
        dc_upload_f32_as(m->be, dc_param_data(ps, i), h, p->numel);
        free(h);
    }
    dc_params_touch(ps);
    return dc_backend_status(m->be);
}

static void free_acts(dc_clip_text *m) {
    if (!m->acts) return;
    if (m->acts->base) m->be->free(m->be, m->acts->base);
    free(m->acts);
    m->acts = NULL;
    m->max_batch = 0;
}

void dc_clip_text_free(dc_clip_text *m) {
    if (!m) return;
    free_acts(m);
    clip_train_free(m);
    dc_params_free(&m->own);  // a joint set is its owner's to free
    modules_free(m->mods);
    free(m);
}

// The activations, carved out of one allocation (nn/arena.h).
static void carve(const dc_clip_text_config *c, dc_arena *ar, dc_clip_text_acts *a, int B) {
    int64_t BT = (int64_t)B * c->positions, BTW = BT * c->width, BTF = BT * c->ffn;
    clip_layer_bufs *b = &a->b;
    b->x_in = b->x_mid = b->x_out = dc_arena_take32(ar, BTW);
    b->h1 = b->h2 = dc_arena_take(ar, BTW);
    b->q = dc_arena_take(ar, BTW), b->k = dc_arena_take(ar, BTW), b->v = dc_arena_take(ar, BTW);
    b->att = dc_arena_take(ar, BTW), b->o = dc_arena_take(ar, BTW);
    b->f = dc_arena_take(ar, BTF), b->g = dc_arena_take(ar, BTF);
    b->mean1 = b->mean2 = dc_arena_take32(ar, BT), b->rstd1 = b->rstd2 = dc_arena_take32(ar, BT);
    b->lse = dc_arena_take32(ar, BT * c->heads);
}

int dc_clip_text_reserve(dc_clip_text *m, int max_batch) {
    const dc_clip_text_config *c = &m->cfg;
    if (max_batch < 1) return dc_fail("batch size must be at least 1");
    // Ops index with int: every activation must hold fewer than 2^31 elements.
    int64_t widest = c->ffn > c->width ? c->ffn : c->width;
    if ((int64_t)max_batch * c->positions * widest > INT32_MAX)
        return dc_fail("batch %d is too large for this text encoder (activations over 2^31 elements)", max_batch);
    if (m->acts && m->max_batch >= max_batch && m->adapter == m->params->adapter) return 0;
    DC_TRY(m->be->reserve(m->be, c->positions, c->width / c->heads));
    DC_TRY(dc_adapter_reserve_rows(m->params, (int64_t)max_batch * c->positions));
    free_acts(m);
    dc_clip_text_acts *a = calloc(1, sizeof *a);
    if (!a) return dc_fail("out of memory");
    dc_arena ar = dc_arena_counting(m->be->compute);
    carve(c, &ar, a, max_batch);
    if (!(a->base = m->be->alloc(m->be, ar.used))) {
        free(a);
        return dc_fail_ctx("text encoder activations for batch %d (%.1f MiB)", max_batch, ar.used / 1048576.0);
    }
    ar = dc_arena_over(a->base, m->be->compute);
    carve(c, &ar, a, max_batch);
    m->acts = a;
    m->max_batch = max_batch, m->adapter = m->params->adapter;
    return 0;
}

dc_attn_shape clip_attn_shape(const dc_clip_text_config *c, int B) {
    const int T = c->positions, W = c->width, H = c->heads;
    dc_attn_shape s;
    memset(&s, 0, sizeof s);
    s.B = B, s.H = H, s.Tq = s.Tk = T, s.Dh = s.Dv = W / H, s.causal = true;  // scale 0: 1/sqrt(Dh)
    s.q = s.k = s.v = s.out = dc_attn_rows(T, W, W / H);
    return s;
}

// dst = src + branch (dst may be src: then in place)
static void residual(dc_backend *be, dc_buf dst, dc_buf src, dc_buf branch, int64_t n) {
    if (dst.p != src.p) be->cast(be, dst, src, n);
    be->axpy(be, dst, branch, 1.0f, n);
}

void clip_layer_fwd(dc_backend *be, const dc_params *ps, const dc_clip_text_config *c, const clip_layer *y,
                    const clip_layer_bufs *b, int B) {
    const int BT = B * c->positions;
    const int64_t BTW = (int64_t)BT * c->width;
    // x_mid = x_in + out_proj(causal_self_attention(layer_norm1(x_in)))
    const dc_attn_shape s = clip_attn_shape(c, B);
    dc_layer_norm_fwd(be, ps, &y->ln1, b->h1, b->mean1, b->rstd1, b->x_in, BT);
    dc_linear_fwd(be, ps, &y->q, b->q, b->h1, BT);
    dc_linear_fwd(be, ps, &y->k, b->k, b->h1, BT);
    dc_linear_fwd(be, ps, &y->v, b->v, b->h1, BT);
    be->attention_fwd(be, b->att, b->lse, b->q, b->k, b->v, &s);
    dc_linear_fwd(be, ps, &y->out, b->o, b->att, BT);
    residual(be, b->x_mid, b->x_in, b->o, BTW);
    // x_out = x_mid + fc2(act(fc1(layer_norm2(x_mid))))
    dc_layer_norm_fwd(be, ps, &y->ln2, b->h2, b->mean2, b->rstd2, b->x_mid, BT);
    dc_linear_fwd(be, ps, &y->fc1, b->f, b->h2, BT);
    be->activation_fwd(be, b->g, b->f, (int64_t)BT * c->ffn, c->act);
    dc_linear_fwd(be, ps, &y->fc2, b->o, b->g, BT);
    residual(be, b->x_out, b->x_mid, b->o, BTW);
}

void clip_embed_fwd(dc_backend *be, const dc_params *ps, const dc_clip_text_modules *md, dc_buf x, dc_buf ids, int B,
                    int T, int W) {
    dc_embedding_fwd(be, ps, &md->tok, x, ids, B * T);
    be->add_rows(be, x, dc_param_w(ps, md->pos.table), B, T, W);
}

int clip_check_call(const dc_clip_text_config *c, dc_buf ids, int B, int max_batch, int skip) {
    if (B < 1 || B > max_batch)
        return dc_fail("text encoder: batch %d exceeds the reserved batch %d", B, max_batch);
    if (ids.dt != DC_I32) return dc_fail("text encoder: token ids must be I32, not %s", dc_dtype_name(ids.dt));
    if (skip < 0 || skip >= c->layers)
        return dc_fail("text encoder: cannot skip %d of its %d layers (0..%d)", skip, c->layers, c->layers - 1);
    return 0;
}

int dc_clip_text_forward(dc_clip_text *m, dc_buf hidden, dc_buf penultimate, dc_buf ids, int B, int skip) {
    const dc_clip_text_config *c = &m->cfg;
    DC_TRY(clip_check_call(c, ids, B, m->acts ? m->max_batch : 0, skip));
    dc_backend *be = m->be;
    const dc_params *ps = m->params;
    const dc_clip_text_modules *md = m->mods;
    const clip_layer_bufs *b = &m->acts->b;
    const int T = c->positions, BT = B * T, run = c->layers - skip;
    const int64_t BTW = (int64_t)BT * c->width;

    clip_embed_fwd(be, ps, md, b->x_in, ids, B, T, c->width);
    for (int l = 0; l < run; l++) {
        if (l == run - 1 && penultimate.p) be->cast(be, penultimate, b->x_in, BTW);  // hidden_states[-2]
        clip_layer_fwd(be, ps, c, &md->layers[l], b, B);
    }
    if (hidden.p) dc_layer_norm_fwd(be, ps, &md->final_ln, hidden, b->mean1, b->rstd1, b->x_out, BT);
    return dc_backend_status(be);
}

int dc_clip_text_check_ids(const int32_t *ids, int64_t n, int vocab) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return dc_fail("token id %d (at position %lld) is outside the text encoder's vocabulary of %d tokens",
                           (int)ids[i], (long long)i, vocab);
    return 0;
}

double dc_clip_text_macs(const dc_clip_text *m) {
    const dc_clip_text_config *c = &m->cfg;
    double T = c->positions, W = c->width, F = c->ffn;
    // q, k, v, out projections and the MLP per token; q k^T and P v over the
    // T (T + 1) / 2 query-key pairs the causal mask leaves
    double layer = T * (4 * W * W + 2 * W * F) + 2 * (T * (T + 1) / 2) * W;
    return c->layers * layer;
}
