// DreamBooth's data, as diffusers' train_dreambooth.py makes it: the instance
// pictures, each captioned with the instance prompt ("a photo of sks dog");
// with prior preservation, class pictures captioned with the class prompt
// ("a photo of a dog"), which the base model draws where the class folder
// holds fewer than asked for (its txt2img: Euler a, 20 steps, guidance 7.5,
// picture i from seed i, written class_NNNNN.png, so a stopped run draws the
// rest). Both sets are prepared (pipelines/prepare.h) into the run folder:
// RUN/dreambooth/instance/ and RUN/dreambooth/class/, at the size asked for
// (default: the base's). The trainer pairs them (train/pairs.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "cli/args.h"

typedef struct {
    const char *instance_data;    // a folder of pictures (caption files are not read)
    const char *instance_prompt;
    const char *class_prompt;     // NULL: no prior preservation
    const char *class_data;       // NULL: RUN/dreambooth/class_images
    int class_images;             // the class pictures wanted
    int size;                     // the pictures' side (0: the base's default)
} t2i_dreambooth;

// Draws the missing class pictures, then prepares both sets with the base
// model's VAE and text encoder on be; inst and cls (cap bytes each) name the
// prepared data sets (cls "" without prior preservation).
// vocab, fallback: the CLIP vocabulary (NULL: the model's tokenizer/), and
// the one used when neither is there.
int t2i_dreambooth_prepare(const t2i_dreambooth *d, const char *model, const char *vocab, const char *fallback,
                           unsigned st_flags, const char *run, dc_backend *be, char *inst, char *cls, size_t cap);
// Checks the DreamBooth flags of ap: d NULL (no --instance-data) refuses
// any of them; else the instance prompt is needed, --data is refused, the
// class flags need --class-prompt; class_images and resolution go into d.
int t2i_dreambooth_flags(const arg_parser *ap, t2i_dreambooth *d, int class_images, int resolution);
// The prepared sets' folders of run (what t2i_dreambooth_prepare writes).
int t2i_dreambooth_paths(const t2i_dreambooth *d, const char *run, char *inst, char *cls, size_t cap);
