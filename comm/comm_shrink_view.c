/*
 * comm_shrink_view.c — what a shrink knows and tells (comm_shrink.c runs
 * the agreement): this rank's view of the failed set, the set as text and
 * its fault kind, the revoke of a comm that had not failed, and a rank left
 * out by the survivors.
 *
 * Design notes
 *  - The view is the comm's fault's suspects (the kinds that name failed
 *    ranks: dead, stuck, deadline, left) and the peers whose health is
 *    dead, left or suspected; never this rank itself.
 *  - The set's text is what the store holds (proposals, the decision) and
 *    what the "shrunk" control message carries: parsed strictly, so a
 *    value no collie rank writes is refused, never half-read.
 *  - A set's kind: peer_dead or peer_left when this rank knows every rank
 *    of it so, else peer_stuck (the revoke's notice and the agreed fault).
 *  - Being left out is final: an EXCLUDED event once, ENOTMEMBER on every
 *    later post (coll.c) and shrink, and the comm's fault if it had none.
 *    A "shrunk" notice is believed only from a rank that is not in its own
 *    set and about this rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/engine.h"

/* ---- the set as text: "1,3" ("-": empty) ------------------------------------- */

size_t cl_shrink_set_text_max(int n) { return (size_t)n * 12 + 8; }

void cl_shrink_set_format(const uint8_t *set, int n, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < n && used + 13 < len; r++)
        if (set[r]) used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", r);
    if (!used) snprintf(buf, len, "-");
}

/* strict: "-", or ranks ascending in [0, n), comma-separated, nothing else */
bool cl_shrink_set_parse(const char *s, size_t len, int n, uint8_t *set) {
    memset(set, 0, (size_t)n);
    if (len == 1 && s[0] == '-') return true;
    const char *p = s, *end = s + len;
    int last = -1;
    while (p < end) {
        long v = 0;
        const char *d = p;
        while (p < end && *p >= '0' && *p <= '9' && p - d < 10)
            v = v * 10 + (*p++ - '0');
        if (p == d || v <= last || v >= n) return false;
        set[v] = 1;
        last = (int)v;
        if (p < end && *p++ != ',') return false;
        if (p == end && end[-1] == ',') return false;
    }
    return last >= 0;
}

/* ---- this rank's view ------------------------------------------------------------ */

/* The ranks this rank knows failed: its comm's fault's suspects (kinds
 * that name failed ranks) and peers dead, left or suspected. */
void cl_shrink_view(collie_comm *c, uint8_t *failed) {
    pthread_mutex_lock(&c->mu);
    int kind = c->fault.kind;
    bool names_failed = kind == COLLIE_FAULT_PEER_DEAD || kind == COLLIE_FAULT_PEER_STUCK ||
                        kind == COLLIE_FAULT_DEADLINE || kind == COLLIE_FAULT_PEER_LEFT;
    if (atomic_load(&c->err_status) != COLLIE_OK && names_failed &&
        c->fault.view != COLLIE_FAULT_VIEW_AGREED)
        for (int i = 0; i < c->fault.nranks && i < COLLIE_FAULT_RANKS; i++)
            if (c->fault.ranks[i] >= 0 && c->fault.ranks[i] < c->size)
                failed[c->fault.ranks[i]] = 1;
    pthread_mutex_unlock(&c->mu);
    for (int r = 0; r < c->size; r++) {
        int s = cl_health_state(c, r);
        if (s == COLLIE_PEER_DEAD || s == COLLIE_PEER_LEFT || s == COLLIE_PEER_SUSPECTED)
            failed[r] = 1;
    }
    failed[c->rank] = 0;
}

bool cl_shrink_nothing_failed(collie_comm *c) {
    uint8_t *v = calloc((size_t)c->size, 1);
    if (!v) return false;
    cl_shrink_view(c, v);
    bool none = memchr(v, 1, (size_t)c->size) == NULL;
    free(v);
    return none && atomic_load(&c->err_status) == COLLIE_OK;
}

/* ---- the left-out ranks ------------------------------------------------------------ */

void cl_comm_shrink_excluded(collie_comm *c, int by) {
    if (atomic_exchange(&c->excluded, true)) return;
    cl_health_excluded(c, by);
    if (cl_engine_on_loop(c->engine))
        cl_comm_fault_data(c, COLLIE_ENOTMEMBER, NULL, false,
                           "rank %d was left out of comm '%s' by the survivors' shrink%s", c->rank,
                           c->name, by >= 0 ? " (its new rank 0 said so)" : "");
}

void cl_comm_shrink_notice(collie_comm *c, int from, const char *set, size_t len) {
    uint8_t *out = calloc((size_t)c->size, 1);
    if (out && cl_shrink_set_parse(set, len, c->size, out) && out[c->rank] && !out[from])
        cl_comm_shrink_excluded(c, from);
    free(out);
}

int cl_shrink_set_kind(collie_comm *c, const uint8_t *out) {
    bool all_dead = true, all_left = true;
    for (int r = 0; r < c->size; r++) {
        if (!out[r]) continue;
        int s = cl_health_state(c, r);
        all_dead &= s == COLLIE_PEER_DEAD;
        all_left &= s == COLLIE_PEER_LEFT;
    }
    return all_dead   ? COLLIE_FAULT_PEER_DEAD
           : all_left ? COLLIE_FAULT_PEER_LEFT
                      : COLLIE_FAULT_PEER_STUCK;
}

void cl_shrink_revoke(collie_comm *c, const uint8_t *out) {
    if (atomic_load(&c->err_status) != COLLIE_OK) return;
    cl_fault f;
    cl_fault_init(&f, cl_shrink_set_kind(c, out), COLLIE_FAULT_VIEW_LOCAL, c->rank);
    for (int r = 0; r < c->size; r++)
        if (out[r]) cl_fault_add(&f, r);
    cl_comm_abort_with(c, &f, "revoked: the comm is being shrunk to its survivors");
}
