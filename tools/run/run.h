/*
 * run.h — what the parts of collie-run share: the limits, the options, one
 * rank's and the job's state, and the calls between its files. The launcher's
 * design notes (threads, the store, states, exit statuses) open
 * tools/collie_run.c; each part's own notes open its file.
 *
 *   tools/collie_run.c      stopping, events, the poll loop (main)
 *   tools/run/run_args.c    the command line
 *   tools/run/run_env.c     the ranks' environment; other launchers' settings
 *   tools/run/run_spawn.c   starting a rank: pipes, the descriptor reserve, fork
 *   tools/run/run_out.c     the ranks' output, cut into prefixed lines
 *   tools/run/run_setup.c   setup and teardown: limits, signals, secret, store
 *   tools/run/run_master.c  torch's MASTER_ADDR/MASTER_PORT, apart from the store
 *   tools/run/run_stats.c   --stats: the table printed after the job
 */
#ifndef COLLIE_RUN_H
#define COLLIE_RUN_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "collie.h"
#include "tools/common/token_file.h"

#define RUN_MAX_RANKS        1024
#define RUN_MAX_RESTARTS     1000000
#define RUN_MAX_SECONDS      1e7          /* --timeout/--grace upper bound (~115 days) */
#define RUN_LINE_MAX         (64 * 1024)  /* longer lines are split */
#define RUN_OUT_MAX          (128 * 1024) /* output batch; holds any prefixed line */
#define RUN_TICK_MS          1000         /* poll at least this often */
#define RUN_REAP_MS          5000         /* wait this long for SIGKILLed ranks */
#define RUN_DRAIN_READS      16           /* reads of a reaped rank's pipe, at most */
#define RUN_DEFAULT_GRACE_MS 3000
#define RUN_EXIT_USAGE       2
#define RUN_EXIT_ERROR       1
#define RUN_EXIT_TIMEOUT     124
#define RUN_TOKEN_MAX        TOOL_TOKEN_MAX /* longest secret (tools/common/token_file.h) */
#define RUN_TOKEN_RANDOM     32             /* bytes of a secret made here (64 hex digits) */
#define RUN_TOKEN_VAR        "COLLIE_STORE_TOKEN"
#define RUN_FD_RESERVE       8   /* descriptors held back for starting ranks */
#define RUN_SPAWN_TRIES      20  /* tries to start a rank that finds no descriptor */
#define RUN_SPAWN_WAIT_MS    100 /* between them */

extern char **environ;

/* The variables collie-run sets for a rank: collie's and torchrun's. */
#define RUN_ENV_MAP(X)                                                                             \
    X(COLLIE_RANK)                                                                                 \
    X(COLLIE_WORLD_SIZE)                                                                           \
    X(COLLIE_STORE_ADDR)                                                                           \
    X(COLLIE_LOCAL_RANK)                                                                           \
    X(COLLIE_LOCAL_WORLD_SIZE)                                                                     \
    X(COLLIE_NODE_RANK)                                                                            \
    X(COLLIE_RESTART_COUNT)                                                                        \
    X(COLLIE_STATS_DIR)                                                                            \
    X(RANK)                                                                                        \
    X(WORLD_SIZE)                                                                                  \
    X(LOCAL_RANK)                                                                                  \
    X(LOCAL_WORLD_SIZE)                                                                            \
    X(GROUP_RANK)                                                                                  \
    X(MASTER_ADDR)                                                                                 \
    X(MASTER_PORT)                                                                                 \
    X(TORCHELASTIC_RESTART_COUNT)

/* their indices in run_rank.env */
enum {
#define RUN_ENV_INDEX_(n) RUN_ENV_##n,
    RUN_ENV_MAP(RUN_ENV_INDEX_)
#undef RUN_ENV_INDEX_
        RUN_ENV_OURS
};

typedef struct run_opts {
    int nranks;     /* ranks this launcher runs (on this node) */
    int world_size; /* ranks of the whole job */
    int nnodes, node_rank;
    bool store_external; /* node 0 of a multi-node job: do not serve --store */
    bool stats;
    int64_t timeout_ms; /* 0: none */
    int64_t grace_ms;
    bool keep_going;
    int restarts;
    const char *store_addr;  /* external store, or NULL: host one */
    const char *token_file;  /* --token-file, or NULL */
    const char *master_addr; /* --master-addr (torch's MASTER_ADDR), or NULL */
    int master_port;         /* --master-port (torch's MASTER_PORT), or 0 */
    char **argv;             /* the program and its arguments */
} run_opts;

/* One of a rank's output pipes. */
typedef struct run_stream {
    int fd;     /* read end, -1 when closed */
    int out_fd; /* where its lines go: 1 or 2 */
    char *buf;  /* RUN_LINE_MAX bytes: the incomplete line */
    size_t len;
} run_stream;

typedef struct run_rank {
    int rank;
    pid_t pid; /* > 0 until reaped; also the process group id */
    run_stream streams[2];
    char prefix[16];
    size_t prefix_len;
    char **envp;
    int restarts; /* times this rank was restarted */
    char env[RUN_ENV_OURS][300];
} run_rank;

typedef enum run_state { RUN_RUNNING, RUN_STOPPING } run_state;

/* What a pollfd of the main loop watches. */
typedef struct run_watch {
    run_rank *rank;
    int k; /* index into rank->streams */
} run_watch;

typedef struct run_job {
    run_opts opts;
    run_rank *ranks;
    int live; /* ranks not reaped yet */
    run_state state;
    int exit_code; /* -1 until something failed */
    int restarts_used;
    int64_t start_ms, kill_at_ms, give_up_at_ms;
    bool killed; /* SIGKILL sent */
    pid_t self;
    int sigfd, devnull;
    struct pollfd *pfds; /* 1 + 2 * nranks: the signalfd, then the pipes */
    run_watch *watched;  /* parallel to pfds */
    sigset_t old_mask;
    struct rlimit old_nofile;
    int reserve[RUN_FD_RESERVE]; /* held back for run_spawn; -1: not held */
    char store_addr[264];        /* the store's host:port, and apart */
    char store_host[256];
    char store_port[8];
    char master_host[256]; /* torch's MASTER_ADDR and MASTER_PORT (run_master.c) */
    char master_port[8];
    int master_fd;          /* holds MASTER_PORT on node 0, or -1 */
    char *token_env;        /* "COLLIE_STORE_TOKEN=<secret>" for the ranks, or NULL: none */
    char stats_dir[64];     /* --stats: where the ranks write, "" if not ours */
    const char *stats_from; /* the directory read after the job, or NULL */
    collie_engine *engine;
    collie_store_server *server;
    char *out; /* output batch */
    size_t out_len;
    int out_fd;
    bool out_dead[3]; /* our stdout/stderr got EPIPE */
} run_job;

/* ---- the calls between the parts ---------------------------------------- */

/* run_args.c: fills *o; returns -1 to go on, or the exit status (0 for
 * --help, RUN_EXIT_USAGE after saying what was wrong). */
int run_parse_args(int argc, char **argv, run_opts *o);
/* A decimal integer in min..max, nothing else around it. */
bool run_parse_int(const char *s, long min, long max, int *out);

/* run_env.c: the rank's environment into r->envp (0, or -1: out of
 * memory); run_rank_env_fill rewrites the rank's own variables (before a
 * restart: the count). */
int run_rank_env(run_job *job, run_rank *r);
void run_rank_env_fill(const run_job *job, run_rank *r);
/* One warning per NCCL/PyTorch setting in our environment collie ignores. */
void run_warn_foreign_settings(void);

/* run_spawn.c: start rank r (0), or say why not (-1). */
int run_spawn(run_job *job, run_rank *r);
/* Hold back the reserve's descriptors / give them up (false: none held). */
void run_reserve_fill(run_job *job);
bool run_reserve_release(run_job *job);

/* run_out.c: one read of a rank's pipe (true when it got bytes; at EOF the
 * stream is closed); after a rank is reaped, drain and close its pipes. */
bool run_stream_read(run_job *job, const run_rank *r, run_stream *s);
void run_rank_drain(run_job *job, run_rank *r);

/* run_setup.c: fds 0-2 exist; the job's setup (0, or -1 after saying why;
 * run_job_fini is then still called) and teardown. */
void run_fix_std_fds(void);
int run_job_init(run_job *job);
void run_job_fini(run_job *job);

/* run_master.c: torch's MASTER_ADDR/MASTER_PORT after the store's address
 * is known; on node 0 its port is held (0, or -1 after saying why). */
int run_master_init(run_job *job);

/* run_stats.c: the table of the stats files in dir; remove what --stats
 * made. */
void run_print_stats(const char *dir);
void run_stats_cleanup(const char *dir);

#endif
