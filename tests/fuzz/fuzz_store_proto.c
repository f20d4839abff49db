/*
 * fuzz_store_proto.c — the store's wire decoder (store/proto.c) as the
 * server and the client meet it: a byte stream of frames from a peer.
 *
 * Design notes
 *  - Input: byte 0 picks the side (bit 0: 0 the server reading requests,
 *    1 the client reading replies) and, for the server, the limit on a
 *    body (bit 1 clear: the handshake's CL_STORE_SRV_HELLO_MAX_BODY; set: a
 *    ready connection's); the rest is the stream, cut into frames as
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
#include "tests/fuzz/fuzz_store.h"

#include "store/server.h"

#define FUZZ_READY_MAX_BODY (1u << 20) /* a ready server's limit, here */

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
        (void)fuzz_store_body(client, h.op & (uint8_t)~CL_STORE_OP_REPLY, h.status, data + pos,
                              h.body_len);
        pos += h.body_len;
    }
    return 0;
}

/* ---- seeds: a valid frame of every op, both ways ------------------------------------- */

static void seed_one(const char *dir, bool reply, uint8_t op, int32_t status, const cl_store_msg *m,
                     const char *tag) {
    cl_store_wbuf b = {0};
    cl_store_put_u8(&b, (uint8_t)(reply ? 1 : 2));
    fuzz_store_frame(&b, (uint8_t)(op | (reply ? CL_STORE_OP_REPLY : 0)), status, m);
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
    fuzz_store_frame(&b, CL_STORE_OP_HELLO, 0, &hello);
    cl_store_msg auth = {.op = CL_STORE_OP_AUTH, .vals = (cl_store_bytes[1]){{proof, 32}}};
    fuzz_store_frame(&b, CL_STORE_OP_AUTH, 0, &auth);
    cl_store_msg set = {.op = CL_STORE_OP_SET, .n = 1, .keys = keys, .vals = vals};
    fuzz_store_frame(&b, CL_STORE_OP_SET, 0, &set);
    fuzz_seed_write(dir, "req-stream", b.p, b.len);
    cl_store_wbuf_fini(&b);
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
