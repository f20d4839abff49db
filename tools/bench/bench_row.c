/*
 * bench_row.c — collie-bench's rows, shared with its peers (bench/mpi_bench.c):
 * the loops over ops, dtypes, reductions, roots and sizes, each row's
 * timings and checks, the statistics combined over ranks, the buffers, and
 * a whole run from the first barrier to the last.
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
 *    the same call); bench_opts.inplace says which ops a program times in
 *    place.
 *  - --check: out of place, slot 0 is poisoned before the first op and
 *    checked after it; after the timed loops every slot used is checked (it
 *    holds the result of the last work that received into it). In place,
 *    the input is put where the call reads it and one op is checked (the
 *    timed in-place ops then reduce their own results: their values are not
 *    checked, as in nccl-tests). Every wrong element is counted; the counts
 *    are summed over ranks (one SUM allreduce per row) into #wrong, and the
 *    run goes on: the last lines say "Out of bounds values: N FAILED" and
 *    every rank exits 1 together (no rank is left waiting for one that quit).
 *  - How a program reaches the other ranks is five calls (bench.h, "what a
 *    program supplies"): bench_post, bench_wait, bench_sync, bench_combine,
 *    bench_cuda_copy. collie-bench's are bench_post.c's (collie's API);
 *    bench/mpi_bench.c's are MPI's. Everything here, the command line, the
 *    data and the table are the same code in both, so one table holds both
 *    and --check checks the same values.
 *  - Works in flight never share a receive buffer (bench_post.c says why):
 *    work i of a loop of depth d receives into slot i % d of one arena.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
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

/* How many works a row keeps in flight: each loop's depth capped by the
 * receive slots that fit at the row's size. */
typedef struct bench_depths {
    size_t batch, warm, infl; /* out of place: the timed batch, warm-up, --inflight */
    size_t used;              /* out-of-place slots used (the deepest of the three) */
    size_t ip;                /* in place: the timed batch */
} bench_depths;

/* Out of place: check one op, warm up, time the batch, the per-op latency
 * and --inflight, then check every slot used. */
static int bench_row_out_of_place(bench *b, bench_op op, const bench_counts *k, uint32_t seed,
                                  bench_depths *d) {
    size_t iters = (size_t)b->o->iters, warmup = (size_t)b->o->warmup;
    size_t inflight = (size_t)b->o->inflight;
    bool check = b->o->check;
    int res;
    size_t nslots = bench_set_slots(b, k->recv);
    d->batch = bench_min(iters, nslots);
    d->warm = bench_min(warmup, nslots);
    d->infl = bench_min(inflight, nslots);
    d->used = d->batch > d->warm ? d->batch : d->warm;
    if (d->infl > d->used) d->used = d->infl;
    if (check &&
        (res = bench_checked_op(b, op, k, seed, d->used, false, &b->wrong[0])) != COLLIE_OK)
        return res;
    if (warmup && (res = bench_ring(b, op, k, warmup, d->warm, false, NULL)) != COLLIE_OK)
        return res;
    double batch_s;
    if ((res = bench_sync(b)) != COLLIE_OK ||
        (res = bench_ring(b, op, k, iters, d->batch, false, &batch_s)) != COLLIE_OK)
        return res;
    b->avg[0] = batch_s / (double)iters;
    if ((res = bench_sync(b)) != COLLIE_OK) return res;
    for (size_t i = 0; i < iters; i++) {
        int64_t t = bench_now_ns();
        if ((res = bench_one(b, op, k, false)) != COLLIE_OK) return res;
        b->lat[i] = (double)(bench_now_ns() - t) / 1e9;
    }
    b->lat[iters] = 0;
    if (inflight &&
        ((res = bench_sync(b)) != COLLIE_OK ||
         (res = bench_ring(b, op, k, iters, d->infl, false, &b->lat[iters])) != COLLIE_OK))
        return res;
    /* every slot used holds the result of the last op that received into it */
    if (check && b->o->cuda &&
        (res = bench_cuda_copy(b, BENCH_CUDA_TO_HOST, 0, d->used)) != COLLIE_OK)
        return res;
    for (size_t sl = 0; check && sl < d->used; sl++)
        b->wrong[0] += (int64_t)bench_verify(b, op, k, seed, sl, false, "after the timed loops");
    return COLLIE_OK;
}

/* In place (the table's second set of columns; --csv has none): check one
 * op, time the batch; a slot holds the larger buffer. */
static int bench_row_in_place(bench *b, bench_op op, const bench_counts *k, uint32_t seed,
                              bench_depths *d) {
    size_t iters = (size_t)b->o->iters;
    int res;
    d->ip = bench_min(iters, bench_set_slots(b, k->bytes / b->es));
    if (!b->o->inplace[op] || b->o->csv) return COLLIE_OK;
    if (b->o->check && (res = bench_checked_op(b, op, k, seed, 1, true, &b->wrong[1])) != COLLIE_OK)
        return res;
    double batch_s;
    if ((res = bench_sync(b)) != COLLIE_OK ||
        (res = bench_ring(b, op, k, iters, d->ip, true, &batch_s)) != COLLIE_OK)
        return res;
    b->avg[1] = batch_s / (double)iters;
    return COLLIE_OK;
}

/* Combine the row over ranks: per-op times and the inflight time (MAX),
 * the batch means (AVG), the wrong elements (SUM); rank 0 prints it. */
static int bench_row_report(bench *b, bench_op op, const bench_counts *k, const bench_depths *d) {
    size_t iters = (size_t)b->o->iters, inflight = (size_t)b->o->inflight;
    int res;
    if ((res = bench_combine(b, b->lat, iters + 1, COLLIE_FP64, COLLIE_MAX)) != COLLIE_OK ||
        (res = bench_combine(b, b->avg, 2, COLLIE_FP64, COLLIE_AVG)) != COLLIE_OK ||
        (res = bench_combine(b, b->wrong, 2, COLLIE_INT64, COLLIE_SUM)) != COLLIE_OK)
        return res;
    int64_t wrong = b->wrong[0] + b->wrong[1];
    b->wrong_total += wrong;
    if (wrong && b->rank == 0)
        fprintf(stderr,
                "%s: %s of %zu bytes: check failed: %" PRId64
                " wrong element%s over all ranks (see the ranks above)\n",
                bench_prog, bench_op_names[op], k->bytes, wrong, wrong == 1 ? "" : "s");
    double inflight_s = b->lat[iters];
    qsort(b->lat, iters, sizeof(double), bench_cmp_double);
    double median =
        iters % 2 ? b->lat[iters / 2] : (b->lat[iters / 2 - 1] + b->lat[iters / 2]) / 2.0;
    double ops_s = inflight_s > 0 ? (double)iters / inflight_s : 0;
    if (b->rank != 0) return COLLIE_OK;
    bench_print_row(b, op, k, median, ops_s);
    bool ip_capped = b->o->inplace[op] && d->ip < iters;
    if (!b->o->csv && (d->batch < iters || d->infl < inflight || ip_capped)) {
        printf("#   (receive slots for works in flight at this size: batch depth %zu", d->batch);
        if (inflight) printf(", --inflight depth %zu", d->infl);
        if (b->o->inplace[op]) printf(", in-place depth %zu", d->ip);
        printf(")\n");
    }
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
    b->wrong[0] = b->wrong[1] = 0;
    b->said_wrong = false;
    b->avg[0] = b->avg[1] = 0;
    bench_depths d;
    int res = bench_row_out_of_place(b, op, &k, seed, &d);
    if (res == COLLIE_OK) res = bench_row_in_place(b, op, &k, seed, &d);
    if (res == COLLIE_OK) res = bench_row_report(b, op, &k, &d);
    return res;
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

/* ---- rings of works ---------------------------------------------------------- */

/* Run `total` ops with up to `depth` in flight: post `depth`, then post
 * another each time the oldest completes. Work i receives into slot
 * i % depth, which work i - depth (the oldest, waited for) has left, so
 * works in flight never share a receive buffer. *elapsed (if not NULL)
 * gets the seconds taken. */
int bench_ring(bench *b, bench_op op, const bench_counts *k, size_t total, size_t depth,
               bool inplace, double *elapsed) {
    size_t posted = 0, done = 0;
    int64_t t0 = bench_now_ns();
    while (done < total) {
        while (posted < total && posted - done < depth) {
            int res = bench_post(b, op, k, posted % depth, inplace, posted % depth);
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

int bench_one(bench *b, bench_op op, const bench_counts *k, bool inplace) {
    return bench_ring(b, op, k, 1, 1, inplace, NULL);
}

/* ---- buffers ------------------------------------------------------------------- */

int bench_buffers_alloc(bench *b, size_t *send_bytes) {
    const bench_opts *o = b->o;
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
        !(b->vsend = calloc((size_t)b->size, sizeof *b->vsend)) ||
        !(b->vrecv = calloc((size_t)b->size, sizeof *b->vrecv)) ||
        !(b->lat = calloc((size_t)o->iters + 2, sizeof *b->lat))) {
        free(s);
        free(r);
        fprintf(stderr,
                "%s: rank %d: cannot allocate a %zu-byte send buffer and %zu bytes of "
                "receive slots\n",
                bench_prog, b->rank, max_bytes, b->arena_bytes);
        return COLLIE_ENOMEM;
    }
    b->sendbuf = s;
    b->arena = r;
    memset(b->sendbuf, 0, max_bytes); /* fault the pages in before timing */
    memset(b->arena, 0, b->arena_bytes);
    *send_bytes = max_bytes;
    return COLLIE_OK;
}

void bench_buffers_free(bench *b) {
    free(b->vsend);
    free(b->vrecv);
    free(b->lat);
    free(b->sendbuf);
    free(b->arena);
    b->vsend = b->vrecv = NULL;
    b->lat = NULL;
    b->sendbuf = b->arena = NULL;
}

/* ---- a run ----------------------------------------------------------------------- */

int bench_run(bench *b) {
    const bench_opts *o = b->o;
    int res = bench_sync(b); /* also: can this comm run CPU collectives? */
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
     * 1 (wrong results) first would make the launcher stop rank 0 mid-table */
    if (res == COLLIE_OK) res = bench_sync(b);
    /* wrong results and a bad root: every rank knows and stops here
     * together, so they leave in order */
    if (res == COLLIE_OK && b->wrong_total) res = BENCH_CHECK_FAILED;
    return res;
}
