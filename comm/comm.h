/*
 * comm.h — communicators: internal state shared by the files of comm/
 * (and read by the tests through it).
 */
#ifndef CL_COMM_H
#define CL_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "collie.h"
#include "collie_backend.h"
#include "engine/engine.h"
#include "work/work.h"

enum cl_device { CL_DEV_CPU = 0, CL_DEV_CUDA = 1, CL_NUM_DEVICES };

/* The longest root cause a comm keeps (err_msg) and hands on: to its
 * works, in the abort notice, and to the transport (whose ABORT frame
 * carries it whole). Above the longest desync report (desync.c). */
#define CL_COMM_MSG_MAX 4096

/* backend.c: the parsed backend spec of a comm */
typedef struct cl_backend_spec {
    const collie_backend_ops *ops[CL_NUM_DEVICES]; /* NULL: device not served */
} cl_backend_spec;

int cl_backend_parse_spec(const char *spec, cl_backend_spec *out);
/* The built-in backends, registered before any other: a NULL-terminated
 * list defined by transports/builtin.c, the one place that names them
 * (comm/ includes no header of the transports above it). */
extern const collie_backend_ops *(*const cl_builtin_backends[])(void);
extern const collie_core_services cl_core_services;
/* backend_events.c: the loop's events as backends see them (watches,
 * timers, the poll hook; collie_backend.h) */
collie_watch *cl_backend_watch_new(collie_bcomm *bc, int fd, unsigned events, collie_watch_cb cb,
                                   void *arg);
int cl_backend_watch_start(collie_watch *wt, int64_t timeout_us);
void cl_backend_watch_stop(collie_watch *wt);
void cl_backend_watch_activate(collie_watch *wt, unsigned events);
void cl_backend_watch_free(collie_watch *wt);
void cl_backend_want_poll(collie_bcomm *bc, bool on, int32_t interval_us);
/* ops->progress becomes one of the engine's pollers (loop; removed by poll_free) */
void cl_backend_progress_start(collie_bcomm *bc);
/* release a backend instance's poll timer and poller (loop) */
void cl_backend_poll_free(collie_bcomm *bc);

enum cl_comm_state {
    CL_COMM_CREATING = 0,
    CL_COMM_READY = 1,
    CL_COMM_FAILED = 2, /* faulted or aborted: posts fail fast */
};

/* One backend instance of a comm. */
struct collie_bcomm {
    collie_comm *comm;
    const collie_backend_ops *ops;
    void *state;
    bool init_called, ready, poll_on;
    struct event *poll_ev; /* reads poll_fd, a periodic timerfd (backend_events.c) */
    int poll_fd;           /* -1: none (poll_ev is then a libevent timer) */
    int32_t poll_interval_us;
    /* want_poll from other threads: the wish, applied by poll_cmd on the loop */
    _Atomic int32_t poll_wish_us; /* <= 0: off */
    _Atomic bool poll_cmd_queued;
    cl_cmd poll_cmd;
    cl_poller progress; /* ops->progress on every spinning turn (backend_events.c) */
    /* the unlend gate (coll_end.c, comm.c): ops->unlend is called on any
     * publishing thread only while `lendable` (set after init, cleared
     * before destroy); `unlending` counts the threads inside the check or
     * the hook, and destroy waits for it to drain (seq_cst, Dekker) */
    _Atomic bool lendable;
    _Atomic int unlending;
    /* finished works kept for reuse: steady state allocates nothing */
    pthread_mutex_t pool_mu;
    cl_list pool; /* free works (cl_coll_work.pool_node), newest first */
    int pool_n;
};

/* A comm's counters (stats.c): posted is bumped by posting threads, the
 * rest as works' results are published; any thread reads them. */
typedef struct cl_latency_counters {
    _Atomic uint64_t count, sum_ns;
    _Atomic uint64_t buckets[COLLIE_LATENCY_BUCKETS];
} cl_latency_counters;

typedef struct cl_comm_counters {
    _Atomic uint64_t posted, completed, failed, bytes;
    _Atomic uint64_t by_status[COLLIE_STATS_STATUSES];
    _Atomic uint64_t by_kind[COLLIE_FAULT_NUM_KINDS]; /* failed works by fault kind */
    _Atomic int32_t connections;            /* the backends' count (the stat_add service) */
    _Atomic int32_t shm_connections;        /* of those, over shared memory */
    _Atomic uint64_t shm_single_copy_bytes; /* received by single copy */
    cl_latency_counters latency[COLLIE_STATS_OPS];
} cl_comm_counters;

/* fault.c: a fault's data (collie_fault less its header and status) */
typedef struct cl_fault {
    int8_t kind, view; /* collie_fault_kind, collie_fault_view */
    int32_t origin;    /* -1: unknown */
    int32_t nranks;    /* the set's size; ranks[] lists the first COLLIE_FAULT_RANKS */
    int32_t ranks[COLLIE_FAULT_RANKS];
} cl_fault;

/* One flight-recorder entry (flight.c). A failed work's fault, compactly:
 * its kind and the first CL_FR_FAULT_RANKS ranks of its set. */
#define CL_FR_FAULT_RANKS 4
typedef struct cl_fr_entry {
    uint64_t id, seq, count;
    uint8_t kind, dtype, op;
    bool cuda;
    int32_t peer; /* p2p peer or root, -1 if none */
    int status;
    int64_t post_ns, start_ns, end_ns;
    int8_t fault_kind;    /* collie_fault_kind (NONE unless failed) */
    int32_t fault_nranks; /* the set's size; fault_ranks lists the first few */
    int32_t fault_ranks[CL_FR_FAULT_RANKS];
    char error[160];
} cl_fr_entry;

/* A collective work. The backend's per-work data follows it. */
typedef struct cl_coll_work {
    collie_work base;
    collie_comm *comm;
    collie_bcomm *bc;
    collie_coll_args args;
    size_t *vcounts;               /* allgatherv, alltoallv: args' counts, owned (coll_v.c) */
    bool started;                  /* backend start ran (loop) */
    bool start_called;             /* ops->start ran (loop; not when it expired unstarted) */
    bool caller_started;           /* started on the posting thread (cuda backends) */
    uint64_t fr_id;                /* flight-recorder entry, 0 if none */
    cl_list_node link;             /* comm's waiting queue or active list (loop) */
    cl_list_node pool_node;        /* in its backend's pool of free works */
    bool explaining;               /* a desync report will end it (loop) */
    bool clean_end;                /* an unmatched receive withdrawn: no comm fault (loop) */
    int source;                    /* any-source receive: the sender (loop, before the end) */
    cl_cmd cancel_cmd;             /* cancel/waiter → loop (coll_cancel.c) */
    _Atomic bool cancel_requested; /* its backend was (or will be) asked to end it */
    int cancel_status;
    char cancel_msg[160];
    /* its fault's data (fault.c), set by an ender that knows it before the
     * end (desync.c, a peer's loss); else filled from the status at the end */
    cl_fault fault;
    _Alignas(16) unsigned char backend_data[];
} cl_coll_work;

struct collie_comm {
    collie_engine *engine;
    collie_store *store; /* its own handle (a view of the caller's; comm_create.c) */
    char prefix[112];    /* store namespace "collie/<name>/<gen>/" */
    char name[72];
    char family[72]; /* the name it was first created with, kept by shrinks and grows: joiners
                        ask for it (comm_grow.c) */
    int rank, size;
    uint64_t generation, id;
    int32_t timeout_ms, create_timeout_ms;
    collie_error_policy policy;
    collie_comm_error_cb on_error;
    void *on_error_arg;
    cl_cmd on_error_cmd; /* a helper thread hands the callback to the loop */
    int on_error_status;
    _Atomic bool on_error_queued;
    int device;
    cl_backend_spec spec;
    collie_bcomm bcs[CL_NUM_DEVICES];

    _Atomic int state;             /* enum cl_comm_state */
    _Atomic int err_status;        /* COLLIE_OK until the first fault */
    char err_msg[CL_COMM_MSG_MAX]; /* written once, before err_status is published */
    cl_fault fault;                /* the root fault's data: as err_msg (fault.c) */
    int aborted_by;                /* loop: the peer whose ABORT frame the next fault is */
    int disagrees_with;            /* loop: the peer the next EPROTO disagrees with */
    struct cl_health *health;      /* peers' health, the event queue (health.c) */
    char refused[200];             /* under mu: this rank's last refused post, for desync
                                      answers ("" none since the last completed one) */
    uint64_t refused_after;        /* under mu: next_seq when it was refused (a collective
                                      completed past it forgets it: coll.c) */
    _Atomic bool fault_unapplied;  /* recorded by cl_comm_record_fault, policy not yet applied */
    pthread_mutex_t mu;            /* post ordering (seq + enqueue), err_msg, destroy */
    pthread_cond_t cv;             /* nactive changes (destroy waits) */
    uint64_t next_seq;             /* collectives, under mu */
    uint64_t next_p2p_seq;         /* send/recv, under mu */
    _Atomic int32_t refs;          /* user + each work + create state */
    _Atomic int nactive;           /* works posted and not retired */

    /* loop-thread state */
    cl_list waiting; /* started before the comm was ready (loop) */
    cl_list active;  /* handed to a backend (loop) */
    collie_work *create_work;
    void *create_state;
    cl_resident resident;
    cl_cmd abort_cmd;
    _Atomic bool abort_queued;
    bool resident_added, engine_gone, destroyed, registered;
    bool was_ready;              /* the rendezvous succeeded once (loop) */
    _Atomic bool ever_ready;     /* the same, for other threads (shrink's check) */
    _Atomic bool destroy_posted; /* collie_comm_destroy_post ran (comm_destroy.c) */
    _Atomic int groups_made;     /* split/new_group calls so far (names the children) */
    /* shrink (comm_shrink.c): attempts so far (name their keys and the new
     * comm); this rank was left out by the survivors (posts: ENOTMEMBER) */
    struct cl_change_slot {
        bool running;         /* one shrink (grow) of a comm at a time */
        bool done;            /* it succeeded: the comm is superseded */
        int attempt;          /* the next one's number (names its keys and comm) */
    } shrink_slot, grow_slot; /* under mu (comm_successor.c) */
    _Atomic bool excluded;
    /* made by a shrink: old rank -> new rank (-1: left out), owned */
    int *rank_map;
    int rank_map_n;
    /* its line (comm_successor.c): how it was made from `from` (generation
     * from_gen), the shrinks and grows since its family's first comm; and,
     * under mu, the comm a shrink or grow of it made (flight.c dumps them) */
    struct {
        const char *how; /* "shrink", "grow", "join"; NULL: created */
        char from[72];
        uint64_t from_gen;
        uint32_t shrinks, grows;
        char successor[72];
    } line;
    /* made by a shrink: the old comm, whose backends may build ours from
     * theirs (ops->shrink; held until the rendezvous ends, or this comm is
     * freed), and its ranks left out (sorted, owned) */
    struct {
        collie_comm *from;
        int *excluded;
        int nexcluded;
    } shrunk;
    /* made by collie_comm_split/new_group: the parent, whose backends may
     * build ours from theirs (ops->split), with this rank's colour and key;
     * referenced until this comm is freed (every error path included) */
    struct {
        collie_comm *parent;
        int color, key;
        /* new_group's list as this rank was given it ("2,1"; a long one cut,
         * with a hash of it all): the rendezvous holds every member to the
         * same (comm_rendezvous.c, STEP_SIZE); "" for create and split */
        char members[96];
    } split;
    /* progress, for desync answers */
    _Atomic uint64_t last_posted;    /* highest collective seq posted */
    uint64_t last_done;              /* highest collective seq retired (loop) */
    _Atomic uint64_t last_completed; /* highest collective seq completed OK (peer health) */
    /* control channel (comm_ctl.c, loop) */
    struct {
        uint64_t next;
        uint64_t taken_unwritten; /* `next` as a timed-out watch found it: taken,
                                     not written (0: none); skipped at the next one */
        collie_work *watch, *probe;
        struct event *retry_ev;
        bool stopped, abort_published;
        int sending; /* under mu: control messages being written */
    } ctl;
    cl_list desyncs;           /* desync reports in progress (desync.c, loop) */
    struct cl_check_args *chk; /* COLLIE_CHECK_ARGS, or NULL (check_args.c) */
    /* after a fault: works still to fail, a slice per loop step (comm.c) */
    struct {
        cl_list works; /* cl_coll_work.link, taken from waiting and active */
        int status;
        char reason[CL_COMM_MSG_MAX + 16];
        struct event *ev;
    } failing;
    /* after a fault or abort: the transport closes once the peers were told
     * (comm.c, loop) */
    struct {
        struct event *ev;
        bool transport_closed, terminate;
        bool pending; /* under mu: a delayed close is armed (destroy waits) */
    } closing;
    cl_comm_counters counters; /* stats.c */
    /* flight recorder (flight.c) */
    struct {
        pthread_mutex_t mu;
        cl_fr_entry *ring;
        uint32_t cap;
        uint64_t count;
        bool dumped; /* dumped (once, on abort) */
    } fr;
};

/* check_args.c: COLLIE_CHECK_ARGS (init at creation, any thread; note
 * under c->mu for each posted CUDA collective; start once ready, stop with
 * the backends, on the loop; free with the comm) */
int cl_check_args_init(collie_comm *c);
void cl_check_args_note(collie_comm *c, const collie_coll_args *a, uint64_t seq);
void cl_check_args_start(collie_comm *c);
void cl_check_args_stop(collie_comm *c);
void cl_check_args_free(collie_comm *c);

/* comm_rendezvous.c: delete the store keys of generation `gen` of c's name
 * (best effort, in the background; any thread) */
void cl_comm_forget_generation(collie_comm *c, uint64_t gen);

/* comm.c: destroy's closing step (loop): fail every pending work, close
 * the transport, destroy the backends, leave the engine's residents.
 * Idempotent; nothing once the engine is gone. */
void cl_comm_destroy_on_loop(collie_comm *c);

/* comm_ctl.c: the control channel (abort propagation, desync queries) */
bool cl_comm_ctl_enabled(const collie_comm *c);
void cl_comm_ctl_start(collie_comm *c);
void cl_comm_ctl_stop(collie_comm *c);
/* cl_comm_ctl_send: `done` (may be NULL) runs exactly once, when the message
 * is in the store or could not be written (possibly before this returns). */
int cl_comm_ctl_send(collie_comm *c, const char *msg, void (*done)(void *, int, uint64_t),
                     void *done_arg);
/* cl_comm_ctl_publish_abort: write "abort <rank> <status> <reason>", once
 * per comm. Returns false (and never runs `done`) if nothing was sent: the
 * comm was never created or its abort went out already. */
bool cl_comm_ctl_publish_abort(collie_comm *c, int status, const char *reason,
                               void (*done)(void *, int, uint64_t), void *done_arg);
/* this rank's progress as a desync answer: "posted P, completed C, in seq
 * S: <op>" or "..., idle" (", waiting for creation"), then ", refused: <op>:
 * <why>" while the last refused collective post is news (loop) */
void cl_comm_progress(collie_comm *c, char *buf, size_t len);

/* flight.c */
int cl_flight_init(collie_comm *c);
void cl_flight_fini(collie_comm *c);
void cl_flight_post(collie_comm *c, cl_coll_work *cw);
/* a post refused after cl_flight_post (its start on the caller's thread, or
 * cl_work_post): the entry ends failed with `why`, sequence number 0 (the
 * number is given back), never left queued */
void cl_flight_refused(collie_comm *c, cl_coll_work *cw, int status, const char *why);
/* `now`: the start time (the caller has read the clock already) */
void cl_flight_start(collie_comm *c, cl_coll_work *cw, int64_t now);
void cl_flight_end(collie_comm *c, cl_coll_work *cw);
void cl_comm_dump_on_abort(collie_comm *c);

/* stats.c: count a post that was accepted (posting thread, before the
 * engine can end it) / one that was then refused; count an ended work
 * (its publisher, before the result is visible) */
void cl_stats_posted(collie_comm *c, int delta);
void cl_stats_ended(collie_comm *c, const cl_coll_work *cw);
/* COLLIE_STATS_DIR: write the comm's stats as JSON (destroy) */
void cl_stats_write_on_destroy(collie_comm *c);
/* the stat_add service (any thread) */
void cl_stats_backend_add(collie_bcomm *bc, int which, int64_t delta);

/* fault.c */
void cl_fault_init(cl_fault *f, int kind, int view, int origin);
void cl_fault_add(cl_fault *f, int rank); /* ascending, once */
/* the data a status stands for when the one who saw it did not say (the
 * peers' ranks from health); any thread */
void cl_fault_classify(collie_comm *c, int status, cl_fault *f);
void cl_fault_export(const cl_fault *f, int status, collie_fault *out);
/* the abort notice's text: "<kind> <origin> <r,r,...|->"; parse: view
 * PEER, *rest after it. False if s is not that (a known kind, origin in
 * [-1, size), ranks ascending in [0, size)). */
int cl_fault_format(const cl_fault *f, char *buf, size_t len);
bool cl_fault_parse(const char *s, int size, cl_fault *f, const char **rest);

/* pid_watch.c: a same-host process's exit, one pidfd per (engine,
 * process) shared by its subscribers (loop). cl_pid_watch: COLLIE_OK
 * (s->exited runs on the loop once it exits, after s is detached),
 * COLLIE_ENOENT (gone already, or its pid recycled: `start` differs),
 * COLLIE_ENOTSUP (no pidfd here) or COLLIE_ENOMEM. */
typedef struct cl_pid_sub {
    cl_list_node node;
    struct cl_pid_watch *watch; /* NULL: not watching */
    void (*exited)(struct cl_pid_sub *s);
} cl_pid_sub;
int cl_pid_watch(collie_engine *e, pid_t pid, unsigned long long start, cl_pid_sub *s);
void cl_pid_unwatch(cl_pid_sub *s);
unsigned long long cl_pid_start_time(pid_t pid); /* /proc/<pid>/stat field 22; 0 unknown */
/* 1: the watched process lives (neither exited nor exiting); 0: it exited
 * or is exiting; -1: s watches nothing (any thread) */
int cl_pid_sub_alive(const cl_pid_sub *s);
size_t cl_pid_watches(void); /* open watches (tests) */

/* health.c: peer health and the event queue (see its notes). init at
 * creation (any thread), publish ahead of the creation barrier, start once
 * ready, stop with the backends (loop), free with the comm. */
typedef struct cl_health cl_health;
int cl_health_init(collie_comm *c);
void cl_health_publish(collie_comm *c, int32_t timeout_ms);
void cl_health_start(collie_comm *c);
void cl_health_stop(collie_comm *c);
void cl_health_free(collie_comm *c);
void cl_health_release_cb(collie_work *w, void *arg); /* releases w */
/* rank cannot be reached (a connect failed, a link broke): SUSPECTED
 * unless dead or left (an event); heard again, it is back */
void cl_health_suspect(collie_comm *c, int rank);
/* has rank ever been heard from on a link? */
bool cl_health_linked(const collie_comm *c, int rank);
/* 1: rank's process is watched (same host) and lives; 0: watched and
 * exited or exiting; -1: not watched */
int cl_health_process_alive(const collie_comm *c, int rank);
/* rank went DEAD or LEFT (final; an event). False if it was already. */
bool cl_health_peer_gone(collie_comm *c, int rank, int state);
/* a frame came from rank (seq: its collective number, 0 none): any thread */
void cl_health_heard(collie_comm *c, int rank, uint64_t seq);
int cl_health_state(const collie_comm *c, int rank);
/* add the ranks whose state is `state` to f */
void cl_health_add_peers(collie_comm *c, cl_fault *f, int state);
/* the comm's first fault: an event */
void cl_health_comm_faulted(collie_comm *c, int status, const cl_fault *f);
/* this rank was left out by a shrink (`by`: who said so): an event */
void cl_health_excluded(collie_comm *c, int by);

/* comm.c */
void cl_comm_hold(collie_comm *c);
void cl_comm_release(collie_comm *c);
/* collie_comm_abort with the fault's data (NULL: an application abort):
 * the abort notice carries it (a shrink's revoke names its suspects) */
int cl_comm_abort_with(collie_comm *c, const cl_fault *f, const char *reason);
/* record the first fault and apply the comm's policy (loop) */
void cl_comm_fault(collie_comm *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* cl_comm_record_fault: record the first fault only (any thread), with its
 * data (f; NULL: from the status); the next
 * cl_comm_fault on the loop applies the policy to it. True if it was the
 * first (the comm's root cause); false if the comm had failed already. */
bool cl_comm_record_fault(collie_comm *c, int status, const cl_fault *f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* the same with the fault's data (NULL: from the status, cl_fault_classify);
 * `propagate` false for faults learnt from the control channel */
void cl_comm_fault_data(collie_comm *c, int status, const cl_fault *f, bool propagate,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* the rendezvous finished (loop): start queued works or fail them; a
 * failure's fault data (NULL: from the status, cl_fault_classify) */
void cl_comm_created(collie_comm *c, int status, const char *msg, const cl_fault *fault);
/* start a work on its backend, or queue it (loop) */
void cl_comm_start_work(cl_coll_work *cw);

/* coll_end.c: a collective's end, every step in order (its state table is
 * there). cl_coll_finish: claim + publish, false if it was ended already;
 * cl_coll_publish: after a won cl_work_claim. Any thread: fill the result,
 * unlend, stats, flight entry, fault recorded, then DONE. Never
 * cl_work_finish/cl_work_publish on a collective (that would skip them). */
bool cl_coll_finish(collie_work *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cl_coll_publish(collie_work *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* cl_coll_finish with the fault's data its ender knows (fault.c) */
bool cl_coll_finish_fault(collie_work *w, int status, const cl_fault *f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* the same with a va_list; f NULL: the data from the status (coll_end.c) */
bool cl_coll_vfinish_fault(collie_work *w, int status, const cl_fault *f, const char *fmt,
                           va_list ap) __attribute__((format(printf, 4, 0)));
/* the end's loop half: the collectives' ops->detach (work/'s retire) */
void cl_coll_end_on_loop(collie_work *w);

/* coll.c: the work pool of a backend instance */
void cl_coll_pool_init(collie_bcomm *bc);
void cl_coll_pool_fini(collie_bcomm *bc);

/* coll.c: validate and post a collective to device `dev`'s backend */
int cl_coll_post(collie_comm *c, const collie_coll_args *a, int dev, const collie_post_opts *o,
                 collie_work **out);
bool cl_coll_is_work(const collie_work *w);
/* allgatherv, alltoallv: check the user's counts and displacements and
 * point a at a copy in *owned (the work frees it); sets args.count. */
int cl_coll_v_prepare(collie_comm *c, collie_coll_args *a, size_t **owned);
/* coll_cancel.c: the cancel hook of collective works (cl_work_ops.cancel) */
bool cl_coll_cancel(collie_work *w, int status, const char *msg);
/* end cw now with `status` (no report): finished at once, or, when a
 * device may still use its buffers, ended by its backend (ops->cancel)
 * once the device is quiet. Any thread. False if it was ended already. */
bool cl_coll_end(cl_coll_work *cw, int status, const char *msg);
/* desync.c: explain a deadline before ending the work (loop). False when
 * the comm has no report to make (the caller ends the work now). */
bool cl_desync_start(cl_coll_work *cw);
void cl_desync_flush(collie_comm *c);

/* comm_create.c: create a child of `parent` (collie_comm_split and
 * new_group): like collie_comm_create, but the backends the child shares
 * with the parent are built by ops->split, and a child without a backend
 * spec of its own inherits the parent's. `members`: new_group's list as
 * text (every member must have been given the same: a conflict otherwise),
 * or NULL. */
/* Waits for w (bounded by its own deadline) in 20 ms slices while watching
 * `watched`: true once w has ended (*status: its status), false as soon as
 * `watched` has failed with w still pending (comm_split.c). */
bool cl_comm_wait_watching(collie_comm *watched, collie_work *w, int *status);
int cl_comm_create_child(collie_comm *parent, int rank, int size, const collie_comm_opts *o,
                         int color, int key, const char *members, collie_comm **out);

/* A successor: a comm made from another's membership by a shrink, a grow
 * or a join (comm_shrink.c, comm_grow.c). Its rendezvous is posted by
 * cl_comm_create_successor: like collie_comm_create_post with o (o->post:
 * how its work completes), `spec` (NULL: o's backend), `members` (what the
 * members agreed: every one must have been given the same), `family` (the
 * name joiners ask for) and a copy of map[old rank] = new rank (NULL: none).
 * Nothing is shared with the old comm but the store's connection, and for a
 * shrink the old comm's backends (ops->shrink builds from them). */
typedef struct cl_successor_args {
    collie_engine *engine;
    collie_store *store;
    int rank, size;
    const collie_comm_opts *o;
    const cl_backend_spec *spec;
    const char *members, *family;
    const int *map;
    int map_n;
    /* its line: how it is made ("shrink", "grow", "join"), from which comm
     * (NULL: a joiner) and the shrinks and grows before it */
    const char *how;
    const collie_comm *from;
    uint32_t shrinks, grows;
    /* a shrink's only (grow and join leave them NULL / 0: a fresh init):
     * the old comm, whose backends may build the new comm's (ops->shrink),
     * and its ranks left out, sorted */
    collie_comm *shrunk_from;
    const int *excluded;
    int nexcluded;
} cl_successor_args;
int cl_comm_create_successor(const cl_successor_args *a, collie_comm **out, collie_work **work);

/* The works that make a successor start with this (collie_comm_work_comm
 * takes `made`; cl_successor_fini: the create work released and a comm
 * never taken destroyed, when the work is freed). */
typedef struct cl_successor_work {
    collie_work base;
    collie_comm *made;
    collie_work *create; /* its rendezvous (the work's reference) */
    _Atomic bool taken;
} cl_successor_work;
void cl_successor_fini(cl_successor_work *s);
/* the blocking forms: wait for w (it ends itself by its deadline), take its
 * comm, release w; on failure the last error is the work's message */
int cl_successor_wait(collie_work *w, collie_comm **out);
/* init a work that bounds itself (destroy, shrink, grow, join): it
 * completes as o asks (cb, cb_arg, cq, tag) and has no deadline of its own
 * (o->timeout_ms is ignored) */
int cl_comm_work_init(collie_work *w, collie_engine *e, const cl_work_ops *ops,
                      const collie_post_opts *o);
/* note in c's line that `name` succeeded it (any thread) */
void cl_comm_note_successor(collie_comm *c, const char *name);
/* the successor's options: o's, the old comm's for what o leaves unset (all
 * of them, its error callback too, when o is NULL); *spec: o's backend,
 * parsed, else the old comm's */
int cl_comm_successor_opts(const collie_comm *c, const collie_comm_opts *o, collie_comm_opts *out,
                           cl_backend_spec *spec);
/* comm_create.c: a comm name's rules (1 to 64 of [A-Za-z0-9_.-]) */
int cl_comm_check_name(const char *name);
/* A shrink's or grow's turn on a comm (under c->mu): begin refuses a second
 * one while one runs (ESTATE) or once one succeeded (the comm is
 * superseded: ESTATE naming its successor) and gives the attempt's number;
 * end frees the slot: `spent` (the attempt's new comm was being made, so
 * every member sees it fail) moves the number on, so members retry in step
 * (a call refused, cancelled or failed before that keeps it). */
int cl_change_begin(collie_comm *c, struct cl_change_slot *s, const char *what, int *attempt);
void cl_change_end(collie_comm *c, struct cl_change_slot *s, int attempt, bool ok, bool spent);
/* comm_grow.c: is w a shrink's, a grow's or a join's work? */
bool cl_comm_is_grow_work(const collie_work *w);
/* comm_split.c: a child's name "<parent>.<suffix>" (hashed past 64
 * characters); a member list as the rendezvous compares it (cut, with a
 * hash of the whole, past `len`) */
void cl_comm_child_name(const collie_comm *parent, const char *suffix, char *out, size_t len);
void cl_comm_members_text_of(const char *list, char *out, size_t len);

/* the set of left-out ranks as text ("1,3"; "-": none),
 * parsed strictly (ranks ascending in [0, n)); this rank was left out
 * (`by`: the rank that said so, -1: its own shrink; an event, and the
 * comm's fault on the loop); a "shrunk <from> <set>" control message */
/* comm_shrink_view.c: the ranks this rank knows failed (failed[r] = 1);
 * is the comm healthy (no fault, nothing failed)? */
void cl_shrink_view(collie_comm *c, uint8_t *failed);
bool cl_shrink_nothing_failed(collie_comm *c);
size_t cl_shrink_set_text_max(int n);
void cl_shrink_set_format(const uint8_t *set, int n, char *buf, size_t len);
bool cl_shrink_set_parse(const char *s, size_t len, int n, uint8_t *set);
void cl_comm_shrink_excluded(collie_comm *c, int by);
/* the fault kind that describes set `out` (peer_dead, peer_left, else
 * peer_stuck); abort c naming `out` if it had not failed (a shrink's
 * revoke: its notice names them) */
int cl_shrink_set_kind(collie_comm *c, const uint8_t *out);
void cl_shrink_revoke(collie_comm *c, const uint8_t *out);
void cl_comm_shrink_notice(collie_comm *c, int from, const char *set, size_t len);
bool cl_comm_is_shrink_work(const collie_work *w);

/* comm_rendezvous.c: post c's rendezvous (the "comm.create" work, *work:
 * the caller's reference), whose start makes c a resident of its engine.
 * On an error the caller's reference on c is gone (released) and
 * collie_last_error says why. Caller's thread; never waits for the loop. */
int cl_comm_create_start(collie_comm *c, const collie_post_opts *post, collie_work **work);
/* comm_rendezvous.c: give up a create in flight (loop) without a split
 * outcome: unless every member already passed its barrier (the comm is
 * made: the create then succeeds, as the others' do), poison its
 * generation with "<why>" so every member's create fails with `status`;
 * one that has not joined is cancelled (it took no slot). Once per create. */
void cl_comm_create_withdraw(collie_work *create, int status, const char *why);
/* the comm a "comm.create" work makes; NULL for any other work */
collie_comm *cl_comm_create_work_comm(const collie_work *w);
/* comm_rendezvous_text.c: a poison's status, why and origin (the rank
 * that wrote it, -1: unknown) ("<status>@<origin>|<why>");
 * the message of a barrier timeout naming who never arrived (`list`: the
 * "arrived" value, NULL: unknown) */
int cl_rendezvous_poison_parse(const char *val, size_t len, char *why, size_t wlen, int *origin);
void cl_rendezvous_timeout_text(const collie_comm *c, const char *list, size_t len, char *out,
                                size_t outlen);
/* comm_rendezvous_text.c: before the barrier, "<rank> " to "arrived" and
 * this process for health (unawaited); a poison "<status>@<rank>|<why>" of c's
 * generation (compare_set: the first outcome wins) and +2^30 on its
 * barrier (unawaited). Loop. */
void cl_rendezvous_announce(collie_comm *c, int32_t timeout_ms);
void cl_rendezvous_post_poison(collie_comm *c, int status, const char *why);

/* comm_rendezvous.c: a backend instance finished its init (loop) */
void cl_comm_backend_init_done(collie_bcomm *bc, int status, const char *msg);
/* policy.c: the error policy COLLIE_BLOCKING_WAIT / COLLIE_ASYNC_ERROR_HANDLING
 * ask for (COLLIE_EINVAL for a conflict or an unknown value) */
int cl_comm_policy_from_env(collie_error_policy *out);
/* trust.c: may a comm named `name` be made over `store`? Without a shared
 * secret its store must be on loopback (else COLLIE_EINVAL saying why),
 * unless COLLIE_INSECURE=1; said once per process. Caller's thread. */
int cl_comm_trust_check(collie_store *store, const char *name);
/* comm.c: make the comm a resident of its engine (loop: the create work's
 * start, so no post waits for the loop); false once the engine closes */
bool cl_comm_attach_on_loop(collie_comm *c);

/* registry (comm.c) */
void cl_comm_unregister(collie_comm *c);

#endif
