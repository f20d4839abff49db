/*
 * flight.c — the per-comm flight recorder: a ring of the last N works.
 *
 * Design notes
 *  - N comes from COLLIE_TRACE_BUFFER (default 2048; 0 turns it off). The
 *    ring is allocated with the comm; recording never allocates.
 *  - A work gets a slot when posted (any thread) and updates it when it
 *    starts (loop) and ends (its ender's thread, before the end is
 *    visible: coll_end.c). A small mutex guards the ring: it is held for
 *    a few stores, never while calling out. A slot reused by a newer work
 *    (the ring wrapped) is not touched by the older one again.
 *  - The slot is written before the work can start (so its start and end
 *    always find it); a post refused after that (the backend's start on
 *    the caller's thread, or the engine closing) ends its slot as "post
 *    refused" with sequence number 0 (the number goes to the next post), so
 *    a dump never shows a work that was never posted as queued.
 *  - A failed work's entry keeps its fault (fault.c: the data
 *    collie_work_fault gives, filled before the entry ends) compactly: the
 *    kind and the first CL_FR_FAULT_RANKS ranks with the set's size; the
 *    dump's header carries the comm's root fault whole (kind, view, origin,
 *    ranks), as collie_comm_fault does.
 *  - Dumps are JSON with one entry per line, so both jq and the small
 *    parser in collie-trace read them. On abort the dump goes to
 *    COLLIE_DUMP_DIR/collie-<name>-g<generation>-r<rank>.json when set.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "engine/engine.h"

int cl_flight_init(collie_comm *c) {
    uint32_t n = (uint32_t)cl_config_get()->trace_buffer;
    c->fr.cap = n;
    if (n == 0) return COLLIE_OK;
    c->fr.ring = calloc(n, sizeof *c->fr.ring);
    if (!c->fr.ring) return COLLIE_ENOMEM;
    pthread_mutex_init(&c->fr.mu, NULL);
    return COLLIE_OK;
}

void cl_flight_fini(collie_comm *c) {
    if (!c->fr.ring) return;
    free(c->fr.ring);
    c->fr.ring = NULL;
    pthread_mutex_destroy(&c->fr.mu);
}

/* Wall-clock microseconds of a monotonic timestamp (for humans; the
 * ordering inside one rank uses the monotonic values). */
static int64_t fr_wall_us(int64_t mono_ns) {
    if (mono_ns == 0) return 0;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    int64_t now_wall = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec;
    return (now_wall - (cl_now_ns() - mono_ns)) / 1000;
}

void cl_flight_post(collie_comm *c, cl_coll_work *cw) {
    if (!c->fr.ring) return;
    pthread_mutex_lock(&c->fr.mu);
    uint64_t id = ++c->fr.count;
    cl_fr_entry *e = &c->fr.ring[(id - 1) % c->fr.cap];
    memset(e, 0, sizeof *e);
    e->id = id;
    e->seq = cw->base.seq;
    e->kind = (uint8_t)cw->args.kind;
    e->dtype = (uint8_t)cw->args.dtype;
    e->op = (uint8_t)cw->args.op;
    e->count = cw->args.count;
    e->peer = cw->args.kind == COLLIE_COLL_SEND || cw->args.kind == COLLIE_COLL_RECV
                  ? cw->args.peer
                  : cw->args.root;
    e->cuda = cw->args.stream != NULL;
    e->post_ns = cw->base.post_ns;
    e->status = COLLIE_INPROGRESS;
    cw->fr_id = id;
    pthread_mutex_unlock(&c->fr.mu);
}

static cl_fr_entry *fr_entry(collie_comm *c, cl_coll_work *cw) {
    if (!c->fr.ring || cw->fr_id == 0) return NULL;
    cl_fr_entry *e = &c->fr.ring[(cw->fr_id - 1) % c->fr.cap];
    return e->id == cw->fr_id ? e : NULL;
}

void cl_flight_refused(collie_comm *c, cl_coll_work *cw, int status, const char *why) {
    if (!c->fr.ring) return;
    pthread_mutex_lock(&c->fr.mu);
    cl_fr_entry *e = fr_entry(c, cw);
    if (e) {
        e->seq = 0; /* given back: the next post takes it */
        e->end_ns = cl_now_ns();
        e->status = status;
        snprintf(e->error, sizeof e->error, "post refused: %s", why && *why ? why : "");
    }
    pthread_mutex_unlock(&c->fr.mu);
}

void cl_flight_start(collie_comm *c, cl_coll_work *cw, int64_t now) {
    if (!c->fr.ring) return;
    pthread_mutex_lock(&c->fr.mu);
    cl_fr_entry *e = fr_entry(c, cw);
    if (e) e->start_ns = now;
    pthread_mutex_unlock(&c->fr.mu);
}

void cl_flight_end(collie_comm *c, cl_coll_work *cw) {
    if (!c->fr.ring) return;
    pthread_mutex_lock(&c->fr.mu);
    cl_fr_entry *e = fr_entry(c, cw);
    if (e) {
        e->end_ns = cw->base.end_ns ? cw->base.end_ns : cl_now_ns();
        e->status = cw->base.status;
        if (cw->base.status != COLLIE_OK) {
            if (cw->base.errmsg) snprintf(e->error, sizeof e->error, "%s", cw->base.errmsg);
            e->fault_kind = cw->fault.kind;
            e->fault_nranks = cw->fault.nranks;
            int n = cw->fault.nranks < CL_FR_FAULT_RANKS ? cw->fault.nranks : CL_FR_FAULT_RANKS;
            memcpy(e->fault_ranks, cw->fault.ranks, (size_t)n * sizeof e->fault_ranks[0]);
        } else {
            e->error[0] = '\0'; /* the common case, on the ender's path to DONE: no formatting */
        }
    }
    pthread_mutex_unlock(&c->fr.mu);
}

static void fr_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* ,"fault":"<kind>"[,"fault_origin":o],"fault_ranks":[r,...],"fault_nranks":n */
static void fr_json_fault(FILE *f, int kind, int origin, const int32_t *ranks, int nranks,
                          int listed) {
    fprintf(f, ",\"fault\":\"%s\"", collie_fault_kind_name(kind));
    if (origin != INT32_MIN) fprintf(f, ",\"fault_origin\":%d", origin);
    fprintf(f, ",\"fault_ranks\":[");
    int n = nranks < listed ? nranks : listed;
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? "," : "", (int)ranks[i]);
    fprintf(f, "],\"fault_nranks\":%d", nranks);
}

static const char *fr_state(const cl_fr_entry *e) {
    if (e->status != COLLIE_INPROGRESS) return e->status == COLLIE_OK ? "done" : "failed";
    return e->start_ns ? "running" : "queued";
}

/* the comm's line: its family, how it was made from which comm, the map of
 * a shrink, the shrinks and grows since the family's first comm, and the
 * comm a shrink or grow of it made */
static void fr_json_line(collie_comm *c, FILE *f) {
    fprintf(f, ",\"family\":");
    fr_json_string(f, c->family);
    fprintf(f, ",\"shrinks\":%u,\"grows\":%u", c->line.shrinks, c->line.grows);
    if (c->line.how) {
        fprintf(f, ",\"made_by\":\"%s\",\"from\":", c->line.how);
        fr_json_string(f, c->line.from);
        fprintf(f, ",\"from_generation\":%llu", (unsigned long long)c->line.from_gen);
    }
    if (c->rank_map) {
        fprintf(f, ",\"rank_map\":[");
        for (int r = 0; r < c->rank_map_n; r++)
            fprintf(f, "%s%d", r ? "," : "", c->rank_map[r]);
        fprintf(f, "]");
    }
    char next[sizeof c->line.successor];
    pthread_mutex_lock(&c->mu);
    snprintf(next, sizeof next, "%s", c->line.successor);
    pthread_mutex_unlock(&c->mu);
    if (next[0]) {
        fprintf(f, ",\"succeeded_by\":");
        fr_json_string(f, next);
    }
}

int collie_comm_dump(collie_comm *c, FILE *f) {
    if (!c || !f) return COLLIE_EINVAL;
    int st;
    const char *msg;
    collie_comm_error(c, &st, &msg);
    fprintf(f, "{\"comm\":");
    fr_json_string(f, c->name);
    fprintf(f,
            ",\"generation\":%llu,\"rank\":%d,\"size\":%d,\"status\":\"%s\",\"last_posted\":%llu,"
            "\"error\":",
            (unsigned long long)c->generation, c->rank, c->size, collie_status_name(st),
            (unsigned long long)atomic_load(&c->last_posted));
    fr_json_string(f, msg);
    collie_fault cf = COLLIE_FAULT_INIT;
    collie_comm_fault(c, &cf);
    fr_json_fault(f, cf.kind, cf.origin, cf.ranks, cf.nranks, COLLIE_FAULT_RANKS);
    fprintf(f, ",\"fault_view\":%d", cf.view);
    fr_json_line(c, f);
    fprintf(f, ",\"capacity\":%u,\"entries\":[\n", c->fr.cap);
    if (c->fr.ring) {
        pthread_mutex_lock(&c->fr.mu);
        uint64_t first = c->fr.count > c->fr.cap ? c->fr.count - c->fr.cap + 1 : 1;
        for (uint64_t id = first; id <= c->fr.count; id++) {
            const cl_fr_entry *e = &c->fr.ring[(id - 1) % c->fr.cap];
            fprintf(f,
                    "{\"seq\":%llu,\"op\":\"%s\",\"dtype\":\"%s\",\"redop\":\"%s\",\"count\":%llu,"
                    "\"peer\":%d,\"cuda\":%s,\"state\":\"%s\",\"status\":\"%s\",\"post_us\":%lld,"
                    "\"start_us\":%lld,\"end_us\":%lld,\"error\":",
                    (unsigned long long)e->seq, collie_coll_kind_name((collie_coll_kind)e->kind),
                    collie_dtype_name((collie_dtype)e->dtype),
                    collie_redop_name((collie_redop)e->op), (unsigned long long)e->count, e->peer,
                    e->cuda ? "true" : "false", fr_state(e), collie_status_name(e->status),
                    (long long)fr_wall_us(e->post_ns), (long long)fr_wall_us(e->start_ns),
                    (long long)fr_wall_us(e->end_ns));
            fr_json_string(f, e->error);
            if (e->status != COLLIE_OK && e->status != COLLIE_INPROGRESS)
                fr_json_fault(f, e->fault_kind, INT32_MIN, e->fault_ranks, e->fault_nranks,
                              CL_FR_FAULT_RANKS);
            fprintf(f, "}%s\n", id == c->fr.count ? "" : ",");
        }
        pthread_mutex_unlock(&c->fr.mu);
    }
    fprintf(f, "]}\n");
    return ferror(f) ? COLLIE_ESYSTEM : COLLIE_OK;
}

void cl_comm_dump_on_abort(collie_comm *c) {
    const char *dir = cl_config_get()->dump_dir;
    if (!dir || c->fr.dumped) return;
    c->fr.dumped = true;
    char path[512];
    snprintf(path, sizeof path, "%s/collie-%s-g%llu-r%d.json", dir, c->name,
             (unsigned long long)c->generation, c->rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        CL_CERROR("comm", c, "cannot write the flight recorder to %s: %s", path, strerror(errno));
        return;
    }
    collie_comm_dump(c, f);
    fclose(f);
    CL_CWARN("comm", c, "flight recorder written to %s", path);
}
