/*
 * test_races.c — every ender of a collective racing every other, in one
 * process (two ranks on one engine, coll_fixture.h): completions on the
 * progress thread, collie_work_cancel and collie_work_wait with tiny
 * timeouts from other threads, collie_work_test polling, collie_comm_abort,
 * and deadlines of a few milliseconds. Checked each time: every work ends
 * (bounded), its callback runs exactly once, it appears exactly once in its
 * completion queue, a work that returned OK holds the right bytes, its
 * result never changes once seen, and the comm's stats add up (posted =
 * completed + failed, by status) as soon as every wait returned.
 *
 * Every wait is bounded; every loop has a fixed number of turns or a
 * deadline.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "engine/engine.h"
#include "harness.h"
#include "runner.h"

enum { NR = 2, K = 128, MAXCOUNT = 4096 };

typedef struct rec {
    _Atomic int cb_calls;
    _Atomic int cb_status;
    int cq_seen;
    int seen_status; /* the first result a racer saw: INPROGRESS until then */
    _Atomic int seen_lock;
} rec;

typedef struct race {
    world w;
    collie_cq *cq[NR];
    collie_work *wk[NR][K];
    _Atomic bool posted[NR][K];
    int32_t *buf[NR][K];
    size_t count[NR][K];
    rec recs[NR][K];
    _Atomic bool stop;
    _Atomic bool all_posted;    /* race_post returned */
    _Atomic bool comm_gone[NR]; /* destroyed by a racer (mode 3) */
    _Atomic bool engine_gone;   /* destroyed by a racer (mode 4) */
    _Atomic int changed;        /* a result that changed after it was seen */
    collie_comm_stats base[NR]; /* after world_link */
    unsigned seed;
    /* 0: cancels, 1: cancels + abort, 2: tiny deadlines, 3: cancels +
     * a comm destroyed, 4: cancels + the engine destroyed */
    int mode;
} race;

static void on_done(collie_work *w, void *arg) {
    rec *r = arg;
    atomic_fetch_add(&r->cb_calls, 1);
    atomic_store(&r->cb_status, collie_work_result(w));
}

/* a racer saw `st` (not INPROGRESS): the first sighting is kept, a later
 * different one counted */
static void saw(race *rc, int r, int k, int st) {
    if (st == COLLIE_INPROGRESS) return;
    rec *re = &rc->recs[r][k];
    while (atomic_exchange(&re->seen_lock, 1))
        ;
    if (re->seen_status == COLLIE_INPROGRESS)
        re->seen_status = st;
    else if (re->seen_status != st)
        atomic_fetch_add(&rc->changed, 1);
    atomic_store(&re->seen_lock, 0);
}

typedef struct racer {
    race *rc;
    int role;
    unsigned seed;
} racer;

static void *racer_main(void *arg) {
    racer *ra = arg;
    race *rc = ra->rc;
    int64_t until = cl_now_ns() + 3000 * CL_NS_PER_MS;
    for (int turn = 0; turn < 20000 && !atomic_load(&rc->stop) && cl_now_ns() < until; turn++) {
        int r = rand_r(&ra->seed) % NR, k = rand_r(&ra->seed) % K;
        if (!atomic_load(&rc->posted[r][k])) continue;
        collie_work *w = rc->wk[r][k];
        switch (ra->role) {
        case 0: /* cancel now and then */
            if (rand_r(&ra->seed) % 512 == 0) collie_work_cancel(w);
            saw(rc, r, k, collie_work_result(w));
            break;
        case 1: /* wait a moment */
            saw(rc, r, k, collie_work_wait(w, rand_r(&ra->seed) % 3));
            break;
        case 2: /* poll */
            if (collie_work_test(w)) saw(rc, r, k, collie_work_result(w));
            break;
        case 3: /* abort once, a little later */
            if (turn == 200 + (int)(ra->seed % 4000)) collie_comm_abort(rc->w.c[r], "racer abort");
            saw(rc, r, k, collie_work_result(w));
            break;
        case 4: /* destroy a comm once every post is made */
            if (atomic_load(&rc->all_posted) && !atomic_load(&rc->comm_gone[r]) &&
                turn > (int)(ra->seed % 3000)) {
                collie_comm_destroy(rc->w.c[r]);
                atomic_store(&rc->comm_gone[r], true);
            }
            saw(rc, r, k, collie_work_result(w));
            break;
        case 5: /* destroy the engine once every post is made */
            if (atomic_load(&rc->all_posted) && !atomic_load(&rc->engine_gone) &&
                turn > (int)(ra->seed % 3000)) {
                assert_int_equal(collie_engine_destroy(rc->w.e), COLLIE_OK);
                atomic_store(&rc->engine_gone, true);
            }
            saw(rc, r, k, collie_work_result(w));
            break;
        }
    }
    return NULL;
}

static void race_post(race *rc) {
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < NR; r++) {
            size_t cnt = 1 + (size_t)rand_r(&rc->seed) % MAXCOUNT;
            if (r > 0) cnt = rc->count[0][k];
            rc->count[r][k] = cnt;
            rc->buf[r][k] = malloc(cnt * sizeof(int32_t));
            for (size_t i = 0; i < cnt; i++)
                rc->buf[r][k][i] = (int32_t)(r * 100000 + k * 10 + (int)(i % 7));
            po.cb = on_done;
            po.cb_arg = &rc->recs[r][k];
            po.cq = rc->cq[r];
            po.tag = (uint64_t)(r * K + k);
            po.timeout_ms = rc->mode == 2 ? 1 + rand_r(&rc->seed) % 20 : 20000;
            rc->recs[r][k].seen_status = COLLIE_INPROGRESS;
            int st = collie_allreduce(rc->w.c[r], rc->buf[r][k], rc->buf[r][k], cnt, COLLIE_INT32,
                                      COLLIE_SUM, &po, &rc->wk[r][k]);
            atomic_store(&rc->posted[r][k], st == COLLIE_OK);
            if (st != COLLIE_OK) assert_null(rc->wk[r][k]);
        }
}

static void race_check(race *rc) {
    int64_t cb_until = cl_now_ns() + 20000 * CL_NS_PER_MS;
    for (int r = 0; r < NR; r++) {
        uint64_t ok = 0, failed = 0, posted = 0, by_status[COLLIE_STATS_STATUSES] = {0};
        for (int k = 0; k < K; k++) {
            if (!rc->posted[r][k]) continue;
            posted++;
            collie_work *w = rc->wk[r][k];
            int st = collie_work_wait(w, 30000);
            if (st == COLLIE_INPROGRESS) fail_msg("rank %d work %d never ended", r, k);
            saw(rc, r, k, st);
            if (st == COLLIE_OK) {
                ok++;
                for (size_t i = 0; i < rc->count[r][k]; i++) {
                    int32_t want = 0;
                    for (int q = 0; q < NR; q++)
                        want += (int32_t)(q * 100000 + k * 10 + (int)(i % 7));
                    if (rc->buf[r][k][i] != want)
                        fail_msg("rank %d work %d returned OK with element %zu = %d, not %d", r, k,
                                 i, rc->buf[r][k][i], want);
                }
            } else {
                failed++;
                int i = -st;
                if (i <= 0 || i >= COLLIE_STATS_STATUSES) i = COLLIE_STATS_STATUSES - 1;
                by_status[i]++;
                assert_true(strlen(collie_work_error_message(w)) > 0);
            }
        }
        if (getenv("RACE_VERBOSE"))
            fprintf(stderr, "mode %d rank %d: posted %llu ok %llu failed %llu\n", rc->mode, r,
                    (unsigned long long)posted, (unsigned long long)ok, (unsigned long long)failed);
        /* counted before any wait could return (stats.c) */
        if (atomic_load(&rc->comm_gone[r])) continue; /* no stats to read */
        collie_comm_stats s = comm_stats(rc->w.c[r]);
        s.posted -= rc->base[r].posted;
        s.completed -= rc->base[r].completed;
        s.failed -= rc->base[r].failed;
        for (int i = 0; i < COLLIE_STATS_STATUSES; i++)
            s.failed_by_status[i] -= rc->base[r].failed_by_status[i];
        if (s.posted != posted || s.completed != ok || s.failed != failed || s.in_flight != 0)
            fail_msg("rank %d stats: posted %llu completed %llu failed %llu in_flight %llu; "
                     "the waits saw posted %llu ok %llu failed %llu",
                     r, (unsigned long long)s.posted, (unsigned long long)s.completed,
                     (unsigned long long)s.failed, (unsigned long long)s.in_flight,
                     (unsigned long long)posted, (unsigned long long)ok,
                     (unsigned long long)failed);
        for (int i = 0; i < COLLIE_STATS_STATUSES; i++)
            if (s.failed_by_status[i] != by_status[i])
                fail_msg("rank %d stats: failed_by_status[%d] %llu, the waits saw %llu", r, i,
                         (unsigned long long)s.failed_by_status[i],
                         (unsigned long long)by_status[i]);
        /* callbacks: exactly once each, with the work's result */
        for (int k = 0; k < K; k++) {
            if (!rc->posted[r][k]) continue;
            while (atomic_load(&rc->recs[r][k].cb_calls) == 0 && cl_now_ns() < cb_until)
                usleep(200);
        }
        /* the completion queue: every work once, no other */
        for (int n = 0; n < 4 * K; n++) {
            collie_work *got;
            if (collie_cq_pop(rc->cq[r], n < (int)posted ? 5000 : 0, &got) != COLLIE_OK) break;
            uint64_t tag = collie_work_tag(got);
            if (tag < (uint64_t)(r * K) || tag >= (uint64_t)(r * K + K))
                fail_msg("rank %d's queue holds tag %llu", r, (unsigned long long)tag);
            rc->recs[r][tag - (uint64_t)(r * K)].cq_seen++;
            collie_work_release(got);
        }
        for (int k = 0; k < K; k++) {
            if (!rc->posted[r][k]) continue;
            rec *re = &rc->recs[r][k];
            int res = collie_work_result(rc->wk[r][k]);
            if (atomic_load(&re->cb_calls) != 1)
                fail_msg("rank %d work %d: callback ran %d times", r, k,
                         atomic_load(&re->cb_calls));
            if (atomic_load(&re->cb_status) != res)
                fail_msg("rank %d work %d: callback saw %d, the work says %d", r, k,
                         atomic_load(&re->cb_status), res);
            if (re->cq_seen != 1)
                fail_msg("rank %d work %d: %d times in the completion queue", r, k, re->cq_seen);
            if (re->seen_status != res)
                fail_msg("rank %d work %d: seen as %d, now %d", r, k, re->seen_status, res);
        }
    }
    assert_int_equal(atomic_load(&rc->changed), 0);
}

static void race_free(race *rc) {
    for (int r = 0; r < NR; r++) {
        for (int k = 0; k < K; k++) {
            if (rc->posted[r][k]) collie_work_release(rc->wk[r][k]);
            free(rc->buf[r][k]);
        }
    }
    for (int r = 0; r < NR; r++) {
        if (!atomic_load(&rc->comm_gone[r]))
            collie_comm_destroy(rc->w.c[r]); /* OK, or EABORTED after an abort */
        collie_store_destroy(rc->w.st[r]);
    }
    for (int r = 0; r < NR; r++)
        collie_cq_destroy(rc->cq[r]);
    collie_store_server_destroy(rc->w.srv);
    if (!atomic_load(&rc->engine_gone)) assert_int_equal(collie_engine_destroy(rc->w.e), COLLIE_OK);
}

static void race_round(int mode, int round) {
    race *rc = calloc(1, sizeof *rc);
    assert_non_null(rc);
    rc->mode = mode;
    rc->seed = (unsigned)(round * 7919 + mode);
    char name[32];
    snprintf(name, sizeof name, "race%d_%d", mode, round);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    o.timeout_ms = 20000;
    world_create(&rc->w, NR, name, &o);
    for (int r = 0; r < NR; r++)
        assert_int_equal(collie_cq_create(&rc->cq[r]), COLLIE_OK);
    world_link(&rc->w);
    for (int r = 0; r < NR; r++)
        rc->base[r] = comm_stats(rc->w.c[r]);
    int nroles = mode == 1 || mode >= 3 ? 4 : 3;
    pthread_t th[4];
    racer ra[4];
    for (int i = 0; i < nroles; i++) {
        ra[i] = (racer){.rc = rc, .role = i, .seed = rc->seed + 31u * (unsigned)i};
        if (mode == 2 && i == 0) ra[i].role = 2; /* deadlines end them, not cancels */
        if (mode >= 3 && i == 3) ra[i].role = mode + 1;
        assert_int_equal(pthread_create(&th[i], NULL, racer_main, &ra[i]), 0);
    }
    race_post(rc); /* while the racers run */
    atomic_store(&rc->all_posted, true);
    for (int i = 0; i < nroles; i++)
        pthread_join(th[i], NULL);
    race_check(rc);
    race_free(rc);
    free(rc);
}

static int rounds(void) {
    const char *e = getenv("RACE_ROUNDS");
    if (e) return atoi(e);
    return getenv("CLTEST_QUICK") ? 3 : 10;
}

static void test_race_cancel_wait_test(void **state) {
    (void)state;
    for (int i = 0; i < rounds(); i++)
        race_round(0, i);
}

static void test_race_abort(void **state) {
    (void)state;
    for (int i = 0; i < rounds(); i++)
        race_round(1, i);
}

static void test_race_comm_destroy(void **state) {
    (void)state;
    for (int i = 0; i < rounds(); i++)
        race_round(3, i);
}

static void test_race_engine_destroy(void **state) {
    (void)state;
    for (int i = 0; i < rounds(); i++)
        race_round(4, i);
}

static void test_race_tiny_deadlines(void **state) {
    (void)state;
    for (int i = 0; i < rounds(); i++)
        race_round(2, i);
}

/* ---- receives from any source cancelled while a stream arrives ------------------------ */

/* Rank 0 sends NMSG numbered messages (one tag) to rank 1, which keeps
 * receives from any source posted; other threads cancel them and wait on
 * them with tiny timeouts. A cancelled receive that no message matched ends
 * clean, so: the comm stays healthy, every send completes, every message is
 * taken by exactly one receive that ended OK, in the order sent (one
 * source, one tag), and nothing else ends OK. */
enum { NMSG = 2000, NRECV = 6000 };

typedef struct p2p_race {
    world w;
    collie_work *rw[NRECV];
    int64_t rbuf[NRECV];
    _Atomic int nposted;
    _Atomic bool done;
    unsigned seed;
} p2p_race;

static void *p2p_racer(void *arg) {
    p2p_race *pr = arg;
    unsigned seed = pr->seed;
    int64_t until = cl_now_ns() + 20000 * CL_NS_PER_MS;
    for (int turn = 0; turn < 2000000 && !atomic_load(&pr->done) && cl_now_ns() < until; turn++) {
        int n = atomic_load(&pr->nposted);
        if (n == 0) continue;
        int i = n - 1 - rand_r(&seed) % (n < 8 ? n : 8); /* the newest few */
        collie_work *w = pr->rw[i];
        if (rand_r(&seed) % 2)
            collie_work_cancel(w);
        else
            collie_work_wait(w, rand_r(&seed) % 2);
    }
    return NULL;
}

typedef struct p2p_sender {
    p2p_race *pr;
    collie_work *sw[NMSG];
    int64_t sbuf[NMSG];
    int nsent;
} p2p_sender;

/* rank 0's sends, trickled: most find a receive already posted */
static void *p2p_send_main(void *arg) {
    p2p_sender *ps = arg;
    for (int m = 0; m < NMSG; m++) {
        ps->sbuf[m] = m + 1;
        if (collie_send(ps->pr->w.c[0], &ps->sbuf[m], 1, COLLIE_INT64, 1, 7, NULL, &ps->sw[m]) !=
            COLLIE_OK)
            break;
        ps->nsent = m + 1;
        if (m % 4 == 0) usleep(50);
    }
    return NULL;
}

static void p2p_race_round(int round) {
    p2p_race *pr = calloc(1, sizeof *pr);
    assert_non_null(pr);
    pr->seed = (unsigned)round * 977u + 5u;
    char name[32];
    snprintf(name, sizeof name, "p2prace%d", round);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    o.timeout_ms = 20000;
    world_create(&pr->w, 2, name, &o);
    world_link(&pr->w);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, p2p_racer, pr), 0);
    p2p_sender *ps = calloc(1, sizeof *ps);
    assert_non_null(ps);
    ps->pr = pr;
    pthread_t sth;
    assert_int_equal(pthread_create(&sth, NULL, p2p_send_main, ps), 0);
    /* keep receives posted until NMSG ended OK or NRECV were posted */
    int ok = 0, r = 0;
    int64_t until = cl_now_ns() + 30000 * CL_NS_PER_MS;
    while (r < NRECV && cl_now_ns() < until) {
        int oks = 0;
        for (int i = 0; i < r; i++)
            if (collie_work_result(pr->rw[i]) == COLLIE_OK) oks++;
        if (oks >= NMSG) break;
        int inflight = 0;
        for (int i = 0; i < r; i++)
            if (collie_work_result(pr->rw[i]) == COLLIE_INPROGRESS) inflight++;
        if (inflight >= 16) {
            collie_work_test(pr->rw[r - 1]);
            continue;
        }
        pr->rbuf[r] = -1;
        int st = collie_recv(pr->w.c[1], &pr->rbuf[r], 1, COLLIE_INT64, COLLIE_ANY_SOURCE, 7, NULL,
                             &pr->rw[r]);
        if (st != COLLIE_OK) fail_msg("recv %d refused: %s", r, collie_last_error());
        atomic_store(&pr->nposted, ++r);
    }
    atomic_store(&pr->done, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_join(sth, NULL);
    assert_int_equal(ps->nsent, NMSG);
    collie_work **sw = ps->sw;
    int comm_st;
    const char *msg;
    collie_comm_error(pr->w.c[1], &comm_st, &msg);
    if (comm_st != COLLIE_OK) fail_msg("round %d: rank 1's comm failed: %s", round, msg);
    collie_comm_error(pr->w.c[0], &comm_st, &msg);
    if (comm_st != COLLIE_OK) fail_msg("round %d: rank 0's comm failed: %s", round, msg);
    for (int m = 0; m < NMSG; m++) {
        int st = collie_work_wait(sw[m], 20000);
        if (st != COLLIE_OK)
            fail_msg("send %d: %s: %s", m, collie_status_name(st),
                     collie_work_error_message(sw[m]));
        collie_work_release(sw[m]);
    }
    /* the receives left over once every message was taken: no message
     * remains for them, so their cancel ends them (clean) */
    for (int i = 0; i < r; i++)
        if (collie_work_result(pr->rw[i]) == COLLIE_INPROGRESS) collie_work_cancel(pr->rw[i]);
    int64_t next = 1;
    int cancelled = 0;
    for (int i = 0; i < r; i++) {
        int st = collie_work_wait(pr->rw[i], 20000);
        if (st == COLLIE_OK) {
            ok++;
            if (pr->rbuf[i] != next)
                fail_msg("round %d: receive %d took message %lld, expected %lld", round, i,
                         (long long)pr->rbuf[i], (long long)next);
            next++;
        } else if (st == COLLIE_ECANCELED || st == COLLIE_ETIMEDOUT) {
            cancelled++;
            if (pr->rbuf[i] != -1)
                fail_msg("round %d: receive %d ended %s with %lld in its buffer", round, i,
                         collie_status_name(st), (long long)pr->rbuf[i]);
        } else {
            fail_msg("round %d: receive %d ended %s: %s", round, i, collie_status_name(st),
                     collie_work_error_message(pr->rw[i]));
        }
        collie_work_release(pr->rw[i]);
    }
    if (getenv("RACE_VERBOSE"))
        fprintf(stderr, "p2p round %d: %d receives, %d ok, %d cancelled\n", round, r, ok,
                cancelled);
    assert_int_equal(ok, NMSG);
    world_destroy(&pr->w);
    free(ps);
    free(pr);
}

static void test_race_recv_any_cancel(void **state) {
    (void)state;
    int n = rounds() / 2 > 0 ? rounds() / 2 : 1;
    for (int i = 0; i < n; i++)
        p2p_race_round(i);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_race_cancel_wait_test), cmocka_unit_test(test_race_abort),
        cmocka_unit_test(test_race_tiny_deadlines),   cmocka_unit_test(test_race_comm_destroy),
        cmocka_unit_test(test_race_engine_destroy),   cmocka_unit_test(test_race_recv_any_cancel),
    };
    return cltest_main(tests, NULL, NULL);
}
