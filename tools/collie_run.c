/*
 * collie_run.c — collie-run, the local launcher: hosts the key/value store,
 * starts N ranks, prefixes their output with the rank, and stops the job when
 * a rank fails.
 *
 *   collie-run -n N | -np N | --nproc-per-node M [--nnodes K --node-rank R]
 *              [--timeout S] [--grace S] [--keep-going] [--restarts K]
 *              [--store HOST:PORT [--store-external]] [--token-file F] [--stats]
 *              [--] program [args...]
 *
 * Design notes
 *  - One thread of ours runs the job; the engine's threads only serve the
 *    store and never touch launcher state. Everything happens in one poll()
 *    loop over a signalfd (SIGCHLD, SIGINT, SIGTERM: blocked before the engine
 *    starts, so no thread takes them) and the ranks' stdout/stderr pipes. The
 *    poll timeout is the nearest deadline (job timeout, kill grace), capped
 *    at RUN_TICK_MS, and children are reaped with WNOHANG.
 *  - The store is hosted here, not on rank 0, so it outlives any rank: a
 *    restarted rank finds it and peers still see abort keys. With --store the
 *    ranks use an external server and no engine is created — except on node
 *    0 of a multi-node job (--nnodes > 1), which serves the store at the
 *    port of --store (as torchrun's node 0 serves MASTER_PORT) unless
 *    --store-external says a server runs there already.
 *  - A multi-node job runs one collie-run per node with the same -np (or
 *    --nproc-per-node and --nnodes) and --store, and its own --node-rank:
 *    node R runs global ranks R*M .. R*M+M-1. Each rank gets the COLLIE_*
 *    variables and torchrun's names (RANK, WORLD_SIZE, LOCAL_RANK,
 *    LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/MASTER_PORT = the store,
 *    TORCHELASTIC_RESTART_COUNT), so programs written for either launcher
 *    find what they look for.
 *  - The job's secret (docs/security.md): the store requires it and every
 *    rank gets it as COLLIE_STORE_TOKEN in its environment (never on a
 *    command line, never printed), so the store and every handshake between
 *    ranks prove it and an outsider can neither use the store nor join. It
 *    is --token-file's, else the caller's COLLIE_STORE_TOKEN, else, when
 *    this launcher hosts the store on one node, 32 random bytes
 *    (RAND_bytes) in hex. A multi-node job needs the user's, the same on
 *    every node: without one it is refused. With an external --store on
 *    one node the ranks use the caller's, or none.
 *  - Descriptors: the store served here holds one per client, so at start
 *    the soft RLIMIT_NOFILE is raised to the hard limit (the ranks get the
 *    limit we were started with), and RUN_FD_RESERVE descriptors (copies of
 *    /dev/null) are held back: starting a rank that finds none free (EMFILE,
 *    ENFILE) gives up the reserve and tries again, then waits for some,
 *    RUN_SPAWN_TRIES times RUN_SPAWN_WAIT_MS at most, before it fails. The
 *    store also bounds what outsiders can hold (store/srv_conn.c).
 *  - --stats: the ranks write each comm's stats into a private directory
 *    when they destroy it (COLLIE_STATS_DIR); after the job the launcher
 *    prints one line per comm and rank from those files.
 *  - Each rank is the leader of its own process group: signals go to the
 *    group, so they also reach what the rank started (sh -c '...; sleep 30'),
 *    and Ctrl-C at a terminal reaches only the launcher, which forwards it
 *    once. Ranks read /dev/null as stdin. PR_SET_PDEATHSIG stops the ranks if
 *    the launcher itself is killed.
 *  - The engine's threads exist when we fork, so the child makes only
 *    async-signal-safe calls: its environment is built before fork and handed
 *    to execvpe; the "cannot run" message is written with writev.
 *  - Output: a rank's bytes are cut into lines and every line goes out with
 *    its "[rank] " prefix inside one buffered write(), so lines of different
 *    ranks never mix. Lines longer than RUN_LINE_MAX are split; a partial last
 *    line is completed with '\n'. When a rank is reaped, what is left in its
 *    pipes is drained and they are closed, so a background process it left
 *    behind cannot keep the job alive.
 *  - Writes to our own stdout/stderr block while the reader is slow: that is
 *    back-pressure (ranks then block on their pipes), the one wait the loop
 *    does not bound. EPIPE drops that output and the job goes on.
 *  - States: RUNNING → STOPPING (SIGTERM, or the forwarded signal, to every
 *    live rank; SIGKILL at the grace deadline; give up RUN_REAP_MS after
 *    SIGKILL) → done when every rank is reaped. The first cause of a stop
 *    fixes the exit status: the failing rank's code (128+signal if killed),
 *    124 for --timeout, 128+signal for SIGINT/SIGTERM. Failures of ranks
 *    that are being stopped are not reported. Exit 2 is a usage error, 1 a
 *    launcher error (the store could not start, fork failed).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "collie.h"

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
#define RUN_TOKEN_MAX        4096 /* longest secret (the store's CL_STORE_TOKEN_MAX) */
#define RUN_TOKEN_RANDOM     32   /* bytes of a secret made here (64 hex digits) */
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
    const char *store_addr; /* external store, or NULL: host one */
    const char *token_file; /* --token-file, or NULL */
    char **argv;            /* the program and its arguments */
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
    char store_addr[264];        /* the store's host:port, and apart (MASTER_ADDR, MASTER_PORT) */
    char store_host[256];
    char store_port[8];
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

/* ---- small helpers ------------------------------------------------------- */

static int64_t run_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void run_signame(int sig, char *buf, size_t n) {
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, n, "SIG%s", abbrev);
    else
        snprintf(buf, n, "%d", sig);
}

static int run_status_code(int wstatus) {
    return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

/* ---- command line -------------------------------------------------------- */

#define RUN_USAGE                                                                                  \
    "usage: collie-run -n N | -np N | --nproc-per-node M [options] [--] program [args...]\n"

static void run_usage(FILE *f) {
    fputs(RUN_USAGE
          "Start the ranks of program on this node with COLLIE_RANK, COLLIE_WORLD_SIZE,\n"
          "COLLIE_STORE_ADDR (and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, ...) set,\n"
          "serving the key/value store they share.\n"
          "  -n N, -np N           number of ranks in the job (1..1024)\n"
          "  --nproc-per-node M    ranks on this node (default: all of them)\n"
          "  --nnodes K            nodes in the job, one collie-run each (default 1)\n"
          "  --node-rank R         this node's index, 0..K-1 (default 0)\n"
          "  --store ADDR          the store at host:port: used instead of hosting one;\n"
          "                        with --nnodes > 1 node 0 serves it at that port\n"
          "  --store-external      node 0 too uses a store server already running\n"
          "  --token-file FILE     the job's secret (default: COLLIE_STORE_TOKEN, else a\n"
          "                        random one per job); --nnodes > 1 needs one, the same\n"
          "                        on every node\n"
          "  --timeout S           stop the job after S seconds and exit 124\n"
          "  --grace S             seconds from SIGTERM to SIGKILL when stopping (default 3)\n"
          "  --keep-going          let the other ranks continue when one fails\n"
          "  --restarts K          restart a failed rank, up to K times in all\n"
          "  --stats               print each comm's stats (collie_comm_get_stats) after\n"
          "                        the job\n"
          "  -h, --help            show this help\n",
          f);
}

static int run_usage_error(const char *fmt, const char *arg) {
    fputs("collie-run: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n" RUN_USAGE "Try 'collie-run --help' for more.\n", stderr);
    return RUN_EXIT_USAGE;
}

static bool run_parse_int(const char *s, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end != '\0' || errno != 0 || v < min || v > max) return false;
    *out = (int)v;
    return true;
}

/* Seconds, possibly fractional ("1.5"), as milliseconds. */
static bool run_parse_seconds(const char *s, bool allow_zero, int64_t *ms) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!((s[0] >= '0' && s[0] <= '9') || s[0] == '.') || *end != '\0' || errno != 0 ||
        !isfinite(v) || v > RUN_MAX_SECONDS || (v <= 0 && !allow_zero))
        return false;
    *ms = (int64_t)(v * 1000.0 + 0.5); /* no -lm: round by hand */
    if (*ms == 0 && !allow_zero) *ms = 1;
    return true;
}

/* host:port with a non-empty host and a port in 1..65535. */
static bool run_valid_addr(const char *addr) {
    const char *colon = strrchr(addr, ':');
    int port;
    return colon && colon != addr && run_parse_int(colon + 1, 1, 65535, &port);
}

/* Ranks per node and nodes from -n, --nproc-per-node and --nnodes (as
 * torchrun: world = nproc-per-node x nnodes). Returns -1 if consistent. */
static int run_check_layout(run_opts *o, int world, int per_node) {
    char msg[160];
    if (o->nnodes == 0) o->nnodes = 1;
    if (world == 0 && per_node == 0)
        return run_usage_error("%s", "-n N (or -np N, or --nproc-per-node M) is required");
    if (per_node == 0) {
        if (world % o->nnodes != 0) {
            snprintf(msg, sizeof msg, "-n %d ranks do not divide into --nnodes %d nodes", world,
                     o->nnodes);
            return run_usage_error("%s", msg);
        }
        per_node = world / o->nnodes;
    } else if (world == 0) {
        world = per_node * o->nnodes;
    } else if (world != per_node * o->nnodes) {
        snprintf(msg, sizeof msg, "-n %d is not --nproc-per-node %d x --nnodes %d", world, per_node,
                 o->nnodes);
        return run_usage_error("%s", msg);
    }
    if (world > RUN_MAX_RANKS) return run_usage_error("%s", "more than 1024 ranks in all");
    if (o->node_rank < 0) {
        if (o->nnodes > 1)
            return run_usage_error("%s", "--nnodes > 1 needs --node-rank (this node's index)");
        o->node_rank = 0;
    }
    if (o->node_rank >= o->nnodes) {
        snprintf(msg, sizeof msg, "--node-rank %d is not below --nnodes %d", o->node_rank,
                 o->nnodes);
        return run_usage_error("%s", msg);
    }
    if (o->nnodes > 1 && !o->store_addr)
        return run_usage_error("%s", "--nnodes > 1 needs --store HOST:PORT (node 0's address)");
    const char *tok = getenv(RUN_TOKEN_VAR);
    if (o->nnodes > 1 && !o->token_file && !(tok && *tok))
        return run_usage_error("%s", "--nnodes > 1 needs the job's secret, the same on every "
                                     "node: --token-file FILE or COLLIE_STORE_TOKEN (the store "
                                     "is reachable beyond this host)");
    o->nranks = per_node;
    o->world_size = world;
    return -1;
}

/* Fills *o; returns -1 to go on, or the exit status (0 for --help). */
static int run_parse_args(int argc, char **argv, run_opts *o) {
    enum {
        OPT_TIMEOUT = 256,
        OPT_GRACE,
        OPT_KEEP_GOING,
        OPT_RESTARTS,
        OPT_STORE,
        OPT_STORE_EXTERNAL,
        OPT_NPROC,
        OPT_NNODES,
        OPT_NODE_RANK,
        OPT_STATS,
        OPT_TOKEN_FILE,
    };
    static const struct option longopts[] = {
        {"nproc-per-node", required_argument, NULL, OPT_NPROC},
        {"nnodes", required_argument, NULL, OPT_NNODES},
        {"node-rank", required_argument, NULL, OPT_NODE_RANK},
        {"store-external", no_argument, NULL, OPT_STORE_EXTERNAL},
        {"stats", no_argument, NULL, OPT_STATS},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"grace", required_argument, NULL, OPT_GRACE},
        {"keep-going", no_argument, NULL, OPT_KEEP_GOING},
        {"restarts", required_argument, NULL, OPT_RESTARTS},
        {"store", required_argument, NULL, OPT_STORE},
        {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (run_opts){.grace_ms = RUN_DEFAULT_GRACE_MS, .node_rank = -1};
    int world = 0, per_node = 0;
    opterr = 0;
    int c;
    /* '+': stop at the program name; ':': report a missing value as ':' */
    while ((c = getopt_long(argc, argv, "+:n:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            /* mpirun's -np: getopt reads "-np" as -n with the value "p" */
            if (strcmp(argv[optind - 1], "-np") == 0) {
                if (optind >= argc) return run_usage_error("option '%s' needs a value", "-np");
                optarg = argv[optind++];
            }
            if (!run_parse_int(optarg, 1, RUN_MAX_RANKS, &world))
                return run_usage_error("-n needs a number of ranks from 1 to 1024, not '%s'",
                                       optarg);
            break;
        case OPT_NPROC:
            if (!run_parse_int(optarg, 1, RUN_MAX_RANKS, &per_node))
                return run_usage_error(
                    "--nproc-per-node needs a number of ranks from 1 to 1024, not '%s'", optarg);
            break;
        case OPT_NNODES:
            if (!run_parse_int(optarg, 1, RUN_MAX_RANKS, &o->nnodes))
                return run_usage_error("--nnodes needs a number of nodes from 1 to 1024, not '%s'",
                                       optarg);
            break;
        case OPT_NODE_RANK:
            if (!run_parse_int(optarg, 0, RUN_MAX_RANKS - 1, &o->node_rank))
                return run_usage_error("--node-rank needs a node index >= 0, not '%s'", optarg);
            break;
        case OPT_STORE_EXTERNAL: o->store_external = true; break;
        case OPT_STATS: o->stats = true; break;
        case OPT_TIMEOUT:
            if (!run_parse_seconds(optarg, false, &o->timeout_ms))
                return run_usage_error("--timeout needs a number of seconds > 0, not '%s'", optarg);
            break;
        case OPT_GRACE:
            if (!run_parse_seconds(optarg, true, &o->grace_ms))
                return run_usage_error("--grace needs a number of seconds >= 0, not '%s'", optarg);
            break;
        case OPT_KEEP_GOING: o->keep_going = true; break;
        case OPT_RESTARTS:
            if (!run_parse_int(optarg, 0, RUN_MAX_RESTARTS, &o->restarts))
                return run_usage_error("--restarts needs a count >= 0, not '%s'", optarg);
            break;
        case OPT_STORE:
            if (!run_valid_addr(optarg))
                return run_usage_error("--store needs host:port, not '%s'", optarg);
            o->store_addr = optarg;
            break;
        case OPT_TOKEN_FILE: o->token_file = optarg; break;
        case 'h': run_usage(stdout); return 0;
        case ':': return run_usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            if (optopt > 0 && optopt < 256) {
                char opt[3] = {'-', (char)optopt, '\0'};
                return run_usage_error("unknown option '%s'", opt);
            }
            return run_usage_error("unknown or malformed option '%s'", argv[optind - 1]);
        }
    }
    int rc = run_check_layout(o, world, per_node);
    if (rc >= 0) return rc;
    if (optind >= argc) return run_usage_error("%s", "no program to run");
    o->argv = argv + optind;
    return -1;
}

/* ---- output -------------------------------------------------------------- */

static void run_out_flush(run_job *job) {
    const char *p = job->out;
    size_t left = job->out_len;
    while (left > 0 && !job->out_dead[job->out_fd]) {
        ssize_t n = write(job->out_fd, p, left);
        if (n > 0) {
            p += n;
            left -= (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            /* someone made our stdout non-blocking: wait for room */
            struct pollfd pfd = {.fd = job->out_fd, .events = POLLOUT};
            poll(&pfd, 1, RUN_TICK_MS);
        } else if (n < 0 && errno != EINTR) {
            job->out_dead[job->out_fd] = true; /* EPIPE or worse: drop it */
        }
    }
    job->out_len = 0;
}

/* Queue "[rank] line" (plus '\n' if the line lacks one) for fd. */
static void run_out_line(run_job *job, const run_rank *r, int fd, const char *line, size_t len) {
    bool nl = len == 0 || line[len - 1] != '\n';
    size_t need = r->prefix_len + len + nl;
    if (fd != job->out_fd || job->out_len + need > RUN_OUT_MAX) run_out_flush(job);
    job->out_fd = fd;
    memcpy(job->out + job->out_len, r->prefix, r->prefix_len);
    memcpy(job->out + job->out_len + r->prefix_len, line, len);
    job->out_len += r->prefix_len + len;
    if (nl) job->out[job->out_len++] = '\n';
}

/* Emit the complete lines in s->buf (and the rest too when `all`). */
static void run_stream_emit(run_job *job, const run_rank *r, run_stream *s, bool all) {
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl) break;
        size_t end = (size_t)(nl - s->buf) + 1;
        run_out_line(job, r, s->out_fd, s->buf + start, end - start);
        start = end;
    }
    if (start < s->len && (all || (start == 0 && s->len == RUN_LINE_MAX))) {
        run_out_line(job, r, s->out_fd, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    run_out_flush(job);
}

static void run_stream_close(run_job *job, const run_rank *r, run_stream *s) {
    if (s->fd < 0) return;
    run_stream_emit(job, r, s, true);
    close(s->fd);
    s->fd = -1;
}

/* One read: emit the lines it completed; at EOF (or an error) close the
 * stream. Returns true when it got bytes. */
static bool run_stream_read(run_job *job, const run_rank *r, run_stream *s) {
    ssize_t n = read(s->fd, s->buf + s->len, RUN_LINE_MAX - s->len);
    if (n > 0) {
        s->len += (size_t)n;
        run_stream_emit(job, r, s, false);
        return true;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) run_stream_close(job, r, s);
    return false;
}

/* After a rank is reaped: take what is still in its pipes, then close them
 * (bounded: a process the rank left behind may still be writing). */
static void run_rank_drain(run_job *job, run_rank *r) {
    for (int k = 0; k < 2; k++) {
        run_stream *s = &r->streams[k];
        for (int i = 0; i < RUN_DRAIN_READS && s->fd >= 0 && run_stream_read(job, r, s); i++)
            continue;
        run_stream_close(job, r, s);
    }
}

/* ---- starting ranks ------------------------------------------------------ */

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
static void run_rank_env_fill(const run_job *job, run_rank *r) {
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
    run_env_set(r, RUN_ENV_MASTER_ADDR, "%s", job->store_host);
    run_env_set(r, RUN_ENV_MASTER_PORT, "%s", job->store_port);
    if (job->stats_from)
        run_env_set(r, RUN_ENV_COLLIE_STATS_DIR, "%s", job->stats_from);
    else
        r->env[RUN_ENV_COLLIE_STATS_DIR][0] = '\0';
}

/* The rank's environment: ours without the names we set, plus them. */
static int run_rank_env(run_job *job, run_rank *r) {
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

/* In the child, between fork and exec: async-signal-safe calls only. */
static void run_child(const run_job *job, const run_rank *r, int out_fd, int err_fd) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != job->self) _exit(127); /* the launcher died before prctl */
    dup2(job->devnull, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(SIGPIPE, &dfl, NULL);
    setrlimit(RLIMIT_NOFILE, &job->old_nofile);
    sigprocmask(SIG_SETMASK, &job->old_mask, NULL);

    const char *prog = job->opts.argv[0];
    execvpe(prog, job->opts.argv, r->envp);
    const char *why = strerrordesc_np(errno);
    if (!why) why = "unknown error";
    struct iovec iov[] = {
        {(void *)"collie-run: cannot run '", 24},
        {(void *)prog, strlen(prog)},
        {(void *)"': ", 3},
        {(void *)why, strlen(why)},
        {(void *)"\n", 1},
    };
    ssize_t ignored = writev(2, iov, 5);
    (void)ignored;
    _exit(127);
}

/* Hold back the descriptors of the reserve that are not held. */
static void run_reserve_fill(run_job *job) {
    for (int i = 0; i < RUN_FD_RESERVE; i++)
        if (job->reserve[i] < 0 && job->devnull >= 0)
            job->reserve[i] = fcntl(job->devnull, F_DUPFD_CLOEXEC, 0);
}

/* Give the reserve up; false if none was held. */
static bool run_reserve_release(run_job *job) {
    bool any = false;
    for (int i = 0; i < RUN_FD_RESERVE; i++)
        if (job->reserve[i] >= 0) {
            close(job->reserve[i]);
            job->reserve[i] = -1;
            any = true;
        }
    return any;
}

/* The two pipes of a rank; a lack of descriptors is waited out (design
 * notes). 0, or -1 with errno set. */
static int run_pipes(run_job *job, const run_rank *r, int out[2], int err[2]) {
    for (int attempt = 0;; attempt++) {
        if (pipe2(out, O_CLOEXEC) == 0) {
            if (pipe2(err, O_CLOEXEC) == 0) return 0;
            int e = errno;
            close(out[0]);
            close(out[1]);
            errno = e;
        }
        if ((errno != EMFILE && errno != ENFILE) || attempt >= RUN_SPAWN_TRIES) return -1;
        if (attempt == 0)
            fprintf(stderr,
                    "collie-run: no descriptor free to start rank %d (%s); using the reserve and "
                    "trying for %d ms\n",
                    r->rank, strerror(errno), RUN_SPAWN_TRIES * RUN_SPAWN_WAIT_MS);
        if (!run_reserve_release(job)) {
            struct timespec ts = {0, RUN_SPAWN_WAIT_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}

static int run_spawn(run_job *job, run_rank *r) {
    int out[2], err[2];
    if (run_pipes(job, r, out, err) != 0) goto fail;
    pid_t pid = fork();
    if (pid == 0) run_child(job, r, out[1], err[1]);
    int fork_errno = errno;
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        errno = fork_errno;
        goto fail;
    }
    setpgid(pid, pid); /* also done by the child; whichever runs first wins */
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    r->streams[0] = (run_stream){.fd = out[0], .out_fd = 1, .buf = r->streams[0].buf};
    r->streams[1] = (run_stream){.fd = err[0], .out_fd = 2, .buf = r->streams[1].buf};
    r->pid = pid;
    job->live++;
    run_reserve_fill(job); /* again, if it was used */
    return 0;
fail:
    fprintf(stderr, "collie-run: cannot start rank %d: %s\n", r->rank, strerror(errno));
    return -1;
}

/* ---- stopping ------------------------------------------------------------ */

static void run_signal_all(run_job *job, int sig) {
    for (int i = 0; i < job->opts.nranks; i++)
        if (job->ranks[i].pid > 0) kill(-job->ranks[i].pid, sig);
}

/* Signal every live rank with `sig` and arm the SIGKILL deadline. */
static void run_stop(run_job *job, int sig) {
    if (job->state == RUN_STOPPING) return;
    job->state = RUN_STOPPING;
    job->kill_at_ms = run_now_ms() + job->opts.grace_ms;
    if (job->live == 0) return;
    char name[32];
    run_signame(sig, name, sizeof name);
    fprintf(stderr, "collie-run: stopping %d rank(s): %s now, SIGKILL after %g s\n", job->live,
            name, (double)job->opts.grace_ms / 1000.0);
    run_signal_all(job, sig);
}

static void run_set_exit(run_job *job, int code) {
    if (job->exit_code < 0) job->exit_code = code;
}

/* SIGKILL every live rank; `why` ends "rank R still running ...". */
static void run_kill_survivors(run_job *job, const char *why) {
    for (int i = 0; i < job->opts.nranks; i++)
        if (job->ranks[i].pid > 0)
            fprintf(stderr, "collie-run: rank %d still running %s: SIGKILL\n", job->ranks[i].rank,
                    why);
    run_signal_all(job, SIGKILL);
    job->killed = true;
    job->give_up_at_ms = run_now_ms() + RUN_REAP_MS;
}

/* ---- events -------------------------------------------------------------- */

static void run_report_exit(const run_rank *r, int wstatus) {
    if (WIFEXITED(wstatus)) {
        fprintf(stderr, "collie-run: rank %d exited with status %d\n", r->rank,
                WEXITSTATUS(wstatus));
        return;
    }
    char name[32];
    run_signame(WTERMSIG(wstatus), name, sizeof name);
    fprintf(stderr, "collie-run: rank %d killed by signal %s%s\n", r->rank, name,
            WCOREDUMP(wstatus) ? " (core dumped)" : "");
}

static void run_on_exit(run_job *job, run_rank *r, int wstatus) {
    if ((WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) || job->state == RUN_STOPPING) return;
    run_report_exit(r, wstatus);
    if (job->restarts_used < job->opts.restarts) {
        job->restarts_used++;
        r->restarts++;
        run_rank_env_fill(job, r); /* the restart counts */
        fprintf(stderr, "collie-run: restarting rank %d (restart %d of %d)\n", r->rank,
                job->restarts_used, job->opts.restarts);
        if (run_spawn(job, r) == 0) return;
        run_set_exit(job, RUN_EXIT_ERROR);
        run_stop(job, SIGTERM);
        return;
    }
    run_set_exit(job, run_status_code(wstatus));
    if (!job->opts.keep_going) run_stop(job, SIGTERM);
}

static void run_reap(run_job *job) {
    int wstatus;
    pid_t pid;
    while ((pid = waitpid(-1, &wstatus, WNOHANG)) > 0) {
        for (int i = 0; i < job->opts.nranks; i++) {
            run_rank *r = &job->ranks[i];
            if (r->pid != pid) continue;
            r->pid = 0;
            job->live--;
            run_rank_drain(job, r); /* its last words come before our verdict */
            run_on_exit(job, r, wstatus);
            break;
        }
    }
}

static void run_on_signal(run_job *job, int sig) {
    char name[32], why[64];
    run_signame(sig, name, sizeof name);
    if (job->state == RUN_STOPPING) { /* asked twice: stop waiting */
        snprintf(why, sizeof why, "when %s came during the stop", name);
        if (!job->killed) run_kill_survivors(job, why);
        return;
    }
    fprintf(stderr, "collie-run: got %s, forwarding it to the ranks\n", name);
    job->exit_code = 128 + sig;
    run_stop(job, sig);
}

static void run_read_signals(run_job *job) {
    struct signalfd_siginfo si;
    while (read(job->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD)
            run_reap(job);
        else
            run_on_signal(job, (int)si.ssi_signo);
    }
}

/* Deadlines; returns false when the launcher gives up waiting. */
static bool run_check_deadlines(run_job *job) {
    int64_t now = run_now_ms();
    if (job->state == RUN_RUNNING && job->opts.timeout_ms > 0 &&
        now >= job->start_ms + job->opts.timeout_ms) {
        fprintf(stderr, "collie-run: job timed out after %g s\n",
                (double)job->opts.timeout_ms / 1000.0);
        job->exit_code = RUN_EXIT_TIMEOUT;
        run_stop(job, SIGTERM);
    }
    if (job->state == RUN_STOPPING && !job->killed && job->live > 0 && now >= job->kill_at_ms)
        run_kill_survivors(job, "after the grace period");
    if (job->killed && job->live > 0 && now >= job->give_up_at_ms) {
        for (int i = 0; i < job->opts.nranks; i++)
            if (job->ranks[i].pid > 0)
                fprintf(stderr, "collie-run: rank %d did not exit after SIGKILL; giving up\n",
                        job->ranks[i].rank);
        return false;
    }
    return true;
}

static int run_poll_timeout(const run_job *job) {
    int64_t now = run_now_ms(), next = now + RUN_TICK_MS;
    if (job->state == RUN_RUNNING && job->opts.timeout_ms > 0 &&
        job->start_ms + job->opts.timeout_ms < next)
        next = job->start_ms + job->opts.timeout_ms;
    if (job->state == RUN_STOPPING && !job->killed && job->kill_at_ms < next)
        next = job->kill_at_ms;
    if (job->killed && job->give_up_at_ms < next) next = job->give_up_at_ms;
    return next > now ? (int)(next - now) : 0;
}

/* The main loop: until every rank is reaped (or SIGKILL did not help). */
static void run_loop(run_job *job) {
    while (job->live > 0) {
        size_t n = 0;
        job->pfds[n++] = (struct pollfd){.fd = job->sigfd, .events = POLLIN};
        for (int i = 0; i < job->opts.nranks; i++)
            for (int k = 0; k < 2; k++) {
                if (job->ranks[i].streams[k].fd < 0) continue;
                job->watched[n] = (run_watch){&job->ranks[i], k};
                job->pfds[n++] =
                    (struct pollfd){.fd = job->ranks[i].streams[k].fd, .events = POLLIN};
            }
        if (poll(job->pfds, n, run_poll_timeout(job)) < 0 && errno != EINTR) {
            fprintf(stderr, "collie-run: poll: %s\n", strerror(errno));
            break;
        }
        for (size_t i = 1; i < n; i++) {
            run_rank *r = job->watched[i].rank;
            run_stream *s = &r->streams[job->watched[i].k];
            if (job->pfds[i].revents != 0 && s->fd == job->pfds[i].fd) run_stream_read(job, r, s);
        }
        run_read_signals(job);
        run_reap(job); /* SIGCHLDs coalesce; reaping again is cheap */
        if (!run_check_deadlines(job)) break;
    }
}

/* ---- settings of other launchers ------------------------------------------ */

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
static void run_warn_foreign_settings(void) {
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

/* ---- --stats ---------------------------------------------------------------- */

typedef struct run_stat_row {
    char comm[80], status[32];
    long long gen, rank, posted, completed, failed, in_flight, bytes, stalls;
    long long p50_us, p99_us; /* bucket upper bounds, -1: beyond the last */
    char failures[160];
} run_stat_row;

static long long run_json_int(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : 0;
}

/* The bucket bound under which `q` of the latencies (all kinds) fall. */
static long long run_quantile_us(json_t *root, double q) {
    json_t *le = json_object_get(root, "latency_us_le"), *lat = json_object_get(root, "latency");
    size_t nb = json_array_size(le);
    if (nb == 0 || nb > 64) return 0;
    unsigned long long sum[64] = {0}, total = 0;
    const char *op;
    json_t *h;
    json_object_foreach(lat, op, h) {
        json_t *b = json_object_get(h, "buckets");
        for (size_t i = 0; i < nb && i < json_array_size(b); i++) {
            sum[i] += (unsigned long long)json_integer_value(json_array_get(b, i));
            total += (unsigned long long)json_integer_value(json_array_get(b, i));
        }
    }
    if (total == 0) return 0;
    unsigned long long seen = 0;
    for (size_t i = 0; i < nb; i++) {
        seen += sum[i];
        if ((double)seen >= q * (double)total)
            return (long long)json_integer_value(json_array_get(le, i));
    }
    return -1;
}

static bool run_stat_read(const char *path, run_stat_row *row) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, "collie-run: stats file %s: %s\n", path, je.text);
        return false;
    }
    memset(row, 0, sizeof *row);
    snprintf(row->comm, sizeof row->comm, "%s",
             json_string_value(json_object_get(root, "comm")) ?: "?");
    snprintf(row->status, sizeof row->status, "%s",
             json_string_value(json_object_get(root, "status")) ?: "?");
    row->gen = run_json_int(root, "generation");
    row->rank = run_json_int(root, "rank");
    row->posted = run_json_int(root, "posted");
    row->completed = run_json_int(root, "completed");
    row->failed = run_json_int(root, "failed");
    row->in_flight = run_json_int(root, "in_flight");
    row->bytes = run_json_int(root, "bytes");
    row->stalls = run_json_int(root, "stalls");
    row->p50_us = run_quantile_us(root, 0.5);
    row->p99_us = run_quantile_us(root, 0.99);
    const char *name;
    json_t *n;
    size_t len = 0;
    json_object_foreach(json_object_get(root, "failed_by_status"), name, n) {
        int k = snprintf(row->failures + len, sizeof row->failures - len, "%s%s %lld",
                         len ? ", " : "", name, (long long)json_integer_value(n));
        if (k < 0 || (size_t)k >= sizeof row->failures - len) break;
        len += (size_t)k;
    }
    json_decref(root);
    return true;
}

static int run_stat_cmp(const void *a, const void *b) {
    const run_stat_row *x = a, *y = b;
    int c = strcmp(x->comm, y->comm);
    if (c) return c;
    if (x->gen != y->gen) return x->gen < y->gen ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int run_stat_file(const struct dirent *d) {
    size_t n = strlen(d->d_name);
    return strncmp(d->d_name, "stats-", 6) == 0 && n > 5 && strcmp(d->d_name + n - 5, ".json") == 0;
}

static void run_fmt_us(char *buf, size_t n, long long us) {
    if (us < 0)
        snprintf(buf, n, "long");
    else
        snprintf(buf, n, "<=%lld", us);
}

/* After the job: one line per comm and rank from the files the ranks wrote. */
static void run_print_stats(const char *dir) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, run_stat_file, alphasort);
    if (n < 0) {
        fprintf(stderr, "collie-run: stats: cannot read %s: %s\n", dir, strerror(errno));
        return;
    }
    run_stat_row *rows = calloc((size_t)n + 1, sizeof *rows);
    int nrows = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (rows && run_stat_read(path, &rows[nrows])) nrows++;
        free(names[i]);
    }
    free(names);
    if (nrows == 0) {
        fprintf(stderr, "collie-run: stats: no comm wrote any (none was destroyed?)\n");
        free(rows);
        return;
    }
    qsort(rows, (size_t)nrows, sizeof *rows, run_stat_cmp);
    fprintf(stderr, "collie-run: stats per comm and rank (latency: post to completion, "
                    "all kinds)\n");
    fprintf(stderr, "%-16s %4s %5s %9s %9s %7s %8s %13s %9s %9s %6s  %s\n", "comm", "gen", "rank",
            "posted", "completed", "failed", "inflight", "bytes", "p50_us", "p99_us", "stalls",
            "status");
    for (int i = 0; i < nrows; i++) {
        const run_stat_row *r = &rows[i];
        char p50[24], p99[24];
        run_fmt_us(p50, sizeof p50, r->p50_us);
        run_fmt_us(p99, sizeof p99, r->p99_us);
        fprintf(stderr, "%-16s %4lld %5lld %9lld %9lld %7lld %8lld %13lld %9s %9s %6lld  %s%s%s\n",
                r->comm, r->gen, r->rank, r->posted, r->completed, r->failed, r->in_flight,
                r->bytes, p50, p99, r->stalls, r->status, r->failures[0] ? "; failed: " : "",
                r->failures);
    }
    free(rows);
}

/* Remove the directory --stats made, with the files the ranks wrote. */
static void run_stats_cleanup(const char *dir) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
            unlink(path);
        }
        free(names[i]);
    }
    free(names);
    rmdir(dir);
}

/* ---- setup and teardown -------------------------------------------------- */

/* Make sure fds 0-2 exist, so our pipes never land on them. */
static void run_fix_std_fds(void) {
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0) break;
}

/* The soft RLIMIT_NOFILE up to the hard one (the store holds one per
 * client; 2 pipes per rank must fit too); children get the old one. */
static void run_raise_nofile(run_job *job) {
    getrlimit(RLIMIT_NOFILE, &job->old_nofile);
    rlim_t need = 2 * (rlim_t)job->opts.nranks + 64 + RUN_FD_RESERVE;
    struct rlimit lim = job->old_nofile;
    if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur == lim.rlim_max) return;
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) == 0) return;
    /* an infinite hard limit is more than the kernel allows (nr_open) */
    lim.rlim_cur = job->old_nofile.rlim_cur > need ? job->old_nofile.rlim_cur : need;
    for (rlim_t v = (rlim_t)1 << 20; v > lim.rlim_cur; v >>= 1) {
        struct rlimit try = {v, lim.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &try) == 0) return;
    }
    setrlimit(RLIMIT_NOFILE, &lim);
}

/* Block the signals we take through the signalfd before any thread starts.
 * SIGINT/SIGTERM ignored on entry (a background job of a script) stay
 * ignored, for us and for the ranks, as a shell would do. */
static int run_signals_init(run_job *job) {
    static const int sigs[] = {SIGCHLD, SIGINT, SIGTERM};
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaddset(&set, sigs[i]);
    }
    if (sigprocmask(SIG_BLOCK, &set, &job->old_mask) != 0) return -1;
    job->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout is EPIPE, not death */
    return job->sigfd < 0 ? -1 : 0;
}

/* The job's secret into job->token_env (see the design notes); 0, or -1
 * after saying why. */
static int run_token_init(run_job *job) {
    const run_opts *o = &job->opts;
    char buf[RUN_TOKEN_MAX + 2];
    size_t n = 0;
    if (o->token_file) {
        FILE *f = fopen(o->token_file, "r");
        if (!f) {
            fprintf(stderr, "collie-run: cannot open the token file %s: %s\n", o->token_file,
                    strerror(errno));
            return -1;
        }
        struct stat sb;
        if (fstat(fileno(f), &sb) != 0) {
            fprintf(stderr, "collie-run: cannot stat the token file %s: %s\n", o->token_file,
                    strerror(errno));
            fclose(f);
            return -1;
        }
        if ((sb.st_mode & 077) != 0) { /* as ssh with a key: a secret others can read is none */
            fprintf(stderr,
                    "collie-run: the token file %s can be read or written by group or others "
                    "(mode %04o): keep it readable by its owner only (chmod 600 %s)\n",
                    o->token_file, (unsigned)(sb.st_mode & 07777), o->token_file);
            fclose(f);
            return -1;
        }
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
                         buf[n - 1] == '\t'))
            n--;
        if (n == 0 || n > RUN_TOKEN_MAX || memchr(buf, '\0', n)) {
            fprintf(stderr, "collie-run: the token file %s must hold 1 to %d bytes, without NUL\n",
                    o->token_file, RUN_TOKEN_MAX);
            OPENSSL_cleanse(buf, sizeof buf);
            return -1;
        }
        buf[n] = '\0';
    } else if (getenv(RUN_TOKEN_VAR) && *getenv(RUN_TOKEN_VAR)) {
        snprintf(buf, sizeof buf, "%s", getenv(RUN_TOKEN_VAR));
    } else if (!o->store_addr) { /* we host the store, on this node only: a secret of our own */
        unsigned char raw[RUN_TOKEN_RANDOM];
        if (RAND_bytes(raw, sizeof raw) != 1) {
            fprintf(stderr, "collie-run: RAND_bytes failed: no secret for the job\n");
            return -1;
        }
        for (size_t i = 0; i < sizeof raw; i++)
            snprintf(buf + 2 * i, 3, "%02x", raw[i]);
        OPENSSL_cleanse(raw, sizeof raw);
    } else {
        return 0; /* an external store on one node: the ranks use what it uses */
    }
    size_t len = sizeof RUN_TOKEN_VAR + strlen(buf) + 1;
    job->token_env = malloc(len);
    if (job->token_env) snprintf(job->token_env, len, "%s=%s", RUN_TOKEN_VAR, buf);
    OPENSSL_cleanse(buf, sizeof buf);
    if (!job->token_env) fprintf(stderr, "collie-run: out of memory\n");
    return job->token_env ? 0 : -1;
}

static int run_store_init(run_job *job) {
    const run_opts *o = &job->opts;
    const char *addr = o->store_addr;
    char local[32];
    /* node 0 of a multi-node job serves the store at --store's port */
    bool serve_at = addr && o->nnodes > 1 && o->node_rank == 0 && !o->store_external;
    if (!addr || serve_at) {
        int port = 0;
        if (serve_at) run_parse_int(strrchr(addr, ':') + 1, 1, 65535, &port);
        collie_engine_opts eo = COLLIE_ENGINE_OPTS_INIT;
        eo.name = "collie-run";
        int rc = collie_engine_create(&eo, &job->engine);
        collie_store_server_opts so = COLLIE_STORE_SERVER_OPTS_INIT;
        so.token = job->token_env ? strchr(job->token_env, '=') + 1 : NULL;
        if (rc == COLLIE_OK)
            rc = collie_store_server_create(job->engine, serve_at ? "0.0.0.0" : "127.0.0.1",
                                            (uint16_t)port, &so, &job->server);
        if (rc != COLLIE_OK) {
            fprintf(stderr, "collie-run: cannot start the store%s%s: %s%s%s\n",
                    serve_at ? " at " : "", serve_at ? addr : "", collie_strerror(rc),
                    *collie_last_error() ? ": " : "", collie_last_error());
            if (serve_at)
                fprintf(stderr, "collie-run: (--store-external if a store server runs there "
                                "already)\n");
            return -1;
        }
        if (!serve_at) {
            snprintf(local, sizeof local, "127.0.0.1:%u", collie_store_server_port(job->server));
            addr = local;
        }
    }
    const char *colon = strrchr(addr, ':');
    int hlen = (int)(colon - addr);
    snprintf(job->store_port, sizeof job->store_port, "%s", colon + 1);
    snprintf(job->store_addr, sizeof job->store_addr, "%s", addr);
    if (hlen >= 2 && addr[0] == '[' && addr[hlen - 1] == ']') { /* [::1]:port */
        addr++;
        hlen -= 2;
    }
    snprintf(job->store_host, sizeof job->store_host, "%.*s", hlen, addr);
    return 0;
}

static int run_job_init(run_job *job) {
    job->self = getpid();
    job->exit_code = -1;
    job->sigfd = job->devnull = -1;
    for (int i = 0; i < RUN_FD_RESERVE; i++)
        job->reserve[i] = -1;
    job->out_fd = 1;
    run_raise_nofile(job);
    if (run_signals_init(job) != 0) {
        fprintf(stderr, "collie-run: signal setup: %s\n", strerror(errno));
        return -1;
    }
    job->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    run_reserve_fill(job);
    job->out = malloc(RUN_OUT_MAX);
    job->ranks = calloc((size_t)job->opts.nranks, sizeof *job->ranks);
    job->pfds = calloc(1 + 2 * (size_t)job->opts.nranks, sizeof *job->pfds);
    job->watched = calloc(1 + 2 * (size_t)job->opts.nranks, sizeof *job->watched);
    if (job->devnull < 0 || !job->out || !job->ranks || !job->pfds || !job->watched) {
        fprintf(stderr, "collie-run: setup: %s\n", strerror(errno));
        return -1;
    }
    if (run_token_init(job) != 0 || run_store_init(job) != 0) return -1;
    job->stats_from = getenv("COLLIE_STATS_DIR"); /* the user's: kept, passed on */
    if (job->opts.stats && !job->stats_from) {
        snprintf(job->stats_dir, sizeof job->stats_dir, "/tmp/collie-stats-XXXXXX");
        if (!mkdtemp(job->stats_dir)) {
            fprintf(stderr, "collie-run: --stats: cannot make a directory: %s\n", strerror(errno));
            job->stats_dir[0] = '\0';
            return -1;
        }
        job->stats_from = job->stats_dir;
    }
    for (int i = 0; i < job->opts.nranks; i++) {
        run_rank *r = &job->ranks[i];
        r->rank = job->opts.node_rank * job->opts.nranks + i;
        r->streams[0].fd = r->streams[1].fd = -1;
        r->prefix_len = (size_t)snprintf(r->prefix, sizeof r->prefix, "[%d] ", r->rank);
        r->streams[0].buf = malloc(RUN_LINE_MAX);
        r->streams[1].buf = malloc(RUN_LINE_MAX);
        if (!r->streams[0].buf || !r->streams[1].buf || run_rank_env(job, r) != 0) {
            fprintf(stderr, "collie-run: out of memory\n");
            return -1;
        }
    }
    return 0;
}

static void run_job_fini(run_job *job) {
    for (int i = 0; job->ranks && i < job->opts.nranks; i++) {
        run_rank *r = &job->ranks[i];
        for (int k = 0; k < 2; k++) {
            if (r->streams[k].fd >= 0) close(r->streams[k].fd);
            free(r->streams[k].buf);
        }
        free(r->envp);
    }
    free(job->ranks);
    free(job->pfds);
    free(job->watched);
    free(job->out);
    if (job->token_env) OPENSSL_cleanse(job->token_env, strlen(job->token_env));
    free(job->token_env);
    collie_store_server_destroy(job->server);
    collie_engine_destroy(job->engine);
    run_reserve_release(job);
    if (job->devnull >= 0) close(job->devnull);
    if (job->sigfd >= 0) close(job->sigfd);
}

int main(int argc, char **argv) {
    /* before the job secret's RAND_bytes: the first initialisation decides,
     * and the store's progress thread must never see libcrypto torn down by
     * exit() (engine.c, "exit() with engines running") */
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    run_job job = {0};
    int rc = run_parse_args(argc, argv, &job.opts);
    if (rc >= 0) return rc;
    run_fix_std_fds();
    run_warn_foreign_settings();
    if (run_job_init(&job) != 0) {
        if (job.stats_dir[0]) run_stats_cleanup(job.stats_dir);
        run_job_fini(&job);
        return RUN_EXIT_ERROR;
    }
    job.start_ms = run_now_ms();
    for (int i = 0; i < job.opts.nranks && job.state == RUN_RUNNING; i++) {
        if (run_spawn(&job, &job.ranks[i]) != 0) {
            run_set_exit(&job, RUN_EXIT_ERROR);
            run_stop(&job, SIGTERM);
        }
    }
    run_loop(&job);
    if (job.opts.stats) run_print_stats(job.stats_from);
    if (job.stats_dir[0]) run_stats_cleanup(job.stats_dir);
    run_job_fini(&job);
    return job.exit_code < 0 ? 0 : job.exit_code;
}
