// Several ranks for `diffusion train`.
#include "cli/train_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"
#include "io/kv.h"

int train_ranks_plan(train_ranks *tr, int ranks, int gpus, const char *device, int *spawn) {
    memset(tr, 0, sizeof *tr);
    *spawn = 0;
    if (ranks < 0 || gpus < 0) return dc_fail("--%s must be 1 or more", ranks < 0 ? "ranks" : "gpus");
    if (ranks && gpus) return dc_fail("--ranks and --gpus both start ranks: give one");
    if (gpus && strcmp(device, "cpu") == 0)
        return dc_fail("--gpus runs one rank per GPU; with --device cpu use --ranks N");
    DC_TRY(dc_launch_from_env(&tr->launch));
    const int asked = gpus ? gpus : ranks;
    const dc_launch *l = &tr->launch;
    if (l->size > 1) {  // one rank of a launched job
        if (asked > 0 && asked != l->size)
            return dc_fail("--%s %d, but %s started %d ranks", gpus ? "gpus" : "ranks", asked, l->launcher, l->size);
        return 0;
    }
    if (asked <= 1) return 0;
    if (gpus) {
#ifdef DC_HAVE_CUDA
        int n = dc_comm_nccl_gpu_count();
        if (n < 0) return dc_fail_ctx("--gpus %d", gpus);
        if (n < gpus)
            return dc_fail("--gpus %d, but this machine has %d GPU%s (--ranks N runs N ranks on the CPU)", gpus, n,
                           n == 1 ? "" : "s");
#else
        return dc_fail("--gpus %d: this build has no CUDA backend, so no GPU (rebuild with nvcc present; "
                       "--ranks N --device cpu runs N ranks on the CPU)", gpus);
#endif
    }
    *spawn = asked;
    return 0;
}

int train_ranks_select_device(train_ranks *tr, const char *device) {
    if (tr->launch.size < 2 || strcmp(device, "cpu") == 0) return 0;
#ifdef DC_HAVE_CUDA
    if (dc_comm_nccl_gpu_count() > 0) return dc_comm_nccl_select_device(tr->launch.local_rank);
    dc_error_clear();  // no GPU: "auto" means the CPU, "cuda" fails creating the backend
#endif
    return 0;
}

int train_ranks_join(train_ranks *tr, double timeout_s) {
    if (tr->launch.size < 2) return 0;
    return dc_rendezvous_open(&tr->rv, &tr->launch, timeout_s);
}

int train_ranks_comm(train_ranks *tr, dc_backend *be) {
    if (!tr->rv) return 0;
    if (strcmp(be->name, "cpu") == 0) return dc_comm_socket_create(tr->rv, &tr->comm);
#ifdef DC_HAVE_CUDA
    if (!be->stream) return dc_fail("the %s backend does not expose its stream for NCCL", be->name);
    tr->nccl = true;
    return dc_comm_nccl_create(tr->rv, be->stream(be), &tr->comm);
#else
    return dc_fail("%d ranks on the %s backend need NCCL, which this build lacks", tr->launch.size, be->name);
#endif
}

int train_ranks_step(train_ranks *tr, int stop, bool read, int *stop_out, int *stop_rank, bool *read_out) {
    *stop_out = stop, *stop_rank = tr->launch.rank, *read_out = read;
    if (!tr->rv) return 0;
    const int n = tr->launch.size;
    int32_t mine[2] = {stop, read}, *all = malloc(sizeof(int32_t) * 2 * (size_t)n);
    if (!all) return dc_fail("out of memory");
    int rc = dc_rendezvous_all_gather(tr->rv, mine, all, sizeof mine);
    if (!rc) {
        *stop_out = 0, *read_out = all[1];
        for (int q = 0; q < n && !*stop_out; q++)
            if (all[2 * q]) *stop_out = all[2 * q], *stop_rank = q;
    }
    free(all);
    return rc;
}

int train_ranks_agree(train_ranks *tr, bool ok, const char *what) {
    if (!tr->rv) return ok ? 0 : -1;
    const int n = tr->launch.size;
    int32_t mine = ok, *all = malloc(sizeof(int32_t) * (size_t)n);
    if (!all) return dc_fail("out of memory");
    int rc = dc_rendezvous_all_gather(tr->rv, &mine, all, sizeof mine);
    for (int q = 0; q < n && !rc; q++)
        if (!all[q]) rc = q == tr->launch.rank ? -1 : dc_fail("rank %d of %d could not %s", q, n, what);
    free(all);
    return rc;
}

int train_ranks_max(train_ranks *tr, double *v, int n) {
    if (!tr->rv) return 0;
    if (n < 1 || n > 8) return dc_fail("train_ranks_max: %d values", n);
    const int size = tr->launch.size;
    double mine[8], *all = malloc(sizeof mine * (size_t)size);
    if (!all) return dc_fail("out of memory");
    memset(mine, 0, sizeof mine), memcpy(mine, v, sizeof(double) * (size_t)n);
    int rc = dc_rendezvous_all_gather(tr->rv, mine, all, sizeof mine);
    for (int q = 0; q < size && !rc; q++)
        for (int i = 0; i < n; i++)
            if (all[8 * q + i] > v[i]) v[i] = all[8 * q + i];
    free(all);
    return rc;
}

// Every rank's value gathered; *q the first rank whose value differs from
// rank 0's (0: none), *theirs its value and *first rank 0's.
static int first_differing(train_ranks *tr, int64_t value, int *q, int64_t *theirs, int64_t *first) {
    const int n = tr->launch.size;
    int64_t *all = malloc(sizeof(int64_t) * (size_t)n);
    if (!all) return dc_fail("out of memory");
    int rc = dc_rendezvous_all_gather(tr->rv, &value, all, sizeof value);
    *q = 0;
    for (int r = 1; r < n && !rc && !*q; r++)
        if (all[r] != all[0]) *q = r, *theirs = all[r], *first = all[0];
    free(all);
    return rc;
}

int train_ranks_same(train_ranks *tr, int64_t value, const char *what) {
    if (!tr->rv) return 0;
    int q = 0;
    int64_t theirs = 0, first = 0;
    DC_TRY(first_differing(tr, value, &q, &theirs, &first));
    return q ? dc_fail("rank %d is at %s %lld but rank 0 at %lld: the ranks do not see the same files", q, what,
                       (long long)theirs, (long long)first)
             : 0;
}

// The settings as text (the checkpoint's metadata) hashed, with the data.
static int settings_hash(const dc_model *m, const dc_train_config *tc, uint64_t data, uint64_t *out) {
    dc_kv kv = {0};
    int rc = dc_model_config_to_kv(m, &kv);
    if (!rc) rc = dc_train_config_to_kv(tc, &kv);
    dc_xxh64_state h;
    dc_xxh64_init(&h, 0);
    for (int i = 0; !rc && i < kv.n; i++) {
        dc_xxh64_update(&h, kv.keys[i], strlen(kv.keys[i]) + 1);
        dc_xxh64_update(&h, kv.values[i], strlen(kv.values[i]) + 1);
    }
    dc_xxh64_update_u64(&h, (uint64_t)tc->grad_comm);
    dc_xxh64_update_u64(&h, data);
    dc_kv_free(&kv);
    *out = dc_xxh64_digest(&h);
    return rc;
}

int train_ranks_same_settings(train_ranks *tr, const dc_model *m, const dc_train_config *tc, uint64_t data) {
    if (!tr->rv) return 0;
    uint64_t mine = 0;
    int q = 0;
    int64_t theirs = 0, first = 0;
    DC_TRY(settings_hash(m, tc, data, &mine));
    DC_TRY(first_differing(tr, (int64_t)mine, &q, &theirs, &first));
    return q ? dc_fail("rank %d trains other settings than rank 0 (the model, a training flag or the data set "
                       "differs): start every rank with the same command and files", q)
             : 0;
}

void train_ranks_abort(train_ranks *tr) {
    if (!tr->rv) return;
    if (tr->comm) dc_comm_abort(tr->comm, dc_error());  // NCCL's also stops its collectives
    else dc_rendezvous_abort(tr->rv, dc_error());
    dc_fail_ctx("rank %d of %d", tr->launch.rank, tr->launch.size);
}

void train_ranks_end(train_ranks *tr) {
    if (tr->comm) {
#ifdef DC_HAVE_CUDA
        if (tr->nccl) dc_comm_nccl_free(tr->comm);
        else
#endif
            dc_comm_socket_free(tr->comm);
    }
    dc_rendezvous_close(tr->rv);
    memset(tr, 0, sizeof *tr);
}

int train_ranks_check_flags(int ranks, int gpus, int zero, double comm_timeout, const char *device) {
    if (zero < 0 || zero > 2) return dc_fail("--zero %d: the stages are 0, 1 and 2", zero);
    if (!(comm_timeout >= 1)) return dc_fail("--comm-timeout must be at least 1 second");
    if (ranks < 0 || gpus < 0) return dc_fail("--%s must be 1 or more", ranks < 0 ? "ranks" : "gpus");
    if (ranks && gpus) return dc_fail("--ranks and --gpus both start ranks: give one");
    if (gpus && !strcmp(device, "cpu")) return dc_fail("--gpus runs one rank per GPU; with --device cpu use --ranks N");
    return 0;
}

int train_ranks_grad_comm(const char *name, dc_dtype *out) {
    if (!strcmp(name, "fp32")) *out = DC_F32;
    else if (!strcmp(name, "bf16")) *out = DC_BF16;
    else return dc_fail("--grad-comm must be fp32 or bf16 (got '%s')", name);
    return 0;
}

int train_ranks_spawn(int n, int argc, char **argv) {
    char **args = malloc(sizeof *args * (size_t)(argc + 1));
    if (!args) return dc_fail("out of memory");
    args[0] = "diffusion";
    memcpy(args + 1, argv, sizeof *args * (size_t)argc);
    int rc = dc_launch_spawn(n, argc + 1, args, 10);
    free(args);
    return rc;
}
