/*
 * kv.c — the key table and its waiter lists (interface in kv.h).
 *
 * Design notes
 *  - The entries live in a cl_idmap (base/idmap.h, the library's one hash
 *    map) keyed by the SipHash of their key bytes with a per-table random
 *    seed, so a client cannot aim keys at one chain. Two keys with one
 *    hash are both kept (idmap keys may repeat); a lookup walks the nodes
 *    of its hash and compares the bytes. Measured against the chain kv.c
 *    had before (issue 30, bench/RESULTS.md): store get and add with 64
 *    clients within noise.
 *  - An entry exists while its key is present OR some waiter is linked to
 *    it: a get on a missing key creates a "placeholder" entry
 *    (present = false) that holds the waiter list. Placeholders do not count
 *    as keys (num_keys, max_keys); the last unwatch of a placeholder frees it.
 *  - Each waiter keeps one link per key and a count of unsatisfied links.
 *    A mutation re-evaluates exactly the links on the touched entry, so a
 *    set costs O(waiters on that key), never a scan of all waiters. A waiter
 *    whose count reaches zero joins the ready list (FIFO), and leaves it if
 *    a later mutation unsatisfies it before it is popped.
 *  - Every mutation validates and allocates first and only then changes the
 *    table, so an error leaves the table exactly as it was (multi_set is all
 *    or nothing for the same reason).
 *  - Single-threaded by contract (the server's loop thread); no locks.
 */
#include "store/kv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/idmap.h"
#include "collie.h"
#include "store/siphash.h"

typedef struct cl_store_kv_entry {
    cl_idnode node; /* node.key = SipHash of key[] */
    uint8_t *val;
    uint32_t vlen, vcap;
    bool present;
    cl_list waiters; /* cl_store_wlink.node */
    uint32_t klen;
    uint8_t key[];
} store_kv_entry;

struct cl_store_kv {
    cl_idmap map; /* store_kv_entry.node; count = present + placeholders */
    size_t npresent;
    cl_store_kv_limits lim;
    uint8_t seed[16];
    cl_list ready; /* cl_store_waiter.rnode: every key there */
    char err[160];
};

static int store_kv_fail(cl_store_kv *kv, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int store_kv_fail(cl_store_kv *kv, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv->err, sizeof kv->err, fmt, ap);
    va_end(ap);
    return status;
}

const char *cl_store_kv_error(const cl_store_kv *kv) { return kv->err; }

static store_kv_entry *store_kv_of(const cl_idnode *n) {
    return n ? (store_kv_entry *)((char *)n - offsetof(store_kv_entry, node)) : NULL;
}

cl_store_kv *cl_store_kv_create(const cl_store_kv_limits *lim, const uint8_t seed[16]) {
    cl_store_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return NULL;
    /* buckets now, so that a put never fails; 64, as many as a small store needs */
    bool ok = true;
    while (ok && kv->map.bits < 6)
        ok = cl_idmap_grow(&kv->map);
    if (!ok) {
        cl_idmap_fini(&kv->map);
        free(kv);
        return NULL;
    }
    kv->lim = *lim;
    memcpy(kv->seed, seed, sizeof kv->seed);
    cl_list_init(&kv->ready);
    return kv;
}

void cl_store_kv_destroy(cl_store_kv *kv) {
    if (!kv) return;
    /* Waiters still registered: collect each once (nlinks = 0 marks it),
     * then free their links, then the entries. */
    cl_store_waiter *w;
    cl_list_foreach(&kv->ready, w, cl_store_waiter, rnode) cl_list_remove(&w->rnode);
    cl_list dead; /* through rnode, now free */
    cl_list_init(&dead);
    cl_store_wlink *l;
    for (cl_idnode *n = cl_idmap_first(&kv->map); n; n = cl_idmap_after(&kv->map, n))
        cl_list_foreach(&store_kv_of(n)->waiters, l, cl_store_wlink, node) {
            if (l->w->nlinks == 0) continue;
            l->w->nlinks = 0;
            cl_list_push_back(&dead, &l->w->rnode);
        }
    while ((w = cl_list_first(&dead, cl_store_waiter, rnode))) {
        cl_list_remove(&w->rnode);
        free(w->links);
        memset(w, 0, sizeof *w); /* unregistered: a later unwatch is a no-op */
    }
    for (cl_idnode *n = cl_idmap_first(&kv->map), *next; n; n = next) {
        next = cl_idmap_after(&kv->map, n); /* before n is freed */
        free(store_kv_of(n)->val);
        free(store_kv_of(n));
    }
    cl_idmap_fini(&kv->map);
    free(kv);
}

/* ---- table ----------------------------------------------------------------------- */

static store_kv_entry *store_kv_find(const cl_store_kv *kv, const void *key, size_t klen,
                                     uint64_t h) {
    for (cl_idnode *n = cl_idmap_get(&kv->map, h); n; n = cl_idmap_next(n)) {
        store_kv_entry *e = store_kv_of(n);
        if (e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
    }
    return NULL;
}

static store_kv_entry *store_kv_lookup(const cl_store_kv *kv, const void *key, size_t klen) {
    return store_kv_find(kv, key, klen, cl_store_siphash(kv->seed, key, klen));
}

int cl_store_kv_check_key(cl_store_kv *kv, size_t klen) {
    if (klen > kv->lim.max_key_size)
        return store_kv_fail(kv, COLLIE_ELIMIT, "key of %zu bytes exceeds max_key_size %u", klen,
                             kv->lim.max_key_size);
    return COLLIE_OK;
}

/* Find the entry for key, creating a placeholder if needed (NULL: ENOMEM). */
static store_kv_entry *store_kv_get_or_add(cl_store_kv *kv, const void *key, size_t klen) {
    uint64_t h = cl_store_siphash(kv->seed, key, klen);
    store_kv_entry *e = store_kv_find(kv, key, klen, h);
    if (e) return e;
    e = calloc(1, sizeof *e + klen);
    if (!e) return NULL;
    e->node.key = h;
    e->klen = (uint32_t)klen;
    cl_list_init(&e->waiters);
    if (klen) memcpy(e->key, key, klen);
    cl_idmap_put(&kv->map, &e->node); /* never fails: the map has buckets */
    return e;
}

/* Free an entry that holds neither a value nor waiters. */
static void store_kv_maybe_drop(cl_store_kv *kv, store_kv_entry *e) {
    if (e->present || !cl_list_empty(&e->waiters)) return;
    cl_idmap_remove(&kv->map, &e->node);
    free(e->val);
    free(e);
}

/* ---- waiters ------------------------------------------------------------------------ */

static bool store_kv_parse_int(const uint8_t *p, size_t len, int64_t *out) {
    size_t i = 0;
    bool neg = false;
    if (len > 0 && p[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len || len - i > 19) return false;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return false;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX + (neg ? 1u : 0u)) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool store_kv_link_eval(const cl_store_wlink *l) {
    const store_kv_entry *e = l->entry;
    if (!e->present) return false;
    if (l->w->kind == CL_STORE_WAIT_EXISTS) return true;
    int64_t v;
    return store_kv_parse_int(e->val, e->vlen, &v) && v >= l->w->target;
}

static void store_kv_ready_push(cl_store_kv *kv, cl_store_waiter *w) {
    cl_list_push_back(&kv->ready, &w->rnode);
}

/* Re-evaluate the waiters of a mutated entry. */
static void store_kv_touch(cl_store_kv *kv, store_kv_entry *e) {
    cl_store_wlink *l;
    cl_list_foreach(&e->waiters, l, cl_store_wlink, node) {
        bool sat = store_kv_link_eval(l);
        if (sat == l->satisfied) continue;
        l->satisfied = sat;
        cl_store_waiter *w = l->w;
        if (sat) {
            if (--w->missing == 0) store_kv_ready_push(kv, w);
        } else {
            if (w->missing++ == 0) cl_list_remove(&w->rnode);
        }
    }
}

int cl_store_kv_watch(cl_store_kv *kv, cl_store_waiter *w, size_t n, const cl_store_bytes *keys,
                      int kind, int64_t target) {
    memset(w, 0, sizeof *w);
    if (n == 0 || (kind == CL_STORE_WAIT_AT_LEAST && n != 1))
        return store_kv_fail(kv, COLLIE_EINVAL, "bad watch of %zu keys", n);
    for (size_t i = 0; i < n; i++)
        if (cl_store_kv_check_key(kv, keys[i].len) != COLLIE_OK) return COLLIE_ELIMIT;
    w->links = calloc(n, sizeof *w->links);
    if (!w->links) return store_kv_fail(kv, COLLIE_ENOMEM, "out of memory");
    w->kind = kind;
    w->target = target;
    w->registered = true;
    for (size_t i = 0; i < n; i++) {
        store_kv_entry *e = store_kv_get_or_add(kv, keys[i].p, keys[i].len);
        if (!e) {
            cl_store_kv_unwatch(kv, w); /* unlinks the i links made so far */
            return store_kv_fail(kv, COLLIE_ENOMEM, "out of memory");
        }
        cl_store_wlink *l = &w->links[i];
        l->w = w;
        l->entry = e;
        cl_list_push_front(&e->waiters, &l->node);
        w->nlinks = (uint32_t)(i + 1);
        l->satisfied = store_kv_link_eval(l);
        if (!l->satisfied) w->missing++;
    }
    if (w->missing == 0) store_kv_ready_push(kv, w);
    return COLLIE_OK;
}

void cl_store_kv_unwatch(cl_store_kv *kv, cl_store_waiter *w) {
    if (!w->registered) return;
    cl_list_remove(&w->rnode);
    for (uint32_t i = 0; i < w->nlinks; i++) {
        cl_store_wlink *l = &w->links[i];
        cl_list_remove(&l->node);
        store_kv_maybe_drop(kv, l->entry);
    }
    free(w->links);
    w->links = NULL;
    w->nlinks = w->missing = 0;
    w->registered = false;
}

cl_store_waiter *cl_store_kv_pop_ready(cl_store_kv *kv) {
    cl_store_waiter *w = cl_list_first(&kv->ready, cl_store_waiter, rnode);
    if (w) cl_list_remove(&w->rnode);
    return w;
}

bool cl_store_kv_waiter_value(const cl_store_waiter *w, size_t i, const uint8_t **val,
                              size_t *vlen) {
    if (i >= w->nlinks || !w->links[i].entry || !w->links[i].entry->present) return false;
    *val = w->links[i].entry->val;
    *vlen = w->links[i].entry->vlen;
    return true;
}

/* ---- mutations ------------------------------------------------------------------------ */

static int store_kv_check_value(cl_store_kv *kv, size_t vlen) {
    if (vlen > kv->lim.max_value_size)
        return store_kv_fail(kv, COLLIE_ELIMIT, "value of %zu bytes exceeds max_value_size %u",
                             vlen, kv->lim.max_value_size);
    return COLLIE_OK;
}

static int store_kv_check_new_keys(cl_store_kv *kv, size_t extra) {
    if (extra > 0 && kv->npresent + extra > kv->lim.max_keys)
        return store_kv_fail(kv, COLLIE_ELIMIT, "the store holds %zu keys, max_keys is %u",
                             kv->npresent, kv->lim.max_keys);
    return COLLIE_OK;
}

/* Install `buf` (already allocated, ownership taken) as e's value. */
static void store_kv_install(cl_store_kv *kv, store_kv_entry *e, uint8_t *buf, size_t len,
                             size_t cap) {
    free(e->val);
    e->val = buf;
    e->vlen = (uint32_t)len;
    e->vcap = (uint32_t)cap;
    if (!e->present) {
        e->present = true;
        kv->npresent++;
    }
    store_kv_touch(kv, e);
}

/* Prepare a value buffer (len + 1 bytes, NUL-terminated for convenience). */
static uint8_t *store_kv_buf(const void *val, size_t len) {
    uint8_t *b = malloc(len + 1);
    if (!b) return NULL;
    if (len) memcpy(b, val, len);
    b[len] = '\0';
    return b;
}

int cl_store_kv_set(cl_store_kv *kv, const void *key, size_t klen, const void *val, size_t vlen) {
    int res = cl_store_kv_check_key(kv, klen);
    if (res == COLLIE_OK) res = store_kv_check_value(kv, vlen);
    if (res != COLLIE_OK) return res;
    store_kv_entry *e = store_kv_lookup(kv, key, klen);
    if ((!e || !e->present) && (res = store_kv_check_new_keys(kv, 1)) != COLLIE_OK) return res;
    uint8_t *buf = store_kv_buf(val, vlen);
    if (!buf || (!e && !(e = store_kv_get_or_add(kv, key, klen)))) {
        free(buf);
        return store_kv_fail(kv, COLLIE_ENOMEM, "out of memory");
    }
    store_kv_install(kv, e, buf, vlen, vlen + 1);
    return COLLIE_OK;
}

int cl_store_kv_append(cl_store_kv *kv, const void *key, size_t klen, const void *val,
                       size_t vlen) {
    store_kv_entry *e = store_kv_lookup(kv, key, klen);
    if (!e || !e->present) return cl_store_kv_set(kv, key, klen, val, vlen);
    int res = store_kv_check_value(kv, (size_t)e->vlen + vlen);
    if (res != COLLIE_OK) return res;
    size_t need = (size_t)e->vlen + vlen + 1;
    if (need > e->vcap) {
        size_t cap = (size_t)e->vcap * 2 > need ? (size_t)e->vcap * 2 : need;
        if (cap > (size_t)kv->lim.max_value_size + 1) cap = need;
        uint8_t *p = realloc(e->val, cap);
        if (!p) return store_kv_fail(kv, COLLIE_ENOMEM, "out of memory");
        e->val = p;
        e->vcap = (uint32_t)cap;
    }
    if (vlen) memcpy(e->val + e->vlen, val, vlen);
    e->vlen += (uint32_t)vlen;
    e->val[e->vlen] = '\0';
    store_kv_touch(kv, e);
    return COLLIE_OK;
}

/* Decimal text of v into buf (at least 21 bytes); returns its length. */
static size_t store_kv_format_int(int64_t v, char *buf) {
    char tmp[24];
    size_t n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    size_t len = 0;
    if (v < 0) buf[len++] = '-';
    while (n)
        buf[len++] = tmp[--n];
    return len;
}

int cl_store_kv_add(cl_store_kv *kv, const void *key, size_t klen, int64_t delta, int64_t *out) {
    int res = cl_store_kv_check_key(kv, klen);
    if (res != COLLIE_OK) return res;
    store_kv_entry *e = store_kv_lookup(kv, key, klen);
    int64_t cur = 0, next;
    if (e && e->present && !store_kv_parse_int(e->val, e->vlen, &cur))
        return store_kv_fail(kv, COLLIE_EINVAL, "add: the value of the key is not an integer");
    if (__builtin_add_overflow(cur, delta, &next))
        return store_kv_fail(kv, COLLIE_EINVAL, "add: %lld + %lld overflows", (long long)cur,
                             (long long)delta);
    char text[24];
    size_t len = store_kv_format_int(next, text);
    if (e && e->present && e->vcap >= len + 1) { /* the common case: in place */
        memcpy(e->val, text, len);
        e->val[len] = '\0';
        e->vlen = (uint32_t)len;
        store_kv_touch(kv, e); /* a barrier may be waiting for this value */
        *out = next;
        return COLLIE_OK;
    }
    res = cl_store_kv_set(kv, key, klen, text, len);
    if (res == COLLIE_OK) *out = next;
    return res;
}

int cl_store_kv_compare_set(cl_store_kv *kv, const void *key, size_t klen, const void *exp,
                            size_t elen, const void *des, size_t dlen, const uint8_t **cur,
                            size_t *curlen) {
    int res = cl_store_kv_check_key(kv, klen);
    if (res != COLLIE_OK) return res;
    store_kv_entry *e = store_kv_lookup(kv, key, klen);
    bool present = e && e->present;
    bool match =
        present ? (e->vlen == elen && (elen == 0 || memcmp(e->val, exp, elen) == 0)) : elen == 0;
    if (match) {
        res = cl_store_kv_set(kv, key, klen, des, dlen);
        if (res != COLLIE_OK) return res;
        e = store_kv_lookup(kv, key, klen);
        present = true;
    }
    *cur = present ? e->val : (const uint8_t *)"";
    *curlen = present ? e->vlen : 0;
    return COLLIE_OK;
}

int cl_store_kv_multi_set(cl_store_kv *kv, size_t n, const cl_store_bytes *keys,
                          const cl_store_bytes *vals) {
    int res = COLLIE_OK;
    size_t fresh = 0, made = 0;
    uint8_t **bufs = NULL;
    store_kv_entry **ents = NULL;
    for (size_t i = 0; i < n; i++) {
        if ((res = cl_store_kv_check_key(kv, keys[i].len)) != COLLIE_OK) return res;
        if ((res = store_kv_check_value(kv, vals[i].len)) != COLLIE_OK) return res;
        const store_kv_entry *e = store_kv_lookup(kv, keys[i].p, keys[i].len);
        if (!e || !e->present) fresh++; /* a key repeated in the request counts twice: safe side */
    }
    if ((res = store_kv_check_new_keys(kv, fresh)) != COLLIE_OK) return res;
    /* allocate everything (values, placeholder entries) before changing anything */
    bufs = calloc(n, sizeof *bufs);
    ents = calloc(n, sizeof *ents);
    for (made = 0; bufs && ents && made < n; made++) {
        bufs[made] = store_kv_buf(vals[made].p, vals[made].len);
        ents[made] = bufs[made] ? store_kv_get_or_add(kv, keys[made].p, keys[made].len) : NULL;
        if (!ents[made]) break;
    }
    if (made == n) {
        for (size_t i = 0; i < n; i++)
            store_kv_install(kv, ents[i], bufs[i], vals[i].len, (size_t)vals[i].len + 1);
        goto out;
    }
    res = store_kv_fail(kv, COLLIE_ENOMEM, "out of memory");
    for (size_t i = 0; bufs && ents && i <= made && i < n; i++) {
        free(bufs[i]);
        bool dup = false; /* drop each placeholder made above once */
        for (size_t j = 0; j < i && !dup; j++)
            dup = ents[j] == ents[i];
        if (ents[i] && !dup) store_kv_maybe_drop(kv, ents[i]);
    }
out:
    free(bufs);
    free(ents);
    return res;
}

int cl_store_kv_delete(cl_store_kv *kv, const void *key, size_t klen, bool *existed) {
    store_kv_entry *e = store_kv_lookup(kv, key, klen);
    *existed = e && e->present;
    if (!*existed) return COLLIE_OK;
    free(e->val);
    e->val = NULL;
    e->vlen = e->vcap = 0;
    e->present = false;
    kv->npresent--;
    store_kv_touch(kv, e);
    store_kv_maybe_drop(kv, e);
    return COLLIE_OK;
}

size_t cl_store_kv_delete_prefix(cl_store_kv *kv, const void *prefix, size_t plen) {
    size_t count = 0;
    for (cl_idnode *n = cl_idmap_first(&kv->map), *next; n; n = next) {
        next = cl_idmap_after(&kv->map, n); /* before the delete may drop n's entry */
        store_kv_entry *e = store_kv_of(n);
        if (e->present && e->klen >= plen && memcmp(e->key, prefix, plen) == 0) {
            bool existed;
            cl_store_kv_delete(kv, e->key, e->klen, &existed);
            count++;
        }
    }
    return count;
}

bool cl_store_kv_get(const cl_store_kv *kv, const void *key, size_t klen, const uint8_t **val,
                     size_t *vlen) {
    const store_kv_entry *e = store_kv_lookup(kv, key, klen);
    if (!e || !e->present) return false;
    *val = e->val;
    *vlen = e->vlen;
    return true;
}

size_t cl_store_kv_num_keys(const cl_store_kv *kv) { return kv->npresent; }
