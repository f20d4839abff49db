/*
 * health.c — peer health (collie_comm_health) and the comm's event queue
 * with its fd (collie_comm_event_fd / _pop).
 *
 * Design notes
 *  - One entry per rank: a state (alive, slow, suspected, dead, left), when
 *    it was last heard from, the highest sequence number it is known to
 *    have reached. Atomics, relaxed: any thread reads them without a lock;
 *    writers are the loop and transports' reading threads. Dead and left
 *    are final: nothing brings a rank back from them.
 *  - Same host: at creation every rank appends "<rank>:<pid>:<start> " to
 *    "<prefix>host/<boot id>.<pid namespace>" ahead of the creation
 *    barrier, so once the comm is ready one get returns every same-host
 *    peer (comm_rendezvous.c posts the append). An entry counts only if
 *    its pid is the one its rank claimed at the rendezvous
 *    ("<prefix>rank/<r>": the first claim wins), so a line appended by
 *    someone else names no rank's process. Each peer's process is
 *    watched for its exit (pid_watch.c: a pidfd on the loop, one per
 *    process however many comms share it): its exit wakes us at once and
 *    costs nothing while idle.
 *  - An exit is "left" if the rank destroyed its comm first: a graceful
 *    destroy sets "<prefix>gone/<rank>" and posts "left <rank>" on the
 *    control channel before its connections close (comm_destroy.c, LEFT).
 *    On an exit the loop checks that key (one store round trip) and
 *    reports left or dead; no answer (the store lived in the dead process,
 *    say) counts as dead. Transports report what they see on links
 *    (cl_health_peer_gone: a connection closed without goodbye is dead, a
 *    BYE is left).
 *  - Silence (COLLIE_HEARTBEAT_MS > 0): the transports send a heartbeat
 *    over every link that carried nothing for a while, so a linked peer
 *    is heard at least about once per period however idle the comm is.
 *    One periodic check per comm (a timer on the loop every half period,
 *    started with the health watch, none when heartbeats are off) judges
 *    the peers heard at least once: silent past COLLIE_SUSPECT_MS / 2 is
 *    "slow" (no event), past COLLIE_SUSPECT_MS "suspected" (a
 *    peer_suspected event), and heard again "alive" (peer_back after
 *    suspected; cl_health_heard, or the check itself if it raced with
 *    it). A peer never heard has no link, hence no basis: it is not
 *    judged (its death still comes from its pidfd, a neighbour's abort
 *    notice, or the deadline). Slow is reported, never punished: neither
 *    state faults the comm (the deadline and the desync report do that,
 *    and name the suspects). Only a ready comm is judged: a failed one
 *    closed its links, and every peer would turn suspect.
 *  - A dead peer on a healthy comm is a comm fault (EPEER, kind peer_dead,
 *    the rank in its set): the policy applies as for a closed connection.
 *    A peer that left is not a fault until an operation needs it.
 *  - A peer's death or leave is an event only after the loop callback that
 *    found it returns (an active libevent event): by then the fault it
 *    causes is recorded, so whoever pops the event reads that fault.
 *  - Events: a bounded queue (8 per peer + 16, at most EVENTS_MAX: dead
 *    and left come once per peer, comm_faulted and excluded once per comm,
 *    suspected/back may repeat) under a mutex, and an eventfd
 *    that is readable exactly while the queue is not empty (written when it
 *    becomes non-empty, drained when the last is popped). A full queue
 *    drops the oldest event and counts it in the next one popped.
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "engine/engine.h"

#define EVENTS_MAX    1024 /* the queue's bound: 8 per peer + 16, at most this */
#define LEFT_CHECK_MS 500  /* bound of the store check after a peer's exit */

#define RELAXED memory_order_relaxed

typedef struct cl_peer {
    _Atomic int state;
    _Atomic int64_t heard_ns; /* 0: never */
    _Atomic uint64_t seq;
    /* loop */
    collie_comm *c;
    int rank;
    cl_pid_sub exit_sub; /* its process's exit (pid_watch.c) */
} cl_peer;

struct cl_health {
    collie_comm *c;
    cl_peer *peers;
    struct event *check_ev; /* the silence check (loop; NULL: heartbeats off) */
    int64_t suspect_ns;
    /* loop: ranks gone whose event is not out yet (each at most once: final) */
    int *gone;
    int ngone;
    bool faulted; /* the comm_faulted event waits too (after the gone ones) */
    collie_comm_event faulted_ev;
    struct event *gone_ev; /* pushes them after the callback that found them */
    pthread_mutex_t mu;    /* the queue */
    collie_comm_event *q;
    uint32_t cap, head, n;
    uint64_t dropped;
    int efd;
    bool stopped; /* loop */
};

static const char *const peer_state_names[] = {"alive", "slow", "suspected",
                                               "dead",  "left", "self"};
static const char *const event_kind_names[] = {
    "?", "peer_dead", "peer_suspected", "peer_back", "peer_left", "comm_faulted", "excluded"};

const char *collie_peer_state_name(int state) {
    return state >= 0 && state <= COLLIE_PEER_SELF ? peer_state_names[state] : "?";
}

const char *collie_event_kind_name(int kind) {
    return kind > 0 && kind <= COLLIE_EVENT_EXCLUDED ? event_kind_names[kind] : "?";
}

/* ---- life ------------------------------------------------------------------------------ */

int cl_health_init(collie_comm *c) {
    cl_health *h = calloc(1, sizeof *h);
    if (!h) return COLLIE_ENOMEM;
    h->c = c;
    h->peers = calloc((size_t)c->size, sizeof *h->peers);
    h->gone = calloc((size_t)c->size, sizeof *h->gone);
    h->cap = c->size <= (EVENTS_MAX - 16) / 8 ? (uint32_t)c->size * 8 + 16 : EVENTS_MAX;
    h->q = calloc(h->cap, sizeof *h->q);
    h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!h->peers || !h->gone || !h->q || h->efd < 0) {
        int r = h->efd < 0 && h->peers && h->gone && h->q ? COLLIE_ESYSTEM : COLLIE_ENOMEM;
        if (h->efd >= 0) close(h->efd);
        free(h->gone);
        free(h->peers);
        free(h->q);
        free(h);
        return r;
    }
    pthread_mutex_init(&h->mu, NULL);
    for (int r = 0; r < c->size; r++) {
        h->peers[r].c = c;
        h->peers[r].rank = r;
        atomic_init(&h->peers[r].state, r == c->rank ? COLLIE_PEER_SELF : COLLIE_PEER_ALIVE);
    }
    c->health = h;
    return COLLIE_OK;
}

static void health_push_gone(evutil_socket_t fd, short what, void *arg);

static void health_unwatch(cl_peer *p) { cl_pid_unwatch(&p->exit_sub); }

void cl_health_stop(collie_comm *c) {
    cl_health *h = c->health;
    if (!h || h->stopped) return;
    h->stopped = true;
    if (h->ngone || h->faulted) health_push_gone(-1, 0, h); /* not lost with the loop's event */
    if (h->check_ev) event_free(h->check_ev);
    h->check_ev = NULL;
    for (int r = 0; r < c->size; r++)
        health_unwatch(&h->peers[r]);
    if (h->gone_ev) event_free(h->gone_ev);
    h->gone_ev = NULL;
}

void cl_health_free(collie_comm *c) {
    cl_health *h = c->health;
    if (!h) return;
    close(h->efd); /* its watches went with cl_health_stop (a comm freed unstarted had none) */
    pthread_mutex_destroy(&h->mu);
    free(h->q);
    free(h->gone);
    free(h->peers);
    free(h);
    c->health = NULL;
}

/* ---- events ---------------------------------------------------------------------------- */

static bool health_defer(cl_health *h);

static void health_push(cl_health *h, int kind, int rank, int status, int fault_kind) {
    pthread_mutex_lock(&h->mu);
    if (h->n == h->cap) { /* drop the oldest */
        h->head = (h->head + 1) % h->cap;
        h->n--;
        h->dropped++;
    }
    collie_comm_event *ev = &h->q[(h->head + h->n) % h->cap];
    *ev = (collie_comm_event){.size = sizeof *ev,
                              .kind = kind,
                              .rank = rank,
                              .status = status,
                              .fault_kind = fault_kind,
                              .time_ns = cl_now_ns()};
    if (h->n++ == 0) {
        uint64_t one = 1;
        ssize_t w = write(h->efd, &one, sizeof one); /* cannot fill: drained at empty */
        (void)w;
    }
    pthread_mutex_unlock(&h->mu);
}

int collie_comm_event_fd(collie_comm *c) {
    if (!c) return cl_set_last_error(COLLIE_EINVAL, "collie_comm_event_fd: comm is NULL");
    return c->health ? c->health->efd : COLLIE_ESTATE;
}

int collie_comm_event_pop(collie_comm *c, collie_comm_event *ev) {
    if (!c || !ev || ev->size < offsetof(collie_comm_event, dropped))
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_event_pop: %s",
                                 !c    ? "comm is NULL"
                                 : !ev ? "event is NULL"
                                       : "ev->size is too small (set it to "
                                         "sizeof(collie_comm_event))");
    cl_health *h = c->health;
    if (!h) return COLLIE_INPROGRESS;
    pthread_mutex_lock(&h->mu);
    if (h->n == 0) {
        pthread_mutex_unlock(&h->mu);
        return COLLIE_INPROGRESS;
    }
    collie_comm_event got = h->q[h->head];
    got.dropped = h->dropped;
    h->dropped = 0;
    h->head = (h->head + 1) % h->cap;
    if (--h->n == 0) {
        uint64_t v;
        ssize_t r = read(h->efd, &v, sizeof v); /* not readable while empty */
        (void)r;
    }
    pthread_mutex_unlock(&h->mu);
    size_t size = ev->size < sizeof got ? ev->size : sizeof got;
    got.size = ev->size;
    memcpy(ev, &got, size);
    return COLLIE_OK;
}

void cl_health_comm_faulted(collie_comm *c, int status, const cl_fault *f) {
    cl_health *h = c->health;
    if (!h) return;
    /* on the loop, after the deaths this callback found (their events first) */
    h->faulted_ev = (collie_comm_event){.kind = COLLIE_EVENT_COMM_FAULTED,
                                        .rank = f->origin,
                                        .status = status,
                                        .fault_kind = f->kind};
    if (cl_engine_on_loop(c->engine) && health_defer(h))
        h->faulted = true;
    else
        health_push(h, COLLIE_EVENT_COMM_FAULTED, f->origin, status, f->kind);
}

void cl_health_excluded(collie_comm *c, int by) {
    if (c->health)
        health_push(c->health, COLLIE_EVENT_EXCLUDED, by, COLLIE_ENOTMEMBER, COLLIE_FAULT_NONE);
}

/* ---- states ---------------------------------------------------------------------------- */

void cl_health_heard(collie_comm *c, int rank, uint64_t seq) {
    cl_health *h = c->health;
    if (!h || rank < 0 || rank >= c->size) return;
    cl_peer *p = &h->peers[rank];
    atomic_store_explicit(&p->heard_ns, cl_now_ns(), RELAXED);
    if (seq > atomic_load_explicit(&p->seq, RELAXED)) atomic_store_explicit(&p->seq, seq, RELAXED);
    int st = atomic_load_explicit(&p->state, RELAXED);
    if ((st == COLLIE_PEER_SUSPECTED || st == COLLIE_PEER_SLOW) &&
        atomic_compare_exchange_strong(&p->state, &st, COLLIE_PEER_ALIVE) &&
        st == COLLIE_PEER_SUSPECTED)
        health_push(h, COLLIE_EVENT_PEER_BACK, rank, COLLIE_OK, COLLIE_FAULT_NONE);
}

void cl_health_suspect(collie_comm *c, int rank) {
    cl_health *h = c->health;
    if (!h || rank < 0 || rank >= c->size || rank == c->rank) return;
    cl_peer *p = &h->peers[rank];
    int st = atomic_load_explicit(&p->state, RELAXED);
    if ((st == COLLIE_PEER_ALIVE || st == COLLIE_PEER_SLOW) &&
        atomic_compare_exchange_strong(&p->state, &st, COLLIE_PEER_SUSPECTED))
        health_push(h, COLLIE_EVENT_PEER_SUSPECTED, rank, COLLIE_OK, COLLIE_FAULT_NONE);
}

/* The gone ranks' events, once the callback that found them has recorded
 * the fault they cause (loop) */
static void health_push_gone(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    cl_health *h = arg;
    for (int i = 0; i < h->ngone; i++) {
        int r = h->gone[i];
        int st = atomic_load_explicit(&h->peers[r].state, RELAXED);
        health_push(h, st == COLLIE_PEER_LEFT ? COLLIE_EVENT_PEER_LEFT : COLLIE_EVENT_PEER_DEAD, r,
                    COLLIE_OK, COLLIE_FAULT_NONE);
    }
    h->ngone = 0;
    if (h->faulted) {
        const collie_comm_event *e = &h->faulted_ev;
        health_push(h, e->kind, e->rank, e->status, e->fault_kind);
        h->faulted = false;
    }
}

/* Defer an event to after this loop callback (false: do it now) */
static bool health_defer(cl_health *h) {
    collie_comm *c = h->c;
    if (h->stopped || !cl_engine_on_loop(c->engine)) return false;
    if (!h->gone_ev) h->gone_ev = event_new(cl_engine_base(c->engine), -1, 0, health_push_gone, h);
    if (!h->gone_ev) return false;
    event_active(h->gone_ev, EV_TIMEOUT, 0);
    return true;
}

bool cl_health_peer_gone(collie_comm *c, int rank, int state) {
    cl_health *h = c->health;
    if (!h || rank < 0 || rank >= c->size || rank == c->rank) return false;
    cl_peer *p = &h->peers[rank];
    int st = atomic_load_explicit(&p->state, RELAXED);
    do {
        if (st == COLLIE_PEER_DEAD || st == COLLIE_PEER_LEFT) return false; /* final */
    } while (!atomic_compare_exchange_weak(&p->state, &st, state));
    /* the event goes out after this loop callback: a reader that pops it
     * finds the comm's fault (recorded next, by our caller) already there */
    h->gone[h->ngone++] = rank; /* final once: at most size - 1 entries */
    if (!health_defer(h)) health_push_gone(-1, 0, h);
    return true;
}

/* The periodic silence check (see the design notes): O(size) relaxed
 * loads per half heartbeat period. */
static void health_on_check(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    cl_health *h = arg;
    collie_comm *c = h->c;
    if (h->stopped || atomic_load(&c->state) != CL_COMM_READY) return;
    int64_t now = cl_now_ns();
    for (int r = 0; r < c->size; r++) {
        cl_peer *p = &h->peers[r];
        int64_t heard = atomic_load_explicit(&p->heard_ns, RELAXED);
        if (r == c->rank || heard == 0) continue; /* no link: no basis */
        int64_t silent = now - heard;
        int want = silent > h->suspect_ns       ? COLLIE_PEER_SUSPECTED
                   : silent > h->suspect_ns / 2 ? COLLIE_PEER_SLOW
                                                : COLLIE_PEER_ALIVE;
        int st = atomic_load_explicit(&p->state, RELAXED);
        if (st == want || st >= COLLIE_PEER_DEAD) continue; /* dead and left are final */
        if (want == COLLIE_PEER_SLOW && st == COLLIE_PEER_SUSPECTED) continue; /* until heard */
        if (!atomic_compare_exchange_strong(&p->state, &st, want)) continue;   /* next time */
        if (want == COLLIE_PEER_SUSPECTED)
            health_push(h, COLLIE_EVENT_PEER_SUSPECTED, r, COLLIE_OK, COLLIE_FAULT_NONE);
        else if (want == COLLIE_PEER_ALIVE && st == COLLIE_PEER_SUSPECTED) /* heard as we judged */
            health_push(h, COLLIE_EVENT_PEER_BACK, r, COLLIE_OK, COLLIE_FAULT_NONE);
    }
}

static void health_check_start(cl_health *h) {
    const cl_config *cfg = cl_config_get();
    if (cfg->heartbeat_ms <= 0 || h->check_ev) return;
    h->suspect_ns = (int64_t)cfg->suspect_ms * CL_NS_PER_MS;
    int64_t period_us = (int64_t)cfg->heartbeat_ms * 500; /* half a heartbeat period */
    struct timeval tv = {.tv_sec = period_us / 1000000, .tv_usec = period_us % 1000000};
    h->check_ev = event_new(cl_engine_base(h->c->engine), -1, EV_PERSIST, health_on_check, h);
    if (h->check_ev && event_add(h->check_ev, &tv) != 0) {
        event_free(h->check_ev);
        h->check_ev = NULL;
    }
    if (!h->check_ev) CL_CWARN("health", h->c, "no memory for the silence check: none is made");
}

bool cl_health_linked(const collie_comm *c, int rank) {
    const cl_health *h = c->health;
    return h && rank >= 0 && rank < c->size &&
           atomic_load_explicit(&((cl_health *)h)->peers[rank].heard_ns, RELAXED) != 0;
}

int cl_health_process_alive(const collie_comm *c, int rank) {
    const cl_health *h = c->health;
    if (!h || rank < 0 || rank >= c->size) return -1;
    return cl_pid_sub_alive(&h->peers[rank].exit_sub);
}

int cl_health_state(const collie_comm *c, int rank) {
    const cl_health *h = c->health;
    if (!h || rank < 0 || rank >= c->size) return COLLIE_PEER_ALIVE;
    return atomic_load_explicit(&h->peers[rank].state, RELAXED);
}

void cl_health_add_peers(collie_comm *c, cl_fault *f, int state) {
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && cl_health_state(c, r) == state) cl_fault_add(f, r);
}

int collie_comm_health(const collie_comm *c, collie_peer_health *peers, int n) {
    if (!c || (!peers && n > 0) || n < 0)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_health: %s",
                                 !c      ? "comm is NULL"
                                 : n < 0 ? "n is negative"
                                         : "peers is NULL");
    const cl_health *h = c->health;
    int m = n < c->size ? n : c->size;
    int64_t now = cl_now_ns();
    /* a collective completed here: every member had reached its number */
    uint64_t done = atomic_load_explicit(&((collie_comm *)c)->last_completed, RELAXED);
    for (int r = 0; r < m; r++) {
        const cl_peer *p = h ? &h->peers[r] : NULL;
        int64_t heard = p ? atomic_load_explicit(&((cl_peer *)p)->heard_ns, RELAXED) : 0;
        uint64_t seq = p ? atomic_load_explicit(&((cl_peer *)p)->seq, RELAXED) : 0;
        peers[r].state = cl_health_state(c, r);
        peers[r].heard_ago_ms = r == c->rank ? 0 : heard ? (now - heard) / CL_NS_PER_MS : -1;
        peers[r].seq = r == c->rank ? atomic_load(&((collie_comm *)c)->last_posted)
                                    : (seq > done ? seq : done);
    }
    return m;
}

/* ---- same host: the peers' processes ------------------------------------------------- */

/* boot id + pid namespace: pids mean the same process only within both */
static bool health_host_key(char *buf, size_t len) {
    char boot[64] = "";
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, boot, sizeof boot - 1);
    close(fd);
    if (n <= 0) return false;
    boot[n] = '\0';
    boot[strcspn(boot, "\n")] = '\0';
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) return false;
    snprintf(buf, len, "%s.%llu", boot, (unsigned long long)st.st_ino);
    return true;
}

void cl_health_publish(collie_comm *c, int32_t timeout_ms) {
    char key[256], val[96];
    int k = snprintf(key, sizeof key, "%shost/", c->prefix);
    if (!health_host_key(key + k, sizeof key - (size_t)k)) return;
    pid_t pid = getpid();
    int n = snprintf(val, sizeof val, "%d:%d:%llu ", c->rank, (int)pid, cl_pid_start_time(pid));
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = timeout_ms;
    o.cb = cl_health_release_cb; /* best effort: a rank missing from it is not watched */
    collie_work *w;
    (void)collie_store_post_append(c->store, key, val, (size_t)n, &o, &w);
}

void cl_health_release_cb(collie_work *w, void *arg) {
    (void)arg;
    collie_work_release(w);
}

typedef struct health_exit {
    collie_comm *c;
    int rank;
} health_exit;

static void health_dead(collie_comm *c, int rank, const char *how) {
    if (!cl_health_peer_gone(c, rank, COLLIE_PEER_DEAD)) return;
    if (atomic_load(&c->state) != CL_COMM_READY) return;
    cl_fault f;
    cl_fault_init(&f, COLLIE_FAULT_PEER_DEAD, COLLIE_FAULT_VIEW_LOCAL, c->rank);
    cl_fault_add(&f, rank);
    cl_comm_fault_data(c, COLLIE_EPEER, &f, true, "rank %d %s", rank, how);
}

static void health_on_gone_checked(collie_work *w, void *arg) {
    health_exit *x = arg;
    collie_comm *c = x->c;
    int64_t left = 0;
    bool ok = collie_work_result(w) == COLLIE_OK && collie_store_work_int(w, &left) == COLLIE_OK;
    collie_work_release(w);
    if (!c->destroyed) {
        if (ok && left)
            cl_health_peer_gone(c, x->rank, COLLIE_PEER_LEFT);
        else /* no record, or no answer (the store may have lived in it) */
            health_dead(c, x->rank, "died (its process exited)");
    }
    cl_comm_release(c);
    free(x);
}

/* A watched peer's process exited (loop): did it leave first? */
static void health_on_exit(cl_pid_sub *sub) {
    cl_peer *p = cl_container_of(sub, cl_peer, exit_sub);
    collie_comm *c = p->c;
    cl_health *h = c->health;
    int rank = p->rank;
    if (h->stopped || cl_health_state(c, rank) >= COLLIE_PEER_DEAD) return;
    health_exit *x = malloc(sizeof *x);
    char key[200];
    snprintf(key, sizeof key, "%sgone/%d", c->prefix, rank);
    const char *keys[] = {key};
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = LEFT_CHECK_MS;
    o.cb = health_on_gone_checked;
    o.cb_arg = x;
    collie_work *w;
    if (x) {
        x->c = c;
        x->rank = rank;
        cl_comm_hold(c);
        if (collie_store_post_check(c->store, keys, 1, &o, &w) == COLLIE_OK) return;
        cl_comm_release(c);
        free(x);
    }
    health_dead(c, rank, "died (its process exited)");
}

static void health_watch(collie_comm *c, int rank, pid_t pid, unsigned long long start) {
    cl_health *h = c->health;
    cl_peer *p = &h->peers[rank];
    if (p->exit_sub.watch || h->stopped) return;
    p->exit_sub.exited = health_on_exit;
    if (cl_pid_watch(c->engine, pid, start, &p->exit_sub) == COLLIE_ENOENT)
        health_dead(c, rank, "died (its process is gone)");
}

/* The same-host entries read, waiting for their ranks' claims */
typedef struct host_entry {
    int rank, pid;
    unsigned long long start;
} host_entry;

typedef struct hosts_req {
    collie_comm *c;
    int n;
    host_entry e[];
} hosts_req;

/* "pid P on host H (handle N)": P, or -1 */
static int health_claim_pid(const void *val, size_t len) {
    char buf[128];
    int pid = -1;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1),
             (const char *)val);
    return sscanf(buf, "pid %d on host ", &pid) == 1 ? pid : -1;
}

/* Each entry is watched only if its pid is the one its rank claimed at the
 * rendezvous ("<prefix>rank/<r>", first claim wins): an entry anyone else
 * appended names no rank's process. */
static void health_on_claims(collie_work *w, void *arg) {
    hosts_req *q = arg;
    collie_comm *c = q->c;
    bool ok = collie_work_result(w) == COLLIE_OK;
    for (int i = 0; ok && i < q->n && !c->destroyed && c->health && !c->health->stopped; i++) {
        const void *val;
        size_t len;
        if (collie_store_work_value_at(w, (size_t)i, &val, &len) == COLLIE_OK &&
            health_claim_pid(val, len) == q->e[i].pid)
            health_watch(c, q->e[i].rank, (pid_t)q->e[i].pid, q->e[i].start);
    }
    collie_work_release(w);
    cl_comm_release(c);
    free(q);
}

/* "rank:pid:start " ... as cl_health_publish writes them, into q (other
 * processes' entries only: ranks in this very process die with it) */
static hosts_req *health_parse_hosts(collie_comm *c, const char *s, const char *end) {
    hosts_req *q = calloc(1, sizeof *q + (size_t)c->size * sizeof q->e[0]);
    if (!q) return NULL;
    q->c = c;
    while (s < end && q->n < c->size) {
        char item[80];
        const char *sp = memchr(s, ' ', (size_t)(end - s));
        size_t n = (size_t)((sp ? sp : end) - s);
        host_entry h;
        if (n > 0 && n < sizeof item) {
            memcpy(item, s, n);
            item[n] = '\0';
            if (sscanf(item, "%d:%d:%llu", &h.rank, &h.pid, &h.start) == 3 && h.rank >= 0 &&
                h.rank < c->size && h.rank != c->rank && h.pid > 0 && h.pid != getpid())
                q->e[q->n++] = h;
        }
        if (!sp) break;
        s = sp + 1;
    }
    return q;
}

static void health_on_hosts(collie_work *w, void *arg) {
    collie_comm *c = arg;
    const void *val;
    size_t len;
    hosts_req *q = NULL;
    if (!c->destroyed && c->health && !c->health->stopped && collie_work_result(w) == COLLIE_OK &&
        collie_store_work_value(w, &val, &len) == COLLIE_OK)
        q = health_parse_hosts(c, val, (const char *)val + len);
    collie_work_release(w);
    char(*keys)[160] = q && q->n ? calloc((size_t)q->n, sizeof *keys) : NULL;
    const char **kp = keys ? calloc((size_t)q->n, sizeof *kp) : NULL;
    collie_work *mw;
    bool handed = false; /* to the claims' callback, with c's reference */
    if (kp) {
        for (int i = 0; i < q->n; i++) {
            snprintf(keys[i], sizeof keys[i], "%srank/%d", c->prefix, q->e[i].rank);
            kp[i] = keys[i];
        }
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.timeout_ms = 2000; /* every rank claimed before the barrier */
        o.cb = health_on_claims;
        o.cb_arg = q;
        handed = collie_store_post_multi_get(c->store, kp, (size_t)q->n, &o, &mw) == COLLIE_OK;
    }
    free(kp);
    free(keys);
    if (!handed) {
        free(q);
        cl_comm_release(c);
    }
}

void cl_health_start(collie_comm *c) {
    char key[256];
    int k = snprintf(key, sizeof key, "%shost/", c->prefix);
    if (!c->health || c->health->stopped) return;
    health_check_start(c->health);
    if (!health_host_key(key + k, sizeof key - (size_t)k)) return;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 2000; /* it is there: this rank appended to it before the barrier */
    o.cb = health_on_hosts;
    o.cb_arg = c;
    collie_work *w;
    cl_comm_hold(c);
    if (collie_store_post_get(c->store, key, &o, &w) != COLLIE_OK) cl_comm_release(c);
}
