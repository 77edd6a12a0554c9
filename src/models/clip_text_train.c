// The CLIP text encoder's training path: a forward that keeps every
// layer's activations, and the backward through them, last layer first.
//
// Each layer keeps its input stream, the stream after its attention
// (x_mid), the LayerNorm outputs and statistics, q, k, v, the attention
// output with its log-sum-exp and the MLP's hidden values before and after
// the activation; the branch outputs are not read by backward and share one
// buffer. The stream's gradient dx stays F32, as the stream does; a branch's
// gradient is cast to the compute dtype before the products read it.
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/clip_text_layers.h"
#include "nn/arena.h"

struct dc_clip_text_train {
    void *base;
    int max_batch;
    int fwd_B, run;              // the last training forward's batch and layers run (0: none yet)
    dc_buf ids;                  // its token ids (the caller's buffer)
    clip_layer_bufs *L;          // [layers]: layer l reads L[l].x_in = L[l - 1].x_out
    dc_buf mean_f, rstd_f;       // [B T] final_layer_norm's statistics
    dc_buf dx;                   // [B, T, W] F32 the stream's gradient
    dc_buf dbr;                  // [B, T, W] a branch output's gradient (dx in the compute dtype)
    dc_buf dh, da;               // [B, T, W] a LayerNorm output's, the attention output's
    dc_buf dq, dk, dv;           // [B, T, W]
    dc_buf dg, df;               // [B, T, F] the MLP's, after and before the activation
};

static void carve(const dc_clip_text_config *c, dc_arena *ar, dc_clip_text_train *t, int B) {
    const int64_t BT = (int64_t)B * c->positions, BTW = BT * c->width, BTF = BT * c->ffn;
    dc_buf o = dc_arena_take(ar, BTW);  // shared: backward never reads a branch's output
    for (int l = 0; l < c->layers; l++) {
        clip_layer_bufs *b = &t->L[l];
        b->x_in = l ? t->L[l - 1].x_out : dc_arena_take32(ar, BTW);
        b->x_mid = dc_arena_take32(ar, BTW), b->x_out = dc_arena_take32(ar, BTW);
        b->h1 = dc_arena_take(ar, BTW), b->h2 = dc_arena_take(ar, BTW);
        b->mean1 = dc_arena_take32(ar, BT), b->rstd1 = dc_arena_take32(ar, BT);
        b->mean2 = dc_arena_take32(ar, BT), b->rstd2 = dc_arena_take32(ar, BT);
        b->q = dc_arena_take(ar, BTW), b->k = dc_arena_take(ar, BTW), b->v = dc_arena_take(ar, BTW);
        b->att = dc_arena_take(ar, BTW), b->lse = dc_arena_take32(ar, BT * c->heads);
        b->f = dc_arena_take(ar, BTF), b->g = dc_arena_take(ar, BTF);
        b->o = o;
    }
    t->mean_f = dc_arena_take32(ar, BT), t->rstd_f = dc_arena_take32(ar, BT);
    t->dx = dc_arena_take32(ar, BTW);
    t->dbr = dc_arena_take(ar, BTW), t->dh = dc_arena_take(ar, BTW), t->da = dc_arena_take(ar, BTW);
    t->dq = dc_arena_take(ar, BTW), t->dk = dc_arena_take(ar, BTW), t->dv = dc_arena_take(ar, BTW);
    t->dg = dc_arena_take(ar, BTF), t->df = dc_arena_take(ar, BTF);
}

static int check_batch(const dc_clip_text_config *c, int max_batch) {
    if (max_batch < 1) return dc_fail("batch size must be at least 1");
    const int64_t widest = c->ffn > c->width ? c->ffn : c->width;
    if ((int64_t)max_batch * c->positions * widest > INT32_MAX)
        return dc_fail("batch %d is too large for this text encoder (activations over 2^31 elements)", max_batch);
    return 0;
}

int64_t dc_clip_text_train_bytes(const dc_clip_text_config *c, dc_dtype compute, int max_batch) {
    if (dc_clip_text_config_validate(c) || check_batch(c, max_batch)) return -1;
    dc_clip_text_train t = {0};
    if (!(t.L = calloc((size_t)c->layers, sizeof *t.L))) return dc_fail("out of memory"), -1;
    dc_arena ar = dc_arena_counting(compute);
    carve(c, &ar, &t, max_batch);
    free(t.L);
    return (int64_t)ar.used;
}

void clip_train_free(dc_clip_text *m) {
    dc_clip_text_train *t = m->train;
    if (!t) return;
    if (t->base) m->be->free(m->be, t->base);
    free(t->L);
    free(t);
    m->train = NULL;
}

int dc_clip_text_train_reserve(dc_clip_text *m, int max_batch) {
    const dc_clip_text_config *c = &m->cfg;
    DC_TRY(check_batch(c, max_batch));
    if (m->train && m->train->max_batch >= max_batch && m->adapter == m->params->adapter) return 0;
    DC_TRY(m->be->reserve(m->be, c->positions, c->width / c->heads));
    DC_TRY(dc_adapter_reserve_rows(m->params, (int64_t)max_batch * c->positions));
    clip_train_free(m);
    dc_clip_text_train *t = calloc(1, sizeof *t);
    if (!t || !(t->L = calloc((size_t)c->layers, sizeof *t->L))) return free(t), dc_fail("out of memory");
    dc_arena ar = dc_arena_counting(m->be->compute);
    carve(c, &ar, t, max_batch);
    if (!(t->base = m->be->alloc(m->be, ar.used))) {
        free(t->L), free(t);
        return dc_fail_ctx("text encoder training activations for batch %d (%.1f MiB)", max_batch,
                           ar.used / 1048576.0);
    }
    ar = dc_arena_over(t->base, m->be->compute);
    carve(c, &ar, t, max_batch);
    t->max_batch = max_batch;
    m->train = t, m->adapter = m->params->adapter;
    return 0;
}

int dc_clip_text_train_forward(dc_clip_text *m, dc_buf hidden, dc_buf ids, int B, int skip) {
    const dc_clip_text_config *c = &m->cfg;
    dc_clip_text_train *t = m->train;
    DC_TRY(clip_check_call(c, ids, B, t ? t->max_batch : 0, skip));
    dc_backend *be = m->be;
    const dc_params *ps = m->params;
    const dc_clip_text_modules *md = m->mods;
    const int T = c->positions, run = c->layers - skip;
    clip_embed_fwd(be, ps, md, t->L[0].x_in, ids, B, T, c->width);
    for (int l = 0; l < run; l++) clip_layer_fwd(be, ps, c, &md->layers[l], &t->L[l], B);
    dc_layer_norm_fwd(be, ps, &md->final_ln, hidden, t->mean_f, t->rstd_f, t->L[run - 1].x_out, (int64_t)B * T);
    t->fwd_B = B, t->run = run, t->ids = ids;
    return dc_backend_status(be);
}

int dc_clip_text_backward(dc_clip_text *m, dc_buf dhidden) {
    dc_clip_text_train *t = m->train;
    if (!t || !t->fwd_B) return dc_fail("text encoder: backward without a training forward before it");
    const dc_clip_text_config *c = &m->cfg;
    dc_backend *be = m->be;
    dc_params *ps = m->params;
    const dc_clip_text_modules *md = m->mods;
    const int B = t->fwd_B, T = c->positions, W = c->width, BT = B * T;
    const int64_t BTW = (int64_t)BT * W, BTF = (int64_t)BT * c->ffn;
    const dc_attn_shape s = clip_attn_shape(c, B);

    DC_TRY(dc_params_unit_begin(ps, m->unit));  // the whole encoder is one unit
    dc_layer_norm_bwd(be, ps, &md->final_ln, t->dx, dhidden, t->L[t->run - 1].x_out, t->mean_f, t->rstd_f, BT,
                      false);
    for (int l = t->run - 1; l >= 0; l--) {
        const clip_layer *y = &md->layers[l];
        const clip_layer_bufs *b = &t->L[l];
        // x_out = x_mid + fc2(act(fc1(layer_norm2(x_mid))))
        be->cast(be, t->dbr, t->dx, BTW);
        dc_linear_bwd(be, ps, &y->fc2, t->dg, t->dbr, b->g, BT, false);
        be->activation_bwd(be, t->df, t->dg, b->f, BTF, c->act, false);
        dc_linear_bwd(be, ps, &y->fc1, t->dh, t->df, b->h2, BT, false);
        dc_layer_norm_bwd(be, ps, &y->ln2, t->dx, t->dh, b->x_mid, b->mean2, b->rstd2, BT, true);
        // x_mid = x_in + out_proj(attention(q, k, v of layer_norm1(x_in)))
        be->cast(be, t->dbr, t->dx, BTW);
        dc_linear_bwd(be, ps, &y->out, t->da, t->dbr, b->att, BT, false);
        be->attention_bwd(be, t->dq, t->dk, t->dv, t->da, b->q, b->k, b->v, b->att, b->lse, &s);
        dc_linear_bwd(be, ps, &y->q, t->dh, t->dq, b->h1, BT, false);
        dc_linear_bwd(be, ps, &y->k, t->dh, t->dk, b->h1, BT, true);
        dc_linear_bwd(be, ps, &y->v, t->dh, t->dv, b->h1, BT, true);
        dc_layer_norm_bwd(be, ps, &y->ln1, t->dx, t->dh, b->x_in, b->mean1, b->rstd1, BT, true);
    }
    // x = token_embedding[ids] + position_embedding: the rows each token took,
    // and every sequence's share of the positions
    dc_embedding_bwd(be, ps, &md->tok, t->dx, t->ids, BT);
    if (!ps->items[md->pos.table].frozen)
        for (int i = 0; i < B; i++)
            be->axpy(be, dc_param_grad(ps, md->pos.table), dc_buf_at(t->dx, (int64_t)i * T * W), 1.0f, (int64_t)T * W);
    DC_TRY(dc_params_unit_done(ps, m->unit));
    return dc_backend_status(be);
}
