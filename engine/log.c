/*
 * log.c — leveled logging: to stderr, to COLLIE_LOG_FILE, or to the
 * embedding program's handler (collie_set_log_handler).
 *
 * Design notes
 *  - Each line is one record: level, module, the comm's name and rank when
 *    the line is about one, the message. The default sink prints it as
 *    "time collie[pid] LEVEL module: comm 'name' rank R: message" with one
 *    fprintf under stdio's FILE lock, so lines from different threads never
 *    interleave.
 *  - The handler and its context are swapped under the write side of a
 *    rwlock and called under its read side: lines from several threads
 *    reach the handler at once (no lock serialises them), and a handler
 *    never runs after collie_set_log_handler(NULL) has returned. The level
 *    is an atomic read on every log call (set by collie_set_log_level, else
 *    from COLLIE_LOG through the parsed config, which the first log call may
 *    parse). Parsing the config logs nothing itself (a log call there would
 *    re-enter cl_config_get's mutex); its errors are logged by
 *    cl_config_check.
 *  - COLLIE_LOG_FILE is opened once, appending, line-buffered ("%p" in the
 *    name becomes the pid, so ranks of one job do not share a file); if it
 *    cannot be opened the lines go to stderr, the first saying why.
 *  - fork(): the child gets a fresh lock (log_on_fork_child), since a
 *    parent thread may have held it at the fork; the Python package then
 *    puts its routing back to stderr (_log.py).
 *  - libevent's log callback is process-wide, so routing libevent's
 *    warnings through here is the program's choice
 *    (collie_log_route_libevent), never collie's.
 */
#include "engine/log.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collie.h"
#include "engine/config.h"

static const char *const cl_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

static pthread_rwlock_t cl_log_lock = PTHREAD_RWLOCK_INITIALIZER;
static collie_log_fn cl_log_handler;
static void *cl_log_ctx;
static _Atomic int cl_log_level_set = -1; /* -1: from COLLIE_LOG */
static FILE *cl_log_out;                  /* the default sink, chosen once */
static pthread_once_t cl_log_out_once = PTHREAD_ONCE_INIT;

static int log_level(void) {
    int l = atomic_load_explicit(&cl_log_level_set, memory_order_relaxed);
    return l >= 0 ? l : cl_config_get()->log_level;
}

bool cl_log_enabled(int level) { return level <= log_level(); }

void collie_set_log_level(collie_log_level level) {
    if (level < COLLIE_LOG_ERROR) level = COLLIE_LOG_ERROR;
    if (level > COLLIE_LOG_DEBUG) level = COLLIE_LOG_DEBUG;
    atomic_store(&cl_log_level_set, (int)level);
}

collie_log_level collie_log_level_get(void) { return (collie_log_level)log_level(); }

/* fork(): a thread of the parent may hold the lock (a line being written)
 * at the fork; in the child that thread does not exist, so the child
 * starts with a fresh, unheld lock (its handler kept). Registered when the
 * library is loaded, before any thread of its own runs. */
static void log_on_fork_child(void) {
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;
    memcpy(&cl_log_lock, &fresh, sizeof fresh);
}

__attribute__((constructor)) static void log_at_load(void) {
    pthread_atfork(NULL, NULL, log_on_fork_child);
}

void collie_set_log_handler(collie_log_fn fn, void *ctx) {
    pthread_rwlock_wrlock(&cl_log_lock);
    cl_log_handler = fn;
    cl_log_ctx = ctx;
    pthread_rwlock_unlock(&cl_log_lock);
}

static void log_open_file(void) {
    cl_log_out = stderr;
    const char *name = cl_config_get()->log_file;
    if (!name || !*name) return;
    char path[4096];
    size_t o = 0;
    for (const char *p = name; *p && o < sizeof path - 16; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "ae"); /* "e": close-on-exec, not handed to programs we run */
    if (!f) {
        fprintf(stderr, "collie[%d] WARN  log: COLLIE_LOG_FILE '%s': %s; logging to stderr\n",
                (int)getpid(), path, strerror(errno));
        return;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    cl_log_out = f;
}

static void log_print(const collie_log_record *r) {
    pthread_once(&cl_log_out_once, log_open_file);
    struct timespec ts = {r->time_ns / 1000000000, r->time_ns % 1000000000};
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char where[160] = "";
    if (r->comm && r->rank >= 0)
        snprintf(where, sizeof where, "comm '%s' rank %d: ", r->comm, r->rank);
    else if (r->comm)
        snprintf(where, sizeof where, "comm '%s': ", r->comm);
    fprintf(cl_log_out, "%02d:%02d:%02d.%06ld collie[%d] %-5s %s: %s%s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000, (int)getpid(), cl_level_names[r->level], r->module, where,
            r->message);
}

void cl_vlog_comm(int level, const char *module, const char *comm, int rank, const char *fmt,
                  va_list ap) {
    if (level < CL_LOG_ERROR) level = CL_LOG_ERROR;
    if (level > CL_LOG_DEBUG) level = CL_LOG_DEBUG;
    if (!cl_log_enabled(level)) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    collie_log_record r = {.size = sizeof r,
                           .level = (collie_log_level)level,
                           .module = module,
                           .comm = comm,
                           .rank = comm ? rank : -1,
                           .message = msg,
                           .time_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec};
    pthread_rwlock_rdlock(&cl_log_lock);
    collie_log_fn fn = cl_log_handler;
    if (fn) fn(&r, cl_log_ctx);
    pthread_rwlock_unlock(&cl_log_lock);
    if (!fn) log_print(&r);
}

void cl_log_comm(int level, const char *module, const char *comm, int rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cl_vlog_comm(level, module, comm, rank, fmt, ap);
    va_end(ap);
}

void cl_vlog(int level, const char *module, const char *fmt, va_list ap) {
    cl_vlog_comm(level, module, NULL, -1, fmt, ap);
}

void cl_log(int level, const char *module, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cl_vlog(level, module, fmt, ap);
    va_end(ap);
}

static void log_from_libevent(int severity, const char *msg) {
    int level = severity >= EVENT_LOG_ERR    ? CL_LOG_ERROR
                : severity >= EVENT_LOG_WARN ? CL_LOG_WARN
                : severity >= EVENT_LOG_MSG  ? CL_LOG_INFO
                                             : CL_LOG_DEBUG;
    cl_log(level, "libevent", "%s", msg);
}

void collie_log_route_libevent(bool on) { event_set_log_callback(on ? log_from_libevent : NULL); }
