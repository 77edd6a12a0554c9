// Who this process is in a job of several processes (one per GPU), from the
// variables a launcher sets, and starting N such processes on this host.
//
// torchrun:  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// Open MPI:  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
// Slurm:     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID (and
//            SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE for the local size)
// mpirun and srun do not name a meeting point: MASTER_ADDR (a host name or
// address of the node of rank 0) and MASTER_PORT come from the environment
// (a batch script sets them), as torchrun's do. When every rank is on one
// host MASTER_ADDR defaults to 127.0.0.1; MASTER_PORT defaults to 29500,
// torchrun's.
#pragma once
#include <stdbool.h>

typedef struct {
    int rank, size;              // this process's rank in 0..size-1
    int local_rank, local_size;  // on this host (local_rank picks the GPU)
    int node;                    // this host's index (-1: unknown)
    char master_addr[256];
    int master_port;
    const char *launcher;  // "torchrun", "mpirun", "srun" or "none"
} dc_launch;

#define DC_LAUNCH_DEFAULT_PORT 29500

// Reads the launcher's variables. With none set, a single process: rank 0 of
// 1. A malformed or inconsistent variable (a rank outside the world size, a
// port that is not a number) fails naming the variable.
int dc_launch_from_env(dc_launch *l);

// Starts `n` processes of this same program (/proc/self/exe) with the
// arguments argv[0..argc-1] (argv[0] the program's name), each with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT in its
// environment, and waits for them. SIGINT, SIGTERM and SIGHUP to this process
// are passed on to every rank. When a rank ends abnormally (killed by a
// signal, or an exit status other than 0 or 128 + SIGINT/SIGTERM/SIGHUP/
// SIGPIPE, which mean "stopped on request after a checkpoint") the others get
// SIGTERM at once and SIGKILL `grace_s` seconds later.
// Returns the job's exit status: 0 when every rank finished, the ranks'
// common 128 + N when they stopped on a signal, else -1 with a message
// naming the rank that failed first and how (its exit status or signal).
int dc_launch_spawn(int n, int argc, char **argv, double grace_s);
