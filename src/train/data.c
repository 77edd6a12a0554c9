#include "train/data.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "core/rng.h"
#include "io/safetensors.h"

static const char *const k_fmnist_classes[10] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
};

void dc_dataset_free(dc_dataset *ds) {
    if (!ds) return;
    free(ds->images), free(ds->labels), free(ds->source);
    free(ds->text), free(ds->text_lens), free(ds->text_null);
    memset(ds, 0, sizeof *ds);
}

uint64_t dc_dataset_fingerprint(const dc_dataset *ds) {
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0);
    int64_t dims[5] = {ds->n, ds->channels, ds->height, ds->width, ds->num_classes};
    for (int i = 0; i < 5; i++) dc_xxh64_update_u64(&h, (uint64_t)dims[i]);
    size_t px = (size_t)ds->n * (size_t)ds->channels * (size_t)ds->height * (size_t)ds->width;
    if (ds->images) dc_xxh64_update(&h, ds->images, px * sizeof *ds->images);
    if (ds->labels) dc_xxh64_update(&h, ds->labels, (size_t)ds->n * sizeof *ds->labels);
    if (ds->cond == DC_COND_TEXT) {  // (label data hash as they always have)
        size_t per = (size_t)ds->text_len * (size_t)ds->text_dim;
        dc_xxh64_update_u64(&h, (uint64_t)per);
        dc_xxh64_update(&h, ds->text, (size_t)ds->n * per * sizeof *ds->text);
        dc_xxh64_update(&h, ds->text_lens, (size_t)ds->n * sizeof *ds->text_lens);
        dc_xxh64_update(&h, ds->text_null, per * sizeof *ds->text_null);
        dc_xxh64_update_u64(&h, (uint64_t)ds->text_null_len);
    }
    return dc_xxh64_digest(&h);
}

// What every loader does last: remember where the data came from and its fingerprint.
static int finish_load(dc_dataset *ds, const char *source) {
    if (!(ds->source = strdup(source))) return dc_fail("%s: out of memory", source);
    ds->fingerprint = dc_dataset_fingerprint(ds);
    return 0;
}

// ---- IDX files (LeCun's MNIST format) ---------------------------------------

#define IDX_IMAGES 0x00000803u  // u8 data, 3 dimensions: N, rows, cols
#define IDX_LABELS 0x00000801u  // u8 data, 1 dimension: N

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// Reads want bytes; returns how many arrived, -1 on a zlib error (message set).
static int64_t gz_read_all(gzFile gz, const char *path, uint8_t *dst, size_t want) {
    size_t got = 0;
    while (got < want) {
        size_t chunk = want - got < (1u << 30) ? want - got : (1u << 30);
        int r = gzread(gz, dst + got, (unsigned)chunk);
        if (r < 0) {
            int zerr;
            const char *msg = gzerror(gz, &zerr);
            return dc_fail("%s: %s", path, zerr == Z_ERRNO ? strerror(errno) : msg);
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    // A gzip stream cut short reads as a short count plus Z_BUF_ERROR.
    int zerr;
    const char *msg = gzerror(gz, &zerr);
    if (zerr != Z_OK && zerr != Z_BUF_ERROR) return dc_fail("%s: %s", path, msg);
    return (int64_t)got;
}

// Reads the data of an IDX file (total bytes declared by its header) into a
// new buffer. Memory follows the data, never the header alone: an
// uncompressed file must be exactly header + data long, which its size tells
// before anything is allocated. A gzip stream's length is unknown until it is
// inflated (the trailer holds it mod 2^32, and deflate's 1032:1 ratio would
// still let a 64 MB file claim 64 GB), so its buffer grows by doubling as the
// data arrives: a header that lies costs at most twice the data that comes.
static int read_idx_data(gzFile gz, const char *path, int64_t file_size, size_t hlen, uint64_t total,
                         const char *what, uint32_t count, uint8_t **data) {
    if (gzdirect(gz) && (uint64_t)file_size != hlen + total) {
        if ((uint64_t)file_size < hlen + total)
            return dc_fail("%s: truncated: %lld data bytes where the header declares %u %s (%llu bytes)", path,
                           (long long)file_size - (long long)hlen, count, what, (unsigned long long)total);
        return dc_fail("%s: data continues past the %u %s the header declares", path, count, what);
    }
    size_t cap = gzdirect(gz) || total < (1u << 20) ? (size_t)total : (1u << 20), got = 0;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf) return dc_fail("%s: out of memory for %zu bytes", path, cap);
    while (got < total) {
        if (got == cap) {
            size_t next = (uint64_t)cap * 2 < total ? cap * 2 : (size_t)total;
            uint8_t *p = realloc(buf, next);
            if (!p) return free(buf), dc_fail("%s: out of memory for %zu bytes", path, next);
            buf = p, cap = next;
        }
        int64_t r = gz_read_all(gz, path, buf + got, cap - got);
        if (r < 0) return free(buf), -1;
        got += (size_t)r;
        if (got < cap) break;  // the stream ended
    }
    uint8_t extra;
    int64_t more = 0;
    if (got < total) {
        free(buf);
        return dc_fail("%s: truncated: %zu data bytes where the header declares %u %s (%llu bytes)", path, got,
                       count, what, (unsigned long long)total);
    }
    if ((more = gz_read_all(gz, path, &extra, 1)) != 0) {
        free(buf);
        return more < 0 ? -1 : dc_fail("%s: data continues past the %u %s the header declares", path, count, what);
    }
    *data = buf;
    return 0;
}

// Reads one IDX file: dims[0] = N, then rows and cols for images. The data
// must be exactly what the header declares: no less, no more.
static int read_idx(const char *path, uint32_t magic, uint32_t dims[3], uint8_t **data) {
    *data = NULL;
    int nd = magic == IDX_IMAGES ? 3 : 1;
    int64_t file_size;
    int fd = dc_open_regular(path, &file_size);
    if (fd < 0) return -1;
    errno = 0;
    gzFile gz = gzdopen(fd, "rb");  // reads plain files as they are, too
    if (!gz) {
        close(fd);
        return dc_fail("%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    }
    // The magic first, so a labels file given for images says so.
    uint8_t hdr[16];
    int64_t got = gz_read_all(gz, path, hdr, 4);
    int rc = got < 0 ? -1 : 0;
    if (rc == 0 && got == 4 && be32(hdr) != magic)
        rc = dc_fail("%s: bad IDX magic 0x%08x, expected 0x%08x (%s)", path, be32(hdr), magic,
                     magic == IDX_IMAGES ? "u8 images: N, rows, cols" : "u8 labels: N");
    if (rc == 0 && got == 4) got = gz_read_all(gz, path, hdr + 4, 4 * (size_t)nd);
    if (rc == 0 && got < 0) rc = -1;
    if (rc == 0 && got != 4 * nd)
        rc = dc_fail("%s: truncated: shorter than the %d-byte IDX header", path, 4 + 4 * nd);
    uint64_t total = 1;
    for (int i = 0; i < nd && rc == 0; i++) {
        dims[i] = be32(hdr + 4 + 4 * i);
        if (dims[i] == 0 || dims[i] > (i == 0 ? (uint32_t)INT_MAX : 65535u))
            rc = dc_fail("%s: IDX dimension %d is %u", path, i, dims[i]);
        total *= dims[i];
    }
    if (rc == 0)
        rc = read_idx_data(gz, path, file_size, 4 + 4 * (size_t)nd, total, nd == 3 ? "images" : "labels", dims[0],
                           data);
    gzclose(gz);
    return rc;
}

// ---- shaping images ----------------------------------------------------------

// Places src [n, c, h, w] at the centre of dst [n, c, size, size] filled with -1.
static void pad_images(float *dst, const float *src, int64_t n, int c, int h, int w, int size) {
    int top = (size - h) / 2, left = (size - w) / 2;
    for (int64_t i = 0; i < n * c; i++) {
        float *d = dst + i * size * size;
        const float *s = src + i * h * w;
        for (int k = 0; k < size * size; k++) d[k] = -1.0f;
        for (int y = 0; y < h; y++) memcpy(d + (y + top) * size + left, s + y * w, (size_t)w * sizeof *d);
    }
}

// Pads ds->images in place to pad_to x pad_to when asked (0 or the same size: no-op).
static int pad_dataset(dc_dataset *ds, int pad_to, const char *src) {
    if (pad_to <= 0 || (pad_to == ds->height && pad_to == ds->width)) return 0;
    if (pad_to < ds->height || pad_to < ds->width)
        return dc_fail("%s: images are %dx%d, larger than the requested size %d", src, ds->height, ds->width,
                       pad_to);
    size_t per = (size_t)ds->channels * (size_t)pad_to * (size_t)pad_to;
    float *p = malloc((size_t)ds->n * per * sizeof *p);
    if (!p) return dc_fail("%s: out of memory padding %d images to %d", src, ds->n, pad_to);
    pad_images(p, ds->images, ds->n, ds->channels, ds->height, ds->width, pad_to);
    free(ds->images);
    ds->images = p, ds->height = pad_to, ds->width = pad_to;
    return 0;
}

// Bytes 0..255 to [-1, 1]: 0 -> -1, 255 -> 1 exactly.
static void u8_to_unit(float *dst, const uint8_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i] / 127.5f - 1.0f;
}

// ---- Fashion-MNIST -------------------------------------------------------------

// "<dir>/<base>.gz" if present, else "<dir>/<base>" (an unpacked copy).
static void idx_path(char *out, size_t n, const char *dir, const char *base) {
    struct stat st;
    snprintf(out, n, "%s/%s.gz", dir, base);
    if (stat(out, &st) != 0) snprintf(out, n, "%s/%s", dir, base);
}

int dc_dataset_load_fmnist(dc_dataset *ds, const char *dir, bool train, int pad_to) {
    memset(ds, 0, sizeof *ds);
    const char *split = train ? "train" : "t10k";
    char ipath[4096], lpath[4096], base[64];
    snprintf(base, sizeof base, "%s-images-idx3-ubyte", split);
    idx_path(ipath, sizeof ipath, dir, base);
    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", split);
    idx_path(lpath, sizeof lpath, dir, base);
    uint32_t idims[3], ldims[3];
    uint8_t *px = NULL, *lb = NULL;
    int rc = read_idx(ipath, IDX_IMAGES, idims, &px);
    if (rc == 0) rc = read_idx(lpath, IDX_LABELS, ldims, &lb);
    if (rc == 0 && idims[0] != ldims[0])
        rc = dc_fail("%s holds %u images but %s holds %u labels (the counts must be equal)", ipath, idims[0],
                     lpath, ldims[0]);
    for (uint32_t i = 0; rc == 0 && i < ldims[0]; i++)
        if (lb[i] >= 10) rc = dc_fail("%s: label %u of sample %u is not a class 0..9", lpath, lb[i], i);
    if (rc == 0) {
        ds->n = (int)idims[0], ds->channels = 1, ds->height = (int)idims[1], ds->width = (int)idims[2];
        ds->num_classes = 10, ds->class_names = k_fmnist_classes;
        size_t np = (size_t)ds->n * (size_t)ds->height * (size_t)ds->width;
        ds->images = malloc(np * sizeof *ds->images);
        ds->labels = malloc((size_t)ds->n * sizeof *ds->labels);
        if (!ds->images || !ds->labels) rc = dc_fail("%s: out of memory for %d images", ipath, ds->n);
        if (rc == 0) {
            u8_to_unit(ds->images, px, np);
            for (int i = 0; i < ds->n; i++) ds->labels[i] = lb[i];
            rc = pad_dataset(ds, pad_to, ipath);
        }
        if (rc == 0) rc = finish_load(ds, dir);
    }
    free(px), free(lb);
    if (rc != 0) dc_dataset_free(ds);
    return rc;
}

// ---- a user's safetensors file -----------------------------------------------

// Copies the labels into ds and settles the class count (rules in data.h).
static int check_labels(dc_dataset *ds, const dc_st_file *f, const int64_t *l64) {
    const char *p = f->path;
    int64_t maxl = -1;
    int at_max = 0;
    for (int i = 0; i < ds->n; i++) {
        if (l64[i] < 0) return dc_fail("%s: label %lld of sample %d is not a class index", p, (long long)l64[i], i);
        if (l64[i] >= DC_DATA_MAX_CLASSES)
            return dc_fail("%s: label %lld of sample %d is beyond the %d classes a model may have", p,
                           (long long)l64[i], i, DC_DATA_MAX_CLASSES);
        if (l64[i] > maxl) maxl = l64[i], at_max = i;
        ds->labels[i] = (int32_t)l64[i];
    }
    const char *nc = dc_st_meta(f, "num_classes");
    if (nc) {
        char *end;
        errno = 0;
        long v = strtol(nc, &end, 10);
        if (errno || end == nc || *end || v < 1 || v > DC_DATA_MAX_CLASSES)
            return dc_fail("%s: __metadata__ num_classes '%s' is not an integer in 1..%d", p, nc, DC_DATA_MAX_CLASSES);
        if (v <= maxl)
            return dc_fail("%s: label %lld of sample %d is not below num_classes %ld", p, (long long)maxl, at_max, v);
        ds->num_classes = (int)v;
        return 0;
    }
    ds->num_classes = (int)(maxl + 1);
    if (ds->num_classes <= DC_DATA_SPARSE_CLASSES) return 0;
    uint8_t *seen = calloc((size_t)ds->num_classes, 1);
    if (!seen) return dc_fail("%s: out of memory", p);
    int used = 0;
    for (int i = 0; i < ds->n; i++) used += !seen[ds->labels[i]], seen[ds->labels[i]] = 1;
    free(seen);
    if ((int64_t)used * 2 < ds->num_classes)
        return dc_fail("%s: label %lld of sample %d makes %d classes, but only %d of them have any sample; "
                       "set __metadata__ num_classes if that is intended", p, (long long)maxl, at_max,
                       ds->num_classes, used);
    return 0;
}

// U8 images in 0..255 as floats in [-1, 1].
static int read_u8_images(const dc_st_file *f, const dc_st_tensor *im, float *out) {
    uint8_t *px = malloc((size_t)im->numel + 1);
    if (!px) return dc_fail("%s: out of memory for tensor 'images'", f->path);
    int rc = dc_st_read_raw(f, im, px);
    if (rc == 0) u8_to_unit(out, px, (size_t)im->numel);
    free(px);
    return rc;
}

static int load_st(dc_dataset *ds, const dc_st_file *f) {
    const char *p = f->path;
    const dc_st_tensor *im = dc_st_find(f, "images"), *lb = dc_st_find(f, "labels");
    if (!im || !lb) return dc_fail("%s: no tensor '%s' (a data set holds 'images' [N, C, H, W] and 'labels' [N])", p,
                                   im ? "labels" : "images");
    if (im->ndim != 4) return dc_fail("%s: tensor 'images' has rank %d, expected 4 (N, C, H, W)", p, im->ndim);
    if (lb->ndim != 1) return dc_fail("%s: tensor 'labels' has rank %d, expected 1 (N)", p, lb->ndim);
    for (int d = 0; d < 4; d++)
        if (im->shape[d] < 1 || im->shape[d] > INT_MAX)
            return dc_fail("%s: tensor 'images' dimension %d is %lld", p, d, (long long)im->shape[d]);
    if (lb->shape[0] != im->shape[0])
        return dc_fail("%s: %lld images but %lld labels (the counts must be equal)", p, (long long)im->shape[0],
                       (long long)lb->shape[0]);
    ds->n = (int)im->shape[0], ds->channels = (int)im->shape[1];
    ds->height = (int)im->shape[2], ds->width = (int)im->shape[3];
    size_t numel = (size_t)im->numel;
    ds->images = malloc(numel * sizeof *ds->images);
    int64_t *l64 = malloc((size_t)ds->n * sizeof *l64);
    ds->labels = malloc((size_t)ds->n * sizeof *ds->labels);
    int rc = 0;
    if (!ds->images || !l64 || !ds->labels) rc = dc_fail("%s: out of memory for %d images", p, ds->n);
    else if (im->dtype == DC_U8) rc = read_u8_images(f, im, ds->images);
    else if (dc_st_read_f32(f, im, ds->images) != 0) rc = -1;
    else
        for (size_t i = 0; i < numel && rc == 0; i++)
            if (!(fabsf(ds->images[i]) <= 1.0f))  // NaN fails too
                rc = dc_fail("%s: tensor 'images' element %zu is %g, outside [-1, 1] (store U8 0..255 or floats in "
                             "[-1, 1])", p, i, ds->images[i]);
    if (rc == 0) rc = dc_st_read_i64(f, lb, l64);
    if (rc == 0) rc = check_labels(ds, f, l64);
    free(l64);
    return rc;
}

int dc_dataset_load_safetensors(dc_dataset *ds, const char *path, int pad_to) {
    memset(ds, 0, sizeof *ds);
    dc_st_file f;
    DC_TRY(dc_st_open(&f, path));
    int rc = load_st(ds, &f);
    if (rc == 0) rc = pad_dataset(ds, pad_to, path);
    if (rc == 0) rc = finish_load(ds, path);
    dc_st_close(&f);
    if (rc != 0) dc_dataset_free(ds);
    return rc;
}

int dc_dataset_load(dc_dataset *ds, const char *path_or_dir, int pad_to) {
    memset(ds, 0, sizeof *ds);
    struct stat st;
    if (stat(path_or_dir, &st) != 0) return dc_fail("%s: %s", path_or_dir, strerror(errno));
    if (S_ISDIR(st.st_mode)) return dc_dataset_load_fmnist(ds, path_or_dir, true, pad_to);
    if (!S_ISREG(st.st_mode))
        return dc_fail("%s is %s, not a data set file or folder", path_or_dir, dc_file_kind(st.st_mode));
    size_t n = strlen(path_or_dir), k = strlen(".safetensors");
    if (n >= k && strcmp(path_or_dir + n - k, ".safetensors") == 0)
        return dc_dataset_load_safetensors(ds, path_or_dir, pad_to);
    return dc_fail("%s: not a directory of Fashion-MNIST IDX files nor a .safetensors file", path_or_dir);
}

void dc_dataset_get(const dc_dataset *ds, int64_t idx, float *img_out, bool hflip) {
    int h = ds->height, w = ds->width;
    size_t per = (size_t)ds->channels * (size_t)h * (size_t)w;
    const float *src = ds->images + (size_t)idx * per;
    if (!hflip) {
        memcpy(img_out, src, per * sizeof *img_out);
        return;
    }
    dc_mirror_rows(img_out, src, (int64_t)ds->channels * h, w);
}

void dc_mirror_rows(float *dst, const float *src, int64_t rows, int w) {
    for (int64_t r = 0; r < rows; r++)
        for (int x = 0; x < w; x++) dst[r * w + x] = src[r * w + (w - 1 - x)];
}

// ---- order -------------------------------------------------------------------

// Uniform integer in [0, bound) from the Philox words of (seed, i, epoch):
// Lemire's multiply-and-reject, exact for any bound (draws again when needed).
static uint32_t draw_below(uint64_t seed, uint32_t i, uint32_t epoch, uint32_t bound) {
    uint32_t attempt = 0;
    uint64_t m = (uint64_t)dc_rand_u32_at(seed, i, epoch, DC_STREAM_SHUFFLE, attempt++) * bound;
    if ((uint32_t)m < bound) {
        uint32_t t = (uint32_t)(-bound) % bound;
        while ((uint32_t)m < t) m = (uint64_t)dc_rand_u32_at(seed, i, epoch, DC_STREAM_SHUFFLE, attempt++) * bound;
    }
    return (uint32_t)(m >> 32);
}

// Each swap draws from its own Philox counter (position i, epoch), so the
// permutation is a pure function of (n, seed, epoch). Epochs wrap at 2^32.
static void build_perm(int64_t *perm, int64_t n, uint64_t seed, uint64_t epoch) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = draw_below(seed, (uint32_t)i, (uint32_t)epoch, (uint32_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
}

int dc_order_init(dc_order *o, int64_t n, uint64_t seed) {
    memset(o, 0, sizeof *o);
    if (n < 1 || n > INT32_MAX) return dc_fail("data order: %lld samples (need 1..2^31-1)", (long long)n);
    o->perm = malloc((size_t)n * sizeof *o->perm);
    if (!o->perm) return dc_fail("data order: out of memory for %lld samples", (long long)n);
    o->n = n, o->seed = seed;
    return 0;
}

int64_t dc_order_get(dc_order *o, uint64_t epoch, int64_t i) {
    if (!o->perm || i < 0 || i >= o->n) return -1;
    if (!o->valid || o->epoch != epoch) {
        build_perm(o->perm, o->n, o->seed, epoch);
        o->epoch = epoch, o->valid = true;
    }
    return o->perm[i];
}

void dc_order_free(dc_order *o) {
    if (!o) return;
    free(o->perm);
    memset(o, 0, sizeof *o);
}
