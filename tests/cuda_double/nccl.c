/*
 * nccl.c — the CPU double of the NCCL calls collie's NCCL plugin makes
 * (tests only; built as libnccl.so.2, linked against the double's
 * libcudart.so.13). This file is the ranks of one process; nccl_proc.c
 * bridges ranks of other processes into them (its Design notes).
 *
 * Design notes
 *  - A clique is every comm made with one ncclUniqueId (a process-global
 *    list). Non-blocking init (config.blocking = 0) returns ncclInProgress;
 *    ncclCommGetAsyncError says ncclSuccess once every rank has joined.
 *  - A call becomes an op run on the given stream's worker thread (stream
 *    order). Collectives meet in a room of the clique keyed by the comm's
 *    collective sequence number (every rank calls in the same order): the
 *    last rank to arrive computes every rank's output from the others'
 *    buffers while they wait, then each rank copies its own part out.
 *    Send/recv groups post their sends as messages of the clique and take
 *    their receives in post order per peer (NCCL's matching), so a group
 *    never deadlocks on itself.
 *  - Faults (double.h switches) are decided when the call is made and act
 *    when the op runs: a hung op waits for ncclCommAbort; an async error
 *    sets the comm's error and then hangs; a slow op sleeps first.
 *  - ncclCommAbort stops the comm's running ops (they leave without touching
 *    the buffers again) and returns once none runs: the quiesce the plugin
 *    waits for. A rank that aborts makes peers waiting for it see
 *    ncclRemoteError, as a network transport would.
 *  - ncclCommRevoke (NCCL 2.28) stops them the same way but keeps the comm:
 *    it refuses new calls, reports ncclInProgress until its ops have left
 *    (after CLTEST_NCCL_ABORT_SLOW_MS, as an abort), then ncclSuccess, and
 *    may still shrink; its ncclCommAbort later is a release (neither
 *    counted nor slowed down again). Revoke counts as an abort in the
 *    counters (started at the call, done at the quiesce). A comm whose
 *    ranks span processes refuses it (the plugin then aborts).
 *  - ncclCommShrink (NCCL 2.27) is a split that only the survivors make
 *    (colour 0, key = parent rank), complete once the last of them calls;
 *    the calls (flags, sorted excluded list) are recorded for the tests.
 *    Built with CLTEST_NCCL_OLD (build/tests/cuda_double/old), neither
 *    symbol exists: an NCCL before 2.27.
 *  - ncclCommSplit is collective over the parent: each call is recorded in
 *    the parent clique's split of that sequence number; the last rank to
 *    call makes one clique per colour (ranks in (key, parent rank) order).
 *    Until then the parent reports ncclInProgress (and refuses calls), and
 *    each child is an unplaced comm whose init is in progress.
 *  - The clique of an id lives in the process that made it. A comm made in
 *    another process is remote (c->rm): its ops run through that process's
 *    hub, where a proxy member (c->proxy) runs them here, on copies. A rank
 *    whose process dies is marked ND_DIED, and its peers' errors say so.
 *  - CLTEST_CUDA_CRASH kills the calling process (SIGKILL) when the op
 *    starts to run: a rank process dying mid-op.
 *  - One mutex and one condition variable (monotonic clock) for everything.
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "collie.h"
#include "tests/cuda_double/double.h"
#include "tests/cuda_double/nccl_double.h"
#include "transports/reduce.h"

const char *const dbl_kind_names[K_NUM] = {"allreduce",      "broadcast", "reduce", "allgather",
                                           "reduce_scatter", "p2p",       "send",   "recv"};

static pthread_mutex_t nd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t nd_cv;
static pthread_once_t nd_once = PTHREAD_ONCE_INIT;
static dbl_clique *nd_cliques;
static int nd_aborts_started, nd_aborts_done, nd_executing, nd_live_comms, nd_splits;
static int nd_shrinks, nd_revokes;
static _Thread_local int nd_group_depth;
static _Thread_local struct {
    ncclComm_t comm;
    cudaStream_t stream;
    dbl_item item;
} nd_group[256];
static _Thread_local int nd_group_n;
static _Thread_local ncclResult_t nd_group_err;
_Thread_local char nd_last_error[256];

static void nd_init(void) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&nd_cv, &ca);
    pthread_condattr_destroy(&ca);
}

void nd_lock(void) {
    pthread_once(&nd_once, nd_init);
    pthread_mutex_lock(&nd_mu);
}

void nd_unlock(void) { pthread_mutex_unlock(&nd_mu); }

void nd_broadcast_locked(void) { pthread_cond_broadcast(&nd_cv); }

void nd_wait_until(int64_t until_ns) {
    if (until_ns <= 0) {
        pthread_cond_wait(&nd_cv, &nd_mu);
        return;
    }
    struct timespec ts = {.tv_sec = until_ns / 1000000000LL, .tv_nsec = until_ns % 1000000000LL};
    pthread_cond_timedwait(&nd_cv, &nd_mu, &ts);
}

CLTEST_API int cltest_nccl_aborts_started(void);
CLTEST_API int cltest_nccl_aborts_done(void);
CLTEST_API int cltest_nccl_ops_executing(void);
CLTEST_API int cltest_nccl_live_comms(void);
CLTEST_API int cltest_nccl_splits(void);
CLTEST_API int cltest_nccl_shrinks(void);
CLTEST_API int cltest_nccl_revokes(void);
#define ND_STAT(name, var)                                                                         \
    CLTEST_API int name(void) {                                                                    \
        nd_lock();                                                                                 \
        int v = var;                                                                               \
        nd_unlock();                                                                               \
        return v;                                                                                  \
    }
ND_STAT(cltest_nccl_aborts_started, nd_aborts_started)
ND_STAT(cltest_nccl_aborts_done, nd_aborts_done)
ND_STAT(cltest_nccl_ops_executing, nd_executing)
ND_STAT(cltest_nccl_live_comms, nd_live_comms)
ND_STAT(cltest_nccl_splits, nd_splits)
ND_STAT(cltest_nccl_shrinks, nd_shrinks)
ND_STAT(cltest_nccl_revokes, nd_revokes)

/* Per rank (< ND_MAX_RANKS) of any comm: when its last ncclCommAbort
 * returned (CLOCK_MONOTONIC ns, 0: never), and the device its last
 * communicator was created on (-1: none). */
#define ND_MAX_RANKS 64
static int64_t nd_abort_done_ns[ND_MAX_RANKS];
static int nd_comm_dev1[ND_MAX_RANKS]; /* device + 1 */
CLTEST_API int64_t cltest_nccl_abort_done_ns(int rank);
CLTEST_API int cltest_nccl_comm_device(int rank);
CLTEST_API int64_t cltest_nccl_abort_done_ns(int rank) {
    if (rank < 0 || rank >= ND_MAX_RANKS) return 0;
    nd_lock();
    int64_t v = nd_abort_done_ns[rank];
    nd_unlock();
    return v;
}
CLTEST_API int cltest_nccl_comm_device(int rank) {
    if (rank < 0 || rank >= ND_MAX_RANKS) return -1;
    nd_lock();
    int v = nd_comm_dev1[rank] - 1;
    nd_unlock();
    return v;
}

/* Per parent rank: its last ncclCommShrink's flags and excluded list (as
 * NCCL got it: sorted by the call). */
static struct {
    int n, flags;
    int excl[ND_MAX_RANKS];
} nd_last_shrink[ND_MAX_RANKS];
/* cltest_nccl_last_shrink: rank's last shrink: the count of excluded ranks
 * (-1: none yet), its flags in *flags and the first `max` ranks in excl */
CLTEST_API int cltest_nccl_last_shrink(int rank, int *flags, int *excl, int max);
CLTEST_API int cltest_nccl_last_shrink(int rank, int *flags, int *excl, int max) {
    if (rank < 0 || rank >= ND_MAX_RANKS) return -1;
    nd_lock();
    int n = nd_last_shrink[rank].n;
    *flags = nd_last_shrink[rank].flags;
    for (int i = 0; i < n && i < max; i++)
        excl[i] = nd_last_shrink[rank].excl[i];
    nd_unlock();
    return n - 1; /* stored + 1: 0 is "never" */
}

/* ---- switches ---------------------------------------------------------------------- */

/* Does SPEC (see double.h) in variable `var` name the nth op of `kind` on `rank`? */
static bool nd_spec_match(const char *var, int kind, uint64_t nth, int rank) {
    const char *spec = getenv(var);
    if (!spec) return false;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@'), *hash = strchr(tok, '#');
        if (at) *at++ = '\0';
        if (hash) *hash++ = '\0';
        if (strcmp(tok, "*") != 0 && strcmp(tok, dbl_kind_names[kind]) != 0) continue;
        if (hash && strtoull(hash, NULL, 10) != nth) continue;
        if (at && atoi(at) != rank) continue;
        return true;
    }
    return false;
}

static ncclResult_t nd_async_code(void) {
    const char *c = getenv("CLTEST_CUDA_ASYNC_ERROR_CODE");
    if (!c || !strcmp(c, "system")) return ncclSystemError;
    if (!strcmp(c, "internal")) return ncclInternalError;
    if (!strcmp(c, "remote")) return ncclRemoteError;
    return ncclUnhandledCudaError;
}

/* ---- comms and cliques (nd_mu) ------------------------------------------------------- */

static void nd_split_free_locked(dbl_split *sp, int n);

void nd_comm_unref_locked(ncclComm_t c) {
    if (--c->refs > 0) return;
    dbl_clique *q = c->cq;
    int rank = c->rank;
    if (!c->proxy) nd_live_comms--;
    if (c->rm) nd_remote_free_locked(c);
    free(c->excluded_of);
    free(c);
    if (!q) return; /* a split child never placed */
    q->members[rank] = NULL;
    if (--q->refs > 0) return;
    while (q->splits) {
        dbl_split *sp = q->splits;
        q->splits = sp->next;
        nd_split_free_locked(sp, q->nranks);
    }
    for (dbl_clique **pp = &nd_cliques; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    while (q->rooms) {
        dbl_room *r = q->rooms;
        q->rooms = r->next;
        free(r->result);
        free(r);
    }
    while (q->msgs) {
        dbl_msg *m = q->msgs;
        q->msgs = m->next;
        free(m);
    }
    free(q->members);
    free(q->rank_aborted);
    free(q);
}

/* Fail the comm with an async error (the first one sticks). */
void nd_set_error_locked(ncclComm_t c, ncclResult_t e, const char *fmt, ...) {
    if (c->error != ncclSuccess) return;
    c->error = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
}

/* ---- collectives --------------------------------------------------------------------- */

static bool nd_dtype(ncclDataType_t dt, collie_dtype *out) {
    switch (dt) {
    case ncclInt8: *out = COLLIE_INT8; return true;
    case ncclUint8: *out = COLLIE_UINT8; return true;
    case ncclInt32: *out = COLLIE_INT32; return true;
    case ncclInt64: *out = COLLIE_INT64; return true;
    case ncclFloat16: *out = COLLIE_FP16; return true;
    case ncclBfloat16: *out = COLLIE_BF16; return true;
    case ncclFloat32: *out = COLLIE_FP32; return true;
    case ncclFloat64: *out = COLLIE_FP64; return true;
    default: return false;
    }
}

size_t nd_dsize(ncclDataType_t dt) {
    collie_dtype d;
    return nd_dtype(dt, &d) ? collie_dtype_size(d) : 0;
}

static collie_redop nd_redop(ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return COLLIE_PROD;
    case ncclMin: return COLLIE_MIN;
    case ncclMax: return COLLIE_MAX;
    case ncclAvg: return COLLIE_AVG;
    default: return COLLIE_SUM;
    }
}

/* The reduction of every rank's `count` elements at offset 0 of its send. */
static void *nd_reduce_all(dbl_room *r, int n, size_t count) {
    const dbl_item *a = r->slot[0];
    collie_dtype dt = COLLIE_FP32;
    nd_dtype(a->dt, &dt);
    size_t bytes = count * collie_dtype_size(dt);
    void *acc = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(acc, a->send, bytes);
    collie_redop op = nd_redop(a->op);
    for (int i = 1; i < n; i++)
        cl_reduce(acc, r->slot[i]->send, count, dt, op == COLLIE_AVG ? COLLIE_SUM : op);
    if (op == COLLIE_AVG) cl_reduce_finalize_avg(acc, count, dt, n);
    return acc;
}

/* Every rank arrived: compute everybody's output. Returns false on a
 * mismatch between ranks. */
static bool nd_room_compute(dbl_room *r, int n, char *why, size_t len) {
    const dbl_item *a = r->slot[0];
    bool lenient = cltest_env_int("CLTEST_NCCL_LENIENT", 0) != 0;
    for (int i = 1; i < n; i++) {
        const dbl_item *b = r->slot[i];
        if (b->kind != a->kind || b->count != a->count || b->dt != a->dt ||
            (a->kind != K_ALLGATHER && b->op != a->op && !lenient) || b->root != a->root) {
            snprintf(why, len, "ranks 0 and %d posted different collectives (%s / %s)", i,
                     dbl_kind_names[a->kind], dbl_kind_names[b->kind]);
            return false;
        }
    }
    size_t blk = a->count * nd_dsize(a->dt);
    for (int i = 0; i < n; i++)
        r->off[i] = 0, r->len[i] = blk;
    switch (a->kind) {
    case K_ALLREDUCE: r->result = nd_reduce_all(r, n, a->count); break;
    case K_REDUCE:
        r->result = nd_reduce_all(r, n, a->count);
        for (int i = 0; i < n; i++)
            r->len[i] = i == a->root ? blk : 0;
        break;
    case K_BROADCAST:
        r->result = malloc(blk ? blk : 1);
        if (blk) memcpy(r->result, r->slot[a->root]->send, blk);
        break;
    case K_ALLGATHER:
        r->result = malloc(blk * (size_t)n + 1);
        for (int i = 0; i < n; i++) {
            if (blk) memcpy((char *)r->result + (size_t)i * blk, r->slot[i]->send, blk);
            r->len[i] = blk * (size_t)n;
        }
        break;
    default: /* reduce_scatter: count is per rank */
        r->result = nd_reduce_all(r, n, a->count * (size_t)n);
        for (int i = 0; i < n; i++)
            r->off[i] = (size_t)i * blk;
        break;
    }
    return true;
}

static dbl_room *nd_room_get_locked(dbl_clique *q, uint64_t seq) {
    for (dbl_room *r = q->rooms; r; r = r->next)
        if (r->seq == seq) return r;
    size_t n = (size_t)q->nranks;
    dbl_room *r = calloc(1, sizeof *r + n * (2 * sizeof(size_t) + sizeof(void *)));
    if (!r) abort();
    r->seq = seq;
    r->off = (size_t *)(r + 1);
    r->len = r->off + n;
    r->slot = (const dbl_item **)(r->len + n);
    r->next = q->rooms;
    q->rooms = r;
    return r;
}

static void nd_room_free_locked(dbl_clique *q, dbl_room *r) {
    for (dbl_room **pp = &q->rooms; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    free(r->result);
    free(r);
}

/* Did a rank we are waiting for abort (or die)? Returns the rank whose
 * process died, nranks for another reason, -1 if none is gone. */
static int nd_peer_gone_locked(dbl_clique *q, dbl_room *r) {
    for (int i = 0; i < q->nranks; i++)
        if (!r->slot[i] && q->rank_aborted[i] == ND_DIED) return i;
    if (r->broken) return q->nranks;
    for (int i = 0; i < q->nranks; i++)
        if (!r->slot[i] && q->rank_aborted[i]) return q->nranks;
    return -1;
}

static void nd_coll_run_locked(ncclComm_t c, dbl_op *op) {
    dbl_clique *q = c->cq;
    dbl_room *r = nd_room_get_locked(q, op->seq);
    r->slot[c->rank] = &op->items[0];
    if (++r->arrived == q->nranks && !r->broken) {
        char why[200];
        if (nd_room_compute(r, q->nranks, why, sizeof why)) {
            r->done = true;
        } else {
            r->broken = true;
            for (int i = 0; i < q->nranks; i++)
                if (q->members[i])
                    nd_set_error_locked(q->members[i], ncclInvalidUsage, "cltest double: %s%d", why,
                                        0);
        }
        pthread_cond_broadcast(&nd_cv);
    }
    while (!r->done && !c->aborted) {
        int gone = nd_peer_gone_locked(q, r);
        if (gone >= 0 && gone < q->nranks)
            nd_set_error_locked(c, ncclRemoteError,
                                "cltest double: %s seq %d: rank %d's process died (its connection "
                                "to the hub closed)",
                                dbl_kind_names[op->kind], (int)op->seq, gone);
        else if (gone >= 0)
            nd_set_error_locked(c, ncclRemoteError,
                                "cltest double: %s seq %d: a peer aborted its communicator",
                                dbl_kind_names[op->kind], (int)op->seq);
        nd_wait_until(0);
    }
    if (r->done && !c->aborted && r->len[c->rank])
        memcpy(op->items[0].recv, (char *)r->result + r->off[c->rank], r->len[c->rank]);
    if (!r->done) { /* we leave early: nobody may read our buffers any more */
        r->slot[c->rank] = NULL;
        r->broken = true;
        pthread_cond_broadcast(&nd_cv);
        return; /* broken rooms stay until the clique goes */
    }
    if (++r->left == q->nranks) nd_room_free_locked(q, r);
}

/* ---- send/recv ------------------------------------------------------------------------ */

static void nd_p2p_run_locked(ncclComm_t c, dbl_op *op) {
    dbl_clique *q = c->cq;
    dbl_msg *mine[256];
    int nmine = 0;
    for (int i = 0; i < op->nitems; i++) {
        const dbl_item *it = &op->items[i];
        if (it->kind != K_SEND || nmine == 256) continue;
        dbl_msg *m = calloc(1, sizeof *m);
        if (!m) abort();
        m->src = c->rank;
        m->dst = it->peer;
        m->buf = it->send;
        m->bytes = it->count * nd_dsize(it->dt);
        dbl_msg **pp = &q->msgs; /* FIFO: NCCL matches in post order */
        while (*pp)
            pp = &(*pp)->next;
        *pp = m;
        mine[nmine++] = m;
    }
    pthread_cond_broadcast(&nd_cv);
    for (int i = 0; i < op->nitems && !c->aborted; i++) {
        const dbl_item *it = &op->items[i];
        if (it->kind != K_RECV) continue;
        for (;;) {
            dbl_msg *m = q->msgs;
            while (m && (m->taken || m->src != it->peer || m->dst != c->rank))
                m = m->next;
            if (m) {
                size_t want = it->count * nd_dsize(it->dt);
                if (m->bytes != want && !cltest_env_int("CLTEST_NCCL_LENIENT", 0))
                    nd_set_error_locked(c, ncclInvalidUsage,
                                        "cltest double: %s from rank %d: size mismatch", "recv",
                                        it->peer);
                memcpy(it->recv, m->buf, m->bytes < want ? m->bytes : want);
                m->taken = true;
                pthread_cond_broadcast(&nd_cv);
                break;
            }
            if (c->aborted) break;
            if (q->rank_aborted[it->peer])
                nd_set_error_locked(c, ncclRemoteError,
                                    "cltest double: %s from rank %d: the peer %s", "recv", it->peer,
                                    q->rank_aborted[it->peer] == ND_DIED ? "died" : "aborted");
            nd_wait_until(0);
        }
    }
    for (int i = 0; i < nmine; i++) { /* our sends must be received before we finish */
        while (!mine[i]->taken && !c->aborted) {
            if (q->rank_aborted[mine[i]->dst])
                nd_set_error_locked(c, ncclRemoteError, "cltest double: %s to rank %d: the peer %s",
                                    "send", mine[i]->dst,
                                    q->rank_aborted[mine[i]->dst] == ND_DIED ? "died" : "aborted");
            nd_wait_until(0);
        }
        for (dbl_msg **pp = &q->msgs; *pp; pp = &(*pp)->next)
            if (*pp == mine[i]) { /* withdrawn if never taken: its buffer is no longer ours */
                *pp = mine[i]->next;
                break;
            }
        free(mine[i]);
    }
}

/* ---- running ops ------------------------------------------------------------------------ */

void nd_op_run(void *arg) {
    dbl_op *op = arg;
    long slow_ms = cltest_env_int("CLTEST_CUDA_SLOW_MS", 0);
    bool completed = false;
    if (op->crash) kill(getpid(), SIGKILL); /* a rank process dying mid-op */
    nd_lock();
    ncclComm_t c = op->comm;
    if (!c->aborted) {
        c->executing++;
        nd_executing++;
        int64_t until = cltest_now_ns() + slow_ms * 1000000;
        while (slow_ms > 0 && !c->aborted && cltest_now_ns() < until)
            nd_wait_until(until);
        if (op->error && !c->aborted) {
            nd_set_error_locked(c, nd_async_code(), "cltest double: injected async error in %s #%d",
                                dbl_kind_names[op->kind], (int)op->nth);
            pthread_cond_broadcast(&nd_cv);
        }
        if (op->hang || op->error) {
            while (!c->aborted)
                nd_wait_until(0);
        } else if (!c->aborted) {
            if (c->rm)
                nd_remote_run_locked(c, op);
            else if (op->kind == K_P2P)
                nd_p2p_run_locked(c, op);
            else
                nd_coll_run_locked(c, op);
            completed = !c->aborted; /* both wait until done or aborted */
        }
        c->executing--;
        nd_executing--;
        pthread_cond_broadcast(&nd_cv);
    }
    nd_comm_unref_locked(c);
    nd_unlock();
    if (op->done) op->done(op, completed);
    free(op);
}

static ncclResult_t nd_submit(ncclComm_t c, cudaStream_t s, int kind, const dbl_item *items,
                              int n) {
    if (!c) return ncclInvalidArgument;
    nd_lock();
    ncclResult_t res = ncclSuccess;
    if (c->aborted) {
        res = ncclInvalidUsage;
    } else if (c->error != ncclSuccess) {
        res = c->error;
    } else if (!c->initialized || c->call_inprogress || c->split_pending) {
        snprintf(c->last_error, sizeof c->last_error,
                 "cltest double: NCCL call while the communicator is still in progress");
        res = ncclInvalidUsage;
    }
    if (res != ncclSuccess) {
        nd_unlock();
        return res;
    }
    dbl_op *op = calloc(1, sizeof *op + (size_t)n * sizeof(dbl_item));
    if (!op) abort();
    op->comm = c;
    op->stream = s;
    op->kind = kind;
    op->nitems = n;
    memcpy(op->items, items, (size_t)n * sizeof *items);
    if (kind != K_P2P) op->seq = c->coll_seq++;
    uint64_t nth = op->nth = ++c->counts[kind];
    op->hang = nd_spec_match("CLTEST_CUDA_HANG", kind, nth, c->rank);
    op->error = nd_spec_match("CLTEST_CUDA_ASYNC_ERROR", kind, nth, c->rank);
    op->crash = nd_spec_match("CLTEST_CUDA_CRASH", kind, nth, c->rank);
    c->refs++;
    long inprogress_ms = cltest_env_int("CLTEST_NCCL_INPROGRESS_MS", 0);
    if (inprogress_ms > 0) {
        c->deferred = op;
        c->deferred_until = cltest_now_ns() + inprogress_ms * 1000000;
        c->call_inprogress = true;
        res = ncclInProgress;
    } else if (cltest_stream_enqueue(s, nd_op_run, op) != cudaSuccess) {
        c->refs--;
        free(op);
        res = ncclUnhandledCudaError;
    }
    nd_unlock();
    return res;
}

/* ---- the API ----------------------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version) {
#ifdef CLTEST_NCCL_OLD
    *version = NCCL_VERSION(2, 26, 5); /* before ncclCommShrink */
#else
    *version = NCCL_VERSION_CODE;
#endif
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static _Atomic uint64_t counter;
    memset(id, 0, sizeof *id);
    /* the creator's pid and hub token: where ranks of other processes join */
    uint64_t v[4] = {(uint64_t)getpid(), (uint64_t)cltest_now_ns(), ++counter, nd_hub_start()};
    memcpy(id->internal, v, sizeof v);
    return ncclSuccess;
}

ncclResult_t nd_comm_join_locked(const ncclUniqueId *id, int nranks, int rank, int dev, bool proxy,
                                 ncclComm_t *out) {
    *out = NULL;
    dbl_clique *q = nd_cliques;
    while (q && memcmp(&q->id, id, sizeof *id) != 0)
        q = q->next;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q) abort();
        q->members = calloc((size_t)nranks, sizeof *q->members);
        q->rank_aborted = calloc((size_t)nranks, sizeof *q->rank_aborted);
        if (!q->members || !q->rank_aborted) abort();
        q->id = *id;
        q->nranks = nranks;
        q->next = nd_cliques;
        nd_cliques = q;
    }
    if (q->nranks != nranks || q->members[rank]) {
        snprintf(nd_last_error, sizeof nd_last_error,
                 "cltest double: rank %d of %d does not fit the clique (%d ranks)", rank, nranks,
                 q->nranks);
        return ncclInvalidUsage;
    }
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) abort();
    c->cq = q;
    c->rank = rank;
    c->nranks = nranks;
    c->dev = dev;
    c->proxy = proxy;
    if (!proxy && rank < ND_MAX_RANKS) nd_comm_dev1[rank] = c->dev + 1;
    c->refs = 1;
    q->members[rank] = c;
    q->joined++;
    q->refs++;
    if (proxy)
        q->proxies++;
    else
        nd_live_comms++;
    pthread_cond_broadcast(&nd_cv);
    *out = c;
    return ncclSuccess;
}

/* A rank of an id made by another process: it joins through that
 * process's hub (nccl_proc.c). */
static ncclResult_t nd_init_remote(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                                   bool blocking, bool hang) {
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) abort();
    c->rank = rank;
    c->nranks = nranks;
    c->dev = cltest_current_device();
    c->refs = 1;
    ncclResult_t res = nd_remote_join(c, id);
    if (res != ncclSuccess) {
        free(c);
        return res;
    }
    nd_lock();
    if (rank < ND_MAX_RANKS) nd_comm_dev1[rank] = c->dev + 1;
    nd_live_comms++;
    while (blocking && (!nd_remote_ready_locked(c) || hang) && c->error == ncclSuccess)
        nd_wait_until(0);
    c->initialized = blocking && c->error == ncclSuccess;
    res = c->error;
    nd_unlock();
    if (blocking && res != ncclSuccess) {
        snprintf(nd_last_error, sizeof nd_last_error, "%s", c->last_error);
        ncclCommAbort(c);
        return res;
    }
    *out = c;
    return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    if (!out || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    *out = NULL;
    if (config && config->magic != 0xcafebeef) return ncclInvalidArgument;
    bool blocking = !config || config->blocking != 0;
    bool hang = cltest_env_int("CLTEST_NCCL_INIT_HANG", 0) != 0;
    if (nd_id_remote(&id)) return nd_init_remote(out, nranks, &id, rank, blocking, hang);
    nd_lock();
    ncclComm_t c;
    ncclResult_t res = nd_comm_join_locked(&id, nranks, rank, cltest_current_device(), false, &c);
    if (res != ncclSuccess) {
        nd_unlock();
        return res;
    }
    dbl_clique *q = c->cq;
    while (blocking && (q->joined < nranks || hang))
        nd_wait_until(0);
    c->initialized = blocking;
    nd_unlock();
    *out = c;
    return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(out, nranks, id, rank, NULL);
}

/* A revoked comm: stop its ops once the (slowed) revoke gets there; true
 * once none runs (the quiesce, counted once). */
static bool nd_revoke_progress_locked(ncclComm_t c) {
    if (!c->aborted && cltest_now_ns() >= c->revoke_stop_ns) {
        c->aborted = true;
        if (c->cq && !c->cq->rank_aborted[c->rank]) c->cq->rank_aborted[c->rank] = ND_REVOKED;
        if (c->deferred) { /* an op never enqueued: dropped */
            free(c->deferred);
            c->deferred = NULL;
            c->call_inprogress = false;
            c->refs--;
        }
        pthread_cond_broadcast(&nd_cv);
    }
    if (!c->aborted || c->executing > 0) return false;
    if (!c->quiesce_counted) {
        c->quiesce_counted = true;
        nd_aborts_done++;
        if (c->rank < ND_MAX_RANKS) nd_abort_done_ns[c->rank] = cltest_now_ns();
    }
    return true;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
    if (!c || !state) return ncclInvalidArgument;
    nd_lock();
    if (c->revoked) { /* in progress until quiescent, then success */
        *state = nd_revoke_progress_locked(c) ? ncclSuccess : ncclInProgress;
        nd_unlock();
        return ncclSuccess;
    }
    if (!c->initialized && c->cq && c->cq->joined == c->nranks &&
        !cltest_env_int("CLTEST_NCCL_INIT_HANG", 0))
        c->initialized = true;
    if (!c->initialized && c->rm && nd_remote_ready_locked(c) &&
        !cltest_env_int("CLTEST_NCCL_INIT_HANG", 0))
        c->initialized = true;
    if (!c->cq && c->split_of && c->error == ncclSuccess) /* a revoked rank may still call */
        for (int i = 0; i < c->split_of->nranks; i++)
            if (c->split_of->rank_aborted[i] && c->split_of->rank_aborted[i] != ND_REVOKED &&
                !(c->excluded_of && c->excluded_of[i]))
                nd_set_error_locked(c, ncclRemoteError, "cltest double: %s: parent rank %d aborted",
                                    c->excluded_of ? "ncclCommShrink" : "ncclCommSplit", i);
    if (c->deferred && cltest_now_ns() >= c->deferred_until) {
        dbl_op *op = c->deferred;
        c->deferred = NULL;
        c->call_inprogress = false;
        if (cltest_stream_enqueue(op->stream, nd_op_run, op) != cudaSuccess) {
            c->refs--;
            free(op);
            nd_set_error_locked(c, ncclUnhandledCudaError, "cltest double: %s%d", "enqueue failed",
                                0);
        }
    }
    if (c->error != ncclSuccess)
        *state = c->error;
    else if (!c->initialized || c->call_inprogress || c->split_pending)
        *state = ncclInProgress;
    else
        *state = ncclSuccess;
    nd_unlock();
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    long slow = cltest_env_int("CLTEST_NCCL_ABORT_SLOW_MS", 0);
    nd_lock();
    bool quiet = c->revoked && c->aborted && c->executing == 0; /* a release */
    if (!c->abort_counted) nd_aborts_started++;
    c->abort_counted = true;
    nd_unlock();
    if (slow > 0 && !quiet) usleep((useconds_t)slow * 1000); /* the kernels keep running */
    nd_lock();
    c->aborted = true;
    if (c->cq) c->cq->rank_aborted[c->rank] = ND_ABORTED;
    pthread_cond_broadcast(&nd_cv);
    while (c->executing > 0) /* running ops notice and leave: the quiesce */
        nd_wait_until(0);
    if (c->deferred) {
        free(c->deferred);
        c->deferred = NULL;
        c->refs--;
    }
    if (c->rm) { /* the hub hears of it and aborts our stand-in there */
        nd_unlock();
        nd_remote_close(c);
        nd_lock();
    }
    if (!c->quiesce_counted) {
        nd_aborts_done++;
        if (c->rank < ND_MAX_RANKS) nd_abort_done_ns[c->rank] = cltest_now_ns(); /* returning now */
    }
    nd_comm_unref_locked(c);
    nd_unlock();
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) { return ncclCommAbort(c); }

/* ---- ncclCommSplit ---------------------------------------------------------------------- */

static void nd_split_free_locked(dbl_split *sp, int n) {
    for (int i = 0; i < n; i++)
        if (sp->child[i]) nd_comm_unref_locked(sp->child[i]);
    free(sp->color);
    free(sp->key);
    free(sp->child);
    free(sp->out);
    free(sp);
}

static dbl_split *nd_split_get_locked(dbl_clique *q, uint64_t seq) {
    for (dbl_split *sp = q->splits; sp; sp = sp->next)
        if (sp->seq == seq) return sp;
    dbl_split *sp = calloc(1, sizeof *sp);
    if (!sp) abort();
    sp->seq = seq;
    sp->color = calloc((size_t)q->nranks, sizeof *sp->color);
    sp->key = calloc((size_t)q->nranks, sizeof *sp->key);
    sp->child = calloc((size_t)q->nranks, sizeof *sp->child);
    if (!sp->color || !sp->key || !sp->child) abort();
    sp->next = q->splits;
    q->splits = sp;
    return sp;
}

/* Every rank has called: one clique per colour, ranks in (key, parent
 * rank) order, as NCCL orders them. */
static void nd_split_complete_locked(dbl_clique *q, dbl_split *sp) {
    int n = q->nranks;
    bool *placed = calloc((size_t)n, sizeof *placed);
    int *order = calloc((size_t)n, sizeof *order);
    if (!placed || !order) abort();
    for (int first = 0; first < n; first++) {
        if (!sp->child[first] || placed[first]) continue;
        int m = 0;
        for (int i = first; i < n; i++)
            if (sp->child[i] && !placed[i] && sp->color[i] == sp->color[first]) {
                int j = m++;
                while (j > 0 && (sp->key[order[j - 1]] > sp->key[i])) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = i;
                placed[i] = true;
            }
        dbl_clique *c = calloc(1, sizeof *c);
        if (!c) abort();
        c->members = calloc((size_t)m, sizeof *c->members);
        c->rank_aborted = calloc((size_t)m, sizeof *c->rank_aborted);
        if (!c->members || !c->rank_aborted) abort();
        ncclGetUniqueId(&c->id);
        c->nranks = m;
        c->joined = m;
        c->next = nd_cliques;
        nd_cliques = c;
        for (int r = 0; r < m; r++) {
            ncclComm_t child = sp->child[order[r]];
            child->cq = c;
            child->rank = r;
            child->nranks = m;
            child->split_of = NULL;
            c->members[r] = child;
            c->refs++;
            if (r < ND_MAX_RANKS) nd_comm_dev1[r] = child->dev + 1;
        }
    }
    free(placed);
    free(order);
    for (int i = 0; i < n; i++)
        if (q->members[i]) q->members[i]->split_pending = false;
    for (int r = 0; r < n; r++) /* placed: what the parent's ranks do is no concern now */
        if (sp->child[r]) {
            free(sp->child[r]->excluded_of);
            sp->child[r]->excluded_of = NULL;
        }
    for (dbl_split **pp = &q->splits; *pp; pp = &(*pp)->next)
        if (*pp == sp) {
            *pp = sp->next;
            break;
        }
    nd_split_free_locked(sp, n);
    pthread_cond_broadcast(&nd_cv);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
    if (!comm || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
    *newcomm = NULL;
    if (config && config->magic != 0xcafebeef) return ncclInvalidArgument;
    bool blocking = !config || config->blocking != 0;
    nd_lock();
    if (comm->aborted || comm->error != ncclSuccess || !comm->initialized ||
        comm->call_inprogress || comm->split_pending) {
        snprintf(comm->last_error, sizeof comm->last_error,
                 "cltest double: ncclCommSplit on a communicator that is %s",
                 comm->aborted ? "aborted" : "failed or still in progress");
        nd_unlock();
        return ncclInvalidUsage;
    }
    if (comm->rm || comm->cq->proxies > 0) {
        snprintf(comm->last_error, sizeof comm->last_error,
                 "cltest double: ncclCommSplit of a communicator whose ranks live in several "
                 "processes is not supported");
        nd_unlock();
        return ncclInvalidUsage;
    }
    nd_splits++;
    dbl_clique *q = comm->cq;
    dbl_split *sp = nd_split_get_locked(q, comm->split_seq++);
    ncclComm_t child = NULL;
    if (color != NCCL_SPLIT_NOCOLOR) {
        child = calloc(1, sizeof *child);
        if (!child) abort();
        child->rank = -1;
        child->dev = comm->dev;
        child->refs = 2; /* the caller's and the split record's */
        child->split_of = q;
        nd_live_comms++;
    }
    sp->color[comm->rank] = color;
    sp->key[comm->rank] = key;
    sp->child[comm->rank] = child;
    comm->split_pending = true;
    if (++sp->arrived == q->nranks) nd_split_complete_locked(q, sp);
    while (blocking && comm->split_pending && !comm->aborted)
        nd_wait_until(0);
    if (child) child->initialized = blocking && child->cq;
    bool pending = comm->split_pending;
    nd_unlock();
    *newcomm = child;
    return pending ? ncclInProgress : ncclSuccess;
}
#ifndef CLTEST_NCCL_OLD
/* ---- ncclCommRevoke, ncclCommShrink ------------------------------------------------------ */

ncclResult_t ncclCommRevoke(ncclComm_t c, int flags) {
    if (!c) return ncclSuccess;
    if (flags != NCCL_REVOKE_DEFAULT) return ncclInvalidArgument;
    nd_lock();
    ncclResult_t res = ncclSuccess;
    if (c->revoked || c->aborted) {
        snprintf(c->last_error, sizeof c->last_error,
                 "cltest double: ncclCommRevoke: the communicator is %s already",
                 c->revoked ? "revoked" : "aborted");
        res = ncclInvalidArgument;
    } else if (cltest_env_int("CLTEST_NCCL_REVOKE_FAIL", -1) == c->rank) {
        snprintf(c->last_error, sizeof c->last_error,
                 "cltest double: ncclCommRevoke fails on rank %d (CLTEST_NCCL_REVOKE_FAIL)",
                 c->rank);
        res = ncclInternalError;
    } else if (c->rm || c->proxy || (c->cq && c->cq->proxies > 0)) {
        snprintf(c->last_error, sizeof c->last_error,
                 "cltest double: ncclCommRevoke of a communicator whose ranks live in several "
                 "processes is not supported");
        res = ncclInvalidUsage;
    } else {
        nd_revokes++;
        nd_aborts_started++;
        c->abort_counted = true;
        c->revoked = true;
        long slow = cltest_env_int("CLTEST_NCCL_ABORT_SLOW_MS", 0); /* the kernels run on */
        c->revoke_stop_ns = cltest_now_ns() + (slow > 0 ? slow : 0) * 1000000;
        nd_revoke_progress_locked(c);
    }
    nd_unlock();
    return res;
}

static int nd_cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The survivors' ncclCommSplit: colour 0, key = parent rank, complete once
 * every rank not in `excl` has called. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excl, int nexcl, ncclComm_t *newcomm,
                            ncclConfig_t *config, int flags) {
    if (!comm || !newcomm || !excl || nexcl < 1 ||
        (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT))
        return ncclInvalidArgument;
    *newcomm = NULL;
    if (config && config->magic != 0xcafebeef) return ncclInvalidArgument;
    bool blocking = !config || config->blocking != 0;
    qsort(excl, (size_t)nexcl, sizeof *excl, nd_cmp_int); /* as NCCL does, in place */
    nd_lock();
    int n = comm->nranks;
    bool bad = false;
    for (int i = 0; i < nexcl; i++)
        bad |=
            excl[i] < 0 || excl[i] >= n || excl[i] == comm->rank || (i && excl[i] == excl[i - 1]);
    const char *why = bad                                            ? "a bad excluded list"
                      : !comm->initialized                           ? "not initialized"
                      : comm->aborted && !comm->revoked              ? "aborted"
                      : comm->rm || comm->cq->proxies > 0            ? "spread over processes"
                      : comm->call_inprogress || comm->split_pending ? "still in progress"
                      : comm->error != ncclSuccess && !comm->revoked && !(flags & NCCL_SHRINK_ABORT)
                          ? "failed"
                          : NULL;
    if (why) {
        snprintf(comm->last_error, sizeof comm->last_error,
                 "cltest double: ncclCommShrink on a communicator: %s", why);
        nd_unlock();
        return bad ? ncclInvalidArgument : ncclInvalidUsage;
    }
    nd_shrinks++;
    if (comm->rank < ND_MAX_RANKS) {
        nd_last_shrink[comm->rank].n = nexcl + 1;
        nd_last_shrink[comm->rank].flags = flags;
        for (int i = 0; i < nexcl && i < ND_MAX_RANKS; i++)
            nd_last_shrink[comm->rank].excl[i] = excl[i];
    }
    dbl_clique *q = comm->cq;
    dbl_split *sp = nd_split_get_locked(q, comm->split_seq++);
    unsigned char *out = calloc((size_t)n, 1);
    ncclComm_t child = calloc(1, sizeof *child);
    if (!out || !child) abort();
    for (int i = 0; i < nexcl; i++)
        out[excl[i]] = 1;
    if (!sp->out) { /* the first survivor to call: what the others must say too */
        if (!(sp->out = malloc((size_t)n))) abort();
        memcpy(sp->out, out, (size_t)n);
        sp->need = n - nexcl;
    } else if (memcmp(sp->out, out, (size_t)n) != 0) {
        nd_set_error_locked(child, ncclInvalidUsage,
                            "cltest double: ncclCommShrink: the ranks excluded different sets");
    }
    child->rank = -1;
    child->dev = comm->dev;
    child->refs = 2; /* the caller's and the split record's */
    child->split_of = q;
    child->excluded_of = out;
    nd_live_comms++;
    sp->color[comm->rank] = 0;
    sp->key[comm->rank] = comm->rank;
    sp->child[comm->rank] = child;
    comm->split_pending = true;
    if (++sp->arrived == sp->need) nd_split_complete_locked(q, sp);
    while (blocking && comm->split_pending && child->error == ncclSuccess)
        nd_wait_until(0);
    if (child->cq) child->initialized = blocking;
    bool pending = comm->split_pending;
    nd_unlock();
    *newcomm = child;
    return pending ? ncclInProgress : ncclSuccess;
}
#endif

ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *dev) {
    *dev = c->dev;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t c) { return c ? c->last_error : nd_last_error; }

static ncclResult_t nd_coll(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt,
                            ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
    if (!nd_dsize(dt)) return ncclInvalidArgument;
    if (c && (root < 0 || root >= c->nranks)) return ncclInvalidArgument;
    dbl_item it = {
        .kind = kind, .send = send, .recv = recv, .count = count, .dt = dt, .op = op, .root = root};
    return nd_submit(c, s, kind, &it, 1);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    return nd_coll(K_ALLREDUCE, send, recv, count, dt, op, 0, c, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root,
                           ncclComm_t c, cudaStream_t s) {
    return nd_coll(K_BROADCAST, send, recv, count, dt, ncclSum, root, c, s);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
    return nd_coll(K_REDUCE, send, recv, count, dt, op, root, c, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclComm_t c, cudaStream_t s) {
    return nd_coll(K_ALLGATHER, send, recv, count, dt, ncclSum, 0, c, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
    return nd_coll(K_REDUCE_SCATTER, send, recv, count, dt, op, 0, c, s);
}

ncclResult_t ncclGroupStart(void) {
    if (nd_group_depth++ == 0) {
        nd_group_n = 0;
        nd_group_err = ncclSuccess;
    }
    return ncclSuccess;
}

static ncclResult_t nd_p2p(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt,
                           int peer, ncclComm_t c, cudaStream_t s) {
    if (!c || !nd_dsize(dt) || peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
    dbl_item it = {
        .kind = kind, .send = send, .recv = recv, .count = count, .dt = dt, .peer = peer};
    if (nd_group_depth == 0) return nd_submit(c, s, K_P2P, &it, 1);
    if (nd_group_n == 256) return nd_group_err = ncclInvalidUsage;
    nd_group[nd_group_n].comm = c;
    nd_group[nd_group_n].stream = s;
    nd_group[nd_group_n].item = it;
    nd_group_n++;
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t c,
                      cudaStream_t s) {
    return nd_p2p(K_SEND, send, NULL, count, dt, peer, c, s);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t c,
                      cudaStream_t s) {
    return nd_p2p(K_RECV, NULL, recv, count, dt, peer, c, s);
}

/* One op per comm of the group (the plugin groups one comm at a time). */
ncclResult_t ncclGroupEnd(void) {
    if (nd_group_depth == 0) return ncclInvalidUsage;
    if (--nd_group_depth > 0) return ncclSuccess;
    ncclResult_t res = nd_group_err;
    dbl_item items[256];
    bool used[256] = {false};
    for (int i = 0; i < nd_group_n && res == ncclSuccess; i++) {
        if (used[i]) continue;
        int n = 0;
        for (int j = i; j < nd_group_n; j++)
            if (!used[j] && nd_group[j].comm == nd_group[i].comm) {
                items[n++] = nd_group[j].item;
                used[j] = true;
            }
        ncclResult_t r = nd_submit(nd_group[i].comm, nd_group[i].stream, K_P2P, items, n);
        if (r != ncclSuccess) res = r;
    }
    nd_group_n = 0;
    return res;
}
