/*
 * desync.c — the desync report: when a collective's deadline passes, ask
 * every rank how far it got before failing the work, so the error names
 * the ranks that never reached that sequence number.
 *
 * Design notes
 *  - Runs on the loop from the work's cancel hook at its deadline. The work
 *    is not claimed: the transport may still complete it, and a waiter or
 *    cancel may still end it from its own thread (the report then ends
 *    nothing). The query goes out on the control channel, and every other
 *    rank's engine answers with its progress under "<prefix>ctl/<k>/ans/<r>".
 *  - The report names a first suspect when the answers allow it (this
 *    rank if it saw the deadline over a second late; else a rank that did
 *    not answer; else the idle rank behind the oldest collective anyone is
 *    blocked in, but never one idle since its own comm failed: its
 *    deadline came first, it is a victim) and marks the ranks blocked
 *    behind it as waiting on it: a rank held up by the suspect is not
 *    blamed beside it.
 *  - Bounded: each answer is awaited at most DESYNC_MS; a timer of the same
 *    length is the backstop. A rank that does not answer is named as such
 *    (stopped, dead, or its progress loop stuck). When the query or an
 *    answer's read failed at the store itself (not by a rank's silence),
 *    the unanswered ranks are not suspects: the fault's data then comes
 *    from peer health alone (fault.c).
 *  - An answer carries the rank's last refused post while no collective
 *    completed after it (coll.c, cl_comm_progress), so a rank that never
 *    posted the collective because its post was refused says why.
 *  - Only comms whose policy watches the control channel do this; others
 *    fail the work at the deadline as usual.
 *  - One query per comm per deadline event: a collective whose deadline
 *    passes while a report is in progress joins it (a deep queue expiring
 *    at once asked once per work before: thousands of control messages).
 *    The report ends its own work and then faults the comm on behalf of
 *    the joined ones, which the comm fails with the report as root cause.
 *  - A CUDA work waits for the report like any other (its kernel keeps
 *    running), then is ended with the report as its message through
 *    cl_coll_end (coll_cancel.c): published once the abort quiesced the GPU.
 */
#include <event2/event.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

#define DESYNC_MS      600
#define DESYNC_LATE_MS 1000 /* a deadline seen this late: this rank was held up */

typedef struct desync {
    cl_list_node node; /* in the comm's list of reports in progress */
    collie_comm *c;
    collie_work *w;
    uint64_t seq;
    int refs; /* the timer + one per store request in flight (loop only) */
    int waiting;
    int joined;      /* works whose deadline passed meanwhile, ended with it */
    int64_t late_ms; /* how long after the deadline the loop saw it */
    bool published;
    bool store_trouble; /* the query or an answer's read failed at the store, not by silence */
    struct event *timer;
    char (*answer)[200]; /* per rank; "" = none */
} desync;

static void desync_unlink(desync *d) { cl_list_remove(&d->node); }

static void desync_release(desync *d) {
    if (--d->refs > 0) return;
    desync_unlink(d);
    if (d->timer) event_free(d->timer);
    free(d->answer);
    collie_work_release(d->w);
    cl_comm_release(d->c);
    free(d);
}

/* One rank's answer, parsed: "posted P, completed C, in seq S: <op>" (S:
 * the oldest collective it has in flight) or "..., idle", either followed
 * by ", refused: <op>: <why>" (its last refused post: cl_comm_progress). */
typedef struct rank_state {
    bool answered, in_flight;
    bool failed; /* idle since its comm failed: stopped by a fault of its own */
    unsigned long long posted, seq;
    char what[128]; /* "allreduce of 4 x int32 (sum)" of seq, or "" */
} rank_state;

static rank_state rank_state_of(const char *a) {
    rank_state st = {.answered = a[0] != '\0'};
    if (!st.answered) return st;
    sscanf(a, "posted %llu", &st.posted);
    const char *refused = strstr(a, ", refused: ");
    const char *in = strstr(a, " seq ");
    if (refused && in > refused) in = NULL;
    st.in_flight = strstr(a, ", in ") && in && sscanf(in, " seq %llu", &st.seq) == 1;
    const char *failed = strstr(a, ", idle since its comm failed");
    st.failed = failed && (!refused || failed < refused);
    const char *what = in ? strstr(in, ": ") : NULL;
    if (st.in_flight && what) { /* up to the refusal, if any */
        what += 2;
        int n = refused && refused > what ? (int)(refused - what) : (int)strlen(what);
        snprintf(st.what, sizeof st.what, "%.*s", n, what);
    }
    return st;
}

/* The first suspect: this rank, if its loop saw the deadline over a
 * second after it passed (it was stopped or starved: what the others say
 * now comes after the fact); else a rank that did not answer; else the
 * idle rank furthest behind the oldest collective anyone is blocked in
 * (every rank in that collective waits for it), unless it is idle because
 * its comm failed (a victim whose deadline came first). -1: the answers name
 * nobody (every rank is inside the collective: the transport or the
 * device is stuck). */
static int desync_suspect(const desync *d, const rank_state *st, int *n_silent) {
    const collie_comm *c = d->c;
    int suspect = -1;
    *n_silent = 0;
    for (int r = 0; r < c->size; r++)
        if (!st[r].answered && (*n_silent)++ == 0) suspect = r;
    if (d->late_ms >= DESYNC_LATE_MS) return c->rank; /* the answers came after the fact */
    if (suspect >= 0) return suspect;
    unsigned long long oldest = ULLONG_MAX;
    for (int r = 0; r < c->size; r++)
        if (st[r].in_flight && st[r].seq < oldest) oldest = st[r].seq;
    /* a rank idle since its own comm failed (its deadline came first, on a
     * slower clock) is blocked like the others, not their cause */
    for (int r = 0; r < c->size; r++)
        if (!st[r].in_flight && !st[r].failed && st[r].posted < oldest &&
            (suspect < 0 || st[r].posted < st[suspect].posted))
            suspect = r;
    return suspect;
}

/* Ranks inside the same collective with different arguments: the cause
 * (frames between them would have said so; these never exchanged one).
 * True (f: mismatch, the two ranks) if there are. */
/* Do two ranks' descriptions of one collective disagree? Every argument
 * must agree, except alltoallv's count (what each rank sends: "alltoallv
 * of N x <dtype>"), which differs by design. */
static bool desync_whats_differ(const char *a, const char *b) {
    static const char a2av[] = "alltoallv of ";
    size_t n = sizeof a2av - 1;
    if (strncmp(a, a2av, n) == 0 && strncmp(b, a2av, n) == 0) {
        const char *ta = strstr(a, " x "), *tb = strstr(b, " x ");
        return !ta || !tb || strcmp(ta, tb) != 0;
    }
    return strcmp(a, b) != 0;
}

static bool desync_disagreement(const desync *d, const rank_state *st, char *buf, size_t len,
                                cl_fault *f) {
    buf[0] = '\0';
    for (int r = 0; r < d->c->size; r++)
        for (int q = r + 1; q < d->c->size; q++)
            if (st[r].in_flight && st[q].in_flight && st[r].seq == st[q].seq && st[r].what[0] &&
                st[q].what[0] && desync_whats_differ(st[r].what, st[q].what)) {
                snprintf(buf, len, "ranks disagree on seq %llu: rank %d posted %s, rank %d %s; ",
                         st[r].seq, r, st[r].what, q, st[q].what);
                cl_fault_init(f, COLLIE_FAULT_MISMATCH, COLLIE_FAULT_VIEW_LOCAL, d->c->rank);
                cl_fault_add(f, r);
                cl_fault_add(f, q);
                return true;
            }
    return false;
}

/* The report's fault data: the suspects it names. Silent ranks are stuck
 * (dead, or left, where peer health knows it of them all); a late loop is
 * this rank; an idle suspect is the deadline's rank; none named: the
 * deadline's, no ranks. */
static void desync_fault(const desync *d, const rank_state *st, int sus, cl_fault *f) {
    collie_comm *c = d->c;
    if (d->store_trouble && sus != c->rank) return; /* silence says nothing: health alone */
    cl_fault_init(f, COLLIE_FAULT_DEADLINE, COLLIE_FAULT_VIEW_LOCAL, c->rank);
    if (sus < 0) return;
    if (sus == c->rank || st[sus].answered) {
        cl_fault_add(f, sus);
        return;
    }
    int dead = 0, left = 0, silent = 0;
    for (int r = 0; r < c->size; r++)
        if (!st[r].answered) {
            cl_fault_add(f, r);
            silent++;
            dead += cl_health_state(c, r) == COLLIE_PEER_DEAD;
            left += cl_health_state(c, r) == COLLIE_PEER_LEFT;
        }
    /* stuck unless health knows better of every silent rank */
    f->kind = dead + left < silent ? COLLIE_FAULT_PEER_STUCK
              : left == silent     ? COLLIE_FAULT_PEER_LEFT
                                   : COLLIE_FAULT_PEER_DEAD;
}

static void desync_message(const desync *d, char *msg, size_t len, cl_fault *f) {
    const collie_comm *c = d->c;
    rank_state *st = calloc((size_t)c->size, sizeof *st);
    cl_fault_classify(d->c, COLLIE_ETIMEDOUT, f);
    if (!st) {
        snprintf(msg, len, "deadline of %d ms passed (no memory for the desync report)",
                 (int)d->w->timeout_ms);
        return;
    }
    for (int r = 0; r < c->size; r++)
        st[r] = rank_state_of(d->answer[r]);
    int silent, sus = desync_suspect(d, st, &silent);
    char first[300] = "", disagree[400];
    if (!desync_disagreement(d, st, disagree, sizeof disagree, f)) desync_fault(d, st, sus, f);
    if (sus == c->rank && d->late_ms >= DESYNC_LATE_MS)
        snprintf(first, sizeof first,
                 "first suspect: this rank (%d): its progress loop saw the deadline %lld ms after "
                 "it passed (the process was stopped or starved); ",
                 sus, (long long)d->late_ms);
    else if (sus >= 0 && !st[sus].answered && d->store_trouble)
        snprintf(first, sizeof first,
                 "the query or its answers did not get through the store: %d ranks unheard "
                 "(cut off from the store, stopped, dead or stuck); ",
                 silent);
    else if (sus >= 0 && !st[sus].answered && silent > 1)
        snprintf(first, sizeof first,
                 "first suspects: %d ranks gave no answer within %d ms (stopped, dead or stuck); ",
                 silent, DESYNC_MS);
    else if (sus >= 0 && !st[sus].answered)
        snprintf(first, sizeof first,
                 "first suspect: rank %d (no answer within %d ms: stopped, dead or stuck); ", sus,
                 DESYNC_MS);
    else if (sus >= 0)
        snprintf(first, sizeof first, "first suspect: rank %d (idle: it never posted seq %llu); ",
                 sus, st[sus].posted + 1);
    char never[1200] = "", reached[1200] = "";
    size_t nl = 0, rl = 0;
    for (int r = 0; r < c->size; r++) {
        bool behind = !st[r].answered || st[r].posted < d->seq;
        char *buf = behind ? never : reached;
        size_t *at = behind ? &nl : &rl, cap = behind ? sizeof never : sizeof reached;
        const char *sep = *at ? ", " : "";
        size_t room = *at < cap ? cap - *at : 0;
        if (!st[r].answered)
            *at += (size_t)snprintf(buf + *at, room, "%srank %d (no answer)", sep, r);
        else if (behind && sus >= 0 && r != sus && st[r].in_flight)
            *at += (size_t)snprintf(buf + *at, room, "%srank %d (%s; waiting on rank %d)", sep, r,
                                    d->answer[r], sus);
        else
            *at += (size_t)snprintf(buf + *at, room, "%srank %d (%s)", sep, r, d->answer[r]);
    }
    /* a late rank is the one behind: "nobody" would send the reader astray */
    const char *none = sus == c->rank ? "no other rank" : "none";
    char line[200] = ""; /* a membership change made this comm: the ranks are new */
    if (c->line.how)
        snprintf(line, sizeof line, " (comm '%.72s' was made by a %s of '%.72s' generation %llu)",
                 c->name, c->line.how, c->line.from, (unsigned long long)c->line.from_gen);
    snprintf(msg, len,
             "deadline of %d ms passed. Desync report: %s%snever reached seq %llu: %s; "
             "reached it: %s%s",
             (int)d->w->timeout_ms, disagree, first, (unsigned long long)d->seq, nl ? never : none,
             rl ? reached : "none", line);
    free(st);
}

static void desync_publish(desync *d) {
    if (d->published) return;
    d->published = true;
    collie_comm *c = d->c;
    desync_unlink(d);
    if (d->timer && evtimer_pending(d->timer, NULL)) { /* the timer's reference */
        event_del(d->timer);
        d->refs--; /* callers hold their own, so this never frees d */
    }
    char msg[3400]; /* first + disagree + never + reached + the frame */
    cl_coll_work *cw = (cl_coll_work *)d->w;
    cl_fault f;
    desync_message(d, msg, sizeof msg, &f);
    cw->explaining = false;
    if (cw->caller_started && cw->bc->ops->cancel) /* a device to quiet first: its own end */
        cl_coll_end(cw, COLLIE_ETIMEDOUT, msg);
    else
        cl_coll_finish_fault(&cw->base, COLLIE_ETIMEDOUT, &f, "%s", msg);
    /* the joined works end through the comm's fault (recorded just now by
     * the work's publish, or here should the work have completed after all) */
    if (d->joined > 0)
        cl_comm_fault_data(c, COLLIE_ETIMEDOUT, &f, true, "%s seq %llu: %s", d->w->ops->name,
                           (unsigned long long)d->seq, msg);
}

/* The comm's report still collecting answers, if any. */
static desync *desync_in_progress(collie_comm *c) {
    desync *d;
    cl_list_foreach(&c->desyncs, d, desync, node) if (!d->published) return d;
    return NULL;
}

static void desync_on_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    desync *d = arg;
    desync_publish(d);
    desync_release(d);
}

typedef struct desync_get {
    desync *d;
    int rank;
} desync_get;

static void desync_on_answer(collie_work *w, void *arg) {
    desync_get *g = arg;
    desync *d = g->d;
    int st = collie_work_result(w);
    if (st != COLLIE_OK && st != COLLIE_ETIMEDOUT) d->store_trouble = true;
    if (st == COLLIE_OK) {
        const void *val;
        size_t len;
        collie_store_work_value(w, &val, &len);
        snprintf(d->answer[g->rank], sizeof d->answer[0], "%.*s", (int)len, (const char *)val);
    }
    collie_work_release(w);
    free(g);
    if (--d->waiting == 0) desync_publish(d);
    desync_release(d);
}

/* The query is out as control message k: collect the answers. */
static void desync_on_sent(void *arg, int status, uint64_t k) {
    desync *d = arg;
    collie_comm *c = d->c;
    if (status != COLLIE_OK) d->store_trouble = true;
    if (status == COLLIE_OK) {
        for (int r = 0; r < c->size; r++) {
            if (r == c->rank) continue;
            desync_get *g = malloc(sizeof *g);
            if (!g) continue;
            g->d = d;
            g->rank = r;
            char key[200];
            snprintf(key, sizeof key, "%sctl/%llu/ans/%d", c->prefix, (unsigned long long)k, r);
            collie_post_opts o = COLLIE_POST_OPTS_INIT;
            o.cb = desync_on_answer;
            o.cb_arg = g;
            o.timeout_ms = DESYNC_MS;
            collie_work *gw;
            d->refs++;
            d->waiting++;
            if (collie_store_post_get(c->store, key, &o, &gw) != COLLIE_OK) {
                d->refs--;
                d->waiting--;
                free(g);
            }
        }
    }
    if (d->waiting == 0) desync_publish(d); /* nobody to wait for */
    desync_release(d);
}

bool cl_desync_start(cl_coll_work *cw) {
    collie_work *w = &cw->base;
    collie_comm *c = cw->comm;
    bool p2p = cw->args.kind == COLLIE_COLL_SEND || cw->args.kind == COLLIE_COLL_RECV;
    if (p2p || c->size == 1 || !cl_comm_ctl_enabled(c) || atomic_load(&c->state) != CL_COMM_READY)
        return false;
    desync *d = desync_in_progress(c);
    if (d) { /* one query per deadline event: this work ends with that report */
        cw->explaining = true;
        d->joined++;
        return true;
    }
    d = calloc(1, sizeof *d);
    if (d) d->answer = calloc((size_t)c->size, sizeof *d->answer);
    if (!d || !d->answer) {
        free(d);
        return false;
    }
    cw->explaining = true;
    d->c = c;
    d->w = w;
    d->seq = w->seq;
    d->late_ms = (cl_now_ns() - w->deadline_ns) / CL_NS_PER_MS;
    cl_list_push_front(&c->desyncs, &d->node);
    cl_comm_hold(c);
    collie_work_hold(w);
    cl_comm_progress(c, d->answer[c->rank], sizeof d->answer[0]);
    d->timer = event_new(cl_engine_base(c->engine), -1, 0, desync_on_timer, d);
    struct timeval tv = {0, (DESYNC_MS + 100) * 1000};
    d->refs = 1; /* the timer */
    if (d->timer) event_add(d->timer, &tv);
    char msg[96];
    snprintf(msg, sizeof msg, "query %d %llu", c->rank, (unsigned long long)w->seq);
    d->refs++;
    /* a failed send is reported through desync_on_sent as well */
    cl_comm_ctl_send(c, msg, desync_on_sent, d);
    if (!d->timer) { /* no timer: publish what we have when the sends end */
        desync_publish(d);
        desync_release(d);
    }
    CL_CINFO("comm", c, "%s seq %llu timed out; asking the other ranks", w->ops->name,
             (unsigned long long)w->seq);
    return true;
}

/* Publish every report in progress with what it has (loop): the comm is
 * going away and its works must complete now. */
void cl_desync_flush(collie_comm *c) {
    desync *d;
    while ((d = cl_list_first(&c->desyncs, desync, node))) {
        d->refs++;
        desync_publish(d); /* unlinks d */
        desync_release(d);
    }
}
