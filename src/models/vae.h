// Stable Diffusion's VAE: diffusers' AutoencoderKL (SD 1.x, 2.x), inference.
//
// encode: image [B, in, H, W] in [-1, 1] -> mean, logvar [B, latent, H/f, W/f]
// decode: z [B, latent, h, w] (already divided by the scaling factor)
//         -> image [B, out, f h, f w], unclamped
// with f = 2^(nblocks - 1) (8 for SD). Parameters are registered under the
// diffusers state-dict names (encoder.*, decoder.*, quant_conv,
// post_quant_conv, in that order); the original single-file names
// (first_stage_model.encoder.down.0.block.0...) load through a name map.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "backend/backend.h"
#include "io/json.h"
#include "nn/params.h"
#include "nn/weights.h"

#define DC_VAE_MAX_BLOCKS 8
#define DC_VAE_MAX_LAYERS 8

typedef struct {
    int in_channels, out_channels;  // image channels (3)
    int latent_channels;            // 4
    int nblocks;                    // len(block_out_channels)
    int ch[DC_VAE_MAX_BLOCKS];      // block_out_channels (128, 256, 512, 512)
    int layers_per_block;           // resnets per down block; the up blocks have one more
    int groups;                     // GroupNorm groups (32)
    float eps;                      // GroupNorm eps (1e-6)
    float scaling_factor;           // 0.18215: the diffusion model sees z * scaling_factor
} dc_vae_config;

// From diffusers' vae/config.json (root parsed from `path`, named in messages).
int dc_vae_config_from_json(dc_vae_config *c, const dc_json *root, const char *path);
// From the tensors' shapes, for files without a config (a single-file
// checkpoint); GroupNorm groups, eps and the scaling factor take SD's values.
int dc_vae_config_infer(dc_vae_config *c, const dc_weights *w, dc_names names);
int dc_vae_config_validate(const dc_vae_config *c);
// The downsampling factor f = 2^(nblocks - 1).
static inline int dc_vae_factor(const dc_vae_config *c) { return 1 << (c->nblocks - 1); }

// Where the parameter named `param` (diffusers name) lies in a file of the
// original layout (encoder.down.0.block.0.conv1.weight, ...): 0, or -1 with a
// message for a name that is not a VAE parameter.
int dc_vae_original_name(const dc_vae_config *c, const char *param, dc_weight_src *src);

typedef struct dc_vae_modules dc_vae_modules;
typedef struct dc_vae_acts dc_vae_acts;

typedef struct dc_vae {
    dc_vae_config cfg;
    dc_backend *be;
    bool has_encoder, has_decoder;
    dc_params params;         // frozen, diffusers names, state-dict order
    dc_vae_modules *mods;
    dc_vae_acts *acts;        // planned by dc_vae_reserve
    int max_batch, height, width;  // what was reserved (image size)
    int enc_batch;                 // images the encoder takes through each op together
} dc_vae;

// Registers the halves asked for (encoder: encoder.* and quant_conv;
// decoder: decoder.* and post_quant_conv) and allocates their weights,
// frozen (zeros until loaded), kept in `loaded` where the backend can
// (dc_params_alloc_frozen; the files' dtype from dc_weights_dtype, or DC_F32).
int dc_vae_create(dc_vae **out, const dc_vae_config *c, dc_backend *be, dc_dtype loaded, bool encoder,
                  bool decoder);
// Loads every registered parameter from w: names as diffusers writes them
// (older files' attention names query/key/value/proj_attn are accepted too),
// or the original layout's.
int dc_vae_load(dc_vae *m, const dc_weights *w, dc_names names);
// Plans every activation for batches of up to max_batch images of height x
// width pixels (multiples of f), and reserves the backend's workspaces, so
// that encode and decode allocate nothing. Encode and decode then run that
// image size (another size needs another reserve, which replans).
int dc_vae_reserve(dc_vae *m, int max_batch, int height, int width);
// The same, with the encoder taking up to enc_batch images through each op
// together (fewer, larger calls: a GPU's throughput when encoding a data
// set), for about enc_batch times the encoder's activation memory. A call
// of B images runs B / enc_batch such batches, the rest one at a time.
// Each image's result is what dc_vae_reserve's one at a time gives, up to
// the rounding of ops whose order of sums depends on the batch (a GPU's
// convolution algorithms); the decoder still runs one image at a time.
// enc_batch is lowered where a batch's maps would exceed int indexing.
int dc_vae_reserve_batch(dc_vae *m, int max_batch, int enc_batch, int height, int width);
// Frees the planned activations (a pipeline short of device memory frees
// one model's for the other's); reserve again before the next run.
void dc_vae_release(dc_vae *m);
// image [B, in, H, W] -> mean, logvar [B, latent, H/f, W/f], logvar clamped
// to [-30, 20] as diffusers' DiagonalGaussianDistribution does.
int dc_vae_encode(dc_vae *m, dc_buf mean, dc_buf logvar, dc_buf image, int B, int height, int width);
// z [B, latent, h, w] -> image [B, out, f h, f w] (f h x f w reserved).
int dc_vae_decode(dc_vae *m, dc_buf image, dc_buf z, int B, int h, int w);
void dc_vae_free(dc_vae *m);
// Device memory of the planned activations (0 before dc_vae_reserve); the
// backend's convolution and attention workspaces come on top.
size_t dc_vae_activation_bytes(const dc_vae *m);

// Multiply-adds of one image (convolutions, projections and attention).
double dc_vae_encode_macs(const dc_vae *m, int height, int width);
double dc_vae_decode_macs(const dc_vae *m, int h, int w);
