// The CLIP text encoder's layers (internal to clip_text.c and
// clip_text_train.c): the modules, and one layer's forward over buffers its
// caller lays out, so inference (one set every layer reuses, the stream
// updated in place) and training (a set each layer, every stream kept) run
// the same code.
#pragma once
#include "models/clip_text.h"
#include "nn/modules.h"

// One encoder layer, registered in state-dict order.
typedef struct {
    dc_linear k, v, q, out;   // self_attn.{k,v,q,out}_proj: W -> W, with bias
    dc_layer_norm ln1;        // layer_norm1
    dc_linear fc1, fc2;       // mlp.fc1: W -> F, mlp.fc2: F -> W
    dc_layer_norm ln2;        // layer_norm2
} clip_layer;

struct dc_clip_text_modules {
    dc_embedding tok;         // embeddings.token_embedding [V, W]
    dc_embedding pos;         // embeddings.position_embedding [T, W]
    clip_layer *layers;       // [L]: encoder.layers.<l>
    dc_layer_norm final_ln;   // final_layer_norm
};

// One layer's buffers. The stream: x_mid = x_in + attention branch, x_out =
// x_mid + MLP branch (F32 [B, T, W]); inference passes one buffer for all
// three. The rest take the backend's compute dtype but the statistics (F32).
typedef struct {
    dc_buf x_in, x_mid, x_out;
    dc_buf h1, h2;                     // [B, T, W] layer_norm1 and layer_norm2 outputs
    dc_buf mean1, rstd1, mean2, rstd2; // [B T] their statistics
    dc_buf q, k, v;                    // [B, T, W] projections, head h at columns [h Dh, (h+1) Dh)
    dc_buf att;                        // [B, T, W] attention output, heads side by side
    dc_buf lse;                        // [B, H, T] F32 attention log-sum-exp
    dc_buf f, g;                       // [B, T, F] fc1 output and its activation
    dc_buf o;                          // [B, T, W] a branch's output before the residual add
} clip_layer_bufs;

// The causal self-attention's shape for B sequences.
dc_attn_shape clip_attn_shape(const dc_clip_text_config *c, int B);
// Layer y over the buffers in b (B sequences).
void clip_layer_fwd(dc_backend *be, const dc_params *ps, const dc_clip_text_config *c, const clip_layer *y,
                    const clip_layer_bufs *b, int B);
// x = token_embedding[ids] + position_embedding[0..T-1]
void clip_embed_fwd(dc_backend *be, const dc_params *ps, const dc_clip_text_modules *md, dc_buf x, dc_buf ids, int B,
                    int T, int W);
// The checks every forward makes of its arguments.
int clip_check_call(const dc_clip_text_config *c, dc_buf ids, int B, int max_batch, int skip);
// Frees what a training reserve holds.
void clip_train_free(dc_clip_text *m);
