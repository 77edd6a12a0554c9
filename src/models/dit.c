// DiT forward and backward, written as explicit calls of backend ops (llm.c
// style), so the same code runs on every backend.
//
// Shapes: B images, T = (H/p)^2 tokens, D hidden, F mlp hidden, P = C p p
// patch features, OP = OC p p output features per token, L blocks.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "models/dit.h"
#include "models/dit_io.h"
#include "nn/arena.h"
#include "nn/modules.h"

#define DC_TFREQ 256  // timestep frequency embedding size (official)

// The modules of one block, registered in official state-dict order (attn.qkv,
// attn.proj, mlp.fc1, mlp.fc2, adaLN_modulation.1).
typedef struct {
    dc_linear qkv, proj;  // attention: x -> 3D (q, k, v) and its output projection
    dc_linear fc1, fc2;   // MLP: D -> F -> D
    dc_linear ada;        // adaLN: SiLU(c) -> 6D (shift, scale, gate for attention, then MLP)
} dit_block;

// The whole model's modules, under the official names.
struct dc_dit_modules {
    int pos;                  // pos_embed: fixed 2-D sin-cos positions
    dc_linear x_embed;        // x_embedder.proj: the patch convolution
    dc_linear t_fc1, t_fc2;   // t_embedder.mlp.0 and .2
    dc_embedding y_embed;     // y_embedder.embedding_table (the last row is the null class)
    dit_block *blocks;        // [depth]: blocks.<l>
    dc_linear final_linear;   // final_layer.linear
    dc_linear final_ada;      // final_layer.adaLN_modulation.1
};

// Activations of one block (training keeps one set per block; inference shares one).
typedef struct {
    dc_buf mod;          // [B, 6D] adaLN output: shift/scale/gate for msa then mlp
    dc_buf x_in;         // [B, T, D] residual stream entering the block
    dc_buf ln1, ln2;     // [B, T, D] modulated LayerNorm outputs
    dc_buf mean1, rstd1, mean2, rstd2;  // [B*T]
    dc_buf qkv;          // [B, T, 3D]
    dc_buf att;          // [B, T, D] attention output before proj
    dc_buf lse;          // [B, H, T]
    dc_buf proj;         // [B, T, D] attention branch output (before gating)
    dc_buf x_mid;        // [B, T, D] stream after the attention branch
    dc_buf fc1, act;     // [B, T, F] fc1 output and its GELU
    dc_buf fc2;          // [B, T, D] mlp branch output (before gating)
} block_acts;

struct dc_dit_acts {
    void *base;
    bool training;
    dc_buf y;            // [B] int32 labels of the last forward (backward reads them)
    dc_buf patches;      // [B, T, P]
    dc_buf tfreq;        // [B, 256]
    dc_buf th, ta, temb; // [B, D] t-MLP hidden, its SiLU, output
    dc_buf yemb;         // [B, D]
    dc_buf c, silu_c;    // [B, D] conditioning and SiLU(c) (shared by every adaLN)
    block_acts *blocks;  // [L] when training (recomputed blocks: x_in only), [1] otherwise
    block_acts redo;     // training with recompute: a recomputed block's activations (x_in unused)
    dc_buf redo_next;    // [B, T, D] f32: the stream a recomputed block's forward leaves
    int keep;            // blocks with all their activations (the rest recompute)
    dc_buf x_out;        // [B, T, D] stream after the last block
    dc_buf modf;         // [B, 2D]
    dc_buf lnf, meanf, rstdf;  // [B, T, D], [B*T] x2
    dc_buf lin;          // [B, T, OP]
    // backward scratch (training only)
    dc_buf dx, dt1, dt2;       // [B, T, D]
    dc_buf dqkv;               // [B, T, 3D]
    dc_buf df1, df2;           // [B, T, F]
    dc_buf dmod;               // [B, 6D]
    dc_buf dsilu_c, dc, dtmp, dth;  // [B, D]
    dc_buf dlin;               // [B, T, OP]
};

// Registers the modules in official state-dict order: embedders, blocks,
// final layer (checkpoints and the weight initialisation's seeding follow it).
// Each of these is a unit of the parameters (unit 0 the embedders, 1 + l
// block l, depth + 1 the final layer): backward finishes their gradients one
// unit at a time, which sharded training reduces as they come.
static int build_modules(dc_dit *m) {
    const dc_dit_config *c = &m->cfg;
    dc_params *ps = &m->params;
    int D = c->hidden, T = dc_dit_tokens(c), p = c->patch, C = c->in_channels;
    int OP = p * p * dc_dit_out_channels(c), F = c->mlp_hidden;
    dc_dit_modules *md = calloc(1, sizeof *md);
    if (!md || !(md->blocks = calloc((size_t)c->depth, sizeof *md->blocks))) {
        free(md);
        return dc_fail("out of memory");
    }
    m->mods = md;
    if ((md->pos = dc_params_add(ps, "pos_embed", false, 3, 1, T, D)) < 0 ||
        dc_linear_add_patch_conv(ps, &md->x_embed, "x_embedder.proj", C, p, D) ||
        dc_linear_add(ps, &md->t_fc1, "t_embedder.mlp.0", DC_TFREQ, D) ||
        dc_linear_add(ps, &md->t_fc2, "t_embedder.mlp.2", D, D) ||
        dc_embedding_add(ps, &md->y_embed, "y_embedder.embedding_table", c->num_classes + 1, D) ||
        dc_params_end_unit(ps))
        return -1;
    for (int l = 0; l < c->depth; l++) {
        dit_block *k = &md->blocks[l];
        char name[DC_PARAM_NAME_MAX];
#define BLOCK_KEY(leaf) (snprintf(name, sizeof name, "blocks.%d." leaf, l), name)
        if (dc_linear_add(ps, &k->qkv, BLOCK_KEY("attn.qkv"), D, 3 * D) ||
            dc_linear_add(ps, &k->proj, BLOCK_KEY("attn.proj"), D, D) ||
            dc_linear_add(ps, &k->fc1, BLOCK_KEY("mlp.fc1"), D, F) ||
            dc_linear_add(ps, &k->fc2, BLOCK_KEY("mlp.fc2"), F, D) ||
            dc_linear_add(ps, &k->ada, BLOCK_KEY("adaLN_modulation.1"), D, 6 * D) ||
            dc_params_end_unit(ps))
            return -1;
#undef BLOCK_KEY
    }
    if (dc_linear_add(ps, &md->final_linear, "final_layer.linear", D, OP) ||
        dc_linear_add(ps, &md->final_ada, "final_layer.adaLN_modulation.1", D, 2 * D) ||
        dc_params_end_unit(ps))
        return -1;
    ps->forward_uses_units = true;  // dc_dit_forward announces each unit before reading it
    return 0;
}

// E1(E, pos) = [sin(pos w_k) | cos(pos w_k)], w_k = 10000^(-k / (E/2)), k < E/2.
static void sincos_1d(float *out, int E, double pos) {
    int half = E / 2;
    for (int k = 0; k < half; k++) {
        double w = 1.0 / pow(10000.0, (double)k / half);
        out[k] = (float)sin(pos * w);
        out[half + k] = (float)cos(pos * w);
    }
}

// pos_embed[T, D]: the official get_2d_sincos_pos_embed, in float64. The
// first half encodes the column, the second half the row; token n = row * grid + col.
static void pos_embed(float *out, int grid, int D) {
    for (int r = 0; r < grid; r++)
        for (int col = 0; col < grid; col++) {
            float *e = out + ((int64_t)r * grid + col) * D;
            sincos_1d(e, D / 2, col);
            sincos_1d(e + D / 2, D / 2, r);
        }
}

static const dc_model_ops dit_ops;

// The struct and its registered parameters, nothing allocated.
static int setup(dc_dit *m, const dc_dit_config *cfg, dc_backend *be) {
    memset(m, 0, sizeof *m);
    DC_TRY(dc_dit_config_validate(cfg));
    m->cfg = *cfg;
    m->be = be;
    m->keep = -1;  // no recompute
    m->base = (dc_model){
        .ops = &dit_ops, .be = be, .params = &m->params,
        .info = {.channels = cfg->in_channels, .frames = 1, .height = cfg->input_size, .width = cfg->input_size,
                 .out_channels = dc_dit_out_channels(cfg), .learn_sigma = cfg->learn_sigma,
                 .cond = DC_COND_LABELS, .num_classes = cfg->num_classes, .blocks = cfg->depth,
                 .backward_repeats = true},  // (its backward writes only gradients and the recompute set)
    };
    if (build_modules(m)) return dc_dit_free(m), -1;
    return 0;
}

int dc_dit_create(dc_dit *m, const dc_dit_config *cfg, dc_backend *be, dc_grad_mode grad) {
    DC_TRY(setup(m, cfg, be));
    if (dc_params_alloc(&m->params, be, grad)) {
        dc_dit_free(m);
        return -1;
    }
    // pos_embed is fixed: fill it now so every path (init or load) has it.
    int grid = cfg->input_size / cfg->patch, T = grid * grid, D = cfg->hidden;
    float *pos = malloc((size_t)T * D * sizeof *pos);
    if (!pos) return dc_dit_free(m), dc_fail("out of memory");
    pos_embed(pos, grid, D);
    be->upload(be, dc_param_data(&m->params, m->mods->pos).p, pos, (size_t)T * D * sizeof *pos);
    free(pos);
    if (dc_backend_status(be)) return dc_dit_free(m), -1;
    return 0;
}

static void free_acts(dc_dit *m) {
    if (!m->acts) return;
    if (m->acts->base) m->be->free(m->be, m->acts->base);
    free(m->acts->blocks);
    free(m->acts);
    m->acts = NULL;
    m->max_batch = 0;
}

void dc_dit_free(dc_dit *m) {
    free_acts(m);
    dc_params_free(&m->params);
    if (m->mods) free(m->mods->blocks), free(m->mods);
    m->mods = NULL;
}

int dc_dit_init_weights(dc_dit *m, uint64_t seed) {
    dc_params *ps = &m->params;
    const dc_dit_modules *md = m->mods;
    for (int i = 0; i < ps->count; i++) {
        if (i == md->pos) continue;  // fixed, set at creation
        const dc_param *p = &ps->items[i];
        float *h = calloc((size_t)p->numel, sizeof *h);
        if (!h) return dc_fail("out of memory initialising %s", p->name);
        bool zero = strstr(p->name, "adaLN_modulation") || i == md->final_linear.w || i == md->final_linear.b;
        if (!zero && p->ndim >= 2) {
            int64_t fan_out = p->shape[0], fan_in = p->numel / p->shape[0];
            bool normal = i == md->y_embed.table || i == md->t_fc1.w || i == md->t_fc2.w;
            // xavier_uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)); else N(0, 0.02)
            double a = sqrt(6.0 / (double)(fan_in + fan_out));
            for (int64_t j = 0; j < p->numel; j++) {
                if (normal) h[j] = 0.02f * dc_randn_at(seed, (uint32_t)i, 0, DC_STREAM_INIT, (uint32_t)j);
                else {
                    uint32_t u = dc_rand_u32_at(seed, (uint32_t)i, 1, DC_STREAM_INIT, (uint32_t)j);
                    h[j] = (float)((2.0 * dc_u32_to_unit(u) - 1.0) * a);
                }
            }
        }
        m->be->upload(m->be, dc_param_data(ps, i).p, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
    dc_params_touch(ps);
    return dc_backend_status(m->be);
}

// The activations, carved out of one allocation (nn/arena.h). They take the
// backend's compute dtype; the residual stream, its gradient and the saved
// statistics stay fp32 (dc_arena_take32), as under PyTorch autocast.
static void carve(const dc_dit_config *c, dc_arena *ar, dc_dit_acts *a, int B) {
    int64_t T = dc_dit_tokens(c), D = c->hidden, F = c->mlp_hidden, H = c->heads;
    int64_t P = (int64_t)c->patch * c->patch * c->in_channels;
    int64_t OP = (int64_t)c->patch * c->patch * dc_dit_out_channels(c);
    int64_t BTD = B * T * D;
    a->patches = dc_arena_take(ar, B * T * P);
    a->tfreq = dc_arena_take(ar, B * DC_TFREQ);
    a->th = dc_arena_take(ar, B * D), a->ta = dc_arena_take(ar, B * D), a->temb = dc_arena_take(ar, B * D);
    a->yemb = dc_arena_take(ar, B * D), a->c = dc_arena_take(ar, B * D), a->silu_c = dc_arena_take(ar, B * D);
    int nblk = a->training ? c->depth : 1;
    dc_buf stream = a->training ? dc_buf_none() : dc_arena_take32(ar, BTD);  // inference: one stream, in place
    for (int l = 0; l < nblk; l++) {
        block_acts *k = &a->blocks[l];
        if (a->training && l >= a->keep) {  // recomputed: only the stream entering it
            k->x_in = dc_arena_take32(ar, BTD);
            continue;
        }
        k->mod = dc_arena_take(ar, B * 6 * D);
        k->x_in = a->training ? dc_arena_take32(ar, BTD) : stream;
        k->ln1 = dc_arena_take(ar, BTD), k->ln2 = a->training ? dc_arena_take(ar, BTD) : k->ln1;
        k->mean1 = dc_arena_take32(ar, B * T), k->rstd1 = dc_arena_take32(ar, B * T);
        k->mean2 = dc_arena_take32(ar, B * T), k->rstd2 = dc_arena_take32(ar, B * T);
        k->qkv = dc_arena_take(ar, B * T * 3 * D);
        k->att = dc_arena_take(ar, BTD);
        k->lse = dc_arena_take32(ar, B * H * T);
        k->proj = dc_arena_take(ar, BTD);
        k->x_mid = a->training ? dc_arena_take32(ar, BTD) : stream;
        k->fc1 = dc_arena_take(ar, B * T * F);
        k->act = dc_arena_take(ar, B * T * F);
        k->fc2 = dc_arena_take(ar, BTD);
    }
    if (a->training && a->keep < c->depth) {  // one set for whichever block is recomputed
        block_acts *k = &a->redo;
        k->mod = dc_arena_take(ar, B * 6 * D);
        k->ln1 = dc_arena_take(ar, BTD), k->ln2 = dc_arena_take(ar, BTD);
        k->mean1 = dc_arena_take32(ar, B * T), k->rstd1 = dc_arena_take32(ar, B * T);
        k->mean2 = dc_arena_take32(ar, B * T), k->rstd2 = dc_arena_take32(ar, B * T);
        k->qkv = dc_arena_take(ar, B * T * 3 * D);
        k->att = dc_arena_take(ar, BTD);
        k->lse = dc_arena_take32(ar, B * H * T);
        k->proj = dc_arena_take(ar, BTD);
        k->x_mid = dc_arena_take32(ar, BTD);
        k->fc1 = dc_arena_take(ar, B * T * F);
        k->act = dc_arena_take(ar, B * T * F);
        k->fc2 = dc_arena_take(ar, BTD);
        a->redo_next = dc_arena_take32(ar, BTD);
    }
    a->x_out = a->training ? dc_arena_take32(ar, BTD) : stream;
    a->modf = dc_arena_take(ar, B * 2 * D);
    a->lnf = dc_arena_take(ar, BTD), a->meanf = dc_arena_take32(ar, B * T), a->rstdf = dc_arena_take32(ar, B * T);
    a->lin = dc_arena_take(ar, B * T * OP);
    if (!a->training) return;
    a->dx = dc_arena_take32(ar, BTD), a->dt1 = dc_arena_take(ar, BTD), a->dt2 = dc_arena_take(ar, BTD);
    a->dqkv = dc_arena_take(ar, B * T * 3 * D);
    a->df1 = dc_arena_take(ar, B * T * F), a->df2 = dc_arena_take(ar, B * T * F);
    a->dmod = dc_arena_take(ar, B * 6 * D);
    a->dsilu_c = dc_arena_take32(ar, B * D), a->dc = dc_arena_take(ar, B * D), a->dtmp = dc_arena_take(ar, B * D);
    a->dth = dc_arena_take(ar, B * D);
    a->dlin = dc_arena_take(ar, B * T * OP);
}

int dc_dit_set_recompute(dc_dit *m, int keep) {
    if (keep < -1) return dc_fail("recompute: %d blocks keeping their activations", keep);
    if (keep != m->keep) {
        free_acts(m);  // replanned by the next reserve
        m->keep = keep;
    }
    return 0;
}

int dc_dit_reserve(dc_dit *m, int max_batch) {
    if (max_batch < 1) return dc_fail("batch size must be at least 1");
    // Ops index with int: every activation must hold fewer than 2^31 elements.
    const dc_dit_config *c = &m->cfg;
    int64_t T = dc_dit_tokens(c), D = c->hidden, widest = 3 * D;
    int64_t per_token[] = {c->mlp_hidden, (int64_t)c->patch * c->patch * dc_dit_out_channels(c),
                           (int64_t)c->patch * c->patch * c->in_channels, c->heads};
    for (int i = 0; i < 4; i++) widest = per_token[i] > widest ? per_token[i] : widest;
    if ((int64_t)max_batch * T * widest > INT32_MAX || (int64_t)max_batch * 6 * D > INT32_MAX)
        return dc_fail("batch %d is too large for this model (activations over 2^31 elements)", max_batch);
    if (max_batch > 65535)  // GPU kernels put the sample in a grid dimension of that size
        return dc_fail("batch %d is too large: at most 65535 images per forward (use --micro-batch)", max_batch);
    if (m->acts && m->max_batch >= max_batch) return 0;
    DC_TRY(m->be->reserve(m->be, (int)T, c->hidden / c->heads));
    free_acts(m);
    dc_dit_acts *a = calloc(1, sizeof *a);
    if (!a) return dc_fail("out of memory");
    a->training = dc_params_trains(&m->params);
    a->keep = m->keep < 0 || m->keep > m->cfg.depth ? m->cfg.depth : m->keep;
    a->blocks = calloc(a->training ? m->cfg.depth : 1, sizeof *a->blocks);
    if (!a->blocks) return free(a), dc_fail("out of memory");
    dc_arena ar = dc_arena_counting(m->be->compute);
    carve(&m->cfg, &ar, a, max_batch);
    a->base = m->be->alloc(m->be, ar.used);
    if (!a->base) {
        free(a->blocks), free(a);
        return dc_fail_ctx("activations for batch %d (%.1f MiB)", max_batch, ar.used / 1048576.0);
    }
    ar = dc_arena_over(a->base, m->be->compute);
    carve(&m->cfg, &ar, a, max_batch);
    m->acts = a;
    m->max_batch = max_batch;
    return 0;
}

// Sizes of a batch of B images: T tokens, D hidden, F mlp hidden, H heads,
// p patch, C / OC channels in / out, S image side, Pf / OP features per token
// in / out, BT = B * T rows.
typedef struct { int T, D, F, H, p, C, OC, S, Pf, OP, BT; } dit_dims;

static dit_dims dims_of(const dc_dit_config *c, int B) {
    dit_dims d = {.T = dc_dit_tokens(c), .D = c->hidden, .F = c->mlp_hidden, .H = c->heads,
                  .p = c->patch, .C = c->in_channels, .OC = dc_dit_out_channels(c),
                  .S = c->input_size};
    d.Pf = d.p * d.p * d.C, d.OP = d.p * d.p * d.OC, d.BT = B * d.T;
    return d;
}

// Block l's activations: its own, or (recomputed) the shared set with its input.
static block_acts block_of(const dc_dit_acts *a, int l) {
    if (!a->training) return a->blocks[0];
    if (l < a->keep) return a->blocks[l];
    block_acts k = a->redo;
    k.x_in = a->blocks[l].x_in;
    return k;
}

// One block's forward from k->x_in into the stream `next`, keeping what
// backward reads in k.
static void block_fwd(dc_dit *m, const block_acts *k, const dit_block *w, dc_buf next, int B, const dit_dims *dd,
                      const dc_attn_shape *attn) {
    dc_backend *be = m->be;
    const dc_params *ps = &m->params;
    const dit_dims d = *dd;
    // mod = Linear(SiLU(c)) -> shift, scale, gate (msa), shift, scale, gate (mlp)
    dc_linear_fwd(be, ps, &w->ada, k->mod, m->acts->silu_c, B);
    // x = x + gate_msa * attn(modulate(LN(x), shift_msa, scale_msa))
    be->ln_mod_fwd(be, k->ln1, k->mean1, k->rstd1, k->x_in, k->mod, B, d.T, d.D, 6, 0, 1);
    dc_linear_fwd(be, ps, &w->qkv, k->qkv, k->ln1, d.BT);
    be->attention_fwd(be, k->att, k->lse, k->qkv, dc_buf_at(k->qkv, d.D), dc_buf_at(k->qkv, 2 * d.D), attn);
    dc_linear_fwd(be, ps, &w->proj, k->proj, k->att, d.BT);
    be->gate_res_fwd(be, k->x_mid, k->x_in, k->proj, k->mod, B, d.T, d.D, 6, 2);
    // x = x + gate_mlp * mlp(modulate(LN(x), shift_mlp, scale_mlp))
    be->ln_mod_fwd(be, k->ln2, k->mean2, k->rstd2, k->x_mid, k->mod, B, d.T, d.D, 6, 3, 4);
    dc_linear_gelu_fwd(be, ps, &w->fc1, k->act, k->fc1, k->ln2, d.BT);
    dc_linear_fwd(be, ps, &w->fc2, k->fc2, k->act, d.BT);
    be->gate_res_fwd(be, next, k->x_mid, k->fc2, k->mod, B, d.T, d.D, 6, 5);
}

int dc_dit_forward(dc_dit *m, dc_buf out, dc_buf x, dc_buf t, dc_buf y, int B) {
    if (!m->acts || B > m->max_batch)
        return dc_fail("batch %d exceeds the reserved batch %d", B, m->max_batch);
    dc_backend *be = m->be;
    const dc_dit_config *c = &m->cfg;
    const dc_dit_modules *md = m->mods;
    const dc_params *ps = &m->params;
    dc_dit_acts *a = m->acts;
    const dit_dims d = dims_of(c, B);
    const dc_attn_shape attn = dc_attn_packed(B, d.T, d.D, d.H);  // q, k, v in place in qkv
    dc_params_refresh(&m->params);

    // conditioning: c = t_embedder(t) + y_embedder(y); every adaLN reads SiLU(c)
    DC_TRY(dc_params_unit_use(ps, 0));
    be->timestep_embed(be, a->tfreq, t, B, DC_TFREQ / 2);
    dc_linear_fwd(be, ps, &md->t_fc1, a->th, a->tfreq, B);
    be->silu_fwd(be, a->ta, a->th, (int64_t)B * d.D);
    dc_linear_fwd(be, ps, &md->t_fc2, a->temb, a->ta, B);
    dc_embedding_fwd(be, ps, &md->y_embed, a->yemb, y, B);
    a->y = y;
    be->copy(be, a->c.p, a->temb.p, (size_t)B * d.D * dc_dtype_size(a->c.dt));
    be->axpy(be, a->c, a->yemb, 1.0f, (int64_t)B * d.D);
    be->silu_fwd(be, a->silu_c, a->c, (int64_t)B * d.D);

    // patch embedding (a stride-p conv as a matmul) plus fixed positions
    dc_buf x0 = a->blocks[0].x_in;
    be->patchify(be, a->patches, x, B, d.C, d.S, d.S, d.p);
    dc_linear_fwd(be, ps, &md->x_embed, x0, a->patches, d.BT);
    be->add_rows(be, x0, dc_param_data(ps, md->pos), B, d.T, d.D);

    for (int l = 0; l < c->depth; l++) {
        block_acts k = block_of(a, l);
        dc_buf next = !a->training ? k.x_mid : l + 1 < c->depth ? a->blocks[l + 1].x_in : a->x_out;
        DC_TRY(dc_params_unit_use(ps, 1 + l));
        block_fwd(m, &k, &md->blocks[l], next, B, &d, &attn);
    }

    // final layer: modulate(LN(x), shift, scale) -> Linear -> unpatchify
    DC_TRY(dc_params_unit_use(ps, c->depth + 1));
    dc_linear_fwd(be, ps, &md->final_ada, a->modf, a->silu_c, B);
    be->ln_mod_fwd(be, a->lnf, a->meanf, a->rstdf, a->x_out, a->modf, B, d.T, d.D, 2, 0, 1);
    dc_linear_fwd(be, ps, &md->final_linear, a->lin, a->lnf, d.BT);
    be->unpatchify_fwd(be, out, a->lin, B, d.OC, d.S, d.S, d.p);
    return dc_backend_status(be);  // an op that failed on the device (a host flag: no wait)
}

int dc_dit_backward(dc_dit *m, dc_buf dout, int B) {
    if (!m->acts || !m->acts->training) return dc_fail("backward needs a model created for training");
    if (B > m->max_batch) return dc_fail("batch %d exceeds the reserved batch %d", B, m->max_batch);
    dc_backend *be = m->be;
    const dc_dit_config *c = &m->cfg;
    const dc_dit_modules *md = m->mods;
    dc_params *ps = &m->params;
    dc_dit_acts *a = m->acts;
    const dit_dims d = dims_of(c, B);
    const dc_attn_shape attn = dc_attn_packed(B, d.T, d.D, d.H);
    const int final_unit = c->depth + 1;  // units: embedders, blocks, final layer

    // final layer
    DC_TRY(dc_params_unit_begin(ps, final_unit));
    be->zero(be, a->dsilu_c.p, (size_t)B * d.D * dc_dtype_size(a->dsilu_c.dt));
    be->zero(be, a->dx.p, (size_t)d.BT * d.D * dc_dtype_size(a->dx.dt));
    be->unpatchify_bwd(be, a->dlin, dout, B, d.OC, d.S, d.S, d.p);
    dc_linear_bwd(be, ps, &md->final_linear, a->dt1, a->dlin, a->lnf, d.BT, false);
    be->ln_mod_bwd(be, a->dx, a->dmod, a->dt1, a->x_out, a->meanf, a->rstdf, a->modf, B, d.T, d.D, 2, 0, 1);
    dc_linear_bwd(be, ps, &md->final_ada, a->dsilu_c, a->dmod, a->silu_c, B, true);
    DC_TRY(dc_params_unit_done(ps, final_unit));

    // blocks, last to first; a->dx holds dL/d(stream leaving the block)
    for (int l = c->depth - 1; l >= 0; l--) {
        block_acts kk = block_of(a, l);
        const block_acts *k = &kk;
        const dit_block *w = &md->blocks[l];
        if (l >= a->keep) block_fwd(m, k, w, a->redo_next, B, &d, &attn);  // recompute what backward reads
        DC_TRY(dc_params_unit_begin(ps, 1 + l));
        // mlp branch: stream = x_mid + gate_mlp * fc2(gelu(fc1(ln2)))
        be->gate_res_bwd(be, a->dt1, a->dmod, a->dx, k->fc2, k->mod, B, d.T, d.D, 6, 5);
        dc_linear_bwd_gelu(be, ps, &w->fc2, a->df1, a->dt1, k->act, k->fc1, a->df2, d.BT);
        dc_linear_bwd(be, ps, &w->fc1, a->dt2, a->df1, k->ln2, d.BT, false);
        be->ln_mod_bwd(be, a->dx, a->dmod, a->dt2, k->x_mid, k->mean2, k->rstd2, k->mod, B, d.T, d.D, 6, 3, 4);
        // attention branch: x_mid = x_in + gate_msa * proj(attn(qkv(ln1)))
        be->gate_res_bwd(be, a->dt1, a->dmod, a->dx, k->proj, k->mod, B, d.T, d.D, 6, 2);
        dc_linear_bwd(be, ps, &w->proj, a->dt2, a->dt1, k->att, d.BT, false);
        be->attention_bwd(be, a->dqkv, dc_buf_at(a->dqkv, d.D), dc_buf_at(a->dqkv, 2 * d.D), a->dt2,
                          k->qkv, dc_buf_at(k->qkv, d.D), dc_buf_at(k->qkv, 2 * d.D), k->att, k->lse,
                          &attn);
        dc_linear_bwd(be, ps, &w->qkv, a->dt1, a->dqkv, k->ln1, d.BT, false);
        be->ln_mod_bwd(be, a->dx, a->dmod, a->dt1, k->x_in, k->mean1, k->rstd1, k->mod, B, d.T, d.D, 6, 0, 1);
        // adaLN modulation of this block
        dc_linear_bwd(be, ps, &w->ada, a->dsilu_c, a->dmod, a->silu_c, B, true);
        DC_TRY(dc_params_unit_done(ps, 1 + l));
    }

    // patch embedding (pos_embed is fixed); the fp32 stream gradient is cast
    // to the patches' dtype for the matrix product
    DC_TRY(dc_params_unit_begin(ps, 0));
    be->cast(be, a->dt1, a->dx, (int64_t)d.BT * d.D);
    dc_linear_bwd(be, ps, &md->x_embed, dc_buf_none(), a->dt1, a->patches, d.BT, false);
    // conditioning: dc = SiLU'(c) dsilu_c flows to both embedders
    be->silu_bwd(be, a->dc, a->dsilu_c, a->c, (int64_t)B * d.D, false);
    dc_embedding_bwd(be, ps, &md->y_embed, a->dc, a->y, B);
    dc_linear_bwd(be, ps, &md->t_fc2, a->dtmp, a->dc, a->ta, B, false);
    be->silu_bwd(be, a->dth, a->dtmp, a->th, (int64_t)B * d.D, false);
    dc_linear_bwd(be, ps, &md->t_fc1, dc_buf_none(), a->dth, a->tfreq, B, false);
    DC_TRY(dc_params_unit_done(ps, 0));
    return dc_backend_status(be);
}

// ---- the DiT as a dc_model

static dc_dit *dit(dc_model *m) { return (dc_dit *)m; }  // base is the first member

static int dit_reserve(dc_model *m, int max_batch) { return dc_dit_reserve(dit(m), max_batch); }

static int dit_forward(dc_model *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    if (!cond->y.p) return dc_fail("a DiT is conditioned on class labels, and none were given");
    return dc_dit_forward(dit(m), out, x, t, cond->y, B);
}

static int dit_backward(dc_model *m, dc_buf dout, int B) { return dc_dit_backward(dit(m), dout, B); }

static int dit_init(dc_model *m, uint64_t seed) { return dc_dit_init_weights(dit(m), seed); }

static double dit_macs(const dc_model *m) { return dc_dit_macs_per_image(&((const dc_dit *)m)->cfg); }

static int dit_config_kv(const dc_model *m, dc_kv *kv) {
    return dc_dit_config_to_kv(&((const dc_dit *)m)->cfg, kv);
}

static void dit_release(dc_model *m) { dc_dit_free(dit(m)); }

static int dit_set_recompute(dc_model *m, int keep) { return dc_dit_set_recompute(dit(m), keep); }

// The arena a training reserve plans (carve), counted without allocating.
static int64_t dit_activation_bytes(const dc_model *mm, dc_dtype compute, int max_batch, int keep, bool selective) {
    (void)selective;  // (dc_model_activation_bytes refuses it: no set_selective)
    const dc_dit *m = (const dc_dit *)mm;
    const int depth = m->cfg.depth;
    dc_dit_acts a = {0};
    a.training = true;
    a.keep = keep < 0 || keep > depth ? depth : keep;
    if (max_batch < 1 || !(a.blocks = calloc((size_t)depth, sizeof *a.blocks))) return -1;
    dc_arena ar = dc_arena_counting(compute);
    carve(&m->cfg, &ar, &a, max_batch);
    free(a.blocks);
    return (int64_t)ar.used;
}

static void dit_describe(const dc_model *mm, char *buf, size_t n) {
    const dc_dit_config *c = &((const dc_dit *)mm)->cfg;
    snprintf(buf, n,
             "DiT depth %d, hidden %d, heads %d, patch %d, input %dx%dx%d\n"
             "%d classes (+1 null), mlp %d, learn_sigma %s, %d tokens",
             c->depth, c->hidden, c->heads, c->patch, c->input_size, c->input_size, c->in_channels, c->num_classes,
             c->mlp_hidden, c->learn_sigma ? "yes" : "no", dc_dit_tokens(c));
}

static const dc_model_ops dit_ops = {
    .name = "DiT", .reserve = dit_reserve, .forward = dit_forward, .backward = dit_backward,
    .config_to_kv = dit_config_kv, .init_weights = dit_init, .macs_per_image = dit_macs,
    .describe = dit_describe, .set_recompute = dit_set_recompute, .activation_bytes = dit_activation_bytes,
    .release = dit_release,
};

dc_dit *dc_dit_of(dc_model *m) { return m && m->ops == &dit_ops ? dit(m) : NULL; }

int dc_dit_new(const dc_dit_config *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out) {
    *out = NULL;
    dc_dit *m = malloc(sizeof *m);
    if (!m) return dc_fail("out of memory");
    if (be ? dc_dit_create(m, cfg, be, grad) : setup(m, cfg, NULL)) return free(m), -1;
    m->base.owned = true;
    *out = &m->base;
    return 0;
}

