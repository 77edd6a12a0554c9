// safetensors files: a u64 little-endian header length N, N bytes of JSON,
// then the data buffer. The reader validates everything the reference reader
// does (header size, UTF-8 JSON, duplicate names, offsets tiling the buffer
// exactly, shape x dtype size == byte length with overflow checks) and never
// reads out of bounds, whatever the file holds.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/dtype.h"

#define DC_ST_MAX_DIMS 8

typedef struct {
    char *name;
    dc_dtype dtype;
    int ndim;
    int64_t shape[DC_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;  // byte offsets into the data buffer
} dc_st_tensor;

typedef struct {
    char *path;
    int count;
    dc_st_tensor *tensors;   // in file (header) order
    int nmeta;
    char **meta_keys, **meta_values;  // __metadata__ (string -> string)
    uint8_t *data;           // the data buffer (whole file read into memory)
    uint64_t data_len;
    void *mem;               // owning allocation
    size_t mem_len;
} dc_st_file;

// Opens and validates a file. On error the message names the file and the problem.
int dc_st_open(dc_st_file *f, const char *path);
// dc_st_open with flags: DC_ST_NO_VERIFY skips checking stored checksums.
enum { DC_ST_NO_VERIFY = 1u };
int dc_st_open_opts(dc_st_file *f, const char *path, unsigned flags);
// Same, over bytes in memory (copied), for tests and fuzzing; name is for messages.
int dc_st_parse(dc_st_file *f, const void *bytes, size_t len, const char *name);
void dc_st_close(dc_st_file *f);
const dc_st_tensor *dc_st_find(const dc_st_file *f, const char *name);
const char *dc_st_meta(const dc_st_file *f, const char *key);  // NULL if absent
// Converts a float tensor (F32, F16, BF16, F64) to f32 into out[numel].
int dc_st_read_f32(const dc_st_file *f, const dc_st_tensor *t, float *out);
// Converts an integer tensor (I64, I32, I16, I8, U8) to int64 into out[numel].
int dc_st_read_i64(const dc_st_file *f, const dc_st_tensor *t, int64_t *out);

// ---- writing ---------------------------------------------------------------
typedef struct {
    const char *name;
    dc_dtype dtype;
    int ndim;
    int64_t shape[DC_ST_MAX_DIMS];
    const void *data;  // host memory, numel * dtype size bytes, little-endian
} dc_st_entry;

// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of
// the directory. A failure leaves any existing `path` untouched.
// meta_keys/meta_values: nmeta string pairs for __metadata__ (may be 0).
int dc_st_write(const char *path, const dc_st_entry *entries, int count,
                const char *const *meta_keys, const char *const *meta_values, int nmeta);

// The exact bytes dc_st_write would write, into a malloc'd buffer (*out, *len;
// free() it), for tests, fuzzing and tools that send files elsewhere.
int dc_st_serialize(const dc_st_entry *entries, int count, const char *const *meta_keys,
                    const char *const *meta_values, int nmeta, uint8_t **out, size_t *len);
