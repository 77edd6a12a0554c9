// Reading a PNG: into floats with its text (dc_png_read_image), or into RGB
// bytes for dc_image_read. libpng reports errors by longjmp, so all that
// decode() allocates lives in a struct owned by its caller (not in locals
// that setjmp would leave indeterminate), which frees it on every path.
#include <png.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/image_internal.h"
#include "io/png.h"
#include "io/png_text.h"

// Deflate's best ratio: 258-byte matches at about 2 bits each, 1032:1.
#define DEFLATE_MAX_RATIO 1032

typedef struct {
    png_structp png;
    png_infop info;
    uint8_t *px;       // [height, width, ch] after libpng's transforms; then, alpha
                       // composited in place, [height, width, channels]
    png_bytep *rows;   // [height] into px
    int width, height, channels;  // channels 1 (gray) or 3 (RGB), alpha gone
    int orientation;   // Exif's, from an eXIf chunk before the pixels (0: none)
    bool too_large;    // err says the picture is over the budget (the file may well be valid)
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

// 1 on success; 0 with r->err set. The header is checked against max_pixels
// before anything is allocated; unless header_only, the pixels are then
// decoded into r->px and the file read to IEND, so a file cut anywhere fails.
// text (may be NULL) receives the text chunks.
static int decode(reader *r, FILE *fp, int64_t file_size, int64_t max_pixels, int force_rgb, int header_only,
                  dc_png_image *text) {
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
    if ((int64_t)w * h > max_pixels) {
        snprintf(r->err, 256, "a %ux%u PNG picture is over the limit of %lld pixels", (unsigned)w, (unsigned)h,
                 (long long)max_pixels);
        r->too_large = true;
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
    r->width = (int)w, r->height = (int)h;
    png_uint_32 nexif;
    png_bytep exif;
    if (png_get_eXIf_1(png, info, &nexif, &exif)) r->orientation = dc_exif_orientation(exif, nexif);
    if (header_only) return 1;
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
    r->px = malloc((size_t)h * rowbytes);
    r->rows = malloc((size_t)h * sizeof *r->rows);
    if (!r->px || !r->rows) {
        snprintf(r->err, 256, "out of memory for %ux%u pixels", (unsigned)w, (unsigned)h);
        return 0;
    }
    for (png_uint_32 y = 0; y < h; y++) r->rows[y] = r->px + (size_t)y * rowbytes;
    png_read_image(png, r->rows);
    png_read_end(png, info);  // text after the pixels joins the text before them in info

    int alpha = !(ch & 1);
    r->channels = alpha ? ch - 1 : ch;
    if (alpha) dc_over_white(r->px, (int64_t)w * h, r->channels);
    if (text) {
        png_textp t;
        int ntext = png_get_text(png, info, &t, NULL);
        if (dc_png_text_collect(t, ntext, text)) {
            snprintf(r->err, 256, "out of memory for its text");
            return 0;
        }
    }
    return 1;
}

// Decodes the PNG open as fd (closing it) into r; 0, or -1 with a message.
static int read_png(const char *path, int fd, int64_t size, int64_t max_pixels, int force_rgb, int header_only,
                    dc_png_image *text, reader *r) {
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return dc_fail("%s: cannot read: out of memory", path);
    }
    r->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, r, on_error, on_warning);
    r->info = r->png ? png_create_info_struct(r->png) : NULL;
    int ok = 0;
    if (r->info) ok = decode(r, fp, size, max_pixels, force_rgb, header_only, text);
    else snprintf(r->err, sizeof r->err, "out of memory");
    png_destroy_read_struct(&r->png, &r->info, NULL);
    free(r->rows);
    r->rows = NULL;
    fclose(fp);
    if (ok) return 0;
    free(r->px);
    r->px = NULL;
    return dc_fail("%s: %s%s", path, r->too_large ? "" : "not a valid PNG: ", r->err[0] ? r->err : "unknown error");
}

int dc_png_read_image(const char *path, dc_png_image *img, int force_rgb) {
    memset(img, 0, sizeof *img);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    reader r = {0};
    if (read_png(path, fd, size, DC_PNG_MAX_PIXELS, force_rgb, 0, img, &r) != 0) return dc_png_image_free(img), -1;
    const int c = r.channels;
    const size_t plane = (size_t)r.height * r.width;
    img->channels = c, img->height = r.height, img->width = r.width;
    img->data = malloc((size_t)c * plane * sizeof *img->data);
    if (!img->data) {
        free(r.px);
        dc_png_image_free(img);
        return dc_fail("%s: out of memory for %dx%d pixels", path, r.width, r.height);
    }
    for (size_t i = 0; i < plane; i++)
        for (int k = 0; k < c; k++) img->data[(size_t)k * plane + i] = dc_pixel_float(r.px[i * c + k]);
    free(r.px);
    return 0;
}

int dc_png_read_rgb(const char *path, int fd, int64_t size, int64_t max_pixels, int header_only, dc_image *img,
                    int *orientation) {
    memset(img, 0, sizeof *img);
    reader r = {0};
    DC_TRY(read_png(path, fd, size, max_pixels, 1, header_only, NULL, &r));
    *orientation = r.orientation ? r.orientation : 1;
    img->width = r.width, img->height = r.height, img->format = DC_IMAGE_PNG;
    if (header_only) return 0;
    // RGBA composited to RGB leaves a quarter unused
    uint8_t *px = realloc(r.px, (size_t)r.height * r.width * 3);
    img->rgb = px ? px : r.px;
    return 0;
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
