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

// SHA-256 (FIPS 180-4): the cryptographic digest that names a file where
// people compare files across tools (sha256sum, AUTOMATIC1111's model hash,
// Hugging Face's LFS pointers). Streaming, like the state above.
typedef struct {
    uint32_t h[8];      // the chaining value
    uint64_t total;     // bytes fed so far
    uint8_t buf[64];    // a partial 64-byte block
    uint32_t nbuf;
} dc_sha256_state;

void dc_sha256_init(dc_sha256_state *s);
void dc_sha256_update(dc_sha256_state *s, const void *data, size_t n);
void dc_sha256_final(const dc_sha256_state *s, uint8_t out[32]);  // the state may be fed further
// The digest as 64 lowercase hex digits and a NUL.
void dc_sha256_hex(const uint8_t digest[32], char hex[65]);
