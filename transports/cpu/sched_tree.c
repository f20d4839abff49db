/*
 * sched_tree.c — latency-bound algorithms: recursive-doubling allreduce,
 * binomial broadcast and binomial reduce.
 *
 * Design notes
 *  - Recursive doubling sends its partial result and receives the
 *    partner's in the same step, so the two cannot share a buffer: the
 *    partial ping-pongs between RECV and SCRATCH (RECV_REDUCE3: new =
 *    received op old), starting from SEND when not in place, with the
 *    first destination picked so the last reduction lands in RECV. Only in
 *    place with an odd number of reductions is a final copy needed.
 *  - Both partners of an exchange compute a op b and b op a; every redop is
 *    commutative, so all ranks end with bitwise identical results.
 *  - Ranks beyond the largest power of two p fold in first (even rank 2i
 *    hands its data to 2i+1 and sits out) and get the result back in a
 *    final fold-out step (MPICH's scheme).
 *  - Trees use root-relative ranks v = (r - root) mod n. Broadcast doubles
 *    the informed set each step (step k: v < 2^k sends to v + 2^k); reduce
 *    is its mirror image (step k: v with bit k set sends to v - 2^k).
 *    Non-root reduce ranks accumulate in SCRATCH (their RECV is unused),
 *    the root in RECV; leaves send straight from SEND.
 */
#include "transports/cpu/sched_impl.h"

/* sched_rd_peer: comm rank of the rank whose post-fold rank is v. */
static int sched_rd_peer(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

/* sched_rd_reduce: receive from peer and reduce with the partial at *cur
 * into the other buffer; `left` counts the reductions still to do
 * (including this one) so a first reduction out of SEND can aim for the
 * parity that ends in RECV. */
static void sched_rd_reduce(cl_sched_b *b, int peer, int *cur, int *left) {
    int dst;
    if (*cur == CL_SBUF_RECV)
        dst = CL_SBUF_SCRATCH;
    else if (*cur == CL_SBUF_SCRATCH)
        dst = CL_SBUF_RECV;
    else
        dst = (*left % 2) ? CL_SBUF_RECV : CL_SBUF_SCRATCH;
    cl_sched_recv_reduce3(b, peer, dst, 0, *cur, 0, b->bytes);
    *cur = dst;
    (*left)--;
}

void cl_sched_allreduce_rd(cl_sched_b *b) {
    int n = b->size, r = b->rank;
    uint64_t B = b->bytes;
    int p = 1, lg = 0;
    while (p * 2 <= n)
        p *= 2, lg++;
    int rem = n - p;
    bool folded = r < 2 * rem;        /* takes part in the fold steps */
    bool idle = folded && r % 2 == 0; /* sits out the doubling */
    int v = folded ? r / 2 : r - rem; /* rank among the p doubling ranks */
    int cur = b->a->sendbuf == b->a->recvbuf ? CL_SBUF_RECV : CL_SBUF_SEND;
    int left = idle ? 0 : lg + (folded ? 1 : 0);

    if (rem > 0) {
        cl_sched_step(b);
        if (idle)
            cl_sched_send(b, r + 1, cur, 0, B);
        else if (folded)
            sched_rd_reduce(b, r - 1, &cur, &left);
    }
    for (int mask = 1; mask < p; mask <<= 1) {
        cl_sched_step(b);
        if (idle) continue;
        int peer = sched_rd_peer(v ^ mask, rem);
        cl_sched_send(b, peer, cur, 0, B);
        sched_rd_reduce(b, peer, &cur, &left);
    }
    if (rem > 0 || cur != CL_SBUF_RECV) cl_sched_step(b);
    if (idle) {
        cl_sched_recv(b, r + 1, CL_SBUF_RECV, 0, B);
    } else {
        if (folded) cl_sched_send(b, r - 1, cur, 0, B);
        cl_sched_copy(b, CL_SBUF_RECV, 0, cur, 0, B); /* no-op when cur is RECV */
    }
    cl_sched_avg_step(b, CL_SBUF_RECV, 0, B);
}

void cl_sched_broadcast_binomial(cl_sched_b *b) {
    int n = b->size, r = b->rank, root = b->a->root;
    uint64_t B = b->bytes;
    int v = cl_sched_mod(r - root, n);
    /* the root sends from SEND if the caller gave a separate one */
    bool own_send = r == root && b->a->sendbuf != NULL && b->a->sendbuf != b->a->recvbuf;
    int src = own_send ? CL_SBUF_SEND : CL_SBUF_RECV;
    for (int m = 1; m < n; m <<= 1) {
        cl_sched_step(b);
        if (own_send && m == 1) cl_sched_copy(b, CL_SBUF_RECV, 0, CL_SBUF_SEND, 0, B);
        if (v < m) {
            if (v + m < n) cl_sched_send(b, (v + m + root) % n, src, 0, B);
        } else if (v < 2 * m) {
            cl_sched_recv(b, (v - m + root) % n, CL_SBUF_RECV, 0, B);
        }
    }
}

void cl_sched_reduce_binomial(cl_sched_b *b) {
    int n = b->size, r = b->rank, root = b->a->root;
    uint64_t B = b->bytes;
    int v = cl_sched_mod(r - root, n);
    int acc = r == root ? CL_SBUF_RECV : CL_SBUF_SCRATCH;
    int cur = r == root && b->a->sendbuf == b->a->recvbuf ? CL_SBUF_RECV : CL_SBUF_SEND;
    for (int m = 1; m < n; m <<= 1) {
        cl_sched_step(b);
        if (v & m) {
            cl_sched_send(b, (v - m + root) % n, cur, 0, B);
            return; /* a rank sends once, then is done */
        }
        if (v + m >= n) continue;
        int child = (v + m + root) % n;
        if (cur == acc) {
            cl_sched_recv_reduce(b, child, acc, 0, B);
        } else {
            cl_sched_recv_reduce3(b, child, acc, 0, cur, 0, B);
            cur = acc;
        }
    }
    /* only the root gets here; with n > 1 it has a child, so cur == RECV */
    cl_sched_avg_step(b, CL_SBUF_RECV, 0, B);
}
