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
 *  - Bounded: each answer is awaited at most DESYNC_MS; a timer of the same
 *    length is the backstop. A rank that does not answer is named as such
 *    (stopped, dead, or its progress loop stuck).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

#define DESYNC_MS 600

typedef struct desync {
    cl_list_node node; /* in the comm's list of reports in progress */
    collie_comm *c;
    collie_work *w;
    uint64_t seq;
    int refs; /* the timer + one per store request in flight (loop only) */
    int waiting;
    int joined; /* works whose deadline passed meanwhile, ended with it */
    bool published;
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

static void desync_publish(desync *d) {
    if (d->published) return;
    d->published = true;
    collie_comm *c = d->c;
    desync_unlink(d);
    if (d->timer && evtimer_pending(d->timer, NULL)) { /* the timer's reference */
        event_del(d->timer);
        d->refs--; /* callers hold their own, so this never frees d */
    }
    char never[700] = "", reached[1200] = "";
    size_t nl = 0, rl = 0;
    for (int r = 0; r < c->size; r++) {
        unsigned long long posted = 0;
        const char *a = d->answer[r];
        bool answered = a[0] != '\0';
        if (answered) sscanf(a, "posted %llu", &posted);
        if (!answered)
            nl += (size_t)snprintf(never + nl, nl < sizeof never ? sizeof never - nl : 0,
                                   "%srank %d (no answer within %d ms: stopped, dead or stuck)",
                                   nl ? ", " : "", r, DESYNC_MS);
        else if (posted < d->seq)
            nl += (size_t)snprintf(never + nl, nl < sizeof never ? sizeof never - nl : 0,
                                   "%srank %d (%s)", nl ? ", " : "", r, a);
        else
            rl += (size_t)snprintf(reached + rl, rl < sizeof reached ? sizeof reached - rl : 0,
                                   "%srank %d (%s)", rl ? ", " : "", r, a);
    }
    char msg[2200];
    snprintf(msg, sizeof msg,
             "deadline of %d ms passed. Desync report: never reached seq %llu: %s; reached it: %s",
             (int)d->w->timeout_ms, (unsigned long long)d->seq, nl ? never : "none",
             rl ? reached : "none");
    cl_coll_work *cw = (cl_coll_work *)d->w;
    cw->explaining = false;
    cl_coll_end(cw, COLLIE_ETIMEDOUT, msg);
    /* the joined works end through the comm's fault (recorded just now by
     * the work's publish, or here should the work have completed after all) */
    if (d->joined > 0)
        cl_comm_fault(c, COLLIE_ETIMEDOUT, "%s seq %llu: %s", d->w->ops->name,
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
    if (collie_work_result(w) == COLLIE_OK) {
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
    CL_INFO("comm", "comm '%s' rank %d: %s seq %llu timed out; asking the other ranks", c->name,
            c->rank, w->ops->name, (unsigned long long)w->seq);
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
