/*
 * tcp_exec.c — running works on the TCP transport: a collective's schedule
 * step by step, and point-to-point sends and receives.
 *
 * Design notes
 *  - A step posts all its operations at once: local ones run immediately,
 *    each SEND becomes a message on the peer's connection, each RECV a slot
 *    the connection fills. `pending` counts the network operations left;
 *    the next step is posted when it reaches zero. So an operation that
 *    cannot be posted (its peer's connection is closed: the peer died or
 *    left, or the stream to it broke) must end the work: `pending` counts
 *    only what was posted, and a step that went on without it would end
 *    OK with bytes that never came (cl_tcp_work_fault).
 *  - Re-entrancy: posting a send can complete it at once (the socket had
 *    room), which reports back through cl_tcp_op_done while the step is
 *    still being posted. A guard count during posting and the `running`
 *    flag keep that from advancing the schedule underneath the poster.
 *  - Several works of a comm run at the same time, each on its own step;
 *    messages carry (seq, step), so they never mix (see tcp_conn_match.c).
 *  - Local operations touch user buffers inside work_busy_enter/exit.
 *  - A peer's connection lost (cl_tcp_peer_lost) fails the works that need
 *    that peer: those with a message or a receive on its connection, and
 *    the receives from any source not matched yet; the first of them gets
 *    the comm's root code. Under NONE every other work goes on (one
 *    matched to, and reading, a live peer's frame: failing it would drain
 *    a message whose send said OK); otherwise the comm's fault takes them
 *    down. A collective that needs the peer in a later step meets its
 *    closed connection when that step is posted. O(what the connection
 *    holds), not O(works).
 */
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/reduce.h"
#include "transports/cpu/cpu.h"

/* The address of byte `off` of one of the work's buffers (NULL stays NULL:
 * zero-length messages may name an absent buffer). */
static uint8_t *work_buf_at(tcp_work *tw, uint8_t which, uint64_t off) {
    uint8_t *base;
    switch (which) {
    case CL_SBUF_SEND: base = (uint8_t *)tw->args.sendbuf; break;
    case CL_SBUF_RECV: base = (uint8_t *)tw->args.recvbuf; break;
    default: base = tw->xb ? tw->xb->scratch : NULL; break;
    }
    return base ? base + off : NULL;
}

void cl_tcp_work_fail(tcp_work *tw, int status, const char *fmt, ...) {
    char msg[TCP_ABORT_MAX + 64]; /* a root cause, whole */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tw->finished = true;
    tw->tc->core->work_finish(tw->w, status, "%s", msg);
}

static void work_local_op(tcp_work *tw, const cl_sop *op) {
    const collie_coll_args *a = &tw->args;
    size_t es = cl_dtype_size(a->dtype);
    uint8_t *dst = work_buf_at(tw, op->buf, op->off);
    const uint8_t *src = work_buf_at(tw, op->src_buf, op->src_off);
    collie_redop rop = a->op == COLLIE_AVG ? COLLIE_SUM : a->op;
    switch (op->kind) {
    case CL_SOP_COPY:
        if (dst != src) memmove(dst, src, op->len);
        break;
    case CL_SOP_REDUCE_LOCAL: cl_reduce(dst, src, op->len / es, a->dtype, rop); break;
    case CL_SOP_AVG: cl_reduce_finalize_avg(dst, op->len / es, a->dtype, tw->tc->size); break;
    default: break;
    }
}

void cl_tcp_work_fault(tcp_work *tw, int status, const char *why) {
    tcp_comm *tc = tw->tc;
    if (tc->aborted) {
        cl_tcp_work_fail(tw, tc->abort_status, "%s", tc->abort_reason);
        return;
    }
    if (status == COLLIE_ECLOSED) { /* the engine is closing: its shutdown ends the comm */
        cl_tcp_work_fail(tw, COLLIE_ECLOSED, "%s", why);
        return;
    }
    tw->finished = true;
    tc->core->fault(tc->bc, tw->w, status, "%s", why);
}

/* Post every operation of the current step. */
static void work_post_step(tcp_work *tw) {
    tcp_comm *tc = tw->tc;
    const cl_sched *s = &tw->xb->sched;
    uint32_t first = s->step_start[tw->step], end = s->step_start[tw->step + 1];
    bool touched = false;
    tw->nposted = 0;
    for (uint32_t i = first; i < end && !tw->finished; i++) {
        const cl_sop *op = &s->ops[i];
        uint32_t k = i - first;
        if (op->kind == CL_SOP_COPY || op->kind == CL_SOP_REDUCE_LOCAL || op->kind == CL_SOP_AVG) {
            if (!touched && !(touched = tc->core->work_busy_enter(tw->w))) {
                tw->finished = true; /* claimed by someone else, as in work_run: no more steps */
                return;
            }
            work_local_op(tw, op);
            continue;
        }
        tcp_conn *c = cl_tcp_conn_get(tc, op->peer);
        if (!c) {
            cl_tcp_work_fail(tw, COLLIE_ENOMEM, "no memory for a connection");
            break;
        }
        /* it must not go on without this op; what a peer that has left
         * sent before is still ours to take */
        if (c->state == TCP_CONN_CLOSED &&
            !(op->kind != CL_SOP_SEND &&
              cl_tcp_conn_has_parked(c, tc->core->work_seq(tw->w), tw->step))) {
            cl_tcp_work_fault(tw,
                              c->closed_status == COLLIE_ECLOSED ? COLLIE_ECLOSED : COLLIE_EPEER,
                              c->closed_why);
            break;
        }
        tw->pending++;
        if (op->kind == CL_SOP_SEND) {
            tcp_msg *m = &tw->xb->msgs[k];
            memset(m, 0, sizeof *m);
            m->owner = tw;
            m->payload = work_buf_at(tw, op->buf, op->off);
            m->len = op->len;
            cl_tcp_frame_header(m->hdr, tc, &tw->args, tc->core->work_seq(tw->w), tw->step,
                                op->len);
            cl_tcp_frame_set_vcheck(m->hdr, cl_tcp_vcheck(tw, op->peer, true));
            tw->nposted = k + 1;
            if (touched) { /* sends read user memory under their own bracket */
                tc->core->work_busy_exit(tw->w);
                touched = false;
            }
            cl_tcp_conn_send(c, m);
        } else {
            tcp_slot *sl = &tw->xb->slots[k];
            memset(sl, 0, sizeof *sl);
            sl->owner = tw;
            sl->seq = tc->core->work_seq(tw->w);
            sl->step = tw->step;
            sl->kind = op->kind;
            sl->dst = work_buf_at(tw, op->buf, op->off);
            sl->src = work_buf_at(tw, op->src_buf, op->src_off);
            sl->len = op->len;
            tw->nposted = k + 1;
            if (touched) {
                tc->core->work_busy_exit(tw->w);
                touched = false;
            }
            cl_tcp_conn_expect(c, sl);
        }
    }
    if (touched) tc->core->work_busy_exit(tw->w);
}

/* Drive the schedule as far as it can go now. */
static void work_run(tcp_work *tw) {
    if (tw->running) return; /* the loop below re-checks `pending` */
    /* claimed by someone else (deadline, cancel, abort): go no further */
    if (!tw->finished && !tw->tc->core->work_busy_enter(tw->w)) tw->finished = true;
    if (tw->finished) return;
    tw->tc->core->work_busy_exit(tw->w);
    tw->running = true;
    while (!tw->finished) {
        if (!tw->posted) {
            if (tw->step == tw->xb->sched.nsteps) {
                tw->finished = true;
                tw->tc->core->work_finish(tw->w, COLLIE_OK, NULL);
                break;
            }
            tw->pending = 1; /* guard while posting */
            tw->posted = true;
            work_post_step(tw);
            tw->pending--;
        }
        if (tw->pending > 0 || tw->finished) break;
        tw->step++;
        tw->posted = false;
        tw->nposted = 0;
    }
    tw->running = false;
}

void cl_tcp_op_done(tcp_work *tw) {
    if (tw->kind_p2p) {
        tw->finished = true;
        tw->tc->core->work_finish(tw->w, COLLIE_OK, NULL);
        return;
    }
    if (--tw->pending == 0 && !tw->running) work_run(tw);
}

/* ---- point to point ----------------------------------------------------------------- */

void cl_tcp_p2p_source(tcp_work *tw, int peer) {
    tw->p2p_src = peer;
    if (tw->args.peer == COLLIE_ANY_SOURCE && COLLIE_CORE_HAS(tw->tc->core, work_set_source))
        tw->tc->core->work_set_source(tw->w, peer);
}

void cl_tcp_p2p_take(tcp_work *tw, tcp_unexpected *u, int peer) {
    tcp_comm *tc = tw->tc;
    const collie_coll_args *a = &tw->args;
    uint64_t len = a->count * cl_dtype_size(a->dtype);
    cl_list_remove(&u->node);
    cl_tcp_p2p_source(tw, peer);
    char why[256];
    if (!cl_tcp_p2p_matches(u->hdr, a, peer, len, why, sizeof why)) {
        if (COLLIE_CORE_HAS(tc->core, peer_disagrees)) tc->core->peer_disagrees(tc->bc, peer);
        cl_tcp_work_fail(tw, COLLIE_EPROTO, "%s", why);
    } else if (tc->core->work_busy_enter(tw->w)) {
        if (len) memcpy(a->recvbuf, u->data, len);
        tc->core->work_busy_exit(tw->w);
        tw->finished = true;
        tc->core->work_finish(tw->w, COLLIE_OK, NULL);
    }
    free(u->data);
    free(u);
}

/* The first message with `tag` in c's unexpected list (arrival order). */
static tcp_unexpected *p2p_find_unexpected(tcp_conn *c, uint64_t tag) {
    tcp_unexpected *u;
    cl_list_foreach(&c->unexpected, u, tcp_unexpected, node) if (u->tag == tag) return u;
    return NULL;
}

/* A receive whose message arrived before it was started: take it from the
 * unexpected messages of its peer, or for an any-source receive the
 * earliest of every peer's. False if none has that tag. */
static bool p2p_take_unexpected(tcp_comm *tc, tcp_work *tw) {
    const collie_coll_args *a = &tw->args;
    tcp_unexpected *best = NULL;
    int from = -1;
    for (int p = 0; p < tc->size; p++) {
        if (p == tc->rank || (a->peer != COLLIE_ANY_SOURCE && p != a->peer) || !tc->conns[p])
            continue;
        tcp_unexpected *u = p2p_find_unexpected(tc->conns[p], a->tag);
        if (u && (!best || u->arrival < best->arrival)) {
            best = u;
            from = p;
        }
    }
    if (!best) return false;
    cl_tcp_p2p_take(tw, best, from);
    return true;
}

/* A receive from any source: a message that came already, or a slot in the
 * comm's any-source list, which every peer's next message with its tag
 * meets in post order beside the receives posted for that peer
 * (tcp_conn_match.c). Every peer must be able to reach us: connect to those that
 * wait for us to dial. */
static int work_start_any(tcp_comm *tc, tcp_work *tw, uint64_t len) {
    if (p2p_take_unexpected(tc, tw)) return COLLIE_OK;
    for (int p = 0; p < tc->size; p++)
        if (p != tc->rank && !cl_tcp_conn_get(tc, p)) return COLLIE_ENOMEM;
    tcp_slot *sl = &tw->p2p_slot;
    sl->owner = tw;
    sl->seq = tw->args.tag;
    sl->step = TCP_P2P_STEP;
    sl->kind = CL_SOP_RECV;
    sl->dst = tw->args.recvbuf;
    sl->len = len;
    sl->order = ++tc->p2p_posts;
    cl_list_push_back(&tc->any_expected, &sl->node);
    return COLLIE_OK;
}

static int work_start_p2p(tcp_comm *tc, tcp_work *tw) {
    const collie_coll_args *a = &tw->args;
    uint64_t len = a->count * cl_dtype_size(a->dtype);
    tw->kind_p2p = true;
    tw->p2p_src = a->peer;
    if (a->peer == COLLIE_ANY_SOURCE) return work_start_any(tc, tw, len);
    tcp_conn *c = cl_tcp_conn_get(tc, a->peer);
    if (!c) return COLLIE_ENOMEM;
    /* a matching message may have arrived already — also from a peer that
     * has since said goodbye: what it sent before is still ours to take */
    if (a->kind == COLLIE_COLL_RECV && p2p_take_unexpected(tc, tw)) return COLLIE_OK;
    if (c->state == TCP_CONN_CLOSED) {
        cl_tcp_work_fault(tw, c->closed_status == COLLIE_ECLOSED ? COLLIE_ECLOSED : COLLIE_EPEER,
                          c->closed_why);
        return COLLIE_OK;
    }
    if (a->kind == COLLIE_COLL_SEND) {
        tcp_msg *m = &tw->p2p_msg;
        m->owner = tw;
        m->payload = a->sendbuf;
        m->len = len;
        cl_tcp_frame_header(m->hdr, tc, a, a->tag, TCP_P2P_STEP, len);
        cl_tcp_conn_send(c, m);
        return COLLIE_OK;
    }
    tcp_slot *sl = &tw->p2p_slot;
    sl->owner = tw;
    sl->seq = a->tag;
    sl->step = TCP_P2P_STEP;
    sl->kind = CL_SOP_RECV;
    sl->dst = a->recvbuf;
    sl->len = len;
    sl->order = ++tc->p2p_posts;
    cl_tcp_conn_expect(c, sl);
    return COLLIE_OK;
}

/* ---- starting ------------------------------------------------------------------------- */

static bool tcp_work_is_p2p(const tcp_work *tw) {
    return tw->args.kind == COLLIE_COLL_SEND || tw->args.kind == COLLIE_COLL_RECV;
}

static tcp_conn *work_conn(const tcp_comm *tc, int peer) {
    return peer >= 0 && peer < tc->size ? tc->conns[peer] : NULL;
}

void cl_tcp_work_forget(tcp_work *tw) {
    tcp_comm *tc = tw->tc;
    if (tcp_work_is_p2p(tw)) {
        tcp_conn *c = work_conn(tc, tw->p2p_src); /* an any-source receive: once matched */
        cl_tcp_conn_forget_msg(c, &tw->p2p_msg);
        cl_tcp_conn_forget_slot(c, &tw->p2p_slot);
        return;
    }
    if (!tw->xb || tw->step >= tw->xb->sched.nsteps) return;
    /* only what was posted: a step cut short (its work failed mid-way)
     * leaves the rest of its msgs and slots as an earlier work left them */
    const cl_sched *s = &tw->xb->sched;
    uint32_t first = s->step_start[tw->step], end = first + tw->nposted;
    for (uint32_t i = first; i < end; i++) {
        const cl_sop *op = &s->ops[i];
        if (op->kind == CL_SOP_SEND)
            cl_tcp_conn_forget_msg(work_conn(tc, op->peer), &tw->xb->msgs[i - first]);
        else if (op->kind == CL_SOP_RECV || op->kind == CL_SOP_RECV_REDUCE ||
                 op->kind == CL_SOP_RECV_REDUCE3)
            cl_tcp_conn_forget_slot(work_conn(tc, op->peer), &tw->xb->slots[i - first]);
    }
}

bool cl_tcp_coll_finished(const tcp_comm *tc, uint64_t seq) {
    return seq != 0 && seq <= tc->coll_seq_started && !cl_idmap_get(&tc->running, seq);
}

tcp_work *cl_tcp_coll_running(const tcp_comm *tc, uint64_t seq) {
    cl_idnode *n = cl_idmap_get(&tc->running, seq);
    return n ? (tcp_work *)((char *)n - offsetof(tcp_work, by_seq)) : NULL;
}

static uint32_t vcheck_sat(size_t count) {
    return count < UINT32_MAX ? (uint32_t)count : UINT32_MAX;
}

uint32_t cl_tcp_vcheck(const tcp_work *tw, int peer, bool outgoing) {
    const collie_coll_args *a = &tw->args;
    if (a->kind == COLLIE_COLL_ALLGATHERV) return tw->vdigest;
    if (a->kind != COLLIE_COLL_ALLTOALLV) return 0;
    /* what the frame's sender expects back from its receiver */
    return vcheck_sat(outgoing ? a->recvcounts[peer] : a->sendcounts[peer]);
}

/* FNV-1a over every rank's count (8 bytes each, little-endian): the same on
 * every rank that posted the same counts, whatever its displacements. */
static uint32_t counts_digest(const size_t *counts, int n) {
    uint32_t h = 2166136261u;
    for (int p = 0; p < n; p++)
        for (int i = 0; i < 8; i++)
            h = (h ^ (uint8_t)((uint64_t)counts[p] >> (8 * i))) * 16777619u;
    return h;
}

int cl_tcp_work_start(tcp_comm *tc, tcp_work *tw) {
    if (tc->aborted) {
        cl_tcp_work_fail(tw, COLLIE_EABORTED, "%s", tc->abort_reason);
        return COLLIE_OK;
    }
    cl_list_push_back(&tc->works, &tw->node);
    uint64_t seq = tc->core->work_seq(tw->w);
    if (!tcp_work_is_p2p(tw)) {
        if (seq > tc->coll_seq_started) tc->coll_seq_started = seq;
        tw->by_seq.key = seq;
        cl_idmap_put(&tc->running, &tw->by_seq); /* never fails: the map has buckets */
    }
    if (tw->args.kind == COLLIE_COLL_SEND || tw->args.kind == COLLIE_COLL_RECV)
        return work_start_p2p(tc, tw);
    tcp_xbuf *xb = cl_list_first(&tc->xb_pool, tcp_xbuf, pool_node);
    if (xb) {
        cl_list_remove(&xb->pool_node);
        tc->xb_pooled--;
    } else if (!(xb = calloc(1, sizeof *xb))) {
        return COLLIE_ENOMEM;
    }
    tw->xb = xb;
    if (tw->args.kind == COLLIE_COLL_ALLGATHERV)
        tw->vdigest = counts_digest(tw->args.recvcounts, tc->size);
    int r = cl_sched_build(&xb->sched, &tw->args, tc->rank, tc->size);
    if (r != COLLIE_OK) {
        const char *why =
            r == COLLIE_ENOMEM ? "no memory" : cl_sched_explain(&tw->args, tc->rank, tc->size);
        tc->core->log(0, "tcp", "comm '%s' rank %d of %d: scheduling kind %d failed: %s",
                      tc->core->name(tc->bc), tc->rank, tc->size, (int)tw->args.kind,
                      why ? why : "schedule bound exceeded (a bug)");
        return r;
    }
    uint32_t widest = 0;
    for (uint32_t s = 0; s < xb->sched.nsteps; s++) {
        uint32_t n = xb->sched.step_start[s + 1] - xb->sched.step_start[s];
        if (n > widest) widest = n;
    }
    if (widest > xb->cap) {
        tcp_msg *m = realloc(xb->msgs, widest * sizeof *m);
        if (m) xb->msgs = m;
        tcp_slot *sl = realloc(xb->slots, widest * sizeof *sl);
        if (sl) xb->slots = sl;
        if (!m || !sl) return COLLIE_ENOMEM;
        xb->cap = widest;
    }
    if (xb->sched.scratch_bytes > xb->scratch_cap) {
        uint8_t *sc = realloc(xb->scratch, xb->sched.scratch_bytes);
        if (!sc) return COLLIE_ENOMEM;
        xb->scratch = sc;
        xb->scratch_cap = xb->sched.scratch_bytes;
    }
    work_run(tw);
    /* a frame for this seq that came before it was posted here, held back
     * for a step not posted yet: if it disagrees, say so now, not at the
     * deadline (each check may fault) */
    for (int p = 0; p < tc->size && !tc->aborted && !tw->finished; p++)
        if (tc->conns[p]) cl_tcp_conn_check_early(tc->conns[p], tw);
    return COLLIE_OK;
}

#define TCP_LOST_SLICE 512 /* works failed per turn of the loop (tcp_fail_lost) */

/* Fail tw for its lost peer (tw->lost_peer, the reason kept whole by the
 * closed connection), unless it ended or was matched to a live peer. */
static void tcp_fail_one(tcp_comm *tc, tcp_work *tw) {
    if (tw->finished) return;
    tcp_conn *c = tc->conns[tw->lost_peer];
    const char *why = c && c->closed_why[0] ? c->closed_why : "its connection was lost";
    if (tw->kind_p2p && tw->args.peer == COLLIE_ANY_SOURCE) {
        /* matched to a live peer's frame meanwhile: not ours to fail */
        if (tw->p2p_src >= 0 && tw->p2p_src != tw->lost_peer) return;
        char msg[TCP_ABORT_MAX + 128];
        snprintf(msg, sizeof msg, "%s (a receive from any source was pending)", why);
        cl_tcp_work_fault(tw, tw->lost_status == COLLIE_EABORTED ? COLLIE_EABORTED : COLLIE_EPEER,
                          msg);
    } else {
        cl_tcp_work_fault(tw, tw->lost_status, why);
    }
}

/* Fail a slice of the works a lost peer needed (tc->lost); the rest on the
 * next turn of the loop, so a deep queue never stalls it (the loop polls
 * its sockets and timers between slices, as the comm's own fault does). */
static void tcp_fail_lost(tcp_comm *tc) {
    tcp_work *tw;
    int slice = tc->lost_ev ? TCP_LOST_SLICE : INT_MAX; /* no timer (no memory): all now */
    for (int n = 0; n < slice && (tw = cl_list_first(&tc->lost, tcp_work, lost_node)); n++) {
        /* failing one unlinks it (its detach), and may end others (an abort) */
        cl_list_remove(&tw->lost_node);
        tcp_fail_one(tc, tw);
    }
    if (!cl_list_empty(&tc->lost) && tc->lost_ev) tc->core->watch_start(tc->lost_ev, 0);
}

static void tcp_on_lost(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_fail_lost(arg);
}

void cl_tcp_peer_lost(tcp_comm *tc, int peer, int status, const char *why) {
    if (tc->aborted) return;
    /* the works that need that peer: a message or a receive on its
     * connection, and the receives from any source not matched yet (one
     * might have been waiting for it: whatever the policy, it cannot wait
     * on as if nothing happened). The first gets the root code; under NONE
     * the rest fail each on its own and every other work goes on (a receive
     * from any source already reading a live peer's frame among them),
     * otherwise the comm's fault takes them all down. Collecting them is
     * O(what the connection holds + the pending any-source receives);
     * failing them goes in slices (tcp_fail_lost), the reason read from
     * the closed connection. */
    tcp_conn *c = peer >= 0 && peer < tc->size ? tc->conns[peer] : NULL;
    cl_list found;
    cl_list_init(&found);
    if (c) cl_tcp_conn_works(c, &found);
    tcp_slot *s;
    cl_list_foreach(&tc->any_expected, s, tcp_slot,
                    node) if (!s->owner->finished && !cl_list_linked(&s->owner->lost_node))
        cl_list_push_back(&found, &s->owner->lost_node);
    if (cl_list_empty(&found)) {      /* nothing waits for it: the comm's fault alone */
        if (status != COLLIE_ECLOSED) /* the engine closing ends the comm itself */
            tc->core->fault(tc->bc, NULL, status, "%s", why);
        return;
    }
    /* receives from any source at once, in this turn (between slices a
     * live peer's frame could be matched to one); the rest in slices */
    tcp_work *tw;
    while ((tw = cl_list_first(&found, tcp_work, lost_node))) {
        cl_list_remove(&tw->lost_node);
        if (tw->finished) continue;
        tw->lost_peer = peer;
        tw->lost_status = status;
        if (tw->kind_p2p && tw->args.peer == COLLIE_ANY_SOURCE)
            tcp_fail_one(tc, tw);
        else
            cl_list_push_back(&tc->lost, &tw->lost_node);
    }
    if (!tc->lost_ev) tc->lost_ev = tc->core->watch_new(tc->bc, -1, 0, tcp_on_lost, tc);
    tcp_fail_lost(tc);
}

/* Pool sizes: enough for many works in flight; scratch beyond XB_KEEP_SCRATCH
 * is returned to the allocator rather than kept around. */
#define XB_POOL_MAX     512
#define XB_KEEP_SCRATCH (4u << 20)

void cl_tcp_xbuf_put(tcp_comm *tc, tcp_xbuf *xb) {
    if (tc->xb_pooled >= XB_POOL_MAX) {
        cl_sched_fini(&xb->sched);
        free(xb->msgs);
        free(xb->slots);
        free(xb->scratch);
        free(xb);
        return;
    }
    if (xb->scratch_cap > XB_KEEP_SCRATCH) {
        free(xb->scratch);
        xb->scratch = NULL;
        xb->scratch_cap = 0;
    }
    cl_list_push_front(&tc->xb_pool, &xb->pool_node);
    tc->xb_pooled++;
}

void cl_tcp_xbuf_free_all(tcp_comm *tc) {
    tcp_xbuf *xb;
    cl_list_foreach(&tc->xb_pool, xb, tcp_xbuf, pool_node) {
        cl_list_remove(&xb->pool_node);
        cl_sched_fini(&xb->sched);
        free(xb->msgs);
        free(xb->slots);
        free(xb->scratch);
        free(xb);
    }
    tc->xb_pooled = 0;
}
