// Reading tensors out of a safetensors file: converting them to f32 or int64
// from the buffer in memory, or, for a file read on demand, from the file
// itself in pieces (pread), so that no copy of the file is ever held.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/safetensors.h"
#include "io/safetensors_internal.h"

// float8_e4m3fn (OCP FP8, PyTorch's torch.float8_e4m3fn): bias 7, no infinities,
// S.1111.111 is NaN.
static float f8e4m3_to_f32(uint8_t b) {
    int e = b >> 3 & 0xf, m = b & 7;
    float v;
    if (e == 0xf && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return b & 0x80 ? -v : v;
}

static bool is_float(dc_dtype t) {
    return t == DC_F32 || t == DC_F16 || t == DC_BF16 || t == DC_F64 || t == DC_F8_E4M3 || t == DC_F8_E5M2;
}

// Guards against a tensor from another file or edited after parsing.
static int check_tensor(const dc_st_file *f, const dc_st_tensor *t) {
    uint64_t bytes = (uint64_t)t->numel * dc_dtype_size(t->dtype);
    if (t->numel < 0 || t->begin > t->end || t->end > f->data_len || t->end - t->begin != bytes ||
        (!f->on_demand && !f->data))
        return dc_fail("%s: tensor '%.200s' does not lie inside this file's data", f->path, t->name);
    return 0;
}

// n bytes of the data buffer from byte `at`, into dst.
static int read_bytes(const dc_st_file *f, uint64_t at, size_t n, void *dst) {
    if (!f->on_demand) return memcpy(dst, f->data + at, n), 0;
    return dc_pread_exact(f->fd, dst, n, f->data_at + at, f->path);
}

#define PARALLEL_MIN ((int64_t)1 << 18)  // values: below this, threads cost more than they save
#define CHUNK ((size_t)1 << 22)          // bytes of a piece read on demand

// n values of dtype dt, stored little-endian at p, to f32.
static void to_f32(dc_dtype dt, const uint8_t *p, float *out, int64_t n) {
    switch (dt) {
    // The common float types convert on every core: loading a model converts
    // billions of values (a single conversion loop was a third of SD's load).
    case DC_F32:
#pragma omp parallel for if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = dc_ld32(p + 4 * i);
            memcpy(&out[i], &u, 4);
        }
        break;
    case DC_F64:
        for (int64_t i = 0; i < n; i++) {
            uint64_t u = dc_ld64(p + 8 * i);
            double d;
            memcpy(&d, &u, 8);
            out[i] = (float)d;
        }
        break;
    case DC_F16:
#pragma omp parallel for if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) out[i] = dc_f16_to_f32(dc_ld16(p + 2 * i));
        break;
    case DC_BF16:
#pragma omp parallel for if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) out[i] = dc_bf16_to_f32(dc_ld16(p + 2 * i));
        break;
    // E5M2 is the top byte of an IEEE half.
    case DC_F8_E5M2: for (int64_t i = 0; i < n; i++) out[i] = dc_f16_to_f32((uint16_t)(p[i] << 8)); break;
    case DC_F8_E4M3: for (int64_t i = 0; i < n; i++) out[i] = f8e4m3_to_f32(p[i]); break;
    default: break;  // callers pass float types only
    }
}

// n values of integer dtype dt at p to int64.
static void to_i64(dc_dtype dt, const uint8_t *p, int64_t *out, int64_t n) {
    switch (dt) {
    case DC_I64: for (int64_t i = 0; i < n; i++) out[i] = (int64_t)dc_ld64(p + 8 * i); break;
    case DC_I32: for (int64_t i = 0; i < n; i++) out[i] = (int32_t)dc_ld32(p + 4 * i); break;
    case DC_I16: for (int64_t i = 0; i < n; i++) out[i] = (int16_t)dc_ld16(p + 2 * i); break;
    case DC_I8: for (int64_t i = 0; i < n; i++) out[i] = (int8_t)p[i]; break;
    case DC_U8: for (int64_t i = 0; i < n; i++) out[i] = p[i]; break;
    case DC_U16: for (int64_t i = 0; i < n; i++) out[i] = dc_ld16(p + 2 * i); break;
    case DC_U32: for (int64_t i = 0; i < n; i++) out[i] = dc_ld32(p + 4 * i); break;
    case DC_U64:  // values past INT64_MAX saturate; callers range-check what they read
        for (int64_t i = 0; i < n; i++) {
            uint64_t v = dc_ld64(p + 8 * i);
            out[i] = v > INT64_MAX ? INT64_MAX : (int64_t)v;
        }
        break;
    case DC_BOOL: for (int64_t i = 0; i < n; i++) out[i] = p[i] != 0; break;
    default: break;  // callers pass integer types only
    }
}

// Reads t piece by piece into a buffer of its own and converts each piece
// into out (of element size out_es), for a file read on demand.
static int read_converted(const dc_st_file *f, const dc_st_tensor *t, void *out, size_t out_es, bool to_float) {
    const size_t es = dc_dtype_size(t->dtype), per = CHUNK / es;
    const int64_t n = t->numel;
    uint8_t *buf = malloc(n < (int64_t)per ? (size_t)n * es + 1 : per * es);
    if (!buf) return dc_fail("%s: out of memory reading tensor '%.200s'", f->path, t->name);
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i += (int64_t)per) {
        int64_t m = n - i < (int64_t)per ? n - i : (int64_t)per;
        rc = read_bytes(f, t->begin + (uint64_t)i * es, (size_t)m * es, buf);
        if (rc) break;
        if (to_float) to_f32(t->dtype, buf, (float *)((char *)out + (size_t)i * out_es), m);
        else to_i64(t->dtype, buf, (int64_t *)((char *)out + (size_t)i * out_es), m);
    }
    free(buf);
    return rc;
}

int dc_st_read_f32(const dc_st_file *f, const dc_st_tensor *t, float *out) {
    DC_TRY(check_tensor(f, t));
    if (!is_float(t->dtype))
        return dc_fail("%s: tensor '%.200s' is %s, not a float type (read it as integers)", f->path, t->name,
                       dc_dtype_name(t->dtype));
    if (!f->on_demand) return to_f32(t->dtype, f->data + t->begin, out, t->numel), 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    // F32 as stored is the host's float: straight from the file into out.
    if (t->dtype == DC_F32) return read_bytes(f, t->begin, (size_t)(t->end - t->begin), out);
#endif
    return read_converted(f, t, out, sizeof *out, true);
}

int dc_st_read_i64(const dc_st_file *f, const dc_st_tensor *t, int64_t *out) {
    DC_TRY(check_tensor(f, t));
    if (is_float(t->dtype))
        return dc_fail("%s: tensor '%.200s' is %s, not an integer type (read it as floats)", f->path, t->name,
                       dc_dtype_name(t->dtype));
    if (!f->on_demand) return to_i64(t->dtype, f->data + t->begin, out, t->numel), 0;
    return read_converted(f, t, out, sizeof *out, false);
}

int dc_st_read_raw(const dc_st_file *f, const dc_st_tensor *t, void *out) {
    DC_TRY(check_tensor(f, t));
    return read_bytes(f, t->begin, (size_t)(t->end - t->begin), out);
}
