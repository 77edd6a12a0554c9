// Inference weights kept as loaded on the CPU (nn/params.h, frozen sets):
// F16 and BF16 weights stay 2 bytes a weight and the ops widen them as they
// read them. Widening is exact, so the reference is the same op, or the same
// model, on F32 weights holding the widened values: outputs must be the same
// bits. Checks:
// - each CPU op that reads a weight (linear, its backward and GELU forms,
//   convolutions in both layouts, group and layer norms, embeddings, added
//   position rows) with F16 and BF16 weights against F32 ones, on fresh
//   random inputs, weights including subnormals, outputs pre-filled with NaN;
// - the dtype a model's files give (dc_weights_dtype) and where the set keeps
//   it (dc_params_alloc_frozen on a backend with and without half weights);
// - tiny SD models that tools/sd_random writes (F16 and BF16, a diffusers
//   folder and an SD 2 single file with OpenCLIP's packed q/k/v): the text
//   encoder, UNet and VAE (encode and decode) loaded as the pipeline loads
//   them against the same files widened to F32, bit for bit, with the bytes
//   the weights take counted (2 a weight), and a file of another dtype refused.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "count_alloc.h"
#include "models/unet.h"
#include "pipelines/sd.h"
#include "tmpdir.h"

static dc_backend *g_be;

// ---- random numbers (splitmix64) --------------------------------------------------------
static uint64_t g_rng = 12345;
static uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rnd(float lo, float hi) { return lo + (hi - lo) * (float)((rnd_u64() >> 40) * 0x1p-24); }

static float *host_rand(int64_t n, float lo, float hi) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = rnd(lo, hi);
    return x;
}

// ---- backend buffers, freed at the end of each check -------------------------------------
static void *g_dev[64];
static int g_ndev;
static dc_buf dev_bytes(const void *h, size_t bytes, dc_dtype dt) {
    void *p = g_be->alloc(g_be, bytes);
    if (!p) printf("alloc failed: %s\n", dc_error()), exit(1);
    g_dev[g_ndev++] = p;
    if (h) g_be->upload(g_be, p, h, bytes);
    return (dc_buf){p, dt};
}
static dc_buf dev_f32(const float *h, int64_t n) { return dev_bytes(h, (size_t)n * sizeof(float), DC_F32); }
static dc_buf dev_nan(int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    dc_buf b = dev_f32(h, n);
    free(h);
    return b;
}
static dc_buf dev_zero(int64_t n) {
    float *h = calloc((size_t)n, sizeof *h);
    dc_buf b = dev_f32(h, n);
    free(h);
    return b;
}
static void dev_free_all(void) {
    while (g_ndev) g_be->free(g_be, g_dev[--g_ndev]);
}

// One weight in both storages: `half` (F16 or BF16) and `wide` (F32, the same
// values widened by core/dtype.h's converters), and the 16-bit values kept to
// check that no op writes to its weights.
typedef struct {
    dc_buf half, wide;
    uint16_t *bits;
    int64_t n;
} weight;

static uint16_t narrow(float f, dc_dtype dt) { return dt == DC_F16 ? dc_f32_to_f16(f) : dc_f32_to_bf16(f); }
static float widen(uint16_t h, dc_dtype dt) { return dt == DC_F16 ? dc_f16_to_f32(h) : dc_bf16_to_f32(h); }

// n values in [lo, hi] rounded to dt, none zero, every 37th a subnormal of dt
// (the values whose widening takes another path).
static weight weight_make(int64_t n, dc_dtype dt, float lo, float hi) {
    weight w = {.n = n, .bits = malloc((size_t)n * sizeof(uint16_t))};
    float *f = malloc((size_t)n * sizeof *f);
    const uint16_t sub_mask = dt == DC_F16 ? 0x03ff : 0x007f;  // mantissa bits of a subnormal
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = narrow(rnd(lo, hi), dt);
        if (i % 37 == 5) h = (uint16_t)((rnd_u64() & 0x8000) | (1 + rnd_u64() % sub_mask));
        if ((h & 0x7fff) == 0) h |= 0x0100;  // no zeros: a zero would hide a wrong widening
        w.bits[i] = h;
        f[i] = widen(h, dt);
    }
    w.half = dev_bytes(w.bits, (size_t)n * sizeof(uint16_t), dt);
    w.wide = dev_f32(f, n);
    free(f);
    return w;
}

static bool weight_intact(const weight *w) {
    uint16_t *now = malloc((size_t)w->n * sizeof *now);
    g_be->download(g_be, now, w->half.p, (size_t)w->n * sizeof *now);
    bool same = memcmp(now, w->bits, (size_t)w->n * sizeof *now) == 0;
    free(now);
    return same;
}

// a and b (n floats on the backend) hold the same bits, and none is NaN
// (the outputs started as NaN: every one was written).
static bool same_bits(dc_buf a, dc_buf b, int64_t n) {
    float *ha = malloc((size_t)n * sizeof *ha), *hb = malloc((size_t)n * sizeof *hb);
    g_be->download(g_be, ha, a.p, (size_t)n * sizeof *ha);
    g_be->download(g_be, hb, b.p, (size_t)n * sizeof *hb);
    bool ok = memcmp(ha, hb, (size_t)n * sizeof *ha) == 0;
    for (int64_t i = 0; ok && i < n; i++) ok = !isnan(ha[i]);
    free(ha), free(hb);
    return ok;
}

static const char *dt_name(dc_dtype dt) { return dc_dtype_name(dt); }

// ---- ops ---------------------------------------------------------------------------------

static void test_linear(dc_dtype dt, int M, int K, int N) {
    float *hx = host_rand((int64_t)M * K, -1, 1), *hd = host_rand((int64_t)M * N, -1, 1);
    dc_buf x = dev_f32(hx, (int64_t)M * K), dout = dev_f32(hd, (int64_t)M * N);
    weight w = weight_make((int64_t)N * K, dt, -0.2f, 0.2f), b = weight_make(N, dt, -1, 1);
    const int64_t MN = (int64_t)M * N, MK = (int64_t)M * K;
    dc_buf o[2], acc[2], pre[2], act[2], dx[2], dw[2], db[2], dpre[2];
    float *start = host_rand(MN, -1, 1);  // what linear_fwd_acc adds onto
    for (int v = 0; v < 2; v++) {
        const dc_buf W = v ? w.half : w.wide, B = v ? b.half : b.wide;
        o[v] = dev_nan(MN), acc[v] = dev_f32(start, MN), pre[v] = dev_nan(MN), act[v] = dev_nan(MN);
        dx[v] = dev_nan(MK), dw[v] = dev_zero((int64_t)N * K), db[v] = dev_zero(N), dpre[v] = dev_nan(MK);
        g_be->linear_fwd(g_be, o[v], x, W, B, M, K, N);
        g_be->linear_fwd_acc(g_be, acc[v], x, W, B, M, K, N);
        g_be->linear_gelu_fwd(g_be, act[v], pre[v], x, W, B, M, K, N);
        g_be->linear_bwd(g_be, dx[v], dw[v], db[v], dout, x, W, M, K, N, false);
        // fc2 of shape [N, K] after a GELU: its input act is x here, pre a fresh map
        g_be->linear_bwd_gelu(g_be, dpre[v], dw[v], db[v], dout, x, W, x, dev_nan(MK), M, K, N);
    }
    const bool ok = dc_backend_status(g_be) == 0;
    CHECK(ok && same_bits(o[0], o[1], MN), "linear_fwd, %s weights, %dx%d @ [%d,%d]^T", dt_name(dt), M, K, N, K);
    CHECK(ok && same_bits(acc[0], acc[1], MN), "linear_fwd_acc, %s weights (%d,%d,%d)", dt_name(dt), M, K, N);
    CHECK(ok && same_bits(pre[0], pre[1], MN) && same_bits(act[0], act[1], MN), "linear_gelu_fwd, %s weights",
          dt_name(dt));
    CHECK(ok && same_bits(dx[0], dx[1], MK), "linear_bwd dx, %s weights", dt_name(dt));
    CHECK(ok && same_bits(dw[0], dw[1], (int64_t)N * K) && same_bits(db[0], db[1], N) &&
              same_bits(dpre[0], dpre[1], MK), "linear_bwd_gelu (dpre, dw, db), %s weights", dt_name(dt));
    // without a bias
    dc_buf nb[2];
    for (int v = 0; v < 2; v++)
        nb[v] = dev_nan(MN), g_be->linear_fwd(g_be, nb[v], x, v ? w.half : w.wide, dc_buf_none(), M, K, N);
    CHECK(same_bits(nb[0], nb[1], MN), "linear_fwd without bias, %s weights", dt_name(dt));
    CHECK(weight_intact(&w) && weight_intact(&b), "linear ops leave their %s weights as they were", dt_name(dt));
    free(hx), free(hd), free(start), free(w.bits), free(b.bits);
    dev_free_all();
}

static int64_t conv_in(const dc_conv2d_shape *s) { return (int64_t)s->B * s->Ci * s->H * s->W; }
static int64_t conv_out(const dc_conv2d_shape *s) {
    return (int64_t)s->B * s->Co * dc_conv2d_ho(s) * dc_conv2d_wo(s);
}

static void test_conv(dc_dtype dt, dc_conv2d_shape s) {
    const int64_t nx = conv_in(&s), no = conv_out(&s), nw = (int64_t)s.Co * s.Ci * s.k * s.k;
    if (g_be->reserve_conv(g_be, &s, true)) {
        CHECK(0, "reserve_conv: %s", dc_error());
        return;
    }
    float *hx = host_rand(nx, -1, 1), *hd = host_rand(no, -1, 1);
    dc_buf x = dev_f32(hx, nx), dout = dev_f32(hd, no);
    weight w = weight_make(nw, dt, -0.3f, 0.3f), b = weight_make(s.Co, dt, -1, 1);
    dc_buf o[2], dx[2], dw[2], db[2];
    for (int v = 0; v < 2; v++) {
        o[v] = dev_nan(no), dx[v] = dev_nan(nx), dw[v] = dev_zero(nw), db[v] = dev_zero(s.Co);
        g_be->conv2d_fwd(g_be, o[v], x, v ? w.half : w.wide, v ? b.half : b.wide, &s);
        g_be->conv2d_bwd(g_be, dx[v], dw[v], db[v], dout, x, v ? w.half : w.wide, &s, false);
    }
    const bool ok = dc_backend_status(g_be) == 0;
    CHECK(ok && same_bits(o[0], o[1], no), "conv2d_fwd %s, %s weights, %d->%d k%d s%d on %dx%d",
          s.nhwc ? "nhwc" : "nchw", dt_name(dt), s.Ci, s.Co, s.k, s.stride, s.H, s.W);
    CHECK(ok && same_bits(dx[0], dx[1], nx) && same_bits(dw[0], dw[1], nw) && same_bits(db[0], db[1], s.Co),
          "conv2d_bwd %s (dx, dw, db), %s weights, k%d", s.nhwc ? "nhwc" : "nchw", dt_name(dt), s.k);
    CHECK(weight_intact(&w) && weight_intact(&b), "convolutions leave their %s weights as they were", dt_name(dt));
    free(hx), free(hd), free(w.bits), free(b.bits);
    dev_free_all();
}

static void test_group_norm(dc_dtype dt, int B, int C, int64_t HW, int G, bool silu) {
    const int64_t n = (int64_t)B * C * HW;
    float *hx = host_rand(n, -2, 3), *hd = host_rand(n, -1, 1);
    dc_buf x = dev_f32(hx, n), dout = dev_f32(hd, n);
    weight ga = weight_make(C, dt, 0.5f, 1.5f), be = weight_make(C, dt, -0.5f, 0.5f);
    dc_buf o[2], on[2], mean[2], rstd[2], dx[2], dg[2], dbt[2], m2[2], r2[2];
    for (int v = 0; v < 2; v++) {
        const dc_buf g = v ? ga.half : ga.wide, bb = v ? be.half : be.wide;
        o[v] = dev_nan(n), on[v] = dev_nan(n), mean[v] = dev_nan(B * G), rstd[v] = dev_nan(B * G);
        m2[v] = dev_nan(B * G), r2[v] = dev_nan(B * G);
        dx[v] = dev_nan(n), dg[v] = dev_zero(C), dbt[v] = dev_zero(C);
        g_be->group_norm_fwd(g_be, o[v], mean[v], rstd[v], x, g, bb, B, C, HW, G, 1e-5f, silu);
        g_be->group_norm_bwd(g_be, dx[v], dg[v], dbt[v], dout, x, mean[v], rstd[v], g, bb, B, C, HW, G, silu, false);
        g_be->group_norm_nhwc_fwd(g_be, on[v], m2[v], r2[v], x, g, bb, B, C, HW, G, 1e-6f, silu);
    }
    const bool ok = dc_backend_status(g_be) == 0;
    CHECK(ok && same_bits(o[0], o[1], n) && same_bits(mean[0], mean[1], B * G) && same_bits(rstd[0], rstd[1], B * G),
          "group_norm_fwd%s, %s weights, C %d G %d HW %lld", silu ? " + SiLU" : "", dt_name(dt), C, G, (long long)HW);
    CHECK(ok && same_bits(dx[0], dx[1], n) && same_bits(dg[0], dg[1], C) && same_bits(dbt[0], dbt[1], C),
          "group_norm_bwd%s, %s weights", silu ? " + SiLU" : "", dt_name(dt));
    CHECK(ok && same_bits(on[0], on[1], n) && same_bits(m2[0], m2[1], B * G), "group_norm_nhwc_fwd%s, %s weights",
          silu ? " + SiLU" : "", dt_name(dt));
    CHECK(weight_intact(&ga) && weight_intact(&be), "group norms leave their %s weights as they were", dt_name(dt));
    free(hx), free(hd), free(ga.bits), free(be.bits);
    dev_free_all();
}

static void test_layer_norm(dc_dtype dt, int64_t M, int D) {
    const int64_t n = M * D;
    float *hx = host_rand(n, -2, 3), *hd = host_rand(n, -1, 1);
    dc_buf x = dev_f32(hx, n), dout = dev_f32(hd, n);
    weight ga = weight_make(D, dt, 0.5f, 1.5f), be = weight_make(D, dt, -0.5f, 0.5f);
    dc_buf o[2], mean[2], rstd[2], dx[2], dg[2], dbt[2];
    for (int v = 0; v < 2; v++) {
        o[v] = dev_nan(n), mean[v] = dev_nan(M), rstd[v] = dev_nan(M);
        dx[v] = dev_nan(n), dg[v] = dev_zero(D), dbt[v] = dev_zero(D);
        g_be->layer_norm_fwd(g_be, o[v], mean[v], rstd[v], x, v ? ga.half : ga.wide, v ? be.half : be.wide, M, D,
                             1e-5f);
        g_be->layer_norm_bwd(g_be, dx[v], dg[v], dbt[v], dout, x, mean[v], rstd[v], v ? ga.half : ga.wide, M, D,
                             false);
    }
    const bool ok = dc_backend_status(g_be) == 0;
    CHECK(ok && same_bits(o[0], o[1], n) && same_bits(rstd[0], rstd[1], M), "layer_norm_fwd, %s weights, %lldx%d",
          dt_name(dt), (long long)M, D);
    CHECK(ok && same_bits(dx[0], dx[1], n) && same_bits(dg[0], dg[1], D) && same_bits(dbt[0], dbt[1], D),
          "layer_norm_bwd, %s weights", dt_name(dt));
    CHECK(weight_intact(&ga) && weight_intact(&be), "layer norms leave their %s weights as they were", dt_name(dt));
    free(hx), free(hd), free(ga.bits), free(be.bits);
    dev_free_all();
}

// The token table and the position rows of a text encoder.
static void test_embeddings(dc_dtype dt, int rows, int B, int T, int D) {
    weight table = weight_make((int64_t)rows * D, dt, -1, 1), pos = weight_make((int64_t)T * D, dt, -1, 1);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) ids[i] = (int32_t)(rnd_u64() % (uint64_t)rows);
    ids[0] = 0, ids[1] = rows - 1;  // both ends of the table
    dc_buf idx = dev_bytes(ids, sizeof(int32_t) * (size_t)B * T, DC_I32);
    const int64_t n = (int64_t)B * T * D;
    dc_buf o[2];
    for (int v = 0; v < 2; v++) {
        o[v] = dev_nan(n);
        g_be->embed_fwd(g_be, o[v], v ? table.half : table.wide, idx, B * T, D);
        g_be->add_rows(g_be, o[v], v ? pos.half : pos.wide, B, T, D);
    }
    CHECK(dc_backend_status(g_be) == 0 && same_bits(o[0], o[1], n),
          "embed_fwd + add_rows, %s table and positions, %d rows of %d", dt_name(dt), rows, D);
    CHECK(weight_intact(&table) && weight_intact(&pos), "embeddings leave their %s weights as they were", dt_name(dt));
    free(ids), free(table.bits), free(pos.bits);
    dev_free_all();
}

// Every 16-bit pattern through embed_fwd (a table of 256 rows of 256): the
// widening against core/dtype.h's converters, bit for bit (NaN stays NaN; a
// signalling NaN may come back quiet).
static void test_every_value(dc_dtype dt) {
    uint16_t *all = malloc(sizeof(uint16_t) * 65536);
    int32_t ids[256];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (int i = 0; i < 256; i++) ids[i] = i;
    dc_buf table = dev_bytes(all, sizeof(uint16_t) * 65536, dt), idx = dev_bytes(ids, sizeof ids, DC_I32);
    dc_buf out = dev_nan(65536);
    g_be->embed_fwd(g_be, out, table, idx, 256, 256);
    float *h = malloc(sizeof(float) * 65536);
    g_be->download(g_be, h, out.p, sizeof(float) * 65536);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        const float want = widen((uint16_t)i, dt);
        bad += isnan(want) ? !isnan(h[i]) : memcmp(&want, &h[i], sizeof want) != 0;
    }
    CHECK(bad == 0, "every %s value widens exactly (%d differ)", dt_name(dt), bad);
    free(all), free(h);
    dev_free_all();
}

static void test_ops(void) {
    const dc_dtype dts[2] = {DC_F16, DC_BF16};
    for (int i = 0; i < 2; i++) {
        const dc_dtype dt = dts[i];
        test_every_value(dt);
        test_linear(dt, 37, 300, 211);   // odd sizes: tails in every dimension, widened on all threads
        test_linear(dt, 2, 64, 1280);    // a time embedding's rows: sliced over columns
        dc_conv2d_shape c3 = {2, 24, 9, 11, 40, 3, 1, 1, 1, 1, 1, false};
        test_conv(dt, c3);
        c3.nhwc = true;
        test_conv(dt, c3);
        dc_conv2d_shape s2 = {1, 32, 12, 10, 48, 3, 2, 0, 1, 0, 1, true};  // the VAE's asymmetric downsampling
        test_conv(dt, s2);
        dc_conv2d_shape d1 = {2, 64, 6, 7, 96, 1, 1, 0, 0, 0, 0, true};   // 1x1: a GEMM on x itself
        test_conv(dt, d1);
        d1.nhwc = false;
        test_conv(dt, d1);
        test_group_norm(dt, 2, 64, 30, 32, false);
        test_group_norm(dt, 1, 96, 17, 32, true);
        test_layer_norm(dt, 77, 200);
        test_embeddings(dt, 500, 2, 77, 64);
    }
}

// ---- where a set is kept -------------------------------------------------------------------

static void write_file(const char *name, const dc_st_entry *e, int n) {
    if (dc_st_write(tmp_path(name), e, n, NULL, NULL, 0)) printf("FAIL writing %s: %s\n", name, dc_error()), exit(1);
}

// dc_weights_dtype over files of one dtype, mixed ones, and integer tensors,
// under a prefix.
static void test_weights_dtype(void) {
    uint16_t h[4] = {0x3c00, 0x4000, 0x3c00, 0x4000};
    float f[4] = {1, 2, 3, 4};
    int64_t ids[4] = {0, 1, 2, 3};
    dc_st_entry e[4] = {
        {"a.w", DC_F16, 1, {4}, h}, {"a.b", DC_F16, 1, {4}, h}, {"a.position_ids", DC_I64, 1, {4}, ids},
        {"b.w", DC_F32, 1, {4}, f},
    };
    write_file("f16.safetensors", e, 4);
    e[0].dtype = e[1].dtype = DC_BF16;
    write_file("bf16.safetensors", e, 3);
    e[1].dtype = DC_F16;
    write_file("mixed.safetensors", e, 3);
    const char *files[3] = {"f16.safetensors", "bf16.safetensors", "mixed.safetensors"};
    const dc_dtype want_a[3] = {DC_F16, DC_BF16, DC_F32};
    for (int i = 0; i < 3; i++) {
        dc_st_file sf;
        if (dc_st_open(&sf, tmp_path(files[i]))) {
            CHECK(0, "%s", dc_error());
            continue;
        }
        dc_weights w = {&sf, 1, "a."};
        CHECK(dc_weights_dtype(&w) == want_a[i], "%s under 'a.': %s, want %s (integer ids not counted)", files[i],
              dt_name(dc_weights_dtype(&w)), dt_name(want_a[i]));
        snprintf(w.prefix, sizeof w.prefix, "%s", "");
        CHECK(i > 0 || dc_weights_dtype(&w) == DC_F32, "f16.safetensors with its F32 tensor: %s",
              dt_name(dc_weights_dtype(&w)));
        snprintf(w.prefix, sizeof w.prefix, "%s", "none.");
        CHECK(dc_weights_dtype(&w) == DC_F32, "%s: no tensor under the prefix gives F32", files[i]);
        dc_st_close(&sf);
    }
    // Storage: as loaded where the backend reads half weights, else its compute dtype.
    dc_backend gpu_like = *g_be;
    gpu_like.half_weights = false;
    struct { dc_backend *be; dc_dtype compute, loaded, want; } cases[] = {
        {g_be, DC_F32, DC_F16, DC_F16},       {g_be, DC_F32, DC_BF16, DC_BF16},
        {g_be, DC_F32, DC_F32, DC_F32},       {&gpu_like, DC_F32, DC_F16, DC_F32},
        {&gpu_like, DC_BF16, DC_F16, DC_BF16}, {&gpu_like, DC_BF16, DC_F32, DC_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dc_backend *be = cases[i].be;
        be->compute = cases[i].compute;
        dc_params ps = {0};
        int rc = dc_params_add(&ps, "w", true, 2, 3, 5) < 0 || dc_params_alloc_frozen(&ps, be, cases[i].loaded);
        CHECK(!rc && ps.frozen.dt == cases[i].want && ps.frozen.p && ps.items[0].frozen && !ps.data.p && !ps.wc.p,
              "frozen set loaded %s, %s computing in %s: kept as %s, want %s", dt_name(cases[i].loaded),
              be->half_weights ? "half weights" : "no half weights", dt_name(be->compute), dt_name(ps.frozen.dt),
              dt_name(cases[i].want));
        dc_params_free(&ps);
    }
    g_be->compute = DC_F32;
}

// ---- whole models ------------------------------------------------------------------------

// What one model's checks run with: the counting backend, the model's name,
// the dtype its files give. Each component is loaded twice: kept as loaded
// (a, as the pipeline loads it) and widened to F32 (b).
typedef struct {
    counter *k;
    const char *what;
    dc_dtype want;
} model_case;

// The bytes a create-and-load call took from the backend: the weights alone.
static int64_t held_since(counter *k, int64_t before) { return k->now - before; }

// n values in [lo, hi] on be (lo = hi = NaN: an output that must be written).
static dc_buf rand_dev(dc_backend *be, int64_t n, float lo, float hi) {
    float *h = host_rand(n, lo, hi);
    if (isnan(lo))
        for (int64_t i = 0; i < n; i++) h[i] = NAN;
    dc_buf b = {NULL, DC_F32};
    if (!dc_buf_alloc(be, &b, DC_F32, (size_t)n, "input")) be->upload(be, b.p, h, (size_t)n * sizeof *h);
    free(h);
    return b;
}

static bool same_host(dc_backend *be, dc_buf a, dc_buf b, int64_t n) {
    float *ha = malloc((size_t)n * sizeof *ha), *hb = malloc((size_t)n * sizeof *hb);
    be->download(be, ha, a.p, (size_t)n * sizeof *ha);
    be->download(be, hb, b.p, (size_t)n * sizeof *hb);
    bool ok = memcmp(ha, hb, (size_t)n * sizeof *ha) == 0;
    for (int64_t i = 0; ok && i < n; i++) ok = isfinite(ha[i]);
    free(ha), free(hb);
    return ok;
}

static void check_kept(const model_case *mc, const char *part, const dc_params *a, const dc_params *b, int64_t ba,
                       int64_t bb) {
    printf("  %s %s: %lld weights kept as %s in %lld bytes (widened: %lld)\n", mc->what, part,
           (long long)a->frozen_numel, dt_name(a->frozen.dt), (long long)ba, (long long)bb);
    // every parameter frozen: nothing in the flat (trainable) buffers
    CHECK(a->frozen.dt == mc->want && a->numel == 0 && ba == a->frozen_numel * (int64_t)dc_dtype_size(mc->want) &&
              (size_t)ba == dc_params_bytes(a),
          "%s: %s weights kept as %s, %lld bytes for %lld weights", mc->what, dt_name(mc->want),
          dt_name(a->frozen.dt), (long long)ba, (long long)a->frozen_numel);
    CHECK(b->frozen.dt == DC_F32 && b->numel == 0 && bb == b->frozen_numel * 4,
          "%s: the widened copy is F32, %lld bytes", mc->what, (long long)bb);
}

static void model_text(const model_case *mc, dc_sd_source *s) {
    dc_backend *be = &mc->k->be;
    dc_clip_text *a = NULL, *b = NULL;
    int skip = 0;
    int64_t k0 = mc->k->now;
    int rc = dc_sd_load_text(s, be, &skip, &a);
    int64_t k1 = mc->k->now;
    if (!rc) rc = dc_clip_text_create(&b, &a->cfg, be, DC_F32) || dc_clip_text_load(b, &s->w, s->names);
    if (rc) {
        CHECK(0, "%s: text encoder: %s", mc->what, dc_error());
        goto done;
    }
    check_kept(mc, "text encoder", a->params, b->params, k1 - k0, held_since(mc->k, k1));
    enum { B = 2 };
    const int T = a->cfg.positions, W = a->cfg.width;
    int32_t *ids = malloc(sizeof(int32_t) * B * (size_t)T);
    for (int i = 0; i < B * T; i++) ids[i] = (int32_t)(rnd_u64() % (uint64_t)a->cfg.vocab);
    dc_buf di = {0}, h[2] = {{0}}, p[2] = {{0}};
    rc = dc_buf_alloc(be, &di, DC_I32, (size_t)B * T, "ids");
    for (int v = 0; v < 2 && !rc; v++)
        rc = dc_buf_alloc(be, &h[v], DC_F32, (size_t)B * T * W, "hidden") ||
             dc_buf_alloc(be, &p[v], DC_F32, (size_t)B * T * W, "pen");
    if (!rc) be->upload(be, di.p, ids, sizeof(int32_t) * B * (size_t)T);
    dc_clip_text *m[2] = {a, b};
    for (int v = 0; v < 2 && !rc; v++)
        rc = dc_clip_text_reserve(m[v], B) || dc_clip_text_forward(m[v], h[v], p[v], di, B, skip);
    CHECK(!rc && same_host(be, h[0], h[1], (int64_t)B * T * W) && same_host(be, p[0], p[1], (int64_t)B * T * W),
          "%s: text encoder (hidden and penultimate) the same bits from %s and F32 weights: %s", mc->what,
          dt_name(mc->want), rc ? dc_error() : "");
    dc_buf all[5] = {di, h[0], h[1], p[0], p[1]};
    for (int i = 0; i < 5; i++)
        if (all[i].p) be->free(be, all[i].p);
    free(ids);
done:
    dc_clip_text_free(a), dc_clip_text_free(b);
}

static void model_unet(const model_case *mc, dc_sd_source *s) {
    dc_backend *be = &mc->k->be;
    dc_model *a = NULL, *b = NULL;
    enum { B = 2, L = 8 };
    int64_t k0 = mc->k->now;
    int rc = dc_sd_load_unet(s, be, L, L, NULL, &a);
    int64_t k1 = mc->k->now;
    if (!rc) rc = dc_unet_new(&dc_unet_of(a)->cfg, be, DC_F32, L, L, &b) || dc_unet_load(b, &s->w, s->names);
    if (rc) {
        CHECK(0, "%s: UNet: %s", mc->what, dc_error());
        goto done;
    }
    check_kept(mc, "UNet", a->params, b->params, k1 - k0, held_since(mc->k, k1));
    const dc_unet_config *c = &dc_unet_of(a)->cfg;
    const int64_t nx = (int64_t)B * c->in_channels * L * L, no = (int64_t)B * c->out_channels * L * L;
    const int64_t nc = (int64_t)B * DC_UNET_CTX_LEN * c->ctx_dim;
    dc_buf x = rand_dev(be, nx, -2, 2), ctx = rand_dev(be, nc, -1, 1), t = rand_dev(be, B, 1, 999);
    dc_buf out[2] = {rand_dev(be, no, NAN, NAN), rand_dev(be, no, NAN, NAN)};
    dc_cond cond = {.ctx = ctx, .len = DC_UNET_CTX_LEN, .dim = c->ctx_dim};
    dc_model *m[2] = {a, b};
    for (int v = 0; v < 2 && !rc; v++)
        rc = dc_model_reserve(m[v], B) || dc_model_forward(m[v], out[v], x, t, &cond, B);
    CHECK(!rc && same_host(be, out[0], out[1], no), "%s: UNet the same bits from %s and F32 weights: %s", mc->what,
          dt_name(mc->want), rc ? dc_error() : "");
    dc_buf all[5] = {x, ctx, t, out[0], out[1]};
    for (int i = 0; i < 5; i++)
        if (all[i].p) be->free(be, all[i].p);
done:
    dc_model_free(a), dc_model_free(b);
}

static void model_vae(const model_case *mc, dc_sd_source *s) {
    dc_backend *be = &mc->k->be;
    dc_vae *a = NULL, *b = NULL;
    int64_t k0 = mc->k->now;
    int rc = dc_sd_load_vae(s, be, true, true, &a);
    int64_t k1 = mc->k->now;
    if (!rc) rc = dc_vae_create(&b, &a->cfg, be, DC_F32, true, true) || dc_vae_load(b, &s->w, s->names);
    if (rc) {
        CHECK(0, "%s: VAE: %s", mc->what, dc_error());
        goto done;
    }
    check_kept(mc, "VAE", &a->params, &b->params, k1 - k0, held_since(mc->k, k1));
    enum { B = 2, H = 32, W = 24 };
    const int f = dc_vae_factor(&a->cfg), lc = a->cfg.latent_channels;
    const int64_t ni = (int64_t)B * 3 * H * W, nl = (int64_t)B * lc * (H / f) * (W / f);
    dc_buf img = rand_dev(be, ni, -1, 1), z = rand_dev(be, nl, -3, 3);
    dc_buf mean[2], logvar[2], dec[2];
    for (int v = 0; v < 2; v++) {
        mean[v] = rand_dev(be, nl, NAN, NAN), logvar[v] = rand_dev(be, nl, NAN, NAN);
        dec[v] = rand_dev(be, ni, NAN, NAN);
    }
    dc_vae *m[2] = {a, b};
    for (int v = 0; v < 2 && !rc; v++)
        rc = dc_vae_reserve(m[v], B, H, W) || dc_vae_encode(m[v], mean[v], logvar[v], img, B, H, W) ||
             dc_vae_decode(m[v], dec[v], z, B, H / f, W / f);
    CHECK(!rc && same_host(be, mean[0], mean[1], nl) && same_host(be, logvar[0], logvar[1], nl),
          "%s: VAE encode the same bits from %s and F32 weights: %s", mc->what, dt_name(mc->want),
          rc ? dc_error() : "");
    CHECK(!rc && same_host(be, dec[0], dec[1], ni), "%s: VAE decode the same bits from %s and F32 weights",
          mc->what, dt_name(mc->want));
    dc_buf all[8] = {img, z, mean[0], mean[1], logvar[0], logvar[1], dec[0], dec[1]};
    for (int i = 0; i < 8; i++)
        if (all[i].p) be->free(be, all[i].p);
done:
    dc_vae_free(a), dc_vae_free(b);
}

// A set kept as F16 refuses a BF16 file, naming the tensor and both dtypes.
static void model_refuse(counter *k, dc_sd_source *s, dc_dtype file_dt) {
    dc_unet_config c;
    const dc_dtype other = file_dt == DC_F16 ? DC_BF16 : DC_F16;
    dc_model *m = NULL;
    int rc = dc_unet_config_from_json(&c, dc_sd_config(s), s->dir) || dc_unet_new(&c, &k->be, other, 8, 8, &m);
    CHECK(!rc && dc_unet_load(m, &s->w, s->names) != 0 && strstr(dc_error(), dt_name(file_dt)) &&
              strstr(dc_error(), dt_name(other)) && strstr(dc_error(), "conv_in.weight"),
          "a UNet kept as %s refuses %s tensors: %s", dt_name(other), dt_name(file_dt), dc_error());
    printf("  refused: %s\n", dc_error());
    dc_model_free(m);
}

static void test_model(counter *k, const char *tool, const char *config, const char *layout, const char *dtype,
                       dc_dtype want) {
    char dir[256], cmd[900], what[96];
    snprintf(what, sizeof what, "%s %s %s", config, layout, dtype);
    snprintf(dir, sizeof dir, "%s", tmp_path(what));
    for (char *c = dir + strlen(g_dir) + 1; *c; c++)
        if (*c == ' ') *c = '_';
    snprintf(cmd, sizeof cmd, "'%s' --config %s --layout %s --dtype %s --seed 5 --out '%s%s' > /dev/null", tool,
             config, layout, dtype, dir, strcmp(layout, "single") ? "" : ".safetensors");
    if (system(cmd) != 0) {
        CHECK(0, "%s", cmd);
        return;
    }
    if (!strcmp(layout, "single")) strcat(dir, ".safetensors");
    dc_sd_model files;
    if (dc_sd_model_open(&files, dir, 0)) {
        CHECK(0, "%s: %s", what, dc_error());
        return;
    }
    const model_case mc = {k, what, want};
    const dc_sd_part parts[3] = {DC_SD_TEXT, DC_SD_UNET, DC_SD_VAE};
    for (int i = 0; i < 3; i++) {
        dc_sd_source s;
        if (dc_sd_source_open(&s, &files, parts[i])) {
            CHECK(0, "%s: %s", what, dc_error());
            continue;
        }
        CHECK(dc_weights_dtype(&s.w) == want, "%s %s: files' dtype %s", what, dc_sd_part_name(parts[i]),
              dt_name(dc_weights_dtype(&s.w)));
        if (parts[i] == DC_SD_TEXT) model_text(&mc, &s);
        if (parts[i] == DC_SD_UNET) model_unet(&mc, &s);
        if (parts[i] == DC_SD_VAE) model_vae(&mc, &s);
        if (parts[i] == DC_SD_UNET && dc_sd_config(&s)) model_refuse(k, &s, want);
        dc_sd_source_close(&s);
    }
    dc_sd_model_close(&files);
    CHECK(k->now == 0, "%s: every buffer given back (%lld bytes held)", what, (long long)k->now);
}

int main(int argc, char **argv) {
    (void)argc;
    if (tmpdir_make("half_weights")) return 1;
    static counter k;  // large: not on the stack
    if (counter_init(&k)) return printf("FAIL no CPU backend: %s\n", dc_error()), 1;
    counter_reset(&k, 0);
    g_be = k.cpu;
    test_ops();
    test_weights_dtype();
    // tools/sd_random beside this program's folder (BUILD/tools, BUILD/tests)
    const char *slash = strrchr(argv[0], '/');
    char tool[400];
    snprintf(tool, sizeof tool, "%.*s/../tools/sd_random", slash ? (int)(slash - argv[0]) : 1, slash ? argv[0] : ".");
    test_model(&k, tool, "tiny1", "diffusers", "f16", DC_F16);
    test_model(&k, tool, "tiny1", "diffusers", "bf16", DC_BF16);
    test_model(&k, tool, "tiny2", "single", "f16", DC_F16);
    counter_free(&k);
    tmpdir_remove();
    printf("%d of %d checks passed\n", g_pass, g_pass + g_fail);
    return g_fail ? 1 : 0;
}
