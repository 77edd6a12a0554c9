// DreamBooth's batches (diffusers' train_dreambooth.py with prior
// preservation) as a data source (train/source.h): every global batch of 2b
// samples is b of the instance set's, then b of the class set's, each set in
// its own order (as it would be alone at global batch b: train/shards.h), so
// the order depends on (seed, epoch, batch) alone and a run resumes exactly
// on any number of ranks.
//
// The samples' losses weigh 2 (instance) and 2 prior_weight (class): with the
// trainer's mean over the batch, the loss is mean(instance) + prior_weight
// mean(class), as diffusers computes it.
#pragma once
#include "train/source.h"

// Takes over inst and cls (closed with s, also on failure). Both must hold
// samples of one kind (channels, size, conditioning), of one size each.
int dc_source_pairs(dc_source *s, dc_source *inst, dc_source *cls, float prior_weight);
