#include "io/png_text.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

// Decodes one UTF-8 character at s (strict: no overlong forms, surrogates or
// values past U+10FFFF); its length, or 0 when s is not valid UTF-8.
static int utf8_decode(const unsigned char *s, unsigned *cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    int n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
    if (!n || s[0] >= 0xf5) return 0;
    unsigned v = s[0] & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    return *cp = v, n;
}

// The Latin-1 bytes of UTF-8 s into a new string; *latin1 is NULL when some
// character is past U+00FF. -1 when s is not UTF-8 or out of memory.
static int to_latin1(const char *s, char **latin1) {
    size_t len = strlen(s);
    char *out = malloc(len + 1), *o = out;
    if (!out) return -1;
    int fits = 1;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned cp;
        int k = utf8_decode(p, &cp);
        if (!k) return free(out), -1;
        if (cp > 0xff) fits = 0;
        *o++ = (char)cp;
        p += k;
    }
    *o = 0;
    if (!fits) free(out), out = NULL;
    *latin1 = out;
    return 0;
}

static char *latin1_to_utf8(const char *s, size_t len) {
    char *out = malloc(2 * len + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) *o++ = (char)c;
        else *o++ = (char)(0xc0 | c >> 6), *o++ = (char)(0x80 | (c & 0x3f));
    }
    *o = 0;
    return out;
}

int dc_png_text_chunks(const char *path, const dc_png_text *text, int n, png_text **out) {
    // what the reader takes back (dc_png_read_image refuses more)
    if (n > DC_PNG_MAX_TEXT) return dc_fail("%s: %d text chunks; at most %d", path, n, DC_PNG_MAX_TEXT);
    png_text *c = calloc((size_t)n, sizeof *c);
    if (!c) return dc_fail("%s: out of memory", path);
    for (int i = 0; i < n; i++) {
        const char *k = text[i].key, *v = text[i].value;
        size_t kl = k ? strlen(k) : 0;
        int ok = kl >= 1 && kl <= 79 && v;
        for (size_t j = 0; ok && j < kl; j++) ok = k[j] > ' ' - 1 && k[j] < 0x7f;
        if (!ok || k[0] == ' ' || k[kl - 1] == ' ' || strstr(k, "  ")) {
            dc_png_text_chunks_free(c, n);
            return dc_fail("%s: text key '%s' must be 1..79 printable ASCII characters without "
                           "leading, trailing or double spaces", path, k ? k : "(null)");
        }
        if (strlen(v) + kl + 5 > DC_PNG_MAX_CHUNK) {  // iTXt: key, 2 flags, 3 NULs
            dc_png_text_chunks_free(c, n);
            return dc_fail("%s: text '%s' is over %d bytes", path, k, DC_PNG_MAX_CHUNK - (int)kl - 5);
        }
        char *latin1;
        if (to_latin1(v, &latin1)) {
            dc_png_text_chunks_free(c, n);
            return dc_fail("%s: text '%s' is not UTF-8 (or out of memory)", path, k);
        }
        c[i].key = strdup(k);
        c[i].text = latin1 ? latin1 : strdup(v);
        c[i].compression = latin1 ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
        if (!c[i].key || !c[i].text) {
            dc_png_text_chunks_free(c, n);
            return dc_fail("%s: out of memory", path);
        }
    }
    *out = c;
    return 0;
}

void dc_png_text_chunks_free(png_text *chunks, int n) {
    if (!chunks) return;
    for (int i = 0; i < n; i++) free(chunks[i].key), free(chunks[i].text);
    free(chunks);
}

int dc_png_text_collect(const png_text *chunks, int n, dc_png_image *img) {
    if (n > DC_PNG_MAX_TEXT) n = DC_PNG_MAX_TEXT;
    if (n <= 0) return 0;
    img->keys = calloc((size_t)n, sizeof *img->keys);
    img->values = calloc((size_t)n, sizeof *img->values);
    if (!img->keys || !img->values) return -1;
    for (int i = 0; i < n; i++) {
        const png_text *t = &chunks[i];
        int utf8 = t->compression == PNG_ITXT_COMPRESSION_NONE || t->compression == PNG_ITXT_COMPRESSION_zTXt;
        size_t len = utf8 ? t->itxt_length : t->text_length;
        const char *s = t->text ? t->text : "";
        if (!t->text) len = 0;
        // Keys are Latin-1 in every kind of text chunk.
        img->keys[i] = latin1_to_utf8(t->key, strlen(t->key));
        img->values[i] = utf8 ? strndup(s, len) : latin1_to_utf8(s, len);
        img->ntext = i + 1;
        if (!img->keys[i] || !img->values[i]) return -1;
    }
    return 0;
}
