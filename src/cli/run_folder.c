#include "cli/run_folder.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "core/error.h"
#include "core/fsutil.h"
#include "core/log.h"

#define LOCK_NAME ".lock"

int cli_lock_run(const char *dir, int *fd_out) {
    *fd_out = -1;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/" LOCK_NAME, dir) >= (int)sizeof path)
        return dc_fail("%s: path too long", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return dc_fail("cannot write into the run folder %s: %s", dir, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        close(fd);
        long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
        if (e != EWOULDBLOCK) return dc_fail("cannot lock %s: %s", path, strerror(e));
        if (pid > 0)
            return dc_fail("%s is in use by another training run (PID %ld): wait for it to end, "
                           "or stop it, or choose another --out", dir, pid);
        return dc_fail("%s is in use by another training run: wait for it to end, or choose "
                       "another --out", dir);
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, len, 0) != len) {
        int e = errno;
        close(fd);
        return dc_fail("cannot write into the run folder %s: %s", dir, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

void cli_unlock_run(const char *dir, int fd, bool remove_dir) {
    if (fd < 0) return;
    if (remove_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
        unlink(path);
        rmdir(dir);  // fails, harmlessly, if anything else is in it
    }
    close(fd);
}

// "step_<digits>.safetensors.tmp.<digits>": what dc_atomic_begin names the
// file it writes a checkpoint into before renaming it.
static bool is_checkpoint_temp(const char *name) {
    const char *tmp = strstr(name, ".safetensors.tmp.");
    if (strncmp(name, "step_", 5) != 0 || !tmp || tmp == name + 5) return false;
    for (const char *p = name + 5; p < tmp; p++)
        if (*p < '0' || *p > '9') return false;
    const char *pid = tmp + strlen(".safetensors.tmp.");
    if (!*pid) return false;
    for (; *pid; pid++)
        if (*pid < '0' || *pid > '9') return false;
    return true;
}

void cli_remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_checkpoint_temp(e->d_name)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) dc_warn("removed %s, left by a checkpoint write that never finished", path);
        else dc_warn("could not remove %s, left by an unfinished checkpoint write: %s", path, strerror(errno));
    }
    closedir(d);
}

// Removes all but the newest `keep` checkpoints up to `step`. Newer ones are
// left alone: they are unreadable files that a resumed run replaces when it
// reaches their step.
void cli_prune_checkpoints(const char *dir, int keep, int64_t step) {
    int64_t *steps;
    int n = cli_list_checkpoints(dir, &steps);
    while (n > 0 && steps[n - 1] > step) n--;
    for (int i = 0; i + keep < n; i++) {
        char path[4096];
        cli_checkpoint_path(dir, steps[i], path, sizeof path);
        if (remove(path) != 0) dc_warn("could not remove old checkpoint %s", path);
    }
    free(steps);
}

// The run folder's checkpoints newer than `step`, named in a list for a message.
int cli_newer_checkpoints(const char *dir, int64_t step, char *list, size_t n) {
    int64_t *steps;
    int k = cli_list_checkpoints(dir, &steps), count = 0;
    list[0] = 0;
    for (int i = 0; i < k; i++) {
        if (steps[i] <= step) continue;
        size_t len = strlen(list);
        if (count < 8) snprintf(list + len, n - len, "%sstep_%07lld.safetensors", count ? ", " : "", (long long)steps[i]);
        else if (count == 8) snprintf(list + len, n - len, ", ...");
        count++;
    }
    free(steps);
    return count;
}

void cli_remove_newer_checkpoints(const char *dir, int64_t step) {
    int64_t *steps;
    int k = cli_list_checkpoints(dir, &steps);
    for (int i = 0; i < k; i++) {
        if (steps[i] <= step) continue;
        char path[4096];
        cli_checkpoint_path(dir, steps[i], path, sizeof path);
        if (remove(path) == 0) dc_warn("--force: removed %s, newer than the resumed checkpoint", path);
        else dc_warn("--force: could not remove %s: %s", path, strerror(errno));
    }
    free(steps);
}

// The folder a checkpoint file lies in.
void cli_parent_dir(const char *file, char *out, size_t n) {
    snprintf(out, n, "%s", file);
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = 0;
    else *slash = 0;
}

// Creates the run folder if needed and takes its lock; then any checkpoint
// temporary in it is a leftover, and a checkpoint can be written there.
int cli_open_run_folder(const char *out, int *lock_fd, bool *created) {
    struct stat st;
    *created = false;
    if (strlen(out) > 3900) return dc_fail("--out %s: the path is too long", out);
    bool exists = stat(out, &st) == 0;
    if (exists && !S_ISDIR(st.st_mode)) return dc_fail("--out %s exists and is not a folder", out);
    if (!exists && dc_mkdir_p(out)) return -1;
    *created = !exists;
    DC_TRY(cli_lock_run(out, lock_fd));
    cli_remove_stale_temps(out);
    char probe[4096];
    cli_checkpoint_path(out, 0, probe, sizeof probe);
    return cli_probe_write(probe);
}
