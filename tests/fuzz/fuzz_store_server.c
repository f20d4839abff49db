/*
 * fuzz_store_server.c — a live store server as a process on the host meets
 * it: bytes on one connection, through srv_conn.c's framing and its
 * HELLO/AUTH state machine to srv_ops.c's requests on the key table.
 *
 * Design notes
 *  - One engine for the process, made at the first input; per input a
 *    fresh server (so no input sees another's keys), one connection handed
 *    to it as an accepted socket (a socketpair: no ports, no TIME_WAIT),
 *    destroyed at the end.
 *  - Input: byte 0 bit 0: a server with a token (else tokenless); bit 1:
 *    this target does the real handshake first (HELLO, then AUTH with the
 *    token's proof), so the rest reaches the requests; without it the rest
 *    is all an outsider sends. The rest is the stream, written as the
 *    server reads it, then the write side is shut.
 *  - Invariants beyond "no crash, no leak, no UB": every byte the server
 *    sends back is reply frames that decode as the client decodes them (and
 *    pass fuzz_store.h's checks; a close may cut the last one); an outsider
 *    of a server with a token gets nothing but HELLO and AUTH replies, never
 *    an AUTH OK, and leaves the key table empty; the server hangs up within
 *    FUZZ_SRV_DEADLINE_MS of the stream's end (a request waiting on a key
 *    ends with its connection) and its connection count returns to 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_store.h"

#include "engine/engine.h"
#include "store/auth.h"
#include "store/server.h"

#define FUZZ_SRV_TOKEN       "fuzz-store-server-token"
#define FUZZ_SRV_DEADLINE_MS 5000

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static collie_engine *fuzz_engine(void) {
    static collie_engine *e;
    if (!e) {
        setenv("COLLIE_LOG", "error", 0); /* refusals are the point: keep them out of the log */
        FUZZ_CHECK(collie_engine_create(NULL, &e) == COLLIE_OK, "engine: %s", collie_last_error());
    }
    return e;
}

/* ---- the connection, from the client's side ----------------------------------------- */

typedef struct fuzz_conn {
    int fd;
    uint8_t *in; /* everything the server sent */
    size_t len, cap;
    bool eof;
} fuzz_conn;

/* Read what is there; false once the server has hung up. */
static void conn_read(fuzz_conn *c) {
    for (;;) {
        if (c->cap - c->len < 65536) {
            c->cap = c->cap * 2 + 65536;
            c->in = realloc(c->in, c->cap);
            FUZZ_CHECK(c->in != NULL, "out of memory for %zu bytes of replies", c->cap);
        }
        ssize_t n = recv(c->fd, c->in + c->len, c->cap - c->len, MSG_DONTWAIT);
        if (n > 0) {
            c->len += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) c->eof = true;
        return;
    }
}

/* Write data while reading the replies (the server may stop reading while
 * its replies wait), then shut the write side and read to the server's
 * close. A server that never hangs up breaks the contract. */
static void conn_stream(fuzz_conn *c, const uint8_t *data, size_t len, bool shut) {
    int64_t deadline = now_ms() + FUZZ_SRV_DEADLINE_MS;
    size_t off = 0;
    bool writing = len > 0;
    if (!writing && shut) shutdown(c->fd, SHUT_WR);
    while (!c->eof && (writing || shut)) {
        int64_t left = deadline - now_ms();
        FUZZ_CHECK(left > 0,
                   "the server neither read the stream nor hung up in %d ms (%zu of %zu "
                   "bytes written)",
                   FUZZ_SRV_DEADLINE_MS, off, len);
        struct pollfd p = {c->fd, (short)(POLLIN | (writing ? POLLOUT : 0)), 0};
        if (poll(&p, 1, (int)left) < 0) continue;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) conn_read(c);
        if (writing && (p.revents & (POLLOUT | POLLERR))) {
            ssize_t n = send(c->fd, data + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) off += (size_t)n;
            if ((n < 0 && errno != EAGAIN && errno != EINTR) || off == len) {
                writing = false; /* all written, or the server closed: read to its end */
                if (shut) shutdown(c->fd, SHUT_WR);
            }
        }
    }
}

/* The first whole frame the server sent (for the handshake), within the
 * deadline: its header and body. */
static void conn_frame(fuzz_conn *c, cl_store_hdr *h, const uint8_t **body) {
    int64_t deadline = now_ms() + FUZZ_SRV_DEADLINE_MS;
    char why[256] = "";
    for (;;) {
        if (c->len >= CL_STORE_HDR_LEN) {
            FUZZ_CHECK(cl_store_hdr_decode(c->in, CL_STORE_PROTO_MAX_BODY, h, why, sizeof why) ==
                           COLLIE_OK,
                       "the server's handshake reply: %s", why);
            if (c->len >= CL_STORE_HDR_LEN + (size_t)h->body_len) break;
        }
        int64_t left = deadline - now_ms();
        FUZZ_CHECK(!c->eof && left > 0, "no handshake reply (%zu bytes, %s)", c->len,
                   c->eof ? "closed" : "timed out");
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, (int)left) > 0) conn_read(c);
    }
    *body = c->in + CL_STORE_HDR_LEN;
}

static void conn_consume(fuzz_conn *c, size_t n) {
    memmove(c->in, c->in + n, c->len - n);
    c->len -= n;
}

static void conn_send_frame(fuzz_conn *c, uint8_t op, const cl_store_msg *m) {
    cl_store_wbuf b = {0};
    fuzz_store_frame(&b, op, 0, m);
    conn_stream(c, b.p, b.len, false);
    cl_store_wbuf_fini(&b);
}

/* The client's side of the handshake, as store/client.c does it. */
static void conn_handshake(fuzz_conn *c, bool token) {
    uint8_t cnonce[CL_STORE_NONCE_LEN] = {42}, proof[CL_STORE_PROOF_LEN];
    cl_store_msg hello = {.op = CL_STORE_OP_HELLO,
                          .num = token,
                          .vals = (cl_store_bytes[2]){{cnonce, sizeof cnonce}}};
    conn_send_frame(c, CL_STORE_OP_HELLO, &hello);
    cl_store_hdr h;
    const uint8_t *body;
    conn_frame(c, &h, &body);
    cl_store_msg m;
    char why[256] = "";
    FUZZ_CHECK(h.op == (CL_STORE_OP_HELLO | CL_STORE_OP_REPLY) && h.status == COLLIE_OK &&
                   cl_store_reply_decode(CL_STORE_OP_HELLO, h.status, body, h.body_len, &m, why,
                                         sizeof why) == COLLIE_OK,
               "HELLO answered with op %u status %d (%s)", h.op, (int)h.status, why);
    FUZZ_CHECK((m.num != 0) == token, "the server says auth_required=%lld", (long long)m.num);
    if (token) {
        FUZZ_CHECK(cl_store_auth_verify(FUZZ_SRV_TOKEN, strlen(FUZZ_SRV_TOKEN), true, cnonce,
                                        m.vals[0].p, m.vals[1].p, m.vals[1].len),
                   "the server's proof does not verify");
        FUZZ_CHECK(cl_store_auth_proof(FUZZ_SRV_TOKEN, strlen(FUZZ_SRV_TOKEN), false, cnonce,
                                       m.vals[0].p, proof) == COLLIE_OK,
                   "HMAC failed");
    }
    cl_store_msg_fini(&m);
    conn_consume(c, CL_STORE_HDR_LEN + h.body_len);
    if (!token) return;
    cl_store_msg auth = {.op = CL_STORE_OP_AUTH,
                         .num = CL_STORE_AUTH_PROOF,
                         .vals = (cl_store_bytes[1]){{proof, sizeof proof}}};
    conn_send_frame(c, CL_STORE_OP_AUTH, &auth);
    conn_frame(c, &h, &body);
    FUZZ_CHECK(h.op == (CL_STORE_OP_AUTH | CL_STORE_OP_REPLY) && h.status == COLLIE_OK,
               "a good proof answered with op %u status %d", h.op, (int)h.status);
    conn_consume(c, CL_STORE_HDR_LEN + h.body_len);
}

/* Every reply frame decodes; an outsider of a server with a token only ever
 * hears about the handshake, and never that it passed. */
static void check_replies(const fuzz_conn *c, bool outsider) {
    size_t pos = 0;
    while (c->len - pos >= CL_STORE_HDR_LEN) {
        cl_store_hdr h;
        char why[256] = "";
        FUZZ_CHECK(cl_store_hdr_decode(c->in + pos, CL_STORE_PROTO_MAX_BODY, &h, why, sizeof why) ==
                       COLLIE_OK,
                   "the server sent a header the client refuses: %s", why);
        FUZZ_CHECK(h.op & CL_STORE_OP_REPLY, "the server sent a request (op %u)", h.op);
        uint8_t op = h.op & (uint8_t)~CL_STORE_OP_REPLY;
        if (c->len - pos - CL_STORE_HDR_LEN < h.body_len) return; /* cut by the close */
        FUZZ_CHECK(fuzz_store_body(true, op, h.status, c->in + pos + CL_STORE_HDR_LEN,
                                   h.body_len) == COLLIE_OK,
                   "the server sent a %s reply (status %d) the client cannot decode",
                   cl_store_op_name(op), (int)h.status);
        FUZZ_CHECK(!outsider || op == CL_STORE_OP_HELLO || op == CL_STORE_OP_AUTH,
                   "an unauthenticated client got a %s reply (status %d)", cl_store_op_name(op),
                   (int)h.status);
        FUZZ_CHECK(!outsider || op != CL_STORE_OP_AUTH || h.status != COLLIE_OK,
                   "an unauthenticated client was told its proof is good");
        pos += CL_STORE_HDR_LEN + h.body_len;
    }
}

/* ---- the server's side, on its loop thread ----------------------------------------- */

typedef struct srv_call {
    collie_store_server *s;
    int fd;
    size_t keys;
} srv_call;

static void srv_accept(void *arg) {
    srv_call *a = arg;
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cl_store_srv_accept(a->s, a->fd, (const struct sockaddr *)&peer, sizeof peer);
}

static void srv_num_keys(void *arg) {
    srv_call *a = arg;
    a->keys = cl_store_kv_num_keys(a->s->kv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool token = data[0] & 1, handshake = data[0] & 2;
    collie_engine *e = fuzz_engine();
    collie_store_server_opts o = COLLIE_STORE_SERVER_OPTS_INIT;
    o.token = token ? FUZZ_SRV_TOKEN : NULL;
    srv_call call = {0};
    FUZZ_CHECK(collie_store_server_create(e, "127.0.0.1", 0, &o, &call.s) == COLLIE_OK,
               "server: %s", collie_last_error());
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
               strerror(errno));
    call.fd = sv[1];
    FUZZ_CHECK(cl_engine_call(e, srv_accept, &call, FUZZ_SRV_DEADLINE_MS) == COLLIE_OK,
               "the server's loop did not take the connection");
    fuzz_conn c = {.fd = sv[0]};
    if (handshake) conn_handshake(&c, token);
    conn_stream(&c, data + 1, size - 1, true);
    check_replies(&c, token && !handshake);
    close(c.fd);
    free(c.in);
    int64_t deadline = now_ms() + FUZZ_SRV_DEADLINE_MS;
    while (collie_store_server_num_connections(call.s) != 0) {
        FUZZ_CHECK(now_ms() < deadline,
                   "the server still counts %zu connections %d ms after the "
                   "client's close",
                   collie_store_server_num_connections(call.s), FUZZ_SRV_DEADLINE_MS);
        usleep(100);
    }
    if (token && !handshake) {
        FUZZ_CHECK(cl_engine_call(e, srv_num_keys, &call, FUZZ_SRV_DEADLINE_MS) == COLLIE_OK,
                   "the server's loop did not answer");
        FUZZ_CHECK(call.keys == 0, "an unauthenticated client stored %zu keys", call.keys);
    }
    collie_store_server_destroy(call.s);
    return 0;
}

/* ---- seeds: every request after each kind of start ------------------------------------ */

/* A request of every op the server serves, one frame each. */
static void seed_requests(cl_store_wbuf *b, uint8_t only) {
    cl_store_bytes keys[3] = {
        {(const uint8_t *)"k0", 2}, {(const uint8_t *)"key1", 4}, {(const uint8_t *)"n", 1}};
    cl_store_bytes vals[3] = {
        {(const uint8_t *)"v", 1}, {(const uint8_t *)"value", 5}, {(const uint8_t *)"xyz", 3}};
    for (uint8_t op = CL_STORE_OP_SET; op < CL_STORE_OP_COUNT_; op++) {
        if (only && op != only) continue;
        cl_store_msg m = {.op = op, .n = 1, .keys = keys, .vals = vals, .num = 2};
        if (op >= CL_STORE_OP_CHECK && op <= CL_STORE_OP_MULTI_SET) m.n = 3;
        if (op == CL_STORE_OP_CANCEL) m.num = 5; /* the id of an earlier request */
        size_t start = b->len;
        cl_store_frame_begin(b, op, op, 0);
        fuzz_store_enc_body(b, &m, false, 0);
        if (cl_store_frame_end(b, start) != COLLIE_OK) exit(1);
    }
}

static void seed_write(const char *dir, const char *name, uint8_t mode, bool hello, uint8_t only) {
    static const uint8_t nonce[CL_STORE_NONCE_LEN] = {7};
    cl_store_wbuf b = {0};
    cl_store_put_u8(&b, mode);
    if (hello) {
        cl_store_msg m = {.op = CL_STORE_OP_HELLO,
                          .num = mode & 1,
                          .vals = (cl_store_bytes[2]){{nonce, sizeof nonce}}};
        fuzz_store_frame(&b, CL_STORE_OP_HELLO, 0, &m);
    }
    seed_requests(&b, only);
    fuzz_seed_write(dir, name, b.p, b.len);
    cl_store_wbuf_fini(&b);
}

static void fuzz_seeds(const char *dir) {
    char name[64];
    for (uint8_t op = CL_STORE_OP_SET; op < CL_STORE_OP_COUNT_; op++) {
        snprintf(name, sizeof name, "authed-%s", cl_store_op_name(op));
        seed_write(dir, name, 3, false, op);
    }
    seed_write(dir, "authed-all", 3, false, 0);
    seed_write(dir, "tokenless-authed-all", 2, false, 0);
    seed_write(dir, "tokenless-hello-all", 0, true, 0);
    seed_write(dir, "outsider-hello-all", 1, true, 0);
    /* an outsider's HELLO, then a proof that cannot verify, then a SET */
    static const uint8_t nonce[CL_STORE_NONCE_LEN] = {1}, proof[CL_STORE_PROOF_LEN] = {2};
    cl_store_wbuf b = {0};
    cl_store_put_u8(&b, 1);
    cl_store_msg hello = {
        .op = CL_STORE_OP_HELLO, .num = 1, .vals = (cl_store_bytes[2]){{nonce, 32}}};
    fuzz_store_frame(&b, CL_STORE_OP_HELLO, 0, &hello);
    cl_store_msg auth = {.op = CL_STORE_OP_AUTH, .vals = (cl_store_bytes[1]){{proof, 32}}};
    fuzz_store_frame(&b, CL_STORE_OP_AUTH, 0, &auth);
    seed_requests(&b, CL_STORE_OP_SET);
    fuzz_seed_write(dir, "outsider-bad-proof", b.p, b.len);
    cl_store_wbuf_fini(&b);
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
