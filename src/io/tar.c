// Reading tar headers (POSIX.1-2001 pax, ustar and GNU's long-name records,
// as Python's tarfile writes and reads them): each member is a 512-byte
// header, then its bytes padded to a multiple of 512; two zero blocks end
// the archive.
#include "io/tar.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"

#define BLOCK 512
#define MAX_MEMBERS ((int64_t)1 << 24)
#define MAX_EXTENDED (1 << 20)  // bytes of a pax record set or a GNU long name

// A numeric field: octal digits (leading spaces, ended by a space or NUL) or,
// with the top bit of its first byte set, GNU's big-endian base-256.
static int number(const uint8_t *f, int len, int64_t *out) {
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80) return -1;  // negative, or more than 63 bits
        for (int i = 1; i < len; i++) {
            if (v >> 55) return -1;
            v = v << 8 | f[i];
        }
        *out = (int64_t)v;
        return 0;
    }
    int i = 0, digits = 0;
    while (i < len && f[i] == ' ') i++;
    for (; i < len && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
        if (v >> 60) return -1;
        v = v << 3 | (uint64_t)(f[i] - '0');
    }
    if (i < len && f[i] != ' ' && f[i] != 0) return -1;
    *out = (int64_t)v;
    return digits || i == len || f[i] == 0 ? 0 : -1;
}

// The checksum is the sum of the header's bytes with its own field read as spaces.
static int checksum_ok(const uint8_t *h) {
    int64_t want;
    if (number(h + 148, 8, &want)) return 0;
    int64_t sum = 0;
    for (int i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? ' ' : h[i];
    return sum == want;
}

static char *field_str(const uint8_t *f, int len) {
    int n = 0;
    while (n < len && f[n]) n++;
    char *s = malloc((size_t)n + 1);
    if (s) memcpy(s, f, (size_t)n), s[n] = 0;
    return s;
}

// pax records, "LEN key=value\n" each: the path and size that override the
// next header's. Anything else (times, owners) is not needed.
static int pax_parse(const char *d, int64_t n, char **path, int64_t *size, const char *file, int64_t at) {
    int64_t i = 0;
    while (i < n) {
        int64_t len = 0, j = i;
        while (j < n && d[j] >= '0' && d[j] <= '9' && len < MAX_EXTENDED) len = len * 10 + (d[j++] - '0');
        if (j == i || j >= n || d[j] != ' ' || len <= j - i + 1 || i + len > n || d[i + len - 1] != '\n')
            return dc_fail("%s: the pax header at byte %lld is malformed", file, (long long)at);
        const char *kv = d + j + 1, *end = d + i + len - 1, *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq) return dc_fail("%s: the pax header at byte %lld has a record without '='", file, (long long)at);
        if (eq - kv == 4 && !memcmp(kv, "path", 4)) {
            free(*path);
            *path = strndup(eq + 1, (size_t)(end - eq - 1));
            if (!*path) return dc_fail("out of memory");
            if (strlen(*path) != (size_t)(end - eq - 1))
                return dc_fail("%s: the pax path at byte %lld holds a NUL byte", file, (long long)at);
        } else if (eq - kv == 4 && !memcmp(kv, "size", 4)) {
            int64_t v = 0;
            const char *p = eq + 1;
            if (p == end) return dc_fail("%s: the pax size at byte %lld is empty", file, (long long)at);
            for (; p < end; p++) {
                if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
                    return dc_fail("%s: the pax size at byte %lld is not a number", file, (long long)at);
                v = v * 10 + (*p - '0');
            }
            *size = v;
        }
        i += len;
    }
    return 0;
}

static int add(dc_tar_index *t, int64_t *cap, char *name, int64_t offset, int64_t size, const char *file) {
    if (t->n >= MAX_MEMBERS) return free(name), dc_fail("%s: more than %lld members", file, (long long)MAX_MEMBERS);
    if (t->n == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        dc_tar_member *m = realloc(t->m, sizeof *m * (size_t)c);
        if (!m) return free(name), dc_fail("out of memory");
        t->m = m, *cap = c;
    }
    t->m[t->n++] = (dc_tar_member){name, offset, size};
    return 0;
}

int dc_tar_list_fd(int fd, int64_t size, const char *path, dc_tar_index *out) {
    memset(out, 0, sizeof *out);
    int64_t cap = 0, at = 0, pax_size = -1;
    char *long_name = NULL;  // from a pax or GNU record, for the next member
    uint8_t h[BLOCK];
    int rc = 0;
    while (rc == 0) {
        if (at + BLOCK > size) {
            if (at == size && at > 0) break;  // no end blocks: Python's tarfile reads such archives too
            rc = dc_fail("%s is truncated: a header at byte %lld runs past its end (%lld bytes)%s", path,
                         (long long)at, (long long)size, size == 0 ? ": the file is empty, not a tar archive" : "");
            break;
        }
        if ((rc = dc_pread_exact(fd, h, BLOCK, (uint64_t)at, path))) break;
        int zero = 1;
        for (int i = 0; i < BLOCK && zero; i++) zero = h[i] == 0;
        if (zero) break;  // the end
        if (!checksum_ok(h)) {
            rc = dc_fail("%s: the header at byte %lld fails its checksum (%s)", path, (long long)at,
                         at ? "the archive is damaged" : "not a tar archive");
            break;
        }
        if (memcmp(h + 257, "ustar", 5)) {
            rc = dc_fail("%s: the header at byte %lld is not a ustar header (an old V7 archive is not read)", path,
                         (long long)at);
            break;
        }
        int64_t n;
        if (number(h + 124, 12, &n)) {
            rc = dc_fail("%s: the header at byte %lld has a malformed size", path, (long long)at);
            break;
        }
        const char type = (char)h[156];
        if ((type == '0' || type == 0 || type == '7') && pax_size >= 0) n = pax_size;
        const int64_t data = at + BLOCK;
        if (n > size - data) {
            rc = dc_fail("%s is truncated: the member at byte %lld declares %lld bytes, %lld are left", path,
                         (long long)at, (long long)n, (long long)(size - data));
            break;
        }
        if (type == 'x' || type == 'L') {  // an extended header for the next member
            if (n > MAX_EXTENDED) {
                rc = dc_fail("%s: the extended header at byte %lld is %lld bytes", path, (long long)at, (long long)n);
                break;
            }
            char *d = malloc((size_t)n + 1);
            rc = d ? dc_pread_exact(fd, d, (size_t)n, (uint64_t)data, path) : dc_fail("out of memory");
            if (!rc && type == 'x') rc = pax_parse(d, n, &long_name, &pax_size, path, at);
            else if (!rc) {
                d[n] = 0;
                free(long_name);
                long_name = strdup(d);
                if (!long_name) rc = dc_fail("out of memory");
            }
            free(d);
        } else if (type == '0' || type == 0 || type == '7') {
            char *name = long_name;
            long_name = NULL;
            if (!name) {  // ustar: prefix "/" name when the prefix is set (GNU's magic has no prefix field)
                char *base = field_str(h, 100), *prefix = memcmp(h + 257, "ustar\0", 6) ? NULL : field_str(h + 345, 155);
                if (base && prefix && prefix[0]) {
                    name = malloc(strlen(prefix) + strlen(base) + 2);
                    if (name) sprintf(name, "%s/%s", prefix, base);
                } else if (base) name = strdup(base);
                free(base), free(prefix);
            }
            if (!name) rc = dc_fail("out of memory");
            else rc = add(out, &cap, name, data, n, path);
            pax_size = -1;
        } else if (type != 'g') {  // a directory, link or device: passed over
            free(long_name), long_name = NULL;
            pax_size = -1;
        }
        at = data + (n + BLOCK - 1) / BLOCK * BLOCK;
    }
    free(long_name);
    if (rc) dc_tar_index_free(out);
    return rc;
}

int dc_tar_list(const char *path, dc_tar_index *out) {
    memset(out, 0, sizeof *out);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    int rc = dc_tar_list_fd(fd, size, path, out);
    close(fd);
    return rc;
}

void dc_tar_index_free(dc_tar_index *t) {
    for (int64_t i = 0; i < t->n; i++) free(t->m[i].name);
    free(t->m);
    memset(t, 0, sizeof *t);
}
