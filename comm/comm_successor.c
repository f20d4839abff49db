/*
 * comm_successor.c — what the works that make a comm from another's
 * membership (shrink, grow, join) share: handing the new comm to the
 * caller (collie_comm_work_comm), the rank map, the options, and the start
 * and end of such a work.
 *
 * Design notes
 *  - The new comm belongs to its work until taken, once; a work released
 *    with its comm never taken destroys it (destroy_post: never blocks,
 *    whichever thread drops the last reference).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

int cl_comm_work_init(collie_work *w, collie_engine *e, const cl_work_ops *ops,
                      const collie_post_opts *o) {
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = cl_opt(o, cb, NULL);
    po.cb_arg = cl_opt(o, cb_arg, NULL);
    po.cq = cl_opt(o, cq, NULL);
    po.tag = cl_opt(o, tag, 0);
    po.timeout_ms = COLLIE_TIMEOUT_INFINITE; /* its steps carry the bounds */
    return cl_work_init(w, e, ops, &po, COLLIE_TIMEOUT_INFINITE);
}

void cl_successor_fini(cl_successor_work *s) {
    if (s->create) collie_work_release(s->create);
    s->create = NULL;
    if (s->made && !atomic_load(&s->taken)) {
        collie_work *d = NULL;
        if (collie_comm_destroy_post(s->made, NULL, &d) == COLLIE_OK)
            collie_work_release(d);
        else
            collie_comm_destroy(s->made); /* its engine is gone: memory only */
    }
    s->made = NULL;
}

int cl_change_begin(collie_comm *c, struct cl_change_slot *s, const char *what, int *attempt) {
    pthread_mutex_lock(&c->mu);
    int r = COLLIE_OK;
    if (s->running)
        r = cl_set_last_error(COLLIE_ESTATE, "collie_comm_%s: a %s of comm '%s' is in progress",
                              what, what, c->name);
    else if (s->done || c->shrink_slot.done)
        r = cl_set_last_error(
            COLLIE_ESTATE, "collie_comm_%s: comm '%s' was %s already (into '%s'): use that one",
            what, c->name, c->shrink_slot.done ? "shrunk" : "grown", c->line.successor);
    else
        s->running = true;
    *attempt = s->attempt;
    pthread_mutex_unlock(&c->mu);
    return r;
}

void cl_change_end(collie_comm *c, struct cl_change_slot *s, int attempt, bool ok, bool spent) {
    pthread_mutex_lock(&c->mu);
    s->running = false;
    s->done |= ok;
    if (!ok && spent && s->attempt <= attempt) s->attempt = attempt + 1;
    pthread_mutex_unlock(&c->mu);
}

void cl_comm_note_successor(collie_comm *c, const char *name) {
    pthread_mutex_lock(&c->mu);
    snprintf(c->line.successor, sizeof c->line.successor, "%s", name);
    pthread_mutex_unlock(&c->mu);
}

int cl_successor_wait(collie_work *w, collie_comm **out) {
    int r = collie_work_wait(w, COLLIE_TIMEOUT_INFINITE); /* the work ends itself */
    if (r == COLLIE_OK) r = collie_comm_work_comm(w, out);
    char why[1024] = "";
    if (r != COLLIE_OK) snprintf(why, sizeof why, "%s", collie_work_error_message(w));
    /* the release may destroy a comm the work made (cl_successor_fini),
     * which clears this thread's last error: set it after */
    collie_work_release(w);
    if (r != COLLIE_OK) cl_set_last_error(r, "%s", why);
    return r;
}

int collie_comm_work_comm(collie_work *w, collie_comm **out) {
    if (out) *out = NULL;
    if (!w || !out || !(cl_comm_is_shrink_work(w) || cl_comm_is_grow_work(w)))
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_comm_work_comm: not a shrink, grow or join work");
    if (!cl_work_done(w)) return COLLIE_INPROGRESS;
    if (w->status != COLLIE_OK) return w->status;
    cl_successor_work *s = (cl_successor_work *)w;
    if (atomic_exchange(&s->taken, true))
        return cl_set_last_error(COLLIE_ENOENT,
                                 "collie_comm_work_comm: the comm was taken already");
    *out = s->made;
    return COLLIE_OK;
}

int collie_comm_rank_map(const collie_comm *c, int *map, int n) {
    if (!c || n < 0 || (!map && n > 0))
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_rank_map: %s",
                                 !c      ? "comm is NULL"
                                 : n < 0 ? "n is negative"
                                         : "map is NULL");
    if (!c->rank_map)
        return cl_set_last_error(
            COLLIE_ESTATE, "collie_comm_rank_map: comm '%s' was not made by a shrink", c->name);
    for (int r = 0; r < n && r < c->rank_map_n; r++)
        map[r] = c->rank_map[r];
    return c->rank_map_n;
}

int cl_comm_successor_opts(const collie_comm *c, const collie_comm_opts *o, collie_comm_opts *out,
                           cl_backend_spec *spec) {
    collie_comm_opts co = COLLIE_COMM_OPTS_INIT;
    if (o) memcpy(&co, o, o->size < sizeof co ? o->size : sizeof co);
    co.size = sizeof co;
    co.backend = NULL; /* parsed into *spec now: the caller's string may go */
    if (co.device < 0) co.device = c->device;
    if (co.timeout_ms == 0) co.timeout_ms = c->timeout_ms;
    if (co.policy == COLLIE_POLICY_DEFAULT) co.policy = c->policy;
    if (!o) {
        co.on_error = c->on_error;
        co.on_error_arg = c->on_error_arg;
    }
    *out = co;
    *spec = c->spec;
    const char *b = cl_opt(o, backend, NULL);
    return b ? cl_backend_parse_spec(b, spec) : COLLIE_OK;
}
