// Pictures in (dc_image_read): PNG, JPEG and WebP of every colour model,
// written here by the libraries' own encoders from fresh random pixels, read
// back against those pixels (exactly where the format is lossless, within the
// codec's error where it is not, and against libjpeg's baseline decode of the
// same coefficients for progressive files and restart markers); CMYK and
// alpha against PIL's and AUTOMATIC1111's formulas worked in double; files
// that must be refused with a message naming them (cut short at every length,
// not a picture, animated, too many scans); Exif orientations turned as
// PIL's exif_transpose turns them; and the budget: a header that
// declares more pixels than allowed is refused from the header, in a child
// process whose address space could not hold the declared picture, at once.
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "io/image.h"
#include "io/png.h"

#include "check.h"
#include "file_bytes.h"
#include "pictures.h"
#include "tmpdir.h"

// ---- fresh random pixels ------------------------------------------------------

static uint64_t g_rng;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

// [h, w, ch] random bytes; smooth (ramps with a little noise), for lossy codecs, or not.
static uint8_t *pixels(int w, int h, int ch, int smooth) {
    uint8_t *p = malloc((size_t)w * h * ch);
    const int a = (int)(rnd() % 200), b = (int)(rnd() % 200);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < ch; k++)
                p[((size_t)y * w + x) * ch + k] =
                    smooth ? (uint8_t)(30 + (a * x / w + b * y / h) * 3 / 8 + 20 * k + rnd() % 8) : (uint8_t)rnd();
    return p;
}

// Over white, (a c + (255 - a) 255) / 255 rounded, worked in double.
static int over_white(int c, int a) { return (int)floor((a * c + (255.0 - a) * 255.0) / 255.0 + 0.5); }

static int refused(const char *path, int64_t budget, const char *want);

// The file's byte at `at` set to v, in place (rewriting small files over and
// over costs a block discard each on some file systems).
static void poke(const char *path, size_t at, uint8_t v) {
    int fd = open(path, O_WRONLY);
    if (fd < 0 || pwrite(fd, &v, 1, (off_t)at) != 1 || close(fd)) printf("cannot write %s\n", path), exit(1);
}

// Whether reading the file cut to each length from n - 1 down to 0 is refused
// (want in the message): the count refused.
static int cut_refused(const char *path, const uint8_t *file, size_t n, const char *want) {
    spit(path, file, n);
    int ok = 0;
    for (size_t len = n; len-- > 0;) {
        if (truncate(path, (off_t)len) != 0) printf("cannot truncate %s\n", path), exit(1);
        ok += refused(path, 0, len < 12 ? NULL : want);
    }
    return ok;
}

// Reads path, which must succeed as a w x h picture of the format.
static int read_ok(const char *path, dc_image *img, int w, int h, dc_image_format fmt, const char *what) {
    int rc = dc_image_read(path, img, 0);
    CHECK(rc == 0 && img->width == w && img->height == h && img->format == fmt && img->rgb, "%s: read %dx%d %s: %s",
          what, w, h, dc_image_format_name(fmt), rc ? dc_error() : "wrong size or format");
    return rc == 0 && img->rgb;
}

// Reading must fail, naming the file, with `want` in the message, leaving *img empty.
static int refused(const char *path, int64_t budget, const char *want) {
    dc_image img;
    memset(&img, 0x55, sizeof img);
    int rc = dc_image_read(path, &img, budget);
    int ok = rc != 0 && strstr(dc_error(), path) && (!want || strstr(dc_error(), want)) && !img.rgb &&
             img.width == 0;
    if (rc == 0) dc_image_free(&img);
    if (!ok) printf("  %s: not refused as expected (rc %d, want '%s'): %s\n", path, rc, want ? want : "",
                    rc ? dc_error() : "");
    return ok;
}

// Largest and mean absolute difference between RGB pictures of n pixels.
static void diff(const uint8_t *a, const uint8_t *b, size_t n, int *most, double *mean) {
    *most = 0;
    double sum = 0;
    for (size_t i = 0; i < 3 * n; i++) {
        int d = abs(a[i] - b[i]);
        sum += d;
        if (d > *most) *most = d;
    }
    *mean = sum / (3.0 * (double)n);
}

// ---- PNG: the same bytes as the float reader, every colour type -----------------

static void test_png(void) {
    enum { W = 23, H = 11 };
    for (int ch = 1; ch <= 4; ch++) {
        uint8_t *px = pixels(W, H, ch, 0);
        const char *p = tmp_path("p.png");
        CHECK(pic_write_png(p, px, W, H, ch, NULL, 0) == 0, "write PNG");
        dc_image img;
        if (read_ok(p, &img, W, H, DC_IMAGE_PNG, "PNG")) {
            int bad = 0;
            for (int i = 0; i < W * H; i++)
                for (int k = 0; k < 3; k++) {
                    const uint8_t *s = px + i * ch;
                    int want = ch <= 2 ? s[0] : s[k];
                    if (!(ch & 1)) want = over_white(want, s[ch - 1]);
                    bad += img.rgb[i * 3 + k] != want;
                }
            CHECK(bad == 0, "PNG of %d channels as RGB (alpha over white): %d values wrong", ch, bad);
            dc_png_image f;
            CHECK(dc_png_read_image(p, &f, 1) == 0, "float reader: %s", dc_error());
            bad = 0;
            for (int i = 0; i < W * H && f.data; i++)
                for (int k = 0; k < 3; k++) bad += dc_pixel_u8(f.data[k * W * H + i]) != img.rgb[i * 3 + k];
            CHECK(bad == 0, "PNG of %d channels: the byte and float readers agree (%d differ)", ch, bad);
            dc_png_image_free(&f);
            float *chw = malloc(sizeof *chw * 3 * W * H);
            dc_image_to_chw(&img, chw);
            bad = 0;
            for (int i = 0; i < W * H; i++)
                for (int k = 0; k < 3; k++) bad += chw[k * W * H + i] != (float)(img.rgb[i * 3 + k] / 127.5 - 1.0);
            CHECK(bad == 0, "dc_image_to_chw: planes of b / 127.5 - 1 (%d wrong)", bad);
            free(chw);
            dc_image_free(&img);
        }
        free(px);
    }
}

// ---- JPEG ------------------------------------------------------------------------

static uint8_t *read_rgb(const char *path, int w, int h, const char *what) {
    dc_image img;
    if (!read_ok(path, &img, w, h, DC_IMAGE_JPEG, what)) return NULL;
    return img.rgb;
}

static void test_jpeg(void) {
    enum { W = 61, H = 37 };  // not multiples of the 8- or 16-pixel blocks
    const char *p = tmp_path("p.jpg"), *q = tmp_path("q.jpg");
    uint8_t *px = pixels(W, H, 3, 1);
    // Quality 100 at full chroma resolution: within a few levels of the source.
    pic_jpeg_opts o = {.quality = 100};
    CHECK(pic_write_jpeg(p, px, W, H, 3, o) == 0, "write JPEG");
    uint8_t *a = read_rgb(p, W, H, "JPEG 4:4:4");
    int most;
    double mean;
    if (a) {
        diff(a, px, W * H, &most, &mean);
        // YCbCr rounding and the DCT at quality 100: a few levels at most
        CHECK(most <= 6 && mean < 1.0, "JPEG quality 100 4:4:4: off by %d at most, %.2f on average", most, mean);
    }
    free(a);
    // 4:2:0 at quality 90, and the same file progressive and with restart
    // markers: the same coefficients, so the very same pixels.
    o = (pic_jpeg_opts){.quality = 90, .subsample = 1};
    CHECK(pic_write_jpeg(p, px, W, H, 3, o) == 0, "write JPEG 4:2:0");
    uint8_t *base = read_rgb(p, W, H, "JPEG 4:2:0");
    if (base) {
        diff(base, px, W * H, &most, &mean);
        // (the source's noise of 0..7 levels is most of it)
        CHECK(most <= 16 && mean < 3.0, "JPEG quality 90 4:2:0: off by %d at most, %.2f on average", most, mean);
    }
    pic_jpeg_opts variants[] = {{.quality = 90, .subsample = 1, .progressive = 1},
                                {.quality = 90, .subsample = 1, .restart = 1}};
    for (int v = 0; v < 2 && base; v++) {
        CHECK(pic_write_jpeg(q, px, W, H, 3, variants[v]) == 0, "write variant");
        uint8_t *b = read_rgb(q, W, H, v ? "JPEG with restart markers" : "progressive JPEG");
        CHECK(b && !memcmp(b, base, (size_t)W * H * 3), "%s: the same pixels as the baseline file",
              v ? "restart markers" : "progressive");
        free(b);
    }
    free(base), free(px);

    // Gray: the three channels equal, near the source.
    px = pixels(W, H, 1, 1);
    CHECK(pic_write_jpeg(p, px, W, H, 1, (pic_jpeg_opts){.quality = 100}) == 0, "write gray JPEG");
    a = read_rgb(p, W, H, "gray JPEG");
    int bad = 0, far = 0;
    for (int i = 0; a && i < W * H; i++) {
        bad += a[3 * i] != a[3 * i + 1] || a[3 * i] != a[3 * i + 2];
        far += abs(a[3 * i] - px[i]) > 3;
    }
    CHECK(a && bad == 0 && far == 0, "gray JPEG as RGB: %d unequal, %d off by more than 3", bad, far);
    free(a), free(px);

    // CMYK, plain and as Photoshop writes it (inverted, Adobe marker): flat
    // 16x16 patches of random inks (flat blocks survive the DCT to a level)
    // against PIL's R = (255 - K) - C (255 - K) / 255.
    enum { P = 4, S = 16 };
    uint8_t ink[P * P][4], *cm = malloc(P * S * P * S * 4);
    for (int i = 0; i < P * P; i++)
        for (int k = 0; k < 4; k++) ink[i][k] = (uint8_t)rnd();
    for (int y = 0; y < P * S; y++)
        for (int x = 0; x < P * S; x++) memcpy(cm + (y * P * S + x) * 4, ink[(y / S) * P + x / S], 4);
    for (int adobe = 0; adobe <= 1; adobe++) {
        CHECK(pic_write_jpeg(p, cm, P * S, P * S, 4, (pic_jpeg_opts){.quality = 100, .adobe = adobe}) == 0, "CMYK");
        a = read_rgb(p, P * S, P * S, adobe ? "Adobe CMYK JPEG" : "CMYK JPEG");
        most = 0;
        for (int y = 0; a && y < P * S; y++)
            for (int x = 0; x < P * S; x++)
                for (int k = 0; k < 3; k++) {
                    const uint8_t *c = ink[(y / S) * P + x / S];
                    double nk = 255.0 - c[3], want = nk - floor(c[k] * nk / 255.0 + 0.5);
                    int d = (int)fabs(a[(y * P * S + x) * 3 + k] - want);
                    if (d > most) most = d;
                }
        CHECK(a && most <= 2, "%sCMYK JPEG against PIL's conversion: off by %d", adobe ? "Adobe " : "", most);
        free(a);
    }
    free(cm);

    // Scans: a progressive script of ~190 scans reads (the same pixels as
    // baseline); one of ~700 is refused.
    px = pixels(16, 16, 1, 1);
    CHECK(pic_write_jpeg(p, px, 16, 16, 1, (pic_jpeg_opts){.quality = 95}) == 0 &&
          pic_write_jpeg(q, px, 16, 16, 1, (pic_jpeg_opts){.quality = 95, .many_scans = 150}) == 0, "write scans");
    a = read_rgb(p, 16, 16, "baseline");
    uint8_t *b = read_rgb(q, 16, 16, "190 scans");
    CHECK(a && b && !memcmp(a, b, 16 * 16 * 3), "a JPEG of 190 scans: the baseline's pixels");
    free(a), free(b);
    CHECK(pic_write_jpeg(q, px, 16, 16, 1, (pic_jpeg_opts){.quality = 95, .many_scans = 600}) == 0, "write scans");
    CHECK(refused(q, 0, "more than 500 scans"), "a JPEG of ~700 scans is refused");
    free(px);

    // Cut short at every length, and a random bit flipped (in the headers, then
    // anywhere): refused, or (a flip in the pixel data) read; never a crash.
    px = pixels(W, H, 3, 1);
    CHECK(pic_write_jpeg(p, px, W, H, 3, (pic_jpeg_opts){.quality = 80, .subsample = 1}) == 0, "write");
    size_t n;
    uint8_t *file = slurp(p, &n);
    int cut_ok = file ? cut_refused(q, file, n, "not a valid JPEG") : 0;
    CHECK(file && cut_ok == (int)n, "a JPEG cut at each of %zu lengths: %d refused", n, cut_ok);
    int survived = 0, tries = 250;
    if (file) spit(q, file, n);
    for (int t = 0; file && t < tries; t++) {
        const size_t i = t < 40 ? (size_t)t : rnd() % n;  // the headers, then anywhere
        poke(q, i, file[i] ^ (uint8_t)(1 << rnd() % 8));
        dc_image img;
        int rc = dc_image_read(q, &img, 0);
        survived += rc == 0 ? img.rgb != NULL && img.width > 0 : !img.rgb && strstr(dc_error(), q) != NULL;
        dc_image_free(&img);
        poke(q, i, file[i]);
    }
    CHECK(survived == tries, "a bit of a JPEG flipped: read or refused by name (%d of %d)", survived, tries);
    free(file), free(px);
}

// ---- WebP --------------------------------------------------------------------

static void test_webp(void) {
    enum { W = 45, H = 29 };
    const char *p = tmp_path("p.webp");
    // Lossless: exact, and with alpha exactly over white.
    for (int ch = 3; ch <= 4; ch++) {
        uint8_t *px = pixels(W, H, ch, 0);
        CHECK(pic_write_webp(p, px, W, H, ch, -1) == 0, "write lossless WebP");
        dc_image img;
        if (read_ok(p, &img, W, H, DC_IMAGE_WEBP, "lossless WebP")) {
            int bad = 0;
            for (int i = 0; i < W * H; i++)
                for (int k = 0; k < 3; k++) {
                    const uint8_t *s = px + i * ch;
                    bad += img.rgb[i * 3 + k] != (ch == 4 ? over_white(s[k], s[3]) : s[k]);
                }
            CHECK(bad == 0, "lossless WebP%s: %d values wrong", ch == 4 ? " with alpha, over white" : "", bad);
            dc_image_free(&img);
        }
        free(px);
    }
    // Lossy (with alpha stored losslessly beside it): near the source.
    for (int ch = 3; ch <= 4; ch++) {
        uint8_t *px = pixels(W, H, ch, 1), *want = malloc((size_t)W * H * 3);
        if (ch == 4)
            for (int i = 0; i < W * H; i++) px[i * 4 + 3] = (uint8_t)rnd();
        for (int i = 0; i < W * H; i++)
            for (int k = 0; k < 3; k++)
                want[i * 3 + k] = (uint8_t)(ch == 4 ? over_white(px[i * 4 + k], px[i * 4 + 3]) : px[i * 3 + k]);
        CHECK(pic_write_webp(p, px, W, H, ch, 100) == 0, "write lossy WebP");
        dc_image img;
        if (read_ok(p, &img, W, H, DC_IMAGE_WEBP, "lossy WebP")) {
            int most;
            double mean;
            diff(img.rgb, want, W * H, &most, &mean);
            // VP8 is 4:2:0 at any quality: the chroma of a smooth picture is kept, not its noise of 0..7
            CHECK(most <= 16 && mean < 3.0, "lossy WebP%s quality 100: off by %d at most, %.2f on average",
                  ch == 4 ? " with alpha" : "", most, mean);
            dc_image_free(&img);
        }
        free(px), free(want);
    }
    // An animation is refused by name (a VP8X header with its flag is enough to tell).
    uint8_t anim[30] = {'R', 'I', 'F', 'F', 22, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, 0x02};
    anim[24] = 15, anim[27] = 15;  // 16 x 16
    spit(p, anim, sizeof anim);
    CHECK(refused(p, 0, "animated"), "an animated WebP is refused");
    // Cut short at every length.
    uint8_t *px = pixels(W, H, 3, 1);
    CHECK(pic_write_webp(p, px, W, H, 3, 80) == 0, "write");
    size_t n;
    uint8_t *file = slurp(p, &n);
    const char *q = tmp_path("q.webp");
    int cut_ok = file ? cut_refused(q, file, n, "not a valid WebP") : 0;
    CHECK(file && cut_ok == (int)n, "a WebP cut at each of %zu lengths: %d refused", n, cut_ok);
    free(file), free(px);
}

// ---- budgets ---------------------------------------------------------------------

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// Files whose headers declare w x h: a PNG (RGBA, 8 bits; an IHDR with a
// valid CRC and, so that the file is large enough to hold the declared
// pixels once inflated, pad bytes of IDAT), a JPEG (a real one with its SOF
// rewritten) and a WebP (a VP8X header alone).
static void lying_png(const char *path, uint32_t w, uint32_t h, size_t pad) {
    size_t n = 8 + 25 + 12 + pad;
    uint8_t *f = calloc(n, 1);
    memcpy(f, "\x89PNG\r\n\x1a\n", 8);
    uint8_t *c = f + 8;
    put_be32(c, 13), memcpy(c + 4, "IHDR", 4), put_be32(c + 8, w), put_be32(c + 12, h);
    c[16] = 8, c[17] = PNG_COLOR_TYPE_RGB_ALPHA;
    put_be32(c + 21, (uint32_t)crc32(0, c + 4, 17));
    c += 25;
    put_be32(c, (uint32_t)pad), memcpy(c + 4, "IDAT", 4);
    spit(path, f, n);
    free(f);
}

static void lying_jpeg(const char *path, unsigned w, unsigned h) {
    uint8_t *px = pixels(8, 8, 3, 1);
    pic_write_jpeg(path, px, 8, 8, 3, (pic_jpeg_opts){.quality = 50});
    free(px);
    size_t n;
    uint8_t *f = slurp(path, &n);
    for (size_t i = 2; f && i + 9 < n; i++)
        if (f[i] == 0xff && f[i + 1] == 0xc0) {  // SOF0: length, precision, height, width
            f[i + 5] = (uint8_t)(h >> 8), f[i + 6] = (uint8_t)h, f[i + 7] = (uint8_t)(w >> 8), f[i + 8] = (uint8_t)w;
            break;
        }
    if (f) spit(path, f, n);
    free(f);
}

static void lying_webp(const char *path, unsigned w, unsigned h) {
    uint8_t f[30] = {'R', 'I', 'F', 'F', 22, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, 0x10};
    f[24] = (uint8_t)(w - 1), f[25] = (uint8_t)((w - 1) >> 8), f[26] = (uint8_t)((w - 1) >> 16);
    f[27] = (uint8_t)(h - 1), f[28] = (uint8_t)((h - 1) >> 8), f[29] = (uint8_t)((h - 1) >> 16);
    spit(path, f, sizeof f);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Reads path in a child process whose address space can grow by 64 MiB at
// most (the declared pictures need 512 MiB and more): 0 when it was refused
// within a second with `want` in the message. An attempt to allocate the
// declared size fails there as "out of memory", a different message.
static int refused_small(const char *path, const char *want, char *how, size_t cap) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        long pages = 0;
        FILE *fp = fopen("/proc/self/statm", "r");
        if (!fp || fscanf(fp, "%ld", &pages) != 1) _exit(3);
        fclose(fp);
        struct rlimit rl = {(rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (64u << 20), RLIM_INFINITY};
        rl.rlim_max = rl.rlim_cur;
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
        double t0 = now();
        dc_image img;
        int rc = dc_image_read(path, &img, 0);
        double dt = now() - t0;
        printf("  %s: %s (%.3f s)\n", path, rc ? dc_error() : "read", dt);
        fflush(stdout);
        _exit(rc != 0 && strstr(dc_error(), path) && strstr(dc_error(), want) && dt < 1.0 ? 0 : 1);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return snprintf(how, cap, "fork/wait failed"), -1;
    if (WIFSIGNALED(st)) return snprintf(how, cap, "killed by signal %d", WTERMSIG(st)), -1;
    if (WEXITSTATUS(st)) return snprintf(how, cap, "exit status %d (see the line above)", WEXITSTATUS(st)), -1;
    return 0;
}

static void test_budget(void) {
    // Over the default budget (2^26 pixels) or a side over 16384: refused
    // from the header, at once, allocating nothing of the declared size.
    const char *p = tmp_path("huge.png"), *j = tmp_path("huge.jpg"), *w = tmp_path("huge.webp");
    lying_png(p, 16384, 8192, 600 << 10);  // 512 MiB inflated, plausible for a 600 KB file
    lying_jpeg(j, 16384, 16384);
    lying_webp(w, 16384, 8192);
    char how[128];
    const char *over = "over the limit of 67108864 pixels";
    CHECK(refused_small(p, over, how, sizeof how) == 0, "a PNG declaring 16384x8192: %s", how);
    CHECK(refused_small(j, over, how, sizeof how) == 0, "a JPEG declaring 16384x16384: %s", how);
    CHECK(refused_small(w, over, how, sizeof how) == 0, "a WebP declaring 16384x8192: %s", how);
    lying_jpeg(j, 60000, 100);
    lying_webp(w, 20000, 1);
    CHECK(refused_small(j, "16384 a side", how, sizeof how) == 0, "a JPEG 60000 wide: %s", how);
    CHECK(refused_small(w, "16384 a side", how, sizeof how) == 0, "a WebP 20000 wide: %s", how);
    // Within the limits, declaring more than the file holds: refused when the data runs out.
    lying_jpeg(j, 4000, 3000);
    CHECK(refused(j, 0, "not a valid JPEG"), "a JPEG header of 4000x3000 with no data");

    // A caller's budget: 4096 pixels take a 64x64 picture, 4095 do not.
    uint8_t *px = pixels(64, 64, 4, 1);
    const char *files[] = {tmp_path("b.png"), tmp_path("b.jpg"), tmp_path("b.webp")};
    pic_write_png(files[0], px, 64, 64, 3, NULL, 0);
    pic_write_jpeg(files[1], px, 64, 64, 3, (pic_jpeg_opts){.quality = 80});
    pic_write_webp(files[2], px, 64, 64, 4, 80);
    for (int i = 0; i < 3; i++) {
        dc_image img;
        CHECK(dc_image_read(files[i], &img, 4096) == 0 && img.width == 64, "%s within a budget of 4096: %s",
              files[i], dc_error());
        dc_image_free(&img);
        CHECK(refused(files[i], 4095, "over the limit of 4095 pixels"), "%s over a budget of 4095", files[i]);
        CHECK(dc_image_probe(files[i], &img) == 0 && img.width == 64 && img.height == 64 && !img.rgb,
              "probe %s: %s", files[i], dc_error());
    }
    free(px);
}

// ---- Exif orientation ----------------------------------------------------------

// Where pixel (x, y) of a w x h picture lands once turned upright for
// orientation o, by PIL's ImageOps.exif_transpose (Geometry.c's loops: 2
// mirror, 3 half turn, 4 flip, 5 transpose, 6 quarter turn clockwise, 7
// transverse, 8 counter-clockwise).
static void lands(int o, int w, int h, int x, int y, int *dx, int *dy) {
    switch (o) {
    case 2: *dx = w - 1 - x, *dy = y; break;
    case 3: *dx = w - 1 - x, *dy = h - 1 - y; break;
    case 4: *dx = x, *dy = h - 1 - y; break;
    case 5: *dx = y, *dy = x; break;
    case 6: *dx = h - 1 - y, *dy = x; break;
    case 7: *dx = h - 1 - y, *dy = w - 1 - x; break;
    case 8: *dx = y, *dy = w - 1 - x; break;
    default: *dx = x, *dy = y;
    }
}

// up: the picture as stored, read; got: read with orientation o. 1 if got is up turned.
static int turned(const dc_image *up, const dc_image *got, int o) {
    const int swap = o >= 5, w = up->width, h = up->height;
    if (got->width != (swap ? h : w) || got->height != (swap ? w : h)) return 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int dx, dy;
            lands(o, w, h, x, y, &dx, &dy);
            if (memcmp(up->rgb + ((size_t)y * w + x) * 3, got->rgb + ((size_t)dy * got->width + dx) * 3, 3)) return 0;
        }
    return 1;
}

static void test_orientation(void) {
    enum { W = 13, H = 7 };
    uint8_t *px = pixels(W, H, 3, 0), exif[32];
    const char *p = tmp_path("o.png"), *j = tmp_path("o.jpg"), *w = tmp_path("o.webp");
    dc_image up[3] = {{0}}, img;
    CHECK(pic_write_png(p, px, W, H, 3, NULL, 0) == 0 && dc_image_read(p, &up[0], 0) == 0, "PNG: %s", dc_error());
    CHECK(pic_write_jpeg(j, px, W, H, 3, (pic_jpeg_opts){.quality = 90}) == 0 && dc_image_read(j, &up[1], 0) == 0,
          "JPEG: %s", dc_error());
    CHECK(pic_write_webp(w, px, W, H, 3, -1) == 0 && dc_image_read(w, &up[2], 0) == 0, "WebP: %s", dc_error());
    for (int o = 1; o <= 8; o++)
        for (int be = 0; be <= 1; be++) {
            int n = pic_exif(exif, o, be);
            int ok[3] = {pic_write_png(p, px, W, H, 3, exif, n) == 0,
                         pic_write_jpeg(j, px, W, H, 3, (pic_jpeg_opts){.quality = 90, .exif = o, .exif_be = be}) == 0,
                         pic_write_webp(w, px, W, H, 3, -1) == 0 && pic_webp_add_exif(w, W, H, o, be) == 0};
            const char *files[3] = {p, j, w};
            for (int f = 0; f < 3; f++) {
                dc_image probe;
                ok[f] = ok[f] && dc_image_read(files[f], &img, 0) == 0 && dc_image_probe(files[f], &probe) == 0 &&
                        probe.width == img.width && probe.height == img.height && up[f].rgb && turned(&up[f], &img, o);
                if (ok[f]) dc_image_free(&img);
            }
            CHECK(ok[0] && ok[1] && ok[2], "orientation %d (%s-endian Exif): PNG %d, JPEG %d, WebP %d turned as PIL "
                  "does", o, be ? "big" : "little", ok[0], ok[1], ok[2]);
        }
    // Malformed blocks leave the picture as stored: an IFD past the end, an
    // entry cut short, an orientation out of range, a value of another type.
    uint8_t bad[4][26];
    for (int i = 0; i < 4; i++) pic_exif(bad[i], 6, 1);
    bad[0][7] = 200, bad[2][19] = 9, bad[3][13] = 5;  // IFD at 200; orientation 9; type RATIONAL
    const int len[4] = {26, 20, 26, 26};
    int as_stored = 0;
    for (int i = 0; i < 4; i++) {
        as_stored += pic_write_png(p, px, W, H, 3, bad[i], len[i]) == 0 && dc_image_read(p, &img, 0) == 0 &&
                     img.width == W && !memcmp(img.rgb, up[0].rgb, W * H * 3);
        dc_image_free(&img);
    }
    CHECK(as_stored == 4, "malformed Exif blocks: %d of 4 pictures as stored", as_stored);
    for (int f = 0; f < 3; f++) dc_image_free(&up[f]);
    free(px);
}

// ---- what is not a picture ---------------------------------------------------------

static void test_not_pictures(void) {
    const char *p = tmp_path("x.gif");
    spit(p, "GIF89a\x01\x00\x01\x00", 10);
    CHECK(refused(p, 0, "it looks like a GIF"), "a GIF: %s", dc_error());
    spit(p, "BM\x36\x00\x00\x00\x00\x00\x00\x00\x36\x00", 12);
    CHECK(refused(p, 0, "it looks like a BMP"), "a BMP: %s", dc_error());
    spit(p, "hello, world\n", 13);
    CHECK(refused(p, 0, "not a PNG, JPEG or WebP"), "text: %s", dc_error());
    spit(p, "", 0);
    CHECK(refused(p, 0, "empty"), "an empty file: %s", dc_error());
    spit(p, "\xff\xd8\xff", 3);
    CHECK(refused(p, 0, "not a valid JPEG"), "a JPEG signature alone: %s", dc_error());
    spit(p, "RIFF\x04\x00\x00\x00WEBP", 12);
    CHECK(refused(p, 0, "not a valid WebP"), "a WebP signature alone: %s", dc_error());
    CHECK(refused(tmp_path("missing.jpg"), 0, "cannot open"), "a missing file: %s", dc_error());
    CHECK(refused(g_dir, 0, "a directory"), "a directory: %s", dc_error());
    const char *fifo = tmp_path("fifo.jpg");
    CHECK(mkfifo(fifo, 0600) == 0 && refused(fifo, 0, "a FIFO"), "a FIFO, without waiting: %s", dc_error());
}

int main(void) {
    if (tmpdir_make("image")) return 1;
    g_rng = ((uint64_t)time(NULL) << 20 ^ (uint64_t)getpid()) | 1;
    printf("seed %llu\n", (unsigned long long)g_rng);
    test_budget();  // first: its children fork before any thread exists
    test_png();
    test_jpeg();
    test_webp();
    test_orientation();
    test_not_pictures();
    tmpdir_remove();
    printf("test_image: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
