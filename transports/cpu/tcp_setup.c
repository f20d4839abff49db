/*
 * tcp_setup.c — making TCP connections between ranks: lazy connect,
 * authenticated handshake, identifying accepted connections, listening.
 *
 * Design notes
 *  - Who connects: the lower rank of a pair dials (after reading the
 *    peer's address from the store); the higher rank waits for it. Both
 *    sides of a pair need the connection in the same collective, so a
 *    connection is made exactly when first needed, and never twice.
 *  - Handshake: acceptor → CHALLENGE(nonce_a); dialer → HELLO(comm id,
 *    generation, rank, size, nonce_d, MAC); acceptor → ACCEPT(MAC). The MACs
 *    are HMAC-SHA256 under the store's shared secret (zeros without one);
 *    nonces come from OpenSSL's RAND_bytes (a connection is refused if it
 *    fails: a guessable nonce would let a recorded HELLO be replayed). A
 *    wrong comm id or generation (a stale process of an earlier
 *    incarnation) is refused and logged with the reason. With a secret both
 *    ends then derive the connection's session key (cpu.h) from it, both
 *    nonces, the comm and both ranks. The messages are encoded, parsed and
 *    judged by handshake.c (pure: the fuzz target runs that code); this
 *    file computes the MACs and runs the exchange.
 *  - Without a secret the proofs are zeros: anyone who can reach the
 *    listener can claim a rank (docs/security.md). So a listener beyond
 *    loopback needs a secret, or COLLIE_INSECURE=1 (the store's rule too).
 *  - What arrives before authentication is bounded (docs/security.md): an
 *    accepted connection must be identified within COLLIE_HANDSHAKE_TIMEOUT_MS
 *    (one timer per comm, for the oldest: `pending` is in accept order and
 *    every connection gets the same bound), and at most TCP_PENDING_MAX wait
 *    at once: the next one closes the oldest (a flood delays the ranks; it
 *    cannot hold the door shut with idle sockets). One that is refused,
 *    times out or ends is closed at once and freed on the loop's next turn
 *    (its callbacks may still be on the stack). Refusals are logged at most
 *    once per TCP_REFUSED_LOG_MS, with a count: outsiders do not write the log.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "transports/cpu/tcp_conn_impl.h"

/* Sockets are made non-blocking and close-on-exec where they are created
 * (SOCK_NONBLOCK | SOCK_CLOEXEC, accept4). */
static void conn_set_socket_options(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

#define TCP_PENDING_MAX       64   /* accepted connections waiting for their handshake */
#define TCP_HANDSHAKE_DEFAULT 5000 /* ms, when the core does not know the setting */
#define TCP_REFUSED_LOG_MS    5000 /* at most one refusal logged per this */

static int64_t setup_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A connection from outside was refused: say so, at most once per
 * TCP_REFUSED_LOG_MS (outsiders must not be able to flood the log). */
void cl_tcp_log_refusal(tcp_comm *tc, const char *fmt, ...) {
    int64_t now = setup_now_ns();
    if (tc->refused_log_ns && now - tc->refused_log_ns < (int64_t)TCP_REFUSED_LOG_MS * 1000000) {
        tc->refused_quiet++;
        return;
    }
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tc->refused_quiet)
        tc->core->log_comm(tc->bc, 1, "tcp", "%s (and %llu more refused since the last such line)",
                           msg, (unsigned long long)tc->refused_quiet);
    else
        tc->core->log_comm(tc->bc, 1, "tcp", "%s", msg);
    tc->refused_log_ns = now;
    tc->refused_quiet = 0;
}

/* ---- handshake ------------------------------------------------------------------------ */

/* The proof of a handshake message: the secret's HMAC over the label, the
 * comm (id, generation, size) it is for, a rank and both nonces. */
static void hs_mac_for(tcp_conn *c, const char *label, const uint8_t *n1, const uint8_t *n2,
                       uint64_t id, uint64_t gen, uint32_t rank, uint32_t size, uint8_t out[32]) {
    tcp_comm *tc = c->tc;
    uint8_t msg[CL_TCP_HS_MAC_INPUT];
    size_t len = cl_tcp_hs_mac_input(label, n1, n2, id, gen, rank, size, msg);
    tc->core->auth_mac(tc->bc, msg, len, out);
}

/* ... for this comm */
static void hs_mac(tcp_conn *c, const char *label, const uint8_t *n1, const uint8_t *n2,
                   uint32_t rank, uint8_t out[32]) {
    tcp_comm *tc = c->tc;
    hs_mac_for(c, label, n1, n2, tc->comm_id, tc->generation, rank, (uint32_t)tc->size, out);
}

/* this side, as the handshake's verdicts (handshake.h) see it */
static cl_tcp_hs_self hs_self(const tcp_comm *tc) {
    return (cl_tcp_hs_self){.comm_id = tc->comm_id,
                            .generation = tc->generation,
                            .version = TCP_PROTO_VERSION,
                            .rank = tc->rank,
                            .size = tc->size,
                            .auth = tc->core->auth_enabled(tc->bc)};
}

static void hs_queue(tcp_conn *c, const uint8_t *buf, size_t len) {
    memcpy(c->hs_out, buf, len);
    c->hs_out_len = len;
    c->hs_out_sent = 0;
    c->tc->core->watch_start(c->wev, -1);
}

/* The connection's session key (cpu.h), once both nonces are known and the
 * peer has proved the secret; nothing without a secret. */
static void hs_session_key(tcp_conn *c, int dialer, int acceptor, const uint8_t *nonce_acceptor,
                           const uint8_t *nonce_dialer) {
    tcp_comm *tc = c->tc;
    if (!tc->core->auth_enabled(tc->bc)) return;
    static const char label[] = "collie-tcp session";
    uint8_t msg[sizeof label + 56];
    size_t len = sizeof label - 1;
    memcpy(msg, label, len);
    put64(msg + len, tc->comm_id);
    put64(msg + len + 8, tc->generation);
    put32(msg + len + 16, (uint32_t)dialer);
    put32(msg + len + 20, (uint32_t)acceptor);
    memcpy(msg + len + 24, nonce_acceptor, 16);
    memcpy(msg + len + 40, nonce_dialer, 16);
    tc->core->auth_mac(tc->bc, msg, len + 56, c->session_key);
    c->session_keyed = true;
}

bool cl_tcp_hs_start_acceptor(tcp_conn *c) {
    uint8_t m[HS_CHALLENGE_LEN];
    if (RAND_bytes(c->nonce_mine, 16) != 1) {
        cl_tcp_conn_close(c, COLLIE_ESYSTEM, "RAND_bytes failed: no nonce for the handshake");
        return false;
    }
    cl_tcp_hs_msg ch = {.version = TCP_PROTO_VERSION};
    memcpy(ch.nonce, c->nonce_mine, 16);
    cl_tcp_hs_encode(CL_TCP_HS_CHALLENGE, &ch, m);
    c->state = TCP_CONN_HANDSHAKE;
    c->hs_phase = HS_A_WAIT_HELLO;
    c->hs_in_want = HS_HELLO_LEN;
    c->hs_in_len = 0;
    hs_queue(c, m, sizeof m);
    return true;
}

/* The dialer has the acceptor's CHALLENGE: check it, answer HELLO (its
 * nonce, ours, and the MAC that proves we hold the secret). */
static bool hs_on_challenge(tcp_conn *c, const cl_tcp_hs_self *me, const cl_tcp_hs_msg *m,
                            char *why, size_t whylen) {
    tcp_comm *tc = c->tc;
    if (cl_tcp_hs_check_challenge(me, m, c->peer, why, whylen) != COLLIE_OK) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO, "%s", why);
        return false;
    }
    memcpy(c->nonce_peer, m->nonce, 16);
    if (RAND_bytes(c->nonce_mine, 16) != 1) {
        cl_tcp_conn_lost(c, COLLIE_ESYSTEM, "RAND_bytes failed: no nonce for rank %d", c->peer);
        return false;
    }
    cl_tcp_hs_msg hello = {.version = TCP_PROTO_VERSION,
                           .comm_id = tc->comm_id,
                           .generation = tc->generation,
                           .rank = (uint32_t)tc->rank,
                           .size = (uint32_t)tc->size};
    memcpy(hello.nonce, c->nonce_mine, 16);
    hs_mac(c, "collie-tcp hello", c->nonce_peer, c->nonce_mine, (uint32_t)tc->rank, hello.mac);
    uint8_t h[HS_HELLO_LEN];
    cl_tcp_hs_encode(CL_TCP_HS_HELLO, &hello, h);
    c->hs_phase = HS_D_WAIT_ACCEPT;
    c->hs_in_want = HS_ACCEPT_LEN;
    c->hs_in_len = 0;
    hs_queue(c, h, sizeof h);
    return true;
}

/* The dialer has the acceptor's ACCEPT: check its proof, derive the
 * session key, map a same-host link's memory; the connection is ready. */
static bool hs_on_accept(tcp_conn *c, const cl_tcp_hs_msg *m, char *why, size_t whylen) {
    uint8_t want[32];
    hs_mac(c, "collie-tcp accept", c->nonce_mine, c->nonce_peer, (uint32_t)c->peer, want);
    int rc = cl_tcp_hs_check_accept(m, want, c->peer, why, whylen);
    if (rc != COLLIE_OK) {
        cl_tcp_conn_lost(c, rc, "%s", why);
        return false;
    }
    hs_session_key(c, c->tc->rank, c->peer, c->nonce_peer, c->nonce_mine);
    if (c->local && cl_tcp_local_attach(c, why, whylen) != COLLIE_OK) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO, "rank %d: %s", c->peer, why);
        return false;
    }
    cl_tcp_conn_ready(c);
    return true;
}

/* The acceptor has a dialer's HELLO: judge it (handshake.c), make a
 * same-host link's memory, then answer ACCEPT and install the connection,
 * or refuse it: tell the dialer (best effort) and close. Returns false:
 * c may have been merged into another struct or closed. */
static bool hs_on_hello(tcp_conn *c, const cl_tcp_hs_self *me, const cl_tcp_hs_msg *m, char *why,
                        size_t whylen) {
    tcp_comm *tc = c->tc;
    memcpy(c->nonce_peer, m->nonce, 16);
    uint8_t want[32], claimed[32];
    hs_mac(c, "collie-tcp hello", c->nonce_mine, c->nonce_peer, m->rank, want);
    hs_mac_for(c, "collie-tcp hello", c->nonce_mine, c->nonce_peer, m->comm_id, m->generation,
               m->rank, m->size, claimed);
    uint32_t refuse = cl_tcp_hs_judge_hello(me, m, claimed, want, why, whylen);
    if (!refuse && c->local) { /* the same-host link: its memory goes out with the ACCEPT */
        c->peer = (int)m->rank;
        char mem[160];
        if (cl_tcp_local_make(c, mem, sizeof mem) != COLLIE_OK) {
            refuse = CL_TCP_HS_REFUSE_SHM;
            snprintf(why, whylen, "no shared memory for the link: %s", mem);
        }
    }
    cl_tcp_hs_msg acc = {.status = refuse};
    uint8_t a[HS_ACCEPT_LEN];
    if (refuse) {
        cl_tcp_hs_encode(CL_TCP_HS_ACCEPT, &acc, a);
        cl_tcp_log_refusal(tc, "refused a connection claiming rank %u: %s", m->rank, why);
        /* best effort: tell the dialer, then close */
        ssize_t n = send(c->fd, a, sizeof a, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n;
        cl_tcp_conn_close(c, COLLIE_EPROTO, why);
        return false;
    }
    c->peer = (int)m->rank;
    hs_session_key(c, (int)m->rank, tc->rank, c->nonce_mine, c->nonce_peer);
    /* the answer proves the acceptor: its own rank, as the dialer checks it */
    hs_mac(c, "collie-tcp accept", c->nonce_peer, c->nonce_mine, (uint32_t)tc->rank, acc.mac);
    cl_tcp_hs_encode(CL_TCP_HS_ACCEPT, &acc, a);
    hs_queue(c, a, sizeof a);
    cl_tcp_conn_install(c, (int)m->rank);
    return false; /* c may have been merged into another struct: stop using it */
}

/* A complete handshake message is in hs_in (hs_in_len bytes: the length of
 * the message this phase expects). It is parsed and judged by handshake.c;
 * what is left here is the exchange, a step per message. Returns false if
 * c was closed. */
bool cl_tcp_hs_process(tcp_conn *c) {
    cl_tcp_hs_self me = hs_self(c->tc);
    cl_tcp_hs_kind kind = c->hs_phase == HS_D_WAIT_CHALLENGE ? CL_TCP_HS_CHALLENGE
                          : c->hs_phase == HS_D_WAIT_ACCEPT  ? CL_TCP_HS_ACCEPT
                                                             : CL_TCP_HS_HELLO;
    cl_tcp_hs_msg m;
    char why[240] = "";
    if (cl_tcp_hs_decode(kind, c->hs_in, c->hs_in_len, &m, why, sizeof why) != COLLIE_OK) {
        cl_tcp_conn_close(c, COLLIE_EPROTO, why);
        return false;
    }
    if (kind == CL_TCP_HS_CHALLENGE) return hs_on_challenge(c, &me, &m, why, sizeof why);
    if (kind == CL_TCP_HS_ACCEPT) return hs_on_accept(c, &m, why, sizeof why);
    return hs_on_hello(c, &me, &m, why, sizeof why);
}

/* ---- identification of accepted connections --------------------------------------- */

/* The accepted connection `c` proved to be `peer`: move its socket into the
 * placeholder made when this side first needed the peer, or install c. */
void cl_tcp_conn_install(tcp_conn *c, int peer) {
    tcp_comm *tc = c->tc;
    if (cl_list_linked(&c->pending_node)) tc->npending--;
    cl_list_remove(&c->pending_node);
    tcp_conn *slot = tc->conns[peer];
    if (slot && slot->state != TCP_CONN_ADDR) {
        tc->core->log_comm(tc->bc, 1, "tcp", "duplicate connection from rank %d refused", peer);
        cl_tcp_conn_close(c, COLLIE_EPROTO, "duplicate");
        cl_tcp_conn_free(c);
        return;
    }
    if (!slot) {
        tc->conns[peer] = c;
        cl_tcp_conn_ready(c);
        return;
    }
    /* move the socket and the queued ACCEPT into the placeholder */
    c->tc->core->watch_free(c->rev);
    c->tc->core->watch_free(c->wev);
    c->rev = c->wev = NULL;
    slot->local = c->local;
    slot->shm = c->shm; /* the link's memory, if any, moves too */
    cl_shm_link_init(&c->shm);
    memcpy(slot->hs_out, c->hs_out, c->hs_out_len);
    slot->hs_out_len = c->hs_out_len;
    slot->hs_out_sent = c->hs_out_sent;
    memcpy(slot->session_key, c->session_key, sizeof slot->session_key);
    slot->session_keyed = c->session_keyed;
    int fd = c->fd;
    c->fd = -1;
    cl_tcp_conn_free(c);
    if (cl_tcp_conn_attach_fd(slot, fd) != COLLIE_OK) {
        cl_tcp_conn_lost(slot, COLLIE_ENOMEM, "no memory for events");
        return;
    }
    cl_tcp_conn_ready(slot);
}

/* ---- connecting ------------------------------------------------------------------------- */

static void conn_on_addr(collie_work *w, void *arg) {
    tcp_req_ctx *ctx = arg;
    tcp_conn *c = ctx->target;
    const collie_core_services *core = ctx->core;
    free(ctx);
    if (!c) { /* the connection was freed meanwhile */
        core->work_release(w);
        return;
    }
    c->addr_req = NULL;
    c->addr_ctx = NULL;
    int st = core->work_result(w);
    if (c->state == TCP_CONN_CLOSED) {
        core->work_release(w);
        return;
    }
    if (st != COLLIE_OK) {
        if (st != COLLIE_ECANCELED)
            cl_tcp_conn_lost(c, st, "cannot find the address of rank %d in the store: %s", c->peer,
                             core->work_error_message(w));
        core->work_release(w);
        return;
    }
    const void *val;
    size_t len;
    core->store_value(w, &val, &len);
    char value[256], addr[80];
    snprintf(value, sizeof value, "%.*s", (int)len, (const char *)val);
    core->work_release(w);
    int route = cl_tcp_local_route(c, value, addr, sizeof addr);
    if (route != 0) return; /* dialing the same-host socket, or failed */
    char *colon = strrchr(addr, ':');
    struct sockaddr_in sin = {.sin_family = AF_INET};
    if (!colon || inet_pton(AF_INET, (*colon = '\0', addr), &sin.sin_addr) != 1) {
        cl_tcp_conn_lost(c, COLLIE_EPROTO, "rank %d published a bad address", c->peer);
        return;
    }
    sin.sin_port = htons((uint16_t)atoi(colon + 1));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        cl_tcp_conn_lost(c, COLLIE_ESYSTEM, "socket: %s", strerror(errno));
        return;
    }
    conn_set_socket_options(fd);
    if (cl_tcp_conn_attach_fd(c, fd) != COLLIE_OK) {
        cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory for events");
        return;
    }
    c->state = TCP_CONN_CONNECTING;
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) < 0 && errno != EINPROGRESS) {
        cl_tcp_conn_peer_gone(c, COLLIE_PEER_SUSPECTED); /* unreachable, not known dead */
        cl_tcp_conn_lost(c, COLLIE_EPEER, "connect to rank %d at %s:%s failed: %s", c->peer, addr,
                         colon + 1, strerror(errno));
        return;
    }
    c->tc->core->watch_start(c->wev, -1);
}

tcp_conn *cl_tcp_conn_get(tcp_comm *tc, int peer) {
    tcp_conn *old = tc->conns[peer];
    if (old) { /* an op needs the peer: a broken stream cannot serve it */
        if (old->send_broken) cl_tcp_conn_close(old, COLLIE_EPEER, old->broken_why);
        return old;
    }
    tcp_conn *c = cl_tcp_conn_new(tc, peer);
    if (!c) return NULL;
    tc->conns[peer] = c;
    c->state = TCP_CONN_ADDR;
    c->initiator = tc->rank < peer;
    if (!c->initiator) return c; /* the peer dials us */
    char key[32];
    snprintf(key, sizeof key, "tcp/%d", peer);
    /* the peer published its address before the creation barrier */
    c->addr_ctx = malloc(sizeof *c->addr_ctx);
    if (!c->addr_ctx) {
        cl_tcp_conn_lost(c, COLLIE_ENOMEM, "no memory to look up rank %d's address", peer);
        return c;
    }
    c->addr_ctx->target = c;
    c->addr_ctx->core = tc->core;
    int r = tc->core->store_get(tc->bc, key, 30000, conn_on_addr, c->addr_ctx, &c->addr_req);
    if (r != COLLIE_OK) {
        free(c->addr_ctx);
        c->addr_ctx = NULL;
        if (r == COLLIE_ECLOSED) /* the engine is shutting down: no peer to blame */
            cl_tcp_conn_lost(c, r, "the engine is shutting down (rank %d's address unread)", peer);
        else
            cl_tcp_conn_lost(c, r, "store get of rank %d's address failed", peer);
    }
    return c;
}

/* ---- accepted connections, before they are identified ------------------------------------ */

/* Arm the deadline timer for the oldest pending connection (or stop it). */
static void pending_arm(tcp_comm *tc, int64_t now) {
    tcp_conn *c = cl_list_first(&tc->pending, tcp_conn, pending_node);
    if (!c) {
        tc->core->watch_stop(tc->hs_timer);
        return;
    }
    int64_t us = (c->hs_deadline_ns - now) / 1000;
    tc->core->watch_start(tc->hs_timer, us < 1000 ? 1000 : us);
}

static void pending_on_deadline(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_comm *tc = arg;
    int64_t now = setup_now_ns();
    tcp_conn *c;
    while ((c = cl_list_first(&tc->pending, tcp_conn, pending_node)) && c->hs_deadline_ns <= now) {
        cl_tcp_log_refusal(tc,
                           "closed a connection that did not finish its handshake within %lld ms",
                           (long long)(tc->hs_timeout_ns / 1000000));
        cl_tcp_conn_close(c, COLLIE_ETIMEDOUT, "no handshake within the deadline");
    }
    pending_arm(tc, now);
}

static void pending_on_reap(int fd, unsigned what, void *arg) {
    (void)fd;
    (void)what;
    tcp_comm *tc = arg;
    tcp_conn *c;
    while ((c = cl_list_first(&tc->reaped, tcp_conn, pending_node))) {
        cl_list_remove(&c->pending_node);
        cl_tcp_conn_free(c);
    }
}

void cl_tcp_pending_closed(tcp_conn *c) {
    tcp_comm *tc = c->tc;
    cl_list_remove(&c->pending_node);
    tc->npending--;
    c->reaped = true;
    cl_list_push_back(&tc->reaped, &c->pending_node);
    if (tc->reap_ev) tc->core->watch_activate(tc->reap_ev, COLLIE_WATCH_TIMEOUT);
}

int cl_tcp_pending_init(tcp_comm *tc) {
    const char *ms = tc->core->setting("COLLIE_HANDSHAKE_TIMEOUT_MS");
    long long v = ms ? strtoll(ms, NULL, 10) : 0;
    tc->hs_timeout_ns = (v > 0 ? v : TCP_HANDSHAKE_DEFAULT) * 1000000LL;
    tc->hs_timer = tc->core->watch_new(tc->bc, -1, 0, pending_on_deadline, tc);
    tc->reap_ev = tc->core->watch_new(tc->bc, -1, 0, pending_on_reap, tc);
    return tc->hs_timer && tc->reap_ev ? COLLIE_OK : COLLIE_ENOMEM;
}

void cl_tcp_pending_fini(tcp_comm *tc) {
    tcp_conn *c;
    while ((c = cl_list_first(&tc->pending, tcp_conn, pending_node)))
        cl_tcp_conn_free(c);
    pending_on_reap(-1, 0, tc);
    if (tc->hs_timer) tc->core->watch_free(tc->hs_timer);
    if (tc->reap_ev) tc->core->watch_free(tc->reap_ev);
    tc->hs_timer = tc->reap_ev = NULL;
}

void cl_tcp_conn_accepted(tcp_comm *tc, int fd, bool local) {
    if (tc->aborted || !tc->hs_timer) {
        close(fd);
        return;
    }
    if (tc->npending >= TCP_PENDING_MAX) { /* the oldest makes room (see the design notes) */
        cl_tcp_log_refusal(tc, "%d connections wait for their handshake: closed the oldest",
                           TCP_PENDING_MAX);
        cl_tcp_conn_close(cl_list_first(&tc->pending, tcp_conn, pending_node), COLLIE_EPEER,
                          "too many connections waiting for their handshake");
    }
    tcp_conn *c = cl_tcp_conn_new(tc, -1);
    if (c) c->local = local;
    if (!c || cl_tcp_conn_attach_fd(c, fd) != COLLIE_OK) {
        if (c)
            cl_tcp_conn_free(c);
        else
            close(fd);
        return;
    }
    int64_t now = setup_now_ns();
    c->hs_deadline_ns = now + tc->hs_timeout_ns;
    bool first = cl_list_empty(&tc->pending);
    cl_list_push_back(&tc->pending, &c->pending_node);
    tc->npending++;
    if (first) pending_arm(tc, now);
    cl_tcp_hs_start_acceptor(c);
}

/* ---- listening --------------------------------------------------------------------------- */

static void listen_on_accept(int lfd, unsigned what, void *arg) {
    (void)what;
    tcp_comm *tc = arg;
    for (int i = 0; i < 16; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        conn_set_socket_options(fd);
        cl_tcp_conn_accepted(tc, fd, false);
    }
}

/* The address to listen on, from COLLIE_SOCKET_IFNAME or COLLIE_SOCKET_ADDR
 * (default 127.0.0.1); `what` names the setting for messages. Failures say
 * why through core->set_error. */
static int listen_address(const collie_core_services *core, struct in_addr *out, char *what,
                          size_t len) {
    const char *ifname = core->setting("COLLIE_SOCKET_IFNAME");
    if (ifname) {
        snprintf(what, len, "COLLIE_SOCKET_IFNAME '%s'", ifname);
        struct ifaddrs *ifs, *it;
        if (getifaddrs(&ifs) != 0) {
            core->set_error("%s: getifaddrs: %s", what, strerror(errno));
            return COLLIE_ESYSTEM;
        }
        char names[256] = "";
        size_t used = 0;
        int r = COLLIE_EINVAL;
        for (it = ifs; it; it = it->ifa_next) {
            if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
            if (strcmp(it->ifa_name, ifname) == 0) {
                *out = ((struct sockaddr_in *)it->ifa_addr)->sin_addr;
                r = COLLIE_OK;
                break;
            }
            if (used < sizeof names)
                used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                         used ? ", " : "", it->ifa_name);
        }
        freeifaddrs(ifs);
        if (r != COLLIE_OK)
            core->set_error("%s: no interface of that name has an IPv4 address (interfaces "
                            "with one: %s)",
                            what, names[0] ? names : "none");
        return r;
    }
    const char *addr = core->setting("COLLIE_SOCKET_ADDR");
    snprintf(what, len, "%s '%s'", addr ? "COLLIE_SOCKET_ADDR" : "the default address",
             addr ? addr : "127.0.0.1");
    if (inet_pton(AF_INET, addr ? addr : "127.0.0.1", out) == 1) return COLLIE_OK;
    core->set_error("%s: not an IPv4 address", what);
    return COLLIE_EINVAL;
}

int cl_tcp_listen(tcp_comm *tc) {
    struct sockaddr_in sin = {.sin_family = AF_INET};
    char what[128];
    int r = listen_address(tc->core, &sin.sin_addr, what, sizeof what);
    if (r != COLLIE_OK) return r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        tc->core->set_error("socket: %s", strerror(errno));
        return COLLIE_ESYSTEM;
    }
    socklen_t len = sizeof sin;
    const char *step = "bind";
    if (bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0 ||
        (step = "listen", listen(fd, 1024) != 0) ||
        (step = "getsockname", getsockname(fd, (struct sockaddr *)&sin, &len) != 0)) {
        tc->core->set_error("%s: cannot %s a listening socket there: %s", what, step,
                            strerror(errno));
        close(fd);
        return COLLIE_ESYSTEM;
    }
    const char *insecure = tc->core->setting("COLLIE_INSECURE");
    if ((ntohl(sin.sin_addr.s_addr) >> 24) != 127 && !tc->core->auth_enabled(tc->bc) &&
        !(insecure && !strcmp(insecure, "1"))) {
        tc->core->set_error("%s is beyond loopback and this comm has no shared secret: anyone "
                            "who can reach it could join the comm. Give the store and every "
                            "rank a secret (COLLIE_STORE_TOKEN; collie-run makes one), or set "
                            "COLLIE_INSECURE=1 if that is meant",
                            what);
        close(fd);
        return COLLIE_EINVAL;
    }
    tc->listen_fd = fd;
    tc->listen_ev = tc->core->watch_new(tc->bc, fd, COLLIE_WATCH_READ, listen_on_accept, tc);
    if (!tc->listen_ev) return COLLIE_ENOMEM;
    tc->core->watch_start(tc->listen_ev, -1);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof ip);
    snprintf(tc->addr, sizeof tc->addr, "%s:%u", ip, (unsigned)ntohs(sin.sin_port));
    return COLLIE_OK;
}
