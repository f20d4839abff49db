/*
 * handshake.h — the messages of the TCP transport's handshake (tcp_setup.c
 * runs it): their encoding, and the parsing and judging of what a peer
 * sent, as pure functions (no connection, no socket, no secret: the MACs
 * are computed by the caller over cl_tcp_hs_mac_input). These are the
 * first bytes an unauthenticated peer reaches; tests/fuzz/fuzz_tcp_handshake.c
 * feeds them.
 *
 * The messages (little-endian):
 *   CHALLENGE (acceptor → dialer, 24)  u32 magic, u32 version, nonce_a[16]
 *   HELLO     (dialer → acceptor, 80)  u32 magic, u32 version, u64 comm id,
 *                                      u64 generation, u32 rank, u32 size,
 *                                      nonce_d[16], mac[32]
 *   ACCEPT    (acceptor → dialer, 40)  u32 magic, u32 status (0 or
 *                                      CL_TCP_HS_REFUSE_*), mac[32] (zeros
 *                                      in a refusal)
 */
#ifndef CL_TCP_HANDSHAKE_H
#define CL_TCP_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CL_TCP_HS_MAGIC         0x48544c43u /* "CLTH" */
#define CL_TCP_HS_CHALLENGE_LEN 24
#define CL_TCP_HS_HELLO_LEN     80
#define CL_TCP_HS_ACCEPT_LEN    40
#define CL_TCP_HS_NONCE         16
#define CL_TCP_HS_MAC           32
#define CL_TCP_HS_MAX_LEN       80 /* the longest message */
#define CL_TCP_HS_MAC_INPUT     96 /* bytes cl_tcp_hs_mac_input may write */

typedef enum cl_tcp_hs_kind {
    CL_TCP_HS_CHALLENGE = 0,
    CL_TCP_HS_HELLO,
    CL_TCP_HS_ACCEPT,
} cl_tcp_hs_kind;

/* ACCEPT's status: why the acceptor refused the HELLO */
enum {
    CL_TCP_HS_REFUSE_MISMATCH = 1, /* another comm, generation, size or version; or its rank */
    CL_TCP_HS_REFUSE_AUTH = 2,     /* its proof did not verify */
    CL_TCP_HS_REFUSE_SHM = 3,      /* the acceptor could not make the link's shared memory */
};

/* A message, decoded; each kind uses the fields its layout above has. */
typedef struct cl_tcp_hs_msg {
    uint32_t version;               /* CHALLENGE, HELLO */
    uint32_t status;                /* ACCEPT */
    uint64_t comm_id, generation;   /* HELLO */
    uint32_t rank, size;            /* HELLO: the dialer's rank, the comm's size */
    uint8_t nonce[CL_TCP_HS_NONCE]; /* CHALLENGE: the acceptor's; HELLO: the dialer's */
    uint8_t mac[CL_TCP_HS_MAC];     /* HELLO, ACCEPT */
} cl_tcp_hs_msg;

/* The side that judges a message: this rank of this comm. */
typedef struct cl_tcp_hs_self {
    uint64_t comm_id, generation;
    uint32_t version; /* TCP_PROTO_VERSION (a test may speak another) */
    int rank, size;
    bool auth; /* the job has a secret: MACs are HMACs, else zeros */
} cl_tcp_hs_self;

/* cl_tcp_hs_len: the length of a message of `kind` (0 for no kind). */
size_t cl_tcp_hs_len(cl_tcp_hs_kind kind);

/* cl_tcp_hs_encode: write m as a message of `kind` into out (at least
 * cl_tcp_hs_len(kind) bytes); returns that length. */
size_t cl_tcp_hs_encode(cl_tcp_hs_kind kind, const cl_tcp_hs_msg *m, uint8_t *out);

/* cl_tcp_hs_decode: parse the `len` bytes of a message of `kind` (len must
 * be its length, the magic ours) into m. COLLIE_OK, or COLLIE_EPROTO with
 * `why`; m is zeroed first either way. */
int cl_tcp_hs_decode(cl_tcp_hs_kind kind, const uint8_t *in, size_t len, cl_tcp_hs_msg *m,
                     char *why, size_t why_len);

/* cl_tcp_hs_mac_input: the bytes a handshake MAC covers — a label, the comm
 * (id, generation, size) it is for, a rank and both nonces — into out
 * (CL_TCP_HS_MAC_INPUT bytes); returns their length (0: the label is too
 * long). */
size_t cl_tcp_hs_mac_input(const char *label, const uint8_t n1[CL_TCP_HS_NONCE],
                           const uint8_t n2[CL_TCP_HS_NONCE], uint64_t comm_id, uint64_t generation,
                           uint32_t rank, uint32_t size, uint8_t out[CL_TCP_HS_MAC_INPUT]);

/* cl_tcp_hs_mac_equal: constant-time comparison of two MACs. */
bool cl_tcp_hs_mac_equal(const uint8_t a[CL_TCP_HS_MAC], const uint8_t b[CL_TCP_HS_MAC]);

/* cl_tcp_hs_check_challenge: the dialer's verdict on the acceptor (rank
 * `peer`)'s CHALLENGE: COLLIE_OK, or COLLIE_EPROTO (another protocol
 * version) with `why`. */
int cl_tcp_hs_check_challenge(const cl_tcp_hs_self *me, const cl_tcp_hs_msg *m, int peer, char *why,
                              size_t why_len);

/* cl_tcp_hs_check_accept: the dialer's verdict on the ACCEPT of rank
 * `peer`, whose MAC must be `want` (the acceptor proving the secret):
 * COLLIE_OK; or the refusal it carries (COLLIE_EAUTH, COLLIE_ESYSTEM for
 * the link's memory, COLLIE_EPROTO for a mismatch or an unknown status), or
 * COLLIE_EAUTH for a MAC that does not verify, with `why`. */
int cl_tcp_hs_check_accept(const cl_tcp_hs_msg *m, const uint8_t want[CL_TCP_HS_MAC], int peer,
                           char *why, size_t why_len);

/* cl_tcp_hs_judge_hello: the acceptor's verdict on a HELLO. `claimed` is
 * the MAC for the comm the HELLO names, `want` the one for this comm (both
 * over the HELLO's rank and the nonces, label "collie-tcp hello"). Returns
 * 0 (accept: m->rank is a rank below me->rank) or the CL_TCP_HS_REFUSE_*
 * to send, with `why`. With a secret, a HELLO that does not prove it for
 * the comm it claims gets REFUSE_AUTH and the same words whatever else is
 * wrong (an outsider learns nothing of the comm by probing); one proven
 * for another comm is a real, stale process and is told why. */
uint32_t cl_tcp_hs_judge_hello(const cl_tcp_hs_self *me, const cl_tcp_hs_msg *m,
                               const uint8_t claimed[CL_TCP_HS_MAC],
                               const uint8_t want[CL_TCP_HS_MAC], char *why, size_t why_len);

/* the words of a refusal for a HELLO that does not prove the secret */
#define CL_TCP_HS_AUTH_FAILED "authentication failed (wrong shared secret?)"

#endif
