#include "nn/modules.h"

#include <stdio.h>

#include "core/error.h"

// "<name>.<leaf>", refusing a name the parameter table cannot hold.
static int key(char *out, const char *name, const char *leaf) {
    int n = snprintf(out, DC_PARAM_NAME_MAX, "%s.%s", name, leaf);
    if (n < 0 || n >= DC_PARAM_NAME_MAX) return dc_fail("parameter name '%s.%s' is too long", name, leaf);
    return 0;
}

// The layer's backward writes these parameters' gradients through ops that
// can overwrite them (dc_param.grad_sets; b < 0: no bias).
static void grads_written(dc_params *ps, int w, int b) {
    ps->items[w].grad_sets = true;
    if (b >= 0) ps->items[b].grad_sets = true;
}

int dc_linear_add(dc_params *ps, dc_linear *l, const char *name, int in, int out) {
    char k[DC_PARAM_NAME_MAX];
    *l = (dc_linear){-1, -1, in, out};
    if (key(k, name, "weight") || (l->w = dc_params_add(ps, k, true, 2, out, in)) < 0) return -1;
    if (key(k, name, "bias") || (l->b = dc_params_add(ps, k, true, 1, out)) < 0) return -1;
    grads_written(ps, l->w, l->b);
    return 0;
}

int dc_linear_add_nobias(dc_params *ps, dc_linear *l, const char *name, int in, int out) {
    char k[DC_PARAM_NAME_MAX];
    *l = (dc_linear){-1, -1, in, out};
    if (key(k, name, "weight") || (l->w = dc_params_add(ps, k, true, 2, out, in)) < 0) return -1;
    grads_written(ps, l->w, -1);
    return 0;
}

int dc_conv2d_add(dc_params *ps, dc_conv2d *c, const char *name, int ci, int co, int k, int stride, int pad) {
    char n[DC_PARAM_NAME_MAX];
    *c = (dc_conv2d){-1, -1, ci, co, k, stride, pad, false};
    if (key(n, name, "weight") || (c->w = dc_params_add(ps, n, true, 4, co, ci, k, k)) < 0) return -1;
    if (key(n, name, "bias") || (c->b = dc_params_add(ps, n, true, 1, co)) < 0) return -1;
    grads_written(ps, c->w, c->b);
    return 0;
}

int dc_conv2d_add_nhwc(dc_params *ps, dc_conv2d *c, const char *name, int ci, int co, int k, int stride, int pad) {
    DC_TRY(dc_conv2d_add(ps, c, name, ci, co, k, stride, pad));
    c->nhwc = true;
    ps->items[c->w].channels_last = true;
    return 0;
}

int dc_group_norm_add(dc_params *ps, dc_group_norm *g, const char *name, int C, int groups, float eps) {
    char n[DC_PARAM_NAME_MAX];
    if (groups < 1 || C % groups) return dc_fail("%s: %d channels do not split into %d groups", name, C, groups);
    *g = (dc_group_norm){-1, -1, C, groups, eps};
    if (key(n, name, "weight") || (g->w = dc_params_add(ps, n, true, 1, C)) < 0) return -1;
    if (key(n, name, "bias") || (g->b = dc_params_add(ps, n, true, 1, C)) < 0) return -1;
    grads_written(ps, g->w, g->b);
    return 0;
}

int dc_layer_norm_add(dc_params *ps, dc_layer_norm *l, const char *name, int D, float eps) {
    char n[DC_PARAM_NAME_MAX];
    *l = (dc_layer_norm){-1, -1, D, eps};
    if (key(n, name, "weight") || (l->w = dc_params_add(ps, n, true, 1, D)) < 0) return -1;
    if (key(n, name, "bias") || (l->b = dc_params_add(ps, n, true, 1, D)) < 0) return -1;
    grads_written(ps, l->w, l->b);
    return 0;
}

int dc_linear_add_patch_conv(dc_params *ps, dc_linear *l, const char *name, int C, int p, int out) {
    char k[DC_PARAM_NAME_MAX];
    *l = (dc_linear){-1, -1, C * p * p, out};
    if (key(k, name, "weight") || (l->w = dc_params_add(ps, k, true, 4, out, C, p, p)) < 0) return -1;
    if (key(k, name, "bias") || (l->b = dc_params_add(ps, k, true, 1, out)) < 0) return -1;
    grads_written(ps, l->w, l->b);
    return 0;
}

int dc_embedding_add(dc_params *ps, dc_embedding *e, const char *name, int rows, int dim) {
    char k[DC_PARAM_NAME_MAX];
    *e = (dc_embedding){-1, rows, dim};
    if (key(k, name, "weight") || (e->table = dc_params_add(ps, k, true, 2, rows, dim)) < 0) return -1;
    return 0;
}
