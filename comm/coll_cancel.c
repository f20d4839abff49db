/*
 * coll_cancel.c — the collectives' one cancel hook: how a collective ends
 * when anyone but its backend's own completion ends it (deadline, cancel,
 * a waiter past the deadline, engine shutdown).
 *
 * Design notes
 *  - A deadline seen by the loop is explained first: the desync report
 *    (desync.c) asks the other ranks how far they got, then ends the work
 *    with the report. The report does not claim the work: the transport may
 *    still complete it meanwhile, and a waiter or cancel may still end it
 *    from its own thread — nothing waits on the loop to end a work.
 *  - A CPU work is finished at once: the loop's BUSY bit keeps the
 *    transport off its buffers.
 *  - A CUDA work (its backend has a cancel hook and holds it since the
 *    post) cannot be stopped that way, and NCCL cannot cancel one
 *    operation: the loop asks the backend to end it (ops->cancel), then
 *    faults the comm (its policy applies; under NONE the backend is aborted
 *    all the same); the backend ends the work itself once its abort has
 *    quiesced the device. A completion the user sees means the buffers are
 *    free. From another thread the request goes to the loop as a command,
 *    holding a reference to the work until it runs; the work may still
 *    complete meanwhile (then the request finds it ended and does nothing).
 *  - A backend already destroyed (the engine stopped) has nothing to
 *    quiesce: the work is finished at once.
 *  - Every path ends the work through cl_coll_finish (coll_end.c), which
 *    records a deadline's or a cancel's fault on the comm before the work
 *    is visible as failed.
 *  - An unmatched receive ends clean (DESIGN §3): no byte of a message was
 *    taken for it, so no peer is mid-operation. Only the loop can tell —
 *    it matches messages to receives — so a receive's cancel or deadline
 *    is decided there: a receive never started, or one its backend takes
 *    back (ops->recv_withdraw), ends with clean_end set (no comm fault,
 *    coll.c and comm.c); one matched already ends as a fault, as before.
 *    collie_work_cancel from another thread sends the request to the loop
 *    (cancel_cmd); a waiter past the deadline plus the grace still ends it
 *    at once from its own thread (then as a fault: the loop did not). A
 *    deadline that passed before the loop started the work comes here too
 *    (work/registry.c): a receive then ends clean, as it was never matched.
 */
#include <stdio.h>

#include "comm/comm.h"
#include "engine/engine.h"

/* the backend ends canceled works itself (a cancel hook and a live instance) */
static bool coll_backend_cancels(const cl_coll_work *cw) {
    return cw->bc->ops->cancel != NULL && cw->bc->state != NULL && !cw->comm->engine_gone;
}

/* Ask the backend to end w (loop). */
static void coll_cancel_on_loop(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    if (cl_work_done(w)) return;
    if (!coll_backend_cancels(cw)) {
        cl_coll_finish(w, status, "%s", msg);
        return;
    }
    collie_bcomm *bc = cw->bc;
    bc->ops->cancel(bc->state, w, status, msg);
    cl_comm_fault(cw->comm, status, "%s %s", w->ops->name, msg);
    /* policy NONE aborts nothing, but a device whose work was given up on
     * must be quiesced anyway: the abort is what lets the backend end it */
    if (cw->comm->policy == COLLIE_POLICY_NONE) bc->ops->abort(bc->state, COLLIE_EABORTED, msg);
}

static void coll_cancel_cmd(cl_cmd *cmd) {
    cl_coll_work *cw = cl_container_of(cmd, cl_coll_work, cancel_cmd);
    coll_cancel_on_loop(cw, cw->cancel_status, cw->cancel_msg);
    collie_work_release(&cw->base); /* the request's reference */
}

/* A device may still write w's buffers: its backend ends it (loop). The
 * first request is the one: later ones (a waiter after a cancel, a
 * deadline after either) return false, as for a work already ending. */
static bool coll_cancel_on_device(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    if (atomic_exchange_explicit(&cw->cancel_requested, true, memory_order_acq_rel)) return false;
    if (cl_engine_on_loop(w->engine)) {
        bool ending = !cl_work_done(w);
        coll_cancel_on_loop(cw, status, msg);
        return ending;
    }
    cw->cancel_status = status; /* written once: the flag above */
    snprintf(cw->cancel_msg, sizeof cw->cancel_msg, "%s", msg);
    cw->cancel_cmd.fn = coll_cancel_cmd;
    collie_work_hold(w); /* alive until the command runs */
    if (cl_engine_post_cmd(w->engine, &cw->cancel_cmd) == COLLIE_OK) return true;
    /* engine stopped: its backends are gone, nothing to quiesce */
    bool ended = cl_coll_finish(w, status, "%s", msg);
    collie_work_release(w);
    return ended;
}

/* Can a receive still end clean: one not started, or one whose backend
 * may withdraw it (loop). */
static bool coll_recv_may_withdraw(const cl_coll_work *cw) {
    if (cw->args.kind != COLLIE_COLL_RECV || cw->caller_started) return false;
    if (!cw->started) return true;
    return cw->bc->ops->recv_withdraw != NULL && cw->bc->state != NULL && !cw->comm->engine_gone;
}

/* End receive cw with status: clean if nothing matched it yet (loop). */
static bool coll_recv_end_on_loop(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    if (cl_work_done(w)) return false;
    if (coll_recv_may_withdraw(cw) &&
        (!cw->started || cw->bc->ops->recv_withdraw(cw->bc->state, w))) {
        cw->clean_end = true; /* before the finish: its end reads it (coll_end.c) */
        return cl_coll_finish(w, status, "%s", msg);
    }
    if (status == COLLIE_ETIMEDOUT) {
        if (cw->explaining) return false; /* its report ends it */
        if (cl_desync_start(cw)) return true;
    }
    return cl_coll_finish(w, status, "%s", msg);
}

static void coll_recv_cancel_cmd(cl_cmd *cmd) {
    cl_coll_work *cw = cl_container_of(cmd, cl_coll_work, cancel_cmd);
    coll_recv_end_on_loop(cw, cw->cancel_status, cw->cancel_msg);
    collie_work_release(&cw->base); /* the request's reference */
}

/* A receive's cancel or deadline: decided on the loop (Design notes). */
static bool coll_recv_cancel(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    if (cl_engine_on_loop(w->engine)) return coll_recv_end_on_loop(cw, status, msg);
    /* a waiter past the deadline and its grace: the loop did not end it,
     * the waiter must not depend on it */
    if (status != COLLIE_ECANCELED) return cl_coll_finish(w, status, "%s", msg);
    if (atomic_exchange_explicit(&cw->cancel_requested, true, memory_order_acq_rel))
        return !cl_work_done(w); /* asked already: it is ending */
    cw->cancel_status = status;  /* written once: the flag above */
    snprintf(cw->cancel_msg, sizeof cw->cancel_msg, "%s", msg);
    cw->cancel_cmd.fn = coll_recv_cancel_cmd;
    collie_work_hold(w); /* alive until the command runs */
    if (cl_engine_post_cmd(w->engine, &cw->cancel_cmd) == COLLIE_OK) return true;
    bool ended = cl_coll_finish(w, status, "%s", msg); /* engine stopped */
    collie_work_release(w);
    return ended;
}

bool cl_coll_end(cl_coll_work *cw, int status, const char *msg) {
    if (cw->caller_started && cw->bc->ops->cancel) return coll_cancel_on_device(cw, status, msg);
    return cl_coll_finish(&cw->base, status, "%s", msg);
}

bool cl_coll_cancel(collie_work *w, int status, const char *msg) {
    cl_coll_work *cw = (cl_coll_work *)w;
    if (cl_work_done(w)) return false;
    if (cw->args.kind == COLLIE_COLL_RECV && !cw->caller_started)
        return coll_recv_cancel(cw, status, msg);
    /* (a collective whose deadline passed before the loop started it ends
     * at once, without a report: work/registry.c) */
    if (status == COLLIE_ETIMEDOUT && cl_engine_on_loop(w->engine) && cw->start_called) {
        if (cw->explaining) return false; /* its report ends it */
        if (cl_desync_start(cw)) return true;
    }
    return cl_coll_end(cw, status, msg);
}
