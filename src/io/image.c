// Picking the reader by the file's first bytes.
#include "io/image.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/image_internal.h"
#include "io/png.h"

const char *dc_image_format_name(dc_image_format f) {
    return f == DC_IMAGE_PNG ? "PNG" : f == DC_IMAGE_JPEG ? "JPEG" : f == DC_IMAGE_WEBP ? "WebP" : "?";
}

// What a file of another kind is, from its first bytes, for the message.
static const char *other_kind(const uint8_t *b, size_t n) {
    if (n >= 6 && (!memcmp(b, "GIF87a", 6) || !memcmp(b, "GIF89a", 6))) return "a GIF";
    if (n >= 4 && (!memcmp(b, "II*\0", 4) || !memcmp(b, "MM\0*", 4))) return "a TIFF";
    if (n >= 2 && !memcmp(b, "BM", 2)) return "a BMP";
    if (n >= 12 && !memcmp(b + 4, "ftyp", 4) && (!memcmp(b + 8, "avif", 4) || !memcmp(b + 8, "heic", 4)))
        return "an AVIF or HEIC";
    if (n >= 12 && !memcmp(b, "RIFF", 4)) return "a RIFF file other than WebP";
    if (n >= 9 && b[8] == '{') return "a safetensors file";
    return NULL;
}

int dc_image_read_fd(const char *path, int fd, int64_t size, dc_image *img, int64_t max_pixels, bool header_only) {
    memset(img, 0, sizeof *img);
    if (max_pixels <= 0 || max_pixels > DC_IMAGE_MAX_PIXELS) max_pixels = DC_IMAGE_MAX_PIXELS;
    uint8_t b[16] = {0};
    ssize_t n = pread(fd, b, sizeof b, 0);
    if (n < 0) {
        int e = errno;
        close(fd);
        return dc_fail("%s: cannot read: %s", path, strerror(e));
    }
    int orientation = 1, rc = -2;
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8))
        rc = dc_png_read_rgb(path, fd, size, max_pixels, header_only, img, &orientation);
    else if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff)
        rc = dc_jpeg_read_rgb(path, fd, size, max_pixels, header_only, img, &orientation);
    else if (n >= 12 && !memcmp(b, "RIFF", 4) && !memcmp(b + 8, "WEBP", 4))
        rc = dc_webp_read_rgb(path, fd, size, max_pixels, header_only, img, &orientation);
    if (rc == 0) return dc_image_orient(img, orientation, path);
    if (rc == -1) return -1;
    close(fd);
    const char *kind = other_kind(b, (size_t)n);
    if (n == 0) return dc_fail("%s: the file is empty, not a picture", path);
    return dc_fail("%s: not a PNG, JPEG or WebP picture%s%s (the formats read are told by their first bytes)", path,
                   kind ? ": it looks like " : "", kind ? kind : "");
}

static int read_any(const char *path, dc_image *img, int64_t max_pixels, bool header_only) {
    memset(img, 0, sizeof *img);
    int64_t size;
    int fd = dc_open_regular(path, &size);
    if (fd < 0) return -1;
    return dc_image_read_fd(path, fd, size, img, max_pixels, header_only);
}

int dc_image_probe(const char *path, dc_image *img) { return read_any(path, img, DC_IMAGE_MAX_PIXELS, true); }

int dc_image_read(const char *path, dc_image *img, int64_t max_pixels) {
    return read_any(path, img, max_pixels, false);
}

void dc_image_free(dc_image *img) {
    free(img->rgb);
    memset(img, 0, sizeof *img);
}

void dc_image_to_chw(const dc_image *img, float *out) {
    const size_t plane = (size_t)img->width * img->height;
    for (size_t i = 0; i < plane; i++)
        for (int k = 0; k < 3; k++) out[(size_t)k * plane + i] = dc_pixel_float(img->rgb[i * 3 + k]);
}
