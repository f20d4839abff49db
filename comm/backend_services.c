/*
 * backend_services.c — the const table of core services handed to every
 * backend (collie_backend.h). Thin adapters over the core's internals, so
 * that a plugin never links against them.
 */
#include <event2/event.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"
#include "store/store.h"

static int svc_rank(const collie_bcomm *bc) { return bc->comm->rank; }
static int svc_size(const collie_bcomm *bc) { return bc->comm->size; }
static const char *svc_name(const collie_bcomm *bc) { return bc->comm->name; }
static uint64_t svc_generation(const collie_bcomm *bc) { return bc->comm->generation; }
static uint64_t svc_comm_id(const collie_bcomm *bc) { return bc->comm->id; }

static struct event_base *svc_event_base(collie_bcomm *bc) {
    return cl_engine_base(bc->comm->engine);
}

static bool svc_on_progress_thread(const collie_bcomm *bc) {
    return cl_engine_on_loop(bc->comm->engine);
}

static void *svc_work_backend_data(collie_work *w) { return ((cl_coll_work *)w)->backend_data; }

static void svc_fault(collie_bcomm *bc, collie_work *w, int status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w) cl_work_finish(w, status, "%s", msg);
    cl_comm_fault(bc->comm, status, "%s", msg);
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

static void svc_log(int level, const char *module, const char *fmt, ...) {
    if (level < CL_LOG_ERROR) level = CL_LOG_ERROR;
    if (level > CL_LOG_DEBUG) level = CL_LOG_DEBUG;
    if (!cl_log_enabled(level)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cl_log(level, module, "%s", msg);
}

/* Polling runs on a periodic timerfd watched by the loop, not on a
 * libevent timer: libevent sleeps in epoll_wait with a millisecond timeout,
 * so a 200 us timer would fire every few ms once the loop sleeps (measured:
 * a 200 us libevent timer fires every 4 ms here). libevent's precise-timer
 * mode would fix that for every timer, but costs two syscalls per loop turn
 * while the loop spins. Without a timerfd, a libevent timer does it. */
static void svc_poll_cb(evutil_socket_t fd, short what, void *arg) {
    CL_UNUSED(what);
    collie_bcomm *bc = arg;
    if (fd >= 0) {
        uint64_t expirations;
        ssize_t n = read(fd, &expirations, sizeof expirations); /* re-arms readability */
        CL_UNUSED(n);
    }
    if (bc->state && bc->ops->poll) bc->ops->poll(bc->state);
}

static bool poll_event_make(collie_bcomm *bc) {
    struct event_base *base = cl_engine_base(bc->comm->engine);
    bc->poll_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (bc->poll_fd >= 0) {
        bc->poll_ev = event_new(base, bc->poll_fd, EV_READ | EV_PERSIST, svc_poll_cb, bc);
        if (bc->poll_ev && event_add(bc->poll_ev, NULL) == 0) return true;
        if (bc->poll_ev) event_free(bc->poll_ev);
        close(bc->poll_fd);
    }
    bc->poll_fd = -1;
    bc->poll_ev = event_new(base, -1, EV_PERSIST, svc_poll_cb, bc);
    return bc->poll_ev != NULL;
}

static void poll_apply(collie_bcomm *bc, bool on, int32_t interval_us) {
    if (!bc->poll_ev && (!on || !poll_event_make(bc))) return;
    if (on == bc->poll_on && interval_us == bc->poll_interval_us) return;
    bc->poll_on = on;
    bc->poll_interval_us = interval_us;
    if (interval_us < 1) interval_us = 1;
    struct timespec every = {.tv_sec = interval_us / 1000000,
                             .tv_nsec = (long)(interval_us % 1000000) * 1000};
    if (bc->poll_fd >= 0) { /* periodic while on; disarmed (never readable) while off */
        struct itimerspec its = {.it_interval = every, .it_value = every};
        if (!on) its = (struct itimerspec){{0, 0}, {0, 0}};
        timerfd_settime(bc->poll_fd, 0, &its, NULL);
        return;
    }
    event_del(bc->poll_ev);
    if (!on) return;
    struct timeval tv = {.tv_sec = every.tv_sec, .tv_usec = every.tv_nsec / 1000};
    event_add(bc->poll_ev, &tv);
}

void cl_backend_poll_free(collie_bcomm *bc) {
    if (bc->poll_ev) event_free(bc->poll_ev);
    if (bc->poll_fd >= 0) close(bc->poll_fd);
    bc->poll_ev = NULL;
    bc->poll_fd = -1;
    bc->poll_on = false;
}

static void poll_cmd_run(cl_cmd *cmd) {
    collie_bcomm *bc = cl_container_of(cmd, collie_bcomm, poll_cmd);
    atomic_store(&bc->poll_cmd_queued, false);
    int32_t wish = atomic_load(&bc->poll_wish_us);
    if (bc->state) poll_apply(bc, wish > 0, wish);
}

static void svc_want_poll(collie_bcomm *bc, bool on, int32_t interval_us) {
    if (cl_engine_on_loop(bc->comm->engine)) {
        poll_apply(bc, on, interval_us);
        return;
    }
    atomic_store(&bc->poll_wish_us, on ? (interval_us < 1 ? 1 : interval_us) : 0);
    if (atomic_exchange(&bc->poll_cmd_queued, true)) return;
    bc->poll_cmd.fn = poll_cmd_run;
    if (cl_engine_post_cmd(bc->comm->engine, &bc->poll_cmd) != COLLIE_OK)
        atomic_store(&bc->poll_cmd_queued, false);
}

static const char *svc_setting(const char *name) {
    const cl_config *c = cl_config_get();
    if (!strcmp(name, "COLLIE_SOCKET_IFNAME")) return c->socket_ifname;
    if (!strcmp(name, "COLLIE_SOCKET_ADDR")) return c->socket_addr;
    if (!strcmp(name, "COLLIE_DUMP_DIR")) return c->dump_dir;
    /* numbers are returned as text, from this thread's buffer */
    static _Thread_local char num[24];
    if (!strcmp(name, "COLLIE_NCCL_POLL_US")) {
        snprintf(num, sizeof num, "%d", (int)c->nccl_poll_us);
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
    .rank = svc_rank,
    .size = svc_size,
    .name = svc_name,
    .generation = svc_generation,
    .comm_id = svc_comm_id,
    .event_base = svc_event_base,
    .on_progress_thread = svc_on_progress_thread,
    .work_claim = cl_work_claim,
    .work_publish = cl_work_publish,
    .work_finish = cl_work_finish,
    .work_busy_enter = cl_work_busy_enter,
    .work_busy_exit = cl_work_busy_exit,
    .work_backend_data = svc_work_backend_data,
    .fault = svc_fault,
    .init_done = svc_init_done,
    .store_set = svc_store_set,
    .store_get = svc_store_get,
    .store_value = collie_store_work_value,
    .auth_mac = svc_auth_mac,
    .auth_enabled = svc_auth_enabled,
    .log = svc_log,
    .want_poll = svc_want_poll,
    .setting = svc_setting,
    .device = svc_device,
    .create_timeout_ms = svc_create_timeout_ms,
    .set_error = svc_set_error,
};
