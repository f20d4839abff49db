/*
 * test_work.c — the work-handle contract: exactly-once completion under
 * races, deadlines in order, waits and their bounds, callbacks, cancel,
 * references, options validation.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common.h"
#include "engine/engine.h"
#include "harness.h"
#include "runner.h"

static int setup_engine(void **state) {
    collie_engine *e;
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return -1;
    *state = e;
    return 0;
}

static int teardown_engine(void **state) {
    collie_engine *e = *state;
    return collie_engine_destroy(e) == COLLIE_OK ? 0 : -1;
}

/* ---- basic completion ---------------------------------------------------------- */

static void test_complete_ok_and_accessors(void **state) {
    collie_engine *e = *state;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.tag = 77;
    manual_work *m;
    assert_int_equal(manual_post(e, &o, true, COLLIE_OK, NULL, &m), COLLIE_OK);
    collie_work *w = &m->base;
    assert_int_equal(collie_work_wait(w, 5000), COLLIE_OK);
    assert_true(collie_work_test(w));
    assert_int_equal(collie_work_result(w), COLLIE_OK);
    assert_string_equal(collie_work_error_message(w), "");
    assert_int_equal(collie_work_tag(w), 77);
    assert_true(collie_work_seq(w) > 0);
    engine_sync(e); /* retired */
    collie_work_details d;
    assert_int_equal(collie_work_info(w, &d), COLLIE_OK);
    assert_string_equal(d.op, "test.manual");
    assert_int_equal(d.status, COLLIE_OK);
    assert_true(d.post_ns > 0 && d.start_ns >= d.post_ns && d.end_ns >= d.start_ns);
    assert_int_equal(d.timeout_ms, 60000);
    assert_int_equal(atomic_load(&m->started), 1);
    assert_int_equal(atomic_load(&m->detached), 1);
    assert_int_equal(collie_work_info(NULL, &d), COLLIE_EINVAL);
    collie_work_release(w);
}

static void test_error_message_names_op_and_seq(void **state) {
    collie_engine *e = *state;
    manual_work *m;
    assert_int_equal(manual_post(e, NULL, true, COLLIE_EPROTO, NULL, &m), COLLIE_OK);
    assert_int_equal(collie_work_wait(&m->base, 5000), COLLIE_EPROTO);
    char want[64];
    snprintf(want, sizeof want, "test.manual seq %llu: auto failure",
             (unsigned long long)m->base.seq);
    assert_string_equal(collie_work_error_message(&m->base), want);
    collie_work_release(&m->base);
}

static void test_bad_post_options_rejected(void **state) {
    collie_engine *e = *state;
    manual_work *m = (manual_work *)0x1;
    collie_post_opts o = {0}; /* size not set */
    assert_int_equal(manual_post(e, &o, true, 0, NULL, &m), COLLIE_EINVAL);
    assert_null(m);
    assert_non_null(strstr(collie_last_error(), "COLLIE_POST_OPTS_INIT"));
    collie_post_opts o2 = COLLIE_POST_OPTS_INIT;
    o2.timeout_ms = -7;
    assert_int_equal(manual_post(e, &o2, true, 0, NULL, &m), COLLIE_EINVAL);
    assert_non_null(strstr(collie_last_error(), "-7"));
    assert_int_equal(engine_tracked(e), 0);
}

/* ---- deadlines ------------------------------------------------------------------ */

static int order_log[64];
static _Atomic int order_n;
static void order_cb(collie_work *w, void *arg) {
    (void)arg;
    int i = atomic_fetch_add(&order_n, 1);
    if (i < 64) order_log[i] = (int)collie_work_tag(w);
}

static void test_deadlines_fire_in_order(void **state) {
    collie_engine *e = *state;
    int timeouts[] = {300, 100, 250, 50, 200};
    manual_work *m[5];
    atomic_store(&order_n, 0);
    int64_t t0 = now_ms();
    for (int i = 0; i < 5; i++) {
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.timeout_ms = timeouts[i];
        o.cb = order_cb;
        o.tag = (uint64_t)timeouts[i];
        assert_int_equal(manual_post(e, &o, false, 0, NULL, &m[i]), COLLIE_OK);
    }
    /* wait without expiring anything ourselves: the order under test is the
     * engine's (a waiter that expires a work itself would race the sweep
     * whenever the loop is descheduled on a busy machine) */
    for (int i = 0; i < 5; i++) {
        assert_true(cl_work_wait_until(&m[i]->base, cl_now_ns() + 5000 * CL_NS_PER_MS));
        assert_int_equal(collie_work_result(&m[i]->base), COLLIE_ETIMEDOUT);
        assert_non_null(strstr(collie_work_error_message(&m[i]->base), "deadline of"));
    }
    int64_t took = now_ms() - t0;
    assert_true(took >= 300 && took < 3000);
    engine_sync(e);
    assert_int_equal(atomic_load(&order_n), 5);
    int want[] = {50, 100, 200, 250, 300};
    for (int i = 0; i < 5; i++)
        assert_int_equal(order_log[i], want[i]);
    for (int i = 0; i < 5; i++)
        collie_work_release(&m[i]->base);
}

/* More distinct timeouts than the registry has queues of their own (the
 * last queue is shared), posted out of order, two works each: every work
 * still ends by its own deadline, in deadline order. */
static void test_deadlines_many_timeouts_in_order(void **state) {
    collie_engine *e = *state;
    enum { KINDS = 24, N = 2 * KINDS };
    manual_work *m[N];
    atomic_store(&order_n, 0);
    for (int i = 0; i < N; i++) {
        int k = (i * 7) % KINDS; /* 0, 7, 14, 21, 4, ...: every kind, scrambled */
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.timeout_ms = 40 + 25 * k;
        o.cb = order_cb;
        o.tag = (uint64_t)o.timeout_ms;
        assert_int_equal(manual_post(e, &o, false, 0, NULL, &m[i]), COLLIE_OK);
    }
    for (int i = 0; i < N; i++) {
        assert_true(cl_work_wait_until(&m[i]->base, cl_now_ns() + 10000 * CL_NS_PER_MS));
        assert_int_equal(collie_work_result(&m[i]->base), COLLIE_ETIMEDOUT);
        collie_work_details d;
        collie_work_info(&m[i]->base, &d);
        assert_true(d.end_ns >= d.deadline_ns); /* never early */
    }
    engine_sync(e);
    assert_int_equal(atomic_load(&order_n), N);
    for (int i = 1; i < N; i++)
        assert_true(order_log[i - 1] <= order_log[i]);
    for (int i = 0; i < N; i++)
        collie_work_release(&m[i]->base);
}

/* ---- bounded slices ------------------------------------------------------------- */

static _Atomic long slice_done;
static void slice_cb(collie_work *w, void *arg) {
    (void)w, (void)arg;
    atomic_fetch_add(&slice_done, 1);
}

static _Atomic bool slice_release;
static void slice_block_cmd(cl_cmd *c) { /* holds the loop while the posts queue up */
    (void)c;
    for (int i = 0; i < 10000 && !atomic_load(&slice_release); i++)
        usleep(1000);
}

static void wait_count(_Atomic long *n, long want) {
    for (int i = 0; i < 30000 && atomic_load(n) < want; i++)
        usleep(1000);
    assert_int_equal(atomic_load(n), want);
}

/* A deep queue never holds the loop for long: 20k posts queued behind a
 * busy loop, then 20k deadlines passing at once, are run (started,
 * retired; expired, retired) in slices with the sockets polled between —
 * the loop probe sees no batch of more than a few slices. (Before: all
 * 20k in one pass, and a loop that spins on ready sockets never came back
 * to its command queue.) */
static void test_deep_queue_runs_in_slices(void **state) {
    collie_engine *e = *state;
    enum { N = 20000 };
    manual_work **m = calloc(N, sizeof *m);
    assert_non_null(m);
    atomic_store(&slice_done, 0);
    loop_probe *p = loop_probe_start(e, &slice_done);
    /* commands: the loop is busy while N posts queue up */
    static cl_cmd block = {.fn = slice_block_cmd};
    atomic_store(&slice_release, false);
    assert_int_equal(cl_engine_post_cmd(e, &block), COLLIE_OK);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = slice_cb;
    for (int i = 0; i < N; i++)
        assert_int_equal(manual_post(e, &o, true, COLLIE_OK, NULL, &m[i]), COLLIE_OK);
    atomic_store(&slice_release, true);
    wait_count(&slice_done, N);
    long cmd_batch = loop_probe_stop(p, NULL, 0);
    for (int i = 0; i < N; i++)
        collie_work_release(&m[i]->base);
    /* deadlines: N works expire together */
    atomic_store(&slice_done, 0);
    o.timeout_ms = 300;
    for (int i = 0; i < N; i++)
        assert_int_equal(manual_post(e, &o, false, 0, NULL, &m[i]), COLLIE_OK);
    engine_sync(e); /* all started and waiting for their deadline */
    p = loop_probe_start(e, &slice_done);
    wait_count(&slice_done, N);
    long expiry_batch = loop_probe_stop(p, NULL, 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(collie_work_result(&m[i]->base), COLLIE_ETIMEDOUT);
        collie_work_release(&m[i]->base);
    }
    free(m);
    print_message("largest batch between two polls: %ld posts, %ld expiries (of %d)\n", cmd_batch,
                  expiry_batch, N);
    assert_true(cmd_batch <= 4 * CL_LOOP_SLICE);
    assert_true(expiry_batch <= 4 * CL_LOOP_SLICE);
}

static void test_infinite_timeout_never_expires(void **state) {
    collie_engine *e = *state;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = COLLIE_TIMEOUT_INFINITE;
    manual_work *m;
    assert_int_equal(manual_post(e, &o, false, 0, NULL, &m), COLLIE_OK);
    assert_int_equal(collie_work_wait(&m->base, 150), COLLIE_INPROGRESS);
    assert_false(collie_work_test(&m->base));
    assert_true(cl_work_finish(&m->base, COLLIE_OK, NULL));
    assert_int_equal(collie_work_wait(&m->base, 5000), COLLIE_OK);
    collie_work_release(&m->base);
}

/* ---- waits --------------------------------------------------------------------- */

static void test_wait_gives_up_with_inprogress(void **state) {
    collie_engine *e = *state;
    manual_work *m;
    assert_int_equal(manual_post(e, NULL, false, 0, NULL, &m), COLLIE_OK);
    int64_t t0 = now_ms();
    assert_int_equal(collie_work_wait(&m->base, 0), COLLIE_INPROGRESS);
    assert_int_equal(collie_work_wait(&m->base, 100), COLLIE_INPROGRESS);
    int64_t took = now_ms() - t0;
    assert_true(took >= 100 && took < 2000);
    assert_int_equal(collie_work_result(&m->base), COLLIE_INPROGRESS);
    assert_int_equal(collie_work_wait(&m->base, -9), COLLIE_EINVAL);
    assert_int_equal(collie_work_cancel(&m->base), COLLIE_OK);
    assert_int_equal(collie_work_wait(&m->base, 5000), COLLIE_ECANCELED);
    assert_int_equal(collie_work_cancel(&m->base), COLLIE_ESTATE); /* already done */
    assert_int_equal(collie_work_result(&m->base), COLLIE_ECANCELED);
    collie_work_release(&m->base);
}

typedef struct delayed_finish {
    collie_work *w;
    int delay_ms;
} delayed_finish;

static void *finish_later(void *arg) {
    delayed_finish *d = arg;
    usleep((useconds_t)d->delay_ms * 1000);
    cl_work_finish(d->w, COLLIE_OK, NULL);
    return NULL;
}

static void test_wait_any_returns_first_done(void **state) {
    collie_engine *e = *state;
    manual_work *m[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(manual_post(e, NULL, false, 0, NULL, &m[i]), 0);
    collie_work *ws[4] = {&m[0]->base, NULL, &m[1]->base, &m[2]->base};
    size_t idx = 99;
    assert_int_equal(collie_work_wait_any(ws, 4, 50, &idx), COLLIE_INPROGRESS);
    assert_int_equal(idx, 4);
    delayed_finish d = {&m[2]->base, 50};
    pthread_t th;
    pthread_create(&th, NULL, finish_later, &d);
    assert_int_equal(collie_work_wait_any(ws, 4, 5000, &idx), COLLIE_OK);
    assert_int_equal(idx, 3);
    pthread_join(th, NULL);
    collie_work *none[2] = {NULL, NULL};
    assert_int_equal(collie_work_wait_any(none, 2, 10, &idx), COLLIE_EINVAL);
    assert_int_equal(collie_work_wait_any(ws, 0, 10, &idx), COLLIE_EINVAL);
    for (int i = 0; i < 2; i++)
        collie_work_cancel(&m[i]->base);
    for (int i = 0; i < 3; i++)
        collie_work_release(&m[i]->base);
}

static void test_wait_any_many_works(void **state) {
    collie_engine *e = *state;
    enum { N = 40 }; /* more than the waiter's on-stack link array */
    manual_work *m[N];
    collie_work *ws[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(manual_post(e, NULL, false, 0, NULL, &m[i]), 0);
        ws[i] = &m[i]->base;
    }
    delayed_finish d = {&m[N - 1]->base, 30};
    pthread_t th;
    pthread_create(&th, NULL, finish_later, &d);
    size_t idx;
    assert_int_equal(collie_work_wait_any(ws, N, 5000, &idx), COLLIE_OK);
    assert_int_equal(idx, N - 1);
    pthread_join(th, NULL);
    for (int i = 0; i < N; i++) {
        collie_work_cancel(ws[i]);
        collie_work_release(ws[i]);
    }
}

/* A waiter is bounded by the work's deadline even when the loop is stuck. */
static void block_loop(void *arg) { usleep((useconds_t)(intptr_t)arg * 1000); }

static void *stall_engine(void *arg) {
    cl_engine_call(arg, block_loop, (void *)(intptr_t)1500, 10000);
    return NULL;
}

static void test_waiter_bounded_by_deadline_when_loop_blocked(void **state) {
    collie_engine *e = *state;
    manual_work *m;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 200;
    assert_int_equal(manual_post(e, &o, false, 0, NULL, &m), COLLIE_OK);
    engine_sync(e); /* started */
    pthread_t th;
    pthread_create(&th, NULL, stall_engine, e);
    usleep(20 * 1000); /* the loop is now blocked for 1.5 s */
    int64_t t0 = now_ms();
    assert_int_equal(collie_work_wait(&m->base, COLLIE_TIMEOUT_INFINITE), COLLIE_ETIMEDOUT);
    int64_t took = now_ms() - t0;
    assert_true(took < 1000); /* by the 200 ms deadline, not the loop's 1.5 s */
    assert_int_equal(atomic_load(&m->detached), 0); /* retire waits for the loop */
    pthread_join(th, NULL);
    engine_sync(e);
    assert_int_equal(atomic_load(&m->detached), 1);
    collie_work_release(&m->base);
}

/* ---- callbacks ------------------------------------------------------------------ */

static _Atomic int wait_in_cb_rc = 1;
static void wait_inside_cb(collie_work *w, void *arg) {
    collie_work *other = arg;
    (void)w;
    atomic_store(&wait_in_cb_rc, collie_work_wait(other, 1000));
}

static void test_wait_on_progress_thread_is_refused(void **state) {
    collie_engine *e = *state;
    manual_work *pending, *m;
    assert_int_equal(manual_post(e, NULL, false, 0, NULL, &pending), COLLIE_OK);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = wait_inside_cb;
    o.cb_arg = &pending->base;
    int64_t t0 = now_ms();
    assert_int_equal(manual_post(e, &o, true, COLLIE_OK, NULL, &m), COLLIE_OK);
    assert_int_equal(collie_work_wait(&m->base, 5000), COLLIE_OK);
    engine_sync(e);
    assert_int_equal(atomic_load(&wait_in_cb_rc), COLLIE_ESTATE);
    assert_true(now_ms() - t0 < 900); /* refused at once, not after the 1 s wait */
    collie_work_cancel(&pending->base);
    collie_work_release(&pending->base);
    collie_work_release(&m->base);
}

static _Atomic int self_release_calls;
static void release_self_cb(collie_work *w, void *arg) {
    (void)arg;
    atomic_fetch_add(&self_release_calls, 1);
    collie_work_release(w); /* the poster's reference, dropped inside the callback */
}

static void test_callback_may_release_its_work(void **state) {
    collie_engine *e = *state;
    _Atomic int freed = 0;
    atomic_store(&self_release_calls, 0);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = release_self_cb;
    for (int i = 0; i < 100; i++) {
        manual_work *m;
        assert_int_equal(manual_post(e, &o, (i % 2) == 0, COLLIE_OK, &freed, &m), COLLIE_OK);
        if (i % 2) cl_work_finish(&m->base, COLLIE_ECANCELED, "from the test thread");
    }
    engine_sync(e);
    engine_sync(e);
    assert_int_equal(atomic_load(&self_release_calls), 100);
    assert_int_equal(atomic_load(&freed), 100);
}

/* ---- exactly one finisher wins -------------------------------------------------- */

typedef struct race_arg {
    collie_work *w;
    pthread_barrier_t *go;
    int status;
    bool won;
} race_arg;

static void *race_finish(void *p) {
    race_arg *a = p;
    pthread_barrier_wait(a->go);
    if (a->status == COLLIE_ECANCELED)
        a->won = collie_work_cancel(a->w) == COLLIE_OK;
    else
        a->won = cl_work_finish(a->w, a->status, "racer");
    return NULL;
}

static _Atomic int race_cb_calls;
static void race_cb(collie_work *w, void *arg) {
    (void)w;
    (void)arg;
    atomic_fetch_add(&race_cb_calls, 1);
}

static void test_finish_cancel_deadline_race_exactly_one_wins(void **state) {
    collie_engine *e = *state;
    int rounds = getenv("CLTEST_QUICK") ? 200 : 1000;
    atomic_store(&race_cb_calls, 0);
    int wins_by[3] = {0, 0, 0}, deadline_wins = 0;
    for (int r = 0; r < rounds; r++) {
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.timeout_ms = 1 + (r % 3); /* the deadline sweep races too */
        o.cb = race_cb;
        manual_work *m;
        assert_int_equal(manual_post(e, &o, false, 0, NULL, &m), COLLIE_OK);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 3);
        race_arg a[3] = {{&m->base, &go, COLLIE_OK, false},
                         {&m->base, &go, COLLIE_ECANCELED, false},
                         {&m->base, &go, COLLIE_EPEER, false}};
        pthread_t th[3];
        if (r % 2) usleep(1000 + (r % 3) * 500);
        for (int i = 0; i < 2; i++)
            pthread_create(&th[i], NULL, race_finish, &a[i]);
        race_finish(&a[2]);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&go);
        int wins = a[0].won + a[1].won + a[2].won;
        int result = collie_work_wait(&m->base, 5000);
        assert_true(wins <= 1);
        if (wins == 0) {
            assert_int_equal(result, COLLIE_ETIMEDOUT);
            deadline_wins++;
        } else {
            for (int i = 0; i < 3; i++)
                if (a[i].won) {
                    assert_int_equal(result, a[i].status);
                    wins_by[i]++;
                }
        }
        assert_int_equal(collie_work_result(&m->base), result); /* never changes */
        collie_work_release(&m->base);
    }
    engine_sync(e);
    assert_int_equal(atomic_load(&race_cb_calls), rounds); /* one callback per work */
    assert_int_equal(engine_tracked(e), 0);
    print_message("race winners: finish %d, cancel %d, peer %d, deadline %d\n", wins_by[0],
                  wins_by[1], wins_by[2], deadline_wins);
}

/* ---- BUSY sections keep foreign finishers out ------------------------------------ */

typedef struct busy_arg {
    collie_work *w;
    bool entered;
    _Atomic bool cancel_returned;
} busy_arg;

static void busy_section(void *p) {
    busy_arg *b = p;
    b->entered = cl_work_busy_enter(b->w);
    usleep(150 * 1000); /* "copying into the user's buffer" */
    bool early = atomic_load(&b->cancel_returned) || cl_work_done(b->w);
    cl_work_busy_exit(b->w);
    if (early) b->entered = false; /* report the violation */
}

static void *busy_runner(void *p) {
    busy_arg *b = p;
    cl_engine_call(b->w->engine, busy_section, b, 5000);
    return NULL;
}

static void test_busy_section_defers_foreign_finish(void **state) {
    collie_engine *e = *state;
    manual_work *m;
    assert_int_equal(manual_post(e, NULL, false, 0, NULL, &m), COLLIE_OK);
    engine_sync(e); /* ACTIVE */
    busy_arg b = {.w = &m->base};
    pthread_t th;
    pthread_create(&th, NULL, busy_runner, &b);
    usleep(30 * 1000);
    assert_int_equal(collie_work_cancel(&m->base), COLLIE_OK); /* waits for busy_exit */
    atomic_store(&b.cancel_returned, true);
    pthread_join(th, NULL);
    assert_true(b.entered);
    assert_int_equal(collie_work_result(&m->base), COLLIE_ECANCELED);
    assert_false(cl_work_busy_enter(&m->base)); /* done: buffers are off limits */
    collie_work_release(&m->base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_complete_ok_and_accessors),
        cmocka_unit_test(test_error_message_names_op_and_seq),
        cmocka_unit_test(test_bad_post_options_rejected),
        cmocka_unit_test(test_deadlines_fire_in_order),
        cmocka_unit_test(test_deadlines_many_timeouts_in_order),
        cmocka_unit_test(test_deep_queue_runs_in_slices),
        cmocka_unit_test(test_infinite_timeout_never_expires),
        cmocka_unit_test(test_wait_gives_up_with_inprogress),
        cmocka_unit_test(test_wait_any_returns_first_done),
        cmocka_unit_test(test_wait_any_many_works),
        cmocka_unit_test(test_waiter_bounded_by_deadline_when_loop_blocked),
        cmocka_unit_test(test_wait_on_progress_thread_is_refused),
        cmocka_unit_test(test_callback_may_release_its_work),
        cmocka_unit_test(test_finish_cancel_deadline_race_exactly_one_wins),
        cmocka_unit_test(test_busy_section_defers_foreign_finish),
    };
    return cltest_main(tests, setup_engine, teardown_engine);
}
