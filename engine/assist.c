/*
 * assist.c — caller-driven progress: a thread that waits for, tests or has
 * just posted a work may run one step of the loop's work itself, so a
 * small operation does not pay for waking or scheduling the progress
 * thread (a wake-up on the other core costs ~40-50 us here; MPI_Test
 * drives progress the same way).
 *
 * Design notes
 *  - The deliberate exception to "only the progress thread touches the
 *    loop": the loop's role has a lock, progress_mu. The progress thread
 *    holds it whenever it runs the loop - while it sleeps in epoll too -
 *    and lets go only between two turns of a spinning loop (around its
 *    sched_yield, or its short sleep while a waiter polls). A helper takes
 *    it with a try-lock only, never waits for it (a busy lock means the
 *    progress thread is doing the work), and only while the loop spins
 *    (works in flight) and is not waiting to take it back (loop_wants: a
 *    mutex is not fair, and helpers that try-lock in a tight loop must not
 *    starve the progress thread). So the event base and every loop-owned
 *    object still have one user at a time, with the mutex's ordering
 *    between them; libevent needs no locking of its own.
 *  - What a helper runs: the queued commands that allow it (work starts,
 *    cl_cmd.assist_ok), in queue order and stopping at the first other
 *    command, then one step of every poller (a transport reads its
 *    shared-memory rings and writes what fits: no system call), then an
 *    event pass of the loop (EVLOOP_NONBLOCK | EVLOOP_ONCE: sockets and
 *    timers) - every step when a poller reports socket links (TCP peers),
 *    else every CL_ASSIST_EVENT_EVERY steps (the store, a doorbell).
 *    Other commands (destroys, aborts, calls) stay on the progress thread.
 *  - No user code on a helper: completion callbacks and completion-queue
 *    pushes happen at retirement, which runs only on the progress thread
 *    (work/registry.c); a comm's error callback is handed to it
 *    (comm/comm.c); a backend's poll hook (CUDA: device and locks) runs on
 *    the progress thread only, and a backend's own work_test service never
 *    helps (it may hold the lock that hook takes). cl_engine_on_loop is
 *    true on a helper for the step; cl_engine_on_progress_thread is not.
 *  - While a waiter polls and no poller reports socket links (every link
 *    of the engine's comms is a ring), the spinning progress thread steps
 *    back (engine.c), so on a busy machine the waiter, which runs the step
 *    itself, has the core.
 *  - Invariants kept: a work still ends exactly once (its state word's
 *    claim), its deadline is still swept by the loop's timer and enforced
 *    by its waiter, faults are still seen by the loop (a helper only adds
 *    reads), and the stall monitor's heartbeat comes from the loop alone: a
 *    helper cannot hide a stuck progress thread, because a stuck thread
 *    holds the lock.
 *  - Lock order: progress_mu is taken only by try-lock outside the
 *    progress thread, so it can follow any lock; under it a helper takes
 *    the locks the loop takes (qmu, a comm's mu, a work's state).
 *  - Destroy: `helpers` counts the threads inside cl_engine_assist and
 *    `polling_waiters` those in a wait's polling phase; a helper that gets
 *    the lock after the loop ended finds `spinning` false and leaves, and
 *    destroy waits (bounded) for both counts to reach zero before it frees
 *    the engine. (A thread preempted between collie_work_test's look at a
 *    pending work and its count for longer than the whole destroy would
 *    still touch a freed engine: works do not hold their engine alive.)
 */
#include <event2/event.h>
#include <sched.h>
#include <time.h>

#include "engine/engine_impl.h"

/* the most commands a helper runs in one step */
#define CL_ASSIST_CMDS 64
/* a helper's event pass when no backend asks for one: every this many steps */
#define CL_ASSIST_EVENT_EVERY 8

void cl_engine_add_poller(collie_engine *e, cl_poller *p) {
    if (!cl_list_linked(&p->node)) cl_list_push_back(&e->pollers, &p->node);
}

void cl_engine_remove_poller(collie_engine *e, cl_poller *p) {
    (void)e;
    if (cl_list_linked(&p->node)) cl_list_remove(&p->node);
}

bool cl_engine_run_pollers(collie_engine *e, bool sleeping) {
    bool sockets = false;
    cl_poller *p;
    cl_list_foreach(&e->pollers, p, cl_poller, node) sockets |= p->poll(p, sleeping);
    return sockets;
}

bool cl_engine_assist(collie_engine *e) {
    if (!e || cl_tls_loop_engine != NULL) return false; /* a loop (or a helper) already */
    if (!atomic_load_explicit(&e->spinning, memory_order_relaxed) ||
        atomic_load_explicit(&e->loop_wants, memory_order_relaxed))
        return false; /* asleep (it holds the lock), or about to take it back */
    atomic_fetch_add_explicit(&e->helpers, 1, memory_order_seq_cst);
    bool ran = false;
    if (!atomic_load_explicit(&e->closing, memory_order_seq_cst) &&
        pthread_mutex_trylock(&e->progress_mu) == 0) {
        /* the loop may have stopped spinning (or ended) before we got it */
        if (atomic_load_explicit(&e->spinning, memory_order_seq_cst)) {
            cl_tls_loop_engine = e;
            cl_tls_helping = true;
            if (atomic_load_explicit(&e->queued, memory_order_acquire) ||
                !cl_list_empty(&e->backlog))
                cl_engine_drain_cmds(e, CL_ASSIST_CMDS, true);
            /* the rings need no system call; sockets (TCP peers, the
             * store) need an event pass: every step if a backend has
             * socket links, else every few steps */
            bool sockets = cl_engine_run_pollers(e, false);
            if (sockets || ++e->helper_turn % CL_ASSIST_EVENT_EVERY == 0)
                event_base_loop(e->base, EVLOOP_NONBLOCK | EVLOOP_ONCE);
            atomic_fetch_add_explicit(&e->helper_steps, 1, memory_order_relaxed);
            cl_tls_helping = false;
            cl_tls_loop_engine = NULL;
            ran = true;
        }
        pthread_mutex_unlock(&e->progress_mu);
    }
    atomic_fetch_sub_explicit(&e->helpers, 1, memory_order_seq_cst);
    return ran;
}

void cl_engine_waiter_polls(collie_engine *e, bool on) {
    /* only a thread that can help counts: a loop's thread cannot (and a
     * waiter that cannot help must not make the loop step back) */
    if (e && cl_tls_loop_engine == NULL)
        atomic_fetch_add_explicit(&e->polling_waiters, on ? 1u : (uint32_t)-1,
                                  memory_order_relaxed);
}

uint64_t cl_engine_helper_steps(const collie_engine *e) {
    return atomic_load_explicit(&((collie_engine *)e)->helper_steps, memory_order_relaxed);
}

void cl_engine_wait_helpers(collie_engine *e) {
    /* helpers, and waiters in their polling phase (they touch the engine
     * once more as they leave it; every work has ended by now) */
    int64_t give_up = cl_now_ns() + 1000 * CL_NS_PER_MS;
    while ((atomic_load_explicit(&e->helpers, memory_order_seq_cst) > 0 ||
            atomic_load_explicit(&e->polling_waiters, memory_order_seq_cst) > 0) &&
           cl_now_ns() < give_up)
        sched_yield();
}
