/*
 * demo.c — what `make run` shows: several local ranks (started by
 * collie-run) posting non-blocking collectives and polling them from their
 * own event loop through a completion queue's file descriptor.
 *
 * Each rank:
 *   1. creates a communicator from the environment collie-run sets,
 *   2. posts an allreduce (4 MiB), a broadcast, an allgather and a barrier
 *      at once, then keeps its own "application loop" turning while it
 *      polls the completion queue's fd with poll(2), reporting each
 *      collective as it completes and checking its result,
 *   3. keeps 16 tiny allreduces in flight for a moment and reports the rate.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != COLLIE_OK) {                                                                    \
            fprintf(stderr, "%s failed: %s (%s)\n", #expr, collie_strerror(rc_),                   \
                    collie_last_error());                                                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { BIG = 1 << 20, SMALL = 1024 };

typedef struct demo {
    int rank, size;
    float *big;      /* allreduce: every rank contributes rank+1 */
    int32_t *bcast;  /* broadcast from the last rank */
    int32_t *gather; /* allgather: rank r contributes r*10 */
    int32_t mine;
    int bad;
} demo;

static const char *op_name(uint64_t tag) {
    static const char *const names[] = {"allreduce 4 MiB fp32", "broadcast 4 KiB int32",
                                        "allgather int32", "barrier"};
    return tag < 4 ? names[tag] : "?";
}

static void check_result(demo *d, uint64_t tag) {
    int n = d->size;
    switch (tag) {
    case 0:
        for (int i = 0; i < BIG; i++)
            if (d->big[i] != (float)(n * (n + 1) / 2)) d->bad++;
        break;
    case 1:
        for (int i = 0; i < SMALL; i++)
            if (d->bcast[i] != (n - 1) * 1000 + i) d->bad++;
        break;
    case 2:
        for (int r = 0; r < n; r++)
            if (d->gather[r] != r * 10) d->bad++;
        break;
    default: break;
    }
}

/* The inputs: rank r contributes r+1 to the allreduce and r*10 to the
 * allgather; the last rank broadcasts. */
static void fill_inputs(demo *d) {
    d->big = malloc(BIG * sizeof(float));
    d->bcast = malloc(SMALL * sizeof(int32_t));
    d->gather = malloc((size_t)d->size * sizeof(int32_t));
    if (!d->big || !d->bcast || !d->gather) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int i = 0; i < BIG; i++)
        d->big[i] = (float)(d->rank + 1);
    for (int i = 0; i < SMALL; i++)
        d->bcast[i] = d->rank == d->size - 1 ? d->rank * 1000 + i : -1;
    d->mine = d->rank * 10;
}

/* Step 1: post four collectives without blocking; each lands in the cq,
 * its tag saying which it is. */
static void post_four(collie_comm *c, collie_cq *cq, demo *d) {
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cq = cq;
    collie_work *w;
    o.tag = 0;
    CHECK(collie_allreduce(c, d->big, d->big, BIG, COLLIE_FP32, COLLIE_SUM, &o, &w));
    collie_work_release(w); /* the cq still delivers it: releasing never cancels */
    o.tag = 1;
    CHECK(collie_broadcast(c, d->bcast, SMALL, COLLIE_INT32, d->size - 1, &o, &w));
    collie_work_release(w);
    o.tag = 2;
    CHECK(collie_allgather(c, &d->mine, d->gather, 1, COLLIE_INT32, &o, &w));
    collie_work_release(w);
    o.tag = 3;
    CHECK(collie_barrier(c, &o, &w));
    collie_work_release(w);
}

/* Step 2: the application's own loop: poll the cq fd, do other work, take
 * each collective as it completes (30 s at most). Returns 0, or 1 when one
 * failed. */
static int await_four(collie_cq *cq, demo *d, double t0) {
    int done = 0;
    long turns = 0;
    collie_work *w;
    struct pollfd p = {.fd = collie_cq_fd(cq), .events = POLLIN};
    while (done < 4 && now_us() - t0 < 30e6) {
        turns++;
        if (poll(&p, 1, 1) <= 0) continue; /* ... serve other requests here ... */
        while (collie_cq_pop(cq, 0, &w) == COLLIE_OK) {
            collie_work_details info;
            collie_work_info(w, &info);
            if (collie_work_result(w) != COLLIE_OK) {
                fprintf(stderr, "rank %d: %s\n", d->rank, collie_work_error_message(w));
                return 1;
            }
            check_result(d, collie_work_tag(w));
            printf("rank %d: %-22s seq %llu done %.2f ms after posting\n", d->rank,
                   op_name(collie_work_tag(w)), (unsigned long long)collie_work_seq(w),
                   (info.end_ns - info.post_ns) / 1e6);
            collie_work_release(w);
            done++;
        }
    }
    printf("rank %d: all 4 done in %.1f ms, %ld turns of the application loop, results %s\n",
           d->rank, (now_us() - t0) / 1e3, turns, d->bad ? "WRONG" : "correct");
    return 0;
}

/* Step 3: 16 tiny allreduces in flight: post one each time one finishes. */
static void tiny_allreduces(collie_comm *c, demo *d) {
    enum { INFLIGHT = 16, TOTAL = 4000 };
    collie_work *fl[INFLIGHT] = {0};
    int32_t vals[INFLIGHT];
    int posted = 0, finished = 0;
    double r0 = now_us();
    while (finished < TOTAL) {
        for (int i = 0; i < INFLIGHT; i++) {
            if (fl[i] && collie_work_test(fl[i])) {
                CHECK(collie_work_result(fl[i]));
                if (vals[i] != d->size) d->bad++;
                collie_work_release(fl[i]);
                fl[i] = NULL;
                finished++;
            }
            if (!fl[i] && posted < TOTAL) {
                vals[i] = 1;
                CHECK(collie_allreduce(c, &vals[i], &vals[i], 1, COLLIE_INT32, COLLIE_SUM, NULL,
                                       &fl[i]));
                posted++;
            }
        }
        size_t idx;
        collie_work_wait_any(fl, INFLIGHT, 1000, &idx);
    }
    double secs = (now_us() - r0) / 1e6;
    printf("rank %d: %d tiny allreduces, 16 in flight: %.0f ops/s (%.1f us each)\n", d->rank, TOTAL,
           TOTAL / secs, secs * 1e6 / TOTAL);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    collie_engine *e;
    collie_comm *c;
    collie_cq *cq;
    CHECK(collie_engine_create(NULL, &e));
    collie_comm_opts co = COLLIE_COMM_OPTS_INIT;
    co.name = "demo";
    co.timeout_ms = 20000;
    double t_create = now_us();
    CHECK(collie_comm_create_from_env(e, &co, &c));
    demo d = {.rank = collie_comm_rank(c), .size = collie_comm_size(c)};
    printf("rank %d of %d: communicator ready in %.1f ms\n", d.rank, d.size,
           (now_us() - t_create) / 1e3);
    CHECK(collie_cq_create(&cq));
    fill_inputs(&d);

    double t0 = now_us();
    post_four(c, cq, &d);
    printf("rank %d: posted 4 collectives in %.1f us\n", d.rank, now_us() - t0);
    if (await_four(cq, &d, t0) != 0) return 1;
    tiny_allreduces(c, &d);

    collie_cq_destroy(cq);
    CHECK(collie_comm_destroy(c));
    CHECK(collie_engine_destroy(e));
    free(d.big);
    free(d.bcast);
    free(d.gather);
    return d.bad ? 1 : 0;
}
