/*
 * proto.c — encoding and decoding of store frames (format in proto.h).
 *
 * Design notes
 *  - Pure functions: no I/O, no globals, callable from any thread.
 *  - Decoders never trust a length: every read is bounds-checked against
 *    the body, a count is checked against the bytes left before anything is
 *    allocated for it, and a body must be consumed exactly (trailing bytes
 *    are a protocol error too, so two implementations cannot silently
 *    disagree about a field).
 */
#include "store/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"

static const char *const store_proto_op_names[CL_STORE_OP_COUNT_] = {
    [CL_STORE_OP_HELLO] = "hello",
    [CL_STORE_OP_AUTH] = "auth",
    [CL_STORE_OP_SET] = "set",
    [CL_STORE_OP_GET] = "get",
    [CL_STORE_OP_ADD] = "add",
    [CL_STORE_OP_COMPARE_SET] = "compare_set",
    [CL_STORE_OP_CHECK] = "check",
    [CL_STORE_OP_WAIT] = "wait",
    [CL_STORE_OP_DELETE] = "delete",
    [CL_STORE_OP_NUM_KEYS] = "num_keys",
    [CL_STORE_OP_MULTI_GET] = "multi_get",
    [CL_STORE_OP_MULTI_SET] = "multi_set",
    [CL_STORE_OP_APPEND] = "append",
    [CL_STORE_OP_BARRIER] = "barrier",
    [CL_STORE_OP_CANCEL] = "cancel",
    [CL_STORE_OP_DELETE_PREFIX] = "delete_prefix",
};

const char *cl_store_op_name(unsigned op) {
    op &= ~(unsigned)CL_STORE_OP_REPLY;
    return op < CL_STORE_OP_COUNT_ ? store_proto_op_names[op] : NULL;
}

bool cl_store_op_waits(unsigned op) {
    return op == CL_STORE_OP_GET || op == CL_STORE_OP_WAIT || op == CL_STORE_OP_MULTI_GET ||
           op == CL_STORE_OP_BARRIER;
}

/* ---- little-endian helpers ----------------------------------------------------- */

static void store_proto_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t store_proto_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- header -------------------------------------------------------------------- */

void cl_store_hdr_encode(uint8_t out[CL_STORE_HDR_LEN], const cl_store_hdr *h) {
    out[0] = (uint8_t)(CL_STORE_MAGIC & 0xff);
    out[1] = (uint8_t)(CL_STORE_MAGIC >> 8);
    out[2] = h->version;
    out[3] = h->op;
    store_proto_le32(out + 4, h->body_len);
    store_proto_le32(out + 8, h->req_id);
    store_proto_le32(out + 12, (uint32_t)h->status);
}

int cl_store_hdr_decode(const uint8_t in[CL_STORE_HDR_LEN], uint32_t max_body, cl_store_hdr *h,
                        char *why, size_t why_len) {
    char dummy[8];
    if (!why) {
        why = dummy;
        why_len = sizeof dummy;
    }
    unsigned magic = (unsigned)in[0] | (unsigned)in[1] << 8;
    h->version = in[2];
    h->op = in[3];
    h->body_len = store_proto_rd32(in + 4);
    h->req_id = store_proto_rd32(in + 8);
    h->status = (int32_t)store_proto_rd32(in + 12);
    if (magic != CL_STORE_MAGIC) {
        snprintf(why, why_len, "bad magic 0x%04x (not a collie store peer)", magic);
        return COLLIE_EPROTO;
    }
    if (h->version != CL_STORE_PROTO_VERSION) {
        snprintf(why, why_len, "protocol version %u, expected %u", (unsigned)h->version,
                 (unsigned)CL_STORE_PROTO_VERSION);
        return COLLIE_EPROTO;
    }
    if (cl_store_op_name(h->op) == NULL) {
        snprintf(why, why_len, "unknown op %u", (unsigned)(h->op & ~CL_STORE_OP_REPLY));
        return COLLIE_EPROTO;
    }
    if (h->body_len > max_body) {
        snprintf(why, why_len, "frame body of %u bytes exceeds the limit of %u", h->body_len,
                 max_body);
        return COLLIE_ELIMIT;
    }
    return COLLIE_OK;
}

void cl_store_hdr_patch_req_id(uint8_t *frame, uint32_t req_id) {
    store_proto_le32(frame + 8, req_id);
}

/* ---- writer ---------------------------------------------------------------------- */

void cl_store_wbuf_fini(cl_store_wbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static uint8_t *store_proto_reserve(cl_store_wbuf *b, size_t n) {
    if (b->oom) return NULL;
    if (n > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return NULL;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    uint8_t *at = b->p + b->len;
    b->len += n;
    return at;
}

void cl_store_put_u8(cl_store_wbuf *b, uint8_t v) {
    uint8_t *p = store_proto_reserve(b, 1);
    if (p) *p = v;
}

void cl_store_put_u32(cl_store_wbuf *b, uint32_t v) {
    uint8_t *p = store_proto_reserve(b, 4);
    if (p) store_proto_le32(p, v);
}

void cl_store_put_i64(cl_store_wbuf *b, int64_t v) {
    uint8_t *p = store_proto_reserve(b, 8);
    if (!p) return;
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(u >> (8 * i));
}

void cl_store_put_bytes2(cl_store_wbuf *b, const void *p1, size_t l1, const void *p2, size_t l2) {
    if (l1 > UINT32_MAX || l2 > UINT32_MAX - l1) {
        b->oom = true; /* cannot be represented; cl_store_frame_end reports it */
        return;
    }
    uint8_t *p = store_proto_reserve(b, 4 + l1 + l2);
    if (!p) return;
    store_proto_le32(p, (uint32_t)(l1 + l2));
    if (l1) memcpy(p + 4, p1, l1);
    if (l2) memcpy(p + 4 + l1, p2, l2);
}

void cl_store_put_bytes(cl_store_wbuf *b, const void *p, size_t len) {
    cl_store_put_bytes2(b, p, len, NULL, 0);
}

void cl_store_frame_begin(cl_store_wbuf *b, uint8_t op, uint32_t req_id, int32_t status) {
    uint8_t *p = store_proto_reserve(b, CL_STORE_HDR_LEN);
    if (!p) return;
    cl_store_hdr h = {.version = CL_STORE_PROTO_VERSION,
                      .op = op,
                      .body_len = 0,
                      .req_id = req_id,
                      .status = status};
    cl_store_hdr_encode(p, &h);
}

int cl_store_frame_end(cl_store_wbuf *b, size_t start) {
    if (b->oom) return COLLIE_ENOMEM;
    size_t body = b->len - start - CL_STORE_HDR_LEN;
    if (body > CL_STORE_PROTO_MAX_BODY) return COLLIE_ELIMIT;
    store_proto_le32(b->p + start + 4, (uint32_t)body);
    return COLLIE_OK;
}

/* ---- reader ---------------------------------------------------------------------- */

static const uint8_t *store_proto_take(cl_store_rbuf *r, size_t n) {
    if (r->bad || r->len - r->pos < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return p;
}

uint8_t cl_store_get_u8(cl_store_rbuf *r) {
    const uint8_t *p = store_proto_take(r, 1);
    return p ? *p : 0;
}

uint32_t cl_store_get_u32(cl_store_rbuf *r) {
    const uint8_t *p = store_proto_take(r, 4);
    return p ? store_proto_rd32(p) : 0;
}

int64_t cl_store_get_i64(cl_store_rbuf *r) {
    const uint8_t *p = store_proto_take(r, 8);
    if (!p) return 0;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u |= (uint64_t)p[i] << (8 * i);
    return (int64_t)u;
}

cl_store_bytes cl_store_get_bytes(cl_store_rbuf *r) {
    cl_store_bytes b = {NULL, 0};
    uint32_t len = cl_store_get_u32(r);
    const uint8_t *p = store_proto_take(r, len);
    if (p) {
        b.p = p;
        b.len = len;
    }
    return b;
}

/* ---- messages -------------------------------------------------------------------- */

void cl_store_msg_fini(cl_store_msg *m) {
    if (m->keys && m->keys != m->inl_keys) free(m->keys);
    if (m->vals && m->vals != m->inl_vals) free(m->vals);
    m->keys = m->vals = NULL;
    m->n = 0;
}

static void store_proto_msg_init(cl_store_msg *m, uint8_t op) {
    memset(m, 0, sizeof *m);
    m->op = op;
    m->keys = m->inl_keys;
    m->vals = m->inl_vals;
}

/* Read a count of items that each take at least `min_item` bytes, and
 * allocate the arrays for it (keys, and vals if with_vals). */
static int store_proto_get_count(cl_store_rbuf *r, cl_store_msg *m, size_t min_item, bool keys,
                                 bool vals, char *why, size_t why_len) {
    uint32_t n = cl_store_get_u32(r);
    if (r->bad) {
        snprintf(why, why_len, "%s body truncated before its count (%zu bytes)",
                 cl_store_op_name(m->op), r->len);
        return COLLIE_EPROTO;
    }
    if (n == 0 || n > CL_STORE_PROTO_MAX_KEYS || (size_t)n > (r->len - r->pos) / min_item) {
        snprintf(why, why_len, "count %u does not fit the body", n);
        return COLLIE_EPROTO;
    }
    m->n = n;
    if (n > 1 && keys && !(m->keys = calloc(n, sizeof *m->keys))) return COLLIE_ENOMEM;
    if (n > 2 && vals && !(m->vals = calloc(n, sizeof *m->vals))) return COLLIE_ENOMEM;
    return COLLIE_OK;
}

static int store_proto_finish(cl_store_rbuf *r, cl_store_msg *m, int rc, char *why,
                              size_t why_len) {
    if (rc == COLLIE_OK && r->bad) {
        snprintf(why, why_len, "%s body truncated (%zu bytes)", cl_store_op_name(m->op), r->len);
        rc = COLLIE_EPROTO;
    }
    if (rc == COLLIE_OK && r->pos != r->len) {
        snprintf(why, why_len, "%s body has %zu trailing bytes", cl_store_op_name(m->op),
                 r->len - r->pos);
        rc = COLLIE_EPROTO;
    }
    if (rc != COLLIE_OK) cl_store_msg_fini(m);
    return rc;
}

int cl_store_req_decode(uint8_t op, const uint8_t *body, size_t len, cl_store_msg *m, char *why,
                        size_t why_len) {
    char dummy[8];
    if (!why) {
        why = dummy;
        why_len = sizeof dummy;
    }
    cl_store_rbuf r = {.p = body, .len = len};
    int rc = COLLIE_OK;
    store_proto_msg_init(m, op);
    switch (op) {
    case CL_STORE_OP_HELLO:
        m->num = cl_store_get_u8(&r);
        m->vals[0] = cl_store_get_bytes(&r);
        if (!r.bad && m->vals[0].len != CL_STORE_NONCE_LEN) {
            snprintf(why, why_len, "hello nonce of %u bytes", m->vals[0].len);
            rc = COLLIE_EPROTO;
        }
        break;
    case CL_STORE_OP_AUTH:
        m->num = cl_store_get_u8(&r);
        m->vals[0] = cl_store_get_bytes(&r);
        break;
    case CL_STORE_OP_SET:
    case CL_STORE_OP_APPEND:
        m->n = 1;
        m->keys[0] = cl_store_get_bytes(&r);
        m->vals[0] = cl_store_get_bytes(&r);
        break;
    case CL_STORE_OP_GET:
    case CL_STORE_OP_DELETE:
    case CL_STORE_OP_DELETE_PREFIX:
        m->n = 1;
        m->keys[0] = cl_store_get_bytes(&r);
        break;
    case CL_STORE_OP_ADD:
        m->n = 1;
        m->keys[0] = cl_store_get_bytes(&r);
        m->num = cl_store_get_i64(&r);
        break;
    case CL_STORE_OP_COMPARE_SET:
        m->n = 1;
        m->keys[0] = cl_store_get_bytes(&r);
        m->vals[0] = cl_store_get_bytes(&r);
        m->vals[1] = cl_store_get_bytes(&r);
        break;
    case CL_STORE_OP_CHECK:
    case CL_STORE_OP_WAIT:
    case CL_STORE_OP_MULTI_GET:
        rc = store_proto_get_count(&r, m, 4, true, false, why, why_len);
        for (uint32_t i = 0; rc == COLLIE_OK && i < m->n && !r.bad; i++)
            m->keys[i] = cl_store_get_bytes(&r);
        break;
    case CL_STORE_OP_MULTI_SET:
        rc = store_proto_get_count(&r, m, 8, true, true, why, why_len);
        for (uint32_t i = 0; rc == COLLIE_OK && i < m->n && !r.bad; i++) {
            m->keys[i] = cl_store_get_bytes(&r);
            m->vals[i] = cl_store_get_bytes(&r);
        }
        break;
    case CL_STORE_OP_NUM_KEYS: break;
    case CL_STORE_OP_BARRIER:
        m->n = 1;
        m->keys[0] = cl_store_get_bytes(&r);
        m->num = cl_store_get_u32(&r);
        if (!r.bad && m->num == 0) {
            snprintf(why, why_len, "barrier of 0 participants");
            rc = COLLIE_EPROTO;
        }
        break;
    case CL_STORE_OP_CANCEL: m->num = cl_store_get_u32(&r); break;
    default:
        snprintf(why, why_len, "unknown request op %u", (unsigned)op);
        rc = COLLIE_EPROTO;
        break;
    }
    return store_proto_finish(&r, m, rc, why, why_len);
}

int cl_store_reply_decode(uint8_t op, int32_t status, const uint8_t *body, size_t len,
                          cl_store_msg *m, char *why, size_t why_len) {
    char dummy[8];
    if (!why) {
        why = dummy;
        why_len = sizeof dummy;
    }
    cl_store_rbuf r = {.p = body, .len = len};
    int rc = COLLIE_OK;
    store_proto_msg_init(m, op);
    if (status > 0) { /* no collie status: its body is neither a reply nor a message */
        snprintf(why, why_len, "%s reply with status %d (neither OK nor an error)",
                 cl_store_op_name(op) ? cl_store_op_name(op) : "unknown", (int)status);
        return store_proto_finish(&r, m, COLLIE_EPROTO, why, why_len);
    }
    if (status < 0) {
        m->vals[0] = cl_store_get_bytes(&r);
        return store_proto_finish(&r, m, rc, why, why_len);
    }
    switch (op) {
    case CL_STORE_OP_HELLO:
        m->num = cl_store_get_u8(&r);
        m->vals[0] = cl_store_get_bytes(&r);
        m->vals[1] = cl_store_get_bytes(&r);
        if (!r.bad && (m->vals[0].len != CL_STORE_NONCE_LEN ||
                       (m->vals[1].len != 0 && m->vals[1].len != CL_STORE_PROOF_LEN))) {
            snprintf(why, why_len, "hello reply with a nonce of %u and a proof of %u bytes",
                     m->vals[0].len, m->vals[1].len);
            rc = COLLIE_EPROTO;
        }
        break;
    case CL_STORE_OP_GET:
    case CL_STORE_OP_COMPARE_SET: m->vals[0] = cl_store_get_bytes(&r); break;
    case CL_STORE_OP_ADD:
    case CL_STORE_OP_CHECK:
    case CL_STORE_OP_DELETE:
    case CL_STORE_OP_DELETE_PREFIX:
    case CL_STORE_OP_NUM_KEYS: m->num = cl_store_get_i64(&r); break;
    case CL_STORE_OP_MULTI_GET:
        rc = store_proto_get_count(&r, m, 4, false, true, why, why_len);
        for (uint32_t i = 0; rc == COLLIE_OK && i < m->n && !r.bad; i++)
            m->vals[i] = cl_store_get_bytes(&r);
        break;
    case CL_STORE_OP_AUTH:
    case CL_STORE_OP_SET:
    case CL_STORE_OP_WAIT:
    case CL_STORE_OP_MULTI_SET:
    case CL_STORE_OP_APPEND:
    case CL_STORE_OP_BARRIER: break;
    default:
        snprintf(why, why_len, "unexpected reply op %u", (unsigned)op);
        rc = COLLIE_EPROTO;
        break;
    }
    return store_proto_finish(&r, m, rc, why, why_len);
}
