/*
 * epoll_server.c — what an inference server does with collie: its own event
 * loop (libevent: epoll underneath) keeps answering HTTP while collectives
 * run, and a dead peer costs a re-created communicator, not the process.
 *
 *   build/bin/collie-run -n 2 --restarts 1 -- build/examples/epoll_server \
 *       [--policy abort|blocking] [--steps N] [--interval-ms MS] [--port P]
 *
 * Each rank serves http://127.0.0.1:<port> (port P + rank, or any free one):
 *   /healthz  its state, the comm's generation, the steps done
 *   /metrics  collie_comm_get_stats and collie_engine_get_stats in
 *             Prometheus' text format
 * and every --interval-ms runs one "model step": an allreduce whose result it
 * checks. After --steps good steps in one generation every rank exits 0.
 *
 * How it uses collie:
 *  - The comm is started with collie_comm_create_post: the loop never
 *    blocks on the rendezvous. Collectives posted before it is done queue
 *    behind it (and fail with its error), so the first step is posted at
 *    once.
 *  - Every collective is attached to one completion queue whose fd sits in
 *    the event loop. The fd is readable while the queue is not empty
 *    (level-style), and one wake-up may stand for several completions: each
 *    wake-up drains the queue. With level-triggered epoll (libevent's
 *    default) a partial drain would only cost another wake-up; with
 *    edge-triggered epoll (EV_ET) it would strand the works left behind.
 *  - --policy abort (COLLIE_POLICY_ABORT_COMM, the default): on a fault the
 *    watchdog aborts the comm and tells the peers; the step's work fails.
 *    --policy blocking (COLLIE_POLICY_BLOCKING_WAIT): only the work fails and
 *    the application decides — here it aborts the comm itself. Either way
 *    the server then destroys the comm and posts the creation of the next
 *    generation; collie-run --restarts starts the dead rank again, which
 *    joins it (COLLIE_RESTART_COUNT says which life a process is in).
 *  - The comm's event fd sits in the loop too: a peer's death is an event
 *    on every rank (same host: through a pidfd, also on ranks with no
 *    connection to it), so the server recovers at once rather than at its
 *    next step, and the fault's kind and ranks (collie_comm_fault) say who
 *    died, as data. /healthz shows every peer's state (collie_comm_health).
 *  - The dead comm goes with collie_comm_destroy_post: the destroy's own
 *    waits (for the peers to have read the abort notice, well under a
 *    second) run on collie's progress thread, so the loop keeps answering
 *    through detection, destroy and re-creation.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "collie.h"

enum { COUNT = 1024 };
#define STEP_TIMEOUT_MS   3000  /* a stopped peer fails the step after this */
#define CREATE_TIMEOUT_MS 20000 /* a new generation waits this long for every rank */
#define MAX_RECREATIONS   3     /* then the server gives up (exit 1) */

typedef struct server {
    struct event_base *base;
    struct evhttp *http;
    struct event *cq_ev, *step_ev, *sigint_ev, *sigterm_ev;
    struct event *comm_ev; /* the comm's event fd (NULL between generations) */
    collie_engine *engine;
    collie_store *store;
    collie_cq *cq;
    collie_comm *comm; /* NULL between a destroy and the next create */
    collie_work *create_work;
    collie_error_policy policy;
    int rank, size, steps_wanted, interval_ms;
    int steps_done;     /* good steps in this generation */
    int step_posted;    /* the step in flight, or -1 */
    uint64_t recreated; /* generations built after a fault */
    uint64_t http_requests;
    int exit_code;
    float buf[COUNT];
} server;

static void fail(const char *what, int rc) {
    fprintf(stderr, "%s: %s (%s)\n", what, collie_status_name(rc), collie_last_error());
    exit(1);
}

/* ---- the communicator --------------------------------------------------------------- */

static void comm_events(evutil_socket_t fd, short what, void *arg);

static void comm_start(server *s) {
    collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
    o.name = "srv";
    o.policy = s->policy;
    o.create_timeout_ms = CREATE_TIMEOUT_MS;
    int rc = collie_comm_create_post(s->engine, s->store, s->rank, s->size, &o, &s->comm,
                                     &s->create_work);
    if (rc != COLLIE_OK) fail("collie_comm_create_post", rc);
    s->comm_ev =
        event_new(s->base, collie_comm_event_fd(s->comm), EV_READ | EV_PERSIST, comm_events, s);
    if (!s->comm_ev || event_add(s->comm_ev, NULL) != 0) fail("the comm's event fd", COLLIE_ENOMEM);
    s->steps_done = 0;
}

/* In the loop (recovery) the destroy is posted and not waited for: its
 * bounded waits run on collie's progress thread. At exit (`wait`) it is
 * waited for, so it ends gracefully before the engine goes. */
static void comm_stop(server *s, bool wait) {
    event_free(s->comm_ev); /* before destroy closes its fd */
    s->comm_ev = NULL;
    collie_work_release(s->create_work); /* done by now, or failed with the comm */
    s->create_work = NULL;
    collie_work *d;
    int rc = collie_comm_destroy_post(s->comm, NULL, &d);
    if (rc != COLLIE_OK) fail("collie_comm_destroy_post", rc);
    if (wait) collie_work_wait(d, COLLIE_TIMEOUT_INFINITE); /* bounded by its steps */
    collie_work_release(d);
    s->comm = NULL;
}

/* ---- the model step ------------------------------------------------------------------- */

static void recover(server *s, const char *why);

static void step_post(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    server *s = arg;
    if (!s->comm || s->step_posted >= 0) return; /* one step at a time */
    for (int i = 0; i < COUNT; i++)
        s->buf[i] = (float)(s->rank + 1 + s->steps_done);
    collie_post_opts po = COLLIE_POST_OPTS_INIT;
    po.cq = s->cq;
    po.timeout_ms = STEP_TIMEOUT_MS;
    collie_work *w;
    int rc = collie_allreduce(s->comm, s->buf, s->buf, COUNT, COLLIE_FP32, COLLIE_SUM, &po, &w);
    if (rc != COLLIE_OK) { /* refused: the comm failed between two steps */
        recover(s, collie_last_error());
        return;
    }
    collie_work_release(w); /* the queue holds its own reference */
    s->step_posted = s->steps_done;
}

/* A step failed (its work, or the post itself once the comm had failed):
 * give this generation up and post the creation of the next. */
static void drain_events(server *s);

static void recover(server *s, const char *why) {
    drain_events(s); /* what the fd holds already: before the comm (and its fd) go */
    collie_fault f = COLLIE_FAULT_INIT;
    collie_comm_fault(s->comm, &f);
    char ranks[64] = "";
    for (int i = 0, at = 0; i < f.nranks && i < COLLIE_FAULT_RANKS && at < 48; i++)
        at += snprintf(ranks + at, sizeof ranks - (size_t)at, "%s%d", i ? "," : "", f.ranks[i]);
    printf("rank %d: step %d failed: %s; comm status %s, fault %s ranks [%s]\n", s->rank,
           s->steps_done, why, collie_status_name(f.status), collie_fault_kind_name(f.kind), ranks);
    /* BLOCKING_WAIT left the comm to us; ABORT_COMM aborted it already */
    collie_comm_abort(s->comm, "the server gives this generation up");
    comm_stop(s, false);
    if (s->recreated == MAX_RECREATIONS) {
        printf("rank %d: %d re-creations failed; giving up\n", s->rank, MAX_RECREATIONS);
        s->exit_code = 1;
        event_base_loopexit(s->base, NULL);
        return;
    }
    comm_start(s);
    s->recreated++;
    printf("rank %d: re-creating the comm\n", s->rank); /* its generation: once it is made */
    fflush(stdout);
}

static void step_done(server *s, collie_work *w) {
    s->step_posted = -1;
    if (collie_work_result(w) != COLLIE_OK) {
        recover(s, collie_work_error_message(w));
        return;
    }
    /* every rank r contributed r + 1 + step */
    float want = (float)(s->size * (s->size + 1) / 2 + s->size * s->steps_done);
    for (int i = 0; i < COUNT; i++)
        if (s->buf[i] != want) {
            printf("rank %d: step %d: element %d is %g, not %g\n", s->rank, s->steps_done, i,
                   (double)s->buf[i], (double)want);
            s->exit_code = 1;
            event_base_loopexit(s->base, NULL);
            return;
        }
    s->steps_done++;
    if (s->steps_done % 25 == 0 || s->steps_done == s->steps_wanted) {
        printf("rank %d: generation %llu: %d steps ok\n", s->rank,
               (unsigned long long)collie_comm_generation(s->comm), s->steps_done);
        fflush(stdout);
    }
    if (s->steps_done == s->steps_wanted) event_base_loopexit(s->base, NULL);
}

/* The comm's event fd is readable: log every event; a dead peer or a
 * failed comm ends this generation now (a step in flight fails by the
 * abort, and its completion recovers; else recover here). */
/* log every pending event; true if one ends this generation */
static bool pop_events(server *s) {
    collie_comm_event ev = COLLIE_COMM_EVENT_INIT;
    bool fatal = false;
    while (s->comm && collie_comm_event_pop(s->comm, &ev) == COLLIE_OK) {
        printf("rank %d: event %s rank %d\n", s->rank, collie_event_kind_name(ev.kind), ev.rank);
        fatal = fatal || ev.kind == COLLIE_EVENT_PEER_DEAD || ev.kind == COLLIE_EVENT_COMM_FAULTED;
    }
    fflush(stdout);
    return fatal;
}

static void drain_events(server *s) { (void)pop_events(s); }

static void comm_events(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    server *s = arg;
    bool fatal = pop_events(s);
    if (!fatal || !s->comm) return;
    if (s->step_posted >= 0)
        collie_comm_abort(s->comm, "a peer died");
    else
        recover(s, "a peer died between steps");
}

/* The queue's fd is readable: take every completion there is (see the
 * notes on draining). */
static void cq_ready(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    server *s = arg;
    collie_work *w;
    while (collie_cq_pop(s->cq, 0, &w) == COLLIE_OK) {
        step_done(s, w);
        collie_work_release(w);
    }
}

/* ---- HTTP ------------------------------------------------------------------------------ */

static void prom_counter(struct evbuffer *b, const char *name, const char *help, const char *type,
                         const char *labels, unsigned long long v) {
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %llu\n", name, help, name, type,
                        name, labels, v);
}

/* collie_comm_get_stats and collie_engine_get_stats as Prometheus text. */
static void metrics(server *s, struct evbuffer *b) {
    char lb[96];
    snprintf(lb, sizeof lb, "comm=\"srv\",rank=\"%d\"", s->rank);
    collie_engine_stats es = COLLIE_ENGINE_STATS_INIT;
    if (collie_engine_get_stats(s->engine, &es) == COLLIE_OK) {
        prom_counter(b, "collie_engine_works_posted_total", "Works posted to the engine.",
                     "counter", lb, (unsigned long long)es.works_posted);
        prom_counter(b, "collie_engine_works_in_flight", "Works posted and not retired.", "gauge",
                     lb, (unsigned long long)es.works_in_flight);
        prom_counter(b, "collie_engine_stalls_total", "Progress-loop stalls reported.", "counter",
                     lb, (unsigned long long)es.stalls);
    }
    prom_counter(b, "server_comm_recreations_total", "Generations built after a fault.", "counter",
                 lb, (unsigned long long)s->recreated);
    prom_counter(b, "server_http_requests_total", "HTTP requests served.", "counter", lb,
                 (unsigned long long)s->http_requests);
    collie_comm_stats st = COLLIE_COMM_STATS_INIT;
    if (!s->comm || collie_comm_get_stats(s->comm, &st) != COLLIE_OK) return;
    prom_counter(b, "collie_comm_generation", "Incarnation of the comm.", "gauge", lb,
                 (unsigned long long)st.generation);
    prom_counter(b, "collie_comm_works_posted_total", "Collectives and send/recv posted.",
                 "counter", lb, (unsigned long long)st.posted);
    prom_counter(b, "collie_comm_works_completed_total", "Works ended with COLLIE_OK.", "counter",
                 lb, (unsigned long long)st.completed);
    prom_counter(b, "collie_comm_works_in_flight", "Works posted and not ended.", "gauge", lb,
                 (unsigned long long)st.in_flight);
    prom_counter(b, "collie_comm_bytes_total", "Payload bytes of completed works.", "counter", lb,
                 (unsigned long long)st.bytes);
    prom_counter(b, "collie_comm_connections", "Open peer connections.", "gauge", lb,
                 st.connections);
    evbuffer_add_printf(b, "# HELP collie_comm_works_failed_total Works ended with an error.\n"
                           "# TYPE collie_comm_works_failed_total counter\n");
    for (int i = 1; i < COLLIE_STATS_STATUSES; i++)
        if (st.failed_by_status[i])
            evbuffer_add_printf(b, "collie_comm_works_failed_total{%s,status=\"%s\"} %llu\n", lb,
                                collie_status_name(-i), (unsigned long long)st.failed_by_status[i]);
    evbuffer_add_printf(b, "# HELP collie_comm_latency_seconds Post to completion.\n"
                           "# TYPE collie_comm_latency_seconds histogram\n");
    for (int op = 0; collie_stats_op_name(op); op++) {
        const collie_latency_histogram *h = &st.latency[op];
        if (!h->count) continue;
        unsigned long long cum = 0;
        for (int i = 0; i < COLLIE_LATENCY_BUCKETS; i++) {
            cum += h->buckets[i];
            int64_t le = collie_latency_bucket_le_us(i);
            if (le < 0)
                evbuffer_add_printf(
                    b, "collie_comm_latency_seconds_bucket{%s,op=\"%s\",le=\"+Inf\"} %llu\n", lb,
                    collie_stats_op_name(op), cum);
            else
                evbuffer_add_printf(
                    b, "collie_comm_latency_seconds_bucket{%s,op=\"%s\",le=\"%g\"} %llu\n", lb,
                    collie_stats_op_name(op), (double)le / 1e6, cum);
        }
        evbuffer_add_printf(b, "collie_comm_latency_seconds_sum{%s,op=\"%s\"} %.9f\n", lb,
                            collie_stats_op_name(op), (double)h->sum_ns / 1e9);
        evbuffer_add_printf(b, "collie_comm_latency_seconds_count{%s,op=\"%s\"} %llu\n", lb,
                            collie_stats_op_name(op), (unsigned long long)h->count);
    }
}

static void http_request(struct evhttp_request *req, void *arg) {
    server *s = arg;
    s->http_requests++;
    const char *uri = evhttp_request_get_uri(req);
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    if (strcmp(uri, "/metrics") == 0) {
        metrics(s, b);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "text/plain; version=0.0.4");
        evhttp_send_reply(req, HTTP_OK, "OK", b);
    } else if (strcmp(uri, "/healthz") == 0) {
        int st = COLLIE_OK;
        const char *msg = "";
        if (s->comm) collie_comm_error(s->comm, &st, &msg);
        evbuffer_add_printf(b, "rank %d %s generation %llu steps %d%s%s\n", s->rank,
                            !s->comm          ? "down"
                            : st == COLLIE_OK ? "ok"
                                              : "failed",
                            (unsigned long long)(s->comm ? collie_comm_generation(s->comm) : 0),
                            s->steps_done, *msg ? ": " : "", msg);
        collie_peer_health h[64];
        int n = s->comm ? collie_comm_health(s->comm, h, 64) : 0;
        evbuffer_add_printf(b, "peers");
        for (int r = 0; r < n; r++)
            evbuffer_add_printf(b, " %d:%s", r, collie_peer_state_name(h[r].state));
        evbuffer_add_printf(b, "\n");
        evhttp_send_reply(req, HTTP_OK, "OK", b);
    } else {
        evhttp_send_error(req, HTTP_NOTFOUND, NULL);
    }
    evbuffer_free(b);
}

static int http_start(server *s, int port) {
    s->http = evhttp_new(s->base);
    struct evhttp_bound_socket *h =
        s->http ? evhttp_bind_socket_with_handle(s->http, "127.0.0.1", (uint16_t)port) : NULL;
    if (!h) return -1;
    evhttp_set_gencb(s->http, http_request, s);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&a, &len) != 0) return -1;
    return ntohs(a.sin_port);
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    server *s = arg;
    printf("rank %d: signal %d, stopping\n", s->rank, (int)sig);
    s->exit_code = 128 + (int)sig;
    event_base_loopexit(s->base, NULL);
}

/* ---- main ------------------------------------------------------------------------------- */

static int arg_int(const char *v, const char *name) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < 0 || x > 1000000) {
        fprintf(stderr, "epoll_server: %s needs a number, not '%s'\n", name, v);
        exit(2);
    }
    return (int)x;
}

/* The command line into s and *port; 0, or 2 after the usage. */
static int parse_args(int argc, char **argv, server *s, int *port) {
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(argv[i], "--policy") == 0 && strcmp(v, "abort") == 0) {
            s->policy = COLLIE_POLICY_ABORT_COMM;
        } else if (strcmp(argv[i], "--policy") == 0 && strcmp(v, "blocking") == 0) {
            s->policy = COLLIE_POLICY_BLOCKING_WAIT;
        } else if (strcmp(argv[i], "--steps") == 0) {
            s->steps_wanted = arg_int(v, "--steps");
        } else if (strcmp(argv[i], "--interval-ms") == 0) {
            s->interval_ms = arg_int(v, "--interval-ms");
        } else if (strcmp(argv[i], "--port") == 0) {
            *port = arg_int(v, "--port");
        } else {
            fprintf(stderr, "usage: epoll_server [--policy abort|blocking] [--steps N] "
                            "[--interval-ms MS] [--port P]\n");
            return 2;
        }
        i++;
    }
    return 0;
}

/* The loop's events: the cq's fd, the step timer, SIGINT and SIGTERM.
 * 0, or -1 if one could not be added. */
static int events_start(server *s) {
    s->cq_ev = event_new(s->base, collie_cq_fd(s->cq), EV_READ | EV_PERSIST, cq_ready, s);
    s->step_ev = event_new(s->base, -1, EV_PERSIST, step_post, s);
    s->sigint_ev = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sigterm_ev = evsignal_new(s->base, SIGTERM, on_signal, s);
    struct timeval tick = {s->interval_ms / 1000, (s->interval_ms % 1000) * 1000};
    if (!s->cq_ev || !s->step_ev || !s->sigint_ev || !s->sigterm_ev || event_add(s->cq_ev, NULL) ||
        event_add(s->step_ev, &tick) || event_add(s->sigint_ev, NULL) ||
        event_add(s->sigterm_ev, NULL))
        return -1;
    return 0;
}

int main(int argc, char **argv) {
    server s = {.policy = COLLIE_POLICY_ABORT_COMM,
                .steps_wanted = 50,
                .interval_ms = 20,
                .step_posted = -1};
    int port = 0;
    if (parse_args(argc, argv, &s, &port) != 0) return 2;
    const char *r = getenv("COLLIE_RANK"), *n = getenv("COLLIE_WORLD_SIZE");
    if (!r || !n) {
        fprintf(stderr, "epoll_server: run it under collie-run (COLLIE_RANK is not set)\n");
        return 2;
    }
    s.rank = atoi(r);
    s.size = atoi(n);
    const char *restarts = getenv("COLLIE_RESTART_COUNT");

    s.base = event_base_new();
    if (!s.base) return 1;
    int rc = collie_engine_create(NULL, &s.engine);
    if (rc != COLLIE_OK) fail("collie_engine_create", rc);
    rc = collie_store_connect(s.engine, NULL, NULL, &s.store); /* COLLIE_STORE_ADDR */
    if (rc != COLLIE_OK) fail("collie_store_connect", rc);
    rc = collie_cq_create(&s.cq);
    if (rc != COLLIE_OK) fail("collie_cq_create", rc);
    int bound = http_start(&s, port ? port + s.rank : 0);
    if (bound < 0) {
        fprintf(stderr, "epoll_server: cannot serve HTTP: %s\n", strerror(errno));
        return 1;
    }
    if (events_start(&s) != 0) return 1;
    comm_start(&s);
    printf("rank %d: pid %d life %s serving http://127.0.0.1:%d (policy %s)\n", s.rank,
           (int)getpid(), restarts ? restarts : "0", bound,
           s.policy == COLLIE_POLICY_BLOCKING_WAIT ? "blocking" : "abort");
    fflush(stdout);
    step_post(-1, 0, &s);

    event_base_dispatch(s.base);

    if (s.exit_code == 0 && s.steps_done == s.steps_wanted)
        printf("rank %d: done: %d steps in generation %llu, %llu re-creations, %llu HTTP "
               "requests\n",
               s.rank, s.steps_done, (unsigned long long)collie_comm_generation(s.comm),
               (unsigned long long)s.recreated, (unsigned long long)s.http_requests);
    comm_stop(&s, true);
    collie_cq_destroy(s.cq);
    collie_store_destroy(s.store);
    collie_engine_destroy(s.engine);
    event_free(s.cq_ev);
    event_free(s.step_ev);
    event_free(s.sigint_ev);
    event_free(s.sigterm_ev);
    evhttp_free(s.http);
    event_base_free(s.base);
    return s.exit_code;
}
