#include "text/ftfy_encoding.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/ftfy_tables.h"

#define NO_CHAR UINT32_MAX  // past the end of the text: matches no class or literal

// The DC_FTFY_* classes of a code point.
static unsigned classes_of(uint32_t c) {
    int lo = 0, hi = dc_ftfy_classes_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < dc_ftfy_classes[mid].cp) hi = mid - 1;
        else if (c > dc_ftfy_classes[mid].cp) lo = mid + 1;
        else return dc_ftfy_classes[mid].classes;
    }
    return 0;
}

static bool is_word(uint32_t c) {  // Python re's \w
    int lo = 0, hi = dc_ftfy_word_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < dc_ftfy_word[mid][0]) hi = mid - 1;
        else if (c > dc_ftfy_word[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

static bool lower_ascii(uint32_t c) { return c >= 'a' && c <= 'z'; }
static bool alpha_ascii(uint32_t c) { return lower_ascii(c) || (c >= 'A' && c <= 'Z'); }

// Whether c is in a zero-terminated list of code points.
static bool one_of(uint32_t c, const uint32_t *set) {
    for (; *set; set++)
        if (*set == c) return true;
    return false;
}

// ---- the badness heuristic ------------------------------------------------------

// Short names for the classes that the pattern combines.
#define BAD DC_FTFY_BAD
#define LA DC_FTFY_LOWER_ACCENTED
#define UA DC_FTFY_UPPER_ACCENTED
#define BOX DC_FTFY_BOX
#define SP DC_FTFY_START_PUNCT
#define EP DC_FTFY_END_PUNCT
#define CUR DC_FTFY_CURRENCY
#define NUM DC_FTFY_NUMERIC
#define LAW DC_FTFY_LAW
#define SYMBOLISH (LA | UA | BOX | SP | EP | CUR | NUM | LAW)

// Literal character sets of the pattern.
static const uint32_t k_a_hat_a_tilde[] = {0xC2, 0xC3, 0};  // Â Ã
// What follows Â, Ã, Î or Ð in common Windows-1252 mojibake: € œ Š š ¢ £ Ÿ ž
// NBSP SHY ® © ° · » – — ´ (and start or end punctuation).
static const uint32_t k_w1252_lead[] = {0xC2, 0xC3, 0xCE, 0xD0, 0};
static const uint32_t k_w1252_follow[] = {0x20AC, 0x153, 0x160, 0x161, 0xA2, 0xA3, 0x178, 0x17E, 0xA0,
                                          0xAD, 0xAE, 0xA9, 0xB0, 0xB7, 0xBB, 0x2013, 0x2014, 0xB4, 0};
static const uint32_t k_arabic_lead[] = {0xD8, 0xD9, 0};                    // Ø Ù
static const uint32_t k_arabic_extra[] = {0x178, 0x160, 0xAE, 0xB0, 0xB5, 0xBB, 0};  // Ÿ Š ® ° µ »
static const uint32_t k_south_asian[] = {0xB2, 0xB5, 0xB9, 0xBC, 0xBD, 0xBE, 0};    // ² µ ¹ ¼ ½ ¾
// MacRoman: what follows √, ≈, ‚Ä and ‚â / ‚ó.
static const uint32_t k_mac_root[] = {0xB1, 0x2202, 0x2020, 0x2260, 0xAE, 0x2122, 0xB4, 0x2264, 0x2265, 0xA5, 0xB5, 0xF8, 0};
static const uint32_t k_mac_approx[] = {0xB0, 0xA2, 0};
static const uint32_t k_mac_comma_a[] = {0xEC, 0xEE, 0xEF, 0xF2, 0xF4, 0xFA, 0xF9, 0xFB, 0x2020, 0xB0, 0xA2, 0x3C0, 0};
static const uint32_t k_mac_comma_mid[] = {0xE2, 0xF3, 0};
static const uint32_t k_mac_comma_end[] = {0xE0, 0xE4, 0xB0, 0xEA, 0};
// Windows-1251: В Г Р С around a symbol; Windows-1253: Β Γ Ξ Ο likewise.
static const uint32_t k_cyrillic_pair[] = {0x412, 0x413, 0x420, 0x421, 0};
static const uint32_t k_greek_pair[] = {0x392, 0x393, 0x39E, 0x39F, 0};
static const uint32_t k_greek_euro[] = {0x2122, 0xA0, 0x386, 0xAD, 0xAE, 0xB0, 0};  // after β€
static const uint32_t k_a_grave_follow[] = {0xA0, 0xA1, 0};  // after Ã
static const uint32_t k_times_follow[] = {0xB2, 0xB3, 0};    // after ×
static const uint32_t k_ggvdv[] = {0x413, 0x45E, 0x412, 0x402, 0x412, 0};  // ГўВЂВ

// s[i..i+5] and their classes: NO_CHAR and 0 past the end.
typedef struct {
    uint32_t c[6];
    unsigned m[6];
} window;

// Whether one of the alternatives of ftfy's BADNESS_RE matches at s[i], in the
// pattern's order. The pattern is a union of short fixed sequences of
// character classes, so a match anywhere is all that is_bad asks for.
static bool bad_at(const uint32_t *s, size_t n, size_t i, const window *w) {
    const uint32_t *c = w->c;
    const unsigned *m = w->m;
    if (m[0] & DC_FTFY_C1) return true;
    if ((m[0] & (BAD | SYMBOLISH)) && (m[1] & BAD)) return true;
    if (alpha_ascii(c[0]) && (m[1] & (DC_FTFY_LOWER_COMMON | DC_FTFY_UPPER_COMMON)) && (m[2] & BAD)) return true;
    if ((m[0] & BAD) && (m[1] & SYMBOLISH)) return true;
    if ((m[0] & (LA | DC_FTFY_LOWER_COMMON | BOX | EP | CUR | NUM)) && (m[1] & UA)) return true;
    if ((m[0] & (BOX | EP | CUR | NUM)) && (m[1] & LA)) return true;
    if ((m[0] & (LA | BOX | EP)) && (m[1] & CUR)) return true;
    if ((m[0] & DC_FTFY_SPACE) && (m[1] & UA) && (m[2] & CUR)) return true;
    if ((m[0] & (UA | BOX)) && (m[1] & (NUM | LAW))) return true;
    if ((m[0] & (LA | UA | BOX | CUR | EP)) && (m[1] & SP) && (m[2] & NUM)) return true;
    if ((m[0] & (LA | UA | CUR | NUM | BOX | LAW)) && (m[1] & EP) && (m[2] & SP)) return true;
    if ((m[0] & (CUR | NUM | BOX)) && (m[1] & SP)) return true;
    if (lower_ascii(c[0]) && (m[1] & UA) && (m[2] & (SP | CUR))) return true;
    if ((m[0] & BOX) && (m[1] & DC_FTFY_KAOMOJI)) return true;
    if ((m[0] & (LA | UA | CUR | NUM | SP | EP | LAW)) && (m[1] & BOX)) return true;
    if ((m[0] & BOX) && (m[1] & EP)) return true;
    if ((m[0] & (LA | UA)) && (m[1] & (SP | EP)) && c[2] != NO_CHAR && is_word(c[2])) return true;
    // œ not followed by an unaccented Latin letter; a degree sign after a capital
    if ((c[0] == 0x152 || c[0] == 0x153) && c[1] != NO_CHAR && !alpha_ascii(c[1])) return true;
    if ((m[0] & UA) && c[1] == 0xB0) return true;
    // common two-character Windows-1252 mojibake
    if (one_of(c[0], k_w1252_lead) && (one_of(c[1], k_w1252_follow) || (m[1] & (SP | EP)))) return true;
    if (c[0] == 0xD7 && one_of(c[1], k_times_follow)) return true;
    // Arabic in Windows-1252: four characters, as the 'common' ones take part
    unsigned arabic = DC_FTFY_COMMON | CUR | BAD | NUM | SP;
    if (one_of(c[0], k_arabic_lead) && ((m[1] & arabic) || one_of(c[1], k_arabic_extra)) &&
        one_of(c[2], k_arabic_lead) && ((m[3] & arabic) || one_of(c[3], k_arabic_extra)))
        return true;
    if (c[0] == 0xE0 && one_of(c[1], k_south_asian)) return true;  // à²: South Asian scripts
    // MacRoman
    if (c[0] == 0x221A && one_of(c[1], k_mac_root)) return true;
    if (c[0] == 0x2248 && one_of(c[1], k_mac_approx)) return true;
    if (c[0] == 0x201A && c[1] == 0xC4 && one_of(c[2], k_mac_comma_a)) return true;
    if (c[0] == 0x201A && one_of(c[1], k_mac_comma_mid) && one_of(c[2], k_mac_comma_end)) return true;
    // Windows-1251: вЂ, В?В triples, and ГўВЂВ then any character but a line
    // break then a Latin letter or space
    bool mixed = m[1] & (DC_FTFY_C1 | BAD | SP | EP | CUR);  // the middle of В?В (and Β?Β)
    if (c[0] == 0x432 && c[1] == 0x402) return true;
    if (one_of(c[0], k_cyrillic_pair) && (mixed || c[1] == 0xB0 || c[1] == 0xB5) && one_of(c[2], k_cyrillic_pair))
        return true;
    if (n - i >= 7) {
        bool lead = true;
        for (int k = 0; k < 5; k++) lead = lead && s[i + k] == k_ggvdv[k];
        if (lead && s[i + 5] != '\n' && (alpha_ascii(s[i + 6]) || s[i + 6] == ' ')) return true;
    }
    // Windows-1252 encodings of à, á and NBSP
    if (c[0] == 0xC3 && one_of(c[1], k_a_grave_follow)) return true;
    if (lower_ascii(c[0])) {
        if (one_of(c[1], k_a_hat_a_tilde) && c[2] == ' ') return true;
        if ((m[1] & DC_FTFY_SPACE) && one_of(c[2], k_a_hat_a_tilde) && c[3] == ' ') return true;
    }
    if (i == 0 && one_of(c[0], k_a_hat_a_tilde) && c[1] == ' ') return true;
    // Â as the encoding of the character that follows it
    bool before_a_hat = lower_ascii(c[0]) || c[0] == '.' || c[0] == ',' || c[0] == '?' || c[0] == '!' || (m[0] & EP);
    if (before_a_hat && c[1] == 0xC2 && (c[2] == ' ' || (m[2] & (SP | EP)))) return true;
    // Windows-1253: β€ then a symbol, Β?Β triples; Windows-1257: ā€
    if (c[0] == 0x3B2 && c[1] == 0x20AC && one_of(c[2], k_greek_euro)) return true;
    if (one_of(c[0], k_greek_pair) && (mixed || c[1] == 0xB0) && one_of(c[2], k_greek_pair)) return true;
    if (c[0] == 0x101 && c[1] == 0x20AC) return true;
    return false;
}

bool dc_ftfy_is_bad(const uint32_t *s, size_t n) {
    window w;
    for (int k = 0; k < 6; k++) {
        w.c[k] = (size_t)k < n ? s[k] : NO_CHAR;
        w.m[k] = (size_t)k < n ? classes_of(s[k]) : 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (bad_at(s, n, i, &w)) return true;
        memmove(w.c, w.c + 1, 5 * sizeof *w.c);
        memmove(w.m, w.m + 1, 5 * sizeof *w.m);
        w.c[5] = i + 6 < n ? s[i + 6] : NO_CHAR;
        w.m[5] = i + 6 < n ? classes_of(s[i + 6]) : 0;
    }
    return false;
}

// ---- bytes: ftfy's transcoding steps -----------------------------------------------

typedef struct {
    unsigned char *b;
    size_t n;
} bytes;

#define NO_BYTE 0x100u  // past the end: equals no byte

static unsigned byte_at(const bytes *x, size_t i) { return i < x->n ? x->b[i] : NO_BYTE; }
static bool cont(unsigned b) { return b >= 0x80 && b <= 0xBF; }
static bool between(unsigned b, unsigned lo, unsigned hi) { return b >= lo && b <= hi; }

static int bytes_alloc(bytes *x, size_t cap) {
    x->n = 0;
    x->b = malloc(cap ? cap : 1);
    return x->b ? 0 : dc_fail("out of memory for %zu bytes of text", cap);
}

// The byte of c in a single-byte encoding, or -1 when it has none.
static int byte_of(const dc_ftfy_codec *e, uint32_t c) {
    if (c < 0x80 && c != 0x1A) return (int)c;
    if (c == e->sub) return 0x1A;
    for (int b = 0; b < 128; b++)
        if (e->high[b] == c) return 0x80 + b;
    return -1;
}

// text in a single-byte encoding; *ok false (nothing allocated) when some
// character has no byte there (ftfy's possible_encoding).
static int encode(const dc_ustr *text, const dc_ftfy_codec *e, bytes *out, bool *ok) {
    *ok = false;
    for (size_t i = 0; i < text->n; i++)
        if (byte_of(e, text->cp[i]) < 0) return 0;
    DC_TRY(bytes_alloc(out, text->n));
    for (size_t i = 0; i < text->n; i++) out->b[out->n++] = (unsigned char)byte_of(e, text->cp[i]);
    *ok = true;
    return 0;
}

// A continuation byte that restore_byte_a0 accepts beside a space: not 0x85
// (read as "…") nor 0xA0 (the byte the space would be).
static bool a0_cont(unsigned b) { return between(b, 0x80, 0x84) || between(b, 0x86, 0x9F) || between(b, 0xA1, 0xBF); }

// Length of the match of ftfy's ALTERED_UTF8_RE at x[i] (a UTF-8 sequence
// with one byte 0xA0 turned into a space), or 0.
static size_t altered_at(const bytes *x, size_t i) {
    unsigned b0 = byte_at(x, i), b1 = byte_at(x, i + 1), b2 = byte_at(x, i + 2), b3 = byte_at(x, i + 3);
    if ((b0 == 0xC2 || b0 == 0xC3 || b0 == 0xC5 || b0 == 0xCE || b0 == 0xD0 || b0 == 0xD9) && b1 == ' ') return 2;
    if ((b0 == 0xE2 || b0 == 0xE3) && b1 == ' ' && a0_cont(b2)) return 3;
    if (between(b0, 0xE0, 0xE3) && a0_cont(b1) && b2 == ' ') return 3;
    if (b0 == 0xF0) {
        int spaces = (b1 == ' ') + (b2 == ' ') + (b3 == ' ');
        bool rest = (b1 == ' ' || cont(b1)) && (b2 == ' ' || cont(b2)) && (b3 == ' ' || cont(b3));
        if (spaces == 1 && rest) return 4;
    }
    return 0;
}

static bool starts(const bytes *x, size_t i, const char *s) {
    size_t len = strlen(s);
    return i + len <= x->n && !memcmp(x->b + i, s, len);
}

// ftfy's restore_byte_a0: "Ã " becomes "à " (C3 A0 20) except before a space
// or the Portuguese "quele", "quela", "quilo", "s "; then each ALTERED_UTF8_RE
// match gets its space back as 0xA0.
static int restore_byte_a0(bytes *x) {
    bytes y;
    DC_TRY(bytes_alloc(&y, x->n + x->n / 2 + 1));
    for (size_t i = 0; i < x->n;) {
        bool grave = x->b[i] == 0xC3 && byte_at(x, i + 1) == ' ' && !starts(x, i + 2, " ") &&
                     !starts(x, i + 2, "quele") && !starts(x, i + 2, "quela") && !starts(x, i + 2, "quilo") &&
                     !starts(x, i + 2, "s ");
        if (grave) {
            memcpy(y.b + y.n, "\xc3\xa0 ", 3);
            y.n += 3, i += 2;
        } else {
            y.b[y.n++] = x->b[i++];
        }
    }
    for (size_t i = 0; i < y.n;) {
        size_t len = altered_at(&y, i);
        for (size_t k = i; k < i + len; k++)
            if (y.b[k] == ' ') y.b[k] = 0xA0;
        i += len ? len : 1;
    }
    free(x->b);
    *x = y;
    return 0;
}

// Length of the match of ftfy's LOSSY_UTF8_RE at x[i], or 0: a UTF-8 (or
// CESU-8) sequence in which bytes became 0x1A (the sloppy codecs' byte for
// U+FFFD) or, once, '?'; or a lone 0x1A.
static size_t lossy_at(const bytes *x, size_t i) {
    unsigned b[6];
    for (int k = 0; k < 6; k++) b[k] = byte_at(x, i + (size_t)k);
    bool q[6], k1a[6], kq[6];  // [\x1a?], [\x1a\x80-\xbf], [\x1a?\x80-\xbf]
    for (int k = 0; k < 6; k++) {
        q[k] = b[k] == 0x1A || b[k] == '?';
        k1a[k] = b[k] == 0x1A || cont(b[k]);
        kq[k] = q[k] || cont(b[k]);
    }
    if (between(b[0], 0xC2, 0xDF) && b[1] == 0x1A) return 2;
    if (between(b[0], 0xC2, 0xC3) && b[1] == '?') return 2;
    if (b[0] == 0xED && between(b[1], 0xA0, 0xAF) && b[3] == 0xED && between(b[4], 0xB0, 0xBF) &&
        ((q[2] && kq[5]) || (kq[2] && q[5])))
        return 6;
    if (between(b[0], 0xE0, 0xEF) && ((q[1] && k1a[2]) || (k1a[1] && q[2]))) return 3;
    if (between(b[0], 0xF0, 0xF4) &&
        ((q[1] && k1a[2] && k1a[3]) || (k1a[1] && q[2] && k1a[3]) || (k1a[1] && k1a[2] && q[3])))
        return 4;
    if (b[0] == 0x1A) return 1;
    return 0;
}

// ftfy's replace_lossy_sequences: each match becomes the UTF-8 of U+FFFD.
static int replace_lossy_sequences(bytes *x) {
    bytes y;
    DC_TRY(bytes_alloc(&y, 3 * x->n));
    for (size_t i = 0; i < x->n;) {
        size_t len = lossy_at(x, i);
        if (len) {
            memcpy(y.b + y.n, "\xef\xbf\xbd", 3);
            y.n += 3, i += len;
        } else {
            y.b[y.n++] = x->b[i++];
        }
    }
    free(x->b);
    *x = y;
    return 0;
}

// x decoded as Python's strict UTF-8 or, with `variants`, as ftfy's
// utf-8-variants; *ok false when it does not decode. The variants codec finds
// its sequences with regexes whose '$' also matches before a final "\n", so
// it reads C0 0A at the very end as U+0000, and a CESU-8 pair whose last byte
// is that final "\n" as a code point: both reproduced.
static int decode_utf8(const bytes *x, bool variants, dc_ustr *out, bool *ok) {
    out->n = 0;
    *ok = false;
    for (size_t i = 0; i < x->n;) {
        unsigned b[6];
        for (int k = 0; k < 6; k++) b[k] = byte_at(x, i + (size_t)k);
        bool last_nl1 = b[1] == '\n' && i + 2 == x->n, last_nl5 = b[5] == '\n' && i + 6 == x->n;
        bool java_null = b[0] == 0xC0 && (b[1] == 0x80 || last_nl1);
        bool cesu = b[0] == 0xED && between(b[1], 0xA0, 0xAF) && cont(b[2]) && b[3] == 0xED &&
                    between(b[4], 0xB0, 0xBF) && (cont(b[5]) || last_nl5);
        uint32_t c;
        size_t len;
        if (variants && java_null) {
            c = 0, len = 2;
        } else if (variants && cesu) {  // the bits of a UTF-16 surrogate pair
            c = 0x10000 + ((b[1] & 0x0F) << 16) + ((b[2] & 0x3F) << 10) + ((b[4] & 0x0F) << 6) + (b[5] & 0x3F);
            len = 6;
        } else if (!(len = dc_utf8_get(x->b + i, x->n - i, &c))) {
            return 0;
        }
        DC_TRY(dc_ustr_push(out, c));
        i += len;
    }
    *ok = true;
    return 0;
}

// ---- the steps -------------------------------------------------------------------

static bool ustr_equal(const dc_ustr *a, const dc_ustr *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->cp, b->cp, a->n * sizeof *a->cp));
}

// Step 1 for one encoding: *fixed when the text encodes in it and the bytes,
// after ftfy's transcoding steps, decode as UTF-8.
static int try_encoding(const dc_ustr *text, const dc_ftfy_codec *e, dc_ustr *out, bool *fixed) {
    bytes x = {0};
    bool ok;
    *fixed = false;
    DC_TRY(encode(text, e, &x, &ok));
    if (!ok) return 0;
    int rc = e->restore_a0 ? restore_byte_a0(&x) : 0;
    if (!rc && e->lossy) rc = replace_lossy_sequences(&x);
    bool variants = memchr(x.b, 0xED, x.n) || memchr(x.b, 0xC0, x.n);
    if (!rc) rc = decode_utf8(&x, variants, out, fixed);
    free(x.b);
    return rc;
}

// The end of the run of UTF8_DETECTOR_RE that starts at s[i] (i when none):
// lead characters of 2, 3 or 4 byte sequences, each with its continuations.
static size_t utf8_run_end(const uint32_t *s, size_t n, size_t i) {
    for (;;) {
        unsigned m[4];
        for (size_t k = 0; k < 4; k++) m[k] = i + k < n ? classes_of(s[i + k]) : 0;
        bool c1 = m[1] & DC_FTFY_UTF8_CONT, c2 = c1 && (m[2] & DC_FTFY_UTF8_CONT), c3 = c2 && (m[3] & DC_FTFY_UTF8_CONT);
        if ((m[0] & DC_FTFY_UTF8_FIRST2) && c1) i += 2;
        else if ((m[0] & DC_FTFY_UTF8_FIRST3) && c2) i += 3;
        else if ((m[0] & DC_FTFY_UTF8_FIRST4) && c3) i += 4;
        else return i;
    }
}

// Step 2, ftfy's decode_inconsistent_utf8: each run of UTF-8-like mojibake
// not preceded by a strict continuation character, shorter than the text and
// bad, replaced by its own fix_encoding.
static int decode_inconsistent_utf8(const dc_ustr *text, dc_ustr *out) {
    const uint32_t *s = text->cp;
    size_t n = text->n;
    dc_ustr piece = {0}, fixed = {0};
    int rc = 0;
    out->n = 0;
    for (size_t i = 0; i < n && !rc;) {
        bool after_cont = i > 0 && (classes_of(s[i - 1]) & DC_FTFY_UTF8_CONT_STRICT);
        size_t end = after_cont ? i : utf8_run_end(s, n, i);
        if (end == i) {
            rc = dc_ustr_push(out, s[i++]);
            continue;
        }
        if (end - i < n && dc_ftfy_is_bad(s + i, end - i)) {
            piece.n = 0;
            rc = dc_ustr_append(&piece, s + i, end - i);
            if (!rc) rc = dc_ftfy_fix_encoding(&piece, &fixed);
            if (!rc) rc = dc_ustr_append(out, fixed.cp, fixed.n);
        } else {
            rc = dc_ustr_append(out, s + i, end - i);
        }
        i = end;
    }
    dc_ustr_free(&piece), dc_ustr_free(&fixed);
    return rc;
}

// One step of ftfy's fix_encoding (out = text when nothing applies).
static int fix_step(const dc_ustr *text, dc_ustr *out) {
    bool ascii = true;
    for (size_t i = 0; i < text->n && ascii; i++) ascii = text->cp[i] < 0x80;
    out->n = 0;
    if (ascii || !dc_ftfy_is_bad(text->cp, text->n)) return dc_ustr_append(out, text->cp, text->n);
    for (int e = 0; e < dc_ftfy_codecs_count; e++) {
        bool fixed;
        DC_TRY(try_encoding(text, &dc_ftfy_codecs[e], out, &fixed));
        if (fixed) return 0;
    }
    DC_TRY(decode_inconsistent_utf8(text, out));
    if (!ustr_equal(out, text)) return 0;
    // Step 3. ftfy first tries text that Latin-1 encodes as Windows-1252
    // (strictly): where that decodes, it maps exactly the C1 controls, and
    // as fix_c1_controls does, so this gives the same text.
    const dc_ftfy_codec *w1252 = &dc_ftfy_codecs[DC_FTFY_SLOPPY_1252];
    for (size_t i = 0; i < out->n; i++)
        if (out->cp[i] >= 0x80 && out->cp[i] <= 0x9F) out->cp[i] = w1252->high[out->cp[i] - 0x80];
    return 0;
}

int dc_ftfy_fix_encoding(const dc_ustr *text, dc_ustr *out) {
    dc_ustr cur = {0}, next = {0};
    int rc = dc_ustr_append(&cur, text->cp, text->n);
    // Every step that changes the text decodes bytes (no more characters than
    // before) or replaces C1 controls for good; the bound only guards the loop.
    for (int step = 0; !rc && step < 1000; step++) {
        rc = fix_step(&cur, &next);
        if (rc || ustr_equal(&next, &cur)) break;
        dc_ustr t = cur;
        cur = next, next = t;
    }
    out->n = 0;
    if (!rc) rc = dc_ustr_append(out, cur.cp, cur.n);
    dc_ustr_free(&cur), dc_ustr_free(&next);
    return rc;
}
