/*
 * test_health.c — failure as data (collie_work_fault, collie_comm_fault),
 * peer health (collie_comm_health) and the event fd, with ranks in one
 * process (coll_fixture) and, for process death, in forked children:
 *
 *   text:      the abort notice's fault text round-trips; the parser takes
 *              nothing the writer does not write.
 *   abort:     rank 0 aborts: its fault is app_abort (own view, origin 0,
 *              no ranks), the peer's is peer_abort from rank 0 (its view),
 *              the failed work carries the comm's, each rank's event fd is
 *              readable with a comm_faulted event.
 *   left:      a rank destroys its comm: the others see it "left" (health
 *              and a peer_left event), never dead, and their comm is not
 *              faulted by it.
 *   health:    completed collectives raise every peer's sequence number;
 *              bad arguments are refused by name.
 *   notice:    a rank that sees a peer die tells the others (abort notice):
 *              one with no link and no pidfd on it gets a peer_dead event
 *              first, and its health says dead.
 *   killed:    4 ranks as processes (fork, one engine each), idle after one
 *              allreduce; rank 3 SIGKILLed: every survivor's fd is readable
 *              within DEAD_MS with a peer_dead event for rank 3, its health
 *              says dead, and its comm's fault is peer_dead {3} (the TCP leg:
 *              COLLIE_CPU_TRANSPORT=tcp; the same-host pidfd watch without
 *              any link: the kill before any collective).
 *   stopped:   the same 4 ranks with heartbeats every 100 ms and a suspect
 *              bound of 500 ms, idle twice that long after one allreduce
 *              (nobody is suspected), then rank 3 SIGSTOPped: every
 *              survivor linked to it sees it slow, then a peer_suspected
 *              event within the bound plus slack, its health says
 *              suspected, its comm never faults; a survivor without a
 *              link judges nothing. SIGCONT: peer_back, alive, and the next
 *              allreduce's bytes are right. TCP and auto (shared-memory
 *              links carry heartbeats too).
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "comm/comm.h"
#include "engine/engine.h"
#include "harness.h"
#include "kids.h"
#include "runner.h"

#define DEAD_MS 2000 /* generous: the target (bench) is 100 ms */

static bool fd_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* pop events until one of `kind` (for `rank`, -2: any) or none is left */
static bool pop_until(collie_comm *c, int kind, int rank, collie_comm_event *out) {
    for (int i = 0; i < 64; i++) {
        collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
        if (collie_comm_event_pop(c, &ev) != COLLIE_OK) return false;
        if (ev.kind == kind && (rank == -2 || ev.rank == rank)) {
            if (out) *out = ev;
            return true;
        }
    }
    return false;
}

static void test_fault_text_round_trip(void **state) {
    (void)state;
    cl_fault f, g;
    cl_fault_init(&f, COLLIE_FAULT_PEER_DEAD, COLLIE_FAULT_VIEW_LOCAL, 2);
    cl_fault_add(&f, 5);
    cl_fault_add(&f, 3);
    cl_fault_add(&f, 5);
    assert_int_equal(f.nranks, 2);
    char buf[256];
    cl_fault_format(&f, buf, sizeof buf);
    assert_string_equal(buf, "1 2 3,5");
    strcat(buf, " rank 3 died");
    const char *rest;
    assert_true(cl_fault_parse(buf, 8, &g, &rest));
    assert_int_equal(g.kind, COLLIE_FAULT_PEER_DEAD);
    assert_int_equal(g.view, COLLIE_FAULT_VIEW_PEER);
    assert_int_equal(g.origin, 2);
    assert_int_equal(g.nranks, 2);
    assert_int_equal(g.ranks[0], 3);
    assert_int_equal(g.ranks[1], 5);
    assert_string_equal(rest, "rank 3 died");
    assert_true(cl_fault_parse("6 -1 - why", 4, &g, &rest));
    assert_int_equal(g.nranks, 0);
    assert_string_equal(rest, "why");
    /* what the writer never writes */
    const char *bad[] = {"0 1 - x",  "9 1 - x", "1 8 - x", "1 1 3,2 x", "1 1 3,3 x", "1 1 9 x",
                         "1 1 -1 x", "x 1 - x", "1 1 3,x", "1 -2 - x",  "1 1 3, x",  "",
                         "1",        "1 1",     "1 1 3x",  "1 1 ,3 x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(cl_fault_parse(bad[i], 8, &g, &rest));
    /* more ranks than listed: counted */
    cl_fault_init(&f, COLLIE_FAULT_PEER_DEAD, COLLIE_FAULT_VIEW_LOCAL, 0);
    for (int r = 99; r >= 0; r--)
        cl_fault_add(&f, r);
    assert_int_equal(f.nranks, 100);
    for (int i = 0; i < COLLIE_FAULT_RANKS; i++)
        assert_int_equal(f.ranks[i], i);
    assert_string_equal(collie_fault_kind_name(COLLIE_FAULT_PEER_LEFT), "peer_left");
    assert_string_equal(collie_fault_kind_name(99), "?");
}

static void test_abort_fault_data(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "fabort", NULL);
    world_link(&w);
    collie_fault f = COLLIE_FAULT_INIT;
    assert_int_equal(collie_comm_fault(w.c[0], &f), COLLIE_OK);
    assert_int_equal(f.status, COLLIE_OK);
    assert_int_equal(f.kind, COLLIE_FAULT_NONE);
    float buf[4] = {0};
    collie_work *pending;
    assert_int_equal(collie_allreduce(w.c[1], buf, buf, 4, COLLIE_FP32, COLLIE_SUM, NULL, &pending),
                     COLLIE_OK);
    assert_int_equal(collie_comm_abort(w.c[0], "operator"), COLLIE_OK);
    /* rank 1 learns it (its work fails): its data says whose view */
    assert_int_equal(collie_work_wait(pending, 5000), COLLIE_EABORTED);
    collie_fault wf = COLLIE_FAULT_INIT;
    assert_int_equal(collie_work_fault(pending, &wf), COLLIE_OK);
    assert_int_equal(wf.status, COLLIE_EABORTED);
    assert_int_equal(wf.kind, COLLIE_FAULT_PEER_ABORT);
    assert_int_equal(wf.origin, 0);
    assert_int_equal(wf.view, COLLIE_FAULT_VIEW_PEER);
    assert_int_equal(wf.nranks, 0);
    collie_work_release(pending);
    assert_int_equal(collie_comm_fault(w.c[0], &f), COLLIE_OK);
    assert_int_equal(f.status, COLLIE_EABORTED);
    assert_int_equal(f.kind, COLLIE_FAULT_APP_ABORT);
    assert_int_equal(f.view, COLLIE_FAULT_VIEW_LOCAL);
    assert_int_equal(f.origin, 0);
    assert_int_equal(f.nranks, 0);
    assert_int_equal(collie_comm_fault(w.c[1], &f), COLLIE_OK);
    assert_int_equal(f.kind, COLLIE_FAULT_PEER_ABORT);
    assert_int_equal(f.origin, 0);
    /* each rank's fd: readable, a comm_faulted event with the kind */
    for (int r = 0; r < 2; r++) {
        int fd = collie_comm_event_fd(w.c[r]);
        assert_true(fd >= 0);
        assert_true(fd_readable(fd, 2000));
        collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
        assert_true(pop_until(w.c[r], COLLIE_EVENT_COMM_FAULTED, -2, &ev));
        assert_int_equal(ev.status, f.status);
        assert_int_equal(ev.fault_kind, r == 0 ? COLLIE_FAULT_APP_ABORT : COLLIE_FAULT_PEER_ABORT);
        assert_int_equal(ev.rank, 0);
    }
    /* bad arguments, named */
    assert_int_equal(collie_comm_fault(NULL, &f), COLLIE_EINVAL);
    collie_fault small = {.size = 4};
    assert_int_equal(collie_comm_fault(w.c[0], &small), COLLIE_EINVAL);
    assert_non_null(strstr(collie_last_error(), "size"));
    assert_int_equal(collie_work_fault(NULL, &f), COLLIE_EINVAL);
    world_destroy(&w);
}

static void test_left_is_not_dead(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "fleft", NULL); /* two ranks: linked by world_link */
    world_link(&w);
    assert_int_equal(collie_comm_destroy(w.c[1]), COLLIE_OK);
    w.c[1] = NULL;
    int64_t until = now_ms() + 5000;
    collie_peer_health h[2];
    while (now_ms() < until) {
        assert_int_equal(collie_comm_health(w.c[0], h, 2), 2);
        if (h[1].state == COLLIE_PEER_LEFT) break;
        usleep(2000);
    }
    assert_int_equal(h[1].state, COLLIE_PEER_LEFT);
    assert_int_equal(h[0].state, COLLIE_PEER_SELF);
    collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
    assert_true(pop_until(w.c[0], COLLIE_EVENT_PEER_LEFT, 1, &ev));
    assert_int_equal(collie_comm_error(w.c[0], NULL, NULL), COLLIE_OK);
    world_destroy(&w);
}

static void test_health_sequence_numbers(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "fseq", NULL);
    for (int i = 0; i < 3; i++)
        run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_INT32, COLLIE_SUM, 16, 0, false);
    collie_peer_health h[2];
    assert_int_equal(collie_comm_health(w.c[0], h, 2), 2);
    assert_int_equal(h[0].state, COLLIE_PEER_SELF);
    assert_int_equal(h[1].state, COLLIE_PEER_ALIVE);
    assert_true(h[1].seq >= 3);
    assert_true(h[1].heard_ago_ms >= 0 && h[1].heard_ago_ms < 60000);
    assert_int_equal(collie_comm_health(w.c[0], h, 1), 1);
    assert_int_equal(collie_comm_health(NULL, h, 2), COLLIE_EINVAL);
    assert_int_equal(collie_comm_health(w.c[0], NULL, 2), COLLIE_EINVAL);
    assert_int_equal(collie_comm_health(w.c[0], h, -1), COLLIE_EINVAL);
    collie_comm_event ev = {.size = 3};
    assert_int_equal(collie_comm_event_pop(w.c[0], &ev), COLLIE_EINVAL);
    ev = (collie_comm_event)COLLIE_COMM_EVENT_INIT;
    assert_int_equal(collie_comm_event_pop(w.c[0], &ev), COLLIE_INPROGRESS);
    assert_false(fd_readable(collie_comm_event_fd(w.c[0]), 0));
    world_destroy(&w);
}

static void assert_mismatch_of(collie_work *w, int status) {
    collie_fault f = COLLIE_FAULT_INIT;
    assert_int_equal(collie_work_fault(w, &f), COLLIE_OK);
    assert_int_equal(f.status, status);
    assert_int_equal(f.kind, COLLIE_FAULT_MISMATCH);
    assert_int_equal(f.nranks, 2);
    assert_int_equal(f.ranks[0], 0);
    assert_int_equal(f.ranks[1], 1);
}

/* Ranks that post different counts: a mismatch of the two, as data (and
 * a send/recv pair of different dtypes under policy NONE: the receive's
 * own fault) */
static void test_mismatch_names_both_ranks(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "fmis", NULL);
    world_link(&w);
    int32_t a[8] = {0}, b[8] = {0};
    collie_work *wa, *wb;
    assert_int_equal(collie_allreduce(w.c[0], a, a, 4, COLLIE_INT32, COLLIE_SUM, NULL, &wa),
                     COLLIE_OK);
    assert_int_equal(collie_allreduce(w.c[1], b, b, 8, COLLIE_INT32, COLLIE_SUM, NULL, &wb),
                     COLLIE_OK);
    int sa = collie_work_wait(wa, 10000), sb = collie_work_wait(wb, 10000);
    /* the rank that found it: EPROTO; the other: its abort (or its own find) */
    assert_true(sa == COLLIE_EPROTO || sb == COLLIE_EPROTO);
    collie_fault f = COLLIE_FAULT_INIT;
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_comm_fault(w.c[r], &f), COLLIE_OK);
        assert_int_equal(f.kind, COLLIE_FAULT_MISMATCH);
        assert_int_equal(f.nranks, 2);
    }
    assert_mismatch_of(sa == COLLIE_EPROTO ? wa : wb, COLLIE_EPROTO);
    collie_work_release(wa);
    collie_work_release(wb);
    world_destroy(&w);

    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.policy = COLLIE_POLICY_NONE;
    world_create(&w, 2, "fmisp", &o);
    world_link(&w);
    float x[4] = {1, 2, 3, 4};
    int32_t y[4] = {0};
    assert_int_equal(collie_send(w.c[0], x, 4, COLLIE_FP32, 1, 5, NULL, &wa), COLLIE_OK);
    assert_int_equal(collie_recv(w.c[1], y, 4, COLLIE_INT32, 0, 5, NULL, &wb), COLLIE_OK);
    assert_int_equal(collie_work_wait(wb, 10000), COLLIE_EPROTO);
    assert_mismatch_of(wb, COLLIE_EPROTO);
    collie_work_wait(wa, 10000);
    collie_work_release(wa);
    collie_work_release(wb);
    world_destroy(&w);
}

/* rank 1 of w sees rank 2 dead (on its loop, as its health would) */
static void notice_dead_on_loop(void *arg) {
    collie_comm *c = arg;
    cl_fault f;
    cl_fault_init(&f, COLLIE_FAULT_PEER_DEAD, COLLIE_FAULT_VIEW_LOCAL, c->rank);
    cl_fault_add(&f, 2);
    cl_health_peer_gone(c, 2, COLLIE_PEER_DEAD);
    cl_comm_fault_data(c, COLLIE_EPEER, &f, true, "rank 2 died (a test says so)");
}

/* A rank with no link to a dead peer and no pidfd on it (ranks of one
 * process: another host, as far as health can tell) hears of the death
 * from the abort notice of the rank that saw it: a peer_dead event, then
 * comm_faulted, and its health says dead. */
static void test_notice_of_a_death_is_peer_dead(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "fnotice", NULL);
    assert_int_equal(cl_engine_call(w.e, notice_dead_on_loop, w.c[1], 5000), COLLIE_OK);
    int fd = collie_comm_event_fd(w.c[0]);
    assert_true(fd_readable(fd, 5000));
    collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
    int64_t until = now_ms() + 5000; /* the comm_faulted event follows at once */
    while (collie_comm_error(w.c[0], NULL, NULL) == COLLIE_OK && now_ms() < until)
        usleep(1000);
    assert_int_equal(collie_comm_event_pop(w.c[0], &ev), COLLIE_OK);
    assert_int_equal(ev.kind, COLLIE_EVENT_PEER_DEAD);
    assert_int_equal(ev.rank, 2);
    /* then the comm's (bounded: a loaded machine may run the flush late) */
    bool faulted = false;
    until = now_ms() + 5000;
    while (!(faulted = pop_until(w.c[0], COLLIE_EVENT_COMM_FAULTED, -2, &ev)) && now_ms() < until)
        fd_readable(fd, 10);
    assert_true(faulted);
    assert_int_equal(ev.fault_kind, COLLIE_FAULT_PEER_DEAD);
    collie_peer_health h[3];
    assert_int_equal(collie_comm_health(w.c[0], h, 3), 3);
    assert_int_equal(h[2].state, COLLIE_PEER_DEAD);
    assert_int_equal(h[1].state, COLLIE_PEER_ALIVE); /* the messenger is not dead */
    collie_fault f = COLLIE_FAULT_INIT;
    assert_int_equal(collie_comm_fault(w.c[0], &f), COLLIE_OK);
    assert_int_equal(f.kind, COLLIE_FAULT_PEER_DEAD);
    assert_int_equal(f.view, COLLIE_FAULT_VIEW_PEER);
    assert_int_equal(f.nranks, 1);
    assert_int_equal(f.ranks[0], 2);
    world_destroy(&w);
}

/* ---- ranks as processes ------------------------------------------------------------------ */

#define KILL_N 4

/* a child's side: create comm `name` of KILL_N ranks on the store at addr */
static int kid_join(const char *addr, int rank, const char *name, collie_engine **e,
                    collie_store **st, collie_comm **c) {
    if (collie_engine_create(NULL, e) != COLLIE_OK) return 10;
    if (collie_store_connect(*e, addr, NULL, st) != COLLIE_OK) return 11;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    if (collie_comm_create(*e, *st, rank, KILL_N, &o, c) != COLLIE_OK) return 12;
    return 0;
}

/* a one-element allreduce of rank + 1 + salt on every rank, its bytes checked */
static bool kid_allreduce(collie_comm *c, int rank, int salt) {
    int32_t v = rank + 1 + salt, out = 0;
    collie_work *w;
    if (collie_allreduce(c, &v, &out, 1, COLLIE_INT32, COLLIE_SUM, NULL, &w) != COLLIE_OK)
        return false;
    bool ok = collie_work_wait(w, 10000) == COLLIE_OK && out == 10 + KILL_N * salt;
    collie_work_release(w);
    return ok;
}

/* ---- a rank killed ----------------------------------------------------------------------- */

/* One rank: create, (link), report ready, then wait for its verdict on the
 * event fd; exit code 0 when it saw rank 3 dead as expected, else a code
 * naming the failed check. */
static int kill_child(const char *addr, int rank, void *arg) {
    bool link = *(bool *)arg;
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    int rc = kid_join(addr, rank, "fkill", &e, &st, &c);
    if (rc) return rc;
    if (link && !kid_allreduce(c, rank, 0)) return 13;
    /* two more comms with the same peers: one watch per peer process, shared */
    collie_comm *more[2] = {NULL, NULL};
    if (link) {
        for (int i = 0; i < 2; i++)
            if (collie_comm_split(c, 0, rank, NULL, &more[i]) != COLLIE_OK) return 18;
        int64_t until_w = now_ms() + 5000;
        while (cl_pid_watches() < KILL_N - 1 && now_ms() < until_w)
            usleep(1000);
        usleep(50000); /* the children's watches are in too */
        if (cl_pid_watches() != KILL_N - 1) return 19;
    }
    printf("up %d\n", rank);
    fflush(stdout);
    if (rank == 3) pause(); /* killed by the test */
    int fd = collie_comm_event_fd(c);
    int64_t until = now_ms() + 20000;
    collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
    bool dead = false;
    while (!dead && now_ms() < until) {
        if (!fd_readable(fd, 100)) continue;
        while (!dead && collie_comm_event_pop(c, &ev) == COLLIE_OK)
            dead = ev.kind == COLLIE_EVENT_PEER_DEAD && ev.rank == 3;
    }
    if (!dead) return 14;
    printf("dead %d %lld\n", rank, (long long)ev.time_ns);
    fflush(stdout);
    collie_peer_health h[KILL_N];
    if (collie_comm_health(c, h, KILL_N) != KILL_N || h[3].state != COLLIE_PEER_DEAD) return 15;
    /* the comm's fault (recorded by the time the event is out) names rank 3 alone */
    collie_fault f = COLLIE_FAULT_INIT;
    int64_t fault_until = now_ms() + 5000;
    while (collie_comm_fault(c, &f) == COLLIE_OK && f.status == COLLIE_OK && now_ms() < fault_until)
        usleep(1000);
    if (f.kind != COLLIE_FAULT_PEER_DEAD && !(f.kind == COLLIE_FAULT_PEER_ABORT && f.nranks == 0))
        return 16;
    if (f.kind == COLLIE_FAULT_PEER_DEAD && (f.nranks != 1 || f.ranks[0] != 3)) return 17;
    for (int i = 0; i < 2 && more[i]; i++) { /* every comm with rank 3 sees it dead */
        int64_t until_m = now_ms() + 5000;
        while (collie_comm_health(more[i], h, KILL_N) == KILL_N && h[3].state != COLLIE_PEER_DEAD &&
               now_ms() < until_m)
            usleep(1000);
        if (h[3].state != COLLIE_PEER_DEAD) return 20;
        collie_comm_destroy(more[i]);
    }
    /* the dead one's watch went (the live peers' stay with c, unless they
     * finished and exited already) */
    if (cl_pid_watches() > KILL_N - 2) return 21;
    collie_comm_destroy(c);
    if (cl_pid_watches() != 0) return 22;
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return 0;
}

static void run_kill(bool link, const char *transport) {
    char tr[64];
    snprintf(tr, sizeof tr, "COLLIE_CPU_TRANSPORT=%s", transport ? transport : "auto");
    const char *settings[] = {tr, NULL};
    kids k;
    kids_start(&k, KILL_N, kill_child, &link, settings);
    int up = 0;
    for (int r = 0; r < KILL_N; r++)
        up += kids_wait(&k, r, "up ", 20000);
    int64_t kill_ns = cl_now_ns();
    kill(k.pid[3], SIGKILL);
    int codes[KILL_N];
    kids_end(&k, codes, 25000);
    assert_int_equal(up, KILL_N);
    for (int r = 0; r < 3; r++) {
        if (codes[r] != 0) print_message("rank %d exited %d: %s\n", r, codes[r], k.buf[r]);
        assert_int_equal(codes[r], 0);
        const char *d = strstr(k.buf[r], "dead ");
        assert_non_null(d);
        long long t = 0;
        int rr;
        assert_int_equal(sscanf(d, "dead %d %lld", &rr, &t), 2);
        assert_true((t - kill_ns) / 1000000 < DEAD_MS);
    }
}

/* ---- a rank stopped and resumed ----------------------------------------------------------- */

/* COLLIE_SUSPECT_MS of the stop test (heartbeat: 100 ms): 15 heartbeats, so a
 * loaded machine's late heartbeat is not a silence */
#define STOP_SUSPECT_MS 1500
#define STOP_SLACK_MS   1500

/* One rank of the stop test: create, link (an allreduce, checked), say
 * "up <rank> <linked to rank 3>". Rank 3 then waits for "cont" (it is
 * stopped meanwhile) and joins the next allreduce. A survivor follows its
 * event fd and rank 3's health until "cont" (and, linked, rank 3's
 * peer_back): it says "suspected <rank> <time> <slow seen before>" and
 * "back <rank> <time>"; every check failed is an exit code. Last, one
 * more allreduce, checked, and the comm must never have faulted. */
static int stop_child(const char *addr, int rank, void *arg) {
    (void)arg;
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    int rc = kid_join(addr, rank, "fstop", &e, &st, &c);
    if (rc) return rc;
    if (!kid_allreduce(c, rank, 0)) return 13;
    collie_peer_health h[KILL_N];
    if (collie_comm_health(c, h, KILL_N) != KILL_N) return 20;
    bool linked = rank != 3 && h[3].heard_ago_ms >= 0;
    printf("up %d %d\n", rank, linked);
    fflush(stdout);
    int fd = collie_comm_event_fd(c);
    bool cont = false, suspected = false, back = false, slow = false;
    int64_t until = now_ms() + 20000;
    while (!(cont && (rank == 3 || !linked || back)) && now_ms() < until) {
        struct pollfd p[2] = {{.fd = 0, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
        poll(p, rank == 3 ? 1 : 2, 10);
        char line[16];
        if ((p[0].revents & POLLIN) && read(0, line, sizeof line) > 0) cont = true;
        if (rank == 3) continue;
        collie_comm_health(c, h, KILL_N);
        slow = slow || (!suspected && h[3].state == COLLIE_PEER_SLOW);
        collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
        while (collie_comm_event_pop(c, &ev) == COLLIE_OK) {
            if (ev.rank != 3 ||
                (ev.kind != COLLIE_EVENT_PEER_SUSPECTED && ev.kind != COLLIE_EVENT_PEER_BACK))
                return 21; /* nothing else happens */
            if (ev.kind == COLLIE_EVENT_PEER_SUSPECTED) {
                if (suspected || !linked) return 22; /* once, and only with a link */
                suspected = true;
                collie_comm_health(c, h, KILL_N);
                if (h[3].state != COLLIE_PEER_SUSPECTED || h[3].heard_ago_ms < STOP_SUSPECT_MS)
                    return 23;
                printf("suspected %d %lld %d\n", rank, (long long)ev.time_ns, slow);
            } else {
                if (!suspected || back) return 24; /* back after suspected, once */
                back = true;
                printf("back %d %lld\n", rank, (long long)ev.time_ns);
            }
            fflush(stdout);
        }
        if (collie_comm_error(c, NULL, NULL) != COLLIE_OK) return 25; /* slow is not punished */
    }
    if (!cont || (linked && !back)) return 26;
    collie_comm_health(c, h, KILL_N);
    if (rank != 3 && h[3].state != COLLIE_PEER_ALIVE) return 27;
    if (!kid_allreduce(c, rank, 1)) return 28;
    if (collie_comm_error(c, NULL, NULL) != COLLIE_OK) return 29;
    printf("done %d\n", rank);
    fflush(stdout);
    collie_comm_destroy(c);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return 0;
}

static void run_stop(const char *transport) {
    char tr[64];
    snprintf(tr, sizeof tr, "COLLIE_CPU_TRANSPORT=%s", transport);
    const char *settings[] = {tr, "COLLIE_HEARTBEAT_MS=100", "COLLIE_SUSPECT_MS=1500", NULL};
    kids k;
    kids_start(&k, KILL_N, stop_child, NULL, settings);
    int up = 0;
    for (int r = 0; r < KILL_N; r++)
        up += kids_wait(&k, r, "up ", 20000);
    /* idle twice the suspect bound first: heartbeats keep everyone alive */
    usleep(2 * STOP_SUSPECT_MS * 1000);
    int64_t stop_ns = cl_now_ns();
    kill(k.pid[3], SIGSTOP);
    bool linked[KILL_N] = {false};
    int nlinked = 0;
    for (int r = 0; r < 3; r++) {
        char want[32];
        snprintf(want, sizeof want, "up %d 1", r);
        linked[r] = strstr(k.buf[r], want) != NULL;
        nlinked += linked[r];
        if (linked[r]) kids_wait(&k, r, "suspected ", STOP_SUSPECT_MS + STOP_SLACK_MS + 2000);
    }
    usleep(200 * 1000); /* an unlinked survivor had time to misjudge too */
    int64_t cont_ns = cl_now_ns();
    kill(k.pid[3], SIGCONT);
    for (int r = 0; r < KILL_N; r++)
        kids_tell(&k, r, "cont\n");
    int codes[KILL_N];
    kids_end(&k, codes, 20000);
    assert_int_equal(up, KILL_N);
    assert_true(nlinked >= 1);
    for (int r = 0; r < KILL_N; r++) {
        if (codes[r] != 0) print_message("rank %d exited %d: %s\n", r, codes[r], k.buf[r]);
        assert_int_equal(codes[r], 0);
        assert_non_null(strstr(k.buf[r], "done "));
        if (r == 3) continue;
        const char *s = strstr(k.buf[r], "suspected ");
        if (!linked[r]) { /* no link: no basis to judge */
            assert_null(s);
            continue;
        }
        assert_non_null(s);
        long long t = 0, tb = 0;
        int rr, slow = 0;
        assert_int_equal(sscanf(s, "suspected %d %lld %d", &rr, &t, &slow), 3);
        long long ms = (t - stop_ns) / 1000000;
        print_message("rank %d: rank 3 suspected %lld ms after its stop\n", r, ms);
        /* not before it went silent (heard until the stop, give or take a
         * heartbeat), and within the bound plus slack */
        assert_true(ms >= STOP_SUSPECT_MS / 2);
        assert_true(ms < STOP_SUSPECT_MS + STOP_SLACK_MS);
        assert_int_equal(slow, 1);
        const char *b = strstr(k.buf[r], "back ");
        assert_non_null(b);
        assert_int_equal(sscanf(b, "back %d %lld", &rr, &tb), 2);
        assert_true(tb >= cont_ns);
    }
}

static void test_stopped_peer_suspected_and_back(void **state) {
    (void)state;
    run_stop("auto");
}

static void test_stopped_peer_suspected_and_back_tcp(void **state) {
    (void)state;
    run_stop("tcp");
}

static void test_killed_peer_dead_event_linked(void **state) {
    (void)state;
    run_kill(true, NULL);
}

static void test_killed_peer_dead_event_linked_tcp(void **state) {
    (void)state;
    run_kill(true, "tcp");
}

static void test_killed_peer_dead_event_no_link(void **state) {
    (void)state;
    run_kill(false, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_text_round_trip),
        cmocka_unit_test(test_abort_fault_data),
        cmocka_unit_test(test_left_is_not_dead),
        cmocka_unit_test(test_health_sequence_numbers),
        cmocka_unit_test(test_mismatch_names_both_ranks),
        cmocka_unit_test(test_notice_of_a_death_is_peer_dead),
        cmocka_unit_test(test_killed_peer_dead_event_linked),
        cmocka_unit_test(test_killed_peer_dead_event_linked_tcp),
        cmocka_unit_test(test_killed_peer_dead_event_no_link),
        cmocka_unit_test(test_stopped_peer_suspected_and_back),
        cmocka_unit_test(test_stopped_peer_suspected_and_back_tcp),
    };
    return cltest_main(tests, NULL, NULL);
}
