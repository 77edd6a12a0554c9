// Whole files as bytes, for the tests that make and damage files.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The file's bytes (malloc'd, one spare byte; *n their count), or NULL.
static inline uint8_t *slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    uint8_t *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) free(b), b = NULL;
    fclose(f);
    *n = (size_t)len;
    return b;
}

// Writes n bytes to path; a test that cannot write its own file stops.
static inline void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f)) {
        printf("cannot write %s\n", path);
        exit(1);
    }
}

// Whether two files hold the same bytes (false where either cannot be read).
static inline bool same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    free(x), free(y);
    return same;
}
