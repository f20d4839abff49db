/*
 * tcp_conn.c — TCP connections between ranks, the data path: lifecycle,
 * framed sends straight from user memory, receives straight into the
 * matched destination. Making connections (lazy connect, authenticated
 * handshake, listening) is tcp_setup.c.
 *
 * Design notes
 *  - Links: the frames travel over the TCP socket, or for a same-host
 *    peer over shared-memory rings with the Unix socket beside them as
 *    doorbell and liveness (tcp_local.c, transports/cpu/shm/link.h). Every byte
 *    moves through cl_tcp_link_recv/writev; the ring's EAGAIN means "parked:
 *    the peer's doorbell will wake the read watch", so a shm link never uses
 *    the write watch to wait (a Unix socket is always writable).
 *  - Framing: a 48-byte header (generation, seq, step, op, dtype, count,
 *    payload length) then the payload. Sends use writev from the user's
 *    buffer; receives read straight into the destination, or through this
 *    connection's staging buffer when the data is reduced on arrival.
 *  - Matching: a header is matched to an expected slot of the same (seq,
 *    step) from this peer, found in O(1) through a hash of the expected
 *    slots by seq (a deep queue keeps thousands posted; frames of step k+1
 *    come while later works' step-k slots wait). Point-to-point messages
 *    match posted receives by tag in post order (MPI's rule), a receive
 *    from this peer or from any source (the comm's any_expected) whichever
 *    was posted first; unmatched ones are kept in memory (unexpected,
 *    unbounded, as an MPI eager protocol's).
 *  - Early collective frames (issue 28): a frame whose slot is not posted
 *    yet (the peer runs ahead: a collective this rank has not posted, or a
 *    later step of one it has) is read and *parked* (tcp_parked, by seq),
 *    never left in the stream: a reader that stopped there would hold up
 *    everything behind it - a send/recv (rank 1 waits for a message that
 *    rank 0 sent after an allreduce rank 1 posts later) and even another
 *    collective's frame (rank 1 waits for allreduce 1 before it posts 2,
 *    whose frame rank 0 sent before its last one of 1). Posting the slot
 *    takes the parked frame (copy, or reduce from it), after the same
 *    argument checks as a live frame; a frame parked for a collective that
 *    completed without it is a mismatch (recheck at detach). A frame of
 *    64 KiB or more first waits up to 1 ms, reading paused, for its
 *    receive (usually posted within moments): then it is read into place
 *    with no allocation or copy; past that it is parked.
 *  - Mismatches fail within a round trip, never at the deadline: a frame
 *    is compared with this rank's post of its seq (every argument that must
 *    agree, and the v collectives' counts check: cpu.h) when it fills its
 *    slot, and also when it has none yet but its collective runs here —
 *    as it arrives, or as the collective starts with it parked
 *    (cl_tcp_frame_agrees, cl_tcp_conn_check_early). A rank that disagrees
 *    on the root or on which v block is empty may never post the slot a
 *    frame waits for. A frame for a finished seq is a mismatch as well
 *    (every frame of a collective is consumed before it completes).
 *  - The memory bound is credit: a receiver parks at most COLLIE_EARLY_BYTES
 *    per connection and grants exactly that to its peer (the first CREDIT
 *    frame at connect, root field = the window). Every collective frame
 *    costs its sender credit (header + payload) when queued; the receiver
 *    returns it (CREDIT frames, a quarter of the window at a time) as it
 *    takes frames - straight into their slots or out of the park - so a
 *    sender never has more in flight than the receiver can park, and the
 *    receiver never has to stop reading. Without credit, collective frames
 *    wait on the sender (held, in order) while point-to-point and control
 *    frames, which are never charged, still go: p2p never waits behind
 *    collectives. A frame above half the window (which could not be parked)
 *    is announced instead (RTS: the header alone, charged as a header); the
 *    receiver answers CTS once the slot is posted and the frame follows
 *    uncharged (CLEARED), or GONE if its work ended meanwhile (the receive
 *    fails as for a withdrawn loan). Why it never deadlocks: a receiver
 *    always reads (parks within the grant, or takes into a slot); credit
 *    comes back as soon as a frame is taken, so a held frame waits only for
 *    frames parked for collectives not yet posted, and those are posted
 *    unless the program waits for something that cannot overtake them -
 *    p2p and announced frames always can. E + T <= W (frames up to half the
 *    window eager, credit returned at a quarter) makes sure a sender that
 *    lacks credit with nothing parked or in flight is always owed a
 *    CREDIT frame. A peer that sends past its grant, a frame twice, or a
 *    cleared frame not asked for breaks the protocol: EPROTO, connection
 *    closed. Cost: one CREDIT frame per quarter window of collective bytes
 *    (4 MiB by default), one round trip more for frames above 8 MiB and
 *    for frames that may be lent (single copy, tcp_loan.c: lent only once
 *    the receive is posted), and a copy for frames that came early.
 *  - User buffers are touched only inside work_busy_enter/exit, so once a
 *    work's completion is visible they are never read or written again.
 *  - Broken sending: a message cut off mid-way (its work ended by deadline,
 *    cancel or abort while the message was partly written; its payload is
 *    no longer ours to read) leaves the peer mid-frame. The connection then
 *    stops writing for good and fails the works whose messages were queued
 *    behind, but it is not closed: it is still read (the peer's EOF or
 *    error is noticed), and a peer that saw it drop now would blame us
 *    ("rank 1 closed its connection") before it could read the root cause
 *    from the store. It closes with the comm's delayed close (the backend's
 *    abort), at destroy, or when a later op needs that peer (policy NONE,
 *    where nothing else closes it): that op fails with EPEER naming the cut.
 *  - Frame MAC (issue 28; frame_mac.h, cpu.h): a connection uses it iff
 *    it is a TCP link (never shared memory: only the same user reaches
 *    that, who could read the memory anyway), the handshake gave it a
 *    session key (the job has a secret), and COLLIE_FRAME_MAC is not 0
 *    on the sender. Every frame then carries TCP_FRAME_MAC and a 16-byte
 *    tag after its body, numbered in its direction from 0. Sender: flush
 *    tags each frame not started yet with tx_next + k (k-th of the batch)
 *    under its work's BUSY bracket, the tag a third iovec; a frame whose
 *    first byte is written spends its number (tx_next++, in order), so a
 *    frame dropped before that takes none and the numbers have no gaps; a
 *    tag is remade when its frame's number or header changed (requeued, a
 *    CREDIT topped up, a control frame queued ahead). A batch stops taking
 *    unstarted frames at FLUSH_MAC_BYTES of tagged body. ABORT/BYE, written
 *    directly, take tx_next at a frame boundary. Receiver: at a header,
 *    begin(rx_next) and the header; every payload byte read from the link
 *    is fed once as it comes (conn_link_payload, whatever its destination);
 *    then the tag is read and checked (rx_next++) before the frame
 *    completes: no op_done, park completion, unexpected message, control
 *    frame or ABORT is acted on unverified. (Matching and its argument
 *    checks run at the header, as before: a header that does not agree
 *    faults the comm either way; a reduce may fold unverified bytes into
 *    its output, but its work completes only after the check.) A link
 *    with a key and the setting on takes no untagged frame (EAUTH naming
 *    the setting); one with the setting off still checks tagged frames; a
 *    tag without a key is a malformed frame. A bad tag or a missing one
 *    refuses the stream: the reason goes to the peer as an ABORT frame,
 *    the connection closes and the comm faults with COLLIE_EAUTH.
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
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transports/reduce.h"
#include "transports/cpu/cpu.h"

#include "transports/cpu/tcp_conn_impl.h"

void cl_tcp_frame_header(uint8_t *h, const tcp_comm *tc, const collie_coll_args *a, uint64_t seq,
                         uint32_t step, uint64_t len) {
    cl_tcp_frame f = {.kind = (uint8_t)a->kind,
                      .dtype = (uint8_t)a->dtype,
                      .op = (uint8_t)a->op,
                      .step = step,
                      .generation = (uint32_t)tc->generation,
                      .seq = seq,
                      .count = a->count,
                      .length = len,
                      .root = collie_coll_has_root(a->kind) ? (uint32_t)a->root : TCP_NO_ROOT};
    cl_tcp_frame_encode(h, &f);
}

void cl_tcp_frame_set_vcheck(uint8_t *h, uint32_t vcheck) { put32(h + 44, vcheck); }

/* One side of a collective, from a frame's fields, for messages. */
static void describe_post(char *buf, size_t len, unsigned kind, uint64_t count, unsigned dtype,
                          unsigned op, uint32_t root) {
    collie_coll_describe(buf, len, (collie_coll_kind)kind, count,
                         cl_dtype_name((collie_dtype)dtype), cl_redop_name((collie_redop)op),
                         (int)root);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

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

static bool conn_sends_pending(const tcp_conn *c);
static void conn_send_credit(tcp_conn *c, bool now);

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
        if (ok && (!bye || !conn_sends_pending(c))) {
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

/* Fail the works whose messages wait behind a cut (they can never go), a
 * slice per turn of the loop: a deep queue must not stall the loop. The
 * rest stay queued for the next turn (the write watch, with a zero timeout:
 * it fires after the next poll even when the socket is full). */
#define BROKEN_SLICE 256
static void conn_fail_queued(tcp_conn *c) {
    tcp_msg *m;
    for (int i = 0; i < BROKEN_SLICE && (m = cl_list_first(&c->sendq, tcp_msg, node)); i++) {
        cl_list_remove(&m->node); /* finishing only schedules a retirement: the list stays ours */
        if (m->ctl == TCP_CTL_CTS) {
            free(m);
            continue;
        }
        if (m->owner && !m->owner->finished) /* the fault that cut the stream takes it down */
            cl_tcp_work_fault(m->owner, COLLIE_EABORTED, c->broken_why);
    }
    if (!cl_list_empty(&c->sendq) && c->wev) /* after the loop's next poll */
        c->tc->core->watch_start(c->wev, 0);
}

/* Message `cut` left only partly written (its work is ending): stop writing
 * on c for good (see the design notes). The messages queued behind it can
 * never go: their works fail (in slices, one per turn of the loop). The
 * socket stays open and read. */
void cl_tcp_conn_break_send(tcp_conn *c, const tcp_msg *cut) {
    if (c->send_broken) return;
    c->send_broken = true;
    snprintf(c->broken_why, sizeof c->broken_why,
             "the stream to rank %d is broken: a message (seq %llu) was cut off mid-way", c->peer,
             (unsigned long long)get64(cut->hdr + 16));
    if (cl_list_linked((cl_list_node *)&cut->node)) cl_list_remove((cl_list_node *)&cut->node);
    if (c->wev) c->tc->core->watch_stop(c->wev);
    c->flush_scheduled = false;
    c->tc->core->log_comm(c->tc->bc, 3, "tcp", "%s; no more sends on it", c->broken_why);
    /* the frames waiting for credit or for a CTS can never go either */
    cl_list_append_all(&c->sendq, &c->held);
    cl_list_append_all(&c->sendq, &c->rts_wait);
    conn_fail_queued(c);
}

/* ---- sending ----------------------------------------------------------------------------- */

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
     * yet (see the design notes): its first credit */
    c->owed = c->tc->early_bytes;
    conn_send_credit(c, true);
    /* a shm reader is woken only once it parked: read what the peer may
     * have written already, and park; a spinning loop polls it */
    if (cl_tcp_link_is_shm(c)) {
        cl_tcp_loans_probe(c); /* the dialer: the acceptor's probe is there */
        if (!cl_list_linked(&c->shm_node)) cl_list_push_back(&c->tc->shm_conns, &c->shm_node);
        c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
    }
}

/* Flush once the current callback is done: messages queued by several
 * works meanwhile leave in one sendmsg. */
static void conn_want_flush(tcp_conn *c) {
    if (c->state == TCP_CONN_READY && !c->flush_scheduled) {
        c->flush_scheduled = true;
        c->tc->core->watch_activate(c->wev, COLLIE_WATCH_WRITE);
    }
}

/* ---- flow control of collective frames (see the design notes) ---- */

/* A control frame goes out next: at the head of the queue, or right after a
 * message already partly written. */
static void conn_queue_ctl(tcp_conn *c, tcp_msg *m) {
    m->sent = 0;
    m->tagged = false;
    tcp_msg *head = cl_list_first(&c->sendq, tcp_msg, node);
    if (head && head->sent > 0)
        cl_list_insert_after(&head->node, &m->node);
    else
        cl_list_push_front(&c->sendq, &m->node);
    /* the first grant leaves with the connection's first flush (the write
     * watch started by cl_tcp_conn_ready), not sooner: a flush at once
     * would send what is queued before the single-copy probe ran */
    if (m != &c->credit_msg || c->window_granted) conn_want_flush(c);
    c->window_granted = true;
}

static bool conn_is_coll_frame(const tcp_msg *m) {
    return !m->ctl && get32(m->hdr + 8) != TCP_P2P_STEP;
}

/* May collective message m go now? Charges the peer's credit if so: its
 * whole frame, or for a frame above half the peer's window (which could
 * never be parked there) an announcement (RTS, the header alone) whose data
 * follows the peer's CTS, uncharged. */
static bool conn_admit(tcp_conn *c, tcp_msg *m) {
    uint64_t need = TCP_FRAME_HDR + m->len;
    /* a frame that could be lent is announced too: it is lent only once
     * the receive is posted, so a receiver never copies a lent payload into
     * its park nor reads one before the arguments were checked */
    if (need > c->window / 2 || cl_tcp_loan_may(c, m)) need = TCP_FRAME_HDR;
    if (c->window == 0 || c->credit < need) return false;
    if (need != TCP_FRAME_HDR + m->len) m->hdr[7] |= TCP_FRAME_RTS;
    c->credit -= need;
    m->charge = need;
    return true;
}

/* Credit came (or came back): move what it covers from held to the queue. */
static void conn_release_held(tcp_conn *c) {
    tcp_msg *m;
    bool moved = false;
    while ((m = cl_list_first(&c->held, tcp_msg, node)) && conn_admit(c, m)) {
        cl_list_remove(&m->node);
        cl_list_push_back(&c->sendq, &m->node);
        moved = true;
    }
    if (moved) conn_want_flush(c);
}

/* m leaves the queue unwritten: its charge goes back to the credit. */
static void conn_refund(tcp_conn *c, tcp_msg *m) {
    if (m->sent > 0 || !m->charge) return;
    c->credit += m->charge;
    m->charge = 0;
    if (m->hdr[7] & TCP_FRAME_RTS) m->hdr[7] &= (uint8_t)~TCP_FRAME_RTS;
    conn_release_held(c);
}

/* The peer's CREDIT frame: credit back, and its window. */
static void conn_on_credit(tcp_conn *c) {
    c->credit += get64(c->hdr + 24);
    c->window = get32(c->hdr + 40);
    conn_release_held(c);
}

static void conn_send_ctl(tcp_conn *c, unsigned kind, uint64_t seq, uint32_t step);

/* The peer's CTS: the frame it announced may go now (uncharged). Unknown
 * (seq, step): its work ended meanwhile, so it never comes: say so (GONE),
 * the receive fails as for a withdrawn loan. */
static void conn_on_cts(tcp_conn *c) {
    uint64_t seq = get64(c->hdr + 16);
    uint32_t step = get32(c->hdr + 8);
    tcp_msg *m;
    cl_list_foreach(&c->rts_wait, m, tcp_msg, node) {
        if (get64(m->hdr + 16) != seq || get32(m->hdr + 8) != step) continue;
        cl_list_remove(&m->node);
        m->hdr[7] = (uint8_t)((m->hdr[7] & ~TCP_FRAME_RTS) | TCP_FRAME_CLEARED);
        m->sent = 0;
        m->tagged = false; /* a frame of its own: its header differs, it takes a number */
        cl_list_push_back(&c->sendq, &m->node);
        conn_want_flush(c);
        return;
    }
    conn_send_ctl(c, TCP_KIND_GONE, seq, step);
}

static tcp_slot *coll_slot_take(tcp_conn *c, uint64_t seq, uint32_t step);

/* The peer's GONE: the frame we asked for never comes (its work ended
 * early): the receive fails after the grace in which the peer's root cause
 * may come first (tcp_loan.c). */
static void conn_on_gone(tcp_conn *c) {
    tcp_slot *s = coll_slot_take(c, get64(c->hdr + 16), get32(c->hdr + 8));
    if (s && !s->owner->finished) cl_tcp_loan_doom(c, s, CL_LOAN_WITHDRAWN);
}

/* Return what we owe the peer once it is a quarter of our budget (or
 * `now`: the first grant), in one CREDIT frame; one that is queued but not
 * started takes the new amount too. */
static void conn_send_credit(tcp_conn *c, bool now) {
    if (!c->owed || c->state != TCP_CONN_READY || c->send_broken) return;
    if (!now && c->owed < c->tc->early_bytes / 4) return;
    tcp_msg *m = &c->credit_msg;
    if (cl_list_linked(&m->node)) {
        if (m->sent > 0) return; /* being written: the rest after it (flush) */
        put64(m->hdr + 24, get64(m->hdr + 24) + c->owed);
        m->tagged = false; /* its header changed */
        c->owed = 0;
        return;
    }
    collie_coll_args a = {.kind = (collie_coll_kind)TCP_KIND_CREDIT};
    cl_tcp_frame_header(m->hdr, c->tc, &a, 0, 0, 0);
    put64(m->hdr + 24, c->owed);
    put32(m->hdr + 40, (uint32_t)c->tc->early_bytes);
    c->owed = 0;
    conn_queue_ctl(c, m);
}

/* A charged frame was consumed (read into its slot, or taken from the
 * park): its bytes go back to the peer's credit. */
static void conn_consumed(tcp_conn *c, uint64_t charge) {
    if (!charge) return;
    c->owed += charge;
    conn_send_credit(c, false);
}

/* A control frame about (seq, step): CTS (ask for the frame announced:
 * the slot is posted) or GONE (that frame never comes). */
static void conn_send_ctl(tcp_conn *c, unsigned kind, uint64_t seq, uint32_t step) {
    if (c->state != TCP_CONN_READY || c->send_broken) return;
    tcp_msg *m = calloc(1, sizeof *m);
    if (!m) {
        cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory to answer rank %d", c->peer);
        return;
    }
    m->ctl = TCP_CTL_CTS;
    collie_coll_args a = {.kind = (collie_coll_kind)kind};
    cl_tcp_frame_header(m->hdr, c->tc, &a, seq, step, 0);
    conn_queue_ctl(c, m);
}

static void conn_send_cts(tcp_conn *c, uint64_t seq, uint32_t step) {
    conn_send_ctl(c, TCP_KIND_CTS, seq, step);
}

/* Does the send side hold a work's message not written whole yet (control
 * frames do not count)? */
static bool conn_sends_pending(const tcp_conn *c) {
    if (!cl_list_empty(&c->held) || !cl_list_empty(&c->rts_wait)) return true;
    tcp_msg *m;
    cl_list_foreach(&c->sendq, m, tcp_msg, node) if (!m->ctl) return true;
    return false;
}

void cl_tcp_conn_send(tcp_conn *c, tcp_msg *m) {
    if (c->send_broken) { /* cl_tcp_conn_get closes these: not expected */
        if (!m->owner->finished) cl_tcp_work_fail(m->owner, COLLIE_EPEER, "%s", c->broken_why);
        return;
    }
    m->sent = 0;
    m->loan_ticket = 0;
    m->charge = 0;
    m->tagged = false;
    if (conn_is_coll_frame(m) && (!cl_list_empty(&c->held) || !conn_admit(c, m))) {
        cl_list_push_back(&c->held, &m->node); /* the peer's credit lets it go */
        return;
    }
    cl_list_push_back(&c->sendq, &m->node);
    conn_want_flush(c);
}

#define FLUSH_BATCH 32 /* messages gathered into one sendmsg */
/* with the frame MAC, a batch stops taking frames not yet started once this
 * much of their bodies is tagged (at least one frame): tags of frames that
 * then find no room are often made again (their numbers may change) */
#define FLUSH_MAC_BYTES (256u * 1024)

/* Tag m (not started yet) as frame number n of c's direction: the MAC
 * over its header, with TCP_FRAME_MAC set, and the body that goes on the
 * wire. A tag made for the same number since m was last (re)queued is
 * still good. Under the owner's BUSY bracket (the payload is its memory).
 * False on a libcrypto failure. */
static bool conn_tag(tcp_conn *c, tcp_msg *m, uint64_t n) {
    if (m->tagged && m->tag_n == n) return true;
    m->hdr[7] |= TCP_FRAME_MAC;
    const uint8_t *body = m->loan_ticket ? m->loan : m->payload;
    if (!cl_frame_mac_tag(&c->mac_tx, n, m->hdr, TCP_FRAME_HDR, body, tcp_msg_body_len(m), m->tag))
        return false;
    m->tagged = true;
    m->tag_n = n;
    return true;
}

/* Reading waits for a receive to be posted (the peer is ahead). */
static bool conn_read_paused(const tcp_conn *c) {
    return c->have_hdr && !c->cur && !c->cur_unx && !c->cur_park && !c->reading_abort;
}

/* Sending failed: the peer has gone. Its last words (an ABORT frame naming
 * the root cause) may still wait in our receive queue, behind frames no
 * receive is posted for (parked, or skipped after a mismatch paused
 * reading) - a deep queue of small collectives leaves thousands. Read them
 * before blaming the peer; reading ends the connection if they are there,
 * or at the end of the stream. Bounded: 64 rounds of 64 reads, and a round
 * that completes no frame ends it. */
static void conn_read_last_words(tcp_conn *c) {
    for (int i = 0; i < 64 && c->state == TCP_CONN_READY; i++) {
        if (conn_read_paused(c)) {
            memset(&c->drain, 0, sizeof c->drain);
            c->drain.len = c->payload_len;
            c->cur = &c->drain; /* owner NULL: into the discard area */
        }
        uint64_t before = c->frames_read;
        cl_tcp_conn_on_read(c->fd, COLLIE_WATCH_READ, c);
        if (c->frames_read == before && !conn_read_paused(c)) return;
    }
}

/* Reading or writing the link failed with err (not EAGAIN/EINTR): a shm
 * ring whose counters the peer corrupted (ring.h) breaks the protocol;
 * anything else is the peer's loss. `dir`: "receive from" or "send to". */
static void conn_link_failed(tcp_conn *c, int err, const char *dir) {
    if (err == EPROTO && cl_tcp_link_is_shm(c) && (c->shm.rx.corrupt || c->shm.tx.corrupt))
        cl_tcp_conn_lost(c, COLLIE_EPROTO,
                         "rank %d corrupted the ring of its same-host link (its counters make "
                         "no sense)",
                         c->peer);
    else
        cl_tcp_conn_lost(c, COLLIE_EPEER, "%s rank %d failed: %s", dir, c->peer, strerror(err));
}

/* Write the handshake bytes, then queued messages, until the socket is
 * full. Up to FLUSH_BATCH messages go out in one sendmsg (header and
 * payload straight from the user's memory). Completing a message may make
 * its work post more messages to this connection: they are appended and
 * picked up by this same loop. */
void cl_tcp_conn_flush(tcp_conn *c) {
    const collie_core_services *core = c->tc->core;
    int lent = 0; /* messages lent now */
    c->flush_scheduled = false;
    c->shm.writer_wait = false;
    while (c->hs_out_sent < c->hs_out_len) {
        ssize_t n = cl_tcp_hs_send(c, c->hs_out + c->hs_out_sent, c->hs_out_len - c->hs_out_sent);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) goto want_write;
            cl_tcp_conn_lost(c, COLLIE_EPEER, "handshake send to rank %d: %s", c->peer,
                             strerror(errno));
            return;
        }
        c->hs_out_sent += (size_t)n;
    }
    if (c->state != TCP_CONN_READY || c->send_broken) {
        c->tc->core->watch_stop(c->wev);
        if (c->send_broken) conn_fail_queued(c); /* the next slice, if any */
        return;
    }
    while (!cl_list_empty(&c->sendq)) {
        tcp_msg *batch[FLUSH_BATCH];
        collie_work *entered[FLUSH_BATCH];
        struct iovec iov[3 * FLUSH_BATCH];
        int nb = 0, ne = 0, niov = 0;
        uint64_t number = c->tx_next, tagged_bytes = 0; /* frames started get numbers in order */
        bool lend_stop = false; /* a message that may be lent was not: lend none after it */
        tcp_msg *m;
        cl_list_foreach(&c->sendq, m, tcp_msg, node) {
            if (nb == FLUSH_BATCH) break;
            if (c->mac_tx_on && nb > 0 && tagged_bytes >= FLUSH_MAC_BYTES) break;
            if (m->len > 0) { /* the payload is the work's memory: bracket it */
                collie_work *w = m->owner->w;
                bool have = false;
                for (int i = 0; i < ne && !have; i++)
                    have = entered[i] == w;
                if (!have && !core->work_busy_enter(w)) {
                    if (nb > 0) break; /* send what we have; this one next time */
                    /* the work is being finished (deadline, cancel): its
                     * detach will drop this message; do not touch it */
                    if (m->sent > 0) {
                        cl_tcp_conn_break_send(c, m);
                        return;
                    }
                    cl_list_remove(&m->node);
                    conn_refund(c, m);
                    break;
                }
                if (!have) entered[ne++] = w;
                /* a large payload to a same-host peer: lend it instead
                 * (under the bracket: the unlend hook sees the loan).
                 * Tickets must reach the peer in order: one that may be
                 * lent but was not (no slot now) may be lent by a later
                 * batch, so none after it is lent in this one (a batch is
                 * always the head of the queue: it comes first again) */
                if (m->sent == 0 && !m->loan_ticket && !(m->hdr[7] & TCP_FRAME_RTS) &&
                    (!conn_is_coll_frame(m) || (m->hdr[7] & TCP_FRAME_CLEARED)) &&
                    cl_tcp_loan_may(c, m) && !lend_stop) {
                    if (cl_tcp_loan_open(c, m))
                        lent++;
                    else
                        lend_stop = true;
                }
            }
            if (c->mac_tx_on && m->sent == 0) {
                if (!conn_tag(c, m, number++)) {
                    for (int i = 0; i < ne; i++)
                        core->work_busy_exit(entered[i]);
                    cl_tcp_conn_lost(c, COLLIE_ESYSTEM, "no frame MAC for rank %d (libcrypto)",
                                     c->peer);
                    return;
                }
                tagged_bytes += tcp_msg_body_len(m);
            }
            if (m->sent < TCP_FRAME_HDR) {
                iov[niov].iov_base = m->hdr + m->sent;
                iov[niov++].iov_len = TCP_FRAME_HDR - m->sent;
            }
            const uint8_t *body = m->loan_ticket ? m->loan : m->payload;
            uint64_t blen = tcp_msg_body_len(m);
            uint64_t poff = m->sent > TCP_FRAME_HDR ? m->sent - TCP_FRAME_HDR : 0;
            if (blen > poff) {
                iov[niov].iov_base = (void *)(body + poff);
                iov[niov++].iov_len = blen - poff;
            }
            uint64_t toff = m->sent > TCP_FRAME_HDR + blen ? m->sent - TCP_FRAME_HDR - blen : 0;
            if ((m->hdr[7] & TCP_FRAME_MAC) && toff < CL_FRAME_MAC_TAG) {
                iov[niov].iov_base = m->tag + toff;
                iov[niov++].iov_len = CL_FRAME_MAC_TAG - toff;
            }
            batch[nb++] = m;
        }
        if (nb == 0) continue; /* a dropped message: look again */
        ssize_t n = cl_tcp_link_writev(c, iov, niov, false);
        for (int i = 0; i < ne; i++)
            core->work_busy_exit(entered[i]);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) goto want_write;
            int err = errno;
            conn_read_last_words(c);
            if (c->state == TCP_CONN_READY) conn_link_failed(c, err, "send to");
            return;
        }
        /* account the bytes in order; unlink the finished messages first,
         * then report them (reporting may queue more or close c) */
        tcp_work *done[FLUSH_BATCH];
        int nd = 0, nfull = 0;
        bool credit_sent = false;
        uint64_t left = (uint64_t)n;
        for (int i = 0; i < nb; i++) {
            tcp_msg *m = batch[i];
            uint64_t want = tcp_msg_frame_len(m) - m->sent;
            uint64_t take = left < want ? left : want;
            if (take > 0 && m->sent == 0 && (m->hdr[7] & TCP_FRAME_MAC))
                c->tx_next++; /* its first byte is out: the number is spent */
            m->sent += take;
            left -= take;
            if (take < want) break;
            nfull++;
            cl_list_remove(&m->node);
            m->charge = 0;
            if (m->ctl == TCP_CTL_CTS)
                free(m);
            else if (m->ctl == TCP_CTL_CREDIT)
                credit_sent = true;
            else if (m->hdr[7] & TCP_FRAME_RTS) /* its data goes on the peer's CTS */
                cl_list_push_back(&c->rts_wait, &m->node);
            else if (m->loan_ticket) /* done when the peer has read it */
                cl_list_push_back(&c->lent, &m->node);
            else
                done[nd++] = m->owner;
        }
        bool partial = nfull < nb;
        if (credit_sent) conn_send_credit(c, false); /* owed meanwhile */
        for (int i = 0; i < nd; i++)
            cl_tcp_op_done(done[i]);
        if (c->state != TCP_CONN_READY) return; /* closed by a fault */
        if (partial) goto want_write;
    }
    c->tc->core->watch_stop(c->wev); /* also cancels an activation made meanwhile: */
    c->flush_scheduled = false;      /* this flush covered it */
    if (lent) cl_tcp_loans_settle(c, !c->tc->polled); /* a loop that may sleep hears returns */
    return;
want_write:
    /* a full ring parked the writer: the reader's doorbell, on the read
     * watch, resumes it (the Unix socket is always writable: watching for
     * that would spin) */
    if (!cl_tcp_link_is_shm(c))
        c->tc->core->watch_start(c->wev, -1);
    else if (!c->shm.writer_wait) /* room came as it parked: go on next turn */
        c->tc->core->watch_activate(c->wev, COLLIE_WATCH_WRITE);
    c->flush_scheduled = false;
    if (lent) cl_tcp_loans_settle(c, !c->tc->polled);
}

void cl_tcp_conn_on_write(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_conn *c = arg;
    if (c->state == TCP_CONN_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            cl_tcp_conn_lost(c, COLLIE_EPEER, "connect to rank %d failed: %s", c->peer,
                             strerror(err));
            return;
        }
        c->state = TCP_CONN_HANDSHAKE;
        c->hs_phase = HS_D_WAIT_CHALLENGE;
        c->hs_in_want = HS_CHALLENGE_LEN;
        c->hs_in_len = 0;
        c->tc->core->watch_stop(c->wev);
        return;
    }
    cl_tcp_conn_flush(c);
}

/* ---- receiving ------------------------------------------------------------------------- */

/* Read the rest of the current frame into the void: a copy of s without
 * an owner stands in for it. */
static void conn_drain(tcp_conn *c, const tcp_slot *s) {
    c->drain = *s;
    c->drain.owner = NULL;
    c->drain.node = (cl_list_node){NULL, NULL};
    c->cur = &c->drain;
}

/* The posted receive this p2p frame from c's peer matches: the first
 * posted (MPI's rule) with its tag, from this peer or from any source. */
static tcp_slot *p2p_slot_take(tcp_conn *c, uint64_t tag) {
    /* a receive that has failed stays linked until its work retires: it
     * must not take a message (which would go into the void) */
    tcp_slot *s, *mine = NULL, *any = NULL;
    cl_list_foreach(&c->p2p_expected, s, tcp_slot, node) if (s->seq == tag && !s->owner->finished) {
        mine = s;
        break;
    }
    cl_list_foreach(&c->tc->any_expected, s, tcp_slot,
                    node) if (s->seq == tag && !s->owner->finished) {
        any = s;
        break;
    }
    if (any && (!mine || any->order < mine->order)) mine = any;
    if (mine) {
        cl_list_remove(&mine->node);
        cl_tcp_p2p_source(mine->owner, c->peer);
    }
    return mine;
}

/* The slot expecting this collective frame: O(1), however many are posted. */
static tcp_slot *coll_slot_take(tcp_conn *c, uint64_t seq, uint32_t step) {
    for (cl_idnode *n = cl_idmap_get(&c->expected, seq); n; n = cl_idmap_next(n)) {
        tcp_slot *s = (tcp_slot *)((char *)n - offsetof(tcp_slot, by_seq));
        if (s->step == step) {
            cl_idmap_remove(&c->expected, n);
            return s;
        }
    }
    return NULL;
}

/* Does frame header h (from `peer`) carry the arguments of tw's post, every
 * one that must agree across ranks (the counts check included)? */
static bool frame_args_agree(const uint8_t *h, const tcp_work *tw, int peer) {
    const collie_coll_args *a = &tw->args;
    uint32_t root = collie_coll_has_root(a->kind) ? (uint32_t)a->root : TCP_NO_ROOT;
    return h[4] == (uint8_t)a->kind && h[5] == (uint8_t)a->dtype &&
           (!collie_coll_count_agrees(a->kind) || get64(h + 24) == a->count) &&
           get32(h + 40) == root && (!collie_coll_reduces(a->kind) || h[6] == (uint8_t)a->op) &&
           get32(h + 44) == cl_tcp_vcheck(tw, peer, false);
}

/* The v collectives' counts in a message: this rank's (h NULL) or, from the
 * frame h, what its sender says (allgatherv: only whether its counts
 * differ, the frame carries their digest). */
static void describe_counts(char *buf, size_t len, const tcp_work *tw, int me, int peer,
                            const uint8_t *h) {
    const collie_coll_args *a = &tw->args;
    buf[0] = '\0';
    if (a->kind == COLLIE_COLL_ALLGATHERV && !h) {
        int n = tw->tc->size, shown = n < 16 ? n : 16;
        size_t at = (size_t)snprintf(buf, len, " with counts {");
        for (int p = 0; p < shown && at < len; p++)
            at += (size_t)snprintf(buf + at, len - at, "%s%zu", p ? ", " : "", a->recvcounts[p]);
        if (at < len) snprintf(buf + at, len - at, "%s}", shown < n ? ", ..." : "");
    } else if (a->kind == COLLIE_COLL_ALLGATHERV) {
        uint32_t theirs = get32(h + 44);
        if (theirs != tw->vdigest)
            snprintf(buf, len, " with other counts (digest %08x, here %08x)", theirs, tw->vdigest);
    } else if (a->kind == COLLIE_COLL_ALLTOALLV && !h) {
        snprintf(buf, len, " (%zu elements to rank %d, %zu from it)", a->sendcounts[peer], peer,
                 a->recvcounts[peer]);
    } else if (a->kind == COLLIE_COLL_ALLTOALLV) {
        size_t es = h[5] < COLLIE_NUM_DTYPES ? cl_dtype_size((collie_dtype)h[5]) : 0;
        uint32_t back = get32(h + 44);
        char sent[32] = "?";
        if (es) snprintf(sent, sizeof sent, "%llu", (unsigned long long)(get64(h + 32) / es));
        snprintf(buf, len, " (%s elements to rank %d, %s%u from it)", sent, me,
                 back == UINT32_MAX ? "at least " : "", back);
    }
}

/* Frame h from c's peer does not agree with tw's post (whose slot s it was
 * to fill, or NULL: tw has none for it): COLLIE_EPROTO naming both ranks
 * and both posts; tw fails with it, the comm faults. */
static void frame_mismatch(tcp_conn *c, const uint8_t *h, tcp_work *tw, const tcp_slot *s) {
    tcp_comm *tc = c->tc;
    const collie_coll_args *a = &tw->args;
    uint32_t mine = collie_coll_has_root(a->kind) ? (uint32_t)a->root : TCP_NO_ROOT;
    uint64_t len = get64(h + 32);
    char ours[512], theirs[512];
    describe_post(ours, sizeof ours, a->kind, a->count, a->dtype, a->op, mine);
    describe_post(theirs, sizeof theirs, h[4], get64(h + 24), h[5], h[6], get32(h + 40));
    /* same arguments (or alltoallv's own counts), a frame of another length */
    bool frame =
        s && len != s->len && (!strcmp(ours, theirs) || !collie_coll_count_agrees(a->kind));
    if (h[4] == (uint8_t)a->kind) { /* the v collectives' counts, on both sides */
        size_t o = strlen(ours), t = strlen(theirs);
        describe_counts(ours + o, sizeof ours - o, tw, tc->rank, c->peer, NULL);
        describe_counts(theirs + t, sizeof theirs - t, tw, tc->rank, c->peer, h);
    }
    if (frame) {
        size_t t = strlen(theirs);
        snprintf(theirs + t, sizeof theirs - t, " in a frame of %llu bytes where %llu were due",
                 (unsigned long long)len, (unsigned long long)s->len);
    }
    tc->core->fault(tc->bc, tw->w, COLLIE_EPROTO,
                    "mismatched collectives at seq %llu: rank %d posted %s, rank %d posted %s",
                    (unsigned long long)get64(h + 16), tc->rank, ours, c->peer, theirs);
}

static void slot_put(tcp_conn *c, tcp_slot *s) {
    s->by_seq.key = s->seq;
    cl_idmap_put(&c->expected, &s->by_seq); /* never fails: the map has buckets */
}

/* What a collective frame counts against the receiver's budget: the whole
 * frame, its header for an announcement, nothing once cleared. */
static uint64_t frame_charge(const uint8_t *h) {
    if (h[7] & TCP_FRAME_CLEARED) return 0;
    if (h[7] & TCP_FRAME_RTS) return TCP_FRAME_HDR;
    return TCP_FRAME_HDR + get64(h + 32);
}

static bool coll_mismatch(tcp_conn *c, const uint8_t *h, const tcp_slot *s);

/* A frame (header h) for a collective this rank finished: every frame for
 * a collective is consumed before it completes, so the ranks posted
 * different things: a comm fault. */
static void coll_late_frame(tcp_conn *c, const uint8_t *h) {
    tcp_comm *tc = c->tc;
    char theirs[96];
    describe_post(theirs, sizeof theirs, h[4], get64(h + 24), h[5], h[6], get32(h + 40));
    tc->core->fault(tc->bc, NULL, COLLIE_EPROTO,
                    "mismatched collectives at seq %llu: rank %d sent a frame of %s, which "
                    "rank %d had already completed without it (the ranks' arguments differ)",
                    (unsigned long long)get64(h + 16), c->peer, theirs, tc->rank);
}

static tcp_parked *park_find(tcp_conn *c, uint64_t seq, uint32_t step) {
    for (cl_idnode *n = cl_idmap_get(&c->parked, seq); n; n = cl_idmap_next(n)) {
        tcp_parked *p = (tcp_parked *)((char *)n - offsetof(tcp_parked, by_seq));
        if (get32(p->hdr + 8) == step) return p;
    }
    return NULL;
}

static void park_free(tcp_conn *c, tcp_parked *p) {
    cl_idmap_remove(&c->parked, &p->by_seq);
    cl_list_remove(&p->node);
    c->parked_bytes -= p->charge;
    free(p);
}

/* The header in c->hdr is for a slot not posted yet (the peer is ahead):
 * park the frame, within the budget the peer was granted (a peer past it
 * broke the protocol). False if c failed. */
static void park_grace_over(tcp_conn *c);

static bool park_begin(tcp_conn *c, uint64_t charge) {
    const uint8_t *h = c->hdr;
    park_grace_over(c);
    uint64_t seq = get64(h + 16);
    uint32_t step = get32(h + 8);
    if (!charge) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO,
                         "rank %d sent a frame (seq %llu step %u) this rank had not asked for",
                         c->peer, (unsigned long long)seq, step);
        return false;
    }
    if (c->parked_bytes + charge > c->tc->early_bytes || park_find(c, seq, step)) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO,
                         "rank %d sent more early collective data than this rank granted it "
                         "(COLLIE_EARLY_BYTES %llu), or a frame twice (seq %llu step %u)",
                         c->peer, (unsigned long long)c->tc->early_bytes, (unsigned long long)seq,
                         step);
        return false;
    }
    tcp_parked *p = malloc(sizeof *p + c->payload_len);
    if (!p) {
        cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory to park a frame from rank %d", c->peer);
        return false;
    }
    memcpy(p->hdr, h, TCP_FRAME_HDR);
    p->charge = charge;
    p->complete = false;
    p->verdict = CL_LOAN_READ;
    p->by_seq.key = seq;
    cl_idmap_put(&c->parked, &p->by_seq); /* never fails: the map has buckets */
    cl_list_push_back(&c->parked_list, &p->node);
    c->parked_bytes += charge;
    c->cur_park = p;
    return true;
}

/* Parked frame p meets its slot s (posted now, or p just completed): check
 * the arguments as a live frame is checked, then hand it over - copy or
 * reduce the payload, or for an announcement ask for the data. */
static void park_deliver(tcp_conn *c, tcp_parked *p, tcp_slot *s) {
    uint64_t seq = get64(p->hdr + 16), charge = p->charge;
    uint32_t step = get32(p->hdr + 8);
    bool rts = p->hdr[7] & TCP_FRAME_RTS;
    if (coll_mismatch(c, p->hdr, s)) {
        park_free(c, p);
        conn_consumed(c, charge);
        return;
    }
    if (rts) {
        park_free(c, p);
        slot_put(c, s);
        conn_consumed(c, charge);
        conn_send_cts(c, seq, step);
        return;
    }
    tcp_work *tw = s->owner;
    const collie_core_services *core = c->tc->core;
    int verdict = p->verdict;
    bool done = false;
    if (verdict == CL_LOAN_READ && core->work_busy_enter(tw->w)) {
        const collie_coll_args *a = &tw->args;
        uint64_t len = s->len;
        if (s->kind == CL_SOP_RECV) {
            if (len) memcpy(s->dst, p->data, len);
        } else {
            size_t es = cl_dtype_size(a->dtype);
            collie_redop op = a->op == COLLIE_AVG ? COLLIE_SUM : a->op;
            if (s->kind == CL_SOP_RECV_REDUCE)
                cl_reduce(s->dst, p->data, len / es, a->dtype, op);
            else
                cl_reduce3(s->dst, p->data, s->src, len / es, a->dtype, op);
        }
        core->work_busy_exit(tw->w);
        done = true;
    }
    park_free(c, p);
    conn_consumed(c, charge);
    if (done)
        cl_tcp_op_done(tw);
    else if (verdict != CL_LOAN_READ && !tw->finished)
        cl_tcp_loan_doom(c, s, verdict);
}

/* A large early frame is not parked at once: its receive is usually posted
 * within moments (a rank a little behind), and then it is read straight
 * into place, as before parking existed (parking it costs an allocation and
 * a copy: a 1 MiB broadcast over TCP took twice as long). Reading pauses
 * for at most PARK_GRACE_US; then it is parked and reading goes on, so
 * what waits behind it (a send/recv) is late by that much at most. */
#define PARK_GRACE_MIN (64u * 1024)
#define PARK_GRACE_US  1000

static bool conn_match(tcp_conn *c);

static void park_grace_expired(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_conn *c = arg;
    c->tc->core->watch_stop(c->grace_ev);
    if (c->state != TCP_CONN_READY || !conn_read_paused(c) || !c->grace_waiting) return;
    c->grace_over = true; /* this header: park it now */
    if (!conn_match(c)) return;
    c->tc->core->watch_start(c->rev, -1);
    c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
}

/* Should the early frame in c->hdr wait (paused) before it is parked? */
static bool park_wait_first(tcp_conn *c) {
    if (c->grace_over || c->payload_len < PARK_GRACE_MIN || (c->hdr[7] & TCP_FRAME_RTS))
        return false;
    const collie_core_services *core = c->tc->core;
    if (!c->grace_ev && !(c->grace_ev = core->watch_new(c->tc->bc, -1, 0, park_grace_expired, c)))
        return false;
    c->grace_waiting = true;
    core->watch_start(c->grace_ev, PARK_GRACE_US);
    return true;
}

/* The header found its slot or is parked: the grace is over. */
static void park_grace_over(tcp_conn *c) {
    if (c->grace_waiting) c->tc->core->watch_stop(c->grace_ev);
    c->grace_waiting = false;
    c->grace_over = false;
}

/* Match the complete header in c->hdr. Returns false to pause reading. */
static bool conn_match(tcp_conn *c) {
    tcp_comm *tc = c->tc;
    const uint8_t *h = c->hdr;
    uint32_t step = get32(h + 8);
    uint64_t seq = get64(h + 16), len = get64(h + 32);
    c->payload_len = len;
    c->payload_got = 0;
    c->stage_fill = 0;
    if (step == TCP_P2P_STEP) {
        tcp_slot *s = p2p_slot_take(c, seq);
        char why[256];
        if (s && !cl_tcp_p2p_matches(h, &s->owner->args, c->peer, s->len, why, sizeof why)) {
            /* the receive fails; the frame goes into the void, never into
             * a buffer sized for something else */
            cl_tcp_work_fail(s->owner, COLLIE_EPROTO, "%s", why);
            conn_drain(c, s);
            return true;
        }
        if (s) {
            c->cur = s;
            return true;
        }
        tcp_unexpected *u = calloc(1, sizeof *u);
        if (u) u->data = malloc(len ? len : 1);
        if (!u || !u->data) {
            free(u);
            cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory for an unexpected message from rank %d",
                             c->peer);
            return false;
        }
        u->tag = seq;
        u->arrival = ++tc->arrivals;
        u->len = len;
        memcpy(u->hdr, h, TCP_FRAME_HDR);
        c->cur_unx = u;
        return true;
    }
    uint8_t fl = h[7];
    uint64_t charge = frame_charge(h);
    if (fl & TCP_FRAME_RTS) c->payload_len = 0; /* announced: no payload now */
    tcp_slot *s = coll_slot_take(c, seq, step);
    if (!s && cl_tcp_coll_finished(tc, seq)) {
        park_grace_over(c);
        coll_late_frame(c, h);
        return false;
    }
    if (!s) {
        /* not posted yet: the peer is ahead. If the collective runs here,
         * the frame must agree with it already (a frame of a step this rank
         * never posts would otherwise wait for the deadline); then park it */
        tcp_work *tw = cl_tcp_coll_running(tc, seq);
        if (tw && !cl_tcp_frame_agrees(c, h, tw)) {
            park_grace_over(c);
            return false;
        }
        if (park_wait_first(c)) return false;
        return park_begin(c, charge);
    }
    park_grace_over(c);
    if (coll_mismatch(c, h, s)) return false;
    conn_consumed(c, charge);
    if (fl & TCP_FRAME_RTS) { /* the slot waits for the data: ask for it */
        slot_put(c, s);
        conn_send_cts(c, seq, step);
        memset(&c->drain, 0, sizeof c->drain); /* the header is all: nothing to fill */
        c->cur = &c->drain;
        return c->state == TCP_CONN_READY;
    }
    c->cur = s;
    return true;
}

/* Does the collective frame header h disagree with slot s (the ranks
 * posted different things)? Then the comm faults (EPROTO naming both). */
static bool coll_mismatch(tcp_conn *c, const uint8_t *h, const tcp_slot *s) {
    if (frame_args_agree(h, s->owner, c->peer) && get64(h + 32) == s->len) return false;
    frame_mismatch(c, h, s->owner, s);
    return true;
}

bool cl_tcp_frame_agrees(tcp_conn *c, const uint8_t *h, tcp_work *tw) {
    if (frame_args_agree(h, tw, c->peer)) return true;
    frame_mismatch(c, h, tw, NULL);
    return false;
}

void cl_tcp_conn_check_early(tcp_conn *c, tcp_work *tw) {
    uint64_t seq = c->tc->core->work_seq(tw->w);
    if (c->state == TCP_CONN_READY && conn_read_paused(c) && get32(c->hdr + 8) != TCP_P2P_STEP &&
        get64(c->hdr + 16) == seq && !cl_tcp_frame_agrees(c, c->hdr, tw))
        return;
    /* the frames parked for it (they came before it was posted here) */
    for (cl_idnode *n = c->parked.count ? cl_idmap_get(&c->parked, seq) : NULL; n;
         n = cl_idmap_next(n)) {
        tcp_parked *p = (tcp_parked *)((char *)n - offsetof(tcp_parked, by_seq));
        if (!cl_tcp_frame_agrees(c, p->hdr, tw)) return; /* one fault says it */
    }
}

bool cl_tcp_p2p_matches(const uint8_t *h, const collie_coll_args *a, int peer, uint64_t want_len,
                        char *why, size_t len) {
    uint64_t count = get64(h + 24), frame = get64(h + 32);
    collie_dtype dt = (collie_dtype)h[5];
    bool same = h[5] == (uint8_t)a->dtype && count == a->count;
    if (same && frame == want_len) return true;
    if (same) /* the arguments agree, the frame does not: a broken peer */
        snprintf(why, len,
                 "rank %d sent a frame of %llu bytes with tag %llu, this recv expects %llu", peer,
                 (unsigned long long)frame, (unsigned long long)get64(h + 16),
                 (unsigned long long)want_len);
    else {
        char from[32]; /* what the receive was posted for: a rank, or any */
        if (a->peer == COLLIE_ANY_SOURCE)
            snprintf(from, sizeof from, "from any source");
        else
            snprintf(from, sizeof from, "from rank %d", a->peer);
        snprintf(why, len, "rank %d sent %llu x %s with tag %llu, this recv (%s) expects %llu x %s",
                 peer, (unsigned long long)count, cl_dtype_name(dt),
                 (unsigned long long)get64(h + 16), from, (unsigned long long)a->count,
                 cl_dtype_name(a->dtype));
    }
    return false;
}

/* Every payload byte read from the link, whatever its destination (a slot,
 * the staging buffer, a park, an unexpected message, the discard area, an
 * ABORT's reason), comes through here: fed to the frame MAC exactly once,
 * as it is read. -1 with errno as cl_tcp_link_recv. */
static ssize_t conn_link_payload(tcp_conn *c, void *buf, size_t len) {
    ssize_t n = cl_tcp_link_recv(c, buf, len);
    if (n > 0 && c->rx_mac && !cl_frame_mac_update(&c->mac_rx, buf, (size_t)n)) {
        errno = EIO;
        return -1;
    }
    return n;
}

/* Payload bytes [off, off + len) of the current frame into buf: from the
 * link, or for a lent payload out of the peer's memory (tcp_loan.c).
 * Bytes, 0 at the end of the stream, or -errno. */
static ssize_t payload_recv(tcp_conn *c, void *buf, uint64_t off, uint64_t len) {
    if (c->loan_frame) return cl_tcp_loan_pull(c, buf, off, len);
    ssize_t n = conn_link_payload(c, buf, len);
    return n < 0 ? -errno : n;
}

/* The rest of a lent payload is not needed (withdrawn, or its work is
 * gone): nothing of it is in the stream, so the frame is complete. */
static ssize_t loan_skip_rest(tcp_conn *c) {
    c->payload_got = c->payload_len;
    return 1;
}

/* Feed payload bytes to the current slot. Returns >0 bytes read, 0 on EOF,
 * <0 (-errno) on error; -EAGAIN when the socket is drained. */
static ssize_t conn_read_payload(tcp_conn *c) {
    tcp_comm *tc = c->tc;
    const collie_core_services *core = tc->core;
    uint64_t left = c->payload_len - c->payload_got;
    if (c->reading_abort) {
        ssize_t n = conn_link_payload(c, c->peer_abort + c->payload_got, left);
        if (n > 0) c->payload_got += (uint64_t)n;
        return n < 0 ? -errno : n;
    }
    if (c->loan_frame) {
        if (c->loan_desc_got < CL_SHM_LOAN_DESC) return cl_tcp_loan_read_desc(c);
        if (c->loan_withdrawn) return loan_skip_rest(c);
    }
    if (c->cur_unx || c->cur_park) {
        uint8_t *buf = c->cur_unx ? c->cur_unx->data : c->cur_park->data;
        ssize_t n = payload_recv(c, buf + c->payload_got, c->payload_got, left);
        if (n > 0) c->payload_got += (uint64_t)n;
        return n;
    }
    tcp_slot *s = c->cur;
    collie_work *w = s->owner ? s->owner->w : NULL;
    bool live = w && core->work_busy_enter(w);
    ssize_t n;
    if (!live) { /* the work is gone: drain into the discard area */
        if (c->loan_frame) {
            c->loan_skipped = true;
            return loan_skip_rest(c);
        }
        /* bytes staged for a reduce were read from the stream already:
         * drain only the rest of the frame, not the next frame's start */
        c->payload_got += c->stage_fill;
        c->stage_fill = 0;
        left = c->payload_len - c->payload_got;
        if (!left) return 1; /* the frame is complete */
        n = conn_link_payload(c, tc->discard, left < TCP_STAGE_BYTES ? left : TCP_STAGE_BYTES);
        if (n > 0) c->payload_got += (uint64_t)n;
        return n < 0 ? -errno : n;
    }
    if (s->kind == CL_SOP_RECV) {
        n = payload_recv(c, s->dst + c->payload_got, c->payload_got, left);
        if (n > 0) c->payload_got += (uint64_t)n;
    } else {
        if (!c->stage && !(c->stage = malloc(TCP_STAGE_BYTES))) {
            core->work_busy_exit(w);
            return -ENOMEM;
        }
        uint64_t chunk = left < TCP_STAGE_BYTES ? left : TCP_STAGE_BYTES;
        n = payload_recv(c, c->stage + c->stage_fill, c->payload_got + c->stage_fill,
                         chunk - c->stage_fill);
        if (n > 0 && !(c->loan_frame && c->loan_withdrawn)) {
            c->stage_fill += (uint64_t)n;
            if (c->stage_fill == chunk) {
                const collie_coll_args *a = &s->owner->args;
                size_t es = cl_dtype_size(a->dtype);
                collie_redop op = a->op == COLLIE_AVG ? COLLIE_SUM : a->op;
                uint8_t *dst = s->dst + c->payload_got;
                if (s->kind == CL_SOP_RECV_REDUCE)
                    cl_reduce(dst, c->stage, chunk / es, a->dtype, op);
                else
                    cl_reduce3(dst, c->stage, s->src + c->payload_got, chunk / es, a->dtype, op);
                c->payload_got += chunk;
                c->stage_fill = 0;
            }
        }
    }
    core->work_busy_exit(w);
    if (c->loan_frame && c->loan_withdrawn) return loan_skip_rest(c);
    return n;
}

static void conn_peer_aborted(tcp_conn *c);

/* Parked frame p is complete: its slot may have been posted while it was
 * read (deliver it now); its collective may have finished without it (the
 * ranks posted different things, as for a frame that arrives then). */
static void park_settle(tcp_conn *c, tcp_parked *p) {
    uint64_t seq = get64(p->hdr + 16);
    tcp_slot *s = coll_slot_take(c, seq, get32(p->hdr + 8));
    if (s) {
        park_deliver(c, p, s);
        return;
    }
    if (!cl_tcp_coll_finished(c->tc, seq)) return;
    uint8_t h[TCP_FRAME_HDR];
    memcpy(h, p->hdr, sizeof h);
    uint64_t charge = p->charge;
    park_free(c, p);
    conn_consumed(c, charge);
    coll_late_frame(c, h);
}

static void conn_message_done(tcp_conn *c) {
    c->frames_read++;
    c->have_hdr = false;
    c->hdr_got = 0;
    if (c->reading_abort) {
        c->reading_abort = false;
        conn_peer_aborted(c);
        return;
    }
    int loan = CL_LOAN_READ;
    if (c->loan_frame) loan = cl_tcp_loan_end(c, !c->loan_skipped);
    if (c->cur_park) {
        tcp_parked *p = c->cur_park;
        c->cur_park = NULL;
        p->complete = true;
        p->verdict = loan; /* a withdrawn payload fails the receive that takes it */
        park_settle(c, p);
        return;
    }
    if (c->cur_unx) {
        tcp_unexpected *u = c->cur_unx;
        c->cur_unx = NULL;
        if (loan == CL_LOAN_READ) {
            cl_list_push_back(&c->unexpected, &u->node);
            /* a receive posted while it was read did not see it: take it now */
            tcp_slot *s = p2p_slot_take(c, u->tag);
            if (s) cl_tcp_p2p_take(s->owner, u, c->peer);
            return;
        }
        /* its send ended before it was read: no receive will ever match it */
        free(u->data);
        free(u);
        return;
    }
    tcp_slot *s = c->cur;
    c->cur = NULL;
    if (!s->owner) return;
    if (loan == CL_LOAN_READ)
        cl_tcp_op_done(s->owner);
    else if (!s->owner->finished)
        cl_tcp_loan_doom(c, s, loan);
}

static void conn_read_handshake(tcp_conn *c) {
    while (c->state == TCP_CONN_HANDSHAKE && c->hs_in_want > 0) {
        ssize_t n = cl_tcp_hs_recv(c, c->hs_in + c->hs_in_len, c->hs_in_want - c->hs_in_len);
        if (n == 0) {
            cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed the connection during the handshake",
                             c->peer);
            return;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            cl_tcp_conn_lost(c, COLLIE_EPEER, "handshake with rank %d: %s", c->peer,
                             strerror(errno));
            return;
        }
        c->hs_in_len += (size_t)n;
        if (c->hs_in_len < c->hs_in_want) continue;
        c->hs_in_want = 0;
        if (!cl_tcp_hs_process(c)) return;
    }
}

/* The peer destroyed its comm. Harmless unless something here still
 * waits for it. */
static void conn_goodbye(tcp_conn *c) {
    cl_tcp_loans_settle(c, false); /* it returned what it read before it left */
    bool needed = c->expected.count || !cl_list_empty(&c->p2p_expected) || c->cur ||
                  conn_sends_pending(c) || !cl_list_empty(&c->lent);
    if (needed) {
        cl_tcp_conn_lost(c, COLLIE_EPEER,
                         "rank %d destroyed its comm while work with it was pending", c->peer);
        return;
    }
    char why[64];
    snprintf(why, sizeof why, "rank %d destroyed its comm", c->peer);
    cl_tcp_conn_close(c, COLLIE_EPEER, why);
}

/* The peer's comm failed and it says why (its ABORT frame, in peer_abort):
 * ours fails with that root cause, in the words of the store's abort
 * notice (comm_ctl.c), whichever of the two arrives first. */
static void conn_peer_aborted(tcp_conn *c) {
    char why[TCP_ABORT_MAX + 64];
    cl_tcp_frame_abort_words(c->peer_abort, c->payload_len, c->peer, why, sizeof why);
    cl_tcp_conn_lost(c, COLLIE_EABORTED, "%s", why);
}

/* A shm link's doorbell rang (or its socket ended): drain it, resume a
 * writer that parked on a full ring, and say whether to read the ring now.
 * While reading is paused (the peer is ahead) the ring is left alone, as a
 * paused TCP socket is; its end is then remembered, and the watch stopped
 * so the loop does not spin on it. */
static bool conn_shm_doorbell(tcp_conn *c) {
    cl_shm_link_drain_doorbell(&c->shm, c->fd);
    if (!c->shm.loans.probed) cl_tcp_loans_probe(c);
    if (!cl_list_empty(&c->lent)) {
        cl_tcp_loans_settle(c, !c->tc->polled); /* the peer returned loans */
        if (c->state != TCP_CONN_READY) return false;
    }
    if (c->shm.writer_wait && !cl_list_empty(&c->sendq)) {
        cl_tcp_conn_flush(c);
        if (c->state != TCP_CONN_READY) return false;
    }
    if (!conn_read_paused(c)) return true;
    if (c->shm.eof) c->tc->core->watch_stop(c->rev);
    return false;
}

static void conn_read_frames(tcp_conn *c, bool shm);

/* Refuse the peer's stream (a frame MAC that is missing or wrong): tell
 * the peer why in an ABORT frame, as last words (it could not tell a
 * refusal from a crash otherwise), close, and fault the comm. */
static void conn_refuse(tcp_conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_refuse(tcp_conn *c, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    conn_end_fault(c, status, true, fmt, ap);
    va_end(ap);
}

/* The frame MAC of the header just read (see the design notes; whether
 * the frame may or must carry a tag was judged by cl_tcp_frame_check): a
 * tagged frame's MAC starts with its number and its header. False if c
 * failed. */
static bool conn_mac_begin(tcp_conn *c) {
    c->rx_mac = false;
    c->rx_tag_got = 0;
    if (!(c->hdr[7] & TCP_FRAME_MAC)) return true;
    if (!cl_frame_mac_begin(&c->mac_rx, c->rx_next) ||
        !cl_frame_mac_update(&c->mac_rx, c->hdr, TCP_FRAME_HDR)) {
        cl_tcp_conn_lost(c, COLLIE_ESYSTEM, "no frame MAC for rank %d (libcrypto)", c->peer);
        return false;
    }
    c->rx_mac = true;
    return true;
}

/* Read the tag after a tagged frame and check it; only then is the frame
 * acted on. True once it is good; false to stop reading (no bytes now, or
 * c failed: a bad tag means the stream was altered). */
static bool conn_read_tag(tcp_conn *c) {
    while (c->rx_tag_got < CL_FRAME_MAC_TAG) { /* at most 16 reads */
        ssize_t n =
            cl_tcp_link_recv(c, c->rx_tag + c->rx_tag_got, CL_FRAME_MAC_TAG - c->rx_tag_got);
        if (n == 0) {
            cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed its connection", c->peer);
            return false;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) conn_link_failed(c, errno, "receive from");
            return false;
        }
        c->rx_tag_got += (size_t)n;
    }
    if (!cl_frame_mac_check(&c->mac_rx, c->rx_tag)) {
        conn_refuse(c, COLLIE_EAUTH,
                    "frame %llu from rank %d failed its MAC: the stream was altered "
                    "(a frame changed, dropped, replayed or injected on the way)",
                    (unsigned long long)c->rx_next, c->peer);
        return false;
    }
    c->rx_next++;
    c->rx_mac = false;
    c->rx_tag_got = 0;
    return true;
}

void cl_tcp_conn_on_read(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_conn *c = arg;
    if (c->state == TCP_CONN_HANDSHAKE) {
        conn_read_handshake(c);
        return;
    }
    bool shm = cl_tcp_link_is_shm(c);
    if (shm && !conn_shm_doorbell(c)) return;
    conn_read_frames(c, shm);
}

/* Read and handle frames while there are bytes, at most 64 reads, so one
 * busy peer cannot starve the others. */
static void conn_read_frames(tcp_conn *c, bool shm) {
    int iter;
    for (iter = 0; iter < 64 && c->state == TCP_CONN_READY; iter++) {
        if (c->rx_ctl) goto frame_end; /* its tag was not all there */
        if (!c->have_hdr) {
            ssize_t n = cl_tcp_link_recv(c, c->hdr + c->hdr_got, TCP_FRAME_HDR - c->hdr_got);
            if (n == 0) {
                cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed its connection", c->peer);
                return;
            }
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR) return;
                conn_link_failed(c, errno, "receive from");
                return;
            }
            c->hdr_got += (size_t)n;
            if (c->hdr_got < TCP_FRAME_HDR) continue;
            /* everything the header alone says is judged in frame.c */
            cl_tcp_frame_rx rx = {.peer = c->peer,
                                  .generation = (uint32_t)c->tc->generation,
                                  .shm = shm,
                                  .mac_keyed = c->mac_keyed,
                                  .mac_required = c->mac_keyed && c->tc->frame_mac};
            cl_tcp_frame f;
            char why[400];
            int rc = cl_tcp_frame_check(c->hdr, &rx, &f, why, sizeof why);
            if (rc == COLLIE_EAUTH) { /* refused: the peer is told why */
                conn_refuse(c, COLLIE_EAUTH, "%s", why);
                return;
            }
            if (rc != COLLIE_OK) {
                cl_tcp_conn_lost(c, COLLIE_EPROTO, "%s", why);
                return;
            }
            if (!conn_mac_begin(c)) return;
            if (cl_tcp_frame_kind_ctl(c->hdr[4])) {
                c->rx_ctl = true; /* acted on once its tag is checked */
                goto frame_end;
            }
            if (c->hdr[7] & TCP_FRAME_LOAN) cl_tcp_loan_begin(c);
            c->have_hdr = true;
            if (c->hdr[4] == TCP_KIND_ABORT) { /* its reason follows */
                c->reading_abort = true;
                c->payload_len = f.length; /* at most TCP_ABORT_MAX (checked) */
                c->payload_got = 0;
                if (!c->peer_abort && !(c->peer_abort = malloc(TCP_ABORT_MAX + 1))) {
                    cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory for rank %d's last words",
                                     c->peer);
                    return;
                }
            } else if (!conn_match(c)) {
                /* paused; a shm link keeps its doorbell watched (a parked writer) */
                if (c->state == TCP_CONN_READY && !shm) c->tc->core->watch_stop(c->rev);
                return;
            }
        }
        if (c->payload_got < c->payload_len) {
            ssize_t n = conn_read_payload(c);
            if (n == 0) {
                cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed its connection", c->peer);
                return;
            }
            if (n < 0) {
                if (n == -EAGAIN || n == -EINTR) return;
                if (n == -EPROTO && !c->shm.rx.corrupt)
                    cl_tcp_conn_lost(c, COLLIE_EPROTO, "rank %d sent a malformed loan", c->peer);
                else if (n == -EPROTO)
                    conn_link_failed(c, EPROTO, "receive from");
                else
                    cl_tcp_conn_lost(c, COLLIE_EPEER, "receive from rank %d failed: %s%s", c->peer,
                                     strerror((int)-n),
                                     c->loan_frame ? " (reading its memory: single copy)" : "");
                return;
            }
            if (c->loan_frame) iter += (int)(n >> 20); /* a MiB pulled counts as a read */
            if (c->payload_got < c->payload_len) continue;
        }
    frame_end:
        if (c->rx_mac && !conn_read_tag(c)) return;
        if (c->rx_ctl) {
            c->rx_ctl = false;
            c->hdr_got = 0;
            c->frames_read++;
            uint8_t kind = c->hdr[4];
            if (kind == TCP_KIND_BYE) {
                conn_goodbye(c);
                return;
            }
            if (kind == TCP_KIND_CREDIT)
                conn_on_credit(c);
            else if (kind == TCP_KIND_CTS)
                conn_on_cts(c);
            else
                conn_on_gone(c);
            continue;
        }
        conn_message_done(c);
    }
    /* the bound cut a shm link short: no doorbell comes for bytes already
     * there, so come back on the next turn of the loop */
    if (shm && iter >= 64 && c->state == TCP_CONN_READY)
        c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
}

/* A polling step of a ready shm connection (no doorbell involved): send
 * what is queued, read the frames that are there. Before the
 * loop sleeps, park the reader so the peer rings from now on (or read at
 * once if bytes came as it parked). A paused reader is resumed by
 * cl_tcp_conn_expect, as on TCP. */
void cl_tcp_conn_poll(tcp_conn *c, bool sleeping) {
    if (c->state != TCP_CONN_READY || !cl_tcp_link_is_shm(c)) return;
    if (!c->shm.loans.probed) cl_tcp_loans_probe(c);
    if (!cl_list_empty(&c->lent)) {
        cl_tcp_loans_settle(c, sleeping);
        if (c->state != TCP_CONN_READY) return;
    }
    /* a flush scheduled for the end of the callback (cl_tcp_conn_send), or
     * a writer that waits for room that has come */
    if (c->flush_scheduled ||
        (c->shm.writer_wait && !cl_list_empty(&c->sendq) && cl_shm_ring_writable(&c->shm.tx) > 0)) {
        cl_tcp_conn_flush(c);
        if (c->state != TCP_CONN_READY) return;
    }
    if (conn_read_paused(c)) return;
    if (sleeping) {
        if (!cl_shm_ring_reader_park(&c->shm.rx))
            c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
        return;
    }
    if (cl_shm_link_readable(&c->shm)) conn_read_frames(c, true);
}

void cl_tcp_conn_expect(tcp_conn *c, tcp_slot *s) {
    if (s->step == TCP_P2P_STEP) {
        cl_list_push_back(&c->p2p_expected, &s->node);
    } else {
        tcp_parked *p = c->parked.count ? park_find(c, s->seq, s->step) : NULL;
        if (p && p->complete) { /* the peer was ahead: its frame is here */
            park_deliver(c, p, s);
            return;
        }
        slot_put(c, s); /* (a frame being parked meets it when complete) */
    }
    /* a header waiting for exactly this slot: resume reading */
    if (c->state == TCP_CONN_READY && conn_read_paused(c) && get32(c->hdr + 8) == s->step &&
        get64(c->hdr + 16) == s->seq) {
        if (!conn_match(c)) return;
        c->tc->core->watch_start(c->rev, -1);
        c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
    }
}

void cl_tcp_conn_recheck(tcp_conn *c, uint64_t seq, bool ok) {
    if (c->state == TCP_CONN_READY && conn_read_paused(c) && get32(c->hdr + 8) != TCP_P2P_STEP &&
        get64(c->hdr + 16) == seq)
        conn_match(c); /* finds seq finished: a comm fault */
    /* frames parked for it: never taken. A collective that completed did
     * not need them (a mismatch); one that ended early leaves them unread */
    cl_idnode *n;
    while (c->parked.count && (n = cl_idmap_get(&c->parked, seq))) {
        tcp_parked *p = (tcp_parked *)((char *)n - offsetof(tcp_parked, by_seq));
        if (!p->complete) return; /* being read: settled once complete */
        uint8_t h[TCP_FRAME_HDR];
        memcpy(h, p->hdr, sizeof h);
        uint64_t charge = p->charge;
        park_free(c, p);
        conn_consumed(c, charge);
        if (ok) {
            coll_late_frame(c, h);
            return;
        }
    }
}

bool cl_tcp_conn_has_parked(tcp_conn *c, uint64_t seq, uint32_t step) {
    tcp_parked *p = c && c->parked.count ? park_find(c, seq, step) : NULL;
    return p && p->complete && !(p->hdr[7] & TCP_FRAME_RTS);
}

/* One message or receive slot of a work that is ending (its memory is
 * about to be freed): unlinked in O(1). A message already partly on the
 * wire cannot be finished (its payload is the user's, no longer ours to
 * read), so the byte stream is broken: the connection stops sending, but
 * stays open until the comm's delayed close (see the design notes). The
 * comm is failing in that case anyway (a work ends early only by deadline,
 * cancel or abort), NONE excepted. A slot being filled is drained into the
 * void. c may be NULL (no connection to that peer any more). */
void cl_tcp_conn_forget_msg(tcp_conn *c, tcp_msg *m) {
    if (m->loan_ticket) cl_tcp_loan_forget(m); /* withdrawn already by the unlend hook */
    if (!cl_list_linked(&m->node)) return;
    cl_list_remove(&m->node);
    if (c) conn_refund(c, m); /* never written: its credit is free again */
    /* a whole frame (a loan that waited for its return, an announcement
     * waiting for its CTS) leaves the stream intact */
    if (m->sent > 0 && m->sent < tcp_msg_frame_len(m) && c) cl_tcp_conn_break_send(c, m);
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

void cl_tcp_conn_forget_slot(tcp_conn *c, tcp_slot *s) {
    if (s->step == TCP_P2P_STEP)
        cl_list_remove(&s->node);
    else if (c)
        cl_idmap_remove(&c->expected, &s->by_seq);
    if (c && c->cur == s) conn_drain(c, s); /* the slot itself is the work's memory */
}
