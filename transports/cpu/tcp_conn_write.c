/*
 * tcp_conn_write.c — the send side of a connection: frame headers, the
 * send queue, flow control of collective frames (credit, RTS/CTS), and the
 * flush that writes queued frames straight from user memory.
 *
 * Design notes
 *  - Sends use writev (sendmsg) straight from the user's buffer, up to
 *    FLUSH_BATCH frames per call; a flush is scheduled for the end of the
 *    current callback, so messages queued by several works meanwhile leave
 *    together. Finishing a message may make its work queue more on this
 *    connection: the same flush picks them up.
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
 *  - Frame MAC, the sender's side (when a link uses it: tcp_conn.c): every
 *    frame carries TCP_FRAME_MAC and a 16-byte tag after its body,
 *    numbered in its direction from 0. Flush tags each frame not started
 *    yet with tx_next + k (k-th of the batch) under its work's BUSY
 *    bracket, the tag a third iovec; a frame whose first byte is written
 *    spends its number (tx_next++, in order), so a frame dropped before
 *    that takes none and the numbers have no gaps; a tag is remade when
 *    its frame's number or header changed (requeued, a CREDIT topped up, a
 *    control frame queued ahead). A batch stops taking unstarted frames at
 *    FLUSH_MAC_BYTES of tagged body. ABORT/BYE, written directly
 *    (tcp_conn.c), take tx_next at a frame boundary.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "transports/cpu/cpu.h"
#include "transports/cpu/tcp_conn_impl.h"

/* ---- frames and the queue ---------------------------------------------------------- */

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

/* Flush once the current callback is done: messages queued by several
 * works meanwhile leave in one sendmsg. */
static void conn_want_flush(tcp_conn *c) {
    if (c->state == TCP_CONN_READY && !c->flush_scheduled) {
        c->flush_scheduled = true;
        c->tc->core->watch_activate(c->wev, COLLIE_WATCH_WRITE);
    }
}

static bool conn_is_coll_frame(const tcp_msg *m) {
    return !m->ctl && get32(m->hdr + 8) != TCP_P2P_STEP;
}

/* ---- flow control of collective frames (see the design notes) ------------------------- */

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

void cl_tcp_conn_heartbeat(tcp_conn *c) {
    bool idle = !c->tx_recent;
    c->tx_recent = false;
    if (!idle || c->state != TCP_CONN_READY || c->send_broken || cl_list_linked(&c->hb_msg.node))
        return; /* it spoke, cannot, or one waits to go (the link is full) */
    collie_coll_args a = {.kind = (collie_coll_kind)TCP_KIND_HEARTBEAT};
    cl_tcp_frame_header(c->hb_msg.hdr, c->tc, &a, 0, 0, 0);
    conn_queue_ctl(c, &c->hb_msg);
}

void cl_tcp_conn_send_cts(tcp_conn *c, uint64_t seq, uint32_t step) {
    conn_send_ctl(c, TCP_KIND_CTS, seq, step);
}

/* The peer's CREDIT frame: credit back, and its window. */
void cl_tcp_conn_on_credit(tcp_conn *c) {
    c->credit += get64(c->hdr + 24);
    c->window = get32(c->hdr + 40);
    conn_release_held(c);
}

/* The peer's CTS: the frame it announced may go now (uncharged). Unknown
 * (seq, step): its work ended meanwhile, so it never comes: say so (GONE),
 * the receive fails as for a withdrawn loan. */
void cl_tcp_conn_on_cts(tcp_conn *c) {
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

/* Return what we owe the peer once it is a quarter of our budget (or
 * `now`: the first grant), in one CREDIT frame; one that is queued but not
 * started takes the new amount too. */
void cl_tcp_conn_send_credit(tcp_conn *c, bool now) {
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
void cl_tcp_conn_consumed(tcp_conn *c, uint64_t charge) {
    if (!charge) return;
    c->owed += charge;
    cl_tcp_conn_send_credit(c, false);
}

/* Does the send side hold a work's message not written whole yet (control
 * frames do not count)? */
bool cl_tcp_conn_sends_pending(const tcp_conn *c) {
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

/* ---- broken sending (see the design notes) ------------------------------------------ */

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

/* ---- flushing ------------------------------------------------------------------------ */

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

/* What a step of the flush says: go on, wait for the link to take more
 * (the write watch, or a shm peer's doorbell), or stop (c failed or its
 * sending broke); flush_enter also ends a batch early. */
enum { FLUSH_ON, FLUSH_WANT_WRITE, FLUSH_STOP, FLUSH_END_BATCH };

/* One sendmsg's worth of the queue's head: the messages, the works whose
 * memory it reads (each inside its BUSY bracket once) and the iovecs. */
typedef struct flush_batch {
    tcp_msg *msgs[FLUSH_BATCH];
    collie_work *entered[FLUSH_BATCH];
    struct iovec iov[3 * FLUSH_BATCH];
    int nb, ne, niov;
} flush_batch;

static void flush_exit_all(tcp_conn *c, flush_batch *b) {
    for (int i = 0; i < b->ne; i++)
        c->tc->core->work_busy_exit(b->entered[i]);
}

/* The handshake bytes go first. */
static int flush_handshake(tcp_conn *c) {
    while (c->hs_out_sent < c->hs_out_len) {
        ssize_t n = cl_tcp_hs_send(c, c->hs_out + c->hs_out_sent, c->hs_out_len - c->hs_out_sent);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return FLUSH_WANT_WRITE;
            cl_tcp_conn_lost(c, COLLIE_EPEER, "handshake send to rank %d: %s", c->peer,
                             strerror(errno));
            return FLUSH_STOP;
        }
        c->hs_out_sent += (size_t)n;
    }
    return FLUSH_ON;
}

/* m has a payload, the work's memory: bracket it (once per work and
 * batch). FLUSH_ON if m may go; FLUSH_END_BATCH to end the batch here
 * (send what it has, m next time; or m was dropped: its work is being
 * finished, by deadline or cancel, and its detach frees it); FLUSH_STOP if
 * m was cut mid-way (the stream is broken). */
static int flush_enter(tcp_conn *c, flush_batch *b, tcp_msg *m) {
    collie_work *w = m->owner->w;
    for (int i = 0; i < b->ne; i++)
        if (b->entered[i] == w) return FLUSH_ON;
    if (c->tc->core->work_busy_enter(w)) {
        b->entered[b->ne++] = w;
        return FLUSH_ON;
    }
    if (b->nb > 0) return FLUSH_END_BATCH; /* send what we have; this one next time */
    /* the work is being finished (deadline, cancel): its detach will drop
     * this message; do not touch it */
    if (m->sent > 0) {
        cl_tcp_conn_break_send(c, m);
        return FLUSH_STOP;
    }
    cl_list_remove(&m->node);
    conn_refund(c, m);
    return FLUSH_END_BATCH;
}

/* A large payload to a same-host peer: lend it instead (under the bracket:
 * the unlend hook sees the loan). Tickets must reach the peer in order:
 * one that may be lent but was not (no slot now) may be lent by a later
 * batch, so none after it is lent in this one (a batch is always the head
 * of the queue: it comes first again). */
static void flush_lend(tcp_conn *c, tcp_msg *m, bool *lend_stop, int *lent) {
    if (m->sent == 0 && !m->loan_ticket && !(m->hdr[7] & TCP_FRAME_RTS) &&
        (!conn_is_coll_frame(m) || (m->hdr[7] & TCP_FRAME_CLEARED)) && cl_tcp_loan_may(c, m) &&
        !*lend_stop) {
        if (cl_tcp_loan_open(c, m))
            (*lent)++;
        else
            *lend_stop = true;
    }
}

/* m's unwritten rest as iovecs: header, body (payload or loan
 * descriptor), MAC tag. */
static void flush_iov(flush_batch *b, tcp_msg *m) {
    if (m->sent < TCP_FRAME_HDR) {
        b->iov[b->niov].iov_base = m->hdr + m->sent;
        b->iov[b->niov++].iov_len = TCP_FRAME_HDR - m->sent;
    }
    const uint8_t *body = m->loan_ticket ? m->loan : m->payload;
    uint64_t blen = tcp_msg_body_len(m);
    uint64_t poff = m->sent > TCP_FRAME_HDR ? m->sent - TCP_FRAME_HDR : 0;
    if (blen > poff) {
        b->iov[b->niov].iov_base = (void *)(body + poff);
        b->iov[b->niov++].iov_len = blen - poff;
    }
    uint64_t toff = m->sent > TCP_FRAME_HDR + blen ? m->sent - TCP_FRAME_HDR - blen : 0;
    if ((m->hdr[7] & TCP_FRAME_MAC) && toff < CL_FRAME_MAC_TAG) {
        b->iov[b->niov].iov_base = m->tag + toff;
        b->iov[b->niov++].iov_len = CL_FRAME_MAC_TAG - toff;
    }
}

/* Gather the head of the queue into b: up to FLUSH_BATCH messages, each
 * bracketed, lent or tagged as it needs. FLUSH_STOP if c failed (b's
 * brackets are then closed). */
static int flush_gather(tcp_conn *c, flush_batch *b, int *lent) {
    uint64_t number = c->tx_next, tagged_bytes = 0; /* frames started get numbers in order */
    bool lend_stop = false; /* a message that may be lent was not: lend none after it */
    tcp_msg *m;
    cl_list_foreach(&c->sendq, m, tcp_msg, node) {
        if (b->nb == FLUSH_BATCH) break;
        if (c->mac_tx_on && b->nb > 0 && tagged_bytes >= FLUSH_MAC_BYTES) break;
        if (m->len > 0) {
            int st = flush_enter(c, b, m);
            if (st == FLUSH_STOP) return FLUSH_STOP;
            if (st == FLUSH_END_BATCH) break;
            flush_lend(c, m, &lend_stop, lent);
        }
        if (c->mac_tx_on && m->sent == 0) {
            if (!conn_tag(c, m, number++)) {
                flush_exit_all(c, b);
                cl_tcp_conn_lost(c, COLLIE_ESYSTEM, "no frame MAC for rank %d (libcrypto)",
                                 c->peer);
                return FLUSH_STOP;
            }
            tagged_bytes += tcp_msg_body_len(m);
        }
        flush_iov(b, m);
        b->msgs[b->nb++] = m;
    }
    return FLUSH_ON;
}

/* n bytes of batch b went out: account them in order; unlink the finished
 * messages first, then report them (reporting may queue more or close c). */
static int flush_account(tcp_conn *c, flush_batch *b, uint64_t left) {
    tcp_work *done[FLUSH_BATCH];
    int nd = 0, nfull = 0;
    bool credit_sent = false;
    for (int i = 0; i < b->nb; i++) {
        tcp_msg *m = b->msgs[i];
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
        else if (m->ctl == TCP_CTL_HEARTBEAT)
            continue;                       /* the peer heard us: nothing else to do */
        else if (m->hdr[7] & TCP_FRAME_RTS) /* its data goes on the peer's CTS */
            cl_list_push_back(&c->rts_wait, &m->node);
        else if (m->loan_ticket) /* done when the peer has read it */
            cl_list_push_back(&c->lent, &m->node);
        else
            done[nd++] = m->owner;
    }
    bool partial = nfull < b->nb;
    if (credit_sent) cl_tcp_conn_send_credit(c, false); /* owed meanwhile */
    for (int i = 0; i < nd; i++)
        cl_tcp_op_done(done[i]);
    if (c->state != TCP_CONN_READY) return FLUSH_STOP; /* closed by a fault */
    return partial ? FLUSH_WANT_WRITE : FLUSH_ON;
}

/* One batch: gather, write in one sendmsg, account. */
static int flush_batch_once(tcp_conn *c, int *lent) {
    flush_batch b;
    b.nb = b.ne = b.niov = 0;
    int st = flush_gather(c, &b, lent);
    if (st != FLUSH_ON || b.nb == 0) return st; /* none: a dropped message, look again */
    ssize_t n = cl_tcp_link_writev(c, b.iov, b.niov, false);
    flush_exit_all(c, &b);
    if (n > 0) c->tx_recent = true; /* no heartbeat needed at the next tick */
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return FLUSH_WANT_WRITE;
        int err = errno;
        cl_tcp_conn_read_last_words(c);
        if (c->state == TCP_CONN_READY) cl_tcp_conn_link_failed(c, err, "send to");
        return FLUSH_STOP;
    }
    return flush_account(c, &b, (uint64_t)n);
}

/* The link is full: wait for it. A full ring parked the writer: the
 * reader's doorbell, on the read watch, resumes it (the Unix socket is
 * always writable: watching for that would spin). */
static void flush_want_write(tcp_conn *c) {
    if (!cl_tcp_link_is_shm(c))
        c->tc->core->watch_start(c->wev, -1);
    else if (!c->shm.writer_wait) /* room came as it parked: go on next turn */
        c->tc->core->watch_activate(c->wev, COLLIE_WATCH_WRITE);
    c->flush_scheduled = false;
}

/* Write the handshake bytes, then queued messages, until the socket is
 * full. Up to FLUSH_BATCH messages go out in one sendmsg (header and
 * payload straight from the user's memory). Completing a message may make
 * its work post more messages to this connection: they are appended and
 * picked up by this same loop. */
void cl_tcp_conn_flush(tcp_conn *c) {
    int lent = 0; /* messages lent now */
    c->flush_scheduled = false;
    c->shm.writer_wait = false;
    int st = flush_handshake(c);
    if (st == FLUSH_STOP) return;
    if (st == FLUSH_ON && (c->state != TCP_CONN_READY || c->send_broken)) {
        c->tc->core->watch_stop(c->wev);
        if (c->send_broken) conn_fail_queued(c); /* the next slice, if any */
        return;
    }
    while (st == FLUSH_ON && !cl_list_empty(&c->sendq))
        st = flush_batch_once(c, &lent);
    if (st == FLUSH_STOP) return;
    if (st == FLUSH_ON) {
        c->tc->core->watch_stop(c->wev); /* also cancels an activation made meanwhile: */
        c->flush_scheduled = false;      /* this flush covered it */
    } else {
        flush_want_write(c);
    }
    if (lent) cl_tcp_loans_settle(c, !c->tc->polled); /* a loop that may sleep hears returns */
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
            cl_tcp_conn_peer_gone(c, COLLIE_PEER_SUSPECTED); /* unreachable, not known dead */
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
