/*
 * client_hs.c — the store client's handshake, between the TCP connect and
 * READY: HELLO with the client's nonce, the server's HELLO, and with a
 * token the mutual proofs (interface in client.h; the connection it runs
 * on is client.c's).
 *
 * Design notes
 *  - Loop thread only. States: CONNECTING → HELLO (our HELLO sent) →
 *    (AUTH: our proof sent →) READY; cl_store_cli_ready (client.c) sends
 *    the queued requests.
 *  - Both sides prove they know the token (HMAC-SHA256 over both nonces,
 *    store/auth.h): the server proves it first, in its HELLO, so a client
 *    never sends its proof to a server that could not make its own.
 *  - A server that wants a token the client lacks, or one that uses none
 *    while the client has one, or whose proof is wrong, is refused: a last
 *    AUTH frame says why (written straight to the socket, best effort) and
 *    the connection ends with fatal = true: authentication failures and
 *    protocol refusals are not retried; the queued requests fail with the
 *    cause (a new request tries again).
 *  - Every path out of here that ends the connection goes through
 *    cl_store_cli_conn_lost, which frees the bufferevent: callers check
 *    c->bev (or the return value) before touching it again.
 */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "engine/engine.h"
#include "store/auth.h"
#include "store/client.h"

/* A last frame before we hang up on a server we refuse: written straight to
 * the socket so it leaves before the close (best effort). */
static void store_cli_send_last(cl_store_core *c, uint8_t kind) {
    cl_store_wbuf b = {0};
    cl_store_frame_begin(&b, CL_STORE_OP_AUTH, 0, 0);
    cl_store_put_u8(&b, kind);
    cl_store_put_bytes(&b, NULL, 0);
    if (cl_store_frame_end(&b, 0) == COLLIE_OK) {
        int fd = bufferevent_getfd(c->bev);
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0 && fd >= 0) {
            ssize_t n = send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
            CL_UNUSED(n);
        }
    }
    cl_store_wbuf_fini(&b);
}

void cl_store_cli_on_connected(cl_store_core *c) {
    int fd = bufferevent_getfd(c->bev), one = 1, idle = 10, intvl = 5, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* a server host that vanishes without a FIN is noticed in ~25 s */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    if (cl_store_auth_random(c->cnonce, sizeof c->cnonce) != COLLIE_OK) {
        cl_store_cli_conn_lost(c, COLLIE_ESYSTEM, true, "RAND_bytes failed");
        return;
    }
    cl_store_wbuf b = {0};
    cl_store_frame_begin(&b, CL_STORE_OP_HELLO, 0, 0);
    cl_store_put_u8(&b, c->token != NULL);
    cl_store_put_bytes(&b, c->cnonce, sizeof c->cnonce);
    if (cl_store_frame_end(&b, 0) == COLLIE_OK) cl_store_cli_send_ctl(c, &b);
    cl_store_wbuf_fini(&b);
    c->state = CL_STORE_HELLO;
}

/* ---- handshake ---------------------------------------------------------------------- */

static void store_cli_on_hello(cl_store_core *c, const cl_store_msg *m) {
    bool required = m->num != 0;
    const uint8_t *snonce = m->vals[0].p;
    if (required && !c->token) {
        store_cli_send_last(c, CL_STORE_AUTH_NO_TOKEN);
        cl_store_cli_conn_lost(c, COLLIE_EAUTH, true,
                               "the server requires a token and this client has none (set "
                               "collie_store_opts.token or COLLIE_STORE_TOKEN)");
        return;
    }
    if (!required && c->token) {
        store_cli_send_last(c, CL_STORE_AUTH_BAD_SERVER);
        cl_store_cli_conn_lost(c, COLLIE_EAUTH, true,
                               "the server does not use authentication but this client has a "
                               "token: refusing to trust it");
        return;
    }
    if (!required) {
        cl_store_cli_ready(c);
        return;
    }
    if (!cl_store_auth_verify(c->token, c->token_len, true, c->cnonce, snonce, m->vals[1].p,
                              m->vals[1].len)) {
        store_cli_send_last(c, CL_STORE_AUTH_BAD_SERVER);
        cl_store_cli_conn_lost(c, COLLIE_EAUTH, true,
                               "authentication failed: the server could not prove it knows this "
                               "client's token (the tokens differ)");
        return;
    }
    uint8_t proof[CL_STORE_PROOF_LEN];
    if (cl_store_auth_proof(c->token, c->token_len, false, c->cnonce, snonce, proof) != COLLIE_OK) {
        cl_store_cli_conn_lost(c, COLLIE_ESYSTEM, true, "HMAC-SHA256 failed");
        return;
    }
    cl_store_wbuf b = {0};
    cl_store_frame_begin(&b, CL_STORE_OP_AUTH, 0, 0);
    cl_store_put_u8(&b, CL_STORE_AUTH_PROOF);
    cl_store_put_bytes(&b, proof, sizeof proof);
    if (cl_store_frame_end(&b, 0) == COLLIE_OK) cl_store_cli_send_ctl(c, &b);
    cl_store_wbuf_fini(&b);
    c->state = CL_STORE_AUTH;
}

/* A frame during the handshake. Returns false if the connection is gone. */
bool cl_store_cli_on_handshake(cl_store_core *c, const cl_store_hdr *h, uint8_t op,
                               const uint8_t *body) {
    uint8_t want = c->state == CL_STORE_HELLO ? CL_STORE_OP_HELLO : CL_STORE_OP_AUTH;
    cl_store_msg m;
    char why[160];
    if (op != want) {
        cl_store_cli_conn_lost(c, COLLIE_EPROTO, true, "unexpected %s frame during the handshake",
                               cl_store_op_name(op));
        return false;
    }
    if (cl_store_reply_decode(op, h->status, body, h->body_len, &m, why, sizeof why) != COLLIE_OK) {
        cl_store_cli_conn_lost(c, COLLIE_EPROTO, true, "malformed handshake from the server: %s",
                               why);
        return false;
    }
    bool alive = true;
    if (h->status != COLLIE_OK) {
        int st = h->status == COLLIE_EAUTH ? COLLIE_EAUTH : COLLIE_EPROTO;
        cl_store_cli_conn_lost(c, st, true, "the server refused the handshake: %.*s",
                               (int)m.vals[0].len, (const char *)m.vals[0].p);
        alive = false;
    } else if (op == CL_STORE_OP_HELLO) {
        store_cli_on_hello(c, &m);
        alive = c->bev != NULL;
    } else {
        cl_store_cli_ready(c);
    }
    cl_store_msg_fini(&m);
    return alive;
}
