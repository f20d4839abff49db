/*
 * nccl_backend.c — the NCCL transport plugin: its ops table, settings,
 * communicator init and destroy.
 *
 * Design notes
 *  - Init never blocks the loop. A setup thread asks CUDA for the devices
 *    (the first CUDA call can take long: driver and context start-up),
 *    makes the internal stream and, on rank 0, the ncclUniqueId. The loop
 *    then moves the id through the store ("nccl/uid" under the comm's
 *    namespace, which carries its generation), calls the non-blocking
 *    ncclCommInitRankConfig (config.blocking = 0) and polls
 *    ncclCommGetAsyncError from the poll hook until it leaves
 *    ncclInProgress; init_done reports the result. The bound is the comm's
 *    creation timeout (below): past it init fails and the core aborts the
 *    comm, which aborts the NCCL communicator being built (nccl_abort.c).
 *  - No usable GPU (cudaGetDeviceCount fails — "insufficient driver" on a
 *    machine without one — or reports 0) fails init with COLLIE_EBACKEND
 *    "no CUDA device: <why>".
 *  - Device: the comm's `device` option (core->device) when given (one past
 *    the devices CUDA reports fails init with COLLIE_EINVAL), else rank %
 *    device count (as PyTorch guesses when it is not told). With one
 *    process per GPU and CUDA_VISIBLE_DEVICES that is device 0.
 *  - Init is bounded by the comm's creation timeout (core->create_timeout_ms),
 *    counted from init: the unique id's store get gets what is left of it,
 *    and the poll hook fails init with COLLIE_ETIMEDOUT "NCCL init did not
 *    complete within X ms" when the CUDA setup or NCCL's init outlives it
 *    (the core's own creation deadline is a backstop behind it).
 *  - A child of collie_comm_split/new_group (ops->split) skips the unique
 *    id: on its parent's device, nccl_split.c calls ncclCommSplit on the
 *    parent's communicator and init polls the child as above; it then
 *    checks that NCCL numbered the ranks as collie did. A comm of
 *    collie_comm_shrink (ops->shrink) stays on the old comm's device and
 *    waits for the old comm's abort to be over, then nccl_shrink.c has the
 *    members agree on ncclCommShrink of the old communicator or a fresh
 *    init (the unique id travels with the decision); checked the same way.
 *  - Lifetime: cl_nccl_comm is referenced by the backend (dropped by
 *    destroy) and by each helper thread; the last reference frees the
 *    stream, the events and the scratch buffer. After destroy nothing
 *    calls the core with this comm's handle.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transports/nccl/nccl_backend.h"

#define NCCL_UID_KEY          "nccl/uid"
#define NCCL_POLL_US_DEFAULT  200
#define NCCL_ABORT_MS_DEFAULT 10000

int64_t cl_nccl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

const char *cl_nccl_strerror(ncclResult_t r, ncclComm_t comm, char *buf, size_t len) {
    const char *detail = comm ? ncclGetLastError(comm) : NULL;
    if (detail && detail[0])
        snprintf(buf, len, "%s (%s)", ncclGetErrorString(r), detail);
    else
        snprintf(buf, len, "%s", ncclGetErrorString(r));
    return buf;
}

void cl_nccl_hold(cl_nccl_comm *nc) {
    atomic_fetch_add_explicit(&nc->refs, 1, memory_order_relaxed);
}

void cl_nccl_release(cl_nccl_comm *nc) {
    if (atomic_fetch_sub_explicit(&nc->refs, 1, memory_order_acq_rel) != 1) return;
    if (nc->stream || nc->npool || nc->scratch) cudaSetDevice(nc->dev);
    for (size_t i = 0; i < nc->npool; i++)
        cudaEventDestroy(nc->pool[i]);
    free(nc->pool);
    if (nc->scratch) cudaFree(nc->scratch);
    if (nc->stream) cudaStreamDestroy(nc->stream);
    if (nc->revoked) ncclCommAbort(nc->revoked); /* (destroy or the last shrink took it) */
    pthread_cond_destroy(&nc->cv);
    pthread_mutex_destroy(&nc->mu);
    cl_nccl_comm *parent = nc->parent, *from = nc->shrink_from;
    free(nc->shrink_excl);
    free(nc);
    if (parent) cl_nccl_release(parent);
    if (from) cl_nccl_shrink_unuse(from);
}

/* ---- polling ------------------------------------------------------------------ */

bool cl_nccl_poll_needed_locked(const cl_nccl_comm *nc) {
    if (nc->destroyed) return false;
    if (nc->aborting) {
        if (!nc->batch_taken) return true;
        const cl_nccl_work *nw;
        cl_list_foreach(&nc->pending, nw, cl_nccl_work, node) if (nw->late) return true;
        return false;
    }
    switch (nc->phase) {
    case NCCL_SETUP:
    case NCCL_INIT: return true;
    /* a split waits for its parent, a shrunk comm for the old one's quiesce */
    case NCCL_UID: return nc->parent != NULL || (nc->shrink_from && !nc->shrink_voted);
    case NCCL_READY: return !cl_list_empty(&nc->pending) || nc->nccl_inprogress;
    default: return false;
    }
}

void cl_nccl_poll_set(cl_nccl_comm *nc, bool on) {
    pthread_mutex_lock(&nc->mu);
    bool call = on != nc->poll_hint || !on; /* "off" is cheap and self-correcting */
    nc->poll_hint = on;
    bool destroyed = nc->destroyed;
    pthread_mutex_unlock(&nc->mu);
    if (call && !destroyed) nc->core->want_poll(nc->bc, on, nc->poll_us);
}

/* ---- settings ------------------------------------------------------------------- */

/* A setting the core may not know yet is read from the environment; an
 * invalid value is an error, never a silent default. */
static int nccl_setting(const collie_core_services *core, const char *name, int32_t dflt,
                        int32_t min, int32_t *out, char *why, size_t len) {
    const char *v = core->setting(name);
    if (!v) v = getenv(name);
    *out = dflt;
    if (!v) return COLLIE_OK;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < min || x > INT32_MAX) {
        snprintf(why, len, "%s='%s' is invalid: expected an integer >= %d", name, v, (int)min);
        return COLLIE_EINVAL;
    }
    *out = (int32_t)x;
    return COLLIE_OK;
}

/* ---- setup thread ---------------------------------------------------------------- */

static void *nccl_setup_main(void *arg) {
    cl_nccl_comm *nc = arg;
    int status = COLLIE_OK, ndev = 0, dev = 0;
    char msg[256] = "";
    cudaStream_t stream = NULL;
    void *scratch = NULL;
    ncclUniqueId uid;
    memset(&uid, 0, sizeof uid);
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    ncclResult_t nr = ncclSuccess;
    if (ce != cudaSuccess) {
        status = COLLIE_EBACKEND;
        snprintf(msg, sizeof msg, "no CUDA device: %s", cudaGetErrorString(ce));
    } else if (ndev < 1) {
        status = COLLIE_EBACKEND;
        snprintf(msg, sizeof msg, "no CUDA device: cudaGetDeviceCount reports none");
    } else if (nc->dev_opt >= ndev) {
        status = COLLIE_EINVAL;
        snprintf(msg, sizeof msg, "the comm's device option is %d but CUDA reports %d device%s",
                 nc->dev_opt, ndev, ndev == 1 ? "" : "s");
    } else {
        dev = nc->parent         ? nc->parent->dev
              : nc->shrink_from  ? nc->shrink_dev /* the process keeps its GPU */
              : nc->dev_opt >= 0 ? nc->dev_opt
                                 : nc->rank % ndev;
        if ((ce = cudaSetDevice(dev)) != cudaSuccess ||
            (ce = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (ce = cudaMalloc(&scratch, 4)) != cudaSuccess) {
            status = COLLIE_EBACKEND;
            snprintf(msg, sizeof msg, "CUDA device %d: %s", dev, cudaGetErrorString(ce));
        } else if (nc->rank == 0 && !nc->parent && (nr = ncclGetUniqueId(&uid)) != ncclSuccess) {
            status = COLLIE_EBACKEND;
            snprintf(msg, sizeof msg, "ncclGetUniqueId: %s", ncclGetErrorString(nr));
        }
    }
    if (status == COLLIE_OK)
        NCCL_LOG(nc, 2, "CUDA device %d of %d (%s)", dev, ndev,
                 nc->parent         ? "the parent comm's"
                 : nc->shrink_from  ? "the old comm's"
                 : nc->dev_opt >= 0 ? "the device option"
                                    : "rank % devices");
    pthread_mutex_lock(&nc->mu);
    nc->dev = dev;
    nc->stream = stream; /* freed with nc, whatever happens next */
    nc->scratch = scratch;
    nc->uid = uid;
    nc->setup_status = status;
    snprintf(nc->setup_msg, sizeof nc->setup_msg, "%s", msg);
    nc->setup_done = true;
    pthread_mutex_unlock(&nc->mu);
    cl_nccl_release(nc);
    return NULL;
}

/* ---- unique id exchange and NCCL init (loop) -------------------------------------- */

void cl_nccl_init_fail(cl_nccl_comm *nc, int status, const char *msg) {
    pthread_mutex_lock(&nc->mu);
    nc->phase = NCCL_DEAD;
    pthread_mutex_unlock(&nc->mu);
    nc->core->init_done(nc->bc, status, "%s", msg);
}

void cl_nccl_comm_init(cl_nccl_comm *nc) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* init, collectives and abort never wedge the caller */
    cfg.commName = nc->core->name(nc->bc);
    char why[400];
    pthread_mutex_lock(&nc->mu);
    if (nc->aborting || nc->phase != NCCL_UID) {
        pthread_mutex_unlock(&nc->mu);
        return;
    }
    cudaSetDevice(nc->dev); /* NCCL binds the communicator to the current device */
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nc->size, nc->uid, nc->rank, &cfg);
    if (r == ncclSuccess || r == ncclInProgress) {
        nc->comm = comm;
        nc->phase = NCCL_INIT;
    }
    pthread_mutex_unlock(&nc->mu);
    if (r != ncclSuccess && r != ncclInProgress) {
        char err[256];
        snprintf(why, sizeof why, "ncclCommInitRankConfig: %s",
                 cl_nccl_strerror(r, NULL, err, sizeof err));
        cl_nccl_init_fail(nc, COLLIE_EBACKEND, why);
        return;
    }
    cl_nccl_poll_set(nc, true);
}

/* What is left of init's bound, in ms (COLLIE_TIMEOUT_INFINITE: none). */
static int32_t nccl_init_left_ms(const cl_nccl_comm *nc) {
    if (nc->create_timeout_ms <= 0) return COLLIE_TIMEOUT_INFINITE;
    int64_t left = nc->create_timeout_ms - (cl_nccl_now_ns() - nc->init_start_ns) / 1000000;
    return left < 1 ? 1 : (int32_t)left;
}

bool cl_nccl_store_post(cl_nccl_comm *nc, int kind, const char *key, const void *val, size_t len,
                        collie_work_cb cb) {
    cl_nccl_store_ctx *ctx = malloc(sizeof *ctx);
    if (!ctx) {
        cl_nccl_init_fail(nc, COLLIE_ENOMEM, "no memory for a store request of NCCL init");
        return false;
    }
    ctx->nc = nc;
    ctx->core = nc->core;
    nc->store_ctx = ctx;
    int r;
    if (kind == 's')
        r = nc->core->store_set(nc->bc, key, val, len, cb, ctx, &nc->store_req);
    else /* what is left of init's bound (the comm's creation timeout) */
        r = nc->core->store_get(nc->bc, key, nccl_init_left_ms(nc), cb, ctx, &nc->store_req);
    if (r != COLLIE_OK) {
        nc->store_ctx = NULL;
        free(ctx);
        char why[200];
        snprintf(why, sizeof why, "posting a store request of NCCL init (%s) failed", key);
        cl_nccl_init_fail(nc, r, why);
        return false;
    }
    return true;
}

cl_nccl_comm *cl_nccl_store_done(collie_work *w, void *arg, int *status) {
    cl_nccl_store_ctx *ctx = arg;
    cl_nccl_comm *nc = ctx->nc;
    const collie_core_services *core = ctx->core;
    free(ctx);
    *status = core->work_result(w);
    if (!nc) { /* destroyed meanwhile */
        core->work_release(w);
        return NULL;
    }
    nc->store_req = NULL;
    nc->store_ctx = NULL;
    return nc;
}

void cl_nccl_store_failed(cl_nccl_comm *nc, collie_work *w, int st, const char *what) {
    char bound[80] = "", why[600];
    if (st == COLLIE_ETIMEDOUT && nc->create_timeout_ms > 0)
        snprintf(bound, sizeof bound,
                 "NCCL init did not complete within %d ms: ", (int)nc->create_timeout_ms);
    snprintf(why, sizeof why, "%s%s through the store: %s", bound, what,
             nc->core->work_error_message(w));
    nc->core->work_release(w);
    if (st != COLLIE_ECANCELED) cl_nccl_init_fail(nc, st, why);
}

static void nccl_on_store(collie_work *w, void *arg) {
    int st;
    cl_nccl_comm *nc = cl_nccl_store_done(w, arg, &st);
    if (!nc) return;
    if (st != COLLIE_OK) {
        cl_nccl_store_failed(nc, w, st, "exchanging the NCCL unique id");
        return;
    }
    if (nc->rank != 0) {
        const void *val = NULL;
        size_t len = 0;
        nc->core->store_value(w, &val, &len);
        if (len != sizeof(ncclUniqueId)) {
            char why[200];
            snprintf(why, sizeof why, "the NCCL unique id in the store has %zu bytes, not %zu", len,
                     sizeof(ncclUniqueId));
            nc->core->work_release(w);
            cl_nccl_init_fail(nc, COLLIE_EPROTO, why);
            return;
        }
        pthread_mutex_lock(&nc->mu);
        memcpy(&nc->uid, val, len);
        pthread_mutex_unlock(&nc->mu);
    }
    nc->core->work_release(w);
    cl_nccl_comm_init(nc);
}

/* Setup finished (loop, from the poll hook): move the unique id. */
static void nccl_setup_finished(cl_nccl_comm *nc, int status, const char *msg) {
    if (status != COLLIE_OK) {
        cl_nccl_init_fail(nc, status, msg);
        return;
    }
    if (nc->parent) { /* no unique id: ncclCommSplit of the parent's */
        cl_nccl_split_poll(nc);
        return;
    }
    if (nc->shrink_from) { /* ncclCommShrink of the old comm's, or a fresh init */
        cl_nccl_shrink_poll(nc);
        return;
    }
    if (nc->rank == 0)
        cl_nccl_store_post(nc, 's', NCCL_UID_KEY, &nc->uid, sizeof nc->uid, nccl_on_store);
    else
        cl_nccl_store_post(nc, 'g', NCCL_UID_KEY, NULL, 0, nccl_on_store);
}

/* Phase NCCL_INIT (mu): has NCCL's init left ncclInProgress? READY (the
 * phase set), FAILED (status and msg set) or NOTHING yet. */
enum { P_NOTHING, P_SETUP_DONE, P_SPLIT, P_SHRINK, P_READY, P_FAILED };
static int nccl_init_state_locked(cl_nccl_comm *nc, int *status, char *msg, size_t len) {
    char err[300];
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(nc->comm, &st);
    if (r != ncclSuccess) st = r;
    int ur = -1;
    if (st == ncclSuccess && (nc->parent || nc->shrunk) &&
        (ncclCommUserRank(nc->comm, &ur) != ncclSuccess || ur != nc->rank)) {
        *status = COLLIE_EPROTO; /* collie and NCCL must agree on the new comm's ranks */
        snprintf(msg, len, "%s made this rank %d of the %s, collie expects %d",
                 nc->parent ? "ncclCommSplit" : "ncclCommShrink", ur,
                 nc->parent ? "child" : "shrunk comm", nc->rank);
        return P_FAILED;
    }
    if (st == ncclSuccess) {
        nc->phase = NCCL_READY;
        return P_READY;
    }
    if (st == ncclInProgress) return P_NOTHING;
    snprintf(msg, len, "NCCL communicator init failed: %s",
             cl_nccl_strerror(st, nc->comm, err, sizeof err));
    return P_FAILED;
}

/* The init part of the poll hook (loop). Returns false once init is over. */
static bool nccl_poll_init(cl_nccl_comm *nc) {
    int what = P_NOTHING;
    int status = COLLIE_EBACKEND;
    char msg[400] = "";
    pthread_mutex_lock(&nc->mu);
    bool split_wait = nc->phase == NCCL_UID && nc->parent;
    bool shrink_wait = nc->phase == NCCL_UID && nc->shrink_from && !nc->shrink_voted;
    if (nc->aborting ||
        (nc->phase != NCCL_SETUP && nc->phase != NCCL_INIT && !split_wait && !shrink_wait)) {
        pthread_mutex_unlock(&nc->mu);
        return false;
    }
    if (split_wait || shrink_wait) {
        what = split_wait ? P_SPLIT : P_SHRINK;
    } else if (nc->phase == NCCL_SETUP) {
        if (nc->setup_done) {
            nc->phase = NCCL_UID;
            what = P_SETUP_DONE;
            status = nc->setup_status;
            snprintf(msg, sizeof msg, "%s", nc->setup_msg);
        }
    } else {
        what = nccl_init_state_locked(nc, &status, msg, sizeof msg);
    }
    if ((what == P_NOTHING || what == P_SPLIT || what == P_SHRINK) && nc->create_timeout_ms > 0 &&
        cl_nccl_now_ns() - nc->init_start_ns > (int64_t)nc->create_timeout_ms * 1000000) {
        what = P_FAILED; /* the core then aborts the communicator being built */
        status = COLLIE_ETIMEDOUT;
        snprintf(msg, sizeof msg, "NCCL init did not complete within %d ms (%s)",
                 (int)nc->create_timeout_ms,
                 nc->phase == NCCL_SETUP ? "the CUDA setup is still running"
                 : split_wait            ? "the parent comm never became free for ncclCommSplit"
                 : shrink_wait
                     ? "the old comm's NCCL communicator never quiesced for ncclCommShrink"
                 : nc->parent ? "ncclCommSplit is still in progress"
                 : nc->shrunk ? "ncclCommShrink is still in progress"
                              : "ncclCommInitRankConfig is still in progress");
    }
    pthread_mutex_unlock(&nc->mu);
    switch (what) {
    case P_SETUP_DONE:
        /* nothing to poll while the store works (a split or shrink waits first) */
        if (!nc->parent && !nc->shrink_from) cl_nccl_poll_set(nc, false);
        nccl_setup_finished(nc, status, msg);
        break;
    case P_SPLIT: cl_nccl_split_poll(nc); break;
    case P_SHRINK: cl_nccl_shrink_poll(nc); break;
    case P_READY:
        NCCL_LOG(nc, 2, "NCCL communicator ready");
        cl_nccl_shrink_let_go(nc);
        nc->core->init_done(nc->bc, COLLIE_OK, NULL);
        break;
    case P_FAILED:
        cl_nccl_shrink_let_go(nc);
        cl_nccl_init_fail(nc, status, msg);
        break;
    default: break;
    }
    return true;
}

/* ---- ops -------------------------------------------------------------------------- */

int cl_nccl_comm_start(collie_bcomm *bc, const collie_core_services *core, const cl_nccl_origin *o,
                       void **state) {
    if (!COLLIE_CORE_USABLE(core)) return COLLIE_ENOTSUP; /* a core of another ABI */
    cl_nccl_comm *nc = calloc(1, sizeof *nc);
    int *excl = o && o->shrink_from ? calloc((size_t)o->nexcluded + 1, sizeof *excl) : NULL;
    if (!nc || (o && o->shrink_from && !excl)) {
        free(nc);
        free(excl);
        return COLLIE_ENOMEM;
    }
    if (o && o->parent) {
        cl_nccl_hold(o->parent);
        nc->parent = o->parent;
        nc->split_color = o->color;
        nc->split_key = o->key;
    }
    if (o && o->shrink_from) { /* held until its NCCL init is over */
        cl_nccl_comm *from = o->shrink_from;
        cl_nccl_hold(from);
        nc->shrink_from = from;
        memcpy(excl, o->excluded, (size_t)o->nexcluded * sizeof *excl);
        nc->shrink_excl = excl;
        nc->shrink_nexcl = o->nexcluded;
        pthread_mutex_lock(&from->mu);
        nc->shrink_dev = from->dev;
        from->shrink_users++;
        pthread_mutex_unlock(&from->mu);
    }
    nc->bc = bc;
    nc->core = core;
    nc->rank = core->rank(bc);
    nc->size = core->nranks(bc);
    nc->dev_opt = core->device(bc);
    nc->create_timeout_ms = core->create_timeout_ms(bc);
    nc->init_start_ns = cl_nccl_now_ns();
    atomic_init(&nc->refs, 1);
    pthread_mutex_init(&nc->mu, NULL);
    cl_list_init(&nc->pending);
    cl_list_init(&nc->batch);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&nc->cv, &ca);
    pthread_condattr_destroy(&ca);
    nc->phase = NCCL_SETUP;
    *state = nc; /* destroy frees it, whatever happens next */
    char why[200];
    if (nccl_setting(core, "COLLIE_NCCL_POLL_US", NCCL_POLL_US_DEFAULT, 1, &nc->poll_us, why,
                     sizeof why) != COLLIE_OK ||
        nccl_setting(core, "COLLIE_NCCL_ABORT_TIMEOUT_MS", NCCL_ABORT_MS_DEFAULT, 1,
                     &nc->abort_timeout_ms, why, sizeof why) != COLLIE_OK) {
        cl_nccl_init_fail(nc, COLLIE_EINVAL, why);
        return COLLIE_OK;
    }
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    cl_nccl_hold(nc);
    int e = pthread_create(&t, &at, nccl_setup_main, nc);
    pthread_attr_destroy(&at);
    if (e != 0) {
        cl_nccl_release(nc);
        snprintf(why, sizeof why, "cannot start the CUDA setup thread: %s", strerror(e));
        cl_nccl_init_fail(nc, COLLIE_ESYSTEM, why);
        return COLLIE_OK;
    }
    cl_nccl_poll_set(nc, true);
    return COLLIE_OK;
}

static int nccl_init(collie_bcomm *bc, const collie_core_services *core, void **state) {
    return cl_nccl_comm_start(bc, core, NULL, state);
}

/* The poll hook: init steps, then (nccl_progress.c) completions. */
static void nccl_poll_hook(void *state) {
    cl_nccl_comm *nc = state;
    if (nccl_poll_init(nc)) return;
    cl_nccl_poll(nc);
}

static void nccl_destroy(void *state) {
    cl_nccl_comm *nc = state;
    if (!nc) return;
    cl_nccl_abort_finish_for_destroy(nc); /* publishes anything the abort still holds */
    pthread_mutex_lock(&nc->mu);
    nc->destroyed = true;
    ncclComm_t comm = nc->comm; /* never aborted: an idle destroy */
    nc->comm = NULL;
    ncclComm_t revoked = nc->shrink_users ? NULL : nc->revoked; /* else the last one's */
    if (revoked) nc->revoked = NULL;
    /* works finished here (the abort's batch) retire after us: the core calls
     * their detach with a NULL state, so let go of them now */
    cl_nccl_work *nw;
    while ((nw = cl_list_first(&nc->pending, cl_nccl_work, node))) {
        cl_list_remove(&nw->node);
        cl_nccl_event_put_locked(nc, nw->start_ev, nw->gpu_done);
        cl_nccl_event_put_locked(nc, nw->end_ev, nw->gpu_done);
        nw->start_ev = nw->end_ev = NULL;
    }
    cl_nccl_store_ctx *ctx = nc->store_ctx;
    collie_work *req = nc->store_req;
    nc->store_ctx = NULL;
    nc->store_req = NULL;
    pthread_mutex_unlock(&nc->mu);
    if (ctx) { /* its callback frees the context and releases the request */
        ctx->nc = NULL;
        nc->core->work_cancel(req);
    }
    if (comm) cl_nccl_comm_release_async(nc, comm);
    if (revoked) cl_nccl_comm_release_async(nc, revoked);
    cl_nccl_release(nc);
}

static const collie_backend_ops nccl_ops = {
    .abi_version = COLLIE_BACKEND_ABI_VERSION,
    .size = sizeof(collie_backend_ops),
    .name = "nccl",
    .device = "cuda",
    .flags = COLLIE_BACKEND_POST_ON_CALLER | COLLIE_BACKEND_V_COLLECTIVES,
    .work_data_size = sizeof(cl_nccl_work),
    .init = nccl_init,
    .start = cl_nccl_start,
    .detach = cl_nccl_detach,
    .poll = nccl_poll_hook,
    .wait_stream = cl_nccl_wait_stream,
    .abort = cl_nccl_abort,
    .destroy = nccl_destroy,
    .cancel = cl_nccl_cancel,
    .split = cl_nccl_split,
    .split_skip = cl_nccl_split_skip,
    .shrink = cl_nccl_shrink,
};

/* collie_backend_plugin_v3: the one symbol collie looks up in the plugin. */
COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void);
COLLIE_API const collie_backend_ops *collie_backend_plugin_v3(void) { return &nccl_ops; }
