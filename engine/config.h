/*
 * config.h — the one table of COLLIE_* environment settings, parsed once.
 * Every setting is declared in engine/config.c with its type, default,
 * allowed values and documentation (docs/settings.md's table must match
 * it; tests/test_docs.c checks). A value that does not parse is an error
 * reported by cl_config_check(), never silently replaced by a default.
 */
#ifndef CL_CONFIG_H
#define CL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct cl_config {
    int log_level;             /* COLLIE_LOG */
    const char *log_file;      /* COLLIE_LOG_FILE (NULL if unset) */
    int32_t timeout_ms;        /* COLLIE_TIMEOUT_MS: default op timeout */
    int32_t stall_ms;          /* COLLIE_STALL_MS: engine-stall threshold */
    const char *store_addr;    /* COLLIE_STORE_ADDR (NULL if unset) */
    const char *store_token;   /* COLLIE_STORE_TOKEN (NULL if unset) */
    bool insecure;             /* COLLIE_INSECURE: beyond loopback without a secret is allowed */
    int32_t handshake_ms;      /* COLLIE_HANDSHAKE_TIMEOUT_MS: bound of a rank's handshake */
    bool frame_mac;            /* COLLIE_FRAME_MAC: TCP frames carry a MAC (with a secret) */
    int32_t heartbeat_ms;      /* COLLIE_HEARTBEAT_MS: idle links carry a heartbeat (0: off) */
    int32_t suspect_ms;        /* COLLIE_SUSPECT_MS: a linked peer silent this long is suspected */
    int32_t rank;              /* COLLIE_RANK (-1 if unset) */
    int32_t world_size;        /* COLLIE_WORLD_SIZE (-1 if unset) */
    int32_t local_rank;        /* COLLIE_LOCAL_RANK (-1 if unset) */
    int32_t local_world_size;  /* COLLIE_LOCAL_WORLD_SIZE (-1 if unset) */
    int32_t node_rank;         /* COLLIE_NODE_RANK (-1 if unset) */
    int32_t restart_count;     /* COLLIE_RESTART_COUNT (-1 if unset) */
    const char *stats_dir;     /* COLLIE_STATS_DIR (NULL if unset) */
    const char *dump_dir;      /* COLLIE_DUMP_DIR (NULL if unset) */
    const char *plugin_path;   /* COLLIE_PLUGIN_PATH (NULL if unset) */
    const char *socket_ifname; /* COLLIE_SOCKET_IFNAME (NULL if unset) */
    const char *socket_addr;   /* COLLIE_SOCKET_ADDR (NULL if unset) */
    const char *cpu_transport; /* COLLIE_CPU_TRANSPORT (NULL if unset) */
    int32_t shm_ring_bytes;    /* COLLIE_SHM_RING_BYTES */
    int32_t shm_single_copy;   /* COLLIE_SHM_SINGLE_COPY */
    int32_t early_bytes;       /* COLLIE_EARLY_BYTES */
    const char *blocking_wait; /* COLLIE_BLOCKING_WAIT (NULL if unset; see policy.c) */
    const char *async_error;   /* COLLIE_ASYNC_ERROR_HANDLING (NULL if unset) */
    int32_t trace_buffer;      /* COLLIE_TRACE_BUFFER: flight-recorder entries per comm */
    int32_t check_args;        /* COLLIE_CHECK_ARGS: compare CUDA collectives' arguments */
    int spin;                  /* COLLIE_SPIN: CL_SPIN_AUTO, CL_SPIN_OFF or CL_SPIN_ON */
    int32_t nccl_poll_us;      /* COLLIE_NCCL_POLL_US */
    int32_t nccl_abort_ms;     /* COLLIE_NCCL_ABORT_TIMEOUT_MS */
} cl_config;

enum { CL_SPIN_AUTO = 0, CL_SPIN_OFF = 1, CL_SPIN_ON = 2 };

/* cl_spin_enabled: should progress threads and waiters poll briefly
 * instead of sleeping? A polling progress loop yields the core (or steps
 * back while a waiter helps it) every turn, a polling waiter every 16th
 * turn, or every turn when cl_cores_oversubscribed, so ranks that
 * outnumber the cores still share them. (COLLIE_SPIN; auto: on any machine
 * with more than one core) */
bool cl_spin_enabled(void);

/* cl_cores_oversubscribed: this host's ranks (COLLIE_LOCAL_WORLD_SIZE, else
 * COLLIE_WORLD_SIZE) outnumber its cores: with COLLIE_SPIN=auto an idle
 * progress loop then stops polling sooner. */
bool cl_cores_oversubscribed(void);

/* cl_config_get: the parsed settings (parsed on first use; invalid values
 * fall back to defaults here, but cl_config_check reports them). */
const cl_config *cl_config_get(void);

/* cl_config_reload: parse the environment again (for tests, and for
 * programs that set COLLIE_* variables before their first collie call but
 * after something already read them). Not safe while other threads read. */
void cl_config_reload(void);

/* cl_config_check: COLLIE_OK, or COLLIE_EINVAL with collie_last_error naming
 * the variable, its value and the allowed values. Logged once. */
int cl_config_check(void);

/* cl_config_print_table: write the settings table (name, default, meaning). */
void cl_config_print_table(FILE *f);

#endif
