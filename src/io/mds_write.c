// Writing MDS data sets as mosaicml/streaming's MDSWriter does
// (streaming/base/format/mds/writer.py, streaming/base/format/base/writer.py):
// samples gather in memory until the next would pass size_limit, then the
// shard is written in one piece. The JSON is written as Python's
// json.dumps(obj, sort_keys=True) writes it, so the bytes are streaming's.
// One difference: streaming writes an empty shard when a single sample is
// larger than size_limit; here that sample gets a shard of its own.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/json.h"
#include "io/mds.h"

typedef struct {
    int64_t samples;
    int64_t raw_bytes, zip_bytes;  // zip_bytes -1: uncompressed
} written;

struct dc_mds_writer {
    char *dir;
    int ncols;
    dc_mds_column *cols;  // sorted by name
    int *from;            // cols[i] is the caller's column from[i]
    int zstd_level;
    int64_t size_limit;
    char *config;         // the shard's JSON header
    size_t config_len;
    uint8_t *body;        // the current shard's samples, back to back
    size_t body_len, body_cap;
    uint32_t *ends;       // each sample's end within body
    int64_t nsamples, ends_cap;
    written *shards;
    int nshards, shards_cap;
};

// A string as Python's json.dumps writes it (ensure_ascii: everything past
// ASCII as \uXXXX, UTF-16 surrogate pairs above U+FFFF).
static void py_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *u = (const unsigned char *)s; *u;) {
        unsigned c = *u++;
        if (c >= 0x80) {  // valid UTF-8, checked when the column was named
            int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
            c &= 0x3F >> extra;
            while (extra--) c = c << 6 | (*u++ & 0x3F);
        }
        if (c == '"') fputs("\\\"", f);
        else if (c == '\\') fputs("\\\\", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\b') fputs("\\b", f);
        else if (c == '\f') fputs("\\f", f);
        else if (c < 0x20 || (c >= 0x80 && c < 0x10000)) fprintf(f, "\\u%04x", c);
        else if (c >= 0x10000) fprintf(f, "\\u%04x\\u%04x", 0xD800 + ((c - 0x10000) >> 10), 0xDC00 + ((c - 0x10000) & 0x3FF));
        else fputc((int)c, f);
    }
    fputc('"', f);
}

// The keys every shard shares (Writer.get_config and MDSWriter.get_config)
// up to "hashes", without the braces; json.dumps sorts them, and the index
// puts raw_data and samples between these and size_limit.
static void config_members(FILE *f, const dc_mds_writer *w) {
    const char *sep = "";
    fputs("\"column_encodings\": [", f);
    for (int i = 0; i < w->ncols; i++, sep = ", ") fputs(sep, f), py_json_string(f, w->cols[i].encoding);
    fputs("], \"column_names\": [", f);
    sep = "";
    for (int i = 0; i < w->ncols; i++, sep = ", ") fputs(sep, f), py_json_string(f, w->cols[i].name);
    fputs("], \"column_sizes\": [", f);
    sep = "";
    for (int i = 0; i < w->ncols; i++, sep = ", ") {
        if (w->cols[i].size >= 0) fprintf(f, "%s%lld", sep, (long long)w->cols[i].size);
        else fprintf(f, "%snull", sep);
    }
    fputs("], \"compression\": ", f);
    if (w->zstd_level) fprintf(f, "\"zstd:%d\"", w->zstd_level);
    else fputs("null", f);
    fputs(", \"format\": \"mds\", \"hashes\": []", f);
}

int dc_mds_writer_open(dc_mds_writer **out, const char *dir, const dc_mds_spec *cols, int ncols,
                       const dc_mds_write_opts *opts) {
    *out = NULL;
    if (ncols < 1) return dc_fail("%s: an MDS data set needs at least one column", dir);
    int level = opts ? opts->zstd_level : 0;
    int64_t limit = opts && opts->size_limit ? opts->size_limit : 1 << 26;
    if (level < 0 || level > 22) return dc_fail("%s: zstd level %d is not in 1..22", dir, level);
    if (limit < 0 || limit >= (1ll << 32)) return dc_fail("%s: size_limit must be below 2^32 (offsets are u32)", dir);
    DC_TRY(dc_mkdir_p(dir));
    dc_mds_writer *w = calloc(1, sizeof *w);
    if (!w) return dc_fail("out of memory");
    w->zstd_level = level;
    w->size_limit = limit;
    w->dir = strdup(dir);
    w->cols = calloc((size_t)ncols, sizeof *w->cols);
    w->from = calloc((size_t)ncols, sizeof *w->from);
    if (!w->dir || !w->cols || !w->from) return dc_mds_writer_free(w), dc_fail("out of memory");
    dc_mds_column *tmp = calloc((size_t)ncols, sizeof *tmp);
    int rc = tmp ? 0 : dc_fail("out of memory");
    for (int i = 0; i < ncols && rc == 0; i++) {
        if (dc_utf8_invalid_at(cols[i].name, strlen(cols[i].name)) >= 0) rc = dc_fail("%s: column name is not UTF-8", dir);
        else if (dc_mds_column_parse(&tmp[i], cols[i].name, cols[i].encoding) != 0) rc = dc_fail_ctx("%s", dir);
        w->from[i] = i;
    }
    // streaming stores columns sorted by name (byte order is code point order in UTF-8)
    for (int i = 1; i < ncols && rc == 0; i++)
        for (int j = i; j > 0 && strcmp(tmp[w->from[j - 1]].name, tmp[w->from[j]].name) > 0; j--) {
            int t = w->from[j];
            w->from[j] = w->from[j - 1];
            w->from[j - 1] = t;
        }
    for (int i = 0; i < ncols && tmp; i++) {
        w->cols[i] = tmp[w->from[i]];
        if (rc == 0 && i && !strcmp(w->cols[i].name, w->cols[i - 1].name))
            rc = dc_fail("%s: column \"%s\" is named twice", dir, w->cols[i].name);
    }
    w->ncols = tmp ? ncols : 0;
    free(tmp);
    if (rc) return dc_mds_writer_free(w), -1;
    char *index = malloc(strlen(dir) + 16);
    if (!index) return dc_mds_writer_free(w), dc_fail("out of memory");
    sprintf(index, "%s/index.json", dir);
    int exists = dc_file_exists(index);
    free(index);
    if (exists) return dc_mds_writer_free(w), dc_fail("%s holds a finished data set (index.json): not overwritten", dir);
    FILE *f = open_memstream(&w->config, &w->config_len);
    if (!f) return dc_mds_writer_free(w), dc_fail("out of memory");
    fputc('{', f);
    config_members(f, w);
    fprintf(f, ", \"size_limit\": %lld, \"version\": 2}", (long long)w->size_limit);
    if (fclose(f) != 0) return dc_mds_writer_free(w), dc_fail("out of memory");
    *out = w;
    return 0;
}

void dc_mds_writer_free(dc_mds_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->ncols; i++) dc_mds_column_free(&w->cols[i]);
    free(w->cols);
    free(w->from);
    free(w->dir);
    free(w->config);
    free(w->body);
    free(w->ends);
    free(w->shards);
    free(w);
}

// ---- samples

// The encoded bytes of one value: an ndarray's header (when its encoding
// leaves dtype or shape to the sample) before the values (NDArray.encode).
static int encode_head(const dc_mds_column *c, const dc_mds_value *v, uint8_t *head, size_t *n) {
    *n = 0;
    if (c->kind == DC_MDS_NDARRAY) {
        int dtype = c->dtype ? c->dtype : v->dtype;
        if (!dc_mds_dtype_size(dtype)) return dc_fail("column \"%s\": no dtype given for the array", c->name);
        if (c->dtype && v->dtype && v->dtype != c->dtype)
            return dc_fail("column \"%s\": array of %s, the column holds %s", c->name, dc_mds_dtype_name(v->dtype),
                           dc_mds_dtype_name(c->dtype));
        int ndim = v->ndim ? v->ndim : c->ndim;
        const int64_t *shape = v->ndim ? v->shape : c->shape;
        if (ndim < 1 || ndim > DC_MDS_MAX_DIMS) return dc_fail("column \"%s\": array rank %d", c->name, ndim);
        if (c->ndim && (ndim != c->ndim || memcmp(shape, c->shape, (size_t)ndim * sizeof *shape)))
            return dc_fail("column \"%s\": array's shape is not the column's", c->name);
        uint64_t count = 1, max = 0;
        for (int d = 0; d < ndim; d++) {
            if (shape[d] < 1) return dc_fail("column \"%s\": dimension %d is %lld", c->name, d, (long long)shape[d]);
            count *= (uint64_t)shape[d];
            if ((uint64_t)shape[d] > max) max = (uint64_t)shape[d];
        }
        if (count * dc_mds_dtype_size(dtype) != v->len)
            return dc_fail("column \"%s\": %zu bytes for %llu %s values", c->name, v->len, (unsigned long long)count,
                           dc_mds_dtype_name(dtype));
        if (!c->dtype) head[(*n)++] = (uint8_t)dtype;
        if (!c->ndim) {  // the smallest unsigned type that holds every dimension
            int lg = max < (1u << 8) ? 0 : max < (1u << 16) ? 1 : max < (1ull << 32) ? 2 : 3;
            head[(*n)++] = (uint8_t)(ndim << 2 | lg);
            for (int d = 0; d < ndim; d++)
                for (int b = 0; b < (1 << lg); b++) head[(*n)++] = (uint8_t)((uint64_t)shape[d] >> (8 * b));
        }
        return 0;
    }
    if (c->size >= 0 && v->len != (size_t)c->size)
        return dc_fail("column \"%s\": %zu bytes where %s takes %lld", c->name, v->len, c->encoding, (long long)c->size);
    if (c->kind == DC_MDS_STR && dc_utf8_invalid_at(v->data, v->len) >= 0)
        return dc_fail("column \"%s\": text is not UTF-8", c->name);
    if (c->is_json) {
        dc_json_doc doc;
        if (dc_json_parse_opts(&doc, v->data, v->len, 0, DC_JSON_NONFINITE) != 0)
            return dc_fail_ctx("column \"%s\" is not JSON", c->name);
        dc_json_free(&doc);
    }
    return 0;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return dc_fail("out of memory");
    *p = q;
    *cap = n;
    return 0;
}

static int flush_shard(dc_mds_writer *w);

int dc_mds_write(dc_mds_writer *w, const dc_mds_value *values) {
    enum { HEAD_MAX = 2 + DC_MDS_MAX_DIMS * 8 };
    uint8_t head[HEAD_MAX];
    size_t hn;
    uint64_t size = 0;
    for (int i = 0; i < w->ncols; i++) {  // sizes first, to decide the shard
        const dc_mds_value *v = &values[w->from[i]];
        DC_TRY(encode_head(&w->cols[i], v, head, &hn));
        size += hn + v->len + (w->cols[i].size < 0 ? 4 : 0);
    }
    // Writer.write: the shard so far (u32 count, u32 last offset, config, and
    // each sample with its u32 offset) plus this sample must fit size_limit.
    uint64_t shard_size = 8 + w->config_len + w->body_len + 4 * (uint64_t)w->nsamples;
    if (w->nsamples && shard_size + size + 4 > (uint64_t)w->size_limit) DC_TRY(flush_shard(w));
    if (shard_size + size + 4 > UINT32_MAX) return dc_fail("%s: a sample of %llu bytes does not fit a shard", w->dir, (unsigned long long)size);
    int64_t cap = (int64_t)w->body_cap;
    DC_TRY(grow((void **)&w->body, &cap, (int64_t)(w->body_len + size), 1));
    w->body_cap = (size_t)cap;
    DC_TRY(grow((void **)&w->ends, &w->ends_cap, w->nsamples + 1, sizeof *w->ends));
    uint8_t *p = w->body + w->body_len;
    uint8_t *sizes = p;
    for (int i = 0; i < w->ncols; i++) p += w->cols[i].size < 0 ? 4 : 0;
    for (int i = 0; i < w->ncols; i++) {
        const dc_mds_value *v = &values[w->from[i]];
        encode_head(&w->cols[i], v, head, &hn);  // succeeded above
        memcpy(p, head, hn);
        if (v->len) memcpy(p + hn, v->data, v->len);
        p += hn + v->len;
        if (w->cols[i].size < 0) {
            uint32_t n = (uint32_t)(hn + v->len);
            memcpy(sizes, &n, 4);
            sizes += 4;
        }
    }
    w->body_len += size;
    w->ends[w->nsamples++] = (uint32_t)w->body_len;
    return 0;
}

// ---- shards and the index

static int write_file(const char *path, const void *data, size_t n) {
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    int ok = fwrite(data, 1, n, dc_atomic_stream(af)) == n;
    if (dc_atomic_end(af, ok) != 0) return ok ? -1 : dc_fail("%s: write failed", path);
    return 0;
}

static char *shard_path(const dc_mds_writer *w, int k, int zip) {
    size_t n = strlen(w->dir) + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/shard.%05d.mds%s", w->dir, k, zip ? ".zstd" : "");
    return p;
}

// MDSWriter.encode_joint_shard: u32 count | u32 offsets[count + 1] | config | samples.
static int flush_shard(dc_mds_writer *w) {
    int64_t n = w->nsamples;
    size_t table = 4 + 4 * ((size_t)n + 1), total = table + w->config_len + w->body_len;
    uint8_t *raw = malloc(total);
    if (!raw) return dc_fail("out of memory");
    uint32_t v = (uint32_t)n, base = (uint32_t)(table + w->config_len);
    memcpy(raw, &v, 4);
    memcpy(raw + 4, &base, 4);
    for (int64_t i = 0; i < n; i++) v = base + w->ends[i], memcpy(raw + 8 + 4 * i, &v, 4);
    memcpy(raw + table, w->config, w->config_len);
    memcpy(raw + table + w->config_len, w->body, w->body_len);
    written s = {n, (int64_t)total, -1};
    int rc = 0;
    char *path = shard_path(w, w->nshards, w->zstd_level != 0);
    if (!path) rc = dc_fail("out of memory");
    else if (w->zstd_level) {
        size_t cap = ZSTD_compressBound(total);
        uint8_t *zip = malloc(cap);
        size_t zn = zip ? ZSTD_compress(zip, cap, raw, total, w->zstd_level) : 0;
        if (!zip) rc = dc_fail("out of memory");
        else if (ZSTD_isError(zn)) rc = dc_fail("%s: zstd: %s", path, ZSTD_getErrorName(zn));
        else rc = write_file(path, zip, zn), s.zip_bytes = (int64_t)zn;
        free(zip);
    } else rc = write_file(path, raw, total);
    free(path);
    free(raw);
    if (rc == 0) {
        int64_t cap = w->shards_cap;
        rc = grow((void **)&w->shards, &cap, w->nshards + 1, sizeof *w->shards);
        w->shards_cap = (int)cap;
    }
    if (rc) return rc;
    w->shards[w->nshards++] = s;
    w->body_len = 0;
    w->nsamples = 0;
    return 0;
}

// Writer._write_index: {"shards": [...], "version": 2}, each shard the
// config plus raw_data, samples and zip_data, keys sorted.
static int write_index(dc_mds_writer *w) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return dc_fail("out of memory");
    fputs("{\"shards\": [", f);
    for (int k = 0; k < w->nshards; k++) {
        const written *s = &w->shards[k];
        fputs(k ? ", {" : "{", f);
        config_members(f, w);
        fprintf(f, ", \"raw_data\": {\"basename\": \"shard.%05d.mds\", \"bytes\": %lld, \"hashes\": {}}, "
                   "\"samples\": %lld, \"size_limit\": %lld, \"version\": 2, \"zip_data\": ",
                k, (long long)s->raw_bytes, (long long)s->samples, (long long)w->size_limit);
        if (s->zip_bytes >= 0)
            fprintf(f, "{\"basename\": \"shard.%05d.mds.zstd\", \"bytes\": %lld, \"hashes\": {}}}", k, (long long)s->zip_bytes);
        else fputs("null}", f);
    }
    fputs("], \"version\": 2}", f);
    if (fclose(f) != 0) return free(text), dc_fail("out of memory");
    char *path = malloc(strlen(w->dir) + 16);
    int rc = path ? (sprintf(path, "%s/index.json", w->dir), write_file(path, text, len)) : dc_fail("out of memory");
    free(path);
    free(text);
    return rc;
}

int dc_mds_writer_finish(dc_mds_writer *w) {
    int rc = w->nsamples ? flush_shard(w) : 0;
    if (rc == 0) rc = write_index(w);
    dc_mds_writer_free(w);
    return rc;
}

void dc_mds_writer_progress(const dc_mds_writer *w, int *shards, int64_t *samples) {
    *shards = w->nshards;
    *samples = 0;
    for (int k = 0; k < w->nshards; k++) *samples += w->shards[k].samples;
}

// Reads shard k back and checks it is one this writer would have written.
static int check_shard(dc_mds_writer *w, int k, written *out) {
    char *path = shard_path(w, k, w->zstd_level != 0);
    if (!path) return dc_fail("out of memory");
    int64_t size;
    int fd = dc_open_regular(path, &size);
    uint8_t *file = NULL, *raw = NULL;
    int rc = fd < 0 ? -1 : 0;
    if (!rc && (size < 8 || size >= (1ll << 32))) rc = dc_fail("%s: %lld bytes is no shard of this writer", path, (long long)size);
    if (!rc && !(file = malloc((size_t)size))) rc = dc_fail("out of memory");
    if (!rc) rc = dc_pread_exact(fd, file, (size_t)size, 0, path);
    if (fd >= 0) close(fd);
    int64_t n = size;
    if (!rc && w->zstd_level) {
        unsigned long long want = ZSTD_getFrameContentSize(file, (size_t)size);
        if (want == ZSTD_CONTENTSIZE_ERROR || want == ZSTD_CONTENTSIZE_UNKNOWN || want < 8 || want >= (1ull << 32))
            rc = dc_fail("%s: not a zstd frame of a shard", path);
        else if (!(raw = malloc((size_t)want))) rc = dc_fail("out of memory");
        else {
            size_t got = ZSTD_decompress(raw, (size_t)want, file, (size_t)size);
            if (ZSTD_isError(got) || got != want) rc = dc_fail("%s: the zstd frame is damaged", path);
            n = (int64_t)want;
        }
    }
    const uint8_t *b = w->zstd_level ? raw : file;
    uint32_t count = 0, at, prev = 0;
    if (!rc) memcpy(&count, b, 4);
    const uint64_t table = 4 + 4 * ((uint64_t)count + 1);
    if (!rc && (count == 0 || table + w->config_len > (uint64_t)n || memcmp(b + table, w->config, w->config_len)))
        rc = dc_fail("%s was not written with these columns and options", path);
    for (uint32_t i = 0; i <= count && !rc; i++) {
        memcpy(&at, b + 4 + 4 * (uint64_t)i, 4);
        if ((i == 0 && at != table + w->config_len) || at < prev || at > (uint64_t)n || (i == count && at != (uint64_t)n))
            rc = dc_fail("%s: the sample offsets are damaged", path);
        prev = at;
    }
    if (!rc) *out = (written){count, n, w->zstd_level ? size : -1};
    free(file), free(raw), free(path);
    return rc;
}

int dc_mds_writer_resume(dc_mds_writer *w, int shards, int64_t *samples) {
    *samples = 0;
    if (w->nshards || w->nsamples) return dc_fail("%s: a writer resumes before it writes", w->dir);
    for (int k = 0; k < shards; k++) {
        written s;
        DC_TRY(check_shard(w, k, &s));
        int64_t cap = w->shards_cap;
        DC_TRY(grow((void **)&w->shards, &cap, w->nshards + 1, sizeof *w->shards));
        w->shards_cap = (int)cap;
        w->shards[w->nshards++] = s;
        *samples += s.samples;
    }
    return 0;
}
