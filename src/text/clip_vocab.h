// The tables of a loaded CLIP vocabulary, shared by the loader
// (clip_tokenizer.c) and the encoder (clip_encode.c). Private to src/text.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "text/clip_tokenizer.h"

// A token string: bytes in the arena, and its id.
typedef struct {
    uint64_t hash;
    uint32_t off, len;
    int32_t id;  // -1: empty slot
} vocab_slot;

typedef struct {
    uint64_t key;  // left << 32 | right; UINT64_MAX: empty
    int32_t rank;
} pair_slot;

struct dc_clip_vocab {
    char *arena;  // the token strings, back to back
    size_t arena_len, arena_cap;
    vocab_slot *slots;  // open addressing, a power of two, at most half full
    size_t nslots;
    pair_slot *pairs;  // (left id, right id) -> rank, same scheme
    size_t npairs;
    int32_t *left, *right, *result;  // [n_merges] the ids of each rule's parts and product
    int32_t byte_id[256], byte_end_id[256];  // each byte's symbol, and with "</w>"
};

static inline uint64_t dc_clip_pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

// The slot of a pair: its own, or the empty one where it would go.
static inline pair_slot *dc_clip_pair_slot(const dc_clip_vocab *v, uint64_t key) {
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> 32 & (v->npairs - 1);; i = (i + 1) & (v->npairs - 1))
        if (v->pairs[i].key == key || v->pairs[i].key == UINT64_MAX) return &v->pairs[i];
}

// The rank of merging symbols a and b, or -1.
static inline int32_t dc_clip_pair_rank(const dc_clip_vocab *v, int32_t a, int32_t b) {
    const pair_slot *e = dc_clip_pair_slot(v, dc_clip_pair_key(a, b));
    return e->key == UINT64_MAX ? -1 : e->rank;
}
