#include "core/hash.h"

#include <string.h>

static const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full,
                      P3 = 0x165667B19E3779F9ull, P4 = 0x85EBCA77C2B2AE63ull,
                      P5 = 0x27D4EB2F165667C5ull;

static inline uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

// Little-endian loads from unaligned bytes: one mov on a little-endian host
// (the byte-wise form is three times slower there).
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
#else
static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
#endif

static inline uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
static inline uint64_t merge64(uint64_t h, uint64_t v) { return (h ^ round64(0, v)) * P1 + P4; }

// Consumes whole 32-byte stripes of p[0, n); returns the bytes used.
static size_t stripes(uint64_t v[4], const uint8_t *p, size_t n) {
    size_t i = 0;
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
    for (; i + 32 <= n; i += 32) {
        a = round64(a, rd64(p + i));
        b = round64(b, rd64(p + i + 8));
        c = round64(c, rd64(p + i + 16));
        d = round64(d, rd64(p + i + 24));
    }
    v[0] = a, v[1] = b, v[2] = c, v[3] = d;
    return i;
}

void dc_xxh64_init(dc_xxh64_state *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->v[0] = seed + P1 + P2, s->v[1] = seed + P2, s->v[2] = seed, s->v[3] = seed - P1;
}

void dc_xxh64_update(dc_xxh64_state *s, const void *data, size_t n) {
    const uint8_t *p = data;
    if (!n) return;
    s->total += n;
    if (s->nbuf) {  // complete the pending stripe first
        size_t take = 32 - s->nbuf < n ? 32 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += (uint32_t)take, p += take, n -= take;
        if (s->nbuf < 32) return;
        stripes(s->v, s->buf, 32);
        s->nbuf = 0;
    }
    size_t used = stripes(s->v, p, n);
    memcpy(s->buf, p + used, n - used);
    s->nbuf = (uint32_t)(n - used);
}

uint64_t dc_xxh64_digest(const dc_xxh64_state *s) {
    uint64_t h;
    if (s->total >= 32) {
        const uint64_t *v = s->v;
        h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        for (int i = 0; i < 4; i++) h = merge64(h, v[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total;
    // the tail: the bytes after the last whole stripe, 8, then 4, then 1 at a time
    const uint8_t *p = s->buf;
    size_t n = s->nbuf;
    for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round64(0, rd64(p)), 27) * P1 + P4;
    if (n >= 4) h = rotl(h ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3, p += 4, n -= 4;
    for (; n > 0; p++, n--) h = rotl(h ^ (uint64_t)*p * P5, 11) * P1;
    // avalanche
    h ^= h >> 33, h *= P2;
    h ^= h >> 29, h *= P3;
    return h ^ (h >> 32);
}

uint64_t dc_xxh64(const void *data, size_t n, uint64_t seed) {
    dc_xxh64_state s;
    dc_xxh64_init(&s, seed);
    dc_xxh64_update(&s, data, n);
    return dc_xxh64_digest(&s);
}

void dc_xxh64_update_u64(dc_xxh64_state *s, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    dc_xxh64_update(s, b, 8);
}

// ---- SHA-256 (FIPS 180-4, section 6.2) ----------------------------------------

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t rotr32(uint32_t x, int r) { return x >> r | x << (32 - r); }

// One 64-byte block into the chaining value h.
static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^ w[t - 15] >> 3;
        uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^ w[t - 2] >> 10;
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g)) + K256[t] + w[t];
        uint32_t t2 = (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void dc_sha256_init(dc_sha256_state *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->total = 0, s->nbuf = 0;
}

void dc_sha256_update(dc_sha256_state *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->total += n;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += (uint32_t)take, p += take, n -= take;
        if (s->nbuf < 64) return;
        sha256_block(s->h, s->buf);
        s->nbuf = 0;
    }
    for (; n >= 64; p += 64, n -= 64) sha256_block(s->h, p);
    memcpy(s->buf, p, n);
    s->nbuf = (uint32_t)n;
}

void dc_sha256_final(const dc_sha256_state *s, uint8_t out[32]) {
    // The message, a 1 bit, zeros up to 56 bytes of a block, its bit length
    // as 8 big-endian bytes.
    uint32_t h[8];
    uint8_t tail[128] = {0};
    memcpy(h, s->h, sizeof h);
    memcpy(tail, s->buf, s->nbuf);
    tail[s->nbuf] = 0x80;
    const size_t len = s->nbuf < 56 ? 64 : 128;
    const uint64_t bits = s->total * 8;
    for (int i = 0; i < 8; i++) tail[len - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t off = 0; off < len; off += 64) sha256_block(h, tail + off);
    for (int i = 0; i < 8; i++)
        out[4 * i] = (uint8_t)(h[i] >> 24), out[4 * i + 1] = (uint8_t)(h[i] >> 16), out[4 * i + 2] = (uint8_t)(h[i] >> 8),
        out[4 * i + 3] = (uint8_t)h[i];
}

void dc_sha256_hex(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) hex[2 * i] = digits[digest[i] >> 4], hex[2 * i + 1] = digits[digest[i] & 15];
    hex[64] = 0;
}
