/*
 * kv.h — the store's key table: byte-string keys and values, limits, and
 * per-key waiter lists.
 *
 * Pure data structure (no sockets, no locks): the server owns one and uses
 * it from its engine's loop thread only; unit tests use it directly.
 *
 * Waiters: a request that waits (get, wait, multi_get, barrier) registers a
 * cl_store_waiter on its keys with cl_store_kv_watch. Every mutation
 * re-evaluates only the waiters linked to the keys it touched; a waiter
 * whose keys are all satisfied goes on the ready list. After each operation
 * the owner pops ready waiters (cl_store_kv_pop_ready), answers them (their
 * values are still readable through cl_store_kv_waiter_value) and then
 * releases them with cl_store_kv_unwatch.
 */
#ifndef CL_STORE_KV_H
#define CL_STORE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/list.h"
#include "store/proto.h" /* cl_store_bytes */

typedef struct cl_store_kv cl_store_kv;
struct cl_store_kv_entry;
struct cl_store_waiter;

typedef struct cl_store_kv_limits {
    uint32_t max_key_size;   /* bytes */
    uint32_t max_value_size; /* bytes, also the limit for append results */
    uint32_t max_keys;       /* keys present at once */
} cl_store_kv_limits;

enum cl_store_wait_kind {
    CL_STORE_WAIT_EXISTS = 0,   /* every key exists */
    CL_STORE_WAIT_AT_LEAST = 1, /* the (single) key holds an integer >= target (barrier) */
};

/* One key of a waiter, linked into that key's entry (kv-private). */
typedef struct cl_store_wlink {
    cl_list_node node; /* its entry's waiters */
    struct cl_store_kv_entry *entry;
    struct cl_store_waiter *w;
    bool satisfied;
} cl_store_wlink;

/* A waiting request. Embed it in the owner's struct; all fields are
 * kv-private. It is registered between cl_store_kv_watch and
 * cl_store_kv_unwatch. */
typedef struct cl_store_waiter {
    cl_store_wlink *links;
    uint32_t nlinks, missing;
    int kind;
    int64_t target;
    bool registered;
    cl_list_node rnode; /* the table's ready list while every key is there */
} cl_store_waiter;

/* cl_store_kv_create: a new empty table; `seed` keys the hash (16 bytes,
 * random in a server). Returns NULL when out of memory. */
cl_store_kv *cl_store_kv_create(const cl_store_kv_limits *lim, const uint8_t seed[16]);

/* cl_store_kv_destroy: free every key. Waiters still registered are
 * released (as by unwatch; the structs themselves are their owners').
 * NULL is a no-op. */
void cl_store_kv_destroy(cl_store_kv *kv);

/* cl_store_kv_error: a sentence describing the last failure of a call on
 * this table ("key of 5000 bytes exceeds max_key_size 4096"). */
const char *cl_store_kv_error(const cl_store_kv *kv);

/* Mutations. Each returns COLLIE_OK or an error with the table unchanged:
 * COLLIE_ELIMIT (a size or count limit), COLLIE_EINVAL (add on a value that
 * is not a decimal integer, or overflow), COLLIE_ENOMEM. */
int cl_store_kv_set(cl_store_kv *kv, const void *key, size_t klen, const void *val, size_t vlen);
int cl_store_kv_append(cl_store_kv *kv, const void *key, size_t klen, const void *val, size_t vlen);
/* add: the value is decimal text; a missing key counts as 0. */
int cl_store_kv_add(cl_store_kv *kv, const void *key, size_t klen, int64_t delta, int64_t *out);
/* compare_set: if (key exists and its value == expected) or (key is missing
 * and elen == 0), store desired. cur and curlen: the value stored afterwards
 * (empty if the key is still missing), valid until the next mutation. */
int cl_store_kv_compare_set(cl_store_kv *kv, const void *key, size_t klen, const void *exp,
                            size_t elen, const void *des, size_t dlen, const uint8_t **cur,
                            size_t *curlen);
/* multi_set: all or nothing. */
int cl_store_kv_multi_set(cl_store_kv *kv, size_t n, const cl_store_bytes *keys,
                          const cl_store_bytes *vals);
/* delete: *existed tells whether the key was present. */
int cl_store_kv_delete(cl_store_kv *kv, const void *key, size_t klen, bool *existed);
/* delete_prefix: every key that starts with the prefix (an empty prefix is
 * every key); returns how many were deleted. O(keys in the table). */
size_t cl_store_kv_delete_prefix(cl_store_kv *kv, const void *prefix, size_t plen);

/* Reads. */
bool cl_store_kv_get(const cl_store_kv *kv, const void *key, size_t klen, const uint8_t **val,
                     size_t *vlen);
size_t cl_store_kv_num_keys(const cl_store_kv *kv);

/* cl_store_kv_check_key: COLLIE_OK or COLLIE_ELIMIT (too long; see error). */
int cl_store_kv_check_key(cl_store_kv *kv, size_t klen);

/* cl_store_kv_watch: register w on n keys (duplicates allowed). For
 * CL_STORE_WAIT_AT_LEAST n must be 1. A waiter already satisfied goes on
 * the ready list at once. Returns COLLIE_OK, COLLIE_ELIMIT (key too long) or
 * COLLIE_ENOMEM (w not registered). */
int cl_store_kv_watch(cl_store_kv *kv, cl_store_waiter *w, size_t n, const cl_store_bytes *keys,
                      int kind, int64_t target);

/* cl_store_kv_unwatch: unlink a registered waiter (ready or not). */
void cl_store_kv_unwatch(cl_store_kv *kv, cl_store_waiter *w);

/* cl_store_kv_pop_ready: the oldest ready waiter, taken off the ready list
 * but still registered; NULL if none. */
cl_store_waiter *cl_store_kv_pop_ready(cl_store_kv *kv);

/* cl_store_kv_waiter_value: the current value of a waiter's i-th key. */
bool cl_store_kv_waiter_value(const cl_store_waiter *w, size_t i, const uint8_t **val,
                              size_t *vlen);

#endif
