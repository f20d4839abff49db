/*
 * sched.c — cl_sched_build: validate, reserve, pick the algorithm; the
 * builder primitives; the direct algorithms (alltoall, gather, scatter,
 * barrier). Trees live in sched_tree.c, rings in sched_ring.c.
 *
 * Design notes
 *  - Steps are numbered globally: step k of every rank belongs to the same
 *    round of the algorithm, and every message is sent and received in the
 *    same step, so an executor that posts all ops of a step at once and
 *    buffers sends cannot deadlock. Idle ranks keep their (empty) steps;
 *    only trailing empty steps are trimmed. Ops that touch no wire
 *    (copies, AVG) go either into a step where they are hazard free or
 *    after the rank's last message.
 *  - Within one step no op writes memory another op of that step reads or
 *    writes (counting the aliasing of in-place buffers), so the executor
 *    may run them in any order or interleaving. This is why recursive
 *    doubling ping-pongs between RECV and SCRATCH with RECV_REDUCE3 instead
 *    of sending and reducing the same buffer in one step.
 *  - Between a pair of ranks there is at most one message per direction per
 *    step, so the pairwise order contract of sched.h holds trivially.
 *  - The v collectives send a zero-length message for an empty block
 *    instead of skipping it: whether a block is empty is exactly what
 *    ranks that disagree on the counts disagree about, and a skipped
 *    message leaves the other side waiting for it until the deadline. With
 *    every pair of the ring (allgatherv) or of the pairwise exchange
 *    (alltoallv) talking, the counts check in each frame (cpu.h) finds a
 *    disagreement within a round trip.
 *  - Capacity is reserved up front from a per-algorithm bound, before s is
 *    touched: a rejected call leaves s as it was, and arrays only grow, so
 *    rebuilding a schedule of the same or a smaller shape allocates nothing.
 *  - Size 1 is one local copy (or nothing when in place) for every kind;
 *    count 0 is an empty schedule.
 */
#include "transports/cpu/sched.h"

#include <assert.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "transports/reduce.h"
#include "transports/cpu/sched_impl.h"

static int sched_ceil_log2(int n) {
    int l = 0;
    while ((1LL << l) < n)
        l++;
    return l;
}

/* ---- builder primitives ------------------------------------------------ */

void cl_sched_step(cl_sched_b *b) {
    cl_sched *s = b->s;
    if (b->err) return;
    /* step_start needs nsteps + 1 entries once the build is finished */
    if (s->nsteps + 1 >= s->cap_steps) {
        assert(!"cl_sched: step bound too small");
        b->err = COLLIE_ELIMIT;
        return;
    }
    s->step_start[s->nsteps++] = s->nops;
}

static void sched_push(cl_sched_b *b, int kind, int peer, int buf, uint64_t off, int src_buf,
                       uint64_t src_off, uint64_t len) {
    cl_sched *s = b->s;
    if (b->err) return;
    if (s->nsteps == 0 || s->nops >= s->cap_ops) {
        assert(!"cl_sched: op bound too small or op outside a step");
        b->err = COLLIE_ELIMIT;
        return;
    }
    s->ops[s->nops++] = (cl_sop){.kind = (uint8_t)kind,
                                 .buf = (uint8_t)buf,
                                 .src_buf = (uint8_t)src_buf,
                                 .peer = peer,
                                 .off = off,
                                 .src_off = src_off,
                                 .len = len};
    if (buf == CL_SBUF_SCRATCH && off + len > s->scratch_bytes) s->scratch_bytes = off + len;
    bool has_src =
        kind == CL_SOP_RECV_REDUCE3 || kind == CL_SOP_COPY || kind == CL_SOP_REDUCE_LOCAL;
    if (has_src && src_buf == CL_SBUF_SCRATCH && src_off + len > s->scratch_bytes)
        s->scratch_bytes = src_off + len;
}

void cl_sched_send(cl_sched_b *b, int peer, int buf, uint64_t off, uint64_t len) {
    if (len || b->empty_msgs) sched_push(b, CL_SOP_SEND, peer, buf, off, buf, 0, len);
}

void cl_sched_recv(cl_sched_b *b, int peer, int buf, uint64_t off, uint64_t len) {
    if (len || b->empty_msgs) sched_push(b, CL_SOP_RECV, peer, buf, off, buf, 0, len);
}

void cl_sched_recv_reduce(cl_sched_b *b, int peer, int buf, uint64_t off, uint64_t len) {
    if (len) sched_push(b, CL_SOP_RECV_REDUCE, peer, buf, off, buf, 0, len);
}

void cl_sched_recv_reduce3(cl_sched_b *b, int peer, int buf, uint64_t off, int src_buf,
                           uint64_t src_off, uint64_t len) {
    if (len) sched_push(b, CL_SOP_RECV_REDUCE3, peer, buf, off, src_buf, src_off, len);
}

void cl_sched_copy(cl_sched_b *b, int buf, uint64_t off, int src_buf, uint64_t src_off,
                   uint64_t len) {
    if (len && !(buf == src_buf && off == src_off))
        sched_push(b, CL_SOP_COPY, -1, buf, off, src_buf, src_off, len);
}

void cl_sched_msg0(cl_sched_b *b, int kind, int peer) {
    sched_push(b, kind, peer, CL_SBUF_RECV, 0, CL_SBUF_RECV, 0, 0);
}

void cl_sched_avg(cl_sched_b *b, int buf, uint64_t off, uint64_t len) {
    if (len) sched_push(b, CL_SOP_AVG, -1, buf, off, buf, 0, len);
}

void cl_sched_avg_step(cl_sched_b *b, int buf, uint64_t off, uint64_t len) {
    if (b->a->op != COLLIE_AVG || b->size == 1 || len == 0) return;
    cl_sched_step(b);
    cl_sched_avg(b, buf, off, len);
}

void cl_sched_chunk(const cl_sched_b *b, uint64_t count, int n, int i, uint64_t *off,
                    uint64_t *len) {
    uint64_t q = count / (uint64_t)n, rem = count % (uint64_t)n, ui = (uint64_t)i;
    *off = (ui * q + (ui < rem ? ui : rem)) * b->esize;
    *len = (q + (ui < rem ? 1 : 0)) * b->esize;
}

/* ---- direct algorithms ------------------------------------------------- */

/* Pairwise exchange: in step k-1 send block r+k to rank r+k and receive
 * block r-k from rank r-k. In place (sendbuf == recvbuf) the blocks are
 * received into scratch and copied back after the last step, since a block
 * received early would otherwise overwrite one not yet sent. */
static void sched_alltoall_pairwise(cl_sched_b *b) {
    int n = b->size, r = b->rank;
    uint64_t B = b->bytes;
    bool inplace = b->a->sendbuf == b->a->recvbuf;
    int src = inplace ? CL_SBUF_RECV : CL_SBUF_SEND;
    int dst = inplace ? CL_SBUF_SCRATCH : CL_SBUF_RECV;
    for (int k = 1; k < n; k++) {
        int to = (r + k) % n, from = cl_sched_mod(r - k, n);
        cl_sched_step(b);
        if (k == 1) cl_sched_copy(b, dst, (uint64_t)r * B, src, (uint64_t)r * B, B);
        cl_sched_send(b, to, src, (uint64_t)to * B, B);
        cl_sched_recv(b, from, dst, (uint64_t)from * B, B);
    }
    if (inplace) {
        cl_sched_step(b);
        cl_sched_copy(b, CL_SBUF_RECV, 0, CL_SBUF_SCRATCH, 0, (uint64_t)n * B);
    }
}

/* Gather: the root posts all n-1 receives in one step. */
static void sched_gather_direct(cl_sched_b *b) {
    int n = b->size, r = b->rank, root = b->a->root;
    uint64_t B = b->bytes;
    cl_sched_step(b);
    if (r != root) {
        cl_sched_send(b, root, CL_SBUF_SEND, 0, B);
        return;
    }
    if (!cl_sched_at(b->a->sendbuf, b->a->recvbuf, (uint64_t)root * B))
        cl_sched_copy(b, CL_SBUF_RECV, (uint64_t)root * B, CL_SBUF_SEND, 0, B);
    for (int p = 0; p < n; p++)
        if (p != root) cl_sched_recv(b, p, CL_SBUF_RECV, (uint64_t)p * B, B);
}

/* Scatter: the root posts all n-1 sends in one step. */
static void sched_scatter_direct(cl_sched_b *b) {
    int n = b->size, r = b->rank, root = b->a->root;
    uint64_t B = b->bytes;
    cl_sched_step(b);
    if (r != root) {
        cl_sched_recv(b, root, CL_SBUF_RECV, 0, B);
        return;
    }
    if (!cl_sched_at(b->a->recvbuf, b->a->sendbuf, (uint64_t)root * B))
        cl_sched_copy(b, CL_SBUF_RECV, 0, CL_SBUF_SEND, (uint64_t)root * B, B);
    for (int p = 0; p < n; p++)
        if (p != root) cl_sched_send(b, p, CL_SBUF_SEND, (uint64_t)p * B, B);
}

/* allgatherv: allgather's ring with each rank's own block size; a block of
 * 0 elements is a zero-length message (empty_msgs): ranks that disagree on
 * which block is empty would otherwise each wait for the other. */
static void sched_allgatherv_ring(cl_sched_b *b) {
    int n = b->size, r = b->rank, next = (r + 1) % n, prev = cl_sched_mod(r - 1, n);
    const size_t *cnt = b->a->recvcounts, *dsp = b->a->rdispls;
    uint64_t es = b->esize;
    bool inplace = cl_sched_at(b->a->sendbuf, b->a->recvbuf, (uint64_t)dsp[r] * es);
    for (int t = 0; t < n - 1; t++) {
        int sb = cl_sched_mod(r - t, n), rb = cl_sched_mod(r - t - 1, n);
        cl_sched_step(b);
        if (t == 0 && !inplace) {
            cl_sched_copy(b, CL_SBUF_RECV, dsp[r] * es, CL_SBUF_SEND, 0, cnt[r] * es);
            cl_sched_send(b, next, CL_SBUF_SEND, 0, cnt[r] * es);
        } else {
            cl_sched_send(b, next, CL_SBUF_RECV, dsp[sb] * es, cnt[sb] * es);
        }
        cl_sched_recv(b, prev, CL_SBUF_RECV, dsp[rb] * es, cnt[rb] * es);
    }
}

/* alltoallv: alltoall's pairwise exchange with per-peer blocks (never in
 * place: the core refuses it); an empty block is a zero-length message
 * (empty_msgs), so every pair exchanges a frame each way. */
static void sched_alltoallv_pairwise(cl_sched_b *b) {
    int n = b->size, r = b->rank;
    const collie_coll_args *a = b->a;
    uint64_t es = b->esize;
    for (int k = 1; k < n; k++) {
        int to = (r + k) % n, from = cl_sched_mod(r - k, n);
        cl_sched_step(b);
        if (k == 1)
            cl_sched_copy(b, CL_SBUF_RECV, a->rdispls[r] * es, CL_SBUF_SEND, a->sdispls[r] * es,
                          a->recvcounts[r] * es);
        cl_sched_send(b, to, CL_SBUF_SEND, a->sdispls[to] * es, a->sendcounts[to] * es);
        cl_sched_recv(b, from, CL_SBUF_RECV, a->rdispls[from] * es, a->recvcounts[from] * es);
    }
}

/* A v collective on one rank: its own block, copied (allgatherv in place:
 * already there). */
static void sched_local_v(cl_sched_b *b) {
    const collie_coll_args *a = b->a;
    uint64_t es = b->esize, len = a->recvcounts[0] * es;
    bool a2a = a->kind == COLLIE_COLL_ALLTOALLV;
    uint64_t soff = a2a ? a->sdispls[0] * es : 0;
    if (!len || (!a2a && cl_sched_at(a->sendbuf, a->recvbuf, a->rdispls[0] * es))) return;
    cl_sched_step(b);
    cl_sched_copy(b, CL_SBUF_RECV, a->rdispls[0] * es, CL_SBUF_SEND, soff, len);
}

/* Dissemination: in step k notify rank r + 2^k and wait for rank r - 2^k;
 * after ceil(log2 n) steps every rank has heard (transitively) from all. */
static void sched_barrier_dissemination(cl_sched_b *b) {
    int n = b->size, r = b->rank;
    for (int m = 1; m < n; m <<= 1) {
        cl_sched_step(b);
        cl_sched_msg0(b, CL_SOP_SEND, (r + m) % n);
        cl_sched_msg0(b, CL_SOP_RECV, cl_sched_mod(r - m, n));
    }
}

/* Size 1: every kind is "recvbuf = sendbuf", skipped when in place (or, for
 * broadcast, when there is no separate send buffer). */
static void sched_local(cl_sched_b *b) {
    if (b->a->sendbuf == NULL || b->a->sendbuf == b->a->recvbuf) return;
    cl_sched_step(b);
    cl_sched_copy(b, CL_SBUF_RECV, 0, CL_SBUF_SEND, 0, b->bytes);
}

/* ---- entry point ------------------------------------------------------- */

/* sched_bounds: upper bounds on the steps and ops the chosen algorithm
 * emits for one rank, reserved before building. */
static void sched_bounds(const cl_sched_b *b, bool small, uint64_t *steps, uint64_t *ops) {
    uint64_t n = (uint64_t)b->size, L = (uint64_t)sched_ceil_log2(b->size);
    bool v = collie_coll_is_v(b->a->kind);
    if (b->a->kind != COLLIE_COLL_BARRIER && (b->size == 1 || (b->a->count == 0 && !v))) {
        *steps = 1, *ops = 1;
        return;
    }

    switch (b->a->kind) {
    case COLLIE_COLL_ALLREDUCE:
        if (small)
            *steps = L + 4, *ops = 2 * (L + 4);
        else
            *steps = 2 * n + 1, *ops = 4 * n + 3;
        break;
    case COLLIE_COLL_BROADCAST: *steps = L, *ops = 2 * L + 1; break;
    case COLLIE_COLL_REDUCE: *steps = L + 1, *ops = L + 2; break;
    case COLLIE_COLL_ALLGATHER: *steps = n, *ops = 2 * n + 1; break;
    case COLLIE_COLL_REDUCE_SCATTER: *steps = n + 1, *ops = 2 * n + 1; break;
    case COLLIE_COLL_ALLTOALL: *steps = n + 1, *ops = 2 * n + 2; break;
    case COLLIE_COLL_ALLGATHERV: *steps = n, *ops = 2 * n + 1; break;
    case COLLIE_COLL_ALLTOALLV: *steps = n, *ops = 2 * n + 1; break;
    case COLLIE_COLL_GATHER:
    case COLLIE_COLL_SCATTER: *steps = 1, *ops = n + 1; break;
    default: *steps = L, *ops = 2 * L; break; /* barrier */
    }
}

/* sched_reserve: grow (never shrink) the arrays to hold `steps` steps and
 * `ops` ops. On failure s keeps its contents (realloc keeps the old block). */
static int sched_reserve(cl_sched *s, uint64_t steps, uint64_t ops) {
    steps += 1; /* step_start[nsteps] closes the last step */
    if (ops == 0) ops = 1;
    if (steps > UINT32_MAX || ops > UINT32_MAX) return COLLIE_EINVAL;
    if (s->cap_steps < steps) {
        uint32_t *p = realloc(s->step_start, steps * sizeof *p);
        if (!p) return COLLIE_ENOMEM;
        s->step_start = p;
        s->cap_steps = (uint32_t)steps;
    }
    if (s->cap_ops < ops) {
        cl_sop *p = realloc(s->ops, ops * sizeof *p);
        if (!p) return COLLIE_ENOMEM;
        s->ops = p;
        s->cap_ops = (uint32_t)ops;
    }
    return COLLIE_OK;
}

static bool sched_is_reduction(collie_coll_kind k) {
    return k == COLLIE_COLL_ALLREDUCE || k == COLLIE_COLL_REDUCE || k == COLLIE_COLL_REDUCE_SCATTER;
}

static bool sched_is_rooted(collie_coll_kind k) {
    return k == COLLIE_COLL_BROADCAST || k == COLLIE_COLL_REDUCE || k == COLLIE_COLL_GATHER ||
           k == COLLIE_COLL_SCATTER;
}

/* The counts and displacements of a v collective: present, and every
 * block's end in bytes without overflow (the core checked more). */
static int sched_validate_v(const collie_coll_args *a, int size, uint64_t esize, const char **why) {
    bool a2a = a->kind == COLLIE_COLL_ALLTOALLV;
    if (!a->recvcounts || !a->rdispls || (a2a && (!a->sendcounts || !a->sdispls))) {
        *why = "counts or displacements missing";
        return COLLIE_EINVAL;
    }
    for (int p = 0; p < size; p++) {
        uint64_t end;
        for (int side = 0; side < (a2a ? 2 : 1); side++) {
            const size_t *cnt = side ? a->sendcounts : a->recvcounts;
            const size_t *dsp = side ? a->sdispls : a->rdispls;
            if (__builtin_add_overflow((uint64_t)dsp[p], (uint64_t)cnt[p], &end) ||
                __builtin_mul_overflow(end, esize, &end) || end > SIZE_MAX) {
                *why = "a block's end overflows";
                return COLLIE_EINVAL;
            }
        }
    }
    return COLLIE_OK;
}

/* sched_validate: the checks the core may already have made, repeated
 * because a wrong schedule is silent data corruption on every rank. */
static int sched_validate(const collie_coll_args *a, int rank, int size, uint64_t *esize,
                          const char **why) {
    if (size < 1 || rank < 0 || rank >= size) {
        *why = "rank outside [0, size)";
        return COLLIE_EINVAL;
    }
    if ((unsigned)a->kind >= COLLIE_COLL_NUM_KINDS || a->kind == COLLIE_COLL_SEND ||
        a->kind == COLLIE_COLL_RECV) {
        *why = "not a scheduled collective";
        return COLLIE_EINVAL;
    }
    *esize = 0;
    if (a->kind == COLLIE_COLL_BARRIER) return COLLIE_OK;
    *esize = cl_dtype_size(a->dtype);
    if (*esize == 0) {
        *why = "invalid dtype";
        return COLLIE_EINVAL;
    }
    if (sched_is_reduction(a->kind) && (unsigned)a->op >= COLLIE_NUM_REDOPS) {
        *why = "invalid reduction";
        return COLLIE_EINVAL;
    }
    if (sched_is_rooted(a->kind) && (a->root < 0 || a->root >= size)) {
        *why = "root outside [0, size)";
        return COLLIE_EINVAL;
    }
    if (collie_coll_is_v(a->kind)) return sched_validate_v(a, size, *esize, why);
    /* the largest buffer of any kind is size * count elements */
    uint64_t total;
    if (__builtin_mul_overflow((uint64_t)a->count, *esize, &total) ||
        __builtin_mul_overflow(total, (uint64_t)size, &total) || total > SIZE_MAX) {
        *why = "count x ranks overflows";
        return COLLIE_EINVAL;
    }
    return COLLIE_OK;
}

/* Count 0 moves nothing, but the ranks still meet: a rank that posted 0
 * where a peer posted more must not end OK alone while the peer waits out
 * its deadline. It runs the pattern of a one-element collective of the
 * same kind (a small count's algorithm, the same steps) with every message
 * empty and nothing local: the frames carry this collective's arguments,
 * so a peer that posted more sees the disagreement within a round trip,
 * and when every rank posted 0 they all end OK having touched no buffer. */
static int sched_build_empty(cl_sched *s, const collie_coll_args *a, int rank, int size) {
    collie_coll_args one = *a;
    one.count = 1;
    int res = cl_sched_build(s, &one, rank, size);
    if (res != COLLIE_OK) return res;
    uint32_t out = 0, in = 0;
    for (uint32_t k = 0; k < s->nsteps; k++) {
        uint32_t end = s->step_start[k + 1];
        s->step_start[k] = out;
        for (; in < end; in++) {
            cl_sop o = s->ops[in];
            if (o.kind != CL_SOP_SEND && o.kind != CL_SOP_RECV && o.kind != CL_SOP_RECV_REDUCE &&
                o.kind != CL_SOP_RECV_REDUCE3)
                continue; /* local work: nothing to do on no data */
            if (o.kind != CL_SOP_SEND) o.kind = CL_SOP_RECV;
            o.off = o.src_off = o.len = 0;
            s->ops[out++] = o;
        }
    }
    s->nops = out;
    s->scratch_bytes = 0;
    while (s->nsteps > 0 && s->step_start[s->nsteps - 1] == s->nops)
        s->nsteps--;
    s->step_start[s->nsteps] = s->nops;
    return COLLIE_OK;
}

int cl_sched_build(cl_sched *s, const collie_coll_args *a, int rank, int size) {
    if (!s || !a) return COLLIE_EINVAL;
    if (a->count == 0 && size > 1 && a->kind != COLLIE_COLL_BARRIER && !collie_coll_is_v(a->kind)) {
        const char *why;
        uint64_t esize;
        int res = sched_validate(a, rank, size, &esize, &why);
        return res != COLLIE_OK ? res : sched_build_empty(s, a, rank, size);
    }
    cl_sched_b b = {
        .s = s, .a = a, .rank = rank, .size = size, .empty_msgs = collie_coll_is_v(a->kind)};
    const char *why;
    int res = sched_validate(a, rank, size, &b.esize, &why);
    if (res != COLLIE_OK) return res;
    b.bytes = (uint64_t)a->count * b.esize;
    bool small = b.bytes <= CL_SCHED_SMALL_BYTES;

    uint64_t steps, ops;
    sched_bounds(&b, small, &steps, &ops);
    res = sched_reserve(s, steps, ops);
    if (res != COLLIE_OK) return res;

    s->nsteps = s->nops = 0;
    s->scratch_bytes = 0;
    if (a->kind == COLLIE_COLL_BARRIER) {
        sched_barrier_dissemination(&b);
    } else if (collie_coll_is_v(a->kind)) {
        if (size == 1)
            sched_local_v(&b);
        else if (a->kind == COLLIE_COLL_ALLGATHERV)
            sched_allgatherv_ring(&b);
        else
            sched_alltoallv_pairwise(&b);
    } else if (a->count == 0) {
        /* one rank, nothing to move (more ranks: sched_build_empty) */
    } else if (size == 1) {
        sched_local(&b);
    } else {
        switch (a->kind) {
        case COLLIE_COLL_ALLREDUCE:
            if (small)
                cl_sched_allreduce_rd(&b);
            else
                cl_sched_allreduce_ring(&b);
            break;
        case COLLIE_COLL_BROADCAST: cl_sched_broadcast_binomial(&b); break;
        case COLLIE_COLL_REDUCE: cl_sched_reduce_binomial(&b); break;
        case COLLIE_COLL_ALLGATHER: cl_sched_allgather_ring(&b); break;
        case COLLIE_COLL_REDUCE_SCATTER: cl_sched_reduce_scatter_ring(&b); break;
        case COLLIE_COLL_ALLTOALL: sched_alltoall_pairwise(&b); break;
        case COLLIE_COLL_GATHER: sched_gather_direct(&b); break;
        case COLLIE_COLL_SCATTER: sched_scatter_direct(&b); break;
        default: break;
        }
    }
    if (b.err) {
        s->nsteps = s->nops = 0;
        s->step_start[0] = 0;
        return b.err;
    }
    /* trailing empty steps carry nothing; leading and inner ones keep the
     * global numbering */
    while (s->nsteps > 0 && s->step_start[s->nsteps - 1] == s->nops)
        s->nsteps--;
    s->step_start[s->nsteps] = s->nops;
    return COLLIE_OK;
}

const char *cl_sched_explain(const collie_coll_args *a, int rank, int size) {
    uint64_t esize;
    const char *why = NULL;
    if (!a) return "no arguments";
    return sched_validate(a, rank, size, &esize, &why) == COLLIE_OK ? NULL : why;
}

void cl_sched_fini(cl_sched *s) {
    if (!s) return;
    free(s->ops);
    free(s->step_start);
    *s = (cl_sched){0};
}
