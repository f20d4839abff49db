/*
 * run_setup.c — the job's setup and teardown: descriptors and their limit,
 * the signals, the job's secret, the store, the ranks' buffers.
 *
 * Design notes
 *  - The job's secret (docs/security.md): the store requires it and every
 *    rank gets it as COLLIE_STORE_TOKEN in its environment (never on a
 *    command line, never printed), so the store and every handshake between
 *    ranks prove it and an outsider can neither use the store nor join. It
 *    is --token-file's, else the caller's COLLIE_STORE_TOKEN, else, when
 *    this launcher hosts the store on one node, 32 random bytes
 *    (RAND_bytes) in hex. A multi-node job needs the user's, the same on
 *    every node: without one it is refused. With an external --store on
 *    one node the ranks use the caller's, or none.
 *  - Setup fails after saying why (exit 1); run_job_fini frees whatever it
 *    got, so it is called either way.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "run.h"
#include "tools/common/token_file.h"

/* Make sure fds 0-2 exist, so our pipes never land on them. */
void run_fix_std_fds(void) {
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
    if (o->token_file) {
        if (tool_token_file_read("collie-run", o->token_file, buf, sizeof buf) != 0) return -1;
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

int run_job_init(run_job *job) {
    job->self = getpid();
    job->exit_code = -1;
    job->sigfd = job->devnull = job->master_fd = -1;
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
    if (run_token_init(job) != 0 || run_store_init(job) != 0 || run_master_init(job) != 0)
        return -1;
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

void run_job_fini(run_job *job) {
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
    if (job->master_fd >= 0) close(job->master_fd);
    if (job->sigfd >= 0) close(job->sigfd);
}
