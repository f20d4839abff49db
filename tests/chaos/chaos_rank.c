/*
 * chaos_rank.c — one rank of the chaos harness (issue 29): a seeded random
 * program of collectives, v collectives and point-to-point messages on the
 * world and on subgroups, with rank-side faults, checked by an oracle.
 * The driver (tests/chaos/chaos.py) starts it under collie-run, adds the
 * process and link faults and reads the report. The contract between the
 * two (arguments, report lines, exit codes, the round-end protocol) is
 * docs/chaos.md's; the report's line format is chaos_report.h's.
 *
 *   chaos_rank --seed S --report DIR [--rounds R] [--ops K] [--inflight-max M]
 *              [--faults abort,destroy,cancel,deadline,stall,signals,disagree,
 *                        shrink,grow|all|none]
 *              [--join ID --world N]   (an elastic run's replacement)
 *
 * (`all` is the first seven; shrink and grow make an elastic run:
 * chaos_elastic.c.)
 *
 * Design notes
 *  - Round r: (a hasty create first in some rounds: hasty_create) create
 *    the world comm under a name of its own
 *    ("chaos<seed>r<r>": a fresh namespace, so re-creation after a fault is
 *    exercised by every round that follows one), maybe split it and build
 *    a new_group, post the round's slots through a window of works in
 *    flight, drain, destroy, then the round-end protocol: set
 *    chaos/<seed>/r<r>/end/<rank> and wait (CHAOS_ROUND_WAIT_MS) for every
 *    rank's key. A rank missing there (killed) ends the run: `end
 *    reason=peer_gone`, exit 0.
 *  - A fault ends the round for this rank: a failed work that is not the
 *    cancel or deadline of a receive no message matched (docs/api.md, "Cancel
 *    and deadlines on a comm": the comm stays healthy then; this rank asks
 *    collie_comm_error), a refused post, or a fault this rank injected. It
 *    stops posting, drains what is in flight (the oracle still checks every
 *    work that ends OK), destroys and goes on with the next round.
 *  - Rank-side faults (one per round at most, chaos_prog.c): abort from the
 *    main thread, from a thread of its own at a random moment, or from a
 *    completion callback (the progress thread); destroy of a comm with
 *    works in flight; cancel of an in-flight collective; a short deadline.
 *    Receives are also cancelled at random (no fault unless matched).
 *    `signals` is no fault but a condition: in about one round in three an
 *    interval timer sends this rank SIGALRM every 20..200 us, and nothing
 *    may fail for it (everything must go on through EINTR).
 *  - The stall fault (a burst of three slots on a pair's comm, planned in
 *    chaos_prog.h): the victim's progress thread blocks 50..500 ms in a
 *    barrier's completion callback while the sender lends it a large send
 *    that ends early (deadline, cancel or abort of the pair's comm) and
 *    posts an allreduce behind it; the victim reads both only afterwards,
 *    and the oracle judges its allreduce as any other. Both start the
 *    burst with nothing in flight; the sender waits for its barrier and a
 *    few ms (stall_pre_ms) before its send, so the victim is stalled by
 *    then. With main's 59b5a0d reverted, 36 runs of 40 (4 ranks, seeds
 *    1-40) reported its wrong OK; with it, none. A stall round has no
 *    other comm-level fault.
 *  - The abort during the subgroups (chaos_prog.h abort_subgroups): the
 *    thread abort of the world starts before make_subgroups; each split and
 *    new_group is timed, the aborter stamps when it fired (fired_ns), and a
 *    call of this rank that returns more than CH_ABORT_BOUND_MS after it is
 *    slow_after_abort (the driver holds the other ranks' to fired_us).
 *  - The disagree fault (chaos_prog.h): one member calls new_group with
 *    another list than its peers; every rank knows it from the plan, and
 *    no member may get a comm from it (disagreement_accepted).
 *  - The oracle (chaos_ops.c, chaos_oracle.c, chaos_wait.c): every OK work
 *    holds exactly the reference bytes; every work ends within its deadline
 *    + CH_GRACE_MS + CHAOS_SLACK_MS (less the time this process was
 *    stopped); every failed work has an error status the contract allows
 *    and a message (COLLIE_ETIMEDOUT not before the work's own deadline, nor
 *    a create's before its create_timeout_ms); work lines carry post_us/end_us
 *    (CLOCK_MONOTONIC) for the driver's cross-rank checks;
 *    after the last destroy and the engine's, no fd, thread
 *    or heap growth over the point before the engine was created
 *    (mallinfo2 uordblks within CHAOS_MEM_TOLERANCE bytes, default 1 MiB:
 *    libcrypto and libevent keep one-time global state).
 *  - Failure as data: every failed work's line and every comm's comm_end
 *    line (before its destroy: when this rank left it) carry the fault's
 *    data in world ranks (fault_fields); the driver judges the sets and
 *    kinds (chaos_faults.py). A failed work or comm without its data is
 *    bad_fault here.
 *  - Exit status: 0 when the contract held, 3 if this rank found a
 *    violation, 2 on a usage error.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "collie.h"
#include "tests/chaos/chaos_ops.h"
#include "tests/chaos/chaos_prog.h"
#include "tests/chaos/chaos_rank.h"
#include "tests/chaos/chaos_report.h"
#include "tests/chaos/chaos_wait.h"

#define CH_BYTES_BUDGET (48u << 20) /* bytes of buffers in flight per rank */

static void usage(const char *why) {
    fprintf(
        stderr,
        "chaos_rank: %s\n"
        "usage: chaos_rank --seed S --report DIR [--rounds R] [--ops K] [--inflight-max M]"
        " [--faults abort,destroy,cancel,deadline,stall,signals,disagree,shrink,grow|all|none]\n"
        "       [--join ID --world N] (an elastic run's replacement: joins as world id ID)\n"
        "(rank and world size from COLLIE_RANK / COLLIE_WORLD_SIZE, as collie-run sets)\n",
        why);
    exit(2);
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

static int env_int(const char *name, int def, int lo, int hi) {
    const char *s = getenv(name);
    uint64_t v;
    if (!s || !*s) return def;
    if (!parse_u64(s, &v) || v < (uint64_t)lo || v > (uint64_t)hi) {
        fprintf(stderr, "chaos_rank: %s='%s' is not an integer in [%d, %d]\n", name, s, lo, hi);
        exit(2);
    }
    return (int)v;
}

static int parse_faults(const char *s) {
    int f = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) usage("--faults: too long");
    strcpy(buf, s);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "abort"))
            f |= CH_F_ABORT;
        else if (!strcmp(t, "destroy"))
            f |= CH_F_DESTROY;
        else if (!strcmp(t, "cancel"))
            f |= CH_F_CANCEL;
        else if (!strcmp(t, "deadline"))
            f |= CH_F_DEADLINE;
        else if (!strcmp(t, "stall"))
            f |= CH_F_STALL;
        else if (!strcmp(t, "signals"))
            f |= CH_F_SIGNALS;
        else if (!strcmp(t, "disagree"))
            f |= CH_F_DISAGREE;
        else if (!strcmp(t, "shrink"))
            f |= CH_F_SHRINK;
        else if (!strcmp(t, "grow"))
            f |= CH_F_GROW;
        else if (!strcmp(t, "none"))
            ;
        else if (!strcmp(t, "all"))
            f |= CH_F_ALL;
        else {
            char m[300];
            snprintf(m, sizeof m,
                     "--faults: unknown fault kind '%s' (abort, destroy, cancel, "
                     "deadline, stall, signals, disagree, shrink, grow, all, none)",
                     t);
            usage(m);
        }
    }
    return f;
}

/* ---- leak measures ---------------------------------------------------------- */

static long count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    long n = 0;
    for (struct dirent *de; (de = readdir(d));)
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

typedef struct ch_measure {
    long fds, threads;
    int64_t heap;
} ch_measure;

static ch_measure measure(void) {
    ch_measure m;
    m.fds = count_dir("/proc/self/fd");
    m.threads = count_dir("/proc/self/task");
    struct mallinfo2 mi = mallinfo2();
    m.heap = (int64_t)mi.uordblks;
    return m;
}

/* ---- the abort thread ------------------------------------------------------- */

static void *aborter_main(void *arg) {
    ch_aborter *a = arg;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += a->delay_ms / 1000;
    until.tv_nsec += (long)(a->delay_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&a->mu);
    int rc = 0;
    while (!a->stop && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&a->cv, &a->mu, &until);
    bool go = !a->stop;
    pthread_mutex_unlock(&a->mu);
    if (go) {
        atomic_store(&a->fired_ns, ch_now_ns());
        collie_comm_abort(a->c, "chaos: abort from a thread of the application");
    }
    return NULL;
}

static void aborter_start(ch_aborter *a, collie_comm *c, int delay_ms) {
    memset(a, 0, sizeof *a);
    atomic_init(&a->fired_ns, 0);
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    a->c = c;
    a->delay_ms = delay_ms;
    a->running = pthread_create(&a->t, NULL, aborter_main, a) == 0;
}

/* stop it (if it has not fired) and join it: after this, a->c may go.
 * When it fired: its fired_ns, else 0. */
static int64_t aborter_stop(ch_aborter *a) {
    if (!a->running) return 0;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->t, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    a->running = false;
    return atomic_load(&a->fired_ns);
}

/* ---- failure as data ---------------------------------------------------------
 * Every failed work and every failed comm writes its fault's data
 * (collie_work_fault, collie_comm_fault) into its report line as world
 * ranks: " fkind=peer_dead fview=0 forigin=2 franks=3,5" ("-": the empty
 * set; "+N": N more than the struct lists). The driver holds it to what it
 * did (chaos_run.py, check_faults). */

/* a comm rank of comm `cid` of this round as a world rank (-1 stays) */
static int world_rank(const ch_run *run, int cid, int r) {
    const ch_comm_info *ci = &run->plan.comms[cid];
    return r >= 0 && r < ci->size ? ci->members[r] : r;
}

static void fault_fields(const ch_run *run, int cid, const collie_fault *f, char *buf, size_t len) {
    size_t at = (size_t)snprintf(
        buf, len, " fkind=%s fview=%d forigin=%d franks=", collie_fault_kind_name(f->kind), f->view,
        world_rank(run, cid, f->origin));
    int n = f->nranks < COLLIE_FAULT_RANKS ? f->nranks : COLLIE_FAULT_RANKS;
    if (n == 0 && at < len) at += (size_t)snprintf(buf + at, len - at, "-");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? "," : "",
                               world_rank(run, cid, f->ranks[i]));
    if (f->nranks > n && at < len) snprintf(buf + at, len - at, "+%d", f->nranks - n);
}

/* the fault fields of a failed work; a work without its data is a violation */
static void work_fault_fields(ch_run *run, const ch_work *rec, char *buf, size_t len) {
    collie_fault f = COLLIE_FAULT_INIT;
    int rc = collie_work_fault(rec->w, &f);
    buf[0] = '\0';
    if (rc != COLLIE_OK || f.status != rec->status || f.kind <= COLLIE_FAULT_NONE ||
        f.kind >= COLLIE_FAULT_NUM_KINDS) {
        ch_violation(&run->rep, "bad_fault", rec->round, rec->op.slot,
                     "op=%s status=%s: collie_work_fault returned %s, status %s, kind %d",
                     ch_kind_name(rec->op.kind), collie_status_name(rec->status),
                     collie_status_name(rc), collie_status_name(f.status), f.kind);
        return;
    }
    fault_fields(run, rec->op.comm, &f, buf, len);
}

/* A comm about to be destroyed: its fault (if it failed) and when it left
 * (destroy_us: a peer that names this rank "left" must come after it). */
void ch_comm_end_line(ch_run *run, int cid, collie_comm *c, int64_t t0) {
    collie_fault f = COLLIE_FAULT_INIT;
    int rc = collie_comm_fault(c, &f);
    char ff[512] = "";
    int st = COLLIE_OK;
    collie_comm_error(c, &st, NULL);
    if (rc != COLLIE_OK || f.status != st)
        ch_violation(&run->rep, "bad_fault", run->plan.round, -1,
                     "comm %d: collie_comm_fault returned %s, status %s (collie_comm_error: %s)",
                     cid, collie_status_name(rc), collie_status_name(f.status),
                     collie_status_name(st));
    else if (st != COLLIE_OK && (f.kind <= COLLIE_FAULT_NONE || f.kind >= COLLIE_FAULT_NUM_KINDS))
        ch_violation(&run->rep, "bad_fault", run->plan.round, -1,
                     "comm %d failed (%s) with fault kind %d", cid, collie_status_name(st), f.kind);
    else if (st != COLLIE_OK)
        fault_fields(run, cid, &f, ff, sizeof ff);
    ch_report_line(&run->rep, NULL, "comm_end r=%d comm=%d status=%s destroy_us=%lld%s",
                   run->plan.round, cid, collie_status_name(st), (long long)(t0 / 1000), ff);
}

/* ---- works ------------------------------------------------------------------ */

/* ENOTMEMBER: in an elastic run, the works of a rank the others left out */
static bool allowed_error(const ch_run *run, int st) {
    return st == COLLIE_ETIMEDOUT || st == COLLIE_ECANCELED || st == COLLIE_EABORTED ||
           st == COLLIE_EPEER || st == COLLIE_ECLOSED || (run->elastic && st == COLLIE_ENOTMEMBER);
}

/* is the comm of this work still healthy? (a destroyed one is not) */
static bool comm_healthy(ch_run *run, int comm) {
    collie_comm *c = run->comms[comm];
    if (!c) return false;
    int st = COLLIE_OK;
    collie_comm_error(c, &st, NULL);
    return st == COLLIE_OK;
}

static void on_done(ch_work *rec, void *arg) {
    ch_run *run = arg;
    ch_report *rep = &run->rep;
    collie_work_details d = {0};
    collie_work_info(rec->w, &d);
    int64_t seen = ch_now_ns();
    int64_t end = d.end_ns ? d.end_ns : seen;
    int64_t took = end - rec->post_ns;
    if (end < rec->post_ns || end > seen) /* the library's stamp is what the bound is held to */
        ch_violation(rep, "end_stamp", rec->round, rec->op.slot,
                     "op=%s comm=%d status=%s: end stamp %lld ns after the post, outside [post, "
                     "seen done at %lld ns]",
                     ch_kind_name(rec->op.kind), rec->op.comm, collie_status_name(rec->status),
                     (long long)took, (long long)(seen - rec->post_ns));
    int64_t stopped = ch_paused_ns(rec->post_ns, end);
    int64_t bound = (int64_t)rec->deadline_ms + CH_GRACE_MS + run->slack_ms;
    if (took - stopped > bound * 1000000)
        ch_violation(rep, "past_deadline", rec->round, rec->op.slot,
                     "op=%s comm=%d style=%s status=%s: ended %lld ms after its post, deadline "
                     "%d ms + grace %d + slack %d (this process was stopped %lld ms of it)",
                     ch_kind_name(rec->op.kind), rec->op.comm, ch_style_name(rec->style),
                     collie_status_name(rec->status), (long long)(took / 1000000), rec->deadline_ms,
                     CH_GRACE_MS, run->slack_ms, (long long)(stopped / 1000000));
    uint64_t checked = 0;
    const char *msg = "";
    char ff[512] = "";
    rep->works++;
    if (rec->status == COLLIE_OK) {
        rep->ok++;
        checked = ch_work_check(rec, rep);
        rep->bytes_checked += checked;
        /* A receive's cancel from outside the loop is a request the loop
         * decides (docs/api.md, "Cancel and deadlines on a comm"): one whose
         * message completed before that turn ends OK, its bytes checked
         * above. Anything else cancelled must not end OK. */
        if (rec->cancelled && rec->role != CH_ROLE_RECV)
            ch_violation(rep, "bad_status", rec->round, rec->op.slot,
                         "op=%s: collie_work_cancel returned COLLIE_OK (it cancelled the work) "
                         "but the work ended COLLIE_OK",
                         ch_kind_name(rec->op.kind));
    } else {
        rep->failed++;
        msg = collie_work_error_message(rec->w);
        work_fault_fields(run, rec, ff, sizeof ff);
        if (!msg || !*msg)
            ch_violation(rep, "no_message", rec->round, rec->op.slot,
                         "op=%s status=%s: a failed work with an empty message",
                         ch_kind_name(rec->op.kind), collie_status_name(rec->status));
        if (!allowed_error(run, rec->status))
            ch_violation(rep, "bad_status", rec->round, rec->op.slot,
                         "op=%s: status %s is not one a fault of this program can give: %s",
                         ch_kind_name(rec->op.kind), collie_status_name(rec->status), msg);
        else if (rec->status == COLLIE_ETIMEDOUT && took < (int64_t)rec->deadline_ms * 1000000)
            /* a work times out by its own deadline only (a comm's fault
             * ends the others EABORTED): never before it */
            ch_violation(rep, "early_timeout", rec->round, rec->op.slot,
                         "op=%s comm=%d style=%s: COLLIE_ETIMEDOUT %lld ms after its post, before "
                         "its deadline of %d ms: %s",
                         ch_kind_name(rec->op.kind), rec->op.comm, ch_style_name(rec->style),
                         (long long)(took / 1000000), rec->deadline_ms, msg);
        else if (rec->status == COLLIE_ECANCELED && !rec->cancelled)
            ch_violation(rep, "bad_status", rec->round, rec->op.slot,
                         "op=%s: COLLIE_ECANCELED but this rank never cancelled it: %s",
                         ch_kind_name(rec->op.kind), msg);
        bool recv_own_end = rec->role == CH_ROLE_RECV &&
                            (rec->status == COLLIE_ECANCELED || rec->status == COLLIE_ETIMEDOUT);
        if (!recv_own_end || !comm_healthy(run, rec->op.comm)) run->faulted = true;
        if (rec->grp) ch_group_note(rec);
    }
    if (rec->grp && rec->status == COLLIE_OK) ch_group_note(rec);
    if (rec->grp && rec->grp->reaped == rec->grp->nrecv)
        ch_group_finish(rec->grp, rep, rec->round, rec->op.slot);
    ch_report_line(rep, msg,
                   "work r=%d seq=%d op=%s bytes=%" PRIu64 " status=%s ms=%lld deadline_ms=%d "
                   "checked=%" PRIu64 " comm=%d style=%s dtype=%s redop=%s count=%zu role=%d "
                   "post_us=%lld end_us=%lld%s%s",
                   rec->round, rec->op.slot,
                   rec->role == CH_ROLE_COLL        ? ch_kind_name(rec->op.kind)
                   : rec->role == CH_ROLE_SEND      ? "send"
                   : rec->peer == COLLIE_ANY_SOURCE ? "recv_any"
                                                    : "recv",
                   rec->bytes, collie_status_name(rec->status), (long long)(took / 1000000),
                   rec->deadline_ms, checked, rec->op.comm, ch_style_name(rec->style),
                   collie_dtype_name(rec->op.dt), collie_redop_name(rec->op.op), rec->op.count,
                   rec->role, (long long)(rec->post_ns / 1000), (long long)(end / 1000),
                   rec->cancelled ? " cancelled=1" : "", ff);
    run->bytes_in_flight -= rec->bytes;
    ch_work_guards(rec, rep);
    ch_work_free(rec);
    collie_work_release(rec->w);
    free(rec);
}

/* the works of one slot on this rank */
typedef struct slot_work {
    int role, peer;
    uint64_t stream;
} slot_work;

static int slot_works(const ch_op *op, int me, int n, slot_work *out, int cap) {
    int k = 0;
    (void)n;
    switch (op->kind) {
    case CH_SENDRECV:
        if (me == op->root) {
            out[k++] = (slot_work){CH_ROLE_SEND, op->peer, 0};
            if (op->bidir) out[k++] = (slot_work){CH_ROLE_RECV, op->peer, 1};
        } else if (me == op->peer) {
            out[k++] = (slot_work){CH_ROLE_RECV, op->root, 0};
            if (op->bidir) out[k++] = (slot_work){CH_ROLE_SEND, op->root, 1};
        }
        break;
    case CH_ANYSRC:
        if ((op->senders >> me) & 1)
            for (int m = 0; m < op->msgs && k < cap; m++)
                out[k++] = (slot_work){CH_ROLE_SEND, op->peer, (uint64_t)m};
        if (me == op->peer)
            for (int r = 0; r < n; r++)
                if ((op->senders >> r) & 1)
                    for (int m = 0; m < op->msgs && k < cap; m++)
                        out[k++] = (slot_work){CH_ROLE_RECV, COLLIE_ANY_SOURCE, 0};
        break;
    default: out[k++] = (slot_work){CH_ROLE_COLL, -1, 0}; break;
    }
    return k;
}

/* cancel one work: OK marks it cancelled, ESTATE (it has completed) is
 * fine, anything else is a violation */
static void cancel_work(ch_run *run, ch_work *rec) {
    int rc = collie_work_cancel(rec->w);
    if (rc == COLLIE_OK)
        rec->cancelled = true;
    else if (rc != COLLIE_ESTATE)
        ch_violation(&run->rep, "bad_status", rec->round, rec->op.slot,
                     "collie_work_cancel returned %s (COLLIE_OK or COLLIE_ESTATE expected)",
                     collie_status_name(rc));
}

/* cancel the works whose planned cancel is due */
static void due_cancels(ch_run *run) {
    for (size_t i = 0; i < run->fl.n; i++) {
        ch_work *rec = run->fl.v[i];
        if (!rec || !rec->cancel_planned || rec->cancelled) continue;
        if (rec->cancel_after-- > 0) continue;
        rec->cancel_planned = false;
        cancel_work(run, rec);
    }
}

static void post_slot(ch_run *run, const ch_op *op) {
    const ch_round *p = &run->plan;
    const ch_comm_info *ci = &p->comms[op->comm];
    collie_comm *c = run->comms[op->comm];
    if (ci->me < 0 || !c) return;
    slot_work sw[3 * CH_MAX_RANKS + 4];
    int nw = slot_works(op, ci->me, ci->size, sw, (int)(sizeof sw / sizeof sw[0]));
    if (!nw) return;
    size_t es = collie_dtype_size(op->dt);
    uint64_t est = (uint64_t)op->count * es * (uint64_t)ci->size * 3;
    /* the window and the byte budget (never blocks with nothing in flight) */
    while (run->fl.n > 0 && !run->faulted &&
           (run->fl.n + (size_t)nw > (size_t)p->window ||
            run->bytes_in_flight + est > CH_BYTES_BUDGET))
        ch_reap(&run->fl, 50, on_done, run);
    if (run->faulted) return;
    ch_anygroup *grp = NULL;
    int nrecv = 0;
    if (op->kind == CH_ANYSRC && ci->me == op->peer) {
        for (int i = 0; i < nw; i++)
            nrecv += sw[i].role == CH_ROLE_RECV;
        grp = calloc(1, sizeof *grp);
        grp->nrecv = nrecv;
        grp->msgs = op->msgs;
        grp->src = calloc((size_t)nrecv, sizeof(int));
        grp->status = calloc((size_t)nrecv, sizeof(int));
        grp->k = calloc((size_t)nrecv, sizeof(int));
        if (!grp->src || !grp->status || !grp->k) abort();
    }
    int gi = 0;
    for (int i = 0; i < nw; i++) {
        ch_work *rec = calloc(1, sizeof *rec);
        if (!rec) abort();
        rec->op = *op;
        rec->round = p->round;
        rec->sub = i;
        rec->role = sw[i].role;
        rec->peer = sw[i].peer;
        rec->stream = sw[i].stream;
        rec->comm = c;
        rec->n = ci->size;
        rec->me = ci->me;
        rec->style = ch_pick_style(p, op->slot, i);
        if (!run->cq && rec->style == CH_W_CQ) rec->style = CH_W_WAIT;
        rec->deadline_ms = op->deadline_ms;
        int step = ch_stall_step(p, op->slot);
        int32_t short_ms = rec->role == CH_ROLE_RECV && step < 0
                               ? ch_pick_short_deadline(p, op->slot, i, run->faults)
                               : 0;
        if (p->fault == CH_F_DEADLINE && op->slot == p->fault_slot && i == 0)
            short_ms = 1 + (int32_t)(p->fault_delay_ms % 20);
        if (step == 0 && p->rank == p->stall_victim) { /* its progress falls behind */
            rec->style = CH_W_CB;
            rec->stall_ms = p->stall_ms;
        }
        if (step == 1 && rec->role == CH_ROLE_SEND && p->stall_end == CH_F_DEADLINE)
            short_ms = p->stall_end_ms;
        if (short_ms) rec->deadline_ms = short_ms;
        if (rec->role == CH_ROLE_RECV && step < 0 && ch_pick_cancel(p, op->slot, i, run->faults)) {
            rec->cancel_planned = true;
            rec->cancel_after = (int)(ch_hash(p->seed, (uint64_t)op->slot, (uint64_t)i, 7) % 4);
        }
        if (grp && rec->role == CH_ROLE_RECV) {
            rec->grp = grp;
            rec->grp_idx = gi++;
        }
        atomic_init(&rec->cb_runs, 0);
        collie_post_opts o;
        ch_style_opts(rec, run->cq, &o);
        rec->post_ns = ch_now_ns();
        int rc = ch_work_post(rec, &o);
        if (rc != COLLIE_OK) {
            const char *why = collie_last_error();
            if (comm_healthy(run, op->comm))
                ch_violation(&run->rep, "bad_status", p->round, op->slot,
                             "op=%s comm=%d: the post was refused (%s) on a healthy comm: %s",
                             ch_kind_name(op->kind), op->comm, collie_status_name(rc), why);
            ch_report_line(&run->rep, why,
                           "work r=%d seq=%d op=%s bytes=0 status=%s ms=0 "
                           "deadline_ms=%d checked=0 comm=%d refused=1 end_us=%lld",
                           p->round, op->slot, ch_kind_name(op->kind), collie_status_name(rc),
                           rec->deadline_ms, op->comm, (long long)(ch_now_ns() / 1000));
            run->faulted = true;
            ch_work_free(rec);
            if (grp) { /* the receives not posted never come */
                grp->nrecv = gi - (rec->grp ? 1 : 0);
                if (grp->reaped == grp->nrecv) ch_group_finish(grp, &run->rep, p->round, op->slot);
                grp = NULL;
            }
            free(rec);
            return;
        }
        run->bytes_in_flight += rec->bytes;
        run->posted++;
        ch_inflight_add(&run->fl, rec);
    }
}

/* to an absolute deadline: under a signal storm (every 20 us) a relative
 * nanosleep restarted with its remainder never ended (nanosleep(2): the
 * remainder drifts), and the split after it never came (seed 33) */
static void sleep_ms(int ms) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
    }
}

/* the works in flight end (each within its deadline's bound: ch_reap
 * abandons one that does not) */
static void drain(ch_run *run) {
    while (run->fl.n > 0) {
        due_cancels(run);
        ch_reap(&run->fl, 50, on_done, run);
    }
}

/* The stall burst, before slot op is posted (chaos_prog.h). Both ranks of
 * the pair start it with nothing in flight; the victim's barrier then
 * stalls its progress thread from its callback, while the sender waits
 * for its own barrier and a little more, so that what it sends next
 * reaches a victim that does not read. */
static void stall_before(ch_run *run, const ch_op *op) {
    const ch_round *p = &run->plan;
    int step = ch_stall_step(p, op->slot);
    if (step < 0 || !run->comms[p->stall_comm] || p->comms[p->stall_comm].me < 0) return;
    ch_report *rep = &run->rep;
    if (step == 0) {
        drain(run);
        if (p->rank == p->stall_victim) {
            ch_report_line(rep, NULL, "fault kind=stall r=%d seq=%d role=victim comm=%d ms=%d",
                           p->round, op->slot, p->stall_comm, p->stall_ms);
            rep->faults++;
        }
    } else if (step == 1 && p->rank == p->stall_sender) {
        drain(run); /* the barrier: the victim is in its callback now */
        sleep_ms(p->stall_pre_ms);
        ch_report_line(rep, NULL,
                       "fault kind=stall r=%d seq=%d role=sender comm=%d victim=%d end=%s "
                       "end_ms=%d",
                       p->round, op->slot, p->stall_comm, p->stall_victim,
                       p->stall_end == CH_F_CANCEL  ? "cancel"
                       : p->stall_end == CH_F_ABORT ? "abort"
                                                    : "deadline",
                       p->stall_end_ms);
        rep->faults++;
    }
}

/* The stall burst, after slot op was posted: the sender's send ends early
 * by a cancel or an abort of the pair's comm (its deadline needs nothing). */
static void stall_after(ch_run *run, const ch_op *op) {
    const ch_round *p = &run->plan;
    if (ch_stall_step(p, op->slot) != 2 || p->rank != p->stall_sender) return;
    collie_comm *c = run->comms[p->stall_comm];
    if (!c || p->stall_end == CH_F_DEADLINE) return;
    sleep_ms(p->stall_end_ms);
    if (p->stall_end == CH_F_ABORT) {
        collie_comm_abort(c, "chaos: abort during a peer's stall");
        run->faulted = true;
        return;
    }
    for (size_t i = 0; i < run->fl.n; i++) {
        ch_work *rec = run->fl.v[i];
        if (!rec || rec->role != CH_ROLE_SEND || rec->op.slot != p->stall_slot + 1) continue;
        cancel_work(run, rec);
    }
}

/* this rank's comm-level fault of the round, if its slot has come */
/* The deadline fault's probe: a receive on a tag no rank sends must end
 * COLLIE_ETIMEDOUT by its own deadline (not before, not past deadline +
 * grace + slack, by this rank's clock less the time it was stopped) and
 * write nothing. It is polled with collie_work_test, which enforces no
 * deadline itself, so a loop that lets deadlines slip shows (a waiter past
 * the deadline would end it from its own thread and hide that). Every
 * other work of the harness may end OK before its deadline; this one
 * cannot. An unmatched receive's deadline is no fault of its comm. */
static void deadline_probe(ch_run *run, collie_comm *c, int cid, int slot) {
    const ch_round *p = &run->plan;
    ch_report *rep = &run->rep;
    int ms = 20 + (int)(ch_hash(p->seed, (uint64_t)p->round, (uint64_t)p->rank, 0xd1) % 280);
    uint64_t tag = ((uint64_t)p->round << 32) | 0xffffffffu; /* no slot has it */
    int64_t buf[4] = {-1, -1, -1, -1};
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = ms;
    collie_work *w = NULL;
    int64_t t0 = ch_now_ns();
    int rc = collie_recv(c, buf, 4, COLLIE_INT64, COLLIE_ANY_SOURCE, tag, &o, &w);
    if (rc != COLLIE_OK) {
        if (comm_healthy(run, cid))
            ch_violation(rep, "bad_status", p->round, slot,
                         "the deadline probe's receive was refused on a healthy comm: %s",
                         collie_last_error());
        return;
    }
    int64_t bound = (int64_t)ms + CH_GRACE_MS + run->slack_ms, now = t0;
    while (!collie_work_test(w)) {
        now = ch_now_ns();
        if (now - t0 - ch_paused_ns(t0, now) > (bound + CH_HANG_MS) * 1000000) break;
        usleep(500);
    }
    now = ch_now_ns();
    int64_t took_ms = (now - t0 - ch_paused_ns(t0, now)) / 1000000;
    int st = collie_work_result(w);
    ch_report_line(rep, NULL, "probe r=%d seq=%d comm=%d deadline_ms=%d status=%s ms=%lld",
                   p->round, slot, cid, ms, collie_status_name(st), (long long)took_ms);
    if (st == COLLIE_INPROGRESS) {
        ch_violation(rep, "past_deadline", p->round, slot,
                     "the deadline probe (%d ms) had not ended after %lld ms", ms,
                     (long long)took_ms);
        collie_work_cancel(w);
        collie_work_wait(w, 10000);
    } else if (st == COLLIE_OK) {
        ch_violation(rep, "wrong_ok", p->round, slot,
                     "a receive on a tag no rank sends ended OK (source %d)",
                     collie_work_source(w));
    } else if (st == COLLIE_ETIMEDOUT && took_ms < ms) {
        ch_violation(rep, "early_timeout", p->round, slot,
                     "the deadline probe timed out after %lld ms, before its %d ms",
                     (long long)took_ms, ms);
    } else if (st == COLLIE_ETIMEDOUT && took_ms > bound) {
        ch_violation(rep, "past_deadline", p->round, slot,
                     "the deadline probe (%d ms) ended after %lld ms, past deadline + grace %d + "
                     "slack %d",
                     ms, (long long)took_ms, CH_GRACE_MS, run->slack_ms);
    } else if (st != COLLIE_ETIMEDOUT && comm_healthy(run, cid)) {
        ch_violation(rep, "bad_status", p->round, slot,
                     "the deadline probe ended %s on a healthy comm: %s", collie_status_name(st),
                     collie_work_error_message(w));
    }
    for (int i = 0; i < 4; i++)
        if (buf[i] != -1) {
            ch_violation(rep, "wrong_ok", p->round, slot,
                         "the deadline probe's receive (%s) wrote its buffer",
                         collie_status_name(st));
            break;
        }
    collie_work_release(w);
}

static void inject_fault(ch_run *run, const ch_op *op) {
    const ch_round *p = &run->plan;
    if (!p->fault || op->slot != p->fault_slot) return;
    ch_report *rep = &run->rep;
    int cid = run->comms[op->comm] && p->comms[op->comm].me >= 0 ? op->comm : 0;
    collie_comm *c = run->comms[cid];
    if (!c) return;
    switch (p->fault) {
    case CH_F_ABORT:
        if (p->abort_from != 0) return;
        ch_report_line(rep, NULL, "fault kind=abort r=%d seq=%d from=main comm=%d", p->round,
                       op->slot, cid);
        rep->faults++;
        collie_comm_abort(c, "chaos: abort from the main thread");
        run->faulted = true;
        break;
    case CH_F_DESTROY: {
        ch_report_line(rep, NULL, "fault kind=destroy r=%d seq=%d comm=%d in_flight=%zu", p->round,
                       op->slot, cid, run->fl.n);
        rep->faults++;
        run->comms[cid] = NULL;
        ch_comm_end_line(run, cid, c, ch_now_ns());
        int rc = collie_comm_destroy(c);
        if (rc != COLLIE_OK && rc != COLLIE_EABORTED)
            ch_violation(rep, "bad_status", p->round, op->slot,
                         "collie_comm_destroy with works in flight returned %s",
                         collie_status_name(rc));
        run->faulted = true;
        break;
    }
    case CH_F_CANCEL:
        /* the newest collective or send in flight (a fault of its comm) */
        for (size_t i = run->fl.n; i-- > 0;) {
            ch_work *rec = run->fl.v[i];
            if (!rec || rec->role == CH_ROLE_RECV) continue;
            int rc = collie_work_cancel(rec->w);
            ch_report_line(rep, NULL, "fault kind=cancel r=%d seq=%d op=%s result=%s", p->round,
                           rec->op.slot, ch_kind_name(rec->op.kind), collie_status_name(rc));
            rep->faults++;
            if (rc == COLLIE_OK) rec->cancelled = true;
            break;
        }
        break;
    case CH_F_DEADLINE:
        ch_report_line(rep, NULL, "fault kind=deadline r=%d seq=%d", p->round, op->slot);
        rep->faults++;
        deadline_probe(run, c, cid, op->slot);
        break;
    default: break;
    }
}

collie_comm_opts ch_comm_opts(const char *name, bool infinite) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = name;
    /* bounds a graceful destroy with works in flight (an infinite one:
     * COLLIE_TIMEOUT_MS, 5000 here) */
    o.timeout_ms = infinite ? COLLIE_TIMEOUT_INFINITE : 5000;
    o.create_timeout_ms = 15000; /* a stopped rank may delay a create */
    return o;
}

/* How long a split or new_group may go on after its parent was aborted
 * (docs/chaos.md): each of its waits watches the parent (comm_split.c,
 * comm_create.c: 20 ms slices); before eb4b3bc nothing did, and the
 * create timeout (15 s here) was waited out. Two cores, eight ranks. */
#define CH_ABORT_BOUND_MS 2000

/* one split or new_group call: when it began and returned (ch_now_ns) */
typedef struct sub_call {
    int64_t t0, t1;
} sub_call;

/* the clock fields of a group line of a split or new_group: the driver
 * holds every rank's to the abort's fired_us (chaos_run.py) */
#define SUB_FMT " ms=%lld start_us=%lld end_us=%lld paused_ms=%lld"
#define SUB_ARGS(sc)                                                                               \
    (long long)(((sc).t1 - (sc).t0) / 1000000), (long long)((sc).t0 / 1000),                       \
        (long long)((sc).t1 / 1000), (long long)(ch_paused_ns((sc).t0, (sc).t1) / 1000000)

/* This rank's own abort of the world fired before the call returned (the
 * variant abort_subgroups, chaos_prog.h): the call must return within
 * CH_ABORT_BOUND_MS of the later of the abort and its start (less the time
 * this process was stopped), with a status the fixed split gives: done
 * before the abort was seen (OK, ENOTMEMBER), refused by a parent that had
 * failed (ESTATE), ended by the parent's fault (EABORTED), or a misfit's
 * disagreement (EINVAL). Not ETIMEDOUT, what the old code gave 15 s later,
 * nor EPEER: a child's rendezvous ended by an abort poisons nothing
 * (comm_rendezvous.c), only a timeout or a conflict does. */
/* A group's creation ended by its parent's failure (a peer's abort, a
 * death in the same round): the parent's fault (EABORTED through the
 * child's rendezvous, or ESTATE: the parent is no longer ready) is the
 * right answer, whatever the lists said. */
static bool ch_parent_failed_status(collie_comm *world, int rc) {
    int st = COLLIE_OK;
    collie_comm_error(world, &st, NULL);
    return st != COLLIE_OK && (rc == COLLIE_EABORTED || rc == COLLIE_ESTATE);
}

static void subgroup_check(ch_run *run, const char *what, int rc, const sub_call *sc) {
    const ch_round *p = &run->plan;
    int64_t f = atomic_load(&run->ab.fired_ns);
    if (!f || f > sc->t1) return;
    int64_t from = f > sc->t0 ? f : sc->t0;
    int64_t late = sc->t1 - from - ch_paused_ns(from, sc->t1);
    if (late > (int64_t)CH_ABORT_BOUND_MS * 1000000)
        ch_violation(&run->rep, "slow_after_abort", p->round, -1,
                     "%s returned %s %lld ms after this rank aborted its parent (%s it began; "
                     "bound %d ms): %s",
                     what, collie_status_name(rc), (long long)(late / 1000000),
                     f > sc->t0 ? "after" : "before", CH_ABORT_BOUND_MS,
                     rc == COLLIE_OK ? "" : collie_last_error());
    bool ok = rc == COLLIE_OK || rc == COLLIE_ENOTMEMBER || rc == COLLIE_ESTATE ||
              rc == COLLIE_EABORTED || (rc == COLLIE_EINVAL && p->misfit >= 0);
    if (!ok)
        ch_violation(&run->rep, "bad_status", p->round, -1,
                     "%s returned %s after this rank aborted its parent (OK, ENOTMEMBER, ESTATE "
                     "or EABORTED expected): %s",
                     what, collie_status_name(rc), collie_last_error());
}

/* split and new_group, as planned; false if the round has faulted */
static bool make_subgroups(ch_run *run) {
    ch_round *p = &run->plan;
    ch_report *rep = &run->rep;
    collie_comm *world = run->comms[0];
    for (int step = 0; step < 2; step++) {
        bool split = step == 0;
        if (split ? !p->split : !p->group) continue;
        collie_comm *c = NULL;
        int rc, cid;
        const char *what = split ? "comm_split" : "comm_new_group";
        sub_call sc;
        sc.t0 = ch_now_ns();
        if (split) {
            int color = p->color[p->rank];
            rc = collie_comm_split(world, color < 0 ? COLLIE_UNDEFINED : color, p->skey[p->rank],
                                   NULL, &c);
            sc.t1 = ch_now_ns();
            subgroup_check(run, what, rc, &sc);
            cid = color < 0 ? -1 : 1 + color;
        } else {
            const int *list = p->rank == p->misfit ? p->misfit_ranks : p->group_ranks;
            rc = collie_comm_new_group(world, list, p->group_n, NULL, &c);
            sc.t1 = ch_now_ns();
            subgroup_check(run, what, rc, &sc);
            cid = p->comms[p->group_comm].me >= 0 ? p->group_comm : -1;
            if (p->rank == p->misfit) {
                ch_report_line(rep, NULL, "fault kind=disagree r=%d seq=-1", p->round);
                rep->faults++;
            }
            if (p->misfit >= 0 && cid >= 0) { /* a member: the lists disagree */
                ch_report_line(rep, rc == COLLIE_OK ? NULL : collie_last_error(),
                               "group r=%d op=%s status=%s comm=%d misfit=%d" SUB_FMT, p->round,
                               what, collie_status_name(rc), cid, p->misfit, SUB_ARGS(sc));
                if (rc == COLLIE_OK || c)
                    ch_violation(rep, "disagreement_accepted", p->round, -1,
                                 "new_group returned %s and %s though rank %d was given another "
                                 "member list",
                                 collie_status_name(rc), c ? "a comm" : "no comm", p->misfit);
                else if (rc != COLLIE_EINVAL && rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER &&
                         !ch_parent_failed_status(world, rc))
                    ch_violation(rep, "bad_status", p->round, -1,
                                 "new_group with disagreeing lists returned %s: %s",
                                 collie_status_name(rc), collie_last_error());
                if (c) collie_comm_destroy(c);
                return false;
            }
        }
        ch_report_line(rep, rc == COLLIE_OK || rc == COLLIE_ENOTMEMBER ? NULL : collie_last_error(),
                       "group r=%d op=%s status=%s comm=%d" SUB_FMT, p->round, what,
                       collie_status_name(rc), cid, SUB_ARGS(sc));
        if (cid < 0) {
            /* a parent that has failed refuses everyone first: COLLIE_ESTATE,
             * its cause in the message (collie_comm_error says it failed) */
            bool parent_failed = !comm_healthy(run, 0);
            bool ok_answer = rc == COLLIE_ENOTMEMBER || (rc == COLLIE_ESTATE && parent_failed);
            if (!ok_answer || c)
                ch_violation(rep, "bad_status", p->round, -1,
                             "%s of a non-member returned %s and %s (COLLIE_ENOTMEMBER and no "
                             "comm expected, or COLLIE_ESTATE from a failed parent)",
                             what, collie_status_name(rc), c ? "a comm" : "no comm");
            if (c) collie_comm_destroy(c);
            if (rc != COLLIE_ENOTMEMBER && rc != COLLIE_OK) return false;
            continue;
        }
        if (rc != COLLIE_OK) {
            if (comm_healthy(run, 0) && rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER)
                ch_violation(rep, "bad_status", p->round, -1, "%s failed on a healthy parent: %s",
                             what, collie_last_error());
            return false;
        }
        const ch_comm_info *ci = &p->comms[cid];
        if (collie_comm_size(c) != ci->size || collie_comm_rank(c) != ci->me)
            ch_violation(rep, "bad_status", p->round, -1,
                         "%s gave a comm of size %d where this rank is %d; expected size %d, "
                         "rank %d",
                         what, collie_comm_size(c), collie_comm_rank(c), ci->size, ci->me);
        run->comms[cid] = c;
    }
    return true;
}

/* ---- the signal storm (CH_F_SIGNALS) -----------------------------------------
 * A process that takes signals (a profiler's timer, a SIGCHLD handler) is
 * no fault at all: every call of the library must go on through EINTR. In
 * a round chosen from (seed, rank, round) this rank arms an interval timer
 * every 20-200 us with an SA_RESTART handler that only counts, for the
 * whole round; the oracle is unchanged (a poll that took EINTR for the
 * lender's exit once failed read loans: aa611e9). */

static atomic_ulong storm_hits;

static void storm_on_signal(int sig) {
    (void)sig;
    atomic_fetch_add_explicit(&storm_hits, 1, memory_order_relaxed);
}

/* the period in us, or 0 for no storm this round */
static int storm_period_us(const ch_run *run, int r) {
    if (!(run->faults & CH_F_SIGNALS)) return 0;
    uint64_t h = ch_hash(run->seed, 0x5167u, (uint64_t)run->rank, (uint64_t)r);
    if (h % 3 != 0) return 0;
    return 20 + (int)((h >> 8) % 181);
}

static void storm_set(int period_us) {
    if (period_us > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = storm_on_signal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
    }
    struct itimerval it = {{0, period_us}, {0, period_us}};
    setitimer(ITIMER_REAL, &it, NULL); /* a zero period disarms it */
}

/* A create timeout another rank found and published (docs/api.md: the first
 * rank whose deadline passes says so for all; "rendezvous: rank N: not every
 * rank arrived ..."): it reaches a rank that called create later a little
 * before its own deadline. One this rank found itself names this rank. */
static bool create_timeout_relayed(int self, const char *msg) {
    const char *p = msg ? strstr(msg, "rendezvous: rank ") : NULL;
    int who;
    if (!p || sscanf(p, "rendezvous: rank %d: not every rank arrived", &who) != 1) return false;
    return who != self && strstr(p, "not every rank arrived") != NULL;
}

void ch_run_slots(ch_run *run, bool go) {
    ch_round *p = &run->plan;
    ch_report *rep = &run->rep;
    int r = p->round;
    if (go) {
        if (p->fault == CH_F_ABORT && p->abort_from == 1 && !p->abort_subgroups)
            aborter_start(&run->ab, run->comms[0], p->fault_delay_ms);
        if (p->fault == CH_F_ABORT && p->abort_from == 2) ch_cb_arm_abort(1 + p->fault_slot % 16);
        for (int s = 0; s < p->ops && !run->faulted; s++) {
            ch_op op;
            ch_plan_op(p, s, &op);
            stall_before(run, &op);
            if (run->faulted) break;
            post_slot(run, &op);
            if (run->faulted) break;
            stall_after(run, &op);
            inject_fault(run, &op);
            due_cancels(run);
            if (run->fl.n < 256 || s % 64 == 0) ch_reap(&run->fl, 0, on_done, run);
        }
    } else {
        run->faulted = true;
    }
    drain(run); /* every work ends (the hang check abandons one that never does) */
    int64_t fired = aborter_stop(&run->ab);
    if (fired) {
        ch_report_line(rep, NULL,
                       "fault kind=abort r=%d seq=-1 from=thread comm=0 phase=%s fired_us=%lld", r,
                       p->abort_subgroups ? "subgroups" : "slots", (long long)(fired / 1000));
        rep->faults++;
    }
    ch_cb_arm_abort(-1);
    if (ch_cb_abort_fired()) {
        ch_report_line(rep, NULL, "fault kind=abort r=%d seq=-1 from=callback", r);
        rep->faults++;
    }
}

/* A hasty create: in one round in four (the seed's), one rank first
 * creates the round's comm with a 1 ms bound while the others wait 300 ms,
 * gives up (its generation is poisoned, its slot taken), then creates as
 * the others do: the round's
 * creates must still land together (before d294789 the others' first
 * creates fell into the poisoned generation and failed). A hasty create
 * that did succeed (everyone came within 1 ms) is the round's comm. A
 * `hasty` line says what it did. */
static int hasty_create(ch_run *run, int r, const collie_comm_opts *o) {
    uint64_t h = ch_mix(run->seed ^ ((uint64_t)r << 40) ^ 0x4a57ULL);
    if (h % 4 != 0) return COLLIE_EINVAL;
    if ((int)((h >> 8) % (uint64_t)run->world) != run->rank) {
        sleep_ms(300); /* the others come later: the hasty one gives up alone */
        return COLLIE_EINVAL;
    }
    collie_comm_opts ho = *o;
    ho.create_timeout_ms = 1;
    int64_t t0 = ch_now_ns();
    int rc = collie_comm_create(run->e, run->st, run->rank, run->world, &ho, &run->comms[0]);
    ch_report_line(&run->rep, rc == COLLIE_OK ? NULL : collie_last_error(),
                   "hasty r=%d status=%s ms=%lld", r, collie_status_name(rc),
                   (long long)((ch_now_ns() - t0) / 1000000));
    return rc; /* failed: *out is NULL (collie_comm_create destroyed it) */
}

static void run_round_body(ch_run *run, int r) {
    ch_round *p = &run->plan;
    ch_report *rep = &run->rep;
    ch_plan_round(p, run->seed, r, run->world, run->rank, run->ops, run->inflight_max, run->faults);
    memset(run->comms, 0, sizeof run->comms);
    run->faulted = false;
    run->posted = 0;
    ch_report_line(rep, NULL,
                   "round r=%d comm_size=%d inflight=%d ops=%d split=%d group=%d "
                   "fault=%d fault_slot=%d stall_slot=%d infinite_timeout=%d abort_sub_ms=%d "
                   "sub_delay_ms=%d start_us=%lld",
                   r, run->world, p->window, p->ops, p->split ? p->ncolors : 0,
                   p->group ? p->group_n : 0, p->fault, p->fault_slot, p->stall_slot,
                   p->infinite_timeout, p->abort_subgroups ? p->abort_sub_ms : -1, p->sub_delay_ms,
                   (long long)(ch_now_ns() / 1000));
    char name[64];
    snprintf(name, sizeof name, "chaos%" PRIu64 "r%d", run->seed, r);
    collie_comm_opts o = ch_comm_opts(name, p->infinite_timeout);
    int64_t t0 = ch_now_ns();
    int rc = hasty_create(run, r, &o);
    if (rc != COLLIE_OK)
        rc = collie_comm_create(run->e, run->st, run->rank, run->world, &o, &run->comms[0]);
    int64_t t1 = ch_now_ns();
    ch_report_line(rep, rc == COLLIE_OK ? NULL : collie_last_error(),
                   "group r=%d op=comm_create status=%s comm=0 ms=%lld deadline_ms=%d end_us=%lld",
                   r, collie_status_name(rc), (long long)((t1 - t0) / 1000000), o.create_timeout_ms,
                   (long long)(t1 / 1000));
    if (rc == COLLIE_ETIMEDOUT && t1 - t0 < (int64_t)o.create_timeout_ms * 1000000 &&
        !create_timeout_relayed(run->rank, collie_last_error()))
        ch_violation(rep, "early_timeout", r, -1,
                     "collie_comm_create returned COLLIE_ETIMEDOUT after %lld ms, before its "
                     "create_timeout_ms of %d: %s",
                     (long long)((t1 - t0) / 1000000), o.create_timeout_ms, collie_last_error());
    if (rc != COLLIE_OK) {
        if (rc != COLLIE_ETIMEDOUT && rc != COLLIE_EPEER && rc != COLLIE_EINVAL)
            ch_violation(rep, "bad_status", r, -1, "collie_comm_create returned %s: %s",
                         collie_status_name(rc), collie_last_error());
        return;
    }
    memset(&run->ab, 0, sizeof run->ab);
    atomic_init(&run->ab.fired_ns, 0);
    /* the abort during the split and new_group (chaos_prog.h) */
    if (p->abort_subgroups) aborter_start(&run->ab, run->comms[0], p->abort_sub_ms);
    if (p->sub_delay_ms) sleep_ms(p->sub_delay_ms);
    ch_run_slots(run, make_subgroups(run));
    for (int i = run->plan.ncomms; i-- > 0;) {
        if (!run->comms[i]) continue;
        t0 = ch_now_ns();
        ch_comm_end_line(run, i, run->comms[i], t0);
        rc = collie_comm_destroy(run->comms[i]);
        int64_t ms = (ch_now_ns() - t0) / 1000000;
        run->comms[i] = NULL;
        if (rc != COLLIE_OK && rc != COLLIE_EABORTED)
            ch_violation(rep, "bad_status", r, -1, "collie_comm_destroy returned %s",
                         collie_status_name(rc));
        if (ms > 5000 + CH_GRACE_MS + run->slack_ms)
            ch_violation(rep, "hang", r, -1,
                         "collie_comm_destroy of comm %d took %lld ms with nothing in flight", i,
                         (long long)ms);
    }
}

/* A round, under a signal storm when the seed says so (above). */
static void run_round(ch_run *run, int r) {
    int storm_us = storm_period_us(run, r);
    unsigned long before = atomic_load(&storm_hits);
    storm_set(storm_us);
    run_round_body(run, r);
    if (!storm_us) return;
    storm_set(0);
    ch_report_line(&run->rep, NULL, "fault kind=signals r=%d seq=-1 period_us=%d signals=%lu", r,
                   storm_us, atomic_load(&storm_hits) - before);
    run->rep.faults++;
}

/* the round-end protocol: false if a rank never arrived */
static bool round_end(ch_run *run, int r, char *why, size_t cap) {
    char key[128];
    snprintf(key, sizeof key, "chaos/%" PRIu64 "/r%d/end/%d", run->seed, r, run->rank);
    int rc = collie_store_set(run->st, key, "1", 1, 10000);
    if (rc != COLLIE_OK) {
        snprintf(why, cap, "store set of %s: %s (%s)", key, collie_status_name(rc),
                 collie_last_error());
        return false;
    }
    char *keys[CH_MAX_RANKS];
    char store[CH_MAX_RANKS][128];
    for (int q = 0; q < run->world; q++) {
        snprintf(store[q], sizeof store[q], "chaos/%" PRIu64 "/r%d/end/%d", run->seed, r, q);
        keys[q] = store[q];
    }
    rc = collie_store_wait(run->st, (const char *const *)keys, (size_t)run->world,
                           run->round_wait_ms);
    if (rc == COLLIE_OK) return true;
    size_t len = (size_t)snprintf(why, cap, "round %d end: %s after %d ms; missing:", r,
                                  collie_status_name(rc), run->round_wait_ms);
    for (int q = 0; q < run->world && len < cap; q++) {
        bool there = false;
        const char *k1[1] = {keys[q]};
        if (collie_store_check(run->st, k1, 1, 2000, &there) == COLLIE_OK && !there)
            len += (size_t)snprintf(why + len, cap - len, " rank %d", q);
    }
    return false;
}

int main(int argc, char **argv) {
    ch_run run;
    memset(&run, 0, sizeof run);
    run.rounds = 4;
    run.ops = 200;
    run.inflight_max = 64;
    run.faults = CH_F_ALL;
    run.join_id = -1;
    int join_world = -1;
    bool have_seed = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        if (!strcmp(a, "--seed")) {
            if (!parse_u64(v, &run.seed)) usage("--seed needs a decimal uint64");
            have_seed = true;
        } else if (!strcmp(a, "--report")) {
            if (!v || !*v) usage("--report needs a directory");
            run.dir = v;
        } else if (!strcmp(a, "--rounds")) {
            if (!parse_u64(v, &x) || x < 1 || x > 100000) usage("--rounds: 1..100000");
            run.rounds = (int)x;
        } else if (!strcmp(a, "--ops")) {
            if (!parse_u64(v, &x) || x > 10000000) usage("--ops: 0..10000000");
            run.ops = (int)x;
        } else if (!strcmp(a, "--inflight-max")) {
            if (!parse_u64(v, &x) || x < 1 || x > 10000) usage("--inflight-max: 1..10000");
            run.inflight_max = (int)x;
        } else if (!strcmp(a, "--faults")) {
            if (!v) usage("--faults needs a list");
            run.faults = parse_faults(v);
        } else if (!strcmp(a, "--join")) {
            if (!parse_u64(v, &x) || x >= CH_MAX_RANKS) usage("--join: a world id below 16");
            run.join_id = (int)x;
        } else if (!strcmp(a, "--world")) {
            if (!parse_u64(v, &x) || x < 1 || x > CH_MAX_RANKS) usage("--world: 1..16");
            join_world = (int)x;
        } else {
            char m[256];
            snprintf(m, sizeof m, "unknown argument '%s'", a);
            usage(m);
        }
        i++;
    }
    if (!have_seed) usage("--seed is required");
    if (!run.dir) usage("--report is required");
    if (run.join_id >= 0) { /* a replacement the driver started (chaos_elastic.c) */
        if (join_world < 1 || !(run.faults & CH_F_GROW))
            usage("--join needs --world N and --faults with shrink,grow");
        run.rank = run.join_id;
        run.world = join_world;
    } else {
        run.rank = env_int("COLLIE_RANK", -1, 0, CH_MAX_RANKS - 1);
        run.world = env_int("COLLIE_WORLD_SIZE", -1, 1, CH_MAX_RANKS);
        if (run.rank < 0 || run.world < 1 || run.rank >= run.world)
            usage("COLLIE_RANK / COLLIE_WORLD_SIZE missing or inconsistent (run it under "
                  "collie-run)");
    }
    if ((run.faults & CH_F_GROW) && !(run.faults & CH_F_SHRINK))
        usage("--faults grow needs shrink (an elastic run)");
    /* an elastic run: one world that shrinks and grows, on it the kinds
     * that name no healthy rank (chaos_elastic.c) */
    run.elastic = (run.faults & CH_F_SHRINK) != 0;
    if (run.elastic) run.faults &= CH_F_ELASTIC_OK;
    run.store_addr = getenv("COLLIE_STORE_ADDR");
    run.slack_ms = env_int("CHAOS_SLACK_MS", 2000, 0, 600000);
    run.round_wait_ms = env_int("CHAOS_ROUND_WAIT_MS", 20000, 1, 3600000);
    run.mem_tolerance = env_int("CHAOS_MEM_TOLERANCE", 1 << 20, 0, 1 << 30);
    if (!ch_report_open(&run.rep, run.dir, run.rank)) {
        fprintf(stderr, "chaos_rank: cannot write the report in %s: %s\n", run.dir,
                strerror(errno));
        return 2;
    }
    ch_report *rep = &run.rep;
    ch_report_line(rep, NULL,
                   "start rank=%d world=%d pid=%d seed=%" PRIu64 " rounds=%d ops=%d "
                   "inflight_max=%d faults=%d elastic=%d joiner=%d store=%s",
                   run.rank, run.world, (int)getpid(), run.seed, run.rounds, run.ops,
                   run.inflight_max, run.faults, run.elastic, run.join_id >= 0,
                   run.store_addr && *run.store_addr ? run.store_addr : "-");
    ch_pause_clock_start();
    ch_measure before = measure();

    /* the default op timeout: what a destroy waits in a round whose comms
     * have an infinite one (chaos_prog.h) */
    setenv("COLLIE_TIMEOUT_MS", "5000", 0);
    collie_engine_opts eo = COLLIE_ENGINE_OPTS_INIT;
    eo.name = "chaos";
    int rc = collie_engine_create(&eo, &run.e);
    if (rc == COLLIE_OK) rc = collie_store_connect(run.e, NULL, NULL, &run.st);
    if (rc == COLLIE_OK) rc = collie_cq_create(&run.cq);
    if (rc != COLLIE_OK) {
        ch_violation(rep, "bad_status", -1, -1, "set-up failed: %s: %s", collie_status_name(rc),
                     collie_last_error());
        ch_report_line(rep, NULL,
                       "end reason=setup works=0 ok=0 failed=0 bytes_checked=0 "
                       "violations=%" PRIu64,
                       rep->violations);
        return 3;
    }
    ch_inflight_init(&run.fl, run.cq, rep, run.slack_ms);
    const char *reason = "done";
    char why[1024] = "";
    if (run.elastic) {
        reason = ch_elastic_main(&run, why, sizeof why);
    } else {
        for (int r = 0; r < run.rounds; r++) {
            run_round(&run, r);
            if (!round_end(&run, r, why, sizeof why)) {
                reason = "peer_gone";
                break;
            }
        }
    }
    bool hung = run.fl.hangs > 0;
    ch_inflight_fini(&run.fl);
    collie_cq_destroy(run.cq);
    collie_store_destroy(run.st);
    collie_engine_destroy(run.e);
    if (!hung) { /* abandoned works keep their buffers on purpose */
        ch_measure after = measure();
        /* a joined thread leaves /proc/self/task a moment after pthread_join
         * returns (the kernel wakes the joiner before it releases the task):
         * a leak is a count that stays up, so look again for up to 1 s */
        for (int i = 0; i < 100 && after.threads > before.threads; i++) {
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
            after.threads = count_dir("/proc/self/task");
        }
        ch_report_line(rep, NULL, "leak kind=fd before=%ld after=%ld", before.fds, after.fds);
        ch_report_line(rep, NULL, "leak kind=thread before=%ld after=%ld", before.threads,
                       after.threads);
        ch_report_line(rep, NULL, "leak kind=heap before=%lld after=%lld tolerance=%lld",
                       (long long)before.heap, (long long)after.heap, (long long)run.mem_tolerance);
        if (after.fds > before.fds)
            ch_violation(rep, "leak", -1, -1, "fds: %ld before the engine, %ld after its destroy",
                         before.fds, after.fds);
        if (after.threads > before.threads)
            ch_violation(rep, "leak", -1, -1,
                         "threads: %ld before the engine, %ld after its destroy", before.threads,
                         after.threads);
        if (after.heap - before.heap > run.mem_tolerance)
            ch_violation(rep, "leak", -1, -1,
                         "heap: %lld bytes in use before the engine, %lld after its destroy "
                         "(tolerance %lld)",
                         (long long)before.heap, (long long)after.heap,
                         (long long)run.mem_tolerance);
    }
    ch_pause_clock_stop();
    ch_report_line(rep, *why ? why : NULL,
                   "end reason=%s works=%" PRIu64 " ok=%" PRIu64 " failed=%" PRIu64
                   " bytes_checked=%" PRIu64 " violations=%" PRIu64 " faults=%" PRIu64,
                   reason, rep->works, rep->ok, rep->failed, rep->bytes_checked, rep->violations,
                   rep->faults);
    int code = rep->violations ? 3 : 0;
    ch_report_close(rep);
    return code;
}
