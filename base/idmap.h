/*
 * idmap.h — an intrusive chained hash map from 64-bit keys to nodes
 * embedded in the caller's structs, header-only like list.h and open to
 * every layer: the store client's in-flight requests and the server's
 * waiting requests by id, the server's key table by the SipHash of each
 * key, the TCP transport's expected messages, early (parked) frames and
 * running collectives by seq.
 *
 * Design notes
 *  - Keys are mostly sequential (request ids, collective seqs), so a
 *    multiplicative (Fibonacci) hash taking the product's top bits spreads
 *    them well; already-hashed keys (the store's SipHash values) stay as
 *    uniform as they were. The table doubles at load factor 1 and never
 *    shrinks (a map's peak is a good guess for its future); a failed
 *    doubling of a non-empty map only costs speed.
 *  - Keys may repeat (several expected messages of one seq, told apart by
 *    step; two byte strings with one hash): get returns one node with the
 *    key, next walks the rest. Their order is not kept: a put goes to the
 *    front of its chain, but a doubling reverses the chains it moves, so a
 *    caller tells equal keys apart itself (step, bytes).
 *  - first/after walk every node in table order; removing the node just
 *    visited (after taking its successor) keeps the walk valid, a put
 *    during the walk does not (it may double the table).
 *  - Not thread-safe: each map belongs to one thread (the engine's loop).
 */
#ifndef CL_BASE_IDMAP_H
#define CL_BASE_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct cl_idnode {
    struct cl_idnode *next;
    uint64_t key;
} cl_idnode;

typedef struct cl_idmap {
    cl_idnode **buckets;
    unsigned bits; /* log2 of the bucket count; 0 before the first put */
    size_t count;
} cl_idmap;

static inline size_t cl_idmap_slot(uint64_t key, unsigned bits) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static inline bool cl_idmap_grow(cl_idmap *m) {
    unsigned bits = m->bits ? m->bits + 1 : 4;
    size_t old = m->bits ? (size_t)1 << m->bits : 0;
    cl_idnode **b = calloc((size_t)1 << bits, sizeof *b);
    if (!b) return false;
    for (size_t i = 0; i < old; i++) {
        cl_idnode *n = m->buckets[i];
        while (n) {
            cl_idnode *next = n->next;
            size_t s = cl_idmap_slot(n->key, bits);
            n->next = b[s];
            b[s] = n;
            n = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->bits = bits;
    return true;
}

/* cl_idmap_put: insert `n` (n->key set by the caller). Returns false only
 * when an empty map cannot get its first buckets (the map is unchanged). */
static inline bool cl_idmap_put(cl_idmap *m, cl_idnode *n) {
    if ((m->bits == 0 || m->count >= (size_t)1 << m->bits) && !cl_idmap_grow(m) && m->bits == 0)
        return false;
    size_t s = cl_idmap_slot(n->key, m->bits);
    n->next = m->buckets[s];
    m->buckets[s] = n;
    m->count++;
    return true;
}

/* cl_idmap_next: the next node after `n` in its chain with the same key. */
static inline cl_idnode *cl_idmap_next(const cl_idnode *n) {
    uint64_t key = n->key;
    for (n = n->next; n; n = n->next)
        if (n->key == key) return (cl_idnode *)n;
    return NULL;
}

/* cl_idmap_get: a node with `key` (the first of its chain: see the design
 * notes on repeated keys), or NULL. */
static inline cl_idnode *cl_idmap_get(const cl_idmap *m, uint64_t key) {
    if (m->bits == 0) return NULL;
    for (cl_idnode *n = m->buckets[cl_idmap_slot(key, m->bits)]; n; n = n->next)
        if (n->key == key) return n;
    return NULL;
}

/* cl_idmap_remove: unlink node `n` if it is in the map; says whether it was. */
static inline bool cl_idmap_remove(cl_idmap *m, cl_idnode *n) {
    if (m->bits == 0) return false;
    for (cl_idnode **pp = &m->buckets[cl_idmap_slot(n->key, m->bits)]; *pp; pp = &(*pp)->next) {
        if (*pp == n) {
            *pp = n->next;
            n->next = NULL;
            m->count--;
            return true;
        }
    }
    return false;
}

/* cl_idmap_del: unlink and return the node cl_idmap_get finds, or NULL. */
static inline cl_idnode *cl_idmap_del(cl_idmap *m, uint64_t key) {
    cl_idnode *n = cl_idmap_get(m, key);
    if (n) cl_idmap_remove(m, n);
    return n;
}

/* cl_idmap_after: the node after `n` in table order (any key), or NULL.
 * Take it before removing `n`: the walk then goes on where n was. */
static inline cl_idnode *cl_idmap_after(const cl_idmap *m, const cl_idnode *n) {
    if (n->next) return n->next;
    size_t nb = (size_t)1 << m->bits;
    for (size_t s = cl_idmap_slot(n->key, m->bits) + 1; s < nb; s++)
        if (m->buckets[s]) return m->buckets[s];
    return NULL;
}

/* cl_idmap_first: the first node in table order, or NULL (empty map). */
static inline cl_idnode *cl_idmap_first(const cl_idmap *m) {
    if (m->bits == 0) return NULL;
    size_t nb = (size_t)1 << m->bits;
    for (size_t s = 0; s < nb; s++)
        if (m->buckets[s]) return m->buckets[s];
    return NULL;
}

/* cl_idmap_fini: free the buckets (the nodes are the caller's). */
static inline void cl_idmap_fini(cl_idmap *m) {
    free(m->buckets);
    m->buckets = NULL;
    m->bits = 0;
    m->count = 0;
}

#endif
