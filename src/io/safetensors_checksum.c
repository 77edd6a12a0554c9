// Checksums of the safetensors files the engine writes: the canonical digest
// of the header and the checks a reader makes before and after the data.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"
#include "io/safetensors_internal.h"

#define NO_VERIFY_HINT "; --no-verify loads it anyway"

void dc_st_hex(uint64_t v, char *out) { snprintf(out, DC_ST_SUM_HEX + 1, "%016llx", (unsigned long long)v); }

static int parse_hex(const char *s, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < DC_ST_SUM_HEX; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;  // also stops at the terminating NUL of a short value
        v = v << 4 | (uint64_t)d;
    }
    if (s[DC_ST_SUM_HEX]) return -1;
    *out = v;
    return 0;
}

// A length-prefixed string, so that no two different lists hash alike.
static void feed_str(dc_xxh64_state *h, const char *s) {
    size_t n = strlen(s);
    dc_xxh64_update_u64(h, n);
    dc_xxh64_update(h, s, n);
}

typedef struct { const char *key, *value; } pair;

static int cmp_pair(const void *a, const void *b) { return strcmp(((const pair *)a)->key, ((const pair *)b)->key); }

static int cmp_desc(const void *a, const void *b) {
    return strcmp((*(const dc_st_desc *const *)a)->name, (*(const dc_st_desc *const *)b)->name);
}

int dc_st_header_digest(const char *const *keys, const char *const *values, int nmeta,
                        const dc_st_desc *t, int count, uint64_t *out) {
    pair *m = malloc(((size_t)nmeta + 1) * sizeof *m);
    const dc_st_desc **ts = malloc(((size_t)count + 1) * sizeof *ts);
    if (!m || !ts) return free(m), free(ts), dc_fail("out of memory");
    for (int i = 0; i < nmeta; i++) m[i] = (pair){keys[i], values[i]};
    for (int i = 0; i < count; i++) ts[i] = &t[i];
    qsort(m, (size_t)nmeta, sizeof *m, cmp_pair);
    qsort(ts, (size_t)count, sizeof *ts, cmp_desc);
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0);
    for (int i = 0; i < nmeta; i++) {
        if (strcmp(m[i].key, DC_ST_SUM_HEADER) == 0) continue;
        dc_xxh64_update(&h, "M", 1);
        feed_str(&h, m[i].key);
        feed_str(&h, m[i].value);
    }
    for (int i = 0; i < count; i++) {
        dc_xxh64_update(&h, "T", 1);
        feed_str(&h, ts[i]->name);
        feed_str(&h, dc_dtype_name(ts[i]->dtype));
        dc_xxh64_update_u64(&h, (uint64_t)ts[i]->ndim);
        for (int k = 0; k < ts[i]->ndim; k++) dc_xxh64_update_u64(&h, (uint64_t)ts[i]->shape[k]);
    }
    free(m), free(ts);
    *out = dc_xxh64_digest(&h);
    return 0;
}

// A file whose metadata says the engine wrote it in a format that always
// carries checksums ("diffusion.c <kind> v<N>", N >= 2) but has none was
// edited (checksums stripped) or damaged; older and foreign files have none.
static bool claims_checksums(const dc_st_file *f) {
    const char *fmt = dc_st_meta(f, "format");
    if (!fmt || strncmp(fmt, "diffusion.c ", 12) != 0) return false;
    const char *v = strrchr(fmt, ' ');
    return v && v[1] == 'v' && atoi(v + 2) >= 2;
}

int dc_st_verify_header(const dc_st_file *f, unsigned flags, uint64_t **want) {
    *want = NULL;
    if (flags & DC_ST_NO_VERIFY) return 0;
    // Keys of our layout: the header's, and "checksum.<a tensor of the file>"
    // (another tool's "checksum.sha256" does not make a file ours).
    const size_t plen = strlen(DC_ST_SUM_PREFIX);
    int nsums = 0, ours = 0;
    for (int i = 0; i < f->nmeta; i++) {
        const char *k = f->meta_keys[i];
        if (strncmp(k, DC_ST_SUM_PREFIX, plen) != 0) continue;
        nsums++;
        ours += strcmp(k, DC_ST_SUM_HEADER) == 0 || dc_st_find(f, k + plen) != NULL;
    }
    if (ours == 0) {
        if (claims_checksums(f))
            return dc_fail("%s: metadata says \"%s\" but the file carries no checksums: it was edited or is "
                           "corrupt" NO_VERIFY_HINT, f->path, dc_st_meta(f, "format"));
        return 0;  // a file from elsewhere, or from before checksums
    }
    const char *hs = dc_st_meta(f, DC_ST_SUM_HEADER);
    uint64_t stored, got;
    if (!hs || parse_hex(hs, &stored) != 0)
        return dc_fail("%s: the metadata checksum is %s: the file is corrupt" NO_VERIFY_HINT, f->path,
                       hs ? "malformed" : "missing");
    dc_st_desc *d = malloc(((size_t)f->count + 1) * sizeof *d);
    if (!d) return dc_fail("%s: out of memory", f->path);
    for (int i = 0; i < f->count; i++)
        d[i] = (dc_st_desc){f->tensors[i].name, f->tensors[i].dtype, f->tensors[i].ndim, f->tensors[i].shape};
    int rc = dc_st_header_digest((const char *const *)f->meta_keys, (const char *const *)f->meta_values, f->nmeta,
                                 d, f->count, &got);
    free(d);
    if (rc != 0) return dc_fail_ctx("%s", f->path);
    if (got != stored)
        return dc_fail("%s: the metadata or tensor list does not match its checksum: the file is corrupt or was "
                       "edited" NO_VERIFY_HINT, f->path);
    // The header is intact, so what follows only fails for a file built to
    // look like ours; the checks keep such a file from skipping verification.
    if (nsums != f->count + 1)
        return dc_fail("%s: %d checksums for %d tensors: the file is corrupt" NO_VERIFY_HINT, f->path, nsums - 1,
                       f->count);
    uint64_t *w = malloc(((size_t)f->count + 1) * sizeof *w);
    if (!w) return dc_fail("%s: out of memory", f->path);
    for (int i = 0; i < f->count; i++) {
        const char *s = NULL;
        for (int k = 0; k < f->nmeta && !s; k++)
            if (strncmp(f->meta_keys[k], DC_ST_SUM_PREFIX, plen) == 0 &&
                strcmp(f->meta_keys[k] + plen, f->tensors[i].name) == 0)
                s = f->meta_values[k];
        if (!s || parse_hex(s, &w[i]) != 0) {
            free(w);
            return dc_fail("%s: tensor '%.200s' has %s checksum: the file is corrupt" NO_VERIFY_HINT, f->path,
                           f->tensors[i].name, s ? "a malformed" : "no");
        }
    }
    *want = w;
    return 0;
}

int dc_st_verify_data(const dc_st_file *f, const uint64_t *want, const uint64_t *got) {
    for (int i = 0; i < f->count; i++)
        if (want[i] != got[i])
            return dc_fail("%s: tensor '%.200s' does not match its checksum: the file is corrupt (damaged on disk "
                           "or in transfer, or edited)" NO_VERIFY_HINT, f->path, f->tensors[i].name);
    return 0;
}
