/*
 * nccl_shrink.c — comms of collie_comm_shrink built by ncclCommShrink of the
 * old comm's NCCL communicator (or by a fresh init), and the NCCL functions
 * looked up at run time.
 *
 * Design notes
 *  - Versions: ncclCommShrink came with NCCL 2.27, ncclCommRevoke with 2.28
 *    (this image's 2.28.9 has both); ncclCommGrow (2.29) is not used: a
 *    grown comm is a fresh init. Both are looked up at run time, so the
 *    plugin links and loads against any NCCL 2.x: in the library the
 *    plugin's own NCCL calls bind to (dladdr of ncclCommInitRankConfig:
 *    torch's libnccl.so.2 when torch loaded it first, RTLD_LOCAL), else
 *    RTLD_DEFAULT. Without ncclCommShrink a shrink is a fresh init; without
 *    ncclCommRevoke an abort is ncclCommAbort (nccl_abort.c), and so is a
 *    shrink then too.
 *  - ncclCommShrink needs the old communicator alive and quiescent: the
 *    comm's abort (every shrink aborts the old comm first) revoked it and
 *    kept it. It is collective over the survivors, so all of them take
 *    that path or all init afresh, and whether a rank can differs (a revoke
 *    NCCL refused or that overran the abort bound, another NCCL): they
 *    vote through the store, under the new comm's namespace. Once its old
 *    comm's abort is over, each rank but 0 writes "nccl/shrink/<rank>"
 *    ("1", or "0<why>"); rank 0 reads them in rank order and writes the
 *    decision "nccl/how": "S" (ncclCommShrink) or "I" + a unique id (a
 *    fresh ncclCommInitRankConfig), which the others read. O(size) store
 *    messages, each get bounded by what is left of init's bound.
 *  - "S": ncclCommShrink(old, excluded, n, &comm, {non-blocking, the new
 *    comm's name}, NCCL_SHRINK_ABORT) on the old comm's device (a process
 *    keeps its GPU), polled like any init. NCCL_SHRINK_ABORT because the
 *    old communicator failed: NCCL shares none of its resources; the stream
 *    synchronisation it makes is immediate, the revoke having quiesced it.
 *    NCCL renumbers the survivors in old rank order, as collie does
 *    (checked once ready: nccl_backend.c).
 *  - The new comm holds the old comm's state until its own NCCL init is
 *    over (ready, failed, or the fresh init chosen), and counts as one of
 *    its shrink_users: the old comm may be destroyed meanwhile, its revoked
 *    communicator stays until the last of them lets go (then released off
 *    the loop, as destroy would have).
 *  - NCCL refuses two ranks on one GPU, so a real shrink needs a GPU per
 *    rank: it is tested on the CPU double only (tests/test_nccl.c).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/nccl/nccl_backend.h"

#define NCCL_HOW_KEY "nccl/how"

typedef ncclResult_t (*nccl_shrink_fn)(ncclComm_t comm, int *excl, int n, ncclComm_t *newcomm,
                                       ncclConfig_t *config, int flags);

static struct {
    pthread_once_t once;
    nccl_shrink_fn shrink;
    cl_nccl_revoke_fn revoke;
} nccl_syms = {.once = PTHREAD_ONCE_INIT};

static void *nccl_sym(void *lib, const char *name) {
    void *p = lib ? dlsym(lib, name) : NULL;
    return p ? p : dlsym(RTLD_DEFAULT, name);
}

static void nccl_syms_resolve(void) {
    Dl_info di;
    void *lib = NULL; /* the libnccl our calls bind to; NOLOAD: it is loaded */
    if (dladdr((void *)(uintptr_t)&ncclCommInitRankConfig, &di) && di.dli_fname)
        lib = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    nccl_syms.shrink = (nccl_shrink_fn)(uintptr_t)nccl_sym(lib, "ncclCommShrink");
    nccl_syms.revoke = (cl_nccl_revoke_fn)(uintptr_t)nccl_sym(lib, "ncclCommRevoke");
    if (lib) dlclose(lib); /* drops the reference NOLOAD took */
}

cl_nccl_revoke_fn cl_nccl_sym_revoke(const collie_core_services *core) {
    (void)core;
    pthread_once(&nccl_syms.once, nccl_syms_resolve);
    return nccl_syms.revoke;
}

static nccl_shrink_fn nccl_sym_shrink(void) {
    pthread_once(&nccl_syms.once, nccl_syms_resolve);
    return nccl_syms.shrink;
}

int cl_nccl_shrink(collie_bcomm *bc, const collie_core_services *core, void *old,
                   const int *excluded, int nexcluded, void **state) {
    /* NCCL shrinks by at least one rank (the agreed set: alike everywhere) */
    if (!COLLIE_CORE_USABLE(core) || nexcluded < 1) return COLLIE_ENOTSUP;
    cl_nccl_origin o = {.shrink_from = old, .excluded = excluded, .nexcluded = nexcluded};
    return cl_nccl_comm_start(bc, core, &o, state);
}

void cl_nccl_shrink_unuse(cl_nccl_comm *from) {
    pthread_mutex_lock(&from->mu);
    ncclComm_t revoked = --from->shrink_users == 0 && from->destroyed ? from->revoked : NULL;
    if (revoked) from->revoked = NULL;
    pthread_mutex_unlock(&from->mu);
    if (revoked) cl_nccl_comm_release_async(from, revoked);
    cl_nccl_release(from);
}

void cl_nccl_shrink_let_go(cl_nccl_comm *nc) {
    pthread_mutex_lock(&nc->mu);
    cl_nccl_comm *from = nc->shrink_from;
    nc->shrink_from = NULL;
    pthread_mutex_unlock(&nc->mu);
    if (from) cl_nccl_shrink_unuse(from);
}

/* ---- the vote ------------------------------------------------------------------------ */

enum { V_MINE, V_HOW, V_VOTE, V_TELL }; /* the store request in flight */

/* Can this rank shrink from its old comm? 1 yes, 0 no (why says why), -1
 * not known yet (its abort is still quiescing it). */
static int nccl_old_ready(cl_nccl_comm *nc, char *why, size_t len) {
    cl_nccl_comm *o = nc->shrink_from;
    pthread_mutex_lock(&o->mu);
    bool aborting = o->aborting, done = o->abort_done;
    bool revoked = o->revoked != NULL;
    pthread_mutex_unlock(&o->mu);
    if (aborting && !done) return -1;
    if (!nccl_sym_shrink())
        snprintf(why, len, "this NCCL has no ncclCommShrink (before 2.27)");
    else if (!aborting)
        snprintf(why, len, "the old comm's NCCL communicator was never aborted");
    else if (!revoked)
        snprintf(why, len, "the old comm's NCCL communicator was aborted, not revoked (%s)",
                 cl_nccl_sym_revoke(nc->core) ? "ncclCommRevoke failed or overran the bound"
                                              : "no ncclCommRevoke: NCCL before 2.28");
    return why[0] ? 0 : 1;
}

static void nccl_shrink_on_store(collie_work *w, void *arg);

static void nccl_vote_post(cl_nccl_comm *nc, int step, int kind, const char *key, const void *val,
                           size_t len) {
    nc->vote_step = step;
    cl_nccl_store_post(nc, kind, key, val, len, nccl_shrink_on_store);
}

/* ncclCommShrink of the old communicator (loop, phase NCCL_UID) */
static void nccl_shrink_call(cl_nccl_comm *nc) {
    cl_nccl_comm *o = nc->shrink_from;
    pthread_mutex_lock(&o->mu);
    ncclComm_t parent = o->revoked; /* kept until o's last reference: ours among them */
    pthread_mutex_unlock(&o->mu);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = nc->core->name(nc->bc);
    char err[300] = "no revoked communicator";
    pthread_mutex_lock(&nc->mu);
    if (nc->aborting || nc->phase != NCCL_UID) {
        pthread_mutex_unlock(&nc->mu);
        return;
    }
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && prev != nc->dev) cudaSetDevice(nc->dev);
    ncclComm_t comm = NULL;
    ncclResult_t r = parent ? nccl_sym_shrink()(parent, nc->shrink_excl, nc->shrink_nexcl, &comm,
                                                &cfg, NCCL_SHRINK_ABORT)
                            : ncclInvalidUsage;
    if (prev >= 0 && prev != nc->dev) cudaSetDevice(prev);
    bool ok = r == ncclSuccess || r == ncclInProgress;
    if (ok) {
        nc->comm = comm;
        nc->phase = NCCL_INIT;
        nc->shrunk = true;
    } else if (parent) {
        cl_nccl_strerror(r, parent, err, sizeof err);
    }
    pthread_mutex_unlock(&nc->mu);
    if (!ok) {
        char why[400];
        snprintf(why, sizeof why, "ncclCommShrink (leaving out %d rank%s): %s", nc->shrink_nexcl,
                 nc->shrink_nexcl == 1 ? "" : "s", err);
        cl_nccl_shrink_let_go(nc);
        cl_nccl_init_fail(nc, COLLIE_EBACKEND, why);
        return;
    }
    NCCL_LOG(nc, 2, "ncclCommShrink of the old comm's communicator (leaving out %d rank%s)",
             nc->shrink_nexcl, nc->shrink_nexcl == 1 ? "" : "s");
    cl_nccl_poll_set(nc, true);
}

/* The decision is known (loop): ncclCommShrink, or a fresh init with the
 * unique id of rank 0 (copied into nc->uid by then). */
static void nccl_shrink_act(cl_nccl_comm *nc, bool shrink) {
    if (shrink) {
        nccl_shrink_call(nc);
        return;
    }
    NCCL_LOG(nc, 2, "a fresh NCCL init instead of ncclCommShrink: %s",
             nc->vote_no[0] ? nc->vote_no : "rank 0 said so");
    cl_nccl_shrink_let_go(nc);
    cl_nccl_comm_init(nc);
}

/* rank 0: read the next vote, or tell the decision */
static void nccl_vote_next(cl_nccl_comm *nc) {
    if (nc->vote_next < nc->size) {
        char key[48];
        snprintf(key, sizeof key, "nccl/shrink/%d", nc->vote_next);
        nccl_vote_post(nc, V_VOTE, 'g', key, NULL, 0);
        return;
    }
    if (nc->size == 1) {
        nccl_shrink_act(nc, !nc->vote_no[0]);
        return;
    }
    unsigned char how[1 + sizeof(ncclUniqueId) + sizeof nc->vote_no];
    size_t len = 1;
    how[0] = nc->vote_no[0] ? 'I' : 'S';
    if (how[0] == 'I') { /* the unique id, and why */
        memcpy(how + 1, &nc->uid, sizeof nc->uid);
        size_t wl = strlen(nc->vote_no);
        memcpy(how + 1 + sizeof nc->uid, nc->vote_no, wl);
        len = 1 + sizeof nc->uid + wl;
    }
    nccl_vote_post(nc, V_TELL, 's', NCCL_HOW_KEY, how, len);
}

static void nccl_shrink_on_store(collie_work *w, void *arg) {
    int st;
    cl_nccl_comm *nc = cl_nccl_store_done(w, arg, &st);
    if (!nc) return;
    if (st != COLLIE_OK) {
        cl_nccl_store_failed(nc, w, st, "agreeing on ncclCommShrink");
        return;
    }
    const void *val = NULL;
    size_t len = 0;
    if (nc->vote_step == V_HOW || nc->vote_step == V_VOTE) nc->core->store_value(w, &val, &len);
    const char *v = val;
    switch (nc->vote_step) {
    case V_MINE:
        nc->core->work_release(w);
        nccl_vote_post(nc, V_HOW, 'g', NCCL_HOW_KEY, NULL, 0);
        return;
    case V_VOTE:
        if ((len < 1 || v[0] != '1') && !nc->vote_no[0])
            snprintf(nc->vote_no, sizeof nc->vote_no, "rank %d: %.*s", nc->vote_next,
                     len > 1 ? (int)(len - 1) : 0, len > 1 ? v + 1 : "");
        nc->vote_next++;
        nc->core->work_release(w);
        nccl_vote_next(nc);
        return;
    case V_TELL:
        nc->core->work_release(w);
        nccl_shrink_act(nc, !nc->vote_no[0]);
        return;
    default: break; /* V_HOW */
    }
    bool shrink = len == 1 && v[0] == 'S';
    if (!shrink && (len < 1 + sizeof(ncclUniqueId) || v[0] != 'I')) {
        nc->core->work_release(w);
        cl_nccl_init_fail(nc, COLLIE_EPROTO,
                          "the ncclCommShrink decision in the store is malformed");
        return;
    }
    if (!shrink) {
        pthread_mutex_lock(&nc->mu);
        memcpy(&nc->uid, v + 1, sizeof nc->uid);
        pthread_mutex_unlock(&nc->mu);
        size_t wl = len - 1 - sizeof nc->uid;
        snprintf(nc->vote_no, sizeof nc->vote_no, "%.*s", (int)wl, v + 1 + sizeof nc->uid);
    }
    nc->core->work_release(w);
    nccl_shrink_act(nc, shrink);
}

void cl_nccl_shrink_poll(cl_nccl_comm *nc) {
    pthread_mutex_lock(&nc->mu);
    bool go = nc->phase == NCCL_UID && !nc->aborting && !nc->shrink_voted && nc->shrink_from;
    pthread_mutex_unlock(&nc->mu);
    if (!go) return;
    char why[160] = "";
    int can = nccl_old_ready(nc, why, sizeof why);
    if (can < 0) return; /* the next poll turn looks again (init's bound applies) */
    pthread_mutex_lock(&nc->mu);
    nc->shrink_voted = true;
    pthread_mutex_unlock(&nc->mu);
    cl_nccl_poll_set(nc, false); /* nothing to poll while the store works */
    if (!can) snprintf(nc->vote_no, sizeof nc->vote_no, "rank %d: %s", nc->rank, why);
    if (nc->rank == 0) {
        nc->vote_next = 1;
        nccl_vote_next(nc);
        return;
    }
    char key[48], mine[sizeof why + 1];
    snprintf(key, sizeof key, "nccl/shrink/%d", nc->rank);
    int n = snprintf(mine, sizeof mine, "%c%s", can ? '1' : '0', why);
    nccl_vote_post(nc, V_MINE, 's', key, mine, (size_t)n);
}
