/*
 * recovery.c — a rank dies; the others see it within milliseconds, tear the
 * communicator down, build it again with the same name and carry on.
 *
 *   build/bin/collie-run -n 4 --restarts 1 -- build/examples/recovery
 *
 * Every rank loops allreduces with WINDOW of them in flight. In its first
 * life the victim rank (RECOVERY_VICTIM, default 2) posts allreduce number
 * RECOVERY_KILL_AT (default 20), notes the time in the store and SIGKILLs
 * itself with that work in flight. The survivors:
 *   1. see the fault on their pending works: COLLIE_EPEER on a rank whose
 *      connection to the victim broke, COLLIE_EABORTED naming that root
 *      cause everywhere else (the abort travels through the store);
 *   2. collie_comm_destroy the dead comm (prompt: nothing left to wait for);
 *   3. collie_comm_create_from_env again with the same name: a new
 *      generation, whose rendezvous waits (bounded by create_timeout_ms) for
 *      the victim, which collie-run has started again with the same rank;
 *   4. run 100 more allreduces and check every result.
 * A process knows which life it is in from the store counter
 * "recovery/lives/<rank>": the store lives in collie-run, so it outlives
 * any rank. Every step prints what happened and how long it took; the last
 * line of every rank is "rank R: recovered".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"

enum { COUNT = 256, WINDOW = 4, AFTER = 100 };

#define OP_TIMEOUT_MS     30000 /* faults are found long before this */
#define CREATE_TIMEOUT_MS 20000 /* how long a new generation waits for every rank */
#define PRE_FAULT_LIMIT   100000

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* one clock for every process of the host */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double ms_since(int64_t t0) { return (double)(now_ns() - t0) / 1e6; }

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != COLLIE_OK) {                                                                    \
            fprintf(stderr, "%s failed: %s (%s)\n", #expr, collie_status_name(rc_),                \
                    collie_last_error());                                                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct slot {
    collie_work *w;
    int32_t buf[COUNT];
    int iter;
} slot;

typedef struct app {
    collie_engine *e;
    collie_store *store; /* our own client, for the lives counter and the kill time */
    collie_comm *c;
    int rank, size, victim, kill_at, life;
    slot slots[WINDOW];
} app;

/* Rank r's contribution to iteration it; the sum is known in closed form. */
static void fill(int32_t *buf, int rank, int it) {
    for (int j = 0; j < COUNT; j++)
        buf[j] = (rank + 1) * (j + 1) + it;
}

static bool correct(const app *a, const int32_t *buf, int it) {
    int n = a->size;
    for (int j = 0; j < COUNT; j++)
        if (buf[j] != (j + 1) * n * (n + 1) / 2 + n * it) return false;
    return true;
}

static void create_comm(app *a) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "recovery";
    o.timeout_ms = OP_TIMEOUT_MS;
    o.create_timeout_ms = CREATE_TIMEOUT_MS;
    int64_t t0 = now_ns();
    CHECK(collie_comm_create_from_env(a->e, &o, &a->c));
    printf("rank %d: comm '%s' generation %llu ready in %.1f ms\n", a->rank, collie_comm_name(a->c),
           (unsigned long long)collie_comm_generation(a->c), ms_since(t0));
}

static int post(app *a, slot *s, int it) {
    s->iter = it;
    fill(s->buf, a->rank, it);
    return collie_allreduce(a->c, s->buf, s->buf, COUNT, COLLIE_INT32, COLLIE_SUM, NULL, &s->w);
}

/* What a fault did to the works in flight. */
typedef struct fault_report {
    int failed, status;
    int64_t first_ns, last_ns; /* completion times of the failed works */
    char msg[1024];            /* the first failure seen */
} fault_report;

/* Wait for every work still in flight (each fails at once, or completes if
 * its data was all there) and note the failures. */
static void drain(app *a, fault_report *f) {
    for (int k = 0; k < WINDOW; k++) {
        slot *p = &a->slots[k];
        if (!p->w) continue;
        int rc = collie_work_wait(p->w, OP_TIMEOUT_MS + 5000);
        if (rc != COLLIE_OK && rc != COLLIE_INPROGRESS) {
            collie_work_details info;
            collie_work_info(p->w, &info);
            if (f->failed++ == 0 || info.end_ns < f->first_ns) f->first_ns = info.end_ns;
            if (info.end_ns > f->last_ns) f->last_ns = info.end_ns;
        }
        collie_work_release(p->w);
        p->w = NULL;
    }
}

/* The first life: loop until the comm faults. The victim dies in here. */
static void run_until_fault(app *a) {
    int posted = 0, done = 0;
    fault_report f = {.status = COLLIE_OK};
    for (int k = 0; k < WINDOW; k++)
        CHECK(post(a, &a->slots[k], posted++));
    while (done < PRE_FAULT_LIMIT) {
        slot *s = &a->slots[done % WINDOW];
        int rc = collie_work_wait(s->w, OP_TIMEOUT_MS + 5000);
        if (rc != COLLIE_OK) { /* the fault: the works still in flight fail with it */
            f.status = rc;
            snprintf(f.msg, sizeof f.msg, "%s", collie_work_error_message(s->w));
            drain(a, &f);
            break;
        }
        if (!correct(a, s->buf, s->iter)) {
            fprintf(stderr, "rank %d: allreduce %d: wrong result\n", a->rank, s->iter);
            exit(1);
        }
        collie_work_release(s->w);
        s->w = NULL;
        done++;
        int rp = post(a, s, posted++);
        if (a->rank == a->victim && a->life == 1 && posted == a->kill_at) {
            /* die with this work in flight; leave the time for the others */
            char t[32];
            snprintf(t, sizeof t, "%lld", (long long)now_ns());
            collie_store_set(a->store, "recovery/killed_at", t, strlen(t), 2000);
            printf("rank %d: %d allreduces done; SIGKILL to myself now\n", a->rank, done);
            fflush(stdout);
            raise(SIGKILL);
        }
        if (rp != COLLIE_OK) { /* the comm failed between two posts: posts fail fast */
            s->w = NULL;
            f.status = rp;
            snprintf(f.msg, sizeof f.msg, "a new post: %s", collie_last_error());
            drain(a, &f);
            break;
        }
    }
    if (f.status == COLLIE_OK) {
        fprintf(stderr, "rank %d: no fault after %d allreduces\n", a->rank, done);
        exit(1);
    }
    printf("rank %d: %d allreduces correct, then %s: %s\n", a->rank, done,
           collie_status_name(f.status), f.msg);
    void *val = NULL;
    size_t len;
    if (collie_store_get(a->store, "recovery/killed_at", 2000, &val, &len) == COLLIE_OK) {
        long long killed = atoll(val);
        if (f.failed > 0)
            printf("rank %d: %d pending works failed +%.1f to +%.1f ms after rank %d was "
                   "killed\n",
                   a->rank, f.failed, (double)(f.first_ns - killed) / 1e6,
                   (double)(f.last_ns - killed) / 1e6, a->victim);
        else
            printf("rank %d: nothing was pending; a post failed fast %.1f ms after rank %d was "
                   "killed\n",
                   a->rank, (double)(now_ns() - killed) / 1e6, a->victim);
        free(val);
    }
    int st;
    const char *why;
    collie_comm_error(a->c, &st, &why);
    printf("rank %d: comm state %s: %s\n", a->rank, collie_status_name(st), why);
    int64_t t0 = now_ns();
    int rc = collie_comm_destroy(a->c);
    a->c = NULL;
    printf("rank %d: destroy took %.1f ms (%s)\n", a->rank, ms_since(t0), collie_status_name(rc));
}

/* The new generation: AFTER allreduces, every result checked. */
static void run_after(app *a) {
    int64_t t0 = now_ns();
    int posted = 0, done = 0;
    for (int k = 0; k < WINDOW && posted < AFTER; k++)
        CHECK(post(a, &a->slots[k], posted++));
    while (done < AFTER) {
        slot *s = &a->slots[done % WINDOW];
        int rc = collie_work_wait(s->w, OP_TIMEOUT_MS + 5000);
        if (rc != COLLIE_OK || !correct(a, s->buf, s->iter)) {
            fprintf(stderr, "rank %d: allreduce %d after recovery: %s %s\n", a->rank, s->iter,
                    collie_status_name(rc), collie_work_error_message(s->w));
            exit(1);
        }
        collie_work_release(s->w);
        s->w = NULL;
        done++;
        if (posted < AFTER) CHECK(post(a, s, posted++));
    }
    printf("rank %d: generation %llu: %d allreduces correct in %.1f ms\n", a->rank,
           (unsigned long long)collie_comm_generation(a->c), AFTER, ms_since(t0));
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    app a = {0};
    a.rank = env_int("COLLIE_RANK", -1);
    a.size = env_int("COLLIE_WORLD_SIZE", 0);
    a.victim = env_int("RECOVERY_VICTIM", 2);
    a.kill_at = env_int("RECOVERY_KILL_AT", 20);
    if (a.rank < 0 || a.size < 2 || a.victim < 0 || a.victim >= a.size || a.kill_at <= WINDOW) {
        fprintf(stderr,
                "run me under collie-run -n N (N >= 2) --restarts 1; "
                "RECOVERY_VICTIM < N, RECOVERY_KILL_AT > %d\n",
                WINDOW);
        return 2;
    }
    CHECK(collie_engine_create(NULL, &a.e));
    CHECK(collie_store_connect(a.e, NULL, NULL, &a.store)); /* COLLIE_STORE_ADDR */
    char key[64];
    snprintf(key, sizeof key, "recovery/lives/%d", a.rank);
    int64_t life;
    CHECK(collie_store_add(a.store, key, 1, 10000, &life));
    a.life = (int)life;

    int64_t t0 = now_ns();
    if (a.life == 1) {
        create_comm(&a);
        run_until_fault(&a);
        printf("rank %d: re-creating the comm\n", a.rank);
    } else {
        printf("rank %d: restarted (life %d); joining the next generation\n", a.rank, a.life);
    }
    t0 = now_ns();
    create_comm(&a);
    run_after(&a);
    CHECK(collie_comm_destroy(a.c));
    printf("rank %d: recovered (%.1f ms from the re-creation to the end)\n", a.rank, ms_since(t0));
    collie_store_destroy(a.store);
    CHECK(collie_engine_destroy(a.e));
    return 0;
}
