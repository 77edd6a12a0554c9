// Files written so that a crash never leaves a half-written result, and files
// opened for reading without blocking on, or trusting, what is not a file.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Opens "<path>.tmp.<pid>" for writing; finish with dc_atomic_end. Refuses a
// `path` that exists and is not a regular file (after following symbolic
// links): renaming over /dev/null, a FIFO or a directory would replace it.
typedef struct dc_atomic_file dc_atomic_file;
dc_atomic_file *dc_atomic_begin(const char *path);
// Flushes, fsyncs, renames over `path` and fsyncs the directory; on any
// failure (or ok == 0) removes the temporary file and leaves `path` as it was.
int dc_atomic_end(dc_atomic_file *af, int ok);
FILE *dc_atomic_stream(dc_atomic_file *af);
int dc_file_exists(const char *path);
// Opens a file for reading and returns its descriptor (blocking reads), or -1
// with a message. Refuses anything but a regular file (a FIFO, a device, a
// directory) without waiting: the open is non-blocking, so a FIFO with no
// writer cannot hang it. *size (may be NULL) receives the file's size.
int dc_open_regular(const char *path, int64_t *size);
// "a FIFO", "a directory", "a character device", ... for messages.
const char *dc_file_kind(unsigned mode);
// Reads exactly n bytes from fd into dst; a short read (the file shrank) or an
// I/O error fails with a message naming path.
int dc_read_exact(int fd, void *dst, size_t n, const char *path);
// Reads exactly n bytes at offset `at` of fd into dst without moving the
// file's position, so threads may read one descriptor at once. A file that
// has shrunk below at + n since it was opened (truncated by another process
// while a model loads) fails with a message naming path, as a read error does:
// reading this way, unlike through a mapping, never raises SIGBUS.
int dc_pread_exact(int fd, void *dst, size_t n, uint64_t at, const char *path);
int dc_mkdir_p(const char *path);  // like mkdir -p; 0 or -1 (message set)
// Writes text as the whole of the file at path, atomically (dc_atomic_begin).
int dc_write_text_file(const char *path, const char *text);
