#include "io/kv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dc_kv_set(dc_kv *kv, const char *key, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *v = strdup(buf);
    if (!v) return dc_fail("out of memory");
    for (int i = 0; i < kv->n; i++)
        if (strcmp(kv->keys[i], key) == 0) return free(kv->values[i]), kv->values[i] = v, 0;
    if (kv->n == DC_KV_MAX) return free(v), dc_fail("too many metadata entries");
    char *k = strdup(key);
    if (!k) return free(v), dc_fail("out of memory");
    kv->keys[kv->n] = k, kv->values[kv->n] = v, kv->n++;
    return 0;
}

const char *dc_kv_get(const dc_kv *kv, const char *key) {
    for (int i = 0; i < kv->n; i++)
        if (strcmp(kv->keys[i], key) == 0) return kv->values[i];
    return NULL;
}

void dc_kv_free(dc_kv *kv) {
    for (int i = 0; i < kv->n; i++) free(kv->keys[i]), free(kv->values[i]);
    kv->n = 0;
}
