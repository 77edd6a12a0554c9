#include "cli/model_hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "core/log.h"

#define CACHE_LINES 1000  // the newest entries kept; older ones are dropped

// The cache file's path into out[n]; 0 when there is no home to keep it in.
static int cache_path(char *out, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int k;
    if (xdg && xdg[0] == '/') k = snprintf(out, n, "%s/diffusion/model-hashes", xdg);  // the spec: absolute only
    else if (home && home[0]) k = snprintf(out, n, "%s/.cache/diffusion/model-hashes", home);
    else return 0;
    return k > 0 && (size_t)k < n;
}

// The cache's key and stamp of the files: their absolute paths joined by
// tabs; "size:seconds.nanoseconds" of each joined by commas. 0 when a path
// cannot be a key (a tab or a line break in it, or too long).
static int key_of(const char *const *paths, int n, char *key, size_t kn, char *stamp, size_t sn) {
    size_t k = 0, s = 0;
    key[0] = stamp[0] = 0;
    for (int i = 0; i < n; i++) {
        char abs[4096];
        struct stat st;
        if (!realpath(paths[i], abs) || stat(abs, &st) != 0 || strpbrk(abs, "\t\n\r")) return 0;
        int a = snprintf(key + k, kn - k, "%s%s", i ? "\t" : "", abs);
        int b = snprintf(stamp + s, sn - s, "%s%lld:%lld.%09ld", i ? "," : "", (long long)st.st_size,
                         (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
        if (a < 0 || b < 0 || (k += (size_t)a) >= kn || (s += (size_t)b) >= sn) return 0;
    }
    return 1;
}

// Splits a cache line "HEX64 STAMP KEY" in place; 0 when it is not one.
static int parse_line(char *line, char **hex, char **stamp, char **key) {
    line[strcspn(line, "\n")] = 0;
    char *a = strchr(line, ' '), *b = a ? strchr(a + 1, ' ') : NULL;
    if (!a || !b || a - line != 64) return 0;
    *a = *b = 0;
    *hex = line, *stamp = a + 1, *key = b + 1;
    return strspn(line, "0123456789abcdef") == 64;
}

static int cache_lookup(const char *file, const char *key, const char *stamp, char hex[65]) {
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    char *line = NULL, *h, *s, *k;
    size_t cap = 0;
    int found = 0;
    while (!found && getline(&line, &cap, f) > 0)
        if (parse_line(line, &h, &s, &k) && !strcmp(k, key) && !strcmp(s, stamp)) memcpy(hex, h, 65), found = 1;
    free(line);
    fclose(f);
    return found;
}

// Rewrites the cache with this entry last (the newest) and the newest others
// before it, atomically; a failure is reported as a note, never an error.
static void cache_store(const char *file, const char *key, const char *stamp, const char *hex) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", file);
    *strrchr(dir, '/') = 0;
    char **keep = calloc(CACHE_LINES, sizeof *keep);
    int n = 0;
    FILE *f = keep ? fopen(file, "r") : NULL;
    if (f) {
        char *line = NULL, *h, *s, *k;
        size_t cap = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, f)) > 0) {
            char *copy = line[len - 1] == '\n' ? strdup(line) : NULL;  // a cut last line is dropped
            if (!copy || !parse_line(line, &h, &s, &k) || !strcmp(k, key)) {
                free(copy);
                continue;
            }
            if (n == CACHE_LINES - 1) free(keep[0]), memmove(keep, keep + 1, sizeof *keep * (size_t)--n);
            keep[n++] = copy;
        }
        free(line);
        fclose(f);
    }
    dc_atomic_file *af = keep && dc_mkdir_p(dir) == 0 ? dc_atomic_begin(file) : NULL;
    if (af) {
        FILE *o = dc_atomic_stream(af);
        for (int i = 0; i < n; i++) fputs(keep[i], o);
        fprintf(o, "%s %s %s\n", hex, stamp, key);
    }
    if (!af || dc_atomic_end(af, 1)) {
        dc_log("model hash not cached (%s): %s", file, keep ? dc_error() : "out of memory");
        dc_error_clear();
    }
    for (int i = 0; i < n; i++) free(keep[i]);
    free(keep);
}

static int hash_files(const char *const *paths, int n, char hex[65]) {
    enum { CHUNK = 4 << 20 };
    uint8_t *buf = malloc(CHUNK), digest[32];
    if (!buf) return dc_fail("out of memory");
    dc_sha256_state s;
    dc_sha256_init(&s);
    for (int i = 0; i < n; i++) {
        int fd = dc_open_regular(paths[i], NULL);
        if (fd < 0) return free(buf), -1;
        ssize_t got;
        while ((got = read(fd, buf, CHUNK)) > 0) dc_sha256_update(&s, buf, (size_t)got);
        int e = errno;
        close(fd);
        if (got < 0) return free(buf), dc_fail("%s: reading it for the model hash: %s", paths[i], strerror(e));
    }
    free(buf);
    dc_sha256_final(&s, digest);
    dc_sha256_hex(digest, hex);
    return 0;
}

int cli_files_hash(const char *const *paths, int n, char hash[11]) {
    char file[4200], key[16384], stamp[1024], hex[65];
    const int cached = cache_path(file, sizeof file) && key_of(paths, n, key, sizeof key, stamp, sizeof stamp);
    if (!cached || !cache_lookup(file, key, stamp, hex)) {
        int64_t bytes = 0;
        for (int i = 0; i < n; i++) {
            struct stat st;
            if (stat(paths[i], &st) == 0) bytes += st.st_size;
        }
        if (bytes > (256 << 20)) dc_log("hashing %.1f GB of weights for the pictures' Model hash (once: it is cached)", bytes / 1e9);
        DC_TRY(hash_files(paths, n, hex));
        if (cached) cache_store(file, key, stamp, hex);
    }
    memcpy(hash, hex, 10);
    hash[10] = 0;
    return 0;
}

int cli_model_hash(dc_sd_model *m, char hash[11]) {
    dc_sd_source s;
    DC_TRY(dc_sd_source_open(&s, m, DC_SD_UNET));
    const char *paths[DC_SD_MAX_FILES];
    const int n = s.w.nfiles < DC_SD_MAX_FILES ? s.w.nfiles : DC_SD_MAX_FILES;
    for (int i = 0; i < n; i++) paths[i] = s.w.files[i].path;
    int rc = cli_files_hash(paths, n, hash);
    dc_sd_source_close(&s);
    return rc;
}

int cli_lora_hash(const char *path, char hash[13]) {
    FILE *f = fopen(path, "rb");
    if (!f) return dc_fail("%s: cannot open (%s)", path, strerror(errno));
    uint8_t len8[8], buf[1 << 16], digest[32];
    uint64_t hlen = 0;
    int rc = fread(len8, 1, 8, f) == 8 ? 0 : dc_fail("%s: shorter than a safetensors header", path);
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (!rc && (hlen > ((uint64_t)1 << 40) || fseeko(f, (off_t)(8 + hlen), SEEK_SET)))
        rc = dc_fail("%s: its header length %llu cannot be", path, (unsigned long long)hlen);
    dc_sha256_state s;
    dc_sha256_init(&s);
    size_t n;
    while (!rc && (n = fread(buf, 1, sizeof buf, f)) > 0) dc_sha256_update(&s, buf, n);
    if (!rc && ferror(f)) rc = dc_fail("%s: read error", path);
    fclose(f);
    if (rc) return rc;
    char hex[65];
    dc_sha256_final(&s, digest);
    dc_sha256_hex(digest, hex);
    memcpy(hash, hex, 12);
    hash[12] = 0;
    return 0;
}
