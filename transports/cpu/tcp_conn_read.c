/*
 * tcp_conn_read.c — the receive side of a connection: reading frames off
 * the link (header, payload, MAC tag) and handing each one on, complete,
 * to its receive, its park, its unexpected message or the control frame it
 * is; the shm link's doorbell and polling step.
 *
 * Design notes
 *  - Every frame byte comes through cl_tcp_link_recv. A header is judged
 *    whole (frame.c) before anything else reads it, then matched
 *    (tcp_conn_match.c), which may pause reading: the header waits, the
 *    link is left alone (a paused TCP socket's read watch is stopped, a
 *    shm ring's doorbell still watched for a parked writer) until its
 *    receive is posted or it is parked.
 *  - Payloads are read straight into their destination, or through this
 *    connection's staging buffer when the data is reduced on arrival (a
 *    chunk at a time, under the work's BUSY bracket); a lent payload is
 *    pulled out of the peer's memory instead (tcp_loan.c). The payload of
 *    a work that ended meanwhile goes to the discard area.
 *  - Frame MAC, the receiver's side (when a link uses it: tcp_conn.c): at
 *    a header,
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
 *  - A peer's last words (an ABORT frame, tcp_conn.c) fail this comm with
 *    its root cause; its BYE closes quietly unless work with it is
 *    pending.
 *  - One read callback reads at most 64 times (a MiB pulled from a lent
 *    payload counts as one), so one busy peer cannot starve the others; a
 *    shm link cut short by the bound comes back on the next loop turn (no
 *    doorbell rings for bytes already there).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/reduce.h"
#include "transports/cpu/cpu.h"
#include "transports/cpu/tcp_conn_impl.h"

/* ---- payloads ------------------------------------------------------------------------ */

/* Read the rest of the current frame into the void: a copy of s without
 * an owner stands in for it. */
void cl_tcp_conn_drain(tcp_conn *c, const tcp_slot *s) {
    c->drain = *s;
    c->drain.owner = NULL;
    c->drain.node = (cl_list_node){NULL, NULL};
    c->cur = &c->drain;
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

/* ---- complete frames ----------------------------------------------------------------- */

/* The peer's comm failed and it says why (its ABORT frame, in peer_abort):
 * ours fails with that root cause, in the words of the store's abort
 * notice (comm_ctl.c), whichever of the two arrives first. */
static void conn_peer_aborted(tcp_conn *c) {
    char why[TCP_ABORT_MAX + 64];
    cl_tcp_frame_abort_words(c->peer_abort, c->payload_len, c->peer, why, sizeof why);
    cl_tcp_conn_peer_gone(c, COLLIE_PEER_ALIVE); /* it aborted, and lives */
    cl_tcp_conn_lost(c, COLLIE_EABORTED, "%s", why);
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
        cl_tcp_conn_park_settle(c, p);
        return;
    }
    if (c->cur_unx) {
        tcp_unexpected *u = c->cur_unx;
        c->cur_unx = NULL;
        if (loan == CL_LOAN_READ) {
            cl_list_push_back(&c->unexpected, &u->node);
            /* a receive posted while it was read did not see it: take it now */
            tcp_slot *s = cl_tcp_conn_p2p_slot_take(c, u->tag);
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

/* The peer destroyed its comm. Harmless unless something here still
 * waits for it. */
static void conn_goodbye(tcp_conn *c) {
    cl_tcp_conn_peer_gone(c, COLLIE_PEER_LEFT);
    cl_tcp_loans_settle(c, false); /* it returned what it read before it left */
    bool needed = c->expected.count || !cl_list_empty(&c->p2p_expected) || c->cur ||
                  cl_tcp_conn_sends_pending(c) || !cl_list_empty(&c->lent);
    if (needed) {
        cl_tcp_conn_lost(c, COLLIE_EPEER,
                         "rank %d destroyed its comm while work with it was pending", c->peer);
        return;
    }
    char why[64];
    snprintf(why, sizeof why, "rank %d destroyed its comm", c->peer);
    cl_tcp_conn_close(c, COLLIE_EPEER, why);
}

/* ---- the frame MAC (see the design notes) --------------------------------------------- */

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
            cl_tcp_conn_peer_gone(c, COLLIE_PEER_DEAD);
            cl_tcp_conn_peer_gone(c, COLLIE_PEER_DEAD);
            cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed its connection", c->peer);
            return false;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                cl_tcp_conn_link_failed(c, errno, "receive from");
            return false;
        }
        c->rx_tag_got += (size_t)n;
    }
    if (!cl_frame_mac_check(&c->mac_rx, c->rx_tag)) {
        cl_tcp_conn_refuse(c, COLLIE_EAUTH,
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

/* ---- reading ------------------------------------------------------------------------- */

static void conn_read_handshake(tcp_conn *c) {
    while (c->state == TCP_CONN_HANDSHAKE && c->hs_in_want > 0) {
        ssize_t n = cl_tcp_hs_recv(c, c->hs_in + c->hs_in_len, c->hs_in_want - c->hs_in_len);
        if (n == 0) {
            cl_tcp_conn_peer_gone(c, COLLIE_PEER_DEAD);
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
    if (!cl_tcp_conn_read_paused(c)) return true;
    if (c->shm.eof) c->tc->core->watch_stop(c->rev);
    return false;
}

/* What a step of reading says: go on with this frame, read again (bytes
 * missing), stop (nothing more now, paused, or c failed), or a control
 * frame's header is in (no payload: its tag, then act on it). */
enum { READ_ON, READ_AGAIN, READ_STOP, READ_CTL };

/* A complete header, judged by frame.c (everything the header alone
 * says); the frame MAC starts with it. False if c failed. */
static bool read_header_judged(tcp_conn *c, bool shm, cl_tcp_frame *f) {
    cl_tcp_frame_rx rx = {.peer = c->peer,
                          .generation = (uint32_t)c->tc->generation,
                          .shm = shm,
                          .mac_keyed = c->mac_keyed,
                          .mac_required = c->mac_keyed && c->tc->frame_mac};
    char why[400];
    int rc = cl_tcp_frame_check(c->hdr, &rx, f, why, sizeof why);
    if (rc == COLLIE_EAUTH) { /* refused: the peer is told why */
        cl_tcp_conn_refuse(c, COLLIE_EAUTH, "%s", why);
        return false;
    }
    if (rc != COLLIE_OK) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO, "%s", why);
        return false;
    }
    if (f->kind < COLLIE_COLL_NUM_KINDS && f->kind != COLLIE_COLL_SEND &&
        f->kind != COLLIE_COLL_RECV && f->seq > c->heard_seq)
        c->heard_seq = f->seq; /* the peer reached it (peer health) */
    return conn_mac_begin(c);
}

/* Read the header; once whole, judge it and say where its payload goes:
 * an ABORT's reason, or what matching gives it (tcp_conn_match.c). */
static int read_header(tcp_conn *c, bool shm) {
    ssize_t n = cl_tcp_link_recv(c, c->hdr + c->hdr_got, TCP_FRAME_HDR - c->hdr_got);
    if (n == 0) {
        cl_tcp_conn_peer_gone(c, COLLIE_PEER_DEAD);
        cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed its connection", c->peer);
        return READ_STOP;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) cl_tcp_conn_link_failed(c, errno, "receive from");
        return READ_STOP;
    }
    c->hdr_got += (size_t)n;
    if (c->hdr_got < TCP_FRAME_HDR) return READ_AGAIN;
    cl_tcp_frame f;
    if (!read_header_judged(c, shm, &f)) return READ_STOP;
    if (cl_tcp_frame_kind_ctl(c->hdr[4])) {
        c->rx_ctl = true; /* acted on once its tag is checked */
        return READ_CTL;
    }
    if (c->hdr[7] & TCP_FRAME_LOAN) cl_tcp_loan_begin(c);
    c->have_hdr = true;
    if (c->hdr[4] == TCP_KIND_ABORT) { /* its reason follows */
        c->reading_abort = true;
        c->payload_len = f.length; /* at most TCP_ABORT_MAX (checked) */
        c->payload_got = 0;
        if (!c->peer_abort && !(c->peer_abort = malloc(TCP_ABORT_MAX + 1))) {
            cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory for rank %d's last words", c->peer);
            return READ_STOP;
        }
        return READ_ON;
    }
    if (cl_tcp_conn_match(c)) return READ_ON;
    /* paused; a shm link keeps its doorbell watched (a parked writer) */
    if (c->state == TCP_CONN_READY && !shm) c->tc->core->watch_stop(c->rev);
    return READ_STOP;
}

/* Read payload bytes of the current frame. A MiB pulled from a lent
 * payload counts as one more read (*iter). */
static int read_payload_step(tcp_conn *c, int *iter) {
    ssize_t n = conn_read_payload(c);
    if (n == 0) {
        cl_tcp_conn_peer_gone(c, COLLIE_PEER_DEAD);
        cl_tcp_conn_lost(c, COLLIE_EPEER, "rank %d closed its connection", c->peer);
        return READ_STOP;
    }
    if (n < 0) {
        if (n == -EAGAIN || n == -EINTR) return READ_STOP;
        if (n == -EPROTO && !c->shm.rx.corrupt)
            cl_tcp_conn_lost(c, COLLIE_EPROTO, "rank %d sent a malformed loan", c->peer);
        else if (n == -EPROTO)
            cl_tcp_conn_link_failed(c, EPROTO, "receive from");
        else {
            /* reading a lent payload out of a process that is gone: ESRCH
             * is its death, said with the rank (fault data), not text only */
            if (n == -ESRCH) cl_tcp_conn_peer_gone(c, COLLIE_PEER_DEAD);
            cl_tcp_conn_lost(c, COLLIE_EPEER, "receive from rank %d failed: %s%s", c->peer,
                             strerror((int)-n),
                             c->loan_frame ? " (reading its memory: single copy)" : "");
        }
        return READ_STOP;
    }
    if (c->loan_frame) *iter += (int)(n >> 20); /* a MiB pulled counts as a read */
    return c->payload_got < c->payload_len ? READ_AGAIN : READ_ON;
}

/* The frame is all read: its tag checked (a tagged frame), it is acted on.
 * False to stop reading (no bytes of the tag now, or c ended). */
static bool read_frame_end(tcp_conn *c) {
    if (c->rx_mac && !conn_read_tag(c)) return false;
    if (!c->rx_ctl) {
        conn_message_done(c);
        return true;
    }
    c->rx_ctl = false;
    c->hdr_got = 0;
    c->frames_read++;
    uint8_t kind = c->hdr[4];
    if (kind == TCP_KIND_BYE) {
        conn_goodbye(c);
        return false;
    }
    if (kind == TCP_KIND_CREDIT)
        cl_tcp_conn_on_credit(c);
    else if (kind == TCP_KIND_CTS)
        cl_tcp_conn_on_cts(c);
    else if (kind == TCP_KIND_GONE)
        cl_tcp_conn_on_gone(c);
    /* a HEARTBEAT only says the peer lives: heard as every frame is (conn_read_frames) */
    return true;
}

/* Read and handle frames while there are bytes, at most 64 reads, so one
 * busy peer cannot starve the others. */
static void conn_read_frames(tcp_conn *c, bool shm) {
    int iter;
    for (iter = 0; iter < 64 && c->state == TCP_CONN_READY; iter++) {
        int st = READ_ON;
        if (c->rx_ctl)
            st = READ_CTL; /* its tag was not all there */
        else if (!c->have_hdr)
            st = read_header(c, shm);
        if (st == READ_ON && c->payload_got < c->payload_len) st = read_payload_step(c, &iter);
        if (st == READ_STOP) break;
        if (st == READ_AGAIN) continue;
        if (!read_frame_end(c)) break;
    }
    /* bytes came (the first read found some, or a later one was tried) */
    if ((iter > 0 || c->have_hdr) && c->state == TCP_CONN_READY) cl_tcp_conn_heard(c);
    /* the bound cut a shm link short: no doorbell comes for bytes already
     * there, so come back on the next turn of the loop */
    if (shm && iter >= 64 && c->state == TCP_CONN_READY)
        c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
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

/* Sending failed: the peer has gone. Its last words (an ABORT frame naming
 * the root cause) may still wait in our receive queue, behind frames no
 * receive is posted for (parked, or skipped after a mismatch paused
 * reading) - a deep queue of small collectives leaves thousands. Read them
 * before blaming the peer; reading ends the connection if they are there,
 * or at the end of the stream. Bounded: 64 rounds of 64 reads, and a round
 * that completes no frame ends it. */
void cl_tcp_conn_read_last_words(tcp_conn *c) {
    for (int i = 0; i < 64 && c->state == TCP_CONN_READY; i++) {
        if (cl_tcp_conn_read_paused(c)) {
            memset(&c->drain, 0, sizeof c->drain);
            c->drain.len = c->payload_len;
            c->cur = &c->drain; /* owner NULL: into the discard area */
        }
        uint64_t before = c->frames_read;
        cl_tcp_conn_on_read(c->fd, COLLIE_WATCH_READ, c);
        if (c->frames_read == before && !cl_tcp_conn_read_paused(c)) return;
    }
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
    if (cl_tcp_conn_read_paused(c)) return;
    if (sleeping) {
        if (!cl_shm_ring_reader_park(&c->shm.rx))
            c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
        return;
    }
    if (cl_shm_link_readable(&c->shm)) conn_read_frames(c, true);
}

void cl_tcp_conn_forget_slot(tcp_conn *c, tcp_slot *s) {
    if (s->step == TCP_P2P_STEP)
        cl_list_remove(&s->node);
    else if (c)
        cl_idmap_remove(&c->expected, &s->by_seq);
    if (c && c->cur == s) cl_tcp_conn_drain(c, s); /* the slot itself is the work's memory */
}
