/*
 * registry.c — the engine's view of works: the tracked list, the deadline
 * queues with their one timer, and retirement.
 *
 * Design notes
 *  - Everything here runs in the loop's role and needs no lock: on the
 *    progress thread, or for one step on a thread helping it
 *    (engine/assist.c), which may start works and sweep deadlines but
 *    leaves retirement (callbacks, queue pushes) to the progress thread.
 *  - A posted work is tracked from its start command until it is retired;
 *    shutdown fails whatever is still tracked.
 *  - Deadlines live in a few FIFO lists, one per timeout value (works of
 *    one timeout arrive in deadline order), armed on one libevent timer: no
 *    event per work, and adding or removing a work is O(1) — a heap was
 *    O(log n) cache misses per work, a large part of a deep queue's cost.
 *    There are CL_DEADLINE_QUEUES (16) lists; further timeout values share
 *    the last one, kept in deadline order by an insert that walks from its
 *    back. The earliest deadline is the first of the lists' heads. The
 *    timer is re-armed when a new deadline comes before the armed one, and
 *    after each sweep.
 *  - Retire = untrack, producer's detach hook, completion queue push, user
 *    callback, drop the engine's reference — exactly once, in that order.
 *    A finish on the loop thread queues the work on the retire list and
 *    activates one event (callbacks never run inside the finisher's stack);
 *    a finish on another thread posts the work's retire command.
 *  - Both run in slices of CL_LOOP_SLICE: retiring a failed deep queue and
 *    expiring thousands of deadlines at once go on in the next loop steps
 *    (cl_event_soon), with the sockets polled in between.
 */
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "work/internal.h"

static cl_work_registry *registry(collie_engine *e) { return cl_engine_hooks_state(e); }

size_t cl_works_tracked(collie_engine *e) { return registry(e)->ntracked; }

/* ---- deadline queues --------------------------------------------------------- */

/* The queue for works of timeout `ms`: its own while there are free
 * queues, else the last one, shared (still kept in deadline order). */
static cl_list *deadline_queue(cl_work_registry *r, int32_t ms) {
    for (int i = 0; i < r->ndq; i++)
        if (r->dq[i].timeout_ms == ms) return &r->dq[i].works;
    if (r->ndq < CL_DEADLINE_QUEUES) {
        cl_deadline_queue *q = &r->dq[r->ndq++];
        q->timeout_ms = ms;
        cl_list_init(&q->works);
        return &q->works;
    }
    return &r->dq[CL_DEADLINE_QUEUES - 1].works;
}

/* Insert in deadline order, searching from the back: works of one timeout
 * arrive in deadline order, so this is O(1) but for posts racing from
 * several threads (a few steps). */
static void deadline_insert(cl_work_registry *r, collie_work *w) {
    cl_list *q = deadline_queue(r, w->timeout_ms);
    collie_work *it;
    cl_list_foreach_reverse(q, it, collie_work, dl_node) {
        if (it->deadline_ns <= w->deadline_ns) {
            cl_list_insert_after(&it->dl_node, &w->dl_node);
            return;
        }
    }
    cl_list_push_front(q, &w->dl_node); /* the earliest of them all */
}

/* The work whose deadline comes first, or NULL. */
static collie_work *deadline_first(const cl_work_registry *r) {
    collie_work *first = NULL;
    for (int i = 0; i < r->ndq; i++) {
        collie_work *w = cl_list_first(&r->dq[i].works, collie_work, dl_node);
        if (w && (!first || w->deadline_ns < first->deadline_ns)) first = w;
    }
    return first;
}

/* (Re)arm the one deadline timer to fire at `when_ns` (INT64_MAX: never). */
static void registry_arm_deadline(cl_work_registry *r, int64_t when_ns) {
    if (when_ns == INT64_MAX) {
        if (r->armed_ns != INT64_MAX) event_del(r->deadline_ev);
        r->armed_ns = INT64_MAX;
        return;
    }
    int64_t delta = when_ns - cl_now_ns();
    if (delta < 0) delta = 0;
    struct timeval tv = {.tv_sec = delta / 1000000000LL, .tv_usec = (delta % 1000000000LL) / 1000};
    event_add(r->deadline_ev, &tv);
    r->armed_ns = when_ns;
}

/* ---- tracking ----------------------------------------------------------------- */

static void work_track(collie_engine *e, collie_work *w) {
    cl_work_registry *r = registry(e);
    w->tracked = true;
    cl_list_push_front(&r->tracked, &w->trk_node);
    r->ntracked++;
    if (w->deadline_ns == INT64_MAX) return;
    deadline_insert(r, w);
    if (w->deadline_ns < r->armed_ns) registry_arm_deadline(r, w->deadline_ns);
}

static void work_untrack(collie_engine *e, collie_work *w) {
    cl_work_registry *r = registry(e);
    if (!w->tracked) return;
    w->tracked = false;
    cl_list_remove(&w->dl_node);
    cl_list_remove(&w->trk_node);
    r->ntracked--;
}

static void work_retire_append(collie_work *w);
static size_t registry_run_retired(cl_work_registry *r, size_t budget);

void cl_work_start_cmd(cl_cmd *c) {
    collie_work *w = cl_container_of(c, collie_work, start_cmd);
    collie_engine *e = w->engine;
    w->start_ns = cl_now_ns();
    w->start_ran = true;
    work_track(e, w);
    if (w->retire_deferred) { /* finished on the loop before it started */
        work_retire_append(w);
        return;
    }
    if (cl_engine_closing(e)) {
        /* ended as shutdown ends every other work (registry_fail_all):
         * through its provider, who may have more to do than publish */
        cl_work_cancel(w, COLLIE_ECLOSED, "engine %s is shutting down", cl_engine_name(e));
        return;
    }
    uint32_t s = CL_WORK_QUEUED;
    if (!atomic_compare_exchange_strong_explicit(&w->state, &s, CL_WORK_ACTIVE,
                                                 memory_order_acq_rel, memory_order_acquire))
        return; /* finished before it started (cancel, waiter); its retire follows */
    if (w->deadline_ns <= w->start_ns) {
        /* ended the way the deadline sweep ends one: cl_work_cancel, through
         * its provider's cancel hook, which knows what this end means (an
         * unmatched receive ends clean, no fault of its comm) */
        cl_work_cancel(w, COLLIE_ETIMEDOUT, "deadline of %d ms passed before it started",
                       (int)w->timeout_ms);
        return;
    }
    const char *prev = cl_engine_set_activity(e, w->ops->name);
    w->ops->start(w);
    cl_engine_set_activity(e, prev);
}

/* ---- retirement ---------------------------------------------------------------- */

/* Queue w for retirement and make sure the retire event runs (loop). */
static void work_retire_append(collie_work *w) {
    cl_work_registry *r = cl_work_registry_of(w);
    cl_list_push_back(&r->done, &w->done_node);
    event_active(r->done_ev, 0, 0);
}

static void work_retire_cmd(cl_cmd *c) {
    collie_work *w = cl_container_of(c, collie_work, retire_cmd);
    if (!w->start_ran) { /* cannot happen (FIFO), but never retire before start */
        w->retire_deferred = true;
        return;
    }
    work_retire_append(w);
    registry_run_retired(cl_work_registry_of(w), CL_LOOP_SLICE);
}

void cl_work_schedule_retire(collie_work *w) {
    collie_engine *e = w->engine;
    if (!cl_engine_on_loop(e)) {
        w->retire_cmd.fn = work_retire_cmd;
        if (cl_engine_post_cmd(e, &w->retire_cmd) != COLLIE_OK)
            CL_ERROR("work", "%s seq %llu finished after its engine stopped", w->ops->name,
                     (unsigned long long)w->seq);
        return;
    }
    /* Finished on the loop before its start command ran (e.g. cancelled
     * right after a post made on the loop): the start command, still
     * queued, must find the work alive, so it retires it instead. */
    if (!w->start_ran) {
        w->retire_deferred = true;
        return;
    }
    work_retire_append(w);
}

static void work_retire(collie_engine *e, collie_work *w) {
    work_untrack(e, w);
    const char *prev = cl_engine_set_activity(e, w->ops->name);
    if (w->ops->detach) w->ops->detach(w);
    if (w->cq) cl_cq_push(w->cq, w);
    if (w->cb) {
        cl_engine_set_activity(e, "user completion callback");
        w->cb(w, w->cb_arg);
    }
    cl_engine_set_activity(e, prev);
    cl_work_registry *r = registry(e);
    atomic_fetch_add_explicit(w->status == COLLIE_OK ? &r->completed : &r->failed, 1,
                              memory_order_relaxed);
    collie_work_release(w); /* the engine's reference */
}

size_t cl_works_run_retired(collie_engine *e, size_t budget) {
    return registry_run_retired(registry(e), budget);
}

/* Retire up to `budget` works; the rest in the next loop step. */
static size_t registry_run_retired(cl_work_registry *r, size_t budget) {
    collie_engine *e = r->engine;
    size_t n = 0;
    collie_work *w;
    /* callbacks and queue pushes run on the progress thread, never on a
     * thread helping it (engine/assist.c): leave them for its next turn */
    if (!cl_engine_on_progress_thread(e)) {
        if (!cl_list_empty(&r->done)) cl_event_soon(r->done_ev);
        return 0;
    }
    while ((w = cl_list_first(&r->done, collie_work, done_node))) {
        if (n == budget) {
            cl_event_soon(r->done_ev);
            break;
        }
        cl_list_remove(&w->done_node);
        work_retire(e, w);
        n++;
    }
    return n;
}

/* End the works whose deadline passed, up to a slice; the rest (their
 * deadlines passed too) in the next loop step. */
static void registry_sweep_deadlines(cl_work_registry *r, int64_t now_ns) {
    collie_work *w;
    for (size_t n = 0; n < CL_LOOP_SLICE; n++) {
        if (!(w = deadline_first(r)) || w->deadline_ns > now_ns) break;
        cl_list_remove(&w->dl_node); /* it stays tracked until retired */
        cl_work_cancel(w, COLLIE_ETIMEDOUT, "deadline of %d ms passed", (int)w->timeout_ms);
    }
    w = deadline_first(r);
    registry_arm_deadline(r, w ? w->deadline_ns : INT64_MAX);
}

static void registry_fail_all(void *state, int status, const char *why) {
    cl_work_registry *r = state;
    collie_work *w;
    cl_list_foreach(&r->tracked, w, collie_work, trk_node) cl_work_cancel(w, status, "%s", why);
}

/* ---- the engine's hooks ------------------------------------------------------- */

static void registry_on_done(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    registry_run_retired(arg, CL_LOOP_SLICE);
}

static void registry_on_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    cl_work_registry *r = arg;
    r->armed_ns = INT64_MAX;
    registry_sweep_deadlines(r, cl_now_ns());
}

static void registry_destroy(void *state) {
    cl_work_registry *r = state;
    if (!r) return;
    if (r->done_ev) event_free(r->done_ev);
    if (r->deadline_ev) event_free(r->deadline_ev);
    free(r);
}

static int registry_create(collie_engine *e, void **state) {
    cl_work_registry *r = calloc(1, sizeof *r);
    if (!r) return COLLIE_ENOMEM;
    r->engine = e;
    cl_list_init(&r->tracked);
    cl_list_init(&r->done);
    r->armed_ns = INT64_MAX;
    r->done_ev = event_new(cl_engine_base(e), -1, 0, registry_on_done, r);
    r->deadline_ev = event_new(cl_engine_base(e), -1, 0, registry_on_deadline, r);
    if (!r->done_ev || !r->deadline_ev) {
        registry_destroy(r);
        return COLLIE_ENOMEM;
    }
    *state = r;
    return COLLIE_OK;
}

static size_t registry_run_completions(void *state, size_t budget) {
    return registry_run_retired(state, budget);
}

static size_t registry_pending(void *state) { return ((cl_work_registry *)state)->ntracked; }

static uint64_t registry_progress(void *state) {
    cl_work_registry *r = state;
    uint64_t retired = atomic_load_explicit(&r->completed, memory_order_relaxed) +
                       atomic_load_explicit(&r->failed, memory_order_relaxed);
    return retired * 1000003u + r->ntracked;
}

const cl_engine_hooks cl_work_engine_hooks = {
    .create = registry_create,
    .destroy = registry_destroy,
    .run_completions = registry_run_completions,
    .fail_all = registry_fail_all,
    .pending = registry_pending,
    .progress = registry_progress,
};

/* ---- stats ------------------------------------------------------------------------- */

void cl_works_count_post(collie_engine *e, int delta) {
    /* a negative delta wraps to a subtraction (unsigned arithmetic) */
    atomic_fetch_add_explicit(&registry(e)->posted, (uint64_t)(int64_t)delta, memory_order_relaxed);
}

int collie_engine_get_stats(const collie_engine *e, collie_engine_stats *st) {
    if (!e || !st)
        return cl_set_last_error(COLLIE_EINVAL, "collie_engine_get_stats: NULL argument");
    if (st->size < offsetof(collie_engine_stats, residents))
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_engine_get_stats: size %zu is too small (set it with "
                                 "COLLIE_ENGINE_STATS_INIT)",
                                 st->size);
    const cl_work_registry *r = cl_engine_hooks_state(e);
    collie_engine_stats s = {0};
    s.works_completed = atomic_load_explicit(&r->completed, memory_order_relaxed);
    s.works_failed = atomic_load_explicit(&r->failed, memory_order_relaxed);
    s.works_posted = atomic_load_explicit(&r->posted, memory_order_relaxed); /* after: >= */
    uint64_t ended = s.works_completed + s.works_failed;
    s.works_in_flight = s.works_posted > ended ? s.works_posted - ended : 0;
    s.stalls = cl_engine_stall_count(e);
    s.residents = cl_engine_residents(e);
    s.helper_steps = cl_engine_helper_steps(e);
    s.size = st->size < sizeof s ? st->size : sizeof s;
    memcpy(st, &s, s.size);
    return COLLIE_OK;
}
