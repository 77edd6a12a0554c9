#include "io/png_params.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A growing string; a failed allocation leaves s NULL and every later append a no-op.
typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) {
    if (!b->s) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            free(b->s), b->s = NULL;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        char *s = realloc(b->s, b->cap = 2 * b->cap + (size_t)n + 1);
        if (!s) {
            free(b->s), b->s = NULL;
            return;
        }
        b->s = s;
    }
}

// A1111's quote(): as is unless it holds ',', ':' or a newline, else
// json.dumps(text, ensure_ascii=False).
static void put_value(sbuf *b, const char *v) {
    if (!strpbrk(v, ",:\n")) {
        put(b, "%s", v);
        return;
    }
    put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') put(b, "\\%c", *p);
        else if (*p == '\n') put(b, "\\n");
        else if (*p == '\r') put(b, "\\r");
        else if (*p == '\t') put(b, "\\t");
        else if (*p == '\b') put(b, "\\b");
        else if (*p == '\f') put(b, "\\f");
        else if (*p < 0x20) put(b, "\\u%04x", *p);
        else put(b, "%c", *p);
    }
    put(b, "\"");
}

// Python's str() of a float for the values a CFG scale takes: 7.0 -> "7"
// (A1111 shows whole scales without a fraction), 7.5 -> "7.5", shortest
// digits that read back to the same float.
static void put_float(sbuf *b, float v) {
    char s[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, (double)v);
        if (strtof(s, NULL) == v) break;
    }
    put(b, "%s", s);
}

char *dc_gen_params_format(const dc_gen_params *p) {
    sbuf b = {malloc(256), 0, 256};
    put(&b, "%s\n", p->prompt ? p->prompt : "");
    if (p->negative_prompt && p->negative_prompt[0]) put(&b, "Negative prompt: %s\n", p->negative_prompt);
    put(&b, "Steps: %d, Sampler: ", p->steps);
    put_value(&b, p->sampler ? p->sampler : "");
    put(&b, ", CFG scale: ");
    put_float(&b, p->cfg_scale);
    put(&b, ", Seed: %llu, Size: %dx%d, Model: ", (unsigned long long)p->seed, p->width, p->height);
    put_value(&b, p->model ? p->model : "");
    if (p->extra && p->extra[0]) put(&b, ", %s", p->extra);
    return b.s;
}
