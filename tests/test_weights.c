// Loading parameters under another layout's names (nn/weights.h): a 1x1
// convolution into a linear layer, rows of a packed tensor, F16 and BF16
// sources, a prefix, several files; a set mixing frozen F16 and trainable
// parameters; and the refusals (missing, mis-shaped, rows out of range,
// non-finite, a frozen F16 weight given F32 values), each naming the tensor.
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "nn/weights.h"
#include "tmpdir.h"

// Values exact in F16 and BF16: k/8 for small k.
static float val(int t, int i) { return (float)((t * 7 + i * 3) % 29 - 14) / 8.0f; }

static uint16_t h16(float f, dc_dtype dt) { return dt == DC_BF16 ? dc_f32_to_bf16(f) : dc_f32_to_f16(f); }

// Writes file `name` holding prefix + conv [4,3,1,1] (F16), prefix + packed [6,2] (BF16),
// prefix + bias [4] (F32).
static int write_file(const char *name, const char *prefix, float poison) {
    uint16_t conv[12], packed[12];
    float bias[4];
    for (int i = 0; i < 12; i++) conv[i] = h16(val(1, i), DC_F16), packed[i] = h16(val(2, i), DC_BF16);
    for (int i = 0; i < 4; i++) bias[i] = val(3, i);
    bias[2] = poison == 0 ? bias[2] : poison;
    char n[3][64];
    snprintf(n[0], 64, "%sconv.weight", prefix), snprintf(n[1], 64, "%spacked", prefix);
    snprintf(n[2], 64, "%sbias", prefix);
    dc_st_entry e[3] = {{n[0], DC_F16, 4, {4, 3, 1, 1}, conv}, {n[1], DC_BF16, 2, {6, 2}, packed},
                        {n[2], DC_F32, 1, {4}, bias}};
    return dc_st_write(tmp_path(name), e, 3, NULL, NULL, 0);
}

// lin.weight <- conv.weight; lin.bias <- bias; q.weight / k.weight / v.weight <- rows of packed
static int map(void *ctx, const char *param, dc_weight_src *src) {
    const int *shift = ctx;
    if (!strcmp(param, "lin.weight")) return snprintf(src->name, sizeof src->name, "conv.weight"), 0;
    if (!strcmp(param, "lin.bias")) return snprintf(src->name, sizeof src->name, "bias"), 0;
    if (param[1] == '.') {
        snprintf(src->name, sizeof src->name, "packed");
        src->row0 = (param[0] == 'q' ? 0 : param[0] == 'k' ? 2 : 4) + *shift, src->rows = 2;
        return 0;
    }
    return dc_fail("no source for %s", param);
}

static void build(dc_params *ps, dc_backend *be, int lin_out) {
    memset(ps, 0, sizeof *ps);
    dc_params_add(ps, "lin.weight", true, 2, lin_out, 3);
    dc_params_add(ps, "lin.bias", true, 1, 4);
    dc_params_add(ps, "q.weight", true, 2, 2, 2);
    dc_params_add(ps, "k.weight", true, 2, 2, 2);
    dc_params_add(ps, "v.weight", true, 2, 2, 2);
    dc_params_alloc_frozen(ps, be, DC_F32);  // the files mix F16, BF16 and F32
}

static int load(const char *file, const char *prefix, int lin_out, int shift, float *out) {
    dc_backend *be;
    dc_backend_create("cpu", &be);
    dc_st_file f;
    int rc = dc_st_open(&f, tmp_path(file));
    if (rc == 0) {
        dc_params ps;
        build(&ps, be, lin_out);
        dc_weights w = {&f, 1, ""};
        snprintf(w.prefix, sizeof w.prefix, "%s", prefix);
        rc = dc_params_load_weights(&ps, &w, map, &shift);
        if (rc == 0 && out) be->download(be, out, ps.frozen.p, (size_t)ps.frozen_numel * sizeof(float));
        dc_params_free(&ps);
        dc_st_close(&f);
    }
    dc_backend_destroy(be);
    return rc;
}

// A set with a frozen F16 weight beside trainable parameters, loaded on the
// CPU (which keeps F16 weights as loaded): the frozen weight holds the file's
// bits, every F16 value there is (random bit patterns, subnormals included,
// no NaN or infinity), and the trainable ones their exact widening in the
// fp32 master. A frozen F16 weight given F32 values is refused.
static void test_mixed(void) {
    enum { N = 64 };
    uint16_t fw[N], tw[N];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        uint16_t a, b;
        do s ^= s << 13, s ^= s >> 7, s ^= s << 17, a = (uint16_t)s, b = (uint16_t)(s >> 16);
        while ((a & 0x7c00) == 0x7c00 || (b & 0x7c00) == 0x7c00);  // finite
        fw[i] = a, tw[i] = b;
    }
    float bias[8], f32w[N];
    for (int i = 0; i < 8; i++) bias[i] = val(4, i);
    for (int i = 0; i < N; i++) f32w[i] = dc_f16_to_f32(fw[i]);
    dc_st_entry ok[3] = {{"frozen.weight", DC_F16, 2, {8, 8}, fw}, {"frozen.bias", DC_F32, 1, {8}, bias},
                         {"train.weight", DC_F16, 2, {8, 8}, tw}};
    dc_st_entry wide[1] = {{"frozen.weight", DC_F32, 2, {8, 8}, f32w}};
    CHECK(dc_st_write(tmp_path("mixed.safetensors"), ok, 3, NULL, NULL, 0) == 0, "write: %s", dc_error());
    CHECK(dc_st_write(tmp_path("mixed32.safetensors"), wide, 1, NULL, NULL, 0) == 0, "write: %s", dc_error());
    dc_backend *be;
    dc_backend_create("cpu", &be);
    for (int k = 0; k < 2; k++) {
        dc_params ps = {0};
        int fw_i = dc_params_add(&ps, "frozen.weight", true, 2, 8, 8);
        int fb_i = dc_params_add(&ps, "frozen.bias", true, 1, 8);
        int tw_i = dc_params_add(&ps, "train.weight", true, 2, 8, 8);
        dc_st_file f;
        int rc = dc_params_freeze(&ps, fw_i) || dc_params_alloc_loaded(&ps, be, true, DC_F16) ||
                 dc_st_open(&f, tmp_path(k ? "mixed32.safetensors" : "mixed.safetensors"));
        if (rc) {
            CHECK(0, "mixed set: %s", dc_error());
        } else {
            dc_weights w = {&f, 1, ""};
            rc = dc_params_load_weights(&ps, &w, NULL, NULL);
            if (k == 1) {
                CHECK(rc != 0 && strstr(dc_error(), "'frozen.weight' is F32") && strstr(dc_error(), "as F16"),
                      "a frozen F16 weight refuses F32 values, naming the tensor: %s", dc_error());
            } else {
                uint16_t got16[N];
                float gotb[8], gott[N];
                be->download(be, got16, dc_param_data(&ps, fw_i).p, sizeof got16);
                be->download(be, gotb, dc_param_data(&ps, fb_i).p, sizeof gotb);
                be->download(be, gott, dc_param_data(&ps, tw_i).p, sizeof gott);
                int bad = 0;
                for (int i = 0; i < N; i++) bad += gott[i] != dc_f16_to_f32(tw[i]);
                CHECK(rc == 0 && ps.frozen.dt == DC_F16 && memcmp(got16, fw, sizeof fw) == 0 &&
                          memcmp(gotb, bias, sizeof bias) == 0 && bad == 0,
                      "mixed set: the frozen F16 weight keeps the file's bits, the trainable ones widen exactly (%s)",
                      rc ? dc_error() : "loaded");
            }
            dc_st_close(&f);
        }
        dc_params_free(&ps);
    }
    dc_backend_destroy(be);
}

int main(void) {
    if (tmpdir_make("weights")) return 1;
    CHECK(write_file("plain.safetensors", "", 0) == 0, "write: %s", dc_error());
    CHECK(write_file("prefixed.safetensors", "model.x.", 0) == 0, "write: %s", dc_error());
    CHECK(write_file("nan.safetensors", "", NAN) == 0, "write: %s", dc_error());

    float got[12 + 4 + 12];
    CHECK(load("plain.safetensors", "", 4, 0, got) == 0, "load: %s", dc_error());
    int bad = 0;
    for (int i = 0; i < 12; i++) bad += got[i] != val(1, i);           // [4,3,1,1] F16 -> [4,3]
    for (int i = 0; i < 4; i++) bad += got[12 + i] != val(3, i);       // F32
    for (int i = 0; i < 12; i++) bad += got[16 + i] != val(2, i);      // q, k, v = rows 0-1, 2-3, 4-5
    CHECK(bad == 0, "%d values differ after a mapped load", bad);

    CHECK(load("prefixed.safetensors", "model.x.", 4, 0, got) == 0, "prefixed load: %s", dc_error());
    CHECK(load("prefixed.safetensors", "", 4, 0, NULL) != 0 && strstr(dc_error(), "missing tensor 'conv.weight'"),
          "a missing tensor is named: %s", dc_error());
    CHECK(load("plain.safetensors", "", 5, 0, NULL) != 0 && strstr(dc_error(), "'conv.weight' has shape [4, 3, 1, 1]") &&
              strstr(dc_error(), "needs [5, 3]"),
          "a mis-shaped tensor is named with both shapes: %s", dc_error());
    CHECK(load("plain.safetensors", "", 4, 1, NULL) != 0 && strstr(dc_error(), "no rows 5..6"),
          "rows beyond a packed tensor are refused: %s", dc_error());
    CHECK(load("nan.safetensors", "", 4, 0, NULL) != 0 && strstr(dc_error(), "'bias' element 2 is nan"),
          "a NaN is refused naming the tensor and element: %s", dc_error());

    // A channels-last kernel: [Co=2, Ci=3, 2, 2] in PyTorch's order is stored
    // [Co, kh, kw, Ci], and comes back unchanged.
    dc_param cl = {.name = "conv.weight", .ndim = 4, .shape = {2, 3, 2, 2}, .numel = 24, .channels_last = true};
    float k[24], orig[24];
    for (int i = 0; i < 24; i++) k[i] = orig[i] = (float)i;  // k[co][ci][ky][kx] = ((co*3 + ci)*2 + ky)*2 + kx
    CHECK(dc_param_to_stored(&cl, k) == 0, "to stored: %s", dc_error());
    bad = 0;
    for (int co = 0; co < 2; co++)
        for (int t = 0; t < 4; t++)
            for (int ci = 0; ci < 3; ci++) bad += k[(co * 4 + t) * 3 + ci] != orig[(co * 3 + ci) * 4 + t];
    CHECK(bad == 0, "%d values of a channels-last kernel out of place", bad);
    CHECK(dc_param_from_stored(&cl, k) == 0 && memcmp(k, orig, sizeof k) == 0, "back to PyTorch's order");
    cl.channels_last = false;
    CHECK(dc_param_to_stored(&cl, k) == 0 && memcmp(k, orig, sizeof k) == 0, "other parameters stay as they are");

    // Lookups that infer configs from shapes.
    dc_st_file f;
    CHECK(dc_st_open(&f, tmp_path("prefixed.safetensors")) == 0, "open: %s", dc_error());
    dc_weights w = {&f, 1, "model.x."};
    CHECK(dc_weights_dim(&w, "conv.weight", 1) == 3 && dc_weights_dim(&w, "conv.weight", 4) == -1 &&
              dc_weights_dim(&w, "none", 0) == -1, "dc_weights_dim");
    CHECK(dc_weights_count_prefix(&w, "p") == 1 && dc_weights_count_prefix(&w, "") == 3, "count by prefix");
    dc_st_close(&f);

    test_mixed();
    tmpdir_remove();
    printf("test_weights: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
