/*
 * wait.c — blocking waits on works: collie_work_wait, collie_work_wait_any.
 *
 * Design notes
 *  - One process-wide mutex (cl_wait_mu) guards every work's waiter list;
 *    each waiting thread brings its own condition variable (on its stack).
 *    It is taken only when somebody actually waits: a finisher checks the
 *    work's `nwaiters` after publishing DONE (both seq_cst, so either the
 *    finisher sees the waiter or the waiter sees DONE).
 *  - A waiter is bounded by each work's own deadline, not by the progress
 *    thread: when a deadline (plus the work's cancel_grace_ms) passes and
 *    the work is still pending (the loop is stuck), collie_work_wait(_any)
 *    cancels it itself (cl_work_cancel, once per work); a provider that must
 *    first quiet a device publishes it later, and the waiter waits for that
 *    at most 15 s more (CL_CANCEL_WAIT_NS). cl_work_wait_until (the tests')
 *    never ends a work.
 *  - Before it sleeps, a waiter polls for up to CL_WAIT_SPIN_NS (100 us;
 *    only where spinning is on, COLLIE_SPIN) and meanwhile runs the loop's
 *    step itself when the loop is between two turns (cl_engine_assist: a
 *    try-lock, never a wait), so a small operation completes without
 *    handing off between threads.
 *  - On the progress thread a pending work cannot complete while we block,
 *    so waiting there returns COLLIE_ESTATE.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "engine/engine.h"
#include "work/internal.h"

typedef struct cl_waiter {
    pthread_cond_t cv;
    bool fired;
} cl_waiter;

struct cl_waiter_link {
    cl_list_node node; /* in its work's waiters */
    cl_waiter *waiter;
    collie_work *work;
    bool expiry_tried;
};

static pthread_mutex_t cl_wait_mu = PTHREAD_MUTEX_INITIALIZER;

#define CL_WAIT_SPIN_NS (100 * 1000) /* a waiter polls this long before sleeping */
/* A waiter that cancelled a work its provider ends later (a device to
 * quiet) waits this long more for it (NCCL's abort bound is 10 s by
 * default); past it the wait returns COLLIE_INPROGRESS: the work is not
 * complete. */
#define CL_CANCEL_WAIT_NS (15000 * CL_NS_PER_MS)

void cl_work_wake_waiters(collie_work *w) {
    pthread_mutex_lock(&cl_wait_mu);
    struct cl_waiter_link *l;
    cl_list_foreach(&w->waiters, l, struct cl_waiter_link, node) {
        l->waiter->fired = true;
        pthread_cond_signal(&l->waiter->cv);
    }
    pthread_mutex_unlock(&cl_wait_mu);
}

static void link_add(struct cl_waiter_link *l, collie_work *w, cl_waiter *wt) {
    l->waiter = wt;
    l->work = w;
    l->expiry_tried = false;
    cl_list_push_front(&w->waiters, &l->node);
    atomic_fetch_add_explicit(&w->nwaiters, 1, memory_order_seq_cst);
}

static void link_del(struct cl_waiter_link *l) {
    collie_work *w = l->work;
    cl_list_remove(&l->node);
    atomic_fetch_sub_explicit(&w->nwaiters, 1, memory_order_seq_cst);
}

static size_t first_done(collie_work *const *ws, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ws[i] && cl_work_done(ws[i])) return i;
    return n;
}

/* The engine a polling waiter helps (engine/assist.c): the first work's. */
static collie_engine *first_engine(collie_work *const *ws, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ws[i]) return ws[i]->engine;
    return NULL;
}

/* Poll briefly before sleeping: a sleeping thread takes tens of
 * microseconds to wake on these machines. Returns the index of a done
 * work, or n. */
static size_t wait_spin(collie_work *const *ws, size_t n, int64_t until_ns) {
    size_t idx = n;
    int64_t spin_until = cl_now_ns() + CL_WAIT_SPIN_NS;
    if (spin_until > until_ns) spin_until = until_ns;
    collie_engine *e = first_engine(ws, n);
    cl_engine_waiter_polls(e, true);
    unsigned turn = 0;
    bool shared = cl_cores_oversubscribed();
    for (;;) {
        if ((idx = first_done(ws, n)) < n) break;
        /* run the loop's step ourselves if it is between two turns */
        if (cl_engine_assist(e) && (idx = first_done(ws, n)) < n) break;
        /* yield the core each turn when this host's ranks outnumber
         * its cores; else now and then (a yield that switches threads
         * costs more than the whole step: 2-rank 4 B allreduce 2.0 us
         * yielding each turn, 1.5 us every 16th). The clock too is
         * read every 8th turn only (clock_gettime was 12% of a
         * 16-in-flight run's samples here). */
        turn++;
        if (shared || (turn & 15) == 0) sched_yield();
        if ((turn & 7) == 0 && cl_now_ns() >= spin_until) break;
    }
    cl_engine_waiter_polls(e, false);
    return idx;
}

/* The index of a work whose deadline (plus the grace of works that explain
 * their timeout on the loop: a stuck loop cannot) has passed and that this
 * waiter has not tried to end yet, or n; *next becomes the earliest of the
 * other deadlines if sooner. */
static size_t wait_expired(collie_work *const *ws, size_t n, const struct cl_waiter_link *links,
                           int64_t now, int64_t *next) {
    size_t expired = n;
    for (size_t i = 0; i < n; i++) {
        if (!ws[i] || links[i].expiry_tried) continue;
        int64_t due = ws[i]->deadline_ns;
        if (due != INT64_MAX) due += (int64_t)ws[i]->ops->cancel_grace_ms * CL_NS_PER_MS;
        if (due <= now)
            expired = i;
        else if (due < *next)
            *next = due;
    }
    return expired;
}

/* Sleep on a condition variable linked to every work until one is done
 * or until_ns; with `expire`, end a work past its deadline (and grace)
 * from this thread, once each. */
static size_t wait_block(collie_work *const *ws, size_t n, int64_t until_ns, bool expire,
                         struct cl_waiter_link *links) {
    size_t idx = n;
    cl_waiter wt = {.fired = false};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wt.cv, &ca);
    pthread_condattr_destroy(&ca);

    pthread_mutex_lock(&cl_wait_mu);
    for (size_t i = 0; i < n; i++)
        if (ws[i]) link_add(&links[i], ws[i], &wt);
    for (;;) {
        idx = first_done(ws, n);
        if (idx < n) break;
        int64_t now = cl_now_ns();
        if (now >= until_ns) break;
        int64_t next = until_ns;
        size_t ex = expire ? wait_expired(ws, n, links, now, &next) : n;
        if (ex < n) {
            collie_work *expired = ws[ex];
            links[ex].expiry_tried = true;     /* once: if it is being finished, wait */
            pthread_mutex_unlock(&cl_wait_mu); /* finishing wakes waiters: needs the lock */
            if (cl_work_cancel(expired, COLLIE_ETIMEDOUT, "deadline of %d ms passed",
                               (int)expired->timeout_ms))
                CL_DEBUG("work", "%s seq %llu expired by its waiter", expired->ops->name,
                         (unsigned long long)expired->seq);
            /* ended now, or by its provider once a device is quiet, or by
             * whoever is ending it already: wait for that, never unbounded */
            int64_t cap = cl_now_ns() + CL_CANCEL_WAIT_NS;
            if (cap < until_ns) until_ns = cap;
            pthread_mutex_lock(&cl_wait_mu);
            continue;
        }
        struct timespec ts = {.tv_sec = next / 1000000000LL, .tv_nsec = next % 1000000000LL};
        if (!wt.fired) pthread_cond_timedwait(&wt.cv, &cl_wait_mu, &ts);
        wt.fired = false;
    }
    for (size_t i = 0; i < n; i++)
        if (ws[i]) link_del(&links[i]);
    pthread_mutex_unlock(&cl_wait_mu);
    pthread_cond_destroy(&wt.cv);
    return idx;
}

/* The core: wait until one of ws is done or until_ns, polling first, then
 * blocking. `expire`: end works whose deadline passed ourselves. Returns
 * the index of a done work or n. */
static size_t wait_core(collie_work *const *ws, size_t n, int64_t until_ns, bool expire) {
    size_t idx = first_done(ws, n);
    if (idx < n || cl_now_ns() >= until_ns) return idx;
    if (cl_spin_enabled() && (idx = wait_spin(ws, n, until_ns)) < n) return idx;
    struct cl_waiter_link small[8];
    struct cl_waiter_link *links = n <= 8 ? small : calloc(n, sizeof *links);
    if (!links) { /* no memory to block properly: degrade to bounded polling */
        while ((idx = first_done(ws, n)) == n && cl_now_ns() < until_ns) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        return idx;
    }
    idx = wait_block(ws, n, until_ns, expire, links);
    if (links != small) free(links);
    return idx;
}

bool cl_work_wait_until(collie_work *w, int64_t until_ns) {
    return wait_core(&w, 1, until_ns, false) == 0;
}

int collie_work_wait_any(collie_work *const *ws, size_t n, int32_t timeout_ms, size_t *idx) {
    if (idx) *idx = n;
    if (!ws || !idx || n == 0) return COLLIE_EINVAL;
    if (timeout_ms < COLLIE_TIMEOUT_INFINITE) return COLLIE_EINVAL;
    bool any = false, on_loop = false;
    for (size_t i = 0; i < n; i++) {
        if (!ws[i]) continue;
        any = true;
        on_loop |= cl_engine_on_loop(ws[i]->engine);
    }
    if (!any) return COLLIE_EINVAL;
    size_t i = first_done(ws, n);
    if (i == n && timeout_ms != 0) {
        if (on_loop)
            return cl_set_last_error(COLLIE_ESTATE,
                                     "collie_work_wait on the progress thread would deadlock");
        i = wait_core(ws, n, cl_deadline_ns(cl_now_ns(), timeout_ms), true);
    }
    *idx = i;
    return i < n ? ws[i]->status : COLLIE_INPROGRESS;
}

int collie_work_wait(collie_work *w, int32_t timeout_ms) {
    size_t idx;
    if (!w) return COLLIE_EINVAL;
    return collie_work_wait_any(&w, 1, timeout_ms, &idx);
}
