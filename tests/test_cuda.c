// The CUDA backend against the CPU backend, the ops of the DiT: every op on
// fresh random inputs, in both GPU modes (fp32 for checking, bf16 mixed
// precision), then a whole DiT forward and backward and a guided sampling run.
// Buffers get the dtypes the model gives them (the residual stream and
// statistics fp32, activations in the compute dtype); the CPU reference reads
// the same values, rounded to bf16 where the GPU's input is bf16, so the error
// measured is the GPU's own arithmetic. The latent-diffusion ops (convolutions,
// norms, upsampling, GEGLU, activations) are in test_cuda_latent.c, errors
// coming back as errors in test_cuda_errors.c, attention's layouts in
// test_cuda_attention.c.
//
// Error: ||gpu - cpu|| / ||cpu|| per output; NaN fails. Tolerances per mode.
// Skips (exit 0, with a message) where no GPU is present.
//
//   build/tests/test_cuda [seed] [all | groups: linear,pointwise,adaln,attention,diffusion,model,device]
#include <unistd.h>

#include "cuda_check.h"

// ---- ops ---------------------------------------------------------------------------------
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
    // out += x w^T + b, onto a random start
    pair acc = rand_pair((int64_t)M * N, ot, -1, 1);
    g_cpu->linear_fwd_acc(g_cpu, acc.c, x.c, w.c, b.c, M, K, N);
    g_gpu->linear_fwd_acc(g_gpu, acc.g, x.g, w.g, b.g, M, K, N);
    snprintf(name, sizeof name, "linear_fwd_acc %dx%dx%d%s%s", M, K, N, out32 ? " (fp32 out)" : "",
             off ? " (w, b unaligned)" : "");
    compare(name, acc, out32 && g_ct == DC_F32 ? 1e-5 : g_tol);
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
    // DC_BWD_DW_SET writes them over NaN: the bits of adding to zero
    pair sw = nan_pair((int64_t)N * K, DC_F32), sb = nan_pair(N, DC_F32);
    pair aw = rand_pair((int64_t)N * K, DC_F32, 0, 0), ab = rand_pair(N, DC_F32, 0, 0);
    g_cpu->linear_bwd(g_cpu, dc_buf_none(), sw.c, sb.c, dout.c, x.c, w.c, M, K, N, DC_BWD_DW_SET);
    g_gpu->linear_bwd(g_gpu, dc_buf_none(), sw.g, sb.g, dout.g, x.g, w.g, M, K, N, DC_BWD_DW_SET);
    g_gpu->linear_bwd(g_gpu, dc_buf_none(), aw.g, ab.g, dout.g, x.g, w.g, M, K, N, 0);
    expect_written("linear_bwd", sw, aw, sb, ab, g_ct == DC_F32 ? 1e-5 : 1e-3);
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
    pair cl = rand_pair(n, g_ct, -40, 30);
    g_cpu->clamp(g_cpu, cl.c, n, -30.0f, 20.0f), g_gpu->clamp(g_gpu, cl.g, n, -30.0f, 20.0f);
    compare("clamp", cl, 0);
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
    {  // views one element in: not 16-byte aligned, so the scalar kernels run
        pair g = rand_pair(n, DC_F32, -1, 1);
        g_cpu->grad_norm(g_cpu, gs.c, dc_buf_at(g.c, 1), n - 1, 100.0f);
        g_gpu->grad_norm(g_gpu, gs.g, dc_buf_at(g.g, 1), n - 1, 100.0f);
        compare("grad_norm, unaligned", gs, 1e-6);
        dc_adamw_step h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1 - powf(0.9f, 4), 1 - powf(0.999f, 4), 0.7f, 0.99f};
        g_cpu->adamw(g_cpu, dc_buf_at(p.c, 1), dc_buf_at(g.c, 1), dc_buf_at(m.c, 1), dc_buf_at(v.c, 1),
                     dc_buf_at(e.c, 1), dc_buf_at(pc.c, 1), dc_buf_at(gs.c, 1), n - 1, &h);
        g_gpu->adamw(g_gpu, dc_buf_at(p.g, 1), dc_buf_at(g.g, 1), dc_buf_at(m.g, 1), dc_buf_at(v.g, 1),
                     dc_buf_at(e.g, 1), dc_buf_at(pc.g, 1), dc_buf_at(gs.g, 1), n - 1, &h);
        compare("adamw p, unaligned", p, 1e-6), compare("adamw ema, unaligned", e, 1e-6);
        compare("adamw compute copy, unaligned", pc, g_ct == DC_F32 ? 1e-6 : 4e-3);
    }
    release();
}
// ---- a whole model ---------------------------------------------------------------------------
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
    dc_gaussian_sampler_opts so = dc_gaussian_sampler_opts_default();
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
    if (dc_gaussian_sampler_init(&sc, g_cpu, &so, C, S, S, NS) || dc_gaussian_sampler_init(&sg, g_gpu, &so, C, S, S, NS) ||
        dc_sampler_run(&sc, xs.c, &cc, is, NS, eval_dit, NULL, &mc, NULL, NULL) ||
        dc_sampler_run(&sg, xs.g, &cg, is, NS, eval_dit, NULL, &mg, NULL, NULL)) {
        printf("FAIL sampler: %s\n", dc_error());
        g_fail++;
    } else {
        compare("sampler, 6 guided steps (graph replay)", xs, g_ct == DC_F32 ? 1e-4 : 3e-2);
    }
    dc_sampler_free(&sc), dc_sampler_free(&sg);
    release();
    dc_dit_free(&mc), dc_dit_free(&mg);
}

// The energy counter, where the device reports one: a power limit of a real
// board's size, and a counter that grows over half a second with a large
// product in it (it counts idle power too, so it never stands still that long).
static void test_energy(void) {
    double j0, j1, limit;
    if (!g_gpu->energy || !g_gpu->energy(g_gpu, &j0, &limit)) {
        printf("  SKIP (no GPU energy counter) energy: this device reports none\n");
        return;
    }
    expect(limit > 10 && limit < 5000, "power limit between 10 W and 5 kW");
    expect(g_gpu->gemm_peak(g_gpu) > 0, "a large product runs");
    g_gpu->sync(g_gpu);
    usleep(500000);
    expect(g_gpu->energy(g_gpu, &j1, &limit) && j1 > j0 && j1 - j0 < 5000, "energy counter grows, by under 5 kJ");
    printf("  energy: %.1f J over the product and half a second; power limit %.0f W\n", j1 - j0, limit);
}

static void run_groups(void) {
    if (want("linear")) {
        test_linear(300, 96, 200, false, 0);
        test_linear(1024, 1152, 1152, false, 0);
        test_linear(4096, 64, 320, false, 0);   // the bias gradient's 8-column kernel: 64 slices, a partial block
        test_linear(1500, 32, 2560, false, 0);  // ... and a last slice of fewer rows
        test_linear(8192, 16, 4096, false, 0);  // ... in slices of the whole 512 rows
        test_linear(257, 16, 72, true, 0);
        test_linear(1, 64, 96, false, 0);   // one row (batch 1 without guidance)
        test_linear(130, 96, 200, false, 3);
        test_mlp(512, 256, 1024);
        test_mlp(100, 72, 288);
    }
    if (want("pointwise")) test_pointwise(), test_embeddings();
    if (want("adaln")) test_adaln(3, 64, 96), test_adaln(3, 37, 96), test_adaln(2, 256, 1152);
    if (want("attention")) {
        test_attention(2, 49, 64, 4);     // demo model: Dh 16, T 49
        test_attention(2, 256, 1152, 16); // DiT-XL/2: Dh 72
        test_attention(1, 100, 192, 3);   // Dh 64, ragged tiles
        test_attention(1, 130, 256, 2);   // Dh 128
        test_attention(1, 77, 100, 4);    // Dh 25: not a multiple of 8
        test_attention(1, 16384, 40, 1);  // SD at 1024 px: 16384 tokens of head size 40
    }
    if (want("diffusion")) test_diffusion(), test_optim();
    if (want("model")) test_model();
    if (want("device")) test_energy();
}

int main(int argc, char **argv) { return cuda_main("test_cuda", argc, argv, run_groups); }
