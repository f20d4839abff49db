/*
 * dummy_backend.c — an example out-of-tree backend plugin, "dummy" (cpu):
 * collectives between ranks that live in one process, through memory.
 * Supports barrier and allreduce (sum, prod, min, max over int32, int64,
 * fp32, fp64); anything else is COLLIE_ENOTSUP.
 *
 * Design notes
 *  - Uses only collie.h, collie_backend.h and the core services table.
 *    Built as libcollie_dummy.so; collie finds it through COLLIE_PLUGIN_PATH
 *    and calls collie_backend_plugin_v3(). See README.md.
 *  - Ranks meet in a process-global list of groups keyed by the comm id
 *    (core->comm_id: name + generation, so a re-created comm never meets
 *    its earlier incarnation). Each collective of a group has a room keyed
 *    by the work's sequence number (equal on every rank). start() copies
 *    the rank's input into the room; the last rank to arrive reduces the
 *    copies (under the lock: this is an example, not a fast path).
 *  - One mutex, dummy_mu, guards groups, rooms and room slots. Nothing is
 *    called out while it is held (collect under the lock, run after).
 *  - A rank's work and user buffers are touched only on that rank's
 *    progress thread, inside work_busy_enter/exit: the last arriver
 *    delivers to the ranks that share its thread (one engine: the common
 *    case); a rank on another engine picks its result up in its own poll
 *    hook, which is on while it has pending works.
 *  - Room lifetime: each occupied slot holds a reference; whoever empties a
 *    slot (a delivery or detach) drops it once done with the room.
 *  - abort fails this rank's pending works with the given status and marks
 *    the group broken; peers then fault with COLLIE_EPEER (in their poll, or
 *    at their next start), as a TCP peer sees a closed connection.
 *  - destroy empties this rank's slots, so a detach that comes after it
 *    (state NULL) has nothing left to do.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie_backend.h"

#define DUMMY_POLL_US 1000

typedef struct dummy_work dummy_work;

typedef struct dummy_slot {
    void *input;      /* this rank's copy of its input, until reduced */
    dummy_work *work; /* waiting for the result; NULL once delivered */
} dummy_slot;

typedef struct dummy_room {
    struct dummy_room *next;
    uint64_t seq;
    collie_coll_args args; /* of the first arrival: the others must match */
    int first_rank, arrived, refs;
    bool done;
    void *result; /* allreduce: the reduced data, once done */
    dummy_slot slot[];
} dummy_room;

typedef struct dummy_group {
    struct dummy_group *next;
    uint64_t id;
    int size, attached;
    int broken_rank; /* -1 while every rank is healthy */
    char reason[256];
    dummy_room *rooms;
} dummy_group;

typedef struct dummy_comm {
    collie_bcomm *bc;
    const collie_core_services *core;
    int rank;
    dummy_group *g;
    dummy_work *pending; /* started and not detached (this rank's loop only) */
    bool aborted;
} dummy_comm;

struct dummy_work { /* lives inside the core's work (work_data_size) */
    collie_work *w;
    dummy_comm *dc;
    collie_coll_args args;
    dummy_room *room; /* waiting in it (under dummy_mu) */
    dummy_room *got;  /* being delivered from it */
    bool linked;
    dummy_work *next, *prev, *ready_next;
};

static pthread_mutex_t dummy_mu = PTHREAD_MUTEX_INITIALIZER;
static dummy_group *dummy_groups;

/* ---- arithmetic -------------------------------------------------------------- */

/* Integer sum and product wrap (computed unsigned), as in collie.h. */
#define DUMMY_REDUCE_FN(NAME, T, U)                                                                \
    static void NAME(void *accv, const void *inv, size_t n, collie_redop op) {                     \
        T *acc = accv;                                                                             \
        const T *in = inv;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                           \
            switch (op) {                                                                          \
            case COLLIE_SUM: acc[i] = (T)((U)acc[i] + (U)in[i]); break;                            \
            case COLLIE_PROD: acc[i] = (T)((U)acc[i] * (U)in[i]); break;                           \
            case COLLIE_MIN: acc[i] = in[i] < acc[i] ? in[i] : acc[i]; break;                      \
            default: acc[i] = in[i] > acc[i] ? in[i] : acc[i]; break;                              \
            }                                                                                      \
        }                                                                                          \
    }
DUMMY_REDUCE_FN(dummy_reduce_i32, int32_t, uint32_t)
DUMMY_REDUCE_FN(dummy_reduce_i64, int64_t, uint64_t)
DUMMY_REDUCE_FN(dummy_reduce_f32, float, float)
DUMMY_REDUCE_FN(dummy_reduce_f64, double, double)

static void dummy_reduce(void *acc, const void *in, const collie_coll_args *a) {
    switch (a->dtype) {
    case COLLIE_INT32: dummy_reduce_i32(acc, in, a->count, a->op); break;
    case COLLIE_INT64: dummy_reduce_i64(acc, in, a->count, a->op); break;
    case COLLIE_FP32: dummy_reduce_f32(acc, in, a->count, a->op); break;
    default: dummy_reduce_f64(acc, in, a->count, a->op); break;
    }
}

static bool dummy_supported(const collie_coll_args *a) {
    if (a->kind == COLLIE_COLL_BARRIER) return true;
    if (a->kind != COLLIE_COLL_ALLREDUCE || a->op > COLLIE_MAX) return false;
    return a->dtype == COLLIE_INT32 || a->dtype == COLLIE_INT64 || a->dtype == COLLIE_FP32 ||
           a->dtype == COLLIE_FP64;
}

/* the core's services: one table per process, the same for every comm;
 * atomic: every comm's init stores it, on its own engine's thread */
static _Atomic(const collie_core_services *) dummy_core;

static size_t dummy_bytes(const collie_coll_args *a) {
    const collie_core_services *core = atomic_load_explicit(&dummy_core, memory_order_acquire);
    return a->kind == COLLIE_COLL_ALLREDUCE ? a->count * core->dtype_size(a->dtype) : 0;
}

static void dummy_describe(const collie_coll_args *a, char *buf, size_t len) {
    const collie_core_services *core = atomic_load_explicit(&dummy_core, memory_order_acquire);
    if (a->kind == COLLIE_COLL_ALLREDUCE)
        snprintf(buf, len, "allreduce of %zu %s (%s)", a->count, core->dtype_name(a->dtype),
                 core->redop_name(a->op));
    else
        snprintf(buf, len, "%s", collie_coll_kind_name(a->kind));
}

/* ---- groups and rooms (under dummy_mu) --------------------------------------- */

static dummy_group *dummy_group_attach_locked(uint64_t id, int size) {
    for (dummy_group *g = dummy_groups; g; g = g->next)
        if (g->id == id) {
            g->attached++;
            return g;
        }
    dummy_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->id = id;
    g->size = size;
    g->attached = 1;
    g->broken_rank = -1;
    g->next = dummy_groups;
    dummy_groups = g;
    return g;
}

static void dummy_room_free(dummy_room *r, int size) {
    for (int i = 0; i < size; i++)
        free(r->slot[i].input);
    free(r->result);
    free(r);
}

static void dummy_group_detach_locked(dummy_group *g) {
    if (--g->attached > 0) return;
    for (dummy_group **pp = &dummy_groups; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    while (g->rooms) { /* none left once every rank emptied its slots */
        dummy_room *r = g->rooms;
        g->rooms = r->next;
        dummy_room_free(r, g->size);
    }
    free(g);
}

static dummy_room *dummy_room_get_locked(dummy_group *g, uint64_t seq, const collie_coll_args *a,
                                         int rank) {
    for (dummy_room *r = g->rooms; r; r = r->next)
        if (r->seq == seq) return r;
    dummy_room *r = calloc(1, sizeof *r + (size_t)g->size * sizeof(dummy_slot));
    if (!r) return NULL;
    r->seq = seq;
    r->args = *a;
    r->first_rank = rank;
    r->next = g->rooms;
    g->rooms = r;
    return r;
}

static void dummy_room_unref_locked(dummy_group *g, dummy_room *r) {
    if (--r->refs > 0) return;
    for (dummy_room **pp = &g->rooms; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    dummy_room_free(r, g->size);
}

/* Every rank has arrived: reduce the inputs into the result. */
static void dummy_room_complete_locked(dummy_room *r, int size) {
    if (dummy_bytes(&r->args) > 0) {
        r->result = r->slot[0].input;
        r->slot[0].input = NULL;
        for (int i = 1; i < size; i++) {
            dummy_reduce(r->result, r->slot[i].input, &r->args);
            free(r->slot[i].input);
            r->slot[i].input = NULL;
        }
    }
    r->done = true;
}

/* Take `dw` out of its finished room for delivery (its reference moves to
 * dw->got) and push it on *ready. */
static void dummy_take_locked(dummy_work *dw, dummy_work **ready) {
    dw->room->slot[dw->dc->rank].work = NULL;
    dw->got = dw->room;
    dw->room = NULL;
    dw->ready_next = *ready;
    *ready = dw;
}

/* ---- delivery (no lock held; on the receiving rank's progress thread) ------- */

static void dummy_deliver(dummy_work *ready) {
    for (dummy_work *dw = ready; dw; dw = dw->ready_next) {
        const collie_core_services *core = dw->dc->core;
        size_t bytes = dummy_bytes(&dw->args);
        /* busy_enter fails if the work already ended (deadline, cancel):
         * then its buffers are no longer ours to write */
        if (bytes && !core->work_busy_enter(dw->w)) continue;
        if (bytes) {
            memcpy(dw->args.recvbuf, dw->got->result, bytes);
            core->work_busy_exit(dw->w);
        }
        core->work_finish(dw->w, COLLIE_OK, NULL);
    }
    pthread_mutex_lock(&dummy_mu);
    for (dummy_work *dw = ready; dw; dw = dw->ready_next) {
        dummy_room_unref_locked(dw->dc->g, dw->got);
        dw->got = NULL;
    }
    pthread_mutex_unlock(&dummy_mu);
}

/* ---- backend ops ------------------------------------------------------------- */

static int dummy_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    if (!COLLIE_CORE_USABLE(core)) return COLLIE_ENOTSUP; /* a core of another ABI */
    atomic_store_explicit(&dummy_core, core, memory_order_release);
    dummy_comm *dc = calloc(1, sizeof *dc);
    if (!dc) return COLLIE_ENOMEM;
    dc->bc = bc;
    dc->core = core;
    dc->rank = core->rank(bc);
    int size = core->nranks(bc);
    pthread_mutex_lock(&dummy_mu);
    dc->g = dummy_group_attach_locked(core->comm_id(bc), size);
    int gsize = dc->g ? dc->g->size : size;
    pthread_mutex_unlock(&dummy_mu);
    *state = dc; /* destroy frees it, whatever happens next */
    if (!dc->g) return COLLIE_ENOMEM;
    if (gsize != size)
        core->init_done(bc, COLLIE_EINVAL, "dummy: rank %d says size %d, another rank said %d",
                        dc->rank, size, gsize);
    else
        core->init_done(bc, COLLIE_OK, NULL);
    return COLLIE_OK;
}

static int dummy_start(void *state, collie_work *w, const collie_coll_args *a) {
    dummy_comm *dc = state;
    const collie_core_services *core = dc->core;
    dummy_work *dw = core->work_backend_data(w);
    memset(dw, 0, sizeof *dw); /* detach comes for this work whatever start returns */
    char what[96], why[400] = "";
    dummy_describe(a, what, sizeof what);
    if (!dummy_supported(a)) {
        core->log(1, "dummy",
                  "%s: not supported (only barrier, and allreduce sum/prod/min/max of "
                  "int32/int64/fp32/fp64)",
                  what);
        return COLLIE_ENOTSUP;
    }
    dw->w = w;
    dw->dc = dc;
    dw->args = *a;
    size_t bytes = dummy_bytes(a);
    void *copy = NULL;
    if (bytes) {
        if (!(copy = malloc(bytes))) {
            core->fault(dc->bc, w, COLLIE_ENOMEM, "dummy: no memory for %zu bytes", bytes);
            return COLLIE_OK;
        }
        if (!core->work_busy_enter(w)) { /* already ended (cancel): its detach follows */
            free(copy);
            return COLLIE_OK;
        }
        memcpy(copy, a->sendbuf, bytes);
        core->work_busy_exit(w);
    }

    int fault = COLLIE_OK;
    dummy_work *ready = NULL;
    pthread_mutex_lock(&dummy_mu);
    dummy_group *g = dc->g;
    dummy_room *r = NULL;
    if (g->broken_rank >= 0) {
        fault = COLLIE_EPEER;
        snprintf(why, sizeof why, "rank %d left the comm: %s", g->broken_rank, g->reason);
    } else if (!(r = dummy_room_get_locked(g, core->work_seq(w), a, dc->rank))) {
        fault = COLLIE_ENOMEM;
        snprintf(why, sizeof why, "no memory for a room");
    } else if (r->args.kind != a->kind || dummy_bytes(&r->args) != bytes ||
               (bytes && (r->args.dtype != a->dtype || r->args.op != a->op))) {
        char theirs[96];
        dummy_describe(&r->args, theirs, sizeof theirs);
        fault = COLLIE_EPROTO;
        snprintf(why, sizeof why, "mismatch: rank %d posted %s, rank %d posted %s", dc->rank, what,
                 r->first_rank, theirs);
    } else {
        r->slot[dc->rank].input = copy;
        r->slot[dc->rank].work = dw;
        copy = NULL;
        r->refs++;
        dw->room = r;
        if (++r->arrived == g->size) {
            dummy_room_complete_locked(r, g->size);
            for (int i = 0; i < g->size; i++) {
                dummy_work *o = r->slot[i].work;
                if (o && core->on_progress_thread(o->dc->bc)) dummy_take_locked(o, &ready);
            }
        }
    }
    pthread_mutex_unlock(&dummy_mu);
    free(copy);
    if (fault != COLLIE_OK) { /* the core fails w and aborts the comm */
        core->fault(dc->bc, w, fault, "dummy: %s", why);
        return COLLIE_OK;
    }
    dw->linked = true;
    dw->prev = NULL;
    dw->next = dc->pending;
    if (dc->pending) dc->pending->prev = dw;
    dc->pending = dw;
    core->want_poll(dc->bc, true, DUMMY_POLL_US);
    dummy_deliver(ready);
    return COLLIE_OK;
}

static void dummy_detach(void *state, collie_work *w) {
    dummy_comm *dc = state;
    if (!dc) return; /* destroyed before the work retired: nothing left */
    dummy_work *dw = dc->core->work_backend_data(w);
    if (!dw->linked) return;
    pthread_mutex_lock(&dummy_mu);
    if (dw->room) {
        dw->room->slot[dc->rank].work = NULL;
        dummy_room_unref_locked(dc->g, dw->room);
        dw->room = NULL;
    }
    pthread_mutex_unlock(&dummy_mu);
    if (dw->prev)
        dw->prev->next = dw->next;
    else
        dc->pending = dw->next;
    if (dw->next) dw->next->prev = dw->prev;
    dw->linked = false;
    if (!dc->pending) dc->core->want_poll(dc->bc, false, 0);
}

/* Results computed by a rank on another thread, and peers that left. */
static void dummy_poll(void *state) {
    dummy_comm *dc = state;
    dummy_work *ready = NULL, *victim = NULL;
    char why[300] = "";
    pthread_mutex_lock(&dummy_mu);
    for (dummy_work *dw = dc->pending; dw; dw = dw->next) {
        if (!dw->room) continue;
        if (dw->room->done)
            dummy_take_locked(dw, &ready);
        else if (dc->g->broken_rank >= 0 && !victim && !dc->aborted &&
                 !dc->core->work_test(dw->w)) {
            victim = dw;
            snprintf(why, sizeof why, "rank %d left the comm: %s", dc->g->broken_rank,
                     dc->g->reason);
        }
    }
    pthread_mutex_unlock(&dummy_mu);
    dummy_deliver(ready);
    if (victim) dc->core->fault(dc->bc, victim->w, COLLIE_EPEER, "dummy: %s", why);
}

static void dummy_abort(void *state, int status, const char *reason) {
    dummy_comm *dc = state;
    if (dc->aborted) return;
    dc->aborted = true;
    pthread_mutex_lock(&dummy_mu);
    if (dc->g->broken_rank < 0) {
        dc->g->broken_rank = dc->rank;
        snprintf(dc->g->reason, sizeof dc->g->reason, "%s", reason);
    }
    pthread_mutex_unlock(&dummy_mu);
    /* finishing only schedules the detach, so the list stays as it is */
    for (dummy_work *dw = dc->pending; dw; dw = dw->next)
        dc->core->work_finish(dw->w, status, "%s", reason);
}

static void dummy_destroy(void *state) {
    dummy_comm *dc = state;
    if (!dc) return;
    pthread_mutex_lock(&dummy_mu);
    for (dummy_work *dw = dc->pending; dw; dw = dw->next) {
        if (dw->room) {
            dw->room->slot[dc->rank].work = NULL;
            dummy_room_unref_locked(dc->g, dw->room);
            dw->room = NULL;
        }
        dw->linked = false;
    }
    if (dc->g) dummy_group_detach_locked(dc->g);
    pthread_mutex_unlock(&dummy_mu);
    free(dc);
}

static const collie_backend_ops dummy_ops = {
    .abi_version = COLLIE_BACKEND_ABI_VERSION,
    .size = sizeof(collie_backend_ops),
    .name = "dummy",
    .device = "cpu",
    .flags = 0,
    .work_data_size = sizeof(dummy_work),
    .init = dummy_init,
    .start = dummy_start,
    .detach = dummy_detach,
    .poll = dummy_poll,
    .abort = dummy_abort,
    .destroy = dummy_destroy,
};

/* collie_backend_plugin_v3: the one symbol collie looks up in the plugin. */
COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void);
COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void) { return &dummy_ops; }
