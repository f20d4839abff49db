/*
 * work.c — the work-handle state machine: init, post, claim/publish,
 * references and the public accessors.
 *
 * Design notes
 *  - States: QUEUED → ACTIVE → FINISHING → DONE, in one atomic word. Every
 *    way a work ends (producer completion, deadline, cancel, a waiter whose
 *    deadline passed, engine shutdown) goes through cl_work_claim: a CAS to
 *    FINISHING that exactly one caller wins. The winner writes status and
 *    message, then publishes DONE with release order; readers load with
 *    acquire, so a visible DONE implies a visible result.
 *  - BUSY bit: the loop (or a thread helping it, engine/assist.c) sets it
 *    (cl_work_busy_enter) around access to the work's user buffers. A
 *    foreign thread cannot claim while BUSY is set; it yields until the
 *    loop leaves the (short, non-blocking) section, so once any completion
 *    is visible the buffers are no longer touched. It yields at most 2 s
 *    (CL_BUSY_WAIT_NS): past that its claim fails, logged, and the work is
 *    left to end another way.
 *  - After DONE, the work is retired on the loop thread (registry.c): the
 *    producer's detach hook, the completion queue, the user callback, in that
 *    order, exactly once. The detach hook is the one call work/ makes into
 *    a producer at a work's end.
 *  - Everyone but the producer's own completion ends a work through
 *    cl_work_cancel → ops->cancel (deadline, cancel, waiter, shutdown): the
 *    provider finishes it itself, at once or — after a desync report, or
 *    once a device is quiet — later, within a bound.
 *  - publish = fill (status, message, end time) + show (DONE, waiters,
 *    retire). A producer with more to do before its end is seen (the
 *    collectives, comm/coll_end.c: unlend, stats, a comm's fault) claims,
 *    fills, does it, then shows: work/ calls no hook for that.
 *  - References: the poster's (returned to the user), the engine's (post →
 *    retire), a completion queue's (while queued), and collie_work_hold's.
 */
#include "work/work.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "work/internal.h"

int cl_work_init(collie_work *w, collie_engine *e, const cl_work_ops *ops,
                 const collie_post_opts *o, int32_t default_timeout_ms) {
    if (!cl_opts_ok(o, offsetof(collie_post_opts, tag)))
        return cl_set_last_error(COLLIE_EINVAL,
                                 "%s: collie_post_opts.size not set (use COLLIE_POST_OPTS_INIT)",
                                 ops->name);
    int32_t t = cl_opt(o, timeout_ms, COLLIE_TIMEOUT_DEFAULT);
    if (t < COLLIE_TIMEOUT_INFINITE)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "%s: timeout_ms %d is invalid (use > 0, COLLIE_TIMEOUT_DEFAULT "
                                 "or COLLIE_TIMEOUT_INFINITE)",
                                 ops->name, (int)t);
    if (t == COLLIE_TIMEOUT_DEFAULT) t = default_timeout_ms;
    memset(w, 0, sizeof *w);
    atomic_init(&w->state, CL_WORK_QUEUED);
    atomic_init(&w->refs, 1);
    atomic_init(&w->nwaiters, 0);
    cl_list_init(&w->waiters);
    w->ops = ops;
    w->engine = e;
    w->status = COLLIE_INPROGRESS;
    w->timeout_ms = t;
    w->cb = cl_opt(o, cb, NULL);
    w->cb_arg = cl_opt(o, cb_arg, NULL);
    w->cq = cl_opt(o, cq, NULL);
    w->tag = cl_opt(o, tag, 0);
    w->post_ns = cl_now_ns();
    w->deadline_ns = cl_deadline_ns(w->post_ns, t);
    if (w->cq) cl_cq_hold(w->cq);
    return COLLIE_OK;
}

/* posted works not yet freed (the tests' leftover check) */
static _Atomic size_t works_live;

size_t cl_works_live(void) { return atomic_load_explicit(&works_live, memory_order_relaxed); }

int cl_work_post(collie_work *w) {
    collie_engine *e = w->engine;
    if (cl_engine_closing(e))
        return cl_set_last_error(COLLIE_ECLOSED, "%s: engine %s is shutting down", w->ops->name,
                                 cl_engine_name(e));
    atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed); /* the engine's */
    w->start_cmd.fn = cl_work_start_cmd;
    cl_works_count_post(e, 1); /* before the loop can retire it */
    int posted = cl_engine_post_cmd(e, &w->start_cmd);
    if (posted != COLLIE_OK) {
        cl_works_count_post(e, -1);
        atomic_fetch_sub_explicit(&w->refs, 1, memory_order_relaxed);
        w->start_cmd.fn = NULL;                     /* never posted: not counted live */
        if (posted == COLLIE_ESTATE) return posted; /* a forked child: its message */
        return cl_set_last_error(COLLIE_ECLOSED, "%s: engine %s is stopped", w->ops->name,
                                 cl_engine_name(e));
    }
    atomic_fetch_add_explicit(&works_live, 1, memory_order_relaxed);
    return COLLIE_OK;
}

/* How long a foreign finisher waits for the loop to leave a BUSY section
 * before giving up (BUSY sections are non-blocking and short). */
#define CL_BUSY_WAIT_NS (2000 * CL_NS_PER_MS)

bool cl_work_claim(collie_work *w) {
    bool on_loop = cl_engine_on_loop(w->engine);
    int64_t give_up = 0;
    uint32_t s = atomic_load_explicit(&w->state, memory_order_acquire);
    for (;;) {
        if ((s & CL_WORK_STATE_MASK) >= CL_WORK_FINISHING) return false;
        if ((s & CL_WORK_BUSY) && !on_loop) {
            if (give_up == 0) give_up = cl_now_ns() + CL_BUSY_WAIT_NS;
            if (cl_now_ns() > give_up) {
                CL_ERROR("work",
                         "%s seq %llu: progress loop held the work busy for 2 s; "
                         "could not finish it from another thread",
                         w->ops->name, (unsigned long long)w->seq);
                return false;
            }
            sched_yield();
            s = atomic_load_explicit(&w->state, memory_order_acquire);
            continue;
        }
        uint32_t ns = CL_WORK_FINISHING | (s & CL_WORK_BUSY);
        if (atomic_compare_exchange_weak_explicit(&w->state, &s, ns, memory_order_acq_rel,
                                                  memory_order_acquire))
            return true;
    }
}

void cl_work_fill(collie_work *w, int status, const char *ctx, const char *fmt, va_list ap) {
    w->status = status;
    w->end_ns = cl_now_ns();
    if (status == COLLIE_OK) return;
    char buf[192] = "";
    if (!ctx) {
        if (w->ops->describe) w->ops->describe(w, buf, sizeof buf);
        ctx = buf;
    }
    /* the cause whole, however long (a desync report is kilobytes): a
     * message cut here would reach every rank cut */
    char *cause = NULL;
    if (fmt) {
        va_list aq;
        va_copy(aq, ap);
        int n = vsnprintf(NULL, 0, fmt, aq);
        va_end(aq);
        if (n >= 0 && (cause = malloc((size_t)n + 1))) vsnprintf(cause, (size_t)n + 1, fmt, ap);
    }
    const char *why = cause ? cause : collie_strerror(status);
    size_t len = strlen(w->ops->name) + strlen(ctx) + strlen(why) + 48;
    w->errmsg = malloc(len);
    if (w->errmsg)
        snprintf(w->errmsg, len, "%s seq %llu%s: %s", w->ops->name, (unsigned long long)w->seq, ctx,
                 why);
    free(cause);
}

void cl_work_show(collie_work *w) {
    /* FINISHING (2) | 1 == DONE (3); keeps the BUSY bit of a loop claimer.
     * seq_cst pairs with the waiter's nwaiters increment (Dekker). */
    atomic_fetch_or_explicit(&w->state, 1u, memory_order_seq_cst);
    if (atomic_load_explicit(&w->nwaiters, memory_order_seq_cst) > 0) cl_work_wake_waiters(w);
    cl_work_schedule_retire(w);
}

void cl_work_vpublish(collie_work *w, int status, const char *fmt, va_list ap) {
    cl_work_fill(w, status, NULL, fmt, ap);
    cl_work_show(w);
}

void cl_work_publish(collie_work *w, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cl_work_vpublish(w, status, fmt, ap);
    va_end(ap);
}

bool cl_work_finish(collie_work *w, int status, const char *fmt, ...) {
    if (!cl_work_claim(w)) return false;
    va_list ap;
    va_start(ap, fmt);
    cl_work_vpublish(w, status, fmt, ap);
    va_end(ap);
    return true;
}

bool cl_work_cancel(collie_work *w, int status, const char *fmt, ...) {
    if (cl_work_done(w)) return false;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->ops->cancel) return w->ops->cancel(w, status, msg);
    return cl_work_finish(w, status, "%s", msg);
}

bool cl_work_busy_enter(collie_work *w) {
    uint32_t s = CL_WORK_ACTIVE;
    return atomic_compare_exchange_strong_explicit(&w->state, &s, CL_WORK_ACTIVE | CL_WORK_BUSY,
                                                   memory_order_acq_rel, memory_order_acquire);
}

void cl_work_busy_exit(collie_work *w) {
    atomic_fetch_and_explicit(&w->state, ~(uint32_t)CL_WORK_BUSY, memory_order_release);
}

/* ---- references ------------------------------------------------------------ */

void collie_work_hold(collie_work *w) {
    if (w) atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed);
}

void collie_work_release(collie_work *w) {
    if (!w) return;
    int32_t prev = atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel);
    if (prev > 1) return;
    if (prev < 1) {
        CL_ERROR("work", "collie_work_release: %s seq %llu released too many times", w->ops->name,
                 (unsigned long long)w->seq);
        abort();
    }
    collie_cq *cq = w->cq;
    free(w->errmsg);
    if (w->start_cmd.fn) /* it was posted */
        atomic_fetch_sub_explicit(&works_live, 1, memory_order_relaxed);
    w->ops->free(w);
    if (cq) cl_cq_release(cq);
}

/* ---- public accessors ------------------------------------------------------ */

bool collie_work_test(const collie_work *w) {
    if (!w) return false;
    if (cl_work_done(w)) return true;
    /* as MPI_Test: one step of progress here if the loop lets us */
    return cl_engine_assist(w->engine) && cl_work_done(w);
}

int collie_work_result(const collie_work *w) {
    if (!w) return COLLIE_EINVAL;
    return cl_work_done(w) ? w->status : COLLIE_INPROGRESS;
}

const char *collie_work_error_message(const collie_work *w) {
    if (!w || !cl_work_done(w) || w->status == COLLIE_OK) return "";
    return w->errmsg ? w->errmsg : collie_strerror(w->status);
}

uint64_t collie_work_seq(const collie_work *w) { return w ? w->seq : 0; }

uint64_t collie_work_tag(const collie_work *w) { return w ? w->tag : 0; }

int collie_work_info(const collie_work *w, collie_work_details *info) {
    if (!w || !info) return COLLIE_EINVAL;
    bool done = cl_work_done(w);
    info->op = w->ops->name;
    info->seq = w->seq;
    info->bytes = w->bytes;
    info->status = done ? w->status : COLLIE_INPROGRESS;
    info->timeout_ms = w->timeout_ms;
    info->post_ns = w->post_ns;
    /* start_ns is written by the loop; read it only once DONE made it visible */
    info->start_ns = done ? w->start_ns : 0;
    info->end_ns = done ? w->end_ns : 0;
    info->deadline_ns = w->deadline_ns == INT64_MAX ? 0 : w->deadline_ns;
    return COLLIE_OK;
}

int collie_work_cancel(collie_work *w) {
    if (!w) return COLLIE_EINVAL;
    if (cl_work_cancel(w, COLLIE_ECANCELED, "cancelled by the application")) return COLLIE_OK;
    return COLLIE_ESTATE;
}
