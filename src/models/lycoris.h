// LyCORIS's LoHa and LoKr deltas, as the exact LoRA factors that give them,
// so that they run through the same adapter (nn/adapter.h), at run time or
// merged, as any LoRA. For a weight W [out, in] (a convolution's [co, ci, k,
// k] as [co, K = ci k k]), with `dim` the decomposed rank and a file's alpha
// (A1111's network_hada.py / network_lokr.py: scale alpha / dim where both
// are known, else 1):
//
//   LoHa  dW = (w1_a @ w1_b) * (w2_a @ w2_b)  (elementwise), w1_a [out, r1],
//         w1_b [r1, K], w2_a [out, r2], w2_b [r2, K]; dim r1. A Hadamard
//         product of two low-rank matrices is the low-rank product of their
//         factors' Khatri-Rao products: up [out, r1 r2] with up[o, i r2 + j]
//         = w1_a[o, i] w2_a[o, j], down [r1 r2, K] with down[i r2 + j, c] =
//         w1_b[i, c] w2_b[j, c].
//   LoKr  dW = kron(W1, W2), W1 = w1 [a, b] or w1_a @ w1_b, W2 = w2 [c, d (k
//         k)] or w2_a [c, r] @ w2_b [r, d k k], out = a c, K = b d k k (a
//         convolution's W1 acts as a 1 x 1 kernel, as A1111's make_kron); dim
//         the rank of w1_b, else of w2_b. With W2 decomposed,
//         kron(W1, w2_a w2_b) = kron(W1, w2_a) @ kron(I_b, w2_b): rank b r.
//
// Where such factors would not be of lower rank than min(out, K) (a LoKr
// with W2 whole, a LoHa or LoKr of high rank on a narrow layer), dW itself,
// with an identity on its shorter side: rank min(out, K).
//
// Tucker cores (hada_t1/t2, lokr_t2) are refused where the keys are read
// (models/sd_lora_keys.h).
#pragma once
#include "io/safetensors.h"
#include "models/sd_lora_keys.h"
#include "nn/params.h"

typedef enum { DC_DELTA_LORA, DC_DELTA_LOHA, DC_DELTA_LOKR } dc_delta_kind;

// The kind of a layer's tensors t[DC_LORA_ROLES] (NULL where absent), or -1
// with a message when they mix kinds.
int dc_lycoris_kind(const dc_st_tensor *const *t, const char *layer);

// The LoHa or LoKr tensors t of the layer whose weight is w, read from f:
// *down [*rank, K] and *up [out, *rank] in PyTorch's layouts (malloc'd; free
// both), and *dim, the decomposed rank the file's alpha divides (0: none, a
// scale of 1). Shapes that do not fit w are refused, naming the tensors.
int dc_lycoris_factors(const dc_st_file *f, dc_delta_kind kind, const dc_st_tensor *const *t, const dc_param *w,
                       int *rank, int *dim, float **down, float **up);
