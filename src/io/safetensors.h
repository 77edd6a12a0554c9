// safetensors files: a u64 little-endian header length N, N bytes of JSON,
// then the data buffer. The reader validates everything the reference reader
// does (header size, UTF-8 JSON, duplicate names, offsets tiling the buffer
// exactly, shape x dtype size == byte length with overflow checks) and never
// reads out of bounds, whatever the file holds.
//
// Checksums. Every file the writer makes carries, in __metadata__, the
// xxHash64 (seed 0, 16 lowercase hex digits) of each tensor's bytes under
// "checksum.<tensor name>", and under "checksum.__metadata__" the xxHash64 of
// the rest of the header in a canonical form: for each metadata pair other
// than that one, sorted by key (bytewise), 'M' len(key) key len(value) value;
// then for each tensor, sorted by name, 'T' len(name) name len(dtype) dtype
// ndim dim0 dim1 ..., every len and number as 8 little-endian bytes. Data
// offsets are left out, so a loader that lays the same tensors out anew keeps
// the file valid. Metadata values stay strings, so PyTorch and the reference
// reader load these files as any other (a DiT-XL/2 checkpoint's 586 tensors
// add 34 KB to its 10 GB).
//
// Readers verify a file that carries checksums (every tensor, and the
// header before any data is read), and refuse one whose "format" says it was
// written by this engine with checksums ("diffusion.c <kind> v2" or later)
// but carries none. Files from elsewhere, and older files, have none and load
// as they are. Hashing runs as the data arrives, so verifying costs no second
// pass over the file (xxHash64 runs at several GB/s per core).
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
    uint8_t *data;           // the data buffer when the file is in memory; NULL when it is
                             // read on demand (read tensors with dc_st_read_*, never here)
    uint64_t data_len;
    void *mem;               // owning allocation: the whole file in memory, or (read on
                             // demand) its first 8 + header-length bytes
    size_t mem_len;
    bool on_demand;          // the data stays in the file: each read of a tensor reads it
    int fd;                  // on_demand: the open file (closed by dc_st_close)
    uint64_t data_at;        // on_demand: where the data buffer starts in the file
    bool verified;           // the file carries checksums and every one matched
} dc_st_file;

// Opens and validates a file, and verifies its checksums when it has them.
// Refuses anything but a regular file (a FIFO, a device) without blocking.
// On error the message names the file and the problem (the tensor, or
// "metadata", whose checksum does not match).
//
// A file under DC_ST_MEMORY_MAX bytes is read into memory whole. A larger one
// (a model's weights) is read on demand: its header is kept and each tensor is
// read from the file (pread) when the loader asks for it, straight into the
// loader's buffer, so a multi-GB file never sits in memory beside the weights
// made from it. It is not mapped: a mapped file that another process
// truncates kills the reader with SIGBUS on the next page it touches, while a
// read of a file cut short after it was opened fails with a message naming it.
#define DC_ST_MEMORY_MAX (64u << 20)
int dc_st_open(dc_st_file *f, const char *path);
// dc_st_open with flags: DC_ST_NO_VERIFY skips checking stored checksums
// (for multi-GB files one trusts, or to rescue a damaged one); DC_ST_ON_DEMAND
// reads the data on demand whatever the file's size.
enum { DC_ST_NO_VERIFY = 1u, DC_ST_ON_DEMAND = 2u };
int dc_st_open_opts(dc_st_file *f, const char *path, unsigned flags);
// Same, over bytes in memory (copied), for tests and fuzzing; name is for messages.
int dc_st_parse(dc_st_file *f, const void *bytes, size_t len, const char *name);
int dc_st_parse_opts(dc_st_file *f, const void *bytes, size_t len, const char *name, unsigned flags);
void dc_st_close(dc_st_file *f);
const dc_st_tensor *dc_st_find(const dc_st_file *f, const char *name);
const char *dc_st_meta(const dc_st_file *f, const char *key);  // NULL if absent

// Reading a tensor (from memory, or from the file for one read on demand;
// several threads may read one file at once). A file cut short since it was
// opened fails with a message naming it.
// Converts a float tensor (F32, F16, BF16, F64, F8) to f32 into out[numel].
int dc_st_read_f32(const dc_st_file *f, const dc_st_tensor *t, float *out);
// Converts an integer tensor (I64, I32, I16, I8, U8) to int64 into out[numel].
int dc_st_read_i64(const dc_st_file *f, const dc_st_tensor *t, int64_t *out);
// Copies the tensor's bytes as stored (little-endian) into out[end - begin].
int dc_st_read_raw(const dc_st_file *f, const dc_st_tensor *t, void *out);

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
// meta_keys/meta_values: nmeta string pairs for __metadata__ (may be 0; keys
// unique, none starting with "checksum.": the writer adds the checksums).
int dc_st_write(const char *path, const dc_st_entry *entries, int count,
                const char *const *meta_keys, const char *const *meta_values, int nmeta);

// The exact bytes dc_st_write would write, into a malloc'd buffer (*out, *len;
// free() it), for tests, fuzzing and tools that send files elsewhere.
int dc_st_serialize(const dc_st_entry *entries, int count, const char *const *meta_keys,
                    const char *const *meta_values, int nmeta, uint8_t **out, size_t *len);
