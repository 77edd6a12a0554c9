// Exif orientation: which way up the camera held the picture (tag 0x0112 of
// IFD0 in the Exif block's TIFF structure), and turning the pixels upright
// as PIL's ImageOps.exif_transpose does, which AUTOMATIC1111 applies to an
// img2img input (images.fix_image). A phone's portrait photograph is stored
// sideways with orientation 6.
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/image_internal.h"

static uint32_t rd16(const uint8_t *p, bool be) { return be ? (uint32_t)p[0] << 8 | p[1] : (uint32_t)p[1] << 8 | p[0]; }
static uint32_t rd32(const uint8_t *p, bool be) {
    return be ? rd16(p, be) << 16 | rd16(p + 2, be) : rd16(p + 2, be) << 16 | rd16(p, be);
}

int dc_exif_orientation(const uint8_t *b, size_t n) {
    if (n >= 6 && !memcmp(b, "Exif\0\0", 6)) b += 6, n -= 6;  // as JPEG's APP1 and some WebP writers hold it
    if (n < 8) return 1;
    bool be;
    if (!memcmp(b, "MM\0*", 4)) be = true;
    else if (!memcmp(b, "II*\0", 4)) be = false;
    else return 1;
    const uint64_t ifd = rd32(b + 4, be);
    if (ifd < 8 || ifd + 2 > n) return 1;
    const uint32_t count = rd16(b + ifd, be);
    for (uint32_t i = 0; i < count; i++) {
        const uint64_t e = ifd + 2 + 12ull * i;
        if (e + 12 > n) return 1;
        if (rd16(b + e, be) != 0x0112) continue;
        const uint32_t type = rd16(b + e + 2, be), values = rd32(b + e + 4, be);
        // a SHORT (as the standard has it) or a LONG, held in the entry itself
        uint32_t v = values != 1 ? 1 : type == 3 ? rd16(b + e + 8, be) : type == 4 ? rd32(b + e + 8, be) : 1;
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}

int dc_image_orient(dc_image *img, int orientation, const char *path) {
    if (orientation <= 1 || orientation > 8) return 0;
    const int W = img->width, H = img->height;
    if (orientation >= 5) img->width = H, img->height = W;  // a quarter turn or a transposition
    if (!img->rgb) return 0;                                // the header alone
    uint8_t *out = malloc((size_t)W * H * 3);
    if (!out) return free(img->rgb), memset(img, 0, sizeof *img), dc_fail("%s: out of memory turning it", path);
    const int ow = img->width, oh = img->height;
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            int sx, sy;  // where output (x, y) comes from; PIL's names for each
            switch (orientation) {
            case 2: sx = W - 1 - x, sy = y; break;          // FLIP_LEFT_RIGHT
            case 3: sx = W - 1 - x, sy = H - 1 - y; break;  // ROTATE_180
            case 4: sx = x, sy = H - 1 - y; break;          // FLIP_TOP_BOTTOM
            case 5: sx = y, sy = x; break;                  // TRANSPOSE
            case 6: sx = y, sy = H - 1 - x; break;          // ROTATE_270 (a quarter turn clockwise)
            case 7: sx = W - 1 - y, sy = H - 1 - x; break;  // TRANSVERSE
            default: sx = W - 1 - y, sy = x; break;         // 8: ROTATE_90 (counter-clockwise)
            }
            memcpy(out + ((size_t)y * ow + x) * 3, img->rgb + ((size_t)sy * W + sx) * 3, 3);
        }
    free(img->rgb);
    img->rgb = out;
    return 0;
}
