/*
 * comm_shrink.c — collie_comm_shrink: the survivors of a failed comm agree
 * on the failed set and make a comm of the others (the "comm.shrink" work).
 *
 * Design notes
 *  - The agreement runs through the store, which must outlive the ranks,
 *    under "<old prefix>shrink<attempt>/": each survivor writes its
 *    proposal (the ranks it knows failed: its comm's fault, peers dead,
 *    left or suspected) to "prop/<rank>" and reads the proposal of every
 *    rank it does not know failed (one get each, pipelined). Once each is
 *    read or known failed, it proposes the union of all it read as the
 *    decision: compare_set("decided", "" -> set). The first write wins
 *    and every survivor reads the winner (the compare_set returns the
 *    value stored; a rank still reading also gets it from its own get of
 *    "decided"), so all members agree on one set, whatever their views.
 *  - Failures while it runs: every millisecond (a timer; shrink is rare)
 *    the rank looks at its peers' health again; a rank that died, left or
 *    became suspected meanwhile is no longer waited for, and what it knows
 *    when it decides joins the set (a rank read before it died). A rank that has
 *    not proposed by the deadline is left out as suspected. A rank that
 *    took part but that anyone reported failed is left out too (slow ranks
 *    are excluded, not waited for): the set is a union, never a vote.
 *  - A rank that finds itself in the decision fails with ENOTMEMBER and an
 *    EXCLUDED event; the new comm's rank 0 also posts "shrunk <from>
 *    <set>" on the old comm's control channel, so a rank that never calls
 *    shrink (stopped, then resumed) learns it is out (comm_ctl.c calls
 *    cl_comm_shrink_notice): an EXCLUDED event, ENOTMEMBER on its posts.
 *  - The old comm is aborted first if it had not failed (a revoke, as
 *    ncclCommRevoke: the others' works fail and they shrink too); once
 *    decided, the agreed set becomes its fault (view AGREED), and the new
 *    comm is made only after every work of the old one has ended (DRAIN).
 *  - One shrink of a comm at a time, and none once one succeeded (the comm
 *    is superseded: ESTATE naming its successor). Attempts are numbered in
 *    step across the members: the number moves on only when an attempt's
 *    new comm was being made and failed, which every member sees (the
 *    rendezvous's poisoned generation); a call refused, cancelled, or
 *    failed before that keeps it, so a retry meets the others' attempt.
 *  - The new comm ("<name>.shr<generation>", "e<attempt>" after a first
 *    attempt) goes through the usual rendezvous under its own name, so its
 *    generations never mix with the old name's: a later create of the old
 *    name joins that name's next generation as before. The old comm and
 *    the decision go with it: a backend with a shrink hook builds the new
 *    comm's state from the old one's (NCCL: ncclCommShrink), the others
 *    make theirs afresh. Every member hands the decision to the
 *    rendezvous as its member list (STEP_SIZE compares them), so members
 *    that disagree could never form a comm. While it
 *    runs, a member found dead or left (the old comm's health) cancels the
 *    rendezvous (cl_comm_create_withdraw), which poisons its generation:
 *    every member fails at once with EABORTED, and shrinking the old comm
 *    again starts attempt + 1. Unless every member had passed the
 *    rendezvous already: then the new comm stands for all of them (the
 *    generation's outcome is one compare_set), and the death is the new
 *    comm's fault, to shrink in turn.
 *  - A store whose connection is lost (its server died, with a rank that
 *    hosted it, say) fails the shrink at once with EPEER saying it needs a
 *    store that outlives the ranks: the client would only retry until the
 *    deadline.
 *  - The work ends itself (no cancel hook: a cancel or engine shutdown
 *    finishes it at once); its detach, on the loop, cancels what is still
 *    in flight. Store callbacks hold a reference on the work and drop
 *    their result once it is done; a new comm that was made but never
 *    taken is destroyed (destroy_post) when the work is freed.
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"
#include "store/store.h"

/* AGREE: proposals written and read; DECIDE: the compare_set in flight;
 * DECIDED: the decision read; CREATE: the old works drained, then the new
 * comm's rendezvous */
enum shrink_step { SH_AGREE, SH_DECIDE, SH_DECIDED, SH_CREATE, SH_DONE };
enum { P_WAIT = 0, P_GOT, P_FAILED, P_SELF }; /* a proposal, by rank */

#define SHRINK_TICK_US 1000
/* store requests and the new comm's rendezvous get at least this past the
 * deadline (the decision made at the deadline must still be written) */
#define SHRINK_GRACE_MS 1000

typedef struct shrink_work {
    cl_successor_work s; /* "comm.shrink": the new comm, its rendezvous */
    collie_comm *comm;   /* the old comm (held until the work is freed) */
    int n, me, attempt, step;
    int64_t until_ns;
    uint8_t *st;                    /* P_*, by old rank (loop) */
    uint8_t *out;                   /* the ranks left out so far, by old rank (loop) */
    collie_work **gets;             /* proposal reads in flight, by old rank (loop) */
    collie_work *decided_get, *req; /* the decision's read; the proposal or compare_set */
    collie_work *decided_get_was;   /* the decision's read, to tell its callback apart */
    _Atomic bool creating;          /* the new comm's rendezvous was posted: the attempt is
                                       spent for every member if it fails */
    bool proposed;                  /* own proposal written */
    int *map;                       /* old rank -> new rank (handed to the new comm) */
    int new_size, new_rank;
    collie_comm_opts copts;
    cl_backend_spec spec;
    char keys[160]; /* "<old prefix>shrink<attempt>/" */
    char name[72];  /* the old comm's */
    struct event *tick;
} shrink_work;

/* ---- the work's end ---------------------------------------------------------------- */

static void shrink_fail(shrink_work *sw, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The one end of a shrink (any thread: the loop's steps, the cancel hook):
 * the comm's shrink slot is freed before the result shows, so a caller
 * that saw it fail may shrink again at once. False if it had ended. */
static bool shrink_end(shrink_work *sw, int status, const char *why) {
    if (!cl_work_claim(&sw->s.base)) return false;
    cl_change_end(sw->comm, &sw->comm->shrink_slot, sw->attempt, status == COLLIE_OK,
                  atomic_load(&sw->creating));
    if (status == COLLIE_OK)
        cl_work_publish(&sw->s.base, COLLIE_OK, NULL);
    else
        cl_work_publish(&sw->s.base, status, "%s", why);
    return true;
}

static void shrink_fail(shrink_work *sw, int status, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    sw->step = SH_DONE;
    shrink_end(sw, status, why);
}

static void shrink_fail_store_gone(shrink_work *sw, const char *why) {
    shrink_fail(sw, COLLIE_EPEER,
                "shrink of comm '%s': the store at %s is gone (%s; did it live in a rank that "
                "died?): shrink needs a store that outlives the ranks (collie-run's or "
                "collie-store)",
                sw->name, collie_store_address(sw->comm->store), why);
}

/* Is the store's connection lost (its server gone; the client only
 * retries)? Then the shrink fails at once rather than at its deadline. */
static bool shrink_store_lost(shrink_work *sw) {
    char why[200];
    if (!cl_store_lost(sw->comm->store, why, sizeof why)) return false;
    shrink_fail_store_gone(sw, why);
    return true;
}

/* A store request failed: the store is gone (it lived in a rank that
 * died?), or the deadline passed. */
static void shrink_store_failed(shrink_work *sw, collie_work *w, const char *what) {
    int st = collie_work_result(w);
    if (st == COLLIE_EPEER || st == COLLIE_ECLOSED)
        shrink_fail_store_gone(sw, collie_work_error_message(w));
    else
        shrink_fail(sw, st == COLLIE_ETIMEDOUT ? COLLIE_ETIMEDOUT : st,
                    "shrink of comm '%s': %s failed: %s", sw->name, what,
                    collie_work_error_message(w));
}

static void shrink_run(shrink_work *sw);

static void shrink_on_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    shrink_run(arg);
}

/* ---- store requests -------------------------------------------------------------- */

static bool shrink_req_ok(shrink_work *sw, collie_work *w) {
    if (cl_work_done(&sw->s.base)) return false; /* ended meanwhile: the result is dropped */
    return collie_work_result(w) == COLLIE_OK;
}

/* the callbacks' common tail: drop the request and the work's reference */
static void shrink_req_end(shrink_work *sw, collie_work *w) {
    collie_work_release(w);
    if (!cl_work_done(&sw->s.base)) shrink_run(sw);
    collie_work_release(&sw->s.base);
}

static void shrink_on_decided(collie_work *w, void *arg);

static void shrink_decide_from(shrink_work *sw, collie_work *w) {
    const void *val = NULL;
    size_t len = 0;
    collie_store_work_value(w, &val, &len);
    if (!cl_shrink_set_parse(val, len, sw->n, sw->out)) {
        shrink_fail(sw, COLLIE_EPROTO, "shrink of comm '%s': the decision '%.100s' is malformed",
                    sw->name, val ? (const char *)val : "");
        return;
    }
    sw->step = SH_DECIDED;
}

static void shrink_on_decided(collie_work *w, void *arg) {
    shrink_work *sw = arg;
    if (w == sw->decided_get) sw->decided_get = NULL;
    if (w == sw->req) sw->req = NULL;
    int st = collie_work_result(w);
    bool mine = w != sw->decided_get_was; /* the compare_set: its failure is the shrink's */
    if (shrink_req_ok(sw, w)) {
        if (sw->step <= SH_DECIDE) shrink_decide_from(sw, w);
    } else if (!cl_work_done(&sw->s.base) && st != COLLIE_ECANCELED &&
               (mine || st == COLLIE_EPEER || st == COLLIE_ECLOSED)) {
        shrink_store_failed(sw, w, mine ? "writing the decision" : "reading the decision");
    }
    shrink_req_end(sw, w);
}

/* rank r will be out: its proposal is not waited for */
static void shrink_not_waited(shrink_work *sw, int r) {
    sw->out[r] = 1;
    if (sw->st[r] != P_WAIT) return;
    sw->st[r] = P_FAILED;
    if (sw->gets[r]) collie_work_cancel(sw->gets[r]); /* its callback drops it */
}

static void shrink_on_prop(collie_work *w, void *arg) {
    shrink_work *sw = arg;
    int r = -1;
    for (int i = 0; i < sw->n && r < 0; i++)
        if (sw->gets && sw->gets[i] == w) r = i;
    if (r >= 0) sw->gets[r] = NULL;
    if (r >= 0 && shrink_req_ok(sw, w) && sw->st[r] == P_WAIT) {
        const void *val = NULL;
        size_t len = 0;
        collie_store_work_value(w, &val, &len);
        uint8_t *theirs = calloc((size_t)sw->n, 1);
        if (theirs && cl_shrink_set_parse(val, len, sw->n, theirs)) {
            sw->st[r] = P_GOT;
            for (int i = 0; i < sw->n; i++) /* out whatever they say: not waited for */
                if (theirs[i]) shrink_not_waited(sw, i);
        } else {
            sw->st[r] = P_FAILED; /* not a proposal: that rank is not believed */
            sw->out[r] = 1;
        }
        free(theirs);
    } else if (r >= 0 && !cl_work_done(&sw->s.base) && sw->st[r] == P_WAIT &&
               collie_work_result(w) != COLLIE_ECANCELED) {
        int st = collie_work_result(w);
        if (st == COLLIE_EPEER || st == COLLIE_ECLOSED) {
            shrink_store_failed(sw, w, "reading a proposal");
        } else { /* its deadline: that rank is silent */
            sw->st[r] = P_FAILED;
            sw->out[r] = 1;
        }
    }
    shrink_req_end(sw, w);
}

static void shrink_on_proposed(collie_work *w, void *arg) {
    shrink_work *sw = arg;
    if (w == sw->req) sw->req = NULL;
    if (shrink_req_ok(sw, w))
        sw->proposed = true;
    else if (!cl_work_done(&sw->s.base))
        shrink_store_failed(sw, w, "writing this rank's proposal");
    shrink_req_end(sw, w);
}

/* what is left to the deadline, at least the grace */
static int32_t shrink_left_ms(const shrink_work *sw) {
    int64_t left = (sw->until_ns - cl_now_ns()) / CL_NS_PER_MS;
    if (left < SHRINK_GRACE_MS) left = SHRINK_GRACE_MS;
    return left > INT32_MAX ? INT32_MAX : (int32_t)left;
}

static collie_post_opts shrink_req_opts(shrink_work *sw, collie_work_cb cb) {
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = cb;
    o.cb_arg = sw;
    o.timeout_ms = shrink_left_ms(sw);
    return o;
}

/* post one request (key under sw->keys); false (the work failed) if it
 * could not go out */
static bool shrink_post(shrink_work *sw, const char *suffix, int kind, const char *val,
                        collie_work_cb cb, collie_work **slot) {
    char key[sizeof sw->keys + 32];
    snprintf(key, sizeof key, "%s%s", sw->keys, suffix);
    collie_post_opts o = shrink_req_opts(sw, cb);
    collie_store *s = sw->comm->store;
    size_t vlen = val ? strlen(val) : 0;
    int r;
    collie_work_hold(&sw->s.base);
    if (kind == 's')
        r = collie_store_post_set(s, key, val, vlen, &o, slot);
    else if (kind == 'c')
        r = collie_store_post_compare_set(s, key, "", 0, val, vlen, &o, slot);
    else
        r = collie_store_post_get(s, key, &o, slot);
    if (r == COLLIE_OK) return true;
    *slot = NULL;
    collie_work_release(&sw->s.base);
    shrink_fail(sw, r, "shrink of comm '%s': a store request could not be posted: %s", sw->name,
                collie_last_error());
    return false;
}

/* ---- the steps ----------------------------------------------------------------- */

/* AGREE's start: write this rank's proposal, read every other's and the
 * decision (loop) */
static void shrink_propose(shrink_work *sw) {
    collie_comm *c = sw->comm;
    uint8_t *mine = calloc((size_t)sw->n, 1);
    char *text = malloc(cl_shrink_set_text_max(sw->n));
    if (!mine || !text) {
        free(mine);
        free(text);
        shrink_fail(sw, COLLIE_ENOMEM, "shrink of comm '%s': out of memory", sw->name);
        return;
    }
    cl_shrink_view(c, mine);
    for (int r = 0; r < sw->n; r++) {
        sw->out[r] = mine[r];
        sw->st[r] = r == sw->me ? P_SELF : mine[r] ? P_FAILED : P_WAIT;
    }
    cl_shrink_set_format(mine, sw->n, text, cl_shrink_set_text_max(sw->n));
    char suffix[32];
    snprintf(suffix, sizeof suffix, "prop/%d", sw->me);
    bool ok = shrink_post(sw, suffix, 's', text, shrink_on_proposed, &sw->req) &&
              shrink_post(sw, "decided", 'g', NULL, shrink_on_decided, &sw->decided_get);
    sw->decided_get_was = sw->decided_get;
    for (int r = 0; ok && r < sw->n; r++) {
        if (sw->st[r] != P_WAIT) continue;
        snprintf(suffix, sizeof suffix, "prop/%d", r);
        ok = shrink_post(sw, suffix, 'g', NULL, shrink_on_prop, &sw->gets[r]);
    }
    free(mine);
    free(text);
}

/* AGREE, each look: ranks found failed meanwhile are not waited for;
 * past the deadline, those still silent are left out. True once every
 * rank is read or known failed and this rank's proposal is written. */
static bool shrink_agreed(shrink_work *sw) {
    uint8_t *now = calloc((size_t)sw->n, 1);
    if (now) cl_shrink_view(sw->comm, now);
    bool late = cl_now_ns() >= sw->until_ns, waiting = false;
    for (int r = 0; r < sw->n; r++) {
        if (sw->st[r] != P_WAIT) continue;
        if ((now && now[r]) || late) {
            shrink_not_waited(sw, r);
        } else {
            waiting = true;
        }
    }
    free(now);
    return !waiting && sw->proposed;
}

static void shrink_decide(shrink_work *sw) {
    /* what this rank knows now joins the set too: a rank whose proposal
     * was read may have died since */
    uint8_t *now = calloc((size_t)sw->n, 1);
    if (now) {
        cl_shrink_view(sw->comm, now);
        for (int r = 0; r < sw->n; r++)
            sw->out[r] |= now[r];
        free(now);
    }
    char *text = malloc(cl_shrink_set_text_max(sw->n));
    if (!text) {
        shrink_fail(sw, COLLIE_ENOMEM, "shrink of comm '%s': out of memory", sw->name);
        return;
    }
    cl_shrink_set_format(sw->out, sw->n, text, cl_shrink_set_text_max(sw->n));
    sw->step = SH_DECIDE;
    shrink_post(sw, "decided", 'c', text, shrink_on_decided, &sw->req);
    free(text);
}

static void shrink_cancel_reads(shrink_work *sw) {
    for (int r = 0; r < sw->n; r++)
        if (sw->gets[r]) collie_work_cancel(sw->gets[r]);
    if (sw->decided_get) collie_work_cancel(sw->decided_get);
}

/* Decided (loop): out of it, or this rank's new rank and the map; the old
 * comm's fault becomes the agreed set; rank 0 tells the left-out ranks. */
static bool shrink_take_decision(shrink_work *sw) {
    collie_comm *c = sw->comm;
    shrink_cancel_reads(sw);
    if (sw->out[sw->me]) {
        cl_comm_shrink_excluded(c, -1);
        shrink_fail(sw, COLLIE_ENOTMEMBER,
                    "shrink of comm '%s': rank %d was left out by the survivors (it was seen as "
                    "failed, or it came after the deadline)",
                    sw->name, sw->me);
        return false;
    }
    sw->new_size = 0;
    for (int r = 0; r < sw->n; r++)
        sw->map[r] = sw->out[r] ? -1 : sw->new_size++;
    sw->new_rank = sw->map[sw->me];
    cl_fault f;
    cl_fault_init(&f, cl_shrink_set_kind(sw->comm, sw->out), COLLIE_FAULT_VIEW_AGREED, sw->me);
    for (int r = 0; r < sw->n; r++)
        if (sw->out[r]) cl_fault_add(&f, r);
    pthread_mutex_lock(&c->mu);
    f.origin = c->fault.origin;
    c->fault = f;
    pthread_mutex_unlock(&c->mu);
    if (sw->new_rank == 0 && sw->new_size < sw->n) {
        char *msg = malloc(cl_shrink_set_text_max(sw->n) + 48);
        if (msg) {
            int k = snprintf(msg, 48, "shrunk %d ", sw->me);
            cl_shrink_set_format(sw->out, sw->n, msg + k, cl_shrink_set_text_max(sw->n));
            (void)cl_comm_ctl_send(c, msg, NULL, NULL);
            free(msg);
        }
    }
    return true;
}

static void shrink_on_created(collie_work *w, void *arg) {
    shrink_work *sw = arg;
    if (!cl_work_done(&sw->s.base)) {
        if (collie_work_result(w) == COLLIE_OK) {
            cl_comm_note_successor(sw->comm, sw->s.made->name);
            sw->step = SH_DONE;
            shrink_end(sw, COLLIE_OK, NULL);
        } else {
            shrink_fail(sw, COLLIE_EABORTED,
                        "shrink of comm '%s': the new comm could not be made (shrink the old comm "
                        "again): %s",
                        sw->name, collie_work_error_message(w));
        }
    }
    collie_work_release(&sw->s.base);
}

/* CREATE's start: the new comm's rendezvous, the decision as its member
 * list */
static void shrink_create(shrink_work *sw) {
    collie_comm *c = sw->comm;
    char suffix[48], name[72], members[96];
    if (sw->attempt)
        snprintf(suffix, sizeof suffix, "shr%llue%d", (unsigned long long)c->generation,
                 sw->attempt);
    else
        snprintf(suffix, sizeof suffix, "shr%llu", (unsigned long long)c->generation);
    cl_comm_child_name(c, suffix, name, sizeof name);
    char *set = malloc(cl_shrink_set_text_max(sw->n));
    if (!set) {
        shrink_fail(sw, COLLIE_ENOMEM, "shrink of comm '%s': out of memory", sw->name);
        return;
    }
    cl_shrink_set_format(sw->out, sw->n, set, cl_shrink_set_text_max(sw->n));
    cl_comm_members_text_of(set, members, sizeof members);
    free(set);
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = shrink_on_created;
    po.cb_arg = sw;
    collie_comm_opts co = sw->copts;
    co.name = name;
    co.post = &po;
    co.create_timeout_ms = shrink_left_ms(sw);
    int *excluded = malloc((size_t)sw->n * sizeof *excluded), nexcluded = 0;
    if (!excluded) {
        shrink_fail(sw, COLLIE_ENOMEM, "shrink of comm '%s': out of memory", sw->name);
        return;
    }
    for (int r = 0; r < sw->n; r++)
        if (sw->out[r]) excluded[nexcluded++] = r;
    collie_work_hold(&sw->s.base);
    cl_successor_args a = {.engine = c->engine,
                           .store = c->store,
                           .rank = sw->new_rank,
                           .size = sw->new_size,
                           .o = &co,
                           .spec = &sw->spec,
                           .members = members,
                           .family = c->family,
                           .map = sw->map,
                           .map_n = sw->n,
                           .how = "shrink",
                           .from = c,
                           .shrinks = c->line.shrinks + 1,
                           .grows = c->line.grows,
                           .shrunk_from = c, /* its backends may build ours (ops->shrink) */
                           .excluded = excluded,
                           .nexcluded = nexcluded};
    atomic_store(&sw->creating, true);
    int r = cl_comm_create_successor(&a, &sw->s.made, &sw->s.create);
    free(excluded);
    if (r != COLLIE_OK) {
        collie_work_release(&sw->s.base);
        shrink_fail(sw, r, "shrink of comm '%s': the new comm could not be posted: %s", sw->name,
                    collie_last_error());
    }
}

/* CREATE, each look: a member that died or left meanwhile ends the
 * rendezvous for every member (its generation poisoned), unless every
 * member had passed it already: then the new comm stands, and its fault
 * is the new comm's to shrink (never one member out and the rest in). The
 * create is withdrawn once (cl_comm_create_withdraw): later looks change
 * nothing. */
static void shrink_watch_members(shrink_work *sw) {
    for (int r = 0; r < sw->n; r++) {
        int s = sw->out[r] || r == sw->me ? COLLIE_PEER_ALIVE : cl_health_state(sw->comm, r);
        if (s != COLLIE_PEER_DEAD && s != COLLIE_PEER_LEFT) continue;
        char why[256];
        snprintf(why, sizeof why,
                 "shrink of comm '%s': rank %d %s while the new comm was being made (shrink the "
                 "old comm again)",
                 sw->name, r, s == COLLIE_PEER_DEAD ? "died" : "left");
        cl_comm_create_withdraw(sw->s.create, COLLIE_EABORTED, why);
        return;
    }
}

/* One pass (loop): every step whose condition holds, until one waits. */
static void shrink_run(shrink_work *sw) {
    if (sw->step < SH_CREATE && !cl_work_done(&sw->s.base) && shrink_store_lost(sw)) return;
    for (int guard = 0; guard < 8 && !cl_work_done(&sw->s.base); guard++) {
        int step = sw->step;
        if (step == SH_AGREE && shrink_agreed(sw)) {
            shrink_decide(sw);
        } else if (step == SH_DECIDED) {
            if (!shrink_take_decision(sw)) return;
            sw->step = SH_CREATE;
        } else if (step == SH_CREATE && !sw->s.create) {
            if (atomic_load(&sw->comm->nactive) == 0) shrink_create(sw);
        } else if (step == SH_CREATE) {
            shrink_watch_members(sw);
        }
        if (sw->step == step) break;
    }
    if (cl_work_done(&sw->s.base)) return;
    if (cl_now_ns() >= sw->until_ns && sw->step >= SH_DECIDED && !sw->s.create) {
        shrink_fail(sw, COLLIE_ETIMEDOUT,
                    "shrink of comm '%s': its works did not end before the deadline", sw->name);
        return;
    }
    struct timeval tv = {0, SHRINK_TICK_US};
    if (sw->tick) event_add(sw->tick, &tv);
}

static void shrink_start(collie_work *w) {
    shrink_work *sw = (shrink_work *)w;
    sw->tick = event_new(cl_engine_base(w->engine), -1, 0, shrink_on_tick, sw);
    if (!sw->tick) {
        shrink_fail(sw, COLLIE_ENOMEM, "shrink of comm '%s': out of memory", sw->name);
        return;
    }
    shrink_propose(sw);
    if (!cl_work_done(w)) cl_shrink_revoke(sw->comm, sw->out);
    shrink_run(sw);
}

static void shrink_detach(collie_work *w) {
    shrink_work *sw = (shrink_work *)w;
    if (sw->tick) event_free(sw->tick);
    sw->tick = NULL;
    shrink_cancel_reads(sw);
    if (sw->req) collie_work_cancel(sw->req);
    if (sw->s.create && w->status != COLLIE_OK) collie_work_cancel(sw->s.create);
}

static void shrink_parts_free(shrink_work *sw);

static void shrink_free(collie_work *w) {
    shrink_work *sw = (shrink_work *)w;
    cl_successor_fini(&sw->s);
    cl_comm_release(sw->comm);
    shrink_parts_free(sw);
}

static void shrink_describe(const collie_work *w, char *buf, size_t len) {
    snprintf(buf, len, " (comm '%s')", ((const shrink_work *)w)->name);
}

/* A cancel, a waiter's deadline, the engine's shutdown: ended at once (its
 * detach cancels what is in flight) */
static bool shrink_cancel(collie_work *w, int status, const char *msg) {
    return shrink_end((shrink_work *)w, status, msg ? msg : collie_status_name(status));
}

static const cl_work_ops shrink_ops = {.name = "comm.shrink",
                                       .start = shrink_start,
                                       .detach = shrink_detach,
                                       .cancel = shrink_cancel,
                                       .free = shrink_free,
                                       .describe = shrink_describe};

/* ---- posting ----------------------------------------------------------------- */

static int shrink_check(collie_comm *c, const collie_shrink_opts *so, const collie_post_opts *o,
                        collie_work **out) {
    if (!c || !out)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_shrink: %s is NULL",
                                 c ? "out" : "comm");
    if (!cl_opts_ok(so, offsetof(collie_shrink_opts, comm) + sizeof so->comm) ||
        !cl_opts_ok(o, sizeof(size_t)))
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_shrink: opts.size not set (use "
                                                "COLLIE_SHRINK_OPTS_INIT)");
    if (so && so->timeout_ms < 0 && so->timeout_ms != COLLIE_TIMEOUT_INFINITE)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_shrink: timeout_ms %d is invalid",
                                 (int)so->timeout_ms);
    if (!atomic_load(&c->ever_ready))
        return cl_set_last_error(COLLIE_ESTATE,
                                 "collie_comm_shrink: comm '%s' was never created: create it "
                                 "again instead",
                                 c->name);
    if (c->engine_gone || atomic_load(&c->destroy_posted))
        return cl_set_last_error(COLLIE_ESTATE, "collie_comm_shrink: comm '%s' is being destroyed",
                                 c->name);
    if (atomic_load(&c->excluded))
        return cl_set_last_error(COLLIE_ENOTMEMBER,
                                 "collie_comm_shrink: rank %d was left out of comm '%s' by the "
                                 "survivors' shrink",
                                 c->rank, c->name);
    if (cl_shrink_nothing_failed(c))
        return cl_set_last_error(COLLIE_ESTATE,
                                 "collie_comm_shrink: comm '%s' is healthy (no fault, no peer "
                                 "dead, left or suspected): nothing to shrink",
                                 c->name);
    return COLLIE_OK;
}

static void shrink_parts_free(shrink_work *sw) {
    free(sw->st);
    free(sw->out);
    free(sw->gets);
    free(sw->map);
    free(sw);
}

int collie_comm_shrink_post(collie_comm *c, const collie_shrink_opts *so, const collie_post_opts *o,
                            collie_work **out) {
    cl_clear_last_error();
    if (out) *out = NULL;
    int r = shrink_check(c, so, o, out);
    if (r != COLLIE_OK) return r;
    if (so && so->comm && !cl_opts_ok(so->comm, offsetof(collie_comm_opts, device)))
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_shrink: comm opts.size not set");
    shrink_work *sw = calloc(1, sizeof *sw);
    int n = c->size;
    if (!sw) return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_shrink: out of memory");
    sw->st = calloc((size_t)n, 1);
    sw->out = calloc((size_t)n, 1);
    sw->gets = calloc((size_t)n, sizeof *sw->gets);
    sw->map = calloc((size_t)n, sizeof *sw->map);
    if (!sw->st || !sw->out || !sw->gets || !sw->map) {
        shrink_parts_free(sw);
        return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_shrink: out of memory");
    }
    if ((r = cl_comm_successor_opts(c, so ? so->comm : NULL, &sw->copts, &sw->spec)) != COLLIE_OK ||
        (r = cl_comm_work_init(&sw->s.base, c->engine, &shrink_ops, o)) != COLLIE_OK ||
        (r = cl_change_begin(c, &c->shrink_slot, "shrink", &sw->attempt)) != COLLIE_OK) {
        shrink_parts_free(sw);
        return r;
    }
    int32_t t = cl_opt(so, timeout_ms, 0);
    if (t == 0) t = c->create_timeout_ms;
    sw->comm = c;
    sw->n = n;
    sw->me = c->rank;
    sw->until_ns = cl_deadline_ns(cl_now_ns(), t);
    snprintf(sw->name, sizeof sw->name, "%s", c->name);
    snprintf(sw->keys, sizeof sw->keys, "%sshrink%d/", c->prefix, sw->attempt);
    cl_comm_hold(c);
    if ((r = cl_work_post(&sw->s.base)) != COLLIE_OK) {
        cl_change_end(c, &c->shrink_slot, sw->attempt, false, false);
        shrink_free(&sw->s.base);
        return cl_set_last_error(r, "collie_comm_shrink: comm '%s': the engine is closing",
                                 c->name);
    }
    *out = &sw->s.base;
    return COLLIE_OK;
}

bool cl_comm_is_shrink_work(const collie_work *w) { return w && w->ops == &shrink_ops; }

int collie_comm_shrink(collie_comm *c, const collie_shrink_opts *so, collie_comm **out) {
    if (out) *out = NULL;
    if (c && cl_engine_on_loop(c->engine))
        return cl_set_last_error(COLLIE_ESTATE, "collie_comm_shrink on the progress thread "
                                                "(collie_comm_shrink_post does not block)");
    collie_work *w;
    int r = collie_comm_shrink_post(c, so, NULL, &w);
    return r == COLLIE_OK ? cl_successor_wait(w, out) : r;
}
