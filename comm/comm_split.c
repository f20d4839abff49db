/*
 * comm_split.c — subgroups: collie_comm_split and collie_comm_new_group.
 *
 * Design notes
 *  - Both are called by every rank of the parent, in the same order (as in
 *    PyTorch), so each rank's count of group creations on the parent (k)
 *    agrees without messages and names the child: "<parent>.g<k>" or
 *    "<parent>.s<k>.<colour>" (hashed when longer than a comm name may be).
 *  - split exchanges (colour, key) through the parent's store namespace —
 *    one set and one multi_get per rank, O(N) messages in all — then each
 *    member creates the child comm with the usual rendezvous. A rank with
 *    COLLIE_UNDEFINED only sets its colour (the members read it): it has
 *    nothing to learn from the others', so it never waits for a rank that
 *    is late or dead. A rank with
 *    colour COLLIE_UNDEFINED, or missing from new_group's list, gets
 *    COLLIE_ENOTMEMBER and no object: nothing half-built is ever returned.
 *  - new_group compares nothing itself: each member hands its list (as
 *    text, members_text) to the child's rendezvous, which holds every
 *    member of a generation to the same list as it holds them to the same
 *    size (comm_rendezvous.c): members given different lists fail with
 *    COLLIE_EINVAL naming both lists, never form a comm.
 *  - Both block, bounded by the create timeout of their options, else the
 *    parent's. Each wait of a split watches the parent: once it has failed
 *    (an abort from another thread, a dead peer) the split ends at once
 *    with the parent's fault rather than at its deadline (split_wait; the
 *    child's rendezvous: comm_create.c).
 *  - A child inherits the parent's backends and device unless its options
 *    name others. A backend that can build children from the parent
 *    (ops->split: NCCL's ncclCommSplit, collective over the parent) does
 *    so for the members; every other rank of the parent takes part through
 *    split_skip (new_group is a split with colour 0 and the list order as
 *    the key), so no member waits for a rank that skipped the call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/hash.h"
#include "comm/comm.h"
#include "engine/engine.h"

void cl_comm_child_name(const collie_comm *parent, const char *suffix, char *out, size_t len) {
    int n = snprintf(out, len, "%s.%s", parent->name, suffix);
    if (n > 0 && (size_t)n <= 64) return;
    uint64_t h = cl_fnv1a_str(cl_fnv1a_str(CL_FNV1A_OFFSET, parent->prefix), suffix);
    snprintf(out, len, "grp.%016llx", (unsigned long long)h);
}

/* new_group's list as text for the rendezvous to compare: "2,1"; one too
 * long for `len` is cut and ends with a hash of the whole list, so two
 * lists compare equal only if they are. */
static void members_text(const int *ranks, int n, char *out, size_t len) {
    uint64_t h = CL_FNV1A_OFFSET; /* FNV-1a over the ranks, in order */
    size_t used = 0;
    bool cut = false;
    for (int i = 0; i < n; i++) {
        h = cl_fnv1a_mix(h, (uint32_t)ranks[i]);
        char one[16];
        int m = snprintf(one, sizeof one, "%s%d", i ? "," : "", ranks[i]);
        if (!cut && used + (size_t)m + 24 < len) {
            memcpy(out + used, one, (size_t)m);
            used += (size_t)m;
        } else {
            cut = true;
        }
    }
    out[used] = '\0';
    if (cut) snprintf(out + used, len - used, ",...#%016llx", (unsigned long long)h);
}

void cl_comm_members_text_of(const char *list, char *out, size_t len) {
    size_t n = strlen(list);
    if (n < len) {
        memcpy(out, list, n + 1);
        return;
    }
    uint64_t h = cl_fnv1a_str(CL_FNV1A_OFFSET, list);
    size_t keep = len > 25 ? len - 25 : 0;
    memcpy(out, list, keep);
    snprintf(out + keep, len - keep, ",...#%016llx", (unsigned long long)h);
}

static collie_comm_opts child_opts(const collie_comm *parent, const collie_comm_opts *o,
                                   const char *name) {
    collie_comm_opts co = COLLIE_COMM_OPTS_INIT;
    if (o) memcpy(&co, o, o->size < sizeof co ? o->size : sizeof co);
    co.size = sizeof co;
    co.name = name;
    if (co.device < 0) co.device = parent->device;
    if (co.timeout_ms == 0) co.timeout_ms = parent->timeout_ms;
    if (co.create_timeout_ms == 0) co.create_timeout_ms = parent->create_timeout_ms;
    if (co.policy == COLLIE_POLICY_DEFAULT) co.policy = parent->policy;
    return co;
}

/* Would a child made with opts `o` run the parent's backend on device d?
 * (Without a spec of its own it inherits the parent's.) */
static bool child_shares(const collie_comm *c, const collie_comm_opts *o, int d) {
    const char *spec = cl_opt(o, backend, NULL);
    if (!spec) return true;
    cl_backend_spec cs;
    return cl_backend_parse_spec(spec, &cs) == COLLIE_OK && cs.ops[d] == c->spec.ops[d];
}

/* Every rank of the parent takes part in each split of a backend that
 * builds children from the parent (ops->split): a rank that gets no child
 * of that backend (`member` false: not in the group; or a child with
 * another backend) joins through split_skip, in post order. */
static int split_skips(collie_comm *c, bool member, const collie_comm_opts *o, int key,
                       const char *who) {
    for (int d = 0; d < CL_NUM_DEVICES; d++) {
        collie_bcomm *bc = &c->bcs[d];
        if (!bc->ops || !bc->ops->split || !bc->ops->split_skip || !bc->state || !bc->ready)
            continue;
        if (member && child_shares(c, o, d)) continue;
        /* "not now" while the parent has a call in progress: the loop drives
         * it meanwhile (so the comm's lock is not held while waiting) */
        int64_t until = cl_deadline_ns(cl_now_ns(), c->create_timeout_ms);
        int r;
        for (;;) {
            cl_clear_last_error();
            pthread_mutex_lock(&c->mu);
            r = bc->ops->split_skip(bc->state, key);
            pthread_mutex_unlock(&c->mu);
            if (r != COLLIE_INPROGRESS || cl_now_ns() >= until) break;
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
        if (r == COLLIE_OK) continue;
        char why[256];
        snprintf(why, sizeof why, "%s",
                 r == COLLIE_INPROGRESS ? "the parent was still busy at the creation timeout"
                                        : collie_last_error());
        return cl_set_last_error(r == COLLIE_INPROGRESS ? COLLIE_ETIMEDOUT : r,
                                 "%s: backend %s of comm '%s' could not take part in the split: %s",
                                 who, bc->ops->name, c->name, why);
    }
    return COLLIE_OK;
}

static int parent_check(collie_comm *c, collie_comm **out, const collie_comm_opts *o,
                        const char *who) {
    if (out) *out = NULL;
    if (!c || !out) return cl_set_last_error(COLLIE_EINVAL, "%s: comm and out are required", who);
    if (!cl_opts_ok(o, offsetof(collie_comm_opts, device)))
        return cl_set_last_error(COLLIE_EINVAL, "%s: opts.size not set", who);
    if (atomic_load(&c->state) != CL_COMM_READY)
        return cl_set_last_error(COLLIE_ESTATE, "%s: comm '%s' is not ready (%s)", who, c->name,
                                 c->err_msg[0] ? c->err_msg : "still being created");
    return COLLIE_OK;
}

int collie_comm_new_group(collie_comm *c, const int *ranks, int n, const collie_comm_opts *o,
                          collie_comm **out) {
    cl_clear_last_error();
    int r = parent_check(c, out, o, "collie_comm_new_group");
    if (r != COLLIE_OK) return r;
    if (!ranks || n < 1 || n > c->size)
        return cl_set_last_error(COLLIE_EINVAL, "collie_comm_new_group: %d ranks given", n);
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size)
            return cl_set_last_error(COLLIE_EINVAL,
                                     "collie_comm_new_group: rank %d is not in comm '%s' (size "
                                     "%d)",
                                     ranks[i], c->name, c->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return cl_set_last_error(
                    COLLIE_EINVAL, "collie_comm_new_group: rank %d is listed twice", ranks[i]);
        if (ranks[i] == c->rank) me = i;
    }
    int k = atomic_fetch_add(&c->groups_made, 1);
    /* as a split: colour 0 for the members, the list order as the key */
    r = split_skips(c, me >= 0, o, me, "collie_comm_new_group");
    if (r != COLLIE_OK) return r;
    if (me < 0)
        return cl_set_last_error(COLLIE_ENOTMEMBER,
                                 "collie_comm_new_group: rank %d of '%s' is not in the group",
                                 c->rank, c->name);
    char suffix[32], name[72], list[sizeof c->split.members];
    snprintf(suffix, sizeof suffix, "g%d", k);
    cl_comm_child_name(c, suffix, name, sizeof name);
    members_text(ranks, n, list, sizeof list);
    collie_comm_opts co = child_opts(c, o, name);
    return cl_comm_create_child(c, me, n, &co, 0, me, list, out);
}

bool cl_comm_wait_watching(collie_comm *watched, collie_work *w, int *status) {
    for (;;) { /* bounded by w's deadline */
        *status = collie_work_wait(w, 20);
        if (*status != COLLIE_INPROGRESS) return true;
        if (atomic_load(&watched->err_status) != COLLIE_OK) return false;
    }
}

/* Waits for w, a step of a split of c: once c has failed, w is cancelled
 * and the split fails at once with c's fault (COLLIE_EABORTED). */
static int split_wait(collie_comm *c, collie_work *w, const char *who) {
    int r;
    if (cl_comm_wait_watching(c, w, &r)) return r;
    collie_work_cancel(w);
    collie_work_wait(w, COLLIE_TIMEOUT_INFINITE);
    return cl_set_last_error(COLLIE_EABORTED, "%s: comm '%s' failed during the split: %s", who,
                             c->name, c->err_msg);
}

typedef struct split_entry {
    int color, key, rank;
} split_entry;

static int split_cmp(const void *a, const void *b) {
    const split_entry *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

int collie_comm_split(collie_comm *c, int color, int key, const collie_comm_opts *o,
                      collie_comm **out) {
    cl_clear_last_error();
    int r = parent_check(c, out, o, "collie_comm_split");
    if (r != COLLIE_OK) return r;
    if (color < 0 && color != COLLIE_UNDEFINED)
        return cl_set_last_error(
            COLLIE_EINVAL, "collie_comm_split: colour %d (use >= 0 or COLLIE_UNDEFINED)", color);
    int k = atomic_fetch_add(&c->groups_made, 1);
    int n = c->size;
    char **keys = calloc((size_t)n, sizeof *keys);
    split_entry *all = calloc((size_t)n, sizeof *all);
    collie_work *got = NULL;
    int res = COLLIE_ENOMEM;
    if (!keys || !all) goto out;
    for (int i = 0; i < n; i++) {
        keys[i] = malloc(strlen(c->prefix) + 32);
        if (!keys[i]) goto out;
        sprintf(keys[i], "%ssplit%d/%d", c->prefix, k, i);
    }
    char mine[32];
    snprintf(mine, sizeof mine, "%d,%d", color, key);
    int32_t t = cl_opt(o, create_timeout_ms, 0) ? o->create_timeout_ms : c->create_timeout_ms;
    CL_CHECK_GOTO(collie_store_set(c->store, keys[c->rank], mine, strlen(mine), t), res, out);
    if (color == COLLIE_UNDEFINED) { /* nothing to learn from the others' colours */
        res = split_skips(c, false, o, key, "collie_comm_split");
        if (res == COLLIE_OK)
            res = cl_set_last_error(COLLIE_ENOTMEMBER,
                                    "collie_comm_split: rank %d of '%s' chose COLLIE_UNDEFINED",
                                    c->rank, c->name);
        goto out;
    }
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = t;
    CL_CHECK_GOTO(
        collie_store_post_multi_get(c->store, (const char *const *)keys, (size_t)n, &po, &got), res,
        out);
    if ((res = split_wait(c, got, "collie_comm_split")) != COLLIE_OK) {
        if (res != COLLIE_EABORTED)
            res = cl_set_last_error(res, "%s", collie_work_error_message(got));
        goto out;
    }
    int members = 0, me = -1;
    for (int i = 0; i < n; i++) {
        int col, ky;
        const void *val = NULL;
        size_t len;
        if (collie_store_work_value_at(got, (size_t)i, &val, &len) != COLLIE_OK ||
            sscanf(val, "%d,%d", &col, &ky) != 2) {
            res = cl_set_last_error(COLLIE_EPROTO, "collie_comm_split: rank %d sent '%s'", i,
                                    val ? (const char *)val : "");
            goto out;
        }
        if (col != color) continue;
        all[members++] = (split_entry){col, ky, i};
    }
    res = split_skips(c, true, o, key, "collie_comm_split");
    if (res != COLLIE_OK) goto out;
    qsort(all, (size_t)members, sizeof *all, split_cmp);
    for (int i = 0; i < members; i++)
        if (all[i].rank == c->rank) me = i;
    char suffix[40], name[72];
    snprintf(suffix, sizeof suffix, "s%d.%d", k, color);
    cl_comm_child_name(c, suffix, name, sizeof name);
    collie_comm_opts co = child_opts(c, o, name);
    res = cl_comm_create_child(c, me, members, &co, color, key, NULL, out);
out:
    for (int i = 0; keys && i < n; i++)
        free(keys[i]);
    free(keys);
    free(all);
    collie_work_release(got);
    return res;
}
