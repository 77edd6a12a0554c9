// A data source (train/source.h) over a data set prepared in aspect-ratio
// buckets (`diffusion prepare --buckets`: a folder holding one data set of
// MDS shards for each bucket, WxH/, as train/shards.h reads them), whose
// every global batch comes from one bucket, as kohya's BucketManager makes
// them: pictures of one shape train together.
//
// Order. In epoch e, each bucket's samples are put in its own elastic order
// (train/shards.h, keyed by the run's seed, e and the bucket's index) and cut
// into global batches, a bucket's last (count mod batch) samples waiting for
// the next epoch; the batches of all buckets are then shuffled with a key of
// (seed, e), so the buckets take turns. Position g of the run is sample
// (g mod E) mod B of batch (g mod E) / B of epoch g / E, E the samples of an
// epoch's batches: a function of (seed, epoch, global batch) alone, never of
// the ranks or micro-batches, so a run resumes mid-epoch exactly, on any
// number of ranks, and all ranks' samples of a step share one shape.
//
// The source's height and width are those of its largest bucket (by area),
// which sizes the trainer's buffers; each sample's are its bucket's
// (dc_source_ops.size).
#pragma once
#include "train/shards.h"

// The data sets dirs[0..n-1] (one a bucket, n >= 1; every option of o but
// its dir applies to each) as one source; o->seed keys the order.
int dc_source_buckets(dc_source *s, const dc_shards_opts *o, const char *const *dirs, int n);
