// The ops of latent diffusion's maps (convolutions, GroupNorm with SiLU, affine
// LayerNorm, nearest upsampling; the convolution, GroupNorm, upsampling,
// channel add and concat of channels-last maps and the backward passes of
// the UNet's (GroupNorm, upsampling, channel sum, split); test_ops_ff.c has its
// feed-forward's ops and activations) of a backend
// against straight double loops and their finite differences, as test_ops.c
// does for the DiT ops (its header comment explains the tolerances).
//
//   build/tests/test_ops_latent [seed] [backend]      (seed from the clock by default)
#include "ops_check.h"

static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }

// ---- convolution -----------------------------------------------------------------------
typedef struct {
    dc_conv2d_shape s;
    double *x, *w, *b, *R, *out;  // b NULL: no bias
} conv_ctx;
static int64_t conv_nx(const dc_conv2d_shape *s) { return (int64_t)s->B * s->Ci * s->H * s->W; }
static int64_t conv_nw(const dc_conv2d_shape *s) { return (int64_t)s->Co * s->Ci * s->k * s->k; }
static int64_t conv_no(const dc_conv2d_shape *s) {
    return (int64_t)s->B * s->Co * dc_conv2d_ho(s) * dc_conv2d_wo(s);
}
// The reference keeps every tensor as PyTorch lays it out (NCHW); a
// channels-last conv (s.nhwc) gets them permuted. A map [B, C, HW] becomes
// [B, HW, C], and a weight [Co, Ci, k*k] becomes [Co, k*k, Ci]: the same
// permutation with Co in place of B.
typedef struct {
    int B, C;
    int64_t HW;
} conv_dims;
// dst[b, p, c] = src[b, c, p] (to_last), or back.
static float *permute(const float *src, conv_dims d, bool to_last) {
    float *dst = malloc((size_t)d.B * d.C * d.HW * sizeof(float));
    for (int b = 0; b < d.B; b++)
        for (int c = 0; c < d.C; c++)
            for (int64_t p = 0; p < d.HW; p++) {
                const int64_t first = ((int64_t)b * d.C + c) * d.HW + p;
                const int64_t last = ((int64_t)b * d.HW + p) * d.C + c;
                if (to_last) dst[last] = src[first];
                else dst[first] = src[last];
            }
    return dst;
}
// Uploads h (NCHW) into buffer d in the conv's layout.
static void conv_put(const dc_conv2d_shape *s, dc_buf d, const float *h, conv_dims dims) {
    float *t = s->nhwc ? permute(h, dims, true) : NULL;
    g_be->upload(g_be, d.p, t ? t : h, (size_t)dims.B * dims.C * dims.HW * sizeof(float));
    free(t);
}
static dc_buf conv_dev(const dc_conv2d_shape *s, const float *h, conv_dims dims) {
    dc_buf d = dev_alloc((int64_t)dims.B * dims.C * dims.HW);
    conv_put(s, d, h, dims);
    return d;
}
// Downloads d (in the conv's layout) as NCHW; caller frees.
static float *conv_get(const dc_conv2d_shape *s, dc_buf d, conv_dims dims) {
    float *h = dev_get(d, (int64_t)dims.B * dims.C * dims.HW);
    if (!s->nhwc) return h;
    float *t = permute(h, dims, false);
    free(h);
    return t;
}

// PyTorch's Conv2d (a cross-correlation), as loops over every output and tap:
// out[b,co,oy,ox] = bias[co] + sum w[co,ci,ky,kx] x[b,ci,oy*s-pad_t+ky, ox*s-pad_l+kx],
// x zero outside the image. Without dx, adds the products into c->out; with
// dx and dw, adds the gradients of L = sum(out * R) into them instead.
static void conv_taps(conv_ctx *c, double *dx, double *dw) {
    const dc_conv2d_shape *s = &c->s;
    const int Ho = dc_conv2d_ho(s), Wo = dc_conv2d_wo(s), k = s->k;
    for (int b = 0; b < s->B; b++)
        for (int co = 0; co < s->Co; co++)
            for (int oy = 0; oy < Ho; oy++)
                for (int ox = 0; ox < Wo; ox++) {
                    const int64_t o = (((int64_t)b * s->Co + co) * Ho + oy) * Wo + ox;
                    for (int ci = 0; ci < s->Ci; ci++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                const int iy = oy * s->stride - s->pad_t + ky;
                                const int ix = ox * s->stride - s->pad_l + kx;
                                if (iy < 0 || iy >= s->H || ix < 0 || ix >= s->W) continue;
                                const int64_t wi = (((int64_t)co * s->Ci + ci) * k + ky) * k + kx;
                                const int64_t xi =
                                    (((int64_t)b * s->Ci + ci) * s->H + iy) * s->W + ix;
                                if (!dx) {
                                    c->out[o] += c->w[wi] * c->x[xi];
                                } else {
                                    dx[xi] += c->R[o] * c->w[wi];
                                    dw[wi] += c->R[o] * c->x[xi];
                                }
                            }
                }
}
static double conv_ref(void *p) {
    conv_ctx *c = p;
    const dc_conv2d_shape *s = &c->s;
    const int64_t no = conv_no(s), hw = (int64_t)dc_conv2d_ho(s) * dc_conv2d_wo(s);
    for (int64_t o = 0; o < no; o++) c->out[o] = c->b ? c->b[o / hw % s->Co] : 0.0;
    conv_taps(c, NULL, NULL);
    return dot(c->out, c->R, no);
}
static void conv_grad_ref(conv_ctx *c, double *dx, double *dw, double *db) {
    const dc_conv2d_shape *s = &c->s;
    const int64_t no = conv_no(s), hw = (int64_t)dc_conv2d_ho(s) * dc_conv2d_wo(s);
    memset(dx, 0, conv_nx(s) * sizeof(double));
    memset(dw, 0, conv_nw(s) * sizeof(double));
    memset(db, 0, s->Co * sizeof(double));
    for (int64_t o = 0; o < no; o++) db[o / hw % s->Co] += c->R[o];
    conv_taps(c, dx, dw);
}

// Forward with and without bias; backward dx (overwritten, then +=), dw +=,
// db += against the reference gradients, and (nfd > 0) against finite
// differences of the reference loss at nfd random coordinates each. Every
// tensor is compared in NCHW order, whatever the layout the backend ran.
static void test_conv2d(dc_conv2d_shape s, int nfd) {
    if (!have("conv2d", g_be->reserve_conv && g_be->conv2d_fwd && g_be->conv2d_bwd)) return;
    const int64_t nx = conv_nx(&s), nw = conv_nw(&s), no = conv_no(&s);
    const conv_dims mx = {s.B, s.Ci, (int64_t)s.H * s.W}, mw = {s.Co, s.Ci, s.k * s.k};
    const conv_dims mo = {s.B, s.Co, (int64_t)dc_conv2d_ho(&s) * dc_conv2d_wo(&s)};
    char tag[80], name[160];
    snprintf(tag, sizeof tag, "%sB%d %d>%d %dx%d k%d s%d p%d%d%d%d", s.nhwc ? "nhwc " : "", s.B,
             s.Ci, s.Co, s.H, s.W, s.k, s.stride, s.pad_t, s.pad_b, s.pad_l, s.pad_r);
    float *x = host_rand(nx, -1, 1), *w = host_rand(nw, -1, 1), *b = host_rand(s.Co, -1, 1);
    float *R = host_rand(no, -1, 1);
    conv_ctx c = {s, to_d(x, nx), to_d(w, nw), to_d(b, s.Co), to_d(R, no),
                  malloc(no * sizeof(double))};
    if (g_be->reserve_conv(g_be, &s, true) != 0) {
        printf("reserve_conv %s failed: %s\n", tag, dc_error());
        report("reserve_conv", INFINITY, 0);
        goto done;
    }
    dc_buf xd = conv_dev(&s, x, mx), wd = conv_dev(&s, w, mw), bd = dev_from(b, s.Co);
    dc_buf out = dev_nan(no);
    for (int bias = 1; bias >= 0; bias--) {
        conv_ctx cc = c;
        if (!bias) cc.b = NULL;
        conv_ref(&cc);
        g_be->conv2d_fwd(g_be, out, xd, wd, bias ? bd : dc_buf_none(), &s);
        float *got = conv_get(&s, out, mo);
        snprintf(name, sizeof name, "conv2d_fwd %s%s", tag, bias ? "" : " nobias");
        check(name, got, c.out, no, TOL_FWD);
        for (int k = 0; bias && other_threads(k); k++) {
            g_be->conv2d_fwd(g_be, out, xd, wd, bd, &s);
            float *again = conv_get(&s, out, mo);
            snprintf(name, sizeof name, "conv2d_fwd %s%s", s.nhwc ? "nhwc " : "", threads_tag(k));
            check_same(name, again, got, no);
            free(again);
        }
        free(got);
    }

    double *rdx = malloc(nx * sizeof(double)), *rdw = malloc(nw * sizeof(double));
    double *rdb = malloc(s.Co * sizeof(double));
    conv_grad_ref(&c, rdx, rdw, rdb);
    float *pw = host_rand(nw, -1, 1), *pb = host_rand(s.Co, -1, 1), *start = host_rand(nx, -1, 1);
    dc_buf Rd = conv_dev(&s, R, mo), gx = dev_nan(nx), gw = conv_dev(&s, pw, mw);
    dc_buf gb = dev_from(pb, s.Co);
    g_be->conv2d_bwd(g_be, gx, gw, gb, Rd, xd, wd, &s, false);
    float *g1 = conv_get(&s, gx, mx), *g2 = conv_get(&s, gw, mw), *g3 = dev_get(gb, s.Co);
    float *dw = malloc(nw * sizeof(float)), *db = malloc(s.Co * sizeof(float));
    for (int64_t i = 0; i < nw; i++) dw[i] = g2[i] - pw[i];  // dw and db are "+="
    for (int i = 0; i < s.Co; i++) db[i] = g3[i] - pb[i];
    snprintf(name, sizeof name, "conv2d_bwd dx %s", tag);
    check(name, g1, rdx, nx, TOL_FWD);
    snprintf(name, sizeof name, "conv2d_bwd dw += %s", tag);
    check(name, dw, rdw, nw, TOL_FWD);
    snprintf(name, sizeof name, "conv2d_bwd db += %s", tag);
    check(name, db, rdb, s.Co, TOL_FWD);
    if (nfd) {
        const char *l = s.nhwc ? " nhwc" : "";
        snprintf(name, sizeof name, "conv2d_bwd dx vs FD k%d s%d%s", s.k, s.stride, l);
        report(name, fd_err(conv_ref, &c, c.x, nx, g1, nfd), TOL_FD);
        snprintf(name, sizeof name, "conv2d_bwd dw vs FD k%d s%d%s", s.k, s.stride, l);
        report(name, fd_err(conv_ref, &c, c.w, nw, dw, nfd), TOL_FD);
        snprintf(name, sizeof name, "conv2d_bwd db vs FD k%d s%d%s", s.k, s.stride, l);
        report(name, fd_err(conv_ref, &c, c.b, s.Co, db, nfd), TOL_FD);
    }
    for (int k = 0; other_threads(k); k++) {
        conv_put(&s, gw, pw, mw);
        g_be->upload(g_be, gb.p, pb, s.Co * sizeof(float));
        g_be->conv2d_bwd(g_be, gx, gw, gb, Rd, xd, wd, &s, false);
        float *a1 = conv_get(&s, gx, mx), *a2 = conv_get(&s, gw, mw), *a3 = dev_get(gb, s.Co);
        bool same = !memcmp(a1, g1, nx * 4) && !memcmp(a2, g2, nw * 4) && !memcmp(a3, g3, s.Co * 4);
        snprintf(name, sizeof name, "conv2d_bwd %s%s", s.nhwc ? "nhwc " : "", threads_tag(k));
        report(name, same ? 0 : INFINITY, 0);
        free(a1), free(a2), free(a3);
    }

    // accumulate adds onto dx; NULL dw and db are skipped; dw alone is the same.
    conv_put(&s, gx, start, mx);
    g_be->conv2d_bwd(g_be, gx, dc_buf_none(), dc_buf_none(), Rd, xd, wd, &s, true);
    float *g4 = conv_get(&s, gx, mx);
    for (int64_t i = 0; i < nx; i++) rdx[i] = (double)start[i] + g1[i];
    snprintf(name, sizeof name, "conv2d_bwd dx += %s", tag);
    check(name, g4, rdx, nx, TOL_FWD);
    conv_put(&s, gw, pw, mw);
    g_be->conv2d_bwd(g_be, dc_buf_none(), gw, dc_buf_none(), Rd, xd, wd, &s, false);
    float *g5 = conv_get(&s, gw, mw);
    snprintf(name, sizeof name, "conv2d_bwd dw only %s", tag);
    check_same(name, g5, g2, nw);
    // DC_BWD_DW_SET writes dw and db over NaN
    dc_buf sw = dev_nan(nw), sb = dev_nan(s.Co), aw = dev_zero(nw), ab = dev_zero(s.Co);
    g_be->conv2d_bwd(g_be, dc_buf_none(), sw, sb, Rd, xd, wd, &s, DC_BWD_DW_SET);
    g_be->conv2d_bwd(g_be, dc_buf_none(), aw, ab, Rd, xd, wd, &s, 0);
    snprintf(name, sizeof name, "conv2d_bwd dw, db written = added to zero %s", tag);
    check_written(name, sw, aw, nw, sb, ab, s.Co);
    free(rdx), free(rdw), free(rdb), free(pw), free(pb), free(start), free(g1), free(g2);
    free(g3), free(dw), free(db), free(g4), free(g5);
done:
    free(x), free(w), free(b), free(R), free(c.x), free(c.w), free(c.b), free(c.R), free(c.out);
    dev_free_all();
}

// A shape whose output would be empty is refused up front, with a message.
static void test_conv2d_bad_shape(void) {
    if (!have("reserve_conv", g_be->reserve_conv)) return;
    dc_conv2d_shape s = {.B = 1, .Ci = 4, .H = 2, .W = 8, .Co = 4, .k = 3, .stride = 1};
    dc_error_clear();
    int rc = g_be->reserve_conv(g_be, &s, true);
    bool ok = rc != 0 && strstr(dc_error(), "conv2d");
    report("reserve_conv refuses a 2x8 input, k3", ok ? 0 : INFINITY, 0);
    if (!ok) printf("  rc %d, message: %s\n", rc, dc_error());
}

// ---- group norm ---------------------------------------------------------------------------
typedef struct {
    double *x, *gamma, *beta, *R, *out;
    int B, C, G;
    int64_t HW;
    double eps;
    bool silu;
} gn_ctx;
// Per (b, g), over its C/G channels and HW pixels: biased variance, as torch.
static double gn_ref(gn_ctx *c, double *mean, double *rstd) {
    const int Cg = c->C / c->G;
    const int64_t n = Cg * c->HW;
    double L = 0;
    for (int bg = 0; bg < c->B * c->G; bg++) {
        const double *x = c->x + bg * n;
        double mu = 0, var = 0;
        for (int64_t i = 0; i < n; i++) mu += x[i] / n;
        for (int64_t i = 0; i < n; i++) var += (x[i] - mu) * (x[i] - mu) / n;
        const double r = 1 / sqrt(var + c->eps);
        if (mean) mean[bg] = mu, rstd[bg] = r;
        for (int64_t i = 0; i < n; i++) {
            const int ch = bg % c->G * Cg + (int)(i / c->HW);
            double y = (x[i] - mu) * r * c->gamma[ch] + c->beta[ch];
            if (c->silu) y *= ref_sigmoid(y);
            c->out[bg * n + i] = y;
            L += y * c->R[bg * n + i];
        }
    }
    return L;
}
static double gn_loss(void *p) { return gn_ref(p, NULL, NULL); }

// x in [lo, hi]: a narrow range far from 0 makes eps matter and tests the
// variance's accuracy under a large mean.
static void test_group_norm(int B, int C, int64_t HW, int G, float eps, bool silu, double lo,
                            double hi, int nfd) {
    if (!have("group_norm", g_be->group_norm_fwd && g_be->group_norm_bwd)) return;
    const int64_t n = (int64_t)B * C * HW, ns = (int64_t)B * G;
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "B%d C%d HW%lld G%d eps%.0e%s", B, C, (long long)HW, G, eps,
             silu ? " silu" : "");
    float *x = host_rand(n, lo, hi), *gamma = host_rand(C, -1.5, 1.5), *beta = host_rand(C, -1, 1);
    float *R = host_rand(n, -0.5, 1.5);  // mean(R) != 0: the mean(g) term of dx matters
    gn_ctx c = {to_d(x, n), to_d(gamma, C), to_d(beta, C), to_d(R, n), malloc(n * sizeof(double)),
                B, C, G, HW, eps, silu};
    double *mean = malloc(ns * sizeof(double)), *rstd = malloc(ns * sizeof(double));
    gn_ref(&c, mean, rstd);
    dc_buf xd = dev_from(x, n), gd = dev_from(gamma, C), bd = dev_from(beta, C), out = dev_nan(n);
    dc_buf md = dev_nan(ns), rd = dev_nan(ns);
    g_be->group_norm_fwd(g_be, out, md, rd, xd, gd, bd, B, C, HW, G, eps, silu);
    float *got = dev_get(out, n), *gm = dev_get(md, ns), *gr = dev_get(rd, ns);
    snprintf(name, sizeof name, "group_norm_fwd %s", tag);
    check(name, got, c.out, n, TOL_FWD);
    check("group_norm_fwd mean", gm, mean, ns, TOL_FWD);
    check("group_norm_fwd rstd", gr, rstd, ns, TOL_FWD);
    for (int k = 0; other_threads(k); k++) {
        g_be->group_norm_fwd(g_be, out, md, rd, xd, gd, bd, B, C, HW, G, eps, silu);
        float *again = dev_get(out, n);
        snprintf(name, sizeof name, "group_norm_fwd %s", threads_tag(k));
        check_same(name, again, got, n);
        free(again);
    }

    float *pg = host_rand(C, -1, 1), *pb = host_rand(C, -1, 1), *start = host_rand(n, -1, 1);
    dc_buf Rd = dev_from(R, n), gx = dev_nan(n), gg = dev_from(pg, C), gb = dev_from(pb, C);
    g_be->group_norm_bwd(g_be, gx, gg, gb, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, false);
    float *g1 = dev_get(gx, n), *g2 = dev_get(gg, C), *g3 = dev_get(gb, C);
    float *dg = malloc(C * sizeof(float)), *db = malloc(C * sizeof(float));
    for (int i = 0; i < C; i++) dg[i] = g2[i] - pg[i], db[i] = g3[i] - pb[i];  // "+="
    snprintf(name, sizeof name, "group_norm_bwd dx vs FD %s", tag);
    report(name, fd_err(gn_loss, &c, c.x, n, g1, nfd), TOL_FD);
    report("group_norm_bwd dgamma += vs FD", fd_err(gn_loss, &c, c.gamma, C, dg, nfd), TOL_FD);
    report("group_norm_bwd dbeta += vs FD", fd_err(gn_loss, &c, c.beta, C, db, nfd), TOL_FD);
    for (int k = 0; other_threads(k); k++) {
        g_be->upload(g_be, gg.p, pg, C * sizeof(float));
        g_be->upload(g_be, gb.p, pb, C * sizeof(float));
        g_be->group_norm_bwd(g_be, gx, gg, gb, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, false);
        float *a1 = dev_get(gx, n), *a2 = dev_get(gg, C), *a3 = dev_get(gb, C);
        bool same = !memcmp(a1, g1, n * 4) && !memcmp(a2, g2, C * 4) && !memcmp(a3, g3, C * 4);
        snprintf(name, sizeof name, "group_norm_bwd %s", threads_tag(k));
        report(name, same ? 0 : INFINITY, 0);
        free(a1), free(a2), free(a3);
    }
    // Frozen (dgamma, dbeta NULL) and accumulating into dx.
    g_be->upload(g_be, gx.p, start, n * sizeof(float));
    g_be->group_norm_bwd(g_be, gx, dc_buf_none(), dc_buf_none(), Rd, xd, md, rd, gd, bd, B, C, HW,
                         G, silu, true);
    float *g4 = dev_get(gx, n);
    for (int64_t i = 0; i < n; i++) c.out[i] = (double)start[i] + g1[i];
    check("group_norm_bwd dx += , frozen", g4, c.out, n, TOL_FWD);
    dc_buf sg = dev_nan(C), sb = dev_nan(C), ag = dev_zero(C), ab = dev_zero(C);
    g_be->group_norm_bwd(g_be, gx, sg, sb, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, DC_BWD_DW_SET);
    g_be->group_norm_bwd(g_be, gx, ag, ab, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, 0);
    check_written("group_norm_bwd dgamma, dbeta written = added to zero", sg, ag, C, sb, ab, C);
    free(x), free(gamma), free(beta), free(R), free(c.x), free(c.gamma), free(c.beta), free(c.R);
    free(c.out), free(mean), free(rstd), free(got), free(gm), free(gr), free(pg), free(pb);
    free(start), free(g1), free(g2), free(g3), free(dg), free(db), free(g4);
    dev_free_all();
}

// GroupNorm over channels-last maps against the same float64 reference,
// which keeps x as [B, C, HW]: the backend gets x (and dout, and gives dx)
// as [B, HW, C]; its backward against finite differences of the reference.
static void test_group_norm_nhwc(int B, int C, int64_t HW, int G, float eps, bool silu, double lo,
                                 double hi, int nfd) {
    if (!have("group_norm_nhwc", g_be->group_norm_nhwc_fwd)) return;
    const int64_t n = (int64_t)B * C * HW, ns = (int64_t)B * G;
    const conv_dims dims = {B, C, HW};
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "B%d C%d HW%lld G%d eps%.0e%s", B, C, (long long)HW, G, eps,
             silu ? " silu" : "");
    float *x = host_rand(n, lo, hi), *gamma = host_rand(C, -1.5, 1.5), *beta = host_rand(C, -1, 1);
    float *R = host_rand(n, -0.5, 1.5);  // the loss's weights: mean(R) != 0
    gn_ctx c = {to_d(x, n), to_d(gamma, C), to_d(beta, C), to_d(R, n), malloc(n * sizeof(double)),
                B, C, G, HW, eps, silu};
    double *mean = malloc(ns * sizeof(double)), *rstd = malloc(ns * sizeof(double));
    gn_ref(&c, mean, rstd);
    float *xl = permute(x, dims, true);
    dc_buf xd = dev_from(xl, n), gd = dev_from(gamma, C), bd = dev_from(beta, C), out = dev_nan(n);
    dc_buf md = dev_nan(ns), rd = dev_nan(ns);
    g_be->group_norm_nhwc_fwd(g_be, out, md, rd, xd, gd, bd, B, C, HW, G, eps, silu);
    float *raw = dev_get(out, n), *got = permute(raw, dims, false);
    float *gm = dev_get(md, ns), *gr = dev_get(rd, ns);
    snprintf(name, sizeof name, "group_norm_nhwc_fwd %s", tag);
    check(name, got, c.out, n, TOL_FWD);
    check("group_norm_nhwc_fwd mean", gm, mean, ns, TOL_FWD);
    check("group_norm_nhwc_fwd rstd", gr, rstd, ns, TOL_FWD);
    for (int k = 0; other_threads(k); k++) {
        g_be->group_norm_nhwc_fwd(g_be, out, md, rd, xd, gd, bd, B, C, HW, G, eps, silu);
        float *a1 = dev_get(out, n), *a2 = dev_get(md, ns), *a3 = dev_get(rd, ns);
        bool same = !memcmp(a1, raw, n * 4) && !memcmp(a2, gm, ns * 4) && !memcmp(a3, gr, ns * 4);
        snprintf(name, sizeof name, "group_norm_nhwc_fwd %s", threads_tag(k));
        report(name, same ? 0 : INFINITY, 0);
        free(a1), free(a2), free(a3);
    }
    // the second half alone, from the statistics just written: the forward's bits
    if (have("group_norm_nhwc_apply", g_be->group_norm_nhwc_apply)) {
        dc_buf oa = dev_nan(n);
        g_be->group_norm_nhwc_apply(g_be, oa, md, rd, xd, gd, bd, B, C, HW, G, silu);
        float *a = dev_get(oa, n);
        snprintf(name, sizeof name, "group_norm_nhwc_apply = the forward %s", tag);
        report(name, !memcmp(a, raw, n * 4) ? 0 : INFINITY, 0);
        free(a);
    }

    if (!have("group_norm_nhwc_bwd", g_be->group_norm_nhwc_bwd)) goto done;
    float *Rl = permute(R, dims, true), *pg = host_rand(C, -1, 1), *pb = host_rand(C, -1, 1);
    float *start = host_rand(n, -1, 1);
    dc_buf Rd = dev_from(Rl, n), gx = dev_nan(n), gg = dev_from(pg, C), gb = dev_from(pb, C);
    g_be->group_norm_nhwc_bwd(g_be, gx, gg, gb, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, false);
    float *g1l = dev_get(gx, n), *g1 = permute(g1l, dims, false), *g2 = dev_get(gg, C), *g3 = dev_get(gb, C);
    float *dg = malloc(C * sizeof(float)), *db = malloc(C * sizeof(float));
    for (int i = 0; i < C; i++) dg[i] = g2[i] - pg[i], db[i] = g3[i] - pb[i];  // "+="
    snprintf(name, sizeof name, "group_norm_nhwc_bwd dx vs FD %s", tag);
    report(name, fd_err(gn_loss, &c, c.x, n, g1, nfd), TOL_FD);
    report("group_norm_nhwc_bwd dgamma += vs FD", fd_err(gn_loss, &c, c.gamma, C, dg, nfd), TOL_FD);
    report("group_norm_nhwc_bwd dbeta += vs FD", fd_err(gn_loss, &c, c.beta, C, db, nfd), TOL_FD);
    for (int k = 0; other_threads(k); k++) {
        g_be->upload(g_be, gg.p, pg, C * sizeof(float));
        g_be->upload(g_be, gb.p, pb, C * sizeof(float));
        g_be->group_norm_nhwc_bwd(g_be, gx, gg, gb, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, false);
        float *a1 = dev_get(gx, n), *a2 = dev_get(gg, C), *a3 = dev_get(gb, C);
        bool same = !memcmp(a1, g1l, n * 4) && !memcmp(a2, g2, C * 4) && !memcmp(a3, g3, C * 4);
        snprintf(name, sizeof name, "group_norm_nhwc_bwd %s", threads_tag(k));
        report(name, same ? 0 : INFINITY, 0);
        free(a1), free(a2), free(a3);
    }
    // frozen (dgamma, dbeta NULL) and accumulating into dx
    g_be->upload(g_be, gx.p, start, n * sizeof(float));
    g_be->group_norm_nhwc_bwd(g_be, gx, dc_buf_none(), dc_buf_none(), Rd, xd, md, rd, gd, bd, B, C, HW, G, silu,
                              true);
    float *g4 = dev_get(gx, n);
    for (int64_t i = 0; i < n; i++) c.out[i] = (double)start[i] + g1l[i];
    check("group_norm_nhwc_bwd dx += , frozen", g4, c.out, n, TOL_FWD);
    dc_buf sg = dev_nan(C), sb = dev_nan(C), ag = dev_zero(C), ab = dev_zero(C);
    g_be->group_norm_nhwc_bwd(g_be, gx, sg, sb, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, DC_BWD_DW_SET);
    g_be->group_norm_nhwc_bwd(g_be, gx, ag, ab, Rd, xd, md, rd, gd, bd, B, C, HW, G, silu, 0);
    check_written("group_norm_nhwc_bwd dgamma, dbeta written = added to zero", sg, ag, C, sb, ab, C);
    free(Rl), free(pg), free(pb), free(start), free(g1l), free(g1), free(g2), free(g3), free(dg), free(db), free(g4);
done:
    free(x), free(gamma), free(beta), free(R), free(c.x), free(c.gamma), free(c.beta), free(c.R);
    free(c.out), free(mean), free(rstd), free(xl), free(raw), free(got), free(gm), free(gr);
    dev_free_all();
}

// ---- layer norm with affine weights --------------------------------------------------------
typedef struct {
    double *x, *gamma, *beta, *R, *out;
    int64_t M;
    int D;
    double eps;
} lnorm_ctx;
static double lnorm_ref(lnorm_ctx *c, double *mean, double *rstd) {
    const int D = c->D;
    double L = 0;
    for (int64_t m = 0; m < c->M; m++) {
        const double *x = c->x + m * D;
        double mu = 0, var = 0;
        for (int d = 0; d < D; d++) mu += x[d] / D;
        for (int d = 0; d < D; d++) var += (x[d] - mu) * (x[d] - mu) / D;
        const double r = 1 / sqrt(var + c->eps);
        if (mean) mean[m] = mu, rstd[m] = r;
        for (int d = 0; d < D; d++) {
            c->out[m * D + d] = (x[d] - mu) * r * c->gamma[d] + c->beta[d];
            L += c->out[m * D + d] * c->R[m * D + d];
        }
    }
    return L;
}
static double lnorm_loss(void *p) { return lnorm_ref(p, NULL, NULL); }

static void test_layer_norm(int64_t M, int D, double lo, double hi, int nfd) {
    if (!have("layer_norm", g_be->layer_norm_fwd && g_be->layer_norm_bwd)) return;
    const int64_t n = M * D;
    const float eps = 1e-5f;
    char name[128];
    float *x = host_rand(n, lo, hi), *gamma = host_rand(D, -1.5, 1.5), *beta = host_rand(D, -1, 1);
    float *R = host_rand(n, -0.5, 1.5);  // mean(R) != 0: the mean(g) term of dx matters
    lnorm_ctx c = {to_d(x, n), to_d(gamma, D), to_d(beta, D), to_d(R, n),
                   malloc(n * sizeof(double)), M, D, eps};
    double *mean = malloc(M * sizeof(double)), *rstd = malloc(M * sizeof(double));
    lnorm_ref(&c, mean, rstd);
    dc_buf xd = dev_from(x, n), gd = dev_from(gamma, D), bd = dev_from(beta, D), out = dev_nan(n);
    dc_buf md = dev_nan(M), rd = dev_nan(M);
    g_be->layer_norm_fwd(g_be, out, md, rd, xd, gd, bd, M, D, eps);
    float *got = dev_get(out, n), *gm = dev_get(md, M), *gr = dev_get(rd, M);
    snprintf(name, sizeof name, "layer_norm_fwd M%lld D%d", (long long)M, D);
    check(name, got, c.out, n, TOL_FWD);
    check("layer_norm_fwd mean", gm, mean, M, TOL_FWD);
    check("layer_norm_fwd rstd", gr, rstd, M, TOL_FWD);
    for (int k = 0; other_threads(k); k++) {
        g_be->layer_norm_fwd(g_be, out, md, rd, xd, gd, bd, M, D, eps);
        float *again = dev_get(out, n);
        snprintf(name, sizeof name, "layer_norm_fwd %s", threads_tag(k));
        check_same(name, again, got, n);
        free(again);
    }

    float *pg = host_rand(D, -1, 1), *pb = host_rand(D, -1, 1), *start = host_rand(n, -1, 1);
    dc_buf Rd = dev_from(R, n), gx = dev_nan(n), gg = dev_from(pg, D), gb = dev_from(pb, D);
    g_be->layer_norm_bwd(g_be, gx, gg, gb, Rd, xd, md, rd, gd, M, D, false);
    float *g1 = dev_get(gx, n), *g2 = dev_get(gg, D), *g3 = dev_get(gb, D);
    float *dg = malloc(D * sizeof(float)), *db = malloc(D * sizeof(float));
    for (int i = 0; i < D; i++) dg[i] = g2[i] - pg[i], db[i] = g3[i] - pb[i];  // "+="
    snprintf(name, sizeof name, "layer_norm_bwd dx vs FD M%lld D%d", (long long)M, D);
    report(name, fd_err(lnorm_loss, &c, c.x, n, g1, nfd), TOL_FD);
    report("layer_norm_bwd dgamma += vs FD", fd_err(lnorm_loss, &c, c.gamma, D, dg, nfd), TOL_FD);
    report("layer_norm_bwd dbeta += vs FD", fd_err(lnorm_loss, &c, c.beta, D, db, nfd), TOL_FD);
    for (int k = 0; other_threads(k); k++) {
        g_be->upload(g_be, gg.p, pg, D * sizeof(float));
        g_be->upload(g_be, gb.p, pb, D * sizeof(float));
        g_be->layer_norm_bwd(g_be, gx, gg, gb, Rd, xd, md, rd, gd, M, D, false);
        float *a1 = dev_get(gx, n), *a2 = dev_get(gg, D), *a3 = dev_get(gb, D);
        bool same = !memcmp(a1, g1, n * 4) && !memcmp(a2, g2, D * 4) && !memcmp(a3, g3, D * 4);
        snprintf(name, sizeof name, "layer_norm_bwd %s", threads_tag(k));
        report(name, same ? 0 : INFINITY, 0);
        free(a1), free(a2), free(a3);
    }
    g_be->upload(g_be, gx.p, start, n * sizeof(float));
    g_be->layer_norm_bwd(g_be, gx, dc_buf_none(), dc_buf_none(), Rd, xd, md, rd, gd, M, D, true);
    float *g4 = dev_get(gx, n);
    for (int64_t i = 0; i < n; i++) c.out[i] = (double)start[i] + g1[i];
    check("layer_norm_bwd dx += , frozen", g4, c.out, n, TOL_FWD);
    dc_buf sg = dev_nan(D), sb = dev_nan(D), ag = dev_zero(D), ab = dev_zero(D);
    g_be->layer_norm_bwd(g_be, gx, sg, sb, Rd, xd, md, rd, gd, M, D, DC_BWD_DW_SET);
    g_be->layer_norm_bwd(g_be, gx, ag, ab, Rd, xd, md, rd, gd, M, D, 0);
    check_written("layer_norm_bwd dgamma, dbeta written = added to zero", sg, ag, D, sb, ab, D);
    free(x), free(gamma), free(beta), free(R), free(c.x), free(c.gamma), free(c.beta), free(c.R);
    free(c.out), free(mean), free(rstd), free(got), free(gm), free(gr), free(pg), free(pb);
    free(start), free(g1), free(g2), free(g3), free(dg), free(db), free(g4);
    dev_free_all();
}

// ---- nearest 2x upsampling ---------------------------------------------------------------
static void test_upsample(int B, int C, int H, int W) {
    if (!have("upsample2x", g_be->upsample2x_fwd && g_be->upsample2x_bwd)) return;
    const int64_t ni = (int64_t)B * C * H * W, no = 4 * ni;
    char name[128];
    float *x = host_rand(ni, -1, 1), *R = host_rand(no, -1, 1);
    double *ref = malloc(no * sizeof(double)), *rdx = calloc(ni, sizeof(double));
    for (int64_t bc = 0; bc < (int64_t)B * C; bc++)
        for (int y = 0; y < 2 * H; y++)
            for (int x2 = 0; x2 < 2 * W; x2++) {
                const int64_t o = (bc * 2 * H + y) * 2 * W + x2, i = (bc * H + y / 2) * W + x2 / 2;
                ref[o] = x[i];
                rdx[i] += R[o];  // dL/dx for L = sum(out * R)
            }
    dc_buf xd = dev_from(x, ni), out = dev_nan(no), Rd = dev_from(R, no), dx = dev_nan(ni);
    g_be->upsample2x_fwd(g_be, out, xd, B, C, H, W);
    float *got = dev_get(out, no);
    snprintf(name, sizeof name, "upsample2x_fwd %dx%d (exact)", H, W);
    report(name, nerr(got, ref, no) == 0 ? 0 : INFINITY, 0);
    g_be->upsample2x_bwd(g_be, dx, Rd, B, C, H, W);
    float *g = dev_get(dx, ni);
    snprintf(name, sizeof name, "upsample2x_bwd %dx%d", H, W);
    check(name, g, rdx, ni, TOL_FWD);
    for (int k = 0; other_threads(k); k++) {
        g_be->upsample2x_bwd(g_be, dx, Rd, B, C, H, W);
        float *again = dev_get(dx, ni);
        snprintf(name, sizeof name, "upsample2x_bwd %s", threads_tag(k));
        check_same(name, again, g, ni);
        free(again);
    }
    free(x), free(R), free(ref), free(rdx), free(got), free(g);
    dev_free_all();
}

// Channels-last: out[b, y, x, c] = x[b, y/2, x/2, c], exactly.
static void test_upsample_nhwc(int B, int C, int H, int W) {
    if (!have("upsample2x_nhwc", g_be->upsample2x_nhwc_fwd)) return;
    const int64_t ni = (int64_t)B * H * W * C, no = 4 * ni;
    char name[128];
    float *x = host_rand(ni, -1, 1);
    double *ref = malloc(no * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int y = 0; y < 2 * H; y++)
            for (int x2 = 0; x2 < 2 * W; x2++)
                for (int c = 0; c < C; c++)
                    ref[(((int64_t)b * 2 * H + y) * 2 * W + x2) * C + c] =
                        x[(((int64_t)b * H + y / 2) * W + x2 / 2) * C + c];
    dc_buf xd = dev_from(x, ni), out = dev_nan(no);
    g_be->upsample2x_nhwc_fwd(g_be, out, xd, B, C, H, W);
    float *got = dev_get(out, no);
    snprintf(name, sizeof name, "upsample2x_nhwc_fwd %dx%d C%d (exact)", H, W, C);
    report(name, nerr(got, ref, no) == 0 ? 0 : INFINITY, 0);
    // backward: each pixel's gradient is the sum of its 2x2 block of dout
    if (have("upsample2x_nhwc_bwd", g_be->upsample2x_nhwc_bwd)) {
        float *dy = host_rand(no, -1, 1);
        double *dref = calloc(ni, sizeof(double));
        for (int b = 0; b < B; b++)
            for (int y = 0; y < 2 * H; y++)
                for (int x2 = 0; x2 < 2 * W; x2++)
                    for (int c = 0; c < C; c++)
                        dref[(((int64_t)b * H + y / 2) * W + x2 / 2) * C + c] +=
                            dy[(((int64_t)b * 2 * H + y) * 2 * W + x2) * C + c];
        dc_buf dyd = dev_from(dy, no), dx = dev_nan(ni);
        g_be->upsample2x_nhwc_bwd(g_be, dx, dyd, B, C, H, W);
        float *dg = dev_get(dx, ni);
        snprintf(name, sizeof name, "upsample2x_nhwc_bwd %dx%d C%d", H, W, C);
        check(name, dg, dref, ni, TOL_FWD);
        free(dy), free(dref), free(dg);
    }
    free(x), free(ref), free(got);
    dev_free_all();
}

// add_nhwc: x += y + v[b] + bias with every subset of the optional terms,
// against the sum in double: with one term, the exact sum rounded once; with
// more, each float addition rounds once (a few ulp of the largest value).
static void test_add_nhwc(int B, int64_t HW, int C) {
    const int64_t n = (int64_t)B * HW * C;
    float *x = host_rand(n, -1, 1), *y = host_rand(n, -1, 1), *v = host_rand((int64_t)B * C, -2, 2);
    float *bias = host_rand(C, -2, 2);
    double *ref = malloc(n * sizeof(double));
    for (int terms = 0; terms < 8; terms++) {
        const bool ty = terms & 1, tv = terms & 2, tb = terms & 4;
        dc_buf xd = dev_from(x, n), yd = ty ? dev_from(y, n) : dc_buf_none();
        dc_buf vd = tv ? dev_from(v, (int64_t)B * C) : dc_buf_none(), bd = tb ? dev_from(bias, C) : dc_buf_none();
        g_be->add_nhwc(g_be, xd, yd, vd, bd, B, C, HW);
        float *got = dev_get(xd, n);
        const int nterms = ty + tv + tb;
        bool exact = true;
        for (int64_t k = 0; k < n; k++) {
            const int64_t b = k / (HW * C), c = k % C;
            ref[k] = (double)x[k] + (ty ? y[k] : 0.0) + (tv ? v[b * C + c] : 0.0) + (tb ? bias[c] : 0.0);
            exact &= got[k] == (float)ref[k];
        }
        char name[128];
        snprintf(name, sizeof name, "add_nhwc B%d HW%lld C%d:%s%s%s", B, (long long)HW, C, ty ? " +y" : "",
                 tv ? " +v[b]" : "", tb ? " +bias" : "");
        if (nterms <= 1) report(name, exact ? 0 : INFINITY, 0);
        else report(name, nerr(got, ref, n), 1.2e-7 * nterms);
        free(got);
        dev_free_all();
    }
    free(x), free(y), free(v), free(bias), free(ref);
}

// Channels-last maps x[B, HW, C]: concat_channels (rows of a then b), exact.
static void test_layout_nhwc(int B, int64_t HW, int C1, int C2) {
    if (!have("add_nhwc/concat_channels", g_be->add_nhwc && g_be->concat_channels)) return;
    test_add_nhwc(B, HW, C1);
    const int64_t M = (int64_t)B * HW, n1 = M * C1, n2 = M * C2, no = n1 + n2;
    char name[128];
    float *a = host_rand(n1, -1, 1), *b = host_rand(n2, -1, 1);
    double *ref = malloc(no * sizeof(double));
    dc_buf ad = dev_from(a, n1), bd = dev_from(b, n2);
    dc_buf out = dev_nan(no);
    float *added = dev_get(ad, n1);
    for (int64_t m = 0; m < M; m++) {
        for (int c = 0; c < C1; c++) ref[m * (C1 + C2) + c] = added[m * C1 + c];
        for (int c = 0; c < C2; c++) ref[m * (C1 + C2) + C1 + c] = b[m * C2 + c];
    }
    g_be->concat_channels(g_be, out, ad, C1, bd, C2, M);
    float *got = dev_get(out, no);
    snprintf(name, sizeof name, "concat_channels M%lld %d+%d (exact)", (long long)M, C1, C2);
    report(name, nerr(got, ref, no) == 0 ? 0 : INFINITY, 0);
    free(a), free(b), free(ref), free(added), free(got);
    dev_free_all();
    if (!have("split_channels/channel_sum_nhwc", g_be->split_channels && g_be->channel_sum_nhwc)) return;
    // split_channels, concat's backward: the two column ranges of x, exactly
    float *x = host_rand(no, -1, 1);
    double *ra = malloc(n1 * sizeof(double)), *rb = malloc(n2 * sizeof(double));
    for (int64_t m = 0; m < M; m++) {
        for (int c = 0; c < C1; c++) ra[m * C1 + c] = x[m * (C1 + C2) + c];
        for (int c = 0; c < C2; c++) rb[m * C2 + c] = x[m * (C1 + C2) + C1 + c];
    }
    dc_buf xd = dev_from(x, no), sa = dev_nan(n1), sb = dev_nan(n2);
    g_be->split_channels(g_be, sa, C1, sb, C2, xd, M);
    float *ga = dev_get(sa, n1), *gb = dev_get(sb, n2);
    snprintf(name, sizeof name, "split_channels M%lld %d+%d (exact)", (long long)M, C1, C2);
    report(name, nerr(ga, ra, n1) == 0 && nerr(gb, rb, n2) == 0 ? 0 : INFINITY, 0);
    // channel_sum_nhwc: dv[b, c] = sum over pixels, against the sum in double
    const int C = C1 + C2;
    double *rs = calloc((size_t)B * C, sizeof(double));
    for (int bb = 0; bb < B; bb++)
        for (int64_t p = 0; p < HW; p++)
            for (int c = 0; c < C; c++) rs[bb * C + c] += x[((int64_t)bb * HW + p) * C + c];
    dc_buf dv = dev_nan((int64_t)B * C);
    g_be->channel_sum_nhwc(g_be, dv, xd, B, C, HW);
    float *gs = dev_get(dv, (int64_t)B * C);
    snprintf(name, sizeof name, "channel_sum_nhwc B%d HW%lld C%d", B, (long long)HW, C);
    check(name, gs, rs, (int64_t)B * C, TOL_FWD);
    free(x), free(ra), free(rb), free(ga), free(gb), free(rs), free(gs);
    dev_free_all();
}

// ---- layout: transpose, add_channel and its adjoint channel_sum ---------------------------
// Pure data movement and sums: transpose and add_channel are exact; channel_sum
// is a sum of HW values (fp32 on a GPU), checked at TOL_FWD.
static void test_layout(int B, int64_t M, int64_t N) {
    if (!have("transpose/add_channel/channel_sum", g_be->transpose && g_be->add_channel && g_be->channel_sum))
        return;
    const int64_t n = (int64_t)B * M * N;
    char name[128];
    float *x = host_rand(n, -1, 1), *v = host_rand((int64_t)B * M, -2, 2);
    double *ref = malloc(n * sizeof(double)), *rs = calloc((size_t)B * M, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) ref[(b * N + j) * M + i] = x[(b * M + i) * N + j];
    dc_buf xd = dev_from(x, n), out = dev_nan(n), vd = dev_from(v, (int64_t)B * M), sd = dev_nan((int64_t)B * M);
    g_be->transpose(g_be, out, xd, B, M, N);
    float *got = dev_get(out, n);
    snprintf(name, sizeof name, "transpose B%d %lldx%lld (exact)", B, (long long)M, (long long)N);
    report(name, nerr(got, ref, n) == 0 ? 0 : INFINITY, 0);
    // x viewed as [B, C = M, HW = N]
    for (int64_t k = 0; k < n; k++) ref[k] = (double)x[k] + v[k / N];  // one rounding, as fp32 does it
    g_be->add_channel(g_be, xd, vd, B, (int)M, N);
    float *added = dev_get(xd, n);
    bool exact = true;
    for (int64_t k = 0; k < n; k++) exact &= added[k] == (float)ref[k];
    snprintf(name, sizeof name, "add_channel B%d C%lld HW%lld (exact)", B, (long long)M, (long long)N);
    report(name, exact ? 0 : INFINITY, 0);
    for (int64_t k = 0; k < n; k++) rs[k / N] += added[k];
    g_be->channel_sum(g_be, sd, xd, B, (int)M, N);
    float *sum = dev_get(sd, (int64_t)B * M);
    snprintf(name, sizeof name, "channel_sum B%d C%lld HW%lld", B, (long long)M, (long long)N);
    check(name, sum, rs, (int64_t)B * M, TOL_FWD);
    free(x), free(v), free(ref), free(rs), free(got), free(added), free(sum);
    dev_free_all();
}

int main(int argc, char **argv) {
    uint64_t seed;
    if (ops_start("test_ops_latent", argc, argv, &seed)) return 1;
    // Latent diffusion. Convolutions: SD's 3x3 (pad 1), the VAE's downsampling
    // 3x3 stride 2 padded only bottom and right, the UNet's stride 2 pad 1, and
    // 1x1; odd sizes with H != W and Ci != Co. The larger shapes run threaded,
    // in several bands of im2col columns and several GEMM tiles, against the
    // reference gradients only (finite differences of them would take minutes).
    typedef dc_conv2d_shape cs;
    test_conv2d((cs){.B = 2, .Ci = 3, .H = 7, .W = 9, .Co = 5, .k = 3, .stride = 1,
                     .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1}, 100);
    test_conv2d((cs){.B = 2, .Ci = 4, .H = 8, .W = 7, .Co = 3, .k = 3, .stride = 2,
                     .pad_b = 1, .pad_r = 1}, 100);
    test_conv2d((cs){.B = 1, .Ci = 3, .H = 9, .W = 6, .Co = 2, .k = 3, .stride = 2,
                     .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1}, 100);
    test_conv2d((cs){.B = 2, .Ci = 6, .H = 5, .W = 3, .Co = 4, .k = 1, .stride = 1}, 100);
    test_conv2d((cs){.B = 2, .Ci = 128, .H = 40, .W = 48, .Co = 24, .k = 3, .stride = 1,
                     .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1}, 0);
    test_conv2d((cs){.B = 1, .Ci = 128, .H = 49, .W = 200, .Co = 16, .k = 3, .stride = 2,
                     .pad_b = 1, .pad_r = 1}, 0);
    test_conv2d((cs){.B = 2, .Ci = 160, .H = 24, .W = 20, .Co = 96, .k = 1, .stride = 1}, 0);
    // The same shapes channels-last, plus odd channel counts (not multiples of 4 or 8).
    test_conv2d((cs){.B = 2, .Ci = 3, .H = 7, .W = 9, .Co = 5, .k = 3, .stride = 1,
                     .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1, .nhwc = 1}, 100);
    test_conv2d((cs){.B = 2, .Ci = 5, .H = 8, .W = 7, .Co = 3, .k = 3, .stride = 2,
                     .pad_b = 1, .pad_r = 1, .nhwc = 1}, 0);
    test_conv2d((cs){.B = 2, .Ci = 3, .H = 9, .W = 6, .Co = 7, .k = 3, .stride = 2,
                     .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1, .nhwc = 1}, 0);
    test_conv2d((cs){.B = 2, .Ci = 6, .H = 5, .W = 3, .Co = 9, .k = 1, .stride = 1, .nhwc = 1}, 0);
    test_conv2d((cs){.B = 2, .Ci = 7, .H = 6, .W = 5, .Co = 11, .k = 1, .stride = 2, .nhwc = 1}, 0);
    test_conv2d((cs){.B = 2, .Ci = 128, .H = 40, .W = 48, .Co = 10, .k = 3, .stride = 1,
                     .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1, .nhwc = 1}, 0);
    test_conv2d((cs){.B = 1, .Ci = 130, .H = 49, .W = 200, .Co = 19, .k = 3, .stride = 2,
                     .pad_b = 1, .pad_r = 1, .nhwc = 1}, 0);
    test_conv2d((cs){.B = 2, .Ci = 160, .H = 24, .W = 20, .Co = 300, .k = 1, .stride = 1,
                     .nhwc = 1}, 0);
    test_conv2d_bad_shape();
    // GroupNorm: SD's 32 groups and a small G; eps of the VAE (1e-6) and UNet (1e-5).
    test_group_norm(2, 64, 35, 32, 1e-6f, true, -1, 2, 300);
    test_group_norm(3, 8, 63, 4, 1e-5f, false, 3, 3.2, 300);  // narrow: eps matters
    test_group_norm(2, 8, 63, 4, 1e-5f, true, 3, 3.2, 300);
    test_group_norm(2, 128, 256, 32, 1e-5f, true, -1, 2, 120);  // threaded
    test_group_norm_nhwc(2, 64, 35, 32, 1e-6f, true, -1, 2, 300);
    test_group_norm_nhwc(2, 12, 63, 4, 1e-5f, false, 3, 3.2, 300);  // narrow: eps matters
    test_group_norm_nhwc(2, 12, 63, 4, 1e-5f, true, 3, 3.2, 300);
    test_group_norm_nhwc(2, 320, 256, 32, 1e-5f, false, -1, 2, 60);  // threaded
    test_group_norm_nhwc(2, 140, 45, 2, 1e-6f, true, -1, 2, 100);  // 70 channels a group
    test_layer_norm(37, 72, -1, 2, 300);
    test_layer_norm(300, 320, 2, 2.4, 200);  // threaded; narrow: eps matters
    test_upsample(2, 3, 5, 7);
    test_upsample(2, 16, 32, 24);
    test_upsample_nhwc(2, 3, 5, 7);
    test_upsample_nhwc(2, 40, 32, 24);  // threaded
    test_layout(2, 3, 5);
    test_layout(2, 320, 4096);  // a UNet feature map to tokens: several tiles each way
    test_layout(3, 77, 33);     // ragged tiles
    test_layout_nhwc(2, 35, 5, 3);
    test_layout_nhwc(2, 1024, 320, 640);  // a UNet decoder's skip concat, threaded

    return ops_finish(seed);
}

