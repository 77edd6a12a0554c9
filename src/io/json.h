// A small strict JSON parser (RFC 8259) for file headers and config metadata.
// It accepts exactly the grammar of the RFC, validates UTF-8 everywhere,
// decodes every string escape (surrogate pairs included), bounds nesting
// depth, and never reads past the `len` bytes it is given: the input need not
// be NUL-terminated, and anything a file holds yields a tree or a message.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    DC_JSON_NULL, DC_JSON_FALSE, DC_JSON_TRUE, DC_JSON_NUMBER, DC_JSON_STRING,
    DC_JSON_ARRAY, DC_JSON_OBJECT
} dc_json_type;

typedef struct dc_json dc_json;
struct dc_json {
    dc_json_type type;
    const char *key;  // member name when inside an object (decoded, NUL-terminated), else NULL
    size_t key_len;   // may be less than strlen-visible length if the key holds "\u0000"
    const char *str;  // STRING: decoded bytes; NUMBER: the literal as written. NUL-terminated.
    size_t len;       // bytes in str
    double num;       // NUMBER: nearest double
    dc_json *kids;    // ARRAY elements / OBJECT members, in document order
    int nkids;
};

typedef struct dc_json_block dc_json_block;
typedef struct {
    dc_json *root;
    dc_json_block *blocks;  // arena owning every node and string
} dc_json_doc;

#define DC_JSON_DEFAULT_DEPTH 64

// Options beyond the RFC's grammar (dc_json_parse_opts):
//   DC_JSON_UNIQUE_KEYS  an object naming a member twice is an error (the RFC
//                        allows it; Python keeps the last value, other readers
//                        the first, so a config file saying two things is refused)
//   DC_JSON_NONFINITE    NaN, Infinity and -Infinity are numbers, as Python's
//                        json module writes them (diffusers' scheduler configs
//                        hold "lambda_min_clipped": -Infinity)
enum { DC_JSON_UNIQUE_KEYS = 1u, DC_JSON_NONFINITE = 2u };

// Parses text[0, len) as one JSON value (surrounding whitespace allowed).
// max_depth bounds the nesting of arrays and objects (<= 0: the default).
// On failure returns -1 with a message giving the byte offset and the problem;
// doc is then empty and dc_json_free is still safe.
int dc_json_parse(dc_json_doc *doc, const char *text, size_t len, int max_depth);
// dc_json_parse with options (DC_JSON_UNIQUE_KEYS ...).
int dc_json_parse_opts(dc_json_doc *doc, const char *text, size_t len, int max_depth, unsigned flags);
void dc_json_free(dc_json_doc *doc);
// Reads and parses a JSON file of at most 16 MiB (config files), refusing
// duplicate keys; the message names the file (and the key).
int dc_json_read_file(dc_json_doc *doc, const char *path);
// dc_json_read_file with options (DC_JSON_UNIQUE_KEYS is always on).
int dc_json_read_file_opts(dc_json_doc *doc, const char *path, unsigned flags);

// The first member named `key` of an object, or NULL.
const dc_json *dc_json_get(const dc_json *obj, const char *key);
// A NUMBER written as a plain integer (no fraction, no exponent) that fits the
// target type; 0 or -1 (no message: the caller knows what the number meant).
int dc_json_get_u64(const dc_json *v, uint64_t *out);
int dc_json_get_i64(const dc_json *v, int64_t *out);
// True for a STRING with no embedded NUL, i.e. one usable as a C string.
bool dc_json_is_cstr(const dc_json *v);

// Offset of the first byte of s[0, n) that is not part of well-formed UTF-8
// (no overlongs, no surrogates, nothing above U+10FFFF), or -1 if all is valid.
int64_t dc_utf8_invalid_at(const char *s, size_t n);

// Writes s (NUL-terminated, UTF-8) as a quoted JSON string. Returns -1 with a
// message if s is not valid UTF-8 or the stream fails.
int dc_json_write_string(FILE *fp, const char *s);
// Writes v as JSON, objects and arrays one member a line indented by two
// spaces a level (depth: v's own), numbers as their literal was written, so a
// parsed file is written back with its values unchanged. -1 with a message if
// a string is not valid UTF-8 or the stream fails.
int dc_json_write(FILE *fp, const dc_json *v, int depth);
