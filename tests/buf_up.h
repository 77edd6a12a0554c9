// Host floats into a new backend buffer of a given dtype (F32, or the
// backend's compute dtype for what a model reads): uploaded as F32 and cast
// on the backend. For the model tests that stage inputs on any backend.
#pragma once
#include "backend/backend.h"

static inline dc_buf test_buf_up(dc_backend *be, const float *h, int64_t n, dc_dtype dt) {
    dc_buf f = {be->alloc(be, (size_t)n * 4), DC_F32};
    be->upload(be, f.p, h, (size_t)n * 4);
    if (dt == DC_F32) return f;
    dc_buf b = {be->alloc(be, (size_t)n * dc_dtype_size(dt)), dt};
    be->cast(be, b, f, n);
    be->sync(be);
    be->free(be, f.p);
    return b;
}
