#include "io/plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/png.h"

// ---- a 5x7 pixel font: each glyph 7 rows of 5 bits (bit 4 the left column)

typedef struct {
    char c;
    uint8_t rows[7];
} glyph;

static const glyph k_font[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},   {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {30, 1, 1, 14, 1, 1, 30}},     {'4', {2, 6, 10, 18, 31, 2, 2}},  {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},    {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},   {'.', {0, 0, 0, 0, 0, 12, 12}},   {'-', {0, 0, 0, 31, 0, 0, 0}},
    {'_', {0, 0, 0, 0, 0, 0, 31}},       {'(', {2, 4, 8, 8, 8, 4, 2}},     {')', {8, 4, 2, 2, 2, 4, 8}},
    {'/', {1, 1, 2, 4, 8, 16, 16}},      {'a', {0, 0, 14, 1, 15, 17, 15}}, {'b', {16, 16, 30, 17, 17, 17, 30}},
    {'c', {0, 0, 14, 16, 16, 17, 14}},   {'d', {1, 1, 15, 17, 17, 17, 15}}, {'e', {0, 0, 14, 17, 31, 16, 14}},
    {'f', {6, 9, 8, 28, 8, 8, 8}},       {'g', {0, 15, 17, 17, 15, 1, 14}}, {'h', {16, 16, 22, 25, 17, 17, 17}},
    {'i', {4, 0, 12, 4, 4, 4, 14}},      {'j', {2, 0, 6, 2, 2, 18, 12}},   {'k', {16, 16, 18, 20, 24, 20, 18}},
    {'l', {12, 4, 4, 4, 4, 4, 14}},      {'m', {0, 0, 26, 21, 21, 17, 17}}, {'n', {0, 0, 22, 25, 17, 17, 17}},
    {'o', {0, 0, 14, 17, 17, 17, 14}},   {'p', {0, 0, 30, 17, 30, 16, 16}}, {'q', {0, 0, 15, 17, 15, 1, 1}},
    {'r', {0, 0, 22, 25, 16, 16, 16}},   {'s', {0, 0, 15, 16, 14, 1, 30}}, {'t', {8, 8, 28, 8, 8, 9, 6}},
    {'u', {0, 0, 17, 17, 17, 19, 13}},   {'v', {0, 0, 17, 17, 17, 10, 4}}, {'w', {0, 0, 17, 17, 21, 21, 10}},
    {'x', {0, 0, 17, 10, 4, 10, 17}},    {'y', {0, 0, 17, 17, 15, 1, 14}}, {'z', {0, 0, 31, 2, 4, 8, 31}},
};

typedef struct {
    uint8_t *px;  // [h, w, 3]
    int w, h;
} canvas;

static void dot(canvas *c, int x, int y, const uint8_t *rgb) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    memcpy(c->px + ((size_t)y * c->w + x) * 3, rgb, 3);
}

// Text with its top-left corner at (x, y); unknown characters are blanks.
static void text(canvas *c, int x, int y, const char *s, const uint8_t *rgb) {
    for (; *s; s++, x += 6)
        for (size_t g = 0; g < sizeof k_font / sizeof *k_font; g++)
            if (k_font[g].c == *s)
                for (int r = 0; r < 7; r++)
                    for (int b = 0; b < 5; b++)
                        if (k_font[g].rows[r] >> (4 - b) & 1) dot(c, x + b, y + r, rgb);
}

// Bresenham, one pixel wide.
static void line(canvas *c, int x0, int y0, int x1, int y1, const uint8_t *rgb) {
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, e = dx + dy;
    for (;;) {
        dot(c, x0, y0, rgb);
        if (x0 == x1 && y0 == y1) return;
        int e2 = 2 * e;
        if (e2 >= dy) e += dy, x0 += sx;
        if (e2 <= dx) e += dx, y0 += sy;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// A tick label: at most 6 significant digits, no trailing zeros.
static void tick_label(double v, char *buf, size_t n) {
    snprintf(buf, n, "%.4g", v);
    if (strchr(buf, 'e')) return;
    if (strchr(buf, '.')) {
        size_t k = strlen(buf);
        while (k > 1 && buf[k - 1] == '0') buf[--k] = 0;
        if (buf[k - 1] == '.') buf[k - 1] = 0;
    }
}

// A "nice" tick step (1, 2 or 5 times a power of ten) for about `want` ticks over span.
static double nice_step(double span, int want) {
    double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

int dc_plot_write(const char *path, int width, int height, const dc_plot_series *s, int nseries,
                  const char *xlabel) {
    if (width < 160 || height < 120 || width > 8192 || height > 8192)
        return dc_fail("plot %dx%d: 160x120 to 8192x8192", width, height);
    // the ranges: x over every point, y from the minimum to the 98th percentile
    double x0 = INFINITY, x1 = -INFINITY;
    int64_t total = 0;
    for (int k = 0; k < nseries; k++) total += s[k].n;
    double *ys = malloc(sizeof(double) * (size_t)(total ? total : 1));
    if (!ys) return dc_fail("out of memory");
    int64_t m = 0;
    for (int k = 0; k < nseries; k++)
        for (int i = 0; i < s[k].n; i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
                ys[m++] = s[k].y[i];
            }
    double y0 = 0, y1 = 1;
    if (m) {
        qsort(ys, (size_t)m, sizeof *ys, cmp_double);
        y0 = ys[0], y1 = ys[(int64_t)floor(0.98 * (double)(m - 1))];
    }
    free(ys);
    if (!m) x0 = 0, x1 = 1;
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + (y0 != 0 ? fabs(y0) * 0.1 : 1);
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;

    canvas c = {malloc((size_t)width * height * 3), width, height};
    if (!c.px) return dc_fail("out of memory");
    memset(c.px, 255, (size_t)width * height * 3);
    const uint8_t black[3] = {0, 0, 0}, grid[3] = {225, 225, 225};
    const int L = 64, R = width - 12, T = 12, B = height - 34;  // the plot area
    // ticks and grid lines
    char buf[32];
    double st = nice_step(y1 - y0, 6);
    for (double v = ceil(y0 / st) * st; v <= y1; v += st) {
        int y = B - (int)lround((v - y0) / (y1 - y0) * (B - T));
        line(&c, L, y, R, y, grid);
        tick_label(fabs(v) < st * 1e-6 ? 0 : v, buf, sizeof buf);
        text(&c, L - 4 - 6 * (int)strlen(buf), y - 3, buf, black);
    }
    st = nice_step(x1 - x0, 6);
    for (double v = ceil(x0 / st) * st; v <= x1; v += st) {
        int x = L + (int)lround((v - x0) / (x1 - x0) * (R - L));
        line(&c, x, T, x, B, grid);
        tick_label(v, buf, sizeof buf);
        text(&c, x - 3 * (int)strlen(buf), B + 5, buf, black);
    }
    line(&c, L, T, L, B, black);
    line(&c, L, B, R, B, black);
    if (xlabel) text(&c, (L + R) / 2 - 3 * (int)strlen(xlabel), height - 12, xlabel, black);
    // the series, clipped to the plot area, and the legend (top right)
    for (int k = 0; k < nseries; k++) {
        int px = 0, py = 0, have = 0;
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            double yv = fmin(fmax(s[k].y[i], y0), y1);
            int x = L + (int)lround((s[k].x[i] - x0) / (x1 - x0) * (R - L));
            int y = B - (int)lround((yv - y0) / (y1 - y0) * (B - T));
            if (have) line(&c, px, py, x, y, s[k].rgb);
            else dot(&c, x, y, s[k].rgb);
            px = x, py = y, have = 1;
        }
        if (s[k].label) {
            int ly = T + 4 + 11 * k, lx = R - 8 - 6 * (int)strlen(s[k].label);
            line(&c, lx - 18, ly + 3, lx - 4, ly + 3, s[k].rgb);
            text(&c, lx, ly, s[k].label, black);
        }
    }
    int rc = dc_png_write(path, c.px, width, height, 3);
    free(c.px);
    return rc;
}
