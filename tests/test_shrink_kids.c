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
 *   replaced:  4 processes, rank 3 killed, the others shrink; a fifth
 *              process (the replacement) joins by the family name asking
 *              for rank 3, the survivors grow: a comm of 4 again whose
 *              allreduce's bytes are right on every rank.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "comm/comm.h"
#include "engine/engine.h"
#include "harness.h"
#include "kids.h"
#include "runner.h"

/* ---- ranks as processes ------------------------------------------------------------------ */

#define KN 4

typedef struct kid_plan {
    int victim2;  /* a second rank killed during the agreement (-1: none) */
    bool stop;    /* rank 3 is stopped, not killed */
    bool replace; /* a fifth process joins as rank 3 once the others shrank */
} kid_plan;

static int kid_join(const char *addr, int rank, collie_engine **e, collie_store **st,
                    collie_comm **c) {
    if (collie_engine_create(NULL, e) != COLLIE_OK) return 10;
    if (collie_store_connect(*e, addr, NULL, st) != COLLIE_OK) return 11;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "shk";
    if (collie_comm_create(*e, *st, rank, KN, &o, c) != COLLIE_OK) return 12;
    int s;
    if (one_allreduce(*c, rank, &s) != 10 || s != COLLIE_OK) return 13;
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
    one_allreduce(c, 3, &s);
    if (s != COLLIE_ENOTMEMBER) return 31;
    collie_comm *late = NULL;
    if (collie_comm_shrink(c, NULL, &late) != COLLIE_ENOTMEMBER || late) return 32;
    printf("excluded 3\n");
    fflush(stdout);
    return 0;
}

/* a survivor takes the replacement back: a comm of 4 again, the
 * replacement rank 3 (the allreduce's sum: 1 + 2 + 3 + 4) */
static int kid_grow(collie_comm *nc, int rank) {
    int64_t t0 = cl_now_ns();
    collie_comm *gc = NULL;
    if (collie_comm_grow(nc, NULL, &gc) != COLLIE_OK) {
        printf("grow failed: %s\n", collie_last_error());
        fflush(stdout);
        return 40;
    }
    int s;
    if (collie_comm_size(gc) != KN || collie_comm_rank(gc) != rank) return 41;
    if (one_allreduce(gc, rank, &s) != 10 || s != COLLIE_OK) return 42;
    printf("grown %d %lld\n", rank, (long long)((cl_now_ns() - t0) / 1000));
    fflush(stdout);
    return collie_comm_destroy(gc) == COLLIE_OK ? 0 : 43;
}

/* the replacement (the fifth process): told "go" once the others shrank,
 * it joins the family "shk" as rank 3 */
static int kid_replacement(const char *addr) {
    collie_engine *e;
    collie_store *st;
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return 50;
    if (collie_store_connect(e, addr, NULL, &st) != COLLIE_OK) return 51;
    printf("ready 4\n");
    fflush(stdout);
    struct pollfd p = {.fd = 0, .events = POLLIN};
    char line[16];
    if (poll(&p, 1, 20000) != 1 || read(0, line, sizeof line) <= 0) return 52;
    int64_t t0 = cl_now_ns();
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.rank = 3;
    collie_comm *c = NULL;
    if (collie_comm_join(e, st, "shk", &go, &c) != COLLIE_OK) {
        printf("join failed: %s\n", collie_last_error());
        fflush(stdout);
        return 53;
    }
    int s;
    if (collie_comm_rank(c) != 3 || one_allreduce(c, 3, &s) != 10 || s != COLLIE_OK) return 54;
    printf("joined 4 %lld\n", (long long)((cl_now_ns() - t0) / 1000));
    fflush(stdout);
    collie_comm_destroy(c);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return 0;
}

static int shrink_child(const char *addr, int rank, void *arg) {
    const kid_plan *p = arg;
    if (rank == KN) return kid_replacement(addr);
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
    int32_t sum = one_allreduce(nc, rank, &s);
    int32_t want = p->victim2 >= 0 ? 1 + 2 : 1 + 2 + 3;
    if (s != COLLIE_OK || sum != want) return 17;
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(c, &f);
    if (f.view != COLLIE_FAULT_VIEW_AGREED || f.nranks != KN - want_size) return 18;
    /* the kind says what this rank knows of the set: every one dead, or not */
    if (f.kind != (p->stop ? COLLIE_FAULT_PEER_STUCK : COLLIE_FAULT_PEER_DEAD) &&
        !(p->victim2 >= 0 && f.kind == COLLIE_FAULT_PEER_STUCK))
        return 21;
    printf("shrunk %d %lld\n", rank, (long long)((cl_now_ns() - t0) / 1000));
    fflush(stdout);
    if (p->replace && (rc = kid_grow(nc, rank)) != 0) return rc;
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
    int n = KN + (p->replace ? 1 : 0);
    kids_start(&k, n, shrink_child, (void *)p, settings);
    int up = 0;
    for (int r = 0; r < KN; r++)
        up += kids_wait(&k, r, "up ", 20000);
    if (p->replace) up += kids_wait(&k, KN, "ready ", 20000) ? 0 : 100;
    kill(k.pid[3], p->stop ? SIGSTOP : SIGKILL);
    if (p->victim2 >= 0) { /* once the others are in the agreement */
        for (int r = 0; r < KN - 1; r++)
            if (r != p->victim2) kids_wait(&k, r, "shrinking ", 20000);
        kill(k.pid[p->victim2], SIGKILL);
    }
    if (p->replace) {
        for (int r = 0; r < 3; r++)
            kids_wait(&k, r, "shrunk ", 20000);
        kids_tell(&k, KN, "go\n");
    }
    if (p->stop) {
        for (int r = 0; r < 3; r++)
            kids_wait(&k, r, "shrunk ", 20000);
        kill(k.pid[3], SIGCONT);
        kids_wait(&k, 3, "excluded ", 20000);
    }
    int codes[KN + 1];
    kids_end(&k, codes, 25000);
    assert_int_equal(up, KN);
    for (int r = 0; r < n; r++) {
        bool killed = (r == 3 && !p->stop) || r == p->victim2;
        if (killed) continue;
        if (codes[r] != 0) print_message("rank %d exited %d: %s\n", r, codes[r], k.buf[r]);
        assert_int_equal(codes[r], 0);
        const char *t = strstr(k.buf[r], "shrunk ");
        if (t) print_message("%s", t);
        if (p->replace) {
            t = strstr(k.buf[r], r == KN ? "joined " : "grown ");
            assert_non_null(t);
            print_message("%s", t);
        }
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

static void test_shrink_then_replacement_joins(void **state) {
    (void)state;
    kid_plan p = {.victim2 = -1, .replace = true};
    run_kids(&p, "auto");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_killed),
        cmocka_unit_test(test_shrink_killed_tcp),
        cmocka_unit_test(test_shrink_second_failure),
        cmocka_unit_test(test_shrink_stopped_rank_excluded),
        cmocka_unit_test(test_shrink_then_replacement_joins),
    };
    return cltest_main(tests, NULL, NULL);
}
