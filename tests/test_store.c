/*
 * test_store.c — the key/value store end to end: a real server on
 * 127.0.0.1 and real clients on one engine. Every op and its results,
 * waits that time out or are released by another client, barriers over
 * several rounds, prefix views, concurrency, cancellation, argument
 * checking, limits, callbacks and shutdown with requests pending.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "runner.h"
#include "store_fixture.h"

#include "engine/engine.h"
#include "store/server.h"

/* ---- helpers ------------------------------------------------------------------------- */

static void assert_value(collie_work *w, const char *want) {
    const void *v = NULL;
    size_t len = 0;
    assert_int_equal(collie_store_work_value(w, &v, &len), COLLIE_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(v, want, len);
    assert_int_equal(((const char *)v)[len], '\0');
}

static void sync_get_is(collie_store *st, const char *key, const char *want) {
    void *v = NULL;
    size_t len = 0;
    int rc = collie_store_get(st, key, 2000, &v, &len);
    if (rc != COLLIE_OK) fail_msg("get %s: %s", key, collie_last_error());
    assert_int_equal(len, strlen(want));
    assert_string_equal(v, want);
    free(v);
}

/* ---- every op ------------------------------------------------------------------------------ */

static void test_sync_ops(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store *st = fx.st;
    assert_int_equal(collie_store_set(st, "a", "alpha", 5, COLLIE_TIMEOUT_DEFAULT), COLLIE_OK);
    sync_get_is(st, "a", "alpha");
    /* binary values keep their bytes */
    const char bin[4] = {0, 1, 0, 2};
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(collie_store_set(st, "bin", bin, 4, 2000), COLLIE_OK);
    assert_int_equal(collie_store_get(st, "bin", 2000, &v, &len), COLLIE_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(v, bin, 4);
    free(v);

    int64_t n = 0;
    assert_int_equal(collie_store_add(st, "ctr", 5, 2000, &n), COLLIE_OK);
    assert_int_equal(n, 5);
    assert_int_equal(collie_store_add(st, "ctr", -7, 2000, &n), COLLIE_OK);
    assert_int_equal(n, -2);
    sync_get_is(st, "ctr", "-2");

    void *cur = NULL;
    size_t cl = 0;
    assert_int_equal(collie_store_compare_set(st, "cas", "", 0, "one", 3, 2000, &cur, &cl),
                     COLLIE_OK);
    assert_string_equal(cur, "one");
    free(cur);
    assert_int_equal(collie_store_compare_set(st, "cas", "nope", 4, "two", 3, 2000, &cur, &cl),
                     COLLIE_OK);
    assert_string_equal(cur, "one"); /* unchanged: the current value comes back */
    free(cur);
    assert_int_equal(collie_store_compare_set(st, "cas", "one", 3, "two", 3, 2000, &cur, &cl),
                     COLLIE_OK);
    assert_string_equal(cur, "two");
    free(cur);

    bool all = true;
    const char *ks[] = {"a", "ctr", "missing"};
    assert_int_equal(collie_store_check(st, ks, 2, 2000, &all), COLLIE_OK);
    assert_true(all);
    assert_int_equal(collie_store_check(st, ks, 3, 2000, &all), COLLIE_OK);
    assert_false(all);
    assert_int_equal(collie_store_wait(st, ks, 2, 2000), COLLIE_OK);

    assert_int_equal(collie_store_append(st, "log", "ab", 2, 2000), COLLIE_OK);
    assert_int_equal(collie_store_append(st, "log", "cd", 2, 2000), COLLIE_OK);
    sync_get_is(st, "log", "abcd");

    const char *mk[] = {"m1", "m2", "m3"};
    const void *mv[] = {"x", "", "zzz"};
    size_t ml[] = {1, 0, 3};
    assert_int_equal(collie_store_multi_set(st, mk, mv, ml, 3, 2000), COLLIE_OK);
    void *got[3];
    size_t gl[3];
    assert_int_equal(collie_store_multi_get(st, mk, 3, 2000, got, gl), COLLIE_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gl[i], ml[i]);
        assert_memory_equal(got[i], mv[i], ml[i]);
        free(got[i]);
    }

    int64_t keys = 0;
    assert_int_equal(collie_store_num_keys(st, 2000, &keys), COLLIE_OK);
    assert_int_equal(keys, 8); /* a bin ctr cas log m1 m2 m3 */
    bool existed = false;
    assert_int_equal(collie_store_delete(st, "a", 2000, &existed), COLLIE_OK);
    assert_true(existed);
    assert_int_equal(collie_store_delete(st, "a", 2000, &existed), COLLIE_OK);
    assert_false(existed);
    assert_int_equal(collie_store_num_keys(st, 2000, &keys), COLLIE_OK);
    assert_int_equal(keys, 7);

    assert_int_equal(collie_store_barrier(st, "solo", 1, 2000), COLLIE_OK);
    assert_int_equal(collie_store_barrier(st, "solo", 1, 2000), COLLIE_OK);
    assert_string_equal(collie_store_address(st), fx.addr);
    fx_stop(&fx);
}

static void test_async_results_and_accessors(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_work *set = NULL, *get = NULL, *add = NULL, *mg = NULL, *nk = NULL, *cas = NULL;
    assert_int_equal(collie_store_post_set(fx.st, "k", "v1", 2, NULL, &set), COLLIE_OK);
    assert_int_equal(collie_store_post_get(fx.st, "k", NULL, &get), COLLIE_OK);
    assert_int_equal(collie_store_post_add(fx.st, "n", 3, NULL, &add), COLLIE_OK);
    const char *keys[] = {"k", "n"};
    assert_int_equal(collie_store_post_multi_get(fx.st, keys, 2, NULL, &mg), COLLIE_OK);
    assert_int_equal(collie_store_post_num_keys(fx.st, NULL, &nk), COLLIE_OK);
    assert_int_equal(collie_store_post_compare_set(fx.st, "k", "v1", 2, "v2", 2, NULL, &cas),
                     COLLIE_OK);
    collie_work *all[] = {set, get, add, mg, nk, cas};
    for (int i = 0; i < 6; i++)
        assert_int_equal(fx_wait(all[i]), COLLIE_OK);

    assert_value(get, "v1");
    assert_value(cas, "v2");
    int64_t i64 = -1;
    assert_int_equal(collie_store_work_int(add, &i64), COLLIE_OK);
    assert_int_equal(i64, 3);
    assert_int_equal(collie_store_work_int(nk, &i64), COLLIE_OK);
    assert_int_equal(i64, 2);
    const void *v;
    size_t len;
    assert_int_equal(collie_store_work_value_at(mg, 0, &v, &len), COLLIE_OK);
    assert_string_equal(v, "v1");
    assert_int_equal(collie_store_work_value_at(mg, 1, &v, &len), COLLIE_OK);
    assert_string_equal(v, "3");
    /* wrong accessor or index: EINVAL and NULL outputs */
    assert_int_equal(collie_store_work_value_at(mg, 2, &v, &len), COLLIE_EINVAL);
    assert_null(v);
    assert_int_equal(collie_store_work_value(add, &v, &len), COLLIE_EINVAL);
    assert_null(v);
    assert_int_equal(len, 0);
    assert_int_equal(collie_store_work_int(get, &i64), COLLIE_EINVAL);
    assert_int_equal(collie_store_work_value(set, &v, &len), COLLIE_EINVAL);
    assert_int_equal(collie_store_work_int(NULL, &i64), COLLIE_EINVAL);

    collie_work_details info;
    assert_int_equal(collie_work_info(get, &info), COLLIE_OK);
    assert_string_equal(info.op, "store.get");
    assert_true(info.seq > 0);
    assert_int_equal(info.timeout_ms, FX_WAIT_MS);

    /* a pending get: INPROGRESS */
    collie_work *pend = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "later", NULL, &pend), COLLIE_OK);
    assert_int_equal(collie_store_work_value(pend, &v, &len), COLLIE_INPROGRESS);
    assert_int_equal(collie_work_cancel(pend), COLLIE_OK);
    assert_int_equal(fx_wait(pend), COLLIE_ECANCELED);
    assert_int_equal(collie_store_work_value(pend, &v, &len), COLLIE_ECANCELED);
    collie_work_release(pend);
    for (int i = 0; i < 6; i++)
        collie_work_release(all[i]);
    fx_stop(&fx);
}

/* ---- waits ----------------------------------------------------------------------------------- */

static void test_get_times_out(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    void *v = (void *)1;
    size_t len = 1;
    int64_t t0 = fx_now_ms();
    int rc = collie_store_get(fx.st, "missing", 150, &v, &len);
    int64_t took = fx_now_ms() - t0;
    assert_int_equal(rc, COLLIE_ETIMEDOUT);
    assert_null(v);
    assert_int_equal(len, 0);
    assert_true(took >= 140 && took < 3000);
    const char *msg = collie_last_error();
    assert_non_null(strstr(msg, "store.get"));
    assert_non_null(strstr(msg, "'missing'"));
    assert_non_null(strstr(msg, fx.addr));
    assert_non_null(strstr(msg, "150 ms"));
    /* the server dropped the abandoned waiter (the client sent CANCEL) */
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 0));

    /* wait and multi_get time out the same way, async too */
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 100;
    const char *keys[] = {"x", "y"};
    collie_work *w1 = NULL, *w2 = NULL, *w3 = NULL;
    assert_int_equal(collie_store_post_wait(fx.st, keys, 2, &po, &w1), COLLIE_OK);
    assert_int_equal(collie_store_post_multi_get(fx.st, keys, 2, &po, &w2), COLLIE_OK);
    assert_int_equal(collie_store_post_barrier(fx.st, "never", 2, &po, &w3), COLLIE_OK);
    assert_int_equal(fx_wait(w1), COLLIE_ETIMEDOUT);
    assert_int_equal(fx_wait(w2), COLLIE_ETIMEDOUT);
    assert_int_equal(fx_wait(w3), COLLIE_ETIMEDOUT);
    assert_non_null(strstr(collie_work_error_message(w1), "key 'x' and 1 more"));
    collie_work_release(w1);
    collie_work_release(w2);
    collie_work_release(w3);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 0));
    fx_stop(&fx);
}

static void test_waits_released_by_another_client(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store *other = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    const char *ab[] = {"a", "b"};
    collie_work *get = NULL, *wait = NULL, *mget = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "a", NULL, &get), COLLIE_OK);
    assert_int_equal(collie_store_post_wait(fx.st, ab, 2, NULL, &wait), COLLIE_OK);
    assert_int_equal(collie_store_post_multi_get(fx.st, ab, 2, NULL, &mget), COLLIE_OK);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 3));
    assert_false(collie_work_test(get));

    assert_int_equal(collie_store_set(other, "a", "A", 1, 2000), COLLIE_OK);
    assert_int_equal(fx_wait(get), COLLIE_OK);
    assert_value(get, "A");
    fx_sleep_ms(20); /* b is still missing: the others keep waiting */
    assert_false(collie_work_test(wait));
    assert_false(collie_work_test(mget));
    assert_int_equal(collie_store_append(other, "b", "B", 1, 2000), COLLIE_OK);
    assert_int_equal(fx_wait(wait), COLLIE_OK);
    assert_int_equal(fx_wait(mget), COLLIE_OK);
    const void *v;
    size_t len;
    assert_int_equal(collie_store_work_value_at(mget, 1, &v, &len), COLLIE_OK);
    assert_string_equal(v, "B");
    collie_work_release(get);
    collie_work_release(wait);
    collie_work_release(mget);
    assert_int_equal(fx_server_waits(fx.e, fx.srv), 0);
    collie_store_destroy(other);
    fx_stop(&fx);
}

/* delete_prefix removes exactly the keys under the prefix (through a
 * prefixed view too), counts them, and leaves waiters on those keys
 * waiting (a later set still releases them). */
static void test_delete_prefix(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    const char *keys[] = {"g/1/a", "g/1/b", "g/1/c/d", "g/10/a", "g/2/a", "h"};
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(collie_store_set(fx.st, keys[i], "v", 1, 2000), COLLIE_OK);
    collie_work *get = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "g/1/later", NULL, &get), COLLIE_OK);
    int64_t n = -1;
    assert_int_equal(collie_store_delete_prefix(fx.st, "g/1/", 2000, &n), COLLIE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(collie_store_num_keys(fx.st, 2000, &n), COLLIE_OK);
    assert_int_equal(n, 3); /* g/10/a, g/2/a, h */
    bool there = false;
    const char *k10[] = {"g/10/a"};
    assert_int_equal(collie_store_check(fx.st, k10, 1, 2000, &there), COLLIE_OK);
    assert_true(there);
    collie_store *view;
    assert_int_equal(collie_store_prefix(fx.st, "g/", &view), COLLIE_OK);
    assert_int_equal(collie_store_delete_prefix(view, "2/", 2000, &n), COLLIE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(collie_store_delete_prefix(view, "nothing/", 2000, &n), COLLIE_OK);
    assert_int_equal(n, 0);
    assert_false(collie_work_test(get)); /* still waiting for its key */
    assert_int_equal(collie_store_set(fx.st, "g/1/later", "L", 1, 2000), COLLIE_OK);
    assert_int_equal(fx_wait(get), COLLIE_OK);
    assert_value(get, "L");
    collie_work_release(get);
    collie_store_destroy(view);
    fx_stop(&fx);
}

static void test_cancel_drops_server_waiter(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "k", NULL, &w), COLLIE_OK);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 1));
    assert_int_equal(collie_work_cancel(w), COLLIE_OK);
    assert_int_equal(collie_work_cancel(w), COLLIE_ESTATE);
    assert_int_equal(fx_wait(w), COLLIE_ECANCELED);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 0));
    /* the connection stays usable; a late set is not delivered to anyone */
    assert_int_equal(collie_store_set(fx.st, "k", "v", 1, 2000), COLLIE_OK);
    sync_get_is(fx.st, "k", "v");
    collie_work_release(w);
    fx_stop(&fx);
}

/* ---- barrier -----------------------------------------------------------------------------------
 */

#define BAR_N      4
#define BAR_ROUNDS 3

static void test_barrier_rounds(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store *cl[BAR_N];
    for (int i = 0; i < BAR_N; i++)
        cl[i] = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    for (int round = 0; round < BAR_ROUNDS; round++) {
        collie_work *w[BAR_N];
        for (int i = 0; i < BAR_N - 1; i++)
            assert_int_equal(collie_store_post_barrier(cl[i], "bar", BAR_N, NULL, &w[i]),
                             COLLIE_OK);
        assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == BAR_N - 1));
        for (int i = 0; i < BAR_N - 1; i++)
            assert_false(collie_work_test(w[i]));
        assert_int_equal(
            collie_store_post_barrier(cl[BAR_N - 1], "bar", BAR_N, NULL, &w[BAR_N - 1]), COLLIE_OK);
        for (int i = 0; i < BAR_N; i++) {
            assert_int_equal(fx_wait(w[i]), COLLIE_OK);
            collie_work_release(w[i]);
        }
    }
    int64_t count = 0; /* the counter is an ordinary integer key */
    assert_int_equal(collie_store_add(fx.st, "bar", 0, 2000, &count), COLLIE_OK);
    assert_int_equal(count, BAR_N * BAR_ROUNDS);
    for (int i = 0; i < BAR_N; i++)
        collie_store_destroy(cl[i]);
    fx_stop(&fx);
}

/* A rendezvous of many clients: one request and one reply each. */
static void test_barrier_many_clients(void **state) {
    (void)state;
    enum { N = 300 };
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store **cl = calloc(N, sizeof *cl);
    collie_work **w = calloc(N, sizeof *w);
    for (int i = 0; i < N; i++)
        cl[i] = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            assert_int_equal(collie_store_post_barrier(cl[i], "many", N, NULL, &w[i]), COLLIE_OK);
        for (int i = 0; i < N; i++) {
            assert_int_equal(fx_wait(w[i]), COLLIE_OK);
            collie_work_release(w[i]);
        }
    }
    assert_int_equal(collie_store_server_num_connections(fx.srv), N); /* fx.st never connected */
    for (int i = 0; i < N; i++)
        collie_store_destroy(cl[i]);
    free(cl);
    free(w);
    fx_stop(&fx);
}

typedef struct bar_thread {
    collie_store *st;
    int rounds, ok;
} bar_thread;

static void *bar_thread_main(void *arg) {
    bar_thread *t = arg;
    for (int r = 0; r < t->rounds; r++)
        if (collie_store_barrier(t->st, "tbar", BAR_N, FX_WAIT_MS) == COLLIE_OK) t->ok++;
    return NULL;
}

static void test_barrier_threads(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    pthread_t th[BAR_N];
    bar_thread bt[BAR_N];
    for (int i = 0; i < BAR_N; i++) {
        bt[i] = (bar_thread){fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS), 20, 0};
        pthread_create(&th[i], NULL, bar_thread_main, &bt[i]);
    }
    for (int i = 0; i < BAR_N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(bt[i].ok, 20);
        collie_store_destroy(bt[i].st);
    }
    fx_stop(&fx);
}

/* ---- prefix views -------------------------------------------------------------------------------
 */

static void test_prefix_views(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store *a = NULL, *ab = NULL, *c = NULL;
    assert_int_equal(collie_store_prefix(fx.st, "a/", &a), COLLIE_OK);
    assert_int_equal(collie_store_prefix(a, "b/", &ab), COLLIE_OK);
    assert_int_equal(collie_store_prefix(fx.st, "c/", &c), COLLIE_OK);
    assert_int_equal(collie_store_set(ab, "k", "1", 1, 2000), COLLIE_OK);
    assert_int_equal(collie_store_set(c, "k", "2", 1, 2000), COLLIE_OK);
    sync_get_is(fx.st, "a/b/k", "1");
    sync_get_is(a, "b/k", "1");
    sync_get_is(fx.st, "c/k", "2");
    /* multi-key ops prefix every key */
    const char *ks[] = {"k", "b/k"};
    bool all = false;
    assert_int_equal(collie_store_check(a, ks + 1, 1, 2000, &all), COLLIE_OK);
    assert_true(all);
    assert_int_equal(collie_store_check(ab, ks, 2, 2000, &all), COLLIE_OK);
    assert_false(all);
    int64_t n = 0;
    assert_int_equal(collie_store_add(ab, "ctr", 2, 2000, &n), COLLIE_OK);
    sync_get_is(fx.st, "a/b/ctr", "2");
    /* one connection for all of them */
    assert_int_equal(collie_store_server_num_connections(fx.srv), 1);
    /* views outlive the handle they came from */
    collie_store_destroy(a);
    collie_store_destroy(fx.st);
    fx.st = NULL;
    sync_get_is(ab, "k", "1");
    collie_store_destroy(c);
    collie_store_destroy(ab);
    assert_true(FX_EVENTUALLY(collie_store_server_num_connections(fx.srv) == 0));
    fx_stop(&fx);
}

/* ---- concurrency
 * ------------------------------------------------------------------------------------ */

#define MT_THREADS 8
#define MT_OPS     10000
#define MT_BATCH   100

typedef struct mt_arg {
    collie_store *st;
    int id;
    int adds, appends, errors;
} mt_arg;

static void *mt_main(void *p) {
    mt_arg *a = p;
    char key[32], val[32], logk[32];
    snprintf(logk, sizeof logk, "log%d", a->id);
    collie_work *w[MT_BATCH];
    int kind[MT_BATCH];
    char expect[MT_BATCH][32];
    for (int done = 0; done < MT_OPS; done += MT_BATCH) {
        for (int i = 0; i < MT_BATCH; i++) {
            int op = (done + i) % 5;
            kind[i] = op;
            int rc;
            snprintf(key, sizeof key, "t%d/k%d", a->id, (done + i) % 7);
            switch (op) {
            case 0:
                rc = collie_store_post_add(a->st, "total", 1, NULL, &w[i]);
                a->adds++;
                break;
            case 1:
                snprintf(val, sizeof val, "v%d", done + i);
                rc = collie_store_post_set(a->st, key, val, strlen(val), NULL, &w[i]);
                break;
            case 2: /* reads the set posted just before on this connection */
                snprintf(key, sizeof key, "t%d/k%d", a->id, (done + i - 1) % 7);
                snprintf(expect[i], sizeof expect[i], "v%d", done + i - 1);
                rc = collie_store_post_get(a->st, key, NULL, &w[i]);
                break;
            case 3:
                rc = collie_store_post_append(a->st, logk, "x", 1, NULL, &w[i]);
                a->appends++;
                break;
            default: {
                const char *ks[] = {key, "total"};
                rc = collie_store_post_check(a->st, ks, 2, NULL, &w[i]);
                break;
            }
            }
            if (rc != COLLIE_OK) {
                a->errors++;
                w[i] = NULL;
            }
        }
        for (int i = 0; i < MT_BATCH; i++) {
            if (!w[i]) continue;
            if (collie_work_wait(w[i], FX_WAIT_MS) != COLLIE_OK) a->errors++;
            if (kind[i] == 2) {
                const void *v = NULL;
                size_t len = 0;
                if (collie_store_work_value(w[i], &v, &len) != COLLIE_OK || strcmp(v, expect[i]))
                    a->errors++;
            }
            collie_work_release(w[i]);
        }
    }
    return NULL;
}

static void test_many_threads_consistent(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store *second = fx_client(fx.e, fx.addr, NULL, FX_WAIT_MS);
    pthread_t th[MT_THREADS];
    mt_arg args[MT_THREADS];
    for (int i = 0; i < MT_THREADS; i++) {
        args[i] = (mt_arg){.st = i % 2 ? second : fx.st, .id = i};
        pthread_create(&th[i], NULL, mt_main, &args[i]);
    }
    int64_t adds = 0;
    for (int i = 0; i < MT_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
        adds += args[i].adds;
    }
    int64_t total = 0;
    assert_int_equal(collie_store_add(fx.st, "total", 0, 2000, &total), COLLIE_OK);
    assert_int_equal(total, adds);
    assert_int_equal(adds, MT_THREADS * MT_OPS / 5);
    for (int i = 0; i < MT_THREADS; i++) {
        char k[16];
        snprintf(k, sizeof k, "log%d", i);
        void *v = NULL;
        size_t len = 0;
        assert_int_equal(collie_store_get(fx.st, k, 2000, &v, &len), COLLIE_OK);
        assert_int_equal(len, (size_t)args[i].appends);
        free(v);
    }
    collie_store_destroy(second);
    fx_stop(&fx);
}

/* ---- arguments, limits
 * ----------------------------------------------------------------------------- */

/* The call must fail with EINVAL, leave the work NULL and explain itself. */
#define EXPECT_EINVAL(call)                                                                        \
    do {                                                                                           \
        w = (collie_work *)1;                                                                      \
        assert_int_equal((call), COLLIE_EINVAL);                                                   \
        assert_null(w);                                                                            \
        assert_true(collie_last_error()[0] != '\0');                                               \
    } while (0)

static void test_invalid_arguments(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_store *st = fx.st;
    collie_work *w = (collie_work *)1;
    char longkey[CL_STORE_PROTO_MAX_KEY + 2];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    const char *keys[] = {"a", NULL};
    size_t lens[1] = {1};
    const void *vals[1] = {"v"};

    EXPECT_EINVAL(collie_store_post_set(st, NULL, "v", 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_set(NULL, "k", "v", 1, NULL, &w));
    assert_non_null(strstr(collie_last_error(), "store"));
    EXPECT_EINVAL(collie_store_post_set(st, longkey, "v", 1, NULL, &w));
    assert_non_null(strstr(collie_last_error(), "key"));
    EXPECT_EINVAL(collie_store_post_set(st, "k", NULL, 3, NULL, &w));
    EXPECT_EINVAL(collie_store_post_get(st, NULL, NULL, &w));
    assert_int_equal(collie_store_post_get(st, "k", NULL, NULL), COLLIE_EINVAL);
    EXPECT_EINVAL(collie_store_post_check(st, keys, 0, NULL, &w));
    EXPECT_EINVAL(collie_store_post_check(st, NULL, 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_wait(st, keys, 2, NULL, &w)); /* keys[1] is NULL */
    assert_non_null(strstr(collie_last_error(), "keys[1]"));
    EXPECT_EINVAL(collie_store_post_multi_get(st, keys, 0, NULL, &w));
    EXPECT_EINVAL(collie_store_post_multi_set(st, keys, NULL, lens, 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_multi_set(st, keys, vals, NULL, 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_barrier(st, "b", 0, NULL, &w));
    EXPECT_EINVAL(collie_store_post_compare_set(st, "k", NULL, 1, "x", 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_append(st, NULL, "x", 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_add(st, NULL, 1, NULL, &w));
    EXPECT_EINVAL(collie_store_post_delete(st, NULL, NULL, &w));
    /* bad post options */
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = -5;
    EXPECT_EINVAL(collie_store_post_set(st, "k", "v", 1, &po, &w));
    assert_non_null(strstr(collie_last_error(), "timeout"));
    po = (collie_post_opts)COLLIE_POST_OPTS_INIT;
    po.size = 3;
    EXPECT_EINVAL(collie_store_post_set(st, "k", "v", 1, &po, &w));
    /* sync wrappers */
    void *v = (void *)1;
    assert_int_equal(collie_store_get(st, NULL, 100, &v, NULL), COLLIE_EINVAL);
    assert_null(v);
    assert_int_equal(collie_store_get(st, "k", 100, NULL, NULL), COLLIE_EINVAL);
    assert_int_equal(collie_store_num_keys(st, 100, NULL), COLLIE_EINVAL);
    assert_int_equal(collie_store_set(NULL, "k", "v", 1, 100), COLLIE_EINVAL);
    /* handles */
    collie_store *view = (collie_store *)1;
    assert_int_equal(collie_store_prefix(st, NULL, &view), COLLIE_EINVAL);
    assert_null(view);
    collie_store *bad = (collie_store *)1;
    assert_int_equal(collie_store_connect(fx.e, "nohostport", NULL, &bad), COLLIE_EINVAL);
    assert_null(bad);
    assert_non_null(strstr(collie_last_error(), "nohostport"));
    assert_int_equal(collie_store_connect(fx.e, "127.0.0.1:99999", NULL, &bad), COLLIE_EINVAL);
    assert_int_equal(collie_store_connect(NULL, fx.addr, NULL, &bad), COLLIE_EINVAL);
    collie_store_opts so = COLLIE_STORE_OPTS_INIT;
    so.timeout_ms = -7;
    assert_int_equal(collie_store_connect(fx.e, fx.addr, &so, &bad), COLLIE_EINVAL);
    so = (collie_store_opts)COLLIE_STORE_OPTS_INIT;
    so.token = "";
    assert_int_equal(collie_store_connect(fx.e, fx.addr, &so, &bad), COLLIE_EINVAL);
    collie_store_server *srv = (collie_store_server *)1;
    assert_int_equal(collie_store_server_create(fx.e, "not-an-address!", 0, NULL, &srv),
                     COLLIE_EINVAL);
    assert_null(srv);
    collie_store_server_opts sso = COLLIE_STORE_SERVER_OPTS_INIT;
    sso.size = 1;
    assert_int_equal(collie_store_server_create(fx.e, "127.0.0.1", 0, &sso, &srv), COLLIE_EINVAL);
    /* a port in use */
    assert_int_equal(
        collie_store_server_create(fx.e, "127.0.0.1", collie_store_server_port(fx.srv), NULL, &srv),
        COLLIE_ESYSTEM);
    assert_non_null(strstr(collie_last_error(), "in use"));

    /* no side effects: nothing was ever sent, no connection was even made */
    assert_int_equal(collie_store_server_num_connections(fx.srv), 0);
    int64_t n = -1;
    assert_int_equal(collie_store_num_keys(st, 2000, &n), COLLIE_OK);
    assert_int_equal(n, 0);
    fx_stop(&fx);
}

static void test_server_limits(void **state) {
    (void)state;
    store_fx fx;
    collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
    so.max_key_size = 8;
    so.max_value_size = 16;
    so.max_keys = 2;
    fx_start(&fx, &so, NULL);
    assert_int_equal(collie_store_set(fx.st, "123456789", "v", 1, 2000), COLLIE_ELIMIT);
    assert_non_null(strstr(collie_last_error(), "max_key_size"));
    assert_int_equal(collie_store_set(fx.st, "k", "12345678901234567", 17, 2000), COLLIE_ELIMIT);
    assert_non_null(strstr(collie_last_error(), "max_value_size"));
    assert_int_equal(collie_store_set(fx.st, "k1", "v", 1, 2000), COLLIE_OK);
    assert_int_equal(collie_store_set(fx.st, "k2", "v", 1, 2000), COLLIE_OK);
    assert_int_equal(collie_store_add(fx.st, "k3", 1, 2000, NULL), COLLIE_ELIMIT);
    assert_non_null(strstr(collie_last_error(), "max_keys"));
    assert_int_equal(collie_store_append(fx.st, "k1", "123456789012345678", 16, 2000),
                     COLLIE_ELIMIT);
    /* a get on a too-long key is refused, not held forever */
    void *v = NULL;
    assert_int_equal(collie_store_get(fx.st, "123456789", 2000, &v, NULL), COLLIE_ELIMIT);
    /* a non-integer add is the server's EINVAL, with its reason */
    assert_int_equal(collie_store_add(fx.st, "k1", 1, 2000, NULL), COLLIE_EINVAL);
    assert_non_null(strstr(collie_last_error(), "not an integer"));
    /* the connection is still fine */
    sync_get_is(fx.st, "k1", "v");
    assert_int_equal(collie_store_server_num_connections(fx.srv), 1);
    fx_stop(&fx);
}

static void test_big_value(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    size_t n = 8u << 20;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)(i * 31 + 7);
    assert_int_equal(collie_store_set(fx.st, "big", big, n, FX_WAIT_MS), COLLIE_OK);
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(collie_store_get(fx.st, "big", FX_WAIT_MS, &v, &len), COLLIE_OK);
    assert_int_equal(len, n);
    assert_memory_equal(v, big, n);
    free(v);
    free(big);
    fx_stop(&fx);
}

/* ---- callbacks, completion queues, the progress thread
 * ------------------------------------------------ */

typedef struct cb_state {
    _Atomic int calls;
    int sync_rc, post_rc;
    collie_store *st;
    collie_work *posted;
} cb_state;

static void on_done(collie_work *w, void *arg) {
    cb_state *s = arg;
    (void)w;
    /* on the progress thread a sync call must refuse, a post must work */
    s->sync_rc = collie_store_set(s->st, "from_cb", "x", 1, 1000);
    s->post_rc = collie_store_post_set(s->st, "from_cb", "y", 1, NULL, &s->posted);
    atomic_fetch_add(&s->calls, 1); /* last: publishes the fields above */
}

static void test_callback_and_cq(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    cb_state cs = {.st = fx.st};
    collie_cq *cq = NULL;
    assert_int_equal(collie_cq_create(&cq), COLLIE_OK);
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = on_done;
    po.cb_arg = &cs;
    po.cq = cq;
    po.tag = 42;
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_set(fx.st, "k", "v", 1, &po, &w), COLLIE_OK);
    collie_work *popped = NULL;
    assert_int_equal(collie_cq_pop(cq, FX_WAIT_MS, &popped), COLLIE_OK);
    assert_ptr_equal(popped, w);
    assert_int_equal(collie_work_tag(popped), 42);
    assert_true(FX_EVENTUALLY(atomic_load(&cs.calls) == 1));
    assert_int_equal(cs.sync_rc, COLLIE_ESTATE);
    assert_int_equal(cs.post_rc, COLLIE_OK);
    assert_int_equal(fx_wait(cs.posted), COLLIE_OK);
    sync_get_is(fx.st, "from_cb", "y");
    collie_work_release(cs.posted);
    collie_work_release(popped);
    collie_work_release(w);
    collie_cq_destroy(cq);
    assert_int_equal(atomic_load(&cs.calls), 1);
    fx_stop(&fx);
}

/* ---- shutdown with requests pending
 * -------------------------------------------------------------------- */

static void test_engine_destroy_with_pending(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "never", NULL, &w), COLLIE_OK);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 1));
    assert_int_equal(collie_engine_destroy(fx.e), COLLIE_OK);
    assert_true(collie_work_test(w));
    assert_int_equal(collie_work_result(w), COLLIE_ECLOSED);
    /* owners destroy afterwards: only memory is freed */
    collie_store_destroy(fx.st);
    collie_store_server_destroy(fx.srv);
    collie_work_release(w);
}

static void test_store_destroy_with_pending(void **state) {
    (void)state;
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_work *w = NULL;
    assert_int_equal(collie_store_post_get(fx.st, "never", NULL, &w), COLLIE_OK);
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 1));
    collie_store_destroy(fx.st);
    fx.st = NULL;
    assert_int_equal(fx_wait(w), COLLIE_ECLOSED);
    assert_non_null(strstr(collie_work_error_message(w), "destroyed"));
    collie_work_release(w);
    /* the server notices the client leaving and drops its waiter */
    assert_true(FX_EVENTUALLY(fx_server_waits(fx.e, fx.srv) == 0));
    assert_true(FX_EVENTUALLY(collie_store_server_num_connections(fx.srv) == 0));
    fx_stop(&fx);
}

/* ---- IPv6, and nothing left behind
 * -------------------------------------------------------------------- */

static void test_ipv6(void **state) {
    (void)state;
    collie_engine *e = fx_engine();
    collie_store_server *srv = NULL;
    if (collie_store_server_create(e, "::1", 0, NULL, &srv) != COLLIE_OK) {
        assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
        skip_because("no IPv6 loopback (::1) on this machine");
    }
    char addr[64];
    snprintf(addr, sizeof addr, "[::1]:%u", collie_store_server_port(srv));
    collie_store *st = fx_client(e, addr, NULL, FX_WAIT_MS);
    assert_int_equal(collie_store_set(st, "k", "v6", 2, 2000), COLLIE_OK);
    sync_get_is(st, "k", "v6");
    assert_string_equal(collie_store_address(st), addr);
    collie_store_destroy(st);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* Can this machine listen on the IPv6 loopback? */
static bool v6_loopback(void) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* Bind-mount a file holding `text` over `target` (which must exist). */
static bool mount_text_over(const char *text, const char *target, char *why, size_t len) {
    char tmp[] = "/tmp/cltest-resolv-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(why, len, "mkstemp: %s", strerror(errno));
        return false;
    }
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    bool ok = n == (ssize_t)strlen(text) && mount(tmp, target, NULL, MS_BIND, NULL) == 0;
    if (!ok) snprintf(why, len, "bind-mounting over %s: %s", target, strerror(errno));
    unlink(tmp); /* the mount keeps the file */
    return ok;
}

/* Give this test process (the runner's child; still one thread) its own
 * /etc/hosts, and /etc/gai.conf if `gai`: a mount namespace of its own, so
 * nothing changes for the rest of the machine. false, saying why, where
 * that is not allowed. */
static bool private_resolver(const char *hosts, const char *gai, char *why, size_t len) {
    const char *step = "unshare(CLONE_NEWNS)";
    if (unshare(CLONE_NEWNS) != 0 ||
        (step = "making / private", mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)) {
        snprintf(why, len, "%s: %s", step, strerror(errno));
        return false;
    }
    if (!mount_text_over(hosts, "/etc/hosts", why, len)) return false;
    if (gai && access("/etc/gai.conf", F_OK) != 0) {
        snprintf(why, len, "no /etc/gai.conf to mount over");
        return false;
    }
    return !gai || mount_text_over(gai, "/etc/gai.conf", why, len);
}

/* The family of the first address `name` resolves to. */
static int first_family(const char *name) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(name, "1", &hints, &ai) != 0 || !ai) return -1;
    int f = ai->ai_family;
    freeaddrinfo(ai);
    return f;
}

/* A client reaches a server listening on one of its name's addresses only
 * through a later one: the first refuses, the next is tried at once (it
 * tried only the first, and retried "Connection refused" until the
 * deadline). Debian's /etc/hosts makes "localhost" ::1 first while a
 * server bound to 127.0.0.1 listens on IPv4 alone; then the other way
 * round (the next test). */
static void test_connect_tries_every_address(void **state) {
    (void)state;
    char why[256] = "";
    if (!v6_loopback()) skip_because("no IPv6 loopback (::1) on this machine");
    if (!private_resolver("127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
                          "::1 collie-dual\n127.0.0.1 collie-dual\n",
                          NULL, why, sizeof why))
        skip_because("cannot give the test its own /etc/hosts: %s", why);
    if (first_family("localhost") != AF_INET6)
        skip_because("'localhost' does not resolve to ::1 first here");
    collie_engine *e = fx_engine();
    collie_store_server *srv = fx_server(e, 0, NULL); /* 127.0.0.1 */
    char addr[64];
    snprintf(addr, sizeof addr, "localhost:%u", collie_store_server_port(srv));
    collie_store *st = fx_client(e, addr, NULL, 3000);
    int64_t t0 = fx_now_ms();
    int rc = collie_store_set(st, "k", "v4", 2, 3000);
    if (rc != COLLIE_OK) fail_msg("set through %s: %s", addr, collie_last_error());
    sync_get_is(st, "k", "v4");
    assert_true(fx_now_ms() - t0 < 2000);
    collie_store_destroy(st);
    collie_store_server_destroy(srv);

    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* ... and the other way round: IPv4 first (gai.conf), a server on ::1. */
static void test_connect_tries_every_address_v4_first(void **state) {
    (void)state;
    char why[256] = "";
    if (!v6_loopback()) skip_because("no IPv6 loopback (::1) on this machine");
    if (!private_resolver("::1 collie-dual\n127.0.0.1 collie-dual\n",
                          "precedence ::ffff:0:0/96 100\n", why, sizeof why))
        skip_because("cannot give the test its own /etc/hosts and /etc/gai.conf: %s", why);
    if (first_family("collie-dual") != AF_INET)
        skip_because("'collie-dual' does not resolve to 127.0.0.1 first here");
    collie_engine *e = fx_engine();
    collie_store_server *srv = NULL;
    assert_int_equal(collie_store_server_create(e, "::1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "collie-dual:%u", collie_store_server_port(srv));
    collie_store *st = fx_client(e, addr, NULL, 3000);
    int rc = collie_store_set(st, "k", "v6", 2, 3000);
    if (rc != COLLIE_OK) fail_msg("set through %s: %s", addr, collie_last_error());
    sync_get_is(st, "k", "v6");
    collie_store_destroy(st);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* A server asked for a wildcard ("0.0.0.0" or "::") listens on both
 * families, on one port: clients of 127.0.0.1 and of ::1 both get in (it
 * listened on 0.0.0.0 alone). A token: a wildcard is beyond loopback. */
static void test_wildcard_listens_on_both_families(void **state) {
    (void)state;
    if (!v6_loopback()) skip_because("no IPv6 loopback (::1) on this machine");
    const char *wild[] = {"0.0.0.0", "::"};
    collie_engine *e = fx_engine();
    for (int i = 0; i < 2; i++) {
        collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
        so.token = "wildcard token";
        collie_store_server *srv = NULL;
        int rc = collie_store_server_create(e, wild[i], 0, &so, &srv);
        if (rc != COLLIE_OK) fail_msg("server on %s: %s", wild[i], collie_last_error());
        unsigned port = collie_store_server_port(srv);
        const char *fmt[] = {"127.0.0.1:%u", "[::1]:%u"};
        for (int f = 0; f < 2; f++) {
            char addr[64];
            snprintf(addr, sizeof addr, fmt[f], port);
            collie_store *st = fx_client(e, addr, "wildcard token", 3000);
            rc = collie_store_set(st, "k", addr, strlen(addr), 3000);
            if (rc != COLLIE_OK)
                fail_msg("server on %s, client of %s: %s", wild[i], addr, collie_last_error());
            sync_get_is(st, "k", addr);
            collie_store_destroy(st);
        }
        collie_store_server_destroy(srv);
    }
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

static void test_nothing_left_outstanding(void **state) {
    (void)state;
    fx_baseline_check();
}

int main(void) {
    fx_baseline_take();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_ops),
        cmocka_unit_test(test_async_results_and_accessors),
        cmocka_unit_test(test_get_times_out),
        cmocka_unit_test(test_waits_released_by_another_client),
        cmocka_unit_test(test_delete_prefix),
        cmocka_unit_test(test_cancel_drops_server_waiter),
        cmocka_unit_test(test_barrier_rounds),
        cmocka_unit_test(test_barrier_threads),
        cmocka_unit_test(test_barrier_many_clients),
        cmocka_unit_test(test_prefix_views),
        cmocka_unit_test(test_many_threads_consistent),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_server_limits),
        cmocka_unit_test(test_big_value),
        cmocka_unit_test(test_callback_and_cq),
        cmocka_unit_test(test_engine_destroy_with_pending),
        cmocka_unit_test(test_store_destroy_with_pending),
        cmocka_unit_test(test_ipv6),
        cmocka_unit_test(test_connect_tries_every_address),
        cmocka_unit_test(test_connect_tries_every_address_v4_first),
        cmocka_unit_test(test_wildcard_listens_on_both_families),
        cmocka_unit_test(test_nothing_left_outstanding),
    };
    return cltest_main(tests, NULL, NULL);
}
