/*
 * test_health_edges.c — the edges of "failure as data" a review found
 * broken (each failed before its fix): the caller's struct size respected,
 * a same-host rank that closes its connections alive is not dead, a
 * comm_faulted event for every failure (creation, engine shutdown), a
 * host entry that is not its rank's claim watches nothing; and what held
 * (the queue's bound, destroy during creation).
 *
 *   fault_size:   collie_comm_fault with f->size accepted (>= offsetof ranks)
 *                 but smaller than sizeof(collie_fault): the export must not
 *                 write ranks past f->size.
 *   queue:        suspected/back storm: the queue stays bounded, `dropped`
 *                 counts, the fd is readable exactly while events are pending.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "comm/comm.h"
#include "engine/engine.h"
#include "harness.h"
#include "kids.h"
#include "runner.h"

static bool fd_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* rank 1 of w sees ranks 0 and 2 dead (on its loop) */
static void two_dead_on_loop(void *arg) {
    collie_comm *c = arg;
    cl_fault f;
    cl_fault_init(&f, COLLIE_FAULT_PEER_DEAD, COLLIE_FAULT_VIEW_LOCAL, c->rank);
    cl_fault_add(&f, 0);
    cl_fault_add(&f, 2);
    cl_comm_fault_data(c, COLLIE_EPEER, &f, false, "ranks 0 and 2 died (a test says so)");
}

/* A caller built against a collie_fault with room for one rank only: the
 * size it declares is accepted (>= offsetof(collie_fault, ranks)), so
 * nothing past it may be written. */
typedef struct small_fault {
    size_t size;
    int status, kind, view, origin, nranks;
    int ranks[1];
    int canary[8];
} small_fault;

static void test_fault_size_respected(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "bfsize", NULL);
    assert_int_equal(cl_engine_call(w.e, two_dead_on_loop, w.c[1], 5000), COLLIE_OK);
    small_fault sf;
    memset(&sf, 0, sizeof sf);
    sf.size = offsetof(small_fault, canary); /* one rank slot */
    for (int i = 0; i < 8; i++)
        sf.canary[i] = 0x5a5a5a5a;
    assert_int_equal(collie_comm_fault(w.c[1], (collie_fault *)&sf), COLLIE_OK);
    assert_int_equal(sf.nranks, 2);
    assert_int_equal(sf.ranks[0], 0);
    print_message("canary[0] after collie_comm_fault: 0x%x (was 0x5a5a5a5a)\n", sf.canary[0]);
    assert_int_equal(sf.canary[0], 0x5a5a5a5a); /* ranks[1] written past f->size */
    world_destroy(&w);
}

/* A control message "left 1" posted by rank 0 (a confused or hostile
 * writer: anyone with the store) makes rank 1 "left" on rank 2, although
 * rank 1 lives, is linked and never destroyed its comm. */

/* suspected/back repeatedly: bounded queue, dropped counted, fd exact */
/* A "left <r>" control message about a linked, live rank (anyone writing
 * the store could post it) is not believed: r's goodbye comes on its link. */
static void test_left_forged(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "bfleft", NULL);
    world_link(&w);
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_INT32, COLLIE_SUM, 16, 0, false);
    collie_peer_health h[3];
    assert_int_equal(collie_comm_health(w.c[2], h, 3), 3);
    assert_true(h[1].heard_ago_ms >= 0); /* linked */
    assert_int_equal(cl_comm_ctl_send(w.c[0], "left 1", NULL, NULL), COLLIE_OK);
    usleep(500 * 1000);
    assert_int_equal(collie_comm_health(w.c[2], h, 3), 3);
    assert_int_not_equal(h[1].state, COLLIE_PEER_LEFT);
    /* and an allreduce still works: rank 1 is not gone */
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_INT32, COLLIE_SUM, 16, 0, false);
    assert_int_equal(collie_comm_health(w.c[2], h, 3), 3);
    assert_int_not_equal(h[1].state, COLLIE_PEER_LEFT);
    world_destroy(&w);
}

static void test_queue_bounded(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "bfqueue", NULL);
    world_link(&w);
    collie_comm *c = w.c[0];
    int fd = collie_comm_event_fd(c);
    assert_false(fd_readable(fd, 0));
    for (int i = 0; i < 100000; i++) {
        cl_health_suspect(c, 1);
        cl_health_heard(c, 1, 0);
    }
    assert_true(fd_readable(fd, 0));
    int popped = 0;
    uint64_t dropped = 0;
    collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
    while (collie_comm_event_pop(c, &ev) == COLLIE_OK) {
        dropped += ev.dropped;
        popped++;
        if (collie_comm_event_pop(c, &ev) != COLLIE_OK) break;
        dropped += ev.dropped;
        popped++;
        if (popped < 20) assert_true(fd_readable(fd, 0) || popped == 24);
    }
    print_message("popped %d, dropped %llu (pushed 200000)\n", popped, (unsigned long long)dropped);
    assert_true(popped <= 2 * 8 + 16);
    assert_int_equal((uint64_t)popped + dropped, 200000);
    assert_false(fd_readable(fd, 0));
    world_destroy(&w);
}

/* ---- ranks as processes (tests/kids.h) ----------------------------------------------------- */

#define KN  2
#define BIG (64u << 20)

/* Rank 1 sends 256 MiB to rank 0 over TCP and aborts mid-stream (its
 * stream busy: rank 0 is SIGSTOPped by the test meanwhile), then lives on.
 * Rank 0, resumed after rank 1 closed, reports what it saw of rank 1. */
static int busy_child(const char *addr, int rank, void *arg) {
    int policy = *(int *)arg;
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return 10;
    if (collie_store_connect(e, addr, NULL, &st) != COLLIE_OK) return 11;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "bbusy";
    o.policy = policy;
    if (collie_comm_create(e, st, rank, KN, &o, &c) != COLLIE_OK) return 12;
    char *buf = malloc(BIG);
    if (!buf) return 13;
    memset(buf, rank + 1, BIG);
    collie_work *w;
    printf("up %d\n", rank);
    fflush(stdout);
    if (rank == 1) {
        char line[16];
        if (read(0, line, sizeof line) <= 0) return 17; /* "send": rank 0 is stopped */
        if (collie_send(c, buf, BIG, COLLIE_UINT8, 0, 7, NULL, &w) != COLLIE_OK) return 14;
        if (read(0, line, sizeof line) <= 0) return 15; /* "abort": rank 0 is stopped now */
        collie_comm_abort(c, "operator");
        collie_work_wait(w, 5000);
        printf("aborted %d\n", rank);
        fflush(stdout);
        if (read(0, line, sizeof line) <= 0) return 16; /* lives until told */
        collie_work_release(w);
        collie_comm_destroy(c);
        return 0;
    }
    if (collie_recv(c, buf, BIG, COLLIE_UINT8, 1, 7, NULL, &w) != COLLIE_OK) return 14;
    int s = collie_work_wait(w, 20000);
    usleep(300 * 1000); /* the notice, had it come */
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(c, &f);
    collie_peer_health h[KN];
    collie_comm_health(c, h, KN);
    printf("recv %s; comm fault %s origin %d nranks %d rank[0] %d; rank 1 is %s\n",
           collie_status_name(s), collie_fault_kind_name(f.kind), f.origin, f.nranks,
           f.nranks ? f.ranks[0] : -1, collie_peer_state_name(h[1].state));
    fflush(stdout);
    collie_work_release(w);
    collie_comm_destroy(c);
    return (f.kind == COLLIE_FAULT_PEER_DEAD || h[1].state == COLLIE_PEER_DEAD) ? 30 : 0;
}

static void run_busy(int policy) {
    const char *settings[] = {"COLLIE_CPU_TRANSPORT=tcp", NULL};
    kids k;
    kids_start(&k, KN, busy_child, &policy, settings);
    assert_true(kids_wait(&k, 0, "up ", 20000));
    assert_true(kids_wait(&k, 1, "up ", 20000));
    usleep(300 * 1000); /* rank 0's receive is posted */
    kill(k.pid[0], SIGSTOP);
    assert_int_equal(write(k.in[1], "send\n", 5), 5);
    usleep(300 * 1000); /* rank 1's socket is full: mid-frame */
    assert_int_equal(write(k.in[1], "abort\n", 6), 6);
    assert_true(kids_wait(&k, 1, "aborted ", 10000));
    usleep(1500 * 1000); /* rank 1 closed (0.5 s at most after its notice) */
    kill(k.pid[0], SIGCONT);
    kids_wait(&k, 0, "rank 1 is", 20000);
    assert_int_equal(write(k.in[1], "end\n", 4), 4);
    int codes[KN];
    kids_end(&k, codes, 20000);
    print_message("rank 0: %s", k.buf[0]);
    assert_int_equal(codes[1], 0);
    assert_int_equal(codes[0], 0); /* 30: a live same-host rank reported dead */
}

static void test_busy_abort_is_not_death(void **state) {
    (void)state;
    run_busy(COLLIE_POLICY_ABORT_COMM);
}

static void test_busy_abort_is_not_death_blocking(void **state) {
    (void)state;
    run_busy(COLLIE_POLICY_BLOCKING_WAIT);
}

/* create_post waiting for a rank that never comes; destroy_post at once
 * (no cancel): the destroy is bounded, but how long does it take? And
 * create_post + cancel + destroy_post. */
static void destroy_cb(collie_work *w, void *arg) {
    (void)w;
    *(int64_t *)arg = now_ms();
}

static void run_create_then_destroy(bool cancel) {
    collie_engine *e;
    collie_store_server *srv;
    collie_store *st;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = cancel ? "bcd1" : "bcd0";
    o.create_timeout_ms = 20000;
    o.timeout_ms = 30000;
    collie_comm *c;
    collie_work *cw, *dw;
    assert_int_equal(collie_comm_create_post(e, st, 0, 2, &o, &c, &cw), COLLIE_OK);
    usleep(100 * 1000);
    if (cancel) collie_work_cancel(cw);
    int64_t done = 0, t0 = now_ms();
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = destroy_cb;
    po.cb_arg = &done;
    assert_int_equal(collie_comm_destroy_post(c, &po, &dw), COLLIE_OK);
    int r = collie_work_wait(dw, 40000);
    int cr = collie_work_wait(cw, 1000);
    print_message("cancel=%d: destroy %s after %lld ms; create work %s\n", cancel,
                  collie_status_name(r), (long long)(now_ms() - t0), collie_status_name(cr));
    assert_true(now_ms() - t0 < 3000); /* a destroy of a comm still creating: prompt */
    collie_work_release(dw);
    collie_work_release(cw);
    collie_store_destroy(st);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

static void test_destroy_while_creating(void **state) {
    (void)state;
    run_create_then_destroy(false);
}

static void test_destroy_after_cancelled_create(void **state) {
    (void)state;
    run_create_then_destroy(true);
}

/* A comm that fails without a comm_faulted event: its creation timed out,
 * or its engine shut down. The fd stays unreadable although
 * collie_comm_fault says the comm failed (an event loop watching the fd
 * is never told). */
static void test_comm_faulted_event_on_every_failure(void **state) {
    (void)state;
    collie_engine *e, *e2;
    collie_store_server *srv;
    collie_store *st, *st2;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_engine_create(NULL, &e2), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
    assert_int_equal(collie_store_connect(e2, addr, NULL, &st2), COLLIE_OK);
    /* (a) creation times out */
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "bcf";
    o.create_timeout_ms = 300;
    collie_comm *c;
    collie_work *cw;
    assert_int_equal(collie_comm_create_post(e, st, 0, 2, &o, &c, &cw), COLLIE_OK);
    int fd = collie_comm_event_fd(c);
    assert_true(fd >= 0);
    int r = collie_work_wait(cw, 5000);
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(c, &f);
    bool ev_a = fd_readable(fd, 500);
    print_message("(a) create %s; comm fault status %s kind %s; fd readable: %d\n",
                  collie_status_name(r), collie_status_name(f.status),
                  collie_fault_kind_name(f.kind), ev_a);
    collie_work_release(cw);
    collie_comm_destroy(c);
    /* (b) the engine shuts down under a ready comm */
    collie_comm *d[2];
    collie_work *dw[2];
    o.name = "bcf2";
    o.create_timeout_ms = 5000;
    assert_int_equal(collie_comm_create_post(e, st, 0, 2, &o, &d[0], &dw[0]), COLLIE_OK);
    assert_int_equal(collie_comm_create_post(e2, st2, 1, 2, &o, &d[1], &dw[1]), COLLIE_OK);
    assert_int_equal(collie_work_wait(dw[0], 5000), COLLIE_OK);
    assert_int_equal(collie_work_wait(dw[1], 5000), COLLIE_OK);
    collie_work_release(dw[0]);
    collie_work_release(dw[1]);
    int fd2 = collie_comm_event_fd(d[1]);
    collie_store_destroy(st2);
    assert_int_equal(collie_engine_destroy(e2), COLLIE_OK);
    collie_comm_fault(d[1], &f);
    bool ev_b = fd_readable(fd2, 500);
    print_message("(b) after engine destroy: comm fault status %s kind %s; fd readable: %d\n",
                  collie_status_name(f.status), collie_fault_kind_name(f.kind), ev_b);
    collie_comm_destroy(d[1]);
    collie_comm_destroy(d[0]);
    collie_store_destroy(st);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
    assert_true(ev_a);
    assert_true(ev_b);
}

/* A process on the host writes "<prefix>host/<host>" first with a wrong
 * pid for rank 1 (a confused or hostile writer: anyone with the store).
 * The first entry of a rank wins, so rank 1 is watched through a process
 * that is not it: when that process exits, the healthy rank 1 is "dead"
 * and the comm faults peer_dead {1}. */
static void test_host_key_forged(void **state) {
    (void)state;
    collie_engine *e;
    collie_store_server *srv;
    collie_store *st;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    assert_int_equal(collie_store_connect(e, addr, NULL, &st), COLLIE_OK);
    pid_t kid = fork();
    if (kid == 0) {
        usleep(1500 * 1000);
        _exit(0);
    }
    char boot[64] = "", key[256], val[96];
    FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "r");
    assert_non_null(fp);
    assert_non_null(fgets(boot, sizeof boot, fp));
    fclose(fp);
    boot[strcspn(boot, "\n")] = '\0';
    struct stat sb;
    assert_int_equal(stat("/proc/self/ns/pid", &sb), 0);
    snprintf(key, sizeof key, "collie/bhost/0/host/%s.%llu", boot, (unsigned long long)sb.st_ino);
    int n = snprintf(val, sizeof val, "1:%d:%llu ", (int)kid, cl_pid_start_time(kid));
    assert_int_equal(collie_store_append(st, key, val, (size_t)n, 2000), COLLIE_OK);
    collie_store *sts[3];
    collie_comm *cs[3];
    collie_work *cws[3];
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "bhost";
    for (int r = 0; r < 3; r++) {
        assert_int_equal(collie_store_connect(e, addr, NULL, &sts[r]), COLLIE_OK);
        assert_int_equal(collie_comm_create_post(e, sts[r], r, 3, &o, &cs[r], &cws[r]), COLLIE_OK);
    }
    for (int r = 0; r < 3; r++) {
        assert_int_equal(collie_work_wait(cws[r], 10000), COLLIE_OK);
        collie_work_release(cws[r]);
    }
    usleep(2500 * 1000); /* the other process exited */
    int stw;
    waitpid(kid, &stw, 0);
    collie_peer_health h[3];
    collie_comm_health(cs[0], h, 3);
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(cs[0], &f);
    print_message("rank 0 sees the healthy rank 1 %s; comm fault %s nranks %d ranks[0] %d\n",
                  collie_peer_state_name(h[1].state), collie_fault_kind_name(f.kind), f.nranks,
                  f.nranks ? f.ranks[0] : -1);
    bool dead = h[1].state == COLLIE_PEER_DEAD, faulted = f.status != COLLIE_OK;
    for (int r = 0; r < 3; r++) {
        collie_comm_destroy(cs[r]);
        collie_store_destroy(sts[r]);
    }
    assert_false(dead);
    assert_false(faulted);
    collie_store_destroy(st);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_size_respected),
        cmocka_unit_test(test_left_forged),
        cmocka_unit_test(test_queue_bounded),
        cmocka_unit_test(test_host_key_forged),
        cmocka_unit_test(test_comm_faulted_event_on_every_failure),
        cmocka_unit_test(test_destroy_while_creating),
        cmocka_unit_test(test_destroy_after_cancelled_create),
        cmocka_unit_test(test_busy_abort_is_not_death),
        cmocka_unit_test(test_busy_abort_is_not_death_blocking),
    };
    return cltest_main(tests, NULL, NULL);
}
