/*
 * collie.h — non-blocking collective communication with a watchdog.
 *
 * Everything asynchronous in collie is a work handle (collie_work): a future
 * that completes exactly once, with a status and, on error, a message. Works
 * are driven by one progress thread per engine (collie_engine). Every work has
 * a deadline; nothing in collie waits without a bound.
 *
 * Conventions (docs/design.md explains the internals):
 *  - Calls that can fail return an int status: COLLIE_OK (0), or a negative
 *    COLLIE_E* code. Outputs go last and are set to NULL/0 on failure. A call
 *    that fails has no side effects and never runs its callback.
 *  - All functions are thread-safe unless their comment says otherwise.
 *  - Durations are int32_t milliseconds; deadlines use the monotonic clock.
 *  - Option structs start with a `size` field (set it with the *_INIT macros)
 *    so they can grow without breaking old callers.
 */
#ifndef COLLIE_H
#define COLLIE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define COLLIE_API __attribute__((visibility("default")))
#else
#define COLLIE_API
#endif

/* The version of these headers. The shared library's soname carries the
 * major number (libcollie.so.0): a release that breaks the ABI bumps it, a
 * minor release only adds, a patch release only fixes. A program can
 * compare the headers it was built with (COLLIE_VERSION) with the library
 * it runs with (collie_version()). */
#define COLLIE_VERSION_MAJOR                     0
#define COLLIE_VERSION_MINOR                     1
#define COLLIE_VERSION_PATCH                     0
#define COLLIE_VERSION_CODE(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define COLLIE_VERSION                                                                             \
    COLLIE_VERSION_CODE(COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR, COLLIE_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* COLLIE_STATUS_MAP: the one table of status codes (name, value, text);
 * the enum below, collie_strerror and collie_status_name are generated
 * from it (libuv's UV_ERRNO_MAP). 0 is success, 1 means "not finished
 * yet", every error is negative. */
#define COLLIE_STATUS_MAP(X)                                                                       \
    X(OK, 0, "success")                                                                            \
    /* not finished yet (work pending, wait gave up) */                                            \
    X(INPROGRESS, 1, "operation in progress")                                                      \
    /* invalid argument or configuration value */                                                  \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    /* the operation's deadline passed */                                                          \
    X(ETIMEDOUT, -3, "operation timed out")                                                        \
    /* cancelled by the application */                                                             \
    X(ECANCELED, -4, "operation cancelled")                                                        \
    /* taken down by an abort (the message names the root cause) */                                \
    X(EABORTED, -5, "operation aborted")                                                           \
    /* a peer (or the store server) died or closed the connection */                               \
    X(EPEER, -6, "peer died or closed the connection")                                             \
    /* the object (engine, store, comm) is closed */                                               \
    X(ECLOSED, -7, "object closed")                                                                \
    /* this rank is not a member of the group */                                                   \
    X(ENOTMEMBER, -8, "not a member of the group")                                                 \
    /* the backend (NCCL/CUDA) reported an error */                                                \
    X(EBACKEND, -9, "backend error")                                                               \
    /* protocol violation or mismatch between ranks */                                             \
    X(EPROTO, -10, "protocol error or mismatch between ranks")                                     \
    X(EAUTH, -11, "authentication failed")                                                         \
    X(ENOTSUP, -12, "not supported")                                                               \
    /* the call is not valid in the object's current state */                                      \
    X(ESTATE, -13, "invalid state for this call")                                                  \
    /* an operating-system call failed (the message says which) */                                 \
    X(ESYSTEM, -14, "system call failed")                                                          \
    /* a configured limit was exceeded (size, count) */                                            \
    X(ELIMIT, -15, "limit exceeded")                                                               \
    /* the name is already in use */                                                               \
    X(EEXIST, -16, "already exists")                                                               \
    X(ENOENT, -17, "no such object")

/* collie_status: the one status enum (COLLIE_OK, COLLIE_INPROGRESS,
 * COLLIE_EINVAL, ...), from COLLIE_STATUS_MAP. */
typedef enum collie_status {
#define COLLIE_STATUS_ENUM_(name, value, text) COLLIE_##name = value,
    COLLIE_STATUS_MAP(COLLIE_STATUS_ENUM_)
#undef COLLIE_STATUS_ENUM_
} collie_status;

/* collie_version: the running library's COLLIE_VERSION (e.g. 100 for
 * 0.1.0), which may differ from the headers' when the library was upgraded
 * under the program. collie_version_string: "0.1.0". */
COLLIE_API int collie_version(void);
COLLIE_API const char *collie_version_string(void);

/* collie_strerror: a short constant description of a status code
 * ("operation timed out"). Never NULL; unknown codes give "unknown status". */
COLLIE_API const char *collie_strerror(int status);

/* collie_status_name: the code's name ("COLLIE_ETIMEDOUT"). Never NULL. */
COLLIE_API const char *collie_status_name(int status);

/* ------------------------------------------------------------------------ */
/* Timeouts                                                                  */
/* ------------------------------------------------------------------------ */

/* For posts: COLLIE_TIMEOUT_DEFAULT takes the owner's default op timeout
 * (the store's or communicator's; COLLIE_TIMEOUT_MS, else 60 s).
 * COLLIE_TIMEOUT_INFINITE means no deadline. For waits, 0 means poll. */
#define COLLIE_TIMEOUT_DEFAULT  0
#define COLLIE_TIMEOUT_INFINITE (-1)

/* ------------------------------------------------------------------------ */
/* Data types and reductions                                                 */
/* ------------------------------------------------------------------------ */

/* collie_dtype: element types of collective buffers. */
typedef enum collie_dtype {
    COLLIE_INT8 = 0,
    COLLIE_UINT8 = 1,
    COLLIE_INT32 = 2,
    COLLIE_INT64 = 3,
    COLLIE_FP16 = 4, /* IEEE 754 binary16 */
    COLLIE_BF16 = 5, /* bfloat16 */
    COLLIE_FP32 = 6,
    COLLIE_FP64 = 7,
    COLLIE_NUM_DTYPES
} collie_dtype;

/* collie_redop: reductions. Integer arithmetic wraps (computed unsigned);
 * integer AVG truncates toward zero; fp16/bf16 are computed in float. */
typedef enum collie_redop {
    COLLIE_SUM = 0,
    COLLIE_PROD = 1,
    COLLIE_MIN = 2,
    COLLIE_MAX = 3,
    COLLIE_AVG = 4,
    COLLIE_NUM_REDOPS
} collie_redop;

/* collie_dtype_size: bytes per element (0 for an invalid dtype). */
COLLIE_API size_t collie_dtype_size(collie_dtype dt);

/* collie_dtype_name / collie_redop_name: "fp32", "sum" ("?" if invalid). */
COLLIE_API const char *collie_dtype_name(collie_dtype dt);
COLLIE_API const char *collie_redop_name(collie_redop op);

/* ------------------------------------------------------------------------ */
/* Objects                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct collie_engine collie_engine;
typedef struct collie_work collie_work;
typedef struct collie_cq collie_cq;
typedef struct collie_store collie_store;
typedef struct collie_store_server collie_store_server;

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */
/* ------------------------------------------------------------------------ */

/* collie_stall_cb: called on the engine's monitor thread (not the progress
 * thread) when the progress loop has not turned for `stalled_ms`; `activity`
 * names what the loop was doing ("store server: read", "user completion
 * callback").
 * Called once per stall. Must not block. */
typedef void (*collie_stall_cb)(collie_engine *e, int64_t stalled_ms, const char *activity,
                                void *arg);

typedef struct collie_engine_opts {
    size_t size;      /* sizeof(collie_engine_opts) */
    const char *name; /* for logs and the thread name; NULL: "collie" */
    int32_t stall_ms; /* stall threshold; 0: COLLIE_STALL_MS, else 10000 */
    collie_stall_cb on_stall;
    void *on_stall_arg;
} collie_engine_opts;

#define COLLIE_ENGINE_OPTS_INIT                                                                    \
    { sizeof(collie_engine_opts), NULL, 0, NULL, NULL }

/* collie_engine_create: start an engine: a progress thread running the
 * event loop and a monitor thread watching it. `o` may be NULL.
 * Validates the COLLIE_* environment first: a bad value is COLLIE_EINVAL with
 * the reason logged. Errors: EINVAL, ENOMEM, ESYSTEM. */
COLLIE_API int collie_engine_create(const collie_engine_opts *o, collie_engine **out);

/* collie_engine_destroy: stop the engine. Every object living on the
 * engine (store servers, store clients, communicators: they fail with
 * COLLIE_ECLOSED) is closed, every work still pending fails with
 * COLLIE_ECLOSED (callbacks run), then the threads are joined. Objects
 * must still be destroyed by their owners afterwards (their destroy calls
 * then only free memory). Must not be called on the progress thread
 * (returns COLLIE_ESTATE). Returns COLLIE_ETIMEDOUT if the progress thread
 * did not stop within 10 s (stuck in a callback; the engine is then
 * leaked). NULL is a no-op. */
COLLIE_API int collie_engine_destroy(collie_engine *e);

/* collie_engine_on_progress_thread: true when the caller runs on e's
 * progress thread (inside a callback). */
COLLIE_API bool collie_engine_on_progress_thread(const collie_engine *e);

/* ------------------------------------------------------------------------ */
/* Work handles                                                              */
/* ------------------------------------------------------------------------ */

/* collie_work_cb: completion callback, run exactly once on the progress
 * thread after the work completes (whatever its status). It must not block;
 * it may post new works, cancel, and release `w` (the engine holds its own
 * reference until the callback returns). */
typedef void (*collie_work_cb)(collie_work *w, void *arg);

/* collie_post_opts: options for every post call. NULL means all defaults. */
typedef struct collie_post_opts {
    size_t size;        /* sizeof(collie_post_opts) */
    int32_t timeout_ms; /* > 0, COLLIE_TIMEOUT_DEFAULT or COLLIE_TIMEOUT_INFINITE */
    collie_work_cb cb;  /* completion callback, or NULL */
    void *cb_arg;
    collie_cq *cq; /* completion queue to receive the work, or NULL */
    uint64_t tag;  /* the application's value, see collie_work_tag */
} collie_post_opts;

#define COLLIE_POST_OPTS_INIT                                                                      \
    { sizeof(collie_post_opts), COLLIE_TIMEOUT_DEFAULT, NULL, NULL, NULL, 0 }

/* collie_work_details: what a work is and when things happened to it. Times
 * are CLOCK_MONOTONIC nanoseconds; 0 means "not yet". */
typedef struct collie_work_details {
    const char *op;     /* "store.get", "allreduce", ... (static string) */
    uint64_t seq;       /* sequence number within its owner */
    uint64_t bytes;     /* payload bytes */
    int status;         /* COLLIE_INPROGRESS until done */
    int32_t timeout_ms; /* effective timeout (COLLIE_TIMEOUT_INFINITE for none) */
    int64_t post_ns, start_ns, end_ns, deadline_ns;
} collie_work_details;

/* collie_work_test: true once the work is done (any status). Never blocks;
 * while the work is pending it may run one non-blocking step of the
 * engine's progress loop on this thread if the loop is between two turns
 * (caller-driven progress, as MPI_Test; never your callbacks). */
COLLIE_API bool collie_work_test(const collie_work *w);

/* collie_work_result: the work's status: COLLIE_INPROGRESS until done, then
 * COLLIE_OK or the error, which never changes afterwards. */
COLLIE_API int collie_work_result(const collie_work *w);

/* collie_work_wait: block the caller until the work is done or timeout_ms
 * elapses (0 polls, COLLIE_TIMEOUT_INFINITE waits for the work, which is
 * still bounded by the work's own deadline). Returns the work's status, or
 * COLLIE_INPROGRESS if the wait gave up first (the work goes on). If the
 * work's deadline passes while the progress thread is blocked, the waiter
 * completes the work with COLLIE_ETIMEDOUT itself (a CUDA work: hands it to
 * the loop, which publishes it once the GPU is quiesced; the wait then
 * returns COLLIE_INPROGRESS if that takes over 15 s). On the progress thread a
 * pending work returns COLLIE_ESTATE instead of deadlocking. */
COLLIE_API int collie_work_wait(collie_work *w, int32_t timeout_ms);

/* collie_work_wait_any: wait until one of the n works is done; *idx is set
 * to the first done one (in array order) and its status returned. NULL
 * entries are skipped. Returns COLLIE_INPROGRESS (and *idx = n) if none
 * finished in time, COLLIE_EINVAL for n == 0 or all-NULL. */
COLLIE_API int collie_work_wait_any(collie_work *const *ws, size_t n, int32_t timeout_ms,
                                    size_t *idx);

/* collie_work_cancel: complete the work with COLLIE_ECANCELED if it is not
 * done yet. Returns COLLIE_OK if this call cancelled it (the completion may
 * be published a moment later if the progress thread is mid-step on it),
 * COLLIE_ESTATE if it had already completed. Two cancels are requests to the
 * progress thread rather than verdicts, because only it can tell whether
 * the work may still end: a receive (it does the matching) and a CUDA work
 * (its device may be done with it) cancelled from another thread. Then
 * COLLIE_OK means the request was handed over, and the work still ends
 * COLLIE_OK if a message matched it, or its device finished, first — with
 * its bytes in place; its result says which, as always. For store requests cancel is
 * clean; for collectives it is a local fault (the comm's policy applies).
 * A CUDA collective cannot be stopped alone: cancel (like a waiter giving
 * up on it) aborts the comm and the work completes with COLLIE_ECANCELED
 * only once the abort has quiesced the GPU — cancel itself never blocks;
 * once the completion is visible the buffers are free. */
COLLIE_API int collie_work_cancel(collie_work *w);

/* collie_work_hold / collie_work_release: take / drop a reference. The
 * poster owns one reference to each work it gets; releasing never cancels.
 * release is legal inside the work's own callback. NULL is a no-op. */
COLLIE_API void collie_work_hold(collie_work *w);
COLLIE_API void collie_work_release(collie_work *w);

/* collie_work_error_message: a sentence naming the op, its sequence number
 * and the cause ("store.get seq 12 (key 'a'): deadline of 500 ms passed");
 * "" while pending or on success. Valid while the caller holds the work. */
COLLIE_API const char *collie_work_error_message(const collie_work *w);

/* collie_work_seq: the work's sequence number within its owner. */
COLLIE_API uint64_t collie_work_seq(const collie_work *w);

/* collie_work_tag: the tag given in collie_post_opts. */
COLLIE_API uint64_t collie_work_tag(const collie_work *w);

/* collie_work_info: fill *info. Errors: EINVAL for NULL arguments. */
COLLIE_API int collie_work_info(const collie_work *w, collie_work_details *info);

/* ------------------------------------------------------------------------ */
/* Completion queues                                                         */
/* ------------------------------------------------------------------------ */

/* collie_cq_create: a completion queue. Works are attached at post time
 * (collie_post_opts.cq); when an attached work completes, the queue takes a
 * reference to it and its fd becomes readable (level-triggered: readable
 * while the queue is not empty). Errors: ENOMEM, ESYSTEM. */
COLLIE_API int collie_cq_create(collie_cq **out);

/* collie_cq_fd: the file descriptor to watch for POLLIN (epoll, libevent,
 * asio). Never read it yourself; use collie_cq_pop. */
COLLIE_API int collie_cq_fd(const collie_cq *cq);

/* collie_cq_pop: hand the oldest completed work to the caller (who then
 * owns that reference and must release it). Waits up to timeout_ms (0:
 * poll). Returns COLLIE_OK with *out set, COLLIE_INPROGRESS (and *out NULL)
 * if the queue stayed empty, COLLIE_ECLOSED if the queue was destroyed. */
COLLIE_API int collie_cq_pop(collie_cq *cq, int32_t timeout_ms, collie_work **out);

/* collie_cq_size: number of completed works waiting in the queue. */
COLLIE_API size_t collie_cq_size(const collie_cq *cq);

/* collie_cq_destroy: release the queue and every work still in it. Works
 * attached but not completed yet are released when they complete. Must
 * not race with collie_cq_pop on the same queue. NULL is a no-op. */
COLLIE_API void collie_cq_destroy(collie_cq *cq);

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

/* Counters for monitoring, cheap enough to read every second from any
 * thread (a snapshot of relaxed atomic counters: fields are each exact but
 * not read at one instant). Set `size` first (the *_STATS_INIT macros):
 * the library fills what both it and the caller know and sets `size` to
 * that. Fields may be added at the end. A communicator's counters,
 * collie_comm_stats, are in collie_comm.h. */

typedef struct collie_engine_stats {
    size_t size;              /* sizeof(collie_engine_stats) */
    uint64_t works_posted;    /* every kind: collectives, store requests, comm creations */
    uint64_t works_completed; /* ended with COLLIE_OK (and retired) */
    uint64_t works_failed;    /* ended with an error (and retired) */
    uint64_t works_in_flight; /* posted and not retired */
    uint64_t stalls;          /* progress-loop stalls the monitor reported */
    uint32_t residents;       /* comms, store clients and servers living on the engine */
    /* steps of the progress loop run by a thread that waited for, tested or
     * posted a work while the loop was between two turns (caller-driven
     * progress: the progress thread stays the owner, the caller helps) */
    uint64_t helper_steps;
} collie_engine_stats;

#define COLLIE_ENGINE_STATS_INIT                                                                   \
    { .size = sizeof(collie_engine_stats) }

/* collie_engine_get_stats: fill *st (st->size set by the caller). Errors:
 * EINVAL. */
COLLIE_API int collie_engine_get_stats(const collie_engine *e, collie_engine_stats *st);

/* collie_last_error: the detailed message of the last failed call made by
 * this thread (for failures that produce no work: "store address 'x': no
 * port"). "" if none. Thread-local; valid until the thread's next call. */
COLLIE_API const char *collie_last_error(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum collie_log_level {
    COLLIE_LOG_ERROR = 0,
    COLLIE_LOG_WARN = 1,
    COLLIE_LOG_INFO = 2,
    COLLIE_LOG_DEBUG = 3,
} collie_log_level;

/* One log line. Fields may be added at the end (check `size`). */
typedef struct collie_log_record {
    size_t size; /* sizeof(collie_log_record) of the library */
    collie_log_level level;
    const char *module;  /* "comm", "tcp", "store", "engine", "nccl", ... */
    const char *comm;    /* the communicator's name, or NULL */
    int rank;            /* its rank in that communicator, or -1 */
    const char *message; /* one line, no newline */
    int64_t time_ns;     /* CLOCK_REALTIME */
} collie_log_record;

/* collie_log_fn: receives every line at or above the level. It runs on
 * whichever thread logged — the progress thread mostly, a caller's thread
 * for a failing call — possibly on several at once, and must not block
 * (it holds up the progress of every comm of that engine) nor call back
 * into collie. The record and its strings live only during the call. */
typedef void (*collie_log_fn)(const collie_log_record *r, void *ctx);

/* collie_set_log_handler: route collie's log lines to fn instead of stderr
 * (or COLLIE_LOG_FILE); NULL restores that. Process-wide. */
COLLIE_API void collie_set_log_handler(collie_log_fn fn, void *ctx);
/* collie_set_log_level: the least severe level passed on (overrides
 * COLLIE_LOG); collie_log_level_get: the level in force. */
COLLIE_API void collie_set_log_level(collie_log_level level);
COLLIE_API collie_log_level collie_log_level_get(void);
/* collie_log_queue: log lines kept for a reader on a thread of its own,
 * for a program that must not run its code on collie's threads (a language
 * runtime: Python's logging would need the GIL on the progress thread).
 * Install it with collie_set_log_handler(collie_log_queue_handler, q). */
typedef struct collie_log_queue collie_log_queue;
/* collie_log_queue_create: a queue holding up to `capacity` lines (1 to
 * 2^20); a line arriving while it is full is dropped and counted. Errors:
 * EINVAL, ENOMEM. */
COLLIE_API int collie_log_queue_create(size_t capacity, collie_log_queue **out);
/* collie_log_queue_handler: a collie_log_fn whose ctx is a queue: copies
 * the line in (module, comm and message truncated to 31, 127 and 1023
 * bytes) and never blocks beyond a short lock. Any thread. */
COLLIE_API void collie_log_queue_handler(const collie_log_record *r, void *queue);
/* collie_log_queue_pop: take the oldest line into *out (out->size set by
 * the caller), waiting up to timeout_ms (0: poll; COLLIE_TIMEOUT_INFINITE:
 * until one comes). Its strings stay valid until the next pop on this
 * queue: one reader at a time. Returns OK, INPROGRESS (none in time), or
 * EINVAL. */
COLLIE_API int collie_log_queue_pop(collie_log_queue *q, int32_t timeout_ms,
                                    collie_log_record *out);
/* collie_log_queue_dropped: lines dropped so far because the queue was
 * full. */
COLLIE_API uint64_t collie_log_queue_dropped(collie_log_queue *q);
/* collie_log_queue_destroy: free the queue. Detach it first
 * (collie_set_log_handler with another handler or NULL, which returns
 * once no call of the handler runs) and let no pop run. NULL is a no-op. */
COLLIE_API void collie_log_queue_destroy(collie_log_queue *q);
/* collie_log_route_libevent: pass libevent's own warnings and errors on as
 * collie log lines (module "libevent"). Off by default: libevent's log
 * callback is process-wide and this replaces any the program set. */
COLLIE_API void collie_log_route_libevent(bool on);

#ifdef __cplusplus
}
#endif

/* The rest of the API, one header per part (each includes this one). */
#include "collie_store.h" /* the key/value store: server and client */
#include "collie_comm.h"  /* communicators, collectives, a comm's statistics */

#endif /* COLLIE_H */
