/*
 * chaos_wait.h — the chaos rank's works in flight and every way it waits
 * for them: collie_work_test polling, collie_work_wait, collie_work_wait_any,
 * a completion queue (and its fd), completion callbacks. Also the clock
 * that tells how long this process was stopped or starved.
 *
 * Design notes
 *  - Each work has one style, chosen at post (chaos_prog.c); a work is
 *    reaped only through its own style, so every style is what makes
 *    progress for its works (a callback work is seen through its callback
 *    only, a cq work through collie_cq_pop only).
 *  - Reaping first looks at every work without blocking; only when none
 *    was done does it block, through the style of the oldest work, for at
 *    most block_ms. Since the program posts in slot order, the oldest work
 *    is the one every rank can finish first.
 *  - Each pass also checks the watchdog's promise: a work still pending
 *    CH_HANG_MS after its deadline plus the grace plus the slack (less the
 *    time this process was stopped) is a `hang` violation, and is abandoned
 *    with its buffers (the library might still write them).
 *  - The pause clock: a thread ticks every 10 ms; a tick later than 250 ms
 *    means the process did not run (SIGSTOP, or starved): such gaps are
 *    subtracted from a work's time before the deadline oracle judges it.
 */
#ifndef CHAOS_WAIT_H
#define CHAOS_WAIT_H

#include <stddef.h>
#include <stdint.h>

#include "tests/chaos/chaos_ops.h"

#define CH_GRACE_MS 1500 /* docs/api.md: the waiter's grace for a collective */
#define CH_HANG_MS  5000 /* beyond the deadline bound: stop waiting, call it a hang */

typedef void (*ch_done_fn)(ch_work *rec, void *arg);

typedef struct ch_inflight {
    ch_work **v;
    size_t n, cap;
    collie_cq *cq;
    ch_report *rep;
    int32_t slack_ms;
    int hangs;      /* works abandoned so far */
    uint64_t rotor; /* varies the blocking wait */
} ch_inflight;

void ch_inflight_init(ch_inflight *f, collie_cq *cq, ch_report *rep, int32_t slack_ms);
void ch_inflight_fini(ch_inflight *f);
void ch_inflight_add(ch_inflight *f, ch_work *rec);

/* ch_reap: hand every work whose completion is visible to done(); if none
 * was and block_ms > 0, block (bounded) and look again. Returns the number
 * reaped. */
size_t ch_reap(ch_inflight *f, int block_ms, ch_done_fn done, void *arg);

/* the post options of a work of this style */
void ch_style_opts(ch_work *rec, collie_cq *cq, collie_post_opts *o);

/* Arm the callback abort: the `after`-th completion callback from now
 * calls collie_comm_abort on its work's comm (on the progress thread).
 * -1 disarms. */
void ch_cb_arm_abort(int after);
/* did an armed callback abort fire? (then resets) */
int ch_cb_abort_fired(void);

/* The pause clock. */
int64_t ch_now_ns(void);
void ch_pause_clock_start(void);
void ch_pause_clock_stop(void);
/* nanoseconds within [from, to] during which this process was stopped */
int64_t ch_paused_ns(int64_t from, int64_t to);

#endif
