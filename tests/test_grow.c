/*
 * test_grow.c — growing a comm (issue 33): members take joiners into a new
 * comm (collie_comm_grow) and new processes ask to join (collie_comm_join),
 * ranks in one process (coll_fixture; the joiners on their own store
 * handles). Process death and a replacement: test_shrink_kids.c.
 *
 *   grow:      3 members and a joiner: one comm of 4 (members keep their
 *              ranks, the joiner is rank 3), named "<name>.gr<gen>", whose
 *              allreduce's bytes are right; the old comm still works.
 *   regrow:    4 ranks, rank 3 leaves, the others shrink, a replacement
 *              joins by the family name asking for rank 3: back to 4.
 *   refused:   a joiner asking for a member's rank is refused (EINVAL,
 *              naming it) and the members take the next joiner instead; bad
 *              input to grow and join is named; grow of a failed comm
 *              (ESTATE).
 *   withdrawn: a joiner nobody takes gives up at its deadline (ETIMEDOUT,
 *              withdrawn); the members' next grow skips its ticket and
 *              waits for a live joiner (ETIMEDOUT: "0 of 1 joiners came");
 *              a later grow with a joiner works (the same attempt's name: the
 *              failed one never made a comm, so every member is still at it).
 *   slow:      a member that never calls grow: the others' grow fails at
 *              its deadline naming it, and so does the joiner's; the
 *              blocking form's last error names it too (the comm the grow
 *              had made is destroyed with its work without wiping it).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "comm/comm.h"
#include "harness.h"
#include "runner.h"

/* post grow on members[0..n) and join on `joiners` store handles at once */
typedef struct grow_round {
    collie_work *m[WORLD_MAX], *j[WORLD_MAX];
    collie_comm *mc[WORLD_MAX], *jc[WORLD_MAX];
    int ms[WORLD_MAX], js[WORLD_MAX];
} grow_round;

static void post_members(grow_round *g, collie_comm **members, int n, const collie_grow_opts *go) {
    for (int i = 0; i < n; i++)
        assert_int_equal(collie_comm_grow_post(members[i], go, NULL, &g->m[i]), COLLIE_OK);
}

static void post_joiner(grow_round *g, int i, world *w, collie_store *st, const char *family,
                        int rank, int32_t timeout_ms) {
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.rank = rank;
    go.timeout_ms = timeout_ms;
    assert_int_equal(collie_comm_join_post(w->e, st, family, &go, NULL, &g->j[i]), COLLIE_OK);
}

static void wait_all(collie_work **ws, collie_comm **out, int *st, int n) {
    for (int i = 0; i < n; i++) {
        st[i] = collie_work_wait(ws[i], 20000);
        out[i] = NULL;
        if (st[i] == COLLIE_OK)
            assert_int_equal(collie_comm_work_comm(ws[i], &out[i]), COLLIE_OK);
        else
            print_message("%s\n", collie_work_error_message(ws[i]));
    }
}

static void release_all(collie_work **ws, int n) {
    for (int i = 0; i < n; i++)
        collie_work_release(ws[i]);
}

/* the grown comms (members then joiners): sizes, ranks, an allreduce of
 * rank + 1 on each (the oracle: the sum) */
static void check_grown(collie_comm **cs, int n, const int *want_rank) {
    collie_work *w[WORLD_MAX];
    int32_t v[WORLD_MAX], out[WORLD_MAX];
    for (int i = 0; i < n; i++) {
        assert_non_null(cs[i]);
        assert_int_equal(collie_comm_size(cs[i]), n);
        assert_int_equal(collie_comm_rank(cs[i]), want_rank[i]);
        v[i] = want_rank[i] + 1;
        assert_int_equal(
            collie_allreduce(cs[i], &v[i], &out[i], 1, COLLIE_INT32, COLLIE_SUM, NULL, &w[i]),
            COLLIE_OK);
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(collie_work_wait(w[i], 10000), COLLIE_OK);
        assert_int_equal(out[i], n * (n + 1) / 2);
        collie_work_release(w[i]);
    }
}

static void destroy_comms(collie_comm **cs, int n) {
    for (int i = 0; i < n; i++)
        if (cs[i]) assert_int_equal(collie_comm_destroy(cs[i]), COLLIE_OK);
}

static void test_grow_one_joiner(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "gw", NULL);
    world_link(&w);
    collie_store *js = world_store(&w);
    grow_round g;
    post_members(&g, w.c, 3, NULL);
    post_joiner(&g, 0, &w, js, "gw", -1, 0);
    wait_all(g.m, g.mc, g.ms, 3);
    wait_all(g.j, g.jc, g.js, 1);
    collie_comm *all[4] = {g.mc[0], g.mc[1], g.mc[2], g.jc[0]};
    const int ranks[4] = {0, 1, 2, 3};
    for (int i = 0; i < 3; i++)
        assert_int_equal(g.ms[i], COLLIE_OK);
    assert_int_equal(g.js[0], COLLIE_OK);
    assert_string_equal(collie_comm_name(all[3]), "gw.gr0");
    check_grown(all, 4, ranks);
    world_link(&w); /* the old comm is untouched */
    release_all(g.m, 3);
    release_all(g.j, 1);
    destroy_comms(all, 4);
    collie_store_destroy(js);
    world_destroy(&w);
}

static void test_grow_after_shrink(void **state) {
    (void)state;
    world w;
    world_create_one_left(&w, 4, "gs");
    collie_work *sw[3];
    collie_comm *small[3];
    for (int r = 0; r < 3; r++)
        assert_int_equal(collie_comm_shrink_post(w.c[r], NULL, NULL, &sw[r]), COLLIE_OK);
    int st[3];
    wait_all(sw, small, st, 3);
    for (int r = 0; r < 3; r++)
        assert_int_equal(st[r], COLLIE_OK);
    release_all(sw, 3);
    collie_store *js = world_store(&w);
    grow_round g;
    post_joiner(&g, 0, &w, js, "gs", 3, 0); /* by the family name, its old rank */
    post_members(&g, small, 3, NULL);
    wait_all(g.m, g.mc, g.ms, 3);
    wait_all(g.j, g.jc, g.js, 1);
    collie_comm *all[4] = {g.mc[0], g.mc[1], g.mc[2], g.jc[0]};
    const int ranks[4] = {0, 1, 2, 3};
    assert_int_equal(g.js[0], COLLIE_OK);
    char want[64];
    snprintf(want, sizeof want, "gs.shr%llu.gr0",
             (unsigned long long)collie_comm_generation(w.c[0]));
    assert_string_equal(collie_comm_name(all[0]), want);
    check_grown(all, 4, ranks);
    for (int i = 0; i < 4; i++) { /* the line, the joiner's too */
        assert_int_equal(comm_stats(all[i]).shrinks, 1);
        assert_int_equal(comm_stats(all[i]).grows, 1);
    }
    release_all(g.m, 3);
    release_all(g.j, 1);
    destroy_comms(all, 4);
    destroy_comms(small, 3);
    collie_store_destroy(js);
    world_destroy(&w);
}

static void test_grow_refused(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "gr", NULL);
    world_link(&w);
    collie_store *js[2] = {world_store(&w), world_store(&w)};
    collie_work *x = (collie_work *)1;
    collie_comm *c = (collie_comm *)1;
    collie_grow_opts bad = COLLIE_GROW_OPTS_INIT;
    bad.count = -1;
    assert_int_equal(collie_comm_grow_post(w.c[0], &bad, NULL, &x), COLLIE_EINVAL);
    assert_null(x);
    assert_non_null(strstr(collie_last_error(), "count -1"));
    bad = (collie_grow_opts)COLLIE_GROW_OPTS_INIT;
    bad.rank = -2;
    assert_int_equal(collie_comm_join(w.e, js[0], "gr", &bad, &c), COLLIE_EINVAL);
    assert_null(c);
    bad.rank = -1;
    bad.size = 0;
    assert_int_equal(collie_comm_join(w.e, js[0], "gr", &bad, &c), COLLIE_EINVAL);
    assert_int_equal(collie_comm_join(w.e, js[0], "bad name!", NULL, &c), COLLIE_EINVAL);
    assert_non_null(strstr(collie_last_error(), "not allowed"));
    assert_int_equal(collie_comm_join(NULL, js[0], "gr", NULL, &c), COLLIE_EINVAL);
    assert_int_equal(collie_comm_grow(NULL, NULL, &c), COLLIE_EINVAL);
    /* a joiner asking for a member's rank: refused, the next one taken */
    grow_round g;
    post_joiner(&g, 0, &w, js[0], "gr", 1, 0);
    post_members(&g, w.c, 2, NULL);
    wait_all(g.j, g.jc, g.js, 1);
    assert_int_equal(g.js[0], COLLIE_EINVAL);
    assert_non_null(strstr(collie_work_error_message(g.j[0]), "rank 1 is taken by a member"));
    post_joiner(&g, 1, &w, js[1], "gr", -1, 0);
    wait_all(g.m, g.mc, g.ms, 2);
    wait_all(&g.j[1], &g.jc[1], &g.js[1], 1);
    collie_comm *all[3] = {g.mc[0], g.mc[1], g.jc[1]};
    const int ranks[3] = {0, 1, 2};
    check_grown(all, 3, ranks);
    release_all(g.m, 2);
    release_all(g.j, 2);
    destroy_comms(all, 3);
    /* a failed comm does not grow */
    collie_comm_abort(w.c[0], "test");
    assert_int_equal(collie_comm_grow(w.c[0], NULL, &c), COLLIE_ESTATE);
    assert_non_null(strstr(collie_last_error(), "shrink it first"));
    collie_store_destroy(js[0]);
    collie_store_destroy(js[1]);
    collie_comm_destroy(w.c[0]);
    collie_comm_destroy(w.c[1]);
    w.c[0] = w.c[1] = NULL;
    world_destroy(&w);
}

static void test_grow_withdrawn_joiner(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "gx", NULL);
    world_link(&w);
    collie_store *js[2] = {world_store(&w), world_store(&w)};
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = 300;
    collie_comm *c = (collie_comm *)1;
    assert_int_equal(collie_comm_join(w.e, js[0], "gx", &go, &c), COLLIE_ETIMEDOUT);
    assert_null(c);
    assert_non_null(strstr(collie_last_error(), "withdrawn"));
    /* its ticket is skipped: the members wait for a live joiner, in vain */
    grow_round g;
    post_members(&g, w.c, 2, &go);
    wait_all(g.m, g.mc, g.ms, 2);
    assert_int_equal(g.ms[0], COLLIE_ETIMEDOUT);
    assert_non_null(strstr(collie_work_error_message(g.m[0]), "0 of 1 joiners came"));
    assert_int_equal(g.ms[1], COLLIE_ETIMEDOUT); /* rank 1 waited for rank 0's plan */
    release_all(g.m, 2);
    /* the next grow with a joiner works */
    post_joiner(&g, 0, &w, js[1], "gx", -1, 0);
    post_members(&g, w.c, 2, NULL);
    wait_all(g.m, g.mc, g.ms, 2);
    wait_all(g.j, g.jc, g.js, 1);
    collie_comm *all[3] = {g.mc[0], g.mc[1], g.jc[0]};
    const int ranks[3] = {0, 1, 2};
    /* the failed grow never made a comm: the next one is the same attempt */
    assert_string_equal(collie_comm_name(all[2]), "gx.gr0");
    check_grown(all, 3, ranks);
    release_all(g.m, 2);
    release_all(g.j, 1);
    destroy_comms(all, 3);
    collie_store_destroy(js[0]);
    collie_store_destroy(js[1]);
    world_destroy(&w);
}

static void test_grow_member_slow(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "gl", NULL);
    world_link(&w);
    collie_store *js = world_store(&w);
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = 400;
    grow_round g;
    post_members(&g, w.c, 2, &go); /* rank 2 never calls */
    post_joiner(&g, 0, &w, js, "gl", -1, 400);
    wait_all(g.m, g.mc, g.ms, 2);
    wait_all(g.j, g.jc, g.js, 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(g.ms[i], COLLIE_ETIMEDOUT);
        assert_non_null(strstr(collie_work_error_message(g.m[i]), "2"));
    }
    assert_int_equal(g.js[0], COLLIE_ETIMEDOUT);
    release_all(g.m, 2);
    release_all(g.j, 1);
    world_link(&w); /* the old comm still works */
    collie_store_destroy(js);
    world_destroy(&w);
}

/* The blocking grow's error names its cause even when the work it waited
 * for had made a comm (destroyed with the work: that destroy must not wipe
 * this thread's last error). Rank 2 never calls grow. */
typedef struct blocking_grow {
    collie_comm *c;
    int rc;
    char err[512];
} blocking_grow;

static void *grow_thread(void *arg) {
    blocking_grow *b = arg;
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = 400;
    collie_comm *out = NULL;
    b->rc = collie_comm_grow(b->c, &go, &out);
    snprintf(b->err, sizeof b->err, "%s", collie_last_error());
    return NULL;
}

static void test_grow_blocking_error_names_the_cause(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "gb", NULL);
    world_link(&w);
    collie_store *js = world_store(&w);
    blocking_grow b = {.c = w.c[0]};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, grow_thread, &b), 0);
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = 400;
    grow_round g;
    post_members(&g, &w.c[1], 1, &go);
    post_joiner(&g, 0, &w, js, "gb", -1, 400);
    assert_int_equal(pthread_join(t, NULL), 0);
    wait_all(g.m, g.mc, g.ms, 1);
    wait_all(g.j, g.jc, g.js, 1);
    assert_int_equal(b.rc, COLLIE_ETIMEDOUT);
    print_message("blocking grow: %s\n", b.err);
    assert_non_null(strstr(b.err, "never arrived: rank 2"));
    release_all(g.m, 1);
    release_all(g.j, 1);
    collie_store_destroy(js);
    world_destroy(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_one_joiner),
        cmocka_unit_test(test_grow_after_shrink),
        cmocka_unit_test(test_grow_refused),
        cmocka_unit_test(test_grow_withdrawn_joiner),
        cmocka_unit_test(test_grow_member_slow),
        cmocka_unit_test(test_grow_blocking_error_names_the_cause),
    };
    return cltest_main(tests, NULL, NULL);
}
