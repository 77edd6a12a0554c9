#include "models/model_io.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/dit.h"
#include "models/dit_io.h"
#include "nn/params_io.h"

void dc_model_free(dc_model *m) {
    if (!m || !m->ops) return;
    bool owned = m->owned;
    m->ops->release(m);
    if (owned) free(m);
}

const char *dc_model_kind_of_file(const dc_st_file *f) {
    const char *kind = dc_st_meta(f, "model");
    if (!kind) return "DiT";  // official state dicts carry no metadata; the DiT reader checks the keys
    if (strcmp(kind, "DiT") == 0) return kind;
    dc_fail("%s: metadata names the model '%s', which this engine does not build (it builds: DiT)", f->path,
            kind);
    return NULL;
}

int dc_model_load(const dc_st_file *f, const char *prefix, int heads, dc_backend *be, bool with_grad,
                  dc_model **out) {
    *out = NULL;
    if (!dc_model_kind_of_file(f)) return -1;
    dc_dit_config c;
    dc_model *m;
    DC_TRY(dc_dit_config_from_file(f, "", heads, &c));
    DC_TRY(dc_dit_new(&c, be, with_grad, &m));
    if (dc_model_load_weights(m, f, prefix)) return dc_model_free(m), -1;
    *out = m;
    return 0;
}

int dc_model_load_weights(dc_model *m, const dc_st_file *f, const char *prefix) {
    DC_TRY(dc_params_load(m->params, m->params->data, f, prefix));
    dc_params_touch(m->params);
    return 0;
}
