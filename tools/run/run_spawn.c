/*
 * run_spawn.c — starting a rank: its pipes, the descriptor reserve, fork and
 * exec.
 *
 * Design notes
 *  - Descriptors: the store served here holds one per client, so at start
 *    the soft RLIMIT_NOFILE is raised to the hard limit (run_setup.c; the
 *    ranks get the limit we were started with), and RUN_FD_RESERVE
 *    descriptors (copies of /dev/null) are held back: starting a rank that
 *    finds none free (EMFILE, ENFILE) gives up the reserve and tries again,
 *    then waits for some,
 *    RUN_SPAWN_TRIES times RUN_SPAWN_WAIT_MS at most, before it fails. The
 *    store also bounds what outsiders can hold (store/srv_conn.c).
 *  - Each rank is the leader of its own process group: signals go to the
 *    group, so they also reach what the rank started (sh -c '...; sleep 30'),
 *    and Ctrl-C at a terminal reaches only the launcher, which forwards it
 *    once. Ranks read /dev/null as stdin. PR_SET_PDEATHSIG stops the ranks if
 *    the launcher itself is killed.
 *  - The engine's threads exist when we fork, so the child makes only
 *    async-signal-safe calls: its environment is built before fork and handed
 *    to execvpe; the "cannot run" message is written with writev.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "run.h"

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
void run_reserve_fill(run_job *job) {
    for (int i = 0; i < RUN_FD_RESERVE; i++)
        if (job->reserve[i] < 0 && job->devnull >= 0)
            job->reserve[i] = fcntl(job->devnull, F_DUPFD_CLOEXEC, 0);
}

/* Give the reserve up; false if none was held. */
bool run_reserve_release(run_job *job) {
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

int run_spawn(run_job *job, run_rank *r) {
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
