// LoRA files read into SD models (models/sd_lora.h) and merged: the tiny SD
// 1.x UNet of tests/golden/sd/sd1 (its channels-last convolutions too) and a
// small CLIP text encoder, random LoRAs on an attention projection, the
// GEGLU's product, a resnet's 3x3 convolution (LoCon) and a text encoder
// projection, written in kohya's format and in PEFT's (diffusers' for the
// text encoder). Each merged weight equals W + alpha / rank * up @ down
// computed here in double; both formats give the same bits; a missing alpha
// means a scale of 1. LyCORIS's LoHa (a linear layer and a convolution) and
// LoKr (W2 decomposed, on a linear layer and a convolution; both sides whole;
// W1 decomposed in the text encoder), and a LoHa and a LoKr whose product's
// rank exceeds the weight's shorter side, merge to W + scale dW with dW computed
// here in double from its definition (the Hadamard product, the Kronecker
// product), scale alpha / dim or 1. Refused, by name: factors of the wrong
// shape, a missing factor, a key of no layer, text encoder keys for a model
// without one, a LoHa missing a factor, a LoKr whose product does not fit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/clip_text.h"
#include "models/sd_lora.h"
#include "models/unet.h"
#include "param_host.h"
#include "tmpdir.h"

#define GOLD "tests/golden/sd/sd1"

typedef struct {
    const char *kohya, *peft;  // the module in each format
    const char *weight;        // the engine's parameter
    int rank;
    float alpha;               // 0: no alpha tensor
    bool text;
} lora_layer;

static const lora_layer k_layers[] = {
    {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q",
     "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
     "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight", 4, 2.0f, false},
    {"lora_unet_up_blocks_1_attentions_0_transformer_blocks_0_ff_net_0_proj",
     "unet.up_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj",
     "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj.weight", 2, 0.0f, false},
    {"lora_unet_down_blocks_1_resnets_0_conv1", "unet.down_blocks.1.resnets.0.conv1",
     "down_blocks.1.resnets.0.conv1.weight", 3, 1.5f, false},
    {"lora_te_text_model_encoder_layers_1_self_attn_q_proj", "text_encoder.text_model.encoder.layers.1.self_attn.q_proj",
     "encoder.layers.1.self_attn.q_proj.weight", 5, 8.0f, true},
};
enum { NL = sizeof k_layers / sizeof *k_layers };

typedef struct {
    dc_backend *be;
    dc_model *unet;
    dc_clip_text *text;
    dc_st_file wf;
} models;

static dc_params *part(models *m, bool text) { return text ? m->text->params : m->unet->params; }

static int models_open(models *m) {
    memset(m, 0, sizeof *m);
    m->be = dc_backend_cpu_create();
    dc_unet_config c;
    DC_TRY(dc_unet_config_from_json_file(&c, GOLD "/diffusers/unet/config.json"));
    DC_TRY(dc_st_open(&m->wf, GOLD "/single.safetensors"));
    dc_weights w = {.files = &m->wf, .nfiles = 1, .prefix = "model.diffusion_model."};
    DC_TRY(dc_unet_new(&c, m->be, DC_F32, 8, 8, &m->unet));
    DC_TRY(dc_unet_load(m->unet, &w, DC_NAMES_ORIGINAL));
    const dc_clip_text_config tc = {64, 8, 32, 2, 2, 48, DC_ACT_QUICK_GELU, 1e-5f};
    DC_TRY(dc_clip_text_create(&m->text, &tc, m->be, DC_F32));
    const dc_params *ps = m->text->params;
    float *h = malloc((size_t)ps->frozen_numel * 4);
    for (int64_t j = 0; j < ps->frozen_numel; j++) h[j] = 0.1f * dc_randn_at(5, 0, 0, 0, (uint32_t)j);
    m->be->upload(m->be, ps->frozen.p, h, (size_t)ps->frozen_numel * 4);
    free(h);
    return 0;
}

static void models_close(models *m) {
    dc_model_free(m->unet);
    dc_clip_text_free(m->text);
    dc_st_close(&m->wf);
    dc_backend_destroy(m->be);
}

// The factors of layer l: down [r, K], up [out, r] (K = in, or ci k k), normal draws.
static void factors(models *m, const lora_layer *l, float **down, float **up, int64_t *out, int64_t *K, int *nd,
                    int64_t dshape[4], int64_t ushape[4]) {
    const dc_param *p = &part(m, l->text)->items[dc_params_find(part(m, l->text), l->weight)];
    *out = p->shape[0], *K = p->numel / p->shape[0], *nd = p->ndim;
    *down = malloc((size_t)(l->rank * *K) * 4), *up = malloc((size_t)(*out * l->rank) * 4);
    for (int64_t j = 0; j < l->rank * *K; j++) (*down)[j] = 0.3f * dc_randn_at(21, (uint32_t)l->rank, 0, 0, (uint32_t)j);
    for (int64_t j = 0; j < *out * l->rank; j++) (*up)[j] = 0.3f * dc_randn_at(22, (uint32_t)l->rank, 0, 0, (uint32_t)j);
    dshape[0] = l->rank, dshape[1] = p->shape[1], ushape[0] = p->shape[0], ushape[1] = l->rank;
    if (p->ndim == 4) dshape[2] = p->shape[2], dshape[3] = p->shape[3], ushape[2] = ushape[3] = 1;
}

// Writes the layers in kohya's format (peft false) or PEFT's; skip_up: leave
// layer 0's up out; bad_shape: layer 0's down one row short.
static int write_lora(models *m, const char *path, bool peft, int n, bool skip_up, bool bad_shape) {
    dc_st_entry e[3 * NL];
    float *bufs[2 * NL], alphas[NL];
    char names[3 * NL][200];
    int k = 0;
    for (int i = 0; i < n; i++) {
        const lora_layer *l = &k_layers[i];
        int64_t out, K, ds[4], us[4];
        int nd;
        factors(m, l, &bufs[2 * i], &bufs[2 * i + 1], &out, &K, &nd, ds, us);
        if (bad_shape && i == 0) ds[0] -= 1;
        snprintf(names[k], 200, peft ? "%s.lora_A.weight" : "%s.lora_down.weight", peft ? l->peft : l->kohya);
        e[k] = (dc_st_entry){names[k], DC_F32, nd, {ds[0], ds[1], ds[2], ds[3]}, bufs[2 * i]}, k++;
        if (!(skip_up && i == 0)) {
            snprintf(names[k], 200, peft ? "%s.lora_B.weight" : "%s.lora_up.weight", peft ? l->peft : l->kohya);
            e[k] = (dc_st_entry){names[k], DC_F32, nd, {us[0], us[1], us[2], us[3]}, bufs[2 * i + 1]}, k++;
        }
        if (l->alpha > 0) {
            alphas[i] = l->alpha;
            snprintf(names[k], 200, "%s.alpha", peft ? l->peft : l->kohya);
            e[k] = (dc_st_entry){names[k], DC_F32, 0, {0}, &alphas[i]}, k++;
        }
    }
    const int rc = dc_st_write(path, e, k, NULL, NULL, 0);
    for (int i = 0; i < 2 * n; i++) free(bufs[i]);
    return rc;
}

// Reads path into LoRAs over the two parts and merges them; *merged[i] the
// layers' weights after (PyTorch order).
static int read_merge(models *m, const char *path, bool with_text, float **merged) {
    dc_st_file f;
    dc_lora lu, lt;
    DC_TRY(dc_st_open(&f, path));
    dc_lora_init(&lu, m->unet->params), dc_lora_init(&lt, m->text->params);
    int rc = dc_sd_lora_read(&f, &lu, with_text ? &lt : NULL);
    if (!rc) rc = dc_lora_merge(&lu);
    if (!rc && with_text) rc = dc_lora_merge(&lt);
    for (int i = 0; !rc && merged && i < NL; i++) {
        int64_t n;
        merged[i] = param_host(part(m, k_layers[i].text), k_layers[i].weight, &n);
    }
    if (!rc && lu.merged) rc = dc_lora_unmerge(&lu);  // the next read starts from the weights as loaded
    if (!rc && lt.merged) rc = dc_lora_unmerge(&lt);
    dc_lora_free(&lu), dc_lora_free(&lt);
    dc_st_close(&f);
    return rc;
}

// ---- LyCORIS ---------------------------------------------------------------------------------

typedef struct {
    const char *kohya, *weight;
    bool text, loha;
    // LoHa: ranks r1, r2. LoKr: W1 [a, b] (decomposed at rank r1 when r1 > 0),
    // W2 [c, dK] (decomposed at rank r2 when r2 > 0), dK = K / b.
    int r1, r2, a, b;
    float alpha;  // 0: none in the file
} lyco_layer;

static const lyco_layer k_lyco[] = {
    {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q",
     "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight", false, true, 3, 2, 0, 0, 6.0f},
    {"lora_unet_down_blocks_1_resnets_0_conv1", "down_blocks.1.resnets.0.conv1.weight", false, true, 2, 4, 0, 0, 0},
    {"lora_unet_up_blocks_1_attentions_0_transformer_blocks_0_ff_net_0_proj",
     "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj.weight", false, false, 0, 3, 4, 2, 1.5f},
    {"lora_unet_down_blocks_1_resnets_0_conv2", "down_blocks.1.resnets.0.conv2.weight", false, false, 0, 2, 2, 4, 4.0f},
    {"lora_unet_up_blocks_1_resnets_0_conv1", "up_blocks.1.resnets.0.conv1.weight", false, false, 0, 0, 4, 8, 3.0f},
    {"lora_te_text_model_encoder_layers_0_mlp_fc1", "encoder.layers.0.mlp.fc1.weight", true, false, 2, 0, 8, 4, 2.0f},
    // ranks above the weight's shorter side (32): read as the delta itself
    {"lora_unet_down_blocks_1_attentions_1_transformer_blocks_0_attn2_to_k",
     "down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_k.weight", false, true, 8, 6, 0, 0, 4.0f},
    {"lora_unet_down_blocks_0_attentions_1_transformer_blocks_0_attn1_to_v",
     "down_blocks.0.attentions.1.transformer_blocks.0.attn1.to_v.weight", false, false, 0, 20, 2, 2, 2.0f},
};
enum { NY = sizeof k_lyco / sizeof *k_lyco };

// Normal draws for tensor k of layer i.
static float *draws(int i, int k, int64_t n) {
    float *h = malloc((size_t)n * 4);
    for (int64_t j = 0; j < n; j++) h[j] = 0.5f * dc_randn_at(31, (uint32_t)i, (uint32_t)k, 0, (uint32_t)j);
    return h;
}

// A @ B in double: [n, r] @ [r, m], or A itself where r is 0.
static double *matmul(const float *A, const float *B, int64_t n, int64_t r, int64_t m) {
    double *p = calloc((size_t)(n * m), sizeof *p);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++)
            if (r == 0) p[i * m + j] = A[i * m + j];
            else
                for (int64_t s = 0; s < r; s++) p[i * m + j] += (double)A[i * r + s] * B[s * m + j];
    return p;
}

// The tensors of a file being written: each named stem.suffix, its data owned.
typedef struct {
    dc_st_entry e[8 * NY];
    char names[8 * NY][200];
    float *bufs[8 * NY], alphas[NY];
    int k, nb;
} st_list;

// Adds h [r, c] (taken over) as stem.suffix; keep false: only takes h (a tensor left out).
static void put(st_list *t, const char *stem, const char *suffix, float *h, int64_t r, int64_t c, bool keep) {
    t->bufs[t->nb++] = h;
    if (!keep) return;
    snprintf(t->names[t->k], 200, "%s.%s", stem, suffix);
    t->e[t->k] = (dc_st_entry){t->names[t->k], DC_F32, 2, {r, c}, h}, t->k++;
}

// One side of layer i's LoKr, [rows, cols]: whole (rank 0) as `whole`, or
// decomposed at `rank` as `a` @ `b`; draws k0 and k0 + 1; rows_w: the rows
// the file says. Its value in double (malloc'd).
static double *kron_side(st_list *t, const lyco_layer *l, int i, int k0, int64_t rows, int64_t rows_w, int rank,
                         int64_t cols, const char *whole, const char *a, const char *b) {
    if (!rank) {
        float *x = draws(i, k0, rows * cols);
        double *v = matmul(x, NULL, rows, 0, cols);
        put(t, l->kohya, whole, x, rows_w, cols, true);
        return v;
    }
    float *x = draws(i, k0, rows * rank), *y = draws(i, k0 + 1, (int64_t)rank * cols);
    double *v = matmul(x, y, rows, rank, cols);
    put(t, l->kohya, a, x, rows_w, rank, true), put(t, l->kohya, b, y, rank, cols, true);
    return v;
}

// Writes the LyCORIS layers (bad 1: the first LoHa's hada_w2_b left out; 2:
// the first LoKr's W1 one row short) and gives each one's dW [out, K] and scale.
static int write_lyco(models *m, const char *path, double **dW, double *scale, int bad) {
    st_list *t = calloc(1, sizeof *t);
    if (!t) return dc_fail("out of memory");
    bool bad_loha = bad == 1, bad_lokr = bad == 2;
    for (int i = 0; i < NY; i++) {
        const lyco_layer *l = &k_lyco[i];
        const dc_param *p = &part(m, l->text)->items[dc_params_find(part(m, l->text), l->weight)];
        const int64_t out = p->shape[0], K = p->numel / out;
        if (l->loha) {
            float *a1 = draws(i, 0, out * l->r1), *b1 = draws(i, 1, l->r1 * K), *a2 = draws(i, 2, out * l->r2),
                  *b2 = draws(i, 3, l->r2 * K);
            double *p1 = matmul(a1, b1, out, l->r1, K), *p2 = matmul(a2, b2, out, l->r2, K);
            for (int64_t j = 0; j < out * K; j++) p1[j] *= p2[j];
            dW[i] = p1, free(p2);
            put(t, l->kohya, "hada_w1_a", a1, out, l->r1, true), put(t, l->kohya, "hada_w1_b", b1, l->r1, K, true);
            put(t, l->kohya, "hada_w2_a", a2, out, l->r2, true), put(t, l->kohya, "hada_w2_b", b2, l->r2, K, !bad_loha);
            bad_loha = false;
            scale[i] = l->alpha > 0 ? l->alpha / l->r1 : 1.0;
        } else {
            const int64_t a = l->a, b = l->b, c = out / a, dK = K / b;
            double *W1 = kron_side(t, l, i, 0, a, bad_lokr ? a - 1 : a, l->r1, b, "lokr_w1", "lokr_w1_a", "lokr_w1_b");
            double *W2 = kron_side(t, l, i, 2, c, c, l->r2, dK, "lokr_w2", "lokr_w2_a", "lokr_w2_b");
            bad_lokr = false;
            dW[i] = malloc((size_t)(out * K) * sizeof **dW);
            for (int64_t i1 = 0; i1 < a; i1++)
                for (int64_t j = 0; j < c; j++)
                    for (int64_t p1 = 0; p1 < b; p1++)
                        for (int64_t q = 0; q < dK; q++)
                            dW[i][(i1 * c + j) * K + p1 * dK + q] = W1[i1 * b + p1] * W2[j * dK + q];
            free(W1), free(W2);
            const int dim = l->r1 ? l->r1 : l->r2;
            scale[i] = l->alpha > 0 && dim ? l->alpha / dim : 1.0;
        }
        if (l->alpha > 0) {
            t->alphas[i] = l->alpha;
            snprintf(t->names[t->k], 200, "%s.alpha", l->kohya);
            t->e[t->k] = (dc_st_entry){t->names[t->k], DC_F32, 0, {0}, &t->alphas[i]}, t->k++;
        }
    }
    const int rc = dc_st_write(path, t->e, t->k, NULL, NULL, 0);
    for (int i = 0; i < t->nb; i++) free(t->bufs[i]);
    free(t);
    return rc;
}

static void test_lycoris(models *m) {
    double *dW[NY] = {0}, scale[NY];
    float *w0[NY], *merged[NY] = {0};
    for (int i = 0; i < NY; i++) {
        int64_t n;
        w0[i] = param_host(part(m, k_lyco[i].text), k_lyco[i].weight, &n);
    }
    const char *path = tmp_path("lycoris.safetensors");
    dc_st_file f;
    dc_lora lu, lt;
    int rc = write_lyco(m, path, dW, scale, 0) || dc_st_open(&f, path);
    CHECK(rc == 0, "writing LoHa and LoKr: %s", dc_error());
    if (rc) return;
    dc_lora_init(&lu, m->unet->params), dc_lora_init(&lt, m->text->params);
    rc = dc_sd_lora_read(&f, &lu, &lt) || dc_lora_merge(&lu) || dc_lora_merge(&lt);
    CHECK(rc == 0, "reading and merging LoHa and LoKr: %s", dc_error());
    for (int i = 0; !rc && i < NY; i++) {
        const lyco_layer *l = &k_lyco[i];
        int64_t n;
        merged[i] = param_host(part(m, l->text), l->weight, &n);
        double worst = 0, big = 0;
        for (int64_t j = 0; merged[i] && j < n; j++) {
            const double want = w0[i][j] + scale[i] * dW[i][j], e = fabs(merged[i][j] - want);
            big = fmax(big, fabs(scale[i] * dW[i][j]));
            if (!(e <= worst)) worst = e;
        }
        CHECK(merged[i] && big > 0.1 && worst < 1e-5 * fmax(1, big), "%s %s: merged weight off by %.2e (delta up to %.2f)",
              l->loha ? "LoHa" : "LoKr", l->weight, worst, big);
    }
    if (lu.merged) dc_lora_unmerge(&lu);
    if (lt.merged) dc_lora_unmerge(&lt);
    dc_lora_free(&lu), dc_lora_free(&lt);
    dc_st_close(&f);
    printf("  LoHa and LoKr: %d layers merged as their definitions give\n", NY);
    // a LoHa missing a factor, a LoKr whose W1 does not fit: refused, naming the layer
    static const char *const why[2][2] = {{"hada_w2_b", "a LoHa missing hada_w2_b"},
                                          {"do not fit", "a LoKr whose W1 is a row short"}};
    for (int bad = 1; bad <= 2; bad++) {
        double *dW2[NY] = {0};
        const char *layer = k_lyco[bad == 1 ? 0 : 2].weight;
        rc = write_lyco(m, path, dW2, scale, bad) || dc_st_open(&f, path);
        CHECK(rc == 0, "writing: %s", dc_error());
        if (!rc) {
            dc_lora_init(&lu, m->unet->params), dc_lora_init(&lt, m->text->params);
            rc = dc_sd_lora_read(&f, &lu, &lt);
            CHECK(rc != 0 && strstr(dc_error(), why[bad - 1][0]) && strstr(dc_error(), layer), "%s: '%s'",
                  why[bad - 1][1], dc_error());
            dc_lora_free(&lu), dc_lora_free(&lt);
            dc_st_close(&f);
        }
        for (int i = 0; i < NY; i++) free(dW2[i]);
    }
    for (int i = 0; i < NY; i++) free(dW[i]), free(w0[i]), free(merged[i]);
}

int main(void) {
    models m;
    if (tmpdir_make("sd_lora")) return 1;
    if (models_open(&m)) {
        printf("FAIL set-up: %s\n", dc_error());
        return 1;
    }
    float *w0[NL], *kohya[NL] = {0}, *peft[NL] = {0};
    for (int i = 0; i < NL; i++) {
        int64_t n;
        w0[i] = param_host(part(&m, k_layers[i].text), k_layers[i].weight, &n);
    }
    const char *pk = tmp_path("kohya.safetensors"), *pp = tmp_path("peft.safetensors");
    CHECK(write_lora(&m, pk, false, NL, false, false) == 0 && read_merge(&m, pk, true, kohya) == 0,
          "kohya's format: %s", dc_error());
    CHECK(write_lora(&m, pp, true, NL, false, false) == 0 && read_merge(&m, pp, true, peft) == 0,
          "PEFT's format: %s", dc_error());
    for (int i = 0; i < NL && kohya[0] && peft[0]; i++) {
        const lora_layer *l = &k_layers[i];
        float *down, *up;
        int64_t out, K, ds[4], us[4];
        int nd;
        factors(&m, l, &down, &up, &out, &K, &nd, ds, us);
        const double s = (l->alpha > 0 ? l->alpha : l->rank) / (double)l->rank;
        double worst = 0;
        for (int64_t o = 0; o < out; o++)
            for (int64_t q = 0; q < K; q++) {
                double d = 0;
                for (int j = 0; j < l->rank; j++) d += (double)up[o * l->rank + j] * down[j * K + q];
                const double want = w0[i][o * K + q] + s * d, e = fabs(kohya[i][o * K + q] - want);
                if (!(e <= worst)) worst = e;
            }
        CHECK(worst < 1e-5, "%s: merged weight off by %.2e", l->weight, worst);
        CHECK(!memcmp(kohya[i], peft[i], (size_t)(out * K) * 4), "%s: kohya's and PEFT's files merge differently",
              l->weight);
        free(down), free(up);
    }
    // refused
    const char *pb = tmp_path("bad.safetensors");
    CHECK(write_lora(&m, pb, false, NL, true, false) == 0 && read_merge(&m, pb, true, NULL) != 0 &&
              strstr(dc_error(), "no up factor") && strstr(dc_error(), k_layers[0].weight),
          "a missing up factor: '%s'", dc_error());
    CHECK(write_lora(&m, pb, false, NL, false, true) == 0 && read_merge(&m, pb, true, NULL) != 0 &&
              strstr(dc_error(), "do not fit") && strstr(dc_error(), k_layers[0].weight),
          "a factor of the wrong shape: '%s'", dc_error());
    CHECK(read_merge(&m, pk, false, NULL) != 0 && strstr(dc_error(), "text encoder") &&
              strstr(dc_error(), "lora_te_text_model_encoder_layers_1"),
          "text encoder keys for a model without one: '%s'", dc_error());
    float one = 1.0f, v[4] = {1, 2, 3, 4};
    const dc_st_entry stray[] = {{"lora_unet_down_blocks_0_attentions_0_proj_in.alpha", DC_F32, 0, {0}, &one},
                                 {"lora_unet_down_blocks_7_attentions_0_proj_in.lora_up.weight", DC_F32, 2, {2, 2}, v}};
    CHECK(dc_st_write(pb, stray, 2, NULL, NULL, 0) == 0 && read_merge(&m, pb, true, NULL) != 0 &&
              strstr(dc_error(), "down_blocks_7") && strstr(dc_error(), "no such layer"),
          "a key of no layer: '%s'", dc_error());
    test_lycoris(&m);
    // after all that, the weights are as loaded (unmerged exactly in fp32 up to rounding)
    int64_t n;
    float *again = param_host(m.unet->params, k_layers[0].weight, &n);
    double drift = 0;
    for (int64_t j = 0; again && j < n; j++) drift = fmax(drift, fabs(again[j] - w0[0][j]));
    CHECK(again && drift < 1e-5, "unmerged weights drift by %.2e", drift);
    free(again);
    for (int i = 0; i < NL; i++) free(w0[i]), free(kohya[i]), free(peft[i]);
    models_close(&m);
    tmpdir_remove();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
