/*
 * idmap.h — an intrusive map from 32-bit request ids to nodes embedded in
 * the caller's structs (the client's in-flight requests, a server
 * connection's waiting requests). Not thread-safe: each map belongs to one
 * thread (the engine's loop).
 */
#ifndef CL_STORE_IDMAP_H
#define CL_STORE_IDMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct cl_store_idnode {
    struct cl_store_idnode *next;
    uint32_t id;
} cl_store_idnode;

typedef struct cl_store_idmap {
    cl_store_idnode **buckets;
    size_t nbuckets; /* a power of two, or 0 before the first put */
    size_t count;
} cl_store_idmap;

/* cl_store_idmap_put: insert `n` (n->id set by the caller; ids must be
 * unique in the map). Returns COLLIE_OK or COLLIE_ENOMEM (map unchanged). */
int cl_store_idmap_put(cl_store_idmap *m, cl_store_idnode *n);

/* cl_store_idmap_get: the node with `id`, or NULL. */
cl_store_idnode *cl_store_idmap_get(const cl_store_idmap *m, uint32_t id);

/* cl_store_idmap_del: unlink and return the node with `id`, or NULL. */
cl_store_idnode *cl_store_idmap_del(cl_store_idmap *m, uint32_t id);

/* cl_store_idmap_fini: free the bucket array (the nodes are the caller's). */
void cl_store_idmap_fini(cl_store_idmap *m);

#endif
