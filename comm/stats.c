/*
 * stats.c — a communicator's counters for monitoring (collie_comm_get_stats).
 *
 * Design notes
 *  - Counting must cost nothing next to a collective: a few relaxed atomic
 *    adds per work, no lock. `posted` is bumped on the posting thread before
 *    the engine can see the work (so a reader never finds more works ended
 *    than posted); the rest when the work's result is published, before its
 *    completion is visible (its end, coll_end.c, on whichever thread ends
 *    it): a caller whose wait returned finds its work counted.
 *  - A snapshot reads `ended` before `posted`, so in_flight = posted - ended
 *    never goes negative. Fields are each exact, not read at one instant.
 *  - Backends report what only they know (open connections) through the
 *    stat_add service: counters live here, not in backend state a reader
 *    on another thread could not touch.
 *  - Latencies go into power-of-two microsecond buckets: one clz per work,
 *    and a fixed array an exporter turns into Prometheus `le` buckets.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "store/store.h"

_Static_assert(COLLIE_COLL_NUM_KINDS <= COLLIE_STATS_OPS, "COLLIE_STATS_OPS too small");

#define RELAXED memory_order_relaxed

const char *collie_stats_op_name(int i) {
    return i >= 0 && i < COLLIE_COLL_NUM_KINDS ? collie_coll_kind_name((collie_coll_kind)i) : NULL;
}

int64_t collie_latency_bucket_le_us(int i) {
    if (i < 0 || i >= COLLIE_LATENCY_BUCKETS - 1) return -1;
    return (int64_t)1 << i;
}

/* bucket of a latency: 0 under 1 us, i for [2^(i-1), 2^i) us */
static int latency_bucket(int64_t ns) {
    uint64_t us = ns > 0 ? (uint64_t)ns / 1000 : 0;
    int b = us ? 64 - __builtin_clzll(us) : 0;
    return b < COLLIE_LATENCY_BUCKETS ? b : COLLIE_LATENCY_BUCKETS - 1;
}

void cl_stats_posted(collie_comm *c, int delta) {
    /* a negative delta wraps to a subtraction (unsigned arithmetic) */
    atomic_fetch_add_explicit(&c->counters.posted, (uint64_t)(int64_t)delta, RELAXED);
}

void cl_stats_ended(collie_comm *c, const cl_coll_work *cw) {
    cl_comm_counters *k = &c->counters;
    const collie_work *w = &cw->base;
    if (w->status != COLLIE_OK) {
        int i = -w->status;
        if (i <= 0 || i >= COLLIE_STATS_STATUSES) i = COLLIE_STATS_STATUSES - 1;
        atomic_fetch_add_explicit(&k->by_status[i], 1, RELAXED);
        /* its fault's data is filled before the stats (coll_end.c) */
        int kind = cw->fault.kind;
        if (kind > COLLIE_FAULT_NONE && kind < COLLIE_FAULT_NUM_KINDS)
            atomic_fetch_add_explicit(&k->by_kind[kind], 1, RELAXED);
        atomic_fetch_add_explicit(&k->failed, 1, RELAXED);
        return;
    }
    atomic_fetch_add_explicit(&k->bytes, w->bytes, RELAXED);
    if ((unsigned)cw->args.kind < COLLIE_STATS_OPS) {
        int64_t ns = w->end_ns > w->post_ns ? w->end_ns - w->post_ns : 0;
        cl_latency_counters *l = &k->latency[cw->args.kind];
        atomic_fetch_add_explicit(&l->buckets[latency_bucket(ns)], 1, RELAXED);
        atomic_fetch_add_explicit(&l->sum_ns, (uint64_t)ns, RELAXED);
        atomic_fetch_add_explicit(&l->count, 1, RELAXED);
    }
    /* last: a reader that sees it completed sees its latency counted */
    atomic_fetch_add_explicit(&k->completed, 1, memory_order_release);
}

void cl_stats_backend_add(collie_bcomm *bc, int which, int64_t delta) {
    if (!bc || !bc->comm) return;
    if (which == COLLIE_BSTAT_CONNECTIONS)
        atomic_fetch_add_explicit(&bc->comm->counters.connections, (int32_t)delta, RELAXED);
    else if (which == COLLIE_BSTAT_SHM_CONNECTIONS)
        atomic_fetch_add_explicit(&bc->comm->counters.shm_connections, (int32_t)delta, RELAXED);
    else if (which == COLLIE_BSTAT_SHM_SINGLE_COPY_BYTES && delta > 0)
        atomic_fetch_add_explicit(&bc->comm->counters.shm_single_copy_bytes, (uint64_t)delta,
                                  RELAXED);
}

int collie_comm_get_stats(const collie_comm *c, collie_comm_stats *st) {
    if (!c || !st) return cl_set_last_error(COLLIE_EINVAL, "collie_comm_get_stats: NULL argument");
    size_t want = st->size;
    if (want < offsetof(collie_comm_stats, failed_by_status))
        return cl_set_last_error(COLLIE_EINVAL,
                                 "collie_comm_get_stats: size %zu is too small (set it with "
                                 "COLLIE_COMM_STATS_INIT)",
                                 want);
    collie_comm_stats s;
    memset(&s, 0, sizeof s);
    cl_comm_counters *k = (cl_comm_counters *)&c->counters; /* atomics: read-only use */
    s.generation = c->generation;
    s.status = atomic_load_explicit(&c->err_status, memory_order_acquire);
    int32_t conns = atomic_load_explicit(&k->connections, RELAXED);
    s.connections = conns > 0 ? (uint32_t)conns : 0;
    conns = atomic_load_explicit(&k->shm_connections, RELAXED);
    s.shm_connections = conns > 0 ? (uint32_t)conns : 0;
    s.shm_single_copy_bytes = atomic_load_explicit(&k->shm_single_copy_bytes, RELAXED);
    s.completed = atomic_load_explicit(&k->completed, memory_order_acquire);
    s.failed = atomic_load_explicit(&k->failed, RELAXED);
    s.posted = atomic_load_explicit(&k->posted, RELAXED); /* after the ended ones */
    uint64_t ended = s.completed + s.failed;
    s.in_flight = s.posted > ended ? s.posted - ended : 0;
    s.bytes = atomic_load_explicit(&k->bytes, RELAXED);
    for (int i = 0; i < COLLIE_STATS_STATUSES; i++)
        s.failed_by_status[i] = atomic_load_explicit(&k->by_status[i], RELAXED);
    for (int i = 0; i < COLLIE_FAULT_NUM_KINDS; i++)
        s.failed_by_kind[i] = atomic_load_explicit(&k->by_kind[i], RELAXED);
    if (s.status != COLLIE_OK) s.fault_kind = c->fault.kind; /* written before err_status */
    for (int r = 0; r < c->size; r++) {
        int hs = r == c->rank ? COLLIE_PEER_SELF : cl_health_state(c, r);
        s.peers_dead += hs == COLLIE_PEER_DEAD;
        s.peers_suspected += hs == COLLIE_PEER_SUSPECTED;
        s.peers_left += hs == COLLIE_PEER_LEFT;
    }
    s.shrinks = c->line.shrinks;
    s.grows = c->line.grows;
    s.store_reconnects = cl_store_reconnects(c->store);
    s.stalls = cl_engine_stall_count(c->engine);
    for (int op = 0; op < COLLIE_STATS_OPS; op++) {
        cl_latency_counters *l = &k->latency[op];
        s.latency[op].count = atomic_load_explicit(&l->count, RELAXED);
        s.latency[op].sum_ns = atomic_load_explicit(&l->sum_ns, RELAXED);
        for (int b = 0; b < COLLIE_LATENCY_BUCKETS; b++)
            s.latency[op].buckets[b] = atomic_load_explicit(&l->buckets[b], RELAXED);
    }
    s.size = want < sizeof s ? want : sizeof s;
    memcpy(st, &s, s.size);
    return COLLIE_OK;
}

/* ---- COLLIE_STATS_DIR ------------------------------------------------------------ */

static void stats_write_json(const collie_comm *c, const collie_comm_stats *s, FILE *f) {
    fprintf(f,
            "{\"comm\":\"%s\",\"generation\":%llu,\"rank\":%d,\"size\":%d,\"status\":\"%s\","
            "\"posted\":%llu,\"completed\":%llu,\"failed\":%llu,\"in_flight\":%llu,"
            "\"bytes\":%llu,\"connections\":%u,\"shm_connections\":%u,"
            "\"shm_single_copy_bytes\":%llu,\"store_reconnects\":%llu,"
            "\"stalls\":%llu,\"fault_kind\":\"%s\",\"peers_dead\":%u,"
            "\"peers_suspected\":%u,\"peers_left\":%u,\"shrinks\":%u,\"grows\":%u,"
            "\"failed_by_status\":{",
            c->name, (unsigned long long)s->generation, c->rank, c->size,
            collie_status_name(s->status), (unsigned long long)s->posted,
            (unsigned long long)s->completed, (unsigned long long)s->failed,
            (unsigned long long)s->in_flight, (unsigned long long)s->bytes, s->connections,
            s->shm_connections, (unsigned long long)s->shm_single_copy_bytes,
            (unsigned long long)s->store_reconnects, (unsigned long long)s->stalls,
            collie_fault_kind_name(s->fault_kind), s->peers_dead, s->peers_suspected, s->peers_left,
            s->shrinks, s->grows);
    const char *sep = "";
    for (int i = 1; i < COLLIE_STATS_STATUSES; i++) {
        if (!s->failed_by_status[i]) continue;
        fprintf(f, "%s\"%s\":%llu", sep, collie_status_name(-i),
                (unsigned long long)s->failed_by_status[i]);
        sep = ",";
    }
    fprintf(f, "},\"failed_by_kind\":{");
    sep = "";
    for (int i = 1; i < COLLIE_FAULT_NUM_KINDS; i++) {
        if (!s->failed_by_kind[i]) continue;
        fprintf(f, "%s\"%s\":%llu", sep, collie_fault_kind_name(i),
                (unsigned long long)s->failed_by_kind[i]);
        sep = ",";
    }
    fprintf(f, "},\"latency_us_le\":[");
    for (int b = 0; b < COLLIE_LATENCY_BUCKETS; b++)
        fprintf(f, "%s%lld", b ? "," : "", (long long)collie_latency_bucket_le_us(b));
    fprintf(f, "],\"latency\":{");
    sep = "";
    for (int op = 0; op < COLLIE_STATS_OPS; op++) {
        const collie_latency_histogram *h = &s->latency[op];
        if (!h->count) continue;
        fprintf(f, "%s\"%s\":{\"count\":%llu,\"sum_ns\":%llu,\"buckets\":[", sep,
                collie_stats_op_name(op), (unsigned long long)h->count,
                (unsigned long long)h->sum_ns);
        for (int b = 0; b < COLLIE_LATENCY_BUCKETS; b++)
            fprintf(f, "%s%llu", b ? "," : "", (unsigned long long)h->buckets[b]);
        fprintf(f, "]}");
        sep = ",";
    }
    fprintf(f, "}}\n");
}

void cl_stats_write_on_destroy(collie_comm *c) {
    const char *dir = cl_config_get()->stats_dir;
    if (!dir) return;
    collie_comm_stats s = COLLIE_COMM_STATS_INIT;
    if (collie_comm_get_stats(c, &s) != COLLIE_OK) return;
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/stats-%s-g%llu-r%d.json", dir, c->name,
             (unsigned long long)c->generation, c->rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        CL_CERROR("comm", c, "cannot write stats to %s: %s", tmp, strerror(errno));
        return;
    }
    stats_write_json(c, &s, f);
    bool ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    /* renamed into place complete, so a reader never sees half a file */
    if (!ok || rename(tmp, path) != 0) {
        CL_CERROR("comm", c, "cannot write stats to %s: %s", path, strerror(errno));
        remove(tmp);
    }
}
