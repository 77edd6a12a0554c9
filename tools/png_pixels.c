// Whether two 8-bit PNGs hold the same pixels, to within MAXDIFF levels:
// read with zlib alone (chunks walked, IDAT inflated, the five PNG row
// filters undone), independent of libpng and of the engine's own reader, so
// that the tests compare pictures where no Python is installed.
//
//   png_pixels A.png B.png [MAXDIFF]
//
// Prints PASS or FAIL with the largest difference; exit status 0 (within
// MAXDIFF), 1 (not, or a different size) or 2 (a file that is not such a PNG).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct {
    uint32_t width, height;
    int channels;  // gray 1, gray+alpha 2, RGB 3, RGBA 4
    uint8_t *px;   // [height, width * channels]
} image;

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static int paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

// Undoes the row filters (PNG spec section 9) of raw (filter byte + row, per row) into im->px.
static int unfilter(image *im, const uint8_t *raw) {
    const size_t stride = (size_t)im->width * (size_t)im->channels, bpp = (size_t)im->channels;
    for (uint32_t y = 0; y < im->height; y++) {
        const uint8_t *in = raw + y * (stride + 1) + 1;
        uint8_t *row = im->px + y * stride, *up = y ? row - stride : NULL;
        int f = in[-1];
        for (size_t x = 0; x < stride; x++) {
            int a = x >= bpp ? row[x - bpp] : 0, b = up ? up[x] : 0, c = up && x >= bpp ? up[x - bpp] : 0;
            int pred = f == 0 ? 0 : f == 1 ? a : f == 2 ? b : f == 3 ? (a + b) / 2 : f == 4 ? paeth(a, b, c) : -1;
            if (pred < 0) return -1;
            row[x] = (uint8_t)(in[x] + pred);
        }
    }
    return 0;
}

static int load(const char *path, image *im) {
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, "png_pixels: cannot open %s\n", path), -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *b = n > 0 ? malloc((size_t)n) : NULL, *idat = NULL;
    size_t nidat = 0;
    int ok = b && fread(b, 1, (size_t)n, f) == (size_t)n && n > 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8);
    fclose(f);
    memset(im, 0, sizeof *im);
    for (long i = 8; ok && i + 12 <= n;) {
        uint32_t len = be32(b + i);
        if ((long)len > n - i - 12) { ok = 0; break; }
        const uint8_t *type = b + i + 4, *data = b + i + 8;
        if (!memcmp(type, "IHDR", 4) && len >= 13) {
            static const int k_channels[7] = {1, 0, 3, 0, 2, 0, 4};
            im->width = be32(data), im->height = be32(data + 4);
            im->channels = data[9] <= 6 ? k_channels[data[9]] : 0;
            ok = data[8] == 8 && im->channels && data[12] == 0 && im->width && im->height &&
                 (uint64_t)im->width * im->height < (1u << 28);  // 8-bit, not interlaced, sane
        } else if (!memcmp(type, "IDAT", 4)) {
            uint8_t *grown = realloc(idat, nidat + len + 1);
            if (!grown) { ok = 0; break; }
            idat = grown;
            memcpy(idat + nidat, data, len), nidat += len;
        }
        i += 12 + (long)len;
    }
    uLongf raw_len = ok ? (uLongf)im->height * ((uLongf)im->width * (uLongf)im->channels + 1) : 0;
    uint8_t *raw = ok ? malloc(raw_len) : NULL;
    im->px = ok ? malloc((size_t)raw_len) : NULL;
    uLongf got = raw_len;
    ok = ok && raw && im->px && uncompress(raw, &got, idat, (uLong)nidat) == Z_OK && got == raw_len &&
         unfilter(im, raw) == 0;
    free(b), free(idat), free(raw);
    if (!ok) {
        free(im->px), im->px = NULL;
        return fprintf(stderr, "png_pixels: %s is not an 8-bit, non-interlaced PNG it can read\n", path), -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) return fprintf(stderr, "usage: png_pixels A.png B.png [MAXDIFF]\n"), 2;
    int limit = argc > 3 ? atoi(argv[3]) : 0;
    image a, b;
    if (load(argv[1], &a)) return 2;
    if (load(argv[2], &b)) return free(a.px), 2;
    int worst = 0;
    if (a.width != b.width || a.height != b.height || a.channels != b.channels) {
        worst = 256;
    } else {
        const size_t n = (size_t)a.width * a.height * (size_t)a.channels;
        for (size_t i = 0; i < n; i++) {
            int d = abs((int)a.px[i] - (int)b.px[i]);
            if (d > worst) worst = d;
        }
    }
    free(a.px), free(b.px);
    printf("%s (largest difference %d of 255)\n", worst <= limit ? "PASS" : "FAIL", worst);
    return worst <= limit ? 0 : 1;
}
