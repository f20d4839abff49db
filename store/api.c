/*
 * api.c — the public store client API: handles and prefix views, argument
 * checking, the collie_store_post_* requests and the synchronous wrappers.
 *
 * Design notes
 *  - A handle (collie_store) is a prefix plus a reference to a shared core
 *    (one connection). Views made by collie_store_prefix share the core; the
 *    last handle destroyed closes it (client.c).
 *  - Every post validates all of its arguments before allocating anything,
 *    so a rejected call (COLLIE_EINVAL with collie_last_error explaining it)
 *    has no side effect; then it encodes the whole frame on the caller's
 *    thread (request.c) and hands it to the engine.
 *  - Sync wrappers post with the caller's timeout as the work's deadline and
 *    wait for the work (bounded by that deadline); on failure they copy the
 *    work's message into collie_last_error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "store/addr.h"
#include "store/auth.h"
#include "store/client.h"
#include "store/store.h"

struct collie_store {
    cl_store_core *core;
    char *prefix;
    size_t plen;
};

/* ---- handles ------------------------------------------------------------------------ */

int collie_store_connect(collie_engine *e, const char *addr, const collie_store_opts *o,
                         collie_store **out) {
    int res = COLLIE_OK;
    collie_store *s = NULL;
    cl_clear_last_error();
    if (out) *out = NULL;
    if (!e || !out)
        return cl_set_last_error(COLLIE_EINVAL, "collie_store_connect: %s is NULL",
                                 e ? "out" : "engine");
    CL_CHECK_GOTO(cl_config_check(), res, fail);
    if (!(s = calloc(1, sizeof *s)) || !(s->prefix = cl_strdup(""))) {
        res = cl_set_last_error(COLLIE_ENOMEM, "collie_store_connect: out of memory");
        goto fail;
    }
    CL_CHECK_GOTO(cl_store_core_create(e, addr, o, &s->core), res, fail);
    *out = s;
    return COLLIE_OK;
fail:
    if (s) free(s->prefix);
    free(s);
    return res;
}

int collie_store_prefix(collie_store *s, const char *prefix, collie_store **out) {
    cl_clear_last_error();
    if (out) *out = NULL;
    if (!s || !prefix || !out)
        return cl_set_last_error(COLLIE_EINVAL, "collie_store_prefix: %s is NULL",
                                 !s        ? "store"
                                 : !prefix ? "prefix"
                                           : "out");
    size_t len = strlen(prefix);
    if (s->plen + len > CL_STORE_PROTO_MAX_KEY)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_store_prefix: a prefix of %zu bytes exceeds the key "
                                 "limit of %u bytes",
                                 s->plen + len, CL_STORE_PROTO_MAX_KEY);
    collie_store *v = calloc(1, sizeof *v);
    char *p = malloc(s->plen + len + 1);
    if (!v || !p) {
        free(v);
        free(p);
        return cl_set_last_error(COLLIE_ENOMEM, "collie_store_prefix: out of memory");
    }
    memcpy(p, s->prefix, s->plen);
    memcpy(p + s->plen, prefix, len + 1);
    v->prefix = p;
    v->plen = s->plen + len;
    v->core = s->core;
    atomic_fetch_add_explicit(&s->core->handles, 1, memory_order_relaxed);
    cl_store_core_hold(s->core);
    *out = v;
    return COLLIE_OK;
}

void collie_store_destroy(collie_store *s) {
    if (!s) return;
    cl_store_core *c = s->core;
    free(s->prefix);
    free(s);
    if (atomic_fetch_sub_explicit(&c->handles, 1, memory_order_acq_rel) == 1)
        cl_store_core_close(c);
    else
        cl_store_core_release(c);
}

const char *collie_store_address(const collie_store *s) { return s ? s->core->addr : ""; }

/* ---- argument checks ------------------------------------------------------------------ */

static int store_api_begin(const collie_store *s, collie_work **out, const char *fn) {
    cl_clear_last_error();
    if (out) *out = NULL;
    if (!s || !out)
        return cl_set_last_error(COLLIE_EINVAL, "%s: %s is NULL", fn, s ? "out" : "store");
    return COLLIE_OK;
}

static int store_api_check_key(const collie_store *s, const char *key, const char *fn) {
    if (!key) return cl_set_last_error(COLLIE_EINVAL, "%s: key is NULL", fn);
    size_t len = strlen(key);
    if (s->plen + len > CL_STORE_PROTO_MAX_KEY)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "%s: a key of %zu bytes (with the view's prefix) exceeds the "
                                 "limit of %u bytes",
                                 fn, s->plen + len, CL_STORE_PROTO_MAX_KEY);
    return COLLIE_OK;
}

static int store_api_check_keys(const collie_store *s, const char *const *keys, size_t n,
                                const char *fn) {
    if (!keys) return cl_set_last_error(COLLIE_EINVAL, "%s: keys is NULL", fn);
    if (n == 0 || n > CL_STORE_PROTO_MAX_KEYS)
        return cl_set_last_error(COLLIE_EINVAL, "%s: n is %zu (use 1..%u keys)", fn, n,
                                 CL_STORE_PROTO_MAX_KEYS);
    for (size_t i = 0; i < n; i++) {
        if (!keys[i]) return cl_set_last_error(COLLIE_EINVAL, "%s: keys[%zu] is NULL", fn, i);
        int rc = store_api_check_key(s, keys[i], fn);
        if (rc != COLLIE_OK) return rc;
    }
    return COLLIE_OK;
}

static int store_api_check_value(const void *val, size_t len, const char *what, const char *fn) {
    if (!val && len)
        return cl_set_last_error(COLLIE_EINVAL, "%s: %s is NULL but its length is %zu", fn, what,
                                 len);
    if (len > CL_STORE_PROTO_MAX_BODY)
        return cl_set_last_error(COLLIE_EINVAL, "%s: a %s of %zu bytes exceeds the limit of %u", fn,
                                 what, len, CL_STORE_PROTO_MAX_BODY);
    return COLLIE_OK;
}

/* ---- encoding helpers ------------------------------------------------------------------- */

static void store_api_put_key(cl_store_req *r, const collie_store *s, const char *key) {
    cl_store_put_bytes2(&r->frame, s->prefix, s->plen, key, strlen(key));
}

/* " key 'pfx/key'" for messages: printable, shortened. */
static void store_api_describe(cl_store_req *r, const collie_store *s, const char *key, size_t n) {
    char k[52];
    size_t j = 0;
    for (size_t i = 0; i < s->plen + strlen(key) && j < 44; i++) {
        char ch = i < s->plen ? s->prefix[i] : key[i - s->plen];
        k[j++] = (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    }
    k[j] = '\0';
    bool cut = s->plen + strlen(key) > 44;
    if (n > 1)
        snprintf(r->desc, sizeof r->desc, "key '%s%s' and %zu more", k, cut ? "..." : "", n - 1);
    else
        snprintf(r->desc, sizeof r->desc, "key '%s%s'", k, cut ? "..." : "");
}

/* Start a request for a single-key op: checks done by the caller. */
static int store_api_new1(collie_store *s, uint8_t op, const char *key, const collie_post_opts *o,
                          cl_store_req **r) {
    int rc = cl_store_req_new(s->core, op, o, r);
    if (rc != COLLIE_OK) return rc;
    store_api_put_key(*r, s, key);
    store_api_describe(*r, s, key, 1);
    (*r)->nkeys = 1;
    return COLLIE_OK;
}

/* Start a request for a multi-key op with the key list encoded. */
static int store_api_newn(collie_store *s, uint8_t op, const char *const *keys, size_t n,
                          const collie_post_opts *o, cl_store_req **r) {
    int rc = cl_store_req_new(s->core, op, o, r);
    if (rc != COLLIE_OK) return rc;
    cl_store_put_u32(&(*r)->frame, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        store_api_put_key(*r, s, keys[i]);
    store_api_describe(*r, s, keys[0], n);
    (*r)->nkeys = (uint32_t)n;
    return COLLIE_OK;
}

/* ---- posts --------------------------------------------------------------------------------- */

static int store_api_post_kv(collie_store *s, uint8_t op, const char *key, const void *val,
                             size_t len, const collie_post_opts *o, collie_work **out,
                             const char *fn) {
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_key(s, key, fn);
    if (rc == COLLIE_OK) rc = store_api_check_value(val, len, "value", fn);
    if (rc == COLLIE_OK) rc = store_api_new1(s, op, key, o, &r);
    if (rc != COLLIE_OK) return rc;
    cl_store_put_bytes(&r->frame, val, len);
    return cl_store_req_post(r, out);
}

int collie_store_post_set(collie_store *s, const char *key, const void *val, size_t len,
                          const collie_post_opts *o, collie_work **out) {
    return store_api_post_kv(s, CL_STORE_OP_SET, key, val, len, o, out, "collie_store_post_set");
}

int collie_store_post_append(collie_store *s, const char *key, const void *val, size_t len,
                             const collie_post_opts *o, collie_work **out) {
    return store_api_post_kv(s, CL_STORE_OP_APPEND, key, val, len, o, out,
                             "collie_store_post_append");
}

static int store_api_post_key(collie_store *s, uint8_t op, const char *key,
                              const collie_post_opts *o, collie_work **out, const char *fn) {
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_key(s, key, fn);
    if (rc == COLLIE_OK) rc = store_api_new1(s, op, key, o, &r);
    if (rc != COLLIE_OK) return rc;
    return cl_store_req_post(r, out);
}

int collie_store_post_get(collie_store *s, const char *key, const collie_post_opts *o,
                          collie_work **out) {
    return store_api_post_key(s, CL_STORE_OP_GET, key, o, out, "collie_store_post_get");
}

int collie_store_post_delete(collie_store *s, const char *key, const collie_post_opts *o,
                             collie_work **out) {
    return store_api_post_key(s, CL_STORE_OP_DELETE, key, o, out, "collie_store_post_delete");
}

int collie_store_post_delete_prefix(collie_store *s, const char *prefix, const collie_post_opts *o,
                                    collie_work **out) {
    return store_api_post_key(s, CL_STORE_OP_DELETE_PREFIX, prefix, o, out,
                              "collie_store_post_delete_prefix");
}

int collie_store_post_add(collie_store *s, const char *key, int64_t delta,
                          const collie_post_opts *o, collie_work **out) {
    static const char fn[] = "collie_store_post_add";
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_key(s, key, fn);
    if (rc == COLLIE_OK) rc = store_api_new1(s, CL_STORE_OP_ADD, key, o, &r);
    if (rc != COLLIE_OK) return rc;
    cl_store_put_i64(&r->frame, delta);
    return cl_store_req_post(r, out);
}

int collie_store_post_compare_set(collie_store *s, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  const collie_post_opts *o, collie_work **out) {
    static const char fn[] = "collie_store_post_compare_set";
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_key(s, key, fn);
    if (rc == COLLIE_OK) rc = store_api_check_value(expected, expected_len, "expected", fn);
    if (rc == COLLIE_OK) rc = store_api_check_value(desired, desired_len, "desired", fn);
    if (rc == COLLIE_OK) rc = store_api_new1(s, CL_STORE_OP_COMPARE_SET, key, o, &r);
    if (rc != COLLIE_OK) return rc;
    cl_store_put_bytes(&r->frame, expected, expected_len);
    cl_store_put_bytes(&r->frame, desired, desired_len);
    return cl_store_req_post(r, out);
}

static int store_api_post_keys(collie_store *s, uint8_t op, const char *const *keys, size_t n,
                               const collie_post_opts *o, collie_work **out, const char *fn) {
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_keys(s, keys, n, fn);
    if (rc == COLLIE_OK) rc = store_api_newn(s, op, keys, n, o, &r);
    if (rc != COLLIE_OK) return rc;
    return cl_store_req_post(r, out);
}

int collie_store_post_check(collie_store *s, const char *const *keys, size_t n,
                            const collie_post_opts *o, collie_work **out) {
    return store_api_post_keys(s, CL_STORE_OP_CHECK, keys, n, o, out, "collie_store_post_check");
}

int collie_store_post_wait(collie_store *s, const char *const *keys, size_t n,
                           const collie_post_opts *o, collie_work **out) {
    return store_api_post_keys(s, CL_STORE_OP_WAIT, keys, n, o, out, "collie_store_post_wait");
}

int collie_store_post_multi_get(collie_store *s, const char *const *keys, size_t n,
                                const collie_post_opts *o, collie_work **out) {
    return store_api_post_keys(s, CL_STORE_OP_MULTI_GET, keys, n, o, out,
                               "collie_store_post_multi_get");
}

int collie_store_post_num_keys(collie_store *s, const collie_post_opts *o, collie_work **out) {
    cl_store_req *r;
    int rc = store_api_begin(s, out, "collie_store_post_num_keys");
    if (rc == COLLIE_OK) rc = cl_store_req_new(s->core, CL_STORE_OP_NUM_KEYS, o, &r);
    if (rc != COLLIE_OK) return rc;
    return cl_store_req_post(r, out);
}

int collie_store_post_multi_set(collie_store *s, const char *const *keys, const void *const *vals,
                                const size_t *lens, size_t n, const collie_post_opts *o,
                                collie_work **out) {
    static const char fn[] = "collie_store_post_multi_set";
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_keys(s, keys, n, fn);
    if (rc == COLLIE_OK && (!vals || !lens))
        rc = cl_set_last_error(COLLIE_EINVAL, "%s: %s is NULL", fn, vals ? "lens" : "vals");
    for (size_t i = 0; rc == COLLIE_OK && i < n; i++)
        rc = store_api_check_value(vals[i], lens[i], "value", fn);
    if (rc == COLLIE_OK) rc = cl_store_req_new(s->core, CL_STORE_OP_MULTI_SET, o, &r);
    if (rc != COLLIE_OK) return rc;
    cl_store_put_u32(&r->frame, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        store_api_put_key(r, s, keys[i]);
        cl_store_put_bytes(&r->frame, vals[i], lens[i]);
    }
    store_api_describe(r, s, keys[0], n);
    r->nkeys = (uint32_t)n;
    return cl_store_req_post(r, out);
}

int collie_store_post_barrier(collie_store *s, const char *key, uint32_t n,
                              const collie_post_opts *o, collie_work **out) {
    static const char fn[] = "collie_store_post_barrier";
    cl_store_req *r;
    int rc = store_api_begin(s, out, fn);
    if (rc == COLLIE_OK) rc = store_api_check_key(s, key, fn);
    if (rc == COLLIE_OK && n == 0)
        rc = cl_set_last_error(COLLIE_EINVAL, "%s: n is 0 (a barrier needs participants)", fn);
    if (rc == COLLIE_OK) rc = store_api_new1(s, CL_STORE_OP_BARRIER, key, o, &r);
    if (rc != COLLIE_OK) return rc;
    cl_store_put_u32(&r->frame, n);
    return cl_store_req_post(r, out);
}

/* ---- synchronous wrappers ---------------------------------------------------------------- */

static int store_api_sync_check(const collie_store *s, const char *fn) {
    cl_clear_last_error();
    if (s && cl_engine_on_loop(s->core->engine))
        return cl_set_last_error(COLLIE_ESTATE,
                                 "%s: synchronous store call on the engine's progress thread "
                                 "(use the collie_store_post_* form)",
                                 fn);
    return COLLIE_OK;
}

/* Wait for a posted work (bounded by its deadline). On error the work's
 * message becomes this thread's collie_last_error. The work is kept. */
static int store_api_sync_wait(collie_work *w) {
    int rc = collie_work_wait(w, COLLIE_TIMEOUT_INFINITE);
    if (rc < 0) cl_set_last_error(rc, "%s", collie_work_error_message(w));
    return rc;
}

#define STORE_SYNC_OPTS(var, t)                                                                    \
    collie_post_opts var = COLLIE_POST_OPTS_INIT;                                                  \
    var.timeout_ms = (t)

/* Post with `post`, wait, release: for ops without results. */
#define STORE_SYNC_SIMPLE(fn, post_call)                                                           \
    do {                                                                                           \
        collie_work *w_ = NULL;                                                                    \
        int rc_ = store_api_sync_check(s, fn);                                                     \
        if (rc_ == COLLIE_OK) rc_ = (post_call);                                                   \
        if (rc_ == COLLIE_OK) rc_ = store_api_sync_wait(w_);                                       \
        collie_work_release(w_);                                                                   \
        return rc_;                                                                                \
    } while (0)

int collie_store_set(collie_store *s, const char *key, const void *val, size_t len,
                     int32_t timeout_ms) {
    STORE_SYNC_OPTS(po, timeout_ms);
    STORE_SYNC_SIMPLE("collie_store_set", collie_store_post_set(s, key, val, len, &po, &w_));
}

int collie_store_append(collie_store *s, const char *key, const void *val, size_t len,
                        int32_t timeout_ms) {
    STORE_SYNC_OPTS(po, timeout_ms);
    STORE_SYNC_SIMPLE("collie_store_append", collie_store_post_append(s, key, val, len, &po, &w_));
}

int collie_store_wait(collie_store *s, const char *const *keys, size_t n, int32_t timeout_ms) {
    STORE_SYNC_OPTS(po, timeout_ms);
    STORE_SYNC_SIMPLE("collie_store_wait", collie_store_post_wait(s, keys, n, &po, &w_));
}

int collie_store_multi_set(collie_store *s, const char *const *keys, const void *const *vals,
                           const size_t *lens, size_t n, int32_t timeout_ms) {
    STORE_SYNC_OPTS(po, timeout_ms);
    STORE_SYNC_SIMPLE("collie_store_multi_set",
                      collie_store_post_multi_set(s, keys, vals, lens, n, &po, &w_));
}

int collie_store_barrier(collie_store *s, const char *key, uint32_t n, int32_t timeout_ms) {
    STORE_SYNC_OPTS(po, timeout_ms);
    STORE_SYNC_SIMPLE("collie_store_barrier", collie_store_post_barrier(s, key, n, &po, &w_));
}

/* Wait for w and read its integer result. */
static int store_api_sync_int(collie_work *w, int rc, int64_t *out) {
    if (rc == COLLIE_OK) rc = store_api_sync_wait(w);
    if (rc == COLLIE_OK) rc = collie_store_work_int(w, out);
    collie_work_release(w);
    return rc;
}

int collie_store_add(collie_store *s, const char *key, int64_t delta, int32_t timeout_ms,
                     int64_t *out) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    int64_t v = 0;
    int rc = store_api_sync_check(s, "collie_store_add");
    if (rc == COLLIE_OK) rc = collie_store_post_add(s, key, delta, &po, &w);
    rc = store_api_sync_int(w, rc, &v);
    if (out) *out = rc == COLLIE_OK ? v : 0;
    return rc;
}

int collie_store_num_keys(collie_store *s, int32_t timeout_ms, int64_t *out) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    int64_t v = 0;
    int rc = store_api_sync_check(s, "collie_store_num_keys");
    if (rc == COLLIE_OK && !out)
        rc = cl_set_last_error(COLLIE_EINVAL, "collie_store_num_keys: out is NULL");
    if (rc == COLLIE_OK) rc = collie_store_post_num_keys(s, &po, &w);
    rc = store_api_sync_int(w, rc, &v);
    if (out) *out = rc == COLLIE_OK ? v : 0;
    return rc;
}

int collie_store_check(collie_store *s, const char *const *keys, size_t n, int32_t timeout_ms,
                       bool *all_exist) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    int64_t v = 0;
    int rc = store_api_sync_check(s, "collie_store_check");
    if (rc == COLLIE_OK && !all_exist)
        rc = cl_set_last_error(COLLIE_EINVAL, "collie_store_check: all_exist is NULL");
    if (rc == COLLIE_OK) rc = collie_store_post_check(s, keys, n, &po, &w);
    rc = store_api_sync_int(w, rc, &v);
    if (all_exist) *all_exist = rc == COLLIE_OK && v != 0;
    return rc;
}

int collie_store_delete(collie_store *s, const char *key, int32_t timeout_ms, bool *existed) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    int64_t v = 0;
    int rc = store_api_sync_check(s, "collie_store_delete");
    if (rc == COLLIE_OK) rc = collie_store_post_delete(s, key, &po, &w);
    rc = store_api_sync_int(w, rc, &v);
    if (existed) *existed = rc == COLLIE_OK && v != 0;
    return rc;
}

int collie_store_delete_prefix(collie_store *s, const char *prefix, int32_t timeout_ms,
                               int64_t *deleted) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    int64_t v = 0;
    int rc = store_api_sync_check(s, "collie_store_delete_prefix");
    if (rc == COLLIE_OK) rc = collie_store_post_delete_prefix(s, prefix, &po, &w);
    rc = store_api_sync_int(w, rc, &v);
    if (deleted) *deleted = rc == COLLIE_OK ? v : 0;
    return rc;
}

/* Copy a work's value into a malloc'd, NUL-terminated buffer. */
static int store_api_copy_value(const void *p, size_t len, void **val, size_t *out_len) {
    char *copy = malloc(len + 1);
    if (!copy) return cl_set_last_error(COLLIE_ENOMEM, "store: out of memory copying a value");
    if (len) memcpy(copy, p, len);
    copy[len] = '\0';
    *val = copy;
    if (out_len) *out_len = len;
    return COLLIE_OK;
}

static int store_api_sync_value(collie_work *w, int rc, void **val, size_t *len) {
    const void *p = NULL;
    size_t n = 0;
    if (rc == COLLIE_OK) rc = store_api_sync_wait(w);
    if (rc == COLLIE_OK) rc = collie_store_work_value(w, &p, &n);
    if (rc == COLLIE_OK) rc = store_api_copy_value(p, n, val, len);
    collie_work_release(w);
    return rc;
}

int collie_store_get(collie_store *s, const char *key, int32_t timeout_ms, void **val,
                     size_t *len) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    if (val) *val = NULL;
    if (len) *len = 0;
    int rc = store_api_sync_check(s, "collie_store_get");
    if (rc == COLLIE_OK && !val)
        rc = cl_set_last_error(COLLIE_EINVAL, "collie_store_get: val is NULL");
    if (rc == COLLIE_OK) rc = collie_store_post_get(s, key, &po, &w);
    return store_api_sync_value(w, rc, val, len);
}

int collie_store_compare_set(collie_store *s, const char *key, const void *expected,
                             size_t expected_len, const void *desired, size_t desired_len,
                             int32_t timeout_ms, void **cur, size_t *cur_len) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    if (cur) *cur = NULL;
    if (cur_len) *cur_len = 0;
    int rc = store_api_sync_check(s, "collie_store_compare_set");
    if (rc == COLLIE_OK && !cur)
        rc = cl_set_last_error(COLLIE_EINVAL, "collie_store_compare_set: cur is NULL");
    if (rc == COLLIE_OK)
        rc = collie_store_post_compare_set(s, key, expected, expected_len, desired, desired_len,
                                           &po, &w);
    return store_api_sync_value(w, rc, cur, cur_len);
}

int collie_store_multi_get(collie_store *s, const char *const *keys, size_t n, int32_t timeout_ms,
                           void **vals, size_t *lens) {
    STORE_SYNC_OPTS(po, timeout_ms);
    collie_work *w = NULL;
    size_t i = 0;
    for (size_t j = 0; vals && keys && j < n && j < CL_STORE_PROTO_MAX_KEYS; j++)
        vals[j] = NULL;
    int rc = store_api_sync_check(s, "collie_store_multi_get");
    if (rc == COLLIE_OK && (!vals || !lens))
        rc = cl_set_last_error(COLLIE_EINVAL, "collie_store_multi_get: %s is NULL",
                               vals ? "lens" : "vals");
    if (rc == COLLIE_OK) rc = collie_store_post_multi_get(s, keys, n, &po, &w);
    if (rc == COLLIE_OK) rc = store_api_sync_wait(w);
    for (i = 0; rc == COLLIE_OK && i < n; i++) {
        const void *p = NULL;
        size_t len = 0;
        rc = collie_store_work_value_at(w, i, &p, &len);
        if (rc == COLLIE_OK) rc = store_api_copy_value(p, len, &vals[i], &lens[i]);
    }
    if (rc != COLLIE_OK && w) /* all NULL on error */
        for (size_t j = 0; j < i; j++) {
            free(vals[j]);
            vals[j] = NULL;
        }
    collie_work_release(w);
    return rc;
}

int cl_store_token(const collie_store *s, const char **token, size_t *len) {
    *token = s && s->core ? s->core->token : NULL;
    *len = *token ? s->core->token_len : 0;
    return COLLIE_OK;
}

bool cl_store_on_loopback(const collie_store *s, char *addr, size_t len) {
    char host[256];
    uint16_t port;
    snprintf(addr, len, "%s", s && s->core ? s->core->addr : "?");
    if (!s || !s->core || cl_store_addr_parse(s->core->addr, host, sizeof host, &port) != COLLIE_OK)
        return false;
    return cl_store_host_is_loopback(host);
}

bool cl_store_lost(const collie_store *s, char *why, size_t len) {
    if (!s || !s->core) return false;
    cl_store_core *c = s->core;
    pthread_mutex_lock(&c->mu);
    bool lost = !c->connected && atomic_load_explicit(&c->connects, memory_order_relaxed) > 0;
    if (lost && why) snprintf(why, len, "%s", c->last_err[0] ? c->last_err : "connection lost");
    pthread_mutex_unlock(&c->mu);
    return lost;
}

uint64_t cl_store_reconnects(const collie_store *s) {
    if (!s || !s->core) return 0;
    uint64_t n = atomic_load_explicit(&s->core->connects, memory_order_relaxed);
    return n > 1 ? n - 1 : 0;
}
