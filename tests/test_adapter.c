// Frozen, trainable and adapted weights on the CPU (nn/params.h, nn/adapter.h):
//  - a LoRA (rank 4, nonzero down and up) on a linear layer and on 3x3
//    convolutions (NCHW and channels-last, strides 1 and 2), on trainable F32
//    and frozen F16 base weights: applied at run time, the layer's output,
//    dx, the base weight's gradient and the factors' gradients equal the
//    double-precision reference's (central differences of sum(g * y));
//    merged, the output and dx equal the run-time ones and the LoRA is not
//    applied twice; unmerged, the weight is back;
//  - an MLP, fc2(gelu(fc1(x))) added onto a residual, both layers adapted:
//    the run-time LoRA (the fused ops run apart) against the merged weights
//    (the fused ops), and the factors' gradients against their closed form
//    from the base weight's gradient (dup = s dW down^T, ddown = s up^T dW);
//  - a set mixing frozen (F16), trainable and fixed parameters: its layout,
//    units and bytes; the frozen weight takes no gradient while dx flows
//    through it (against the double reference), and the optimizer's passes
//    update every trainable value and no frozen or fixed one.
#include "check.h"
#include "lora_case.h"

static dc_backend *g_be;

static bool same_bits(dc_backend *be, dc_buf b, const void *h, size_t bytes) {
    void *t = malloc(bytes);
    be->download(be, t, b.p, bytes);
    bool same = memcmp(t, h, bytes) == 0;
    free(t);
    return same;
}

static void test_layer(const lcase *c, uint64_t seed) {
    lrun r;
    if (lrun_make(&r, g_be, c, seed)) {
        CHECK(0, "%s: setting up: %s", c->what, dc_error());
        lrun_free(&r);
        return;
    }
    lref v = {lcase_wide(r.x, r.nx), lcase_wide(r.W, r.nw), lcase_wide(r.down, r.nd), lcase_wide(r.up, r.nu)};
    double *y = malloc((size_t)r.ny * sizeof *y);
    lref_forward(&r, &v, y);
    double *dx = lref_fd(&r, &v, v.x, r.nx), *dw = lref_fd(&r, &v, v.W, r.nw);
    double *dd = lref_fd(&r, &v, v.down, r.nd), *du = lref_fd(&r, &v, v.up, r.nu);
    // fp32 sums of at most a few hundred products of values below 1, against
    // double: well inside 1e-5 of the largest value.
    const double tol = 1e-5;
    const size_t wbytes = (size_t)r.nw * dc_dtype_size(dc_param_data(&r.ps, r.w).dt);
    void *w0 = malloc(wbytes);
    g_be->download(g_be, w0, dc_param_data(&r.ps, r.w).p, wbytes);

    lout rt = {0}, mg = {0};
    dc_lora_attach(&r.lo);
    CHECK(!lrun_run(&r, &rt), "%s: run time: %s", c->what, dc_error());
    if (rt.y) {
        CHECK(lcase_err(rt.y, y, r.ny) < tol, "%s: run time y, error %g", c->what, lcase_err(rt.y, y, r.ny));
        CHECK(lcase_err(rt.dx, dx, r.nx) < tol, "%s: run time dx, error %g", c->what, lcase_err(rt.dx, dx, r.nx));
        CHECK(lcase_err(rt.ddown, dd, r.nd) < tol, "%s: d lora_down, error %g", c->what, lcase_err(rt.ddown, dd, r.nd));
        CHECK(lcase_err(rt.dup, du, r.nu) < tol, "%s: d lora_up, error %g", c->what, lcase_err(rt.dup, du, r.nu));
        if (c->frozen)
            CHECK(!dc_param_train_grad(&r.ps, r.w).p && same_bits(g_be, dc_param_data(&r.ps, r.w), w0, wbytes),
                  "%s: the frozen weight takes no gradient and keeps its bits", c->what);
        else
            CHECK(lcase_err(rt.dw, dw, r.nw) < tol, "%s: run time dW, error %g", c->what, lcase_err(rt.dw, dw, r.nw));
    }

    // Merged (still attached: a merged LoRA is not applied again). F16
    // storage rounds the merged weight once, 2^-11 of each value.
    const double mtol = c->loaded == DC_F16 && c->frozen ? 4e-3 : tol;
    CHECK(!dc_lora_merge(&r.lo), "%s: merge: %s", c->what, dc_error());
    CHECK(!lrun_run(&r, &mg), "%s: merged: %s", c->what, dc_error());
    if (rt.y && mg.y) {
        CHECK(lcase_err_f(mg.y, rt.y, r.ny) < mtol, "%s: merged y against run time, error %g", c->what,
              lcase_err_f(mg.y, rt.y, r.ny));
        CHECK(lcase_err_f(mg.dx, rt.dx, r.nx) < mtol, "%s: merged dx against run time, error %g", c->what,
              lcase_err_f(mg.dx, rt.dx, r.nx));
        if (!c->frozen)
            CHECK(lcase_err_f(mg.dw, rt.dw, r.nw) < tol, "%s: merged dW against run time, error %g", c->what,
                  lcase_err_f(mg.dw, rt.dw, r.nw));
        double zero = 0;
        for (int64_t i = 0; i < r.nd; i++) zero = fmax(zero, fabs(mg.ddown[i]));
        CHECK(zero == 0, "%s: merged, the LoRA is not run (its gradient %g)", c->what, zero);
    }
    CHECK(!dc_lora_unmerge(&r.lo), "%s: unmerge: %s", c->what, dc_error());
    float *wb = lcase_get(g_be, dc_param_data(&r.ps, r.w), r.nw);
    dc_param_from_stored(&r.ps.items[r.w], wb);
    const double utol = c->loaded == DC_F16 && c->frozen ? 2e-3 : 1e-6;  // F16: rounded twice
    CHECK(lcase_err(wb, v.W, r.nw) < utol, "%s: unmerged weight, error %g", c->what, lcase_err(wb, v.W, r.nw));
    CHECK(dc_lora_unmerge(&r.lo) != 0, "%s: a second unmerge is refused", c->what);
    free(wb), free(w0);
    lout_free(&rt), lout_free(&mg);
    free(y), free(dx), free(dw), free(dd), free(du);
    free(v.x), free(v.W), free(v.down), free(v.up);
    lrun_free(&r);
}

static void test_layers(void) {
    const lcase cases[] = {
        {"linear", false, false, false, DC_F32, 7, 9, 6, 1, 1, 1, 1, 0, 4, 3.0f, 0.8f},
        {"linear, frozen F16 base", false, false, true, DC_F16, 5, 8, 10, 1, 1, 1, 1, 0, 4, 4.0f, 1.0f},
        {"conv 3x3 NCHW", true, false, false, DC_F32, 2, 3, 5, 6, 5, 3, 1, 1, 4, 2.0f, 1.0f},
        {"conv 3x3 NCHW stride 2, frozen", true, false, true, DC_F32, 2, 4, 3, 7, 6, 3, 2, 1, 4, 8.0f, 0.5f},
        {"conv 3x3 channels-last", true, true, false, DC_F32, 2, 3, 5, 5, 6, 3, 1, 1, 4, 4.0f, 1.0f},
        {"conv 3x3 channels-last, frozen F16 base", true, true, true, DC_F16, 2, 6, 4, 5, 5, 3, 1, 1, 4, 1.0f, 1.5f},
        {"conv 3x3 channels-last stride 2", true, true, false, DC_F32, 1, 5, 3, 6, 7, 3, 2, 1, 4, 4.0f, 1.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_layer(&cases[i], 1000 + i);
}

// What one pass of the MLP gives: y, dx, and per layer dW, d lora_down, d lora_up.
typedef struct {
    float *y, *dx, *dw[2], *dd[2], *du[2];
} mlp_out;

static void mlp_pass(dc_params *ps, dc_lora *lo, const dc_linear fc[2], dc_buf *b, const float *res, int M,
                     mlp_out *o) {
    enum { X, PRE, ACT, Y, G, DPRE, SCR, DX };
    const int D = fc[0].in;
    g_be->zero(g_be, ps->grad.p, (size_t)ps->numel * 4);
    g_be->zero(g_be, lo->params.grad.p, (size_t)lo->params.numel * 4);
    lcase_put(g_be, b[Y], res, (int64_t)M * D);
    dc_linear_gelu_fwd(g_be, ps, &fc[0], b[ACT], b[PRE], b[X], M);
    dc_linear_fwd_acc(g_be, ps, &fc[1], b[Y], b[ACT], M);
    dc_linear_bwd_gelu(g_be, ps, &fc[1], b[DPRE], b[G], b[ACT], b[PRE], b[SCR], M);
    dc_linear_bwd(g_be, ps, &fc[0], b[DX], b[DPRE], b[X], M, false);
    o->y = lcase_get(g_be, b[Y], (int64_t)M * D), o->dx = lcase_get(g_be, b[DX], (int64_t)M * D);
    for (int l = 0; l < 2; l++) {
        o->dw[l] = lcase_grad(ps, fc[l].w);
        o->dd[l] = lcase_grad(&lo->params, lo->items[l].down), o->du[l] = lcase_grad(&lo->params, lo->items[l].up);
    }
}

static void test_mlp(void) {
    enum { M = 6, D = 8, F = 12, R = 4 };
    dc_params ps = {0};
    dc_linear fc[2];
    dc_lora lo;
    int rc = dc_linear_add(&ps, &fc[0], "fc1", D, F) || dc_linear_add(&ps, &fc[1], "fc2", F, D) ||
             dc_params_alloc(&ps, g_be, true);
    dc_lora_init(&lo, &ps);
    rc = rc || dc_lora_add(&lo, fc[0].w, "fc1", R, 2.0f) || dc_lora_add(&lo, fc[1].w, "fc2", R, 6.0f) ||
         dc_lora_alloc(&lo, g_be, true) || dc_lora_reserve(&lo, M);
    if (rc) {
        CHECK(0, "MLP: %s", dc_error());
        dc_lora_free(&lo), dc_params_free(&ps);
        return;
    }
    uint64_t seed = 4242;
    float *vals[8];
    const int nvals[8] = {F * D, F, D * F, D, R * D, F * R, R * F, D * R};  // fc1 w b, fc2 w b, lora fc1 down up, fc2
    for (int i = 0; i < 8; i++) vals[i] = lcase_fill(&seed, nvals[i], 0.5f, false);
    lcase_set_param(&ps, fc[0].w, vals[0]), lcase_set_param(&ps, fc[0].b, vals[1]);
    lcase_set_param(&ps, fc[1].w, vals[2]), lcase_set_param(&ps, fc[1].b, vals[3]);
    for (int l = 0; l < 2; l++) {
        lcase_set_param(&lo.params, lo.items[l].down, vals[4 + 2 * l]);
        lcase_set_param(&lo.params, lo.items[l].up, vals[5 + 2 * l]);
    }
    dc_params_touch(&ps), dc_params_refresh(&ps);
    const int64_t sizes[8] = {M * D, M * F, M * F, M * D, M * D, M * F, M * F, M * D};
    dc_buf b[8];
    for (int i = 0; i < 8; i++) b[i] = lcase_dev(g_be, sizes[i], DC_F32);
    float *x = lcase_fill(&seed, M * D, 1.0f, false), *g = lcase_fill(&seed, M * D, 1.0f, false);
    float *res = lcase_fill(&seed, M * D, 1.0f, false);
    lcase_put(g_be, b[0], x, M * D), lcase_put(g_be, b[4], g, M * D);

    mlp_out rt, mg;
    dc_lora_attach(&lo);
    mlp_pass(&ps, &lo, fc, b, res, M, &rt);
    CHECK(!dc_lora_merge(&lo), "MLP merge: %s", dc_error());
    mlp_pass(&ps, &lo, fc, b, res, M, &mg);
    const double tol = 1e-5;
    CHECK(!dc_backend_status(g_be) && lcase_err_f(rt.y, mg.y, M * D) < tol && lcase_err_f(rt.dx, mg.dx, M * D) < tol,
          "MLP: run time against merged: y error %g, dx error %g", lcase_err_f(rt.y, mg.y, M * D),
          lcase_err_f(rt.dx, mg.dx, M * D));
    for (int l = 0; l < 2; l++) {
        const int in = fc[l].in, out = fc[l].out;
        const double sc = lo.items[l].alpha / R;
        const float *dn = vals[4 + 2 * l], *up = vals[5 + 2 * l], *dw = mg.dw[l];
        double *rd = calloc((size_t)R * in, sizeof *rd), *ru = calloc((size_t)out * R, sizeof *ru);
        for (int o = 0; o < out; o++)
            for (int i = 0; i < in; i++)
                for (int j = 0; j < R; j++) {
                    rd[j * in + i] += sc * up[o * R + j] * dw[o * in + i];  // s up^T dW
                    ru[o * R + j] += sc * dw[o * in + i] * dn[j * in + i];  // s dW down^T
                }
        CHECK(lcase_err_f(rt.dw[l], mg.dw[l], out * in) < tol && lcase_err(rt.dd[l], rd, R * in) < tol &&
                  lcase_err(rt.du[l], ru, out * R) < tol,
              "MLP fc%d: dW error %g, d lora_down error %g, d lora_up error %g", l + 1,
              lcase_err_f(rt.dw[l], mg.dw[l], out * in), lcase_err(rt.dd[l], rd, R * in),
              lcase_err(rt.du[l], ru, out * R));
        free(rd), free(ru);
    }
    dc_lora_unmerge(&lo);
    bool ran = dc_linear_geglu_fwd(g_be, &ps, &fc[0], b[1], dc_buf_none(), b[0], M);
    CHECK(!ran, "an adapted GEGLU projection does not run the fused product without scratch");
    mlp_out *outs[2] = {&rt, &mg};
    for (int k = 0; k < 2; k++) {
        free(outs[k]->y), free(outs[k]->dx);
        for (int l = 0; l < 2; l++) free(outs[k]->dw[l]), free(outs[k]->dd[l]), free(outs[k]->du[l]);
    }
    for (int i = 0; i < 8; i++) free(vals[i]), g_be->free(g_be, b[i].p);
    free(x), free(g), free(res);
    dc_lora_free(&lo), dc_params_free(&ps);
}

// a (frozen weight) -> b, with a fixed tensor between them in registration order.
static void test_mixed(void) {
    enum { M = 3, IN = 6, HID = 5, OUT = 4 };
    dc_params ps = {0};
    dc_linear a, b;
    int pos = -1;
    int rc = dc_linear_add(&ps, &a, "a", IN, HID) || dc_params_end_unit(&ps) ||
             (pos = dc_params_add(&ps, "pos", false, 1, HID)) < 0 || dc_linear_add(&ps, &b, "b", HID, OUT) ||
             dc_params_end_unit(&ps) || dc_params_freeze(&ps, a.w) || dc_params_alloc_loaded(&ps, g_be, true, DC_F16);
    if (rc) {
        CHECK(0, "mixed set: %s", dc_error());
        dc_params_free(&ps);
        return;
    }
    // flat: a.bias [0, 5), pos [5, 10), b.weight [10, 30), b.bias [30, 34); frozen: a.weight, F16
    int64_t lo0, hi0, lo1, hi1;
    dc_params_unit_range(&ps, 0, &lo0, &hi0), dc_params_unit_range(&ps, 1, &lo1, &hi1);
    CHECK(ps.numel == 34 && ps.frozen_numel == IN * HID && ps.frozen.dt == DC_F16 && ps.items[a.b].offset == 0 &&
              ps.items[pos].offset == 5 && ps.items[b.w].offset == 10 && dc_params_unit_count(&ps) == 2 &&
              lo0 == 0 && hi0 == 5 && lo1 == 5 && hi1 == 34,
          "mixed set layout: flat %lld, frozen %lld (%s), units [%lld, %lld) [%lld, %lld)", (long long)ps.numel,
          (long long)ps.frozen_numel, dc_dtype_name(ps.frozen.dt), (long long)lo0, (long long)hi0, (long long)lo1,
          (long long)hi1);
    CHECK(dc_params_bytes(&ps) == 34 * 8 + IN * HID * 2, "mixed set bytes %zu", dc_params_bytes(&ps));
    CHECK(dc_params_freeze(&ps, b.w) != 0, "freezing an allocated set is refused");

    uint64_t seed = 77;
    float *aw = lcase_fill(&seed, IN * HID, 0.5f, true), *ab = lcase_fill(&seed, HID, 0.5f, false);
    float *pv = lcase_fill(&seed, HID, 1.0f, false), *bw = lcase_fill(&seed, HID * OUT, 0.5f, false);
    float *bb = lcase_fill(&seed, OUT, 0.5f, false), *x = lcase_fill(&seed, M * IN, 1.0f, false);
    float *g = lcase_fill(&seed, M * OUT, 1.0f, false);
    lcase_set_param(&ps, a.w, aw), lcase_set_param(&ps, a.b, ab), lcase_set_param(&ps, pos, pv);
    lcase_set_param(&ps, b.w, bw), lcase_set_param(&ps, b.b, bb);
    dc_buf xd = lcase_dev(g_be, M * IN, DC_F32), hd = lcase_dev(g_be, M * HID, DC_F32);
    dc_buf yd = lcase_dev(g_be, M * OUT, DC_F32), gd = lcase_dev(g_be, M * OUT, DC_F32);
    dc_buf dhd = lcase_dev(g_be, M * HID, DC_F32), dxd = lcase_dev(g_be, M * IN, DC_F32);
    lcase_put(g_be, xd, x, M * IN), lcase_put(g_be, gd, g, M * OUT);
    dc_linear_fwd(g_be, &ps, &a, hd, xd, M);
    dc_linear_fwd(g_be, &ps, &b, yd, hd, M);
    dc_linear_bwd(g_be, &ps, &b, dhd, gd, hd, M, false);
    dc_linear_bwd(g_be, &ps, &a, dxd, dhd, xd, M, false);
    float *dx = lcase_get(g_be, dxd, M * IN), *gab = lcase_grad(&ps, a.b), *gbw = lcase_grad(&ps, b.w);
    // the reference: h = x A^T + a_b, dh = g B, dx = dh A, d a_b = sum dh, dB = g^T h
    double h[M * HID], dh[M * HID], rdx[M * IN], rab[HID] = {0}, rbw[OUT * HID] = {0};
    for (int m = 0; m < M; m++)
        for (int j = 0; j < HID; j++) {
            double s = ab[j], d = 0;
            for (int i = 0; i < IN; i++) s += (double)x[m * IN + i] * aw[j * IN + i];
            for (int o = 0; o < OUT; o++) d += (double)g[m * OUT + o] * bw[o * HID + j];
            h[m * HID + j] = s, dh[m * HID + j] = d, rab[j] += d;
        }
    for (int m = 0; m < M; m++) {
        for (int i = 0; i < IN; i++) {
            double s = 0;
            for (int j = 0; j < HID; j++) s += dh[m * HID + j] * aw[j * IN + i];
            rdx[m * IN + i] = s;
        }
        for (int o = 0; o < OUT; o++)
            for (int j = 0; j < HID; j++) rbw[o * HID + j] += g[m * OUT + o] * h[m * HID + j];
    }
    CHECK(!dc_backend_status(g_be) && !dc_param_train_grad(&ps, a.w).p, "mixed set: the frozen weight has no gradient");
    CHECK(lcase_err(dx, rdx, M * IN) < 1e-5, "mixed set: dx through the frozen layer, error %g",
          lcase_err(dx, rdx, M * IN));
    CHECK(lcase_err(gab, rab, HID) < 1e-5 && lcase_err(gbw, rbw, OUT * HID) < 1e-5,
          "mixed set: the trainable gradients, errors %g %g", lcase_err(gab, rab, HID), lcase_err(gbw, rbw, OUT * HID));

    // The optimizer's passes: runs of trainable values, AdamW on each.
    uint16_t fz[IN * HID];
    g_be->download(g_be, fz, ps.frozen.p, sizeof fz);
    float *before = lcase_get(g_be, ps.data, ps.numel);
    dc_buf m = lcase_dev(g_be, ps.numel, DC_F32), vv = lcase_dev(g_be, ps.numel, DC_F32);
    g_be->zero(g_be, m.p, (size_t)ps.numel * 4), g_be->zero(g_be, vv.p, (size_t)ps.numel * 4);
    const dc_adamw_step st = {0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.001f, 1.0f, 0.0f};
    int64_t at = 0, lo, hi, runs = 0;
    while (dc_params_next_run(&ps, &at, ps.numel, &lo, &hi)) {
        g_be->adamw(g_be, dc_buf_at(ps.data, lo), dc_buf_at(ps.grad, lo), dc_buf_at(m, lo), dc_buf_at(vv, lo),
                    dc_buf_none(), dc_buf_none(), dc_buf_none(), hi - lo, &st);
        runs++;
    }
    float *after = lcase_get(g_be, ps.data, ps.numel);
    bool moved = runs == 2, kept = true;
    for (int64_t i = 0; i < ps.numel; i++) {
        const bool fixed = i >= 5 && i < 10;
        if (fixed) kept = kept && after[i] == before[i];
        else moved = moved && after[i] != before[i];
    }
    CHECK(moved && kept && same_bits(g_be, ps.frozen, fz, sizeof fz),
          "the optimizer updates every trainable value (%lld runs) and no fixed or frozen one", (long long)runs);
    dc_buf bufs[] = {xd, hd, yd, gd, dhd, dxd, m, vv};
    for (int i = 0; i < 8; i++) g_be->free(g_be, bufs[i].p);
    free(aw), free(ab), free(pv), free(bw), free(bb), free(x), free(g), free(dx), free(gab), free(gbw);
    free(before), free(after);
    dc_params_free(&ps);
}

int main(void) {
    if (dc_backend_create("cpu", &g_be)) return printf("cpu backend: %s\n", dc_error()), 1;
    test_layers();
    test_mlp();
    test_mixed();
    dc_backend_destroy(g_be);
    printf("test_adapter: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
