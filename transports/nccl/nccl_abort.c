/*
 * nccl_abort.c — aborting the NCCL communicator without blocking the loop,
 * and publishing error completions only once the GPU work is quiesced.
 *
 * Design notes
 *  - abort (loop; the core calls it for every fault and for
 *    collie_comm_abort) marks the comm dead (no NCCL call after this),
 *    finishes the works whose end event has completed (their results are
 *    good), claims every other pending work the core has started
 *    (work_claim: nobody else can finish it now) into the batch, after the
 *    root of a fault if there is one, and starts a helper thread. The
 *    helper stops the GPU kernels and waits, bounded, for the internal
 *    stream to drain; then it publishes the batch: the root with its own
 *    status, the others with the abort's status and reason. The user may
 *    free the buffers once a completion is visible.
 *  - How the kernels stop: a communicator that was ready is revoked
 *    (ncclCommRevoke, NCCL 2.28+, looked up at run time: nccl_shrink.c) and
 *    polled until quiescent; it is kept (`revoked`) so that a shrink of the
 *    comm can build from it (ncclCommShrink), and released (ncclCommAbort
 *    off the loop) by destroy, or once the last shrunk comm still building
 *    from it lets go (shrink_users), or by the helper itself when destroy
 *    came before the quiesce. Without the symbol, a communicator still in
 *    init, a revoke NCCL refuses or one not quiescent within the bound:
 *    ncclCommAbort, as before 2.28 (the comm then shrinks by a fresh init).
 *  - The bound (COLLIE_NCCL_ABORT_TIMEOUT_MS, 10 s): the poll hook stays on
 *    while the batch waits; past the bound it logs an error and publishes
 *    the batch itself, each message saying the GPU may still use the
 *    buffers, so no wait ever hangs on a wedged abort. The helper then
 *    only logs when (if) the abort returns.
 *  - Works the core has not started yet when the abort comes ("late": a
 *    post racing with the abort) are claimed by the poll hook once started,
 *    into the batch, or published at once if the batch is already out.
 *  - A work the core asks us to end (cancel, loop: its deadline passed,
 *    collie_work_cancel, a waiter past its deadline) is claimed here and
 *    kept on the pending list: the abort that follows puts it in the batch
 *    with the cancel's status (ETIMEDOUT) and message; canceled while an
 *    abort quiesces, it joins the batch; canceled once the batch is out (or
 *    after its GPU work ended), it is published at once, with the overrun
 *    note if not quiesced.
 *  - Exactly one of helper, poll hook and destroy takes the batch
 *    (batch_taken, under mu): it moves the list (cl_list, batch_node) out
 *    of nc->batch under mu and then owns it, unlinking each work before it
 *    publishes it (a published work may retire at once); batch_published
 *    is set once its works are published. Once destroy has begun (it may
 *    come right after abort, when the engine shuts down) the helper leaves
 *    the batch to it: destroy waits, bounded, for the quiesce and
 *    publishes on the loop, so no core call is made from a helper after
 *    destroy returns.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transports/nccl/nccl_backend.h"

typedef struct nccl_abort_arg {
    cl_nccl_comm *nc;
    ncclComm_t comm;
    bool publish; /* false: only release the communicator (destroy when idle) */
    bool revoke;  /* ncclCommRevoke it (kept for a shrink), not ncclCommAbort */
} nccl_abort_arg;

static const char *const nccl_overrun_note =
    " (the NCCL abort did not finish within the abort bound: the GPU may still be using this "
    "work's buffers)";

/* Publish a batch taken under mu (emptying it). `root` (the fault's root,
 * or NULL) gets its own status; abort_status/abort_reason never change
 * once set. */
static void nccl_publish(cl_nccl_comm *nc, cl_list *batch, const cl_nccl_work *root, bool overrun) {
    cl_nccl_work *nw;
    while ((nw = cl_list_first(batch, cl_nccl_work, batch_node))) {
        cl_list_remove(&nw->batch_node); /* nw may retire (and be freed) once published */
        bool is_root = nw == root;
        int status = nw->canceled ? nw->cancel_status
                     : is_root    ? nc->root_status
                                  : nc->abort_status;
        const char *msg = nw->canceled ? nw->cancel_msg : is_root ? nc->root_msg : nc->abort_reason;
        nc->core->work_publish(nw->w, status, "%s%s", msg, overrun ? nccl_overrun_note : "");
    }
}

/* Has the GPU finished this work (its end event completed)? (mu) */
static bool nccl_gpu_done_locked(const cl_nccl_comm *nc, cl_nccl_work *nw) {
    if (nw == nc->root || nw->state != NCCL_W_LAUNCHED || nw->record_err != cudaSuccess)
        return false;
    if (!nw->gpu_done) nw->gpu_done = cudaEventQuery(nw->end_ev) == cudaSuccess;
    return nw->gpu_done;
}

/* Take the batch (mu) into `out` (left empty if it was taken already);
 * *root is the fault's root among it. */
static void nccl_take_batch_locked(cl_nccl_comm *nc, cl_list *out, const cl_nccl_work **root) {
    cl_list_init(out);
    *root = NULL;
    if (nc->batch_taken) return;
    nc->batch_taken = true;
    cl_list_move_all(out, &nc->batch);
    *root = nc->root;
}

static void nccl_published(cl_nccl_comm *nc) {
    pthread_mutex_lock(&nc->mu);
    nc->batch_published = true;
    pthread_cond_broadcast(&nc->cv);
    pthread_mutex_unlock(&nc->mu);
}

static void nccl_sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ncclCommRevoke, then poll until quiescent (bounded): true if it is, the
 * communicator kept; false: it still needs ncclCommAbort (said why). */
static bool nccl_revoke(cl_nccl_comm *nc, ncclComm_t comm, int64_t bound) {
    cl_nccl_revoke_fn revoke = cl_nccl_sym_revoke(nc->core);
    ncclResult_t r = revoke ? revoke(comm, NCCL_REVOKE_DEFAULT) : ncclInvalidUsage;
    ncclResult_t st = r;
    if (r == ncclSuccess || r == ncclInProgress)
        while ((r = ncclCommGetAsyncError(comm, &st)) == ncclSuccess && st == ncclInProgress &&
               cl_nccl_now_ns() < bound)
            nccl_sleep_ms(1);
    if (r == ncclSuccess && st == ncclSuccess) return true;
    char err[300];
    nc->core->log(2, NCCL_MOD, "rank %d: ncclCommRevoke: %s; ncclCommAbort instead", nc->rank,
                  r != ncclSuccess       ? cl_nccl_strerror(r, comm, err, sizeof err)
                  : st == ncclInProgress ? "not quiescent within the abort bound"
                                         : cl_nccl_strerror(st, comm, err, sizeof err));
    return false;
}

static void *nccl_abort_main(void *arg) {
    nccl_abort_arg *aa = arg;
    cl_nccl_comm *nc = aa->nc;
    const collie_core_services *core = nc->core;
    pthread_mutex_lock(&nc->mu);
    cudaStream_t stream = nc->stream;
    int dev = nc->dev;
    int64_t start = aa->publish ? nc->abort_start_ns : cl_nccl_now_ns();
    pthread_mutex_unlock(&nc->mu);
    int64_t bound = start + (int64_t)nc->abort_timeout_ms * 1000000;
    cudaSetDevice(dev);
    bool kept = aa->comm && aa->revoke && nccl_revoke(nc, aa->comm, bound);
    if (aa->comm && !kept) {
        ncclResult_t r = ncclCommAbort(aa->comm);
        if (r != ncclSuccess && r != ncclInProgress)
            core->log(1, NCCL_MOD, "rank %d: ncclCommAbort: %s", nc->rank, ncclGetErrorString(r));
    }
    /* NCCL's kernels are gone; what is left on the internal stream drains */
    while (aa->publish && stream && cudaStreamQuery(stream) == cudaErrorNotReady &&
           cl_nccl_now_ns() < bound)
        nccl_sleep_ms(1);
    int64_t took_ms = (cl_nccl_now_ns() - start) / 1000000;
    if (took_ms > nc->abort_timeout_ms)
        core->log(0, NCCL_MOD, "rank %d: the NCCL abort took %lld ms (bound %d ms)", nc->rank,
                  (long long)took_ms, (int)nc->abort_timeout_ms);
    else
        core->log(3, NCCL_MOD, "rank %d: NCCL communicator aborted in %lld ms", nc->rank,
                  (long long)took_ms);
    bool late = false; /* kept, but destroy has been: nobody takes it now */
    if (aa->publish) {
        pthread_mutex_lock(&nc->mu);
        late = kept && nc->destroyed;
        if (kept && !late) nc->revoked = aa->comm; /* a shrink may build from it */
        nc->abort_done = true;
        pthread_cond_broadcast(&nc->cv);
        bool mine = !nc->batch_taken && !nc->destroying; /* destroy publishes on the loop */
        const cl_nccl_work *root = NULL;
        cl_list batch;
        cl_list_init(&batch);
        if (mine) nccl_take_batch_locked(nc, &batch, &root);
        pthread_mutex_unlock(&nc->mu);
        if (mine) {
            nccl_publish(nc, &batch, root, false);
            nccl_published(nc);
        }
    }
    if (late) ncclCommAbort(aa->comm);
    free(aa);
    cl_nccl_release(nc);
    return NULL;
}

static int nccl_helper_start(cl_nccl_comm *nc, ncclComm_t comm, bool publish, bool revoke) {
    nccl_abort_arg *aa = malloc(sizeof *aa);
    if (!aa) return ENOMEM;
    aa->nc = nc;
    aa->comm = comm;
    aa->publish = publish;
    aa->revoke = revoke;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    cl_nccl_hold(nc);
    pthread_t t;
    int e = pthread_create(&t, &at, nccl_abort_main, aa);
    pthread_attr_destroy(&at);
    if (e != 0) {
        free(aa);
        cl_nccl_release(nc);
    }
    return e;
}

void cl_nccl_abort(void *state, int status, const char *reason) {
    cl_nccl_comm *nc = state;
    bool can_revoke = cl_nccl_sym_revoke(nc->core) != NULL; /* resolved outside the lock */
    pthread_mutex_lock(&nc->mu);
    if (nc->aborting || nc->destroyed) {
        pthread_mutex_unlock(&nc->mu);
        return;
    }
    /* a communicator that was ready is revoked (kept for a shrink) */
    bool revoke = can_revoke && nc->phase == NCCL_READY && nc->comm;
    nc->aborting = true;
    nc->abort_status = status;
    snprintf(nc->abort_reason, sizeof nc->abort_reason, "%s", reason ? reason : "aborted");
    nc->abort_start_ns = cl_nccl_now_ns();
    nc->phase = NCCL_DEAD;
    if (nc->root && nc->root->claimed) cl_list_push_back(&nc->batch, &nc->root->batch_node);
    size_t claimed = 0, ndone = 0;
    collie_work *done[64];
    cl_nccl_work *nw;
    cl_list_foreach(&nc->pending, nw, cl_nccl_work, node) {
        if (nw->canceled) { /* canceled: quiesced with the others */
            if (nw != nc->root) {
                cl_list_push_back(&nc->batch, &nw->batch_node);
                claimed++;
            }
            continue;
        }
        if (nw->finished || nw->claimed) continue;
        bool active = cl_nccl_work_active(nc->core, nw->w);
        if (active && ndone < 64 && nccl_gpu_done_locked(nc, nw)) {
            nw->finished = true; /* it made it: its result is good */
            done[ndone++] = nw->w;
        } else if (active && nc->core->work_claim(nw->w)) {
            nw->claimed = nw->finished = true;
            cl_list_push_back(&nc->batch, &nw->batch_node);
            claimed++;
        } else if (nc->core->work_test(nw->w)) {
            nw->finished = true; /* ended already (deadline, cancel) */
        } else {
            /* judged now: once the abort has drained the stream, a completed
             * end event no longer means the work made it */
            nccl_gpu_done_locked(nc, nw);
            nw->late = true;
        }
    }
    ncclComm_t comm = nc->comm;
    nc->comm = NULL;
    collie_work *req = nc->store_req; /* its callback sees the cancel and stops */
    nc->poll_hint = true;
    pthread_mutex_unlock(&nc->mu);

    for (size_t i = 0; i < ndone; i++)
        nc->core->work_finish(done[i], COLLIE_OK, NULL);
    if (req) nc->core->work_cancel(req);
    size_t failing = claimed + (nc->root && nc->root->claimed);
    /* an idle comm being destroyed is routine; failing works are not */
    NCCL_LOG(nc, failing ? 1 : 3, "aborting the NCCL communicator (%zu works): %s", failing,
             nc->abort_reason);
    int e = nccl_helper_start(nc, comm, true, revoke);
    if (e != 0) { /* cannot quiesce without blocking the loop: leak the comm, say so */
        nc->core->log(0, NCCL_MOD, "rank %d: cannot start the NCCL abort thread: %s", nc->rank,
                      strerror(e));
        const cl_nccl_work *root;
        cl_list batch;
        pthread_mutex_lock(&nc->mu);
        nccl_take_batch_locked(nc, &batch, &root);
        pthread_mutex_unlock(&nc->mu);
        nccl_publish(nc, &batch, root, true);
        nccl_published(nc);
    }
    nc->core->want_poll(nc->bc, true, nc->poll_us); /* watch the bound */
}

void cl_nccl_cancel(void *state, collie_work *w, int status, const char *msg) {
    cl_nccl_comm *nc = state;
    cl_nccl_work *nw = nc->core->work_backend_data(w);
    bool now = false, overrun = false;
    pthread_mutex_lock(&nc->mu);
    /* ours already (an abort's batch, a completion), or ended meanwhile */
    if (nw->claimed || !nc->core->work_claim(w)) {
        pthread_mutex_unlock(&nc->mu);
        return;
    }
    nw->claimed = nw->finished = true;
    nw->late = false; /* the abort's late path must not claim it again */
    nw->cancel_status = status;
    snprintf(nw->cancel_msg, sizeof nw->cancel_msg, "%s", msg ? msg : "deadline passed");
    /* `canceled` marks the ones an abort batch publishes; the others are
     * published here, and the abort coming next must skip them */
    if (!cl_list_linked(&nw->node) || nccl_gpu_done_locked(nc, nw)) {
        now = true; /* the GPU is done with it: nothing to wait for */
    } else if (nc->aborting && !nc->batch_taken) {
        nw->canceled = true; /* the abort is quiescing: join its batch */
        cl_list_push_front(&nc->batch, &nw->batch_node);
    } else if (nc->aborting) {
        now = true; /* the batch is out: quiesced, or past the bound */
        overrun = !nc->abort_done;
    } else {
        nw->canceled = true; /* the abort that follows (fault or the core) batches it */
    }
    pthread_mutex_unlock(&nc->mu);
    if (now)
        nc->core->work_publish(w, status, "%s%s", nw->cancel_msg, overrun ? nccl_overrun_note : "");
}

void cl_nccl_abort_poll(cl_nccl_comm *nc) {
    cl_list late, overrun; /* claimed after the batch was taken; the batch, past the bound */
    cl_list_init(&late);
    cl_list_init(&overrun);
    const cl_nccl_work *root = NULL, *late_root;
    collie_work *done[64];
    size_t ndone = 0;
    bool overran = false;
    pthread_mutex_lock(&nc->mu);
    cl_nccl_work *nw;
    cl_list_foreach(&nc->pending, nw, cl_nccl_work, node) {
        if (!nw->late) continue;
        if (nc->core->work_test(nw->w)) {
            nw->late = false;
            nw->finished = true;
            continue;
        }
        if (!cl_nccl_work_active(nc->core, nw->w)) continue; /* still not started */
        if (nw->gpu_done) { /* it had made it when the abort came */
            if (ndone == 64) continue;
            nw->late = false;
            nw->finished = true;
            done[ndone++] = nw->w;
            continue;
        }
        nw->late = false;
        nw->finished = true;
        if (!nc->core->work_claim(nw->w)) continue;
        nw->claimed = true;
        if (!nc->batch_taken) /* it waits for the quiesce with the others */
            cl_list_push_front(&nc->batch, &nw->batch_node);
        else
            cl_list_push_back(&late, &nw->batch_node);
    }
    late_root = nc->root;
    if (!nc->batch_taken &&
        cl_nccl_now_ns() - nc->abort_start_ns > (int64_t)nc->abort_timeout_ms * 1000000) {
        overran = true;
        nccl_take_batch_locked(nc, &overrun, &root);
    }
    bool need = cl_nccl_poll_needed_locked(nc);
    if (!need) nc->poll_hint = false;
    bool quiesced = nc->abort_done;
    pthread_mutex_unlock(&nc->mu);

    for (size_t i = 0; i < ndone; i++)
        nc->core->work_finish(done[i], COLLIE_OK, NULL);
    if (overran) {
        NCCL_LOG(nc, 0,
                 "the NCCL abort has not finished after %d ms; failing "
                 "the works anyway (their buffers may still be in use by the GPU)",
                 (int)nc->abort_timeout_ms);
        nccl_publish(nc, &overrun, root, true);
        nccl_published(nc);
    }
    nccl_publish(nc, &late, late_root, !quiesced);
    if (!need) nc->core->want_poll(nc->bc, false, 0);
}

void cl_nccl_abort_finish_for_destroy(cl_nccl_comm *nc) {
    pthread_mutex_lock(&nc->mu);
    if (!nc->aborting) {
        pthread_mutex_unlock(&nc->mu);
        return;
    }
    nc->destroying = true;
    int64_t until = nc->abort_start_ns + (int64_t)nc->abort_timeout_ms * 1000000;
    struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
    while (!nc->abort_done && !nc->batch_taken && cl_nccl_now_ns() < until)
        pthread_cond_timedwait(&nc->cv, &nc->mu, &ts);
    /* the helper may have taken the batch just before: its publishing is quick */
    until = cl_nccl_now_ns() + 2000000000LL;
    ts = (struct timespec){.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
    while (nc->batch_taken && !nc->batch_published && cl_nccl_now_ns() < until)
        pthread_cond_timedwait(&nc->cv, &nc->mu, &ts);
    bool mine = !nc->batch_taken, overran = !nc->abort_done;
    const cl_nccl_work *root;
    cl_list batch;
    nccl_take_batch_locked(nc, &batch, &root);
    pthread_mutex_unlock(&nc->mu);
    if (!mine) return;
    if (overran) NCCL_LOG(nc, 0, "destroyed while the NCCL abort is still running");
    nccl_publish(nc, &batch, root, overran);
    nccl_published(nc);
}

void cl_nccl_comm_release_async(cl_nccl_comm *nc, ncclComm_t comm) {
    if (nccl_helper_start(nc, comm, false, false) == 0) return;
    cudaSetDevice(nc->dev); /* no thread: release it here (idle, so quick) */
    ncclCommAbort(comm);
}
