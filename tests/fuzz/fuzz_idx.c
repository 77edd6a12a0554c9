// libFuzzer harness for the IDX reader behind the Fashion-MNIST loader
// (dc_dataset_load_fmnist), plain and gzipped. The first input byte says
// what the rest is:
//   bit 0  the labels file (else the images file); the other file is made
//          valid, with the count the fuzzed header declares (capped)
//   bit 1  the fuzzed file is gzipped before it is written
//   bit 2  it is written under the .gz name as it is (raw bytes for zlib)
//   bit 3  the other file is gzipped
//   bit 4  pad the images to 32 x 32
// A load that succeeds must give images in [-1, 1] and labels 0..9, every
// one of which is read back.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "train/data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// The count a fuzzed IDX header declares, capped so the partner file stays small.
static uint32_t declared_count(const uint8_t *p, size_t n) {
    if (n < 8) return 1;
    uint32_t c = (uint32_t)p[4] << 24 | (uint32_t)p[5] << 16 | (uint32_t)p[6] << 8 | p[7];
    return c >= 1 && c <= 4096 ? c : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    int fuzz_labels = flags & 1, gz = (flags >> 1) & 1, raw_gz = (flags >> 2) & 1;
    int other_gz = (flags >> 3) & 1, pad = (flags >> 4) & 1 ? 32 : 0;
    const char *names[2][2] = {{"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"},
                               {"train-labels-idx1-ubyte", "train-labels-idx1-ubyte.gz"}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) unlink(fuzz_path(names[i][j]));

    // the fuzzed file
    fuzz_write(fuzz_path(names[fuzz_labels][gz || raw_gz]), body, n, gz && !raw_gz);

    // its valid partner: 2 x 2 images or labels 0..9, as many as declared
    uint32_t count = declared_count(body, n);
    size_t plen = fuzz_labels ? 16 + 4 * (size_t)count : 8 + count;
    uint8_t *p = calloc(plen, 1);
    if (!p) abort();
    if (fuzz_labels) {
        put_be32(p, 0x803), put_be32(p + 4, count), put_be32(p + 8, 2), put_be32(p + 12, 2);
        for (size_t i = 16; i < plen; i++) p[i] = (uint8_t)(i * 37);
    } else {
        put_be32(p, 0x801), put_be32(p + 4, count);
        for (uint32_t i = 0; i < count; i++) p[8 + i] = (uint8_t)(i % 10);
    }
    fuzz_write(fuzz_path(names[!fuzz_labels][other_gz]), p, plen, other_gz);
    free(p);

    dc_dataset ds;
    if (dc_dataset_load_fmnist(&ds, g_fuzz_dir, true, pad) != 0) return 0;
    if (ds.n < 1 || ds.channels != 1 || ds.height < 1 || ds.width < 1 || ds.num_classes != 10 ||
        (pad && (ds.height != pad || ds.width != pad)))
        abort();  // accepted a data set that is not what the files hold
    size_t per = (size_t)ds.height * ds.width;
    float *img = malloc(per * sizeof *img);
    if (!img) abort();
    for (int i = 0; i < ds.n; i++) {
        if (ds.labels[i] < 0 || ds.labels[i] >= 10) abort();
        dc_dataset_get(&ds, i, img, i & 1);
        for (size_t k = 0; k < per; k++)
            if (!(fabsf(img[k]) <= 1.0f)) abort();
    }
    free(img);
    dc_dataset_free(&ds);
    return 0;
}
