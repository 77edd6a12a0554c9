// Where a model's weights come from, and how they load under another
// checkpoint layout's names.
//
// A dc_weights is one or more safetensors files (a diffusers component may
// shard its weights) and a key prefix ("model.diffusion_model." for the UNet
// of a single-file checkpoint, "text_model." for a text encoder written by
// transformers 4). Models register their parameters under one canonical
// naming (diffusers / transformers state-dict keys); a dc_weight_map says
// where each parameter lies in a file of another layout (the original
// CompVis/Stability names, OpenCLIP's), so any layout loads without a
// converter and without a second copy of the file in memory.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "io/safetensors.h"
#include "nn/params.h"

typedef struct {
    dc_st_file *files;  // not owned
    int nfiles;
    char prefix[96];
} dc_weights;

// The naming scheme of a component's tensors: diffusers/transformers keys,
// or the original single-file keys (CompVis/Stability UNet and VAE, OpenAI
// CLIP under transformers names for SD 1.x, OpenCLIP for SD 2.x).
typedef enum { DC_NAMES_DIFFUSERS, DC_NAMES_ORIGINAL } dc_names;

// The tensor named prefix + name in any file (NULL if none); *file (may be
// NULL) receives the file that holds it.
const dc_st_tensor *dc_weights_find(const dc_weights *w, const char *name, const dc_st_file **file);
static inline bool dc_weights_has(const dc_weights *w, const char *name) {
    return dc_weights_find(w, name, NULL) != NULL;
}
// Dimension d of tensor prefix + name, or -1 if the tensor is absent or has
// fewer dimensions (no message: callers probe shapes to infer configs).
int64_t dc_weights_dim(const dc_weights *w, const char *name, int d);
// Number of tensors whose name (after the prefix) starts with `start`.
int dc_weights_count_prefix(const dc_weights *w, const char *start);
// The dtype a model's weights come in from w, for dc_params_alloc_frozen: F16
// or BF16 when every floating-point tensor under the prefix has it, else F32
// (mixed dtypes, F32 or wider, or none: kept exactly only in F32). Integer
// tensors (a text encoder's position ids) do not count.
dc_dtype dc_weights_dtype(const dc_weights *w);

// Where one parameter's values lie: the source tensor's name (after the
// prefix) and, for a tensor packed with others along its first dimension
// (OpenCLIP's attn.in_proj_weight holds q, k and v), the rows it takes.
typedef struct {
    char name[160];
    int64_t row0, rows;  // rows 0: the whole tensor
} dc_weight_src;
// Fills src for the parameter named `param`: 0, or -1 with a message.
typedef int (*dc_weight_map)(void *ctx, const char *param, dc_weight_src *src);

// Loads every parameter of ps (allocated) into its storage (dc_param_data, in
// its dtype) from w, through map (NULL: the parameter's own name). Shapes must
// match, except that dimensions of size 1 are ignored on both sides (a 1x1
// convolution [Co, Ci, 1, 1] loads into a linear layer's [Co, Ci]); any float
// dtype converts into F32 or the backend's compute dtype, but frozen weights
// kept as loaded (F16 or BF16 storage on a backend computing in F32) take only
// tensors of their own dtype, so that no value is rounded. A missing or
// mis-shaped tensor, a tensor of another dtype, or a NaN or infinity, is
// refused naming the file and the tensor. A fixed (non-trainable) parameter
// may be absent: the model computes it at creation. Marks the compute copy
// stale.
int dc_params_load_weights(dc_params *ps, const dc_weights *w, dc_weight_map map, void *ctx);
// The same for parameters [lo, hi) alone (one model's in a joint set), each
// under its own name (without the joint set's prefix: dc_param.prefix_len).
int dc_params_load_weights_range(dc_params *ps, int lo, int hi, const dc_weights *w, dc_weight_map map, void *ctx);
