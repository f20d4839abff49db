/*
 * comm_create.c — creating a communicator: the options checked, the comm
 * allocated, its rendezvous posted (comm_rendezvous.c runs it); blocking,
 * non-blocking, from the environment, a split's child, and the successor a
 * shrink or grow makes (cl_comm_create_successor: its lineage and the old
 * comm its backends may build from).
 *
 * Design notes
 *  - Everything the caller got wrong is found here, on its thread, before
 *    anything is allocated or sent: a bad option is COLLIE_EINVAL naming
 *    it, and no comm.
 *  - The blocking create is post + wait; the wait is bounded by the create
 *    work's deadline (the create timeout plus a grace). A split's child
 *    waits watching its parent: a parent that fails ends the wait at once.
 *  - A failed post leaves nothing: the comm is released before the error
 *    returns. Nothing here waits for the loop (the comm becomes a resident
 *    of its engine in the create work's start), so create_post is safe on
 *    an event loop.
 *  - The comm takes a handle of its own on the caller's store connection
 *    (collie_store_prefix with ""), released when the comm is: the
 *    caller's handle may go first.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "engine/engine.h"

/* ---- options ------------------------------------------------------------------------ */

int cl_comm_check_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 64)
        return cl_set_last_error(COLLIE_EINVAL, "comm name '%s' must have 1 to 64 characters",
                                 name);
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return cl_set_last_error(COLLIE_EINVAL,
                                     "comm name '%s': character '%c' is not allowed (use "
                                     "letters, digits, '_', '-', '.')",
                                     name, *p);
    return COLLIE_OK;
}

/* What collie_comm_create was asked for, checked. */
typedef struct comm_params {
    const char *name;
    int32_t timeout_ms, create_timeout_ms;
    collie_error_policy policy;
    cl_backend_spec spec;
} comm_params;

/* Check the arguments and options (caller's thread; nothing allocated). */
static int comm_check_params(collie_engine *e, collie_store *store, int rank, int size,
                             const collie_comm_opts *o, comm_params *p) {
    if (!e || !store || !o)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_create: engine and store are "
                                                "required");
    if (size < 1 || rank < 0 || rank >= size)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_comm_create: rank %d is not in [0, size %d)", rank, size);
    int res;
    p->name = cl_opt(o, name, NULL);
    if (!p->name) p->name = "world";
    if ((res = cl_comm_check_name(p->name)) != COLLIE_OK) return res;
    int32_t timeout = cl_opt(o, timeout_ms, 0), ctimeout = cl_opt(o, create_timeout_ms, 0);
    if (timeout < COLLIE_TIMEOUT_INFINITE || ctimeout < COLLIE_TIMEOUT_INFINITE)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_comm_create: timeout_ms %d / create_timeout_ms %d "
                                 "invalid (> 0, 0 for the default, or COLLIE_TIMEOUT_INFINITE)",
                                 (int)timeout, (int)ctimeout);
    if (timeout == 0) timeout = cl_config_get()->timeout_ms;
    if (ctimeout == 0) ctimeout = timeout;
    p->timeout_ms = timeout;
    p->create_timeout_ms = ctimeout;
    p->policy = cl_opt(o, policy, COLLIE_POLICY_DEFAULT);
    if ((int)p->policy < COLLIE_POLICY_DEFAULT || p->policy > COLLIE_POLICY_NONE)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_create: unknown error policy %d",
                                 (int)p->policy);
    if (p->policy == COLLIE_POLICY_DEFAULT &&
        (res = cl_comm_policy_from_env(&p->policy)) != COLLIE_OK)
        return res;
    return cl_backend_parse_spec(cl_opt(o, backend, NULL), &p->spec);
}

static collie_comm *comm_alloc(collie_engine *e, collie_store *store, int rank, int size,
                               const collie_comm_opts *o, int *res) {
    comm_params p;
    if ((*res = comm_check_params(e, store, rank, size, o, &p)) != COLLIE_OK) return NULL;
    collie_comm *c = calloc(1, sizeof *c);
    if (!c) {
        *res = COLLIE_ENOMEM;
        return NULL;
    }
    c->engine = e;
    /* a handle of its own on the store's connection (released with the
     * comm): the caller's may go at any time, also while a destroy posted
     * without waiting still talks to the store */
    if (collie_store_prefix(store, "", &c->store) != COLLIE_OK) {
        free(c);
        *res = COLLIE_ENOMEM;
        return NULL;
    }
    cl_list_init(&c->desyncs);
    cl_list_init(&c->failing.works);
    cl_list_init(&c->waiting);
    cl_list_init(&c->active);
    snprintf(c->name, sizeof c->name, "%s", p.name);
    snprintf(c->family, sizeof c->family, "%s", p.name);
    c->rank = rank;
    c->size = size;
    c->aborted_by = -1;
    c->disagrees_with = -1;
    c->timeout_ms = p.timeout_ms;
    c->create_timeout_ms = p.create_timeout_ms;
    c->policy = p.policy;
    c->on_error = cl_opt(o, on_error, NULL);
    c->on_error_arg = cl_opt(o, on_error_arg, NULL);
    c->device = cl_opt(o, device, -1);
    c->spec = p.spec;
    for (int d = 0; d < CL_NUM_DEVICES; d++) {
        c->bcs[d].comm = c;
        c->bcs[d].poll_fd = -1;
        c->bcs[d].ops = p.spec.ops[d];
        if (p.spec.ops[d]) cl_coll_pool_init(&c->bcs[d]);
    }
    if (cl_flight_init(c) != COLLIE_OK) {
        collie_store_destroy(c->store);
        free(c);
        *res = COLLIE_ENOMEM;
        return NULL;
    }
    int hr = cl_health_init(c);
    if (hr != COLLIE_OK) {
        cl_flight_fini(c);
        free(c);
        *res = hr;
        return NULL;
    }
    if (cl_check_args_init(c) != COLLIE_OK)
        cl_log_comm(CL_LOG_WARN, "comm", c->name, -1, "COLLIE_CHECK_ARGS off: out of memory");
    atomic_init(&c->state, CL_COMM_CREATING);
    atomic_init(&c->err_status, COLLIE_OK);
    atomic_init(&c->refs, 1);
    atomic_init(&c->nactive, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    return c;
}

/* Replace the backends of a comm just allocated (a child inherits its
 * parent's). */
static void comm_set_spec(collie_comm *c, const cl_backend_spec *spec) {
    for (int d = 0; d < CL_NUM_DEVICES; d++)
        if (c->bcs[d].ops) cl_coll_pool_fini(&c->bcs[d]);
    c->spec = *spec;
    for (int d = 0; d < CL_NUM_DEVICES; d++) {
        c->bcs[d].ops = spec->ops[d];
        if (spec->ops[d]) cl_coll_pool_init(&c->bcs[d]);
    }
}

/* The child part of a creation (cl_comm_create_child), or NULL. */
typedef struct create_child {
    collie_comm *parent; /* a split's (held until the child is freed), else NULL */
    int color, key;
    const char *members;           /* new_group's list or a successor's agreement, or NULL */
    const cl_successor_args *succ; /* a successor's creation, or NULL */
} create_child;

/* A successor's parts of a comm just allocated (spec, rank map, family). */
static int create_successor_parts(collie_comm *c, const cl_successor_args *a) {
    if (a->spec) comm_set_spec(c, a->spec);
    if (a->map) {
        c->rank_map = malloc((size_t)a->map_n * sizeof *c->rank_map);
        if (!c->rank_map)
            return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_create: out of memory");
        memcpy(c->rank_map, a->map, (size_t)a->map_n * sizeof *c->rank_map);
        c->rank_map_n = a->map_n;
    }
    if (a->family) snprintf(c->family, sizeof c->family, "%s", a->family);
    c->line.how = a->how;
    if (a->from) {
        snprintf(c->line.from, sizeof c->line.from, "%s", a->from->name);
        c->line.from_gen = a->from->generation;
    }
    c->line.shrinks = a->shrinks;
    c->line.grows = a->grows;
    if (a->shrunk_from) {
        if (a->nexcluded > 0) {
            c->shrunk.excluded = malloc((size_t)a->nexcluded * sizeof *c->shrunk.excluded);
            if (!c->shrunk.excluded)
                return cl_set_last_error(COLLIE_ENOMEM, "collie_comm_create: out of memory");
            memcpy(c->shrunk.excluded, a->excluded,
                   (size_t)a->nexcluded * sizeof *c->shrunk.excluded);
            c->shrunk.nexcluded = a->nexcluded;
        }
        cl_comm_hold(a->shrunk_from); /* dropped when its rendezvous ends, or with c */
        c->shrunk.from = a->shrunk_from;
    }
    return COLLIE_OK;
}

static int create_post(collie_engine *e, collie_store *store, int rank, int size,
                       const collie_comm_opts *o, const create_child *child, collie_comm **out,
                       collie_work **work) {
    if (out) *out = NULL;
    if (work) *work = NULL;
    cl_clear_last_error();
    if (!out || !work) return cl_set_last_error(COLLIE_EINVAL, "collie_comm_create: out is NULL");
    if (!cl_opts_ok(o, offsetof(collie_comm_opts, device)))
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_create: opts.size not set (use "
                                                "COLLIE_COMM_OPTS_INIT)");
    collie_comm_opts dflt = COLLIE_COMM_OPTS_INIT;
    int res = cl_config_check();
    if (res != COLLIE_OK) return res;
    if ((res = cl_comm_trust_check(store, cl_opt(o, name, NULL))) != COLLIE_OK) return res;
    collie_comm *c = comm_alloc(e, store, rank, size, o ? o : &dflt, &res);
    if (!c) return res;
    if (child && child->succ) { /* nothing shared with the old comm */
        if ((res = create_successor_parts(c, child->succ)) != COLLIE_OK) {
            cl_comm_release(c);
            return res;
        }
    } else if (child) {
        if (!cl_opt(o, backend, NULL)) comm_set_spec(c, &child->parent->spec);
        cl_comm_hold(child->parent); /* dropped when c is freed (cl_comm_release) */
        c->split.parent = child->parent;
        c->split.color = child->color;
        c->split.key = child->key;
    }
    if (child && child->members)
        snprintf(c->split.members, sizeof c->split.members, "%s", child->members);
    if ((res = cl_comm_create_start(c, cl_opt(o, post, NULL), work)) != COLLIE_OK) return res;
    *out = c;
    return COLLIE_OK;
}
int collie_comm_create_post(collie_engine *e, collie_store *store, int rank, int size,
                            const collie_comm_opts *o, collie_comm **out, collie_work **work) {
    return create_post(e, store, rank, size, o, NULL, out, work);
}

static int create_blocking(collie_engine *e, collie_store *store, int rank, int size,
                           const collie_comm_opts *o, const create_child *child,
                           collie_comm **out) {
    collie_work *w;
    if (out) *out = NULL;
    int res = create_post(e, store, rank, size, o, child, out, &w);
    if (res != COLLIE_OK) return res;
    /* bounded by the work's deadline; a child's ends at once when its
     * parent fails meanwhile (an abort from another thread: comm_split.c) */
    if (!child) {
        res = collie_work_wait(w, COLLIE_TIMEOUT_INFINITE);
    } else if (!cl_comm_wait_watching(child->parent, w, &res)) {
        /* its rendezvous ends (the others' too: its generation poisoned),
         * unless it was made as the parent failed: then the child stands,
         * a comm of its own, not aborted by this rank (an abort here was
         * an app_abort no one asked for, on a comm returned OK: chaos) */
        cl_work_cancel(w, COLLIE_EABORTED, "its parent '%.80s' failed: %.150s", child->parent->name,
                       child->parent->err_msg);
        res = collie_work_wait(w, COLLIE_TIMEOUT_INFINITE);
    }
    if (res != COLLIE_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", collie_work_error_message(w));
        collie_work_release(w);
        collie_comm_destroy(*out);
        *out = NULL;
        return cl_set_last_error(res, "%s", msg);
    }
    collie_work_release(w);
    return COLLIE_OK;
}

int collie_comm_create(collie_engine *e, collie_store *store, int rank, int size,
                       const collie_comm_opts *o, collie_comm **out) {
    return create_blocking(e, store, rank, size, o, NULL, out);
}

int cl_comm_create_child(collie_comm *parent, int rank, int size, const collie_comm_opts *o,
                         int color, int key, const char *members, collie_comm **out) {
    create_child child = {parent, color, key, members, NULL};
    return create_blocking(parent->engine, parent->store, rank, size, o, &child, out);
}

int cl_comm_create_successor(const cl_successor_args *a, collie_comm **out, collie_work **work) {
    create_child child = {NULL, 0, a->rank, a->members, a};
    return create_post(a->engine, a->store, a->rank, a->size, a->o, &child, out, work);
}

int collie_comm_create_from_env(collie_engine *e, const collie_comm_opts *o, collie_comm **out) {
    if (out) *out = NULL;
    int res = cl_config_check();
    if (res != COLLIE_OK) return res;
    const cl_config *cfg = cl_config_get();
    if (cfg->rank < 0 || cfg->world_size < 1 || !cfg->store_addr)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_comm_create_from_env: COLLIE_RANK, COLLIE_WORLD_SIZE "
                                 "and COLLIE_STORE_ADDR must be set (collie-run sets them)");
    collie_store *s;
    if ((res = collie_store_connect(e, cfg->store_addr, NULL, &s)) != COLLIE_OK) return res;
    res = collie_comm_create(e, s, cfg->rank, cfg->world_size, o, out);
    if (res != COLLIE_OK) {
        collie_store_destroy(s);
        return res;
    }
    collie_store_destroy(s); /* the comm has its own handle on the connection */
    return COLLIE_OK;
}
