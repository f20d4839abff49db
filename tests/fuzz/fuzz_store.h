/*
 * fuzz_store.h — what the store's two fuzz targets share: re-encoding a
 * decoded message with proto.c's writers, the checks every decoded message
 * must pass, and whole frames for the seeds (fuzz_store_proto.c: the
 * decoder alone; fuzz_store_server.c: a live server's connection).
 */
#ifndef CL_FUZZ_STORE_H
#define CL_FUZZ_STORE_H

#include "tests/fuzz/fuzz.h"

#include "collie.h"
#include "store/proto.h"

/* Encode the body of a decoded request or reply again, the way the client
 * and server write them (proto.h's table). */
static inline void fuzz_store_enc_body(cl_store_wbuf *b, const cl_store_msg *m, bool reply,
                                       int32_t status) {
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
static inline void fuzz_store_check_msg(const cl_store_msg *m, bool reply, int32_t status,
                                        const uint8_t *body, size_t len) {
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

/* Decode a body as the server (a request) or the client (a reply) does, and
 * check what came out (above); returns the decoder's status. */
static inline int fuzz_store_body(bool reply, uint8_t op, int32_t status, const uint8_t *body,
                                  size_t len) {
    cl_store_msg m;
    char why[256] = "";
    int rc = reply ? cl_store_reply_decode(op, status, body, len, &m, why, sizeof why)
                   : cl_store_req_decode(op, body, len, &m, why, sizeof why);
    if (rc != COLLIE_OK) {
        FUZZ_CHECK(rc == COLLIE_EPROTO || rc == COLLIE_ENOMEM, "decode returned %d", rc);
        if (rc == COLLIE_EPROTO) FUZZ_CHECK_WHY(why);
        FUZZ_CHECK(m.keys == NULL && m.vals == NULL && m.n == 0, "a rejected body left state");
        return rc;
    }
    fuzz_store_check_msg(&m, reply, status, body, len);
    cl_store_wbuf b = {0};
    fuzz_store_enc_body(&b, &m, reply, status);
    FUZZ_CHECK(!b.oom, "re-encoding ran out of memory");
    FUZZ_CHECK(b.len == len && (len == 0 || memcmp(b.p, body, len) == 0),
               "%s %s of %zu bytes re-encodes to %zu other bytes", cl_store_op_name(op),
               reply ? "reply" : "request", len, b.len);
    cl_store_wbuf_fini(&b);
    cl_store_msg_fini(&m);
    return COLLIE_OK;
}

/* Append one whole frame of op (REPLY bit included for a reply) to b. */
static inline void fuzz_store_frame(cl_store_wbuf *b, uint8_t op, int32_t status,
                                    const cl_store_msg *m) {
    size_t start = b->len;
    cl_store_frame_begin(b, op, 7, status);
    fuzz_store_enc_body(b, m, op & CL_STORE_OP_REPLY, status);
    if (cl_store_frame_end(b, start) != COLLIE_OK) exit(1);
}

#endif
