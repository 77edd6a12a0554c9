// PNG output through libpng: 8-bit grayscale or RGB, written atomically.
// Float images follow torchvision.utils.save_image, so grids match the ones
// PyTorch scripts (the official DiT sample.py among them) write.
#pragma once
#include <stdint.h>

// pixels: [height, width, channels] interleaved u8, channels 1 (gray) or 3 (RGB).
int dc_png_write(const char *path, const uint8_t *pixels, int width, int height, int channels);

// A value in [-1, 1] as a byte: floor(clamp((v + 1) / 2 * 255 + 0.5, 0, 255)),
// torchvision's save_image rounding; NaN becomes 0.
static inline uint8_t dc_pixel_u8(float v) {
    float x = (v + 1.0f) * 127.5f + 0.5f;
    if (!(x > 0.0f)) return 0;
    return x >= 255.0f ? 255 : (uint8_t)x;
}

// img: [channels, height, width] floats in [-1, 1], channels 1 or 3.
int dc_png_write_image(const char *path, const float *img, int channels, int height, int width);

// imgs: [n, channels, height, width] in [-1, 1], tiled row-major into a
// rows x cols grid (n <= rows * cols) with DC_PNG_GRID_PAD black pixels
// between and around the tiles, as torchvision's make_grid(padding=2).
#define DC_PNG_GRID_PAD 2
int dc_png_write_grid(const char *path, const float *imgs, int n, int channels, int height,
                      int width, int rows, int cols);
