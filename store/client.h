/*
 * client.h — private structures of the store client, shared by client.c
 * (the connection: connect, reconnect, in-flight table), client_hs.c (the
 * handshake: HELLO, token proofs), request.c (requests as works: encoding, results, accessors) and
 * api.c (the public collie_store_* functions and handles).
 *
 * Ownership: a cl_store_core is one connection to one server, shared by a
 * handle and all its prefix views. It is refcounted: one reference per
 * handle and one per request alive (released by the request's free hook),
 * so the memory outlives every work that points at it. Its libevent
 * objects are closed on the loop thread when the last handle goes away or
 * when the engine shuts down, whichever comes first.
 */
#ifndef CL_STORE_CLIENT_H
#define CL_STORE_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "collie.h"
#include "engine/engine.h"
#include "store/addr.h"
#include "base/idmap.h"
#include "store/proto.h"
#include "work/work.h"

struct bufferevent;
struct event;

typedef struct cl_store_core cl_store_core;

/* Where a request is, from the connection's point of view (loop thread). */
enum cl_store_req_where {
    CL_STORE_REQ_NOWHERE = 0, /* not started, answered, or failed */
    CL_STORE_REQ_QUEUED,      /* waiting for the connection to be ready */
    CL_STORE_REQ_SENT,        /* written; its reply is awaited (in core->sent) */
};

typedef struct cl_store_req {
    collie_work work; /* first: the work module sees only this */
    cl_store_core *core;
    uint8_t op;
    uint32_t nkeys; /* keys in the request (multi_get checks its reply against it) */

    /* loop thread */
    int where;
    bool replied;
    uint64_t conn_gen;   /* the connection it was sent on */
    cl_idnode node;      /* node.key = request id while SENT */
    cl_list_node link;   /* core's queued or sent list */
    cl_store_wbuf frame; /* the encoded request; freed once written */

    /* immutable after post: context for messages (" (key 'a')") */
    char desc[112];

    /* results: written on the loop thread between claim and publish */
    int64_t ival;
    uint32_t nvals;
    cl_store_bytes *vals; /* point into `block` */
    uint8_t *block;
} cl_store_req;

enum cl_store_conn_state {
    CL_STORE_IDLE = 0,   /* no connection; the next request makes one */
    CL_STORE_CONNECTING, /* TCP connect in progress */
    CL_STORE_HELLO,      /* HELLO sent, waiting for the server's */
    CL_STORE_AUTH,       /* our AUTH sent, waiting for the verdict */
    CL_STORE_READY,      /* requests flow */
    CL_STORE_BACKOFF,    /* waiting to retry a failed connect */
    CL_STORE_CLOSED,     /* the handle was destroyed or the engine stopped */
};

struct cl_store_core {
    collie_engine *engine;
    _Atomic int refs;     /* handles + live requests */
    _Atomic int handles;  /* collie_store handles sharing this core */
    char *addr;           /* "host:port" as given */
    cl_store_addrs addrs; /* what addr resolves to, tried in order (client.c) */
    char *token;          /* NULL: no authentication */
    size_t token_len;
    int32_t timeout_ms;     /* default op timeout (> 0 or COLLIE_TIMEOUT_INFINITE) */
    int32_t max_backoff_ms; /* reconnect backoff cap */
    _Atomic uint64_t seq;   /* request sequence numbers */
    _Atomic bool shut;      /* loop-side teardown done; destroy only frees memory */
    cl_resident resident;
    int init_status;           /* result of the loop-side part of create */
    _Atomic uint64_t connects; /* connections made (stats; read on any thread) */

    /* loop thread */
    int state;
    struct bufferevent *bev;
    struct event *backoff_ev;
    uint32_t backoff_ms; /* next retry delay */
    int addr_i;          /* the address the connection uses or tries */
    int addr_failed;     /* addresses that failed in a row (a round: all of them) */
    /* connection attempts failing since (0: not failing), last logged */
    int64_t failing_since_ns, nagged_ns;
    uint32_t next_req_id;
    uint64_t conn_gen; /* bumped whenever a connection goes away */
    cl_list queued;    /* QUEUED, in post order */
    cl_list sent;      /* SENT, newest first */
    cl_idmap sent_ids; /* SENT, by request id */
    uint8_t cnonce[CL_STORE_NONCE_LEN];
    int auth_status; /* set when we refused the server: fail with this */
    char auth_msg[256];
    uint64_t rng;

    /* read by describe() on any thread */
    pthread_mutex_t mu;
    bool connected;
    char last_err[200]; /* why the last connection attempt or connection failed */
};

/* ---- client.c (the connection) ------------------------------------------------ */

/* cl_store_core_create: parse and resolve addr, register with the engine.
 * Errors: EINVAL (address, token, options), ENOMEM, ECLOSED. */
int cl_store_core_create(collie_engine *e, const char *addr, const collie_store_opts *o,
                         cl_store_core **out);
void cl_store_core_hold(cl_store_core *c);
/* drop a reference; the last one frees the memory (any thread) */
void cl_store_core_release(cl_store_core *c);
/* the last handle is gone: close the connection on the loop thread (pending
 * requests fail with ECLOSED), then drop the handles' reference */
void cl_store_core_close(cl_store_core *c);

/* loop thread: the request's start and detach hooks */
void cl_store_core_start(cl_store_req *r);
void cl_store_core_detach(cl_store_req *r);

/* any thread: "store 1.2.3.4:5", or "store 1.2.3.4:5, not connected: <last
 * error>" while the connection is down */
void cl_store_core_describe(cl_store_core *c, char *buf, size_t len);

/* ---- between client.c and client_hs.c (loop thread only) --------------------- */

/* cl_store_cli_conn_lost (client.c): the connection or the attempt is
 * over; c->bev is freed. The sent requests fail (COLLIE_EPEER, or
 * COLLIE_EPROTO). fatal, before READY: do not retry; fail the queued
 * requests with `status` too. */
void cl_store_cli_conn_lost(cl_store_core *c, int status, bool fatal, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* cl_store_cli_ready (client.c): the handshake is done; send what is queued. */
void cl_store_cli_ready(cl_store_core *c);
/* cl_store_cli_send_ctl (client.c): queue a small control frame. */
void cl_store_cli_send_ctl(cl_store_core *c, const cl_store_wbuf *b);
/* cl_store_cli_on_connected (client_hs.c): TCP is up; set the socket's
 * options and send HELLO (state HELLO), or end the connection. */
void cl_store_cli_on_connected(cl_store_core *c);
/* cl_store_cli_on_handshake (client_hs.c): a frame in state HELLO or AUTH.
 * Returns false if the connection is gone. */
bool cl_store_cli_on_handshake(cl_store_core *c, const cl_store_hdr *h, uint8_t op,
                               const uint8_t *body);

/* ---- request.c ------------------------------------------------------------------ */

/* cl_store_req_new: a request of `op` with its frame header written; the
 * caller appends the body to r->frame and calls cl_store_req_post.
 * Errors: EINVAL (post options), ENOMEM; nothing to clean up then. */
int cl_store_req_new(cl_store_core *c, uint8_t op, const collie_post_opts *o, cl_store_req **out);
/* cl_store_req_post: finish the frame and hand the work to the engine. On
 * error the request is released (no side effects). */
int cl_store_req_post(cl_store_req *r, collie_work **out);
/* cl_store_req_reply: loop thread: the reply to r arrived; decode the body,
 * fill the results and finish r. Returns COLLIE_OK or COLLIE_EPROTO (a
 * malformed reply; r has been failed with it). */
int cl_store_req_reply(cl_store_req *r, const cl_store_hdr *h, const uint8_t *body);

#endif
