#include "nn/modules.h"

#include <stdio.h>

#include "core/error.h"

// "<name>.<leaf>", refusing a name the parameter table cannot hold.
static int key(char *out, const char *name, const char *leaf) {
    int n = snprintf(out, DC_PARAM_NAME_MAX, "%s.%s", name, leaf);
    if (n < 0 || n >= DC_PARAM_NAME_MAX) return dc_fail("parameter name '%s.%s' is too long", name, leaf);
    return 0;
}

int dc_linear_add(dc_params *ps, dc_linear *l, const char *name, int in, int out) {
    char k[DC_PARAM_NAME_MAX];
    *l = (dc_linear){-1, -1, in, out};
    if (key(k, name, "weight") || (l->w = dc_params_add(ps, k, true, 2, out, in)) < 0) return -1;
    if (key(k, name, "bias") || (l->b = dc_params_add(ps, k, true, 1, out)) < 0) return -1;
    return 0;
}

int dc_linear_add_patch_conv(dc_params *ps, dc_linear *l, const char *name, int C, int p, int out) {
    char k[DC_PARAM_NAME_MAX];
    *l = (dc_linear){-1, -1, C * p * p, out};
    if (key(k, name, "weight") || (l->w = dc_params_add(ps, k, true, 4, out, C, p, p)) < 0) return -1;
    if (key(k, name, "bias") || (l->b = dc_params_add(ps, k, true, 1, out)) < 0) return -1;
    return 0;
}

int dc_embedding_add(dc_params *ps, dc_embedding *e, const char *name, int rows, int dim) {
    char k[DC_PARAM_NAME_MAX];
    *e = (dc_embedding){-1, rows, dim};
    if (key(k, name, "weight") || (e->table = dc_params_add(ps, k, true, 2, rows, dim)) < 0) return -1;
    return 0;
}
