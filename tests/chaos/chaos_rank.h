/*
 * chaos_rank.h — the chaos rank's state, shared by its main program
 * (chaos_rank.c: rounds of fresh comms) and its elastic runs
 * (chaos_elastic.c: one world that shrinks and grows).
 *
 * Design notes
 *  - One ch_run per process, used by the main thread only (the abort
 *    thread reads its own ch_aborter).
 *  - A round's comms are run->comms[], described by run->plan (comm ranks
 *    -> world ranks in plan.comms[c].members: every fault set is reported
 *    in world ranks). In an elastic run comms[0] is the current world
 *    (run->w) and its members are world ids: the original ranks
 *    (COLLIE_RANK) and the joiners' ids after them.
 */
#ifndef CHAOS_RANK_H
#define CHAOS_RANK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "collie.h"
#include "tests/chaos/chaos_prog.h"
#include "tests/chaos/chaos_report.h"
#include "tests/chaos/chaos_wait.h"

/* the abort thread (chaos_rank.c) */
/* fired_ns: when it called collie_comm_abort (ch_now_ns), 0 until then;
 * read by the main thread while it runs (make_subgroups) */
typedef struct ch_aborter {
    pthread_t t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, running;
    _Atomic int64_t fired_ns;
    int delay_ms;
    collie_comm *c;
} ch_aborter;

typedef struct ch_run {
    uint64_t seed;
    int rank, world, rounds, ops, inflight_max, faults;
    const char *dir;
    int32_t slack_ms, round_wait_ms;
    int64_t mem_tolerance;
    ch_report rep;
    collie_engine *e;
    collie_store *st;
    collie_cq *cq;
    ch_inflight fl;
    /* the round */
    ch_round plan;
    collie_comm *comms[CH_MAX_COMMS];
    ch_aborter ab; /* the thread abort (CH_F_ABORT, abort_from 1) */
    bool faulted;
    uint64_t bytes_in_flight;
    int posted; /* works posted this round */
    /* an elastic run (--faults shrink; chaos_elastic.c): run->rank is this
     * process's world id (COLLIE_RANK, or a joiner's --join id) */
    bool elastic;
    int join_id;            /* -1: started by collie-run */
    collie_comm *w;         /* the current world */
    int msize, me;          /* its size, this rank's rank in it */
    int mem[CH_MAX_RANKS];  /* its members' world ids, by comm rank */
    const char *store_addr; /* COLLIE_STORE_ADDR (the start line: joiners need it) */
} ch_run;

/* ch_run_slots: the round's slots on its comms (made already; `go` false:
 * their making failed): posted through the window with this rank's fault,
 * drained, the thread and callback aborts' fault lines written. */
void ch_run_slots(ch_run *run, bool go);

/* ch_comm_end_line: the comm_end line of comm `cid` of the round, about to
 * be destroyed at t0 (ch_now_ns): its fault in world ranks. */
void ch_comm_end_line(ch_run *run, int cid, collie_comm *c, int64_t t0);

/* ch_comm_opts: the options of every comm the rank creates */
collie_comm_opts ch_comm_opts(const char *name, bool infinite);

/* ch_elastic_main: an elastic run's rounds (chaos_elastic.c); its end
 * reason ("done", "excluded", ...) and why (may stay empty). */
const char *ch_elastic_main(ch_run *run, char *why, size_t cap);

#endif
