// xxHash64 (XXH64, Yann Collet; the algorithm of the reference xxhash.c,
// https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md): a fast,
// non-cryptographic 64-bit checksum. It detects accidental corruption (bit
// rot, truncation, a slipped edit) at several GB/s per core; it does not
// protect against someone who means to forge a file.
//
// The streaming state gives the same digest as the one-shot call whatever
// the sizes of the pieces fed to it, so a file can be hashed while it is read
// or written.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t v[4];      // the four lane accumulators
    uint64_t total;     // bytes fed so far
    uint64_t seed;
    uint8_t buf[32];    // a partial 32-byte stripe
    uint32_t nbuf;
} dc_xxh64_state;

void dc_xxh64_init(dc_xxh64_state *s, uint64_t seed);
void dc_xxh64_update(dc_xxh64_state *s, const void *data, size_t n);
uint64_t dc_xxh64_digest(const dc_xxh64_state *s);  // the state may be fed further
uint64_t dc_xxh64(const void *data, size_t n, uint64_t seed);

// Feeds v as 8 little-endian bytes (lengths and counts in canonical encodings).
void dc_xxh64_update_u64(dc_xxh64_state *s, uint64_t v);
