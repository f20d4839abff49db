/*
 * test_backend.c — backends (docs/design.md §5): spec parsing through comm
 * creation, collie_backend_register's checks, an in-process registered
 * backend, and plugins found through COLLIE_PLUGIN_PATH: the example
 * "dummy" backend (examples/dummy_backend) and the broken ones of
 * tests/plugins.
 *
 * Design notes
 *  - Every test runs in a process of its own (tests/runner.h), so a plugin
 *    test sets COLLIE_PLUGIN_PATH and calls cl_config_reload() (settings
 *    are parsed once per process) and starts from a clean registry (a
 *    plugin, once loaded, stays registered). The plugin checks use CHECK,
 *    which records a message and returns, so the test fails with it after
 *    the check's function returns; every wait is bounded.
 *  - Registered backends live for the life of the process, so each test
 *    uses names no other test uses.
 */
#include <limits.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "harness.h"
#include "runner.h"
#include "spawn.h"
#include "transports/reduce.h"
#include "transports/cpu/cpu.h"

#define WAIT_MS 10000

/* ---- spec parsing through comm creation ------------------------------------- */

static void expect_spec_error(collie_engine *e, collie_store *st, const char *spec, int code,
                              const char *needle1, const char *needle2) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "spec";
    o.backend = spec;
    collie_comm *c = (collie_comm *)0x1;
    collie_work *w = (collie_work *)0x1;
    int rc = collie_comm_create_post(e, st, 0, 1, &o, &c, &w);
    if (rc != code)
        fail_msg("spec '%s': got %s, want %s (%s)", spec, collie_status_name(rc),
                 collie_status_name(code), collie_last_error());
    assert_null(c);
    assert_null(w);
    const char *msg = collie_last_error();
    if ((needle1 && !strstr(msg, needle1)) || (needle2 && !strstr(msg, needle2)))
        fail_msg("spec '%s': message '%s' lacks '%s' / '%s'", spec, msg, needle1,
                 needle2 ? needle2 : "");
}

static void test_spec_errors(void **state) {
    (void)state;
    collie_engine *e;
    collie_store *st;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    /* the connection is made lazily: a rejected create never uses it */
    assert_int_equal(collie_store_connect(e, "127.0.0.1:1", NULL, &st), COLLIE_OK);
    expect_spec_error(e, st, "", COLLIE_EINVAL, "empty", NULL);
    expect_spec_error(e, st, "cpu:tcp,cpu:tcp", COLLIE_EINVAL, "device cpu given twice", NULL);
    expect_spec_error(e, st, "tcp,CPU:TCP", COLLIE_EINVAL, "device cpu given twice", NULL);
    expect_spec_error(e, st, "bogus", COLLIE_EINVAL, "unknown backend 'bogus'",
                      "COLLIE_PLUGIN_PATH");
    expect_spec_error(e, st, "bogus", COLLIE_EINVAL,
                      "not built in, not registered, and no plugin libcollie_bogus.so", NULL);
    expect_spec_error(e, st, "cpu:bogus", COLLIE_EINVAL, "unknown backend 'bogus'", NULL);
    expect_spec_error(e, st, "gpu:tcp", COLLIE_EINVAL, "unknown device 'gpu'", "cpu or cuda");
    expect_spec_error(e, st, "cuda:tcp", COLLIE_EINVAL,
                      "backend 'tcp' serves cpu buffers, not cuda", NULL);
    expect_spec_error(e, st, "cpu:", COLLIE_EINVAL, "missing backend name", NULL);
    expect_spec_error(e, st, "tcp,,cuda:tcp", COLLIE_EINVAL, "empty or overlong item", NULL);
    expect_spec_error(e, st, ",", COLLIE_EINVAL, "empty or overlong item", NULL);
    collie_store_destroy(st);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

static void world_with_backend(const char *name, const char *spec, int n) {
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    o.backend = spec;
    o.timeout_ms = 30000;
    world_create(&w, n, name, &o);
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_FP32, COLLIE_SUM, 7, 0, false);
    run_and_check(&w, COLLIE_COLL_BARRIER, COLLIE_FP32, COLLIE_SUM, 0, 0, false);
    world_destroy(&w);
}

static void test_spec_names_case_insensitive(void **state) {
    (void)state;
    world_with_backend("spec-TCP", "TCP", 2);
    world_with_backend("spec-tcp", "tcp", 2);
    world_with_backend("spec-cpu-tcp", "cpu:tcp", 2);
    world_with_backend("spec-CPU-Tcp", "CPU:Tcp", 2);
}

/* ---- collie_backend_register ---------------------------------------------------- */

static void expect_register(const collie_backend_ops *ops, int code, const char *needle1,
                            const char *needle2) {
    int rc = collie_backend_register(ops);
    if (rc != code)
        fail_msg("register '%s': got %s, want %s (%s)", ops && ops->name ? ops->name : "(null)",
                 collie_status_name(rc), collie_status_name(code), collie_last_error());
    const char *msg = collie_last_error();
    if ((needle1 && !strstr(msg, needle1)) || (needle2 && !strstr(msg, needle2)))
        fail_msg("register: message '%s' lacks '%s' / '%s'", msg, needle1, needle2 ? needle2 : "");
}

static void test_register_rejects(void **state) {
    (void)state;
    const collie_backend_ops *tcp = cl_tcp_backend_ops();
    collie_backend_ops o;
    expect_register(NULL, COLLIE_EINVAL, "NULL", NULL);
    o = *tcp;
    o.name = "rej-abi";
    o.abi_version = COLLIE_BACKEND_ABI_VERSION + 1;
    expect_register(&o, COLLIE_ENOTSUP, "ABI version 4", "speaks version 3");
    o.abi_version = 2; /* an ABI-2 table handed to register (not through a plugin) */
    expect_register(&o, COLLIE_ENOTSUP, "ABI version 2", "speaks version 3");
    o = *tcp;
    o.name = "rej-hook";
    o.detach = NULL;
    expect_register(&o, COLLIE_EINVAL, "'rej-hook' lacks a hook", NULL);
    o.detach = tcp->detach;
    o.init = NULL;
    expect_register(&o, COLLIE_EINVAL, "lacks a hook", NULL);
    const char *bad_names[] = {
        "my tcp", "a/b", "x.y", "tcp:1", "", NULL, "a-name-that-is-longer-than-32-chars"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        o = *tcp;
        o.name = bad_names[i];
        expect_register(&o, COLLIE_EINVAL, "name", NULL);
    }
    o = *tcp;
    o.name = "rej-device";
    o.device = "gpu";
    expect_register(&o, COLLIE_EINVAL, "device must be cpu or cuda", NULL);
    o.device = NULL;
    expect_register(&o, COLLIE_EINVAL, "device must be cpu or cuda", NULL);
    o = *tcp;
    o.name = "TCP"; /* names are case-insensitive: the built-in tcp holds it */
    expect_register(&o, COLLIE_EEXIST, "'TCP' is already registered", NULL);
    /* none of the rejected ones was registered */
    cl_backend_spec spec;
    assert_int_equal(cl_backend_parse_spec("rej-abi", &spec), COLLIE_EINVAL);
    assert_int_equal(cl_backend_parse_spec("rej-hook", &spec), COLLIE_EINVAL);
    assert_int_equal(cl_backend_parse_spec("rej-device", &spec), COLLIE_EINVAL);
}

/* The services table (ABI 3): it says its version and size, a backend
 * built with this header finds it usable, and a table of another version
 * or cut short before its last ABI-3 service is refused by the check. */
static void test_services_table(void **state) {
    (void)state;
    const collie_core_services *core = &cl_core_services;
    assert_int_equal(core->abi_version, 3);
    assert_int_equal(core->size, sizeof(collie_core_services));
    assert_true(COLLIE_CORE_USABLE(core));
    assert_true(COLLIE_CORE_HAS(core, setting));
    collie_core_services other = *core;
    other.abi_version = 2;
    assert_false(COLLIE_CORE_USABLE(&other));
    other = *core;
    other.size = (uint32_t)offsetof(collie_core_services, setting);
    assert_false(COLLIE_CORE_USABLE(&other));
    assert_false(COLLIE_CORE_HAS(&other, setting));
    assert_false(COLLIE_CORE_USABLE((const collie_core_services *)NULL));
    /* the work, dtype and log services are the public functions' twins */
    assert_int_equal(core->dtype_size(COLLIE_FP64), 8);
    assert_string_equal(core->dtype_name(COLLIE_BF16), collie_dtype_name(COLLIE_BF16));
    assert_string_equal(core->redop_name(COLLIE_MAX), "max");
    assert_true(core->log_enabled(0));
}

/* The loop's events through the services table: an fd watch fires on
 * readiness and on watch_activate, stops when stopped; a timer (fd -1)
 * fires every timeout until stopped; a bad watch_new is refused. */
typedef struct watch_probe {
    collie_bcomm *bc;
    int pfd[2];
    collie_watch *rd, *timer;
    _Atomic int reads, writes, timeouts;
    bool bad_refused;
} watch_probe;

static void probe_cb(int fd, unsigned events, void *arg) {
    watch_probe *p = arg;
    if (events & COLLIE_WATCH_READ) {
        char b[16];
        ssize_t n = read(fd, b, sizeof b);
        (void)n;
        atomic_fetch_add(&p->reads, 1);
    }
    if (events & COLLIE_WATCH_WRITE) atomic_fetch_add(&p->writes, 1);
    if (events & COLLIE_WATCH_TIMEOUT) atomic_fetch_add(&p->timeouts, 1);
}

static void probe_setup(void *arg) {
    watch_probe *p = arg;
    const collie_core_services *core = &cl_core_services;
    p->bad_refused = core->watch_new(p->bc, -1, COLLIE_WATCH_READ, probe_cb, p) == NULL &&
                     core->watch_new(p->bc, p->pfd[0], 0, probe_cb, p) == NULL &&
                     core->watch_new(p->bc, p->pfd[0], COLLIE_WATCH_READ, NULL, p) == NULL;
    p->rd = core->watch_new(p->bc, p->pfd[0], COLLIE_WATCH_READ, probe_cb, p);
    p->timer = core->watch_new(p->bc, -1, 0, probe_cb, p);
    if (p->rd) core->watch_start(p->rd, -1);
    if (p->timer) core->watch_start(p->timer, 2000);
}

static void probe_activate(void *arg) {
    watch_probe *p = arg;
    cl_core_services.watch_activate(p->rd, COLLIE_WATCH_WRITE);
}

static void probe_stop(void *arg) {
    watch_probe *p = arg;
    cl_core_services.watch_stop(p->rd);
    cl_core_services.watch_stop(p->timer);
}

static void probe_free(void *arg) {
    watch_probe *p = arg;
    cl_core_services.watch_free(p->rd);
    cl_core_services.watch_free(p->timer);
}

static bool wait_count(_Atomic int *v, int want) {
    for (int64_t until = now_ms() + 5000; now_ms() < until;) {
        if (atomic_load(v) >= want) return true;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

static void test_watch_services(void **state) {
    (void)state;
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    world_create(&w, 1, "watch", &o);
    static watch_probe p;
    memset(&p, 0, sizeof p);
    p.bc = &w.c[0]->bcs[CL_DEV_CPU];
    assert_int_equal(pipe(p.pfd), 0);
    collie_engine *e = w.e;
    assert_int_equal(cl_engine_call(e, probe_setup, &p, 5000), COLLIE_OK);
    assert_true(p.bad_refused);
    assert_non_null(p.rd);
    assert_non_null(p.timer);
    assert_true(wait_count(&p.timeouts, 3)); /* every 2 ms, until stopped */
    assert_int_equal(atomic_load(&p.reads), 0);
    assert_int_equal(write(p.pfd[1], "x", 1), 1);
    assert_true(wait_count(&p.reads, 1));
    assert_int_equal(cl_engine_call(e, probe_activate, &p, 5000), COLLIE_OK);
    assert_true(wait_count(&p.writes, 1));
    assert_int_equal(cl_engine_call(e, probe_stop, &p, 5000), COLLIE_OK);
    int reads = atomic_load(&p.reads), timeouts = atomic_load(&p.timeouts);
    assert_int_equal(write(p.pfd[1], "y", 1), 1);
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&p.reads), reads); /* stopped: neither fires */
    assert_int_equal(atomic_load(&p.timeouts), timeouts);
    assert_int_equal(cl_engine_call(e, probe_free, &p, 5000), COLLIE_OK);
    close(p.pfd[0]);
    close(p.pfd[1]);
    world_destroy(&w);
}

/* An in-process backend: the TCP transport under another name, counting
 * the calls it gets, and asking to be polled every 200 us. */
static _Atomic int counting_inits, counting_starts, counting_polls;

static int counting_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    atomic_fetch_add(&counting_inits, 1);
    core->want_poll(bc, true, 200);
    return cl_tcp_backend_ops()->init(bc, core, state);
}

static void counting_poll(void *state) {
    (void)state;
    atomic_fetch_add(&counting_polls, 1);
}

static int counting_start(void *state, collie_work *w, const collie_coll_args *a) {
    atomic_fetch_add(&counting_starts, 1);
    return cl_tcp_backend_ops()->start(state, w, a);
}

static void test_register_in_process_backend(void **state) {
    (void)state;
    static collie_backend_ops counting;
    counting = *cl_tcp_backend_ops();
    counting.name = "Counting";
    counting.init = counting_init;
    counting.start = counting_start;
    counting.poll = counting_poll;
    assert_int_equal(collie_backend_register(&counting), COLLIE_OK);
    expect_register(&counting, COLLIE_EEXIST, "already registered", NULL);
    static collie_backend_ops upper;
    upper = counting;
    upper.name = "COUNTING";
    expect_register(&upper, COLLIE_EEXIST, "'COUNTING' is already registered", NULL);

    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "counting";
    o.backend = "cpu:counting";
    o.timeout_ms = 30000;
    world_create(&w, 2, "counting", &o);
    assert_int_equal(atomic_load(&counting_inits), 2);
    /* the poll runs on a timerfd (a libevent timer would fire every few ms
     * once the loop sleeps), and it runs */
    assert_true(w.c[0]->bcs[CL_DEV_CPU].poll_fd >= 0);
    int64_t until = now_ms() + 5000;
    while (atomic_load(&counting_polls) < 10 && now_ms() < until) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(&counting_polls) >= 10);
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_FP32, COLLIE_SUM, 7, 0, false);
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_INT32, COLLIE_MAX, 4099, 0, true);
    world_destroy(&w);
    assert_int_equal(atomic_load(&counting_starts), 4);
}

/* The unlend hook never overlaps the backend's destroy: a backend whose
 * unlend takes 300 ms (against the rules, to widen the window), run by a
 * thread that cancels a work, while another thread destroys the engine
 * (which destroys the comm's backends on the loop at once). destroy waits
 * for the unlend in progress; an unlend that comes later is not called. */
static _Atomic int su_in_unlend, su_destroyed_during, su_unlends;
static void *_Atomic su_unlending; /* the state whose unlend runs */

static void su_unlend(void *state, collie_work *w) {
    atomic_store(&su_unlending, state);
    atomic_store(&su_in_unlend, 1);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    if (!atomic_load(&su_destroyed_during)) cl_tcp_backend_ops()->unlend(state, w);
    atomic_fetch_add(&su_unlends, 1);
    atomic_store(&su_in_unlend, 0);
    atomic_store(&su_unlending, NULL);
}

static void su_destroy(void *state) {
    if (atomic_load(&su_unlending) == state) atomic_store(&su_destroyed_during, 1);
    cl_tcp_backend_ops()->destroy(state);
}

static void *su_cancel_main(void *arg) {
    collie_work_cancel(arg);
    return NULL;
}

static void test_unlend_never_overlaps_destroy(void **state) {
    (void)state;
    static collie_backend_ops slow;
    slow = *cl_tcp_backend_ops();
    slow.name = "slowunlend";
    slow.unlend = su_unlend;
    slow.destroy = su_destroy;
    assert_int_equal(collie_backend_register(&slow), COLLIE_OK);
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "slowunlend";
    o.backend = "cpu:slowunlend";
    o.timeout_ms = 30000;
    world_create(&w, 2, "slowunlend", &o);
    int32_t x = 1;
    collie_work *pending; /* rank 1 never joins */
    assert_int_equal(collie_allreduce(w.c[0], &x, &x, 1, COLLIE_INT32, COLLIE_SUM, NULL, &pending),
                     COLLIE_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, su_cancel_main, pending), 0);
    assert_true(wait_count(&su_in_unlend, 1)); /* the cancelling thread is in unlend */
    assert_int_equal(collie_engine_destroy(w.e), COLLIE_OK);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&su_destroyed_during), 0);
    assert_int_equal(atomic_load(&su_unlends), 1);
    assert_int_equal(collie_work_result(pending), COLLIE_ECANCELED);
    collie_work_release(pending);
    for (int r = 0; r < 2; r++) {
        collie_comm_destroy(w.c[r]);
        collie_store_destroy(w.st[r]);
    }
    collie_store_server_destroy(w.srv);
}

/* A table from a backend built against an older header (no cancel, split,
 * split_skip: its .size ends before them) and whatever memory follows it:
 * the core reads those hooks as NULL (it keeps a zero-filled copy), so a
 * comm and a split on it work through init. A size below the required
 * hooks is refused. */
typedef struct split_thread {
    world *w;
    int rank, rc;
    collie_comm *child;
} split_thread;

static void *older_split_main(void *p) {
    split_thread *t = p;
    t->rc = collie_comm_split(t->w->c[t->rank], 0, t->rank, NULL, &t->child);
    return NULL;
}

static void test_register_older_table(void **state) {
    (void)state;
    static union {
        collie_backend_ops ops;
        unsigned char raw[sizeof(collie_backend_ops)];
    } older;
    size_t size = offsetof(collie_backend_ops, cancel);
    memcpy(older.raw, cl_tcp_backend_ops(), size);
    memset(older.raw + size, 0xab, sizeof older.raw - size); /* not NULL: garbage */
    older.ops.size = (uint32_t)size;
    older.ops.name = "older";
    assert_int_equal(collie_backend_register(&older.ops), COLLIE_OK);

    collie_backend_ops tiny = *cl_tcp_backend_ops();
    tiny.name = "tiny";
    tiny.size = (uint32_t)offsetof(collie_backend_ops, destroy);
    expect_register(&tiny, COLLIE_EINVAL, "backend ops size", "set .size");

    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.backend = "older";
    o.timeout_ms = 30000;
    world_create(&w, 2, "older", &o);
    run_and_check(&w, COLLIE_COLL_ALLREDUCE, COLLIE_FP32, COLLIE_SUM, 7, 0, false);
    split_thread t[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        t[r] = (split_thread){.w = &w, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, older_split_main, &t[r]), 0);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(t[r].rc, COLLIE_OK);
        assert_int_equal(collie_comm_size(t[r].child), 2);
    }
    for (int r = 0; r < 2; r++)
        assert_int_equal(collie_comm_destroy(t[r].child), COLLIE_OK);
    world_destroy(&w);
}

/* ---- plugin tests ----------------------------------------------------------- */

static char child_msg[1024];
static char plugin_path[2 * PATH_MAX + 32];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            int k_ = snprintf(child_msg, sizeof child_msg, "line %d: ", __LINE__);                 \
            snprintf(child_msg + k_, sizeof child_msg - (size_t)k_, __VA_ARGS__);                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* A world of n ranks spread over `ne` engines (rank r on engine r % ne). */
typedef struct cworld {
    int n, ne;
    collie_engine *e[2];
    collie_store_server *srv;
    collie_store *st[WORLD_MAX];
    collie_comm *c[WORLD_MAX];
} cworld;

static int cw_create(cworld *w, int n, int ne, const char *name, const char *spec) {
    memset(w, 0, sizeof *w);
    w->n = n;
    w->ne = ne;
    for (int i = 0; i < ne; i++)
        CHECK(collie_engine_create(NULL, &w->e[i]) == COLLIE_OK, "engine: %s", collie_last_error());
    CHECK(collie_store_server_create(w->e[0], "127.0.0.1", 0, NULL, &w->srv) == COLLIE_OK,
          "server: %s", collie_last_error());
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(w->srv));
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    o.backend = spec;
    o.timeout_ms = WAIT_MS;
    collie_work *cw[WORLD_MAX];
    for (int r = 0; r < n; r++) {
        CHECK(collie_store_connect(w->e[r % ne], addr, NULL, &w->st[r]) == COLLIE_OK, "store");
        int rc = collie_comm_create_post(w->e[r % ne], w->st[r], r, n, &o, &w->c[r], &cw[r]);
        CHECK(rc == COLLIE_OK, "create '%s' rank %d: %s", spec, r, collie_last_error());
    }
    for (int r = 0; r < n; r++) {
        int rc = collie_work_wait(cw[r], WAIT_MS);
        CHECK(rc == COLLIE_OK, "create rank %d: %s", r, collie_work_error_message(cw[r]));
        collie_work_release(cw[r]);
    }
    return 0;
}

static void cw_destroy(cworld *w) {
    for (int r = 0; r < w->n; r++) {
        collie_comm_destroy(w->c[r]);
        collie_store_destroy(w->st[r]);
    }
    collie_store_server_destroy(w->srv);
    for (int i = 0; i < w->ne; i++)
        collie_engine_destroy(w->e[i]);
}

/* Post `nops` allreduces on every rank, wait for all, compare each with a
 * reference computed by the core's own kernels. */
static int cw_allreduce(cworld *w, collie_dtype dt, collie_redop op, size_t count, int nops,
                        bool in_place) {
    size_t es = collie_dtype_size(dt), bytes = (count * es + 16) & ~(size_t)15; /* aligned */
    int n = w->n, total = n * nops;
    uint8_t *in = calloc((size_t)total, bytes), *out = calloc((size_t)total, bytes);
    uint8_t *ref = calloc((size_t)nops, bytes);
    collie_work **wk = calloc((size_t)total, sizeof *wk);
    CHECK(in && out && ref && wk, "no memory");
    for (int k = 0; k < nops; k++)
        for (int r = 0; r < n; r++) {
            uint8_t *x = in + (size_t)(k * n + r) * bytes;
            fill_input(x, count, dt, op, r, (size_t)k);
            if (r == 0)
                memcpy(ref + (size_t)k * bytes, x, count * es);
            else
                cl_reduce(ref + (size_t)k * bytes, x, count, dt, op);
            if (in_place) memcpy(out + (size_t)(k * n + r) * bytes, x, count * es);
        }
    for (int k = 0; k < nops; k++)
        for (int r = 0; r < n; r++) {
            size_t i = (size_t)(k * n + r);
            const void *src = in_place ? out + i * bytes : in + i * bytes;
            int rc = collie_allreduce(w->c[r], src, out + i * bytes, count, dt, op, NULL, &wk[i]);
            CHECK(rc == COLLIE_OK, "post rank %d: %s", r, collie_last_error());
        }
    for (int i = 0; i < total; i++) {
        int rc = collie_work_wait(wk[i], WAIT_MS);
        CHECK(rc == COLLIE_OK, "allreduce %s %s: %s", collie_dtype_name(dt), collie_redop_name(op),
              collie_work_error_message(wk[i]));
        collie_work_release(wk[i]);
        size_t k = (size_t)i / (size_t)n;
        CHECK(memcmp(out + (size_t)i * bytes, ref + k * bytes, count * es) == 0,
              "allreduce %s %s count %zu: rank %d of op %zu differs", collie_dtype_name(dt),
              collie_redop_name(op), count, i % n, k);
    }
    free(in);
    free(out);
    free(ref);
    free(wk);
    return 0;
}

/* Post one barrier per rank (rank order or reverse) and wait for all. */
static int cw_barrier(cworld *w, bool reverse) {
    collie_work *wk[WORLD_MAX];
    for (int i = 0; i < w->n; i++) {
        int r = reverse ? w->n - 1 - i : i;
        CHECK(collie_barrier(w->c[r], NULL, &wk[r]) == COLLIE_OK, "barrier post");
    }
    for (int r = 0; r < w->n; r++) {
        int rc = collie_work_wait(wk[r], WAIT_MS);
        CHECK(rc == COLLIE_OK, "barrier rank %d: %s", r, collie_work_error_message(wk[r]));
        collie_work_release(wk[r]);
    }
    return 0;
}

/* Wait for w, expect `code` and a message holding `needle`; release it. */
static int expect_work(collie_work *w, int code, const char *needle) {
    int rc = collie_work_wait(w, WAIT_MS);
    const char *msg = collie_work_error_message(w);
    CHECK(rc == code, "got %s (%s), want %s", collie_status_name(rc), msg,
          collie_status_name(code));
    CHECK(!needle || strstr(msg, needle), "message '%s' lacks '%s'", msg, needle);
    collie_work_release(w);
    return 0;
}

static int child_dummy_world(void) {
    cworld w;
    if (cw_create(&w, 3, 1, "dummy3", "dummy")) return 1;
    static const struct {
        collie_dtype dt;
        collie_redop op;
    } cases[] = {{COLLIE_FP32, COLLIE_SUM},  {COLLIE_FP32, COLLIE_MAX},
                 {COLLIE_INT32, COLLIE_SUM}, {COLLIE_INT32, COLLIE_MAX},
                 {COLLIE_INT64, COLLIE_MIN}, {COLLIE_FP64, COLLIE_PROD}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cw_allreduce(&w, cases[i].dt, cases[i].op, 7, 1, false)) return 1;
        if (cw_allreduce(&w, cases[i].dt, cases[i].op, 1000, 1, true)) return 1;
    }
    if (cw_allreduce(&w, COLLIE_FP32, COLLIE_SUM, 0, 1, false)) return 1;
    if (cw_allreduce(&w, COLLIE_INT32, COLLIE_SUM, 3, 16, false)) return 1; /* 16 in flight */
    if (cw_barrier(&w, false) || cw_barrier(&w, true)) return 1;

    /* other kinds and types: ENOTSUP from start, a failed work, no fault */
    collie_work *wk[3];
    float buf[3][6];
    memset(buf, 0, sizeof buf);
    for (int r = 0; r < 3; r++)
        CHECK(collie_alltoall(w.c[r], buf[r], buf[r], 2, COLLIE_FP32, NULL, &wk[r]) == COLLIE_OK,
              "alltoall post");
    for (int r = 0; r < 3; r++)
        if (expect_work(wk[r], COLLIE_ENOTSUP, "backend dummy could not start it")) return 1;
    for (int r = 0; r < 3; r++)
        CHECK(collie_allreduce(w.c[r], buf[r], buf[r], 4, COLLIE_FP16, COLLIE_SUM, NULL, &wk[r]) ==
                  COLLIE_OK,
              "fp16 post");
    for (int r = 0; r < 3; r++)
        if (expect_work(wk[r], COLLIE_ENOTSUP, "not supported")) return 1;
    /* a backend without COLLIE_BACKEND_V_COLLECTIVES is never given one */
    size_t cnt[3] = {1, 1, 1};
    collie_work *none = NULL;
    CHECK(collie_allgatherv(w.c[0], buf[0], buf[0] + 3, cnt, NULL, COLLIE_FP32, NULL, &none) ==
                  COLLIE_ENOTSUP &&
              !none &&
              strstr(collie_last_error(), "backend dummy of comm 'dummy3' does not implement"),
          "allgatherv on dummy: %s", collie_last_error());
    CHECK(collie_alltoallv(w.c[0], buf[0], cnt, NULL, buf[0] + 3, cnt, NULL, COLLIE_FP32, NULL,
                           &none) == COLLIE_ENOTSUP &&
              !none,
          "alltoallv on dummy: %s", collie_last_error());
    int st;
    CHECK(collie_comm_error(w.c[0], &st, NULL) == COLLIE_OK, "comm faulted: %d", st);
    if (cw_allreduce(&w, COLLIE_FP32, COLLIE_SUM, 5, 2, false)) return 1;
    cw_destroy(&w);

    /* the loaded plugin answers to any case; one rank; a device prefix */
    if (cw_create(&w, 3, 1, "dummy3b", "DUMMY")) return 1;
    if (cw_allreduce(&w, COLLIE_INT32, COLLIE_SUM, 9, 2, false) || cw_barrier(&w, false)) return 1;
    cw_destroy(&w);
    if (cw_create(&w, 1, 1, "dummy1", "cpu:Dummy")) return 1;
    if (cw_allreduce(&w, COLLIE_FP64, COLLIE_SUM, 9, 2, true) || cw_barrier(&w, false)) return 1;
    cw_destroy(&w);
    cl_backend_spec spec;
    CHECK(cl_backend_parse_spec("cuda:dummy", &spec) == COLLIE_EINVAL &&
              strstr(collie_last_error(), "serves cpu buffers, not cuda"),
          "cuda:dummy: %s", collie_last_error());
    return 0;
}

/* Ranks on different engines: results travel through the poll hook. */
static int child_dummy_two_engines(void) {
    cworld w;
    if (cw_create(&w, 2, 2, "dummy2e", "dummy")) return 1;
    if (cw_allreduce(&w, COLLIE_FP32, COLLIE_SUM, 1000, 4, false)) return 1;
    if (cw_allreduce(&w, COLLIE_INT64, COLLIE_MAX, 7, 1, true)) return 1;
    if (cw_barrier(&w, false) || cw_barrier(&w, true)) return 1;
    cw_destroy(&w);
    return 0;
}

/* The peer learns of a fault either from the plugin ("rank N left the
 * comm", EPEER) or from the core's abort propagation through the store
 * (EABORTED naming the root cause) — whichever is first. */
static int expect_peer_fault(collie_work *w, const char *left, const char *root) {
    int rc = collie_work_wait(w, WAIT_MS);
    const char *msg = collie_work_error_message(w);
    bool ok =
        (rc == COLLIE_EPEER && strstr(msg, left)) || (rc == COLLIE_EABORTED && strstr(msg, root));
    CHECK(ok, "got %s (%s), want EPEER '%s' or EABORTED '%s'", collie_status_name(rc), msg, left,
          root);
    collie_work_release(w);
    return 0;
}

static void noop(void *arg) { (void)arg; }

static int child_dummy_faults(void) {
    cworld w;
    float a[8] = {0}, b[8] = {0};
    collie_work *w0, *w1;
    int64_t t0;

    /* a peer aborts while this rank waits for it: EPEER, promptly */
    if (cw_create(&w, 2, 1, "dfault1", "dummy")) return 1;
    CHECK(collie_allreduce(w.c[1], a, a, 8, COLLIE_FP32, COLLIE_SUM, NULL, &w1) == COLLIE_OK, "p");
    t0 = now_ms();
    collie_comm_abort(w.c[0], "test abort");
    if (expect_peer_fault(w1, "rank 0 left the comm", "test abort")) return 1;
    CHECK(now_ms() - t0 < WAIT_MS / 2, "the fault took %lld ms", (long long)(now_ms() - t0));
    CHECK(collie_barrier(w.c[0], NULL, &w0) == COLLIE_EABORTED &&
              strstr(collie_last_error(), "test abort"),
          "post after abort: %s", collie_last_error());
    cw_destroy(&w);

    /* mismatched posts: EPROTO naming both ranks, the peer learns EPEER */
    if (cw_create(&w, 2, 1, "dfault2", "dummy")) return 1;
    CHECK(collie_allreduce(w.c[0], a, a, 4, COLLIE_FP32, COLLIE_SUM, NULL, &w0) == COLLIE_OK, "p");
    CHECK(collie_allreduce(w.c[1], b, b, 8, COLLIE_FP32, COLLIE_SUM, NULL, &w1) == COLLIE_OK, "p");
    if (expect_work(w1, COLLIE_EPROTO,
                    "rank 1 posted allreduce of 8 fp32 (sum), rank 0 posted allreduce of 4"))
        return 1;
    if (expect_peer_fault(w0, "rank 1 left the comm", "mismatch")) return 1;
    cw_destroy(&w);

    /* a deadline passes (the peer never posts); its later post fails fast */
    if (cw_create(&w, 2, 1, "dfault3", "dummy")) return 1;
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 200;
    CHECK(collie_allreduce(w.c[0], a, a, 8, COLLIE_FP32, COLLIE_SUM, &po, &w0) == COLLIE_OK, "p");
    if (expect_work(w0, COLLIE_ETIMEDOUT, "deadline")) return 1;
    t0 = now_ms(); /* the fault follows the completion; let it land first */
    while (collie_comm_error(w.c[0], NULL, NULL) == COLLIE_OK && now_ms() - t0 < WAIT_MS)
        usleep(1000);
    int prc = collie_barrier(w.c[1], NULL, &w1);
    if (prc == COLLIE_OK) {
        if (expect_peer_fault(w1, "rank 0 left the comm", "deadline")) return 1;
    } else { /* the abort already reached rank 1: its post fails fast */
        CHECK(prc == COLLIE_EABORTED && strstr(collie_last_error(), "deadline"), "post: %s",
              collie_last_error());
    }
    cw_destroy(&w);

    /* the engine stops under a started work: ECLOSED, then clean destroys
     * (the core destroys the backend before the work retires, so detach
     * comes with a NULL state) */
    if (cw_create(&w, 2, 1, "dfault4", "dummy")) return 1;
    CHECK(collie_allreduce(w.c[0], a, a, 8, COLLIE_FP32, COLLIE_SUM, NULL, &w0) == COLLIE_OK, "p");
    /* a no-op call on the loop: the start queued before it has run */
    CHECK(cl_engine_call(w.e[0], noop, NULL, WAIT_MS) == COLLIE_OK, "engine call");
    CHECK(collie_engine_destroy(w.e[0]) == COLLIE_OK, "engine destroy");
    w.e[0] = NULL;
    if (expect_work(w0, COLLIE_ECLOSED, NULL)) return 1;
    cw_destroy(&w);
    return 0;
}

static int child_broken_plugins(void) {
    collie_engine *e;
    collie_store *st;
    CHECK(collie_engine_create(NULL, &e) == COLLIE_OK, "engine");
    CHECK(collie_store_connect(e, "127.0.0.1:1", NULL, &st) == COLLIE_OK, "store");
    static const struct {
        const char *spec;
        int code;
        const char *needle1, *needle2;
    } cases[] = {
        {"nosym", COLLIE_EINVAL, "plugin libcollie_nosym.so is unusable",
         "does not export collie_backend_plugin_v3"},
        {"cpu:NoSym", COLLIE_EINVAL, "tests/plugins/libcollie_nosym.so does not export", NULL},
        {"badabi", COLLIE_ENOTSUP, "backend ABI version 99", "this collie speaks version 3"},
        {"abi2", COLLIE_ENOTSUP,
         "was built for backend ABI 2 or older (it exports "
         "collie_backend_plugin_v1)",
         "this collie speaks backend ABI 3 (collie_backend_plugin_v3)"},
        {"needslib", COLLIE_EBACKEND,
         "plugin libcollie_needslib.so is unusable: "
         "libcltest_absent.so: cannot open shared object file",
         "a library the plugin needs is not installed or not on the library path"},
        {"absent", COLLIE_EINVAL, "not built in, not registered, and no plugin libcollie_absent.so",
         plugin_path},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
        o.backend = cases[i].spec;
        collie_comm *c;
        collie_work *w;
        int rc = collie_comm_create_post(e, st, 0, 1, &o, &c, &w);
        const char *msg = collie_last_error();
        CHECK(rc == cases[i].code && !c && !w, "'%s': got %s (%s)", cases[i].spec,
              collie_status_name(rc), msg);
        CHECK(strstr(msg, cases[i].needle1) && (!cases[i].needle2 || strstr(msg, cases[i].needle2)),
              "'%s': message '%s'", cases[i].spec, msg);
    }
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return 0;
}

/* Run fn with COLLIE_PLUGIN_PATH set (each test has a process of its own:
 * tests/runner.h); fail with its message. */
static void run_with_plugins(int (*fn)(void), const char *what) {
    setenv("COLLIE_PLUGIN_PATH", plugin_path, 1);
    cl_config_reload();
    child_msg[0] = '\0';
    if (fn() != 0) fail_msg("%s: %s", what, child_msg);
}

static void test_plugin_dummy(void **state) {
    (void)state;
    run_with_plugins(child_dummy_world, "dummy plugin");
}

static void test_plugin_dummy_two_engines(void **state) {
    (void)state;
    run_with_plugins(child_dummy_two_engines, "dummy plugin, two engines");
}

static void test_plugin_dummy_faults(void **state) {
    (void)state;
    run_with_plugins(child_dummy_faults, "dummy plugin faults");
}

static void test_plugin_broken(void **state) {
    (void)state;
    run_with_plugins(child_broken_plugins, "broken plugins");
}

/* The dummy plugin loads into a program linked with libcollie.a (no
 * -rdynamic) and into one linked with libcollie.so: it links no core
 * symbol (backend ABI 3). */
static void test_plugin_loads_static_and_shared(void **state) {
    (void)state;
    static const char *const hosts[][2] = {{"tests/plugin_host_static", "static"},
                                           {"tests/plugin_host_shared", "shared"}};
    char env[sizeof plugin_path + 32];
    snprintf(env, sizeof env, "COLLIE_PLUGIN_PATH=%s", plugin_path);
    const char *const env_extra[] = {env, NULL};
    for (size_t i = 0; i < 2; i++) {
        const char *const args[] = {hosts[i][1], NULL};
        spawn_proc *s = spawn_start(hosts[i][0], args, env_extra, 30000);
        spawn_finish(s);
        assert_spawn(s, s->status == 0);
        assert_spawn(s, strstr(s->text[0], "dummy plugin loaded, allreduce of 1024 fp32 correct"));
        spawn_free(s);
    }
}

/* COLLIE_PLUGIN_PATH = <build>/lib:<build>/tests/plugins, where <build> is
 * CLTEST_BUILD_DIR (set by scripts/run-tests.sh) or this binary's build dir. */
static int setup_plugin_path(void **state) {
    (void)state;
    char dir[PATH_MAX];
    const char *env = getenv("CLTEST_BUILD_DIR");
    if (env) {
        if (!realpath(env, dir)) return -1;
    } else {
        ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
        if (n <= 0) return -1;
        dir[n] = '\0';
        for (int i = 0; i < 2; i++) /* <build>/tests/test_backend */
            *strrchr(dir, '/') = '\0';
    }
    int n = snprintf(plugin_path, sizeof plugin_path, "%s/lib:%s/tests/plugins", dir, dir);
    if (n < 0 || (size_t)n >= sizeof plugin_path) return -1;
    char so[PATH_MAX + 32];
    n = snprintf(so, sizeof so, "%s/lib/libcollie_dummy.so", dir);
    if (n < 0 || (size_t)n >= sizeof so || access(so, R_OK) != 0) {
        fprintf(stderr, "test_backend: %s is missing (make plugins)\n", so);
        return -1;
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_spec_names_case_insensitive),
        cmocka_unit_test(test_register_rejects),
        cmocka_unit_test(test_services_table),
        cmocka_unit_test(test_watch_services),
        cmocka_unit_test(test_register_in_process_backend),
        cmocka_unit_test(test_register_older_table),
        cmocka_unit_test(test_unlend_never_overlaps_destroy),
        cmocka_unit_test(test_plugin_dummy),
        cmocka_unit_test(test_plugin_dummy_two_engines),
        cmocka_unit_test(test_plugin_dummy_faults),
        cmocka_unit_test(test_plugin_broken),
        cmocka_unit_test_teardown(test_plugin_loads_static_and_shared, spawn_teardown),
    };
    return cltest_main(tests, setup_plugin_path, NULL);
}
