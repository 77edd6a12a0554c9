// The general attention op (dc_attn_shape) on the CPU backend against straight
// loops in double with an explicit mask: self-, cross- (5 queries, 77 keys) and
// causal attention, every Stable Diffusion head size (40, 64, 80, 160, and the
// VAE's single head of 512), odd lengths, lengths past one block of queries and
// of keys, packed qkv, separate projections and head-major layouts. Backward
// is checked against central finite differences of the double loops through
// L = sum(out * R), on sampled elements of q, k and v; results must not
// depend on the thread count; a 16384-token forward is checked on sampled rows.
//
//   build/tests/test_attention [seed]
//
// Error = max|got - ref| / max(max|ref|, 1e-6); NaN fails. Outputs are
// pre-filled with NaN, so an element the op fails to write fails the test.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "models/dit.h"

#define TOL_FWD 1e-5
#define TOL_FD 1e-3
#define FD_H 1e-3

static dc_backend *g_be;
static int g_fail, g_count;

static uint64_t g_rng;
static uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd(double lo, double hi) { return lo + (hi - lo) * (rnd_u64() >> 11) * 0x1p-53; }

static void report(const char *name, double err, double tol) {
    bool ok = err <= tol;  // NaN fails
    g_count++;
    if (!ok) g_fail++;
    printf("%-58s err %.2e  tol %.0e  %s\n", name, err, tol, ok ? "PASS" : "FAIL");
}

// ---- layouts ------------------------------------------------------------------------
typedef enum { PACKED, SEPARATE, HEAD_MAJOR } layout_kind;
static const char *k_layout_name[] = {"packed", "separate", "head-major"};

// A logical tensor [B, H, T, Dh] and where its elements live in a buffer.
typedef struct {
    int B, H, T, Dh;
    dc_attn_layout l;
    int64_t base;  // offset of element (0,0,0,0) in the buffer
} view;
static int64_t vat(const view *v, int b, int h, int t, int d) {
    return v->base + b * v->l.batch + h * v->l.head + t * v->l.token + d;
}
static int64_t vcount(const view *v) { return (int64_t)v->B * v->H * v->T * v->Dh; }
static int64_t vidx(const view *v, int b, int h, int t, int d) {
    return (((int64_t)b * v->H + h) * v->T + t) * v->Dh + d;
}

// ---- reference ------------------------------------------------------------------------
typedef struct {
    dc_attn_shape s;
    double *q, *k, *v, *R;  // logical [B,H,T,D] arrays in double
    double *out, *lse, *p;  // reference results, p: one row of scores
} ref_ctx;

// Query i sees key j: all keys, or with the causal mask j <= i + Tk - Tq.
static bool visible(const dc_attn_shape *s, int i, int j) { return !s->causal || j <= i + s->Tk - s->Tq; }

// One row: out[b,h,i,:] and lse; returns sum_d out * R.
static double ref_row(ref_ctx *c, int b, int h, int i) {
    const dc_attn_shape *s = &c->s;
    const double scale = s->scale != 0.0f ? s->scale : 1.0 / sqrt((double)s->Dh);
    const double *q = c->q + (((int64_t)b * s->H + h) * s->Tq + i) * s->Dh;
    double mx = -INFINITY, sum = 0, L = 0;
    for (int j = 0; j < s->Tk; j++) {
        const double *k = c->k + (((int64_t)b * s->H + h) * s->Tk + j) * s->Dh;
        double d = 0;
        for (int e = 0; e < s->Dh; e++) d += q[e] * k[e];
        c->p[j] = visible(s, i, j) ? d * scale : -INFINITY;
        if (c->p[j] > mx) mx = c->p[j];
    }
    for (int j = 0; j < s->Tk; j++) sum += exp(c->p[j] - mx);
    c->lse[((int64_t)b * s->H + h) * s->Tq + i] = mx + log(sum);
    for (int e = 0; e < s->Dv; e++) {
        double o = 0;
        for (int j = 0; j < s->Tk; j++)
            o += exp(c->p[j] - mx) / sum * c->v[(((int64_t)b * s->H + h) * s->Tk + j) * s->Dv + e];
        int64_t oi = (((int64_t)b * s->H + h) * s->Tq + i) * s->Dv + e;
        c->out[oi] = o;
        L += o * c->R[oi];
    }
    return L;
}

static double ref_all(ref_ctx *c) {
    double L = 0;
    for (int b = 0; b < c->s.B; b++)
        for (int h = 0; h < c->s.H; h++)
            for (int i = 0; i < c->s.Tq; i++) L += ref_row(c, b, h, i);
    return L;
}

// dL/dx[n] by central differences; only the rows x[n] reaches are recomputed
// (a query element: its own row; a key or value element: every row of its head).
static double fd(ref_ctx *c, double *x, int64_t n, bool is_q, int b, int h, int i) {
    const double x0 = x[n];
    double Lp = 0, Lm = 0;
    x[n] = x0 + FD_H;
    if (is_q) Lp = ref_row(c, b, h, i);
    else
        for (int r = 0; r < c->s.Tq; r++) Lp += ref_row(c, b, h, r);
    x[n] = x0 - FD_H;
    if (is_q) Lm = ref_row(c, b, h, i);
    else
        for (int r = 0; r < c->s.Tq; r++) Lm += ref_row(c, b, h, r);
    x[n] = x0;
    return (Lp - Lm) / (2 * FD_H);
}

// ---- one case ----------------------------------------------------------------------------
typedef struct {
    int B, H, Tq, Tk, Dh, Dv;
    bool causal;
    layout_kind lay;
    int nfd;  // sampled elements per tensor for the finite differences (0: skip backward)
} attn_case;

// The views of q, k, v, out for a case and the buffer sizes they need.
static void make_views(const attn_case *a, view *q, view *k, view *v, view *o, int64_t *nbuf) {
    const int B = a->B, H = a->H, Tq = a->Tq, Tk = a->Tk, Dh = a->Dh, Dv = a->Dv;
    *q = (view){B, H, Tq, Dh, {0}, 0}, *k = (view){B, H, Tk, Dh, {0}, 0};
    *v = (view){B, H, Tk, Dv, {0}, 0}, *o = (view){B, H, Tq, Dv, {0}, 0};
    o->l = dc_attn_rows(Tq, (int64_t)H * Dv, Dv);
    if (a->lay == PACKED) {  // one [B, T, 3D] buffer
        const dc_attn_shape p = dc_attn_packed(B, Tq, H * Dh, H);
        q->l = k->l = v->l = p.q;
        k->base = (int64_t)H * Dh, v->base = 2 * (int64_t)H * Dh;
        nbuf[0] = (int64_t)B * Tq * 3 * H * Dh, nbuf[1] = nbuf[2] = 0;
    } else if (a->lay == SEPARATE) {  // [B, T, H*Dh] each
        q->l = dc_attn_rows(Tq, (int64_t)H * Dh, Dh), k->l = dc_attn_rows(Tk, (int64_t)H * Dh, Dh);
        v->l = dc_attn_rows(Tk, (int64_t)H * Dv, Dv);
        nbuf[0] = vcount(q), nbuf[1] = vcount(k), nbuf[2] = vcount(v);
    } else {  // [B, H, T, Dh] each
        q->l = (dc_attn_layout){(int64_t)H * Tq * Dh, Dh, (int64_t)Tq * Dh};
        k->l = (dc_attn_layout){(int64_t)H * Tk * Dh, Dh, (int64_t)Tk * Dh};
        v->l = (dc_attn_layout){(int64_t)H * Tk * Dv, Dv, (int64_t)Tk * Dv};
        o->l = (dc_attn_layout){(int64_t)H * Tq * Dv, Dv, (int64_t)Tq * Dv};
        nbuf[0] = vcount(q), nbuf[1] = vcount(k), nbuf[2] = vcount(v);
    }
    nbuf[3] = vcount(o);
}

static dc_buf dev_alloc(int64_t n) {
    void *p = g_be->alloc(g_be, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) printf("alloc failed: %s\n", dc_error()), exit(1);
    return dc_buf_f32(p);
}
static void dev_fill(dc_buf b, int64_t n, float x) {
    float *h = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = x;
    g_be->upload(g_be, b.p, h, (size_t)n * sizeof(float));
    free(h);
}
static float *dev_get(dc_buf b, int64_t n) {
    float *h = malloc((size_t)n * sizeof(float));
    g_be->download(g_be, h, b.p, (size_t)n * sizeof(float));
    return h;
}

// Max |got - ref| / max|ref| over a logical tensor read through a view.
static double view_err(const float *buf, const view *v, const double *ref) {
    double e = 0, m = 1e-6;
    for (int b = 0; b < v->B; b++)
        for (int h = 0; h < v->H; h++)
            for (int t = 0; t < v->T; t++)
                for (int d = 0; d < v->Dh; d++) {
                    double r = ref[vidx(v, b, h, t, d)], g = buf[vat(v, b, h, t, d)];
                    double x = fabs(g - r);
                    if (!(x <= e)) e = x;  // NaN sticks
                    if (fabs(r) > m) m = fabs(r);
                }
    return e / m;
}

// Runs forward and backward once; the host copies of out, lse, dq, dk, dv come back.
typedef struct { float *out, *lse, *g[3]; } results;
static results run_case(const attn_case *a, const dc_attn_shape *s, const view *vw, const int64_t *nb,
                        float *const *host_in, const float *hR) {
    const int64_t nl = (int64_t)a->B * a->H * a->Tq;
    // Buffers: q/k/v share buffer 0 when packed.
    dc_buf in[3], gr[3];
    for (int t = 0; t < 3; t++) {
        if (nb[t] == 0) {
            in[t] = dc_buf_at(in[0], vw[t].base), gr[t] = dc_buf_at(gr[0], vw[t].base);
            continue;
        }
        in[t] = dev_alloc(nb[t]), gr[t] = dev_alloc(nb[t]);
        g_be->upload(g_be, in[t].p, host_in[t], (size_t)nb[t] * sizeof(float));
        dev_fill(gr[t], nb[t], NAN);
    }
    dc_buf out = dev_alloc(nb[3]), lse = dev_alloc(nl), R = dev_alloc(nb[3]);
    dev_fill(out, nb[3], NAN), dev_fill(lse, nl, NAN);
    g_be->upload(g_be, R.p, hR, (size_t)nb[3] * sizeof(float));
    if (g_be->reserve(g_be, a->Tq > a->Tk ? a->Tq : a->Tk, a->Dh) != 0)
        printf("reserve failed: %s\n", dc_error()), exit(1);
    g_be->attention_fwd(g_be, out, lse, in[0], in[1], in[2], s);
    if (a->nfd) g_be->attention_bwd(g_be, gr[0], gr[1], gr[2], R, in[0], in[1], in[2], out, lse, s);
    results r = {dev_get(out, nb[3]), dev_get(lse, nl), {NULL, NULL, NULL}};
    for (int t = 0; t < 3; t++) r.g[t] = dev_get(nb[t] ? gr[t] : gr[0], nb[t] ? nb[t] : nb[0]);
    for (int t = 0; t < 3; t++)
        if (nb[t]) g_be->free(g_be, in[t].p), g_be->free(g_be, gr[t].p);
    g_be->free(g_be, out.p), g_be->free(g_be, lse.p), g_be->free(g_be, R.p);
    return r;
}
static void free_results(results *r) { free(r->out), free(r->lse), free(r->g[0]), free(r->g[1]), free(r->g[2]); }

static bool same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

static void test_case(attn_case a) {
    char tag[96], name[160];
    snprintf(tag, sizeof tag, "B%d H%d Tq%d Tk%d Dh%d%s %s", a.B, a.H, a.Tq, a.Tk, a.Dh, a.causal ? " causal" : "",
             k_layout_name[a.lay]);
    view vw[4];
    int64_t nb[4];
    make_views(&a, &vw[0], &vw[1], &vw[2], &vw[3], nb);
    dc_attn_shape s = {.B = a.B, .H = a.H, .Tq = a.Tq, .Tk = a.Tk, .Dh = a.Dh, .Dv = a.Dv, .causal = a.causal,
                       .q = vw[0].l, .k = vw[1].l, .v = vw[2].l, .out = vw[3].l};

    // Host inputs in their buffers, and the same values as logical doubles.
    ref_ctx c = {.s = s};
    double *lg[3];
    float *host_in[3] = {NULL, NULL, NULL};
    for (int t = 0; t < 3; t++) {
        if (nb[t]) host_in[t] = malloc((size_t)nb[t] * sizeof(float));
        float *buf = nb[t] ? host_in[t] : host_in[0];
        lg[t] = malloc((size_t)vcount(&vw[t]) * sizeof(double));
        for (int b = 0; b < a.B; b++)
            for (int h = 0; h < a.H; h++)
                for (int i = 0; i < vw[t].T; i++)
                    for (int d = 0; d < vw[t].Dh; d++) {
                        // Scores of a few units, so softmax is neither uniform nor one-hot.
                        float x = (float)rnd(-1.5, 1.5);
                        buf[vat(&vw[t], b, h, i, d)] = x;
                        lg[t][vidx(&vw[t], b, h, i, d)] = x;
                    }
    }
    c.q = lg[0], c.k = lg[1], c.v = lg[2];
    const int64_t no = vcount(&vw[3]), nl = (int64_t)a.B * a.H * a.Tq;
    float *hR = malloc((size_t)nb[3] * sizeof(float));
    c.R = malloc((size_t)no * sizeof(double));
    for (int b = 0; b < a.B; b++)
        for (int h = 0; h < a.H; h++)
            for (int i = 0; i < a.Tq; i++)
                for (int d = 0; d < a.Dv; d++) {
                    float x = (float)rnd(-1, 1);
                    hR[vat(&vw[3], b, h, i, d)] = x, c.R[vidx(&vw[3], b, h, i, d)] = x;
                }
    c.out = malloc((size_t)no * sizeof(double)), c.lse = malloc((size_t)nl * sizeof(double));
    c.p = malloc((size_t)a.Tk * sizeof(double));
    ref_all(&c);

    results r = run_case(&a, &s, vw, nb, host_in, hR);
    snprintf(name, sizeof name, "fwd out %s", tag);
    report(name, view_err(r.out, &vw[3], c.out), TOL_FWD);
    double le = 0, lm = 1e-6;
    for (int64_t i = 0; i < nl; i++) {
        double x = fabs(r.lse[i] - c.lse[i]);
        if (!(x <= le)) le = x;
        if (fabs(c.lse[i]) > lm) lm = fabs(c.lse[i]);
    }
    report("fwd lse", le / lm, TOL_FWD);

    if (a.nfd) {
        // Finite differences on sampled elements of q, k, v.
        static const char *tn[3] = {"dq", "dk", "dv"};
        for (int t = 0; t < 3; t++) {
            const float *g = r.g[t];
            double e = 0, m = 1e-6;
            for (int n = 0; n < a.nfd; n++) {
                int b = (int)(rnd_u64() % a.B), h = (int)(rnd_u64() % a.H);
                int i = (int)(rnd_u64() % vw[t].T), d = (int)(rnd_u64() % vw[t].Dh);
                double ref = fd(&c, lg[t], vidx(&vw[t], b, h, i, d), t == 0, b, h, i);
                double x = fabs(g[vat(&vw[t], b, h, i, d)] - ref);
                if (!(x <= e)) e = x;
                if (fabs(ref) > m) m = fabs(ref);
            }
            // Every gradient element written (NaN-filled before): scan the whole view.
            for (int b = 0; b < a.B; b++)
                for (int h = 0; h < a.H; h++)
                    for (int i = 0; i < vw[t].T; i++)
                        for (int d = 0; d < vw[t].Dh; d++)
                            if (isnan(g[vat(&vw[t], b, h, i, d)])) e = NAN;
            snprintf(name, sizeof name, "bwd %s vs FD", tn[t]);
            report(name, e / m, TOL_FD);
        }
    }

    // The same bits with 1 and 3 threads.
    const int threads = omp_get_max_threads();
    for (int nt = 1; nt <= 3; nt += 2) {
        omp_set_num_threads(nt);
        results r2 = run_case(&a, &s, vw, nb, host_in, hR);
        bool same = same_bits(r2.out, r.out, nb[3]) && same_bits(r2.lse, r.lse, nl);
        for (int t = 0; t < 3 && a.nfd; t++)
            same = same && same_bits(r2.g[t], r.g[t], nb[t] ? nb[t] : nb[0]);
        snprintf(name, sizeof name, "same bits with %d thread%s", nt, nt > 1 ? "s" : "");
        report(name, same ? 0 : INFINITY, 0);
        free_results(&r2);
    }
    omp_set_num_threads(threads);

    free_results(&r);
    for (int t = 0; t < 3; t++) free(lg[t]), free(host_in[t]);
    free(hR), free(c.R), free(c.out), free(c.lse), free(c.p);
}

// ---- a 16384-token forward -------------------------------------------------------------
// SD's first attention at 1024 px: 128 x 128 latent tokens, head size 40. One
// head, separate layout; a few sampled query rows against the double loops.
static void test_long(int T, int Dh, bool causal) {
    const int64_t n = (int64_t)T * Dh;
    float *h[3];
    for (int t = 0; t < 3; t++) {
        h[t] = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) h[t][i] = (float)rnd(-1.5, 1.5);
    }
    const dc_attn_layout l = dc_attn_rows(T, Dh, Dh);
    dc_attn_shape s = {.B = 1, .H = 1, .Tq = T, .Tk = T, .Dh = Dh, .Dv = Dh, .causal = causal,
                       .q = l, .k = l, .v = l, .out = l};
    if (g_be->reserve(g_be, T, Dh) != 0) printf("reserve failed: %s\n", dc_error()), exit(1);
    dc_buf q = dev_alloc(n), k = dev_alloc(n), v = dev_alloc(n), out = dev_alloc(n), lse = dev_alloc(T);
    g_be->upload(g_be, q.p, h[0], n * 4), g_be->upload(g_be, k.p, h[1], n * 4), g_be->upload(g_be, v.p, h[2], n * 4);
    dev_fill(out, n, NAN), dev_fill(lse, T, NAN);
    double t0 = omp_get_wtime();
    g_be->attention_fwd(g_be, out, lse, q, k, v, &s);
    double secs = omp_get_wtime() - t0;
    float *go = dev_get(out, n), *gl = dev_get(lse, T);
    // Reference rows: the first, the last, and a few at random (one per block edge).
    int rows[8] = {0, T - 1, 255, 256, 0, 0, 0, 0};
    for (int i = 4; i < 8; i++) rows[i] = (int)(rnd_u64() % T);
    const double scale = 1.0 / sqrt((double)Dh);
    double e = 0, m = 1e-6, le = 0;
    double *p = malloc((size_t)T * sizeof(double));
    for (int r = 0; r < 8; r++) {
        const int i = rows[r];
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
            double d = 0;
            for (int x = 0; x < Dh; x++) d += (double)h[0][(int64_t)i * Dh + x] * h[1][(int64_t)j * Dh + x];
            p[j] = causal && j > i ? -INFINITY : d * scale;
            if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j < T; j++) sum += exp(p[j] - mx);
        // Relative, floored at 1: a causal first row's lse is one score and can sit near zero.
        double x = fabs(gl[i] - (mx + log(sum))) / fmax(1.0, fabs(mx + log(sum)));
        if (!(x <= le)) le = x;
        for (int d = 0; d < Dh; d++) {
            double o = 0;
            for (int j = 0; j < T; j++) o += exp(p[j] - mx) / sum * h[2][(int64_t)j * Dh + d];
            double y = fabs(go[(int64_t)i * Dh + d] - o);
            if (!(y <= e)) e = y;
            if (fabs(o) > m) m = fabs(o);
        }
    }
    for (int64_t i = 0; i < n; i++)
        if (isnan(go[i])) e = NAN;
    char name[96];
    snprintf(name, sizeof name, "fwd %d tokens Dh%d%s (%.2f s), sampled rows", T, Dh, causal ? " causal" : "", secs);
    report(name, e / m, TOL_FWD);
    report("fwd lse, sampled rows", le, TOL_FWD);
    for (int t = 0; t < 3; t++) free(h[t]);
    free(go), free(gl), free(p);
    g_be->free(g_be, q.p), g_be->free(g_be, k.p), g_be->free(g_be, v.p), g_be->free(g_be, out.p);
    g_be->free(g_be, lse.p);
}

// The DiT's token limit follows the attention's: 16384 tokens (SD at 1024 px)
// are accepted, more than 65536 refused with the limit in the message.
static void test_token_limit(void) {
    dc_dit_config c = {.input_size = 128, .patch = 1, .in_channels = 4, .hidden = 64, .depth = 1, .heads = 1,
                       .mlp_hidden = 64, .num_classes = 10};
    int rc = dc_dit_config_validate(&c);
    report("DiT config with 16384 tokens is accepted", rc == 0 ? 0 : INFINITY, 0);
    if (rc) printf("     %s\n", dc_error());
    c.input_size = 264;  // 69696 tokens
    rc = dc_dit_config_validate(&c);
    report("DiT config with 69696 tokens is refused naming the limit",
           rc != 0 && strstr(dc_error(), "at most 65536") ? 0 : INFINITY, 0);
}

int main(int argc, char **argv) {
    g_rng = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    const uint64_t seed = g_rng;
    g_be = dc_backend_cpu_create();
    if (!g_be) return printf("no cpu backend: %s\n", dc_error()), 1;

    test_case((attn_case){2, 2, 19, 19, 64, 64, false, PACKED, 40});      // DiT's packed qkv, odd T
    test_case((attn_case){2, 2, 5, 77, 64, 64, false, SEPARATE, 40});     // cross-attention to 77 tokens
    test_case((attn_case){2, 1, 5, 77, 40, 40, false, HEAD_MAJOR, 30});   // cross, head size 40
    test_case((attn_case){1, 2, 40, 7, 64, 64, false, SEPARATE, 30});     // more queries than keys
    test_case((attn_case){2, 2, 77, 77, 64, 64, true, SEPARATE, 40});     // CLIP's causal mask
    test_case((attn_case){1, 2, 13, 13, 80, 80, true, PACKED, 30});       // causal, packed, head size 80
    test_case((attn_case){1, 2, 9, 21, 40, 40, true, SEPARATE, 30});      // causal with Tq < Tk (bottom right)
    test_case((attn_case){2, 1, 23, 31, 160, 160, false, HEAD_MAJOR, 30}); // head size 160
    test_case((attn_case){2, 1, 33, 33, 512, 512, false, SEPARATE, 20});   // the VAE's one head of 512
    test_case((attn_case){1, 1, 7, 11, 24, 40, false, SEPARATE, 30});      // value size != query size
    // Past one block of queries (256) and of keys (512): the online softmax,
    // causal blocks skipped, gradients summed over blocks.
    test_case((attn_case){1, 1, 300, 700, 16, 16, false, SEPARATE, 12});
    test_case((attn_case){1, 1, 600, 600, 8, 8, true, HEAD_MAJOR, 12});
    test_case((attn_case){1, 1, 300, 1100, 8, 8, true, SEPARATE, 12});
    test_long(16384, 40, false);
    test_long(4099, 40, true);
    test_token_limit();

    printf("%d of %d checks passed (seed %llu)\n", g_count - g_fail, g_count, (unsigned long long)seed);
    dc_backend_destroy(g_be);
    return g_fail ? 1 : 0;
}
