// Listing captioned pictures: folder trees, kohya's N_ folders,
// metadata.jsonl and webdataset tars (see picture_set.h).
#include "io/picture_set.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "io/json.h"
#include "io/tar.h"

#define MAX_CAPTION (64 << 10)       // bytes of one caption
#define MAX_METADATA (1ll << 32)     // bytes of metadata.jsonl
#define MAX_MEMBER ((int64_t)1 << 30)  // bytes of one picture inside an archive
#define MAX_DEPTH 32                 // folders within folders
#define WARN_UNCAPTIONED 10          // pictures named in warnings; the rest are counted

static const char *ext_of(const char *name) {
    const char *slash = strrchr(name, '/'), *dot = strrchr(name, '.');
    return dot && (!slash || dot > slash) ? dot : "";
}

static bool is_picture_ext(const char *ext) {
    return !strcasecmp(ext, ".png") || !strcasecmp(ext, ".jpg") || !strcasecmp(ext, ".jpeg") ||
           !strcasecmp(ext, ".webp");
}

// Removes surrounding white space in place; refuses text that is not UTF-8.
static int clean_caption(char *s, size_t n, const char *what) {
    if (memchr(s, 0, n)) return dc_fail("%s: the caption holds a NUL byte", what);
    int64_t bad = dc_utf8_invalid_at(s, n);
    if (bad >= 0) return dc_fail("%s: the caption is not UTF-8 (byte %lld)", what, (long long)bad);
    size_t a = 0;
    while (a < n && isspace((unsigned char)s[a])) a++;
    while (n > a && isspace((unsigned char)s[n - 1])) n--;
    memmove(s, s + a, n - a);
    s[n - a] = 0;
    return 0;
}

// Reads bytes [at, at + n) of the file at path (n <= limit) into a new string.
static int read_text(const char *path, int64_t at, int64_t n, int64_t limit, char **out) {
    *out = NULL;
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    if (n < 0) n = size - at;
    int rc = 0;
    if (n > limit) rc = dc_fail("%s: %lld bytes, more than the %lld a caption may have", path, (long long)n, (long long)limit);
    char *s = rc ? NULL : malloc((size_t)n + 1);
    if (!rc && !s) rc = dc_fail("out of memory");
    if (!rc) rc = dc_pread_exact(fd, s, (size_t)n, (uint64_t)at, path);
    close(fd);
    if (rc) return free(s), -1;
    s[n] = 0;
    *out = s;
    return 0;
}

static int add(dc_picture_set *s, const char *path, const char *member, int64_t off, int64_t size, char *caption,
               int repeats) {
    if (s->n == s->cap) {
        int64_t c = s->cap ? s->cap * 2 : 256;
        dc_picture_entry *e = realloc(s->e, sizeof *e * (size_t)c);
        if (!e) return free(caption), dc_fail("out of memory");
        s->e = e, s->cap = c;
    }
    dc_picture_entry *e = &s->e[s->n];
    *e = (dc_picture_entry){strdup(path), member ? strdup(member) : NULL, off, size, caption, repeats};
    if (!e->path || (member && !e->member) || !caption) {
        free(e->path), free(e->member), free(caption);
        return dc_fail("out of memory");
    }
    s->n++;
    return 0;
}

static char *no_caption(dc_picture_set *s, const char *name, const char *looked) {
    if (s->uncaptioned++ < WARN_UNCAPTIONED)
        dc_warn("%s has no caption (%s): its caption is empty", name, looked);
    return strdup("");
}

// ---- webdataset tars

typedef struct {
    const dc_tar_member *m;
    size_t key_len;  // the key: the name up to the first '.' of its last part
} keyed;

static int by_key(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->m->name, y->m->name, n);
    if (c) return c;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return strcmp(x->m->name, y->m->name);
}

// key.json's "caption" as a new string; NULL with *rc 0 when it has none.
static char *json_caption(const char *path, const dc_tar_member *m, int *rc) {
    char *text = NULL, *cap = NULL;
    *rc = read_text(path, m->offset, m->size, MAX_CAPTION, &text);
    if (*rc) return NULL;
    dc_json_doc doc;
    if (dc_json_parse(&doc, text, strlen(text), 0)) {
        *rc = dc_fail_ctx("%s:%s", path, m->name);
    } else {
        const dc_json *c = doc.root->type == DC_JSON_OBJECT ? dc_json_get(doc.root, "caption") : NULL;
        if (c && dc_json_is_cstr(c)) cap = strdup(c->str), *rc = cap ? 0 : dc_fail("out of memory");
        else if (c && c->type != DC_JSON_NULL) *rc = dc_fail("%s:%s: \"caption\" is not a string", path, m->name);
    }
    dc_json_free(&doc);
    free(text);
    return cap;
}

static int scan_tar(dc_picture_set *s, const char *path) {
    dc_tar_index t;
    DC_TRY(dc_tar_list(path, &t));
    keyed *k = malloc(sizeof *k * (size_t)(t.n ? t.n : 1));
    if (!k) return dc_tar_index_free(&t), dc_fail("out of memory");
    for (int64_t i = 0; i < t.n; i++) {
        const char *name = t.m[i].name, *last = strrchr(name, '/'), *dot = strchr(last ? last + 1 : name, '.');
        k[i] = (keyed){&t.m[i], dot ? (size_t)(dot - name) : strlen(name)};
    }
    qsort(k, (size_t)t.n, sizeof *k, by_key);
    int rc = 0;
    for (int64_t i = 0, j; i < t.n && !rc; i = j) {
        const dc_tar_member *pic = NULL, *txt = NULL, *json = NULL;
        for (j = i; j < t.n && k[j].key_len == k[i].key_len && !memcmp(k[j].m->name, k[i].m->name, k[i].key_len); j++) {
            const char *ext = k[j].m->name + k[j].key_len;
            if (!pic && is_picture_ext(ext)) pic = k[j].m;
            else if (!strcasecmp(ext, ".txt")) txt = k[j].m;
            else if (!strcasecmp(ext, ".json")) json = k[j].m;
        }
        if (!pic) continue;  // a key without a picture (img2dataset's failed downloads write none)
        char *cap = NULL, what[4400];
        snprintf(what, sizeof what, "%s:%s", path, txt ? txt->name : pic->name);
        if (txt) rc = read_text(path, txt->offset, txt->size, MAX_CAPTION, &cap);
        else if (json) cap = json_caption(path, json, &rc);
        if (!rc && cap) rc = clean_caption(cap, strlen(cap), what);
        if (!rc && !cap) cap = no_caption(s, what, "no key.txt, and no \"caption\" in key.json");
        if (!rc) rc = add(s, path, pic->name, pic->offset, pic->size, cap, 1);
        else free(cap);
    }
    free(k);
    dc_tar_index_free(&t);
    return rc;
}

// ---- folders

// The caption of picture `path`: its same-stem caption file, else `fallback`
// (kohya's class tokens), else empty with a warning.
static int file_caption(dc_picture_set *s, const char *path, const dc_picture_set_opts *o, const char *fallback,
                        char **out) {
    if (o->caption) return (*out = strdup(o->caption)) ? 0 : dc_fail("out of memory");  // one for all
    const char *ext = ext_of(path);
    const size_t stem = strlen(path) - strlen(ext);
    const char *const tries[2] = {o->caption_ext ? o->caption_ext : ".txt", o->caption_ext ? NULL : ".caption"};
    char cp[4200];
    for (int t = 0; t < 2 && tries[t]; t++) {
        snprintf(cp, sizeof cp, "%.*s%s", (int)stem, path, tries[t]);
        struct stat st;
        if (stat(cp, &st) != 0) continue;
        DC_TRY(read_text(cp, 0, -1, MAX_CAPTION, out));
        if (clean_caption(*out, strlen(*out), cp)) return free(*out), *out = NULL, -1;
        return 0;
    }
    if (fallback) *out = strdup(fallback);
    else *out = no_caption(s, path, o->caption_ext ? o->caption_ext : "no .txt or .caption file");
    return *out ? 0 : dc_fail("out of memory");
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The sorted names in dir (dot files left out), in a new array of *n.
static int list_dir(const char *dir, char ***names, int *n) {
    *names = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return dc_fail("%s: cannot read the folder", dir);
    int cap = 0, rc = 0;
    for (struct dirent *e; (e = readdir(d)) && !rc;) {
        if (e->d_name[0] == '.') continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            char **p = realloc(*names, sizeof *p * (size_t)cap);
            if (!p) { rc = dc_fail("out of memory"); break; }
            *names = p;
        }
        if (!((*names)[*n] = strdup(e->d_name))) rc = dc_fail("out of memory");
        else (*n)++;
    }
    closedir(d);
    if (!rc) qsort(*names, (size_t)*n, sizeof **names, by_name);
    return rc;
}

// kohya's "N_class tokens": N >= 1 in *repeats, the tokens in *tokens; false otherwise.
static bool kohya_folder(const char *name, int *repeats, const char **tokens) {
    char *end;
    long n = strtol(name, &end, 10);
    if (end == name || *end != '_' || !isdigit((unsigned char)name[0])) return false;
    *repeats = n > 0 && n < 1000000 ? (int)n : -1;
    *tokens = end + 1;
    return true;
}

static int scan_dir(dc_picture_set *s, const char *dir, const dc_picture_set_opts *o, int depth, int repeats,
                    const char *tokens) {
    if (depth > MAX_DEPTH) return dc_fail("%s: folders nested more than %d deep", dir, MAX_DEPTH);
    char **names;
    int n, rc = list_dir(dir, &names, &n);
    char path[4200];
    for (int i = 0; i < n && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) != 0) continue;  // a dangling link
        if (S_ISDIR(st.st_mode)) {
            int r = repeats;
            const char *t = tokens;
            if (depth == 0 && kohya_folder(names[i], &r, &t) && r < 1)
                rc = dc_fail("%s: kohya's N_name folder with a repeat count that is not 1..999999", path);
            if (!rc) rc = scan_dir(s, path, o, depth + 1, r, t);
        } else if (S_ISREG(st.st_mode) && is_picture_ext(ext_of(names[i]))) {
            char *cap;
            rc = file_caption(s, path, o, tokens, &cap);
            if (!rc) rc = add(s, path, NULL, 0, st.st_size, cap, repeats);
        } else if (S_ISREG(st.st_mode) && !strcasecmp(ext_of(names[i]), ".tar")) {
            rc = scan_tar(s, path);
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

// ---- metadata.jsonl

static bool safe_relative(const char *p) {
    if (!p[0] || p[0] == '/') return false;
    for (const char *q = p; q;) {
        if (!strncmp(q, "..", 2) && (q[2] == '/' || q[2] == 0)) return false;
        q = strchr(q, '/');
        if (q) q++;
    }
    return true;
}

static int scan_metadata(dc_picture_set *s, const char *dir, const char *meta, const dc_picture_set_opts *o) {
    const char *column = o->caption_column ? o->caption_column : "text";
    char *text;
    DC_TRY(read_text(meta, 0, -1, MAX_METADATA, &text));
    int rc = 0;
    char path[4200];
    int64_t line = 0;
    for (char *p = text, *nl; p && *p && !rc; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        line++;
        size_t a = 0;
        while (a < len && isspace((unsigned char)p[a])) a++;
        if (a == len) continue;  // a blank line
        dc_json_doc doc;
        if (dc_json_parse(&doc, p, len, 0)) {
            rc = dc_fail_ctx("%s, line %lld", meta, (long long)line);
            break;
        }
        const dc_json *fn = doc.root->type == DC_JSON_OBJECT ? dc_json_get(doc.root, "file_name") : NULL;
        const dc_json *cap = doc.root->type == DC_JSON_OBJECT ? dc_json_get(doc.root, column) : NULL;
        struct stat st;
        if (!fn || !dc_json_is_cstr(fn))
            rc = dc_fail("%s, line %lld: no \"file_name\" string", meta, (long long)line);
        else if (!safe_relative(fn->str))
            rc = dc_fail("%s, line %lld: file_name \"%s\" is not a path inside the folder", meta, (long long)line, fn->str);
        else if (cap && cap->type != DC_JSON_NULL && !dc_json_is_cstr(cap))
            rc = dc_fail("%s, line %lld: the caption column \"%s\" is not a string", meta, (long long)line, column);
        else if (snprintf(path, sizeof path, "%s/%s", dir, fn->str), stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            rc = dc_fail("%s, line %lld: %s is not a file", meta, (long long)line, path);
        else {
            char *c = cap && cap->type == DC_JSON_STRING ? strdup(cap->str) : NULL;
            if (cap && cap->type == DC_JSON_STRING && !c) rc = dc_fail("out of memory");
            else if (c) rc = clean_caption(c, strlen(c), path);
            else {
                char why[128];
                snprintf(why, sizeof why, "no \"%.60s\" in %s", column, "metadata.jsonl");
                c = no_caption(s, path, why);
            }
            if (!rc) rc = add(s, path, NULL, 0, st.st_size, c, 1);
            else free(c);
        }
        dc_json_free(&doc);
    }
    free(text);
    return rc;
}

// ---- the set

static int by_place(const void *a, const void *b) {
    const dc_picture_entry *x = a, *y = b;
    int c = strcmp(x->path, y->path);
    if (!c) c = (x->member != NULL) - (y->member != NULL);
    if (!c && x->member) c = strcmp(x->member, y->member);
    if (!c) c = strcmp(x->caption, y->caption);  // metadata.jsonl may list a picture twice
    return c ? c : x->repeats - y->repeats;
}

int dc_picture_set_scan(dc_picture_set *s, const char *path, const dc_picture_set_opts *o) {
    memset(s, 0, sizeof *s);
    dc_picture_set_opts none = {0};
    if (!o) o = &none;
    if (o->caption_ext && o->caption_ext[0] != '.')
        return dc_fail("caption extension \"%s\": give it with its dot (.txt)", o->caption_ext);
    struct stat st;
    if (stat(path, &st) != 0) return dc_fail("%s: no such file or folder", path);
    char meta[4200];
    snprintf(meta, sizeof meta, "%s/metadata.jsonl", path);
    int rc;
    if (S_ISREG(st.st_mode) && !strcasecmp(ext_of(path), ".tar")) rc = scan_tar(s, path);
    else if (!S_ISDIR(st.st_mode)) rc = dc_fail("%s: give a folder of pictures or a webdataset .tar", path);
    else if (dc_file_exists(meta)) rc = scan_metadata(s, path, meta, o);
    else rc = scan_dir(s, path, o, 0, 1, NULL);
    if (!rc && s->n == 0)
        rc = dc_fail("%s holds no pictures (.png, .jpg, .jpeg, .webp files, or .tar shards with them)", path);
    for (int64_t i = 0; !rc && o->caption && i < s->n; i++) {  // archives' and metadata's too
        free(s->e[i].caption);
        if (!(s->e[i].caption = strdup(o->caption))) rc = dc_fail("out of memory");
    }
    if (o->caption) s->uncaptioned = 0;
    if (rc) return dc_picture_set_free(s), -1;
    qsort(s->e, (size_t)s->n, sizeof *s->e, by_place);
    if (s->uncaptioned > WARN_UNCAPTIONED)
        dc_warn("%lld pictures in all have no caption (the first %d named above)", (long long)s->uncaptioned,
                WARN_UNCAPTIONED);
    return 0;
}

void dc_picture_set_free(dc_picture_set *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->e[i].path), free(s->e[i].member), free(s->e[i].caption);
    free(s->e);
    memset(s, 0, sizeof *s);
}

void dc_picture_set_name(const dc_picture_set *s, int64_t i, char *buf, size_t cap) {
    const dc_picture_entry *e = &s->e[i];
    if (e->member) snprintf(buf, cap, "%s:%s", e->path, e->member);
    else snprintf(buf, cap, "%s", e->path);
}

int dc_picture_set_read(const dc_picture_set *s, int64_t i, dc_image *img, int64_t max_pixels, bool header_only) {
    memset(img, 0, sizeof *img);
    const dc_picture_entry *e = &s->e[i];
    if (!e->member) return header_only ? dc_image_probe(e->path, img) : dc_image_read(e->path, img, max_pixels);
    // A member is copied into an in-memory file, which the picture readers take as any other.
    char name[4400];
    dc_picture_set_name(s, i, name, sizeof name);
    if (e->size > MAX_MEMBER) return dc_fail("%s: %lld bytes, too large for a picture", name, (long long)e->size);
    uint8_t *b = malloc(e->size ? (size_t)e->size : 1);
    if (!b) return dc_fail("out of memory");
    int64_t size;
    int tar = dc_open_regular(e->path, &size), rc = tar < 0 ? -1 : 0;
    if (!rc) rc = dc_pread_exact(tar, b, (size_t)e->size, (uint64_t)e->offset, e->path);
    if (tar >= 0) close(tar);
    int fd = rc ? -1 : memfd_create("picture", MFD_CLOEXEC);
    if (!rc && fd < 0) rc = dc_fail("%s: cannot make an in-memory file", name);
    for (int64_t done = 0; !rc && done < e->size;) {
        ssize_t w = write(fd, b + done, (size_t)(e->size - done));
        if (w <= 0) rc = dc_fail("%s: cannot copy into memory", name);
        else done += w;
    }
    free(b);
    if (!rc && lseek(fd, 0, SEEK_SET) != 0) rc = dc_fail("%s: cannot read back the in-memory copy", name);
    if (rc) {
        if (fd >= 0) close(fd);
        return rc;
    }
    return dc_image_read_fd(name, fd, e->size, img, max_pixels, header_only);
}
