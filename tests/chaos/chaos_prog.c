/*
 * chaos_prog.c — the seeded program of the chaos rank (chaos_prog.h).
 *
 * Design notes
 *  - Hashes, not a stream generator: every choice is ch_hash of the
 *    coordinates it depends on plus a constant naming the choice, so adding
 *    a choice never shifts the others, and a replay with the same seed gets
 *    the same program whatever else changed.
 *  - Sizes around the CPU transport's thresholds (bytes of a block for the
 *    block ops, of the whole buffer otherwise): 64 KiB (allreduce: recursive
 *    doubling up to CL_SCHED_SMALL_BYTES, ring above), 256 KiB (the TCP
 *    staging buffer of receive-and-reduce, TCP_STAGE_BYTES), 512 KiB (the
 *    shared-memory ring, COLLIE_SHM_RING_BYTES, and the single-copy loans,
 *    COLLIE_SHM_SINGLE_COPY), 8 MiB (half of COLLIE_EARLY_BYTES: larger
 *    collective frames are announced and sent once the receive is posted);
 *    each at the threshold and one element either side. Plus empty ops,
 *    tiny ones (inline in one frame) and random sizes between.
 *  - Exactness: reducing ops get values whose results are exact in every
 *    dtype (chaos_oracle.c), so the reference is computed independently of
 *    the library's kernels.
 */
#include "tests/chaos/chaos_prog.h"

#include <string.h>

uint64_t ch_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t ch_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return ch_mix(ch_mix(ch_mix(ch_mix(a) ^ b) ^ c) ^ d);
}

static const char *const ch_kind_names[CH_NUM_KINDS] = {
    [CH_ALLREDUCE] = "allreduce",
    [CH_BROADCAST] = "broadcast",
    [CH_REDUCE] = "reduce",
    [CH_ALLGATHER] = "allgather",
    [CH_GATHER] = "gather",
    [CH_SCATTER] = "scatter",
    [CH_REDUCE_SCATTER] = "reduce_scatter",
    [CH_ALLTOALL] = "alltoall",
    [CH_BARRIER] = "barrier",
    [CH_ALLGATHERV] = "allgatherv",
    [CH_ALLTOALLV] = "alltoallv",
    [CH_SENDRECV] = "sendrecv",
    [CH_ANYSRC] = "recv_any",
};

const char *ch_kind_name(ch_kind k) { return k < CH_NUM_KINDS ? ch_kind_names[k] : "?"; }

bool ch_kind_reduces(ch_kind k) {
    return k == CH_ALLREDUCE || k == CH_REDUCE || k == CH_REDUCE_SCATTER;
}

const char *ch_style_name(ch_style s) {
    static const char *const n[CH_NUM_STYLES] = {"test", "wait", "wait_any", "cq", "callback"};
    return s < CH_NUM_STYLES ? n[s] : "?";
}

/* choice constants: one per independent decision */
enum {
    K_WINDOW = 1,
    K_SPLIT,
    K_NCOLORS,
    K_COLOR,
    K_SKEY,
    K_GROUP,
    K_GROUP_N,
    K_GROUP_PERM,
    K_COMM,
    K_KIND,
    K_DT,
    K_OP,
    K_SIZE,
    K_SIZE2,
    K_ROOT,
    K_PEER,
    K_BIDIR,
    K_MSGS,
    K_SENDERS,
    K_INPLACE,
    K_NULL,
    K_GAPS,
    K_DEADLINE,
    K_VCOUNT,
    K_VGAP,
    K_STYLE,
    K_BIAS,
    K_FAULT,
    K_FAULT_KIND,
    K_FAULT_SLOT,
    K_FAULT_DELAY,
    K_ABORT_FROM,
    K_CANCEL,
    K_CANCEL_RATE,
    K_SHORT,
    K_SHORT_MS,
    K_STALL,
    K_STALL_SLOT,
    K_STALL_WHO,
    K_STALL_PEER,
    K_STALL_MS,
    K_STALL_END,
    K_STALL_PRE,
    K_STALL_END_MS,
    K_DISAGREE,
    K_MISFIT,
    K_MISFIT_SWAP,
    K_INFINITE,
    K_ABORT_SUB,
    K_ABORT_SUB_MS,
    K_SUB_DELAY,
};

static uint64_t round_h(const ch_round *p, uint64_t what, uint64_t x) {
    return ch_hash(p->seed, (uint64_t)p->round << 8 | 1, what, x);
}
static uint64_t rank_h(const ch_round *p, uint64_t what, uint64_t x, uint64_t y) {
    return ch_hash(p->seed ^ 0x5a5a5a5a5a5a5a5aull, ((uint64_t)p->round << 32) | (uint64_t)p->rank,
                   what, (x << 20) ^ y);
}

static void comm_finish(ch_comm_info *ci, int rank) {
    ci->me = -1;
    for (int i = 0; i < ci->size; i++)
        if (ci->members[i] == rank) ci->me = i;
}

/* CH_F_DISAGREE: one member's list differs from the others' where its own
 * position does not (see chaos_prog.h); perm holds the members first,
 * then the non-members. Needs two members and a non-member, or three. */
static void plan_misfit(ch_round *p, const int *perm) {
    int n = p->group_n;
    bool replace = n >= 2 && n < p->world, swap = n >= 3;
    if (!replace && !swap) return;
    int me = (int)(round_h(p, K_MISFIT, 0) % (uint64_t)n);
    p->misfit = p->group_ranks[me];
    memcpy(p->misfit_ranks, p->group_ranks, sizeof p->misfit_ranks);
    uint64_t h = round_h(p, K_MISFIT_SWAP, 0);
    int other = (me + 1 + (int)(h % (uint64_t)(n - 1))) % n; /* another member's slot */
    if (replace && (!swap || (h >> 16) % 2 == 0)) {
        p->misfit_ranks[other] = perm[n + (int)((h >> 24) % (uint64_t)(p->world - n))];
    } else {
        int third = other;
        while (third == other || third == me)
            third = (third + 1) % n;
        p->misfit_ranks[other] = p->group_ranks[third];
        p->misfit_ranks[third] = p->group_ranks[other];
    }
}

/* this rank's comm-level fault of the round (p->rank's choices) */
static void plan_fault(ch_round *p, int ops, int faults) {
    /* a comm-level fault in about one round in two of the whole world */
    p->fault = 0;
    p->abort_subgroups = false;
    uint64_t f = rank_h(p, K_FAULT, 0, 0);
    if (faults & (CH_F_ABORT | CH_F_DESTROY | CH_F_CANCEL | CH_F_DEADLINE) &&
        f % 1000 < (uint64_t)(500 / p->world)) {
        int kinds[4], nk = 0;
        for (int k = 1; k <= CH_F_DEADLINE; k <<= 1)
            if (faults & k) kinds[nk++] = k;
        p->fault = kinds[rank_h(p, K_FAULT_KIND, 0, 0) % (uint64_t)nk];
        p->fault_slot = (int)(rank_h(p, K_FAULT_SLOT, 0, 0) % (uint64_t)(ops > 0 ? ops : 1));
        p->fault_delay_ms = (int)(rank_h(p, K_FAULT_DELAY, 0, 0) % 400);
        p->abort_from = (int)(rank_h(p, K_ABORT_FROM, 0, 0) % 3);
        if (p->fault == CH_F_ABORT && (p->split || p->group) &&
            rank_h(p, K_ABORT_SUB, 0, 0) % 2 == 0) {
            p->abort_subgroups = true;
            p->abort_from = 1;
            p->abort_sub_ms = (int)(rank_h(p, K_ABORT_SUB_MS, 0, 0) % 40);
        }
    }
}

void ch_plan_round(ch_round *p, uint64_t seed, int round, int world, int rank, int ops,
                   int inflight_max, int faults) {
    memset(p, 0, sizeof *p);
    p->seed = seed;
    p->round = round;
    p->world = world;
    p->rank = rank;
    p->ops = ops;
    /* the window: 1, small, medium or the maximum */
    uint64_t h = round_h(p, K_WINDOW, 0);
    int w;
    switch (h % 8) {
    case 0: w = 1; break;
    case 1:
    case 2: w = 1 + (int)((h >> 8) % 8); break;
    case 3:
    case 4:
    case 5: w = 1 + (int)((h >> 8) % 64); break;
    case 6: w = 1 + (int)((h >> 8) % (uint64_t)inflight_max); break;
    default: w = inflight_max; break;
    }
    if (w > inflight_max) w = inflight_max;
    if (w < 1) w = 1;
    p->window = w;

    p->comms[0].size = world;
    for (int r = 0; r < world; r++)
        p->comms[0].members[r] = r;
    comm_finish(&p->comms[0], rank);
    p->ncomms = 1;
    p->group_comm = -1;
    p->misfit = -1;
    p->infinite_timeout = round_h(p, K_INFINITE, 0) % 4 == 0;

    bool elastic = faults & CH_F_SHRINK; /* the world only (chaos_elastic.c) */
    p->split = !elastic && round_h(p, K_SPLIT, 0) % 2 == 0;
    if (p->split) {
        p->ncolors = 1 + (int)(round_h(p, K_NCOLORS, 0) % 3);
        for (int r = 0; r < world; r++) {
            uint64_t c = round_h(p, K_COLOR, (uint64_t)r);
            p->color[r] = c % 6 == 0 ? -1 : (int)((c >> 8) % (uint64_t)p->ncolors);
            p->skey[r] = (int)(round_h(p, K_SKEY, (uint64_t)r) % 4);
        }
        for (int c = 0; c < p->ncolors; c++) {
            ch_comm_info *ci = &p->comms[p->ncomms++];
            ci->size = 0;
            /* ordered by (key, parent rank), as collie_comm_split does */
            for (int k = 0; k < 4; k++)
                for (int r = 0; r < world; r++)
                    if (p->color[r] == c && p->skey[r] == k) ci->members[ci->size++] = r;
            comm_finish(ci, rank);
        }
    }
    p->group = !elastic && round_h(p, K_GROUP, 0) % 3 == 0;
    /* the stall burst: its pair is the round's new_group */
    p->stall_slot = -1;
    p->stall_comm = -1;
    bool stall = !elastic && faults & CH_F_STALL && world >= 2 && ops >= 8 &&
                 round_h(p, K_STALL, 0) % 2 == 0;
    if (stall) {
        p->stall_victim = (int)(round_h(p, K_STALL_WHO, 0) % (uint64_t)world);
        p->stall_sender =
            (p->stall_victim + 1 + (int)(round_h(p, K_STALL_PEER, 0) % (uint64_t)(world - 1))) %
            world;
        p->stall_slot = ops / 4 + (int)(round_h(p, K_STALL_SLOT, 0) % (uint64_t)(ops / 2));
        /* three posts in flight while the barrier's callback blocks */
        if (p->window < 4) p->window = inflight_max < 4 ? inflight_max : 4;
        p->group = true;
        p->group_n = 2;
        ch_comm_info *ci = &p->comms[p->ncomms];
        p->group_comm = p->stall_comm = p->ncomms++;
        ci->size = 2;
        p->group_ranks[0] = ci->members[0] = p->stall_victim;
        p->group_ranks[1] = ci->members[1] = p->stall_sender;
        comm_finish(ci, rank);
    } else if (p->group) {
        int perm[CH_MAX_RANKS];
        for (int r = 0; r < world; r++)
            perm[r] = r;
        for (int i = world - 1; i > 0; i--) {
            int j = (int)(round_h(p, K_GROUP_PERM, (uint64_t)i) % (uint64_t)(i + 1));
            int t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        p->group_n = 1 + (int)(round_h(p, K_GROUP_N, 0) % (uint64_t)world);
        ch_comm_info *ci = &p->comms[p->ncomms];
        p->group_comm = p->ncomms++;
        ci->size = p->group_n;
        for (int i = 0; i < p->group_n; i++)
            p->group_ranks[i] = ci->members[i] = perm[i];
        comm_finish(ci, rank);
        if (faults & CH_F_DISAGREE && round_h(p, K_DISAGREE, 0) % 2 == 0) plan_misfit(p, perm);
    }

    /* this rank's choices */
    uint64_t b = rank_h(p, K_BIAS, 0, 0);
    p->wait_bias = b % 3 == 0 ? (int)((b >> 8) % CH_NUM_STYLES) : -1;
    p->cancel_permille = (int)(rank_h(p, K_CANCEL_RATE, 0, 0) % 60);
    p->fault = 0;
    if (stall) {
        p->stall_ms = 50 + (int)(rank_h(p, K_STALL_MS, 0, 0) % 451);
        int ends[3], ne = 0;
        ends[ne++] = CH_F_DEADLINE; /* the stall's own: always allowed */
        if (faults & CH_F_CANCEL) ends[ne++] = CH_F_CANCEL;
        if (faults & CH_F_ABORT) ends[ne++] = CH_F_ABORT;
        p->stall_end = ends[rank_h(p, K_STALL_END, 0, 0) % (uint64_t)ne];
        p->stall_pre_ms = 5 + (int)(rank_h(p, K_STALL_PRE, 0, 0) % 11);
        p->stall_end_ms = 5 + (int)(rank_h(p, K_STALL_END_MS, 0, 0) % 26);
        return; /* no other comm-level fault: the burst must not be cut short */
    }
    plan_fault(p, ops, faults);
    /* the abort during the subgroups (chaos_prog.h): when any rank's is
     * this round's, every rank but that one comes to its split late, a
     * little, so some arrive after the abort reached them and refuse
     * theirs while others wait for them in their own */
    for (int q = 0; q < world && !p->abort_subgroups; q++) {
        ch_round t = *p;
        t.rank = q;
        plan_fault(&t, ops, faults);
        if (t.abort_subgroups) p->sub_delay_ms = (int)(rank_h(p, K_SUB_DELAY, 0, 0) % 50);
    }
}

/* sizes in bytes around the thresholds (see the design notes) */
static size_t pick_bytes(uint64_t h, size_t es, bool allow_huge, bool deep) {
    uint64_t c = h % 100, x = h >> 8;
    long d = (long)(x % 3) - 1; /* one element below, at, above */
    x >>= 2;
    if (deep) { /* a deep window: small works only */
        if (c < 5) return 0;
        if (c < 70) return 1 + x % 64;
        if (c < 97) return 65 + x % 4032;
        return (size_t)(65536 + d * (long)es);
    }
    if (c < 5) return 0;
    if (c < 28) return 1 + x % 64;
    if (c < 46) return 65 + x % 4032;
    if (c < 58) return (size_t)(65536 + d * (long)es);
    if (c < 66) return (size_t)(262144 + d * (long)es);
    if (c < 76) return (size_t)(524288 + d * (long)es);
    if (c < 89) return 4096 + x % (200 * 1024);
    if (c < 96 || !allow_huge) return (1u << 20) + x % (1u << 20);
    return (size_t)((8u << 20) + d * (long)es);
}

void ch_plan_op(const ch_round *p, int slot, ch_op *op) {
    memset(op, 0, sizeof *op);
    op->slot = slot;
    uint64_t s = (uint64_t)slot;
    /* which comm: the world mostly, then the split's groups, the new_group */
    uint64_t hc = round_h(p, K_COMM, s);
    op->comm = 0;
    int nsplit = p->split ? p->ncolors : 0;
    if (hc % 100 >= 60 && hc % 100 < 85 && nsplit > 0)
        op->comm = 1 + (int)((hc >> 8) % (uint64_t)nsplit);
    else if (hc % 100 >= 85 && p->group_comm >= 0)
        op->comm = p->group_comm;
    if (p->comms[op->comm].size == 0) op->comm = 0; /* a colour nobody chose */
    int step = ch_stall_step(p, slot);
    if (step >= 0) op->comm = p->stall_comm;
    const ch_comm_info *ci = &p->comms[op->comm];
    int n = ci->size;
    op->key = ch_hash(p->seed, ((uint64_t)p->round << 16) | (uint64_t)op->comm, s, 0xda7a);
    uint64_t hk = round_h(p, K_KIND, s) % 100;
    static const struct {
        ch_kind k;
        int w;
    } weights[] = {
        {CH_ALLREDUCE, 14}, {CH_BROADCAST, 8},  {CH_REDUCE, 7},         {CH_ALLGATHER, 7},
        {CH_GATHER, 6},     {CH_SCATTER, 6},    {CH_REDUCE_SCATTER, 7}, {CH_ALLTOALL, 6},
        {CH_BARRIER, 4},    {CH_ALLGATHERV, 6}, {CH_ALLTOALLV, 6},      {CH_SENDRECV, 14},
        {CH_ANYSRC, 9},
    };
    op->kind = CH_ALLREDUCE;
    uint64_t acc = 0;
    for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++) {
        acc += (uint64_t)weights[i].w;
        if (hk < acc) {
            op->kind = weights[i].k;
            break;
        }
    }
    if (n < 2 && (op->kind == CH_SENDRECV || op->kind == CH_ANYSRC)) op->kind = CH_ALLREDUCE;
    op->dt = (collie_dtype)(round_h(p, K_DT, s) % COLLIE_NUM_DTYPES);
    op->op = (collie_redop)(round_h(p, K_OP, s) % COLLIE_NUM_REDOPS);
    size_t es = collie_dtype_size(op->dt);
    bool whole = op->kind == CH_ALLREDUCE || op->kind == CH_BROADCAST || op->kind == CH_REDUCE ||
                 op->kind == CH_SENDRECV;
    bool deep = p->window > 64;
    size_t bytes = pick_bytes(round_h(p, K_SIZE, s), es, whole, deep);
    if (op->kind == CH_ANYSRC && bytes > (1u << 20)) bytes = 1u << 20;
    /* whole-op bytes: the block ops move n blocks; keep an op under 24 MiB */
    if (!whole && bytes * (size_t)n > (24u << 20)) bytes = (size_t)(round_h(p, K_SIZE2, s) % 4096);
    op->count = bytes / es;
    if (op->kind == CH_BARRIER) op->count = 0;
    op->root = (int)(round_h(p, K_ROOT, s) % (uint64_t)n);
    if (n >= 2) {
        op->peer = (op->root + 1 + (int)(round_h(p, K_PEER, s) % (uint64_t)(n - 1))) % n;
        op->bidir = round_h(p, K_BIDIR, s) % 3 == 0;
        op->msgs = 1 + (int)(round_h(p, K_MSGS, s) % 3);
        uint64_t hs = round_h(p, K_SENDERS, s);
        for (int r = 0; r < n; r++)
            if (r != op->peer && ((hs >> r) & 1 || r == (op->peer + 1) % n)) op->senders |= 1u << r;
    }
    bool can_in_place = op->kind != CH_ALLTOALL && op->kind != CH_ALLTOALLV &&
                        op->kind != CH_SENDRECV && op->kind != CH_ANYSRC && op->kind != CH_BARRIER;
    op->in_place = can_in_place && round_h(p, K_INPLACE, s) % 3 == 0;
    op->null_nonroot = round_h(p, K_NULL, s) % 2 == 0;
    op->gaps = round_h(p, K_GAPS, s) % 2 == 0;
    /* every work has a deadline: generous ones (the short ones are the
     * deadline fault, per rank) */
    op->deadline_ms = (int32_t)(4000 + round_h(p, K_DEADLINE, s) % 8000);
    op->tag = ((uint64_t)p->round << 32) | (uint64_t)slot;
    if (step == 0) { /* the stall burst (see chaos_prog.h) */
        op->kind = CH_BARRIER;
        op->count = 0;
    } else if (step == 1) { /* lent: at least COLLIE_SHM_SINGLE_COPY bytes */
        op->kind = CH_SENDRECV;
        op->root = 1; /* the sender */
        op->peer = 0; /* the victim */
        op->bidir = false;
        op->count = (524288 + es + (size_t)(round_h(p, K_SIZE2, s) % (1u << 20))) / es;
    } else if (step == 2) { /* recursive doubling: one receive-and-reduce */
        op->kind = CH_ALLREDUCE;
        op->op = COLLIE_SUM;
        op->in_place = false;
        op->count = (1 + (size_t)(round_h(p, K_SIZE2, s) % 65536)) / es;
        if (!op->count) op->count = 1;
    }
}

int ch_stall_step(const ch_round *p, int slot) {
    if (p->stall_slot < 0 || slot < p->stall_slot || slot > p->stall_slot + 2) return -1;
    return slot - p->stall_slot;
}

ch_style ch_pick_style(const ch_round *p, int slot, int sub) {
    uint64_t h = rank_h(p, K_STYLE, (uint64_t)slot, (uint64_t)sub);
    if (p->wait_bias >= 0 && h % 4 != 0) return (ch_style)p->wait_bias;
    return (ch_style)((h >> 8) % CH_NUM_STYLES);
}

bool ch_pick_cancel(const ch_round *p, int slot, int sub, int faults) {
    if (!(faults & CH_F_CANCEL)) return false;
    return rank_h(p, K_CANCEL, (uint64_t)slot, (uint64_t)sub) % 1000 < (uint64_t)p->cancel_permille;
}

int32_t ch_pick_short_deadline(const ch_round *p, int slot, int sub, int faults) {
    if (!(faults & CH_F_DEADLINE)) return 0;
    uint64_t h = rank_h(p, K_SHORT, (uint64_t)slot, (uint64_t)sub);
    if (h % 1000 >= 40) return 0;
    return (int32_t)(1 + (h >> 12) % 40);
}

size_t ch_agv_count(const ch_op *op, int r) {
    uint64_t h = ch_hash(op->key, K_VCOUNT, (uint64_t)r, 0);
    if (h % 5 == 0) return 0;
    return (size_t)((h >> 8) % (2 * op->count + 1));
}

size_t ch_a2av_count(const ch_op *op, int s, int d) {
    uint64_t h = ch_hash(op->key, K_VCOUNT, (uint64_t)s, (uint64_t)d + 1000);
    if (h % 5 == 0) return 0;
    return (size_t)((h >> 8) % (2 * op->count + 1));
}

size_t ch_gap(const ch_op *op, int who, int block, int side) {
    if (!op->gaps) return 0;
    uint64_t h = ch_hash(op->key, K_VGAP, (uint64_t)who << 8 | (uint64_t)side, (uint64_t)block);
    return h % 3 == 0 ? 0 : (size_t)((h >> 8) % 17);
}
