/*
 * test_sched.c — TCP schedules (transports/cpu/sched.c) run in an in-memory
 * simulator.
 *
 * Design notes
 *  - For one collective the schedules of all n ranks are built, then run in
 *    lock step: in step s every rank's SENDs are queued first (a snapshot
 *    of the bytes, per ordered pair of ranks), then every RECV* pops the
 *    head of its queue. A RECV whose queue is empty, or whose head comes
 *    from another step or has another length, fails the test; so does a
 *    message still queued at the end of its step. Passing therefore proves
 *    the contract of sched.h: messages match in order, step for step, and
 *    an executor posting a whole step at once cannot deadlock.
 *  - Within a step, ops of one rank must not touch memory another op of
 *    that step writes (checked on real addresses, so in-place aliasing of
 *    SEND and RECV counts): the executor runs them concurrently and sends
 *    straight out of user memory.
 *  - Results are compared bytewise with a reference computed here with the
 *    transport's kernels (transports/reduce.h); the inputs are small
 *    integers, so every summation order gives the same bits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <malloc.h>

#include "transports/reduce.h"
#include "transports/cpu/sched.h"
#include "runner.h"

#define SIM_MAX    8
#define SIM_PERIOD 85 /* lcm of the input generators' periods (17, 5) */

typedef struct sim_msg {
    uint32_t step;
    uint64_t len;
    uint8_t *data;
} sim_msg;

typedef struct sim_queue {
    sim_msg *m;
    size_t head, tail, cap;
} sim_queue;

typedef struct sim_rank {
    collie_coll_args a;
    uint8_t *mem[3]; /* SEND, RECV, SCRATCH as resolved by the executor */
    uint64_t len[3];
    uint8_t *area;         /* allocation holding send and/or recv */
    uint8_t *area2;        /* second allocation when not aliased */
    uint8_t *orig_send;    /* send contents before the run */
    uint8_t *expect;       /* expected recv contents, or NULL: not checked */
    size_t vc[4][SIM_MAX]; /* v kinds: sendcounts, sdispls, recvcounts, rdispls */
} sim_rank;

typedef struct sim {
    int n;
    collie_dtype dt;
    collie_redop op;
    sim_rank r[SIM_MAX];
    sim_queue q[SIM_MAX][SIM_MAX];            /* q[src][dst] */
    uint8_t pat[SIM_MAX][2 * SIM_PERIOD * 8]; /* input patterns */
} sim;

/* schedules persist across runs: arrays only grow, as in the executor */
static cl_sched g_sched[SIM_MAX];
static uint64_t g_runs, g_msgs, g_ops;

/* ---- data -------------------------------------------------------------- */

/* sim_val: the input element i of rank r (small integers: exact in every
 * dtype and summation order). Products use {-1, 1, 2}. */
static double sim_val(int r, uint64_t i, collie_dtype dt, collie_redop op) {
    if (op == COLLIE_PROD) {
        static const double v[] = {1, 2, -1, 1, 1};
        double x = v[(r * 3 + i * 7) % 5];
        return dt == COLLIE_UINT8 && x < 0 ? 1 : x;
    }
    int v = (int)((r * 7 + i * 13 + 5) % 17) - 8;
    return dt == COLLIE_UINT8 ? v + 8 : v;
}

static void sim_set(uint8_t *p, uint64_t i, collie_dtype dt, double v) {
    float f = (float)v;
    switch (dt) {
    case COLLIE_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case COLLIE_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case COLLIE_INT32: {
        int32_t x = (int32_t)v;
        memcpy(p + 4 * i, &x, 4);
        break;
    }
    case COLLIE_INT64: {
        int64_t x = (int64_t)v;
        memcpy(p + 8 * i, &x, 8);
        break;
    }
    case COLLIE_FP16: cl_float_to_fp16(p + 2 * i, &f, 1); break;
    case COLLIE_BF16: cl_float_to_bf16(p + 2 * i, &f, 1); break;
    case COLLIE_FP32: memcpy(p + 4 * i, &f, 4); break;
    case COLLIE_FP64: memcpy(p + 8 * i, &v, 8); break;
    default: fail();
    }
}

/* Inputs are periodic in the element index (period SIM_PERIOD), so a
 * rank's input is tiled from a pattern of 2 periods built once per run. */

static void sim_patterns(sim *S) {
    for (int r = 0; r < SIM_MAX; r++)
        for (uint64_t i = 0; i < 2 * SIM_PERIOD; i++)
            sim_set(S->pat[r], i, S->dt, sim_val(r, i, S->dt, S->op));
}

/* sim_fill: `count` elements of rank r's input, starting at element `first`. */
static void sim_fill(sim *S, uint8_t *p, int r, uint64_t first, uint64_t count) {
    size_t es = collie_dtype_size(S->dt);
    const uint8_t *src = S->pat[r] + (first % SIM_PERIOD) * es;
    while (count > 0) {
        uint64_t k = count < SIM_PERIOD ? count : SIM_PERIOD;
        memcpy(p, src, k * es);
        p += k * es;
        count -= k;
    }
}

/* ---- the network ------------------------------------------------------- */

static void sim_push(sim_queue *q, uint32_t step, const uint8_t *src, uint64_t len) {
    if (q->tail == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 8;
        q->m = realloc(q->m, q->cap * sizeof *q->m);
        assert_non_null(q->m);
    }
    uint8_t *d = malloc(len ? len : 1);
    assert_non_null(d);
    if (len) memcpy(d, src, len);
    q->m[q->tail++] = (sim_msg){.step = step, .len = len, .data = d};
    g_msgs++;
}

/* ---- checks ------------------------------------------------------------ */

typedef struct sim_range {
    uintptr_t lo, hi;
} sim_range;

static bool sim_overlap(sim_range a, sim_range b) { return a.lo < b.hi && b.lo < a.hi; }

static uint8_t *sim_addr(sim_rank *R, int buf, uint64_t off, uint64_t len) {
    assert_true(buf >= 0 && buf <= 2);
    if (len == 0) return R->mem[buf] ? R->mem[buf] + off : NULL;
    assert_non_null(R->mem[buf]);
    assert_true(off <= R->len[buf] && len <= R->len[buf] - off);
    return R->mem[buf] + off;
}

static bool sim_is_recv(int kind) {
    return kind == CL_SOP_RECV || kind == CL_SOP_RECV_REDUCE || kind == CL_SOP_RECV_REDUCE3;
}

/* sim_access: the memory an op writes and reads. */
static void sim_access(sim_rank *R, const cl_sop *o, sim_range *w, sim_range *rd) {
    uintptr_t d = (uintptr_t)sim_addr(R, o->buf, o->off, o->len);
    *w = (sim_range){0, 0};
    *rd = (sim_range){0, 0};
    switch (o->kind) {
    case CL_SOP_SEND: *rd = (sim_range){d, d + o->len}; break;
    case CL_SOP_RECV:
    case CL_SOP_RECV_REDUCE:
    case CL_SOP_AVG: *w = (sim_range){d, d + o->len}; break;
    case CL_SOP_RECV_REDUCE3:
    case CL_SOP_COPY:
    case CL_SOP_REDUCE_LOCAL: {
        uintptr_t s = (uintptr_t)sim_addr(R, o->src_buf, o->src_off, o->len);
        *w = (sim_range){d, d + o->len};
        *rd = (sim_range){s, s + o->len};
        /* the reduce kernels allow exact aliasing only */
        if (o->kind != CL_SOP_COPY) assert_true(s == d || !sim_overlap(*w, *rd));
        break;
    }
    default: fail_msg("unknown op kind %d", o->kind);
    }
}

/* sim_check_static: per-op sanity of rank r's schedule. */
static void sim_check_static(sim *S, int r, collie_coll_kind kind) {
    cl_sched *s = &g_sched[r];
    sim_rank *R = &S->r[r];
    size_t es = kind == COLLIE_COLL_BARRIER ? 1 : collie_dtype_size(S->dt);
    bool reduction = kind == COLLIE_COLL_ALLREDUCE || kind == COLLIE_COLL_REDUCE ||
                     kind == COLLIE_COLL_REDUCE_SCATTER;
    assert_true(s->nsteps <= s->cap_steps && s->nops <= s->cap_ops);
    assert_int_equal(s->step_start[0], 0);
    for (uint32_t k = 0; k < s->nsteps; k++)
        assert_true(s->step_start[k] <= s->step_start[k + 1]);
    assert_int_equal(s->step_start[s->nsteps], s->nops);
    if (s->nsteps > 0) assert_true(s->step_start[s->nsteps - 1] < s->nops); /* trimmed */
    int sends = 0, recvs = 0;
    for (uint32_t i = 0; i < s->nops; i++) {
        const cl_sop *o = &s->ops[i];
        assert_true(o->off % es == 0 && o->src_off % es == 0 && o->len % es == 0);
        if (kind == COLLIE_COLL_BARRIER || (S->r[r].a.count == 0 && !collie_coll_is_v(kind)))
            assert_int_equal(o->len, 0); /* count 0: a barrier of empty frames */
        else if (!collie_coll_is_v(kind) || (o->kind != CL_SOP_SEND && !sim_is_recv(o->kind)))
            assert_true(o->len > 0); /* the v collectives' messages may be empty blocks */
        if (o->kind == CL_SOP_SEND) sends++;
        if (sim_is_recv(o->kind)) recvs++;
        if (o->kind == CL_SOP_SEND || sim_is_recv(o->kind)) {
            assert_true(o->peer >= 0 && o->peer < S->n && o->peer != r);
        }
        if (o->kind != CL_SOP_SEND) assert_int_not_equal(o->buf, CL_SBUF_SEND); /* read only */
        if (o->kind == CL_SOP_RECV_REDUCE || o->kind == CL_SOP_RECV_REDUCE3 ||
            o->kind == CL_SOP_REDUCE_LOCAL || o->kind == CL_SOP_AVG)
            assert_true(reduction);
        if (o->kind == CL_SOP_AVG) assert_int_equal(S->op, COLLIE_AVG);
        sim_range w, rd;
        sim_access(R, o, &w, &rd); /* bounds */
    }
    /* the v collectives: every pair of the ring or of the exchange talks,
     * an empty block included (a disagreement on the counts is seen at
     * once, never waited for) */
    if (collie_coll_is_v(kind) && S->n > 1) {
        assert_int_equal(sends, S->n - 1);
        assert_int_equal(recvs, S->n - 1);
    }
}

/* sim_check_hazards: no op of step k writes what another op of it touches. */
static void sim_check_hazards(sim *S, int r, uint32_t k) {
    cl_sched *s = &g_sched[r];
    for (uint32_t i = s->step_start[k]; i < s->step_start[k + 1]; i++) {
        sim_range wi, ri;
        sim_access(&S->r[r], &s->ops[i], &wi, &ri);
        for (uint32_t j = s->step_start[k]; j < s->step_start[k + 1]; j++) {
            if (j == i) continue;
            sim_range wj, rj;
            sim_access(&S->r[r], &s->ops[j], &wj, &rj);
            if (sim_overlap(wi, wj) || sim_overlap(wi, rj))
                fail_msg("rank %d step %u: op %u (kind %d) writes what op %u (kind %d) uses", r, k,
                         i, s->ops[i].kind, j, s->ops[j].kind);
        }
    }
}

/* ---- running ----------------------------------------------------------- */

static void sim_apply(sim *S, int r, uint32_t k, const cl_sop *o) {
    sim_rank *R = &S->r[r];
    size_t es = collie_dtype_size(S->dt);
    uint8_t *dst = sim_addr(R, o->buf, o->off, o->len);
    if (sim_is_recv(o->kind)) {
        sim_queue *q = &S->q[o->peer][r];
        if (q->head == q->tail)
            fail_msg("rank %d step %u waits for rank %d, which sent nothing in this step", r, k,
                     o->peer);
        sim_msg m = q->m[q->head++];
        if (m.step != k || m.len != o->len)
            fail_msg("rank %d step %u: message from %d has step %u len %llu, expected len %llu", r,
                     k, o->peer, m.step, (unsigned long long)m.len, (unsigned long long)o->len);
        if (o->kind == CL_SOP_RECV && o->len)
            memcpy(dst, m.data, o->len);
        else if (o->kind == CL_SOP_RECV_REDUCE)
            cl_reduce(dst, m.data, o->len / es, S->dt, S->op);
        else if (o->kind == CL_SOP_RECV_REDUCE3)
            cl_reduce3(dst, m.data, sim_addr(R, o->src_buf, o->src_off, o->len), o->len / es, S->dt,
                       S->op);
        free(m.data);
        if (q->head == q->tail) q->head = q->tail = 0;
        return;
    }
    const uint8_t *src = NULL;
    if (o->kind == CL_SOP_COPY || o->kind == CL_SOP_REDUCE_LOCAL)
        src = sim_addr(R, o->src_buf, o->src_off, o->len);
    switch (o->kind) {
    case CL_SOP_COPY: memmove(dst, src, o->len); break;
    case CL_SOP_REDUCE_LOCAL: cl_reduce(dst, src, o->len / es, S->dt, S->op); break;
    case CL_SOP_AVG: cl_reduce_finalize_avg(dst, o->len / es, S->dt, S->n); break;
    default: fail_msg("unexpected op kind %d", o->kind);
    }
}

/* sim_exec: build every rank's schedule and run them in lock step. */
static void sim_exec(sim *S) {
    int n = S->n;
    uint32_t nsteps = 0;
    for (int r = 0; r < n; r++) {
        assert_int_equal(cl_sched_build(&g_sched[r], &S->r[r].a, r, n), COLLIE_OK);
        uint64_t sb = g_sched[r].scratch_bytes;
        S->r[r].mem[CL_SBUF_SCRATCH] = sb ? malloc(sb) : NULL;
        S->r[r].len[CL_SBUF_SCRATCH] = sb;
        if (sb) memset(S->r[r].mem[CL_SBUF_SCRATCH], 0xc3, sb);
        sim_check_static(S, r, S->r[r].a.kind);
        if (g_sched[r].nsteps > nsteps) nsteps = g_sched[r].nsteps;
        g_ops += g_sched[r].nops;
    }
    for (uint32_t k = 0; k < nsteps; k++) {
        for (int r = 0; r < n; r++) {
            cl_sched *s = &g_sched[r];
            if (k >= s->nsteps) continue;
            sim_check_hazards(S, r, k);
            for (uint32_t i = s->step_start[k]; i < s->step_start[k + 1]; i++) {
                const cl_sop *o = &s->ops[i];
                if (o->kind == CL_SOP_SEND)
                    sim_push(&S->q[r][o->peer], k, sim_addr(&S->r[r], o->buf, o->off, o->len),
                             o->len);
            }
        }
        for (int r = 0; r < n; r++) {
            cl_sched *s = &g_sched[r];
            if (k >= s->nsteps) continue;
            for (uint32_t i = s->step_start[k]; i < s->step_start[k + 1]; i++)
                if (s->ops[i].kind != CL_SOP_SEND) sim_apply(S, r, k, &s->ops[i]);
        }
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                if (S->q[a][b].head != S->q[a][b].tail)
                    fail_msg("step %u: rank %d sent to rank %d, which did not receive it", k, a, b);
    }
    g_runs++;
}

/* sim_verify: results, untouched inputs; then free the run's buffers. */
static void sim_verify(sim *S, const char *what) {
    for (int r = 0; r < S->n; r++) {
        sim_rank *R = &S->r[r];
        if (R->expect && R->len[CL_SBUF_RECV] &&
            memcmp(R->mem[CL_SBUF_RECV], R->expect, R->len[CL_SBUF_RECV]) != 0) {
            uint64_t i = 0;
            while (R->mem[CL_SBUF_RECV][i] == R->expect[i])
                i++;
            fail_msg("%s: rank %d of %d: recv byte %llu differs", what, r, S->n,
                     (unsigned long long)i);
        }
        /* the send buffer is unchanged outside the (aliased) receive buffer */
        uint8_t *sp = R->mem[CL_SBUF_SEND], *rp = R->mem[CL_SBUF_RECV];
        uint64_t slen = R->len[CL_SBUF_SEND], lo = slen, hi = slen;
        if (slen && rp && (uintptr_t)rp + R->len[CL_SBUF_RECV] > (uintptr_t)sp &&
            (uintptr_t)rp < (uintptr_t)sp + slen) {
            lo = rp > sp ? (uint64_t)(rp - sp) : 0;
            hi = (uintptr_t)rp + R->len[CL_SBUF_RECV] - (uintptr_t)sp;
            if (hi > slen) hi = slen;
        }
        if (slen && (memcmp(sp, R->orig_send, lo) != 0 ||
                     memcmp(sp + hi, R->orig_send + hi, slen - hi) != 0))
            fail_msg("%s: rank %d of %d: the send buffer was written", what, r, S->n);
        free(R->area);
        free(R->area2);
        free(R->orig_send);
        free(R->expect);
        free(R->mem[CL_SBUF_SCRATCH]);
        memset(R, 0, sizeof *R);
    }
}

/* ---- one collective ---------------------------------------------------- */

typedef struct sim_case {
    collie_coll_kind kind;
    int n;
    size_t count;
    collie_dtype dt;
    collie_redop op;
    int root;
    bool inplace;
} sim_case;

static uint8_t *sim_alloc(uint64_t len) {
    uint8_t *p = malloc(len ? len : 1);
    assert_non_null(p);
    memset(p, 0xa5, len); /* garbage the schedule must overwrite */
    return p;
}

/* sim_reduced: the reduction over all ranks of elements [first, first+count). */
static uint8_t *sim_reduced(sim *S, uint64_t first, uint64_t count) {
    size_t es = collie_dtype_size(S->dt);
    uint8_t *acc = sim_alloc(count * es), *tmp = sim_alloc(count * es);
    sim_fill(S, acc, 0, first, count);
    for (int r = 1; r < S->n; r++) {
        sim_fill(S, tmp, r, first, count);
        cl_reduce(acc, tmp, count, S->dt, S->op);
    }
    if (S->op == COLLIE_AVG) cl_reduce_finalize_avg(acc, count, S->dt, S->n);
    free(tmp);
    return acc;
}

/* The v kinds' counts at count C: uneven, every third rank (or pair) 0. */
static size_t sim_gv_count(uint64_t C, int p) { return p % 3 == 1 ? 0 : (size_t)C + (size_t)p; }
static size_t sim_av_count(uint64_t C, int r, int p) {
    return (r * 7 + p * 3) % 5 == 0 ? 0 : (size_t)C + (size_t)((r + p) % 3);
}

/* Displacements of `cnt`: packed, or blocks in reverse rank order with a
 * gap of one element before each (left as the allocator's garbage);
 * returns the buffer length in elements. */
static uint64_t sim_displs(const size_t *cnt, int n, bool scattered, size_t *dsp) {
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        int p = scattered ? n - 1 - i : i;
        at += scattered;
        dsp[p] = at;
        at += cnt[p];
    }
    return at + scattered;
}

/* allgatherv and alltoallv: rank r's input is its send buffer of packed
 * elements; the receive blocks are scattered (not for in place). */
static void sim_setup_v(sim *S, const sim_case *c) {
    int n = c->n;
    size_t es = collie_dtype_size(c->dt);
    bool a2a = c->kind == COLLIE_COLL_ALLTOALLV, inplace = c->inplace && !a2a;
    for (int r = 0; r < n; r++) {
        sim_rank *R = &S->r[r];
        for (int p = 0; p < n; p++) {
            R->vc[0][p] = a2a ? sim_av_count(c->count, r, p) : 0;
            R->vc[2][p] = a2a ? sim_av_count(c->count, p, r) : sim_gv_count(c->count, p);
        }
        sim_displs(R->vc[0], n, false, R->vc[1]);
    }
    for (int r = 0; r < n; r++) {
        sim_rank *R = &S->r[r];
        uint64_t rend = sim_displs(R->vc[2], n, !inplace, R->vc[3]), stotal = 0;
        for (int p = 0; p < n; p++)
            stotal += a2a ? R->vc[0][p] : 0;
        if (!a2a) stotal = R->vc[2][r];
        uint8_t *recv = R->area = sim_alloc(rend * es), *send;
        if (inplace)
            send = recv + R->vc[3][r] * es;
        else
            send = R->area2 = sim_alloc(stotal * es);
        sim_fill(S, send, r, 0, stotal);
        R->expect = sim_alloc(rend * es);
        memcpy(R->expect, recv, rend * es); /* gaps keep the garbage */
        for (int p = 0; p < n; p++)         /* from rank p: its block for r */
            sim_fill(S, R->expect + R->vc[3][p] * es, p, a2a ? S->r[p].vc[1][r] : 0, R->vc[2][p]);
        R->mem[CL_SBUF_SEND] = send, R->len[CL_SBUF_SEND] = stotal * es;
        R->mem[CL_SBUF_RECV] = recv, R->len[CL_SBUF_RECV] = rend * es;
        R->orig_send = sim_alloc(stotal * es);
        if (stotal) memcpy(R->orig_send, send, stotal * es);
        uint64_t total = 0;
        for (int p = 0; p < n; p++)
            total += R->vc[2][p];
        R->a = (collie_coll_args){.kind = c->kind,
                                  .sendbuf = send,
                                  .recvbuf = recv,
                                  .count = a2a ? stotal : total,
                                  .dtype = c->dt,
                                  .sendcounts = a2a ? R->vc[0] : NULL,
                                  .sdispls = a2a ? R->vc[1] : NULL,
                                  .recvcounts = R->vc[2],
                                  .rdispls = R->vc[3]};
    }
}

/* sim_setup: buffers, inputs and expected outputs of every rank. Rank r's
 * input element i of its send buffer is sim_val(r, i); blocked layouts
 * (alltoall, scatter, reduce_scatter) index elements over the whole
 * buffer, so block p of rank r holds elements [p*count, (p+1)*count). */
static void sim_setup(sim *S, const sim_case *c) {
    int n = c->n;
    size_t es = collie_dtype_size(c->dt);
    uint64_t C = c->count, B = C * es, nB = (uint64_t)n * B;
    memset(S->r, 0, sizeof S->r);
    S->n = n, S->dt = c->dt, S->op = c->op;
    sim_patterns(S);
    if (collie_coll_is_v(c->kind)) {
        sim_setup_v(S, c);
        return;
    }
    uint8_t *red = NULL; /* reduction of element-range [0, C) or [0, nC) */
    if (c->kind == COLLIE_COLL_ALLREDUCE || c->kind == COLLIE_COLL_REDUCE)
        red = sim_reduced(S, 0, C);
    if (c->kind == COLLIE_COLL_REDUCE_SCATTER) red = sim_reduced(S, 0, (uint64_t)n * C);

    for (int r = 0; r < n; r++) {
        sim_rank *R = &S->r[r];
        uint8_t *send = NULL, *recv = NULL;
        uint64_t slen = 0, rlen = 0;
        bool root = r == c->root;
        switch (c->kind) {
        case COLLIE_COLL_ALLREDUCE:
        case COLLIE_COLL_REDUCE:
            slen = B;
            rlen = c->kind == COLLIE_COLL_REDUCE && !root && !c->inplace ? 0 : B;
            R->area = sim_alloc(B);
            send = R->area;
            if (c->inplace)
                recv = send;
            else if (rlen)
                recv = R->area2 = sim_alloc(B);
            sim_fill(S, send, r, 0, C);
            if (c->kind == COLLIE_COLL_ALLREDUCE || root) {
                R->expect = sim_alloc(B);
                memcpy(R->expect, red, B);
            } else if (c->inplace) {
                R->expect = sim_alloc(B); /* a non-root's buffer is left alone */
                memcpy(R->expect, send, B);
            }
            break;
        case COLLIE_COLL_BROADCAST:
            rlen = slen = B;
            recv = send = R->area = sim_alloc(B);
            if (root) {
                if (!c->inplace) send = R->area2 = sim_alloc(B);
                sim_fill(S, send, r, 0, C);
            }
            R->expect = sim_alloc(B);
            sim_fill(S, R->expect, c->root, 0, C);
            break;
        case COLLIE_COLL_ALLGATHER:
        case COLLIE_COLL_GATHER:
            slen = B;
            rlen = c->kind == COLLIE_COLL_ALLGATHER || root ? nB : 0;
            if (rlen) recv = R->area = sim_alloc(nB);
            if (c->inplace && rlen)
                send = recv + (uint64_t)r * B;
            else
                send = R->area2 = sim_alloc(B);
            sim_fill(S, send, r, 0, C);
            if (rlen) {
                R->expect = sim_alloc(nB);
                for (int p = 0; p < n; p++)
                    sim_fill(S, R->expect + (uint64_t)p * B, p, 0, C);
            }
            break;
        case COLLIE_COLL_REDUCE_SCATTER:
            slen = nB, rlen = B;
            send = R->area = sim_alloc(nB);
            sim_fill(S, send, r, 0, (uint64_t)n * C);
            recv = c->inplace ? send + (uint64_t)r * B : (R->area2 = sim_alloc(B));
            R->expect = sim_alloc(B);
            memcpy(R->expect, red + (uint64_t)r * B, B);
            break;
        case COLLIE_COLL_ALLTOALL:
            slen = rlen = nB;
            send = R->area = sim_alloc(nB);
            recv = c->inplace ? send : (R->area2 = sim_alloc(nB));
            sim_fill(S, send, r, 0, (uint64_t)n * C);
            R->expect = sim_alloc(nB);
            for (int p = 0; p < n; p++) /* block p comes from rank p's block r */
                sim_fill(S, R->expect + (uint64_t)p * B, p, (uint64_t)r * C, C);
            break;
        case COLLIE_COLL_SCATTER:
            rlen = B, slen = root ? nB : 0;
            if (root) {
                send = R->area = sim_alloc(nB);
                sim_fill(S, send, r, 0, (uint64_t)n * C);
                recv = c->inplace ? send + (uint64_t)r * B : (R->area2 = sim_alloc(B));
            } else {
                recv = R->area2 = sim_alloc(B);
            }
            R->expect = sim_alloc(B);
            sim_fill(S, R->expect, c->root, (uint64_t)r * C, C);
            break;
        default: /* barrier */ break;
        }
        R->mem[CL_SBUF_SEND] = send, R->len[CL_SBUF_SEND] = slen;
        R->mem[CL_SBUF_RECV] = recv, R->len[CL_SBUF_RECV] = rlen;
        R->orig_send = sim_alloc(slen);
        if (slen) memcpy(R->orig_send, send, slen);
        R->a = (collie_coll_args){.kind = c->kind,
                                  .sendbuf = send,
                                  .recvbuf = recv,
                                  .count = c->count,
                                  .dtype = c->dt,
                                  .op = c->op,
                                  .root = c->root};
    }
    free(red);
}

static sim g_sim;

static void sim_case_run(const sim_case *c) {
    char what[160];
    snprintf(what, sizeof what, "kind %d n %d count %zu %s %s root %d%s", (int)c->kind, c->n,
             c->count, collie_dtype_name(c->dt), collie_redop_name(c->op), c->root,
             c->inplace ? " in place" : "");
    sim_setup(&g_sim, c);
    sim_exec(&g_sim);
    sim_verify(&g_sim, what);
}

/* ---- the matrix -------------------------------------------------------- */

static const int sizes[] = {1, 2, 3, 4, 5, 6, 7, 8};
/* Under ASan the largest count shrinks to one that still crosses the
 * allreduce threshold for 4- and 8-byte types (the reference reductions
 * dominate the run time there). */
#if defined(__SANITIZE_ADDRESS__)
#define SIM_BIG 16500
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_BIG 16500
#endif
#endif
#ifndef SIM_BIG
#define SIM_BIG 70000
#endif
_Static_assert(SIM_BIG * 4 > CL_SCHED_SMALL_BYTES, "the big count must cross the threshold");
static const size_t counts[] = {0, 1, 7, 1027, SIM_BIG};
static const collie_redop ops[] = {COLLIE_SUM, COLLIE_MAX, COLLIE_AVG};
static const collie_dtype dtypes[] = {COLLIE_FP32, COLLIE_INT32, COLLIE_INT64};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* roots {0, last, middle}, deduplicated */
static int sim_roots(int n, int out[3]) {
    int k = 0, cand[3] = {0, n - 1, n / 2};
    for (int i = 0; i < 3; i++) {
        bool dup = false;
        for (int j = 0; j < k; j++)
            dup |= out[j] == cand[i];
        if (!dup) out[k++] = cand[i];
    }
    return k;
}

/* sim_matrix: kind x sizes x counts x (ops x dtypes for reductions) x
 * roots x in place. The largest count uses one dtype per op (rotating) to
 * keep the run short. */
static void sim_matrix(collie_coll_kind kind, bool reduction, bool rooted) {
    unsigned rot = 0;
    for (size_t si = 0; si < NELEM(sizes); si++) {
        int n = sizes[si], roots[3];
        int nroots = rooted ? sim_roots(n, roots) : (roots[0] = 0, 1);
        for (size_t ci = 0; ci < NELEM(counts); ci++) {
            bool big = counts[ci] == SIM_BIG;
            for (size_t oi = 0; oi < (reduction ? NELEM(ops) : 1); oi++) {
                for (size_t di = 0; di < NELEM(dtypes); di++) {
                    collie_dtype dt = dtypes[di];
                    if (big) {
                        if (di > 0) break;
                        dt = dtypes[rot++ % NELEM(dtypes)];
                    }
                    for (int ri = 0; ri < nroots; ri++)
                        for (int ip = 0; ip < 2; ip++) {
                            sim_case c = {.kind = kind,
                                          .n = n,
                                          .count = counts[ci],
                                          .dt = dt,
                                          .op = reduction ? ops[oi] : COLLIE_SUM,
                                          .root = roots[ri],
                                          .inplace = ip};
                            sim_case_run(&c);
                        }
                }
            }
        }
    }
}

static void test_allreduce(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_ALLREDUCE, true, false);
}
static void test_broadcast(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_BROADCAST, false, true);
}
static void test_reduce(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_REDUCE, true, true);
}
static void test_allgather(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_ALLGATHER, false, false);
}
static void test_reduce_scatter(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_REDUCE_SCATTER, true, false);
}
static void test_alltoall(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_ALLTOALL, false, false);
}
static void test_allgatherv(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_ALLGATHERV, false, false);
}
static void test_alltoallv(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_ALLTOALLV, false, false);
}
static void test_gather(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_GATHER, false, true);
}
static void test_scatter(void **state) {
    (void)state;
    sim_matrix(COLLIE_COLL_SCATTER, false, true);
}

/* every dtype and op through both allreduce algorithms, reduce and
 * reduce_scatter (element alignment of chunks for 1- and 2-byte types) */
static void test_all_dtypes_and_ops(void **state) {
    (void)state;
    static const collie_coll_kind kinds[] = {COLLIE_COLL_ALLREDUCE, COLLIE_COLL_REDUCE,
                                             COLLIE_COLL_REDUCE_SCATTER, COLLIE_COLL_ALLGATHER};
    for (int dt = 0; dt < COLLIE_NUM_DTYPES; dt++) {
        /* just above the allreduce threshold, and small */
        size_t cnts[] = {13, CL_SCHED_SMALL_BYTES / collie_dtype_size((collie_dtype)dt) + 3};
        for (int op = 0; op < COLLIE_NUM_REDOPS; op++)
            for (size_t k = 0; k < NELEM(kinds); k++)
                for (size_t ci = 0; ci < NELEM(cnts); ci++) {
                    sim_case c = {.kind = kinds[k],
                                  .n = op % 2 ? 5 : 8,
                                  .count = cnts[ci],
                                  .dt = (collie_dtype)dt,
                                  .op = (collie_redop)op,
                                  .root = 3,
                                  .inplace = (dt + op) % 2};
                    sim_case_run(&c);
                }
    }
}

static void test_barrier(void **state) {
    (void)state;
    for (int n = 1; n <= SIM_MAX; n++) {
        sim_case c = {.kind = COLLIE_COLL_BARRIER, .n = n};
        sim_case_run(&c);
        int lg = 0;
        while ((1 << lg) < n)
            lg++;
        for (int r = 0; r < n; r++) {
            assert_int_equal(g_sched[r].nsteps, lg);
            assert_int_equal(g_sched[r].nops, 2 * lg);
            assert_int_equal(g_sched[r].scratch_bytes, 0);
        }
    }
}

static uint32_t sim_steps(collie_coll_kind kind, size_t count, collie_dtype dt, collie_redop op,
                          int n) {
    sim_case c = {.kind = kind, .n = n, .count = count, .dt = dt, .op = op};
    sim_case_run(&c);
    uint32_t m = 0;
    for (int r = 0; r < n; r++)
        if (g_sched[r].nsteps > m) m = g_sched[r].nsteps;
    return m;
}

/* the algorithm switch sits exactly at CL_SCHED_SMALL_BYTES */
static void test_threshold_and_step_counts(void **state) {
    (void)state;
    size_t at = CL_SCHED_SMALL_BYTES / 4;
    uint32_t rd = sim_steps(COLLIE_COLL_ALLREDUCE, at, COLLIE_FP32, COLLIE_SUM, 8);
    uint32_t ring = sim_steps(COLLIE_COLL_ALLREDUCE, at + 1, COLLIE_FP32, COLLIE_SUM, 8);
    assert_int_equal(rd, 3);    /* log2 8 exchanges */
    assert_int_equal(ring, 14); /* 2 (n - 1) */
    uint32_t rd5 = sim_steps(COLLIE_COLL_ALLREDUCE, at, COLLIE_FP32, COLLIE_SUM, 5);
    assert_int_equal(rd5, 4); /* fold in, 2 exchanges, fold out */
    uint32_t rd_avg = sim_steps(COLLIE_COLL_ALLREDUCE, at, COLLIE_FP32, COLLIE_AVG, 8);
    uint32_t ring_avg = sim_steps(COLLIE_COLL_ALLREDUCE, at + 1, COLLIE_FP32, COLLIE_AVG, 8);
    assert_int_equal(rd_avg, 4); /* + AVG */
    assert_int_equal(ring_avg, 15);
    assert_int_equal(sim_steps(COLLIE_COLL_BROADCAST, 100, COLLIE_INT8, COLLIE_SUM, 8), 3);
    assert_int_equal(sim_steps(COLLIE_COLL_REDUCE, 100, COLLIE_INT8, COLLIE_SUM, 7), 3);
    print_message("allreduce steps at n=8: recursive doubling %u (%u with avg), ring %u (%u "
                  "with avg); n=5 recursive doubling %u\n",
                  rd, rd_avg, ring, ring_avg, rd5);
    print_message("simulated %llu collectives, %llu ops, %llu messages\n",
                  (unsigned long long)g_runs, (unsigned long long)g_ops,
                  (unsigned long long)g_msgs);
}

/* scratch stays within what each algorithm needs */
static void test_scratch_use(void **state) {
    (void)state;
    size_t C = 1027; /* 4108 bytes of fp32: recursive doubling */
    sim_steps(COLLIE_COLL_ALLREDUCE, C, COLLIE_FP32, COLLIE_SUM, 8);
    for (int r = 0; r < 8; r++)
        assert_int_equal(g_sched[r].scratch_bytes, 4 * C);
    sim_steps(COLLIE_COLL_ALLREDUCE, 70000, COLLIE_FP32, COLLIE_SUM, 8);
    for (int r = 0; r < 8; r++)
        assert_int_equal(g_sched[r].scratch_bytes, 0); /* ring */
    sim_steps(COLLIE_COLL_REDUCE_SCATTER, C, COLLIE_FP32, COLLIE_SUM, 8);
    for (int r = 0; r < 8; r++)
        assert_int_equal(g_sched[r].scratch_bytes, 2 * 4 * C);
    sim_steps(COLLIE_COLL_REDUCE, C, COLLIE_FP32, COLLIE_SUM, 8); /* root 0 */
    assert_int_equal(g_sched[0].scratch_bytes, 0);
    assert_int_equal(g_sched[2].scratch_bytes, 4 * C); /* has a child */
    assert_int_equal(g_sched[1].scratch_bytes, 0);     /* leaf */
    for (int k = COLLIE_COLL_BROADCAST; k <= COLLIE_COLL_SCATTER; k++) {
        if (k == COLLIE_COLL_REDUCE || k == COLLIE_COLL_REDUCE_SCATTER) continue;
        sim_steps((collie_coll_kind)k, C, COLLIE_FP32, COLLIE_SUM, 8);
        for (int r = 0; r < 8; r++)
            assert_int_equal(g_sched[r].scratch_bytes, 0);
    }
}

static void test_rebuild_does_not_reallocate(void **state) {
    (void)state;
    cl_sched s = {0};
    static float buf[8 * 70000], out[8 * 70000];
    collie_coll_args a = {.kind = COLLIE_COLL_ALLREDUCE,
                          .sendbuf = buf,
                          .recvbuf = out,
                          .count = 70000,
                          .dtype = COLLIE_FP32,
                          .op = COLLIE_AVG};
    assert_int_equal(cl_sched_build(&s, &a, 3, 8), COLLIE_OK);
    cl_sop *ops0 = s.ops;
    uint32_t *steps0 = s.step_start, cap_ops = s.cap_ops, cap_steps = s.cap_steps;
    uint32_t nops = s.nops, nsteps = s.nsteps;
    for (int i = 0; i < 3; i++) { /* same shape */
        assert_int_equal(cl_sched_build(&s, &a, 3, 8), COLLIE_OK);
        assert_ptr_equal(s.ops, ops0);
        assert_ptr_equal(s.step_start, steps0);
        assert_int_equal(s.nops, nops);
        assert_int_equal(s.nsteps, nsteps);
    }
    /* smaller shapes of every kind */
    a.count = 1027;
    for (int k = 0; k < COLLIE_COLL_SEND; k++) {
        a.kind = (collie_coll_kind)k;
        for (int n = 1; n <= 8; n++) {
            assert_int_equal(cl_sched_build(&s, &a, n - 1, n), COLLIE_OK);
            assert_ptr_equal(s.ops, ops0);
            assert_ptr_equal(s.step_start, steps0);
            assert_int_equal(s.cap_ops, cap_ops);
            assert_int_equal(s.cap_steps, cap_steps);
        }
    }
    /* a larger shape grows; going back does not shrink */
    a.kind = COLLIE_COLL_ALLREDUCE, a.count = 70000;
    assert_int_equal(cl_sched_build(&s, &a, 0, 64), COLLIE_OK);
    uint32_t big = s.cap_ops;
    assert_true(big > cap_ops);
    assert_int_equal(cl_sched_build(&s, &a, 3, 8), COLLIE_OK);
    assert_int_equal(s.cap_ops, big);
    cl_sched_fini(&s);
    assert_null(s.ops);
    assert_null(s.step_start);
    cl_sched_fini(&s); /* idempotent */
}

static void test_invalid(void **state) {
    (void)state;
    cl_sched s = {0};
    int x[4] = {0}, y[4] = {0};
    collie_coll_args a = {.kind = COLLIE_COLL_ALLREDUCE,
                          .sendbuf = x,
                          .recvbuf = y,
                          .count = 4,
                          .dtype = COLLIE_INT32,
                          .op = COLLIE_SUM};
    assert_int_equal(cl_sched_build(&s, &a, 1, 4), COLLIE_OK);
    cl_sched before = s;
    cl_sop ops_before[16];
    assert_true(s.nops <= 16);
    memcpy(ops_before, s.ops, s.nops * sizeof *s.ops);

    collie_coll_args b = a;
    b.kind = COLLIE_COLL_SEND;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b.kind = COLLIE_COLL_RECV;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b.kind = COLLIE_COLL_NUM_KINDS;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b = a, b.dtype = COLLIE_NUM_DTYPES;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b = a, b.op = COLLIE_NUM_REDOPS;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b = a, b.kind = COLLIE_COLL_BROADCAST, b.root = 4;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b.root = -1;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    b = a, b.count = SIZE_MAX / 2;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_EINVAL);
    assert_int_equal(cl_sched_build(&s, &a, 4, 4), COLLIE_EINVAL);
    assert_int_equal(cl_sched_build(&s, &a, -1, 4), COLLIE_EINVAL);
    assert_int_equal(cl_sched_build(&s, &a, 0, 0), COLLIE_EINVAL);
    assert_int_equal(cl_sched_build(NULL, &a, 0, 1), COLLIE_EINVAL);
    assert_int_equal(cl_sched_build(&s, NULL, 0, 1), COLLIE_EINVAL);
    /* rejected calls leave the schedule as it was */
    assert_memory_equal(&s, &before, sizeof s);
    assert_memory_equal(s.ops, ops_before, s.nops * sizeof *s.ops);

    /* a barrier ignores dtype and op; a non-reduction ignores op */
    b = a, b.kind = COLLIE_COLL_BARRIER, b.dtype = COLLIE_NUM_DTYPES, b.op = COLLIE_NUM_REDOPS;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_OK);
    b = a, b.kind = COLLIE_COLL_ALLGATHER, b.op = COLLIE_NUM_REDOPS;
    assert_int_equal(cl_sched_build(&s, &b, 1, 4), COLLIE_OK);
    cl_sched_fini(&s);
}

static int sim_teardown(void **state) {
    (void)state;
    for (int r = 0; r < SIM_MAX; r++)
        cl_sched_fini(&g_sched[r]);
    for (int a = 0; a < SIM_MAX; a++)
        for (int b = 0; b < SIM_MAX; b++) {
            assert_int_equal(g_sim.q[a][b].head, g_sim.q[a][b].tail);
            free(g_sim.q[a][b].m);
        }
    return 0;
}

int main(void) {
    /* keep the multi-megabyte buffers of each run on the heap instead of
     * mapping and unmapping (and page-faulting) them thousands of times */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_alltoall),
        cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_scatter),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_all_dtypes_and_ops),
        cmocka_unit_test(test_scratch_use),
        cmocka_unit_test(test_threshold_and_step_counts),
        cmocka_unit_test(test_rebuild_does_not_reallocate),
        cmocka_unit_test(test_invalid),
    };
    return cltest_main(tests, NULL, sim_teardown);
}
