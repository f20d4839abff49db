/*
 * nccl_split.c — children of collie_comm_split and collie_comm_new_group
 * made by ncclCommSplit of the parent's communicator.
 *
 * Design notes
 *  - ncclCommSplit is collective over the parent: every rank of the parent
 *    calls it once per split, members with their colour and key (NCCL
 *    numbers a child's ranks by key, then parent rank — as collie does),
 *    the others with NCCL_SPLIT_NOCOLOR. The core guarantees that every
 *    rank calls split or split_skip (comm/comm_split.c).
 *  - Order on the parent: a split must reach NCCL after the collectives
 *    posted on the parent before it, as on every other rank, and a
 *    non-blocking communicator takes no call while one is in progress. So
 *    the call waits until the parent has no call in progress and nothing
 *    queued: the member's poll hook retries each turn; split_skip answers
 *    COLLIE_INPROGRESS and the core calls it again (bounded, without
 *    holding the comm's lock, so the loop can drive the parent meanwhile).
 *  - After a split that returned ncclInProgress the parent counts as "a
 *    call in progress": its later posts queue (nccl_post.c) until its
 *    state leaves ncclInProgress. The child's own init is polled like
 *    ncclCommInitRankConfig's (nccl_backend.c).
 *  - The child is bound to the parent's device; it holds a reference on
 *    the parent's state until it is freed.
 */
#include <stdio.h>
#include <string.h>

#include "transports/nccl/nccl_backend.h"

int cl_nccl_split(collie_bcomm *bc, const collie_core_services *core, void *parent, int color,
                  int key, void **state) {
    cl_nccl_origin o = {.parent = parent, .color = color, .key = key};
    return cl_nccl_comm_start(bc, core, &o, state);
}

/* May a split be issued on parent p now? (p->mu) A call in progress is
 * driven by the parent's poll hook, which is on while there is one. */
static bool nccl_parent_free_locked(const cl_nccl_comm *p) {
    if (p->nccl_inprogress) return false;
    const cl_nccl_work *nw;
    cl_list_foreach(&p->pending, nw, cl_nccl_work,
                    node) if (nw->state == NCCL_W_QUEUED) return false;
    return true;
}

static bool nccl_parent_usable_locked(const cl_nccl_comm *p) {
    return p->phase == NCCL_READY && !p->aborting && p->comm != NULL;
}

/* ncclCommSplit on p (p->mu, p free). A call left in progress makes p's
 * later posts queue. */
static ncclResult_t nccl_split_call_locked(cl_nccl_comm *p, int color, int key, const char *name,
                                           ncclComm_t *child) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* the child inherits non-blocking behaviour */
    cfg.commName = name;
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && prev != p->dev) cudaSetDevice(p->dev);
    *child = NULL;
    ncclResult_t r = ncclCommSplit(p->comm, color, key, child, &cfg);
    if (r == ncclInProgress) p->nccl_inprogress = true;
    if (prev >= 0 && prev != p->dev) cudaSetDevice(prev);
    return r;
}

void cl_nccl_split_poll(cl_nccl_comm *nc) {
    cl_nccl_comm *p = nc->parent;
    pthread_mutex_lock(&nc->mu);
    bool go = nc->phase == NCCL_UID && !nc->aborting;
    pthread_mutex_unlock(&nc->mu);
    if (!go) return;
    enum { BUSY, CALLED, DEAD } what = BUSY;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclSuccess;
    char err[300] = "";
    pthread_mutex_lock(&p->mu);
    if (!nccl_parent_usable_locked(p)) {
        what = DEAD;
    } else if (nccl_parent_free_locked(p)) {
        what = CALLED;
        r = nccl_split_call_locked(p, nc->split_color, nc->split_key, nc->core->name(nc->bc),
                                   &comm);
        if (r != ncclSuccess && r != ncclInProgress) cl_nccl_strerror(r, p->comm, err, sizeof err);
    }
    pthread_mutex_unlock(&p->mu);
    if (what == BUSY) return; /* the next poll turn tries again (init's bound applies) */
    if (what == DEAD) {
        cl_nccl_init_fail(nc, COLLIE_EABORTED,
                          "ncclCommSplit: the parent comm's NCCL communicator was aborted");
        return;
    }
    if (r == ncclInProgress) cl_nccl_poll_set(p, true); /* the parent's state is polled */
    if (r != ncclSuccess && r != ncclInProgress) {
        char why[400];
        snprintf(why, sizeof why, "ncclCommSplit (colour %d, key %d): %s", nc->split_color,
                 nc->split_key, err);
        cl_nccl_init_fail(nc, COLLIE_EBACKEND, why);
        return;
    }
    pthread_mutex_lock(&nc->mu);
    bool keep = nc->phase == NCCL_UID && !nc->aborting;
    if (keep) {
        nc->comm = comm;
        nc->phase = NCCL_INIT;
    }
    pthread_mutex_unlock(&nc->mu);
    if (!keep && comm) cl_nccl_comm_release_async(nc, comm); /* aborted meanwhile */
    if (keep && !comm) /* NCCL gave no child for a colour >= 0 */
        cl_nccl_init_fail(nc, COLLIE_EBACKEND, "ncclCommSplit returned no communicator");
}

int cl_nccl_split_skip(void *state, int key) {
    cl_nccl_comm *p = state;
    ncclComm_t none;
    char err[300] = "";
    pthread_mutex_lock(&p->mu);
    if (!nccl_parent_usable_locked(p)) {
        pthread_mutex_unlock(&p->mu);
        p->core->set_error("the NCCL communicator was aborted");
        return COLLIE_EABORTED;
    }
    if (!nccl_parent_free_locked(p)) {
        pthread_mutex_unlock(&p->mu);
        return COLLIE_INPROGRESS; /* the core calls again (bounded) */
    }
    ncclResult_t r =
        nccl_split_call_locked(p, NCCL_SPLIT_NOCOLOR, key, p->core->name(p->bc), &none);
    if (r != ncclSuccess && r != ncclInProgress) cl_nccl_strerror(r, p->comm, err, sizeof err);
    pthread_mutex_unlock(&p->mu);
    if (r == ncclInProgress) cl_nccl_poll_set(p, true);
    if (r != ncclSuccess && r != ncclInProgress) {
        p->core->set_error("ncclCommSplit (no colour): %s", err);
        return COLLIE_EBACKEND;
    }
    return COLLIE_OK;
}
