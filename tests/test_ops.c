// Every op of a backend (except the diffusion ops, tested with the diffusion
// code) against an independent reference written here: straight loops in
// double from the formulas in backend.h and REFERENCE.md for forward, and
// central finite differences of those double loops for backward, through the
// projection L = sum(out * R) with a fresh random R.
//
//   build/tests/test_ops [seed] [backend]      (seed from the clock by default)
//
// Error = max|got - ref| / max(max|ref|, 1e-6); NaN fails. Tolerances for f32:
// 1e-5 for forward (a few ulp of float accumulated over sums of <= 300
// terms), 1e-3 against finite differences (the FD error itself is ~1e-7 with
// h = 1e-3 in double; 1e-3 leaves room for f32 gradients, yet a wrong term,
// index or scale errs by O(1)). Permutations and copies must be exact.
// Convolutions sum up to a few thousand random-signed terms: rounding grows
// like their square root, as the largest result does, so the normalised error
// stays ~1e-7 and 1e-5 holds there too, for outputs and for gradients
// compared with the double loops run backward (shapes too large for FD).
// Outputs the spec says are overwritten are pre-filled with NaN, so an op that
// reads them fails; "+=" outputs are pre-filled with random values.
// An op a backend lacks (NULL) is reported as SKIP. On the CPU, ops are also
// rerun with 1 and 3 threads and must give the same bits.
#include "ops_check.h"

// ---- memory ---------------------------------------------------------------------------
static void test_memory(void) {
    const int64_t n = 1003;
    float *a = host_rand(n, -1, 1);
    dc_buf x = dev_from(a, n), y = dev_nan(n);
    g_be->copy(g_be, y.p, x.p, n * sizeof(float));
    float *got = dev_get(y, n);
    check_same("upload/copy/download", got, a, n);
    g_be->zero(g_be, y.p, n * sizeof(float));
    free(got);
    got = dev_get(y, n);
    float *z = calloc(n, sizeof(float));
    check_same("zero", got, z, n);
    dc_backend *bad = NULL;
    int rc = dc_backend_create("no-such-device", &bad);
    bool ok = rc != 0 && !bad && strstr(dc_error(), "no-such-device") && strstr(dc_error(), "cpu");
    report("create(unknown) fails, lists names", ok ? 0 : INFINITY, 0);
    if (!ok) printf("  message: %s\n", dc_error());
    free(a), free(got), free(z);
    dev_free_all();
}

// ---- linear ---------------------------------------------------------------------------
typedef struct {
    double *inp, *w, *b, *R;
    int M, K, N;
} lin_ctx;
static double lin_out(const lin_ctx *c, int m, int n) {
    double s = c->b ? c->b[n] : 0.0;
    for (int k = 0; k < c->K; k++) s += c->inp[(int64_t)m * c->K + k] * c->w[(int64_t)n * c->K + k];
    return s;
}
static double lin_loss(void *p) {
    lin_ctx *c = p;
    double L = 0;
    for (int m = 0; m < c->M; m++)
        for (int n = 0; n < c->N; n++) L += lin_out(c, m, n) * c->R[(int64_t)m * c->N + n];
    return L;
}

static void test_linear(int M, int K, int N, int nfd) {
    char name[80];
    float *inp = host_rand((int64_t)M * K, -1, 1), *w = host_rand((int64_t)N * K, -1, 1);
    float *b = host_rand(N, -1, 1), *R = host_rand((int64_t)M * N, -1, 1);
    lin_ctx c = {to_d(inp, (int64_t)M * K), to_d(w, (int64_t)N * K), to_d(b, N),
                 to_d(R, (int64_t)M * N), M, K, N};
    double *ref = malloc((int64_t)M * N * sizeof(double));
    dc_buf dinp = dev_from(inp, (int64_t)M * K), dw = dev_from(w, (int64_t)N * K);
    dc_buf db = dev_from(b, N), dout = dev_nan((int64_t)M * N);

    for (int bias = 1; bias >= 0; bias--) {
        lin_ctx cc = c;
        if (!bias) cc.b = NULL;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) ref[(int64_t)m * N + n] = lin_out(&cc, m, n);
        g_be->linear_fwd(g_be, dout, dinp, dw, bias ? db : dc_buf_none(), M, K, N);
        float *got = dev_get(dout, (int64_t)M * N);
        snprintf(name, sizeof name, "linear_fwd %dx%dx%d%s", M, K, N, bias ? "" : " nobias");
        check(name, got, ref, (int64_t)M * N, TOL_FWD);
        free(got);
        // the same product added onto a random start (a residual branch's last layer)
        float *start = host_rand((int64_t)M * N, -1, 1);
        dc_buf acc = dev_from(start, (int64_t)M * N);
        g_be->linear_fwd_acc(g_be, acc, dinp, dw, bias ? db : dc_buf_none(), M, K, N);
        got = dev_get(acc, (int64_t)M * N);
        for (int64_t i = 0; i < (int64_t)M * N; i++) ref[i] += start[i];
        snprintf(name, sizeof name, "linear_fwd_acc %dx%dx%d%s", M, K, N, bias ? "" : " nobias");
        check(name, got, ref, (int64_t)M * N, TOL_FWD);
        free(got), free(start);
    }

    // Backward: gradients of L = sum(out * R), so dout = R.
    dc_buf R_d = dev_from(R, (int64_t)M * N), gin = dev_nan((int64_t)M * K);
    float *pw = host_rand((int64_t)N * K, -1, 1), *pb = host_rand(N, -1, 1);
    dc_buf gw = dev_from(pw, (int64_t)N * K), gb = dev_from(pb, N);
    g_be->linear_bwd(g_be, gin, gw, gb, R_d, dinp, dw, M, K, N, false);
    float *g1 = dev_get(gin, (int64_t)M * K), *g2 = dev_get(gw, (int64_t)N * K);
    float *g3 = dev_get(gb, N);
    // dw and db are "+=": subtract the random start to get the op's gradient.
    for (int64_t i = 0; i < (int64_t)N * K; i++) g2[i] -= pw[i];
    for (int i = 0; i < N; i++) g3[i] -= pb[i];
    snprintf(name, sizeof name, "linear_bwd dinp %dx%dx%d", M, K, N);
    report(name, fd_err(lin_loss, &c, c.inp, (int64_t)M * K, g1, nfd), TOL_FD);
    snprintf(name, sizeof name, "linear_bwd dw += %dx%dx%d", M, K, N);
    report(name, fd_err(lin_loss, &c, c.w, (int64_t)N * K, g2, nfd), TOL_FD);
    snprintf(name, sizeof name, "linear_bwd db += %dx%dx%d", M, K, N);
    report(name, fd_err(lin_loss, &c, c.b, N, g3, nfd), TOL_FD);

    // accumulate = true adds onto dinp; NULL dinp / db are skipped.
    float *start = host_rand((int64_t)M * K, -1, 1);
    g_be->upload(g_be, gin.p, start, (int64_t)M * K * sizeof(float));
    g_be->linear_bwd(g_be, gin, dc_buf_none(), dc_buf_none(), R_d, dinp, dw, M, K, N, true);
    float *g4 = dev_get(gin, (int64_t)M * K);
    double *want = malloc((int64_t)M * K * sizeof(double));
    for (int64_t i = 0; i < (int64_t)M * K; i++) want[i] = (double)start[i] + g1[i];
    snprintf(name, sizeof name, "linear_bwd dinp += %dx%dx%d", M, K, N);
    check(name, g4, want, (int64_t)M * K, TOL_FWD);
    g_be->upload(g_be, gw.p, pw, (int64_t)N * K * sizeof(float));
    g_be->linear_bwd(g_be, dc_buf_none(), gw, dc_buf_none(), R_d, dinp, dw, M, K, N, false);
    float *g5 = dev_get(gw, (int64_t)N * K);
    for (int64_t i = 0; i < (int64_t)N * K; i++) g5[i] -= pw[i];
    snprintf(name, sizeof name, "linear_bwd dw only %dx%dx%d", M, K, N);
    check_same(name, g5, g2, (int64_t)N * K);
    // DC_BWD_DW_SET writes dw and db over NaN
    dc_buf sw = dev_nan((int64_t)N * K), sb = dev_nan(N), aw = dev_zero((int64_t)N * K), ab = dev_zero(N);
    g_be->linear_bwd(g_be, dc_buf_none(), sw, sb, R_d, dinp, dw, M, K, N, DC_BWD_DW_SET);
    g_be->linear_bwd(g_be, dc_buf_none(), aw, ab, R_d, dinp, dw, M, K, N, 0);
    snprintf(name, sizeof name, "linear_bwd dw, db written = added to zero %dx%dx%d", M, K, N);
    check_written(name, sw, aw, (int64_t)N * K, sb, ab, N);

    free(inp), free(w), free(b), free(R), free(c.inp), free(c.w), free(c.b), free(c.R);
    free(ref), free(pw), free(pb), free(g1), free(g2), free(g3), free(start), free(g4);
    free(want), free(g5);
    dev_free_all();
}

// ---- pointwise ------------------------------------------------------------------------

// f elementwise: forward check, and backward against the central difference
// of L = sum f(x_i) R_i in x_i (separable, so each coordinate costs O(1)).
static void test_act(const char *name, double (*f)(double), bool is_gelu) {
    const int64_t n = 100003;  // odd, and large enough to run threaded
    char buf[80];
    float *x = host_rand(n, -6, 6), *R = host_rand(n, -1, 1);
    double *ref = malloc(n * sizeof(double));
    dc_buf xd = dev_from(x, n), out = dev_nan(n), Rd = dev_from(R, n), dx = dev_nan(n);
    for (int64_t i = 0; i < n; i++) ref[i] = f(x[i]);
    (is_gelu ? g_be->gelu_fwd : g_be->silu_fwd)(g_be, out, xd, n);
    float *got = dev_get(out, n);
    snprintf(buf, sizeof buf, "%s_fwd", name);
    check(buf, got, ref, n, TOL_FWD);
    if (is_gelu) g_be->gelu_bwd(g_be, dx, Rd, xd, n);
    else g_be->silu_bwd(g_be, dx, Rd, xd, n, false);
    float *g = dev_get(dx, n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = (f((double)x[i] + FD_H) - f((double)x[i] - FD_H)) / (2 * FD_H) * R[i];
    snprintf(buf, sizeof buf, "%s_bwd vs FD", name);
    check(buf, g, ref, n, TOL_FD);
    for (int k = 0; other_threads(k); k++) {
        (is_gelu ? g_be->gelu_fwd : g_be->silu_fwd)(g_be, out, xd, n);
        if (is_gelu) g_be->gelu_bwd(g_be, dx, Rd, xd, n);
        else g_be->silu_bwd(g_be, dx, Rd, xd, n, false);
        float *a = dev_get(out, n), *b = dev_get(dx, n);
        snprintf(buf, sizeof buf, "%s_fwd, bwd %s", name, threads_tag(k));
        report(buf, !memcmp(a, got, n * 4) && !memcmp(b, g, n * 4) ? 0 : INFINITY, 0);
        free(a), free(b);
    }
    if (!is_gelu) {
        float *start = host_rand(n, -1, 1);
        g_be->upload(g_be, dx.p, start, n * sizeof(float));
        g_be->silu_bwd(g_be, dx, Rd, xd, n, true);
        float *g2 = dev_get(dx, n);
        for (int64_t i = 0; i < n; i++) ref[i] = (double)start[i] + g[i];
        check("silu_bwd +=", g2, ref, n, TOL_FWD);
        free(start), free(g2);
    }
    free(x), free(R), free(ref), free(got), free(g);
    dev_free_all();
}

static void test_axpy_add_rows(void) {
    const int64_t n = 70001;
    float *x = host_rand(n, -1, 1), *y = host_rand(n, -1, 1);
    double *ref = malloc(n * sizeof(double));
    const float alpha = -0.37f;
    for (int64_t i = 0; i < n; i++) ref[i] = y[i] + (double)alpha * x[i];
    dc_buf xd = dev_from(x, n), yd = dev_from(y, n);
    g_be->axpy(g_be, yd, xd, alpha, n);
    float *got = dev_get(yd, n);
    check("axpy", got, ref, n, TOL_FWD);
    free(got);

    // clamp: values past both bounds, and a NaN that stays NaN (torch.clamp)
    float *c = host_rand(n, -40, 30);
    c[7] = NAN;
    for (int64_t i = 0; i < n; i++) ref[i] = c[i] < -30 ? -30 : c[i] > 20 ? 20 : c[i];
    int64_t past = 0;
    for (int64_t i = 0; i < n; i++) past += c[i] < -30 || c[i] > 20;
    dc_buf cd = dev_from(c, n);
    g_be->clamp(g_be, cd, n, -30.0f, 20.0f);
    got = dev_get(cd, n);
    const bool nan_kept = isnan(got[7]);
    got[7] = 0, ref[7] = 0;
    check("clamp", got, ref, n, 0);
    report("clamp keeps a NaN", nan_kept && past > n / 10 ? 0.0 : INFINITY, 0.0);
    free(got), free(c);

    const int B = 3, T = 37, D = 72;  // x[B,T,D] += pos[T,D]
    float *pos = host_rand((int64_t)T * D, -1, 1);
    dc_buf pd = dev_from(pos, (int64_t)T * D);
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < (int64_t)T * D; i++)
            ref[b * T * D + i] = (double)x[b * T * D + i] + pos[i];
    g_be->add_rows(g_be, xd, pd, B, T, D);
    got = dev_get(xd, (int64_t)B * T * D);
    check("add_rows", got, ref, (int64_t)B * T * D, TOL_FWD);
    free(x), free(y), free(ref), free(got), free(pos);
    dev_free_all();
}

// ---- adaLN ----------------------------------------------------------------------------
typedef struct {
    double *x, *mod, *y, *R, *out;
    int B, T, D, nchunk, c0, c1;  // ln_mod: c0 shift, c1 scale; gate_res: c0 gate
} ada_ctx;
static double ln_mod_ref(ada_ctx *c, double *mean, double *rstd) {
    const int D = c->D;
    double L = 0;
    for (int bt = 0; bt < c->B * c->T; bt++) {
        const double *x = c->x + (int64_t)bt * D;
        const double *m = c->mod + (int64_t)(bt / c->T) * c->nchunk * D;
        double mu = 0, var = 0;
        for (int d = 0; d < D; d++) mu += x[d] / D;
        for (int d = 0; d < D; d++) var += (x[d] - mu) * (x[d] - mu) / D;
        double r = 1 / sqrt(var + 1e-6);
        if (mean) mean[bt] = mu, rstd[bt] = r;
        for (int d = 0; d < D; d++) {
            double o = (x[d] - mu) * r * (1 + m[c->c1 * D + d]) + m[c->c0 * D + d];
            c->out[(int64_t)bt * D + d] = o;
            L += o * c->R[(int64_t)bt * D + d];
        }
    }
    return L;
}
static double ln_mod_loss(void *p) { return ln_mod_ref(p, NULL, NULL); }
static double gate_res_loss(void *p) {
    ada_ctx *c = p;
    double L = 0;
    for (int bt = 0; bt < c->B * c->T; bt++)
        for (int d = 0; d < c->D; d++) {
            int64_t i = (int64_t)bt * c->D + d;
            double g = c->mod[((int64_t)(bt / c->T) * c->nchunk + c->c0) * c->D + d];
            c->out[i] = c->x[i] + g * c->y[i];
            L += c->out[i] * c->R[i];
        }
    return L;
}

// True if the chunks of dmod other than keep0, keep1 still hold `start`.
// Zeroes them in `got` afterwards: the reference gradient there is 0.
static bool other_chunks_untouched(float *got, const float *start, int B, int nchunk, int D,
                                   int keep0, int keep1) {
    bool ok = true;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < nchunk; k++) {
            if (k == keep0 || k == keep1) continue;
            float *g = got + ((int64_t)b * nchunk + k) * D;
            ok &= memcmp(g, start + (g - got), D * sizeof(float)) == 0;
            memset(g, 0, D * sizeof(float));
        }
    return ok;
}

static void test_ln_mod(int B, int T, int D) {
    const int nchunk = 6, sh = 3, sc = 4;
    const int64_t n = (int64_t)B * T * D, nm = (int64_t)B * nchunk * D;
    char name[80];
    float *x = host_rand(n, 1.5, 3.5), *mod = host_rand(nm, -1, 1), *R = host_rand(n, -1, 1);
    ada_ctx c = {to_d(x, n), to_d(mod, nm), NULL, to_d(R, n), malloc(n * sizeof(double)),
                 B, T, D, nchunk, sh, sc};
    double *mean = malloc(B * T * sizeof(double)), *rstd = malloc(B * T * sizeof(double));
    ln_mod_ref(&c, mean, rstd);
    dc_buf xd = dev_from(x, n), md = dev_from(mod, nm), out = dev_nan(n);
    dc_buf mean_d = dev_nan(B * T), rstd_d = dev_nan(B * T);
    g_be->ln_mod_fwd(g_be, out, mean_d, rstd_d, xd, md, B, T, D, nchunk, sh, sc);
    float *got = dev_get(out, n), *gm = dev_get(mean_d, B * T), *gr = dev_get(rstd_d, B * T);
    snprintf(name, sizeof name, "ln_mod_fwd out B%d T%d D%d", B, T, D);
    check(name, got, c.out, n, TOL_FWD);
    check("ln_mod_fwd mean", gm, mean, B * T, TOL_FWD);
    check("ln_mod_fwd rstd", gr, rstd, B * T, TOL_FWD);

    float *dx0 = host_rand(n, -1, 1), *dm0 = host_rand(nm, -1, 1);
    dc_buf dx = dev_from(dx0, n), dmod = dev_from(dm0, nm), Rd = dev_from(R, n);
    g_be->ln_mod_bwd(g_be, dx, dmod, Rd, xd, mean_d, rstd_d, md, B, T, D, nchunk, sh, sc);
    float *gdx = dev_get(dx, n), *gdm = dev_get(dmod, nm);
    for (int64_t i = 0; i < n; i++) gdx[i] -= dx0[i];  // dx is "+="
    report("ln_mod_bwd dx += vs FD", fd_err(ln_mod_loss, &c, c.x, n, gdx, 300), TOL_FD);
    bool untouched = other_chunks_untouched(gdm, dm0, B, nchunk, D, sh, sc);
    report("ln_mod_bwd dmod shift,scale vs FD", fd_err(ln_mod_loss, &c, c.mod, nm, gdm, 300),
           TOL_FD);
    report("ln_mod_bwd other dmod untouched", untouched ? 0 : INFINITY, 0);
    free(x), free(mod), free(R), free(c.x), free(c.mod), free(c.R), free(c.out), free(mean);
    free(rstd), free(got), free(gm), free(gr), free(dx0), free(dm0), free(gdx), free(gdm);
    dev_free_all();
}

static void test_gate_res(int B, int T, int D) {
    const int nchunk = 6, cg = 2;
    const int64_t n = (int64_t)B * T * D, nm = (int64_t)B * nchunk * D;
    float *x = host_rand(n, -1, 1), *y = host_rand(n, -1, 1), *mod = host_rand(nm, -1, 1);
    float *R = host_rand(n, -1, 1);
    ada_ctx c = {to_d(x, n), to_d(mod, nm), to_d(y, n), to_d(R, n), malloc(n * sizeof(double)),
                 B, T, D, nchunk, cg, -1};
    gate_res_loss(&c);
    dc_buf xd = dev_from(x, n), yd = dev_from(y, n), md = dev_from(mod, nm);
    dc_buf od = dev_nan(n);
    g_be->gate_res_fwd(g_be, od, xd, yd, md, B, T, D, nchunk, cg);  // out of place
    float *got = dev_get(od, n);
    check("gate_res_fwd", got, c.out, n, TOL_FWD);
    free(got);
    g_be->gate_res_fwd(g_be, xd, xd, yd, md, B, T, D, nchunk, cg);  // in place
    got = dev_get(xd, n);
    check("gate_res_fwd", got, c.out, n, TOL_FWD);

    float *dm0 = host_rand(nm, -1, 1);
    dc_buf dy = dev_nan(n), dmod = dev_from(dm0, nm), Rd = dev_from(R, n);
    g_be->gate_res_bwd(g_be, dy, dmod, Rd, yd, md, B, T, D, nchunk, cg);
    float *gdy = dev_get(dy, n), *gdm = dev_get(dmod, nm);
    report("gate_res_bwd dy vs FD", fd_err(gate_res_loss, &c, c.y, n, gdy, 300), TOL_FD);
    bool untouched = other_chunks_untouched(gdm, dm0, B, nchunk, D, cg, cg);
    report("gate_res_bwd dgate vs FD", fd_err(gate_res_loss, &c, c.mod, nm, gdm, 300), TOL_FD);
    report("gate_res_bwd other dmod untouched", untouched ? 0 : INFINITY, 0);
    free(x), free(y), free(mod), free(R), free(c.x), free(c.mod), free(c.y), free(c.R);
    free(c.out), free(got), free(dm0), free(gdy), free(gdm);
    dev_free_all();
}

// ---- attention -------------------------------------------------------------------------
typedef struct {
    double *qkv, *R, *out, *lse, *s;
    int B, T, D, H;
} attn_ctx;
// Per (b, h): s_ij = q_i . k_j / sqrt(Dh); p = softmax_j(s); out_i = sum_j p_ij v_j.
static double attn_ref(void *p) {
    attn_ctx *c = p;
    const int T = c->T, D = c->D, Dh = D / c->H;
    double L = 0;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < T; i++) {
                const double *q = c->qkv + ((int64_t)b * T + i) * 3 * D + h * Dh;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    const double *k = c->qkv + ((int64_t)b * T + j) * 3 * D + D + h * Dh;
                    double s = 0;
                    for (int d = 0; d < Dh; d++) s += q[d] * k[d];
                    c->s[j] = s / sqrt((double)Dh);
                    mx = c->s[j] > mx ? c->s[j] : mx;
                }
                for (int j = 0; j < T; j++) sum += exp(c->s[j] - mx);
                c->lse[((int64_t)b * c->H + h) * T + i] = mx + log(sum);
                for (int j = 0; j < T; j++) c->s[j] = exp(c->s[j] - mx) / sum;
                for (int d = 0; d < Dh; d++) {
                    double o = 0;
                    for (int j = 0; j < T; j++)
                        o += c->s[j] * c->qkv[((int64_t)b * T + j) * 3 * D + 2 * D + h * Dh + d];
                    int64_t oi = ((int64_t)b * T + i) * D + h * Dh + d;
                    c->out[oi] = o;
                    L += o * c->R[oi];
                }
            }
    return L;
}

static void test_attention(int B, int T, int D, int H, int nfd) {
    const int64_t nq = (int64_t)B * T * 3 * D, no = (int64_t)B * T * D, nl = (int64_t)B * H * T;
    char name[80];
    // Scores of a few units, so softmax is neither uniform nor one-hot.
    float *qkv = host_rand(nq, -1.5, 1.5), *R = host_rand(no, -1, 1);
    attn_ctx c = {to_d(qkv, nq), to_d(R, no), malloc(no * sizeof(double)),
                  malloc(nl * sizeof(double)), malloc(T * sizeof(double)), B, T, D, H};
    attn_ref(&c);
    dc_buf qd = dev_from(qkv, nq), out = dev_nan(no), lse = dev_nan(nl);
    if (g_be->reserve(g_be, T, 64) != 0) printf("reserve failed: %s\n", dc_error()), exit(1);
    const dc_attn_shape sh = dc_attn_packed(B, T, D, H);  // q, k, v in place in qkv
    g_be->attention_fwd(g_be, out, lse, qd, dc_buf_at(qd, D), dc_buf_at(qd, 2 * D), &sh);
    float *got = dev_get(out, no), *gl = dev_get(lse, nl);
    snprintf(name, sizeof name, "attn_fwd out B%d T%d D%d H%d", B, T, D, H);
    check(name, got, c.out, no, TOL_FWD);
    snprintf(name, sizeof name, "attn_fwd lse Dh%d", D / H);
    check(name, gl, c.lse, nl, TOL_FWD);

    dc_buf dqkv = dev_nan(nq), Rd = dev_from(R, no);
    g_be->attention_bwd(g_be, dqkv, dc_buf_at(dqkv, D), dc_buf_at(dqkv, 2 * D), Rd, qd,
                        dc_buf_at(qd, D), dc_buf_at(qd, 2 * D), out, lse, &sh);
    float *g = dev_get(dqkv, nq);
    snprintf(name, sizeof name, "attn_bwd dqkv vs FD T%d Dh%d", T, D / H);
    report(name, fd_err(attn_ref, &c, c.qkv, nq, g, nfd), TOL_FD);
    g_be->attention_bwd(g_be, dqkv, dc_buf_at(dqkv, D), dc_buf_at(dqkv, 2 * D), Rd, qd,
                        dc_buf_at(qd, D), dc_buf_at(qd, 2 * D), out, lse, &sh);
    float *g2 = dev_get(dqkv, nq);
    check_same("attn_bwd repeatable", g2, g, nq);
    free(qkv), free(R), free(c.qkv), free(c.R), free(c.out), free(c.lse), free(c.s);
    free(got), free(gl), free(g), free(g2);
    dev_free_all();
}

// ---- patches ------------------------------------------------------------------------
// Patch embedding as DiT defines it: Conv2d(C, D, kernel p, stride p) on img,
// flattened to tokens. patchify followed by linear_fwd with the conv weight
// viewed as [D, C*p*p] must reproduce the convolution.
static void test_patchify(int B, int C, int H, int W, int p, int D) {
    const int gh = H / p, gw = W / p, T = gh * gw, F = C * p * p;
    const int64_t ni = (int64_t)B * C * H * W;
    char name[80];
    float *img = host_rand(ni, -1, 1), *wc = host_rand((int64_t)D * F, -1, 1);
    float *bias = host_rand(D, -1, 1);
    double *ref = malloc((int64_t)B * T * D * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int d = 0; d < D; d++)
            for (int gy = 0; gy < gh; gy++)
                for (int gx = 0; gx < gw; gx++) {
                    double s = bias[d];
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < p; ky++)
                            for (int kx = 0; kx < p; kx++)
                                s += (double)wc[((d * C + c) * p + ky) * p + kx] *
                                     img[(((int64_t)b * C + c) * H + gy * p + ky) * W + gx * p + kx];
                    ref[((int64_t)b * T + gy * gw + gx) * D + d] = s;  // conv[b,d,gy,gx]
                }
    dc_buf imgd = dev_from(img, ni), tok = dev_nan((int64_t)B * T * F);
    dc_buf wd = dev_from(wc, (int64_t)D * F), bd = dev_from(bias, D);
    dc_buf out = dev_nan((int64_t)B * T * D);
    g_be->patchify(g_be, tok, imgd, B, C, H, W, p);
    g_be->linear_fwd(g_be, out, tok, wd, bd, B * T, F, D);
    float *got = dev_get(out, (int64_t)B * T * D);
    snprintf(name, sizeof name, "patchify+linear = conv p%d %dx%d", p, H, W);
    check(name, got, ref, (int64_t)B * T * D, TOL_FWD);
    free(img), free(wc), free(bias), free(ref), free(got);
    dev_free_all();
}

static void test_unpatchify(int B, int C, int H, int W, int p) {
    const int gw = W / p, T = (H / p) * gw, F = p * p * C;
    const int64_t ni = (int64_t)B * C * H * W, nt = (int64_t)B * T * F;
    float *tok = host_rand(nt, -1, 1), *G = host_rand(ni, -1, 1);
    double *ref = malloc(ni * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    ref[(((int64_t)b * C + c) * H + y) * W + x] =
                        tok[((int64_t)b * T + (y / p) * gw + x / p) * F + ((y % p) * p + x % p) * C + c];
    dc_buf tokd = dev_from(tok, nt), img = dev_nan(ni), Gd = dev_from(G, ni), dtok = dev_nan(nt);
    g_be->unpatchify_fwd(g_be, img, tokd, B, C, H, W, p);
    float *got = dev_get(img, ni);
    report("unpatchify_fwd (exact)", nerr(got, ref, ni) == 0 ? 0 : INFINITY, 0);
    // Adjoint: <unpatchify(tok), G> = <tok, unpatchify_bwd(G)>.
    g_be->unpatchify_bwd(g_be, dtok, Gd, B, C, H, W, p);
    float *gt = dev_get(dtok, nt);
    double *dG = to_d(G, ni), *dgt = to_d(gt, nt), *dtk = to_d(tok, nt);
    double lhs = dot(ref, dG, ni), rhs = dot(dtk, dgt, nt);
    // Scaled by |ref| |G| (Cauchy-Schwarz), not by |lhs|: a random lhs can sit near zero.
    double scale = sqrt(dot(ref, ref, ni) * dot(dG, dG, ni));
    report("unpatchify_bwd adjoint <.,.>", fabs(lhs - rhs) / scale, 1e-12);
    free(tok), free(G), free(ref), free(got), free(gt), free(dG), free(dgt), free(dtk);
    dev_free_all();
}

// ---- conditioning embeddings ------------------------------------------------------
static void test_timestep_embed(int B, int half) {
    char name[80];
    float *t = host_rand(B, 0, 999);
    t[0] = 0, t[B - 1] = 999;
    double *ref = malloc((int64_t)B * 2 * half * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int k = 0; k < half; k++) {
            double f = exp(-log(10000.0) * k / half);
            ref[b * 2 * half + k] = cos(t[b] * f);
            ref[b * 2 * half + half + k] = sin(t[b] * f);
        }
    dc_buf td = dev_from(t, B), out = dev_nan((int64_t)B * 2 * half);
    g_be->timestep_embed(g_be, out, td, B, half);
    float *got = dev_get(out, (int64_t)B * 2 * half);
    snprintf(name, sizeof name, "timestep_embed half=%d", half);
    check(name, got, ref, (int64_t)B * 2 * half, TOL_FWD);
    free(t), free(ref), free(got);
    dev_free_all();
}

static void test_embed(void) {
    const int rows = 11, B = 9, D = 72;
    int32_t idx[9];
    for (int b = 0; b < B; b++) idx[b] = (int32_t)(rnd_u64() % rows);
    idx[3] = idx[5] = idx[8] = rows - 1;  // repeats accumulate; the null-class row
    float *table = host_rand((int64_t)rows * D, -1, 1), *dout = host_rand((int64_t)B * D, -1, 1);
    float *start = host_rand((int64_t)rows * D, -1, 1);
    double *ref = malloc((int64_t)rows * D * sizeof(double));
    dc_buf tab = dev_from(table, (int64_t)rows * D), out = dev_nan((int64_t)B * D);
    dc_buf idxd = dev_alloc(B);
    idxd.dt = DC_I32;
    g_be->upload(g_be, idxd.p, idx, sizeof idx);
    g_be->embed_fwd(g_be, out, tab, idxd, B, D);
    float *got = dev_get(out, (int64_t)B * D);
    bool ok = true;
    for (int b = 0; b < B; b++) ok &= memcmp(got + b * D, table + idx[b] * D, D * 4) == 0;
    report("embed_fwd (exact)", ok ? 0 : INFINITY, 0);
    for (int64_t i = 0; i < (int64_t)rows * D; i++) ref[i] = start[i];
    for (int b = 0; b < B; b++)
        for (int d = 0; d < D; d++) ref[idx[b] * D + d] += dout[b * D + d];
    dc_buf dt = dev_from(start, (int64_t)rows * D), dd = dev_from(dout, (int64_t)B * D);
    g_be->embed_bwd(g_be, dt, dd, idxd, B, D);
    float *g = dev_get(dt, (int64_t)rows * D);
    check("embed_bwd +=", g, ref, (int64_t)rows * D, TOL_FWD);
    free(table), free(dout), free(start), free(ref), free(got), free(g);
    dev_free_all();
}

// ---- optimisation ------------------------------------------------------------------------
// n values at offset `off` into their buffers (off = 1: no buffer 32-byte
// aligned). On the CPU the state is also checked bit for bit against
// dc_adamw_update run value by value: an offloaded step (the update in
// per-unit pieces) and a plain one (one pass) must give the same bits.
static void test_adamw(int64_t n, int64_t off) {
    const int steps = 5;
    const int64_t len = n + off;
    const bool cpu = strcmp(g_be->name, "cpu") == 0;
    float *p = host_rand(len, -1, 1), *m = calloc(len, 4), *v = calloc(len, 4), *e = host_rand(len, -1, 1);
    float *sp = malloc(len * 4), *sm = calloc(len, 4), *sv = calloc(len, 4), *se = malloc(len * 4);
    memcpy(sp, p, len * 4), memcpy(se, e, len * 4);
    double *rp = to_d(p + off, n), *rm = calloc(n, 8), *rv = calloc(n, 8), *re = to_d(e + off, n);
    dc_buf pd = dev_from(p, len), md = dev_from(m, len), vd = dev_from(v, len), gd = dev_alloc(len);
    dc_buf ed = dev_from(e, len);
    const double lr = 3e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05, gs = 0.5, decay = 0.9;
    for (int s = 1; s <= steps; s++) {
        float *g = host_rand(len, -2, 2);
        g_be->upload(g_be, gd.p, g, len * sizeof(float));
        dc_adamw_step h = {(float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                           (float)(1 - pow(b1, s)), (float)(1 - pow(b2, s)), (float)gs,
                           (float)decay};
        g_be->adamw(g_be, dc_buf_at(pd, off), dc_buf_at(gd, off), dc_buf_at(md, off), dc_buf_at(vd, off),
                    dc_buf_at(ed, off), dc_buf_none(), dc_buf_none(), n, &h);
        for (int64_t i = off; i < len && cpu; i++) {
            dc_adamw_update(&sp[i], &sm[i], &sv[i], g[i], &h);
            se[i] = h.ema_decay * se[i] + (1.0f - h.ema_decay) * sp[i];
        }
        // The formula of backend.h in double, from the same (float) hyperparameters:
        // 1 - (float)0.999 is itself 1.3e-5 away from 0.001.
        const double B1 = h.beta1, B2 = h.beta2, LR = h.lr, WD = h.weight_decay;
        for (int64_t i = 0; i < n; i++) {
            double gg = (double)g[off + i] * h.grad_scale;
            rm[i] = B1 * rm[i] + (1 - B1) * gg;
            rv[i] = B2 * rv[i] + (1 - B2) * gg * gg;
            double mh = rm[i] / h.bias_corr1, vh = rv[i] / h.bias_corr2;
            rp[i] -= LR * (mh / (sqrt(vh) + h.eps) + WD * rp[i]);
            re[i] = h.ema_decay * re[i] + (1 - (double)h.ema_decay) * rp[i];
        }
        free(g);
    }
    float *gp = dev_get(pd, len), *gm = dev_get(md, len), *gv = dev_get(vd, len), *ge = dev_get(ed, len);
    char name[64];
    snprintf(name, sizeof name, "adamw p (n %lld, 5 steps)", (long long)n);
    check(name, gp + off, rp, n, TOL_FWD);
    check("adamw m", gm + off, rm, n, TOL_FWD);
    check("adamw v", gv + off, rv, n, TOL_FWD);
    check("adamw ema", ge + off, re, n, TOL_FWD);
    if (off) check_same("adamw leaves the values before", gp, p, off);
    if (cpu) {
        check_same("adamw p = the scalar loop's bits", gp, sp, len);
        check_same("adamw m: the same", gm, sm, len);
        check_same("adamw v: the same", gv, sv, len);
        check_same("adamw ema: the same", ge, se, len);
    }
    free(p), free(m), free(v), free(e), free(sp), free(sm), free(sv), free(se);
    free(rp), free(rm), free(rv), free(re), free(gp), free(gm), free(gv), free(ge);
    dev_free_all();
}

static void test_grad_norm(void) {
    const int64_t ns = 1000003;
    float *x = host_rand(ns, -3, 3);
    double ref = 0;
    for (int64_t i = 0; i < ns; i++) ref += (double)x[i] * x[i];
    dc_buf xd = dev_from(x, ns);
    dc_buf out = dev_nan(2);
    float got[2];
    for (int k = 0; k < 2; k++) {
        float max_norm = k == 0 ? 0.5f * (float)sqrt(ref) : 0.0f;  // clipping on, then off
        g_be->grad_norm(g_be, out, xd, ns, max_norm);
        g_be->download(g_be, got, out.p, sizeof got);
        // Double accumulation of exact float squares; the norm is then rounded to float.
        report("grad_norm", fabs(got[0] - sqrt(ref)) / sqrt(ref), 1e-7);
        double want = k == 0 ? max_norm / (sqrt(ref) + 1e-6) : 1.0;
        report(k == 0 ? "grad_norm clip factor" : "grad_norm factor without clipping",
               fabs(got[1] - want) / want, 1e-6);
    }
    free(x);
    dev_free_all();
}


int main(int argc, char **argv) {
    uint64_t seed;
    if (ops_start("test_ops", argc, argv, &seed)) return 1;
    test_memory();
    test_linear(37, 45, 29, 150);  // single-threaded GEMM
    test_linear(259, 80, 67, 24);  // split by rows
    test_linear(5, 64, 300, 24);   // split by columns
    test_act("gelu", ref_gelu, true);
    test_act("silu", ref_silu, false);
    test_axpy_add_rows();
    test_ln_mod(3, 19, 72);
    test_ln_mod(2, 200, 100);  // threaded, column tail in the dmod blocks
    test_gate_res(3, 19, 72);
    test_gate_res(2, 200, 100);
    test_attention(2, 19, 144, 2, 300);  // Dh = 72 (DiT-XL), T not a multiple of 8
    test_attention(3, 37, 96, 3, 200);   // Dh = 32
    test_attention(1, 67, 128, 2, 120);  // Dh = 64, full and partial tiles
    test_patchify(2, 3, 12, 8, 2, 40);
    test_patchify(1, 4, 8, 12, 4, 24);
    test_unpatchify(2, 6, 12, 8, 2);
    test_unpatchify(1, 8, 8, 16, 4);
    test_timestep_embed(7, 128);
    test_timestep_embed(3, 5);
    test_embed();
    test_adamw(50021, 0);
    test_adamw(200003, 1);
    test_grad_norm();

    return ops_finish(seed);
}
