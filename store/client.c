/*
 * client.c — the store client's connection: lazy connect, pipelined
 * requests matched by id, reconnect with backoff, teardown. The handshake
 * between connect and READY is client_hs.c's.
 *
 * Design notes
 *  - Everything below runs on the engine's loop thread, except create,
 *    hold/release, close (which hands over to the loop) and describe (which
 *    reads the connection summary under `mu`, a leaf lock).
 *  - States: IDLE → CONNECTING → HELLO → (AUTH →) READY, and CLOSED once
 *    the handle is destroyed or the engine shuts down; a failure before
 *    READY goes to BACKOFF (retry after an exponentially growing, jittered
 *    delay, capped by max_backoff_ms) while requests are queued, else IDLE.
 *    Nothing reconnects without a request wanting it.
 *  - The address is resolved once, to every address it names ("localhost"
 *    is ::1 and 127.0.0.1 on many hosts, and a server may listen on one
 *    family only). A connect that fails moves at once to the next address;
 *    only a round in which every address failed backs off. A connection
 *    that worked keeps its address for the next attempt. The requests'
 *    deadlines bound it all.
 *  - A request is QUEUED until the connection is READY, then SENT with a
 *    fresh request id (in the `sent` list and the `sent_ids` map, where its
 *    reply looks it up). Queued requests survive connection failures and
 *    wait, bounded by their own deadlines. When a READY connection is lost,
 *    every SENT request fails with COLLIE_EPEER (COLLIE_EPROTO for a
 *    protocol violation): none is replayed, because set/add/append/barrier
 *    are not idempotent and the server may or may not have executed them.
 *  - Authentication failures, protocol-version refusals and protocol
 *    errors before READY are not retried (conn_lost with fatal = true, from
 *    client_hs.c and the read callback): the queued requests fail with the
 *    cause (a new request tries again). After READY, fatal changes nothing:
 *    the sent requests fail, the queued ones get a new connection.
 *  - A request finished by someone else (deadline, cancel) is detached here:
 *    removed from the queue or the sent table, and if the server is holding
 *    it (get, wait, multi_get, barrier) a CANCEL frame tells it to drop the
 *    waiter. A reply for an unknown id (it crossed the cancel) is ignored.
 *  - The core is a cl_resident: engine shutdown closes the connection and
 *    fails what is pending with COLLIE_ECLOSED; later destroy calls only
 *    free memory.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "store/addr.h"
#include "store/auth.h"
#include "store/client.h"

/* Bound on connect + handshake, independent of request deadlines. */
#define STORE_CLI_HANDSHAKE_MS           10000
#define STORE_CLI_BACKOFF_START_MS       10
#define STORE_CLI_NAG_MS                 5000 /* a failing connection is logged this often */
#define STORE_CLI_DEFAULT_BACKOFF_CAP_MS 1000

static void store_cli_connect(cl_store_core *c);

/* Close a connection now: libevent defers the close(2) of a freed
 * bufferevent, and the server should see us go at once. */
static void store_cli_bev_close(struct bufferevent *bev) {
    int fd = bufferevent_getfd(bev);
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
    bufferevent_free(bev);
}

/* ---- lists ------------------------------------------------------------------------- */

static void store_cli_enqueue(cl_store_core *c, cl_store_req *r) {
    r->where = CL_STORE_REQ_QUEUED;
    cl_list_push_back(&c->queued, &r->link);
}

static void store_cli_dequeue(cl_store_req *r) {
    cl_list_remove(&r->link);
    r->where = CL_STORE_REQ_NOWHERE;
}

static void store_cli_unsend(cl_store_core *c, cl_store_req *r) {
    cl_idmap_remove(&c->sent_ids, &r->node);
    cl_list_remove(&r->link);
    r->where = CL_STORE_REQ_NOWHERE;
}

/* Fail every request on one list. The list is detached first: finishing
 * never calls back into us synchronously, but keep it simple to reason. */
static void store_cli_fail_all(cl_store_core *c, bool sent, int status, const char *msg) {
    cl_store_req *r;
    while ((r = cl_list_first(sent ? &c->sent : &c->queued, cl_store_req, link))) {
        if (sent)
            store_cli_unsend(c, r);
        else
            store_cli_dequeue(r);
        cl_work_finish(&r->work, status, "%s", msg);
    }
}

/* ---- connection summary for messages ---------------------------------------------- */

static void store_cli_set_connected(cl_store_core *c, bool up, const char *err) {
    pthread_mutex_lock(&c->mu);
    c->connected = up;
    snprintf(c->last_err, sizeof c->last_err, "%s", err ? err : "");
    pthread_mutex_unlock(&c->mu);
}

void cl_store_core_describe(cl_store_core *c, char *buf, size_t len) {
    pthread_mutex_lock(&c->mu);
    if (!c->connected && c->last_err[0])
        snprintf(buf, len, "store %s, not connected: %s", c->addr, c->last_err);
    else
        snprintf(buf, len, "store %s", c->addr);
    pthread_mutex_unlock(&c->mu);
}

/* ---- sending ------------------------------------------------------------------------ */

static void store_cli_free_frame(const void *data, size_t len, void *arg) {
    CL_UNUSED(len);
    CL_UNUSED(arg);
    free((void *)data);
}

static void store_cli_send(cl_store_core *c, cl_store_req *r) {
    uint32_t id;
    do {
        id = ++c->next_req_id;
    } while (id == 0 || cl_idmap_get(&c->sent_ids, id));
    r->node.key = id;
    if (!cl_idmap_put(&c->sent_ids, &r->node)) {
        cl_work_finish(&r->work, COLLIE_ENOMEM, "out of memory sending the request");
        return;
    }
    /* Hand the frame to libevent without copying it; it frees it once sent. */
    uint8_t *p = r->frame.p;
    size_t len = r->frame.len;
    r->frame.p = NULL;
    r->frame.len = r->frame.cap = 0;
    cl_store_hdr_patch_req_id(p, id);
    if (evbuffer_add_reference(bufferevent_get_output(c->bev), p, len, store_cli_free_frame,
                               NULL) != 0) {
        free(p);
        cl_idmap_remove(&c->sent_ids, &r->node);
        cl_work_finish(&r->work, COLLIE_ENOMEM, "out of memory sending the request");
        return;
    }
    r->where = CL_STORE_REQ_SENT;
    r->conn_gen = c->conn_gen;
    cl_list_push_front(&c->sent, &r->link);
}

/* A small control frame (HELLO, AUTH, CANCEL; client.h). */
void cl_store_cli_send_ctl(cl_store_core *c, const cl_store_wbuf *b) {
    if (b->oom || bufferevent_write(c->bev, b->p, b->len) != 0)
        CL_WARN("store", "client %s: could not queue a control frame", c->addr);
}

static void store_cli_send_cancel(cl_store_core *c, uint32_t id) {
    cl_store_wbuf b = {0};
    cl_store_frame_begin(&b, CL_STORE_OP_CANCEL, 0, 0);
    cl_store_put_u32(&b, id);
    if (cl_store_frame_end(&b, 0) == COLLIE_OK) cl_store_cli_send_ctl(c, &b);
    cl_store_wbuf_fini(&b);
}

/* ---- connection state ------------------------------------------------------------- */

static uint32_t store_cli_rand(cl_store_core *c) {
    uint64_t x = c->rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c->rng = x;
    return (uint32_t)((x * 2685821657736338717ULL) >> 32);
}

static void store_cli_schedule_retry(cl_store_core *c) {
    uint32_t d = c->backoff_ms ? c->backoff_ms : STORE_CLI_BACKOFF_START_MS;
    if (d > (uint32_t)c->max_backoff_ms) d = (uint32_t)c->max_backoff_ms;
    uint32_t wait = d / 2 + store_cli_rand(c) % (d - d / 2 + 1); /* jitter: [d/2, d] */
    c->backoff_ms = d * 2;
    struct timeval tv = {wait / 1000, (wait % 1000) * 1000};
    c->state = CL_STORE_BACKOFF;
    evtimer_add(c->backoff_ev, &tv);
}

static void store_cli_on_backoff(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    cl_store_core *c = arg;
    if (c->state != CL_STORE_BACKOFF) return;
    c->state = CL_STORE_IDLE;
    if (!cl_list_empty(&c->queued)) store_cli_connect(c);
}

/* A connection attempt failed and will be retried: say so at the first
 * failure and every STORE_CLI_NAG_MS after, so a store address that refuses
 * is known while the requests wait, not only at their deadline. */
static void store_cli_note_refusal(cl_store_core *c, const char *msg) {
    int64_t now = cl_now_ns();
    if (!c->failing_since_ns) {
        c->failing_since_ns = c->nagged_ns = now;
        CL_WARN("store", "client of %s: %s; retrying (requests wait up to their deadline)", c->addr,
                msg);
    } else if (now - c->nagged_ns >= (int64_t)STORE_CLI_NAG_MS * CL_NS_PER_MS) {
        c->nagged_ns = now;
        CL_WARN("store", "client of %s: still no connection after %.0f s: %s; retrying", c->addr,
                (double)(now - c->failing_since_ns) / 1e9, msg);
    } else {
        CL_DEBUG("store", "client of %s: %s", c->addr, msg);
    }
}

/* The connection (or the attempt) is over (client.h). */
void cl_store_cli_conn_lost(cl_store_core *c, int status, bool fatal, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int prev = c->state;
    /* a connect that failed: the next address at once, until a round of
     * them all has failed */
    bool next_addr = false;
    if (prev == CL_STORE_CONNECTING && !fatal && c->addrs.n > 1) {
        c->addr_i = (c->addr_i + 1) % c->addrs.n;
        next_addr = ++c->addr_failed < c->addrs.n;
        if (!next_addr) c->addr_failed = 0;
    }
    if (c->bev) store_cli_bev_close(c->bev);
    c->bev = NULL;
    c->conn_gen++;
    c->state = CL_STORE_IDLE;
    /* The requests failed here carry msg as their cause; the connection
     * summary (for later messages) is updated after, so it is not repeated. */
    if (prev == CL_STORE_READY) {
        if (!cl_list_empty(&c->sent))
            CL_WARN("store", "client of %s: %s; failing the requests in flight", c->addr, msg);
        else
            CL_INFO("store", "client of %s: %s", c->addr, msg);
        store_cli_fail_all(c, true, status == COLLIE_EPROTO ? COLLIE_EPROTO : COLLIE_EPEER, msg);
    } else if (fatal) {
        CL_WARN("store", "client of %s: %s", c->addr, msg);
        store_cli_fail_all(c, false, status, msg);
    } else if (next_addr) {
        CL_DEBUG("store", "client of %s: %s; trying its next address", c->addr, msg);
    } else {
        store_cli_note_refusal(c, msg);
    }
    store_cli_set_connected(c, false, msg);
    if (!cl_list_empty(&c->queued)) {
        if (prev == CL_STORE_READY || next_addr)
            store_cli_connect(c); /* first retry at once */
        else
            store_cli_schedule_retry(c);
    }
}

void cl_store_cli_ready(cl_store_core *c) {
    if (c->failing_since_ns)
        CL_INFO("store", "client of %s: connected after %.1f s of failed attempts", c->addr,
                (double)(cl_now_ns() - c->failing_since_ns) / 1e9);
    c->failing_since_ns = 0;
    c->addr_failed = 0;
    c->state = CL_STORE_READY;
    atomic_fetch_add_explicit(&c->connects, 1, memory_order_relaxed);
    c->backoff_ms = 0;
    bufferevent_set_timeouts(c->bev, NULL, NULL);
    store_cli_set_connected(c, true, NULL);
    CL_DEBUG("store", "client of %s: connected", c->addr);
    cl_store_req *r;
    while (c->state == CL_STORE_READY && (r = cl_list_first(&c->queued, cl_store_req, link))) {
        store_cli_dequeue(r);
        store_cli_send(c, r);
    }
}

/* ---- reading ------------------------------------------------------------------------- */

/* A reply while READY. Returns false if the connection is gone. */
static bool store_cli_on_reply(cl_store_core *c, const cl_store_hdr *h, uint8_t op,
                               const uint8_t *body) {
    cl_idnode *n = cl_idmap_get(&c->sent_ids, h->req_id);
    if (!n) return true; /* cancelled or timed out meanwhile: drop it */
    cl_store_req *r = cl_container_of(n, cl_store_req, node);
    if (r->op != op) {
        cl_store_cli_conn_lost(c, COLLIE_EPROTO, false,
                               "protocol error: a %s reply to a %s request (id %u)",
                               cl_store_op_name(op), cl_store_op_name(r->op), h->req_id);
        return false;
    }
    store_cli_unsend(c, r);
    r->replied = true;
    if (cl_store_req_reply(r, h, body) != COLLIE_OK) {
        cl_store_cli_conn_lost(c, COLLIE_EPROTO, false, "protocol error: malformed %s reply",
                               cl_store_op_name(op));
        return false;
    }
    return true;
}

static void store_cli_want(cl_store_core *c, size_t need) {
    size_t high = need > 256 * 1024 ? need : 256 * 1024;
    bufferevent_setwatermark(c->bev, EV_READ, need, high);
}

static void store_cli_on_read(struct bufferevent *bev, void *arg) {
    cl_store_core *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    const char *prev = cl_engine_set_activity(c->engine, "store client: read");
    for (;;) {
        size_t avail = evbuffer_get_length(in);
        if (avail < CL_STORE_HDR_LEN) {
            store_cli_want(c, CL_STORE_HDR_LEN);
            break;
        }
        uint8_t hb[CL_STORE_HDR_LEN];
        cl_store_hdr h;
        char why[160];
        evbuffer_copyout(in, hb, sizeof hb);
        if (cl_store_hdr_decode(hb, CL_STORE_PROTO_MAX_BODY, &h, why, sizeof why) != COLLIE_OK ||
            !(h.op & CL_STORE_OP_REPLY)) {
            if (!(h.op & CL_STORE_OP_REPLY) && !why[0]) snprintf(why, sizeof why, "not a reply");
            cl_store_cli_conn_lost(c, COLLIE_EPROTO, c->state != CL_STORE_READY,
                                   "protocol error from the server: %s", why);
            break;
        }
        size_t need = CL_STORE_HDR_LEN + (size_t)h.body_len;
        if (avail < need) {
            store_cli_want(c, need);
            break;
        }
        const uint8_t *frame = evbuffer_pullup(in, (ev_ssize_t)need);
        if (!frame) {
            cl_store_cli_conn_lost(c, COLLIE_ENOMEM, false, "out of memory reading a reply");
            break;
        }
        uint8_t op = h.op & (uint8_t)~CL_STORE_OP_REPLY;
        bool alive = c->state == CL_STORE_READY
                         ? store_cli_on_reply(c, &h, op, frame + CL_STORE_HDR_LEN)
                         : cl_store_cli_on_handshake(c, &h, op, frame + CL_STORE_HDR_LEN);
        if (!alive || c->bev != bev) break; /* the bufferevent (and `in`) is gone */
        evbuffer_drain(in, need);
    }
    cl_engine_set_activity(c->engine, prev);
}

/* The address being tried, for messages ("[::1]:29500"). */
static const char *store_cli_addr_now(cl_store_core *c) {
    static _Thread_local char buf[64];
    cl_store_addr_format((const struct sockaddr *)&c->addrs.sa[c->addr_i], buf, sizeof buf);
    return buf;
}

static void store_cli_on_event(struct bufferevent *bev, short what, void *arg) {
    cl_store_core *c = arg;
    int err = EVUTIL_SOCKET_ERROR();
    if (what & BEV_EVENT_CONNECTED) {
        cl_store_cli_on_connected(c);
        return;
    }
    int so_err = 0;
    socklen_t sl = sizeof so_err;
    int fd = bufferevent_getfd(bev);
    if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_err, &sl) == 0 && so_err) err = so_err;
    bool connecting = c->state == CL_STORE_CONNECTING;
    if (what & BEV_EVENT_TIMEOUT)
        cl_store_cli_conn_lost(c, COLLIE_ETIMEDOUT, false, "the server did not %s within %d ms",
                               connecting ? "accept the connection" : "complete the handshake",
                               STORE_CLI_HANDSHAKE_MS);
    else if (connecting)
        cl_store_cli_conn_lost(c, COLLIE_EPEER, false, "connect to %s: %s", store_cli_addr_now(c),
                               err ? strerror(err) : "connection failed");
    else if (what & BEV_EVENT_EOF)
        cl_store_cli_conn_lost(c, COLLIE_EPEER, false, "store %s closed the connection", c->addr);
    else
        cl_store_cli_conn_lost(c, COLLIE_EPEER, false, "connection to store %s lost: %s", c->addr,
                               err ? strerror(err) : "unknown error");
}

static void store_cli_connect(cl_store_core *c) {
    struct bufferevent *bev =
        bufferevent_socket_new(cl_engine_base(c->engine), -1, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        c->state = CL_STORE_CONNECTING;
        cl_store_cli_conn_lost(c, COLLIE_ENOMEM, false, "out of memory connecting");
        return;
    }
    struct timeval hs = {STORE_CLI_HANDSHAKE_MS / 1000, (STORE_CLI_HANDSHAKE_MS % 1000) * 1000};
    bufferevent_setcb(bev, store_cli_on_read, NULL, store_cli_on_event, c);
    bufferevent_set_timeouts(bev, &hs, &hs);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    c->bev = bev;
    c->state = CL_STORE_CONNECTING;
    store_cli_want(c, CL_STORE_HDR_LEN);
    if (bufferevent_socket_connect(bev, (struct sockaddr *)&c->addrs.sa[c->addr_i],
                                   (int)c->addrs.len[c->addr_i]) != 0) {
        int err = EVUTIL_SOCKET_ERROR();
        cl_store_cli_conn_lost(c, COLLIE_EPEER, false, "connect to %s: %s", store_cli_addr_now(c),
                               strerror(err));
    }
}

/* ---- the request hooks ------------------------------------------------------------------ */

/* Before reusing an idle connection: has the server closed it meanwhile
 * (restarted while we were idle)? Then reconnect instead of sending into a
 * dead socket; nothing is in flight, so nothing is ambiguous. */
static bool store_cli_idle_conn_dead(cl_store_core *c) {
    if (!cl_list_empty(&c->sent)) return false; /* busy: its replies will tell */
    char b;
    ssize_t n = recv(bufferevent_getfd(c->bev), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void cl_store_core_start(cl_store_req *r) {
    cl_store_core *c = r->core;
    switch (c->state) {
    case CL_STORE_CLOSED:
        cl_work_finish(&r->work, COLLIE_ECLOSED, "the store handle was destroyed");
        return;
    case CL_STORE_READY:
        if (!store_cli_idle_conn_dead(c)) {
            store_cli_send(c, r);
            return;
        }
        store_cli_enqueue(c, r); /* conn_lost reconnects at once for it */
        cl_store_cli_conn_lost(c, COLLIE_EPEER, false, "store %s closed the connection", c->addr);
        return;
    case CL_STORE_IDLE:
        store_cli_enqueue(c, r);
        store_cli_connect(c);
        return;
    default: store_cli_enqueue(c, r); return; /* CONNECTING, HELLO, AUTH, BACKOFF */
    }
}

void cl_store_core_detach(cl_store_req *r) {
    cl_store_core *c = r->core;
    if (r->where == CL_STORE_REQ_QUEUED) {
        store_cli_dequeue(r);
    } else if (r->where == CL_STORE_REQ_SENT) {
        store_cli_unsend(c, r);
        if (!r->replied && cl_store_op_waits(r->op) && c->state == CL_STORE_READY &&
            r->conn_gen == c->conn_gen)
            store_cli_send_cancel(c, (uint32_t)r->node.key);
    }
    cl_store_wbuf_fini(&r->frame);
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* Loop thread: close the connection and fail what is pending. */
static void store_cli_teardown(cl_store_core *c, bool from_engine, const char *why) {
    if (atomic_load_explicit(&c->shut, memory_order_acquire)) return;
    if (c->bev) store_cli_bev_close(c->bev);
    c->bev = NULL;
    c->conn_gen++;
    c->state = CL_STORE_CLOSED;
    if (c->backoff_ev) event_free(c->backoff_ev);
    c->backoff_ev = NULL;
    store_cli_set_connected(c, false, why);
    store_cli_fail_all(c, true, COLLIE_ECLOSED, why);
    store_cli_fail_all(c, false, COLLIE_ECLOSED, why);
    if (!from_engine) cl_engine_remove_resident(c->engine, &c->resident);
    atomic_store_explicit(&c->shut, true, memory_order_release);
}

static void store_cli_on_engine_shutdown(cl_resident *res) {
    store_cli_teardown(cl_container_of(res, cl_store_core, resident), true,
                       "the engine is shutting down");
}

static void store_cli_close_call(void *arg) {
    store_cli_teardown(arg, false, "the store handle was destroyed");
}

static void store_cli_init_call(void *arg) {
    cl_store_core *c = arg;
    c->backoff_ev = evtimer_new(cl_engine_base(c->engine), store_cli_on_backoff, c);
    if (!c->backoff_ev) {
        c->init_status = COLLIE_ENOMEM;
        return;
    }
    c->resident.shutdown = store_cli_on_engine_shutdown;
    c->resident.what = "store client: shutdown";
    c->init_status = cl_engine_add_resident(c->engine, &c->resident);
    if (c->init_status != COLLIE_OK) {
        event_free(c->backoff_ev);
        c->backoff_ev = NULL;
    }
}

static void store_cli_free(cl_store_core *c) {
    cl_idmap_fini(&c->sent_ids);
    pthread_mutex_destroy(&c->mu);
    free(c->token);
    free(c->addr);
    free(c);
}

static int store_cli_options(cl_store_core *c, const collie_store_opts *o) {
    if (!cl_opts_ok(o, offsetof(collie_store_opts, max_backoff_ms)))
        return cl_set_last_error(COLLIE_EINVAL, "collie_store_connect: opts.size not set (use "
                                                "COLLIE_STORE_OPTS_INIT)");
    int32_t t = cl_opt(o, timeout_ms, 0), b = cl_opt(o, max_backoff_ms, 0);
    if (t < COLLIE_TIMEOUT_INFINITE || b < 0)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_store_connect: timeout_ms %d / max_backoff_ms %d invalid",
                                 (int)t, (int)b);
    c->timeout_ms = t == 0 ? cl_config_get()->timeout_ms : t;
    c->max_backoff_ms = b == 0 ? STORE_CLI_DEFAULT_BACKOFF_CAP_MS : b;
    if (c->max_backoff_ms < STORE_CLI_BACKOFF_START_MS)
        c->max_backoff_ms = STORE_CLI_BACKOFF_START_MS;
    int res = cl_store_auth_token(cl_opt(o, token, NULL), "collie_store_connect", &c->token);
    c->token_len = c->token ? strlen(c->token) : 0;
    return res;
}

int cl_store_core_create(collie_engine *e, const char *addr, const collie_store_opts *o,
                         cl_store_core **out) {
    int res = COLLIE_OK;
    char host[256];
    uint16_t port = 0;
    cl_store_core *c = NULL;
    *out = NULL;
    if (!addr) addr = cl_config_get()->store_addr;
    if (!addr)
        return cl_set_last_error(COLLIE_EINVAL, "collie_store_connect: no address given and "
                                                "COLLIE_STORE_ADDR is not set");
    CL_CHECK_GOTO(cl_store_addr_parse(addr, host, sizeof host, &port), res, fail);
    if (!(c = calloc(1, sizeof *c))) return COLLIE_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    cl_list_init(&c->queued);
    cl_list_init(&c->sent);
    c->engine = e;
    atomic_init(&c->refs, 1);
    atomic_init(&c->handles, 1);
    CL_CHECK_GOTO(store_cli_options(c, o), res, fail);
    if (!(c->addr = cl_strdup(addr))) {
        res = COLLIE_ENOMEM;
        goto fail;
    }
    res = cl_store_addr_resolve(host, port, false, &c->addrs);
    if (res != COLLIE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", collie_last_error());
        res = cl_set_last_error(res, "store address '%s': %s", addr, why);
        goto fail;
    }
    if (cl_store_auth_random(&c->rng, sizeof c->rng) != COLLIE_OK || c->rng == 0)
        c->rng = (uint64_t)cl_now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ULL;
    c->init_status = COLLIE_ECLOSED;
    res = cl_engine_call(e, store_cli_init_call, c, CL_ENGINE_CALL_TIMEOUT_MS);
    if (res == COLLIE_ETIMEDOUT) { /* the call may still run and use c: leak it */
        CL_ERROR("store", "client of %s: engine %s did not respond; leaking the handle", addr,
                 cl_engine_name(e));
        return cl_set_last_error(res, "collie_store_connect: engine %s did not respond",
                                 cl_engine_name(e));
    }
    if (res == COLLIE_OK) res = c->init_status;
    if (res != COLLIE_OK) {
        cl_set_last_error(res, "collie_store_connect: engine %s is %s", cl_engine_name(e),
                          res == COLLIE_ECLOSED ? "shutting down" : "out of memory");
        goto fail;
    }
    *out = c;
    return COLLIE_OK;
fail:
    if (c) store_cli_free(c);
    return res;
}

void cl_store_core_hold(cl_store_core *c) {
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

void cl_store_core_release(cl_store_core *c) {
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1) store_cli_free(c);
}

void cl_store_core_close(cl_store_core *c) {
    if (!atomic_load_explicit(&c->shut, memory_order_acquire)) {
        int rc = cl_engine_call(c->engine, store_cli_close_call, c, CL_ENGINE_CALL_TIMEOUT_MS);
        if (rc == COLLIE_ETIMEDOUT) {
            CL_ERROR("store", "client of %s: the engine did not close it in time; leaking it",
                     c->addr);
            return;
        }
    }
    cl_store_core_release(c);
}
