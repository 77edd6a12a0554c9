// libFuzzer harness for the MDS reader (io/mds.h): the input is a data set
// folder in one piece,
//   u16 index length L (little-endian) | index.json (L bytes) | shard bytes
// with the shard bytes written under the names of the first shards, plain and
// zstd. Every sample of an accepted data set is read and every column
// decoded: a decoded value must lie inside its sample, and converting it to
// float lets ASan catch a read past it.
#include <stdint.h>
#include <stdlib.h>

#include "fuzz/fuzz_util.h"
#include "io/mds.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static const char *const g_shards[] = {"shard.00000.mds", "shard.00000.mds.zstd", "shard.00001.mds",
                                       "shard.00001.mds.zstd"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t len = (size_t)(data[0] | data[1] << 8);
    if (len > size - 2) len = size - 2;
    fuzz_write(fuzz_path("index.json"), data + 2, len, 0);
    for (int i = 0; i < 4; i++) fuzz_write(fuzz_path(g_shards[i]), data + 2 + len, size - 2 - len, 0);
    dc_mds_reader *r;
    if (dc_mds_open(&r, g_fuzz_dir) != 0) return 0;
    dc_mds_sample s = {0};
    float *f = malloc(sizeof(float) << 16);
    if (!f) abort();
    for (int64_t i = 0; i < dc_mds_samples(r) && i < 4096; i++) {
        if (dc_mds_read(r, i, &s) != 0) continue;
        for (int c = 0; c < dc_mds_columns(r); c++) {
            dc_mds_array a;
            if (dc_mds_decode(dc_mds_column_at(r, c), s.data[c], s.len[c], &a) != 0) continue;
            const uint8_t *v = a.values;
            size_t bytes = (size_t)a.count * dc_mds_dtype_size(a.dtype);
            if (a.count < 0 || v < s.data[c] || v + bytes > s.data[c] + s.len[c]) abort();
            if (a.count <= (1 << 16)) dc_mds_to_f32(&a, f);
        }
    }
    free(f);
    dc_mds_sample_free(&s);
    dc_mds_close(r);
    return 0;
}
