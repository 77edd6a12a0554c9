// Where the trainer's samples come from: the seam between training and data.
//
// A source says how many samples it has, their shape, what they are
// conditioned on, and a fingerprint; it puts them in an order, and fills a
// sample's x0 and its conditioning when the trainer stages a micro-batch.
// Two sources exist: a data set in memory (train/data.h), here, and MDS
// shards streamed from disk (train/shards.h).
//
// Every draw a source makes (a latent from its distribution) is keyed, like
// the trainer's own, by (seed, key = the sample's place in the global batch,
// step), so micro-batches and ranks never change a number.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "models/model.h"
#include "train/data.h"

typedef struct dc_source dc_source;

typedef struct {
    // The sample at position g of the run (g samples handed out before it,
    // over all epochs) of a run whose global batch is `batch`.
    int (*index)(dc_source *s, int64_t g, int batch, int64_t *idx);
    // Sample idx's x0 [channels, height, width] into dst, mirrored left-right
    // if flip (only where s->flips); seed, key and step key its draws.
    int (*x0)(dc_source *s, int64_t idx, bool flip, uint64_t seed, uint32_t key, uint32_t step, float *dst);
    // Its conditioning: labels: *label. Text: ctx [text_len, text_dim] and
    // *len, the tokens that count; with drop the empty prompt's instead.
    int (*cond)(dc_source *s, int64_t idx, bool drop, int32_t *label, float *ctx, int32_t *len);
    // Token ids (DC_COND_TOKENS): ids [text_len] of its caption and *len, the
    // ids that count (BOS to EOS); with drop the empty prompt's. NULL for a
    // source without captions.
    int (*ids)(dc_source *s, int64_t idx, bool drop, int32_t *ids, int32_t *len);
    // Sample idx's height and width, where samples differ in them (buckets:
    // train/buckets.h; the source's height and width are then the largest's).
    // NULL: every sample is height x width.
    void (*size)(dc_source *s, int64_t idx, int *height, int *width);
    // The weight of sample idx's loss (DreamBooth's prior preservation
    // weighs the class pictures: train/pairs.h). NULL: 1 for every sample.
    float (*weight)(dc_source *s, int64_t idx);
    void (*close)(dc_source *s);
} dc_source_ops;

struct dc_source {
    const dc_source_ops *ops;
    int64_t n;                    // samples
    int channels, height, width;  // one sample's x0
    bool flips;                   // x0 are pictures, which may be mirrored (latents are not)
    dc_cond_kind cond;
    int num_classes;              // labels: the classes the data uses
    int text_len, text_dim;       // text: one sample's embeddings; tokens: text_len ids (text_dim 0)
    // A hash of what the samples are: a resumed run compares it with the
    // checkpoint's; 0 when unknown (data not made by a loader).
    uint64_t fingerprint;
    const char *name;             // for messages
    void *impl;
};

// The samples of ds (not copied: it must outlive the source), in dc_order's
// order of (seed, epoch): position g is sample g % n of epoch g / n, so an
// epoch's last batch runs on into the next epoch.
int dc_source_dataset(dc_source *s, const dc_dataset *ds, uint64_t seed);
void dc_source_close(dc_source *s);
