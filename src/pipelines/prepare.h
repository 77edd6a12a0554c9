// `diffusion prepare`: captioned pictures (io/picture_set.h) to MDS shards
// (io/mds.h) of what text-to-image training reads every step, computed once:
//   caption          str
//   latents_mean     ndarray:float16:C,h,w  the VAE encoder's latent distribution,
//   latents_logvar   ndarray:float16:C,h,w  so each epoch draws a fresh latent
//                    (NOT multiplied by the VAE's scaling factor: the trainer does that)
//   pixels           ndarray:uint8:3,H,W    instead of the latents with no VAE (pixel-space models)
//   text_embeddings  ndarray:float16:77,D   the text encoder's output for the caption
//   text_tokens      int32                  positions that count: BOS, up to 75 tokens, EOS
//   original_width, original_height  int32 the picture before resizing
// Geometry: every picture resized (Lanczos) to cover size x size and
// centre-cropped, AUTOMATIC1111's "crop" mode; or, with buckets, kohya's
// aspect-ratio buckets: each picture to the bucket of the nearest aspect
// ratio, covered and centre-cropped the same way, and each bucket written as
// its own data set in a folder WxH/ (a batch is drawn from one folder).
//
// A run can be stopped anywhere (killed, or by the progress callback) and
// continues: shards are written whole (renamed into place), and after each
// shard the file prepare.progress.json records what the finished shards
// hold; a new run with the same settings checks those shards and goes on
// from there, giving the same bytes as a run never stopped.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "io/picture_set.h"
#include "pipelines/sd.h"

// ---- kohya's buckets (sd-scripts library/model_util.py, make_bucket_resolutions,
// and library/train_util.py, BucketManager.select_bucket)

typedef struct {
    int width, height;
} dc_bucket;

// The resolutions of `step`-pixel sides with area at most size^2: the square
// (floor(size / step) step), then for each width w from min_side to max_side
// in steps, h = min(max_side, floor(size^2 / w / step) step) when h >= min_side,
// both (w, h) and (h, w); without repeats, sorted by (width, height). *out is
// a new array of *n.
int dc_buckets_make(int size, int min_side, int max_side, int step, dc_bucket **out, int *n);
// The bucket whose width / height is nearest the picture's (the first of equals).
int dc_bucket_select(const dc_bucket *b, int n, int width, int height);

// ---- the run

typedef struct {
    const char *model;           // SD model: the text encoder, tokenizer and VAE are read
    const char *vocab;           // NULL: the model's tokenizer/
    const char *vocab_fallback;  // used when neither is there
    unsigned st_flags;           // DC_ST_NO_VERIFY ...
    bool no_vae;                 // write pixels, not latents (the model needs no VAE)
    int size;                    // the side (or, with buckets, the side of the area)
    bool buckets;
    int min_side, max_side;      // buckets' sides, multiples of 64
    int batch;                   // pictures encoded at once
    int64_t max_pixels;          // a picture's budget (0: DC_IMAGE_MAX_PIXELS)
    int64_t shard_bytes;         // MDS size_limit (0: streaming's 1 << 26)
    int zstd_level;              // 0: uncompressed shards
    bool overwrite;              // start over, removing what a run wrote there
    // Read the next batch's pictures on a thread of their own while the
    // device encodes a batch and the host writes the one before (for a GPU,
    // whose encoding leaves the host's cores idle, and which then never
    // waits for the host); the shards are the same bytes either way.
    bool overlap;
    // The VAE encoder takes a batch's pictures through each op together
    // (dc_vae_reserve_batch: a GPU's speed, for batch times the encoder's
    // activation memory) rather than one at a time; the latents are equal up
    // to the rounding of the GPU's convolution algorithms.
    bool vae_batch;
} dc_prepare_opts;

// Opened models: the text encoder and tokenizer (in a dc_sd_pipe without a
// UNet, so dc_sd_encode_prompts serves) and the VAE's encoder.
typedef struct {
    dc_sd_pipe sd;
    dc_backend *be;
    float scaling_factor;  // the VAE's (recorded, not applied); 0 without one
} dc_prepare_models;

int dc_prepare_models_load(dc_prepare_models *m, const dc_prepare_opts *o, dc_backend *be);
void dc_prepare_models_close(dc_prepare_models *m);

typedef struct {
    int64_t pictures;  // input pictures (before repeats)
    int64_t samples;   // samples written (repeats included), all runs together
    int64_t corrupt;   // pictures skipped as unreadable, all runs together
    int64_t resumed;   // samples found written by an earlier run (0: a fresh start)
    int nbuckets;      // data sets written (1 without buckets)
} dc_prepare_stats;

// Called after each batch: `done` of `total` pictures (repeats not counted)
// handled, `written` samples written in this run. Non-zero stops the run
// there, its work kept for the next one; dc_prepare_run then fails with the
// callback's message.
typedef int (*dc_prepare_progress_fn)(void *ctx, int64_t done, int64_t total, int64_t written);

// Writes the data set of `set` into folder `out` (created; continued when it
// holds an unfinished run with the same settings; refused when it holds
// anything else, unless o->overwrite). An unreadable picture is skipped with
// a warning naming it.
int dc_prepare_run(dc_prepare_models *m, const dc_picture_set *set, const char *out, const dc_prepare_opts *o,
                   dc_prepare_progress_fn progress, void *ctx, dc_prepare_stats *st);
