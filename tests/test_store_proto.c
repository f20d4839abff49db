/*
 * test_store_proto.c — the store's pure parts, without sockets: the wire
 * codec (proto.c), the key table and its waiters (kv.c), SipHash, the id
 * map, HMAC proofs (auth.c) and address parsing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collie.h"
#include "store/addr.h"
#include "store/auth.h"
#include "base/idmap.h"
#include "store/kv.h"
#include "store/proto.h"
#include "store/siphash.h"
#include "runner.h"

/* ---- helpers ---------------------------------------------------------------------- */

static cl_store_bytes B(const char *s) {
    return (cl_store_bytes){(const uint8_t *)s, (uint32_t)strlen(s)};
}

static bool bytes_eq(cl_store_bytes b, const char *s) {
    return b.len == strlen(s) && memcmp(b.p, s, b.len) == 0;
}

/* Encode a request frame; returns the buffer (header included). */
static cl_store_wbuf enc_begin(uint8_t op) {
    cl_store_wbuf b = {0};
    cl_store_frame_begin(&b, op, 77, 0);
    return b;
}

static void enc_end(cl_store_wbuf *b) { assert_int_equal(cl_store_frame_end(b, 0), COLLIE_OK); }

/* Decode the frame in b as a request; checks the header too. */
static int dec_req(const cl_store_wbuf *b, cl_store_msg *m) {
    cl_store_hdr h;
    assert_int_equal(cl_store_hdr_decode(b->p, 1u << 20, &h, NULL, 0), COLLIE_OK);
    assert_int_equal(h.req_id, 77);
    assert_int_equal(h.body_len, b->len - CL_STORE_HDR_LEN);
    return cl_store_req_decode(h.op, b->p + CL_STORE_HDR_LEN, h.body_len, m, NULL, 0);
}

/* ---- header ------------------------------------------------------------------------ */

static void test_hdr_roundtrip(void **state) {
    (void)state;
    cl_store_hdr h = {.version = CL_STORE_PROTO_VERSION,
                      .op = CL_STORE_OP_GET | CL_STORE_OP_REPLY,
                      .body_len = 0x01020304,
                      .req_id = 0xdeadbeef,
                      .status = COLLIE_ELIMIT},
                 g;
    uint8_t buf[CL_STORE_HDR_LEN];
    cl_store_hdr_encode(buf, &h);
    /* explicit little-endian layout */
    assert_int_equal(buf[0], 0x11);
    assert_int_equal(buf[1], 0xC0);
    assert_int_equal(buf[4], 0x04);
    assert_int_equal(buf[7], 0x01);
    assert_int_equal(buf[8], 0xef);
    assert_int_equal(cl_store_hdr_decode(buf, UINT32_MAX, &g, NULL, 0), COLLIE_OK);
    assert_int_equal(g.op, h.op);
    assert_int_equal(g.body_len, h.body_len);
    assert_int_equal(g.req_id, h.req_id);
    assert_int_equal(g.status, COLLIE_ELIMIT);
    cl_store_hdr_patch_req_id(buf, 5);
    assert_int_equal(cl_store_hdr_decode(buf, UINT32_MAX, &g, NULL, 0), COLLIE_OK);
    assert_int_equal(g.req_id, 5);
}

static void test_hdr_rejects(void **state) {
    (void)state;
    cl_store_hdr h = {.version = CL_STORE_PROTO_VERSION, .op = CL_STORE_OP_SET, .body_len = 100}, g;
    uint8_t buf[CL_STORE_HDR_LEN];
    char why[128];
    cl_store_hdr_encode(buf, &h);
    assert_int_equal(cl_store_hdr_decode(buf, 99, &g, why, sizeof why), COLLIE_ELIMIT);
    assert_non_null(strstr(why, "exceeds"));
    assert_int_equal(cl_store_hdr_decode(buf, 100, &g, why, sizeof why), COLLIE_OK);
    buf[0] ^= 1;
    assert_int_equal(cl_store_hdr_decode(buf, 100, &g, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "magic"));
    buf[0] ^= 1;
    buf[2] = 9;
    assert_int_equal(cl_store_hdr_decode(buf, 100, &g, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "version"));
    buf[2] = CL_STORE_PROTO_VERSION;
    buf[3] = 99;
    assert_int_equal(cl_store_hdr_decode(buf, 100, &g, why, sizeof why), COLLIE_EPROTO);
    assert_non_null(strstr(why, "op"));
    buf[3] = 0;
    assert_int_equal(cl_store_hdr_decode(buf, 100, &g, NULL, 0), COLLIE_EPROTO);
}

/* ---- requests ------------------------------------------------------------------------ */

static void test_req_single_key_ops(void **state) {
    (void)state;
    cl_store_msg m;
    cl_store_wbuf b = enc_begin(CL_STORE_OP_SET);
    cl_store_put_bytes2(&b, "pre/", 4, "key", 3);
    cl_store_put_bytes(&b, "v\0x", 3);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.n, 1);
    assert_true(bytes_eq(m.keys[0], "pre/key"));
    assert_int_equal(m.vals[0].len, 3);
    assert_memory_equal(m.vals[0].p, "v\0x", 3);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_ADD);
    cl_store_put_bytes(&b, "n", 1);
    cl_store_put_i64(&b, -5);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.num, -5);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_COMPARE_SET);
    cl_store_put_bytes(&b, "k", 1);
    cl_store_put_bytes(&b, "", 0);
    cl_store_put_bytes(&b, "new", 3);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_true(bytes_eq(m.vals[0], ""));
    assert_true(bytes_eq(m.vals[1], "new"));
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_BARRIER);
    cl_store_put_bytes(&b, "bar", 3);
    cl_store_put_u32(&b, 4);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.num, 4);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_BARRIER); /* a barrier of 0 is malformed */
    cl_store_put_bytes(&b, "bar", 3);
    cl_store_put_u32(&b, 0);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_EPROTO);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_CANCEL);
    cl_store_put_u32(&b, 1234);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.num, 1234);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_NUM_KEYS);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);
}

static void test_req_multi_key_ops(void **state) {
    (void)state;
    cl_store_msg m;
    const char *keys[] = {"a", "bb", "", "dddd"};
    cl_store_wbuf b = enc_begin(CL_STORE_OP_MULTI_GET);
    cl_store_put_u32(&b, 4);
    for (int i = 0; i < 4; i++)
        cl_store_put_bytes(&b, keys[i], strlen(keys[i]));
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.n, 4);
    for (int i = 0; i < 4; i++)
        assert_true(bytes_eq(m.keys[i], keys[i]));
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_MULTI_SET);
    cl_store_put_u32(&b, 3);
    for (int i = 0; i < 3; i++) {
        cl_store_put_bytes(&b, keys[i], strlen(keys[i]));
        cl_store_put_bytes(&b, keys[3 - i], strlen(keys[3 - i]));
    }
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_true(bytes_eq(m.keys[i], keys[i]));
        assert_true(bytes_eq(m.vals[i], keys[3 - i]));
    }
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    /* a count that cannot fit the body is rejected before allocating */
    b = enc_begin(CL_STORE_OP_WAIT);
    cl_store_put_u32(&b, 0x7fffffff);
    cl_store_put_bytes(&b, "a", 1);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_EPROTO);
    cl_store_wbuf_fini(&b);
    b = enc_begin(CL_STORE_OP_CHECK); /* n = 0 */
    cl_store_put_u32(&b, 0);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_EPROTO);
    cl_store_wbuf_fini(&b);
}

static void test_req_handshake_ops(void **state) {
    (void)state;
    cl_store_msg m;
    uint8_t nonce[CL_STORE_NONCE_LEN];
    memset(nonce, 7, sizeof nonce);
    cl_store_wbuf b = enc_begin(CL_STORE_OP_HELLO);
    cl_store_put_u8(&b, 1);
    cl_store_put_bytes(&b, nonce, sizeof nonce);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.num, 1);
    assert_memory_equal(m.vals[0].p, nonce, sizeof nonce);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_HELLO); /* short nonce */
    cl_store_put_u8(&b, 0);
    cl_store_put_bytes(&b, nonce, 5);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_EPROTO);
    cl_store_wbuf_fini(&b);

    b = enc_begin(CL_STORE_OP_AUTH);
    cl_store_put_u8(&b, CL_STORE_AUTH_PROOF);
    cl_store_put_bytes(&b, nonce, CL_STORE_PROOF_LEN);
    enc_end(&b);
    assert_int_equal(dec_req(&b, &m), COLLIE_OK);
    assert_int_equal(m.num, CL_STORE_AUTH_PROOF);
    assert_int_equal(m.vals[0].len, CL_STORE_PROOF_LEN);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);
}

/* Every strict prefix of a valid body, and the body plus a trailing byte,
 * must be rejected as EPROTO. */
static void test_req_truncated_and_trailing(void **state) {
    (void)state;
    cl_store_wbuf b = enc_begin(CL_STORE_OP_MULTI_SET);
    cl_store_put_u32(&b, 2);
    cl_store_put_bytes(&b, "key1", 4);
    cl_store_put_bytes(&b, "value1", 6);
    cl_store_put_bytes(&b, "key2", 4);
    cl_store_put_bytes(&b, "v2", 2);
    enc_end(&b);
    const uint8_t *body = b.p + CL_STORE_HDR_LEN;
    size_t len = b.len - CL_STORE_HDR_LEN;
    cl_store_msg m;
    char why[128];
    for (size_t cut = 0; cut < len; cut++)
        assert_int_equal(cl_store_req_decode(CL_STORE_OP_MULTI_SET, body, cut, &m, why, sizeof why),
                         COLLIE_EPROTO);
    uint8_t *more = malloc(len + 1);
    memcpy(more, body, len);
    more[len] = 0;
    assert_int_equal(cl_store_req_decode(CL_STORE_OP_MULTI_SET, more, len + 1, &m, why, sizeof why),
                     COLLIE_EPROTO);
    assert_non_null(strstr(why, "trailing"));
    free(more);
    assert_int_equal(cl_store_req_decode(CL_STORE_OP_MULTI_SET, body, len, &m, NULL, 0), COLLIE_OK);
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);
    /* a reply op or an unknown op is not a request */
    assert_int_equal(cl_store_req_decode(99, body, len, &m, NULL, 0), COLLIE_EPROTO);
}

/* Random bodies for every op: never a crash, never a leak (ASan), and a
 * decoded message only ever points inside the body. */
static void test_req_fuzz(void **state) {
    (void)state;
    srand(12345);
    uint8_t buf[96];
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = (size_t)(rand() % (int)sizeof buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rand();
        /* small lengths make the interesting paths reachable */
        if (len >= 4 && iter % 2) buf[0] = (uint8_t)(rand() % 6), buf[1] = buf[2] = buf[3] = 0;
        uint8_t op = (uint8_t)(1 + iter % (CL_STORE_OP_COUNT_ - 1));
        cl_store_msg m;
        if (cl_store_req_decode(op, buf, len, &m, NULL, 0) == COLLIE_OK) {
            for (uint32_t i = 0; i < m.n && op != CL_STORE_OP_HELLO; i++)
                if (m.keys[i].len)
                    assert_true(m.keys[i].p >= buf && m.keys[i].p + m.keys[i].len <= buf + len);
            cl_store_msg_fini(&m);
        }
        if (cl_store_reply_decode(op, iter % 3 ? 0 : -1, buf, len, &m, NULL, 0) == COLLIE_OK)
            cl_store_msg_fini(&m);
    }
}

static void test_replies(void **state) {
    (void)state;
    cl_store_msg m;
    cl_store_wbuf b = {0};
    cl_store_put_bytes(&b, "hello", 5);
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_GET, 0, b.p, b.len, &m, NULL, 0), COLLIE_OK);
    assert_true(bytes_eq(m.vals[0], "hello"));
    cl_store_msg_fini(&m);
    /* an error reply carries a message whatever the op */
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_ADD, COLLIE_ELIMIT, b.p, b.len, &m, NULL, 0),
                     COLLIE_OK);
    assert_true(bytes_eq(m.vals[0], "hello"));
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);

    cl_store_put_i64(&b, INT64_MIN);
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_ADD, 0, b.p, b.len, &m, NULL, 0), COLLIE_OK);
    assert_true(m.num == INT64_MIN);
    cl_store_msg_fini(&m);
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_SET, 0, b.p, b.len, &m, NULL, 0),
                     COLLIE_EPROTO); /* set replies are empty */
    cl_store_wbuf_fini(&b);

    cl_store_put_u32(&b, 3);
    cl_store_put_bytes(&b, "x", 1);
    cl_store_put_bytes(&b, "", 0);
    cl_store_put_bytes(&b, "zzz", 3);
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_MULTI_GET, 0, b.p, b.len, &m, NULL, 0),
                     COLLIE_OK);
    assert_int_equal(m.n, 3);
    assert_true(bytes_eq(m.vals[0], "x"));
    assert_true(bytes_eq(m.vals[1], ""));
    assert_true(bytes_eq(m.vals[2], "zzz"));
    cl_store_msg_fini(&m);
    cl_store_wbuf_fini(&b);
}

/* A reply's status is OK or a negative collie status (proto.h): a positive
 * one is neither, and its body is no message (the client prints an error
 * reply's message: during the handshake an AUTH reply with status 1 had it
 * print a NULL pointer). Found by tests/fuzz/fuzz_store_proto.c
 * (tests/fuzz/crashes/store_proto/reply-positive-status). */
static void test_reply_positive_status(void **state) {
    (void)state;
    cl_store_msg m;
    char why[128] = "";
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_AUTH, 1, NULL, 0, &m, why, sizeof why),
                     COLLIE_EPROTO);
    assert_non_null(strstr(why, "status 1"));
    cl_store_wbuf b = {0};
    cl_store_put_i64(&b, 5);
    assert_int_equal(
        cl_store_reply_decode(CL_STORE_OP_DELETE_PREFIX, 921102, b.p, b.len, &m, why, sizeof why),
        COLLIE_EPROTO);
    cl_store_wbuf_fini(&b);
}

/* A multi-key body too short for its count is refused with a reason (the
 * server logs it when it drops the client): the count's own truncation set
 * none. Found by tests/fuzz/fuzz_store_proto.c
 * (tests/fuzz/crashes/store_proto/multi-get-truncated-count). */
static void test_req_truncated_count_says_why(void **state) {
    (void)state;
    uint8_t ops[] = {CL_STORE_OP_CHECK, CL_STORE_OP_WAIT, CL_STORE_OP_MULTI_GET,
                     CL_STORE_OP_MULTI_SET};
    for (size_t i = 0; i < sizeof ops; i++) {
        cl_store_msg m;
        char why[128] = "";
        uint8_t two[2] = {1, 0};
        assert_int_equal(cl_store_req_decode(ops[i], two, sizeof two, &m, why, sizeof why),
                         COLLIE_EPROTO);
        assert_non_null(strstr(why, "truncated"));
    }
    cl_store_msg m;
    char why[128] = "";
    assert_int_equal(cl_store_reply_decode(CL_STORE_OP_MULTI_GET, 0, NULL, 0, &m, why, sizeof why),
                     COLLIE_EPROTO);
    assert_non_null(strstr(why, "truncated"));
}

/* ---- kv --------------------------------------------------------------------------------- */

static const uint8_t seed[16] = {1, 2, 3};

static cl_store_kv *kv_new(uint32_t maxk, uint32_t maxv, uint32_t nkeys) {
    cl_store_kv_limits lim = {maxk, maxv, nkeys};
    cl_store_kv *kv = cl_store_kv_create(&lim, seed);
    assert_non_null(kv);
    return kv;
}

static bool kv_is(cl_store_kv *kv, const char *k, const char *v) {
    const uint8_t *p;
    size_t len;
    if (!cl_store_kv_get(kv, k, strlen(k), &p, &len)) return v == NULL;
    return v && len == strlen(v) && memcmp(p, v, len) == 0;
}

static void test_kv_basic(void **state) {
    (void)state;
    cl_store_kv *kv = kv_new(16, 8, 1000);
    assert_int_equal(cl_store_kv_set(kv, "a", 1, "1", 1), COLLIE_OK);
    assert_true(kv_is(kv, "a", "1"));
    assert_int_equal(cl_store_kv_set(kv, "a", 1, "22", 2), COLLIE_OK);
    assert_true(kv_is(kv, "a", "22"));
    assert_int_equal(cl_store_kv_num_keys(kv), 1);
    /* many keys: the table grows */
    char k[16];
    for (int i = 0; i < 900; i++) {
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(cl_store_kv_set(kv, k, strlen(k), k, strlen(k) > 8 ? 8 : strlen(k)),
                         COLLIE_OK);
    }
    assert_int_equal(cl_store_kv_num_keys(kv), 901);
    assert_true(kv_is(kv, "k899", "k899"));
    bool existed;
    assert_int_equal(cl_store_kv_delete(kv, "k5", 2, &existed), COLLIE_OK);
    assert_true(existed);
    assert_int_equal(cl_store_kv_delete(kv, "k5", 2, &existed), COLLIE_OK);
    assert_false(existed);
    assert_true(kv_is(kv, "k5", NULL));
    assert_int_equal(cl_store_kv_num_keys(kv), 900);
    /* empty key and empty value are fine */
    assert_int_equal(cl_store_kv_set(kv, "", 0, "", 0), COLLIE_OK);
    assert_true(kv_is(kv, "", ""));
    cl_store_kv_destroy(kv);
}

/* delete_prefix over a table that grew through several doublings: exactly
 * the keys under the prefix go, placeholders (keys only waited for) stay,
 * and the waiters on deleted keys are unsatisfied again. */
static void test_kv_delete_prefix(void **state) {
    (void)state;
    cl_store_kv *kv = kv_new(16, 8, 10000);
    char k[16];
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof k, "%c/%d", i % 3 ? 'a' : 'b', i);
        assert_int_equal(cl_store_kv_set(kv, k, strlen(k), "v", 1), COLLIE_OK);
    }
    cl_store_waiter w[2];
    cl_store_bytes wk0[1] = {B("a/1")}, wk1[1] = {B("a/missing")};
    assert_int_equal(cl_store_kv_watch(kv, &w[0], 1, wk0, CL_STORE_WAIT_EXISTS, 0), COLLIE_OK);
    assert_int_equal(cl_store_kv_watch(kv, &w[1], 1, wk1, CL_STORE_WAIT_EXISTS, 0), COLLIE_OK);
    assert_ptr_equal(cl_store_kv_pop_ready(kv), &w[0]);
    assert_null(cl_store_kv_pop_ready(kv));
    assert_int_equal(cl_store_kv_delete_prefix(kv, "a/", 2), 2000);
    assert_int_equal(cl_store_kv_num_keys(kv), 1000);
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof k, "%c/%d", i % 3 ? 'a' : 'b', i);
        assert_true(kv_is(kv, k, i % 3 ? NULL : "v"));
    }
    /* the placeholders are still there: setting the keys readies both */
    assert_int_equal(cl_store_kv_set(kv, "a/missing", 9, "x", 1), COLLIE_OK);
    assert_int_equal(cl_store_kv_set(kv, "a/1", 3, "y", 1), COLLIE_OK);
    assert_ptr_equal(cl_store_kv_pop_ready(kv), &w[1]);
    assert_ptr_equal(cl_store_kv_pop_ready(kv), &w[0]);
    cl_store_kv_unwatch(kv, &w[0]);
    cl_store_kv_unwatch(kv, &w[1]);
    assert_int_equal(cl_store_kv_delete_prefix(kv, "", 0), 1002);
    assert_int_equal(cl_store_kv_num_keys(kv), 0);
    cl_store_kv_destroy(kv);
}

static void test_kv_limits(void **state) {
    (void)state;
    cl_store_kv *kv = kv_new(4, 8, 2);
    assert_int_equal(cl_store_kv_set(kv, "12345", 5, "v", 1), COLLIE_ELIMIT);
    assert_non_null(strstr(cl_store_kv_error(kv), "max_key_size"));
    assert_int_equal(cl_store_kv_set(kv, "k", 1, "123456789", 9), COLLIE_ELIMIT);
    assert_non_null(strstr(cl_store_kv_error(kv), "max_value_size"));
    assert_int_equal(cl_store_kv_set(kv, "a", 1, "v", 1), COLLIE_OK);
    assert_int_equal(cl_store_kv_set(kv, "b", 1, "v", 1), COLLIE_OK);
    assert_int_equal(cl_store_kv_set(kv, "c", 1, "v", 1), COLLIE_ELIMIT);
    assert_non_null(strstr(cl_store_kv_error(kv), "max_keys"));
    assert_int_equal(cl_store_kv_set(kv, "a", 1, "w", 1), COLLIE_OK); /* overwrite is fine */
    assert_int_equal(cl_store_kv_append(kv, "a", 1, "1234567", 7), COLLIE_OK);
    assert_int_equal(cl_store_kv_append(kv, "a", 1, "x", 1), COLLIE_ELIMIT);
    assert_true(kv_is(kv, "a", "w1234567"));
    /* multi_set is all or nothing */
    bool existed;
    cl_store_kv_delete(kv, "b", 1, &existed);
    cl_store_bytes keys[2] = {B("b"), B("c")}, vals[2] = {B("1"), B("2")};
    assert_int_equal(cl_store_kv_multi_set(kv, 2, keys, vals), COLLIE_ELIMIT);
    assert_true(kv_is(kv, "b", NULL));
    assert_int_equal(cl_store_kv_num_keys(kv), 1);
    vals[1] = B("123456789");
    keys[1] = B("a");
    assert_int_equal(cl_store_kv_multi_set(kv, 2, keys, vals), COLLIE_ELIMIT);
    assert_true(kv_is(kv, "a", "w1234567"));
    vals[1] = B("2");
    assert_int_equal(cl_store_kv_multi_set(kv, 2, keys, vals), COLLIE_OK);
    assert_true(kv_is(kv, "a", "2"));
    assert_true(kv_is(kv, "b", "1"));
    cl_store_kv_destroy(kv);
}

static void test_kv_add_append_cas(void **state) {
    (void)state;
    cl_store_kv *kv = kv_new(64, 64, 100);
    int64_t v = 0;
    assert_int_equal(cl_store_kv_add(kv, "n", 1, 5, &v), COLLIE_OK);
    assert_int_equal(v, 5);
    assert_int_equal(cl_store_kv_add(kv, "n", 1, -7, &v), COLLIE_OK);
    assert_int_equal(v, -2);
    assert_true(kv_is(kv, "n", "-2"));
    /* the value's text grows (a new buffer), shrinks and reaches INT64_MIN in place */
    assert_int_equal(cl_store_kv_add(kv, "n", 1, 1000, &v), COLLIE_OK);
    assert_true(kv_is(kv, "n", "998"));
    assert_int_equal(cl_store_kv_set(kv, "z", 1, "-9223372036854775807", 20), COLLIE_OK);
    assert_int_equal(cl_store_kv_add(kv, "z", 1, -1, &v), COLLIE_OK);
    assert_true(v == INT64_MIN && kv_is(kv, "z", "-9223372036854775808"));
    assert_int_equal(cl_store_kv_add(kv, "z", 1, INT64_MAX, &v), COLLIE_OK);
    assert_true(v == -1 && kv_is(kv, "z", "-1"));
    assert_int_equal(cl_store_kv_add(kv, "z", 1, 1, &v), COLLIE_OK);
    assert_true(v == 0 && kv_is(kv, "z", "0"));
    assert_int_equal(cl_store_kv_set(kv, "n", 1, "9223372036854775807", 19), COLLIE_OK);
    assert_int_equal(cl_store_kv_add(kv, "n", 1, 1, &v), COLLIE_EINVAL);
    assert_non_null(strstr(cl_store_kv_error(kv), "overflow"));
    assert_int_equal(cl_store_kv_set(kv, "s", 1, "12a", 3), COLLIE_OK);
    assert_int_equal(cl_store_kv_add(kv, "s", 1, 1, &v), COLLIE_EINVAL);
    assert_true(kv_is(kv, "s", "12a"));

    assert_int_equal(cl_store_kv_append(kv, "ap", 2, "ab", 2), COLLIE_OK); /* creates */
    for (int i = 0; i < 20; i++)
        assert_int_equal(cl_store_kv_append(kv, "ap", 2, "c", 1), COLLIE_OK);
    assert_true(kv_is(kv, "ap", "abcccccccccccccccccccc"));

    const uint8_t *cur;
    size_t clen;
    /* missing key + empty expected: set */
    assert_int_equal(cl_store_kv_compare_set(kv, "c", 1, "", 0, "x", 1, &cur, &clen), COLLIE_OK);
    assert_true(clen == 1 && cur[0] == 'x');
    /* mismatch: unchanged, current value returned */
    assert_int_equal(cl_store_kv_compare_set(kv, "c", 1, "y", 1, "z", 1, &cur, &clen), COLLIE_OK);
    assert_true(clen == 1 && cur[0] == 'x');
    /* match: swapped */
    assert_int_equal(cl_store_kv_compare_set(kv, "c", 1, "x", 1, "zz", 2, &cur, &clen), COLLIE_OK);
    assert_true(kv_is(kv, "c", "zz"));
    /* missing key + non-empty expected: nothing stored, empty result */
    assert_int_equal(cl_store_kv_compare_set(kv, "m", 1, "q", 1, "r", 1, &cur, &clen), COLLIE_OK);
    assert_int_equal(clen, 0);
    assert_true(kv_is(kv, "m", NULL));
    cl_store_kv_destroy(kv);
}

static void test_kv_waiters(void **state) {
    (void)state;
    cl_store_kv *kv = kv_new(64, 64, 100);
    cl_store_waiter w1, w2, w3;
    cl_store_bytes k1[1] = {B("a")}, k2[2] = {B("a"), B("b")};
    assert_int_equal(cl_store_kv_watch(kv, &w1, 1, k1, CL_STORE_WAIT_EXISTS, 0), COLLIE_OK);
    assert_int_equal(cl_store_kv_watch(kv, &w2, 2, k2, CL_STORE_WAIT_EXISTS, 0), COLLIE_OK);
    assert_null(cl_store_kv_pop_ready(kv));
    assert_int_equal(cl_store_kv_num_keys(kv), 0); /* placeholders are not keys */
    cl_store_kv_set(kv, "a", 1, "va", 2);
    assert_ptr_equal(cl_store_kv_pop_ready(kv), &w1);
    assert_null(cl_store_kv_pop_ready(kv)); /* w2 still misses b */
    const uint8_t *v;
    size_t len;
    assert_true(cl_store_kv_waiter_value(&w1, 0, &v, &len));
    assert_true(len == 2 && memcmp(v, "va", 2) == 0);
    cl_store_kv_unwatch(kv, &w1);
    /* a waiter made ready, then unsatisfied again, leaves the ready list */
    cl_store_kv_set(kv, "b", 1, "vb", 2);
    bool existed;
    cl_store_kv_delete(kv, "a", 1, &existed);
    assert_null(cl_store_kv_pop_ready(kv));
    cl_store_kv_set(kv, "a", 1, "va2", 3);
    assert_ptr_equal(cl_store_kv_pop_ready(kv), &w2);
    assert_true(cl_store_kv_waiter_value(&w2, 1, &v, &len));
    assert_true(len == 2 && memcmp(v, "vb", 2) == 0);
    cl_store_kv_unwatch(kv, &w2);
    /* already satisfied: ready at once */
    assert_int_equal(cl_store_kv_watch(kv, &w3, 2, k2, CL_STORE_WAIT_EXISTS, 0), COLLIE_OK);
    assert_ptr_equal(cl_store_kv_pop_ready(kv), &w3);
    cl_store_kv_unwatch(kv, &w3);
    /* a cancelled (unwatched) waiter on a missing key drops its placeholder */
    cl_store_bytes kz[1] = {B("zz")};
    assert_int_equal(cl_store_kv_watch(kv, &w3, 1, kz, CL_STORE_WAIT_EXISTS, 0), COLLIE_OK);
    cl_store_kv_unwatch(kv, &w3);
    cl_store_kv_set(kv, "zz", 2, "1", 1);
    assert_null(cl_store_kv_pop_ready(kv));
    /* key too long for a watch */
    cl_store_kv *small = kv_new(1, 64, 100);
    assert_int_equal(cl_store_kv_watch(small, &w3, 1, kz, CL_STORE_WAIT_EXISTS, 0), COLLIE_ELIMIT);
    cl_store_kv_destroy(small);
    cl_store_kv_destroy(kv);
}

static void test_kv_barrier_waiters(void **state) {
    (void)state;
    cl_store_kv *kv = kv_new(64, 64, 100);
    cl_store_waiter w[3];
    cl_store_bytes k[1] = {B("bar")};
    int64_t c;
    /* round 1 of n = 3: targets 3 */
    for (int i = 0; i < 2; i++) {
        cl_store_kv_add(kv, "bar", 3, 1, &c);
        assert_int_equal(cl_store_kv_watch(kv, &w[i], 1, k, CL_STORE_WAIT_AT_LEAST, 3), COLLIE_OK);
    }
    assert_null(cl_store_kv_pop_ready(kv));
    cl_store_kv_add(kv, "bar", 3, 1, &c);
    assert_int_equal(c, 3);
    assert_int_equal(cl_store_kv_watch(kv, &w[2], 1, k, CL_STORE_WAIT_AT_LEAST, 3), COLLIE_OK);
    int ready = 0;
    cl_store_waiter *r;
    while ((r = cl_store_kv_pop_ready(kv))) {
        ready++;
        cl_store_kv_unwatch(kv, r);
    }
    assert_int_equal(ready, 3);
    /* round 2 targets 6: an arrival at 4 waits */
    cl_store_kv_add(kv, "bar", 3, 1, &c);
    assert_int_equal(cl_store_kv_watch(kv, &w[0], 1, k, CL_STORE_WAIT_AT_LEAST, 6), COLLIE_OK);
    assert_null(cl_store_kv_pop_ready(kv));
    /* AT_LEAST needs exactly one key */
    cl_store_bytes k2[2] = {B("a"), B("b")};
    assert_int_equal(cl_store_kv_watch(kv, &w[1], 2, k2, CL_STORE_WAIT_AT_LEAST, 1), COLLIE_EINVAL);
    /* destroying the table with a registered waiter is safe */
    cl_store_kv_destroy(kv);
}

/* ---- siphash, idmap, auth, addresses ----------------------------------------------------- */

static void test_siphash_vector(void **state) {
    (void)state;
    uint8_t key[16], msg[15];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 15; i++)
        msg[i] = (uint8_t)i;
    /* the reference vector from the SipHash paper (appendix A) */
    assert_true(cl_store_siphash(key, msg, 15) == 0xa129ca6149be45e5ULL);
    assert_true(cl_store_siphash(key, "", 0) == 0x726fdb47dd0e0e31ULL);
}

typedef struct id_item {
    cl_idnode node;
    int v;
} id_item;

static void test_idmap(void **state) {
    (void)state;
    cl_idmap m = {0};
    enum { N = 5000 };
    id_item *items = calloc(N, sizeof *items);
    for (int i = 0; i < N; i++) {
        items[i].node.key = (uint64_t)i * 7 + 1 + (i % 2 ? 0 : (1ull << 40));
        items[i].v = i;
        assert_true(cl_idmap_put(&m, &items[i].node));
    }
    for (int i = 0; i < N; i += 3) {
        cl_idnode *n = cl_idmap_get(&m, items[i].node.key);
        assert_non_null(n);
        assert_int_equal(((id_item *)n)->v, i);
        assert_null(cl_idmap_next(n));
    }
    assert_null(cl_idmap_get(&m, 2));
    assert_null(cl_idmap_get(&m, 1)); /* item 0's key has bit 40 set */
    for (int i = 0; i < N; i += 2)
        assert_ptr_equal(cl_idmap_del(&m, items[i].node.key), &items[i].node);
    assert_null(cl_idmap_del(&m, 1ull << 40 | 1));
    assert_false(cl_idmap_remove(&m, &items[0].node)); /* already gone */
    assert_int_equal(m.count, N / 2);
    assert_non_null(cl_idmap_get(&m, 8));
    /* repeated keys: each is found, removing one by node keeps the others */
    id_item dup[3] = {{.v = 100}, {.v = 101}, {.v = 102}};
    for (int i = 0; i < 3; i++) {
        dup[i].node.key = 8;
        assert_true(cl_idmap_put(&m, &dup[i].node));
    }
    int seen = 0;
    for (cl_idnode *n = cl_idmap_get(&m, 8); n; n = cl_idmap_next(n))
        seen |= 1 << (((id_item *)n)->v >= 100 ? ((id_item *)n)->v - 100 : 3);
    assert_int_equal(seen, 0xf); /* the three and item 1 (key 8) */
    assert_true(cl_idmap_remove(&m, &dup[1].node));
    seen = 0;
    for (cl_idnode *n = cl_idmap_get(&m, 8); n; n = cl_idmap_next(n))
        seen |= 1 << (((id_item *)n)->v >= 100 ? ((id_item *)n)->v - 100 : 3);
    assert_int_equal(seen, 0xd);
    assert_int_equal(m.count, N / 2 + 2);
    cl_idmap_fini(&m);
    free(items);
}

/* first/after visit every node once, repeated keys included, and a walk
 * that removes the node it stands on (its successor taken first) still
 * visits every node (the store's delete_prefix and destroy do this). */
static void test_idmap_walk(void **state) {
    (void)state;
    cl_idmap m = {0};
    assert_null(cl_idmap_first(&m));
    enum { N = 3000 };
    id_item *items = calloc(N, sizeof *items);
    for (int i = 0; i < N; i++) {
        items[i].node.key = (uint64_t)(i % 1000) * 0x100000001ull; /* each key three times */
        items[i].v = i;
        assert_true(cl_idmap_put(&m, &items[i].node));
    }
    int *seen = calloc(N, sizeof *seen), n = 0;
    for (cl_idnode *x = cl_idmap_first(&m); x && n <= N; x = cl_idmap_after(&m, x), n++)
        seen[((id_item *)x)->v]++;
    assert_int_equal(n, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    /* remove the odd ones while walking */
    n = 0;
    for (cl_idnode *x = cl_idmap_first(&m), *next; x && n <= N; x = next, n++) {
        next = cl_idmap_after(&m, x);
        if (((id_item *)x)->v % 2) assert_true(cl_idmap_remove(&m, x));
    }
    assert_int_equal(n, N);
    assert_int_equal(m.count, N / 2);
    memset(seen, 0, N * sizeof *seen);
    n = 0;
    for (cl_idnode *x = cl_idmap_first(&m); x && n <= N; x = cl_idmap_after(&m, x), n++)
        seen[((id_item *)x)->v]++;
    assert_int_equal(n, N / 2);
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], i % 2 ? 0 : 1);
    cl_idmap_fini(&m);
    free(seen);
    free(items);
}

static void test_auth_proofs(void **state) {
    (void)state;
    uint8_t cn[CL_STORE_NONCE_LEN], sn[CL_STORE_NONCE_LEN], p1[CL_STORE_PROOF_LEN],
        p2[CL_STORE_PROOF_LEN];
    assert_int_equal(cl_store_auth_random(cn, sizeof cn), COLLIE_OK);
    assert_int_equal(cl_store_auth_random(sn, sizeof sn), COLLIE_OK);
    assert_memory_not_equal(cn, sn, sizeof cn);
    assert_int_equal(cl_store_auth_proof("secret", 6, true, cn, sn, p1), COLLIE_OK);
    assert_int_equal(cl_store_auth_proof("secret", 6, false, cn, sn, p2), COLLIE_OK);
    assert_memory_not_equal(p1, p2, sizeof p1); /* directions differ */
    assert_true(cl_store_auth_verify("secret", 6, true, cn, sn, p1, sizeof p1));
    assert_false(cl_store_auth_verify("secret", 6, false, cn, sn, p1, sizeof p1));
    assert_false(cl_store_auth_verify("Secret", 6, true, cn, sn, p1, sizeof p1));
    assert_false(cl_store_auth_verify("secret", 6, true, sn, cn, p1, sizeof p1));
    assert_false(cl_store_auth_verify("secret", 6, true, cn, sn, p1, sizeof p1 - 1));
    assert_false(cl_store_auth_verify("secret", 6, true, cn, sn, NULL, 0));
    /* known answer: HMAC-SHA256(token, label | cnonce | snonce), computed
     * independently with Python's hmac module */
    static const uint8_t want_server[32] = {0xf8, 0xbc, 0x22, 0x1e, 0x57, 0x30, 0xf0, 0x4c,
                                            0x76, 0xfd, 0xe2, 0x6d, 0x09, 0xc8, 0x2a, 0xca,
                                            0xb7, 0x86, 0xb8, 0x47, 0x60, 0xeb, 0x0e, 0xa6,
                                            0x78, 0xbd, 0x3f, 0x91, 0x67, 0x6a, 0xe0, 0xf8};
    static const uint8_t want_client[32] = {0x85, 0x80, 0x77, 0xa8, 0x54, 0xde, 0xc7, 0x09,
                                            0xb2, 0x11, 0xaa, 0x3a, 0x4f, 0x8d, 0x34, 0xbd,
                                            0x75, 0x54, 0xb6, 0x7e, 0x50, 0xc6, 0x9a, 0xb5,
                                            0xa5, 0x2e, 0xa4, 0x8c, 0x8e, 0x5f, 0xdd, 0xae};
    memset(cn, 1, sizeof cn);
    memset(sn, 2, sizeof sn);
    assert_int_equal(cl_store_auth_proof("secret", 6, true, cn, sn, p1), COLLIE_OK);
    assert_memory_equal(p1, want_server, 32);
    assert_int_equal(cl_store_auth_proof("secret", 6, false, cn, sn, p2), COLLIE_OK);
    assert_memory_equal(p2, want_client, 32);
    char *tok = NULL;
    assert_int_equal(cl_store_auth_token("", "test", &tok), COLLIE_EINVAL);
    assert_null(tok);
    assert_int_equal(cl_store_auth_token("abc", "test", &tok), COLLIE_OK);
    assert_string_equal(tok, "abc");
    free(tok);
}

static void test_addr_parse(void **state) {
    (void)state;
    char host[64];
    uint16_t port;
    assert_int_equal(cl_store_addr_parse("127.0.0.1:5000", host, sizeof host, &port), COLLIE_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 5000);
    assert_int_equal(cl_store_addr_parse("[::1]:65535", host, sizeof host, &port), COLLIE_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 65535);
    assert_int_equal(cl_store_addr_parse("node-3.cluster:1", host, sizeof host, &port), COLLIE_OK);
    assert_string_equal(host, "node-3.cluster");
    const char *bad[] = {"127.0.0.1", "127.0.0.1:", ":5000",     "h:0", "h:65536",
                         "h:12x",     "::1:5000",   "[::1]5000", "h:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cl_store_addr_parse(bad[i], host, sizeof host, &port), COLLIE_EINVAL);
        assert_non_null(strstr(collie_last_error(), bad[i]));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_roundtrip),
        cmocka_unit_test(test_hdr_rejects),
        cmocka_unit_test(test_req_single_key_ops),
        cmocka_unit_test(test_req_multi_key_ops),
        cmocka_unit_test(test_req_handshake_ops),
        cmocka_unit_test(test_req_truncated_and_trailing),
        cmocka_unit_test(test_req_fuzz),
        cmocka_unit_test(test_replies),
        cmocka_unit_test(test_reply_positive_status),
        cmocka_unit_test(test_req_truncated_count_says_why),
        cmocka_unit_test(test_kv_basic),
        cmocka_unit_test(test_kv_delete_prefix),
        cmocka_unit_test(test_kv_limits),
        cmocka_unit_test(test_kv_add_append_cas),
        cmocka_unit_test(test_kv_waiters),
        cmocka_unit_test(test_kv_barrier_waiters),
        cmocka_unit_test(test_siphash_vector),
        cmocka_unit_test(test_idmap),
        cmocka_unit_test(test_idmap_walk),
        cmocka_unit_test(test_auth_proofs),
        cmocka_unit_test(test_addr_parse),
    };
    return cltest_main(tests, NULL, NULL);
}
