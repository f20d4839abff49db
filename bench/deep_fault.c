/*
 * deep_fault.c — a fault in the middle of a deep queue, seen from each
 * rank: every rank posts N 4-byte allreduces back to back (all in flight at
 * once), then rank VICTIM, once half of its own have completed, is either
 * SIGKILLed (kill) or SIGSTOPped (stop, sockets left open). The survivors
 * wait for every work and report, from the works' own CLOCK_MONOTONIC
 * stamps (shared by every process of the host), how long after the fault
 * their first work failed, how long until every work had ended, and the
 * most any work stayed pending past its own deadline.
 *
 * usage (under collie-run --keep-going): deep_fault kill|stop N VICTIM FILE
 *   FILE: where the victim writes the fault's instant before it happens.
 * One line per survivor on stdout:
 *   RESULT rank=R n=N ok=A failed=F first_ms=X all_ms=Y late_ms=Z status=S
 * with S the first failure's status name, then its message on a MSG line.
 * Exit status 1 when a work is still pending after every bound.
 */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <time.h>
#include <unistd.h>

#include "collie.h"

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void write_instant(const char *file) {
    FILE *f = fopen(file, "w");
    if (!f) return;
    fprintf(f, "%lld\n", (long long)mono_ns());
    fclose(f);
}

static int64_t read_instant(const char *file) {
    long long t = 0;
    FILE *f = fopen(file, "r");
    if (f && fscanf(f, "%lld", &t) != 1) t = 0;
    if (f) fclose(f);
    return t;
}

/* The victim's exit, as the kernel reports it (a pidfd becomes readable
 * once the process is gone, its sockets closed): the moment survivors can
 * first learn anything. A thread beside the rank waits for it. */
typedef struct exit_watch {
    char file[4096];
    _Atomic int64_t gone_ns;
} exit_watch;

static void *watch_exit(void *arg) {
    exit_watch *x = arg;
    int pid = 0;
    for (int i = 0; i < 600000 && pid <= 0; i++) { /* 10 min at most */
        FILE *f = fopen(x->file, "r");
        if (f && fscanf(f, "%d", &pid) != 1) pid = 0;
        if (f) fclose(f);
        if (pid <= 0) usleep(1000);
    }
    int fd = pid > 0 ? pidfd_open(pid, 0) : -1;
    if (fd < 0) return NULL;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 600000) == 1) x->gone_ns = mono_ns();
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[1], "kill") && strcmp(argv[1], "stop"))) {
        fprintf(stderr, "usage: deep_fault kill|stop N VICTIM FILE\n");
        return 2;
    }
    bool stop = !strcmp(argv[1], "stop");
    long n = atol(argv[2]);
    int victim = atoi(argv[3]);
    const char *file = argv[4];
    if (n < 2 || n > (1 << 22)) {
        fprintf(stderr, "deep_fault: N must be 2..%d\n", 1 << 22);
        return 2;
    }
    collie_engine *e;
    collie_comm *c;
    if (collie_engine_create(NULL, &e) || collie_comm_create_from_env(e, NULL, &c)) {
        fprintf(stderr, "deep_fault: setup: %s\n", collie_last_error());
        return 1;
    }
    int rank = collie_comm_rank(c);
    static exit_watch xw;
    snprintf(xw.file, sizeof xw.file, "%s.pid", file);
    pthread_t watcher;
    if (rank == victim) {
        FILE *f = fopen(xw.file, "w");
        if (f) fprintf(f, "%d\n", (int)getpid());
        if (f) fclose(f);
    } else if (pthread_create(&watcher, NULL, watch_exit, &xw) != 0) {
        return 1;
    }
    int32_t *buf = calloc((size_t)n, sizeof *buf);
    collie_work **w = calloc((size_t)n, sizeof *w);
    if (!buf || !w) return 1;
    long posted = 0, to_post = stop && rank == victim ? n / 2 : n;
    for (; posted < to_post; posted++) {
        buf[posted] = rank + 1;
        if (collie_allreduce(c, &buf[posted], &buf[posted], 1, COLLIE_INT32, COLLIE_SUM, NULL,
                             &w[posted]) != COLLIE_OK)
            break; /* the comm faulted while we were posting: wait for those posted */
    }
    if (rank == victim) {
        for (long i = 0; i < n / 2; i++)
            if (collie_work_wait(w[i], COLLIE_TIMEOUT_INFINITE) != COLLIE_OK) {
                fprintf(stderr, "deep_fault: victim's work %ld failed before the fault\n", i);
                return 1;
            }
        write_instant(file);
        raise(stop ? SIGSTOP : SIGKILL);
        return 0; /* continued: the script ends us */
    }
    long ok = 0, failed = 0, pending = 0;
    int64_t first_end = INT64_MAX, last_end = 0, late = 0;
    int first_status = COLLIE_OK;
    const char *first_msg = "";
    for (long i = 0; i < posted; i++) {
        /* the work's own deadline bounds it; 5 s past it is a failure here */
        collie_work_details d;
        collie_work_info(w[i], &d);
        int64_t left_ms = (d.deadline_ns - mono_ns()) / 1000000 + 5000;
        int rc = collie_work_wait(w[i], left_ms > 0 ? (int32_t)left_ms : 1);
        collie_work_info(w[i], &d);
        if (rc == COLLIE_INPROGRESS) {
            pending++;
            continue;
        }
        if (d.end_ns > last_end) last_end = d.end_ns;
        if (d.end_ns - d.deadline_ns > late) late = d.end_ns - d.deadline_ns;
        if (rc == COLLIE_OK) {
            ok++;
            continue;
        }
        failed++;
        if (d.end_ns < first_end) {
            first_end = d.end_ns;
            first_status = rc;
            first_msg = collie_work_error_message(w[i]);
        }
    }
    int64_t t = read_instant(file), gone = stop ? 0 : xw.gone_ns;
    printf("RESULT rank=%d n=%ld ok=%ld failed=%ld pending=%ld first_ms=%.1f all_ms=%.1f "
           "gone_ms=%.1f late_ms=%.1f status=%s\n",
           rank, posted, ok, failed, pending, failed && t ? (double)(first_end - t) / 1e6 : -1.0,
           t ? (double)(last_end - t) / 1e6 : -1.0, gone && t ? (double)(gone - t) / 1e6 : -1.0,
           (double)late / 1e6, collie_status_name(first_status));
    printf("MSG rank=%d %s\n", rank, first_msg);
    fflush(stdout);
    /* a survivor that exits closes its connections: wait (bounded) for the
     * other two, so that no survivor's end is what fails another's works */
    char done[4200];
    snprintf(done, sizeof done, "%s.done.%d", file, rank);
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    for (int i = 0; i < 30000; i++) {
        int have = 0;
        for (int r = 0; r < collie_comm_size(c); r++) {
            snprintf(done, sizeof done, "%s.done.%d", file, r);
            have += r != victim && access(done, F_OK) == 0;
        }
        if (have >= collie_comm_size(c) - 1) break;
        usleep(1000);
    }
    /* leave without tearing down 2N works one by one: the process ends */
    _exit(pending ? 1 : 0);
}
