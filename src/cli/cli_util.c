#include "cli/cli_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cblas.h>
#include <omp.h>

#include "cli/run_folder.h"
#include "core/error.h"
#include "models/dit_io.h"
#include "models/model_io.h"

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

int cli_check_device_flags(int threads, const char *device, const char *precision) {
    if (threads < 0 || threads > 1024) return dc_fail("--threads must be in 0..1024 (0: all cores)");
    if (strcmp(device, "auto") && strcmp(device, "cuda") && strcmp(device, "cpu"))
        return dc_fail("--device must be auto, cuda or cpu (got '%s')", device);
    if (strcmp(precision, "auto") && strcmp(precision, "bf16") && strcmp(precision, "fp32"))
        return dc_fail("--precision must be auto, bf16 or fp32 (got '%s')", precision);
    if (!strcmp(device, "cpu") && !strcmp(precision, "bf16"))
        return dc_fail("--precision bf16 needs a GPU: the CPU computes in fp32");
    return 0;
}

int cli_check_heads(int heads) {
    if (heads < 0) return dc_fail("--heads must be positive (or 0: from the official table), not %d", heads);
    return 0;
}

// The backend's options from the environment, for measuring: DC_CUDA_PROFILE=1
// profiles every op, DC_KERNELS_OFF=a,b turns those kernel paths off.
static int env_backend_opts(dc_backend_opts *o) {
    *o = dc_backend_opts_default();
    const char *prof = getenv("DC_CUDA_PROFILE"), *off = getenv("DC_KERNELS_OFF");
    o->profile = prof && *prof && strcmp(prof, "0") != 0;
    return off && dc_backend_opts_disable(o, off) ? dc_fail_ctx("DC_KERNELS_OFF") : 0;
}

int cli_backend(const char *device, const char *precision, dc_backend **be) {
    *be = NULL;
    dc_backend_opts o;
    DC_TRY(cli_check_device_flags(0, device, precision));
    DC_TRY(env_backend_opts(&o));
    bool p_auto = strcmp(precision, "auto") == 0, p32 = strcmp(precision, "fp32") == 0;
    if (strcmp(device, "cpu") == 0) return dc_backend_create_opts("cpu", &o, be);
    if (strcmp(device, "cuda") == 0) {
        // Straight to the CUDA backend: its message says whether this build has
        // none or the machine has no usable GPU.
        *be = dc_backend_cuda_create_opts(p32, &o);
        return *be ? 0 : dc_fail_ctx("--device cuda");
    }
    dc_backend *gpu = dc_backend_cuda_create_opts(p32, &o);
    if (gpu) {
        *be = gpu;
        return 0;
    }
    if (!p_auto && !p32) return dc_fail_ctx("--precision bf16");
    dc_error_clear();
    return dc_backend_create_opts("cpu", &o, be);
}

bool cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : S_ISFIFO(m) ? "a pipe"
           : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int cli_probe_write(const char *path) {
    char tmp[4096], dir[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return dc_fail("cannot write %s: the path is too long", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;  // a file in /
    else *slash = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) return 0;  // a leftover of this pid: the folder takes files
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) return dc_fail("cannot write %s: folder %s does not exist", path, dir);
        if (e == ENAMETOOLONG) return dc_fail("cannot write %s: the name is too long for the file system", path);
        return dc_fail("cannot write %s: folder %s: %s", path, dir, strerror(e));
    }
    close(fd);
    unlink(tmp);
    return 0;
}

int cli_check_output(const char *path, const char *input) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return dc_fail("%s is %s, not a file this command may replace; choose a file name", path,
                       file_kind(st.st_mode));
    if (input && cli_same_file(path, input)) return dc_fail("%s is the input file; choose another output", path);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (strncmp(base, "step_", 5) == 0 && stat(path, &st) == 0)
        return dc_fail("refusing to overwrite the training checkpoint %s", path);
    return cli_probe_write(path);
}

// Does the file hold EMA weights? Training checkpoints store every tensor a
// second time under "ema."; any such tensor tells.
static bool has_ema(const dc_st_file *f) {
    for (int i = 0; i < f->count; i++)
        if (strncmp(f->tensors[i].name, "ema.", 4) == 0) return true;
    return false;
}

int cli_load_model(const char *path, bool raw, int heads, unsigned st_flags, dc_backend *be,
                   dc_model **m, const char **which) {
    dc_st_file f;
    DC_TRY(cli_open_checkpoint(path, st_flags, &f));
    const char *prefix = has_ema(&f) && !raw ? "ema." : "";
    int rc = dc_model_load(&f, prefix, heads, be, false, m);
    dc_st_close(&f);
    if (rc) return -1;
    if (which) *which = *prefix ? "EMA" : "raw";
    return 0;
}

// Where the vocabulary is looked for without --vocab, after $DIFFUSION_VOCAB.
static const char *k_vocab_places[] = {CLI_VOCAB_NAME, "/usr/local/share/diffusion/" CLI_VOCAB_NAME,
                                       "/usr/share/diffusion/" CLI_VOCAB_NAME};

int cli_find_vocab(const char **path) {
    const char *env = getenv("DIFFUSION_VOCAB");
    if (env && *env) return *path = env, 0;
    for (size_t i = 0; i < sizeof k_vocab_places / sizeof *k_vocab_places; i++)
        if (access(k_vocab_places[i], F_OK) == 0) return *path = k_vocab_places[i], 0;
    return dc_fail("no CLIP vocabulary found: give --vocab FILE|FOLDER or set DIFFUSION_VOCAB (looked for ./%s, %s, "
                   "%s)", k_vocab_places[0], k_vocab_places[1], k_vocab_places[2]);
}
