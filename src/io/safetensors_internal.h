// Shared by the safetensors reader, writer and checksum code; not an API.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "io/safetensors.h"

// The reference reader's limit; it keeps a hostile header from costing memory.
#define DC_ST_MAX_HEADER 100000000ull

// Little-endian loads from unaligned bytes; compilers turn these into one mov.
static inline uint16_t dc_ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t dc_ld32(const uint8_t *p) { return (uint32_t)dc_ld16(p) | (uint32_t)dc_ld16(p + 2) << 16; }
static inline uint64_t dc_ld64(const uint8_t *p) { return (uint64_t)dc_ld32(p) | (uint64_t)dc_ld32(p + 4) << 32; }

// numel and byte size of a shape, or -1 on 64-bit overflow.
static inline int dc_st_shape_bytes(const int64_t *shape, int ndim, dc_dtype dt, int64_t *numel,
                                    uint64_t *bytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        uint64_t s = (uint64_t)shape[i];
        if (s && n > (uint64_t)INT64_MAX / s) return -1;
        n *= s;
    }
    uint64_t es = dc_dtype_size(dt);
    if (n > UINT64_MAX / es) return -1;
    *numel = (int64_t)n, *bytes = n * es;
    return 0;
}

// ---- checksums (layout in safetensors.h) -------------------------------------

#define DC_ST_SUM_PREFIX "checksum."
#define DC_ST_SUM_HEADER "checksum.__metadata__"
#define DC_ST_SUM_HEX 16  // digits of one checksum value

// A tensor as the header digest sees it.
typedef struct {
    const char *name;
    dc_dtype dtype;
    int ndim;
    const int64_t *shape;
} dc_st_desc;

// The digest of the metadata (every pair but DC_ST_SUM_HEADER) and the
// tensor list (names, dtypes, shapes), in the canonical order of safetensors.h.
int dc_st_header_digest(const char *const *keys, const char *const *values, int nmeta,
                        const dc_st_desc *tensors, int count, uint64_t *out);
// "0123456789abcdef" into out[DC_ST_SUM_HEX + 1].
void dc_st_hex(uint64_t v, char *out);

// Before any tensor data is read: decides whether f must be verified, checks
// its header checksum and collects the stored checksum of every tensor into a
// new array *want (free it; NULL when there is nothing to verify: the file
// carries no checksums, or flags hold DC_ST_NO_VERIFY).
int dc_st_verify_header(const dc_st_file *f, unsigned flags, uint64_t **want);
// Compares the digests of the data (got[count], in tensor order) with want.
int dc_st_verify_data(const dc_st_file *f, const uint64_t *want, const uint64_t *got);
