// safetensors reader/writer, the JSON parser under it and atomic writes:
// round trips of every dtype, one crafted file per rejection rule, float
// conversions against hand-computed values, and a seeded mutation fuzz loop
// that must never crash, accept a tensor outside its buffer, or pass a
// changed file as verified. (Checksums in detail: test_checksum.c.)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/json.h"
#include "io/safetensors.h"

#include "check.h"

static char g_dir[64];

static char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

// ---- JSON ------------------------------------------------------------------

static int json_ok(const char *s, dc_json_doc *doc) { return dc_json_parse(doc, s, strlen(s), 0); }

static void json_rejects(const char *s, const char *why) {
    dc_json_doc doc;
    int rc = json_ok(s, &doc);
    CHECK(rc != 0 && strstr(dc_error(), why), "JSON %s accepted or wrong message '%s' (want '%s')", s,
          rc ? dc_error() : "", why);
    dc_json_free(&doc);
}

static void test_json(void) {
    dc_json_doc doc;
    const char *s = " {\"a\" : [1, -2.5e1, true, false, null, \"x\"], \"b\": {}, \"c\": [] } ";
    CHECK(json_ok(s, &doc) == 0, "parse: %s", dc_error());
    const dc_json *a = dc_json_get(doc.root, "a");
    CHECK(a && a->type == DC_JSON_ARRAY && a->nkids == 6, "array a");
    if (a && a->nkids == 6) {
        CHECK(a->kids[0].num == 1 && a->kids[1].num == -25, "numbers");
        CHECK(a->kids[2].type == DC_JSON_TRUE && a->kids[3].type == DC_JSON_FALSE &&
              a->kids[4].type == DC_JSON_NULL && strcmp(a->kids[5].str, "x") == 0, "literals");
    }
    CHECK(dc_json_get(doc.root, "b")->nkids == 0 && dc_json_get(doc.root, "zz") == NULL, "get");
    dc_json_free(&doc);

    // Escapes: U+00E9 as UTF-8 c3 a9, U+1F600 via a surrogate pair as f0 9f 98 80.
    s = "\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00 \\u0000z\"";
    CHECK(json_ok(s, &doc) == 0, "escapes: %s", dc_error());
    const char want[] = "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xf0\x9f\x98\x80 \0z";
    CHECK(doc.root && doc.root->len == sizeof want - 1 && memcmp(doc.root->str, want, sizeof want - 1) == 0,
          "escape decoding");
    CHECK(doc.root && !dc_json_is_cstr(doc.root), "embedded NUL is not a C string");
    dc_json_free(&doc);

    CHECK(json_ok("\"\xe2\x82\xac \xf4\x8f\xbf\xbf\"", &doc) == 0, "valid multibyte UTF-8");
    dc_json_free(&doc);

    uint64_t u;
    int64_t i;
    CHECK(json_ok("[18446744073709551615, 18446744073709551616, -9223372036854775808, -0, 1e2, 1.0]", &doc) == 0,
          "ints");
    const dc_json *k = doc.root->kids;
    CHECK(dc_json_get_u64(&k[0], &u) == 0 && u == UINT64_MAX, "u64 max");
    CHECK(dc_json_get_u64(&k[1], &u) != 0, "u64 overflow");
    CHECK(dc_json_get_i64(&k[2], &i) == 0 && i == INT64_MIN, "i64 min");
    CHECK(dc_json_get_u64(&k[2], &u) != 0, "negative is not u64");
    CHECK(dc_json_get_u64(&k[3], &u) == 0 && u == 0, "-0");
    CHECK(dc_json_get_u64(&k[4], &u) != 0 && dc_json_get_u64(&k[5], &u) != 0, "exponent/fraction not ints");
    CHECK(dc_json_get_i64(&k[0], &i) != 0, "i64 overflow");
    dc_json_free(&doc);

    json_rejects("", "expected a value");
    json_rejects("[1,]", "unexpected character");
    json_rejects("{\"a\":1,}", "expected a member name");
    json_rejects("{\"a\" 1}", "expected ':'");
    json_rejects("[1 2]", "expected ',' or ']'");
    json_rejects("01", "unexpected data");
    json_rejects("1.", "digit after '.'");
    json_rejects("-", "expected a digit");
    json_rejects("1e+", "exponent");
    json_rejects("+1", "unexpected character");
    json_rejects("tru", "invalid literal");
    json_rejects("nulll", "unexpected data");
    json_rejects("\"abc", "unterminated");
    json_rejects("\"abc\\", "unterminated");
    json_rejects("\"a\tb\"", "control character");
    json_rejects("\"\\x\"", "invalid escape");
    json_rejects("\"\\u12\"", "invalid \\u escape");
    json_rejects("\"\\u12G4\"", "invalid \\u escape");
    json_rejects("\"\\udc00\"", "unpaired low surrogate");
    json_rejects("\"\\ud800\"", "high surrogate");
    json_rejects("\"\\ud800\\u0041\"", "high surrogate");
    json_rejects("\"\xc0\x80\"", "UTF-8");          // overlong NUL
    json_rejects("\"\xed\xa0\x80\"", "UTF-8");      // encoded surrogate
    json_rejects("\"\xf4\x90\x80\x80\"", "UTF-8");  // above U+10FFFF
    json_rejects("\"\x80\"", "UTF-8");              // stray continuation
    json_rejects("\"\xe2\x82\"", "UTF-8");          // truncated sequence
    json_rejects("[1] x", "unexpected data");
    char deep[300];
    memset(deep, '[', 200), memset(deep + 200, ']', 99), deep[299] = 0;
    json_rejects(deep, "nesting too deep");
    CHECK(dc_json_parse(&doc, "[[[1]]]", 7, 2) != 0 && dc_json_parse(&doc, "[[[1]]]", 7, 3) == 0, "depth limit");
    dc_json_free(&doc);
    // The parser must stop at len, not at a NUL or beyond.
    CHECK(dc_json_parse(&doc, "[1]]", 3, 0) == 0, "len bound");
    dc_json_free(&doc);
    CHECK(dc_json_parse(&doc, "\"ab\"", 3, 0) != 0, "len bound on strings");

    // Options: duplicate keys refused (naming the key, at any depth, keys
    // compared as decoded bytes); Python's NaN / Infinity / -Infinity as numbers.
    const char *dup = "{\"a\": 1, \"b\": {\"k\": 1, \"x\": 2, \"k\": 3}}";
    CHECK(dc_json_parse(&doc, dup, strlen(dup), 0) == 0, "duplicates allowed by default (RFC 8259)");
    dc_json_free(&doc);
    CHECK(dc_json_parse_opts(&doc, dup, strlen(dup), 0, DC_JSON_UNIQUE_KEYS) != 0 && strstr(dc_error(), "'k'"),
          "duplicate refused: %s", dc_error());
    const char *esc = "{\"a\\u0062\": 1, \"ab\": 2}", *nul = "{\"a\\u0000\": 1, \"a\": 2}";
    CHECK(dc_json_parse_opts(&doc, esc, strlen(esc), 0, DC_JSON_UNIQUE_KEYS) != 0 && strstr(dc_error(), "'ab'"),
          "duplicate after decoding escapes: %s", dc_error());
    CHECK(dc_json_parse_opts(&doc, nul, strlen(nul), 0, DC_JSON_UNIQUE_KEYS) == 0, "\"a\\u0000\" is not \"a\"");
    dc_json_free(&doc);
    char many[40000];
    int m = snprintf(many, sizeof many, "{");
    for (int i = 0; i < 2000; i++) m += snprintf(many + m, sizeof many - (size_t)m, "\"k%d\": %d,", i, i);
    snprintf(many + m, sizeof many - (size_t)m, "\"k1999\": 0}");
    CHECK(dc_json_parse_opts(&doc, many, strlen(many), 0, DC_JSON_UNIQUE_KEYS) != 0 && strstr(dc_error(), "'k1999'"),
          "duplicate among 2001 keys: %s", dc_error());
    const char *py = "[NaN, Infinity, -Infinity, -1.5]";
    CHECK(dc_json_parse(&doc, py, strlen(py), 0) != 0, "NaN is not JSON by default");
    CHECK(dc_json_parse_opts(&doc, py, strlen(py), 0, DC_JSON_NONFINITE) == 0 && isnan(doc.root->kids[0].num) &&
              isinf(doc.root->kids[1].num) && doc.root->kids[1].num > 0 && isinf(doc.root->kids[2].num) &&
              doc.root->kids[2].num < 0 && doc.root->kids[3].num == -1.5,
          "NaN, Infinity, -Infinity with DC_JSON_NONFINITE");
    dc_json_free(&doc);
    CHECK(dc_json_parse_opts(&doc, "[-Inf]", 6, 0, DC_JSON_NONFINITE) != 0, "-Inf is not -Infinity");

    // Writer: escapes round-trip through the parser; invalid UTF-8 refused.
    char *buf = NULL;
    size_t blen = 0;
    FILE *ms = open_memstream(&buf, &blen);
    const char *orig = "a\"b\\c\n\x01\x1f\xc3\xa9\x7f";
    CHECK(dc_json_write_string(ms, orig) == 0, "write string");
    CHECK(dc_json_write_string(ms, "\xff") != 0 && strstr(dc_error(), "UTF-8"), "write rejects bad UTF-8");
    fclose(ms);
    CHECK(strncmp(buf, "\"a\\\"b\\\\c\\n\\u0001\\u001f\xc3\xa9\x7f\"", blen) == 0, "escaped form: %s", buf);
    CHECK(dc_json_parse(&doc, buf, blen, 0) == 0 && strcmp(doc.root->str, orig) == 0, "write/parse round trip");
    dc_json_free(&doc);
    free(buf);
}

// ---- round trips -----------------------------------------------------------

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool same_float(float a, float b) { return (isnan(a) && isnan(b)) || a == b; }

static void test_round_trip(void) {
    // U8 first with 3 bytes, so every later tensor starts at an odd offset.
    uint8_t u8[3] = {0, 255, 7};
    float f32[6] = {1.5f, -2.25f, 0.0f, 1e-3f, 65504.0f, -INFINITY};
    // F16 bits with values worked out by hand: 1, -2, 65504 (max), 2^-24
    // (smallest subnormal), 0x3555 = 1 + 341/1024 times 2^-2, +inf.
    uint16_t f16[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x7c00};
    float f16_want[6] = {1, -2, 65504, 5.9604644775390625e-8f, 0.333251953125f, INFINITY};
    // BF16: 1, -3, 0.25, 0x7f7f = (1 + 127/128) 2^127, 0x0001 = 2^-133, NaN.
    uint16_t bf16[6] = {0x3f80, 0xc040, 0x3e80, 0x7f7f, 0x0001, 0x7fc0};
    float bf16_want[6] = {1, -3, 0.25f, 3.3895313892515355e38f, bits_f32(0x00010000), NAN};
    double f64[3] = {0.1, -1e300, 3.5};
    float f64_want[3] = {0.1f, -INFINITY, 3.5f};
    int64_t i64[3] = {INT64_MIN, INT64_MAX, -1};
    int32_t i32[2] = {INT32_MIN, INT32_MAX};
    int16_t i16[2] = {-32768, 32767};
    int8_t i8[2] = {-128, 127};
    uint8_t bools[2] = {0, 1};
    // E4M3 (bias 7): 0x7e = 1.75 x 2^8 = 448, 0x08 = 2^-6, 0x01 = 2^-9, 0xb8 = -1, 0x7f = NaN.
    uint8_t e4m3[5] = {0x7e, 0x08, 0x01, 0xb8, 0x7f};
    float e4m3_want[5] = {448, 0.015625f, 0.001953125f, -1, NAN};
    // E5M2 (bias 15): 0x3c = 1, 0x7b = 1.75 x 2^15 = 57344, 0x7c = inf, 0x01 = 2^-16.
    uint8_t e5m2[4] = {0x3c, 0x7b, 0x7c, 0x01};
    float e5m2_want[4] = {1, 57344, INFINITY, 1.52587890625e-5f};
    float scalar = 7.0f;
    uint16_t u16[2] = {0, 65535};
    uint32_t u32[2] = {7, 4294967295u};
    uint64_t u64[2] = {123, UINT64_MAX};  // the second saturates to INT64_MAX when read
    dc_st_entry e[] = {
        {"u8", DC_U8, 1, {3}, u8},           {"blocks.0.attn.qkv.weight", DC_F32, 2, {3, 2}, f32},
        {"f16", DC_F16, 1, {6}, f16},        {"bf16", DC_BF16, 2, {2, 3}, bf16},
        {"f64", DC_F64, 1, {3}, f64},        {"i64", DC_I64, 1, {3}, i64},
        {"i32", DC_I32, 1, {2}, i32},        {"i16", DC_I16, 1, {2}, i16},
        {"i8", DC_I8, 1, {2}, i8},           {"bool", DC_BOOL, 1, {2}, bools},
        {"e4m3", DC_F8_E4M3, 1, {5}, e4m3},  {"e5m2", DC_F8_E5M2, 1, {4}, e5m2},
        {"empty", DC_F32, 1, {0}, NULL},     {"empty3", DC_I32, 3, {2, 0, 3}, NULL},
        {"scalar", DC_F32, 0, {0}, &scalar}, {"n\xc3\xa4me \"q\"", DC_U8, 1, {1}, u8},
        {"u16", DC_U16, 1, {2}, u16},        {"u32", DC_U32, 1, {2}, u32},
        {"u64", DC_U64, 1, {2}, u64},
    };
    int n = (int)(sizeof e / sizeof e[0]);
    const char *mk[] = {"format", "note"};
    const char *mv[] = {"pt", "quote \" backslash \\ newline \n \xc3\xa9 \xf0\x9f\x98\x80"};
    const char *path = tmp_path("all.safetensors");
    CHECK(dc_st_write(path, e, n, mk, mv, 2) == 0, "write: %s", dc_error());
    // In memory, and read on demand: the same tensors, values and refusals.
    for (int od = 0; od < 2; od++) {
        dc_st_file f;
        CHECK(dc_st_open_opts(&f, path, od ? DC_ST_ON_DEMAND : 0) == 0 && f.on_demand == od &&
              (od ? f.data == NULL : f.data != NULL), "open (on demand: %d): %s", od, dc_error());
        // the two pairs given, and the checksums the writer adds: one per tensor and one of the header
        CHECK(f.count == n && f.nmeta == 2 + n + 1 && f.verified, "counts %d %d", f.count, f.nmeta);
        CHECK(dc_st_meta(&f, "note") && strcmp(dc_st_meta(&f, "note"), mv[1]) == 0, "metadata value");
        CHECK(dc_st_meta(&f, "format") && !dc_st_meta(&f, "absent"), "metadata lookup");
        uint64_t hlen = 0;
        memcpy(&hlen, f.mem, 8);
        char last = f.mem ? ((char *)f.mem)[8 + hlen - 1] : 0;
        CHECK(hlen % 8 == 0 && (last == ' ' || last == '}'),
              "header padded to a multiple of 8 (%llu)", (unsigned long long)hlen);
        for (int i = 0; i < n && f.count == n; i++) {
            const dc_st_tensor *t = dc_st_find(&f, e[i].name);
            CHECK(t && t == &f.tensors[i], "find %s in order", e[i].name);
            if (!t) continue;
            CHECK(t->dtype == e[i].dtype && t->ndim == e[i].ndim, "dtype/rank of %s", e[i].name);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= e[i].shape[d];
            CHECK(memcmp(t->shape, e[i].shape, sizeof(int64_t) * (size_t)t->ndim) == 0 && t->numel == numel,
                  "shape of %s", e[i].name);
            size_t b = (size_t)numel * dc_dtype_size(t->dtype);
            uint8_t raw[64];
            CHECK(t->end - t->begin == b && b <= sizeof raw && dc_st_read_raw(&f, t, raw) == 0 &&
                  (b == 0 || memcmp(raw, e[i].data, b) == 0), "bytes of %s", e[i].name);
        }
        CHECK(dc_st_find(&f, "nope") == NULL, "find absent");

        float out[8];
        int64_t iout[8];
        struct { const char *name; const float *want; int n; } fl[] = {
            {"blocks.0.attn.qkv.weight", f32, 6}, {"f16", f16_want, 6}, {"bf16", bf16_want, 6},
            {"f64", f64_want, 3}, {"e4m3", e4m3_want, 5}, {"e5m2", e5m2_want, 4}, {"scalar", &scalar, 1},
        };
        for (size_t j = 0; j < sizeof fl / sizeof fl[0]; j++) {
            const dc_st_tensor *t = dc_st_find(&f, fl[j].name);
            CHECK(t && dc_st_read_f32(&f, t, out) == 0, "read_f32 %s", fl[j].name);
            for (int i = 0; t && i < fl[j].n; i++)
                CHECK(same_float(out[i], fl[j].want[i]), "%s[%d] = %.9g, want %.9g", fl[j].name, i, out[i],
                      fl[j].want[i]);
        }
        struct { const char *name; int64_t want[3]; int n; } in[] = {
            {"u8", {0, 255, 7}, 3}, {"i64", {INT64_MIN, INT64_MAX, -1}, 3}, {"i32", {INT32_MIN, INT32_MAX}, 2},
            {"i16", {-32768, 32767}, 2}, {"i8", {-128, 127}, 2}, {"bool", {0, 1}, 2},
            {"u16", {0, 65535}, 2}, {"u32", {7, 4294967295}, 2}, {"u64", {123, INT64_MAX}, 2},
        };
        for (size_t j = 0; j < sizeof in / sizeof in[0]; j++) {
            const dc_st_tensor *t = dc_st_find(&f, in[j].name);
            CHECK(t && dc_st_read_i64(&f, t, iout) == 0 && memcmp(iout, in[j].want, 8 * (size_t)in[j].n) == 0,
                  "read_i64 %s", in[j].name);
        }
        CHECK(dc_st_read_i64(&f, dc_st_find(&f, "f16"), iout) != 0 && strstr(dc_error(), "'f16'") &&
              strstr(dc_error(), path), "float read as int names the tensor: %s", dc_error());
        CHECK(dc_st_read_f32(&f, dc_st_find(&f, "i32"), out) != 0 && strstr(dc_error(), "'i32'"),
              "int read as float names the tensor: %s", dc_error());
        CHECK(dc_st_read_f32(&f, dc_st_find(&f, "empty"), out) == 0, "empty read");

        // dc_st_serialize gives the very bytes of the file.
        uint8_t *mem;
        size_t len;
        CHECK(dc_st_serialize(e, n, mk, mv, 2, &mem, &len) == 0 &&
              (od ? f.mem_len == len - f.data_len && memcmp(mem, f.mem, f.mem_len) == 0
                  : len == f.mem_len && memcmp(mem, f.mem, len) == 0), "serialize == file");
        free(mem);
        dc_st_close(&f);
        dc_st_close(&f);  // idempotent
    }

    uint8_t *mem;
    size_t len;
    dc_st_file f;
    // An empty file set: only the header's checksum, padded to 8 bytes, no data.
    const char empty_hdr[] = "{\"__metadata__\":{\"checksum.__metadata__\":\"";
    CHECK(dc_st_serialize(NULL, 0, NULL, NULL, 0, &mem, &len) == 0 && len == 8 + 64 &&
          memcmp(mem + 8, empty_hdr, sizeof empty_hdr - 1) == 0 && memcmp(mem + 8 + 58, "\"}}   ", 6) == 0,
          "empty file layout");
    CHECK(dc_st_parse(&f, mem, len, "empty") == 0 && f.count == 0 && f.data_len == 0 && f.nmeta == 1, "empty parse");
    dc_st_close(&f);
    free(mem);

    // f32 -> f16/bf16 rounding, against values worked out by hand.
    CHECK(dc_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && dc_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02,
          "f16 round to even");
    CHECK(dc_f32_to_f16(65520.0f) == 0x7c00 && dc_f32_to_f16(0x1p-25f) == 0x0000 &&
          dc_f32_to_f16(0x1.8p-25f) == 0x0001, "f16 overflow and subnormal rounding");
    CHECK(dc_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80 && dc_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82 &&
          dc_f32_to_bf16(-3.0f) == 0xc040, "bf16 round to even");
    // f16 -> f32 for all 65536 halves, against the value the fields define
    // ((-1)^s 2^(e-15) 1.m, or 2^-14 0.m for e = 0), worked in double; and
    // each finite one rounds back to itself.
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const int e = (h >> 10) & 31, m = h & 1023;
        const double sign = (h & 0x8000) ? -1 : 1;
        float got = dc_f16_to_f32((uint16_t)h);
        bool ok;
        if (e == 31 && m) ok = isnan(got);
        else {
            double want = e == 31 ? sign * INFINITY : e ? sign * ldexp(1 + m / 1024.0, e - 15) : sign * ldexp(m, -24);
            ok = (double)got == want && !signbit(got) == !signbit(want);
            ok = ok && dc_f32_to_f16(got) == h;
        }
        bad += !ok;
    }
    CHECK(bad == 0, "f16 -> f32: %d of 65536 halves wrong", bad);
}

static void test_atomic(void) {
    float v = 1;
    dc_st_entry ok[] = {{"a", DC_F32, 1, {1}, &v}};
    dc_st_entry dup[] = {{"a", DC_F32, 1, {1}, &v}, {"a", DC_F32, 1, {1}, &v}};
    const char *path = tmp_path("keep.safetensors");
    CHECK(dc_st_write(path, ok, 1, NULL, NULL, 0) == 0, "write");
    CHECK(dc_st_write(path, dup, 2, NULL, NULL, 0) != 0 && strstr(dc_error(), "duplicate"), "dup refused");
    const char *bad[] = {"x\xff"};
    CHECK(dc_st_write(path, ok, 1, bad, bad, 1) != 0 && strstr(dc_error(), "UTF-8"), "bad metadata refused");
    dc_st_file f;
    CHECK(dc_st_open(&f, path) == 0 && f.count == 1, "old file intact");
    dc_st_close(&f);
    // An aborted atomic write leaves the old file and no temporary.
    dc_atomic_file *af = dc_atomic_begin(path);
    CHECK(af != NULL, "begin");
    fputs("garbage", dc_atomic_stream(af));
    CHECK(dc_atomic_end(af, 0) != 0, "abort");
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(!dc_file_exists(tmp) && dc_st_open(&f, path) == 0, "abort leaves old file, no temp");
    dc_st_close(&f);
    CHECK(dc_st_write(tmp_path("no/such/dir/x.safetensors"), ok, 1, NULL, NULL, 0) != 0 &&
          strstr(dc_error(), "no/such/dir"), "missing dir: %s", dc_error());
    // Only a regular file may be replaced: a directory, a FIFO or a device is
    // refused before anything is written (rename() would replace a FIFO or,
    // for root, /dev/null itself with a regular file).
    const char *dir = tmp_path("m");
    CHECK(dc_mkdir_p(dir) == 0 && dc_st_write(dir, ok, 1, NULL, NULL, 0) != 0 &&
          strstr(dc_error(), "is a directory, not a regular file"), "write over a directory: %s", dc_error());
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    CHECK(!dc_file_exists(tmp), "no temporary left beside a refused target");
    const char *fifo = tmp_path("fifo");
    struct stat st;
    CHECK(mkfifo(fifo, 0600) == 0 && dc_st_write(fifo, ok, 1, NULL, NULL, 0) != 0 && strstr(dc_error(), "is a FIFO"),
          "write over a FIFO refused: %s", dc_error());
    CHECK(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO is still a FIFO");
    // /dev/null: should begin wrongly succeed, ending with ok = 0 only removes the temporary.
    af = dc_atomic_begin("/dev/null");
    CHECK(af == NULL && strstr(dc_error(), "/dev/null is a character device"), "/dev/null refused: %s", dc_error());
    if (af) dc_atomic_end(af, 0);
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode), "/dev/null is still a device");
    // A symbolic link to a regular file may be replaced (the link by the new file).
    const char *link = tmp_path("link.safetensors");
    CHECK(symlink(path, link) == 0 && dc_st_write(link, ok, 1, NULL, NULL, 0) == 0, "write over a link: %s",
          dc_error());
    CHECK(dc_st_open(&f, tmp_path("absent.safetensors")) != 0 && strstr(dc_error(), "absent.safetensors"),
          "open absent");
    CHECK(dc_mkdir_p(tmp_path("m/n/o")) == 0 && dc_mkdir_p(tmp_path("m/n/o")) == 0, "mkdir -p");
    CHECK(stat(tmp_path("m/n/o"), &st) == 0 && S_ISDIR(st.st_mode), "mkdir -p made it");
    CHECK(dc_mkdir_p(tmp_path("keep.safetensors/sub")) != 0 && strstr(dc_error(), "not a directory"),
          "mkdir through a file: %s", dc_error());
}

// ---- rejections ------------------------------------------------------------

// 8-byte length, header, then `data_len` zero bytes; `hlen_override` >= 0 replaces the length.
static uint8_t *craft(const char *hdr, size_t data_len, int64_t hlen_override, size_t *len) {
    size_t h = strlen(hdr);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    uint64_t n = hlen_override >= 0 ? (uint64_t)hlen_override : h;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    memcpy(b + 8, hdr, h);
    return b;
}

static void rejects(const char *hdr, size_t data_len, int64_t hlen, const char *why) {
    size_t len;
    uint8_t *b = craft(hdr, data_len, hlen, &len);
    dc_st_file f;
    int rc = dc_st_parse(&f, b, len, "crafted.safetensors");
    const char *msg = dc_error();
    CHECK(rc != 0 && strncmp(msg, "crafted.safetensors: ", 21) == 0 && strstr(msg, why),
          "header %.80s: rc %d, message '%s', want '%s'", hdr, rc, rc ? msg : "", why);
    CHECK(f.count == 0 && f.mem == NULL, "failed parse leaves an empty file struct");
    free(b);
}

#define T(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_rejections(void) {
    dc_st_file f;
    CHECK(dc_st_parse(&f, "\x01\x00", 2, "crafted.safetensors") != 0 && strstr(dc_error(), "too short"), "short");
    CHECK(dc_st_parse(&f, NULL, 0, "crafted.safetensors") != 0, "zero bytes");
    rejects("{}", 0, 100000001, "exceeds the limit");
    rejects("{}", 0, 3, "shorter than 8 + header length 3");
    rejects("{}      ", 0, 9, "shorter than 8 + header length 9");
    rejects("{\"a\xff\":{}}", 0, -1, "not valid UTF-8");
    rejects("{\"a\":", 0, -1, "invalid JSON");
    rejects("{\"a\":{}} x", 0, -1, "invalid JSON");
    rejects("[]", 0, -1, "not a JSON object");
    rejects("{" T("a", "F32", "[1]", 0, 4) "," T("a", "F32", "[1]", 4, 8) "}", 8, -1, "duplicate tensor name 'a'");
    rejects("{" T("a", "F32", "[1]", 0, 4) "," T("b", "F32", "[1]", 8, 12) "}", 12, -1,
            "no tensor covers bytes [4, 8)");
    rejects("{" T("a", "F32", "[1]", 4, 8) "}", 8, -1, "no tensor covers bytes [0, 4)");
    rejects("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12, -1, "overlap");
    rejects("{" T("blocks.0.attn.qkv.weight", "F32", "[3, 2]", 0, 12) "}", 12, -1,
            "tensor 'blocks.0.attn.qkv.weight': data_offsets [0, 12) do not match shape [3, 2] x F32 = 24 bytes");
    rejects("{" T("a", "F32", "[4294967296, 4294967296]", 0, 4) "}", 4, -1, "overflows 64 bits");
    rejects("{" T("a", "I64", "[9223372036854775807, 1]", 0, 4) "}", 4, -1, "overflows 64 bits");
    rejects("{" T("a", "F32", "[9223372036854775808]", 0, 4) "}", 4, -1, "shape entry 0 is not a non-negative");
    rejects("{" T("a", "F32", "[1]", 0, 4) "}", 12, -1, "data buffer is 12 bytes but the tensors cover 4");
    rejects("{" T("a", "F32", "[2]", 0, 8) "}", 4, -1, "data buffer is 4 bytes but the tensors cover 8");
    rejects("{\"__metadata__\":{\"a\":1}}", 0, -1, "__metadata__ 'a' is not a string");
    rejects("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0, -1, "is not a string");
    rejects("{\"__metadata__\":[]}", 0, -1, "__metadata__ is not an object");
    rejects("{\"__metadata__\":{\"a\":\"x\",\"a\":\"y\"}}", 0, -1, "duplicate __metadata__ key 'a'");
    rejects("{\"__metadata__\":{},\"__metadata__\":{}}", 0, -1, "duplicate __metadata__");
    rejects("{" T("a", "U128", "[1]", 0, 2) "}", 2, -1, "unknown dtype 'U128'");
    rejects("{" T("a", "f32", "[1]", 0, 4) "}", 4, -1, "unknown dtype 'f32'");
    rejects("{\"a\":{\"dtype\":5,\"shape\":[],\"data_offsets\":[0,4]}}", 4, -1, "dtype is not a string");
    rejects("{" T("a", "F32", "[1]", 8, 4) "}", 8, -1, "data_offsets [8, 4) begin after they end");
    rejects("{" T("a", "F32", "[-1]", 0, 4) "}", 4, -1, "shape entry 0 is not a non-negative integer");
    rejects("{" T("a", "F32", "[1, 2.0]", 0, 8) "}", 8, -1, "shape entry 1 is not a non-negative integer");
    rejects("{" T("a", "F32", "[\"1\"]", 0, 4) "}", 4, -1, "shape entry 0 is not");
    rejects("{" T("a", "F32", "4", 0, 4) "}", 4, -1, "shape is not an array");
    rejects("{" T("a", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1, -1, "rank 9 exceeds the maximum of 8");
    rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, -1, "data_offsets is not two");
    rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, -1, "data_offsets is not two");
    rejects("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -1, "missing field 'dtype'");
    rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, -1, "unknown field 'x'");
    rejects("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -1,
            "field 'dtype' given twice");
    rejects("{\"a\":[]}", 0, -1, "tensor 'a': entry is not an object");
    rejects("{\"a\\u0000b\":{}}", 0, -1, "contains NUL");
    rejects("{\"a\":[[[[[[[[[[1]]]]]]]]]]}", 0, -1, "nesting too deep");

    // Accepted edge cases: zero-size tensors sharing an offset, rank 8, leading/trailing spaces.
    size_t len;
    uint8_t *b = craft(" {" T("z", "F32", "[0]", 0, 0) "," T("a", "U8", "[1,1,1,1,1,1,1,2]", 0, 2) ","
                       T("y", "BF16", "[0, 5]", 2, 2) "}  ", 2, -1, &len);
    CHECK(dc_st_parse(&f, b, len, "edge") == 0 && f.count == 3 && f.tensors[1].ndim == 8, "edge: %s", dc_error());
    dc_st_close(&f);
    free(b);
}

// ---- mutation fuzzing ------------------------------------------------------

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {  // splitmix64
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void mutate(uint8_t *b, size_t *len, size_t cap) {
    static const char interesting[] = "{}[]\",:\\0123456789-.eE uU \x80\xc3\xff";
    int k = rnd() % 2 ? 1 : 1 + (int)(rnd() % 4);
    for (int m = 0; m < k; m++) {
        size_t n = *len;
        // Aim most edits at the header, where the structure is.
        uint64_t hl = n >= 8 ? b[0] | (uint64_t)b[1] << 8 : n;
        size_t span = hl + 8 < n ? (size_t)hl + 8 : n;
        size_t at = n ? (size_t)(rnd() % (rnd() % 4 ? (span ? span : 1) : n)) : 0;
        switch (rnd() % 10) {
        case 0: if (at < n) b[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
        case 1: if (at < n) b[at] = (uint8_t)interesting[rnd() % (sizeof interesting - 1)]; break;
        case 2: *len = n ? (size_t)(rnd() % n) : 0; break;
        case 3: {  // insert up to 8 bytes
            size_t c = 1 + rnd() % 8;
            if (n + c > cap || at > n) break;
            memmove(b + at + c, b + at, n - at);
            for (size_t i = 0; i < c; i++) b[at + i] = rnd() % 3 ? (uint8_t)interesting[rnd() % 20] : (uint8_t)rnd();
            *len = n + c;
            break;
        }
        case 4: {  // delete a run
            size_t c = 1 + rnd() % 8;
            if (at + c > n) break;
            memmove(b + at, b + at + c, n - at - c);
            *len = n - c;
            break;
        }
        case 5: {  // header length: nudge, or anything
            if (n < 8) break;
            uint64_t v = 0;
            memcpy(&v, b, 8);
            uint64_t r = rnd();
            v = r % 3 == 0 ? r : r % 3 == 1 ? v + (r >> 8) % 17 - 8 : (r >> 8) % (n + 8);
            memcpy(b, &v, 8);
            break;
        }
        case 6: if (at < n) b[at] = (uint8_t)rnd(); break;
        case 8: case 9:  // change a digit of the header: shapes and offsets stay well-formed
            while (at < span && (b[at] < '0' || b[at] > '9')) at++;
            if (at < span) b[at] = (uint8_t)('0' + rnd() % 10);
            break;
        case 7: {  // copy a chunk of the file over another place
            size_t c = 1 + rnd() % 16, from = n ? (size_t)(rnd() % n) : 0;
            if (from + c <= n && at + c <= n) memmove(b + at, b + from, c);
            break;
        }
        }
    }
}

// Same tensors (names, dtypes, shapes, bytes) and metadata, whatever the layout.
static bool same_content(const dc_st_file *a, const dc_st_file *b) {
    if (a->count != b->count || a->nmeta != b->nmeta) return false;
    for (int i = 0; i < a->count; i++) {
        const dc_st_tensor *x = &a->tensors[i], *y = dc_st_find(b, x->name);
        if (!y || x->dtype != y->dtype || x->ndim != y->ndim ||
            memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) != 0 ||
            memcmp(a->data + x->begin, b->data + y->begin, (size_t)(x->end - x->begin)) != 0)
            return false;
    }
    for (int i = 0; i < a->nmeta; i++) {
        const char *v = dc_st_meta(b, a->meta_keys[i]);
        if (!v || strcmp(v, a->meta_values[i]) != 0) return false;
    }
    return true;
}

static void test_fuzz(int iters) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t iv[2] = {1, -1};
    uint16_t h[2] = {0x3c00, 0x4000};
    dc_st_entry e1[] = {{"a", DC_F32, 2, {2, 3}, v}, {"b", DC_I64, 1, {2}, iv}, {"c", DC_BF16, 1, {2}, h},
                        {"s", DC_U8, 0, {0}, "x"}, {"z", DC_F16, 1, {0}, NULL}};
    dc_st_entry e2[] = {{"w", DC_F16, 2, {1, 2}, h}, {"x", DC_I8, 1, {3}, "abc"}};
    const char *mk[] = {"k"}, *mv[] = {"v\xc3\xa9"};
    uint8_t *seeds[3];
    size_t seed_len[3];
    dc_st_serialize(e1, 5, mk, mv, 1, &seeds[0], &seed_len[0]);
    dc_st_serialize(e2, 2, NULL, NULL, 0, &seeds[1], &seed_len[1]);
    dc_st_serialize(NULL, 0, mk, mv, 1, &seeds[2], &seed_len[2]);
    dc_st_file orig[3];
    for (int i = 0; i < 3; i++) dc_st_parse(&orig[i], seeds[i], seed_len[i], "seed");
    size_t cap = 4096;
    uint8_t *b = malloc(cap);
    float *fo = malloc(64 * sizeof *fo);
    int64_t *io = malloc(64 * sizeof *io);
    int accepted = 0, rejected = 0, bad = 0, verified = 0;
    for (int it = 0; it < iters; it++) {
        int s = (int)(rnd() % 3);
        size_t len = seed_len[s];
        memcpy(b, seeds[s], len);
        mutate(b, &len, cap);
        dc_st_file f;
        dc_error_clear();
        // Every other file without its checksums, so the parser meets all the
        // mutations the checksums would stop.
        bool verify = it % 2 == 0;
        if (dc_st_parse_opts(&f, b, len, "fuzz", verify ? 0 : DC_ST_NO_VERIFY) != 0) {
            rejected++;
            if (strncmp(dc_error(), "fuzz: ", 6) != 0) bad++, printf("bad message: %s\n", dc_error());
            continue;
        }
        accepted++;
        // A file that passed verification holds the seed's content. Mutations
        // that rename every checksum key (in seed 2, its only one) leave a file
        // that looks as if it never had checksums, as files from elsewhere do:
        // it is read unverified (f.verified false), by design.
        if (verify && f.verified && !same_content(&f, &orig[s])) bad++, printf("a changed file passed verification\n");
        verified += verify && f.verified;
        for (int i = 0; i < f.count; i++) {
            const dc_st_tensor *t = &f.tensors[i];
            uint64_t sz = (uint64_t)t->numel * dc_dtype_size(t->dtype);
            if (t->begin > t->end || t->end > f.data_len || t->end - t->begin != sz ||
                f.data + t->end > (uint8_t *)f.mem + f.mem_len) {
                bad++, printf("tensor '%s' outside its buffer\n", t->name);
                continue;
            }
            if (t->numel <= 64) {  // mutations keep sizes small; reading checks bounds under ASan
                if (dc_st_read_f32(&f, t, fo) != 0 && dc_st_read_i64(&f, t, io) != 0) bad++;
            }
        }
        dc_st_close(&f);
    }
    CHECK(bad == 0, "fuzz: %d bad outcomes", bad);
    CHECK(accepted > 0 && rejected > iters / 2, "fuzz mix: %d accepted, %d rejected", accepted, rejected);
    printf("fuzz: %d mutated files, %d accepted (%d of them verified: same content as the seed), %d rejected\n",
           iters, accepted, verified, rejected);
    for (int i = 0; i < 3; i++) free(seeds[i]), dc_st_close(&orig[i]);
    free(b), free(fo), free(io);
}

// The process's resident memory in bytes (/proc/self/statm), or -1.
static double resident_bytes(void) {
    FILE *fp = fopen("/proc/self/statm", "r");
    long size, res;
    int ok = fp && fscanf(fp, "%ld %ld", &size, &res) == 2;
    if (fp) fclose(fp);
    return ok ? (double)res * (double)sysconf(_SC_PAGESIZE) : -1;
}

// The values of the files below, from a seed (the child process below
// makes them again).
static void fill_values(unsigned seed, float *head, float *big, int64_t n, float *tail) {
    srand(seed);
    for (int64_t i = 0; i < n; i++) big[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < 3; i++) head[i] = (float)rand(), tail[i] = -(float)rand();
}

// In a child process (this program run again with --cut PATH FLAGS N SEED):
// opens the file, truncates it to half its size, then loads it. With the data
// read on demand, every tensor past the cut is an error naming the file and
// one before it still reads; with the data in memory (read at open),
// everything reads as written. Then the same after truncating to nothing.
static int load_after_cut(const char *path, unsigned flags, int64_t n, unsigned seed) {
    float *want = malloc((size_t)n * sizeof *want), *back = malloc((size_t)n * sizeof *back);
    float head[3], tail[3], h[3], t[3];
    fill_values(seed, head, want, n, tail);
    dc_st_file f;
    struct stat st;
    if (dc_st_open_opts(&f, path, flags) != 0 || stat(path, &st) != 0)
        return printf("open %s: %s\n", path, dc_error()), 1;
    const dc_st_tensor *th = dc_st_find(&f, "head"), *tb = dc_st_find(&f, "big"), *tt = dc_st_find(&f, "tail");
    for (int cut = 0; cut < 2; cut++) {
        CHECK(truncate(path, cut ? 0 : st.st_size / 2) == 0, "truncate");
        char eb[1024], et[1024];
        int rb = dc_st_read_f32(&f, tb, back);
        snprintf(eb, sizeof eb, "%s", dc_error());
        int rt = dc_st_read_f32(&f, tt, t);
        snprintf(et, sizeof et, "%s", dc_error());
        int rh = dc_st_read_f32(&f, th, h);
        if (f.on_demand) {
            CHECK(rb != 0 && strstr(eb, path) && strstr(eb, "truncated"),
                  "a file cut to %s after opening: reading past the cut fails naming the file: %s",
                  cut ? "nothing" : "half", rb ? eb : "it read");
            CHECK(rt != 0 && strstr(et, path), "the last tensor after a cut: %s", rt ? et : "it read");
            CHECK(cut ? rh != 0 : rh == 0 && memcmp(h, head, sizeof h) == 0,
                  "the tensor before the cut %s", cut ? "fails once the file is empty" : "still reads");
        } else {
            CHECK(rb == 0 && rt == 0 && rh == 0 && memcmp(back, want, (size_t)n * 4) == 0 &&
                  memcmp(h, head, sizeof h) == 0 && memcmp(t, tail, sizeof t) == 0,
                  "a file read into memory loads as it was: %s", dc_error());
        }
    }
    free(want), free(back);
    dc_st_close(&f);
    return g_fail ? 1 : 0;
}

// Writes the file of n big values from seed, and has a child process load it
// after cutting it (load_after_cut): 0, or how the child ended. A signal, such
// as the SIGBUS a mapped file raised once truncated, fails the check instead
// of killing the test.
static int cut_in_child(const char *path, unsigned flags, int64_t n, unsigned seed, char *how, size_t cap) {
    float *big = malloc((size_t)n * sizeof *big), head[3], tail[3];
    fill_values(seed, head, big, n, tail);
    dc_st_entry e[] = {{"head", DC_F32, 1, {3}, head}, {"big", DC_F32, 1, {n}, big}, {"tail", DC_F32, 1, {3}, tail}};
    int rc = dc_st_write(path, e, 3, NULL, NULL, 0);
    free(big);
    if (rc) return snprintf(how, cap, "write: %s", dc_error()), -1;
    char a[3][32];
    snprintf(a[0], 32, "%u", flags), snprintf(a[1], 32, "%lld", (long long)n), snprintf(a[2], 32, "%u", seed);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_safetensors", "--cut", path, a[0], a[1], a[2], (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return snprintf(how, cap, "fork/wait failed"), -1;
    if (WIFSIGNALED(st))
        return snprintf(how, cap, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st))), -1;
    if (WEXITSTATUS(st)) return snprintf(how, cap, "exit status %d", WEXITSTATUS(st)), -1;
    return 0;
}

// Files of DC_ST_MEMORY_MAX bytes and more are read on demand: neither held
// in memory nor mapped. The same values and the same checksum verification
// (a flipped byte is found and named); opening costs the header's memory, not
// the file's; and a file truncated by someone else after it was opened is an
// error naming it, never a crash (a mapping raised SIGBUS at the first page
// past the new end). Small files, read whole when opened, load as they were.
static void test_on_demand(void) {
    const int64_t n = (DC_ST_MEMORY_MAX + (1 << 20)) / 4;
    const unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    float *big = malloc((size_t)n * sizeof *big), head[3], tail[3];
    fill_values(seed, head, big, n, tail);
    dc_st_entry e[] = {{"head", DC_F32, 1, {3}, head}, {"big", DC_F32, 1, {n}, big}, {"tail", DC_F32, 1, {3}, tail}};
    const char *path = tmp_path("big.safetensors");
    CHECK(dc_st_write(path, e, 3, NULL, NULL, 0) == 0, "write a 65 MiB file: %s", dc_error());
    dc_st_file f;
    double before = resident_bytes();
    CHECK(dc_st_open(&f, path) == 0 && f.on_demand && f.verified && !f.data,
          "a 65 MiB file opens to be read on demand, verified: %s", dc_error());
    double after = resident_bytes();
    CHECK(before > 0 && after - before < 8.0 * (1 << 20), "opening a 65 MiB file took %.1f MiB of memory",
          (after - before) / 1048576.0);
    float *back = malloc((size_t)n * sizeof *back);
    const dc_st_tensor *t = dc_st_find(&f, "big");
    CHECK(t && dc_st_read_f32(&f, t, back) == 0 && memcmp(back, big, (size_t)n * 4) == 0,
          "values read on demand (seed %u)", seed);
    const uint64_t at = f.data_at + t->begin + 12345;
    dc_st_close(&f);

    // F16 through the pieces of the converting reader, against dc_f16_to_f32 of each value.
    uint16_t *half = malloc((size_t)n * sizeof *half);
    for (int64_t i = 0; i < n; i++) half[i] = (uint16_t)rand();
    dc_st_entry eh[] = {{"h", DC_F16, 1, {n}, half}};
    const char *hpath = tmp_path("half.safetensors");
    CHECK(dc_st_write(hpath, eh, 1, NULL, NULL, 0) == 0 && dc_st_open_opts(&f, hpath, DC_ST_ON_DEMAND) == 0,
          "write and open an F16 file: %s", dc_error());
    int bad = dc_st_read_f32(&f, dc_st_find(&f, "h"), back) != 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        float want = dc_f16_to_f32(half[i]);
        bad = !(back[i] == want || (isnan(back[i]) && isnan(want)));
    }
    CHECK(!bad, "F16 values converted piece by piece (seed %u)", seed);
    dc_st_close(&f);
    free(half);

    // Cut while open: large files, verified or not, and small ones in memory and read on demand.
    char how[160];
    const char *small = tmp_path("small.safetensors");
    dc_st_entry es_cut[] = {{"big", DC_F32, 1, {1000}, big}};
    struct { const char *path; unsigned flags; int64_t n; } cases[] = {
        {path, 0, n}, {path, DC_ST_NO_VERIFY, n}, {small, 0, 1000}, {small, DC_ST_ON_DEMAND, 1000}};
    for (int i = 0; i < 4; i++)
        CHECK(cut_in_child(cases[i].path, cases[i].flags, cases[i].n, seed + i, how, sizeof how) == 0,
              "a file of %lld values cut while open (flags %u): %s", (long long)cases[i].n, cases[i].flags, how);

    // Files too short for a header, or cut inside the data, read either way: refused by name.
    const char *tiny = tmp_path("tiny.safetensors");
    const char bytes[] = "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":{}}";
    for (int od = 0; od < 2; od++)
        for (size_t n = 0; n <= 12; n += n < 9 ? 1 : 3) {
            FILE *fp = fopen(tiny, "wb");
            fwrite(bytes, 1, n, fp), fclose(fp);
            CHECK(dc_st_open_opts(&f, tiny, od ? DC_ST_ON_DEMAND : 0) != 0 && strstr(dc_error(), tiny),
                  "a file of %zu bytes (on demand: %d) is refused by name: %s", n, od, dc_error());
        }
    CHECK(dc_st_write(small, es_cut, 1, NULL, NULL, 0) == 0 && truncate(small, 200) == 0 &&
          dc_st_open_opts(&f, small, DC_ST_ON_DEMAND | DC_ST_NO_VERIFY) != 0 && strstr(dc_error(), "data buffer is"),
          "a file cut inside its data, read on demand, is refused when opened: %s", dc_error());

    // A flipped byte in a file read on demand is found when it is opened.
    CHECK(dc_st_write(path, e, 3, NULL, NULL, 0) == 0, "rewrite: %s", dc_error());
    FILE *fp = fopen(path, "r+b");
    fseek(fp, (long)at, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, (long)at, SEEK_SET);
    fputc(c ^ 0x20, fp);
    fclose(fp);
    CHECK(dc_st_open(&f, path) != 0 && strstr(dc_error(), "'big'"), "a flipped byte in a large file is named: %s",
          dc_error());
    free(big), free(back);
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "--cut") == 0)
        return load_after_cut(argv[2], (unsigned)atoi(argv[3]), atoll(argv[4]), (unsigned)strtoul(argv[5], NULL, 10));
    int iters = argc > 1 ? atoi(argv[1]) : 200000;
    snprintf(g_dir, sizeof g_dir, "/tmp/dc_test_st_XXXXXX");
    if (!mkdtemp(g_dir)) return perror("mkdtemp"), 1;
    test_json();
    test_round_trip();
    test_atomic();
    test_rejections();
    test_on_demand();
    test_fuzz(iters);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", g_dir);
    printf("test_safetensors: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
