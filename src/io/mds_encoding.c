// MDS column encodings: names, sizes and the ndarray header
// (mosaicml/streaming, streaming/base/format/mds/encodings.py, class NDArray).
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "io/mds.h"

static const struct { const char *name; int dtype; } g_dtypes[] = {
    {"uint8", DC_MDS_U8},     {"int8", DC_MDS_I8},     {"uint16", DC_MDS_U16}, {"int16", DC_MDS_I16},
    {"float16", DC_MDS_F16},  {"uint32", DC_MDS_U32},  {"int32", DC_MDS_I32},  {"float32", DC_MDS_F32},
    {"uint64", DC_MDS_U64},   {"int64", DC_MDS_I64},   {"float64", DC_MDS_F64},
};
enum { N_DTYPES = sizeof g_dtypes / sizeof g_dtypes[0] };

static int dtype_by_name(const char *s, size_t n) {
    for (int i = 0; i < N_DTYPES; i++)
        if (strlen(g_dtypes[i].name) == n && memcmp(g_dtypes[i].name, s, n) == 0) return g_dtypes[i].dtype;
    return 0;
}

const char *dc_mds_dtype_name(int dtype) {
    for (int i = 0; i < N_DTYPES; i++)
        if (g_dtypes[i].dtype == dtype) return g_dtypes[i].name;
    return "?";
}

size_t dc_mds_dtype_size(int dtype) {
    for (int i = 0; i < N_DTYPES; i++)
        if (g_dtypes[i].dtype == dtype) return (size_t)dtype / 8;
    return 0;
}

// "ndarray", "ndarray:DTYPE" or "ndarray:DTYPE:D0,D1,..." (encodings.py NDArray.from_str).
static int parse_ndarray(dc_mds_column *c, const char *name, const char *cfg) {
    c->kind = DC_MDS_NDARRAY;
    if (!*cfg) return 0;
    const char *colon = strchr(cfg, ':');
    size_t n = colon ? (size_t)(colon - cfg) : strlen(cfg);
    c->dtype = dtype_by_name(cfg, n);
    if (!c->dtype) return dc_fail("column \"%s\": ndarray dtype \"%.*s\" is not one of streaming's", name, (int)n, cfg);
    if (!colon) return 0;
    const char *p = colon + 1;
    int64_t elems = 1;
    for (;;) {
        if (c->ndim == DC_MDS_MAX_DIMS) return dc_fail("column \"%s\": more than %d dimensions", name, DC_MDS_MAX_DIMS);
        char *end;
        if (*p < '0' || *p > '9') return dc_fail("column \"%s\": bad shape in \"%s\"", name, c->encoding);
        long long d = strtoll(p, &end, 10);
        if (d < 1 || d > (1ll << 40) || elems > (1ll << 40) / d)
            return dc_fail("column \"%s\": shape dimension %lld out of range", name, d);
        c->shape[c->ndim++] = d;
        elems *= d;
        p = end;
        if (!*p) break;
        if (*p++ != ',') return dc_fail("column \"%s\": bad shape in \"%s\"", name, c->encoding);
    }
    c->size = elems * (int64_t)dc_mds_dtype_size(c->dtype);
    return 0;
}

int dc_mds_column_parse(dc_mds_column *c, const char *name, const char *encoding) {
    memset(c, 0, sizeof *c);
    c->size = -1;
    c->name = strdup(name);
    c->encoding = strdup(encoding);
    if (!c->name || !c->encoding) return dc_mds_column_free(c), dc_fail("out of memory");
    int rc = 0;
    int dt = dtype_by_name(encoding, strlen(encoding));
    if (!strcmp(encoding, "bytes")) c->kind = DC_MDS_BYTES;
    else if (!strcmp(encoding, "str")) c->kind = DC_MDS_STR;
    else if (!strcmp(encoding, "json")) c->kind = DC_MDS_STR, c->is_json = 1;
    else if (!strcmp(encoding, "int")) c->kind = DC_MDS_SCALAR, c->dtype = DC_MDS_I64, c->size = 8;
    else if (dt) c->kind = DC_MDS_SCALAR, c->dtype = dt, c->size = (int64_t)dc_mds_dtype_size(dt);
    else if (!strcmp(encoding, "ndarray")) c->kind = DC_MDS_NDARRAY;
    else if (!strncmp(encoding, "ndarray:", 8)) rc = parse_ndarray(c, name, encoding + 8);
    else if (!strcmp(encoding, "pkl"))
        rc = dc_fail("column \"%s\" is pickled (\"pkl\"): unpickling runs code from the file, so it is not read", name);
    else if (!strcmp(encoding, "pil") || !strcmp(encoding, "jpeg") || !strcmp(encoding, "png") ||
             !strncmp(encoding, "list[", 5) || !strcmp(encoding, "jpeg_array") || !strcmp(encoding, "jpegarray"))
        rc = dc_fail("column \"%s\" holds pictures (\"%s\"), which are not read from shards: "
                     "store latents or pixels as ndarray columns", name, encoding);
    else rc = dc_fail("column \"%s\": encoding \"%s\" is not supported (bytes, str, json, int, "
                      "[u]int8..64, float16/32/64, ndarray)", name, encoding);
    if (rc) dc_mds_column_free(c);
    return rc;
}

void dc_mds_column_free(dc_mds_column *c) {
    free(c->name);
    free(c->encoding);
    c->name = c->encoding = NULL;
}

static uint64_t load_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

// The ndarray header: [dtype: 1] when the dtype is per sample, then, when the
// shape is, [ndim << 2 | log2(shape element bytes): 1] [shape: ndim * 1/2/4/8 bytes].
static int decode_ndarray(const dc_mds_column *c, const uint8_t *data, size_t len, dc_mds_array *a) {
    size_t at = 0;
    a->dtype = c->dtype;
    if (!a->dtype) {
        if (len < 1) return dc_fail("column \"%s\": value ends before its dtype", c->name);
        a->dtype = data[at++];
        if (!dc_mds_dtype_size(a->dtype)) return dc_fail("column \"%s\": dtype code %d is not one of streaming's", c->name, a->dtype);
    }
    int64_t count = 1;
    if (c->ndim) {
        a->ndim = c->ndim;
        memcpy(a->shape, c->shape, sizeof a->shape);
        for (int d = 0; d < c->ndim; d++) count *= c->shape[d];
    } else {
        if (at >= len) return dc_fail("column \"%s\": value ends before its shape", c->name);
        int byte = data[at++], ndim = byte >> 2, w = 1 << (byte & 3);
        if (ndim < 1) return dc_fail("column \"%s\": array of rank 0", c->name);
        if (len - at < (size_t)ndim * (size_t)w) return dc_fail("column \"%s\": value ends inside its shape", c->name);
        a->ndim = ndim;
        for (int d = 0; d < ndim; d++, at += (size_t)w) {
            uint64_t v = load_le(data + at, w);
            // the bound keeps count * element size far from overflowing
            if (v < 1 || v > len) return dc_fail("column \"%s\": dimension %d is %llu", c->name, d, (unsigned long long)v);
            a->shape[d] = (int64_t)v;
            count *= (int64_t)v;
            if (count > (int64_t)len) return dc_fail("column \"%s\": shape holds more values than the bytes there are", c->name);
        }
    }
    size_t es = dc_mds_dtype_size(a->dtype);
    if ((uint64_t)count * es != len - at)
        return dc_fail("column \"%s\": %zu bytes of values for %lld %s elements", c->name, len - at,
                       (long long)count, dc_mds_dtype_name(a->dtype));
    a->count = count;
    a->values = data + at;
    return 0;
}

int dc_mds_decode(const dc_mds_column *c, const uint8_t *data, size_t len, dc_mds_array *a) {
    memset(a, 0, sizeof *a);
    if (c->kind == DC_MDS_NDARRAY) return decode_ndarray(c, data, len, a);
    if (c->size >= 0 && (size_t)c->size != len)
        return dc_fail("column \"%s\": %zu bytes where %s takes %lld", c->name, len, c->encoding, (long long)c->size);
    if (c->kind == DC_MDS_SCALAR) {
        a->dtype = c->dtype;
        a->count = 1;
    } else {
        a->dtype = DC_MDS_U8;
        a->ndim = 1;
        a->shape[0] = (int64_t)len;
        a->count = (int64_t)len;
    }
    a->values = data;
    return 0;
}

static double element(const uint8_t *p, int dtype) {
    uint64_t u = load_le(p, (int)dc_mds_dtype_size(dtype));
    switch (dtype) {
    case DC_MDS_I8: return (int8_t)u;
    case DC_MDS_I16: return (int16_t)u;
    case DC_MDS_I32: return (int32_t)u;
    case DC_MDS_I64: return (double)(int64_t)u;
    case DC_MDS_F16: return dc_f16_to_f32((uint16_t)u);
    case DC_MDS_F32: { float f; uint32_t b = (uint32_t)u; memcpy(&f, &b, 4); return f; }
    case DC_MDS_F64: { double d; memcpy(&d, &u, 8); return d; }
    default: return (double)u;
    }
}

void dc_mds_to_f32(const dc_mds_array *a, float *dst) {
    size_t es = dc_mds_dtype_size(a->dtype);
    const uint8_t *p = a->values;
    for (int64_t i = 0; i < a->count; i++) dst[i] = (float)element(p + (size_t)i * es, a->dtype);
}
