// Training run folders: checkpoints named step_NNNNNNN.safetensors, the lock
// that one training process holds while it writes into a folder, and the
// temporary files of checkpoint writes that a killed process never finished.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "io/checkpoint_files.h"
#include "io/safetensors.h"

// The listing and opening of checkpoints are the library's (io/checkpoint_files.h).
static inline int cli_list_checkpoints(const char *dir, int64_t **steps) { return dc_checkpoint_list(dir, steps); }
static inline void cli_checkpoint_path(const char *dir, int64_t step, char *out, int n) {
    dc_checkpoint_path(dir, step, out, n);
}

// Takes the run folder's lock: DIR/.lock, locked with flock and holding the
// owner's PID, so that a second training process writing into DIR fails with
// a message naming the first. The kernel drops the lock when the process ends,
// however it ends (kill -9 included); *fd is the open lock file.
int cli_lock_run(const char *dir, int *fd);
// Drops the lock; remove_dir also removes the lock file and the folder, for a
// run that created the folder and failed before writing anything into it.
void cli_unlock_run(const char *dir, int fd, bool remove_dir);
// Removes step_*.safetensors.tmp.PID files, with a warning for each. Only
// call it with the lock held: then no write is in progress, and any such file
// was left by a process killed while it wrote a checkpoint.
void cli_remove_stale_temps(const char *dir);

static inline int cli_open_checkpoint(const char *path, unsigned flags, dc_st_file *f) {
    return dc_checkpoint_open(path, flags, f);
}

// Removes all but the newest `keep` checkpoints at or below `step`; newer
// ones are left alone (unreadable files a resumed run replaces at their step).
void cli_prune_checkpoints(const char *dir, int keep, int64_t step);
// How many checkpoints of dir are newer than `step`, named in list[n] (at most 8, then "...").
int cli_newer_checkpoints(const char *dir, int64_t step, char *list, size_t n);
// Removes the checkpoints newer than `step` (resume --force), warning for each.
void cli_remove_newer_checkpoints(const char *dir, int64_t step);
// The folder a checkpoint file lies in, into out[n].
void cli_parent_dir(const char *file, char *out, size_t n);
// Creates the run folder if needed (*created) and takes its lock; then any
// checkpoint temporary in it is a leftover, and a checkpoint can be written there.
int cli_open_run_folder(const char *out, int *lock_fd, bool *created);
