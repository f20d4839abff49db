/*
 * coll_cancel.c — ending a collective a device may still be working on
 * (CUDA backends with an adopt hook): deadline, cancel, a waiter giving up.
 *
 * Design notes
 *  - A CPU work can be published the moment it is claimed: the loop's BUSY
 *    bit keeps the transport off its buffers. A GPU cannot be stopped that
 *    way, and NCCL cannot cancel one operation: whoever ends a CUDA work
 *    early claims it and hands it to the backend (adopt), the comm faults
 *    (its policy applies; under NONE the backend is aborted all the same),
 *    and the backend publishes the work once its abort has quiesced the
 *    device. A completion the user sees means the buffers are free.
 *  - Deadline: on the loop (cl_coll_expire), after the desync report when
 *    the comm has one (desync.c adopts the work with the report as its
 *    message). Cancel and waiters run on the
 *    caller's thread: they claim the work there (so nobody else finishes it)
 *    and queue the rest to the loop (handoff_cmd), where backends and comm
 *    faults live. The waiter's own wait stays bounded (wait.c).
 *  - A work the backend never received (refused at start) or a backend
 *    already destroyed (the engine stopped) has nothing to quiesce: it is
 *    published at once.
 */
#include <stdio.h>

#include "comm/comm.h"
#include "engine/engine.h"

bool cl_coll_adopts(const cl_coll_work *cw) {
    return cw->bc->ops->adopt != NULL && cw->bc->state != NULL;
}

void cl_coll_adopt_claimed(cl_coll_work *cw, int status, const char *msg) {
    collie_work *w = &cw->base;
    collie_bcomm *bc = cw->bc;
    bc->ops->adopt(bc->state, w, status, msg);
    cl_comm_fault(cw->comm, status, "%s %s", w->ops->name, msg);
    /* policy NONE aborts nothing, but the adopted work is published only by
     * an abort: a device whose work was given up on must be quiesced anyway */
    if (cw->comm->policy == COLLIE_POLICY_NONE) bc->ops->abort(bc->state, COLLIE_EABORTED, msg);
}

bool cl_coll_expire_adopt(cl_coll_work *cw) {
    collie_work *w = &cw->base;
    if (!cl_work_claim(w)) return true;
    char msg[160];
    snprintf(msg, sizeof msg, "deadline of %d ms passed", (int)w->timeout_ms);
    cl_coll_adopt_claimed(cw, COLLIE_ETIMEDOUT, msg);
    return true;
}

static void coll_handoff_cmd(cl_cmd *cmd) {
    cl_coll_work *cw = cl_container_of(cmd, cl_coll_work, handoff_cmd);
    if (!cl_coll_adopts(cw) || cw->comm->engine_gone)
        cl_work_publish(&cw->base, cw->handoff_status, "%s", cw->handoff_msg);
    else
        cl_coll_adopt_claimed(cw, cw->handoff_status, cw->handoff_msg);
}

void cl_coll_handoff(collie_work *w, int status, const char *msg) {
    cl_coll_work *cw = (cl_coll_work *)w;
    if (!cw->caller_started || !cw->bc->ops->adopt) { /* no device holds it */
        cl_work_publish(w, status, "%s", msg);
        return;
    }
    /* claimed and not published: the work (and its comm) stay alive */
    cw->handoff_status = status;
    snprintf(cw->handoff_msg, sizeof cw->handoff_msg, "%s", msg);
    cw->handoff_cmd.fn = coll_handoff_cmd;
    if (cl_engine_on_loop(w->engine)) {
        coll_handoff_cmd(&cw->handoff_cmd);
        return;
    }
    if (cl_engine_post_cmd(w->engine, &cw->handoff_cmd) != COLLIE_OK)
        cl_work_publish(w, status, "%s", msg); /* engine stopped: backends are gone */
}
