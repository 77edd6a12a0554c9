#include "models/model_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/registry.h"
#include "nn/params_io.h"

void dc_model_free(dc_model *m) {
    if (!m || !m->ops) return;
    bool owned = m->owned;
    m->ops->release(m);
    if (owned) free(m);
}

void dc_model_describe(const dc_model *m, char *buf, size_t n) {
    if (m->ops->describe) m->ops->describe(m, buf, n);
    else snprintf(buf, n, "%s", m->ops->name);
}

int dc_model_set_selective(dc_model *m, bool on) {
    if (!m->ops->set_selective) {
        if (!on) return 0;
        return dc_fail("a %s has no selective recompute (--selective-recompute)", m->ops->name);
    }
    return m->ops->set_selective(m, on);
}

int dc_model_set_recompute(dc_model *m, int keep) {
    if (!m->ops->set_recompute) return dc_fail("a %s has no activation checkpointing (--recompute)", m->ops->name);
    return m->ops->set_recompute(m, keep);
}

int dc_model_set_size(dc_model *m, int height, int width) {
    if (height == m->info.height && width == m->info.width) return 0;
    if (!m->ops->set_size)
        return dc_fail("a %s trains at one size (%dx%d), not %dx%d", m->ops->name, m->info.height, m->info.width,
                       height, width);
    return m->ops->set_size(m, height, width);
}

int64_t dc_model_activation_bytes(const dc_model *m, dc_dtype compute, int max_batch, int keep, bool selective) {
    if (!m->ops->activation_bytes) return dc_fail("a %s does not train: no activations to plan", m->ops->name);
    if (selective && !m->ops->set_selective)
        return dc_fail("a %s has no selective recompute", m->ops->name);
    return m->ops->activation_bytes(m, compute, max_batch, keep, selective);
}

int64_t dc_model_frozen_bytes(const dc_model *m, dc_dtype compute) {
    return m->ops->frozen_bytes ? m->ops->frozen_bytes(m, compute) : 0;
}

int dc_model_load(const dc_st_file *f, const char *prefix, int heads, dc_backend *be, bool with_grad,
                  dc_model **out) {
    *out = NULL;
    dc_kv cfg = {0};
    dc_model *m;
    int rc = dc_model_config_of_file(f, "", heads, &cfg) || dc_model_create(&cfg, be, with_grad, &m);
    dc_kv_free(&cfg);
    DC_TRY(rc);
    if (dc_model_load_weights(m, f, prefix)) return dc_model_free(m), -1;
    *out = m;
    return 0;
}

int dc_model_load_weights(dc_model *m, const dc_st_file *f, const char *prefix) {
    DC_TRY(dc_params_load(m->params, m->params->data, f, prefix));
    dc_params_touch(m->params);
    return 0;
}
