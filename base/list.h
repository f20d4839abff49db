/*
 * list.h — the one intrusive list: doubly linked through a cl_list_node
 * embedded in each element, circular around a head node, O(1) insert and
 * unlink, no allocation. Not thread-safe: the owner's lock or thread
 * protects it. (nng's src/core/list.h is the model.)
 */
#ifndef CL_BASE_LIST_H
#define CL_BASE_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cl_list_node {
    struct cl_list_node *next, *prev; /* NULL, NULL while unlinked */
} cl_list_node;

typedef struct cl_list {
    cl_list_node head;
} cl_list;

/* cl_list_init: an empty list (a zeroed cl_list must be initialised too). */
static inline void cl_list_init(cl_list *l) { l->head.next = l->head.prev = &l->head; }

static inline bool cl_list_empty(const cl_list *l) { return l->head.next == &l->head; }

/* cl_list_linked: is the node in a list? (nodes start zeroed: unlinked) */
static inline bool cl_list_linked(const cl_list_node *n) { return n->next != NULL; }

/* cl_list_insert_after / _before: link n next to `at`, a node in a list
 * (or the list's head: after it is the front, before it the back). */
static inline void cl_list_insert_after(cl_list_node *at, cl_list_node *n) {
    n->prev = at;
    n->next = at->next;
    at->next->prev = n;
    at->next = n;
}

static inline void cl_list_insert_before(cl_list_node *at, cl_list_node *n) {
    cl_list_insert_after(at->prev, n);
}

static inline void cl_list_push_front(cl_list *l, cl_list_node *n) {
    cl_list_insert_after(&l->head, n);
}

static inline void cl_list_push_back(cl_list *l, cl_list_node *n) {
    cl_list_insert_before(&l->head, n);
}

/* cl_list_remove: unlink n (a no-op for an unlinked node). */
static inline void cl_list_remove(cl_list_node *n) {
    if (!n->next) return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = NULL;
}

/* cl_list_move_all: dst (uninitialised or empty) takes every node of src,
 * in order; src is left empty. */
static inline void cl_list_move_all(cl_list *dst, cl_list *src) {
    cl_list_init(dst);
    if (cl_list_empty(src)) return;
    dst->head.next = src->head.next;
    dst->head.prev = src->head.prev;
    dst->head.next->prev = &dst->head;
    dst->head.prev->next = &dst->head;
    cl_list_init(src);
}

/* cl_list_append_all: every node of src goes to the end of dst (both
 * initialised), in order, in O(1); src is left empty. */
static inline void cl_list_append_all(cl_list *dst, cl_list *src) {
    if (cl_list_empty(src)) return;
    cl_list_node *first = src->head.next, *last = src->head.prev, *tail = dst->head.prev;
    tail->next = first;
    first->prev = tail;
    last->next = &dst->head;
    dst->head.prev = last;
    cl_list_init(src);
}

/* cl_list_first_node / _last_node: the first (last) node, or NULL for an
 * empty list. */
static inline cl_list_node *cl_list_first_node(const cl_list *l) {
    return cl_list_empty(l) ? NULL : l->head.next;
}

static inline cl_list_node *cl_list_last_node(const cl_list *l) {
    return cl_list_empty(l) ? NULL : l->head.prev;
}

/* cl_list_next_node / _prev_node: n's neighbour in l (n linked in l), or
 * NULL at the end (the start). */
static inline cl_list_node *cl_list_next_node(const cl_list *l, const cl_list_node *n) {
    return n->next == &l->head ? NULL : n->next;
}

static inline cl_list_node *cl_list_prev_node(const cl_list *l, const cl_list_node *n) {
    return n->prev == &l->head ? NULL : n->prev;
}

/* cl_list_entry: the element of type `type` whose `member` is node n. */
#define cl_list_entry(n, type, member) ((type *)((char *)(n)-offsetof(type, member)))

/* cl_list_first: the first element, or NULL. */
#define cl_list_first(l, type, member)                                                             \
    (cl_list_empty(l) ? (type *)NULL : cl_list_entry((l)->head.next, type, member))

/* cl_list_last: the last element, or NULL. */
#define cl_list_last(l, type, member)                                                              \
    (cl_list_empty(l) ? (type *)NULL : cl_list_entry((l)->head.prev, type, member))

/* cl_list_foreach: visit every element; the body may remove the current
 * one (the next node is read before the body runs). */
#define cl_list_foreach(l, it, type, member)                                                       \
    for (cl_list_node *it##_n_ = (l)->head.next, *it##_x_ = it##_n_->next;                         \
         it##_n_ != &(l)->head && ((it) = cl_list_entry(it##_n_, type, member), 1);                \
         it##_n_ = it##_x_, it##_x_ = it##_n_->next)

/* cl_list_foreach_reverse: the same, from the last element to the first. */
#define cl_list_foreach_reverse(l, it, type, member)                                               \
    for (cl_list_node *it##_n_ = (l)->head.prev, *it##_x_ = it##_n_->prev;                         \
         it##_n_ != &(l)->head && ((it) = cl_list_entry(it##_n_, type, member), 1);                \
         it##_n_ = it##_x_, it##_x_ = it##_n_->prev)

#endif
