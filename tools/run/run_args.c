/*
 * run_args.c — collie-run's command line: the options, their values and the
 * job's layout (ranks per node, nodes, this node's index).
 *
 * Design notes
 *  - A usage error says what was wrong, the usage line and where the help
 *    is, and exits 2 (RUN_EXIT_USAGE); --help prints to stdout and exits 0.
 *  - getopt stops at the program's name ('+'), so the program's own options
 *    are never ours; mpirun's -np is read by hand (getopt sees -n "p").
 *  - The layout follows torchrun: world = nproc-per-node x nnodes; a
 *    multi-node job needs --store, --node-rank and the job's secret.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

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
          "  --master-addr HOST    torch's MASTER_ADDR (default: --store's host with\n"
          "                        --nnodes > 1, else 127.0.0.1)\n"
          "  --master-port P       torch's MASTER_PORT (default: --store's port + 1 with\n"
          "                        --nnodes > 1, else a free port held for the job)\n"
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

bool run_parse_int(const char *s, long min, long max, int *out) {
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
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
};

static const struct option run_longopts[] = {
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
    {"master-addr", required_argument, NULL, OPT_MASTER_ADDR},
    {"master-port", required_argument, NULL, OPT_MASTER_PORT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* One option c (getopt_long's answer): -1 to go on, or the exit status. */
static int run_parse_opt(int c, int argc, char **argv, run_opts *o, int *world, int *per_node) {
    switch (c) {
    case 'n':
        /* mpirun's -np: getopt reads "-np" as -n with the value "p" */
        if (strcmp(argv[optind - 1], "-np") == 0) {
            if (optind >= argc) return run_usage_error("option '%s' needs a value", "-np");
            optarg = argv[optind++];
        }
        if (!run_parse_int(optarg, 1, RUN_MAX_RANKS, world))
            return run_usage_error("-n needs a number of ranks from 1 to 1024, not '%s'", optarg);
        break;
    case OPT_NPROC:
        if (!run_parse_int(optarg, 1, RUN_MAX_RANKS, per_node))
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
    case OPT_MASTER_ADDR:
        if (!*optarg || strlen(optarg) > 255 || strpbrk(optarg, "[] \t\n"))
            return run_usage_error("--master-addr needs a host (no port, no brackets), not '%s'",
                                   optarg);
        o->master_addr = optarg;
        break;
    case OPT_MASTER_PORT:
        if (!run_parse_int(optarg, 1, 65535, &o->master_port))
            return run_usage_error("--master-port needs a port from 1 to 65535, not '%s'", optarg);
        break;
    case 'h': run_usage(stdout); return 0;
    case ':': return run_usage_error("option '%s' needs a value", argv[optind - 1]);
    default:
        if (optopt > 0 && optopt < 256) {
            char opt[3] = {'-', (char)optopt, '\0'};
            return run_usage_error("unknown option '%s'", opt);
        }
        return run_usage_error("unknown or malformed option '%s'", argv[optind - 1]);
    }
    return -1;
}

/* Fills *o; returns -1 to go on, or the exit status (0 for --help). */
int run_parse_args(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.grace_ms = RUN_DEFAULT_GRACE_MS, .node_rank = -1};
    int world = 0, per_node = 0;
    opterr = 0;
    int c;
    /* '+': stop at the program name; ':': report a missing value as ':' */
    while ((c = getopt_long(argc, argv, "+:n:h", run_longopts, NULL)) != -1) {
        int rc = run_parse_opt(c, argc, argv, o, &world, &per_node);
        if (rc >= 0) return rc;
    }
    int rc = run_check_layout(o, world, per_node);
    if (rc >= 0) return rc;
    if (optind >= argc) return run_usage_error("%s", "no program to run");
    o->argv = argv + optind;
    return -1;
}
