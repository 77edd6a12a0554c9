// A parameter's values on the host, in PyTorch's order (a channels-last
// kernel permuted back), as floats: for tests that compare weights.
#pragma once
#include <stdint.h>
#include <stdlib.h>

#include "nn/params.h"

// Parameter `name` of ps (malloc'd; *n its size where n is given), or NULL.
static inline float *param_host(dc_params *ps, const char *name, int64_t *n) {
    const int i = dc_params_find(ps, name);
    if (i < 0) return NULL;
    const dc_param *p = &ps->items[i];
    float *h = malloc((size_t)p->numel * 4);
    if (!h || dc_download_as_f32(ps->be, dc_param_data(ps, i), h, p->numel) || dc_param_from_stored(p, h))
        return free(h), (float *)NULL;
    if (n) *n = p->numel;
    return h;
}
