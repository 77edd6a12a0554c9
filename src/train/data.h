// Training images in memory, and the order they are visited in.
//
// Sources: Fashion-MNIST as the Debian package dataset-fashion-mnist installs
// it (IDX files, gzipped or not), or a user's own safetensors file holding
//   "images": [N, C, H, W] U8 in 0..255, or a float type in [-1, 1]
//   "labels": [N] any integer type, 0 <= label < num_classes
// (optional __metadata__ "num_classes"; otherwise max label + 1).
//
// Class counts. A label is at most DC_DATA_MAX_CLASSES - 1 (the most classes
// a model may have). Without "num_classes" in the metadata, a class count
// above 1000 of which fewer than half the classes have any sample is refused
// as implausible: a single stray label such as 999999 would otherwise build a
// million-class model. Up to 1000 classes (ImageNet's count) are accepted as
// they come, so small sets with unused classes still load; a file that means
// to have many empty classes says so with "num_classes".
//
// Only regular files are read (a FIFO or device is refused without blocking),
// and no allocation exceeds what the file really holds: an IDX header cannot
// ask for more memory than its data brings.
//
// The order is a Fisher-Yates shuffle drawn from Philox keyed by (seed,
// epoch), so it depends on nothing else: not on batch size, thread or GPU
// count, which is what lets a run resume exactly on other hardware.
//
// Conditioning. A data set says what its samples are conditioned on (`cond`):
// class labels (every loader here), or text embeddings, one [text_len,
// text_dim] sequence a sample as a text encoder gave it, with the count of
// tokens that count (the rest is padding), and the empty prompt's embeddings
// for the samples whose caption is dropped for guidance. The trainer stages
// either into the micro-batch's dc_cond (train/batch_cond.h).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "models/model.h"

#define DC_DATA_MAX_CLASSES 1000000  // the most classes a model config allows
#define DC_DATA_SPARSE_CLASSES 1000  // above this, most classes must have samples

typedef struct {
    int n, channels, height, width, num_classes;
    float *images;    // [n, channels, height, width] in [-1, 1]
    int32_t *labels;  // [n], each in [0, num_classes)
    const char *const *class_names;  // [num_classes], or NULL when the source has none
    dc_cond_kind cond;    // DC_COND_LABELS (labels) or DC_COND_TEXT (the text_* members)
    int text_len, text_dim;
    float *text;          // [n, text_len, text_dim] each sample's caption embedded
    int32_t *text_lens;   // [n] its tokens that count, 1..text_len
    float *text_null;     // [text_len, text_dim] the empty prompt embedded: a dropped caption
    int text_null_len;    // its tokens that count
    // xxHash64 of the shape, class count, images (as the floats used, after
    // padding), labels and text: a resumed run compares it with the checkpoint's to
    // notice a data set that changed on disk. 0 for data not made by a loader.
    uint64_t fingerprint;
    char *source;     // the file or folder loaded (malloc'd; NULL when built in memory)
} dc_dataset;

#define DC_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from dir. pad_to > 28
// pads the 28x28 images to pad_to x pad_to with background (-1) evenly
// (2 px each side for 32); 0 or 28 keeps them as they are.
int dc_dataset_load_fmnist(dc_dataset *ds, const char *dir, bool train, int pad_to);
// A user's data set (see above); pad_to as for Fashion-MNIST (0: none).
int dc_dataset_load_safetensors(dc_dataset *ds, const char *path, int pad_to);
// A directory is read as Fashion-MNIST (training split), a .safetensors file
// as a user's data set.
int dc_dataset_load(dc_dataset *ds, const char *path_or_dir, int pad_to);
void dc_dataset_free(dc_dataset *ds);
// The fingerprint of ds as it is now (the loaders store it in ds->fingerprint).
uint64_t dc_dataset_fingerprint(const dc_dataset *ds);

// Copies image idx into img_out[C * H * W], mirrored left-right if hflip.
void dc_dataset_get(const dc_dataset *ds, int64_t idx, float *img_out, bool hflip);
// dst = src [rows, w] with each row mirrored left-right (not in place).
void dc_mirror_rows(float *dst, const float *src, int64_t rows, int w);

// The permutation of one epoch, rebuilt when another epoch is asked for.
typedef struct {
    int64_t n;
    uint64_t seed, epoch;
    int64_t *perm;  // [n]
    bool valid;     // perm holds the order of `epoch`
} dc_order;

int dc_order_init(dc_order *o, int64_t n, uint64_t seed);  // n in 1..2^31-1
// The i-th sample (0 <= i < n) of epoch `epoch`; -1 if i is out of range.
int64_t dc_order_get(dc_order *o, uint64_t epoch, int64_t i);
void dc_order_free(dc_order *o);
