/*
 * engine.c — the progress thread, its event base and the command queue.
 *
 * Design notes
 *  - The event_base and every libevent object on it belong to the progress
 *    thread ("loop thread"). Other threads reach it through the command
 *    queue: a mutex-protected intrusive FIFO plus one eventfd. The eventfd
 *    is written at most once between two drains of the queue (wake_pending),
 *    so a burst of posts costs one wake-up, and not at all while the loop
 *    spins (it polls `queued` every turn); the write is made under qmu: a
 *    poster's last touch of the engine is its unlock, before the loop can
 *    take its command, so once the loop ran a foreign thread's command (a
 *    work's retire, which destroy waits for), the fd can be closed and the
 *    engine freed.
 *    The one exception to the loop owning its objects is caller-driven
 *    progress (assist.c): the loop's role has a lock, progress_mu, which
 *    the progress thread holds except between two turns of a spinning
 *    loop, where a waiting, testing or posting thread may take it with a
 *    try-lock for one step. While a waiter polls, the spinning loop steps
 *    back (a short sleep instead of sched_yield) so that on a busy machine
 *    the waiter, which drives the step itself, has the core.
 *  - Both ends of an engine's life are here: collie_engine_create starts
 *    it with the works' hooks (cl_work_engine_hooks, defined by
 *    work/registry.c: the engine includes no header of work/), and
 *    collie_engine_destroy ends it.
 *  - Shutdown (collie_engine_destroy): `closing` is set (new works are
 *    refused), the loop is broken, then on the loop thread: drain commands,
 *    shut residents down (they close their sockets), fail every tracked work
 *    with COLLIE_ECLOSED, keep draining until every work is retired (a
 *    foreign finisher may still be posting its retire command; at most
 *    2 s, then logged), mark the queue stopped and run what was posted
 *    meanwhile, free every libevent object, free the base. The destroying
 *    thread joins the progress thread, bounded by CL_ENGINE_CALL_TIMEOUT_MS
 *    (10 s: a callback that never returns leaks the engine and destroy
 *    returns COLLIE_ETIMEDOUT), stops the monitor, waits (bounded) for
 *    helpers to leave, and only then frees the engine.
 *  - Commands run in slices of CL_LOOP_SLICE: a burst of a million posts
 *    is moved to the loop's backlog and run a slice per loop step, with the
 *    sockets polled between slices (more_ev, a zero timeout), so a deep
 *    queue never hides a dead peer or an abort notice. Retirement and the
 *    deadline sweep (work/registry.c) and a comm's failing of its works
 *    (comm/comm.c) are sliced the same way.
 *  - Lock order: progress_mu (the loop's role) before qmu; qmu is a leaf
 *    lock: no callback runs while it is held (the wake-up write, a
 *    non-blocking eventfd, is the one system call).
 *  - SIGPIPE and the other asynchronous signals are blocked in the progress
 *    and monitor threads so the application's handlers run on its threads
 *    and a dead socket gives EPIPE, not a signal.
 *  - exit() with engines running: a process may end (exit(), a return from
 *    main) while progress threads still run handshakes (RAND_bytes) and
 *    frame MACs. libcrypto's own exit handler (OPENSSL_cleanup) would free
 *    its locks and providers under them (a SIGSEGV instead of the process's
 *    exit status), so libcrypto is initialised once, before the first
 *    engine's thread starts, with OPENSSL_INIT_NO_ATEXIT: the process is
 *    ending anyway, and the kernel reclaims what the cleanup would free.
 *    This works only if collie is the first to initialise libcrypto (an
 *    application that used OpenSSL before creating an engine has had its
 *    handler registered already; it can call OPENSSL_init_crypto with that
 *    flag itself first). Nothing else exit-time touches a running loop:
 *    libevent registers no exit handler (the bases are NOLOCK, no evthread
 *    globals) and collie registers none.
 */
#include "engine/engine_impl.h"

#include <errno.h>
#include <event2/event.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "engine/common.h"
#include "engine/config.h"
#include "engine/log.h"

_Thread_local collie_engine *cl_tls_loop_engine;
_Thread_local bool cl_tls_helping;

/* How long the loop keeps polling without seeing a work complete or start
 * before it goes back to sleeping in epoll. */
#define CL_SPIN_WINDOW_NS (20 * CL_NS_PER_MS)
/* ... when this host's ranks outnumber its cores (COLLIE_SPIN=auto): every
 * turn yields the core anyway, but an idle rank stops sooner */
#define CL_SPIN_WINDOW_SHARED_NS (2 * CL_NS_PER_MS)
/* How long a spinning loop steps back while a waiter polls and helps it
 * (the waiter runs the loop's step meanwhile; this bounds how late the
 * progress thread's own work - callbacks, retirement - can be). */
#define CL_BACKOFF_NS (50 * 1000)

bool cl_engine_on_loop(const collie_engine *e) { return e != NULL && cl_tls_loop_engine == e; }

bool cl_engine_on_progress_thread(const collie_engine *e) {
    return cl_engine_on_loop(e) && !cl_tls_helping;
}

bool collie_engine_on_progress_thread(const collie_engine *e) {
    return cl_engine_on_progress_thread(e);
}

bool cl_engine_closing(const collie_engine *e) {
    return atomic_load_explicit(&((collie_engine *)e)->closing, memory_order_acquire);
}

struct event_base *cl_engine_base(collie_engine *e) {
    return e->base;
}

const char *cl_engine_name(const collie_engine *e) { return e->name; }

uint64_t cl_engine_stall_count(const collie_engine *e) {
    return atomic_load(&((collie_engine *)e)->stalls);
}

uint32_t cl_engine_residents(const collie_engine *e) {
    return atomic_load_explicit(&((collie_engine *)e)->nresidents, memory_order_relaxed);
}

void *cl_engine_hooks_state(const collie_engine *e) { return e->hooks_state; }

static size_t engine_run_completions(collie_engine *e) {
    return e->hooks->run_completions(e->hooks_state, CL_LOOP_SLICE);
}

/* shutdown: everything, now */
static void engine_run_all(collie_engine *e) {
    cl_engine_drain_cmds(e, SIZE_MAX, false);
    e->hooks->run_completions(e->hooks_state, SIZE_MAX);
}

void cl_event_soon(struct event *ev) {
    static const struct timeval now = {0, 0};
    event_add(ev, &now);
}

const char *cl_engine_set_activity(collie_engine *e, const char *what) {
    return atomic_exchange_explicit(&e->activity, what, memory_order_relaxed);
}

/* fork() children of this process, counted in the child (pthread_atfork):
 * an engine made before a fork has no progress thread in the child */
static _Atomic unsigned engine_forks;
static void engine_on_fork_child(void) {
    atomic_fetch_add_explicit(&engine_forks, 1, memory_order_relaxed);
}

bool cl_engine_forked(const collie_engine *e) {
    return e->forks != atomic_load_explicit(&engine_forks, memory_order_relaxed);
}

int cl_engine_forked_error(const collie_engine *e, const char *what) {
    return cl_set_last_error(COLLIE_ESTATE,
                             "%s: engine '%s' was made by process %d, and this process (%d) is a "
                             "fork of it: its progress thread does not run here. Make a new "
                             "engine in the child (the parent's is left alone)",
                             what, e->name, (int)e->pid, (int)getpid());
}

/* ---- command queue ------------------------------------------------------ */

int cl_engine_post_cmd(collie_engine *e, cl_cmd *c) {
    if (cl_engine_forked(e)) return cl_engine_forked_error(e, "collie");
    pthread_mutex_lock(&e->qmu);
    if (e->stopped) {
        pthread_mutex_unlock(&e->qmu);
        return COLLIE_ECLOSED;
    }
    cl_list_push_back(&e->queue, &c->node);
    /* a spinning loop polls the queue itself: no system call needed */
    if (!e->wake_pending && !atomic_load_explicit(&e->spinning, memory_order_seq_cst)) {
        e->wake_pending = true;
        /* under qmu: the loop takes c (under qmu) only after this write, so
         * once c has run, this thread is done with the engine's fd - the
         * one destroy closes, and whose number another file may get */
        uint64_t one = 1;
        ssize_t n = write(e->wake_fd, &one, sizeof one);
        CL_UNUSED(n); /* EAGAIN: the counter is already non-zero, the loop wakes anyway */
    }
    atomic_store_explicit(&e->queued, true, memory_order_release);
    pthread_mutex_unlock(&e->qmu);
    return COLLIE_OK;
}

/* Run queued commands, at most `budget` of them: the queue is appended to
 * the backlog, which keeps the order; what is left runs in the next loop
 * step (more_ev). A helper runs only the commands at the head that allow
 * it and leaves completions to the progress thread. Returns how many ran. */
size_t cl_engine_drain_cmds(collie_engine *e, size_t budget, bool helping) {
    size_t ran = 0;
    for (;;) {
        if (ran < budget || cl_list_empty(&e->backlog)) {
            pthread_mutex_lock(&e->qmu);
            cl_list_append_all(&e->backlog, &e->queue);
            e->wake_pending = false;
            atomic_store_explicit(&e->queued, false, memory_order_relaxed);
            pthread_mutex_unlock(&e->qmu);
        }
        if (cl_list_empty(&e->backlog)) break;
        cl_cmd *c = cl_list_first(&e->backlog, cl_cmd, node);
        if (ran >= budget || (helping && !c->assist_ok)) {
            cl_event_soon(e->more_ev);
            break;
        }
        cl_list_remove(&c->node); /* before fn: it may free or re-post c */
        const char *prev = cl_engine_set_activity(e, "engine command");
        c->fn(c);
        cl_engine_set_activity(e, prev);
        /* retire what this command finished before running the next one,
         * so a command queued after a completion sees it retired (up to a
         * slice: a command that failed a deep queue retires it in steps) */
        if (!helping) engine_run_completions(e);
        ran++;
    }
    return ran;
}

static void engine_on_more(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    cl_engine_drain_cmds(arg, CL_LOOP_SLICE, cl_tls_helping);
}

static void engine_on_wake(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(what);
    collie_engine *e = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof v);
    CL_UNUSED(n);
    cl_engine_drain_cmds(e, CL_LOOP_SLICE, cl_tls_helping);
    engine_run_completions(e);
    if (atomic_load_explicit(&e->stop_requested, memory_order_acquire))
        event_base_loopbreak(e->base);
}

/* ---- synchronous calls --------------------------------------------------- */

typedef struct engine_call {
    cl_cmd cmd;
    void (*fn)(void *);
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    _Atomic int refs; /* caller + loop: whoever drops the last frees */
} engine_call;

static void engine_call_release(engine_call *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c);
    }
}

static void engine_call_run(cl_cmd *cmd) {
    engine_call *c = cl_container_of(cmd, engine_call, cmd);
    c->fn(c->arg);
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    engine_call_release(c);
}

int cl_engine_call(collie_engine *e, void (*fn)(void *), void *arg, int32_t timeout_ms) {
    if (cl_engine_on_loop(e)) {
        fn(arg);
        return COLLIE_OK;
    }
    engine_call *c = calloc(1, sizeof *c);
    if (!c) return COLLIE_ENOMEM;
    c->fn = fn;
    c->arg = arg;
    c->cmd.fn = engine_call_run;
    atomic_init(&c->refs, 2);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&c->mu, NULL);
    int posted = cl_engine_post_cmd(e, &c->cmd);
    if (posted != COLLIE_OK) {
        atomic_store(&c->refs, 1);
        engine_call_release(c);
        return posted; /* ECLOSED, or ESTATE (a forked child) with its message */
    }
    int64_t until = cl_deadline_ns(cl_now_ns(), timeout_ms);
    struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
    int rc = COLLIE_OK;
    pthread_mutex_lock(&c->mu);
    while (!c->done) {
        int r = (until == INT64_MAX) ? pthread_cond_wait(&c->cv, &c->mu)
                                     : pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (r == ETIMEDOUT && !c->done) {
            rc = COLLIE_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == COLLIE_ETIMEDOUT)
        CL_ERROR("engine", "%s: the progress loop did not run a call within %d ms (stuck in %s)",
                 e->name, timeout_ms, atomic_load(&e->activity));
    engine_call_release(c);
    return rc;
}

/* ---- residents ------------------------------------------------------------ */

int cl_engine_add_resident(collie_engine *e, cl_resident *r) {
    if (cl_engine_closing(e)) return COLLIE_ECLOSED;
    cl_list_push_front(&e->residents, &r->node);
    atomic_fetch_add_explicit(&e->nresidents, 1, memory_order_relaxed);
    return COLLIE_OK;
}

void cl_engine_remove_resident(collie_engine *e, cl_resident *r) {
    if (!cl_list_linked(&r->node)) return;
    cl_list_remove(&r->node);
    atomic_fetch_sub_explicit(&e->nresidents, 1, memory_order_relaxed);
}

/* ---- timers --------------------------------------------------------------- */

static void engine_on_heartbeat(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    collie_engine *e = arg;
    /* the stall monitor watches the progress thread, not its helpers */
    if (cl_engine_on_progress_thread(e))
        atomic_store_explicit(&e->heartbeat_ns, cl_now_ns(), memory_order_release);
}

/* ---- the progress thread --------------------------------------------------- */

void cl_block_async_signals(void) {
    sigset_t set;
    sigfillset(&set);
    /* synchronous faults must still reach their handlers */
    sigdelset(&set, SIGSEGV);
    sigdelset(&set, SIGBUS);
    sigdelset(&set, SIGFPE);
    sigdelset(&set, SIGILL);
    sigdelset(&set, SIGABRT);
    sigdelset(&set, SIGTRAP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void engine_shutdown_on_loop(collie_engine *e) {
    engine_run_all(e);
    cl_resident *r;
    while ((r = cl_list_first(&e->residents, cl_resident, node))) {
        cl_engine_remove_resident(e, r);
        const char *prev = cl_engine_set_activity(e, r->what ? r->what : "resident shutdown");
        r->shutdown(r);
        cl_engine_set_activity(e, prev);
    }
    e->hooks->fail_all(e->hooks_state, COLLIE_ECLOSED, "the engine is shutting down");
    /* Every tracked work is now finished; a foreign thread that won a claim
     * may still be about to post its retire command. Wait for them, bounded. */
    int64_t give_up = cl_now_ns() + 2000 * CL_NS_PER_MS;
    for (;;) {
        engine_run_all(e);
        size_t pending = e->hooks->pending(e->hooks_state);
        if (pending == 0) break;
        if (cl_now_ns() > give_up) {
            CL_ERROR("engine", "%s: %zu works were never retired at shutdown", e->name, pending);
            break;
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&e->qmu);
    e->stopped = true;
    cl_list left; /* posted between the last drain and `stopped`: run them */
    cl_list_move_all(&left, &e->queue);
    pthread_mutex_unlock(&e->qmu);
    cl_cmd *c;
    while ((c = cl_list_first(&left, cl_cmd, node))) {
        cl_list_remove(&c->node);
        c->fn(c);
    }
    e->hooks->run_completions(e->hooks_state, SIZE_MAX);
}

/* Spin (poll) while works start and complete; block after spin_window of
 * no visible progress (an idle rank or a hung peer must not cost a core). */
static bool engine_should_spin(collie_engine *e) {
    /* also right after the last work completed: the next one usually
     * follows at once (a thread woken from idle takes tens of us) */
    if (e->spin_ns <= 0) return false;
    int64_t now = cl_now_ns();
    uint64_t sig = e->hooks->progress(e->hooks_state);
    if (sig != e->spin_sig) { /* progress: (re)start the window */
        e->spin_sig = sig;
        e->spin_since = now;
    }
    if (now - e->spin_since >= e->spin_ns) return false; /* until progress is seen again */
    atomic_store_explicit(&e->spinning, true, memory_order_seq_cst);
    return true;
}

static void *engine_thread_main(void *arg) {
    collie_engine *e = arg;
    cl_block_async_signals();
    char tname[16];
    snprintf(tname, sizeof tname, "cl-%.12s", e->name);
    pthread_setname_np(pthread_self(), tname);
    /* the loop's role is ours except between two turns of a spinning loop
     * (helpers take it there, engine/assist.c) */
    pthread_mutex_lock(&e->progress_mu);
    cl_tls_loop_engine = e;
    atomic_store(&e->heartbeat_ns, cl_now_ns());
    while (!atomic_load_explicit(&e->stop_requested, memory_order_acquire)) {
        if (engine_should_spin(e)) {
            /* works are in flight: poll instead of sleeping (a sleeping
             * thread takes tens of microseconds to wake on these VMs).
             * One pass: NONBLOCK alone keeps looping while any socket is
             * ready, and busy sockets would starve the command queue. */
            event_base_loop(e->base, EVLOOP_NONBLOCK | EVLOOP_ONCE);
            if (atomic_load_explicit(&e->queued, memory_order_acquire)) {
                cl_engine_drain_cmds(e, CL_LOOP_SLICE, false);
                engine_run_completions(e);
            }
            bool sockets = cl_engine_run_pollers(e, false);
            atomic_store_explicit(&e->heartbeat_ns, cl_now_ns(), memory_order_release);
            /* let a waiter or another rank on this core run, and a thread
             * that waits or posts take the loop's role meanwhile; while a
             * waiter polls (and helps), step back further so that on a
             * busy machine it has the core: it runs this loop's step. Not
             * with TCP peers: there both threads reading the sockets is
             * faster (4 ranks on 2 cores: 45 us per 4 B allreduce against
             * 105-155 us stepping back; shared memory: 2 us against 5-9) */
            pthread_mutex_unlock(&e->progress_mu);
            if (!sockets && atomic_load_explicit(&e->polling_waiters, memory_order_relaxed) > 0) {
                struct timespec ts = {0, CL_BACKOFF_NS};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
            /* helpers keep out while we wait for it: a mutex is not fair,
             * and a steady stream of try-locks must not starve the loop */
            atomic_store_explicit(&e->loop_wants, true, memory_order_relaxed);
            pthread_mutex_lock(&e->progress_mu);
            atomic_store_explicit(&e->loop_wants, false, memory_order_relaxed);
            continue;
        }
        if (atomic_load_explicit(&e->spinning, memory_order_relaxed)) {
            /* stop spinning: producers write the eventfd again; anything
             * posted while they thought we spun is drained here, and the
             * pollers arrange to be woken from now on */
            atomic_store_explicit(&e->spinning, false, memory_order_seq_cst);
            cl_engine_drain_cmds(e, CL_LOOP_SLICE, false);
            engine_run_completions(e);
            cl_engine_run_pollers(e, true);
            continue;
        }
        event_base_loop(e->base, EVLOOP_ONCE);
    }
    atomic_store_explicit(&e->spinning, false, memory_order_seq_cst); /* helpers stay out */
    engine_shutdown_on_loop(e);
    event_free(e->wake_ev);
    event_free(e->heartbeat_ev);
    event_free(e->more_ev);
    e->hooks->destroy(e->hooks_state);
    e->hooks_state = NULL;
    event_base_free(e->base);
    e->base = NULL;
    cl_tls_loop_engine = NULL;
    pthread_mutex_unlock(&e->progress_mu);
    return NULL;
}

static void engine_free(collie_engine *e) {
    if (e->wake_fd >= 0) close(e->wake_fd);
    pthread_mutex_destroy(&e->qmu);
    pthread_mutex_destroy(&e->progress_mu);
    free(e);
}

/* Design notes, "exit() with engines running". Failing here is not fatal:
 * libcrypto initialises itself on first use (with its exit handler). */
static pthread_once_t engine_crypto_once = PTHREAD_ONCE_INIT;
static void engine_crypto_init(void) {
    if (OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL) != 1)
        CL_WARN("engine", "OPENSSL_init_crypto failed: libcrypto keeps its exit handler");
    pthread_atfork(NULL, NULL, engine_on_fork_child);
}

/* engines created and not destroyed (the tests' leftover check) */
static _Atomic size_t engines_live;

/* The options' stall threshold (0: COLLIE_STALL_MS), or EINVAL. */
static int engine_stall_ms(const collie_engine_opts *o, int32_t *out) {
    if (!cl_opts_ok(o, offsetof(collie_engine_opts, on_stall)))
        return cl_set_last_error(COLLIE_EINVAL, "collie_engine_create: opts.size not set "
                                                "(use COLLIE_ENGINE_OPTS_INIT)");
    int res = cl_config_check();
    if (res != COLLIE_OK) return res;
    int32_t stall_ms = cl_opt(o, stall_ms, 0);
    if (stall_ms < 0)
        return cl_set_last_error(COLLIE_EINVAL, "collie_engine_create: stall_ms %d is negative",
                                 (int)stall_ms);
    *out = stall_ms == 0 ? cl_config_get()->stall_ms : stall_ms;
    return COLLIE_OK;
}

/* A new engine's memory, lists, locks, name and wake-up eventfd. */
static int engine_alloc(const collie_engine_opts *o, collie_engine **out) {
    collie_engine *e = calloc(1, sizeof *e);
    if (!e) return COLLIE_ENOMEM;
    e->wake_fd = -1;
    cl_list_init(&e->residents);
    pthread_mutex_init(&e->qmu, NULL);
    pthread_mutex_init(&e->progress_mu, NULL);
    cl_list_init(&e->pollers);
    cl_list_init(&e->queue);
    cl_list_init(&e->backlog);
    const char *name = cl_opt(o, name, NULL);
    snprintf(e->name, sizeof e->name, "%s", name ? name : "collie");
    atomic_init(&e->activity, "idle");
    *out = e;
    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->wake_fd < 0) return cl_set_last_error(COLLIE_ESYSTEM, "eventfd: %s", strerror(errno));
    return COLLIE_OK;
}

static void engine_base_free(collie_engine *e);

/* The event base (one thread uses it: no libevent locking) and the
 * engine's own events; on failure nothing of them is left. */
static int engine_base_new(collie_engine *e) {
    struct event_config *cfg = event_config_new();
    if (!cfg) return COLLIE_ENOMEM;
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
    e->base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (!e->base) return cl_set_last_error(COLLIE_ESYSTEM, "event_base_new failed");
    e->wake_ev = event_new(e->base, e->wake_fd, EV_READ | EV_PERSIST, engine_on_wake, e);
    e->heartbeat_ev = event_new(e->base, -1, EV_PERSIST, engine_on_heartbeat, e);
    e->more_ev = event_new(e->base, -1, 0, engine_on_more, e);
    if (e->wake_ev && e->heartbeat_ev && e->more_ev) return COLLIE_OK;
    engine_base_free(e);
    return COLLIE_ENOMEM;
}

static void engine_base_free(collie_engine *e) {
    if (e->wake_ev) event_free(e->wake_ev);
    if (e->heartbeat_ev) event_free(e->heartbeat_ev);
    if (e->more_ev) event_free(e->more_ev);
    e->wake_ev = e->heartbeat_ev = e->more_ev = NULL;
    event_base_free(e->base);
    e->base = NULL;
}

int cl_engine_create(const collie_engine_opts *o, const cl_engine_hooks *hooks,
                     collie_engine **out) {
    collie_engine *e = NULL;
    int32_t stall_ms = 0;
    if (out) *out = NULL;
    cl_clear_last_error();
    if (!out) return cl_set_last_error(COLLIE_EINVAL, "collie_engine_create: out is NULL");
    int res = engine_stall_ms(o, &stall_ms);
    if (res != COLLIE_OK) return res;
    pthread_once(&engine_crypto_once, engine_crypto_init);
    CL_CHECK_GOTO(engine_alloc(o, &e), res, fail);
    e->forks = atomic_load_explicit(&engine_forks, memory_order_relaxed);
    e->pid = getpid();
    CL_CHECK_GOTO(engine_base_new(e), res, fail);
    e->hooks = hooks;
    CL_CHECK_GOTO(hooks->create(e, &e->hooks_state), res, fail_events);
    e->spin_ns = !cl_spin_enabled() ? 0
                 : cl_config_get()->spin == CL_SPIN_AUTO && cl_cores_oversubscribed()
                     ? CL_SPIN_WINDOW_SHARED_NS
                     : CL_SPIN_WINDOW_NS;
    int32_t period = cl_monitor_period_ms(stall_ms);
    struct timeval hb = {.tv_sec = period / 1000, .tv_usec = (period % 1000) * 1000};
    event_add(e->wake_ev, NULL);
    event_add(e->heartbeat_ev, &hb);
    atomic_store(&e->heartbeat_ns, cl_now_ns());

    int r = pthread_create(&e->thread, NULL, engine_thread_main, e);
    if (r != 0) {
        res = cl_set_last_error(COLLIE_ESYSTEM, "pthread_create: %s", strerror(r));
        hooks->destroy(e->hooks_state);
        goto fail_events;
    }
    /* live from here: collie_engine_destroy, below or the user's, counts it out */
    atomic_fetch_add_explicit(&engines_live, 1, memory_order_relaxed);
    res = cl_monitor_start(e, stall_ms, cl_opt(o, on_stall, NULL), cl_opt(o, on_stall_arg, NULL));
    if (res != COLLIE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", collie_last_error());
        collie_engine_destroy(e);
        return cl_set_last_error(res, "%s", why);
    }
    CL_INFO("engine", "%s: started (stall threshold %d ms)", e->name, (int)stall_ms);
    *out = e;
    return COLLIE_OK;

fail_events:
    engine_base_free(e);
fail:
    if (e) engine_free(e);
    return res;
}

int collie_engine_create(const collie_engine_opts *o, collie_engine **out) {
    return cl_engine_create(o, &cl_work_engine_hooks, out);
}

int collie_engine_destroy(collie_engine *e) {
    if (!e) return COLLIE_OK;
    if (cl_engine_on_loop(e))
        return cl_set_last_error(COLLIE_ESTATE,
                                 "collie_engine_destroy called on its own progress thread");
    /* nothing of it can be joined or freed here (its threads, and the
     * locks they may have held, are the parent's): left as it is */
    if (cl_engine_forked(e)) return cl_engine_forked_error(e, "collie_engine_destroy");
    atomic_store_explicit(&e->closing, true, memory_order_release);
    atomic_store_explicit(&e->stop_requested, true, memory_order_release);
    uint64_t one = 1; /* wake the loop; engine_on_wake sees stop_requested */
    ssize_t n = write(e->wake_fd, &one, sizeof one);
    CL_UNUSED(n);
    /* Bounded join: a user callback that never returns must not hang us. */
    int64_t until = cl_deadline_ns(cl_now_ns(), CL_ENGINE_CALL_TIMEOUT_MS);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t rt = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + (until - cl_now_ns());
    ts.tv_sec = rt / 1000000000LL;
    ts.tv_nsec = rt % 1000000000LL;
    int jr = pthread_timedjoin_np(e->thread, NULL, &ts);
    if (jr != 0) {
        CL_ERROR("engine",
                 "%s: progress thread did not stop within %d ms (stuck in %s); "
                 "leaking the engine",
                 e->name, CL_ENGINE_CALL_TIMEOUT_MS, atomic_load(&e->activity));
        cl_monitor_stop(e);
        return cl_set_last_error(COLLIE_ETIMEDOUT, "engine %s: progress thread stuck in %s",
                                 e->name, atomic_load(&e->activity));
    }
    cl_monitor_stop(e);
    cl_engine_wait_helpers(e);
    CL_INFO("engine", "%s: stopped", e->name);
    engine_free(e);
    atomic_fetch_sub_explicit(&engines_live, 1, memory_order_relaxed);
    return COLLIE_OK;
}

size_t cl_engines_live(void) { return atomic_load_explicit(&engines_live, memory_order_relaxed); }
