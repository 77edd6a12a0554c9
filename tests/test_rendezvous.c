// Several processes: the launcher variables of torchrun, mpirun and srun;
// the TCP rendezvous among real processes (forked here); the socket
// communicator's collectives (a reduce-scatter continuing running totals
// included) against the thread communicator's, bit for bit;
// and the faults: a rank killed with SIGKILL, a rank that aborts, a rank that
// hangs, and rendezvous mistakes (a wrong size, a rank that never comes, no
// rank 0), each ending every other rank with a message within seconds.
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/comm_net.h"
#include "dist/launch.h"
#include "dist/rendezvous.h"

// ---- launcher variables -----------------------------------------------------------------
static void clear_env(void) {
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                          "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK",
                          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                          "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

static void set(const char *k, const char *v) { setenv(k, v, 1); }

static void expect_launch_error(const char *what, const char *part) {
    dc_launch l;
    int rc = dc_launch_from_env(&l);
    CHECK(rc != 0 && strstr(dc_error(), part), "%s: rc %d, message '%s' lacks '%s'", what, rc, rc ? dc_error() : "",
          part);
}

static void test_launch_env(void) {
    dc_launch l;
    clear_env();
    CHECK(dc_launch_from_env(&l) == 0 && l.rank == 0 && l.size == 1 && !strcmp(l.launcher, "none"),
          "no launcher: rank %d of %d (%s)", l.rank, l.size, l.launcher);

    set("RANK", "3"), set("WORLD_SIZE", "8"), set("LOCAL_RANK", "1"), set("LOCAL_WORLD_SIZE", "2");
    set("MASTER_ADDR", "node0"), set("MASTER_PORT", "1234");
    CHECK(dc_launch_from_env(&l) == 0 && l.rank == 3 && l.size == 8 && l.local_rank == 1 && l.local_size == 2 &&
              !strcmp(l.master_addr, "node0") && l.master_port == 1234 && !strcmp(l.launcher, "torchrun"),
          "torchrun: %s; rank %d/%d local %d/%d %s:%d", dc_error(), l.rank, l.size, l.local_rank, l.local_size,
          l.master_addr, l.master_port);
    // torchrun inside a Slurm allocation: torchrun's variables describe this process
    set("SLURM_PROCID", "0"), set("SLURM_NTASKS", "1");
    CHECK(dc_launch_from_env(&l) == 0 && l.rank == 3 && !strcmp(l.launcher, "torchrun"), "torchrun under srun: %s",
          l.launcher);

    clear_env();
    set("OMPI_COMM_WORLD_RANK", "5"), set("OMPI_COMM_WORLD_SIZE", "6"), set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
    set("OMPI_COMM_WORLD_LOCAL_SIZE", "3"), set("MASTER_ADDR", "10.0.0.7"), set("MASTER_PORT", "2000");
    CHECK(dc_launch_from_env(&l) == 0 && l.rank == 5 && l.size == 6 && l.local_rank == 2 && l.local_size == 3 &&
              !strcmp(l.master_addr, "10.0.0.7") && l.master_port == 2000 && !strcmp(l.launcher, "mpirun"),
          "mpirun: %s; rank %d/%d local %d/%d", dc_error(), l.rank, l.size, l.local_rank, l.local_size);

    clear_env();
    set("SLURM_PROCID", "7"), set("SLURM_NTASKS", "8"), set("SLURM_LOCALID", "3"), set("SLURM_NODEID", "1");
    set("SLURM_TASKS_PER_NODE", "4(x2)"), set("MASTER_ADDR", "gpu-a01");
    CHECK(dc_launch_from_env(&l) == 0 && l.rank == 7 && l.size == 8 && l.local_rank == 3 && l.local_size == 4 &&
              l.node == 1 && !strcmp(l.master_addr, "gpu-a01") && l.master_port == DC_LAUNCH_DEFAULT_PORT &&
              !strcmp(l.launcher, "srun"),
          "srun: %s; rank %d/%d local %d/%d node %d port %d", dc_error(), l.rank, l.size, l.local_rank,
          l.local_size, l.node, l.master_port);
    unsetenv("MASTER_ADDR");
    expect_launch_error("srun on two hosts without MASTER_ADDR", "MASTER_ADDR is not set");
    set("SLURM_TASKS_PER_NODE", "8");  // one host: rank 0 is on this one
    CHECK(dc_launch_from_env(&l) == 0 && !strcmp(l.master_addr, "127.0.0.1"), "srun on one host: %s", dc_error());

    clear_env();
    set("RANK", "4"), set("WORLD_SIZE", "4");
    expect_launch_error("rank outside the world", "RANK=4 is outside WORLD_SIZE=4");
    set("RANK", "x1");
    expect_launch_error("malformed rank", "RANK='x1' is not a non-negative integer");
    set("RANK", "1"), set("MASTER_PORT", "70000");
    expect_launch_error("port out of range", "MASTER_PORT=70000 is not a TCP port");
    unsetenv("WORLD_SIZE"), unsetenv("MASTER_PORT");
    expect_launch_error("rank without a world size", "RANK is set but WORLD_SIZE is not");
    set("WORLD_SIZE", "2"), set("LOCAL_RANK", "1"), set("LOCAL_WORLD_SIZE", "1");
    expect_launch_error("local rank outside the host's", "LOCAL_RANK=1 is outside");
    clear_env();
}

// ---- forked ranks -------------------------------------------------------------------------
static dc_rendezvous *g_rv;  // a forked rank's connections, closed when its body returns
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

// A rank's body: returns 0 when everything it saw was right (it prints why not).
typedef int (*rank_body)(int rank, int size, int port);

// Runs body on `size` forked processes; code[r] is rank r's exit status, or
// -signal. Ranks still running after `limit` seconds are killed (a hang is a
// failure, never a stalled test).
static void run_ranks(int size, rank_body body, double limit, int *code) {
    int port = free_port();
    pid_t pid[8];
    fflush(stdout);
    for (int r = 0; r < size; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            int rc = body(r, size, port);
            dc_rendezvous_close(g_rv);  // as the program does: a clean close lets the last frames arrive
            fflush(stdout);
            _exit(rc);
        }
        code[r] = 1000;
    }
    double end = dc_time_now() + limit;
    for (int left = size; left > 0;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        for (int r = 0; r < size && p > 0; r++)
            if (pid[r] == p) code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), left--;
        if (p > 0) continue;
        if (dc_time_now() > end) {
            for (int r = 0; r < size; r++)
                if (code[r] == 1000) kill(pid[r], SIGKILL), printf("rank %d hung\n", r);
        }
        usleep(20000);
    }
}

static double g_timeout = 10;

static int join(int rank, int size, int port, dc_rendezvous **rv) {
    dc_launch l = {.rank = rank, .size = size, .local_rank = rank, .local_size = size, .master_port = port,
                   .launcher = "test"};
    snprintf(l.master_addr, sizeof l.master_addr, "localhost");
    if (dc_rendezvous_open(rv, &l, g_timeout) == 0) return g_rv = *rv, 0;
    printf("rank %d: rendezvous: %s\n", rank, dc_error());
    return 1;
}

// Values of many magnitudes, so that adding them in another order rounds differently.
static float value(int rank, int64_t j) {
    float v = (float)((rank * 7919 + j * 104729) % 1999) / 997.0f - 1.0f;
    return ldexpf(v, (int)((j * 7 + rank * 5) % 23) - 11);
}

enum { N_SMALL = 1000, N_BIG = 70001 };  // the big one spans several 64 KiB pieces
static float *g_ref_sum, *g_ref_rs[3], *g_ref_add[3];  // thread communicator's results (3 ranks)
static const int64_t k_sizes[2] = {N_SMALL, N_BIG};

static int reference(dc_comm *c, void *arg) {
    (void)arg;
    int64_t n = N_BIG;
    float *buf = malloc(sizeof(float) * (size_t)n), *in = malloc(sizeof(float) * (size_t)n * 3);
    for (int64_t j = 0; j < n; j++) buf[j] = value(c->rank, j);
    for (int64_t j = 0; j < 3 * n; j++) in[j] = value(c->rank + 5, j);
    int rc = dc_comm_all_reduce_sum(c, buf, n) || dc_comm_reduce_scatter_sum(c, g_ref_rs[c->rank], in, n);
    // a running total (this rank's buf of before) continued by slice `rank` of every rank's in
    for (int64_t j = 0; j < n; j++) g_ref_add[c->rank][j] = 64.0f * value(c->rank + 7, j);
    rc = rc || dc_comm_reduce_scatter_add(c, g_ref_add[c->rank], in, n);
    if (c->rank == 0) memcpy(g_ref_sum, buf, sizeof(float) * (size_t)n);
    free(buf), free(in);
    return rc;
}

static int collectives_body(int rank, int size, int port) {
    dc_rendezvous *rv;
    if (join(rank, size, port, &rv)) return 1;
    dc_comm *c;
    dc_comm_socket_create(rv, &c);
    int bad = 0, rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        int64_t n = k_sizes[k];
        float *buf = malloc(sizeof(float) * (size_t)n), *in = malloc(sizeof(float) * (size_t)n * 3),
              *out = malloc(sizeof(float) * (size_t)n);
        for (int64_t j = 0; j < n; j++) buf[j] = value(rank, j);
        // the reference's first n elements of each slice are this run's slices of 3n
        for (int q = 0; q < 3; q++)
            for (int64_t j = 0; j < n; j++) in[q * n + j] = value(rank + 5, q * (int64_t)N_BIG + j);
        rc = dc_comm_all_reduce_sum(c, buf, n) || dc_comm_reduce_scatter_sum(c, out, in, n);
        if (!rc) {
            bad += memcmp(buf, g_ref_sum, sizeof(float) * (size_t)n) != 0;
            bad += memcmp(out, g_ref_rs[rank], sizeof(float) * (size_t)n) != 0;
        }
        for (int64_t j = 0; j < n; j++) out[j] = 64.0f * value(rank + 7, j);
        rc = rc || dc_comm_reduce_scatter_add(c, out, in, n);
        if (!rc) bad += memcmp(out, g_ref_add[rank], sizeof(float) * (size_t)n) != 0;
        free(buf), free(in), free(out);
    }
    // the NCCL id's way: 128 bytes from rank 0
    unsigned char id[128];
    for (int i = 0; i < 128; i++) id[i] = (unsigned char)(rank == 0 ? i * 3 + 1 : 0);
    rc = rc || dc_rendezvous_broadcast(rv, id, sizeof id);
    for (int i = 0; i < 128 && !rc; i++) bad += id[i] != (unsigned char)(i * 3 + 1);
    int mine[2] = {rank, 100 + rank}, all[6];
    rc = rc || dc_comm_all_gather(c, all, mine, sizeof mine);
    for (int q = 0; q < size && !rc; q++) bad += all[2 * q] != q || all[2 * q + 1] != 100 + q;
    char msg[24] = "";
    if (rank == 2) snprintf(msg, sizeof msg, "from rank 2");
    rc = rc || dc_comm_broadcast(c, msg, sizeof msg, 2) || dc_comm_barrier(c);
    bad += strcmp(msg, "from rank 2") != 0;
    if (rc) printf("rank %d: %s\n", rank, dc_error());
    if (bad) printf("rank %d: %d results differ from the thread communicator's\n", rank, bad);
    dc_comm_socket_free(c);
    return rc || bad;
}

// Runs all-reduces until one fails; 0 if the failure says `want` within 5 s
// of `since` (the moment the faulty rank acts).
static int expect_collective_failure(int rank, dc_comm *c, const char *want, double *since) {
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 1000; i++) {
        if (dc_comm_all_reduce_sum(c, x, 4) == 0) continue;
        double late = dc_time_now() - *since;
        if (!strstr(dc_error(), want)) return printf("rank %d: message '%s' lacks '%s'\n", rank, dc_error(), want), 1;
        if (late > 5) return printf("rank %d: failed %.1f s after the fault\n", rank, late), 1;
        return 0;
    }
    return printf("rank %d: no collective failed\n", rank), 1;
}

static int killed_body(int rank, int size, int port) {
    dc_rendezvous *rv;
    if (join(rank, size, port, &rv)) return 1;
    dc_comm *c;
    dc_comm_socket_create(rv, &c);
    float x[4] = {1, 2, 3, 4};
    if (dc_comm_all_reduce_sum(c, x, 4)) return printf("rank %d: %s\n", rank, dc_error()), 1;
    double t = dc_time_now();
    if (rank == 2) {
        usleep(200000);
        raise(SIGKILL);  // no goodbye, no abort: the kernel closes its connection
    }
    return expect_collective_failure(rank, c, "rank 2 of 3 died", &t);
}

static int abort_body(int rank, int size, int port) {
    dc_rendezvous *rv;
    if (join(rank, size, port, &rv)) return 1;
    dc_comm *c;
    dc_comm_socket_create(rv, &c);
    double t = dc_time_now();
    if (rank == 1) {
        dc_comm_abort(c, "loss became nan by step 3");
        float x[1] = {0};  // later collectives fail at once, with the same message
        int rc = dc_comm_all_reduce_sum(c, x, 1);
        return !(rc && strstr(dc_error(), "rank 1 of 3 failed: loss became nan"));
    }
    return expect_collective_failure(rank, c, "rank 1 of 3 failed: loss became nan by step 3", &t);
}

static int hang_body(int rank, int size, int port) {
    dc_rendezvous *rv;
    g_timeout = 1;
    if (join(rank, size, port, &rv)) return 1;
    dc_comm *c;
    dc_comm_socket_create(rv, &c);
    if (rank == 1) {
        sleep(3);  // alive but silent: the others must not wait for ever
        return 0;
    }
    double t = dc_time_now() + 1;  // the timeout itself
    return expect_collective_failure(rank, c, "no word from rank 1 of 3 for 1 s", &t);
}

static int wrong_size_body(int rank, int size, int port) {
    dc_rendezvous *rv;
    if (join(rank, rank == 1 ? size + 1 : size, port, &rv) == 0) return 1;
    return 0;
}

static int missing_body(int rank, int size, int port) {
    dc_rendezvous *rv;
    g_timeout = 1;
    if (rank == 2) return 0;  // never comes
    if (join(rank, size, port, &rv) == 0) return 1;
    return 0;
}

static void test_processes(void) {
    int code[3];
    g_ref_sum = malloc(sizeof(float) * N_BIG);
    for (int q = 0; q < 3; q++) g_ref_rs[q] = malloc(sizeof(float) * N_BIG), g_ref_add[q] = malloc(sizeof(float) * N_BIG);
    CHECK(dc_comm_threads_run(3, reference, NULL) == 0, "thread reference: %s", dc_error());
    // The check can fail: another order of the same additions rounds differently.
    int differs = 0;
    for (int64_t j = 0; j < N_BIG; j++) differs += ((value(2, j) + value(1, j)) + value(0, j)) != g_ref_sum[j];
    CHECK(differs > 0, "the sums do not depend on the order: the test cannot tell orders apart");

    run_ranks(3, collectives_body, 30, code);
    CHECK(code[0] == 0 && code[1] == 0 && code[2] == 0, "3 processes: collectives equal to the thread "
          "communicator's (exit %d %d %d)", code[0], code[1], code[2]);

    run_ranks(3, killed_body, 20, code);
    CHECK(code[0] == 0 && code[1] == 0 && code[2] == -SIGKILL, "rank 2 killed: the others stop saying so "
          "(exit %d %d %d)", code[0], code[1], code[2]);

    run_ranks(3, abort_body, 20, code);
    CHECK(code[0] == 0 && code[1] == 0 && code[2] == 0, "rank 1 aborts: every rank stops with its message "
          "(exit %d %d %d)", code[0], code[1], code[2]);

    run_ranks(3, hang_body, 20, code);
    CHECK(code[0] == 0 && code[2] == 0, "rank 1 silent: the others time out (exit %d %d)", code[0], code[2]);

    run_ranks(2, wrong_size_body, 20, code);
    CHECK(code[0] == 0 && code[1] == 0, "ranks disagreeing on the size both refuse (exit %d %d)", code[0], code[1]);

    run_ranks(3, missing_body, 20, code);
    CHECK(code[0] == 0 && code[1] == 0, "a rank that never comes: the others give up (exit %d %d)", code[0],
          code[1]);

    // no rank 0 at all: rank 1 gives up after its timeout, naming the address
    g_timeout = 1;
    dc_rendezvous *rv;
    double t = dc_time_now();
    int rc = join(1, 2, free_port(), &rv);
    CHECK(rc != 0 && strstr(dc_error(), "could not reach rank 0 at localhost:") && dc_time_now() - t < 5,
          "no rank 0: '%s'", dc_error());
    free(g_ref_sum);
    for (int q = 0; q < 3; q++) free(g_ref_rs[q]), free(g_ref_add[q]);
}

int main(void) {
    test_launch_env();
    test_processes();
    printf("test_rendezvous: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
