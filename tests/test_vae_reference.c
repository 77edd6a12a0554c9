// A small VAE (diffusers AutoencoderKL) with random weights on the CPU against
// a float64 reference written here from diffusers' definitions (direct
// convolutions, no slots or transposes): loaded from files in the diffusers
// layout, the original single-file layout and old diffusers' attention names,
// with its config inferred from the shapes; missing and mis-shaped tensors
// refused by name; each half alone and the calls a model cannot serve; the
// multiply-add count. (Registration, config.json and diffusers' golden data
// are in test_vae.c.)
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/vae.h"
#include "vae_run.h"

// ---- a small VAE with random weights

// Deterministic values in [-1, 1).
static float unit(uint32_t a, uint32_t b) {
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 32;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1);
}

// Host weights of every parameter of m, by diffusers name.
typedef struct {
    int n;
    char (*name)[DC_PARAM_NAME_MAX];
    int ndim[512];
    int64_t shape[512][4];
    float *data[512];
} tset;

static void tset_make(tset *t, const dc_vae *m) {
    const dc_params *ps = &m->params;
    t->n = ps->count;
    t->name = calloc((size_t)t->n, sizeof *t->name);
    for (int i = 0; i < t->n; i++) {
        const dc_param *p = &ps->items[i];
        memcpy(t->name[i], p->name, DC_PARAM_NAME_MAX);
        t->ndim[i] = p->ndim;
        memcpy(t->shape[i], p->shape, sizeof t->shape[i]);
        t->data[i] = malloc((size_t)p->numel * sizeof(float));
        bool is_norm = strstr(p->name, "norm") != NULL;
        bool bias = strstr(p->name, ".bias") != NULL;
        double fan_in = p->ndim > 1 ? (double)p->numel / p->shape[0] : 1;
        for (int64_t j = 0; j < p->numel; j++) {
            float u = unit((uint32_t)i, (uint32_t)j);
            t->data[i][j] = is_norm ? (bias ? 0.2f * u : 1.0f + 0.2f * u)
                                    : bias ? 0.1f * u : u * (float)(1.7 / sqrt(fan_in));
        }
    }
}

static void tset_free(tset *t) {
    for (int i = 0; i < t->n; i++) free(t->data[i]);
    free(t->name);
}

static const float *tget(const tset *t, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->name[i], name)) return t->data[i];
    printf("reference: no weight %s\n", name);
    exit(1);
}

enum { LAYOUT_DIFFUSERS, LAYOUT_ORIGINAL, LAYOUT_LEGACY };

// A safetensors file (parsed from memory) of t's tensors under the names of
// `layout` after `prefix`, without tensor `skip` and with tensor `bad` given
// another shape (-1: none).
static int make_file(dc_st_file *f, const tset *t, const dc_vae_config *c, int layout, const char *prefix, int skip,
                     int bad) {
    dc_st_entry *e = calloc((size_t)t->n, sizeof *e);
    char (*names)[200] = calloc((size_t)t->n, 200);
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        if (i == skip) continue;
        dc_weight_src s = {{0}, 0, 0};
        snprintf(s.name, sizeof s.name, "%s", t->name[i]);
        if (layout == LAYOUT_ORIGINAL && dc_vae_original_name(c, t->name[i], &s)) return -1;
        if (layout == LAYOUT_LEGACY) {
            const char *now[] = {".to_q.", ".to_k.", ".to_v.", ".to_out.0."};
            const char *old[] = {".query.", ".key.", ".value.", ".proj_attn."};
            for (int k = 0; k < 4; k++) {
                const char *at = strstr(t->name[i], now[k]);
                if (at)
                    snprintf(s.name, sizeof s.name, "%.*s%s%s", (int)(at - t->name[i]), t->name[i], old[k],
                             at + strlen(now[k]));
            }
        }
        snprintf(names[n], 200, "%s%s", prefix, s.name);
        e[n] = (dc_st_entry){names[n], DC_F32, t->ndim[i], {0}, t->data[i]};
        memcpy(e[n].shape, t->shape[i], sizeof t->shape[i]);
        // the original layout's attention projections are 1x1 convolutions
        if (layout == LAYOUT_ORIGINAL && strstr(s.name, "attn_1.") && t->ndim[i] == 2)
            e[n].ndim = 4, e[n].shape[2] = e[n].shape[3] = 1;
        if (i == bad) e[n].shape[0] /= 2, e[n].shape[1] *= 2;  // same size, another shape
        n++;
    }
    uint8_t *bytes;
    size_t len;
    int rc = dc_st_serialize(e, n, NULL, NULL, 0, &bytes, &len);
    if (!rc) rc = dc_st_parse(f, bytes, len, layout == LAYOUT_ORIGINAL ? "single.safetensors" : "vae.safetensors");
    if (!rc) free(bytes);
    free(e), free(names);
    return rc;
}

// ---- the float64 reference, from diffusers' definitions

typedef struct { double *v; int C, H, W; } map;

static map mk(int C, int H, int W) { return (map){calloc((size_t)C * H * W, sizeof(double)), C, H, W}; }

static map ref_conv(map x, const float *w, const float *b, int co, int k, int stride, int pt, int pb, int pl,
                    int pr) {
    int Ho = (x.H + pt + pb - k) / stride + 1, Wo = (x.W + pl + pr - k) / stride + 1;
    map y = mk(co, Ho, Wo);
    for (int o = 0; o < co; o++)
        for (int i = 0; i < Ho; i++)
            for (int j = 0; j < Wo; j++) {
                double s = b[o];
                for (int c = 0; c < x.C; c++)
                    for (int di = 0; di < k; di++)
                        for (int dj = 0; dj < k; dj++) {
                            int r = i * stride + di - pt, q = j * stride + dj - pl;
                            if (r >= 0 && r < x.H && q >= 0 && q < x.W)
                                s += (double)w[((o * x.C + c) * k + di) * k + dj] *
                                     x.v[((int64_t)c * x.H + r) * x.W + q];
                        }
                y.v[((int64_t)o * Ho + i) * Wo + j] = s;
            }
    return y;
}

static map ref_conv_named(const tset *t, map x, const char *name, int co, int k) {
    int p = k / 2;
    return ref_conv(x, tget(t, "%s.weight", name), tget(t, "%s.bias", name), co, k, 1, p, p, p, p);
}

static map ref_gn(const tset *t, map x, const char *name, bool silu) {
    const float *g = tget(t, "%s.weight", name), *b = tget(t, "%s.bias", name);
    map y = mk(x.C, x.H, x.W);
    int G = 32, per = x.C / G;
    int64_t HW = (int64_t)x.H * x.W, n = per * HW;
    for (int gi = 0; gi < G; gi++) {
        double *v = x.v + gi * n, mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++) mean += v[i];
        mean /= n;
        for (int64_t i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
        var /= n;
        for (int64_t i = 0; i < n; i++) {
            int c = gi * per + (int)(i / HW);
            double h = (v[i] - mean) / sqrt(var + 1e-6) * g[c] + b[c];
            y.v[gi * n + i] = silu ? h / (1 + exp(-h)) : h;
        }
    }
    return y;
}

static void add_into(map y, map x) {
    for (int64_t i = 0; i < (int64_t)y.C * y.H * y.W; i++) y.v[i] += x.v[i];
}

static map ref_resnet(const tset *t, map x, const char *name, int co) {
    char k[160];
    map a = ref_gn(t, x, (snprintf(k, sizeof k, "%s.norm1", name), k), true);
    map b = ref_conv_named(t, a, (snprintf(k, sizeof k, "%s.conv1", name), k), co, 3);
    free(a.v);
    a = ref_gn(t, b, (snprintf(k, sizeof k, "%s.norm2", name), k), true);
    free(b.v);
    b = ref_conv_named(t, a, (snprintf(k, sizeof k, "%s.conv2", name), k), co, 3);
    free(a.v);
    if (x.C != co) {
        map s = ref_conv_named(t, x, (snprintf(k, sizeof k, "%s.conv_shortcut", name), k), co, 1);
        add_into(b, s);
        free(s.v);
    } else {
        add_into(b, x);
    }
    free(x.v);
    return b;
}

// Tokens [HW, C] through a linear layer: y[n, o] = sum_c x[n, c] W[o, c] + b[o].
static double *ref_linear(const tset *t, const double *x, const char *name, int N, int C) {
    const float *w = tget(t, "%s.weight", name), *b = tget(t, "%s.bias", name);
    double *y = malloc((size_t)N * C * sizeof *y);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < C; o++) {
            double s = b[o];
            for (int c = 0; c < C; c++) s += x[(int64_t)n * C + c] * w[(int64_t)o * C + c];
            y[(int64_t)n * C + o] = s;
        }
    return y;
}

static map ref_attention(const tset *t, map x, const char *side) {
    char k[160];
    int C = x.C, N = x.H * x.W;
    map nx = ref_gn(t, x, (snprintf(k, sizeof k, "%s.mid_block.attentions.0.group_norm", side), k), false);
    double *tok = calloc((size_t)N * C, sizeof *tok);
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++) tok[(int64_t)n * C + c] = nx.v[(int64_t)c * N + n];
    double *q = ref_linear(t, tok, (snprintf(k, sizeof k, "%s.mid_block.attentions.0.to_q", side), k), N, C);
    double *kk = ref_linear(t, tok, (snprintf(k, sizeof k, "%s.mid_block.attentions.0.to_k", side), k), N, C);
    double *v = ref_linear(t, tok, (snprintf(k, sizeof k, "%s.mid_block.attentions.0.to_v", side), k), N, C);
    double *o = calloc((size_t)N * C, sizeof *o), *p = malloc((size_t)N * sizeof *p);
    for (int i = 0; i < N; i++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += q[(int64_t)i * C + c] * kk[(int64_t)j * C + c];
            p[j] = s / sqrt((double)C);
            if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j < N; j++) sum += p[j] = exp(p[j] - mx);
        for (int j = 0; j < N; j++)
            for (int c = 0; c < C; c++) o[(int64_t)i * C + c] += p[j] / sum * v[(int64_t)j * C + c];
    }
    double *out = ref_linear(t, o, (snprintf(k, sizeof k, "%s.mid_block.attentions.0.to_out.0", side), k), N, C);
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++) x.v[(int64_t)c * N + n] += out[(int64_t)n * C + c];
    free(nx.v), free(tok), free(q), free(kk), free(v), free(o), free(p), free(out);
    return x;
}

static map ref_mid(const tset *t, map x, const char *side) {
    char k[160];
    x = ref_resnet(t, x, (snprintf(k, sizeof k, "%s.mid_block.resnets.0", side), k), x.C);
    x = ref_attention(t, x, side);
    return ref_resnet(t, x, (snprintf(k, sizeof k, "%s.mid_block.resnets.1", side), k), x.C);
}

// image [in, H, W] -> mean, logvar [latent, h, w] (float)
static void ref_encode(const tset *t, const dc_vae_config *c, const float *img, int H, int W, float *mean,
                       float *logvar) {
    char k[160];
    map x = mk(c->in_channels, H, W);
    for (int64_t i = 0; i < (int64_t)c->in_channels * H * W; i++) x.v[i] = img[i];
    map y = ref_conv_named(t, x, "encoder.conv_in", c->ch[0], 3);
    free(x.v);
    for (int i = 0; i < c->nblocks; i++) {
        for (int j = 0; j < c->layers_per_block; j++)
            y = ref_resnet(t, y, (snprintf(k, sizeof k, "encoder.down_blocks.%d.resnets.%d", i, j), k), c->ch[i]);
        if (i + 1 < c->nblocks) {
            map d = ref_conv(y, tget(t, "encoder.down_blocks.%d.downsamplers.0.conv.weight", i),
                             tget(t, "encoder.down_blocks.%d.downsamplers.0.conv.bias", i), c->ch[i], 3, 2, 0, 1, 0, 1);
            free(y.v);
            y = d;
        }
    }
    y = ref_mid(t, y, "encoder");
    map a = ref_gn(t, y, "encoder.conv_norm_out", true);
    map b = ref_conv_named(t, a, "encoder.conv_out", 2 * c->latent_channels, 3);
    map q = ref_conv_named(t, b, "quant_conv", 2 * c->latent_channels, 1);
    int64_t n = (int64_t)c->latent_channels * q.H * q.W;
    for (int64_t i = 0; i < n; i++) {
        mean[i] = (float)q.v[i];
        logvar[i] = (float)fmin(20.0, fmax(-30.0, q.v[n + i]));
    }
    free(y.v), free(a.v), free(b.v), free(q.v);
}

// z [latent, h, w] -> image [out, f h, f w] (float)
static void ref_decode(const tset *t, const dc_vae_config *c, const float *z, int h, int w, float *img) {
    char k[160];
    int n = c->nblocks;
    map x = mk(c->latent_channels, h, w);
    for (int64_t i = 0; i < (int64_t)c->latent_channels * h * w; i++) x.v[i] = z[i];
    map p = ref_conv_named(t, x, "post_quant_conv", c->latent_channels, 1);
    map y = ref_conv_named(t, p, "decoder.conv_in", c->ch[n - 1], 3);
    free(x.v), free(p.v);
    y = ref_mid(t, y, "decoder");
    for (int i = 0; i < n; i++) {
        for (int j = 0; j <= c->layers_per_block; j++)
            y = ref_resnet(t, y, (snprintf(k, sizeof k, "decoder.up_blocks.%d.resnets.%d", i, j), k),
                           c->ch[n - 1 - i]);
        if (i + 1 < n) {
            map u = mk(y.C, 2 * y.H, 2 * y.W);
            for (int ch = 0; ch < y.C; ch++)
                for (int r = 0; r < u.H; r++)
                    for (int q = 0; q < u.W; q++)
                        u.v[((int64_t)ch * u.H + r) * u.W + q] = y.v[((int64_t)ch * y.H + r / 2) * y.W + q / 2];
            free(y.v);
            y = ref_conv_named(t, u, (snprintf(k, sizeof k, "decoder.up_blocks.%d.upsamplers.0.conv", i), k), u.C, 3);
            free(u.v);
        }
    }
    map a = ref_gn(t, y, "decoder.conv_norm_out", true);
    map o = ref_conv_named(t, a, "decoder.conv_out", c->out_channels, 3);
    for (int64_t i = 0; i < (int64_t)o.C * o.H * o.W; i++) img[i] = (float)o.v[i];
    free(y.v), free(a.v), free(o.v);
}


// Loads file f (layout, prefix) into a new model of config c and runs it.
static int load_and_run(dc_backend *be, const dc_vae_config *c, const dc_st_file *f, dc_names names,
                        const char *prefix, const float *img, const float *z, int B, int H, int W, outputs *o) {
    dc_vae *m;
    dc_weights w = {(dc_st_file *)f, 1, ""};
    snprintf(w.prefix, sizeof w.prefix, "%s", prefix);
    DC_TRY(dc_vae_create(&m, c, be, dc_weights_dtype(&w), true, true));
    int rc = dc_vae_load(m, &w, names);
    if (!rc) rc = run(m, img, z, B, H, W, o);
    dc_vae_free(m);
    return rc;
}

// float32 against float64 through ~50 layers lands at ~1e-6 (measured); a
// wrong index, weight or padding gives errors of order 0.1 to 1.
#define TOL_REF 2e-5
// Images together vs one at a time: the same sums in another order where
// the CPU's matrix products see another row count (about 4e-7 measured); a
// wrong image or offset gives errors of order 1.
#define TOL_BATCH 2e-6

static void test_small(dc_backend *be) {
    // three levels (f = 4), channel changes in both halves, two resnets a block
    dc_vae_config c = {.in_channels = 3, .out_channels = 3, .latent_channels = 4, .nblocks = 3, .ch = {32, 64, 64},
                       .layers_per_block = 2, .groups = 32, .eps = 1e-6f, .scaling_factor = 0.18215f};
    enum { B = 2, H = 16, W = 12 };
    int f = dc_vae_factor(&c), h = H / f, w = W / f;
    dc_vae *m;
    if (dc_vae_create(&m, &c, be, DC_F32, true, true)) {
        CHECK(0, "create: %s", dc_error());
        return;
    }
    tset t;
    tset_make(&t, m);
    dc_vae_free(m);
    // logvar channels 0 and 1 far outside [-30, 20], so the clamp acts
    for (int i = 0; i < t.n; i++)
        if (!strcmp(t.name[i], "quant_conv.bias")) t.data[i][4] = 100, t.data[i][5] = -100;
    float img[B * 3 * H * W], z[B * 4 * 4 * 3];
    for (int i = 0; i < B * 3 * H * W; i++) img[i] = unit(1000, (uint32_t)i);
    for (int i = 0; i < B * 4 * h * w; i++) z[i] = 3 * unit(2000, (uint32_t)i);

    // the reference
    int64_t nl = 4 * h * w, ni = 3 * H * W;
    float rmean[B * 4 * 4 * 3], rlogvar[B * 4 * 4 * 3], rdec[B * 3 * H * W];
    for (int b = 0; b < B; b++) {
        ref_encode(&t, &c, img + b * ni, H, W, rmean + b * nl, rlogvar + b * nl);
        ref_decode(&t, &c, z + b * nl, h, w, rdec + b * ni);
    }

    const char *layout_name[3] = {"diffusers", "original", "old diffusers attention names"};
    const char *prefix[3] = {"", "first_stage_model.", "vae."};
    dc_names names[3] = {DC_NAMES_DIFFUSERS, DC_NAMES_ORIGINAL, DC_NAMES_DIFFUSERS};
    outputs first = {0};
    for (int l = 0; l < 3; l++) {
        dc_st_file f;
        outputs o = {0};
        if (make_file(&f, &t, &c, l, prefix[l], -1, -1)) {
            CHECK(0, "make %s file: %s", layout_name[l], dc_error());
            continue;
        }
        dc_weights wt = {&f, 1, ""};
        snprintf(wt.prefix, sizeof wt.prefix, "%s", prefix[l]);
        dc_vae_config inf;
        CHECK(dc_vae_config_infer(&inf, &wt, names[l]) == 0 && same_config(&inf, &c),
              "%s layout: config inferred from the shapes", layout_name[l]);
        if (load_and_run(be, &c, &f, names[l], prefix[l], img, z, B, H, W, &o)) {
            CHECK(0, "%s layout: %s", layout_name[l], dc_error());
            dc_st_close(&f);
            continue;
        }
        double em = nerr(o.mean, rmean, B * nl), el = nerr(o.logvar, rlogvar, B * nl), ed = nerr(o.dec, rdec, B * ni);
        CHECK(em < TOL_REF && el < TOL_REF && ed < TOL_REF,
              "%s layout vs float64 reference: mean %.2e logvar %.2e decoded %.2e", layout_name[l], em, el, ed);
        if (l == 0) printf("  small VAE vs float64 reference: mean %.2e logvar %.2e decoded %.2e\n", em, el, ed);
        if (l == 0) first = o;
        else {
            CHECK(!memcmp(o.mean, first.mean, sizeof rmean) && !memcmp(o.dec, first.dec, sizeof rdec),
                  "%s layout gives the same outputs as the diffusers layout", layout_name[l]);
            outputs_free(&o);
        }
        dc_st_close(&f);
    }

    // a missing tensor and a mis-shaped one are refused naming them, in the file's own names
    int skip = -1, bad = -1;
    for (int i = 0; i < t.n; i++) {
        if (!strcmp(t.name[i], "decoder.up_blocks.0.resnets.2.conv2.bias")) skip = i;
        if (!strcmp(t.name[i], "encoder.down_blocks.1.resnets.0.conv1.weight")) bad = i;
    }
    const char *missing[2] = {"'decoder.up_blocks.0.resnets.2.conv2.bias'",
                              "'first_stage_model.decoder.up.2.block.2.conv2.bias'"};
    const char *misshaped[2] = {"'encoder.down_blocks.1.resnets.0.conv1.weight'",
                                "'first_stage_model.encoder.down.1.block.0.conv1.weight'"};
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            dc_st_file f;
            outputs o = {0};
            if (make_file(&f, &t, &c, l, prefix[l], k ? -1 : skip, k ? bad : -1)) {
                CHECK(0, "make file: %s", dc_error());
                continue;
            }
            int rc = load_and_run(be, &c, &f, names[l], prefix[l], img, z, B, H, W, &o);
            const char *want = k ? misshaped[l] : missing[l];
            CHECK(rc != 0 && strstr(dc_error(), want), "%s layout: %s tensor %s refused: %s", layout_name[l],
                  k ? "mis-shaped" : "missing", want, rc ? dc_error() : "(loaded)");
            if (!rc) outputs_free(&o);
            dc_st_close(&f);
        }

    // each half alone, and the calls a model cannot serve
    dc_vae *dec;
    dc_st_file fd;
    if (!dc_vae_create(&dec, &c, be, DC_F32, false, true) && !make_file(&fd, &t, &c, 0, "", -1, -1)) {
        dc_weights wt = {&fd, 1, ""};
        outputs o = {0};
        int rc = dc_vae_load(dec, &wt, DC_NAMES_DIFFUSERS);
        if (!rc) rc = run(dec, img, z, B, H, W, &o);
        CHECK(!rc && o.dec && !memcmp(o.dec, first.dec, sizeof rdec), "decoder alone: %s",
              rc ? dc_error() : "differs");
        dc_buf any = {o.dec, DC_F32};
        CHECK(dc_vae_encode(dec, any, any, any, 1, H, W) != 0 && strstr(dc_error(), "without its encoder"),
              "encode on a decoder-only VAE refused");
        CHECK(dc_vae_decode(dec, any, any, 1, h + 1, w) != 0 && strstr(dc_error(), "planned"),
              "decode at a size not reserved refused");
        CHECK(dc_vae_decode(dec, any, any, B + 1, h, w) != 0, "decode of more images than reserved refused");
        CHECK(dc_vae_reserve(dec, 1, H + 2, W) != 0 && strstr(dc_error(), "multiples of 4"),
              "an image size that is not a multiple of f refused");
        outputs_free(&o);
        dc_st_close(&fd);
        dc_vae_free(dec);
    } else {
        CHECK(0, "decoder alone: %s", dc_error());
    }

    // the encoder taking images together (dc_vae_reserve_batch): 5 images as
    // batches of 2, 2 and one alone, and as one batch of 5, give on the CPU
    // the bits of one at a time (its ops sum each image's values in the same
    // order whatever the batch), and match the reference
    enum { NB = 5 };
    static float bimg[NB * 3 * H * W], bmean[NB * 4 * 4 * 3], blogvar[NB * 4 * 4 * 3];
    for (int i = 0; i < NB * 3 * H * W; i++) bimg[i] = unit(3000, (uint32_t)i);
    for (int b = 0; b < NB; b++) ref_encode(&t, &c, bimg + b * ni, H, W, bmean + b * nl, blogvar + b * nl);
    dc_st_file fe;
    if (!dc_vae_create(&m, &c, be, DC_F32, true, false) && !make_file(&fe, &t, &c, 0, "", -1, -1)) {
        dc_weights wt = {&fe, 1, ""};
        int rc = dc_vae_load(m, &wt, DC_NAMES_DIFFUSERS);
        float *one[2] = {NULL, NULL};
        const int together[3] = {1, 2, NB};
        for (int k = 0; k < 3 && !rc; k++) {
            float *got[2] = {NULL, NULL};
            rc = dc_vae_reserve_batch(m, NB, together[k], H, W);
            if (!rc) rc = encode_host(m, bimg, NB, H, W, got);
            if (rc) break;
            CHECK(m->enc_batch == together[k], "%d images together planned (%d)", together[k], m->enc_batch);
            double em = nerr(got[0], bmean, NB * nl), el = nerr(got[1], blogvar, NB * nl);
            CHECK(em < TOL_REF && el < TOL_REF, "%d images together vs float64 reference: mean %.2e logvar %.2e",
                  together[k], em, el);
            if (k == 0) {
                one[0] = got[0], one[1] = got[1];
                continue;
            }
            double dm = nerr(got[0], one[0], NB * nl), dl = nerr(got[1], one[1], NB * nl);
            CHECK(dm < TOL_BATCH && dl < TOL_BATCH, "%d images together vs one at a time: mean %.2e logvar %.2e",
                  together[k], dm, dl);
            printf("  %d images together vs one at a time: mean %.2e logvar %.2e\n", together[k], dm, dl);
            free(got[0]), free(got[1]);
        }
        CHECK(!rc, "encoding images together: %s", rc ? dc_error() : "");
        free(one[0]), free(one[1]);
        dc_st_close(&fe);
        dc_vae_free(m);
    } else {
        CHECK(0, "encoder alone: %s", dc_error());
    }

    // multiply-adds: the formula against a count written out here for this config
    if (!dc_vae_create(&m, &c, be, DC_F32, true, true)) {
        // encoder at 16x12: conv_in, level 0 (2 resnets 32->32, down), level 1 at 8x6 (32->64 with
        // shortcut, 64->64, down), level 2 at 4x3 (2 resnets), mid (2 resnets, attention), out, quant
        double p0 = 16 * 12, p1 = 8 * 6, p2 = 4 * 3, k9 = 9;
        double res32 = 2 * 32 * 32 * k9, res64 = 2 * 64 * 64 * k9, res3264 = (32 * 64 + 64 * 64) * k9 + 32 * 64;
        double enc = p0 * 3 * 32 * k9 + p0 * 2 * res32 + p1 * 32 * 32 * k9 + p1 * (res3264 + res64) +
                     p2 * 64 * 64 * k9 + p2 * 2 * res64 /* level 2 */ + p2 * 2 * res64 /* mid */ +
                     (4 * p2 * 64 * 64 + 2 * p2 * p2 * 64) +
                     p2 * 64 * 8 * k9 + p2 * 8 * 8;
        double e = dc_vae_encode_macs(m, H, W);
        CHECK(fabs(e - enc) < 0.5, "encoder multiply-adds %.0f, counted %.0f", e, enc);
        dc_vae_free(m);
    }
    outputs_free(&first);
    tset_free(&t);
}

int main(void) {
    dc_backend *be = dc_backend_cpu_create();
    if (!be) return printf("cpu backend: %s\n", dc_error()), 1;
    test_small(be);
    dc_backend_destroy(be);
    printf("test_vae_reference: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
