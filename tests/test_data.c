// Data loading and order: the real Fashion-MNIST (when the Debian package is
// installed) against values read independently with Python's gzip module,
// rejection of corrupt IDX files (and of lying headers, within a memory cap),
// user data sets in safetensors, class-count rules, fingerprints, inputs that
// are not files, the shuffle's determinism and uniformity, and PNG output read
// back through libpng.
#include <math.h>
#include <png.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "io/png.h"
#include "io/safetensors.h"
#include "train/data.h"

#include "check.h"
#include "tmpdir.h"

static int to_byte(float v) { return (int)lrintf((v + 1.0f) * 127.5f); }

// ---- the real Fashion-MNIST ----------------------------------------------------

static void test_fmnist(void) {
    struct stat st;
    char probe[256];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", DC_FMNIST_DIR);
    if (stat(probe, &st) != 0) {
        CHECK(0, "%s: not installed (dataset-fashion-mnist; tools/deps.sh installs it)", DC_FMNIST_DIR);
        return;
    }
    dc_dataset ds;
    CHECK(dc_dataset_load_fmnist(&ds, DC_FMNIST_DIR, true, 32) == 0, "load train: %s", dc_error());
    CHECK(ds.n == 60000 && ds.channels == 1 && ds.height == 32 && ds.width == 32 && ds.num_classes == 10,
          "train shape %d %d %d %d %d", ds.n, ds.channels, ds.height, ds.width, ds.num_classes);
    CHECK(ds.class_names && strcmp(ds.class_names[9], "Ankle boot") == 0, "class names");
    if (ds.n == 60000) {
        int hist[10] = {0}, bad_label = 0, bad_border = 0, bad_value = 0;
        double sum = 0;  // of the original bytes
        for (int i = 0; i < ds.n; i++) {
            if (ds.labels[i] < 0 || ds.labels[i] > 9) bad_label++;
            else hist[ds.labels[i]]++;
            const float *im = ds.images + (size_t)i * 1024;
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++) {
                    float v = im[y * 32 + x];
                    bool border = y < 2 || y >= 30 || x < 2 || x >= 30;
                    if (border && v != -1.0f) bad_border++;
                    if (!(v >= -1.0f && v <= 1.0f) || fabsf((v + 1) * 127.5f - (float)to_byte(v)) > 1e-3f)
                        bad_value++;
                    sum += to_byte(v);
                }
        }
        bool even = true;
        for (int k = 0; k < 10; k++) even &= hist[k] == 6000;
        CHECK(bad_label == 0 && even, "6000 labels per class in train");
        CHECK(bad_border == 0, "2 px of background padding");
        CHECK(bad_value == 0, "values are bytes mapped onto [-1, 1]");
        // Reference values from Python: gzip.open(...).read(), first label,
        // byte at (14, 14) of the first image, sum of every pixel byte.
        CHECK(ds.labels[0] == 9 && ds.labels[3] == 3, "first labels %d %d", ds.labels[0], ds.labels[3]);
        CHECK(to_byte(ds.images[(14 + 2) * 32 + 14 + 2]) == 217, "pixel (14,14) of image 0");
        CHECK(sum == 3431114169.0, "pixel sum %.0f", sum);

        // Order over the real set: a permutation, fixed by (seed, epoch).
        dc_order a, b;
        CHECK(dc_order_init(&a, ds.n, 1234) == 0 && dc_order_init(&b, ds.n, 1234) == 0, "order init");
        char *seen = calloc((size_t)ds.n, 1);
        int dup = 0, same_b = 0, same_next = 0;
        for (int i = 0; i < ds.n; i++) {
            int64_t k = dc_order_get(&a, 0, i);
            if (k < 0 || k >= ds.n || seen[k]++) dup++;
            same_b += dc_order_get(&b, 0, i) == k;
        }
        for (int i = 0; i < ds.n; i++) same_next += dc_order_get(&a, 1, i) == dc_order_get(&b, 0, i);
        CHECK(dup == 0, "epoch order is a permutation (%d repeats)", dup);
        CHECK(same_b == ds.n, "order is deterministic in (seed, epoch)");
        // A fresh permutation keeps about one fixed point; equal ones keep all.
        CHECK(same_next < 20, "epochs 0 and 1 share %d positions", same_next);
        CHECK(dc_order_get(&a, 0, 0) == dc_order_get(&b, 0, 0) && dc_order_get(&a, 0, ds.n) == -1,
              "back to epoch 0; out of range");
        free(seen);
        dc_order_free(&a), dc_order_free(&b);
    }
    dc_dataset_free(&ds);

    CHECK(dc_dataset_load_fmnist(&ds, DC_FMNIST_DIR, false, 0) == 0, "load t10k: %s", dc_error());
    CHECK(ds.n == 10000 && ds.height == 28 && ds.width == 28, "t10k shape");
    if (ds.n == 10000) {
        int hist[10] = {0};
        for (int i = 0; i < ds.n; i++) hist[ds.labels[i]]++;
        CHECK(hist[0] == 1000 && hist[9] == 1000, "1000 per class in t10k");
        CHECK(ds.labels[0] == 9 && ds.labels[1] == 2 && to_byte(ds.images[14 * 28 + 14]) == 110, "t10k values");
    }
    dc_dataset_free(&ds);
    CHECK(dc_dataset_load(&ds, DC_FMNIST_DIR, 32) == 0 && ds.n == 60000, "dc_dataset_load on a directory");
    dc_dataset_free(&ds);
}

// ---- crafted IDX files ---------------------------------------------------------

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// An IDX file of `n` items with payload bytes p(i) = i * 37 mod 256 (labels: i mod 10).
static void write_idx(const char *dir, const char *name, uint32_t magic, uint32_t n, uint32_t rows,
                      uint32_t cols, long data_delta, bool gz) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, gz ? ".gz" : "");
    bool img = magic != 0x801;
    uint8_t hdr[16];
    put_be32(hdr, magic), put_be32(hdr + 4, n), put_be32(hdr + 8, rows), put_be32(hdr + 12, cols);
    size_t hlen = img ? 16 : 8, len = (size_t)((long)(img ? n * rows * cols : n) + data_delta);
    uint8_t *d = malloc(len + 1);
    for (size_t i = 0; i < len; i++) d[i] = img ? (uint8_t)(i * 37) : (uint8_t)(i % 10);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        gzwrite(f, hdr, (unsigned)hlen), gzwrite(f, d, (unsigned)len), gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(hdr, 1, hlen, f), fwrite(d, 1, len, f), fclose(f);
    }
    free(d);
}

static const char *make_dir(const char *name) {
    const char *d = tmp_path(name);
    mkdir(d, 0777);
    return d;
}

static void expect_idx_fail(const char *dir, const char *why) {
    dc_dataset ds;
    int rc = dc_dataset_load_fmnist(&ds, dir, true, 0);
    CHECK(rc != 0 && strstr(dc_error(), why) && strstr(dc_error(), dir) && !ds.images,
          "%s: rc %d, message '%s', want '%s'", dir, rc, rc ? dc_error() : "", why);
}

static void test_idx(void) {
    // A valid tiny set, gzipped images and plain labels.
    const char *d = make_dir("ok");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 5, 4, 3, 0, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, false);
    dc_dataset ds;
    CHECK(dc_dataset_load_fmnist(&ds, d, true, 8) == 0, "tiny set: %s", dc_error());
    CHECK(ds.n == 5 && ds.height == 8 && ds.width == 8 && ds.labels[4] == 4, "tiny shape");
    if (ds.n == 5) {
        // Image 1, byte (r, c) = (12 + r*3 + c) * 37 mod 256, placed at (2 + r, 2 + c).
        int bad = 0;
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 8; c++) {
                float v = ds.images[64 + r * 8 + c];
                bool in = r >= 2 && r < 6 && c >= 2 && c < 5;
                float want = in ? (float)((12 + (r - 2) * 3 + (c - 2)) * 37 % 256) / 127.5f - 1 : -1.0f;
                bad += fabsf(v - want) > 1e-6f;
            }
        CHECK(bad == 0, "tiny pixels and padding (%d wrong)", bad);
        float img[64], flip[64];
        dc_dataset_get(&ds, 1, img, false);
        dc_dataset_get(&ds, 1, flip, true);
        int fl = 0;
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 8; c++) fl += img[r * 8 + c] != flip[r * 8 + 7 - c];
        CHECK(memcmp(img, ds.images + 64, sizeof img) == 0 && fl == 0, "get and hflip");
    }
    dc_dataset_free(&ds);
    CHECK(dc_dataset_load_fmnist(&ds, d, true, 3) != 0 && strstr(dc_error(), "larger than"), "pad too small");

    d = make_dir("magic");
    write_idx(d, "train-images-idx3-ubyte", 0x804, 5, 4, 3, 0, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, true);
    expect_idx_fail(d, "bad IDX magic 0x00000804");
    d = make_dir("swapped");
    write_idx(d, "train-images-idx3-ubyte", 0x801, 5, 0, 0, 0, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, true);
    expect_idx_fail(d, "bad IDX magic 0x00000801");
    d = make_dir("truncated");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 5, 4, 3, -12, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, true);
    expect_idx_fail(d, "truncated");
    d = make_dir("trailing");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 5, 4, 3, 0, false);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 2, false);
    expect_idx_fail(d, "data continues past the 5 labels");
    d = make_dir("counts");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 5, 4, 3, 0, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 4, 0, 0, 0, true);
    expect_idx_fail(d, "holds 5 images but");
    d = make_dir("label");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 5, 4, 3, 0, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, false);
    FILE *f = fopen(tmp_path("label/train-labels-idx1-ubyte"), "r+b");
    fseek(f, 8 + 3, SEEK_SET), fputc(10, f), fclose(f);
    expect_idx_fail(d, "label 10 of sample 3");
    d = make_dir("header");
    f = fopen(tmp_path("header/train-images-idx3-ubyte"), "wb");
    fwrite("\0\0\x08\x03\0\0", 1, 6, f), fclose(f);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, false);
    expect_idx_fail(d, "shorter than the 16-byte IDX header");
    d = make_dir("corruptgz");  // a gzip header, then garbage where the deflate stream should be
    f = fopen(tmp_path("corruptgz/train-images-idx3-ubyte.gz"), "wb");
    fwrite("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xff\xff\xff\xff\xff\xff\xff\xff", 1, 18, f), fclose(f);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, false);
    dc_dataset_load_fmnist(&ds, d, true, 0);
    CHECK(dc_dataset_load_fmnist(&ds, d, true, 0) != 0 && strstr(dc_error(), "corruptgz"), "corrupt gzip: %s",
          dc_error());
    CHECK(dc_dataset_load_fmnist(&ds, tmp_path("nowhere"), true, 0) != 0 && strstr(dc_error(), "nowhere"),
          "missing dir");
    CHECK(dc_dataset_load(&ds, tmp_path("nowhere"), 0) != 0 && strstr(dc_error(), "nowhere"), "load missing");
}

// ---- user data sets in safetensors ------------------------------------------------

static void test_user_data(void) {
    uint8_t px[2 * 3 * 2 * 2];
    for (int i = 0; i < 24; i++) px[i] = (uint8_t)(i * 11);
    int64_t lab[2] = {1, 4};
    float fl[24];
    for (int i = 0; i < 24; i++) fl[i] = (float)i / 12.0f - 1.0f;
    int16_t lab16[2] = {0, 2};
    dc_st_entry e[] = {{"images", DC_U8, 4, {2, 3, 2, 2}, px}, {"labels", DC_I64, 1, {2}, lab}};
    const char *p = tmp_path("mine.safetensors");
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0, "write");
    dc_dataset ds;
    CHECK(dc_dataset_load(&ds, p, 4) == 0, "load user data: %s", dc_error());
    CHECK(ds.n == 2 && ds.channels == 3 && ds.height == 4 && ds.num_classes == 5 && ds.labels[1] == 4,
          "user shape");
    // Sample 1, channel 2, pixel (1, 0) is byte 12 + 8 + 2 = 22 -> 242, at (2, 1) after padding.
    CHECK(ds.images && ds.images[16 * 5 + 2 * 4 + 1] == 242 / 127.5f - 1 && ds.images[16 * 5] == -1, "user pixels");
    dc_dataset_free(&ds);

    const char *mk[] = {"num_classes"}, *mv[] = {"10"}, *bad_mv[] = {"3"};
    dc_st_entry ef[] = {{"images", DC_F32, 4, {2, 3, 2, 2}, fl}, {"labels", DC_I16, 1, {2}, lab16}};
    CHECK(dc_st_write(p, ef, 2, mk, mv, 1) == 0 && dc_dataset_load_safetensors(&ds, p, 0) == 0, "float user data");
    CHECK(ds.num_classes == 10 && ds.images && ds.images[23] == fl[23] && ds.labels[1] == 2, "float values");
    dc_dataset_free(&ds);
    CHECK(dc_st_write(p, e, 2, mk, bad_mv, 1) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "not below num_classes 3"), "num_classes too small: %s", dc_error());
    fl[5] = 1.5f;
    CHECK(dc_st_write(p, ef, 2, NULL, NULL, 0) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "element 5 is 1.5, outside [-1, 1]"), "range: %s", dc_error());
    lab[0] = -1;
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "label -1 of sample 0"), "negative label: %s", dc_error());
    dc_st_entry short_lab[] = {{"images", DC_U8, 4, {2, 3, 2, 2}, px}, {"labels", DC_I64, 1, {1}, lab}};
    CHECK(dc_st_write(p, short_lab, 2, NULL, NULL, 0) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "2 images but 1 labels"), "count mismatch: %s", dc_error());
    dc_st_entry no_lab[] = {{"images", DC_U8, 4, {2, 3, 2, 2}, px}};
    CHECK(dc_st_write(p, no_lab, 1, NULL, NULL, 0) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "no tensor 'labels'"), "missing labels: %s", dc_error());
    dc_st_entry fl_lab[] = {{"images", DC_U8, 4, {2, 3, 2, 2}, px}, {"labels", DC_F32, 1, {2}, fl}};
    CHECK(dc_st_write(p, fl_lab, 2, NULL, NULL, 0) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "'labels' is F32, not an integer type"), "float labels: %s", dc_error());
    dc_st_entry rank3[] = {{"images", DC_U8, 3, {2, 12, 1}, px}, {"labels", DC_I64, 1, {2}, lab}};
    CHECK(dc_st_write(p, rank3, 2, NULL, NULL, 0) == 0 && dc_dataset_load_safetensors(&ds, p, 0) != 0 &&
          strstr(dc_error(), "rank 3"), "rank: %s", dc_error());
    CHECK(dc_dataset_load(&ds, tmp_path("ok/train-labels-idx1-ubyte"), 0) != 0 &&
          strstr(dc_error(), "nor a .safetensors file"), "other file: %s", dc_error());
}

// ---- what a file may ask for ----------------------------------------------------

// Loads dir in a child whose address space is capped 256 MB above what it
// uses now: a loader that trusted a lying header would ask for 1 GiB and fail
// for memory; one whose memory follows the data reports the truncation.
static void expect_truncated_in_bounded_memory(const char *dir) {
#if defined(__SANITIZE_ADDRESS__)
    printf("  the memory cap of %s: not checked under AddressSanitizer (its shadow memory is not capped)\n", dir);
    return;
#endif
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%ld", &pages) != 1) _exit(2);
        fclose(f);
        rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (256u << 20);
        struct rlimit rl = {cap, cap};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
        dc_dataset ds;
        int rc = dc_dataset_load_fmnist(&ds, dir, true, 0);
        if (rc != 0 && strstr(dc_error(), "truncated")) _exit(0);
        printf("  %s: %s\n", dir, rc ? dc_error() : "loaded");
        fflush(stdout);
        _exit(1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: a header claiming 1 GiB over 1000 bytes of data",
          dir);
}

static void test_lying_headers(void) {
    // 16384 images of 256 x 256 = 1 GiB declared, 1000 bytes present
    long missing = -((1l << 30) - 1000);
    const char *d = make_dir("lying_gz");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 16384, 256, 256, missing, true);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 16384, 0, 0, 0, true);
    expect_truncated_in_bounded_memory(d);
    d = make_dir("lying_raw");
    write_idx(d, "train-images-idx3-ubyte", 0x803, 16384, 256, 256, missing, false);
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 16384, 0, 0, 0, false);
    expect_truncated_in_bounded_memory(d);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL a loader blocked on a FIFO\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

static void test_not_files(void) {
    signal(SIGALRM, on_alarm);
    alarm(10);
    dc_dataset ds;
    const char *p = tmp_path("fifo.safetensors");
    CHECK(mkfifo(p, 0600) == 0, "mkfifo");
    CHECK(dc_dataset_load(&ds, p, 0) != 0 && strstr(dc_error(), "is a FIFO, not a data set file or folder"),
          "FIFO as --data: %s", dc_error());
    CHECK(dc_dataset_load_safetensors(&ds, p, 0) != 0 && strstr(dc_error(), "is a FIFO, not a regular file"),
          "FIFO as a safetensors data set: %s", dc_error());
    const char *d = make_dir("fifo_idx");
    char path[512];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", d);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    write_idx(d, "train-labels-idx1-ubyte", 0x801, 5, 0, 0, 0, false);
    expect_idx_fail(d, "is a FIFO, not a regular file");
    alarm(0);
}

// ---- classes and fingerprints ---------------------------------------------------

static void test_classes(void) {
    uint8_t px[3 * 4] = {0};
    int64_t lab[3] = {0, 1, 999999};
    dc_st_entry e[] = {{"images", DC_U8, 4, {3, 1, 2, 2}, px}, {"labels", DC_I64, 1, {3}, lab}};
    const char *p = tmp_path("classes.safetensors");
    const char *mk[] = {"num_classes"}, *mv[] = {"1000000"}, *big[] = {"2000000"};
    dc_dataset ds;
    // one stray label would make a million-class model
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0 && dc_dataset_load(&ds, p, 0) != 0 && strstr(dc_error(), p) &&
              strstr(dc_error(), "label 999999 of sample 2 makes 1000000 classes, but only 3 of them have any "
                                 "sample; set __metadata__ num_classes"),
          "stray label: %s", dc_error());
    CHECK(dc_st_write(p, e, 2, mk, mv, 1) == 0 && dc_dataset_load(&ds, p, 0) == 0 && ds.num_classes == 1000000,
          "a million classes when the metadata says so: %s", dc_error());
    dc_dataset_free(&ds);
    CHECK(dc_st_write(p, e, 2, mk, big, 1) == 0 && dc_dataset_load(&ds, p, 0) != 0 &&
              strstr(dc_error(), "num_classes '2000000' is not an integer in 1..1000000"),
          "num_classes over the limit: %s", dc_error());
    lab[2] = 2000000000;
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0 && dc_dataset_load(&ds, p, 0) != 0 && strstr(dc_error(), p) &&
              strstr(dc_error(), "label 2000000000 of sample 2 is beyond the 1000000 classes"),
          "huge label: %s", dc_error());
    lab[2] = 1500;  // 1501 classes, 3 used
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0 && dc_dataset_load(&ds, p, 0) != 0 &&
              strstr(dc_error(), "makes 1501 classes"), "sparse past 1000: %s", dc_error());
    lab[2] = 999;  // up to 1000 classes, unused ones are fine
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0 && dc_dataset_load(&ds, p, 0) == 0 && ds.num_classes == 1000,
          "1000 classes, 3 used: %s", dc_error());
    dc_dataset_free(&ds);
}

static void test_fingerprint(void) {
    uint8_t px[2 * 4];
    for (int i = 0; i < 8; i++) px[i] = (uint8_t)(i * 30);
    int64_t lab[2] = {0, 1};
    dc_st_entry e[] = {{"images", DC_U8, 4, {2, 1, 2, 2}, px}, {"labels", DC_I64, 1, {2}, lab}};
    const char *p = tmp_path("fp.safetensors");
    dc_dataset ds;
    uint64_t fp[5];
    CHECK(dc_st_write(p, e, 2, NULL, NULL, 0) == 0 && dc_dataset_load(&ds, p, 0) == 0, "load: %s", dc_error());
    fp[0] = ds.fingerprint;
    CHECK(fp[0] != 0 && fp[0] == dc_dataset_fingerprint(&ds) && ds.source && strcmp(ds.source, p) == 0,
          "fingerprint and source set");
    dc_dataset_free(&ds);
    CHECK(dc_dataset_load(&ds, p, 0) == 0 && ds.fingerprint == fp[0], "the same data, the same fingerprint");
    dc_dataset_free(&ds);
    dc_dataset_load(&ds, p, 4), fp[1] = ds.fingerprint, dc_dataset_free(&ds);  // padded: other images
    px[3] ^= 1;
    dc_st_write(p, e, 2, NULL, NULL, 0), dc_dataset_load(&ds, p, 0), fp[2] = ds.fingerprint, dc_dataset_free(&ds);
    px[3] ^= 1, lab[1] = 2;
    dc_st_write(p, e, 2, NULL, NULL, 0), dc_dataset_load(&ds, p, 0), fp[3] = ds.fingerprint, dc_dataset_free(&ds);
    const char *mk[] = {"num_classes"}, *mv[] = {"7"};
    dc_st_write(p, e, 2, mk, mv, 1), dc_dataset_load(&ds, p, 0), fp[4] = ds.fingerprint, dc_dataset_free(&ds);
    int same = 0;
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++) same += fp[i] == fp[j];
    CHECK(same == 0, "padding, one pixel, one label and the class count each change the fingerprint");
}

// ---- order -------------------------------------------------------------------------

static void test_order_uniform(void) {
    // All 6 orders of 3 items over 60000 epochs: each expected 10000 times;
    // chi-square with 5 degrees of freedom stays below 20.5 with p = 0.999.
    dc_order o;
    dc_order_init(&o, 3, 99);
    int count[27] = {0};
    for (uint64_t e = 0; e < 60000; e++)
        count[dc_order_get(&o, e, 0) * 9 + dc_order_get(&o, e, 1) * 3 + dc_order_get(&o, e, 2)]++;
    double chi = 0;
    int kinds = 0;
    for (int k = 0; k < 27; k++)
        if (count[k]) kinds++, chi += (count[k] - 10000.0) * (count[k] - 10000.0) / 10000.0;
    CHECK(kinds == 6 && chi < 20.5, "shuffle uniformity: %d orders, chi-square %.2f", kinds, chi);
    dc_order_free(&o);
    dc_order o2;
    dc_order_init(&o, 1000, 1), dc_order_init(&o2, 1000, 2);
    int same = 0;
    for (int i = 0; i < 1000; i++) same += dc_order_get(&o, 0, i) == dc_order_get(&o2, 0, i);
    CHECK(same < 10, "seeds 1 and 2 share %d positions", same);
    dc_order_free(&o), dc_order_free(&o2);
    CHECK(dc_order_init(&o, 0, 1) != 0 && dc_order_get(&o, 0, 0) == -1, "empty order refused");
}

// ---- PNG ---------------------------------------------------------------------------

// Reads a PNG with libpng's simplified API in its own format; returns pixels or NULL.
static uint8_t *read_png(const char *path, int *w, int *h, int *c) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) return NULL;
    *c = im.format & PNG_FORMAT_FLAG_COLOR ? 3 : 1;
    im.format = *c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    *w = (int)im.width, *h = (int)im.height;
    uint8_t *px = malloc(PNG_IMAGE_SIZE(im));
    if (!png_image_finish_read(&im, NULL, px, 0, NULL)) return free(px), NULL;
    return px;
}

static void test_png(void) {
    uint8_t rgb[2 * 3 * 3];
    for (int i = 0; i < 18; i++) rgb[i] = (uint8_t)(i * 14 + 3);
    const char *p = tmp_path("rgb.png");
    int w, h, c;
    CHECK(dc_png_write(p, rgb, 3, 2, 3) == 0, "write rgb: %s", dc_error());
    uint8_t *back = read_png(p, &w, &h, &c);
    CHECK(back && w == 3 && h == 2 && c == 3 && memcmp(back, rgb, 18) == 0, "rgb round trip");
    free(back);

    // Float conversion: -1 -> 0, 1 -> 255, 0 -> 127.5 + 0.5 = 128, clamps, NaN -> 0.
    float img[6] = {-1, 1, 0, -3, 7, NAN};
    p = tmp_path("gray.png");
    CHECK(dc_png_write_image(p, img, 1, 2, 3) == 0, "write float gray");
    back = read_png(p, &w, &h, &c);
    uint8_t want[6] = {0, 255, 128, 0, 255, 0};
    CHECK(back && w == 3 && h == 2 && c == 1 && memcmp(back, want, 6) == 0, "float gray round trip");
    free(back);
    CHECK(dc_pixel_u8(0.5f) == 191 && dc_pixel_u8(-0.996f) == 1, "rounding (0.5 -> 191.75 -> 191)");

    // A 2 x 2 grid of three 1x2 RGB images: 2 px black frame, the fourth cell empty.
    float imgs[3][3][1][2];
    for (int i = 0; i < 3; i++)
        for (int ch = 0; ch < 3; ch++)
            for (int x = 0; x < 2; x++) imgs[i][ch][0][x] = (float)(i + 1) * 0.25f * (ch == x ? 1 : -1);
    p = tmp_path("grid.png");
    CHECK(dc_png_write_grid(p, &imgs[0][0][0][0], 3, 3, 1, 2, 2, 2) == 0, "write grid");
    back = read_png(p, &w, &h, &c);
    CHECK(back && w == 2 * (2 + 2) + 2 && h == 2 * (1 + 2) + 2 && c == 3, "grid size %dx%d", w, h);
    if (back && w == 10 && h == 8) {
        int bad = 0, lit = 0;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int ch = 0; ch < 3; ch++) {
                    int tile = -1, tx = (x - 2) % 4, ty = (y - 2) % 3;
                    if (x >= 2 && y >= 2 && tx < 2 && ty < 1) tile = (y - 2) / 3 * 2 + (x - 2) / 4;
                    int v = back[(y * w + x) * 3 + ch];
                    int expect = tile >= 0 && tile < 3 ? dc_pixel_u8(imgs[tile][ch][0][tx]) : 0;
                    bad += v != expect, lit += tile >= 0 && tile < 3;
                }
        CHECK(bad == 0 && lit == 3 * 2 * 3, "grid pixels (%d wrong)", bad);
    }
    free(back);
    CHECK(dc_png_write_grid(p, &imgs[0][0][0][0], 5, 3, 1, 2, 2, 2) != 0 && strstr(dc_error(), "do not fit"),
          "too many for the grid");
    CHECK(dc_png_write(p, rgb, 3, 2, 2) != 0 && strstr(dc_error(), "1 or 3 channels"), "2 channels refused");
    CHECK(dc_png_write(tmp_path("no/dir/x.png"), rgb, 3, 2, 3) != 0 && strstr(dc_error(), "no/dir"), "bad dir");
}

int main(void) {
    if (tmpdir_make("data")) return 1;
    test_idx();
    test_lying_headers();
    test_not_files();
    test_user_data();
    test_classes();
    test_fingerprint();
    test_order_uniform();
    test_png();
    test_fmnist();
    tmpdir_remove();
    printf("test_data: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
