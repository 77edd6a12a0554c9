// ftfy's mojibake repair (ftfy.fix_encoding, ftfy 6.x, under fix_text's
// default configuration): text that was UTF-8 but got decoded in a single-byte
// encoding ("cafÃ©", "â€œquotedâ€\x9d") is encoded back and decoded as UTF-8.
//
// ftfy acts only where its badness heuristic (ftfy.badness.is_bad: a regex of
// unlikely neighbours among the ~500 characters that mojibake is made of)
// finds something, so ASCII and ordinary text in any script pass unchanged.
// One step then tries, in order:
//   1. each of its single-byte encodings (latin-1, its "sloppy" Windows
//      codecs 1252, 1251, 1250, 1253, 1254, 1257, iso-8859-2, macroman,
//      cp437) that can encode the whole text, whose bytes then have
//      restore_byte_a0 (spaces that stood for byte 0xA0 put back; not for
//      macroman) and, for the sloppy codecs, replace_lossy_sequences (UTF-8
//      sequences with bytes lost to U+FFFD become U+FFFD) applied, and are
//      decoded as UTF-8, or as ftfy's "utf-8-variants" (CESU-8 surrogate pairs,
//      Java's C0 80 for U+0000) when they hold byte 0xED or 0xC0. The first
//      encoding whose bytes decode wins;
//   2. decode_inconsistent_utf8: each run of characters that looks like UTF-8
//      mojibake and that the heuristic calls bad is fixed on its own;
//   3. C1 controls read as Windows-1252 (fix_c1_controls).
// Steps repeat until the text stops changing (mojibake of mojibake unwinds).
#pragma once
#include <stdbool.h>

#include "text/unicode.h"

// out = ftfy.fix_encoding(text); out must not be text.
int dc_ftfy_fix_encoding(const dc_ustr *text, dc_ustr *out);
// ftfy.badness.is_bad(s): whether the heuristic sees mojibake in s[0, n).
bool dc_ftfy_is_bad(const uint32_t *s, size_t n);
