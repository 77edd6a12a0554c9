#include "core/dtype.h"

#include <math.h>

static const struct { const char *name; size_t size; } k_types[DC_DTYPE_COUNT] = {
    [DC_F32] = {"F32", 4},   [DC_F16] = {"F16", 2},   [DC_BF16] = {"BF16", 2},
    [DC_F64] = {"F64", 8},   [DC_I64] = {"I64", 8},   [DC_I32] = {"I32", 4},
    [DC_I16] = {"I16", 2},   [DC_I8] = {"I8", 1},     [DC_U8] = {"U8", 1},
    [DC_BOOL] = {"BOOL", 1}, [DC_F8_E4M3] = {"F8_E4M3", 1}, [DC_F8_E5M2] = {"F8_E5M2", 1},
    [DC_U16] = {"U16", 2},   [DC_U32] = {"U32", 4},   [DC_U64] = {"U64", 8},
};

size_t dc_dtype_size(dc_dtype t) { return (unsigned)t < DC_DTYPE_COUNT ? k_types[t].size : 0; }
const char *dc_dtype_name(dc_dtype t) { return (unsigned)t < DC_DTYPE_COUNT ? k_types[t].name : "?"; }

int dc_dtype_parse(const char *s, dc_dtype *out) {
    for (int i = 0; i < DC_DTYPE_COUNT; i++)
        if (strcmp(s, k_types[i].name) == 0) return *out = (dc_dtype)i, 0;
    return -1;
}

uint16_t dc_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);     // NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    // overflow to inf
    if (a < 0x38800000u) {                                     // subnormal or zero
        float m = fabsf(f) * 16777216.0f;                      // in units of 2^-24
        return (uint16_t)(sign | (uint32_t)nearbyintf(m));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // rebias, round to even
    return (uint16_t)(sign | (r >> 13));
}
