/*
 * coll_end.c — a collective's end, every step of it, in order: the one
 * place that says what happens when a collective work ends, whoever ends
 * it (its backend's completion, a cancel, a deadline, a waiter past its
 * deadline, a comm's fault, engine shutdown).
 *
 * Design notes: the end's state table (work states in capitals: work/work.h)
 *
 *   state        who runs it                  thread       what happens                 next
 *   ACTIVE or    the ender: the backend       any          cl_work_claim: one CAS       CLAIMED
 *   QUEUED       (work_finish/claim service),              winner; the others return
 *                coll_cancel.c, comm.c, a                  (the work is ending)
 *                fault (svc_fault)
 *   CLAIMED      coll_end_vpublish            the ender's  result filled in (work/):     FILLED
 *   (FINISHING)                                            status, message, end time;
 *                                                          the fault's data (fault.c)
 *   FILLED       coll_end_unlend              the ender's  the backend's unlend hook:   UNLENT
 *                                                          peers reading its memory
 *                                                          (shm single copy) stop first
 *   UNLENT       cl_stats_ended,              the ender's  stats counted, the flight    SEALED
 *                cl_flight_end,                            entry ended, a deadline's or
 *                coll_end_record_fault                     cancel's fault recorded on
 *                                                          the comm (not applied yet)
 *   SEALED       cl_work_show (work/)         the ender's  DONE (release: the result    VISIBLE
 *                                                          is visible with it),
 *                                                          waiters woken, retire queued
 *   VISIBLE      work/'s retire calls         loop         off the comm's lists, the    DETACHED
 *   (DONE)       ops->detach =                (progress    backend's detach, last_done,
 *                cl_coll_end_on_loop: the     thread)      the recorded fault applied
 *                one call work/ makes into                 (the comm's policy), nactive
 *                comm/ at a work's end                     down (destroy waits on it)
 *   DETACHED     work/'s retire, after the    loop         completion queue, user       RETIRED
 *                hook returns                              callback, engine's reference
 *
 *  - Why two threads: the result must become visible on the ender's thread
 *    (a waiter past its deadline must not depend on the loop, docs/design.md
 *    §3), while the comm's lists and the backend's detach hook belong to the
 *    loop. So everything a reader of the result relies on is done before
 *    DONE (unlend, stats, flight entry, fault record), and everything that
 *    needs the loop after it, before the completion queue and the callback.
 *  - Every ender of a collective ends it here (cl_coll_finish, or
 *    cl_work_claim + cl_coll_publish): the backends through the services
 *    table, comm/ directly. Never cl_work_finish on a collective: it would
 *    skip the unlend. work/ ends a collective only through its cancel hook
 *    (coll_cancel.c, the "someone else ends it" entry, which decides how —
 *    a desync report first, a device to quiet — and then ends it here).
 *  - The unlend gate: ops->unlend runs only while the backend instance is
 *    lendable; destroy clears that and waits for the threads inside
 *    (comm.c, comm_unlend_close), so the hook never runs on a freed backend.
 *  - A deadline or a cancel leaves the peers mid-operation, so it is the
 *    comm's fault (not for a receive withdrawn before any message matched
 *    it: clean_end, coll_cancel.c). It is recorded before DONE, so
 *    collie_comm_error is never behind a failed wait, and applied on the
 *    loop at detach (cl_comm_fault: the policy, the peers told).
 */
#include <stdarg.h>
#include <stdio.h>

#include "comm/comm.h"
#include "engine/engine.h"

/* " (comm 'x' rank r[, peer p, tag t])": the context of the work's message */
static void coll_end_describe(const cl_coll_work *cw, char *buf, size_t len) {
    const collie_coll_args *a = &cw->args;
    if (a->kind == COLLIE_COLL_RECV && a->peer == COLLIE_ANY_SOURCE)
        snprintf(buf, len, " (comm '%s' rank %d, any source, tag %llu)", cw->comm->name,
                 cw->comm->rank, (unsigned long long)a->tag);
    else if (a->kind == COLLIE_COLL_SEND || a->kind == COLLIE_COLL_RECV)
        snprintf(buf, len, " (comm '%s' rank %d, peer %d, tag %llu)", cw->comm->name,
                 cw->comm->rank, a->peer, (unsigned long long)a->tag);
    else
        snprintf(buf, len, " (comm '%s' rank %d)", cw->comm->name, cw->comm->rank);
}

/* FILLED → UNLENT: peers reading its memory must stop first (the shm
 * single copy); the gate keeps the backend from being destroyed meanwhile */
static void coll_end_unlend(cl_coll_work *cw) {
    collie_bcomm *bc = cw->bc;
    if (!bc->ops->unlend) return;
    atomic_fetch_add_explicit(&bc->unlending, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&bc->lendable, memory_order_seq_cst))
        bc->ops->unlend(bc->state, &cw->base);
    atomic_fetch_sub_explicit(&bc->unlending, 1, memory_order_seq_cst);
}

/* a deadline or cancel that leaves the peers mid-operation */
static bool coll_end_is_fault(const cl_coll_work *cw) {
    int st = cw->base.status;
    return (st == COLLIE_ETIMEDOUT || st == COLLIE_ECANCELED) && !cw->clean_end;
}

/* UNLENT: the comm's fault recorded (its policy is applied on the loop) */
static void coll_end_record_fault(cl_coll_work *cw) {
    if (!coll_end_is_fault(cw)) return;
    const collie_work *w = &cw->base;
    cl_comm_record_fault(cw->comm, w->status, &cw->fault, "%s",
                         w->errmsg ? w->errmsg : collie_strerror(w->status));
}

/* FILLED: the fault's data, unless its ender gave it: a work taken down by
 * its comm's fault carries the comm's; else what the status stands for. A
 * success raises the comm's last completed sequence number instead. */
static void coll_end_fault_data(cl_coll_work *cw) {
    int status = cw->base.status;
    collie_comm *c = cw->comm;
    if (status == COLLIE_OK) {
        cw->fault.kind = COLLIE_FAULT_NONE;
        /* every member reached it (peer health): a max, before it is seen */
        bool p2p = cw->args.kind == COLLIE_COLL_SEND || cw->args.kind == COLLIE_COLL_RECV;
        uint64_t seen = atomic_load_explicit(&c->last_completed, memory_order_relaxed);
        while (!p2p && cw->base.seq > seen &&
               !atomic_compare_exchange_weak_explicit(&c->last_completed, &seen, cw->base.seq,
                                                      memory_order_relaxed, memory_order_relaxed))
            ;
        return;
    }
    if (cw->fault.kind != COLLIE_FAULT_NONE) return;
    if (status == COLLIE_EABORTED &&
        atomic_load_explicit(&c->err_status, memory_order_acquire) != COLLIE_OK)
        cw->fault = c->fault; /* written before err_status was published */
    else
        cl_fault_classify(c, status, &cw->fault);
}

/* CLAIMED → VISIBLE (the ender's thread, after a won claim) */
static void coll_end_vpublish(cl_coll_work *cw, int status, const char *fmt, va_list ap) {
    collie_work *w = &cw->base;
    char ctx[192] = "";
    if (status != COLLIE_OK) coll_end_describe(cw, ctx, sizeof ctx); /* for the message only */
    cl_work_fill(w, status, ctx, fmt, ap);
    coll_end_fault_data(cw);
    coll_end_unlend(cw);
    cl_stats_ended(cw->comm, cw); /* counted before it is seen */
    cl_flight_end(cw->comm, cw);
    coll_end_record_fault(cw);
    cl_work_show(w);
}

void cl_coll_publish(collie_work *w, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    coll_end_vpublish((cl_coll_work *)w, status, fmt, ap);
    va_end(ap);
}

bool cl_coll_finish(collie_work *w, int status, const char *fmt, ...) {
    if (!cl_work_claim(w)) return false;
    va_list ap;
    va_start(ap, fmt);
    coll_end_vpublish((cl_coll_work *)w, status, fmt, ap);
    va_end(ap);
    return true;
}

bool cl_coll_vfinish_fault(collie_work *w, int status, const cl_fault *f, const char *fmt,
                           va_list ap) {
    if (!cl_work_claim(w)) return false;
    if (f) ((cl_coll_work *)w)->fault = *f; /* the winner alone writes it, before the fill */
    coll_end_vpublish((cl_coll_work *)w, status, fmt, ap);
    return true;
}

bool cl_coll_finish_fault(collie_work *w, int status, const cl_fault *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    bool won = cl_coll_vfinish_fault(w, status, f, fmt, ap);
    va_end(ap);
    return won;
}

/* VISIBLE → DETACHED (loop, from work/'s retire: ops->detach) */
void cl_coll_end_on_loop(collie_work *w) {
    cl_coll_work *cw = (cl_coll_work *)w;
    collie_comm *c = cw->comm;
    cl_list_remove(&cw->link); /* from the active list, or the waiting queue */
    /* caller_started: a CUDA work the backend holds even if the loop never
     * started it (cancelled before its start command ran) */
    if ((cw->started || cw->caller_started) && cw->bc->state) cw->bc->ops->detach(cw->bc->state, w);
    bool p2p = cw->args.kind == COLLIE_COLL_SEND || cw->args.kind == COLLIE_COLL_RECV;
    if (!p2p && w->seq > c->last_done) c->last_done = w->seq;
    if (coll_end_is_fault(cw)) cl_comm_fault(c, w->status, "%s", collie_work_error_message(w));
    pthread_mutex_lock(&c->mu);
    atomic_fetch_sub(&c->nactive, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}
