// Backend registry: picks a backend by name. A CUDA build adds its entries
// ahead of the CPU, so that "auto" prefers the GPU when one is present.
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

#ifdef DC_HAVE_CUDA
static dc_backend *cuda_bf16(const dc_backend_opts *o) { return dc_backend_cuda_create_opts(false, o); }
static dc_backend *cuda_fp32(const dc_backend_opts *o) { return dc_backend_cuda_create_opts(true, o); }
#else
dc_backend *dc_backend_cuda_create_opts(bool fp32, const dc_backend_opts *opts) {
    (void)fp32, (void)opts;
    dc_fail("this build has no CUDA backend (rebuild with nvcc present: on the PATH or in /usr/local/cuda)");
    return NULL;
}
#endif
// The CPU has no kernel choices: the options are kept only to be seen.
static dc_backend *cpu(const dc_backend_opts *o) {
    dc_backend *be = dc_backend_cpu_create();
    if (be) be->opts = *o;
    return be;
}

typedef struct {
    const char *name;
    dc_backend *(*create)(const dc_backend_opts *o);  // NULL with a message when the device is absent
} dc_backend_entry;

static const dc_backend_entry k_backends[] = {
#ifdef DC_HAVE_CUDA
    {"cuda", cuda_bf16},
    {"cuda-fp32", cuda_fp32},
#endif
    {"cpu", cpu},
};
enum { N_BACKENDS = sizeof k_backends / sizeof k_backends[0] };

int dc_backend_create(const char *name, dc_backend **out) { return dc_backend_create_opts(name, NULL, out); }

int dc_backend_create_opts(const char *name, const dc_backend_opts *opts, dc_backend **out) {
    const dc_backend_opts o = opts ? *opts : dc_backend_opts_default();
    *out = NULL;
    if (!name || strcmp(name, "auto") == 0) {
        // The first entry that starts: the fastest present.
        for (int i = 0; i < N_BACKENDS; i++)
            if ((*out = k_backends[i].create(&o))) return 0;
        return dc_fail_ctx("backend auto: no backend could be created");
    }
    for (int i = 0; i < N_BACKENDS; i++) {
        if (strcmp(name, k_backends[i].name) != 0) continue;
        if (!(*out = k_backends[i].create(&o))) return dc_fail_ctx("backend %s", name);
        return 0;
    }
#ifndef DC_HAVE_CUDA
    // A name that a CUDA build knows: say why it is missing, not that it is unknown.
    if (strcmp(name, "cuda") == 0 || strcmp(name, "cuda-fp32") == 0) {
        dc_backend_cuda_create_opts(false, &o);  // sets the message
        return dc_fail_ctx("backend %s", name);
    }
#endif
    char list[256] = "auto";
    for (int i = 0; i < N_BACKENDS; i++) {
        strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, k_backends[i].name, sizeof list - strlen(list) - 1);
    }
    return dc_fail("unknown backend '%s' (valid: %s)", name, list);
}

int dc_backend_opts_disable(dc_backend_opts *o, const char *list) {
    static const struct { const char *name; size_t at; } paths[] = {
        {"attention_sm90", offsetof(dc_backend_opts, attention_sm90)},
        {"attention_short", offsetof(dc_backend_opts, attention_short)},
        {"cudnn_attention", offsetof(dc_backend_opts, cudnn_attention)},
        {"cudnn_attention_bwd", offsetof(dc_backend_opts, cudnn_attention_bwd)},
        {"geglu_sm90", offsetof(dc_backend_opts, geglu_sm90)},
        {"winograd", offsetof(dc_backend_opts, winograd)},
    };
    enum { N = sizeof paths / sizeof paths[0] };
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ",");
        int i = 0;
        while (i < N && !(strlen(paths[i].name) == n && !strncmp(p, paths[i].name, n))) i++;
        if (i == N) {
            char known[200] = "";
            for (int k = 0; k < N; k++) snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                                                 k ? ", " : "", paths[k].name);
            return dc_fail("unknown kernel path '%.*s' (valid: %s)", (int)n, p, known);
        }
        *(bool *)((char *)o + paths[i].at) = false;
        p += n + (p[n] == ',');
    }
    return 0;
}

void dc_backend_destroy(dc_backend *be) {
    if (be) be->destroy(be);
}

int dc_buf_alloc(dc_backend *be, dc_buf *b, dc_dtype dt, size_t count, const char *what) {
    b->dt = dt;
    b->p = be->alloc(be, count * dc_dtype_size(dt));
    if (!b->p) return dc_fail_ctx("cannot allocate %s (%zu elements)", what, count);
    return 0;
}
