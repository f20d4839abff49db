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
 *   killed:    4 ranks as processes (fork, one engine each), idle after one
 *              allreduce; rank 3 SIGKILLed: every survivor's fd is readable
 *              within DEAD_MS with a peer_dead event for rank 3, its health
 *              says dead, and its comm's fault is peer_dead {3} (the TCP leg:
 *              COLLIE_CPU_TRANSPORT=tcp; the same-host pidfd watch without
 *              any link: the kill before any collective).
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

/* ---- a rank killed: processes ------------------------------------------------------------ */

#define KILL_N 4

/* One rank in a forked child: create, (link), report ready on `up`, then
 * wait for its verdict on the event fd; exit code 0 when it saw rank 3
 * dead as expected, else a code naming the failed check. */
static int kill_child(const char *addr, int rank, bool link) {
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return 10;
    if (collie_store_connect(e, addr, NULL, &st) != COLLIE_OK) return 11;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "fkill";
    if (collie_comm_create(e, st, rank, KILL_N, &o, &c) != COLLIE_OK) return 12;
    if (link) {
        int32_t v = rank + 1, out = 0;
        collie_work *w;
        if (collie_allreduce(c, &v, &out, 1, COLLIE_INT32, COLLIE_SUM, NULL, &w) != COLLIE_OK ||
            collie_work_wait(w, 10000) != COLLIE_OK || out != 10)
            return 13;
        collie_work_release(w);
    }
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
    collie_engine *e;
    collie_store_server *srv;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    int pipes[KILL_N][2];
    pid_t pids[KILL_N];
    for (int r = 0; r < KILL_N; r++) {
        assert_int_equal(pipe(pipes[r]), 0);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            if (transport) setenv("COLLIE_CPU_TRANSPORT", transport, 1);
            dup2(pipes[r][1], 1);
            _exit(kill_child(addr, r, link));
        }
        close(pipes[r][1]);
    }
    char buf[KILL_N][256] = {{0}};
    size_t got[KILL_N] = {0};
    int64_t until = now_ms() + 20000;
    int up = 0;
    while (up < KILL_N && now_ms() < until) {
        up = 0;
        for (int r = 0; r < KILL_N; r++) {
            if (fd_readable(pipes[r][0], 10) && got[r] < sizeof buf[r] - 1) {
                ssize_t n = read(pipes[r][0], buf[r] + got[r], sizeof buf[r] - 1 - got[r]);
                if (n > 0) got[r] += (size_t)n;
            }
            up += strstr(buf[r], "up ") != NULL;
        }
    }
    int64_t kill_ns = cl_now_ns();
    kill(pids[3], SIGKILL);
    int codes[KILL_N];
    for (int r = 0; r < KILL_N; r++) {
        int64_t wait_until = now_ms() + 25000;
        int stw = 0;
        pid_t p = 0;
        while ((p = waitpid(pids[r], &stw, WNOHANG)) == 0 && now_ms() < wait_until)
            usleep(5000);
        if (p == 0) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &stw, 0);
        }
        codes[r] = WIFEXITED(stw) ? WEXITSTATUS(stw) : 128 + WTERMSIG(stw);
        ssize_t n;
        while (got[r] < sizeof buf[r] - 1 &&
               (n = read(pipes[r][0], buf[r] + got[r], sizeof buf[r] - 1 - got[r])) > 0)
            got[r] += (size_t)n;
        close(pipes[r][0]);
    }
    assert_int_equal(up, KILL_N);
    for (int r = 0; r < 3; r++) {
        if (codes[r] != 0) print_message("rank %d exited %d: %s\n", r, codes[r], buf[r]);
        assert_int_equal(codes[r], 0);
        const char *d = strstr(buf[r], "dead ");
        assert_non_null(d);
        long long t = 0;
        int rr;
        assert_int_equal(sscanf(d, "dead %d %lld", &rr, &t), 2);
        assert_true((t - kill_ns) / 1000000 < DEAD_MS);
    }
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
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
        cmocka_unit_test(test_killed_peer_dead_event_linked),
        cmocka_unit_test(test_killed_peer_dead_event_linked_tcp),
        cmocka_unit_test(test_killed_peer_dead_event_no_link),
    };
    return cltest_main(tests, NULL, NULL);
}
