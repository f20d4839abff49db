/*
 * collie_store.h — the key/value store of the public API: a server
 * (collie_store_server, usually run by collie-run or collie-store) and the
 * client handle (collie_store) that communicators rendezvous through and
 * applications may use for their own keys.
 *
 * Part of collie.h, which includes it: `#include <collie.h>` is enough; the
 * conventions at the top of collie.h (statuses, outputs, option structs,
 * threads, durations) hold here too.
 */
#ifndef COLLIE_STORE_H
#define COLLIE_STORE_H

#include "collie.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * closing), ETIMEDOUT (its progress loop did not respond within 10 s). */
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
 * when requests need it. Errors: EINVAL (bad address), ENOMEM, ECLOSED,
 * ETIMEDOUT (the engine's progress loop did not respond within 10 s). */
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
/* collie_store_work_int: the integer result of
 * add/check/delete/delete_prefix/num_keys. */
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

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_STORE_H */
