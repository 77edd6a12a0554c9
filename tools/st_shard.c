// Splits a safetensors file into N shards with the index that diffusers and
// transformers write beside sharded weights, so the tests can check the
// engine's reading of sharded models without Python:
//
//   st_shard IN.safetensors N OUT_DIR BASE
//
// writes OUT_DIR/BASE-0000i-of-0000N.safetensors (the tensors in name order,
// cut into N runs of about the same count) and OUT_DIR/BASE.safetensors.index.json
// ({"metadata": {}, "weight_map": {tensor: shard file}}). Exit status 0, or 1
// with a message.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors.h"

static int by_name(const void *a, const void *b) {
    return strcmp((*(const dc_st_tensor *const *)a)->name, (*(const dc_st_tensor *const *)b)->name);
}

static int write_shards(const dc_st_file *f, int n, const char *dir, const char *base) {
    const dc_st_tensor **order = malloc(sizeof *order * (size_t)f->count);
    dc_st_entry *e = malloc(sizeof *e * (size_t)f->count);
    void **data = calloc((size_t)f->count, sizeof *data);
    char path[4096], index[4096];
    snprintf(index, sizeof index, "%s/%s.safetensors.index.json", dir, base);
    FILE *ix = fopen(index, "w");
    int rc = !order || !e || !data ? dc_fail("out of memory") : !ix ? dc_fail("cannot write %s", index) : 0;
    for (int i = 0; !rc && i < f->count; i++) order[i] = &f->tensors[i];
    if (!rc) qsort(order, (size_t)f->count, sizeof *order, by_name), fprintf(ix, "{\"metadata\": {}, \"weight_map\": {");
    for (int s = 0, first = 0; !rc && s < n; s++) {
        const int lo = (int)((long long)f->count * s / n), hi = (int)((long long)f->count * (s + 1) / n);
        char file[512];
        snprintf(file, sizeof file, "%s-%05d-of-%05d.safetensors", base, s + 1, n);
        for (int i = lo; !rc && i < hi; i++) {
            const dc_st_tensor *t = order[i];
            if (!(data[i] = malloc(t->end - t->begin + 1))) rc = dc_fail("out of memory");
            else rc = dc_st_read_raw(f, t, data[i]);
            e[i - lo] = (dc_st_entry){t->name, t->dtype, t->ndim, {0}, data[i]};
            memcpy(e[i - lo].shape, t->shape, sizeof t->shape);
            fprintf(ix, "%s\"%s\": \"%s\"", first++ ? ", " : "", t->name, file);
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (!rc) rc = dc_st_write(path, e, hi - lo, NULL, NULL, 0);
    }
    if (ix) {
        fprintf(ix, "}}\n");
        if (fclose(ix) != 0 && !rc) rc = dc_fail("cannot write %s", index);
    }
    for (int i = 0; data && i < f->count; i++) free(data[i]);
    free(data), free(e), free(order);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 5 || atoi(argv[2]) < 1) {
        fprintf(stderr, "usage: st_shard IN.safetensors N OUT_DIR BASE\n");
        return 1;
    }
    dc_st_file f;
    int rc = dc_st_open(&f, argv[1]);
    if (!rc) {
        rc = write_shards(&f, atoi(argv[2]), argv[3], argv[4]);
        dc_st_close(&f);
    }
    if (rc) fprintf(stderr, "st_shard: %s\n", dc_error());
    return rc ? 1 : 0;
}
