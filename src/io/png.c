#include "io/png.h"

#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/png_text.h"

// libpng reports errors by longjmp; the message is kept for ours.
static void on_png_error(png_structp png, png_const_charp msg) {
    snprintf((char *)png_get_error_ptr(png), 256, "%s", msg);
    png_longjmp(png, 1);
}
static void on_png_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

// Nothing that changes after setjmp is read after a longjmp, so no volatile.
static int encode(FILE *fp, const uint8_t *px, int w, int h, int c, png_text *text, int ntext,
                  char err[256]) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, err, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        snprintf(err, 256, "out of memory");
        return 0;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return 0;
    }
    png_init_io(png, fp);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, c == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (ntext) png_set_text(png, info, text, ntext);  // before the pixels, as Pillow writes them
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, px + (size_t)y * (size_t)w * (size_t)c);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return 1;
}

// libpng's default limit on either side.
#define MAX_SIDE 1000000

int dc_png_write(const char *path, const uint8_t *pixels, int width, int height, int channels) {
    return dc_png_write_text(path, pixels, width, height, channels, NULL, 0);
}

int dc_png_write_text(const char *path, const uint8_t *pixels, int width, int height, int channels,
                      const dc_png_text *text, int ntext) {
    if (channels != 1 && channels != 3)
        return dc_fail("%s: PNG needs 1 or 3 channels, not %d", path, channels);
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE)
        return dc_fail("%s: image size %dx%d outside 1..%d", path, width, height, MAX_SIDE);
    png_text *chunks = NULL;
    if (ntext < 0 || (ntext && !text)) return dc_fail("%s: bad list of text chunks", path);
    if (ntext && dc_png_text_chunks(path, text, ntext, &chunks)) return -1;
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) {
        dc_png_text_chunks_free(chunks, ntext);
        return -1;
    }
    char err[256] = "";
    int ok = encode(dc_atomic_stream(af), pixels, width, height, channels, chunks, ntext, err);
    dc_png_text_chunks_free(chunks, ntext);
    if (!ok) dc_fail("%s: writing PNG failed: %s", path, err);
    return dc_atomic_end(af, ok);
}

// CHW floats -> the HWC bytes of a tile at (x0, y0) of a canvas `stride` pixels wide.
static void put_tile(uint8_t *dst, int stride, int x0, int y0, const float *img, int c, int h, int w) {
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                dst[((size_t)(y0 + y) * (size_t)stride + (size_t)(x0 + x)) * (size_t)c + (size_t)ch] =
                    dc_pixel_u8(img[((size_t)ch * (size_t)h + (size_t)y) * (size_t)w + (size_t)x]);
}

int dc_png_write_image(const char *path, const float *img, int channels, int height, int width) {
    return dc_png_write_grid_text(path, img, 1, channels, height, width, 1, 1, NULL, 0);
}

int dc_png_write_grid(const char *path, const float *imgs, int n, int channels, int height,
                      int width, int rows, int cols) {
    return dc_png_write_grid_text(path, imgs, n, channels, height, width, rows, cols, NULL, 0);
}

int dc_png_write_grid_text(const char *path, const float *imgs, int n, int channels, int height,
                           int width, int rows, int cols, const dc_png_text *text, int ntext) {
    if (channels != 1 && channels != 3)
        return dc_fail("%s: PNG needs 1 or 3 channels, not %d", path, channels);
    if (n < 0 || rows < 1 || cols < 1 || (int64_t)rows * cols < n)
        return dc_fail("%s: %d images do not fit a %d x %d grid", path, n, rows, cols);
    if (height < 1 || width < 1) return dc_fail("%s: image size %dx%d", path, width, height);
    // A single image is written without the frame, as save_image does for one image too.
    int pad = rows * cols == 1 ? 0 : DC_PNG_GRID_PAD;
    int64_t gw = (int64_t)cols * (width + pad) + pad, gh = (int64_t)rows * (height + pad) + pad;
    if (gw > MAX_SIDE || gh > MAX_SIDE)
        return dc_fail("%s: grid of %lldx%lld pixels is too large for PNG", path, (long long)gw, (long long)gh);
    uint8_t *px = calloc((size_t)(gw * gh), (size_t)channels);  // zero: the black padding
    if (!px) return dc_fail("%s: out of memory for a %lldx%lld image", path, (long long)gw, (long long)gh);
    size_t img = (size_t)channels * (size_t)height * (size_t)width;
    for (int i = 0; i < n; i++)
        put_tile(px, (int)gw, pad + (i % cols) * (width + pad), pad + (i / cols) * (height + pad),
                 imgs + (size_t)i * img, channels, height, width);
    int rc = dc_png_write_text(path, px, (int)gw, (int)gh, channels, text, ntext);
    free(px);
    return rc;
}
