/*
 * demo.c — what `make run` shows: several local ranks (started by
 * collie-run) posting non-blocking work and polling it from their own
 * event loop through a completion queue's file descriptor.
 *
 * Each rank:
 *   1. connects to the store collie-run hosts (COLLIE_STORE_ADDR),
 *   2. posts a set of its own greeting and gets of every rank's greeting,
 *      all at once, then polls the completion queue's fd with poll(2)
 *      while its "application loop" keeps turning,
 *   3. keeps 64 adds in flight on a shared counter and checks the total,
 *   4. meets the others at a store barrier and prints its timings.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collie.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

#define CHECK(expr)                                                                               \
    do {                                                                                          \
        int rc_ = (expr);                                                                         \
        if (rc_ != COLLIE_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s (%s)\n", #expr, collie_strerror(rc_),                 \
                    collie_last_error());                                                         \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* Pop and report every finished work; returns how many. */
static int drain(collie_cq *cq, int rank, double t0) {
    int n = 0;
    collie_work *w;
    while (collie_cq_pop(cq, 0, &w) == COLLIE_OK) {
        n++;
        collie_work_details d;
        collie_work_info(w, &d);
        double ms = (d.end_ns - d.post_ns) / 1e6;
        if (collie_work_result(w) != COLLIE_OK) {
            printf("rank %d: %s failed after %.2f ms: %s\n", rank, d.op, ms,
                   collie_work_error_message(w));
        } else if (strcmp(d.op, "store.get") == 0) {
            const void *val;
            size_t len;
            collie_store_work_value(w, &val, &len);
            printf("rank %d: got greeting of rank %llu: \"%s\" (%.2f ms after posting, at "
                   "t=%.2f ms)\n",
                   rank, (unsigned long long)collie_work_tag(w), (const char *)val, ms,
                   (d.end_ns / 1e3 - t0) / 1e3);
        }
        collie_work_release(w);
    }
    return n;
}

int main(void) {
    int rank = env_int("COLLIE_RANK"), size = env_int("COLLIE_WORLD_SIZE");
    if (rank < 0 || size < 1) {
        fprintf(stderr, "run me under collie-run: collie-run -n 4 %s\n", "demo");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    collie_engine *e;
    collie_store *store;
    collie_cq *cq;
    CHECK(collie_engine_create(NULL, &e));
    CHECK(collie_store_connect(e, NULL, NULL, &store));
    CHECK(collie_cq_create(&cq));

    /* 1+2: post everything without blocking, then poll the cq fd. */
    double t0 = now_us();
    char key[64], greeting[128];
    snprintf(key, sizeof key, "demo/greeting/%d", rank);
    snprintf(greeting, sizeof greeting, "hello from rank %d (pid %d)", rank, (int)getpid());
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cq = cq;
    o.timeout_ms = 10000;
    collie_work *w;
    CHECK(collie_store_post_set(store, key, greeting, strlen(greeting), &o, &w));
    collie_work_release(w); /* the cq still delivers it: releasing never cancels */
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "demo/greeting/%d", r);
        o.tag = (uint64_t)r;
        CHECK(collie_store_post_get(store, key, &o, &w));
        collie_work_release(w);
    }
    double posted = now_us();
    printf("rank %d: posted 1 set + %d gets in %.1f us without blocking\n", rank, size,
           posted - t0);

    int expected = size + 1, done = 0;
    long loop_turns = 0;
    struct pollfd p = {.fd = collie_cq_fd(cq), .events = POLLIN};
    while (done < expected && now_us() - t0 < 15e6) {
        loop_turns++; /* the application's own loop keeps running */
        if (poll(&p, 1, 100) > 0) done += drain(cq, rank, t0);
    }
    if (done < expected) {
        fprintf(stderr, "rank %d: only %d of %d works completed\n", rank, done, expected);
        return 1;
    }
    printf("rank %d: all %d works done in %.2f ms (%ld turns of the application loop)\n", rank,
           expected, (now_us() - t0) / 1e3, loop_turns);

    /* 3: 64 adds in flight at a time on a shared counter. */
    enum { ADDS = 2000, INFLIGHT = 64 };
    collie_work *inflight[INFLIGHT] = {0};
    int posted_adds = 0, finished = 0;
    double a0 = now_us();
    collie_post_opts ao = COLLIE_POST_OPTS_INIT;
    ao.timeout_ms = 10000;
    while (finished < ADDS) {
        for (int i = 0; i < INFLIGHT; i++) {
            if (inflight[i] && collie_work_test(inflight[i])) {
                CHECK(collie_work_result(inflight[i]));
                collie_work_release(inflight[i]);
                inflight[i] = NULL;
                finished++;
            }
            if (!inflight[i] && posted_adds < ADDS) {
                CHECK(collie_store_post_add(store, "demo/counter", 1, &ao, &inflight[i]));
                posted_adds++;
            }
        }
        size_t idx;
        collie_work_wait_any(inflight, INFLIGHT, 1000, &idx);
    }
    double add_us = (now_us() - a0) / ADDS;

    CHECK(collie_store_barrier(store, "demo/barrier", (uint32_t)size, 10000));
    int64_t total = 0;
    CHECK(collie_store_add(store, "demo/counter", 0, 10000, &total));
    printf("rank %d: %d adds with %d in flight: %.1f us/op; counter = %lld (expected %lld) %s\n",
           rank, ADDS, INFLIGHT, add_us, (long long)total, (long long)ADDS * size,
           total == (int64_t)ADDS * size ? "OK" : "MISMATCH");

    collie_cq_destroy(cq);
    collie_store_destroy(store);
    collie_engine_destroy(e);
    return total == (int64_t)ADDS * size ? 0 : 1;
}
