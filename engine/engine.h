/*
 * engine.h — internal interface of the progress engine (collie_engine), the
 * one header of engine/ that other folders include (it brings the clock and
 * error helpers, settings, dtypes and logging with it).
 *
 * The engine owns one libevent event_base and the progress thread that runs
 * it. Only that thread may touch the base or any libevent object created on
 * it ("loop thread" below), except a thread that takes the loop's role for
 * one step (caller-driven progress, below). Other threads hand work to it
 * as commands.
 */
#ifndef CL_ENGINE_H
#define CL_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "collie.h"
#include "engine/common.h"
#include "engine/config.h"
#include "base/dtype.h"
#include "base/list.h"
#include "engine/log.h"

struct event_base;
struct event;
struct collie_work;

/* A command: a function the loop thread runs. Embed it in the object it
 * acts on (no allocation per command). A command may be queued only once at
 * a time. */
typedef struct cl_cmd {
    cl_list_node node; /* in the engine's queue while posted */
    void (*fn)(struct cl_cmd *c);
    /* a thread helping the loop (cl_engine_assist) may run it: it starts
     * a work and calls no user code. Every poster sets it (a zeroed
     * command: false); helpers read it, so it is never left undefined. */
    bool assist_ok;
} cl_cmd;

/* cl_engine_post_cmd: queue c for the loop thread (any thread; from the
 * loop thread it runs after the current callback returns). The wake-up is
 * coalesced: at most one eventfd write while the loop sleeps, made before
 * the loop can take c: once c has run, the call no longer touches the
 * engine (a destroy that waited for c may free it). Returns
 * COLLIE_ECLOSED once the engine has stopped; c->fn is then not run. */
int cl_engine_post_cmd(collie_engine *e, cl_cmd *c);

/* cl_engine_call: run fn(arg) on the loop thread and wait for it to return,
 * at most timeout_ms. Runs inline on the loop thread. Returns COLLIE_OK,
 * COLLIE_ECLOSED (engine stopped, fn not run) or COLLIE_ETIMEDOUT (the loop
 * did not run it in time: it may still run later, so `arg` must stay valid —
 * callers then leak it deliberately and log). */
int cl_engine_call(collie_engine *e, void (*fn)(void *arg), void *arg, int32_t timeout_ms);

/* CL_LOOP_SLICE: the most items (commands, retirements, expired deadlines,
 * works failed by a fault) the loop handles in one step before it looks at
 * its sockets and timers again. A longer batch goes on in the next steps
 * (cl_event_soon), so however deep the queue, peer deaths, abort notices
 * and the monitor's heartbeat are seen within about one slice. */
#define CL_LOOP_SLICE 512

/* cl_event_soon: run ev's callback again after the loop has next polled its
 * sockets (a zero timeout: libevent activates timers after the poll), not
 * in the current pass as event_active would. ev must have been made
 * without a file descriptor. Loop thread only. */
void cl_event_soon(struct event *ev);

/* ---- caller-driven progress (engine/assist.c) ----------------------------
 * The loop's role may be taken for one short, non-blocking step by another
 * thread: one that waits for or tests a work, or has just posted one. It
 * must hold the engine's progress lock, which the progress thread holds
 * whenever it runs the loop (it lets go only between two turns of a
 * spinning loop), so the base and every loop-owned object still have one
 * user at a time. While a thread holds it, cl_engine_on_loop is true there
 * and cl_engine_on_progress_thread is not: code that would call the user
 * (completion callbacks, the comm's error callback) leaves that to the
 * progress thread. */

/* A poller: one non-blocking progress step of a transport, run on every
 * turn of a spinning loop and by a helping thread; `sleeping` true: the
 * loop is about to block in epoll, so arrange for anything that arrives
 * from now on to wake a watch (e.g. park shared-memory readers). */
typedef struct cl_poller {
    cl_list_node node;
    /* returns true if there is also socket traffic that only an event
     * pass of the loop sees (a helper then runs one) */
    bool (*poll)(struct cl_poller *p, bool sleeping);
} cl_poller;

/* add / remove (idempotent): loop only */
void cl_engine_add_poller(collie_engine *e, cl_poller *p);
void cl_engine_remove_poller(collie_engine *e, cl_poller *p);

/* cl_engine_assist: if the loop is spinning (works in flight) and its
 * progress lock is free, run one step for it on this thread: the queued
 * commands that allow it (work starts, in order, up to a slice) and every
 * poller. Never blocks (a try-lock); false if it did not get the lock.
 * Any thread but a loop's. */
bool cl_engine_assist(collie_engine *e);

/* cl_engine_waiter_polls: a thread starts (on) or stops polling for a work
 * of e, helping its loop: the loop steps back meanwhile. */
void cl_engine_waiter_polls(collie_engine *e, bool on);

/* cl_engine_helper_steps: loop steps run by helpers so far (any thread) */
uint64_t cl_engine_helper_steps(const collie_engine *e);

/* cl_engine_on_progress_thread: true on e's own progress thread only (not
 * on a thread helping it) - where user code may be called. */
bool cl_engine_on_progress_thread(const collie_engine *e);

/* cl_engine_base: the event base (loop thread only). */
struct event_base *cl_engine_base(collie_engine *e);

/* cl_engine_on_loop: true on the thread in e's loop role: its progress
 * thread, or a thread helping it for one step (cl_engine_assist). */
bool cl_engine_on_loop(const collie_engine *e);
/* cl_engine_forked: e was made before this process forked from its maker
 * (pthread_atfork counts the forks): its threads do not exist here, so
 * posting to it (ESTATE) and destroying it (ESTATE, left as is) refuse. */
bool cl_engine_forked(const collie_engine *e);
/* ESTATE, its message naming the fork and `what` refused */
int cl_engine_forked_error(const collie_engine *e, const char *what);

/* cl_engine_closing: true once destroy has begun (new posts are refused). */
bool cl_engine_closing(const collie_engine *e);

/* cl_engine_name: the engine's name, for log lines. */
const char *cl_engine_name(const collie_engine *e);

/* cl_engine_set_activity: tell the stall monitor what the loop is doing
 * now (a static string); returns the previous one so callers can restore
 * it. Loop thread only. */
const char *cl_engine_set_activity(collie_engine *e, const char *what);

/* cl_engine_stall_count: stalls the monitor has reported so far. */
uint64_t cl_engine_stall_count(const collie_engine *e);
/* cl_engine_residents: objects living on the engine now (any thread). */
uint32_t cl_engine_residents(const collie_engine *e);

/* A resident: an object living on the engine (store server, store client,
 * communicator) that must be closed when the engine stops. shutdown() runs
 * on the loop thread during collie_engine_destroy, before pending works are
 * failed; it closes the object's libevent objects and must not free the
 * object itself (its owner's destroy does that). */
typedef struct cl_resident {
    cl_list_node node;
    void (*shutdown)(struct cl_resident *r);
    const char *what;
} cl_resident;

/* cl_engine_add_resident / cl_engine_remove_resident: loop thread only.
 * add fails with COLLIE_ECLOSED while the engine is closing. */
int cl_engine_add_resident(collie_engine *e, cl_resident *r);
void cl_engine_remove_resident(collie_engine *e, cl_resident *r);

/* What the engine asks of the works it drives. The engine includes no
 * header of work/: work/ defines the table, cl_work_engine_hooks, and
 * collie_engine_create (engine.c) hands it to cl_engine_create, a
 * link-time reference upward like the backend registry's
 * cl_builtin_backends (docs/design.md §1). `create` runs on the creating
 * thread before the loop starts, `destroy` after the loop has ended (or
 * never started); every other hook runs in the loop's role, which may be
 * a helping thread (cl_engine_assist) for run_completions: it leaves user
 * code to the progress thread. */
typedef struct cl_engine_hooks {
    /* make the per-engine state (libevent objects on cl_engine_base(e)) */
    int (*create)(collie_engine *e, void **state);
    void (*destroy)(void *state);
    /* run the completions (callbacks, queues) of works finished so far,
     * at most `budget` of them (the rest follow in later loop steps);
     * returns how many ran */
    size_t (*run_completions)(void *state, size_t budget);
    /* end every pending work with `status` (engine shutdown) */
    void (*fail_all)(void *state, int status, const char *why);
    /* works posted and not yet retired */
    size_t (*pending)(void *state);
    /* changes whenever a work starts or is retired (the spin heuristic) */
    uint64_t (*progress)(void *state);
} cl_engine_hooks;

/* work/registry.c: the works' hooks every engine runs with */
extern const cl_engine_hooks cl_work_engine_hooks;

/* engines created and not yet destroyed in this process (a leak check) */
size_t cl_engines_live(void);

/* cl_engine_create: collie_engine_create with the given hooks (tests may
 * pass their own). */
int cl_engine_create(const collie_engine_opts *o, const cl_engine_hooks *hooks,
                     collie_engine **out);

/* cl_engine_hooks_state: the state hooks->create made (any thread). */
void *cl_engine_hooks_state(const collie_engine *e);

/* The default call bound for synchronous hand-offs (destroy of objects). */
#define CL_ENGINE_CALL_TIMEOUT_MS 10000

#endif
