#include "io/png_params.h"

#include <stdarg.h>
#include <stdbool.h>
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

// The bytes of the line break at p (those of str.splitlines(): \n, \r\n, \r,
// \v, \f, U+001C..U+001E, U+0085, U+2028, U+2029), or 0 when there is none.
static int line_break(const unsigned char *p) {
    if (p[0] == '\r' && p[1] == '\n') return 2;
    if (p[0] == '\n' || p[0] == '\r' || p[0] == '\v' || p[0] == '\f' || (p[0] >= 0x1c && p[0] <= 0x1e)) return 1;
    if (p[0] == 0xc2 && p[1] == 0x85) return 2;
    if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) return 3;
    return 0;
}

// A prompt on its line: every line break as one space, as the tokenizer reads it.
static void put_text(sbuf *b, const char *v) {
    for (const unsigned char *p = (const unsigned char *)v; *p;) {
        size_t run = 0;
        while (p[run] && !line_break(p + run)) run++;
        put(b, "%.*s", (int)run, (const char *)p);
        p += run;
        if (*p) put(b, " "), p += line_break(p);
    }
}

// A1111's quote(): as is unless it holds ',', ':' or a line break, else
// json.dumps(text, ensure_ascii=False), with U+0085, U+2028 and U+2029 escaped
// too (JSON allows it) so that the value stays on its line.
static void put_value(sbuf *b, const char *v) {
    bool quote = strpbrk(v, ",:") != NULL;
    for (const unsigned char *p = (const unsigned char *)v; *p && !quote; p++) quote = line_break(p) > 0;
    if (!quote) {
        put(b, "%s", v);
        return;
    }
    put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        int n = line_break(p);
        if (n > 1 && *p != '\r') {  // U+0085, U+2028, U+2029
            put(b, "\\u%04x", n == 2 ? 0x85 : 0x2028 + (p[2] - 0xa8));
            p += n - 1;
        } else if (*p == '"' || *p == '\\') put(b, "\\%c", *p);
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
    put_text(&b, p->prompt ? p->prompt : "");
    put(&b, "\n");
    if (p->negative_prompt && p->negative_prompt[0]) {
        put(&b, "Negative prompt: ");
        put_text(&b, p->negative_prompt);
        put(&b, "\n");
    }
    put(&b, "Steps: %d, Sampler: ", p->steps);
    put_value(&b, p->sampler ? p->sampler : "");
    put(&b, ", CFG scale: ");
    put_float(&b, p->cfg_scale);
    put(&b, ", Seed: %llu, Size: %dx%d, ", (unsigned long long)p->seed, p->width, p->height);
    if (p->model_hash && p->model_hash[0]) {
        put(&b, "Model hash: ");
        put_value(&b, p->model_hash);
        put(&b, ", ");
    }
    put(&b, "Model: ");
    put_value(&b, p->model ? p->model : "");
    if (p->extra && p->extra[0]) put(&b, ", %s", p->extra);
    return b.s;
}
