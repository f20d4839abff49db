/*
 * tcp_conn_match.c — where a frame read off a connection goes: the
 * receive slot it matches, the park (a collective frame that came before
 * its receive was posted here), or a mismatch fault; and posting a slot,
 * which takes what was parked for it.
 *
 * Design notes
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
 *  - Parking stays within the credit this side granted the peer
 *    (tcp_conn_write.c's notes): a peer past it, or a frame parked twice,
 *    breaks the protocol (EPROTO, connection closed). Every frame taken,
 *    into its slot or out of the park, gives its charge back.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/reduce.h"
#include "transports/cpu/cpu.h"
#include "transports/cpu/tcp_conn_impl.h"

/* ---- slots ---------------------------------------------------------------------------- */

/* The posted receive this p2p frame from c's peer matches: the first
 * posted (MPI's rule) with its tag, from this peer or from any source. */
tcp_slot *cl_tcp_conn_p2p_slot_take(tcp_conn *c, uint64_t tag) {
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

static void slot_put(tcp_conn *c, tcp_slot *s) {
    s->by_seq.key = s->seq;
    cl_idmap_put(&c->expected, &s->by_seq); /* never fails: the map has buckets */
}

/* ---- mismatches ----------------------------------------------------------------------- */

/* One side of a collective, from a frame's fields, for messages. */
static void describe_post(char *buf, size_t len, unsigned kind, uint64_t count, unsigned dtype,
                          unsigned op, uint32_t root) {
    collie_coll_describe(buf, len, (collie_coll_kind)kind, count,
                         cl_dtype_name((collie_dtype)dtype), cl_redop_name((collie_redop)op),
                         (int)root);
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
    cl_tcp_conn_disagrees(c);
    tc->core->fault(tc->bc, tw->w, COLLIE_EPROTO,
                    "mismatched collectives at seq %llu: rank %d posted %s, rank %d posted %s",
                    (unsigned long long)get64(h + 16), tc->rank, ours, c->peer, theirs);
}

/* Does the collective frame header h disagree with slot s (the ranks
 * posted different things)? Then the comm faults (EPROTO naming both). */
static bool coll_mismatch(tcp_conn *c, const uint8_t *h, const tcp_slot *s) {
    if (frame_args_agree(h, s->owner, c->peer) && get64(h + 32) == s->len) return false;
    frame_mismatch(c, h, s->owner, s);
    return true;
}

/* A frame (header h) for a collective this rank finished: every frame for
 * a collective is consumed before it completes, so the ranks posted
 * different things: a comm fault. */
static void coll_late_frame(tcp_conn *c, const uint8_t *h) {
    tcp_comm *tc = c->tc;
    char theirs[96];
    describe_post(theirs, sizeof theirs, h[4], get64(h + 24), h[5], h[6], get32(h + 40));
    cl_tcp_conn_disagrees(c);
    tc->core->fault(tc->bc, NULL, COLLIE_EPROTO,
                    "mismatched collectives at seq %llu: rank %d sent a frame of %s, which "
                    "rank %d had already completed without it (the ranks' arguments differ)",
                    (unsigned long long)get64(h + 16), c->peer, theirs, tc->rank);
}

bool cl_tcp_frame_agrees(tcp_conn *c, const uint8_t *h, tcp_work *tw) {
    if (frame_args_agree(h, tw, c->peer)) return true;
    frame_mismatch(c, h, tw, NULL);
    return false;
}

void cl_tcp_conn_check_early(tcp_conn *c, tcp_work *tw) {
    uint64_t seq = c->tc->core->work_seq(tw->w);
    if (c->state == TCP_CONN_READY && cl_tcp_conn_read_paused(c) &&
        get32(c->hdr + 8) != TCP_P2P_STEP && get64(c->hdr + 16) == seq &&
        !cl_tcp_frame_agrees(c, c->hdr, tw))
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

/* ---- parking early frames ------------------------------------------------------------- */

/* What a collective frame counts against the receiver's budget: the whole
 * frame, its header for an announcement, nothing once cleared. */
static uint64_t frame_charge(const uint8_t *h) {
    if (h[7] & TCP_FRAME_CLEARED) return 0;
    if (h[7] & TCP_FRAME_RTS) return TCP_FRAME_HDR;
    return TCP_FRAME_HDR + get64(h + 32);
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

/* A large early frame is not parked at once: its receive is usually posted
 * within moments (a rank a little behind), and then it is read straight
 * into place, as before parking existed (parking it costs an allocation and
 * a copy: a 1 MiB broadcast over TCP took twice as long). Reading pauses
 * for at most PARK_GRACE_US; then it is parked and reading goes on, so
 * what waits behind it (a send/recv) is late by that much at most. */
#define PARK_GRACE_MIN (64u * 1024)
#define PARK_GRACE_US  1000

static void park_grace_expired(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_conn *c = arg;
    c->tc->core->watch_stop(c->grace_ev);
    if (c->state != TCP_CONN_READY || !cl_tcp_conn_read_paused(c) || !c->grace_waiting) return;
    c->grace_over = true; /* this header: park it now */
    if (!cl_tcp_conn_match(c)) return;
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

/* The header in c->hdr is for a slot not posted yet (the peer is ahead):
 * park the frame, within the budget the peer was granted (a peer past it
 * broke the protocol). False if c failed. */
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
        cl_tcp_conn_consumed(c, charge);
        return;
    }
    if (rts) {
        park_free(c, p);
        slot_put(c, s);
        cl_tcp_conn_consumed(c, charge);
        cl_tcp_conn_send_cts(c, seq, step);
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
    cl_tcp_conn_consumed(c, charge);
    if (done)
        cl_tcp_op_done(tw);
    else if (verdict != CL_LOAN_READ && !tw->finished)
        cl_tcp_loan_doom(c, s, verdict);
}

/* Parked frame p is complete: its slot may have been posted while it was
 * read (deliver it now); its collective may have finished without it (the
 * ranks posted different things, as for a frame that arrives then). */
void cl_tcp_conn_park_settle(tcp_conn *c, tcp_parked *p) {
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
    cl_tcp_conn_consumed(c, charge);
    coll_late_frame(c, h);
}

/* ---- matching a header, posting a slot ------------------------------------------------ */

/* Match the complete header in c->hdr. Returns false to pause reading. */
bool cl_tcp_conn_match(tcp_conn *c) {
    tcp_comm *tc = c->tc;
    const uint8_t *h = c->hdr;
    uint32_t step = get32(h + 8);
    uint64_t seq = get64(h + 16), len = get64(h + 32);
    c->payload_len = len;
    c->payload_got = 0;
    c->stage_fill = 0;
    if (step == TCP_P2P_STEP) {
        tcp_slot *s = cl_tcp_conn_p2p_slot_take(c, seq);
        char why[256];
        if (s && !cl_tcp_p2p_matches(h, &s->owner->args, c->peer, s->len, why, sizeof why)) {
            /* the receive fails; the frame goes into the void, never into
             * a buffer sized for something else */
            cl_tcp_conn_disagrees(c);
            cl_tcp_work_fail(s->owner, COLLIE_EPROTO, "%s", why);
            cl_tcp_conn_drain(c, s);
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
    cl_tcp_conn_consumed(c, charge);
    if (fl & TCP_FRAME_RTS) { /* the slot waits for the data: ask for it */
        slot_put(c, s);
        cl_tcp_conn_send_cts(c, seq, step);
        memset(&c->drain, 0, sizeof c->drain); /* the header is all: nothing to fill */
        c->cur = &c->drain;
        return c->state == TCP_CONN_READY;
    }
    c->cur = s;
    return true;
}

/* The peer's GONE: the frame we asked for never comes (its work ended
 * early): the receive fails after the grace in which the peer's root cause
 * may come first (tcp_loan.c). */
void cl_tcp_conn_on_gone(tcp_conn *c) {
    tcp_slot *s = coll_slot_take(c, get64(c->hdr + 16), get32(c->hdr + 8));
    if (s && !s->owner->finished) cl_tcp_loan_doom(c, s, CL_LOAN_WITHDRAWN);
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
    if (c->state == TCP_CONN_READY && cl_tcp_conn_read_paused(c) && get32(c->hdr + 8) == s->step &&
        get64(c->hdr + 16) == s->seq) {
        if (!cl_tcp_conn_match(c)) return;
        c->tc->core->watch_start(c->rev, -1);
        c->tc->core->watch_activate(c->rev, COLLIE_WATCH_READ);
    }
}

void cl_tcp_conn_recheck(tcp_conn *c, uint64_t seq, bool ok) {
    if (c->state == TCP_CONN_READY && cl_tcp_conn_read_paused(c) &&
        get32(c->hdr + 8) != TCP_P2P_STEP && get64(c->hdr + 16) == seq)
        cl_tcp_conn_match(c); /* finds seq finished: a comm fault */
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
        cl_tcp_conn_consumed(c, charge);
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
