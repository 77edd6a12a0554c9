// Activation checkpointing in the DiT: the gradients with every block
// recomputed, with some recomputed, and with none, are bit-identical (the
// recomputed forward runs the same ops on the same inputs), the outputs too,
// and the activations take less memory.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/dit.h"

static const dc_dit_config k_model = {.input_size = 8, .patch = 2, .in_channels = 2, .hidden = 24, .depth = 4,
                                      .heads = 3, .mlp_hidden = 48, .num_classes = 3, .learn_sigma = true};
enum { B = 3 };

// One forward and backward with `keep` blocks keeping their activations:
// the output and the gradients (host arrays the caller frees).
static int run(int keep, float **out, float **grad, int64_t *nout, int64_t *ngrad) {
    dc_backend *be = NULL;
    dc_dit m;
    memset(&m, 0, sizeof m);
    const int S = k_model.input_size, C = k_model.in_channels, OC = 2 * C;
    const int64_t nx = (int64_t)B * C * S * S;
    *nout = (int64_t)B * OC * S * S;
    int rc = dc_backend_create("cpu", &be);
    if (!rc) rc = dc_dit_create(&m, &k_model, be, true);
    if (!rc) rc = dc_dit_init_weights(&m, 11);
    // the adaLN and final layers start at zero (the official init): give every weight a value
    float *w = rc ? NULL : malloc(sizeof(float) * (size_t)m.params.numel);
    for (int64_t i = 0; w && i < m.params.numel; i++) w[i] = 0.05f * dc_randn_at(7, 0, 0, 0, (uint64_t)i);
    if (w) be->upload(be, m.params.data.p, w, sizeof(float) * (size_t)m.params.numel), dc_params_touch(&m.params);
    free(w);
    if (!rc && keep != -2) rc = dc_dit_set_recompute(&m, keep);
    if (!rc) rc = dc_dit_reserve(&m, B);
    float *hx = malloc(sizeof(float) * (size_t)nx), ht[B] = {10, 500, 999};
    int32_t hy[B] = {0, 2, 3};
    for (int64_t i = 0; i < nx; i++) hx[i] = dc_randn_at(3, 0, 0, 0, (uint64_t)i);
    dc_buf x = {0}, t = {0}, y = {0}, o = {0}, d = {0};
    if (!rc) rc = dc_buf_alloc(be, &x, DC_F32, (size_t)nx, "x") || dc_buf_alloc(be, &t, DC_F32, B, "t") ||
                  dc_buf_alloc(be, &y, DC_I32, B, "y") || dc_buf_alloc(be, &o, DC_F32, (size_t)*nout, "out") ||
                  dc_buf_alloc(be, &d, DC_F32, (size_t)*nout, "dout");
    if (!rc) {
        be->upload(be, x.p, hx, sizeof(float) * (size_t)nx);
        be->upload(be, t.p, ht, sizeof ht);
        be->upload(be, y.p, hy, sizeof hy);
        rc = dc_dit_forward(&m, o, x, t, y, B);
    }
    *out = malloc(sizeof(float) * (size_t)*nout);
    if (!rc) {
        be->download(be, *out, o.p, sizeof(float) * (size_t)*nout);
        float *hd = malloc(sizeof(float) * (size_t)*nout);
        for (int64_t i = 0; i < *nout; i++) hd[i] = dc_randn_at(5, 0, 0, 0, (uint64_t)i);
        be->upload(be, d.p, hd, sizeof(float) * (size_t)*nout);
        free(hd);
        rc = dc_dit_backward(&m, d, B);
    }
    *ngrad = m.params.numel;
    *grad = malloc(sizeof(float) * (size_t)*ngrad);
    if (!rc) be->download(be, *grad, m.params.grad.p, sizeof(float) * (size_t)*ngrad);
    free(hx);
    dc_buf all[] = {x, t, y, o, d};
    for (int i = 0; i < 5; i++)
        if (all[i].p) be->free(be, all[i].p);
    dc_dit_free(&m);
    if (be) dc_backend_destroy(be);
    return rc;
}

int main(void) {
    float *o0, *g0;
    int64_t no, ng;
    CHECK(run(-2, &o0, &g0, &no, &ng) == 0, "no recompute: %s", dc_error());
    double norm = 0;
    for (int64_t i = 0; i < ng; i++) norm += (double)g0[i] * g0[i];
    CHECK(norm > 0, "the gradients are not all zero");
    const int keeps[] = {0, 1, 3, 4, -1};
    for (size_t k = 0; k < sizeof keeps / sizeof *keeps; k++) {
        float *o, *g;
        int rc = run(keeps[k], &o, &g, &no, &ng);
        CHECK(rc == 0, "keep %d: %s", keeps[k], dc_error());
        CHECK(rc == 0 && memcmp(o, o0, sizeof(float) * (size_t)no) == 0, "keep %d: the output differs", keeps[k]);
        CHECK(rc == 0 && memcmp(g, g0, sizeof(float) * (size_t)ng) == 0,
              "keep %d: the gradients differ from no recompute", keeps[k]);
        free(o), free(g);
    }
    free(o0), free(g0);
    printf("test_recompute: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
