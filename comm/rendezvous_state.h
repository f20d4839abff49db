/*
 * rendezvous_state.h — the "comm.create" work's state, shared by the
 * rendezvous's steps (comm_rendezvous.c) and the store request each step
 * posts (comm_rendezvous_post.c). Private to comm/.
 *
 * Design notes
 *  - One create_state per create work: the work itself (base), the comm it
 *    makes, the step in progress and its store request, and what a failed
 *    generation needs to say (conflict, fail_status, origin). The steps and
 *    their order are comm_rendezvous.c's notes.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"

enum create_step {
    STEP_JOIN,
    STEP_POISONED, /* check <prefix>conflict: the generation failed already? */
    STEP_CLAIM,    /* compare_set <prefix>rank/<r>: this process holds rank r */
    STEP_SIZE,     /* compare_set <prefix>size: every rank says the same size */
    STEP_INIT,
    STEP_BARRIER,
    STEP_VERIFY,   /* check <prefix>conflict: did another rank find one? */
    STEP_CONFLICT, /* get <prefix>conflict: what it found */
    STEP_POISON,   /* compare_set <prefix>conflict "" -> "<status>|why" (this rank found one) */
    STEP_RELEASE,  /* add 2^30 to <prefix>created: the waiting ranks' barrier ends */
    STEP_ARRIVED,  /* after a barrier timeout: get <prefix>arrived (who did arrive?) */
    STEP_DONE
};

/* The create work's own deadline is a backstop behind the steps' (which
 * carry the real bound and produce the precise message). */
#define CREATE_GRACE_MS 1000
/* past its deadline, the most its give-up takes (create_cancel: ARRIVED,
 * POISON, RELEASE, 1 s each) before a waiter ends it itself */
#define CREATE_GIVE_UP_MS 4000
/* a create by name passes at most this many failed generations (POISONED);
 * it may take several slots of one (a lone retry burns its free slots) */
#define CREATE_REJOINS_MAX 4

typedef struct create_state {
    collie_work base; /* the "comm.create" work */
    collie_comm *comm;
    int step;
    collie_work *req; /* store request in flight (loop) */
    int inits_pending;
    char me[112];        /* "pid P on host H (handle N)": this comm's claim */
    char conflict[1024]; /* why the generation failed (a conflict or a timeout) */
    int fail_status;     /* with what: COLLIE_EINVAL (a conflict) or COLLIE_ETIMEDOUT */
    bool late;           /* it had failed when this rank joined (POISONED) */
    int rejoins;         /* failed generations passed (POISONED), each counted once */
    uint64_t passed_gen; /* the last one passed (a second slot there is not counted) */
    int origin;          /* the rank whose poison failed it (-1: none) */
    int withdraw_status; /* cl_comm_create_withdraw's, posted once joined */
    char withdraw[320];  /* and why */
} create_state;

/* the outcome "<prefix>conflict" holds once the generation is made */
#define CREATE_MADE "0|made"

/* comm_rendezvous_post.c: post the store request of cs->step (its bound:
 * the barrier gets what is left of the create's time, every other step at
 * least a second); cl_rendezvous_on_step gets its result. COLLIE_OK or the
 * post's error (no callback will run then). Loop. */
int cl_rendezvous_post_step(create_state *cs);
/* comm_rendezvous.c: a step's store request ended (its callback) */
void cl_rendezvous_on_step(collie_work *w, void *arg);
