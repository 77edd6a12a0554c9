// The text clean-up in front of OpenAI's CLIP tokenizer (simple_tokenizer.py):
//
//   text = whitespace_clean(basic_clean(text)).lower()
//   basic_clean(text) = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
//   whitespace_clean(text) = regex.sub(r'\s+', ' ', text).strip()
//
// Everything but ftfy is reproduced exactly (html.unescape with all HTML5
// names and Python's rules for numeric and unterminated references; regex's
// \s; str.strip() and str.lower(), Final_Sigma included).
//
// ftfy.fix_text (ftfy 6.x, default configuration) is reproduced whole, its
// fixes applied as it applies them (line by line, repeated until nothing
// changes): its own HTML unescaping (names ending in ';' and upper-case names
// such as &EACUTE;, skipped once a line holds '<'), its mojibake repair
// (text/ftfy_encoding.h: "cafÃ©" -> "café", with its badness heuristic,
// single-byte encodings, restore_byte_a0, replace_lossy_sequences,
// decode_inconsistent_utf8 and C1 controls), C1 controls read as
// Windows-1252, Latin ligatures (U+FB01 -> "fi"), fullwidth and halfwidth
// forms, curly quotes (U+2018-U+201B and U+02BC -> ', U+201C-U+201F -> "),
// line breaks, terminal escapes, invisible control characters, and NFC
// normalisation.
#pragma once
#include "text/unicode.h"

// out = the cleaned, lower-cased text that the tokenizer's regex splits.
int dc_clip_clean(const dc_ustr *text, dc_ustr *out);
// out = ftfy.fix_text(text).
int dc_ftfy_fix_text(const dc_ustr *text, dc_ustr *out);
// out = Python's html.unescape(text).
int dc_html_unescape(const dc_ustr *text, dc_ustr *out);
