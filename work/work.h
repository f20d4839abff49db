/*
 * work.h — work/'s public header: the work-handle interface for the
 * modules that produce works (store client, communicators).
 *
 * A producer embeds `struct collie_work` as the first member of its own
 * request struct, fills an ops table, and calls cl_work_init + cl_work_post.
 *
 * Design notes: the state machine (one atomic word; docs/design.md §3)
 *
 *   state      entered by                        next, and who moves it
 *   QUEUED     cl_work_post                      ACTIVE: the start command (loop)
 *                                                FINISHING: anyone ending it early
 *   ACTIVE     start command, then ops->start    FINISHING: the producer, or
 *                                                cl_work_cancel -> ops->cancel
 *   FINISHING  cl_work_claim (one CAS winner)    DONE: the claimer only
 *   DONE       cl_work_show (cl_work_publish)    never changes again
 *   + BUSY     cl_work_busy_enter (loop)         a foreign claim waits for exit
 *                                                (at most 2 s, then fails)
 *
 *   - The producer ends its own work with cl_work_finish (or claim, fill in
 *     results, publish). Everyone else — deadline sweep, collie_work_cancel,
 *     a waiter past the deadline, engine shutdown — calls cl_work_cancel:
 *     the provider's ops->cancel ends the work itself, at once or within a
 *     bound (desync report, a device to quiet). There is no other way.
 *   - Publishing is fill (result) then show (DONE). A producer that must act
 *     between them (the collectives: comm/coll_end.c) claims, calls
 *     cl_work_fill, acts, then cl_work_show; the rest call cl_work_publish.
 *   - ops->detach then runs exactly once on the loop thread, whoever
 *     finished it, so the producer drops its references (request tables,
 *     transport queues): the one call work/ makes into the producer at a
 *     work's end. After detach the producer must not touch the work.
 *   - ops->free runs when the last reference is dropped (any thread).
 */
#ifndef CL_WORK_H
#define CL_WORK_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "collie.h"
#include "engine/engine.h"

typedef struct cl_work_ops {
    const char *name; /* op name for messages: "store.get" */
    void (*start)(collie_work *w);
    /* detach: optional; the producer's part of retirement: loop thread,
     * exactly once, after DONE and before the completion queue and the
     * callback (the collectives' end on the loop: comm/coll_end.c) */
    void (*detach)(collie_work *w);
    void (*free)(collie_work *w);
    /* describe: optional; append " (key 'x')" style context to messages
     * (cl_work_publish; cl_work_fill without a context of its own). */
    void (*describe)(const collie_work *w, char *buf, size_t len);
    /* cancel: optional; the one way a work is ended by anyone but its
     * producer's own completion: the deadline sweep (COLLIE_ETIMEDOUT, loop),
     * collie_work_cancel (COLLIE_ECANCELED), a waiter past the deadline
     * (COLLIE_ETIMEDOUT, its thread), engine shutdown (COLLIE_ECLOSED,
     * loop). Any thread, idempotent, never blocks. The provider finishes
     * the work itself: at once, or later within a bound when it must first
     * explain the failure (a desync report) or quiet a device that may still
     * write the buffers. Returns true if this call will end the work (false:
     * it was ended or being ended already). Without the hook the work is
     * finished at once with `status` and `msg`. */
    bool (*cancel)(collie_work *w, int status, const char *msg);
    /* how long after the deadline a waiter leaves the ending to the loop
     * (time for a desync report) before it calls cancel itself */
    int32_t cancel_grace_ms;
} cl_work_ops;

/* Work states (low bits of `state`). */
enum {
    CL_WORK_QUEUED = 0,    /* posted, start not yet run */
    CL_WORK_ACTIVE = 1,    /* started */
    CL_WORK_FINISHING = 2, /* claimed: the winner is filling in the result */
    CL_WORK_DONE = 3,      /* result published; never changes again */
    CL_WORK_STATE_MASK = 3,
    CL_WORK_BUSY = 4, /* the loop is touching the work's buffers right now */
};

struct cl_waiter_link;

struct collie_work {
    _Atomic uint32_t state;
    _Atomic int32_t refs;
    const cl_work_ops *ops;
    collie_engine *engine;

    int status;   /* valid once DONE */
    char *errmsg; /* malloc'd, valid once DONE; NULL on success */

    uint64_t seq, tag, bytes;
    int32_t timeout_ms;
    int64_t post_ns, start_ns, end_ns, deadline_ns;

    collie_work_cb cb;
    void *cb_arg;
    collie_cq *cq;

    /* loop-thread bookkeeping */
    cl_list_node trk_node;  /* the registry's tracked list */
    cl_list_node done_node; /* the registry's retire list */
    cl_list_node dl_node;   /* the registry's deadline queue of its timeout */
    bool tracked;
    bool start_ran;       /* the start command has run */
    bool retire_deferred; /* finished before start ran: start retires it */
    cl_cmd start_cmd, retire_cmd;

    /* waiters (under the global wait lock) */
    _Atomic int nwaiters;
    cl_list waiters; /* struct cl_waiter_link (wait.c) */

    /* completion queue link (under the cq's lock) */
    cl_list_node cq_node;
};

/* cl_work_init: initialise a work for engine e (one reference, the
 * caller's). Validates and applies the post options: returns COLLIE_EINVAL
 * (with collie_last_error set) for a bad options struct or timeout. The
 * default timeout is `default_timeout_ms` (> 0 or INFINITE). */
int cl_work_init(collie_work *w, collie_engine *e, const cl_work_ops *ops,
                 const collie_post_opts *o, int32_t default_timeout_ms);

/* cl_work_post: hand the work to the engine. On success the engine holds
 * its own reference until the work is retired and the caller's reference
 * is returned to the user. On error (COLLIE_ECLOSED) nothing happened: the
 * caller still owns the work and frees it. */
int cl_work_post(collie_work *w);

/* cl_work_claim: become the one finisher. True if this call won. From a
 * foreign thread it waits (at most 2 s) while the loop holds BUSY, then
 * gives up and returns false. */
bool cl_work_claim(collie_work *w);

/* cl_work_publish: after a successful claim: cl_work_fill (the message's
 * context from ops->describe), then cl_work_show. */
void cl_work_publish(collie_work *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cl_work_vpublish(collie_work *w, int status, const char *fmt, va_list ap);

/* cl_work_fill: after a successful claim, the result: status, end time
 * and, for an error, the message "<op> seq <n><ctx>: <cause>" (fmt
 * printf-style, NULL: the status's name; ctx NULL: ops->describe's). The
 * claimer's thread; nothing is visible yet. */
void cl_work_fill(collie_work *w, int status, const char *ctx, const char *fmt, va_list ap);

/* cl_work_show: after cl_work_fill: mark DONE (release: the result is
 * visible with it), wake waiters, schedule retire (detach, completion
 * queue, callback on the loop). */
void cl_work_show(collie_work *w);

/* cl_work_finish: claim + publish. Returns true if this call finished it. */
bool cl_work_finish(collie_work *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* cl_work_cancel: end w from outside its producer's completion, through
 * ops->cancel (see there) or, without the hook, cl_work_finish. Returns
 * true if this call will end it. Any thread. */
bool cl_work_cancel(collie_work *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* cl_work_busy_enter / cl_work_busy_exit: bracket loop-thread access to the
 * work's user buffers. enter returns false if the work is already finished
 * or being finished (then do not touch the buffers); a foreign finisher
 * waits for exit (see cl_work_claim). */
bool cl_work_busy_enter(collie_work *w);
void cl_work_busy_exit(collie_work *w);

/* cl_work_done: DONE has been published (acquire). */
static inline bool cl_work_done(const collie_work *w) {
    return (atomic_load_explicit(&((collie_work *)w)->state, memory_order_acquire) &
            CL_WORK_STATE_MASK) == CL_WORK_DONE;
}

/* cl_work_is: does w belong to this ops table? (for typed accessors) */
static inline bool cl_work_is(const collie_work *w, const cl_work_ops *ops) {
    return w != NULL && w->ops == ops;
}

/* cl_work_wait_until: wait until DONE or until the absolute monotonic time
 * `until_ns`, without expiring the work (used by the tests). */
bool cl_work_wait_until(collie_work *w, int64_t until_ns);

/* run the engine's retire list now, at most `budget` works (loop; the
 * rest follow in the next loop steps); returns the number retired */
size_t cl_works_run_retired(collie_engine *e, size_t budget);
/* posted works not yet freed, in this process (a leak check) */
size_t cl_works_live(void);
/* number of tracked (posted, not retired) works (loop) */
size_t cl_works_tracked(collie_engine *e);

#endif
