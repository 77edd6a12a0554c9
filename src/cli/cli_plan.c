#include "cli/cli_plan.h"

#include "core/error.h"
#include "train/plan.h"
#include "train/trainer.h"

int cli_plan_budget(const char *size, int64_t *budget) {
    if (size && dc_parse_size(size, budget)) return dc_fail_ctx("--max-gpu-memory");
    return 0;
}

// The trainer shards only over a communicator, which one rank does not have.
int cli_plan_check_ranks(bool offload, bool fused, int zero, int ranks) {
    if ((offload || fused) && (zero || ranks > 1))
        return dc_fail("%s runs on one rank for now: it cannot be combined with %s",
                       offload ? "--offload" : "--update-in-backward", zero ? "--zero" : "several ranks");
    if (offload && fused)
        return dc_fail("--offload and --update-in-backward are two places for the update: choose one");
    if (zero && ranks < 2)
        return dc_fail("--zero %d shards the state over several ranks: add --gpus N or --ranks N", zero);
    return 0;
}

int cli_plan_choose(const dc_model *m, dc_backend *be, int64_t budget, int batch, int ranks, int zero,
                    dc_dtype grad_comm, bool no_ema, bool clips, int *micro_batch, int *recompute, bool *offload,
                    bool *fused, bool *selective, char *line, size_t n) {
    size_t held = 0;
    if (be->memory) be->memory(be, &held, NULL);  // the backend's own workspaces: no model exists yet
    const int blocks = m->info.blocks;
    dc_plan_request rq = {.model = m, .compute = be->compute, .fixed = (int64_t)held, .batch = batch,
                          .ranks = ranks, .zero = zero, .grad_comm = grad_comm, .no_ema = no_ema,
                          .micro_batch = *micro_batch,
                          .keep = *recompute >= 0 ? (*recompute < blocks ? *recompute : blocks) : -1,
                          .offload = *offload ? 1 : -1, .fused = !fused ? 0 : *fused ? 1 : -1,
                          .selective = !selective ? 0 : *selective ? 1 : -1, .clips = clips,
                          .folds = dc_trainer_folds(be)};
    dc_train_plan plan;
    dc_plan_mem pm;
    DC_TRY(dc_plan_choose(&rq, budget, &plan, &pm, NULL));
    dc_plan_describe(&rq, &plan, &pm, budget, line, n);
    if (be->set_memory_cap) be->set_memory_cap(be, (size_t)budget);
    *micro_batch = plan.micro_batch, *offload = plan.offload;
    if (fused) *fused = plan.fused;
    if (selective) *selective = plan.selective;
    *recompute = plan.keep < blocks ? plan.keep : -1;
    return 0;
}
