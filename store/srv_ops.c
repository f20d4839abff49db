/*
 * srv_ops.c — the store server executes authenticated requests on its key
 * table and answers them.
 *
 * Design notes
 *  - Runs on the engine's loop thread only (called from srv_conn.c's read
 *    callback), so every request is atomic with respect to every other.
 *  - Requests that wait (get, wait, multi_get, barrier) become a
 *    store_srv_wait registered in the key table. After each request the
 *    table's ready list is drained and every ready waiter is answered on its
 *    own connection, whichever connection's request made it ready. A
 *    request that is satisfied at once takes the same path (it is ready as
 *    soon as it is registered), so there is one way to answer a wait.
 *  - Barrier: arriving adds 1 to the key's counter (decimal text, like add)
 *    and waits until the counter reaches the end of the arrival's round,
 *    ceil(count / n) * n. Rounds are reusable; a participant that gives up
 *    (cancel, deadline) has still been counted.
 *  - Errors a client can cause by valid requests (limits, a non-integer
 *    add) are replies with a status; only malformed traffic closes the
 *    connection (the caller does that when dispatch returns an error).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "store/server.h"

static void store_srv_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void store_srv_reply_empty(store_srv_conn *c, const cl_store_hdr *h) {
    cl_store_srv_send(c, h->op | CL_STORE_OP_REPLY, h->req_id, COLLIE_OK, NULL, 0);
}

static void store_srv_reply_i64(store_srv_conn *c, const cl_store_hdr *h, int64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    cl_store_bytes part = {b, 8};
    cl_store_srv_send(c, h->op | CL_STORE_OP_REPLY, h->req_id, COLLIE_OK, &part, 1);
}

static void store_srv_reply_value(store_srv_conn *c, uint8_t op, uint32_t req_id,
                                  const uint8_t *val, size_t len) {
    uint8_t lb[4];
    store_srv_le32(lb, (uint32_t)len);
    cl_store_bytes parts[2] = {{lb, 4}, {val, (uint32_t)len}};
    cl_store_srv_send(c, op | CL_STORE_OP_REPLY, req_id, COLLIE_OK, parts, 2);
}

static void store_srv_reply_kv_error(store_srv_conn *c, const cl_store_hdr *h, int status) {
    cl_store_srv_send_error(c, h->op, h->req_id, status, cl_store_kv_error(c->srv->kv));
}

/* ---- waits ---------------------------------------------------------------------- */

static void store_srv_wait_free(store_srv_wait *w) {
    store_srv_conn *c = w->conn;
    cl_store_kv_unwatch(c->srv->kv, &w->kw);
    cl_idmap_remove(&c->waits, &w->node);
    cl_list_remove(&w->link);
    c->nwaits--;
    free(w);
}

void cl_store_srv_drop_waits(store_srv_conn *c) {
    store_srv_wait *w;
    while ((w = cl_list_first(&c->wait_list, store_srv_wait, link)))
        store_srv_wait_free(w);
    cl_idmap_fini(&c->waits);
}

/* Can c start one more wait with this request id? Replies (or returns a
 * protocol error) when not. */
static int store_srv_wait_admit(store_srv_conn *c, const cl_store_hdr *h, char *why,
                                size_t why_len) {
    if (cl_idmap_get(&c->waits, h->req_id)) {
        snprintf(why, why_len, "request id %u is already waiting", h->req_id);
        return COLLIE_EPROTO;
    }
    if (c->nwaits >= CL_STORE_SRV_MAX_WAITS) {
        char msg[96];
        snprintf(msg, sizeof msg, "the connection already holds %u waiting requests",
                 (unsigned)CL_STORE_SRV_MAX_WAITS);
        cl_store_srv_send_error(c, h->op, h->req_id, COLLIE_ELIMIT, msg);
        return COLLIE_INPROGRESS; /* answered */
    }
    return COLLIE_OK;
}

static void store_srv_wait_begin(store_srv_conn *c, const cl_store_hdr *h, const cl_store_msg *m,
                                 int kind, int64_t target) {
    store_srv_wait *w = calloc(1, sizeof *w);
    if (!w) {
        cl_store_srv_send_error(c, h->op, h->req_id, COLLIE_ENOMEM, "server out of memory");
        return;
    }
    int rc = cl_store_kv_watch(c->srv->kv, &w->kw, m->n, m->keys, kind, target);
    if (rc != COLLIE_OK) {
        free(w);
        store_srv_reply_kv_error(c, h, rc);
        return;
    }
    w->conn = c;
    w->op = h->op;
    w->node.key = h->req_id;
    if (!cl_idmap_put(&c->waits, &w->node)) {
        cl_store_kv_unwatch(c->srv->kv, &w->kw);
        free(w);
        cl_store_srv_send_error(c, h->op, h->req_id, COLLIE_ENOMEM, "server out of memory");
        return;
    }
    cl_list_push_front(&c->wait_list, &w->link);
    c->nwaits++;
}

static void store_srv_answer_multi_get(store_srv_wait *w) {
    uint32_t n = w->kw.nlinks;
    uint8_t *lens = malloc((size_t)n * 4 + 4);
    cl_store_bytes *parts = malloc(((size_t)n * 2 + 1) * sizeof *parts);
    if (!lens || !parts) {
        cl_store_srv_send_error(w->conn, w->op, (uint32_t)w->node.key, COLLIE_ENOMEM,
                                "server out of memory");
        goto out;
    }
    store_srv_le32(lens, n);
    parts[0] = (cl_store_bytes){lens, 4};
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *v = NULL;
        size_t len = 0;
        cl_store_kv_waiter_value(&w->kw, i, &v, &len); /* ready: every key is present */
        store_srv_le32(lens + 4 + 4 * (size_t)i, (uint32_t)len);
        parts[1 + 2 * i] = (cl_store_bytes){lens + 4 + 4 * (size_t)i, 4};
        parts[2 + 2 * i] = (cl_store_bytes){v, (uint32_t)len};
    }
    cl_store_srv_send(w->conn, w->op | CL_STORE_OP_REPLY, (uint32_t)w->node.key, COLLIE_OK, parts,
                      2 * (size_t)n + 1);
out:
    free(lens);
    free(parts);
}

static void store_srv_answer(store_srv_wait *w) {
    const uint8_t *v = NULL;
    size_t len = 0;
    switch (w->op) {
    case CL_STORE_OP_GET:
        cl_store_kv_waiter_value(&w->kw, 0, &v, &len);
        store_srv_reply_value(w->conn, w->op, (uint32_t)w->node.key, v, len);
        break;
    case CL_STORE_OP_MULTI_GET: store_srv_answer_multi_get(w); break;
    default: /* WAIT, BARRIER */
        cl_store_srv_send(w->conn, w->op | CL_STORE_OP_REPLY, (uint32_t)w->node.key, COLLIE_OK,
                          NULL, 0);
        break;
    }
    store_srv_wait_free(w);
}

static void store_srv_flush_ready(collie_store_server *s) {
    cl_store_waiter *kw;
    while ((kw = cl_store_kv_pop_ready(s->kv)))
        store_srv_answer(cl_container_of(kw, store_srv_wait, kw));
}

static void store_srv_cancel(store_srv_conn *c, uint32_t target) {
    cl_idnode *n = cl_idmap_get(&c->waits, target);
    if (n) store_srv_wait_free(cl_container_of(n, store_srv_wait, node));
    /* unknown: already answered (the reply crossed the cancel) — nothing to do */
}

/* ---- requests -------------------------------------------------------------------- */

static void store_srv_barrier(store_srv_conn *c, const cl_store_hdr *h, const cl_store_msg *m) {
    int64_t count = 0, n = m->num;
    int rc = cl_store_kv_add(c->srv->kv, m->keys[0].p, m->keys[0].len, 1, &count);
    if (rc != COLLIE_OK) {
        store_srv_reply_kv_error(c, h, rc);
        return;
    }
    int64_t target = count < 1 ? n : ((count - 1) / n + 1) * n;
    store_srv_wait_begin(c, h, m, CL_STORE_WAIT_AT_LEAST, target);
}

static void store_srv_check(store_srv_conn *c, const cl_store_hdr *h, const cl_store_msg *m) {
    int64_t all = 1;
    for (uint32_t i = 0; i < m->n && all; i++) {
        const uint8_t *v;
        size_t len;
        all = cl_store_kv_get(c->srv->kv, m->keys[i].p, m->keys[i].len, &v, &len);
    }
    store_srv_reply_i64(c, h, all);
}

int cl_store_srv_dispatch(store_srv_conn *c, const cl_store_hdr *h, cl_store_msg *m, char *why,
                          size_t why_len) {
    collie_store_server *s = c->srv;
    cl_store_kv *kv = s->kv;
    const cl_store_bytes *k = &m->keys[0];
    int rc = COLLIE_OK;
    int64_t v = 0;
    bool existed = false;
    const uint8_t *cur = NULL;
    size_t curlen = 0;
    switch (h->op) {
    case CL_STORE_OP_SET:
    case CL_STORE_OP_APPEND:
        rc = h->op == CL_STORE_OP_SET
                 ? cl_store_kv_set(kv, k->p, k->len, m->vals[0].p, m->vals[0].len)
                 : cl_store_kv_append(kv, k->p, k->len, m->vals[0].p, m->vals[0].len);
        if (rc != COLLIE_OK)
            store_srv_reply_kv_error(c, h, rc);
        else
            store_srv_reply_empty(c, h);
        break;
    case CL_STORE_OP_ADD:
        rc = cl_store_kv_add(kv, k->p, k->len, m->num, &v);
        if (rc != COLLIE_OK)
            store_srv_reply_kv_error(c, h, rc);
        else
            store_srv_reply_i64(c, h, v);
        break;
    case CL_STORE_OP_COMPARE_SET:
        rc = cl_store_kv_compare_set(kv, k->p, k->len, m->vals[0].p, m->vals[0].len, m->vals[1].p,
                                     m->vals[1].len, &cur, &curlen);
        if (rc != COLLIE_OK)
            store_srv_reply_kv_error(c, h, rc);
        else
            store_srv_reply_value(c, h->op, h->req_id, cur, curlen);
        break;
    case CL_STORE_OP_DELETE:
        cl_store_kv_delete(kv, k->p, k->len, &existed);
        store_srv_reply_i64(c, h, existed);
        break;
    case CL_STORE_OP_DELETE_PREFIX:
        store_srv_reply_i64(c, h, (int64_t)cl_store_kv_delete_prefix(kv, k->p, k->len));
        break;
    case CL_STORE_OP_NUM_KEYS: store_srv_reply_i64(c, h, (int64_t)cl_store_kv_num_keys(kv)); break;
    case CL_STORE_OP_CHECK: store_srv_check(c, h, m); break;
    case CL_STORE_OP_MULTI_SET:
        rc = cl_store_kv_multi_set(kv, m->n, m->keys, m->vals);
        if (rc != COLLIE_OK)
            store_srv_reply_kv_error(c, h, rc);
        else
            store_srv_reply_empty(c, h);
        break;
    case CL_STORE_OP_GET:
    case CL_STORE_OP_WAIT:
    case CL_STORE_OP_MULTI_GET:
    case CL_STORE_OP_BARRIER:
        rc = store_srv_wait_admit(c, h, why, why_len);
        if (rc == COLLIE_EPROTO) return rc;
        if (rc != COLLIE_OK) break;
        if (h->op == CL_STORE_OP_BARRIER)
            store_srv_barrier(c, h, m);
        else
            store_srv_wait_begin(c, h, m, CL_STORE_WAIT_EXISTS, 0);
        break;
    case CL_STORE_OP_CANCEL: store_srv_cancel(c, (uint32_t)m->num); break;
    default:
        snprintf(why, why_len, "unexpected %s request after the handshake",
                 cl_store_op_name(h->op));
        return COLLIE_EPROTO;
    }
    store_srv_flush_ready(s);
    return COLLIE_OK;
}
