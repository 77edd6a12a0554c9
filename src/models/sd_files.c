#include "models/sd_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"

int dc_sd_path_check(const char *path, int want_dir, bool *is_dir) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (e == ELOOP) return dc_fail("%s: a loop of symbolic links (a link that leads back to itself)", path);
        if (e == ENOENT || e == ENOTDIR) return dc_fail("%s: no such file or folder", path);
        return dc_fail("%s: %s", path, strerror(e));
    }
    bool dir = S_ISDIR(st.st_mode);
    if (is_dir) *is_dir = dir;
    if (want_dir == 1 && !dir) return dc_fail("%s is %s, not a folder", path, dc_file_kind(st.st_mode));
    if (want_dir == 0 && !S_ISREG(st.st_mode)) return dc_fail("%s is %s, not a regular file", path, dc_file_kind(st.st_mode));
    return 0;
}

int dc_sd_path_exists(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    return dc_sd_path_check(path, -1, NULL);
}

// ---- pickles ------------------------------------------------------------------------------

// How to convert the pickle at path, with the paths filled in.
static void convert_help(const char *path, char *out, size_t cap) {
    char stem[1024];
    snprintf(stem, sizeof stem, "%s", path);
    char *dot = strrchr(stem, '.'), *slash = strrchr(stem, '/');
    if (dot && (!slash || dot > slash)) *dot = 0;
    snprintf(out, cap,
             "convert it once, in Python: python3 -c \"import torch, safetensors.torch as st; "
             "sd = torch.load('%s', map_location='cpu', weights_only=True); sd = sd.get('state_dict', sd); "
             "st.save_file({k: v.contiguous().clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}, "
             "'%s.safetensors')\" (or, to make a diffusers folder of a checkpoint in the original layout, diffusers' "
             "scripts/convert_original_stable_diffusion_to_diffusers.py --to_safetensors)", path, stem);
}

int dc_sd_refuse_pickle(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;  // whoever opens it next says why
    struct stat st;
    unsigned char b[4] = {0};
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, b, sizeof b) : 0;
    close(fd);
    // PyTorch's zip format (torch.save since 1.6) starts as every zip does;
    // a bare pickle with its protocol opcode (0x80, then the protocol 2..5).
    bool zip = n == 4 && !memcmp(b, "PK\x03\x04", 4), pickle = n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5;
    if (!zip && !pickle) return 0;
    char help[2048];
    convert_help(path, help, sizeof help);
    if (zip)
        return dc_fail("%s: not a safetensors file: a PyTorch checkpoint (a zip holding a pickle), which the engine "
                       "does not read, as loading a pickle can run code; %s", path, help);
    return dc_fail("%s: not a safetensors file: a Python pickle (protocol %d), which the engine does not read, as "
                   "loading one can run code; %s", path, b[1], help);
}

// ---- the files of a folder ----------------------------------------------------------------

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\') && strlen(s) < 256;
}

// A shard's name: <stem>-<i>-of-<n>.safetensors with 5-digit i and n. Returns
// the length of the stem, or 0.
static size_t shard_of(const char *name, int *i, int *n) {
    size_t len = strlen(name), tail = strlen("-00001-of-00002.safetensors");
    if (len <= tail || !ends_with(name, ".safetensors")) return 0;
    const char *p = name + len - tail;
    if (sscanf(p, "-%5d-of-%5d.safetensors", i, n) != 2 || strncmp(p + 6, "-of-", 4)) return 0;
    return *i >= 1 && *n >= 1 && *i <= *n ? (size_t)(p - name) : 0;
}

// The index's shard files, checked, into names.
static int index_files(const char *dir, const char *iname, const dc_json *root, char names[][256], int *count) {
    char ipath[4400];
    snprintf(ipath, sizeof ipath, "%s/%s", dir, iname);
    const dc_json *wm = dc_json_get(root, "weight_map");
    if (!wm || wm->type != DC_JSON_OBJECT || !wm->nkids)
        return dc_fail("%s: no weight_map (an object of tensor name -> shard file)", ipath);
    for (int i = 0; i < wm->nkids; i++) {
        const dc_json *v = &wm->kids[i];
        if (!dc_json_is_cstr(v))
            return dc_fail("%s: weight_map['%.200s'] is not a file name", ipath, wm->kids[i].key);
        // a shard is a file of this folder: no path that leads elsewhere
        if (!plain_name(v->str) || !strcmp(v->str, "..") || !ends_with(v->str, ".safetensors"))
            return dc_fail("%s: weight_map names '%.200s': a shard must be a *.safetensors file of the folder "
                           "(no '/', no leading '.')", ipath, v->str);
        int k = 0;
        while (k < *count && strcmp(names[k], v->str)) k++;
        if (k < *count) continue;
        if (*count == DC_SD_MAX_FILES) return dc_fail("%s: more than %d shards", ipath, DC_SD_MAX_FILES);
        snprintf(names[(*count)++], 256, "%s", v->str);
    }
    for (int k = 0; k < *count; k++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        int e = dc_sd_path_exists(path);
        if (e < 0) return -1;
        if (!e) return dc_fail("%s: shard %s, which %s names, is missing", dir, names[k], iname);
    }
    return 0;
}

// Shards without an index: every one of a single <stem>-i-of-n set.
static int guessed_shards(const char *dir, char **all, int n, bool fp16, char names[][256], int *count) {
    int first = -1, total = 0;
    size_t stem = 0;
    for (int i = 0; i < n; i++) {
        int a, b;
        size_t s = shard_of(all[i], &a, &b);
        if (!s || (strstr(all[i], ".fp16") != NULL) != fp16) continue;
        if (first < 0) {
            first = i, total = b, stem = s;
        } else if (b != total || s != stem || strncmp(all[i], all[first], s)) {
            return dc_fail("%s: shards of two sets (%s and %s) and no index (*.safetensors.index.json) to say "
                           "which to read", dir, all[first], all[i]);
        }
    }
    if (first < 0) return 0;
    if (total > DC_SD_MAX_FILES) return dc_fail("%s: %d shards (at most %d)", dir, total, DC_SD_MAX_FILES);
    for (int k = 1; k <= total; k++) {
        char want[256];
        if (snprintf(want, sizeof want, "%.*s-%05d-of-%05d.safetensors", (int)stem, all[first], k, total) >=
            (int)sizeof want)
            return dc_fail("%s: shard name too long", dir);
        int j = 0;
        while (j < n && strcmp(all[j], want)) j++;
        if (j == n) return dc_fail("%s: shard %s is missing (%d shards)", dir, want, total);
        snprintf(names[(*count)++], 256, "%s", want);
    }
    return 0;
}

int dc_sd_pick_weights(const char *dir, char names[][256], int *count, dc_json_doc *index, char *index_name,
                       size_t cap) {
    *count = 0;
    memset(index, 0, sizeof *index);
    if (cap) index_name[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return dc_fail("%s: cannot list the folder: %s", dir, strerror(errno));
    char *all[256], *pickle = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == '.') continue;
        if (ends_with(e->d_name, ".safetensors") || ends_with(e->d_name, ".json")) all[n++] = strdup(e->d_name);
        else if (!pickle && (ends_with(e->d_name, ".bin") || ends_with(e->d_name, ".ckpt") ||
                             ends_with(e->d_name, ".pt") || ends_with(e->d_name, ".pth")))
            pickle = strdup(e->d_name);
    }
    closedir(d);
    qsort(all, (size_t)n, sizeof *all, cmp_str);
    // In diffusers' order of preference: the one file, the index, then the
    // fp16 variant's file and index; shards without an index; the only file.
    static const char *const order[] = {
        "diffusion_pytorch_model.safetensors", "model.safetensors",
        "diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json",
        "diffusion_pytorch_model.fp16.safetensors", "model.fp16.safetensors",
        "diffusion_pytorch_model.safetensors.index.fp16.json", "model.safetensors.index.fp16.json"};
    int rc = 0;
    for (size_t k = 0; k < sizeof order / sizeof *order && !*count && !rc; k++) {
        int i = 0;
        while (i < n && strcmp(all[i], order[k])) i++;
        if (i == n) continue;
        if (!ends_with(order[k], ".json")) {
            snprintf(names[(*count)++], 256, "%s", order[k]);
            continue;
        }
        char ipath[4400];
        snprintf(ipath, sizeof ipath, "%s/%s", dir, order[k]);
        rc = dc_json_read_file(index, ipath);
        if (!rc && index->root->type != DC_JSON_OBJECT) rc = dc_fail("%s: not a JSON object", ipath);
        if (!rc) rc = index_files(dir, order[k], index->root, names, count);
        if (!rc) snprintf(index_name, cap, "%s", order[k]);
    }
    if (!*count && !rc) rc = guessed_shards(dir, all, n, false, names, count);
    if (!*count && !rc) rc = guessed_shards(dir, all, n, true, names, count);
    int nst = 0, only = -1;
    for (int i = 0; i < n; i++)
        if (ends_with(all[i], ".safetensors")) nst++, only = i;
    if (!*count && !rc && nst == 1) snprintf(names[(*count)++], 256, "%s", all[only]);
    if (!*count && !rc) {
        char pp[4400] = "";
        if (pickle) snprintf(pp, sizeof pp, "%s/%s", dir, pickle);
        if (nst)
            rc = dc_fail("%s: %d *.safetensors files and none of the names diffusers writes "
                         "(diffusion_pytorch_model.safetensors, model.safetensors, or an index): name the file instead",
                         dir, nst);
        else if (!pickle || !dc_sd_refuse_pickle(pp))
            rc = dc_fail("%s: no *.safetensors weights%s%s%s", dir, pickle ? " (" : "", pickle ? pickle : "",
                         pickle ? " is not read: only safetensors are)" : "");
        else
            rc = -1;  // the pickle's message
    }
    for (int i = 0; i < n; i++) free(all[i]);
    free(pickle);
    if (rc) dc_json_free(index), *count = 0;
    return rc;
}

// ---- the tensors of several files ---------------------------------------------------------

typedef struct {
    const char *name;
    int file;
} where;

static int cmp_where(const void *a, const void *b) {
    return strcmp(((const where *)a)->name, ((const where *)b)->name);
}

static const char *base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int dc_sd_check_shards(const dc_st_file *files, int n, const dc_json *weight_map, const char *index_path) {
    size_t total = 0;
    for (int f = 0; f < n; f++) total += (size_t)files[f].count;
    if (n < 2 && !weight_map) return 0;
    where *all = malloc((total + 1) * sizeof *all);
    if (!all) return dc_fail("out of memory");
    size_t k = 0;
    for (int f = 0; f < n; f++)
        for (int i = 0; i < files[f].count; i++) all[k++] = (where){files[f].tensors[i].name, f};
    qsort(all, total, sizeof *all, cmp_where);
    int rc = 0;
    for (size_t i = 1; i < total && !rc; i++)
        if (!strcmp(all[i - 1].name, all[i].name))
            rc = dc_fail("tensor '%.200s' is in two shards, %s and %s: refusing to guess which holds the weights",
                         all[i].name, files[all[i - 1].file].path, files[all[i].file].path);
    for (int i = 0; weight_map && i < weight_map->nkids && !rc; i++) {
        const dc_json *m = &weight_map->kids[i];
        where key = {m->key, 0}, *w = bsearch(&key, all, total, sizeof *all, cmp_where);
        if (!w)
            rc = dc_fail("%s: tensor '%.200s' is in none of the shards (the index says %s)", index_path, m->key, m->str);
        else if (strcmp(base(files[w->file].path), m->str))
            rc = dc_fail("%s: tensor '%.200s' is in %s, but the index says %s", index_path, m->key,
                         base(files[w->file].path), m->str);
    }
    free(all);
    return rc;
}
