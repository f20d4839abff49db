/*
 * proto.h — the store's wire protocol: frames, their encoding and decoding.
 *
 * Every message is one frame: a 16-byte header followed by `body_len` bytes
 * of body. All integers are little-endian and written byte by byte (never
 * by casting structs), so the format is the same on every host.
 *
 *   offset  size  field
 *        0     2  magic      0xC011
 *        2     1  version    CL_STORE_PROTO_VERSION
 *        3     1  op         CL_STORE_OP_*, | CL_STORE_OP_REPLY in replies
 *        4     4  body_len   bytes after the header
 *        8     4  req_id     chosen by the client, echoed in the reply
 *       12     4  status     0 in requests; a collie status in replies
 *
 * Body fields: u8, u32, i64 (LE), and `bytes` = u32 length + the bytes.
 *
 *   op           request body                      reply body (status 0)
 *   HELLO        u8 has_token, bytes nonce(32)      u8 auth_required, bytes nonce,
 *                                                   bytes proof (32 or empty)
 *   AUTH         u8 kind (CL_STORE_AUTH_*), bytes proof       —
 *   SET          key, value                         —
 *   GET          key                                value            (waits)
 *   ADD          key, i64 delta                     i64 new value
 *   COMPARE_SET  key, expected, desired             value afterwards
 *   CHECK        u32 n, n keys                      i64 1/0
 *   WAIT         u32 n, n keys                      —                (waits)
 *   DELETE       key                                i64 1/0
 *   NUM_KEYS     —                                  i64
 *   MULTI_GET    u32 n, n keys                      u32 n, n values  (waits)
 *   MULTI_SET    u32 n, n × (key, value)            —
 *   APPEND       key, value                         —
 *   BARRIER      key, u32 n                         —                (waits)
 *   CANCEL       u32 req_id of a waiting request    (no reply)
 *   DELETE_PREFIX  prefix                           i64 keys deleted
 *
 * A reply's status is 0 or a negative collie status (a positive one is a
 * protocol error); a reply with a negative status carries `bytes message`
 * (may be empty).
 * Requests are pipelined: a client may send many before reading replies;
 * waiting ops reply when they are satisfied, so replies may come out of
 * order and are matched by req_id.
 *
 * Everything here is pure (no sockets, no globals) so it is unit-tested
 * directly (tests/test_store_proto.c).
 */
#ifndef CL_STORE_PROTO_H
#define CL_STORE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CL_STORE_MAGIC         0xC011u
#define CL_STORE_PROTO_VERSION 1
#define CL_STORE_HDR_LEN       16
#define CL_STORE_NONCE_LEN     32
#define CL_STORE_PROOF_LEN     32 /* HMAC-SHA256 */

/* Protocol-wide hard limits, independent of a server's configured limits:
 * a client rejects arguments beyond them (COLLIE_EINVAL) before sending. */
#define CL_STORE_PROTO_MAX_KEY  (64u * 1024u)
#define CL_STORE_PROTO_MAX_KEYS (1u << 20)              /* keys in one multi-key request */
#define CL_STORE_PROTO_MAX_BODY (1024u * 1024u * 1024u) /* 1 GiB */

enum cl_store_op {
    CL_STORE_OP_HELLO = 1,
    CL_STORE_OP_AUTH = 2,
    CL_STORE_OP_SET = 3,
    CL_STORE_OP_GET = 4,
    CL_STORE_OP_ADD = 5,
    CL_STORE_OP_COMPARE_SET = 6,
    CL_STORE_OP_CHECK = 7,
    CL_STORE_OP_WAIT = 8,
    CL_STORE_OP_DELETE = 9,
    CL_STORE_OP_NUM_KEYS = 10,
    CL_STORE_OP_MULTI_GET = 11,
    CL_STORE_OP_MULTI_SET = 12,
    CL_STORE_OP_APPEND = 13,
    CL_STORE_OP_BARRIER = 14,
    CL_STORE_OP_CANCEL = 15,
    CL_STORE_OP_DELETE_PREFIX = 16,
    CL_STORE_OP_COUNT_ = 17, /* one past the last */
    CL_STORE_OP_REPLY = 0x80,
};

/* AUTH kinds: a proof, or the client's reason for refusing to go on (so the
 * server can log why the client left). */
enum cl_store_auth_kind {
    CL_STORE_AUTH_PROOF = 0,      /* proof = HMAC(token, client label, nonces) */
    CL_STORE_AUTH_NO_TOKEN = 1,   /* the server wants a token, the client has none */
    CL_STORE_AUTH_BAD_SERVER = 2, /* the server's proof did not verify */
};

typedef struct cl_store_hdr {
    uint8_t version;
    uint8_t op;
    uint32_t body_len;
    uint32_t req_id;
    int32_t status;
} cl_store_hdr;

/* A byte string pointing into someone else's buffer. */
typedef struct cl_store_bytes {
    const uint8_t *p;
    uint32_t len;
} cl_store_bytes;

/* cl_store_op_name: "set", "get", ... for messages; "op 77" style for
 * unknown codes is the caller's job (returns NULL). */
const char *cl_store_op_name(unsigned op);

/* cl_store_op_waits: does the server hold this request until a condition
 * holds (GET, WAIT, MULTI_GET, BARRIER)? Those are the ones CANCEL drops. */
bool cl_store_op_waits(unsigned op);

/* ---- header ---------------------------------------------------------------- */

void cl_store_hdr_encode(uint8_t out[CL_STORE_HDR_LEN], const cl_store_hdr *h);

/* cl_store_hdr_decode: parse and validate a header. Returns COLLIE_OK,
 * COLLIE_EPROTO (bad magic, version or op; `why` says which) or
 * COLLIE_ELIMIT (body_len > max_body). `why` may be NULL. */
int cl_store_hdr_decode(const uint8_t in[CL_STORE_HDR_LEN], uint32_t max_body, cl_store_hdr *h,
                        char *why, size_t why_len);

/* cl_store_hdr_patch_req_id: overwrite req_id in an encoded frame. */
void cl_store_hdr_patch_req_id(uint8_t *frame, uint32_t req_id);

/* ---- writer ---------------------------------------------------------------- */

/* A growable output buffer. Allocation failures are sticky (`oom`), so a
 * sequence of writes is checked once at the end. */
typedef struct cl_store_wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} cl_store_wbuf;

void cl_store_wbuf_fini(cl_store_wbuf *b); /* frees p */
void cl_store_put_u8(cl_store_wbuf *b, uint8_t v);
void cl_store_put_u32(cl_store_wbuf *b, uint32_t v);
void cl_store_put_i64(cl_store_wbuf *b, int64_t v);
/* bytes made of two parts (a key behind its view's prefix): u32 (l1 + l2),
 * then both. */
void cl_store_put_bytes2(cl_store_wbuf *b, const void *p1, size_t l1, const void *p2, size_t l2);
void cl_store_put_bytes(cl_store_wbuf *b, const void *p, size_t len);

/* cl_store_frame_begin: append a header (body_len to be patched).
 * cl_store_frame_end: patch the body_len of the frame that starts at
 * `start`. Returns COLLIE_OK, COLLIE_ENOMEM or COLLIE_ELIMIT (body too big). */
void cl_store_frame_begin(cl_store_wbuf *b, uint8_t op, uint32_t req_id, int32_t status);
int cl_store_frame_end(cl_store_wbuf *b, size_t start);

/* ---- reader ---------------------------------------------------------------- */

/* A cursor over a received body. Reads past the end set `bad` and return
 * zeros, so a decoder checks `bad` once. */
typedef struct cl_store_rbuf {
    const uint8_t *p;
    size_t len, pos;
    bool bad;
} cl_store_rbuf;

uint8_t cl_store_get_u8(cl_store_rbuf *r);
uint32_t cl_store_get_u32(cl_store_rbuf *r);
int64_t cl_store_get_i64(cl_store_rbuf *r);
cl_store_bytes cl_store_get_bytes(cl_store_rbuf *r);

/* ---- whole messages ---------------------------------------------------------- */

/* A decoded request or reply body. keys/vals point into the body, which
 * must outlive the message. Single-key messages use the inline slots; a
 * multi-key message allocates the arrays (cl_store_msg_fini frees them). */
typedef struct cl_store_msg {
    uint8_t op; /* without CL_STORE_OP_REPLY */
    uint32_t n; /* keys (requests) or values (MULTI_GET reply) */
    cl_store_bytes *keys;
    cl_store_bytes *vals; /* SET/APPEND/MULTI_SET values; COMPARE_SET: expected, desired;
                             HELLO: nonce, proof; AUTH: proof; replies: values/message */
    int64_t num;          /* ADD delta, BARRIER n, CANCEL target, HELLO/AUTH flag, i64 results */
    cl_store_bytes inl_keys[1], inl_vals[2];
} cl_store_msg;

void cl_store_msg_fini(cl_store_msg *m);

/* cl_store_req_decode: decode a request body of op `op`. Returns COLLIE_OK,
 * COLLIE_EPROTO (truncated/overlong body, unknown op, a count that cannot
 * fit) or COLLIE_ENOMEM; `why` names the problem. */
int cl_store_req_decode(uint8_t op, const uint8_t *body, size_t len, cl_store_msg *m, char *why,
                        size_t why_len);

/* cl_store_reply_decode: decode the body of a reply to `op` with `status`.
 * For errors m->vals[0] is the server's message; a positive status is
 * COLLIE_EPROTO. Same returns as above. */
int cl_store_reply_decode(uint8_t op, int32_t status, const uint8_t *body, size_t len,
                          cl_store_msg *m, char *why, size_t why_len);

#endif
