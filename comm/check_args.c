/*
 * check_args.c — COLLIE_CHECK_ARGS=1: the arguments of every CUDA
 * collective compared across ranks. NCCL runs collectives whose arguments
 * disagree without a word (a sum on one rank and a max on another gives a
 * wrong answer); the TCP transport checks every frame, NCCL has no frames
 * to check. Opt-in: it costs store traffic.
 *
 * Design notes
 *  - Off the launch path: a post only appends the collective's fingerprint
 *    (seq, kind, count, dtype, op, root) to a queue under the comm's mutex,
 *    which it holds already, and queues one command when the queue was
 *    empty. Everything else runs on the loop, asynchronously.
 *  - Windows of CHK_WINDOW sequence numbers: rank 0 publishes its
 *    fingerprints of window w under "<prefix>chk/<w>" — complete once it has
 *    posted past the window, partial (re-published as it grows) after
 *    CHK_FLUSH_MS without one, so a short burst is checked too. Every other
 *    rank gets the window holding its oldest unchecked fingerprint, compares
 *    each of its own with rank 0's of the same seq, and polls again
 *    (CHK_POLL_MS) while rank 0's window is partial. Two ranks other than 0
 *    that disagree both differ from rank 0, so comparing with rank 0 is enough.
 *  - A mismatch is the comm's fault (COLLIE_EPROTO), naming seq, both ranks
 *    and what each posted; the policy applies as for any fault (under
 *    ABORT_COMM rank 0 learns it from the abort notice). Works that already
 *    completed keep their status: the check runs behind the GPU.
 *  - A rank 0 that falls silent leaves a get waiting; it is re-posted at the
 *    comm's timeout (the collectives' own deadlines say what is wrong).
 *    Only a lost store ends the checking (logged).
 *  - Each rank-0 window is one key; the keys go with the generation's
 *    (deleted when the comm is destroyed everywhere).
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

#define CHK_WINDOW   64 /* sequence numbers per published window */
#define CHK_FLUSH_MS 20 /* rank 0: a partial window goes out after this */
#define CHK_POLL_MS  20 /* the others: look again at a partial window */
#define CHK_REC      24 /* bytes of one encoded fingerprint */

typedef struct chk_fp {
    uint64_t seq, count;
    int32_t root;
    uint8_t kind, dtype, op;
} chk_fp;

typedef struct chk_list {
    chk_fp *v;
    size_t n, cap;
} chk_list;

struct cl_check_args {
    /* under the comm's mu: posted, not yet taken by the loop */
    chk_list queue;
    bool cmd_queued;
    cl_cmd cmd;
    /* loop */
    collie_comm *c;
    chk_list mine; /* rank 0: not yet in a complete window; others: not yet checked */
    uint64_t win;  /* rank 0: the window being filled */
    struct event *timer;
    collie_work *req; /* others: the get in flight */
    bool stopped;
};

static uint64_t chk_window(uint64_t seq) { return (seq - 1) / CHK_WINDOW; }

static bool chk_push(chk_list *l, const chk_fp *fp) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        chk_fp *v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *fp;
    return true;
}

static void chk_drop_first(chk_list *l, size_t k) {
    memmove(l->v, l->v + k, (l->n - k) * sizeof *l->v);
    l->n -= k;
}

static void chk_key(const collie_comm *c, uint64_t w, char *buf, size_t len) {
    snprintf(buf, len, "%schk/%llu", c->prefix, (unsigned long long)w);
}

static void chk_encode(uint8_t *p, const chk_fp *fp) {
    memset(p, 0, CHK_REC);
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(fp->seq >> (8 * i));
        p[8 + i] = (uint8_t)(fp->count >> (8 * i));
    }
    for (int i = 0; i < 4; i++)
        p[16 + i] = (uint8_t)((uint32_t)fp->root >> (8 * i));
    p[20] = fp->kind;
    p[21] = fp->dtype;
    p[22] = fp->op;
}

static chk_fp chk_decode(const uint8_t *p) {
    chk_fp fp = {0};
    uint32_t root = 0;
    for (int i = 0; i < 8; i++) {
        fp.seq |= (uint64_t)p[i] << (8 * i);
        fp.count |= (uint64_t)p[8 + i] << (8 * i);
    }
    for (int i = 0; i < 4; i++)
        root |= (uint32_t)p[16 + i] << (8 * i);
    fp.root = (int32_t)root;
    fp.kind = p[20];
    fp.dtype = p[21];
    fp.op = p[22];
    return fp;
}

static void chk_describe(const chk_fp *fp, char *buf, size_t len) {
    collie_coll_describe(buf, len, (collie_coll_kind)fp->kind, fp->count,
                         collie_dtype_name((collie_dtype)fp->dtype),
                         collie_redop_name((collie_redop)fp->op), fp->root);
}

/* Do two ranks' fingerprints of one seq agree (every argument that must)? */
static bool chk_agree(const chk_fp *a, const chk_fp *b) {
    collie_coll_kind k = (collie_coll_kind)a->kind;
    return a->kind == b->kind && a->dtype == b->dtype &&
           (!collie_coll_count_agrees(k) || a->count == b->count) &&
           (!collie_coll_reduces(k) || a->op == b->op) &&
           (!collie_coll_has_root(k) || a->root == b->root);
}

static void chk_release_cb(collie_work *w, void *arg) {
    collie_work_release(w);
    cl_comm_release(arg);
}

static void chk_arm(struct cl_check_args *k, int ms) {
    struct timeval tv = {0, ms * 1000};
    if (k->timer) event_add(k->timer, &tv);
}

/* ---- rank 0: publish ----------------------------------------------------------- */

/* Publish window w: its fingerprints (the first n of mine), complete or not. */
static void chk_publish(struct cl_check_args *k, uint64_t w, size_t n, bool complete) {
    collie_comm *c = k->c;
    size_t len = 1 + n * CHK_REC;
    uint8_t *buf = malloc(len);
    if (!buf) return; /* a later publish of this window (or the next) makes up for it */
    buf[0] = complete;
    for (size_t i = 0; i < n; i++)
        chk_encode(buf + 1 + i * CHK_REC, &k->mine.v[i]);
    char key[160];
    chk_key(c, w, key, sizeof key);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = chk_release_cb;
    o.cb_arg = c;
    collie_work *sw;
    cl_comm_hold(c);
    if (collie_store_post_set(c->store, key, buf, len, &o, &sw) != COLLIE_OK) cl_comm_release(c);
    free(buf);
}

/* Every window before the newest fingerprint's is complete: out with them. */
static void chk_publish_complete(struct cl_check_args *k) {
    while (k->mine.n > 0 && chk_window(k->mine.v[k->mine.n - 1].seq) > k->win) {
        size_t n = 0;
        while (n < k->mine.n && chk_window(k->mine.v[n].seq) == k->win)
            n++;
        chk_publish(k, k->win, n, true);
        chk_drop_first(&k->mine, n);
        k->win++;
    }
}

/* ---- the others: check ------------------------------------------------------------ */

static void chk_get(struct cl_check_args *k);

static void chk_mismatch(struct cl_check_args *k, const chk_fp *theirs, const chk_fp *ours,
                         uint64_t seq) {
    collie_comm *c = k->c;
    char a[128] = "no collective on its GPU backend", b[128];
    if (theirs) chk_describe(theirs, a, sizeof a);
    chk_describe(ours, b, sizeof b);
    k->stopped = true;
    cl_comm_fault(c, COLLIE_EPROTO,
                  "mismatched collectives at seq %llu: rank 0 posted %s, rank %d posted %s "
                  "(found by COLLIE_CHECK_ARGS)",
                  (unsigned long long)seq, a, c->rank, b);
}

/* Rank 0's window is in: compare. */
static void chk_on_window(collie_work *w, void *arg) {
    struct cl_check_args *k = arg;
    collie_comm *c = k->c;
    int st = collie_work_result(w);
    const void *val = NULL;
    size_t len = 0;
    if (st == COLLIE_OK) collie_store_work_value(w, &val, &len);
    k->req = NULL;
    if (k->stopped || st == COLLIE_ECANCELED) goto out;
    if (st == COLLIE_ETIMEDOUT) { /* rank 0 is silent: look again */
        chk_get(k);
        goto out;
    }
    if (st != COLLIE_OK || len < 1 || (len - 1) % CHK_REC != 0) {
        CL_CWARN("comm", c, "COLLIE_CHECK_ARGS stops: %s",
                 st != COLLIE_OK ? collie_work_error_message(w) : "a malformed window");
        k->stopped = true;
        goto out;
    }
    const uint8_t *p = val;
    bool complete = p[0] != 0;
    size_t n0 = (len - 1) / CHK_REC, i = 0, checked = 0;
    uint64_t w0 = chk_window(k->mine.v[0].seq);
    for (; checked < k->mine.n && chk_window(k->mine.v[checked].seq) == w0; checked++) {
        const chk_fp *ours = &k->mine.v[checked];
        chk_fp theirs = {0};
        bool found = false;
        for (; i < n0; i++) { /* both in seq order */
            theirs = chk_decode(p + 1 + i * CHK_REC);
            if (theirs.seq >= ours->seq) break;
        }
        found = i < n0 && theirs.seq == ours->seq;
        if (!found && !complete) break; /* rank 0 may post it yet */
        if (!found || !chk_agree(&theirs, ours)) {
            chk_mismatch(k, found ? &theirs : NULL, ours, ours->seq);
            goto out;
        }
    }
    chk_drop_first(&k->mine, checked);
    if (k->mine.n > 0 && chk_window(k->mine.v[0].seq) == w0)
        chk_arm(k, CHK_POLL_MS); /* rank 0's window is partial */
    else
        chk_get(k);
out:
    collie_work_release(w);
    cl_comm_release(c);
}

static void chk_get(struct cl_check_args *k) {
    collie_comm *c = k->c;
    if (k->stopped || k->req || k->mine.n == 0 || (k->timer && evtimer_pending(k->timer, NULL)))
        return;
    char key[160];
    chk_key(c, chk_window(k->mine.v[0].seq), key, sizeof key);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = chk_on_window;
    o.cb_arg = k;
    o.timeout_ms = c->timeout_ms;
    cl_comm_hold(c);
    if (collie_store_post_get(c->store, key, &o, &k->req) != COLLIE_OK) {
        k->req = NULL;
        cl_comm_release(c);
        chk_arm(k, CHK_POLL_MS);
    }
}

/* ---- the loop's side ------------------------------------------------------------- */

static void chk_on_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct cl_check_args *k = arg;
    if (k->stopped) return;
    if (k->c->rank == 0) { /* a partial window has waited long enough */
        if (k->mine.n > 0) chk_publish(k, k->win, k->mine.n, false);
        return;
    }
    chk_get(k);
}

/* New fingerprints are in: rank 0 publishes, the others check. */
static void chk_kick(struct cl_check_args *k) {
    if (k->c->rank == 0) {
        chk_publish_complete(k);
        if (k->mine.n > 0) chk_arm(k, CHK_FLUSH_MS);
    } else {
        chk_get(k);
    }
}

static void chk_take_cmd(cl_cmd *cmd) {
    struct cl_check_args *k = cl_container_of(cmd, struct cl_check_args, cmd);
    collie_comm *c = k->c;
    pthread_mutex_lock(&c->mu);
    chk_list q = k->queue;
    k->queue = (chk_list){0};
    k->cmd_queued = false;
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < q.n && !k->stopped; i++)
        if (!chk_push(&k->mine, &q.v[i])) {
            CL_CWARN("comm", c, "COLLIE_CHECK_ARGS stops: out of memory");
            k->stopped = true;
        }
    free(q.v);
    if (!k->stopped && k->timer) chk_kick(k); /* else: the comm is not ready yet */
    cl_comm_release(c);                       /* the command's reference */
}

/* ---- interface -------------------------------------------------------------------- */

int cl_check_args_init(collie_comm *c) {
    if (!cl_config_get()->check_args || c->size < 2) return COLLIE_OK;
    struct cl_check_args *k = calloc(1, sizeof *k);
    if (!k) return COLLIE_ENOMEM;
    k->c = c;
    k->cmd.fn = chk_take_cmd;
    c->chk = k;
    return COLLIE_OK;
}

void cl_check_args_note(collie_comm *c, const collie_coll_args *a, uint64_t seq) {
    struct cl_check_args *k = c->chk;
    if (!k || a->kind == COLLIE_COLL_SEND || a->kind == COLLIE_COLL_RECV) return;
    chk_fp fp = {.seq = seq,
                 .count = a->count,
                 .root = a->root,
                 .kind = (uint8_t)a->kind,
                 .dtype = (uint8_t)a->dtype,
                 .op = (uint8_t)a->op};
    if (!chk_push(&k->queue, &fp) || k->cmd_queued) return;
    k->cmd_queued = true;
    cl_comm_hold(c);
    if (cl_engine_post_cmd(c->engine, &k->cmd) != COLLIE_OK) {
        k->cmd_queued = false;
        cl_comm_release(c);
    }
}

void cl_check_args_start(collie_comm *c) {
    struct cl_check_args *k = c->chk;
    if (!k || k->timer) return;
    k->timer = event_new(cl_engine_base(c->engine), -1, 0, chk_on_timer, k);
    if (!k->timer) {
        CL_CWARN("comm", c, "COLLIE_CHECK_ARGS off: out of memory");
        k->stopped = true;
        return;
    }
    chk_kick(k); /* what was posted while the comm was being created */
}

void cl_check_args_stop(collie_comm *c) {
    struct cl_check_args *k = c->chk;
    if (!k) return;
    k->stopped = true;
    if (k->req) collie_work_cancel(k->req); /* its callback releases it */
    if (k->timer) event_free(k->timer);
    k->timer = NULL;
}

void cl_check_args_free(collie_comm *c) {
    struct cl_check_args *k = c->chk;
    if (!k) return;
    free(k->queue.v);
    free(k->mine.v);
    free(k);
    c->chk = NULL;
}
