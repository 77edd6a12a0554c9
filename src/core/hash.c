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
