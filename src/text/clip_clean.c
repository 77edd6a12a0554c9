#include "text/clip_clean.h"

#include <stdbool.h>
#include <string.h>

#include "core/error.h"
#include "text/ftfy_encoding.h"
#include "text/text_tables.h"

// An entity's value by name (ASCII, with its ';' where it has one), or NULL.
static const char *entity_find(const dc_text_entity *table, int count, const uint32_t *s, size_t len) {
    char name[40];
    if (len == 0 || len >= sizeof name) return NULL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] >= 0x80) return NULL;
        name[i] = (char)s[i];
    }
    name[len] = 0;
    int lo = 0, hi = count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, table[mid].name);
        if (c < 0) hi = mid - 1;
        else if (c > 0) lo = mid + 1;
        else return table[mid].value;
    }
    return NULL;
}

static bool is_digit(uint32_t c) { return c >= '0' && c <= '9'; }
static bool is_hex(uint32_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_alnum(uint32_t c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static unsigned hex_value(uint32_t c) { return is_digit(c) ? c - '0' : (c | 32) - 'a' + 10; }
static bool contains(const uint32_t *s, size_t n, uint32_t c) {
    for (size_t i = 0; i < n; i++)
        if (s[i] == c) return true;
    return false;
}

// ---- html.unescape -----------------------------------------------------------

// The character of a numeric reference (html._replace_charref). The caller
// stops accumulating digits past U+10FFFF: every such value is U+FFFD.
static int numeric_reference(dc_ustr *out, uint32_t num) {
    for (int i = 0; i < dc_html_invalid_charrefs_count; i++)
        if (dc_html_invalid_charrefs[i][0] == num) return dc_ustr_push(out, dc_html_invalid_charrefs[i][1]);
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return dc_ustr_push(out, 0xFFFD);
    for (int i = 0; i < dc_html_invalid_codepoints_count; i++)
        if (num >= dc_html_invalid_codepoints[i][0] && num <= dc_html_invalid_codepoints[i][1]) return 0;
    return dc_ustr_push(out, num);
}

static bool name_char(uint32_t c) {
    return c != '\t' && c != '\n' && c != '\f' && c != ' ' && c != '<' && c != '&' && c != '#' && c != ';';
}

// Python's html.unescape: the pattern
// &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?), each match replaced
// as html._replace_charref does: numbers by their character, names by the
// HTML5 table, else by their longest prefix in it that is a name ("&ampx" ->
// "&x"), else left as they are.
int dc_html_unescape(const dc_ustr *text, dc_ustr *out) {
    const uint32_t *s = text->cp;
    size_t n = text->n;
    out->n = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1, k;
        if (s[i] != '&' || j == n) {
            DC_TRY(dc_ustr_push(out, s[i++]));
            continue;
        }
        if (s[j] == '#') {
            uint32_t num = 0;
            k = j + 1;
            if (k < n && is_digit(s[k])) {
                for (; k < n && is_digit(s[k]); k++)
                    if (num <= 0x10FFFF) num = num * 10 + (s[k] - '0');
            } else if (k + 1 < n && (s[k] == 'x' || s[k] == 'X') && is_hex(s[k + 1])) {
                for (k++; k < n && is_hex(s[k]); k++)
                    if (num <= 0x10FFFF) num = num * 16 + hex_value(s[k]);
            } else {  // no reference: '#' cannot start a name
                DC_TRY(dc_ustr_push(out, s[i++]));
                continue;
            }
            if (k < n && s[k] == ';') k++;
            DC_TRY(numeric_reference(out, num));
            i = k;
            continue;
        }
        for (k = j; k < n && k - j < 32 && name_char(s[k]);) k++;
        if (k == j) {
            DC_TRY(dc_ustr_push(out, s[i++]));
            continue;
        }
        if (k < n && s[k] == ';') k++;
        const char *value = entity_find(dc_html5_entities, dc_html5_entities_count, s + j, k - j);
        size_t rest = k;  // the part of the match kept after the value
        for (size_t x = k - j - 1; !value && x >= 2; x--)
            if ((value = entity_find(dc_html5_entities, dc_html5_entities_count, s + j, x))) rest = j + x;
        if (value) {
            DC_TRY(dc_ustr_append_utf8(out, value));
            DC_TRY(dc_ustr_append(out, s + rest, k - rest));
        } else {
            DC_TRY(dc_ustr_append(out, s + i, k - i));
        }
        i = k;
    }
    return 0;
}

// ---- ftfy.fix_text's deterministic fixes -------------------------------------

// ftfy's unescape_html: matches of &#?[0-9A-Za-z]{1,24}; replaced when the
// name is an HTML5 name or one of ftfy's upper-case ones, or when it is a
// numeric reference that html.unescape decodes whole (no ';' left over).
static int ftfy_unescape(const dc_ustr *text, dc_ustr *out) {
    const uint32_t *s = text->cp;
    size_t n = text->n;
    out->n = 0;
    dc_ustr tmp = {0}, dec = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        bool hash = i + 1 < n && s[i + 1] == '#';
        size_t j = i + 1 + hash, k = j;
        if (s[i] == '&')
            while (k < n && is_alnum(s[k])) k++;
        if (k == j || k - j > 24 || k == n || s[k] != ';') {  // not a match (nor an '&')
            rc = dc_ustr_push(out, s[i++]);
            continue;
        }
        k++;  // the match is s[i, k)
        const char *value = NULL;
        if (!hash) {
            value = entity_find(dc_html5_entities, dc_html5_entities_count, s + i + 1, k - i - 1);
            if (!value) value = entity_find(dc_ftfy_upper_entities, dc_ftfy_upper_entities_count, s + i + 1, k - i - 1);
        }
        if (value) {
            rc = dc_ustr_append_utf8(out, value);
        } else if (hash) {
            tmp.n = 0;
            rc = dc_ustr_append(&tmp, s + i, k - i);
            if (!rc) rc = dc_html_unescape(&tmp, &dec);
            // html.unescape decodes at most a prefix ("&#12ab;" -> "\f" "ab;"): keep the match then
            if (!rc) rc = contains(dec.cp, dec.n, ';') ? dc_ustr_append(out, s + i, k - i)
                                                       : dc_ustr_append(out, dec.cp, dec.n);
        } else {
            rc = dc_ustr_append(out, s + i, k - i);
        }
        i = k;
    }
    dc_ustr_free(&tmp);
    dc_ustr_free(&dec);
    return rc;
}

// fix_latin_ligatures (ftfy's chardata.LIGATURES).
static const dc_uc_mapping k_ligatures[] = {
    {0x132, "IJ"}, {0x133, "ij"}, {0x149, "\xca\xbcn"}, {0x1C4, "D\xc5\xbd"}, {0x1C5, "D\xc5\xbe"},
    {0x1C6, "d\xc5\xbe"}, {0x1C7, "LJ"}, {0x1C8, "Lj"}, {0x1C9, "lj"}, {0x1CA, "NJ"}, {0x1CB, "Nj"},
    {0x1CC, "nj"}, {0x1F1, "DZ"}, {0x1F2, "Dz"}, {0x1F3, "dz"}, {0xFB00, "ff"}, {0xFB01, "fi"},
    {0xFB02, "fl"}, {0xFB03, "ffi"}, {0xFB04, "ffl"}, {0xFB05, "\xc5\xbft"}, {0xFB06, "st"},
};

static const char *mapping_find(const dc_uc_mapping *m, int count, uint32_t c) {
    int lo = 0, hi = count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < m[mid].cp) hi = mid - 1;
        else if (c > m[mid].cp) lo = mid + 1;
        else return m[mid].value;
    }
    return NULL;
}

// remove_control_chars (chardata.CONTROL_CHARS).
static bool ftfy_control(uint32_t c) {
    return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
           c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

// fix_c1_controls: U+0080..U+009F read as Windows-1252 bytes, as HTML5 reads
// them (the table of html.unescape's numeric references holds that map).
static uint32_t c1_control(uint32_t c) {
    if (c < 0x80 || c > 0x9F) return c;
    for (int t = 0; t < dc_html_invalid_charrefs_count; t++)
        if (dc_html_invalid_charrefs[t][0] == c) return dc_html_invalid_charrefs[t][1];
    return c;
}

// Replaces the characters that a table maps (str.translate).
static int translate(const dc_ustr *in, const dc_uc_mapping *m, int count, dc_ustr *out) {
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        const char *v = mapping_find(m, count, in->cp[i]);
        DC_TRY(v ? dc_ustr_append_utf8(out, v) : dc_ustr_push(out, in->cp[i]));
    }
    return 0;
}

// The character fixes of one pass, in ftfy's order, each over the whole text:
// fix_c1_controls, fix_latin_ligatures, fix_character_width, uncurl_quotes,
// fix_line_breaks, fix_surrogates (nothing to do: UTF-8 holds no surrogates),
// remove_terminal_escapes, remove_control_chars. Works in place in `text`.
static int ftfy_chars(dc_ustr *text, dc_ustr *tmp) {
    for (size_t i = 0; i < text->n; i++) text->cp[i] = c1_control(text->cp[i]);
    DC_TRY(translate(text, k_ligatures, (int)(sizeof k_ligatures / sizeof *k_ligatures), tmp));
    DC_TRY(translate(tmp, dc_ftfy_width, dc_ftfy_width_count, text));
    uint32_t *s = text->cp;
    size_t n = 0;
    for (size_t i = 0; i < text->n; i++) {
        uint32_t c = s[i];
        if (c >= 0x201C && c <= 0x201F) c = '"';
        else if (c == 0x2BC || (c >= 0x2018 && c <= 0x201B)) c = '\'';
        if (c == '\r' && i + 1 < text->n && s[i + 1] == '\n') continue;  // "\r\n" -> "\n"
        if (c == '\r' || c == 0x2028 || c == 0x2029 || c == 0x85) c = '\n';
        s[n++] = c;
    }
    text->n = n;
    // Terminal escapes \033[ (\d|;)* [a-zA-Z] go, then invisible controls.
    n = 0;
    for (size_t i = 0; i < text->n; i++) {
        if (s[i] == 0x1B && i + 1 < text->n && s[i + 1] == '[') {
            size_t k = i + 2;
            while (k < text->n && (s[k] == ';' || (dc_uc_flags(s[k]) & DC_UC_DIGIT))) k++;
            uint32_t end = k < text->n ? s[k] : 0;
            if ((end >= 'a' && end <= 'z') || (end >= 'A' && end <= 'Z')) {
                i = k;
                continue;
            }
        }
        if (!ftfy_control(s[i])) s[n++] = s[i];
    }
    text->n = n;
    return 0;
}

static bool ustr_equal(const dc_ustr *a, const dc_ustr *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->cp, b->cp, a->n * sizeof *a->cp));
}

static void ustr_swap(dc_ustr *a, dc_ustr *b) {
    dc_ustr t = *a;
    *a = *b, *b = t;
}

// ftfy.fix_and_explain on one segment: HTML unescaping, the mojibake repair
// (text/ftfy_encoding.h), the character fixes, then NFC, until the text stops
// changing. Each pass that changes anything either shortens the text
// (unescaping, re-decoding) or leaves it in a form the next pass keeps, so a
// few passes settle it; the bound guards the loop against a table error.
static int ftfy_segment(const uint32_t *s, size_t n, bool unescape, dc_ustr *out) {
    dc_ustr cur = {0}, a = {0}, b = {0};
    int rc = dc_ustr_append(&cur, s, n);
    for (int pass = 0; !rc && pass < 100; pass++) {
        b.n = 0;
        rc = unescape ? ftfy_unescape(&cur, &b) : dc_ustr_append(&b, cur.cp, cur.n);
        if (!rc) rc = dc_ftfy_fix_encoding(&b, &a);
        if (!rc) rc = ftfy_chars(&a, &b);
        if (!rc) rc = dc_uc_nfc(&a, &b);
        ustr_swap(&a, &b);
        if (rc || ustr_equal(&a, &cur)) break;
        ustr_swap(&a, &cur);
    }
    if (!rc) rc = dc_ustr_append(out, cur.cp, cur.n);
    dc_ustr_free(&cur), dc_ustr_free(&a), dc_ustr_free(&b);
    return rc;
}

// ftfy.fix_text: segments of at most a line (and at most max_decode_length,
// 10^6 characters); HTML unescaping stops for good at the first segment that
// holds '<' (ftfy's unescape_html="auto").
int dc_ftfy_fix_text(const dc_ustr *text, dc_ustr *out) {
    bool unescape = true;
    out->n = 0;
    for (size_t pos = 0; pos < text->n;) {
        size_t end = pos;
        while (end < text->n && text->cp[end] != '\n') end++;
        end = end < text->n ? end + 1 : end;
        if (end - pos > 1000000) end = pos + 1000000;
        if (unescape && contains(text->cp + pos, end - pos, '<')) unescape = false;
        DC_TRY(ftfy_segment(text->cp + pos, end - pos, unescape, out));
        pos = end;
    }
    return 0;
}

// ---- whitespace and case -------------------------------------------------------

static bool py_isspace(uint32_t c) {  // str.isspace(): regex's \s plus U+001C..U+001F
    return (dc_uc_flags(c) & DC_UC_CLASS_MASK) == DC_UC_SPACE || (c >= 0x1C && c <= 0x1F);
}

static void strip(dc_ustr *s) {
    size_t a = 0, b = s->n;
    while (a < b && py_isspace(s->cp[a])) a++;
    while (b > a && py_isspace(s->cp[b - 1])) b--;
    if (a) memmove(s->cp, s->cp + a, (b - a) * sizeof *s->cp);
    s->n = b - a;
}

int dc_clip_clean(const dc_ustr *text, dc_ustr *out) {
    dc_ustr a = {0}, b = {0};
    int rc = dc_ftfy_fix_text(text, &a);
    if (!rc) rc = dc_html_unescape(&a, &b);
    if (!rc) rc = dc_html_unescape(&b, &a);
    if (!rc) {
        strip(&a);  // basic_clean's strip()
        b.n = 0;
        for (size_t i = 0; i < a.n && !rc; i++) {  // regex.sub(r'\s+', ' ', text)
            bool space = (dc_uc_flags(a.cp[i]) & DC_UC_CLASS_MASK) == DC_UC_SPACE;
            if (!space) rc = dc_ustr_push(&b, a.cp[i]);
            else if (i == 0 || (dc_uc_flags(a.cp[i - 1]) & DC_UC_CLASS_MASK) != DC_UC_SPACE) rc = dc_ustr_push(&b, ' ');
        }
        strip(&b);
    }
    if (!rc) rc = dc_uc_lower(&b, out);
    dc_ustr_free(&a), dc_ustr_free(&b);
    return rc;
}
