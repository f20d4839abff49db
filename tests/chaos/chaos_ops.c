/*
 * chaos_ops.c — posting and checking one work of the chaos rank
 * (chaos_ops.h).
 *
 * Design notes
 *  - Layouts follow collie.h: block ops put rank p's block at p*count; the
 *    in-place forms are NCCL's (allreduce/broadcast/reduce sendbuf ==
 *    recvbuf; allgather/gather sendbuf == recvbuf + rank*count;
 *    reduce_scatter recvbuf == sendbuf + rank*recvcount; scatter at the
 *    root recvbuf == sendbuf + root*count; allgatherv sendbuf == recvbuf +
 *    displs[rank]). alltoall(v) and point to point have none.
 *  - The v collectives' displacements are NULL (packed) when the op has no
 *    gaps, else computed from ch_gap; the arrays are the caller's (collie
 *    copies them at the call) and are rebuilt for the check.
 *  - Streams: 0 is every collective's input; alltoallv uses 1 + destination
 *    (the block rank s sends to d is stream 1+d of rank s); a point-to-point
 *    message uses its own stream (0 one way, 1 back; an any-source sender's
 *    k-th message: k).
 */
#include "tests/chaos/chaos_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/chaos/chaos_oracle.h"

static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "chaos_rank: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

/* A work's buffer: CH_GUARD bytes of a known pattern on either side (and
 * its size before them), so that a write past either end shows up in the
 * oracle even where malloc's slack would hide it (no sanitizer). */
#define CH_GUARD 64
static uint8_t guard_byte(size_t i) { return (uint8_t)(0x5c + i * 0x3b); }

static void *buf_alloc(size_t bytes) {
    uint8_t *p = xalloc(sizeof(size_t) + 2 * CH_GUARD + bytes);
    memcpy(p, &bytes, sizeof bytes);
    p += sizeof(size_t);
    for (size_t i = 0; i < CH_GUARD; i++)
        p[i] = p[CH_GUARD + bytes + i] = guard_byte(i);
    return p + CH_GUARD;
}

static uint8_t *buf_base(void *buf) { return (uint8_t *)buf - CH_GUARD - sizeof(size_t); }

static void buf_free(void *buf) {
    if (buf) free(buf_base(buf));
}

/* are both guards intact? If not, *where is the first changed byte's
 * offset from the buffer's start (negative: before it) */
static bool buf_guard_ok(const void *buf, long *where) {
    const uint8_t *p = (const uint8_t *)buf;
    size_t bytes;
    memcpy(&bytes, p - CH_GUARD - sizeof(size_t), sizeof bytes);
    for (size_t i = 0; i < CH_GUARD; i++) {
        if (p[-(long)CH_GUARD + (long)i] != guard_byte(i)) {
            *where = (long)i - CH_GUARD;
            return false;
        }
        if (p[bytes + i] != guard_byte(i)) {
            *where = (long)(bytes + i);
            return false;
        }
    }
    return true;
}

static void *fill_pattern(size_t bytes) {
    void *p = buf_alloc(bytes);
    memset(p, CH_FILL_BYTE, bytes);
    return p;
}

/* the v layouts of rank `who` (displs NULL when packed) */
static size_t agv_layout(const ch_op *op, int n, int who, size_t *counts, size_t *displs) {
    size_t off = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = ch_agv_count(op, p);
        off += ch_gap(op, who, p, 0);
        if (displs) displs[p] = off;
        off += counts[p];
    }
    return off + ch_gap(op, who, n, 0);
}

/* alltoallv: side 1 the send layout, side 2 the receive layout of `who` */
static size_t a2av_layout(const ch_op *op, int n, int who, int side, size_t *counts,
                          size_t *displs) {
    size_t off = 0;
    for (int p = 0; p < n; p++) {
        counts[p] = side == 1 ? ch_a2av_count(op, who, p) : ch_a2av_count(op, p, who);
        off += ch_gap(op, who, p, side);
        displs[p] = off;
        off += counts[p];
    }
    return off + ch_gap(op, who, n, side);
}

/* this rank's input of `count` elements, stream 0, in a buffer of its own */
static void send_input(ch_work *rec, size_t count, size_t es) {
    rec->sbuf = buf_alloc(count * es);
    ch_fill(&rec->op, 0, rec->me, rec->n, 0, count, rec->sbuf);
    rec->sptr = rec->sbuf;
    rec->scount = count;
}

/* scatter and reduce_scatter: this rank receives one block of `cnt` in
 * rec->rptr: in place, its own block of the send buffer (rec->sbuf, set
 * before); else a buffer of its own, filled with the pattern */
static void recv_block(ch_work *rec, bool in_place, size_t cnt, size_t es) {
    if (in_place) {
        rec->rptr = (uint8_t *)rec->sbuf + (size_t)rec->me * cnt * es;
    } else {
        rec->rbuf = fill_pattern(cnt * es);
        rec->rptr = rec->rbuf;
    }
    rec->rcount = cnt;
}

int ch_work_post(ch_work *rec, const collie_post_opts *o) {
    const ch_op *op = &rec->op;
    collie_comm *c = rec->comm;
    int n = rec->n, me = rec->me;
    size_t cnt = op->count, es = collie_dtype_size(op->dt);
    collie_dtype dt = op->dt;
    bool root = me == op->root;
    rec->sbuf = rec->rbuf = rec->sptr = rec->rptr = NULL;
    rec->scount = rec->rcount = 0;
    collie_work **out = &rec->w;
    switch (op->kind) {
    case CH_ALLREDUCE:
    case CH_REDUCE:
    case CH_BROADCAST: {
        rec->bytes = cnt * es;
        send_input(rec, cnt, es);
        if (op->kind == CH_BROADCAST) {
            if (!root) memset(rec->sbuf, CH_FILL_BYTE, cnt * es);
            rec->rptr = rec->sbuf;
            rec->rcount = cnt;
            return collie_broadcast(c, rec->sbuf, cnt, dt, op->root, o, out);
        }
        if (op->in_place) {
            rec->rptr = rec->sbuf;
        } else if (op->kind == CH_REDUCE && !root && op->null_nonroot) {
            rec->rptr = NULL;
        } else {
            rec->rbuf = fill_pattern(cnt * es);
            rec->rptr = rec->rbuf;
        }
        rec->rcount = cnt;
        if (op->kind == CH_ALLREDUCE)
            return collie_allreduce(c, rec->sptr, rec->rptr, cnt, dt, op->op, o, out);
        return collie_reduce(c, rec->sptr, rec->rptr, cnt, dt, op->op, op->root, o, out);
    }
    case CH_ALLGATHER:
    case CH_GATHER: {
        rec->bytes = cnt * es * (size_t)n;
        bool has_recv = op->kind == CH_ALLGATHER || root || !op->null_nonroot;
        bool in_place = op->in_place && (op->kind == CH_ALLGATHER || root);
        if (has_recv) {
            rec->rbuf = fill_pattern(cnt * es * (size_t)n);
            rec->rptr = rec->rbuf;
            rec->rcount = cnt * (size_t)n;
        }
        if (in_place) {
            rec->sptr = (uint8_t *)rec->rbuf + (size_t)me * cnt * es;
        } else {
            rec->sbuf = buf_alloc(cnt * es);
            rec->sptr = rec->sbuf;
        }
        ch_fill(op, 0, me, n, 0, cnt, rec->sptr);
        rec->scount = cnt;
        if (op->kind == CH_ALLGATHER)
            return collie_allgather(c, rec->sptr, rec->rptr, cnt, dt, o, out);
        return collie_gather(c, rec->sptr, rec->rptr, cnt, dt, op->root, o, out);
    }
    case CH_SCATTER: {
        rec->bytes = cnt * es;
        if (root || !op->null_nonroot) {
            rec->sbuf = buf_alloc(cnt * es * (size_t)n);
            ch_fill(op, 0, root ? me : op->root, n, 0, cnt * (size_t)n, rec->sbuf);
            if (!root) memset(rec->sbuf, CH_FILL_BYTE, cnt * es * (size_t)n);
            rec->sptr = rec->sbuf;
            rec->scount = root ? cnt * (size_t)n : 0;
        }
        recv_block(rec, root && op->in_place, cnt, es);
        return collie_scatter(c, rec->sptr, rec->rptr, cnt, dt, op->root, o, out);
    }
    case CH_REDUCE_SCATTER: {
        rec->bytes = cnt * es * (size_t)n;
        send_input(rec, cnt * (size_t)n, es);
        recv_block(rec, op->in_place, cnt, es);
        return collie_reduce_scatter(c, rec->sptr, rec->rptr, cnt, dt, op->op, o, out);
    }
    case CH_ALLTOALL: {
        rec->bytes = cnt * es * (size_t)n;
        send_input(rec, cnt * (size_t)n, es);
        rec->rbuf = fill_pattern(cnt * es * (size_t)n);
        rec->rptr = rec->rbuf;
        rec->rcount = cnt * (size_t)n;
        return collie_alltoall(c, rec->sptr, rec->rptr, cnt, dt, o, out);
    }
    case CH_BARRIER: rec->bytes = 0; return collie_barrier(c, o, out);
    case CH_ALLGATHERV: {
        size_t counts[CH_MAX_RANKS], displs[CH_MAX_RANKS];
        size_t total = agv_layout(op, n, me, counts, displs);
        rec->bytes = total * es;
        rec->rbuf = fill_pattern(total * es);
        rec->rptr = rec->rbuf;
        rec->rcount = total;
        if (op->in_place) {
            rec->sptr = (uint8_t *)rec->rbuf + displs[me] * es;
        } else {
            rec->sbuf = buf_alloc(counts[me] * es);
            rec->sptr = rec->sbuf;
        }
        ch_fill(op, 0, me, n, 0, counts[me], rec->sptr);
        rec->scount = counts[me];
        return collie_allgatherv(c, rec->sptr, rec->rptr, counts, op->gaps ? displs : NULL, dt, o,
                                 out);
    }
    case CH_ALLTOALLV: {
        size_t sc[CH_MAX_RANKS], sd[CH_MAX_RANKS], rc[CH_MAX_RANKS], rd[CH_MAX_RANKS];
        size_t stot = a2av_layout(op, n, me, 1, sc, sd);
        size_t rtot = a2av_layout(op, n, me, 2, rc, rd);
        rec->bytes = (stot > rtot ? stot : rtot) * es;
        rec->sbuf = fill_pattern(stot * es);
        for (int d = 0; d < n; d++)
            ch_fill(op, 1 + (uint64_t)d, me, n, 0, sc[d], (uint8_t *)rec->sbuf + sd[d] * es);
        rec->sptr = rec->sbuf;
        rec->scount = stot;
        rec->rbuf = fill_pattern(rtot * es);
        rec->rptr = rec->rbuf;
        rec->rcount = rtot;
        bool packed = !op->gaps;
        return collie_alltoallv(c, rec->sptr, sc, packed ? NULL : sd, rec->rptr, rc,
                                packed ? NULL : rd, dt, o, out);
    }
    case CH_SENDRECV:
    case CH_ANYSRC:
        rec->bytes = cnt * es;
        if (rec->role == CH_ROLE_SEND) {
            rec->sbuf = buf_alloc(cnt * es);
            ch_fill(op, rec->stream, me, n, 0, cnt, rec->sbuf);
            rec->sptr = rec->sbuf;
            rec->scount = cnt;
            return collie_send(c, rec->sptr, cnt, dt, rec->peer, op->tag, o, out);
        }
        rec->rbuf = fill_pattern(cnt * es);
        rec->rptr = rec->rbuf;
        rec->rcount = cnt;
        return collie_recv(c, rec->rptr, cnt, dt, rec->peer, op->tag, o, out);
    default: return COLLIE_EINVAL;
    }
}

/* compare `count` elements at got with want; report the first difference */
static bool cmp(ch_work *rec, ch_report *rep, const char *what, const void *got, const void *want,
                size_t count, size_t base) {
    size_t i = ch_first_diff(want, got, count, rec->op.dt);
    if (i == (size_t)-1) return true;
    char e[64], g[64];
    ch_elem_str(want, i, rec->op.dt, e, sizeof e);
    ch_elem_str(got, i, rec->op.dt, g, sizeof g);
    ch_violation(rep, "wrong_ok", rec->round, rec->op.slot,
                 "op=%s comm=%d n=%d me=%d dtype=%s redop=%s count=%zu root=%d in_place=%d "
                 "role=%d peer=%d %s: first differing index %zu: expected %s got %s",
                 ch_kind_name(rec->op.kind), rec->op.comm, rec->n, rec->me,
                 collie_dtype_name(rec->op.dt), collie_redop_name(rec->op.op), rec->op.count,
                 rec->op.root, rec->op.in_place, rec->role, rec->peer, what, base + i, e, g);
    return false;
}

/* check a region against the input stream of rank r, or the pattern */
static uint64_t cmp_fill(ch_work *rec, ch_report *rep, const char *what, const void *got,
                         uint64_t stream, int r, size_t first, size_t count, size_t base) {
    size_t es = collie_dtype_size(rec->op.dt);
    if (!count) return 0;
    void *want = xalloc(count * es);
    if (r < 0)
        memset(want, CH_FILL_BYTE, count * es);
    else
        ch_fill(&rec->op, stream, r, rec->n, first, count, want);
    cmp(rec, rep, what, got, want, count, base);
    free(want);
    return count * es;
}

static uint64_t cmp_reduce(ch_work *rec, ch_report *rep, const void *got, size_t first,
                           size_t count) {
    size_t es = collie_dtype_size(rec->op.dt);
    if (!count) return 0;
    void *want = xalloc(count * es);
    ch_expect_reduce(&rec->op, rec->n, first, count, want);
    cmp(rec, rep, "reduced output", got, want, count, first);
    free(want);
    return count * es;
}

static const uint8_t *at(const void *p, size_t elems, size_t es) {
    return (const uint8_t *)p + elems * es;
}

uint64_t ch_work_check(ch_work *rec, ch_report *rep) {
    const ch_op *op = &rec->op;
    int n = rec->n, me = rec->me;
    size_t cnt = op->count, es = collie_dtype_size(op->dt);
    bool root = me == op->root;
    uint64_t b = 0;
    /* an untouched send buffer (out of place; in place, the send buffer is
     * the output: checked as such) */
    bool send_sep = rec->sbuf && rec->sptr == rec->sbuf && !op->in_place;
    switch (op->kind) {
    case CH_ALLREDUCE:
        b += cmp_reduce(rec, rep, rec->rptr, 0, cnt);
        if (send_sep) b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, cnt, 0);
        break;
    case CH_REDUCE:
        if (root)
            b += cmp_reduce(rec, rep, rec->rptr, 0, cnt);
        else if (rec->rbuf) /* only the root's receive buffer is collie's to write */
            b += cmp_fill(rec, rep, "non-root receive buffer", rec->rbuf, 0, -1, 0, cnt, 0);
        if (send_sep) b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, cnt, 0);
        break;
    case CH_BROADCAST: b += cmp_fill(rec, rep, "output", rec->rptr, 0, op->root, 0, cnt, 0); break;
    case CH_ALLGATHER:
    case CH_GATHER:
        if (rec->rptr && (op->kind == CH_ALLGATHER || root))
            for (int p = 0; p < n; p++)
                b += cmp_fill(rec, rep, "output block", at(rec->rptr, (size_t)p * cnt, es), 0, p, 0,
                              cnt, (size_t)p * cnt);
        else if (rec->rptr)
            b += cmp_fill(rec, rep, "non-root receive buffer", rec->rptr, 0, -1, 0, cnt * n, 0);
        if (send_sep) b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, cnt, 0);
        break;
    case CH_SCATTER:
        b += cmp_fill(rec, rep, "output", rec->rptr, 0, op->root, (size_t)me * cnt, cnt,
                      (size_t)me * cnt);
        if (root)
            b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, cnt * n, 0);
        else if (rec->sbuf) /* a non-root's (const) send buffer is ignored, never written */
            b += cmp_fill(rec, rep, "non-root send buffer", rec->sbuf, 0, -1, 0, cnt * n, 0);
        break;
    case CH_REDUCE_SCATTER:
        b += cmp_reduce(rec, rep, rec->rptr, (size_t)me * cnt, cnt);
        if (send_sep) {
            b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, cnt * n, 0);
        } else { /* in place: the blocks other than the output stay as they were */
            b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, (size_t)me * cnt, 0);
            size_t after = (size_t)(me + 1) * cnt;
            b += cmp_fill(rec, rep, "send buffer", at(rec->sptr, after, es), 0, me, after,
                          cnt * n - after, after);
        }
        break;
    case CH_ALLTOALL:
        for (int p = 0; p < n; p++)
            b += cmp_fill(rec, rep, "output block", at(rec->rptr, (size_t)p * cnt, es), 0, p,
                          (size_t)me * cnt, cnt, (size_t)p * cnt);
        b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, cnt * n, 0);
        break;
    case CH_BARRIER: break;
    case CH_ALLGATHERV: {
        size_t counts[CH_MAX_RANKS], displs[CH_MAX_RANKS];
        size_t total = agv_layout(op, n, me, counts, displs), off = 0;
        for (int p = 0; p < n; p++) {
            b += cmp_fill(rec, rep, "gap", at(rec->rptr, off, es), 0, -1, 0, displs[p] - off, off);
            b += cmp_fill(rec, rep, "output block", at(rec->rptr, displs[p], es), 0, p, 0,
                          counts[p], displs[p]);
            off = displs[p] + counts[p];
        }
        b += cmp_fill(rec, rep, "gap", at(rec->rptr, off, es), 0, -1, 0, total - off, off);
        if (send_sep) b += cmp_fill(rec, rep, "send buffer", rec->sptr, 0, me, 0, counts[me], 0);
        break;
    }
    case CH_ALLTOALLV: {
        size_t sc[CH_MAX_RANKS], sd[CH_MAX_RANKS], rc[CH_MAX_RANKS], rd[CH_MAX_RANKS];
        a2av_layout(op, n, me, 1, sc, sd);
        size_t rtot = a2av_layout(op, n, me, 2, rc, rd), off = 0;
        for (int p = 0; p < n; p++) {
            b += cmp_fill(rec, rep, "gap", at(rec->rptr, off, es), 0, -1, 0, rd[p] - off, off);
            b += cmp_fill(rec, rep, "output block", at(rec->rptr, rd[p], es), 1 + (uint64_t)me, p,
                          0, rc[p], rd[p]);
            off = rd[p] + rc[p];
            b += cmp_fill(rec, rep, "send block", at(rec->sptr, sd[p], es), 1 + (uint64_t)p, me, 0,
                          sc[p], sd[p]);
        }
        b += cmp_fill(rec, rep, "gap", at(rec->rptr, off, es), 0, -1, 0, rtot - off, off);
        break;
    }
    case CH_SENDRECV:
    case CH_ANYSRC:
        if (rec->role == CH_ROLE_SEND) {
            b += cmp_fill(rec, rep, "send buffer", rec->sptr, rec->stream, me, 0, cnt, 0);
            break;
        }
        if (op->kind == CH_SENDRECV) {
            int src = collie_work_source(rec->w);
            if (src != rec->peer)
                ch_violation(rep, "wrong_ok", rec->round, op->slot,
                             "op=recv comm=%d: collie_work_source says %d, the peer is %d",
                             op->comm, src, rec->peer);
            b += cmp_fill(rec, rep, "received message", rec->rptr, rec->stream, rec->peer, 0, cnt,
                          0);
            break;
        }
        {
            int src = collie_work_source(rec->w);
            ch_anygroup *g = rec->grp;
            g->src[rec->grp_idx] = src;
            g->k[rec->grp_idx] = -1;
            if (src < 0 || src >= n || src == me || !((op->senders >> src) & 1)) {
                ch_violation(rep, "wrong_ok", rec->round, op->slot,
                             "op=recv_any comm=%d n=%d me=%d: collie_work_source says %d, "
                             "not a sender of this tag (senders mask 0x%x)",
                             op->comm, n, me, src, op->senders);
                break;
            }
            /* which of the sender's messages it is (-2: several match, e.g.
             * empty ones: no order check for this receive) */
            void *want = xalloc(cnt * es);
            int matches = 0;
            for (int k = 0; k < op->msgs; k++) {
                ch_fill(op, (uint64_t)k, src, n, 0, cnt, want);
                if (ch_first_diff(want, rec->rptr, cnt, op->dt) == (size_t)-1) {
                    g->k[rec->grp_idx] = matches++ ? -2 : k;
                }
            }
            if (matches == 0) {
                ch_fill(op, 0, src, n, 0, cnt, want);
                cmp(rec, rep, "any-source message (vs the sender's first)", rec->rptr, want, cnt,
                    0);
            }
            free(want);
            b += cnt * es;
        }
        break;
    default: break;
    }
    return b;
}

void ch_group_note(ch_work *rec) {
    ch_anygroup *g = rec->grp;
    if (!g) return;
    g->status[rec->grp_idx] = rec->status;
    if (rec->status != COLLIE_OK) g->src[rec->grp_idx] = collie_work_source(rec->w);
    g->reaped++;
}

void ch_group_finish(ch_anygroup *g, ch_report *rep, int round, int slot) {
    int next[CH_MAX_RANKS];
    memset(next, 0, sizeof next);
    for (int i = 0; i < g->nrecv; i++) {
        int s = g->src[i];
        if (s < 0 || s >= CH_MAX_RANKS) continue;
        if (g->status[i] == COLLIE_OK && g->k[i] >= 0 && g->k[i] != next[s])
            ch_violation(rep, "wrong_ok", round, slot,
                         "op=recv_any: receive %d (post order) holds message %d of rank %d, "
                         "expected its message %d (messages of one sender must go to the "
                         "receives in post order)",
                         i, g->k[i], s, next[s]);
        next[s]++;
        if (next[s] > g->msgs)
            ch_violation(rep, "wrong_ok", round, slot,
                         "op=recv_any: rank %d's messages were received %d times, it sent %d", s,
                         next[s], g->msgs);
    }
    free(g->src);
    free(g->status);
    free(g->k);
    free(g);
}

void ch_work_guards(ch_work *rec, ch_report *rep) {
    void *bufs[2] = {rec->sbuf, rec->rbuf};
    for (int i = 0; i < 2; i++) {
        long where = 0;
        if (bufs[i] && !buf_guard_ok(bufs[i], &where))
            ch_violation(rep, "overrun", rec->round, rec->op.slot,
                         "op=%s comm=%d n=%d me=%d dtype=%s count=%zu root=%d in_place=%d role=%d "
                         "peer=%d status=%s: the %s buffer's guard changed at byte offset %ld "
                         "(the library wrote outside the buffer it was given)",
                         ch_kind_name(rec->op.kind), rec->op.comm, rec->n, rec->me,
                         collie_dtype_name(rec->op.dt), rec->op.count, rec->op.root,
                         rec->op.in_place, rec->role, rec->peer, collie_status_name(rec->status),
                         i == 0 ? "send" : "receive", where);
    }
}

void ch_work_free(ch_work *rec) {
    buf_free(rec->sbuf);
    buf_free(rec->rbuf);
    rec->sbuf = rec->rbuf = NULL;
}
