// The CUDA backend against the CPU backend: every op on fresh random inputs,
// in both GPU modes (fp32 for checking, bf16 mixed precision), then a whole
// DiT forward and backward. Buffers get the dtypes the model gives them (the
// residual stream and statistics fp32, activations in the compute dtype);
// the CPU reference reads the same values, rounded to bf16 where the GPU's
// input is bf16, so the error measured is the GPU's own arithmetic.
//
// Error: ||gpu - cpu|| / ||cpu|| per output; NaN fails. Tolerances per mode.
// Skips (exit 0, with a message) where no GPU is present. The "errors" group
// provokes failures (memory, dtypes, head size, a failing graph) and checks
// that each comes back as an error with its cause, never an abort.
//
//   build/tests/test_cuda [seed] [all | groups: linear,pointwise,adaln,attention,diffusion,conv,norm,latent,
//                                        model,errors]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "cuda_pair.h"
#include "diffusion/sampler.h"
#include "models/dit.h"

static double g_tol;   // for results computed in the compute dtype
static int g_fail, g_count;

static double compare(const char *name, pair p, double tol) {
    float *c = malloc(p.n * 4), *g = get_gpu(p);
    g_cpu->download(g_cpu, c, p.c.p, p.n * 4);
    double num = 0, den = 0;
    int64_t nan = 0;
    for (int64_t i = 0; i < p.n; i++) {
        if (!isfinite(g[i]) || !isfinite(c[i])) { nan++; continue; }
        num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        den += (double)c[i] * c[i];
    }
    double err = nan ? INFINITY : sqrt(num / (den > 0 ? den : 1e-300));
    bool ok = err <= tol;
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %-34s err %.2e  (tol %.0e)%s\n", ok ? "ok" : "FAIL", name, err, tol,
           nan ? "  NaN or unwritten values" : "");
    free(c), free(g);
    return err;
}

static void release(void) {
    for (int i = 0; i < g_nallocs; i++) {
        g_cpu->free(g_cpu, g_allocs[i][0]);
        g_gpu->free(g_gpu, g_allocs[i][1]);
    }
    g_nallocs = 0;
}

// ---- ops ---------------------------------------------------------------------------------
// A view `off` elements into a pair (weights and biases are slices of one flat
// buffer, at any offset).
static pair offset(pair p, int64_t off) {
    return (pair){dc_buf_at(p.c, off), dc_buf_at(p.g, off), p.n - off};
}

// off > 0 puts the weight and bias at unaligned offsets
static void test_linear(int M, int K, int N, bool out32, int off) {
    char name[96];
    dc_dtype ot = out32 ? DC_F32 : g_ct;
    pair x = rand_pair((int64_t)M * K, g_ct, -1, 1), w = offset(rand_pair((int64_t)N * K + off, g_ct, -0.1, 0.1), off);
    pair b = offset(rand_pair(N + off, g_ct, -1, 1), off), out = nan_pair((int64_t)M * N, ot);
    g_cpu->linear_fwd(g_cpu, out.c, x.c, w.c, b.c, M, K, N);
    g_gpu->linear_fwd(g_gpu, out.g, x.g, w.g, b.g, M, K, N);
    snprintf(name, sizeof name, "linear_fwd %dx%dx%d%s%s", M, K, N, out32 ? " (fp32 out)" : "",
             off ? " (w, b unaligned)" : "");
    compare(name, out, out32 && g_ct == DC_F32 ? 1e-5 : g_tol);
    // backward: dinp accumulated in fp32 (dsilu_c style) or written in compute
    pair dout = rand_pair((int64_t)M * N, g_ct, -1, 1);
    pair dinp = out32 ? rand_pair((int64_t)M * K, DC_F32, -1, 1) : nan_pair((int64_t)M * K, g_ct);
    pair dw = rand_pair((int64_t)N * K, DC_F32, -1, 1), db = rand_pair(N, DC_F32, -1, 1);
    g_cpu->linear_bwd(g_cpu, dinp.c, dw.c, db.c, dout.c, x.c, w.c, M, K, N, out32);
    g_gpu->linear_bwd(g_gpu, dinp.g, dw.g, db.g, dout.g, x.g, w.g, M, K, N, out32);
    snprintf(name, sizeof name, "linear_bwd dinp%s", out32 ? " (fp32 +=)" : "");
    compare(name, dinp, out32 ? 1e-4 : g_tol);
    compare("linear_bwd dw (fp32 +=)", dw, g_ct == DC_F32 ? 1e-5 : 1e-3);
    compare("linear_bwd db (fp32 +=)", db, 1e-5);
    release();
}

// fc1 + GELU and its backward through fc2 (fused epilogues on the GPU)
static void test_mlp(int M, int D, int F) {
    pair x = rand_pair((int64_t)M * D, g_ct, -1, 1), w1 = rand_pair((int64_t)F * D, g_ct, -0.1, 0.1);
    pair b1 = rand_pair(F, g_ct, -1, 1), act = nan_pair((int64_t)M * F, g_ct), pre = nan_pair((int64_t)M * F, g_ct);
    g_cpu->linear_gelu_fwd(g_cpu, act.c, pre.c, x.c, w1.c, b1.c, M, D, F);
    g_gpu->linear_gelu_fwd(g_gpu, act.g, pre.g, x.g, w1.g, b1.g, M, D, F);
    compare("linear_gelu_fwd pre", pre, g_tol);
    compare("linear_gelu_fwd gelu", act, g_tol);
    // backward from the CPU's forward values
    float *h = malloc((size_t)M * F * 4);
    g_cpu->download(g_cpu, h, pre.c.p, (size_t)M * F * 4), put(pre, h);
    g_cpu->download(g_cpu, h, act.c.p, (size_t)M * F * 4), put(act, h);
    free(h);
    pair w2 = rand_pair((int64_t)D * F, g_ct, -0.1, 0.1), dout = rand_pair((int64_t)M * D, g_ct, -1, 1);
    pair dpre = nan_pair((int64_t)M * F, g_ct), scr = nan_pair((int64_t)M * F, g_ct);
    pair dw = rand_pair((int64_t)D * F, DC_F32, -1, 1), db = rand_pair(D, DC_F32, -1, 1);
    g_cpu->linear_bwd_gelu(g_cpu, dpre.c, dw.c, db.c, dout.c, act.c, w2.c, pre.c, scr.c, M, F, D);
    g_gpu->linear_bwd_gelu(g_gpu, dpre.g, dw.g, db.g, dout.g, act.g, w2.g, pre.g, scr.g, M, F, D);
    compare("linear_bwd_gelu dpre", dpre, g_tol);
    compare("linear_bwd_gelu dw (fp32 +=)", dw, g_ct == DC_F32 ? 1e-5 : 1e-3);
    compare("linear_bwd_gelu db (fp32 +=)", db, 1e-5);
    release();
}

static void test_pointwise(void) {
    const int64_t n = 300007;
    pair x = rand_pair(n, g_ct, -4, 4), dout = rand_pair(n, g_ct, -1, 1);
    pair o = nan_pair(n, g_ct), d = nan_pair(n, g_ct), acc = rand_pair(n, DC_F32, -1, 1);
    g_cpu->gelu_fwd(g_cpu, o.c, x.c, n), g_gpu->gelu_fwd(g_gpu, o.g, x.g, n);
    compare("gelu_fwd", o, g_tol);
    g_cpu->gelu_bwd(g_cpu, d.c, dout.c, x.c, n), g_gpu->gelu_bwd(g_gpu, d.g, dout.g, x.g, n);
    compare("gelu_bwd", d, g_tol);
    g_cpu->silu_fwd(g_cpu, o.c, x.c, n), g_gpu->silu_fwd(g_gpu, o.g, x.g, n);
    compare("silu_fwd", o, g_tol);
    g_cpu->silu_bwd(g_cpu, acc.c, dout.c, x.c, n, true), g_gpu->silu_bwd(g_gpu, acc.g, dout.g, x.g, n, true);
    compare("silu_bwd (fp32 +=)", acc, 1e-5);
    g_cpu->axpy(g_cpu, acc.c, x.c, 0.37f, n), g_gpu->axpy(g_gpu, acc.g, x.g, 0.37f, n);
    compare("axpy", acc, 1e-6);
    const int B = 3, T = 64, D = 96;
    pair s = rand_pair((int64_t)B * T * D, DC_F32, -2, 2), pos = rand_pair((int64_t)T * D, DC_F32, -1, 1);
    g_cpu->add_rows(g_cpu, s.c, pos.c, B, T, D), g_gpu->add_rows(g_gpu, s.g, pos.g, B, T, D);
    compare("add_rows", s, 1e-6);
    pair src = rand_pair(n, DC_F32, -3, 3), cst = nan_pair(n, g_ct);
    g_cpu->cast(g_cpu, cst.c, src.c, n), g_gpu->cast(g_gpu, cst.g, src.g, n);
    compare("cast fp32 -> compute", cst, g_ct == DC_F32 ? 0 : 4e-3);
    release();
}

static void test_adaln(int B, int T, int D) {
    char name[96];
    const int nch = 6;
    int64_t BTD = (int64_t)B * T * D;
    pair x = rand_pair(BTD, DC_F32, -3, 5), mod = rand_pair((int64_t)B * nch * D, g_ct, -1, 1);
    pair out = nan_pair(BTD, g_ct), mean = nan_pair((int64_t)B * T, DC_F32), rstd = nan_pair((int64_t)B * T, DC_F32);
    g_cpu->ln_mod_fwd(g_cpu, out.c, mean.c, rstd.c, x.c, mod.c, B, T, D, nch, 3, 4);
    g_gpu->ln_mod_fwd(g_gpu, out.g, mean.g, rstd.g, x.g, mod.g, B, T, D, nch, 3, 4);
    snprintf(name, sizeof name, "ln_mod_fwd B%d T%d D%d", B, T, D);
    compare(name, out, g_tol);
    compare("ln_mod_fwd mean", mean, 1e-5);
    compare("ln_mod_fwd rstd", rstd, 1e-5);
    pair dout = rand_pair(BTD, g_ct, -1, 1), dx = rand_pair(BTD, DC_F32, -1, 1);
    pair dmod = rand_pair((int64_t)B * nch * D, g_ct, -1, 1);
    // the GPU reads the CPU's statistics, so backward is checked on its own
    float *hm = malloc(B * T * 4), *hr = malloc(B * T * 4);
    g_cpu->download(g_cpu, hm, mean.c.p, B * T * 4), g_cpu->download(g_cpu, hr, rstd.c.p, B * T * 4);
    put(mean, hm), put(rstd, hr);
    free(hm), free(hr);
    g_cpu->ln_mod_bwd(g_cpu, dx.c, dmod.c, dout.c, x.c, mean.c, rstd.c, mod.c, B, T, D, nch, 0, 1);
    g_gpu->ln_mod_bwd(g_gpu, dx.g, dmod.g, dout.g, x.g, mean.g, rstd.g, mod.g, B, T, D, nch, 0, 1);
    compare("ln_mod_bwd dx (fp32 +=)", dx, 1e-5);
    compare("ln_mod_bwd dmod (shift, scale)", dmod, g_tol);
    pair y = rand_pair(BTD, g_ct, -1, 1);
    pair xo = nan_pair(BTD, DC_F32);
    g_cpu->gate_res_fwd(g_cpu, xo.c, x.c, y.c, mod.c, B, T, D, nch, 2);
    g_gpu->gate_res_fwd(g_gpu, xo.g, x.g, y.g, mod.g, B, T, D, nch, 2);
    compare("gate_res_fwd (fp32 stream)", xo, 1e-6);
    g_cpu->gate_res_fwd(g_cpu, x.c, x.c, y.c, mod.c, B, T, D, nch, 2);
    g_gpu->gate_res_fwd(g_gpu, x.g, x.g, y.g, mod.g, B, T, D, nch, 2);
    compare("gate_res_fwd in place", x, 1e-6);
    pair dy = nan_pair(BTD, g_ct);
    g_cpu->gate_res_bwd(g_cpu, dy.c, dmod.c, dx.c, y.c, mod.c, B, T, D, nch, 5);
    g_gpu->gate_res_bwd(g_gpu, dy.g, dmod.g, dx.g, y.g, mod.g, B, T, D, nch, 5);
    compare("gate_res_bwd dy", dy, g_tol);
    compare("gate_res_bwd dmod (all chunks)", dmod, g_tol);
    release();
}

static void test_attention(int B, int T, int D, int H) {
    char name[96];
    int64_t n3 = (int64_t)B * T * 3 * D, n = (int64_t)B * T * D;
    pair qkv = rand_pair(n3, g_ct, -2, 2), out = nan_pair(n, g_ct), lse = nan_pair((int64_t)B * H * T, DC_F32);
    const dc_attn_shape sh = dc_attn_packed(B, T, D, H);  // q, k, v in place in qkv
    g_cpu->attention_fwd(g_cpu, out.c, lse.c, qkv.c, dc_buf_at(qkv.c, D), dc_buf_at(qkv.c, 2 * D), &sh);
    g_gpu->attention_fwd(g_gpu, out.g, lse.g, qkv.g, dc_buf_at(qkv.g, D), dc_buf_at(qkv.g, 2 * D), &sh);
    snprintf(name, sizeof name, "attn_fwd B%d T%d D%d H%d (Dh %d)", B, T, D, H, D / H);
    compare(name, out, g_tol);
    compare("attn_fwd lse", lse, 1e-5);
    // backward from the CPU's forward results, so the GPU's backward is checked on its own
    float *ho = malloc(n * 4), *hl = malloc((size_t)B * H * T * 4);
    g_cpu->download(g_cpu, ho, out.c.p, n * 4), g_cpu->download(g_cpu, hl, lse.c.p, (size_t)B * H * T * 4);
    put(out, ho), put(lse, hl);
    free(ho), free(hl);
    pair dout = rand_pair(n, g_ct, -1, 1), dqkv = nan_pair(n3, g_ct);
    g_cpu->attention_bwd(g_cpu, dqkv.c, dc_buf_at(dqkv.c, D), dc_buf_at(dqkv.c, 2 * D), dout.c, qkv.c,
                         dc_buf_at(qkv.c, D), dc_buf_at(qkv.c, 2 * D), out.c, lse.c, &sh);
    g_gpu->attention_bwd(g_gpu, dqkv.g, dc_buf_at(dqkv.g, D), dc_buf_at(dqkv.g, 2 * D), dout.g, qkv.g,
                         dc_buf_at(qkv.g, D), dc_buf_at(qkv.g, 2 * D), out.g, lse.g, &sh);
    compare("attn_bwd dqkv", dqkv, g_ct == DC_F32 ? 1e-5 : 2e-2);
    release();
}

static void test_embeddings(void) {
    enum { B = 5 };
    const int C = 4, S = 16, p = 2, T = (S / p) * (S / p), D = 40;
    pair img = rand_pair((int64_t)B * C * S * S, DC_F32, -1, 1), tok = nan_pair((int64_t)B * T * C * p * p, g_ct);
    g_cpu->patchify(g_cpu, tok.c, img.c, B, C, S, S, p), g_gpu->patchify(g_gpu, tok.g, img.g, B, C, S, S, p);
    compare("patchify", tok, g_tol);
    pair t2 = rand_pair((int64_t)B * T * C * p * p, g_ct, -1, 1), im2 = nan_pair((int64_t)B * C * S * S, DC_F32);
    g_cpu->unpatchify_fwd(g_cpu, im2.c, t2.c, B, C, S, S, p), g_gpu->unpatchify_fwd(g_gpu, im2.g, t2.g, B, C, S, S, p);
    compare("unpatchify_fwd", im2, 0);
    pair dt = nan_pair((int64_t)B * T * C * p * p, g_ct);
    g_cpu->unpatchify_bwd(g_cpu, dt.c, im2.c, B, C, S, S, p), g_gpu->unpatchify_bwd(g_gpu, dt.g, im2.g, B, C, S, S, p);
    compare("unpatchify_bwd", dt, g_tol);
    pair ts = rand_pair(B, DC_F32, 0, 999), te = nan_pair((int64_t)B * 256, g_ct);
    g_cpu->timestep_embed(g_cpu, te.c, ts.c, B, 128), g_gpu->timestep_embed(g_gpu, te.g, ts.g, B, 128);
    compare("timestep_embed", te, g_ct == DC_F32 ? 1e-6 : g_tol);
    const int rows = 11;
    pair tab = rand_pair((int64_t)rows * D, g_ct, -1, 1), e = nan_pair((int64_t)B * D, g_ct);
    int32_t idx[B] = {3, 10, 3, 0, 7};
    dc_buf ic = {g_cpu->alloc(g_cpu, sizeof idx), DC_I32}, ig = {g_gpu->alloc(g_gpu, sizeof idx), DC_I32};
    g_cpu->upload(g_cpu, ic.p, idx, sizeof idx), g_gpu->upload(g_gpu, ig.p, idx, sizeof idx);
    g_cpu->embed_fwd(g_cpu, e.c, tab.c, ic, B, D), g_gpu->embed_fwd(g_gpu, e.g, tab.g, ig, B, D);
    compare("embed_fwd", e, 0);
    pair dtab = rand_pair((int64_t)rows * D, DC_F32, -1, 1), de = rand_pair((int64_t)B * D, g_ct, -1, 1);
    g_cpu->embed_bwd(g_cpu, dtab.c, de.c, ic, B, D), g_gpu->embed_bwd(g_gpu, dtab.g, de.g, ig, B, D);
    compare("embed_bwd (fp32 +=, repeated label)", dtab, 1e-6);
    g_cpu->free(g_cpu, ic.p), g_gpu->free(g_gpu, ig.p);
    release();
}

static void test_diffusion(void) {
    const int B = 70, C = 4;  // B > the GPU's 64-sample launch chunk
    const int64_t HW = 256, n = C * HW;
    uint32_t keys[B];
    float a[B], s[B];
    dc_loss_coef coef[B];
    for (int b = 0; b < B; b++) {
        keys[b] = (uint32_t)(rnd(0, 1e9));
        a[b] = (float)rnd(0.1, 1), s[b] = sqrtf(1 - a[b] * a[b]);
        double lb = log(rnd(1e-4, 2e-2)), lp = lb - rnd(0, 1);
        coef[b] = (dc_loss_coef){a[b], s[b], 1 / a[b], s[b] / a[b], (float)rnd(0, 1), (float)rnd(0, 1),
                                 (float)lp, (float)lb, b % 9 == 0};
    }
    pair eps = nan_pair(B * n, DC_F32);
    g_cpu->randn(g_cpu, eps.c, keys, B, n, 1234, 7, 3), g_gpu->randn(g_gpu, eps.g, keys, B, n, 1234, 7, 3);
    compare("randn (same counters)", eps, 1e-6);
    pair x0 = rand_pair(B * n, DC_F32, -1, 1), xt = nan_pair(B * n, DC_F32);
    g_cpu->q_sample(g_cpu, xt.c, x0.c, eps.c, a, s, B, n), g_gpu->q_sample(g_gpu, xt.g, x0.g, eps.g, a, s, B, n);
    compare("q_sample", xt, 1e-6);
    pair out = rand_pair(B * 2 * n, DC_F32, -1, 1), dout = nan_pair(B * 2 * n, DC_F32), loss = nan_pair(2 * B, DC_F32);
    g_cpu->diffusion_loss(g_cpu, dout.c, loss.c, out.c, x0.c, xt.c, eps.c, coef, B, C, 2 * C, HW, 0.25f);
    g_gpu->diffusion_loss(g_gpu, dout.g, loss.g, out.g, x0.g, xt.g, eps.g, coef, B, C, 2 * C, HW, 0.25f);
    compare("diffusion_loss dout", dout, 1e-6);
    compare("diffusion_loss losses", loss, 1e-6);
    // epsilon-only output [B, C, HW]: the mse part alone
    pair dout1 = nan_pair(B * n, DC_F32), loss1 = nan_pair(2 * B, DC_F32);
    g_cpu->diffusion_loss(g_cpu, dout1.c, loss1.c, out.c, x0.c, xt.c, eps.c, coef, B, C, C, HW, 0.25f);
    g_gpu->diffusion_loss(g_gpu, dout1.g, loss1.g, out.g, x0.g, xt.g, eps.g, coef, B, C, C, HW, 0.25f);
    compare("diffusion_loss dout (epsilon only)", dout1, 1e-6);
    compare("diffusion_loss losses (epsilon only)", loss1, 1e-6);
    pair comb = nan_pair(B / 2 * 2 * n, DC_F32);
    g_cpu->cfg_combine(g_cpu, comb.c, out.c, B / 2, 2 * C, HW, 3, 4.0f);
    g_gpu->cfg_combine(g_gpu, comb.g, out.g, B / 2, 2 * C, HW, 3, 4.0f);
    compare("cfg_combine", comb, 1e-6);
    for (int kind = 0; kind < 2; kind++) {
        dc_step_coef sc = {kind, 1, 1, 1.3f, 0.8f, 0.3f, 0.6f, -6.0f, -3.0f, -4.0f, 0.9f, 0.3f, 0.1f};
        pair x = rand_pair(B * n, DC_F32, -2, 2);
        g_cpu->sampler_step(g_cpu, x.c, out.c, eps.c, &sc, B, C, 2 * C, HW);
        g_gpu->sampler_step(g_gpu, x.g, out.g, eps.g, &sc, B, C, 2 * C, HW);
        compare(kind ? "sampler_step ddim" : "sampler_step ddpm", x, 1e-6);
    }
    release();
}

static void test_optim(void) {
    const int64_t n = 200003;
    pair p = rand_pair(n, DC_F32, -1, 1), m = rand_pair(n, DC_F32, -0.1, 0.1), v = rand_pair(n, DC_F32, 0, 0.01);
    pair e = rand_pair(n, DC_F32, -1, 1), pc = nan_pair(n, g_ct), gs = nan_pair(2, DC_F32);
    for (int s = 1; s <= 3; s++) {
        pair g = rand_pair(n, DC_F32, -1, 1);
        // the clipping factor comes from the gradient norm, on each backend
        g_cpu->grad_norm(g_cpu, gs.c, g.c, n, 100.0f), g_gpu->grad_norm(g_gpu, gs.g, g.g, n, 100.0f);
        compare("grad_norm (norm, clip factor)", gs, 1e-6);
        dc_adamw_step h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1 - powf(0.9f, s), 1 - powf(0.999f, s), 0.7f, 0.99f};
        g_cpu->adamw(g_cpu, p.c, g.c, m.c, v.c, e.c, pc.c, dc_buf_at(gs.c, 1), n, &h);
        g_gpu->adamw(g_gpu, p.g, g.g, m.g, v.g, e.g, pc.g, dc_buf_at(gs.g, 1), n, &h);
    }
    compare("adamw p", p, 1e-6), compare("adamw m", m, 1e-6), compare("adamw v", v, 1e-6);
    compare("adamw ema", e, 1e-6), compare("adamw compute copy", pc, g_ct == DC_F32 ? 1e-6 : 4e-3);
    release();
}

// ---- latent diffusion: convolutions, norms, pointwise ------------------------------------------
// Copies the CPU's values of p to the GPU's copy (backward then starts from the same state).
static void sync_to_gpu(pair p) {
    float *h = malloc(p.n * 4);
    g_cpu->download(g_cpu, h, p.c.p, p.n * 4);
    put(p, h);
    free(h);
}

// Whether the GPU copies of a and b hold the same bytes (a deterministic op run twice).
static void expect_same(const char *name, pair a, pair b) {
    size_t bytes = a.n * dc_dtype_size(a.g.dt);
    char *ha = malloc(bytes), *hb = malloc(bytes);
    g_gpu->download(g_gpu, ha, a.g.p, bytes), g_gpu->download(g_gpu, hb, b.g.p, bytes);
    bool ok = a.n == b.n && memcmp(ha, hb, bytes) == 0;
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %s\n", ok ? "ok" : "FAIL", name);
    free(ha), free(hb);
}

// A conv's forward and its input gradient, as a model's step issues them (for graph capture).
typedef struct {
    dc_buf out, dx, x, w, b, dout;
    const dc_conv2d_shape *s;
} conv_call;
static int run_conv(void *arg) {
    conv_call *a = arg;
    g_gpu->conv2d_fwd(g_gpu, a->out, a->x, a->w, a->b, a->s);
    g_gpu->conv2d_bwd(g_gpu, a->dx, dc_buf_none(), dc_buf_none(), a->dout, a->x, a->w, a->s, false);
    return 0;
}

// conv2d forward and backward; the GPU's compute-dtype tensors, fp32 gradients
// of the weights. bf16 tolerances: the output and dx are rounded to bf16 (2^-9
// relative); cuDNN writes the weight gradient in bf16 before it is added in fp32.
static void test_conv(int B, int Ci, int H, int W, int Co, int k, int stride, int pt, int pb, int pl, int pr,
                      bool bias) {
    char name[128];
    dc_conv2d_shape s = {B, Ci, H, W, Co, k, stride, pt, pb, pl, pr};
    const int Ho = dc_conv2d_ho(&s), Wo = dc_conv2d_wo(&s);
    const int64_t nx = (int64_t)B * Ci * H * W, ny = (int64_t)B * Co * Ho * Wo, nw = (int64_t)Co * Ci * k * k;
    if (g_cpu->reserve_conv(g_cpu, &s) || g_gpu->reserve_conv(g_gpu, &s)) {
        printf("FAIL reserve_conv: %s\n", dc_error());
        g_fail++, g_count++;
        return;
    }
    pair x = rand_pair(nx, g_ct, -1, 1), w = rand_pair(nw, g_ct, -0.3, 0.3), b = rand_pair(Co, g_ct, -1, 1);
    pair out = nan_pair(ny, g_ct);
    dc_buf bc = bias ? b.c : dc_buf_none(), bg = bias ? b.g : dc_buf_none();
    g_cpu->conv2d_fwd(g_cpu, out.c, x.c, w.c, bc, &s), g_gpu->conv2d_fwd(g_gpu, out.g, x.g, w.g, bg, &s);
    snprintf(name, sizeof name, "conv2d_fwd B%d %d->%d %dx%d k%d s%d pad %d,%d,%d,%d%s", B, Ci, Co, H, W, k, stride,
             pt, pb, pl, pr, bias ? "" : " (no bias)");
    compare(name, out, g_ct == DC_F32 ? 1e-5 : 1e-2);
    pair dout = rand_pair(ny, g_ct, -1, 1), dx = nan_pair(nx, g_ct);
    pair dw = rand_pair(nw, DC_F32, -1, 1), db = rand_pair(Co, DC_F32, -1, 1);
    pair dw2 = make(nw, DC_F32), dx2 = make(nx, g_ct);
    // the GPU's second copy of dw starts equal to its first: run twice, the bytes must agree
    g_gpu->copy(g_gpu, dw2.g.p, dw.g.p, nw * 4);
    g_cpu->conv2d_bwd(g_cpu, dx.c, dw.c, db.c, dout.c, x.c, w.c, &s, false);
    g_gpu->conv2d_bwd(g_gpu, dx.g, dw.g, db.g, dout.g, x.g, w.g, &s, false);
    compare("conv2d_bwd dx", dx, g_ct == DC_F32 ? 1e-5 : 1e-2);
    compare("conv2d_bwd dw (fp32 +=)", dw, g_ct == DC_F32 ? 1e-5 : 5e-3);
    compare("conv2d_bwd db (fp32 +=)", db, 1e-5);
    g_gpu->conv2d_bwd(g_gpu, dx2.g, dw2.g, dc_buf_none(), dout.g, x.g, w.g, &s, false);
    expect_same("conv2d_bwd run twice: dx bit for bit", dx, dx2);
    expect_same("conv2d_bwd run twice: dw bit for bit", dw, dw2);
    // recorded into a graph (as the sampler records a step) and replayed: the same bits
    pair og = make(ny, g_ct), dxg = make(nx, g_ct);
    conv_call cc = {og.g, dxg.g, x.g, w.g, bg, dout.g, &s};
    void *graph = g_gpu->graph_capture(g_gpu, run_conv, &cc);
    if (graph) g_gpu->graph_launch(g_gpu, graph);
    else printf("     graph capture: %s\n", dc_error());
    expect_same("conv2d_fwd replayed from a graph: bit for bit", out, og);
    expect_same("conv2d_bwd dx replayed from a graph: bit for bit", dx, dxg);
    if (graph) g_gpu->graph_free(g_gpu, graph);
    // dx accumulated, weight and bias gradients skipped
    pair dxa = rand_pair(nx, g_ct, -1, 1);
    g_cpu->conv2d_bwd(g_cpu, dxa.c, dc_buf_none(), dc_buf_none(), dout.c, x.c, w.c, &s, true);
    g_gpu->conv2d_bwd(g_gpu, dxa.g, dc_buf_none(), dc_buf_none(), dout.g, x.g, w.g, &s, true);
    compare("conv2d_bwd dx (+=)", dxa, g_ct == DC_F32 ? 1e-5 : 1e-2);
    release();
}

// GroupNorm(+SiLU) with x in dtype xt; statistics fp32; gamma, beta in the compute dtype.
static void test_group_norm(int B, int C, int64_t HW, int G, bool silu, float eps, dc_dtype xt) {
    char name[128];
    const int64_t n = (int64_t)B * C * HW;
    pair x = rand_pair(n, xt, -3, 5), ga = rand_pair(C, g_ct, 0.5, 1.5), be = rand_pair(C, g_ct, -0.5, 0.5);
    pair out = nan_pair(n, g_ct), mean = nan_pair((int64_t)B * G, DC_F32), rstd = nan_pair((int64_t)B * G, DC_F32);
    g_cpu->group_norm_fwd(g_cpu, out.c, mean.c, rstd.c, x.c, ga.c, be.c, B, C, HW, G, eps, silu);
    g_gpu->group_norm_fwd(g_gpu, out.g, mean.g, rstd.g, x.g, ga.g, be.g, B, C, HW, G, eps, silu);
    snprintf(name, sizeof name, "group_norm_fwd B%d C%d HW%lld G%d%s (x %s)", B, C, (long long)HW, G,
             silu ? " +silu" : "", dc_dtype_name(xt));
    compare(name, out, g_tol);
    compare("group_norm_fwd mean", mean, 1e-5);
    compare("group_norm_fwd rstd", rstd, 1e-5);
    // backward from the CPU's statistics, so it is checked on its own
    sync_to_gpu(mean), sync_to_gpu(rstd);
    pair dout = rand_pair(n, g_ct, -1, 1), dx = nan_pair(n, g_ct);
    pair dga = rand_pair(C, DC_F32, -1, 1), dbe = rand_pair(C, DC_F32, -1, 1);
    g_cpu->group_norm_bwd(g_cpu, dx.c, dga.c, dbe.c, dout.c, x.c, mean.c, rstd.c, ga.c, be.c, B, C, HW, G, silu, false);
    g_gpu->group_norm_bwd(g_gpu, dx.g, dga.g, dbe.g, dout.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu, false);
    compare("group_norm_bwd dx", dx, g_tol);
    compare("group_norm_bwd dgamma (fp32 +=)", dga, 1e-5);
    compare("group_norm_bwd dbeta (fp32 +=)", dbe, 1e-5);
    pair dxa = rand_pair(n, DC_F32, -1, 1);  // an fp32 gradient stream, accumulated; parameters frozen
    g_cpu->group_norm_bwd(g_cpu, dxa.c, dc_buf_none(), dc_buf_none(), dout.c, x.c, mean.c, rstd.c, ga.c, be.c, B, C,
                          HW, G, silu, true);
    g_gpu->group_norm_bwd(g_gpu, dxa.g, dc_buf_none(), dc_buf_none(), dout.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C,
                          HW, G, silu, true);
    compare("group_norm_bwd dx (fp32 +=, frozen)", dxa, 1e-5);
    release();
}

// LayerNorm with affine weights over rows of D; x in dtype xt.
static void test_layer_norm(int64_t M, int D, float eps, dc_dtype xt) {
    char name[128];
    const int64_t n = M * D;
    pair x = rand_pair(n, xt, -3, 5), ga = rand_pair(D, g_ct, 0.5, 1.5), be = rand_pair(D, g_ct, -0.5, 0.5);
    pair out = nan_pair(n, g_ct), mean = nan_pair(M, DC_F32), rstd = nan_pair(M, DC_F32);
    g_cpu->layer_norm_fwd(g_cpu, out.c, mean.c, rstd.c, x.c, ga.c, be.c, M, D, eps);
    g_gpu->layer_norm_fwd(g_gpu, out.g, mean.g, rstd.g, x.g, ga.g, be.g, M, D, eps);
    snprintf(name, sizeof name, "layer_norm_fwd M%lld D%d (x %s)", (long long)M, D, dc_dtype_name(xt));
    compare(name, out, g_tol);
    compare("layer_norm_fwd mean", mean, 1e-5);
    compare("layer_norm_fwd rstd", rstd, 1e-5);
    sync_to_gpu(mean), sync_to_gpu(rstd);
    pair dout = rand_pair(n, g_ct, -1, 1), dx = nan_pair(n, g_ct);
    pair dga = rand_pair(D, DC_F32, -1, 1), dbe = rand_pair(D, DC_F32, -1, 1);
    g_cpu->layer_norm_bwd(g_cpu, dx.c, dga.c, dbe.c, dout.c, x.c, mean.c, rstd.c, ga.c, M, D, false);
    g_gpu->layer_norm_bwd(g_gpu, dx.g, dga.g, dbe.g, dout.g, x.g, mean.g, rstd.g, ga.g, M, D, false);
    compare("layer_norm_bwd dx", dx, g_tol);
    compare("layer_norm_bwd dgamma (fp32 +=)", dga, 1e-5);
    compare("layer_norm_bwd dbeta (fp32 +=)", dbe, 1e-5);
    pair dxa = rand_pair(n, DC_F32, -1, 1);
    g_cpu->layer_norm_bwd(g_cpu, dxa.c, dc_buf_none(), dc_buf_none(), dout.c, x.c, mean.c, rstd.c, ga.c, M, D, true);
    g_gpu->layer_norm_bwd(g_gpu, dxa.g, dc_buf_none(), dc_buf_none(), dout.g, x.g, mean.g, rstd.g, ga.g, M, D, true);
    compare("layer_norm_bwd dx (fp32 +=, frozen)", dxa, 1e-5);
    release();
}

// Nearest 2x upsampling, GEGLU and the activations. off > 0 shifts every
// buffer by that many elements, off the vector kernels' alignment.
static void test_latent_pointwise(int off) {
    char name[128];
    const char *sfx = off ? " (unaligned)" : "";
    static const struct { int B, C, H, W; } up[2] = {{2, 8, 8, 16}, {2, 3, 5, 7}};
    for (int i = 0; i < 2; i++) {
        const int B = up[i].B, C = up[i].C, H = up[i].H, W = up[i].W;
        const int64_t n = (int64_t)B * C * H * W;
        pair x = offset(rand_pair(n + off, g_ct, -1, 1), off), o = offset(nan_pair(4 * n + off, g_ct), off);
        g_cpu->upsample2x_fwd(g_cpu, o.c, x.c, B, C, H, W), g_gpu->upsample2x_fwd(g_gpu, o.g, x.g, B, C, H, W);
        snprintf(name, sizeof name, "upsample2x_fwd %dx%dx%dx%d%s", B, C, H, W, sfx);
        compare(name, o, 0);
        pair d = offset(rand_pair(4 * n + off, g_ct, -1, 1), off), dx = offset(nan_pair(n + off, g_ct), off);
        g_cpu->upsample2x_bwd(g_cpu, dx.c, d.c, B, C, H, W), g_gpu->upsample2x_bwd(g_gpu, dx.g, d.g, B, C, H, W);
        compare("upsample2x_bwd", dx, g_ct == DC_F32 ? 1e-6 : g_tol);
    }
    static const struct { int64_t M; int F; } gg[2] = {{154, 1280}, {7, 5}};
    for (int i = 0; i < 2; i++) {
        const int64_t M = gg[i].M;
        const int F = gg[i].F;
        pair x = offset(rand_pair(M * 2 * F + off, g_ct, -3, 3), off), o = offset(nan_pair(M * F + off, g_ct), off);
        g_cpu->geglu_fwd(g_cpu, o.c, x.c, M, F), g_gpu->geglu_fwd(g_gpu, o.g, x.g, M, F);
        snprintf(name, sizeof name, "geglu_fwd M%lld F%d%s", (long long)M, F, sfx);
        compare(name, o, g_tol);
        pair d = offset(rand_pair(M * F + off, g_ct, -1, 1), off), dx = offset(nan_pair(M * 2 * F + off, g_ct), off);
        g_cpu->geglu_bwd(g_cpu, dx.c, d.c, x.c, M, F), g_gpu->geglu_bwd(g_gpu, dx.g, d.g, x.g, M, F);
        compare("geglu_bwd", dx, g_tol);
    }
    static const char *names[4] = {"silu", "gelu_tanh", "gelu_erf", "quick_gelu"};
    const dc_act acts[4] = {DC_ACT_SILU, DC_ACT_GELU_TANH, DC_ACT_GELU_ERF, DC_ACT_QUICK_GELU};
    const int64_t n = 300007;  // a vector body and a scalar tail
    pair x = offset(rand_pair(n + off, g_ct, -6, 6), off), dout = offset(rand_pair(n + off, g_ct, -1, 1), off);
    for (int a = 0; a < 4; a++) {
        pair o = offset(nan_pair(n + off, g_ct), off), d = offset(nan_pair(n + off, g_ct), off);
        pair acc = offset(rand_pair(n + off, DC_F32, -1, 1), off);
        g_cpu->activation_fwd(g_cpu, o.c, x.c, n, acts[a]), g_gpu->activation_fwd(g_gpu, o.g, x.g, n, acts[a]);
        snprintf(name, sizeof name, "activation_fwd %s%s", names[a], sfx);
        compare(name, o, g_tol);
        g_cpu->activation_bwd(g_cpu, d.c, dout.c, x.c, n, acts[a], false);
        g_gpu->activation_bwd(g_gpu, d.g, dout.g, x.g, n, acts[a], false);
        snprintf(name, sizeof name, "activation_bwd %s", names[a]);
        compare(name, d, g_tol);
        g_cpu->activation_bwd(g_cpu, acc.c, dout.c, x.c, n, acts[a], true);
        g_gpu->activation_bwd(g_gpu, acc.g, dout.g, x.g, n, acts[a], true);
        snprintf(name, sizeof name, "activation_bwd %s (fp32 +=)", names[a]);
        compare(name, acc, 1e-5);
    }
    release();
}

// ---- a whole model ---------------------------------------------------------------------------
static int eval_dit(void *ctx, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_dit_forward(ctx, out, x, t, cond->y, B);
}

static void test_model(void) {
    dc_dit_config cfg = {.input_size = 16, .patch = 2, .in_channels = 4, .hidden = 144, .depth = 3, .heads = 2,
                         .mlp_hidden = 576, .num_classes = 10, .learn_sigma = true};
    enum { B = 4 };
    dc_dit mc, mg;
    if (dc_dit_create(&mc, &cfg, g_cpu, true) || dc_dit_create(&mg, &cfg, g_gpu, true) ||
        dc_dit_init_weights(&mc, 5) || dc_dit_init_weights(&mg, 5) || dc_dit_reserve(&mc, B) ||
        dc_dit_reserve(&mg, B)) {
        printf("FAIL model setup: %s\n", dc_error());
        g_fail++;
        return;
    }
    // adaLN and the final layer start at zero; give them values so every path matters
    int64_t np = mc.params.numel;
    float *w = malloc(np * 4);
    g_cpu->download(g_cpu, w, mc.params.data.p, np * 4);
    for (int i = 1; i < mc.params.count; i++) {
        const dc_param *p = &mc.params.items[i];
        if (strstr(p->name, "adaLN") || strstr(p->name, "final_layer.linear"))
            for (int64_t j = 0; j < p->numel; j++) w[p->offset + j] = (float)rnd(-0.05, 0.05);
    }
    g_cpu->upload(g_cpu, mc.params.data.p, w, np * 4), g_gpu->upload(g_gpu, mg.params.data.p, w, np * 4);
    dc_params_touch(&mg.params);
    free(w);
    int C = cfg.in_channels, S = cfg.input_size, OC = dc_dit_out_channels(&cfg);
    pair x = rand_pair((int64_t)B * C * S * S, DC_F32, -2, 2), t = make(B, DC_F32), y = make(B, DC_I32);
    float th[B] = {0, 17, 500.5f, 999};
    int32_t yh[B] = {0, 3, 10, 7};
    g_cpu->upload(g_cpu, t.c.p, th, sizeof th), g_gpu->upload(g_gpu, t.g.p, th, sizeof th);
    y.c.dt = y.g.dt = DC_I32;
    g_cpu->upload(g_cpu, y.c.p, yh, sizeof yh), g_gpu->upload(g_gpu, y.g.p, yh, sizeof yh);
    pair out = nan_pair((int64_t)B * OC * S * S, DC_F32);
    if (dc_dit_forward(&mc, out.c, x.c, t.c, y.c, B) || dc_dit_forward(&mg, out.g, x.g, t.g, y.g, B)) {
        printf("FAIL model forward: %s\n", dc_error());
        g_fail++;
        return;
    }
    compare("DiT forward (3 blocks)", out, g_ct == DC_F32 ? 1e-4 : 2e-2);
    pair dout = rand_pair((int64_t)B * OC * S * S, DC_F32, -1, 1);
    if (dc_dit_backward(&mc, dout.c, B) || dc_dit_backward(&mg, dout.g, B)) {
        printf("FAIL model backward: %s\n", dc_error());
        g_fail++;
        return;
    }
    pair grad = {mc.params.grad, mg.params.grad, np};
    compare("DiT backward (all gradients)", grad, g_ct == DC_F32 ? 1e-4 : 3e-2);
    // sampling: 6 guided DDPM steps, the GPU replaying its recorded step from the second on
    dc_sampler_opts so = dc_sampler_opts_default();
    so.steps = 6, so.cfg_scale = 4.0f, so.seed = 11, so.null_class = cfg.num_classes;
    dc_sampler sc, sg;
    enum { NS = 2 };
    pair xs = nan_pair((int64_t)NS * C * S * S, DC_F32);
    int32_t ys[NS] = {1, 9};
    pair yl = make(NS, DC_I32);  // the labels on each backend
    yl.c.dt = yl.g.dt = DC_I32;
    g_cpu->upload(g_cpu, yl.c.p, ys, sizeof ys), g_gpu->upload(g_gpu, yl.g.p, ys, sizeof ys);
    const dc_cond cc = {.y = yl.c}, cg = {.y = yl.g};
    uint32_t is[NS] = {4, 5};
    if (dc_sampler_init(&sc, g_cpu, &so, C, S, S, NS) || dc_sampler_init(&sg, g_gpu, &so, C, S, S, NS) ||
        dc_sampler_run(&sc, xs.c, &cc, is, NS, eval_dit, &mc, NULL, NULL) ||
        dc_sampler_run(&sg, xs.g, &cg, is, NS, eval_dit, &mg, NULL, NULL)) {
        printf("FAIL sampler: %s\n", dc_error());
        g_fail++;
    } else {
        compare("sampler, 6 guided steps (graph replay)", xs, g_ct == DC_F32 ? 1e-4 : 3e-2);
    }
    dc_sampler_free(&sc), dc_sampler_free(&sg);
    release();
    dc_dit_free(&mc), dc_dit_free(&mg);
}

// ---- errors come back as errors ----------------------------------------------------------------
static void expect(bool ok, const char *what) {
    g_count++;
    if (!ok) g_fail++;
    printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
}

// A backend of the mode under test, made for one case (a failed one stays failed).
static dc_backend *fresh(void) {
    dc_backend *be = dc_backend_cuda_create(g_ct == DC_F32);
    if (!be) printf("FAIL creating a backend: %s\n", dc_error()), g_fail++;
    return be;
}

static bool has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

// Issues an attention op the op does not define (causal with more queries
// than keys) and, like a careless caller, reports success.
typedef struct { dc_backend *be; dc_buf out, lse, qkv; } bad_attn;
static int run_bad_attention(void *arg) {
    bad_attn *a = arg;
    dc_attn_shape sh = dc_attn_packed(1, 16, 320, 2);
    sh.causal = true, sh.Tk = 8;  // 16 queries, 8 keys
    a->be->attention_fwd(a->be, a->out, a->lse, a->qkv, dc_buf_at(a->qkv, 320), dc_buf_at(a->qkv, 640), &sh);
    return 0;
}

// Attention shapes outside the op's contract (a causal mask with more
// queries than keys, an empty sequence) come back as the backend's error
// naming the case, never a crash or silent output. (Every shape within it
// runs: tests/test_cuda_attention.c.)
static void test_attention_unsupported(void) {
    struct { int Tq, Tk, Dh; bool causal; const char *part; } cases[] = {
        {16, 8, 64, true, "at least as many keys as queries"}, {16, 0, 64, false, "at least 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dc_backend *be = fresh();
        if (!be) return;
        const int H = 2, D = H * cases[i].Dh, Tq = cases[i].Tq, Tk = cases[i].Tk;
        dc_attn_shape sh = {.B = 1, .H = H, .Tq = Tq, .Tk = Tk, .Dh = cases[i].Dh, .Dv = cases[i].Dh,
                            .causal = cases[i].causal, .q = dc_attn_rows(Tq, D, cases[i].Dh),
                            .k = dc_attn_rows(Tk, D, cases[i].Dh), .v = dc_attn_rows(Tk, D, cases[i].Dh),
                            .out = dc_attn_rows(Tq, D, cases[i].Dh)};
        size_t es = dc_dtype_size(g_ct);
        dc_buf q = {be->alloc(be, (size_t)Tq * D * es), g_ct}, k = {be->alloc(be, (size_t)Tk * D * es), g_ct};
        dc_buf v = {be->alloc(be, (size_t)Tk * D * es), g_ct}, o = {be->alloc(be, (size_t)Tq * D * es), g_ct};
        dc_buf lse = {be->alloc(be, (size_t)H * Tq * 4), DC_F32};
        dc_error_clear();
        be->attention_fwd(be, o, lse, q, k, v, &sh);
        char what[160];
        snprintf(what, sizeof what, "attention_fwd %s: status -1 naming it", cases[i].part);
        int rc = dc_backend_status(be);
        printf("     %s\n", rc ? dc_error() : "(no error)");
        expect(rc == -1 && has(dc_error(), cases[i].part), what);
        be->free(be, q.p), be->free(be, k.p), be->free(be, v.p), be->free(be, o.p), be->free(be, lse.p);
        dc_backend_destroy(be);
        // backward refuses the same shape
        if (!(be = fresh())) return;
        dc_buf b[9];  // dq, dk, dv, dout, q, k, v, out (Tq rows each: Tq >= Tk here), lse
        for (int j = 0; j < 9; j++) b[j] = (dc_buf){be->alloc(be, (size_t)Tq * D * 4), j == 8 ? DC_F32 : g_ct};
        dc_error_clear();
        be->attention_bwd(be, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], &sh);
        rc = dc_backend_status(be);
        snprintf(what, sizeof what, "attention_bwd %s: status -1 naming it", cases[i].part);
        expect(rc == -1 && has(dc_error(), cases[i].part), what);
        for (int j = 0; j < 9; j++) be->free(be, b[j].p);
        dc_backend_destroy(be);
    }
}

static void test_errors(void) {
    char what[160];
    // 1. Memory far beyond any GPU: NULL, with the size asked for and what is free; nothing is broken.
    dc_backend *be = fresh();
    if (!be) return;
    dc_error_clear();
    void *huge = be->alloc(be, (size_t)1 << 40);
    printf("     1 TiB: %s\n", dc_error());
    expect(!huge && has(dc_error(), "1048576.0 MiB") && has(dc_error(), "MiB free of"),
           "1 TiB allocation: NULL, message with the size asked for and the free memory");
    if (huge) be->free(be, huge);
    void *small = be->alloc(be, 1 << 20);
    expect(small && dc_backend_status(be) == 0, "after it: status 0 and a 1 MiB allocation works");
    be->free(be, small);

    // 2. A programmer's dtype error inside an op: recorded, returned by the
    //    status, by the model's forward and by the sampler; sticky.
    dc_dit_config cfg = {.input_size = 8, .patch = 2, .in_channels = 4, .hidden = 64, .depth = 1, .heads = 4,
                         .mlp_hidden = 256, .num_classes = 10, .learn_sigma = true};
    dc_dit m;
    dc_sampler smp;
    dc_sampler_opts so = dc_sampler_opts_default();
    so.steps = 2, so.null_class = cfg.num_classes;
    if (dc_dit_create(&m, &cfg, be, true) || dc_dit_init_weights(&m, 1) || dc_dit_reserve(&m, 1) ||
        dc_sampler_init(&smp, be, &so, cfg.in_channels, cfg.input_size, cfg.input_size, 1)) {
        printf("FAIL error-case setup: %s\n", dc_error());
        g_fail++;
        dc_backend_destroy(be);
        return;
    }
    const int M = 4, K = 8, N = 8;
    dc_buf x = {be->alloc(be, M * K * 4), DC_F32}, w = {be->alloc(be, N * K * 2), DC_BF16};
    dc_buf o = {be->alloc(be, M * N * 4), DC_F32}, img = {be->alloc(be, 4 * 8 * 8 * 4), DC_F32};
    dc_buf tb = {be->alloc(be, 4), DC_F32}, yb = {be->alloc(be, 4), DC_I32};
    dc_buf mo = {be->alloc(be, 8 * 8 * 8 * 4), DC_F32};  // [1, 2C, 8, 8]
    be->zero(be, x.p, M * K * 4), be->zero(be, w.p, N * K * 2);
    be->zero(be, tb.p, 4), be->zero(be, yb.p, 4), be->zero(be, img.p, 4 * 8 * 8 * 4);
    expect(dc_backend_status(be) == 0, "status 0 before the error");
    be->linear_fwd(be, o, x, w, dc_buf_none(), M, K, N);
    int st = dc_backend_status(be);
    printf("     dtypes: %s\n", dc_error());
    expect(st == -1 && has(dc_error(), "dtypes differ") && has(dc_error(), "linear_fwd"),
           "linear_fwd with F32 input and BF16 weight: status -1 naming the op and the dtypes");
    dc_error_clear();
    expect(dc_backend_status(be) == -1 && has(dc_error(), "dtypes differ"), "the error stays (status again)");
    float h[4] = {1, 2, 3, 4};
    be->download(be, h, o.p, sizeof h);
    expect(isnan(h[0]) && isnan(h[3]), "a download after the error returns NaN, not stale numbers");
    dc_error_clear();
    void *late = be->alloc(be, 1024);
    expect(!late && has(dc_error(), "dtypes differ"), "an allocation after the error fails with its message");
    dc_error_clear();
    int frc = dc_dit_forward(&m, mo, img, tb, yb, 1);
    expect(frc == -1 && has(dc_error(), "dtypes differ"), "dc_dit_forward on the failed backend returns its error");
    dc_error_clear();
    int brc = dc_dit_backward(&m, mo, 1);
    expect(brc == -1 && has(dc_error(), "dtypes differ"), "dc_dit_backward returns it too");
    const dc_cond label = {.y = yb};  // label 0
    uint32_t idx = 0;
    dc_error_clear();
    int src = dc_sampler_run(&smp, img, &label, &idx, 1, eval_dit, &m, NULL, NULL);
    expect(src == -1 && has(dc_error(), "dtypes differ"), "dc_sampler_run on the failed backend returns its error");
    dc_sampler_free(&smp);
    dc_buf bufs[] = {x, w, o, img, tb, yb, mo};
    for (int i = 0; i < 7; i++) be->free(be, bufs[i].p);
    dc_dit_free(&m);
    dc_backend_destroy(be);

    // 3. Attention the device cannot hold: reserve refuses it up front; an
    //    op outside the contract after a legal reserve records an error naming it.
    if (!(be = fresh())) return;
    dc_error_clear();
    int rrc = be->reserve(be, 1 << 23, 512);
    expect(rrc == -1 && has(dc_error(), "head size 512") && has(dc_error(), "too long"),
           "reserve for 8M tokens of head size 512: -1 naming it");
    expect(be->reserve(be, 4096, 512) == 0 && dc_backend_status(be) == 0, "reserve for 4096 tokens of 512 works");
    int64_t n3 = 16 * 3 * 320;
    bad_attn a = {be, {be->alloc(be, 16 * 320 * 4), g_ct}, {be->alloc(be, 2 * 16 * 4), DC_F32},
                  {be->alloc(be, n3 * 4), g_ct}};
    be->zero(be, a.qkv.p, n3 * dc_dtype_size(g_ct));
    run_bad_attention(&a);
    printf("     causal: %s\n", dc_backend_status(be) ? dc_error() : "(no error)");
    expect(dc_backend_status(be) == -1 && has(dc_error(), "at least as many keys"),
           "causal attn_fwd with 16 queries and 8 keys after a legal reserve: status -1 naming it");
    be->free(be, a.out.p), be->free(be, a.lse.p), be->free(be, a.qkv.p);
    dc_backend_destroy(be);

    // 4. The same op inside a graph capture whose function does not check: no graph, the op's error.
    if (!(be = fresh())) return;
    a = (bad_attn){be, {be->alloc(be, 16 * 320 * 4), g_ct}, {be->alloc(be, 2 * 16 * 4), DC_F32},
                   {be->alloc(be, n3 * 4), g_ct}};
    dc_error_clear();
    void *graph = be->graph_capture(be, run_bad_attention, &a);
    expect(!graph && has(dc_error(), "at least as many keys"), "graph_capture of a failing op: NULL with the op's error");
    if (graph) be->graph_free(be, graph);
    be->free(be, a.out.p), be->free(be, a.lse.p), be->free(be, a.qkv.p);
    dc_backend_destroy(be);

    // 5. A new backend after all this computes again: a small fp32 product against doubles.
    if (!(be = fresh())) return;
    float hx[4 * 8], hw[8 * 8], ho[4 * 8];
    for (int i = 0; i < M * K; i++) hx[i] = (float)rnd(-1, 1);
    for (int i = 0; i < N * K; i++) hw[i] = (float)rnd(-1, 1);
    dc_buf gx = {be->alloc(be, sizeof hx), DC_F32}, gw = {be->alloc(be, sizeof hw), DC_F32};
    dc_buf go = {be->alloc(be, sizeof ho), DC_F32};
    be->upload(be, gx.p, hx, sizeof hx), be->upload(be, gw.p, hw, sizeof hw);
    be->linear_fwd(be, go, gx, gw, dc_buf_none(), M, K, N);
    be->download(be, ho, go.p, sizeof ho);
    double err = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double r = 0;
            for (int k = 0; k < K; k++) r += (double)hx[i * K + k] * hw[j * K + k];
            err = fmax(err, isnan(ho[i * N + j]) ? INFINITY : fabs(ho[i * N + j] - r));
        }
    int fst = dc_backend_status(be);
    snprintf(what, sizeof what, "a fresh backend works again: status %d, product max error %.1e", fst, err);
    expect(fst == 0 && err < 1e-4, what);
    be->free(be, gx.p), be->free(be, gw.p), be->free(be, go.p);
    dc_backend_destroy(be);

    // 6. A conv whose shape was never reserved: an error naming reserve_conv, no allocation inside the op.
    if (!(be = fresh())) return;
    dc_conv2d_shape cs = {1, 4, 8, 8, 4, 3, 1, 1, 1, 1, 1};
    dc_buf cx = {be->alloc(be, 4 * 64 * 4), g_ct}, cw = {be->alloc(be, 4 * 4 * 9 * 4), g_ct};
    dc_buf co = {be->alloc(be, 4 * 64 * 4), g_ct};
    be->zero(be, cx.p, 4 * 64 * 4), be->zero(be, cw.p, 4 * 4 * 9 * 4);
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &cs);
    int cst = dc_backend_status(be);
    printf("     conv: %s\n", cst ? dc_error() : "(no error)");
    expect(cst == -1 && has(dc_error(), "reserve_conv") && has(dc_error(), "conv2d_fwd"),
           "conv2d_fwd before reserve_conv: status -1 naming the op and reserve_conv");
    be->free(be, cx.p), be->free(be, cw.p), be->free(be, co.p);
    dc_backend_destroy(be);
    // 7. ... and after it, a conv of another shape than the ones reserved.
    if (!(be = fresh())) return;
    dc_conv2d_shape big = {1, 4, 8, 8, 4, 3, 2, 0, 1, 0, 1}, other = big;
    other.B = 64;  // its padded copy would not fit the scratch
    cx = (dc_buf){be->alloc(be, 64 * 4 * 64 * 4), g_ct}, cw = (dc_buf){be->alloc(be, 4 * 4 * 9 * 4), g_ct};
    co = (dc_buf){be->alloc(be, 64 * 4 * 16 * 4), g_ct};
    be->zero(be, cx.p, 64 * 4 * 64 * 4), be->zero(be, cw.p, 4 * 4 * 9 * 4);
    expect(be->reserve_conv(be, &big) == 0, "reserve_conv of a stride-2 conv with padding (0,1,0,1)");
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &big);
    expect(dc_backend_status(be) == 0, "its forward runs");
    be->conv2d_fwd(be, co, cx, cw, dc_buf_none(), &other);
    cst = dc_backend_status(be);
    printf("     conv: %s\n", cst ? dc_error() : "(no error)");
    expect(cst == -1 && has(dc_error(), "not reserved"), "the same conv on 64 images, not reserved: an error saying so");
    be->free(be, cx.p), be->free(be, cw.p), be->free(be, co.p);
    dc_backend_destroy(be);
}

// Groups to run: all, or those named in the second argument ("attention,adaln").
static const char *g_groups = "all";
static bool want(const char *group) {
    if (strcmp(g_groups, "all") == 0) return true;
    const char *p = strstr(g_groups, group);
    return p && (p == g_groups || p[-1] == ',');
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    if (argc > 2) g_groups = argv[2];
    g_rng = seed * 2654435761u + 88172645463325252ull;
    printf("test_cuda: seed %llu\n", (unsigned long long)seed);
    g_cpu = dc_backend_cpu_create();
    if (g_cpu->reserve(g_cpu, 16384, 128)) return printf("cpu reserve: %s\n", dc_error()), 1;
    {   // The CPU backend finishes every op before returning: nothing is left to report.
        float v[3] = {1, 2, 3};
        dc_buf b = {g_cpu->alloc(g_cpu, sizeof v), DC_F32};
        g_cpu->upload(g_cpu, b.p, v, sizeof v);
        g_cpu->gelu_fwd(g_cpu, b, b, 3);
        g_cpu->download(g_cpu, v, b.p, sizeof v);
        g_cpu->free(g_cpu, b.p);
        expect(dc_backend_status(g_cpu) == 0 && v[0] > 0.8f && v[0] < 0.85f, "cpu: status 0 after ops");
    }
    for (int mode = 0; mode < 2; mode++) {
        g_gpu = dc_backend_cuda_create(mode == 0);
        if (!g_gpu) {
            printf("SKIP test_cuda: %s\n", dc_error());
            dc_backend_destroy(g_cpu);
            return g_fail ? 1 : 0;
        }
        g_ct = g_gpu->compute;
        g_tol = g_ct == DC_F32 ? 1e-5 : 1e-2;
        printf("== %s (compute %s) ==\n", g_gpu->name, dc_dtype_name(g_ct));
        if (want("linear")) {
            test_linear(300, 96, 200, false, 0);
            test_linear(1024, 1152, 1152, false, 0);
            test_linear(257, 16, 72, true, 0);
            test_linear(1, 64, 96, false, 0);   // one row (batch 1 without guidance)
            test_linear(130, 96, 200, false, 3);
            test_mlp(512, 256, 1024);
            test_mlp(100, 72, 288);
        }
        if (want("pointwise")) test_pointwise(), test_embeddings();
        if (want("adaln")) test_adaln(3, 64, 96), test_adaln(2, 256, 1152);
        if (want("attention")) {
            test_attention(2, 49, 64, 4);     // demo model: Dh 16, T 49
            test_attention(2, 256, 1152, 16); // DiT-XL/2: Dh 72
            test_attention(1, 100, 192, 3);   // Dh 64, ragged tiles
            test_attention(1, 130, 256, 2);   // Dh 128
            test_attention(1, 77, 100, 4);    // Dh 25: not a multiple of 8
            test_attention(1, 16384, 40, 1);  // SD at 1024 px: 16384 tokens of head size 40
            test_attention_unsupported();
        }
        if (want("diffusion")) test_diffusion(), test_optim();
        if (want("conv")) {
            test_conv(2, 8, 12, 10, 16, 3, 1, 1, 1, 1, 1, true);     // 3x3, H != W, Ci != Co
            test_conv(2, 16, 16, 12, 16, 3, 2, 0, 1, 0, 1, true);    // SD VAE downsampling
            test_conv(2, 6, 9, 11, 10, 3, 2, 0, 1, 0, 1, true);      // the same, odd sizes
            test_conv(2, 32, 8, 6, 24, 1, 1, 0, 0, 0, 0, true);      // 1x1
            test_conv(1, 32, 16, 16, 3, 3, 1, 1, 1, 1, 1, false);    // to RGB, no bias
            test_conv(2, 5, 7, 9, 4, 3, 1, 0, 2, 2, 0, true);        // asymmetric, stride 1
            test_conv(2, 64, 32, 32, 128, 3, 1, 1, 1, 1, 1, true);   // a UNet-sized one
            test_conv(2, 64, 16, 16, 64, 3, 2, 1, 1, 1, 1, true);    // symmetric stride 2 (UNet)
        }
        if (want("norm")) {
            test_group_norm(2, 64, 64, 32, true, 1e-6f, g_ct);
            test_group_norm(2, 64, 64, 32, false, 1e-5f, g_ct);
            test_group_norm(2, 128, 32 * 32, 32, true, 1e-6f, DC_F32);
            test_group_norm(3, 96, 35, 32, true, 1e-5f, g_ct);  // odd pixel count: no vector accesses
            test_group_norm(1, 8, 4096, 1, false, 1e-5f, g_ct);  // one group of all channels
            test_layer_norm(154, 768, 1e-5f, DC_F32);             // CLIP text encoder, batch 2
            test_layer_norm(154, 768, 1e-5f, g_ct);
            test_layer_norm(5, 100, 1e-6f, g_ct);
        }
        if (want("latent")) test_latent_pointwise(0), test_latent_pointwise(1);
        if (want("model")) test_model();
        if (want("errors")) test_errors();
        dc_backend_destroy(g_gpu);
    }
    dc_backend_destroy(g_cpu);
    printf("test_cuda: %d checks, %d failed\n", g_count, g_fail);
    return g_fail ? 1 : 0;
}
