// Line plots as PNG pictures, for the curves a training run draws (its loss
// over the steps): white background, axes with tick labels in a built-in
// 5x7 pixel font, each series a coloured polyline. No fonts or libraries
// beyond the PNG writer.
#pragma once
#include <stdint.h>

typedef struct {
    const double *x, *y;  // n points, x ascending
    int n;
    uint8_t rgb[3];
    const char *label;    // in the legend (digits, lower-case letters, space, . - _ ( ) /)
} dc_plot_series;

// Writes a width x height plot of the series to path (atomically). The
// y range covers the series' values from their minimum up to the 98th
// percentile, so that a few early spikes do not flatten the rest; x from the
// first to the last point. Non-finite points are skipped.
int dc_plot_write(const char *path, int width, int height, const dc_plot_series *s, int nseries,
                  const char *xlabel);
