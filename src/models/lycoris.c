#include "models/lycoris.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int dc_lycoris_kind(const dc_st_tensor *const *t, const char *layer) {
    const bool lora = t[DC_LORA_DOWN] || t[DC_LORA_UP];
    bool loha = false, lokr = false;
    for (int r = DC_LORA_HADA_W1A; r <= DC_LORA_HADA_W2B; r++) loha |= t[r] != NULL;
    for (int r = DC_LORA_LOKR_W1; r <= DC_LORA_LOKR_W2B; r++) lokr |= t[r] != NULL;
    if (lora + loha + lokr > 1) return dc_fail("the delta of %s mixes LoRA, LoHa and LoKr tensors", layer);
    return loha ? DC_DELTA_LOHA : lokr ? DC_DELTA_LOKR : DC_DELTA_LORA;
}

// Tensor t read as floats (malloc'd), or NULL with a message.
static float *read(const dc_st_file *f, const dc_st_tensor *t) {
    float *h = malloc((size_t)(t->numel > 0 ? t->numel : 1) * sizeof *h);
    if (!h) return dc_fail("out of memory for %s", t->name), NULL;
    if (dc_st_read_f32(f, t, h)) return free(h), dc_fail_ctx("%s: %s", f->path, t->name), NULL;
    return h;
}

// Whether t is a matrix of `rows` rows (its other dimensions flattened) of
// `cols` columns; cols 0: any.
static bool matrix(const dc_st_tensor *t, int64_t rows, int64_t cols) {
    return t && t->ndim >= 2 && t->shape[0] == rows && t->numel % rows == 0 && (!cols || t->numel / rows == cols);
}

static int misfit(const dc_st_file *f, const dc_param *w, const char *what) {
    return dc_fail("%s: the %s of %s (%lld x %lld as a matrix) do not fit it", f->path, what, w->name,
                   (long long)w->shape[0], (long long)(w->numel / w->shape[0]));
}

// dW [out, K] (taken over) as the factors of rank min(out, K): itself beside
// an identity on its shorter side.
static int as_dense(float *dW, int64_t out, int64_t K, int *rank, float **down, float **up) {
    const int64_t R = out <= K ? out : K;
    float *I = calloc((size_t)(R * R), sizeof *I);
    if (!I) return free(dW), dc_fail("out of memory");
    for (int64_t k = 0; k < R; k++) I[k * R + k] = 1.0f;
    *rank = (int)R;
    *up = out <= K ? I : dW, *down = out <= K ? dW : I;
    return 0;
}

// [n, r] @ [r, m] (malloc'd), or NULL with a message.
static float *product(const float *a, const float *b, int64_t n, int64_t r, int64_t m) {
    float *p = calloc((size_t)(n * m), sizeof *p);
    if (!p) return dc_fail("out of memory"), NULL;
    for (int64_t i = 0; i < n; i++)
        for (int64_t s = 0; s < r; s++)
            for (int64_t c = 0; c < m; c++) p[i * m + c] += a[i * r + s] * b[s * m + c];
    return p;
}

static int loha(const dc_st_file *f, const dc_st_tensor *const *t, const dc_param *w, int *rank, int *dim,
                float **down, float **up) {
    const int64_t out = w->shape[0], K = w->numel / out;
    const dc_st_tensor *a1 = t[DC_LORA_HADA_W1A], *b1 = t[DC_LORA_HADA_W1B], *a2 = t[DC_LORA_HADA_W2A],
                       *b2 = t[DC_LORA_HADA_W2B];
    if (!a1 || !b1 || !a2 || !b2)
        return dc_fail("%s: the LoHa of %s lacks one of hada_w1_a, hada_w1_b, hada_w2_a, hada_w2_b", f->path, w->name);
    const int64_t r1 = a1->ndim == 2 ? a1->shape[1] : 0, r2 = a2->ndim == 2 ? a2->shape[1] : 0;
    if (r1 < 1 || r2 < 1 || !matrix(a1, out, r1) || !matrix(a2, out, r2) || !matrix(b1, r1, K) || !matrix(b2, r2, K))
        return misfit(f, w, "LoHa factors");
    float *A1 = read(f, a1), *B1 = read(f, b1), *A2 = read(f, a2), *B2 = read(f, b2);
    int rc = A1 && B1 && A2 && B2 ? 0 : dc_fail_ctx("the LoHa of %s", w->name);
    *dim = (int)r1;
    if (!rc && r1 * r2 > (out <= K ? out : K)) {  // no lower rank than the delta itself: dW, whole
        float *p1 = product(A1, B1, out, r1, K), *p2 = p1 ? product(A2, B2, out, r2, K) : NULL;
        if (p2) {
            for (int64_t i = 0; i < out * K; i++) p1[i] *= p2[i];
            rc = as_dense(p1, out, K, rank, down, up);
        } else {
            free(p1), rc = -1;
        }
        free(p2), free(A1), free(B1), free(A2), free(B2);
        return rc;
    }
    const int64_t R = r1 * r2;
    float *U = rc ? NULL : malloc((size_t)(out * R) * sizeof *U), *D = rc ? NULL : malloc((size_t)(R * K) * sizeof *D);
    if (!rc && (!U || !D)) rc = dc_fail("out of memory for the LoHa of %s", w->name);
    for (int64_t i = 0; !rc && i < r1; i++)
        for (int64_t j = 0; j < r2; j++) {
            for (int64_t o = 0; o < out; o++) U[o * R + i * r2 + j] = A1[o * r1 + i] * A2[o * r2 + j];
            for (int64_t c = 0; c < K; c++) D[(i * r2 + j) * K + c] = B1[i * K + c] * B2[j * K + c];
        }
    free(A1), free(B1), free(A2), free(B2);
    if (rc) return free(U), free(D), -1;
    *rank = (int)R, *down = D, *up = U;
    return 0;
}

// One side of a LoKr: the whole matrix m, or a @ b kept apart (*A, *B: a
// rank-*r product) where `low`, else multiplied into *M; *rows x *cols,
// which must divide rows_of and cols_of (the weight's) before anything is
// read, so a hostile file asks for no more than the weight's size.
static int kron_side(const dc_st_file *f, const dc_param *w, const dc_st_tensor *m, const dc_st_tensor *a,
                     const dc_st_tensor *b, bool low, int64_t rows_of, int64_t cols_of, float **M, float **A,
                     float **B, int64_t *rows, int64_t *cols, int64_t *r) {
    *M = *A = *B = NULL;
    const bool whole = m && !a && !b;
    if (!whole && (m || !a || !b || a->ndim != 2 || !matrix(b, a->shape[1], 0)))
        return dc_fail("%s: the LoKr of %s has a side neither whole nor a fitting _a @ _b (%s)", f->path, w->name,
                       m ? m->name : a ? a->name : b ? b->name : "none");
    if (whole && m->ndim < 2) return dc_fail("%s: %s is not a matrix", f->path, m->name);
    *rows = whole ? m->shape[0] : a->shape[0], *cols = whole ? m->numel / m->shape[0] : b->numel / b->shape[0];
    *r = whole ? 0 : a->shape[1];
    if (*rows < 1 || *cols < 1 || rows_of % *rows || cols_of % *cols)
        return misfit(f, w, "LoKr factors' Kronecker product");
    if (whole) return (*M = read(f, m)) ? 0 : -1;
    float *ha = read(f, a), *hb = ha ? read(f, b) : NULL;
    if (!hb) return free(ha), -1;
    if (low) return *A = ha, *B = hb, 0;
    *M = product(ha, hb, *rows, *r, *cols);
    free(ha), free(hb);
    return *M ? 0 : -1;
}

static int lokr(const dc_st_file *f, const dc_st_tensor *const *t, const dc_param *w, int *rank, int *dim,
                float **down, float **up) {
    const int64_t out = w->shape[0], K = w->numel / out, shorter = out <= K ? out : K;
    float *W1 = NULL, *W2 = NULL, *W2a = NULL, *W2b = NULL, *none[2];
    int64_t a = 0, b = 0, r1, c = 0, dK = 0, r2 = 0;
    int rc = kron_side(f, w, t[DC_LORA_LOKR_W1], t[DC_LORA_LOKR_W1A], t[DC_LORA_LOKR_W1B], false, out, K, &W1,
                       &none[0], &none[1], &a, &b, &r1);
    if (!rc)
        rc = kron_side(f, w, t[DC_LORA_LOKR_W2], t[DC_LORA_LOKR_W2A], t[DC_LORA_LOKR_W2B], true, out, K, &W2, &W2a,
                       &W2b, &c, &dK, &r2);
    if (!rc && (a * c != out || b * dK != K)) rc = misfit(f, w, "LoKr factors' Kronecker product");
    const dc_st_tensor *w1b = t[DC_LORA_LOKR_W1B], *w2b = t[DC_LORA_LOKR_W2B];
    *dim = (int)(w1b ? w1b->shape[0] : w2b ? w2b->shape[0] : 0);
    if (!rc && r2 && b * r2 <= shorter) {  // up = kron(W1, w2_a) [a c, b r2], down = kron(I_b, w2_b) [b r2, b dK]
        const int64_t R = b * r2;
        float *U = calloc((size_t)(out * R), sizeof *U), *D = calloc((size_t)(R * K), sizeof *D);
        if (U && D) {
            for (int64_t i = 0; i < a; i++)
                for (int64_t j = 0; j < c; j++)
                    for (int64_t p = 0; p < b; p++)
                        for (int64_t s = 0; s < r2; s++) U[(i * c + j) * R + p * r2 + s] = W1[i * b + p] * W2a[j * r2 + s];
            for (int64_t p = 0; p < b; p++)
                for (int64_t s = 0; s < r2; s++)
                    memcpy(D + (p * r2 + s) * K + p * dK, W2b + s * dK, (size_t)dK * sizeof *D);
            *rank = (int)R, *up = U, *down = D;
        } else {
            free(U), free(D), rc = dc_fail("out of memory for the LoKr of %s", w->name);
        }
    } else if (!rc) {  // dW = kron(W1, W2) whole, beside an identity on its shorter side
        if (r2 && !(W2 = product(W2a, W2b, c, r2, dK))) rc = -1;
        float *dW = rc ? NULL : malloc((size_t)(out * K) * sizeof *dW);
        if (!rc && !dW) rc = dc_fail("out of memory for the LoKr of %s", w->name);
        for (int64_t i = 0; !rc && i < a; i++)
            for (int64_t j = 0; j < c; j++)
                for (int64_t p = 0; p < b; p++)
                    for (int64_t q = 0; q < dK; q++) dW[(i * c + j) * K + p * dK + q] = W1[i * b + p] * W2[j * dK + q];
        if (!rc) rc = as_dense(dW, out, K, rank, down, up);
    }
    free(W1), free(W2), free(W2a), free(W2b);
    return rc;
}

int dc_lycoris_factors(const dc_st_file *f, dc_delta_kind kind, const dc_st_tensor *const *t, const dc_param *w,
                       int *rank, int *dim, float **down, float **up) {
    *down = *up = NULL;
    if (w->ndim != 2 && w->ndim != 4) return dc_fail("%s: %s takes no delta", f->path, w->name);
    return kind == DC_DELTA_LOHA ? loha(f, t, w, rank, dim, down, up) : lokr(f, t, w, rank, dim, down, up);
}
