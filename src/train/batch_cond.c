#include "train/batch_cond.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int dc_batch_cond_init(dc_batch_cond *c, const dc_source *ds, dc_backend *be, int rows) {
    memset(c, 0, sizeof *c);
    c->kind = ds->cond, c->rows = rows;
    const size_t seq = (size_t)ds->text_len * (size_t)ds->text_dim;  // one row's embeddings
    bool ok;
    if (c->kind == DC_COND_LABELS) {
        c->dev.y = (dc_buf){be->alloc(be, (size_t)rows * sizeof(int32_t)), DC_I32};
        c->labels = malloc((size_t)rows * sizeof *c->labels);
        ok = c->dev.y.p && c->labels;
    } else if (c->kind == DC_COND_TOKENS) {
        if (ds->text_len < 1 || !ds->ops->ids) return dc_fail("a data source of token ids without them");
        c->dev.ids = (dc_buf){be->alloc(be, (size_t)rows * ds->text_len * sizeof(int32_t)), DC_I32};
        c->dev.lens = (dc_buf){be->alloc(be, (size_t)rows * sizeof(int32_t)), DC_I32};
        c->dev.len = ds->text_len;
        c->ids = malloc((size_t)rows * ds->text_len * sizeof *c->ids);
        c->lens = malloc((size_t)rows * sizeof *c->lens);
        ok = c->dev.ids.p && c->dev.lens.p && c->ids && c->lens;
    } else {
        if (ds->text_len < 1 || ds->text_dim < 1) return dc_fail("a text data source without embeddings");
        c->dev.ctx = (dc_buf){be->alloc(be, (size_t)rows * seq * sizeof(float)), DC_F32};
        c->dev.lens = (dc_buf){be->alloc(be, (size_t)rows * sizeof(int32_t)), DC_I32};
        c->dev.len = ds->text_len, c->dev.dim = ds->text_dim;
        c->ctx = malloc((size_t)rows * seq * sizeof *c->ctx);
        c->lens = malloc((size_t)rows * sizeof *c->lens);
        ok = c->dev.ctx.p && c->dev.lens.p && c->ctx && c->lens;
    }
    if (!ok) {
        dc_batch_cond_free(c, be);
        return dc_fail("out of memory for the conditioning of %d images", rows);
    }
    return 0;
}

int dc_batch_cond_set(dc_batch_cond *c, dc_source *src, int i, int64_t idx, bool drop, int null_label) {
    if (c->kind == DC_COND_LABELS) {
        if (drop) return c->labels[i] = null_label, 0;
        return src->ops->cond(src, idx, false, c->labels + i, NULL, NULL);
    }
    if (c->kind == DC_COND_TOKENS) return src->ops->ids(src, idx, drop, c->ids + (size_t)i * c->dev.len, c->lens + i);
    const size_t seq = (size_t)c->dev.len * (size_t)c->dev.dim;
    return src->ops->cond(src, idx, drop, NULL, c->ctx + (size_t)i * seq, c->lens + i);
}

void dc_batch_cond_upload(dc_batch_cond *c, dc_backend *be, int n) {
    if (c->kind == DC_COND_LABELS) {
        be->upload(be, c->dev.y.p, c->labels, (size_t)n * sizeof *c->labels);
        return;
    }
    if (c->kind == DC_COND_TOKENS) be->upload(be, c->dev.ids.p, c->ids, (size_t)n * c->dev.len * sizeof *c->ids);
    else be->upload(be, c->dev.ctx.p, c->ctx, (size_t)n * c->dev.len * c->dev.dim * sizeof *c->ctx);
    be->upload(be, c->dev.lens.p, c->lens, (size_t)n * sizeof *c->lens);
}

void dc_batch_cond_free(dc_batch_cond *c, dc_backend *be) {
    dc_buf *bufs[] = {&c->dev.y, &c->dev.ctx, &c->dev.ids, &c->dev.lens};
    for (int i = 0; i < 4; i++)
        if (bufs[i]->p) be->free(be, bufs[i]->p);
    free(c->labels), free(c->ctx), free(c->ids), free(c->lens);
    memset(c, 0, sizeof *c);
}
