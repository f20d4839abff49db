/*
 * latency_breakdown.c — where the time of one small collective goes (issue
 * 4): 3000 back-to-back 4-byte int32 allreduces, each posted and waited for,
 * split with the work's own timestamps (collie_work_info) into the post call,
 * the wait until the progress thread starts it (queue), the transport (start
 * to completion) and the waiter's wake-up. Prints the medians.
 * usage: collie-run -n 2 -- latency_breakdown
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "collie.h"
static int64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    int64_t x = *(int64_t *)a, y = *(int64_t *)b;
    return x < y ? -1 : x > y;
}
int main(void) {
    collie_engine *e;
    collie_engine_create(NULL, &e);
    collie_comm *c;
    if (collie_comm_create_from_env(e, NULL, &c)) {
        printf("create: %s\n", collie_last_error());
        return 1;
    }
    enum { N = 3000 };
    static int64_t q[N], t[N], wk[N], tot[N], pc[N];
    for (int i = 0; i < N; i++) {
        int32_t v = 1;
        collie_work *w;
        int64_t t0 = now();
        collie_allreduce(c, &v, &v, 1, COLLIE_INT32, COLLIE_SUM, NULL, &w);
        int64_t t1 = now();
        collie_work_wait(w, 10000);
        int64_t t2 = now();
        collie_work_details d;
        collie_work_info(w, &d);
        q[i] = d.start_ns - d.post_ns;
        t[i] = d.end_ns - d.start_ns;
        wk[i] = t2 - d.end_ns;
        tot[i] = t2 - t0;
        pc[i] = t1 - t0;
        collie_work_release(w);
    }
    qsort(q, N, 8, cmp);
    qsort(t, N, 8, cmp);
    qsort(wk, N, 8, cmp);
    qsort(tot, N, 8, cmp);
    qsort(pc, N, 8, cmp);
    printf("median us: post-call %.2f queue %.2f transport %.2f wake %.2f total %.2f\n",
           pc[N / 2] / 1e3, q[N / 2] / 1e3, t[N / 2] / 1e3, wk[N / 2] / 1e3, tot[N / 2] / 1e3);
    collie_comm_destroy(c);
    collie_engine_destroy(e);
    return 0;
}
