#include "cli/cli_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cblas.h>
#include <omp.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "models/dit_io.h"

dc_dit_config cli_demo_model(void) {
    return (dc_dit_config){.input_size = 28, .patch = 4, .in_channels = 1, .hidden = 64,
                           .depth = 6, .heads = 4, .mlp_hidden = 256, .num_classes = 10,
                           .learn_sigma = true};
}

dc_train_config cli_demo_train(void) {
    dc_train_config c = dc_train_config_default();
    c.steps = 7000, c.batch = 64, c.micro_batch = 64, c.lr = 2e-3f, c.warmup = 100;
    c.grad_clip = 1.0f, c.ema_decay = 0.998f;
    return c;
}

int cli_set_threads(int threads) {
    if (threads < 0 || threads > 1024) return dc_fail("--threads must be in 0..1024 (0: all cores)");
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    return 0;
}

int cli_backend(const char *device, const char *precision, dc_backend **be) {
    *be = NULL;
    bool p_auto = strcmp(precision, "auto") == 0, p32 = strcmp(precision, "fp32") == 0;
    if (!p_auto && !p32 && strcmp(precision, "bf16") != 0)
        return dc_fail("--precision must be auto, bf16 or fp32 (got '%s')", precision);
    if (strcmp(device, "cpu") == 0) {
        if (!p_auto && !p32) return dc_fail("--precision bf16 needs a GPU: the CPU computes in fp32");
        return dc_backend_create("cpu", be);
    }
    if (strcmp(device, "cuda") == 0) return dc_backend_create(p32 ? "cuda-fp32" : "cuda", be);
    if (strcmp(device, "auto") != 0) return dc_fail("--device must be auto, cuda or cpu (got '%s')", device);
    dc_backend *gpu = dc_backend_cuda_create(p32);
    if (gpu) {
        *be = gpu;
        return 0;
    }
    if (!p_auto && !p32) return dc_fail_ctx("--precision bf16");
    dc_error_clear();
    return dc_backend_create("cpu", be);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int cli_list_checkpoints(const char *dir, int64_t **steps_out) {
    if (steps_out) *steps_out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    int64_t *steps = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        int used = 0;
        if (sscanf(e->d_name, "step_%lld.safetensors%n", &s, &used) != 1 || e->d_name[used] != 0)
            continue;
        if (n == cap) {
            int64_t *p = realloc(steps, (cap = cap ? 2 * cap : 64) * sizeof *p);
            if (!p) break;
            steps = p;
        }
        steps[n++] = s;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, cmp_i64);
    if (steps_out) *steps_out = steps;
    else free(steps);
    return n;
}

int cli_resolve_checkpoint(const char *path, char *out, int n) {
    struct stat st;
    if (stat(path, &st) != 0) return dc_fail("%s: no such file or folder", path);
    if (!S_ISDIR(st.st_mode)) return snprintf(out, n, "%s", path), 0;
    int64_t *steps;
    int k = cli_list_checkpoints(path, &steps);
    if (k == 0) return dc_fail("%s: folder holds no step_*.safetensors checkpoint", path);
    snprintf(out, n, "%s/step_%07lld.safetensors", path, (long long)steps[k - 1]);
    free(steps);
    return 0;
}

bool cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int cli_check_output(const char *path, const char *input) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    if (access(dir, W_OK) != 0) return dc_fail("cannot write %s: folder %s is missing or read-only", path, dir);
    if (input && cli_same_file(path, input)) return dc_fail("%s is the input file; choose another output", path);
    const char *base = slash ? strrchr(path, '/') + 1 : path;
    if (strncmp(base, "step_", 5) == 0 && dc_file_exists(path))
        return dc_fail("refusing to overwrite the training checkpoint %s", path);
    return 0;
}

int cli_load_model(const char *path, bool raw, int heads, dc_backend *be, dc_dit *m,
                   const char **which) {
    char file[4096];
    dc_st_file f;
    dc_dit_config c;
    DC_TRY(cli_resolve_checkpoint(path, file, sizeof file));
    DC_TRY(dc_st_open(&f, file));
    bool has_ema = dc_st_find(&f, "ema.x_embedder.proj.weight") != NULL;
    const char *prefix = has_ema && !raw ? "ema." : "";
    if (dc_dit_config_from_file(&f, "", heads, &c) || dc_dit_create(m, &c, be, false)) {
        dc_st_close(&f);
        return -1;
    }
    int rc = dc_dit_load_weights(m, &f, prefix);
    dc_st_close(&f);
    if (rc) return dc_dit_free(m), -1;
    if (which) *which = *prefix ? "EMA" : "raw";
    return 0;
}
