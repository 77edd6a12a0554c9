// Files written so that a crash never leaves a half-written result.
#pragma once
#include <stddef.h>
#include <stdio.h>

// Opens "<path>.tmp.<pid>" for writing; finish with dc_atomic_end.
typedef struct dc_atomic_file dc_atomic_file;
dc_atomic_file *dc_atomic_begin(const char *path);
// Flushes, fsyncs, renames over `path` and fsyncs the directory; on any
// failure (or ok == 0) removes the temporary file and leaves `path` as it was.
int dc_atomic_end(dc_atomic_file *af, int ok);
FILE *dc_atomic_stream(dc_atomic_file *af);
int dc_file_exists(const char *path);
int dc_mkdir_p(const char *path);  // like mkdir -p; 0 or -1 (message set)
