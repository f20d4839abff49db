/*
 * comm_rendezvous_post.c — the store request of each rendezvous step
 * (comm_rendezvous.c runs the steps and reads their results).
 *
 * Design notes
 *  - One switch builds every step's request: the key under the
 *    generation's prefix ("<prefix>conflict", "rank/<r>", "size",
 *    "created", "arrived") or the name's join counter, and its value.
 *  - Bounds: only the barrier waits for the others, so it gets what is left
 *    of create_timeout_ms (the work's deadline less its grace); every other
 *    step is one round trip and gets at least a second, within the grace,
 *    so none ends half done on a loaded store.
 *  - The request holds a reference on the create work until its callback
 *    (cl_rendezvous_on_step) has run.
 */
#include <stdio.h>
#include <string.h>

#include "comm/rendezvous_state.h"
#include "engine/engine.h"

static int32_t create_remaining_ms(create_state *cs) {
    if (cs->base.deadline_ns == INT64_MAX) return COLLIE_TIMEOUT_INFINITE;
    int64_t left = (cs->base.deadline_ns - cl_now_ns()) / CL_NS_PER_MS - CREATE_GRACE_MS;
    return left < 1 ? 1 : (int32_t)left;
}

/* Post the store request of the current step; cl_rendezvous_on_step gets its
 * result. The request holds a reference on the create work until then. */
int cl_rendezvous_post_step(create_state *cs) {
    collie_comm *c = cs->comm;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = cl_rendezvous_on_step;
    o.cb_arg = cs;
    o.timeout_ms = create_remaining_ms(cs);
    /* only the barrier waits for the others: it gets what is left of the
     * create's time. Every other step is one store round trip, bounded by
     * at least a second of its own (the work's grace covers it), so a
     * short create_timeout_ms or a loaded store never ends one half done:
     * a join applied but unanswered, a VERIFY that made the comm for the
     * others but timed out here, a poison that never reached them */
    if (cs->step != STEP_BARRIER && o.timeout_ms != COLLIE_TIMEOUT_INFINITE && o.timeout_ms < 1000)
        o.timeout_ms = 1000;
    char key[160];
    int r;
    collie_work_hold(&cs->base);
    switch (cs->step) {
    case STEP_JOIN:
        snprintf(key, sizeof key, "collie/%s/joins", c->name);
        r = collie_store_post_add(c->store, key, 1, &o, &cs->req);
        break;
    case STEP_CLAIM:
        snprintf(key, sizeof key, "%srank/%d", c->prefix, c->rank);
        r = collie_store_post_compare_set(c->store, key, "", 0, cs->me, strlen(cs->me), &o,
                                          &cs->req);
        break;
    case STEP_SIZE: {
        char val[sizeof c->split.members + 160];
        int n = snprintf(val, sizeof val, "%d|%s|rank %d (%s)", c->size, c->split.members, c->rank,
                         cs->me);
        snprintf(key, sizeof key, "%ssize", c->prefix);
        r = collie_store_post_compare_set(c->store, key, "", 0, val, (size_t)n, &o, &cs->req);
        break;
    }
    case STEP_BARRIER:
        cl_rendezvous_announce(c, o.timeout_ms);
        snprintf(key, sizeof key, "%screated", c->prefix);
        r = collie_store_post_barrier(c->store, key, (uint32_t)c->size, &o, &cs->req);
        break;
    case STEP_POISONED: /* its value, read without waiting: a compare_set that sets nothing */
        snprintf(key, sizeof key, "%sconflict", c->prefix);
        r = collie_store_post_compare_set(c->store, key, "\x01", 1, "\x01", 1, &o, &cs->req);
        break;
    case STEP_VERIFY: /* the first value wins: made, or another's poison */
        snprintf(key, sizeof key, "%sconflict", c->prefix);
        r = collie_store_post_compare_set(c->store, key, "", 0, CREATE_MADE, strlen(CREATE_MADE),
                                          &o, &cs->req);
        break;
    case STEP_CONFLICT:
        snprintf(key, sizeof key, "%sconflict", c->prefix);
        r = collie_store_post_get(c->store, key, &o, &cs->req);
        break;
    case STEP_POISON: { /* the first cause wins: every rank reads the same */
        char val[sizeof cs->conflict + 32];
        int n = snprintf(val, sizeof val, "%d@%d|%s", cs->fail_status, c->rank, cs->conflict);
        snprintf(key, sizeof key, "%sconflict", c->prefix);
        r = collie_store_post_compare_set(c->store, key, "", 0, val, (size_t)n, &o, &cs->req);
        break;
    }
    case STEP_RELEASE:
        snprintf(key, sizeof key, "%screated", c->prefix);
        /* far past any round's count: every waiting rank's barrier ends */
        r = collie_store_post_add(c->store, key, 1 << 30, &o, &cs->req);
        break;
    case STEP_ARRIVED: /* after a barrier timeout: who did arrive? */
        snprintf(key, sizeof key, "%sarrived", c->prefix);
        o.timeout_ms = 1000;
        r = collie_store_post_get(c->store, key, &o, &cs->req);
        break;
    default: r = COLLIE_EINVAL; break;
    }
    if (r != COLLIE_OK) collie_work_release(&cs->base); /* no callback will run */
    return r;
}
