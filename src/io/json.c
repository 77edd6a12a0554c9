#include "io/json.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"

// ---- arena: every node and string of a document, freed in one go ----------

struct dc_json_block {
    dc_json_block *next;
    size_t used, cap;
    max_align_t data[];
};

static void *arena_alloc(dc_json_doc *doc, size_t size) {
    size = (size + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    dc_json_block *b = doc->blocks;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = doc->blocks, b->used = 0, b->cap = cap;
        doc->blocks = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p;
}

void dc_json_free(dc_json_doc *doc) {
    if (!doc) return;
    for (dc_json_block *b = doc->blocks, *next; b; b = next) next = b->next, free(b);
    doc->blocks = NULL, doc->root = NULL;
}

// ---- UTF-8 -----------------------------------------------------------------

// Length of the well-formed sequence at s[0, n), or 0 (Unicode 15, table 3-7).
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 0;  // continuation byte, overlong lead (c0, c1) or beyond U+10FFFF
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

int64_t dc_utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (!k) return (int64_t)i;
        i += k;
    }
    return -1;
}

static size_t utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

// ---- parser ----------------------------------------------------------------

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    int max_depth;
    unsigned flags;  // DC_JSON_UNIQUE_KEYS, DC_JSON_NONFINITE
    dc_json_doc *doc;
    dc_json *stack;  // children of the open arrays/objects, innermost last
    size_t stack_len, stack_cap;
} parser;

static int perr(const parser *p, const char *what) {
    if (p->pos >= p->n) return dc_fail("invalid JSON at byte %zu: %s (input ends)", p->pos, what);
    return dc_fail("invalid JSON at byte %zu: %s", p->pos, what);
}

static void skip_ws(parser *p) {
    while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int hex4(const parser *p, size_t at, uint32_t *out) {
    if (p->n - at < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p->s[at + i];
        int d = c >= '0' && c <= '9' ? (int)c - '0' : c >= 'a' && c <= 'f' ? (int)c - 'a' + 10
              : c >= 'A' && c <= 'F' ? (int)c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint32_t)d;
    }
    return *out = v, 0;
}

// p->pos is at the opening quote. Decodes into the arena.
static int parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = ++p->pos, end = start;
    // Find the closing quote first: the decoded text is never longer than the raw.
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) return p->pos = p->n, perr(p, "unterminated string");
    char *dst = arena_alloc(p->doc, end - start + 1);
    if (!dst) return dc_fail("out of memory parsing JSON");
    size_t o = 0;
    while (p->pos < end) {
        unsigned c = p->s[p->pos];
        if (c < 0x20) return perr(p, "control character in string (must be escaped)");
        if (c >= 0x80) {
            size_t k = utf8_seq(p->s + p->pos, end - p->pos);
            if (!k) return perr(p, "invalid UTF-8 in string");
            memcpy(dst + o, p->s + p->pos, k);
            o += k, p->pos += k;
            continue;
        }
        if (c != '\\') {
            dst[o++] = (char)c, p->pos++;
            continue;
        }
        unsigned e = p->s[p->pos + 1];  // in bounds: the scan above stopped past it
        const char *simple = strchr("\"\\/bfnrt", (int)e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            dst[o++] = map[simple - "\"\\/bfnrt"], p->pos += 2;
            continue;
        }
        if (e != 'u') return perr(p, "invalid escape in string");
        uint32_t cp, lo;
        if (hex4(p, p->pos + 2, &cp) || p->pos + 6 > end) return perr(p, "invalid \\u escape");
        p->pos += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff) return perr(p, "unpaired low surrogate in \\u escape");
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                hex4(p, p->pos + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                return perr(p, "high surrogate not followed by a low surrogate escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            p->pos += 6;
        }
        o += utf8_put(dst + o, cp);
    }
    dst[o] = 0;
    p->pos = end + 1;
    *out = dst, *out_len = o;
    return 0;
}

static int parse_number(parser *p, dc_json *v) {
    size_t start = p->pos;
    const unsigned char *s = p->s;
#define DIGIT(i) ((i) < p->n && s[i] >= '0' && s[i] <= '9')
    if (p->pos < p->n && s[p->pos] == '-') p->pos++;
    if (!DIGIT(p->pos)) return perr(p, "expected a digit");
    if (s[p->pos] == '0') p->pos++;  // no leading zeros
    else while (DIGIT(p->pos)) p->pos++;
    if (p->pos < p->n && s[p->pos] == '.') {
        p->pos++;
        if (!DIGIT(p->pos)) return perr(p, "expected a digit after '.'");
        while (DIGIT(p->pos)) p->pos++;
    }
    if (p->pos < p->n && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->n && (s[p->pos] == '+' || s[p->pos] == '-')) p->pos++;
        if (!DIGIT(p->pos)) return perr(p, "expected a digit in the exponent");
        while (DIGIT(p->pos)) p->pos++;
    }
#undef DIGIT
    size_t len = p->pos - start;
    char *lit = arena_alloc(p->doc, len + 1);
    if (!lit) return dc_fail("out of memory parsing JSON");
    memcpy(lit, s + start, len);
    lit[len] = 0;
    v->type = DC_JSON_NUMBER, v->str = lit, v->len = len;
    v->num = strtod(lit, NULL);  // the grammar checked above is a subset of strtod's
    return 0;
}

static int push_kid(parser *p, const dc_json *kid) {
    if (p->stack_len == p->stack_cap) {
        size_t cap = p->stack_cap ? p->stack_cap * 2 : 64;
        dc_json *s = realloc(p->stack, cap * sizeof *s);
        if (!s) return dc_fail("out of memory parsing JSON");
        p->stack = s, p->stack_cap = cap;
    }
    p->stack[p->stack_len++] = *kid;
    return 0;
}

static int cmp_keys(const void *a, const void *b) {
    const dc_json *x = *(const dc_json *const *)a, *y = *(const dc_json *const *)b;
    int c = memcmp(x->key, y->key, x->key_len < y->key_len ? x->key_len : y->key_len);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

// DC_JSON_UNIQUE_KEYS: the members kids[0, n) of the object that ends at
// p->pos name no key twice (sorted, so a large object costs n log n).
static int check_unique(const parser *p, const dc_json *kids, size_t n) {
    if (n < 2) return 0;
    const dc_json **ix = malloc(n * sizeof *ix);
    if (!ix) return dc_fail("out of memory parsing JSON");
    for (size_t i = 0; i < n; i++) ix[i] = &kids[i];
    qsort(ix, n, sizeof *ix, cmp_keys);
    const dc_json *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (!cmp_keys(&ix[i - 1], &ix[i])) dup = ix[i];
    free(ix);
    if (!dup) return 0;
    return dc_fail("duplicate key '%.200s' in the object that ends at byte %zu", dup->key, p->pos - 1);
}

// Moves the children pushed since `base` into the arena.
static int pop_kids(parser *p, size_t base, dc_json *v) {
    size_t n = p->stack_len - base;
    if (v->type == DC_JSON_OBJECT && (p->flags & DC_JSON_UNIQUE_KEYS) && n > 1)
        DC_TRY(check_unique(p, p->stack + base, n));
    if (n > INT_MAX) return perr(p, "too many elements");
    v->nkids = (int)n;
    if (n) {
        v->kids = arena_alloc(p->doc, n * sizeof(dc_json));
        if (!v->kids) return dc_fail("out of memory parsing JSON");
        memcpy(v->kids, p->stack + base, n * sizeof(dc_json));
    }
    p->stack_len = base;
    return 0;
}

static int parse_value(parser *p, dc_json *v, int depth);

// p->pos is at '[' or '{'.
static int parse_container(parser *p, dc_json *v, int depth) {
    bool obj = p->s[p->pos] == '{';
    char close = obj ? '}' : ']';
    if (depth >= p->max_depth) return perr(p, "nesting too deep");
    v->type = obj ? DC_JSON_OBJECT : DC_JSON_ARRAY;
    p->pos++;
    size_t base = p->stack_len;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
        return pop_kids(p, base, v);
    }
    for (;;) {
        dc_json kid = {0};
        skip_ws(p);
        if (obj) {
            if (p->pos >= p->n || p->s[p->pos] != '"') return perr(p, "expected a member name");
            DC_TRY(parse_string(p, &kid.key, &kid.key_len));
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':') return perr(p, "expected ':'");
            p->pos++;
        }
        DC_TRY(parse_value(p, &kid, depth + 1));
        DC_TRY(push_kid(p, &kid));
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->n && p->s[p->pos] == close) {
            p->pos++;
            return pop_kids(p, base, v);
        }
        return perr(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->n - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return perr(p, "invalid literal");
    p->pos += n;
    return 0;
}

// Fills *v except its key.
static int parse_value(parser *p, dc_json *v, int depth) {
    skip_ws(p);
    if (p->pos >= p->n) return perr(p, "expected a value");
    unsigned c = p->s[p->pos];
    switch (c) {
    case '{': case '[': return parse_container(p, v, depth);
    case '"': v->type = DC_JSON_STRING; return parse_string(p, &v->str, &v->len);
    case 't': v->type = DC_JSON_TRUE; return parse_literal(p, "true");
    case 'f': v->type = DC_JSON_FALSE; return parse_literal(p, "false");
    case 'n': v->type = DC_JSON_NULL; return parse_literal(p, "null");
    default:
        if ((p->flags & DC_JSON_NONFINITE) && (c == 'N' || c == 'I' || c == '-')) {
            static const char *const words[] = {"NaN", "Infinity", "-Infinity"};
            for (int k = 0; k < 3; k++) {
                size_t n = strlen(words[k]);
                if (p->n - p->pos >= n && !memcmp(p->s + p->pos, words[k], n)) {
                    p->pos += n;
                    v->type = DC_JSON_NUMBER, v->str = words[k], v->len = n;
                    v->num = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
                    return 0;
                }
            }
        }
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
        return perr(p, "unexpected character");
    }
}

int dc_json_parse(dc_json_doc *doc, const char *text, size_t len, int max_depth) {
    return dc_json_parse_opts(doc, text, len, max_depth, 0);
}

int dc_json_parse_opts(dc_json_doc *doc, const char *text, size_t len, int max_depth, unsigned flags) {
    doc->root = NULL, doc->blocks = NULL;
    if (!text && len) return dc_fail("invalid JSON: no input");
    parser p = {.s = (const unsigned char *)text, .n = len, .doc = doc, .flags = flags,
                .max_depth = max_depth > 0 ? max_depth : DC_JSON_DEFAULT_DEPTH};
    dc_json *root = arena_alloc(doc, sizeof *root);
    int rc = root ? 0 : dc_fail("out of memory parsing JSON");
    if (rc == 0) {
        *root = (dc_json){0};
        rc = parse_value(&p, root, 0);
    }
    if (rc == 0) {
        skip_ws(&p);
        if (p.pos != p.n) rc = perr(&p, "unexpected data after the value");
    }
    free(p.stack);
    if (rc != 0) return dc_json_free(doc), -1;
    doc->root = root;
    return 0;
}

// ---- access ----------------------------------------------------------------

const dc_json *dc_json_get(const dc_json *obj, const char *key) {
    if (!obj || obj->type != DC_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (int i = 0; i < obj->nkids; i++)
        if (obj->kids[i].key_len == n && memcmp(obj->kids[i].key, key, n) == 0) return &obj->kids[i];
    return NULL;
}

// Magnitude of a plain integer literal, saturating past UINT64_MAX (flagged).
static int plain_int(const dc_json *v, bool *neg, uint64_t *mag) {
    if (!v || v->type != DC_JSON_NUMBER) return -1;
    const char *s = v->str;
    *neg = *s == '-';
    s += *neg;
    uint64_t m = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;  // fraction or exponent
        unsigned d = (unsigned)(*s - '0');
        if (m > (UINT64_MAX - d) / 10) return -1;
        m = m * 10 + d;
    }
    return *mag = m, 0;
}

int dc_json_get_u64(const dc_json *v, uint64_t *out) {
    bool neg;
    uint64_t m;
    if (plain_int(v, &neg, &m) || (neg && m != 0)) return -1;
    return *out = m, 0;
}

int dc_json_get_i64(const dc_json *v, int64_t *out) {
    bool neg;
    uint64_t m;
    if (plain_int(v, &neg, &m)) return -1;
    if (neg) {
        if (m > (uint64_t)INT64_MAX + 1) return -1;
        *out = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    } else {
        if (m > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)m;
    }
    return 0;
}

bool dc_json_is_cstr(const dc_json *v) {
    return v && v->type == DC_JSON_STRING && strlen(v->str) == v->len;
}

// ---- writing ---------------------------------------------------------------

int dc_json_write_string(FILE *fp, const char *s) {
    size_t n = strlen(s);
    int64_t bad = dc_utf8_invalid_at(s, n);
    if (bad >= 0) return dc_fail("string \"%.64s\" is not valid UTF-8 at byte %lld", s, (long long)bad);
    fputc('"', fp);
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        switch (*u) {
        case '"': fputs("\\\"", fp); break;
        case '\\': fputs("\\\\", fp); break;
        case '\b': fputs("\\b", fp); break;
        case '\f': fputs("\\f", fp); break;
        case '\n': fputs("\\n", fp); break;
        case '\r': fputs("\\r", fp); break;
        case '\t': fputs("\\t", fp); break;
        default:
            if (*u < 0x20) fprintf(fp, "\\u%04x", *u);
            else fputc(*u, fp);
        }
    }
    fputc('"', fp);
    return ferror(fp) ? dc_fail("writing JSON string failed") : 0;
}

int dc_json_write(FILE *fp, const dc_json *v, int depth) {
    switch (v->type) {
    case DC_JSON_NULL: fputs("null", fp); break;
    case DC_JSON_FALSE: fputs("false", fp); break;
    case DC_JSON_TRUE: fputs("true", fp); break;
    case DC_JSON_NUMBER: fputs(v->str, fp); break;
    case DC_JSON_STRING: DC_TRY(dc_json_write_string(fp, v->str)); break;
    case DC_JSON_ARRAY:
    case DC_JSON_OBJECT: {
        bool obj = v->type == DC_JSON_OBJECT;
        fputc(obj ? '{' : '[', fp);
        for (int i = 0; i < v->nkids; i++) {
            fprintf(fp, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            if (obj) {
                DC_TRY(dc_json_write_string(fp, v->kids[i].key));
                fputs(": ", fp);
            }
            DC_TRY(dc_json_write(fp, &v->kids[i], depth + 1));
        }
        if (v->nkids) fprintf(fp, "\n%*s", 2 * depth, "");
        fputc(obj ? '}' : ']', fp);
        break;
    }
    }
    return ferror(fp) ? dc_fail("writing JSON failed") : 0;
}

int dc_json_read_file(dc_json_doc *doc, const char *path) { return dc_json_read_file_opts(doc, path, 0); }

int dc_json_read_file_opts(dc_json_doc *doc, const char *path, unsigned flags) {
    memset(doc, 0, sizeof *doc);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    if (size > (16 << 20)) return close(fd), dc_fail("%s: %lld bytes is too large for a config file", path, (long long)size);
    char *text = malloc((size_t)size + 1);
    if (!text) return close(fd), dc_fail("%s: out of memory", path);
    int rc = dc_read_exact(fd, text, (size_t)size, path);
    close(fd);
    if (rc == 0 && dc_json_parse_opts(doc, text, (size_t)size, 0, flags | DC_JSON_UNIQUE_KEYS) != 0)
        rc = dc_fail_ctx("%s", path);
    free(text);
    return rc;
}
