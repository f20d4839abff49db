/*
 * nccl_progress.c — the poll hook and detach (loop): completions, CUDA and
 * NCCL errors.
 *
 * Design notes
 *  - The engine calls the poll hook on a short timer only while something
 *    is pending (want_poll; the hook turns itself off when idle). Each turn
 *    finishes launches after ncclInProgress, queries the end events in post
 *    order (one internal stream: the first not-ready event ends the scan)
 *    and asks ncclCommGetAsyncError.
 *  - A work is finished only once the core has started it (its state is
 *    ACTIVE: busy_enter succeeds): a caller-started work is handed to the
 *    loop right after start returns, and finishing it before would retire
 *    it before it is tracked.
 *  - Faults: an async NCCL error, a CUDA error on an end event, or a call
 *    NCCL refused while launching a queued work. The async error is read
 *    before the end events are queried, so a work whose event completed
 *    before the error appeared is finished, not blamed. The oldest work the
 *    GPU has not finished is the root: it is claimed here (status
 *    COLLIE_EBACKEND, the NCCL or CUDA error in its message; if the core
 *    has not started it yet, as soon as it has) and published by the abort
 *    once the GPU work is quiesced. core->fault then applies the comm's
 *    policy, which aborts us; under policy NONE we abort the NCCL
 *    communicator ourselves, since its works can never complete.
 *  - Completions are collected under the lock and finished after it.
 */
#include <stdio.h>
#include <string.h>

#include "transports/nccl/nccl_backend.h"

#define NCCL_POLL_BATCH 64

bool cl_nccl_work_active(const collie_core_services *core, collie_work *w) {
    if (!core->work_busy_enter(w)) return false; /* not started yet, or finished */
    core->work_busy_exit(w);
    return true;
}

/* Choose the root of a fault (mu): `nw`, the work the fault was seen on, or
 * the oldest work not done on the GPU. Claimed now if the core has started
 * it, else when it does (the abort's "late" path). */
static void nccl_claim_root_locked(cl_nccl_comm *nc, cl_nccl_work *nw, int status,
                                   const char *msg) {
    if (nc->root) return;
    if (!nw) {
        cl_nccl_work *it;
        cl_list_foreach(&nc->pending, it, cl_nccl_work, node) {
            if (it->finished) continue;
            if (!it->gpu_done && it->state == NCCL_W_LAUNCHED && it->record_err == cudaSuccess)
                it->gpu_done = cudaEventQuery(it->end_ev) == cudaSuccess;
            if (!it->gpu_done) { /* the oldest the GPU has not finished */
                nw = it;
                break;
            }
        }
    }
    if (!nw || nw->finished) return;
    if (cl_nccl_work_active(nc->core, nw->w)) {
        if (!nc->core->work_claim(nw->w)) return; /* ended meanwhile (deadline, cancel) */
        nw->finished = nw->claimed = true;
    } else if (nc->core->work_test(nw->w)) {
        nw->finished = true;
        return;
    } else {
        nw->late = true;
    }
    nc->root = nw;
    nc->root_status = status;
    snprintf(nc->root_msg, sizeof nc->root_msg, "%s", msg);
}

/* Scan completions (mu). Returns the number of works to finish; sets *fault
 * and msg when the scan hit an error. */
static size_t nccl_scan_locked(cl_nccl_comm *nc, collie_work **done, bool *fault, char *msg,
                               size_t len) {
    size_t n = 0;
    char err[300];
    cl_nccl_work *nw;
    cl_list_foreach(&nc->pending, nw, cl_nccl_work, node) {
        if (n == NCCL_POLL_BATCH) break;
        if (nw->finished) continue;
        if (nw->issue_err != ncclSuccess) {
            snprintf(msg, len, "NCCL error: %s",
                     cl_nccl_strerror(nw->issue_err, nc->comm, err, sizeof err));
            nccl_claim_root_locked(nc, nw, COLLIE_EBACKEND, msg);
            *fault = true;
            break;
        }
        if (nw->state != NCCL_W_LAUNCHED) break;
        if (nw->record_err != cudaSuccess) {
            snprintf(msg, len, "CUDA error: cudaEventRecord: %s",
                     cudaGetErrorString(nw->record_err));
            nccl_claim_root_locked(nc, nw, COLLIE_EBACKEND, msg);
            *fault = true;
            break;
        }
        if (!nw->gpu_done) {
            cudaError_t q = cudaEventQuery(nw->end_ev);
            if (q == cudaErrorNotReady) break;
            if (q != cudaSuccess) {
                snprintf(msg, len, "CUDA error: %s", cudaGetErrorString(q));
                nccl_claim_root_locked(nc, nw, COLLIE_EBACKEND, msg);
                *fault = true;
                break;
            }
            nw->gpu_done = true;
        }
        if (nc->core->work_test(nw->w)) { /* ended already (deadline, cancel) */
            nw->finished = true;
            continue;
        }
        if (!cl_nccl_work_active(nc->core, nw->w)) continue; /* next turn */
        nw->finished = true;
        done[n++] = nw->w;
    }
    return n;
}

void cl_nccl_poll(void *state) {
    cl_nccl_comm *nc = state;
    collie_work *done[NCCL_POLL_BATCH];
    size_t ndone = 0;
    bool fault = false;
    char msg[512] = "", err[300];
    pthread_mutex_lock(&nc->mu);
    if (nc->aborting) {
        pthread_mutex_unlock(&nc->mu);
        cl_nccl_abort_poll(nc);
        return;
    }
    if (nc->phase == NCCL_READY) {
        if (nc->nccl_inprogress) {
            cudaSetDevice(nc->dev); /* NCCL calls may be made from this thread */
            cl_nccl_launch_progress_locked(nc);
        }
        /* the error first, then the events: an end event found complete
         * after an error was seen really completed before it (stream
         * order), so the works it ends made it and are not blamed */
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(nc->comm, &st);
        if (r != ncclSuccess) st = r;
        ndone = nccl_scan_locked(nc, done, &fault, msg, sizeof msg);
        if (!fault) {
            if (st != ncclSuccess && st != ncclInProgress) {
                snprintf(msg, sizeof msg, "NCCL error: %s",
                         cl_nccl_strerror(st, nc->comm, err, sizeof err));
                nccl_claim_root_locked(nc, NULL, COLLIE_EBACKEND, msg);
                fault = true;
            }
        }
    }
    bool need = fault || cl_nccl_poll_needed_locked(nc);
    if (!need) nc->poll_hint = false;
    pthread_mutex_unlock(&nc->mu);

    for (size_t i = 0; i < ndone; i++)
        nc->core->work_finish(done[i], COLLIE_OK, NULL);
    if (fault) {
        NCCL_LOG(nc, 0, "%s", msg);
        nc->core->fault(nc->bc, NULL, COLLIE_EBACKEND, "%s", msg); /* the core aborts us */
        pthread_mutex_lock(&nc->mu);
        bool aborting = nc->aborting;
        pthread_mutex_unlock(&nc->mu);
        if (!aborting) { /* policy NONE: the NCCL comm is broken all the same */
            char reason[600];
            snprintf(reason, sizeof reason, "aborted: %s", msg);
            cl_nccl_abort(nc, COLLIE_EABORTED, reason);
        }
        return;
    }
    if (!need) nc->core->want_poll(nc->bc, false, 0);
}

void cl_nccl_detach(void *state, collie_work *w) {
    cl_nccl_comm *nc = state;
    if (!nc) return; /* destroyed before the work retired: nothing left */
    cl_nccl_work *nw = nc->core->work_backend_data(w);
    pthread_mutex_lock(&nc->mu);
    if (cl_list_linked(&nw->node)) {
        cl_list_remove(&nw->node);
        nw->late = false;
        /* the GPU finished with these events only if the end event completed */
        cl_nccl_event_put_locked(nc, nw->start_ev, nw->gpu_done);
        cl_nccl_event_put_locked(nc, nw->end_ev, nw->gpu_done);
        nw->start_ev = nw->end_ev = NULL;
    }
    if (nc->root == nw) nc->root = NULL;
    pthread_mutex_unlock(&nc->mu);
}
