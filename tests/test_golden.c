// Golden-file test: the C DiT against the official model as PyTorch computes it.
//
// tests/golden/*.safetensors are written by tools/dit_reference.py (see
// tests/golden/README.md): tiny DiTs with random non-zero weights under their
// official state-dict keys, inputs, the float64 model output and the
// gradients of L = sum(out * R) for every parameter, all stored as float32.
// This test loads each file through the safetensors reader, copies every
// official-key tensor into a CPU dc_dit by name, and compares forward and
// backward tensor by tensor. Files of learned-sigma models also hold a
// training-loss batch (loss.*), checked against q_sample and dc_diffusion_loss.
//
// Usage: test_golden [file.safetensors ...]   (default: the files below)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "diffusion/schedule.h"
#include "diffusion/training_loss.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "nerr.h"

// Tolerances on the normalised error max|a - b| / max|b| of a tensor.
// A float32 run of the PyTorch reference itself lands at ~4e-7 on these files
// (output and gradients). Computing the timestep frequencies in float64
// instead of the official float32 (a legitimate choice) moves the output to
// ~3e-6 and the t_embedder gradients to ~2e-5; the bounds allow ~8x that for
// a different summation order and libm. A wrong index, missing term or
// transposed weight gives errors of order 1, and nudging a single weight by
// half its std already fails the output check.
#define TOL_OUT 2e-5
#define TOL_GRAD 2e-4
// dc_dit_create fills pos_embed itself: it must equal the official table
// (float64 math rounded to float32, so a few float32 ulps at most).
#define TOL_POS 1e-6
// The loss, from float32 coefficients (as officially: _extract_into_tensor
// casts the float64 tables with .float()). A float32 PyTorch run of the loss
// is within ~1e-6 of the float64 values, per sample, for mse and vb.
#define TOL_XT 1e-5      // q_sample: two float32 products and a sum
#define TOL_LOSS 1e-4    // relative error of each sample's mse and vb
// d loss / d out, normalised separately over the eps half and the v half (the
// v gradients are 10x smaller). Float32 coefficients alone move the v half by
// ~1e-5 (at t >= 500 its tiny values come from near-cancelling log-variances).
#define TOL_DOUT 2e-4

static const char *default_files[] = {
    "tests/golden/dit_a.safetensors",
    "tests/golden/dit_b.safetensors",
};


static int is_io_name(const char *name) {
    return strcmp(name, "R") == 0 || strncmp(name, "input.", 6) == 0 ||
           strncmp(name, "output.", 7) == 0 || strncmp(name, "grad.", 5) == 0 ||
           strncmp(name, "loss.", 5) == 0;
}

static int meta_int(const dc_st_file *f, const char *key, int *out) {
    const char *s = dc_st_meta(f, key);
    if (!s) return dc_fail("%s: __metadata__ has no '%s'", f->path, key);
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v <= 0 || v > (1 << 24))
        return dc_fail("%s: __metadata__ '%s' = '%s' is not a positive integer", f->path, key, s);
    *out = (int)v;
    return 0;
}

static int config_from_meta(const dc_st_file *f, dc_dit_config *c) {
    memset(c, 0, sizeof *c);
    DC_TRY(meta_int(f, "input_size", &c->input_size));
    DC_TRY(meta_int(f, "patch", &c->patch));
    DC_TRY(meta_int(f, "in_channels", &c->in_channels));
    DC_TRY(meta_int(f, "hidden", &c->hidden));
    DC_TRY(meta_int(f, "depth", &c->depth));
    DC_TRY(meta_int(f, "heads", &c->heads));
    DC_TRY(meta_int(f, "mlp_hidden", &c->mlp_hidden));
    DC_TRY(meta_int(f, "num_classes", &c->num_classes));
    const char *ls = dc_st_meta(f, "learn_sigma");
    if (!ls || (strcmp(ls, "true") && strcmp(ls, "false")))
        return dc_fail("%s: __metadata__ 'learn_sigma' must be true or false", f->path);
    c->learn_sigma = strcmp(ls, "true") == 0;
    return 0;
}

// A host copy of tensor `name`, which must hold `numel` elements (F32 or any
// float dtype the reader converts). NULL with a message otherwise.
static float *read_f32(const dc_st_file *f, const char *name, int64_t numel) {
    const dc_st_tensor *t = dc_st_find(f, name);
    if (!t) return dc_fail("%s: no tensor '%s'", f->path, name), NULL;
    if (t->numel != numel)
        return dc_fail("%s: tensor '%s' has %lld elements, expected %lld", f->path, name,
                       (long long)t->numel, (long long)numel), NULL;
    float *h = malloc((size_t)numel * sizeof *h);
    if (!h) return dc_fail("out of memory reading %s", name), NULL;
    if (dc_st_read_f32(f, t, h)) return free(h), NULL;
    return h;
}

// Backend buffer holding a copy of host[bytes].
static void *dev_copy(dc_backend *be, const void *host, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (p) be->upload(be, p, host, bytes);
    return p;
}

static int same_shape(const dc_st_tensor *t, const dc_param *p) {
    if (t->ndim != p->ndim) return 0;
    for (int d = 0; d < p->ndim; d++)
        if (t->shape[d] != p->shape[d]) return 0;
    return 1;
}

// Copies every official-key tensor of the file into the model by name and
// checks the key sets match both ways. Returns the number of failures.
static int load_weights(const dc_st_file *f, dc_dit *m) {
    int fails = 0;
    const dc_params *ps = &m->params;
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        const dc_st_tensor *t = dc_st_find(f, p->name);
        if (!t) {
            printf("  FAIL weight %s: missing from the file\n", p->name);
            fails++;
            continue;
        }
        if (!same_shape(t, p)) {
            printf("  FAIL weight %s: file shape differs from the model's (rank %d vs %d)\n",
                   p->name, t->ndim, p->ndim);
            fails++;
            continue;
        }
        float *h = read_f32(f, p->name, p->numel);
        if (!h) {
            printf("  FAIL weight %s: %s\n", p->name, dc_error());
            fails++;
            continue;
        }
        m->be->upload(m->be, dc_param_data(ps, i).p, h, (size_t)p->numel * sizeof(float));
        free(h);
    }
    for (int i = 0; i < f->count; i++) {
        const char *name = f->tensors[i].name;
        if (!is_io_name(name) && dc_params_find(ps, name) < 0) {
            printf("  FAIL weight %s: in the file but not a model parameter\n", name);
            fails++;
        }
    }
    printf("  weights  %3d tensors loaded by official key%s\n", ps->count, fails ? "" : "  ok");
    return fails;
}

// The model's own pos_embed (filled by dc_dit_create) against the official table.
static int check_pos_embed(const dc_st_file *f, dc_dit *m) {
    int i = dc_params_find(&m->params, "pos_embed");
    if (i < 0) return printf("  FAIL pos_embed: not a model parameter\n"), 1;
    int64_t n = m->params.items[i].numel;
    float *want = read_f32(f, "pos_embed", n), *got = malloc((size_t)n * sizeof *got);
    int fails = 0;
    if (!want || !got) {
        printf("  FAIL pos_embed: %s\n", dc_error());
        fails = 1;
    } else {
        m->be->download(m->be, got, dc_param_data(&m->params, i).p, (size_t)n * sizeof *got);
        double e = nerr(got, want, n);
        fails = !(e <= TOL_POS);
        printf("  pos_embed   model table vs official: err %.2e (tol %.0e)  %s\n", e, TOL_POS,
               fails ? "FAIL" : "ok");
    }
    free(want);
    free(got);
    return fails;
}

// The group a key belongs to for the summary lines: "blocks.3" or the first
// component ("t_embedder", "final_layer", ...).
static void group_of(const char *key, char *out, size_t n) {
    const char *dot = strchr(key, '.');
    if (dot && strncmp(key, "blocks.", 7) == 0) dot = strchr(dot + 1, '.');
    size_t len = dot ? (size_t)(dot - key) : strlen(key);
    if (len >= n) len = n - 1;
    memcpy(out, key, len);
    out[len] = 0;
}

typedef struct {
    char name[64];
    int count, fails;
    double worst;
    char worst_key[DC_PARAM_NAME_MAX];
} group_stat;

static void group_flush(group_stat *g) {
    if (!g->count) return;
    printf("  grad %-16s %3d tensors  worst %.2e (%s)  %s\n", g->name, g->count, g->worst,
           g->worst_key, g->fails ? "FAIL" : "ok");
    memset(g, 0, sizeof *g);
}

// Compares every parameter gradient (flat host copy `grad`) with grad.<key>.
static int check_grads(const dc_st_file *f, const dc_dit *m, const float *grad) {
    const dc_params *ps = &m->params;
    int fails = 0;
    group_stat g = {0};
    char key[DC_PARAM_NAME_MAX + 8], grp[64];
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        snprintf(key, sizeof key, "grad.%s", p->name);
        if (!p->trainable) {  // pos_embed: fixed, so the reference has no gradient either
            if (dc_st_find(f, key)) printf("  FAIL %s: fixed tensor has a golden gradient\n", key), fails++;
            continue;
        }
        group_of(p->name, grp, sizeof grp);
        if (strcmp(grp, g.name)) {
            group_flush(&g);
            snprintf(g.name, sizeof g.name, "%s", grp);
        }
        g.count++;
        float *want = read_f32(f, key, p->numel);
        double e = INFINITY;
        if (!want) printf("  FAIL %s: %s\n", key, dc_error());
        else if (e = nerr(grad + p->offset, want, p->numel), !(e <= TOL_GRAD))
            printf("  FAIL %s: err %.2e > %.0e\n", key, e, TOL_GRAD);
        free(want);
        if (!(e <= TOL_GRAD)) g.fails++, fails++;
        if (!(e <= g.worst)) g.worst = e, snprintf(g.worst_key, sizeof g.worst_key, "%s", p->name);
    }
    group_flush(&g);
    return fails;
}

// Forward on input.{x,t,y}, compared with output.out; then backward with
// dout = R, compared with every grad.<key>. Returns the number of failures.
static int check_model(const dc_st_file *f, dc_dit *m, int B) {
    dc_backend *be = m->be;
    const dc_dit_config *c = &m->cfg;
    int S = c->input_size, C = c->in_channels, OC = dc_dit_out_channels(c);
    int64_t nx = (int64_t)B * C * S * S, nout = (int64_t)B * OC * S * S;
    int fails = 0;
    float *x = read_f32(f, "input.x", nx), *t = read_f32(f, "input.t", B);
    float *want = read_f32(f, "output.out", nout), *R = read_f32(f, "R", nout);
    float *out = malloc((size_t)nout * sizeof *out);
    float *grad = malloc((size_t)m->params.numel * sizeof *grad);
    int64_t y64[64];
    int32_t y32[64];
    const dc_st_tensor *ty = dc_st_find(f, "input.y");
    void *dx = NULL, *dt = NULL, *dy = NULL, *dout = NULL, *dR = NULL;
    if (!x || !t || !want || !R || !out || !grad || !ty || ty->numel != B || B > 64 ||
        dc_st_read_i64(f, ty, y64)) {
        printf("  FAIL reading inputs: %s\n", ty ? dc_error() : "no tensor input.y");
        fails++;
        goto done;
    }
    for (int b = 0; b < B; b++) y32[b] = (int32_t)y64[b];
    dx = dev_copy(be, x, (size_t)nx * 4);
    dt = dev_copy(be, t, (size_t)B * 4);
    dy = dev_copy(be, y32, (size_t)B * 4);
    dR = dev_copy(be, R, (size_t)nout * 4);
    dout = be->alloc(be, (size_t)nout * 4);
    if (!dx || !dt || !dy || !dR || !dout) {
        printf("  FAIL allocating buffers: %s\n", dc_error());
        fails++;
        goto done;
    }

    if (dc_dit_forward(m, (dc_buf){dout, DC_F32}, (dc_buf){dx, DC_F32}, (dc_buf){dt, DC_F32},
                       (dc_buf){dy, DC_I32}, B)) {
        printf("  FAIL forward: %s\n", dc_error());
        fails++;
        goto done;
    }
    be->download(be, out, dout, (size_t)nout * 4);
    double e = nerr(out, want, nout);
    int bad = !(e <= TOL_OUT);
    printf("  forward  output.out [%d,%d,%d,%d]  err %.2e (tol %.0e)  %s\n", B, OC, S, S, e,
           TOL_OUT, bad ? "FAIL" : "ok");
    fails += bad;

    be->zero(be, m->params.grad.p, (size_t)m->params.numel * sizeof(float));
    if (dc_dit_backward(m, (dc_buf){dR, DC_F32}, B)) {
        printf("  FAIL backward: %s\n", dc_error());
        fails++;
        goto done;
    }
    be->download(be, grad, m->params.grad.p, (size_t)m->params.numel * sizeof(float));
    fails += check_grads(f, m, grad);

done:
    if (dx) be->free(be, dx);
    if (dt) be->free(be, dt);
    if (dy) be->free(be, dy);
    if (dR) be->free(be, dR);
    if (dout) be->free(be, dout);
    free(x), free(t), free(want), free(R), free(out), free(grad);
    return fails;
}

// max_i |a_i - b_i| / |b_i|, for a few per-sample scalars (never zero here).
static double rel_err(const float *a, const float *b, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), 1e-30);
        if (d > e) e = d;
    }
    return e;
}

static int report(const char *what, double e, double tol) {
    int bad = !(e <= tol);
    printf("  loss     %-28s err %.2e (tol %.0e)  %s\n", what, e, tol, bad ? "FAIL" : "ok");
    return bad;
}

// The training-loss batch: x_t = q_sample(x0, t, eps) against loss.xt, then
// dc_diffusion_loss(loss.out, loss.x0, loss.xt, loss.eps) against the
// per-sample loss.mse, loss.vb and loss.dout = d(mean_b loss_b)/d out.
static int check_loss(const dc_st_file *f, dc_backend *be, int C, int S) {
    const dc_st_tensor *tt = dc_st_find(f, "loss.t");
    if (!tt || tt->numel < 1 || tt->numel > 64) return printf("  FAIL loss: no tensor loss.t\n"), 1;
    int B = (int)tt->numel;
    int64_t HW = (int64_t)S * S, n = (int64_t)B * C * HW;
    int fails = 0;
    dc_schedule sch;
    memset(&sch, 0, sizeof sch);
    dc_loss_coef coef[64];
    float tf[64], a[64], sd[64], losses[128], mse[64], vb[64];
    float *x0 = read_f32(f, "loss.x0", n), *eps = read_f32(f, "loss.eps", n);
    float *xt = read_f32(f, "loss.xt", n), *out = read_f32(f, "loss.out", 2 * n);
    float *want_mse = read_f32(f, "loss.mse", B), *want_vb = read_f32(f, "loss.vb", B);
    float *want_dout = read_f32(f, "loss.dout", 2 * n);
    float *host = malloc((size_t)(2 * n) * sizeof *host);
    void *dx0 = NULL, *deps = NULL, *dxt = NULL, *dout_m = NULL, *dq = NULL, *dg = NULL, *dl = NULL;
    if (!x0 || !eps || !xt || !out || !want_mse || !want_vb || !want_dout || !host ||
        dc_st_read_f32(f, tt, tf) || dc_schedule_init_gaussian(&sch, DC_DIFFUSION_STEPS, DC_DIFFUSION_STEPS)) {
        printf("  FAIL loss: %s\n", dc_error());
        fails++;
        goto done;
    }
    for (int b = 0; b < B; b++) {
        if (dc_schedule_loss_coef(&sch, (int)tf[b], &coef[b])) {
            printf("  FAIL loss: %s\n", dc_error());
            fails++;
            goto done;
        }
        a[b] = coef[b].sqrt_abar, sd[b] = coef[b].sqrt_1m_abar;
    }
    dx0 = dev_copy(be, x0, (size_t)n * 4);
    deps = dev_copy(be, eps, (size_t)n * 4);
    dxt = dev_copy(be, xt, (size_t)n * 4);
    dout_m = dev_copy(be, out, (size_t)(2 * n) * 4);
    dq = be->alloc(be, (size_t)n * 4);
    dg = be->alloc(be, (size_t)(2 * n) * 4);
    dl = be->alloc(be, (size_t)(2 * B) * 4);
    if (!dx0 || !deps || !dxt || !dout_m || !dq || !dg || !dl) {
        printf("  FAIL loss: allocating buffers: %s\n", dc_error());
        fails++;
        goto done;
    }

    be->q_sample(be, (dc_buf){dq, DC_F32}, (dc_buf){dx0, DC_F32}, (dc_buf){deps, DC_F32}, a, sd, B,
                 (int64_t)C * HW);
    be->download(be, host, dq, (size_t)n * 4);
    fails += report("q_sample loss.xt", nerr(host, xt, n), TOL_XT);

    double mse_sum = 0, vb_sum = 0;
    if (dc_diffusion_loss(be, (dc_buf){dg, DC_F32}, (dc_buf){dl, DC_F32}, (dc_buf){dout_m, DC_F32},
                          (dc_buf){dx0, DC_F32}, (dc_buf){dxt, DC_F32}, (dc_buf){deps, DC_F32},
                          coef, B, C, 2 * C, HW, 1.0f / (float)B, &mse_sum, &vb_sum)) {
        printf("  FAIL loss: %s\n", dc_error());
        fails++;
        goto done;
    }
    be->download(be, losses, dl, (size_t)(2 * B) * 4);
    for (int b = 0; b < B; b++) mse[b] = losses[2 * b], vb[b] = losses[2 * b + 1];
    fails += report("loss.mse (per sample)", rel_err(mse, want_mse, B), TOL_LOSS);
    fails += report("loss.vb (per sample)", rel_err(vb, want_vb, B), TOL_LOSS);
    double ws = 0;
    for (int b = 0; b < B; b++) ws += (double)want_mse[b] + want_vb[b];
    fails += report("mse + vb sums", fabs(mse_sum + vb_sum - ws) / ws, TOL_LOSS);

    // loss.dout [B, 2C, HW]: gather each half over the batch, then compare.
    be->download(be, host, dg, (size_t)(2 * n) * 4);
    float *got_h = malloc((size_t)n * sizeof *got_h), *want_h = malloc((size_t)n * sizeof *want_h);
    if (!got_h || !want_h) {
        printf("  FAIL loss: out of memory\n");
        fails++;
    } else {
        for (int half = 0; half < 2; half++) {
            for (int b = 0; b < B; b++) {
                size_t src = ((size_t)b * 2 + half) * C * HW, dst = (size_t)b * C * HW;
                memcpy(got_h + dst, host + src, (size_t)C * HW * sizeof(float));
                memcpy(want_h + dst, want_dout + src, (size_t)C * HW * sizeof(float));
            }
            fails += report(half ? "loss.dout (v half)" : "loss.dout (eps half)",
                            nerr(got_h, want_h, n), TOL_DOUT);
        }
    }
    free(got_h);
    free(want_h);

done:
    if (dx0) be->free(be, dx0);
    if (deps) be->free(be, deps);
    if (dxt) be->free(be, dxt);
    if (dout_m) be->free(be, dout_m);
    if (dq) be->free(be, dq);
    if (dg) be->free(be, dg);
    if (dl) be->free(be, dl);
    dc_schedule_free(&sch);
    free(x0), free(eps), free(xt), free(out), free(want_mse), free(want_vb), free(want_dout);
    free(host);
    return fails;
}

static int check_file(const char *path) {
    printf("%s\n", path);
    dc_st_file f;
    memset(&f, 0, sizeof f);
    if (dc_st_open(&f, path)) {
        printf("  FAIL %s\n", dc_error());
        return 1;
    }
    int fails = 0, created = 0;
    dc_backend *be = NULL;
    dc_dit m;
    dc_dit_config cfg;
    const dc_st_tensor *tx = dc_st_find(&f, "input.x");
    if (config_from_meta(&f, &cfg) || !tx || tx->ndim != 4) {
        printf("  FAIL %s\n", tx ? dc_error() : "no 4-D tensor input.x");
        fails++;
        goto done;
    }
    int B = (int)tx->shape[0];
    printf("  config   input %d patch %d channels %d hidden %d depth %d heads %d mlp %d "
           "classes %d learn_sigma %d, batch %d\n", cfg.input_size, cfg.patch, cfg.in_channels,
           cfg.hidden, cfg.depth, cfg.heads, cfg.mlp_hidden, cfg.num_classes, cfg.learn_sigma, B);
    if (dc_backend_create("cpu", &be) || dc_dit_create(&m, &cfg, be, true)) {
        printf("  FAIL creating the model: %s\n", dc_error());
        fails++;
        goto done;
    }
    created = 1;
    if (dc_dit_reserve(&m, B)) {
        printf("  FAIL reserving activations: %s\n", dc_error());
        fails++;
        goto done;
    }
    fails += check_pos_embed(&f, &m);
    fails += load_weights(&f, &m);
    if (!fails) fails += check_model(&f, &m, B);
    if (dc_st_find(&f, "loss.x0")) {
        if (!cfg.learn_sigma) printf("  FAIL loss.* present for a model without learned sigma\n"), fails++;
        else fails += check_loss(&f, be, cfg.in_channels, cfg.input_size);
    } else if (cfg.learn_sigma) {
        printf("  FAIL no loss.* batch in a learned-sigma file\n");
        fails++;
    }
done:
    if (created) dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    dc_st_close(&f);
    return fails;
}

int main(int argc, char **argv) {
    int nfiles = argc > 1 ? argc - 1 : (int)(sizeof default_files / sizeof *default_files);
    int fails = 0;
    for (int i = 0; i < nfiles; i++)
        fails += check_file(argc > 1 ? argv[1 + i] : default_files[i]);
    printf("test_golden: %s (%d failure%s)\n", fails ? "FAIL" : "ok", fails, fails == 1 ? "" : "s");
    return fails ? 1 : 0;
}
