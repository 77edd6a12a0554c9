// For the optimizer strategies' tests: a trainer's state as a checkpoint
// holds it (weights, EMA, m, v, whatever strategy holds them), and the
// compute weights the next forward reads.
#pragma once
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "train/trainer.h"

// state[0..3]: weights, EMA, m, v; state[4]: the compute copy (bf16 on a
// GPU, read as floats) or the parameters' data; each malloc'd [numel].
// Returns numel.
static inline int64_t read_optim_state(const dc_trainer *tr, float *state[5]) {
    const dc_params *ps = tr->model->params;
    size_t bytes = sizeof(float) * (size_t)ps->numel;
    for (int b = 0; b < 5; b++) state[b] = malloc(bytes);
    float *all = malloc(DC_STATE_COUNT * bytes);  // offload: the host's master and moments, the device's EMA
    CHECK(dc_optimizer_save(tr->opt, all) == 0, "the state: %s", dc_error());
    for (int b = 0; b < DC_STATE_COUNT; b++) memcpy(state[b], (char *)all + b * bytes, bytes);
    free(all);
    if (ps->wc.p && ps->wc.dt == DC_BF16) {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)ps->numel);
        tr->be->download(tr->be, h, ps->wc.p, sizeof(uint16_t) * (size_t)ps->numel);
        for (int64_t i = 0; i < ps->numel; i++) state[4][i] = dc_bf16_to_f32(h[i]);
        free(h);
    } else {
        tr->be->download(tr->be, state[4], (ps->wc.p ? ps->wc : ps->data).p, bytes);
    }
    return ps->numel;
}
