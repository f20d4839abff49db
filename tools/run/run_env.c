/*
 * run_env.c — the ranks' environment, and the settings of other launchers
 * found in ours.
 *
 * Design notes
 *  - A rank's environment is ours without the names collie-run sets (and
 *    without COLLIE_STORE_TOKEN), then those names: collie's COLLIE_* and
 *    torchrun's (RUN_ENV_MAP in run.h), then the job's secret if there is
 *    one. MASTER_ADDR/MASTER_PORT are torch's rendezvous (run_master.c),
 *    not collie's store: that is COLLIE_STORE_ADDR. It is built before fork
 *    (the child only calls execvpe) and rewritten before a restart, whose
 *    count it carries.
 *  - NCCL's and PyTorch's settings that collie reads under a name of its
 *    own are named on stderr at start, once each, with collie's name: the
 *    job runs anyway.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

/* The variables collie-run sets for a rank: collie's and torchrun's. */
static const char *const run_env_names[] = {
#define RUN_ENV_NAME_(n) #n,
    RUN_ENV_MAP(RUN_ENV_NAME_)
#undef RUN_ENV_NAME_
};

static bool run_env_is_ours(const char *entry) {
    size_t len = strcspn(entry, "=");
    for (size_t j = 0; j < RUN_ENV_OURS; j++)
        if (strlen(run_env_names[j]) == len && strncmp(entry, run_env_names[j], len) == 0)
            return true;
    return false;
}

/* r->env[k] = "NAME=value" */
static void run_env_set(run_rank *r, int k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void run_env_set(run_rank *r, int k, const char *fmt, ...) {
    int n = snprintf(r->env[k], sizeof r->env[k], "%s=", run_env_names[k]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->env[k] + n, sizeof r->env[k] - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Write the rank's own variables (again before a restart: the count). An
 * entry left empty is not passed on. */
void run_rank_env_fill(const run_job *job, run_rank *r) {
    const run_opts *o = &job->opts;
    int local = r->rank - o->node_rank * o->nranks;
    run_env_set(r, RUN_ENV_COLLIE_RANK, "%d", r->rank);
    run_env_set(r, RUN_ENV_RANK, "%d", r->rank);
    run_env_set(r, RUN_ENV_COLLIE_WORLD_SIZE, "%d", o->world_size);
    run_env_set(r, RUN_ENV_WORLD_SIZE, "%d", o->world_size);
    run_env_set(r, RUN_ENV_COLLIE_LOCAL_RANK, "%d", local);
    run_env_set(r, RUN_ENV_LOCAL_RANK, "%d", local);
    run_env_set(r, RUN_ENV_COLLIE_LOCAL_WORLD_SIZE, "%d", o->nranks);
    run_env_set(r, RUN_ENV_LOCAL_WORLD_SIZE, "%d", o->nranks);
    run_env_set(r, RUN_ENV_COLLIE_NODE_RANK, "%d", o->node_rank);
    run_env_set(r, RUN_ENV_GROUP_RANK, "%d", o->node_rank);
    run_env_set(r, RUN_ENV_COLLIE_RESTART_COUNT, "%d", r->restarts);
    run_env_set(r, RUN_ENV_TORCHELASTIC_RESTART_COUNT, "%d", r->restarts);
    run_env_set(r, RUN_ENV_COLLIE_STORE_ADDR, "%s", job->store_addr);
    run_env_set(r, RUN_ENV_MASTER_ADDR, "%s", job->master_host);
    run_env_set(r, RUN_ENV_MASTER_PORT, "%s", job->master_port);
    if (job->stats_from)
        run_env_set(r, RUN_ENV_COLLIE_STATS_DIR, "%s", job->stats_from);
    else
        r->env[RUN_ENV_COLLIE_STATS_DIR][0] = '\0';
}

/* The rank's environment: ours without the names we set, plus them. */
int run_rank_env(run_job *job, run_rank *r) {
    size_t n = 0;
    while (environ[n])
        n++;
    r->envp = calloc(n + RUN_ENV_OURS + 2, sizeof *r->envp);
    if (!r->envp) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!run_env_is_ours(environ[i]) &&
            strncmp(environ[i], RUN_TOKEN_VAR "=", sizeof RUN_TOKEN_VAR) != 0)
            r->envp[k++] = environ[i];
    run_rank_env_fill(job, r);
    for (size_t j = 0; j < RUN_ENV_OURS; j++)
        if (r->env[j][0]) r->envp[k++] = r->env[j];
    if (job->token_env) r->envp[k++] = job->token_env; /* the job's secret */
    r->envp[k] = NULL;
    return 0;
}

/* NCCL's and PyTorch's ProcessGroupNCCL's settings that collie reads under
 * a name of its own: a job carried over from torchrun keeps them and would
 * silently lose their effect. */
static const struct {
    const char *theirs, *ours;
    bool nccl_reads; /* NCCL's own setting (not PyTorch's): NCCL still reads it */
} run_equivalents[] = {
    {"NCCL_BLOCKING_WAIT", "COLLIE_BLOCKING_WAIT", false},
    {"TORCH_NCCL_BLOCKING_WAIT", "COLLIE_BLOCKING_WAIT", false},
    {"NCCL_ASYNC_ERROR_HANDLING", "COLLIE_ASYNC_ERROR_HANDLING", false},
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "COLLIE_ASYNC_ERROR_HANDLING", false},
    {"TORCH_NCCL_TRACE_BUFFER_SIZE", "COLLIE_TRACE_BUFFER", false},
    {"TORCH_NCCL_DUMP_ON_TIMEOUT", "COLLIE_DUMP_DIR", false},
    {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "COLLIE_DUMP_DIR", false},
    {"TORCH_NCCL_ENABLE_MONITORING", "COLLIE_STALL_MS", false},
    {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "COLLIE_STALL_MS", false},
    {"TORCH_NCCL_DESYNC_DEBUG", "none needed: collie reports desyncs always", false},
    {"NCCL_SOCKET_IFNAME", "COLLIE_SOCKET_IFNAME", true},
    {"NCCL_DEBUG", "COLLIE_LOG", true},
    {"NCCL_DEBUG_FILE", "COLLIE_LOG_FILE", true},
};

/* One line per such setting found. NCCL_* settings without an equivalent
 * are NCCL's own business (the nccl backend's NCCL reads them): not named. */
void run_warn_foreign_settings(void) {
    for (char **e = environ; *e; e++) {
        bool torch = strncmp(*e, "TORCH_NCCL_", 11) == 0;
        if (!torch && strncmp(*e, "NCCL_", 5) != 0) continue;
        int len = (int)strcspn(*e, "=");
        const char *ours = NULL;
        bool nccl_reads = false;
        for (size_t i = 0; i < sizeof run_equivalents / sizeof run_equivalents[0]; i++)
            if ((int)strlen(run_equivalents[i].theirs) == len &&
                strncmp(*e, run_equivalents[i].theirs, (size_t)len) == 0) {
                ours = run_equivalents[i].ours;
                nccl_reads = run_equivalents[i].nccl_reads;
            }
        if (ours)
            fprintf(stderr,
                    "collie-run: warning: %.*s is set; collie does not read it: its equivalent "
                    "is %s%s\n",
                    len, *e, ours, nccl_reads ? " (NCCL itself still reads it)" : "");
        else if (torch)
            fprintf(stderr,
                    "collie-run: warning: %.*s is set; it is PyTorch's NCCL process group's and "
                    "has no collie equivalent\n",
                    len, *e);
    }
}
