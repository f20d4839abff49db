/*
 * tcp_loan.c — single copy over a same-host link: a large payload is lent
 * (its address travels in the frame instead of its bytes) and the receiver
 * reads it out of the sender's memory (transports/cpu/shm/loan.h has the
 * protocol and why it is safe).
 *
 * Design notes
 *  - Sending: cl_tcp_conn_flush lends a message when its first byte is
 *    about to go, under its work's BUSY bracket (so the work's unlend hook,
 *    which runs after any claim, sees every loan it opened): the frame's
 *    header gets TCP_FRAME_LOAN and a 16-byte descriptor follows instead of
 *    the payload. Once the frame is written the message waits in c->lent;
 *    the peer's return of its ticket completes it (op_done), in ticket
 *    order. A work keeps its open loans in tcp_work.loans (at most
 *    TCP_WORK_LOANS; a link at most CL_SHM_LOAN_SLOTS): more go through
 *    the ring as before. Tickets go on the stream in order (the borrower
 *    refuses one that does not go up): a flush batch that passes over a
 *    message it may lend (no slot free now) lends none after it, since that
 *    message, if unwritten, heads the next batch and may be lent then.
 *  - What is lent (measured, bench/RESULTS.md): payloads from
 *    COLLIE_SHM_SINGLE_COPY bytes (512 KiB) of collectives that do not
 *    reduce. The ring's two copies go through memory that stays in the
 *    cache and run on both cores at once, while process_vm_readv pins the
 *    sender's pages and runs on the receiver alone: it wins where one side
 *    only sends (broadcast 2 ranks, 1-16 MiB: ~6 GB/s against ~4.7), it
 *    loses below ~512 KiB and where the receiver reduces what it reads
 *    (allreduce 2 ranks: ~3.5 GB/s against ~3.9).
 *  - A work that ends early (deadline, cancel, abort, a fault) withdraws
 *    its loans as it is published (cl_tcp_work_unlend, any thread, before
 *    its end is visible): the peer's claim then fails and its receive fails
 *    naming this rank, so nobody ever completes with bytes the user may
 *    have rewritten. Nothing waits for the peer: a stopped peer cannot
 *    hold up a deadline. The stream stays whole (the frame was complete).
 *  - Collective frames are lent only once the receive is posted: a frame
 *    that may be lent is announced first (RTS, tcp_conn_write.c), lent
 *    after the CTS. So a receiver never copies a lent payload into its park of early
 *    frames, never reads one before checking the arguments, and a root
 *    whose peer has not posted yet still holds its buffer (and withdraws
 *    nothing read). Point-to-point sends are lent at once, as before.
 *  - Receiving: the header is matched as any other; the descriptor is read
 *    from the ring; the payload is pulled with process_vm_readv into the
 *    destination (or the staging buffer for receive-and-reduce, or an
 *    unexpected message's buffer) in pieces of at most LOAN_PULL bytes,
 *    each MiB counted as one of the 64 reads a connection gets per turn of
 *    the loop, so one message cannot hold it for long. A work that is
 *    gone skips the pulls. The claim at the end decides: read, withdrawn (the work
 *    fails), or the peer exited (the work fails; its socket's end follows).
 *    Every loan is returned, in order, whatever happened, so the lender's
 *    other messages complete. The connection's loan state (lent, withdrawn,
 *    skipped, the descriptor) is the current frame's and ends with it
 *    (cl_tcp_loan_end); the reader looks at it only while that frame is
 *    lent. A withdrawal that outlived its frame once made the next frame
 *    on the link (an allreduce's, into a receive-and-reduce) end after its
 *    first read with nothing reduced: its work completed OK with its output
 *    never written (the chaos harness, test_shm_copy's
 *    test_frames_after_a_withdrawn_loan).
 *  - The peer's `returned` is checked before it completes anything: one
 *    past the newest ticket lent fails the connection with EPROTO (its
 *    messages would complete unread).
 *  - Waking the lender: while the loop polls, returns are collected on
 *    every turn (cl_tcp_conn_poll); a loop that may sleep parks the lender
 *    side and the borrower rings the doorbell on its next return.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "transports/cpu/cpu.h"

#include "transports/cpu/tcp_conn_impl.h"

/* bytes pulled per call: measured best of 256 KiB, 1 and 4 MiB (2-rank
 * broadcast of 1-64 MiB: 6.8-7.8 GB/s against 5.4-6.2 with 1 MiB) */
#define LOAN_PULL (4u << 20)

/* ---- the lender ------------------------------------------------------------------------ */

bool cl_tcp_loan_open(tcp_conn *c, tcp_msg *m) {
    uint64_t min = c->tc->shm_single_copy;
    if (!min || m->len < min || !m->owner || !cl_tcp_link_is_shm(c) ||
        (m->hdr[7] & TCP_FRAME_RTS) || collie_coll_reduces(m->owner->args.kind) ||
        !cl_shm_loan_can_lend(&c->shm.loans))
        return false;
    tcp_loan_rec *recs = m->owner->loans;
    int rec = -1;
    for (int i = 0; i < TCP_WORK_LOANS && rec < 0; i++)
        if (atomic_load_explicit(&recs[i].ticket, memory_order_relaxed) == 0) rec = i;
    if (rec < 0) return false;
    uint64_t t = cl_shm_loan_open(&c->shm.loans, m->payload, m->loan);
    atomic_store_explicit(&recs[rec].to, c->shm.loans.mine, memory_order_relaxed);
    atomic_store_explicit(&recs[rec].ticket, t, memory_order_release);
    m->loan_ticket = t;
    m->loan_rec = rec;
    m->hdr[7] |= TCP_FRAME_LOAN; /* beside TCP_FRAME_CLEARED, if it was announced */
    m->tagged = false;           /* a tag made before covered the payload and another header */
    return true;
}

bool cl_tcp_loan_may(const tcp_conn *c, const tcp_msg *m) {
    /* whether the peer can read us may not be known yet on a new link (its
     * probe runs as it connects): assume it can */
    uint64_t min = c->tc->shm_single_copy;
    return min && m->len >= min && m->owner && cl_tcp_link_is_shm(c) &&
           !collie_coll_reduces(m->owner->args.kind);
}

/* m's loan is over (returned, or its work ended): free its record */
static void loan_rec_free(tcp_msg *m) {
    if (m->owner)
        atomic_store_explicit(&m->owner->loans[m->loan_rec].ticket, 0, memory_order_relaxed);
}

void cl_tcp_loan_forget(tcp_msg *m) {
    /* withdrawn already: every end of a work is published, and the unlend
     * hook ran then. Returned already: the record may serve another loan. */
    if (m->owner && atomic_load_explicit(&m->owner->loans[m->loan_rec].ticket,
                                         memory_order_relaxed) == m->loan_ticket)
        loan_rec_free(m);
}

void cl_tcp_work_unlend(tcp_work *tw) {
    for (int i = 0; i < TCP_WORK_LOANS; i++) {
        uint64_t t = atomic_load_explicit(&tw->loans[i].ticket, memory_order_acquire);
        if (t)
            cl_shm_loan_withdraw(atomic_load_explicit(&tw->loans[i].to, memory_order_relaxed), t);
    }
}

/* Complete the messages whose loans came back. */
static void loans_collect(tcp_conn *c) {
    if (cl_list_empty(&c->lent)) return;
    uint64_t back;
    if (cl_shm_loans_returned(&c->shm.loans, &back) != COLLIE_OK) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO,
                         "rank %d returned single-copy loans it was never lent (up to ticket %llu; "
                         "the newest lent is %llu)",
                         c->peer, (unsigned long long)back,
                         (unsigned long long)(c->shm.loans.next_ticket - 1));
        return;
    }
    tcp_msg *m;
    while (c->state == TCP_CONN_READY && (m = cl_list_first(&c->lent, tcp_msg, node)) &&
           m->loan_ticket <= back) {
        cl_list_remove(&m->node);
        loan_rec_free(m);
        if (m->owner) cl_tcp_op_done(m->owner); /* may post more, or close c */
    }
}

void cl_tcp_loans_settle(tcp_conn *c, bool park) {
    for (int round = 0; round < 4; round++) {
        loans_collect(c);
        if (c->state != TCP_CONN_READY || cl_list_empty(&c->lent) || !park) return;
        const tcp_msg *newest = cl_list_last(&c->lent, tcp_msg, node);
        if (cl_shm_loans_park(&c->shm.loans, newest->loan_ticket)) return;
    }
    c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ); /* a busy peer: next turn */
}

void cl_tcp_loans_close(tcp_conn *c) {
    tcp_msg *m;
    while ((m = cl_list_first(&c->lent, tcp_msg, node))) {
        cl_list_remove(&m->node);
        if (m->owner && !m->owner->finished) /* its publication withdraws the loan */
            cl_tcp_work_fail(m->owner, COLLIE_EPEER, "%s", c->closed_why);
        cl_tcp_loan_forget(m);
    }
}

/* ---- the borrower ---------------------------------------------------------------------- */

/* How long a receive whose message was withdrawn waits for the sender's
 * root cause (its ABORT frame, or the store's abort notice, which a failing
 * comm sends at once) before it fails with the withdrawal itself: a peer
 * must learn why rank 0 failed, not that its message went missing. */
#define LOAN_DOOM_GRACE_US (1000 * 1000)

static void loan_doom_expired(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_conn *c = arg;
    if (c->doom_ev) c->tc->core->watch_stop(c->doom_ev);
    tcp_work *tw;
    while ((tw = cl_list_first(&c->doomed, tcp_work, doomed_node))) {
        cl_list_remove(&tw->doomed_node);
        if (tw->finished) continue;
        bool p2p = tw->kind_p2p;
        if (tw->doomed_verdict == CL_LOAN_WITHDRAWN)
            cl_tcp_work_fail(tw, COLLIE_EPEER,
                             "rank %d withdrew its message (%s %llu) before it was read: its work "
                             "ended early (deadline, cancel or a fault)",
                             tw->doomed_peer, p2p ? "tag" : "seq",
                             (unsigned long long)tw->doomed_seq);
        else
            cl_tcp_work_fail(tw, COLLIE_EPEER,
                             "rank %d exited while its message (%s %llu) was read", tw->doomed_peer,
                             p2p ? "tag" : "seq", (unsigned long long)tw->doomed_seq);
    }
}

void cl_tcp_loan_doom(tcp_conn *c, const tcp_slot *s, int verdict) {
    tcp_work *tw = s->owner;
    if (cl_list_linked(&tw->doomed_node)) return; /* one reason is enough */
    const collie_core_services *core = c->tc->core;
    if (!c->doom_ev) c->doom_ev = core->watch_new(c->tc->bc, -1, 0, loan_doom_expired, c);
    tw->doomed_seq = s->seq;
    tw->doomed_peer = c->peer;
    tw->doomed_verdict = verdict;
    if (!c->doom_ev) { /* no memory for a timer: fail it now */
        cl_list_push_back(&c->doomed, &tw->doomed_node);
        loan_doom_expired(-1, 0, c);
        return;
    }
    if (cl_list_empty(&c->doomed)) core->watch_start(c->doom_ev, LOAN_DOOM_GRACE_US);
    cl_list_push_back(&c->doomed, &tw->doomed_node);
}

void cl_tcp_loans_probe(tcp_conn *c) {
    if (c->shm.loans.probed || !c->tc->shm_single_copy || c->fd < 0 || !c->shm.loans.peer) return;
    char why[160] = "";
    if (!cl_shm_loans_probe(&c->shm.loans, c->fd, why, sizeof why)) return;
    if (c->shm.loans.pid)
        c->tc->core->log_comm(c->tc->bc, 3, "tcp", "rank %d's large messages come by single copy",
                              c->peer);
    else
        c->tc->core->log_comm(c->tc->bc, 2, "tcp",
                              "single copy from rank %d is not possible (%s): its large messages "
                              "come through the ring",
                              c->peer, why);
}

void cl_tcp_loan_begin(tcp_conn *c) {
    c->loan_frame = true;
    c->loan_withdrawn = false;
    c->loan_skipped = false;
    c->loan_desc_got = 0;
}

ssize_t cl_tcp_loan_read_desc(tcp_conn *c) {
    ssize_t n =
        cl_tcp_link_recv(c, c->loan_desc + c->loan_desc_got, CL_SHM_LOAN_DESC - c->loan_desc_got);
    if (n <= 0) return n < 0 ? -errno : 0;
    c->loan_desc_got += (size_t)n;
    if (c->loan_desc_got == CL_SHM_LOAN_DESC &&
        cl_shm_loan_borrow(&c->shm.loans, c->loan_desc, &c->loan_ticket, &c->loan_addr) !=
            COLLIE_OK)
        return -EPROTO;
    return n;
}

ssize_t cl_tcp_loan_pull(tcp_conn *c, void *buf, uint64_t off, uint64_t len) {
    if (len > LOAN_PULL) len = LOAN_PULL;
    /* withdrawn: its bytes are of no use (the claim will fail); skip them */
    if (c->loan_withdrawn || !cl_shm_loan_live(&c->shm.loans, c->loan_ticket)) {
        c->loan_withdrawn = true;
        return (ssize_t)len;
    }
    ssize_t n = cl_shm_loan_read(&c->shm.loans, buf, c->loan_addr + off, (size_t)len);
    if (n > 0) return n;
    int err = n == 0 ? EFAULT : errno;
    if (!cl_shm_loan_live(&c->shm.loans, c->loan_ticket)) { /* withdrawn and freed meanwhile */
        c->loan_withdrawn = true;
        return (ssize_t)len;
    }
    return -err;
}

int cl_tcp_loan_end(tcp_conn *c, bool used) {
    /* what was said of this frame's loan ends with it: a withdrawal left
     * standing would cut the link's next frame short (conn_read_payload) */
    c->loan_frame = false;
    c->loan_withdrawn = false;
    c->loan_skipped = false;
    c->loan_desc_got = 0;
    bool ring = false;
    int verdict = cl_shm_loan_return(&c->shm.loans, c->loan_ticket, used, &ring);
    if (ring) cl_shm_link_ring_doorbell(c->fd); /* the lender sleeps: wake it */
    if (used && verdict == CL_LOAN_READ && COLLIE_CORE_HAS(c->tc->core, stat_add))
        c->tc->core->stat_add(c->tc->bc, COLLIE_BSTAT_SHM_SINGLE_COPY_BYTES,
                              (int64_t)c->payload_len);
    return verdict;
}
