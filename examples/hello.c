/* hello.c — the README's C example: one allreduce, posted without blocking
 * and polled. Run: collie-run -n 4 -- build/examples/hello */
#include <collie.h>
#include <stdio.h>

int main(void) {
    collie_engine *e;
    collie_comm *c;
    collie_work *w;
    float x[4] = {1, 2, 3, 4};
    if (collie_engine_create(NULL, &e) != COLLIE_OK) return 1;
    /* blocks until every rank came (collie_comm_create_post does not) */
    if (collie_comm_create_from_env(e, NULL, &c) != COLLIE_OK) {
        fprintf(stderr, "create: %s\n", collie_last_error());
        return 1;
    }
    if (collie_allreduce(c, x, x, 4, COLLIE_FP32, COLLIE_SUM, NULL, &w) != COLLIE_OK) return 1;
    while (!collie_work_test(w)) { /* returns at once: serve requests meanwhile */
    }
    int st = collie_work_result(w); /* the deadline (60 s by default) bounds it */
    if (st == COLLIE_OK)
        printf("rank %d: x[0] = %g (the sum over %d ranks)\n", collie_comm_rank(c), x[0],
               collie_comm_size(c));
    else
        fprintf(stderr, "%s\n", collie_work_error_message(w));
    collie_work_release(w);
    collie_comm_destroy(c);
    collie_engine_destroy(e);
    return st == COLLIE_OK ? 0 : 1;
}
