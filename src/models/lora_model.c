#include "models/lora_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

typedef struct {
    dc_model base;  // params: &lora.params
    dc_model *inner;
    dc_lora lora;
    dc_kv extra;    // the caller's config entries
} lora_model;

static const dc_model_ops lora_model_ops;

static lora_model *of(dc_model *m) { return m && m->ops == &lora_model_ops ? (lora_model *)m : NULL; }

static int lm_reserve(dc_model *m, int max_batch) { return dc_model_reserve(of(m)->inner, max_batch); }

static int lm_forward(dc_model *m, dc_buf out, dc_buf x, dc_buf t, const dc_cond *cond, int B) {
    return dc_model_forward(of(m)->inner, out, x, t, cond, B);
}

// The factors are one unit, finished when the frozen model's backward is.
static int lm_backward(dc_model *m, dc_buf dout, int B) {
    lora_model *l = of(m);
    DC_TRY(dc_params_unit_begin(m->params, 0));
    DC_TRY(dc_model_backward(l->inner, dout, B));
    return dc_params_unit_done(m->params, 0);
}

static int lm_config_to_kv(const dc_model *m, dc_kv *kv) {
    const lora_model *l = (const lora_model *)m;
    DC_TRY(dc_model_config_to_kv(l->inner, kv));
    const dc_lora_item *it = l->lora.count ? &l->lora.items[0] : NULL;
    if (it && (dc_kv_set(kv, "lora_rank", "%d", it->rank) || dc_kv_set(kv, "lora_alpha", "%.9g", (double)it->alpha)))
        return -1;
    for (int i = 0; i < l->extra.n; i++) DC_TRY(dc_kv_set(kv, l->extra.keys[i], "%s", l->extra.values[i]));
    return 0;
}

static int lm_init(dc_model *m, uint64_t seed) {
    lora_model *l = of(m);
    dc_params *ps = &l->lora.params;
    for (int k = 0; k < l->lora.count; k++) {
        const dc_lora_item *it = &l->lora.items[k];
        const dc_param *p = &ps->items[it->down];
        const int64_t n = p->numel;
        const float bound = 1.0f / sqrtf((float)(n / p->shape[0]));  // fan_in: all but the output dim
        float *h = malloc((size_t)n * sizeof *h);
        if (!h) return dc_fail("out of memory initialising %s", p->name);
        for (int64_t j = 0; j < n; j++)
            h[j] = bound * (2 * dc_u32_to_unit(dc_rand_u32_at(seed, (uint32_t)k, 0, DC_STREAM_INIT, (uint32_t)j)) - 1);
        const int rc = dc_param_to_stored(p, h);  // drawn in PyTorch's order, whatever the layout
        if (!rc) m->be->upload(m->be, dc_param_data(ps, it->down).p, h, (size_t)n * 4);
        free(h);
        if (rc) return -1;
        const dc_param *u = &ps->items[it->up];
        m->be->zero(m->be, dc_param_data(ps, it->up).p, (size_t)u->numel * 4);
    }
    dc_params_touch(ps);
    return dc_backend_status(m->be);
}

static double lm_macs(const dc_model *m) { return dc_model_macs_per_image(((const lora_model *)m)->inner); }

static void lm_describe(const dc_model *m, char *buf, size_t n) {
    const lora_model *l = (const lora_model *)m;
    dc_model_describe(l->inner, buf, n);
    const size_t k = strlen(buf);
    const dc_lora_item *it = l->lora.count ? &l->lora.items[0] : NULL;
    if (it && k < n)
        snprintf(buf + k, n - k, "\nLoRA of rank %d, alpha %g over %d layers: %.2fM parameters train, the base is frozen",
                 it->rank, (double)it->alpha, l->lora.count, (double)l->lora.params.numel / 1e6);
}

static int lm_set_recompute(dc_model *m, int keep) { return dc_model_set_recompute(of(m)->inner, keep); }

// The frozen model's, and the deltas' scratch (nn/adapter.c), bounded by the
// rows of a whole picture: four [rows, rank] fp32 blocks for a linear
// delta, and a convolution's [rows, co] output besides.
static int lm_set_selective(dc_model *m, bool on) { return dc_model_set_selective(of(m)->inner, on); }

static int64_t lm_activation_bytes(const dc_model *m, dc_dtype compute, int max_batch, int keep, bool selective) {
    const lora_model *l = (const lora_model *)m;
    const int64_t inner = dc_model_activation_bytes(l->inner, compute, max_batch, keep, selective);
    int64_t rank = 0, co = 0;
    for (int i = 0; i < l->lora.count; i++) {
        const dc_lora_item *it = &l->lora.items[i];
        rank = it->rank > rank ? it->rank : rank;
        if (it->conv) co = l->lora.target->items[it->param].shape[0] > co ? l->lora.target->items[it->param].shape[0] : co;
    }
    const dc_model_info *mi = &m->info;
    const int64_t rows = (int64_t)max_batch * mi->frames * mi->height * mi->width;
    return inner < 0 ? -1 : inner + 4 * rows * (4 * rank + co) + 4 * 256;
}

// The frozen model's weights, in the compute dtype a GPU keeps them in
// (the CPU keeps F16 and BF16 files as loaded: fewer bytes).
static int64_t lm_frozen_bytes(const dc_model *m, dc_dtype compute) {
    const dc_params *ps = ((const lora_model *)m)->inner->params;
    int64_t n = 0;
    for (int i = 0; i < ps->count; i++) n += ps->items[i].numel;
    return n * (int64_t)dc_dtype_size(compute);
}

static int lm_set_size(dc_model *m, int height, int width) {
    lora_model *l = of(m);
    DC_TRY(dc_model_set_size(l->inner, height, width));
    m->info = l->inner->info;
    m->info.backward_repeats = false;  // (the adapters' scratch is not checked for it)
    return 0;
}

static void lm_release(dc_model *m) {
    lora_model *l = of(m);
    dc_lora_free(&l->lora);
    dc_model_free(l->inner);
    dc_kv_free(&l->extra);
    l->inner = NULL;
}

static const dc_model_ops lora_model_ops = {
    .name = "lora", .reserve = lm_reserve, .forward = lm_forward, .backward = lm_backward,
    .config_to_kv = lm_config_to_kv, .init_weights = lm_init, .macs_per_image = lm_macs,
    .describe = lm_describe, .set_recompute = lm_set_recompute, .set_selective = lm_set_selective,
    .activation_bytes = lm_activation_bytes,
    .frozen_bytes = lm_frozen_bytes, .set_size = lm_set_size, .release = lm_release,
};

int dc_lora_model_new(dc_model *inner, dc_lora *lora, const dc_kv *extra, dc_model **out) {
    *out = NULL;
    lora_model *l = calloc(1, sizeof *l);
    if (!l) return dc_lora_free(lora), dc_model_free(inner), dc_fail("out of memory");
    l->inner = inner, l->lora = *lora;
    memset(lora, 0, sizeof *lora);  // taken over
    l->base = (dc_model){.ops = &lora_model_ops, .info = inner->info, .be = inner->be, .params = &l->lora.params,
                         .owned = true};
    l->base.info.backward_repeats = false;  // (the adapters' scratch is not checked for it)
    int rc = l->lora.target == inner->params ? 0 : dc_fail("LoRA: its target is not the model's parameters");
    if (!rc && !l->lora.count) rc = dc_fail("LoRA: no layer to adapt");
    for (int i = 0; !rc && extra && i < extra->n; i++) rc = dc_kv_set(&l->extra, extra->keys[i], "%s", extra->values[i]);
    if (!rc && inner->be) rc = dc_lora_alloc(&l->lora, inner->be, true);  // else a layout
    if (rc) {
        lm_release(&l->base);
        free(l);
        return -1;
    }
    if (inner->be) dc_lora_attach(&l->lora);
    *out = &l->base;
    return 0;
}

dc_lora *dc_lora_model_lora(dc_model *m) {
    lora_model *l = of(m);
    return l ? &l->lora : NULL;
}

dc_model *dc_lora_model_inner(dc_model *m) {
    lora_model *l = of(m);
    return l ? l->inner : NULL;
}
