// Training data streamed from MDS shards (io/mds.h), and the order the
// samples are visited in.
//
// The order follows MosaicML streaming's idea (docs: shuffling.md,
// elastic_determinism.md) with the engine's counter-based RNG instead of
// numpy's: each epoch
//   1. the shards are put in an order drawn from Philox keyed by (seed, epoch),
//      their samples laid end to end in that order;
//   2. that sequence is cut into blocks of `block` samples, and each block's
//      samples are shuffled with a key of (seed, epoch, block), so a block
//      mixes the samples of every shard it spans (block / shard size of them).
// The global order is a function of (seed, epoch, block size, the shards'
// sample counts) alone. Ranks never enter it: global batch g of an epoch is
// positions [pos + g B, pos + (g + 1) B), and rank r of R takes the r-th
// contiguous slice of B / R of them, so 1, 2, 3 or 6 ranks see, step by step,
// the same global batches in the same order. That is what MosaicML's
// canonical nodes buy: here there is one canonical stream, and physical ranks
// only slice it. The position (epoch, samples of it consumed) is the whole
// state: a run resumes mid-epoch exactly, on any number of ranks.
// Memory: the shard order and one block's permutation (4 bytes a sample).
#pragma once
#include <stdint.h>

#include "io/mds.h"

#define DC_STREAM_BLOCK 262144  // samples per shuffle block: streaming's default 1 << 18

typedef struct {
    int nshards;
    int64_t n;            // samples
    int64_t *first;       // [nshards + 1] the shards' first global sample, in data set order
    uint64_t seed;
    int64_t block;
    int64_t epoch;        // the epoch `visit` and `vstart` hold, -1 none
    int *visit;           // [nshards] the shard visited k-th this epoch
    int64_t *vstart;      // [nshards + 1] where the k-th visited shard starts in the epoch's sequence
    int64_t perm_block;   // the block `perm` holds (of epoch perm_epoch), -1 none
    int64_t perm_epoch;
    uint32_t *perm;       // [block] that block's shuffle
} dc_stream_order;

// A uniform integer in [0, bound) for draw i keyed by (seed, a, tag): the
// draws of this order's shuffles (tag names the shuffle), and of others built
// on it (train/buckets.c).
uint64_t dc_stream_uniform_below(uint64_t seed, uint64_t i, uint32_t a, uint32_t tag, uint64_t bound);
// counts[k]: samples of shard k (some may be 0; their sum 1..2^40). block >= 1.
int dc_stream_order_init(dc_stream_order *o, const int64_t *counts, int nshards, uint64_t seed, int64_t block);
void dc_stream_order_free(dc_stream_order *o);
// The global sample index at position pos (0 <= pos < n) of epoch `epoch`.
int64_t dc_stream_order_at(dc_stream_order *o, int64_t epoch, int64_t pos);
// Rank `rank` of `ranks`' share of the global batch of `global` samples that
// starts at position pos of the epoch: global / ranks samples (ranks must
// divide global, and pos + global <= n).
int dc_stream_order_batch(dc_stream_order *o, int64_t epoch, int64_t pos, int64_t global, int rank, int ranks,
                          int64_t *out);

// A data set over MDS shards with its columns named by the caller (e.g.
// "latents_mean", "latents_logvar", "text_embeddings", "caption"): shards are
// read as samples are asked for, never loaded whole.
typedef struct {
    dc_mds_reader *mds;
    dc_stream_order order;
    int ncols;
    int *col;             // [ncols] the data set's column for each name asked for
    dc_mds_sample sample; // the last sample read
    int64_t epoch, pos;   // the position: samples of `epoch` already handed out
} dc_stream;

int dc_stream_open(dc_stream *s, const char *dir, const char *const *columns, int ncols, uint64_t seed,
                   int64_t block);
void dc_stream_close(dc_stream *s);
// Moves to position pos of epoch (from a checkpoint).
int dc_stream_seek(dc_stream *s, int64_t epoch, int64_t pos);
// This rank's samples of the next global batch, then the position moves on by
// `global` samples. An epoch ends when fewer than `global` samples are left
// (those are not visited: every step has a whole batch on every rank); the
// next global batch is then the next epoch's first.
int dc_stream_next(dc_stream *s, int64_t global, int rank, int ranks, int64_t *samples);
// Reads sample i; then dc_stream_column gives its columns.
int dc_stream_read(dc_stream *s, int64_t i);
// Column k (index into the names given to dc_stream_open) of the sample read last.
int dc_stream_column(const dc_stream *s, int k, dc_mds_array *out);
// Column k as `count` floats (any dtype; the count must match).
int dc_stream_f32(const dc_stream *s, int k, float *dst, int64_t count);
