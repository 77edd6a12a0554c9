// Launcher variables, and a small launcher of local ranks (train --ranks N).
#include "dist/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

// A non-negative integer variable: 1 with *v set when present, 0 when absent,
// -1 (message naming it) when malformed.
static int env_int(const char *name, int *v) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || end == s || x < 0 || x > INT_MAX)
        return dc_fail("%s='%s' is not a non-negative integer", name, s);
    *v = (int)x;
    return 1;
}

// Slurm's SLURM_TASKS_PER_NODE reads like "4(x2),3": the first node's count.
static int slurm_local_size(int *v) {
    int rc = env_int("SLURM_NTASKS_PER_NODE", v);
    if (rc) return rc;
    const char *s = getenv("SLURM_TASKS_PER_NODE");
    if (!s || !*s) return 0;
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || x < 1 || x > INT_MAX) return dc_fail("SLURM_TASKS_PER_NODE='%s' is not a task count", s);
    *v = (int)x;
    return 1;
}

typedef struct {
    const char *launcher;
    const char *rank, *size, *local_rank, *local_size, *node;
} launcher_vars;

// In order of precedence: torchrun also runs under Slurm and MPI jobs, and
// then its own variables describe the processes it started.
static const launcher_vars k_launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, "SLURM_NODEID"},
};

int dc_launch_from_env(dc_launch *l) {
    memset(l, 0, sizeof *l);
    l->size = l->local_size = 1;
    l->node = -1;
    l->launcher = "none";
    const launcher_vars *lv = NULL;
    for (size_t i = 0; i < sizeof k_launchers / sizeof *k_launchers && !lv; i++) {
        int r, s;
        int hr = env_int(k_launchers[i].rank, &r), hs = env_int(k_launchers[i].size, &s);
        if (hr < 0 || hs < 0) return -1;
        if (hr && hs) lv = &k_launchers[i];
        else if (hr != hs)
            return dc_fail("%s is set but %s is not: a %s job sets both", hr ? k_launchers[i].rank : k_launchers[i].size,
                           hr ? k_launchers[i].size : k_launchers[i].rank, k_launchers[i].launcher);
    }
    if (!lv) {
        snprintf(l->master_addr, sizeof l->master_addr, "127.0.0.1");
        l->master_port = DC_LAUNCH_DEFAULT_PORT;
        return 0;
    }
    l->launcher = lv->launcher;
    env_int(lv->rank, &l->rank);
    env_int(lv->size, &l->size);
    if (l->size < 1) return dc_fail("%s=%d: a job has at least one rank", lv->size, l->size);
    if (l->rank >= l->size) return dc_fail("%s=%d is outside %s=%d", lv->rank, l->rank, lv->size, l->size);
    int have_lr = env_int(lv->local_rank, &l->local_rank);
    if (have_lr < 0) return -1;
    if (!have_lr) l->local_rank = l->rank;  // no local rank given: assume one host
    int have_ls = lv->local_size ? env_int(lv->local_size, &l->local_size) : slurm_local_size(&l->local_size);
    if (have_ls < 0) return -1;
    if (!have_ls) l->local_size = have_lr ? l->local_rank + 1 : l->size;
    if (l->local_size < 1 || l->local_size > l->size)
        return dc_fail("%s=%d: a host runs 1 to %d ranks", lv->local_size ? lv->local_size : "the local size",
                       l->local_size, l->size);
    if (have_ls && l->local_rank >= l->local_size)
        return dc_fail("%s=%d is outside the %d ranks of this host", lv->local_rank, l->local_rank, l->local_size);
    if (env_int(lv->node, &l->node) < 0) return -1;
    if (!getenv(lv->node)) l->node = -1;

    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) {
        if (strlen(addr) >= sizeof l->master_addr) return dc_fail("MASTER_ADDR is too long");
        snprintf(l->master_addr, sizeof l->master_addr, "%s", addr);
    } else if (l->size == 1 || l->local_size == l->size) {
        snprintf(l->master_addr, sizeof l->master_addr, "127.0.0.1");  // every rank on this host
    } else {
        return dc_fail("%s started %d ranks on several hosts but MASTER_ADDR is not set: set it to the host "
                       "name of rank 0's node (and MASTER_PORT to a free port) in every rank's environment",
                       l->launcher, l->size);
    }
    int port = DC_LAUNCH_DEFAULT_PORT;
    int hp = env_int("MASTER_PORT", &port);
    if (hp < 0) return -1;
    if (port < 1 || port > 65535) return dc_fail("MASTER_PORT=%d is not a TCP port (1..65535)", port);
    l->master_port = port;
    return 0;
}

// ---- spawning local ranks ---------------------------------------------------------------

static volatile sig_atomic_t g_forward;
static void on_signal(int sig) { g_forward = sig; }

// A TCP port that is free now (the kernel's choice for port 0). Another
// program could take it before rank 0 listens; rank 0 then fails to bind and
// says so.
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return dc_fail("socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    else
        dc_fail("finding a free TCP port on 127.0.0.1: %s", strerror(errno));
    close(fd);
    return port;
}

static bool orderly_stop(int code) {
    return code == 128 + SIGINT || code == 128 + SIGTERM || code == 128 + SIGHUP || code == 128 + SIGPIPE;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int dc_launch_spawn(int n, int argc, char **argv, double grace_s) {
    if (n < 1 || n > 1024) return dc_fail("%d ranks: 1 to 1024 local ranks", n);
    int port = free_port();
    if (port < 0) return -1;
    char **args = calloc((size_t)argc + 1, sizeof *args);
    pid_t *pid = calloc((size_t)n, sizeof *pid);
    int *code = calloc((size_t)n, sizeof *code);  // exit status, or -signal; INT_MIN while running
    if (!args || !pid || !code) {
        free(args), free(pid), free(code);
        return dc_fail("out of memory for %d ranks", n);
    }
    memcpy(args, argv, sizeof *args * (size_t)argc);
    struct sigaction sa, old[3];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, &old[i]);
    g_forward = 0;

    int started = 0, rc = 0;
    for (; started < n; started++) {
        code[started] = INT_MIN;
        pid_t p = fork();
        if (p < 0) {
            rc = dc_fail("could not start rank %d: %s", started, strerror(errno));
            break;
        }
        if (p == 0) {
            for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
            prctl(PR_SET_PDEATHSIG, SIGKILL);  // no rank outlives a killed launcher
            char v[32];
            snprintf(v, sizeof v, "%d", started), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", n), setenv("WORLD_SIZE", v, 1), setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", port), setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            execv("/proc/self/exe", args);
            fprintf(stderr, "error: rank %d: could not run /proc/self/exe: %s\n", started, strerror(errno));
            _exit(127);
        }
        pid[started] = p;
    }

    // Wait for every rank. The first abnormal end (or a failure to start one)
    // stops the others: SIGTERM now, SIGKILL after the grace period.
    int first_bad = rc ? started : -1, first_stop = -1, running = started;
    double kill_at = rc ? dc_time_now() + grace_s : -1;
    bool termed = false, killed = false;
    char why[256] = "";
    if (rc) snprintf(why, sizeof why, "%s", dc_error());
    while (running > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < started; r++) {
                if (pid[r] != p) continue;
                running--;
                code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
                if (code[r] == 0) break;
                if (code[r] > 0 && orderly_stop(code[r])) {
                    if (first_stop < 0) first_stop = r;
                    break;
                }
                // A rank killed by a signal is the likelier root cause than one
                // that exited because it saw a peer die: name it.
                if (first_bad < 0 || (code[r] < 0 && code[first_bad] > 0)) {
                    if (first_bad < 0) kill_at = dc_time_now() + grace_s;
                    first_bad = r;
                    if (code[r] > 0) snprintf(why, sizeof why, "rank %d of %d exited with status %d", r, n, code[r]);
                    else snprintf(why, sizeof why, "rank %d of %d was killed by signal %d (%s)", r, n, -code[r],
                                  strsignal(-code[r]));
                }
                break;
            }
            continue;
        }
        if (p < 0 && errno != EINTR) break;  // no children left
        int sig = g_forward;
        if (sig) {
            g_forward = 0;
            for (int r = 0; r < started; r++)
                if (code[r] == INT_MIN) kill(pid[r], sig);
        }
        if (first_bad >= 0 && !termed) {
            termed = true;
            for (int r = 0; r < started; r++)
                if (code[r] == INT_MIN) kill(pid[r], SIGTERM);
        }
        if (kill_at >= 0 && !killed && dc_time_now() >= kill_at) {
            killed = true;
            for (int r = 0; r < started; r++)
                if (code[r] == INT_MIN) {
                    dc_warn("rank %d did not stop within %.0f s of SIGTERM: killing it", r, grace_s);
                    kill(pid[r], SIGKILL);
                }
        }
        sleep_s(0.05);
    }
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    if (first_bad >= 0) rc = dc_fail("%s; the other ranks were stopped", why);
    else if (first_stop >= 0) rc = code[first_stop];
    free(args), free(pid), free(code);
    return rc;
}
