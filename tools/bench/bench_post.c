/*
 * bench_post.c — collie-bench's posting and waiting on collie: one op on host
 * or CUDA buffers, the barrier and the statistics' allreduces on the cpu
 * backend, and the copies to and from the device (the calls bench_row.c's
 * rows make; bench/mpi_bench.c has the same calls on MPI).
 *
 * Design notes
 *  - Receive buffers: collie runs a comm's works concurrently, each on its
 *    own schedule step (transports/cpu/tcp_exec.c), so works in flight must
 *    not share a receive buffer: two reduces accumulating into one buffer
 *    double-count (a CUDA stream would serialise them; collie does not).
 *    Work i of a loop of depth d receives into slot i % d of one arena of at
 *    most BENCH_ARENA_BYTES (or one slot of the largest size); the depth of
 *    the batch and of --inflight is capped by the slots that fit at that
 *    size (in place a slot holds the larger buffer), and the table says so
 *    when it is. Send buffers are only read, so all works share one.
 *    Everything is allocated once, for the largest size, and touched before
 *    timing; nothing of ours is allocated per iteration.
 *  - Every wait is bounded by the op's deadline (--timeout-ms) plus
 *    BENCH_WAIT_SLACK_MS; a failed post or work is reported here, once, by
 *    the rank that saw it.
 */
#include <stdio.h>

#include "bench.h"

void bench_post_failed(bench *b, bench_op op, const bench_counts *k, int res) {
    const char *why = collie_last_error();
    fprintf(stderr, "collie-bench: rank %d: %s of %zu bytes: post failed: %s (%s)\n", b->rank,
            bench_op_names[op], k->bytes, *why ? why : collie_strerror(res),
            collie_status_name(res));
}

/* Post op on the CUDA buffers and stream (collie_cuda.h). */
static int bench_post_cuda(bench *b, bench_op op, const bench_counts *k, void *s, void *r,
                           collie_work **w) {
    collie_comm *c = b->comm;
    collie_dtype dt = b->dt;
    collie_redop rop = b->redop;
    collie_cuda_stream_t st = b->cu.stream;
    size_t n = k->param;
    int root = b->root;
    switch (op) {
    case BENCH_ALLREDUCE: return collie_cuda_allreduce(c, s, r, n, dt, rop, st, &b->po, w);
    case BENCH_BROADCAST: return collie_cuda_broadcast(c, r, n, dt, root, st, &b->po, w);
    case BENCH_REDUCE: return collie_cuda_reduce(c, s, r, n, dt, rop, root, st, &b->po, w);
    case BENCH_ALLGATHER: return collie_cuda_allgather(c, s, r, n, dt, st, &b->po, w);
    case BENCH_REDUCE_SCATTER:
        return collie_cuda_reduce_scatter(c, s, r, n, dt, rop, st, &b->po, w);
    case BENCH_ALLTOALL: return collie_cuda_alltoall(c, s, r, n, dt, st, &b->po, w);
    case BENCH_GATHER: return collie_cuda_gather(c, s, r, n, dt, root, st, &b->po, w);
    case BENCH_SCATTER: return collie_cuda_scatter(c, s, r, n, dt, root, st, &b->po, w);
    case BENCH_ALLGATHERV:
        return collie_cuda_allgatherv(c, s, r, b->vrecv, NULL, dt, st, &b->po, w);
    case BENCH_ALLTOALLV:
        return collie_cuda_alltoallv(c, s, b->vsend, NULL, r, b->vrecv, NULL, dt, st, &b->po, w);
    default: return collie_cuda_barrier(c, st, &b->po, w);
    }
}

static int bench_post_host(bench *b, bench_op op, const bench_counts *k, void *s, void *r,
                           collie_work **w) {
    collie_comm *c = b->comm;
    collie_dtype dt = b->dt;
    collie_redop rop = b->redop;
    size_t n = k->param;
    int root = b->root;
    switch (op) {
    case BENCH_ALLREDUCE: return collie_allreduce(c, s, r, n, dt, rop, &b->po, w);
    case BENCH_BROADCAST: return collie_broadcast(c, r, n, dt, root, &b->po, w);
    case BENCH_REDUCE: return collie_reduce(c, s, r, n, dt, rop, root, &b->po, w);
    case BENCH_ALLGATHER: return collie_allgather(c, s, r, n, dt, &b->po, w);
    case BENCH_REDUCE_SCATTER: return collie_reduce_scatter(c, s, r, n, dt, rop, &b->po, w);
    case BENCH_ALLTOALL: return collie_alltoall(c, s, r, n, dt, &b->po, w);
    case BENCH_GATHER: return collie_gather(c, s, r, n, dt, root, &b->po, w);
    case BENCH_SCATTER: return collie_scatter(c, s, r, n, dt, root, &b->po, w);
    case BENCH_ALLGATHERV: return collie_allgatherv(c, s, r, b->vrecv, NULL, dt, &b->po, w);
    case BENCH_ALLTOALLV:
        return collie_alltoallv(c, s, b->vsend, NULL, r, b->vrecv, NULL, dt, &b->po, w);
    default: return collie_barrier(c, &b->po, w);
    }
}

int bench_post(bench *b, bench_op op, const bench_counts *k, size_t slot, bool inplace, size_t i) {
    void *s, *r;
    collie_work **w = &b->works[i];
    if (b->o->cuda)
        bench_call_bufs(b, op, k, b->cu.send, b->cu.arena, slot, inplace, &s, &r);
    else
        bench_call_bufs(b, op, k, b->sendbuf, b->arena, slot, inplace, &s, &r);
    int res = b->o->cuda ? bench_post_cuda(b, op, k, s, r, w) : bench_post_host(b, op, k, s, r, w);
    if (res != COLLIE_OK) {
        bench_post_failed(b, op, k, res);
        if (res == COLLIE_ENOTSUP && !b->o->cuda)
            fprintf(stderr,
                    "collie-bench: it posts on CPU buffers, and backend spec '%s' has no "
                    "cpu backend\n",
                    b->o->spec);
    }
    return res;
}

/* Wait for b->works[i] (bounded) and release it. */
int bench_wait(bench *b, size_t i, bench_op op, const bench_counts *k) {
    collie_work *w = b->works[i];
    int res = collie_work_wait(w, b->o->timeout_ms + BENCH_WAIT_SLACK_MS);
    if (res != COLLIE_OK) {
        const char *msg = collie_work_error_message(w);
        if (res == COLLIE_INPROGRESS)
            fprintf(stderr,
                    "collie-bench: rank %d: %s of %zu bytes did not complete within %d ms "
                    "(its deadline is %d ms)\n",
                    b->rank, bench_op_names[op], k->bytes, b->o->timeout_ms + BENCH_WAIT_SLACK_MS,
                    b->o->timeout_ms);
        else
            fprintf(stderr, "collie-bench: rank %d: %s of %zu bytes failed: %s (%s)\n", b->rank,
                    bench_op_names[op], k->bytes, *msg ? msg : collie_strerror(res),
                    collie_status_name(res));
        return res == COLLIE_INPROGRESS ? COLLIE_ETIMEDOUT : res;
    }
    collie_work_release(w);
    b->works[i] = NULL;
    return COLLIE_OK;
}

/* A barrier on the CPU backend, also with CUDA buffers. */
int bench_sync(bench *b) {
    bench_counts none = {0, 0, 0, 0};
    int res = collie_barrier(b->comm, &b->po, &b->works[0]);
    if (res != COLLIE_OK) {
        bench_post_failed(b, BENCH_BARRIER, &none, res);
        if (res == COLLIE_ENOTSUP)
            fprintf(stderr, "collie-bench: backend spec '%s' has no cpu backend\n", b->o->spec);
        return res;
    }
    return bench_wait(b, 0, BENCH_BARRIER, &none);
}

/* An allreduce of `n` values of the statistics (host buffers, cpu backend). */
int bench_combine(bench *b, void *buf, size_t n, collie_dtype dt, collie_redop op) {
    bench_counts st = {n, n, n, n * collie_dtype_size(dt)};
    int res = collie_allreduce(b->comm, buf, buf, n, dt, op, &b->po, &b->works[0]);
    if (res != COLLIE_OK) {
        bench_post_failed(b, BENCH_ALLREDUCE, &st, res);
        return res;
    }
    return bench_wait(b, 0, BENCH_ALLREDUCE, &st);
}

/* ---- CUDA buffers ---------------------------------------------------------- */

int bench_cuda_failed(const bench *b, const char *call, int e) {
    fprintf(stderr, "collie-bench: rank %d: %s: %s\n", b->rank, call, b->cu.GetErrorString(e));
    return COLLIE_EBACKEND;
}

/* Copy the send buffer's first `send` bytes and the first `slots` receive
 * slots between host and device (all works on them have completed). */
int bench_cuda_copy(bench *b, int kind, size_t send, size_t slots) {
    bool up = kind == BENCH_CUDA_TO_DEVICE;
    size_t len = slots * b->slot_bytes;
    int e = 0;
    if (send)
        e = up ? b->cu.Memcpy(b->cu.send, b->sendbuf, send, kind)
               : b->cu.Memcpy(b->sendbuf, b->cu.send, send, kind);
    if (!e && len)
        e = up ? b->cu.Memcpy(b->cu.arena, b->arena, len, kind)
               : b->cu.Memcpy(b->arena, b->cu.arena, len, kind);
    return e ? bench_cuda_failed(b, "cudaMemcpy", e) : COLLIE_OK;
}
