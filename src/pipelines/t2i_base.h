// What a text-to-image training run takes from its base Stable Diffusion
// model and its prepared data set, besides the UNet's own training:
//   - the base UNet's config and weights (fine-tuning), when it has a UNet;
//   - the scheduler config, whose betas the run trains on and whose
//     prediction_type is the run's default;
//   - the empty prompt embedded by the base's text encoder, which replaces a
//     dropped caption (classifier-free guidance). It is encoded on the CPU
//     in fp32, whatever device trains, so the data set's fingerprint (which
//     includes it) is the same on every machine and a run resumes anywhere;
//   - the text encoder's config and weights and the tokenizer, for a run
//     that trains the encoder along with the UNet (it reads the captions'
//     token ids, models/unet_text.h);
//   - from the data set's prepare.json (written by `diffusion prepare`):
//     whether it holds latents or pixels, the VAE's scaling factor, and its
//     aspect-ratio buckets' folders (a data set each). A
//     data set written elsewhere (mosaicml/streaming's MDSWriter) has none:
//     its latents column is named (train/shards.h), and the scaling factor
//     is given or else the base VAE's config's.
#pragma once
#include <stdbool.h>

#include "diffusion/sd_sched_config.h"
#include "models/clip_text.h"
#include "models/unet.h"
#include "text/clip_tokenizer.h"

typedef struct {
    const char *model;           // the base: diffusers folder or single file
    const char *data;            // the prepared data set (index.json, prepare.json)
    const char *vocab;           // CLIP vocabulary (NULL: the base's tokenizer/)
    const char *vocab_fallback;  // used when neither is there (NULL: none)
    unsigned st_flags;           // DC_ST_NO_VERIFY ...
    const char *latents_column;  // the data's single latents (NULL: prepare's columns)
    float latent_scale;          // > 0: the VAE's scaling factor of the data's latents
} dc_t2i_opts;

#define DC_T2I_MAX_BUCKETS 4096

typedef struct {
    bool has_unet;               // the base holds a UNet
    dc_unet_config unet;         // its config (when has_unet)
    char no_unet[512];           // else why not (the message of looking for it)
    dc_sd_sched_cfg sched;       // the scheduler config (SD's own when the base has none)
    bool latents;                // the data hold latents (else pixels)
    char **buckets;              // the data sets of its aspect-ratio buckets (prepare --buckets), or NULL
    int nbuckets;
    float latent_scale;          // the data's VAE scaling factor (latents)
    int text_len, text_dim;      // the text encoder's output: [text_len, text_dim]
    float *text_null;            // [text_len, text_dim] "" embedded
    int text_null_len;           // its tokens that count (BOS, EOS)
    dc_clip_text_config text;    // the text encoder's, the layers SD runs (an SD 2 single file's
                                 // last, which it skips, left out)
    dc_clip_tokenizer tok;       // the base's tokenizer
} dc_t2i_base;

// Reads what the base and the data set say, checks they agree (latents for a
// model with a VAE, pixels for one without; the text encoder's width is the
// UNet's cross-attention width), and embeds the empty prompt.
int dc_t2i_base_open(dc_t2i_base *b, const dc_t2i_opts *o);
void dc_t2i_base_free(dc_t2i_base *b);

// The dtype the base's UNet weights come in (a frozen UNet keeps it).
int dc_t2i_unet_dtype(const dc_t2i_opts *o, dc_dtype *dt);
// Loads the base UNet's weights into m, a UNet of the base's architecture
// (its latent size may differ from the base's sample_size).
int dc_t2i_load_unet(const dc_t2i_opts *o, dc_model *m);
// Loads the base text encoder's weights into te, an encoder of b->text's
// config (a joint model's).
int dc_t2i_load_text(const dc_t2i_opts *o, dc_clip_text *te);
