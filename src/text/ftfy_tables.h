// The data of ftfy's mojibake repair (text/ftfy_encoding.c), generated from
// ftfy itself by tools/gen_ftfy_tables.py (ftfy_tables.c). Internal to the
// text layer.
#pragma once
#include <stdbool.h>
#include <stdint.h>

// ftfy.badness.MOJIBAKE_CATEGORIES: the characters its badness heuristic
// reasons about.
#define DC_FTFY_COMMON (1u << 0)
#define DC_FTFY_C1 (1u << 1)
#define DC_FTFY_BAD (1u << 2)
#define DC_FTFY_LAW (1u << 3)
#define DC_FTFY_CURRENCY (1u << 4)
#define DC_FTFY_START_PUNCT (1u << 5)
#define DC_FTFY_END_PUNCT (1u << 6)
#define DC_FTFY_NUMERIC (1u << 7)
#define DC_FTFY_KAOMOJI (1u << 8)
#define DC_FTFY_UPPER_ACCENTED (1u << 9)
#define DC_FTFY_LOWER_ACCENTED (1u << 10)
#define DC_FTFY_UPPER_COMMON (1u << 11)
#define DC_FTFY_LOWER_COMMON (1u << 12)
#define DC_FTFY_BOX (1u << 13)
// ftfy.chardata.UTF8_CLUES: characters that single-byte encodings give for
// UTF-8 lead bytes of 2, 3 and 4 byte sequences and for continuation bytes
// (the strict set leaves out punctuation and the space that stands for 0xA0).
#define DC_FTFY_UTF8_FIRST2 (1u << 14)
#define DC_FTFY_UTF8_FIRST3 (1u << 15)
#define DC_FTFY_UTF8_FIRST4 (1u << 16)
#define DC_FTFY_UTF8_CONT (1u << 17)
#define DC_FTFY_UTF8_CONT_STRICT (1u << 18)
// Python re's \s (str.isspace()).
#define DC_FTFY_SPACE (1u << 19)

typedef struct {
    uint32_t cp, classes;
} dc_ftfy_class;
// Every code point with a class bit, sorted by code point.
extern const dc_ftfy_class dc_ftfy_classes[];
extern const int dc_ftfy_classes_count;

// Python re's \w for str patterns: sorted {first, last} ranges.
extern const uint32_t dc_ftfy_word[][2];
extern const int dc_ftfy_word_count;

// A single-byte encoding: bytes below 0x80 are ASCII except 0x1A, which is
// `sub` (U+FFFD in ftfy's sloppy codecs); each byte is a distinct character.
typedef struct {
    const char *name;
    bool lossy;       // replace_lossy_sequences applies (the sloppy codecs)
    bool restore_a0;  // restore_byte_a0 applies (not to macroman)
    uint32_t sub;
    uint32_t high[128];  // the characters of bytes 0x80..0xFF
} dc_ftfy_codec;
// ftfy.chardata.CHARMAP_ENCODINGS, in ftfy's order: latin-1 first, then
// sloppy-windows-1252 (DC_FTFY_SLOPPY_1252).
extern const dc_ftfy_codec dc_ftfy_codecs[];
extern const int dc_ftfy_codecs_count;
#define DC_FTFY_SLOPPY_1252 1
