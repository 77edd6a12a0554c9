// `diffusion train` on several ranks: started by a launcher (torchrun,
// mpirun, srun) or by train itself (--gpus N, --ranks N); the rendezvous,
// the communicator, and the small agreements the training loop makes every
// step so that every rank stops at the same step for the same reason.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "dist/comm_net.h"
#include "dist/launch.h"
#include "dist/rendezvous.h"
#include "models/model.h"
#include "train/trainer.h"

typedef struct {
    dc_launch launch;   // who this process is (rank 0 of 1 without a launcher)
    dc_rendezvous *rv;  // the job's connections, NULL with one rank
    dc_comm *comm;      // the trainer's communicator, NULL with one rank
    bool nccl;          // comm is NCCL's (device buffers), else the socket one
} train_ranks;

// --ranks, --gpus, --zero and --comm-timeout as given (before anything
// starts): 0, or -1 with what is wrong.
int train_ranks_check_flags(int ranks, int gpus, int zero, double comm_timeout, const char *device);
// --grad-comm fp32 or bf16 into *out (DC_F32, DC_BF16): 0, or -1 with what is wrong.
int train_ranks_grad_comm(const char *name, dc_dtype *out);
// Reads the launcher's variables and checks --ranks / --gpus against them.
// *spawn: this process is to start `*spawn` local ranks (and not train).
int train_ranks_plan(train_ranks *tr, int ranks, int gpus, const char *device, int *spawn);
// Starts n ranks of this same command line (argv without the program name,
// as the command gets it) and waits for them: the job's exit status, or -1
// with a message.
int train_ranks_spawn(int n, int argc, char **argv);
// Rank 0 of the job prints progress and owns the run folder.
static inline bool train_ranks_lead(const train_ranks *tr) { return tr->launch.rank == 0; }
// Picks this rank's GPU (LOCAL_RANK), before the backend is created.
int train_ranks_select_device(train_ranks *tr, const char *device);
// Meets the other ranks (before any slow work, so a failure anywhere reaches all).
int train_ranks_join(train_ranks *tr, double timeout_s);
// The communicator for the backend: NCCL on a GPU, sockets on the CPU.
int train_ranks_comm(train_ranks *tr, dc_backend *be);
// Every rank's stop signal, and rank 0's wish to read the statistics (its
// terminal's redraw clock), shared once a step: *stop is the first rank's
// signal (0: none) and *stop_rank that rank; *read is rank 0's wish.
int train_ranks_step(train_ranks *tr, int stop, bool read, int *stop_out, int *stop_rank, bool *read_out);
// Every rank says whether `ok`: 0 when all are; -1 naming a rank that is not.
int train_ranks_agree(train_ranks *tr, bool ok, const char *what);
// This rank is failing with dc_error(): the others stop too, with its message.
// Every rank has the same `value` of `what` (the step resumed from, say).
int train_ranks_same(train_ranks *tr, int64_t value, const char *what);
// Every rank trains the same model with the same settings on the same data:
// a hash of the model's and the training's settings (with --grad-comm,
// which checkpoints do not record: one rank summing in bf16 beside one in
// fp32 would send buffers of another size) and the data set's fingerprint,
// compared across ranks (a rank started with another --lr or another data
// file would otherwise train its own variant silently).
int train_ranks_same_settings(train_ranks *tr, const dc_model *m, const dc_train_config *tc, uint64_t data);
// Each of v[0..n-1] (n <= 8) replaced by its largest value over the ranks:
// benchmarks quote the slowest rank's time and the largest rank's memory.
int train_ranks_max(train_ranks *tr, double *v, int n);
// After a failure: the other ranks stop too, with this rank's message, which
// then names the rank ("rank 1 of 2: ..."). Nothing to do with one rank.
void train_ranks_abort(train_ranks *tr);
void train_ranks_end(train_ranks *tr);
