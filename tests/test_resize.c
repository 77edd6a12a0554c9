// Resizing (dc_image_resample, dc_image_fit) against a naive double-precision
// reference written from PIL's definition of Image.resize(size, filter, box)
// (each output pixel a weighted sum over every source pixel, the weights the
// Lanczos or bicubic kernel of the distance to the pixel's centre in source
// pixels, stretched by the scale when shrinking, cut to the window and
// renormalised; rows first, rounded to bytes, then columns) and from
// AUTOMATIC1111's resize modes (the offsets, the crop, the bands of "Resize
// and fill" in PIL's default bicubic), on fresh random pictures of random
// sizes: every output byte within half a level of the reference's exact
// value, give or take PIL's fixed point (0.02 of a level, either rounding of
// a first-pass value that near a half). Also: a constant picture stays
// constant, the same size is the picture itself, and a window of the output
// is that part of the whole.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/image.h"

#include "check.h"

static uint64_t g_rng;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
static int rnd_in(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }

static dc_image random_image(int w, int h) {
    dc_image im = {w, h, DC_IMAGE_PNG, malloc((size_t)w * h * 3)};
    for (int i = 0; i < w * h * 3; i++) im.rgb[i] = (uint8_t)rnd();
    return im;
}

// ---- the reference ----------------------------------------------------------------

static double sinc(double x) { return x == 0 ? 1.0 : sin(M_PI * x) / (M_PI * x); }

// PIL's filters: Lanczos-3, and bicubic convolution with a = -0.5.
static double kernel(dc_filter f, double t) {
    if (f == DC_FILTER_LANCZOS) return t >= -3 && t < 3 ? sinc(t) * sinc(t / 3) : 0;
    t = fabs(t);
    return t < 1 ? 1.5 * t * t * t - 2.5 * t * t + 1 : t < 2 ? -0.5 * t * t * t + 2.5 * t * t - 4 * t + 2 : 0;
}

// The normalised weight of source pixel i for output o along one axis:
// the filter's support (3 source pixels for Lanczos, 2 for bicubic), times
// the scale when shrinking; pixel i takes part when trunc(c - s + 0.5) <= i <
// trunc(c + s + 0.5) (C's truncation, as PIL computes it), within [0, n).
static void axis_weights(dc_filter f, int n, double in0, double in1, int out, int o, double *w) {
    const double scale = (in1 - in0) / out, fs = scale > 1 ? scale : 1, s = (f == DC_FILTER_LANCZOS ? 3 : 2) * fs;
    const double c = in0 + (o + 0.5) * scale;
    const int lo = (int)(c - s + 0.5), hi = (int)(c + s + 0.5);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        w[i] = i >= lo && i < hi ? kernel(f, (i - c + 0.5) / fs) : 0;
        sum += w[i];
    }
    for (int i = 0; i < n; i++) w[i] = sum != 0 ? w[i] / sum : 0;
}

// PIL sums in fixed point, weights rounded to 2^-23: a sum lies within about
// 0.01 of a level of its exact value (for the ~250 taps of the largest
// shrinking here), so a first-pass value that near a half may round either
// way, and a result may be that much off.
#define DELTA 0.02

static double clip(double v) { return v < 0 ? 0 : v > 255 ? 255 : v; }

// The range [*lo, *hi] of exact values (unrounded) that output (x, y)
// channel k may have: the rows filtered along x and rounded to bytes, as PIL
// stores its first pass (either way where a value is within DELTA of a
// half), then filtered along y.
static void ref_range(const dc_image *src, dc_filter f, dc_box b, int ow, int oh, int x, int y, int k, double *wx,
                      double *wy, double *lo, double *hi) {
    axis_weights(f, src->width, b.x0, b.x1, ow, x, wx);
    axis_weights(f, src->height, b.y0, b.y1, oh, y, wy);
    *lo = *hi = 0;
    for (int j = 0; j < src->height; j++) {
        if (wy[j] == 0) continue;
        double row = 0;
        for (int i = 0; i < src->width; i++) row += wx[i] * src->rgb[((size_t)j * src->width + i) * 3 + k];
        double down = clip(floor(row + 0.5)), up = down;
        if (fabs(row - floor(row) - 0.5) < DELTA) down = clip(floor(row)), up = clip(floor(row) + 1);
        *lo += fmin(wy[j] * down, wy[j] * up), *hi += fmax(wy[j] * down, wy[j] * up);
    }
}

// How far a byte lies outside what rounding [lo, hi] allows (0: inside).
static double outside(uint8_t got, double lo, double hi) {
    double below = clip(lo) - 0.5 - got, above = got - (clip(hi) + 0.5);
    return below > 0 ? below : above > 0 ? above : 0;
}

// The worst distance between out (rows of stride bytes, w x h from (ox, oy)
// of an ow x oh resize) and what the reference allows.
static double resample_error(const dc_image *src, dc_filter f, dc_box b, int ow, int oh, int ox, int oy, int w,
                             int h, const uint8_t *out, int64_t stride) {
    double *wx = malloc(sizeof *wx * (size_t)src->width), *wy = malloc(sizeof *wy * (size_t)src->height), worst = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < 3; k++) {
                double lo, hi;
                ref_range(src, f, b, ow, oh, ox + x, oy + y, k, wx, wy, &lo, &hi);
                double d = outside(out[(int64_t)y * stride + x * 3 + k], lo, hi);
                if (!(d <= worst)) worst = d;  // NaN-proof
            }
    free(wx), free(wy);
    return worst;
}

// ---- dc_image_resample ---------------------------------------------------------------

static void test_resample(void) {
    for (int t = 0; t < 40; t++) {
        const int sw = rnd_in(1, 40), sh = rnd_in(1, 40), ow = rnd_in(1, 50), oh = rnd_in(1, 50);
        const dc_filter f = t % 4 == 3 ? DC_FILTER_BICUBIC : DC_FILTER_LANCZOS;
        dc_image src = random_image(sw, sh);
        // the whole picture, or a box inside it (fractional, sometimes of no width or height)
        dc_box b = {0, 0, sw, sh};
        if (t % 3 == 1) {
            b.x0 = rnd() % (sw * 4) / 4.0, b.x1 = b.x0 + rnd() % ((int)((sw - b.x0) * 4) + 1) / 4.0;
            b.y0 = rnd() % (sh * 4) / 4.0, b.y1 = b.y0 + rnd() % ((int)((sh - b.y0) * 4) + 1) / 4.0;
        }
        uint8_t *out = malloc((size_t)ow * oh * 3);
        int rc = dc_image_resample(&src, f, b, ow, oh, 0, 0, ow, oh, out, ow * 3);
        double e = rc ? INFINITY : resample_error(&src, f, b, ow, oh, 0, 0, ow, oh, out, ow * 3);
        CHECK(e <= DELTA, "%dx%d box [%g, %g) x [%g, %g) to %dx%d (%s): %.7f levels from the reference (%s)", sw, sh,
              b.x0, b.x1, b.y0, b.y1, ow, oh, f == DC_FILTER_LANCZOS ? "Lanczos" : "bicubic", e,
              rc ? dc_error() : "ok");
        // a window of it: the same bytes as that part of the whole
        const int wx = rnd_in(0, ow - 1), wy = rnd_in(0, oh - 1), ww = rnd_in(1, ow - wx), wh = rnd_in(1, oh - wy);
        uint8_t *win = malloc((size_t)ww * wh * 3);
        int same = dc_image_resample(&src, f, b, ow, oh, wx, wy, ww, wh, win, ww * 3) == 0;
        for (int y = 0; same && y < wh; y++)
            same = !memcmp(win + (size_t)y * ww * 3, out + ((size_t)(wy + y) * ow + wx) * 3, (size_t)ww * 3);
        CHECK(same, "a %dx%d window at (%d, %d) of %dx%d: the same bytes as the whole", ww, wh, wx, wy, ow, oh);
        free(win), free(out), free(src.rgb);
    }
    // Large factors both ways (the filter over 40 source pixels; one pixel over many).
    const int sizes[][4] = {{300, 7, 7, 300}, {5, 3, 200, 150}, {257, 255, 16, 17}};
    for (int t = 0; t < 3; t++) {
        const int sw = sizes[t][0], sh = sizes[t][1], ow = sizes[t][2], oh = sizes[t][3];
        dc_image src = random_image(sw, sh);
        uint8_t *out = malloc((size_t)ow * oh * 3);
        dc_box b = {0, 0, sw, sh};
        int rc = dc_image_resample(&src, DC_FILTER_LANCZOS, b, ow, oh, 0, 0, ow, oh, out, ow * 3);
        double e = rc ? INFINITY : resample_error(&src, DC_FILTER_LANCZOS, b, ow, oh, 0, 0, ow, oh, out, ow * 3);
        CHECK(e <= DELTA, "%dx%d to %dx%d: %.7f levels from the reference", sw, sh, ow, oh, e);
        free(out), free(src.rgb);
    }
    // A constant picture stays that constant; the same size is the picture itself.
    dc_image c = random_image(33, 21), same = random_image(33, 21);
    memset(c.rgb, 77, 33 * 21 * 3);
    uint8_t *out = malloc(64 * 64 * 3);
    int ok = dc_image_resample(&c, DC_FILTER_LANCZOS, (dc_box){0, 0, 33, 21}, 64, 47, 0, 0, 64, 47, out, 64 * 3) == 0;
    for (int i = 0; ok && i < 64 * 47 * 3; i++) ok = out[i] == 77;
    CHECK(ok, "a constant picture resized stays constant");
    ok = dc_image_resample(&same, DC_FILTER_LANCZOS, (dc_box){0, 0, 33, 21}, 33, 21, 0, 0, 33, 21, out, 33 * 3) == 0 &&
         !memcmp(out, same.rgb, 33 * 21 * 3);
    CHECK(ok, "resized to its own size, a picture is itself");
    CHECK(dc_image_resample(&same, DC_FILTER_LANCZOS, (dc_box){0, 0, 34, 21}, 10, 10, 0, 0, 10, 10, out, 30) != 0 &&
          strstr(dc_error(), "outside"), "a box outside the picture is refused: %s", dc_error());
    CHECK(dc_image_resample(&same, DC_FILTER_LANCZOS, (dc_box){0, 0, 33, 21}, 10, 10, 5, 0, 6, 10, out, 30) != 0,
          "a window outside the output is refused");
    free(out), free(c.rgb), free(same.rgb);
}

// ---- AUTOMATIC1111's modes ----------------------------------------------------------

// The reference canvas's byte, or -1 where the canvas is black (nothing
// pasted): A1111's resize_image, written from its definition.
typedef struct {
    const dc_image *src;
    int W, H;
    dc_resize_mode mode;
    int64_t rw, rh, px, py;  // the scaled picture and where it is pasted
    int band;                // fill: 1 bands above and below, 2 left and right, 0 none
    int64_t fill;            // fill: the bands' height (1) or width (2)
    dc_image mid;            // fill: the scaled picture as pasted (for the bands)
} fit_ref;

static void ref_plan(fit_ref *r) {
    const int64_t w = r->src->width, h = r->src->height, W = r->W, H = r->H;
    const double ratio = (double)W / H, src_ratio = (double)w / h;
    r->band = 0;
    if (r->mode == DC_RESIZE_JUST) {
        r->rw = W, r->rh = H;
    } else if (r->mode == DC_RESIZE_CROP) {
        r->rw = ratio > src_ratio ? W : w * H / h;
        r->rh = ratio <= src_ratio ? H : h * W / w;
    } else {
        r->rw = ratio < src_ratio ? W : w * H / h;
        r->rh = ratio >= src_ratio ? H : h * W / w;
        if (r->rw < 1) r->rw = 1;
        if (r->rh < 1) r->rh = 1;
        r->band = ratio < src_ratio ? 1 : ratio > src_ratio ? 2 : 0;
        r->fill = r->band == 1 ? H / 2 - r->rh / 2 : W / 2 - r->rw / 2;
    }
    r->px = W / 2 - r->rw / 2, r->py = H / 2 - r->rh / 2;
}

// The range of exact values at canvas (x, y) channel k; *black when nothing covers it.
static void ref_at(const fit_ref *r, int x, int y, int k, double *wx, double *wy, int *black, double *lo,
                   double *hi) {
    *black = 0;
    const int64_t ix = x - r->px, iy = y - r->py;
    const dc_filter L = DC_FILTER_LANCZOS, B = DC_FILTER_BICUBIC;
    const int W = r->W, H = r->H, fill = (int)r->fill, rw = (int)r->rw, rh = (int)r->rh;
    if (ix >= 0 && ix < r->rw && iy >= 0 && iy < r->rh)
        return ref_range(r->src, L, (dc_box){0, 0, r->src->width, r->src->height}, rw, rh, (int)ix, (int)iy, k, wx,
                         wy, lo, hi);
    // the bands: resized.resize((W, fill), box=(0, 0, W, 0)) at (0, 0), box=(0, rh, W, rh) at (0, fill + rh);
    // or resized.resize((fill, H), box=(0, 0, 0, H)) at (0, 0), box=(rw, 0, rw, H) at (fill + rw, 0), with
    // PIL's default filter, bicubic (A1111 names none)
    if (r->band == 1 && y < fill) return ref_range(&r->mid, B, (dc_box){0, 0, W, 0}, W, fill, x, y, k, wx, wy, lo, hi);
    if (r->band == 1 && y >= fill + rh && y < 2 * fill + rh)
        return ref_range(&r->mid, B, (dc_box){0, rh, W, rh}, W, fill, x, y - fill - rh, k, wx, wy, lo, hi);
    if (r->band == 2 && x < fill) return ref_range(&r->mid, B, (dc_box){0, 0, 0, H}, fill, H, x, y, k, wx, wy, lo, hi);
    if (r->band == 2 && x >= fill + rw && x < 2 * fill + rw)
        return ref_range(&r->mid, B, (dc_box){rw, 0, rw, H}, fill, H, x - fill - rw, y, k, wx, wy, lo, hi);
    *black = 1;
}

static void check_fit(int sw, int sh, int W, int H, dc_resize_mode mode) {
    dc_image src = random_image(sw, sh), out;
    int rc = dc_image_fit(&src, W, H, mode, &out);
    CHECK(rc == 0 && out.width == W && out.height == H, "fit %dx%d to %dx%d (%s): %s", sw, sh, W, H,
          dc_resize_mode_name(mode), rc ? dc_error() : "wrong size");
    if (rc) return free(src.rgb);
    fit_ref r = {&src, W, H, mode, 0, 0, 0, 0, 0, 0, {0}};
    ref_plan(&r);
    // The bands resample the scaled picture as pasted (bytes, as PIL's is):
    // taken from the output, where it lies whole, so the bands are checked
    // on their own against the reference for their input.
    if (r.band) {
        r.mid = (dc_image){(int)r.rw, (int)r.rh, DC_IMAGE_PNG, malloc((size_t)(r.rw * r.rh * 3))};
        for (int64_t y = 0; y < r.rh; y++)
            memcpy(r.mid.rgb + y * r.rw * 3, out.rgb + ((r.py + y) * W + r.px) * 3, (size_t)r.rw * 3);
    }
    // weights over the source's pixels (the picture's, or the scaled one's for the bands)
    double *wx = malloc(sizeof(double) * (size_t)(sw > W ? sw : W));
    double *wy = malloc(sizeof(double) * (size_t)(sh > H ? sh : H));
    double worst = 0;
    int black_bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int k = 0; k < 3; k++) {
                int black;
                double lo, hi;
                ref_at(&r, x, y, k, wx, wy, &black, &lo, &hi);
                uint8_t got = out.rgb[((size_t)y * W + x) * 3 + k];
                if (black) {
                    black_bad += got != 0;
                    continue;
                }
                double d = outside(got, lo, hi);
                if (!(d <= worst)) worst = d;
            }
    CHECK(worst <= DELTA && black_bad == 0, "fit %dx%d to %dx%d (%s): %.4f levels from A1111's reference, %d uncovered "
          "bytes not black", sw, sh, W, H, dc_resize_mode_name(mode), worst, black_bad);
    free(wx), free(wy), free(r.mid.rgb), free(out.rgb), free(src.rgb);
}

static void test_fit(void) {
    // Wider, taller and the same shape as the canvas, shrinking and growing,
    // odd and even sides (the offsets' halves round down, so an even canvas
    // and an odd scaled side put the odd pixel on the right or below).
    const int cases[][4] = {{40, 20, 24, 24}, {20, 40, 24, 24}, {30, 30, 16, 16}, {13, 31, 32, 16},
                            {31, 13, 16, 32}, {9, 7, 24, 40},   {64, 3, 16, 16},  {7, 9, 21, 27},
                            {7, 16, 16, 16},  {16, 7, 16, 16},  {5, 16, 16, 16},  {16, 5, 16, 16}};
    for (int m = 0; m < 3; m++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            check_fit(cases[i][0], cases[i][1], cases[i][2], cases[i][3], (dc_resize_mode)m);
        for (int t = 0; t < 4; t++)
            check_fit(rnd_in(1, 30), rnd_in(1, 30), rnd_in(1, 30), rnd_in(1, 30), (dc_resize_mode)m);
    }
    // A picture 400 times wider than tall, filled: its scaled height rounds to 0 and is taken as 1.
    check_fit(400, 1, 16, 16, DC_RESIZE_FILL);
    dc_resize_mode m;
    CHECK(dc_resize_mode_parse("crop", &m) == 0 && m == DC_RESIZE_CROP && dc_resize_mode_parse("fill", &m) == 0 &&
          m == DC_RESIZE_FILL && dc_resize_mode_parse("resize", &m) == 0 && m == DC_RESIZE_JUST, "mode names");
    CHECK(dc_resize_mode_parse("stretch", &m) != 0 && strstr(dc_error(), "--resize-mode stretch"),
          "an unknown mode is refused naming the flag: %s", dc_error());
    dc_image src = random_image(4, 4), out;
    CHECK(dc_image_fit(&src, 0, 16, DC_RESIZE_JUST, &out) != 0 && !out.rgb, "a size of 0 is refused");
    free(src.rgb);
}

int main(void) {
    g_rng = ((uint64_t)time(NULL) << 20 ^ (uint64_t)getpid()) | 1;
    printf("seed %llu\n", (unsigned long long)g_rng);
    test_resample();
    test_fit();
    printf("test_resize: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
