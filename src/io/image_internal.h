// The picture readers behind dc_image_read, one a format. Internal to src/io.
#pragma once
#include <stdint.h>

#include "io/image.h"

// Each takes the open file fd (and closes it), of size bytes, reads its
// header into img->width/height and checks it against max_pixels and
// DC_IMAGE_MAX_SIDE before anything is decoded; unless header_only, then
// decodes it into img->rgb, as stored. *orientation receives the Exif
// orientation the file gives (1 when none; read with the header: a PNG's eXIf
// chunk counts only before the pixels). 0, or -1 with a message naming path
// (img empty).
int dc_png_read_rgb(const char *path, int fd, int64_t size, int64_t max_pixels, int header_only, dc_image *img,
                    int *orientation);
int dc_jpeg_read_rgb(const char *path, int fd, int64_t size, int64_t max_pixels, int header_only, dc_image *img,
                     int *orientation);
int dc_webp_read_rgb(const char *path, int fd, int64_t size, int64_t max_pixels, int header_only, dc_image *img,
                     int *orientation);

// The orientation (1 to 8; 1: as stored) an Exif block gives (with or
// without its "Exif\0\0" prefix), or 1 when it has none or is malformed.
int dc_exif_orientation(const uint8_t *exif, size_t n);
// Turns img upright for that orientation, as PIL's ImageOps.exif_transpose:
// for 5 to 8 width and height swap (and only they, for a header read alone).
// On failure (out of memory) img is freed and the message names path.
int dc_image_orient(dc_image *img, int orientation, const char *path);

// Alpha over white, (a c + (255 - a) 255) / 255 rounded: [n, ch] pixels of
// ch = c + 1 channels (the last alpha) to [n, c], in place.
static inline void dc_over_white(uint8_t *px, int64_t n, int c) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = px + i * (c + 1);
        unsigned a = p[c];
        for (int k = 0; k < c; k++) px[i * c + k] = (uint8_t)((a * p[k] + (255u - a) * 255u + 127u) / 255u);
    }
}
