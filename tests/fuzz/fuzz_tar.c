// libFuzzer harness for the tar lister (io/tar.h) and the webdataset reading
// above it (io/picture_set.h): the input is a .tar file. Every member listed
// must lie inside the file, after a header; then the archive is read as a
// webdataset shard (members grouped by key, captions from key.txt and
// key.json) and each picture's header read from its in-memory copy.
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "fuzz/fuzz_util.h"
#include "io/picture_set.h"
#include "io/tar.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("in.tar");
    fuzz_write(path, data, size, 0);
    dc_tar_index t;
    if (dc_tar_list(path, &t) == 0) {
        for (int64_t i = 0; i < t.n; i++)
            if (t.m[i].offset < 512 || t.m[i].size < 0 || t.m[i].offset + t.m[i].size > (int64_t)size || !t.m[i].name)
                abort();  // a member outside the file
        dc_tar_index_free(&t);
    }
    dc_error_clear();
    dc_picture_set s;
    if (dc_picture_set_scan(&s, path, NULL) == 0) {
        for (int64_t i = 0; i < s.n && i < 64; i++) {
            dc_image img;
            if (dc_picture_set_read(&s, i, &img, 1 << 16, true) == 0) dc_image_free(&img);
            dc_error_clear();
        }
        dc_picture_set_free(&s);
    }
    dc_error_clear();
    return 0;
}
