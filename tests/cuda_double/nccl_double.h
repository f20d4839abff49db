/*
 * nccl_double.h — what the two halves of the NCCL double share (tests
 * only, never installed): nccl.c, the ranks of one process, and
 * nccl_proc.c, ranks in other processes bridged through a hub. Everything
 * marked _locked runs under nd_mu.
 */
#ifndef CLTEST_NCCL_DOUBLE_H
#define CLTEST_NCCL_DOUBLE_H

#include <stdbool.h>
#include <stdint.h>

#include <nccl.h>

#define ND_ABORTED 1 /* dbl_clique.rank_aborted: the rank called ncclCommAbort */
#define ND_DIED    2 /* its process went away without (a remote rank's EOF) */
#define ND_REVOKED 3 /* it called ncclCommRevoke (its comm may still shrink) */

enum {
    K_ALLREDUCE,
    K_BROADCAST,
    K_REDUCE,
    K_ALLGATHER,
    K_REDUCE_SCATTER,
    K_P2P,
    K_SEND,
    K_RECV,
    K_NUM
};
extern const char *const dbl_kind_names[K_NUM];

typedef struct dbl_item {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root, peer;
} dbl_item;

typedef struct dbl_clique dbl_clique;

struct ncclComm {
    dbl_clique *cq;
    int rank, nranks, dev;
    bool initialized, aborted, call_inprogress;
    ncclResult_t error;
    int refs;      /* the user's + one per op not yet run */
    int executing; /* ops running right now */
    uint64_t coll_seq, counts[K_NUM];
    struct dbl_op *deferred; /* calls answered ncclInProgress, enqueued later */
    int64_t deferred_until;
    uint64_t split_seq;   /* ncclCommSplit calls made on this comm */
    bool split_pending;   /* one of them waits for the other ranks */
    dbl_clique *split_of; /* a child not yet placed: its parent's clique */
    bool proxy;           /* the hub's stand-in for a rank of another process */
    /* ncclCommRevoke: called; when its ops are stopped (CLTEST_NCCL_ABORT_SLOW_MS
     * later); the stop and the quiesce counted once with the aborts */
    bool revoked, abort_counted, quiesce_counted;
    int64_t revoke_stop_ns;
    unsigned char *excluded_of; /* a shrink child not yet placed: its parent's ranks left out */
    struct nd_remote *rm;       /* a rank whose clique lives in another process */
    char last_error[256];
};

typedef struct dbl_op {
    struct dbl_op *next;
    ncclComm_t comm;
    cudaStream_t stream;
    int kind, nitems;
    uint64_t seq, nth; /* collective sequence; the nth op of its kind on this rank */
    bool hang, error, crash;
    /* called once the op ran (completed: it was not aborted), outside
     * nd_mu and after the comm's reference was dropped; ctx is its own */
    void (*done)(struct dbl_op *op, bool completed);
    void *ctx;
    dbl_item items[];
} dbl_op;

typedef struct dbl_room {
    struct dbl_room *next;
    uint64_t seq;
    int arrived, left;
    bool done, broken;
    void *result;
    size_t *off, *len; /* rank r copies result[off[r] .. + len[r]) */
    const dbl_item **slot;
} dbl_room;

typedef struct dbl_msg {
    struct dbl_msg *next;
    int src, dst;
    const void *buf;
    size_t bytes;
    bool taken;
} dbl_msg;

struct dbl_clique {
    dbl_clique *next;
    ncclUniqueId id;
    int nranks, joined, refs;
    int proxies; /* members standing in for ranks of other processes */
    ncclComm_t *members;
    unsigned char *rank_aborted; /* 0, ND_ABORTED, or ND_DIED (a remote rank's process) */
    dbl_room *rooms;
    dbl_msg *msgs;
    struct dbl_split *splits; /* ncclCommSplit calls not every rank has made */
};

/* One ncclCommSplit of a clique: each rank's colour, key and child (NULL
 * for NCCL_SPLIT_NOCOLOR). The record holds a reference on each child. An
 * ncclCommShrink is one too (colour 0, key the parent rank), which only
 * `need` ranks make, the others being `out` (by parent rank). */
typedef struct dbl_split {
    struct dbl_split *next;
    uint64_t seq;
    int arrived, need; /* need: 0 for a split (every rank) */
    unsigned char *out;
    int *color, *key;
    ncclComm_t *child;
} dbl_split;

/* ---- nccl.c ---- */

void nd_lock(void);
void nd_unlock(void);
/* nd_wait_until: wait on the double's condition variable (nd_mu held)
 * until woken or until_ns (CLOCK_MONOTONIC; <= 0: no limit). */
void nd_wait_until(int64_t until_ns);
void nd_broadcast_locked(void);
size_t nd_dsize(ncclDataType_t dt);
void nd_set_error_locked(ncclComm_t c, ncclResult_t e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void nd_comm_unref_locked(ncclComm_t c);
/* nd_comm_join_locked: rank `rank` of `nranks` joins the clique of id in
 * this process (made on first use); on an error nd_last_error says why. */
ncclResult_t nd_comm_join_locked(const ncclUniqueId *id, int nranks, int rank, int dev, bool proxy,
                                 ncclComm_t *out);
/* nd_op_run: run op (a stream function; it frees op). */
void nd_op_run(void *arg);
extern _Thread_local char nd_last_error[256];

/* ---- nccl_proc.c ---- */

/* nd_hub_start: start this process's hub (once per process) and return
 * its token for a unique id (0: no hub, ranks of other processes cannot
 * join). */
uint64_t nd_hub_start(void);
/* nd_id_remote: was id made by another process? */
bool nd_id_remote(const ncclUniqueId *id);
/* nd_remote_join: connect the new comm c (rank, nranks, dev set) to the
 * hub of id's process and ask to join; not under nd_mu. On an error
 * nd_last_error says why and c is unchanged. */
ncclResult_t nd_remote_join(ncclComm_t c, const ncclUniqueId *id);
/* nd_remote_run_locked: run op of the remote comm c through the hub. */
void nd_remote_run_locked(ncclComm_t c, dbl_op *op);
/* nd_remote_ready_locked: has the hub said every rank joined? */
bool nd_remote_ready_locked(ncclComm_t c);
/* nd_remote_close: after ncclCommAbort quiesced c (not under nd_mu): tell
 * the hub, stop the reader, close the socket. */
void nd_remote_close(ncclComm_t c);
/* nd_remote_free_locked: free what is left of c->rm. */
void nd_remote_free_locked(ncclComm_t c);

#endif
