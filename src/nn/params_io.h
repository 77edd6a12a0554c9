// Parameters in safetensors files, by name: any model's weights load and
// save the same way, each tensor under prefix + its state-dict key.
#pragma once
#include "io/safetensors.h"
#include "nn/params.h"

// Loads every parameter into dst (a flat buffer of ps's layout: ps->data, or
// another copy such as an EMA) from tensors named prefix + key (any float
// dtype), checking each shape; a NaN or infinity is refused, naming the
// tensor and element. A fixed (non-trainable) tensor may be absent: the
// model computes it at creation. Frozen tensors are not in the flat layout
// and are left as they are. Does not mark the compute copy stale.
int dc_params_load(const dc_params *ps, dc_buf dst, const dc_st_file *f, const char *prefix);
// Fills entries[ps->count] naming prefix + key, pointing into host[numel]
// (a host copy of the flat buffer `src`, downloaded here); names are
// written into names[]. Refuses a set with frozen parameters.
int dc_params_entries(const dc_params *ps, dc_buf src, const char *prefix, float *host,
                      dc_st_entry *entries, char (*names)[128]);
