/*
 * nccl_backend.h — the NCCL transport plugin (libcollie_nccl.so): state
 * shared by its files. Uses only collie.h, collie_backend.h and the
 * CUDA/NCCL headers; everything from the core comes through `core`.
 *
 *   nccl_backend.c   ops table, settings, init (device, unique id, NCCL
 *                    communicator), destroy, references
 *   nccl_post.c      start (caller's thread): the NCCL calls, launching,
 *                    wait_stream
 *   nccl_progress.c  poll and detach (loop): completions, async errors
 *   nccl_abort.c     abort and cancel: claim, ncclCommAbort off the loop,
 *                    publish
 *   nccl_split.c     children of collie_comm_split/new_group by ncclCommSplit
 *   nccl_shrink.c    comms of collie_comm_shrink by ncclCommShrink (or a
 *                    fresh init), the run-time NCCL symbols (revoke, shrink)
 *
 * Lock: one mutex per comm (mu) guards everything below marked "mu". It is
 * taken on the posting thread (inside the core's comm lock: order core comm
 * lock → mu), on the loop and on the helper threads. Nothing calls into the
 * core while holding it except the work-state atomics (busy_enter/exit,
 * claim), which never call back.
 */
#ifndef CL_NCCL_BACKEND_H
#define CL_NCCL_BACKEND_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "collie_backend.h"
#include "base/list.h"

#define NCCL_MOD "nccl"
/* a log line about this comm (its name and rank as fields); a core older
 * than the log_comm service gets a plain line */
#define NCCL_LOG(nc, level, ...)                                                                   \
    (COLLIE_CORE_HAS((nc)->core, log_comm)                                                         \
         ? (nc)->core->log_comm((nc)->bc, level, NCCL_MOD, __VA_ARGS__)                            \
         : (nc)->core->log(level, NCCL_MOD, __VA_ARGS__))

enum nccl_phase {
    NCCL_SETUP = 0, /* the setup thread picks the device, makes the stream */
    NCCL_UID,       /* the unique id travels through the store (a split
                       child: ncclCommSplit waits for the parent to be free;
                       a shrunk comm: the old one's quiesce, then the vote) */
    NCCL_INIT,      /* ncclCommInitRankConfig returned; polling its state */
    NCCL_READY,     /* collectives may run */
    NCCL_DEAD,      /* init failed or the comm was aborted: no NCCL call any more */
};

enum nccl_wstate {
    NCCL_W_QUEUED = 0, /* not given to NCCL yet (an earlier call is in progress) */
    NCCL_W_LAUNCHING,  /* NCCL returned ncclInProgress for it */
    NCCL_W_LAUNCHED,   /* enqueued; end event recorded */
};

typedef struct cl_nccl_comm cl_nccl_comm;
typedef struct cl_nccl_work cl_nccl_work;

/* Per-work state; lives inside the core's work (work_data_size). */
struct cl_nccl_work {
    collie_work *w;
    cl_nccl_comm *nc;
    collie_coll_args args;
    cudaEvent_t start_ev, end_ev;
    int state;         /* enum nccl_wstate (mu) */
    bool gpu_done;     /* end event completed (mu) */
    bool finished;     /* finished, or handed to someone who will finish it (mu) */
    bool claimed;      /* claimed by the abort; published with the batch (mu) */
    bool late;         /* the abort found it not yet started by the core (mu) */
    bool canceled;     /* canceled (ops->cancel) while the GPU may use it: an abort publishes it */
    int cancel_status; /* the status the cancel gave it */
    char cancel_msg[192];    /* ... and its message */
    cudaError_t record_err;  /* cudaEventRecord of end_ev failed (mu) */
    ncclResult_t issue_err;  /* NCCL refused it when the poll hook issued it (mu) */
    cl_list_node node;       /* nc's pending list, post order (mu) */
    cl_list_node batch_node; /* nc's batch (mu), or a batch taken from it */
};

struct cl_nccl_comm {
    collie_bcomm *bc;
    const collie_core_services *core;
    int rank, size, dev;
    int dev_opt; /* the comm's `device` option (-1: rank % devices) */
    /* a child of collie_comm_split/new_group: made by ncclCommSplit of the
     * parent's communicator (held until this one is freed) */
    cl_nccl_comm *parent;
    int split_color, split_key;
    /* a comm of collie_comm_shrink: the old comm's state (held until this
     * one's NCCL init is over), its ranks left out, the old comm's device;
     * voted: this rank said whether it can shrink (loop) */
    cl_nccl_comm *shrink_from;
    int *shrink_excl, shrink_nexcl, shrink_dev;
    bool shrink_voted, shrunk; /* shrunk: nc->comm came from ncclCommShrink */
    int vote_step, vote_next;  /* the vote's store request; rank 0: whose vote next */
    char vote_no[200];         /* why not (the first "no"), or "" */
    int32_t poll_us, abort_timeout_ms;
    int32_t create_timeout_ms; /* the bound of init (<= 0: none) */
    int64_t init_start_ns;
    _Atomic int refs; /* the backend's + each helper thread's */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* abort progress (destroy waits, bounded) */

    /* mu */
    int phase;
    bool poll_hint, destroyed;
    ncclComm_t comm;
    ncclComm_t revoked;   /* aborted by ncclCommRevoke and quiesced: kept for a
                             shrink until destroy and shrink_users allow */
    int shrink_users;     /* shrunk comms that may still build from it */
    cudaStream_t stream;  /* the internal stream every NCCL call runs on */
    void *scratch;        /* 4 device bytes for barriers */
    bool nccl_inprogress; /* a call returned ncclInProgress: no other NCCL call yet */
    cl_list pending;      /* cl_nccl_work.node */
    cudaEvent_t *pool;
    size_t npool, cappool;

    /* setup thread → loop (mu) */
    bool setup_done;
    int setup_status;
    char setup_msg[256];
    ncclUniqueId uid;

    /* the store request in flight during init (loop) */
    collie_work *store_req;
    struct cl_nccl_store_ctx *store_ctx;

    /* abort (mu) */
    bool aborting, abort_done, batch_taken, batch_published, destroying;
    int abort_status;
    char abort_reason[512];
    int64_t abort_start_ns;
    cl_list batch;      /* cl_nccl_work.batch_node: the works the quiesce publishes */
    cl_nccl_work *root; /* claimed by a fault before the abort (async error) */
    int root_status;
    char root_msg[512];
};

/* the store request in flight during init (nc NULL once destroy ran) */
typedef struct cl_nccl_store_ctx {
    cl_nccl_comm *nc;
    const collie_core_services *core;
} cl_nccl_store_ctx;

/* nccl_backend.c */
void cl_nccl_hold(cl_nccl_comm *nc);
void cl_nccl_release(cl_nccl_comm *nc);
int64_t cl_nccl_now_ns(void);
const char *cl_nccl_strerror(ncclResult_t r, ncclComm_t comm, char *buf, size_t len);
/* want_poll when the wish differs from the hint (call without mu) */
void cl_nccl_poll_set(cl_nccl_comm *nc, bool on);
/* whether the loop must keep polling (mu) */
bool cl_nccl_poll_needed_locked(const cl_nccl_comm *nc);

/* nccl_split.c: a child comm from the parent's (ncclCommSplit) */
int cl_nccl_split(collie_bcomm *bc, const collie_core_services *core, void *parent, int color,
                  int key, void **state);
int cl_nccl_split_skip(void *parent, int key);
/* poll hook, phase NCCL_UID of a split child: call ncclCommSplit once the
 * parent is free (loop) */
void cl_nccl_split_poll(cl_nccl_comm *nc);

/* nccl_backend.c: a new comm; o: where it comes from (NULL: a fresh init) */
typedef struct cl_nccl_origin {
    cl_nccl_comm *parent; /* a split child: ncclCommSplit of parent's */
    int color, key;
    cl_nccl_comm *shrink_from; /* a shrunk comm: ncclCommShrink of shrink_from's */
    const int *excluded;
    int nexcluded;
} cl_nccl_origin;
int cl_nccl_comm_start(collie_bcomm *bc, const collie_core_services *core, const cl_nccl_origin *o,
                       void **state);
/* init failed: no NCCL call any more; tell the core (loop) */
void cl_nccl_init_fail(cl_nccl_comm *nc, int status, const char *msg);
/* the unique id is known: ncclCommInitRankConfig (loop, phase NCCL_UID) */
void cl_nccl_comm_init(cl_nccl_comm *nc);
/* post a store request of init (kind 's' set, 'g' get, under the comm's
 * namespace) whose callback is cb with a cl_nccl_store_ctx; false (init
 * failed, said why) if it could not be posted (loop) */
bool cl_nccl_store_post(cl_nccl_comm *nc, int kind, const char *key, const void *val, size_t len,
                        collie_work_cb cb);
/* the start of a store callback: the request's comm (NULL: destroyed
 * meanwhile, w released) and its status; the ctx is freed */
cl_nccl_comm *cl_nccl_store_done(collie_work *w, void *arg, int *status);
/* a store request of init failed (status st): init fails saying `what`,
 * unless it was cancelled (an abort); w is released */
void cl_nccl_store_failed(cl_nccl_comm *nc, collie_work *w, int st, const char *what);

/* nccl_shrink.c */
int cl_nccl_shrink(collie_bcomm *bc, const collie_core_services *core, void *old,
                   const int *excluded, int nexcluded, void **state);
/* poll hook, phase NCCL_UID of a shrunk comm before its vote: wait for the
 * old comm's quiesce, then vote (loop) */
void cl_nccl_shrink_poll(cl_nccl_comm *nc);
/* the shrunk comm's NCCL init is over: let go of the old comm (loop) */
void cl_nccl_shrink_let_go(cl_nccl_comm *nc);
/* one shrunk comm less may build from `from`: its revoked communicator
 * goes if it was destroyed meanwhile; drops the reference (any thread) */
void cl_nccl_shrink_unuse(cl_nccl_comm *from);
/* NCCL functions resolved at run time, from the libnccl the plugin's NCCL
 * calls bind to (NULL: that NCCL lacks them) */
typedef ncclResult_t (*cl_nccl_revoke_fn)(ncclComm_t comm, int flags);
cl_nccl_revoke_fn cl_nccl_sym_revoke(const collie_core_services *core);

/* nccl_post.c */
int cl_nccl_start(void *state, collie_work *w, const collie_coll_args *a);
int cl_nccl_wait_stream(void *state, collie_work *w, void *stream);
/* after ncclInProgress: finish launching once NCCL is done (mu) */
void cl_nccl_launch_progress_locked(cl_nccl_comm *nc);
void cl_nccl_event_put_locked(cl_nccl_comm *nc, cudaEvent_t ev, bool reusable);

/* nccl_progress.c */
void cl_nccl_poll(void *state);
void cl_nccl_detach(void *state, collie_work *w);
/* the core has run start for w (it may be finished) */
bool cl_nccl_work_active(const collie_core_services *core, collie_work *w);

/* nccl_abort.c */
void cl_nccl_abort(void *state, int status, const char *reason);
/* the core claimed w at its deadline: publish it with the abort's batch (loop) */
void cl_nccl_cancel(void *state, collie_work *w, int status, const char *msg);
/* loop, while aborting: claim late works, watch the bound */
void cl_nccl_abort_poll(cl_nccl_comm *nc);
/* destroy: wait (bounded) for the abort; publish what is left */
void cl_nccl_abort_finish_for_destroy(cl_nccl_comm *nc);
/* release a NCCL communicator off the loop (destroy without abort; a
 * revoked one) */
void cl_nccl_comm_release_async(cl_nccl_comm *nc, ncclComm_t comm);

#endif
