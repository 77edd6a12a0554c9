// TCP rendezvous and the job's connections (a star through rank 0).
#include "dist/rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

enum { MAGIC = 0x56524344u /* "DCRV" */, HELLO = 1, WELCOME, DATA, ABORT, BYE };
enum { IO_OK = 0, IO_TIMEOUT = -2, IO_CLOSED = -3, IO_INCOMING = -4, MAX_WHY = 1024 };

typedef struct {
    uint32_t magic, kind;
    uint64_t len;
} frame;

struct dc_rendezvous {
    int rank, size;
    int *fd;         // [size] rank 0: fd[q] for every q > 0; another rank: fd[0]
    bool *departed;  // [size] the peer said goodbye (finished normally)
    double timeout;
    pthread_mutex_t io;     // one user of the connections at a time
    pthread_mutex_t state;  // guards failed and why
    bool failed;
    char why[MAX_WHY];
};

static double now(void) { return dc_time_now(); }

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// ---- the job's state ------------------------------------------------------------------
bool dc_rendezvous_failed(const dc_rendezvous *rv) {
    pthread_mutex_lock((pthread_mutex_t *)&rv->state);
    bool f = rv->failed;
    pthread_mutex_unlock((pthread_mutex_t *)&rv->state);
    return f;
}

static int failed_msg(dc_rendezvous *rv) {
    char why[MAX_WHY];
    pthread_mutex_lock(&rv->state);
    memcpy(why, rv->why, sizeof why);
    pthread_mutex_unlock(&rv->state);
    return dc_fail("%s", why);
}

// ---- framed I/O with a deadline ---------------------------------------------------------
// Waits until fd is ready for ev. With watch_in, a writer also watches for a
// frame coming the other way (IO_INCOMING): mid-exchange the peer only ever
// sends one to say the job has failed.
static int io_wait(int fd, short ev, bool watch_in, double deadline) {
    for (;;) {
        double left = deadline - now();
        if (left <= 0) return IO_TIMEOUT;
        struct pollfd p = {fd, (short)(watch_in ? ev | POLLIN : ev), 0};
        int rc = poll(&p, 1, left > 1e6 ? 1000000000 : (int)(left * 1000) + 1);
        if (rc > 0 && watch_in && (p.revents & POLLIN)) return IO_INCOMING;
        if (rc > 0) return IO_OK;
        if (rc < 0 && errno != EINTR) return IO_CLOSED;
    }
}

static int io_read(int fd, void *buf, size_t n, double deadline) {
    char *p = buf;
    while (n > 0) {
        int w = io_wait(fd, POLLIN, false, deadline);
        if (w) return w;
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0) return IO_CLOSED;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return IO_CLOSED;
        }
        p += k, n -= (size_t)k;
    }
    return IO_OK;
}

static int io_write(int fd, const void *buf, size_t n, bool watch_in, double deadline) {
    const char *p = buf;
    while (n > 0) {
        int w = io_wait(fd, POLLOUT, watch_in, deadline);
        if (w) return w;
        // MSG_NOSIGNAL: a peer gone is an error to report, not SIGPIPE
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return IO_CLOSED;
        }
        p += k, n -= (size_t)k;
    }
    return IO_OK;
}

// A DATA frame stops at a frame coming the other way (IO_INCOMING), so that a
// sender blocked on a peer that stopped reading hears why. Every other kind goes out whatever the peer has
// sent: an ABORT or BYE matters most to a peer that is waiting on this rank
// with its own frame still unread here.
static int write_frame(int fd, uint32_t kind, const void *buf, size_t n, double deadline) {
    frame f = {MAGIC, kind, n};
    int rc = io_write(fd, &f, sizeof f, kind == DATA, deadline);
    return rc ? rc : io_write(fd, buf, n, kind == DATA, deadline);
}

// Records the job's first failure. Rank 0 passes it to every other rank (an
// ABORT frame, briefly waited for) and shuts the connections, so that a rank
// blocked on it wakes at once; another rank tells rank 0.
static void fail_job(dc_rendezvous *rv, const char *why) {
    pthread_mutex_lock(&rv->state);
    bool first = !rv->failed;
    if (first) {
        rv->failed = true;
        snprintf(rv->why, sizeof rv->why, "%s", why);
    }
    pthread_mutex_unlock(&rv->state);
    if (!first) return;
    double deadline = now() + 2;
    for (int q = 0; q < rv->size; q++) {
        if (rv->fd[q] < 0 || rv->departed[q]) continue;
        write_frame(rv->fd[q], ABORT, why, strlen(why) + 1, deadline);
        // (not SHUT_RDWR: a reset could discard the ABORT before it is read)
        if (rv->rank == 0) shutdown(rv->fd[q], SHUT_WR);
    }
}

static int peer_lost(dc_rendezvous *rv, int peer, int io) {
    char why[MAX_WHY];
    if (io == IO_TIMEOUT)
        snprintf(why, sizeof why, "no word from rank %d of %d for %.0f s: it is stuck, or far behind the others",
                 peer, rv->size, rv->timeout);
    else if (rv->departed[peer])
        snprintf(why, sizeof why, "rank %d of %d had already finished when rank %d waited for it", peer,
                 rv->size, rv->rank);
    else if (peer == 0)
        snprintf(why, sizeof why, "rank 0 of %d died (its connection closed)", rv->size);
    else
        snprintf(why, sizeof why, "rank %d of %d died (its connection closed)", peer, rv->size);
    fail_job(rv, why);
    return failed_msg(rv);
}

// Acts on a frame header read from peer: 0 for a DATA frame (or, when
// bye_ok, a goodbye), else -1 with the job failed (ABORT: the sender's
// message; BYE: the peer finished while this rank waited for it).
static int on_frame(dc_rendezvous *rv, int peer, const frame *f, bool bye_ok) {
    int fd = rv->fd[peer];
    if (f->magic != MAGIC) {
        char why[MAX_WHY];
        snprintf(why, sizeof why, "rank %d of %d sent something that is not a message of this program", peer,
                 rv->size);
        fail_job(rv, why);
        return failed_msg(rv);
    }
    if (f->kind == ABORT) {
        char why[MAX_WHY] = "";
        size_t n = f->len < sizeof why ? (size_t)f->len : sizeof why - 1;
        io_read(fd, why, n, now() + 2);
        why[sizeof why - 1] = 0;
        fail_job(rv, why);
        return failed_msg(rv);
    }
    if (f->kind == BYE) {
        rv->departed[peer] = true;
        return bye_ok ? 0 : peer_lost(rv, peer, IO_CLOSED);
    }
    if (f->kind != DATA) {
        fail_job(rv, "a message out of place: the ranks are not running the same program");
        return failed_msg(rv);
    }
    return 0;
}

// Reads a frame header from peer, expecting DATA.
static int read_header(dc_rendezvous *rv, int peer, frame *f) {
    // Rank 0's answer can take its own wait on a slow rank: the others give it
    // twice as long, so that the rank at fault is the one named.
    double wait = rv->rank == 0 ? rv->timeout : 2 * rv->timeout + 1;
    int io = io_read(rv->fd[peer], f, sizeof *f, now() + wait);
    return io ? peer_lost(rv, peer, io) : on_frame(rv, peer, f, false);
}

static int check_peer(dc_rendezvous *rv, int peer) {
    if (peer < 0 || peer >= rv->size || peer == rv->rank || (rv->rank != 0 && peer != 0))
        return dc_fail("rank %d has no connection to rank %d", rv->rank, peer);
    return dc_rendezvous_failed(rv) ? failed_msg(rv) : 0;
}

int dc_rv_send(dc_rendezvous *rv, int peer, const void *buf, size_t n) {
    DC_TRY(check_peer(rv, peer));
    pthread_mutex_lock(&rv->io);
    int io = write_frame(rv->fd[peer], DATA, buf, n, now() + rv->timeout);
    frame f;
    int rc = io == IO_INCOMING ? (read_header(rv, peer, &f) ? -1 : (fail_job(rv, "a message out of place: the "
                                  "ranks are not running the same program"), failed_msg(rv)))
             : io ? peer_lost(rv, peer, io) : 0;
    pthread_mutex_unlock(&rv->io);
    return rc;
}

int dc_rv_recv_stream(dc_rendezvous *rv, int peer, size_t n, dc_rv_sink fn, void *ctx) {
    DC_TRY(check_peer(rv, peer));
    pthread_mutex_lock(&rv->io);
    frame f;
    int rc = read_header(rv, peer, &f);
    if (!rc && f.len != n) {
        char why[MAX_WHY];
        snprintf(why, sizeof why, "rank %d of %d sent %llu bytes where rank %d expected %zu: the ranks run "
                 "different settings or versions", peer, rv->size, (unsigned long long)f.len, rv->rank, n);
        fail_job(rv, why);
        rc = failed_msg(rv);
    }
    char piece[1 << 16];
    for (size_t at = 0; !rc && at < n;) {
        size_t k = n - at < sizeof piece ? n - at : sizeof piece;
        int io = io_read(rv->fd[peer], piece, k, now() + rv->timeout);
        if (io) {
            rc = peer_lost(rv, peer, io);
            break;
        }
        fn(ctx, piece, at, k);
        at += k;
    }
    pthread_mutex_unlock(&rv->io);
    return rc;
}

static void copy_sink(void *ctx, const void *piece, size_t offset, size_t len) {
    memcpy((char *)ctx + offset, piece, len);
}

int dc_rv_recv(dc_rendezvous *rv, int peer, void *buf, size_t n) {
    return dc_rv_recv_stream(rv, peer, n, copy_sink, buf);
}

void dc_rendezvous_abort(dc_rendezvous *rv, const char *why) {
    char msg[MAX_WHY];
    snprintf(msg, sizeof msg, "rank %d of %d failed: %s", rv->rank, rv->size, why);
    pthread_mutex_lock(&rv->io);
    fail_job(rv, msg);
    pthread_mutex_unlock(&rv->io);
}

int dc_rendezvous_check(dc_rendezvous *rv) {
    if (dc_rendezvous_failed(rv)) return failed_msg(rv);
    if (pthread_mutex_trylock(&rv->io) != 0) return 0;  // an exchange is under way: it sees any failure
    struct pollfd p[64];
    int peers[64], np = 0;
    for (int q = 0; q < rv->size && np < 64; q++) {
        if (rv->fd[q] < 0 || rv->departed[q]) continue;
        p[np] = (struct pollfd){rv->fd[q], POLLRDHUP, 0};
        peers[np++] = q;
    }
    int rc = 0;
    if (poll(p, (nfds_t)np, 0) > 0) {
        for (int i = 0; i < np && !rc; i++) {
            if (!(p[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            // The peer is gone: its last frames say whether it failed (ABORT),
            // finished (BYE) or died (neither).
            frame f;
            for (;;) {
                if (io_read(p[i].fd, &f, sizeof f, now() + 1)) {
                    rc = peer_lost(rv, peers[i], IO_CLOSED);
                    break;
                }
                if (f.magic != MAGIC || f.kind != DATA) {
                    rc = on_frame(rv, peers[i], &f, true);
                    break;
                }
                char skip[4096];  // data nobody will wait for any more
                for (uint64_t left = f.len; left > 0;) {
                    size_t k = left < sizeof skip ? (size_t)left : sizeof skip;
                    if (io_read(p[i].fd, skip, k, now() + 1)) break;
                    left -= k;
                }
            }
        }
    }
    pthread_mutex_unlock(&rv->io);
    return rc;
}

// ---- small exchanges over the star --------------------------------------------------------
int dc_rendezvous_all_gather(dc_rendezvous *rv, const void *in, void *out, size_t n) {
    char *o = out;
    if (rv->rank != 0) return dc_rv_send(rv, 0, in, n) || dc_rv_recv(rv, 0, out, (size_t)rv->size * n) ? -1 : 0;
    memmove(o, in, n);
    for (int q = 1; q < rv->size; q++) DC_TRY(dc_rv_recv(rv, q, o + (size_t)q * n, n));
    for (int q = 1; q < rv->size; q++) DC_TRY(dc_rv_send(rv, q, out, (size_t)rv->size * n));
    return 0;
}

int dc_rendezvous_broadcast(dc_rendezvous *rv, void *buf, size_t n) {
    if (rv->rank != 0) return dc_rv_recv(rv, 0, buf, n);
    for (int q = 1; q < rv->size; q++) DC_TRY(dc_rv_send(rv, q, buf, n));
    return 0;
}

int dc_rendezvous_rank(const dc_rendezvous *rv) { return rv->rank; }
int dc_rendezvous_size(const dc_rendezvous *rv) { return rv->size; }
double dc_rendezvous_timeout(const dc_rendezvous *rv) { return rv->timeout; }

// ---- meeting --------------------------------------------------------------------------------
typedef struct {
    uint32_t rank, size;
} hello;

static int listen_on(int port, int backlog, int *out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return dc_fail("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = htons((uint16_t)port)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        return dc_fail("rank 0 cannot listen on TCP port %d (MASTER_PORT): %s%s", port, strerror(e),
                       e == EADDRINUSE ? " (another job uses it: choose another MASTER_PORT)" : "");
    }
    *out = fd;
    return 0;
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small frames go out at once
}

// Rank 0: accepts every other rank, checks who it says it is, then welcomes all.
static int meet_as_root(dc_rendezvous *rv, int port, double deadline) {
    int lfd = -1;
    DC_TRY(listen_on(port, rv->size, &lfd));
    int missing = rv->size - 1, rc = 0;
    while (missing > 0 && !rc) {
        if (io_wait(lfd, POLLIN, false, deadline)) {
            char list[256] = "";
            for (int q = 1; q < rv->size; q++)
                if (rv->fd[q] < 0 && strlen(list) < 200)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", list[0] ? ", " : "", q);
            rc = dc_fail("rank 0 waited %.0f s on port %d for rank%s %s of %d to connect; were they started, "
                         "with MASTER_ADDR naming this host?", rv->timeout, port, missing > 1 ? "s" : "", list,
                         rv->size);
            break;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        set_nodelay(fd);
        frame f;
        hello h;
        // Something that is not a rank of this job (a port scanner, say) is dropped.
        if (io_read(fd, &f, sizeof f, now() + 5) || f.magic != MAGIC || f.kind != HELLO || f.len != sizeof h ||
            io_read(fd, &h, sizeof h, now() + 5)) {
            close(fd);
            continue;
        }
        char why[MAX_WHY] = "";
        if (h.size != (uint32_t)rv->size)
            snprintf(why, sizeof why, "rank %u says the job has %u ranks, rank 0 says %d", h.rank, h.size, rv->size);
        else if (h.rank == 0 || h.rank >= (uint32_t)rv->size)
            snprintf(why, sizeof why, "a second rank 0 (or rank %u of %d) connected to port %d", h.rank, rv->size, port);
        else if (rv->fd[h.rank] >= 0)
            snprintf(why, sizeof why, "two processes both say they are rank %u of %d", h.rank, rv->size);
        if (why[0]) {
            write_frame(fd, ABORT, why, strlen(why) + 1, now() + 2);
            close(fd);
            rc = dc_fail("%s", why);
            break;
        }
        rv->fd[h.rank] = fd;
        missing--;
    }
    close(lfd);
    for (int q = 1; q < rv->size && !rc; q++)
        if (write_frame(rv->fd[q], WELCOME, NULL, 0, deadline + 10))
            rc = dc_fail("rank %d of %d left during the rendezvous", q, rv->size);
    return rc;
}

// Another rank: connects (again and again until the deadline: rank 0 may not
// be listening yet), says who it is, and waits for the welcome.
static int meet_as_peer(dc_rendezvous *rv, const char *addr, int port, double deadline) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    const char *last = "no attempt";
    // "localhost" is the loopback address by definition (RFC 6761), also
    // where no /etc/hosts says so (a minimal container)
    const char *host = strcmp(addr, "localhost") == 0 ? "127.0.0.1" : addr;
    int fd = -1;
    while (fd < 0) {
        int g = getaddrinfo(host, service, &hints, &ai);
        if (g == 0) {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
                last = strerror(errno);
                close(fd), fd = -1;
            }
            freeaddrinfo(ai);
        } else {
            last = gai_strerror(g);  // DNS may not know the name yet on a fresh node
        }
        if (fd >= 0) break;
        if (now() >= deadline)
            return dc_fail("rank %d could not reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.0f s: %s",
                           rv->rank, addr, port, rv->timeout, last);
        sleep_ms(100);
    }
    set_nodelay(fd);
    rv->fd[0] = fd;
    hello h = {(uint32_t)rv->rank, (uint32_t)rv->size};
    frame f;
    if (write_frame(fd, HELLO, &h, sizeof h, deadline) ||
        io_read(fd, &f, sizeof f, deadline + 10))
        return dc_fail("rank %d: rank 0 at %s:%d did not let it join within %.0f s (is another job using "
                       "that port?)", rv->rank, addr, port, rv->timeout);
    if (f.magic == MAGIC && f.kind == ABORT) {
        on_frame(rv, 0, &f, false);
        return failed_msg(rv);
    }
    if (f.magic != MAGIC || f.kind != WELCOME)
        return dc_fail("rank %d: %s:%d answered, but not as rank 0 of this program", rv->rank, addr, port);
    return 0;
}

int dc_rendezvous_open(dc_rendezvous **out, const dc_launch *l, double timeout_s) {
    *out = NULL;
    if (l->size < 2) return dc_fail("a rendezvous needs 2 ranks or more (%d)", l->size);
    if (!(timeout_s > 0)) return dc_fail("rendezvous timeout %g s: must be positive", timeout_s);
    dc_rendezvous *rv = calloc(1, sizeof *rv);
    if (!rv || !(rv->fd = malloc(sizeof(int) * (size_t)l->size)) ||
        !(rv->departed = calloc((size_t)l->size, sizeof(bool)))) {
        if (rv) free(rv->fd);
        free(rv);
        return dc_fail("out of memory for %d ranks", l->size);
    }
    rv->rank = l->rank, rv->size = l->size, rv->timeout = timeout_s;
    for (int q = 0; q < l->size; q++) rv->fd[q] = -1;
    pthread_mutex_init(&rv->io, NULL);
    pthread_mutex_init(&rv->state, NULL);
    double deadline = now() + timeout_s;
    int rc = rv->rank == 0 ? meet_as_root(rv, l->master_port, deadline)
                           : meet_as_peer(rv, l->master_addr, l->master_port, deadline);
    if (rc) {
        rv->failed = true;  // no goodbye: the others see this rank gone
        dc_rendezvous_close(rv);
        return -1;
    }
    *out = rv;
    return 0;
}

void dc_rendezvous_close(dc_rendezvous *rv) {
    if (!rv) return;
    pthread_mutex_lock(&rv->io);
    for (int q = 0; q < rv->size; q++) {
        if (rv->fd[q] < 0) continue;
        if (!dc_rendezvous_failed(rv) && !rv->departed[q]) write_frame(rv->fd[q], BYE, NULL, 0, now() + 2);
        // Closing with unread bytes would send a reset, which can destroy the
        // ABORT or BYE just sent before the peer reads it: finish sending,
        // then read what is left (briefly) before closing.
        shutdown(rv->fd[q], SHUT_WR);
        char skip[4096];
        double end = now() + 1;
        while (io_wait(rv->fd[q], POLLIN, false, end) == IO_OK && recv(rv->fd[q], skip, sizeof skip, 0) > 0) {}
        close(rv->fd[q]);
    }
    pthread_mutex_unlock(&rv->io);
    pthread_mutex_destroy(&rv->io);
    pthread_mutex_destroy(&rv->state);
    free(rv->fd), free(rv->departed), free(rv);
}
