/*
 * coll_fixture.h — a world of N ranks inside one test process: one engine
 * (or one per rank: world_create_apart), one store server, N store clients
 * and N comms (docs/design.md §2: several ranks of one comm may live in one
 * process), the reference computations the collective tests compare
 * against, and the first steps of the shrink and grow tests (a rank that
 * left, a store of its own for a joiner, events popped).
 *
 * Design notes
 *  - Every rank is driven by the test's one thread, so nothing that needs
 *    the other ranks may block: the comms are made with
 *    collie_comm_create_post on every rank before any is waited for, and
 *    run_and_check posts on every rank before it waits; every wait is
 *    bounded (collie_work_wait with a deadline) and fails the test.
 *  - References fold every rank's input in rank order with the library's
 *    own cl_reduce (the kernels are tested on their own in test_reduce.c);
 *    fill_input's small integers make every float sum and product exact,
 *    so outputs compare bytewise whatever order the transport reduced in.
 *  - world_create_apart gives each rank its own engine (the store served on
 *    rank 0's), so loop_block (harness.h) can hold one rank's progress
 *    while the others run.
 */
#ifndef CL_TEST_COLL_FIXTURE_H
#define CL_TEST_COLL_FIXTURE_H

#include <stdbool.h>

#include "collie.h"
#include "collie_backend.h"

#define WORLD_MAX 8

typedef struct world {
    int n;
    collie_engine *e;             /* the engine of rank 0 (of every rank, but apart) */
    collie_engine *re[WORLD_MAX]; /* rank r's engine */
    bool apart;                   /* one engine per rank (world_create_apart) */
    collie_store_server *srv;
    collie_store *st[WORLD_MAX];
    collie_comm *c[WORLD_MAX];
} world;

/* world_create: n ranks of a comm called `name`, created non-blocking on
 * every rank and waited for (bounded). Fails the test on error. */
void world_create(world *w, int n, const char *name, const collie_comm_opts *o);
void world_destroy(world *w);
/* world_create_apart: the same with an engine per rank (the store on rank
 * 0's), so one rank's loop can be held while another's runs (loop_block) */
void world_create_apart(world *w, int n, const char *name, const collie_comm_opts *o);
/* world_link: a one-element allreduce on every rank, checked: the links an
 * allreduce needs are made before the test's own traffic */
void world_link(world *w);

/* world_create_one_left: world_create + world_link, then the last rank
 * destroys its comm (w->c[n-1] NULL) and every other rank has seen it
 * "left" (bounded): the start of a shrink test */
void world_create_one_left(world *w, int n, const char *name);
/* world_store: a store handle of its own on the world's server (a joiner's,
 * or a hostile writer's), asserted */
collie_store *world_store(world *w);
/* pop c's events (bounded by ms) until one of `kind`: true if it came */
bool pop_event_kind(collie_comm *c, int kind, int ms);
/* one_allreduce: a one-element int32 allreduce of (label + 1) on c,
 * waited for (bounded); its result, *status its status */
int32_t one_allreduce(collie_comm *c, int label, int *status);

/* Deterministic input of rank r, element i, for dtype dt and op (small
 * integers, so every float sum and product below is exact). */
void fill_input(void *buf, size_t count, collie_dtype dt, collie_redop op, int r, size_t salt);

/* run_and_check: post collective `kind` on every rank of w with count
 * elements (per the collie.h definition), wait for all (bounded), and
 * compare every rank's output with a locally computed reference. */
void run_and_check(world *w, collie_coll_kind kind, collie_dtype dt, collie_redop op, size_t count,
                   int root, bool in_place);

/* comm_stats: collie_comm_get_stats of c (asserted to succeed). */
collie_comm_stats comm_stats(collie_comm *c);

#endif
