// Reading a WebP (lossy, lossless, with alpha or not) through libwebp, which
// returns a status rather than jumping: nothing here can exit or abort.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <webp/decode.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/image_internal.h"

// The first bytes, enough for libwebp to read a plain file's header.
#define HEAD_BYTES (64 << 10)
// Bytes a file may hold beyond 8 a pixel: metadata chunks (ICC, EXIF, XMP).
#define EXTRA_BYTES ((int64_t)64 << 20)

static const char *status_text(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt data";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "a feature libwebp does not support";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the file is cut short";
    default: return "error";
    }
}

static uint32_t le24(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16; }

// The size and kind of picture the header declares, from its first n bytes.
static int read_header(const char *path, const uint8_t *b, size_t n, WebPBitstreamFeatures *ft) {
    VP8StatusCode s = WebPGetFeatures(b, n, ft);
    if (s == VP8_STATUS_NOT_ENOUGH_DATA && n >= 30 && !memcmp(b + 12, "VP8X", 4)) {
        // An extended file whose metadata comes before the picture's chunk and
        // past the bytes read: its canvas (which a still picture's size must
        // match, as libwebp checks when it decodes) says the size.
        memset(ft, 0, sizeof *ft);
        ft->width = (int)le24(b + 24) + 1, ft->height = (int)le24(b + 27) + 1;
        ft->has_alpha = !!(b[20] & 0x10), ft->has_animation = !!(b[20] & 0x02);
        return 0;
    }
    if (s != VP8_STATUS_OK) return dc_fail("%s: not a valid WebP: its header: %s", path, status_text(s));
    return 0;
}

// The Exif orientation of an extended file that says it holds Exif (VP8X
// flag 0x08): its EXIF chunk found by walking the chunk headers (it follows
// the picture, so it is not among the first bytes), its first 64 KiB read.
// 1 when there is none, or no EXIF chunk among the first 1000.
static int exif_orientation(int fd, int64_t size, const uint8_t *head, size_t n) {
    if (n < 30 || memcmp(head + 12, "VP8X", 4) || !(head[20] & 0x08)) return 1;
    uint8_t h[8];
    int64_t at = 12;
    for (int k = 0; k < 1000 && at + 8 <= size; k++) {
        if (pread(fd, h, 8, (off_t)at) != 8) return 1;
        const int64_t len = (int64_t)h[4] | (int64_t)h[5] << 8 | (int64_t)h[6] << 16 | (int64_t)h[7] << 24;
        if (!memcmp(h, "EXIF", 4)) {
            uint8_t *b = malloc(1 << 16);
            const size_t m = len < (1 << 16) ? (size_t)len : (1 << 16);
            int o = b && at + 8 + (int64_t)m <= size && pread(fd, b, m, (off_t)(at + 8)) == (ssize_t)m
                        ? dc_exif_orientation(b, m)
                        : 1;
            free(b);
            return o;
        }
        at += 8 + len + (len & 1);  // chunks are padded to an even size
    }
    return 1;
}

int dc_webp_read_rgb(const char *path, int fd, int64_t size, int64_t max_pixels, int header_only, dc_image *img,
                     int *orientation) {
    memset(img, 0, sizeof *img);
    uint8_t *b = malloc(HEAD_BYTES);
    const size_t n = size < HEAD_BYTES ? (size_t)size : HEAD_BYTES;
    int rc = b ? dc_pread_exact(fd, b, n, 0, path) : dc_fail("%s: out of memory", path);
    WebPBitstreamFeatures ft;
    if (rc == 0) rc = read_header(path, b, n, &ft);
    if (rc == 0) *orientation = exif_orientation(fd, size, b, n);
    free(b);
    b = NULL;
    const int64_t w = rc ? 0 : ft.width, h = rc ? 0 : ft.height;
    if (rc == 0 && ft.has_animation)
        rc = dc_fail("%s: an animated WebP (%lldx%lld): only still pictures are read", path, (long long)w,
                     (long long)h);
    else if (rc == 0 && (w < 1 || h < 1 || w > DC_IMAGE_MAX_SIDE || h > DC_IMAGE_MAX_SIDE || w * h > max_pixels))
        rc = dc_fail("%s: a %lldx%lld WebP picture is over the limit of %lld pixels (%d a side)", path,
                     (long long)w, (long long)h, (long long)max_pixels, DC_IMAGE_MAX_SIDE);
    else if (rc == 0 && size > w * h * 8 + EXTRA_BYTES)
        rc = dc_fail("%s: not a valid WebP: %lld bytes, more than a %lldx%lld picture needs", path, (long long)size,
                     (long long)w, (long long)h);
    if (rc != 0 || header_only) {
        close(fd);
        if (rc == 0) img->width = (int)w, img->height = (int)h, img->format = DC_IMAGE_WEBP;
        return rc;
    }
    // The whole file, then the pixels straight into the result (with alpha,
    // 4 bytes a pixel, composited over white in place).
    const int ch = ft.has_alpha ? 4 : 3;
    b = malloc((size_t)size + 1);
    uint8_t *px = malloc((size_t)(w * h * ch));
    rc = b && px ? dc_pread_exact(fd, b, (size_t)size, 0, path) : dc_fail("%s: out of memory", path);
    close(fd);
    if (rc == 0) {
        WebPDecoderConfig cfg;
        if (!WebPInitDecoderConfig(&cfg)) {
            rc = dc_fail("%s: libwebp's version does not match its header", path);
        } else {
            cfg.output.colorspace = ch == 4 ? MODE_RGBA : MODE_RGB;
            cfg.output.is_external_memory = 1;
            cfg.output.u.RGBA.rgba = px;
            cfg.output.u.RGBA.stride = (int)(w * ch);
            cfg.output.u.RGBA.size = (size_t)(w * h * ch);
            VP8StatusCode s = WebPDecode(b, (size_t)size, &cfg);
            if (s != VP8_STATUS_OK) rc = dc_fail("%s: not a valid WebP: %s", path, status_text(s));
            else if (cfg.output.width != w || cfg.output.height != h)
                rc = dc_fail("%s: not a valid WebP: its picture is %dx%d, its header says %lldx%lld", path,
                             cfg.output.width, cfg.output.height, (long long)w, (long long)h);
            WebPFreeDecBuffer(&cfg.output);  // external memory: frees nothing of ours
        }
    }
    free(b);
    if (rc != 0) return free(px), -1;
    if (ch == 4) {
        dc_over_white(px, w * h, 3);
        uint8_t *p = realloc(px, (size_t)(w * h * 3));
        px = p ? p : px;
    }
    img->width = (int)w, img->height = (int)h, img->format = DC_IMAGE_WEBP, img->rgb = px;
    return 0;
}
