/*
 * collie_backend_abi2.h — FROZEN: collie_backend.h as it was at backend
 * ABI 2, kept only to build tests/plugins/abi2_plugin.c, a plugin built for
 * the old ABI, which the current core must refuse naming both versions.
 * Never edit it; never include it together with include/collie_backend.h.
 */
/*
 * collie_backend.h — the versioned interface between collie's core and a
 * transport backend (built in, registered in-process, or a plugin .so).
 *
 * A backend never links against core internals: everything it needs from
 * the core comes through the const services table handed to init(). The
 * core owns works, sequence numbers, deadlines, error policies and the
 * creation rendezvous; a backend moves bytes.
 *
 * Threads: init, start, poll, abort and destroy run on the engine's
 * progress thread unless the backend sets COLLIE_BACKEND_POST_ON_CALLER,
 * in which case start runs on the posting thread (NCCL: stream ordering
 * and CUDA graph capture need the caller's thread) and must be thread-safe.
 *
 * Plugins: a shared object found in COLLIE_PLUGIN_PATH as
 * libcollie_<name>.so exporting
 *     const collie_backend_ops *collie_backend_plugin_v1(void);
 */
#ifndef COLLIE_BACKEND_ABI2_H
#define COLLIE_BACKEND_ABI2_H

#include <stdarg.h>

#include "collie.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added collie_backend_ops.size; hooks appended since are
 * optional and found through it, so the version only changes when an
 * existing field does. */
#define COLLIE_BACKEND_ABI_VERSION   2
#define COLLIE_BACKEND_PLUGIN_SYMBOL "collie_backend_plugin_v1"

struct event_base;

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
    COLLIE_COLL_NUM_KINDS
} collie_coll_kind;

/* collie_coll_args: one validated operation. Counts follow collie.h. */
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
} collie_coll_args;

/* The core's handle for one backend instance of one communicator. */
typedef struct collie_bcomm collie_bcomm;

/* collie_core_services: what the core offers a backend. All function
 * pointers are always set. "loop" = the progress thread only. */
typedef struct collie_core_services {
    uint32_t abi_version;

    /* identity of the communicator */
    int (*rank)(const collie_bcomm *bc);
    int (*size)(const collie_bcomm *bc);
    const char *(*name)(const collie_bcomm *bc);
    uint64_t (*generation)(const collie_bcomm *bc);
    uint64_t (*comm_id)(const collie_bcomm *bc); /* hash of name + generation */

    /* the engine's event base (loop) */
    struct event_base *(*event_base)(collie_bcomm *bc);
    bool (*on_progress_thread)(const collie_bcomm *bc);

    /* works: the first finisher wins; after the core calls the backend's
     * start, the backend must finish the work or see it finished by the
     * core (deadline, cancel, abort), after which the core calls detach. */
    bool (*work_claim)(collie_work *w);
    void (*work_publish)(collie_work *w, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    bool (*work_finish)(collie_work *w, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* bracket access to the work's user buffers (loop) */
    bool (*work_busy_enter)(collie_work *w);
    void (*work_busy_exit)(collie_work *w);
    /* the backend's per-work state slot */
    void *(*work_backend_data)(collie_work *w);

    /* faults: the backend saw the comm break (peer died, protocol error,
     * async backend error). The core fails the work (if given) with
     * `status`, applies the comm's error policy, and calls abort. (loop) */
    void (*fault)(collie_bcomm *bc, collie_work *w, int status, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

    /* init completion: the backend calls this once, with COLLIE_OK when it
     * is ready for start(), or an error. (loop) */
    void (*init_done)(collie_bcomm *bc, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

    /* the comm's store namespace ("collie/<name>/<gen>/" + key), async, with
     * a callback on the loop. The returned work belongs to the backend. */
    int (*store_set)(collie_bcomm *bc, const char *key, const void *val, size_t len,
                     collie_work_cb cb, void *arg, collie_work **out);
    int (*store_get)(collie_bcomm *bc, const char *key, int32_t timeout_ms, collie_work_cb cb,
                     void *arg, collie_work **out);
    int (*store_value)(const collie_work *w, const void **val, size_t *len);

    /* authentication: HMAC-SHA256 of `msg` under the store's shared secret
     * (all zero bytes when there is none), for connection handshakes. */
    void (*auth_mac)(const collie_bcomm *bc, const void *msg, size_t len, unsigned char out[32]);
    bool (*auth_enabled)(const collie_bcomm *bc);

    /* logging: level 0 error .. 3 debug */
    void (*log)(int level, const char *module, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

    /* polling: while on, the engine calls ops->poll every interval_us (any
     * thread; from another thread it takes effect on the next loop turn) */
    void (*want_poll)(collie_bcomm *bc, bool on, int32_t interval_us);

    /* settings (COLLIE_SOCKET_IFNAME etc.): the raw value or NULL */
    const char *(*setting)(const char *name);

    /* (appended: the ABI version changes only when existing fields do) */
    /* the comm's `device` option (-1: none given) */
    int (*device)(const collie_bcomm *bc);
    /* the comm's creation bound, for init steps of the backend's own */
    int32_t (*create_timeout_ms)(const collie_bcomm *bc);
    /* set the detail collie_last_error() reports to the caller of a post
     * whose start failed (caller's thread, POST_ON_CALLER backends) */
    void (*set_error)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
} collie_core_services;

enum { COLLIE_BACKEND_POST_ON_CALLER = 1 };

/* collie_backend_ops: a backend. `const`, designated initialisers, with
 *     .abi_version = COLLIE_BACKEND_ABI_VERSION,
 *     .size = sizeof(collie_backend_ops),
 * The core keeps its own copy, zero-filled past `size`: optional hooks a
 * backend built against an older header does not know are NULL, and fields
 * of a newer one are ignored. */
typedef struct collie_backend_ops {
    uint32_t abi_version;  /* COLLIE_BACKEND_ABI_VERSION */
    uint32_t size;         /* sizeof(collie_backend_ops) as the backend saw it */
    const char *name;      /* "tcp", "nccl" (matched case-insensitively) */
    const char *device;    /* "cpu" or "cuda" */
    uint32_t flags;        /* COLLIE_BACKEND_POST_ON_CALLER */
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
    /* adopt (optional): the core has claimed w (its deadline passed) and
     * hands it over instead of publishing: the backend publishes it with
     * work_publish(w, status, "%s", msg) once the device no longer touches
     * its buffers (after the abort that follows). Loop thread. */
    void (*adopt)(void *state, collie_work *w, int status, const char *msg);
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
} collie_backend_ops;

/* collie_backend_register: make a backend available to collie_comm_create
 * in this process. Errors: EINVAL (NULL, missing hooks, bad name/device),
 * ENOTSUP (ABI version mismatch, naming both versions), EEXIST (a backend
 * of that name exists). */
COLLIE_API int collie_backend_register(const collie_backend_ops *ops);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_BACKEND_ABI2_H */
