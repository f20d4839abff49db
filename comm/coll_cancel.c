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
 *  - A CUDA work (its backend has an adopt hook and holds it since the
 *    post) cannot be stopped that way, and NCCL cannot cancel one
 *    operation: the canceller claims it (nobody else may end it) and hands
 *    it to the loop, which gives it to the backend (adopt) and faults the
 *    comm (its policy applies; under NONE the backend is aborted all the
 *    same); the backend publishes it once its abort has quiesced the
 *    device. A completion the user sees means the buffers are free.
 *  - A backend already destroyed (the engine stopped) has nothing to
 *    quiesce: the work is published at once.
 *  - Every path publishes through cl_work_publish, whose on_publish hook
 *    (coll.c) records a deadline's or a cancel's fault on the comm before
 *    the work is visible as failed.
 */
#include <stdio.h>

#include "comm/comm.h"
#include "engine/engine.h"

/* the backend can adopt works (an adopt hook and a live instance) */
static bool coll_adopts(const cl_coll_work *cw) {
    return cw->bc->ops->adopt != NULL && cw->bc->state != NULL;
}

void cl_coll_adopt_claimed(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    collie_bcomm *bc = cw->bc;
    if (!coll_adopts(cw) || cw->comm->engine_gone) {
        cl_work_publish(w, status, "%s", msg);
        return;
    }
    bc->ops->adopt(bc->state, w, status, msg);
    cl_comm_fault(cw->comm, status, "%s %s", w->ops->name, msg);
    /* policy NONE aborts nothing, but the adopted work is published only by
     * an abort: a device whose work was given up on must be quiesced anyway */
    if (cw->comm->policy == COLLIE_POLICY_NONE) bc->ops->abort(bc->state, COLLIE_EABORTED, msg);
}

static void coll_handoff_cmd(cl_cmd *cmd) {
    cl_coll_work *cw = cl_container_of(cmd, cl_coll_work, handoff_cmd);
    cl_coll_adopt_claimed(cw, cw->handoff_status, cw->handoff_msg);
}

/* A device may still write w's buffers: claim it (any thread), then let its
 * backend publish it once the device is quiet (loop). */
static bool coll_cancel_on_device(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    if (!cl_work_claim(w)) return false;
    if (cl_engine_on_loop(w->engine)) {
        cl_coll_adopt_claimed(cw, status, msg);
        return true;
    }
    /* claimed and not published: the work (and its comm) stay alive */
    cw->handoff_status = status;
    snprintf(cw->handoff_msg, sizeof cw->handoff_msg, "%s", msg);
    cw->handoff_cmd.fn = coll_handoff_cmd;
    if (cl_engine_post_cmd(w->engine, &cw->handoff_cmd) != COLLIE_OK)
        cl_work_publish(w, status, "%s", msg); /* engine stopped: backends are gone */
    return true;
}

bool cl_coll_end(cl_coll_work *cw, int status, const char *msg) {
    if (cw->caller_started && cw->bc->ops->adopt) return coll_cancel_on_device(cw, status, msg);
    return cl_work_finish(&cw->base, status, "%s", msg);
}

bool cl_coll_cancel(collie_work *w, int status, const char *msg) {
    cl_coll_work *cw = (cl_coll_work *)w;
    if (cl_work_done(w)) return false;
    if (status == COLLIE_ETIMEDOUT && cl_engine_on_loop(w->engine)) {
        if (cw->explaining) return false; /* its report ends it */
        if (cl_desync_start(cw)) return true;
    }
    return cl_coll_end(cw, status, msg);
}
