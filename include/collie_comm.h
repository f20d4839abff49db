/*
 * collie_comm.h — communicators and their collectives in the public API:
 * creating, splitting, aborting and destroying a comm, the collectives and
 * send/recv on CPU buffers (collie_cuda.h has the CUDA-stream forms), and a
 * comm's statistics.
 *
 * Part of collie.h, which includes it: `#include <collie.h>` is enough; the
 * conventions at the top of collie.h (statuses, outputs, option structs,
 * threads, durations) hold here too.
 */
#ifndef COLLIE_COMM_H
#define COLLIE_COMM_H

#include "collie.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Communicators                                                             */
/* ------------------------------------------------------------------------ */

typedef struct collie_comm collie_comm;

/* collie_error_policy: what a fault (deadline, dead peer, backend error)
 * does to the communicator. See docs/operations.md, "When things go
 * wrong". */
typedef enum collie_error_policy {
    COLLIE_POLICY_DEFAULT = 0,   /* from COLLIE_BLOCKING_WAIT / COLLIE_ASYNC_ERROR_HANDLING,
                                    else ABORT_COMM */
    COLLIE_POLICY_ABORT_COMM,    /* fail the work, abort the comm, tell the peers */
    COLLIE_POLICY_BLOCKING_WAIT, /* fail the comm's works; the application decides */
    COLLIE_POLICY_ABORT_PROCESS, /* as ABORT_COMM, then terminate the process */
    COLLIE_POLICY_NONE,          /* only fail the work (debugging) */
} collie_error_policy;

/* collie_comm_error_cb: called once, on the progress thread, when the comm
 * faults, with the root cause. Must not block. */
typedef void (*collie_comm_error_cb)(collie_comm *c, int status, const char *msg, void *arg);

typedef struct collie_comm_opts {
    size_t size;               /* sizeof(collie_comm_opts) */
    const char *name;          /* store namespace, at most 64 chars [A-Za-z0-9_.-]; NULL: "world" */
    const char *backend;       /* "auto", "tcp", "shm", "nccl", "cpu:tcp,cuda:nccl"; NULL:
                                  "auto" (shared memory for same-host peers, TCP for others) */
    int32_t timeout_ms;        /* default op timeout; 0: COLLIE_TIMEOUT_MS, else 60 s */
    int32_t create_timeout_ms; /* bound of the creation rendezvous; 0: timeout_ms */
    collie_error_policy policy;
    collie_comm_error_cb on_error;
    void *on_error_arg;
    int device; /* CUDA device for a cuda backend; -1: none / current */
    /* collie_comm_create_post only: how its create work completes (cb,
     * cb_arg, cq, tag; its timeout is create_timeout_ms whatever this says);
     * NULL: no callback, no queue */
    const collie_post_opts *post;
} collie_comm_opts;

#define COLLIE_COMM_OPTS_INIT                                                                      \
    { sizeof(collie_comm_opts), NULL, NULL, 0, 0, COLLIE_POLICY_DEFAULT, NULL, NULL, -1, NULL }

/* COLLIE_UNDEFINED: the colour of a rank that joins no group in
 * collie_comm_split. */
#define COLLIE_UNDEFINED (-1)

/* collie_comm_create: create a communicator of `size` ranks; every rank
 * calls it once per incarnation with the same name. Collective over the
 * store and bounded by create_timeout_ms. The comm keeps a handle of its
 * own on the store's connection (until it is destroyed, also by a
 * destroy work still running): the caller may destroy its store handle
 * at any time. Errors: EINVAL (bad rank/size/options/backend spec, with
 * collie_last_error saying which), ETIMEDOUT (not every rank arrived:
 * the message says how many did), EPEER (store lost), ENOMEM, ECLOSED. */
COLLIE_API int collie_comm_create(collie_engine *e, collie_store *store, int rank, int size,
                                  const collie_comm_opts *o, collie_comm **out);

/* collie_comm_create_post: the non-blocking form. Returns the comm at once
 * and a work that completes when the rendezvous is done (o->post: its
 * callback or completion queue); collectives posted before then queue
 * behind it (and fail with COLLIE_EABORTED naming the creation's error).
 * collie_work_cancel on the create work ends the creation at once with
 * COLLIE_ECANCELED, also while it waits for a rank that never comes: the
 * comm fails, and its generation is poisoned for the others (they fail at
 * once, naming this rank). Destroy the comm afterwards as after any
 * failed create (collie_comm_destroy_post does not block). */
COLLIE_API int collie_comm_create_post(collie_engine *e, collie_store *store, int rank, int size,
                                       const collie_comm_opts *o, collie_comm **out,
                                       collie_work **work);

/* collie_comm_create_from_env: connect to COLLIE_STORE_ADDR and create a
 * comm with COLLIE_RANK and COLLIE_WORLD_SIZE (as set by collie-run). The
 * comm owns that store connection. */
COLLIE_API int collie_comm_create_from_env(collie_engine *e, const collie_comm_opts *o,
                                           collie_comm **out);

/* collie_comm_split: new comms from the ranks of `c` with the same colour,
 * ordered by (key, parent rank). Every rank of `c` calls it, in the same
 * order relative to other collectives. A rank passing COLLIE_UNDEFINED gets
 * COLLIE_ENOTMEMBER and *out = NULL. The name is "<parent>.s<k>.<colour>"
 * (new_group: "<parent>.g<k>"). Options left unset (NULL opts, backend,
 * device, timeouts, policy) are the parent's; a backend that can (NCCL:
 * ncclCommSplit) builds the child from the parent's communicator. Blocks,
 * bounded by o->create_timeout_ms when set, else the parent's creation
 * timeout; once the parent fails (collie_comm_abort from another thread, a
 * dead peer) it returns at once with the parent's fault (EABORTED). */
COLLIE_API int collie_comm_split(collie_comm *c, int color, int key, const collie_comm_opts *o,
                                 collie_comm **out);

/* collie_comm_new_group: a comm of the listed parent ranks (in that order).
 * Every rank of `c` calls it with the same list; non-members get
 * COLLIE_ENOTMEMBER and *out = NULL. Members given different lists make no
 * comm: they fail with COLLIE_EINVAL naming both lists (or time out, one
 * left alone). */
COLLIE_API int collie_comm_new_group(collie_comm *c, const int *ranks, int n,
                                     const collie_comm_opts *o, collie_comm **out);

/* collie_comm_destroy: graceful: waits for pending works up to the comm's
 * op timeout (COLLIE_TIMEOUT_MS when that is infinite), then aborts the
 * rest; announces that this rank left (the store key "<prefix>gone/<rank>"
 * and a control message, at most 500 ms, once the comm was ready), so the
 * peers see it "left", not dead; frees everything
 * and releases its name. Blocks the caller for all of that: an event loop
 * uses collie_comm_destroy_post.
 * Idempotent with respect to an earlier abort. Not on the progress thread
 * (COLLIE_ESTATE). NULL is a no-op. Returns COLLIE_OK, or COLLIE_EABORTED
 * if works had to be aborted; after its engine was destroyed it only frees
 * memory. */
COLLIE_API int collie_comm_destroy(collie_comm *c);

/* collie_comm_destroy_post: the non-blocking form of collie_comm_destroy:
 * returns at once with a work ("comm.destroy") that completes, like any
 * work (o->cb on the progress thread, o->cq), once the comm is destroyed,
 * with the status collie_comm_destroy would have returned. The same steps
 * and bounds run on the progress thread; the caller never waits for them.
 * The work owns the comm from here on: `c` is invalid for the caller as
 * soon as this returns (its name is free at once). Any thread, also inside
 * a callback (it does not block). o->timeout_ms is ignored (the steps are
 * bounded) and the work cannot be cancelled; engine shutdown ends it at
 * once. Errors, with nothing done: EINVAL (c or out NULL), ESTATE (the
 * comm is already being destroyed), ECLOSED (its engine was destroyed or
 * is closing: collie_comm_destroy then frees it), ENOMEM. */
COLLIE_API int collie_comm_destroy_post(collie_comm *c, const collie_post_opts *o,
                                        collie_work **out);

/* ------------------------------------------------------------------------ */
/* Shrinking to the survivors (docs/faults.md, "Shrink")                     */
/* ------------------------------------------------------------------------ */

typedef struct collie_shrink_opts {
    size_t size; /* sizeof(collie_shrink_opts) */
    /* the bound of the whole shrink (agreement and the new comm's
     * rendezvous); 0: the comm's creation timeout. A rank that has not
     * taken part in the agreement by then is left out, as suspected. */
    int32_t timeout_ms;
    /* the new comm's options (NULL: the old comm's timeouts, error policy,
     * backends and device); its name is always "<name>.shr<generation>"
     * (a later shrink of the same comm: "...shr<generation>e<attempt>") */
    const collie_comm_opts *comm;
} collie_shrink_opts;

#define COLLIE_SHRINK_OPTS_INIT                                                                    \
    { .size = sizeof(collie_shrink_opts) }

/* collie_comm_shrink: the survivors of a failed comm agree on the set of
 * failed ranks and get a new comm of the others, ranks renumbered
 * compactly in their old order (collie_comm_rank_map). Every surviving
 * rank calls it. The set is the union of what each survivor knows (its
 * comm's fault, peers dead, left or suspected) and of the ranks that did
 * not take part by the deadline; a further failure while it runs is seen
 * through peer health and joins the set. The first decision written to
 * the store is the one every survivor takes (compare-and-set), so all
 * members get the same comm; the agreed set is the old comm's fault from
 * then on (collie_comm_fault, view COLLIE_FAULT_VIEW_AGREED; its kind
 * peer_dead or peer_left when this rank knows every rank of the set so,
 * else peer_stuck).
 * The old comm is aborted first if it had not failed (a revoke: the
 * others' works fail and they shrink too), and its works have all ended
 * before the new comm is returned; destroy it afterwards as usual.
 * One shrink of a comm at a time, none once one succeeded (ESTATE naming
 * the comm it made); after a failed one, shrink again (the attempt number,
 * which names the new comm, moves on only when a new comm was being made).
 * A rank the others left out (slow, stopped) gets COLLIE_ENOTMEMBER from
 * shrink, a COLLIE_EVENT_EXCLUDED event and COLLIE_ENOTMEMBER on its posts
 * of the old comm once told (before that, the survivors' abort: EABORTED). The store must outlive
 * the ranks (collie-run's or collie-store): one that dies with a rank fails the shrink with
 * COLLIE_EPEER saying so. Errors: EINVAL (NULL, bad opts), ESTATE (the
 * comm is healthy: no fault and no peer dead, left or suspected; or not
 * yet created), ENOTMEMBER (this rank was left out), ETIMEDOUT, EPEER,
 * EABORTED (a member failed while the new comm was being made: shrink the
 * old comm again), ENOMEM. Blocks, bounded by the timeout; an event loop
 * uses collie_comm_shrink_post. */
COLLIE_API int collie_comm_shrink(collie_comm *c, const collie_shrink_opts *so, collie_comm **out);

/* collie_comm_shrink_post: the non-blocking form: a work ("comm.shrink")
 * that completes (o->cb, o->cq) when the shrink has; take the new comm
 * with collie_comm_work_comm. collie_work_cancel ends it (ECANCELED). The
 * old comm must outlive the work. o->timeout_ms is ignored (so->timeout_ms
 * bounds it). */
COLLIE_API int collie_comm_shrink_post(collie_comm *c, const collie_shrink_opts *so,
                                       const collie_post_opts *o, collie_work **out);

/* collie_comm_work_comm: the comm a finished shrink (grow, join) work made; the caller
 * owns it (destroy it). Once: a second call gets COLLIE_ENOENT. EINVAL (not
 * such a work), INPROGRESS, or the work's failure status. A comm never
 * taken is destroyed when the work is released. */
COLLIE_API int collie_comm_work_comm(collie_work *w, collie_comm **out);

/* ------------------------------------------------------------------------ */
/* Growing: a new process joins a running comm (docs/faults.md, "Grow")      */
/* ------------------------------------------------------------------------ */

typedef struct collie_grow_opts {
    size_t size; /* sizeof(collie_grow_opts) */
    /* members: how many joiners to take (every member the same; 0: 1) */
    int count;
    /* the bound of the whole grow or join (0: the comm's creation timeout;
     * a joiner's: its comm options', else COLLIE_TIMEOUT_MS) */
    int32_t timeout_ms;
    /* the new comm's options (members, NULL: the old comm's; a joiner,
     * NULL: the defaults); the name is the grow's */
    const collie_comm_opts *comm;
    /* a joiner: the rank it asks for (-1: the lowest free one); a rank a
     * member holds, or another joiner took, is refused (EINVAL) */
    int rank;
} collie_grow_opts;

#define COLLIE_GROW_OPTS_INIT                                                                      \
    { .size = sizeof(collie_grow_opts), .rank = -1 }

/* collie_comm_grow: every member of a healthy comm calls it to take
 * `count` joiners (collie_comm_join) into a new comm of size + count: the
 * members keep their ranks, the joiners get the ranks after them (or the
 * one they asked for), in the order they asked. The new comm is named
 * "<name>.gr<generation>" ("...e<attempt>" after a first grow of the same
 * comm); its links are made before it is returned (a one-element
 * allreduce, checked), so its first collective is as fast as any other.
 * The old comm is untouched: destroy it once the new one is in use.
 * Errors: EINVAL (NULL, bad opts), ESTATE (the comm failed: shrink it
 * first; or never created), ETIMEDOUT (too few joiners came, or a member
 * did not: the message says which), EPEER (the store is gone), ENOMEM.
 * Blocks, bounded by the timeout; collie_comm_grow_post does not. */
COLLIE_API int collie_comm_grow(collie_comm *c, const collie_grow_opts *go, collie_comm **out);
COLLIE_API int collie_comm_grow_post(collie_comm *c, const collie_grow_opts *go,
                                     const collie_post_opts *o, collie_work **out);

/* collie_comm_join: a new process asks to join the running comm first
 * created as `name` (also after shrinks and grows: they keep that name as
 * their family); it gets its rank in the members' next grow. Take the comm
 * of collie_comm_join_post's work with collie_comm_work_comm. Errors:
 * EINVAL (NULL, a bad name, a rank refused: the message says why),
 * ETIMEDOUT (no grow took it by the deadline: it withdraws), EPEER,
 * ENOMEM, ECLOSED. */
COLLIE_API int collie_comm_join(collie_engine *e, collie_store *store, const char *name,
                                const collie_grow_opts *go, collie_comm **out);
COLLIE_API int collie_comm_join_post(collie_engine *e, collie_store *store, const char *name,
                                     const collie_grow_opts *go, const collie_post_opts *o,
                                     collie_work **out);

/* collie_comm_join_from_env: collie_comm_join for a rank collie-run
 * restarted (--restarts; COLLIE_RESTART_COUNT > 0): connects to
 * COLLIE_STORE_ADDR and asks to join the comm named go->comm->name (else
 * "world") at its old rank COLLIE_RANK (unless go->rank says otherwise).
 * The comm owns that store connection. */
COLLIE_API int collie_comm_join_from_env(collie_engine *e, const collie_grow_opts *go,
                                         collie_comm **out);

/* collie_comm_rank_map: for a comm made by collie_comm_shrink, fill
 * map[old] with each old rank's new rank, or -1 for a rank left out, for
 * old < min(n, the old size). Returns the old size, COLLIE_ESTATE for a
 * comm not made by a shrink, COLLIE_EINVAL (NULL, n < 0). */
COLLIE_API int collie_comm_rank_map(const collie_comm *c, int *map, int n);

/* collie_comm_abort: fail every pending work with COLLIE_EABORTED (naming
 * `reason`) and close the transport. Any thread, also inside a callback;
 * idempotent; never blocks on the network. */
COLLIE_API int collie_comm_abort(collie_comm *c, const char *reason);

/* collie_comm_error: the comm's state: COLLIE_OK while healthy, else the
 * root status of its fault; *msg (if not NULL) the root cause ("" if none),
 * valid until the comm is destroyed. */
COLLIE_API int collie_comm_error(const collie_comm *c, int *status, const char **msg);

COLLIE_API int collie_comm_rank(const collie_comm *c);
COLLIE_API int collie_comm_size(const collie_comm *c);
COLLIE_API const char *collie_comm_name(const collie_comm *c);
/* collie_comm_generation: the incarnation number of this comm's name. */
COLLIE_API uint64_t collie_comm_generation(const collie_comm *c);

/* collie_comm_dump: write the comm's flight recorder (the last
 * COLLIE_TRACE_BUFFER works: seq, op, dtype, count, peer/root, state,
 * post/start/end times, error) and its state as JSON, one entry per line.
 * Any thread. Written automatically to COLLIE_DUMP_DIR on abort.
 * The collie-trace program reads the dumps of all ranks. */
COLLIE_API int collie_comm_dump(collie_comm *c, FILE *f);

/* collie_comm_register: make the comm findable by its name in this process.
 * Errors: EEXIST if another comm holds the name. Unregistered on destroy. */
COLLIE_API int collie_comm_register(collie_comm *c);
/* collie_comm_lookup: the registered comm of that name, or ENOENT. */
COLLIE_API int collie_comm_lookup(const char *name, collie_comm **out);

/* ------------------------------------------------------------------------ */
/* Collectives (CPU buffers; the comm's cpu backend)                         */
/* ------------------------------------------------------------------------ */

/* Every collective is non-blocking: it returns COLLIE_OK and a work, or an
 * error and no work. Collectives of one comm run in post order, and every
 * rank must post the same sequence (a mismatch is COLLIE_EPROTO naming both
 * ranks). Buffers must stay valid and untouched until the work completes;
 * once its completion is visible collie never touches them again.
 * Like MPI's non-blocking collectives, several works of one comm may be in
 * flight and progress at the same time: the buffers of works in flight must
 * not overlap (to feed one collective's output into the next, wait for the
 * first, or post the second from its callback).
 * Counts are in elements. In-place forms follow NCCL: allreduce/broadcast/
 * reduce with sendbuf == recvbuf; allgather/gather with
 * sendbuf == recvbuf + rank*count; reduce_scatter with
 * recvbuf == sendbuf + rank*recvcount. */
COLLIE_API int collie_allreduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                collie_dtype dt, collie_redop op, const collie_post_opts *o,
                                collie_work **out);
COLLIE_API int collie_broadcast(collie_comm *c, void *buf, size_t count, collie_dtype dt, int root,
                                const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_reduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             collie_dtype dt, collie_redop op, int root, const collie_post_opts *o,
                             collie_work **out);
/* recvbuf holds size*count elements, rank r's block at r*count. */
COLLIE_API int collie_allgather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                collie_dtype dt, const collie_post_opts *o, collie_work **out);
/* sendbuf holds size*recvcount elements; rank r receives block r reduced. */
COLLIE_API int collie_reduce_scatter(collie_comm *c, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, collie_dtype dt, collie_redop op,
                                     const collie_post_opts *o, collie_work **out);
/* count elements per peer: block p of sendbuf goes to rank p, block p of
 * recvbuf comes from rank p. */
COLLIE_API int collie_alltoall(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                               collie_dtype dt, const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_gather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             collie_dtype dt, int root, const collie_post_opts *o,
                             collie_work **out);
COLLIE_API int collie_scatter(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                              collie_dtype dt, int root, const collie_post_opts *o,
                              collie_work **out);
COLLIE_API int collie_barrier(collie_comm *c, const collie_post_opts *o, collie_work **out);
/* Uneven blocks, as MPI_Iallgatherv / MPI_Ialltoallv (MoE expert dispatch,
 * torch's uneven splits). Counts and displacements are in elements, one
 * entry per rank, and are copied by the call (the arrays may be reused at
 * once); a NULL displacement array means packed (block p starts where
 * block p-1 ends). The receive blocks of one call must not overlap.
 * allgatherv: rank r contributes recvcounts[r] elements from sendbuf, and
 * block p lands at recvbuf + displs[p]; every rank passes the same
 * recvcounts (a difference is COLLIE_EPROTO naming both ranks). In place:
 * sendbuf == recvbuf + displs[rank]. */
COLLIE_API int collie_allgatherv(collie_comm *c, const void *sendbuf, void *recvbuf,
                                 const size_t *recvcounts, const size_t *displs, collie_dtype dt,
                                 const collie_post_opts *o, collie_work **out);
/* alltoallv: sendcounts[p] elements at sendbuf + sdispls[p] go to rank p;
 * recvcounts[p] elements from rank p land at recvbuf + rdispls[p].
 * sendcounts[p] on rank r must equal recvcounts[r] on rank p (a difference
 * is COLLIE_EPROTO naming both); sendcounts[rank] == recvcounts[rank]. No
 * in-place form: the send and receive buffers must not overlap. */
COLLIE_API int collie_alltoallv(collie_comm *c, const void *sendbuf, const size_t *sendcounts,
                                const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                const size_t *rdispls, collie_dtype dt, const collie_post_opts *o,
                                collie_work **out);

/* Point to point, matched by (peer, tag) outside the collective order: a
 * send/recv never waits for a collective, posted or not. Messages from one
 * sender with one tag are received in the order they were sent; a message
 * goes to the first receive posted (in post order) that matches it, as in
 * MPI. A receive's count and dtype must be the send's (else COLLIE_EPROTO
 * naming both, and nothing is written).
 *
 * collie_recv's peer may be COLLIE_ANY_SOURCE: the receive takes the first
 * message with its tag from any rank of the comm (among the messages that
 * arrived before it was posted, the earliest); collie_work_source says
 * which rank sent it. A rank that dies while an any-source receive is
 * pending fails it (COLLIE_EPEER naming the rank), whatever the policy. The
 * CPU backends implement it; others refuse it (COLLIE_ENOTSUP).
 *
 * The peer must be another rank: unlike MPI, a send or receive to one's own
 * rank is refused (COLLIE_EINVAL saying so; copy the data locally), and an
 * any-source receive never takes a message from its own rank.
 *
 * Ending a receive that no message has matched yet (collie_work_cancel, or
 * its own deadline: COLLIE_ECANCELED, COLLIE_ETIMEDOUT) ends only that work;
 * the comm stays healthy. A matched receive, a send, or a collective ended
 * that way is a fault of the comm (its error policy applies). */
#define COLLIE_ANY_SOURCE (-1)
COLLIE_API int collie_send(collie_comm *c, const void *buf, size_t count, collie_dtype dt, int peer,
                           uint64_t tag, const collie_post_opts *o, collie_work **out);
COLLIE_API int collie_recv(collie_comm *c, void *buf, size_t count, collie_dtype dt, int peer,
                           uint64_t tag, const collie_post_opts *o, collie_work **out);
/* collie_work_source: the rank a receive's message came from: its peer, or
 * for a COLLIE_ANY_SOURCE receive the sender of the message it took (once
 * the work is done; also when it failed on that message, e.g. a count
 * mismatch). -1 for any other work, or while unknown. */
COLLIE_API int collie_work_source(const collie_work *w);

/* ------------------------------------------------------------------------ */
/* Failure as data: what kind of fault, which ranks                          */
/* ------------------------------------------------------------------------ */

/* collie_fault_kind: what broke. The rank set of a fault (collie_fault.ranks)
 * holds the suspects, as the comment of each kind says: never a rank that
 * only reported or suffered the fault. */
typedef enum collie_fault_kind {
    COLLIE_FAULT_NONE = 0,   /* no fault */
    COLLIE_FAULT_PEER_DEAD,  /* peers died: their process exited (same host: certain) or their
                                connection closed without a goodbye; ranks: them */
    COLLIE_FAULT_PEER_STUCK, /* peers stopped or stuck: silent past a bound, not known dead
                                (a desync report found no answer); ranks: them */
    COLLIE_FAULT_DEADLINE,   /* an operation's deadline passed; ranks: the ranks behind it when
                                known (a desync report's suspect), else peers known dead or
                                suspected then, else none */
    COLLIE_FAULT_MISMATCH,   /* ranks posted disagreeing arguments; ranks: the two that disagree
                                where the finder knows (a frame's sender and this rank, the
                                desync report's pair, COLLIE_CHECK_ARGS's pair), else none */
    COLLIE_FAULT_APP_ABORT,  /* this process aborted (collie_comm_abort, a cancel that left the
                                peers mid-operation); origin: this rank; ranks: none */
    COLLIE_FAULT_PEER_ABORT, /* a peer aborted the comm (its application, or a fault there whose
                                data did not reach this rank); origin: that peer; ranks: none */
    COLLIE_FAULT_PEER_LEFT,  /* a peer destroyed its comm; ranks: the peers that left */
    COLLIE_FAULT_LOCAL,      /* a local error (memory, a system call, the backend, the engine
                                closing, a refused handshake, a malformed frame); origin: this
                                rank; ranks: none */
    COLLIE_FAULT_NUM_KINDS
} collie_fault_kind;

/* collie_fault_view: whose view the rank set is. */
typedef enum collie_fault_view {
    COLLIE_FAULT_VIEW_LOCAL = 0, /* this rank's own observation */
    COLLIE_FAULT_VIEW_PEER = 1,  /* the view of the rank that failed first (`origin`), learnt from
                                    its abort notice: every rank that learns the fault from that
                                    notice reports the same set */
    COLLIE_FAULT_VIEW_AGREED = 2 /* agreed by the survivors: the set a shrink left out (the old
                                    comm's fault once collie_comm_shrink decided) */
} collie_fault_view;

/* collie_fault_kind_name: "peer_dead", "deadline", ... ("none"; "?" for a
 * value that is no kind). */
COLLIE_API const char *collie_fault_kind_name(int kind);

/* The first COLLIE_FAULT_RANKS ranks of a set are listed (ascending); a
 * larger set says so in nranks. */
#define COLLIE_FAULT_RANKS 64

typedef struct collie_fault {
    size_t size; /* sizeof(collie_fault), set by the caller */
    int status;  /* the failure's status (COLLIE_OK: no fault, the rest zero; origin -1) */
    int kind;    /* collie_fault_kind */
    int view;    /* collie_fault_view */
    int origin;  /* the rank where the fault was first seen (-1: unknown) */
    int nranks;  /* ranks in the set (may exceed COLLIE_FAULT_RANKS) */
    int ranks[COLLIE_FAULT_RANKS];
} collie_fault;

#define COLLIE_FAULT_INIT                                                                          \
    { .size = sizeof(collie_fault) }

/* collie_work_fault: the fault of a done work (status COLLIE_OK and kind
 * NONE for a work that succeeded; a work failed by its comm's fault carries
 * the comm's). collie_comm_fault: the comm's root fault (what
 * collie_comm_error's message says). Any thread, never blocks. Errors:
 * EINVAL (NULL, size too small), INPROGRESS (the work is not done). */
COLLIE_API int collie_work_fault(const collie_work *w, collie_fault *f);
COLLIE_API int collie_comm_fault(const collie_comm *c, collie_fault *f);

/* ------------------------------------------------------------------------ */
/* Peer health and the fault event fd                                        */
/* ------------------------------------------------------------------------ */

/* How a comm knows its peers (docs/faults.md says more):
 *  - every frame a transport reads from a peer counts as heard from it, and
 *    a collective completed here means every member reached its sequence
 *    number;
 *  - same host (same pid namespace): each rank watches its peers' process
 *    ids (pidfd, published in the store at creation); an exit is seen at
 *    once, at no cost while idle — "dead" is certain;
 *  - a connection closed without a goodbye is "dead"; a goodbye (or the
 *    "left" record a destroying rank writes in the store) is "left";
 *  - COLLIE_HEARTBEAT_MS (default 1000; 0: off): links idle that long carry
 *    a heartbeat; a peer with a link that is silent past half of
 *    COLLIE_SUSPECT_MS (default 5000; more than the heartbeat) is "slow",
 *    past all of it "suspected" (an event), and "alive" again when heard
 *    (peer_back). Slow is reported, never punished: neither state faults
 *    the comm. Only peers with a link (heard at least once) are judged: a
 *    peer never heard gives no basis and stays "alive" unless something
 *    else tells. Peers without a link and on another host learn of a
 *    death from a rank that saw it (its abort notice). */
typedef enum collie_peer_state {
    COLLIE_PEER_ALIVE = 0,     /* heard from recently, or nothing says otherwise */
    COLLIE_PEER_SLOW = 1,      /* silent past half the suspect bound */
    COLLIE_PEER_SUSPECTED = 2, /* silent past the suspect bound (stopped, stuck, or cut off) */
    COLLIE_PEER_DEAD = 3,      /* its process exited or its connection closed without goodbye */
    COLLIE_PEER_LEFT = 4,      /* it destroyed its comm */
    COLLIE_PEER_SELF = 5       /* this rank */
} collie_peer_state;

COLLIE_API const char *collie_peer_state_name(int state);

typedef struct collie_peer_health {
    int state;            /* collie_peer_state */
    int64_t heard_ago_ms; /* since it was last heard from (-1: never) */
    uint64_t seq;         /* the highest collective sequence number it is known to have reached */
} collie_peer_health;

/* collie_comm_health: fill peers[r] for every rank r < min(n, size).
 * Cheap (relaxed reads), any thread, never blocks. Returns the number of
 * entries filled, or COLLIE_EINVAL (NULL, n < 0). */
COLLIE_API int collie_comm_health(const collie_comm *c, collie_peer_health *peers, int n);

typedef enum collie_event_kind {
    COLLIE_EVENT_PEER_DEAD = 1,      /* rank died */
    COLLIE_EVENT_PEER_SUSPECTED = 2, /* rank silent past the suspect bound */
    COLLIE_EVENT_PEER_BACK = 3,      /* a suspected rank was heard again */
    COLLIE_EVENT_PEER_LEFT = 4,      /* rank destroyed its comm */
    COLLIE_EVENT_COMM_FAULTED = 5,   /* the comm failed (status, fault kind: collie_comm_fault) */
    COLLIE_EVENT_EXCLUDED = 6        /* the survivors shrank the comm without this rank (rank:
                                        the rank that told; its posts fail COLLIE_ENOTMEMBER) */
} collie_event_kind;

COLLIE_API const char *collie_event_kind_name(int kind);

typedef struct collie_comm_event {
    size_t size;      /* sizeof(collie_comm_event), set by the caller */
    int kind;         /* collie_event_kind */
    int rank;         /* the peer (COMM_FAULTED: the fault's origin, -1 unknown) */
    int status;       /* COMM_FAULTED: the comm's status; else COLLIE_OK */
    int fault_kind;   /* COMM_FAULTED: collie_fault_kind; else NONE */
    int64_t time_ns;  /* when it was seen (CLOCK_MONOTONIC) */
    uint64_t dropped; /* events dropped before this one (the queue was full) */
} collie_comm_event;

#define COLLIE_COMM_EVENT_INIT                                                                     \
    { .size = sizeof(collie_comm_event) }

/* collie_comm_event_fd: a file descriptor that is readable (POLLIN) while
 * events are pending: watch it from epoll, libevent or asyncio, never read
 * it; pop with collie_comm_event_pop. The comm owns it (closed by destroy).
 * Events are kept from the comm's creation, whether or not this was
 * called. Returns the fd, or a negative status. */
COLLIE_API int collie_comm_event_fd(collie_comm *c);

/* Order: a peer's death or leave is an event once the fault it causes is
 * recorded (collie_comm_fault reads it), and before that fault's
 * comm_faulted event. */

/* collie_comm_event_pop: take the oldest pending event. COLLIE_OK with
 * *ev filled, COLLIE_INPROGRESS if none is pending, COLLIE_EINVAL (NULL,
 * size too small). Any thread; never blocks. */
COLLIE_API int collie_comm_event_pop(collie_comm *c, collie_comm_event *ev);

/* ------------------------------------------------------------------------ */
/* Statistics of a communicator                                              */
/* ------------------------------------------------------------------------ */

/* The conventions of the *_stats structs (size first, fields added at the
 * end, relaxed snapshots): collie.h, "Statistics". */

/* Latency histogram: buckets[0] counts latencies under 1 us, buckets[i]
 * (0 < i < COLLIE_LATENCY_BUCKETS-1) those in [2^(i-1), 2^i) us, the last
 * bucket every longer one (over 2^29 us, about 9 minutes). */
#define COLLIE_LATENCY_BUCKETS 31
typedef struct collie_latency_histogram {
    uint64_t count;  /* works measured */
    uint64_t sum_ns; /* their total latency */
    uint64_t buckets[COLLIE_LATENCY_BUCKETS];
} collie_latency_histogram;

/* collie_latency_bucket_le_us: the upper bound of bucket i in microseconds
 * (2^i; -1 for the last, unbounded one). */
COLLIE_API int64_t collie_latency_bucket_le_us(int i);

/* Operation kinds counted apart (allreduce, broadcast, ..., send, recv):
 * index i of collie_comm_stats.latency is named by collie_stats_op_name(i)
 * (NULL past the last kind). */
#define COLLIE_STATS_OPS 16
COLLIE_API const char *collie_stats_op_name(int i);

/* Errors counted apart: failed_by_status[-status] (e.g.
 * failed_by_status[-COLLIE_ETIMEDOUT]); codes beyond the array land in
 * its last slot. */
#define COLLIE_STATS_STATUSES 24

typedef struct collie_comm_stats {
    size_t size;          /* sizeof(collie_comm_stats) */
    uint64_t generation;  /* collie_comm_generation */
    int status;           /* collie_comm_error's status: COLLIE_OK while healthy */
    uint32_t connections; /* peer connections the CPU transport has open now */
    uint64_t posted;      /* collectives and send/recv accepted (a refused post is not) */
    uint64_t completed;   /* ended with COLLIE_OK */
    uint64_t failed;      /* ended with an error */
    uint64_t in_flight;   /* posted and not ended yet */
    uint64_t bytes;       /* payload bytes of the completed works (this rank's buffers) */
    uint64_t failed_by_status[COLLIE_STATS_STATUSES];
    uint64_t store_reconnects; /* times the comm's store connection was made again */
    uint64_t stalls;           /* stalls of its engine's progress loop so far */
    /* post to completion of the completed works, by kind */
    collie_latency_histogram latency[COLLIE_STATS_OPS];
    uint32_t shm_connections; /* of `connections`, those over shared memory (same-host peers) */
    /* payload bytes received by single copy: read straight out of a
     * same-host sender's memory (COLLIE_SHM_SINGLE_COPY) */
    uint64_t shm_single_copy_bytes;
    /* failure as data (collie_comm_fault, collie_comm_health) */
    int fault_kind; /* the kind of the comm's root fault (collie_fault_kind; NONE while healthy) */
    /* failed works by the kind of their fault (collie_work_fault), indexed by collie_fault_kind */
    uint64_t failed_by_kind[COLLIE_FAULT_NUM_KINDS];
    uint32_t peers_dead;      /* peers whose health is COLLIE_PEER_DEAD now */
    uint32_t peers_suspected; /* ... COLLIE_PEER_SUSPECTED now */
    uint32_t peers_left;      /* ... COLLIE_PEER_LEFT (they destroyed their comm) */
    /* membership changes in this comm's line: the shrinks and grows that made it from its
     * family's first comm (collie_comm_shrink, collie_comm_grow; a joiner learns them) */
    uint32_t shrinks, grows;
} collie_comm_stats;

/* (C; in C++: `collie_comm_stats st{}; st.size = sizeof st;`) */
#define COLLIE_COMM_STATS_INIT                                                                     \
    { .size = sizeof(collie_comm_stats) }

/* collie_comm_get_stats: fill *st (st->size set by the caller). Errors:
 * EINVAL (NULL, or size smaller than the first fields'). */
COLLIE_API int collie_comm_get_stats(const collie_comm *c, collie_comm_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_COMM_H */
