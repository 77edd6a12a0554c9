// MDS data sets: golden shards written by mosaicml/streaming's MDSWriter logic
// (tools/mds_golden.py; uncompressed and zstd) read back value by value against
// the values the script recorded, the C writer's files byte-identical to
// those, fresh random data sets round-tripped through several shards, fp16
// values converted against a naive decoder in double, and hostile files
// (truncated, lying sizes and offsets, paths out of the folder, unsafe and
// unsupported encodings) refused with messages naming the file and field.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "io/mds.h"

#include "check.h"
#include "file_bytes.h"
#include "tmpdir.h"

#define GOLDEN "tests/golden/mds"

// ---- values.txt: SAMPLE COLUMN DTYPE NDIM SHAPE HEX

typedef struct {
    int sample;
    char column[64];
    int dtype, ndim;
    int64_t shape[8];
    uint8_t *bytes;
    size_t len;
} golden_value;

static int hexval(int c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

static int load_values(golden_value **out) {
    FILE *f = fopen(GOLDEN "/values.txt", "r");
    if (!f) return -1;
    int n = 0, cap = 0;
    golden_value *v = NULL;
    char shape[256], *hex = malloc(1 << 16);
    golden_value g;
    while (fscanf(f, "%d %63s %d %d %255s %65535s", &g.sample, g.column, &g.dtype, &g.ndim, shape, hex) == 6) {
        memset(g.shape, 0, sizeof g.shape);
        char *p = shape;
        for (int d = 0; d < g.ndim; d++) g.shape[d] = strtoll(p, &p, 10), p += *p == ',';
        g.len = strcmp(hex, "-") ? strlen(hex) / 2 : 0;
        g.bytes = malloc(g.len + 1);
        for (size_t i = 0; i < g.len; i++) g.bytes[i] = (uint8_t)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
        if (n == cap) v = realloc(v, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
        v[n++] = g;
    }
    free(hex);
    fclose(f);
    *out = v;
    return n;
}

// Every sample and column of the golden set in dir equals values.txt.
static void check_golden_read(const char *dir, const golden_value *v, int nv) {
    dc_mds_reader *r;
    if (dc_mds_open(&r, dir) != 0) {
        CHECK(0, "open %s: %s", dir, dc_error());
        return;
    }
    int ncols = dc_mds_columns(r);
    CHECK(ncols == 18 && dc_mds_shards(r) == 4, "%s: %d columns, %d shards", dir, ncols, dc_mds_shards(r));
    CHECK(dc_mds_samples(r) * ncols == nv, "%s: %lld samples for %d values", dir, (long long)dc_mds_samples(r), nv);
    dc_mds_sample s = {0};
    int bad = 0, last = -1;
    // backwards, so that shards are reopened in another order than written
    for (int k = nv - 1; k >= 0; k--) {
        const golden_value *g = &v[k];
        if (g->sample != last && dc_mds_read(r, g->sample, &s) != 0) {
            CHECK(0, "%s: read %d: %s", dir, g->sample, dc_error());
            break;
        }
        last = g->sample;
        int c = dc_mds_find(r, g->column);
        dc_mds_array a;
        if (c < 0 || dc_mds_decode(dc_mds_column_at(r, c), s.data[c], s.len[c], &a) != 0) {
            CHECK(0, "%s: sample %d column %s: %s", dir, g->sample, g->column, dc_error());
            bad++;
            continue;
        }
        int same = a.dtype == g->dtype && a.ndim == g->ndim &&
                   (size_t)a.count * dc_mds_dtype_size(a.dtype) == g->len && !memcmp(a.values, g->bytes, g->len);
        for (int d = 0; d < g->ndim && same; d++) same = a.shape[d] == g->shape[d];
        if (!same) {
            bad++;
            printf("  %s: sample %d column %s differs\n", dir, g->sample, g->column);
        }
    }
    CHECK(bad == 0, "%s: %d values differ", dir, bad);
    dc_mds_sample_free(&s);
    dc_mds_close(r);
}

// ---- the writer against the golden files

static const dc_mds_spec g_cols[] = {
    {"bytes", "bytes"}, {"caption", "str"}, {"meta", "json"}, {"count", "int"},
    {"latent", "ndarray:float16:2,3,4"}, {"tokens", "ndarray:int32"}, {"anything", "ndarray"},
    {"s_uint8", "uint8"}, {"s_uint16", "uint16"}, {"s_uint32", "uint32"}, {"s_uint64", "uint64"},
    {"s_int8", "int8"}, {"s_int16", "int16"}, {"s_int32", "int32"}, {"s_int64", "int64"},
    {"s_float16", "float16"}, {"s_float32", "float32"}, {"s_float64", "float64"},
};
enum { NCOLS = sizeof g_cols / sizeof g_cols[0] };

static void check_golden_write(const char *sub, int level, const golden_value *v, int nv) {
    char out[300], dir[300];
    snprintf(out, sizeof out, "%s", tmp_path(sub));
    snprintf(dir, sizeof dir, GOLDEN "/%s", sub);
    dc_mds_write_opts o = {level, 2500};
    dc_mds_writer *w;
    if (dc_mds_writer_open(&w, out, g_cols, NCOLS, &o) != 0) {
        CHECK(0, "writer open: %s", dc_error());
        return;
    }
    for (int k = 0; k < nv; k += NCOLS) {
        dc_mds_value vals[NCOLS];
        for (int c = 0; c < NCOLS; c++) {
            const golden_value *g = NULL;
            for (int j = k; j < k + NCOLS; j++)
                if (!strcmp(v[j].column, g_cols[c].name)) g = &v[j];
            vals[c] = (dc_mds_value){g->bytes, g->len, g->dtype, g->ndim, g->shape};
            if (strncmp(g_cols[c].encoding, "ndarray", 7)) vals[c].ndim = 0;
        }
        if (dc_mds_write(w, vals) != 0) {
            CHECK(0, "write sample %d: %s", v[k].sample, dc_error());
            dc_mds_writer_free(w);
            return;
        }
    }
    CHECK(dc_mds_writer_finish(w) == 0, "finish: %s", dc_error());
    const char *names[] = {"index.json", "shard.00000.mds", "shard.00001.mds", "shard.00002.mds", "shard.00003.mds"};
    for (int i = 0; i < 5; i++) {
        char a[400], b[400];
        snprintf(a, sizeof a, "%s/%s%s", out, names[i], level && i ? ".zstd" : "");
        snprintf(b, sizeof b, "%s/%s%s", dir, names[i], level && i ? ".zstd" : "");
        CHECK(same_file(a, b), "%s differs from %s", a, b);
    }
    check_golden_read(out, v, nv);
}

// ---- fresh random data sets

static float half_ref(uint16_t h) {  // IEEE binary16, decoded in double
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

// Random latents (fp16 4x8x8), captions and sizes through several shards,
// compressed or not: every value comes back, shards keep to the size limit.
static void check_roundtrip(int level) {
    const char *out = tmp_path(level ? "rt_zstd" : "rt_plain");
    enum { N = 37 };
    dc_mds_spec cols[] = {{"latents", "ndarray:float16:4,8,8"}, {"caption", "str"}, {"size", "ndarray:int64:2"}};
    dc_mds_write_opts o = {level, 2000};
    dc_mds_writer *w;
    CHECK(dc_mds_writer_open(&w, out, cols, 3, &o) == 0, "open: %s", dc_error());
    static uint16_t lat[N][256];
    static char cap[N][64];
    int64_t size[N][2];
    uint64_t seed = 0x5eed0000u + (uint64_t)level;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 256; j++) lat[i][j] = (uint16_t)(dc_rand_u32_at(seed, (uint32_t)i, 0, 0, (uint32_t)j) & 0x7bff);
        int len = 1 + (int)(dc_rand_u32_at(seed, (uint32_t)i, 1, 0, 0) % 60);
        for (int j = 0; j < len; j++) cap[i][j] = (char)('a' + dc_rand_u32_at(seed, (uint32_t)i, 2, 0, (uint32_t)j) % 26);
        cap[i][len] = 0;
        size[i][0] = 1 + dc_rand_u32_at(seed, (uint32_t)i, 3, 0, 0) % 5000;
        size[i][1] = 1 + dc_rand_u32_at(seed, (uint32_t)i, 3, 0, 1) % 5000;
        dc_mds_value v[3] = {{lat[i], sizeof lat[i], DC_MDS_F16, 0, NULL}, {cap[i], strlen(cap[i]), 0, 0, NULL},
                             {size[i], sizeof size[i], DC_MDS_I64, 0, NULL}};
        CHECK(dc_mds_write(w, v) == 0, "write %d: %s", i, dc_error());
    }
    CHECK(dc_mds_writer_finish(w) == 0, "finish: %s", dc_error());
    dc_mds_reader *r;
    if (dc_mds_open(&r, out) != 0) {
        CHECK(0, "open %s: %s", out, dc_error());
        return;
    }
    CHECK(dc_mds_samples(r) == N && dc_mds_shards(r) > 3, "%lld samples in %d shards", (long long)dc_mds_samples(r),
          dc_mds_shards(r));
    for (int k = 0; k < dc_mds_shards(r); k++) {
        dc_mds_shard_info si = dc_mds_shard(r, k);
        CHECK(si.raw_bytes <= 2000 && si.samples > 0 && si.compressed == (level != 0), "shard %d: %lld bytes", k,
              (long long)si.raw_bytes);
    }
    int lc = dc_mds_find(r, "latents"), cc = dc_mds_find(r, "caption"), sc = dc_mds_find(r, "size");
    CHECK(lc >= 0 && cc >= 0 && sc >= 0, "columns: %s", dc_error());
    dc_mds_sample s = {0};
    int bad = 0;
    float f[256];
    for (int t = 0; t < 3 * N; t++) {
        int i = (int)((t * 17u) % N);  // jumping between shards
        dc_mds_array a, b, c;
        if (dc_mds_read(r, i, &s) != 0 || dc_mds_decode(dc_mds_column_at(r, lc), s.data[lc], s.len[lc], &a) ||
            dc_mds_decode(dc_mds_column_at(r, cc), s.data[cc], s.len[cc], &b) ||
            dc_mds_decode(dc_mds_column_at(r, sc), s.data[sc], s.len[sc], &c)) {
            CHECK(0, "sample %d: %s", i, dc_error());
            break;
        }
        dc_mds_to_f32(&a, f);
        for (int j = 0; j < 256; j++) bad += !(f[j] == half_ref(lat[i][j]));
        bad += a.count != 256 || a.ndim != 3 || a.shape[2] != 8 || b.count != (int64_t)strlen(cap[i]) ||
               memcmp(b.values, cap[i], (size_t)b.count) || c.count != 2 || memcmp(c.values, size[i], 16);
    }
    CHECK(bad == 0, "%d values differ after the round trip", bad);
    dc_mds_sample_free(&s);
    dc_mds_close(r);
}

// ---- refusals

static int open_fails(const char *dir, const char *want) {
    dc_mds_reader *r;
    if (dc_mds_open(&r, dir) == 0) {
        // the index may be fine; the shard is checked when first read
        dc_mds_sample s = {0};
        int rc = 0;
        for (int64_t i = 0; i < dc_mds_samples(r) && rc == 0; i++) rc = dc_mds_read(r, i, &s);
        dc_mds_sample_free(&s);
        dc_mds_close(r);
        if (rc == 0) return printf("  accepted (wanted \"%s\")\n", want), 0;
    }
    if (!strstr(dc_error(), want)) return printf("  message \"%s\" lacks \"%s\"\n", dc_error(), want), 0;
    return 1;
}

static void copy_set(const char *sub, const char *to) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r " GOLDEN "/%s '%s'", to, sub, to);
    if (system(cmd) != 0) exit(1);
}

static void copy_golden(const char *to) { copy_set("plain", to); }

static void replace_in_index(const char *dir, const char *from, const char *to) {
    char path[400];
    snprintf(path, sizeof path, "%s/index.json", dir);
    size_t n;
    char *t = (char *)slurp(path, &n);
    t[n] = 0;
    char *at = strstr(t, from);
    if (!at) printf("  \"%s\" not in the index\n", from), exit(1);
    FILE *f = fopen(path, "wb");
    fwrite(t, 1, (size_t)(at - t), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(t);
}

static void patch_u32(const char *path, long at, uint32_t v) {
    size_t n;
    uint8_t *b = slurp(path, &n);
    memcpy(b + at, &v, 4);
    spit(path, b, n);
    free(b);
}

static void check_refusals(void) {
    const char *d = tmp_path("bad");
    char shard[400];
    snprintf(shard, sizeof shard, "%s/shard.00001.mds", d);
    copy_golden(d);
    dc_mds_reader *r;
    CHECK(dc_mds_open(&r, d) == 0, "intact copy: %s", dc_error());
    dc_mds_close(r);

    copy_golden(d);
    replace_in_index(d, "\"bytes\": 3308", "\"bytes\": 3309");
    CHECK(open_fails(d, "shard.00001.mds: the file has 3308 bytes, the index says 3309"), "raw_data.bytes lie");
    copy_golden(d);
    truncate(shard, 3000);
    CHECK(open_fails(d, "shard.00001.mds: the file has 3000 bytes"), "truncated shard");
    copy_golden(d);
    patch_u32(shard, 0, 99);
    CHECK(open_fails(d, "shard.00001.mds: the shard holds 99 samples"), "sample count");
    copy_golden(d);
    patch_u32(shard, 8, 0xFFFFFF00u);
    CHECK(open_fails(d, "offsets"), "an offset past the end");
    copy_golden(d);
    patch_u32(shard, 4, 0);
    CHECK(open_fails(d, "offsets run from 0"), "an offset inside the offset table");
    // index.json edited: (set, text, replacement, the message's words)
    static const char *const edits[][4] = {
        {"plain", "\"shard.00000.mds\"", "\"../shard.00000.mds\"", "shard 0: raw_data.basename is not a file name"},
        {"plain", "\"samples\": ", "\"samples\": 1", "shard.00000.mds: the shard holds"},
        {"plain", "\"ndarray:int32\"", "\"pkl\"", "column \"tokens\" is pickled"},
        {"plain", "\"str\"", "\"jpeg\"", "column \"caption\" holds pictures (\"jpeg\")"},
        {"plain", "null, null, 8, 48", "null, null, 8, 47", "column \"latent\" (ndarray:float16:2,3,4) has size 47"},
        {"plain", "\"compression\": null", "\"compression\": \"br:11\"", "compression \"br:11\" is not supported"},
        {"plain", "\"version\": 2}", "\"version\": 3}", "\"version\" must be 2"},
        // zstd shards whose raw size lies either way
        {"zstd", "\"bytes\": 3312", "\"bytes\": 3311", "shard.00001.mds.zstd: decompresses past raw_data.bytes (3311)"},
        {"zstd", "\"bytes\": 3312", "\"bytes\": 3313", "shard.00001.mds.zstd: decompressed to 3312 bytes"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        copy_set(edits[i][0], d);
        replace_in_index(d, edits[i][1], edits[i][2]);
        CHECK(open_fails(d, edits[i][3]), "%s in the index as %s", edits[i][1], edits[i][2]);
    }
    CHECK(open_fails(tmp_path("nothing"), "nothing/index.json"), "no folder");
    // zstd shards: a cut frame, bytes that are not zstd
    copy_set("zstd", d);
    snprintf(shard, sizeof shard, "%s/shard.00001.mds.zstd", d);
    truncate(shard, 2000);
    replace_in_index(d, "\"bytes\": 2915", "\"bytes\": 2000");
    CHECK(open_fails(d, "shard.00001.mds.zstd: the zstd data ends inside a frame"), "a cut zstd frame");
    copy_set("zstd", d);
    patch_u32(shard, 0, 0x12345678u);
    CHECK(open_fails(d, "shard.00001.mds.zstd: zstd:"), "not zstd");

    // a writer that never finishes leaves no index: the folder is not a data set
    const char *half = tmp_path("half");
    dc_mds_spec col = {"x", "bytes"};
    dc_mds_write_opts o = {0, 300};
    dc_mds_writer *w;
    CHECK(dc_mds_writer_open(&w, half, &col, 1, &o) == 0, "open: %s", dc_error());
    uint8_t buf[100] = {1};
    for (int i = 0; i < 10; i++) dc_mds_write(w, &(dc_mds_value){buf, sizeof buf, 0, 0, NULL});
    dc_mds_writer_free(w);
    CHECK(open_fails(half, "index.json"), "an unfinished data set");
    // the writer's own refusals
    dc_mds_spec pk = {"obj", "pkl"}, two[] = {{"a", "int"}, {"a", "str"}};
    CHECK(dc_mds_writer_open(&w, tmp_path("w1"), &pk, 1, NULL) != 0 && strstr(dc_error(), "\"obj\""), "%s", dc_error());
    CHECK(dc_mds_writer_open(&w, tmp_path("w2"), two, 2, NULL) != 0 && strstr(dc_error(), "named twice"), "%s", dc_error());
    CHECK(dc_mds_writer_open(&w, tmp_path("bad"), two, 1, NULL) != 0 && strstr(dc_error(), "index.json"),
          "a finished data set is not overwritten: %s", dc_error());
    dc_mds_spec nd = {"v", "ndarray:float32:2,2"}, js = {"j", "json"};
    CHECK(dc_mds_writer_open(&w, tmp_path("w3"), &nd, 1, NULL) == 0, "%s", dc_error());
    float x[3] = {1, 2, 3};
    CHECK(dc_mds_write(w, &(dc_mds_value){x, sizeof x, DC_MDS_F32, 0, NULL}) != 0 && strstr(dc_error(), "12 bytes"),
          "3 floats for a 2x2 column: %s", dc_error());
    dc_mds_writer_free(w);
    CHECK(dc_mds_writer_open(&w, tmp_path("w4"), &js, 1, NULL) == 0, "%s", dc_error());
    CHECK(dc_mds_write(w, &(dc_mds_value){"{\"a\": ", 6, 0, 0, NULL}) != 0 && strstr(dc_error(), "\"j\""),
          "broken JSON: %s", dc_error());
    dc_mds_writer_free(w);
}

// Dynamic ndarray headers that lie about their shape or dtype.
static void check_decode_refusals(void) {
    dc_mds_column c;
    CHECK(dc_mds_column_parse(&c, "a", "ndarray") == 0, "%s", dc_error());
    dc_mds_array a;
    uint8_t ok[] = {DC_MDS_U16, 2 << 2 | 0, 2, 1, 7, 0, 9, 0};
    CHECK(dc_mds_decode(&c, ok, sizeof ok, &a) == 0 && a.count == 2 && a.shape[0] == 2, "%s", dc_error());
    uint8_t big[] = {DC_MDS_U16, 1 << 2 | 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0};
    CHECK(dc_mds_decode(&c, big, sizeof big, &a) != 0, "a huge dimension");
    uint8_t code[] = {7, 1 << 2, 1, 0};
    CHECK(dc_mds_decode(&c, code, sizeof code, &a) != 0 && strstr(dc_error(), "dtype code 7"), "%s", dc_error());
    uint8_t cut[] = {DC_MDS_F32, 1 << 2, 2, 0, 0, 0, 0};
    CHECK(dc_mds_decode(&c, cut, sizeof cut, &a) != 0, "values cut short");
    CHECK(dc_mds_decode(&c, ok, 3, &a) != 0, "a shape cut short");
    dc_mds_column_free(&c);
    CHECK(dc_mds_column_parse(&c, "b", "ndarray:float16:4,0") != 0, "a zero dimension");
    CHECK(dc_mds_column_parse(&c, "b", "ndarray:complex64") != 0, "an unknown dtype");
}

int main(void) {
    if (tmpdir_make("mds") != 0) return 1;
    golden_value *v;
    int nv = load_values(&v);
    CHECK(nv == 14 * NCOLS, "values.txt: %d values", nv);
    if (nv > 0) {
        check_golden_read(GOLDEN "/plain", v, nv);
        check_golden_read(GOLDEN "/zstd", v, nv);
        check_golden_write("plain", 0, v, nv);
        check_golden_write("zstd", 7, v, nv);
    }
    check_roundtrip(0);
    check_roundtrip(3);
    check_refusals();
    check_decode_refusals();
    for (int i = 0; i < nv; i++) free(v[i].bytes);
    free(v);
    tmpdir_remove();
    printf("test_mds: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
