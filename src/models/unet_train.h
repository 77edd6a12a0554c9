// The UNet's training path (unet_train.c): the activations a training
// forward keeps, that forward, and the backward. Internal to the UNet: the
// model interface in unet.c calls these for a model whose parameters train.
#pragma once
#include "models/unet_blocks.h"

// The layers the forward runs (resnets with their transformers, resamplers):
// the blocks that set_recompute's keep counts.
int unet_layer_count(const dc_unet *m);
// Bytes of the training arena for max_batch images with keep layers keeping
// their intermediates (-1: all), the pointwise ones recomputed or not
// (selective: unet_blocks.h's lean acts), and with the parameters'
// gradients in it (lend), without allocating; -1 on failure.
int64_t unet_train_bytes(const dc_unet *m, dc_dtype compute, int max_batch, int keep, bool selective, bool lend);
// Whether the parameters' gradients can lie in the arena: 0, or -1 with the
// reason (the UNet is not all the set trains).
int unet_train_lends(const dc_unet *m);
// Plans and allocates m->train for max_batch images (m->keep layers keep
// theirs, m->selective; with m->lend_grads, the set's gradients lie in it, and its own
// gradient buffer is freed).
int unet_train_reserve(dc_unet *m, int max_batch);
void unet_train_free(dc_unet *m);
// The reserved arena: its memory, the bytes of its plan (the gradients, if
// they lie in it, may reach beyond them) and for each parameter unit the
// offset from which those bytes are done with once the unit's backward
// begins (nn/params.h: dc_params_grad_place), for tests that fill them with
// NaN as the backward goes.
int unet_train_arena(const dc_unet *m, void **base, size_t *bytes, int64_t *dead, int max_units);
// The model's forward, keeping what backward reads.
int unet_train_forward(dc_unet *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B);
// dL/dparams += from dout = dL/dout of the last forward (B images).
int unet_train_backward(dc_unet *m, dc_buf dout, int B);
