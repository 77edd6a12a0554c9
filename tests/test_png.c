// PNG input and text chunks: every colour type and depth libpng writes
// (made here with libpng itself) read back against values computed in
// double precision; text chunks as tEXt (Latin-1) or iTXt (UTF-8); the
// AUTOMATIC1111 parameters text; and files that must be refused with a
// message naming them: cut short at every length, any single bit flipped,
// headers claiming more pixels than allowed or than the file can hold,
// directories and FIFOs.
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "io/png.h"
#include "io/png_params.h"

#include "check.h"
#include "file_bytes.h"
#include "tmpdir.h"

// ---- making test files with libpng directly ------------------------------------

typedef struct {
    int color, depth, interlace;
    const png_color *palette;
    int npalette;
    const uint8_t *trns;  // palette alpha
    int ntrns;
    const png_text *text;
    int ntext;
} spec;

// rows: [h] rows packed as libpng wants them for s (16-bit samples big-endian).
static int write_raw(const char *path, const spec *s, int w, int h, uint8_t *const *rows) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, s->depth, s->color, s->interlace,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (s->palette) png_set_PLTE(png, info, s->palette, s->npalette);
    if (s->trns) png_set_tRNS(png, info, s->trns, s->ntrns, NULL);
    if (s->ntext) png_set_text(png, info, s->text, s->ntext);
    png_write_info(png, info);
    png_write_image(png, (png_bytepp)rows);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    return fclose(f);
}

static int to_byte(float v) { return (int)lrint(((double)v + 1.0) * 127.5); }
static int over_white(int c, int a) { return (int)floor((a * c + (255.0 - a) * 255.0) / 255.0 + 0.5); }

// ---- reading each kind -----------------------------------------------------------

static void test_gray8(void) {
    enum { W = 16, H = 16 };
    uint8_t px[H][W], *rows[H];
    for (int y = 0; y < H; y++) {
        rows[y] = px[y];
        for (int x = 0; x < W; x++) px[y][x] = (uint8_t)(y * W + x);  // every byte value
    }
    spec s = {.color = PNG_COLOR_TYPE_GRAY, .depth = 8, .interlace = PNG_INTERLACE_NONE};
    const char *p = tmp_path("gray8.png");
    CHECK(write_raw(p, &s, W, H, rows) == 0, "write gray8");
    dc_png_image im;
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read gray8: %s", dc_error());
    int bad = 0;
    for (int i = 0; i < W * H && im.data; i++)
        bad += im.data[i] != (float)((double)i / 127.5 - 1.0) || dc_pixel_u8(im.data[i]) != i ||
               !(fabsf(im.data[i]) <= 1);
    CHECK(im.channels == 1 && im.height == H && im.width == W && bad == 0, "gray8 values (%d wrong)", bad);
    dc_png_image_free(&im);
    CHECK(dc_png_read_image(p, &im, 1) == 0 && im.channels == 3, "gray8 forced to RGB");
    bad = 0;
    for (int k = 0; k < 3 && im.data; k++)
        for (int i = 0; i < W * H; i++) bad += to_byte(im.data[k * W * H + i]) != i;
    CHECK(bad == 0, "gray8 as RGB: every plane the gray (%d wrong)", bad);
    dc_png_image_free(&im);
}

// RGB, 8 bits, plain and interlaced; RGBA composited over white.
static void test_rgb(void) {
    enum { W = 7, H = 5 };
    uint8_t px[H][W * 4], *rows[H];
    for (int y = 0; y < H; y++) {
        rows[y] = px[y];
        for (int i = 0; i < W * 4; i++) px[y][i] = (uint8_t)(y * 53 + i * 29 + 7);
    }
    for (int il = 0; il <= 1; il++) {
        spec s = {.color = PNG_COLOR_TYPE_RGB, .depth = 8, .interlace = il ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE};
        uint8_t rgb[H][W * 3], *rr[H];
        for (int y = 0; y < H; y++) {
            rr[y] = rgb[y];
            for (int i = 0; i < W * 3; i++) rgb[y][i] = px[y][i];
        }
        const char *p = tmp_path("rgb.png");
        CHECK(write_raw(p, &s, W, H, rr) == 0, "write rgb");
        dc_png_image im;
        CHECK(dc_png_read_image(p, &im, il) == 0, "read rgb (interlace %d): %s", il, dc_error());
        int bad = 0;
        for (int k = 0; k < 3 && im.data; k++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) bad += to_byte(im.data[(k * H + y) * W + x]) != rgb[y][x * 3 + k];
        CHECK(im.channels == 3 && im.height == H && im.width == W && bad == 0, "rgb interlace %d (%d wrong)", il, bad);
        dc_png_image_free(&im);
    }
    spec s = {.color = PNG_COLOR_TYPE_RGBA, .depth = 8, .interlace = PNG_INTERLACE_NONE};
    const char *p = tmp_path("rgba.png");
    CHECK(write_raw(p, &s, W, H, rows) == 0, "write rgba");
    dc_png_image im;
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read rgba: %s", dc_error());
    int bad = 0;
    for (int k = 0; k < 3 && im.data; k++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                bad += to_byte(im.data[(k * H + y) * W + x]) != over_white(px[y][x * 4 + k], px[y][x * 4 + 3]);
    CHECK(im.channels == 3 && bad == 0, "rgba over white (%d wrong)", bad);
    dc_png_image_free(&im);

    // gray + alpha: one channel
    s.color = PNG_COLOR_TYPE_GRAY_ALPHA;
    CHECK(write_raw(p, &s, W * 2, H, rows) == 0, "write gray+alpha");
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read gray+alpha: %s", dc_error());
    bad = 0;
    for (int y = 0; y < H && im.data; y++)
        for (int x = 0; x < 2 * W; x++)
            bad += to_byte(im.data[y * 2 * W + x]) != over_white(px[y][x * 2], px[y][x * 2 + 1]);
    CHECK(im.channels == 1 && im.width == 2 * W && bad == 0, "gray+alpha over white (%d wrong)", bad);
    dc_png_image_free(&im);
}

// 16 bits: every value of a gray image, scaled as round(v * 255 / 65535); RGB too.
static void test_16bit(void) {
    enum { W = 256, H = 256 };
    uint8_t *px = malloc(W * H * 2 * 3), *rows[H];
    for (int y = 0; y < H; y++) {
        rows[y] = px + y * W * 2;
        for (int x = 0; x < W; x++) px[(y * W + x) * 2] = (uint8_t)y, px[(y * W + x) * 2 + 1] = (uint8_t)x;
    }
    spec s = {.color = PNG_COLOR_TYPE_GRAY, .depth = 16, .interlace = PNG_INTERLACE_NONE};
    const char *p = tmp_path("gray16.png");
    CHECK(write_raw(p, &s, W, H, rows) == 0, "write gray16");
    dc_png_image im;
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read gray16: %s", dc_error());
    int bad = 0;
    for (int v = 0; v < 65536 && im.data; v++) bad += to_byte(im.data[v]) != (int)floor(v * 255.0 / 65535.0 + 0.5);
    CHECK(im.channels == 1 && bad == 0, "gray16 scaled to 8 bits (%d of 65536 wrong)", bad);
    dc_png_image_free(&im);

    enum { W3 = 3, H3 = 2 };
    uint8_t *r3[H3];
    for (int y = 0; y < H3; y++) r3[y] = px + y * W3 * 6;
    for (int i = 0; i < W3 * H3 * 6; i++) px[i] = (uint8_t)(i * 41 + 3);
    s.color = PNG_COLOR_TYPE_RGB;
    CHECK(write_raw(p, &s, W3, H3, r3) == 0, "write rgb16");
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read rgb16: %s", dc_error());
    bad = 0;
    for (int k = 0; k < 3 && im.data; k++)
        for (int i = 0; i < W3 * H3; i++) {
            int v = px[(i * 3 + k) * 2] << 8 | px[(i * 3 + k) * 2 + 1];
            bad += to_byte(im.data[k * W3 * H3 + i]) != (int)floor(v * 255.0 / 65535.0 + 0.5);
        }
    CHECK(im.channels == 3 && bad == 0, "rgb16 (%d wrong)", bad);
    dc_png_image_free(&im);
    free(px);
}

// A 2-bit palette with one half-transparent entry; 1-bit gray.
static void test_palette_and_low_depths(void) {
    const png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
    const uint8_t trns[4] = {255, 255, 255, 128};
    enum { W = 5, H = 2 };
    int idx[H][W] = {{0, 1, 2, 3, 0}, {3, 3, 2, 1, 0}};
    uint8_t packed[H][2], *rows[H];
    for (int y = 0; y < H; y++) {
        rows[y] = packed[y];
        packed[y][0] = packed[y][1] = 0;
        for (int x = 0; x < W; x++) packed[y][x / 4] |= (uint8_t)(idx[y][x] << (6 - 2 * (x % 4)));
    }
    for (int with_alpha = 0; with_alpha <= 1; with_alpha++) {
        spec s = {.color = PNG_COLOR_TYPE_PALETTE, .depth = 2, .interlace = PNG_INTERLACE_NONE,
                  .palette = pal, .npalette = 4, .trns = with_alpha ? trns : NULL, .ntrns = 4};
        const char *p = tmp_path("pal.png");
        CHECK(write_raw(p, &s, W, H, rows) == 0, "write palette");
        dc_png_image im;
        CHECK(dc_png_read_image(p, &im, 0) == 0, "read palette: %s", dc_error());
        int bad = 0;
        for (int y = 0; y < H && im.data; y++)
            for (int x = 0; x < W; x++) {
                const png_color *c = &pal[idx[y][x]];
                int rgb[3] = {c->red, c->green, c->blue}, a = with_alpha ? trns[idx[y][x]] : 255;
                for (int k = 0; k < 3; k++) bad += to_byte(im.data[(k * H + y) * W + x]) != over_white(rgb[k], a);
            }
        CHECK(im.channels == 3 && im.width == W && bad == 0, "palette%s (%d wrong)", with_alpha ? " + tRNS" : "", bad);
        dc_png_image_free(&im);
    }
    uint8_t bits[H][1] = {{0xa8}, {0x50}};  // 10101, 01010
    for (int y = 0; y < H; y++) rows[y] = bits[y];
    spec s = {.color = PNG_COLOR_TYPE_GRAY, .depth = 1, .interlace = PNG_INTERLACE_NONE};
    const char *p = tmp_path("gray1.png");
    CHECK(write_raw(p, &s, W, H, rows) == 0, "write 1-bit gray");
    dc_png_image im;
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read 1-bit gray: %s", dc_error());
    int bad = 0;
    for (int i = 0; i < W * H && im.data; i++) bad += to_byte(im.data[i]) != ((i % W + i / W) % 2 ? 0 : 255);
    CHECK(im.channels == 1 && bad == 0, "1-bit gray is 0 or 255 (%d wrong)", bad);
    dc_png_image_free(&im);
}

// ---- the writer's round trip and text chunks --------------------------------------

static const uint8_t *find(const uint8_t *b, size_t n, const void *s, size_t m) {
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(b + i, s, m)) return b + i;
    return NULL;
}

static void test_write_read_text(void) {
    enum { C = 3, H = 4, W = 6 };
    float img[C * H * W];
    for (int i = 0; i < C * H * W; i++) img[i] = dc_pixel_float((uint8_t)(i * 37 + 5));
    dc_png_text t[3] = {{"parameters", "caf\xc3\xa9 au lait\nSteps: 2"},  // é: Latin-1
                        {"Comment", "\xe7\x8c\xab a cat"},                   // 猫: iTXt
                        {"Software", "diffusion"}};
    const char *p = tmp_path("text.png");
    CHECK(dc_png_write_grid_text(p, img, 1, C, H, W, 1, 1, t, 3) == 0, "write with text: %s", dc_error());
    size_t n;
    uint8_t *b = slurp(p, &n);
    CHECK(b && find(b, n, "tEXtparameters\0caf\xe9 au lait\nSteps: 2", 36), "Latin-1 value as tEXt, in Latin-1");
    CHECK(b && find(b, n, "iTXtComment", 11) && !find(b, n, "tEXtComment", 11), "non-Latin-1 value as iTXt");
    free(b);
    dc_png_image im;
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read back: %s", dc_error());
    int bad = 0;
    for (int i = 0; i < C * H * W && im.data; i++) bad += im.data[i] != img[i];
    CHECK(im.channels == C && im.height == H && im.width == W && bad == 0, "pixels round trip exactly (%d wrong)", bad);
    const char *v = dc_png_image_text(&im, "parameters"), *c = dc_png_image_text(&im, "Comment");
    CHECK(im.ntext == 3 && v && !strcmp(v, t[0].value), "tEXt back as UTF-8: '%s'", v ? v : "(none)");
    CHECK(c && !strcmp(c, t[1].value), "iTXt back: '%s'", c ? c : "(none)");
    CHECK(!dc_png_image_text(&im, "nothing"), "missing key");
    dc_png_image_free(&im);

    // zTXt written by another tool: Latin-1, compressed
    png_text z = {.compression = PNG_TEXT_COMPRESSION_zTXt, .key = "parameters", .text = "na\xefve"};
    uint8_t px[1] = {9}, *rows[1] = {px};
    spec s = {.color = PNG_COLOR_TYPE_GRAY, .depth = 8, .interlace = PNG_INTERLACE_NONE, .text = &z, .ntext = 1};
    CHECK(write_raw(p, &s, 1, 1, rows) == 0, "write zTXt");
    CHECK(dc_png_read_image(p, &im, 0) == 0, "read zTXt: %s", dc_error());
    v = dc_png_image_text(&im, "parameters");
    CHECK(v && !strcmp(v, "na\xc3\xafve"), "zTXt as UTF-8");
    dc_png_image_free(&im);

    dc_png_text badkey = {"", "x"}, badutf = {"k", "\xff\xfe"}, longkey = {"k\tx", "y"};
    CHECK(dc_png_write_grid_text(p, img, 1, C, H, W, 1, 1, &badkey, 1) != 0 && strstr(dc_error(), "text key"), "empty key");
    CHECK(dc_png_write_grid_text(p, img, 1, C, H, W, 1, 1, &longkey, 1) != 0 && strstr(dc_error(), "text key"), "tab in key");
    CHECK(dc_png_write_grid_text(p, img, 1, C, H, W, 1, 1, &badutf, 1) != 0 && strstr(dc_error(), "not UTF-8"),
          "value not UTF-8");
    // the largest text the reader takes back is written; one byte more is refused
    char *big = malloc(DC_PNG_MAX_CHUNK);
    memset(big, 'x', DC_PNG_MAX_CHUNK - 1);
    big[DC_PNG_MAX_CHUNK - 1 - 5] = 0;  // key "k", and 5 bytes of iTXt overhead
    dc_png_text bigt = {"k", big};
    const char *p2 = tmp_path("big.png");
    CHECK(dc_png_write_grid_text(p2, img, 1, C, H, W, 1, 1, &bigt, 1) == 0, "largest text: %s", dc_error());
    CHECK(dc_png_read_image(p2, &im, 0) == 0 && im.ntext == 1 && strlen(im.values[0]) == strlen(big),
          "largest text read back: %s", dc_error());
    dc_png_image_free(&im);
    big[DC_PNG_MAX_CHUNK - 1 - 5] = 'x', big[DC_PNG_MAX_CHUNK - 1 - 4] = 0;
    CHECK(dc_png_write_grid_text(p, img, 1, C, H, W, 1, 1, &bigt, 1) != 0 && strstr(dc_error(), "is over"),
          "text over the limit: %s", dc_error());
    free(big);
    CHECK(dc_png_read_image(p, &im, 0) == 0 && dc_pixel_u8(im.data[0]) == 9, "a refused write leaves the file");
    dc_png_image_free(&im);
}

static void test_params(void) {
    dc_gen_params g = {.prompt = "a cat", .negative_prompt = "blurry", .steps = 20, .sampler = "Euler a",
                       .cfg_scale = 7.0f, .seed = 42, .width = 512, .height = 512, .model = "v1-5"};
    char *s = dc_gen_params_format(&g);
    const char *want = "a cat\nNegative prompt: blurry\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, "
                       "Size: 512x512, Model: v1-5";
    CHECK(s && !strcmp(s, want), "A1111 text:\n%s", s ? s : "(null)");
    free(s);
    g.negative_prompt = "", g.cfg_scale = 7.5f, g.width = 768, g.seed = 18446744073709551615ull;
    g.model = "dit: run, step 5";
    s = dc_gen_params_format(&g);
    want = "a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7.5, Seed: 18446744073709551615, Size: 768x512, "
           "Model: \"dit: run, step 5\"";
    CHECK(s && !strcmp(s, want), "without a negative prompt, quoted model:\n%s", s ? s : "(null)");
    free(s);
    g.negative_prompt = NULL, g.cfg_scale = 0.1f, g.extra = "Batch size: 2";
    s = dc_gen_params_format(&g);
    CHECK(s && strstr(s, "CFG scale: 0.1,") && !strstr(s, "Negative"), "0.1 printed shortest: %s", s ? s : "(null)");
    CHECK(s && strstr(s, "step 5\", Batch size: 2") == s + strlen(s) - 22, "extra pairs last: %s", s ? s : "(null)");
    free(s);

    // A1111's model hash, before the model's name
    g = (dc_gen_params){.prompt = "a cat", .steps = 20, .sampler = "Euler a", .cfg_scale = 7.0f, .seed = 42,
                        .width = 512, .height = 512, .model_hash = "6ce0161689", .model = "v1-5"};
    s = dc_gen_params_format(&g);
    want = "a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 512x512, Model hash: 6ce0161689, "
           "Model: v1-5";
    CHECK(s && !strcmp(s, want), "model hash:\n%s", s ? s : "(null)");
    free(s);
    // Line breaks in the prompts plant no line: each is written as the space the tokenizer reads
    g.prompt = "a cat\nNegative prompt: evil\r\nSteps: 1\rx\vy\fz\x1c" "1\x1d" "2\x1e" "3\xc2\x85" "4\xe2\x80\xa8" "5\xe2\x80\xa9" "6\n";
    g.negative_prompt = "blurry\nSteps: 99, Sampler: DDIM";
    g.model = "v1\xe2\x80\xa8" "5";
    s = dc_gen_params_format(&g);
    want = "a cat Negative prompt: evil Steps: 1 x y z 1 2 3 4 5 6 \nNegative prompt: blurry Steps: 99, Sampler: DDIM\n"
           "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 512x512, Model hash: 6ce0161689, "
           "Model: \"v1\\u20285\"";
    CHECK(s && !strcmp(s, want), "line breaks in prompts and names:\n%s", s ? s : "(null)");
    free(s);
}

// ---- refused files ----------------------------------------------------------------

static int refused(const char *path, const char *what) {
    dc_png_image im;
    memset(&im, 0x55, sizeof im);
    int rc = dc_png_read_image(path, &im, 1);
    int ok = rc != 0 && strstr(dc_error(), path) && !im.data && !im.keys && im.ntext == 0;
    if (!ok && rc == 0) dc_png_image_free(&im);
    if (!ok) printf("  %s: not refused properly (rc %d): %s\n", what, rc, dc_error());
    return ok;
}

static void test_corrupt(void) {
    // a small file with a text chunk before and after the pixels
    enum { W = 3, H = 2 };
    uint8_t px[H][W * 3], *rows[H];
    for (int y = 0; y < H; y++) {
        rows[y] = px[y];
        for (int i = 0; i < W * 3; i++) px[y][i] = (uint8_t)(i * 30 + y);
    }
    png_text t = {.compression = PNG_TEXT_COMPRESSION_NONE, .key = "parameters", .text = "a cat"};
    spec s = {.color = PNG_COLOR_TYPE_RGB, .depth = 8, .interlace = PNG_INTERLACE_NONE, .text = &t, .ntext = 1};
    const char *good = tmp_path("good.png"), *bad = tmp_path("bad.png");
    CHECK(write_raw(good, &s, W, H, rows) == 0, "write");
    size_t n;
    uint8_t *b = slurp(good, &n);
    if (!b) return;
    dc_png_image im;
    CHECK(dc_png_read_image(good, &im, 0) == 0, "the intact file reads: %s", dc_error());
    dc_png_image_free(&im);
    int cut_ok = 0;
    for (size_t len = 0; len < n; len++) {
        spit(bad, b, len);
        cut_ok += refused(bad, "truncated");
    }
    CHECK(cut_ok == (int)n, "cut at each of %zu lengths: %d refused", n, cut_ok);
    int flip_ok = 0;
    for (size_t i = 0; i < n; i++)
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1 << bit);
            spit(bad, b, n);
            int r = refused(bad, "bit flip");
            if (!r) printf("  byte %zu bit %d\n", i, bit);
            flip_ok += r;
            b[i] ^= (uint8_t)(1 << bit);
        }
    CHECK(flip_ok == (int)n * 8, "every single-bit flip of %zu bytes refused: %d of %d", n, flip_ok, (int)n * 8);
    free(b);
    spit(bad, "GIF89a not a png at all", 23);
    CHECK(refused(bad, "not a PNG") && strstr(dc_error(), "not a valid PNG"), "not a PNG: %s", dc_error());
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// A signature and an IHDR with valid CRC claiming w x h, then an empty IDAT and IEND.
static void lying_header(const char *path, uint32_t w, uint32_t h, int color) {
    uint8_t f[8 + 25 + 12 + 12] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t *c = f + 8;
    put_be32(c, 13), memcpy(c + 4, "IHDR", 4), put_be32(c + 8, w), put_be32(c + 12, h);
    c[16] = 8, c[17] = (uint8_t)color;
    put_be32(c + 21, (uint32_t)crc32(0, c + 4, 17));
    c += 25;
    put_be32(c, 0), memcpy(c + 4, "IDAT", 4), put_be32(c + 8, (uint32_t)crc32(0, c + 4, 4));
    c += 12;
    put_be32(c, 0), memcpy(c + 4, "IEND", 4), put_be32(c + 8, (uint32_t)crc32(0, c + 4, 4));
    spit(path, f, sizeof f);
}

static void test_limits(void) {
    const char *p = tmp_path("huge.png");
    lying_header(p, 0x7fffffff, 0x7fffffff, PNG_COLOR_TYPE_RGB_ALPHA);
    CHECK(refused(p, "2^31 a side") && strstr(dc_error(), "exceeds user limit"), "2^31 x 2^31: %s", dc_error());
    lying_header(p, 16384, 16384, PNG_COLOR_TYPE_RGB);
    CHECK(refused(p, "16384^2") && strstr(dc_error(), "over the limit"), "2^28 pixels: %s", dc_error());
    lying_header(p, 8192, 8192, PNG_COLOR_TYPE_GRAY);  // within the caps, but 64 MB from 57 bytes
    CHECK(refused(p, "implausible") && strstr(dc_error(), "more than a 57-byte file can hold"), "plausibility: %s",
          dc_error());
    // a text chunk claiming 1 GiB: refused from its header, not allocated
    {
        uint8_t f[8 + 25 + 12] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        uint8_t *c = f + 8;
        put_be32(c, 13), memcpy(c + 4, "IHDR", 4), put_be32(c + 8, 1), put_be32(c + 12, 1), c[16] = 8;
        put_be32(c + 21, (uint32_t)crc32(0, c + 4, 17));
        put_be32(c + 25, 1u << 30), memcpy(c + 29, "zTXt", 4), memcpy(c + 33, "parameters", 4);
        spit(p, f, sizeof f);
        // (an error at once: as a warning libpng would go on to allocate it)
        CHECK(refused(p, "1 GiB chunk") && strstr(dc_error(), "not a valid PNG: zTXt: chunk data is too large"),
              "1 GiB chunk: %s", dc_error());
    }
    // text chunks: DC_PNG_MAX_TEXT are read, one more is refused
    for (int extra = 0; extra <= 1; extra++) {
        png_text t[DC_PNG_MAX_TEXT + 1];
        char keys[DC_PNG_MAX_TEXT + 1][8];
        for (int i = 0; i < DC_PNG_MAX_TEXT + extra; i++) {
            snprintf(keys[i], sizeof keys[i], "k%d", i);
            t[i] = (png_text){.compression = PNG_TEXT_COMPRESSION_NONE, .key = keys[i], .text = "v"};
        }
        uint8_t px[1] = {0}, *rows[1] = {px};
        spec s = {.color = PNG_COLOR_TYPE_GRAY, .depth = 8, .text = t, .ntext = DC_PNG_MAX_TEXT + extra};
        CHECK(write_raw(p, &s, 1, 1, rows) == 0, "write text chunks");
        dc_png_image im;
        if (!extra) {
            CHECK(dc_png_read_image(p, &im, 0) == 0 && im.ntext == DC_PNG_MAX_TEXT, "%d text chunks read: %s",
                  DC_PNG_MAX_TEXT, dc_error());
            dc_png_image_free(&im);
        } else
            CHECK(refused(p, "too many text chunks") && strstr(dc_error(), "chunk cache"), "one more: %s", dc_error());
    }
    CHECK(refused(tmp_path("missing.png"), "missing"), "missing file");
    const char *dir = tmp_path("dir.png");
    mkdir(dir, 0777);
    CHECK(refused(dir, "directory") && strstr(dc_error(), "a directory"), "directory: %s", dc_error());
    const char *fifo = tmp_path("fifo.png");
    CHECK(mkfifo(fifo, 0666) == 0, "mkfifo");
    CHECK(refused(fifo, "FIFO") && strstr(dc_error(), "a FIFO"), "FIFO, without blocking: %s", dc_error());
    spit(p, "", 0);
    CHECK(refused(p, "empty"), "empty file");
}

int main(void) {
    if (tmpdir_make("png")) return 1;
    test_gray8();
    test_rgb();
    test_16bit();
    test_palette_and_low_depths();
    test_write_read_text();
    test_params();
    test_corrupt();
    test_limits();
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
