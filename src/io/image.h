// Pictures in: PNG (libpng), JPEG (libjpeg-turbo) and WebP (libwebp), told
// apart by their first bytes whatever the file is called, read as 8-bit RGB;
// and resized to the size a command makes as AUTOMATIC1111's img2img does.
//
// A picture's size is checked against a budget from its header, before
// anything is decoded or allocated, so a small file that declares a huge
// picture costs nothing. Decoding then costs at most about 12 bytes a pixel
// of the budget (the RGB result plus what the decoders keep: the raw rows of
// a PNG, a progressive JPEG's coefficients, a lossless WebP's ARGB plane).
//
// Every colour model becomes RGB: gray is repeated, CMYK (Adobe's inverted
// form included) converted as PIL's convert("RGB") does, R = (255 - K) -
// C (255 - K) / 255 rounded, and alpha is composited over white, out = a c + (1 - a) 255, as
// AUTOMATIC1111 flattens an img2img input (images.flatten with its default
// white background) rather than dropping it as PIL's convert("RGB") would.
// A picture whose Exif says it is stored turned (a phone's portrait photo)
// is turned upright, as AUTOMATIC1111 does with PIL's exif_transpose; the
// Exif block is read from a JPEG's APP1 marker, a WebP's EXIF chunk, or a
// PNG's eXIf chunk before its pixels.
// A corrupt, truncated or unsupported file (an animated WebP, a JPEG of more
// than DC_JPEG_MAX_SCANS scans) is refused with a message naming it.
#pragma once
#include <stdbool.h>
#include <stdint.h>

// The hard limits, whatever the budget: 16384 pixels a side, and a default
// budget of 2^26 pixels (8192 x 8192, a 50-megapixel photograph), costing at
// most about 768 MiB while it decodes.
#define DC_IMAGE_MAX_SIDE 16384
#define DC_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
// A progressive JPEG rereads its whole coefficient buffer for every scan;
// real encoders write about ten. More than this many is refused, as
// libjpeg-turbo advises for untrusted files (its TJPARAM_SCANLIMIT).
#define DC_JPEG_MAX_SCANS 500

typedef enum { DC_IMAGE_PNG, DC_IMAGE_JPEG, DC_IMAGE_WEBP } dc_image_format;

typedef struct {
    int width, height;
    dc_image_format format;
    uint8_t *rgb;  // [height, width, 3]
} dc_image;

// Reads the header only: format, width and height, those of the picture
// turned upright (rgb stays NULL).
int dc_image_probe(const char *path, dc_image *img);
// Reads a picture whose header declares at most max_pixels pixels (0: the
// default budget, DC_IMAGE_MAX_PIXELS; never more than that). On failure *img
// is empty and the message names path and what is wrong.
int dc_image_read(const char *path, dc_image *img, int64_t max_pixels);
// The same from an open file of `size` bytes whose picture starts at byte 0
// (a tar member copied into memory: io/picture_set.c); the call closes fd.
// `path` names the picture in messages; header_only reads what
// dc_image_probe reads.
int dc_image_read_fd(const char *path, int fd, int64_t size, dc_image *img, int64_t max_pixels, bool header_only);
void dc_image_free(dc_image *img);
const char *dc_image_format_name(dc_image_format f);  // "PNG", "JPEG", "WebP"
// The pixels as [3, height, width] floats in [-1, 1], byte b as b / 127.5 - 1
// (dc_pixel_float: the values a PNG of this picture reads as).
void dc_image_to_chw(const dc_image *img, float *out);

// ---- resizing

// AUTOMATIC1111's resize modes (modules/images.py, resize_image), each onto
// a black width x height canvas:
//   DC_RESIZE_JUST ("Just resize", its default): the picture stretched to
//     width x height.
//   DC_RESIZE_CROP ("Crop and resize"): scaled, keeping its proportions, to
//     cover the canvas (src_w = width, src_h = h * width // w, or the other
//     way round), centred (offset width // 2 - src_w // 2), the excess cut.
//   DC_RESIZE_FILL ("Resize and fill"): scaled to fit inside, centred, and the
//     bands left over filled with the scaled picture's edge: a box of no
//     height at its first and last rows (or columns) resampled to the band's
//     size, which PIL makes a blend of the two rows nearest the edge, with
//     PIL's default filter, bicubic, as A1111 names no filter there.
// Every other scaling is PIL's Image.resize with LANCZOS (dc_image_resample).
typedef enum { DC_RESIZE_JUST, DC_RESIZE_CROP, DC_RESIZE_FILL } dc_resize_mode;
// "resize", "crop" or "fill" (the command line's names); 0, or -1 with a message.
int dc_resize_mode_parse(const char *s, dc_resize_mode *mode);
const char *dc_resize_mode_name(dc_resize_mode mode);
// out: a new width x height picture (1..DC_IMAGE_MAX_SIDE a side).
int dc_image_fit(const dc_image *src, int width, int height, dc_resize_mode mode, dc_image *out);

// A region of the source in pixel units, as PIL's resize takes it: x0 <= x1,
// y0 <= y1, within the picture; a side of length 0 samples the edge there.
typedef struct {
    double x0, y0, x1, y1;
} dc_box;
// PIL's filters: LANCZOS (sinc(t) sinc(t / 3) on |t| < 3) and BICUBIC
// (bicubic convolution, a = -0.5, on |t| < 2; Image.resize's default).
typedef enum { DC_FILTER_LANCZOS, DC_FILTER_BICUBIC } dc_filter;
// PIL's Image.resize((out_w, out_h), filter, box) (its Resample.c): for each
// output pixel x, the filter, stretched by scale = (x1 - x0) / out_w when
// that is over 1, is centred at x0 + (x + 0.5) scale; its taps are the pixels
// i with i + 0.5 inside its support, clipped to the picture, and their
// weights renormalised to sum 1. Rows, then columns, each pass rounded and
// clipped to bytes as PIL's is (its clipping of the first pass's overshoot
// shows), in PIL's fixed point (weights in units of 2^-22): the very bytes
// PIL makes (against Pillow 9.4 through AUTOMATIC1111's three modes, 18
// million bytes of random pictures from 1 to 700 pixels a side, every one
// equal). Only the part [ox, ox + w) x [oy, oy + h)
// of the out_w x out_h result is made, into dst (rows of dst_stride bytes): a
// large picture cropped costs only what is kept.
int dc_image_resample(const dc_image *src, dc_filter filter, dc_box box, int out_w, int out_h, int ox, int oy,
                      int w, int h, uint8_t *dst, int64_t dst_stride);
