/*
 * comm.c — communicator lifetime: references, the end of its creation
 * (cl_comm_created) and of its backends (on the loop), abort, faults and
 * error policy, starting collective works on their backend, the name
 * registry. The create and destroy works are comm_create.c,
 * comm_rendezvous.c and comm_destroy.c.
 *
 * Design notes
 *  - Threads: posts happen on any thread (under `mu`, which makes the
 *    sequence number and the queue order agree); everything that touches
 *    backends, the waiting queue and the active list runs on the loop.
 *  - States: CREATING → READY → FAILED. Works started while CREATING wait
 *    in the comm's queue (their deadlines keep running) and start in post
 *    order when the rendezvous completes. In FAILED, new works fail fast
 *    with COLLIE_EABORTED naming the root cause; on a rank a shrink left
 *    out (`excluded`, comm_shrink_view.c) with COLLIE_ENOTMEMBER (coll.c).
 *  - The root cause is recorded once (err_status, err_msg); err_msg is
 *    written before err_status is published, and never changes after.
 *  - A fault fails the comm's works at once — in slices of CL_LOOP_SLICE
 *    per loop step (failing.works), so a deep queue does not hold up the
 *    abort notice or the loop; the notice is posted after the first
 *    slice, before the rest. The CPU transport's
 *    connections close only once the peers could read the abort notice in
 *    the store (COMM_CLOSE_GRACE_MS after it is there, COMM_CLOSE_MAX_MS
 *    after the fault at the latest; destroy waits for that close), so a
 *    peer learns the root cause instead of blaming us for a dropped
 *    connection. BLOCKING_WAIT closes nothing until the application aborts
 *    or destroys.
 *  - A collective that ends by deadline or cancel leaves the byte stream
 *    between ranks in an unknown state, so it is a comm fault: the comm's
 *    policy applies (NONE excepted). Faults reported by a backend (dead
 *    peer, protocol error) go through the same cl_comm_fault.
 *  - Lifetime: the comm is refcounted (user + one per work + the creation
 *    state); destroy (comm_destroy.c, a work driven on the loop) = wait for
 *    pending works (bounded) → abort the rest → backends destroyed on the
 *    loop (cl_comm_destroy_on_loop) → release. When the engine stops
 *    first, the resident hook aborts the comm and destroy only frees memory.
 */
#include <event2/event.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "engine/engine.h"

void cl_comm_hold(collie_comm *c) { atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); }

void cl_comm_release(collie_comm *c) {
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1) return;
    cl_flight_fini(c);
    cl_check_args_free(c);
    cl_health_free(c);
    for (int d = 0; d < CL_NUM_DEVICES; d++)
        if (c->bcs[d].ops) cl_coll_pool_fini(&c->bcs[d]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    collie_store_destroy(c->store); /* NULL once a destroy released it */
    free(c->rank_map);
    free(c->shrunk.excluded);
    collie_comm *parent = c->split.parent, *from = c->shrunk.from;
    free(c);
    if (parent) cl_comm_release(parent);
    if (from) cl_comm_release(from);
}

/* ---- accessors ----------------------------------------------------------- */

int collie_comm_rank(const collie_comm *c) { return c ? c->rank : -1; }
int collie_comm_size(const collie_comm *c) { return c ? c->size : -1; }
const char *collie_comm_name(const collie_comm *c) { return c ? c->name : ""; }
uint64_t collie_comm_generation(const collie_comm *c) { return c ? c->generation : 0; }

int collie_comm_error(const collie_comm *c, int *status, const char **msg) {
    if (!c) return COLLIE_EINVAL;
    int st = atomic_load_explicit(&((collie_comm *)c)->err_status, memory_order_acquire);
    if (status) *status = st;
    if (msg) *msg = st == COLLIE_OK ? "" : c->err_msg;
    return st;
}

/* Record the root cause once, with its data (f; NULL: from the status).
 * Returns true for the first fault. */
static bool comm_record_error(collie_comm *c, int status, const cl_fault *f, const char *fmt,
                              va_list ap) {
    bool first = false;
    pthread_mutex_lock(&c->mu);
    if (atomic_load_explicit(&c->err_status, memory_order_relaxed) == COLLIE_OK) {
        vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
        if (f)
            c->fault = *f;
        else
            cl_fault_classify(c, status, &c->fault);
        atomic_store_explicit(&c->err_status, status, memory_order_release);
        first = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (first) cl_health_comm_faulted(c, status, &c->fault);
    return first;
}

/* ---- starting works ---------------------------------------------------------- */

static void comm_fail_fast(cl_coll_work *cw) {
    collie_comm *c = cw->comm;
    cl_coll_finish(&cw->base, COLLIE_EABORTED, "comm '%s' has failed: %s", c->name, c->err_msg);
}

/* now: when it starts (one clock read per start: it is on every post's path) */
static void comm_start_now(cl_coll_work *cw, int64_t now) {
    collie_comm *c = cw->comm;
    collie_bcomm *bc = cw->bc;
    cl_list_push_back(&c->active, &cw->link);
    cw->started = true;
    cl_flight_start(c, cw, now);
    int r = bc->ops->start(bc->state, &cw->base, &cw->args);
    if (r != COLLIE_OK)
        cl_coll_finish(&cw->base, r, "backend %s could not start it: %s", bc->ops->name,
                       collie_strerror(r));
}

void cl_comm_start_work(cl_coll_work *cw) {
    collie_comm *c = cw->comm;
    if (cw->caller_started) { /* the backend has it already: just track it */
        cl_list_push_back(&c->active, &cw->link);
        cw->started = true;
        cl_flight_start(c, cw, cw->base.start_ns);
        return;
    }
    switch (atomic_load_explicit(&c->state, memory_order_acquire)) {
    case CL_COMM_FAILED: comm_fail_fast(cw); return;
    case CL_COMM_CREATING: cl_list_push_back(&c->waiting, &cw->link); return;
    default: comm_start_now(cw, cw->base.start_ns); return; /* its start command just ran */
    }
}

/* ---- faults and aborts ---------------------------------------------------------- */

/* A failed comm keeps its CPU transport's connections open until the peers
 * could read its abort notice: COMM_CLOSE_GRACE_MS after the notice is in
 * the store (ours, or the one we learnt the fault from), and never longer
 * than COMM_CLOSE_MAX_MS after the fault. */
#define COMM_CLOSE_GRACE_MS 20
#define COMM_CLOSE_MAX_MS   500

static void comm_on_fail_more(evutil_socket_t fd, short what, void *arg);

/* Fail up to `budget` of the works taken by comm_fail_pending (loop). A
 * started work goes back to the active list once failed (it stays there
 * until retired); one still waiting for creation is done with. A CUDA
 * backend's work is not failed here (its backend's abort does that). */
static void comm_fail_some(collie_comm *c, size_t budget) {
    cl_coll_work *cw;
    size_t n = 0;
    while ((cw = cl_list_first(&c->failing.works, cl_coll_work, link))) {
        if (n++ == budget) {
            if (!c->failing.ev)
                c->failing.ev = event_new(cl_engine_base(c->engine), -1, 0, comm_on_fail_more, c);
            if (c->failing.ev) {
                cl_event_soon(c->failing.ev);
                return;
            }
            budget = SIZE_MAX; /* no event: finish now */
        }
        cl_list_remove(&cw->link);
        bool started = cw->started || cw->caller_started; /* else: waiting for creation */
        if (started) cl_list_push_back(&c->active, &cw->link);
        /* finishing only queues the retirement: the lists stay intact here */
        if (!started || cw->bc == &c->bcs[CL_DEV_CPU])
            cl_coll_finish(&cw->base, c->failing.status, "%s", c->failing.reason);
    }
}

static void comm_on_fail_more(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    comm_fail_some(arg, CL_LOOP_SLICE);
}

/* Fail everything pending on the comm (loop): the first slice now, the
 * rest in the next loop steps (or all of it now: `all`, when the comm's
 * backends are about to go). Works of the CPU backend are failed here,
 * like a deadline fails them, and its connections are left alone; a CUDA
 * backend's works fail only through its abort, which quiesces the GPU
 * first, so that backend is aborted now. The first reason given stays. */
static void comm_fail_pending(collie_comm *c, int status, const char *reason, bool all) {
    if (cl_list_empty(&c->failing.works)) {
        c->failing.status = status;
        snprintf(c->failing.reason, sizeof c->failing.reason, "%s", reason);
    }
    cl_list_append_all(&c->failing.works, &c->waiting);
    cl_list_append_all(&c->failing.works, &c->active);
    comm_fail_some(c, all ? SIZE_MAX : CL_LOOP_SLICE);
    collie_bcomm *cuda = &c->bcs[CL_DEV_CUDA];
    if (cuda->state) cuda->ops->abort(cuda->state, status, reason);
    if (c->create_work) cl_work_finish(c->create_work, status, "%s", reason);
}

/* Close the CPU transport (abort the backend): its connections drop. */
static void comm_close_transport(collie_comm *c, int status, const char *reason) {
    c->closing.transport_closed = true;
    collie_bcomm *bc = &c->bcs[CL_DEV_CPU];
    if (bc->state) bc->ops->abort(bc->state, status, reason);
}

/* Fail everything pending on the comm and close its transport (loop). */
static void comm_abort_on_loop(collie_comm *c, int status, const char *reason) {
    comm_fail_pending(c, status, reason, true);
    comm_close_transport(c, status, reason);
}

/* The end of a fault or abort (loop): dump the flight recorder (if asked;
 * by now the failed works are retired, so it shows how each one ended),
 * close the transport; under ABORT_PROCESS end the process. Idempotent. */
static void comm_close_in(collie_comm *c, int32_t ms);

static void comm_close_after_fault(collie_comm *c) {
    if (!cl_list_empty(&c->failing.works) && !c->destroyed && !c->closing.transport_closed) {
        comm_close_in(c, 1); /* the transport closes once every work has failed */
        return;
    }
    cl_comm_dump_on_abort(c);
    if (!c->closing.transport_closed) {
        char reason[CL_COMM_MSG_MAX + 16];
        snprintf(reason, sizeof reason, "aborted: %s", c->err_msg);
        comm_close_transport(c, COLLIE_EABORTED, reason);
    }
    pthread_mutex_lock(&c->mu);
    c->closing.pending = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->closing.terminate) {
        CL_CERROR("comm", c, "error policy ABORT_PROCESS: terminating");
        abort();
    }
}

static void comm_on_close_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    comm_close_after_fault(arg);
}

/* (Re)arm the close for `ms` from now (loop). */
static void comm_close_in(collie_comm *c, int32_t ms) {
    if (c->destroyed || c->closing.transport_closed) {
        comm_close_after_fault(c);
        return;
    }
    if (!c->closing.ev)
        c->closing.ev = event_new(cl_engine_base(c->engine), -1, 0, comm_on_close_timer, c);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!c->closing.ev || event_add(c->closing.ev, &tv) != 0) {
        comm_close_after_fault(c);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->closing.pending = true;
    pthread_mutex_unlock(&c->mu);
}

static void comm_on_told(void *arg, int status, uint64_t k) {
    (void)status;
    (void)k;
    comm_close_in(arg, COMM_CLOSE_GRACE_MS);
}

/* Tell the peers (the abort notice in the store), then close the transport.
 * The order matters: a peer that saw our connections drop first would
 * blame us ("rank 1 closed its connection") instead of the root cause. */
static void comm_tell_then_close(collie_comm *c, bool tell, int status) {
    if (!tell) { /* we learnt it from the store: so do the others, now */
        comm_close_in(c, COMM_CLOSE_GRACE_MS);
        return;
    }
    comm_close_in(c, COMM_CLOSE_MAX_MS); /* the bound, should the store not answer */
    if (!cl_comm_ctl_publish_abort(c, status, c->err_msg, comm_on_told, c))
        comm_close_in(c, COMM_CLOSE_GRACE_MS); /* told already, or never created */
}

bool cl_comm_record_fault(collie_comm *c, int status, const cl_fault *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    bool first = comm_record_error(c, status, f, fmt, ap);
    if (first) atomic_store_explicit(&c->fault_unapplied, true, memory_order_release);
    va_end(ap);
    return first;
}

static void comm_on_error_now(collie_comm *c, int status) {
    const char *prev = cl_engine_set_activity(c->engine, "comm error callback");
    c->on_error(c, status, c->err_msg, c->on_error_arg);
    cl_engine_set_activity(c->engine, prev);
}

static void comm_on_error_cmd(cl_cmd *cmd) {
    collie_comm *c = cl_container_of(cmd, collie_comm, on_error_cmd);
    if (!c->engine_gone) comm_on_error_now(c, c->on_error_status);
    cl_comm_release(c);
}

/* The error callback is user code: it runs on the progress thread, so a
 * fault found by a thread helping the loop (engine/assist.c) hands it
 * over (once: a comm faults once). */
static void comm_call_on_error(collie_comm *c, int status) {
    if (cl_engine_on_progress_thread(c->engine)) {
        comm_on_error_now(c, status);
        return;
    }
    if (atomic_exchange(&c->on_error_queued, true)) return;
    c->on_error_status = status;
    c->on_error_cmd.fn = comm_on_error_cmd;
    cl_comm_hold(c);
    if (cl_engine_post_cmd(c->engine, &c->on_error_cmd) != COLLIE_OK) cl_comm_release(c);
}

static void comm_vfault(collie_comm *c, int status, const cl_fault *f, bool propagate,
                        const char *fmt, va_list ap) {
    bool first = comm_record_error(c, status, f, fmt, ap);
    /* posts fail from here on: FAILED before fault_unapplied is cleared,
     * so coll.c's post check sees one or the other */
    if (c->policy != COLLIE_POLICY_NONE &&
        (first || atomic_load_explicit(&c->fault_unapplied, memory_order_acquire)))
        atomic_store_explicit(&c->state, CL_COMM_FAILED, memory_order_release);
    /* a fault recorded before its work was published is applied here */
    if (!first && !atomic_exchange_explicit(&c->fault_unapplied, false, memory_order_acq_rel))
        return;
    if (!first) status = atomic_load_explicit(&c->err_status, memory_order_acquire);
    if (c->policy == COLLIE_POLICY_NONE) return;
    atomic_store_explicit(&c->state, CL_COMM_FAILED, memory_order_release);
    char reason[CL_COMM_MSG_MAX + 16];
    snprintf(reason, sizeof reason, "aborted: %s", c->err_msg);
    CL_CWARN("comm", c, "%s (%s)", c->err_msg, collie_status_name(status));
    comm_fail_pending(c, COLLIE_EABORTED, reason, false);
    /* BLOCKING_WAIT: nothing else happens in the background — not even a
     * close the peers would notice; the application decides */
    if (c->policy == COLLIE_POLICY_BLOCKING_WAIT) return;
    if (c->on_error) comm_call_on_error(c, status);
    c->closing.terminate = c->policy == COLLIE_POLICY_ABORT_PROCESS;
    /* tell the peers (they abort within milliseconds, with our root cause),
     * then close; a fault learnt from the control channel was told already */
    comm_tell_then_close(c, propagate, status);
}

void cl_comm_fault(collie_comm *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    comm_vfault(c, status, NULL, true, fmt, ap);
    va_end(ap);
}

void cl_comm_fault_data(collie_comm *c, int status, const cl_fault *f, bool propagate,
                        const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    comm_vfault(c, status, f, propagate, fmt, ap);
    va_end(ap);
}

/* An application abort (loop): fail everything, tell the peers. */
static void comm_app_abort_on_loop(collie_comm *c) {
    char msg[CL_COMM_MSG_MAX + 16];
    snprintf(msg, sizeof msg, "aborted: %s", c->err_msg);
    comm_fail_pending(c, COLLIE_EABORTED, msg, false);
    comm_tell_then_close(c, true, COLLIE_EABORTED);
}

static void comm_abort_cmd(cl_cmd *cmd) {
    collie_comm *c = cl_container_of(cmd, collie_comm, abort_cmd);
    if (!c->engine_gone) comm_app_abort_on_loop(c);
    cl_comm_release(c);
}

int collie_comm_abort(collie_comm *c, const char *reason) {
    return cl_comm_abort_with(c, NULL, reason);
}

int cl_comm_abort_with(collie_comm *c, const cl_fault *f, const char *reason) {
    if (!c) return COLLIE_EINVAL;
    pthread_mutex_lock(&c->mu);
    if (atomic_load_explicit(&c->err_status, memory_order_relaxed) == COLLIE_OK) {
        snprintf(c->err_msg, sizeof c->err_msg, "rank %d aborted the comm: %s", c->rank,
                 reason ? reason : "collie_comm_abort");
        if (f)
            c->fault = *f;
        else
            cl_fault_init(&c->fault, COLLIE_FAULT_APP_ABORT, COLLIE_FAULT_VIEW_LOCAL, c->rank);
        atomic_store_explicit(&c->err_status, COLLIE_EABORTED, memory_order_release);
        pthread_mutex_unlock(&c->mu);
        cl_health_comm_faulted(c, COLLIE_EABORTED, &c->fault);
    } else {
        pthread_mutex_unlock(&c->mu);
    }
    atomic_store_explicit(&c->state, CL_COMM_FAILED, memory_order_release);
    if (c->engine_gone) return COLLIE_OK;
    if (cl_engine_on_loop(c->engine)) { /* inside a callback: at once */
        comm_app_abort_on_loop(c);
        return COLLIE_OK;
    }
    /* any other thread: hand it to the loop and return; never blocks */
    if (atomic_exchange(&c->abort_queued, true)) return COLLIE_OK;
    cl_comm_hold(c);
    c->abort_cmd.fn = comm_abort_cmd;
    if (cl_engine_post_cmd(c->engine, &c->abort_cmd) != COLLIE_OK) cl_comm_release(c);
    return COLLIE_OK;
}

/* ---- rendezvous done ---------------------------------------------------------------- */

void cl_comm_created(collie_comm *c, int status, const char *msg, const cl_fault *fault) {
    if (status == COLLIE_OK) {
        int expect = CL_COMM_CREATING;
        if (!atomic_compare_exchange_strong(&c->state, &expect, CL_COMM_READY)) return;
        CL_INFO("comm", "comm '%s' generation %llu: rank %d of %d ready", c->name,
                (unsigned long long)c->generation, c->rank, c->size);
        c->was_ready = true;
        atomic_store(&c->ever_ready, true);
        cl_comm_ctl_start(c);
        cl_check_args_start(c);
        cl_health_start(c);
        cl_coll_work *cw;
        while ((cw = cl_list_first(&c->waiting, cl_coll_work, link))) {
            cl_list_remove(&cw->link);
            comm_start_now(cw, cl_now_ns());
        }
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->err_status) == COLLIE_OK) {
        snprintf(c->err_msg, sizeof c->err_msg, "creation failed: %s", msg);
        if (fault)
            c->fault = *fault;
        else
            cl_fault_classify(c, status, &c->fault);
        atomic_store_explicit(&c->err_status, status, memory_order_release);
        pthread_mutex_unlock(&c->mu);
        cl_health_comm_faulted(c, status, &c->fault);
    } else {
        pthread_mutex_unlock(&c->mu);
    }
    atomic_store_explicit(&c->state, CL_COMM_FAILED, memory_order_release);
    char reason[CL_COMM_MSG_MAX + 16];
    snprintf(reason, sizeof reason, "aborted: %s", c->err_msg);
    comm_abort_on_loop(c, COLLIE_EABORTED, reason);
}

/* ---- engine shutdown --------------------------------------------------------------- */

/* Close bc's unlend gate and wait for the threads inside it (bounded: the
 * hook must not block). False if one is still inside: then the backend is
 * left undestroyed (leaked, logged) rather than freed under it. */
#define COMM_UNLEND_DRAIN_NS (2000 * CL_NS_PER_MS)
static bool comm_unlend_close(collie_comm *c, collie_bcomm *bc) {
    atomic_store_explicit(&bc->lendable, false, memory_order_seq_cst);
    int64_t until = cl_now_ns() + COMM_UNLEND_DRAIN_NS;
    while (atomic_load_explicit(&bc->unlending, memory_order_seq_cst) > 0) {
        if (cl_now_ns() > until) {
            CL_CERROR("comm", c,
                      "backend %s: an unlend hook still runs after 2 s; its state is left "
                      "in place (leaked), not destroyed under it",
                      bc->ops->name);
            return false;
        }
        sched_yield();
    }
    return true;
}

static void comm_backends_destroy(collie_comm *c) {
    /* works just failed by the abort are retired (their detach hooks run)
     * while the backends still exist */
    cl_desync_flush(c);
    cl_works_run_retired(c->engine, SIZE_MAX);
    cl_comm_ctl_stop(c);
    cl_check_args_stop(c);
    cl_health_stop(c);
    c->destroyed = true;
    if (c->closing.ev) {
        event_free(c->closing.ev);
        c->closing.ev = NULL;
    }
    if (c->failing.ev) {
        event_free(c->failing.ev);
        c->failing.ev = NULL;
    }
    if (c->closing.pending) comm_close_after_fault(c); /* destroy did not wait for it */
    for (int d = 0; d < CL_NUM_DEVICES; d++) {
        collie_bcomm *bc = &c->bcs[d];
        cl_backend_poll_free(bc);
        if (bc->state) {
            /* abort (always before this) withdrew every loan: a work
             * published from now on has none left, and skips the hook */
            if (comm_unlend_close(c, bc)) bc->ops->destroy(bc->state);
            bc->state = NULL;
        }
    }
}

static void comm_on_engine_shutdown(cl_resident *r) {
    collie_comm *c = cl_container_of(r, collie_comm, resident);
    cl_comm_hold(c); /* what its abort ends (a destroy's work) may drop the last other one */
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->err_status) == COLLIE_OK) {
        snprintf(c->err_msg, sizeof c->err_msg, "the engine was destroyed");
        cl_fault_classify(c, COLLIE_ECLOSED, &c->fault);
        atomic_store_explicit(&c->err_status, COLLIE_ECLOSED, memory_order_release);
        pthread_mutex_unlock(&c->mu);
        cl_health_comm_faulted(c, COLLIE_ECLOSED, &c->fault);
    } else {
        pthread_mutex_unlock(&c->mu);
    }
    atomic_store(&c->state, CL_COMM_FAILED);
    comm_abort_on_loop(c, COLLIE_ECLOSED, "the engine is shutting down");
    comm_backends_destroy(c);
    c->engine_gone = true;
    c->resident_added = false;
    cl_comm_release(c);
}

bool cl_comm_attach_on_loop(collie_comm *c) {
    c->resident.shutdown = comm_on_engine_shutdown;
    c->resident.what = "comm shutdown";
    c->resident_added = cl_engine_add_resident(c->engine, &c->resident) == COLLIE_OK;
    return c->resident_added;
}

/* ---- destroy ----------------------------------------------------------------------- */

/* The destroy's step that closes everything (loop; comm_destroy.c runs the
 * rest of it): every pending work fails, the connections drop, the
 * backends go, and the comm leaves the engine's residents. */
void cl_comm_destroy_on_loop(collie_comm *c) {
    if (c->engine_gone) return;
    comm_abort_on_loop(c, COLLIE_ECLOSED, "the comm was destroyed");
    comm_backends_destroy(c);
    if (c->resident_added) cl_engine_remove_resident(c->engine, &c->resident);
    c->resident_added = false;
}

/* ---- named registry ------------------------------------------------------------------ */

static pthread_mutex_t cl_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static collie_comm *cl_registry[256];

int collie_comm_register(collie_comm *c) {
    if (!c) return COLLIE_EINVAL;
    int res = COLLIE_OK;
    pthread_mutex_lock(&cl_registry_mu);
    size_t free_slot = SIZE_MAX;
    for (size_t i = 0; i < 256; i++) {
        if (cl_registry[i] == c) goto out; /* already registered */
        if (cl_registry[i] && strcmp(cl_registry[i]->name, c->name) == 0) {
            res = cl_set_last_error(COLLIE_EEXIST, "a comm named '%s' is already registered",
                                    c->name);
            goto out;
        }
        if (!cl_registry[i] && free_slot == SIZE_MAX) free_slot = i;
    }
    if (free_slot == SIZE_MAX) {
        res = cl_set_last_error(COLLIE_ELIMIT, "the comm registry is full (256 names)");
        goto out;
    }
    cl_registry[free_slot] = c;
    c->registered = true;
out:
    pthread_mutex_unlock(&cl_registry_mu);
    return res;
}

void cl_comm_unregister(collie_comm *c) {
    pthread_mutex_lock(&cl_registry_mu);
    for (size_t i = 0; i < 256; i++)
        if (cl_registry[i] == c) cl_registry[i] = NULL;
    c->registered = false;
    pthread_mutex_unlock(&cl_registry_mu);
}

int collie_comm_lookup(const char *name, collie_comm **out) {
    if (out) *out = NULL;
    if (!name || !out) return COLLIE_EINVAL;
    int res = cl_set_last_error(COLLIE_ENOENT, "no comm named '%s' is registered", name);
    pthread_mutex_lock(&cl_registry_mu);
    for (size_t i = 0; i < 256; i++)
        if (cl_registry[i] && strcmp(cl_registry[i]->name, name) == 0) {
            *out = cl_registry[i];
            res = COLLIE_OK;
            break;
        }
    pthread_mutex_unlock(&cl_registry_mu);
    return res;
}
