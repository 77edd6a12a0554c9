// Writing safetensors files, with the checksums described in safetensors.h.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "io/json.h"
#include "io/safetensors_internal.h"

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static size_t entry_bytes(const dc_st_entry *e) {
    int64_t numel;
    uint64_t bytes = 0;
    dc_st_shape_bytes(e->shape, e->ndim, e->dtype, &numel, &bytes);
    return (size_t)bytes;
}

// Sorts names[0, n) and fails on the first repeated one.
static int check_unique(const char **names, int n, const char *path, const char *what) {
    qsort(names, (size_t)n, sizeof *names, cmp_cstr);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) return dc_fail("%s: duplicate %s '%s'", path, what, names[i]);
    return 0;
}

// The entries and metadata make a file the reader accepts.
static int check_entries(const char *path, const dc_st_entry *e, int count, const char *const *mk,
                         const char *const *mv, int nmeta) {
    if (count < 0 || nmeta < 0 || (count && !e) || (nmeta && (!mk || !mv)))
        return dc_fail("%s: invalid tensor or metadata list", path);
    int n = count > nmeta ? count : nmeta;
    const char **names = malloc(((size_t)n + 1) * sizeof *names);
    if (!names) return dc_fail("%s: out of memory", path);
    int rc = 0;
    for (int i = 0; i < count && rc == 0; i++) {
        names[i] = e[i].name;
        int64_t numel;
        uint64_t bytes = 0;
        if (!e[i].name) rc = dc_fail("%s: tensor %d has no name", path, i);
        else if (strcmp(e[i].name, "__metadata__") == 0) rc = dc_fail("%s: '__metadata__' is reserved", path);
        else if ((unsigned)e[i].dtype >= DC_DTYPE_COUNT)
            rc = dc_fail("%s: tensor '%s': invalid dtype %d", path, e[i].name, (int)e[i].dtype);
        else if (e[i].ndim < 0 || e[i].ndim > DC_ST_MAX_DIMS)
            rc = dc_fail("%s: tensor '%s': rank %d outside 0..%d", path, e[i].name, e[i].ndim, DC_ST_MAX_DIMS);
        for (int d = 0; rc == 0 && d < e[i].ndim; d++)
            if (e[i].shape[d] < 0) rc = dc_fail("%s: tensor '%s': negative dimension", path, e[i].name);
        if (rc == 0 && dc_st_shape_bytes(e[i].shape, e[i].ndim, e[i].dtype, &numel, &bytes) != 0)
            rc = dc_fail("%s: tensor '%s': size overflows 64 bits", path, e[i].name);
        if (rc == 0 && bytes && !e[i].data) rc = dc_fail("%s: tensor '%s': no data", path, e[i].name);
    }
    if (rc == 0) rc = check_unique(names, count, path, "tensor name");
    for (int i = 0; i < nmeta && rc == 0; i++) {
        names[i] = mk[i];
        if (!mk[i] || !mv[i]) rc = dc_fail("%s: metadata entry %d is NULL", path, i);
        else if (strncmp(mk[i], DC_ST_SUM_PREFIX, strlen(DC_ST_SUM_PREFIX)) == 0)
            rc = dc_fail("%s: metadata key '%s': keys starting with '" DC_ST_SUM_PREFIX "' are the writer's", path,
                         mk[i]);
    }
    if (rc == 0) rc = check_unique(names, nmeta, path, "metadata key");
    free(names);
    return rc;
}

// The header: the caller's metadata, the checksums (sums[count] of the
// tensors' bytes), then the tensors; padded with spaces to a multiple of 8 so
// the data buffer starts 8-byte aligned in the file. Every checksum has the
// same width, so the header of other sums has the same length.
static int build_header(const char *path, const dc_st_entry *e, int count, const char *const *mk,
                        const char *const *mv, int nmeta, const uint64_t *sums, char **hdr, size_t *hdr_len) {
    *hdr = NULL;
    // every metadata pair, the checksums included, for the header digest
    int nall = nmeta + count;
    const char **keys = calloc((size_t)nall + 1, sizeof *keys), **vals = calloc((size_t)nall + 1, sizeof *vals);
    char *sumtext = malloc(((size_t)count + 1) * (DC_ST_SUM_HEX + 1));
    dc_st_desc *d = malloc(((size_t)count + 1) * sizeof *d);
    int rc = keys && vals && sumtext && d ? 0 : dc_fail("%s: out of memory", path);
    for (int i = 0; i < nmeta && rc == 0; i++) keys[i] = mk[i], vals[i] = mv[i];
    for (int i = 0; i < count && rc == 0; i++) {
        size_t n = strlen(DC_ST_SUM_PREFIX) + strlen(e[i].name) + 1;
        char *k = malloc(n);
        if (!k) rc = dc_fail("%s: out of memory", path);
        else snprintf(k, n, DC_ST_SUM_PREFIX "%s", e[i].name);
        keys[nmeta + i] = k;
        dc_st_hex(sums[i], sumtext + (size_t)i * (DC_ST_SUM_HEX + 1));
        vals[nmeta + i] = sumtext + (size_t)i * (DC_ST_SUM_HEX + 1);
        d[i] = (dc_st_desc){e[i].name, e[i].dtype, e[i].ndim, e[i].shape};
    }
    uint64_t hsum = 0;
    char htext[DC_ST_SUM_HEX + 1];
    if (rc == 0) rc = dc_st_header_digest(keys, vals, nall, d, count, &hsum);
    dc_st_hex(hsum, htext);

    size_t len = 0;
    FILE *ms = rc == 0 ? open_memstream(hdr, &len) : NULL;
    if (rc == 0 && !ms) rc = dc_fail("%s: out of memory", path);
    if (rc == 0) {
        fputs("{\"__metadata__\":{", ms);
        for (int i = 0; i < nall && rc == 0; i++) {
            rc = dc_json_write_string(ms, keys[i]);
            fputc(':', ms);
            if (rc == 0) rc = dc_json_write_string(ms, vals[i]);
            fputc(',', ms);
        }
        fprintf(ms, "\"" DC_ST_SUM_HEADER "\":\"%s\"}", htext);
        uint64_t at = 0;
        for (int i = 0; i < count && rc == 0; i++) {
            uint64_t bytes = entry_bytes(&e[i]);
            fputc(',', ms);
            rc = dc_json_write_string(ms, e[i].name);
            fprintf(ms, ":{\"dtype\":\"%s\",\"shape\":[", dc_dtype_name(e[i].dtype));
            for (int k = 0; k < e[i].ndim; k++) fprintf(ms, "%s%lld", k ? "," : "", (long long)e[i].shape[k]);
            fprintf(ms, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at, (unsigned long long)(at + bytes));
            at += bytes;
        }
        fputc('}', ms);
        while (rc == 0 && (ftell(ms) % 8) != 0) fputc(' ', ms);
        if (fclose(ms) != 0 && rc == 0) rc = dc_fail("%s: out of memory", path);
        if (rc != 0) dc_fail_ctx("%s", path);
        else if (len > DC_ST_MAX_HEADER) rc = dc_fail("%s: header over 100 MB", path);
        if (rc != 0) free(*hdr), *hdr = NULL;
    }
    for (int i = 0; keys && i < count; i++) free((char *)keys[nmeta + i]);
    free(keys), free(vals), free(sumtext), free(d);
    *hdr_len = len;
    return rc;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// The header goes out first with placeholder checksums; each tensor is
// hashed piece by piece just before the piece is written (while it is in the
// cache), and the header, of the same length, is written again at the end.
int dc_st_write(const char *path, const dc_st_entry *entries, int count,
                const char *const *meta_keys, const char *const *meta_values, int nmeta) {
    enum { CHUNK = 1 << 22 };
    DC_TRY(check_entries(path, entries, count, meta_keys, meta_values, nmeta));
    uint64_t *sums = calloc((size_t)count + 1, sizeof *sums);
    char *hdr = NULL, *final = NULL;
    size_t hlen = 0, flen = 0;
    if (!sums) return dc_fail("%s: out of memory", path);
    if (build_header(path, entries, count, meta_keys, meta_values, nmeta, sums, &hdr, &hlen) != 0)
        return free(sums), -1;
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return free(sums), free(hdr), -1;
    FILE *fp = dc_atomic_stream(af);
    uint8_t n8[8];
    put_le64(n8, hlen);
    int ok = fwrite(n8, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (int i = 0; i < count && ok; i++) {
        const uint8_t *p = entries[i].data;
        size_t b = entry_bytes(&entries[i]);
        dc_xxh64_state h;
        dc_xxh64_init(&h, 0);
        for (size_t at = 0; at < b && ok; at += CHUNK) {
            size_t n = b - at < CHUNK ? b - at : CHUNK;
            dc_xxh64_update(&h, p + at, n);
            ok = fwrite(p + at, 1, n, fp) == n;
        }
        sums[i] = dc_xxh64_digest(&h);
    }
    if (!ok) dc_fail("%s: write failed: %s", path, strerror(errno));
    if (ok) ok = build_header(path, entries, count, meta_keys, meta_values, nmeta, sums, &final, &flen) == 0;
    if (ok && flen != hlen) ok = 0, dc_fail("%s: internal error: the header changed length", path);
    if (ok && (fseek(fp, 8, SEEK_SET) != 0 || fwrite(final, 1, flen, fp) != flen))
        ok = 0, dc_fail("%s: write failed: %s", path, strerror(errno));
    free(sums), free(hdr), free(final);
    return dc_atomic_end(af, ok);
}

int dc_st_serialize(const dc_st_entry *entries, int count, const char *const *meta_keys,
                    const char *const *meta_values, int nmeta, uint8_t **out, size_t *len) {
    char *hdr;
    size_t hlen, total;
    *out = NULL, *len = 0;
    DC_TRY(check_entries("<memory>", entries, count, meta_keys, meta_values, nmeta));
    uint64_t *sums = malloc(((size_t)count + 1) * sizeof *sums);
    if (!sums) return dc_fail("<memory>: out of memory");
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < count; i++) sums[i] = dc_xxh64(entries[i].data, entry_bytes(&entries[i]), 0);
    int rc = build_header("<memory>", entries, count, meta_keys, meta_values, nmeta, sums, &hdr, &hlen);
    free(sums);
    if (rc != 0) return -1;
    total = 8 + hlen;
    for (int i = 0; i < count; i++) total += entry_bytes(&entries[i]);
    uint8_t *buf = malloc(total);
    if (!buf) return free(hdr), dc_fail("<memory>: out of memory (%zu bytes)", total);
    put_le64(buf, hlen);
    memcpy(buf + 8, hdr, hlen);
    size_t at = 8 + hlen;
    for (int i = 0; i < count; i++) {
        size_t b = entry_bytes(&entries[i]);
        if (b) memcpy(buf + at, entries[i].data, b);
        at += b;
    }
    free(hdr);
    *out = buf, *len = total;
    return 0;
}
