// Models from files: the "model" metadata entry (or, for a plain official
// state dict, the tensor names) picks the architecture in the registry
// (models/registry.h), which creates the model that file holds.
#pragma once
#include <stdbool.h>
#include "io/safetensors.h"
#include "models/model.h"

// The architecture a file holds ("DiT"), or NULL with the error set when it
// names one this engine does not build.
const char *dc_model_kind_of_file(const dc_st_file *f);
// Creates the model a file describes (config from its metadata, or inferred
// from its tensors) on be, with gradients if with_grad, and loads its weights
// from tensors named prefix + key. heads > 0 overrides the head count of
// attention models (which no weight shape reveals). *out is freed with
// dc_model_free.
int dc_model_load(const dc_st_file *f, const char *prefix, int heads, dc_backend *be, bool with_grad,
                  dc_model **out);
// Loads a created model's weights from tensors named prefix + key.
int dc_model_load_weights(dc_model *m, const dc_st_file *f, const char *prefix);
