/*
 * store_fixture.h — helpers shared by the store tests (header-only: the
 * Makefile links every helper .c file under tests/ into every test binary; these
 * are only for the store's).
 *
 * A fixture is a real engine with a real server on 127.0.0.1 (port 0) and
 * one client connected to it.
 */
#ifndef CL_TEST_STORE_FIXTURE_H
#define CL_TEST_STORE_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "collie.h"
#include "harness.h"
#include "engine/engine.h"
#include "store/server.h"

/* Every wait in the store tests is bounded by this. */
#define FX_WAIT_MS 10000

typedef struct store_fx {
    collie_engine *e;
    collie_store_server *srv;
    collie_store *st;
    char addr[64];
} store_fx;

static inline int64_t fx_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void fx_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline collie_engine *fx_engine(void) {
    collie_engine *e = NULL;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    return e;
}

static inline collie_store_server *fx_server(collie_engine *e, uint16_t port,
                                             const collie_store_server_opts *o) {
    collie_store_server *s = NULL;
    int rc = collie_store_server_create(e, "127.0.0.1", port, o, &s);
    if (rc != COLLIE_OK)
        fail_msg("server create: %s: %s", collie_status_name(rc), collie_last_error());
    return s;
}

static inline collie_store *fx_client(collie_engine *e, const char *addr, const char *token,
                                      int32_t timeout_ms) {
    collie_store_opts o = COLLIE_STORE_OPTS_INIT;
    o.token = token;
    o.timeout_ms = timeout_ms;
    o.max_backoff_ms = 50; /* tests restart servers: retry quickly */
    collie_store *st = NULL;
    int rc = collie_store_connect(e, addr, &o, &st);
    if (rc != COLLIE_OK) fail_msg("connect: %s: %s", collie_status_name(rc), collie_last_error());
    return st;
}

/* A fixture with default server options (or `so`) and a client. */
static inline void fx_start(store_fx *fx, const collie_store_server_opts *so, const char *token) {
    memset(fx, 0, sizeof *fx);
    fx->e = fx_engine();
    fx->srv = fx_server(fx->e, 0, so);
    snprintf(fx->addr, sizeof fx->addr, "127.0.0.1:%u", collie_store_server_port(fx->srv));
    fx->st = fx_client(fx->e, fx->addr, token, FX_WAIT_MS);
}

static inline void fx_stop(store_fx *fx) {
    collie_store_destroy(fx->st);
    collie_store_server_destroy(fx->srv);
    assert_int_equal(collie_engine_destroy(fx->e), COLLIE_OK);
    memset(fx, 0, sizeof *fx);
}

typedef struct fx_waits_probe {
    collie_store_server *srv;
    size_t waits;
} fx_waits_probe;

static inline void fx_probe_waits(void *arg) {
    fx_waits_probe *p = arg;
    p->waits = 0;
    store_srv_conn *c;
    cl_list_foreach(&p->srv->conns, c, store_srv_conn, link) p->waits += c->nwaits;
}

/* Waiting requests the server holds right now (read on its loop). */
static inline size_t fx_server_waits(collie_engine *e, collie_store_server *srv) {
    fx_waits_probe p = {srv, 0};
    assert_int_equal(cl_engine_call(e, fx_probe_waits, &p, FX_WAIT_MS), COLLIE_OK);
    return p.waits;
}

/* Wait (bounded) for a posted work; returns its status. */
static inline int fx_wait(collie_work *w) {
    int rc = collie_work_wait(w, FX_WAIT_MS);
    if (rc == COLLIE_INPROGRESS) fail_msg("a work did not finish within %d ms", FX_WAIT_MS);
    return rc;
}

/* Poll `cond` (a expression) every ms, bounded; true if it became true. */
#define FX_EVENTUALLY(cond)                                                                        \
    ({                                                                                             \
        int64_t fx_until_ = fx_now_ms() + FX_WAIT_MS;                                              \
        while (!(cond) && fx_now_ms() < fx_until_)                                                 \
            fx_sleep_ms(1);                                                                        \
        (bool)(cond);                                                                              \
    })

/* The path of the collie-store binary built next to this test. */
static inline void fx_store_binary(char *buf, size_t len) {
    const char *dir = getenv("CLTEST_BUILD_DIR");
    if (dir) {
        snprintf(buf, len, "%s/bin/collie-store", dir);
        if (access(buf, X_OK) == 0) return;
    }
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(buf, len, "%s/../bin/collie-store", exe);
        if (access(buf, X_OK) == 0) return;
    }
    snprintf(buf, len, "collie-store"); /* from PATH */
}

/* The process's resources before the tests: taken once a store has been
 * used (that first use initialises libcrypto and libevent globals), and
 * checked by the last test, so nothing a test started is left behind. */
static int fx_baseline_fds, fx_baseline_threads;

static inline void fx_baseline_take(void) {
    store_fx warm;
    fx_start(&warm, NULL, NULL);
    assert_int_equal(collie_store_set(warm.st, "k", "v", 1, 2000), COLLIE_OK);
    fx_stop(&warm);
    fx_baseline_fds = count_open_fds();
    fx_baseline_threads = count_threads_stable();
}

static inline void fx_baseline_check(void) {
    assert_true(FX_EVENTUALLY(count_open_fds() == fx_baseline_fds));
    assert_int_equal(count_threads_settled(fx_baseline_threads), fx_baseline_threads);
}

#endif
