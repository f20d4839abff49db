/*
 * tcp_conn_impl.h — what the files of a connection share: its data path
 * (tcp_conn.c: lifecycle, tcp_conn_write.c: sending, tcp_conn_read.c:
 * reading, tcp_conn_match.c: matching and parking) and tcp_setup.c
 * (handshake, connecting, listening). Private to transports/cpu/.
 */
#ifndef CL_TCP_CONN_IMPL_H
#define CL_TCP_CONN_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/endian.h"
#include "transports/cpu/frame.h"
#include "transports/cpu/handshake.h"
#include "transports/cpu/cpu.h"

#define HS_CHALLENGE_LEN CL_TCP_HS_CHALLENGE_LEN
#define HS_HELLO_LEN     CL_TCP_HS_HELLO_LEN
#define HS_ACCEPT_LEN    CL_TCP_HS_ACCEPT_LEN

enum { HS_A_WAIT_HELLO = 1, HS_D_WAIT_CHALLENGE, HS_D_WAIT_ACCEPT, HS_DONE };

/* ---- little-endian helpers (engine/common.h's, by their short names here) ------- */

static inline void put32(uint8_t *p, uint32_t v) { cl_put32le(p, v); }
static inline void put64(uint8_t *p, uint64_t v) { cl_put64le(p, v); }
static inline uint32_t get32(const uint8_t *p) { return cl_get32le(p); }
static inline uint64_t get64(const uint8_t *p) { return cl_get64le(p); }

/* ---- the link: the byte stream under the framing ---------------------------------- */
/* Every frame byte of a connection moves through these two; the handshake
 * talks to the socket itself. The link is the TCP socket, or for a
 * same-host peer the shared-memory rings (transports/cpu/shm/link.h: EAGAIN
 * there means this side parked and the peer will ring its doorbell, the
 * Unix socket c->fd). Both return the bytes moved, or -1 with errno
 * (EAGAIN/EINTR: nothing now). Writing never raises SIGPIPE; `nowait` also
 * makes a blocking socket not wait. */
static inline bool cl_tcp_link_is_shm(const tcp_conn *c) { return c->shm.map != NULL; }

static inline ssize_t cl_tcp_link_recv(tcp_conn *c, void *buf, size_t len) {
    if (cl_tcp_link_is_shm(c)) /* a polled reader needs no doorbell: no parking */
        return cl_shm_link_recv(&c->shm, c->fd, buf, len, !c->tc->polled);
    return recv(c->fd, buf, len, 0);
}
static inline ssize_t cl_tcp_link_writev(tcp_conn *c, struct iovec *iov, int niov, bool nowait) {
    if (cl_tcp_link_is_shm(c)) return cl_shm_link_writev(&c->shm, c->fd, iov, niov);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    return sendmsg(c->fd, &mh, MSG_NOSIGNAL | (nowait ? MSG_DONTWAIT : 0));
}

/* the frame's root field for kinds without one */
#define TCP_NO_ROOT CL_TCP_NO_ROOT

/* tcp_conn.c */
tcp_conn *cl_tcp_conn_new(tcp_comm *tc, int peer);
/* peer health (core's peer_gone / peer_heard): what this link says of its peer */
void cl_tcp_conn_peer_gone(tcp_conn *c, int state);
void cl_tcp_conn_heard(tcp_conn *c);
void cl_tcp_conn_disagrees(tcp_conn *c); /* the next EPROTO: its frame disagreed with our post */
int cl_tcp_conn_attach_fd(tcp_conn *c, int fd);
/* the connection is ready: flush what waits to be sent */
void cl_tcp_conn_ready(tcp_conn *c);
/* the connection failed: close it, fail its works, fault the comm */
void cl_tcp_conn_lost(tcp_conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Refuse the peer's stream (a frame MAC that is missing or wrong): as
 * cl_tcp_conn_lost, after telling the peer why in an ABORT frame. */
void cl_tcp_conn_refuse(tcp_conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reading or writing the link failed with err (not EAGAIN/EINTR); `dir`:
 * "receive from" or "send to". */
void cl_tcp_conn_link_failed(tcp_conn *c, int err, const char *dir);

/* tcp_conn_write.c */
void cl_tcp_conn_on_write(int fd, unsigned what, void *arg);
void cl_tcp_conn_flush(tcp_conn *c);
void cl_tcp_conn_break_send(tcp_conn *c, const tcp_msg *cut);
/* does the send side hold a work's message not written whole yet? */
bool cl_tcp_conn_sends_pending(const tcp_conn *c);
/* return the credit owed to the peer (a quarter of the window at a time,
 * or all of it `now`) */
void cl_tcp_conn_send_credit(tcp_conn *c, bool now);
/* a charged frame was taken (into its slot or out of the park): its
 * charge goes back to the peer */
void cl_tcp_conn_consumed(tcp_conn *c, uint64_t charge);
/* ask for the frame announced for (seq, step): its slot is posted */
void cl_tcp_conn_send_cts(tcp_conn *c, uint64_t seq, uint32_t step);
/* the peer's control frames (the header in c->hdr): CREDIT, CTS */
void cl_tcp_conn_on_credit(tcp_conn *c);
void cl_tcp_conn_on_cts(tcp_conn *c);

/* tcp_conn_read.c */
void cl_tcp_conn_on_read(int fd, unsigned what, void *arg);
/* read the rest of the current frame into the void (s: its slot) */
void cl_tcp_conn_drain(tcp_conn *c, const tcp_slot *s);
/* sending failed: read what the peer said last before blaming it */
void cl_tcp_conn_read_last_words(tcp_conn *c);
/* Reading waits for a receive to be posted (the peer is ahead). */
static inline bool cl_tcp_conn_read_paused(const tcp_conn *c) {
    return c->have_hdr && !c->cur && !c->cur_unx && !c->cur_park && !c->reading_abort;
}

/* tcp_conn_match.c */
/* Match the complete header in c->hdr. Returns false to pause reading. */
bool cl_tcp_conn_match(tcp_conn *c);
/* the posted receive a p2p frame with this tag matches, taken (or NULL) */
tcp_slot *cl_tcp_conn_p2p_slot_take(tcp_conn *c, uint64_t tag);
/* parked frame p is complete: deliver it if its slot is posted */
void cl_tcp_conn_park_settle(tcp_conn *c, tcp_parked *p);
/* the peer's GONE (the header in c->hdr): the frame asked for never comes */
void cl_tcp_conn_on_gone(tcp_conn *c);

/* tcp_setup.c */
/* false if c was closed (no nonce) */
bool cl_tcp_hs_start_acceptor(tcp_conn *c);
/* a complete handshake message is in hs_in; false if c was closed */
bool cl_tcp_hs_process(tcp_conn *c);
void cl_tcp_conn_install(tcp_conn *c, int peer);
/* an accepted connection closed before it was identified: out of
 * tc->pending, freed on the loop's next turn (its callbacks may still be
 * on the stack) */
void cl_tcp_pending_closed(tcp_conn *c);
/* a listener accepted fd (a same-host Unix socket if `local`): start the
 * acceptor's side of the handshake on it */
void cl_tcp_conn_accepted(tcp_comm *tc, int fd, bool local);
/* A connection from outside was refused: logged at most once per 5 s, with
 * the count of the others (tcp_setup.c). */
void cl_tcp_log_refusal(tcp_comm *tc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* tcp_local.c */
/* The peer's published value: 0 = reach it over TCP at tcp_addr (its
 * "ip:port"), 1 = dialing its same-host socket, -1 = c was failed (why
 * logged through cl_tcp_conn_lost). */
int cl_tcp_local_route(tcp_conn *c, const char *value, char *tcp_addr, size_t len);
/* the handshake's socket I/O: on a same-host socket the ACCEPT carries the
 * link's memfd (acceptor), which the dialer's receive takes */
ssize_t cl_tcp_hs_send(tcp_conn *c, const void *buf, size_t len);
ssize_t cl_tcp_hs_recv(tcp_conn *c, void *buf, size_t len);
/* the acceptor makes the link's memory; the dialer checks and maps it */
int cl_tcp_local_make(tcp_conn *c, char *why, size_t len);
int cl_tcp_local_attach(tcp_conn *c, char *why, size_t len);

#endif
