/*
 * test_collv.c — allgatherv and alltoallv over the TCP transport: uneven
 * and zero counts, packed and scattered displacements, in place, world
 * sizes 1 to 4, every result compared byte for byte with what each rank
 * sent (and the gaps between blocks untouched); invalid arguments refused
 * with a message and no work; ranks that disagree on the counts fail with
 * COLLIE_EPROTO naming both; the count arrays copied at the call; a rank
 * that never posts ends in the deadline. Ranks live in this process (one
 * engine drives them all).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_fixture.h"
#include "harness.h"
#include "runner.h"

#define WAIT_MS 20000
#define POISON  0x5A

/* The byte j of element i that rank r sends to rank p (p < 0: allgatherv,
 * the same to every rank). Any byte pattern: the v collectives only move
 * bytes. */
static uint8_t pattern(int r, int p, size_t i, size_t j) {
    uint64_t x = ((uint64_t)(r + 1) * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)(p + 2) << 40) ^
                 (i * 0xff51afd7ed558ccdULL) ^ j;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ULL;
    return (uint8_t)(x >> 32);
}

static void fill(uint8_t *buf, size_t count, size_t es, int r, int p) {
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < es; j++)
            buf[i * es + j] = pattern(r, p, i, j);
}

/* count elements at buf are what rank `from` sent to `to` */
static bool holds(const uint8_t *buf, size_t count, size_t es, int from, int to) {
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < es; j++)
            if (buf[i * es + j] != pattern(from, to, i, j)) return false;
    return true;
}

/* Every byte of [buf + from, buf + to) still has the poison. */
static bool untouched(const uint8_t *buf, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (buf[i] != POISON) return false;
    return true;
}

/* Displacements: packed (NULL), or scattered: blocks in reverse rank order
 * with a gap of 3 elements before each. *end gets the buffer length in
 * elements. */
static const size_t *layout(const size_t *cnt, int n, bool scattered, size_t *dsp, size_t *end) {
    size_t at = 0;
    if (!scattered) {
        for (int p = 0; p < n; p++)
            at += cnt[p];
        *end = at;
        return NULL;
    }
    for (int p = n - 1; p >= 0; p--) {
        at += 3;
        dsp[p] = at;
        at += cnt[p];
    }
    *end = at + 3;
    return dsp;
}

static void wait_all(world *w, collie_work **ws) {
    for (int r = 0; r < w->n; r++) {
        int res = collie_work_wait(ws[r], WAIT_MS);
        if (res != COLLIE_OK)
            fail_msg("rank %d: %s (%s)", r, collie_strerror(res), collie_work_error_message(ws[r]));
        collie_work_release(ws[r]);
    }
}

/* ---- allgatherv ------------------------------------------------------------ */

typedef enum { CNT_UNEVEN, CNT_ZEROS, CNT_ALL_ZERO, CNT_ONE_LARGE } cnt_pattern;

static size_t gv_count(cnt_pattern pat, int p) {
    switch (pat) {
    case CNT_UNEVEN: return (size_t)p * 3 + 1;
    case CNT_ZEROS: return p % 2 ? 0 : (size_t)5 + (size_t)p;
    case CNT_ALL_ZERO: return 0;
    default: return p == 0 ? 70000 : 1;
    }
}

static void allgatherv_case(world *w, collie_dtype dt, cnt_pattern pat, bool scattered,
                            bool inplace) {
    int n = w->n;
    size_t es = collie_dtype_size(dt), cnt[WORLD_MAX], dspv[WORLD_MAX], end;
    for (int p = 0; p < n; p++)
        cnt[p] = gv_count(pat, p);
    const size_t *dsp = layout(cnt, n, scattered, dspv, &end);
    size_t off[WORLD_MAX], at = 0;
    for (int p = 0; p < n; p++) {
        off[p] = dsp ? dsp[p] : at;
        at += cnt[p];
    }
    uint8_t *send[WORLD_MAX], *recv[WORLD_MAX];
    collie_work *ws[WORLD_MAX];
    for (int r = 0; r < n; r++) {
        recv[r] = malloc(end * es + 1);
        send[r] = malloc(cnt[r] * es + 1);
        assert_non_null(recv[r]);
        assert_non_null(send[r]);
        memset(recv[r], POISON, end * es + 1);
        uint8_t *src = inplace ? recv[r] + off[r] * es : send[r];
        fill(src, cnt[r], es, r, -1);
    }
    for (int r = 0; r < n; r++) {
        const void *s = inplace ? recv[r] + off[r] * es : send[r];
        int res = collie_allgatherv(w->c[r], s, recv[r], cnt, dsp, dt, NULL, &ws[r]);
        if (res != COLLIE_OK) fail_msg("allgatherv rank %d: %s", r, collie_last_error());
    }
    wait_all(w, ws);
    for (int r = 0; r < n; r++) {
        size_t prev_end = 0;
        for (int q = n - 1; q >= 0 && scattered; q--) { /* gaps, in layout order */
            if (!untouched(recv[r], prev_end * es, off[q] * es))
                fail_msg("allgatherv %s n=%d: rank %d: the gap before block %d was written",
                         collie_dtype_name(dt), n, r, q);
            prev_end = off[q] + cnt[q];
        }
        for (int q = 0; q < n; q++)
            if (!holds(recv[r] + off[q] * es, cnt[q], es, q, -1))
                fail_msg("allgatherv %s n=%d pattern %d%s%s: rank %d: block %d is wrong",
                         collie_dtype_name(dt), n, (int)pat, scattered ? " scattered" : "",
                         inplace ? " in place" : "", r, q);
        assert_true(untouched(recv[r], end * es, end * es + 1));
        free(send[r]);
        free(recv[r]);
    }
}

static void allgatherv_world(int n) {
    world w;
    char name[32];
    snprintf(name, sizeof name, "gv%d", n);
    world_create(&w, n, name, NULL);
    static const collie_dtype dts[] = {COLLIE_FP32, COLLIE_INT8, COLLIE_FP64, COLLIE_BF16};
    int cases = 0;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (int pat = CNT_UNEVEN; pat <= CNT_ONE_LARGE; pat++)
            for (int sc = 0; sc < 2; sc++)
                for (int ip = 0; ip < 2; ip++, cases++)
                    allgatherv_case(&w, dts[d], (cnt_pattern)pat, sc, ip);
    print_message("allgatherv, world %d: %d cases checked\n", n, cases);
    world_destroy(&w);
}

static void test_allgatherv(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++)
        allgatherv_world(n);
}

/* ---- alltoallv ------------------------------------------------------------- */

/* Elements rank r sends to rank p: uneven, some zero; `scale` makes them
 * large. */
static size_t av_count(int r, int p, size_t scale) { return (size_t)((r * 7 + p * 3) % 5) * scale; }

static void alltoallv_case(world *w, collie_dtype dt, size_t scale, bool scattered) {
    int n = w->n;
    size_t es = collie_dtype_size(dt);
    uint8_t *send[WORLD_MAX], *recv[WORLD_MAX];
    size_t sc[WORLD_MAX][WORLD_MAX], rc[WORLD_MAX][WORLD_MAX];
    size_t sdv[WORLD_MAX][WORLD_MAX], rdv[WORLD_MAX][WORLD_MAX], send_end[WORLD_MAX],
        recv_end[WORLD_MAX];
    const size_t *sd[WORLD_MAX], *rd[WORLD_MAX];
    collie_work *ws[WORLD_MAX];
    for (int r = 0; r < n; r++) {
        for (int p = 0; p < n; p++) {
            sc[r][p] = av_count(r, p, scale);
            rc[r][p] = av_count(p, r, scale);
        }
        sd[r] = layout(sc[r], n, scattered, sdv[r], &send_end[r]);
        rd[r] = layout(rc[r], n, scattered, rdv[r], &recv_end[r]);
        send[r] = malloc(send_end[r] * es + 1);
        recv[r] = malloc(recv_end[r] * es + 1);
        assert_non_null(send[r]);
        assert_non_null(recv[r]);
        memset(recv[r], POISON, recv_end[r] * es + 1);
        size_t at = 0;
        for (int p = 0; p < n; p++) {
            size_t o = sd[r] ? sd[r][p] : at;
            fill(send[r] + o * es, sc[r][p], es, r, p);
            at += sc[r][p];
        }
    }
    for (int r = 0; r < n; r++) {
        int res = collie_alltoallv(w->c[r], send[r], sc[r], sd[r], recv[r], rc[r], rd[r], dt, NULL,
                                   &ws[r]);
        if (res != COLLIE_OK) fail_msg("alltoallv rank %d: %s", r, collie_last_error());
    }
    wait_all(w, ws);
    for (int r = 0; r < n; r++) {
        size_t at = 0;
        for (int p = 0; p < n; p++) {
            size_t o = rd[r] ? rd[r][p] : at;
            at += rc[r][p];
            if (!holds(recv[r] + o * es, rc[r][p], es, p, r))
                fail_msg("alltoallv %s n=%d scale %zu%s: rank %d: the block from %d is wrong",
                         collie_dtype_name(dt), n, scale, scattered ? " scattered" : "", r, p);
            if (scattered && !untouched(recv[r], (o - 3) * es, o * es))
                fail_msg("alltoallv: rank %d: the gap before the block from %d was written", r, p);
        }
        assert_true(untouched(recv[r], recv_end[r] * es, recv_end[r] * es + 1));
        free(send[r]);
        free(recv[r]);
    }
}

static void test_alltoallv(void **state) {
    (void)state;
    static const collie_dtype dts[] = {COLLIE_FP32, COLLIE_UINT8, COLLIE_INT64, COLLIE_FP16};
    for (int n = 1; n <= 4; n++) {
        world w;
        char name[32];
        snprintf(name, sizeof name, "av%d", n);
        world_create(&w, n, name, NULL);
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (int s = 0; s < 2; s++) {
                alltoallv_case(&w, dts[d], 1, s);
                alltoallv_case(&w, dts[d], 20000, s);
            }
        world_destroy(&w);
    }
}

/* ---- what is refused -------------------------------------------------------- */

static void einval(int res, const collie_work *w, const char *needle) {
    assert_int_equal(res, COLLIE_EINVAL);
    assert_null(w);
    if (!strstr(collie_last_error(), needle))
        fail_msg("collie_last_error '%s' does not say '%s'", collie_last_error(), needle);
}

/* The call (which writes wk) is refused with a message saying `needle`. */
#define expect_einval(call, needle)                                                                \
    do {                                                                                           \
        wk = (collie_work *)&wk; /* not NULL: the call must clear it */                            \
        int res_ = (call);                                                                         \
        einval(res_, wk, needle);                                                                  \
    } while (0)

static void test_invalid_arguments(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "vbad", NULL);
    collie_comm *c = w.c[1];
    float s[64], r[64];
    collie_work *wk = NULL;
    size_t cnt[3] = {2, 2, 2}, over[3] = {2, 2, 2}, odsp[3] = {0, 1, 4};
    size_t huge[3] = {1, SIZE_MAX / 2, 1}, hdsp[3] = {0, 1, SIZE_MAX / 2};
    expect_einval(collie_allgatherv(c, s, r, NULL, NULL, COLLIE_FP32, NULL, &wk), "recvcounts");
    expect_einval(collie_allgatherv(c, s, r, over, odsp, COLLIE_FP32, NULL, &wk), "overlap");
    expect_einval(collie_allgatherv(c, s, r, huge, NULL, COLLIE_FP32, NULL, &wk), "overflows");
    expect_einval(collie_allgatherv(c, s, r, cnt, hdsp, COLLIE_FP32, NULL, &wk), "overflows");
    expect_einval(collie_allgatherv(c, NULL, r, cnt, NULL, COLLIE_FP32, NULL, &wk), "send buffer");
    expect_einval(collie_allgatherv(c, s, NULL, cnt, NULL, COLLIE_FP32, NULL, &wk), "receive");
    expect_einval(collie_allgatherv(c, s, r, cnt, NULL, (collie_dtype)99, NULL, &wk), "dtype");
    expect_einval(collie_alltoallv(c, s, NULL, NULL, r, cnt, NULL, COLLIE_FP32, NULL, &wk),
                  "sendcounts");
    size_t self[3] = {2, 3, 2}; /* sends itself 3, receives 2 */
    expect_einval(collie_alltoallv(c, s, self, NULL, r, cnt, NULL, COLLIE_FP32, NULL, &wk),
                  "sends itself 3 elements but receives 2");
    expect_einval(collie_alltoallv(c, s, cnt, NULL, s, cnt, NULL, COLLIE_FP32, NULL, &wk),
                  "in-place");
    expect_einval(collie_alltoallv(c, s, cnt, NULL, r, over, odsp, COLLIE_FP32, NULL, &wk),
                  "ranks 0 (2 elements at 0) and 1 (2 elements at 1) overlap");
    /* send blocks may overlap (they are only read) */
    size_t sdsp[3] = {0, 0, 0};
    float rr[3][8];
    collie_work *ws[3];
    for (int k = 0; k < 3; k++)
        assert_int_equal(
            collie_alltoallv(w.c[k], s, cnt, sdsp, rr[k], cnt, NULL, COLLIE_FP32, NULL, &ws[k]),
            COLLIE_OK);
    wait_all(&w, ws);
    /* zero counts need no buffers */
    size_t zero[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++)
        assert_int_equal(
            collie_allgatherv(w.c[k], NULL, NULL, zero, NULL, COLLIE_FP32, NULL, &ws[k]),
            COLLIE_OK);
    wait_all(&w, ws);
    world_destroy(&w);
}

/* The arrays are the caller's again as soon as the call returns. */
static void test_arrays_copied(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "vcopy", NULL);
    size_t cnt[3][3], dsp[3][3];
    uint8_t send[3][64], recv[3][256];
    collie_work *ws[3];
    for (int r = 0; r < 3; r++) {
        for (int p = 0; p < 3; p++) {
            cnt[r][p] = (size_t)(p + 1) * 4;
            dsp[r][p] = (size_t)p * 64;
        }
        fill(send[r], cnt[r][r], 1, r, -1);
        memset(recv[r], POISON, sizeof recv[r]);
        assert_int_equal(
            collie_allgatherv(w.c[r], send[r], recv[r], cnt[r], dsp[r], COLLIE_UINT8, NULL, &ws[r]),
            COLLIE_OK);
        memset(cnt[r], 0xff, sizeof cnt[r]); /* garbage at once */
        memset(dsp[r], 0xff, sizeof dsp[r]);
    }
    wait_all(&w, ws);
    for (int r = 0; r < 3; r++)
        for (int q = 0; q < 3; q++)
            assert_true(holds(recv[r] + q * 64, (size_t)(q + 1) * 4, 1, q, -1));
    world_destroy(&w);
}

/* Ranks that disagree: the frames say so (COLLIE_EPROTO naming both ranks
 * and the collective) where a receive meets a frame that is not what it
 * posted, within the deadline; the comm is then failed. */
static void mismatch(collie_coll_kind kind) {
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.timeout_ms = 5000;
    world_create(&w, 2, kind == COLLIE_COLL_ALLGATHERV ? "gvmis" : "avmis", &o);
    float s[16] = {0}, rb[2][16];
    collie_work *ws[2];
    size_t c0[2] = {4, 4}, c1[2] = {4, 5}; /* rank 1 claims one more element of its own */
    size_t s0[2] = {4, 5}, r0[2] = {4, 4}; /* rank 0 sends 5 to rank 1 ... */
    size_t s1[2] = {4, 4}, r1[2] = {4, 4}; /* ... which expects 4 */
    if (kind == COLLIE_COLL_ALLGATHERV) {
        assert_int_equal(collie_allgatherv(w.c[0], s, rb[0], c0, NULL, COLLIE_FP32, NULL, &ws[0]),
                         0);
        assert_int_equal(collie_allgatherv(w.c[1], s, rb[1], c1, NULL, COLLIE_FP32, NULL, &ws[1]),
                         0);
    } else {
        assert_int_equal(
            collie_alltoallv(w.c[0], s, s0, NULL, rb[0], r0, NULL, COLLIE_FP32, NULL, &ws[0]), 0);
        assert_int_equal(
            collie_alltoallv(w.c[1], s, s1, NULL, rb[1], r1, NULL, COLLIE_FP32, NULL, &ws[1]), 0);
    }
    int res[2];
    bool eproto = false;
    for (int k = 0; k < 2; k++) {
        res[k] = collie_work_wait(ws[k], WAIT_MS);
        /* allgatherv: both see a count that is not theirs; alltoallv: rank
         * 1 receives a frame too long, rank 0 one saying that rank 1
         * expects fewer elements than it sends (the frame's counts check) */
        if (res[k] == COLLIE_INPROGRESS || res[k] == COLLIE_OK)
            fail_msg("%s: rank %d ended %s", collie_coll_kind_name(kind), k,
                     collie_status_name(res[k]));
        const char *m = collie_work_error_message(ws[k]);
        if (res[k] == COLLIE_EPROTO) {
            eproto = true;
            if (!strstr(m, "rank 0") || !strstr(m, "rank 1") ||
                !strstr(m, collie_coll_kind_name(kind)))
                fail_msg("%s: '%s' does not name both ranks and the collective",
                         collie_coll_kind_name(kind), m);
            if (kind == COLLIE_COLL_ALLTOALLV &&
                (!strstr(m, "(5 elements to rank 1, 4 from it)") ||
                 !strstr(m, "(4 elements to rank 0, 4 from it)") ||
                 (k == 1 && !strstr(m, "in a frame of 20 bytes where 16 were due"))))
                fail_msg("alltoallv: '%s' does not say which block was too long", m);
        }
        collie_work_release(ws[k]);
    }
    assert_true(eproto);
    for (int k = 0; k < 2; k++)
        collie_comm_abort(w.c[k], "test over");
    world_destroy(&w);
}

static void test_mismatch_is_eproto(void **state) {
    (void)state;
    mismatch(COLLIE_COLL_ALLGATHERV);
    mismatch(COLLIE_COLL_ALLTOALLV);
}

/* Counts that differ only in empty blocks: rank 0 says {0, 4}, rank 1
 * {4, 0} (allgatherv: the blocks' owners; alltoallv: what each receives,
 * nothing sent). The totals agree, and before, the block each rank thought
 * empty was no message at all: both waited for the other's 4 elements
 * until the deadline. Now every pair that should talk exchanges a frame
 * (zero-length for an empty block) carrying a check of the counts, so
 * the disagreement is seen within a round trip: well under a second
 * against a 3 s deadline, COLLIE_EPROTO on the rank that read it (each
 * reads one; the other may learn it from the first's abort notice first:
 * EABORTED), and the whole message, naming both ranks and both posts, on
 * both. */
static void empty_block_mismatch(collie_coll_kind kind) {
    enum { DEADLINE_MS = 3000 };
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = kind == COLLIE_COLL_ALLGATHERV ? "gvempty" : "avempty";
    o.timeout_ms = DEADLINE_MS;
    world_create(&w, 2, o.name, &o);
    float s[8] = {0}, rb[2][8];
    size_t cnt[2][2] = {{0, 4}, {4, 0}}, none[2] = {0, 0};
    collie_work *ws[2];
    int64_t t0 = now_ms();
    for (int r = 0; r < 2; r++)
        if (kind == COLLIE_COLL_ALLGATHERV)
            assert_int_equal(
                collie_allgatherv(w.c[r], s, rb[r], cnt[r], NULL, COLLIE_FP32, NULL, &ws[r]), 0);
        else
            assert_int_equal(collie_alltoallv(w.c[r], s, none, NULL, rb[r], cnt[r], NULL,
                                              COLLIE_FP32, NULL, &ws[r]),
                             0);
    int eproto = 0;
    for (int r = 0; r < 2; r++) {
        int rc = collie_work_wait(ws[r], WAIT_MS);
        const char *m = collie_work_error_message(ws[r]);
        print_message("%s rank %d: %s: %s\n", collie_coll_kind_name(kind), r,
                      collie_status_name(rc), m);
        if (rc != COLLIE_EPROTO && rc != COLLIE_EABORTED)
            fail_msg("%s: rank %d ended %s: %s", collie_coll_kind_name(kind), r,
                     collie_status_name(rc), m);
        eproto += rc == COLLIE_EPROTO;
        /* both ranks and both posts: allgatherv, the reader's counts and
         * that the other's differ; alltoallv, both sides of the pair */
        bool posts = strstr(m, "rank 0 posted") && strstr(m, "rank 1 posted");
        bool counts = kind == COLLIE_COLL_ALLGATHERV
                          ? (strstr(m, "with counts {0, 4}") || strstr(m, "with counts {4, 0}")) &&
                                strstr(m, "with other counts")
                          : strstr(m, "(0 elements to rank 0, 4 from it)") &&
                                strstr(m, "(0 elements to rank 1, 4 from it)");
        if (!strstr(m, "mismatched collectives at seq 1") || !posts || !counts)
            fail_msg("%s, rank %d: not the whole mismatch: %s", collie_coll_kind_name(kind), r, m);
        collie_work_release(ws[r]);
    }
    int64_t took = now_ms() - t0;
    print_message("%s: both ranks failed within %lld ms (deadline %d ms)\n",
                  collie_coll_kind_name(kind), (long long)took, DEADLINE_MS);
    assert_true(eproto >= 1);
    assert_true(took < 1000);
    for (int k = 0; k < 2; k++)
        collie_comm_abort(w.c[k], "test over");
    world_destroy(&w);
}

static void test_empty_block_mismatch_found_at_once(void **state) {
    (void)state;
    empty_block_mismatch(COLLIE_COLL_ALLGATHERV);
    empty_block_mismatch(COLLIE_COLL_ALLTOALLV);
}

/* A rank that never posts: the others' alltoallv ends in its deadline. */
static void test_deadline(void **state) {
    (void)state;
    world w;
    world_create(&w, 3, "vtmo", NULL);
    float s[8] = {0}, rb[2][8];
    size_t cnt[3] = {2, 2, 2};
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 200;
    collie_work *ws[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(
            collie_alltoallv(w.c[k], s, cnt, NULL, rb[k], cnt, NULL, COLLIE_FP32, &po, &ws[k]), 0);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(collie_work_wait(ws[k], WAIT_MS), COLLIE_ETIMEDOUT);
        collie_work_release(ws[k]);
    }
    for (int k = 0; k < 3; k++)
        collie_comm_abort(w.c[k], "test over");
    world_destroy(&w);
    assert_string_equal(collie_stats_op_name(COLLIE_COLL_ALLGATHERV), "allgatherv");
    assert_string_equal(collie_stats_op_name(COLLIE_COLL_ALLTOALLV), "alltoallv");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_arrays_copied),
        cmocka_unit_test(test_mismatch_is_eproto),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_empty_block_mismatch_found_at_once),
    };
    return cltest_main(tests, NULL, NULL);
}
