// Tar archives (POSIX ustar, with pax and GNU long names), listed without
// being unpacked: what a webdataset shard is (img2dataset writes its
// pictures and captions as `key.jpg`, `key.txt`, `key.json` members of
// Python's tarfile). Only regular files are listed; directories, links and
// devices are passed over. Every header's checksum and every member's size
// are checked against the file, so a damaged archive is refused with the
// byte offset of the header at fault rather than read past its end.
#pragma once
#include <stdint.h>

typedef struct {
    char *name;      // the member's path: pax "path", a GNU long name, or ustar's prefix/name
    int64_t offset;  // where its bytes start in the archive
    int64_t size;    // bytes
} dc_tar_member;

typedef struct {
    dc_tar_member *m;  // in the archive's order
    int64_t n;
} dc_tar_index;

// Lists the regular files of the archive at `path`.
int dc_tar_list(const char *path, dc_tar_index *out);
// The same on an open file of `size` bytes (read with pread); `path` names it in messages.
int dc_tar_list_fd(int fd, int64_t size, const char *path, dc_tar_index *out);
void dc_tar_index_free(dc_tar_index *t);
