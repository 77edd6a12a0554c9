// Backend registry: picks a backend by name. A CUDA build adds its entries
// ahead of the CPU, so that "auto" prefers the GPU when one is present.
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

#ifdef DC_HAVE_CUDA
static dc_backend *cuda_bf16(void) { return dc_backend_cuda_create(false); }
static dc_backend *cuda_fp32(void) { return dc_backend_cuda_create(true); }
#else
dc_backend *dc_backend_cuda_create(bool fp32) {
    (void)fp32;
    dc_fail("this build has no CUDA backend (rebuild with nvcc present: on the PATH or in /usr/local/cuda)");
    return NULL;
}
#endif

typedef struct {
    const char *name;
    dc_backend *(*create)(void);  // NULL with a message when the device is absent
} dc_backend_entry;

static const dc_backend_entry k_backends[] = {
#ifdef DC_HAVE_CUDA
    {"cuda", cuda_bf16},
    {"cuda-fp32", cuda_fp32},
#endif
    {"cpu", dc_backend_cpu_create},
};
enum { N_BACKENDS = sizeof k_backends / sizeof k_backends[0] };

int dc_backend_create(const char *name, dc_backend **out) {
    *out = NULL;
    if (!name || strcmp(name, "auto") == 0) {
        // The first entry that starts: the fastest present.
        for (int i = 0; i < N_BACKENDS; i++)
            if ((*out = k_backends[i].create())) return 0;
        return dc_fail_ctx("backend auto: no backend could be created");
    }
    for (int i = 0; i < N_BACKENDS; i++) {
        if (strcmp(name, k_backends[i].name) != 0) continue;
        if (!(*out = k_backends[i].create())) return dc_fail_ctx("backend %s", name);
        return 0;
    }
#ifndef DC_HAVE_CUDA
    // A name that a CUDA build knows: say why it is missing, not that it is unknown.
    if (strcmp(name, "cuda") == 0 || strcmp(name, "cuda-fp32") == 0) {
        dc_backend_cuda_create(false);  // sets the message
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

void dc_backend_destroy(dc_backend *be) {
    if (be) be->destroy(be);
}

int dc_buf_alloc(dc_backend *be, dc_buf *b, dc_dtype dt, size_t count, const char *what) {
    b->dt = dt;
    b->p = be->alloc(be, count * dc_dtype_size(dt));
    if (!b->p) return dc_fail_ctx("cannot allocate %s (%zu elements)", what, count);
    return 0;
}
