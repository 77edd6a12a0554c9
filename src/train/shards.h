// A data source (train/source.h) over MDS shards as `diffusion prepare`
// writes them, streamed from disk (train/stream.h: shards read as samples are
// asked for, in its elastic order).
//
// x0 comes from either
//   latents_mean, latents_logvar  fp16 [C, h, w], the VAE's distribution (its
//       scaling factor not applied): each visit draws a fresh latent,
//       x0 = scale * (mean + exp(logvar / 2) * randn), randn keyed by
//       (seed, key, step, DC_STREAM_LATENT, element) as every training draw
//       is; latents cannot be mirrored (no flips);
//   pixels  uint8 [3, H, W] (prepare --vae none): x0 = pixels / 127.5 - 1.
// Text conditioning: text_embeddings fp16 [T, D] and text_tokens (the tokens
// that count).
//
// The empty prompt. A dropped caption (classifier-free guidance) takes the
// empty prompt's embeddings, which the caller gives: the text encoder that
// embedded the captions encodes "" once. The shards do not hold it, so one
// data set serves any dropout, and the embedding always matches the encoder
// that samples later.
//
// Order: position g of the run is position g % E of epoch g / E in
// dc_stream_order_at's order, E the samples of an epoch that fill whole
// global batches (the rest of an epoch is not visited, as dc_stream_next
// does): it depends on the seed, the block and the global batch, never on
// the ranks or micro-batches.
#pragma once
#include <stdint.h>

#include "train/source.h"

typedef struct {
    const char *dir;          // the folder holding index.json
    uint64_t seed;            // the order's (the run's seed)
    int64_t block;            // shuffle block (DC_STREAM_BLOCK)
    float latent_scale;       // latents: the VAE's scaling factor (prepare.json's latent_scaling_factor)
    const float *text_null;   // [T, D] the empty prompt embedded (copied)
    int text_null_len;        // its tokens that count
} dc_shards_opts;

int dc_source_shards(dc_source *s, const dc_shards_opts *o);
