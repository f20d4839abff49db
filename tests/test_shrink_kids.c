/*
 * test_shrink_kids.c — shrinking to the survivors (issue 33) with ranks as
 * forked processes (kids.h), for process death and stops (not under TSan:
 * it cannot follow a fork from a process with threads):
 *
 *   killed:    4 processes, rank 3 SIGKILLed while idle; the survivors
 *              shrink on their comm_faulted event: a comm of 3, right bytes,
 *              fault agreed {3} (auto and TCP).
 *   second:    4 processes, rank 3 killed; rank 2 is killed while ranks 0
 *              and 1 are already in the agreement: they end with a comm of
 *              2 (the agreement sees the second death and stops waiting).
 *   stopped:   4 processes, short heartbeat bounds, rank 3 SIGSTOPped: the
 *              others shrink once it is suspected; resumed, rank 3 gets an
 *              EXCLUDED event, ENOTMEMBER on its next post and from its own
 *              shrink.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "engine/engine.h"
#include "harness.h"
#include "kids.h"
#include "runner.h"

/* an allreduce of (old rank + 1) on comm c; its result */
static int32_t allreduce_one(collie_comm *c, int old_rank, int *status) {
    int32_t v = old_rank + 1, out = -1;
    collie_work *w;
    *status = collie_allreduce(c, &v, &out, 1, COLLIE_INT32, COLLIE_SUM, NULL, &w);
    if (*status != COLLIE_OK) return -1;
    *status = collie_work_wait(w, 10000);
    collie_work_release(w);
    return out;
}

/* ---- ranks as processes ------------------------------------------------------------------ */

#define KN 4

typedef struct kid_plan {
    int victim2; /* a second rank killed during the agreement (-1: none) */
    bool stop;   /* rank 3 is stopped, not killed */
} kid_plan;

static int kid_join(const char *addr, int rank, collie_engine **e, collie_store **st,
                    collie_comm **c) {
    if (collie_engine_create(NULL, e) != COLLIE_OK) return 10;
    if (collie_store_connect(*e, addr, NULL, st) != COLLIE_OK) return 11;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "shk";
    if (collie_comm_create(*e, *st, rank, KN, &o, c) != COLLIE_OK) return 12;
    int s;
    if (allreduce_one(*c, rank, &s) != 10 || s != COLLIE_OK) return 13;
    return 0;
}

/* an event of `kind` (about `rank`, -1: any), or of `kind2` about anyone */
static bool kid_wait_events(collie_comm *c, int kind, int rank, int kind2, int ms) {
    int fd = collie_comm_event_fd(c);
    int64_t until = now_ms() + ms;
    while (now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) != 1) continue;
        collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
        while (collie_comm_event_pop(c, &ev) == COLLIE_OK)
            if ((ev.kind == kind && (rank < 0 || ev.rank == rank)) || ev.kind == kind2) return true;
    }
    return false;
}

static bool kid_wait_event(collie_comm *c, int kind, int rank, int ms) {
    return kid_wait_events(c, kind, rank, kind, ms);
}

/* rank 3 when stopped and resumed: it is told it is out */
static int kid_stopped(collie_comm *c) {
    printf("up 3\n");
    fflush(stdout);
    /* the test stops us here, then continues us */
    if (!kid_wait_event(c, COLLIE_EVENT_EXCLUDED, -1, 20000)) return 30;
    int s;
    allreduce_one(c, 3, &s);
    if (s != COLLIE_ENOTMEMBER) return 31;
    collie_comm *late = NULL;
    if (collie_comm_shrink(c, NULL, &late) != COLLIE_ENOTMEMBER || late) return 32;
    printf("excluded 3\n");
    fflush(stdout);
    return 0;
}

static int shrink_child(const char *addr, int rank, void *arg) {
    const kid_plan *p = arg;
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    int rc = kid_join(addr, rank, &e, &st, &c);
    if (rc) return rc;
    if (rank == 3 && p->stop) return kid_stopped(c);
    printf("up %d\n", rank);
    fflush(stdout);
    if (rank == 3 || rank == p->victim2) pause(); /* killed by the test */
    /* what a server reacts to: a peer suspected (the stopped rank), or the
     * comm's fault (a death, or another's revoke) */
    if (!kid_wait_events(c, COLLIE_EVENT_PEER_SUSPECTED, 3, COLLIE_EVENT_COMM_FAULTED, 20000))
        return 14;
    printf("shrinking %d\n", rank);
    fflush(stdout);
    int64_t t0 = cl_now_ns();
    collie_comm *nc = NULL;
    rc = collie_comm_shrink(c, NULL, &nc);
    if (rc != COLLIE_OK) {
        printf("shrink failed %d: %s\n", rc, collie_last_error());
        fflush(stdout);
        return 15;
    }
    int want_size = p->victim2 >= 0 ? 2 : 3;
    if (collie_comm_size(nc) != want_size || collie_comm_rank(nc) != rank) return 16;
    int s;
    int32_t sum = allreduce_one(nc, rank, &s);
    int32_t want = p->victim2 >= 0 ? 1 + 2 : 1 + 2 + 3;
    if (s != COLLIE_OK || sum != want) return 17;
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(c, &f);
    if (f.view != COLLIE_FAULT_VIEW_AGREED || f.nranks != KN - want_size) return 18;
    printf("shrunk %d %lld\n", rank, (long long)((cl_now_ns() - t0) / 1000));
    fflush(stdout);
    if (collie_comm_destroy(nc) != COLLIE_OK) return 19;
    collie_comm_destroy(c);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return 0;
}

static void run_kids(const kid_plan *p, const char *transport) {
    char tr[64];
    snprintf(tr, sizeof tr, "COLLIE_CPU_TRANSPORT=%s", transport);
    const char *settings[] = {tr, "COLLIE_HEARTBEAT_MS=100", "COLLIE_SUSPECT_MS=500", NULL};
    kids k;
    kids_start(&k, KN, shrink_child, (void *)p, settings);
    int up = 0;
    for (int r = 0; r < KN; r++)
        up += kids_wait(&k, r, "up ", 20000);
    kill(k.pid[3], p->stop ? SIGSTOP : SIGKILL);
    if (p->victim2 >= 0) { /* once the others are in the agreement */
        for (int r = 0; r < KN - 1; r++)
            if (r != p->victim2) kids_wait(&k, r, "shrinking ", 20000);
        kill(k.pid[p->victim2], SIGKILL);
    }
    if (p->stop) {
        for (int r = 0; r < 3; r++)
            kids_wait(&k, r, "shrunk ", 20000);
        kill(k.pid[3], SIGCONT);
        kids_wait(&k, 3, "excluded ", 20000);
    }
    int codes[KN];
    kids_end(&k, codes, 25000);
    assert_int_equal(up, KN);
    for (int r = 0; r < KN; r++) {
        bool killed = (r == 3 && !p->stop) || r == p->victim2;
        if (killed) continue;
        if (codes[r] != 0) print_message("rank %d exited %d: %s\n", r, codes[r], k.buf[r]);
        assert_int_equal(codes[r], 0);
        const char *t = strstr(k.buf[r], "shrunk ");
        if (t) print_message("%s", t);
    }
}

static void test_shrink_killed(void **state) {
    (void)state;
    kid_plan p = {.victim2 = -1};
    run_kids(&p, "auto");
}

static void test_shrink_killed_tcp(void **state) {
    (void)state;
    kid_plan p = {.victim2 = -1};
    run_kids(&p, "tcp");
}

static void test_shrink_second_failure(void **state) {
    (void)state;
    kid_plan p = {.victim2 = 2};
    run_kids(&p, "auto");
}

static void test_shrink_stopped_rank_excluded(void **state) {
    (void)state;
    kid_plan p = {.victim2 = -1, .stop = true};
    run_kids(&p, "auto");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_killed),
        cmocka_unit_test(test_shrink_killed_tcp),
        cmocka_unit_test(test_shrink_second_failure),
        cmocka_unit_test(test_shrink_stopped_rank_excluded),
    };
    return cltest_main(tests, NULL, NULL);
}
