// The weight files of a Stable Diffusion component folder, as diffusers and
// transformers write them, and the checks on the paths that lead to them:
//   - one file: diffusion_pytorch_model.safetensors / model.safetensors, or
//     its fp16 variant (diffusion_pytorch_model.fp16.safetensors ...);
//   - shards named by an index, <name>.safetensors.index.json (or
//     .index.fp16.json): {"weight_map": {tensor: shard file}}; each shard a
//     plain file name in the folder, every one present, every tensor in the
//     shard the index names and in no other;
//   - shards without an index (name-00001-of-00003.safetensors): all N of one
//     name, each tensor in one of them;
//   - else the folder's only *.safetensors.
// Pickles (.bin, .ckpt, .pt: PyTorch's zip format or a bare pickle, told by
// their first bytes) are not read, as loading one can run code: the message
// says how to convert them.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "io/json.h"
#include "io/safetensors.h"

#define DC_SD_MAX_FILES 16

// Whether path can be reached: 0, or -1 with a message naming it and why (no
// such file, a loop of symbolic links, no permission). want_dir: it must be a
// folder (1), a file (0), or either (-1). *is_dir (may be NULL) says which.
int dc_sd_path_check(const char *path, int want_dir, bool *is_dir);
// Whether path exists, a loop of symbolic links counting as an error (-1 with
// its message): 1 yes, 0 no.
int dc_sd_path_exists(const char *path);

// -1 with a message when the file at path is a PyTorch pickle (zip or bare),
// saying how to convert it; 0 otherwise (whatever else it is).
int dc_sd_refuse_pickle(const char *path);

// The weight files of component folder dir: names[*count] (file names in
// dir). When they come from an index, *index holds it (root NULL otherwise;
// dc_json_free it) for dc_sd_check_shards.
int dc_sd_pick_weights(const char *dir, char names[][256], int *count, dc_json_doc *index, char *index_name,
                       size_t cap);
// Each tensor of files[n] is in one file only; with an index (weight_map
// not NULL, read from index_path), in the file it names, and every tensor it
// names is there.
int dc_sd_check_shards(const dc_st_file *files, int n, const dc_json *weight_map, const char *index_path);
