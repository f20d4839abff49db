/*
 * backend_events.c — the loop's events as backends see them: fd watches,
 * timers and the poll hook (collie_backend.h), over libevent, so that no
 * libevent type crosses the backend ABI.
 *
 * Design notes
 *  - A collie_watch is one persistent libevent event plus the backend's
 *    callback; the trampoline turns libevent's `short what` into
 *    COLLIE_WATCH_* bits. A watch with fd -1 is a timer.
 *  - Polling runs on a periodic timerfd watched by the loop, not on a
 *    libevent timer: libevent sleeps in epoll_wait with a millisecond
 *    timeout, so a 200 us timer would fire every few ms once the loop
 *    sleeps (measured: a 200 us libevent timer fires every 4 ms here).
 *    libevent's precise-timer mode would fix that for every timer, but costs
 *    two syscalls per loop turn while the loop spins. Without a timerfd, a
 *    libevent timer does it.
 *  - The poll hook runs on the progress thread only, never on a thread
 *    helping it (engine/assist.c): CUDA backends keep their device and
 *    locks to that thread.
 *  - ops->progress is an engine poller (engine/assist.c): every turn of a
 *    spinning loop and every helping thread runs it, and the loop runs it
 *    with `sleeping` before it blocks.
 *  - want_poll from another thread stores the wish and posts one command
 *    (poll_cmd_queued keeps it to one in flight); the loop applies the
 *    latest wish.
 */
#include <event2/event.h>
#include <stdlib.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "engine/engine.h"

struct collie_watch {
    struct event *ev;
    collie_watch_cb cb;
    void *arg;
};

static void watch_trampoline(evutil_socket_t fd, short what, void *arg) {
    collie_watch *wt = arg;
    unsigned events = ((what & EV_READ) ? COLLIE_WATCH_READ : 0u) |
                      ((what & EV_WRITE) ? COLLIE_WATCH_WRITE : 0u) |
                      ((what & EV_TIMEOUT) ? COLLIE_WATCH_TIMEOUT : 0u);
    wt->cb((int)fd, events, wt->arg);
}

static short watch_what(unsigned events) {
    return (short)(((events & COLLIE_WATCH_READ) ? EV_READ : 0) |
                   ((events & COLLIE_WATCH_WRITE) ? EV_WRITE : 0) |
                   ((events & COLLIE_WATCH_TIMEOUT) ? EV_TIMEOUT : 0));
}

collie_watch *cl_backend_watch_new(collie_bcomm *bc, int fd, unsigned events, collie_watch_cb cb,
                                   void *arg) {
    if (!cb || (fd < 0) != (events == 0)) return NULL;
    collie_watch *wt = calloc(1, sizeof *wt);
    if (!wt) return NULL;
    wt->cb = cb;
    wt->arg = arg;
    short what =
        (short)((events & (COLLIE_WATCH_READ | COLLIE_WATCH_WRITE)) ? watch_what(events) : 0);
    wt->ev = event_new(cl_engine_base(bc->comm->engine), fd, (short)(what | EV_PERSIST),
                       watch_trampoline, wt);
    if (!wt->ev) {
        free(wt);
        return NULL;
    }
    return wt;
}

int cl_backend_watch_start(collie_watch *wt, int64_t timeout_us) {
    if (!wt) return COLLIE_EINVAL;
    struct timeval tv = {.tv_sec = (time_t)(timeout_us / 1000000),
                         .tv_usec = (suseconds_t)(timeout_us % 1000000)};
    return event_add(wt->ev, timeout_us >= 0 ? &tv : NULL) == 0 ? COLLIE_OK : COLLIE_ENOMEM;
}

void cl_backend_watch_stop(collie_watch *wt) {
    if (wt) event_del(wt->ev);
}

void cl_backend_watch_activate(collie_watch *wt, unsigned events) {
    if (wt) event_active(wt->ev, watch_what(events), 0);
}

void cl_backend_watch_free(collie_watch *wt) {
    if (!wt) return;
    event_free(wt->ev);
    free(wt);
}

/* ---- the poll hook ---------------------------------------------------------- */

static void poll_fire(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(what);
    collie_bcomm *bc = arg;
    /* the hook runs on the progress thread only (a CUDA backend's device
     * and locks): a helper leaves the timerfd readable for its next turn */
    if (!cl_engine_on_progress_thread(bc->comm->engine)) return;
    if (fd >= 0) {
        uint64_t expirations;
        ssize_t n = read(fd, &expirations, sizeof expirations); /* re-arms readability */
        CL_UNUSED(n);
    }
    if (bc->state && bc->ops->poll) bc->ops->poll(bc->state);
}

static bool poll_event_make(collie_bcomm *bc) {
    struct event_base *base = cl_engine_base(bc->comm->engine);
    bc->poll_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (bc->poll_fd >= 0) {
        bc->poll_ev = event_new(base, bc->poll_fd, EV_READ | EV_PERSIST, poll_fire, bc);
        if (bc->poll_ev && event_add(bc->poll_ev, NULL) == 0) return true;
        if (bc->poll_ev) event_free(bc->poll_ev);
        close(bc->poll_fd);
    }
    bc->poll_fd = -1;
    bc->poll_ev = event_new(base, -1, EV_PERSIST, poll_fire, bc);
    return bc->poll_ev != NULL;
}

static void poll_apply(collie_bcomm *bc, bool on, int32_t interval_us) {
    if (!bc->poll_ev && (!on || !poll_event_make(bc))) return;
    if (on == bc->poll_on && interval_us == bc->poll_interval_us) return;
    bc->poll_on = on;
    bc->poll_interval_us = interval_us;
    if (interval_us < 1) interval_us = 1;
    struct timespec every = {.tv_sec = interval_us / 1000000,
                             .tv_nsec = (long)(interval_us % 1000000) * 1000};
    if (bc->poll_fd >= 0) { /* periodic while on; disarmed (never readable) while off */
        struct itimerspec its = {.it_interval = every, .it_value = every};
        if (!on) its = (struct itimerspec){{0, 0}, {0, 0}};
        timerfd_settime(bc->poll_fd, 0, &its, NULL);
        return;
    }
    event_del(bc->poll_ev);
    if (!on) return;
    struct timeval tv = {.tv_sec = every.tv_sec, .tv_usec = every.tv_nsec / 1000};
    event_add(bc->poll_ev, &tv);
}

static bool progress_fire(cl_poller *p, bool sleeping) {
    collie_bcomm *bc = cl_container_of(p, collie_bcomm, progress);
    return bc->state && bc->ops->progress && bc->ops->progress(bc->state, sleeping);
}

void cl_backend_progress_start(collie_bcomm *bc) {
    if (!bc->ops->progress || !bc->state) return;
    bc->progress.poll = progress_fire;
    cl_engine_add_poller(bc->comm->engine, &bc->progress);
}

void cl_backend_poll_free(collie_bcomm *bc) {
    cl_engine_remove_poller(bc->comm->engine, &bc->progress);
    if (bc->poll_ev) event_free(bc->poll_ev);
    if (bc->poll_fd >= 0) close(bc->poll_fd);
    bc->poll_ev = NULL;
    bc->poll_fd = -1;
    bc->poll_on = false;
}

static void poll_cmd_run(cl_cmd *cmd) {
    collie_bcomm *bc = cl_container_of(cmd, collie_bcomm, poll_cmd);
    atomic_store(&bc->poll_cmd_queued, false);
    int32_t wish = atomic_load(&bc->poll_wish_us);
    if (bc->state) poll_apply(bc, wish > 0, wish);
}

void cl_backend_want_poll(collie_bcomm *bc, bool on, int32_t interval_us) {
    if (cl_engine_on_loop(bc->comm->engine)) {
        poll_apply(bc, on, interval_us);
        return;
    }
    atomic_store(&bc->poll_wish_us, on ? (interval_us < 1 ? 1 : interval_us) : 0);
    if (atomic_exchange(&bc->poll_cmd_queued, true)) return;
    bc->poll_cmd.fn = poll_cmd_run;
    if (cl_engine_post_cmd(bc->comm->engine, &bc->poll_cmd) != COLLIE_OK)
        atomic_store(&bc->poll_cmd_queued, false);
}
