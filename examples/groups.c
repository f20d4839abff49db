/*
 * groups.c — sub-communicators and point-to-point: tensor- and
 * pipeline-parallel groups cut from one world, as a model-parallel server
 * lays out its ranks.
 *
 *   build/bin/collie-run -n 4 -- build/examples/groups
 *
 * With N ranks (even, at least 4) arranged as N/2 pipeline stages of 2:
 *  - collie_comm_split by stage gives the tensor-parallel pairs {0,1},
 *    {2,3}, ...; an allreduce inside each pair sums only its members;
 *  - collie_comm_new_group gives the group of the first rank of every stage
 *    (0, 2, 4, ...); the other ranks get COLLIE_ENOTMEMBER and no comm;
 *  - send/recv along the pipeline: rank r sends its activation to rank r+2
 *    with the step as the tag and receives from rank r-2; receives posted
 *    ahead of the sends match by (peer, tag) whatever the order.
 * Every result is checked; the last line of each rank is "rank R: groups ok".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"

enum { COUNT = 64, STEPS = 3 };
#define WAIT_MS 30000 /* every wait is bounded */

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != COLLIE_OK) {                                                                    \
            fprintf(stderr, "%s failed: %s (%s)\n", #expr, collie_status_name(rc_),                \
                    collie_last_error());                                                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void wait_ok(collie_work *w, const char *what) {
    int st = collie_work_wait(w, WAIT_MS);
    if (st != COLLIE_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, collie_status_name(st), collie_work_error_message(w));
        exit(1);
    }
    collie_work_release(w);
}

static void expect(bool ok, int rank, const char *what) {
    if (ok) return;
    fprintf(stderr, "rank %d: wrong result: %s\n", rank, what);
    exit(1);
}

int main(void) {
    collie_engine *e;
    collie_comm *world;
    CHECK(collie_engine_create(NULL, &e));
    CHECK(collie_comm_create_from_env(e, NULL, &world));
    int rank = collie_comm_rank(world), size = collie_comm_size(world);
    if (size < 4 || size % 2) {
        fprintf(stderr, "groups: needs an even number of ranks >= 4, not %d\n", size);
        return 2;
    }
    int stage = rank / 2;

    /* tensor-parallel pairs: colour = stage, ordered by world rank */
    collie_comm *tp;
    CHECK(collie_comm_split(world, stage, rank, NULL, &tp));
    int32_t v[COUNT];
    for (int i = 0; i < COUNT; i++)
        v[i] = rank * 100 + i;
    collie_work *w;
    CHECK(collie_allreduce(tp, v, v, COUNT, COLLIE_INT32, COLLIE_SUM, NULL, &w));
    wait_ok(w, "tp allreduce");
    int lo = stage * 2; /* the pair is lo, lo+1 */
    for (int i = 0; i < COUNT; i++)
        expect(v[i] == (lo * 100 + i) + ((lo + 1) * 100 + i), rank, "tp allreduce");
    printf("rank %d: tp group '%s' rank %d of %d: allreduce ok\n", rank, collie_comm_name(tp),
           collie_comm_rank(tp), collie_comm_size(tp));

    /* the stage leaders: ranks 0, 2, 4, ... */
    int nleaders = size / 2;
    int *leaders = malloc(sizeof *leaders * (size_t)nleaders);
    if (!leaders) return 1;
    for (int i = 0; i < nleaders; i++)
        leaders[i] = 2 * i;
    collie_comm *lead = NULL;
    int rc = collie_comm_new_group(world, leaders, nleaders, NULL, &lead);
    if (rank % 2 == 0) {
        CHECK(rc);
        int32_t x = rank;
        CHECK(collie_allreduce(lead, &x, &x, 1, COLLIE_INT32, COLLIE_MAX, NULL, &w));
        wait_ok(w, "leaders allreduce");
        expect(x == 2 * (nleaders - 1), rank, "leaders max");
        printf("rank %d: leaders group of %d: max ok\n", rank, collie_comm_size(lead));
    } else {
        expect(rc == COLLIE_ENOTMEMBER && lead == NULL, rank, "non-member gets ENOTMEMBER");
        printf("rank %d: not a leader (COLLIE_ENOTMEMBER, as expected)\n", rank);
    }
    free(leaders);

    /* the pipeline: receives posted first, sends after, tags = steps */
    int prev = rank - 2, next = rank + 2;
    float in[STEPS][COUNT], out[STEPS][COUNT];
    collie_work *rw[STEPS] = {NULL}, *sw[STEPS] = {NULL};
    for (int s = STEPS - 1; s >= 0; s--) /* out of order: matching is by tag */
        if (prev >= 0)
            CHECK(collie_recv(world, in[s], COUNT, COLLIE_FP32, prev, (uint64_t)s, NULL, &rw[s]));
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < COUNT; i++)
            out[s][i] = (float)(rank * 1000 + s * 10 + i % 10);
        if (next < size)
            CHECK(collie_send(world, out[s], COUNT, COLLIE_FP32, next, (uint64_t)s, NULL, &sw[s]));
    }
    for (int s = 0; s < STEPS; s++) {
        if (sw[s]) wait_ok(sw[s], "send");
        if (!rw[s]) continue;
        wait_ok(rw[s], "recv");
        for (int i = 0; i < COUNT; i++)
            expect(in[s][i] == (float)(prev * 1000 + s * 10 + i % 10), rank, "pipeline recv");
    }
    if (prev >= 0) printf("rank %d: received %d activations from rank %d\n", rank, STEPS, prev);

    CHECK(collie_comm_destroy(lead));
    CHECK(collie_comm_destroy(tp));
    CHECK(collie_comm_destroy(world));
    CHECK(collie_engine_destroy(e));
    printf("rank %d: groups ok\n", rank);
    return 0;
}
