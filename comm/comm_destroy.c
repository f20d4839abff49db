/*
 * comm_destroy.c — destroying a communicator: the "comm.destroy" work
 * (collie_comm_destroy_post) and the blocking destroy, which is post + wait.
 *
 * Design notes
 *  - The destroy is a work driven on the loop by one timer (`tick`), so
 *    the caller never waits: not for pending works, not for the store,
 *    not for a mutex held across network I/O. Its steps, each bounded:
 *      IDLE     pending works finish (the op timeout; an infinite one:
 *               COLLIE_TIMEOUT_MS); else the comm is aborted (EABORTED);
 *      SENT     an abort notice being written reaches the store (1 s);
 *      CLOSED   a failed comm's delayed close has happened (the peers read
 *               the notice before the connections drop; 1 s);
 *      LEFT     set "<prefix>gone/<rank>" = "left" and send "left <rank>" on
 *               the control channel (500 ms; only once the comm was
 *               ready), before the connections close, so a peer with no
 *               connection to us, or one that sees ours drop, can tell
 *               "left" from "died" (health.c);
 *      CLOSE    cl_comm_destroy_on_loop: the rest fails, the transport
 *               closes, the backends go, the comm leaves the engine;
 *      RETIRED  the works failed there retire, and control messages are
 *               sent (2 s);
 *      OUT      add 1 to "<prefix>left"; the member that makes it `size`
 *               deletes the generation's keys (1 s each; best effort);
 *      END      stats written, the comm's own store handle destroyed (the
 *               connection closes if it was the last), the user's comm
 *               reference dropped, then the work completes.
 *    The conditions of IDLE, SENT, CLOSED and RETIRED are state the loop
 *    and other threads change; the tick looks again every millisecond
 *    while it waits (destroy is rare; an idle loop never ticks).
 *  - The work takes over the caller's comm reference: the comm pointer is
 *    invalid for the caller once the post returned. The name is
 *    unregistered at once (a new comm may take it).
 *  - The work has no deadline of its own (its steps are bounded) and
 *    cannot be cancelled (a destroy is not undone: collie_work_cancel
 *    does nothing). Engine shutdown ends it: the comm's resident hook has
 *    closed the comm by then, or (the engine closing as the work started,
 *    before the residents' turn) the end closes it first; the work frees
 *    what is left and completes. A comm is never freed while its engine
 *    holds it.
 *  - Store requests hold a reference on the work until their callback;
 *    a callback that finds the work done drops the result.
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

enum destroy_step {
    D_IDLE,
    D_SENT,
    D_CLOSED,
    D_LEFT,
    D_CLOSE,
    D_RETIRED,
    D_OUT,
    D_FORGET,
    D_END,
};

/* Bounds of the steps (ms). CLOSED: comm.c's COMM_CLOSE_MAX_MS (500)
 * plus slack. */
#define DESTROY_SENT_MS    1000
#define DESTROY_CLOSED_MS  1000
#define DESTROY_LEFT_MS    500
#define DESTROY_RETIRED_MS 2000
#define DESTROY_STORE_MS   1000
#define DESTROY_TICK_US    1000

typedef struct destroy_work {
    collie_work base; /* "comm.destroy" */
    collie_comm *comm;
    char name[72]; /* for messages, valid after the comm is gone */
    int step;
    int res;          /* COLLIE_OK, or COLLIE_EABORTED if works had to be aborted */
    int64_t until_ns; /* bound of the current step's wait */
    int64_t grace_ms; /* IDLE's bound */
    struct event *tick;
    collie_work *req;  /* store request in flight (loop) */
    bool req_pending;  /* req's callback has not run yet */
    int64_t req_value; /* an add's result */
} destroy_work;

static void destroy_run(destroy_work *d);

static void destroy_on_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    destroy_run(arg);
}

/* Look again in a millisecond (loop). */
static bool destroy_wait_tick(destroy_work *d) {
    struct timeval tv = {0, DESTROY_TICK_US};
    return d->tick && event_add(d->tick, &tv) == 0;
}

static void destroy_set_step(destroy_work *d, int step, int32_t bound_ms) {
    d->step = step;
    d->until_ns = cl_now_ns() + (int64_t)bound_ms * CL_NS_PER_MS;
}

static void destroy_on_req(collie_work *w, void *arg) {
    destroy_work *d = arg;
    if (!cl_work_done(&d->base) && d->req == w) {
        d->req_pending = false;
        if (collie_work_result(w) == COLLIE_OK) collie_store_work_int(w, &d->req_value);
        d->req = NULL;
        if (d->tick) cl_event_soon(d->tick);
    }
    collie_work_release(w);
    collie_work_release(&d->base);
}

/* Post a store request for this step (loop); false if none went out. */
static bool destroy_post_req(destroy_work *d, int step) {
    collie_comm *c = d->comm;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = destroy_on_req;
    o.cb_arg = d;
    o.timeout_ms = step == D_LEFT ? DESTROY_LEFT_MS : DESTROY_STORE_MS;
    char key[160];
    int r;
    d->req_value = 0;
    collie_work_hold(&d->base);
    if (step == D_LEFT) {
        snprintf(key, sizeof key, "%sgone/%d", c->prefix, c->rank);
        r = collie_store_post_set(c->store, key, "left", 4, &o, &d->req);
    } else if (step == D_OUT) {
        snprintf(key, sizeof key, "%sleft", c->prefix);
        r = collie_store_post_add(c->store, key, 1, &o, &d->req);
    } else {
        r = collie_store_post_delete_prefix(c->store, c->prefix, &o, &d->req);
    }
    if (r != COLLIE_OK) {
        d->req = NULL;
        collie_work_release(&d->base);
        return false;
    }
    d->req_pending = true;
    return true;
}

/* A graceful leave, before the connections close (LEFT): the peers learn
 * this rank left, not died, from the control channel (those that watch
 * it) and from "<prefix>gone/<rank>" (health.c looks for it when this
 * process exits). */
static void destroy_announce_leave(destroy_work *d) {
    char msg[32];
    destroy_post_req(d, D_LEFT);
    snprintf(msg, sizeof msg, "left %d", d->comm->rank);
    (void)cl_comm_ctl_send(d->comm, msg, NULL, NULL);
}

static bool destroy_idle(collie_comm *c) { return atomic_load(&c->nactive) == 0; }

static bool destroy_ctl_sent(collie_comm *c) {
    pthread_mutex_lock(&c->mu);
    bool sent = c->ctl.sending == 0;
    pthread_mutex_unlock(&c->mu);
    return sent;
}

static bool destroy_closed(collie_comm *c) {
    pthread_mutex_lock(&c->mu);
    bool closed = !c->closing.pending;
    pthread_mutex_unlock(&c->mu);
    return closed;
}

/* The end (loop): what is left of the comm goes, then the work completes. */
static void destroy_end(destroy_work *d) {
    collie_comm *c = d->comm;
    d->step = D_END;
    if (d->req) collie_work_cancel(d->req); /* its callback drops it */
    if (c) {
        /* ended before CLOSE (the engine closing as its start ran): close
         * the comm here, so it is never freed while the engine still
         * holds it (its resident, its backends' pollers) */
        if (!c->destroyed && !c->engine_gone) cl_comm_destroy_on_loop(c);
        d->comm = NULL;
        cl_stats_write_on_destroy(c);
        collie_store_destroy(c->store); /* its own handle; inline on the loop */
        c->store = NULL;
        cl_comm_release(c);
    }
    if (d->res == COLLIE_OK)
        cl_work_finish(&d->base, COLLIE_OK, NULL);
    else
        cl_work_finish(&d->base, d->res, "comm '%s' was destroyed with works still pending",
                       d->name);
}

/* Wait for `ready`, up to the step's bound: true when the step may end. */
static bool destroy_until(destroy_work *d, bool ready) {
    if (ready || cl_now_ns() >= d->until_ns) return true;
    if (destroy_wait_tick(d)) return false;
    return true; /* no timer: go on rather than hang */
}

/* One pass (loop): every step whose condition holds, until one waits. */
static void destroy_run(destroy_work *d) {
    collie_comm *c = d->comm;
    for (int guard = 0; guard < 16 && !cl_work_done(&d->base); guard++) {
        if (d->req_pending) {
            if (cl_now_ns() < d->until_ns && destroy_wait_tick(d)) return;
            collie_work_cancel(d->req); /* past its bound: its callback drops it */
            d->req_pending = false;
            d->req = NULL;
        }
        switch (d->step) {
        case D_IDLE:
            if (c->engine_gone) {
                destroy_end(d);
                return;
            }
            if (!destroy_until(d, destroy_idle(c))) return;
            if (!destroy_idle(c)) {
                d->res = COLLIE_EABORTED;
                collie_comm_abort(c, "destroyed with works still pending");
            }
            destroy_set_step(d, D_SENT, DESTROY_SENT_MS);
            break;
        case D_SENT:
            if (!destroy_until(d, destroy_ctl_sent(c))) return;
            destroy_set_step(d, D_CLOSED, DESTROY_CLOSED_MS);
            break;
        case D_CLOSED:
            if (!destroy_until(d, destroy_closed(c))) return;
            destroy_set_step(d, D_LEFT, DESTROY_LEFT_MS + 100);
            if (c->was_ready && c->store && c->prefix[0]) destroy_announce_leave(d);
            break;
        case D_LEFT:
            if (!destroy_until(d, destroy_ctl_sent(c))) return;
            d->step = D_CLOSE;
            break;
        case D_CLOSE:
            cl_comm_destroy_on_loop(c);
            destroy_set_step(d, D_RETIRED, DESTROY_RETIRED_MS);
            break;
        case D_RETIRED:
            if (!destroy_until(d, destroy_idle(c) && destroy_ctl_sent(c))) return;
            destroy_set_step(d, D_OUT, DESTROY_STORE_MS + 100);
            /* a comm that never joined a generation has no keys */
            if (c->prefix[0] && c->store) destroy_post_req(d, D_OUT);
            break;
        case D_OUT:
            destroy_set_step(d, D_FORGET, DESTROY_STORE_MS + 100);
            /* the last member out deletes the generation's keys (a rank that
             * died never counts itself out: the next generation's join
             * cleans up then) */
            if (d->req_value == c->size) destroy_post_req(d, D_FORGET);
            break;
        default: destroy_end(d); return;
        }
    }
    if (!cl_work_done(&d->base) && !destroy_wait_tick(d)) destroy_end(d);
}

static void destroy_start(collie_work *w) {
    destroy_work *d = (destroy_work *)w;
    d->tick = event_new(cl_engine_base(w->engine), -1, 0, destroy_on_tick, d);
    destroy_set_step(d, D_IDLE, (int32_t)d->grace_ms);
    destroy_run(d);
}

static void destroy_detach(collie_work *w) {
    destroy_work *d = (destroy_work *)w;
    if (d->tick) event_free(d->tick);
    d->tick = NULL;
}

/* Only engine shutdown ends it from outside (on the loop, after the comm's
 * resident hook closed the comm): a destroy is not undone. */
static bool destroy_cancel(collie_work *w, int status, const char *msg) {
    (void)msg;
    destroy_work *d = (destroy_work *)w;
    if (status != COLLIE_ECLOSED || !cl_engine_on_loop(w->engine) || cl_work_done(w)) return false;
    destroy_end(d);
    return true;
}

static void destroy_free(collie_work *w) { free(w); }

static void destroy_describe(const collie_work *w, char *buf, size_t len) {
    snprintf(buf, len, " (comm '%s')", ((const destroy_work *)w)->name);
}

static const cl_work_ops destroy_ops = {.name = "comm.destroy",
                                        .start = destroy_start,
                                        .detach = destroy_detach,
                                        .cancel = destroy_cancel,
                                        .free = destroy_free,
                                        .describe = destroy_describe};

/* IDLE's bound: the op timeout; an infinite one waits the default op
 * timeout (COLLIE_TIMEOUT_MS): a destroy always ends. */
static int32_t destroy_grace_ms(const collie_comm *c) {
    return c->timeout_ms == COLLIE_TIMEOUT_INFINITE ? cl_config_get()->timeout_ms : c->timeout_ms;
}

int collie_comm_destroy_post(collie_comm *c, const collie_post_opts *o, collie_work **out) {
    cl_clear_last_error();
    if (out) *out = NULL;
    if (!c || !out)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_destroy_post: %s is NULL",
                                 c ? "out" : "comm");
    if (c->engine_gone)
        return cl_set_last_error(COLLIE_ECLOSED,
                                 "collie_comm_destroy_post: comm '%s': its engine was destroyed "
                                 "(collie_comm_destroy frees it)",
                                 c->name);
    if (atomic_exchange(&c->destroy_posted, true))
        return cl_set_last_error(COLLIE_ESTATE,
                                 "collie_comm_destroy_post: comm '%s' is already being destroyed",
                                 c->name);
    destroy_work *d = calloc(1, sizeof *d);
    if (!d) {
        atomic_store(&c->destroy_posted, false);
        return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_destroy_post: out of memory");
    }
    int r = COLLIE_EINVAL;
    if (!cl_opts_ok(o, sizeof(size_t)) ||
        (r = cl_comm_work_init(&d->base, c->engine, &destroy_ops, o)) != COLLIE_OK) {
        free(d);
        atomic_store(&c->destroy_posted, false);
        return cl_set_last_error(r, "collie_comm_destroy_post: bad post options");
    }
    d->comm = c;
    d->grace_ms = destroy_grace_ms(c);
    snprintf(d->name, sizeof d->name, "%s", c->name);
    if ((r = cl_work_post(&d->base)) != COLLIE_OK) {
        free(d);
        atomic_store(&c->destroy_posted, false);
        return cl_set_last_error(r, "collie_comm_destroy_post: comm '%s': the engine is closing",
                                 c->name);
    }
    cl_comm_unregister(c); /* the name is free from now on */
    *out = &d->base;
    return COLLIE_OK;
}

/* The longest a destroy work can take: the sum of its steps' bounds, plus
 * slack for a busy loop. */
static int32_t destroy_bound_ms(const collie_comm *c) {
    return destroy_grace_ms(c) + DESTROY_SENT_MS + DESTROY_CLOSED_MS + DESTROY_LEFT_MS +
           DESTROY_RETIRED_MS + 2 * DESTROY_STORE_MS + CL_ENGINE_CALL_TIMEOUT_MS;
}

int collie_comm_destroy(collie_comm *c) {
    if (!c) return COLLIE_OK;
    if (c->engine_gone) { /* the engine's shutdown closed it: only memory is left */
        cl_comm_unregister(c);
        cl_stats_write_on_destroy(c);
        collie_store_destroy(c->store);
        c->store = NULL;
        cl_comm_release(c);
        return COLLIE_OK;
    }
    if (cl_engine_on_loop(c->engine))
        return cl_set_last_error(COLLIE_ESTATE, "collie_comm_destroy on the progress thread "
                                                "(collie_comm_destroy_post does not block)");
    int32_t bound = destroy_bound_ms(c);
    char name[72];
    snprintf(name, sizeof name, "%s", c->name);
    collie_work *w;
    int res = collie_comm_destroy_post(c, NULL, &w);
    if (res != COLLIE_OK) return res;
    res = collie_work_wait(w, bound);
    if (res == COLLIE_INPROGRESS) {
        cl_log_comm(CL_LOG_ERROR, "comm", name, -1,
                    "destroy not processed by the progress loop in %d ms; leaking it", (int)bound);
        res = cl_set_last_error(COLLIE_ETIMEDOUT,
                                "collie_comm_destroy: comm '%s' not destroyed "
                                "in %d ms (the progress loop is stuck)",
                                name, (int)bound);
    }
    collie_work_release(w);
    return res;
}
