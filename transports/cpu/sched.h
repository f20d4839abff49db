/*
 * sched.h — collectives compiled into schedules, the TCP executor's input.
 *
 * A schedule is a list of steps run in order; the operations inside one
 * step run concurrently and the step ends when all of them are done.
 * Operations name peers by comm rank and buffers by (buffer id, byte
 * offset), resolved against the work's buffers at run time, so a built
 * schedule holds no pointers and the same builder serves every call.
 *
 * Matching: each message carries (seq, step) and the receiver matches it to
 * its RECV of the same step from that peer. Between one pair of ranks the
 * sender's SENDs and the receiver's RECVs must appear in the same order
 * (step by step, and within a step in op order) — every builder keeps that.
 *
 * Builders also guarantee (tests/test_sched.c checks both on real,
 * aliased addresses): within one step no op writes memory that another op
 * of that step reads or writes, so the ops of a step may run in any order
 * or interleaving and a SEND may read user memory until it completes; and
 * every data op has len > 0, element-aligned offsets, and a buffer that
 * the rank really has (a non-root never refers to a NULL buffer). Barrier
 * messages are zero-length (buf RECV, off 0: never dereferenced), and so
 * are the v collectives' messages of an empty block (never dereferenced;
 * they carry the counts check, cpu.h). Local
 * ops have peer -1. Steps are numbered alike on all ranks, so a rank may
 * have empty steps before or between its messages (never trailing ones).
 */
#ifndef CL_TCP_SCHED_H
#define CL_TCP_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "collie.h"
#include "collie_backend.h"

/* Buffers an operation can refer to. */
enum cl_sbuf {
    CL_SBUF_SEND = 0,    /* the user's send buffer (read only) */
    CL_SBUF_RECV = 1,    /* the user's receive buffer */
    CL_SBUF_SCRATCH = 2, /* the executor's scratch space, cl_sched.scratch_bytes long */
};

enum cl_sop_kind {
    CL_SOP_SEND = 0,     /* send len bytes of (buf, off) to peer */
    CL_SOP_RECV = 1,     /* receive len bytes from peer into (buf, off) */
    CL_SOP_RECV_REDUCE,  /* receive len bytes from peer; (buf,off) = (buf,off) op data */
    CL_SOP_RECV_REDUCE3, /* receive; (buf,off) = data op (src_buf, src_off) */
    CL_SOP_COPY,         /* local: (buf,off) = (src_buf, src_off), len bytes (memmove) */
    CL_SOP_REDUCE_LOCAL, /* local: (buf,off) = (buf,off) op (src_buf, src_off) */
    CL_SOP_AVG,          /* local: divide len bytes at (buf,off) by the comm size */
};

typedef struct cl_sop {
    uint8_t kind;               /* enum cl_sop_kind */
    uint8_t buf;                /* enum cl_sbuf: destination (or source for SEND) */
    uint8_t src_buf;            /* enum cl_sbuf for COPY / REDUCE_LOCAL / RECV_REDUCE3 */
    int32_t peer;               /* comm rank, for SEND / RECV* */
    uint64_t off, src_off, len; /* bytes */
} cl_sop;

typedef struct cl_sched {
    cl_sop *ops;          /* all ops, step by step */
    uint32_t *step_start; /* ops of step s: [step_start[s], step_start[s+1]) */
    uint32_t nsteps, nops;
    uint32_t cap_ops, cap_steps;
    uint64_t scratch_bytes; /* scratch space the schedule needs */
} cl_sched;

/* cl_sched_build: compile one collective for `rank` of `size` ranks into s
 * (reusing s's arrays; grow-only, so steady state allocates nothing).
 * Returns COLLIE_OK or COLLIE_ENOMEM / COLLIE_EINVAL (cl_sched_explain says
 * why; the module is pure and logs nothing). SEND/RECV (point to
 * point) are not scheduled. Algorithm choice (e.g. allreduce: recursive
 * doubling below CL_SCHED_SMALL_BYTES, ring above) is made here. */
int cl_sched_build(cl_sched *s, const collie_coll_args *a, int rank, int size);

/* cl_sched_explain: why cl_sched_build rejects these arguments (a static
 * string), or NULL if it accepts them. */
const char *cl_sched_explain(const collie_coll_args *a, int rank, int size);

/* cl_sched_fini: free the arrays. */
void cl_sched_fini(cl_sched *s);

#define CL_SCHED_SMALL_BYTES (64 * 1024)

#endif
