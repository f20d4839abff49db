/*
 * chaos_elastic.c — an elastic run of the chaos rank (--faults shrink, and
 * grow): one world comm for the whole run that the survivors shrink after
 * a fault and that takes replacements back (issue 33), checked by the same
 * oracle as every other work.
 *
 * Design notes
 *  - The world is created once, as "chaos<seed>w" (its family name: every
 *    comm shrink and grow make from it keeps it, and a replacement joins
 *    by it). Its members are world ids: the ranks collie-run started
 *    (COLLIE_RANK) and the replacements' ids after them (--join, given by
 *    the driver). run->mem maps the current comm's ranks to world ids; the
 *    round's plan is made for the current comm (its size, this rank's rank
 *    in it) and its members are those ids, so every report line speaks of
 *    world ids while the oracle computes in comm ranks.
 *  - A round (the report's `round`, also called a phase) is the slots of
 *    the seed's plan for (seed, round, size, rank) on the current world
 *    only (no subgroups), with the rank-side faults that name no healthy
 *    rank (CH_F_ELASTIC_OK: abort, cancel), then a round end through the
 *    store keyed by the comm's name, so a barrier of one membership never
 *    counts another's ranks.
 *  - A fault of the world, whenever this rank sees it (a failed work, a
 *    refused post, or the world failed while it waits at the round end),
 *    makes it shrink, after its works drained. Everyone who sees the world
 *    fail shrinks: a shrink revokes the old comm, so the others see it too.
 *    The round end passes iff every member's key is there (looked at again
 *    after the world failed): a rank that passed it went on to the next
 *    round, so when it shrinks there, the others find every key and follow
 *    it into that round instead of shrinking in this one. A round end that
 *    never completes (a killed rank nobody noticed) aborts the world and
 *    shrinks (a `fault kind=abort from=round_end` line).
 *  - Shrink: `shrink_enter` before the call (the driver may kill or stop a
 *    rank then: a fault during the agreement), `shrink` after it with the
 *    decision in world ids (members=, out=), checked here (the rank map
 *    against the new comm's size and rank) and by the driver (every
 *    killed rank out, no healthy one: chaos_elastic.py). EABORTED (a member
 *    failed while the new comm was made) shrinks again, up to
 *    EL_SHRINK_TRIES times. The round after a shrink is the next round,
 *    planned for the new membership.
 *  - Left out (ENOTMEMBER from shrink, or from a post of a rank that was
 *    stopped while the others shrank): the rank must have had the
 *    COLLIE_EVENT_EXCLUDED event, and a post on the old comm must be
 *    refused with ENOTMEMBER (`excluded_post`; one that ended OK would be
 *    `excluded_ok`). Then it ends the run: `end reason=excluded`, exit 0.
 *  - Grow: after a round end that passed, in about seven rounds of ten
 *    (the seed's, the same for every member) while the world is smaller
 *    than at the start and a round follows, the members grow by what is
 *    missing. `grow_enter` tells the driver, which starts that many
 *    replacements (chaos_rank --join ID --world N) that join by the
 *    family name. After a grow every member (joiners too) writes its world
 *    id under the new comm's name in the store and reads the others', and
 *    rank 0 writes the round the new comm starts at, which the joiners
 *    read. A grow that fails leaves the old world (collie.h: untouched).
 *  - The last round: a round after a membership change always runs (the
 *    oracle checks the new comm), up to EL_EXTRA_ROUNDS past --rounds.
 *    Every wait is bounded: the shrink's and grow's timeouts, the store
 *    requests' EL_KEY_MS, the round end's CHAOS_ROUND_WAIT_MS.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"
#include "tests/chaos/chaos_rank.h"

#define EL_KEY_MS        10000 /* a store request's bound */
#define EL_SLICE_MS      25    /* the round end looks at the world this often */
#define EL_SHRINK_TRIES  3
#define EL_GROW_MS       10000 /* the driver starts the joiners once it sees grow_enter */
#define EL_JOIN_MS       30000 /* a joiner waits for the members' next grow */
#define EL_EXTRA_ROUNDS  4
#define EL_SHRINK_MIN_MS 500 /* a shrink's timeout: 0.5..2.5 s (the seed's) */
#define EL_SHRINK_VAR_MS 2000

enum { EL_NEXT, EL_OUT, EL_LOST };

static bool el_healthy(collie_comm *c) {
    int st = COLLIE_OK;
    if (!c) return false;
    collie_comm_error(c, &st, NULL);
    return st == COLLIE_OK;
}

/* world ids as a comma list ("-": none) */
static void el_ids(const int *ids, int n, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", i ? "," : "", ids[i]);
    if (n == 0) snprintf(buf, cap, "-");
}

static void el_plan(ch_run *run, int r) {
    ch_round *p = &run->plan;
    ch_plan_round(p, run->seed, r, run->msize, run->me, run->ops, run->inflight_max, run->faults);
    for (int i = 0; i < run->msize; i++)
        p->comms[0].members[i] = run->mem[i];
}

/* the old world is left behind (after a shrink, a grow, at the end) */
static void el_leave(ch_run *run, collie_comm *c) {
    int64_t t0 = ch_now_ns();
    ch_comm_end_line(run, 0, c, t0);
    int rc = collie_comm_destroy(c);
    if (rc != COLLIE_OK && rc != COLLIE_EABORTED && rc != COLLIE_ENOTMEMBER)
        ch_violation(&run->rep, "bad_status", run->plan.round, -1,
                     "collie_comm_destroy of the world returned %s", collie_status_name(rc));
}

/* ---- the round end ---------------------------------------------------------- */

/* 1: every member came; 0: the world failed first, or the wait gave up (the
 * world is aborted then); -1: the store failed (why says it) */
static int el_round_end(ch_run *run, int r, char *why, size_t cap) {
    const char *name = collie_comm_name(run->w);
    char store[CH_MAX_RANKS][200];
    const char *keys[CH_MAX_RANKS];
    for (int q = 0; q < run->msize; q++) {
        snprintf(store[q], sizeof store[q], "chaos/%" PRIu64 "/end/%s/r%d/%d", run->seed, name, r,
                 q);
        keys[q] = store[q];
    }
    int rc = collie_store_set(run->st, keys[run->me], "1", 1, EL_KEY_MS);
    if (rc != COLLIE_OK) {
        snprintf(why, cap, "store set of %s: %s (%s)", keys[run->me], collie_status_name(rc),
                 collie_last_error());
        return -1;
    }
    int64_t until = ch_now_ns() + (int64_t)run->round_wait_ms * 1000000;
    for (int guard = 0; guard < 1000000; guard++) {
        rc = collie_store_wait(run->st, keys, (size_t)run->msize, EL_SLICE_MS);
        if (rc == COLLIE_OK) return 1;
        if (rc != COLLIE_ETIMEDOUT) {
            snprintf(why, cap, "round %d end: store wait: %s (%s)", r, collie_status_name(rc),
                     collie_last_error());
            return -1;
        }
        bool failed = !el_healthy(run->w), late = ch_now_ns() >= until;
        if (!failed && !late) continue;
        bool all = false;
        if (collie_store_check(run->st, keys, (size_t)run->msize, EL_KEY_MS, &all) == COLLIE_OK &&
            all)
            return 1; /* someone passed it: the fault is the next round's */
        if (!failed) {
            char missing[256] = "";
            size_t at = 0;
            for (int q = 0; q < run->msize && at < sizeof missing; q++) {
                bool there = true;
                const char *k1[1] = {keys[q]};
                if (collie_store_check(run->st, k1, 1, EL_KEY_MS, &there) == COLLIE_OK && !there)
                    at += (size_t)snprintf(missing + at, sizeof missing - at, " %d", run->mem[q]);
            }
            ch_report_line(&run->rep, NULL,
                           "fault kind=abort r=%d seq=-1 from=round_end comm=0 missing=%s", r,
                           *missing ? missing + 1 : "-");
            run->rep.faults++;
            collie_comm_abort(run->w, "chaos: a member never came to the round end");
        }
        return 0;
    }
    return 0;
}

/* ---- left out ---------------------------------------------------------------- */

/* This rank was left out of the world: it must have been told (the event),
 * and the old comm must refuse its posts. */
static void el_excluded(ch_run *run, int r) {
    collie_comm *c = run->w;
    ch_report *rep = &run->rep;
    bool told = false;
    collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
    for (int i = 0; i < 4096 && collie_comm_event_pop(c, &ev) == COLLIE_OK; i++)
        told |= ev.kind == COLLIE_EVENT_EXCLUDED;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 2000;
    collie_work *w = NULL;
    int rc = collie_barrier(c, &o, &w);
    int wst = COLLIE_ENOTMEMBER;
    if (rc == COLLIE_OK) {
        ch_violation(rep, "excluded_post", r, -1,
                     "a barrier posted on comm '%s' after this rank was left out was accepted "
                     "(COLLIE_ENOTMEMBER expected)",
                     collie_comm_name(c));
        (void)collie_work_wait(w, 2000 + CH_GRACE_MS + run->slack_ms);
        wst = collie_work_result(w);
        if (wst == COLLIE_OK)
            ch_violation(rep, "excluded_ok", r, -1,
                         "a barrier on comm '%s' ended COLLIE_OK after this rank was left out",
                         collie_comm_name(c));
        if (wst == COLLIE_INPROGRESS) collie_work_cancel(w);
        collie_work_release(w);
    } else if (rc != COLLIE_ENOTMEMBER) {
        ch_violation(rep, "bad_status", r, -1,
                     "a post on comm '%s' after this rank was left out returned %s "
                     "(COLLIE_ENOTMEMBER expected): %s",
                     collie_comm_name(c), collie_status_name(rc), collie_last_error());
    }
    if (!told)
        ch_violation(rep, "no_excluded_event", r, -1,
                     "left out of comm '%s' without a COLLIE_EVENT_EXCLUDED event",
                     collie_comm_name(c));
    ch_report_line(rep, NULL, "excluded r=%d comm=%s event=%d post=%s end_us=%lld", r,
                   collie_comm_name(c), told, collie_status_name(rc),
                   (long long)(ch_now_ns() / 1000));
    el_leave(run, c);
    run->w = NULL;
}

/* ---- shrink ------------------------------------------------------------------ */

/* the new comm of a shrink: its rank map into run->mem; false (a
 * violation) if it does not add up */
static bool el_take_shrink(ch_run *run, int r, collie_comm *nw, int *out, int *nout) {
    int map[CH_MAX_RANKS];
    int n = collie_comm_rank_map(nw, map, CH_MAX_RANKS);
    int mem[CH_MAX_RANKS], k = 0;
    *nout = 0;
    if (n != run->msize) {
        ch_violation(&run->rep, "bad_status", r, -1,
                     "collie_comm_rank_map of the shrunk comm returned %d, the old size is %d", n,
                     run->msize);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (map[i] < 0) {
            out[(*nout)++] = run->mem[i];
            continue;
        }
        if (map[i] != k) {
            ch_violation(&run->rep, "bad_status", r, -1,
                         "rank map: old rank %d -> %d, expected %d (compact, in old order)", i,
                         map[i], k);
            return false;
        }
        mem[k++] = run->mem[i];
    }
    if (k != collie_comm_size(nw) || map[run->me] != collie_comm_rank(nw)) {
        ch_violation(&run->rep, "bad_status", r, -1,
                     "the shrunk comm has size %d and this rank %d; the rank map says %d and %d",
                     collie_comm_size(nw), collie_comm_rank(nw), k, map[run->me]);
        return false;
    }
    memcpy(run->mem, mem, sizeof mem);
    run->me = map[run->me];
    run->msize = k;
    return true;
}

/* A failed shrink, grow or join must say why: its last error names the
 * call's work (a lost message was found once: the release of the work
 * cleared it). */
static void el_check_reason(ch_report *rep, int r, const char *call, int rc) {
    const char *why = collie_last_error();
    if (rc != COLLIE_OK && (!why[0] || !strstr(why, call)))
        ch_violation(rep, "silent_error", r, -1, "collie_comm_%s returned %s with the reason '%s'",
                     call, collie_status_name(rc), why);
}

static int el_shrink(ch_run *run, int r, char *why, size_t cap) {
    ch_report *rep = &run->rep;
    if (el_healthy(run->w)) { /* a refused post, say: the others must shrink too */
        ch_report_line(rep, NULL, "fault kind=abort r=%d seq=-1 from=shrink comm=0", r);
        rep->faults++;
        collie_comm_abort(run->w, "chaos: this rank's round failed on a healthy world");
    }
    char members[128];
    el_ids(run->mem, run->msize, members, sizeof members);
    int rc = COLLIE_EINVAL;
    for (int attempt = 0; attempt < EL_SHRINK_TRIES; attempt++) {
        collie_shrink_opts so = COLLIE_SHRINK_OPTS_INIT;
        so.timeout_ms = EL_SHRINK_MIN_MS +
                        (int32_t)(ch_hash(run->seed, (uint64_t)r, 0x5348, (uint64_t)attempt) %
                                  EL_SHRINK_VAR_MS);
        const char *old = collie_comm_name(run->w);
        int64_t t0 = ch_now_ns();
        ch_report_line(rep, NULL,
                       "shrink_enter r=%d comm=%s attempt=%d size=%d rank=%d timeout_ms=%d "
                       "start_us=%lld",
                       r, old, attempt, run->msize, run->me, so.timeout_ms, (long long)(t0 / 1000));
        collie_comm *nw = NULL;
        rc = collie_comm_shrink(run->w, &so, &nw);
        int64_t t1 = ch_now_ns();
        el_check_reason(rep, r, "shrink", rc);
        char clock[160];
        snprintf(clock, sizeof clock, "start_us=%lld end_us=%lld ms=%lld paused_ms=%lld",
                 (long long)(t0 / 1000), (long long)(t1 / 1000), (long long)((t1 - t0) / 1000000),
                 (long long)(ch_paused_ns(t0, t1) / 1000000));
        if (rc == COLLIE_OK) {
            int out[CH_MAX_RANKS], nout = 0, size = run->msize;
            bool ok = el_take_shrink(run, r, nw, out, &nout);
            char outs[128];
            el_ids(out, nout, outs, sizeof outs);
            ch_report_line(rep, NULL,
                           "shrink r=%d status=COLLIE_OK comm=%s new=%s attempt=%d size=%d "
                           "new_size=%d new_rank=%d members=%s out=%s timeout_ms=%d %s",
                           r, old, collie_comm_name(nw), attempt, size, run->msize, run->me,
                           members, outs, so.timeout_ms, clock);
            el_leave(run, run->w);
            run->w = nw;
            if (ok) return EL_NEXT;
            snprintf(why, cap, "the shrunk comm's rank map does not add up");
            return EL_LOST;
        }
        ch_report_line(rep, collie_last_error(),
                       "shrink r=%d status=%s comm=%s attempt=%d size=%d members=%s "
                       "timeout_ms=%d %s",
                       r, collie_status_name(rc), old, attempt, run->msize, members, so.timeout_ms,
                       clock);
        if (rc == COLLIE_ENOTMEMBER) {
            el_excluded(run, r);
            return EL_OUT;
        }
        if (rc != COLLIE_EABORTED && rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER)
            ch_violation(rep, "bad_status", r, -1,
                         "collie_comm_shrink returned %s (OK, ENOTMEMBER, EABORTED, ETIMEDOUT or "
                         "EPEER expected): %s",
                         collie_status_name(rc), collie_last_error());
        if (rc != COLLIE_EABORTED) break;
    }
    snprintf(why, cap, "shrink of the world failed: %s (%s)", collie_status_name(rc),
             collie_last_error());
    el_leave(run, run->w);
    run->w = NULL;
    return EL_LOST;
}

/* ---- grow -------------------------------------------------------------------- */

/* After a shrink or grow made comm c, in which this rank is `me`: every
 * member's world id from the store (each writes its own; rank 0 writes
 * the round the comm starts at: *at, if not NULL and this rank is a
 * joiner, reads it). False if the store did not answer. */
static bool el_members(ch_run *run, collie_comm *c, int *at, bool joiner) {
    const char *name = collie_comm_name(c);
    int n = collie_comm_size(c), me = collie_comm_rank(c);
    char key[200], val[32];
    snprintf(key, sizeof key, "chaos/%" PRIu64 "/id/%s/%d", run->seed, name, me);
    snprintf(val, sizeof val, "%d", run->rank);
    if (collie_store_set(run->st, key, val, strlen(val), EL_KEY_MS) != COLLIE_OK) return false;
    snprintf(key, sizeof key, "chaos/%" PRIu64 "/at/%s", run->seed, name);
    if (!joiner && me == 0) {
        snprintf(val, sizeof val, "%d", *at);
        if (collie_store_set(run->st, key, val, strlen(val), EL_KEY_MS) != COLLIE_OK) return false;
    }
    if (joiner) {
        void *v = NULL;
        size_t len = 0;
        if (collie_store_get(run->st, key, EL_KEY_MS, &v, &len) != COLLIE_OK) return false;
        *at = atoi(v);
        free(v);
    }
    if (n > CH_MAX_RANKS) return false;
    for (int q = 0; q < n; q++) {
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "chaos/%" PRIu64 "/id/%s/%d", run->seed, name, q);
        if (collie_store_get(run->st, key, EL_KEY_MS, &v, &len) != COLLIE_OK) return false;
        run->mem[q] = atoi(v);
        free(v);
    }
    run->msize = n;
    run->me = me;
    return true;
}

/* The members take replacements back, when the seed says so (above).
 * True if the world changed. */
static bool el_maybe_grow(ch_run *run, int r, int last, bool *lost, char *why, size_t cap) {
    ch_report *rep = &run->rep;
    if (!(run->faults & CH_F_GROW) || run->msize >= run->world || r + 1 >= last) return false;
    if (ch_hash(run->seed, (uint64_t)r, 0x6772, (uint64_t)run->msize) % 10 >= 7) return false;
    int count = run->world - run->msize, size = run->msize;
    const char *old = collie_comm_name(run->w);
    int64_t t0 = ch_now_ns();
    ch_report_line(rep, NULL, "grow_enter r=%d comm=%s count=%d size=%d start_us=%lld", r, old,
                   count, size, (long long)(t0 / 1000));
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.count = count;
    go.timeout_ms = EL_GROW_MS;
    collie_comm *nw = NULL;
    int rc = collie_comm_grow(run->w, &go, &nw);
    int64_t t1 = ch_now_ns();
    el_check_reason(rep, r, "grow", rc);
    ch_report_line(rep, rc == COLLIE_OK ? NULL : collie_last_error(),
                   "grow r=%d status=%s comm=%s new=%s count=%d size=%d new_size=%d new_rank=%d "
                   "start_us=%lld end_us=%lld ms=%lld",
                   r, collie_status_name(rc), old, rc == COLLIE_OK ? collie_comm_name(nw) : "-",
                   count, size, rc == COLLIE_OK ? collie_comm_size(nw) : 0,
                   rc == COLLIE_OK ? collie_comm_rank(nw) : -1, (long long)(t0 / 1000),
                   (long long)(t1 / 1000), (long long)((t1 - t0) / 1000000));
    if (rc != COLLIE_OK) {
        if (rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER && rc != COLLIE_ESTATE &&
            rc != COLLIE_EABORTED)
            ch_violation(rep, "bad_status", r, -1, "collie_comm_grow returned %s: %s",
                         collie_status_name(rc), collie_last_error());
        return false; /* the old world is untouched */
    }
    if (collie_comm_size(nw) != size + count || collie_comm_rank(nw) != run->me)
        ch_violation(rep, "bad_status", r, -1,
                     "grow gave a comm of size %d where this rank is %d; expected %d and %d",
                     collie_comm_size(nw), collie_comm_rank(nw), size + count, run->me);
    int at = r + 1;
    el_leave(run, run->w);
    run->w = nw;
    if (!el_members(run, nw, &at, false)) {
        snprintf(why, cap, "after the grow to comm '%s': the members' ids: %s",
                 collie_comm_name(nw), collie_last_error());
        *lost = true;
    }
    return true;
}

/* A replacement: join the world by its family name; the round it goes on
 * with in *r0. NULL, or the end reason. */
static const char *el_join(ch_run *run, int *r0, char *why, size_t cap) {
    char family[64];
    snprintf(family, sizeof family, "chaos%" PRIu64 "w", run->seed);
    collie_comm_opts co = ch_comm_opts(family, false);
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = EL_JOIN_MS;
    go.comm = &co;
    collie_comm *c = NULL;
    int64_t t0 = ch_now_ns();
    int rc = collie_comm_join(run->e, run->st, family, &go, &c);
    int64_t t1 = ch_now_ns();
    el_check_reason(&run->rep, -1, "join", rc);
    ch_report_line(&run->rep, rc == COLLIE_OK ? NULL : collie_last_error(),
                   "join status=%s family=%s comm=%s rank=%d size=%d start_us=%lld end_us=%lld "
                   "ms=%lld",
                   collie_status_name(rc), family, rc == COLLIE_OK ? collie_comm_name(c) : "-",
                   rc == COLLIE_OK ? collie_comm_rank(c) : -1,
                   rc == COLLIE_OK ? collie_comm_size(c) : 0, (long long)(t0 / 1000),
                   (long long)(t1 / 1000), (long long)((t1 - t0) / 1000000));
    if (rc != COLLIE_OK) {
        if (rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER)
            ch_violation(&run->rep, "bad_status", -1, -1, "collie_comm_join returned %s: %s",
                         collie_status_name(rc), collie_last_error());
        snprintf(why, cap, "join: %s (%s)", collie_status_name(rc), collie_last_error());
        return "join_failed";
    }
    run->w = c;
    if (!el_members(run, c, r0, true)) {
        snprintf(why, cap, "after joining comm '%s': the members' ids: %s", collie_comm_name(c),
                 collie_last_error());
        el_leave(run, c);
        run->w = NULL;
        return "lost";
    }
    return NULL;
}

/* ---- a round ----------------------------------------------------------------- */

static int el_round(ch_run *run, int r, int last, bool *changed, char *why, size_t cap) {
    ch_round *p = &run->plan;
    el_plan(run, r);
    memset(run->comms, 0, sizeof run->comms);
    run->comms[0] = run->w;
    run->faulted = false;
    run->posted = 0;
    *changed = false;
    char members[128];
    el_ids(run->mem, run->msize, members, sizeof members);
    ch_report_line(&run->rep, NULL,
                   "round r=%d comm_size=%d inflight=%d ops=%d split=0 group=0 fault=%d "
                   "fault_slot=%d stall_slot=-1 infinite_timeout=0 abort_sub_ms=-1 "
                   "sub_delay_ms=0 start_us=%lld comm=%s rank=%d members=%s",
                   r, run->msize, p->window, p->ops, p->fault, p->fault_slot,
                   (long long)(ch_now_ns() / 1000), collie_comm_name(run->w), run->me, members);
    memset(&run->ab, 0, sizeof run->ab);
    atomic_init(&run->ab.fired_ns, 0);
    ch_run_slots(run, el_healthy(run->w));
    if (!run->faulted) {
        int b = el_round_end(run, r, why, cap);
        if (b < 0) return EL_LOST;
        if (b > 0) {
            bool lost = false;
            *changed = el_maybe_grow(run, r, last, &lost, why, cap);
            return lost ? EL_LOST : EL_NEXT;
        }
    }
    int st = el_shrink(run, r, why, cap);
    *changed = st == EL_NEXT;
    return st;
}

const char *ch_elastic_main(ch_run *run, char *why, size_t cap) {
    int r0 = 0;
    bool changed = false;
    if (run->join_id >= 0) {
        const char *reason = el_join(run, &r0, why, cap);
        if (reason) return reason;
        changed = true; /* its first round runs */
    } else {
        char name[64];
        snprintf(name, sizeof name, "chaos%" PRIu64 "w", run->seed);
        collie_comm_opts o = ch_comm_opts(name, false);
        int64_t t0 = ch_now_ns();
        int rc = collie_comm_create(run->e, run->st, run->rank, run->world, &o, &run->w);
        int64_t t1 = ch_now_ns();
        ch_report_line(&run->rep, rc == COLLIE_OK ? NULL : collie_last_error(),
                       "group r=0 op=comm_create status=%s comm=0 ms=%lld deadline_ms=%d "
                       "end_us=%lld",
                       collie_status_name(rc), (long long)((t1 - t0) / 1000000),
                       o.create_timeout_ms, (long long)(t1 / 1000));
        if (rc != COLLIE_OK) {
            if (rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER)
                ch_violation(&run->rep, "bad_status", 0, -1, "collie_comm_create returned %s: %s",
                             collie_status_name(rc), collie_last_error());
            snprintf(why, cap, "create of the world: %s (%s)", collie_status_name(rc),
                     collie_last_error());
            return "create_failed";
        }
        run->msize = run->world;
        run->me = run->rank;
        for (int q = 0; q < run->world; q++)
            run->mem[q] = q;
    }
    const char *reason = "done";
    int last = run->rounds;
    for (int r = r0; r < last || (changed && r < run->rounds + EL_EXTRA_ROUNDS); r++) {
        int st = el_round(run, r, last, &changed, why, cap);
        if (st == EL_OUT) return "excluded";
        if (st == EL_LOST) {
            reason = "lost";
            break;
        }
    }
    /* at the end, one run in two leaves as a Python rank does at interpreter
     * exit: the destroy posted and dropped, then the engine destroyed at
     * once (chaos_rank.c's main), which ends it (a comm freed under its
     * engine's shutdown crashed test_processes.py's rank 1 run in 4) */
    if (run->w && (run->seed + (uint64_t)run->me) % 2) {
        ch_comm_end_line(run, 0, run->w, ch_now_ns());
        collie_work *d = NULL;
        if (collie_comm_destroy_post(run->w, NULL, &d) == COLLIE_OK)
            collie_work_release(d);
        else
            ch_violation(&run->rep, "bad_status", run->plan.round, -1,
                         "collie_comm_destroy_post of the world at exit: %s", collie_last_error());
    } else if (run->w) {
        el_leave(run, run->w);
    }
    run->w = NULL;
    return reason;
}
