// Shared by the fuzz harnesses: a private scratch folder for loaders that
// take a path, one thread (sanitizer reports stay readable and runs
// repeatable), and bounds on what a harness goes on to build from an input
// the reader accepted, so that time goes into the readers rather than into
// allocating a model the file declares.
#pragma once
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "models/dit.h"

static char g_fuzz_dir[256];

static inline void fuzz_cleanup(void) {
    if (!g_fuzz_dir[0]) return;
    static const char *const names[] = {
        "train-images-idx3-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte",
        "train-labels-idx1-ubyte.gz", "data.safetensors", "ckpt.safetensors", "in.png", "out.png",
        "index.json", "shard.00000.mds", "shard.00000.mds.zstd", "shard.00001.mds", "shard.00001.mds.zstd",
        "in.tar"};
    char p[320];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_fuzz_dir, names[i]);
        unlink(p);
    }
    rmdir(g_fuzz_dir);
}

// Call from LLVMFuzzerInitialize.
static inline void fuzz_init(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_fuzz_dir, sizeof g_fuzz_dir, "%s/dc_fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_fuzz_dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(fuzz_cleanup);
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
}

// "<scratch folder>/<name>" (one static buffer per call site's use: copy it to keep it).
static inline const char *fuzz_path(const char *name) {
    static char p[4][320];
    static int k;
    char *s = p[k++ & 3];
    snprintf(s, 320, "%s/%s", g_fuzz_dir, name);
    return s;
}

// Writes bytes to path, through gzip when gz; aborts if it cannot (the harness is broken).
static inline void fuzz_write(const char *path, const void *data, size_t n, int gz) {
    unlink(path);
    if (gz) {
        gzFile g = gzopen(path, "wb1");
        if (!g || (n && gzwrite(g, data, (unsigned)n) != (int)n) || gzclose(g) != Z_OK) abort();
        return;
    }
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) abort();
}

// A model small enough to build for every input that declares it (the
// readers themselves are fuzzed on any size: these bounds only keep each run
// short).
static inline int fuzz_model_small(const dc_dit_config *c) {
    return c->hidden <= 64 && c->depth <= 4 && c->mlp_hidden <= 256 && c->num_classes <= 100 &&
           c->in_channels <= 8 && c->patch <= 8 && dc_dit_tokens(c) <= 64;
}
