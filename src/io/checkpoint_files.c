#include "io/checkpoint_files.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/log.h"

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void dc_checkpoint_path(const char *dir, int64_t step, char *out, int n) {
    snprintf(out, n, "%s/step_%07lld.safetensors", dir, (long long)step);
}

// The step of a checkpoint's file name, or -1. Only the exact name the
// trainer writes counts, so that the name rebuilt from the step is the file.
static int64_t checkpoint_step(const char *name) {
    long long s;
    int used = 0;
    if (strncmp(name, "step_", 5) != 0 || name[5] < '0' || name[5] > '9') return -1;
    if (sscanf(name, "step_%lld.safetensors%n", &s, &used) != 1 || name[used] != 0) return -1;
    char canon[64];
    snprintf(canon, sizeof canon, "step_%07lld.safetensors", s);
    return strcmp(canon, name) == 0 ? s : -1;
}

int dc_checkpoint_list(const char *dir, int64_t **steps_out) {
    if (steps_out) *steps_out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    int64_t *steps = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = checkpoint_step(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            int64_t *p = realloc(steps, (cap = cap ? 2 * cap : 64) * sizeof *p);
            if (!p) break;
            steps = p;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n > 1) qsort(steps, n, sizeof *steps, cmp_i64);
    if (steps_out) *steps_out = steps;
    else free(steps);
    return n;
}

int dc_checkpoint_open(const char *path, unsigned flags, dc_st_file *f) {
    struct stat st;
    if (stat(path, &st) != 0) return dc_fail("%s: no such file or folder", path);
    if (!S_ISDIR(st.st_mode)) return dc_st_open_opts(f, path, flags);
    int64_t *steps;
    int k = dc_checkpoint_list(path, &steps);
    if (k == 0) return dc_fail("%s: folder holds no step_*.safetensors checkpoint", path);
    char newest_err[1024] = "";
    for (int i = k - 1; i >= 0; i--) {
        char file[4096];
        dc_checkpoint_path(path, steps[i], file, sizeof file);
        if (dc_st_open_opts(f, file, flags) == 0) {
            if (i < k - 1) dc_warn("using %s, the newest readable checkpoint in %s", file, path);
            free(steps);
            return 0;
        }
        if (!newest_err[0]) snprintf(newest_err, sizeof newest_err, "%s", dc_error());
        if (i > 0) dc_warn("skipping an unreadable checkpoint: %s", dc_error());
    }
    free(steps);
    if (k == 1) return dc_fail("%s", newest_err);
    return dc_fail("%s (no older checkpoint in %s can be read either)", newest_err, path);
}
