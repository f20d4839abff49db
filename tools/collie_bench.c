/*
 * collie_bench.c — collie-bench: sweeps message sizes for each collective
 * and prints nccl-tests' table (size count type redop root, out-of-place and
 * in-place time algbw busbw #wrong) plus collie's latency and ops/s. Run it
 * under the launcher:
 *
 *   collie-run -n N -- collie-bench [-t T] [--backend SPEC] [--op LIST|all]
 *       [--sizes LIST | -b MIN -e MAX -f F] [-d T|all] [-o R|all] [-r R|all]
 *       [-n N] [-w N] [--inflight K] [-c N] [--csv] [--timeout-ms T]
 *
 * Its parts are in tools/bench/ (bench.h lists them).
 *
 * Design notes
 *  - The rows (sizes as nccl-tests', the timings, --check) are
 *    tools/bench/bench_row.c's, shared with bench/mpi_bench.c; its notes
 *    say what each column means and how it is measured. This file runs the
 *    ranks of the process: one per thread (--threads), each from setup to
 *    teardown (bench_rank.c), and exits 0, 1 (an error or wrong results)
 *    or 2 (usage).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

/* Run one rank from setup to teardown; its outcome goes to b->res. The
 * thread function of --threads (thread 0 runs on the main thread). */
static void *bench_rank_main(void *arg) {
    bench *b = arg;
    int res = bench_setup(b);
    if (res == COLLIE_OK) res = bench_run(b);
    bool failed = res != COLLIE_OK && res != BENCH_CHECK_FAILED && res != BENCH_BAD_ROOT;
    if (failed) bench_proc_stop(b->proc, b->rank);
    bench_teardown(b, failed);
    b->res = res;
    return NULL;
}

int main(int argc, char **argv) {
    bench_opts o;
    int rc = bench_parse_args(argc, argv, &o);
    if (rc != BENCH_EXIT_OK) return rc < 0 ? BENCH_EXIT_OK : rc;
    bench_proc p;
    if ((rc = bench_proc_init(&p, &o)) != BENCH_EXIT_OK) return rc;

    int T = o.threads, started = 1;
    bench *ranks = calloc((size_t)T, sizeof *ranks);
    pthread_t *tids = calloc((size_t)T, sizeof *tids);
    if (!ranks || !tids) {
        fprintf(stderr, "collie-bench: out of memory\n");
        free(ranks);
        free(tids);
        bench_proc_fini(&p);
        return BENCH_EXIT_ERROR;
    }
    for (int t = 0; t < T; t++)
        ranks[t] = (bench){.o = &o, .proc = &p, .thread = t};
    for (; started < T; started++) {
        int e = pthread_create(&tids[started], NULL, bench_rank_main, &ranks[started]);
        if (e) {
            fprintf(stderr, "collie-bench: cannot start the thread of rank %d: %s\n",
                    p.prank * T + started, strerror(e));
            bench_proc_stop(&p, p.prank * T + started);
            ranks[0].res = COLLIE_ENOMEM; /* rank 0 does not start */
            break;
        }
    }
    if (started == T) bench_rank_main(&ranks[0]);
    rc = BENCH_EXIT_OK;
    for (int t = 0; t < started; t++) {
        if (t > 0) pthread_join(tids[t], NULL);
        if (ranks[t].res == BENCH_BAD_ROOT && rc == BENCH_EXIT_OK)
            rc = BENCH_EXIT_USAGE;
        else if (ranks[t].res != COLLIE_OK && ranks[t].res != BENCH_BAD_ROOT)
            rc = BENCH_EXIT_ERROR;
    }
    free(ranks);
    free(tids);
    bench_proc_fini(&p);
    return rc;
}
