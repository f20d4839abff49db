/*
 * check_args.c — COLLIE_CHECK_ARGS=1: the arguments of every CUDA
 * collective compared across ranks. NCCL runs collectives whose arguments
 * disagree without a word (a sum on one rank and a max on another gives a
 * wrong answer); the TCP transport checks every frame, NCCL has no frames
 * to check. Opt-in: it costs store traffic.
 *
 * Design notes
 *  - Off the launch path: a post only appends the collective's fingerprint
 *    (seq, kind, count, dtype, op, root; the pair-check fields below) to
 *    a queue under the comm's mutex, which it holds already, and queues
 *    one command unless one is queued already. Everything else runs on the
 *    loop, asynchronously.
 *  - Windows of CHK_WINDOW sequence numbers: rank 0 publishes its
 *    fingerprints of window w under "<prefix>chk/<w>" — complete once it has
 *    posted past the window, partial (re-published as it grows) after
 *    CHK_FLUSH_MS without one, so a short burst is checked too. Every other
 *    rank gets the window holding its oldest unchecked fingerprint, compares
 *    each of its own with rank 0's of the same seq, and polls again
 *    (CHK_POLL_MS) while rank 0's window is partial. Two ranks other than 0
 *    that disagree both differ from rank 0, so comparing with rank 0 is
 *    enough for the arguments every rank shares (not for those below).
 *  - A mismatch is the comm's fault (COLLIE_EPROTO), naming seq, both ranks
 *    and what each posted; the policy applies as for any fault (under
 *    ABORT_COMM rank 0 learns it from the abort notice). Works that already
 *    completed keep their status: the check runs behind the GPU.
 *  - A rank 0 that falls silent leaves a get waiting; it is re-posted at the
 *    comm's timeout (the collectives' own deadlines say what is wrong).
 *    Only a lost store ends the checking (logged).
 *  - Each rank-0 window is one key; the keys go with the generation's
 *    (deleted when the comm is destroyed everywhere).
 *  - alltoallv's counts agree pair by pair (what rank r sends p is what p
 *    receives from r), which no comparison with rank 0 alone can see. Each
 *    rank adds its share of a pair sum, sum over its sends of
 *    H(seq, r, p, count) minus sum over its receives of H(seq, p, r, count)
 *    (H: a 32-bit hash at most, small enough that no partial sum overflows),
 *    to "<prefix>chk/a2av/<seq>/sum", then 1 to ".../n": the rank whose add
 *    makes n the comm's size reads the sum, which is 0 when every pair
 *    agrees, fails the comm if not, and deletes both keys. Two requests per
 *    rank and alltoallv, three and two deletes for the last; the pair at
 *    fault is not named (no rank holds both halves).
 *  - send/recv: NCCL matches the k-th send from r to p with p's k-th
 *    receive from r, whatever the tags. The sender sets
 *    "<prefix>chk/p2p/<r>/<p>/<k>" to its count, dtype and tag; the
 *    receiver gets it (re-posted at the comm's timeout, like a window),
 *    compares it with its own, fails the comm on a difference (naming both
 *    halves) and deletes the key. Counters per peer are taken at post time
 *    under the comm's mutex, so k follows the post order NCCL matches by.
 *  - Pair checks in flight are on k->reqs; stop cancels them, and each
 *    holds a comm reference until its callback frees it.
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
    /* pair checks only, never in rank 0's windows */
    int32_t peer;  /* send/recv */
    uint64_t tag;  /* send/recv */
    uint64_t nth;  /* send/recv: the nth send to (receive from) peer, 1-based */
    int64_t pairs; /* alltoallv: this rank's share of the pair sum */
} chk_fp;

typedef struct chk_list {
    chk_fp *v;
    size_t n, cap;
} chk_list;

/* One pair check in flight (send/recv, alltoallv), on k->reqs. */
typedef struct chk_req {
    cl_list_node link;
    struct cl_check_args *k;
    collie_work *w; /* the store request in flight */
    chk_fp fp;
} chk_req;

struct cl_check_args {
    /* under the comm's mu: posted, not yet taken by the loop */
    chk_list queue;
    bool cmd_queued;
    cl_cmd cmd;
    uint64_t *sent, *rcvd; /* per peer: sends and receives posted */
    /* loop */
    collie_comm *c;
    chk_list mine;  /* rank 0: not yet in a complete window; others: not yet checked */
    chk_list pairs; /* pair checks not yet started (the comm was not ready) */
    cl_list reqs;   /* chk_req: pair checks in flight */
    uint64_t win;   /* rank 0: the window being filled */
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
    cl_fault f;
    cl_fault_init(&f, COLLIE_FAULT_MISMATCH, COLLIE_FAULT_VIEW_LOCAL, c->rank);
    cl_fault_add(&f, 0);
    cl_fault_add(&f, c->rank);
    cl_comm_fault_data(c, COLLIE_EPROTO, &f, true,
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

/* ---- pair checks: alltoallv, send/recv ---------------------------------------------- */

static uint64_t chk_mix(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Bits of H for a comm of n ranks: n * n * 2^bits stays below 2^62, so no
 * partial sum of the ranks' shares overflows the store's int64 add. */
static unsigned chk_hash_bits(int n) {
    unsigned lg = 0;
    while (lg < 31 && (1ULL << lg) < (uint64_t)n)
        lg++;
    unsigned bits = 62 - 2 * lg;
    return bits > 32 ? 32 : bits;
}

static int64_t chk_pair_hash(uint64_t seq, size_t from, size_t to, size_t count, unsigned bits) {
    uint64_t h = chk_mix(seq ^ chk_mix(((uint64_t)from << 32 | (uint64_t)to) ^ chk_mix(count)));
    return (int64_t)(h >> (64 - bits));
}

static chk_req *chk_req_new(struct cl_check_args *k, const chk_fp *fp) {
    chk_req *q = calloc(1, sizeof *q);
    if (!q) {
        CL_CWARN("comm", k->c, "COLLIE_CHECK_ARGS stops: out of memory");
        k->stopped = true;
        return NULL;
    }
    q->k = k;
    q->fp = *fp;
    cl_list_push_back(&k->reqs, &q->link);
    return q;
}

static void chk_req_free(chk_req *q) {
    cl_list_remove(&q->link);
    free(q);
}

/* Post q's next store request ('g'et, 's'et or 'a'dd) with callback cb;
 * false (q freed, the checking stopped) if it is refused. */
static bool chk_req_post(chk_req *q, void (*cb)(collie_work *, void *), int which, const char *key,
                         const void *val, size_t len, int64_t delta) {
    collie_comm *c = q->k->c;
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = cb;
    o.cb_arg = q;
    o.timeout_ms = c->timeout_ms;
    cl_comm_hold(c);
    int r;
    switch (which) {
    case 'g': r = collie_store_post_get(c->store, key, &o, &q->w); break;
    case 's': r = collie_store_post_set(c->store, key, val, len, &o, &q->w); break;
    default: r = collie_store_post_add(c->store, key, delta, &o, &q->w); break;
    }
    if (r != COLLIE_OK) {
        q->w = NULL;
        cl_comm_release(c);
        CL_CWARN("comm", c, "COLLIE_CHECK_ARGS stops: %s", collie_last_error());
        q->k->stopped = true;
        chk_req_free(q);
        return false;
    }
    return true;
}

static void chk_delete(collie_comm *c, const char *key) {
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = chk_release_cb;
    o.cb_arg = c;
    collie_work *w;
    cl_comm_hold(c);
    if (collie_store_post_delete(c->store, key, &o, &w) != COLLIE_OK) cl_comm_release(c);
}

/* A pair request ended: true if the check goes on with q; false after
 * freeing q (stopped, cancelled or failed: logged). Only a get (`waits`)
 * may time out and go on: its key is written when the peer posts. */
static bool chk_req_done(chk_req *q, collie_work *w, bool waits, int *st) {
    struct cl_check_args *k = q->k;
    *st = collie_work_result(w);
    q->w = NULL;
    if (k->stopped || *st == COLLIE_ECANCELED) {
        chk_req_free(q);
        return false;
    }
    if (*st != COLLIE_OK && !(waits && *st == COLLIE_ETIMEDOUT)) {
        CL_CWARN("comm", k->c, "COLLIE_CHECK_ARGS stops: %s", collie_work_error_message(w));
        k->stopped = true;
        chk_req_free(q);
        return false;
    }
    return true;
}

static void chk_a2av_key(const collie_comm *c, uint64_t seq, const char *what, char *buf,
                         size_t len) {
    snprintf(buf, len, "%schk/a2av/%llu/%s", c->prefix, (unsigned long long)seq, what);
}

static void chk_a2av_on_sum(collie_work *w, void *arg) {
    chk_req *q = arg;
    collie_comm *c = q->k->c;
    int st;
    int64_t sum = 0;
    if (chk_req_done(q, w, false, &st)) {
        char key[200];
        collie_store_work_int(w, &sum);
        if (sum != 0) {
            q->k->stopped = true;
            cl_fault f; /* which pair, the sum does not say */
            cl_fault_init(&f, COLLIE_FAULT_MISMATCH, COLLIE_FAULT_VIEW_LOCAL, c->rank);
            cl_comm_fault_data(c, COLLIE_EPROTO, &f, true,
                               "mismatched alltoallv counts at seq %llu: what some rank sends a "
                               "peer is not what that peer receives from it (found by "
                               "COLLIE_CHECK_ARGS)",
                               (unsigned long long)q->fp.seq);
        }
        chk_a2av_key(c, q->fp.seq, "sum", key, sizeof key);
        chk_delete(c, key);
        chk_a2av_key(c, q->fp.seq, "n", key, sizeof key);
        chk_delete(c, key);
        chk_req_free(q);
    }
    collie_work_release(w);
    cl_comm_release(c);
}

static void chk_a2av_on_count(collie_work *w, void *arg) {
    chk_req *q = arg;
    collie_comm *c = q->k->c;
    int st;
    int64_t n = 0;
    if (chk_req_done(q, w, false, &st)) {
        collie_store_work_int(w, &n);
        if (n == c->size) { /* every share is in: read the sum */
            char key[200];
            chk_a2av_key(c, q->fp.seq, "sum", key, sizeof key);
            chk_req_post(q, chk_a2av_on_sum, 'a', key, NULL, 0, 0);
        } else {
            chk_req_free(q); /* a later rank's add completes the count */
        }
    }
    collie_work_release(w);
    cl_comm_release(c);
}

static void chk_a2av_on_share(collie_work *w, void *arg) {
    chk_req *q = arg;
    collie_comm *c = q->k->c;
    int st;
    if (chk_req_done(q, w, false, &st)) {
        char key[200];
        chk_a2av_key(c, q->fp.seq, "n", key, sizeof key);
        chk_req_post(q, chk_a2av_on_count, 'a', key, NULL, 0, 1);
    }
    collie_work_release(w);
    cl_comm_release(c);
}

static void chk_p2p_key(const collie_comm *c, int from, int to, uint64_t nth, char *buf,
                        size_t len) {
    snprintf(buf, len, "%schk/p2p/%d/%d/%llu", c->prefix, from, to, (unsigned long long)nth);
}

static void chk_p2p_describe(const chk_fp *fp, char *buf, size_t len) {
    snprintf(buf, len, "%llu x %s (tag %llu)", (unsigned long long)fp->count,
             collie_dtype_name((collie_dtype)fp->dtype), (unsigned long long)fp->tag);
}

/* The sender's half is in (or not yet: look again): compare. */
static void chk_p2p_on_recv(collie_work *w, void *arg) {
    chk_req *q = arg;
    struct cl_check_args *k = q->k;
    collie_comm *c = k->c;
    int st;
    if (chk_req_done(q, w, true, &st)) {
        char key[200];
        chk_p2p_key(c, q->fp.peer, c->rank, q->fp.nth, key, sizeof key);
        const void *val = NULL;
        size_t len = 0;
        unsigned long long count = 0, tag = 0;
        unsigned dtype = 0;
        char text[96] = "";
        if (st == COLLIE_OK) {
            collie_store_work_value(w, &val, &len);
            snprintf(text, sizeof text, "%.*s", (int)(len < 95 ? len : 95), (const char *)val);
        }
        if (st == COLLIE_ETIMEDOUT) { /* the peer has not sent it yet */
            chk_req_post(q, chk_p2p_on_recv, 'g', key, NULL, 0, 0);
        } else if (sscanf(text, "%llu %u %llu", &count, &dtype, &tag) != 3) {
            CL_CWARN("comm", c, "COLLIE_CHECK_ARGS stops: a malformed send record '%s'", text);
            k->stopped = true;
            chk_req_free(q);
        } else {
            chk_fp theirs = {.count = count, .dtype = (uint8_t)dtype, .tag = tag};
            if (count != q->fp.count || dtype != q->fp.dtype || tag != q->fp.tag) {
                char a[96], b[96];
                chk_p2p_describe(&theirs, a, sizeof a);
                chk_p2p_describe(&q->fp, b, sizeof b);
                k->stopped = true;
                cl_fault f;
                cl_fault_init(&f, COLLIE_FAULT_MISMATCH, COLLIE_FAULT_VIEW_LOCAL, c->rank);
                if (q->fp.peer >= 0 && q->fp.peer < c->size) cl_fault_add(&f, q->fp.peer);
                cl_fault_add(&f, c->rank);
                cl_comm_fault_data(c, COLLIE_EPROTO, &f, true,
                                   "mismatched send/recv: send #%llu from rank %d to rank %d is "
                                   "%s, the matching receive on rank %d is %s (found by "
                                   "COLLIE_CHECK_ARGS)",
                                   (unsigned long long)q->fp.nth, q->fp.peer, c->rank, a, c->rank,
                                   b);
            }
            chk_delete(c, key);
            chk_req_free(q);
        }
    }
    collie_work_release(w);
    cl_comm_release(c);
}

static void chk_p2p_on_send(collie_work *w, void *arg) {
    chk_req *q = arg;
    collie_comm *c = q->k->c;
    int st;
    if (chk_req_done(q, w, false, &st)) chk_req_free(q);
    collie_work_release(w);
    cl_comm_release(c);
}

/* Start the pair checks that were waiting for the comm. */
static void chk_pairs_start(struct cl_check_args *k) {
    collie_comm *c = k->c;
    size_t i = 0;
    for (; i < k->pairs.n && !k->stopped; i++) {
        const chk_fp *fp = &k->pairs.v[i];
        chk_req *q = chk_req_new(k, fp);
        if (!q) break;
        char key[200];
        if (fp->kind == COLLIE_COLL_ALLTOALLV) {
            chk_a2av_key(c, fp->seq, "sum", key, sizeof key);
            chk_req_post(q, chk_a2av_on_share, 'a', key, NULL, 0, fp->pairs);
        } else if (fp->kind == COLLIE_COLL_SEND) {
            char val[96];
            int len = snprintf(val, sizeof val, "%llu %u %llu", (unsigned long long)fp->count,
                               (unsigned)fp->dtype, (unsigned long long)fp->tag);
            chk_p2p_key(c, c->rank, fp->peer, fp->nth, key, sizeof key);
            chk_req_post(q, chk_p2p_on_send, 's', key, val, (size_t)len, 0);
        } else {
            chk_p2p_key(c, fp->peer, c->rank, fp->nth, key, sizeof key);
            chk_req_post(q, chk_p2p_on_recv, 'g', key, NULL, 0, 0);
        }
    }
    k->pairs.n = 0;
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
    chk_pairs_start(k);
    if (k->stopped) return;
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
    for (size_t i = 0; i < q.n && !k->stopped; i++) {
        collie_coll_kind kind = (collie_coll_kind)q.v[i].kind;
        bool p2p = kind == COLLIE_COLL_SEND || kind == COLLIE_COLL_RECV;
        if ((!p2p && !chk_push(&k->mine, &q.v[i])) ||
            ((p2p || kind == COLLIE_COLL_ALLTOALLV) && !chk_push(&k->pairs, &q.v[i]))) {
            CL_CWARN("comm", c, "COLLIE_CHECK_ARGS stops: out of memory");
            k->stopped = true;
        }
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
    cl_list_init(&k->reqs);
    k->sent = calloc(2 * (size_t)c->size, sizeof *k->sent);
    if (!k->sent) {
        free(k);
        return COLLIE_ENOMEM;
    }
    k->rcvd = k->sent + c->size;
    c->chk = k;
    return COLLIE_OK;
}

void cl_check_args_note(collie_comm *c, const collie_coll_args *a, uint64_t seq) {
    struct cl_check_args *k = c->chk;
    if (!k) return;
    chk_fp fp = {.seq = seq,
                 .count = a->count,
                 .root = a->root,
                 .kind = (uint8_t)a->kind,
                 .dtype = (uint8_t)a->dtype,
                 .op = (uint8_t)a->op};
    if (a->kind == COLLIE_COLL_SEND || a->kind == COLLIE_COLL_RECV) {
        fp.peer = a->peer;
        fp.tag = a->tag;
        fp.nth = ++(a->kind == COLLIE_COLL_SEND ? k->sent : k->rcvd)[a->peer];
    } else if (a->kind == COLLIE_COLL_ALLTOALLV) { /* the work's copy of the counts */
        unsigned bits = chk_hash_bits(c->size);
        size_t me = (size_t)c->rank;
        for (size_t p = 0; p < (size_t)c->size; p++)
            fp.pairs += chk_pair_hash(seq, me, p, a->sendcounts[p], bits) -
                        chk_pair_hash(seq, p, me, a->recvcounts[p], bits);
    }
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
    chk_req *q;
    cl_list_foreach(&k->reqs, q, chk_req, link) {
        if (q->w) collie_work_cancel(q->w); /* its callback frees q */
    }
    if (k->timer) event_free(k->timer);
    k->timer = NULL;
}

void cl_check_args_free(collie_comm *c) {
    struct cl_check_args *k = c->chk;
    if (!k) return;
    free(k->queue.v);
    free(k->mine.v);
    free(k->pairs.v);
    free(k->sent);
    chk_req *q;
    cl_list_foreach(&k->reqs, q, chk_req, link) { /* none: each held the comm */
        chk_req_free(q);
    }
    free(k);
    c->chk = NULL;
}
