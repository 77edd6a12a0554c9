// The VAE's encoder and decoder as explicit calls of backend ops, and the
// plan of their activations.
//
// Memory. A 512x512 decode holds maps of 256 channels at full resolution
// (67M values an image), so activations are not kept per layer: the stream
// and a resnet's two intermediates rotate through three buffers (slots), the
// attention's keys and values have two more, and each slot is as large as
// the largest map it ever holds. One walk of the network sizes the slots
// (and reserves each convolution shape and the attention workspace) and
// the same walk runs it, so plan and run cannot disagree.
//
// Maps are channels-last, [H, W, C] = [HW, C] tokens (the convolutions read
// them as they are, with weights stored [co, k, k, ci]); the caller's images
// and latents are [C, H, W] as PyTorch's, transposed at the ends.
//
// Images go through one at a time: a 512x512 image's maps already fill a
// GPU, the memory stays that of one image whatever the batch, and only
// batch-1 convolution shapes need reserving. A throughput job (prepare's
// encoding of a data set) asks instead for the encoder to take up to
// enc_batch images through each op together (dc_vae_reserve_batch): 28
// convolutions a batch instead of 28 a picture, and attention over every
// picture's tokens in one call, for enc_batch times the memory.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "models/vae_modules.h"
#include "nn/arena.h"

enum { SLOTS = 3, BUF_K = 3, BUF_V = 4, BUF_IN = 5, BUF_OUT = 6, NBUF = 7 };

struct dc_vae_acts {
    void *base;
    dc_buf buf[NBUF];         // slots, keys, values [HW, C] (compute dtype); the caller's in and out [C, HW]
    dc_buf mean, rstd;        // [n, groups] F32: GroupNorm statistics (not needed afterwards)
    dc_buf lse;               // [n, HW] F32: attention log-sum-exp
    size_t bytes;             // of base
};

typedef enum { PASS_RUN, PASS_SIZE, PASS_COUNT } pass_mode;

// n images through the encoder or decoder, each op taking all n: in SIZE
// mode the walk records the buffer sizes and reserves every shape; in COUNT
// mode it adds up the multiply-adds (n = 1); in RUN mode it runs the ops.
typedef struct {
    const dc_vae *m;
    pass_mode mode;
    int n;
    dc_buf buf[NBUF], mean, rstd, lse;
    int64_t need[NBUF];  // SIZE: elements of each buffer (slots, k, v), and of lse
    int64_t need_lse;
    double macs;         // COUNT
} vae_pass;

static void use(vae_pass *p, int b, int64_t n) {
    if (p->mode == PASS_SIZE && b < BUF_IN && n > p->need[b]) p->need[b] = n;
}

// y = conv(x) over an image of H x W, plus the residual in buffer r where r
// >= 0 (added in the convolution's epilogue; the VAE's weights carry no
// adapter); down: the encoder's downsampling, which pads only the bottom and
// right (diffusers' Downsample2D with padding 0).
static int conv(vae_pass *p, const dc_conv2d *c, int y, int x, int r, int H, int W, bool down) {
    dc_conv2d_shape s = dc_conv2d_shape_of(c, p->n, H, W);
    if (down) s.pad_t = 0, s.pad_b = 1, s.pad_l = 0, s.pad_r = 1;
    int64_t n = (int64_t)p->n * c->co * dc_conv2d_ho(&s) * dc_conv2d_wo(&s);
    switch (p->mode) {
    case PASS_SIZE: use(p, y, n); return p->m->be->reserve_conv(p->m->be, &s, false);
    case PASS_COUNT: p->macs += (double)n * c->ci * c->k * c->k; return 0;
    case PASS_RUN:
        if (r < 0) dc_conv2d_fwd(p->m->be, &p->m->params, c, p->buf[y], p->buf[x], &s);
        else
            p->m->be->conv2d_fwd_res(p->m->be, p->buf[y], p->buf[x], dc_weight_plain(&p->m->params, c->w),
                                     dc_param_w(&p->m->params, c->b), p->buf[r], &s);
        return 0;
    }
    return 0;
}

// y = GroupNorm(x), then SiLU if silu.
static void norm(vae_pass *p, const dc_group_norm *g, int y, int x, int64_t HW, bool silu) {
    use(p, y, p->n * g->C * HW);
    if (p->mode == PASS_RUN)
        dc_group_norm_nhwc_fwd(p->m->be, &p->m->params, g, p->buf[y], p->mean, p->rstd, p->buf[x], p->n, HW, silu);
}

// y[n M, out] = x[n M, in] W^T + b: M tokens an image
static void linear(vae_pass *p, const dc_linear *l, int y, int x, int M) {
    M *= p->n;
    use(p, y, (int64_t)M * l->out);
    if (p->mode == PASS_COUNT) p->macs += (double)M * l->in * l->out;
    if (p->mode == PASS_RUN) dc_linear_fwd(p->m->be, &p->m->params, l, p->buf[y], p->buf[x], M);
}

// y[n, N, M] = x[n, M, N]
static void transpose(vae_pass *p, int y, int x, int64_t M, int64_t N) {
    use(p, y, p->n * M * N);
    if (p->mode == PASS_RUN) p->m->be->transpose(p->m->be, p->buf[y], p->buf[x], p->n, M, N);
}

// y += x over n images of `count` values
static void add(vae_pass *p, int y, int x, int64_t count) {
    if (p->mode == PASS_RUN) p->m->be->axpy(p->m->be, p->buf[y], p->buf[x], 1.0f, p->n * count);
}

// The two slots other than x's.
static void others(int x, int *a, int *b) { *a = (x + 1) % SLOTS, *b = (x + 2) % SLOTS; }

// ResnetBlock2D on the stream in slot *x (moved to another slot when the
// shortcut is the identity), the residual added by the last convolution:
//   a = SiLU(norm1(x)); b = conv1(a); a = SiLU(norm2(b));
//   b = conv2(a) + x (the stream now in b), or b = shortcut(x), x = conv2(a) + b.
static int resnet(vae_pass *p, const vae_resnet *r, int *x, int H, int W) {
    int a, b;
    int64_t HW = (int64_t)H * W;
    others(*x, &a, &b);
    norm(p, &r->norm1, a, *x, HW, true);
    DC_TRY(conv(p, &r->conv1, b, a, -1, H, W, false));
    norm(p, &r->norm2, a, b, HW, true);
    if (!r->has_shortcut) {
        DC_TRY(conv(p, &r->conv2, b, a, *x, H, W, false));
        *x = b;
        return 0;
    }
    DC_TRY(conv(p, &r->shortcut, b, *x, -1, H, W, false));
    return conv(p, &r->conv2, *x, a, b, H, W, false);
}

// x += to_out(attention(q, k, v)) with q, k, v = projections of the tokens
// of group_norm(x), one head of C channels over HW tokens (scale 1/sqrt(C)).
static int attention(vae_pass *p, const vae_attention *t, int x, int C, int HW) {
    const dc_vae *m = p->m;
    int a, b;
    others(x, &a, &b);
    norm(p, &t->norm, b, x, HW, false);                    // b [HW, C] tokens
    linear(p, &t->q, a, b, HW);                            // a [HW, C]
    linear(p, &t->k, BUF_K, b, HW);
    linear(p, &t->v, BUF_V, b, HW);
    dc_attn_shape s = {.B = p->n, .H = 1, .Tq = HW, .Tk = HW, .Dh = C, .Dv = C};
    s.q = s.k = s.v = s.out = dc_attn_rows(HW, C, C);
    use(p, b, (int64_t)p->n * HW * C);
    if (p->mode == PASS_SIZE) {
        if ((int64_t)p->n * HW > p->need_lse) p->need_lse = (int64_t)p->n * HW;
        DC_TRY(m->be->reserve(m->be, HW, C));
    }
    if (p->mode == PASS_COUNT) p->macs += 2.0 * HW * HW * C;
    if (p->mode == PASS_RUN)
        m->be->attention_fwd(m->be, p->buf[b], p->lse, p->buf[a], p->buf[BUF_K], p->buf[BUF_V], &s);
    linear(p, &t->out, a, b, HW);                          // a [HW, C]
    add(p, x, a, (int64_t)C * HW);
    return 0;
}

static int mid(vae_pass *p, const vae_mid *md, int *x, int C, int H, int W) {
    DC_TRY(resnet(p, &md->res[0], x, H, W));
    DC_TRY(attention(p, &md->attn, *x, C, H * W));
    return resnet(p, &md->res[1], x, H, W);
}

// Image in BUF_IN [in, H, W] -> moments [2 latent, H/f, W/f] (quant_conv's
// output: mean, then logvar, as PyTorch lays them out) in the slot returned.
static int encoder(vae_pass *p, int H, int W, int *moments) {
    const dc_vae_config *c = &p->m->cfg;
    const vae_encoder *e = &p->m->mods->enc;
    int x = 0, a, b;
    transpose(p, 1, BUF_IN, c->in_channels, (int64_t)H * W);  // [HW, in]
    DC_TRY(conv(p, &e->conv_in, x, 1, -1, H, W, false));
    for (int i = 0; i < c->nblocks; i++) {
        for (int j = 0; j < c->layers_per_block; j++) DC_TRY(resnet(p, &e->res[i][j], &x, H, W));
        if (i + 1 == c->nblocks) break;
        others(x, &a, &b);
        DC_TRY(conv(p, &e->down[i], a, x, -1, H, W, true));
        x = a, H /= 2, W /= 2;
    }
    DC_TRY(mid(p, &e->mid, &x, c->ch[c->nblocks - 1], H, W));
    others(x, &a, &b);
    norm(p, &e->norm_out, a, x, (int64_t)H * W, true);
    DC_TRY(conv(p, &e->conv_out, b, a, -1, H, W, false));
    DC_TRY(conv(p, &p->m->mods->quant_conv, a, b, -1, H, W, false));
    transpose(p, b, a, (int64_t)H * W, 2 * c->latent_channels);
    *moments = b;
    return 0;
}

// z in BUF_IN [latent, h, w] -> image in BUF_OUT [out, f h, f w].
static int decoder(vae_pass *p, int H, int W) {
    const dc_vae_config *c = &p->m->cfg;
    const vae_decoder *d = &p->m->mods->dec;
    int x = 1, a, b;
    transpose(p, 2, BUF_IN, c->latent_channels, (int64_t)H * W);  // [hw, latent]
    DC_TRY(conv(p, &p->m->mods->post_quant_conv, 0, 2, -1, H, W, false));
    DC_TRY(conv(p, &d->conv_in, x, 0, -1, H, W, false));
    DC_TRY(mid(p, &d->mid, &x, c->ch[c->nblocks - 1], H, W));
    for (int i = 0; i < c->nblocks; i++) {
        for (int j = 0; j <= c->layers_per_block; j++) DC_TRY(resnet(p, &d->res[i][j], &x, H, W));
        if (i + 1 == c->nblocks) break;
        // nearest 2x into b, then a 3x3 conv into a: the next resnet's
        // first norm then writes into b, already of that size, and only its
        // narrower maps go to x's slot (at 512x512: 320 MiB in 16-bit, not 384)
        others(x, &a, &b);
        int C = d->up[i].ci;
        use(p, b, (int64_t)p->n * C * 4 * H * W);
        if (p->mode == PASS_RUN) p->m->be->upsample2x_nhwc_fwd(p->m->be, p->buf[b], p->buf[x], p->n, C, H, W);
        H *= 2, W *= 2;
        DC_TRY(conv(p, &d->up[i], a, b, -1, H, W, false));
        x = a;
    }
    others(x, &a, &b);
    norm(p, &d->norm_out, a, x, (int64_t)H * W, true);
    DC_TRY(conv(p, &d->conv_out, b, a, -1, H, W, false));
    transpose(p, BUF_OUT, b, (int64_t)H * W, c->out_channels);  // [out, HW]
    return 0;
}

void dc_vae_release(dc_vae *m) {
    if (!m->acts) return;
    if (m->acts->base) m->be->free(m->be, m->acts->base);
    free(m->acts);
    m->acts = NULL;
    m->max_batch = m->enc_batch = m->height = m->width = 0;
}

// The activations, carved out of one allocation (nn/arena.h): the maps, then
// the group norm's statistics and attention's lse in fp32, for p->n images.
static void carve(const dc_vae_config *c, const vae_pass *p, dc_arena *ar, dc_vae_acts *a) {
    for (int i = 0; i < BUF_IN; i++) a->buf[i] = dc_arena_take(ar, p->need[i]);
    a->mean = dc_arena_take32(ar, (int64_t)p->n * c->groups), a->rstd = dc_arena_take32(ar, (int64_t)p->n * c->groups);
    a->lse = dc_arena_take32(ar, p->need_lse);
}

int dc_vae_reserve(dc_vae *m, int max_batch, int height, int width) {
    return dc_vae_reserve_batch(m, max_batch, 1, height, width);
}

int dc_vae_reserve_batch(dc_vae *m, int max_batch, int enc_batch, int height, int width) {
    const dc_vae_config *c = &m->cfg;
    int f = dc_vae_factor(c);
    if (max_batch < 1 || enc_batch < 1) return dc_fail("VAE: batch size must be at least 1");
    if (height < f || width < f || height % f || width % f)
        return dc_fail("VAE: image size %dx%d: width and height must be positive multiples of %d", width, height, f);
    if (!m->has_encoder || enc_batch > max_batch) enc_batch = m->has_encoder ? max_batch : 1;
    if (m->acts && m->height == height && m->width == width && m->enc_batch == enc_batch) {
        if (max_batch > m->max_batch) m->max_batch = max_batch;  // nothing more to plan
        return 0;
    }
    dc_vae_release(m);
    // One image each way first: the shapes of batch 1 (images left over
    // from the encoder's batches go one at a time) and one image's maps.
    vae_pass p = {.m = m, .mode = PASS_SIZE, .n = 1};
    int moments;
    if (m->has_encoder && encoder(&p, height, width, &moments))
        return dc_fail_ctx("VAE encoder at %dx%d", width, height);
    if (m->has_decoder && decoder(&p, height / f, width / f))
        return dc_fail_ctx("VAE decoder at %dx%d", width, height);
    // Ops index a batch with int: one image must fit, and the encoder takes
    // fewer images together where their maps would not.
    int64_t most = 1;
    for (int i = 0; i < BUF_IN; i++) {
        if (p.need[i] > INT32_MAX)
            return dc_fail("VAE: %dx%d images are too large (a map of %lld values)", width, height,
                           (long long)p.need[i]);
        if (p.need[i] > most) most = p.need[i];
    }
    if (enc_batch > INT32_MAX / most) enc_batch = (int)(INT32_MAX / most);
    p.n = enc_batch;
    if (enc_batch > 1 && encoder(&p, height, width, &moments))
        return dc_fail_ctx("VAE encoder at %dx%d, %d images together", width, height, enc_batch);
    dc_vae_acts *a = calloc(1, sizeof *a);
    if (!a) return dc_fail("out of memory");
    dc_dtype dt = m->be->compute;
    dc_arena ar = dc_arena_counting(dt);
    carve(c, &p, &ar, a);
    const size_t total = ar.used;
    a->base = m->be->alloc(m->be, total);
    if (!a->base) {
        free(a);
        return dc_fail_ctx("VAE activations for %dx%d images (%.1f MiB)", width, height, total / 1048576.0);
    }
    ar = dc_arena_over(a->base, dt);
    carve(c, &p, &ar, a);
    a->bytes = total;
    m->acts = a;
    m->max_batch = max_batch, m->enc_batch = enc_batch, m->height = height, m->width = width;
    return 0;
}

static int check_run(const dc_vae *m, bool enc, int B, int height, int width) {
    if (enc ? !m->has_encoder : !m->has_decoder)
        return dc_fail("VAE: this model was created without its %s", enc ? "encoder" : "decoder");
    if (!m->acts || B < 1 || B > m->max_batch || height != m->height || width != m->width)
        return dc_fail("VAE: %d images of %dx%d, but dc_vae_reserve planned %d of %dx%d", B, width, height,
                       m->max_batch, m->width, m->height);
    return 0;
}

static vae_pass run_pass(const dc_vae *m) {
    vae_pass p = {.m = m, .mode = PASS_RUN, .n = 1, .mean = m->acts->mean, .rstd = m->acts->rstd, .lse = m->acts->lse};
    memcpy(p.buf, m->acts->buf, sizeof p.buf);
    return p;
}

int dc_vae_encode(dc_vae *m, dc_buf mean, dc_buf logvar, dc_buf image, int B, int height, int width) {
    DC_TRY(check_run(m, true, B, height, width));
    dc_backend *be = m->be;
    const dc_vae_config *c = &m->cfg;
    int f = dc_vae_factor(c), moments;
    int64_t img = (int64_t)c->in_channels * height * width;
    int64_t lat = (int64_t)c->latent_channels * (height / f) * (width / f);
    size_t bytes = (size_t)lat * dc_dtype_size(be->compute);
    dc_params_refresh(&m->params);
    vae_pass p = run_pass(m);
    for (int i = 0; i < B; i += p.n) {
        p.n = B - i >= m->enc_batch ? m->enc_batch : 1;  // what is left over goes one at a time
        p.buf[BUF_IN] = dc_buf_at(image, i * img);
        DC_TRY(encoder(&p, height, width, &moments));
        for (int k = 0; k < p.n; k++) {  // moments [n, 2 latent, h, w]: each image's mean, then its logvar
            dc_buf at = dc_buf_at(p.buf[moments], 2 * k * lat);
            be->copy(be, dc_buf_at(mean, (i + k) * lat).p, at.p, bytes);
            be->copy(be, dc_buf_at(logvar, (i + k) * lat).p, dc_buf_at(at, lat).p, bytes);
        }
        be->clamp(be, dc_buf_at(logvar, i * lat), p.n * lat, -30.0f, 20.0f);  // as diffusers clamps it
    }
    return dc_backend_status(be);
}

int dc_vae_decode(dc_vae *m, dc_buf image, dc_buf z, int B, int h, int w) {
    const dc_vae_config *c = &m->cfg;
    int f = dc_vae_factor(c);
    DC_TRY(check_run(m, false, B, h * f, w * f));
    int64_t img = (int64_t)c->out_channels * h * f * w * f, lat = (int64_t)c->latent_channels * h * w;
    dc_params_refresh(&m->params);
    vae_pass p = run_pass(m);
    for (int i = 0; i < B; i++) {
        p.buf[BUF_IN] = dc_buf_at(z, i * lat);
        p.buf[BUF_OUT] = dc_buf_at(image, i * img);
        DC_TRY(decoder(&p, h, w));
    }
    return dc_backend_status(m->be);
}

size_t dc_vae_activation_bytes(const dc_vae *m) { return m->acts ? m->acts->bytes : 0; }

double dc_vae_encode_macs(const dc_vae *m, int height, int width) {
    vae_pass p = {.m = m, .mode = PASS_COUNT, .n = 1};
    int moments;
    return m->has_encoder && !encoder(&p, height, width, &moments) ? p.macs : 0;
}

double dc_vae_decode_macs(const dc_vae *m, int h, int w) {
    vae_pass p = {.m = m, .mode = PASS_COUNT, .n = 1};
    return m->has_decoder && !decoder(&p, h, w) ? p.macs : 0;
}
