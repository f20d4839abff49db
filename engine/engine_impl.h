/*
 * engine_impl.h — the engine's private state, shared by the files of
 * engine/. Nothing outside engine/ includes it.
 */
#ifndef CL_ENGINE_IMPL_H
#define CL_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "collie.h"
#include "engine/engine.h"

struct event;

typedef struct cl_monitor {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    int32_t stall_ms;
    collie_stall_cb cb;
    void *cb_arg;
} cl_monitor;

struct collie_engine {
    char name[32];
    pid_t pid;      /* the process that made it */
    unsigned forks; /* engine.c's fork count then: another in a forked child */
    pthread_t thread;
    struct event_base *base;

    /* command queue */
    pthread_mutex_t qmu;
    cl_list queue;         /* cl_cmd.node, posted and not yet taken (qmu) */
    cl_list backlog;       /* taken from queue, not yet run (loop; runs in slices) */
    struct event *more_ev; /* runs the next slice of the backlog */
    bool wake_pending;
    _Atomic bool stop_requested;
    _Atomic bool closing;  /* destroy began: posts of new works are refused */
    bool stopped;          /* under qmu: the loop is gone, commands refused */
    int wake_fd;           /* eventfd */
    _Atomic bool queued;   /* commands are waiting (polled while spinning) */
    _Atomic bool spinning; /* the loop polls instead of sleeping */
    int64_t spin_ns;       /* spin window without progress; 0: never spin */
    int64_t spin_since;    /* loop: when progress was last seen */
    uint64_t spin_sig;     /* loop: retired/tracked counts seen then */
    struct event *wake_ev;
    struct event *heartbeat_ev;

    /* caller-driven progress (assist.c) */
    pthread_mutex_t progress_mu;      /* held by whoever runs the loop's role */
    cl_list pollers;                  /* cl_poller (loop) */
    _Atomic uint32_t helpers;         /* threads inside cl_engine_assist */
    _Atomic bool loop_wants;          /* the progress thread waits for progress_mu */
    _Atomic uint32_t polling_waiters; /* threads polling in collie_work_wait */
    _Atomic uint64_t helper_steps;    /* steps helpers ran (stats) */
    uint32_t helper_turn;             /* progress_mu: helper steps, for the event-pass stride */

    cl_list residents;            /* cl_resident */
    _Atomic uint32_t nresidents;  /* their number (stats, any thread) */
    const cl_engine_hooks *hooks; /* the works' (work/) */
    void *hooks_state;

    /* watched by the monitor thread */
    _Atomic int64_t heartbeat_ns;
    _Atomic(const char *) activity;
    _Atomic uint64_t stalls;
    cl_monitor mon;
};

/* engine.c: block the asynchronous signals in this thread (progress and
 * monitor threads), so the application's handlers run on its own threads */
void cl_block_async_signals(void);

/* the thread in the loop's role (its progress thread, or a helper holding
 * progress_mu) and whether it is a helper */
extern _Thread_local collie_engine *cl_tls_loop_engine;
extern _Thread_local bool cl_tls_helping;

/* engine.c: run queued commands, at most `budget`; `helping`: only those
 * a helper may run, stopping at the first other one, and no completions */
size_t cl_engine_drain_cmds(collie_engine *e, size_t budget, bool helping);

/* assist.c: every poller, one step (loop role); true if one of them also
 * has socket traffic for the event pass */
bool cl_engine_run_pollers(collie_engine *e, bool sleeping);
/* assist.c: destroy waits (bounded) for helpers to leave before freeing */
void cl_engine_wait_helpers(collie_engine *e);

/* monitor.c */
int cl_monitor_start(collie_engine *e, int32_t stall_ms, collie_stall_cb cb, void *arg);
void cl_monitor_stop(collie_engine *e);
int32_t cl_monitor_period_ms(int32_t stall_ms);

#endif
