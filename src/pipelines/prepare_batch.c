// `diffusion prepare`'s batches: see prepare_batch.h.
#include "pipelines/prepare_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "io/png.h"

void prep_bufs_free(dc_backend *be, batch_bufs *b) {
    dc_buf *d[] = {&b->img, &b->mean, &b->logvar, &b->lat32, &b->ctx, &b->ctx32};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i]->p) be->free(be, d[i]->p);
    void *pinned[] = {b->h_in, b->h_lat, b->h_ctx};
    for (size_t i = 0; i < sizeof pinned / sizeof *pinned; i++)
        if (pinned[i]) be->free_pinned(be, pinned[i]);
    free(b->h_px), free(b->m16), free(b->v16), free(b->c16);
    free(b->pos), free(b->orig_w), free(b->orig_h), free(b->tokens), free(b->caption);
    free(b->failed), free(b->why);
    memset(b, 0, sizeof *b);
}

static void *pinned(dc_backend *be, size_t bytes, int *rc) {
    void *p = *rc ? NULL : be->alloc_pinned(be, bytes);
    if (!p && !*rc) *rc = dc_fail_ctx("pinned host memory for a batch (%.1f MiB)", bytes / 1048576.0);
    return p;
}

int prep_bufs_alloc(dc_prepare_models *m, batch_bufs *b, int B, int H, int W, bool vae_batch) {
    dc_backend *be = m->be;
    const dc_vae *vae = m->sd.vae;
    memset(b, 0, sizeof *b);
    if (!be->alloc_pinned || !be->copy_async || !be->host_wait || !be->wait_ticket)
        return dc_fail("prepare: the %s backend cannot copy beside its ops", be->name);
    b->B = B, b->H = H, b->W = W, b->T = m->sd.text->cfg.positions, b->D = m->sd.text->cfg.width;
    b->C = vae ? vae->cfg.latent_channels : 0;
    b->h = vae ? H / dc_vae_factor(&vae->cfg) : 0, b->w = vae ? W / dc_vae_factor(&vae->cfg) : 0;
    b->pix = 3ll * H * W, b->lat = (int64_t)b->C * b->h * b->w;
    const int64_t ctx = (int64_t)b->T * b->D;
    const dc_dtype ct = be->compute;
    int rc = dc_buf_alloc(be, &b->ctx, ct, (size_t)(B * ctx), "text embeddings");
    if (!rc) rc = dc_buf_alloc(be, &b->ctx32, DC_F32, (size_t)(B * ctx), "text embeddings (f32)");
    b->h_ctx = pinned(be, sizeof(float) * (size_t)(B * ctx), &rc);
    if (!rc && vae) {
        rc = dc_buf_alloc(be, &b->img, ct, (size_t)(B * b->pix), "pictures");
        if (!rc) rc = dc_buf_alloc(be, &b->mean, ct, (size_t)(B * b->lat), "latent means");
        if (!rc) rc = dc_buf_alloc(be, &b->logvar, ct, (size_t)(B * b->lat), "latent log-variances");
        if (!rc) rc = dc_buf_alloc(be, &b->lat32, DC_F32, (size_t)(2 * B * b->lat), "latents (f32)");
        b->h_in = pinned(be, dc_dtype_size(ct) * (size_t)(B * b->pix), &rc);
        b->h_lat = pinned(be, sizeof(float) * (size_t)(2 * B * b->lat), &rc);
        if (!rc) rc = dc_vae_reserve_batch(m->sd.vae, B, vae_batch ? B : 1, H, W);
    }
    b->h_px = malloc((size_t)(B * b->pix));
    b->m16 = malloc(sizeof(uint16_t) * (size_t)(B * b->lat + 1));
    b->v16 = malloc(sizeof(uint16_t) * (size_t)(B * b->lat + 1));
    b->c16 = malloc(sizeof(uint16_t) * (size_t)(B * ctx));
    b->pos = malloc(sizeof *b->pos * (size_t)B);
    b->orig_w = malloc(sizeof(int) * (size_t)B), b->orig_h = malloc(sizeof(int) * (size_t)B);
    b->tokens = malloc(sizeof(int) * (size_t)B);
    b->caption = malloc(sizeof *b->caption * (size_t)B);
    b->failed = malloc(sizeof *b->failed * (size_t)B), b->why = malloc(sizeof *b->why * (size_t)B);
    if (!rc && (!b->h_px || !b->m16 || !b->v16 || !b->c16 || !b->pos || !b->orig_w || !b->orig_h || !b->tokens ||
                !b->caption || !b->failed || !b->why))
        rc = dc_fail("out of memory for a batch of %d pictures of %dx%d", B, W, H);
    if (rc) prep_bufs_free(be, b);
    return rc;
}

// The compute dtype's size, and picture k's slot of b->h_in.
static size_t in_size(const dc_prepare_models *m) { return dc_dtype_size(m->be->compute); }
static void *in_slot(const dc_prepare_models *m, const batch_bufs *b, int k) {
    return (char *)b->h_in + (size_t)k * b->pix * in_size(m);
}

void prep_move_slot(const dc_prepare_models *m, batch_bufs *b, int from, int to) {
    if (b->h_in) memcpy(in_slot(m, b, to), in_slot(m, b, from), in_size(m) * (size_t)b->pix);
    memcpy(b->h_px + to * b->pix, b->h_px + from * b->pix, (size_t)b->pix);
    b->orig_w[to] = b->orig_w[from], b->orig_h[to] = b->orig_h[from];
}

// Reads and resizes picture `e` of the set into slot k of the batch: its
// bytes, and (with a VAE) its values in [-1, 1] in the compute dtype, as the
// device's cast from fp32 would round them.
static int load_picture(const dc_prepare_models *m, const dc_picture_set *set, int64_t e, const dc_prepare_opts *o,
                        batch_bufs *b, int k) {
    dc_image pic, fit;
    DC_TRY(dc_picture_set_read(set, e, &pic, o->max_pixels, false));
    int rc = dc_image_fit(&pic, b->W, b->H, DC_RESIZE_CROP, &fit);
    if (rc == 0) {
        b->orig_w[k] = pic.width, b->orig_h[k] = pic.height;
        const int64_t plane = (int64_t)b->W * b->H;
        uint8_t *px = b->h_px + k * b->pix;
        for (int64_t i = 0; i < plane; i++)
            for (int c = 0; c < 3; c++) px[c * plane + i] = fit.rgb[i * 3 + c];
        const dc_dtype dt = m->be->compute;
        void *in = b->h_in ? in_slot(m, b, k) : NULL;
        for (int64_t i = 0; in && i < b->pix; i++) {
            const float v = dc_pixel_float(px[i]);
            if (dt == DC_F32) ((float *)in)[i] = v;
            else ((uint16_t *)in)[i] = dt == DC_BF16 ? dc_f32_to_bf16(v) : dc_f32_to_f16(v);
        }
    }
    dc_image_free(&pic), dc_image_free(&fit);
    return rc;
}

int prep_submit(dc_prepare_models *m, batch_bufs *b, int n) {
    dc_backend *be = m->be;
    const int64_t ctx = (int64_t)b->T * b->D;
    for (int k = 0; k < n; k++) {
        int32_t ids[DC_CLIP_CONTEXT];
        int count;
        DC_TRY(dc_clip_tokenize(&m->sd.tok, b->caption[k], ids, &count));
        b->tokens[k] = dc_clip_counted(count);  // with BOS and EOS
    }
    // the pictures go up beside the text encoder (once the ops queued before are done)
    const int64_t up = m->sd.vae ? be->copy_async(be, b->img.p, b->h_in, in_size(m) * (size_t)(n * b->pix), false) : 0;
    DC_TRY(dc_sd_encode_prompts(&m->sd, b->caption, n, b->ctx));
    be->cast(be, b->ctx32, b->ctx, n * ctx);
    b->ticket = be->copy_async(be, b->h_ctx, b->ctx32.p, sizeof(float) * (size_t)(n * ctx), true);
    if (m->sd.vae) {
        be->wait_ticket(be, up);
        DC_TRY(dc_vae_encode(m->sd.vae, b->mean, b->logvar, b->img, n, b->H, b->W));
        be->cast(be, b->lat32, b->mean, n * b->lat);
        be->cast(be, dc_buf_at(b->lat32, n * b->lat), b->logvar, n * b->lat);
        b->ticket = be->copy_async(be, b->h_lat, b->lat32.p, sizeof(float) * (size_t)(2 * n * b->lat), true);
    }
    return dc_backend_status(be);
}

int prep_collect(dc_prepare_models *m, batch_bufs *b, int n) {
    dc_backend *be = m->be;
    const int64_t ctx = (int64_t)b->T * b->D;
    DC_TRY(be->host_wait(be, b->ticket));
    DC_TRY(dc_backend_status(be));  // the downloads' contents are undefined after an error
    for (int64_t i = 0; i < n * ctx; i++) b->c16[i] = dc_f32_to_f16(b->h_ctx[i]);
    const float *mean = b->h_lat, *logvar = b->h_lat + n * b->lat;
    for (int64_t i = 0; m->sd.vae && i < n * b->lat; i++)
        b->m16[i] = dc_f32_to_f16(mean[i]), b->v16[i] = dc_f32_to_f16(logvar[i]);
    return 0;
}

// ---- reading a batch

static void read_batch(const batch_read *r) {
    const int nb = (int)(r->end - r->a);
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < nb; k++) {
        r->b->failed[k] = load_picture(r->m, r->set, r->idx[r->a + k], r->o, r->b, k) != 0;
        if (r->b->failed[k]) snprintf(r->b->why[k], sizeof r->b->why[k], "%s", dc_error());
    }
}

static void *read_batch_thread(void *p) {
    read_batch(p);
    return NULL;
}

void prep_reader_start(prep_reader *rd, const batch_read *r, bool overlap) {
    rd->r = *r;
    rd->pending = true;
    rd->running = overlap && pthread_create(&rd->th, NULL, read_batch_thread, &rd->r) == 0;
}

void prep_reader_wait(prep_reader *rd) {
    if (rd->running) pthread_join(rd->th, NULL);
    else if (rd->pending) read_batch(&rd->r);  // no thread: read it now
    rd->running = rd->pending = false;
}

