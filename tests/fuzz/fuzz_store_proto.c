/*
 * fuzz_store_proto.c — the store's wire decoder (store/proto.c) as the
 * server and the client meet it: a byte stream of frames from a peer.
 *
 * Design notes
 *  - Input: byte 0 picks the side (bit 0: 0 the server reading requests,
 *    1 the client reading replies) and, for the server, the limit on a
 *    body (bit 1: the handshake's CL_STORE_SRV_HELLO_MAX_BODY, or a ready
 *    connection's); the rest is the stream, cut into frames as
 *    srv_conn.c / client.c cut it (header, body_len bytes of body, next).
 *  - Invariants asserted beyond "no crash, no leak, no UB":
 *    a header that decodes re-encodes to the same 16 bytes, names an op and
 *    keeps body_len within the limit; a body that decodes re-encodes (from
 *    the decoded message, with proto.c's writers) to exactly its bytes: the
 *    decoder accepts only canonical bodies and loses nothing; every view it
 *    returns lies within the body; the counts the server and client index
 *    by (n, nonce and proof lengths, a barrier's participants) hold what
 *    they rely on; a reply that is not OK carries the server's message (the
 *    client prints it); a rejected body leaves the message empty (nothing
 *    to free, n = 0) and a reason in `why`.
 */
#include "tests/fuzz/fuzz.h"

#include "collie.h"
#include "store/proto.h"
#include "store/server.h"

#define FUZZ_READY_MAX_BODY (1u << 20) /* a ready server's limit, here */

/* Encode the body of a decoded request or reply again, the way the client
 * and server write them (proto.h's table). */
static void enc_body(cl_store_wbuf *b, const cl_store_msg *m, bool reply, int32_t status) {
    if (reply && status < 0) {
        cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
        return;
    }
    switch (m->op) {
    case CL_STORE_OP_HELLO:
        cl_store_put_u8(b, (uint8_t)m->num);
        cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
        if (reply) cl_store_put_bytes(b, m->vals[1].p, m->vals[1].len);
        break;
    case CL_STORE_OP_AUTH:
        if (reply) break;
        cl_store_put_u8(b, (uint8_t)m->num);
        cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
        break;
    case CL_STORE_OP_SET:
    case CL_STORE_OP_APPEND:
        if (reply) break;
        cl_store_put_bytes(b, m->keys[0].p, m->keys[0].len);
        cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
        break;
    case CL_STORE_OP_GET:
        if (reply)
            cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
        else
            cl_store_put_bytes(b, m->keys[0].p, m->keys[0].len);
        break;
    case CL_STORE_OP_DELETE:
    case CL_STORE_OP_DELETE_PREFIX:
        if (reply)
            cl_store_put_i64(b, m->num);
        else
            cl_store_put_bytes(b, m->keys[0].p, m->keys[0].len);
        break;
    case CL_STORE_OP_ADD:
        if (!reply) cl_store_put_bytes(b, m->keys[0].p, m->keys[0].len);
        cl_store_put_i64(b, m->num);
        break;
    case CL_STORE_OP_COMPARE_SET:
        if (reply) {
            cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
            break;
        }
        cl_store_put_bytes(b, m->keys[0].p, m->keys[0].len);
        cl_store_put_bytes(b, m->vals[0].p, m->vals[0].len);
        cl_store_put_bytes(b, m->vals[1].p, m->vals[1].len);
        break;
    case CL_STORE_OP_CHECK:
        if (reply) {
            cl_store_put_i64(b, m->num);
            break;
        }
        /* fall through */
    case CL_STORE_OP_WAIT:
        if (reply) break;
        /* fall through */
    case CL_STORE_OP_MULTI_GET:
        cl_store_put_u32(b, m->n);
        for (uint32_t i = 0; i < m->n; i++) {
            const cl_store_bytes *v = reply ? &m->vals[i] : &m->keys[i];
            cl_store_put_bytes(b, v->p, v->len);
        }
        break;
    case CL_STORE_OP_MULTI_SET:
        if (reply) break;
        cl_store_put_u32(b, m->n);
        for (uint32_t i = 0; i < m->n; i++) {
            cl_store_put_bytes(b, m->keys[i].p, m->keys[i].len);
            cl_store_put_bytes(b, m->vals[i].p, m->vals[i].len);
        }
        break;
    case CL_STORE_OP_NUM_KEYS:
        if (reply) cl_store_put_i64(b, m->num);
        break;
    case CL_STORE_OP_BARRIER:
        if (reply) break;
        cl_store_put_bytes(b, m->keys[0].p, m->keys[0].len);
        cl_store_put_u32(b, (uint32_t)m->num);
        break;
    case CL_STORE_OP_CANCEL: cl_store_put_u32(b, (uint32_t)m->num); break;
    default: FUZZ_CHECK(false, "decoded an unknown op %u", m->op);
    }
}

/* The views of a decoded message lie in the body; the counts hold what the
 * server and the client rely on. */
static void check_msg(const cl_store_msg *m, bool reply, int32_t status, const uint8_t *body,
                      size_t len) {
    uint32_t nk = 0, nv = 0;
    FUZZ_CHECK(m->op == (m->op & ~CL_STORE_OP_REPLY) && cl_store_op_name(m->op), "op %u", m->op);
    if (reply && status != COLLIE_OK) {
        /* the client prints it: "the server refused it: %.*s" */
        FUZZ_CHECK(m->vals[0].p != NULL && fuzz_within(m->vals[0].p, m->vals[0].len, body, len),
                   "a reply with status %d and no message in its body", (int)status);
        return;
    }
    switch (m->op) {
    case CL_STORE_OP_HELLO:
        FUZZ_CHECK(m->vals[0].len == CL_STORE_NONCE_LEN, "nonce of %u bytes", m->vals[0].len);
        FUZZ_CHECK(!reply || m->vals[1].len == 0 || m->vals[1].len == CL_STORE_PROOF_LEN,
                   "proof of %u bytes", m->vals[1].len);
        FUZZ_CHECK(m->num >= 0 && m->num <= 255, "hello flag %lld", (long long)m->num);
        nv = reply ? 2 : 1;
        break;
    case CL_STORE_OP_AUTH: nv = reply ? 0 : 1; break;
    case CL_STORE_OP_SET:
    case CL_STORE_OP_APPEND: nk = nv = reply ? 0 : 1; break;
    case CL_STORE_OP_GET: reply ? (nv = 1) : (nk = 1); break;
    case CL_STORE_OP_COMPARE_SET:
        nv = reply ? 1 : 2;
        nk = reply ? 0 : 1;
        break;
    case CL_STORE_OP_ADD:
    case CL_STORE_OP_DELETE:
    case CL_STORE_OP_DELETE_PREFIX: nk = reply ? 0 : 1; break;
    case CL_STORE_OP_CHECK:
    case CL_STORE_OP_WAIT:
    case CL_STORE_OP_MULTI_GET:
    case CL_STORE_OP_MULTI_SET:
        if (reply && m->op != CL_STORE_OP_MULTI_GET) break;
        FUZZ_CHECK(m->n >= 1 && m->n <= CL_STORE_PROTO_MAX_KEYS, "count %u", m->n);
        if (reply)
            nv = m->n;
        else
            nk = m->n;
        if (m->op == CL_STORE_OP_MULTI_SET) nv = m->n;
        break;
    case CL_STORE_OP_BARRIER:
        if (reply) break;
        nk = 1;
        FUZZ_CHECK(m->num >= 1 && m->num <= UINT32_MAX, "barrier of %lld", (long long)m->num);
        break;
    default: break;
    }
    for (uint32_t i = 0; i < nk; i++)
        FUZZ_CHECK(m->keys[i].p && fuzz_within(m->keys[i].p, m->keys[i].len, body, len),
                   "key %u outside the body", i);
    for (uint32_t i = 0; i < nv; i++)
        FUZZ_CHECK(m->vals[i].p && fuzz_within(m->vals[i].p, m->vals[i].len, body, len),
                   "value %u outside the body", i);
}

static void fuzz_body(bool reply, uint8_t op, int32_t status, const uint8_t *body, size_t len) {
    cl_store_msg m;
    char why[256] = "";
    int rc = reply ? cl_store_reply_decode(op, status, body, len, &m, why, sizeof why)
                   : cl_store_req_decode(op, body, len, &m, why, sizeof why);
    if (rc != COLLIE_OK) {
        FUZZ_CHECK(rc == COLLIE_EPROTO || rc == COLLIE_ENOMEM, "decode returned %d", rc);
        if (rc == COLLIE_EPROTO) FUZZ_CHECK_WHY(why);
        FUZZ_CHECK(m.keys == NULL && m.vals == NULL && m.n == 0, "a rejected body left state");
        return;
    }
    check_msg(&m, reply, status, body, len);
    cl_store_wbuf b = {0};
    enc_body(&b, &m, reply, status);
    FUZZ_CHECK(!b.oom, "re-encoding ran out of memory");
    FUZZ_CHECK(b.len == len && (len == 0 || memcmp(b.p, body, len) == 0),
               "%s %s of %zu bytes re-encodes to %zu other bytes", cl_store_op_name(op),
               reply ? "reply" : "request", len, b.len);
    cl_store_wbuf_fini(&b);
    cl_store_msg_fini(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool client = data[0] & 1;
    uint32_t max = client ? CL_STORE_PROTO_MAX_BODY
                          : (data[0] & 2 ? FUZZ_READY_MAX_BODY : CL_STORE_SRV_HELLO_MAX_BODY);
    size_t pos = 1;
    while (size - pos >= CL_STORE_HDR_LEN) {
        const uint8_t *hb = data + pos;
        cl_store_hdr h;
        char why[256] = "";
        int rc = cl_store_hdr_decode(hb, max, &h, why, sizeof why);
        if (rc != COLLIE_OK) {
            FUZZ_CHECK(rc == COLLIE_EPROTO || rc == COLLIE_ELIMIT, "header decode returned %d", rc);
            FUZZ_CHECK_WHY(why);
            return 0; /* both sides close the connection */
        }
        uint8_t again[CL_STORE_HDR_LEN];
        cl_store_hdr_encode(again, &h);
        FUZZ_CHECK(memcmp(again, hb, sizeof again) == 0, "a header re-encodes differently");
        FUZZ_CHECK(h.body_len <= max && cl_store_op_name(h.op), "header limits");
        if (!(h.op & CL_STORE_OP_REPLY) == client) return 0; /* rejected: the wrong direction */
        pos += CL_STORE_HDR_LEN;
        if (size - pos < h.body_len) return 0; /* waits for the rest */
        fuzz_body(client, h.op & (uint8_t)~CL_STORE_OP_REPLY, h.status, data + pos, h.body_len);
        pos += h.body_len;
    }
    return 0;
}

/* ---- seeds: a valid frame of every op, both ways ------------------------------------- */

static void seed_frame(cl_store_wbuf *b, uint8_t op, int32_t status, const cl_store_msg *m) {
    size_t start = b->len;
    cl_store_frame_begin(b, op, 7, status);
    enc_body(b, m, op & CL_STORE_OP_REPLY, status);
    if (cl_store_frame_end(b, start) != COLLIE_OK) exit(1);
}

static void seed_one(const char *dir, bool reply, uint8_t op, int32_t status, const cl_store_msg *m,
                     const char *tag) {
    cl_store_wbuf b = {0};
    cl_store_put_u8(&b, (uint8_t)(reply ? 1 : 2));
    seed_frame(&b, (uint8_t)(op | (reply ? CL_STORE_OP_REPLY : 0)), status, m);
    char name[64];
    snprintf(name, sizeof name, "%s-%s%s", reply ? "reply" : "req", cl_store_op_name(op), tag);
    fuzz_seed_write(dir, name, b.p, b.len);
    cl_store_wbuf_fini(&b);
}

static void fuzz_seeds(const char *dir) {
    static const uint8_t nonce[CL_STORE_NONCE_LEN] = {1, 2, 3}, proof[CL_STORE_PROOF_LEN] = {9};
    cl_store_bytes keys[3] = {
        {(const uint8_t *)"k0", 2}, {(const uint8_t *)"key1", 4}, {(const uint8_t *)"", 0}};
    cl_store_bytes vals[3] = {
        {(const uint8_t *)"v", 1}, {(const uint8_t *)"value", 5}, {(const uint8_t *)"xyz", 3}};
    for (uint8_t op = 1; op < CL_STORE_OP_COUNT_; op++) {
        cl_store_msg m = {.op = op, .n = 1, .keys = keys, .vals = vals, .num = 3};
        if (op == CL_STORE_OP_HELLO) {
            vals[0] = (cl_store_bytes){nonce, sizeof nonce};
            vals[1] = (cl_store_bytes){proof, sizeof proof};
            m.num = 1;
        }
        if (op == CL_STORE_OP_AUTH) m.num = CL_STORE_AUTH_PROOF;
        if (op >= CL_STORE_OP_CHECK && op <= CL_STORE_OP_MULTI_SET) m.n = 3;
        seed_one(dir, false, op, 0, &m, "");
        if (op != CL_STORE_OP_CANCEL) seed_one(dir, true, op, 0, &m, "");
        if (op == CL_STORE_OP_HELLO) { /* a tokenless server: no proof */
            vals[1].len = 0;
            m.num = 0;
            seed_one(dir, true, op, 0, &m, "-noproof");
            vals[0] = (cl_store_bytes){(const uint8_t *)"v", 1};
            vals[1] = (cl_store_bytes){(const uint8_t *)"value", 5};
        }
    }
    /* an error reply; a handshake then two requests in one stream */
    cl_store_msg err = {.op = CL_STORE_OP_GET, .vals = vals};
    seed_one(dir, true, CL_STORE_OP_GET, COLLIE_EAUTH, &err, "-error");
    cl_store_wbuf b = {0};
    cl_store_put_u8(&b, 0);
    cl_store_msg hello = {.op = CL_STORE_OP_HELLO, .vals = (cl_store_bytes[2]){{nonce, 32}}};
    seed_frame(&b, CL_STORE_OP_HELLO, 0, &hello);
    cl_store_msg auth = {.op = CL_STORE_OP_AUTH, .vals = (cl_store_bytes[1]){{proof, 32}}};
    seed_frame(&b, CL_STORE_OP_AUTH, 0, &auth);
    cl_store_msg set = {.op = CL_STORE_OP_SET, .n = 1, .keys = keys, .vals = vals};
    seed_frame(&b, CL_STORE_OP_SET, 0, &set);
    fuzz_seed_write(dir, "req-stream", b.p, b.len);
    cl_store_wbuf_fini(&b);
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
