/*
 * test_examples.c — the examples an embedder copies, run as a user runs
 * them (under collie-run) and checked from the outside: the event-loop
 * server answers HTTP while its collectives run, exports its stats in
 * Prometheus' format and survives a killed peer under either error policy;
 * the groups example and the C++ example finish with their results checked;
 * the elastic server answers every request through a rank's loss (shrink)
 * and takes its replacement back (grow).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/common.h"
#include "harness.h"
#include "runner.h"
#include "spawn.h"

#define ARGS(...)       ((const char *const[]){__VA_ARGS__, NULL})
#define JOB_TIMEOUT_MS  60000
#define HTTP_TIMEOUT_MS 3000

static spawn_proc *run_example(const char *const *args) {
    return spawn_start("collie-run", args, NULL, JOB_TIMEOUT_MS);
}

/* GET path from 127.0.0.1:port (HTTP/1.0: the server closes after the
 * reply); the whole response, or "" on failure. Bounded. */
static const char *http_get(int port, const char *path) {
    static char resp[1 << 17];
    resp[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return resp;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, req, (size_t)n) != n) {
        close(fd);
        return resp;
    }
    size_t len = 0;
    int64_t until = cl_now_ns() + HTTP_TIMEOUT_MS * CL_NS_PER_MS;
    for (;;) {
        int64_t left_ms = (until - cl_now_ns()) / CL_NS_PER_MS;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left_ms <= 0 || poll(&p, 1, (int)left_ms) <= 0) break;
        ssize_t k = read(fd, resp + len, sizeof resp - 1 - len);
        if (k <= 0) break;
        len += (size_t)k;
    }
    resp[len] = '\0';
    close(fd);
    return resp;
}

/* The port and pid rank r printed ("rank R: pid P life L serving
 * http://127.0.0.1:PORT"), from the `nth` such line (0: the first). */
static void served_at(spawn_proc *l, int r, int nth, int *port, int *pid) {
    char needle[80];
    snprintf(needle, sizeof needle, "[%d] rank %d: pid ", r, r);
    assert_spawn(l, spawn_wait_for(l, 0, needle, nth + 1, 20000));
    const char *p = l->text[0];
    for (int i = 0; i <= nth; i++)
        p = strstr(p, needle) + (i < nth ? 1 : 0);
    int life;
    assert_spawn(l, sscanf(p + strlen(needle), "%d life %d serving http://127.0.0.1:%d", pid, &life,
                           port) == 3);
    assert_spawn(l, life == nth);
}

/* The server keeps answering while its steps run; /metrics carries the
 * comm's and the engine's counters, and the allreduce latency histogram
 * once steps completed. */
static void test_epoll_server_serves_and_exports(void **state) {
    (void)state;
    spawn_proc *l = run_example(ARGS("-n", "2", "--", spawn_build_path("examples/epoll_server"),
                                     "--steps", "150", "--interval-ms", "10"));
    int port, pid;
    served_at(l, 0, 0, &port, &pid);
    assert_spawn(l, spawn_wait_for(l, 0, "[0] rank 0: generation 0: 25 steps ok", 1, 20000));
    const char *m = http_get(port, "/metrics");
    if (!strstr(m, "HTTP/1.0 200") && !strstr(m, "HTTP/1.1 200")) fail_msg("/metrics: %s", m);
    assert_non_null(strstr(m, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(m, "# TYPE collie_comm_works_posted_total counter"));
    assert_non_null(strstr(m, "collie_comm_works_completed_total{comm=\"srv\",rank=\"0\"} "));
    assert_non_null(strstr(m, "collie_comm_generation{comm=\"srv\",rank=\"0\"} 0"));
    assert_non_null(strstr(m, "collie_comm_connections{comm=\"srv\",rank=\"0\"} 1"));
    assert_non_null(strstr(m, "# TYPE collie_comm_latency_seconds histogram"));
    const char *inf = "collie_comm_latency_seconds_bucket{comm=\"srv\",rank=\"0\",op=\"allreduce\","
                      "le=\"+Inf\"} ";
    const char *b = strstr(m, inf);
    assert_non_null(b);
    long long count = atoll(b + strlen(inf));
    assert_true(count >= 25); /* every completed step is in the histogram */
    assert_non_null(strstr(m, "collie_engine_works_posted_total{"));
    const char *h = http_get(port, "/healthz");
    assert_non_null(strstr(h, "rank 0 ok generation 0 steps "));
    assert_non_null(strstr(h, "\npeers 0:self 1:alive\n"));
    assert_non_null(strstr(http_get(port, "/nope"), "404"));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_spawn(l, strstr(l->text[0], "[0] rank 0: done: 150 steps in generation 0, 0 "
                                       "re-creations, 3 HTTP requests"));
    assert_spawn(l, strstr(l->text[0], "[1] rank 1: done: 150 steps in generation 0"));
}

/* SIGKILL rank 1 mid-run: rank 0's step fails, it re-creates the comm
 * (generation 1) and keeps serving HTTP meanwhile; collie-run restarts rank
 * 1, which joins; both finish their steps in generation 1. Either way the
 * work that failed names the dead rank. */
static void killed_peer(const char *policy) {
    spawn_proc *l = run_example(ARGS("-n", "2", "--restarts", "1", "--",
                                     spawn_build_path("examples/epoll_server"), "--policy", policy,
                                     "--steps", "100", "--interval-ms", "10"));
    int port0, pid0, port1, pid1;
    served_at(l, 0, 0, &port0, &pid0);
    served_at(l, 1, 0, &port1, &pid1);
    assert_spawn(l, spawn_wait_for(l, 0, "[1] rank 1: generation 0: 25 steps ok", 1, 20000));
    assert_int_equal(kill(pid1, SIGKILL), 0);
    assert_spawn(l, spawn_wait_for(l, 0, "[0] rank 0: re-creating the comm\n", 1, 20000));
    /* rank 0 answers while the new generation waits for rank 1's new life */
    assert_non_null(strstr(http_get(port0, "/healthz"), "rank 0 "));
    served_at(l, 1, 1, &port1, &pid1); /* the restarted rank 1, life 1 */
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    const char *fail = strstr(l->text[0], "[0] rank 0: step ");
    assert_spawn(l, fail && strstr(fail, "failed: ") && strstr(fail, "rank 1"));
    /* as data: the event on its fd, and the fault's kind and ranks */
    assert_spawn(l, strstr(l->text[0], "[0] rank 0: event peer_dead rank 1\n"));
    assert_spawn(l, fail && strstr(fail, ", fault peer_dead ranks [1]\n"));
    assert_spawn(l, strstr(l->text[0], "[0] rank 0: done: 100 steps in generation 1, 1 "
                                       "re-creations"));
    assert_spawn(l, strstr(l->text[0], "[1] rank 1: done: 100 steps in generation 1, 0 "
                                       "re-creations"));
}

static void test_epoll_server_killed_peer_abort_comm(void **state) {
    (void)state;
    killed_peer("abort");
}

static void test_epoll_server_killed_peer_blocking_wait(void **state) {
    (void)state;
    killed_peer("blocking");
}

/* The elastic server: rank 3 kills itself after request 50; the others
 * shrink and answer on, collie-run restarts rank 3, which joins while they
 * grow; every request is answered (the allreduce's sum checked by rank 0
 * for the size of the comm it ran on), none lost. */
static void test_elastic_server_shrinks_and_grows(void **state) {
    (void)state;
    spawn_proc *l = run_example(
        ARGS("-n", "4", "--restarts", "1", "--", spawn_build_path("examples/elastic_server")));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    const char *t = l->text[0];
    assert_spawn(l, strstr(t, "[3] rank 3: killing myself after request 50"));
    for (int r = 0; r < 3; r++) {
        char want[80];
        snprintf(want, sizeof want, "[%d] rank %d: shrunk to rank %d of 3", r, r, r);
        assert_spawn(l, strstr(t, want));
        snprintf(want, sizeof want, "[%d] rank %d: grown to 4 ranks", r, r);
        assert_spawn(l, strstr(t, want));
    }
    assert_spawn(l, strstr(t, "[3] rank 3: joined as rank 3 of 4"));
    assert_spawn(l, strstr(t, "[0] served: 200 requests: 200 answered, 0 refused, 0 lost; 1 "
                              "shrinks, 1 grows"));
}

static void test_groups_example(void **state) {
    (void)state;
    spawn_proc *l = run_example(ARGS("-n", "4", "--", spawn_build_path("examples/groups")));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    for (int r = 0; r < 4; r++) {
        char want[80];
        snprintf(want, sizeof want, "[%d] rank %d: groups ok\n", r, r);
        assert_spawn(l, strstr(l->text[0], want));
    }
    assert_spawn(l, strstr(l->text[0], "[3] rank 3: received 3 activations from rank 1"));
    assert_spawn(l, strstr(l->text[0], "[1] rank 1: not a leader (COLLIE_ENOTMEMBER"));
    assert_spawn(l, strstr(l->text[0], "[2] rank 2: leaders group of 2: max ok"));
}

static void test_cxx_example(void **state) {
    (void)state;
    spawn_proc *l = run_example(ARGS("-n", "3", "--", spawn_build_path("examples/cxx/raii")));
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_spawn(l, spawn_count(l->text[0], "raii ok\n") == 3);
    assert_spawn(l, strstr(l->text[0], "[0] rank 0: send/recv with rank 1 ok"));
    assert_spawn(l, strstr(l->text[0], "[2] rank 2: stats: 4 posted, 4 completed, 0 failed"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_epoll_server_serves_and_exports, spawn_teardown),
        cmocka_unit_test_teardown(test_epoll_server_killed_peer_abort_comm, spawn_teardown),
        cmocka_unit_test_teardown(test_epoll_server_killed_peer_blocking_wait, spawn_teardown),
        cmocka_unit_test_teardown(test_groups_example, spawn_teardown),
        cmocka_unit_test_teardown(test_elastic_server_shrinks_and_grows, spawn_teardown),
        cmocka_unit_test_teardown(test_cxx_example, spawn_teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
