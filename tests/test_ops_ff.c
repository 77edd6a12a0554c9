// The feed-forward ops of latent diffusion's transformers (GEGLU, the
// product with its gate, several products of one input) and the activations
// of a backend, against straight double loops and their finite differences,
// as test_ops.c does for the DiT ops (its header comment explains the
// tolerances); test_ops_latent.c has the ops of the maps.
//
//   build/tests/test_ops_ff [seed] [backend]      (seed from the clock by default)
#include "ops_check.h"

static double ref_gelu_erf(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double ref_quick_gelu(double x) { return x * (1 / (1 + exp(-1.702 * x))); }

// ---- GEGLU --------------------------------------------------------------------------------
// x[M, 2F] = [h | gate], out = h * gelu_erf(gate). L = sum out R is separable
// per (h, gate) pair, so each coordinate's central difference costs O(1).
static void test_geglu(int64_t M, int F) {
    if (!have("geglu", g_be->geglu_fwd && g_be->geglu_bwd)) return;
    const int64_t ni = M * 2 * F, no = M * F;
    char name[128];
    float *x = host_rand(ni, -4, 4), *R = host_rand(no, -1, 1);
    double *ref = malloc(no * sizeof(double)), *rdx = malloc(ni * sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int f = 0; f < F; f++) {
            const double h = x[m * 2 * F + f], gt = x[m * 2 * F + F + f], r = R[m * F + f];
            ref[m * F + f] = h * ref_gelu_erf(gt);
            rdx[m * 2 * F + f] = ref_gelu_erf(gt) * r;  // linear in h: exact
            rdx[m * 2 * F + F + f] =
                h * (ref_gelu_erf(gt + FD_H) - ref_gelu_erf(gt - FD_H)) / (2 * FD_H) * r;
        }
    dc_buf xd = dev_from(x, ni), out = dev_nan(no), Rd = dev_from(R, no), dx = dev_nan(ni);
    g_be->geglu_fwd(g_be, out, xd, M, F);
    float *got = dev_get(out, no);
    snprintf(name, sizeof name, "geglu_fwd M%lld F%d", (long long)M, F);
    check(name, got, ref, no, TOL_FWD);
    g_be->geglu_bwd(g_be, dx, dc_buf_none(), Rd, xd, M, F);
    float *g = dev_get(dx, ni);
    snprintf(name, sizeof name, "geglu_bwd vs FD M%lld F%d", (long long)M, F);
    check(name, g, rdx, ni, TOL_FD);
    // the backward writing the forward's output too, over its dout: the same bits as both ops apart
    dc_buf Rd2 = dev_from(R, no), dx2 = dev_nan(ni);
    g_be->geglu_bwd(g_be, dx2, Rd2, Rd2, xd, M, F);
    float *o2 = dev_get(Rd2, no), *g2 = dev_get(dx2, ni);
    snprintf(name, sizeof name, "geglu_bwd with out (over dout) M%lld F%d", (long long)M, F);
    report(name, !memcmp(o2, got, no * 4) && !memcmp(g2, g, ni * 4) ? 0 : INFINITY, 0);
    free(o2), free(g2);
    for (int k = 0; other_threads(k); k++) {
        g_be->geglu_fwd(g_be, out, xd, M, F);
        g_be->geglu_bwd(g_be, dx, dc_buf_none(), Rd, xd, M, F);
        float *a = dev_get(out, no), *b = dev_get(dx, ni);
        snprintf(name, sizeof name, "geglu_fwd, bwd %s", threads_tag(k));
        report(name, !memcmp(a, got, no * 4) && !memcmp(b, g, ni * 4) ? 0 : INFINITY, 0);
        free(a), free(b);
    }
    free(x), free(R), free(ref), free(rdx), free(got), free(g);
    dev_free_all();
}

// The feed-forward's first product with its gate: out = h * gelu_erf(g) where
// [h | g] = x w^T + b, against float64.
static void test_linear_geglu(int M, int K, int F) {
    if (!have("linear_geglu", g_be->linear_geglu_fwd != NULL)) return;
    const int64_t nx = (int64_t)M * K, nw = 2LL * F * K, no = (int64_t)M * F;
    char name[128];
    float *x = host_rand(nx, -1, 1), *w = host_rand(nw, -0.3, 0.3), *b = host_rand(2 * F, -1, 1);
    double *ref = malloc(no * sizeof(double));
    for (int m = 0; m < M; m++)
        for (int f = 0; f < F; f++) {
            double h = b[f], gt = b[F + f];
            for (int k = 0; k < K; k++) {
                h += (double)x[(int64_t)m * K + k] * w[(int64_t)f * K + k];
                gt += (double)x[(int64_t)m * K + k] * w[(int64_t)(F + f) * K + k];
            }
            ref[(int64_t)m * F + f] = h * ref_gelu_erf(gt);
        }
    dc_buf xd = dev_from(x, nx), wd = dev_from(w, nw), bd = dev_from(b, 2 * F), out = dev_nan(no),
           pre = dev_nan(2 * no);
    g_be->linear_geglu_fwd(g_be, out, pre, xd, wd, bd, M, K, F);
    float *got = dev_get(out, no);
    snprintf(name, sizeof name, "linear_geglu_fwd M%d K%d F%d", M, K, F);
    check(name, got, ref, no, TOL_FWD);
    free(x), free(w), free(b), free(ref), free(got);
    dev_free_all();
}

// Several products of one input (linear_many_fwd: a UNet's time
// projections), each against float64; jobs with and without a bias.
static void test_linear_many(int M, int K) {
    if (!have("linear_many", g_be->linear_many_fwd != NULL)) return;
    enum { J = 3 };
    const int N[J] = {24, 40, 8};
    char name[128];
    float *x = host_rand((int64_t)M * K, -1, 1);
    dc_buf xd = dev_from(x, (int64_t)M * K);
    dc_linear_job jobs[J];
    float *w[J], *b[J];
    for (int j = 0; j < J; j++) {
        w[j] = host_rand((int64_t)N[j] * K, -0.3, 0.3), b[j] = host_rand(N[j], -1, 1);
        jobs[j] = (dc_linear_job){dev_nan((int64_t)M * N[j]), dev_from(w[j], (int64_t)N[j] * K),
                                  j == 1 ? dc_buf_none() : dev_from(b[j], N[j]), N[j]};
    }
    g_be->linear_many_fwd(g_be, jobs, J, xd, M, K);
    for (int j = 0; j < J; j++) {
        double *ref = malloc((size_t)M * N[j] * sizeof(double));
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N[j]; n++) {
                double s = j == 1 ? 0.0 : b[j][n];
                for (int k = 0; k < K; k++) s += (double)x[(int64_t)m * K + k] * w[j][(int64_t)n * K + k];
                ref[(int64_t)m * N[j] + n] = s;
            }
        float *got = dev_get(jobs[j].out, (int64_t)M * N[j]);
        snprintf(name, sizeof name, "linear_many_fwd M%d K%d job %d (N %d%s)", M, K, j, N[j],
                 j == 1 ? ", no bias" : "");
        check(name, got, ref, (int64_t)M * N[j], TOL_FWD);
        free(ref), free(got), free(w[j]), free(b[j]);
    }
    free(x);
    dev_free_all();
}

// ---- activations of a given kind ----------------------------------------------------------
static void test_activation(dc_act act, const char *what, double (*f)(double)) {
    if (!have("activation", g_be->activation_fwd && g_be->activation_bwd)) return;
    const int64_t n = 100003;  // odd, and large enough to run threaded
    char name[128];
    float *x = host_rand(n, -6, 6), *R = host_rand(n, -1, 1), *start = host_rand(n, -1, 1);
    double *ref = malloc(n * sizeof(double));
    dc_buf xd = dev_from(x, n), out = dev_nan(n), Rd = dev_from(R, n), dx = dev_nan(n);
    for (int64_t i = 0; i < n; i++) ref[i] = f(x[i]);
    g_be->activation_fwd(g_be, out, xd, n, act);
    float *got = dev_get(out, n);
    snprintf(name, sizeof name, "activation_fwd %s", what);
    check(name, got, ref, n, TOL_FWD);
    g_be->activation_bwd(g_be, dx, Rd, xd, n, act, false);
    float *g = dev_get(dx, n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = (f((double)x[i] + FD_H) - f((double)x[i] - FD_H)) / (2 * FD_H) * R[i];
    snprintf(name, sizeof name, "activation_bwd %s vs FD", what);
    check(name, g, ref, n, TOL_FD);
    g_be->upload(g_be, dx.p, start, n * sizeof(float));
    g_be->activation_bwd(g_be, dx, Rd, xd, n, act, true);
    float *g2 = dev_get(dx, n);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)start[i] + g[i];
    snprintf(name, sizeof name, "activation_bwd %s +=", what);
    check(name, g2, ref, n, TOL_FWD);
    for (int k = 0; other_threads(k); k++) {
        g_be->activation_fwd(g_be, out, xd, n, act);
        g_be->activation_bwd(g_be, dx, Rd, xd, n, act, false);
        float *a = dev_get(out, n), *b = dev_get(dx, n);
        snprintf(name, sizeof name, "activation %s %s", what, threads_tag(k));
        report(name, !memcmp(a, got, n * 4) && !memcmp(b, g, n * 4) ? 0 : INFINITY, 0);
        free(a), free(b);
    }
    free(x), free(R), free(start), free(ref), free(got), free(g), free(g2);
    dev_free_all();
}

int main(int argc, char **argv) {
    uint64_t seed;
    if (ops_start("test_ops_ff", argc, argv, &seed)) return 1;
    test_geglu(37, 72);
    test_geglu(129, 640);
    test_linear_geglu(37, 40, 24);
    test_linear_many(3, 56);
    test_linear_many(1, 1280);
    test_activation(DC_ACT_SILU, "silu", ref_silu);
    test_activation(DC_ACT_GELU_TANH, "gelu_tanh", ref_gelu);
    test_activation(DC_ACT_GELU_ERF, "gelu_erf", ref_gelu_erf);
    test_activation(DC_ACT_QUICK_GELU, "quick_gelu", ref_quick_gelu);

    return ops_finish(seed);
}
