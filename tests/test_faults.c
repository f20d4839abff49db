/*
 * test_faults.c — faults across processes and the error policies.
 *
 * Multi-process tests run real ranks: this binary re-executed with
 * "--rank <program>" (a fresh process per rank, its environment set as
 * collie-run would), a standalone collie-store so that the store outlives
 * any rank, and collie-run itself for the recovery example. The test
 * process kills, stops and restarts ranks, reads what each rank reports on
 * its stdout (one event per line, with CLOCK_MONOTONIC timestamps, which
 * every process of the host shares), and checks the timings and messages.
 *
 *   kill:       4 ranks loop allreduces (30 s op timeout); rank 2 (then
 *               rank 0) is SIGKILLed: every survivor's pending works fail
 *               within 2 s of the kill, naming the dead rank; destroy takes
 *               < 1 s; a restarted rank and the survivors re-create the
 *               comm and complete 100 correct allreduces. Stalled: rank 1,
 *               which has no connection to rank 2, is SIGSTOPped across the
 *               kill for longer than the close grace: it must still name
 *               rank 2, not the survivor whose connection it saw close.
 *   deep:       4 ranks post 100,000 one-element collectives back to back
 *               and rank 2 SIGKILLs itself mid-stream: on every survivor
 *               every work ends by its deadline and each one that returned
 *               OK holds its result (default policy on both links, NONE,
 *               BLOCKING_WAIT; allreduce, and a mix of five kinds).
 *   peer lost:  NONE, rank 2 SIGKILLed (TCP and auto): a receive from live
 *               rank 0 completes, one from rank 2 fails at once naming it,
 *               and no message of a live rank's stream into receives from
 *               any source is lost.
 *   hang:       rank 3 SIGSTOPs itself between two allreduces (sockets stay
 *               open); with a 2 s op timeout ranks 0-2 fail within 3 s of
 *               the stop, their messages name rank 3 as not having reached
 *               the sequence number, and collie-trace on the dumps shows it.
 *   netcut:     ranks in two network namespaces; the link between them goes
 *               down: every rank fails within timeout + 1.5 s.
 *   policies:   BLOCKING_WAIT (nothing propagated, posts fail fast, the app
 *               aborts), ABORT_PROCESS (SIGABRT after the dump).
 *   aborts:     from a completion callback, from a thread while another
 *               waits, many times at once.
 *   cycles:     create → collectives → abort → destroy, 200 times: fds and
 *               threads constant, RSS growth below RSS_TOLERANCE_KB.
 *   store:      the store server dies: pending requests and creation fail
 *               naming its address, within their deadlines.
 *   recovery:   examples/recovery under collie-run -n 4 --restarts 1.
 *
 * Every wait is bounded; every child is SIGKILLed and reaped in teardown.
 * CLTEST_FILTER=<glob> runs only the tests whose names match.
 * `test_faults --measure kill|hang RUNS [auto|tcp|shm]` runs a scenario
 * RUNS times (kill: over that CPU transport) and prints the detection times
 * (bench/faults.sh).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_fixture.h"
#include "harness.h"
#include "runner.h"
#include "spawn.h"

extern char **environ;

#define WINDOW           4     /* allreduces a rank keeps in flight */
#define STEP_MS          20000 /* bound of any step of a scenario (start-up, recovery) */
#define KILL_OP_TIMEOUT  30000 /* op timeout in the kill tests: never what finds the fault */
#define DETECT_MS        2000  /* kill → every survivor's pending works failed */
#define STALL_MS         100   /* a survivor stopped across the kill (> the close grace) */
#define DESTROY_MS       1000  /* destroy of a faulted comm */
#define HANG_OP_TIMEOUT  2000  /* op timeout in the hang and network-cut tests */
#define HANG_SLACK_MS    1000  /* the hang is reported within timeout + this */
#define NETCUT_SLACK_MS  1500
#define AFTER_RECOVERY   100
#define CYCLES           200
#define CYCLES_QUICK     40
#define CYCLES_WARMUP    10
#define RSS_TOLERANCE_KB 2048 /* RSS growth allowed over the cycles (normal build) */
#define MAX_PROCS        8

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CL_SANITIZED 1
#else
#define CL_SANITIZED 0
#endif

static char self_exe[4096];
static char tmp_dir[64];

static bool quick(void) {
    const char *q = getenv("CLTEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ======================================================================== */
/* Rank programs (this binary run with --rank NAME)                          */
/* ======================================================================== */

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* One event per line on stdout; the parent parses them. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

#define RK_CHECK(expr)                                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != COLLIE_OK) {                                                                    \
            say("ERROR %s: %s: %s", #expr, collie_status_name(rc_), collie_last_error());          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct rk_slot {
    collie_work *w;
    int iter;
    int32_t *buf;
} rk_slot;

typedef struct rk {
    collie_engine *e;
    collie_comm *c;
    int rank, size, count;
    int32_t timeout_ms;
    const char *name;
    bool bcast; /* FT_OP=broadcast: broadcasts from rank it % size instead of allreduces */
    rk_slot slots[WINDOW];
} rk;

static void rk_fill(const rk *r, int32_t *buf, int it) {
    int from = r->bcast ? it % r->size : r->rank;
    for (int j = 0; j < r->count; j++)
        buf[j] = r->bcast && from != r->rank ? -1 : (from + 1) * (j + 1) + it;
}

static bool rk_correct(const rk *r, const int32_t *buf, int it) {
    int n = r->size, root = it % n;
    for (int j = 0; j < r->count; j++)
        if (buf[j] != (r->bcast ? (root + 1) * (j + 1) + it : (j + 1) * n * (n + 1) / 2 + n * it))
            return false;
    return true;
}

/* The comm's error callback: must run once per comm, on the progress
 * thread, with the root cause. */
static _Atomic int rk_errors;
static _Atomic int rk_error_status;
static _Atomic bool rk_error_off_loop;

static void rk_on_error(collie_comm *c, int status, const char *msg, void *arg) {
    (void)msg;
    collie_engine *e = arg;
    if (e && !collie_engine_on_progress_thread(e)) atomic_store(&rk_error_off_loop, true);
    (void)c;
    atomic_store(&rk_error_status, status);
    atomic_fetch_add(&rk_errors, 1);
}

static void rk_create(rk *r) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = r->name;
    o.on_error = rk_on_error;
    o.on_error_arg = r->e;
    atomic_store(&rk_errors, 0);
    o.timeout_ms = r->timeout_ms;
    o.create_timeout_ms = STEP_MS;
    RK_CHECK(collie_comm_create_from_env(r->e, &o, &r->c));
    say("READY gen=%llu", (unsigned long long)collie_comm_generation(r->c));
}

static int rk_post(rk *r, rk_slot *s, int it) {
    s->iter = it;
    rk_fill(r, s->buf, it);
    if (r->bcast)
        return collie_broadcast(r->c, s->buf, (size_t)r->count, COLLIE_INT32, it % r->size, NULL,
                                &s->w);
    return collie_allreduce(r->c, s->buf, s->buf, (size_t)r->count, COLLIE_INT32, COLLIE_SUM, NULL,
                            &s->w);
}

/* A fault's data as line fields: "fkind=<kind> franks=<r,r|->" */
static void fault_fields(const collie_fault *f, char *buf, size_t len) {
    int at = snprintf(buf, len, "fkind=%s franks=", collie_fault_kind_name(f->kind));
    if (f->nranks == 0) snprintf(buf + at, len - (size_t)at, "-");
    for (int i = 0; i < f->nranks && i < COLLIE_FAULT_RANKS && (size_t)at < len; i++)
        at += snprintf(buf + at, len - (size_t)at, "%s%d", i ? "," : "", f->ranks[i]);
}

/* Every work still in flight: wait for it (bounded) and report it. */
static void rk_drain_failed(rk *r, int64_t *first, int64_t *last, int *nfailed) {
    for (int k = 0; k < WINDOW; k++) {
        rk_slot *p = &r->slots[k];
        if (!p->w) continue;
        int rc = collie_work_wait(p->w, r->timeout_ms + 10000);
        collie_work_details info;
        collie_work_info(p->w, &info);
        if (rc != COLLIE_OK && rc != COLLIE_INPROGRESS) {
            (*nfailed)++;
            if (info.end_ns < *first) *first = info.end_ns;
            if (info.end_ns > *last) *last = info.end_ns;
            collie_fault f = COLLIE_FAULT_INIT;
            char fd[400];
            collie_work_fault(p->w, &f);
            fault_fields(&f, fd, sizeof fd);
            say("WORK seq=%llu status=%s end=%lld %s msg=%s", (unsigned long long)info.seq,
                collie_status_name(rc), (long long)info.end_ns, fd,
                collie_work_error_message(p->w));
        } else if (rc == COLLIE_INPROGRESS) {
            say("ERROR seq %llu still pending after its deadline", (unsigned long long)info.seq);
            exit(1);
        }
        collie_work_release(p->w);
        p->w = NULL;
    }
}

static void say_comm_error(collie_comm *c) {
    int st;
    const char *msg;
    collie_comm_error(c, &st, &msg);
    collie_fault f = COLLIE_FAULT_INIT;
    char fd[400];
    collie_comm_fault(c, &f);
    fault_fields(&f, fd, sizeof fd);
    say("COMMERR status=%s %s msg=%s", collie_status_name(st), fd, msg);
}

static void rk_report_comm(rk *r) { say_comm_error(r->c); }

/* Loop allreduces until the comm faults. FT_STOP_AT: after that many
 * allreduces, finish the ones in flight and SIGSTOP ourselves. */
static void rk_loop_until_fault(rk *r, int stop_at) {
    int posted = 0, done = 0;
    int64_t t0 = mono_ns();
    for (int k = 0; k < WINDOW; k++)
        RK_CHECK(rk_post(r, &r->slots[k], posted++));
    for (;;) {
        if (mono_ns() - t0 > 60 * 1000000000LL) {
            say("ERROR no fault within 60 s (%d allreduces)", done);
            exit(3);
        }
        rk_slot *s = &r->slots[done % WINDOW];
        int rc = collie_work_wait(s->w, r->timeout_ms + 10000);
        if (rc == COLLIE_INPROGRESS) {
            say("ERROR allreduce %d pending after its deadline", s->iter);
            exit(1);
        }
        if (rc != COLLIE_OK) break;
        if (!rk_correct(r, s->buf, s->iter)) {
            say("ERROR allreduce %d: wrong result", s->iter);
            exit(1);
        }
        collie_work_release(s->w);
        s->w = NULL;
        done++;
        if (done == 10) say("RUNNING t=%lld", (long long)mono_ns());
        if (stop_at > 0 && done == stop_at) {
            /* finish what is in flight, then hang with every socket open */
            for (int k = 0; k < WINDOW; k++) {
                rk_slot *p = &r->slots[k];
                if (!p->w) continue;
                RK_CHECK(collie_work_wait(p->w, r->timeout_ms + 10000));
                collie_work_release(p->w);
                p->w = NULL;
            }
            say("STOPPING t=%lld posted=%d", (long long)mono_ns(), posted);
            raise(SIGSTOP);
            say("RESUMED t=%lld", (long long)mono_ns());
            /* post nothing: the dump must show where we stopped */
            int st = COLLIE_OK;
            for (int i = 0; i < 1500 && collie_comm_error(r->c, &st, NULL) == COLLIE_OK; i++)
                usleep(10000);
            rk_report_comm(r);
            return;
        }
        int rp = rk_post(r, s, posted++);
        if (rp != COLLIE_OK) {
            s->w = NULL;
            say("POSTFAIL status=%s t=%lld msg=%s", collie_status_name(rp), (long long)mono_ns(),
                collie_last_error());
            break;
        }
    }
    int64_t first = INT64_MAX, last = 0;
    int nfailed = 0;
    rk_drain_failed(r, &first, &last, &nfailed);
    say("FAULT first=%lld last=%lld n=%d", (long long)(nfailed ? first : mono_ns()),
        (long long)(nfailed ? last : mono_ns()), nfailed);
    rk_report_comm(r);
    usleep(50000); /* a second call would come now */
    say("ONERROR calls=%d status=%s off_loop=%d", atomic_load(&rk_errors),
        collie_status_name(atomic_load(&rk_error_status)), (int)atomic_load(&rk_error_off_loop));
}

static void rk_after(rk *r, int n) {
    int posted = 0, done = 0;
    for (int k = 0; k < WINDOW && posted < n; k++)
        RK_CHECK(rk_post(r, &r->slots[k], posted++));
    while (done < n) {
        rk_slot *s = &r->slots[done % WINDOW];
        int rc = collie_work_wait(s->w, r->timeout_ms + 10000);
        if (rc != COLLIE_OK || !rk_correct(r, s->buf, s->iter)) {
            say("ERROR allreduce %d after recovery: %s %s", s->iter, collie_status_name(rc),
                collie_work_error_message(s->w));
            exit(1);
        }
        collie_work_release(s->w);
        s->w = NULL;
        done++;
        if (posted < n) RK_CHECK(rk_post(r, s, posted++));
    }
    say("DONE n=%d gen=%llu", done, (unsigned long long)collie_comm_generation(r->c));
}

/* The rank program of the kill, hang and network-cut tests. Settings:
 * FT_NAME, FT_TIMEOUT_MS, FT_LIFE (2: a restarted rank, straight to the
 * new generation), FT_AFTER (allreduces after re-creating the comm; 0: no
 * recovery), FT_STOP_AT, FT_COUNT, FT_OP (allreduce, or broadcast). */
static int rank_loop(void) {
    rk r = {0};
    r.name = getenv("FT_NAME") ? getenv("FT_NAME") : "faults";
    r.timeout_ms = env_int("FT_TIMEOUT_MS", KILL_OP_TIMEOUT);
    r.count = env_int("FT_COUNT", 64);
    r.bcast = getenv("FT_OP") && !strcmp(getenv("FT_OP"), "broadcast");
    r.rank = env_int("COLLIE_RANK", -1);
    r.size = env_int("COLLIE_WORLD_SIZE", 0);
    int life = env_int("FT_LIFE", 1), after = env_int("FT_AFTER", 0);
    for (int k = 0; k < WINDOW; k++)
        r.slots[k].buf = calloc((size_t)r.count, sizeof(int32_t));
    RK_CHECK(collie_engine_create(NULL, &r.e));
    if (life == 1) {
        rk_create(&r);
        rk_loop_until_fault(&r, env_int("FT_STOP_AT", 0));
        collie_comm_stats st = COLLIE_COMM_STATS_INIT;
        collie_comm_get_stats(r.c, &st);
        say("COPY bytes=%llu", (unsigned long long)st.shm_single_copy_bytes);
        int64_t t0 = mono_ns();
        int rc = collie_comm_destroy(r.c);
        say("DESTROY ms=%lld rc=%s", (long long)((mono_ns() - t0) / 1000000),
            collie_status_name(rc));
        r.c = NULL;
    }
    if (after > 0) {
        rk_create(&r);
        rk_after(&r, after);
        RK_CHECK(collie_comm_destroy(r.c));
    }
    RK_CHECK(collie_engine_destroy(r.e));
    for (int k = 0; k < WINDOW; k++)
        free(r.slots[k].buf);
    say("EXIT");
    return 0;
}

/* ABORT_PROCESS: rank 0 posts an allreduce rank 1 never joins. Its policy
 * (from COLLIE_ASYNC_ERROR_HANDLING) ends the process; rank 1 (ABORT_COMM)
 * reports what it learnt. */
static int rank_abort_process(void) {
    collie_engine *e;
    collie_comm *c;
    RK_CHECK(collie_engine_create(NULL, &e));
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "abortproc";
    o.create_timeout_ms = STEP_MS;
    RK_CHECK(collie_comm_create_from_env(e, &o, &c));
    say("READY gen=%llu", (unsigned long long)collie_comm_generation(c));
    if (collie_comm_rank(c) == 0) {
        int32_t x = 1;
        collie_work *w;
        collie_post_opts po = COLLIE_POST_OPTS_INIT;
        po.timeout_ms = 500;
        RK_CHECK(collie_allreduce(c, &x, &x, 1, COLLIE_INT32, COLLIE_SUM, &po, &w));
        int rc = collie_work_wait(w, 10000);
        /* the policy ends the process once the peer was told (bounded) */
        for (int i = 0; i < 100; i++)
            usleep(100000);
        say("ERROR the process survived: %s", collie_status_name(rc));
        return 1;
    }
    int st = COLLIE_OK;
    const char *msg = "";
    for (int i = 0; i < 1000 && collie_comm_error(c, &st, &msg) == COLLIE_OK; i++)
        usleep(10000);
    say_comm_error(c);
    collie_comm_destroy(c);
    collie_engine_destroy(e);
    say("EXIT");
    return 0;
}

/* The deep-queue program: FT_DEEP_N collectives of one element (kinds from
 * FT_OP: allreduce, or mix = allreduce, broadcast, allgather,
 * reduce_scatter, alltoall in turn), posted back to back with outputs
 * zeroed, then waited for, all of them, by one deadline. FT_VICTIM
 * SIGKILLs itself after FT_DIE_AT posts. A survivor checks the bytes of
 * every work that returned OK (the oracle rule) and reports one DEEP line:
 * how many were right, wrong, failed (by status; unnamed: failures whose
 * message does not name the victim) and still pending. */
enum { DEEP_KINDS = 5 };

static bool names_rank(const char *msg, int rank);

static collie_coll_kind deep_kind(bool mix, int i) {
    static const collie_coll_kind kinds[DEEP_KINDS] = {
        COLLIE_COLL_ALLREDUCE, COLLIE_COLL_BROADCAST, COLLIE_COLL_ALLGATHER,
        COLLIE_COLL_REDUCE_SCATTER, COLLIE_COLL_ALLTOALL};
    return mix ? kinds[i % DEEP_KINDS] : COLLIE_COLL_ALLREDUCE;
}

/* What rank r contributes to block p of work i (every kind sends int32). */
static int32_t deep_val(int r, int p, int i) { return (r + 1) * 1000 + (p + 1) * 10 + i % 7; }

static int deep_post(collie_comm *c, collie_coll_kind k, int i, int32_t *in, int32_t *out,
                     collie_work **w) {
    int r = collie_comm_rank(c), n = collie_comm_size(c);
    for (int p = 0; p < n; p++) {
        in[p] = deep_val(r, p, i);
        out[p] = 0;
    }
    switch (k) {
    case COLLIE_COLL_BROADCAST: /* in place: the root's block 0, zero elsewhere */
        if (r != i % n) in[0] = 0;
        return collie_broadcast(c, in, 1, COLLIE_INT32, i % n, NULL, w);
    case COLLIE_COLL_ALLGATHER: return collie_allgather(c, in, out, 1, COLLIE_INT32, NULL, w);
    case COLLIE_COLL_REDUCE_SCATTER:
        return collie_reduce_scatter(c, in, out, 1, COLLIE_INT32, COLLIE_SUM, NULL, w);
    case COLLIE_COLL_ALLTOALL: return collie_alltoall(c, in, out, 1, COLLIE_INT32, NULL, w);
    default: return collie_allreduce(c, in, out, 1, COLLIE_INT32, COLLIE_SUM, NULL, w);
    }
}

/* Does work i of kind k hold exactly its result? */
static bool deep_correct(collie_coll_kind k, int r, int n, int i, const int32_t *in,
                         const int32_t *out) {
    int32_t sum = 0;
    switch (k) {
    case COLLIE_COLL_BROADCAST: return in[0] == deep_val(i % n, 0, i);
    case COLLIE_COLL_ALLGATHER:
        for (int p = 0; p < n; p++)
            if (out[p] != deep_val(p, 0, i)) return false;
        return true;
    case COLLIE_COLL_ALLTOALL:
        for (int p = 0; p < n; p++)
            if (out[p] != deep_val(p, r, i)) return false;
        return true;
    case COLLIE_COLL_REDUCE_SCATTER:
        for (int q = 0; q < n; q++)
            sum += deep_val(q, r, i);
        return out[0] == sum;
    default:
        for (int q = 0; q < n; q++)
            sum += deep_val(q, 0, i);
        return out[0] == sum;
    }
}

static int rank_deep(void) {
    int total = env_int("FT_DEEP_N", 40000), victim = env_int("FT_VICTIM", 2);
    int die_at = env_int("FT_DIE_AT", total / 4), die_ms = env_int("FT_DIE_MS", -1);
    int64_t t_first = 0;
    bool mix = getenv("FT_OP") && !strcmp(getenv("FT_OP"), "mix");
    rk r = {0};
    r.name = getenv("FT_NAME") ? getenv("FT_NAME") : "deep";
    r.timeout_ms = env_int("FT_TIMEOUT_MS", KILL_OP_TIMEOUT);
    RK_CHECK(collie_engine_create(NULL, &r.e));
    rk_create(&r);
    int rank = collie_comm_rank(r.c), n = collie_comm_size(r.c);
    int32_t *in = calloc((size_t)total * (size_t)n, sizeof *in);
    int32_t *out = calloc((size_t)total * (size_t)n, sizeof *out);
    collie_work **w = calloc((size_t)total, sizeof *w);
    if (!in || !out || !w) {
        say("ERROR no memory");
        return 1;
    }
    int posted = 0;
    for (; posted < total; posted++) {
        if (rank == victim && (posted == die_at || (die_ms >= 0 && posted > 1 &&
                                                    mono_ns() - t_first >= die_ms * 1000000LL)))
            raise(SIGKILL);
        /* the first one connects every rank to its peers: the death comes
         * mid-stream, not before the connections */
        if (posted == 1 && collie_work_wait(w[0], r.timeout_ms + 10000) != COLLIE_OK) {
            say("ERROR the first work failed: %s", collie_work_error_message(w[0]));
            return 1;
        }
        if (posted == 1) t_first = mono_ns();
        size_t at = (size_t)posted * (size_t)n;
        int rc = deep_post(r.c, deep_kind(mix, posted), posted, in + at, out + at, &w[posted]);
        if (rc != COLLIE_OK) { /* the comm failed meanwhile: fails fast, naming why */
            say("POSTFAIL status=%s t=%lld msg=%s", collie_status_name(rc), (long long)mono_ns(),
                collie_last_error());
            break;
        }
    }
    if (rank == victim) raise(SIGKILL);
    /* every work ends by its deadline, which started when it was posted */
    int64_t until = now_ms() + r.timeout_ms + 10000;
    int ok = 0, wrong = 0, pending = 0, unnamed = 0, blamed = 0,
        nst[4] = {0}; /* EPEER EABORTED ETIMEDOUT other */
    for (int i = 0; i < posted; i++) {
        int64_t left = until - now_ms();
        int rc = collie_work_wait(w[i], (int32_t)(left > 0 ? left : 0));
        size_t at = (size_t)i * (size_t)n;
        collie_coll_kind k = deep_kind(mix, i);
        if (rc == COLLIE_OK) {
            ok++;
            if (!deep_correct(k, rank, n, i, in + at, out + at) && wrong++ < 5)
                say("WRONG seq=%llu kind=%d out=%d,%d,%d,%d in0=%d",
                    (unsigned long long)collie_work_seq(w[i]), (int)k, out[at], out[at + 1],
                    out[at + 2], out[at + 3], in[at]);
        } else if (rc == COLLIE_INPROGRESS) {
            pending++;
        } else {
            nst[rc == COLLIE_EPEER       ? 0
                : rc == COLLIE_EABORTED  ? 1
                : rc == COLLIE_ETIMEDOUT ? 2
                                         : 3]++;
            const char *why = collie_work_error_message(w[i]);
            if (!names_rank(why, victim)) {
                for (int p = 0; p < n; p++) /* whom it blames instead */
                    if (p != rank && names_rank(why, p)) blamed |= 1 << p;
                if (unnamed++ < 3)
                    say("UNNAMED seq=%llu status=%s msg=%s",
                        (unsigned long long)collie_work_seq(w[i]), collie_status_name(rc), why);
            }
        }
    }
    say("DEEP posted=%d ok=%d wrong=%d pending=%d epeer=%d eaborted=%d etimedout=%d other=%d "
        "unnamed=%d blamed=%d",
        posted, ok, wrong, pending, nst[0], nst[1], nst[2], nst[3], unnamed, blamed);
    for (int i = 0; i < posted; i++)
        collie_work_release(w[i]);
    collie_comm_destroy(r.c);
    RK_CHECK(collie_engine_destroy(r.e));
    free(in);
    free(out);
    free(w);
    say("EXIT");
    return 0;
}

/* "peerlost" (policy NONE, 4 ranks; rank 2 SIGKILLs itself FT_DIE_MS after
 * every pair connected). Rank 3 streams messages of 64 KiB for FT_LOST_MS to
 * rank 0, whose receives from any source (16 posted at a time) are being
 * read as rank 2 dies: none of rank 3's messages whose send said OK may be
 * lost, and they come in order. Rank 1 waits for a message from live rank
 * 0 (sent after the death) and one from rank 2: the first must come, the
 * second fail with EPEER naming rank 2, long before its deadline. */
#define LOST_MSG_INTS (16 * 1024)
#define LOST_MAX      (1 << 20) /* messages rank 0 can account for */
static int rank_peerlost(void) {
    int lost_ms = env_int("FT_LOST_MS", 1500), die_ms = env_int("FT_DIE_MS", 300);
    rk r = {0};
    r.name = "peerlost";
    r.timeout_ms = 8000;
    RK_CHECK(collie_engine_create(NULL, &r.e));
    rk_create(&r);
    int rank = collie_comm_rank(r.c);
    int32_t x = rank, all[4];
    collie_work *w;
    RK_CHECK(collie_allgather(r.c, &x, all, 1, COLLIE_INT32, NULL, &w));
    RK_CHECK(collie_work_wait(w, STEP_MS));
    collie_work_release(w);
    int64_t t0 = mono_ns();
    if (rank == 2) {
        usleep((useconds_t)die_ms * 1000);
        raise(SIGKILL);
    }
    if (rank == 3) {
        int32_t *buf = malloc(LOST_MSG_INTS * sizeof *buf);
        int ok = 0, i = 0;
        bool end = false;
        /* for FT_LOST_MS, then one more that says how many came before */
        for (; buf && !end; i++) {
            end = mono_ns() - t0 > (int64_t)lost_ms * 1000000;
            for (int j = 0; j < LOST_MSG_INTS; j++)
                buf[j] = end ? -1 - i : i + j;
            RK_CHECK(collie_send(r.c, buf, LOST_MSG_INTS, COLLIE_INT32, 0, 1, NULL, &w));
            if (collie_work_wait(w, STEP_MS) == COLLIE_OK) ok++;
            collie_work_release(w);
        }
        say("SENT sent=%d ok=%d", i, ok);
        free(buf);
    }
    if (rank == 1) {
        int32_t a = 0, b = 0;
        collie_work *w0, *w2;
        RK_CHECK(collie_recv(r.c, &a, 1, COLLIE_INT32, 0, 5, NULL, &w0));
        RK_CHECK(collie_recv(r.c, &b, 1, COLLIE_INT32, 2, 5, NULL, &w2));
        int r0 = collie_work_wait(w0, STEP_MS);
        say("FROM0 status=%s a=%d ms=%lld msg=%s", collie_status_name(r0), a,
            (long long)((mono_ns() - t0) / 1000000), r0 ? collie_work_error_message(w0) : "");
        int r2 = collie_work_wait(w2, STEP_MS);
        say("FROM2 status=%s ms=%lld msg=%s", collie_status_name(r2),
            (long long)((mono_ns() - t0) / 1000000), r2 ? collie_work_error_message(w2) : "");
        collie_work_release(w0);
        collie_work_release(w2);
    }
    if (rank == 0) {
        enum { WIN = 16 };
        uint8_t *seen = calloc(LOST_MAX, 1);
        if (!seen) return 1;
        int32_t *buf[WIN];
        collie_work *rw[WIN];
        for (int i = 0; i < WIN; i++) {
            buf[i] = malloc(LOST_MSG_INTS * sizeof *buf[i]);
            if (!buf[i]) return 1;
            RK_CHECK(collie_recv(r.c, buf[i], LOST_MSG_INTS, COLLIE_INT32, COLLIE_ANY_SOURCE, 1,
                                 NULL, &rw[i]));
        }
        int got = 0, wrong = 0, failed = 0, other = 0, turn = 0;
        collie_work *sw = NULL;
        int32_t v = 77;
        int64_t until = now_ms() + 2 * STEP_MS;
        int end = -1; /* how many rank 3 sent before its last */
        while ((end < 0 || got < end || !sw) && now_ms() < until) {
            if (!sw && mono_ns() - t0 > (int64_t)(die_ms + 500) * 1000000)
                RK_CHECK(collie_send(r.c, &v, 1, COLLIE_INT32, 1, 5, NULL, &sw));
            int i = turn % WIN;
            int rc = collie_work_wait(rw[i], 100);
            if (rc == COLLIE_INPROGRESS) continue;
            turn++;
            if (rc == COLLIE_OK && buf[i][0] < 0) {
                end = -1 - buf[i][0];
                if (until > now_ms() + 3000) until = now_ms() + 3000; /* for those before it */
            } else if (rc == COLLIE_OK) {
                /* in post order, but waited for in turn: a failed
                 * receive's successor was posted after later ones */
                int32_t m = buf[i][0];
                bool right = collie_work_source(rw[i]) == 3 && m < LOST_MAX && !seen[m];
                for (int j = 0; j < LOST_MSG_INTS && right; j += 4099)
                    right = buf[i][j] == m + j;
                if (!right && wrong++ < 3)
                    say("WRONG message %d from %d", m, collie_work_source(rw[i]));
                if (right) seen[m] = 1;
                got++;
            } else if (rc == COLLIE_EPEER) {
                failed++; /* a receive pending as rank 2 died: its message comes to the next */
            } else if (other++ < 3) {
                say("OTHER %s: %s", collie_status_name(rc), collie_work_error_message(rw[i]));
            }
            collie_work_release(rw[i]);
            RK_CHECK(collie_recv(r.c, buf[i], LOST_MSG_INTS, COLLIE_INT32, COLLIE_ANY_SOURCE, 1,
                                 NULL, &rw[i]));
        }
        int src = sw ? collie_work_wait(sw, STEP_MS) : COLLIE_EINVAL;
        for (int m = 0; m < end && m < LOST_MAX; m++)
            if (!seen[m] && wrong++ < 6) say("LOST message %d", m);
        free(seen);
        say("GOT got=%d end=%d wrong=%d failed=%d other=%d send=%s", got, end, wrong, failed, other,
            collie_status_name(src));
        for (int i = 0; i < WIN; i++) {
            collie_work_cancel(rw[i]);
            collie_work_wait(rw[i], STEP_MS);
            collie_work_release(rw[i]);
            free(buf[i]);
        }
        if (sw) collie_work_release(sw);
    }
    collie_comm_destroy(r.c);
    RK_CHECK(collie_engine_destroy(r.e));
    say("EXIT");
    return 0;
}

static int rank_main(const char *prog) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(prog, "loop")) return rank_loop();
    if (!strcmp(prog, "abortproc")) return rank_abort_process();
    if (!strcmp(prog, "deep")) return rank_deep();
    if (!strcmp(prog, "peerlost")) return rank_peerlost();
    fprintf(stderr, "test_faults: unknown rank program '%s'\n", prog);
    return 2;
}

/* ======================================================================== */
/* Child processes, seen from the test                                       */
/* ======================================================================== */

typedef struct proc {
    bool used;
    pid_t pid;  /* > 0 until reaped */
    int fd;     /* its stdout (and stderr if merged), -1 at EOF */
    char *text; /* everything it said */
    size_t len;
    int status;   /* exit code, 128+signal; -1 while running */
    bool stopped; /* seen stopped (WUNTRACED) */
    char label[32];
} proc;

static proc procs[MAX_PROCS + 4]; /* every child of a test; teardown kills them */

static proc *proc_new(const char *label) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (!procs[i].used) {
            proc *p = &procs[i];
            memset(p, 0, sizeof *p);
            p->used = true;
            p->fd = -1;
            p->status = -1;
            p->text = calloc(1, 1);
            snprintf(p->label, sizeof p->label, "%s", label);
            return p;
        }
    fail_msg("too many child processes");
    return NULL;
}

/* Start argv with envp; stdout (and stderr when merge) into a pipe. With
 * netns set, the child joins that network namespace before exec. */
static proc *proc_spawn(const char *label, char *const argv[], char *const envp[], bool merge,
                        const char *netns) {
    proc *p = proc_new(label);
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    pid_t parent = getpid();
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        if (netns) {
            char path[128];
            snprintf(path, sizeof path, "/run/netns/%s", netns);
            int nfd = open(path, O_RDONLY | O_CLOEXEC);
            if (nfd < 0 || setns(nfd, CLONE_NEWNET) != 0) _exit(126);
        }
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(pfd[1], 1);
        if (merge) dup2(pfd[1], 2);
        execve(argv[0], argv, envp);
        _exit(127);
    }
    close(pfd[1]);
    p->fd = pfd[0];
    fcntl(p->fd, F_SETFL, O_NONBLOCK);
    return p;
}

static void proc_reap(proc *p) {
    if (p->pid <= 0) return;
    int ws;
    pid_t got = waitpid(p->pid, &ws, WNOHANG | WUNTRACED);
    if (got != p->pid) return;
    if (WIFSTOPPED(ws)) {
        p->stopped = true;
        return;
    }
    p->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    p->pid = 0;
}

/* Read whatever any child says within timeout_ms, reap the dead. */
static void procs_pump(int timeout_ms) {
    struct pollfd pf[sizeof procs / sizeof procs[0]];
    proc *map[sizeof procs / sizeof procs[0]];
    nfds_t n = 0;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (procs[i].used && procs[i].fd >= 0) {
            pf[n] = (struct pollfd){.fd = procs[i].fd, .events = POLLIN};
            map[n++] = &procs[i];
        }
    if (n > 0 && poll(pf, n, timeout_ms) > 0) {
        for (nfds_t j = 0; j < n; j++) {
            if (!pf[j].revents) continue;
            proc *p = map[j];
            char buf[16384];
            ssize_t got = read(p->fd, buf, sizeof buf);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (got <= 0) {
                close(p->fd);
                p->fd = -1;
                continue;
            }
            p->text = realloc(p->text, p->len + (size_t)got + 1);
            memcpy(p->text + p->len, buf, (size_t)got);
            p->len += (size_t)got;
            p->text[p->len] = '\0';
        }
    } else if (n == 0) {
        usleep((useconds_t)(timeout_ms < 20 ? timeout_ms : 20) * 1000);
    }
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (procs[i].used) proc_reap(&procs[i]);
}

/* The line of p starting with `tag` (its text after the tag), or NULL. */
static const char *proc_line(const proc *p, const char *tag) {
    size_t tl = strlen(tag);
    for (const char *l = p->text; l && *l;) {
        if (strncmp(l, tag, tl) == 0 && (l[tl] == ' ' || l[tl] == '\n' || l[tl] == '\0'))
            return l + tl;
        l = strchr(l, '\n');
        if (l) l++;
    }
    return NULL;
}

/* A field "key=value" of a line, as an integer (or dflt). */
static long long line_int(const char *line, const char *key, long long dflt) {
    if (!line) return dflt;
    const char *end = strchr(line, '\n');
    size_t kl = strlen(key);
    for (const char *p = line; *p && (!end || p < end); p++)
        if ((p == line || p[-1] == ' ') && strncmp(p, key, kl) == 0 && p[kl] == '=')
            return atoll(p + kl + 1);
    return dflt;
}

/* The rest of the line after "key=" (up to the newline), copied. */
static void line_rest(const char *line, const char *key, char *out, size_t len) {
    out[0] = '\0';
    if (!line) return;
    char pat[32];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    const char *end = strchr(line, '\n');
    if (!p || (end && p > end)) return;
    p += strlen(pat);
    size_t n = end ? (size_t)(end - p) : strlen(p);
    snprintf(out, len, "%.*s", (int)n, p);
}

/* print_message holds 1 KiB: long output goes out line by line. */
static void print_lines(const char *text) {
    for (const char *l = text; *l;) {
        size_t n = strcspn(l, "\n");
        print_message("%.*s\n", (int)(n < 1000 ? n : 1000), l);
        l += n + (l[n] == '\n');
    }
}

static void procs_dump(void) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (procs[i].used) {
            print_error("--- %s (pid %d, status %d):\n", procs[i].label, (int)procs[i].pid,
                        procs[i].status);
            print_lines(procs[i].text);
        }
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            procs_dump();                                                                          \
            print_error(__VA_ARGS__);                                                              \
            fail_msg("%s", #cond);                                                                 \
        }                                                                                          \
    } while (0)

/* Wait until p has said `tag` (or died); returns the line or NULL. */
static const char *proc_wait_line(proc *p, const char *tag, int timeout_ms) {
    int64_t until = now_ms() + timeout_ms;
    const char *l;
    while (!(l = proc_line(p, tag))) {
        if (now_ms() >= until || (p->pid <= 0 && p->fd < 0)) return NULL;
        procs_pump(20);
    }
    return l;
}

static bool proc_wait_exit(proc *p, int timeout_ms) {
    int64_t until = now_ms() + timeout_ms;
    while (p->pid > 0 && now_ms() < until)
        procs_pump(20);
    while (p->fd >= 0 && now_ms() < until) /* its last words */
        procs_pump(20);
    return p->pid <= 0;
}

static void procs_kill_all(void) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        proc *p = &procs[i];
        if (!p->used) continue;
        if (p->pid > 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, NULL, 0);
        }
        if (p->fd >= 0) close(p->fd);
        free(p->text);
        memset(p, 0, sizeof *p);
    }
}

/* ---- the store and the ranks ---------------------------------------------- */

/* The secret of a store beyond loopback (FT_SECRET for its ranks). */
#define FT_SECRET "netcut-secret"

/* collie-store on a free port; *addr gets "host:port" for clients that
 * reach it at `host`. Beyond loopback it requires FT_SECRET. */
static proc *store_start(const char *bind, const char *host, const char *netns, char *addr,
                         size_t len) {
    static char token_file[128];
    bool local = strncmp(bind, "127.", 4) == 0;
    if (!local) {
        snprintf(token_file, sizeof token_file, "%s/store-token", tmp_dir);
        FILE *tf = fopen(token_file, "w");
        CHECK(tf, "cannot write %s\n", token_file);
        CHECK(fchmod(fileno(tf), 0600) == 0, "chmod %s\n", token_file); /* a secret, its owner's */
        fputs(FT_SECRET "\n", tf);
        fclose(tf);
    }
    char *argv[] = {(char *)spawn_build_path("bin/collie-store"),
                    "--bind",
                    (char *)bind,
                    "--port",
                    "0",
                    local ? NULL : "--token-file",
                    token_file,
                    NULL};
    char *envp[] = {"COLLIE_LOG=error", NULL};
    proc *p = proc_spawn("collie-store", argv, envp, true, netns);
    const char *l = proc_wait_line(p, "collie-store listening on", 5000);
    CHECK(l, "collie-store did not start\n");
    char first[128];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(l, "\n"), l);
    const char *colon = strrchr(first, ':');
    CHECK(colon, "no port in '%s'\n", first);
    snprintf(addr, len, "%s:%d", host, atoi(colon + 1));
    return p;
}

/* Our environment without COLLIE_* and FT_*, plus `extra` (NULL-ended). */
static char **child_env(const char *const *extra) {
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 24, sizeof *envp);
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "COLLIE_", 7) && strncmp(environ[i], "FT_", 3))
            envp[k++] = environ[i];
    for (size_t i = 0; extra && extra[i]; i++) {
        assert_true(k < n + 23);
        envp[k++] = (char *)extra[i];
    }
    return envp;
}

/* Rank r of n of the "loop" program, with settings `extra`. */
static proc *rank_start(const char *prog, int r, int n, const char *store_addr,
                        const char *const *extra, const char *netns) {
    static char vars[MAX_PROCS * 2][3][96];
    static int slot;
    char(*v)[96] = vars[slot++ % (MAX_PROCS * 2)];
    snprintf(v[0], 96, "COLLIE_RANK=%d", r);
    snprintf(v[1], 96, "COLLIE_WORLD_SIZE=%d", n);
    snprintf(v[2], 96, "COLLIE_STORE_ADDR=%s", store_addr);
    const char *all[24] = {v[0], v[1], v[2], "COLLIE_LOG=error"};
    size_t k = 4;
    for (size_t i = 0; extra && extra[i]; i++)
        all[k++] = extra[i];
    all[k] = NULL;
    char **envp = child_env(all);
    char *argv[] = {self_exe, "--rank", (char *)prog, NULL};
    char label[32];
    snprintf(label, sizeof label, "rank %d", r);
    proc *p = proc_spawn(label, argv, envp, false, netns);
    free(envp);
    return p;
}

static int setup(void **state) {
    (void)state;
    test_tmpdir_make(tmp_dir, sizeof tmp_dir, "cl-faults");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    procs_kill_all();
    test_tmpdir_remove(tmp_dir);
    return 0;
}

/* ======================================================================== */
/* Kill: detection, destroy, recovery                                        */
/* ======================================================================== */

typedef struct kill_result {
    int64_t detect_us; /* kill → the last survivor's last pending work failed */
} kill_result;

/* Does a survivor's message name the dead rank? (EPEER on a rank that
 * talked to it, EABORTED naming it as the root cause elsewhere.) */
static bool names_rank(const char *msg, int rank) {
    char pat[16];
    snprintf(pat, sizeof pat, "rank %d", rank);
    for (const char *p = msg; (p = strstr(p, pat)); p += strlen(pat))
        if (p[strlen(pat)] < '0' || p[strlen(pat)] > '9') return true;
    return false;
}

/* Every line of p starting with tag: call fn(line, arg) on each. */
static int proc_each_line(const proc *p, const char *tag, bool (*fn)(const char *, void *),
                          void *arg) {
    size_t tl = strlen(tag);
    int bad = 0;
    for (const char *l = p->text; l && *l;) {
        if (strncmp(l, tag, tl) == 0 && l[tl] == ' ' && !fn(l + tl, arg)) bad++;
        l = strchr(l, '\n');
        if (l) l++;
    }
    return bad;
}

typedef struct blame {
    int victim;
    int stall; /* a rank stopped across the kill, which may be named too (-1: none) */
    char bad[1024];
} blame;

/* The suspects of a line's fault data ("franks=1,3" or "-") as a bit mask;
 * -1 when the line has none. */
static long long line_franks(const char *line) {
    const char *p = strstr(line, " franks=");
    const char *end = strchr(line, '\n');
    if (!p || (end && p > end)) return -1;
    p += strlen(" franks=");
    long long mask = 0;
    while (*p >= '0' && *p <= '9') {
        long r = strtol(p, (char **)&p, 10);
        if (r < 60) mask |= 1LL << r;
        if (*p == ',') p++;
    }
    return mask;
}

/* The message names the victim, and the fault's data (where the line has
 * it) never names a rank that was healthy and never stopped, and names the
 * victim where the kind is about a peer's death. */
static bool blames_victim(const char *line, void *arg) {
    blame *b = arg;
    char msg[2048], kind[64];
    line_rest(line, "msg", msg, sizeof msg);
    line_rest(line, "fkind", kind, sizeof kind);
    long long ranks = line_franks(line);
    long long allowed = (1LL << b->victim) | (b->stall >= 0 ? 1LL << b->stall : 0);
    if (!names_rank(msg, b->victim)) {
        snprintf(b->bad, sizeof b->bad, "%.1000s", msg);
        return false;
    }
    if (ranks > 0 && (ranks & ~allowed)) {
        snprintf(b->bad, sizeof b->bad, "its fault's ranks name a healthy rank: %.900s", line);
        return false;
    }
    if (strncmp(kind, "peer_dead", 9) == 0 && !(ranks & (1LL << b->victim))) {
        snprintf(b->bad, sizeof b->bad, "a peer_dead fault without the dead rank: %.900s", line);
        return false;
    }
    return true;
}

/* `stall`: a survivor SIGSTOPped from just before the kill until STALL_MS
 * after it (-1: none). With 4 ranks the recursive-doubling allreduce pairs
 * rank r with r^1 and r^2, so rank victim^3 has no connection to the
 * victim: it learns of the death only from the others. */
/* The CPU transport the kill scenario's ranks use (the default backend
 * puts them on shared memory: one host). */
static const char *kill_transport = "COLLIE_CPU_TRANSPORT=auto";
/* What the ranks loop (FT_OP, FT_COUNT; default: small allreduces). */
static const char *kill_op = "FT_OP=allreduce", *kill_count = "FT_COUNT=64";

static void scenario_kill(int victim, int stall, kill_result *res) {
    enum { N = 4 };
    int shm_files = dev_shm_collie_files();
    char addr[64];
    store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    char name[32];
    snprintf(name, sizeof name, "FT_NAME=kill%d", victim);
    char after[32];
    snprintf(after, sizeof after, "FT_AFTER=%d", AFTER_RECOVERY);
    const char *extra[] = {name,       after, "FT_TIMEOUT_MS=30000", kill_transport, kill_op,
                           kill_count, NULL};
    proc *rk[N];
    for (int r = 0; r < N; r++)
        rk[r] = rank_start("loop", r, N, addr, extra, NULL);
    for (int r = 0; r < N; r++)
        CHECK(proc_wait_line(rk[r], "RUNNING", STEP_MS), "rank %d is not running\n", r);
    usleep(50000 + (useconds_t)(rand() % 50) * 1000); /* somewhere mid-op */
    if (stall >= 0) kill(rk[stall]->pid, SIGSTOP);
    int64_t t_kill = mono_ns();
    kill(rk[victim]->pid, SIGKILL);
    if (stall >= 0) {
        usleep(STALL_MS * 1000);
        kill(rk[stall]->pid, SIGCONT);
    }
    CHECK(proc_wait_exit(rk[victim], 5000), "rank %d did not die\n", victim);
    CHECK(rk[victim]->status == 128 + SIGKILL, "rank %d: status %d\n", victim, rk[victim]->status);
    CHECK(dev_shm_collie_files() == shm_files, "a file of collie's is left in /dev/shm\n");
    /* as collie-run --restarts would: the same rank again */
    const char *again[] = {
        name, after, "FT_TIMEOUT_MS=30000", "FT_LIFE=2", kill_transport, kill_op, kill_count, NULL};
    proc *restarted = rank_start("loop", victim, N, addr, again, NULL);
    int64_t worst = 0;
    for (int r = 0; r < N; r++) {
        if (r == victim) continue;
        const char *f = proc_wait_line(rk[r], "FAULT", STEP_MS);
        CHECK(f, "rank %d saw no fault\n", r);
        long long last = line_int(f, "last", 0), n = line_int(f, "n", 0);
        int64_t ms = (last - t_kill) / 1000000;
        print_message("rank %d: %lld pending works failed by +%.2f ms after the kill\n", r, n,
                      (double)(last - t_kill) / 1e6);
        CHECK(ms < DETECT_MS, "rank %d: its pending works failed %lld ms after the kill\n", r,
              (long long)ms);
        if ((last - t_kill) / 1000 > worst) worst = (last - t_kill) / 1000;
        /* every work that failed, and the comm's root cause, name the dead
         * rank (root code or EABORTED) */
        CHECK(n > 0 || proc_line(rk[r], "POSTFAIL"), "rank %d: nothing failed?\n", r);
        blame b = {.victim = victim, .stall = stall};
        CHECK(proc_each_line(rk[r], "WORK", blames_victim, &b) == 0 &&
                  proc_each_line(rk[r], "POSTFAIL", blames_victim, &b) == 0 &&
                  proc_each_line(rk[r], "COMMERR", blames_victim, &b) == 0,
              "rank %d: an error does not name rank %d: %s\n", r, victim, b.bad);
        if (strstr(kill_op, "broadcast")) { /* it did read by single copy before the kill */
            const char *cp = proc_wait_line(rk[r], "COPY", STEP_MS);
            CHECK(cp && line_int(cp, "bytes", 0) > 0, "rank %d: nothing came by single copy\n", r);
        }
        const char *cb = proc_wait_line(rk[r], "ONERROR", STEP_MS);
        CHECK(cb && line_int(cb, "calls", 0) == 1 && line_int(cb, "off_loop", 1) == 0,
              "rank %d: the error callback did not run once on the progress thread\n", r);
        const char *d = proc_wait_line(rk[r], "DESTROY", STEP_MS);
        CHECK(d && line_int(d, "ms", 99999) < DESTROY_MS, "rank %d: destroy too slow\n", r);
    }
    /* the new generation, with the restarted rank */
    for (int r = 0; r < N; r++) {
        proc *p = r == victim ? restarted : rk[r];
        const char *done = proc_wait_line(p, "DONE", STEP_MS);
        CHECK(done, "rank %d did not finish the new generation\n", r);
        CHECK(line_int(done, "n", 0) == AFTER_RECOVERY && line_int(done, "gen", 0) == 1,
              "rank %d: %s\n", r, done);
        CHECK(proc_wait_exit(p, STEP_MS) && p->status == 0, "rank %d: exit status %d\n", r,
              p->status);
    }
    res->detect_us = worst;
}

static void test_kill_rank2_recover(void **state) {
    (void)state;
    kill_result res;
    scenario_kill(2, -1, &res);
    print_message("kill rank 2: every pending work failed within %.2f ms\n",
                  (double)res.detect_us / 1000);
}

/* Rank 1 hears of rank 2's death only from ranks 0 and 3, which close
 * their connections to it a moment after telling the store. Stopped for
 * longer than that moment, it finds both the notice and the closed
 * connections when it resumes: whichever it reads first, it must blame
 * rank 2 (the connections' last frame carries the root cause). */
static void test_kill_rank2_stalled_peer(void **state) {
    (void)state;
    kill_result res;
    scenario_kill(2, 1, &res);
    print_message("kill rank 2, rank 1 stalled %d ms: every pending work failed within %.2f ms\n",
                  STALL_MS, (double)res.detect_us / 1000);
}

/* Rank 2 dies while its peers read 1 MiB broadcasts straight out of its
 * memory and it reads theirs (single copy over shared memory): the same
 * bounds, every error names it, and the new generation works. */
static void test_kill_rank2_during_single_copy(void **state) {
    (void)state;
    kill_result res;
    kill_op = "FT_OP=broadcast";
    kill_count = "FT_COUNT=262144";
    scenario_kill(2, -1, &res);
    kill_op = "FT_OP=allreduce";
    kill_count = "FT_COUNT=64";
    print_message("kill rank 2 (1 MiB broadcasts, single copy): every pending work failed within "
                  "%.2f ms\n",
                  (double)res.detect_us / 1000);
}

/* The same over TCP (forced): both links detect a death alike. */
static void test_kill_rank2_recover_tcp(void **state) {
    (void)state;
    kill_result res;
    kill_transport = "COLLIE_CPU_TRANSPORT=tcp";
    scenario_kill(2, -1, &res);
    kill_transport = "COLLIE_CPU_TRANSPORT=auto";
    print_message("kill rank 2 (tcp): every pending work failed within %.2f ms\n",
                  (double)res.detect_us / 1000);
}

static void test_kill_rank0_recover(void **state) {
    (void)state;
    kill_result res;
    scenario_kill(0, -1, &res);
    print_message("kill rank 0: every pending work failed within %.2f ms\n",
                  (double)res.detect_us / 1000);
}

/* ---- a deep queue when a peer dies: nothing wrong returns OK --------------- */

/* 4 ranks post DEEP_N one-element collectives back to back; rank 2
 * SIGKILLs itself DEEP_DIE_MS after its first one completed (every rank
 * connected), mid-stream. On every survivor every work ends by its
 * deadline, and each one that returned OK holds its result (the report of
 * issue 28: rank 0 returned OK for a run of allreduces whose output was
 * never written — a step that needed rank 2's closed connection went on
 * without that op, and the comm fails its works in slices, so the ones
 * not yet failed kept running). Under ABORT_COMM (the default) every
 * failure is EPEER or EABORTED and names rank 2; that race is met in some
 * rounds, not all, so the scenario runs `rounds` times. Under NONE the
 * comm goes on after the fault and every later allreduce of rank 0 meets
 * the closed connection: the same flaw, every time. There, and under
 * BLOCKING_WAIT, nothing tells a rank that never talked to rank 2, so its
 * works may also time out (a short op timeout). `policy` is an extra
 * setting (NULL: the default policy). */
#define DEEP_N       100000
#define DEEP_DIE_MS  100
#define DEEP_TIMEOUT 3000 /* op timeout where a survivor may have to wait it out */

static void scenario_deep(const char *transport, const char *policy, const char *op, int rounds) {
    enum { N = 4, VICTIM = 2 };
    char addr[64];
    store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    char total[32], die[32], timeout[32];
    snprintf(total, sizeof total, "FT_DEEP_N=%d", DEEP_N);
    snprintf(die, sizeof die, "FT_DIE_MS=%d", DEEP_DIE_MS);
    snprintf(timeout, sizeof timeout, "FT_TIMEOUT_MS=%d", policy ? DEEP_TIMEOUT : KILL_OP_TIMEOUT);
    int64_t t0 = now_ms();
    for (int round = 0; round < rounds; round++) {
        char name[32];
        snprintf(name, sizeof name, "FT_NAME=deep%d", round);
        const char *extra[] = {name, total, die, timeout, transport, op, policy, NULL};
        proc *rk[N];
        for (int r = 0; r < N; r++)
            rk[r] = rank_start("deep", r, N, addr, extra, NULL);
        CHECK(proc_wait_exit(rk[VICTIM], STEP_MS), "rank %d did not die\n", VICTIM);
        CHECK(rk[VICTIM]->status == 128 + SIGKILL, "rank %d: status %d\n", VICTIM,
              rk[VICTIM]->status);
        char lines[N][512] = {{0}}; /* copies: a process's text grows as it is read */
        for (int r = 0; r < N; r++) {
            if (r == VICTIM) continue;
            const char *d = proc_wait_line(rk[r], "DEEP", STEP_MS + DEEP_TIMEOUT);
            if (d) snprintf(lines[r], sizeof lines[r], "%.*s", (int)strcspn(d, "\n"), d);
            CHECK(d, "round %d, rank %d did not report\n", round, r);
            print_message("round %d, rank %d:%.*s\n", round, r, (int)strcspn(d, "\n"), d);
            CHECK(line_int(d, "wrong", -1) == 0,
                  "round %d, rank %d: works returned OK with a wrong result\n", round, r);
            CHECK(line_int(d, "pending", -1) == 0,
                  "round %d, rank %d: works pending past their deadline\n", round, r);
            CHECK(line_int(d, "other", -1) == 0,
                  "round %d, rank %d: works failed with another status\n", round, r);
            if (!policy)
                CHECK(line_int(d, "etimedout", -1) == 0, "round %d, rank %d: timed out\n", round,
                      r);
            CHECK(proc_wait_exit(rk[r], STEP_MS) && rk[r]->status == 0,
                  "round %d, rank %d: exit status %d\n", round, r, rk[r]->status);
        }
        /* every failure names rank 2, or a survivor whose own failures all
         * named it: a survivor that failed first may close its stream mid-
         * frame (no last words), and a peer that reads that end before the
         * store's abort notice names it (the cause still leads to rank 2) */
        for (int r = 0; r < N && !policy; r++) {
            if (r == VICTIM) continue;
            long long blamed = line_int(lines[r], "blamed", -1);
            CHECK(blamed >= 0, "round %d, rank %d: no blamed count\n", round, r);
            for (int p = 0; p < N; p++)
                if (blamed & (1 << p))
                    CHECK(p != VICTIM && line_int(lines[p], "unnamed", -1) == 0,
                          "round %d, rank %d: a failure names neither rank %d nor a rank that "
                          "failed because of it (rank %d)\n",
                          round, r, VICTIM, p);
            CHECK(line_int(lines[r], "unnamed", -1) == 0 || blamed != 0,
                  "round %d, rank %d: a failure does not name rank %d\n", round, r, VICTIM);
        }
        for (int r = 0; r < N; r++) { /* the next round's ranks take their slots */
            free(rk[r]->text);
            if (rk[r]->fd >= 0) close(rk[r]->fd);
            memset(rk[r], 0, sizeof *rk[r]);
        }
    }
    print_message("deep queue, rank %d killed, %d round(s): %lld ms\n", VICTIM, rounds,
                  (long long)(now_ms() - t0));
}

static void test_kill_deep_queue(void **state) {
    (void)state;
    scenario_deep("COLLIE_CPU_TRANSPORT=auto", NULL, "FT_OP=allreduce", 6);
}

static void test_kill_deep_queue_tcp(void **state) {
    (void)state;
    scenario_deep("COLLIE_CPU_TRANSPORT=tcp", NULL, "FT_OP=allreduce", 6);
}

/* NONE: every kind of the mix, on both links */
static void test_kill_deep_queue_policy_none(void **state) {
    (void)state;
    scenario_deep("COLLIE_CPU_TRANSPORT=auto", "COLLIE_ASYNC_ERROR_HANDLING=0", "FT_OP=mix", 1);
    scenario_deep("COLLIE_CPU_TRANSPORT=tcp", "COLLIE_ASYNC_ERROR_HANDLING=0", "FT_OP=mix", 1);
}

/* Policy NONE, a peer dies (the "peerlost" rank program): the works that
 * need it fail with EPEER naming it, at once; the others go on (a receive
 * from a live rank completes; one from any source that is reading a live
 * rank's message is not failed, and no message whose send said OK is lost). */
static void scenario_peer_lost(const char *transport) {
    enum { N = 4, VICTIM = 2 };
    char addr[64];
    store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    const char *extra[] = {transport, "COLLIE_ASYNC_ERROR_HANDLING=0", "FT_LOST_MS=1500",
                           "FT_DIE_MS=300", NULL};
    proc *rk[N];
    for (int r = 0; r < N; r++)
        rk[r] = rank_start("peerlost", r, N, addr, extra, NULL);
    CHECK(proc_wait_exit(rk[VICTIM], STEP_MS), "rank %d did not die\n", VICTIM);
    const char *l = proc_wait_line(rk[3], "SENT", 2 * STEP_MS);
    CHECK(l, "rank 3 did not report\n");
    int sent = line_int(l, "sent", -1);
    CHECK(line_int(l, "ok", -1) == sent, "rank 3: a send to live rank 0 failed\n");
    l = proc_wait_line(rk[0], "GOT", 3 * STEP_MS);
    CHECK(l, "rank 0 did not report\n");
    print_message("%s rank 0:%.*s\n", transport, (int)strcspn(l, "\n"), l);
    CHECK(line_int(l, "got", -1) == sent - 1 && line_int(l, "end", -1) == sent - 1 &&
              line_int(l, "wrong", -1) == 0 && line_int(l, "other", -1) == 0 &&
              strstr(l, "send=COLLIE_OK"),
          "rank 0 lost messages whose send said OK, or failed otherwise\n");
    l = proc_wait_line(rk[1], "FROM2", STEP_MS);
    CHECK(l, "rank 1 did not report\n");
    const char *from0 = proc_line(rk[1], "FROM0");
    print_message("%s rank 1: %.*s\n%.*s\n", transport, (int)strcspn(from0, "\n"), from0,
                  (int)strcspn(l, "\n"), l);
    CHECK(strstr(from0, "status=COLLIE_OK a=77"), "rank 1's receive from live rank 0 failed\n");
    CHECK(strstr(l, "status=COLLIE_EPEER") && names_rank(l, VICTIM) && line_int(l, "ms", -1) < 4000,
          "rank 1's receive from dead rank 2 did not fail at once naming it\n");
    for (int r = 0; r < N; r++)
        if (r != VICTIM)
            CHECK(proc_wait_exit(rk[r], STEP_MS) && rk[r]->status == 0, "rank %d: exit status %d\n",
                  r, rk[r]->status);
}

static void test_peer_lost_policy_none(void **state) {
    (void)state;
    scenario_peer_lost("COLLIE_CPU_TRANSPORT=tcp");
}

static void test_peer_lost_policy_none_auto(void **state) {
    (void)state;
    scenario_peer_lost("COLLIE_CPU_TRANSPORT=auto");
}

static void test_kill_deep_queue_blocking_wait(void **state) {
    (void)state;
    scenario_deep("COLLIE_CPU_TRANSPORT=tcp", "COLLIE_BLOCKING_WAIT=1", "FT_OP=mix", 2);
}

/* ======================================================================== */
/* Hang: SIGSTOP, desync report, flight-recorder dumps                        */
/* ======================================================================== */

typedef struct hang_result {
    int64_t detect_us; /* stop → the last of ranks 0-2 failed */
} hang_result;

static void run_trace(char *const *dumps, size_t n, char *out, size_t len, int *status) {
    char *argv[16] = {(char *)spawn_build_path("bin/collie-trace")};
    for (size_t i = 0; i < n && i < 14; i++)
        argv[i + 1] = dumps[i];
    char *envp[] = {NULL};
    proc *p = proc_spawn("collie-trace", argv, envp, true, NULL);
    CHECK(proc_wait_exit(p, 10000), "collie-trace did not finish\n");
    *status = p->status;
    snprintf(out, len, "%s", p->text);
}

static void scenario_hang(hang_result *res, bool check_trace) {
    enum { N = 4, STOP_AT = 20 };
    char addr[64];
    store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    char dump_dir[128];
    snprintf(dump_dir, sizeof dump_dir, "COLLIE_DUMP_DIR=%s", tmp_dir);
    const char *extra[] = {"FT_NAME=hang", "FT_TIMEOUT_MS=2000", dump_dir, NULL};
    const char *stopper[] = {"FT_NAME=hang", "FT_TIMEOUT_MS=2000", dump_dir, "FT_STOP_AT=20", NULL};
    proc *rk[N];
    for (int r = 0; r < N; r++)
        rk[r] = rank_start("loop", r, N, addr, r == 3 ? stopper : extra, NULL);
    const char *st = proc_wait_line(rk[3], "STOPPING", STEP_MS);
    CHECK(st, "rank 3 did not stop\n");
    int64_t t_stop = line_int(st, "t", 0);
    long long posted3 = line_int(st, "posted", 0);
    int64_t worst = 0;
    for (int r = 0; r < 3; r++) {
        const char *f = proc_wait_line(rk[r], "FAULT", HANG_OP_TIMEOUT + 5000);
        CHECK(f, "rank %d saw no fault\n", r);
        int64_t us = (line_int(f, "last", 0) - t_stop) / 1000;
        CHECK(us < (HANG_OP_TIMEOUT + HANG_SLACK_MS) * 1000LL,
              "rank %d failed %lld ms after rank 3 stopped (op timeout %d ms)\n", r,
              (long long)(us / 1000), HANG_OP_TIMEOUT);
        if (us > worst) worst = us;
        /* the desync report: rank 3 never reached the sequence number */
        const char *wl = proc_line(rk[r], "WORK");
        CHECK(wl, "rank %d: no failed work\n", r);
        char msg[2048];
        line_rest(wl, "msg", msg, sizeof msg);
        const char *never = strstr(msg, "never reached seq ");
        CHECK(never, "rank %d: no desync report in: %s\n", r, msg);
        const char *reached = strstr(never, "; reached it:");
        const char *r3 = strstr(never, "rank 3 (");
        CHECK(r3 && (!reached || r3 < reached),
              "rank %d: rank 3 is not named as never reaching the seq: %s\n", r, msg);
        /* rank 3 first; a rank blocked by it is marked as waiting on it */
        CHECK(strstr(msg, "first suspect: rank 3 (no answer"),
              "rank %d: rank 3 is not the first suspect: %s\n", r, msg);
        for (const char *q = never; (q = strstr(q, "rank ")) && (!reached || q < reached); q++) {
            int who = atoi(q + 5);
            const char *close = strchr(q, ')');
            const char *wait = strstr(q, "waiting on rank 3");
            CHECK(who == 3 || (wait && close && wait < close) || strstr(q, "idle)") == close - 4,
                  "rank %d: rank %d is blamed beside rank 3: %s\n", r, who, msg);
        }
        CHECK(proc_wait_line(rk[r], "EXIT", STEP_MS), "rank %d did not exit\n", r);
    }
    res->detect_us = worst;
    /* let rank 3 go: it finds its comm aborted, dumps and exits */
    proc_reap(rk[3]);
    kill(rk[3]->pid, SIGCONT);
    CHECK(proc_wait_line(rk[3], "EXIT", STEP_MS), "rank 3 did not exit after SIGCONT\n");
    if (!check_trace) return;
    char *dumps[N];
    for (int r = 0; r < N; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/collie-hang-g0-r%d.json", tmp_dir, r);
        CHECK(access(path, R_OK) == 0, "no dump %s\n", path);
        dumps[r] = strdup(path);
    }
    char out[16384];
    int status;
    run_trace(dumps, N, out, sizeof out, &status);
    for (int r = 0; r < N; r++)
        free(dumps[r]);
    print_message("collie-trace:\n");
    print_lines(out);
    CHECK(status == 0, "collie-trace exit %d:\n%s\n", status, out);
    char want[160];
    snprintf(want, sizeof want, "first collective not completed by every rank: seq %lld",
             posted3 + 1);
    CHECK(strstr(out, want), "collie-trace does not say '%s'\n", want);
    snprintf(want, sizeof want, "never posted it: rank 3 (last posted %lld)", posted3);
    CHECK(strstr(out, want), "collie-trace does not say '%s'\n", want);
}

static void test_hang_desync_report(void **state) {
    (void)state;
    hang_result res;
    scenario_hang(&res, true);
    print_message("hang: ranks 0-2 failed within %.1f ms of the stop (op timeout %d ms)\n",
                  (double)res.detect_us / 1000, HANG_OP_TIMEOUT);
}

/* The desync report names a rank's locally refused post: rank 1's
 * allreduce is refused (a NULL receive buffer), rank 0's runs into its
 * deadline, and the report says why rank 1 never posted it. A collective
 * completed after the refusal forgets it (a second world: refused, then
 * one allreduce both post, then rank 0 alone again). world_link's
 * allreduce is seq 1. */
static void desync_refused_case(bool complete_after, char *msg, size_t len) {
    world w;
    world_create(&w, 2, complete_after ? "refused2" : "refused", NULL);
    world_link(&w);
    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    collie_work *wa, *wb;
    assert_int_equal(collie_allreduce(w.c[1], b, NULL, 4, COLLIE_FP32, COLLIE_SUM, NULL, &wb),
                     COLLIE_EINVAL);
    if (complete_after) {
        assert_int_equal(collie_allreduce(w.c[0], a, a, 4, COLLIE_FP32, COLLIE_SUM, NULL, &wa),
                         COLLIE_OK);
        assert_int_equal(collie_allreduce(w.c[1], b, b, 4, COLLIE_FP32, COLLIE_SUM, NULL, &wb),
                         COLLIE_OK);
        assert_int_equal(collie_work_wait(wa, 10000), COLLIE_OK);
        assert_int_equal(collie_work_wait(wb, 10000), COLLIE_OK);
        for (int i = 0; i < 4; i++)
            assert_true(a[i] == (float)(i + 1) && b[i] == (float)(i + 1));
        collie_work_release(wa);
        collie_work_release(wb);
    }
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = 300;
    assert_int_equal(collie_allreduce(w.c[0], a, a, 4, COLLIE_FP32, COLLIE_SUM, &o, &wa),
                     COLLIE_OK);
    assert_int_equal(collie_work_wait(wa, 10000), COLLIE_ETIMEDOUT);
    snprintf(msg, len, "%s", collie_work_error_message(wa));
    collie_work_release(wa);
    world_destroy(&w);
}

static void test_desync_names_refused_post(void **state) {
    (void)state;
    char msg[4096];
    desync_refused_case(false, msg, sizeof msg);
    print_message("%s\n", msg);
    if (!strstr(msg, "never reached seq 2: rank 1 (posted 1, completed 1, idle, refused: "
                     "allreduce of 4 x fp32 (sum): receive buffer is NULL)"))
        fail_msg("the report does not name rank 1's refused post: %s", msg);
    desync_refused_case(true, msg, sizeof msg);
    print_message("%s\n", msg);
    if (!strstr(msg, "never reached seq 3: rank 1 (posted 2, completed 2, idle)"))
        fail_msg("the report names a refusal a completed collective followed: %s", msg);
}

/* ======================================================================== */
/* Network cut (namespaces joined by veth pairs; one link down)              */
/* ======================================================================== */

/*
 * Three namespaces, so that nothing is added to the root namespace (whose
 * own network here may well be 192.0.2.0/24): S runs the store, A and B
 * the ranks. S-A, S-B and A-B are veth pairs with /30s of 192.0.2.0/24
 * (TEST-NET-1). Cutting A-B leaves both sides with the store.
 */
static char ns_names[3][32];
static bool ns_made;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    int rc = system(full);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void netns_cleanup(void) {
    if (!ns_made) return;
    for (int i = 0; i < 3; i++)
        sh("ip netns del %s", ns_names[i]); /* takes its veth ends along */
    ns_made = false;
}

static bool netns_setup(char *why, size_t len) {
    if (geteuid() != 0) {
        snprintf(why, len, "not root");
        return false;
    }
    if (sh("ip netns help") > 1 && sh("ip netns list") != 0) {
        snprintf(why, len, "'ip netns' is not available");
        return false;
    }
    const char *tags[3] = {"s", "a", "b"};
    for (int i = 0; i < 3; i++)
        snprintf(ns_names[i], sizeof ns_names[i], "clt%d%s", (int)getpid(), tags[i]);
    for (int i = 0; i < 3; i++)
        if (sh("ip netns add %s", ns_names[i]) != 0) {
            for (int j = 0; j < i; j++)
                sh("ip netns del %s", ns_names[j]);
            snprintf(why, len, "'ip netns add' failed (no CAP_SYS_ADMIN?)");
            return false;
        }
    ns_made = true;
    const char *S = ns_names[0], *A = ns_names[1], *B = ns_names[2];
    /* each pair is created inside a namespace, never in the root one */
    struct {
        const char *ns1, *if1, *ip1, *ns2, *if2, *ip2;
    } links[] = {{S, "vsa", "192.0.2.1", A, "vas", "192.0.2.2"},
                 {S, "vsb", "192.0.2.5", B, "vbs", "192.0.2.6"},
                 {A, "vab", "192.0.2.9", B, "vba", "192.0.2.10"}};
    for (size_t i = 0; i < 3; i++) {
        if (sh("ip -n %s link add %s type veth peer name %s netns %s", links[i].ns1, links[i].if1,
               links[i].if2, links[i].ns2) != 0 ||
            sh("ip -n %s addr add %s/30 dev %s", links[i].ns1, links[i].ip1, links[i].if1) != 0 ||
            sh("ip -n %s addr add %s/30 dev %s", links[i].ns2, links[i].ip2, links[i].if2) != 0 ||
            sh("ip -n %s link set %s up", links[i].ns1, links[i].if1) != 0 ||
            sh("ip -n %s link set %s up", links[i].ns2, links[i].if2) != 0) {
            netns_cleanup();
            snprintf(why, len, "could not set up veth pairs");
            return false;
        }
    }
    for (int i = 0; i < 3; i++)
        sh("ip -n %s link set lo up", ns_names[i]);
    return true;
}

static void test_network_cut(void **state) {
    (void)state;
    char why[128];
    if (!netns_setup(why, sizeof why)) {
        skip_because("network namespaces unavailable: %s", why);
    }
    enum { N = 4 };
    char addr_a[64], addr_b[64];
    proc *store = store_start("0.0.0.0", "192.0.2.1", ns_names[0], addr_a, sizeof addr_a);
    (void)store;
    snprintf(addr_b, sizeof addr_b, "192.0.2.5%s", strrchr(addr_a, ':'));
    /* a partition is a TCP matter: the ranks are forced onto TCP (ranks 0
     * and 1 share a namespace and would otherwise use shared memory) */
    const char *side_a[] = {"FT_NAME=netcut",
                            "FT_TIMEOUT_MS=2000",
                            "COLLIE_SOCKET_ADDR=192.0.2.9",
                            "COLLIE_CPU_TRANSPORT=tcp",
                            "COLLIE_STORE_TOKEN=" FT_SECRET,
                            NULL};
    const char *side_b[] = {"FT_NAME=netcut",
                            "FT_TIMEOUT_MS=2000",
                            "COLLIE_SOCKET_ADDR=192.0.2.10",
                            "COLLIE_CPU_TRANSPORT=tcp",
                            "COLLIE_STORE_TOKEN=" FT_SECRET,
                            NULL};
    proc *rk[N];
    for (int r = 0; r < N; r++)
        rk[r] = rank_start("loop", r, N, r < 2 ? addr_a : addr_b, r < 2 ? side_a : side_b,
                           ns_names[r < 2 ? 1 : 2]);
    for (int r = 0; r < N; r++)
        CHECK(proc_wait_line(rk[r], "RUNNING", STEP_MS), "rank %d is not running\n", r);
    int64_t t_cut = mono_ns();
    CHECK(sh("ip -n %s link set vab down", ns_names[1]) == 0, "cannot set the link down\n");
    int64_t worst = 0;
    for (int r = 0; r < N; r++) {
        const char *f = proc_wait_line(rk[r], "FAULT", HANG_OP_TIMEOUT + 5000);
        CHECK(f, "rank %d saw no fault\n", r);
        int64_t ms = (line_int(f, "last", 0) - t_cut) / 1000000;
        CHECK(ms < HANG_OP_TIMEOUT + NETCUT_SLACK_MS, "rank %d failed %lld ms after the cut\n", r,
              (long long)ms);
        if (ms > worst) worst = ms;
        CHECK(proc_wait_line(rk[r], "EXIT", STEP_MS), "rank %d did not exit\n", r);
        const char *cl = proc_line(rk[r], "COMMERR");
        char msg[1024];
        line_rest(cl, "msg", msg, sizeof msg);
        print_message("rank %d (side %c): failed at +%lld ms: %.200s\n", r, r < 2 ? 'A' : 'B',
                      (long long)ms, msg);
        /* its fault's suspects are across the cut, never on its own side */
        long long ranks = line_franks(cl), other = r < 2 ? 0xc : 0x3;
        CHECK(ranks <= 0 || !(ranks & ~other), "rank %d: its fault names its own side: %.300s\n", r,
              cl);
    }
    procs_kill_all();
    netns_cleanup();
}

static int teardown_netns(void **state) {
    teardown(state);
    netns_cleanup();
    return 0;
}

/* ======================================================================== */
/* Error policies                                                            */
/* ======================================================================== */

/* BLOCKING_WAIT: the waiter gets ETIMEDOUT, the comm's other works
 * EABORTED; nothing happens in the background, so the peer stays healthy
 * until its own deadline; posts fail fast; the application aborts. */
static void test_blocking_wait(void **state) {
    (void)state;
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "bw";
    o.policy = COLLIE_POLICY_BLOCKING_WAIT;
    o.on_error = rk_on_error; /* must never run under BLOCKING_WAIT */
    atomic_store(&rk_errors, 0);
    world w;
    world_create(&w, 2, "bw", &o);
    int32_t x[2] = {1, 1}, y = 1;
    collie_work *a, *b, *peer;
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 300;
    assert_int_equal(collie_allreduce(w.c[0], &x[0], &x[0], 1, COLLIE_INT32, COLLIE_SUM, &po, &a),
                     COLLIE_OK);
    po.timeout_ms = 30000;
    assert_int_equal(collie_allreduce(w.c[0], &x[1], &x[1], 1, COLLIE_INT32, COLLIE_SUM, &po, &b),
                     COLLIE_OK);
    int64_t t0 = now_ms();
    assert_int_equal(collie_work_wait(a, 5000), COLLIE_ETIMEDOUT);
    int64_t took = now_ms() - t0;
    assert_true(took < 1500);
    /* a post right after the waiter got the root error fails at once, even
     * before the loop has applied the policy to the comm's other works */
    collie_work *next = (collie_work *)0x1;
    assert_int_equal(collie_allreduce(w.c[0], &y, &y, 1, COLLIE_INT32, COLLIE_SUM, NULL, &next),
                     COLLIE_EABORTED);
    assert_null(next);
    assert_non_null(strstr(collie_work_error_message(a), "deadline of 300 ms passed"));
    /* no desync query in the background either */
    assert_null(strstr(collie_work_error_message(a), "Desync"));
    assert_int_equal(collie_work_wait(b, 2000), COLLIE_EABORTED);
    assert_non_null(strstr(collie_work_error_message(b), "deadline of 300 ms passed"));
    int st;
    const char *msg;
    assert_int_equal(collie_comm_error(w.c[0], &st, &msg), COLLIE_ETIMEDOUT);
    /* posts fail fast */
    collie_work *late = (collie_work *)0x1;
    t0 = now_ms();
    assert_int_equal(collie_allreduce(w.c[0], &y, &y, 1, COLLIE_INT32, COLLIE_SUM, NULL, &late),
                     COLLIE_EABORTED);
    assert_null(late);
    assert_true(now_ms() - t0 < 100);
    assert_non_null(strstr(collie_last_error(), "has failed"));
    /* nothing propagated: the peer is healthy until its own deadline. Its
     * seq 1 and 2 may even complete with the data rank 0 sent before giving
     * up; seq 3, which rank 0 never posted, times out by the peer's own
     * deadline — nothing fails early with EPEER or EABORTED */
    usleep(500000);
    assert_int_equal(collie_comm_error(w.c[1], &st, &msg), COLLIE_OK);
    po.timeout_ms = 400;
    int32_t z[3] = {1, 1, 1};
    for (int k = 0; k < 3; k++) {
        t0 = now_ms();
        assert_int_equal(
            collie_allreduce(w.c[1], &z[k], &z[k], 1, COLLIE_INT32, COLLIE_SUM, &po, &peer),
            COLLIE_OK);
        int rc = collie_work_wait(peer, 5000);
        took = now_ms() - t0;
        print_message("peer: seq %d: %s after %lld ms %s\n", k + 1, collie_status_name(rc),
                      (long long)took, collie_work_error_message(peer));
        if (k < 2) {
            assert_true(rc == COLLIE_OK || rc == COLLIE_ETIMEDOUT);
            if (rc == COLLIE_OK) assert_int_equal(z[k], 2);
        } else {
            assert_int_equal(rc, COLLIE_ETIMEDOUT);
            assert_true(took >= 350 && took < 2000);
        }
        collie_work_release(peer);
        if (rc != COLLIE_OK) break;
    }
    /* the comm's state follows the work's completion at once (bounded) */
    for (int i = 0; i < 100 && collie_comm_error(w.c[1], &st, &msg) == COLLIE_OK; i++)
        usleep(10000);
    assert_int_equal(st, COLLIE_ETIMEDOUT);
    assert_non_null(strstr(msg, "deadline of 400 ms passed"));
    assert_int_equal(atomic_load(&rk_errors), 0); /* no callback either */
    /* the application decides: abort and destroy work, promptly */
    t0 = now_ms();
    assert_int_equal(collie_comm_abort(w.c[0], "the app gives up"), COLLIE_OK);
    assert_int_equal(collie_comm_error(w.c[0], &st, &msg), COLLIE_ETIMEDOUT); /* the root stays */
    assert_int_equal(collie_comm_destroy(w.c[0]), COLLIE_OK);
    assert_int_equal(collie_comm_destroy(w.c[1]), COLLIE_OK);
    assert_true(now_ms() - t0 < 1000);
    w.c[0] = w.c[1] = NULL;
    collie_work_release(a);
    collie_work_release(b);
    world_destroy(&w);
}

/* ABORT_PROCESS: the process ends with SIGABRT after writing its dump; the
 * peer (ABORT_COMM) learns the root cause. */
static void test_abort_process(void **state) {
    (void)state;
    char addr[64];
    store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    char dump_dir[128];
    snprintf(dump_dir, sizeof dump_dir, "COLLIE_DUMP_DIR=%s", tmp_dir);
    const char *r0[] = {dump_dir, "COLLIE_ASYNC_ERROR_HANDLING=abort_process", NULL};
    const char *r1[] = {dump_dir, "COLLIE_ASYNC_ERROR_HANDLING=2", NULL};
    proc *p0 = rank_start("abortproc", 0, 2, addr, r0, NULL);
    proc *p1 = rank_start("abortproc", 1, 2, addr, r1, NULL);
    CHECK(proc_wait_exit(p0, STEP_MS), "rank 0 did not end\n");
    CHECK(p0->status == 128 + SIGABRT, "rank 0: status %d, not SIGABRT\n", p0->status);
    char path[256];
    snprintf(path, sizeof path, "%s/collie-abortproc-g0-r0.json", tmp_dir);
    CHECK(access(path, R_OK) == 0, "no dump %s\n", path);
    char out[8192];
    int status;
    char *dumps[] = {path};
    run_trace(dumps, 1, out, sizeof out, &status);
    CHECK(status == 0 && strstr(out, "COLLIE_ETIMEDOUT"), "collie-trace on %s:\n%s\n", path, out);
    /* the peer was told before the process ended */
    const char *cl = proc_wait_line(p1, "COMMERR", STEP_MS);
    CHECK(cl, "rank 1 did not report\n");
    CHECK(strstr(cl, "status=COLLIE_EABORTED") && strstr(cl, "deadline of 500 ms passed"),
          "rank 1 did not learn the root cause: %s\n", cl);
    CHECK(proc_wait_exit(p1, STEP_MS) && p1->status == 0, "rank 1: status %d\n", p1->status);
}

/* ======================================================================== */
/* Aborts from anywhere                                                      */
/* ======================================================================== */

typedef struct cb_ctx {
    collie_comm *c;
    _Atomic int calls, bad;
} cb_ctx;

static void abort_in_cb(collie_work *w, void *arg) {
    cb_ctx *x = arg;
    atomic_fetch_add(&x->calls, 1);
    /* twice, inside the callback of a work the first abort may fail */
    if (collie_comm_abort(x->c, "from a callback") != COLLIE_OK) atomic_fetch_add(&x->bad, 1);
    if (collie_comm_abort(x->c, "from a callback, again") != COLLIE_OK)
        atomic_fetch_add(&x->bad, 1);
    collie_work_release(w);
}

static void test_abort_from_callback(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "abortcb", NULL);
    int32_t x[2] = {1, 2}, y = 0;
    cb_ctx ctx = {.c = w.c[0]};
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cb = abort_in_cb;
    po.cb_arg = &ctx;
    collie_work *first, *other, *pending;
    /* rank 0: one both ranks post (its callback aborts rank 0's comm), then
     * one only rank 0 posts (pending until the abort; its callback aborts
     * again); each callback releases one reference, we keep ours */
    assert_int_equal(
        collie_allreduce(w.c[0], &x[0], &x[0], 1, COLLIE_INT32, COLLIE_SUM, &po, &first),
        COLLIE_OK);
    collie_work_hold(first);
    assert_int_equal(collie_allreduce(w.c[0], &y, &y, 1, COLLIE_INT32, COLLIE_SUM, &po, &pending),
                     COLLIE_OK);
    collie_work_hold(pending);
    assert_int_equal(
        collie_allreduce(w.c[1], &x[1], &x[1], 1, COLLIE_INT32, COLLIE_SUM, NULL, &other),
        COLLIE_OK);
    assert_int_equal(collie_work_wait(first, 5000), COLLIE_OK);
    assert_int_equal(x[0], 3);
    assert_int_equal(collie_work_wait(pending, 5000), COLLIE_EABORTED);
    assert_non_null(strstr(collie_work_error_message(pending), "from a callback"));
    assert_int_equal(collie_work_wait(other, 5000), COLLIE_OK);
    for (int i = 0; i < 100 && atomic_load(&ctx.calls) < 2; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&ctx.calls), 2);
    assert_int_equal(atomic_load(&ctx.bad), 0);
    /* the peer learns it, with the reason */
    int st = COLLIE_OK;
    const char *msg = "";
    for (int i = 0; i < 200 && collie_comm_error(w.c[1], &st, &msg) == COLLIE_OK; i++)
        usleep(10000);
    assert_int_equal(st, COLLIE_EABORTED);
    assert_non_null(strstr(msg, "rank 0 aborted the comm: from a callback"));
    collie_work_release(first);
    collie_work_release(pending);
    collie_work_release(other);
    world_destroy(&w);
}

typedef struct waiter {
    collie_work *w;
    int rc;
    int64_t took_ms;
} waiter;

static void *wait_thread(void *arg) {
    waiter *x = arg;
    int64_t t0 = now_ms();
    x->rc = collie_work_wait(x->w, 10000);
    x->took_ms = now_ms() - t0;
    return NULL;
}

typedef struct aborter {
    collie_comm *c;
    pthread_barrier_t *go;
    int rc;
} aborter;

static void *abort_thread(void *arg) {
    aborter *x = arg;
    if (x->go) pthread_barrier_wait(x->go);
    x->rc = collie_comm_abort(x->c, "from another thread");
    return NULL;
}

/* A second thread aborts while a third waits; then many threads abort at
 * once, and destroy follows at once. */
static void test_abort_from_threads(void **state) {
    (void)state;
    world w;
    world_create(&w, 2, "abortthr", NULL);
    int32_t y = 0;
    waiter wt = {0};
    assert_int_equal(collie_allreduce(w.c[0], &y, &y, 1, COLLIE_INT32, COLLIE_SUM, NULL, &wt.w),
                     COLLIE_OK);
    pthread_t tw, ta;
    assert_int_equal(pthread_create(&tw, NULL, wait_thread, &wt), 0);
    usleep(50000);
    aborter ab = {.c = w.c[0]};
    assert_int_equal(pthread_create(&ta, NULL, abort_thread, &ab), 0);
    pthread_join(ta, NULL);
    pthread_join(tw, NULL);
    assert_int_equal(ab.rc, COLLIE_OK);
    assert_int_equal(wt.rc, COLLIE_EABORTED);
    assert_true(wt.took_ms < 2000);
    assert_non_null(strstr(collie_work_error_message(wt.w), "from another thread"));
    collie_work_release(wt.w);
    assert_int_equal(collie_comm_destroy(w.c[0]), COLLIE_OK);
    assert_int_equal(collie_comm_destroy(w.c[1]), COLLIE_OK);
    w.c[0] = w.c[1] = NULL;
    world_destroy(&w);

    /* eight threads abort rank 1 at once (idempotent), destroy follows */
    world_create(&w, 2, "abortthr2", NULL);
    enum { T = 8 };
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, T);
    aborter many[T];
    pthread_t th[T];
    collie_work *pend;
    assert_int_equal(collie_allreduce(w.c[1], &y, &y, 1, COLLIE_INT32, COLLIE_SUM, NULL, &pend),
                     COLLIE_OK);
    for (int i = 0; i < T; i++) {
        many[i] = (aborter){.c = w.c[1], .go = &go};
        assert_int_equal(pthread_create(&th[i], NULL, abort_thread, &many[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(many[i].rc, COLLIE_OK);
    }
    pthread_barrier_destroy(&go);
    assert_int_equal(collie_work_wait(pend, 5000), COLLIE_EABORTED);
    collie_work_release(pend);
    int64_t t0 = now_ms();
    assert_int_equal(collie_comm_abort(w.c[1], "once more"), COLLIE_OK);
    assert_int_equal(collie_comm_destroy(w.c[1]), COLLIE_OK);
    assert_int_equal(collie_comm_destroy(w.c[0]), COLLIE_OK);
    assert_true(now_ms() - t0 < 1000);
    w.c[0] = w.c[1] = NULL;
    world_destroy(&w);
}

/* A stale process of an earlier generation that reaches a rank of the new
 * one (say its port was reused) is refused at the handshake: its work
 * fails promptly, and the new generation never notices. */
static void test_stale_generation_refused(void **state) {
    (void)state;
    collie_engine *e;
    collie_store_server *srv;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    assert_int_equal(collie_store_server_create(e, "127.0.0.1", 0, NULL, &srv), COLLIE_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", collie_store_server_port(srv));
    collie_store *st[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(collie_store_connect(e, addr, NULL, &st[i]), COLLIE_OK);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "stale";
    o.create_timeout_ms = 10000;
    collie_comm *c[4]; /* c[0], c[1]: generation 0; c[2], c[3]: generation 1 */
    collie_work *cw[4];
    for (int g = 0; g < 2; g++) {
        for (int r = 0; r < 2; r++)
            assert_int_equal(
                collie_comm_create_post(e, st[2 * g + r], r, 2, &o, &c[2 * g + r], &cw[2 * g + r]),
                COLLIE_OK);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(collie_work_wait(cw[2 * g + r], 10000), COLLIE_OK);
            collie_work_release(cw[2 * g + r]);
            assert_int_equal(collie_comm_generation(c[2 * g + r]), (uint64_t)g);
        }
    }
    /* generation 0's rank 1 is gone; its address now leads to generation
     * 1's rank 1 */
    assert_int_equal(collie_comm_destroy(c[1]), COLLIE_OK);
    void *val;
    size_t len;
    assert_int_equal(collie_store_get(st[0], "collie/stale/1/tcp/1", 5000, &val, &len), COLLIE_OK);
    assert_int_equal(collie_store_set(st[0], "collie/stale/0/tcp/1", val, len, 5000), COLLIE_OK);
    free(val);
    int32_t x = 1, y[2] = {1, 2};
    collie_work *w;
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 5000;
    int64_t t0 = now_ms();
    assert_int_equal(collie_allreduce(c[0], &x, &x, 1, COLLIE_INT32, COLLIE_SUM, &po, &w),
                     COLLIE_OK);
    int rc = collie_work_wait(w, 10000);
    print_message("stale rank: %s after %lld ms: %s\n", collie_status_name(rc),
                  (long long)(now_ms() - t0), collie_work_error_message(w));
    assert_true(rc == COLLIE_EPEER || rc == COLLIE_EPROTO);
    assert_true(now_ms() - t0 < 2000);
    collie_work_release(w);
    /* the new generation is untouched */
    int st1;
    assert_int_equal(collie_comm_error(c[3], &st1, NULL), COLLIE_OK);
    collie_work *nw[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(
            collie_allreduce(c[2 + r], &y[r], &y[r], 1, COLLIE_INT32, COLLIE_SUM, NULL, &nw[r]),
            COLLIE_OK);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_work_wait(nw[r], 10000), COLLIE_OK);
        assert_int_equal(y[r], 3);
        collie_work_release(nw[r]);
    }
    assert_int_equal(collie_comm_destroy(c[0]), COLLIE_OK);
    for (int i = 2; i < 4; i++)
        assert_int_equal(collie_comm_destroy(c[i]), COLLIE_OK);
    for (int i = 0; i < 4; i++)
        collie_store_destroy(st[i]);
    collie_store_server_destroy(srv);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* ======================================================================== */
/* Create → collectives → abort → destroy, many times                        */
/* ======================================================================== */

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

static void one_cycle(collie_engine *e, collie_store **st, int i) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "cycle";
    o.create_timeout_ms = 10000;
    collie_comm *c[2];
    collie_work *cw[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(collie_comm_create_post(e, st[r], r, 2, &o, &c[r], &cw[r]), COLLIE_OK);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(collie_work_wait(cw[r], 10000), COLLIE_OK);
        assert_int_equal(collie_comm_generation(c[r]), (uint64_t)i);
        collie_work_release(cw[r]);
    }
    int32_t v[2][64];
    for (int k = 0; k < 3; k++) {
        collie_work *w[2];
        for (int r = 0; r < 2; r++) {
            for (int j = 0; j < 64; j++)
                v[r][j] = r + j + k;
            assert_int_equal(
                collie_allreduce(c[r], v[r], v[r], 64, COLLIE_INT32, COLLIE_SUM, NULL, &w[r]),
                COLLIE_OK);
        }
        for (int r = 0; r < 2; r++) {
            assert_int_equal(collie_work_wait(w[r], 10000), COLLIE_OK);
            assert_int_equal(v[r][5], 1 + 2 * (5 + k));
            collie_work_release(w[r]);
        }
    }
    /* one more, only on rank 1: pending when rank 0 aborts */
    collie_work *pend;
    assert_int_equal(collie_allreduce(c[1], v[1], v[1], 64, COLLIE_INT32, COLLIE_SUM, NULL, &pend),
                     COLLIE_OK);
    assert_int_equal(collie_comm_abort(c[0], "cycle"), COLLIE_OK);
    int rc = collie_work_wait(pend, 5000);
    assert_true(rc == COLLIE_EABORTED || rc == COLLIE_EPEER);
    collie_work_release(pend);
    for (int r = 0; r < 2; r++)
        assert_int_equal(collie_comm_destroy(c[r]), COLLIE_OK);
}

static void test_abort_cycles(void **state) {
    (void)state;
    char addr[64];
    store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    collie_engine *e;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    collie_store *st[2];
    for (int r = 0; r < 2; r++)
        assert_int_equal(collie_store_connect(e, addr, NULL, &st[r]), COLLIE_OK);
    int cycles = quick() ? CYCLES_QUICK : CYCLES;
    int fds0 = 0, threads0 = 0;
    long rss0 = 0;
    int64_t t0 = now_ms();
    for (int i = 0; i < cycles; i++) {
        if (i == CYCLES_WARMUP) {
            fds0 = count_open_fds();
            threads0 = count_threads_stable();
            rss0 = rss_kb();
        }
        one_cycle(e, st, i);
    }
    int fds1 = count_open_fds_settled(fds0), threads1 = count_threads_settled(threads0);
    long rss1 = rss_kb();
    print_message("%d cycles in %lld ms: fds %d -> %d, threads %d -> %d, VmRSS %ld -> %ld kB "
                  "(tolerance %d kB)\n",
                  cycles, (long long)(now_ms() - t0), fds0, fds1, threads0, threads1, rss0, rss1,
                  RSS_TOLERANCE_KB);
    assert_int_equal(fds1, fds0);
    assert_int_equal(threads1, threads0);
    if (!CL_SANITIZED) assert_true(rss1 - rss0 < RSS_TOLERANCE_KB);
    for (int r = 0; r < 2; r++)
        collie_store_destroy(st[r]);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* ======================================================================== */
/* The store server dies                                                     */
/* ======================================================================== */

static void test_store_dies(void **state) {
    (void)state;
    char addr[64];
    proc *srv = store_start("127.0.0.1", "127.0.0.1", NULL, addr, sizeof addr);
    collie_engine *e;
    assert_int_equal(collie_engine_create(NULL, &e), COLLIE_OK);
    collie_store *s;
    assert_int_equal(collie_store_connect(e, addr, NULL, &s), COLLIE_OK);
    assert_int_equal(collie_store_set(s, "up", "1", 1, 5000), COLLIE_OK);
    /* pending: a get that waits for a key, and a creation missing 2 of 3 ranks */
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.timeout_ms = 5000;
    collie_work *get;
    assert_int_equal(collie_store_post_get(s, "never", &po, &get), COLLIE_OK);
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "orphan";
    o.create_timeout_ms = 3000;
    collie_comm *c;
    collie_work *cw;
    assert_int_equal(collie_comm_create_post(e, s, 0, 3, &o, &c, &cw), COLLIE_OK);
    usleep(100000); /* both are on the server now */
    int64_t t0 = now_ms();
    kill(srv->pid, SIGKILL);
    int rc = collie_work_wait(get, 10000);
    int64_t took = now_ms() - t0;
    print_message("pending get: %s after %lld ms: %s\n", collie_status_name(rc), (long long)took,
                  collie_work_error_message(get));
    assert_int_equal(rc, COLLIE_EPEER);
    assert_true(took < 5000);
    assert_non_null(strstr(collie_work_error_message(get), addr));
    rc = collie_work_wait(cw, 10000);
    took = now_ms() - t0;
    print_message("pending creation: %s after %lld ms: %s\n", collie_status_name(rc),
                  (long long)took, collie_work_error_message(cw));
    assert_true(rc < 0);
    assert_true(took < 3000 + 1500);
    assert_non_null(strstr(collie_work_error_message(cw), addr));
    collie_work_release(get);
    collie_work_release(cw);
    assert_int_equal(collie_comm_destroy(c), COLLIE_OK);
    /* new requests and creations while it is gone: within their deadlines */
    po.timeout_ms = 800;
    t0 = now_ms();
    assert_int_equal(collie_store_post_get(s, "up", &po, &get), COLLIE_OK);
    rc = collie_work_wait(get, 10000);
    took = now_ms() - t0;
    print_message("new get: %s after %lld ms: %s\n", collie_status_name(rc), (long long)took,
                  collie_work_error_message(get));
    assert_true(rc == COLLIE_ETIMEDOUT || rc == COLLIE_EPEER);
    assert_true(took < 800 + 500);
    assert_non_null(strstr(collie_work_error_message(get), addr));
    collie_work_release(get);
    o.create_timeout_ms = 1000;
    t0 = now_ms();
    c = (collie_comm *)0x1;
    rc = collie_comm_create(e, s, 0, 2, &o, &c);
    took = now_ms() - t0;
    print_message("new creation: %s after %lld ms: %s\n", collie_status_name(rc), (long long)took,
                  collie_last_error());
    assert_true(rc < 0);
    assert_null(c);
    assert_true(took < 1000 + 1500);
    assert_non_null(strstr(collie_last_error(), addr));
    collie_store_destroy(s);
    assert_int_equal(collie_engine_destroy(e), COLLIE_OK);
}

/* ======================================================================== */
/* examples/recovery under collie-run                                        */
/* ======================================================================== */

static void test_recovery_example(void **state) {
    (void)state;
    char *argv[] = {(char *)spawn_build_path("bin/collie-run"),
                    "-n",
                    "4",
                    "--restarts",
                    "1",
                    "--timeout",
                    "60",
                    "--",
                    (char *)spawn_build_path("examples/recovery"),
                    NULL};
    const char *extra[] = {"COLLIE_LOG=error", NULL};
    char **envp = child_env(extra);
    proc *p = proc_spawn("collie-run recovery", argv, envp, true, NULL);
    free(envp);
    CHECK(proc_wait_exit(p, 60000), "collie-run did not finish\n");
    print_lines(p->text);
    CHECK(p->status == 0, "collie-run exit status %d\n", p->status);
    for (int r = 0; r < 4; r++) {
        char want[128];
        snprintf(want, sizeof want, "[%d] rank %d: recovered", r, r);
        CHECK(strstr(p->text, want), "no '%s'\n", want);
        snprintf(want, sizeof want, "[%d] rank %d: generation 1: 100 allreduces correct", r, r);
        CHECK(strstr(p->text, want), "no '%s'\n", want);
    }
    CHECK(strstr(p->text, "[2] rank 2: restarted (life 2)"), "rank 2 was not restarted\n");
    CHECK(strstr(p->text, "collie-run: restarting rank 2"), "no restart by collie-run\n");
    CHECK(strstr(p->text, "after rank 2 was killed"), "no detection report\n");
}

/* ======================================================================== */

/* bench/faults.sh: run a scenario `runs` times; one line per run, then
 * "median ... min ... max" (milliseconds, from CLOCK_MONOTONIC stamps that
 * every process of the host shares). */
static int measure(const char *what, int runs) {
    if (runs < 1) runs = 1;
    int64_t *us = calloc((size_t)runs, sizeof *us);
    for (int i = 0; i < runs; i++) {
        setup(NULL);
        if (!strcmp(what, "kill")) {
            kill_result r;
            scenario_kill(2, -1, &r);
            us[i] = r.detect_us;
        } else {
            hang_result r;
            scenario_hang(&r, false);
            us[i] = r.detect_us;
        }
        teardown(NULL);
        printf("run %d: %.2f ms\n", i + 1, (double)us[i] / 1000);
        fflush(stdout);
    }
    for (int i = 0; i < runs; i++) /* insertion sort: a handful of values */
        for (int j = i; j > 0 && us[j] < us[j - 1]; j--) {
            int64_t t = us[j];
            us[j] = us[j - 1];
            us[j - 1] = t;
        }
    printf("median %.2f ms, min %.2f ms, max %.2f ms\n", (double)us[runs / 2] / 1000,
           (double)us[0] / 1000, (double)us[runs - 1] / 1000);
    free(us);
    return 0;
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0) self_exe[n] = '\0';
    if (argc >= 3 && !strcmp(argv[1], "--rank")) return rank_main(argv[2]);
    srand((unsigned)getpid());
    if (argc >= 3 && !strcmp(argv[1], "--measure")) {
        if (strcmp(argv[2], "kill") && strcmp(argv[2], "hang")) {
            fprintf(stderr, "usage: test_faults --measure kill|hang [RUNS [auto|tcp|shm]]\n");
            return 2;
        }
        static char transport[48];
        if (argc >= 5) {
            snprintf(transport, sizeof transport, "COLLIE_CPU_TRANSPORT=%s", argv[4]);
            kill_transport = transport;
        }
        return measure(argv[2], argc >= 4 ? atoi(argv[3]) : 5);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_blocking_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_from_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_from_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_dies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_cycles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_generation_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_rank2_recover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_rank2_stalled_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_rank2_recover_tcp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_rank2_during_single_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_rank0_recover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_deep_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_deep_queue_tcp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_deep_queue_policy_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_lost_policy_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_lost_policy_none_auto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_deep_queue_blocking_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hang_desync_report, setup, teardown),
        cmocka_unit_test_setup_teardown(test_desync_names_refused_post, setup, teardown),
        cmocka_unit_test_setup_teardown(test_network_cut, setup, teardown_netns),
        cmocka_unit_test_setup_teardown(test_recovery_example, setup, teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
