// Training images in memory, and the order they are visited in.
//
// Sources: Fashion-MNIST as the Debian package dataset-fashion-mnist installs
// it (IDX files, gzipped or not), or a user's own safetensors file holding
//   "images": [N, C, H, W] U8 in 0..255, or a float type in [-1, 1]
//   "labels": [N] any integer type, 0 <= label < num_classes
// (optional __metadata__ "num_classes"; otherwise max label + 1).
//
// The order is a Fisher-Yates shuffle drawn from Philox keyed by (seed,
// epoch), so it depends on nothing else: not on batch size, thread or GPU
// count, which is what lets a run resume exactly on other hardware.
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int n, channels, height, width, num_classes;
    float *images;    // [n, channels, height, width] in [-1, 1]
    int32_t *labels;  // [n], each in [0, num_classes)
    const char *const *class_names;  // [num_classes], or NULL when the source has none
    uint64_t fingerprint;  // hash of the images and labels as loaded (resume checks it)
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

// Copies image idx into img_out[C * H * W], mirrored left-right if hflip.
void dc_dataset_get(const dc_dataset *ds, int64_t idx, float *img_out, bool hflip);

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
