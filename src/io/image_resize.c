// Resizing pictures as AUTOMATIC1111's img2img does: PIL's Lanczos resample
// (its Resample.c, for 8-bit RGB) and the three resize modes built on it.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/image.h"

// The filters as PIL defines them (Resample.c, written as it writes them, so
// that the weights round alike): Lanczos-3, sinc(x) sinc(x / 3) on [-3, 3),
// and bicubic convolution with a = -0.5 on (-2, 2).
static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos(double x) { return x >= -3.0 && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0; }

static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

// PIL's fixed point for 8-bit pictures: weights in units of 2^-22, sums in
// 32 bits, half a unit added before the shift (rounding half up).
#define PRECISION_BITS 22

// One axis: for outputs o0 .. o0 + n - 1 of out_size, the first source
// pixel, the number of taps and their weights (PIL's precompute_coeffs and
// normalize_coeffs_8bpc).
typedef struct {
    int n, k;     // outputs, most taps
    int *lo;      // [n]
    int *taps;    // [n]
    int32_t *w;   // [n, k]
} coeffs;

static void coeffs_free(coeffs *c) { free(c->lo), free(c->taps), free(c->w); }

static int coeffs_make(coeffs *c, dc_filter f, int in_size, double in0, double in1, int64_t out_size, int64_t o0,
                       int n) {
    memset(c, 0, sizeof *c);
    double (*kernel)(double) = f == DC_FILTER_BICUBIC ? bicubic : lanczos;
    const double scale = (in1 - in0) / (double)out_size;
    const double fs = scale < 1.0 ? 1.0 : scale, support = (f == DC_FILTER_BICUBIC ? 2.0 : 3.0) * fs;
    c->n = n, c->k = (int)ceil(support) * 2 + 1;
    c->lo = malloc(sizeof *c->lo * (size_t)n), c->taps = malloc(sizeof *c->taps * (size_t)n);
    c->w = malloc(sizeof *c->w * (size_t)n * (size_t)c->k);
    double *t = malloc(sizeof *t * (size_t)c->k);
    if (!c->lo || !c->taps || !c->w || !t) return free(t), coeffs_free(c), dc_fail("resize: out of memory");
    for (int j = 0; j < n; j++) {
        const double center = in0 + ((double)(o0 + j) + 0.5) * scale;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);  // truncated, as PIL
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        int m = hi - lo < 0 ? 0 : hi - lo > c->k ? c->k : hi - lo;
        double sum = 0;
        for (int i = 0; i < m; i++) sum += t[i] = kernel(((double)(lo + i) - center + 0.5) * (1.0 / fs));
        c->lo[j] = lo, c->taps[j] = m;
        for (int i = 0; i < c->k; i++) {
            double v = i < m && sum != 0.0 ? t[i] / sum : 0.0;
            c->w[(size_t)j * c->k + i] = (int32_t)(v * (1 << PRECISION_BITS) + (v < 0 ? -0.5 : 0.5));
        }
    }
    free(t);
    return 0;
}

// A sum of bytes times weights, plus half a unit, to a byte (PIL's clip8).
static uint8_t to_byte(int32_t v) {
    v >>= PRECISION_BITS;  // arithmetic: a negative sum gives a negative value
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

// Output rows a band: the source rows they take are filtered along x once per band.
#define BAND 64

// The source rows [*lo, *hi) that outputs j0 .. j1 - 1 take.
static void band_rows(const coeffs *cy, int j0, int j1, int *lo, int *hi) {
    *lo = cy->lo[j0], *hi = 0;
    for (int j = j0; j < j1; j++) {
        if (cy->lo[j] < *lo) *lo = cy->lo[j];
        if (cy->lo[j] + cy->taps[j] > *hi) *hi = cy->lo[j] + cy->taps[j];
    }
}

int dc_image_resample(const dc_image *src, dc_filter filter, dc_box box, int out_w, int out_h, int ox, int oy,
                      int w, int h, uint8_t *dst, int64_t dst_stride) {
    const int sw = src->width, sh = src->height;
    if (w <= 0 || h <= 0) return 0;
    if (!(box.x0 >= 0 && box.x0 <= box.x1 && box.x1 <= sw && box.y0 >= 0 && box.y0 <= box.y1 && box.y1 <= sh) ||
        out_w < 1 || out_h < 1 || ox < 0 || oy < 0 || (int64_t)ox + w > out_w || (int64_t)oy + h > out_h)
        return dc_fail("resize: box or window outside the picture");
    coeffs cx, cy;
    DC_TRY(coeffs_make(&cx, filter, sw, box.x0, box.x1, out_w, ox, w));
    if (coeffs_make(&cy, filter, sh, box.y0, box.y1, out_h, oy, h) != 0) return coeffs_free(&cx), -1;
    // Rows as they are when the box spans them whole at the same size, as PIL skips that pass.
    const bool same_x = box.x0 == 0 && box.x1 == sw && out_w == sw;
    int most = 0;  // source rows one band needs at most
    for (int j0 = 0, lo, hi; j0 < h; j0 += BAND) {
        band_rows(&cy, j0, j0 + BAND < h ? j0 + BAND : h, &lo, &hi);
        if (hi - lo > most) most = hi - lo;
    }
    uint8_t *tmp = malloc((size_t)most * w * 3 + 1);  // [rows, w, 3]
    if (!tmp) return coeffs_free(&cx), coeffs_free(&cy), dc_fail("resize: out of memory");
    for (int j0 = 0; j0 < h; j0 += BAND) {
        const int j1 = j0 + BAND < h ? j0 + BAND : h;
        int lo, hi;
        band_rows(&cy, j0, j1, &lo, &hi);
        // rows lo .. hi - 1, filtered along x, to bytes
#pragma omp parallel for if ((int64_t)(hi - lo) * w * cx.k > (1 << 16))
        for (int y = lo; y < hi; y++) {
            const uint8_t *row = src->rgb + (size_t)y * sw * 3;
            uint8_t *t = tmp + (size_t)(y - lo) * w * 3;
            if (same_x) {
                memcpy(t, row + (size_t)ox * 3, (size_t)w * 3);
                continue;
            }
            for (int x = 0; x < w; x++) {
                const int32_t *wt = cx.w + (size_t)x * cx.k;
                const uint8_t *p = row + (size_t)cx.lo[x] * 3;
                int32_t r = 1 << (PRECISION_BITS - 1), g = r, b = r;
                for (int i = 0; i < cx.taps[x]; i++)
                    r += wt[i] * p[3 * i], g += wt[i] * p[3 * i + 1], b += wt[i] * p[3 * i + 2];
                t[x * 3] = to_byte(r), t[x * 3 + 1] = to_byte(g), t[x * 3 + 2] = to_byte(b);
            }
        }
        // then along y
#pragma omp parallel for if ((int64_t)(j1 - j0) * w * cy.k > (1 << 16))
        for (int j = j0; j < j1; j++) {
            const int32_t *wt = cy.w + (size_t)j * cy.k;
            const uint8_t *t = tmp + (size_t)(cy.lo[j] - lo) * w * 3;
            uint8_t *out = dst + (int64_t)j * dst_stride;
            for (int x = 0; x < 3 * w; x++) {
                int32_t v = 1 << (PRECISION_BITS - 1);
                for (int i = 0; i < cy.taps[j]; i++) v += wt[i] * t[(size_t)i * w * 3 + x];
                out[x] = to_byte(v);
            }
        }
    }
    free(tmp);
    coeffs_free(&cx), coeffs_free(&cy);
    return 0;
}

// ---- AUTOMATIC1111's modes

int dc_resize_mode_parse(const char *s, dc_resize_mode *mode) {
    if (!strcmp(s, "resize")) *mode = DC_RESIZE_JUST;
    else if (!strcmp(s, "crop")) *mode = DC_RESIZE_CROP;
    else if (!strcmp(s, "fill")) *mode = DC_RESIZE_FILL;
    else return dc_fail("--resize-mode %s: choose resize, crop or fill", s);
    return 0;
}

const char *dc_resize_mode_name(dc_resize_mode mode) {
    return mode == DC_RESIZE_CROP ? "crop" : mode == DC_RESIZE_FILL ? "fill" : "resize";
}

// Pastes src resampled (box, to rw x rh) at (px, py) of out, the part inside out only.
static int paste(dc_image *out, const dc_image *src, dc_filter f, dc_box box, int64_t rw, int64_t rh, int64_t px,
                 int64_t py) {
    const int64_t x0 = px < 0 ? 0 : px, y0 = py < 0 ? 0 : py;
    const int64_t x1 = px + rw < out->width ? px + rw : out->width, y1 = py + rh < out->height ? py + rh : out->height;
    if (x1 <= x0 || y1 <= y0) return 0;
    if (rw > 1 << 30 || rh > 1 << 30) return dc_fail("resize: %lldx%lld is too large", (long long)rw, (long long)rh);
    return dc_image_resample(src, f, box, (int)rw, (int)rh, (int)(x0 - px), (int)(y0 - py), (int)(x1 - x0),
                             (int)(y1 - y0), out->rgb + ((size_t)y0 * out->width + (size_t)x0) * 3,
                             (int64_t)out->width * 3);
}

int dc_image_fit(const dc_image *src, int width, int height, dc_resize_mode mode, dc_image *out) {
    memset(out, 0, sizeof *out);
    if (width < 1 || height < 1 || width > DC_IMAGE_MAX_SIDE || height > DC_IMAGE_MAX_SIDE)
        return dc_fail("resize: %dx%d: sides of 1 to %d", width, height, DC_IMAGE_MAX_SIDE);
    if (!src->rgb || src->width < 1 || src->height < 1) return dc_fail("resize: no picture");
    out->rgb = calloc((size_t)width * height * 3, 1);  // black, as Image.new("RGB", ...)
    if (!out->rgb) return dc_fail("resize: out of memory for %dx%d pixels", width, height);
    out->width = width, out->height = height, out->format = src->format;
    const int64_t sw = src->width, sh = src->height;
    const dc_box all = {0, 0, (double)sw, (double)sh};
    // Python's float division and comparisons, in double as Python has them.
    const double ratio = (double)width / height, src_ratio = (double)sw / sh;
    int rc = 0;
    if (mode == DC_RESIZE_JUST) {
        rc = paste(out, src, DC_FILTER_LANCZOS, all, width, height, 0, 0);
    } else if (mode == DC_RESIZE_CROP) {
        const int64_t rw = ratio > src_ratio ? width : sw * height / sh;
        const int64_t rh = ratio <= src_ratio ? height : sh * width / sw;
        rc = paste(out, src, DC_FILTER_LANCZOS, all, rw, rh, width / 2 - rw / 2, height / 2 - rh / 2);
    } else {
        // A side rounded down to 0 (a picture thousands of times wider than
        // tall) would make PIL fail; it is taken as 1.
        int64_t rw = ratio < src_ratio ? width : sw * height / sh;
        int64_t rh = ratio >= src_ratio ? height : sh * width / sw;
        rw = rw < 1 ? 1 : rw, rh = rh < 1 ? 1 : rh;
        dc_image mid = {(int)rw, (int)rh, src->format, malloc((size_t)(rw * rh * 3))};
        rc = mid.rgb ? dc_image_resample(src, DC_FILTER_LANCZOS, all, (int)rw, (int)rh, 0, 0, (int)rw, (int)rh,
                                         mid.rgb, rw * 3)
                     : dc_fail("resize: out of memory");
        const int64_t px = width / 2 - rw / 2, py = height / 2 - rh / 2;
        if (!rc) rc = paste(out, &mid, DC_FILTER_LANCZOS, (dc_box){0, 0, (double)rw, (double)rh}, rw, rh, px, py);
        // The bands: the first and last rows (columns) of the scaled picture,
        // stretched with PIL's default filter (A1111 names none for them).
        if (!rc && ratio < src_ratio) {
            const int64_t fh = height / 2 - rh / 2;
            rc = paste(out, &mid, DC_FILTER_BICUBIC, (dc_box){0, 0, (double)width, 0}, width, fh, 0, 0);
            if (!rc)
                rc = paste(out, &mid, DC_FILTER_BICUBIC, (dc_box){0, (double)rh, (double)width, (double)rh}, width, fh,
                           0, fh + rh);
        } else if (!rc && ratio > src_ratio) {
            const int64_t fw = width / 2 - rw / 2;
            rc = paste(out, &mid, DC_FILTER_BICUBIC, (dc_box){0, 0, 0, (double)height}, fw, height, 0, 0);
            if (!rc)
                rc = paste(out, &mid, DC_FILTER_BICUBIC, (dc_box){(double)rw, 0, (double)rw, (double)height}, fw,
                           height, fw + rw, 0);
        }
        free(mid.rgb);
    }
    if (rc) dc_image_free(out);
    return rc;
}
