// libFuzzer harness for the PNG reader (dc_png_read_image), the input of
// img2img. The first input byte's bit 0 asks for RGB (force_rgb), bit 1 to
// correct every chunk's CRC first (else nearly every mutation stops at a
// CRC check, and libpng's chunk parsers behind it are never reached); the
// rest is the file. A read that succeeds must give 1 or 3 channels, sides within the
// limits, every value one of the 256 byte levels in [-1, 1], and text chunks
// with keys and values; the pixels must then write back as a PNG that reads
// to the same values, with its text.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "io/png.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

// Rewrites the CRC of each whole chunk after the 8-byte signature.
static void fix_crcs(uint8_t *b, size_t n) {
    for (size_t i = 8; i + 12 <= n;) {
        uint32_t len = be32(b + i);
        if (len > n - i - 12) break;
        uint32_t crc = (uint32_t)crc32(0, b + i + 4, 4 + len);
        uint8_t *c = b + i + 8 + len;
        c[0] = (uint8_t)(crc >> 24), c[1] = (uint8_t)(crc >> 16), c[2] = (uint8_t)(crc >> 8), c[3] = (uint8_t)crc;
        i += 12 + (size_t)len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int force_rgb = data[0] & 1;
    const char *in = fuzz_path("in.png"), *out = fuzz_path("out.png");
    uint8_t *file = malloc(size);
    if (!file) abort();
    memcpy(file, data + 1, size - 1);
    if (data[0] & 2) fix_crcs(file, size - 1);
    fuzz_write(in, file, size - 1, 0);
    free(file);
    dc_png_image im;
    int rc = dc_png_read_image(in, &im, force_rgb);
    unlink(in);  // the scratch folder is left empty for fuzz_cleanup
    if (rc != 0) {
        if (im.data || im.keys || im.values || im.ntext) abort();  // a failed read leaves nothing
        return 0;
    }
    if ((im.channels != 1 && im.channels != 3) || (force_rgb && im.channels != 3) || im.height < 1 ||
        im.width < 1 || im.height > DC_PNG_MAX_SIDE || im.width > DC_PNG_MAX_SIDE ||
        (int64_t)im.height * im.width > DC_PNG_MAX_PIXELS || im.ntext < 0 || im.ntext > DC_PNG_MAX_TEXT)
        abort();
    size_t n = (size_t)im.channels * im.height * im.width;
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(im.data[i]) <= 1.0f) || dc_pixel_float(dc_pixel_u8(im.data[i])) != im.data[i]) abort();
    dc_png_text t[DC_PNG_MAX_TEXT];
    int nt = 0;
    for (int i = 0; i < im.ntext; i++) {
        if (!im.keys[i] || !im.values[i]) abort();
        t[nt++] = (dc_png_text){im.keys[i], im.values[i]};
    }
    // Round trip through the writer; text it refuses (keys outside ASCII,
    // values not UTF-8) is left out.
    if (dc_png_write_grid_text(out, im.data, 1, im.channels, im.height, im.width, 1, 1, t, nt) != 0 &&
        dc_png_write_grid_text(out, im.data, 1, im.channels, im.height, im.width, 1, 1, NULL, 0) != 0)
        abort();
    dc_png_image back;
    rc = dc_png_read_image(out, &back, 0);
    unlink(out);
    if (rc != 0 || back.channels != im.channels || back.height != im.height ||
        back.width != im.width || memcmp(back.data, im.data, n * sizeof *im.data) != 0)
        abort();
    dc_png_image_free(&back);
    dc_png_image_free(&im);
    return 0;
}
