// The CLIP text encoder's forward pass, written as explicit calls of backend
// ops so the same code runs on every backend.
//
// Shapes: B sequences of T = positions tokens, W width, H heads of Dh = W/H,
// F MLP width, BT = B * T rows. The residual stream stays F32 (as under
// PyTorch autocast); the other activations take the backend's compute dtype.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/clip_text.h"
#include "nn/arena.h"
#include "nn/modules.h"

// One encoder layer, registered in state-dict order.
typedef struct {
    dc_linear k, v, q, out;   // self_attn.{k,v,q,out}_proj: W -> W, with bias
    dc_layer_norm ln1;        // layer_norm1
    dc_linear fc1, fc2;       // mlp.fc1: W -> F, mlp.fc2: F -> W
    dc_layer_norm ln2;        // layer_norm2
} clip_layer;

struct dc_clip_text_modules {
    dc_embedding tok;         // embeddings.token_embedding [V, W]
    dc_embedding pos;         // embeddings.position_embedding [T, W]
    clip_layer *layers;       // [L]: encoder.layers.<l>
    dc_layer_norm final_ln;   // final_layer_norm
};

// One set of activations that every layer reuses (inference keeps nothing).
struct dc_clip_text_acts {
    void *base;
    dc_buf x;                 // [B, T, W] F32 residual stream
    dc_buf h;                 // [B, T, W] LayerNorm output
    dc_buf q, k, v;           // [B, T, W] projections, head h at columns [h Dh, (h+1) Dh)
    dc_buf att;               // [B, T, W] attention output, heads side by side
    dc_buf o;                 // [B, T, W] branch output before the residual add
    dc_buf f, g;              // [B, T, F] fc1 output and its activation
    dc_buf mean, rstd;        // [B * T] F32 LayerNorm statistics
    dc_buf lse;               // [B, H, T] F32 attention log-sum-exp
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

int dc_clip_text_create(dc_clip_text **out, const dc_clip_text_config *c, dc_backend *be, dc_dtype loaded) {
    *out = NULL;
    DC_TRY(dc_clip_text_config_validate(c));
    dc_clip_text *m = calloc(1, sizeof *m);
    if (!m) return dc_fail("out of memory");
    m->cfg = *c;
    m->be = be;
    if (!(m->mods = modules_new(c)) || build_modules(c, &m->params, m->mods) ||
        dc_params_alloc_frozen(&m->params, be, loaded)) {
        dc_clip_text_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int dc_clip_text_load(dc_clip_text *m, const dc_weights *w, dc_names names) {
    if (names == DC_NAMES_ORIGINAL)
        return dc_params_load_weights(&m->params, w, dc_clip_text_openclip_name, &m->cfg);
    return dc_params_load_weights(&m->params, w, NULL, NULL);
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
    dc_params_free(&m->params);
    modules_free(m->mods);
    free(m);
}

// The activations, carved out of one allocation (nn/arena.h).
static void carve(const dc_clip_text_config *c, dc_arena *ar, dc_clip_text_acts *a, int B) {
    int64_t BT = (int64_t)B * c->positions, BTW = BT * c->width, BTF = BT * c->ffn;
    a->x = dc_arena_take32(ar, BTW);
    a->h = dc_arena_take(ar, BTW);
    a->q = dc_arena_take(ar, BTW), a->k = dc_arena_take(ar, BTW), a->v = dc_arena_take(ar, BTW);
    a->att = dc_arena_take(ar, BTW), a->o = dc_arena_take(ar, BTW);
    a->f = dc_arena_take(ar, BTF), a->g = dc_arena_take(ar, BTF);
    a->mean = dc_arena_take32(ar, BT), a->rstd = dc_arena_take32(ar, BT);
    a->lse = dc_arena_take32(ar, BT * c->heads);
}

int dc_clip_text_reserve(dc_clip_text *m, int max_batch) {
    const dc_clip_text_config *c = &m->cfg;
    if (max_batch < 1) return dc_fail("batch size must be at least 1");
    // Ops index with int: every activation must hold fewer than 2^31 elements.
    int64_t widest = c->ffn > c->width ? c->ffn : c->width;
    if ((int64_t)max_batch * c->positions * widest > INT32_MAX)
        return dc_fail("batch %d is too large for this text encoder (activations over 2^31 elements)", max_batch);
    if (m->acts && m->max_batch >= max_batch) return 0;
    DC_TRY(m->be->reserve(m->be, c->positions, c->width / c->heads));
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
    m->max_batch = max_batch;
    return 0;
}

// x += causal_self_attention(layer_norm1(x)) of layer y.
static void attention_block(dc_clip_text *m, const clip_layer *y, int B) {
    dc_backend *be = m->be;
    const dc_params *ps = &m->params;
    const dc_clip_text_acts *a = m->acts;
    const int T = m->cfg.positions, W = m->cfg.width, H = m->cfg.heads, BT = B * T;
    dc_attn_shape s;
    memset(&s, 0, sizeof s);
    s.B = B, s.H = H, s.Tq = s.Tk = T, s.Dh = s.Dv = W / H, s.causal = true;  // scale 0: 1/sqrt(Dh)
    s.q = s.k = s.v = s.out = dc_attn_rows(T, W, W / H);
    dc_layer_norm_fwd(be, ps, &y->ln1, a->h, a->mean, a->rstd, a->x, BT);
    dc_linear_fwd(be, ps, &y->q, a->q, a->h, BT);
    dc_linear_fwd(be, ps, &y->k, a->k, a->h, BT);
    dc_linear_fwd(be, ps, &y->v, a->v, a->h, BT);
    be->attention_fwd(be, a->att, a->lse, a->q, a->k, a->v, &s);
    dc_linear_fwd(be, ps, &y->out, a->o, a->att, BT);
    be->axpy(be, a->x, a->o, 1.0f, (int64_t)BT * W);
}

// x += fc2(act(fc1(layer_norm2(x)))) of layer y.
static void mlp_block(dc_clip_text *m, const clip_layer *y, int B) {
    dc_backend *be = m->be;
    const dc_params *ps = &m->params;
    const dc_clip_text_acts *a = m->acts;
    const int BT = B * m->cfg.positions;
    dc_layer_norm_fwd(be, ps, &y->ln2, a->h, a->mean, a->rstd, a->x, BT);
    dc_linear_fwd(be, ps, &y->fc1, a->f, a->h, BT);
    be->activation_fwd(be, a->g, a->f, (int64_t)BT * m->cfg.ffn, m->cfg.act);
    dc_linear_fwd(be, ps, &y->fc2, a->o, a->g, BT);
    be->axpy(be, a->x, a->o, 1.0f, (int64_t)BT * m->cfg.width);
}

int dc_clip_text_forward(dc_clip_text *m, dc_buf hidden, dc_buf penultimate, dc_buf ids, int B, int skip) {
    const dc_clip_text_config *c = &m->cfg;
    if (!m->acts || B < 1 || B > m->max_batch)
        return dc_fail("text encoder: batch %d exceeds the reserved batch %d", B, m->max_batch);
    if (ids.dt != DC_I32) return dc_fail("text encoder: token ids must be I32, not %s", dc_dtype_name(ids.dt));
    if (skip < 0 || skip >= c->layers)
        return dc_fail("text encoder: cannot skip %d of its %d layers (0..%d)", skip, c->layers, c->layers - 1);
    dc_backend *be = m->be;
    const dc_params *ps = &m->params;
    const dc_clip_text_modules *md = m->mods;
    const dc_clip_text_acts *a = m->acts;
    const int T = c->positions, BT = B * T, run = c->layers - skip;
    const int64_t BTW = (int64_t)BT * c->width;

    // x = token_embedding[ids] + position_embedding[0..T-1]
    dc_embedding_fwd(be, ps, &md->tok, a->x, ids, BT);
    be->add_rows(be, a->x, dc_param_w(ps, md->pos.table), B, T, c->width);
    for (int l = 0; l < run; l++) {
        if (l == run - 1 && penultimate.p) be->cast(be, penultimate, a->x, BTW);  // hidden_states[-2]
        attention_block(m, &md->layers[l], B);
        mlp_block(m, &md->layers[l], B);
    }
    if (hidden.p) dc_layer_norm_fwd(be, ps, &md->final_ln, hidden, a->mean, a->rstd, a->x, BT);
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
