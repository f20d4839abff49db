/*
 * collie_backend.h — the versioned interface (ABI 3) between collie's core
 * and a transport backend: built in, registered in-process, or a plugin.
 *
 * A backend links no symbol of the core: everything it needs (identity of
 * the comm, ending works, reading works it holds, dtype names and sizes,
 * fd watches and timers on the progress thread, the store, logging) comes
 * through the const services table handed to init(). So a plugin loads
 * into a program linked with libcollie.so or with libcollie.a alike, and
 * no libevent type crosses this interface. The core owns works, sequence
 * numbers, deadlines, error policies and the creation rendezvous; a
 * backend moves bytes.
 *
 * Threads: init, start, poll, cancel, abort and destroy run on the
 * engine's progress thread ("loop") unless the backend sets
 * COLLIE_BACKEND_POST_ON_CALLER, in which case start runs on the posting
 * thread (NCCL: stream ordering and CUDA graph capture need the caller's
 * thread) and must be thread-safe. Two hooks run elsewhere too, as their
 * comments say: progress on a thread that holds the engine's progress
 * lock (a waiter or poster standing in for the loop), and unlend on
 * whichever thread claims the ending work (any thread).
 *
 * Plugins: a shared object found in COLLIE_PLUGIN_PATH (or the library
 * search path) as libcollie_<name>.so exporting
 *     const collie_backend_ops *collie_backend_plugin_v3(void);
 * The symbol carries the ABI number. A plugin built for ABI 2 or older
 * (symbol collie_backend_plugin_v1) is refused with a message naming both
 * versions: its services table handed out libevent's event_base, which
 * this core no longer does.
 *
 * Growing the ABI: both tables carry their size. New hooks are appended;
 * a table shorter than the reader's means "hook absent": the core reads a
 * backend's ops through a zero-filled copy, and a backend tests a service
 * appended after ABI 3 with COLLIE_CORE_HAS(core, field) before calling
 * it. The version changes only when an existing field does.
 */
#ifndef COLLIE_BACKEND_H
#define COLLIE_BACKEND_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "collie.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COLLIE_BACKEND_ABI_VERSION   3
#define COLLIE_BACKEND_PLUGIN_SYMBOL "collie_backend_plugin_v3"

/* collie_coll_kind: the operations a backend may be asked to run. */
typedef enum collie_coll_kind {
    COLLIE_COLL_ALLREDUCE = 0,
    COLLIE_COLL_BROADCAST,
    COLLIE_COLL_REDUCE,
    COLLIE_COLL_ALLGATHER,
    COLLIE_COLL_REDUCE_SCATTER,
    COLLIE_COLL_ALLTOALL,
    COLLIE_COLL_GATHER,
    COLLIE_COLL_SCATTER,
    COLLIE_COLL_BARRIER,
    COLLIE_COLL_SEND,
    COLLIE_COLL_RECV,
    COLLIE_COLL_ALLGATHERV, /* appended: only for COLLIE_BACKEND_V_COLLECTIVES backends */
    COLLIE_COLL_ALLTOALLV,
    COLLIE_COLL_NUM_KINDS
} collie_coll_kind;

/* collie_coll_kind_name: "allreduce", "reduce_scatter", ... ("?" for a
 * value that is no kind). Header-only: a plugin needs no core symbol. */
static inline const char *collie_coll_kind_name(collie_coll_kind k) {
    static const char *const names[COLLIE_COLL_NUM_KINDS] = {
        "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather",
        "scatter",   "barrier",   "send",   "recv",      "allgatherv",     "alltoallv"};
    return (unsigned)k < COLLIE_COLL_NUM_KINDS ? names[k] : "?";
}

/* collie_coll_has_root / collie_coll_reduces: does this kind of collective
 * have a root / a reduction (arguments that must agree across ranks)? */
static inline bool collie_coll_has_root(collie_coll_kind k) {
    return k == COLLIE_COLL_BROADCAST || k == COLLIE_COLL_REDUCE || k == COLLIE_COLL_GATHER ||
           k == COLLIE_COLL_SCATTER;
}
static inline bool collie_coll_reduces(collie_coll_kind k) {
    return k == COLLIE_COLL_ALLREDUCE || k == COLLIE_COLL_REDUCE || k == COLLIE_COLL_REDUCE_SCATTER;
}

/* collie_coll_is_v: a collective with per-rank counts (the *counts and
 * *displs fields of collie_coll_args). */
static inline bool collie_coll_is_v(collie_coll_kind k) {
    return k == COLLIE_COLL_ALLGATHERV || k == COLLIE_COLL_ALLTOALLV;
}

/* collie_coll_count_agrees: must `count` be equal on every rank? Not for
 * alltoallv, whose count is what this rank sends (its ranks agree pair by
 * pair: sendcounts[p] on rank r is recvcounts[r] on rank p). */
static inline bool collie_coll_count_agrees(collie_coll_kind k) {
    return k != COLLIE_COLL_ALLTOALLV && k != COLLIE_COLL_SEND && k != COLLIE_COLL_RECV;
}

/* collie_coll_describe: one rank's side of a collective for messages:
 * "broadcast of 4 x int32 (root 1)", "allreduce of 4 x fp32 (sum)" (no
 * reduction for kinds without one). The caller passes the dtype's and the
 * reduction's names (collie_dtype_name, collie_redop_name). Header-only. */
static inline void collie_coll_describe(char *buf, size_t len, collie_coll_kind k, uint64_t count,
                                        const char *dtype, const char *op, int root) {
    if (k == COLLIE_COLL_BARRIER) {
        snprintf(buf, len, "barrier");
        return;
    }
    char extra[48] = "";
    if (collie_coll_reduces(k) && collie_coll_has_root(k))
        snprintf(extra, sizeof extra, " (%s, root %d)", op, root);
    else if (collie_coll_reduces(k))
        snprintf(extra, sizeof extra, " (%s)", op);
    else if (collie_coll_has_root(k))
        snprintf(extra, sizeof extra, " (root %d)", root);
    snprintf(buf, len, "%s of %llu x %s%s", collie_coll_kind_name(k), (unsigned long long)count,
             dtype, extra);
}

/* collie_coll_args: one validated operation. Counts follow collie.h;
 * allgatherv's count is the whole result (the sum of recvcounts), and
 * alltoallv's what this rank sends (the sum of sendcounts). */
typedef struct collie_coll_args {
    collie_coll_kind kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    collie_dtype dtype;
    collie_redop op;
    int root;     /* broadcast, reduce, gather, scatter */
    int peer;     /* send, recv */
    uint64_t tag; /* send, recv */
    void *stream; /* cudaStream_t for CUDA posts, NULL for CPU posts */
    /* allgatherv, alltoallv (NULL for every other kind): per-rank counts
     * and displacements in elements, one entry per rank, displacements
     * always given; owned by the work (valid until the backend's detach).
     * allgatherv: rank p's block is recvcounts[p] elements at rdispls[p]
     * of recvbuf (this rank sends recvcounts[rank]); send* are NULL.
     * Appended in ABI 3: a backend without COLLIE_BACKEND_V_COLLECTIVES
     * is never given a v kind, so it never reads them. */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
} collie_coll_args;

/* The core's handle for one backend instance of one communicator. */
typedef struct collie_bcomm collie_bcomm;

/* collie_watch: an fd watch or a timer on the progress thread (a watch
 * with fd -1 is a timer). Persistent: once started it fires for every
 * readiness (or each timeout) until stopped. */
typedef struct collie_watch collie_watch;
enum {
    COLLIE_WATCH_READ = 1,    /* the fd is readable */
    COLLIE_WATCH_WRITE = 2,   /* the fd is writable */
    COLLIE_WATCH_TIMEOUT = 4, /* the timeout given to watch_start passed */
};
typedef void (*collie_watch_cb)(int fd, unsigned events, void *arg);

/* collie_core_services: what the core offers a backend. Every function
 * pointer up to `size` is set. "loop" = the progress thread only. */
typedef struct collie_core_services {
    uint32_t abi_version; /* the core's COLLIE_BACKEND_ABI_VERSION */
    uint32_t size;        /* sizeof(collie_core_services) as the core saw it */

    /* identity of the communicator */
    int (*rank)(const collie_bcomm *bc);
    int (*nranks)(const collie_bcomm *bc);
    const char *(*name)(const collie_bcomm *bc);
    uint64_t (*generation)(const collie_bcomm *bc);
    uint64_t (*comm_id)(const collie_bcomm *bc); /* hash of name + generation */
    int (*device)(const collie_bcomm *bc);       /* the comm's `device` option (-1: none) */
    int32_t (*create_timeout_ms)(const collie_bcomm *bc); /* bound for init steps */
    bool (*on_progress_thread)(const collie_bcomm *bc);

    /* the loop's events (loop): watch_new makes a stopped watch of `fd`
     * for `events` (COLLIE_WATCH_READ and/or _WRITE; fd -1 and 0 for a
     * timer) or returns NULL (no memory). watch_start arms it, with a
     * timeout in microseconds (-1: none; a timer needs one) re-armed after
     * each firing; watch_stop disarms it (also drops a pending activation);
     * watch_activate runs the callback on the next loop turn with `events`;
     * watch_free stops and frees it. The backend frees its watches by
     * destroy at the latest. */
    collie_watch *(*watch_new)(collie_bcomm *bc, int fd, unsigned events, collie_watch_cb cb,
                               void *arg);
    int (*watch_start)(collie_watch *wt, int64_t timeout_us);
    void (*watch_stop)(collie_watch *wt);
    void (*watch_activate)(collie_watch *wt, unsigned events);
    void (*watch_free)(collie_watch *wt);
    /* polling: while on, the engine calls ops->poll every interval_us (any
     * thread; from another thread it takes effect on the next loop turn) */
    void (*want_poll)(collie_bcomm *bc, bool on, int32_t interval_us);

    /* ending the works the core started on this backend: the first
     * finisher wins. work_finish ends w at once; work_claim + work_publish
     * is the same in two steps (claim, gather results or quiesce a device,
     * publish). After the core calls start, the backend must end the work
     * or see it ended by a cancel it was asked to honour (ops->cancel). */
    bool (*work_finish)(collie_work *w, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    bool (*work_claim)(collie_work *w);
    void (*work_publish)(collie_work *w, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* bracket access to the work's user buffers (loop): enter returns false
     * if the work is ended or being ended (then do not touch them) */
    bool (*work_busy_enter)(collie_work *w);
    void (*work_busy_exit)(collie_work *w);
    /* the backend's per-work state slot (ops->work_data_size bytes) */
    void *(*work_backend_data)(collie_work *w);

    /* reading works (its own, or the store works it posted): as the
     * collie_work_* functions of collie.h of the same names */
    bool (*work_test)(const collie_work *w);
    int (*work_result)(const collie_work *w);
    const char *(*work_error_message)(const collie_work *w);
    uint64_t (*work_seq)(const collie_work *w);
    int (*work_cancel)(collie_work *w);
    void (*work_release)(collie_work *w);

    /* data types */
    size_t (*dtype_size)(collie_dtype dt);
    const char *(*dtype_name)(collie_dtype dt);
    const char *(*redop_name)(collie_redop op);

    /* faults: the backend saw the comm break (peer died, protocol error,
     * async backend error). The core fails the work (if given) with
     * `status`, applies the comm's error policy, and calls abort. (loop)
     * A fault on a comm that has failed already (its policy other than
     * NONE) fails the work with COLLIE_EABORTED naming the root cause. */
    void (*fault)(collie_bcomm *bc, collie_work *w, int status, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
    /* init completion: the backend calls this once, with COLLIE_OK when it
     * is ready for start(), or an error. (loop) */
    void (*init_done)(collie_bcomm *bc, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* set the detail collie_last_error() reports to the caller of a post
     * whose start failed (caller's thread, POST_ON_CALLER backends) */
    void (*set_error)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

    /* the comm's store namespace ("collie/<name>/<gen>/" + key), async, with
     * a callback on the loop. The returned work belongs to the backend
     * (work_release it). */
    int (*store_set)(collie_bcomm *bc, const char *key, const void *val, size_t len,
                     collie_work_cb cb, void *arg, collie_work **out);
    int (*store_get)(collie_bcomm *bc, const char *key, int32_t timeout_ms, collie_work_cb cb,
                     void *arg, collie_work **out);
    int (*store_value)(const collie_work *w, const void **val, size_t *len);

    /* authentication: HMAC-SHA256 of `msg` under the store's shared secret
     * (all zero bytes when there is none), for connection handshakes. */
    void (*auth_mac)(const collie_bcomm *bc, const void *msg, size_t len, unsigned char out[32]);
    bool (*auth_enabled)(const collie_bcomm *bc);

    /* logging: level 0 error .. 3 debug; log_enabled saves formatting */
    void (*log)(int level, const char *module, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    bool (*log_enabled)(int level);
    /* settings (COLLIE_SOCKET_IFNAME etc.): the raw value or NULL */
    const char *(*setting)(const char *name);
    /* (appended services go here; test them with COLLIE_CORE_HAS) */
    /* logging about this comm: the line carries its name and rank (an
     * embedder's log handler gets them as fields) */
    void (*log_comm)(const collie_bcomm *bc, int level, const char *module, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
    /* counters the comm's stats report (collie_comm_get_stats): add delta
     * to counter `which` (COLLIE_BSTAT_*). Any thread. */
    void (*stat_add)(collie_bcomm *bc, int which, int64_t delta);
    /* a COLLIE_ANY_SOURCE receive took a message from `rank`
     * (collie_work_source); before the work is finished (loop) */
    void (*work_set_source)(collie_work *w, int rank);
    /* peer health: what a link says of its peer (collie_comm_health).
     * peer_gone: its connection closed without a goodbye (COLLIE_PEER_DEAD),
     * after one (COLLIE_PEER_LEFT), after its ABORT frame
     * (COLLIE_PEER_ALIVE: it aborted the comm and lives), or it cannot be
     * reached (COLLIE_PEER_SUSPECTED: a connect failed, a link broke with
     * an error other than a reset); call it before
     * the faults it causes (loop). peer_heard: a frame came from `rank`
     * (seq: the collective sequence number it belongs to, 0 if none); any
     * thread, a few relaxed stores. A backend with links keeps them from
     * falling silent: a link idle for COLLIE_HEARTBEAT_MS (the setting; 0:
     * off) carries a frame, since the core suspects a peer it heard once
     * and then not for COLLIE_SUSPECT_MS. */
    void (*peer_gone)(collie_bcomm *bc, int rank, int state);
    void (*peer_heard)(collie_bcomm *bc, int rank, uint64_t seq);
    /* the COLLIE_EPROTO this backend reports next (a fault, or a work it
     * ends) is a disagreement with `rank`: its frame's arguments differ
     * from this rank's post. The fault's data names the two (loop). */
    void (*peer_disagrees)(collie_bcomm *bc, int rank);
} collie_core_services;

/* The counters of stat_add. */
enum {
    COLLIE_BSTAT_CONNECTIONS = 0,     /* peer connections open now: +1 when one is ready, -1 when
                                         it closes */
    COLLIE_BSTAT_SHM_CONNECTIONS = 1, /* of those, the ones over shared memory */
    COLLIE_BSTAT_SHM_SINGLE_COPY_BYTES = 2, /* payload bytes read straight out of a same-host
                                               peer's memory (single copy) */
};

/* COLLIE_CORE_USABLE: is this core's table one a backend built with this
 * header can use (same ABI, every ABI-3 service present)? A backend checks
 * it first thing in init and split (and returns COLLIE_ENOTSUP if not). */
#define COLLIE_CORE_ABI3_SIZE                                                                      \
    (offsetof(collie_core_services, setting) + sizeof(const char *(*)(const char *)))
#define COLLIE_CORE_USABLE(core)                                                                   \
    ((core) != NULL && (core)->abi_version == COLLIE_BACKEND_ABI_VERSION &&                        \
     (core)->size >= COLLIE_CORE_ABI3_SIZE)

/* COLLIE_CORE_HAS: does this core's table have `field` (a service appended
 * after the header the backend was built with)? */
#define COLLIE_CORE_HAS(core, field)                                                               \
    ((core)->size >= offsetof(collie_core_services, field) + sizeof((core)->field) &&              \
     (core)->field != NULL)

/* flags: POST_ON_CALLER (see the top); V_COLLECTIVES: start runs
 * allgatherv and alltoallv (the core refuses them, COLLIE_ENOTSUP, on a
 * backend without it, such as one built before they were added);
 * ANY_SOURCE: start runs receives whose peer is COLLIE_ANY_SOURCE (the
 * backend reports the sender with work_set_source; refused without it). */
enum {
    COLLIE_BACKEND_POST_ON_CALLER = 1,
    COLLIE_BACKEND_V_COLLECTIVES = 2,
    COLLIE_BACKEND_ANY_SOURCE = 4,
};

/* collie_backend_ops: a backend. `const`, designated initialisers, with
 *     .abi_version = COLLIE_BACKEND_ABI_VERSION,
 *     .size = sizeof(collie_backend_ops),
 * The core keeps its own copy, zero-filled past `size`: optional hooks a
 * backend built against an older ABI-3 header does not know are NULL, and
 * fields of a newer one are ignored. */
typedef struct collie_backend_ops {
    uint32_t abi_version;  /* COLLIE_BACKEND_ABI_VERSION */
    uint32_t size;         /* sizeof(collie_backend_ops) as the backend saw it */
    const char *name;      /* "tcp", "nccl" (matched case-insensitively) */
    const char *device;    /* "cpu" or "cuda" */
    uint32_t flags;        /* COLLIE_BACKEND_POST_ON_CALLER, _V_COLLECTIVES */
    size_t work_data_size; /* bytes of per-work state the core reserves */

    /* init: set up the backend for a comm whose rendezvous is done (rank,
     * size, generation known); asynchronous: report with core->init_done. */
    int (*init)(collie_bcomm *bc, const collie_core_services *core, void **state);
    /* start: run `w` (the core has validated `a`). Returns COLLIE_OK, or an
     * error (the core then finishes the work with it). Works are started in
     * post order. */
    int (*start)(void *state, collie_work *w, const collie_coll_args *a);
    /* detach: `w` was finished (by anyone); drop every reference to it.
     * Called exactly once per started work, on the loop. */
    void (*detach)(void *state, collie_work *w);
    /* poll: make progress (only while want_poll is on). */
    void (*poll)(void *state);
    /* abort: the comm is failing: finish every pending work with `status`
     * and `reason`, close connections; must not block. Idempotent. */
    void (*abort)(void *state, int status, const char *reason);
    /* destroy: free everything (after abort or when idle). Works that were
     * finished but not yet detached are detached before destroy. */
    void (*destroy)(void *state);
    /* wait_stream: make the CUDA stream `stream` wait for w (cuda backends;
     * NULL for cpu backends). Caller's thread. (New fields go at the end.) */
    int (*wait_stream)(void *state, collie_work *w, void *stream);
    /* cancel (optional; cuda backends): end `w` with `status` and `msg`
     * because someone other than the device asked to (its deadline passed,
     * collie_work_cancel, a waiter past its deadline). The backend ends it
     * itself (work_finish, or claim + publish) once the device no longer
     * touches its buffers: at once if its GPU work is done, else after the
     * abort the core starts next (a CUDA operation cannot be stopped alone).
     * Idempotent; w may have ended meanwhile (then do nothing). Without the
     * hook the core finishes the work at once (cpu backends: the BUSY
     * bracket keeps the loop off the buffers). (loop) */
    void (*cancel)(void *state, collie_work *w, int status, const char *msg);
    /* split (optional): init for a comm made by collie_comm_split or
     * collie_comm_new_group whose parent runs this same backend: build the
     * child from the parent's state (`parent`, ready) instead of a
     * rendezvous of its own — NCCL: ncclCommSplit. Same contract as init.
     * Every rank of the parent takes part exactly once per split: members
     * of a child through split (colour >= 0; child ranks in (key, parent
     * rank) order), every other rank through split_skip. (loop) */
    int (*split)(collie_bcomm *bc, const collie_core_services *core, void *parent, int color,
                 int key, void **state);
    /* split_skip (optional, with split): this rank of the parent joins no
     * child that runs this backend; take part in the parent's split without
     * one. Must not block: COLLIE_INPROGRESS means "not now" (a call still
     * in progress) and the core calls again, bounded by the parent's
     * creation timeout. (caller's thread, in post order with the parent's
     * collectives) */
    int (*split_skip)(void *parent, int key);
    /* progress (optional): one non-blocking step outside the loop's event
     * callbacks: read what has arrived, write what fits (a same-host ring
     * has no file descriptor to wake the loop). With `sleeping` false it
     * runs on every turn of a spinning loop, and on a thread that waits
     * for, tests or has just posted a work while it holds the engine's
     * progress lock: that thread is the loop for the step, every service
     * marked (loop) may be used, and user code is never called from it.
     * With `sleeping` true the loop is about to block: from now on,
     * anything that arrives must wake a watch. Returns true if the backend
     * also has traffic only the loop's event pass sees (sockets), so a
     * helper should run that pass too. (loop) */
    bool (*progress)(void *state, bool sleeping);
    /* unlend (optional): `w` is ending and its end may be visible at once:
     * from now on no peer may use its buffers. A backend that lends a
     * work's memory to peers (the shm transport's single copy reads it
     * straight out of this process) withdraws those loans here. Runs once
     * the work is claimed (the loop enters its BUSY bracket no more), on
     * the claiming thread: must not block or take a lock. Never during or
     * after destroy: the core stops calling it before destroy and waits
     * for the calls in progress, so a work published after that gets no
     * unlend; abort, which always comes before destroy, must withdraw
     * every loan still open. (any thread) */
    void (*unlend)(void *state, collie_work *w);
    /* recv_withdraw (optional; backends with receives): the core is about
     * to end receive `w` (COLLIE_COLL_RECV, started here) before its
     * message came (collie_work_cancel, or its own deadline). If no message
     * is matched to it yet — not a byte of one is or will be taken for it —
     * take it out of matching (a later message goes to a later receive, or
     * waits unexpected) and return true: the core ends it with no fault on
     * the comm. Return false if a message is matched to it (or it ended):
     * the core ends it as a local fault, as any other work. Without the
     * hook every such end is a fault. (loop) */
    bool (*recv_withdraw)(void *state, collie_work *w);
    /* shrink (optional): init for a comm made by collie_comm_shrink whose
     * old comm runs this same backend and still has its state (its init
     * had succeeded; the shrink aborted it, so its abort has run, but it is
     * not destroyed): build the new comm from the old one's (`old`) instead
     * of a fresh init — NCCL: ncclCommShrink. `excluded`: the old comm's
     * ranks left out, sorted, `nexcluded` of them (the set the survivors
     * agreed on: the same on every member); this rank's new rank and size
     * are core->rank and core->nranks, as for init. Same contract as init
     * (report with init_done). COLLIE_ENOTSUP, returned with *state left
     * alone, means "not from this one": the core runs init instead (a
     * fresh init), as it does without the hook. Every member of the new
     * comm gets the same call, so a reason to decline must be one every
     * member sees alike; a backend whose choice can differ between ranks
     * agrees on it itself, after the call (NCCL does, through the store).
     * `old` may be destroyed as soon as the call returns (the old comm's
     * owner destroys it): a backend that needs it later holds its own
     * reference. Grow and join always run init. (loop) */
    int (*shrink)(collie_bcomm *bc, const collie_core_services *core, void *old,
                  const int *excluded, int nexcluded, void **state);
} collie_backend_ops;

/* collie_backend_register: make a backend available to collie_comm_create
 * in this process. Errors: EINVAL (NULL, missing hooks, bad name/device),
 * ENOTSUP (ABI version mismatch, naming both versions), EEXIST (a backend
 * of that name exists). */
COLLIE_API int collie_backend_register(const collie_backend_ops *ops);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_BACKEND_H */
