// The model registry: the one table that maps an architecture's name (a
// file's "model" metadata entry, a config.json's "_class_name", --model's
// preset) to its constructor. A config is a list of metadata entries
// (dc_kv), "model" first, exactly as checkpoints store it, so a model made
// from flags, from a preset, from a file or from a config.json goes through
// the same constructor.
#pragma once
#include <stdbool.h>
#include "io/json.h"
#include "io/kv.h"
#include "io/safetensors.h"
#include "models/model.h"

// What a data set gives a new model's config: the shape of its samples and
// its class count.
typedef struct {
    int channels, frames, height, width, num_classes;
} dc_data_shape;

typedef struct {
    const char *name;          // as the "model" metadata entry names it ("DiT")
    const char *presets_help;  // its named configs for --help ("DiT-{S,B,L,XL}/{2,4,8}"), NULL: none
    // The config of a named preset into *cfg; NULL names the architecture's
    // demo model. 1 (no message) when the name is not one of its presets.
    int (*preset)(const char *name, dc_kv *cfg);
    // *out = base with overrides applied (entries derived from an overridden
    // one, such as a default width from another, follow it) and checked,
    // naming the entry at fault. The entries a data set gives (sample shape,
    // classes) come from overrides, else from data; with data NULL they are
    // left 0 ("the data's") and the rest is checked as far as it goes.
    int (*configure)(const dc_kv *base, const dc_kv *overrides, const dc_data_shape *data, dc_kv *out);
    // The config a file holds: its metadata, or inferred from the shapes of
    // the tensors named prefix + key. heads > 0 overrides the head count of
    // attention models (which no weight shape reveals).
    int (*config_of_file)(const dc_st_file *f, const char *prefix, int heads, dc_kv *cfg);
    // The config of a diffusers/transformers config.json already parsed
    // (root; path for messages). NULL: the architecture has none.
    int (*config_of_json)(const dc_json *root, const char *path, dc_kv *cfg);
    // Creates the model of a complete config on be, for training as grad
    // says (nn/params.h: DC_GRAD_NONE, inference); be NULL creates a layout: parameters registered (names,
    // shapes, units) but nothing allocated, for sizing (info, params,
    // activation_bytes, macs_per_image, describe, config_to_kv).
    int (*create)(const dc_kv *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out);
} dc_model_arch;

// The architecture named `name`, or NULL with a message listing those this
// engine builds.
const dc_model_arch *dc_model_arch_find(const char *name);
// The config of a named preset ("DiT-XL/2"), or with name NULL the demo model
// (the default architecture's), into *cfg (cleared first).
int dc_model_preset(const char *name, dc_kv *cfg);
// The presets of every architecture, for --help ("DiT-{S,B,L,XL}/{2,4,8}").
const char *dc_model_presets_help(void);
// The architecture's configure (above), picked by base's "model" entry.
int dc_model_configure(const dc_kv *base, const dc_kv *overrides, const dc_data_shape *data, dc_kv *out);
// The architecture's create (above), picked by cfg's "model" entry.
int dc_model_create(const dc_kv *cfg, dc_backend *be, dc_grad_mode grad, dc_model **out);
// For configure: refuses an override that is not one of `known` (NULL-ended)
// or a "model" other than arch, naming the entry.
int dc_model_overrides_known(const dc_kv *overrides, const char *arch, const char *const *known);
// For configure: the integer override `key` (1 to 2^30) into *v, *given 1;
// absent: *v kept, *given 0.
int dc_model_override_int(const dc_kv *overrides, const char *key, int *v, int *given);
// The config a file holds, by its architecture (models/model_io.h's
// dc_model_kind_of_file).
int dc_model_config_of_file(const dc_st_file *f, const char *prefix, int heads, dc_kv *cfg);
// The config a diffusers/transformers config.json at path holds, into *cfg
// (cleared first), by the architecture its "_class_name" (else "model") names.
int dc_model_config_of_json(const char *path, dc_kv *cfg);
