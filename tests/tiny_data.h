// A tiny labelled data set for the trainer tests: n images of 1 x 8 x 8 with
// fixed non-zero pixels in [-1, 1], two classes, as a loader would leave them.
#pragma once
#include <stdlib.h>
#include <string.h>

#include "train/data.h"

static inline void tiny_data(dc_dataset *ds, int n) {
    memset(ds, 0, sizeof *ds);
    ds->n = n, ds->channels = 1, ds->height = 8, ds->width = 8, ds->num_classes = 2;
    ds->images = malloc((size_t)n * 64 * sizeof *ds->images);
    ds->labels = malloc((size_t)n * sizeof *ds->labels);
    for (int i = 0; i < n * 64; i++) ds->images[i] = (float)((i * 37) % 255) / 127.5f - 1.0f;
    for (int i = 0; i < n; i++) ds->labels[i] = i % 2;
    ds->fingerprint = dc_dataset_fingerprint(ds);
}
