/*
 * harness.h — helpers shared by the cmocka tests: a hand-driven work
 * producer ("manual works"), process resource counters (fds, threads,
 * /dev/shm files), the engine's loop driven and watched from a test (sync,
 * probe, block), a rank under collie-run joining its comm, temporary
 * directories, bounded reaping, settings changed at run time, and
 * skip_because. The runner (runner.h), tools as children (spawn.h), ranks
 * as forked children (kids.h) and a world in one process (coll_fixture.h)
 * have headers of their own.
 */
#ifndef CL_TEST_HARNESS_H
#define CL_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include <cmocka.h>

#include "collie.h"
#include "work/work.h"

/* A manual work: start does nothing (the test finishes it), or finishes
 * at once with `auto_status` when auto_finish is set. Counts hook calls. */
typedef struct manual_work {
    collie_work base;
    _Atomic int started, detached;
    bool auto_finish;
    int auto_status;
    _Atomic int *freed_counter; /* incremented on free, if set */
} manual_work;

/* manual_post: post a manual work on e; returns the status of the post. */
int manual_post(collie_engine *e, const collie_post_opts *o, bool auto_finish, int auto_status,
                _Atomic int *freed_counter, manual_work **out);

/* Open file descriptors and threads of this process. */
int count_open_fds(void);
int count_threads(void);

/* count_threads_settled / count_open_fds_settled: the count once it equals
 * `want`, or after 2 s: a thread that was joined, or an fd closed by a
 * progress thread, can linger in /proc for a moment (more so under the
 * sanitizers). A real leak still shows after the wait. */
int count_threads_settled(int want);
int count_open_fds_settled(int want);
/* count_threads_stable: the thread count once it has not changed for
 * 100 ms (at most 2 s): a baseline not inflated by a thread still exiting. */
int count_threads_stable(void);

/* engine_sync: run nothing on the loop and wait for it: every command
 * queued before has run when this returns. */
void engine_sync(collie_engine *e);

/* test_tmpdir_make: a fresh directory /tmp/<prefix>-XXXXXX into buf (fails
 * the test if it cannot be made); test_tmpdir_remove: remove it and all it
 * holds. */
void test_tmpdir_make(char *buf, size_t len, const char *prefix);
void test_tmpdir_remove(const char *dir);

/* engine_tracked: the engine's number of posted, not yet retired works,
 * read on its progress thread (the counter is the loop's alone). */
size_t engine_tracked(collie_engine *e);

/* skip_because: skip the current test, saying why on the test's output
 * ("SKIPPED: <reason>"); the suite's last line counts skipped tests. */
#define skip_because(...)                                                                          \
    do {                                                                                           \
        print_message("SKIPPED: " __VA_ARGS__);                                                    \
        print_message("\n");                                                                       \
        skip();                                                                                    \
    } while (0)

/* A loop probe: a watch on an always-readable fd, so its callback runs
 * once in every pass of e's loop, recording the most `*counter` grew
 * between two passes — the largest batch the loop ran without looking at
 * its sockets — and when each pass ran. loop_probe_stop removes it and
 * returns that figure; with `stamps` (CLOCK_MONOTONIC ns, e.g. the works'
 * end_ns), the most of them that fall between two passes instead. */
typedef struct loop_probe loop_probe;
loop_probe *loop_probe_start(collie_engine *e, _Atomic long *counter);
long loop_probe_stop(loop_probe *p, const int64_t *stamps, size_t n);

/* A loop blocked on purpose (to hold one rank while another moves): a
 * command that waits until loop_unblock, at most 10 s. loop_block_start
 * returns once the loop is inside it. */
typedef struct loop_block {
    collie_engine *e;
    _Atomic bool go, in;
    pthread_t th;
} loop_block;
void loop_block_start(loop_block *b, collie_engine *e);
void loop_unblock(loop_block *b);

/* rank_join_env: a rank program under collie-run joins comm `name` (rank
 * and size from the environment, an engine, the job's store, a blocking
 * create bounded by timeout_ms). 0, or the exit code to return: 2 no
 * rank in the environment, 3 no engine or store, 4 the create failed
 * (printed as "CREATE <status>: <why>"). */
int rank_join_env(const char *name, int32_t timeout_ms, int *rank, collie_engine **e,
                  collie_store **st, collie_comm **c);

/* now_ms: monotonic milliseconds. */
int64_t now_ms(void);

/* dev_shm_collie_files: files in /dev/shm whose name holds "collie" (the
 * shared-memory link must never make any: it uses memfds). */
int dev_shm_collie_files(void);

/* reap_bounded: wait for a forked child at most timeout_ms, then SIGKILL
 * and reap it; its wait status, or -1 if it had to be killed. */
int reap_bounded(pid_t pid, int timeout_ms);

/* setting_set: set (value) or unset (NULL) the environment setting `name`
 * and make collie read the settings again (engine/config.c). */
void setting_set(const char *name, const char *value);

#endif
