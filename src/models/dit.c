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

#define DC_TFREQ 256  // timestep frequency embedding size (official)

// Parameter indices of one block, in official state-dict order.
typedef struct { int qkv_w, qkv_b, proj_w, proj_b, fc1_w, fc1_b, fc2_w, fc2_b, ada_w, ada_b; } block_ids;

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
    block_acts *blocks;  // [L] when training, [1] otherwise
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

typedef struct {
    int pos, xe_w, xe_b, t0_w, t0_b, t2_w, t2_b, ytab;
    int fl_w, fl_b, fada_w, fada_b;
} dit_ids;

// Parameter indices follow from the fixed registration order (official
// state-dict order): 8 embedding tensors, 10 per block, 4 for the final layer.
static dit_ids ids_of(const dc_dit *m) {
    dit_ids id;
    int L = m->cfg.depth;
    id.pos = 0, id.xe_w = 1, id.xe_b = 2, id.t0_w = 3, id.t0_b = 4, id.t2_w = 5, id.t2_b = 6;
    id.ytab = 7;
    int f = 8 + 10 * L;
    id.fl_w = f, id.fl_b = f + 1, id.fada_w = f + 2, id.fada_b = f + 3;
    return id;
}

static block_ids block_of(int l) {
    int b = 8 + 10 * l;
    return (block_ids){b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7, b + 8, b + 9};
}

static int register_params(dc_dit *m) {
    const dc_dit_config *c = &m->cfg;
    dc_params *ps = &m->params;
    int D = c->hidden, T = dc_dit_tokens(c), p = c->patch, C = c->in_channels;
    int OP = p * p * dc_dit_out_channels(c), F = c->mlp_hidden;
    char name[DC_PARAM_NAME_MAX];
    int ok = 1;
    ok &= dc_params_add(ps, "pos_embed", false, 3, 1, T, D) >= 0;
    ok &= dc_params_add(ps, "x_embedder.proj.weight", true, 4, D, C, p, p) >= 0;
    ok &= dc_params_add(ps, "x_embedder.proj.bias", true, 1, D) >= 0;
    ok &= dc_params_add(ps, "t_embedder.mlp.0.weight", true, 2, D, DC_TFREQ) >= 0;
    ok &= dc_params_add(ps, "t_embedder.mlp.0.bias", true, 1, D) >= 0;
    ok &= dc_params_add(ps, "t_embedder.mlp.2.weight", true, 2, D, D) >= 0;
    ok &= dc_params_add(ps, "t_embedder.mlp.2.bias", true, 1, D) >= 0;
    ok &= dc_params_add(ps, "y_embedder.embedding_table.weight", true, 2, c->num_classes + 1, D) >= 0;
    for (int l = 0; l < c->depth && ok; l++) {
        static const char *k_names[10] = {
            "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
            "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
            "adaLN_modulation.1.weight", "adaLN_modulation.1.bias"};
        const int rows[10] = {3 * D, 3 * D, D, D, F, F, D, D, 6 * D, 6 * D};
        const int cols[10] = {D, 0, D, 0, D, 0, F, 0, D, 0};
        for (int k = 0; k < 10; k++) {
            snprintf(name, sizeof name, "blocks.%d.%s", l, k_names[k]);
            ok &= (cols[k] ? dc_params_add(ps, name, true, 2, rows[k], cols[k])
                           : dc_params_add(ps, name, true, 1, rows[k])) >= 0;
        }
    }
    ok &= dc_params_add(ps, "final_layer.linear.weight", true, 2, OP, D) >= 0;
    ok &= dc_params_add(ps, "final_layer.linear.bias", true, 1, OP) >= 0;
    ok &= dc_params_add(ps, "final_layer.adaLN_modulation.1.weight", true, 2, 2 * D, D) >= 0;
    ok &= dc_params_add(ps, "final_layer.adaLN_modulation.1.bias", true, 1, 2 * D) >= 0;
    return ok ? 0 : -1;
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

int dc_dit_create(dc_dit *m, const dc_dit_config *cfg, dc_backend *be, bool with_grad) {
    memset(m, 0, sizeof *m);
    DC_TRY(dc_dit_config_validate(cfg));
    m->cfg = *cfg;
    m->be = be;
    if (register_params(m) || dc_params_alloc(&m->params, be, with_grad)) {
        dc_dit_free(m);
        return -1;
    }
    // pos_embed is fixed: fill it now so every path (init or load) has it.
    int grid = cfg->input_size / cfg->patch, T = grid * grid, D = cfg->hidden;
    float *pos = malloc((size_t)T * D * sizeof *pos);
    if (!pos) return dc_dit_free(m), dc_fail("out of memory");
    pos_embed(pos, grid, D);
    be->upload(be, dc_param_data(&m->params, 0).p, pos, (size_t)T * D * sizeof *pos);
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
}

int dc_dit_init_weights(dc_dit *m, uint64_t seed) {
    dc_params *ps = &m->params;
    dit_ids id = ids_of(m);
    for (int i = 1; i < ps->count; i++) {  // 0 is pos_embed, already set
        const dc_param *p = &ps->items[i];
        float *h = calloc((size_t)p->numel, sizeof *h);
        if (!h) return dc_fail("out of memory initialising %s", p->name);
        bool zero = strstr(p->name, "adaLN_modulation") || i == id.fl_w || i == id.fl_b;
        if (!zero && p->ndim >= 2) {
            int64_t fan_out = p->shape[0], fan_in = p->numel / p->shape[0];
            bool normal = i == id.ytab || i == id.t0_w || i == id.t2_w;
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

// Carves named activation buffers out of one allocation. The first pass
// (base == NULL) only counts bytes. Activations take the backend's compute
// dtype; the residual stream, its gradient and the saved statistics stay
// fp32 (take32), as under PyTorch autocast.
typedef struct { char *base; size_t used; dc_dtype dt; } carver;
static dc_buf take_dt(carver *cv, int64_t n, dc_dtype dt) {
    size_t bytes = ((size_t)n * dc_dtype_size(dt) + 255) & ~(size_t)255;
    dc_buf b = {cv->base ? cv->base + cv->used : NULL, dt};
    cv->used += bytes;
    return b;
}
static dc_buf take(carver *cv, int64_t n) { return take_dt(cv, n, cv->dt); }
static dc_buf take32(carver *cv, int64_t n) { return take_dt(cv, n, DC_F32); }

static void carve(dc_dit *m, carver *cv, dc_dit_acts *a, int B) {
    const dc_dit_config *c = &m->cfg;
    int64_t T = dc_dit_tokens(c), D = c->hidden, F = c->mlp_hidden, H = c->heads;
    int64_t P = (int64_t)c->patch * c->patch * c->in_channels;
    int64_t OP = (int64_t)c->patch * c->patch * dc_dit_out_channels(c);
    int64_t BTD = B * T * D;
    a->patches = take(cv, B * T * P);
    a->tfreq = take(cv, B * DC_TFREQ);
    a->th = take(cv, B * D), a->ta = take(cv, B * D), a->temb = take(cv, B * D);
    a->yemb = take(cv, B * D), a->c = take(cv, B * D), a->silu_c = take(cv, B * D);
    int nblk = a->training ? c->depth : 1;
    dc_buf stream = a->training ? dc_buf_none() : take32(cv, BTD);  // inference: one stream, in place
    for (int l = 0; l < nblk; l++) {
        block_acts *k = &a->blocks[l];
        k->mod = take(cv, B * 6 * D);
        k->x_in = a->training ? take32(cv, BTD) : stream;
        k->ln1 = take(cv, BTD), k->ln2 = a->training ? take(cv, BTD) : k->ln1;
        k->mean1 = take32(cv, B * T), k->rstd1 = take32(cv, B * T);
        k->mean2 = take32(cv, B * T), k->rstd2 = take32(cv, B * T);
        k->qkv = take(cv, B * T * 3 * D);
        k->att = take(cv, BTD);
        k->lse = take32(cv, B * H * T);
        k->proj = take(cv, BTD);
        k->x_mid = a->training ? take32(cv, BTD) : stream;
        k->fc1 = take(cv, B * T * F);
        k->act = take(cv, B * T * F);
        k->fc2 = take(cv, BTD);
    }
    a->x_out = a->training ? take32(cv, BTD) : stream;
    a->modf = take(cv, B * 2 * D);
    a->lnf = take(cv, BTD), a->meanf = take32(cv, B * T), a->rstdf = take32(cv, B * T);
    a->lin = take(cv, B * T * OP);
    if (!a->training) return;
    a->dx = take32(cv, BTD), a->dt1 = take(cv, BTD), a->dt2 = take(cv, BTD);
    a->dqkv = take(cv, B * T * 3 * D);
    a->df1 = take(cv, B * T * F), a->df2 = take(cv, B * T * F);
    a->dmod = take(cv, B * 6 * D);
    a->dsilu_c = take32(cv, B * D), a->dc = take(cv, B * D), a->dtmp = take(cv, B * D);
    a->dth = take(cv, B * D);
    a->dlin = take(cv, B * T * OP);
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
    a->training = m->params.grad.p != NULL;
    a->blocks = calloc(a->training ? m->cfg.depth : 1, sizeof *a->blocks);
    if (!a->blocks) return free(a), dc_fail("out of memory");
    carver cv = {NULL, 0, m->be->compute};
    carve(m, &cv, a, max_batch);
    a->base = m->be->alloc(m->be, cv.used);
    if (!a->base) {
        free(a->blocks), free(a);
        return dc_fail_ctx("activations for batch %d (%.1f MiB)", max_batch, cv.used / 1048576.0);
    }
    cv = (carver){a->base, 0, m->be->compute};
    carve(m, &cv, a, max_batch);
    m->acts = a;
    m->max_batch = max_batch;
    return 0;
}

// Weights as the matrix products read them (the compute copy), gradients fp32.
static dc_buf P(const dc_dit *m, int i) { return dc_param_w(&m->params, i); }
static dc_buf G(const dc_dit *m, int i) { return dc_param_grad(&m->params, i); }

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

int dc_dit_forward(dc_dit *m, dc_buf out, dc_buf x, dc_buf t, dc_buf y, int B) {
    if (!m->acts || B > m->max_batch)
        return dc_fail("batch %d exceeds the reserved batch %d", B, m->max_batch);
    dc_backend *be = m->be;
    const dc_dit_config *c = &m->cfg;
    dc_dit_acts *a = m->acts;
    const dit_dims d = dims_of(c, B);
    dit_ids id = ids_of(m);
    dc_params_refresh(&m->params);

    // conditioning: c = t_embedder(t) + y_embedder(y); every adaLN reads SiLU(c)
    be->timestep_embed(be, a->tfreq, t, B, DC_TFREQ / 2);
    be->linear_fwd(be, a->th, a->tfreq, P(m, id.t0_w), P(m, id.t0_b), B, DC_TFREQ, d.D);
    be->silu_fwd(be, a->ta, a->th, (int64_t)B * d.D);
    be->linear_fwd(be, a->temb, a->ta, P(m, id.t2_w), P(m, id.t2_b), B, d.D, d.D);
    be->embed_fwd(be, a->yemb, P(m, id.ytab), y, B, d.D);
    a->y = y;
    be->copy(be, a->c.p, a->temb.p, (size_t)B * d.D * dc_dtype_size(a->c.dt));
    be->axpy(be, a->c, a->yemb, 1.0f, (int64_t)B * d.D);
    be->silu_fwd(be, a->silu_c, a->c, (int64_t)B * d.D);

    // patch embedding (a stride-p conv as a matmul) plus fixed positions
    dc_buf x0 = a->blocks[0].x_in;
    be->patchify(be, a->patches, x, B, d.C, d.S, d.S, d.p);
    be->linear_fwd(be, x0, a->patches, P(m, id.xe_w), P(m, id.xe_b), d.BT, d.Pf, d.D);
    be->add_rows(be, x0, dc_param_data(&m->params, id.pos), B, d.T, d.D);

    for (int l = 0; l < c->depth; l++) {
        block_acts *k = &a->blocks[a->training ? l : 0];
        block_ids w = block_of(l);
        // mod = Linear(SiLU(c)) -> shift, scale, gate (msa), shift, scale, gate (mlp)
        be->linear_fwd(be, k->mod, a->silu_c, P(m, w.ada_w), P(m, w.ada_b), B, d.D, 6 * d.D);
        // x = x + gate_msa * attn(modulate(LN(x), shift_msa, scale_msa))
        be->ln_mod_fwd(be, k->ln1, k->mean1, k->rstd1, k->x_in, k->mod, B, d.T, d.D, 6, 0, 1);
        be->linear_fwd(be, k->qkv, k->ln1, P(m, w.qkv_w), P(m, w.qkv_b), d.BT, d.D, 3 * d.D);
        be->attn_fwd(be, k->att, k->lse, k->qkv, B, d.T, d.D, d.H);
        be->linear_fwd(be, k->proj, k->att, P(m, w.proj_w), P(m, w.proj_b), d.BT, d.D, d.D);
        be->gate_res_fwd(be, k->x_mid, k->x_in, k->proj, k->mod, B, d.T, d.D, 6, 2);
        // x = x + gate_mlp * mlp(modulate(LN(x), shift_mlp, scale_mlp))
        be->ln_mod_fwd(be, k->ln2, k->mean2, k->rstd2, k->x_mid, k->mod, B, d.T, d.D, 6, 3, 4);
        be->linear_gelu_fwd(be, k->act, k->fc1, k->ln2, P(m, w.fc1_w), P(m, w.fc1_b), d.BT, d.D, d.F);
        be->linear_fwd(be, k->fc2, k->act, P(m, w.fc2_w), P(m, w.fc2_b), d.BT, d.F, d.D);
        dc_buf next = !a->training ? k->x_mid : l + 1 < c->depth ? a->blocks[l + 1].x_in : a->x_out;
        be->gate_res_fwd(be, next, k->x_mid, k->fc2, k->mod, B, d.T, d.D, 6, 5);
    }

    // final layer: modulate(LN(x), shift, scale) -> Linear -> unpatchify
    be->linear_fwd(be, a->modf, a->silu_c, P(m, id.fada_w), P(m, id.fada_b), B, d.D, 2 * d.D);
    be->ln_mod_fwd(be, a->lnf, a->meanf, a->rstdf, a->x_out, a->modf, B, d.T, d.D, 2, 0, 1);
    be->linear_fwd(be, a->lin, a->lnf, P(m, id.fl_w), P(m, id.fl_b), d.BT, d.D, d.OP);
    be->unpatchify_fwd(be, out, a->lin, B, d.OC, d.S, d.S, d.p);
    return dc_backend_status(be);  // an op that failed on the device (a host flag: no wait)
}

int dc_dit_backward(dc_dit *m, dc_buf dout, int B) {
    if (!m->acts || !m->acts->training) return dc_fail("backward needs a model created for training");
    if (B > m->max_batch) return dc_fail("batch %d exceeds the reserved batch %d", B, m->max_batch);
    dc_backend *be = m->be;
    const dc_dit_config *c = &m->cfg;
    dc_dit_acts *a = m->acts;
    const dit_dims d = dims_of(c, B);
    dit_ids id = ids_of(m);

    // final layer
    be->zero(be, a->dsilu_c.p, (size_t)B * d.D * dc_dtype_size(a->dsilu_c.dt));
    be->zero(be, a->dx.p, (size_t)d.BT * d.D * dc_dtype_size(a->dx.dt));
    be->unpatchify_bwd(be, a->dlin, dout, B, d.OC, d.S, d.S, d.p);
    be->linear_bwd(be, a->dt1, G(m, id.fl_w), G(m, id.fl_b), a->dlin, a->lnf, P(m, id.fl_w), d.BT, d.D, d.OP, false);
    be->ln_mod_bwd(be, a->dx, a->dmod, a->dt1, a->x_out, a->meanf, a->rstdf, a->modf, B, d.T, d.D, 2, 0, 1);
    be->linear_bwd(be, a->dsilu_c, G(m, id.fada_w), G(m, id.fada_b), a->dmod, a->silu_c,
                   P(m, id.fada_w), B, d.D, 2 * d.D, true);

    // blocks, last to first; a->dx holds dL/d(stream leaving the block)
    for (int l = c->depth - 1; l >= 0; l--) {
        block_acts *k = &a->blocks[l];
        block_ids w = block_of(l);
        // mlp branch: stream = x_mid + gate_mlp * fc2(gelu(fc1(ln2)))
        be->gate_res_bwd(be, a->dt1, a->dmod, a->dx, k->fc2, k->mod, B, d.T, d.D, 6, 5);
        be->linear_bwd_gelu(be, a->df1, G(m, w.fc2_w), G(m, w.fc2_b), a->dt1, k->act, P(m, w.fc2_w), k->fc1,
                            a->df2, d.BT, d.F, d.D);
        be->linear_bwd(be, a->dt2, G(m, w.fc1_w), G(m, w.fc1_b), a->df1, k->ln2, P(m, w.fc1_w), d.BT, d.D, d.F, false);
        be->ln_mod_bwd(be, a->dx, a->dmod, a->dt2, k->x_mid, k->mean2, k->rstd2, k->mod, B, d.T, d.D, 6, 3, 4);
        // attention branch: x_mid = x_in + gate_msa * proj(attn(qkv(ln1)))
        be->gate_res_bwd(be, a->dt1, a->dmod, a->dx, k->proj, k->mod, B, d.T, d.D, 6, 2);
        be->linear_bwd(be, a->dt2, G(m, w.proj_w), G(m, w.proj_b), a->dt1, k->att, P(m, w.proj_w), d.BT, d.D, d.D, false);
        be->attn_bwd(be, a->dqkv, a->dt2, k->qkv, k->att, k->lse, B, d.T, d.D, d.H);
        be->linear_bwd(be, a->dt1, G(m, w.qkv_w), G(m, w.qkv_b), a->dqkv, k->ln1, P(m, w.qkv_w), d.BT, d.D, 3 * d.D, false);
        be->ln_mod_bwd(be, a->dx, a->dmod, a->dt1, k->x_in, k->mean1, k->rstd1, k->mod, B, d.T, d.D, 6, 0, 1);
        // adaLN modulation of this block
        be->linear_bwd(be, a->dsilu_c, G(m, w.ada_w), G(m, w.ada_b), a->dmod, a->silu_c,
                       P(m, w.ada_w), B, d.D, 6 * d.D, true);
    }

    // patch embedding (pos_embed is fixed); the fp32 stream gradient is cast
    // to the patches' dtype for the matrix product
    be->cast(be, a->dt1, a->dx, (int64_t)d.BT * d.D);
    be->linear_bwd(be, dc_buf_none(), G(m, id.xe_w), G(m, id.xe_b), a->dt1, a->patches,
                   P(m, id.xe_w), d.BT, d.Pf, d.D, false);
    // conditioning: dc = SiLU'(c) dsilu_c flows to both embedders
    be->silu_bwd(be, a->dc, a->dsilu_c, a->c, (int64_t)B * d.D, false);
    be->embed_bwd(be, G(m, id.ytab), a->dc, a->y, B, d.D);
    be->linear_bwd(be, a->dtmp, G(m, id.t2_w), G(m, id.t2_b), a->dc, a->ta, P(m, id.t2_w), B, d.D, d.D, false);
    be->silu_bwd(be, a->dth, a->dtmp, a->th, (int64_t)B * d.D, false);
    be->linear_bwd(be, dc_buf_none(), G(m, id.t0_w), G(m, id.t0_b), a->dth, a->tfreq,
                   P(m, id.t0_w), B, DC_TFREQ, d.D, false);
    return dc_backend_status(be);
}
