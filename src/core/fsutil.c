#include "core/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

struct dc_atomic_file {
    FILE *fp;
    char *path;  // the target
    char *tmp;   // "<path>.tmp.<pid>", in the same directory so rename() is atomic
};

const char *dc_file_kind(unsigned mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

dc_atomic_file *dc_atomic_begin(const char *path) {
    if (!path || !*path) {
        dc_fail("atomic write: empty file name");
        return NULL;
    }
    // rename() would put a regular file in place of a device or FIFO (as root,
    // /dev/null itself), so only a regular file, or nothing, may be replaced.
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        dc_fail("%s is %s, not a regular file; refusing to replace it", path, dc_file_kind(st.st_mode));
        return NULL;
    }
    dc_atomic_file *af = calloc(1, sizeof *af);
    size_t n = strlen(path);
    size_t tmp_cap = n + 32;
    if (af) af->path = malloc(n + 1), af->tmp = malloc(tmp_cap);
    if (!af || !af->path || !af->tmp) {
        if (af) free(af->path), free(af->tmp), free(af);
        dc_fail("%s: out of memory", path);
        return NULL;
    }
    memcpy(af->path, path, n + 1);
    snprintf(af->tmp, tmp_cap, "%s.tmp.%ld", path, (long)getpid());
    // O_TRUNC: a leftover from a crashed process that had the same pid is garbage.
    int fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd >= 0) af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        int e = errno;
        if (fd >= 0) close(fd), unlink(af->tmp);
        dc_fail("%s: cannot create temporary file %s: %s", path, af->tmp, strerror(e));
        free(af->path), free(af->tmp), free(af);
        return NULL;
    }
    return af;
}

FILE *dc_atomic_stream(dc_atomic_file *af) { return af ? af->fp : NULL; }

// The rename is only durable once the directory entry itself is on disk.
static int fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) dir = strdup(".");
    else if (slash == path) dir = strdup("/");
    else dir = strndup(path, (size_t)(slash - path));
    if (!dir) return dc_fail("%s: out of memory", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    // Some file systems cannot fsync a directory (EINVAL); the data itself is synced.
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        rc = dc_fail("%s: written, but syncing directory %s failed: %s", path, dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int dc_atomic_end(dc_atomic_file *af, int ok) {
    if (!af) return -1;  // dc_atomic_begin failed and left the message
    int rc = 0;
    if (!ok) {
        rc = -1;  // the caller's message stays
    } else if (fflush(af->fp) != 0 || ferror(af->fp)) {
        rc = dc_fail("%s: write failed: %s", af->path, strerror(errno));
    } else if (fsync(fileno(af->fp)) != 0) {
        rc = dc_fail("%s: fsync failed: %s", af->path, strerror(errno));
    }
    // fclose can still report a deferred write error (e.g. on NFS).
    if (fclose(af->fp) != 0 && rc == 0) rc = dc_fail("%s: close failed: %s", af->path, strerror(errno));
    if (rc == 0 && rename(af->tmp, af->path) != 0)
        rc = dc_fail("%s: cannot rename %s over it: %s", af->path, af->tmp, strerror(errno));
    if (rc != 0) unlink(af->tmp);
    else rc = fsync_parent_dir(af->path);
    free(af->path), free(af->tmp), free(af);
    return rc;
}

int dc_open_regular(const char *path, int64_t *size) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return dc_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dc_fail("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dc_fail("%s is %s, not a regular file", path, dc_file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return dc_fail("%s: cannot open: %s", path, strerror(e));
    }
    if (size) *size = (int64_t)st.st_size;
    return fd;
}

int dc_read_exact(int fd, void *dst, size_t n, const char *path) {
    uint8_t *p = dst;
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got < (1u << 30) ? n - got : (1u << 30);
        ssize_t r = read(fd, p + got, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dc_fail("%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return dc_fail("%s: the file ended early (was it changed while being read?)", path);
        got += (size_t)r;
    }
    return 0;
}

int dc_pread_exact(int fd, void *dst, size_t n, uint64_t at, const char *path) {
    uint8_t *p = dst;
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got < (1u << 30) ? n - got : (1u << 30);
        if (at + got > (uint64_t)INT64_MAX) return dc_fail("%s: read past the largest file offset", path);
        ssize_t r = pread(fd, p + got, chunk, (off_t)(at + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return dc_fail("%s: read failed at byte %llu: %s", path, (unsigned long long)(at + got), strerror(errno));
        if (r == 0)
            return dc_fail("%s: the file ends before byte %llu, which it held when it was opened (was it "
                           "truncated while being read?)", path, (unsigned long long)(at + n));
        got += (size_t)r;
    }
    return 0;
}

int dc_file_exists(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0;
}

int dc_mkdir_p(const char *path) {
    if (!path || !*path) return dc_fail("mkdir: empty directory name");
    char *p = strdup(path);
    if (!p) return dc_fail("%s: out of memory", path);
    int rc = 0;
    // Create each prefix that ends just before a '/', then the whole path.
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        struct stat st;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            rc = dc_fail("cannot create directory %s: %s", p, strerror(errno));
        } else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = dc_fail("cannot create directory %s: %s exists and is not a directory", path, p);
        }
        *s = c;
        if (rc != 0 || c == 0) break;
    }
    free(p);
    return rc;
}

int dc_write_text_file(const char *path, const char *text) {
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    fputs(text, dc_atomic_stream(af));
    return dc_atomic_end(af, 1);
}
