// The model hash a picture's parameters carry, as AUTOMATIC1111 writes it
// ("Model hash: 6ce0161689", its CheckpointInfo.shorthash): the first 10 hex
// digits of the SHA-256 of the model's weights, so a picture names the
// weights that drew it. What is hashed:
//   - a single-file checkpoint: the file (the same hash A1111 shows for it,
//     and the first 10 digits of `sha256sum FILE`);
//   - a diffusers folder, or a UNet's folder or file alone: the UNet's
//     weights file, the one that was loaded (unet/diffusion_pytorch_model
//     .safetensors, or its .fp16 variant); sharded weights: their files' bytes
//     one after another in shard order (`cat SHARDS | sha256sum`).
// Hashing gigabytes takes seconds, so the full digest is kept in a cache, as
// A1111 keeps its own, keyed by each file's absolute path, size and
// modification time: $XDG_CACHE_HOME/diffusion/model-hashes, else
// ~/.cache/diffusion/model-hashes. A cache that cannot be read or written
// only costs the hashing again.
#pragma once
#include "models/sd_source.h"

// The 10 hex digits (and a NUL) for the model m holds open; -1 with a message
// when a weights file cannot be read.
int cli_model_hash(dc_sd_model *m, char hash[11]);
// The same for the files paths[n] hashed one after another (the rule above).
int cli_files_hash(const char *const *paths, int n, char hash[11]);
// A LoRA's hash as AUTOMATIC1111's pictures carry it ("Lora hashes: "name:
// 0123456789ab""): the first 12 hex digits of the SHA-256 of a safetensors
// file's tensor data, the bytes after its header (kohya's "addnet" hash, so
// editing the metadata keeps it).
int cli_lora_hash(const char *path, char hash[13]);
