/*
 * sched_impl.h — the schedule builder shared by sched.c (entry point,
 * direct algorithms), sched_tree.c (recursive doubling, binomial trees) and
 * sched_ring.c (rings). Not part of the executor's contract (sched.h).
 */
#ifndef CL_TCP_SCHED_IMPL_H
#define CL_TCP_SCHED_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "transports/cpu/sched.h"

/* cl_sched_b: one build in progress. `err` latches the first failure of a
 * push (a capacity bound that was too small); later pushes are ignored. */
typedef struct cl_sched_b {
    cl_sched *s;
    const collie_coll_args *a;
    int err;
    int rank, size;
    uint64_t esize; /* bytes per element */
    uint64_t bytes; /* count * esize: one block */
    /* the v collectives: an empty block is still a message (zero-length),
     * so every pair that should talk does and a disagreement on the
     * counts is seen at once (the frame's check word, cpu.h) */
    bool empty_msgs;
} cl_sched_b;

/* cl_sched_step: open the next step; later pushes land in it. Steps are
 * numbered globally (every rank of the algorithm agrees on what step k
 * is), so a rank that is idle in step k still opens it. */
void cl_sched_step(cl_sched_b *b);

/* Op pushers. Data ops of length 0 are not emitted (both ends of a
 * message compute the same length, so both skip it), except the messages
 * of a build with empty_msgs; cl_sched_msg0 emits a zero-length message
 * pair for barriers. SCRATCH references grow
 * s->scratch_bytes to cover them. */
void cl_sched_send(cl_sched_b *b, int peer, int buf, uint64_t off, uint64_t len);
void cl_sched_recv(cl_sched_b *b, int peer, int buf, uint64_t off, uint64_t len);
void cl_sched_recv_reduce(cl_sched_b *b, int peer, int buf, uint64_t off, uint64_t len);
void cl_sched_recv_reduce3(cl_sched_b *b, int peer, int buf, uint64_t off, int src_buf,
                           uint64_t src_off, uint64_t len);
void cl_sched_copy(cl_sched_b *b, int buf, uint64_t off, int src_buf, uint64_t src_off,
                   uint64_t len);
void cl_sched_msg0(cl_sched_b *b, int kind, int peer);
/* cl_sched_avg: AVG over (buf, off, len) in the current step. */
void cl_sched_avg(cl_sched_b *b, int buf, uint64_t off, uint64_t len);
/* cl_sched_avg_step: AVG over (buf, off, len) when the op is AVG and size > 1
 * (dividing by 1 is the identity), in a step of its own. */
void cl_sched_avg_step(cl_sched_b *b, int buf, uint64_t off, uint64_t len);

/* cl_sched_chunk: element-aligned chunk i of `count` elements split into n
 * near-equal chunks (the first count % n get one more), in bytes. */
void cl_sched_chunk(const cl_sched_b *b, uint64_t count, int n, int i, uint64_t *off,
                    uint64_t *len);

/* cl_sched_at: does pointer p equal base + off (in-place detection)? */
static inline bool cl_sched_at(const void *p, const void *base, uint64_t off) {
    return p != NULL && base != NULL && (uintptr_t)p == (uintptr_t)base + off;
}

/* cl_sched_mod: r mod n for r possibly negative. */
static inline int cl_sched_mod(int r, int n) { return ((r % n) + n) % n; }

/* Algorithms (rank in [0, size), size >= 2, count > 0). */
void cl_sched_allreduce_rd(cl_sched_b *b);
void cl_sched_allreduce_ring(cl_sched_b *b);
void cl_sched_broadcast_binomial(cl_sched_b *b);
void cl_sched_reduce_binomial(cl_sched_b *b);
void cl_sched_allgather_ring(cl_sched_b *b);
void cl_sched_reduce_scatter_ring(cl_sched_b *b);

#endif
