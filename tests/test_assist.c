/*
 * test_assist.c — caller-driven progress (engine/assist.c): threads that
 * post, test and wait run the loop's step themselves, and still never run
 * user code; every work ends once, with the right result; helpers and a
 * comm's destruction, a stuck progress thread and the stall monitor.
 * Ranks live in this process (one engine). Also in the TSan suite.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_fixture.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "harness.h"
#include "runner.h"

static bool quick(void) { return getenv("CLTEST_QUICK") != NULL; }

/* Every completion callback: counts its work's completions and notes one
 * that ran anywhere but on the progress thread. */
typedef struct cb_slot {
    collie_engine *e;
    _Atomic int calls;
} cb_slot;

static _Atomic int cb_off_thread;

static void count_cb(collie_work *w, void *arg) {
    (void)w;
    cb_slot *s = arg;
    if (!collie_engine_on_progress_thread(s->e)) atomic_fetch_add(&cb_off_thread, 1);
    atomic_fetch_add(&s->calls, 1);
}

static uint64_t helper_steps(collie_engine *e) {
    collie_engine_stats st = COLLIE_ENGINE_STATS_INIT;
    assert_int_equal(collie_engine_get_stats(e, &st), COLLIE_OK);
    return st.helper_steps;
}

/* Wait until every slot's callback ran (they run at retirement, on the
 * progress thread, after the waiters saw the works done). Bounded. */
static void await_callbacks(cb_slot *slots, int n, int want) {
    int64_t give_up = now_ms() + 10000;
    for (int i = 0; i < n; i++)
        while (atomic_load(&slots[i].calls) < want && now_ms() < give_up) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    for (int i = 0; i < n; i++)
        assert_int_equal(atomic_load(&slots[i].calls), want);
}

/* Waiting threads do the work (helper steps are counted), the results are
 * right, and every callback runs exactly once, on the progress thread. */
static void test_waiters_help_callbacks_stay_on_loop(void **state) {
    (void)state;
    if (!cl_spin_enabled())
        skip_because("the loop never spins here (COLLIE_SPIN or more ranks than cores): "
                     "no thread helps it");
    enum { N = 2, COUNT = 5 };
    int iters = quick() ? 300 : 3000;
    world w;
    world_create(&w, N, "assist-cb", NULL);
    cb_slot slots[N];
    for (int r = 0; r < N; r++) {
        slots[r].e = w.e;
        atomic_init(&slots[r].calls, 0);
    }
    atomic_store(&cb_off_thread, 0);
    uint64_t steps_before = helper_steps(w.e);
    for (int it = 0; it < iters; it++) {
        int32_t buf[N][COUNT];
        collie_work *wk[N];
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < COUNT; i++)
                buf[r][i] = r * 100 + i + it;
            collie_post_opts o = COLLIE_POST_OPTS_INIT;
            o.cb = count_cb;
            o.cb_arg = &slots[r];
            o.timeout_ms = 20000;
            assert_int_equal(collie_allreduce(w.c[r], buf[r], buf[r], COUNT, COLLIE_INT32,
                                              COLLIE_SUM, &o, &wk[r]),
                             COLLIE_OK);
        }
        for (int r = 0; r < N; r++) {
            assert_int_equal(collie_work_wait(wk[r], 20000), COLLIE_OK);
            collie_work_release(wk[r]);
            for (int i = 0; i < COUNT; i++)
                assert_int_equal(buf[r][i], 100 + 2 * (i + it));
        }
    }
    await_callbacks(slots, N, iters);
    assert_int_equal(atomic_load(&cb_off_thread), 0);
    uint64_t steps = helper_steps(w.e) - steps_before;
    print_message("%d allreduces on 2 ranks: %llu loop steps run by the waiting thread\n", iters,
                  (unsigned long long)steps);
    assert_true(steps > 0);
    world_destroy(&w);
}

/* One thread per rank, each keeping works in flight and polling them with
 * collie_work_test (as an application's own event loop would): the two
 * helpers and the progress thread contend for the loop's role. Every work
 * ends once with the right result. */
typedef struct rank_driver {
    world *w;
    int rank, iters, errors;
    cb_slot slot;
} rank_driver;

static void *rank_driver_main(void *arg) {
    rank_driver *d = arg;
    enum { DEPTH = 8, COUNT = 16 };
    for (int it = 0; it < d->iters; it++) {
        int32_t buf[DEPTH][COUNT];
        collie_work *wk[DEPTH];
        for (int k = 0; k < DEPTH; k++) {
            for (int i = 0; i < COUNT; i++)
                buf[k][i] = d->rank + k + i + it;
            collie_post_opts o = COLLIE_POST_OPTS_INIT;
            o.cb = count_cb;
            o.cb_arg = &d->slot;
            o.timeout_ms = 20000;
            if (collie_allreduce(d->w->c[d->rank], buf[k], buf[k], COUNT, COLLIE_INT32, COLLIE_SUM,
                                 &o, &wk[k]) != COLLIE_OK) {
                d->errors++;
                wk[k] = NULL;
            }
        }
        int64_t give_up = now_ms() + 20000;
        for (int k = 0; k < DEPTH; k++) {
            if (!wk[k]) continue;
            while (!collie_work_test(wk[k]) && now_ms() < give_up)
                ; /* test drives progress itself */
            if (collie_work_result(wk[k]) != COLLIE_OK) d->errors++;
            collie_work_release(wk[k]);
            for (int i = 0; i < COUNT; i++)
                if (buf[k][i] != 1 + 2 * (k + i + it)) d->errors++;
        }
    }
    return NULL;
}

static void test_testing_threads_end_every_work_once(void **state) {
    (void)state;
    enum { N = 2 };
    world w;
    world_create(&w, N, "assist-test", NULL);
    atomic_store(&cb_off_thread, 0);
    rank_driver d[N];
    pthread_t th[N];
    for (int r = 0; r < N; r++) {
        d[r] = (rank_driver){.w = &w, .rank = r, .iters = quick() ? 100 : 600};
        d[r].slot.e = w.e;
        atomic_init(&d[r].slot.calls, 0);
        assert_int_equal(pthread_create(&th[r], NULL, rank_driver_main, &d[r]), 0);
    }
    for (int r = 0; r < N; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(d[r].errors, 0);
    }
    await_callbacks(&d[0].slot, 1, d[0].iters * 8);
    await_callbacks(&d[1].slot, 1, d[1].iters * 8);
    assert_int_equal(atomic_load(&cb_off_thread), 0);
    world_destroy(&w);
}

/* The comm's abort and destruction while other threads poll its works:
 * the works end (the abort fails what is pending), the pollers leave, nothing is touched
 * after it is freed (ASan/TSan). */
typedef struct poller_arg {
    collie_work *w;
    int rc;
} poller_arg;

static void *poll_until_done(void *arg) {
    poller_arg *p = arg;
    int64_t give_up = now_ms() + 20000;
    while (!collie_work_test(p->w) && now_ms() < give_up)
        ;
    p->rc = collie_work_result(p->w);
    return NULL;
}

static void test_destroy_while_threads_poll(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "assist-destroy", NULL);
    /* two receives nobody sends to, plus a completed allreduce to make the
     * loop spin (and so let the pollers help) */
    int32_t x[2] = {1, 2};
    collie_work *ar[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(
            collie_allreduce(w.c[r], &x[r], &x[r], 1, COLLIE_INT32, COLLIE_SUM, NULL, &ar[r]),
            COLLIE_OK);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_work_wait(ar[r], 20000), COLLIE_OK);
        collie_work_release(ar[r]);
    }
    int32_t sink[2];
    poller_arg pa[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_recv(w.c[r], &sink[r], 1, COLLIE_INT32, 1 - r, 77, NULL, &pa[r].w),
                         COLLIE_OK);
        assert_int_equal(pthread_create(&th[r], NULL, poll_until_done, &pa[r]), 0);
    }
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_comm_abort(w.c[r], "test: destroyed while polled"), COLLIE_OK);
        int rc = collie_comm_destroy(w.c[r]);
        assert_true(rc == COLLIE_OK || rc == COLLIE_EABORTED);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(pa[r].rc, COLLIE_EABORTED); /* ended by the abort, not left pending */
        collie_work_release(pa[r].w);
        collie_store_destroy(w.st[r]);
    }
    collie_store_server_destroy(w.srv);
    assert_int_equal(collie_engine_destroy(w.e), COLLIE_OK);
}

/* A progress thread stuck in a user callback keeps the loop's role: a
 * waiting thread cannot take it (so nothing runs behind the callback's
 * back), the stall monitor still reports it, and the wait still ends once
 * the callback returns. */
static _Atomic int stalls_seen;

static void on_stall(collie_engine *e, int64_t ms, const char *what, void *arg) {
    (void)e, (void)ms, (void)what, (void)arg;
    atomic_fetch_add(&stalls_seen, 1);
}

static void sleepy_cb(collie_work *w, void *arg) {
    (void)w, (void)arg;
    struct timespec ts = {0, 600 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static void test_stuck_loop_is_not_hidden_by_helpers(void **state) {
    (void)state;
    collie_engine_opts eo = COLLIE_ENGINE_OPTS_INIT;
    eo.stall_ms = 100;
    eo.on_stall = on_stall;
    collie_engine *e;
    assert_int_equal(collie_engine_create(&eo, &e), COLLIE_OK);
    atomic_store(&stalls_seen, 0);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = sleepy_cb;
    manual_work *stuck, *next;
    assert_int_equal(manual_post(e, &o, true, COLLIE_OK, NULL, &stuck), COLLIE_OK);
    /* the callback now holds the loop for 600 ms */
    while (!collie_work_test(&stuck->base))
        ;
    uint64_t steps_before = helper_steps(e);
    assert_int_equal(manual_post(e, NULL, true, COLLIE_OK, NULL, &next), COLLIE_OK);
    int64_t t0 = now_ms();
    assert_int_equal(collie_work_wait(&next->base, 5000), COLLIE_OK);
    int64_t waited = now_ms() - t0;
    assert_true(atomic_load(&stalls_seen) >= 1);
    assert_int_equal(helper_steps(e), steps_before); /* it never had the loop's role */
    print_message("waited %lld ms behind a 600 ms callback; %d stall reports\n", (long long)waited,
                  atomic_load(&stalls_seen));
    collie_work_release(&stuck->base);
    collie_work_release(&next->base);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waiters_help_callbacks_stay_on_loop),
        cmocka_unit_test(test_testing_threads_end_every_work_once),
        cmocka_unit_test(test_destroy_while_threads_poll),
        cmocka_unit_test(test_stuck_loop_is_not_hidden_by_helpers),
    };
    return cltest_main(tests, NULL, NULL);
}
