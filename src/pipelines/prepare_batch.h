// `diffusion prepare`'s batches (pipelines/prepare.c runs them): the
// buffers of a batch, its pictures read and resized on all cores (on a
// thread of their own where asked), and its encoding on the backend.
//
// A batch goes to the device in two halves: submit queues its work (the
// pictures' upload from pinned memory, the text encoder, the VAE encoder,
// the downloads of the results into pinned memory) without waiting for the
// device, and collect waits for those downloads and rounds the results to
// fp16. Where batches are read on a thread of their own (opts.overlap), the
// loop submits batch i before it collects and writes batch i - 1, so the
// device encodes one batch while the host writes the last and the reader
// decodes the next: three sets of buffers, one for each.
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipelines/prepare.h"

typedef struct {
    int B, H, W, C, h, w, T, D;
    int64_t pix, lat;          // per picture: 3 H W, C h w
    dc_buf img;                // [B, 3, H, W] compute dtype
    dc_buf mean, logvar;       // [B, C, h, w] compute dtype
    dc_buf lat32;              // [2, B, C, h, w] f32: the means, then the log-variances
    dc_buf ctx, ctx32;         // [B, T, D] compute dtype, f32
    void *h_in;                // pinned [B, 3, H, W] in the compute dtype: the pictures as uploaded
    float *h_lat, *h_ctx;      // pinned: lat32's and ctx32's values as downloaded
    int64_t ticket;            // the batch's last download (0: none to wait for)
    uint8_t *h_px;             // [B, 3, H, W] the resized pictures' bytes
    uint16_t *m16, *v16, *c16; // [B, C, h, w] twice, [B, T, D]: what is written, fp16
    // the batch in flight: pictures encoded, and its window [a, end) of the job's list
    int n;
    int64_t a, end;
    // per picture of the batch
    int64_t *pos;
    int *orig_w, *orig_h, *tokens;
    const char **caption;
    bool *failed;              // the picture of the slot could not be read
    char (*why)[512];          // and why
} batch_bufs;

// A batch of up to B pictures of H x W (vae_batch: the VAE encoder takes them
// together, dc_vae_reserve_batch); freed whole by prep_bufs_free, also on failure.
int prep_bufs_alloc(dc_prepare_models *m, batch_bufs *b, int B, int H, int W, bool vae_batch);
void prep_bufs_free(dc_backend *be, batch_bufs *b);
// Moves a loaded picture from slot `from` of the batch to slot `to`.
void prep_move_slot(const dc_prepare_models *m, batch_bufs *b, int from, int to);
// Queues the text encoder and the VAE on the n pictures loaded, and the
// downloads of their results, without waiting for the backend.
int prep_submit(dc_prepare_models *m, batch_bufs *b, int n);
// Waits for a submitted batch's results and rounds them to what is written.
int prep_collect(dc_prepare_models *m, batch_bufs *b, int n);

// The pictures idx[a, end) of the set read and resized into b's slots, on
// all cores (each into its own slot, its error kept in failed/why).
typedef struct {
    const dc_prepare_models *m;
    const dc_picture_set *set;
    const int64_t *idx;  // the job's entries of the set, in order
    const dc_prepare_opts *o;
    batch_bufs *b;
    int64_t a, end;
} batch_read;

// The next batch's reading, on a thread of its own while the current batch
// is encoded and written (overlap), or at prep_reader_wait when it is not.
typedef struct {
    batch_read r;
    pthread_t th;
    bool running, pending;
} prep_reader;

void prep_reader_start(prep_reader *rd, const batch_read *r, bool overlap);
// Until the reading is done (the reader is idle afterwards).
void prep_reader_wait(prep_reader *rd);
