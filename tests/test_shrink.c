/*
 * test_shrink.c — shrinking to the survivors (issue 33): collie_comm_shrink,
 * its non-blocking form, the rank map and the agreed fault, with ranks in
 * one process (coll_fixture; a rank "fails" by leaving or by never calling;
 * process death and stops: test_shrink_kids.c):
 *
 *   left:      4 ranks, rank 3 destroys its comm; the others shrink (posted,
 *              concurrently) and get one comm of 3: ranks in the old order,
 *              the rank map, the old comm's fault is the agreed set {3}, the
 *              name "<name>.shr<gen>", and an allreduce's bytes are right.
 *   refused:   bad input, each named: NULL, opts without a size, a bad
 *              timeout, a healthy comm, a never-created one, the rank map
 *              of a comm not made by a shrink, collie_comm_work_comm of
 *              another work, taking the comm twice.
 *   absent:    3 ranks, rank 2 left; rank 1 never calls shrink: rank 0's
 *              ends at its deadline with rank 1 left out too (a comm of
 *              one, whose allreduce is its own value); rank 1 is told: an
 *              EXCLUDED event, ENOTMEMBER on its next post and from its own
 *              late shrink.
 *   cycle:     create, shrink, grow (a joiner), destroy, create again with
 *              the same name (the next generation), shrink and grow again:
 *              names, generations and sizes right.
 *   mixed:     rank 3 left; ranks 0 and 1 shrink while rank 2 grows: its
 *              grow ends at its deadline, the others leave it out at theirs
 *              (a comm of two), and it is told it is out.
 *   desync:    a deadline on a shrunk comm: the desync report says the comm
 *              was made by a shrink of which comm (its ranks are new).
 *   store:     the store's server is gone: shrink fails with EPEER, saying
 *              it needs a store that outlives the ranks.
 *   hook:      a backend with a shrink hook (tcp's ops under another name):
 *              4 -> 3 -> 2, each survivor's hook is given the old comm's
 *              state and the agreed set; declining (ENOTSUP) makes a fresh
 *              init, building (the hook runs tcp's init itself) is taken;
 *              the new comm's allreduce is right either way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "comm/comm.h"
#include "engine/engine.h"
#include "harness.h"
#include "runner.h"
#include "store_fixture.h"
#include "transports/cpu/cpu.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* wait (bounded) until c's health says `state` of rank r */
static bool wait_state(collie_comm *c, int r, int state, int ms) {
    collie_peer_health h[WORLD_MAX];
    int64_t until = now_ms() + ms;
    do {
        if (collie_comm_health(c, h, WORLD_MAX) > r && h[r].state == state) return true;
        usleep(1000);
    } while (now_ms() < until);
    return false;
}

/* post shrink on the listed ranks of w at once, wait for every one; out[r]
 * is rank r's new comm (NULL: its shrink failed, st[r] its status) */
static void shrink_ranks(world *w, const int *ranks, int n, const collie_shrink_opts *so,
                         collie_comm **out, int *st) {
    collie_work *sw[WORLD_MAX];
    for (int i = 0; i < n; i++)
        assert_int_equal(collie_comm_shrink_post(w->c[ranks[i]], so, NULL, &sw[i]), COLLIE_OK);
    for (int i = 0; i < n; i++) {
        int r = ranks[i];
        st[r] = collie_work_wait(sw[i], 20000);
        out[r] = NULL;
        if (st[r] == COLLIE_OK)
            assert_int_equal(collie_comm_work_comm(sw[i], &out[r]), COLLIE_OK);
        else
            print_message("rank %d: %s\n", r, collie_work_error_message(sw[i]));
        collie_work_release(sw[i]);
    }
}

/* every new comm of the survivors: size, rank, map and the allreduce's
 * bytes (the sum of the survivors' old rank + 1) */
static void check_shrunk(collie_comm **nc, const int *alive, int n, int old_size) {
    int32_t want = 0;
    for (int i = 0; i < n; i++)
        want += alive[i] + 1;
    collie_work *w[WORLD_MAX];
    int32_t v[WORLD_MAX], out[WORLD_MAX];
    for (int i = 0; i < n; i++) {
        collie_comm *c = nc[alive[i]];
        assert_non_null(c);
        assert_int_equal(collie_comm_size(c), n);
        assert_int_equal(collie_comm_rank(c), i);
        int map[WORLD_MAX];
        assert_int_equal(collie_comm_rank_map(c, map, WORLD_MAX), old_size);
        for (int r = 0, k = 0; r < old_size; r++) {
            bool in = k < n && alive[k] == r;
            assert_int_equal(map[r], in ? k : -1);
            if (in) k++;
        }
        v[i] = alive[i] + 1;
        out[i] = -1;
        assert_int_equal(
            collie_allreduce(c, &v[i], &out[i], 1, COLLIE_INT32, COLLIE_SUM, NULL, &w[i]),
            COLLIE_OK);
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(collie_work_wait(w[i], 10000), COLLIE_OK);
        assert_int_equal(out[i], want);
        collie_work_release(w[i]);
    }
}

static void check_agreed(collie_comm *old, const int *out, int n, int kind) {
    collie_fault f = COLLIE_FAULT_INIT;
    assert_int_equal(collie_comm_fault(old, &f), COLLIE_OK);
    assert_int_equal(f.view, COLLIE_FAULT_VIEW_AGREED);
    assert_int_equal(f.kind, kind);
    assert_int_equal(f.nranks, n);
    for (int i = 0; i < n; i++)
        assert_int_equal(f.ranks[i], out[i]);
}

/* ---- in one process ------------------------------------------------------------------------ */

static void test_shrink_after_leave(void **state) {
    (void)state;
    world w;
    world_create_one_left(&w, 4, "shl");
    collie_comm *nc[WORLD_MAX] = {0};
    int st[WORLD_MAX];
    const int alive[] = {0, 1, 2}, gone[] = {3};
    shrink_ranks(&w, alive, 3, NULL, nc, st);
    for (int r = 0; r < 3; r++)
        assert_int_equal(st[r], COLLIE_OK);
    check_shrunk(nc, alive, 3, 4);
    for (int r = 0; r < 3; r++) {
        check_agreed(w.c[r], gone, 1, COLLIE_FAULT_PEER_LEFT);
        char want[80];
        snprintf(want, sizeof want, "shl.shr%llu",
                 (unsigned long long)collie_comm_generation(w.c[r]));
        assert_string_equal(collie_comm_name(nc[r]), want);
        /* its line: stats, and both comms' dumps */
        assert_int_equal(comm_stats(nc[r]).shrinks, 1);
        assert_int_equal(comm_stats(nc[r]).grows, 0);
        assert_int_equal(comm_stats(w.c[r]).shrinks, 0);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_int_equal(collie_comm_dump(nc[r], f), COLLIE_OK);
        fclose(f);
        assert_non_null(strstr(text, "\"made_by\":\"shrink\",\"from\":\"shl\""));
        assert_non_null(strstr(text, "\"rank_map\":[0,1,2,-1]"));
        free(text);
        f = open_memstream(&text, &len);
        assert_int_equal(collie_comm_dump(w.c[r], f), COLLIE_OK);
        fclose(f);
        assert_non_null(strstr(text, "\"succeeded_by\":\"shl.shr"));
        free(text);
        /* the old comm's works are over: posts fail fast */
        int s;
        one_allreduce(w.c[r], r, &s);
        assert_int_equal(s, COLLIE_EABORTED);
        assert_int_equal(collie_comm_destroy(nc[r]), COLLIE_OK);
    }
    world_destroy(&w);
}

static void test_shrink_refused(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "shr", NULL);
    world_link(&w);
    collie_comm *out = (collie_comm *)1;
    collie_work *wk = (collie_work *)1;
    assert_int_equal(collie_comm_shrink(NULL, NULL, &out), COLLIE_EINVAL);
    assert_null(out);
    assert_int_equal(collie_comm_shrink_post(w.c[0], NULL, NULL, NULL), COLLIE_EINVAL);
    collie_shrink_opts so = COLLIE_SHRINK_OPTS_INIT;
    so.size = 0;
    assert_int_equal(collie_comm_shrink_post(w.c[0], &so, NULL, &wk), COLLIE_EINVAL);
    assert_null(wk);
    assert_non_null(strstr(collie_last_error(), "size"));
    so = (collie_shrink_opts)COLLIE_SHRINK_OPTS_INIT;
    so.timeout_ms = -7;
    assert_int_equal(collie_comm_shrink(w.c[0], &so, &out), COLLIE_EINVAL);
    assert_non_null(strstr(collie_last_error(), "timeout_ms -7"));
    /* healthy: nothing to shrink, and nothing happened to the comm */
    assert_int_equal(collie_comm_shrink(w.c[0], NULL, &out), COLLIE_ESTATE);
    assert_non_null(strstr(collie_last_error(), "healthy"));
    int map[2];
    assert_int_equal(collie_comm_rank_map(w.c[0], map, 2), COLLIE_ESTATE);
    assert_int_equal(collie_comm_rank_map(NULL, map, 2), COLLIE_EINVAL);
    int32_t x = 1, y = 0;
    collie_work *ar;
    assert_int_equal(collie_allreduce(w.c[0], &x, &y, 1, COLLIE_INT32, COLLIE_SUM, NULL, &ar),
                     COLLIE_OK);
    assert_int_equal(collie_comm_work_comm(ar, &out), COLLIE_EINVAL);
    assert_null(out);
    int s;
    assert_int_equal(one_allreduce(w.c[1], 1, &s), 0 + 1 + 1 + 1); /* 1 + (1 + 1) */
    assert_int_equal(s, COLLIE_OK);
    assert_int_equal(collie_work_wait(ar, 10000), COLLIE_OK);
    assert_int_equal(y, 3);
    collie_work_release(ar);
    world_destroy(&w);
    /* a comm that was never created */
    store_fx fx;
    fx_start(&fx, NULL, NULL);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "shr_never";
    o.create_timeout_ms = 200;
    collie_comm *c;
    collie_work *cw;
    assert_int_equal(collie_comm_create_post(fx.e, fx.st, 0, 2, &o, &c, &cw), COLLIE_OK);
    assert_int_equal(collie_work_wait(cw, 5000), COLLIE_ETIMEDOUT);
    collie_work_release(cw);
    assert_int_equal(collie_comm_shrink(c, NULL, &out), COLLIE_ESTATE);
    assert_non_null(strstr(collie_last_error(), "never created"));
    collie_comm_destroy(c);
    fx_stop(&fx);
}

static void test_shrink_absent_rank(void **state) {
    (void)state;
    world w;
    world_create_one_left(&w, 3, "sha");
    collie_shrink_opts so = COLLIE_SHRINK_OPTS_INIT;
    so.timeout_ms = 300;
    collie_comm *nc[WORLD_MAX] = {0};
    int st[WORLD_MAX];
    const int alone[] = {0}, out[] = {1, 2};
    int64_t t0 = now_ms();
    shrink_ranks(&w, alone, 1, &so, nc, st);
    assert_int_equal(st[0], COLLIE_OK);
    assert_true(now_ms() - t0 >= 250); /* it waited for rank 1 until the deadline */
    check_shrunk(nc, alone, 1, 3);
    check_agreed(w.c[0], out, 2, COLLIE_FAULT_PEER_STUCK);
    /* rank 1 is told */
    assert_true(pop_event_kind(w.c[1], COLLIE_EVENT_EXCLUDED, 5000));
    int s;
    one_allreduce(w.c[1], 1, &s);
    assert_int_equal(s, COLLIE_ENOTMEMBER);
    assert_non_null(strstr(collie_last_error(), "left out"));
    collie_comm *late = (collie_comm *)1;
    assert_int_equal(collie_comm_shrink(w.c[1], NULL, &late), COLLIE_ENOTMEMBER);
    assert_null(late);
    assert_int_equal(collie_comm_destroy(nc[0]), COLLIE_OK);
    world_destroy(&w);
}

/* the world's ranks create comm `name` again on the same store (the
 * world's own comms were destroyed) */
static void recreate(world *w, const char *name) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    collie_work *cw[WORLD_MAX];
    for (int r = 0; r < w->n; r++)
        assert_int_equal(collie_comm_create_post(w->e, w->st[r], r, w->n, &o, &w->c[r], &cw[r]),
                         COLLIE_OK);
    for (int r = 0; r < w->n; r++) {
        assert_int_equal(collie_work_wait(cw[r], 20000), COLLIE_OK);
        collie_work_release(cw[r]);
    }
}

static void test_shrink_cycle(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "shc", NULL);
    for (int round = 0; round < 2; round++) {
        if (round) recreate(&w, "shc");
        assert_int_equal(collie_comm_generation(w.c[0]), (uint64_t)round);
        world_link(&w);
        assert_int_equal(collie_comm_destroy(w.c[2]), COLLIE_OK);
        w.c[2] = NULL;
        for (int r = 0; r < 2; r++)
            assert_true(wait_state(w.c[r], 2, COLLIE_PEER_LEFT, 5000));
        collie_comm *nc[WORLD_MAX] = {0};
        int st[WORLD_MAX];
        const int alive[] = {0, 1};
        shrink_ranks(&w, alive, 2, NULL, nc, st);
        assert_int_equal(st[0], COLLIE_OK);
        assert_int_equal(st[1], COLLIE_OK);
        char want[32];
        snprintf(want, sizeof want, "shc.shr%d", round);
        assert_string_equal(collie_comm_name(nc[0]), want);
        assert_int_equal(collie_comm_generation(nc[0]), 0);
        check_shrunk(nc, alive, 2, 3);
        /* and grow back: a joiner as rank 2 */
        collie_work *gw[3];
        collie_comm *big[3];
        int gs[3];
        collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
        go.rank = 2;
        assert_int_equal(collie_comm_join_post(w.e, w.st[2], "shc", &go, NULL, &gw[2]), COLLIE_OK);
        for (int r = 0; r < 2; r++)
            assert_int_equal(collie_comm_grow_post(nc[r], NULL, NULL, &gw[r]), COLLIE_OK);
        for (int r = 0; r < 3; r++) {
            gs[r] = collie_work_wait(gw[r], 20000);
            assert_int_equal(gs[r], COLLIE_OK);
            assert_int_equal(collie_comm_work_comm(gw[r], &big[r]), COLLIE_OK);
            collie_work_release(gw[r]);
            assert_int_equal(collie_comm_rank(big[r]), r);
            assert_int_equal(collie_comm_size(big[r]), 3);
        }
        snprintf(want, sizeof want, "shc.shr%d.gr0", round);
        assert_string_equal(collie_comm_name(big[2]), want);
        for (int r = 0; r < 3; r++)
            assert_int_equal(collie_comm_destroy(big[r]), COLLIE_OK);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(collie_comm_destroy(nc[r]), COLLIE_OK);
            collie_comm_destroy(w.c[r]);
            w.c[r] = NULL;
        }
    }
    world_destroy(&w);
}

/* The store lived in a process that is gone (here: its server destroyed):
 * shrink fails at once with EPEER saying it needs a store that outlives
 * the ranks. */
static void test_shrink_store_gone(void **state) {
    (void)state;
    world w;
    world_create_one_left(&w, 3, "shs");
    collie_store_server_destroy(w.srv);
    w.srv = NULL;
    collie_comm *nc = (collie_comm *)1;
    int64_t t0 = now_ms();
    assert_int_equal(collie_comm_shrink(w.c[0], NULL, &nc), COLLIE_EPEER);
    assert_true(now_ms() - t0 < 5000);
    assert_null(nc);
    print_message("%s\n", collie_last_error());
    assert_non_null(strstr(collie_last_error(), "outlives the ranks"));
    world_destroy(&w);
}

/* A desync report on a shrunk comm says how the comm was made (its ranks
 * are new): rank 2 of the new comm never posts. */
static void test_shrink_desync_names_the_line(void **state) {
    (void)state;
    world w;
    world_create_one_left(&w, 4, "shd");
    collie_comm *nc[WORLD_MAX] = {0};
    int st[WORLD_MAX];
    const int alive[] = {0, 1, 2};
    shrink_ranks(&w, alive, 3, NULL, nc, st);
    int32_t v[2] = {1, 2}, out[2];
    collie_work *wk[2];
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 300;
    for (int r = 0; r < 2; r++)
        assert_int_equal(
            collie_allreduce(nc[r], &v[r], &out[r], 1, COLLIE_INT32, COLLIE_SUM, &po, &wk[r]),
            COLLIE_OK);
    for (int r = 0; r < 2; r++) {
        int s = collie_work_wait(wk[r], 10000);
        assert_true(s == COLLIE_ETIMEDOUT || s == COLLIE_EABORTED);
        if (s == COLLIE_ETIMEDOUT) {
            print_message("%s\n", collie_work_error_message(wk[r]));
            assert_non_null(strstr(collie_work_error_message(wk[r]),
                                   "was made by a shrink of 'shd' generation 0"));
        }
        collie_work_release(wk[r]);
    }
    for (int r = 0; r < 3; r++)
        collie_comm_destroy(nc[r]);
    world_destroy(&w);
}

/* Members calling different things: rank 3 left; ranks 0 and 1 shrink
 * while rank 2 calls grow. Rank 2's grow waits for rank 0's plan and ends
 * at its deadline; ranks 0 and 1 leave rank 2 out at theirs (it never
 * proposed) and get a comm of two; rank 2 is then told it is out. */
static void test_shrink_members_call_different_things(void **state) {
    (void)state;
    world w;
    world_create_one_left(&w, 4, "shm");
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = 400;
    collie_work *gw;
    assert_int_equal(collie_comm_grow_post(w.c[2], &go, NULL, &gw), COLLIE_OK);
    collie_shrink_opts so = COLLIE_SHRINK_OPTS_INIT;
    so.timeout_ms = 400;
    collie_comm *nc[WORLD_MAX] = {0};
    int st[WORLD_MAX];
    const int two[] = {0, 1}, out[] = {2, 3};
    shrink_ranks(&w, two, 2, &so, nc, st);
    assert_int_equal(st[0], COLLIE_OK);
    assert_int_equal(st[1], COLLIE_OK);
    check_shrunk(nc, two, 2, 4);
    check_agreed(w.c[0], out, 2, COLLIE_FAULT_PEER_STUCK);
    assert_int_equal(collie_work_wait(gw, 10000), COLLIE_ETIMEDOUT);
    print_message("%s\n", collie_work_error_message(gw));
    collie_work_release(gw);
    assert_true(pop_event_kind(w.c[2], COLLIE_EVENT_EXCLUDED, 5000));
    int s;
    one_allreduce(w.c[2], 2, &s);
    assert_int_equal(s, COLLIE_ENOTMEMBER);
    for (int r = 0; r < 2; r++)
        assert_int_equal(collie_comm_destroy(nc[r]), COLLIE_OK);
    world_destroy(&w);
}

/* ---- the backend's shrink hook --------------------------------------------------------- */

static struct {
    _Atomic int calls;
    _Atomic bool decline; /* ENOTSUP, else build with tcp's init */
    _Atomic int bad;      /* calls whose old state or set was wrong */
    int want[WORLD_MAX], nwant;
} hook;

static int hook_shrink(collie_bcomm *bc, const collie_core_services *core, void *old,
                       const int *excluded, int nexcluded, void **state) {
    bool ok = old != NULL && nexcluded == hook.nwant;
    for (int i = 0; ok && i < nexcluded; i++)
        ok = excluded[i] == hook.want[i];
    if (!ok) atomic_fetch_add(&hook.bad, 1);
    atomic_fetch_add(&hook.calls, 1);
    if (atomic_load(&hook.decline)) return COLLIE_ENOTSUP;
    return cl_tcp_backend_ops()->init(bc, core, state);
}

/* shrink the new comms of the ranks in alive[] (old ranks of nc), the ranks
 * of `gone` having left; the hook expects `gone` */
static void hook_round(collie_comm **nc, int old_size, const int *alive, int n, const int *gone,
                       int ngone, bool decline) {
    world w = {.n = old_size};
    for (int r = 0; r < old_size; r++)
        w.c[r] = nc[r];
    for (int i = 0; i < ngone; i++)
        hook.want[i] = gone[i];
    hook.nwant = ngone;
    atomic_store(&hook.decline, decline);
    atomic_store(&hook.calls, 0);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < ngone; k++)
            assert_true(wait_state(nc[alive[i]], gone[k], COLLIE_PEER_LEFT, 5000));
    collie_comm *out[WORLD_MAX] = {0};
    int st[WORLD_MAX];
    shrink_ranks(&w, alive, n, NULL, out, st);
    for (int i = 0; i < n; i++)
        assert_int_equal(st[alive[i]], COLLIE_OK);
    assert_int_equal(atomic_load(&hook.calls), n); /* once per survivor */
    assert_int_equal(atomic_load(&hook.bad), 0);
    check_shrunk(out, alive, n, old_size);
    for (int i = 0; i < n; i++) {
        assert_int_equal(collie_comm_destroy(nc[alive[i]]), COLLIE_OK);
        nc[alive[i]] = NULL;
    }
    for (int i = 0; i < n; i++) /* the survivors' new comms, by new rank */
        nc[i] = out[alive[i]];
    for (int r = n; r < old_size; r++)
        nc[r] = NULL;
}

static void test_shrink_backend_hook(void **state) {
    (void)state;
    collie_backend_ops ops = *cl_tcp_backend_ops();
    ops.name = "tcpshr";
    ops.shrink = hook_shrink;
    assert_int_equal(collie_backend_register(&ops), COLLIE_OK);
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.backend = "tcpshr";
    world_create(&w, 4, "shh", &o);
    world_link(&w);
    collie_comm *nc[WORLD_MAX] = {0};
    for (int r = 0; r < 4; r++)
        nc[r] = w.c[r];
    /* 4 -> 3: rank 1 leaves; the hooks decline, a fresh init */
    assert_int_equal(collie_comm_destroy(nc[1]), COLLIE_OK);
    nc[1] = NULL;
    const int alive3[] = {0, 2, 3}, gone3[] = {1};
    hook_round(nc, 4, alive3, 3, gone3, 1, true);
    /* 3 -> 2: new rank 2 (old 3) leaves; the hooks build the comms */
    world_link(&(world){.n = 3, .c = {nc[0], nc[1], nc[2]}});
    assert_int_equal(collie_comm_destroy(nc[2]), COLLIE_OK);
    nc[2] = NULL;
    const int alive2[] = {0, 1}, gone2[] = {2};
    hook_round(nc, 3, alive2, 2, gone2, 1, false);
    for (int r = 0; r < 2; r++)
        assert_int_equal(collie_comm_destroy(nc[r]), COLLIE_OK);
    for (int r = 0; r < 4; r++)
        w.c[r] = NULL; /* destroyed above */
    world_destroy(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_after_leave),
        cmocka_unit_test(test_shrink_refused),
        cmocka_unit_test(test_shrink_absent_rank),
        cmocka_unit_test(test_shrink_cycle),
        cmocka_unit_test(test_shrink_store_gone),
        cmocka_unit_test(test_shrink_desync_names_the_line),
        cmocka_unit_test(test_shrink_members_call_different_things),
        cmocka_unit_test(test_shrink_backend_hook),
    };
    return cltest_main(tests, NULL, NULL);
}
