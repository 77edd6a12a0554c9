// Backend registry: picks a backend by name. A CUDA build adds its entry to
// the table below, ahead of the CPU, so that "auto" prefers it.
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

typedef struct {
    const char *name;
    dc_backend *(*create)(void);  // NULL with a message when the device is absent
} dc_backend_entry;

static const dc_backend_entry k_backends[] = {
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
