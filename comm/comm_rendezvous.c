/*
 * comm_rendezvous.c — a communicator's rendezvous over the store and its
 * backends' initialisation: the "comm.create" work (comm_create.c makes the
 * comm and posts it here).
 *
 * Design notes
 *  - The rendezvous is a work ("comm.create") driven by store-work
 *    callbacks on the loop thread, so a non-blocking create costs the caller
 *    nothing and the blocking create is just post + wait:
 *      JOIN     add("collie/<name>/joins", 1) = v; generation = (v-1)/size
 *               — every member of one incarnation computes the same number
 *               without further messages, and a later incarnation of the
 *               same name gets a fresh key space "collie/<name>/<gen>/";
 *      POISONED read "<prefix>conflict" (not waiting): a generation
 *               made without this rank is a disagreement (EINVAL, at
 *               once); one that failed already (see below): a create by
 *               name joins again, for the next generation; a split's,
 *               new_group's, shrink's or grow's comm fails at once;
 *      INIT     each backend's init (the TCP transport publishes its
 *               listening address), reported through init_done; a split's
 *               child whose parent runs the same backend calls its split
 *               hook instead, and a shrink's new comm whose old comm does
 *               (and still has its state) its shrink hook, which may
 *               decline (COLLIE_ENOTSUP: init after all);
 *      CLAIM    compare_set("<prefix>rank/<r>", "" -> "pid P on host H"): a
 *               rank claimed by another process of this generation is a
 *               conflict (a rank restarted into the next generation is not);
 *      SIZE     compare_set("<prefix>size", "" -> "<size>|<members>|rank r
 *               (claim)"): a rank that says another world size, or (a
 *               new_group's child) was given another member list, is a
 *               conflict;
 *      BARRIER  append("<prefix>arrived", "<rank> ") and this process to
 *               "<prefix>host/<host>" (health.c) (pipelined, unawaited),
 *               then barrier("collie/<name>/<gen>/created", size);
 *      VERIFY   compare_set("<prefix>conflict", "" -> "0|made"): the
 *               generation is made, unless a poison came first.
 *    Each step is a store request; its result goes to that step's handler
 *    (create_step_fns, one small function per step). Only the barrier
 *    waits for the others and gets what is left of create_timeout_ms;
 *    every other step is one round trip with a bound of at least a second
 *    (within the work's grace), so none ends half done. A step or a
 *    backend init that fails once this rank has joined poisons the
 *    generation with why (POISON, RELEASE) and ends with the outcome that
 *    won, as a barrier timeout does: a taken slot is never left unmarked
 *    (but for a join whose answer is lost: cancelled or timed out in
 *    flight, its generation unknown here).
 *    The rank that finds a conflict writes it to "<prefix>conflict" and adds
 *    2^30 to the barrier's counter, so every rank waiting there wakes at
 *    once, reads it and fails with it; it fails itself with EINVAL.
 *  - "<prefix>conflict" is the generation's one outcome: its first value
 *    wins, "0|made" (written by the first member past the barrier) or a
 *    poison "<status>|<why>". So a member that gives up late (a timeout
 *    at the moment the barrier opened, a shrink's member dying while its
 *    new comm is made: cl_comm_create_withdraw) either fails every member
 *    with its poison or finds the comm made and succeeds with the others:
 *    never one member failed and the rest made.
 *  - A failed create poisons its generation; it never withdraws its join.
 *    The rule: a join takes one of its generation's `size` slots for good
 *    (withdrawing it would shift the generation of every rank that joined
 *    after it). A rank whose barrier times out reads who arrived (ARRIVED:
 *    the "arrived" list), and poisons the generation like a conflict:
 *    "<prefix>conflict" = "<status>|<why>" (compare_set: the first cause
 *    wins; ETIMEDOUT naming the ranks that never arrived), then +2^30 on
 *    the barrier. So every rank of that generation fails at once with that
 *    cause: those waiting in the barrier wake. One that joins it later
 *    (the missing rank arriving late, or a retry taking a slot left free)
 *    finds the poison right after joining (POISONED); it never waits
 *    there, and never "creates" the comm alone:
 *     - a create by name (collie_comm_create) joins again: its slot in the
 *       failed generation is burnt, and its new one is in the next. The
 *       counter realigns by itself: a round in which every rank creates
 *       again burns the failed generation's free slots and lands whole in
 *       the next one, whoever comes first, so a retry never fails for
 *       another rank's failure and a late rank waits for the others'
 *       retry. At most CREATE_REJOINS_MAX failed generations are passed
 *       (a store writer poisoning every one), then it fails as below; a
 *       rank alone may take several slots of one before the next (a
 *       generation of 6 with one slot taken: 5 joins), counted once;
 *     - a split's, new_group's, shrink's or grow's comm (named once per
 *       attempt: nobody comes to a later generation of that name) fails
 *       fast instead, naming the generation and why it failed.
 *    An application retries a failed create (as after any fault); it never
 *    has to reset the counter.
 *  - Keys of old generations go (cl_comm_forget_generation): once
 *    generation g is created, rank 0 deletes "collie/<name>/<g-1>/" (every
 *    member has moved on), and the last member to destroy a comm deletes
 *    its own (comm_destroy.c, OUT), so a server that re-creates its comm after every
 *    fault keeps a flat store.
 *  - The create work's deadline bounds all of it. When it ends early
 *    (deadline, abort), its detach cancels the store request in flight; the
 *    step callback then sees the cancellation and stops. A deadline that
 *    passes after the join (the loop stopped while the barrier opened)
 *    gives up like a barrier timeout instead (create_cancel: ARRIVED,
 *    POISON): the others may have made the comm, and it ends with them.
 *  - The work's start makes the comm a resident of its engine (or its
 *    detach, when it ended before starting), so the post never waits for
 *    the loop. Ended from outside (collie_work_cancel, collie_comm_abort)
 *    after this rank joined, it poisons its generation like a timeout
 *    (create_poison_on_giving_up): the ranks waiting for it fail at once.
 *  - The create state holds a comm reference until its last callback, and
 *    a store request in flight holds a reference on the create work: when
 *    the work ends early its detach only cancels the request, whose
 *    callback runs later, after the caller may have released the work.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/hash.h"
#include "comm/comm.h"
#include "comm/rendezvous_state.h"
#include "engine/engine.h"

static void create_fail(create_state *cs, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A generation's outcome as fault data: a conflict is a mismatch of the
 * ranks' arguments; a give-up (cancel, abort, withdraw) is an abort, this
 * rank's own or a peer's (origin: who poisoned it); view peer when another
 * rank's poison failed this one. */
static void create_fault(const create_state *cs, int status, cl_fault *f) {
    /* a store writer's text: an origin past the comm's ranks is none */
    int origin = cs->origin < cs->comm->size ? cs->origin : -1;
    bool peer = origin >= 0 && origin != cs->comm->rank;
    int kind = status == COLLIE_EINVAL      ? COLLIE_FAULT_MISMATCH
               : status == COLLIE_ETIMEDOUT ? COLLIE_FAULT_DEADLINE
               : status == COLLIE_ECANCELED || status == COLLIE_EABORTED
                   ? (peer ? COLLIE_FAULT_PEER_ABORT : COLLIE_FAULT_APP_ABORT)
                   : COLLIE_FAULT_LOCAL;
    cl_fault_init(f, kind, peer ? COLLIE_FAULT_VIEW_PEER : COLLIE_FAULT_VIEW_LOCAL, origin);
}

static void create_fail(create_state *cs, int status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cs->step = STEP_DONE;
    /* the comm's state before the completion is visible (as on success) */
    if (cl_work_claim(&cs->base)) {
        cl_fault f;
        create_fault(cs, status, &f);
        cl_comm_created(cs->comm, status, msg, cs->origin >= 0 ? &f : NULL);
        cl_work_publish(&cs->base, status, "%s", msg);
    }
}

static void create_next(create_state *cs, int step);

static void create_init_backends(create_state *cs) {
    collie_comm *c = cs->comm;
    cs->step = STEP_INIT;
    cs->inits_pending = 0;
    for (int d = 0; d < CL_NUM_DEVICES; d++)
        if (c->bcs[d].ops) cs->inits_pending++;
    for (int d = 0; d < CL_NUM_DEVICES && cs->step == STEP_INIT; d++) {
        collie_bcomm *bc = &c->bcs[d];
        if (!bc->ops) continue;
        bc->init_called = true;
        collie_bcomm *pb = c->split.parent ? &c->split.parent->bcs[d] : NULL;
        collie_comm *from = c->shrunk.from;
        collie_bcomm *ob = from && !from->destroyed ? &from->bcs[d] : NULL;
        int r = COLLIE_ENOTSUP;
        cl_clear_last_error(); /* nothing stale in the message below */
        if (pb && pb->ops == bc->ops && bc->ops->split && pb->state && pb->ready) {
            r = bc->ops->split(bc, &cl_core_services, pb->state, c->split.color, c->split.key,
                               &bc->state);
        } else {
            if (ob && ob->ops == bc->ops && bc->ops->shrink && ob->state && ob->ready)
                r = bc->ops->shrink(bc, &cl_core_services, ob->state, c->shrunk.excluded,
                                    c->shrunk.nexcluded, &bc->state);
            if (r == COLLIE_ENOTSUP && !bc->state) { /* declined: a fresh init */
                cl_clear_last_error();
                r = bc->ops->init(bc, &cl_core_services, &bc->state);
            }
        }
        if (r != COLLIE_OK) {
            /* the backend says why through set_error; if it did not, at
             * least the status does */
            const char *why = collie_last_error();
            snprintf(cs->conflict, sizeof cs->conflict,
                     "rank %d: backend %s failed to initialise: %.600s", c->rank, bc->ops->name,
                     why && why[0] ? why : collie_strerror(r));
            /* its slot is taken: the others are told (POISON) */
            cs->fail_status = cl_status_is_error(r) ? r : COLLIE_ESYSTEM;
            create_next(cs, STEP_POISON);
            return;
        }
        /* publishing threads may call its unlend hook from now on (coll.c) */
        atomic_store_explicit(&bc->lendable, true, memory_order_seq_cst);
        cl_backend_progress_start(bc);
    }
}

/* Called by backends through the core services (loop). */
void cl_comm_backend_init_done(collie_bcomm *bc, int status, const char *msg) {
    collie_comm *c = bc->comm;
    create_state *cs = c->create_state;
    if (!cs || cs->step != STEP_INIT) return;
    if (status != COLLIE_OK) { /* joined: the others are told (POISON) */
        snprintf(cs->conflict, sizeof cs->conflict,
                 "rank %d: backend %s failed to initialise: %.600s", c->rank, bc->ops->name,
                 msg ? msg : collie_strerror(status));
        cs->fail_status = cl_status_is_error(status) ? status : COLLIE_ESYSTEM;
        create_next(cs, STEP_POISON);
        return;
    }
    bc->ready = true;
    if (--cs->inits_pending > 0) return;
    cs->step = STEP_BARRIER;
    int r = cl_rendezvous_post_step(cs);
    if (r != COLLIE_OK) create_fail(cs, r, "store barrier: %s", collie_last_error());
}

static void create_step_done(create_state *cs, collie_work *w);

static void create_succeed(create_state *cs);

/* Go to `step` and post its request; a post that fails ends the create. */
static void create_next(create_state *cs, int step) {
    cs->step = step;
    int r = cl_rendezvous_post_step(cs);
    if (r != COLLIE_OK)
        create_fail(cs, r, "store request of the rendezvous: %s", collie_last_error());
}

/* The store request's callback: take the step's result, then drop the
 * request's reference on the create work (last: it may free cs). */
void cl_rendezvous_on_step(collie_work *w, void *arg) {
    create_state *cs = arg;
    create_step_done(cs, w);
    collie_work_release(&cs->base);
}

/* The barrier timed out; `list` ("r r ... ") names the ranks that arrived
 * (NULL: unknown). Say who did not, and poison the generation with it. */
static void create_timed_out(create_state *cs, const char *list, size_t len) {
    cl_rendezvous_timeout_text(cs->comm, list, len, cs->conflict, sizeof cs->conflict);
    cs->fail_status = COLLIE_ETIMEDOUT;
    create_next(cs, STEP_POISON);
}

/* ---- the steps' results: one function per step, a table of them ------------------- */

/* A step's handler gets the finished store request `w` (OK, but for
 * STEP_ARRIVED, which also takes a failed one) and moves the rendezvous on:
 * the next step, the backends' init, success or failure. The caller
 * releases w after it. */
typedef void (*create_step_fn)(create_state *cs, collie_work *w);

/* the value a compare_set found, as text */
static void step_value_text(collie_work *w, char *buf, size_t len) {
    const void *val = NULL;
    size_t n = 0;
    collie_store_work_value(w, &val, &n);
    snprintf(buf, len, "%.*s", (int)n, (const char *)val);
}

/* does the compare_set's (or get's) value say the generation is made? */
static bool step_value_made(collie_work *w) {
    const void *val = NULL;
    size_t n = 0;
    collie_store_work_value(w, &val, &n);
    return n == strlen(CREATE_MADE) && memcmp(val, CREATE_MADE, n) == 0;
}

static void step_conflict_done(create_state *cs, collie_work *w);

static void step_join_done(create_state *cs, collie_work *w) {
    collie_comm *c = cs->comm;
    int64_t v = 0;
    collie_store_work_int(w, &v);
    c->generation = (uint64_t)(v - 1) / (uint64_t)c->size;
    snprintf(c->prefix, sizeof c->prefix, "collie/%s/%llu/", c->name,
             (unsigned long long)c->generation);
    /* FNV-1a of the prefix: the comm id carried in transport handshakes */
    c->id = cl_fnv1a_str(CL_FNV1A_OFFSET, c->prefix);
    if (cs->withdraw_status) cl_rendezvous_post_poison(c, cs->withdraw_status, cs->withdraw);
    create_next(cs, STEP_POISONED);
}

static void step_poisoned_done(create_state *cs, collie_work *w) {
    collie_comm *c = cs->comm;
    const void *val = NULL;
    size_t len = 0;
    collie_store_work_value(w, &val, &len);
    if (len == 0) { /* the generation has no outcome yet */
        create_next(cs, STEP_CLAIM);
        return;
    }
    /* a create by name passes a failed generation: its slot there is
     * burnt, and it joins again for the next (see the notes); one made
     * without this rank is a disagreement on the world size (CONFLICT) */
    bool by_name = !c->line.how && !c->split.parent;
    bool again = cs->rejoins > 0 && c->generation == cs->passed_gen;
    if (!step_value_made(w) && by_name && (again || cs->rejoins < CREATE_REJOINS_MAX)) {
        if (!again) cs->rejoins++; /* a generation's free slots are burnt one by one */
        cs->passed_gen = c->generation;
        c->prefix[0] = '\0'; /* none joined until the new join is answered */
        create_next(cs, STEP_JOIN);
        return;
    }
    cs->late = true;
    step_conflict_done(cs, w); /* the value is the outcome */
}

static void step_claim_done(create_state *cs, collie_work *w) {
    collie_comm *c = cs->comm;
    char held[sizeof c->split.members + 160];
    step_value_text(w, held, sizeof held);
    cs->fail_status = COLLIE_EINVAL;
    if (strcmp(held, cs->me) == 0) {
        create_next(cs, STEP_SIZE);
        return;
    }
    snprintf(cs->conflict, sizeof cs->conflict,
             "rank %d of comm '%s' (generation %llu) is claimed by %s and by %s", c->rank, c->name,
             (unsigned long long)c->generation, held, cs->me);
    create_next(cs, STEP_POISON);
}

static void step_size_done(create_state *cs, collie_work *w) {
    collie_comm *c = cs->comm;
    char held[sizeof c->split.members + 160];
    step_value_text(w, held, sizeof held);
    cs->fail_status = COLLIE_EINVAL;
    /* "<size>|<members>|rank r (claim)" */
    const char *members = strchr(held, '|'), *who = members ? strchr(members + 1, '|') : NULL;
    size_t mlen = members && who ? (size_t)(who - members - 1) : 0;
    if (atoi(held) != c->size) {
        snprintf(cs->conflict, sizeof cs->conflict,
                 "comm '%s' (generation %llu): rank %d says the world has %d ranks, %s "
                 "says %d",
                 c->name, (unsigned long long)c->generation, c->rank, c->size,
                 who ? who + 1 : "another rank", atoi(held));
        create_next(cs, STEP_POISON);
    } else if (mlen != strlen(c->split.members) ||
               memcmp(members + 1, c->split.members, mlen) != 0) {
        snprintf(cs->conflict, sizeof cs->conflict,
                 "comm '%s' (generation %llu): the ranks were given different member lists: "
                 "rank %d was given [%s] of the parent's ranks, %s was given [%.*s]",
                 c->name, (unsigned long long)c->generation, c->rank, c->split.members,
                 who ? who + 1 : "another rank", (int)mlen, members ? members + 1 : "");
        create_next(cs, STEP_POISON);
    } else {
        create_init_backends(cs);
    }
}

static void step_barrier_done(create_state *cs, collie_work *w) {
    (void)w;
    create_next(cs, STEP_VERIFY);
}

static void step_verify_done(create_state *cs, collie_work *w) {
    if (step_value_made(w))
        create_succeed(cs);
    else
        step_conflict_done(cs, w); /* the value is the poison */
}

static void step_conflict_done(create_state *cs, collie_work *w) {
    collie_comm *c = cs->comm;
    const void *val = NULL;
    size_t len = 0;
    collie_store_work_value(w, &val, &len);
    int status =
        cl_rendezvous_poison_parse(val, len, cs->conflict, sizeof cs->conflict, &cs->origin);
    if (step_value_made(w)) { /* made without this rank: it computed this generation alone */
        cs->origin = c->rank;
        create_fail(cs, COLLIE_EINVAL,
                    "rank %d: comm '%s' generation %llu was made by other ranks without this one "
                    "(do the ranks agree on the world size?)",
                    c->rank, c->name, (unsigned long long)c->generation);
    } else if (cs->late) /* it failed before this rank came: say so, never wait */
        create_fail(cs, status,
                    "rank %d: comm '%s' generation %llu had already failed when this rank "
                    "joined it (every rank must create again for the next generation): %s",
                    c->rank, c->name, (unsigned long long)c->generation, cs->conflict);
    else
        create_fail(cs, status, "rendezvous: %s", cs->conflict);
}

static void step_poison_done(create_state *cs, collie_work *w) {
    /* a timeout that came as the barrier opened: every rank had arrived
     * and one found the generation made, so it is (never one rank out) */
    if (cs->fail_status == COLLIE_ETIMEDOUT && step_value_made(w)) {
        create_succeed(cs);
        return;
    }
    /* a timeout ends with the generation's first cause (another rank's
     * may have come first); a conflict with its own */
    const void *val = NULL;
    size_t len = 0;
    collie_store_work_value(w, &val, &len);
    cs->origin = cs->comm->rank;
    if (cs->fail_status == COLLIE_ETIMEDOUT && len > 0)
        cs->fail_status =
            cl_rendezvous_poison_parse(val, len, cs->conflict, sizeof cs->conflict, &cs->origin);
    create_next(cs, STEP_RELEASE);
}

static void step_release_done(create_state *cs, collie_work *w) {
    (void)w;
    create_fail(cs, cs->fail_status, "%s", cs->conflict);
}

static void step_arrived_done(create_state *cs, collie_work *w) {
    const void *val = NULL;
    size_t len = 0;
    bool ok = collie_work_result(w) == COLLIE_OK;
    if (ok) collie_store_work_value(w, &val, &len);
    create_timed_out(cs, ok ? val : NULL, len);
}

/* STEP_INIT waits for the backends (cl_comm_backend_init_done), not for a
 * store request: no entry */
static const create_step_fn create_step_fns[STEP_DONE] = {
    [STEP_JOIN] = step_join_done,         [STEP_POISONED] = step_poisoned_done,
    [STEP_CLAIM] = step_claim_done,       [STEP_SIZE] = step_size_done,
    [STEP_BARRIER] = step_barrier_done,   [STEP_VERIFY] = step_verify_done,
    [STEP_CONFLICT] = step_conflict_done, [STEP_POISON] = step_poison_done,
    [STEP_RELEASE] = step_release_done,   [STEP_ARRIVED] = step_arrived_done,
};

/* A store request of the rendezvous failed (but for STEP_ARRIVED's). */
static void create_step_failed(create_state *cs, collie_work *w, int st) {
    collie_comm *c = cs->comm;
    if (st == COLLIE_ETIMEDOUT && cs->step == STEP_BARRIER) {
        create_next(cs, STEP_ARRIVED); /* who did arrive, for the message */
        return;
    }
    const char *what = cs->step == STEP_JOIN ? "joining" : "waiting for every rank";
    /* joined, and not telling the others already: its slot is taken, so it
     * poisons the generation with why (as a barrier timeout does) and ends
     * with the outcome that won; the others never wait for it */
    bool telling = cs->step == STEP_POISON || cs->step == STEP_RELEASE;
    if (c->prefix[0] && !telling) {
        snprintf(cs->conflict, sizeof cs->conflict, "rank %d of %d: %s: %.600s", c->rank, c->size,
                 what, collie_work_error_message(w));
        cs->fail_status = st;
        create_next(cs, STEP_POISON);
        return;
    }
    if (st == COLLIE_ETIMEDOUT)
        create_fail(cs, COLLIE_ETIMEDOUT,
                    "rank %d of %d: not every rank arrived within %d ms (%s: %s)", c->rank, c->size,
                    (int)c->create_timeout_ms, what, collie_work_error_message(w));
    else
        create_fail(cs, st, "rank %d of %d: %s: %s", c->rank, c->size, what,
                    collie_work_error_message(w));
}

static void create_step_done(create_state *cs, collie_work *w) {
    if (w != cs->req) { /* given up by create_cancel: the outcome is read anew */
        collie_work_release(w);
        return;
    }
    int st = collie_work_result(w);
    cs->req = NULL;
    if (cs->step == STEP_DONE || cl_work_done(&cs->base)) {
        /* ended meanwhile (deadline, abort) */
    } else if (st != COLLIE_OK && cs->step != STEP_ARRIVED) {
        create_step_failed(cs, w, st);
    } else if (cs->step >= 0 && cs->step < STEP_DONE && create_step_fns[cs->step]) {
        create_step_fns[cs->step](cs, w);
    } else {
        create_succeed(cs);
    }
    collie_work_release(w);
}

static void create_succeed(create_state *cs) {
    collie_comm *c = cs->comm;
    cs->step = STEP_DONE;
    /* READY before the completion is visible: a caller that saw the create
     * work succeed must find the comm ready */
    if (cl_work_claim(&cs->base)) {
        /* every member passed the rendezvous (claims and world size agreed)
         * into this generation: the previous one's keys can go. Not before:
         * a rank with a wrong world size computes another generation. */
        if (c->rank == 0 && c->generation > 0) cl_comm_forget_generation(c, c->generation - 1);
        cl_comm_created(c, COLLIE_OK, NULL, NULL);
        cl_work_publish(&cs->base, COLLIE_OK, NULL);
    }
}

static void create_start(collie_work *w) {
    create_state *cs = (create_state *)w;
    cs->comm->create_state = cs;
    if (!cl_comm_attach_on_loop(cs->comm)) {
        create_fail(cs, COLLIE_ECLOSED, "the engine is shutting down");
        return;
    }
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    /* the handle number tells two comms of one process apart */
    static _Atomic unsigned handles;
    snprintf(cs->me, sizeof cs->me, "pid %d on host %s (handle %u)", (int)getpid(), host,
             atomic_fetch_add(&handles, 1) + 1);
    cs->step = STEP_JOIN;
    int r = cl_rendezvous_post_step(cs);
    if (r != COLLIE_OK) create_fail(cs, r, "store add: %s", collie_last_error());
}

/* The create was ended from outside (collie_work_cancel, collie_comm_abort)
 * after this rank joined its generation: poison the generation, as a
 * timeout does, so the ranks waiting in the barrier fail at once naming
 * this rank instead of waiting out their timeout. */
static void create_poison_on_giving_up(create_state *cs, int status) {
    collie_comm *c = cs->comm;
    if (c->prefix[0] == '\0' || !c->store) return; /* not joined: no slot taken */
    char why[sizeof cs->conflict];
    snprintf(why, sizeof why,
             "rank %d of %d gave up its creation of comm '%s' (generation %llu): %.600s", c->rank,
             c->size, c->name, (unsigned long long)c->generation,
             collie_work_error_message(&cs->base));
    cl_rendezvous_post_poison(c, status, why);
}

void cl_comm_create_withdraw(collie_work *w, int status, const char *why) {
    create_state *cs = (create_state *)w;
    if (cl_work_done(w) || cs->withdraw_status) return;
    cs->withdraw_status = status;
    snprintf(cs->withdraw, sizeof cs->withdraw, "%s", why);
    if (cs->comm->prefix[0])
        cl_rendezvous_post_poison(cs->comm, status,
                                  cs->withdraw); /* its own steps read the outcome */
    else if (cs->step != STEP_JOIN || !cs->req)
        collie_work_cancel(w); /* it took no slot */
    /* else its join is in flight: step_join_done posts the poison */
}

/* Its deadline passed (the sweep, on the loop) after this rank joined: the
 * others may have made the comm meanwhile (this rank stopped while the
 * barrier opened), so it does not end at once, split from them: it
 * poisons the generation as a barrier timeout does (ARRIVED, POISON) and
 * ends with the outcome that won, made or failed, within a few store
 * bounds (cancel_grace_ms covers them). Any other end, and one off the
 * loop: at once. */
static bool create_cancel(collie_work *w, int status, const char *msg) {
    create_state *cs = (create_state *)w;
    if (status != COLLIE_ETIMEDOUT || !cl_engine_on_loop(w->engine) || !cs->comm->prefix[0] ||
        cs->step == STEP_DONE || cl_work_done(w))
        return cl_work_finish(w, status, "%s", msg);
    if (cs->step == STEP_ARRIVED || cs->step == STEP_POISON || cs->step == STEP_RELEASE)
        return true; /* giving up already, each step bounded */
    collie_work *old = cs->req;
    cs->req = NULL;
    if (old) collie_work_cancel(old); /* its callback drops it (not cs->req) */
    create_next(cs, STEP_ARRIVED);
    return true;
}

static void create_detach(collie_work *w) {
    create_state *cs = (create_state *)w;
    collie_comm *c = cs->comm;
    /* the steps end it with STEP_DONE set; anything else came from outside */
    if (cs->step != STEP_DONE && (w->status == COLLIE_ECANCELED || w->status == COLLIE_EABORTED))
        create_poison_on_giving_up(cs, w->status);
    cs->step = STEP_DONE;
    if (cs->req) collie_work_cancel(cs->req); /* its callback releases it */
    if (c->shrunk.from) {                     /* its backends were used (or not) by now */
        cl_comm_release(c->shrunk.from);
        c->shrunk.from = NULL;
    }
    c->create_state = NULL;
    c->create_work = NULL;
    /* ended before its start made the comm a resident (cancelled at once,
     * engine shutdown): a resident now, so an engine shutdown before the
     * comm's destroy still marks it gone; an engine closing already has */
    if (!c->resident_added && !c->destroyed && !cl_comm_attach_on_loop(c)) c->engine_gone = true;
    if (w->status != COLLIE_OK) cl_comm_created(c, w->status, collie_work_error_message(w), NULL);
}

static void create_free(collie_work *w) {
    create_state *cs = (create_state *)w;
    cl_comm_release(cs->comm);
    free(cs);
}

static void create_describe(const collie_work *w, char *buf, size_t len) {
    const create_state *cs = (const create_state *)w;
    snprintf(buf, len, " (comm '%s')", cs->comm->name);
}

static const cl_work_ops create_ops = {.name = "comm.create",
                                       .start = create_start,
                                       .detach = create_detach,
                                       .free = create_free,
                                       .describe = create_describe,
                                       .cancel = create_cancel,
                                       .cancel_grace_ms = CREATE_GIVE_UP_MS};

/* ---- the create work ---------------------------------------------------------------- */

collie_comm *cl_comm_create_work_comm(const collie_work *w) {
    return w && w->ops == &create_ops ? ((const create_state *)w)->comm : NULL;
}

int cl_comm_create_start(collie_comm *c, const collie_post_opts *post, collie_work **work) {
    collie_engine *e = c->engine;
    int res;
    create_state *cs = calloc(1, sizeof *cs);
    if (!cs) {
        cl_comm_release(c);
        return COLLIE_ENOMEM;
    }
    cs->origin = -1;
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = cl_opt(post, cb, NULL); /* the caller's completion: callback, queue, tag */
    po.cb_arg = cl_opt(post, cb_arg, NULL);
    po.cq = cl_opt(post, cq, NULL);
    po.tag = cl_opt(post, tag, 0);
    po.timeout_ms = c->create_timeout_ms == COLLIE_TIMEOUT_INFINITE
                        ? COLLIE_TIMEOUT_INFINITE
                        : c->create_timeout_ms + CREATE_GRACE_MS;
    cl_work_init(&cs->base, e, &create_ops, &po, po.timeout_ms);
    cs->comm = c;
    cl_comm_hold(c); /* the create state's */
    /* the comm becomes a resident of the engine in create_start, on the
     * loop: nothing here waits for the loop */
    c->create_work = &cs->base;
    if ((res = cl_work_post(&cs->base)) != COLLIE_OK) {
        c->create_work = NULL;
        free(cs);
        cl_comm_release(c);
        cl_comm_release(c);
        if (res == COLLIE_ESTATE) return res; /* a forked child: its message */
        return cl_set_last_error(res, "collie_comm_create: engine is shutting down");
    }
    *work = &cs->base;
    return COLLIE_OK;
}
