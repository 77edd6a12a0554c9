// Adapters: deltas to a set's weights that linear and convolution layers ask
// for, through one door (stable-diffusion.cpp's WeightAdapter): a layer whose
// set carries an adapter (dc_params.adapter) asks "any delta for my weight?"
// and, if so, lets the adapter add its output to the layer's in forward, and
// its share of dx (and its own gradients) in backward. LoRA, LoCon or LoHa
// are implementations of this interface; the layers and models do not change.
//
// LoRA (dc_lora), with kohya's LoCon for convolutions: W' = W + s up @ down,
// s = alpha / rank * multiplier. A linear layer's down is [r, in] and up
// [out, r]; a convolution's down is a k x k convolution ci -> r with the
// layer's stride and padding, and up a 1 x 1 convolution r -> co. Applied at
// run time, y = layer(x) + s up(down(x)), and backward adds s down^T(up^T(dy))
// to dx and the factors' gradients; or merged, W += s up @ down in the
// weight's own dtype (and unmerged). The factors are ordinary trainable
// parameters of a dc_params of their own, so an optimizer trains them as any
// other set.
#pragma once
#include <stdbool.h>
#include "backend/backend.h"
#include "nn/params.h"

typedef struct {
    // Whether parameter `param` of the adapted set has a delta applied at run time.
    bool (*has)(const dc_adapter *a, int param);
    // y[M, out] += delta(x[M, in]) for the linear layer whose weight is param.
    void (*linear_fwd)(dc_adapter *a, dc_backend *be, int param, dc_buf y, dc_buf x, int M, int in, int out);
    // dx[M, in] += the delta's share of dL/dx (skipped if dx.p is NULL), and
    // the adapter's own gradients += from dy[M, out] and x.
    void (*linear_bwd)(dc_adapter *a, dc_backend *be, int param, dc_buf dx, dc_buf dy, dc_buf x, int M, int in,
                       int out);
    // The same for the convolution of shape s whose kernel is param.
    void (*conv_fwd)(dc_adapter *a, dc_backend *be, int param, dc_buf y, dc_buf x, const dc_conv2d_shape *s);
    void (*conv_bwd)(dc_adapter *a, dc_backend *be, int param, dc_buf dx, dc_buf dy, dc_buf x,
                     const dc_conv2d_shape *s);
    // What a model's reserve asks, so that no step allocates: room for the
    // deltas of linear layers of up to `rows` rows, and for the convolution
    // of shape s whose kernel is param (for backward too, if backward).
    int (*reserve_rows)(dc_adapter *a, int64_t rows);
    int (*reserve_conv)(dc_adapter *a, int param, const dc_conv2d_shape *s, bool backward);
} dc_adapter_ops;

struct dc_adapter {
    const dc_adapter_ops *ops;
};

// Whether the layer whose weight is parameter w of ps takes a delta at run time.
static inline bool dc_adapted(const dc_params *ps, int w) {
    return ps->adapter && ps->adapter->ops->has(ps->adapter, w);
}

// Several adapters on one set (several LoRA files at once): a layer gets
// the deltas of every one that has one for it, in the order added. Attach
// it as the set's adapter (ps->adapter = &stack.base).
#define DC_ADAPTERS_MAX 16
typedef struct {
    dc_adapter base;
    dc_adapter *list[DC_ADAPTERS_MAX];
    int n;
} dc_adapter_stack;

void dc_adapter_stack_init(dc_adapter_stack *s);
int dc_adapter_stack_add(dc_adapter_stack *s, dc_adapter *a);

// One adapted weight: its factors' indices in the LoRA's own set.
typedef struct {
    int param;         // the weight adapted, in the target set
    int down, up;      // in dc_lora.params
    int rank;
    float alpha;
    bool conv;         // down a k x k convolution, up a 1 x 1 one (LoCon)
} dc_lora_item;

typedef struct {
    dc_adapter base;     // what the target set carries while attached
    dc_params *target;   // the set adapted (not owned)
    dc_params params;    // the factors, "<name>.lora_down.weight" and "<name>.lora_up.weight"
    dc_lora_item *items;
    int count, cap;
    float multiplier;    // 1 unless set
    bool merged;         // the deltas are in the target's weights, so none is applied at run time
    // Run-time scratch (the down product and its gradient, scaled; a
    // convolution's up product or scaled dy): sized by dc_lora_reserve and
    // dc_lora_reserve_conv, so no step allocates.
    dc_buf scratch;
    int64_t scratch_bytes;
} dc_lora;

// An empty LoRA of the set target (its parameters registered, not yet allocated).
void dc_lora_init(dc_lora *l, dc_params *target);
// Adds a rank-`rank` delta to the weight of parameter `param` of the target
// (a 2-D [out, in] matrix, or a 4-D [co, ci, k, k] kernel: LoCon), named
// `name` (its factors "<name>.lora_down.weight", "<name>.lora_up.weight"). A
// channels-last kernel gets a channels-last down. Before dc_lora_alloc.
int dc_lora_add(dc_lora *l, int param, const char *name, int rank, float alpha);
// Allocates the factors (trainable, zeroed; with gradients if with_grad).
int dc_lora_alloc(dc_lora *l, dc_backend *be, bool with_grad);
// Sizes the run-time scratch for linear layers of up to `rows` rows, in
// activations of up to 4 bytes.
int dc_lora_reserve(dc_lora *l, int64_t rows);
// Reserves the convolutions the delta of conv item `param` runs at run time
// for the layer's shape s (down: s with r output channels; up: 1 x 1), and
// the scratch they need.
int dc_lora_reserve_conv(dc_lora *l, int param, const dc_conv2d_shape *s, bool backward);
// Run time: the target set carries the LoRA (target->adapter), or not.
void dc_lora_attach(dc_lora *l);
void dc_lora_detach(dc_lora *l);
// W += s up @ down for every item, in each weight's storage dtype: summed in
// fp32 and rounded once. A trainable weight's master copy is written and its
// compute copy refreshed. Unmerge subtracts it (exactly only in F32).
int dc_lora_merge(dc_lora *l);
int dc_lora_unmerge(dc_lora *l);
void dc_lora_free(dc_lora *l);
