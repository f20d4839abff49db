/*
 * sched_ring.c — bandwidth-bound algorithms over the ring r → r+1:
 * allreduce (reduce-scatter then allgather), allgather, reduce_scatter.
 *
 * Design notes
 *  - Each step sends one chunk to r+1 and receives another from r-1; the
 *    chunk sent is never the one written in that step, so the two run
 *    concurrently without a hazard. One op per chunk per step: the executor
 *    pipelines inside an op.
 *  - Allreduce needs no initial copy when not in place: the first
 *    reduce-scatter step sends chunk r straight from SEND, and every chunk
 *    of RECV is first written by RECV_REDUCE3 (RECV = received op SEND).
 *    Chunk r of RECV is written last, by the allgather. With AVG each rank
 *    divides only the chunk it finished, between the two phases (a
 *    local-only step at the same index on every rank), so every element is
 *    divided once and all ranks receive identical bytes.
 *  - Reduce_scatter never writes SEND (it may be const): partial sums
 *    travel through two alternating chunk-sized SCRATCH areas (one is sent
 *    while the other is received into), and the last step reduces into
 *    RECV. In place (recvbuf == sendbuf + r*block) the last step is a
 *    RECV_REDUCE over the own block, which the earlier steps never read.
 *  - Chunks are element aligned (cl_sched_chunk); empty chunks (count <
 *    size) are skipped identically at both ends.
 */
#include "transports/cpu/sched_impl.h"

void cl_sched_allreduce_ring(cl_sched_b *b) {
    int n = b->size, r = b->rank, next = (r + 1) % n, prev = cl_sched_mod(r - 1, n);
    uint64_t count = b->a->count, off, len;
    bool inplace = b->a->sendbuf == b->a->recvbuf;

    /* reduce-scatter: after step s, chunk r-s-1 holds s+2 contributions */
    for (int s = 0; s < n - 1; s++) {
        cl_sched_step(b);
        cl_sched_chunk(b, count, n, cl_sched_mod(r - s, n), &off, &len);
        cl_sched_send(b, next, s == 0 && !inplace ? CL_SBUF_SEND : CL_SBUF_RECV, off, len);
        cl_sched_chunk(b, count, n, cl_sched_mod(r - s - 1, n), &off, &len);
        if (inplace)
            cl_sched_recv_reduce(b, prev, CL_SBUF_RECV, off, len);
        else
            cl_sched_recv_reduce3(b, prev, CL_SBUF_RECV, off, CL_SBUF_SEND, off, len);
    }
    /* rank r now owns the fully reduced chunk r+1 */
    cl_sched_chunk(b, count, n, next, &off, &len);
    if (b->a->op == COLLIE_AVG) {
        cl_sched_step(b); /* on every rank, even one whose chunk is empty */
        cl_sched_avg(b, CL_SBUF_RECV, off, len);
    }

    /* allgather: pass the finished chunks around */
    for (int t = 0; t < n - 1; t++) {
        cl_sched_step(b);
        cl_sched_chunk(b, count, n, cl_sched_mod(r + 1 - t, n), &off, &len);
        cl_sched_send(b, next, CL_SBUF_RECV, off, len);
        cl_sched_chunk(b, count, n, cl_sched_mod(r - t, n), &off, &len);
        cl_sched_recv(b, prev, CL_SBUF_RECV, off, len);
    }
}

void cl_sched_allgather_ring(cl_sched_b *b) {
    int n = b->size, r = b->rank, next = (r + 1) % n, prev = cl_sched_mod(r - 1, n);
    uint64_t B = b->bytes;
    bool inplace = cl_sched_at(b->a->sendbuf, b->a->recvbuf, (uint64_t)r * B);
    for (int t = 0; t < n - 1; t++) {
        cl_sched_step(b);
        if (t == 0 && !inplace) {
            /* own block: copied into place and sent, both from SEND */
            cl_sched_copy(b, CL_SBUF_RECV, (uint64_t)r * B, CL_SBUF_SEND, 0, B);
            cl_sched_send(b, next, CL_SBUF_SEND, 0, B);
        } else {
            cl_sched_send(b, next, CL_SBUF_RECV, (uint64_t)cl_sched_mod(r - t, n) * B, B);
        }
        cl_sched_recv(b, prev, CL_SBUF_RECV, (uint64_t)cl_sched_mod(r - t - 1, n) * B, B);
    }
}

void cl_sched_reduce_scatter_ring(cl_sched_b *b) {
    int n = b->size, r = b->rank, next = (r + 1) % n, prev = cl_sched_mod(r - 1, n);
    uint64_t B = b->bytes;
    bool inplace = cl_sched_at(b->a->recvbuf, b->a->sendbuf, (uint64_t)r * B);
    /* step s: send the partial of block r-s-1, receive that of block r-s-2 */
    for (int s = 0; s < n - 1; s++) {
        cl_sched_step(b);
        if (s == 0)
            cl_sched_send(b, next, CL_SBUF_SEND, (uint64_t)cl_sched_mod(r - 1, n) * B, B);
        else
            cl_sched_send(b, next, CL_SBUF_SCRATCH, (uint64_t)((s - 1) % 2) * B, B);
        uint64_t blk = (uint64_t)cl_sched_mod(r - s - 2, n) * B;
        if (s < n - 2)
            cl_sched_recv_reduce3(b, prev, CL_SBUF_SCRATCH, (uint64_t)(s % 2) * B, CL_SBUF_SEND,
                                  blk, B);
        else if (inplace)
            cl_sched_recv_reduce(b, prev, CL_SBUF_RECV, 0, B);
        else
            cl_sched_recv_reduce3(b, prev, CL_SBUF_RECV, 0, CL_SBUF_SEND, blk, B);
    }
    cl_sched_avg_step(b, CL_SBUF_RECV, 0, B);
}
