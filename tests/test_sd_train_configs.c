// The UNet configs the training benchmarks use (tools/configs/, diffusers'
// unet/config.json of SD 1.5 and 2.1) build the published models: their
// parameter counts are diffusers' (sum of numel over
// UNet2DConditionModel.from_pretrained(...).parameters(): 859,520,964 for
// runwayml/stable-diffusion-v1-5, 865,910,724 for
// stabilityai/stable-diffusion-2-1), and the settings that tell the two
// apart (text width, head sizes, linear projections, upcast attention) are
// read. Layouts only: nothing is allocated.
#include <string.h>

#include "core/error.h"
#include "models/registry.h"
#include "models/unet.h"

#include "check.h"

typedef struct {
    const char *file;
    int64_t params;
    int ctx_dim;
    bool linear_proj, upcast;
} want;

// The multiply-adds of one image's forward pass at size px (0 on failure).
static double check_config(const want *w, int size) {
    double macs = 0;
    dc_kv base = {0}, over = {0}, cfg = {0};
    dc_model *m = NULL;
    int rc = dc_model_config_of_json(w->file, &base);
    if (!rc) rc = dc_kv_set(&over, "sample_size", "%d", size / 8);
    if (!rc) rc = dc_model_configure(&base, &over, NULL, &cfg);
    if (!rc) rc = dc_model_create(&cfg, NULL, true, &m);
    CHECK(rc == 0, "%s: %s", w->file, dc_error());
    if (!rc) {
        const dc_unet *u = dc_unet_of(m);
        CHECK(m->params->numel == w->params, "%s: %lld parameters, diffusers has %lld", w->file,
              (long long)m->params->numel, (long long)w->params);
        CHECK(m->info.ctx_dim == w->ctx_dim && m->info.ctx_len == 77, "%s: text %dx%d", w->file, m->info.ctx_len,
              m->info.ctx_dim);
        CHECK(m->info.height == size / 8 && m->info.width == size / 8 && m->info.channels == 4,
              "%s at %d px: latents %dx%dx%d", w->file, size, m->info.channels, m->info.height, m->info.width);
        CHECK(u && u->cfg.linear_proj == w->linear_proj && u->cfg.upcast_attention == w->upcast,
              "%s: linear projection and upcast attention not as in the file", w->file);
        macs = dc_model_macs_per_image(m);
    }
    dc_model_free(m);
    dc_kv_free(&base), dc_kv_free(&over), dc_kv_free(&cfg);
    return macs;
}

int main(void) {
    const want sd15 = {"tools/configs/sd15_unet.json", 859520964, 768, false, false};
    const want sd21 = {"tools/configs/sd21_unet.json", 865910724, 1024, true, true};
    const double m15 = check_config(&sd15, 512), m256 = check_config(&sd21, 256), m512 = check_config(&sd21, 512);
    // A forward's work grows with the latent area (convolutions, projections)
    // and faster (self-attention over h x w tokens): from 256 to 512 px at
    // least 4x, and under 16x (attention is not most of it). SD 1.5's 8
    // heads of 40..160 and 2.1's heads of 64 do the same products but for
    // the text's width (768 against 1024) and the projections' kind: within 5%.
    CHECK(m512 > 4 * m256 && m512 < 16 * m256, "SD 2.1 multiply-adds: %.4g at 256 px, %.4g at 512", m256, m512);
    CHECK(m15 > 0.95 * m512 && m15 < 1.05 * m512, "multiply-adds at 512 px: SD 1.5 %.4g, SD 2.1 %.4g", m15, m512);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
