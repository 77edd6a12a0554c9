// What the VAE programs (test_vae, test_vae_reference) share: the normalised
// error, the comparison of two configs, and a model run on host data
// (encode an image, decode a latent) with its outputs brought back.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "models/vae.h"
#include "nerr.h"


static bool same_config(const dc_vae_config *a, const dc_vae_config *b) {
    bool same = a->in_channels == b->in_channels && a->out_channels == b->out_channels &&
                a->latent_channels == b->latent_channels && a->nblocks == b->nblocks &&
                a->layers_per_block == b->layers_per_block && a->groups == b->groups && a->eps == b->eps &&
                a->scaling_factor == b->scaling_factor;
    for (int i = 0; same && i < a->nblocks; i++) same = a->ch[i] == b->ch[i];
    return same;
}

typedef struct { float *mean, *logvar, *dec; } outputs;

static int run(dc_vae *m, const float *img, const float *z, int B, int H, int W, outputs *o) {
    dc_backend *be = m->be;
    int f = dc_vae_factor(&m->cfg);
    int64_t ni = (int64_t)B * m->cfg.in_channels * H * W;
    int64_t nl = (int64_t)B * m->cfg.latent_channels * (H / f) * (W / f);
    int64_t no = (int64_t)B * m->cfg.out_channels * H * W;
    dc_buf bi = {be->alloc(be, ni * 4), DC_F32}, bz = {be->alloc(be, nl * 4), DC_F32};
    dc_buf bm = {be->alloc(be, nl * 4), DC_F32}, bl = {be->alloc(be, nl * 4), DC_F32};
    dc_buf bo = {be->alloc(be, no * 4), DC_F32};
    be->upload(be, bi.p, img, ni * 4), be->upload(be, bz.p, z, nl * 4);
    int rc = dc_vae_reserve(m, B, H, W);
    if (!rc && m->has_encoder) rc = dc_vae_encode(m, bm, bl, bi, B, H, W);
    if (!rc && m->has_decoder) rc = dc_vae_decode(m, bo, bz, B, H / f, W / f);
    if (!rc) {
        o->mean = malloc(nl * 4), o->logvar = malloc(nl * 4), o->dec = malloc(no * 4);
        be->download(be, o->mean, bm.p, nl * 4), be->download(be, o->logvar, bl.p, nl * 4);
        be->download(be, o->dec, bo.p, no * 4);
    }
    be->free(be, bi.p), be->free(be, bz.p), be->free(be, bm.p), be->free(be, bl.p), be->free(be, bo.p);
    return rc;
}

// Encodes B images of host data with m as reserved: out[0] mean, out[1]
// logvar (new arrays of B latents).
static inline int encode_host(dc_vae *m, const float *img, int B, int H, int W, float *out[2]) {
    dc_backend *be = m->be;
    int f = dc_vae_factor(&m->cfg);
    int64_t ni = (int64_t)B * m->cfg.in_channels * H * W, nl = (int64_t)B * m->cfg.latent_channels * (H / f) * (W / f);
    dc_buf bi = {be->alloc(be, ni * 4), DC_F32}, bm = {be->alloc(be, nl * 4), DC_F32}, bl = {be->alloc(be, nl * 4), DC_F32};
    be->upload(be, bi.p, img, ni * 4);
    int rc = dc_vae_encode(m, bm, bl, bi, B, H, W);
    if (!rc) {
        out[0] = malloc(nl * 4), out[1] = malloc(nl * 4);
        be->download(be, out[0], bm.p, nl * 4), be->download(be, out[1], bl.p, nl * 4);
    }
    be->free(be, bi.p), be->free(be, bm.p), be->free(be, bl.p);
    return rc;
}

static void outputs_free(outputs *o) { free(o->mean), free(o->logvar), free(o->dec); }
