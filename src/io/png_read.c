// Reading a PNG into floats. libpng reports errors by longjmp, so all that
// decode() allocates lives in a struct owned by its caller (not in locals
// that setjmp would leave indeterminate), which frees it on every path.
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/png.h"
#include "io/png_text.h"

// Deflate's best ratio: 258-byte matches at about 2 bits each, 1032:1.
#define DEFLATE_MAX_RATIO 1032

typedef struct {
    png_structp png;
    png_infop info;
    uint8_t *raw;      // [height, rowbytes] after libpng's transforms
    png_bytep *rows;   // [height] into raw
    char err[256];
    char warning[128];  // the last one: libpng gives the reason for some errors only as a warning
} reader;

static void on_error(png_structp png, png_const_charp msg) {
    reader *r = png_get_error_ptr(png);
    if (r->warning[0]) snprintf(r->err, sizeof r->err, "%s (%s)", msg, r->warning);
    else snprintf(r->err, sizeof r->err, "%s", msg);
    png_longjmp(png, 1);
}
static void on_warning(png_structp png, png_const_charp msg) {
    reader *r = png_get_error_ptr(png);
    snprintf(r->warning, sizeof r->warning, "%s", msg);
}

// 1 on success; 0 with r->err set. Reads to IEND, so a file cut anywhere fails.
static int decode(reader *r, FILE *fp, int64_t file_size, int force_rgb, dc_png_image *img) {
    if (setjmp(png_jmpbuf(r->png))) return 0;
    png_structp png = r->png;
    png_infop info = r->info;
    png_init_io(png, fp);
    png_set_user_limits(png, DC_PNG_MAX_SIDE, DC_PNG_MAX_SIDE);
    png_set_chunk_malloc_max(png, DC_PNG_MAX_CHUNK);
    png_set_chunk_cache_max(png, DC_PNG_MAX_TEXT + 2);  // libpng keeps this many, less 2
    // A corrupt chunk of any kind is an error: the text says how the picture was made.
    png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    // libpng only warns of its "benign" errors when reading, and one of them
    // is a chunk over the size limit, which it then allocates anyway (a
    // header can claim 2 GB of text). So they are errors here, and with them
    // duplicate or misplaced ancillary chunks, which no common writer makes.
    png_set_benign_errors(png, 0);
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, color, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, NULL, NULL);
    if ((uint64_t)w * h > DC_PNG_MAX_PIXELS) {
        snprintf(r->err, 256, "%ux%u pixels is over the limit of %d", (unsigned)w, (unsigned)h, DC_PNG_MAX_PIXELS);
        return 0;
    }
    // The stored (filtered) bytes the header declares, against what the file could inflate to.
    int bits_px = depth * png_get_channels(png, info);
    uint64_t stored = (uint64_t)h * (((uint64_t)w * bits_px + 7) / 8 + 1);
    if (stored > (uint64_t)file_size * DEFLATE_MAX_RATIO) {
        snprintf(r->err, 256, "its header claims %ux%u pixels, more than a %lld-byte file can hold",
                 (unsigned)w, (unsigned)h, (long long)file_size);
        return 0;
    }
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (depth == 16) png_set_scale_16(png);
    if (force_rgb && !(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info);  // 1..4: gray, gray+alpha, RGB, RGBA
    size_t rowbytes = png_get_rowbytes(png, info);
    if (rowbytes != (size_t)w * ch) {
        snprintf(r->err, 256, "unexpected row layout after conversion");
        return 0;
    }
    r->raw = malloc((size_t)h * rowbytes);
    r->rows = malloc((size_t)h * sizeof *r->rows);
    if (!r->raw || !r->rows) {
        snprintf(r->err, 256, "out of memory for %ux%u pixels", (unsigned)w, (unsigned)h);
        return 0;
    }
    for (png_uint_32 y = 0; y < h; y++) r->rows[y] = r->raw + (size_t)y * rowbytes;
    png_read_image(png, r->rows);
    png_read_end(png, info);  // text after the pixels joins the text before them in info

    int alpha = !(ch & 1), c = alpha ? ch - 1 : ch;
    img->channels = c, img->height = (int)h, img->width = (int)w;
    img->data = malloc((size_t)c * h * w * sizeof *img->data);
    if (!img->data) {
        snprintf(r->err, 256, "out of memory for %ux%u pixels", (unsigned)w, (unsigned)h);
        return 0;
    }
    size_t plane = (size_t)h * w;
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++) {
            const uint8_t *p = r->rows[y] + x * (size_t)ch;
            for (int k = 0; k < c; k++) {
                unsigned v = p[k];
                // over white: (a c + (255 - a) 255) / 255, rounded
                if (alpha) v = (p[c] * v + (255u - p[c]) * 255u + 127u) / 255u;
                img->data[(size_t)k * plane + y * w + x] = dc_pixel_float((uint8_t)v);
            }
        }
    png_textp text;
    int ntext = png_get_text(png, info, &text, NULL);
    if (dc_png_text_collect(text, ntext, img)) {
        snprintf(r->err, 256, "out of memory for its text");
        return 0;
    }
    return 1;
}

int dc_png_read_image(const char *path, dc_png_image *img, int force_rgb) {
    memset(img, 0, sizeof *img);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return dc_fail("%s: cannot read: out of memory", path);
    }
    reader r = {0};
    r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, on_error, on_warning);
    r.info = r.png ? png_create_info_struct(r.png) : NULL;
    int ok = 0;
    if (r.info) ok = decode(&r, fp, size, force_rgb, img);
    else snprintf(r.err, sizeof r.err, "out of memory");
    png_destroy_read_struct(&r.png, &r.info, NULL);
    free(r.raw), free(r.rows);
    fclose(fp);
    if (ok) return 0;
    dc_png_image_free(img);
    return dc_fail("%s: not a valid PNG: %s", path, r.err[0] ? r.err : "unknown error");
}

void dc_png_image_free(dc_png_image *img) {
    for (int i = 0; i < img->ntext; i++) free(img->keys[i]), free(img->values[i]);
    free(img->keys), free(img->values), free(img->data);
    memset(img, 0, sizeof *img);
}

const char *dc_png_image_text(const dc_png_image *img, const char *key) {
    for (int i = 0; i < img->ntext; i++)
        if (!strcmp(img->keys[i], key)) return img->values[i];
    return NULL;
}
