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
//   pixels  uint8 [3, H, W] (prepare --vae none): x0 = pixels / 127.5 - 1;
//   a column named by latents_column holding one latent [C, h, w] a sample,
//       no distribution (MosaicML's latents_256, say): x0 = scale * latent.
// Text conditioning: text_embeddings fp16 [T, D] and text_tokens (the tokens
// that count), or a column named by text_column [T, D] (MosaicML's
// caption_latents), whose every position counts (len = T, the empty
// prompt's too): such data sets hold no token counts.
//
// Columns are ndarrays of a static shape, or "bytes" holding raw values
// whose dtype and shape the caller gives (dc_shards_raw): every sample's
// byte length is checked against them.
//
// Token ids instead (a model that embeds its own text, trained with its text
// encoder): with a tokenizer given, the text is the caption column (str)
// tokenized as txt2img tokenizes a prompt, and no embeddings are read.
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

#include "core/dtype.h"
#include "text/clip_tokenizer.h"
#include "train/source.h"

#define DC_SHARDS_MAX_DIMS 4

// A "bytes" column's values: DC_F16, DC_BF16 or DC_F32, of a shape.
typedef struct {
    const char *name;
    dc_dtype dtype;
    int ndim;
    int64_t shape[DC_SHARDS_MAX_DIMS];
} dc_shards_raw;

typedef struct {
    const char *dir;          // the folder holding index.json
    uint64_t seed;            // the order's (the run's seed)
    int64_t block;            // shuffle block (DC_STREAM_BLOCK)
    float latent_scale;       // latents: the VAE's scaling factor (prepare.json's latent_scaling_factor)
    const float *text_null;   // [T, D] the empty prompt embedded (copied); not with tok
    int text_null_len;        // its tokens that count
    // The mapping (NULL, 0: the columns `diffusion prepare` writes). It
    // enters the fingerprint when given, so a resume on another is caught.
    const char *latents_column;  // single latents, x0 = latent_scale * latent
    const char *text_column;     // text embeddings without token counts
    const dc_shards_raw *raw;    // the bytes columns among those read
    int nraw;
    const dc_clip_tokenizer *tok;  // token ids of the captions (must outlive the source); NULL: embeddings
} dc_shards_opts;

int dc_source_shards(dc_source *s, const dc_shards_opts *o);
