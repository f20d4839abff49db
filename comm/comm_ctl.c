/*
 * comm_ctl.c — the comm's control channel over the store: abort
 * propagation and desync queries.
 *
 * Design notes
 *  - Messages live under "<prefix>ctl/<k>", k = 1, 2, ... taken from the
 *    counter "<prefix>ctl/n" (add), so any rank can post and every rank
 *    reads every message in the same order. Each rank keeps exactly one
 *    long-lived store request: a get of "<prefix>ctl/<next>" (waits until it
 *    exists), re-armed after each message, after its own bound expires and,
 *    with a delay, after the store connection is lost. Nothing is written
 *    per operation.
 *  - A writer that took k and died before writing it would stall the
 *    channel; a watch that times out therefore checks the counter, and skips
 *    an index only when two watches in a row timed out on it after it was
 *    taken: a writer is given a whole watch bound (CTL_WATCH_MS, more than
 *    the 2 s its write may take) from the moment it is seen to have taken k.
 *    Skipping at the first timeout would lose a message written between that
 *    timeout and the probe, or by a writer slower than one watch bound: an
 *    abort notice missed, or a desync query unanswered (a healthy rank named
 *    as not answering).
 *  - Messages: "abort <rank> <status> <fault> <reason>" (the comm failed
 *    there: fail everything here with that root cause and its data, the
 *    fault as fault.c writes it; the reason travels whole, up to
 *    the comm's message bound CL_COMM_MSG_MAX, so every rank reads the
 *    same words — a desync report is kilobytes), "left <rank>" (that
 *    rank destroyed its comm: peer health; not believed about a rank
 *    linked to this one, which says goodbye on its link), "shrunk <rank>
 *    <set>" (the survivors' shrink left <set> out: comm_shrink_view.c)
 *    and "query <rank> <seq>" (a desync query, see desync.c: answer with
 *    this rank's progress under "<prefix>ctl/<k>/ans/<rank>", k being the
 *    message's index).
 *  - A notice of a death (fault kind peer_dead) is that rank's view of
 *    it, and news here: its ranks become dead in peer health too (a
 *    peer_dead event each, before the comm_faulted one), so a rank with
 *    no link to the dead one and no pidfd on it (another host) hears of
 *    the death as the others do.
 *  - Only comms with an async policy (ABORT_COMM, ABORT_PROCESS) watch;
 *    BLOCKING_WAIT and NONE do nothing in the background (so they hear no
 *    abort, "left" or "shrunk" notice either).
 *  - Every store request here holds a comm reference until its callback.
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

#define CTL_WATCH_MS 5000 /* bound of one watch request before it is re-armed */
#define CTL_RETRY_MS 500  /* after a store error */

static void ctl_watch_post(collie_comm *c);

bool cl_comm_ctl_enabled(const collie_comm *c) {
    return c->policy == COLLIE_POLICY_ABORT_COMM || c->policy == COLLIE_POLICY_ABORT_PROCESS;
}

static void ctl_key(const collie_comm *c, char *buf, size_t len, const char *fmt, uint64_t k) {
    int n = snprintf(buf, len, "%sctl/", c->prefix);
    snprintf(buf + n, len - (size_t)n, fmt, (unsigned long long)k);
}

/* ---- answering queries ------------------------------------------------------ */

/* This rank's progress, for desync answers and reports (loop). */
void cl_comm_progress(collie_comm *c, char *buf, size_t len) {
    cl_coll_work *oldest = NULL, *cw;
    cl_list_foreach(&c->active, cw, cl_coll_work, link) {
        if (cw->args.kind == COLLIE_COLL_SEND || cw->args.kind == COLLIE_COLL_RECV) continue;
        if (!oldest || cw->base.seq < oldest->base.seq) oldest = cw;
    }
    unsigned long long posted = atomic_load(&c->last_posted), done = c->last_done;
    if (oldest) { /* its arguments too: ranks that disagree show it */
        const collie_coll_args *a = &oldest->args;
        char what[128];
        collie_coll_describe(what, sizeof what, a->kind, a->count, collie_dtype_name(a->dtype),
                             collie_redop_name(a->op), a->root);
        snprintf(buf, len, "posted %llu, completed %llu, in seq %llu: %s", posted, done,
                 (unsigned long long)oldest->base.seq, what);
    } else if (!cl_list_empty(&c->waiting))
        snprintf(buf, len, "posted %llu, completed %llu, waiting for creation", posted, done);
    else if (atomic_load_explicit(&c->err_status, memory_order_acquire) != COLLIE_OK)
        snprintf(buf, len, "posted %llu, completed %llu, idle since its comm failed", posted,
                 done); /* not a suspect: it stopped for a fault of its own (desync.c) */
    else
        snprintf(buf, len, "posted %llu, completed %llu, idle", posted, done);
    /* this rank's last refused post, while no collective completed since */
    uint64_t completed = atomic_load_explicit(&c->last_completed, memory_order_relaxed);
    pthread_mutex_lock(&c->mu);
    if (c->refused[0] && completed > c->refused_after) c->refused[0] = '\0';
    size_t at = strlen(buf);
    if (c->refused[0] && at < len) snprintf(buf + at, len - at, ", refused: %s", c->refused);
    pthread_mutex_unlock(&c->mu);
}

static void ctl_release_cb(collie_work *w, void *arg) {
    collie_work_release(w);
    cl_comm_release(arg);
}

static void ctl_answer(collie_comm *c, uint64_t k) {
    char key[200], val[200];
    ctl_key(c, key, sizeof key, "%llu/ans/", k);
    size_t n = strlen(key);
    snprintf(key + n, sizeof key - n, "%d", c->rank);
    cl_comm_progress(c, val, sizeof val);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = ctl_release_cb;
    o.cb_arg = c;
    o.timeout_ms = 2000;
    collie_work *w;
    cl_comm_hold(c);
    if (collie_store_post_set(c->store, key, val, strlen(val), &o, &w) != COLLIE_OK)
        cl_comm_release(c);
}

/* ---- handling messages -------------------------------------------------------- */

/* msg: the value as stored, whole (a reason is kept to its last character:
 * the comm's message bound is the only one) */
static void ctl_handle(collie_comm *c, const char *msg, size_t len, uint64_t k) {
    if (len > CL_COMM_MSG_MAX + 64) len = CL_COMM_MSG_MAX + 64; /* a message we never write */
    char *buf = malloc(len + 1);
    if (!buf) {
        CL_CWARN("comm", c, "no memory for control message %llu", (unsigned long long)k);
        return;
    }
    memcpy(buf, msg, len);
    buf[len] = '\0';
    int rank = -1, status = 0, off = 0;
    unsigned long long seq = 0;
    if (sscanf(buf, "abort %d %d %n", &rank, &status, &off) == 2 && off > 0 && rank >= 0 &&
        rank < c->size) {
        const char *why = buf + off;
        cl_fault f;
        if (!cl_fault_parse(buf + off, c->size, &f, &why)) /* not ours: the words alone */
            cl_fault_init(&f, COLLIE_FAULT_PEER_ABORT, COLLIE_FAULT_VIEW_PEER, rank);
        if (f.origin < 0) f.origin = rank;
        if (f.kind == COLLIE_FAULT_APP_ABORT) f.kind = COLLIE_FAULT_PEER_ABORT; /* its app's */
        char prefix[32];
        snprintf(prefix, sizeof prefix, "rank %d ", rank);
        if (rank != c->rank && f.kind == COLLIE_FAULT_PEER_DEAD) /* see the design notes */
            for (int i = 0; i < f.nranks && i < COLLIE_FAULT_RANKS; i++)
                if (cl_health_process_alive(c, f.ranks[i]) != 1) /* same host: its pidfd says */
                    cl_health_peer_gone(c, f.ranks[i], COLLIE_PEER_DEAD);
        if (rank != c->rank) {                             /* not our own */
            if (strncmp(why, prefix, strlen(prefix)) == 0) /* it names its rank already */
                cl_comm_fault_data(c, COLLIE_EABORTED, &f, false, "%s", why);
            else
                cl_comm_fault_data(c, COLLIE_EABORTED, &f, false, "rank %d failed: %s", rank, why);
        }
    } else if (sscanf(buf, "left %d", &rank) == 1) {
        /* a rank with a link to us says goodbye on it (BYE, in order with
         * its frames): the notice is for those without one, and a notice
         * about a linked rank, which anyone writing the store could post,
         * is not believed */
        if (rank != c->rank && !cl_health_linked(c, rank))
            cl_health_peer_gone(c, rank, COLLIE_PEER_LEFT);
    } else if (sscanf(buf, "shrunk %d %n", &rank, &off) == 1 && off > 0 && rank >= 0 &&
               rank < c->size) {
        cl_comm_shrink_notice(c, rank, buf + off, strlen(buf + off));
    } else if (sscanf(buf, "query %d %llu", &rank, &seq) == 2) {
        if (rank != c->rank) ctl_answer(c, k);
    } else {
        CL_CWARN("comm", c, "ignoring unknown control message '%.200s'", buf);
    }
    free(buf);
}

static void ctl_retry_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    collie_comm *c = arg;
    ctl_watch_post(c);
}

static void ctl_retry_later(collie_comm *c) {
    if (!c->ctl.retry_ev)
        c->ctl.retry_ev = event_new(cl_engine_base(c->engine), -1, 0, ctl_retry_cb, c);
    struct timeval tv = {0, CTL_RETRY_MS * 1000};
    if (c->ctl.retry_ev) event_add(c->ctl.retry_ev, &tv);
}

static void ctl_on_count(collie_work *w, void *arg) {
    collie_comm *c = arg;
    int64_t n = 0;
    if (collie_work_result(w) == COLLIE_OK) collie_store_work_int(w, &n);
    collie_work_release(w);
    c->ctl.probe = NULL;
    if (!c->ctl.stopped) {
        if ((uint64_t)n < c->ctl.next) {
            c->ctl.taken_unwritten = 0; /* nothing taken: just quiet */
        } else if (c->ctl.taken_unwritten != c->ctl.next) {
            c->ctl.taken_unwritten = c->ctl.next; /* its writer gets one more watch bound */
        } else {
            cl_log_comm(CL_LOG_WARN, "comm", c->name, -1,
                        "control message %llu was taken but not written within %d ms; "
                        "skipping it",
                        (unsigned long long)c->ctl.next, CTL_WATCH_MS);
            c->ctl.taken_unwritten = 0;
            c->ctl.next++;
        }
        ctl_watch_post(c);
    }
    cl_comm_release(c);
}

static void ctl_on_msg(collie_work *w, void *arg) {
    collie_comm *c = arg;
    int st = collie_work_result(w);
    c->ctl.watch = NULL;
    if (c->ctl.stopped || st == COLLIE_ECANCELED || st == COLLIE_ECLOSED) {
        collie_work_release(w);
        cl_comm_release(c);
        return;
    }
    if (st == COLLIE_OK) {
        const void *val;
        size_t len;
        collie_store_work_value(w, &val, &len);
        uint64_t k = c->ctl.next++;
        CL_CDEBUG("comm", c, "control message %llu: %.*s", (unsigned long long)k, (int)len,
                  (const char *)val);
        ctl_handle(c, val, len, k);
        if (!c->ctl.stopped) ctl_watch_post(c);
    } else if (st == COLLIE_ETIMEDOUT) {
        /* nothing new, or a writer died between taking k and writing it */
        char key[160];
        ctl_key(c, key, sizeof key, "n", 0);
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.cb = ctl_on_count;
        o.cb_arg = c;
        o.timeout_ms = 2000;
        cl_comm_hold(c);
        if (collie_store_post_add(c->store, key, 0, &o, &c->ctl.probe) != COLLIE_OK) {
            cl_comm_release(c);
            ctl_retry_later(c);
        }
    } else {
        ctl_retry_later(c); /* the store connection is being re-made */
    }
    collie_work_release(w);
    cl_comm_release(c);
}

static void ctl_watch_post(collie_comm *c) {
    if (c->ctl.stopped || c->ctl.watch) return;
    char key[160];
    ctl_key(c, key, sizeof key, "%llu", c->ctl.next);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = ctl_on_msg;
    o.cb_arg = c;
    o.timeout_ms = CTL_WATCH_MS;
    cl_comm_hold(c);
    if (collie_store_post_get(c->store, key, &o, &c->ctl.watch) != COLLIE_OK) {
        c->ctl.watch = NULL;
        cl_comm_release(c);
        ctl_retry_later(c);
    }
}

void cl_comm_ctl_start(collie_comm *c) {
    if (!cl_comm_ctl_enabled(c)) return;
    c->ctl.next = 1;
    ctl_watch_post(c);
}

void cl_comm_ctl_stop(collie_comm *c) {
    c->ctl.stopped = true;
    if (c->ctl.watch) collie_work_cancel(c->ctl.watch);
    if (c->ctl.probe) collie_work_cancel(c->ctl.probe);
    if (c->ctl.retry_ev) {
        event_free(c->ctl.retry_ev);
        c->ctl.retry_ev = NULL;
    }
}

/* ---- sending ---------------------------------------------------------------------- */

typedef struct ctl_send {
    collie_comm *c;
    void (*done)(void *arg, int status, uint64_t k);
    void *done_arg;
    char msg[]; /* whole */
} ctl_send;

static void ctl_send_finish(ctl_send *s, int status, uint64_t k) {
    collie_comm *c = s->c;
    if (s->done) s->done(s->done_arg, status, k);
    pthread_mutex_lock(&c->mu);
    c->ctl.sending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    free(s);
    cl_comm_release(c);
}

static void ctl_on_set(collie_work *w, void *arg) {
    ctl_send *s = arg;
    int st = collie_work_result(w);
    uint64_t k = collie_work_tag(w);
    collie_work_release(w);
    ctl_send_finish(s, st, k);
}

static void ctl_on_index(collie_work *w, void *arg) {
    ctl_send *s = arg;
    collie_comm *c = s->c;
    int64_t k = 0;
    int st = collie_work_result(w);
    if (st == COLLIE_OK) collie_store_work_int(w, &k);
    collie_work_release(w);
    if (st != COLLIE_OK) {
        CL_CWARN("comm", c, "could not post a control message: %s", collie_strerror(st));
        ctl_send_finish(s, st, 0);
        return;
    }
    char key[160];
    ctl_key(c, key, sizeof key, "%llu", (uint64_t)k);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = ctl_on_set;
    o.cb_arg = s;
    o.timeout_ms = 2000;
    o.tag = (uint64_t)k;
    collie_work *sw;
    st = collie_store_post_set(c->store, key, s->msg, strlen(s->msg), &o, &sw);
    if (st != COLLIE_OK) ctl_send_finish(s, st, 0);
}

int cl_comm_ctl_send(collie_comm *c, const char *msg, void (*done)(void *, int, uint64_t),
                     void *done_arg) {
    size_t len = strlen(msg);
    ctl_send *s = calloc(1, sizeof *s + len + 1);
    if (!s) {
        if (done) done(done_arg, COLLIE_ENOMEM, 0); /* `done` runs once, whatever happens */
        return COLLIE_ENOMEM;
    }
    s->c = c;
    memcpy(s->msg, msg, len + 1);
    s->done = done;
    s->done_arg = done_arg;
    cl_comm_hold(c);
    pthread_mutex_lock(&c->mu);
    c->ctl.sending++;
    pthread_mutex_unlock(&c->mu);
    char key[160];
    ctl_key(c, key, sizeof key, "n", 0);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = ctl_on_index;
    o.cb_arg = s;
    o.timeout_ms = 2000;
    collie_work *w;
    int r = collie_store_post_add(c->store, key, 1, &o, &w);
    if (r != COLLIE_OK) ctl_send_finish(s, r, 0);
    return r;
}

bool cl_comm_ctl_publish_abort(collie_comm *c, int status, const char *reason,
                               void (*done)(void *, int, uint64_t), void *done_arg) {
    if (c->prefix[0] == '\0' || c->ctl.abort_published) return false; /* never created, or done */
    c->ctl.abort_published = true;
    char msg[CL_COMM_MSG_MAX + 1024], data[800];
    cl_fault_format(&c->fault, data, sizeof data); /* the root fault's: reason is its message */
    snprintf(msg, sizeof msg, "abort %d %d %s %s", c->rank, status, data, reason);
    cl_comm_ctl_send(c, msg, done, done_arg);
    return true;
}
