// A UNet trained with its text encoder: see unet_text.h.
#include "models/unet_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    dc_model base;  // first
    dc_params set;  // the joint set: the UNet's parameters, then the encoder's
    dc_model *unet;
    dc_clip_text *text;
    void *bufs;     // hidden and dctx
    dc_buf hidden;  // [max_batch, T, W] F32 the encoder's output: the UNet's ctx
    dc_buf dctx;    // [max_batch, T, W] F32 its gradient, which the UNet's backward writes
    int max_batch;
} joint;

static int64_t text_bytes(const dc_clip_text_config *c, int B) {
    return 2 * (int64_t)B * c->positions * c->width * (int64_t)sizeof(float);
}

static void free_bufs(joint *m) {
    if (m->bufs) m->base.be->free(m->base.be, m->bufs);
    m->bufs = NULL, m->max_batch = 0;
}

static int jt_reserve(dc_model *mm, int max_batch) {
    joint *m = (joint *)mm;
    DC_TRY(dc_model_reserve(m->unet, max_batch));
    if (m->bufs && max_batch <= m->max_batch) return 0;  // the text's part does not change with the size
    DC_TRY(dc_clip_text_train_reserve(m->text, max_batch));
    free_bufs(m);
    const dc_clip_text_config *c = &m->text->cfg;
    dc_backend *be = m->base.be;
    if (!(m->bufs = be->alloc(be, (size_t)text_bytes(c, max_batch))))
        return dc_fail("out of memory for the text of %d images", max_batch);
    const int64_t seq = (int64_t)max_batch * c->positions * c->width;
    m->hidden = (dc_buf){m->bufs, DC_F32}, m->dctx = dc_buf_at(m->hidden, seq);
    m->max_batch = max_batch;
    return 0;
}

static int jt_forward(dc_model *mm, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    joint *m = (joint *)mm;
    const dc_clip_text_config *c = &m->text->cfg;
    if (!cond->ids.p || cond->len != c->positions)
        return dc_fail("a UNet trained with its text encoder reads %d token ids an image", c->positions);
    if (B < 1 || B > m->max_batch) return dc_fail("batch %d: reserved for 1..%d", B, m->max_batch);
    dc_params_refresh(&m->set);  // the encoder reads the compute copy before the UNet would refresh it
    DC_TRY(dc_clip_text_train_forward(m->text, m->hidden, cond->ids, B, 0));
    const dc_cond text = {.ctx = m->hidden, .len = c->positions, .dim = c->width, .lens = cond->lens, .dctx = m->dctx};
    return dc_model_forward(m->unet, out, x, t, &text, B);
}

static int jt_backward(dc_model *mm, dc_buf dout, int B) {
    joint *m = (joint *)mm;
    DC_TRY(dc_model_backward(m->unet, dout, B));
    return dc_clip_text_backward(m->text, m->dctx);
}

static int jt_config_kv(const dc_model *mm, dc_kv *kv) {
    const joint *m = (const joint *)mm;
    DC_TRY(dc_model_config_to_kv(m->unet, kv));
    return dc_clip_text_config_to_kv(&m->text->cfg, DC_UNET_TEXT_KV, kv);
}

static int jt_init(dc_model *mm, uint64_t seed) {
    joint *m = (joint *)mm;
    DC_TRY(dc_model_init_weights(m->unet, seed));
    return dc_clip_text_init_weights(m->text, seed);
}

static double jt_macs(const dc_model *mm) {
    const joint *m = (const joint *)mm;
    return dc_model_macs_per_image(m->unet) + dc_clip_text_macs(m->text);
}

static void jt_describe(const dc_model *mm, char *buf, size_t n) {
    const joint *m = (const joint *)mm;
    const dc_clip_text_config *c = &m->text->cfg;
    char unet[512];
    dc_model_describe(m->unet, unet, sizeof unet);
    const char *rest = strchr(unet, '\n');
    const int first = rest ? (int)(rest - unet) : (int)strlen(unet);
    snprintf(buf, n, "%.*s, with its CLIP text encoder (width %d, %d layers)%s", first, unet, c->width, c->layers,
             rest ? rest : "");
}

static int jt_set_recompute(dc_model *mm, int keep) { return dc_model_set_recompute(((joint *)mm)->unet, keep); }

static int jt_set_selective(dc_model *mm, bool on) { return dc_model_set_selective(((joint *)mm)->unet, on); }

static int64_t jt_activation_bytes(const dc_model *mm, dc_dtype compute, int max_batch, int keep, bool selective) {
    const joint *m = (const joint *)mm;
    const int64_t unet = dc_model_activation_bytes(m->unet, compute, max_batch, keep, selective);
    const int64_t text = dc_clip_text_train_bytes(&m->text->cfg, compute, max_batch);
    return unet < 0 || text < 0 ? -1 : unet + text + text_bytes(&m->text->cfg, max_batch);
}

static int jt_set_size(dc_model *mm, int height, int width) {
    joint *m = (joint *)mm;
    DC_TRY(dc_model_set_size(m->unet, height, width));
    m->base.info.height = height, m->base.info.width = width;
    return 0;
}

static void jt_release(dc_model *mm) {
    joint *m = (joint *)mm;
    free_bufs(m);
    dc_model_free(m->unet), m->unet = NULL;
    dc_clip_text_free(m->text), m->text = NULL;
    dc_params_free(&m->set);
}

static const dc_model_ops k_joint = {
    .name = "UNet2DConditionModel", .reserve = jt_reserve, .forward = jt_forward, .backward = jt_backward,
    .config_to_kv = jt_config_kv, .init_weights = jt_init, .macs_per_image = jt_macs, .describe = jt_describe,
    .set_recompute = jt_set_recompute, .set_selective = jt_set_selective, .activation_bytes = jt_activation_bytes,
    .set_size = jt_set_size, .release = jt_release,
};

// grad: how the set trains (DC_GRAD_NONE: frozen as loaded, trained through).
static int joint_new(const dc_unet_config *uc, const dc_clip_text_config *tc, dc_backend *be, dc_grad_mode grad,
                     dc_dtype loaded, int latent_h, int latent_w, dc_model **out) {
    *out = NULL;
    DC_TRY(dc_clip_text_config_validate(tc));
    if (tc->width != uc->ctx_dim)
        return dc_fail("the text encoder is %d wide but the UNet's cross-attention reads %d", tc->width, uc->ctx_dim);
    joint *m = calloc(1, sizeof *m);
    if (!m) return dc_fail("out of memory");
    // the UNet's parameters first, under their own names; the encoder's after
    int rc = dc_unet_new_train_in(uc, be, latent_h, latent_w, &m->set, &m->unet);
    m->set.prefix = DC_UNET_TEXT_PREFIX;
    if (!rc) rc = dc_clip_text_create_in(&m->text, tc, be, &m->set);
    m->set.prefix = NULL;
    if (!rc && be) rc = grad ? dc_params_alloc(&m->set, be, grad) : dc_params_alloc_frozen(&m->set, be, loaded);
    m->base = (dc_model){.ops = &k_joint, .be = be, .params = &m->set, .owned = true};
    if (rc) {
        jt_release(&m->base);
        free(m);
        return -1;
    }
    m->base.info = m->unet->info;
    m->base.info.cond = DC_COND_TOKENS;
    m->base.info.ctx_len = tc->positions, m->base.info.ctx_dim = 0;
    m->base.info.backward_repeats = false;  // (the text encoder's backward is not checked for it)
    *out = &m->base;
    return 0;
}

int dc_unet_text_new_train(const dc_unet_config *uc, const dc_clip_text_config *tc, dc_backend *be,
                           dc_grad_mode grad, int latent_h, int latent_w, dc_model **out) {
    if (grad == DC_GRAD_NONE) return dc_fail("a UNet and text encoder made to train take gradients");
    return joint_new(uc, tc, be, grad, DC_F32, latent_h, latent_w, out);
}

int dc_unet_text_new_frozen_train(const dc_unet_config *uc, const dc_clip_text_config *tc, dc_backend *be,
                                  dc_dtype loaded, int latent_h, int latent_w, dc_model **out) {
    return joint_new(uc, tc, be, DC_GRAD_NONE, loaded, latent_h, latent_w, out);
}

int dc_unet_text_config_of(const char *const *keys, const char *const *values, int n, const char *what,
                           dc_clip_text_config *tc) {
    const size_t k = strlen(DC_UNET_TEXT_KV);
    bool any = false;
    for (int i = 0; i < n && !any; i++) any = !strncmp(keys[i], DC_UNET_TEXT_KV, k);
    if (!any) return 1;
    return dc_clip_text_config_from_kv(tc, DC_UNET_TEXT_KV, keys, values, n, what);
}

dc_model *dc_unet_text_unet(dc_model *m) { return m && m->ops == &k_joint ? ((joint *)m)->unet : NULL; }

dc_clip_text *dc_unet_text_encoder(dc_model *m) { return m && m->ops == &k_joint ? ((joint *)m)->text : NULL; }
