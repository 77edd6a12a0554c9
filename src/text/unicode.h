// Unicode text as code points: UTF-8 in and out, the character classes of the
// CLIP pre-tokenizer, Python's str.lower() and NFC normalisation, from the
// tables that tools/gen_text_tables.py generates (its header names the
// Unicode version).
#pragma once
#include <stddef.h>
#include <stdint.h>

// A growable string of code points.
typedef struct {
    uint32_t *cp;
    size_t n, cap;
} dc_ustr;

void dc_ustr_free(dc_ustr *s);
// Appends code points; -1 with a message when memory runs out.
int dc_ustr_push(dc_ustr *s, uint32_t c);
int dc_ustr_append(dc_ustr *s, const uint32_t *cp, size_t n);
// Appends the code points of UTF-8 text known to be valid (tables, entities).
int dc_ustr_append_utf8(dc_ustr *s, const char *utf8);

// Decodes UTF-8 text into out (which it resets). Text that is not valid
// UTF-8 is refused with a message naming `what` and the byte offset.
int dc_utf8_decode(const char *s, size_t n, const char *what, dc_ustr *out);
// Decodes the sequence at s[0, n): its code point and length, or 0 when it is
// not well-formed UTF-8 (overlong forms, surrogates and values above U+10FFFF
// included).
size_t dc_utf8_get(const unsigned char *s, size_t n, uint32_t *c);
// Writes the UTF-8 encoding of c (at most 4 bytes); returns its length.
size_t dc_utf8_put(uint32_t c, char *out);

// The class and case flags of a code point (DC_UC_* in text/text_tables.h).
unsigned dc_uc_flags(uint32_t c);
// out = Python's in.lower(): full lower-case mapping (U+0130 becomes two code
// points) and the Final_Sigma rule for U+03A3.
int dc_uc_lower(const dc_ustr *in, dc_ustr *out);
// out = unicodedata.normalize("NFC", in).
int dc_uc_nfc(const dc_ustr *in, dc_ustr *out);
