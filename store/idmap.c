/*
 * idmap.c — chained hash map of request ids (see idmap.h).
 *
 * Design notes: ids are mostly sequential, so a multiplicative (Fibonacci)
 * hash spreads them well; the table doubles at load factor 1 and never
 * shrinks (a connection's peak is a good guess for its future).
 */
#include "store/idmap.h"

#include <stdlib.h>

#include "collie.h"

static size_t store_idmap_slot(uint32_t id, size_t nbuckets) {
    return (size_t)((id * 2654435769u) >> 7) & (nbuckets - 1);
}

static int store_idmap_grow(cl_store_idmap *m) {
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 16;
    cl_store_idnode **b = calloc(nb, sizeof *b);
    if (!b) return COLLIE_ENOMEM;
    for (size_t i = 0; i < m->nbuckets; i++) {
        cl_store_idnode *n = m->buckets[i];
        while (n) {
            cl_store_idnode *next = n->next;
            size_t s = store_idmap_slot(n->id, nb);
            n->next = b[s];
            b[s] = n;
            n = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
    return COLLIE_OK;
}

int cl_store_idmap_put(cl_store_idmap *m, cl_store_idnode *n) {
    if (m->count >= m->nbuckets && store_idmap_grow(m) != COLLIE_OK && m->nbuckets == 0)
        return COLLIE_ENOMEM; /* a failed grow of a non-empty map just costs speed */
    size_t s = store_idmap_slot(n->id, m->nbuckets);
    n->next = m->buckets[s];
    m->buckets[s] = n;
    m->count++;
    return COLLIE_OK;
}

cl_store_idnode *cl_store_idmap_get(const cl_store_idmap *m, uint32_t id) {
    if (m->nbuckets == 0) return NULL;
    for (cl_store_idnode *n = m->buckets[store_idmap_slot(id, m->nbuckets)]; n; n = n->next)
        if (n->id == id) return n;
    return NULL;
}

cl_store_idnode *cl_store_idmap_del(cl_store_idmap *m, uint32_t id) {
    if (m->nbuckets == 0) return NULL;
    cl_store_idnode **pp = &m->buckets[store_idmap_slot(id, m->nbuckets)];
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            cl_store_idnode *n = *pp;
            *pp = n->next;
            n->next = NULL;
            m->count--;
            return n;
        }
    }
    return NULL;
}

void cl_store_idmap_fini(cl_store_idmap *m) {
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = m->count = 0;
}
