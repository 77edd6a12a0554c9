// A micro-batch's conditioning (models/model.h's dc_cond) as the trainer
// stages it from its data source (train/source.h): each row's class label,
// its text embeddings with their length, or its caption's token ids with
// theirs; or, for a row dropped for guidance, the unconditional one (the null
// label, or the empty prompt's embeddings or ids).
// Rows are gathered on the host and uploaded with one copy a buffer.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "models/model.h"
#include "train/source.h"

typedef struct {
    dc_cond_kind kind;  // the source's
    int rows;           // the most rows (the micro-batch)
    int32_t *labels;    // [rows] DC_COND_LABELS
    float *ctx;         // [rows, len, dim] DC_COND_TEXT
    int32_t *ids;       // [rows, len] DC_COND_TOKENS
    int32_t *lens;      // [rows] DC_COND_TEXT, DC_COND_TOKENS
    dc_cond dev;        // on the backend: y [rows] I32, ctx [rows, len, dim] F32 or ids [rows, len] I32,
                        // and lens [rows] I32
} dc_batch_cond;

// Host and backend buffers for up to `rows` rows of src's conditioning.
int dc_batch_cond_init(dc_batch_cond *c, const dc_source *src, dc_backend *be, int rows);
// Row i takes sample idx's conditioning, or with drop the unconditional one
// (null_label for labels: the model's num_classes).
int dc_batch_cond_set(dc_batch_cond *c, dc_source *src, int i, int64_t idx, bool drop, int null_label);
// Copies rows 0..n-1 to the backend (dev).
void dc_batch_cond_upload(dc_batch_cond *c, dc_backend *be, int n);
void dc_batch_cond_free(dc_batch_cond *c, dc_backend *be);
