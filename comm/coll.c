/*
 * coll.c — the public collective calls: argument validation, work
 * creation, sequence numbers, hand-off to the engine.
 *
 * Design notes
 *  - Everything is checked on the caller's thread before anything happens:
 *    a rejected call returns its error (COLLIE_EINVAL for an argument,
 *    ENOTSUP for what the backend cannot do, EABORTED on a failed comm,
 *    ENOTMEMBER on a rank a shrink left out; collie_last_error says which)
 *    and leaves no trace but the note in c->refused (below).
 *  - Collectives and point-to-point operations have separate sequence
 *    counters: every rank must agree on collective sequence numbers even
 *    when only some ranks exchange point-to-point messages.
 *  - The sequence number is taken and the work queued under the comm's
 *    mutex, so the loop starts works in sequence order even when several
 *    threads post on one comm. A POST_ON_CALLER backend (NCCL) is started
 *    on the posting thread under that mutex instead (coll_start_on_caller);
 *    the others may be started by the posting thread itself, while the
 *    loop is between two turns (cl_engine_assist, engine/assist.c), in
 *    the command queue's order.
 *  - The end of a collective, every step of it, is in coll_end.c; its
 *    cancel (anyone but its backend ending it) in coll_cancel.c.
 *  - A refused collective post (bad arguments, a backend that refused it)
 *    is remembered in the comm (c->refused, under c->mu: what and why) for
 *    this rank's desync answers (comm_ctl.c): the peers that posted it wait
 *    for a collective this rank never made, and their report says why.
 *    A collective completed after it (last_completed past refused_after)
 *    makes it old news; the healthy path never touches it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/coll_args.h"
#include "comm/comm.h"
#include "engine/engine.h"

static void coll_start(collie_work *w) {
    ((cl_coll_work *)w)->start_called = true;
    cl_comm_start_work((cl_coll_work *)w);
}

#define COLL_POOL_MAX 512

void cl_coll_pool_init(collie_bcomm *bc) {
    pthread_mutex_init(&bc->pool_mu, NULL);
    cl_list_init(&bc->pool);
}

void cl_coll_pool_fini(collie_bcomm *bc) {
    cl_coll_work *cw;
    cl_list_foreach(&bc->pool, cw, cl_coll_work, pool_node) {
        cl_list_remove(&cw->pool_node);
        free(cw);
    }
    pthread_mutex_destroy(&bc->pool_mu);
}

static cl_coll_work *coll_alloc(collie_bcomm *bc) {
    size_t size = sizeof(cl_coll_work) + bc->ops->work_data_size;
    pthread_mutex_lock(&bc->pool_mu);
    cl_coll_work *cw = cl_list_first(&bc->pool, cl_coll_work, pool_node);
    if (cw) {
        cl_list_remove(&cw->pool_node);
        bc->pool_n--;
    }
    pthread_mutex_unlock(&bc->pool_mu);
    if (!cw) return calloc(1, size);
    memset(cw, 0, size);
    return cw;
}

static void coll_free(collie_work *w) {
    cl_coll_work *cw = (cl_coll_work *)w;
    collie_comm *c = cw->comm;
    collie_bcomm *bc = cw->bc;
    free(cw->vcounts);
    cw->vcounts = NULL;
    pthread_mutex_lock(&bc->pool_mu);
    if (bc->pool_n < COLL_POOL_MAX) {
        cl_list_push_front(&bc->pool, &cw->pool_node);
        bc->pool_n++;
        cw = NULL;
    }
    pthread_mutex_unlock(&bc->pool_mu);
    free(cw);
    cl_comm_release(c); /* may free the comm and its pool */
}

/* A timed-out collective asks the other ranks how far they got before it
 * fails (desync.c); a waiter gives the loop this long to do that. */
#define COLL_CANCEL_GRACE_MS 1500

static const cl_work_ops cl_coll_ops_template = {
    .name = NULL,
    .start = coll_start,
    .detach = cl_coll_end_on_loop, /* the end: coll_end.c */
    .free = coll_free,
    .cancel = cl_coll_cancel,
    .cancel_grace_ms = COLL_CANCEL_GRACE_MS,
};

static cl_work_ops cl_coll_ops[COLLIE_COLL_NUM_KINDS];
static pthread_once_t cl_coll_ops_once = PTHREAD_ONCE_INIT;

static void coll_ops_init(void) {
    for (int k = 0; k < COLLIE_COLL_NUM_KINDS; k++) {
        cl_coll_ops[k] = cl_coll_ops_template;
        cl_coll_ops[k].name = collie_coll_kind_name((collie_coll_kind)k);
    }
}

/* ---- validation ----------------------------------------------------------- */

static int coll_check(collie_comm *c, const collie_coll_args *a, int dev, collie_work **out) {
    const char *op = collie_coll_kind_name(a->kind);
    if (out) *out = NULL;
    if (!c || !out) return cl_set_last_error(COLLIE_EINVAL, "%s: comm and out are required", op);
    if (a->kind != COLLIE_COLL_BARRIER && !cl_dtype_valid(a->dtype))
        return cl_set_last_error(COLLIE_EINVAL, "%s: invalid dtype %d", op, (int)a->dtype);
    bool reduces = a->kind == COLLIE_COLL_ALLREDUCE || a->kind == COLLIE_COLL_REDUCE ||
                   a->kind == COLLIE_COLL_REDUCE_SCATTER;
    if (reduces && !cl_redop_valid(a->op))
        return cl_set_last_error(COLLIE_EINVAL, "%s: invalid reduction op %d", op, (int)a->op);
    size_t es = a->kind == COLLIE_COLL_BARRIER ? 1 : collie_dtype_size(a->dtype);
    size_t n = (size_t)c->size;
    /* the largest buffer any rank touches: count * size elements */
    if (a->count > SIZE_MAX / es / n || a->count * es * n > (size_t)INT64_MAX)
        return cl_set_last_error(COLLIE_EINVAL, "%s: count %zu overflows the buffer size", op,
                                 a->count);
    bool rooted = a->kind == COLLIE_COLL_BROADCAST || a->kind == COLLIE_COLL_REDUCE ||
                  a->kind == COLLIE_COLL_GATHER || a->kind == COLLIE_COLL_SCATTER;
    if (rooted && (a->root < 0 || a->root >= c->size))
        return cl_set_last_error(COLLIE_EINVAL, "%s: root %d is not a rank of comm '%s' (size %d)",
                                 op, a->root, c->name, c->size);
    bool p2p = a->kind == COLLIE_COLL_SEND || a->kind == COLLIE_COLL_RECV;
    bool any = a->kind == COLLIE_COLL_RECV && a->peer == COLLIE_ANY_SOURCE;
    if (p2p && !any && (a->peer < 0 || a->peer >= c->size || a->peer == c->rank))
        return cl_set_last_error(
            COLLIE_EINVAL, "%s: peer %d must be another rank of comm '%s' (size %d)%s%s", op,
            a->peer, c->name, c->size, a->kind == COLLIE_COLL_RECV ? " or COLLIE_ANY_SOURCE" : "",
            a->peer == c->rank ? ": a message to one's own rank is not supported (copy locally)"
                               : "");
    if (a->count > 0) {
        bool is_root = rooted && a->root == c->rank;
        bool need_send = true, need_recv = true;
        switch (a->kind) {
        case COLLIE_COLL_REDUCE:
        case COLLIE_COLL_GATHER: need_recv = is_root; break;
        case COLLIE_COLL_SCATTER: need_send = is_root; break;
        case COLLIE_COLL_SEND: need_recv = false; break;
        case COLLIE_COLL_RECV: need_send = false; break;
        case COLLIE_COLL_BARRIER: need_send = need_recv = false; break;
        default: break;
        }
        if (need_send && !a->sendbuf)
            return cl_set_last_error(COLLIE_EINVAL, "%s: send buffer is NULL", op);
        if (need_recv && !a->recvbuf)
            return cl_set_last_error(COLLIE_EINVAL, "%s: receive buffer is NULL", op);
    }
    if (!c->spec.ops[dev])
        return cl_set_last_error(COLLIE_ENOTSUP, "%s: comm '%s' has no %s backend", op, c->name,
                                 dev == CL_DEV_CPU ? "cpu" : "cuda");
    if (any && !(c->spec.ops[dev]->flags & COLLIE_BACKEND_ANY_SOURCE))
        return cl_set_last_error(COLLIE_ENOTSUP,
                                 "%s: backend %s of comm '%s' cannot receive from any source", op,
                                 c->spec.ops[dev]->name, c->name);
    if (collie_coll_is_v(a->kind) && !(c->spec.ops[dev]->flags & COLLIE_BACKEND_V_COLLECTIVES))
        return cl_set_last_error(COLLIE_ENOTSUP,
                                 "%s: backend %s of comm '%s' does not implement it", op,
                                 c->spec.ops[dev]->name, c->name);
    /* A fault recorded but not yet applied by the loop (a deadline seen at
     * publication) fails posts too: a waiter that just got the root error
     * must not have its next post accepted, then aborted. */
    if (atomic_load_explicit(&c->excluded, memory_order_relaxed))
        return cl_set_last_error(COLLIE_ENOTMEMBER,
                                 "%s: rank %d was left out of comm '%s' by the survivors' shrink",
                                 op, c->rank, c->name);
    int st = atomic_load_explicit(&c->err_status, memory_order_acquire);
    if (st != COLLIE_OK && (atomic_load(&c->state) == CL_COMM_FAILED ||
                            (c->policy != COLLIE_POLICY_NONE &&
                             atomic_load_explicit(&c->fault_unapplied, memory_order_acquire))))
        return cl_set_last_error(COLLIE_EABORTED, "%s: comm '%s' has failed: %s", op, c->name,
                                 c->err_msg);
    return COLLIE_OK;
}

/* Start a work of a POST_ON_CALLER backend on this thread (under c->mu,
 * so the backend sees posts in sequence order). */
static int coll_start_on_caller(cl_coll_work *cw) {
    collie_comm *c = cw->comm;
    collie_bcomm *bc = cw->bc;
    if (atomic_load_explicit(&c->state, memory_order_acquire) != CL_COMM_READY)
        return cl_set_last_error(COLLIE_ESTATE,
                                 "%s: comm '%s' is not ready (wait for its create work)",
                                 cw->base.ops->name, c->name);
    if (cl_engine_closing(c->engine))
        return cl_set_last_error(COLLIE_ECLOSED, "%s: the engine is shutting down",
                                 cw->base.ops->name);
    cw->caller_started = true;
    int r = bc->ops->start(bc->state, &cw->base, &cw->args);
    if (r != COLLIE_OK) {
        cw->caller_started = false;
        if (!collie_last_error()[0])
            cl_set_last_error(r, "%s: backend %s refused it", cw->base.ops->name, bc->ops->name);
    }
    return r;
}

/* Remember a refused collective post for the desync answers (the notes
 * above): "allreduce of 4 x fp32 (sum): receive buffer is NULL". Any
 * thread; `locked`: the caller holds c->mu. */
static void coll_note_refused(collie_comm *c, const collie_coll_args *a, bool locked) {
    if (!c || a->kind == COLLIE_COLL_SEND || a->kind == COLLIE_COLL_RECV) return;
    char what[128];
    bool typed = a->kind == COLLIE_COLL_BARRIER || cl_dtype_valid(a->dtype);
    collie_coll_describe(what, sizeof what, a->kind, a->count,
                         typed ? collie_dtype_name(a->dtype) : "?",
                         cl_redop_valid(a->op) ? collie_redop_name(a->op) : "?", a->root);
    const char *why = collie_last_error(), *op = collie_coll_kind_name(a->kind);
    size_t n = strlen(op);
    if (strncmp(why, op, n) == 0 && why[n] == ':' && why[n + 1] == ' ') why += n + 2;
    if (!locked) pthread_mutex_lock(&c->mu);
    snprintf(c->refused, sizeof c->refused, "%s: %s", what, *why ? why : "refused");
    c->refused_after = c->next_seq;
    if (!locked) pthread_mutex_unlock(&c->mu);
}

/* A post refused after it took its sequence number (under c->mu): the
 * number is given back and the refusal recorded. */
static void coll_unpost(collie_comm *c, cl_coll_work *cw, const collie_coll_args *a, bool p2p,
                        int r) {
    cl_flight_refused(c, cw, r, collie_last_error());
    if (p2p) {
        c->next_p2p_seq--;
    } else {
        c->next_seq--;
        atomic_store(&c->last_posted, c->next_seq);
        coll_note_refused(c, a, true);
    }
    atomic_fetch_sub(&c->nactive, 1);
}

int cl_coll_post(collie_comm *c, const collie_coll_args *a, int dev, const collie_post_opts *o,
                 collie_work **out) {
    cl_clear_last_error();
    int r = coll_check(c, a, dev, out);
    if (r != COLLIE_OK) {
        if (c && out) coll_note_refused(c, a, false);
        return r;
    }
    /* a comm a forked child inherited: its links and shared memory are the
     * parent's (a post on the caller would write into them) */
    if (cl_engine_forked(c->engine)) return cl_engine_forked_error(c->engine, "collective");
    collie_coll_args va;
    size_t *vown = NULL;
    if (collie_coll_is_v(a->kind)) { /* the counts checked and copied */
        va = *a;
        if ((r = cl_coll_v_prepare(c, &va, &vown)) != COLLIE_OK) {
            coll_note_refused(c, a, false);
            return r;
        }
        a = &va;
    }
    pthread_once(&cl_coll_ops_once, coll_ops_init);
    collie_bcomm *bc = &c->bcs[dev];
    cl_coll_work *cw = coll_alloc(bc);
    if (!cw) {
        free(vown);
        return COLLIE_ENOMEM;
    }
    r = cl_work_init(&cw->base, c->engine, &cl_coll_ops[a->kind], o, c->timeout_ms);
    if (r != COLLIE_OK) {
        free(vown);
        free(cw); /* never posted: not pooled */
        return r;
    }
    cw->comm = c;
    cw->bc = bc;
    cw->args = *a;
    cw->vcounts = vown;
    cw->source = a->kind == COLLIE_COLL_RECV ? a->peer : -1;
    size_t es = a->kind == COLLIE_COLL_BARRIER ? 0 : collie_dtype_size(a->dtype);
    /* this rank's payload: allgatherv's own block, not the whole result */
    size_t mine = a->kind == COLLIE_COLL_ALLGATHERV ? a->recvcounts[c->rank] : a->count;
    cw->base.bytes = mine * es;
    cl_comm_hold(c);
    bool p2p = a->kind == COLLIE_COLL_SEND || a->kind == COLLIE_COLL_RECV;
    bool on_caller = (bc->ops->flags & COLLIE_BACKEND_POST_ON_CALLER) != 0;
    pthread_mutex_lock(&c->mu);
    cw->base.seq = p2p ? ++c->next_p2p_seq : ++c->next_seq;
    if (!p2p) atomic_store(&c->last_posted, cw->base.seq);
    atomic_fetch_add(&c->nactive, 1);
    cl_flight_post(c, cw);
    r = on_caller ? coll_start_on_caller(cw) : COLLIE_OK;
    if (r == COLLIE_OK) {
        cl_stats_posted(c, 1);                     /* before the loop can end it */
        cw->base.start_cmd.assist_ok = !on_caller; /* a helper may start it */
        r = cl_work_post(&cw->base);
        if (r != COLLIE_OK) cl_stats_posted(c, -1);
    }
    if (r == COLLIE_OK && dev == CL_DEV_CUDA) cl_check_args_note(c, a, cw->base.seq);
    if (r != COLLIE_OK) coll_unpost(c, cw, a, p2p, r);
    pthread_mutex_unlock(&c->mu);
    if (r != COLLIE_OK) {
        cl_comm_release(c);
        free(cw->vcounts);
        free(cw);
        return r;
    }
    *out = &cw->base;
    /* start it here if the loop is between two turns (engine/assist.c):
     * the command queue keeps the post order */
    if (!on_caller) cl_engine_assist(c->engine);
    return COLLIE_OK;
}

static int coll_post(collie_comm *c, const collie_coll_args *a, const collie_post_opts *o,
                     collie_work **out) {
    return cl_coll_post(c, a, CL_DEV_CPU, o, out);
}

bool cl_coll_is_work(const collie_work *w) {
    pthread_once(&cl_coll_ops_once, coll_ops_init);
    return w && w->ops >= &cl_coll_ops[0] && w->ops < &cl_coll_ops[COLLIE_COLL_NUM_KINDS];
}

/* ---- the public calls ----------------------------------------------------------- */

int collie_allreduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                     collie_dtype dt, collie_redop op, const collie_post_opts *o,
                     collie_work **out) {
    collie_coll_args a = cl_args_allreduce(sendbuf, recvbuf, count, dt, op);
    return coll_post(c, &a, o, out);
}

int collie_broadcast(collie_comm *c, void *buf, size_t count, collie_dtype dt, int root,
                     const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_broadcast(buf, count, dt, root);
    return coll_post(c, &a, o, out);
}

int collie_reduce(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count, collie_dtype dt,
                  collie_redop op, int root, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_reduce(sendbuf, recvbuf, count, dt, op, root);
    return coll_post(c, &a, o, out);
}

int collie_allgather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                     collie_dtype dt, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_ALLGATHER, sendbuf, recvbuf, count, dt, 0);
    return coll_post(c, &a, o, out);
}

int collie_reduce_scatter(collie_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                          collie_dtype dt, collie_redop op, const collie_post_opts *o,
                          collie_work **out) {
    collie_coll_args a = cl_args_reduce_scatter(sendbuf, recvbuf, recvcount, dt, op);
    return coll_post(c, &a, o, out);
}

int collie_alltoall(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                    collie_dtype dt, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_ALLTOALL, sendbuf, recvbuf, count, dt, 0);
    return coll_post(c, &a, o, out);
}

int collie_gather(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count, collie_dtype dt,
                  int root, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_GATHER, sendbuf, recvbuf, count, dt, root);
    return coll_post(c, &a, o, out);
}

int collie_scatter(collie_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                   collie_dtype dt, int root, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_blocks(COLLIE_COLL_SCATTER, sendbuf, recvbuf, count, dt, root);
    return coll_post(c, &a, o, out);
}

int collie_barrier(collie_comm *c, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_barrier();
    return coll_post(c, &a, o, out);
}

int collie_allgatherv(collie_comm *c, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                      const size_t *displs, collie_dtype dt, const collie_post_opts *o,
                      collie_work **out) {
    collie_coll_args a = cl_args_allgatherv(sendbuf, recvbuf, recvcounts, displs, dt);
    return coll_post(c, &a, o, out);
}

int collie_alltoallv(collie_comm *c, const void *sendbuf, const size_t *sendcounts,
                     const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                     const size_t *rdispls, collie_dtype dt, const collie_post_opts *o,
                     collie_work **out) {
    collie_coll_args a =
        cl_args_alltoallv(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt);
    return coll_post(c, &a, o, out);
}

int collie_send(collie_comm *c, const void *buf, size_t count, collie_dtype dt, int peer,
                uint64_t tag, const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_p2p(COLLIE_COLL_SEND, buf, NULL, count, dt, peer, tag);
    return coll_post(c, &a, o, out);
}

int collie_recv(collie_comm *c, void *buf, size_t count, collie_dtype dt, int peer, uint64_t tag,
                const collie_post_opts *o, collie_work **out) {
    collie_coll_args a = cl_args_p2p(COLLIE_COLL_RECV, NULL, buf, count, dt, peer, tag);
    return coll_post(c, &a, o, out);
}

int collie_work_source(const collie_work *w) {
    if (!w || w->ops->start != coll_start) return -1; /* not a collective's work */
    const cl_coll_work *cw = (const cl_coll_work *)w;
    if (cw->args.kind != COLLIE_COLL_RECV) return -1;
    if (cw->args.peer != COLLIE_ANY_SOURCE) return cw->args.peer;
    return cl_work_done(w) ? cw->source : -1; /* written before the end was published */
}
