/*
 * coll_v.c — allgatherv and alltoallv: checking the per-rank counts and
 * displacements and copying them into the work.
 *
 * Design notes
 *  - The arrays are the user's, read once on the posting thread: every
 *    count and displacement is checked (no element offset or byte length
 *    overflows; the receive blocks do not overlap, found by sorting them)
 *    and copied into one allocation the work owns, with packed
 *    displacements filled in where the user passed NULL. Backends read the
 *    work's copy until their detach, so the user may reuse the arrays as
 *    soon as the call returns (MPI wants them kept until completion).
 *  - args.count becomes the whole result for allgatherv (the sum of
 *    recvcounts: equal on every rank when the ranks agree) and what this
 *    rank sends for alltoallv; the TCP frames and COLLIE_CHECK_ARGS compare
 *    it across ranks only where it must agree (collie_coll_count_agrees).
 *  - A rejected call leaves nothing behind (COLLIE_EINVAL, and
 *    collie_last_error naming the array, the rank and the values).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

typedef struct v_block {
    size_t off, len; /* elements */
    int rank;
} v_block;

static int v_block_cmp(const void *x, const void *y) {
    const v_block *a = x, *b = y;
    return (a->off > b->off) - (a->off < b->off);
}

/* Copy counts (and displacements, or packed ones) into cnt/dsp, checking
 * every block's end in bytes; *total gets the sum of the counts. */
static int v_copy(const char *op, const char *which, const size_t *counts, const size_t *displs,
                  size_t n, size_t es, size_t *cnt, size_t *dsp, size_t *total) {
    size_t sum = 0, next = 0;
    for (size_t p = 0; p < n; p++) {
        size_t d = displs ? displs[p] : next, stop, bytes;
        if (__builtin_add_overflow(d, counts[p], &stop) ||
            __builtin_mul_overflow(stop, es, &bytes) || bytes > (size_t)INT64_MAX ||
            __builtin_add_overflow(sum, counts[p], &sum))
            return cl_set_last_error(COLLIE_EINVAL,
                                     "%s: %s block of rank %zu (%zu elements at displacement %zu) "
                                     "overflows the buffer size",
                                     op, which, p, counts[p], d);
        cnt[p] = counts[p];
        dsp[p] = d;
        next = stop;
    }
    *total = sum;
    return COLLIE_OK;
}

/* The receive blocks (those with elements) must not overlap. */
static int v_disjoint(const char *op, const size_t *cnt, const size_t *dsp, size_t n) {
    v_block *b = malloc((n ? n : 1) * sizeof *b);
    if (!b) return cl_set_last_error(COLLIE_ENOMEM, "%s: no memory", op);
    size_t k = 0;
    for (size_t p = 0; p < n; p++)
        if (cnt[p]) b[k++] = (v_block){dsp[p], cnt[p], (int)p};
    qsort(b, k, sizeof *b, v_block_cmp);
    int res = COLLIE_OK;
    for (size_t i = 1; i < k && res == COLLIE_OK; i++)
        if (b[i - 1].off + b[i - 1].len > b[i].off)
            res = cl_set_last_error(COLLIE_EINVAL,
                                    "%s: the receive blocks of ranks %d (%zu elements at %zu) and "
                                    "%d (%zu elements at %zu) overlap",
                                    op, b[i - 1].rank, b[i - 1].len, b[i - 1].off, b[i].rank,
                                    b[i].len, b[i].off);
    free(b);
    return res;
}

int cl_coll_v_prepare(collie_comm *c, collie_coll_args *a, size_t **owned) {
    const char *op = collie_coll_kind_name(a->kind);
    bool a2a = a->kind == COLLIE_COLL_ALLTOALLV;
    size_t n = (size_t)c->size, es = collie_dtype_size(a->dtype), me = (size_t)c->rank;
    *owned = NULL;
    if (!a->recvcounts) return cl_set_last_error(COLLIE_EINVAL, "%s: recvcounts is NULL", op);
    if (a2a && !a->sendcounts)
        return cl_set_last_error(COLLIE_EINVAL, "%s: sendcounts is NULL", op);
    size_t *v = malloc((a2a ? 4 : 2) * n * sizeof *v);
    if (!v) return cl_set_last_error(COLLIE_ENOMEM, "%s: no memory for %zu counts", op, n);
    size_t rtotal, stotal = 0;
    int res = v_copy(op, "receive", a->recvcounts, a->rdispls, n, es, v, v + n, &rtotal);
    if (res == COLLIE_OK && a2a)
        res = v_copy(op, "send", a->sendcounts, a->sdispls, n, es, v + 2 * n, v + 3 * n, &stotal);
    if (res == COLLIE_OK) res = v_disjoint(op, v, v + n, n);
    if (res == COLLIE_OK && a2a && v[2 * n + me] != v[me])
        res = cl_set_last_error(COLLIE_EINVAL,
                                "%s: this rank (%zu) sends itself %zu elements but receives %zu",
                                op, me, v[2 * n + me], v[me]);
    size_t mine = a2a ? stotal : v[me];
    if (res == COLLIE_OK && mine && !a->sendbuf)
        res = cl_set_last_error(COLLIE_EINVAL, "%s: send buffer is NULL", op);
    if (res == COLLIE_OK && rtotal && !a->recvbuf)
        res = cl_set_last_error(COLLIE_EINVAL, "%s: receive buffer is NULL", op);
    if (res == COLLIE_OK && a2a && a->sendbuf && a->sendbuf == a->recvbuf && (stotal || rtotal))
        res = cl_set_last_error(COLLIE_EINVAL, "%s: has no in-place form (sendbuf == recvbuf)", op);
    if (res != COLLIE_OK) {
        free(v);
        return res;
    }
    a->recvcounts = v;
    a->rdispls = v + n;
    a->sendcounts = a2a ? v + 2 * n : NULL;
    a->sdispls = a2a ? v + 3 * n : NULL;
    a->count = a2a ? stotal : rtotal;
    *owned = v;
    return COLLIE_OK;
}
