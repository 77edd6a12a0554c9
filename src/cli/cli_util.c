#include "cli/cli_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cblas.h>
#include <omp.h>

#include "cli/run_folder.h"
#include "core/error.h"
#include "models/model_io.h"
#include "pipelines/sd_export.h"

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

// A DC_OFFLOAD_* variable: NULL when unset or empty (the default holds).
static const char *offload_env(const char *name) {
    const char *e = getenv(name);
    return e && *e ? e : NULL;
}

static int offload_switch(const char *name, bool *on) {
    const char *e = offload_env(name);
    if (!e) return 0;
    if (strcmp(e, "0") && strcmp(e, "1")) return dc_fail("%s=%s: 0 (off) or 1 (on)", name, e);
    *on = e[0] == '1';
    return 0;
}

int cli_offload_settings(dc_offload_settings *s) {
    *s = dc_offload_settings_default();
    DC_TRY(offload_switch("DC_OFFLOAD_DEFER", &s->defer));
    DC_TRY(offload_switch("DC_OFFLOAD_PACE", &s->pace));
    const char *hold = offload_env("DC_OFFLOAD_HOLD"), *share = offload_env("DC_OFFLOAD_DEVICE_SHARE");
    char *end;
    if (hold) {
        long k = strtol(hold, &end, 10);
        if (*end || k < 0 || k > 1000000) return dc_fail("DC_OFFLOAD_HOLD=%s: a count of units, 0 or more", hold);
        s->hold = (int)k;
    }
    if (share) {
        s->device_share = strtod(share, &end);
        if (*end || !(s->device_share >= 0 && s->device_share <= 1))
            return dc_fail("DC_OFFLOAD_DEVICE_SHARE=%s: a share of the parameters, 0 to 1", share);
    }
    return 0;
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

static int inputs_push(cli_inputs *in, const struct stat *st, const char *flag, const char *path) {
    if (in->n == in->cap) {
        int cap = in->cap ? 2 * in->cap : 16;
        struct cli_input *v = realloc(in->v, sizeof *v * (size_t)cap);
        if (!v) return dc_fail("out of memory");
        in->v = v, in->cap = cap;
    }
    char *p = strdup(path);
    if (!p) return dc_fail("out of memory");
    in->v[in->n++] = (struct cli_input){st->st_dev, st->st_ino, flag, p};
    return 0;
}

// Every regular file under dir whose name starts with prefix, depth levels
// down (symbolic links followed: the depth ends any loop of them).
static int inputs_walk(cli_inputs *in, const char *flag, const char *dir, int depth, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;  // unreadable: the command's own read reports it
    struct dirent *e;
    int rc = 0;
    while (!rc && in->n < CLI_INPUT_FILES && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4200];
        struct stat st;
        const char *sep = dir[strlen(dir) - 1] == '/' ? "" : "/";
        if (snprintf(path, sizeof path, "%s%s%s", dir, sep, e->d_name) >= (int)sizeof path || stat(path, &st) != 0)
            continue;
        if (S_ISREG(st.st_mode) && !strncmp(e->d_name, prefix, strlen(prefix))) rc = inputs_push(in, &st, flag, path);
        else if (S_ISDIR(st.st_mode) && depth > 1) rc = inputs_walk(in, flag, path, depth - 1, prefix);
    }
    closedir(d);
    return rc;
}

int cli_inputs_add(cli_inputs *in, const char *flag, const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode)) return inputs_walk(in, flag, path, CLI_INPUT_DEPTH, "");
    return inputs_push(in, &st, flag, path);
}

int cli_inputs_add_checkpoint(cli_inputs *in, const char *flag, const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode)) return inputs_walk(in, flag, path, 1, "step_");
    return inputs_push(in, &st, flag, path);
}

void cli_inputs_free(cli_inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->v[i].path);
    free(in->v);
    memset(in, 0, sizeof *in);
}

static const struct cli_input *input_of(const cli_inputs *in, const struct stat *st) {
    for (int i = 0; in && i < in->n; i++)
        if (in->v[i].dev == (unsigned long long)st->st_dev && in->v[i].ino == (unsigned long long)st->st_ino)
            return &in->v[i];
    return NULL;
}

int cli_check_not_input(const cli_inputs *in, const char *path) {
    struct stat st;
    const struct cli_input *hit = stat(path, &st) == 0 ? input_of(in, &st) : NULL;
    if (!hit) return 0;
    if (!strcmp(hit->path, path))
        return dc_fail("%s is read by this command (%s); writing it would destroy it: choose another output", path,
                       hit->flag);
    return dc_fail("%s is %s (the same file), which this command reads (%s); writing it would destroy it: choose "
                   "another output", path, hit->path, hit->flag);
}

int cli_check_stdio(const cli_inputs *in) {
    static const char *names[] = {"standard output", "standard error"};
    for (int fd = 1; fd <= 2; fd++) {
        struct stat st;
        const struct cli_input *hit = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? input_of(in, &st) : NULL;
        if (hit)
            return dc_fail("%s is %s, which this command reads (%s); send it elsewhere", names[fd - 1], hit->path,
                           hit->flag);
    }
    return 0;
}

int cli_check_folder_outputs(const cli_inputs *in, const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;  // a folder yet to be made holds nothing
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        char path[4200];
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) rc = cli_check_not_input(in, path);
    }
    closedir(d);
    return rc;
}

int cli_check_output(const char *path, const cli_inputs *in) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return dc_fail("%s is %s, not a file this command may replace; choose a file name", path,
                       file_kind(st.st_mode));
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (strncmp(base, "step_", 5) == 0 && stat(path, &st) == 0)
        return dc_fail("refusing to overwrite the training checkpoint %s", path);
    DC_TRY(cli_check_not_input(in, path));
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

int cli_find_vocab(const char **path) {
    const char *env = getenv("DIFFUSION_VOCAB");
    if (env && *env) return *path = env, 0;
    // Beside the running binary: data/ of a checkout (./diffusion at its
    // root), ../share/diffusion/ of an installation (PREFIX/bin/diffusion).
    static char places[5][4200];
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        *strrchr(exe, '/') = 0;  // the kernel's path is absolute: it has a '/'
    } else {
        snprintf(exe, sizeof exe, "(the binary's folder)");
    }
    snprintf(places[0], sizeof places[0], "%s", CLI_VOCAB_NAME);
    snprintf(places[1], sizeof places[1], "%s/data/%s", exe, CLI_VOCAB_NAME);
    snprintf(places[2], sizeof places[2], "%s/../share/diffusion/%s", exe, CLI_VOCAB_NAME);
    snprintf(places[3], sizeof places[3], "/usr/local/share/diffusion/%s", CLI_VOCAB_NAME);
    snprintf(places[4], sizeof places[4], "/usr/share/diffusion/%s", CLI_VOCAB_NAME);
    for (int i = 0; i < 5; i++)
        if (access(places[i], F_OK) == 0) return *path = places[i], 0;
    return dc_fail("no CLIP vocabulary found: give --vocab FILE|FOLDER or set DIFFUSION_VOCAB (looked for ./%s, %s, "
                   "%s, %s and %s)", places[0], places[1], places[2], places[3], places[4]);
}

void cli_handle_signals(void (*handler)(int), const int *sigs, int n) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < n; i++) sigaction(sigs[i], &sa, NULL);
}

// --lora FILE[:WEIGHT]: the file and its weight (1 unless a number follows the last ':').
int cli_lora_arg(const char *arg, char *path, size_t cap, float *weight) {
    const char *colon = strrchr(arg, ':');
    char *end = NULL;
    *weight = 1.0f;
    if (colon && colon[1]) {
        const float w = strtof(colon + 1, &end);
        if (!*end) {
            if (!(w >= -10 && w <= 10)) return dc_fail("--lora %s: the weight %g is outside -10..10", arg, w);
            *weight = w;
        } else {
            colon = NULL;  // a ':' of the path itself
        }
    } else if (colon) {
        return dc_fail("--lora %s: a weight after ':' expected", arg);
    }
    const size_t n = colon ? (size_t)(colon - arg) : strlen(arg);
    if (n == 0 || n >= cap) return dc_fail("--lora %s: FILE[:WEIGHT] expected", arg);
    memcpy(path, arg, n);
    path[n] = 0;
    return 0;
}

int cli_check_model_output(const cli_inputs *in, const char *out) {
    DC_TRY(cli_check_stdio(in));
    struct stat st;
    if (dc_sd_export_is_file(out)) return cli_check_output(out, in);
    if (lstat(out, &st) == 0)
        return dc_fail("%s already exists: remove it or choose another name (a folder is not replaced)", out);
    return cli_check_not_input(in, out) || cli_probe_write(out) ? -1 : 0;
}
