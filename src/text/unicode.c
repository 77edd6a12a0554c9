#include "text/unicode.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/text_tables.h"

void dc_ustr_free(dc_ustr *s) {
    free(s->cp);
    *s = (dc_ustr){0};
}

static int ustr_reserve(dc_ustr *s, size_t extra) {
    if (s->n + extra <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->n + extra) cap *= 2;
    uint32_t *p = realloc(s->cp, cap * sizeof *p);
    if (!p) return dc_fail("out of memory for %zu characters of text", cap);
    s->cp = p, s->cap = cap;
    return 0;
}

int dc_ustr_push(dc_ustr *s, uint32_t c) {
    DC_TRY(ustr_reserve(s, 1));
    s->cp[s->n++] = c;
    return 0;
}

int dc_ustr_append(dc_ustr *s, const uint32_t *cp, size_t n) {
    if (!n) return 0;  // cp may be NULL (an empty string's)
    DC_TRY(ustr_reserve(s, n));
    memcpy(s->cp + s->n, cp, n * sizeof *cp);
    s->n += n;
    return 0;
}

size_t dc_utf8_get(const unsigned char *s, size_t n, uint32_t *c) {
    unsigned b = s[0];
    if (b < 0x80) return *c = b, 1;
    size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
    if (!len || b > 0xF4 || len > n) return 0;
    uint32_t v = b & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    static const uint32_t k_min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < k_min[len] || (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) return 0;
    return *c = v, len;
}

int dc_utf8_decode(const char *s, size_t n, const char *what, dc_ustr *out) {
    out->n = 0;
    DC_TRY(ustr_reserve(out, n));
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t len = dc_utf8_get(u + i, n - i, &c);
        if (!len)
            return dc_fail("%s is not valid UTF-8: byte 0x%02x at offset %zu", what, u[i], i);
        out->cp[out->n++] = c;
        i += len;
    }
    return 0;
}

int dc_ustr_append_utf8(dc_ustr *s, const char *utf8) {
    const unsigned char *u = (const unsigned char *)utf8;
    size_t n = strlen(utf8);
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t len = dc_utf8_get(u + i, n - i, &c);
        if (!len) return dc_fail("internal error: a text table holds invalid UTF-8");
        DC_TRY(dc_ustr_push(s, c));
        i += len;
    }
    return 0;
}

size_t dc_utf8_put(uint32_t c, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (c < 0x80) return o[0] = (unsigned char)c, 1;
    if (c < 0x800) {
        o[0] = (unsigned char)(0xC0 | c >> 6), o[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xE0 | c >> 12), o[1] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | c >> 18), o[1] = (unsigned char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (c >> 6 & 0x3F)), o[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

unsigned dc_uc_flags(uint32_t c) {
    // The last run starting at or before c; the table starts at code point 0.
    int lo = 0, hi = dc_uc_props_count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dc_uc_props[mid] >> 8 <= c) lo = mid;
        else hi = mid - 1;
    }
    return dc_uc_props[lo] & 0xFF;
}

static uint32_t lower_simple(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    int lo = 0, hi = dc_uc_lower_runs_count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dc_uc_lower_runs[mid].start <= c) lo = mid;
        else hi = mid - 1;
    }
    const dc_uc_case_run *r = &dc_uc_lower_runs[lo];
    uint32_t off = c - r->start;
    if (c < r->start || off % r->stride || off / r->stride >= r->count) return c;
    return (uint32_t)((int32_t)c + r->delta);
}

// CPython's handle_capital_sigma: U+03A3 lowers to final sigma when a cased
// letter precedes it and none follows, case-ignorable ones skipped both ways.
static bool final_sigma(const dc_ustr *s, size_t i) {
    size_t j = i;
    unsigned p = 0;
    while (j > 0 && ((p = dc_uc_flags(s->cp[j - 1])) & DC_UC_CASE_IGNORABLE)) j--;
    if (j == 0 || !(p & DC_UC_CASED)) return false;
    for (j = i + 1; j < s->n; j++) {
        p = dc_uc_flags(s->cp[j]);
        if (!(p & DC_UC_CASE_IGNORABLE)) return !(p & DC_UC_CASED);
    }
    return true;
}

int dc_uc_lower(const dc_ustr *in, dc_ustr *out) {
    out->n = 0;
    DC_TRY(ustr_reserve(out, in->n));
    for (size_t i = 0; i < in->n; i++) {
        uint32_t c = in->cp[i];
        if (c == 0x130) {  // the one full mapping of two code points: i + combining dot above
            DC_TRY(dc_ustr_push(out, 'i'));
            DC_TRY(dc_ustr_push(out, 0x307));
        } else if (c == 0x3A3) {
            DC_TRY(dc_ustr_push(out, final_sigma(in, i) ? 0x3C2 : 0x3C3));
        } else {
            DC_TRY(dc_ustr_push(out, lower_simple(c)));
        }
    }
    return 0;
}

// ---- NFC (Unicode Standard Annex #15) --------------------------------------

enum {  // Hangul syllables compose and decompose by arithmetic
    S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
    L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT
};

static unsigned ccc_of(uint32_t c) {
    if (c < 0x300) return 0;
    int lo = 0, hi = dc_uc_ccc_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < dc_uc_ccc[mid].a) hi = mid - 1;
        else if (c > dc_uc_ccc[mid].b) lo = mid + 1;
        else return dc_uc_ccc[mid].c;
    }
    return 0;
}

static const dc_uc_triple *decomp_of(uint32_t c) {
    int lo = 0, hi = dc_uc_decomps_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < dc_uc_decomps[mid].a) hi = mid - 1;
        else if (c > dc_uc_decomps[mid].a) lo = mid + 1;
        else return &dc_uc_decomps[mid];
    }
    return NULL;
}

// The primary composite of a + b, or 0.
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
        b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    int lo = 0, hi = dc_uc_comps_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const dc_uc_triple *t = &dc_uc_comps[mid];
        if (a < t->a || (a == t->a && b < t->b)) hi = mid - 1;
        else if (a > t->a || b > t->b) lo = mid + 1;
        else return t->c;
    }
    return 0;
}

static int decompose(uint32_t c, dc_ustr *out) {
    if (c >= S_BASE && c < S_BASE + S_COUNT) {
        uint32_t s = c - S_BASE;
        DC_TRY(dc_ustr_push(out, L_BASE + s / N_COUNT));
        DC_TRY(dc_ustr_push(out, V_BASE + s % N_COUNT / T_COUNT));
        if (s % T_COUNT) DC_TRY(dc_ustr_push(out, T_BASE + s % T_COUNT));
        return 0;
    }
    const dc_uc_triple *d = c < 0xC0 ? NULL : decomp_of(c);
    if (!d) return dc_ustr_push(out, c);
    DC_TRY(decompose(d->b, out));  // decompositions nest at most a few levels deep
    return d->c ? decompose(d->c, out) : 0;
}

int dc_uc_nfc(const dc_ustr *in, dc_ustr *out) {
    dc_ustr d = {0};
    for (size_t i = 0; i < in->n; i++)
        if (decompose(in->cp[i], &d)) return dc_ustr_free(&d), -1;
    // Canonical order: a stable sort by combining class of each run of
    // non-starters (runs are short; insertion sort).
    for (size_t i = 1; i < d.n; i++) {
        unsigned k = ccc_of(d.cp[i]);
        if (!k) continue;
        size_t j = i;
        uint32_t c = d.cp[i];
        while (j > 0 && ccc_of(d.cp[j - 1]) > k) d.cp[j] = d.cp[j - 1], j--;
        d.cp[j] = c;
    }
    // Compose each character with the last starter unless something between
    // them blocks it (a starter, or a class at least as high).
    out->n = 0;
    if (ustr_reserve(out, d.n)) return dc_ustr_free(&d), -1;
    size_t starter = SIZE_MAX;
    unsigned last_ccc = 0;
    for (size_t i = 0; i < d.n; i++) {
        uint32_t c = d.cp[i], comp;
        unsigned k = ccc_of(c);
        bool adjacent = starter != SIZE_MAX && starter == out->n - 1;
        if (starter != SIZE_MAX && (adjacent || (last_ccc != 0 && last_ccc < k)) &&
            (comp = compose(out->cp[starter], c))) {
            out->cp[starter] = comp;
            continue;
        }
        if (k == 0) starter = out->n;
        out->cp[out->n++] = c;
        last_ccc = k;
    }
    dc_ustr_free(&d);
    return 0;
}
