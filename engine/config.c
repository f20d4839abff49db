/*
 * config.c — the one table of COLLIE_* environment settings.
 *
 * Design notes: the environment is parsed on first use into a static
 * cl_config (under a mutex, published by an atomic flag; cl_config_reload
 * parses it again). A value that does not parse keeps the default in the
 * struct but is remembered as an error; cl_config_check() (called by every create
 * function) turns it into COLLIE_EINVAL naming the variable, the value and
 * what is allowed. Unknown COLLIE_* variables are warned about (typos).
 * The table below is the single source of truth: tests/test_docs.c checks
 * that docs/settings.md holds exactly what cl_config_print_table prints.
 */
#include "engine/config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "collie.h"
#include "engine/common.h"
#include "engine/log.h"

extern char **environ;

enum cl_setting_type {
    CL_SET_MS,
    CL_SET_INT,
    CL_SET_STRING,
    CL_SET_LOGLEVEL,
    CL_SET_SPIN,
    CL_SET_BOOL
};

typedef struct cl_setting {
    const char *name;
    enum cl_setting_type type;
    size_t offset;    /* field in cl_config */
    int64_t min;      /* for numbers */
    const char *dflt; /* documented default */
    const char *help;
} cl_setting;

#define CL_OFF(f) offsetof(cl_config, f)

static const cl_setting cl_settings[] = {
    {"COLLIE_LOG", CL_SET_LOGLEVEL, CL_OFF(log_level), 0, "warn",
     "log level: error, warn, info or debug"},
    {"COLLIE_LOG_FILE", CL_SET_STRING, CL_OFF(log_file), 0, "(stderr)",
     "append log lines to this file instead of stderr (%p in the name: the pid)"},
    {"COLLIE_TIMEOUT_MS", CL_SET_MS, CL_OFF(timeout_ms), 1, "60000",
     "default deadline of every operation, in ms"},
    {"COLLIE_STALL_MS", CL_SET_MS, CL_OFF(stall_ms), 1, "10000",
     "report the progress loop as stalled after this many ms without turning"},
    {"COLLIE_STORE_ADDR", CL_SET_STRING, CL_OFF(store_addr), 0, "(none)",
     "host:port of the key/value store (set by collie-run)"},
    {"COLLIE_STORE_TOKEN", CL_SET_STRING, CL_OFF(store_token), 0, "(none)",
     "shared secret of the job: the store and every rank's handshake prove it (HMAC-SHA256 "
     "challenge-response; collie-run makes one per job)"},
    {"COLLIE_INSECURE", CL_SET_BOOL, CL_OFF(insecure), 0, "0",
     "1: allow a store, or a rank's listener, beyond loopback without a shared secret (anyone "
     "who can reach it can join; docs/security.md)"},
    {"COLLIE_HANDSHAKE_TIMEOUT_MS", CL_SET_MS, CL_OFF(handshake_ms), 1, "5000",
     "a connection to a rank's listener must finish its handshake within this many ms (at "
     "most 64 wait at once per comm)"},
    {"COLLIE_HEARTBEAT_MS", CL_SET_MS, CL_OFF(heartbeat_ms), 0, "1000",
     "a link to a peer that carried nothing for this long carries a heartbeat frame, so that "
     "silence means trouble (peer health); 0: off (peers are then never suspected)"},
    {"COLLIE_SUSPECT_MS", CL_SET_MS, CL_OFF(suspect_ms), 1, "5000",
     "a peer with a link that is silent this long is \"suspected\" (an event; the comm is not "
     "faulted), past half of it \"slow\"; must be more than COLLIE_HEARTBEAT_MS"},
    {"COLLIE_FRAME_MAC", CL_SET_BOOL, CL_OFF(frame_mac), 0, "1",
     "TCP frames between ranks carry a MAC (ChaCha20-Poly1305, keyed per connection by the "
     "handshake) when the job has a secret; 0: not, for trusted networks (both ends must agree; "
     "docs/security.md)"},
    {"COLLIE_RANK", CL_SET_INT, CL_OFF(rank), 0, "(none)",
     "this process's rank (set by collie-run)"},
    {"COLLIE_WORLD_SIZE", CL_SET_INT, CL_OFF(world_size), 1, "(none)",
     "number of ranks (set by collie-run)"},
    {"COLLIE_LOCAL_RANK", CL_SET_INT, CL_OFF(local_rank), 0, "(none)",
     "this process's rank among the ranks of its host (set by collie-run)"},
    {"COLLIE_LOCAL_WORLD_SIZE", CL_SET_INT, CL_OFF(local_world_size), 1, "(none)",
     "number of ranks on this host (set by collie-run; COLLIE_SPIN=auto counts these)"},
    {"COLLIE_NODE_RANK", CL_SET_INT, CL_OFF(node_rank), 0, "(none)",
     "this host's index among the job's nodes (set by collie-run)"},
    {"COLLIE_RESTART_COUNT", CL_SET_INT, CL_OFF(restart_count), 0, "(none)",
     "how many times collie-run restarted this rank (set by collie-run)"},
    {"COLLIE_STATS_DIR", CL_SET_STRING, CL_OFF(stats_dir), 0, "(none)",
     "directory where each comm writes its stats as JSON when destroyed (collie-run --stats)"},
    {"COLLIE_DUMP_DIR", CL_SET_STRING, CL_OFF(dump_dir), 0, "(none)",
     "directory where flight-recorder dumps are written on abort"},
    {"COLLIE_PLUGIN_PATH", CL_SET_STRING, CL_OFF(plugin_path), 0, "(none)",
     "colon-separated directories searched for backend plugins (libcollie_<name>.so)"},
    {"COLLIE_SOCKET_IFNAME", CL_SET_STRING, CL_OFF(socket_ifname), 0, "(none)",
     "network interface whose IPv4 address the TCP transport listens on"},
    {"COLLIE_SOCKET_ADDR", CL_SET_STRING, CL_OFF(socket_addr), 0, "127.0.0.1",
     "address the TCP transport listens on (when COLLIE_SOCKET_IFNAME is unset)"},
    {"COLLIE_CPU_TRANSPORT", CL_SET_STRING, CL_OFF(cpu_transport), 0, "auto",
     "how the default CPU backend reaches each peer: auto (shared memory for peers on this "
     "host, TCP for the rest), tcp, shm"},
    {"COLLIE_SHM_RING_BYTES", CL_SET_INT, CL_OFF(shm_ring_bytes), 4096, "524288",
     "bytes of each direction's shared-memory ring between two same-host ranks (rounded up to "
     "a power of two, at most 1 GiB)"},
    {"COLLIE_SHM_SINGLE_COPY", CL_SET_INT, CL_OFF(shm_single_copy), 0, "524288",
     "bytes from which a message to a same-host rank is not copied through the ring but read "
     "straight out of the sender's memory (process_vm_readv; collectives that reduce, and "
     "systems that forbid it, use the ring); 0: never"},
    {"COLLIE_EARLY_BYTES", CL_SET_INT, CL_OFF(early_bytes), 4096, "16777216",
     "bytes of collective frames a peer may send ahead of this rank (for collectives it has not "
     "posted yet), kept per connection; past them the peer holds its frames back while "
     "send/recv still flow, and a larger frame waits until its receive is posted"},
    {"COLLIE_BLOCKING_WAIT", CL_SET_STRING, CL_OFF(blocking_wait), 0, "0",
     "1: error policy BLOCKING_WAIT (the waiter gets the error; nothing happens in the "
     "background)"},
    {"COLLIE_ASYNC_ERROR_HANDLING", CL_SET_STRING, CL_OFF(async_error), 0, "abort_comm",
     "error policy: abort_comm, abort_process, none, or PyTorch's 0 (none), 1 and 3 "
     "(abort_process), 2 (abort_comm)"},
    {"COLLIE_SPIN", CL_SET_SPIN, CL_OFF(spin), 0, "auto",
     "poll (yielding the core between turns) instead of sleeping while works are in flight: "
     "auto (on a machine with more than one core; when this host's ranks outnumber its "
     "cores an idle loop stops polling after 2 ms instead of 20), on, off"},
    {"COLLIE_NCCL_POLL_US", CL_SET_INT, CL_OFF(nccl_poll_us), 1, "200",
     "NCCL backend: microseconds between polls of pending GPU works"},
    {"COLLIE_NCCL_ABORT_TIMEOUT_MS", CL_SET_MS, CL_OFF(nccl_abort_ms), 1, "10000",
     "NCCL backend: bound of the NCCL abort (ncclCommRevoke's quiesce, or ncclCommAbort) "
     "before the works fail anyway (logged)"},
    {"COLLIE_TRACE_BUFFER", CL_SET_INT, CL_OFF(trace_buffer), 0, "2048",
     "flight-recorder entries kept per communicator (0: off)"},
    {"COLLIE_CHECK_ARGS", CL_SET_INT, CL_OFF(check_args), 0, "0",
     "1: compare the arguments of every CUDA collective across ranks, alltoallv's counts and "
     "each send against its receive too (NCCL does not; a mismatch fails the comm with "
     "COLLIE_EPROTO); costs store traffic"},
};

#define CL_NSETTINGS (sizeof cl_settings / sizeof cl_settings[0])

/* the defaults, as an initialiser: a const object is no constant expression
 * in C11 (gcc takes one anyway, clang does not: the fuzz build) */
#define CL_CFG_DEFAULTS                                                                            \
    {                                                                                              \
        .log_level = 1, .timeout_ms = 60000, .stall_ms = 10000, .rank = -1, .world_size = -1,      \
        .local_rank = -1, .local_world_size = -1, .node_rank = -1, .restart_count = -1,            \
        .trace_buffer = 2048, .shm_ring_bytes = 524288, .shm_single_copy = 524288,                 \
        .early_bytes = 16777216, .nccl_poll_us = 200, .nccl_abort_ms = 10000,                      \
        .handshake_ms = 5000, .frame_mac = true, .heartbeat_ms = 1000, .suspect_ms = 5000          \
    }
static const cl_config cl_cfg_defaults = CL_CFG_DEFAULTS;
static cl_config cl_cfg = CL_CFG_DEFAULTS;
static char cl_cfg_error[512];
static pthread_mutex_t cl_cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool cl_cfg_parsed;

static bool config_parse_int(const char *s, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}

static void config_error(const cl_setting *st, const char *val, const char *allowed) {
    if (cl_cfg_error[0]) return; /* report the first one */
    snprintf(cl_cfg_error, sizeof cl_cfg_error, "%s='%s' is invalid: expected %s", st->name, val,
             allowed);
}

static void config_apply(const cl_setting *st, const char *val) {
    char *field = (char *)&cl_cfg + st->offset;
    int64_t v;
    switch (st->type) {
    case CL_SET_LOGLEVEL: {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (strcasecmp(val, names[i]) == 0) {
                *(int *)field = i;
                return;
            }
        config_error(st, val, "one of error, warn, info, debug");
        return;
    }
    case CL_SET_SPIN: {
        static const char *const names[] = {"auto", "off", "on"};
        for (int i = 0; i < 3; i++)
            if (strcasecmp(val, names[i]) == 0) {
                *(int *)field = i;
                return;
            }
        config_error(st, val, "one of auto, off, on");
        return;
    }
    case CL_SET_BOOL:
        if (strcmp(val, "0") && strcmp(val, "1")) {
            config_error(st, val, "0 or 1");
            return;
        }
        *(bool *)field = val[0] == '1';
        return;
    case CL_SET_MS:
        if (!config_parse_int(val, st->min, INT32_MAX, &v)) {
            config_error(st, val,
                         st->min > 0 ? "a positive number of milliseconds"
                                     : "a number of milliseconds (0: off)");
            return;
        }
        *(int32_t *)field = (int32_t)v;
        return;
    case CL_SET_INT:
        if (!config_parse_int(val, st->min, INT32_MAX, &v)) {
            char allowed[48];
            snprintf(allowed, sizeof allowed, "an integer >= %lld", (long long)st->min);
            config_error(st, val, allowed);
            return;
        }
        *(int32_t *)field = (int32_t)v;
        return;
    case CL_SET_STRING:
        if (val[0] == '\0') {
            config_error(st, val, "a non-empty value (unset the variable instead)");
            return;
        }
        *(const char **)field = val;
        return;
    }
}

static void config_parse(void) {
    for (size_t i = 0; i < CL_NSETTINGS; i++) {
        const char *val = getenv(cl_settings[i].name);
        if (val) config_apply(&cl_settings[i], val);
    }
    /* settings that depend on each other: silence is judged against the
     * heartbeat, so a bound at or under one period would suspect every
     * idle peer */
    if (cl_cfg.heartbeat_ms > 0 && cl_cfg.suspect_ms <= cl_cfg.heartbeat_ms && !cl_cfg_error[0])
        snprintf(cl_cfg_error, sizeof cl_cfg_error,
                 "COLLIE_SUSPECT_MS=%d is invalid: expected more than COLLIE_HEARTBEAT_MS (%d)",
                 (int)cl_cfg.suspect_ms, (int)cl_cfg.heartbeat_ms);
}

const cl_config *cl_config_get(void) {
    if (atomic_load_explicit(&cl_cfg_parsed, memory_order_acquire)) return &cl_cfg;
    pthread_mutex_lock(&cl_cfg_mu);
    if (!atomic_load_explicit(&cl_cfg_parsed, memory_order_relaxed)) {
        config_parse();
        atomic_store_explicit(&cl_cfg_parsed, true, memory_order_release);
    }
    pthread_mutex_unlock(&cl_cfg_mu);
    return &cl_cfg;
}

void cl_config_reload(void) {
    pthread_mutex_lock(&cl_cfg_mu);
    cl_cfg = cl_cfg_defaults;
    cl_cfg_error[0] = '\0';
    config_parse();
    atomic_store_explicit(&cl_cfg_parsed, true, memory_order_release);
    pthread_mutex_unlock(&cl_cfg_mu);
}

/* Read by the Python package (python/collie), not by the library. */
static const char *const cl_python_settings[] = {"COLLIE_LIB", "COLLIE_TORCH_EXT",
                                                 "COLLIE_TORCH_HOST"};

static bool config_name_is(const char *entry, size_t len, const char *name) {
    return strlen(name) == len && strncmp(entry, name, len) == 0;
}

static void config_warn_unknown(void) {
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "COLLIE_", 7) != 0) continue;
        size_t len = strcspn(*e, "=");
        bool known = false;
        for (size_t i = 0; i < CL_NSETTINGS && !known; i++)
            known = config_name_is(*e, len, cl_settings[i].name);
        for (size_t i = 0; i < sizeof cl_python_settings / sizeof *cl_python_settings && !known;
             i++)
            known = config_name_is(*e, len, cl_python_settings[i]);
        if (!known)
            CL_WARN("config", "unknown setting %.*s ignored (see docs/settings.md)", (int)len, *e);
    }
}

static pthread_once_t cl_cfg_warn_once = PTHREAD_ONCE_INIT;

int cl_config_check(void) {
    cl_config_get();
    pthread_once(&cl_cfg_warn_once, config_warn_unknown);
    if (cl_cfg_error[0]) {
        CL_ERROR("config", "%s", cl_cfg_error);
        return cl_set_last_error(COLLIE_EINVAL, "%s", cl_cfg_error);
    }
    return COLLIE_OK;
}

void cl_config_print_table(FILE *f) {
    fprintf(f, "| variable | default | meaning |\n|---|---|---|\n");
    for (size_t i = 0; i < CL_NSETTINGS; i++)
        fprintf(f, "| `%s` | %s | %s |\n", cl_settings[i].name, cl_settings[i].dflt,
                cl_settings[i].help);
}

/* this host's cores, read once (sysconf reads a sysfs file each time) */
static long cl_cpus(void) {
    static _Atomic long cpus_seen;
    long cpus = atomic_load_explicit(&cpus_seen, memory_order_relaxed);
    if (cpus == 0) {
        cpus = sysconf(_SC_NPROCESSORS_ONLN);
        atomic_store_explicit(&cpus_seen, cpus, memory_order_relaxed);
    }
    return cpus;
}

bool cl_spin_enabled(void) {
    const cl_config *c = cl_config_get();
    if (c->spin != CL_SPIN_AUTO) return c->spin == CL_SPIN_ON;
    return cl_cpus() > 1;
}

bool cl_cores_oversubscribed(void) {
    const cl_config *c = cl_config_get();
    int local_ranks = c->local_world_size > 0 ? c->local_world_size
                      : c->world_size > 0     ? c->world_size
                                              : 1;
    return local_ranks > cl_cpus();
}
