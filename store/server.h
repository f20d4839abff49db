/*
 * server.h — private structures of the store server, shared by
 * server.c (lifecycle, listener), srv_conn.c (connections: framing,
 * handshake, teardown) and srv_ops.c (executing requests on the key table).
 *
 * Everything below the "loop thread" markers belongs to the engine's
 * progress thread; the server never takes a lock.
 */
#ifndef CL_STORE_SERVER_H
#define CL_STORE_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "collie.h"
#include "engine/engine.h"
#include "base/idmap.h"
#include "store/addr.h"
#include "store/kv.h"
#include "store/proto.h"

struct event;
struct evbuffer;
struct evconnlistener;
struct event;

/* Waiting requests one connection may hold at once. */
#define CL_STORE_SRV_MAX_WAITS 65536
/* Stop reading a connection whose unsent replies exceed this; resume once
 * every queued reply has been sent (a client that pipelines gets but never
 * reads). */
#define CL_STORE_SRV_OUT_HIGH (64u * 1024u * 1024u)
/* Frames before authentication are tiny. */
#define CL_STORE_SRV_HELLO_MAX_BODY 256u
/* Connections that have not authenticated yet, at most, per server: the
 * next one closes the oldest (srv_conn.c). Counted apart from
 * max_connections, which bounds the authenticated ones. */
#define CL_STORE_SRV_PENDING_MAX 128u
/* At most one refusal logged per this (with the count of the others). */
#define CL_STORE_SRV_REFUSED_LOG_MS 5000

typedef struct store_srv_conn store_srv_conn;

/* A waiting request (get, wait, multi_get, barrier) of one connection. */
typedef struct store_srv_wait {
    cl_store_waiter kw; /* registered in the server's key table */
    cl_idnode node;     /* node.key = the request id, in conn->waits */
    cl_list_node link;  /* its conn's wait_list */
    store_srv_conn *conn;
    uint8_t op;
} store_srv_wait;

enum store_srv_conn_state {
    STORE_SRV_HELLO, /* waiting for the client's HELLO */
    STORE_SRV_AUTH,  /* waiting for its AUTH proof */
    STORE_SRV_READY, /* serving requests */
};

struct store_srv_conn {
    cl_list_node link; /* the server's conns */
    collie_store_server *srv;
    int fd;
    struct event *rev, *wev,
        *hs_timer; /* read (persistent), write (while output waits), handshake */
    struct evbuffer *in, *out;
    char peer[64];
    int state;
    bool closing;              /* flushing a last reply, then closed */
    bool paused;               /* reading stopped: too many unsent replies */
    cl_list_node dirty_link;   /* the server's conns with replies to flush */
    cl_list_node pending_link; /* the server's pending: not authenticated yet */
    uint8_t cnonce[CL_STORE_NONCE_LEN], snonce[CL_STORE_NONCE_LEN];
    cl_idmap waits;
    cl_list wait_list; /* store_srv_wait.link */
    uint32_t nwaits;
};

struct collie_store_server {
    collie_engine *engine;
    char *token; /* NULL: no authentication */
    size_t token_len;
    cl_store_kv_limits lim;
    uint32_t max_conns;   /* authenticated connections, at most */
    int32_t handshake_ms; /* COLLIE_HANDSHAKE_TIMEOUT_MS: a client must authenticate by then */
    uint32_t max_body;    /* largest request body accepted once authenticated */
    cl_store_addrs bind;  /* every address the bind address names */
    _Atomic uint16_t port;
    _Atomic size_t nconns;
    _Atomic bool shut; /* loop-side teardown done; destroy only frees memory */
    char name[272];    /* "127.0.0.1:5000", for log lines */

    /* loop thread */
    cl_resident resident;
    struct evconnlistener *lis[CL_STORE_ADDRS_MAX]; /* one per address bound, same port */
    int nlis;
    struct event *relisten_ev; /* re-enables accept after EMFILE */
    struct event *flush_ev;    /* writes the replies of the dirty conns (srv_conn.c) */
    cl_list dirty;             /* store_srv_conn.dirty_link */
    cl_store_kv *kv;
    cl_list conns;          /* store_srv_conn.link */
    cl_list pending;        /* store_srv_conn.pending_link, in accept order */
    uint32_t npending;      /* its length (at most CL_STORE_SRV_PENDING_MAX) */
    uint64_t refused;       /* refusals not logged since the last one logged */
    int64_t refused_log_ns; /* when that was */
    int start_status;
    char start_err[512];
};

/* srv_conn.c */
void cl_store_srv_accept(collie_store_server *s, int fd, const struct sockaddr *sa, int salen);
/* close now: waits dropped, socket closed, conn freed */
void cl_store_srv_conn_free(store_srv_conn *c);
/* A connection from outside was refused (or closed before it authenticated):
 * logged at warn at most once per CL_STORE_SRV_REFUSED_LOG_MS, with the count
 * of those since; the others at debug. */
void cl_store_srv_log_refusal(collie_store_server *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* send one frame: header + the given body parts (iov-style). Returns
 * COLLIE_OK or COLLIE_ENOMEM (then the connection is doomed: closing). */
int cl_store_srv_send(store_srv_conn *c, uint8_t op, uint32_t req_id, int32_t status,
                      const cl_store_bytes *parts, size_t nparts);
/* an error reply carrying `msg` */
void cl_store_srv_send_error(store_srv_conn *c, uint8_t op, uint32_t req_id, int status,
                             const char *msg);

/* srv_ops.c */
/* execute one authenticated request; returns COLLIE_OK, or an error that
 * means "protocol violation: close this connection" (why filled). */
int cl_store_srv_dispatch(store_srv_conn *c, const cl_store_hdr *h, cl_store_msg *m, char *why,
                          size_t why_len);
/* drop every waiting request of c (before it is freed) */
void cl_store_srv_drop_waits(store_srv_conn *c);

#endif
