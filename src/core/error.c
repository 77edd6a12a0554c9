#include "core/error.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];

int dc_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return -1;
}

int dc_fail_ctx(const char *fmt, ...) {
    char prefix[512], old[sizeof g_msg];
    memcpy(old, g_msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(g_msg, sizeof g_msg, "%s: %s", prefix, old);
    return -1;
}

const char *dc_error(void) { return g_msg[0] ? g_msg : "unknown error"; }
void dc_error_clear(void) { g_msg[0] = 0; }
