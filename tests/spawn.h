/*
 * spawn.h — run one of the built programs (a tool of build/bin/, or any
 * path under the build directory: an example, a test binary) as a child
 * process from a cmocka test: its stdout and stderr on pipes, read by a bounded
 * poll loop, its exit awaited with a deadline, and the child SIGKILLed by
 * the teardown when a failed assertion left it running.
 *
 * Design notes
 *
 *   - One child at a time, held in a static inside spawn.c: a cmocka
 *     assertion longjmps out of the test, so the only place that can clean
 *     up after it is the teardown, and the teardown (spawn_teardown) needs
 *     to find the child without the test's help. spawn_start asserts that
 *     the previous child was freed.
 *   - Every wait is bounded. spawn_pump waits at most its timeout;
 *     spawn_wait_for at most its timeout; spawn_finish at most the bound
 *     given to spawn_start, counted from the start, and fails the test
 *     (after printing what the child said) when it is exceeded.
 *   - The child gets our environment minus every COLLIE_* variable (so the
 *     test's own settings never leak into a tool), plus up to
 *     SPAWN_MAX_ENV extra "NAME=value" strings, each replacing an inherited
 *     NAME (an extra "NAME" without '=' removes it); stdin is /dev/null.
 *   - Output is kept whole, NUL-terminated (text[0] stdout, text[1]
 *     stderr), so tests search it with the str* functions.
 *   - Failures use cmocka asserts, as the tests do: a test that cannot
 *     start its child fails rather than reporting an error code.
 *   - Only the tools' single-child pattern lives here. test_faults keeps
 *     its own pool of children (several at once, merged output, network
 *     namespaces, stop detection): a different shape.
 */
#ifndef CL_TEST_SPAWN_H
#define CL_TEST_SPAWN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cmocka.h>

#define SPAWN_MAX_ARGS 40 /* arguments after the program's path */
#define SPAWN_MAX_ENV  7  /* extra environment entries */

typedef struct spawn_proc {
    bool started;  /* spawn_start ran (and spawn_free did not yet) */
    pid_t pid;     /* > 0 until reaped */
    int fds[2];    /* its stdout and stderr, -1 at EOF */
    char *text[2]; /* what they said so far, NUL-terminated */
    size_t len[2];
    int64_t start_ms, elapsed_ms;
    int bound_ms;  /* spawn_finish fails after this long from the start */
    int status;    /* exit code, 128+signal if killed, -1 while running */
    char name[64]; /* the tool's name, for messages */
} spawn_proc;

/* The path of `rel` under $CLTEST_BUILD_DIR (default build), and of the
 * tool `name` in its bin/; a result lives until eight more calls. */
const char *spawn_build_path(const char *rel);
const char *spawn_bin_path(const char *name);

/* Start tool `name` (a path with a '/': relative to the build dir) with
 * args (NULL-terminated) and env_extra (NULL-terminated, may be NULL);
 * spawn_finish will wait at most bound_ms from now. */
spawn_proc *spawn_start(const char *name, const char *const *args, const char *const *env_extra,
                        int bound_ms);

/* Read whatever arrives within timeout_ms. */
void spawn_pump(spawn_proc *s, int timeout_ms);

/* Wait (at most timeout_ms) until stream k (0 stdout, 1 stderr) holds
 * `count` copies of needle; false on timeout or when both pipes closed. */
bool spawn_wait_for(spawn_proc *s, int k, const char *needle, int count, int timeout_ms);

/* Read until both pipes close and the child exits; fail the test if that
 * takes longer than the bound given to spawn_start. Sets status. */
void spawn_finish(spawn_proc *s);

/* Print the status and everything the child said (for a failing test). */
void spawn_dump(const spawn_proc *s);

/* SIGKILL and reap the child if it still runs; free its output. */
void spawn_free(spawn_proc *s);

/* A cmocka teardown: spawn_free on the current child, if any. */
int spawn_teardown(void **state);

/* Non-overlapping occurrences of needle in hay. */
int spawn_count(const char *hay, const char *needle);

/* assert_true that prints the child's output when it fails. */
#define assert_spawn(s, cond)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            spawn_dump(s);                                                                         \
            fail_msg("%s", #cond);                                                                 \
        }                                                                                          \
    } while (0)

#endif
