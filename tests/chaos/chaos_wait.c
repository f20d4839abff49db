/*
 * chaos_wait.c — works in flight and the waiting styles of the chaos rank
 * (chaos_wait.h).
 *
 * Design notes
 *  - The set is an array in post order; reaped entries are set to NULL and
 *    squeezed out at the end of each pass (order kept: "oldest" is v[0]).
 *  - A cq work's tag is its record's address; collie_cq_pop hands back a
 *    reference of its own, released at once (the poster's reference is
 *    released when the record is freed).
 *  - wait_any gets at most CH_ANY_MAX of the oldest wait_any works, and the
 *    entries it returned are set to NULL in the array it is given again
 *    (collie.h: NULL entries are skipped) - that path is exercised too.
 *  - A callback only counts its runs (release store); the record stays
 *    valid until the reaper has seen that count, after which the callback
 *    no longer touches it. The stall fault's callback first sleeps
 *    (rec->stall_ms): callbacks run on the progress thread, which holds the
 *    loop's role meanwhile, so no helper reads for it either; the engine's
 *    stall monitor may log it.
 */
#include "tests/chaos/chaos_wait.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CH_ANY_MAX 256

int64_t ch_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
}

/* ---- the pause clock ----------------------------------------------------- */

#define PAUSES 4096
static pthread_mutex_t pause_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t pause_from[PAUSES], pause_to[PAUSES];
static size_t pause_n;
static atomic_bool pause_stop;
static pthread_t pause_thread;
static bool pause_running;

static void *pause_main(void *arg) {
    (void)arg;
    int64_t last = ch_now_ns();
    while (!atomic_load(&pause_stop)) {
        sleep_ns(10 * 1000000);
        int64_t now = ch_now_ns();
        if (now - last > 250 * 1000000ll) {
            pthread_mutex_lock(&pause_mu);
            pause_from[pause_n % PAUSES] = last;
            pause_to[pause_n % PAUSES] = now;
            pause_n++;
            pthread_mutex_unlock(&pause_mu);
        }
        last = now;
    }
    return NULL;
}

void ch_pause_clock_start(void) {
    atomic_store(&pause_stop, false);
    pause_running = pthread_create(&pause_thread, NULL, pause_main, NULL) == 0;
}

void ch_pause_clock_stop(void) {
    if (!pause_running) return;
    atomic_store(&pause_stop, true);
    pthread_join(pause_thread, NULL);
    pause_running = false;
}

int64_t ch_paused_ns(int64_t from, int64_t to) {
    int64_t sum = 0;
    pthread_mutex_lock(&pause_mu);
    size_t lo = pause_n > PAUSES ? pause_n - PAUSES : 0;
    for (size_t i = lo; i < pause_n; i++) {
        int64_t a = pause_from[i % PAUSES], b = pause_to[i % PAUSES];
        if (a < from) a = from;
        if (b > to) b = to;
        if (b > a) sum += b - a;
    }
    pthread_mutex_unlock(&pause_mu);
    return sum;
}

/* ---- callbacks ------------------------------------------------------------ */

static atomic_int cb_abort_countdown = -1;
static atomic_int cb_abort_fired;

void ch_cb_arm_abort(int after) { atomic_store(&cb_abort_countdown, after); }
int ch_cb_abort_fired(void) { return atomic_exchange(&cb_abort_fired, 0); }

static void work_cb(collie_work *w, void *arg) {
    ch_work *rec = arg;
    (void)w;
    if (rec->stall_ms > 0) /* the stall fault: the progress thread falls behind */
        sleep_ns((int64_t)rec->stall_ms * 1000000);
    int left = atomic_load(&cb_abort_countdown);
    while (left > 0 && !atomic_compare_exchange_weak(&cb_abort_countdown, &left, left - 1)) {
    }
    if (left == 1) {
        collie_comm_abort(rec->comm, "chaos: abort from a completion callback");
        atomic_store(&cb_abort_fired, 1);
    }
    atomic_fetch_add_explicit(&rec->cb_runs, 1, memory_order_release); /* last touch */
}

void ch_style_opts(ch_work *rec, collie_cq *cq, collie_post_opts *o) {
    collie_post_opts d = COLLIE_POST_OPTS_INIT;
    *o = d;
    o->timeout_ms = rec->deadline_ms;
    o->tag = (uint64_t)(uintptr_t)rec;
    if (rec->style == CH_W_CB) {
        o->cb = work_cb;
        o->cb_arg = rec;
    } else if (rec->style == CH_W_CQ) {
        o->cq = cq;
    }
}

/* ---- the set -------------------------------------------------------------- */

void ch_inflight_init(ch_inflight *f, collie_cq *cq, ch_report *rep, int32_t slack_ms) {
    memset(f, 0, sizeof *f);
    f->cq = cq;
    f->rep = rep;
    f->slack_ms = slack_ms;
}

void ch_inflight_fini(ch_inflight *f) {
    free(f->v);
    f->v = NULL;
    f->n = f->cap = 0;
}

void ch_inflight_add(ch_inflight *f, ch_work *rec) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 256;
        ch_work **v = realloc(f->v, cap * sizeof *v);
        if (!v) abort();
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = rec;
}

static void squeeze(ch_inflight *f) {
    size_t j = 0;
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i]) f->v[j++] = f->v[i];
    f->n = j;
}

/* the work is done and seen: hand it over */
static void finish(ch_inflight *f, size_t i, int seen_status, ch_done_fn done, void *arg) {
    ch_work *rec = f->v[i];
    f->v[i] = NULL;
    rec->status = collie_work_result(rec->w);
    if (rec->status == COLLIE_INPROGRESS)
        ch_violation(f->rep, "bad_status", rec->round, rec->op.slot,
                     "op=%s style=%s: the work was seen done but collie_work_result says "
                     "COLLIE_INPROGRESS",
                     ch_kind_name(rec->op.kind), ch_style_name(rec->style));
    else if (seen_status != COLLIE_INPROGRESS && seen_status != rec->status)
        ch_violation(f->rep, "bad_status", rec->round, rec->op.slot,
                     "op=%s style=%s: the wait returned %s, collie_work_result says %s",
                     ch_kind_name(rec->op.kind), ch_style_name(rec->style),
                     collie_status_name(seen_status), collie_status_name(rec->status));
    if (rec->style == CH_W_CB) {
        int runs = atomic_load_explicit(&rec->cb_runs, memory_order_acquire);
        if (runs != 1)
            ch_violation(f->rep, "bad_status", rec->round, rec->op.slot,
                         "op=%s: the completion callback ran %d times", ch_kind_name(rec->op.kind),
                         runs);
    }
    done(rec, arg);
}

static size_t find(ch_inflight *f, const ch_work *rec) {
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i] == rec) return i;
    return (size_t)-1;
}

static size_t pop_cq(ch_inflight *f, int32_t timeout_ms, ch_done_fn done, void *arg) {
    size_t got = 0;
    if (!f->cq) return 0;
    for (;;) {
        collie_work *w = NULL;
        int rc = collie_cq_pop(f->cq, got ? 0 : timeout_ms, &w);
        if (rc != COLLIE_OK || !w) break;
        ch_work *rec = (ch_work *)(uintptr_t)collie_work_tag(w);
        size_t i = find(f, rec);
        collie_work_release(w);        /* the queue's reference */
        if (i == (size_t)-1) continue; /* abandoned earlier */
        finish(f, i, COLLIE_INPROGRESS, done, arg);
        got++;
    }
    return got;
}

static size_t any_pass(ch_inflight *f, int32_t timeout_ms, ch_done_fn done, void *arg) {
    collie_work *ws[CH_ANY_MAX];
    size_t ix[CH_ANY_MAX], k = 0, got = 0;
    for (size_t i = 0; i < f->n && k < CH_ANY_MAX; i++)
        if (f->v[i] && f->v[i]->style == CH_W_ANY) {
            ws[k] = f->v[i]->w;
            ix[k++] = i;
        }
    if (!k) return 0;
    for (size_t live = k; live > 0; live--) {
        size_t idx = k;
        int rc = collie_work_wait_any(ws, k, got ? 0 : timeout_ms, &idx);
        if (rc == COLLIE_INPROGRESS) {
            if (idx != k)
                ch_violation(f->rep, "bad_status", -1, -1,
                             "collie_work_wait_any gave up but set *idx = %zu (n = %zu)", idx, k);
            break;
        }
        if (idx >= k || !ws[idx]) {
            ch_violation(f->rep, "bad_status", -1, -1,
                         "collie_work_wait_any returned %s with *idx = %zu (n = %zu)",
                         collie_status_name(rc), idx, k);
            break;
        }
        ws[idx] = NULL;
        finish(f, ix[idx], rc, done, arg);
        got++;
    }
    return got;
}

/* the non-blocking pass over every style */
static size_t pass(ch_inflight *f, ch_done_fn done, void *arg) {
    size_t got = pop_cq(f, 0, done, arg);
    for (size_t i = 0; i < f->n; i++) {
        ch_work *rec = f->v[i];
        if (!rec) continue;
        switch (rec->style) {
        case CH_W_TEST:
            if (collie_work_test(rec->w)) {
                finish(f, i, COLLIE_INPROGRESS, done, arg);
                got++;
            }
            break;
        case CH_W_WAIT: {
            int rc = collie_work_wait(rec->w, 0);
            if (rc != COLLIE_INPROGRESS) {
                finish(f, i, rc, done, arg);
                got++;
            }
            break;
        }
        case CH_W_CB:
            if (atomic_load_explicit(&rec->cb_runs, memory_order_acquire) > 0) {
                finish(f, i, COLLIE_INPROGRESS, done, arg);
                got++;
            }
            break;
        default: break;
        }
    }
    got += any_pass(f, 0, done, arg);
    squeeze(f);
    return got;
}

/* the watchdog's promise, for the works still pending */
static void hang_check(ch_inflight *f) {
    int64_t now = ch_now_ns();
    for (size_t i = 0; i < f->n; i++) {
        ch_work *rec = f->v[i];
        if (!rec) continue;
        int64_t bound = (int64_t)rec->deadline_ms + CH_GRACE_MS + f->slack_ms + CH_HANG_MS;
        int64_t age = now - rec->post_ns - ch_paused_ns(rec->post_ns, now);
        if (age <= bound * 1000000) continue;
        if (collie_work_test(rec->w) && rec->style != CH_W_CB && rec->style != CH_W_CQ) continue;
        collie_work_details d = {0};
        collie_work_info(rec->w, &d);
        ch_violation(f->rep, "hang", rec->round, rec->op.slot,
                     "op=%s style=%s comm=%d: not seen done %lld ms after its post (deadline %d "
                     "ms, grace %d, slack %d; this process was stopped %lld ms of it); "
                     "collie_work_result says %s%s",
                     ch_kind_name(rec->op.kind), ch_style_name(rec->style), rec->op.comm,
                     (long long)((now - rec->post_ns) / 1000000), rec->deadline_ms, CH_GRACE_MS,
                     f->slack_ms, (long long)(ch_paused_ns(rec->post_ns, now) / 1000000),
                     collie_status_name(collie_work_result(rec->w)),
                     rec->style == CH_W_CB   ? " (its callback never ran)"
                     : rec->style == CH_W_CQ ? " (never came out of the completion queue)"
                                             : "");
        rec->abandoned = true; /* never freed: the library may still write its buffers */
        f->v[i] = NULL;
        f->hangs++;
    }
    squeeze(f);
}

static size_t block_on(ch_inflight *f, int block_ms, ch_done_fn done, void *arg) {
    ch_work *old = f->v[0];
    int64_t until = ch_now_ns() + (int64_t)block_ms * 1000000;
    switch (old->style) {
    case CH_W_TEST:
        while (!collie_work_test(old->w) && ch_now_ns() < until)
            f->rotor++ % 2 ? sched_yield() : (sleep_ns(100000), 0);
        break;
    case CH_W_WAIT: collie_work_wait(old->w, block_ms); break;
    case CH_W_ANY: return any_pass(f, block_ms, done, arg);
    case CH_W_CQ:
        if (f->rotor++ % 2) {
            struct pollfd p = {.fd = collie_cq_fd(f->cq), .events = POLLIN};
            poll(&p, 1, block_ms);
            return 0;
        }
        return pop_cq(f, block_ms, done, arg);
    case CH_W_CB:
        while (atomic_load_explicit(&old->cb_runs, memory_order_acquire) == 0 &&
               ch_now_ns() < until)
            sleep_ns(200000);
        break;
    default: break;
    }
    return 0;
}

size_t ch_reap(ch_inflight *f, int block_ms, ch_done_fn done, void *arg) {
    size_t got = pass(f, done, arg);
    if (!got && block_ms > 0 && f->n > 0) {
        got += block_on(f, block_ms, done, arg);
        squeeze(f);
        got += pass(f, done, arg);
    }
    hang_check(f);
    return got;
}
