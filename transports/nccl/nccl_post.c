/*
 * nccl_post.c — posting on the caller's thread: the NCCL calls, launching
 * after ncclInProgress, wait_stream.
 *
 * Design notes
 *  - start runs on the posting thread (COLLIE_BACKEND_POST_ON_CALLER), in
 *    sequence order (the core holds the comm's lock), and takes this comm's
 *    mutex against the loop's poll/abort and other posters: the internal
 *    stream waits on an event recorded on the user's stream, the NCCL call
 *    runs on the internal stream, an end event is recorded after it, and
 *    the work joins the pending list (post order = stream order).
 *  - Non-blocking communicator: a call may return ncclInProgress. Then no
 *    other NCCL call may be made until ncclCommGetAsyncError says
 *    ncclSuccess, and no end event may be recorded before it. Such a work
 *    stays queued; later posts queue behind it; the poll hook (or a
 *    wait_stream that needs it) finishes launching them in order.
 *  - alltoall, gather, scatter, allgatherv and alltoallv are grouped
 *    ncclSend/ncclRecv (every NCCL since 2.7 has them; NCCL has no v
 *    collectives); barrier is an allreduce of one float of the
 *    comm's scratch buffer. send/recv are matched by NCCL in post order per
 *    peer: the tag is not used for matching on this backend.
 *  - CUDA graph capture is refused (COLLIE_ENOTSUP): a captured collective
 *    would run at every replay with no work to track it, out of the
 *    watchdog's sight.
 *  - A refused post leaves no work; the reason goes to the caller's
 *    collie_last_error() (core->set_error) and the log (warning).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/nccl/nccl_backend.h"

#define NCCL_WAIT_STREAM_LAUNCH_MS 1000

static const ncclDataType_t nccl_dtypes[COLLIE_NUM_DTYPES] = {
    [COLLIE_INT8] = ncclInt8,    [COLLIE_UINT8] = ncclUint8,  [COLLIE_INT32] = ncclInt32,
    [COLLIE_INT64] = ncclInt64,  [COLLIE_FP16] = ncclFloat16, [COLLIE_BF16] = ncclBfloat16,
    [COLLIE_FP32] = ncclFloat32, [COLLIE_FP64] = ncclFloat64,
};

static const ncclRedOp_t nccl_redops[COLLIE_NUM_REDOPS] = {
    [COLLIE_SUM] = ncclSum, [COLLIE_PROD] = ncclProd, [COLLIE_MIN] = ncclMin,
    [COLLIE_MAX] = ncclMax, [COLLIE_AVG] = ncclAvg,
};

/* ---- events ----------------------------------------------------------------------- */

static cudaError_t nccl_event_get_locked(cl_nccl_comm *nc, cudaEvent_t *ev) {
    if (nc->npool > 0) {
        *ev = nc->pool[--nc->npool];
        return cudaSuccess;
    }
    return cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
}

/* An event whose last record completed goes back to the pool; any other is
 * destroyed (CUDA frees it once its pending work is done). */
void cl_nccl_event_put_locked(cl_nccl_comm *nc, cudaEvent_t ev, bool reusable) {
    if (!ev) return;
    if (reusable && nc->npool == nc->cappool) {
        size_t cap = nc->cappool ? nc->cappool * 2 : 16;
        cudaEvent_t *p = cap <= 1024 ? realloc(nc->pool, cap * sizeof *p) : NULL;
        if (p) {
            nc->pool = p;
            nc->cappool = cap;
        }
    }
    if (reusable && nc->npool < nc->cappool)
        nc->pool[nc->npool++] = ev;
    else
        cudaEventDestroy(ev);
}

/* ---- the NCCL calls ----------------------------------------------------------------- */

/* One peer's part of allgatherv or alltoallv: blocks of 0 elements are no
 * call on either side (both agree on the count); allgatherv in place skips
 * the copy to itself. */
static ncclResult_t nccl_v_peer(cl_nccl_comm *nc, const collie_coll_args *a, ncclDataType_t dt,
                                int p) {
    size_t es = nc->core->dtype_size(a->dtype), me = (size_t)nc->rank;
    const char *s = a->sendbuf;
    char *r = a->recvbuf;
    ncclResult_t res = ncclSuccess;
    size_t scount = a->kind == COLLIE_COLL_ALLGATHERV ? a->recvcounts[me] : a->sendcounts[p];
    const char *sfrom = a->kind == COLLIE_COLL_ALLGATHERV ? s : s + a->sdispls[p] * es;
    char *rto = r + a->rdispls[p] * es;
    if ((size_t)p == me && sfrom == rto) return ncclSuccess; /* in place */
    if (scount) res = ncclSend(sfrom, scount, dt, p, nc->comm, nc->stream);
    if (res == ncclSuccess && a->recvcounts[p])
        res = ncclRecv(rto, a->recvcounts[p], dt, p, nc->comm, nc->stream);
    return res;
}

static ncclResult_t nccl_group_p2p(cl_nccl_comm *nc, const collie_coll_args *a, ncclDataType_t dt,
                                   size_t blk) {
    const char *s = a->sendbuf;
    char *r = a->recvbuf;
    ncclComm_t c = nc->comm;
    cudaStream_t st = nc->stream;
    ncclResult_t res = ncclGroupStart();
    for (int p = 0; res == ncclSuccess && p < nc->size; p++) {
        switch (a->kind) {
        case COLLIE_COLL_ALLGATHERV:
        case COLLIE_COLL_ALLTOALLV: res = nccl_v_peer(nc, a, dt, p); break;
        case COLLIE_COLL_ALLTOALL:
            res = ncclSend(s + (size_t)p * blk, a->count, dt, p, c, st);
            if (res == ncclSuccess) res = ncclRecv(r + (size_t)p * blk, a->count, dt, p, c, st);
            break;
        case COLLIE_COLL_GATHER:
            if (p == a->root) res = ncclSend(s, a->count, dt, p, c, st);
            if (res == ncclSuccess && nc->rank == a->root)
                res = ncclRecv(r + (size_t)p * blk, a->count, dt, p, c, st);
            break;
        default: /* scatter */
            if (nc->rank == a->root) res = ncclSend(s + (size_t)p * blk, a->count, dt, p, c, st);
            if (res == ncclSuccess && p == a->root) res = ncclRecv(r, a->count, dt, p, c, st);
            break;
        }
    }
    ncclResult_t end = ncclGroupEnd(); /* always close the group */
    return res != ncclSuccess ? res : end;
}

static ncclResult_t nccl_issue(cl_nccl_comm *nc, const collie_coll_args *a) {
    ncclDataType_t dt = nccl_dtypes[a->kind == COLLIE_COLL_BARRIER ? COLLIE_FP32 : a->dtype];
    ncclRedOp_t op = a->op < COLLIE_NUM_REDOPS ? nccl_redops[a->op] : ncclSum;
    size_t blk = a->count * nc->core->dtype_size(a->dtype);
    ncclComm_t c = nc->comm;
    cudaStream_t st = nc->stream;
    switch (a->kind) {
    case COLLIE_COLL_ALLREDUCE:
        return ncclAllReduce(a->sendbuf, a->recvbuf, a->count, dt, op, c, st);
    case COLLIE_COLL_BROADCAST:
        return ncclBroadcast(a->sendbuf, a->recvbuf, a->count, dt, a->root, c, st);
    case COLLIE_COLL_REDUCE:
        return ncclReduce(a->sendbuf, a->recvbuf, a->count, dt, op, a->root, c, st);
    case COLLIE_COLL_ALLGATHER: return ncclAllGather(a->sendbuf, a->recvbuf, a->count, dt, c, st);
    case COLLIE_COLL_REDUCE_SCATTER:
        return ncclReduceScatter(a->sendbuf, a->recvbuf, a->count, dt, op, c, st);
    case COLLIE_COLL_BARRIER:
        return ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat32, ncclSum, c, st);
    case COLLIE_COLL_SEND: return ncclSend(a->sendbuf, a->count, dt, a->peer, c, st);
    case COLLIE_COLL_RECV: return ncclRecv(a->recvbuf, a->count, dt, a->peer, c, st);
    default: return nccl_group_p2p(nc, a, dt, blk);
    }
}

/* Record the end event of a work NCCL has enqueued. */
static void nccl_launched_locked(cl_nccl_comm *nc, cl_nccl_work *nw) {
    nw->state = NCCL_W_LAUNCHED;
    nw->record_err = cudaEventRecord(nw->end_ev, nc->stream); /* poll faults on an error */
}

/* Issue queued works in order until one is in progress. A work NCCL
 * refuses now was accepted at post time: it keeps the error (issue_err) and
 * the poll hook turns it into a comm fault; nothing after it is issued. */
static void nccl_issue_queued_locked(cl_nccl_comm *nc) {
    cl_nccl_work *nw;
    cl_list_foreach(&nc->pending, nw, cl_nccl_work, node) {
        if (nc->nccl_inprogress) return;
        if (nw->state != NCCL_W_QUEUED) continue;
        if (nw->issue_err != ncclSuccess) return;
        ncclResult_t r = nccl_issue(nc, &nw->args);
        if (r == ncclInProgress) {
            nw->state = NCCL_W_LAUNCHING;
            nc->nccl_inprogress = true;
        } else if (r == ncclSuccess) {
            nccl_launched_locked(nc, nw);
        } else {
            nw->issue_err = r;
            return;
        }
    }
}

void cl_nccl_launch_progress_locked(cl_nccl_comm *nc) {
    if (!nc->nccl_inprogress || nc->phase != NCCL_READY) return;
    ncclResult_t st = ncclSuccess;
    if (ncclCommGetAsyncError(nc->comm, &st) != ncclSuccess || st != ncclSuccess)
        return; /* still in progress, or an error the poll hook reports */
    nc->nccl_inprogress = false;
    cl_nccl_work *nw;
    cl_list_foreach(&nc->pending, nw, cl_nccl_work, node) if (nw->state == NCCL_W_LAUNCHING)
        nccl_launched_locked(nc, nw);
    nccl_issue_queued_locked(nc);
}

/* ---- start ----------------------------------------------------------------------------- */

/* Refuse a post (caller's thread): say why in the caller's collie_last_error
 * and the log. */
static int nccl_refuse(cl_nccl_comm *nc, const collie_coll_args *a, int status, const char *why) {
    nc->core->set_error("%s: backend nccl refused it: %s", collie_coll_kind_name(a->kind), why);
    NCCL_LOG(nc, 1, "%s refused: %s", collie_coll_kind_name(a->kind), why);
    return status;
}

int cl_nccl_start(void *state, collie_work *w, const collie_coll_args *a) {
    cl_nccl_comm *nc = state;
    cl_nccl_work *nw = nc->core->work_backend_data(w);
    memset(nw, 0, sizeof *nw); /* a refused post never reaches detach */
    nw->w = w;
    nw->nc = nc;
    nw->args = *a;
    cudaStream_t us = (cudaStream_t)a->stream;
    char why[400];

    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t ce = cudaStreamIsCapturing(us, &cap);
    if (ce != cudaSuccess) {
        snprintf(why, sizeof why, "cudaStreamIsCapturing: %s", cudaGetErrorString(ce));
        return nccl_refuse(nc, a, COLLIE_EBACKEND, why);
    }
    if (cap != cudaStreamCaptureStatusNone)
        return nccl_refuse(nc, a, COLLIE_ENOTSUP,
                           "the stream is being captured into a CUDA graph: the nccl backend "
                           "does not support graph capture (a replayed collective would run "
                           "outside the watchdog)");

    int prev_dev = -1;
    int status = COLLIE_OK;
    pthread_mutex_lock(&nc->mu);
    if (nc->phase != NCCL_READY || nc->aborting) {
        pthread_mutex_unlock(&nc->mu);
        return nccl_refuse(nc, a, COLLIE_EABORTED, "the NCCL communicator is not usable");
    }
    if (cudaGetDevice(&prev_dev) == cudaSuccess && prev_dev != nc->dev) cudaSetDevice(nc->dev);
    if ((ce = nccl_event_get_locked(nc, &nw->start_ev)) != cudaSuccess ||
        (ce = nccl_event_get_locked(nc, &nw->end_ev)) != cudaSuccess ||
        (ce = cudaEventRecord(nw->start_ev, us)) != cudaSuccess ||
        (ce = cudaStreamWaitEvent(nc->stream, nw->start_ev, 0)) != cudaSuccess) {
        snprintf(why, sizeof why, "ordering after the user's stream: %s", cudaGetErrorString(ce));
        status = COLLIE_EBACKEND;
    } else {
        /* behind a call in progress it waits its turn; otherwise NCCL now */
        ncclResult_t r = nc->nccl_inprogress ? ncclSuccess : nccl_issue(nc, &nw->args);
        if (r != ncclSuccess && r != ncclInProgress) {
            char err[300];
            snprintf(why, sizeof why, "%s", cl_nccl_strerror(r, nc->comm, err, sizeof err));
            status = COLLIE_EBACKEND;
        } else {
            if (nc->nccl_inprogress) {
                nw->state = NCCL_W_QUEUED;
            } else if (r == ncclInProgress) {
                nw->state = NCCL_W_LAUNCHING;
                nc->nccl_inprogress = true;
            } else {
                nccl_launched_locked(nc, nw);
            }
            cl_list_push_back(&nc->pending, &nw->node);
        }
    }
    if (status != COLLIE_OK) {
        cl_nccl_event_put_locked(nc, nw->start_ev, false);
        cl_nccl_event_put_locked(nc, nw->end_ev, true);
        nw->start_ev = nw->end_ev = NULL;
    }
    bool want = status == COLLIE_OK && !nc->poll_hint;
    if (want) nc->poll_hint = true;
    if (prev_dev >= 0 && prev_dev != nc->dev) cudaSetDevice(prev_dev);
    pthread_mutex_unlock(&nc->mu);
    if (status != COLLIE_OK) return nccl_refuse(nc, a, status, why);
    if (want) nc->core->want_poll(nc->bc, true, nc->poll_us);
    return COLLIE_OK;
}

/* ---- wait_stream -------------------------------------------------------------------- */

int cl_nccl_wait_stream(void *state, collie_work *w, void *stream) {
    cl_nccl_comm *nc = state;
    cl_nccl_work *nw = nc->core->work_backend_data(w);
    int64_t give_up = cl_nccl_now_ns() + (int64_t)NCCL_WAIT_STREAM_LAUNCH_MS * 1000000;
    for (;;) {
        pthread_mutex_lock(&nc->mu);
        if (!cl_list_linked(&nw->node) || nw->gpu_done || nc->core->work_test(w) || nc->aborting) {
            pthread_mutex_unlock(&nc->mu);
            /* done on the GPU (nothing to wait for) or ended with an error */
            int st = nc->core->work_result(w);
            if (st == COLLIE_OK || (st == COLLIE_INPROGRESS && nw->gpu_done)) return COLLIE_OK;
            return st == COLLIE_INPROGRESS ? COLLIE_EABORTED : st;
        }
        cl_nccl_launch_progress_locked(nc);
        if (nw->state == NCCL_W_LAUNCHED) {
            cudaError_t ce = cudaStreamWaitEvent((cudaStream_t)stream, nw->end_ev, 0);
            pthread_mutex_unlock(&nc->mu);
            if (ce == cudaSuccess) return COLLIE_OK;
            nc->core->log(1, NCCL_MOD, "wait_stream: cudaStreamWaitEvent: %s",
                          cudaGetErrorString(ce));
            return COLLIE_EBACKEND;
        }
        pthread_mutex_unlock(&nc->mu);
        if (cl_nccl_now_ns() > give_up) {
            nc->core->log(1, NCCL_MOD,
                          "wait_stream: NCCL is still enqueueing %s seq %llu after %d ms",
                          collie_coll_kind_name(nw->args.kind),
                          (unsigned long long)nc->core->work_seq(w), NCCL_WAIT_STREAM_LAUNCH_MS);
            return COLLIE_EBACKEND;
        }
        sched_yield();
    }
}
