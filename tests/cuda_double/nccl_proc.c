/*
 * nccl_proc.c — ranks of the NCCL double in separate processes (tests
 * only; part of libnccl.so.2): the hub of the process that made a unique
 * id, and the remote comms of other processes, over an abstract Unix
 * socket ("a local socket").
 *
 * Design notes
 *  - ncclGetUniqueId starts this process's hub (once per process; a forked
 *    child starts its own): a thread accepting on the abstract socket
 *    "cltest-nccl-<pid>-<token>", pid and token written into the id. A comm
 *    made in any other process is remote: it connects there (retried for
 *    ND_CONNECT_MS) and joins.
 *  - The hub is a bridge, not a second implementation: each remote rank
 *    has a proxy comm in the creator's clique (nccl.c), a member like any
 *    other, fed by one thread per connection. A remote op arrives as
 *    (seq, kind, items, input bytes) and runs as an op of the proxy, on the
 *    proxy's own stream, through the in-process code, on copies of the
 *    inputs; when it completes the proxy's outputs go back and the remote
 *    op copies them into its buffers. So a clique may mix ranks of the
 *    creator and of other processes, and the in-process path is the same.
 *  - Faults are decided where the call is made (that process's switches
 *    and rank), as in one process: a hung op never reaches the hub, so its
 *    peers wait for it; an injected async error stays on that rank.
 *  - Each connection thread polls every ND_TICK_MS: it sends READY once
 *    every rank joined and ERROR when its proxy fails (a peer aborted or
 *    died, the ranks disagree on a collective); the remote comm takes that
 *    as its async error.
 *  - ncclCommAbort of a remote comm waits for its ops to leave (nccl.c),
 *    then sends ABORT and closes; the hub aborts the proxy (ND_ABORTED), so
 *    peers waiting for it see ncclRemoteError. EOF without ABORT (a killed
 *    process) marks the rank ND_DIED. EOF from the hub (the creator's
 *    process died) fails the remote comm's waiting ops and a pending init
 *    with ncclRemoteError.
 *  - Every socket wait is a poll with a timeout that rechecks a stop flag;
 *    sends and receives use MSG_DONTWAIT. No socket call is made under
 *    nd_mu; a connection's writers serialise on its wmu (never taken with
 *    nd_mu held).
 *  - Not supported across processes: ncclCommSplit (ncclInvalidUsage,
 *    nccl.c), and more than one stream of a remote comm with ops in flight
 *    at once (the proxy runs them in arrival order).
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/cuda_double/double.h"
#include "tests/cuda_double/nccl_double.h"

#define ND_CONNECT_MS 3000 /* a remote comm tries this long to reach the hub */
#define ND_JOIN_MS    5000 /* the hub waits this long for a JOIN */
#define ND_TICK_MS    5    /* a connection thread's poll period */

enum { M_JOIN = 1, M_READY, M_ERROR, M_OP, M_RESULT, M_ABORT };

/* Every message: this header, then len bytes. M_JOIN: the id; M_ERROR: the
 * message; M_OP: nitems nd_wire_items, then each item's input bytes;
 * M_RESULT: each item's output bytes. */
typedef struct nd_hdr {
    uint32_t type;
    int32_t code; /* M_ERROR: the ncclResult_t */
    int32_t kind, nitems;
    int32_t rank, nranks, dev; /* M_JOIN */
    int32_t pad;
    uint64_t seq, opid, len;
} nd_hdr;

typedef struct nd_wire_item {
    int32_t kind, dt, op, root, peer, pad;
    uint64_t count;
} nd_wire_item;

/* A remote op waiting for its RESULT (nd_mu). */
typedef struct nd_pending {
    struct nd_pending *next;
    uint64_t opid;
    bool done;
    void *data;
    size_t len;
} nd_pending;

typedef struct nd_remote {
    int fd;
    pid_t hub_pid;
    pthread_t reader;
    atomic_bool stop;
    pthread_mutex_t wmu;
    bool ready, dead; /* nd_mu */
    uint64_t opids;   /* nd_mu */
    nd_pending *pending;
} nd_remote;

/* A connection at the hub. refs (nd_mu): its thread's + one per proxy op. */
typedef struct nd_conn {
    int fd;
    int refs;
    atomic_bool gone; /* EOF or ABORT: stop sending */
    pthread_mutex_t wmu;
    ncclComm_t proxy;
    cudaStream_t stream;
} nd_conn;

/* What a proxy op needs once its comm may be gone. */
typedef struct nd_proxy_ctx {
    nd_conn *k;
    uint64_t opid;
    int rank, nranks;
} nd_proxy_ctx;

/* ---- sockets ------------------------------------------------------------------------- */

static void nd_sock_name(struct sockaddr_un *sa, socklen_t *len, pid_t pid, uint64_t token) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "cltest-nccl-%d-%016llx", (int)pid,
                     (unsigned long long)token);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Move len bytes (out: send, else receive), polling in slices of 100 ms
 * until done, the peer goes (false), *stop, or deadline_ns (0: none). */
static bool nd_io(int fd, bool out, void *buf, size_t len, atomic_bool *stop, int64_t deadline_ns) {
    char *p = buf;
    while (len > 0) {
        if (stop && atomic_load_explicit(stop, memory_order_acquire)) return false;
        if (deadline_ns && cltest_now_ns() > deadline_ns) return false;
        struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        int pr = poll(&pf, 1, 100);
        if (pr < 0 && errno != EINTR) return false;
        if (pr <= 0) continue;
        ssize_t n =
            out ? send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, p, len, MSG_DONTWAIT);
        if (n == 0 && !out) return false; /* EOF */
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

typedef struct nd_piece {
    const void *p;
    size_t len;
} nd_piece;

/* Send a header and its payload pieces as one message (wmu). */
static bool nd_send_msg(int fd, pthread_mutex_t *wmu, nd_hdr *h, const nd_piece *pc, int npc,
                        atomic_bool *stop) {
    h->len = 0;
    for (int i = 0; i < npc; i++)
        h->len += pc[i].len;
    pthread_mutex_lock(wmu);
    bool ok = nd_io(fd, true, h, sizeof *h, stop, 0);
    for (int i = 0; ok && i < npc; i++)
        if (pc[i].len) ok = nd_io(fd, true, (void *)pc[i].p, pc[i].len, stop, 0);
    pthread_mutex_unlock(wmu);
    return ok;
}

/* Read one message; *payload (malloc'd, NULL when empty) is the caller's. */
static bool nd_recv_msg(int fd, nd_hdr *h, void **payload, atomic_bool *stop, int64_t deadline_ns) {
    *payload = NULL;
    if (!nd_io(fd, false, h, sizeof *h, stop, deadline_ns)) return false;
    if (h->len > ((uint64_t)1 << 40)) return false;
    if (!h->len) return true;
    *payload = malloc(h->len);
    if (!*payload) abort();
    if (nd_io(fd, false, *payload, h->len, stop, deadline_ns)) return true;
    free(*payload);
    *payload = NULL;
    return false;
}

/* Bytes an item of rank `rank` of n gives (input) and gets (output). */
static size_t nd_item_in(const dbl_item *it, int rank, int n) {
    size_t b = it->count * nd_dsize(it->dt);
    switch (it->kind) {
    case K_BROADCAST: return rank == it->root ? b : 0;
    case K_REDUCE_SCATTER: return b * (size_t)n;
    case K_RECV: return 0;
    default: return b;
    }
}

static size_t nd_item_out(const dbl_item *it, int rank, int n) {
    size_t b = it->count * nd_dsize(it->dt);
    switch (it->kind) {
    case K_REDUCE: return rank == it->root ? b : 0;
    case K_ALLGATHER: return b * (size_t)n;
    case K_SEND: return 0;
    default: return b;
    }
}

/* ---- the hub ------------------------------------------------------------------------- */

static pthread_mutex_t nd_hub_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t nd_hub_pid;
static uint64_t nd_hub_token;

static void nd_conn_unref_locked(nd_conn *k) {
    if (--k->refs > 0) return;
    close(k->fd);
    pthread_mutex_destroy(&k->wmu);
    free(k);
}

/* A proxy op ran (on the proxy's stream): send its outputs back, free the
 * copies. An aborted one sends nothing: its rank is gone. */
static void nd_proxy_op_done(dbl_op *op, bool completed) {
    nd_proxy_ctx *x = op->ctx;
    nd_piece pc[256];
    int npc = 0;
    for (int i = 0; i < op->nitems && npc < 256; i++) {
        size_t out = nd_item_out(&op->items[i], x->rank, x->nranks);
        if (out) pc[npc++] = (nd_piece){op->items[i].recv, out};
    }
    if (completed) {
        nd_hdr h = {.type = M_RESULT, .opid = x->opid};
        nd_send_msg(x->k->fd, &x->k->wmu, &h, pc, npc, &x->k->gone);
    }
    for (int i = 0; i < op->nitems; i++) {
        free((void *)op->items[i].send);
        free(op->items[i].recv);
    }
    nd_lock();
    nd_conn_unref_locked(x->k);
    nd_unlock();
    free(x);
}

/* An M_OP of k's rank: a proxy op on the proxy's stream, inputs copied. */
static bool nd_proxy_op_post(nd_conn *k, const nd_hdr *h, const char *payload) {
    ncclComm_t c = k->proxy;
    int n = h->nitems;
    size_t off = (size_t)n * sizeof(nd_wire_item);
    if (n < 1 || n > 256 || h->len < off) return false;
    dbl_op *op = calloc(1, sizeof *op + (size_t)n * sizeof(dbl_item));
    nd_proxy_ctx *x = calloc(1, sizeof *x);
    if (!op || !x) abort();
    *x = (nd_proxy_ctx){.k = k, .opid = h->opid, .rank = c->rank, .nranks = c->nranks};
    op->comm = c;
    op->stream = k->stream;
    op->kind = h->kind;
    op->nitems = n;
    op->seq = h->seq;
    op->done = nd_proxy_op_done;
    op->ctx = x;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        nd_wire_item w;
        memcpy(&w, payload + (size_t)i * sizeof w, sizeof w);
        dbl_item *it = &op->items[i];
        *it = (dbl_item){.kind = w.kind,
                         .count = w.count,
                         .dt = (ncclDataType_t)w.dt,
                         .op = (ncclRedOp_t)w.op,
                         .root = w.root,
                         .peer = w.peer};
        size_t in = nd_item_in(it, c->rank, c->nranks), out = nd_item_out(it, c->rank, c->nranks);
        if (off + in > h->len) {
            ok = false;
            in = 0;
        }
        /* never NULL, even for 0 bytes: nccl.c memcpy()s from and to them */
        if (it->kind != K_RECV) {
            void *p = malloc(in ? in : 1);
            if (!p) abort();
            if (in) memcpy(p, payload + off, in);
            it->send = p;
            off += in;
        }
        if (it->kind != K_SEND && !(it->recv = calloc(1, out ? out : 1))) abort();
    }
    nd_lock();
    k->refs++;
    c->refs++;
    nd_unlock();
    if (!ok || cltest_stream_enqueue(k->stream, nd_op_run, op) != cudaSuccess) {
        nd_lock(); /* not enqueued: undo by hand */
        c->refs--;
        nd_unlock();
        nd_proxy_op_done(op, false);
        free(op);
        return false;
    }
    return true;
}

/* The proxy's rank left: aborted (M_ABORT) or died (EOF). Like
 * ncclCommAbort: peers waiting for it see ncclRemoteError, and its running
 * op leaves before the proxy is dropped. */
static void nd_proxy_abort(nd_conn *k, bool died) {
    ncclComm_t c = k->proxy;
    atomic_store_explicit(&k->gone, true, memory_order_release);
    nd_lock();
    c->aborted = true;
    c->cq->rank_aborted[c->rank] = died ? ND_DIED : ND_ABORTED;
    nd_broadcast_locked();
    while (c->executing > 0)
        nd_wait_until(0);
    nd_unlock();
    cudaStreamDestroy(k->stream); /* its worker drains the queue (ops see aborted) and exits */
    nd_lock();
    nd_comm_unref_locked(c);
    nd_conn_unref_locked(k);
    nd_unlock();
}

/* One remote rank: JOIN, then its ops until ABORT or EOF; READY and
 * errors forwarded every ND_TICK_MS. */
static void *nd_conn_main(void *arg) {
    nd_conn *k = arg;
    nd_hdr h;
    void *payload = NULL;
    ncclResult_t res = ncclInvalidUsage;
    char msg[256] = "cltest double: hub: bad JOIN";
    if (nd_recv_msg(k->fd, &h, &payload, NULL, cltest_now_ns() + ND_JOIN_MS * 1000000LL) &&
        h.type == M_JOIN && h.len == sizeof(ncclUniqueId) && h.nranks >= 1 && h.rank >= 0 &&
        h.rank < h.nranks) {
        nd_lock();
        res = nd_comm_join_locked(payload, h.nranks, h.rank, h.dev, true, &k->proxy);
        snprintf(msg, sizeof msg, "%s", nd_last_error);
        nd_unlock();
        if (res == ncclSuccess && cudaStreamCreate(&k->stream) != cudaSuccess) {
            nd_lock();
            k->proxy->cq->rank_aborted[k->proxy->rank] = ND_ABORTED;
            nd_comm_unref_locked(k->proxy);
            nd_unlock();
            res = ncclSystemError;
            snprintf(msg, sizeof msg, "cltest double: hub: cannot create a stream");
        }
    }
    free(payload);
    if (res != ncclSuccess) {
        h = (nd_hdr){.type = M_ERROR, .code = res};
        nd_piece pc = {msg, strlen(msg) + 1};
        nd_send_msg(k->fd, &k->wmu, &h, &pc, 1, NULL);
        close(k->fd);
        pthread_mutex_destroy(&k->wmu);
        free(k);
        return NULL;
    }
    ncclComm_t c = k->proxy;
    bool ready_sent = false, error_sent = false, died = true;
    for (;;) {
        struct pollfd pf = {.fd = k->fd, .events = POLLIN};
        if (poll(&pf, 1, ND_TICK_MS) > 0) {
            if (!nd_recv_msg(k->fd, &h, &payload, NULL, 0)) break; /* EOF: the process died */
            if (h.type == M_ABORT) {
                free(payload);
                died = false;
                break;
            }
            if (h.type == M_OP) nd_proxy_op_post(k, &h, payload);
            free(payload);
        }
        nd_lock();
        bool ready = !ready_sent && c->cq->joined == c->nranks;
        bool error = !error_sent && c->error != ncclSuccess;
        ncclResult_t e = c->error;
        if (error) snprintf(msg, sizeof msg, "%s", c->last_error);
        nd_unlock();
        if (ready) {
            h = (nd_hdr){.type = M_READY};
            nd_send_msg(k->fd, &k->wmu, &h, NULL, 0, &k->gone);
            ready_sent = true;
        }
        if (error) {
            h = (nd_hdr){.type = M_ERROR, .code = e};
            nd_piece pc = {msg, strlen(msg) + 1};
            nd_send_msg(k->fd, &k->wmu, &h, &pc, 1, &k->gone);
            error_sent = true;
        }
    }
    nd_proxy_abort(k, died);
    return NULL;
}

static void *nd_hub_main(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
                usleep(10000);
                continue;
            }
            return NULL;
        }
        nd_conn *k = calloc(1, sizeof *k);
        if (!k) abort();
        k->fd = fd;
        k->refs = 1;
        pthread_mutex_init(&k->wmu, NULL);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        if (pthread_create(&t, &at, nd_conn_main, k) != 0) {
            close(fd);
            pthread_mutex_destroy(&k->wmu);
            free(k);
        }
        pthread_attr_destroy(&at);
    }
}

uint64_t nd_hub_start(void) {
    pthread_mutex_lock(&nd_hub_mu);
    if (nd_hub_pid != getpid()) { /* first time, or a forked child: its own hub */
        nd_hub_pid = getpid();
        nd_hub_token = 0;
        uint64_t token =
            (uint64_t)cltest_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&token;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa;
        socklen_t len;
        nd_sock_name(&sa, &len, getpid(), token);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, len) == 0 && listen(fd, 64) == 0 &&
            pthread_create(&t, &at, nd_hub_main, (void *)(intptr_t)fd) == 0) {
            nd_hub_token = token;
        } else if (fd >= 0) {
            close(fd);
        }
        pthread_attr_destroy(&at);
    }
    uint64_t token = nd_hub_token;
    pthread_mutex_unlock(&nd_hub_mu);
    return token;
}

static void nd_id_owner(const ncclUniqueId *id, pid_t *pid, uint64_t *token) {
    uint64_t v[4];
    memcpy(v, id->internal, sizeof v);
    *pid = (pid_t)v[0];
    *token = v[3];
}

bool nd_id_remote(const ncclUniqueId *id) {
    pid_t pid;
    uint64_t token;
    nd_id_owner(id, &pid, &token);
    return pid != getpid() && token != 0;
}

/* ---- remote comms ------------------------------------------------------------------- */

/* Messages from the hub: READY, ERROR, RESULT; EOF: the hub is gone. */
static void *nd_remote_reader(void *arg) {
    ncclComm_t c = arg;
    nd_remote *rm = c->rm;
    for (;;) {
        nd_hdr h;
        void *payload;
        if (!nd_recv_msg(rm->fd, &h, &payload, &rm->stop, 0)) break;
        nd_lock();
        if (h.type == M_READY) {
            rm->ready = true;
        } else if (h.type == M_ERROR) {
            nd_set_error_locked(c, (ncclResult_t)h.code, "%s",
                                payload ? (char *)payload : "cltest double: hub error");
        } else if (h.type == M_RESULT) {
            nd_pending *p = rm->pending;
            while (p && p->opid != h.opid)
                p = p->next;
            if (p) {
                p->data = payload;
                p->len = h.len;
                p->done = true;
                payload = NULL;
            }
        }
        nd_broadcast_locked();
        nd_unlock();
        free(payload);
    }
    if (!atomic_load_explicit(&rm->stop, memory_order_acquire)) {
        nd_lock();
        rm->dead = true;
        if (!rm->ready)
            nd_set_error_locked(c, ncclRemoteError,
                                "cltest double: the hub in process %d (rank 0's) closed the "
                                "connection during init",
                                (int)rm->hub_pid);
        nd_broadcast_locked();
        nd_unlock();
    }
    return NULL;
}

ncclResult_t nd_remote_join(ncclComm_t c, const ncclUniqueId *id) {
    pid_t pid;
    uint64_t token;
    nd_id_owner(id, &pid, &token);
    struct sockaddr_un sa;
    socklen_t len;
    nd_sock_name(&sa, &len, pid, token);
    int64_t until = cltest_now_ns() + ND_CONNECT_MS * 1000000LL;
    int fd = -1, err = 0;
    for (;;) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            break;
        }
        if (connect(fd, (struct sockaddr *)&sa, len) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
        if (cltest_now_ns() > until || (err != ECONNREFUSED && err != ENOENT && err != EAGAIN))
            break;
        usleep(20000);
    }
    if (fd < 0) {
        snprintf(nd_last_error, sizeof nd_last_error,
                 "cltest double: cannot reach the hub of process %d (which made the unique id): %s",
                 (int)pid, strerror(err));
        return ncclSystemError;
    }
    nd_remote *rm = calloc(1, sizeof *rm);
    if (!rm) abort();
    rm->fd = fd;
    rm->hub_pid = pid;
    pthread_mutex_init(&rm->wmu, NULL);
    nd_hdr h = {.type = M_JOIN, .rank = c->rank, .nranks = c->nranks, .dev = c->dev};
    nd_piece pc = {id, sizeof *id};
    c->rm = rm;
    if (!nd_send_msg(fd, &rm->wmu, &h, &pc, 1, NULL) ||
        pthread_create(&rm->reader, NULL, nd_remote_reader, c) != 0) {
        snprintf(nd_last_error, sizeof nd_last_error,
                 "cltest double: cannot join through the hub of process %d", (int)pid);
        c->rm = NULL;
        close(fd);
        pthread_mutex_destroy(&rm->wmu);
        free(rm);
        return ncclSystemError;
    }
    return ncclSuccess;
}

bool nd_remote_ready_locked(ncclComm_t c) { return c->rm->ready; }

void nd_remote_run_locked(ncclComm_t c, dbl_op *op) {
    nd_remote *rm = c->rm;
    nd_pending me = {.opid = ++rm->opids};
    me.next = rm->pending;
    rm->pending = &me;
    nd_unlock();
    nd_wire_item w[256];
    nd_piece pc[257];
    int npc = 1;
    for (int i = 0; i < op->nitems; i++) {
        const dbl_item *it = &op->items[i];
        w[i] = (nd_wire_item){.kind = it->kind,
                              .dt = it->dt,
                              .op = it->op,
                              .root = it->root,
                              .peer = it->peer,
                              .count = it->count};
        size_t in = nd_item_in(it, c->rank, c->nranks);
        if (in) pc[npc++] = (nd_piece){it->send, in};
    }
    pc[0] = (nd_piece){w, (size_t)op->nitems * sizeof w[0]};
    nd_hdr h = {
        .type = M_OP, .kind = op->kind, .nitems = op->nitems, .seq = op->seq, .opid = me.opid};
    bool sent = nd_send_msg(rm->fd, &rm->wmu, &h, pc, npc, &rm->stop);
    nd_lock();
    while (!me.done && !c->aborted) {
        if (!sent || rm->dead)
            nd_set_error_locked(c, ncclRemoteError,
                                "cltest double: %s seq %d: lost the connection to the hub in "
                                "process %d (rank 0's process died?)",
                                dbl_kind_names[op->kind], (int)op->seq, (int)rm->hub_pid);
        nd_wait_until(0);
    }
    for (nd_pending **pp = &rm->pending; *pp; pp = &(*pp)->next)
        if (*pp == &me) {
            *pp = me.next;
            break;
        }
    if (me.done && !c->aborted) { /* the outputs, in item order */
        size_t off = 0;
        for (int i = 0; i < op->nitems; i++) {
            size_t out = nd_item_out(&op->items[i], c->rank, c->nranks);
            if (!out) continue;
            if (off + out > me.len) {
                nd_set_error_locked(c, ncclInternalError,
                                    "cltest double: short result from the hub");
                break;
            }
            memcpy(op->items[i].recv, (char *)me.data + off, out);
            off += out;
        }
    }
    free(me.data);
}

void nd_remote_close(ncclComm_t c) {
    nd_remote *rm = c->rm;
    nd_hdr h = {.type = M_ABORT};
    nd_send_msg(rm->fd, &rm->wmu, &h, NULL, 0, &rm->stop);
    atomic_store_explicit(&rm->stop, true, memory_order_release);
    pthread_join(rm->reader, NULL);
    close(rm->fd);
    rm->fd = -1;
}

void nd_remote_free_locked(ncclComm_t c) {
    nd_remote *rm = c->rm; /* the last reference goes after ncclCommAbort: closed */
    c->rm = NULL;
    pthread_mutex_destroy(&rm->wmu);
    free(rm);
}
