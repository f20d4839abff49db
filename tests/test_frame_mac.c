/*
 * test_frame_mac.c — the TCP frame MAC (transports/cpu/frame_mac.h): a tag
 * fed in any pieces equals the one-shot tag, and every change the MAC is
 * there to catch is caught: a flipped bit anywhere in header or payload, a
 * frame under another number (dropped, replayed or reordered), in the other
 * direction, or under another connection's key; a truncated payload.
 *
 * Then the transport (tcp_conn_write.c, tcp_conn_read.c): a man in the middle between two ranks
 * (a proxy thread; rank 1's published address in the store is replaced by
 * the proxy's, as anyone who can write the store or the network could)
 * alters the stream from rank 0 to rank 1. Without a secret, or with
 * COLLIE_FRAME_MAC=0, a flipped payload byte is returned as COLLIE_OK;
 * with the MAC every alteration (a payload or header byte, a frame dropped
 * or replayed) fails the work with the MAC error, and no work returns OK
 * with wrong bytes. The setting must agree on both ends (collie-run jobs).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "coll_fixture.h"
#include "harness.h"
#include "runner.h"
#include "spawn.h"
#include "transports/cpu/frame_mac.h"
#include "transports/cpu/tcp_conn_impl.h"

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
static char self_exe[4096];

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng();
}

static const uint8_t session[32] = {7, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3,
                                    2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5};

/* the streamed tag (random pieces) equals the one-shot tag, and checks */
static void test_pieces_equal_one_shot(void **state) {
    (void)state;
    cl_frame_mac tx, rx;
    assert_true(cl_frame_mac_init(&tx, session, true));
    assert_true(cl_frame_mac_init(&rx, session, true));
    size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 4096, 100003, 1 << 20};
    uint8_t hdr[48];
    uint8_t *payload = malloc(1 << 20);
    assert_non_null(payload);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        fill(hdr, sizeof hdr);
        fill(payload, n);
        uint8_t tag[CL_FRAME_MAC_TAG];
        assert_true(cl_frame_mac_tag(&tx, k, hdr, sizeof hdr, payload, n, tag));
        for (int round = 0; round < 4; round++) {
            assert_true(cl_frame_mac_begin(&rx, k));
            size_t off = 0; /* the header in two pieces, the payload in random ones */
            assert_true(cl_frame_mac_update(&rx, hdr, 20));
            assert_true(cl_frame_mac_update(&rx, hdr + 20, sizeof hdr - 20));
            while (off < n) {
                size_t piece = 1 + rng() % (n - off < 9000 ? n - off : 9000);
                assert_true(cl_frame_mac_update(&rx, payload + off, piece));
                off += piece;
            }
            assert_true(cl_frame_mac_check(&rx, tag));
        }
    }
    free(payload);
    cl_frame_mac_fini(&tx);
    cl_frame_mac_fini(&rx);
}

/* every bit of a 48-byte header and a sample of the payload's bits */
static void test_any_flipped_bit_fails(void **state) {
    (void)state;
    cl_frame_mac m;
    assert_true(cl_frame_mac_init(&m, session, false));
    uint8_t hdr[48], payload[777], tag[CL_FRAME_MAC_TAG];
    fill(hdr, sizeof hdr);
    fill(payload, sizeof payload);
    assert_true(cl_frame_mac_tag(&m, 42, hdr, sizeof hdr, payload, sizeof payload, tag));
    for (size_t bit = 0; bit < 8 * sizeof hdr; bit++) {
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_true(cl_frame_mac_begin(&m, 42));
        assert_true(cl_frame_mac_update(&m, hdr, sizeof hdr));
        assert_true(cl_frame_mac_update(&m, payload, sizeof payload));
        assert_false(cl_frame_mac_check(&m, tag));
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    for (int i = 0; i < 200; i++) {
        size_t bit = rng() % (8 * sizeof payload);
        payload[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        uint8_t t2[CL_FRAME_MAC_TAG];
        assert_true(cl_frame_mac_tag(&m, 42, hdr, sizeof hdr, payload, sizeof payload, t2));
        assert_memory_not_equal(t2, tag, sizeof tag);
        payload[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    /* a flipped bit of the tag itself */
    for (int bit = 0; bit < 8 * CL_FRAME_MAC_TAG; bit++) {
        uint8_t bad[CL_FRAME_MAC_TAG];
        memcpy(bad, tag, sizeof bad);
        bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_true(cl_frame_mac_begin(&m, 42));
        assert_true(cl_frame_mac_update(&m, hdr, sizeof hdr));
        assert_true(cl_frame_mac_update(&m, payload, sizeof payload));
        assert_false(cl_frame_mac_check(&m, bad));
    }
    cl_frame_mac_fini(&m);
}

/* the same bytes under another number, direction or session, or cut short */
static void test_number_direction_session_length(void **state) {
    (void)state;
    cl_frame_mac d2a, a2d, other;
    uint8_t session2[32];
    memcpy(session2, session, sizeof session2);
    session2[31] ^= 1;
    assert_true(cl_frame_mac_init(&d2a, session, true));
    assert_true(cl_frame_mac_init(&a2d, session, false));
    assert_true(cl_frame_mac_init(&other, session2, true));
    uint8_t hdr[48], payload[256], t[CL_FRAME_MAC_TAG], u[CL_FRAME_MAC_TAG];
    fill(hdr, sizeof hdr);
    fill(payload, sizeof payload);
    assert_true(cl_frame_mac_tag(&d2a, 5, hdr, sizeof hdr, payload, sizeof payload, t));
    uint64_t others[] = {0, 4, 6, 5ull << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        assert_true(cl_frame_mac_tag(&d2a, others[i], hdr, sizeof hdr, payload, sizeof payload, u));
        assert_memory_not_equal(t, u, sizeof t);
    }
    assert_true(cl_frame_mac_tag(&a2d, 5, hdr, sizeof hdr, payload, sizeof payload, u));
    assert_memory_not_equal(t, u, sizeof t);
    assert_true(cl_frame_mac_tag(&other, 5, hdr, sizeof hdr, payload, sizeof payload, u));
    assert_memory_not_equal(t, u, sizeof t);
    assert_true(cl_frame_mac_tag(&d2a, 5, hdr, sizeof hdr, payload, sizeof payload - 1, u));
    assert_memory_not_equal(t, u, sizeof t);
    /* the boundary between header and payload is part of nothing: the MAC
     * covers the byte stream, and the header fixes the payload's length */
    assert_true(cl_frame_mac_tag(&d2a, 5, hdr, sizeof hdr, payload, sizeof payload, u));
    assert_memory_equal(t, u, sizeof t);
    cl_frame_mac_fini(&d2a);
    cl_frame_mac_fini(&a2d);
    cl_frame_mac_fini(&other);
}

/* ---- a man in the middle ------------------------------------------------------------------ */

enum { PX_FLIP_PAYLOAD = 1, PX_FLIP_HEADER, PX_DROP, PX_REPLAY };
#define PX_BOUND_MS 20000 /* the proxy gives up after this long */
#define MITM_LEN    64

/* A proxy between rank 0 (the dialer) and rank 1: forwards both ways; on
 * the way to rank 1 it reads the frames after the handshake's HELLO and
 * alters the first broadcast frame as `mode` says. */
typedef struct proxy {
    int lfd;
    uint16_t port;
    struct sockaddr_in target;
    int mode;
    pthread_t th;
    atomic_bool stop;
    int frames, tagged, hits; /* frames to rank 1, those with TCP_FRAME_MAC, alterations */
} proxy;

static bool send_all(int fd, const uint8_t *p, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0) return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* A whole frame (hdr + payload + tag) to rank 1, altered as asked. */
static bool px_frame(proxy *px, int to, uint8_t *f, size_t len, int *bcasts) {
    px->frames++;
    if (f[7] & TCP_FRAME_MAC) px->tagged++;
    bool target = f[4] == COLLIE_COLL_BROADCAST && (*bcasts)++ == 0;
    if (target) px->hits++;
    if (target && px->mode == PX_FLIP_PAYLOAD) f[TCP_FRAME_HDR] ^= 0x01;
    if (target && px->mode == PX_FLIP_HEADER) f[6] ^= 0x01; /* op: a broadcast ignores it */
    if (target && px->mode == PX_DROP) return true;
    if (!send_all(to, f, len)) return false;
    if (target && px->mode == PX_REPLAY) return send_all(to, f, len);
    return true;
}

static void *px_main(void *arg) {
    proxy *px = arg;
    int64_t until = now_ms() + PX_BOUND_MS;
    struct pollfd lp = {.fd = px->lfd, .events = POLLIN};
    if (poll(&lp, 1, PX_BOUND_MS) != 1) return NULL;
    int a = accept(px->lfd, NULL, NULL);
    int b = socket(AF_INET, SOCK_STREAM, 0);
    if (a < 0 || b < 0 || connect(b, (struct sockaddr *)&px->target, sizeof px->target) != 0) {
        if (a >= 0) close(a);
        if (b >= 0) close(b);
        return NULL;
    }
    size_t cap = 1 << 20, have = 0, hello = HS_HELLO_LEN;
    uint8_t *buf = malloc(cap), tmp[65536];
    int bcasts = 0;
    while (buf && !atomic_load(&px->stop) && now_ms() < until) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, 50) <= 0) continue;
        if (p[1].revents) { /* rank 1 to rank 0: as is */
            ssize_t n = recv(b, tmp, sizeof tmp, 0);
            if (n <= 0 || !send_all(a, tmp, (size_t)n)) break;
        }
        if (!p[0].revents) continue;
        ssize_t n = recv(a, buf + have, cap - have, 0);
        if (n <= 0) break;
        have += (size_t)n;
        size_t at = 0;
        if (hello) { /* the handshake's HELLO, as is */
            size_t k = have < hello ? have : hello;
            if (!send_all(b, buf, k)) break;
            hello -= k;
            at = k;
        }
        bool ok = true;
        while (ok && have - at >= TCP_FRAME_HDR) {
            uint8_t *f = buf + at;
            size_t len = TCP_FRAME_HDR + get64(f + 32) + ((f[7] & TCP_FRAME_MAC) ? 16 : 0);
            if (f[7] & TCP_FRAME_RTS) len = TCP_FRAME_HDR + ((f[7] & TCP_FRAME_MAC) ? 16 : 0);
            if (len > cap || have - at < len) break;
            ok = px_frame(px, b, f, len, &bcasts);
            at += len;
        }
        if (!ok) break;
        memmove(buf, buf + at, have - at);
        have -= at;
    }
    free(buf);
    close(a);
    close(b);
    return NULL;
}

static void px_start(proxy *px, const struct sockaddr_in *target, int mode) {
    memset(px, 0, sizeof *px);
    px->target = *target;
    px->mode = mode;
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sin;
    assert_int_equal(bind(px->lfd, (struct sockaddr *)&sin, sizeof sin), 0);
    assert_int_equal(listen(px->lfd, 4), 0);
    assert_int_equal(getsockname(px->lfd, (struct sockaddr *)&sin, &sl), 0);
    px->port = ntohs(sin.sin_port);
    assert_int_equal(pthread_create(&px->th, NULL, px_main, px), 0);
}

static void px_stop(proxy *px) {
    atomic_store(&px->stop, true);
    pthread_join(px->th, NULL);
    close(px->lfd);
}

typedef struct mitm_result {
    int rc[2][2];     /* [rank][broadcast] */
    bool right[2][2]; /* the bytes of that broadcast */
    char msg[2][2][512];
    int frames, tagged, hits;
} mitm_result;

/* Two ranks over TCP (a secret iff `token`, COLLIE_FRAME_MAC=`mac`), rank
 * 0 reaching rank 1 through the proxy; two broadcasts of 64 bytes from
 * rank 0. Every OK work's bytes are checked here (the oracle rule). */
static void mitm_run(int mode, const char *token, const char *mac, mitm_result *r) {
    setting_set("COLLIE_CPU_TRANSPORT", "tcp");
    setting_set("COLLIE_STORE_TOKEN", token);
    setting_set("COLLIE_FRAME_MAC", mac);
    setting_set("COLLIE_LOG", "error");
    world w;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "mitm";
    o.timeout_ms = 4000;
    world_create(&w, 2, "mitm", &o);
    /* rank 1's address, replaced by the proxy's before rank 0 first dials */
    uint64_t gen = collie_comm_generation(w.c[1]);
    char key[96], val[64];
    snprintf(key, sizeof key, "collie/mitm/%llu/tcp/1", (unsigned long long)gen);
    void *pub = NULL;
    size_t len = 0;
    assert_int_equal(collie_store_get(w.st[0], key, 5000, &pub, &len), COLLIE_OK);
    char real[128];
    snprintf(real, sizeof real, "%.*s", (int)len, (char *)pub);
    free(pub);
    real[strcspn(real, "|")] = '\0';
    char *colon = strrchr(real, ':');
    assert_non_null(colon);
    *colon = '\0';
    struct sockaddr_in target = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)atoi(colon + 1))};
    assert_int_equal(inet_pton(AF_INET, real, &target.sin_addr), 1);
    proxy px;
    px_start(&px, &target, mode);
    snprintf(val, sizeof val, "127.0.0.1:%u", px.port);
    assert_int_equal(collie_store_set(w.st[0], key, val, strlen(val), 5000), COLLIE_OK);

    uint8_t buf[2][2][MITM_LEN];
    collie_work *wk[2][2] = {{NULL}};
    for (int b = 0; b < 2; b++)
        for (int rank = 0; rank < 2; rank++) {
            memset(buf[rank][b], rank == 0 ? 0xa5 + b : 0, MITM_LEN);
            int rc = collie_broadcast(w.c[rank], buf[rank][b], MITM_LEN, COLLIE_UINT8, 0, NULL,
                                      &wk[rank][b]);
            r->rc[rank][b] = rc;
        }
    for (int b = 0; b < 2; b++)
        for (int rank = 0; rank < 2; rank++) {
            if (!wk[rank][b]) continue;
            int rc = collie_work_wait(wk[rank][b], 15000);
            assert_int_not_equal(rc, COLLIE_INPROGRESS);
            r->rc[rank][b] = rc;
            bool right = true;
            for (int i = 0; i < MITM_LEN; i++)
                right = right && buf[rank][b][i] == (uint8_t)(0xa5 + b);
            r->right[rank][b] = right;
            snprintf(r->msg[rank][b], sizeof r->msg[rank][b], "%s",
                     rc == COLLIE_OK ? "" : collie_work_error_message(wk[rank][b]));
            print_message("rank %d bcast %d: %s%s %s\n", rank, b, collie_status_name(rc),
                          right ? "" : " (WRONG BYTES)", r->msg[rank][b]);
            collie_work_release(wk[rank][b]);
        }
    px_stop(&px);
    r->frames = px.frames;
    r->tagged = px.tagged;
    r->hits = px.hits;
    print_message("proxy: %d frames to rank 1, %d with a MAC, %d altered\n", r->frames, r->tagged,
                  r->hits);
    for (int rank = 0; rank < 2; rank++) {
        collie_comm_abort(w.c[rank], "test over");
        collie_comm_destroy(w.c[rank]);
        collie_store_destroy(w.st[rank]);
    }
    collie_store_server_destroy(w.srv);
    assert_int_equal(collie_engine_destroy(w.e), COLLIE_OK);
    setting_set("COLLIE_CPU_TRANSPORT", NULL);
    setting_set("COLLIE_STORE_TOKEN", NULL);
    setting_set("COLLIE_FRAME_MAC", NULL);
}

/* the oracle: no work returned OK with wrong bytes */
static void mitm_no_wrong_ok(const mitm_result *r) {
    for (int rank = 0; rank < 2; rank++)
        for (int b = 0; b < 2; b++)
            if (r->rc[rank][b] == COLLIE_OK && !r->right[rank][b])
                fail_msg("rank %d's broadcast %d returned COLLIE_OK with wrong bytes", rank, b);
}

/* rank 1 saw the MAC fail: its works failed, naming it; frames were tagged */
static void mitm_caught(const mitm_result *r, int first_failed) {
    mitm_no_wrong_ok(r);
    assert_int_equal(r->hits, 1);
    assert_true(r->tagged == r->frames && r->frames > 0);
    for (int b = first_failed; b < 2; b++) {
        if (r->rc[1][b] == COLLIE_OK) fail_msg("rank 1's broadcast %d completed", b);
        if (!strstr(r->msg[1][b], "failed its MAC"))
            fail_msg("rank 1's broadcast %d: %s (not the MAC error)", b, r->msg[1][b]);
    }
}

/* Without a secret the proxy's flipped byte is returned as COLLIE_OK:
 * what the MAC is for. */
static void test_mitm_without_secret_goes_unseen(void **state) {
    (void)state;
    mitm_result r = {0};
    mitm_run(PX_FLIP_PAYLOAD, NULL, NULL, &r);
    assert_int_equal(r.hits, 1);
    assert_int_equal(r.tagged, 0);
    assert_int_equal(r.rc[1][0], COLLIE_OK);
    assert_false(r.right[1][0]); /* the wrong byte, returned OK */
}

/* COLLIE_FRAME_MAC=0 on both ends: no tag on the wire (and so, like no
 * secret, no protection: for trusted networks only). */
static void test_mitm_mac_off_goes_unseen(void **state) {
    (void)state;
    mitm_result r = {0};
    mitm_run(PX_FLIP_PAYLOAD, "s3cret", "0", &r);
    assert_int_equal(r.hits, 1);
    assert_int_equal(r.tagged, 0);
    assert_int_equal(r.rc[1][0], COLLIE_OK);
    assert_false(r.right[1][0]);
    assert_int_equal(r.rc[1][1], COLLIE_OK);
    assert_true(r.right[1][1]);
}

static void test_mitm_flipped_payload_byte(void **state) {
    (void)state;
    mitm_result r = {0};
    mitm_run(PX_FLIP_PAYLOAD, "s3cret", NULL, &r);
    mitm_caught(&r, 0);
}

static void test_mitm_flipped_header_byte(void **state) {
    (void)state;
    mitm_result r = {0};
    mitm_run(PX_FLIP_HEADER, "s3cret", NULL, &r);
    mitm_caught(&r, 0);
}

/* the first broadcast's frame dropped: the second's comes under the wrong
 * number */
static void test_mitm_dropped_frame(void **state) {
    (void)state;
    mitm_result r = {0};
    mitm_run(PX_DROP, "s3cret", NULL, &r);
    mitm_caught(&r, 0);
}

/* the first broadcast's frame sent twice: the copy has the wrong number
 * (the first broadcast may complete, with the right bytes) */
static void test_mitm_replayed_frame(void **state) {
    (void)state;
    mitm_result r = {0};
    mitm_run(PX_REPLAY, "s3cret", NULL, &r);
    mitm_caught(&r, 1);
}

/* ---- the setting, in collie-run jobs -------------------------------------------------------- */

/* helper mode: an allreduce and a 1 MiB broadcast, checked */
static int rank_mac(void) {
    int rank;
    collie_engine *e;
    collie_store *st;
    collie_comm *c;
    int rc = rank_join_env("macjob", 10000, &rank, &e, &st, &c);
    if (rc) return rc;
    int size = collie_comm_size(c);
    int32_t in[4] = {rank + 1, rank + 1, rank + 1, rank + 1}, out[4] = {0};
    size_t big = 1 << 20;
    uint8_t *bb = malloc(big);
    for (size_t i = 0; i < big; i++)
        bb[i] = rank == 0 ? (uint8_t)(i * 7) : 0;
    collie_work *w = NULL;
    rc = collie_allreduce(c, in, out, 4, COLLIE_INT32, COLLIE_SUM, NULL, &w);
    if (rc == COLLIE_OK) rc = collie_work_wait(w, 15000);
    bool right = true;
    for (int i = 0; i < 4; i++)
        right = right && out[i] == size * (size + 1) / 2;
    /* a post refused (the comm failed before it: rank 0 may see a frame
     * without a MAC, and abort, before this rank posts) says why in
     * collie_last_error, a failed work in its message */
    printf("ALLREDUCE status=%s bytes=%s %s\n", collie_status_name(rc), right ? "right" : "wrong",
           rc == COLLIE_OK ? ""
           : w             ? collie_work_error_message(w)
                           : collie_last_error());
    if (w) collie_work_release(w);
    w = NULL;
    int rc2 = collie_broadcast(c, bb, big, COLLIE_UINT8, 0, NULL, &w);
    if (rc2 == COLLIE_OK) rc2 = collie_work_wait(w, 15000);
    bool right2 = true;
    for (size_t i = 0; i < big; i++)
        right2 = right2 && bb[i] == (uint8_t)(i * 7);
    printf("BCAST status=%s bytes=%s %s\n", collie_status_name(rc2), right2 ? "right" : "wrong",
           rc2 == COLLIE_OK ? ""
           : w              ? collie_work_error_message(w)
                            : collie_last_error());
    fflush(stdout);
    if (w) collie_work_release(w);
    free(bb);
    if (rc != COLLIE_OK || rc2 != COLLIE_OK) collie_comm_abort(c, "test over");
    collie_comm_destroy(c);
    collie_store_destroy(st);
    collie_engine_destroy(e);
    return rc == COLLIE_OK && right && rc2 == COLLIE_OK && right2 ? 0 : 1;
}

static spawn_proc *mac_job(const char *rank0_mac, const char *rank1_mac) {
    char sh[sizeof self_exe + 128];
    snprintf(sh, sizeof sh,
             "if [ \"$COLLIE_RANK\" = 1 ]; then export COLLIE_FRAME_MAC=%s; else export "
             "COLLIE_FRAME_MAC=%s; fi; exec %s --rank-mac",
             rank1_mac, rank0_mac, self_exe);
    spawn_proc *l = spawn_start("collie-run", ARGS("-n", "2", "--", "/bin/sh", "-c", sh),
                                ARGS("COLLIE_LOG=error", "COLLIE_CPU_TRANSPORT=tcp"), 30000);
    spawn_finish(l);
    print_message("%s\n", l->text[0]);
    return l;
}

/* COLLIE_FRAME_MAC=0 on both ranks of a job with a secret: it works */
static void test_setting_off_on_both_ranks(void **state) {
    (void)state;
    spawn_proc *l = mac_job("0", "0");
    assert_spawn(l, strstr(l->text[0], "[0] ALLREDUCE status=COLLIE_OK bytes=right"));
    assert_spawn(l, strstr(l->text[0], "[1] ALLREDUCE status=COLLIE_OK bytes=right"));
    assert_spawn(l, strstr(l->text[0], "[0] BCAST status=COLLIE_OK bytes=right"));
    assert_spawn(l, strstr(l->text[0], "[1] BCAST status=COLLIE_OK bytes=right"));
    assert_spawn(l, l->status == 0);
    spawn_free(l);
}

/* on one rank only: both fail, the message names the setting */
static void test_setting_mismatch_is_named(void **state) {
    (void)state;
    spawn_proc *l = mac_job("1", "0");
    const char *t = l->text[0];
    assert_spawn(l, l->status != 0);
    assert_spawn(l, !strstr(t, "ALLREDUCE status=COLLIE_OK bytes=wrong"));
    assert_spawn(l, !strstr(t, "BCAST status=COLLIE_OK bytes=wrong"));
    assert_spawn(l, strstr(t, "[0] ALLREDUCE status=COLLIE_EAUTH"));
    assert_spawn(l, strstr(t, "[0] ALLREDUCE status=COLLIE_EAUTH bytes=wrong allreduce seq 1 (comm "
                              "'macjob' rank 0): rank 1 sends frames without a MAC "
                              "(COLLIE_FRAME_MAC=0 there?)"));
    /* rank 1 reads why in rank 0's last words: in its work's message, or in
     * collie_last_error when rank 0's abort came before rank 1 posted */
    const char *r1 = strstr(t, "[1] ALLREDUCE status=COLLIE_EABORTED bytes=wrong ");
    const char *eol = r1 ? strchr(r1, '\n') : NULL;
    const char *why = r1 ? strstr(r1, "rank 0 failed: rank 1 sends frames without a MAC "
                                      "(COLLIE_FRAME_MAC=0 there?)")
                         : NULL;
    assert_spawn(l, r1 && why && (!eol || why < eol));
    spawn_free(l);
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0) self_exe[n] = '\0';
    if (argc >= 2 && !strcmp(argv[1], "--rank-mac")) return rank_mac();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_equal_one_shot),
        cmocka_unit_test(test_any_flipped_bit_fails),
        cmocka_unit_test(test_number_direction_session_length),
        cmocka_unit_test(test_mitm_without_secret_goes_unseen),
        cmocka_unit_test(test_mitm_mac_off_goes_unseen),
        cmocka_unit_test(test_mitm_flipped_payload_byte),
        cmocka_unit_test(test_mitm_flipped_header_byte),
        cmocka_unit_test(test_mitm_dropped_frame),
        cmocka_unit_test(test_mitm_replayed_frame),
        cmocka_unit_test_teardown(test_setting_off_on_both_ranks, spawn_teardown),
        cmocka_unit_test_teardown(test_setting_mismatch_is_named, spawn_teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
