// Reading MDS data sets: index.json checked field by field, shards opened as
// samples are asked for. Nothing here trusts a size the file states: each is
// checked against the file's real size before anything is allocated for it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/json.h"
#include "io/mds.h"

// Shards kept open (a descriptor, or a decompressed copy in memory): reading
// samples in a shuffled order touches a few shards at a time.
enum { OPEN_SHARDS = 4 };

typedef struct {
    char *file;          // path of the file as stored (compressed or not)
    int64_t samples;
    int64_t raw_bytes;
    int64_t zip_bytes;   // -1 when not compressed
    int64_t first;       // global index of its first sample
} shard;

typedef struct {
    int shard;           // -1: empty slot
    int fd;              // uncompressed shards
    uint8_t *mem;        // compressed shards: the decompressed file
    uint64_t used;       // last use, for evicting the least recent
} slot;

struct dc_mds_reader {
    char *dir;
    int ncols;
    dc_mds_column *cols;
    int nshards;
    shard *shards;
    int64_t samples;
    slot open[OPEN_SHARDS];
    uint64_t clock;
};

// ---- index.json

static int get_int(const dc_json *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   const char *path, int k) {
    const dc_json *v = dc_json_get(obj, key);
    if (!v || dc_json_get_i64(v, out) != 0 || *out < lo || *out > hi)
        return dc_fail("%s: shard %d: \"%s\" is missing or not an integer in [%lld, %lld]", path, k, key,
                       (long long)lo, (long long)hi);
    return 0;
}

static const char *get_str(const dc_json *obj, const char *key) {
    const dc_json *v = dc_json_get(obj, key);
    return v && dc_json_is_cstr(v) ? v->str : NULL;
}

// A file name inside the data set's folder, never a path out of it.
static int plain_name(const char *s) {
    return s && *s && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

// The columns of shard k: on the first shard they define the data set's;
// every later shard must repeat them.
static int read_columns(dc_mds_reader *r, const dc_json *s, const char *path, int k) {
    const dc_json *names = dc_json_get(s, "column_names"), *encs = dc_json_get(s, "column_encodings"),
                  *sizes = dc_json_get(s, "column_sizes");
    if (!names || names->type != DC_JSON_ARRAY || !encs || encs->type != DC_JSON_ARRAY || !sizes ||
        sizes->type != DC_JSON_ARRAY || names->nkids != encs->nkids || names->nkids != sizes->nkids ||
        names->nkids < 1 || names->nkids > 4096)
        return dc_fail("%s: shard %d: column_names, column_encodings and column_sizes must be arrays of "
                       "one length (1 to 4096)", path, k);
    int n = names->nkids;
    if (k > 0 && n != r->ncols) return dc_fail("%s: shard %d has %d columns, shard 0 has %d", path, k, n, r->ncols);
    if (k == 0 && !(r->cols = calloc((size_t)n, sizeof *r->cols))) return dc_fail("out of memory");
    for (int i = 0; i < n; i++) {
        const dc_json *nm = &names->kids[i], *en = &encs->kids[i], *sz = &sizes->kids[i];
        if (!dc_json_is_cstr(nm) || !dc_json_is_cstr(en))
            return dc_fail("%s: shard %d: column %d's name and encoding must be strings", path, k, i);
        if (k == 0) {
            if (dc_mds_column_parse(&r->cols[i], nm->str, en->str) != 0) return dc_fail_ctx("%s", path);
            r->ncols = i + 1;
            for (int j = 0; j < i; j++)
                if (!strcmp(r->cols[j].name, nm->str)) return dc_fail("%s: column \"%s\" is named twice", path, nm->str);
        } else if (strcmp(r->cols[i].name, nm->str) || strcmp(r->cols[i].encoding, en->str))
            return dc_fail("%s: shard %d: column %d is \"%s\" (%s), shard 0's is \"%s\" (%s)", path, k, i, nm->str,
                           en->str, r->cols[i].name, r->cols[i].encoding);
        int64_t size = -1;
        if (sz->type != DC_JSON_NULL && (dc_json_get_i64(sz, &size) != 0 || size < 0))
            return dc_fail("%s: shard %d: column_sizes[%d] must be null or a byte count", path, k, i);
        if (size != r->cols[i].size)
            return dc_fail("%s: shard %d: column \"%s\" (%s) has size %lld in the index, the encoding says %lld",
                           path, k, nm->str, en->str, (long long)size, (long long)r->cols[i].size);
    }
    return 0;
}

static int read_shard(dc_mds_reader *r, const dc_json *s, const char *path, int k) {
    if (s->type != DC_JSON_OBJECT) return dc_fail("%s: shard %d is not an object", path, k);
    const char *format = get_str(s, "format");
    if (!format || strcmp(format, "mds"))
        return dc_fail("%s: shard %d: format \"%s\" is not \"mds\"", path, k, format ? format : "(none)");
    int64_t version;
    DC_TRY(get_int(s, "version", 2, 2, &version, path, k));
    DC_TRY(read_columns(r, s, path, k));
    shard *sh = &r->shards[k];
    // offsets are u32, so no shard holds more than 4 GiB, nor more samples than fit in it
    DC_TRY(get_int(s, "samples", 0, 1ll << 30, &sh->samples, path, k));
    const dc_json *raw = dc_json_get(s, "raw_data"), *zip = dc_json_get(s, "zip_data"),
                  *comp = dc_json_get(s, "compression");
    if (!raw || raw->type != DC_JSON_OBJECT) return dc_fail("%s: shard %d: raw_data is missing", path, k);
    DC_TRY(get_int(raw, "bytes", 8 + 4 * sh->samples, UINT32_MAX, &sh->raw_bytes, path, k));
    const char *raw_name = get_str(raw, "basename");
    if (!plain_name(raw_name)) return dc_fail("%s: shard %d: raw_data.basename is not a file name", path, k);
    const char *name = raw_name;
    sh->zip_bytes = -1;
    if (comp && comp->type != DC_JSON_NULL) {
        if (!dc_json_is_cstr(comp) || (strcmp(comp->str, "zstd") && strncmp(comp->str, "zstd:", 5)))
            return dc_fail("%s: shard %d: compression \"%s\" is not supported (zstd only)", path, k,
                           dc_json_is_cstr(comp) ? comp->str : "?");
        if (!zip || zip->type != DC_JSON_OBJECT) return dc_fail("%s: shard %d: zip_data is missing", path, k);
        DC_TRY(get_int(zip, "bytes", 1, INT64_MAX, &sh->zip_bytes, path, k));
        name = get_str(zip, "basename");
        if (!plain_name(name)) return dc_fail("%s: shard %d: zip_data.basename is not a file name", path, k);
    } else if (zip && zip->type != DC_JSON_NULL)
        return dc_fail("%s: shard %d: zip_data without compression", path, k);
    if (!(sh->file = join(r->dir, name))) return dc_fail("out of memory");
    sh->first = r->samples;
    r->samples += sh->samples;
    return 0;
}

static int read_index(dc_mds_reader *r) {
    char *path = join(r->dir, "index.json");
    if (!path) return dc_fail("out of memory");
    dc_json_doc doc;
    int rc = dc_json_read_file(&doc, path);
    if (rc == 0) {
        const dc_json *root = doc.root, *shards = dc_json_get(root, "shards");
        int64_t version;
        if (root->type != DC_JSON_OBJECT || dc_json_get_i64(dc_json_get(root, "version"), &version) != 0 || version != 2)
            rc = dc_fail("%s: \"version\" must be 2 (MDS index version 2)", path);
        else if (!shards || shards->type != DC_JSON_ARRAY || shards->nkids < 1)
            rc = dc_fail("%s: \"shards\" must be a non-empty array", path);
        else if (!(r->shards = calloc((size_t)shards->nkids, sizeof *r->shards)))
            rc = dc_fail("out of memory");
        else {
            r->nshards = shards->nkids;
            for (int k = 0; k < shards->nkids && rc == 0; k++) rc = read_shard(r, &shards->kids[k], path, k);
        }
    }
    dc_json_free(&doc);
    free(path);
    return rc;
}

int dc_mds_open(dc_mds_reader **out, const char *dir) {
    *out = NULL;
    dc_mds_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->dir = strdup(dir))) return free(r), dc_fail("out of memory");
    for (int i = 0; i < OPEN_SHARDS; i++) r->open[i].shard = -1, r->open[i].fd = -1;
    if (read_index(r) != 0) return dc_mds_close(r), -1;
    *out = r;
    return 0;
}

static void slot_clear(slot *s) {
    if (s->fd >= 0) close(s->fd);
    free(s->mem);
    s->fd = -1;
    s->mem = NULL;
    s->shard = -1;
}

void dc_mds_close(dc_mds_reader *r) {
    if (!r) return;
    for (int i = 0; i < OPEN_SHARDS; i++) slot_clear(&r->open[i]);
    for (int k = 0; k < r->nshards; k++) free(r->shards[k].file);
    for (int i = 0; i < r->ncols; i++) dc_mds_column_free(&r->cols[i]);
    free(r->shards);
    free(r->cols);
    free(r->dir);
    free(r);
}

int64_t dc_mds_samples(const dc_mds_reader *r) { return r->samples; }
int dc_mds_shards(const dc_mds_reader *r) { return r->nshards; }
int dc_mds_columns(const dc_mds_reader *r) { return r->ncols; }
const dc_mds_column *dc_mds_column_at(const dc_mds_reader *r, int i) { return &r->cols[i]; }

dc_mds_shard_info dc_mds_shard(const dc_mds_reader *r, int k) {
    dc_mds_shard_info s = {r->shards[k].samples, r->shards[k].raw_bytes, r->shards[k].zip_bytes >= 0};
    return s;
}

int dc_mds_find(const dc_mds_reader *r, const char *name) {
    for (int i = 0; i < r->ncols; i++)
        if (!strcmp(r->cols[i].name, name)) return i;
    char list[512] = "";
    for (int i = 0; i < r->ncols; i++) {
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s\"%s\"", i ? ", " : "", r->cols[i].name);
    }
    return dc_fail("%s: no column \"%s\" (the columns are %s)", r->dir, name, list);
}

// ---- shards

// Reads n bytes at `at` of the shard in slot s.
static int slot_read(const dc_mds_reader *r, const slot *s, void *dst, size_t n, uint64_t at) {
    const shard *sh = &r->shards[s->shard];
    if (at + n > (uint64_t)sh->raw_bytes) return dc_fail("%s: read past the shard's end", sh->file);
    if (s->mem) return memcpy(dst, s->mem + at, n), 0;
    return dc_pread_exact(s->fd, dst, n, at, sh->file);
}

// Decompresses the zstd file's bytes into exactly raw_bytes. The buffer
// grows with the output there really is, never past raw_bytes (+1, to notice
// more): a frame header's size is not trusted.
static int unzstd(const shard *sh, const uint8_t *zip, uint8_t **out) {
    size_t want = (size_t)sh->raw_bytes, max = want + 1, cap = (size_t)sh->zip_bytes * 4 + 65536, got = 0;
    if (cap > max) cap = max;
    uint8_t *raw = malloc(cap);
    ZSTD_DCtx *z = ZSTD_createDCtx();
    ZSTD_inBuffer in = {zip, (size_t)sh->zip_bytes, 0};
    int rc = raw && z ? 0 : dc_fail("out of memory");
    while (rc == 0) {
        ZSTD_outBuffer o = {raw, cap, got};
        size_t left = ZSTD_decompressStream(z, &o, &in);
        got = o.pos;
        if (ZSTD_isError(left)) rc = dc_fail("%s: zstd: %s", sh->file, ZSTD_getErrorName(left));
        else if (got > want) rc = dc_fail("%s: decompresses past raw_data.bytes (%lld)", sh->file, (long long)sh->raw_bytes);
        else if (left == 0 && in.pos == in.size) break;  // the last frame ended with the file
        else if (in.pos == in.size && got < cap) rc = dc_fail("%s: the zstd data ends inside a frame", sh->file);
        else if (got == cap) {
            cap = cap > max / 2 ? max : 2 * cap;
            uint8_t *bigger = realloc(raw, cap);
            if (!bigger) rc = dc_fail("out of memory");
            else raw = bigger;
        }
    }
    if (rc == 0 && got != want)
        rc = dc_fail("%s: decompressed to %zu bytes, raw_data.bytes says %lld", sh->file, got, (long long)sh->raw_bytes);
    ZSTD_freeDCtx(z);
    if (rc) free(raw);
    else *out = raw;
    return rc;
}

// The compressed file is read whole (its size was checked against the index)
// and decompressed into memory once.
static int decompress_shard(const shard *sh, int fd, uint8_t **out) {
    uint8_t *zip = malloc((size_t)sh->zip_bytes);
    int rc = zip ? dc_read_exact(fd, zip, (size_t)sh->zip_bytes, sh->file) : dc_fail("out of memory");
    if (rc == 0) rc = unzstd(sh, zip, out);
    free(zip);
    return rc;
}

// Opens shard k into slot s and checks its header: the file's real size is
// the index's, the sample count matches, and the offsets' ends lie inside it.
static int slot_load(dc_mds_reader *r, slot *s, int k) {
    const shard *sh = &r->shards[k];
    int64_t size;
    int fd = dc_open_regular(sh->file, &size);
    if (fd < 0) return -1;
    int64_t want = sh->zip_bytes >= 0 ? sh->zip_bytes : sh->raw_bytes;
    int rc = 0;
    if (size != want)
        rc = dc_fail("%s: the file has %lld bytes, the index says %lld", sh->file, (long long)size, (long long)want);
    else if (sh->zip_bytes >= 0) {
        rc = decompress_shard(sh, fd, &s->mem);
        close(fd);
        fd = -1;
    }
    s->fd = fd;
    s->shard = k;
    uint32_t head[2];
    if (rc == 0) rc = slot_read(r, s, head, 4, 0);
    if (rc == 0 && head[0] != sh->samples)
        rc = dc_fail("%s: the shard holds %u samples, the index says %lld", sh->file, head[0], (long long)sh->samples);
    uint64_t table_end = 4 + 4 * ((uint64_t)sh->samples + 1);
    if (rc == 0) rc = slot_read(r, s, &head[0], 4, 4);
    if (rc == 0) rc = slot_read(r, s, &head[1], 4, table_end - 4);
    if (rc == 0 && (head[0] < table_end || head[0] > head[1] || head[1] != sh->raw_bytes))
        rc = dc_fail("%s: sample offsets run from %u to %u in a file of %lld bytes", sh->file, head[0], head[1],
                     (long long)sh->raw_bytes);
    if (rc) slot_clear(s);
    return rc;
}

static slot *shard_slot(dc_mds_reader *r, int k) {
    slot *lru = &r->open[0];
    for (int i = 0; i < OPEN_SHARDS; i++) {
        if (r->open[i].shard == k) return r->open[i].used = ++r->clock, &r->open[i];
        if (r->open[i].used < lru->used) lru = &r->open[i];
    }
    slot_clear(lru);
    if (slot_load(r, lru, k) != 0) return NULL;
    lru->used = ++r->clock;
    return lru;
}

static int find_shard(const dc_mds_reader *r, int64_t i) {
    int lo = 0, hi = r->nshards - 1;
    while (lo < hi) {  // the last shard whose first sample is <= i: never an empty one
        int mid = (lo + hi + 1) / 2;
        if (r->shards[mid].first <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Splits the sample's bytes into its columns: the sizes of the variable
// columns first, then every column's bytes, which must fill the sample exactly.
static int split_sample(const dc_mds_reader *r, dc_mds_sample *s, size_t n, const char *file, int64_t i) {
    size_t at = 0;
    for (int c = 0; c < r->ncols; c++) {
        if (r->cols[c].size >= 0) {
            s->len[c] = (size_t)r->cols[c].size;
            continue;
        }
        if (n - at < 4) return dc_fail("%s: sample %lld ends inside its column sizes", file, (long long)i);
        uint32_t v;
        memcpy(&v, s->buf + at, 4);
        s->len[c] = v;
        at += 4;
    }
    for (int c = 0; c < r->ncols; c++) {
        if (n - at < s->len[c])
            return dc_fail("%s: sample %lld: column \"%s\" runs past the sample's end", file, (long long)i, r->cols[c].name);
        s->data[c] = s->buf + at;
        at += s->len[c];
    }
    if (at != n) return dc_fail("%s: sample %lld has %zu bytes after its columns", file, (long long)i, n - at);
    return 0;
}

int dc_mds_read(dc_mds_reader *r, int64_t i, dc_mds_sample *s) {
    if (i < 0 || i >= r->samples)
        return dc_fail("%s: sample %lld out of range (%lld samples)", r->dir, (long long)i, (long long)r->samples);
    int k = find_shard(r, i);
    const shard *sh = &r->shards[k];
    slot *sl = shard_slot(r, k);
    if (!sl) return -1;
    int64_t j = i - sh->first;
    uint32_t span[2];
    DC_TRY(slot_read(r, sl, span, 8, 4 + 4 * (uint64_t)j));
    if (span[0] > span[1] || span[1] > sh->raw_bytes || span[0] < 8 + 4 * (uint64_t)sh->samples)
        return dc_fail("%s: sample %lld's offsets %u..%u lie outside the file", sh->file, (long long)j, span[0], span[1]);
    size_t n = span[1] - span[0];
    if (s->ncols != r->ncols) {
        free(s->data);
        free(s->len);
        s->data = calloc((size_t)r->ncols, sizeof *s->data);
        s->len = calloc((size_t)r->ncols, sizeof *s->len);
        s->ncols = s->data && s->len ? r->ncols : 0;
        if (!s->ncols) return dc_fail("out of memory");
    }
    if (n > s->cap) {
        uint8_t *b = realloc(s->buf, n);
        if (!b) return dc_fail("out of memory");
        s->buf = b;
        s->cap = n;
    }
    DC_TRY(slot_read(r, sl, s->buf, n, span[0]));
    return split_sample(r, s, n, sh->file, j);
}

void dc_mds_sample_free(dc_mds_sample *s) {
    free(s->buf);
    free(s->data);
    free(s->len);
    memset(s, 0, sizeof *s);
}
