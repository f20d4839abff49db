/*
 * internal.h — declarations shared by the files of the work module only.
 */
#ifndef CL_WORK_INTERNAL_H
#define CL_WORK_INTERNAL_H

#include "work/work.h"

struct event;

/* Works of one timeout value, in deadline order (collie_work.dl_node). */
typedef struct cl_deadline_queue {
    int32_t timeout_ms;
    cl_list works;
} cl_deadline_queue;

/* distinct timeouts with a queue of their own; the last queue also takes
 * every further value */
#define CL_DEADLINE_QUEUES 16

/* Per-engine bookkeeping of the work module (loop thread only; created by
 * the engine's hooks, registry.c). */
typedef struct cl_work_registry {
    collie_engine *engine;
    cl_list tracked; /* collie_work.trk_node: posted, not yet retired */
    size_t ntracked;
    cl_list done; /* finished, waiting to be retired (collie_work.done_node) */
    cl_deadline_queue dq[CL_DEADLINE_QUEUES];
    int ndq;
    int64_t armed_ns;          /* when the deadline timer fires, INT64_MAX if unarmed */
    struct event *done_ev;     /* activated to run the retire list */
    struct event *deadline_ev; /* the one deadline timer */
    /* counts (collie_engine_get_stats, any thread; completed + failed =
     * retired, which the spin heuristic watches): posted by any thread,
     * the rest by the loop as works retire */
    _Atomic uint64_t posted, completed, failed;
} cl_work_registry;

/* the registry of a work's engine */
static inline cl_work_registry *cl_work_registry_of(const collie_work *w) {
    return cl_engine_hooks_state(w->engine);
}

/* registry.c */
void cl_work_start_cmd(cl_cmd *c);
void cl_works_count_post(collie_engine *e, int delta); /* stats: works posted (any thread) */
void cl_work_schedule_retire(collie_work *w);

/* wait.c */
void cl_work_wake_waiters(collie_work *w);

/* cq.c */
void cl_cq_hold(collie_cq *cq);
void cl_cq_release(collie_cq *cq);
void cl_cq_push(collie_cq *cq, collie_work *w);

#endif
