/*
 * chaos_ops.h — one work of the chaos rank: its buffers, how it is posted
 * for each op kind, and how its outcome is checked against the oracle.
 *
 * Design notes
 *  - A work record owns its buffers from before the post until its
 *    completion is visible (test, wait, wait_any, cq, callback); only then
 *    are they checked and freed (collie.h: collie never touches a buffer
 *    after that). A work that never completes is abandoned with its
 *    buffers (never freed: the library might still write them).
 *  - Receive buffers are pre-filled with CH_FILL_BYTE so that gaps between
 *    v blocks, and blocks a transport forgot to write, are seen.
 *  - Every buffer of a work has a guard of a known pattern on either side,
 *    checked when the work ends, whatever its status: a write past either
 *    end is an `overrun` even where malloc's slack would hide it (a build
 *    without sanitizers).
 *  - Every COLLIE_OK work is checked whole: every output byte, and the
 *    send buffer, which must come back untouched (it is const). A failed
 *    work is not checked; its buffers are freed with it.
 *  - Receives from any source of one slot form a group: each OK receive
 *    must hold one of its sender's messages (collie_work_source names the
 *    sender), and once the group is done, each sender's messages must have
 *    gone to the receives in post order (collie.h: a message goes to the
 *    first receive posted that matches it; one sender's messages arrive in
 *    send order).
 */
#ifndef CHAOS_OPS_H
#define CHAOS_OPS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "collie.h"
#include "tests/chaos/chaos_prog.h"
#include "tests/chaos/chaos_report.h"

#define CH_FILL_BYTE 0xA5

enum { CH_ROLE_COLL, CH_ROLE_SEND, CH_ROLE_RECV };

typedef struct ch_anygroup {
    int nrecv, reaped;
    int *src;    /* per receive, in post order: collie_work_source */
    int *status; /* per receive: its status */
    int *k;      /* per OK receive: the sender's message number it held */
    int msgs;
} ch_anygroup;

typedef struct ch_work {
    ch_op op;
    int round;
    int sub;  /* which work of its slot */
    int role; /* CH_ROLE_* */
    int peer; /* send/recv: the comm rank at the other end (COLLIE_ANY_SOURCE) */
    uint64_t stream;
    collie_comm *comm;
    int n, me; /* comm size, this rank's comm rank */
    collie_work *w;
    ch_style style;
    void *sbuf, *rbuf;     /* the allocations */
    void *sptr, *rptr;     /* what was passed */
    size_t scount, rcount; /* elements at sptr / rptr that the check covers */
    int64_t post_ns;
    int32_t deadline_ms;
    uint64_t bytes; /* payload bytes (the report's bytes=) */
    atomic_int cb_runs;
    bool cancel_planned, cancelled, abandoned;
    int cancel_after; /* cancel once this many more works were posted (0: at once) */
    int32_t stall_ms; /* CH_W_CB: the callback blocks the progress thread this long */
    ch_anygroup *grp;
    int grp_idx;
    int status; /* once done */
} ch_work;

/* ch_work_post: allocate and fill the buffers of `rec` (op, role, peer,
 * stream, comm, n, me set by the caller) and post it with opts `o`.
 * Returns the post's status (rec->w set on COLLIE_OK). */
int ch_work_post(ch_work *rec, const collie_post_opts *o);

/* ch_work_check: check a work that ended with COLLIE_OK against the
 * oracle; a wrong one is reported as a violation. Returns the bytes
 * compared. Also records an any-source receive's outcome in its group. */
uint64_t ch_work_check(ch_work *rec, ch_report *rep);

/* ch_group_note_failed: record a failed any-source receive in its group. */
void ch_group_note(ch_work *rec);
/* ch_group_check: once every receive of the group was reaped: the order
 * check (see the design notes). Reports violations; frees the group. */
void ch_group_finish(ch_anygroup *g, ch_report *rep, int round, int slot);

/* ch_work_guards: the guards around the work's buffers are intact (any
 * status: collie writes only inside the buffers it was given); a changed
 * one is an `overrun` violation. */
void ch_work_guards(ch_work *rec, ch_report *rep);

/* ch_work_free: free the buffers (the completion must be visible). */
void ch_work_free(ch_work *rec);

#endif
