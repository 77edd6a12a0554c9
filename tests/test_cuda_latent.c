// The CUDA backend against the CPU backend, the ops that latent diffusion adds
// (Stable Diffusion's UNet, VAE and text encoder): convolutions (forward,
// backward, run twice and replayed from a graph, bit for bit), GroupNorm(+SiLU),
// LayerNorm, nearest 2x upsampling, GEGLU and the activations, in both GPU
// modes (fp32 for checking, bf16 mixed precision), on fresh random inputs. The
// CPU reference reads the same values, rounded to bf16 where the GPU's input is
// bf16, so the error measured is the GPU's own arithmetic.
//
// Error: ||gpu - cpu|| / ||cpu|| per output; NaN fails. Tolerances per mode.
// Skips (exit 0, with a message) where no GPU is present.
//
//   build/tests/test_cuda_latent [seed] [all | groups: conv,norm,latent]
#include "cuda_check.h"

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

static void run_groups(void) {
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
}

int main(int argc, char **argv) { return cuda_main("test_cuda_latent", argc, argv, run_groups); }
