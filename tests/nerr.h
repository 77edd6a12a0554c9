// max|a - b| / max|b| (absolute when b is all zero); NaN or Inf in a fails.
#pragma once
#include <math.h>
#include <stdint.h>

static inline double nerr(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return den > 0 ? num / den : num;
}
