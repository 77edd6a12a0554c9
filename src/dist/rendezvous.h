// How the processes of a job find each other, and the TCP connections they
// keep: rank 0 listens on MASTER_PORT, every other rank connects to
// MASTER_ADDR:MASTER_PORT (retrying until a timeout, since the ranks start in
// any order) and says who it is; once all have come, rank 0 says so to each.
// The connections (a star through rank 0) stay open for the whole job:
//
// - they carry small exchanges (NCCL's unique id, the per-step stop flags)
//   and, on the CPU, the socket communicator's data (comm_socket.c);
// - they tell a rank when another has died: the kernel closes a dead
//   process's sockets, so a read returns end-of-file at once, and rank 0
//   passes the news on to every other rank.
//
// Every message is a frame: a 16-byte header (magic, kind, length) and its
// bytes. A DATA frame must have the length the reader expects (every rank
// makes the same calls with the same sizes, or the job is stopped naming
// both). An ABORT frame carries why its sender stopped.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "dist/launch.h"

typedef struct dc_rendezvous dc_rendezvous;

// Joins the job described by `l` (l->size > 1), waiting up to timeout_s for
// the others. Messages name the address, port and ranks at fault (a port
// taken, a rank that never came, a rank that came twice, a different size).
int dc_rendezvous_open(dc_rendezvous **rv, const dc_launch *l, double timeout_s);
// Closes the connections. Call it only once every rank is done with them:
// the others see the closing as this rank's death.
void dc_rendezvous_close(dc_rendezvous *rv);
int dc_rendezvous_rank(const dc_rendezvous *rv);
int dc_rendezvous_size(const dc_rendezvous *rv);
// Seconds a rank waits on a peer before it calls the job hung.
double dc_rendezvous_timeout(const dc_rendezvous *rv);

// Point to point, rank 0 with rank q (q > 0), or rank q with rank 0 (peer 0).
// recv takes exactly n bytes of one DATA frame. Both fail once the job has
// failed, with the first failure's message ("rank 2 died (its connection
// closed)", "rank 1 failed: ...", "no word from rank 3 for 300 s").
int dc_rv_send(dc_rendezvous *rv, int peer, const void *buf, size_t n);
int dc_rv_recv(dc_rendezvous *rv, int peer, void *buf, size_t n);
// Receives one DATA frame of n bytes in pieces: calls fn(ctx, piece, offset,
// len) for each piece as it arrives, so rank 0 can sum a large buffer
// without holding a copy of it.
typedef void (*dc_rv_sink)(void *ctx, const void *piece, size_t offset, size_t len);
int dc_rv_recv_stream(dc_rendezvous *rv, int peer, size_t n, dc_rv_sink fn, void *ctx);

// out[size * n] = every rank's in[n], in rank order, on every rank.
int dc_rendezvous_all_gather(dc_rendezvous *rv, const void *in, void *out, size_t n);
// buf[n] = rank 0's buf on every rank.
int dc_rendezvous_broadcast(dc_rendezvous *rv, void *buf, size_t n);

// Marks the job failed with why: rank 0 tells every other rank; another rank
// tells rank 0, which tells the rest when it next hears from it. The first
// failure's message wins; later calls fail with it.
void dc_rendezvous_abort(dc_rendezvous *rv, const char *why);
// Has the job failed (0: no; -1: yes, message set)? Without blocking, looks
// for a peer whose connection closed (died, or aborted and left) and, on rank
// 0, passes that on. For a watchdog thread; it never consumes data a
// collective is waiting for: it waits its turn while one is under way.
int dc_rendezvous_check(dc_rendezvous *rv);
// Is the job failed already (no I/O)?
bool dc_rendezvous_failed(const dc_rendezvous *rv);
