// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). Every
// draw is a pure function of (seed, counter), so noise keyed by (seed, sample
// index, step) is the same whatever the batch size, thread count or device.
#pragma once
#include <math.h>
#include <stdint.h>
#include "core/dtype.h"

typedef struct { uint32_t v[4]; } dc_u32x4;

DC_HD dc_u32x4 dc_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint64_t seed) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    dc_u32x4 o = {{c0, c1, c2, c3}};
    return o;
}

// Uniform in (0, 1): never 0, so log() is safe.
DC_HD float dc_u32_to_unit(uint32_t x) { return ((x >> 8) + 0.5f) * (1.0f / 16777216.0f); }

// Streams keep unrelated draws of one (sample, step) apart.
enum { DC_STREAM_NOISE = 0, DC_STREAM_TIMESTEP = 1, DC_STREAM_DROPOUT = 2, DC_STREAM_INIT = 3,
       DC_STREAM_SHUFFLE = 4, DC_STREAM_FLIP = 5, DC_STREAM_SAMPLE_START = 6,
       DC_STREAM_TRAIN_NOISE = 7, DC_STREAM_NOISE_OFFSET = 8, DC_STREAM_LATENT = 9 };

// Standard normal number j of the sequence keyed by (seed, key, step, stream):
// Box-Muller over one Philox block yields four normals (j / 4 is the counter).
DC_HD float dc_randn_at(uint64_t seed, uint32_t key, uint32_t step, uint32_t stream, uint32_t j) {
    dc_u32x4 r = dc_philox(j >> 2, key, step, stream, seed);
    int pair = (j >> 1) & 1, second = j & 1;
    float u1 = dc_u32_to_unit(r.v[2 * pair]), u2 = dc_u32_to_unit(r.v[2 * pair + 1]);
    float rad = sqrtf(-2.0f * logf(u1)), th = 6.283185307179586f * u2;
    return second ? rad * sinf(th) : rad * cosf(th);
}

// A uniform u32 keyed the same way (word j).
DC_HD uint32_t dc_rand_u32_at(uint64_t seed, uint32_t key, uint32_t step, uint32_t stream, uint32_t j) {
    dc_u32x4 r = dc_philox(j >> 2, key, step, stream, seed);
    return r.v[j & 3];
}
