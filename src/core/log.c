#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static bool g_open_line;  // a progress line is drawn and not yet ended

bool dc_log_is_tty(void) { return isatty(fileno(stderr)); }

static void vlog(const char *prefix, const char *fmt, va_list ap) {
    if (g_open_line) fputc('\n', stderr), g_open_line = false;
    fputs(prefix, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void dc_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog("", fmt, ap);
    va_end(ap);
}

void dc_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog("warning: ", fmt, ap);
    va_end(ap);
}

void dc_progress(bool final, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (dc_log_is_tty()) {
        fputs("\r\033[K", stderr);
        vfprintf(stderr, fmt, ap);
        g_open_line = !final;
        if (final) fputc('\n', stderr);
    } else {
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
    fflush(stderr);
}

double dc_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *dc_format_duration(double sec, char *buf, int n) {
    long s = sec < 0 ? 0 : (long)(sec + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else if (s >= 60) snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, n, "%lds", s);
    return buf;
}
