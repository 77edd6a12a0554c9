// The CUDA backend against the CPU backend, the ops that latent diffusion adds
// (Stable Diffusion's UNet, VAE and text encoder): convolutions (forward,
// backward, run twice and replayed from a graph, bit for bit), GroupNorm(+SiLU),
// LayerNorm, nearest 2x upsampling, GEGLU and the activations, in both GPU
// modes (fp32 for checking, bf16 mixed precision), on fresh random inputs. The
// CPU reference reads the same values, rounded to bf16 where the GPU's input is
// bf16, so the error measured is the GPU's own arithmetic.
// The channels-last (NHWC) forms of the convolution and GroupNorm are also
// held against the CPU's channels-first ops on the same values transposed, a
// reference that shares no code with either channels-last form; the
// backward ops of channels-last maps against the CPU's.
//
// Error: ||gpu - cpu|| / ||cpu|| per output; NaN fails. Tolerances per mode.
// Skips (exit 0, with a message) where no GPU is present.
//
//   build/tests/test_cuda_latent [seed] [all | groups: conv,norm,latent,nhwc]
#include "cuda_check.h"

// Copies the CPU's values of p to the GPU's copy (backward then starts from the same state).
static void sync_to_gpu(pair p) {
    float *h = malloc(p.n * 4);
    g_cpu->download(g_cpu, h, p.c.p, p.n * 4);
    put(p, h);
    free(h);
}

// The CPU copy of p (fp32), on the host.
static float *get_cpu(pair p) {
    float *h = malloc(p.n * 4);
    g_cpu->download(g_cpu, h, p.c.p, p.n * 4);
    return h;
}

// h[N, C, S] (channels-first) to [N, S, C] (to_last), or back.
static float *relayout(const float *h, int64_t N, int64_t C, int64_t S, bool to_last) {
    float *o = malloc(N * C * S * 4);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < S; i++) {
                const int64_t first = (n * C + c) * S + i, last = (n * S + i) * C + c;
                if (to_last) o[last] = h[first];
                else o[first] = h[last];
            }
    return o;
}

// A pair whose CPU copy holds h[n] (its GPU copy is not used).
static pair cpu_pair(const float *h, int64_t n) {
    pair p = make(n, DC_F32);
    g_cpu->upload(g_cpu, p.c.p, h, n * 4);
    return p;
}

// The channels-first form of p's CPU copy, [N, S, C] -> [N, C, S], in a new pair.
static pair cpu_first(pair p, int64_t N, int64_t C, int64_t S) {
    float *h = get_cpu(p), *f = relayout(h, N, C, S, false);
    pair q = cpu_pair(f, p.n);
    free(h), free(f);
    return q;
}

// Compares the GPU's channels-last result p [N, S, C] with ref, the CPU's
// channels-first result [N, C, S] of the same values.
static void compare_first(const char *name, pair p, pair ref, int64_t N, int64_t C, int64_t S, double tol) {
    float *h = get_cpu(ref), *r = relayout(h, N, C, S, true);
    pair q = make(p.n, p.g.dt);
    g_cpu->upload(g_cpu, q.c.p, r, p.n * 4);
    g_gpu->copy(g_gpu, q.g.p, p.g.p, p.n * dc_dtype_size(p.g.dt));
    compare(name, q, tol);
    free(h), free(r);
}

// reserve_conv of shape s on both backends; a failure is counted and printed.
static bool reserve_both(const dc_conv2d_shape *s, bool backward) {
    if (!g_cpu->reserve_conv(g_cpu, s, backward) && !g_gpu->reserve_conv(g_gpu, s, backward)) return true;
    printf("FAIL reserve_conv: %s\n", dc_error());
    g_fail++, g_count++;
    return false;
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
// nhwc: channels-last maps and weights, also checked against the CPU's
// channels-first conv of the same values.
// bias: 0 none, 1 in the compute dtype, 2 F32 (a bf16 model's F32 bias).
static void test_conv(int B, int Ci, int H, int W, int Co, int k, int stride, int pt, int pb, int pl, int pr,
                      int bias, bool nhwc) {
    char name[128];
    dc_conv2d_shape s = {B, Ci, H, W, Co, k, stride, pt, pb, pl, pr, nhwc};
    const int Ho = dc_conv2d_ho(&s), Wo = dc_conv2d_wo(&s);
    const int64_t nx = (int64_t)B * Ci * H * W, ny = (int64_t)B * Co * Ho * Wo, nw = (int64_t)Co * Ci * k * k;
    if (!reserve_both(&s, true)) return;
    pair x = rand_pair(nx, g_ct, -1, 1), w = rand_pair(nw, g_ct, -0.3, 0.3);
    pair b = rand_pair(Co, bias == 2 ? DC_F32 : g_ct, -1, 1);
    pair out = nan_pair(ny, g_ct);
    dc_buf bc = bias ? b.c : dc_buf_none(), bg = bias ? b.g : dc_buf_none();
    g_cpu->conv2d_fwd(g_cpu, out.c, x.c, w.c, bc, &s), g_gpu->conv2d_fwd(g_gpu, out.g, x.g, w.g, bg, &s);
    snprintf(name, sizeof name, "conv2d_fwd B%d %d->%d %dx%d k%d s%d pad %d,%d,%d,%d%s%s", B, Ci, Co, H, W, k,
             stride, pt, pb, pl, pr, nhwc ? " NHWC" : "", bias == 2 ? " (F32 bias)" : bias ? "" : " (no bias)");
    compare(name, out, g_ct == DC_F32 ? 1e-5 : 1e-2);
    pair dout = rand_pair(ny, g_ct, -1, 1), dx = nan_pair(nx, g_ct);
    pair dw = rand_pair(nw, DC_F32, -1, 1), db = rand_pair(Co, DC_F32, -1, 1);
    pair dw2 = make(nw, DC_F32), dx2 = make(nx, g_ct);
    pair dw0 = nhwc ? cpu_first(dw, Co, Ci, (int64_t)k * k) : dw;  // dw before +=, channels-first
    // the GPU's second copy of dw starts equal to its first: run twice, the bytes must agree
    g_gpu->copy(g_gpu, dw2.g.p, dw.g.p, nw * 4);
    g_cpu->conv2d_bwd(g_cpu, dx.c, dw.c, db.c, dout.c, x.c, w.c, &s, false);
    g_gpu->conv2d_bwd(g_gpu, dx.g, dw.g, db.g, dout.g, x.g, w.g, &s, false);
    compare("conv2d_bwd dx", dx, g_ct == DC_F32 ? 1e-5 : 1e-2);
    compare("conv2d_bwd dw (fp32 +=)", dw, g_ct == DC_F32 ? 1e-5 : 5e-3);
    compare("conv2d_bwd db (fp32 +=)", db, 1e-5);
    if (nhwc) {  // the same values channels-first through the CPU's NCHW conv
        dc_conv2d_shape sf = s;
        sf.nhwc = 0;
        if (g_cpu->reserve_conv(g_cpu, &sf, true)) {
            printf("FAIL reserve_conv (NCHW): %s\n", dc_error());
            g_fail++, g_count++;
        } else {
            const int64_t HW = (int64_t)H * W, HWo = (int64_t)Ho * Wo, kk = (int64_t)k * k;
            pair xf = cpu_first(x, B, Ci, HW), wf = cpu_first(w, Co, Ci, kk), df = cpu_first(dout, B, Co, HWo);
            pair of = make(ny, DC_F32), dxf = make(nx, DC_F32);
            g_cpu->conv2d_fwd(g_cpu, of.c, xf.c, wf.c, bc, &sf);
            g_cpu->conv2d_bwd(g_cpu, dxf.c, dw0.c, dc_buf_none(), df.c, xf.c, wf.c, &sf, false);
            compare_first("conv2d_fwd NHWC = NCHW transposed", out, of, B, Co, HWo, g_ct == DC_F32 ? 1e-5 : 1e-2);
            compare_first("conv2d_bwd dx NHWC = NCHW", dx, dxf, B, Ci, HW, g_ct == DC_F32 ? 1e-5 : 1e-2);
            compare_first("conv2d_bwd dw NHWC = NCHW", dw, dw0, Co, Ci, kk, g_ct == DC_F32 ? 1e-5 : 5e-3);
        }
    }
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
    // DC_BWD_DW_SET writes dw and db over NaN (added onto zero at an
    // unaligned offset, so the scalar kernel adds)
    pair sw = nan_pair(nw, DC_F32), sb = nan_pair(Co, DC_F32), aw = offset(rand_pair(nw + 1, DC_F32, 0, 0), 1);
    pair ab = rand_pair(Co, DC_F32, 0, 0);
    g_cpu->conv2d_bwd(g_cpu, dc_buf_none(), sw.c, sb.c, dout.c, x.c, w.c, &s, DC_BWD_DW_SET);
    g_gpu->conv2d_bwd(g_gpu, dc_buf_none(), sw.g, sb.g, dout.g, x.g, w.g, &s, DC_BWD_DW_SET);
    g_gpu->conv2d_bwd(g_gpu, dc_buf_none(), aw.g, ab.g, dout.g, x.g, w.g, &s, 0);
    expect_written("conv2d_bwd", sw, aw, sb, ab, g_ct == DC_F32 ? 1e-5 : 5e-3);
    // dx accumulated, weight and bias gradients skipped
    pair dxa = rand_pair(nx, g_ct, -1, 1);
    g_cpu->conv2d_bwd(g_cpu, dxa.c, dc_buf_none(), dc_buf_none(), dout.c, x.c, w.c, &s, true);
    g_gpu->conv2d_bwd(g_gpu, dxa.g, dc_buf_none(), dc_buf_none(), dout.g, x.g, w.g, &s, true);
    compare("conv2d_bwd dx (+=)", dxa, g_ct == DC_F32 ? 1e-5 : 1e-2);
    release();
}

// Winograd's F(4x4, 3x3) (cuda_conv_winograd.cu: bf16 channels-last 3x3
// convs of stride 1 with at least 640 input channels, maps of at most 32x32,
// or 64x64 in batches of 8, and at least 1024 2x2 blocks of outputs): the
// checks above on such a shape, then the forward again on cuDNN
// (opts.winograd off) must give other bits, so the path checked was Winograd's.
// conv2d_fwd_res: out = conv + b + r, channels-last. In bf16 with a bf16
// bias the residual joins cuDNN's graph epilogue (summed in fp32, rounded
// once); without a bias or with an F32 one, the plain convolution and an add.
// The CPU's convolution and add are the reference; r stays as it was, and a
// second call gives the same bits.
static void test_conv_res(int B, int Ci, int H, int W, int Co, int k, int bias) {
    char name[128];
    const int pad = k / 2;
    dc_conv2d_shape s = {B, Ci, H, W, Co, k, 1, pad, pad, pad, pad, true};
    const int64_t nx = (int64_t)B * Ci * H * W, ny = (int64_t)B * Co * H * W, nw = (int64_t)Co * Ci * k * k;
    if (!reserve_both(&s, false)) return;
    pair x = rand_pair(nx, g_ct, -1, 1), w = rand_pair(nw, g_ct, -0.3, 0.3);
    pair b = rand_pair(Co, bias == 2 ? DC_F32 : g_ct, -1, 1), r = rand_pair(ny, g_ct, -2, 2);
    pair out = nan_pair(ny, g_ct), out2 = nan_pair(ny, g_ct), r0 = make(ny, g_ct);
    g_gpu->copy(g_gpu, r0.g.p, r.g.p, ny * dc_dtype_size(g_ct));
    dc_buf bc = bias ? b.c : dc_buf_none(), bg = bias ? b.g : dc_buf_none();
    g_cpu->conv2d_fwd_res(g_cpu, out.c, x.c, w.c, bc, r.c, &s);
    g_gpu->conv2d_fwd_res(g_gpu, out.g, x.g, w.g, bg, r.g, &s);
    snprintf(name, sizeof name, "conv2d_fwd_res B%d %d->%d %dx%d k%d%s", B, Ci, Co, H, W, k,
             bias == 2 ? " (F32 bias)" : bias ? "" : " (no bias)");
    compare(name, out, g_ct == DC_F32 ? 1e-5 : 1e-2);
    expect_same("conv2d_fwd_res leaves the residual as it was", r, r0);
    g_gpu->conv2d_fwd_res(g_gpu, out2.g, x.g, w.g, bg, r.g, &s);
    expect_same("conv2d_fwd_res run twice: bit for bit", out, out2);
    release();
}

static void test_winograd(int B, int Ci, int H, int W, int Co, int bias) {
    test_conv(B, Ci, H, W, Co, 3, 1, 1, 1, 1, 1, bias, true);
    if (g_ct != DC_BF16) return;
    dc_conv2d_shape s = {B, Ci, H, W, Co, 3, 1, 1, 1, 1, 1, true};
    const int64_t nx = (int64_t)B * Ci * H * W, ny = (int64_t)B * Co * H * W, nw = (int64_t)Co * Ci * 9;
    if (g_gpu->reserve_conv(g_gpu, &s, false)) {
        printf("FAIL reserve_conv: %s\n", dc_error());
        g_fail++, g_count++;
        return;
    }
    pair x = rand_pair(nx, g_ct, -1, 1), w = rand_pair(nw, g_ct, -0.3, 0.3), b = rand_pair(Co, g_ct, -1, 1);
    pair o1 = nan_pair(ny, g_ct), o2 = nan_pair(ny, g_ct);
    g_gpu->conv2d_fwd(g_gpu, o1.g, x.g, w.g, b.g, &s);
    g_gpu->opts.winograd = false;
    g_gpu->conv2d_fwd(g_gpu, o2.g, x.g, w.g, b.g, &s);
    g_gpu->opts.winograd = true;
    const size_t bytes = (size_t)ny * dc_dtype_size(g_ct);
    char *h1 = malloc(bytes), *h2 = malloc(bytes);
    g_gpu->download(g_gpu, h1, o1.g.p, bytes), g_gpu->download(g_gpu, h2, o2.g.p, bytes);
    char what[128];
    snprintf(what, sizeof what, "conv2d_fwd B%d %d->%d %dx%d: Winograd's bits, not cuDNN's", B, Ci, Co, H, W);
    expect(!dc_backend_status(g_gpu) && memcmp(h1, h2, bytes) != 0, what);
    // weights frozen: the transformed weights made on the first call and kept
    // for the second give the same bits; unfrozen, they are dropped, and new
    // values at the same address are seen
    g_gpu->freeze_weights(g_gpu, true);
    g_gpu->conv2d_fwd(g_gpu, o2.g, x.g, w.g, b.g, &s);
    g_gpu->download(g_gpu, h2, o2.g.p, bytes);
    bool same = memcmp(h1, h2, bytes) == 0;
    g_gpu->conv2d_fwd(g_gpu, o2.g, x.g, w.g, b.g, &s);
    g_gpu->download(g_gpu, h2, o2.g.p, bytes);
    same = same && memcmp(h1, h2, bytes) == 0;
    g_gpu->freeze_weights(g_gpu, false);
    expect(!dc_backend_status(g_gpu) && same, "  the same bits with the weights frozen (transforms kept)");
    pair w2 = rand_pair(nw, g_ct, -0.3, 0.3);
    g_gpu->conv2d_fwd(g_gpu, o1.g, x.g, w2.g, b.g, &s);  // the new weights at their own address
    g_gpu->copy(g_gpu, w.g.p, w2.g.p, (size_t)nw * dc_dtype_size(g_ct));
    g_gpu->freeze_weights(g_gpu, true);                  // frozen again: nothing old kept
    g_gpu->conv2d_fwd(g_gpu, o2.g, x.g, w.g, b.g, &s);   // and at the old one
    g_gpu->freeze_weights(g_gpu, false);
    g_gpu->download(g_gpu, h1, o1.g.p, bytes), g_gpu->download(g_gpu, h2, o2.g.p, bytes);
    expect(!dc_backend_status(g_gpu) && memcmp(h1, h2, bytes) == 0, "  unfrozen: new weights at the same address seen");
    free(h1), free(h2);
    // maps of values up to 2000 (ungroupnormed, as an upsampler's conv reads):
    // the fp16 planes' range holds them, within 1e-2 of cuDNN's result
    pair xb = rand_pair(nx, g_ct, -2000, 2000);
    g_gpu->conv2d_fwd(g_gpu, o1.g, xb.g, w2.g, b.g, &s);
    g_gpu->opts.winograd = false;
    g_gpu->conv2d_fwd(g_gpu, o2.g, xb.g, w2.g, b.g, &s);
    g_gpu->opts.winograd = true;
    float *f1 = get_gpu(o1), *f2 = get_gpu(o2);
    double num = 0, den = 0;
    bool finite = true;
    for (int64_t i = 0; i < ny; i++) {
        finite = finite && isfinite(f1[i]);
        num += ((double)f1[i] - f2[i]) * ((double)f1[i] - f2[i]), den += (double)f2[i] * f2[i];
    }
    const double err = sqrt(num / (den > 0 ? den : 1e-300));
    snprintf(what, sizeof what, "  values up to 2000: err %.2e from cuDNN's (tol 1e-02)%s", err,
             finite ? "" : ", not finite");
    expect(!dc_backend_status(g_gpu) && finite && err <= 1e-2, what);
    free(f1), free(f2);
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
    pair sg = nan_pair(C, DC_F32), sb = nan_pair(C, DC_F32), ag = rand_pair(C, DC_F32, 0, 0);
    pair ab = rand_pair(C, DC_F32, 0, 0);
    g_cpu->group_norm_bwd(g_cpu, dx.c, sg.c, sb.c, dout.c, x.c, mean.c, rstd.c, ga.c, be.c, B, C, HW, G, silu,
                          DC_BWD_DW_SET);
    g_gpu->group_norm_bwd(g_gpu, dx.g, sg.g, sb.g, dout.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu,
                          DC_BWD_DW_SET);
    g_gpu->group_norm_bwd(g_gpu, dx.g, ag.g, ab.g, dout.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu, 0);
    expect_written("group_norm_bwd", sg, ag, sb, ab, 1e-5);
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
    pair sg = nan_pair(D, DC_F32), sb = nan_pair(D, DC_F32), ag = rand_pair(D, DC_F32, 0, 0);
    pair ab = rand_pair(D, DC_F32, 0, 0);
    g_cpu->layer_norm_bwd(g_cpu, dx.c, sg.c, sb.c, dout.c, x.c, mean.c, rstd.c, ga.c, M, D, DC_BWD_DW_SET);
    g_gpu->layer_norm_bwd(g_gpu, dx.g, sg.g, sb.g, dout.g, x.g, mean.g, rstd.g, ga.g, M, D, DC_BWD_DW_SET);
    g_gpu->layer_norm_bwd(g_gpu, dx.g, ag.g, ab.g, dout.g, x.g, mean.g, rstd.g, ga.g, M, D, 0);
    expect_written("layer_norm_bwd", sg, ag, sb, ab, 1e-5);
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
        g_cpu->geglu_bwd(g_cpu, dx.c, dc_buf_none(), d.c, x.c, M, F);
        g_gpu->geglu_bwd(g_gpu, dx.g, dc_buf_none(), d.g, x.g, M, F);
        compare("geglu_bwd", dx, g_tol);
        // writing the forward's output over dout as it goes: geglu_fwd's bits on the GPU, dx the same
        pair dx2 = offset(nan_pair(M * 2 * F + off, g_ct), off);
        g_cpu->geglu_bwd(g_cpu, dx2.c, d.c, d.c, x.c, M, F), g_gpu->geglu_bwd(g_gpu, dx2.g, d.g, d.g, x.g, M, F);
        compare("geglu_bwd with out", dx2, g_tol);
        compare("geglu_bwd's out", d, g_tol);
        snprintf(name, sizeof name, "geglu_bwd's out: geglu_fwd's bits M%lld F%d%s", (long long)M, F, sfx);
        expect_same(name, d, o);
        expect_same("geglu_bwd with out: dx's bits", dx2, dx);
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

// GroupNorm(+SiLU) over channels-last x[B, HW, C] in dtype xt: against the
// CPU's channels-last op and its channels-first one on the same values
// transposed; run twice, and on copies of the inputs at an odd offset (no
// vector accesses), the same bits.
// The feed-forward's first product with its gate (linear_geglu_fwd): on a
// Hopper GPU in bf16 the fused kernel where the call fits (K a multiple of 8,
// F of 64, at least 8 blocks of 128 x 64 an SM: the large cases), with rows
// past a block and K past a stage of 64; else the product and the GEGLU pass.
// Without scratch (pre none) the op runs only where it fuses: then the same
// bits as with it; the CPU never runs it so. bias: 0 none, 1 in the compute
// dtype, 2 F32.
static void test_linear_geglu(int M, int K, int F, int bias) {
    char name[128];
    const int64_t nx = (int64_t)M * K, no = (int64_t)M * F;
    pair x = rand_pair(nx, g_ct, -1, 1), w = rand_pair(2LL * F * K, g_ct, -0.3, 0.3);
    pair o = nan_pair(no, g_ct), pre = nan_pair(2 * no, g_ct);
    dc_buf bc = dc_buf_none(), bg = dc_buf_none();
    if (bias) {
        pair b = rand_pair(2LL * F, bias == 2 ? DC_F32 : g_ct, -1, 1);
        bc = b.c, bg = b.g;
    }
    g_cpu->linear_geglu_fwd(g_cpu, o.c, pre.c, x.c, w.c, bc, M, K, F);
    g_gpu->linear_geglu_fwd(g_gpu, o.g, pre.g, x.g, w.g, bg, M, K, F);
    snprintf(name, sizeof name, "linear_geglu_fwd M%d K%d F%d%s", M, K, F,
             bias == 2 ? " (F32 bias)" : bias ? "" : " (no bias)");
    compare(name, o, g_tol);
    pair o2 = nan_pair(no, g_ct);
    expect(!g_cpu->linear_geglu_fwd(g_cpu, o2.c, dc_buf_none(), x.c, w.c, bc, M, K, F),
           "linear_geglu_fwd without scratch: not run on the CPU");
    if (g_gpu->linear_geglu_fwd(g_gpu, o2.g, dc_buf_none(), x.g, w.g, bg, M, K, F)) {
        snprintf(name + strlen(name), sizeof name - strlen(name), " without scratch: the same bits");
        expect_same(name, o, o2);
    }
}

// Several products of one input (linear_many_fwd, a UNet's time projections):
// n jobs of widths cycling through SD's 320, 640 and 1280 and a narrow 8, the
// biases in the compute dtype, F32 or none; in bf16, one kernel up to 16
// rows and 32 jobs a launch (more jobs: several launches), cuBLAS beyond.
static void test_linear_many(int M, int K, int n) {
    enum { MAXJ = 40 };
    const int widths[4] = {320, 640, 1280, 8};
    char name[128];
    pair x = rand_pair((int64_t)M * K, g_ct, -1, 1), out[MAXJ];
    dc_linear_job jc[MAXJ], jg[MAXJ];
    for (int j = 0; j < n && j < MAXJ; j++) {
        const int N = widths[j % 4];
        pair w = rand_pair((int64_t)N * K, g_ct, -0.05, 0.05), b = rand_pair(N, j % 3 == 1 ? DC_F32 : g_ct, -1, 1);
        out[j] = nan_pair((int64_t)M * N, g_ct);
        const bool bias = j % 3 != 2;
        jc[j] = (dc_linear_job){out[j].c, w.c, bias ? b.c : dc_buf_none(), N};
        jg[j] = (dc_linear_job){out[j].g, w.g, bias ? b.g : dc_buf_none(), N};
    }
    g_cpu->linear_many_fwd(g_cpu, jc, n, x.c, M, K);
    g_gpu->linear_many_fwd(g_gpu, jg, n, x.g, M, K);
    for (int j = 0; j < n; j++) {
        snprintf(name, sizeof name, "linear_many_fwd M%d K%d job %d of %d (N %d)", M, K, j, n, jc[j].N);
        compare(name, out[j], g_tol);
    }
    release();
}

static void test_group_norm_nhwc(int B, int C, int64_t HW, int G, bool silu, float eps, dc_dtype xt) {
    char name[128];
    const int64_t n = (int64_t)B * C * HW, ns = (int64_t)B * G;
    pair x = rand_pair(n, xt, -3, 5), ga = rand_pair(C, g_ct, 0.5, 1.5), be = rand_pair(C, g_ct, -0.5, 0.5);
    pair out = nan_pair(n, g_ct), mean = nan_pair(ns, DC_F32), rstd = nan_pair(ns, DC_F32);
    g_cpu->group_norm_nhwc_fwd(g_cpu, out.c, mean.c, rstd.c, x.c, ga.c, be.c, B, C, HW, G, eps, silu);
    g_gpu->group_norm_nhwc_fwd(g_gpu, out.g, mean.g, rstd.g, x.g, ga.g, be.g, B, C, HW, G, eps, silu);
    snprintf(name, sizeof name, "group_norm_nhwc_fwd B%d C%d HW%lld G%d%s (x %s)", B, C, (long long)HW, G,
             silu ? " +silu" : "", dc_dtype_name(xt));
    compare(name, out, g_tol);
    compare("group_norm_nhwc_fwd mean", mean, 1e-5);
    compare("group_norm_nhwc_fwd rstd", rstd, 1e-5);
    // the channels-first op on the same values
    pair xf = cpu_first(x, B, C, HW), of = make(n, DC_F32), mf = make(ns, DC_F32), rf = make(ns, DC_F32);
    g_cpu->group_norm_fwd(g_cpu, of.c, mf.c, rf.c, xf.c, ga.c, be.c, B, C, HW, G, eps, silu);
    compare_first("group_norm_nhwc_fwd = NCHW transposed", out, of, B, C, HW, g_tol);
    compare_first("group_norm_nhwc_fwd mean = NCHW", mean, mf, B, 1, G, 1e-5);
    compare_first("group_norm_nhwc_fwd rstd = NCHW", rstd, rf, B, 1, G, 1e-5);
    // again, and from inputs one element off their alignment: the same bits
    pair out2 = make(n, g_ct), mean2 = make(ns, DC_F32), rstd2 = make(ns, DC_F32);
    g_gpu->group_norm_nhwc_fwd(g_gpu, out2.g, mean2.g, rstd2.g, x.g, ga.g, be.g, B, C, HW, G, eps, silu);
    expect_same("group_norm_nhwc_fwd run twice: bit for bit", out, out2);
    pair xu = offset(make(n + 1, xt), 1), ou = offset(make(n + 1, g_ct), 1);
    g_gpu->copy(g_gpu, xu.g.p, x.g.p, n * dc_dtype_size(xt));
    g_gpu->group_norm_nhwc_fwd(g_gpu, ou.g, mean2.g, rstd2.g, xu.g, ga.g, be.g, B, C, HW, G, eps, silu);
    expect_same("group_norm_nhwc_fwd unaligned: bit for bit", out, ou);
    expect_same("group_norm_nhwc_fwd unaligned: mean bit for bit", mean, mean2);
    expect_same("group_norm_nhwc_fwd unaligned: rstd bit for bit", rstd, rstd2);
    // the second half alone, from the kept statistics: the same bits on each backend
    pair oa = nan_pair(n, g_ct);
    g_cpu->group_norm_nhwc_apply(g_cpu, oa.c, mean.c, rstd.c, x.c, ga.c, be.c, B, C, HW, G, silu);
    g_gpu->group_norm_nhwc_apply(g_gpu, oa.g, mean.g, rstd.g, x.g, ga.g, be.g, B, C, HW, G, silu);
    expect_same("group_norm_nhwc_apply: the forward's bits (GPU)", out, oa);
    float *fc = get_cpu(out), *ac = get_cpu(oa);
    expect(memcmp(fc, ac, (size_t)n * 4) == 0, "group_norm_nhwc_apply: the forward's bits (CPU)");
    free(fc), free(ac);
    release();
}

// The backward ops of channels-last maps (training the UNet): GroupNorm(+SiLU)
// backward, upsampling's adjoint, the per-channel sum over pixels and
// concat's split, against the CPU's on the same values.
static void test_nhwc_backward(int B, int C, int H, int W, int G, bool silu) {
    char name[160], tag[64];
    const int64_t HW = (int64_t)H * W, n = B * C * HW, ns = (int64_t)B * G;
    snprintf(tag, sizeof tag, "B%d C%d %dx%d G%d%s", B, C, H, W, G, silu ? " +silu" : "");
    pair x = rand_pair(n, g_ct, -3, 5), ga = rand_pair(C, g_ct, 0.5, 1.5), be = rand_pair(C, g_ct, -0.5, 0.5);
    pair out = nan_pair(n, g_ct), mean = nan_pair(ns, DC_F32), rstd = nan_pair(ns, DC_F32);
    g_cpu->group_norm_nhwc_fwd(g_cpu, out.c, mean.c, rstd.c, x.c, ga.c, be.c, B, C, HW, G, 1e-5f, silu);
    sync_to_gpu(mean), sync_to_gpu(rstd);  // backward starts from the same statistics
    pair dy = rand_pair(n, g_ct, -1, 1), dx = rand_pair(n, g_ct, -1, 1);
    pair dg = rand_pair(C, DC_F32, -1, 1), db = rand_pair(C, DC_F32, -1, 1);
    for (int acc = 0; acc < 2; acc++) {
        g_cpu->group_norm_nhwc_bwd(g_cpu, dx.c, dg.c, db.c, dy.c, x.c, mean.c, rstd.c, ga.c, be.c, B, C, HW, G, silu,
                                   acc);
        g_gpu->group_norm_nhwc_bwd(g_gpu, dx.g, dg.g, db.g, dy.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu,
                                   acc);
        snprintf(name, sizeof name, "group_norm_nhwc_bwd dx%s %s", acc ? " +=" : "", tag);
        compare(name, dx, g_tol);
        compare("group_norm_nhwc_bwd dgamma +=", dg, g_tol);
        compare("group_norm_nhwc_bwd dbeta +=", db, g_tol);
    }
    // without the parameters' gradients, then from inputs one element off
    // their alignment (narrower accesses): the same bits
    const dc_buf none = dc_buf_none();
    pair dxa = nan_pair(n, g_ct), xu = offset(make(n + 1, g_ct), 1), dyu = offset(make(n + 1, g_ct), 1);
    pair dxo = offset(make(n + 1, g_ct), 1);
    g_gpu->copy(g_gpu, xu.g.p, x.g.p, n * dc_dtype_size(g_ct)), g_gpu->copy(g_gpu, dyu.g.p, dy.g.p, n * dc_dtype_size(g_ct));
    g_cpu->group_norm_nhwc_bwd(g_cpu, dxa.c, none, none, dy.c, x.c, mean.c, rstd.c, ga.c, be.c, B, C, HW, G, silu,
                               false);
    g_gpu->group_norm_nhwc_bwd(g_gpu, dxa.g, none, none, dy.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu,
                               false);
    snprintf(name, sizeof name, "group_norm_nhwc_bwd dx alone %s", tag);
    compare(name, dxa, g_tol);
    // the parameters' gradients written over NaN (the first piece of samples
    // writes, the others add)
    pair sg = nan_pair(C, DC_F32), sbeta = nan_pair(C, DC_F32), ag = rand_pair(C, DC_F32, 0, 0);
    pair abeta = rand_pair(C, DC_F32, 0, 0);
    g_cpu->group_norm_nhwc_bwd(g_cpu, none, sg.c, sbeta.c, dy.c, x.c, mean.c, rstd.c, ga.c, be.c, B, C, HW, G, silu,
                               DC_BWD_DW_SET);
    g_gpu->group_norm_nhwc_bwd(g_gpu, none, sg.g, sbeta.g, dy.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu,
                               DC_BWD_DW_SET);
    g_gpu->group_norm_nhwc_bwd(g_gpu, none, ag.g, abeta.g, dy.g, x.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu, 0);
    expect_written("group_norm_nhwc_bwd", sg, ag, sbeta, abeta, g_tol);
    g_gpu->group_norm_nhwc_bwd(g_gpu, dxo.g, none, none, dyu.g, xu.g, mean.g, rstd.g, ga.g, be.g, B, C, HW, G, silu,
                               false);
    expect_same("group_norm_nhwc_bwd unaligned: bit for bit", dxa, dxo);
    pair up = rand_pair(4 * n, g_ct, -1, 1), dxu = nan_pair(n, g_ct);
    g_cpu->upsample2x_nhwc_bwd(g_cpu, dxu.c, up.c, B, C, H, W), g_gpu->upsample2x_nhwc_bwd(g_gpu, dxu.g, up.g, B, C, H, W);
    snprintf(name, sizeof name, "upsample2x_nhwc_bwd %s", tag);
    compare(name, dxu, g_ct == DC_F32 ? 1e-6 : g_tol);
    pair dv = nan_pair((int64_t)B * C, g_ct);
    g_cpu->channel_sum_nhwc(g_cpu, dv.c, dy.c, B, C, HW), g_gpu->channel_sum_nhwc(g_gpu, dv.g, dy.g, B, C, HW);
    snprintf(name, sizeof name, "channel_sum_nhwc %s", tag);
    compare(name, dv, g_ct == DC_F32 ? 1e-5 : g_tol);
    const int C1 = C / 3, C2 = C - C1;
    pair sa = nan_pair(HW * B * C1, g_ct), sb = nan_pair(HW * B * C2, g_ct);
    g_cpu->split_channels(g_cpu, sa.c, C1, sb.c, C2, dy.c, B * HW);
    g_gpu->split_channels(g_gpu, sa.g, C1, sb.g, C2, dy.g, B * HW);
    snprintf(name, sizeof name, "split_channels %d+%d %s", C1, C2, tag);
    compare(name, sa, 0), compare(name, sb, 0);
    release();
}

// The two copies of concat_channels, recorded into a graph (as a sampler step is).
typedef struct {
    dc_buf out, a, b;
    int C1, C2;
    int64_t M;
} concat_call;
static int run_concat(void *arg) {
    concat_call *c = arg;
    g_gpu->concat_channels(g_gpu, c->out, c->a, c->C1, c->b, c->C2, c->M);
    return 0;
}

// Channels-last upsampling, per-channel add and concatenation. off > 0 shifts
// every buffer by that many elements: 1 leaves only one-value accesses, 4
// (8 bytes in BF16) 4-wide ones where offset 0 has 8-wide.
static void test_nhwc_pointwise(int off) {
    char name[128], sfx[32] = "";
    if (off) snprintf(sfx, sizeof sfx, " (offset %d)", off);
    static const struct { int B, C, H, W; } up[3] = {{2, 320, 8, 8}, {2, 36, 5, 7}, {1, 3, 4, 3}};
    for (int i = 0; i < 3; i++) {
        const int B = up[i].B, C = up[i].C, H = up[i].H, W = up[i].W;
        const int64_t n = (int64_t)B * C * H * W;
        pair x = offset(rand_pair(n + off, g_ct, -1, 1), off), o = offset(nan_pair(4 * n + off, g_ct), off);
        g_cpu->upsample2x_nhwc_fwd(g_cpu, o.c, x.c, B, C, H, W);
        g_gpu->upsample2x_nhwc_fwd(g_gpu, o.g, x.g, B, C, H, W);
        snprintf(name, sizeof name, "upsample2x_nhwc_fwd %dx%dx%dx%d%s", B, H, W, C, sfx);
        compare(name, o, 0);
        // against the channels-first op on the same values
        pair xf = cpu_first(x, B, C, (int64_t)H * W), of = make(4 * n, DC_F32);
        g_cpu->upsample2x_fwd(g_cpu, of.c, xf.c, B, C, H, W);
        compare_first("upsample2x_nhwc_fwd = NCHW transposed", o, of, B, C, 4 * (int64_t)H * W, 0);
    }
    static const struct { int B, C; int64_t HW; } ac[3] = {{2, 320, 64}, {3, 36, 35}, {2, 5, 9}};
    for (int i = 0; i < 3; i++) {
        const int B = ac[i].B, C = ac[i].C;
        const int64_t HW = ac[i].HW, n = B * C * HW;
        pair x = offset(rand_pair(n + off, g_ct, -1, 1), off), v = offset(rand_pair(B * C + off, g_ct, -1, 1), off);
        g_cpu->add_nhwc(g_cpu, x.c, dc_buf_none(), v.c, dc_buf_none(), B, C, HW);
        g_gpu->add_nhwc(g_gpu, x.g, dc_buf_none(), v.g, dc_buf_none(), B, C, HW);
        snprintf(name, sizeof name, "add_nhwc +v[b] B%d C%d HW%lld%s", B, C, (long long)HW, sfx);
        compare(name, x, g_ct == DC_F32 ? 0 : g_tol);  // one addition, rounded once
        // all three terms, the bias in the weights' dtype (as a conv's bias joins a residual)
        pair y = offset(rand_pair(n + off, g_ct, -1, 1), off), bias = offset(rand_pair(C + off, g_ct, -1, 1), off);
        g_cpu->add_nhwc(g_cpu, x.c, y.c, v.c, bias.c, B, C, HW), g_gpu->add_nhwc(g_gpu, x.g, y.g, v.g, bias.g, B, C, HW);
        snprintf(name, sizeof name, "add_nhwc +y +v[b] +bias B%d C%d HW%lld%s", B, C, (long long)HW, sfx);
        compare(name, x, g_ct == DC_F32 ? 1e-6 : g_tol);
    }
    static const struct { int C1, C2; int64_t M; } cc[3] = {{320, 640, 2 * 64}, {4, 8, 33}, {3, 5, 7}};
    for (int i = 0; i < 3; i++) {
        const int C1 = cc[i].C1, C2 = cc[i].C2;
        const int64_t M = cc[i].M, n = M * (C1 + C2);
        pair a = offset(rand_pair(M * C1 + off, g_ct, -1, 1), off), b = offset(rand_pair(M * C2 + off, g_ct, -1, 1), off);
        pair o = offset(nan_pair(n + off, g_ct), off), og = offset(nan_pair(n + off, g_ct), off);
        g_cpu->concat_channels(g_cpu, o.c, a.c, C1, b.c, C2, M);
        g_gpu->concat_channels(g_gpu, o.g, a.g, C1, b.g, C2, M);
        snprintf(name, sizeof name, "concat_channels M%lld %d+%d%s", (long long)M, C1, C2, sfx);
        compare(name, o, 0);
        concat_call call = {og.g, a.g, b.g, C1, C2, M};
        void *graph = g_gpu->graph_capture(g_gpu, run_concat, &call);
        if (graph) g_gpu->graph_launch(g_gpu, graph);
        else printf("     graph capture: %s\n", dc_error());
        expect(graph != NULL, "concat_channels: captured in a graph");
        expect_same("concat_channels replayed from a graph: bit for bit", o, og);
        if (graph) g_gpu->graph_free(g_gpu, graph);
    }
    release();
}

// Inputs the channels-last ops cannot take: each is an error recorded in the
// op's name (on a backend of its own: a recorded error ends a backend), and a
// layout flag other than 0 or 1 is refused at reserve_conv.
static void expect_op_error(void (*call)(dc_backend *be, void *buf), const char *op, const char *what) {
    dc_backend *be = dc_backend_cuda_create(g_ct == DC_F32);
    if (!be) {
        expect(false, dc_error());
        return;
    }
    void *buf = be->alloc(be, 4096);
    call(be, buf);
    const int st = dc_backend_status(be);
    printf("     %s: %s\n", op, st ? dc_error() : "(no error)");
    expect(st == -1 && strstr(dc_error(), op) != NULL, what);
    be->free(be, buf);
    dc_backend_destroy(be);
}
static void bad_concat(dc_backend *be, void *p) {
    be->concat_channels(be, (dc_buf){p, DC_F32}, (dc_buf){p, DC_BF16}, 4, (dc_buf){p, DC_F32}, 4, 8);
}
static void bad_concat_overlap(dc_backend *be, void *p) {
    // out [8, 8] F32 at p, a [8, 4] starting inside it
    be->concat_channels(be, (dc_buf){p, DC_F32}, (dc_buf){(float *)p + 16, DC_F32}, 4,
                        (dc_buf){(float *)p + 512, DC_F32}, 4, 8);
}
static void bad_group_norm(dc_backend *be, void *p) {
    const dc_buf f = {p, DC_F32};
    be->group_norm_nhwc_fwd(be, f, f, f, (dc_buf){p, DC_F16}, f, f, 1, 8, 4, 4, 1e-5f, false);
}
static void bad_group_norm_bwd(dc_backend *be, void *p) {
    const dc_buf f = {p, DC_F32};
    be->group_norm_nhwc_bwd(be, (dc_buf){p, DC_F16}, f, f, f, f, f, f, f, f, 1, 8, 4, 4, false, false);
}
static void bad_channel_sum(dc_backend *be, void *p) {
    be->channel_sum_nhwc(be, (dc_buf){p, DC_F32}, (dc_buf){p, DC_I32}, 1, 8, 4);
}
static void bad_upsample(dc_backend *be, void *p) {
    be->upsample2x_nhwc_fwd(be, (dc_buf){p, DC_F32}, (dc_buf){p, DC_I32}, 1, 4, 2, 2);
}
static void bad_add_channel(dc_backend *be, void *p) {
    be->add_nhwc(be, (dc_buf){p, DC_F16}, dc_buf_none(), (dc_buf){p, DC_F32}, dc_buf_none(), 1, 4, 2);
}
static void test_nhwc_errors(void) {
    expect_op_error(bad_concat, "concat_channels", "concat_channels of mixed dtypes: an error naming the op");
    expect_op_error(bad_concat_overlap, "concat_channels", "concat_channels into its own input: an error");
    expect_op_error(bad_group_norm, "group_norm_nhwc_fwd", "group_norm_nhwc_fwd of F16 maps: an error naming the op");
    expect_op_error(bad_group_norm_bwd, "group_norm_nhwc_bwd", "group_norm_nhwc_bwd into F16: an error naming the op");
    expect_op_error(bad_channel_sum, "channel_sum_nhwc", "channel_sum_nhwc of I32 maps: an error naming the op");
    expect_op_error(bad_upsample, "upsample2x_nhwc_fwd", "upsample2x_nhwc_fwd of I32 maps: an error naming the op");
    expect_op_error(bad_add_channel, "add_nhwc", "add_nhwc of F16 maps: an error naming the op");
    dc_conv2d_shape s = {1, 4, 8, 8, 4, 3, 1, 1, 1, 1, 1, 2};
    const int rc = g_gpu->reserve_conv(g_gpu, &s, true);
    expect(rc == -1 && strstr(dc_error(), "layout") != NULL, "reserve_conv of layout flag 2: an error naming the layout");
}

static void run_groups(void) {
    if (want("conv")) {
        test_conv(2, 8, 12, 10, 16, 3, 1, 1, 1, 1, 1, true, false);     // 3x3, H != W, Ci != Co
        test_conv(2, 16, 16, 12, 16, 3, 2, 0, 1, 0, 1, true, false);    // SD VAE downsampling
        test_conv(2, 6, 9, 11, 10, 3, 2, 0, 1, 0, 1, true, false);      // the same, odd sizes
        test_conv(2, 32, 8, 6, 24, 1, 1, 0, 0, 0, 0, true, false);      // 1x1
        test_conv(1, 32, 16, 16, 3, 3, 1, 1, 1, 1, 1, false, false);    // to RGB, no bias
        test_conv(2, 5, 7, 9, 4, 3, 1, 0, 2, 2, 0, true, false);        // asymmetric, stride 1
        test_conv(2, 64, 32, 32, 128, 3, 1, 1, 1, 1, 1, true, false);   // a UNet-sized one
        test_conv(2, 64, 16, 16, 64, 3, 2, 1, 1, 1, 1, true, false);    // symmetric stride 2 (UNet)
    }
    if (want("nhwc")) {  // channels-last maps, as the UNet and the VAE keep them
        test_conv(2, 64, 16, 12, 64, 3, 1, 1, 1, 1, 1, true, true);     // 3x3, H != W
        test_conv(2, 36, 9, 11, 20, 3, 1, 1, 1, 1, 1, true, true);      // odd channel counts and sizes
        test_conv(2, 128, 16, 16, 128, 3, 2, 1, 1, 1, 1, true, true);   // UNet downsampling
        test_conv(2, 36, 9, 11, 20, 3, 2, 1, 1, 1, 1, true, true);
        test_conv(2, 128, 16, 16, 128, 3, 2, 0, 1, 0, 1, true, true);   // VAE downsampling
        test_conv(2, 36, 9, 11, 20, 3, 2, 0, 1, 0, 1, true, true);
        test_conv(2, 64, 8, 6, 128, 1, 1, 0, 0, 0, 0, true, true);      // 1x1 (a resnet's shortcut)
        test_conv(2, 36, 7, 5, 20, 1, 1, 0, 0, 0, 0, true, true);
        test_conv(2, 5, 7, 9, 4, 3, 1, 0, 2, 2, 0, true, true);         // asymmetric, stride 1, 5 channels
        test_conv(1, 64, 16, 16, 3, 3, 1, 1, 1, 1, 1, false, true);     // to RGB, no bias
        // few input or output channels (SD's conv_in and conv_out, the VAE's)
        test_conv(2, 4, 17, 13, 320, 3, 1, 1, 1, 1, 1, true, true);     // SD's conv_in, a partial last tile
        test_conv(1, 4, 9, 7, 40, 3, 1, 1, 1, 1, 1, 2, true);           // part of a 64-channel pass
        test_conv(2, 8, 5, 6, 16, 3, 1, 1, 1, 1, 1, false, true);       // 8 in: K 72 in 5 steps
        test_conv(3, 1, 6, 5, 8, 3, 1, 1, 1, 1, 1, true, true);         // 1 in
        test_conv(2, 320, 11, 9, 4, 3, 1, 1, 1, 1, 1, true, true);      // SD's conv_out, partial warps
        test_conv(1, 128, 12, 20, 3, 3, 1, 1, 1, 1, 1, 2, true);        // the VAE's, 3 out
        test_conv(2, 32, 7, 5, 8, 3, 1, 1, 1, 1, 1, true, true);        // 8 out
        test_conv_res(2, 64, 16, 12, 64, 3, true);                      // a VAE resnet's conv2 and its residual
        test_conv_res(3, 128, 8, 8, 128, 3, true);
        test_conv_res(2, 36, 9, 11, 20, 3, true);                       // odd sizes
        test_conv_res(2, 64, 8, 6, 64, 3, false);                       // no bias: the add pass
        test_conv_res(2, 64, 8, 6, 64, 3, 2);                           // an F32 bias: the add pass
        test_winograd(4, 640, 32, 32, 64, true);                        // 1024 2x2 blocks, 256 tiles of 4x4
        test_winograd(8, 640, 23, 21, 24, 2);                           // odd sizes: partial tiles; F32 bias
        test_winograd(8, 640, 64, 64, 16, true);                        // a 64x64 map in a batch of 8
        test_winograd(8, 648, 24, 24, 16, true);                        // channels past a multiple of 64
        test_group_norm_nhwc(2, 320, 4096, 32, true, 1e-5f, g_ct);       // UNet at 64x64
        test_group_norm_nhwc(2, 320, 4096, 32, false, 1e-6f, DC_F32);
        test_group_norm_nhwc(2, 64, 4096, 32, true, 1e-6f, g_ct);
        test_group_norm_nhwc(3, 64, 35, 32, false, 1e-5f, g_ct);         // odd pixel count
        test_group_norm_nhwc(2, 36, 35, 4, true, 1e-5f, g_ct);           // 9-channel groups: a 4-wide access spans two
        test_group_norm_nhwc(17, 320, 1632, 32, true, 1e-5f, g_ct);      // more samples than one piece of partials
        test_group_norm_nhwc(2, 960, 1024, 32, true, 1e-5f, g_ct);       // 30-channel groups (UNet 1.x up blocks)
        test_group_norm_nhwc(1, 128, 65536, 32, true, 1e-6f, g_ct);      // VAE at 256x256
        test_group_norm_nhwc(2, 256, 65536, 32, true, 1e-6f, g_ct);      // VAE at 256x256: finer chunks
        test_nhwc_pointwise(0), test_nhwc_pointwise(1), test_nhwc_pointwise(4);
        test_nhwc_errors();
        test_nhwc_backward(2, 320, 64, 64, 32, true);   // a UNet resnet's at 64x64
        test_nhwc_backward(2, 64, 16, 16, 8, false);    // 8-channel groups, no SiLU
        test_nhwc_backward(3, 36, 5, 7, 4, true);       // odd sizes, 9-channel groups
        test_nhwc_backward(2, 2560, 8, 8, 32, true);    // 80-channel groups (an up block's concatenation)
        test_nhwc_backward(3, 960, 9, 7, 32, false);    // 30-channel groups: an 8-wide access spans two
        test_nhwc_backward(64, 320, 64, 64, 32, true);  // SD at 512 px, batch 64: two pieces of partials
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
        // rows held in registers (up to 512 and 1536 values a row), odd widths, and the loop beyond
        test_layer_norm(300, 320, 1e-5f, g_ct);                // SD UNet at the first level
        test_layer_norm(70, 1280, 1e-5f, DC_F32);
        test_layer_norm(33, 1030, 1e-5f, g_ct);                // not a multiple of 4
        test_layer_norm(9, 2048, 1e-5f, g_ct);
        test_layer_norm(17, 3, 1e-5f, DC_F32);
        // 8, 16 and 32 lanes a row, 1 to 8 vectors a lane, rows that fill no whole warp or block
        test_layer_norm(37, 64, 1e-5f, g_ct);
        test_layer_norm(101, 384, 1e-5f, g_ct);
        test_layer_norm(45, 392, 1e-5f, DC_F32);
        test_layer_norm(29, 640, 1e-5f, g_ct);
        test_layer_norm(23, 776, 1e-5f, g_ct);
        test_layer_norm(13, 1152, 1e-6f, g_ct);
        test_layer_norm(11, 1792, 1e-5f, DC_F32);
    }
    if (want("latent")) test_latent_pointwise(0), test_latent_pointwise(1);
    if (want("latent")) {
        test_linear_geglu(6900, 320, 1280, 1);  // SD's K and F, rows past a block
        test_linear_geglu(8192, 72, 1280, 2);   // K past a stage
        test_linear_geglu(2000, 640, 5120, 0);
        test_linear_geglu(300, 320, 128, 1);    // too few blocks: unfused
        test_linear_geglu(7, 24, 40, 1);        // F not a multiple of 64: unfused
        test_linear_many(2, 1280, 22);          // SD's time projections at 2 and 16 rows
        test_linear_many(16, 1280, 22);
        test_linear_many(3, 72, 35);            // more jobs than one launch takes
        test_linear_many(17, 64, 5);            // more rows than the kernel takes
    }
}

int main(int argc, char **argv) { return cuda_main("test_cuda_latent", argc, argv, run_groups); }
