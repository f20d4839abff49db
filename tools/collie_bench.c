/*
 * collie_bench.c — collie-bench: sweeps message sizes for each collective
 * and prints nccl-tests' table (size count type redop root, out-of-place and
 * in-place time algbw busbw #wrong) plus collie's latency and ops/s. Run it
 * under the launcher:
 *
 *   collie-run -n N -- collie-bench [-t T] [--backend SPEC] [--op LIST|all]
 *       [--sizes LIST | -b MIN -e MAX -f F] [-d T|all] [-o R|all] [-r R|all]
 *       [-n N] [-w N] [--inflight K] [-c N] [--csv] [--timeout-ms T]
 *
 * The command line is tools/bench/bench_args.c, the data of --check
 * tools/bench/bench_data.c.
 *
 * Design notes
 *  - Sizes follow nccl-tests exactly (its *GetCollByteCount): a requested
 *    size S gives count = S / sizeof(dtype); allreduce, broadcast and reduce
 *    pass that count; allgather, gather, reduce_scatter, alltoall and scatter
 *    pass base = (count / nranks) rounded down to a multiple of 16 bytes, so
 *    their largest buffer holds base * nranks elements. The size column is
 *    the op's largest buffer (max of send and receive bytes), count the
 *    count argument of the call. algbw is size / time and busbw = algbw *
 *    factor (allreduce 2(n-1)/n; broadcast and reduce 1; allgather,
 *    reduce_scatter, alltoall, gather, scatter (n-1)/n). The barrier has no
 *    size: one row, size 0, no bandwidth. allgatherv and alltoallv (not in
 *    nccl-tests) take allgather's and alltoall's sizes and factor, the
 *    whole buffer split unevenly (bench_v_count), count the whole buffer.
 *  - A row is (op, dtype, redop, root, size); nccl-tests' loops: per op,
 *    per dtype, per reduction (reducing ops), per root (rooted ops), per
 *    size. Timings per row, each after a barrier: out of place, time (nccl-
 *    tests): `iters` ops posted back to back, then waited; the per-op mean,
 *    averaged over ranks (nccl-tests' default -a 1). lat_us: `iters` times
 *    post one op and wait for it; the per-op times of all ranks are reduced
 *    with one MAX allreduce after the loop (nothing is exchanged inside it)
 *    and the median is reported. ops/s (--inflight K): `iters` ops with K in
 *    flight; iters / the slowest rank's elapsed time. In place: the batch
 *    again with sendbuf == recvbuf (collie.h's in-place forms); alltoall and
 *    scatter have none (N/A), broadcast has one buffer (both columns time
 *    the same call).
 *  - Receive buffers: collie runs a comm's works concurrently, each on its
 *    own schedule step (transports/tcp/tcp_exec.c), so works in flight must
 *    not share a receive buffer: two reduces accumulating into one buffer
 *    double-count (a CUDA stream would serialise them; collie does not).
 *    Work i of a loop of depth d receives into slot i % d of one arena of at
 *    most BENCH_ARENA_BYTES (or one slot of the largest size); the depth of
 *    the batch and of --inflight is capped by the slots that fit at that
 *    size (in place a slot holds the larger buffer), and the table says so
 *    when it is. Send buffers are only read, so all works share one.
 *    Everything is allocated once, for the largest size, and touched before
 *    timing; nothing of ours is allocated per iteration.
 *  - --check: out of place, slot 0 is poisoned before the first op and
 *    checked after it; after the timed loops every slot used is checked (it
 *    holds the result of the last work that received into it). In place,
 *    the input is put where the call reads it and one op is checked (the
 *    timed in-place ops then reduce their own results: their values are not
 *    checked, as in nccl-tests). Every wrong element is counted; the counts
 *    are summed over ranks (one SUM allreduce per row) into #wrong, and the
 *    run goes on: the last lines say "Out of bounds values: N FAILED" and
 *    every rank exits 1 together (no rank is left waiting for one that quit).
 *  - --threads T (nccl-tests' -t): a process runs T ranks, one thread each
 *    (thread 0 on the main thread); rank = process rank * T + thread, world
 *    size = processes * T. A rank in a thread is a rank in a process minus
 *    the address space: its own engine (progress thread), store connection,
 *    comm, buffers, work array, CUDA stream and device (rank % devices), so
 *    -n 4 and -n 2 -t 2 time the same thing, and memory per process grows T
 *    times. Only the parsed options and where the process sits in the world
 *    (bench_proc) are shared, read-only. Ranks in threads are what lets the
 *    CPU double of CUDA and NCCL, whose ranks meet only inside one process,
 *    run a multi-rank --backend nccl.
 *  - Errors: a failed post prints collie_last_error(), a failed work its
 *    collie_work_error_message(); the comm is aborted and the rank exits 1
 *    (a process of several ranks exits 1 if any of them failed). A rank that
 *    fails also aborts the comms of the other ranks of its process, as
 *    collie-run stops the other processes, so none of them waits out a
 *    deadline for it; comms are created with collie_comm_create_post and
 *    published at once, so one still in its rendezvous can be aborted too.
 *    Wrong results are not such a failure: every rank learns them together.
 *    Every op carries --timeout-ms as its deadline (post options and comm
 *    default), and every wait is additionally bounded by that plus a slack.
 *    Creating the comm waits for every rank to start, so its bound is
 *    --timeout-ms but at least BENCH_CREATE_TMO_MS (plus the slack).
 *  - Output: only rank 0 (thread 0 of process 0) prints results, and only
 *    process 0 --help (one table under collie-run); every rank reports its
 *    own errors on stderr. --csv prints exactly one header line and the
 *    rows, in collie's own columns (the peers of bench/peers.sh print the
 *    same). Exit 0 ok, 1 error or wrong results, 2 usage.
 *  - A spec with a cuda backend ("nccl", "cuda:X"): the timed ops run on
 *    CUDA buffers through collie_cuda.h on the bench's own stream, waited
 *    with collie_work_wait; libcudart.so.13 is dlopen'ed (no CUDA headers or
 *    link dependency) after the comm exists, so a missing plugin or device
 *    is the comm's error. Host buffers stay as staging for --check
 *    (cudaMemcpy up before, down after). Barriers between timings and the
 *    statistics allreduces run on the cpu backend: a spec without one gets
 *    "cpu:auto," in front.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"

#define BENCH_WAIT_SLACK_MS  5000  /* wait bound beyond the op deadline */
#define BENCH_CREATE_TMO_MS  60000 /* comm creation: at least this */
#define BENCH_CUDA_TO_DEVICE 1
#define BENCH_CUDA_TO_HOST   2

/* nccl-tests' busbw factors (its *GetBw). */
static double bench_busbw_factor(bench_op op, int n) {
    switch (op) {
    case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
    case BENCH_BROADCAST:
    case BENCH_REDUCE: return 1.0;
    case BENCH_BARRIER: return 0.0;
    default: return (double)(n - 1) / n;
    }
}

/* collie.h has an in-place form of op (broadcast: its only form). */
static bool bench_has_inplace(bench_op op) {
    return op != BENCH_ALLTOALL && op != BENCH_SCATTER && op != BENCH_ALLTOALLV &&
           op != BENCH_BARRIER;
}

static size_t bench_min(size_t a, size_t b) { return a < b ? a : b; }

static int64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- posting and waiting ------------------------------------------------- */

static void bench_post_failed(bench *b, bench_op op, const bench_counts *k, int res) {
    const char *why = collie_last_error();
    fprintf(stderr, "collie-bench: rank %d: %s of %zu bytes: post failed: %s (%s)\n", b->rank,
            bench_op_names[op], k->bytes, *why ? why : collie_strerror(res),
            collie_status_name(res));
}

/* The buffers of the call receiving into `slot` (host or device): out of
 * place the shared send buffer; in place as collie.h's in-place forms. */
static void bench_bufs(const bench *b, bench_op op, const bench_counts *k, size_t slot,
                       bool inplace, void **s, void **r) {
    unsigned char *at = (b->o->cuda ? b->cu.arena : b->arena) + slot * b->slot_bytes;
    size_t at_rank = (size_t)b->rank * k->param * b->es;
    *s = b->o->cuda ? b->cu.send : b->sendbuf;
    *r = at;
    if (!inplace) return;
    switch (op) {
    case BENCH_ALLGATHER:
    case BENCH_GATHER: *s = at + at_rank; break;
    case BENCH_ALLGATHERV:
        *s = at + bench_v_offset(op, k->param, b->size, b->rank, 0) * b->es;
        break;
    case BENCH_REDUCE_SCATTER:
        *s = at;
        *r = at + at_rank;
        break;
    default: *s = at; break;
    }
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

static int bench_post(bench *b, bench_op op, const bench_counts *k, size_t slot, bool inplace,
                      collie_work **w) {
    void *s, *r;
    bench_bufs(b, op, k, slot, inplace, &s, &r);
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
static int bench_wait(bench *b, size_t i, bench_op op, const bench_counts *k) {
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

/* Run `total` ops with up to `depth` in flight: post `depth`, then post
 * another each time the oldest completes. Work i receives into slot
 * i % depth, which work i - depth (the oldest, waited for) has left, so
 * works in flight never share a receive buffer. *elapsed (if not NULL)
 * gets the seconds taken. */
static int bench_ring(bench *b, bench_op op, const bench_counts *k, size_t total, size_t depth,
                      bool inplace, double *elapsed) {
    size_t posted = 0, done = 0;
    int64_t t0 = bench_now_ns();
    while (done < total) {
        while (posted < total && posted - done < depth) {
            int res = bench_post(b, op, k, posted % depth, inplace, &b->works[posted % depth]);
            if (res != COLLIE_OK) return res;
            posted++;
        }
        int res = bench_wait(b, done % depth, op, k);
        if (res != COLLIE_OK) return res;
        done++;
    }
    if (elapsed) *elapsed = (double)(bench_now_ns() - t0) / 1e9;
    return COLLIE_OK;
}

static int bench_one(bench *b, bench_op op, const bench_counts *k, bool inplace) {
    return bench_ring(b, op, k, 1, 1, inplace, NULL);
}

/* A barrier on the CPU backend, also with CUDA buffers. */
static int bench_sync(bench *b) {
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
static int bench_combine(bench *b, void *buf, size_t n, collie_dtype dt, collie_redop op) {
    bench_counts st = {n, n, n, n * collie_dtype_size(dt)};
    int res = collie_allreduce(b->comm, buf, buf, n, dt, op, &b->po, &b->works[0]);
    if (res != COLLIE_OK) {
        bench_post_failed(b, BENCH_ALLREDUCE, &st, res);
        return res;
    }
    return bench_wait(b, 0, BENCH_ALLREDUCE, &st);
}

/* ---- CUDA buffers ---------------------------------------------------------- */

static int bench_cuda_failed(const bench *b, const char *call, int e) {
    fprintf(stderr, "collie-bench: rank %d: %s: %s\n", b->rank, call, b->cu.GetErrorString(e));
    return COLLIE_EBACKEND;
}

/* Copy the send buffer's first `send` bytes and the first `slots` receive
 * slots between host and device (all works on them have completed). */
static int bench_cuda_copy(bench *b, int kind, size_t send, size_t slots) {
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

/* ---- the table ------------------------------------------------------------------ */

/* nccl-tests' time format: fewer decimals as the time grows. */
static void bench_fmt_time(char *buf, size_t len, double us) {
    snprintf(buf, len, us >= 10000.0 ? "%.0f" : us >= 100.0 ? "%.1f" : "%.2f", us);
}

static void bench_print_header(bench *b) {
    const bench_opts *o = b->o;
    if (o->csv) {
        printf("op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n");
        fflush(stdout);
        return;
    }
    char layout[64] = "", inflight[32] = "off";
    if (o->threads > 1)
        snprintf(layout, sizeof layout, " (%d process%s x %d threads)", b->proc->nprocs,
                 b->proc->nprocs == 1 ? "" : "es", o->threads);
    if (o->inflight) snprintf(inflight, sizeof inflight, "%d", o->inflight);
    size_t lo = o->sizes[0], hi = o->sizes[0];
    for (size_t i = 1; i < o->nsizes; i++) {
        lo = bench_min(lo, o->sizes[i]);
        hi = o->sizes[i] > hi ? o->sizes[i] : hi;
    }
    printf("# collie-bench %s: backend %s, %d ranks%s%s\n", collie_version_string(), o->spec,
           b->size, layout, o->cuda ? ", CUDA buffers" : "");
    printf("# minBytes %zu maxBytes %zu (%zu sizes) warmup iters: %d iters: %d inflight: %s "
           "validation: %d op timeout: %d ms\n",
           lo, hi, o->nsizes, o->warmup, o->iters, inflight, o->check ? 1 : 0, o->timeout_ms);
    printf("# columns as nccl-tests' (size: the op's largest buffer; time: per-op mean of iters\n"
           "# back-to-back ops, averaged over ranks; algbw = size/time; busbw = algbw * its\n"
           "# factor); collie's own: lat_us, the median of one op posted and waited alone (the\n"
           "# slowest rank), and ops/s with --inflight ops in flight\n");
    fflush(stdout);
}

/* The column heads, before each collective's rows. */
static void bench_print_heads(bench_op op) {
    printf("#\n# %s\n", bench_op_names[op]);
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
           "                 collie\n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %9s  %10s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
           "busbw", "#wrong", "lat_us", "ops/s");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %9s  %10s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "",
           "(us)", "");
}

/* time, algbw, busbw and #wrong of one placement ("N/A" where none). */
typedef struct bench_cols {
    char time[16], algbw[16], busbw[16], wrong[24];
} bench_cols;

static bench_cols bench_placement(const bench *b, bench_op op, const bench_counts *k, bool ran,
                                  double time_s, int64_t wrong) {
    bench_cols c = {"N/A", "N/A", "N/A", "N/A"};
    if (!ran) return c;
    double algbw = time_s > 0 ? (double)k->bytes / 1e9 / time_s : 0;
    bench_fmt_time(c.time, sizeof c.time, time_s * 1e6);
    snprintf(c.algbw, sizeof c.algbw, "%.2f", algbw);
    snprintf(c.busbw, sizeof c.busbw, "%.2f", algbw * bench_busbw_factor(op, b->size));
    if (b->o->check && op != BENCH_BARRIER) snprintf(c.wrong, sizeof c.wrong, "%" PRId64, wrong);
    return c;
}

static void bench_print_row(bench *b, bench_op op, const bench_counts *k, double lat_s,
                            double ops_s) {
    bool bw = op != BENCH_BARRIER;
    double algbw = b->avg[0] > 0 ? (double)k->bytes / 1e9 / b->avg[0] : 0;
    double busbw = algbw * bench_busbw_factor(op, b->size);
    if (bw) {
        b->busbw_sum += busbw;
        b->busbw_rows++;
    }
    if (b->o->csv) {
        printf("%s,%zu,%d,%.3f,", bench_op_names[op], k->bytes, b->size, lat_s * 1e6);
        if (bw)
            printf("%.6f,%.6f", algbw, busbw);
        else
            printf(",");
        if (b->o->inflight)
            printf(",%.1f\n", ops_s);
        else
            printf(",\n");
        fflush(stdout);
        return;
    }
    bench_cols out = bench_placement(b, op, k, true, b->avg[0], b->wrong[0]);
    bench_cols in = bench_placement(b, op, k, bench_has_inplace(op), b->avg[1], b->wrong[1]);
    char lat[16], opss[24] = "-";
    bench_fmt_time(lat, sizeof lat, lat_s * 1e6);
    if (b->o->inflight) snprintf(opss, sizeof opss, "%.0f", ops_s);
    printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s  %9s  %10s\n",
           k->bytes, k->param, bw ? bench_dtype_nccl_name(b->dt) : "none",
           bench_op_reduces(op) ? bench_redops[b->redop] : "none",
           bench_op_rooted(op) ? b->root : -1, out.time, out.algbw, out.busbw, out.wrong, in.time,
           in.algbw, in.busbw, in.wrong, lat, opss);
    fflush(stdout);
}

static void bench_print_footer(bench *b) {
    if (b->o->csv) return;
    printf("#\n");
    if (b->o->check)
        printf("# Out of bounds values : %" PRId64 " %s\n", b->wrong_total,
               b->wrong_total ? "FAILED" : "OK");
    else
        printf("# Out of bounds values : N/A (no --check)\n");
    if (b->busbw_rows)
        printf("# Avg bus bandwidth    : %.3f GB/s (out of place, %d rows)\n",
               b->busbw_sum / b->busbw_rows, b->busbw_rows);
    printf("#\n");
}

/* ---- one row --------------------------------------------------------------- */

/* Receive slots for buffers of `elems` elements; returns how many fit. */
static size_t bench_set_slots(bench *b, size_t elems) {
    b->slot_bytes = (elems * b->es + BENCH_SLOT_ALIGN - 1) / BENCH_SLOT_ALIGN * BENCH_SLOT_ALIGN;
    if (b->slot_bytes == 0) b->slot_bytes = BENCH_SLOT_ALIGN;
    b->nslots = b->arena_bytes / b->slot_bytes;
    return b->nslots;
}

/* A checked op: fill, run one, copy back (CUDA), count what is wrong. */
static int bench_checked_op(bench *b, bench_op op, const bench_counts *k, uint32_t seed,
                            size_t slots, bool inplace, int64_t *wrong) {
    int res;
    bench_fill(b, op, k, seed, slots, inplace);
    size_t send_bytes = inplace ? 0 : k->send * b->es;
    if (b->o->cuda &&
        (res = bench_cuda_copy(b, BENCH_CUDA_TO_DEVICE, send_bytes, slots)) != COLLIE_OK)
        return res;
    if ((res = bench_one(b, op, k, inplace)) != COLLIE_OK) return res;
    if (b->o->cuda && (res = bench_cuda_copy(b, BENCH_CUDA_TO_HOST, 0, 1)) != COLLIE_OK) return res;
    if (b->rank == b->o->corrupt_rank && !inplace && k->recv > 0)
        bench_slot(b, 0)[k->recv * b->es / 2] ^= 1;
    *wrong += (int64_t)bench_verify(b, op, k, seed, 0, inplace,
                                    inplace ? "after the first in-place op" : "after the first op");
    return COLLIE_OK;
}

/* Run one row at requested size S: out of place (check, warm up, time
 * three ways, check every slot used), then in place (check one op, time the
 * batch); combine over ranks and print. COLLIE_OK (wrong results are
 * counted, not failures) or an error status (already reported). */
static int bench_row(bench *b, bench_op op, size_t S, uint32_t seed) {
    bench_counts k = bench_counts_for(op, S, b->es, b->size);
    for (int p = 0; p < b->size && (op == BENCH_ALLGATHERV || op == BENCH_ALLTOALLV); p++) {
        b->vsend[p] = bench_v_count(op, k.param, b->size, b->rank, p);
        b->vrecv[p] = bench_v_count(op, k.param, b->size, p, b->rank);
    }
    size_t iters = (size_t)b->o->iters, warmup = (size_t)b->o->warmup;
    size_t inflight = (size_t)b->o->inflight;
    bool check = b->o->check;
    int res;
    b->wrong[0] = b->wrong[1] = 0;
    b->said_wrong = false;
    b->avg[0] = b->avg[1] = 0;

    /* out of place */
    size_t nslots = bench_set_slots(b, k.recv);
    size_t batch_depth = bench_min(iters, nslots), warm_depth = bench_min(warmup, nslots);
    size_t infl_depth = bench_min(inflight, nslots);
    size_t used = batch_depth > warm_depth ? batch_depth : warm_depth;
    if (infl_depth > used) used = infl_depth;
    if (check && (res = bench_checked_op(b, op, &k, seed, used, false, &b->wrong[0])) != COLLIE_OK)
        return res;
    if (warmup && (res = bench_ring(b, op, &k, warmup, warm_depth, false, NULL)) != COLLIE_OK)
        return res;
    double batch_s;
    if ((res = bench_sync(b)) != COLLIE_OK ||
        (res = bench_ring(b, op, &k, iters, batch_depth, false, &batch_s)) != COLLIE_OK)
        return res;
    b->avg[0] = batch_s / (double)iters;
    if ((res = bench_sync(b)) != COLLIE_OK) return res;
    for (size_t i = 0; i < iters; i++) {
        int64_t t = bench_now_ns();
        if ((res = bench_one(b, op, &k, false)) != COLLIE_OK) return res;
        b->lat[i] = (double)(bench_now_ns() - t) / 1e9;
    }
    b->lat[iters] = 0;
    if (inflight &&
        ((res = bench_sync(b)) != COLLIE_OK ||
         (res = bench_ring(b, op, &k, iters, infl_depth, false, &b->lat[iters])) != COLLIE_OK))
        return res;
    /* every slot used holds the result of the last op that received into it */
    if (check && b->o->cuda && (res = bench_cuda_copy(b, BENCH_CUDA_TO_HOST, 0, used)) != COLLIE_OK)
        return res;
    for (size_t sl = 0; check && sl < used; sl++)
        b->wrong[0] += (int64_t)bench_verify(b, op, &k, seed, sl, false, "after the timed loops");

    /* in place (the table's second set of columns; --csv has none): a
     * slot holds the larger buffer */
    size_t ip_depth = bench_min(iters, bench_set_slots(b, k.bytes / b->es));
    if (bench_has_inplace(op) && !b->o->csv) {
        if (check && (res = bench_checked_op(b, op, &k, seed, 1, true, &b->wrong[1])) != COLLIE_OK)
            return res;
        if ((res = bench_sync(b)) != COLLIE_OK ||
            (res = bench_ring(b, op, &k, iters, ip_depth, true, &batch_s)) != COLLIE_OK)
            return res;
        b->avg[1] = batch_s / (double)iters;
    }

    /* statistics: per-op times and the inflight time (MAX), the batch means
     * (AVG), the wrong elements (SUM) */
    if ((res = bench_combine(b, b->lat, iters + 1, COLLIE_FP64, COLLIE_MAX)) != COLLIE_OK ||
        (res = bench_combine(b, b->avg, 2, COLLIE_FP64, COLLIE_AVG)) != COLLIE_OK ||
        (res = bench_combine(b, b->wrong, 2, COLLIE_INT64, COLLIE_SUM)) != COLLIE_OK)
        return res;
    int64_t wrong = b->wrong[0] + b->wrong[1];
    b->wrong_total += wrong;
    if (wrong && b->rank == 0)
        fprintf(stderr,
                "collie-bench: %s of %zu bytes: check failed: %" PRId64
                " wrong element%s over all ranks (see the ranks above)\n",
                bench_op_names[op], k.bytes, wrong, wrong == 1 ? "" : "s");
    double inflight_s = b->lat[iters];
    qsort(b->lat, iters, sizeof(double), bench_cmp_double);
    double median =
        iters % 2 ? b->lat[iters / 2] : (b->lat[iters / 2 - 1] + b->lat[iters / 2]) / 2.0;
    double ops_s = inflight_s > 0 ? (double)iters / inflight_s : 0;
    if (b->rank == 0) {
        bench_print_row(b, op, &k, median, ops_s);
        bool ip_capped = bench_has_inplace(op) && ip_depth < iters;
        if (!b->o->csv && (batch_depth < iters || infl_depth < inflight || ip_capped)) {
            printf("#   (receive slots for works in flight at this size: batch depth %zu",
                   batch_depth);
            if (inflight) printf(", --inflight depth %zu", infl_depth);
            if (bench_has_inplace(op)) printf(", in-place depth %zu", ip_depth);
            printf(")\n");
        }
    }
    return COLLIE_OK;
}

/* Every row of op: per dtype, reduction (if it reduces), root (if it has
 * one), size; nccl-tests' order. */
static int bench_op_rows(bench *b, bench_op op) {
    const bench_opts *o = b->o;
    if (b->rank == 0 && !o->csv) bench_print_heads(op);
    int res = COLLIE_OK;
    for (int d = 0; d < BENCH_NUM_DTYPES && res == COLLIE_OK; d++) {
        if (!o->dtypes[d]) continue;
        b->dt = bench_dtypes[d].dt;
        b->es = collie_dtype_size(b->dt);
        for (int r = 0; r < COLLIE_NUM_REDOPS && res == COLLIE_OK; r++) {
            if (bench_op_reduces(op) ? !o->redops[r] : r != COLLIE_SUM) continue;
            b->redop = (collie_redop)r;
            int root0 = o->root == BENCH_ALL_ROOTS ? 0 : o->root;
            int root1 = o->root == BENCH_ALL_ROOTS && bench_op_rooted(op) ? b->size - 1 : root0;
            for (int root = root0; root <= root1 && res == COLLIE_OK; root++) {
                b->root = root;
                size_t n = op == BENCH_BARRIER ? 1 : o->nsizes;
                for (size_t i = 0; i < n && res == COLLIE_OK; i++) {
                    uint32_t seed = (uint32_t)((((op * 8 + d) * 8 + r) * 1024 + i) * 2654435761u +
                                               (uint32_t)root * 40503u + 1);
                    res = bench_row(b, op, op == BENCH_BARRIER ? 0 : o->sizes[i], seed);
                }
            }
        }
        if (op == BENCH_BARRIER) break; /* no dtype */
    }
    return res;
}

/* ---- main -------------------------------------------------------------------- */

/* Load the CUDA runtime, pick the device (--device, else rank % devices, as
 * the NCCL plugin does), create our stream and device buffers the size of
 * the host ones (zeroed from them). */
static int bench_cuda_setup(bench *b, size_t send_bytes) {
    bench_cuda *cu = &b->cu;
    cu->lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!cu->lib) {
        fprintf(stderr, "collie-bench: --backend %s needs the CUDA runtime (libcudart.so.13): %s\n",
                b->o->backend, dlerror());
        return COLLIE_EBACKEND;
    }
    static const char *const names[] = {"cudaGetDeviceCount",
                                        "cudaSetDevice",
                                        "cudaMalloc",
                                        "cudaFree",
                                        "cudaMemcpy",
                                        "cudaStreamCreate",
                                        "cudaStreamSynchronize",
                                        "cudaStreamDestroy",
                                        "cudaGetErrorString"};
    void **slots[] = {(void **)&cu->GetDeviceCount,
                      (void **)&cu->SetDevice,
                      (void **)&cu->Malloc,
                      (void **)&cu->Free,
                      (void **)&cu->Memcpy,
                      (void **)&cu->StreamCreate,
                      (void **)&cu->StreamSynchronize,
                      (void **)&cu->StreamDestroy,
                      (void **)&cu->GetErrorString};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*slots[i] = dlsym(cu->lib, names[i]))) {
            fprintf(stderr, "collie-bench: libcudart.so.13 has no %s: %s\n", names[i], dlerror());
            return COLLIE_EBACKEND;
        }
    int n = 0, e = cu->GetDeviceCount(&n);
    if (e) return bench_cuda_failed(b, "cudaGetDeviceCount", e);
    if (n <= 0) {
        fprintf(stderr, "collie-bench: rank %d: no CUDA device\n", b->rank);
        return COLLIE_EBACKEND;
    }
    int dev = b->o->device >= 0 ? b->o->device : b->rank % n;
    if ((e = cu->SetDevice(dev))) return bench_cuda_failed(b, "cudaSetDevice", e);
    if ((e = cu->StreamCreate(&cu->stream))) return bench_cuda_failed(b, "cudaStreamCreate", e);
    void *s = NULL, *r = NULL;
    if ((e = cu->Malloc(&s, send_bytes)) || (cu->send = s, e = cu->Malloc(&r, b->arena_bytes)))
        return bench_cuda_failed(b, "cudaMalloc", e);
    cu->arena = r;
    if ((e = cu->Memcpy(cu->send, b->sendbuf, send_bytes, BENCH_CUDA_TO_DEVICE)) ||
        (e = cu->Memcpy(cu->arena, b->arena, b->arena_bytes, BENCH_CUDA_TO_DEVICE)))
        return bench_cuda_failed(b, "cudaMemcpy", e);
    return COLLIE_OK;
}

/* ---- ranks of one process ------------------------------------------------------- */

/* Publish thread t's comm (NULL: withdraw it, before destroying it). A comm
 * published after a sibling failed is aborted at once. */
static void bench_proc_publish(bench *b, collie_comm *c) {
    bench_proc *p = b->proc;
    pthread_mutex_lock(&p->mu);
    p->comms[b->thread] = c;
    if (c && p->failed_rank >= 0) collie_comm_abort(c, p->why);
    pthread_mutex_unlock(&p->mu);
}

/* `rank` failed: abort the comms of the other ranks of this process, as the
 * launcher stops the other processes when one fails; nobody waits out a
 * deadline for a rank that quit. collie_comm_abort never blocks and calls
 * nothing of ours, and holding mu keeps each comm alive while it runs. */
static void bench_proc_stop(bench_proc *p, int rank) {
    int self = rank - p->prank * p->o->threads;
    pthread_mutex_lock(&p->mu);
    if (p->failed_rank < 0) {
        p->failed_rank = rank;
        snprintf(p->why, sizeof p->why, "collie-bench: rank %d of this process failed", rank);
        for (int t = 0; t < p->o->threads; t++)
            if (t != self && p->comms[t]) collie_comm_abort(p->comms[t], p->why);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Read where this process sits in the world (collie-run sets it). */
static int bench_proc_init(bench_proc *p, const bench_opts *o) {
    const char *r = getenv("COLLIE_RANK"), *n = getenv("COLLIE_WORLD_SIZE");
    *p = (bench_proc){.o = o, .store_addr = getenv("COLLIE_STORE_ADDR"), .failed_rank = -1};
    if (!r || !*r || !n || !*n || !p->store_addr || !*p->store_addr) {
        fprintf(stderr, "collie-bench: COLLIE_RANK, COLLIE_WORLD_SIZE and COLLIE_STORE_ADDR must "
                        "be set: run it under the launcher, collie-run -n N -- collie-bench ...\n");
        return BENCH_EXIT_ERROR;
    }
    if (!bench_parse_int(n, 1, INT_MAX / o->threads, &p->nprocs) ||
        !bench_parse_int(r, 0, p->nprocs - 1, &p->prank)) {
        fprintf(stderr,
                "collie-bench: COLLIE_RANK '%s' and COLLIE_WORLD_SIZE '%s' are not a rank of a "
                "world of at most %d processes of %d threads (collie-run sets them)\n",
                r, n, INT_MAX / o->threads, o->threads);
        return BENCH_EXIT_ERROR;
    }
    if (!(p->comms = calloc((size_t)o->threads, sizeof *p->comms))) {
        fprintf(stderr, "collie-bench: out of memory\n");
        return BENCH_EXIT_ERROR;
    }
    pthread_mutex_init(&p->mu, NULL);
    return BENCH_EXIT_OK;
}

static void bench_proc_fini(bench_proc *p) {
    pthread_mutex_destroy(&p->mu);
    free(p->comms);
}

/* ---- one rank ---------------------------------------------------------------- */

/* Create the comm of rank b->rank of b->size over the store. Posted, so the
 * comm is published (and a failing sibling can abort it) while the
 * rendezvous waits for every rank to start. */
static int bench_comm_create(bench *b) {
    const bench_opts *o = b->o;
    collie_comm_opts co = COLLIE_COMM_OPTS_INIT;
    co.name = "bench";
    co.backend = o->spec;
    co.device = o->device;
    co.timeout_ms = o->timeout_ms;
    /* the rendezvous waits for every rank to start: not an op's deadline */
    co.create_timeout_ms =
        o->timeout_ms > BENCH_CREATE_TMO_MS ? o->timeout_ms : BENCH_CREATE_TMO_MS;
    collie_comm *c = NULL;
    collie_work *w = NULL;
    const char *why = "";
    int res = collie_store_connect(b->engine, b->proc->store_addr, NULL, &b->store);
    if (res == COLLIE_OK)
        res = collie_comm_create_post(b->engine, b->store, b->rank, b->size, &co, &c, &w);
    if (res != COLLIE_OK) {
        why = collie_last_error();
    } else {
        bench_proc_publish(b, c);
        b->comm = c; /* bench_teardown withdraws and destroys it, also after a failure */
        res = collie_work_wait(w, co.create_timeout_ms + BENCH_WAIT_SLACK_MS);
        if (res == COLLIE_INPROGRESS) {
            res = COLLIE_ETIMEDOUT;
            why = "the rendezvous did not complete in time";
        } else if (res != COLLIE_OK) {
            why = collie_work_error_message(w);
        }
    }
    if (res != COLLIE_OK) {
        const char *as = o->spec != o->backend ? o->spec : NULL;
        fprintf(stderr,
                "collie-bench: rank %d: cannot create a communicator with backend '%s'%s%s%s: %s "
                "(%s)\n",
                b->rank, o->backend, as ? " (as '" : "", as ? as : "", as ? "')" : "",
                *why ? why : collie_strerror(res), collie_status_name(res));
    }
    collie_work_release(w);
    return res;
}

static int bench_setup(bench *b) {
    const bench_opts *o = b->o;
    b->rank = b->proc->prank * o->threads + b->thread;
    b->size = b->proc->nprocs * o->threads;
    collie_engine_opts eo = COLLIE_ENGINE_OPTS_INIT;
    eo.name = "collie-bench";
    int res = collie_engine_create(&eo, &b->engine);
    if (res != COLLIE_OK) {
        fprintf(stderr, "collie-bench: rank %d: cannot start the engine: %s (%s)\n", b->rank,
                collie_last_error(), collie_strerror(res));
        return res;
    }
    if ((res = bench_comm_create(b)) != COLLIE_OK) return res;

    /* the send buffer holds the largest size; the receive arena a slot of
     * it for each work in flight, within BENCH_ARENA_BYTES */
    size_t max_bytes = BENCH_SLOT_ALIGN, depth = (size_t)o->iters;
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] > max_bytes) max_bytes = o->sizes[i];
    max_bytes = (max_bytes + BENCH_SLOT_ALIGN - 1) / BENCH_SLOT_ALIGN * BENCH_SLOT_ALIGN;
    if ((size_t)o->warmup > depth) depth = (size_t)o->warmup;
    b->nworks = depth;
    if (depth > BENCH_ARENA_BYTES / max_bytes) depth = BENCH_ARENA_BYTES / max_bytes;
    if (depth == 0) depth = 1;
    b->arena_bytes = depth * max_bytes;
    void *s = NULL, *r = NULL;
    if (posix_memalign(&s, 4096, max_bytes) || posix_memalign(&r, 4096, b->arena_bytes) ||
        !(b->works = calloc(b->nworks, sizeof *b->works)) ||
        !(b->vsend = calloc((size_t)b->size, sizeof *b->vsend)) ||
        !(b->vrecv = calloc((size_t)b->size, sizeof *b->vrecv)) ||
        !(b->lat = calloc((size_t)o->iters + 2, sizeof *b->lat))) {
        free(s);
        free(r);
        fprintf(stderr,
                "collie-bench: rank %d: cannot allocate a %zu-byte send buffer and %zu bytes of "
                "receive slots\n",
                b->rank, max_bytes, b->arena_bytes);
        return COLLIE_ENOMEM;
    }
    b->sendbuf = s;
    b->arena = r;
    memset(b->sendbuf, 0, max_bytes); /* fault the pages in before timing */
    memset(b->arena, 0, b->arena_bytes);
    b->po = (collie_post_opts)COLLIE_POST_OPTS_INIT;
    b->po.timeout_ms = o->timeout_ms;
    return o->cuda ? bench_cuda_setup(b, max_bytes) : COLLIE_OK;
}

static void bench_teardown(bench *b, bool failed) {
    if (b->comm && failed) collie_comm_abort(b->comm, "collie-bench stopped after an error");
    for (size_t i = 0; b->works && i < b->nworks; i++)
        collie_work_release(b->works[i]);
    if (b->comm) {
        bench_proc_publish(b, NULL);
        collie_comm_destroy(b->comm);
    }
    /* the comm is gone: no GPU work of ours is left to use the buffers */
    if (b->cu.stream) b->cu.StreamSynchronize(b->cu.stream);
    if (b->cu.send) b->cu.Free(b->cu.send);
    if (b->cu.arena) b->cu.Free(b->cu.arena);
    if (b->cu.stream) b->cu.StreamDestroy(b->cu.stream);
    collie_store_destroy(b->store); /* after the comm, which uses it */
    if (b->engine) collie_engine_destroy(b->engine);
    free(b->works);
    free(b->vsend);
    free(b->vrecv);
    free(b->lat);
    free(b->sendbuf);
    free(b->arena);
    if (b->cu.lib) dlclose(b->cu.lib);
}

/* Run one rank from setup to teardown; its outcome goes to b->res. The
 * thread function of --threads (thread 0 runs on the main thread). */
static void *bench_rank_main(void *arg) {
    bench *b = arg;
    const bench_opts *o = b->o;
    int res = bench_setup(b);
    if (res == COLLIE_OK) res = bench_sync(b); /* also: can this comm run CPU collectives? */
    if (res == COLLIE_OK && o->root >= b->size) {
        /* every rank knows the world size now: rank 0 says it, all stop */
        if (b->rank == 0) {
            char what[96];
            snprintf(what, sizeof what, "-r/--root %d: the world has %d ranks", o->root, b->size);
            bench_usage_error("%s", what);
        }
        res = bench_sync(b); /* said before anyone leaves */
        if (res == COLLIE_OK) res = BENCH_BAD_ROOT;
    }
    if (res == COLLIE_OK && b->rank == 0) bench_print_header(b);
    for (int op = 0; op < BENCH_NUM_OPS && res == COLLIE_OK; op++)
        if (o->ops[op]) res = bench_op_rows(b, (bench_op)op);
    if (res == COLLIE_OK && b->rank == 0) bench_print_footer(b);
    fflush(stdout);
    /* nobody leaves before rank 0 has printed everything: a rank that exits
     * 1 (wrong results) first would make collie-run stop rank 0 mid-table */
    if (res == COLLIE_OK) res = bench_sync(b);
    /* wrong results and a bad root: every rank knows and stops here
     * together, so they leave in order */
    if (res == COLLIE_OK && b->wrong_total) res = BENCH_CHECK_FAILED;
    bool failed = res != COLLIE_OK && res != BENCH_CHECK_FAILED && res != BENCH_BAD_ROOT;
    if (failed) bench_proc_stop(b->proc, b->rank);
    bench_teardown(b, failed);
    b->res = res;
    return NULL;
}

int main(int argc, char **argv) {
    bench_opts o;
    int rc = bench_parse_args(argc, argv, &o);
    if (rc != BENCH_EXIT_OK) return rc < 0 ? BENCH_EXIT_OK : rc;
    bench_proc p;
    if ((rc = bench_proc_init(&p, &o)) != BENCH_EXIT_OK) return rc;

    int T = o.threads, started = 1;
    bench *ranks = calloc((size_t)T, sizeof *ranks);
    pthread_t *tids = calloc((size_t)T, sizeof *tids);
    if (!ranks || !tids) {
        fprintf(stderr, "collie-bench: out of memory\n");
        free(ranks);
        free(tids);
        bench_proc_fini(&p);
        return BENCH_EXIT_ERROR;
    }
    for (int t = 0; t < T; t++)
        ranks[t] = (bench){.o = &o, .proc = &p, .thread = t};
    for (; started < T; started++) {
        int e = pthread_create(&tids[started], NULL, bench_rank_main, &ranks[started]);
        if (e) {
            fprintf(stderr, "collie-bench: cannot start the thread of rank %d: %s\n",
                    p.prank * T + started, strerror(e));
            bench_proc_stop(&p, p.prank * T + started);
            ranks[0].res = COLLIE_ENOMEM; /* rank 0 does not start */
            break;
        }
    }
    if (started == T) bench_rank_main(&ranks[0]);
    rc = BENCH_EXIT_OK;
    for (int t = 0; t < started; t++) {
        if (t > 0) pthread_join(tids[t], NULL);
        if (ranks[t].res == BENCH_BAD_ROOT && rc == BENCH_EXIT_OK)
            rc = BENCH_EXIT_USAGE;
        else if (ranks[t].res != COLLIE_OK && ranks[t].res != BENCH_BAD_ROOT)
            rc = BENCH_EXIT_ERROR;
    }
    free(ranks);
    free(tids);
    bench_proc_fini(&p);
    return rc;
}
