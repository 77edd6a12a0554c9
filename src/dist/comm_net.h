// Communicators for ranks that are separate processes (one per GPU, or N
// processes on the CPU), built on the job's rendezvous connections.
#pragma once
#include "dist/comm.h"
#include "dist/rendezvous.h"

// Host buffers over the TCP connections, a star through rank 0: rank 0 sums
// every rank's buffer in rank order and sends the result back, so results
// equal the thread communicator's bit for bit. For the CPU backend (and for
// tests of every multi-rank path on any machine); it is no fast network.
int dc_comm_socket_create(dc_rendezvous *rv, dc_comm **out);
void dc_comm_socket_free(dc_comm *c);

// Device buffers through NCCL (libnccl.so.2 is loaded when this is called,
// so the program starts without it), enqueued on `stream` (the CUDA
// backend's cudaStream_t). Rank 0's NCCL id travels over rv. A watchdog
// thread aborts the NCCL communicator, so that no rank hangs, when rv reports
// a peer dead or failed, NCCL reports an error, or a collective has not
// finished timeout seconds after it was enqueued; the next collective then
// fails with the reason. Built only with CUDA; elsewhere it fails saying so.
int dc_comm_nccl_create(dc_rendezvous *rv, void *stream, dc_comm **out);
void dc_comm_nccl_free(dc_comm *c);
// Makes GPU local_rank the current device, before the CUDA backend is
// created (one GPU per rank of this host).
int dc_comm_nccl_select_device(int local_rank);
// GPUs this process sees (-1 with a message when CUDA cannot count them).
int dc_comm_nccl_gpu_count(void);
