/*
 * srv_conn.c — one client connection of the store server: framing, the
 * handshake (HELLO, AUTH), back-pressure and teardown.
 *
 * Design notes
 *  - Loop thread only. Each connection is a socket with a persistent read
 *    event and two evbuffers: one recv of up to STORE_SRV_READ_CHUNK per
 *    wake-up (no FIONREAD first, as evbuffer_read does), then every
 *    complete frame in the input is handled; a header is validated (magic,
 *    version, op, body_len against the limit for the connection's state)
 *    as soon as its 16 bytes are in, before its body is waited for.
 *  - Malformed input closes that connection only (logged at warn with the
 *    peer's address: an authenticated client's every time, an outsider's
 *    as a rate-limited refusal); nothing a client sends can take the
 *    server down.
 *  - Before authentication a connection costs a bounded amount
 *    (docs/security.md): it must authenticate within
 *    COLLIE_HANDSHAKE_TIMEOUT_MS (s->handshake_ms), and at most
 *    CL_STORE_SRV_PENDING_MAX wait at once (`pending`, in accept order): the
 *    next one closes the oldest. Closing the oldest rather than refusing the
 *    newest keeps the door open to real clients, which finish within a round
 *    trip of their connect, however many idle sockets a flood holds; a flood
 *    would have to open the cap's worth of connections within that round trip
 *    to push one out. So an outsider cannot use up the host process's
 *    descriptors (collie-run starts ranks with them). Refusals of
 *    unauthenticated connections (wrong token, garbage, timeout, the cap) are
 *    logged at most once per CL_STORE_SRV_REFUSED_LOG_MS with a count.
 *  - A connection is freed (cl_store_srv_conn_free) by: reading (a
 *    protocol violation, EOF or a recv error; the caller then returns at
 *    once), the handshake timer, writing (`closing`: a final reply such as
 *    an EAUTH refusal has been flushed; or a send error), accept (the
 *    oldest unauthenticated one makes room; out of memory) and server
 *    teardown (the rest).
 *  - Replies are written straight to the socket once per loop pass
 *    (store_srv_flush, for every conn that queued some): the write event
 *    is added only while a socket does not take everything, so a request
 *    costs one recv and one writev — no epoll_ctl, no ioctl.
 *  - Back-pressure: a client that pipelines requests without reading the
 *    replies stops being read once CL_STORE_SRV_OUT_HIGH bytes of replies
 *    are queued, and is resumed once all of them have been sent.
 */
#include <errno.h>
#include <stdarg.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/engine.h"
#include "store/addr.h"
#include "store/auth.h"
#include "store/server.h"

/* The most one recv takes. */
#define STORE_SRV_READ_CHUNK (64u * 1024u)
static void store_srv_conn_process(store_srv_conn *c);

void cl_store_srv_conn_free(store_srv_conn *c) {
    collie_store_server *s = c->srv;
    cl_store_srv_drop_waits(c);
    if (c->rev) event_free(c->rev);
    if (c->wev) event_free(c->wev);
    if (c->hs_timer) event_free(c->hs_timer);
    if (c->in) evbuffer_free(c->in);
    if (c->out) evbuffer_free(c->out);
    if (c->fd >= 0) close(c->fd);
    cl_list_remove(&c->link);
    cl_list_remove(&c->dirty_link);
    if (cl_list_linked(&c->pending_link)) s->npending--;
    cl_list_remove(&c->pending_link);
    atomic_fetch_sub_explicit(&s->nconns, 1, memory_order_relaxed);
    free(c);
}

void cl_store_srv_log_refusal(collie_store_server *s, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int64_t now = cl_now_ns();
    if (s->refused_log_ns &&
        now - s->refused_log_ns < (int64_t)CL_STORE_SRV_REFUSED_LOG_MS * CL_NS_PER_MS) {
        s->refused++;
        CL_DEBUG("store", "server %s: %s", s->name, msg);
        return;
    }
    if (s->refused)
        CL_WARN("store", "server %s: %s (and %llu more refused since the last such line)", s->name,
                msg, (unsigned long long)s->refused);
    else
        CL_WARN("store", "server %s: %s", s->name, msg);
    s->refused_log_ns = now;
    s->refused = 0;
}

/* Protocol violation: log and close now. The caller returns at once. An
 * authenticated client's is always logged; an outsider's is a refusal. */
static void store_srv_conn_reject(store_srv_conn *c, const char *why) {
    if (c->state == STORE_SRV_READY)
        CL_WARN("store", "server %s: closing the connection from %s: %s", c->srv->name, c->peer,
                why);
    else
        cl_store_srv_log_refusal(c->srv, "closing the connection from %s: %s", c->peer, why);
    cl_store_srv_conn_free(c);
}

/* Close once the output (a final reply) has been flushed. */
static void store_srv_conn_close_after_flush(store_srv_conn *c) {
    c->closing = true;
    event_del(c->rev);
    if (!cl_list_linked(&c->dirty_link)) { /* the flush frees it once written */
        cl_list_push_back(&c->srv->dirty, &c->dirty_link);
        event_active(c->srv->flush_ev, 0, 0);
    }
}

int cl_store_srv_send(store_srv_conn *c, uint8_t op, uint32_t req_id, int32_t status,
                      const cl_store_bytes *parts, size_t nparts) {
    if (c->closing) return COLLIE_OK; /* only the pending final reply goes out */
    size_t body = 0;
    for (size_t i = 0; i < nparts; i++)
        body += parts[i].len;
    uint8_t hb[CL_STORE_HDR_LEN];
    cl_store_hdr h = {.version = CL_STORE_PROTO_VERSION,
                      .op = op,
                      .body_len = (uint32_t)body,
                      .req_id = req_id,
                      .status = status};
    cl_store_hdr_encode(hb, &h);
    struct evbuffer *out = c->out;
    int bad = body > UINT32_MAX || evbuffer_add(out, hb, sizeof hb) != 0;
    for (size_t i = 0; i < nparts && !bad; i++)
        if (parts[i].len) bad = evbuffer_add(out, parts[i].p, parts[i].len) != 0;
    if (bad) {
        CL_WARN("store", "server %s: cannot queue a %zu-byte reply to %s; closing it", c->srv->name,
                body, c->peer);
        store_srv_conn_close_after_flush(c); /* the stream is cut mid-frame: drop the client */
        return COLLIE_ENOMEM;
    }
    if (!cl_list_linked(&c->dirty_link)) {
        cl_list_push_back(&c->srv->dirty, &c->dirty_link);
        event_active(c->srv->flush_ev, 0, 0);
    }
    return COLLIE_OK;
}

static void store_srv_conn_process(store_srv_conn *c);

/* Write what c has queued. May free c (closing, or the socket failed). */
static void store_srv_conn_write(store_srv_conn *c) {
    int n = evbuffer_write(c->out, c->fd);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
        CL_DEBUG("store", "server %s: sending to %s failed: %s", c->srv->name, c->peer,
                 strerror(errno));
        cl_store_srv_conn_free(c);
        return;
    }
    size_t left = evbuffer_get_length(c->out);
    if (left > 0) {
        event_add(c->wev, NULL); /* the socket is full: the rest when it drains */
        return;
    }
    event_del(c->wev);
    if (c->closing) {
        cl_store_srv_conn_free(c);
        return;
    }
    if (c->paused) { /* every reply is out: read its requests again */
        c->paused = false;
        event_add(c->rev, NULL);
        store_srv_conn_process(c);
    }
}

static void store_srv_flush(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    collie_store_server *s = arg;
    store_srv_conn *c;
    while ((c = cl_list_first(&s->dirty, store_srv_conn, dirty_link))) {
        cl_list_remove(&c->dirty_link);
        store_srv_conn_write(c);
    }
}

void cl_store_srv_send_error(store_srv_conn *c, uint8_t op, uint32_t req_id, int status,
                             const char *msg) {
    uint8_t lb[4];
    size_t len = strlen(msg);
    for (int i = 0; i < 4; i++)
        lb[i] = (uint8_t)((uint32_t)len >> (8 * i));
    cl_store_bytes parts[2] = {{lb, 4}, {(const uint8_t *)msg, (uint32_t)len}};
    cl_store_srv_send(c, op | CL_STORE_OP_REPLY, req_id, status, parts, 2);
}

/* ---- handshake ------------------------------------------------------------------- */

static void store_srv_conn_ready(store_srv_conn *c) {
    c->state = STORE_SRV_READY;
    event_del(c->hs_timer);
    if (cl_list_linked(&c->pending_link)) c->srv->npending--;
    cl_list_remove(&c->pending_link);
    CL_DEBUG("store", "server %s: client %s ready", c->srv->name, c->peer);
}

static int store_srv_conn_hello(store_srv_conn *c, const cl_store_msg *m, char *why,
                                size_t why_len) {
    collie_store_server *s = c->srv;
    memcpy(c->cnonce, m->vals[0].p, CL_STORE_NONCE_LEN);
    uint8_t flag = s->token != NULL, proof[CL_STORE_PROOF_LEN];
    uint8_t l_nonce[4] = {CL_STORE_NONCE_LEN, 0, 0, 0}, l_proof[4] = {0, 0, 0, 0};
    if (cl_store_auth_random(c->snonce, sizeof c->snonce) != COLLIE_OK ||
        (s->token && cl_store_auth_proof(s->token, s->token_len, true, c->cnonce, c->snonce,
                                         proof) != COLLIE_OK)) {
        snprintf(why, why_len, "cannot compute the handshake (libcrypto failed)");
        return COLLIE_ESYSTEM;
    }
    if (s->token) l_proof[0] = CL_STORE_PROOF_LEN;
    cl_store_bytes parts[5] = {{&flag, 1},
                               {l_nonce, 4},
                               {c->snonce, CL_STORE_NONCE_LEN},
                               {l_proof, 4},
                               {proof, s->token ? CL_STORE_PROOF_LEN : 0}};
    cl_store_srv_send(c, CL_STORE_OP_HELLO | CL_STORE_OP_REPLY, 0, COLLIE_OK, parts, 5);
    /* A tokenless server is ready at once; a client that expected a token
     * will refuse it with AUTH(BAD_SERVER), logged in the READY state. */
    if (s->token)
        c->state = STORE_SRV_AUTH;
    else
        store_srv_conn_ready(c);
    return COLLIE_OK;
}

static void store_srv_conn_refuse(store_srv_conn *c, const char *log_why, const char *reply) {
    cl_store_srv_log_refusal(c->srv, "refused client %s: %s", c->peer, log_why);
    cl_store_srv_send_error(c, CL_STORE_OP_AUTH, 0, COLLIE_EAUTH, reply);
    store_srv_conn_close_after_flush(c);
}

/* Returns COLLIE_OK (handled; c may be closing) or an error to reject c. */
static int store_srv_conn_auth(store_srv_conn *c, const cl_store_msg *m, char *why,
                               size_t why_len) {
    collie_store_server *s = c->srv;
    switch (m->num) {
    case CL_STORE_AUTH_PROOF:
        if (!cl_store_auth_verify(s->token, s->token_len, false, c->cnonce, c->snonce, m->vals[0].p,
                                  m->vals[0].len)) {
            store_srv_conn_refuse(c, "wrong token (its proof does not verify)",
                                  "authentication failed: the client's token does not match "
                                  "the server's");
            return COLLIE_OK;
        }
        cl_store_srv_send(c, CL_STORE_OP_AUTH | CL_STORE_OP_REPLY, 0, COLLIE_OK, NULL, 0);
        store_srv_conn_ready(c);
        return COLLIE_OK;
    case CL_STORE_AUTH_NO_TOKEN:
        store_srv_conn_refuse(c, "it has no token and this server requires one",
                              "this store requires a token and the client has none");
        return COLLIE_OK;
    case CL_STORE_AUTH_BAD_SERVER:
        snprintf(why, why_len, "the client rejected this server's proof (the tokens differ)");
        return COLLIE_EAUTH;
    default:
        snprintf(why, why_len, "unknown auth kind %lld", (long long)m->num);
        return COLLIE_EPROTO;
    }
}

/* Handle one decoded frame. Returns COLLIE_OK or an error: reject c. */
static int store_srv_conn_frame(store_srv_conn *c, const cl_store_hdr *h, cl_store_msg *m,
                                char *why, size_t why_len) {
    switch (c->state) {
    case STORE_SRV_HELLO:
        if (h->op != CL_STORE_OP_HELLO) break;
        return store_srv_conn_hello(c, m, why, why_len);
    case STORE_SRV_AUTH:
        if (h->op != CL_STORE_OP_AUTH) break;
        return store_srv_conn_auth(c, m, why, why_len);
    default:
        if (h->op == CL_STORE_OP_HELLO) break;
        if (h->op == CL_STORE_OP_AUTH) {
            if (m->num == CL_STORE_AUTH_BAD_SERVER && !c->srv->token) {
                snprintf(why, why_len,
                         "the client has a token but this server has none; "
                         "it refused to go on");
                return COLLIE_EAUTH;
            }
            break;
        }
        return cl_store_srv_dispatch(c, h, m, why, why_len);
    }
    snprintf(why, why_len, "unexpected %s frame %s", cl_store_op_name(h->op),
             c->state == STORE_SRV_READY ? "after the handshake" : "during the handshake");
    return COLLIE_EPROTO;
}

/* ---- I/O ----------------------------------------------------------------------------- */

/* Process every complete frame in the input. May free c (then returns at
 * once; callers must not touch c afterwards). */
static void store_srv_conn_process(store_srv_conn *c) {
    collie_store_server *s = c->srv;
    struct evbuffer *in = c->in;
    char why[256] = "";
    while (!c->closing && !c->paused) {
        size_t avail = evbuffer_get_length(in);
        if (avail < CL_STORE_HDR_LEN) return;
        uint8_t hb[CL_STORE_HDR_LEN];
        cl_store_hdr h;
        evbuffer_copyout(in, hb, sizeof hb);
        uint32_t max = c->state == STORE_SRV_READY ? s->max_body : CL_STORE_SRV_HELLO_MAX_BODY;
        if (cl_store_hdr_decode(hb, max, &h, why, sizeof why) != COLLIE_OK) {
            if (c->state == STORE_SRV_HELLO && hb[0] == (CL_STORE_MAGIC & 0xff) &&
                hb[1] == (CL_STORE_MAGIC >> 8) && h.version != CL_STORE_PROTO_VERSION) {
                /* a client of another version: tell it why before hanging up
                 * (magic and version sit at the same offsets in every version) */
                cl_store_srv_log_refusal(s, "refused client %s: %s", c->peer, why);
                cl_store_srv_send_error(c, CL_STORE_OP_HELLO, h.req_id, COLLIE_EPROTO, why);
                store_srv_conn_close_after_flush(c);
                return;
            }
            store_srv_conn_reject(c, why);
            return;
        }
        if (h.op & CL_STORE_OP_REPLY) {
            store_srv_conn_reject(c, "a reply frame from a client");
            return;
        }
        size_t need = CL_STORE_HDR_LEN + (size_t)h.body_len;
        if (avail < need) return;
        const uint8_t *frame = evbuffer_pullup(in, (ev_ssize_t)need);
        if (!frame) {
            store_srv_conn_reject(c, "out of memory for its frame");
            return;
        }
        cl_store_msg m;
        int rc =
            cl_store_req_decode(h.op, frame + CL_STORE_HDR_LEN, h.body_len, &m, why, sizeof why);
        if (rc == COLLIE_OK) {
            rc = store_srv_conn_frame(c, &h, &m, why, sizeof why);
            cl_store_msg_fini(&m);
        }
        if (rc == COLLIE_EAUTH) { /* the client gave up on us: still a refusal to log */
            cl_store_srv_log_refusal(s, "refused client %s: %s", c->peer, why);
            cl_store_srv_conn_free(c);
            return;
        }
        if (rc != COLLIE_OK) {
            store_srv_conn_reject(c, why);
            return;
        }
        evbuffer_drain(in, need);
        if (evbuffer_get_length(c->out) > CL_STORE_SRV_OUT_HIGH) {
            c->paused = true; /* resumed once its replies are out */
            event_del(c->rev);
        }
    }
}

static void store_srv_conn_on_read(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(what);
    store_srv_conn *c = arg;
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(c->in, STORE_SRV_READ_CHUNK, &v, 1) < 1) {
        store_srv_conn_reject(c, "out of memory for its input");
        return;
    }
    ssize_t n = recv(fd, v.iov_base, v.iov_len, 0);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n == 0)
            CL_DEBUG("store", "server %s: client %s closed the connection", c->srv->name, c->peer);
        else
            CL_DEBUG("store", "server %s: connection from %s failed: %s", c->srv->name, c->peer,
                     strerror(errno));
        cl_store_srv_conn_free(c);
        return;
    }
    v.iov_len = (size_t)n;
    evbuffer_commit_space(c->in, &v, 1);
    collie_engine *e = c->srv->engine;
    const char *prev = cl_engine_set_activity(e, "store server: read");
    store_srv_conn_process(c);
    cl_engine_set_activity(e, prev);
}

static void store_srv_conn_on_write(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    store_srv_conn *c = arg;
    cl_list_remove(&c->dirty_link); /* written now */
    store_srv_conn_write(c);
}

static void store_srv_conn_on_handshake_timeout(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(fd);
    CL_UNUSED(what);
    store_srv_conn *c = arg;
    cl_store_srv_log_refusal(c->srv, "client %s did not complete the handshake in %d ms; closing",
                             c->peer, (int)c->srv->handshake_ms);
    cl_store_srv_conn_free(c);
}

void cl_store_srv_accept(collie_store_server *s, int fd, const struct sockaddr *sa, int salen) {
    CL_UNUSED(salen);
    char peer[64];
    cl_store_addr_format(sa, peer, sizeof peer);
    size_t n = atomic_load_explicit(&s->nconns, memory_order_relaxed) - s->npending;
    if (n >= s->max_conns) { /* rate-limited: a client retrying must not flood the log */
        cl_store_srv_log_refusal(s,
                                 "refusing %s: %zu authenticated connections open "
                                 "(max_connections %u)",
                                 peer, n, s->max_conns);
        close(fd);
        return;
    }
    if (s->npending >= CL_STORE_SRV_PENDING_MAX) { /* the oldest makes room (design notes) */
        store_srv_conn *old = cl_list_first(&s->pending, store_srv_conn, pending_link);
        cl_store_srv_log_refusal(s,
                                 "%u connections wait for their handshake: closed the oldest (%s)",
                                 CL_STORE_SRV_PENDING_MAX, old->peer);
        cl_store_srv_conn_free(old);
    }
    if (!s->flush_ev) s->flush_ev = event_new(cl_engine_base(s->engine), -1, 0, store_srv_flush, s);
    store_srv_conn *c = s->flush_ev ? calloc(1, sizeof *c) : NULL;
    struct event_base *base = cl_engine_base(s->engine);
    if (c) {
        c->fd = fd;
        cl_list_init(&c->wait_list);
        c->srv = s;
        c->in = evbuffer_new();
        c->out = evbuffer_new();
        c->rev = event_new(base, fd, EV_READ | EV_PERSIST, store_srv_conn_on_read, c);
        c->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, store_srv_conn_on_write, c);
        c->hs_timer = evtimer_new(base, store_srv_conn_on_handshake_timeout, c);
    }
    if (!c || !c->in || !c->out || !c->rev || !c->wev || !c->hs_timer) {
        CL_WARN("store", "server %s: out of memory accepting %s", s->name, peer);
        if (c) {
            c->srv = s;
            atomic_fetch_add_explicit(&s->nconns, 1, memory_order_relaxed);
            cl_store_srv_conn_free(c); /* closes fd */
        } else {
            close(fd);
        }
        return;
    }
    evutil_make_socket_nonblocking(fd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->state = STORE_SRV_HELLO;
    cl_list_push_front(&s->conns, &c->link);
    cl_list_push_back(&s->pending, &c->pending_link);
    s->npending++;
    atomic_fetch_add_explicit(&s->nconns, 1, memory_order_relaxed);
    struct timeval hs = {s->handshake_ms / 1000, (s->handshake_ms % 1000) * 1000};
    event_add(c->hs_timer, &hs);
    event_add(c->rev, NULL);
    CL_DEBUG("store", "server %s: accepted %s", s->name, peer);
}
