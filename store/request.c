/*
 * request.c — store requests as works: creation and posting, the work
 * hooks, turning a reply into results, and the typed result accessors.
 *
 * Design notes
 *  - A request is a cl_store_req with its collie_work first. The whole frame
 *    is encoded on the posting thread (only its request id is patched in on
 *    the loop thread when it is sent), so the loop never touches user memory
 *    and a post that fails has had no side effect.
 *  - Results are written by the loop thread only after it has won
 *    cl_work_claim, and become visible with the DONE state (release/acquire
 *    in work.c); accessors read them only once the work is done. A request
 *    finished by someone else (deadline, cancel) never gets results.
 *  - Each op has its own ops table (its name is the op's name in messages);
 *    accessors recognise store works by their table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "store/client.h"

static void store_req_start(collie_work *w) { cl_store_core_start((cl_store_req *)w); }

static void store_req_detach(collie_work *w) { cl_store_core_detach((cl_store_req *)w); }

static void store_req_free(collie_work *w) {
    cl_store_req *r = (cl_store_req *)w;
    cl_store_wbuf_fini(&r->frame);
    free(r->vals);
    free(r->block);
    if (r->core) cl_store_core_release(r->core);
    free(r);
}

static void store_req_describe(const collie_work *w, char *buf, size_t len) {
    const cl_store_req *r = (const cl_store_req *)w;
    char where[160];
    cl_store_core_describe(r->core, where, sizeof where);
    snprintf(buf, len, " (%s%s%s)", r->desc, r->desc[0] ? " on " : "", where);
}

#define STORE_REQ_OPS(op, opname)                                                                  \
    [op] = {.name = "store." opname,                                                               \
            .start = store_req_start,                                                              \
            .detach = store_req_detach,                                                            \
            .free = store_req_free,                                                                \
            .describe = store_req_describe}

static const cl_work_ops store_req_ops[CL_STORE_OP_COUNT_] = {
    STORE_REQ_OPS(CL_STORE_OP_SET, "set"),
    STORE_REQ_OPS(CL_STORE_OP_GET, "get"),
    STORE_REQ_OPS(CL_STORE_OP_ADD, "add"),
    STORE_REQ_OPS(CL_STORE_OP_COMPARE_SET, "compare_set"),
    STORE_REQ_OPS(CL_STORE_OP_CHECK, "check"),
    STORE_REQ_OPS(CL_STORE_OP_WAIT, "wait"),
    STORE_REQ_OPS(CL_STORE_OP_DELETE, "delete"),
    STORE_REQ_OPS(CL_STORE_OP_NUM_KEYS, "num_keys"),
    STORE_REQ_OPS(CL_STORE_OP_MULTI_GET, "multi_get"),
    STORE_REQ_OPS(CL_STORE_OP_MULTI_SET, "multi_set"),
    STORE_REQ_OPS(CL_STORE_OP_APPEND, "append"),
    STORE_REQ_OPS(CL_STORE_OP_BARRIER, "barrier"),
    STORE_REQ_OPS(CL_STORE_OP_DELETE_PREFIX, "delete_prefix"),
};

/* ---- posting ------------------------------------------------------------------- */

int cl_store_req_new(cl_store_core *c, uint8_t op, const collie_post_opts *o, cl_store_req **out) {
    *out = NULL;
    cl_store_req *r = calloc(1, sizeof *r);
    if (!r) return cl_set_last_error(COLLIE_ENOMEM, "store: out of memory");
    int rc = cl_work_init(&r->work, c->engine, &store_req_ops[op], o, c->timeout_ms);
    if (rc != COLLIE_OK) {
        free(r);
        return rc;
    }
    cl_store_core_hold(c);
    r->core = c;
    r->op = op;
    r->work.seq = atomic_fetch_add_explicit(&c->seq, 1, memory_order_relaxed) + 1;
    cl_store_frame_begin(&r->frame, op, 0, 0);
    *out = r;
    return COLLIE_OK;
}

int cl_store_req_post(cl_store_req *r, collie_work **out) {
    int rc = cl_store_frame_end(&r->frame, 0);
    if (rc == COLLIE_ELIMIT)
        cl_set_last_error(COLLIE_EINVAL,
                          "%s: the request is %zu bytes, over the protocol limit "
                          "of %u",
                          r->work.ops->name, r->frame.len, CL_STORE_PROTO_MAX_BODY);
    else if (rc != COLLIE_OK)
        cl_set_last_error(rc, "%s: out of memory encoding the request", r->work.ops->name);
    if (rc == COLLIE_ELIMIT) rc = COLLIE_EINVAL;
    if (rc == COLLIE_OK) {
        r->work.bytes = r->frame.len;
        rc = cl_work_post(&r->work);
    }
    if (rc != COLLIE_OK) {
        collie_work_release(&r->work); /* the only reference: frees r */
        return rc;
    }
    *out = &r->work;
    return COLLIE_OK;
}

/* ---- replies ---------------------------------------------------------------------- */

/* Copy n values into one block, each followed by a NUL. */
static int store_req_keep_values(cl_store_req *r, const cl_store_bytes *v, uint32_t n) {
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += (size_t)v[i].len + 1;
    r->vals = calloc(n ? n : 1, sizeof *r->vals);
    r->block = malloc(total ? total : 1);
    if (!r->vals || !r->block) return COLLIE_ENOMEM;
    uint8_t *p = r->block;
    for (uint32_t i = 0; i < n; i++) {
        if (v[i].len) memcpy(p, v[i].p, v[i].len);
        p[v[i].len] = '\0';
        r->vals[i] = (cl_store_bytes){p, v[i].len};
        p += (size_t)v[i].len + 1;
    }
    r->nvals = n;
    return COLLIE_OK;
}

int cl_store_req_reply(cl_store_req *r, const cl_store_hdr *h, const uint8_t *body) {
    cl_store_msg m;
    char why[160];
    int rc = cl_store_reply_decode(r->op, h->status, body, h->body_len, &m, why, sizeof why);
    if (rc == COLLIE_OK && h->status == COLLIE_OK && r->op == CL_STORE_OP_MULTI_GET &&
        m.n != r->nkeys) {
        snprintf(why, sizeof why, "multi_get reply with %u values for %u keys", m.n, r->nkeys);
        cl_store_msg_fini(&m);
        rc = COLLIE_EPROTO;
    }
    if (rc != COLLIE_OK) {
        cl_work_finish(&r->work, rc, "malformed reply from the server: %s", why);
        return COLLIE_EPROTO;
    }
    if (!cl_work_claim(&r->work)) { /* finished meanwhile (deadline, cancel) */
        cl_store_msg_fini(&m);
        return COLLIE_OK;
    }
    int status = h->status;
    if (status < 0) {
        const cl_store_bytes *msg = &m.vals[0];
        if (!cl_status_is_error(status)) status = COLLIE_EPROTO;
        cl_work_publish(&r->work, status, "the server refused it: %.*s", (int)msg->len,
                        (const char *)msg->p);
    } else if (status != COLLIE_OK) {
        cl_work_publish(&r->work, COLLIE_EPROTO, "the server replied with status %d", status);
    } else {
        rc = COLLIE_OK;
        if (r->op == CL_STORE_OP_GET || r->op == CL_STORE_OP_COMPARE_SET)
            rc = store_req_keep_values(r, m.vals, 1);
        else if (r->op == CL_STORE_OP_MULTI_GET)
            rc = store_req_keep_values(r, m.vals, m.n);
        r->ival = m.num;
        if (rc == COLLIE_OK)
            cl_work_publish(&r->work, COLLIE_OK, NULL);
        else
            cl_work_publish(&r->work, rc, "out of memory for the reply");
    }
    cl_store_msg_fini(&m);
    return COLLIE_OK;
}

/* ---- result accessors ----------------------------------------------------------- */

/* The request behind w if it is a store work of one of the ops in `mask`
 * (bit op) and finished successfully; else the status to return. */
static int store_req_result(const collie_work *w, unsigned mask, const cl_store_req **out) {
    *out = NULL;
    if (!w) return COLLIE_EINVAL;
    const cl_store_req *r = NULL;
    for (unsigned op = 0; op < CL_STORE_OP_COUNT_ && !r; op++)
        if (store_req_ops[op].name && w->ops == &store_req_ops[op] && (mask & (1u << op)))
            r = (const cl_store_req *)w;
    if (!r) return COLLIE_EINVAL;
    int st = collie_work_result(w);
    if (st != COLLIE_OK) return st;
    *out = r;
    return COLLIE_OK;
}

int collie_store_work_value(const collie_work *w, const void **val, size_t *len) {
    const cl_store_req *r;
    int rc = store_req_result(w, 1u << CL_STORE_OP_GET | 1u << CL_STORE_OP_COMPARE_SET, &r);
    if (val) *val = rc == COLLIE_OK ? r->vals[0].p : NULL;
    if (len) *len = rc == COLLIE_OK ? r->vals[0].len : 0;
    return rc;
}

int collie_store_work_value_at(const collie_work *w, size_t i, const void **val, size_t *len) {
    const cl_store_req *r;
    int rc = store_req_result(w, 1u << CL_STORE_OP_MULTI_GET, &r);
    if (rc == COLLIE_OK && i >= r->nvals) rc = COLLIE_EINVAL;
    if (val) *val = rc == COLLIE_OK ? r->vals[i].p : NULL;
    if (len) *len = rc == COLLIE_OK ? r->vals[i].len : 0;
    return rc;
}

int collie_store_work_int(const collie_work *w, int64_t *out) {
    const cl_store_req *r;
    int rc = store_req_result(w,
                              1u << CL_STORE_OP_ADD | 1u << CL_STORE_OP_CHECK |
                                  1u << CL_STORE_OP_DELETE | 1u << CL_STORE_OP_NUM_KEYS |
                                  1u << CL_STORE_OP_DELETE_PREFIX,
                              &r);
    if (out) *out = rc == COLLIE_OK ? r->ival : 0;
    return rc;
}
