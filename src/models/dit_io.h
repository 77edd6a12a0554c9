// DiT configs and weights in safetensors files: our own files carry the
// config in __metadata__; plain official state dicts have their config
// inferred from tensor shapes.
#pragma once
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/dit.h"

// Writes the config as metadata entries ("input_size", "patch_size", ...).
int dc_dit_config_to_kv(const dc_dit_config *cfg, dc_kv *kv);
// The config of metadata entries as dc_dit_config_to_kv writes them, checked.
int dc_dit_config_from_kv(const dc_kv *kv, dc_dit_config *cfg);
// The config of a file: from its metadata when present (and then checked
// against the tensor shapes, so a damaged config cannot size the model),
// otherwise inferred from the shapes of the tensors named prefix + official
// key, each dimension range-checked before any arithmetic. heads > 0
// overrides the number of heads (which no weight shape reveals).
int dc_dit_config_from_file(const dc_st_file *f, const char *prefix, int heads,
                            dc_dit_config *cfg);
// Loads every parameter from tensors named prefix + official key (any float
// dtype), checking each shape; a NaN or infinity is refused, naming the tensor
// and element. pos_embed may be absent (it is fixed).
int dc_dit_load_weights(dc_dit *m, const dc_st_file *f, const char *prefix);
// Fills entries[m->params.count] naming prefix + key, pointing into host[numel]
// (a host copy of the flat buffer `src`); names are allocated into names[].
int dc_dit_weight_entries(const dc_dit *m, dc_buf src, const char *prefix, float *host,
                          dc_st_entry *entries, char (*names)[128]);
