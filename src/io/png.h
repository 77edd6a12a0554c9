// PNG through libpng: 8-bit grayscale or RGB out, written atomically, with
// optional text chunks; any PNG in (gray, RGB, palette, with alpha, 8 or 16
// bits), refused with a message when corrupt, truncated or implausibly large.
// Float images follow torchvision.utils.save_image, so grids match the ones
// PyTorch scripts (the official DiT sample.py among them) write.
#pragma once
#include <stdint.h>

// A text chunk: key (1..79 printable ASCII characters) and value, both UTF-8.
// Written as tEXt when the value is Latin-1 encodable (as Latin-1, which is
// what tEXt holds by the PNG spec), else as iTXt (UTF-8), as Pillow's
// PngInfo.add_text (and so AUTOMATIC1111) does.
typedef struct {
    const char *key;
    const char *value;
} dc_png_text;

// pixels: [height, width, channels] interleaved u8, channels 1 (gray) or 3 (RGB).
int dc_png_write(const char *path, const uint8_t *pixels, int width, int height, int channels);
int dc_png_write_text(const char *path, const uint8_t *pixels, int width, int height, int channels,
                      const dc_png_text *text, int ntext);

// A value in [-1, 1] as a byte: floor(clamp((v + 1) / 2 * 255 + 0.5, 0, 255)),
// torchvision's save_image rounding; NaN becomes 0.
static inline uint8_t dc_pixel_u8(float v) {
    float x = (v + 1.0f) * 127.5f + 0.5f;
    if (!(x > 0.0f)) return 0;
    return x >= 255.0f ? 255 : (uint8_t)x;
}
// The inverse for bytes: dc_pixel_u8(dc_pixel_float(b)) == b for every b.
static inline float dc_pixel_float(uint8_t b) { return (float)(b / 127.5 - 1.0); }  // rounded once

// img: [channels, height, width] floats in [-1, 1], channels 1 or 3.
int dc_png_write_image(const char *path, const float *img, int channels, int height, int width);

// imgs: [n, channels, height, width] in [-1, 1], tiled row-major into a
// rows x cols grid (n <= rows * cols) with DC_PNG_GRID_PAD black pixels
// between and around the tiles, as torchvision's make_grid(padding=2).
// text/ntext: chunks to add (NULL, 0 for none).
#define DC_PNG_GRID_PAD 2
int dc_png_write_grid(const char *path, const float *imgs, int n, int channels, int height,
                      int width, int rows, int cols);
int dc_png_write_grid_text(const char *path, const float *imgs, int n, int channels, int height,
                           int width, int rows, int cols, const dc_png_text *text, int ntext);

// ---- reading

// Largest image read: 16384 pixels a side and 2^26 pixels in all (768 MiB of
// RGB floats), beyond anything a diffusion model samples at. A file must
// also be large enough to hold its pixels: deflate compresses at most 1032:1,
// so a header claiming more than 1032 raw bytes per file byte is refused
// before anything is allocated.
#define DC_PNG_MAX_SIDE 16384
#define DC_PNG_MAX_PIXELS (1 << 26)
// Text chunks (and other ancillary chunks libpng keeps, such as sPLT) are
// bounded too, as libpng's user limits: a file with more than DC_PNG_MAX_TEXT
// of them, or with an ancillary chunk over DC_PNG_MAX_CHUNK bytes (compressed
// text counted inflated), is refused, so its text costs at most 64 MiB.
#define DC_PNG_MAX_TEXT 64
#define DC_PNG_MAX_CHUNK (1 << 20)

typedef struct {
    int channels, height, width;  // channels 1 (gray) or 3 (RGB)
    float *data;                  // [channels, height, width] in [-1, 1], byte b as b / 127.5 - 1
    int ntext;
    char **keys, **values;        // [ntext] UTF-8, from tEXt, zTXt (Latin-1 converted) and iTXt
} dc_png_image;

// Reads any valid PNG. Gray and gray+alpha give 1 channel, everything else 3
// (palette expanded); force_rgb makes gray 3 channels too, as models that
// want RGB need. 16-bit samples are scaled to 8 (v * 255 / 65535, rounded).
// Alpha is composited over white (as AUTOMATIC1111 flattens an img2img
// input): out = a * c + (1 - a) * 255. Every chunk's CRC is checked, critical
// and ancillary, so a flipped bit anywhere is an error, as is a file cut short.
// On failure *img is empty and the message names path.
int dc_png_read_image(const char *path, dc_png_image *img, int force_rgb);
void dc_png_image_free(dc_png_image *img);
// The value of text chunk `key` (the first), or NULL.
const char *dc_png_image_text(const dc_png_image *img, const char *key);
