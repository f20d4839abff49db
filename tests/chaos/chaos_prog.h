/*
 * chaos_prog.h — the chaos rank's seeded program: which comms a round has,
 * which op every slot of a round posts, and this rank's own choices (how it
 * waits, what it cancels, which fault it injects).
 *
 * Design notes
 *  - Pure functions of their arguments: the whole program of every rank is
 *    a function of (seed, world size, rank). Shared choices - what every
 *    member of a comm posts and in which order - come from
 *    (seed, round, comm, slot) only, so all ranks derive the same op for a
 *    slot without talking; per-rank choices from (seed, rank, round, slot).
 *  - A round is a list of slots. Slot s names one comm of the round (the
 *    world, one colour group of a split, or the new_group) and one op on it;
 *    the members of that comm post it, in slot order, the others skip it.
 *    Since every rank posts in slot order, the earliest slot not yet done
 *    has always been posted by all of its members, so no window size can
 *    deadlock the program (chaos_rank.c relies on this).
 *  - Point to point: a slot of kind CH_SENDRECV is one message from `root`
 *    to `peer` (and one back when `bidir`); a CH_ANYSRC slot is `msgs`
 *    messages from each rank of `senders` to `peer`, which posts as many
 *    receives from COLLIE_ANY_SOURCE. Every slot has its own tag, so no
 *    message of one slot can match a receive of another.
 *  - Shapes of the v collectives (per-rank counts, the alltoallv matrix,
 *    gaps between blocks) are functions of the op's key, so the oracle can
 *    compute any rank's layout without storing it.
 *  - Sizes are picked around the transport's thresholds (chaos_prog.c
 *    lists them) and capped when a round's window is deep, so memory stays
 *    bounded.
 *  - The stall burst (fault `stall`, about one round in two): a rank whose
 *    progress falls behind while a peer's work ends. Shared: a victim V, a
 *    sender P and a slot S; the round's new_group is {V, P} (comm ranks 0
 *    and 1) and slots S, S+1, S+2 on it are a barrier, a send P -> V of
 *    512 KiB + 1 MiB at most (lent: single copy on a shared-memory link)
 *    and an allreduce of at most 64 KiB (recursive doubling: one
 *    receive-and-reduce from P, whose frame follows the lent one on the
 *    link). Per rank: V's barrier completes through a callback that blocks
 *    its progress thread stall_ms (50..500); P waits for its barrier,
 *    sleeps stall_pre_ms, posts the send and the allreduce, and its send
 *    ends early (stall_end_ms, 5..30, always less than the stall): by its
 *    deadline, a cancel or an abort of the pair's comm. So V reads the lent
 *    frame only after it was withdrawn, then the allreduce's frame into a
 *    receive posted before (the class of main's 59b5a0d: a withdrawal that
 *    outlived its frame cut the next one short, and the allreduce ended OK
 *    with nothing reduced). A stall round has no other comm-level fault.
 */
#ifndef CHAOS_PROG_H
#define CHAOS_PROG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "collie.h"

#define CH_MAX_RANKS 16
#define CH_MAX_COMMS (CH_MAX_RANKS + 2) /* the world, split colours, one new_group */

typedef enum ch_kind {
    CH_ALLREDUCE,
    CH_BROADCAST,
    CH_REDUCE,
    CH_ALLGATHER,
    CH_GATHER,
    CH_SCATTER,
    CH_REDUCE_SCATTER,
    CH_ALLTOALL,
    CH_BARRIER,
    CH_ALLGATHERV,
    CH_ALLTOALLV,
    CH_SENDRECV,
    CH_ANYSRC,
    CH_NUM_KINDS
} ch_kind;

const char *ch_kind_name(ch_kind k);
/* ch_kind_reduces: the op combines values (its inputs follow the redop) */
bool ch_kind_reduces(ch_kind k);

/* the fault kinds of --faults (bit set) */
enum {
    CH_F_ABORT = 1,
    CH_F_DESTROY = 2,
    CH_F_CANCEL = 4,
    CH_F_DEADLINE = 8,
    CH_F_STALL = 16,
    CH_F_SIGNALS = 32,  /* a signal storm on this rank for a round (chaos_rank.c) */
    CH_F_DISAGREE = 64, /* a rank given another new_group list than its peers */
    CH_F_ALL = 127,
    /* an elastic run (chaos_elastic.c): the survivors shrink, replacements
     * join; not in CH_F_ALL (the driver asks for them by name) */
    CH_F_SHRINK = 128,
    CH_F_GROW = 256,
    /* the rank-side kinds an elastic round keeps: those whose fault sets
     * name no healthy rank (a short deadline names the ranks behind it, a
     * destroy would take the world the survivors shrink; no subgroups) */
    CH_F_ELASTIC_OK = CH_F_ABORT | CH_F_CANCEL | CH_F_SHRINK | CH_F_GROW,
};

/* One slot: the op every member of its comm posts. Ranks are comm ranks. */
typedef struct ch_op {
    int slot;
    int comm; /* index into ch_round.comms */
    ch_kind kind;
    collie_dtype dt;
    collie_redop op;
    size_t count;     /* elements: per block for the block ops, base count for the v ops */
    int root;         /* rooted ops; CH_SENDRECV: the sender */
    int peer;         /* CH_SENDRECV / CH_ANYSRC: the receiver */
    bool bidir;       /* CH_SENDRECV: a message back as well */
    int msgs;         /* CH_ANYSRC: messages per sender */
    uint32_t senders; /* CH_ANYSRC: bit r = comm rank r sends */
    bool in_place;
    bool null_nonroot; /* pass NULL where a non-root needs no buffer */
    bool gaps;         /* v ops: displacements leave gaps between blocks */
    int32_t deadline_ms;
    uint64_t tag; /* point to point */
    uint64_t key; /* the op's data key: hash of (seed, round, comm, slot) */
} ch_op;

typedef struct ch_comm_info {
    int size;
    int members[CH_MAX_RANKS]; /* world rank of each comm rank */
    int me;                    /* this rank's comm rank, -1 if not a member */
} ch_comm_info;

/* A round's shared shape and this rank's choices. */
typedef struct ch_round {
    uint64_t seed;
    int round, world, rank;
    int ops, window;
    /* subgroups */
    bool split;
    int ncolors;
    int color[CH_MAX_RANKS]; /* -1: COLLIE_UNDEFINED */
    int skey[CH_MAX_RANKS];
    bool group;
    int group_n;
    int group_ranks[CH_MAX_RANKS];
    int ncomms;
    ch_comm_info comms[CH_MAX_COMMS]; /* [0] world, [1..ncolors] colours, then the group */
    int group_comm;                   /* index of the new_group's comm, -1 if none */
    /* CH_F_DISAGREE: in this round world rank `misfit` (-1: none) calls
     * new_group with misfit_ranks, the plan's list with another member
     * swapped for a non-member, or two other members swapped: its own
     * position stays, so only a comparison of the lists can tell. Every
     * rank knows it (the plan is the seed's): no member may get a comm. */
    int misfit;
    int misfit_ranks[CH_MAX_RANKS];
    /* the round's comms have an infinite op timeout (every work still has
     * its own deadline): a destroy with works in flight then waits the
     * default op timeout, COLLIE_TIMEOUT_MS (chaos_rank sets 5000), and
     * must return as from a 5 s one */
    bool infinite_timeout;
    /* this rank's choices */
    int wait_bias;      /* -1: mixed, else one ch_style for most works */
    int fault;          /* one of CH_F_* or 0: the comm-level fault of this round */
    int fault_slot;     /* when (in slots) a main-thread fault fires */
    int fault_delay_ms; /* when a thread abort fires (from round start) */
    int abort_from;     /* CH_F_ABORT: 0 main thread, 1 own thread, 2 a completion callback */
    /* CH_F_ABORT in a round with a split or a new_group, about one in two:
     * the thread abort (abort_from 1) of the world starts before
     * make_subgroups and fires abort_sub_ms (0..39) later, so it lands
     * during a split or new_group here while the others are in theirs, or
     * refuse theirs (the parent failed): every such call must end within
     * a bound of the abort, not at its create timeout (chaos_rank.c) */
    bool abort_subgroups;
    int abort_sub_ms;
    int sub_delay_ms;    /* another rank's abort_subgroups: sleep 0..49 ms before the split */
    int cancel_permille; /* receives cancelled (when cancel is allowed) */
    /* the stall burst (CH_F_STALL; see the design notes): slots
     * stall_slot .. stall_slot + 2 on comm stall_comm, or stall_slot -1 */
    int stall_slot;
    int stall_comm;
    int stall_victim, stall_sender; /* world ranks */
    int stall_ms;                   /* the victim's: how long its callback blocks */
    int stall_end;    /* the sender's: how its send ends (CH_F_DEADLINE, _CANCEL, _ABORT) */
    int stall_pre_ms; /* the sender's: sleep between the barrier and its send */
    int stall_end_ms; /* the sender's: its send's deadline, or when it cancels/aborts */
} ch_round;

/* the waiting styles */
typedef enum ch_style {
    CH_W_TEST, /* collie_work_test polling */
    CH_W_WAIT, /* collie_work_wait */
    CH_W_ANY,  /* collie_work_wait_any */
    CH_W_CQ,   /* a completion queue */
    CH_W_CB,   /* a completion callback */
    CH_NUM_STYLES
} ch_style;
const char *ch_style_name(ch_style s);

uint64_t ch_mix(uint64_t x);
uint64_t ch_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* ch_plan_round: the round's comms and this rank's choices. */
void ch_plan_round(ch_round *p, uint64_t seed, int round, int world, int rank, int ops,
                   int inflight_max, int faults);
/* ch_plan_op: slot `slot` of the round (shared by every rank). */
void ch_plan_op(const ch_round *p, int slot, ch_op *op);

/* ch_stall_step: which step of the round's stall burst slot `slot` is
 * (0 the barrier, 1 the lent send, 2 the allreduce), or -1. */
int ch_stall_step(const ch_round *p, int slot);

/* Per-rank choices for one work of a slot (`sub` numbers a slot's works). */
ch_style ch_pick_style(const ch_round *p, int slot, int sub);
bool ch_pick_cancel(const ch_round *p, int slot, int sub, int faults);
/* a short deadline for this receive (no fault while no message matched
 * it), or 0 */
int32_t ch_pick_short_deadline(const ch_round *p, int slot, int sub, int faults);

/* Shapes of the v collectives, in elements. */
size_t ch_agv_count(const ch_op *op, int r);                  /* allgatherv: rank r's block */
size_t ch_a2av_count(const ch_op *op, int s, int d);          /* alltoallv: s sends d */
size_t ch_gap(const ch_op *op, int who, int block, int side); /* gap before a block */

#endif
