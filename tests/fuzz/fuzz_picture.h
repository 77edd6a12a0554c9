// The body of the picture harnesses (fuzz_jpeg, fuzz_webp): what any input
// must give through dc_image_read, the reader img2img uses. The first input
// byte picks a resize (bits 0-1: mode; bits 2-7: 1 + the size's side in
// 4-pixel steps), the rest is the file. A read under a budget of 2^20 pixels
// (so no input justifies more than about 12 MB) must either fail leaving
// the picture empty with a message naming the file, or give a picture of 1
// to 2^20 pixels whose header the probe reads alike (in whichever format the
// mutated first bytes now name); it is then resized, which must give the
// size asked for.
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fuzz/fuzz_util.h"
#include "io/image.h"

#define FUZZ_PICTURE_BUDGET (1 << 20)

static inline int fuzz_picture(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0] & 3, side = 1 + 4 * (data[0] >> 2);
    const char *in = fuzz_path("in.png");  // a name the cleanup knows; the reader goes by the content
    fuzz_write(in, data + 1, size - 1, 0);
    dc_image img, probe;
    int rc = dc_image_read(in, &img, FUZZ_PICTURE_BUDGET);
    int prc = dc_image_probe(in, &probe);
    unlink(in);
    if (rc != 0) {
        if (img.rgb || img.width || img.height || !strstr(dc_error(), in)) abort();
        return 0;
    }
    if (img.format > DC_IMAGE_WEBP || !img.rgb || img.width < 1 || img.height < 1 ||
        (int64_t)img.width * img.height > FUZZ_PICTURE_BUDGET || prc != 0 || probe.width != img.width ||
        probe.height != img.height || probe.format != img.format || probe.rgb)
        abort();
    // every byte readable (ASan checks the buffer's size)
    unsigned sum = 0;
    for (size_t i = 0; i < (size_t)img.width * img.height * 3; i++) sum += img.rgb[i];
    dc_image out;
    if (mode < 3) {
        if (dc_image_fit(&img, side, side + (int)(sum & 7), (dc_resize_mode)mode, &out) != 0 || !out.rgb ||
            out.width != side || out.height != side + (int)(sum & 7))
            abort();
        dc_image_free(&out);
    }
    dc_image_free(&img);
    return 0;
}
