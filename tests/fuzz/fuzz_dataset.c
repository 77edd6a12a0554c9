// libFuzzer harness for a user's data set: the input is written to a
// .safetensors file and loaded as `diffusion train --data` loads it
// (dc_dataset_load: dc_st_open with checksum verification, then the tensor
// checks), then again padded to 8 pixels more. A load that succeeds must give
// images in [-1, 1] and labels below the class count, every one read back.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fuzz/fuzz_util.h"
#include "train/data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static void check(const dc_dataset *ds) {
    if (ds->n < 1 || ds->channels < 1 || ds->height < 1 || ds->width < 1 || ds->num_classes < 1) abort();
    size_t per = (size_t)ds->channels * ds->height * ds->width;
    float *img = malloc(per * sizeof *img);
    if (!img) abort();
    for (int i = 0; i < ds->n; i++) {
        if (ds->labels[i] < 0 || ds->labels[i] >= ds->num_classes) abort();
        dc_dataset_get(ds, i, img, i & 1);
        for (size_t k = 0; k < per; k++)
            if (!(fabsf(img[k]) <= 1.0f)) abort();  // NaN fails too
    }
    free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("data.safetensors");
    fuzz_write(path, data, size, 0);
    dc_dataset ds;
    if (dc_dataset_load(&ds, path, 0) != 0) return 0;
    check(&ds);
    int side = ds.height > ds.width ? ds.height : ds.width;
    int64_t padded = (int64_t)ds.n * ds.channels * (side + 8) * (side + 8);
    dc_dataset_free(&ds);
    if (padded > (1 << 22)) return 0;  // keep runs short
    if (dc_dataset_load(&ds, path, side + 8) != 0) abort();  // padding a set that loads cannot fail
    if (ds.height != side + 8 || ds.width != side + 8) abort();
    check(&ds);
    dc_dataset_free(&ds);
    return 0;
}
