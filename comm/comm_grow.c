/*
 * comm_grow.c — growing a comm: its members take joiners into a new comm
 * ("comm.grow", collie_comm_grow) and a new process asks to join
 * ("comm.join", collie_comm_join).
 *
 * Design notes
 *  - Joiners find a comm by its family, the name it was first created
 *    with (shrinks and grows keep it), under "collie/<family>/": a joiner
 *    takes a ticket t (add "joiners" 1), writes what it asks for to
 *    "joiner/<t>" ("<rank> pid P on host H"; -1: any rank) and waits for
 *    its answer at "grow/<t>". Tickets are answered in order.
 *  - The members: rank 0 takes the next ticket (add "claimed" 1: so every
 *    ticket is taken by one grow only), waits for that joiner's request,
 *    and answers with compare_set("grow/<t>", "" -> "ok <name> <rank>
 *    <size>") or "refused <why>" (a rank a member holds, or taken), until
 *    `count` joiners are in; then it writes the plan ("<name> <size>") to
 *    "<prefix>grow<attempt>", which the other members wait for. A joiner
 *    that gives up writes "withdrawn" the same way: whichever write comes
 *    first holds, so a ticket is either answered or withdrawn, never both
 *    (a withdrawn one is skipped: rank 0 takes the next). A rank 0 that
 *    gives up waiting for its ticket's joiner marks it "expired" the same
 *    way: a joiner that comes for it later takes a new ticket, so the two
 *    counters stay in step.
 *  - Then every member and joiner makes the new comm through the usual
 *    rendezvous ("<name>.gr<generation>", its members keeping their ranks,
 *    the agreement "grow to <size>" as the member list every one must
 *    hold), and a one-element allreduce on it (checked: the sum of ones is
 *    the size) makes its links before it is handed over (LINK): the first
 *    collective after a grow is as fast as any other.
 *  - A joiner reads its answer, then deletes its two keys (best effort):
 *    only the two counters stay per family.
 *  - Each work ends itself at its deadline (the store requests and the
 *    rendezvous carry what is left of it); like a shrink it has no cancel
 *    hook (a cancel or the engine's shutdown ends it at once) and its
 *    detach cancels what is in flight (comm_successor.c ends the rest).
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "engine/engine.h"

enum grow_step { G_CLAIM, G_TICKET, G_ANSWER, G_PLAN, G_ASK, G_WAIT, G_CREATE, G_LINK, G_DONE };

/* the largest comm a grow makes, or a joiner believes an answer about */
#define GROW_MAX_SIZE (1 << 20)

/* a joiner waits at least this past its deadline for a last answer */
#define GROW_GRACE_MS 1000

typedef struct grow_work {
    cl_successor_work s; /* "comm.grow" or "comm.join" */
    collie_comm *comm;   /* members: the old comm (held); NULL for a joiner */
    collie_engine *engine;
    collie_store *store; /* a joiner's own handle (members: the comm's) */
    bool joiner;
    int step, count, taken, asked_rank, n, rank, size, attempt;
    uint32_t line_shrinks, line_grows; /* a joiner's, from its answer */
    int64_t ticket;
    _Atomic int64_t waiting_ticket; /* a joiner's ticket while it waits for its answer */
    _Atomic bool creating;
    /* the new comm's rendezvous was posted */ /* the ticket being answered (rank 0), or this
                                                  joiner's */
    int64_t until_ns;                          /* the deadline */
    bool *held;                                /* rank 0: ranks given so far, by new rank */
    collie_work *req;                          /* the store request in flight (loop) */
    int32_t link_in, link_out;                 /* LINK's allreduce */
    collie_work *link;
    collie_comm_opts copts;
    cl_backend_spec spec;
    bool has_spec;
    char family[96]; /* "collie/<family>/" */
    char plan_key[160];
    char name[72]; /* the new comm's */
    char what[96]; /* for messages: "grow of comm 'x'" / "join of 'x'" */
} grow_work;

static void grow_run(grow_work *g);

static void grow_fail(grow_work *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The one end of a grow or join (any thread: the loop's steps, the cancel
 * hook): a member's grow slot is freed before the result shows; a joiner
 * that ends waiting for its answer withdraws its ticket (not awaited), so
 * the next grow does not take a joiner that is gone. */
static bool grow_end(grow_work *g, int status, const char *why) {
    if (!cl_work_claim(&g->s.base)) return false;
    if (g->comm)
        cl_change_end(g->comm, &g->comm->grow_slot, g->attempt, status == COLLIE_OK,
                      atomic_load(&g->creating));
    int64_t t = atomic_exchange(&g->waiting_ticket, 0);
    if (g->joiner && t > 0 && status != COLLIE_OK) {
        char key[160];
        snprintf(key, sizeof key, "%sgrow/%lld", g->family, (long long)t);
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.timeout_ms = GROW_GRACE_MS;
        collie_work *w = NULL;
        if (collie_store_post_compare_set(g->store, key, "", 0, "withdrawn", 9, &o, &w) ==
            COLLIE_OK)
            collie_work_release(w);
    }
    if (status == COLLIE_OK)
        cl_work_publish(&g->s.base, COLLIE_OK, NULL);
    else
        cl_work_publish(&g->s.base, status, "%s: %s", g->what, why);
    return true;
}

static void grow_fail(grow_work *g, int status, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    g->step = G_DONE;
    grow_end(g, status, why);
}

static int32_t grow_left_ms(const grow_work *g, int32_t at_least) {
    int64_t left = (g->until_ns - cl_now_ns()) / CL_NS_PER_MS;
    if (left < at_least) left = at_least;
    if (left < 1) left = 1;
    return left > INT32_MAX ? INT32_MAX : (int32_t)left;
}

/* ---- store requests (one in flight, loop) --------------------------------------------- */

static void grow_on_req(collie_work *w, void *arg) {
    grow_work *g = arg;
    if (w == g->req && !cl_work_done(&g->s.base)) grow_run(g); /* it reads g->req */
    if (w == g->req) g->req = NULL;
    collie_work_release(w);
    collie_work_release(&g->s.base);
}

/* kind: 's' set, 'c' compare_set "" -> val, 'g' get, 'a' add 1; key under
 * `prefix` */
static bool grow_post(grow_work *g, const char *prefix, const char *suffix, int kind,
                      const char *val, int32_t at_least_ms) {
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, suffix);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.cb = grow_on_req;
    o.cb_arg = g;
    o.timeout_ms = grow_left_ms(g, at_least_ms);
    size_t vlen = val ? strlen(val) : 0;
    int r;
    collie_work_hold(&g->s.base);
    if (kind == 's')
        r = collie_store_post_set(g->store, key, val, vlen, &o, &g->req);
    else if (kind == 'c')
        r = collie_store_post_compare_set(g->store, key, "", 0, val, vlen, &o, &g->req);
    else if (kind == 'a')
        r = collie_store_post_add(g->store, key, 1, &o, &g->req);
    else
        r = collie_store_post_get(g->store, key, &o, &g->req);
    if (r == COLLIE_OK) return true;
    g->req = NULL;
    collie_work_release(&g->s.base);
    grow_fail(g, r, "a store request could not be posted: %s", collie_last_error());
    return false;
}

/* rank 0 gives up on the ticket it took: "expired", so a joiner that comes
 * for it later takes a new one (the counters stay in step); not awaited */
static void grow_expire(grow_work *g) {
    char key[160];
    snprintf(key, sizeof key, "%sgrow/%lld", g->family, (long long)g->ticket);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = GROW_GRACE_MS;
    collie_work *w = NULL;
    if (collie_store_post_compare_set(g->store, key, "", 0, "expired", 7, &o, &w) == COLLIE_OK)
        collie_work_release(w);
}

/* the finished request's value (NUL-terminated), or NULL after failing g */
static const char *grow_value(grow_work *g, const char *what) {
    collie_work *w = g->req;
    int st = collie_work_result(w);
    if (st != COLLIE_OK) {
        if (st == COLLIE_ETIMEDOUT && g->step == G_TICKET) {
            grow_expire(g);
            grow_fail(g, st, "%d of %d joiners came by the deadline", g->taken, g->count);
        } else if (st == COLLIE_ETIMEDOUT && g->step == G_PLAN && g->rank != 0)
            grow_fail(g, st,
                      "rank 0's plan did not come by the deadline (too few joiners came, or "
                      "rank 0 is not growing)");
        else
            grow_fail(g, st == COLLIE_ECLOSED ? COLLIE_EPEER : st, "%s failed: %s", what,
                      collie_work_error_message(w));
        return NULL;
    }
    const void *val = "";
    size_t len;
    if (collie_store_work_value(w, &val, &len) != COLLIE_OK) val = "";
    return val;
}

/* ---- the members' side ------------------------------------------------------------------ */

/* rank 0 (TICKET's end): the rank this joiner gets, or -1 (why: *refusal) */
static int grow_pick(grow_work *g, const char *req, char *refusal, size_t len) {
    int want = -2;
    if (sscanf(req, "%d", &want) != 1 || want < -1) {
        snprintf(refusal, len, "refused a malformed request '%.60s'", req);
        return -1;
    }
    if (want >= 0 && want < g->n) {
        snprintf(refusal, len, "refused: rank %d is taken by a member (ranks 0-%d)", want,
                 g->n - 1);
        return -1;
    }
    if (want >= g->size) {
        snprintf(refusal, len, "refused: rank %d is beyond the grown size %d", want, g->size);
        return -1;
    }
    if (want >= 0 && g->held[want]) {
        snprintf(refusal, len, "refused: rank %d is taken by another joiner", want);
        return -1;
    }
    for (int r = g->n; want < 0 && r < g->size; r++)
        if (!g->held[r]) want = r;
    return want;
}

/* rank 0: one request read: answer it (ANSWER) */
static void grow_answer(grow_work *g, const char *req) {
    char ans[256], refusal[160], t[32];
    int r = grow_pick(g, req, refusal, sizeof refusal);
    if (r >= 0)
        snprintf(ans, sizeof ans, "ok %s %d %d %u %u", g->name, r, g->size, g->comm->line.shrinks,
                 g->comm->line.grows);
    else
        snprintf(ans, sizeof ans, "%s", refusal);
    g->asked_rank = r;
    g->step = G_ANSWER;
    snprintf(t, sizeof t, "grow/%lld", (long long)g->ticket);
    grow_post(g, g->family, t, 'c', ans, 0);
}

/* rank 0: the answer stands (or the joiner withdrew first) */
static void grow_answered(grow_work *g, const char *stored) {
    if (g->asked_rank >= 0 && strncmp(stored, "ok ", 3) == 0) {
        g->held[g->asked_rank] = true;
        g->taken++;
    }
    if (g->taken < g->count) {
        g->step = G_CLAIM;
        grow_post(g, g->family, "claimed", 'a', NULL, 0);
        return;
    }
    char plan[160];
    snprintf(plan, sizeof plan, "%s %d", g->name, g->size);
    g->step = G_PLAN;
    grow_post(g, g->plan_key, "", 's', plan, 0);
}

/* ---- both sides -------------------------------------------------------------------------- */

static void grow_on_link(collie_work *w, void *arg) {
    grow_work *g = arg;
    if (!cl_work_done(&g->s.base)) {
        if (collie_work_result(w) != COLLIE_OK)
            grow_fail(g, collie_work_result(w), "the new comm's first allreduce failed: %s",
                      collie_work_error_message(w));
        else if (g->link_out != g->size)
            grow_fail(g, COLLIE_EPROTO, "the new comm's first allreduce summed %d ones to %d",
                      g->size, (int)g->link_out);
        else if (grow_end(g, COLLIE_OK, NULL)) {
            g->step = G_DONE;
            if (g->comm) cl_comm_note_successor(g->comm, g->name);
        }
    }
    collie_work_release(&g->s.base);
}

static void grow_on_created(collie_work *w, void *arg) {
    grow_work *g = arg;
    if (!cl_work_done(&g->s.base)) {
        if (collie_work_result(w) != COLLIE_OK) {
            grow_fail(g, collie_work_result(w), "the new comm could not be made: %s",
                      collie_work_error_message(w));
        } else {
            g->step = G_LINK;
            g->link_in = 1;
            collie_post_opts po = COLLIE_POST_OPTS_INIT;
            po.cb = grow_on_link;
            po.cb_arg = g;
            po.timeout_ms = grow_left_ms(g, GROW_GRACE_MS);
            collie_work_hold(&g->s.base);
            if (collie_allreduce(g->s.made, &g->link_in, &g->link_out, 1, COLLIE_INT32, COLLIE_SUM,
                                 &po, &g->link) != COLLIE_OK) {
                collie_work_release(&g->s.base);
                grow_fail(g, COLLIE_EABORTED, "the new comm's first allreduce: %s",
                          collie_last_error());
            }
        }
    }
    collie_work_release(&g->s.base);
}

static void grow_create(grow_work *g) {
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = grow_on_created;
    po.cb_arg = g;
    collie_comm_opts co = g->copts;
    co.name = g->name;
    co.post = &po;
    co.create_timeout_ms = grow_left_ms(g, GROW_GRACE_MS);
    char members[48];
    snprintf(members, sizeof members, "grow to %d", g->size);
    cl_successor_args a = {.engine = g->engine,
                           .store = g->store,
                           .rank = g->rank,
                           .size = g->size,
                           .o = &co,
                           .spec = g->has_spec ? &g->spec : NULL,
                           .members = members,
                           .family = g->family + strlen("collie/"),
                           .how = g->joiner ? "join" : "grow",
                           .from = g->comm,
                           .shrinks = g->comm ? g->comm->line.shrinks : g->line_shrinks,
                           .grows = (g->comm ? g->comm->line.grows : g->line_grows) + 1};
    /* the family key is "collie/<family>/": the name without the slashes */
    char fam[72];
    snprintf(fam, sizeof fam, "%.*s", (int)(strlen(g->family) - strlen("collie//")), a.family);
    a.family = fam;
    g->step = G_CREATE;
    atomic_store(&g->creating, true);
    collie_work_hold(&g->s.base);
    int r = cl_comm_create_successor(&a, &g->s.made, &g->s.create);
    if (r != COLLIE_OK) {
        collie_work_release(&g->s.base);
        grow_fail(g, r, "the new comm could not be posted: %s", collie_last_error());
    }
}

/* a joiner's answer: "ok <name> <rank> <size>" or a refusal */
static void grow_joiner_answer(grow_work *g, const char *ans) {
    atomic_store(&g->waiting_ticket, 0); /* answered (or withdrawn): nothing to withdraw */
    char name[72];
    int rank, size;
    int got =
        sscanf(ans, "ok %71s %d %d %u %u", name, &rank, &size, &g->line_shrinks, &g->line_grows);
    if (got >= 3 && !(size >= 2 && size <= GROW_MAX_SIZE && rank >= 1 && rank < size &&
                      cl_comm_check_name(name) == COLLIE_OK)) {
        /* no grow writes that (a joiner's rank is after a member's, the size
         * at least 2): the store was written by someone else */
        grow_fail(g, COLLIE_EPROTO, "a malformed answer '%.100s' (rank %d of %d)", ans, rank, size);
    } else if (got >= 3) {
        snprintf(g->name, sizeof g->name, "%s", name);
        g->rank = rank;
        g->size = size;
        char t[160];
        collie_work *d = NULL;
        collie_post_opts o = COLLIE_POST_OPTS_INIT;
        o.timeout_ms = 1000;
        snprintf(t, sizeof t, "%sjoiner/%lld", g->family, (long long)g->ticket);
        if (collie_store_post_delete(g->store, t, &o, &d) == COLLIE_OK) collie_work_release(d);
        snprintf(t, sizeof t, "%sgrow/%lld", g->family, (long long)g->ticket);
        if (collie_store_post_delete(g->store, t, &o, &d) == COLLIE_OK) collie_work_release(d);
        grow_create(g);
    } else if (strcmp(ans, "expired") == 0 && g->step == G_WAIT) {
        g->step = G_ASK; /* the grow that took this ticket gave up: take a new one */
        grow_post(g, g->family, "joiners", 'a', NULL, 0);
    } else if (strcmp(ans, "withdrawn") == 0 || strcmp(ans, "expired") == 0) {
        grow_fail(g, COLLIE_ETIMEDOUT, "no grow took it by the deadline (withdrawn)");
    } else {
        grow_fail(g, COLLIE_EINVAL, "%.200s", ans);
    }
}

/* One step's request finished (loop): read it, post the next. */
static void grow_run(grow_work *g) {
    const char *v;
    char t[48];
    switch (g->step) {
    case G_CLAIM: /* rank 0: a ticket taken */
    case G_ASK:   /* a joiner: its ticket */
        if (!grow_value(g, "taking a ticket")) return;
        if (collie_store_work_int(g->req, &g->ticket) != COLLIE_OK || g->ticket < 1) {
            grow_fail(g, COLLIE_EPROTO, "the ticket counter gave %lld", (long long)g->ticket);
            return;
        }
        if (g->step == G_CLAIM) {
            g->step = G_TICKET;
            snprintf(t, sizeof t, "joiner/%lld", (long long)g->ticket);
            grow_post(g, g->family, t, 'g', NULL, 0);
        } else {
            char me[160], host[64] = "";
            gethostname(host, sizeof host - 1);
            snprintf(me, sizeof me, "%d pid %d on host %s", g->asked_rank, (int)getpid(), host);
            snprintf(t, sizeof t, "joiner/%lld", (long long)g->ticket);
            g->step = G_WAIT;
            atomic_store(&g->waiting_ticket, g->ticket);
            if (!grow_post(g, g->family, t, 's', me, 0)) return;
            g->req = NULL; /* the set's callback is not awaited: the answer is */
            snprintf(t, sizeof t, "grow/%lld", (long long)g->ticket);
            grow_post(g, g->family, t, 'g', NULL, 0);
        }
        return;
    case G_TICKET: /* rank 0: the joiner's request */
        if ((v = grow_value(g, "reading a joiner's request"))) grow_answer(g, v);
        return;
    case G_ANSWER:
        if ((v = grow_value(g, "answering a joiner"))) grow_answered(g, v);
        return;
    case G_PLAN: { /* rank 0: the plan written; the others: read */
        if (!(v = grow_value(g, "the grow's plan"))) return;
        if (g->rank != 0) {
            int size = 0;
            if (sscanf(v, "%71s %d", g->name, &size) != 2 || size != g->size) {
                grow_fail(g, COLLIE_EINVAL,
                          "the members disagree: rank 0 grows to '%.80s', this rank asked for %d",
                          v, g->size);
                return;
            }
        }
        grow_create(g);
        return;
    }
    case G_WAIT: /* a joiner's answer, or its deadline: withdraw */
        if (collie_work_result(g->req) == COLLIE_ETIMEDOUT) {
            g->step = G_DONE + 1; /* WITHDRAW */
            snprintf(t, sizeof t, "grow/%lld", (long long)g->ticket);
            grow_post(g, g->family, t, 'c', "withdrawn", GROW_GRACE_MS);
            return;
        }
        if ((v = grow_value(g, "waiting for an answer"))) grow_joiner_answer(g, v);
        return;
    case G_DONE + 1:
        if ((v = grow_value(g, "withdrawing"))) grow_joiner_answer(g, v);
        return;
    default: return;
    }
}

/* ---- the work ------------------------------------------------------------------------------ */

static void grow_start(collie_work *w) {
    grow_work *g = (grow_work *)w;
    if (g->joiner) {
        g->step = G_ASK;
        grow_post(g, g->family, "joiners", 'a', NULL, 0);
    } else if (g->rank == 0) {
        g->step = G_CLAIM;
        grow_post(g, g->family, "claimed", 'a', NULL, 0);
    } else {
        g->step = G_PLAN;
        grow_post(g, g->plan_key, "", 'g', NULL, 0);
    }
}

static void grow_detach(collie_work *w) {
    grow_work *g = (grow_work *)w;
    if (g->req) collie_work_cancel(g->req); /* its callback drops it */
    if (g->s.create && w->status != COLLIE_OK) collie_work_cancel(g->s.create);
    if (g->link && w->status != COLLIE_OK) collie_work_cancel(g->link);
}

static void grow_free(collie_work *w) {
    grow_work *g = (grow_work *)w;
    if (g->link) collie_work_release(g->link);
    cl_successor_fini(&g->s);
    if (g->comm) cl_comm_release(g->comm);
    if (g->joiner) collie_store_destroy(g->store);
    free(g->held);
    free(g);
}

static void grow_describe(const collie_work *w, char *buf, size_t len) {
    snprintf(buf, len, " (%s)", ((const grow_work *)w)->what);
}

/* A cancel, a waiter's deadline, the engine's shutdown: ended at once (its
 * detach cancels what is in flight) */
static bool grow_cancel(collie_work *w, int status, const char *msg) {
    return grow_end((grow_work *)w, status, msg ? msg : collie_status_name(status));
}

static const cl_work_ops grow_ops = {.name = "comm.grow",
                                     .start = grow_start,
                                     .detach = grow_detach,
                                     .cancel = grow_cancel,
                                     .free = grow_free,
                                     .describe = grow_describe};
static const cl_work_ops join_ops = {.name = "comm.join",
                                     .start = grow_start,
                                     .detach = grow_detach,
                                     .cancel = grow_cancel,
                                     .free = grow_free,
                                     .describe = grow_describe};

bool cl_comm_is_grow_work(const collie_work *w) {
    return w && (w->ops == &grow_ops || w->ops == &join_ops);
}

/* ---- posting ----------------------------------------------------------------------------- */

static int grow_check_opts(const collie_grow_opts *go, const collie_post_opts *o, collie_work **out,
                           const char *who) {
    if (!out) return cl_set_last_error(COLLIE_EINVAL, "%s: out is NULL", who);
    if (!cl_opts_ok(go, offsetof(collie_grow_opts, rank) + sizeof go->rank) ||
        !cl_opts_ok(o, sizeof(size_t)))
        return cl_set_last_error(COLLIE_EINVAL, "%s: opts.size not set (use COLLIE_GROW_OPTS_INIT)",
                                 who);
    if (go && go->timeout_ms < 0 && go->timeout_ms != COLLIE_TIMEOUT_INFINITE)
        return cl_set_last_error(COLLIE_EINVAL, "%s: timeout_ms %d is invalid", who,
                                 (int)go->timeout_ms);
    if (go && (go->count < 0 || go->count > 4096))
        return cl_set_last_error(COLLIE_EINVAL, "%s: count %d (1 to 4096 joiners, 0: 1)", who,
                                 go->count);
    if (go && go->rank < -1)
        return cl_set_last_error(COLLIE_EINVAL, "%s: rank %d (-1: any)", who, go->rank);
    if (go && go->comm && !cl_opts_ok(go->comm, offsetof(collie_comm_opts, device)))
        return cl_set_last_error(COLLIE_EINVAL, "%s: comm opts.size not set", who);
    return COLLIE_OK;
}

/* allocate, init and post (the caller filled the rest in `proto`) */
static int grow_submit(grow_work *proto, const cl_work_ops *ops, const collie_post_opts *o,
                       int32_t timeout, collie_work **out) {
    grow_work *g = malloc(sizeof *g);
    if (!g) return cl_set_last_error(COLLIE_ENOMEM, "%s: out of memory", proto->what);
    *g = *proto;
    int r = cl_comm_work_init(&g->s.base, g->engine, ops, o);
    if (r != COLLIE_OK) {
        free(g);
        return r;
    }
    g->until_ns = cl_deadline_ns(cl_now_ns(), timeout);
    if (g->comm) cl_comm_hold(g->comm);
    if ((r = cl_work_post(&g->s.base)) != COLLIE_OK) { /* the caller frees held, store */
        if (g->comm) cl_comm_release(g->comm);
        free(g);
        return cl_set_last_error(r, "%s: the engine is closing", proto->what);
    }
    *out = &g->s.base;
    return COLLIE_OK;
}

int collie_comm_grow_post(collie_comm *c, const collie_grow_opts *go, const collie_post_opts *o,
                          collie_work **out) {
    cl_clear_last_error();
    if (out) *out = NULL;
    int r = grow_check_opts(go, o, out, "collie_comm_grow");
    if (r != COLLIE_OK) return r;
    if (!c) return cl_set_last_error(COLLIE_EINVAL, "collie_comm_grow: comm is NULL");
    if (!atomic_load(&c->ever_ready) || atomic_load(&c->err_status) != COLLIE_OK ||
        c->engine_gone || atomic_load(&c->destroy_posted))
        return cl_set_last_error(COLLIE_ESTATE,
                                 "collie_comm_grow: comm '%s' is not healthy (%s): shrink it "
                                 "first, or create it again",
                                 c->name, c->err_msg[0] ? c->err_msg : "not ready");
    grow_work g;
    memset(&g, 0, sizeof g);
    g.comm = c;
    g.engine = c->engine;
    g.store = c->store;
    g.rank = c->rank;
    g.n = c->size;
    g.count = go && go->count ? go->count : 1;
    g.size = c->size + g.count;
    if (g.size > GROW_MAX_SIZE)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_grow: %d + %d ranks is over %d",
                                 c->size, g.count, GROW_MAX_SIZE);
    const collie_comm_opts *uo = go ? go->comm : NULL;
    if ((r = cl_comm_successor_opts(c, uo, &g.copts, &g.spec)) != COLLIE_OK) return r;
    g.has_spec = true;
    g.held = calloc((size_t)g.size, sizeof *g.held);
    if (!g.held) return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_grow: out of memory");
    if ((r = cl_change_begin(c, &c->grow_slot, "grow", &g.attempt)) != COLLIE_OK) {
        free(g.held);
        return r;
    }
    char suffix[48];
    if (g.attempt)
        snprintf(suffix, sizeof suffix, "gr%llue%d", (unsigned long long)c->generation, g.attempt);
    else
        snprintf(suffix, sizeof suffix, "gr%llu", (unsigned long long)c->generation);
    cl_comm_child_name(c, suffix, g.name, sizeof g.name);
    snprintf(g.family, sizeof g.family, "collie/%s/", c->family);
    snprintf(g.plan_key, sizeof g.plan_key, "%sgrow%d", c->prefix, g.attempt);
    snprintf(g.what, sizeof g.what, "grow of comm '%s'", c->name);
    int32_t t = go && go->timeout_ms ? go->timeout_ms : c->create_timeout_ms;
    if ((r = grow_submit(&g, &grow_ops, o, t, out)) != COLLIE_OK) {
        cl_change_end(c, &c->grow_slot, g.attempt, false, false);
        free(g.held);
    }
    return r;
}

int collie_comm_join_post(collie_engine *e, collie_store *store, const char *name,
                          const collie_grow_opts *go, const collie_post_opts *o,
                          collie_work **out) {
    cl_clear_last_error();
    if (out) *out = NULL;
    int r = grow_check_opts(go, o, out, "collie_comm_join");
    if (r != COLLIE_OK) return r;
    if (!e || !store || !name)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_join: engine, store and name are "
                                                "required");
    if ((r = cl_comm_check_name(name)) != COLLIE_OK) return r;
    if ((r = cl_comm_trust_check(store, name)) != COLLIE_OK) return r;
    grow_work g;
    memset(&g, 0, sizeof g);
    g.joiner = true;
    g.engine = e;
    g.asked_rank = go ? go->rank : -1;
    g.rank = -1;
    snprintf(g.family, sizeof g.family, "collie/%s/", name);
    snprintf(g.what, sizeof g.what, "join of '%s'", name);
    collie_comm_opts co = COLLIE_COMM_OPTS_INIT;
    const collie_comm_opts *uo = go ? go->comm : NULL;
    if (uo) memcpy(&co, uo, uo->size < sizeof co ? uo->size : sizeof co);
    co.size = sizeof co;
    g.copts = co;
    int32_t t = go && go->timeout_ms   ? go->timeout_ms
                : co.create_timeout_ms ? co.create_timeout_ms
                : co.timeout_ms        ? co.timeout_ms
                                       : cl_config_get()->timeout_ms;
    if (collie_store_prefix(store, "", &g.store) != COLLIE_OK)
        return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_join: out of memory");
    if ((r = grow_submit(&g, &join_ops, o, t, out)) != COLLIE_OK) collie_store_destroy(g.store);
    return r;
}

int collie_comm_grow(collie_comm *c, const collie_grow_opts *go, collie_comm **out) {
    if (out) *out = NULL;
    if (c && cl_engine_on_loop(c->engine))
        return cl_set_last_error(COLLIE_ESTATE, "collie_comm_grow on the progress thread "
                                                "(collie_comm_grow_post does not block)");
    collie_work *w = NULL;
    int r = collie_comm_grow_post(c, go, NULL, &w);
    return r == COLLIE_OK ? cl_successor_wait(w, out) : r;
}

int collie_comm_join(collie_engine *e, collie_store *store, const char *name,
                     const collie_grow_opts *go, collie_comm **out) {
    if (out) *out = NULL;
    if (e && cl_engine_on_loop(e))
        return cl_set_last_error(COLLIE_ESTATE, "collie_comm_join on the progress thread "
                                                "(collie_comm_join_post does not block)");
    collie_work *w = NULL;
    int r = collie_comm_join_post(e, store, name, go, NULL, &w);
    return r == COLLIE_OK ? cl_successor_wait(w, out) : r;
}

int collie_comm_join_from_env(collie_engine *e, const collie_grow_opts *go, collie_comm **out) {
    if (out) *out = NULL;
    int res = cl_config_check();
    if (res != COLLIE_OK) return res;
    const cl_config *cfg = cl_config_get();
    if (cfg->rank < 0 || !cfg->store_addr)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_comm_join_from_env: COLLIE_RANK and COLLIE_STORE_ADDR "
                                 "must be set (collie-run sets them)");
    collie_grow_opts g = COLLIE_GROW_OPTS_INIT;
    if (go) memcpy(&g, go, go->size < sizeof g ? go->size : sizeof g);
    g.size = sizeof g;
    if (!go || go->rank < 0) g.rank = cfg->rank;
    const char *name = g.comm && g.comm->name ? g.comm->name : "world";
    collie_store *s;
    if ((res = collie_store_connect(e, cfg->store_addr, NULL, &s)) != COLLIE_OK) return res;
    res = collie_comm_join(e, s, name, &g, out);
    collie_store_destroy(s); /* the comm has its own handle on the connection */
    return res;
}
