// Writing pictures in the formats dc_image_read takes, with the libraries'
// own encoders, for tests, fuzz seeds and tools/make_picture: JPEG (gray,
// RGB, CMYK with or without Adobe's inverted form, baseline or progressive,
// any chroma subsampling, restart markers, a scan script of many scans), WebP
// (lossy or lossless, with alpha or not) and PNG with alpha; each may carry an
// Exif orientation. Each returns 0, or -1 (with a line on stderr).
#pragma once
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <webp/encode.h>

// An Exif block (TIFF structure: header, IFD0 with the one entry) giving
// orientation 1..8, in either byte order, into b[26]; its length.
static inline int pic_exif(uint8_t *b, int orientation, int big_endian) {
    // "MM", 42, IFD0 at 8; 1 entry: tag 0x0112, type SHORT (3), 1 value, the value; no next IFD
    static const uint8_t be[26] = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0,
                                   3,   0,   0, 0,  1, 0, 0, 0, 0, 0, 0,    0,    0};
    static const uint8_t le[26] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3,
                                   0,   1,   0,  0, 0, 0, 0, 0, 0, 0, 0,    0,    0};
    memcpy(b, big_endian ? be : le, 26);
    b[big_endian ? 19 : 18] = (uint8_t)orientation;
    return 26;
}

typedef struct {
    int quality;      // 1..100
    int progressive;  // libjpeg's standard progressive script
    int subsample;    // 1: chroma at half size both ways (4:2:0), 0: full (4:4:4)
    int adobe;        // CMYK: stored inverted with an Adobe marker (as Photoshop writes)
    int restart;      // restart marker every this many MCU rows (0: none)
    int many_scans;   // a progressive script of this many scans at least (one gray component)
    int exif;         // an Exif APP1 marker with this orientation (0: none)
    int exif_be;      // in big-endian (Motorola) byte order, else little-endian
} pic_jpeg_opts;

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
} pic_jpeg_err;

static inline void pic_jpeg_fail(j_common_ptr c) {
    char msg[JMSG_LENGTH_MAX];
    c->err->format_message(c, msg);
    fprintf(stderr, "pictures: libjpeg: %s\n", msg);
    longjmp(((pic_jpeg_err *)c->err)->jump, 1);
}

// A gray component's scan script of about n scans: the DC, then each of the
// 63 AC coefficients on its own, first at a point transform of al, then
// refined a bit at a time (a valid, if absurd, progression).
static inline jpeg_scan_info *pic_many_scans(int n, int *count) {
    int al = (n - 1) / 63 + 1;
    if (al > 10) al = 10;
    jpeg_scan_info *s = calloc((size_t)(1 + 63 * (al + 1)), sizeof *s);
    int k = 0;
    s[k++] = (jpeg_scan_info){1, {0}, 0, 0, 0, 0};
    for (int c = 1; c < 64; c++)
        for (int a = al; a >= 0; a--)
            s[k++] = (jpeg_scan_info){1, {0}, c, c, a == al ? 0 : a + 1, a};
    *count = k;
    return s;
}

// The encoding, apart so that nothing it uses changes between setjmp and a longjmp.
static inline int pic_jpeg_encode(FILE *f, const uint8_t *px, int w, int h, int comps, pic_jpeg_opts o,
                           jpeg_scan_info *scans, int nscans, uint8_t *row) {
    struct jpeg_compress_struct c;
    pic_jpeg_err e;
    c.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = pic_jpeg_fail;
    if (setjmp(e.jump)) {
        jpeg_destroy_compress(&c);
        return -1;
    }
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = comps;
    c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    if (comps == 4) {
        jpeg_set_colorspace(&c, JCS_CMYK);
        c.write_Adobe_marker = o.adobe ? TRUE : FALSE;
    }
    jpeg_set_quality(&c, o.quality, TRUE);
    for (int i = 0; i < c.num_components; i++)
        c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = i == 0 && o.subsample && comps == 3 ? 2 : 1;
    if (o.progressive) jpeg_simple_progression(&c);
    if (scans) c.scan_info = scans, c.num_scans = nscans;
    c.restart_in_rows = o.restart;
    jpeg_start_compress(&c, TRUE);
    if (o.exif) {
        uint8_t m[6 + 26] = {'E', 'x', 'i', 'f', 0, 0};
        jpeg_write_marker(&c, JPEG_APP0 + 1, m, (unsigned)(6 + pic_exif(m + 6, o.exif, o.exif_be)));
    }
    while (c.next_scanline < c.image_height) {
        const uint8_t *src = px + (size_t)c.next_scanline * w * comps;
        for (int i = 0; i < w * comps; i++) row[i] = comps == 4 && o.adobe ? (uint8_t)(255 - src[i]) : src[i];
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return 0;
}

// px: [h, w, comps] (comps 1 gray, 3 RGB, 4 CMYK as ink amounts, 255 = full).
static inline int pic_write_jpeg(const char *path, const uint8_t *px, int w, int h, int comps, pic_jpeg_opts o) {
    FILE *f = fopen(path, "wb");
    if (!f) return fprintf(stderr, "pictures: cannot write %s\n", path), -1;
    int nscans = 0;
    jpeg_scan_info *scans = o.many_scans && comps == 1 ? pic_many_scans(o.many_scans, &nscans) : NULL;
    uint8_t *row = malloc((size_t)w * comps);
    int rc = row ? pic_jpeg_encode(f, px, w, h, comps, o, scans, nscans, row) : -1;
    free(scans), free(row);
    return fclose(f) == 0 ? rc : -1;
}

// px: [h, w, ch], ch 3 (RGB) or 4 (RGBA). quality < 0: lossless (the RGB
// under alpha 0 kept exactly).
static inline int pic_write_webp(const char *path, const uint8_t *px, int w, int h, int ch, float quality) {
    WebPConfig cfg;
    WebPPicture pic;
    if (!WebPConfigInit(&cfg) || !WebPPictureInit(&pic)) return fprintf(stderr, "pictures: libwebp init\n"), -1;
    cfg.lossless = quality < 0;
    cfg.quality = quality < 0 ? 50 : quality;
    cfg.exact = 1;
    pic.use_argb = cfg.lossless;
    pic.width = w, pic.height = h;
    WebPMemoryWriter mem;
    WebPMemoryWriterInit(&mem);
    pic.writer = WebPMemoryWrite, pic.custom_ptr = &mem;
    int ok = ch == 4 ? WebPPictureImportRGBA(&pic, px, w * 4) : WebPPictureImportRGB(&pic, px, w * 3);
    ok = ok && WebPEncode(&cfg, &pic);
    WebPPictureFree(&pic);
    FILE *f = ok ? fopen(path, "wb") : NULL;
    ok = f && fwrite(mem.mem, 1, mem.size, f) == mem.size;
    if (f) ok = fclose(f) == 0 && ok;
    WebPMemoryWriterClear(&mem);
    if (!ok) fprintf(stderr, "pictures: cannot write WebP %s\n", path);
    return ok ? 0 : -1;
}

static inline void pic_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

// Rewrites a simple WebP (RIFF, one VP8 or VP8L chunk) of w x h without
// alpha as an extended one (VP8X) whose EXIF chunk, after the picture, gives
// the orientation.
static inline int pic_webp_add_exif(const char *path, int w, int h, int orientation, int big_endian) {
    FILE *f = fopen(path, "rb");
    uint8_t *in = malloc(1 << 22), *out = malloc((1 << 22) + 64);
    size_t n = f && in && out ? fread(in, 1, 1 << 22, f) : 0;
    if (f) fclose(f);
    int ok = n > 20 && n < (1 << 22) && !memcmp(in + 12, "VP8", 3);
    if (ok) {
        uint8_t vp8x[18] = {'V', 'P', '8', 'X', 10, 0, 0, 0, 0x08};
        vp8x[12] = (uint8_t)(w - 1), vp8x[13] = (uint8_t)((w - 1) >> 8), vp8x[14] = (uint8_t)((w - 1) >> 16);
        vp8x[15] = (uint8_t)(h - 1), vp8x[16] = (uint8_t)((h - 1) >> 8), vp8x[17] = (uint8_t)((h - 1) >> 16);
        size_t o = 12;
        memcpy(out + o, vp8x, 18), o += 18;
        memcpy(out + o, in + 12, n - 12), o += n - 12;  // the picture's chunk
        memcpy(out + o, "EXIF", 4), pic_le32(out + o + 4, 26), o += 8;
        o += (size_t)pic_exif(out + o, orientation, big_endian);
        memcpy(out, "RIFF", 4), pic_le32(out + 4, (uint32_t)(o - 8)), memcpy(out + 8, "WEBP", 4);
        f = fopen(path, "wb");
        ok = f && fwrite(out, 1, o, f) == o;
        if (f) ok = fclose(f) == 0 && ok;
    }
    free(in), free(out);
    if (!ok) fprintf(stderr, "pictures: cannot add Exif to %s\n", path);
    return ok ? 0 : -1;
}

// px: [h, w, ch]: 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA; 8 bits. exif (may be
// NULL): an eXIf chunk's bytes, before the pixels.
static inline int pic_write_png(const char *path, const uint8_t *px, int w, int h, int ch, const uint8_t *exif,
                                int nexif) {
    FILE *f = fopen(path, "wb");
    if (!f) return fprintf(stderr, "pictures: cannot write %s\n", path), -1;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return -1;
    }
    static const int color[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                PNG_COLOR_TYPE_RGB_ALPHA};
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, color[ch], PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (exif) png_set_eXIf_1(png, info, (png_uint_32)nexif, (png_bytep)exif);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, px + (size_t)y * w * ch);
    png_write_end(png, NULL);  // with info, libpng 1.6.39 writes eXIf a second time, after the pixels
    png_destroy_write_struct(&png, &info);
    return fclose(f) == 0 ? 0 : -1;
}
