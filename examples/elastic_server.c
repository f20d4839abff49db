/*
 * elastic_server.c — a data-parallel group answers requests through the
 * loss of a rank: the survivors shrink and go on, the replacement rejoins.
 *
 *   build/bin/collie-run -n 4 --restarts 1 -- build/examples/elastic_server
 *
 * Rank 0 takes ELASTIC_REQUESTS requests (default 200), one every
 * ELASTIC_INTERVAL_MS (default 2); each is
 * a header broadcast from rank 0 (request id, and a switch flag) and an
 * allreduce of the request id from every rank, whose sum rank 0 checks
 * against id x size: "answered". The victim (ELASTIC_VICTIM, default the
 * last rank) SIGKILLs itself in its first life once request
 * ELASTIC_KILL_AT (default 50) was answered. Then:
 *   1. every survivor's collective fails (the victim is dead, or a peer
 *      aborted); each calls collie_comm_shrink and gets a comm of the
 *      survivors, its ranks renumbered; rank 0 answers the request again
 *      on it (a request is answered or refused with a reason, never lost);
 *   2. the survivors post collie_comm_grow_post right away and keep
 *      serving on the shrunk comm: collie-run restarts the victim, which
 *      asks to join (collie_comm_join_from_env, as its old rank);
 *   3. when rank 0's grow work completes (collie_work_test between
 *      requests), it sets the switch flag in the next header; every member
 *      then waits for its own grow (done within milliseconds: the new comm
 *      exists) and they all move to the grown comm, where the replacement
 *      waits for its first header. A grow still pending after the last
 *      request is waited for (bounded) before the stop: the replacement is
 *      taken back either way.
 * The last line of rank 0 is "served: R requests: A answered, F refused,
 * 0 lost; N shrinks, M grows".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"

#define OP_TIMEOUT_MS   10000 /* a fault is found long before this */
#define GROW_TIMEOUT_MS 30000 /* how long the survivors keep a grow posted */

enum { HDR_ID, HDR_SWITCH, HDR_STOP, HDR_LEN };
enum { SWITCH_NONE, SWITCH_GROWN, SWITCH_GROW_FAILED };

typedef struct server {
    collie_engine *e;
    collie_comm *c;    /* the comm requests run on */
    collie_work *grow; /* a grow posted on c, or NULL */
    int shrinks, grows;
} server;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static void die(const char *what, int rc) {
    fprintf(stderr, "elastic_server: %s failed: %s (%s)\n", what, collie_status_name(rc),
            collie_last_error());
    exit(1);
}

/* post, wait (bounded by the op timeout), release */
static int run(collie_work *w) {
    int rc = collie_work_wait(w, COLLIE_TIMEOUT_INFINITE);
    collie_work_release(w);
    return rc;
}

static int header(server *s, int64_t *h) {
    collie_work *w;
    int rc = collie_broadcast(s->c, h, HDR_LEN, COLLIE_INT64, 0, NULL, &w);
    return rc == COLLIE_OK ? run(w) : rc;
}

static int answer(server *s, int64_t id, int64_t *sum) {
    collie_work *w;
    int64_t mine = id;
    int rc = collie_allreduce(s->c, &mine, sum, 1, COLLIE_INT64, COLLIE_SUM, NULL, &w);
    return rc == COLLIE_OK ? run(w) : rc;
}

static void retire(collie_comm *c) { /* never blocks: the destroy runs on the loop */
    collie_work *d;
    if (collie_comm_destroy_post(c, NULL, &d) == COLLIE_OK) collie_work_release(d);
}

/* A collective failed: shrink to the survivors, then post a grow for the
 * replacement and serve on meanwhile. */
static void shrink(server *s, int rc) {
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(s->c, &f);
    int old_rank = collie_comm_rank(s->c);
    printf("rank %d: %s (fault %s, %d rank(s)); shrinking\n", old_rank, collie_status_name(rc),
           collie_fault_kind_name(f.kind), f.nranks);
    if (s->grow) { /* a grow in flight on the comm that failed: it fails too */
        collie_work_cancel(s->grow);
        collie_work_release(s->grow);
        s->grow = NULL;
    }
    collie_comm *n;
    int r = collie_comm_shrink(s->c, NULL, &n);
    if (r != COLLIE_OK) die("collie_comm_shrink", r);
    printf("rank %d: shrunk to rank %d of %d (comm '%s')\n", old_rank, collie_comm_rank(n),
           collie_comm_size(n), collie_comm_name(n));
    retire(s->c);
    s->c = n;
    s->shrinks++;
    collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
    go.timeout_ms = GROW_TIMEOUT_MS;
    if ((r = collie_comm_grow_post(s->c, &go, NULL, &s->grow)) != COLLIE_OK)
        die("collie_comm_grow_post", r);
}

/* The header said switch: move to the grown comm (or drop the failed grow). */
static void switch_comm(server *s, int64_t how) {
    if (!s->grow) return;
    int r = collie_work_wait(s->grow, GROW_TIMEOUT_MS);
    collie_comm *g = NULL;
    if (how == SWITCH_GROWN && r == COLLIE_OK && collie_comm_work_comm(s->grow, &g) == COLLIE_OK) {
        printf("rank %d: grown to %d ranks (comm '%s')\n", collie_comm_rank(g), collie_comm_size(g),
               collie_comm_name(g));
        retire(s->c);
        s->c = g;
        s->grows++;
    } else {
        printf("rank %d: the grow did not happen: %s\n", collie_comm_rank(s->c),
               collie_work_error_message(s->grow));
    }
    collie_work_release(s->grow);
    s->grow = NULL;
}

/* rank 0: is the grow done? What the next header says. */
static int64_t switch_flag(server *s) {
    if (!s->grow || !collie_work_test(s->grow)) return SWITCH_NONE;
    return collie_work_result(s->grow) == COLLIE_OK ? SWITCH_GROWN : SWITCH_GROW_FAILED;
}

/* rank 0: requests, each answered or refused with a reason */
static void serve_root(server *s, int requests, int interval_ms) {
    int answered = 0, refused = 0;
    struct timespec pace = {interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L};
    for (int64_t id = 1; id <= requests; id++) {
        for (int attempt = 0;; attempt++) {
            int64_t h[HDR_LEN] = {id, switch_flag(s), 0}, sum = -1;
            int rc = header(s, h);
            if (rc == COLLIE_OK && h[HDR_SWITCH] != SWITCH_NONE) {
                switch_comm(s, h[HDR_SWITCH]);
                continue; /* the same request on the comm it switched to */
            }
            if (rc == COLLIE_OK) rc = answer(s, id, &sum);
            int size = collie_comm_size(s->c);
            if (rc == COLLIE_OK && sum == id * size) {
                answered++;
                if (interval_ms > 0) nanosleep(&pace, NULL); /* requests come at a pace */
                break;
            }
            if (rc == COLLIE_OK || attempt == 2) { /* a wrong sum, or no comm to answer on */
                printf("request %lld refused: %s\n", (long long)id,
                       rc == COLLIE_OK ? "wrong answer" : collie_status_name(rc));
                refused++;
                break;
            }
            shrink(s, rc); /* then the same request again */
        }
    }
    if (s->grow) { /* take the replacement back before stopping: it is waiting */
        collie_work_wait(s->grow, GROW_TIMEOUT_MS);
        int64_t h[HDR_LEN] = {0, switch_flag(s), 0};
        if (header(s, h) == COLLIE_OK) switch_comm(s, h[HDR_SWITCH]);
    }
    int64_t h[HDR_LEN] = {0, SWITCH_NONE, 1};
    if (header(s, h) != COLLIE_OK) printf("rank 0: the stop header failed\n");
    printf("served: %d requests: %d answered, %d refused, %d lost; %d shrinks, %d grows\n",
           requests, answered, refused, requests - answered - refused, s->shrinks, s->grows);
}

/* every other rank: follow rank 0's headers */
static void serve_member(server *s, int victim, int kill_at, int life) {
    for (;;) {
        int64_t h[HDR_LEN] = {0}, sum;
        int rc = header(s, h);
        if (rc == COLLIE_OK && h[HDR_STOP]) return;
        if (rc == COLLIE_OK && h[HDR_SWITCH] != SWITCH_NONE) {
            switch_comm(s, h[HDR_SWITCH]);
            continue;
        }
        if (rc == COLLIE_OK) rc = answer(s, h[HDR_ID], &sum);
        if (rc != COLLIE_OK) {
            shrink(s, rc);
            continue;
        }
        if (life == 0 && collie_comm_rank(s->c) == victim && h[HDR_ID] == kill_at) {
            printf("rank %d: killing myself after request %d\n", victim, kill_at);
            fflush(stdout);
            raise(SIGKILL);
        }
    }
}

int main(void) {
    int requests = env_int("ELASTIC_REQUESTS", 200), kill_at = env_int("ELASTIC_KILL_AT", 50);
    int life = env_int("COLLIE_RESTART_COUNT", 0);
    int victim = env_int("ELASTIC_VICTIM", env_int("COLLIE_WORLD_SIZE", 4) - 1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    server s = {0};
    int r = collie_engine_create(NULL, &s.e);
    if (r != COLLIE_OK) die("collie_engine_create", r);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "elastic";
    o.timeout_ms = OP_TIMEOUT_MS;
    if (life == 0) {
        r = collie_comm_create_from_env(s.e, &o, &s.c);
    } else { /* a replacement: join the running comm at the members' next grow */
        collie_grow_opts go = COLLIE_GROW_OPTS_INIT;
        go.comm = &o;
        go.timeout_ms = GROW_TIMEOUT_MS;
        r = collie_comm_join_from_env(s.e, &go, &s.c);
        if (r == COLLIE_OK)
            printf("rank %d: joined as rank %d of %d (comm '%s')\n", env_int("COLLIE_RANK", -1),
                   collie_comm_rank(s.c), collie_comm_size(s.c), collie_comm_name(s.c));
    }
    if (r != COLLIE_OK) die(life ? "collie_comm_join_from_env" : "collie_comm_create_from_env", r);
    if (collie_comm_rank(s.c) == 0)
        serve_root(&s, requests, env_int("ELASTIC_INTERVAL_MS", 2));
    else
        serve_member(&s, victim, kill_at, life);
    if (s.grow) { /* posted, never used: it ends at its deadline or with the comm */
        collie_work_cancel(s.grow);
        collie_work_release(s.grow);
    }
    collie_comm_destroy(s.c);
    collie_engine_destroy(s.e);
    return 0;
}
