#include "nn/adapter.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const dc_lora_item *find(const dc_lora *l, int param) {
    for (int i = 0; i < l->count; i++)
        if (l->items[i].param == param) return &l->items[i];
    return NULL;
}

static float scale_of(const dc_lora *l, const dc_lora_item *it) { return it->alpha / (float)it->rank * l->multiplier; }

// ---- run time ---------------------------------------------------------------------------

// The scratch's regions, each starting on a 256-byte boundary as the
// backend's own buffers do. A linear delta needs four [rows, r] ones: h =
// x down^T, hs = s h, dh = dy up and dhs = s dh (the up product adds into y
// in its epilogue, so nothing as wide as the layer's output is needed). A
// convolution's needs h, dh [rows, r] and t [rows, co] (up's output, or s dy).
static int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }
static int64_t linear_need(int64_t rows, int r) { return 4 * aligned(rows * r * 4); }
static int64_t conv_need(int64_t rows, int r, int64_t out) { return 2 * aligned(rows * r * 4) + aligned(rows * out * 4); }

static char *region(const dc_lora *l, int64_t need, int i, int64_t each) {
    assert(need <= l->scratch_bytes && "the LoRA's scratch was not reserved for this many rows");
    (void)need;
    return (char *)l->scratch.p + i * each;
}
// The factors as the products read them: their compute copy, brought up to
// date if their master was written since (a no-op otherwise).
static const dc_params *factors(dc_lora *l) {
    dc_params_refresh(&l->params);
    return &l->params;
}

static bool lora_has(const dc_adapter *a, int param) {
    const dc_lora *l = (const dc_lora *)a;
    return !l->merged && find(l, param);
}

// ds = s dy (zeroed, then added: the backend has no scaling op).
static void scaled(dc_backend *be, dc_buf ds, dc_buf dy, float s, int64_t n) {
    be->zero(be, ds.p, (size_t)n * dc_dtype_size(ds.dt));
    be->axpy(be, ds, dy, s, n);
}

// y += (s x down^T) up^T.
static void lora_linear_fwd(dc_adapter *a, dc_backend *be, int param, dc_buf y, dc_buf x, int M, int in, int out) {
    dc_lora *l = (dc_lora *)a;
    const dc_lora_item *it = find(l, param);
    const dc_params *lp = factors(l);
    const int64_t n = (int64_t)M * it->rank, each = aligned(n * 4);
    const dc_buf h = {region(l, linear_need(M, it->rank), 0, each), x.dt}, hs = {region(l, 0, 1, each), x.dt};
    be->linear_fwd(be, h, x, dc_param_w(lp, it->down), dc_buf_none(), M, in, it->rank);
    scaled(be, hs, h, scale_of(l, it), n);
    be->linear_fwd_acc(be, y, hs, dc_param_w(lp, it->up), dc_buf_none(), M, it->rank, out);
}

static void lora_linear_bwd(dc_adapter *a, dc_backend *be, int param, dc_buf dx, dc_buf dy, dc_buf x, int M, int in,
                            int out) {
    dc_lora *l = (dc_lora *)a;
    const dc_lora_item *it = find(l, param);
    const dc_params *lp = factors(l);
    const int64_t n = (int64_t)M * it->rank, each = aligned(n * 4);
    const float sc = scale_of(l, it);
    const dc_buf h = {region(l, linear_need(M, it->rank), 0, each), x.dt}, hs = {region(l, 0, 1, each), x.dt};
    const dc_buf dh = {region(l, 0, 2, each), dy.dt}, dhs = {region(l, 0, 3, each), dy.dt};
    // hs is recomputed rather than kept from forward: r columns, cheap.
    be->linear_fwd(be, h, x, dc_param_w(lp, it->down), dc_buf_none(), M, in, it->rank);
    scaled(be, hs, h, sc, n);
    // dh = dy up; dup += dy^T hs; then dx += (s dh) down; ddown += (s dh)^T x
    be->linear_bwd(be, dh, dc_param_train_grad(lp, it->up), dc_buf_none(), dy, hs, dc_param_w(lp, it->up), M,
                   it->rank, out, false);
    scaled(be, dhs, dh, sc, n);
    be->linear_bwd(be, dx, dc_param_train_grad(lp, it->down), dc_buf_none(), dhs, x, dc_param_w(lp, it->down), M,
                   in, it->rank, true);
}

// A convolution's regions for rows x (r, co) products: h [rows, r] in x's
// dtype, t [rows, co] (up's output, or s dy) and dh [rows, r] in dy's.
typedef struct {
    dc_buf h, t, dh;
} conv_regions;

static conv_regions conv_carve(dc_lora *l, int64_t rows, int r, int co, dc_dtype xdt, dc_dtype ydt) {
    const int64_t hb = aligned(rows * r * 4), tb = aligned(rows * co * 4);
    char *p = region(l, conv_need(rows, r, co), 0, 0);
    conv_regions g = {{p, xdt}, {p + hb, ydt}, {p + hb + tb, ydt}};
    return g;
}

// The down and up convolutions of item it for the layer's shape s.
static void conv_shapes(const dc_lora_item *it, const dc_conv2d_shape *s, dc_conv2d_shape *down,
                        dc_conv2d_shape *up) {
    *down = *s;
    down->Co = it->rank;
    *up = (dc_conv2d_shape){s->B, it->rank, dc_conv2d_ho(s), dc_conv2d_wo(s), s->Co, 1, 1, 0, 0, 0, 0, s->nhwc};
}

static void lora_conv_fwd(dc_adapter *a, dc_backend *be, int param, dc_buf y, dc_buf x, const dc_conv2d_shape *s) {
    dc_lora *l = (dc_lora *)a;
    const dc_lora_item *it = find(l, param);
    dc_conv2d_shape sd, su;
    conv_shapes(it, s, &sd, &su);
    const int64_t rows = (int64_t)s->B * su.H * su.W;
    const dc_params *lp = factors(l);
    const conv_regions g = conv_carve(l, rows, it->rank, s->Co, x.dt, y.dt);
    be->conv2d_fwd(be, g.h, x, dc_param_w(lp, it->down), dc_buf_none(), &sd);
    be->conv2d_fwd(be, g.t, g.h, dc_param_w(lp, it->up), dc_buf_none(), &su);
    be->axpy(be, y, g.t, scale_of(l, it), rows * s->Co);
}

static void lora_conv_bwd(dc_adapter *a, dc_backend *be, int param, dc_buf dx, dc_buf dy, dc_buf x,
                          const dc_conv2d_shape *s) {
    dc_lora *l = (dc_lora *)a;
    const dc_lora_item *it = find(l, param);
    const dc_params *lp = factors(l);
    dc_conv2d_shape sd, su;
    conv_shapes(it, s, &sd, &su);
    const int64_t rows = (int64_t)s->B * su.H * su.W;
    const conv_regions g = conv_carve(l, rows, it->rank, s->Co, x.dt, dy.dt);
    be->conv2d_fwd(be, g.h, x, dc_param_w(lp, it->down), dc_buf_none(), &sd);
    scaled(be, g.t, dy, scale_of(l, it), rows * s->Co);
    be->conv2d_bwd(be, g.dh, dc_param_train_grad(lp, it->up), dc_buf_none(), g.t, g.h, dc_param_w(lp, it->up), &su,
                   false);
    be->conv2d_bwd(be, dx, dc_param_train_grad(lp, it->down), dc_buf_none(), g.dh, x, dc_param_w(lp, it->down), &sd,
                   true);
}


// ---- several at once ----------------------------------------------------------------------

#define EACH(s, param) for (int i_ = 0; i_ < (s)->n; i_++) if ((s)->list[i_]->ops->has((s)->list[i_], (param)))
#define CUR(s) ((s)->list[i_])

static bool stack_has(const dc_adapter *a, int param) {
    const dc_adapter_stack *s = (const dc_adapter_stack *)a;
    EACH(s, param) return true;
    return false;
}
static void stack_linear_fwd(dc_adapter *a, dc_backend *be, int param, dc_buf y, dc_buf x, int M, int in, int out) {
    dc_adapter_stack *s = (dc_adapter_stack *)a;
    EACH(s, param) CUR(s)->ops->linear_fwd(CUR(s), be, param, y, x, M, in, out);
}
static void stack_linear_bwd(dc_adapter *a, dc_backend *be, int param, dc_buf dx, dc_buf dy, dc_buf x, int M, int in,
                             int out) {
    dc_adapter_stack *s = (dc_adapter_stack *)a;
    EACH(s, param) CUR(s)->ops->linear_bwd(CUR(s), be, param, dx, dy, x, M, in, out);
}
static void stack_conv_fwd(dc_adapter *a, dc_backend *be, int param, dc_buf y, dc_buf x, const dc_conv2d_shape *sh) {
    dc_adapter_stack *s = (dc_adapter_stack *)a;
    EACH(s, param) CUR(s)->ops->conv_fwd(CUR(s), be, param, y, x, sh);
}
static void stack_conv_bwd(dc_adapter *a, dc_backend *be, int param, dc_buf dx, dc_buf dy, dc_buf x,
                           const dc_conv2d_shape *sh) {
    dc_adapter_stack *s = (dc_adapter_stack *)a;
    EACH(s, param) CUR(s)->ops->conv_bwd(CUR(s), be, param, dx, dy, x, sh);
}
static int stack_reserve_rows(dc_adapter *a, int64_t rows) {
    dc_adapter_stack *s = (dc_adapter_stack *)a;
    for (int i = 0; i < s->n; i++) DC_TRY(s->list[i]->ops->reserve_rows(s->list[i], rows));
    return 0;
}
static int stack_reserve_conv(dc_adapter *a, int param, const dc_conv2d_shape *sh, bool backward) {
    dc_adapter_stack *s = (dc_adapter_stack *)a;
    EACH(s, param) DC_TRY(CUR(s)->ops->reserve_conv(CUR(s), param, sh, backward));
    return 0;
}
#undef EACH
#undef CUR

static const dc_adapter_ops stack_ops = {stack_has,     stack_linear_fwd,   stack_linear_bwd,  stack_conv_fwd,
                                         stack_conv_bwd, stack_reserve_rows, stack_reserve_conv};

void dc_adapter_stack_init(dc_adapter_stack *s) {
    memset(s, 0, sizeof *s);
    s->base.ops = &stack_ops;
}

int dc_adapter_stack_add(dc_adapter_stack *s, dc_adapter *a) {
    if (s->n == DC_ADAPTERS_MAX) return dc_fail("more than %d adapters on one model", DC_ADAPTERS_MAX);
    s->list[s->n++] = a;
    return 0;
}

// ---- building --------------------------------------------------------------------------

static const dc_adapter_ops lora_ops;

void dc_lora_init(dc_lora *l, dc_params *target) {
    memset(l, 0, sizeof *l);
    l->base.ops = &lora_ops;
    l->target = target;
    l->multiplier = 1.0f;
}

int dc_lora_add(dc_lora *l, int param, const char *name, int rank, float alpha) {
    if (param < 0 || param >= l->target->count) return dc_fail("LoRA %s: no parameter %d to adapt", name, param);
    const dc_param *w = &l->target->items[param];
    if (w->ndim != 2 && w->ndim != 4)
        return dc_fail("LoRA %s: %s is neither a matrix nor a convolution kernel", name, w->name);
    if (rank < 1) return dc_fail("LoRA %s: rank %d", name, rank);
    if (find(l, param)) return dc_fail("LoRA %s: %s has a delta already", name, w->name);
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        dc_lora_item *items = realloc(l->items, (size_t)cap * sizeof *items);
        if (!items) return dc_fail("out of memory adding LoRA %s", name);
        l->items = items, l->cap = cap;
    }
    dc_lora_item it = {param, -1, -1, rank, alpha, w->ndim == 4};
    char down[DC_PARAM_NAME_MAX], up[DC_PARAM_NAME_MAX];
    if (snprintf(down, sizeof down, "%s.lora_down.weight", name) >= (int)sizeof down ||
        snprintf(up, sizeof up, "%s.lora_up.weight", name) >= (int)sizeof up)
        return dc_fail("LoRA name '%s' is too long", name);
    const int out = (int)w->shape[0], in = (int)w->shape[1];
    if (it.conv) {
        const int kh = (int)w->shape[2], kw = (int)w->shape[3];
        if ((it.down = dc_params_add(&l->params, down, true, 4, rank, in, kh, kw)) < 0) return -1;
        if ((it.up = dc_params_add(&l->params, up, true, 4, out, rank, 1, 1)) < 0) return -1;
        l->params.items[it.down].channels_last = w->channels_last;
    } else {
        if ((it.down = dc_params_add(&l->params, down, true, 2, rank, in)) < 0) return -1;
        if ((it.up = dc_params_add(&l->params, up, true, 2, out, rank)) < 0) return -1;
    }
    l->items[l->count++] = it;
    return 0;
}

int dc_lora_alloc(dc_lora *l, dc_backend *be, bool with_grad) {
    return dc_params_alloc(&l->params, be, with_grad);
}

// The scratch holds at least `need` bytes.
static int grow(dc_lora *l, int64_t need) {
    if (need <= l->scratch_bytes) return 0;
    dc_backend *be = l->params.be;
    if (!be) return dc_fail("LoRA: reserved before it was allocated");
    if (l->scratch.p) be->free(be, l->scratch.p);
    l->scratch = (dc_buf){be->alloc(be, (size_t)need), DC_F32};
    l->scratch_bytes = l->scratch.p ? need : 0;
    return l->scratch.p ? 0 : -1;
}

int dc_lora_reserve(dc_lora *l, int64_t rows) {
    int64_t widest = 0;
    for (int i = 0; i < l->count; i++) {
        const int64_t need = linear_need(rows, l->items[i].rank);  // 1 x 1 kernels may run as linear layers
        if (need > widest) widest = need;
    }
    return grow(l, widest);
}

int dc_lora_reserve_conv(dc_lora *l, int param, const dc_conv2d_shape *s, bool backward) {
    const dc_lora_item *it = find(l, param);
    if (!it || !it->conv) return dc_fail("LoRA: parameter %d has no convolution delta", param);
    dc_backend *be = l->params.be;
    dc_conv2d_shape sd, su;
    conv_shapes(it, s, &sd, &su);
    DC_TRY(be->reserve_conv(be, &sd, backward));
    DC_TRY(be->reserve_conv(be, &su, backward));
    return grow(l, conv_need((int64_t)s->B * su.H * su.W, it->rank, s->Co));
}

static int lora_reserve_rows(dc_adapter *a, int64_t rows) { return dc_lora_reserve((dc_lora *)a, rows); }
static int lora_reserve_conv(dc_adapter *a, int param, const dc_conv2d_shape *s, bool backward) {
    return dc_lora_reserve_conv((dc_lora *)a, param, s, backward);
}

static const dc_adapter_ops lora_ops = {lora_has,     lora_linear_fwd,   lora_linear_bwd,  lora_conv_fwd,
                                        lora_conv_bwd, lora_reserve_rows, lora_reserve_conv};

void dc_lora_attach(dc_lora *l) { l->target->adapter = &l->base; }

void dc_lora_detach(dc_lora *l) {
    if (l->target->adapter == &l->base) l->target->adapter = NULL;
}

// ---- merging ---------------------------------------------------------------------------

// W[out, K] += sign s up[out, r] @ down[r, K], K = in (or ci k k in the
// kernel's storage order, which down shares), on the host in fp32.
static int merge_one(dc_lora *l, const dc_lora_item *it, float sign) {
    dc_params *t = l->target;
    dc_backend *be = t->be;
    const dc_param *p = &t->items[it->param];
    const int64_t out = p->shape[0], K = p->numel / out, r = it->rank;
    float *w = malloc((size_t)(p->numel + r * K + out * r) * sizeof *w);
    if (!w) return dc_fail("out of memory merging the LoRA of %s", p->name);
    float *down = w + p->numel, *up = down + r * K;
    dc_buf wb = dc_param_data(t, it->param);
    int rc = dc_download_as_f32(be, wb, w, p->numel) ||
             dc_download_as_f32(be, dc_param_data(&l->params, it->down), down, r * K) ||
             dc_download_as_f32(be, dc_param_data(&l->params, it->up), up, out * r);
    const float s = sign * scale_of(l, it);
    for (int64_t o = 0; !rc && o < out; o++)
        for (int64_t k = 0; k < K; k++) {
            float d = 0.0f;
            for (int64_t j = 0; j < r; j++) d += up[o * r + j] * down[j * K + k];
            w[o * K + k] += s * d;
        }
    if (!rc) dc_upload_f32_as(be, wb, w, p->numel);
    free(w);
    return rc ? -1 : dc_backend_status(be);
}

static int merge_all(dc_lora *l, bool merged, float sign) {
    if (l->merged == merged) return dc_fail("LoRA: already %s", merged ? "merged" : "unmerged");
    for (int i = 0; i < l->count; i++) DC_TRY(merge_one(l, &l->items[i], sign));
    dc_params_touch(l->target);
    dc_params_refresh(l->target);
    l->merged = merged;
    return dc_backend_status(l->target->be);
}

int dc_lora_merge(dc_lora *l) { return merge_all(l, true, 1.0f); }
int dc_lora_unmerge(dc_lora *l) { return merge_all(l, false, -1.0f); }

void dc_lora_free(dc_lora *l) {
    dc_lora_detach(l);
    if (l->scratch.p) l->params.be->free(l->params.be, l->scratch.p);
    dc_params_free(&l->params);
    free(l->items);
    memset(l, 0, sizeof *l);
}
