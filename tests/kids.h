/*
 * kids.h — ranks as forked children of a test, around a store served by
 * the test process: each child's stdout and stdin are pipes (lines both
 * ways), every read is bounded, and kids_end reaps them all (SIGKILL past
 * its bound). Used where a rank's process must be its own (peer health:
 * pidfds, kills, stops): tests/test_health.c, tests/test_health_edges.c,
 * the shrink tests. The children are forked before the test process makes
 * its engine and store server (a child of a threaded process may inherit a
 * lock held by another thread and hang: seen under ASan); each reads the
 * store's address as its first line on stdin.
 */
#ifndef CL_TEST_KIDS_H
#define CL_TEST_KIDS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "collie.h"

#define KIDS_MAX 8

typedef struct kids {
    int n;
    collie_engine *e;
    collie_store_server *srv;
    pid_t pid[KIDS_MAX];
    int out[KIDS_MAX], in[KIDS_MAX]; /* the child's stdout (read), its stdin (write) */
    char buf[KIDS_MAX][4096];        /* what each said so far */
    size_t got[KIDS_MAX];
} kids;

/* a child's body: its exit code (0: every check passed) */
typedef int (*kid_fn)(const char *addr, int rank, void *arg);

/* n children running fn(store address, rank, arg); `settings` ("NAME=value",
 * NULL-terminated, or NULL) are set in each child as a rank's environment */
void kids_start(kids *k, int n, kid_fn fn, void *arg, const char *const *settings);
/* read what child r said within timeout_ms; true once it holds `text` */
bool kids_wait(kids *k, int r, const char *text, int timeout_ms);
/* write a line to child r's stdin */
void kids_tell(kids *k, int r, const char *line);
/* reap every child (each within bound_ms, else SIGKILLed): codes[r] is its
 * exit code, 128 + a signal if one ended it; then the store and engine go */
void kids_end(kids *k, int *codes, int bound_ms);

#endif
