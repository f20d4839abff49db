/*
 * tcp_conn.c — a connection between two ranks over either link: its
 * lifecycle (new, ready, closed, freed) and its ends (a fault, the comm's
 * abort with last words). The data path lives beside it: tcp_conn_write.c
 * (queueing, flow control, flushing), tcp_conn_read.c (reading frames off
 * the link) and tcp_conn_match.c (matching frames to receives, parking the
 * early ones, mismatches); tcp_conn_impl.h is what they share. Making
 * connections (lazy connect, authenticated handshake, listening) is
 * tcp_setup.c.
 *
 * Design notes
 *  - Links: the frames travel over the TCP socket, or for a same-host
 *    peer over shared-memory rings with the Unix socket beside them as
 *    doorbell and liveness (tcp_local.c, transports/cpu/shm/link.h). Every byte
 *    moves through cl_tcp_link_recv/writev; the ring's EAGAIN means "parked:
 *    the peer's doorbell will wake the read watch", so a shm link never uses
 *    the write watch to wait (a Unix socket is always writable).
 *  - Framing: a 48-byte header (generation, seq, step, op, dtype, count,
 *    payload length) then the payload (layout: cpu.h). Sends use writev
 *    from the user's buffer (tcp_conn_write.c); receives read straight
 *    into the destination, or through this connection's staging buffer
 *    when the data is reduced on arrival (tcp_conn_read.c).
 *  - User buffers are touched only inside work_busy_enter/exit, so once a
 *    work's completion is visible they are never read or written again.
 *  - A connection is closed (socket and watches stopped, loans failed)
 *    before it is freed; what is queued on it and the slots it holds stay
 *    for the abort to fail, so late events find it closed.
 *  - Frame MAC (issue 28; frame_mac.h, cpu.h): a connection uses it iff
 *    it is a TCP link (never shared memory: only the same user reaches
 *    that, who could read the memory anyway), the handshake gave it a
 *    session key (the job has a secret), and COLLIE_FRAME_MAC is not 0
 *    on the sender. It is keyed as the connection becomes ready, both
 *    directions numbered from 0; the sender's side is tcp_conn_write.c's,
 *    the receiver's tcp_conn_read.c's.
 *  - Last words: when the comm closes its connections after a fault, each
 *    one that is at a frame boundary first carries an ABORT frame with the
 *    root cause, whole (up to TCP_ABORT_MAX, above the core's bound on a
 *    comm's message: a desync report is kilobytes, and a peer must read
 *    the same words as the store notice gives the others); an orderly
 *    destroy sends BYE instead. The store's abort
 *    notice tells the peers too, and the comm waits a moment for them to
 *    read it, but a peer that was descheduled for longer would otherwise
 *    read only the end of the connection and blame us; TCP delivers the
 *    frame before that end (Linux also reads out queued data before
 *    reporting a reset). The peer's comm fails with the same words as from
 *    the notice, whichever comes first.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transports/cpu/cpu.h"
#include "transports/cpu/tcp_conn_impl.h"

/* ---- made, ready, closed, freed ---------------------------------------------------- */

int cl_tcp_conn_attach_fd(tcp_conn *c, int fd) {
    const collie_core_services *core = c->tc->core;
    c->fd = fd;
    c->rev = core->watch_new(c->tc->bc, fd, COLLIE_WATCH_READ, cl_tcp_conn_on_read, c);
    c->wev = core->watch_new(c->tc->bc, fd, COLLIE_WATCH_WRITE, cl_tcp_conn_on_write, c);
    if (!c->rev || !c->wev) return COLLIE_ENOMEM;
    c->tc->core->watch_start(c->rev, -1);
    return COLLIE_OK;
}

tcp_conn *cl_tcp_conn_new(tcp_comm *tc, int peer) {
    tcp_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->tc = tc;
    c->peer = peer;
    c->fd = -1;
    cl_shm_link_init(&c->shm);
    cl_list_init(&c->sendq);
    cl_list_init(&c->lent);
    cl_list_init(&c->doomed);
    cl_list_init(&c->p2p_expected);
    cl_list_init(&c->unexpected);
    cl_list_init(&c->held);
    cl_list_init(&c->rts_wait);
    cl_list_init(&c->parked_list);
    c->credit_msg.ctl = TCP_CTL_CREDIT;
    c->hb_msg.ctl = TCP_CTL_HEARTBEAT;
    /* later puts cannot fail */
    if (!cl_idmap_grow(&c->expected) || !cl_idmap_grow(&c->parked)) {
        cl_idmap_fini(&c->expected);
        free(c);
        return NULL;
    }
    return c;
}

/* the comm's count of open connections (collie_comm_get_stats) */
static void conn_count(tcp_conn *c, int delta) {
    const collie_core_services *core = c->tc->core;
    if (!cl_tcp_link_is_shm(c)) c->tc->socket_conns += delta;
    if (!COLLIE_CORE_HAS(core, stat_add)) return;
    core->stat_add(c->tc->bc, COLLIE_BSTAT_CONNECTIONS, delta);
    if (cl_tcp_link_is_shm(c)) core->stat_add(c->tc->bc, COLLIE_BSTAT_SHM_CONNECTIONS, delta);
}

void cl_tcp_conn_free(tcp_conn *c) {
    if (!c) return;
    if (c->state == TCP_CONN_READY) conn_count(c, -1);
    if (cl_list_linked(&c->pending_node) && !c->reaped) c->tc->npending--;
    cl_list_remove(&c->pending_node); /* if it was still being identified */
    if (c->rev) c->tc->core->watch_free(c->rev);
    if (c->wev) c->tc->core->watch_free(c->wev);
    if (c->fd >= 0) close(c->fd);
    tcp_msg *m;
    while ((m = cl_list_first(&c->lent, tcp_msg, node))) /* their works are gone */
        cl_list_remove(&m->node);
    tcp_work *tw;
    while ((tw = cl_list_first(&c->doomed, tcp_work, doomed_node)))
        cl_list_remove(&tw->doomed_node);
    if (c->doom_ev) c->tc->core->watch_free(c->doom_ev);
    if (c->grace_ev) c->tc->core->watch_free(c->grace_ev);
    cl_shm_link_close(&c->shm);
    cl_list_remove(&c->shm_node);
    if (c->addr_ctx) { /* its callback frees the context and the request */
        c->addr_ctx->target = NULL;
        c->tc->core->work_cancel(c->addr_req);
    }
    tcp_unexpected *u;
    while ((u = cl_list_first(&c->unexpected, tcp_unexpected, node))) {
        cl_list_remove(&u->node);
        free(u->data);
        free(u);
    }
    if (c->cur_unx) {
        free(c->cur_unx->data);
        free(c->cur_unx);
    }
    tcp_parked *p;
    while ((p = cl_list_first(&c->parked_list, tcp_parked, node))) {
        cl_list_remove(&p->node);
        free(p);
    }
    while ((m = cl_list_first(&c->sendq, tcp_msg, node))) { /* control frames are ours */
        cl_list_remove(&m->node);
        if (m->ctl == TCP_CTL_CTS) free(m);
    }
    free(c->stage);
    free(c->peer_abort);
    cl_frame_mac_fini(&c->mac_tx);
    cl_frame_mac_fini(&c->mac_rx);
    cl_idmap_fini(&c->expected);
    cl_idmap_fini(&c->parked);
    free(c);
}

/* Key the frame MAC of a TCP link with a session key (the job has a
 * secret): both directions, numbered from 0. False if c was failed. */
static bool conn_mac_init(tcp_conn *c) {
    if (c->mac_keyed || !c->session_keyed || cl_tcp_link_is_shm(c)) return true;
    if (!cl_frame_mac_init(&c->mac_tx, c->session_key, c->initiator) ||
        !cl_frame_mac_init(&c->mac_rx, c->session_key, !c->initiator)) {
        cl_frame_mac_fini(&c->mac_tx);
        cl_frame_mac_fini(&c->mac_rx);
        cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory for the frame MAC of rank %d's link",
                         c->peer);
        return false;
    }
    c->mac_keyed = true;
    c->mac_tx_on = c->tc->frame_mac;
    c->tx_next = c->rx_next = 0;
    return true;
}

void cl_tcp_conn_ready(tcp_conn *c) {
    if (!conn_mac_init(c)) return;
    if (c->state != TCP_CONN_READY) conn_count(c, 1);
    c->state = TCP_CONN_READY;
    c->hs_phase = HS_DONE;
    c->tc->core->log_comm(c->tc->bc, 3, "tcp", "connected to rank %d%s", c->peer,
                          cl_tcp_link_is_shm(c) ? " (shared memory)"
                          : c->mac_tx_on        ? " (frames with a MAC)"
                          : c->mac_keyed        ? " (frames without a MAC: COLLIE_FRAME_MAC=0)"
                                                : "");
    c->tc->core->watch_start(c->wev, -1);
    /* the peer may send this much of collective frames we have not posted
     * yet (tcp_conn_write.c's notes): its first credit */
    c->owed = c->tc->early_bytes;
    cl_tcp_conn_send_credit(c, true);
    /* a shm reader is woken only once it parked: read what the peer may
     * have written already, and park; a spinning loop polls it */
    if (cl_tcp_link_is_shm(c)) {
        cl_tcp_loans_probe(c); /* the dialer: the acceptor's probe is there */
        if (!cl_list_linked(&c->shm_node)) cl_list_push_back(&c->tc->shm_conns, &c->shm_node);
        c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
    }
}

/* Close the socket; queued messages and slots stay for the abort to fail. */
void cl_tcp_conn_close(tcp_conn *c, int status, const char *why) {
    if (c->state == TCP_CONN_CLOSED) return;
    c->closed_status = status;
    if (c->state == TCP_CONN_READY) conn_count(c, -1);
    c->state = TCP_CONN_CLOSED;
    snprintf(c->closed_why, sizeof c->closed_why, "%s", why);
    if (c->rev) c->tc->core->watch_stop(c->rev);
    if (c->wev) c->tc->core->watch_stop(c->wev);
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    cl_tcp_loans_close(c); /* before the pidfd goes: they fail with closed_why */
    cl_shm_link_hang_up(&c->shm);
    cl_list_remove(&c->shm_node);
    c->tc->core->log_comm(c->tc->bc, 3, "tcp", "connection to rank %d closed: %s", c->peer, why);
    if (cl_list_linked(&c->pending_node) && !c->reaped)
        cl_tcp_pending_closed(c); /* never identified: freed on the next turn (tcp_setup.c) */
}

/* ---- ends: faults, the comm's abort ------------------------------------------------ */

/* Can a frame of our own go out now without landing inside another one? */
static bool conn_at_frame_boundary(const tcp_conn *c) {
    return c->state == TCP_CONN_READY && c->fd >= 0 && !c->send_broken &&
           c->hs_out_sent == c->hs_out_len &&
           (cl_list_empty(&c->sendq) || cl_list_first(&c->sendq, tcp_msg, node)->sent == 0);
}

/* The comm is closing (the backend's abort). Tell the peer why first, best
 * effort, in the stream it reads, so that the end of the connection is
 * never all it learns: ECLOSED is an orderly goodbye (so it does not take
 * our departure for a crash), anything else an ABORT frame carrying the
 * reason, which TCP delivers before the end of the stream (see the design
 * notes). A broken or busy stream gets nothing: the store notice has to do. */
void cl_tcp_conn_abort(tcp_conn *c, int status, const char *why) {
    if (conn_at_frame_boundary(c)) {
        uint8_t h[TCP_FRAME_HDR];
        size_t len = strlen(why);
        if (len > TCP_ABORT_MAX) len = TCP_ABORT_MAX;
        bool bye = status == COLLIE_ECLOSED;
        collie_coll_args none = {.kind = (collie_coll_kind)(bye ? TCP_KIND_BYE : TCP_KIND_ABORT)};
        cl_tcp_frame_header(h, c->tc, &none, 0, 0, bye ? 0 : len);
        if (bye) len = 0;
        uint8_t tag[CL_FRAME_MAC_TAG];
        struct iovec iov[3] = {{.iov_base = h, .iov_len = sizeof h}};
        int niov = 1;
        if (len) iov[niov++] = (struct iovec){.iov_base = (void *)why, .iov_len = len};
        bool ok = true;
        if (c->mac_tx_on) { /* the next number: nothing of another frame is on the wire */
            h[7] |= TCP_FRAME_MAC;
            ok = cl_frame_mac_tag(&c->mac_tx, c->tx_next, h, sizeof h, why, len, tag);
            iov[niov++] = (struct iovec){.iov_base = tag, .iov_len = sizeof tag};
        }
        if (ok && (!bye || !cl_tcp_conn_sends_pending(c))) {
            ssize_t n = cl_tcp_link_writev(c, iov, niov, true);
            if (n > 0) c->tx_next++;
        }
    }
    cl_tcp_conn_close(c, status, why);
}

/* The connection ends for a fault: close it (after telling the peer why
 * in an ABORT frame, with `tell`) and fail the works that need its peer. */
static void conn_end_fault(tcp_conn *c, int status, bool tell, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static void conn_end_fault(tcp_conn *c, int status, bool tell, const char *fmt, va_list ap) {
    char why[TCP_ABORT_MAX + 64]; /* the peer's root cause, whole */
    vsnprintf(why, sizeof why, fmt, ap);
    tcp_comm *tc = c->tc;
    int peer = c->peer;
    if (tell)
        cl_tcp_conn_abort(c, status, why);
    else
        cl_tcp_conn_close(c, status, why);
    if (peer >= 0) cl_tcp_peer_lost(tc, peer, status, why);
}

void cl_tcp_conn_lost(tcp_conn *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    conn_end_fault(c, status, false, fmt, ap);
    va_end(ap);
}

/* Refuse the peer's stream (a frame MAC that is missing or wrong): tell
 * the peer why in an ABORT frame, as last words (it could not tell a
 * refusal from a crash otherwise), close, and fault the comm. */
void cl_tcp_conn_refuse(tcp_conn *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    conn_end_fault(c, status, true, fmt, ap);
    va_end(ap);
}

/* Reading or writing the link failed with err (not EAGAIN/EINTR): a shm
 * ring whose counters the peer corrupted (ring.h) breaks the protocol;
 * anything else is the peer's loss. `dir`: "receive from" or "send to". */
void cl_tcp_conn_peer_gone(tcp_conn *c, int state) {
    const collie_core_services *core = c->tc->core;
    if (c->peer >= 0 && COLLIE_CORE_HAS(core, peer_gone))
        core->peer_gone(c->tc->bc, c->peer, state);
}

void cl_tcp_conn_disagrees(tcp_conn *c) {
    const collie_core_services *core = c->tc->core;
    if (c->peer >= 0 && COLLIE_CORE_HAS(core, peer_disagrees))
        core->peer_disagrees(c->tc->bc, c->peer);
}

void cl_tcp_conn_heard(tcp_conn *c) {
    const collie_core_services *core = c->tc->core;
    if (c->peer >= 0 && COLLIE_CORE_HAS(core, peer_heard))
        core->peer_heard(c->tc->bc, c->peer, c->heard_seq);
}

void cl_tcp_conn_link_failed(tcp_conn *c, int err, const char *dir) {
    if (err == EPROTO && cl_tcp_link_is_shm(c) && (c->shm.rx.corrupt || c->shm.tx.corrupt))
        cl_tcp_conn_lost(c, COLLIE_EPROTO,
                         "rank %d corrupted the ring of its same-host link (its counters make "
                         "no sense)",
                         c->peer);
    else {
        cl_tcp_conn_peer_gone(c, err == ECONNRESET || err == EPIPE ? COLLIE_PEER_DEAD
                                                                   : COLLIE_PEER_SUSPECTED);
        cl_tcp_conn_lost(c, COLLIE_EPEER, "%s rank %d failed: %s", dir, c->peer, strerror(err));
    }
}

static void conn_works_add(cl_list *out, tcp_work *tw) {
    if (tw && !tw->finished && !cl_list_linked(&tw->lost_node))
        cl_list_push_back(out, &tw->lost_node);
}

void cl_tcp_conn_works(tcp_conn *c, cl_list *out) {
    if (c->cur) conn_works_add(out, c->cur->owner); /* the one reading from it first */
    cl_list *queues[] = {&c->sendq, &c->held, &c->rts_wait, &c->lent};
    for (size_t q = 0; q < sizeof queues / sizeof queues[0]; q++) {
        tcp_msg *m;
        cl_list_foreach(queues[q], m, tcp_msg, node) conn_works_add(out, m->owner);
    }
    tcp_slot *s;
    cl_list_foreach(&c->p2p_expected, s, tcp_slot, node) conn_works_add(out, s->owner);
    size_t buckets = c->expected.bits ? (size_t)1 << c->expected.bits : 0;
    for (size_t b = 0; b < buckets; b++)
        for (cl_idnode *n = c->expected.buckets[b]; n; n = n->next)
            conn_works_add(out, ((tcp_slot *)((char *)n - offsetof(tcp_slot, by_seq)))->owner);
}
