/*
 * fault.c — failure as data: a fault's kind, its rank set and whose view
 * that set is (collie_work_fault, collie_comm_fault), beside the message.
 *
 * Design notes
 *  - Whoever sees a fault and knows who caused it says so (cl_fault on the
 *    work before it ends, or given to cl_comm_fault_data): a peer's
 *    connection closed (the transport's peer_gone service), a desync
 *    report's suspects, a mismatch's two ranks, an application's abort, a
 *    peer's abort notice. Where nobody said, the status stands for a kind
 *    (cl_fault_classify), and the ranks come from peer health: the peers
 *    known dead (or left, or suspected) at that moment. A set is never
 *    guessed: an unknown set is empty.
 *  - The comm keeps its root fault's data beside err_msg, written once
 *    under its mutex before err_status is published; a work failed by the
 *    comm's fault (EABORTED naming the root cause) carries the comm's.
 *  - The abort notice (comm_ctl.c) carries the data as text, "<kind>
 *    <origin> <r,r,...|->", so every rank that learns the fault from the notice
 *    reports the origin's set (view PEER). The parser takes only what the
 *    writer writes: a known kind, ranks in [0, size) ascending.
 *  - Fixed size: the first COLLIE_FAULT_RANKS ranks (ascending) are listed,
 *    nranks counts them all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

static const char *const fault_kind_names[COLLIE_FAULT_NUM_KINDS] = {
    "none",      "peer_dead",  "peer_stuck", "deadline", "mismatch",
    "app_abort", "peer_abort", "peer_left",  "local",
};

const char *collie_fault_kind_name(int kind) {
    return kind >= 0 && kind < COLLIE_FAULT_NUM_KINDS ? fault_kind_names[kind] : "?";
}

void cl_fault_init(cl_fault *f, int kind, int view, int origin) {
    f->kind = (int8_t)kind;
    f->view = (int8_t)view;
    f->origin = origin;
    f->nranks = 0;
}

void cl_fault_add(cl_fault *f, int rank) {
    int n = f->nranks < COLLIE_FAULT_RANKS ? f->nranks : COLLIE_FAULT_RANKS;
    int i = 0;
    while (i < n && f->ranks[i] < rank)
        i++;
    if (i < n && f->ranks[i] == rank) return;
    if (i == COLLIE_FAULT_RANKS) { /* past the listed ones: counted only (it may be there) */
        f->nranks++;
        return;
    }
    int keep = n < COLLIE_FAULT_RANKS ? n : COLLIE_FAULT_RANKS - 1;
    memmove(&f->ranks[i + 1], &f->ranks[i], (size_t)(keep - i) * sizeof f->ranks[0]);
    f->ranks[i] = rank;
    f->nranks++;
}

void cl_fault_classify(collie_comm *c, int status, cl_fault *f) {
    switch (status) {
    case COLLIE_OK: cl_fault_init(f, COLLIE_FAULT_NONE, COLLIE_FAULT_VIEW_LOCAL, -1); return;
    case COLLIE_EPEER: {
        /* the peers health has seen go: dead ones first, else the left,
         * else the unreachable */
        cl_fault_init(f, COLLIE_FAULT_PEER_DEAD, COLLIE_FAULT_VIEW_LOCAL, c->rank);
        cl_health_add_peers(c, f, COLLIE_PEER_DEAD);
        if (f->nranks == 0) {
            cl_health_add_peers(c, f, COLLIE_PEER_LEFT);
            if (f->nranks > 0) f->kind = COLLIE_FAULT_PEER_LEFT;
        }
        if (f->nranks == 0) { /* unreachable, not known dead: a connect failed */
            cl_health_add_peers(c, f, COLLIE_PEER_SUSPECTED);
            if (f->nranks > 0) f->kind = COLLIE_FAULT_PEER_STUCK;
        }
        return;
    }
    case COLLIE_ETIMEDOUT:
        cl_fault_init(f, COLLIE_FAULT_DEADLINE, COLLIE_FAULT_VIEW_LOCAL, c->rank);
        cl_health_add_peers(c, f, COLLIE_PEER_DEAD);
        cl_health_add_peers(c, f, COLLIE_PEER_SUSPECTED);
        return;
    case COLLIE_ECANCELED:
    case COLLIE_EABORTED:
        cl_fault_init(f, COLLIE_FAULT_APP_ABORT, COLLIE_FAULT_VIEW_LOCAL, c->rank);
        return;
    default: /* memory, system, backend, auth, closing, a malformed frame (a
              * disagreement is a mismatch where its finder said so) */
        cl_fault_init(f, COLLIE_FAULT_LOCAL, COLLIE_FAULT_VIEW_LOCAL, c->rank);
        return;
    }
}

void cl_fault_export(const cl_fault *f, int status, collie_fault *out) {
    size_t size = out->size;
    memset(out, 0, size < sizeof *out ? size : sizeof *out);
    out->size = size;
    out->status = status;
    out->origin = -1;
    if (status == COLLIE_OK) return;
    out->kind = f->kind;
    out->view = f->view;
    out->origin = f->origin;
    out->nranks = f->nranks;
    int n = f->nranks < COLLIE_FAULT_RANKS ? f->nranks : COLLIE_FAULT_RANKS;
    size_t room = (size - offsetof(collie_fault, ranks)) / sizeof out->ranks[0]; /* the caller's */
    if ((size_t)n > room) n = (int)room;
    memcpy(out->ranks, f->ranks, (size_t)n * sizeof out->ranks[0]);
}

/* ---- the abort notice's text --------------------------------------------------------- */

int cl_fault_format(const cl_fault *f, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "%d %d ", (int)f->kind, (int)f->origin);
    int n = f->nranks < COLLIE_FAULT_RANKS ? f->nranks : COLLIE_FAULT_RANKS;
    if (n == 0 && at < len) at += (size_t)snprintf(buf + at, len - at, "-");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? "," : "", (int)f->ranks[i]);
    return (int)at;
}

/* A number as the writer writes it: decimal digits, no sign, no leading
 * zero, at most 9 of them. False otherwise. */
static bool fault_number(const char **s, long *out) {
    const char *p = *s;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return false;
    long v = 0;
    int n = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if (++n > 9)
            return false;
        else
            v = v * 10 + (*p - '0');
    *s = p;
    *out = v;
    return true;
}

bool cl_fault_parse(const char *s, int size, cl_fault *f, const char **rest) {
    long kind, origin = -1;
    if (!fault_number(&s, &kind) || *s++ != ' ' || kind <= COLLIE_FAULT_NONE ||
        kind >= COLLIE_FAULT_NUM_KINDS)
        return false;
    if (s[0] == '-' && s[1] == '1')
        s += 2;
    else if (!fault_number(&s, &origin) || origin >= size)
        return false;
    if (*s++ != ' ') return false;
    cl_fault_init(f, (int)kind, COLLIE_FAULT_VIEW_PEER, (int)origin);
    if (*s == '-') {
        s++;
    } else {
        long prev = -1, r;
        for (;;) {
            if (!fault_number(&s, &r) || r <= prev || r >= size) return false; /* as written */
            cl_fault_add(f, (int)r);
            prev = r;
            if (*s != ',') break;
            s++;
        }
    }
    if (*s != ' ' && *s != '\0') return false;
    *rest = *s ? s + 1 : s;
    return true;
}

/* ---- the public reads ---------------------------------------------------------------- */

static const char *fault_arg_error(const void *of, const collie_fault *f) {
    if (!of) return "the comm or work is NULL";
    if (!f) return "fault is NULL";
    return "fault->size is too small (set it to sizeof(collie_fault))";
}

int collie_comm_fault(const collie_comm *c, collie_fault *f) {
    if (!c || !f || f->size < offsetof(collie_fault, ranks)) {
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_fault: %s", fault_arg_error(c, f));
    }
    int st = atomic_load_explicit(&((collie_comm *)c)->err_status, memory_order_acquire);
    cl_fault_export(&c->fault, st, f); /* written before err_status was published */
    return COLLIE_OK;
}

int collie_work_fault(const collie_work *w, collie_fault *f) {
    if (!w || !f || f->size < offsetof(collie_fault, ranks)) {
        return cl_set_last_error(COLLIE_EINVAL, "collie_work_fault: %s", fault_arg_error(w, f));
    }
    if (!cl_work_done(w)) return COLLIE_INPROGRESS;
    /* a failed creation: its comm's fault, once the comm has recorded it
     * (err_status is published after the fault is written; a create ended
     * from outside publishes the work first, and the comm's record follows
     * on the loop: until then, the status alone, below) */
    collie_comm *made = w->status != COLLIE_OK ? cl_comm_create_work_comm(w) : NULL;
    if (made && atomic_load_explicit(&made->err_status, memory_order_acquire) != COLLIE_OK) {
        cl_fault_export(&made->fault, w->status, f);
        return COLLIE_OK;
    }
    if (w->status == COLLIE_OK || !cl_coll_is_work(w)) {
        /* not a collective (store requests): the status alone */
        cl_fault none;
        cl_fault_init(&none,
                      w->status == COLLIE_OK ? COLLIE_FAULT_NONE
                      : w->status == COLLIE_ECANCELED || w->status == COLLIE_EABORTED
                          ? COLLIE_FAULT_APP_ABORT
                      : w->status == COLLIE_ETIMEDOUT ? COLLIE_FAULT_DEADLINE
                      : w->status == COLLIE_EPEER     ? COLLIE_FAULT_PEER_DEAD
                                                      : COLLIE_FAULT_LOCAL,
                      COLLIE_FAULT_VIEW_LOCAL, -1);
        cl_fault_export(&none, w->status, f);
        return COLLIE_OK;
    }
    cl_fault_export(&((const cl_coll_work *)w)->fault, w->status, f);
    return COLLIE_OK;
}
