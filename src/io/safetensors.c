#include "io/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "io/json.h"
#include "io/safetensors_internal.h"

// "[3, 2]" for messages.
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

void dc_st_close(dc_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->count; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->nmeta; i++) free(f->meta_keys[i]), free(f->meta_values[i]);
    free(f->tensors), free(f->meta_keys), free(f->meta_values), free(f->path);
    if (f->on_demand) close(f->fd);
    free(f->mem);
    memset(f, 0, sizeof *f);
}

// ---- parsing ---------------------------------------------------------------

static int parse_metadata(dc_st_file *f, const dc_json *m) {
    if (m->type != DC_JSON_OBJECT) return dc_fail("%s: __metadata__ is not an object", f->path);
    f->meta_keys = calloc((size_t)m->nkids + 1, sizeof(char *));
    f->meta_values = calloc((size_t)m->nkids + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return dc_fail("%s: out of memory", f->path);
    for (int i = 0; i < m->nkids; i++) {
        const dc_json *kv = &m->kids[i];
        if (strlen(kv->key) != kv->key_len) return dc_fail("%s: a __metadata__ key contains NUL", f->path);
        if (!dc_json_is_cstr(kv))
            return dc_fail("%s: __metadata__ '%.200s' is not a string (metadata maps strings to strings)",
                           f->path, kv->key);
        for (int j = 0; j < i; j++)
            if (strcmp(f->meta_keys[j], kv->key) == 0)
                return dc_fail("%s: duplicate __metadata__ key '%.200s'", f->path, kv->key);
        f->meta_keys[i] = strdup(kv->key);
        f->meta_values[i] = strdup(kv->str);
        f->nmeta = i + 1;
        if (!f->meta_keys[i] || !f->meta_values[i]) return dc_fail("%s: out of memory", f->path);
    }
    return 0;
}

// Fills t (whose name is set) from its header entry {dtype, shape, data_offsets}.
static int parse_tensor(const dc_st_file *f, dc_st_tensor *t, const dc_json *v) {
    const char *p = f->path, *nm = t->name;
    if (v->type != DC_JSON_OBJECT) return dc_fail("%s: tensor '%.200s': entry is not an object", p, nm);
    const dc_json *dt = NULL, *sh = NULL, *off = NULL;
    for (int i = 0; i < v->nkids; i++) {
        const dc_json *k = &v->kids[i], **slot = NULL;
        if (strcmp(k->key, "dtype") == 0) slot = &dt;
        else if (strcmp(k->key, "shape") == 0) slot = &sh;
        else if (strcmp(k->key, "data_offsets") == 0) slot = &off;
        else return dc_fail("%s: tensor '%.200s': unknown field '%.64s'", p, nm, k->key);
        if (*slot) return dc_fail("%s: tensor '%.200s': field '%s' given twice", p, nm, k->key);
        *slot = k;
    }
    if (!dt || !sh || !off)
        return dc_fail("%s: tensor '%.200s': missing field '%s'", p, nm,
                       !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!dc_json_is_cstr(dt)) return dc_fail("%s: tensor '%.200s': dtype is not a string", p, nm);
    if (dc_dtype_parse(dt->str, &t->dtype) != 0)
        return dc_fail("%s: tensor '%.200s': unknown dtype '%.32s'", p, nm, dt->str);
    if (sh->type != DC_JSON_ARRAY) return dc_fail("%s: tensor '%.200s': shape is not an array", p, nm);
    if (sh->nkids > DC_ST_MAX_DIMS)
        return dc_fail("%s: tensor '%.200s': rank %d exceeds the maximum of %d", p, nm, sh->nkids,
                       DC_ST_MAX_DIMS);
    t->ndim = sh->nkids;
    for (int i = 0; i < t->ndim; i++)
        if (dc_json_get_i64(&sh->kids[i], &t->shape[i]) != 0 || t->shape[i] < 0)
            return dc_fail("%s: tensor '%.200s': shape entry %d is not a non-negative integer", p, nm, i);
    if (off->type != DC_JSON_ARRAY || off->nkids != 2 || dc_json_get_u64(&off->kids[0], &t->begin) ||
        dc_json_get_u64(&off->kids[1], &t->end))
        return dc_fail("%s: tensor '%.200s': data_offsets is not two non-negative integers", p, nm);
    if (t->begin > t->end)
        return dc_fail("%s: tensor '%.200s': data_offsets [%llu, %llu) begin after they end", p, nm,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    char sbuf[200];
    uint64_t bytes;
    if (dc_st_shape_bytes(t->shape, t->ndim, t->dtype, &t->numel, &bytes) != 0)
        return dc_fail("%s: tensor '%.200s': shape %s x %s overflows 64 bits", p, nm,
                       shape_str(t->shape, t->ndim, sbuf, sizeof sbuf), dc_dtype_name(t->dtype));
    if (bytes != t->end - t->begin)
        return dc_fail("%s: tensor '%.200s': data_offsets [%llu, %llu) do not match shape %s x %s = %llu bytes",
                       p, nm, (unsigned long long)t->begin, (unsigned long long)t->end,
                       shape_str(t->shape, t->ndim, sbuf, sizeof sbuf), dc_dtype_name(t->dtype),
                       (unsigned long long)bytes);
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const dc_st_tensor *const *)a)->name, (*(const dc_st_tensor *const *)b)->name);
}

static int cmp_offsets(const void *a, const void *b) {
    const dc_st_tensor *x = *(const dc_st_tensor *const *)a, *y = *(const dc_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// Names unique; offsets, sorted, tile [0, data_len) with no gap and no overlap.
static int check_layout(dc_st_file *f) {
    dc_st_tensor **ix = malloc(((size_t)f->count + 1) * sizeof *ix);
    if (!ix) return dc_fail("%s: out of memory", f->path);
    for (int i = 0; i < f->count; i++) ix[i] = &f->tensors[i];
    int rc = 0;
    qsort(ix, (size_t)f->count, sizeof *ix, cmp_name);
    for (int i = 1; i < f->count && rc == 0; i++)
        if (strcmp(ix[i - 1]->name, ix[i]->name) == 0)
            rc = dc_fail("%s: duplicate tensor name '%.200s'", f->path, ix[i]->name);
    qsort(ix, (size_t)f->count, sizeof *ix, cmp_offsets);
    uint64_t at = 0;
    for (int i = 0; i < f->count && rc == 0; i++) {
        const dc_st_tensor *t = ix[i];
        if (t->begin > at)
            rc = dc_fail("%s: no tensor covers bytes [%llu, %llu) of the data buffer (gap before '%.200s')",
                         f->path, (unsigned long long)at, (unsigned long long)t->begin, t->name);
        else if (t->begin < at)
            rc = dc_fail("%s: tensor '%.200s' data_offsets [%llu, %llu) overlap '%.200s'", f->path, t->name,
                         (unsigned long long)t->begin, (unsigned long long)t->end, ix[i - 1]->name);
        at = t->end;
    }
    if (rc == 0 && at != f->data_len)
        rc = dc_fail("%s: data buffer is %llu bytes but the tensors cover %llu", f->path,
                     (unsigned long long)f->data_len, (unsigned long long)at);
    free(ix);
    return rc;
}

static int parse_header(dc_st_file *f, const dc_json *root) {
    if (root->type != DC_JSON_OBJECT) return dc_fail("%s: header is not a JSON object", f->path);
    int ntensors = 0;
    for (int i = 0; i < root->nkids; i++) ntensors += strcmp(root->kids[i].key, "__metadata__") != 0;
    f->tensors = calloc((size_t)ntensors + 1, sizeof *f->tensors);
    if (!f->tensors) return dc_fail("%s: out of memory", f->path);
    bool seen_meta = false;
    for (int i = 0; i < root->nkids; i++) {
        const dc_json *kv = &root->kids[i];
        if (strlen(kv->key) != kv->key_len) return dc_fail("%s: a tensor name contains NUL", f->path);
        if (strcmp(kv->key, "__metadata__") == 0) {
            if (seen_meta) return dc_fail("%s: duplicate __metadata__", f->path);
            seen_meta = true;
            DC_TRY(parse_metadata(f, kv));
            continue;
        }
        dc_st_tensor *t = &f->tensors[f->count++];
        if (!(t->name = strdup(kv->key))) return dc_fail("%s: out of memory", f->path);
        DC_TRY(parse_tensor(f, t, kv));
    }
    return check_layout(f);
}

// Parses the header of a file of len bytes whose first mem_len bytes are in
// mem (taking ownership of mem): the whole file, or (on_demand) at least its
// first 8 + header-length bytes, the data staying in the file.
static int parse_owned(dc_st_file *f, uint8_t *mem, size_t mem_len, uint64_t len, const char *name, bool on_demand) {
    memset(f, 0, sizeof *f);
    f->mem = mem, f->mem_len = mem_len;
    f->path = strdup(name ? name : "<memory>");
    if (!f->path) return dc_st_close(f), dc_fail("out of memory");
    int rc = 0;
    if (len < 8) {
        rc = dc_fail("%s: file is %llu bytes, too short to hold the 8-byte header length", f->path,
                     (unsigned long long)len);
    } else {
        uint64_t n = dc_ld64(mem);
        // A PNG, a text file or a pickle: the length is absurd and no JSON follows.
        if ((n > DC_ST_MAX_HEADER || n > len - 8) && (len == 8 || mem[8] != '{')) {
            rc = dc_fail("%s: not a safetensors file (its first 8 bytes are not a plausible header "
                         "length and no JSON header follows)", f->path);
        } else if (n > DC_ST_MAX_HEADER) {
            rc = dc_fail("%s: header length %llu exceeds the limit of %llu bytes", f->path,
                         (unsigned long long)n, DC_ST_MAX_HEADER);
        } else if (n > len - 8) {
            rc = dc_fail("%s: file is %llu bytes, shorter than 8 + header length %llu", f->path,
                         (unsigned long long)len, (unsigned long long)n);
        } else if (8 + n > mem_len) {
            rc = dc_fail("%s: internal error: the header was not read", f->path);
        } else {
            const char *hdr = (const char *)mem + 8;
            int64_t bad = dc_utf8_invalid_at(hdr, (size_t)n);
            dc_json_doc doc = {0};
            if (bad >= 0) {
                rc = dc_fail("%s: header is not valid UTF-8 (at header byte %lld)", f->path, (long long)bad);
            } else if (dc_json_parse(&doc, hdr, (size_t)n, 8) != 0) {
                rc = dc_fail_ctx("%s: header", f->path);
            } else {
                f->data = on_demand ? NULL : mem + 8 + n;
                f->data_at = 8 + n;
                f->data_len = len - 8 - n;
                rc = parse_header(f, doc.root);
            }
            dc_json_free(&doc);
        }
    }
    if (rc != 0) dc_st_close(f);
    return rc;
}

// The tensors in the order of their data (they tile the buffer), for reading
// the file front to back.
static int *data_order(const dc_st_file *f) {
    const dc_st_tensor **ix = malloc(((size_t)f->count + 1) * sizeof *ix);
    int *order = malloc(((size_t)f->count + 1) * sizeof *order);
    if (!ix || !order) return free(ix), free(order), NULL;
    for (int i = 0; i < f->count; i++) ix[i] = &f->tensors[i];
    qsort(ix, (size_t)f->count, sizeof *ix, cmp_offsets);
    for (int i = 0; i < f->count; i++) order[i] = (int)(ix[i] - f->tensors);
    free(ix);
    return order;
}

// Hashes every tensor of a file whose data is in memory (in parallel for
// large files) and checks the hashes against want.
static int verify_in_memory(dc_st_file *f, const uint64_t *want) {
    uint64_t *got = malloc(((size_t)f->count + 1) * sizeof *got);
    if (!got) return dc_fail("%s: out of memory", f->path);
    #pragma omp parallel for schedule(dynamic, 1) if (f->data_len > (1u << 24))
    for (int i = 0; i < f->count; i++) {
        const dc_st_tensor *t = &f->tensors[i];
        got[i] = dc_xxh64(f->data + t->begin, (size_t)(t->end - t->begin), 0);
    }
    int rc = dc_st_verify_data(f, want, got);
    free(got);
    return rc;
}

int dc_st_parse_opts(dc_st_file *f, const void *bytes, size_t len, const char *name, unsigned flags) {
    uint8_t *mem = malloc(len ? len : 1);
    if (!mem) return memset(f, 0, sizeof *f), dc_fail("%s: out of memory (%zu bytes)", name, len);
    if (len) memcpy(mem, bytes, len);
    DC_TRY(parse_owned(f, mem, len, len, name, false));
    uint64_t *want;
    int rc = dc_st_verify_header(f, flags, &want);
    if (rc == 0 && want) {
        rc = verify_in_memory(f, want);
        f->verified = rc == 0;
    }
    free(want);
    if (rc != 0) dc_st_close(f);
    return rc;
}

int dc_st_parse(dc_st_file *f, const void *bytes, size_t len, const char *name) {
    return dc_st_parse_opts(f, bytes, len, name, 0);
}

// Reads the data buffer of f (whose header is parsed) from fd, tensor by
// tensor, hashing each piece right after it arrives while it is still in the
// cache: verifying costs no second pass over the file.
static int read_data(dc_st_file *f, int fd, const uint64_t *want) {
    enum { CHUNK = 1 << 22 };
    if (!want) return dc_read_exact(fd, f->data, (size_t)f->data_len, f->path);
    int *order = data_order(f);
    uint64_t *got = malloc(((size_t)f->count + 1) * sizeof *got);
    int rc = order && got ? 0 : dc_fail("%s: out of memory", f->path);
    for (int k = 0; k < f->count && rc == 0; k++) {
        const dc_st_tensor *t = &f->tensors[order[k]];
        dc_xxh64_state h;
        dc_xxh64_init(&h, 0);
        for (uint64_t at = t->begin; at < t->end && rc == 0; at += CHUNK) {
            size_t n = t->end - at < CHUNK ? (size_t)(t->end - at) : CHUNK;
            rc = dc_read_exact(fd, f->data + at, n, f->path);
            if (rc == 0) dc_xxh64_update(&h, f->data + at, n);
        }
        got[order[k]] = dc_xxh64_digest(&h);
    }
    if (rc == 0) rc = dc_st_verify_data(f, want, got);
    free(order), free(got);
    return rc;
}

// The same for a file read on demand: threads take the tensors in the order of
// their data and read each in pieces into a buffer of their own, hashing
// each piece as it arrives.
static int verify_on_demand(dc_st_file *f, const uint64_t *want) {
    enum { CHUNK = 1 << 22 };
    int *order = data_order(f);
    uint64_t *got = malloc(((size_t)f->count + 1) * sizeof *got);
    if (!order || !got) return free(order), free(got), dc_fail("%s: out of memory", f->path);
    char err[1024] = "";
    int failed = 0;
    #pragma omp parallel if (f->data_len > (1u << 24))
    {
        uint8_t *buf = malloc(CHUNK);
        #pragma omp for schedule(dynamic, 1)
        for (int k = 0; k < f->count; k++) {
            const dc_st_tensor *t = &f->tensors[order[k]];
            dc_xxh64_state h;
            dc_xxh64_init(&h, 0);
            int rc = buf ? 0 : dc_fail("%s: out of memory", f->path);
            for (uint64_t at = t->begin; at < t->end && rc == 0; at += CHUNK) {
                size_t n = t->end - at < CHUNK ? (size_t)(t->end - at) : CHUNK;
                rc = dc_pread_exact(f->fd, buf, n, f->data_at + at, f->path);
                if (rc == 0) dc_xxh64_update(&h, buf, n);
            }
            got[order[k]] = dc_xxh64_digest(&h);
            if (rc != 0) {
                // messages are per thread: the first failure's is carried out
                #pragma omp critical(dc_st_verify)
                if (!failed) {
                    failed = 1;
                    snprintf(err, sizeof err, "%s", dc_error());
                }
            }
        }
        free(buf);
    }
    int rc = failed ? dc_fail("%s", err) : dc_st_verify_data(f, want, got);
    free(order), free(got);
    return rc;
}

int dc_st_open(dc_st_file *f, const char *path) { return dc_st_open_opts(f, path, 0); }

int dc_st_open_opts(dc_st_file *f, const char *path, unsigned flags) {
    memset(f, 0, sizeof *f);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    const uint64_t len = (uint64_t)size;
    const bool on_demand = (flags & DC_ST_ON_DEMAND) || len >= DC_ST_MEMORY_MAX;
    // The length and the header first (and the byte after the length, which
    // tells a file of another kind): a bad header fails before the data is read.
    uint8_t head[9];
    size_t nhead = len < 9 ? (size_t)len : 9;
    if (dc_read_exact(fd, head, nhead, path) != 0) return close(fd), -1;
    uint64_t n = nhead >= 8 ? dc_ld64(head) : 0;
    size_t keep = nhead;  // the bytes read and kept
    if (nhead >= 8 && n <= DC_ST_MAX_HEADER && n <= len - 8) keep = (size_t)(8 + n);
    size_t cap = on_demand ? keep : (size_t)len;
    uint8_t *mem = malloc((cap > nhead ? cap : nhead) + 1);
    if (!mem) return close(fd), dc_fail("%s: out of memory reading %zu bytes", path, cap);
    memcpy(mem, head, nhead);
    int rc = 0;
    if (keep > nhead) rc = dc_read_exact(fd, mem + nhead, keep - nhead, path);
    if (rc != 0) return close(fd), free(mem), -1;
    if (parse_owned(f, mem, keep, len, path, on_demand) != 0) return close(fd), -1;
    uint64_t *want;
    rc = dc_st_verify_header(f, flags, &want);
    if (on_demand) {
        f->on_demand = true, f->fd = fd;  // dc_st_close closes it from here on
        if (rc == 0 && want) rc = verify_on_demand(f, want);
    } else {
        f->mem_len = (size_t)len;
        if (rc == 0) rc = read_data(f, fd, want);
        close(fd);
    }
    f->verified = rc == 0 && want;
    free(want);
    if (rc != 0) dc_st_close(f);
    return rc;
}

const dc_st_tensor *dc_st_find(const dc_st_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *dc_st_meta(const dc_st_file *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

