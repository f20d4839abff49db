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
 * names what the loop was doing ("store server: read", "user callback").
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

/* collie_engine_destroy: stop the engine. Every work still pending fails
 * with COLLIE_ECLOSED (callbacks run), every object living on the engine
 * (store servers, store clients) is closed, then the threads are joined.
 * Objects must still be destroyed by their owners afterwards (their destroy
 * calls then only free memory). Must not be called on the progress thread
 * (returns COLLIE_ESTATE). NULL is a no-op. */
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
/* Key/value store                                                           */
/* ------------------------------------------------------------------------ */

typedef struct collie_store_server_opts {
    size_t size;              /* sizeof(collie_store_server_opts) */
    const char *token;        /* shared secret; NULL: COLLIE_STORE_TOKEN or none */
    uint32_t max_key_size;    /* 0: 4096 bytes */
    uint32_t max_value_size;  /* 0: 64 MiB */
    uint32_t max_keys;        /* 0: 1,000,000 */
    uint32_t max_connections; /* 0: 16384 */
    int insecure; /* 1: serve beyond loopback without a token (anyone who reaches it can read
                     and write); 0: refused, unless COLLIE_INSECURE=1 */
} collie_store_server_opts;

#define COLLIE_STORE_SERVER_OPTS_INIT                                                              \
    { sizeof(collie_store_server_opts), NULL, 0, 0, 0, 0, 0 }

/* collie_store_server_create: serve a key/value store from engine e,
 * listening on bind_addr ("127.0.0.1", "0.0.0.0", "::1"; NULL: 127.0.0.1)
 * and port (0: pick a free one). `o` may be NULL. A server without a token
 * (o->token, else COLLIE_STORE_TOKEN) is refused an address beyond
 * loopback unless o->insecure or COLLIE_INSECURE=1 (docs/security.md).
 * Errors: EINVAL (bad address; no token beyond loopback), ESYSTEM
 * (bind/listen failed; the message is logged), ENOMEM, ECLOSED (engine
 * closing). */
COLLIE_API int collie_store_server_create(collie_engine *e, const char *bind_addr, uint16_t port,
                                          const collie_store_server_opts *o,
                                          collie_store_server **out);

/* collie_store_server_port: the port the server listens on. */
COLLIE_API uint16_t collie_store_server_port(const collie_store_server *s);

/* collie_store_server_num_connections: connections currently open. */
COLLIE_API size_t collie_store_server_num_connections(const collie_store_server *s);

/* collie_store_server_destroy: stop listening, close every connection (their
 * pending requests fail with COLLIE_EPEER on the clients) and free the
 * server. Not on the progress thread of its engine. NULL is a no-op. */
COLLIE_API void collie_store_server_destroy(collie_store_server *s);

typedef struct collie_store_opts {
    size_t size;            /* sizeof(collie_store_opts) */
    const char *token;      /* shared secret; NULL: COLLIE_STORE_TOKEN or none */
    int32_t timeout_ms;     /* default op timeout; 0: COLLIE_TIMEOUT_MS or 60 s */
    int32_t max_backoff_ms; /* reconnect backoff cap; 0: 1000 */
} collie_store_opts;

#define COLLIE_STORE_OPTS_INIT                                                                     \
    { sizeof(collie_store_opts), NULL, 0, 0 }

/* collie_store_connect: a client of the store server at addr ("host:port",
 * "[::1]:port"; NULL: COLLIE_STORE_ADDR). Returns at once: the connection
 * is made (and remade, with exponential backoff and jitter) by the engine
 * when requests need it. Errors: EINVAL (bad address), ENOMEM, ECLOSED. */
COLLIE_API int collie_store_connect(collie_engine *e, const char *addr, const collie_store_opts *o,
                                    collie_store **out);

/* collie_store_prefix: a view of `s` in which every key is prefixed by
 * `prefix`; views compose (a view of a view concatenates). The view shares
 * the connection and must be destroyed like any store handle. */
COLLIE_API int collie_store_prefix(collie_store *s, const char *prefix, collie_store **out);

/* collie_store_destroy: destroy a handle. The connection closes with the
 * last handle; requests still pending then fail with COLLIE_ECLOSED. Not
 * on the progress thread. NULL is a no-op. */
COLLIE_API void collie_store_destroy(collie_store *s);

/* collie_store_address: "host:port" of the server this handle talks to. */
COLLIE_API const char *collie_store_address(const collie_store *s);

/* Asynchronous store requests. Each returns COLLIE_OK and a new work (the
 * caller owns one reference), or an error and no work. Keys are byte
 * strings given as C strings (the view's prefix is prepended); values are
 * arbitrary bytes. Results are read from the finished work with the
 * collie_store_work_* accessors. */

/* set key = value. */
COLLIE_API int collie_store_post_set(collie_store *s, const char *key, const void *val, size_t len,
                                     const collie_post_opts *o, collie_work **out);
/* get: waits (server side) until key exists, bounded by the deadline.
 * Result: collie_store_work_value. */
COLLIE_API int collie_store_post_get(collie_store *s, const char *key, const collie_post_opts *o,
                                     collie_work **out);
/* add: key += delta (a missing key counts as 0; the value is stored as
 * decimal text). Result: collie_store_work_int (the new value). */
COLLIE_API int collie_store_post_add(collie_store *s, const char *key, int64_t delta,
                                     const collie_post_opts *o, collie_work **out);
/* compare_set: if key's value equals `expected` (or the key is missing and
 * expected_len is 0) set it to `desired`. Result: collie_store_work_value
 * (the value stored afterwards; empty if the key is still missing). */
COLLIE_API int collie_store_post_compare_set(collie_store *s, const char *key, const void *expected,
                                             size_t expected_len, const void *desired,
                                             size_t desired_len, const collie_post_opts *o,
                                             collie_work **out);
/* check: do all keys exist (no waiting)? Result: collie_store_work_int 1/0. */
COLLIE_API int collie_store_post_check(collie_store *s, const char *const *keys, size_t n,
                                       const collie_post_opts *o, collie_work **out);
/* wait: until all keys exist, bounded by the deadline. */
COLLIE_API int collie_store_post_wait(collie_store *s, const char *const *keys, size_t n,
                                      const collie_post_opts *o, collie_work **out);
/* delete: Result: collie_store_work_int 1 if it existed, else 0. */
COLLIE_API int collie_store_post_delete(collie_store *s, const char *key, const collie_post_opts *o,
                                        collie_work **out);
/* delete_prefix: every key that starts with `prefix` (after the handle's
 * own prefix; "" is every key of the handle). Result: collie_store_work_int
 * = keys deleted. The server scans its whole table: meant for cleanup, not
 * for every operation. */
COLLIE_API int collie_store_post_delete_prefix(collie_store *s, const char *prefix,
                                               const collie_post_opts *o, collie_work **out);
/* num_keys: keys in the whole store. Result: collie_store_work_int. */
COLLIE_API int collie_store_post_num_keys(collie_store *s, const collie_post_opts *o,
                                          collie_work **out);
/* multi_get: waits until all keys exist. Result: collie_store_work_value_at. */
COLLIE_API int collie_store_post_multi_get(collie_store *s, const char *const *keys, size_t n,
                                           const collie_post_opts *o, collie_work **out);
/* multi_set: set n keys at once (atomically on the server). */
COLLIE_API int collie_store_post_multi_set(collie_store *s, const char *const *keys,
                                           const void *const *vals, const size_t *lens, size_t n,
                                           const collie_post_opts *o, collie_work **out);
/* append: key = key + value (creates it if missing). */
COLLIE_API int collie_store_post_append(collie_store *s, const char *key, const void *val,
                                        size_t len, const collie_post_opts *o, collie_work **out);
/* barrier: completes when n clients have entered the barrier on `key`.
 * Reusable: round k completes when the counter reaches k*n, so every round
 * needs all n participants. One request per client. The counter is `key`'s
 * value (decimal, as with add); a participant that gives up (deadline,
 * cancel) has still been counted. */
COLLIE_API int collie_store_post_barrier(collie_store *s, const char *key, uint32_t n,
                                         const collie_post_opts *o, collie_work **out);

/* collie_store_work_value: the value a finished get/compare_set returned.
 * The bytes belong to the work (valid while the caller holds it) and are
 * followed by a NUL byte so text values can be used as C strings.
 * Errors: EINVAL (not such a work), the work's status if it failed,
 * INPROGRESS if not done. */
COLLIE_API int collie_store_work_value(const collie_work *w, const void **val, size_t *len);
/* collie_store_work_value_at: the i-th value of a finished multi_get. */
COLLIE_API int collie_store_work_value_at(const collie_work *w, size_t i, const void **val,
                                          size_t *len);
/* collie_store_work_int: the integer result of add/check/delete/num_keys. */
COLLIE_API int collie_store_work_int(const collie_work *w, int64_t *out);

/* Synchronous wrappers: post, wait (bounded by timeout_ms, with
 * COLLIE_TIMEOUT_DEFAULT = the store's default) and return the status.
 * Not on the progress thread. */
COLLIE_API int collie_store_set(collie_store *s, const char *key, const void *val, size_t len,
                                int32_t timeout_ms);
/* *val is malloc'd (NUL-terminated, free() it); NULL on error. */
COLLIE_API int collie_store_get(collie_store *s, const char *key, int32_t timeout_ms, void **val,
                                size_t *len);
COLLIE_API int collie_store_add(collie_store *s, const char *key, int64_t delta, int32_t timeout_ms,
                                int64_t *out);
/* *cur is malloc'd: the value stored afterwards. */
COLLIE_API int collie_store_compare_set(collie_store *s, const char *key, const void *expected,
                                        size_t expected_len, const void *desired,
                                        size_t desired_len, int32_t timeout_ms, void **cur,
                                        size_t *cur_len);
COLLIE_API int collie_store_check(collie_store *s, const char *const *keys, size_t n,
                                  int32_t timeout_ms, bool *all_exist);
COLLIE_API int collie_store_wait(collie_store *s, const char *const *keys, size_t n,
                                 int32_t timeout_ms);
COLLIE_API int collie_store_delete(collie_store *s, const char *key, int32_t timeout_ms,
                                   bool *existed);
COLLIE_API int collie_store_delete_prefix(collie_store *s, const char *prefix, int32_t timeout_ms,
                                          int64_t *deleted);
COLLIE_API int collie_store_num_keys(collie_store *s, int32_t timeout_ms, int64_t *out);
/* vals[i] are malloc'd (free() each); all NULL on error. */
COLLIE_API int collie_store_multi_get(collie_store *s, const char *const *keys, size_t n,
                                      int32_t timeout_ms, void **vals, size_t *lens);
COLLIE_API int collie_store_multi_set(collie_store *s, const char *const *keys,
                                      const void *const *vals, const size_t *lens, size_t n,
                                      int32_t timeout_ms);
COLLIE_API int collie_store_append(collie_store *s, const char *key, const void *val, size_t len,
                                   int32_t timeout_ms);
COLLIE_API int collie_store_barrier(collie_store *s, const char *key, uint32_t n,
                                    int32_t timeout_ms);

/* ------------------------------------------------------------------------ */
/* Communicators                                                             */
/* ------------------------------------------------------------------------ */

typedef struct collie_comm collie_comm;

/* collie_error_policy: what a fault (deadline, dead peer, backend error)
 * does to the communicator. See the README, "When things go wrong". */
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
} collie_comm_opts;

#define COLLIE_COMM_OPTS_INIT                                                                      \
    { sizeof(collie_comm_opts), NULL, NULL, 0, 0, COLLIE_POLICY_DEFAULT, NULL, NULL, -1 }

/* COLLIE_UNDEFINED: the colour of a rank that joins no group in
 * collie_comm_split. */
#define COLLIE_UNDEFINED (-1)

/* collie_comm_create: create a communicator of `size` ranks; every rank
 * calls it once per incarnation with the same name. Collective over the
 * store and bounded by create_timeout_ms. The store handle must outlive the
 * comm. Errors: EINVAL (bad rank/size/options/backend spec, with
 * collie_last_error saying which), ETIMEDOUT (not every rank arrived:
 * the message says how many did), EPEER (store lost), ENOMEM, ECLOSED. */
COLLIE_API int collie_comm_create(collie_engine *e, collie_store *store, int rank, int size,
                                  const collie_comm_opts *o, collie_comm **out);

/* collie_comm_create_post: the non-blocking form. Returns the comm at once
 * and a work that completes when the rendezvous is done; collectives posted
 * before then queue behind it (and fail with the creation's error). */
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
 * bounded by the parent's creation timeout. */
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
 * rest; frees everything and releases its name.
 * Idempotent with respect to an earlier abort. Not on the progress thread.
 * NULL is a no-op. Returns COLLIE_OK, or COLLIE_EABORTED if works had to be
 * aborted. */
COLLIE_API int collie_comm_destroy(collie_comm *c);

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
 * `tools/collie-trace` reads the dumps of all ranks. */
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
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

/* Counters for monitoring, cheap enough to read every second from any
 * thread (a snapshot of relaxed atomic counters: fields are each exact but
 * not read at one instant). Set `size` first (the *_STATS_INIT macros):
 * the library fills what both it and the caller know and sets `size` to
 * that. Fields may be added at the end. */

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
} collie_comm_stats;

/* (C; in C++: `collie_comm_stats st{}; st.size = sizeof st;`) */
#define COLLIE_COMM_STATS_INIT                                                                     \
    { .size = sizeof(collie_comm_stats) }

/* collie_comm_get_stats: fill *st (st->size set by the caller). Errors:
 * EINVAL (NULL, or size smaller than the first fields'). */
COLLIE_API int collie_comm_get_stats(const collie_comm *c, collie_comm_stats *st);

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
/* collie_log_route_libevent: pass libevent's own warnings and errors on as
 * collie log lines (module "libevent"). Off by default: libevent's log
 * callback is process-wide and this replaces any the program set. */
COLLIE_API void collie_log_route_libevent(bool on);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_H */
