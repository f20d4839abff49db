/*
 * backend_services.c — the const table of core services handed to every
 * backend (collie_backend.h, ABI 3). Thin adapters over the core's
 * internals, so that a plugin links no symbol of the core; the loop's
 * events are in backend_events.c.
 *
 * Design notes
 *  - A collective's end goes through comm/coll_end.c (work_finish,
 *    work_claim + work_publish): the unlend, stats and fault record come
 *    before the result is visible, whichever thread the backend ends it on.
 *  - A fault the backend reports (fault) is recorded on the comm before
 *    its work is visible as failed. The work that saw the comm's first
 *    fault gets that status; one that meets its consequences later gets
 *    EABORTED naming the root cause (under NONE each work keeps its own).
 *  - The fault's data comes from what the backend said just before, on the
 *    loop: peer_gone ALIVE (a peer's ABORT frame, or a connection closed
 *    by a process its pidfd says lives) makes the next fault that peer's
 *    abort; peer_disagrees makes the next EPROTO a mismatch naming both
 *    ranks. Otherwise fault.c classifies the status.
 *  - work_test never runs a step of the loop (unlike collie_work_test): the
 *    backend may hold the lock its poll hook takes.
 *  - Store requests go under the comm's key prefix; settings are read from
 *    the one config snapshot (numbers as text in a thread-local buffer).
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"
#include "store/store.h"

static int svc_rank(const collie_bcomm *bc) { return bc->comm->rank; }
static int svc_size(const collie_bcomm *bc) { return bc->comm->size; }
static const char *svc_name(const collie_bcomm *bc) { return bc->comm->name; }
static uint64_t svc_generation(const collie_bcomm *bc) { return bc->comm->generation; }
static uint64_t svc_comm_id(const collie_bcomm *bc) { return bc->comm->id; }

static bool svc_on_progress_thread(const collie_bcomm *bc) {
    return cl_engine_on_loop(bc->comm->engine);
}

static void *svc_work_backend_data(collie_work *w) { return ((cl_coll_work *)w)->backend_data; }

/* A backend reads a work's state; unlike collie_work_test it never runs
 * the loop's step (engine/assist.c): the backend may hold its own lock,
 * which the step's callbacks (its poll hook) take. */
static bool svc_work_test(const collie_work *w) { return w && cl_work_done(w); }

/* A disagreement with a peer the backend named just before (peer_disagrees):
 * the data of the EPROTO it reports now, once (loop) */
static bool backend_disagreement(collie_comm *c, cl_fault *f) {
    int with = c->disagrees_with;
    c->disagrees_with = -1;
    if (with < 0) return false;
    cl_fault_init(f, COLLIE_FAULT_MISMATCH, COLLIE_FAULT_VIEW_LOCAL, c->rank);
    cl_fault_add(f, c->rank);
    cl_fault_add(f, with);
    return true;
}

/* work_finish: cl_coll_finish, with a disagreement's data for an EPROTO
 * (the healthy path: one comparison more) */
static bool svc_work_finish(collie_work *w, int status, const char *fmt, ...) {
    cl_fault f, *data = NULL;
    if (status == COLLIE_EPROTO) {
        collie_comm *c = ((cl_coll_work *)w)->comm;
        if (cl_engine_on_loop(c->engine) && backend_disagreement(c, &f)) data = &f;
    }
    va_list ap;
    va_start(ap, fmt);
    bool won = cl_coll_vfinish_fault(w, status, data, fmt, ap);
    va_end(ap);
    return won;
}

static void svc_peer_disagrees(collie_bcomm *bc, int rank) {
    collie_comm *c = bc->comm;
    if (rank >= 0 && rank < c->size) c->disagrees_with = rank;
}

static void svc_fault(collie_bcomm *bc, collie_work *w, int status, const char *fmt, ...) {
    char msg[CL_COMM_MSG_MAX]; /* a peer's root cause, whole (its ABORT frame) */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* recorded before the work is visible as failed: a waiter that wakes
     * finds collie_comm_error set; the policy is applied next */
    collie_comm *c = bc->comm;
    /* a peer's ABORT frame (peer_gone ALIVE just before): its abort, seen
     * from here; else the status and peer health say (fault.c) */
    cl_fault peer, *f = NULL;
    if ((status == COLLIE_EABORTED || status == COLLIE_EPEER) && c->aborted_by >= 0) {
        cl_fault_init(&peer, COLLIE_FAULT_PEER_ABORT, COLLIE_FAULT_VIEW_PEER, c->aborted_by);
        f = &peer;
    } else if (status == COLLIE_EPROTO && backend_disagreement(c, &peer)) {
        f = &peer;
    }
    c->aborted_by = -1;
    bool root = cl_comm_record_fault(c, status, f, "%s", msg);
    /* the work that saw the comm's first fault gets the root code; one that
     * meets the fault's consequences later (a backend finds a dead peer's
     * connection closed) is taken down by it, as the policy takes down
     * the rest: EABORTED naming the root cause (NONE: each work its own) */
    if (w && f && (root || c->policy == COLLIE_POLICY_NONE)) {
        cl_coll_finish_fault(w, status, f, "%s", msg);
    } else if (w && (root || c->policy == COLLIE_POLICY_NONE)) {
        cl_coll_finish(w, status, "%s", msg);
    } else if (w) {
        cl_coll_finish(w, COLLIE_EABORTED, "aborted: %s", c->err_msg);
    }
    cl_comm_fault_data(c, status, f, true, "%s", msg);
}

static void svc_peer_gone(collie_bcomm *bc, int rank, int state) {
    collie_comm *c = bc->comm;
    /* a connection closed by a process that lives (same host: its pidfd
     * and flags say so) is its abort, not its death */
    if (state == COLLIE_PEER_DEAD && cl_health_process_alive(c, rank) == 1)
        state = COLLIE_PEER_ALIVE;
    if (state == COLLIE_PEER_ALIVE)
        c->aborted_by = rank; /* the fault that follows is its abort (loop) */
    else if (state == COLLIE_PEER_DEAD || state == COLLIE_PEER_LEFT)
        cl_health_peer_gone(c, rank, state);
    else if (state == COLLIE_PEER_SUSPECTED)
        cl_health_suspect(c, rank);
}

static void svc_peer_heard(collie_bcomm *bc, int rank, uint64_t seq) {
    cl_health_heard(bc->comm, rank, seq);
}

static void svc_init_done(collie_bcomm *bc, int status, const char *fmt, ...) {
    char msg[512] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    cl_comm_backend_init_done(bc, status, msg);
}

/* A backend's store request: its key under the comm's namespace, its
 * callback, its bound. */
typedef struct svc_req {
    char key[512];
    collie_post_opts o;
} svc_req;

static int svc_req_init(svc_req *r, collie_bcomm *bc, const char *key, int32_t timeout_ms,
                        collie_work_cb cb, void *arg) {
    int n = snprintf(r->key, sizeof r->key, "%s%s", bc->comm->prefix, key);
    if (n < 0 || (size_t)n >= sizeof r->key)
        return cl_set_last_error(COLLIE_EINVAL, "store key '%s' too long", key);
    r->o = (collie_post_opts)COLLIE_POST_OPTS_INIT;
    r->o.cb = cb;
    r->o.cb_arg = arg;
    r->o.timeout_ms = timeout_ms;
    return COLLIE_OK;
}

static int svc_store_set(collie_bcomm *bc, const char *key, const void *val, size_t len,
                         collie_work_cb cb, void *arg, collie_work **out) {
    svc_req r;
    int rc = svc_req_init(&r, bc, key, bc->comm->create_timeout_ms, cb, arg);
    return rc != COLLIE_OK ? rc
                           : collie_store_post_set(bc->comm->store, r.key, val, len, &r.o, out);
}

static int svc_store_get(collie_bcomm *bc, const char *key, int32_t timeout_ms, collie_work_cb cb,
                         void *arg, collie_work **out) {
    svc_req r;
    int rc = svc_req_init(&r, bc, key, timeout_ms, cb, arg);
    return rc != COLLIE_OK ? rc : collie_store_post_get(bc->comm->store, r.key, &r.o, out);
}

static void svc_auth_mac(const collie_bcomm *bc, const void *msg, size_t len,
                         unsigned char out[32]) {
    const char *tok = NULL;
    size_t tlen = 0;
    cl_store_token(bc->comm->store, &tok, &tlen);
    if (!tok) {
        memset(out, 0, 32);
        return;
    }
    unsigned int olen = 32;
    HMAC(EVP_sha256(), tok, (int)tlen, msg, len, out, &olen);
}

static bool svc_auth_enabled(const collie_bcomm *bc) {
    const char *tok = NULL;
    size_t tlen = 0;
    cl_store_token(bc->comm->store, &tok, &tlen);
    return tok != NULL;
}

static bool svc_log_enabled(int level) {
    return cl_log_enabled(level < CL_LOG_ERROR ? CL_LOG_ERROR : level);
}

static void svc_log(int level, const char *module, const char *fmt, ...) {
    va_list ap; /* cl_vlog clamps the level */
    va_start(ap, fmt);
    cl_vlog(level, module, fmt, ap);
    va_end(ap);
}

static void svc_log_comm(const collie_bcomm *bc, int level, const char *module, const char *fmt,
                         ...) {
    va_list ap;
    va_start(ap, fmt);
    cl_vlog_comm(level, module, bc->comm->name, bc->comm->rank, fmt, ap);
    va_end(ap);
}

static void svc_work_set_source(collie_work *w, int rank) { ((cl_coll_work *)w)->source = rank; }

static const char *svc_setting(const char *name) {
    const cl_config *c = cl_config_get();
    if (!strcmp(name, "COLLIE_SOCKET_IFNAME")) return c->socket_ifname;
    if (!strcmp(name, "COLLIE_SOCKET_ADDR")) return c->socket_addr;
    if (!strcmp(name, "COLLIE_DUMP_DIR")) return c->dump_dir;
    if (!strcmp(name, "COLLIE_CPU_TRANSPORT")) return c->cpu_transport;
    /* numbers are returned as text, from this thread's buffer */
    static _Thread_local char num[24];
    if (!strcmp(name, "COLLIE_SHM_RING_BYTES")) {
        snprintf(num, sizeof num, "%d", (int)c->shm_ring_bytes);
        return num;
    }
    if (!strcmp(name, "COLLIE_SHM_SINGLE_COPY")) {
        snprintf(num, sizeof num, "%d", (int)c->shm_single_copy);
        return num;
    }
    if (!strcmp(name, "COLLIE_EARLY_BYTES")) {
        snprintf(num, sizeof num, "%d", (int)c->early_bytes);
        return num;
    }
    if (!strcmp(name, "COLLIE_NCCL_POLL_US")) {
        snprintf(num, sizeof num, "%d", (int)c->nccl_poll_us);
        return num;
    }
    if (!strcmp(name, "COLLIE_INSECURE")) return c->insecure ? "1" : "0";
    if (!strcmp(name, "COLLIE_FRAME_MAC")) return c->frame_mac ? "1" : "0";
    if (!strcmp(name, "COLLIE_HANDSHAKE_TIMEOUT_MS")) {
        snprintf(num, sizeof num, "%d", (int)c->handshake_ms);
        return num;
    }
    if (!strcmp(name, "COLLIE_HEARTBEAT_MS")) {
        snprintf(num, sizeof num, "%d", (int)c->heartbeat_ms);
        return num;
    }
    if (!strcmp(name, "COLLIE_NCCL_ABORT_TIMEOUT_MS")) {
        snprintf(num, sizeof num, "%d", (int)c->nccl_abort_ms);
        return num;
    }
    return NULL;
}

static int svc_device(const collie_bcomm *bc) { return bc->comm->device; }

static int32_t svc_create_timeout_ms(const collie_bcomm *bc) { return bc->comm->create_timeout_ms; }

static void svc_set_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cl_set_last_error(COLLIE_EBACKEND, "%s", msg);
}

const collie_core_services cl_core_services = {
    .abi_version = COLLIE_BACKEND_ABI_VERSION,
    .size = sizeof(collie_core_services),
    .rank = svc_rank,
    .nranks = svc_size,
    .name = svc_name,
    .generation = svc_generation,
    .comm_id = svc_comm_id,
    .device = svc_device,
    .create_timeout_ms = svc_create_timeout_ms,
    .on_progress_thread = svc_on_progress_thread,
    .watch_new = cl_backend_watch_new,
    .watch_start = cl_backend_watch_start,
    .watch_stop = cl_backend_watch_stop,
    .watch_activate = cl_backend_watch_activate,
    .watch_free = cl_backend_watch_free,
    .want_poll = cl_backend_want_poll,
    /* a collective ends in comm/coll_end.c: unlend, stats, fault, then DONE */
    .work_finish = svc_work_finish,
    .work_claim = cl_work_claim,
    .work_publish = cl_coll_publish,
    .work_busy_enter = cl_work_busy_enter,
    .work_busy_exit = cl_work_busy_exit,
    .work_backend_data = svc_work_backend_data,
    .work_test = svc_work_test,
    .work_result = collie_work_result,
    .work_error_message = collie_work_error_message,
    .work_seq = collie_work_seq,
    .work_cancel = collie_work_cancel,
    .work_release = collie_work_release,
    .dtype_size = collie_dtype_size,
    .dtype_name = collie_dtype_name,
    .redop_name = collie_redop_name,
    .fault = svc_fault,
    .peer_gone = svc_peer_gone,
    .peer_heard = svc_peer_heard,
    .peer_disagrees = svc_peer_disagrees,
    .init_done = svc_init_done,
    .set_error = svc_set_error,
    .store_set = svc_store_set,
    .store_get = svc_store_get,
    .store_value = collie_store_work_value,
    .auth_mac = svc_auth_mac,
    .auth_enabled = svc_auth_enabled,
    .log = svc_log,
    .log_enabled = svc_log_enabled,
    .setting = svc_setting,
    .work_set_source = svc_work_set_source,
    .log_comm = svc_log_comm,
    .stat_add = cl_stats_backend_add,
};
