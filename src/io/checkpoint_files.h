// The checkpoints of a training run folder: files named
// step_NNNNNNN.safetensors (the step, at least 7 digits), written by the
// trainer. Listing them and opening the newest that can be read is shared
// by the commands that resume a run and by the loaders that draw with one.
#pragma once
#include <stdint.h>

#include "io/safetensors.h"

// Steps of the folder's step_NNNNNNN.safetensors files, ascending, into a new
// array *steps (free it; pass NULL to only count); returns the count (0 when
// the folder cannot be read).
int dc_checkpoint_list(const char *dir, int64_t **steps);
// "<dir>/step_NNNNNNN.safetensors" into out[n].
void dc_checkpoint_path(const char *dir, int64_t step, char *out, int n);
// Opens a checkpoint file, or the newest readable checkpoint of a run folder:
// when the newest is unreadable (truncated, corrupt), it warns and falls
// back to the next older one. A file named explicitly that is bad is an
// error. flags as for dc_st_open_opts (DC_ST_NO_VERIFY).
int dc_checkpoint_open(const char *path, unsigned flags, dc_st_file *f);
