/*
 * comm_rendezvous_text.c — the rendezvous's texts in the store: a poisoned
 * generation's value (written and read), the "arrived" list and the
 * message of a barrier that timed out; and its best-effort, unawaited
 * writes (the announce before the barrier, the poison, the deletion of an
 * old generation's keys).
 *
 * Design notes
 *  - A poison is "<status>@<origin>|<why>" in "<prefix>conflict"
 *    (comm_rendezvous.c): <origin> is the rank that wrote it, so a rank
 *    failed by another's poison names it in its fault (view peer); a value
 *    without the origin has none (-1), one without the status counts as a
 *    conflict (EINVAL), and
 *    a status that is not one of collie's errors (COLLIE_STATUS_MAP) is
 *    text, not a code: a create never ends with a status no caller can
 *    name, whatever another store writer put there.
 *  - The timeout's message names the ranks that never arrived, from the
 *    "<prefix>arrived" list ("r r ... ", appended by each rank before its
 *    barrier); what is not a rank number below the size is skipped, a
 *    rank named twice counts once, and past 32 absent ranks it says how
 *    many more, so a hostile or garbled list cannot make it unreadable.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

int cl_rendezvous_poison_parse(const char *val, size_t len, char *why, size_t wlen, int *origin) {
    char buf[1040];
    snprintf(buf, sizeof buf, "%.*s", (int)len, val ? val : "");
    char *end;
    long st = strtol(buf, &end, 10);
    long from = -1;
    if (end != buf && *end == '@') { /* "@<rank>": digits only, below 2^24 */
        char *p = end + 1;
        for (from = 0; *p >= '0' && *p <= '9' && from < (1L << 24); p++)
            from = from * 10 + (*p - '0');
        if (p == end + 1 || from >= (1L << 24)) from = -2; /* malformed: not coded */
        end = p;
    }
    bool coded = end != buf && *end == '|' && cl_status_is_error(st) && from != -2;
    if (origin) *origin = coded ? (int)from : -1;
    const char *src = coded ? end + 1 : buf;
    size_t n = strlen(src);
    if (n >= wlen) n = wlen - 1;
    memcpy(why, src, n);
    why[n] = '\0';
    return coded ? (int)st : COLLIE_EINVAL;
}

/* "arrived" as a set of ranks (seen[r]); returns how many */
static int arrived_parse(const char *list, size_t len, int size, bool *seen) {
    int arrived = 0;
    for (size_t i = 0; i < len;) {
        while (i < len && list[i] == ' ')
            i++;
        long r = 0;
        bool digits = false;
        for (; i < len && list[i] >= '0' && list[i] <= '9' && r < size; i++, digits = true)
            r = r * 10 + (list[i] - '0');
        while (i < len && list[i] != ' ') /* anything else: skipped */
            i++;
        if (digits && r < size && !seen[r]) {
            seen[r] = true;
            arrived++;
        }
    }
    return arrived;
}

void cl_rendezvous_timeout_text(const collie_comm *c, const char *list, size_t len, char *out,
                                size_t outlen) {
    int n = snprintf(out, outlen, "rank %d: not every rank arrived within %d ms", c->rank,
                     (int)c->create_timeout_ms);
    bool *seen = list ? calloc((size_t)c->size, sizeof *seen) : NULL;
    if (!seen) {
        snprintf(out + n, outlen - (size_t)n,
                 " (comm '%s' generation %llu; who did is unknown: the store did not say)", c->name,
                 (unsigned long long)c->generation);
        return;
    }
    int arrived = arrived_parse(list, len, c->size, seen);
    n += snprintf(out + n, outlen - (size_t)n,
                  ": %d of %d did (comm '%s' generation %llu); never arrived:", arrived, c->size,
                  c->name, (unsigned long long)c->generation);
    int named = 0;
    for (int r = 0; r < c->size && (size_t)n < outlen; r++) {
        if (seen[r]) continue;
        if (named++ == 32) { /* the message stays readable */
            n += snprintf(out + n, outlen - (size_t)n, " and %d more", c->size - arrived - 32);
            break;
        }
        n += snprintf(out + n, outlen - (size_t)n, "%s rank %d", named > 1 ? "," : "", r);
    }
    free(seen);
}

static void forget_done(collie_work *w, void *arg) {
    (void)arg;
    collie_work_release(w);
}

/* Ahead of the barrier on the same connection, so they are there before
 * this rank counts (best effort, unawaited): who arrived, for a timeout's
 * message (a rank missing from it is named as absent), and this process,
 * for same-host peers to watch (health.c). */
void cl_rendezvous_announce(collie_comm *c, int32_t timeout_ms) {
    char key[160], mine[16];
    int n = snprintf(mine, sizeof mine, "%d ", c->rank);
    collie_post_opts ao = COLLIE_POST_OPTS_INIT;
    ao.timeout_ms = timeout_ms;
    ao.cb = forget_done;
    collie_work *aw;
    snprintf(key, sizeof key, "%sarrived", c->prefix);
    (void)collie_store_post_append(c->store, key, mine, (size_t)n, &ao, &aw);
    cl_health_publish(c, timeout_ms);
}

/* Poison c's generation with "<status>@<rank>|<why>" and open its barrier
 * (unawaited, pipelined in order: the cause is there before the barrier
 * opens); the first outcome wins (made, or the first poison). */
void cl_rendezvous_post_poison(collie_comm *c, int status, const char *why) {
    char key[160], val[1040];
    int n = snprintf(val, sizeof val, "%d@%d|%s", status, c->rank, why);
    if (n < 0 || (size_t)n >= sizeof val) n = (int)strlen(val);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 1000;
    o.cb = forget_done; /* best effort: the others' own timeout is the fallback */
    collie_work *pw;
    snprintf(key, sizeof key, "%sconflict", c->prefix);
    if (collie_store_post_compare_set(c->store, key, "", 0, val, (size_t)n, &o, &pw) != COLLIE_OK)
        return;
    snprintf(key, sizeof key, "%screated", c->prefix);
    (void)collie_store_post_add(c->store, key, 1 << 30, &o, &pw);
}

void cl_comm_forget_generation(collie_comm *c, uint64_t gen) {
    char prefix[112];
    snprintf(prefix, sizeof prefix, "collie/%s/%llu/", c->name, (unsigned long long)gen);
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 5000;
    o.cb = forget_done; /* best effort: a failure leaves garbage, nothing else */
    collie_work *w;
    if (collie_store_post_delete_prefix(c->store, prefix, &o, &w) != COLLIE_OK)
        cl_log_comm(CL_LOG_INFO, "comm", c->name, -1,
                    "could not delete the keys of generation %llu: %s", (unsigned long long)gen,
                    collie_last_error());
}
