/*
 * collie_run.c — collie-run, the local launcher: hosts the key/value store,
 * starts N ranks, prefixes their output with the rank, and stops the job when
 * a rank fails (as mpirun does) unless a server mode says otherwise:
 * --keep-going lets the others run on, --restarts K starts a failed rank
 * again with the same rank (K restarts for the whole job; the rank's own
 * count is in COLLIE_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT); once
 * they are used up a failure stops the job, unless --keep-going.
 *
 *   collie-run -n N | -np N | --nproc-per-node M [--nnodes K --node-rank R]
 *              [--timeout S] [--grace S] [--keep-going] [--restarts K]
 *              [--store HOST:PORT [--store-external]] [--token-file F] [--stats]
 *              [--master-addr HOST] [--master-port P]
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
 *    port of --store unless --store-external says a server runs there
 *    already.
 *  - A multi-node job runs one collie-run per node with the same -np (or
 *    --nproc-per-node and --nnodes) and --store, and its own --node-rank:
 *    node R runs global ranks R*M .. R*M+M-1. Each rank gets the COLLIE_*
 *    variables and torchrun's names (RANK, WORLD_SIZE, LOCAL_RANK,
 *    LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT, and
 *    MASTER_ADDR/MASTER_PORT: a port of torch's own, not the store, so
 *    torch's env:// works; run_master.c), so programs written for either
 *    launcher find what they look for.
 *  - States: RUNNING → STOPPING (SIGTERM, or the forwarded signal, to every
 *    live rank; SIGKILL at the grace deadline; give up RUN_REAP_MS after
 *    SIGKILL) → done when every rank is reaped. The first cause of a stop
 *    fixes the exit status: the failing rank's code (128+signal if killed),
 *    124 for --timeout, 128+signal for SIGINT/SIGTERM. With --keep-going a
 *    failure stops nothing: the first failed rank's code is the status
 *    unless a --timeout or a signal stops the job later (then 124 or
 *    128+signal). Failures of ranks that are being stopped are not
 *    reported. Exit 2 is a usage error, 1 a launcher error (the store could
 *    not start, fork or a restart failed).
 *  - The parts live in tools/run/ (run.h lists them): the command line, the
 *    ranks' environment, starting ranks, their output, setup and teardown,
 *    --stats. This file has what the loop does: stopping, events, deadlines.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "run/run.h"

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
