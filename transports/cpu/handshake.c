/*
 * handshake.c — the TCP handshake's messages: encoding, parsing, verdicts
 * (format and contracts in handshake.h; the exchange is tcp_setup.c's).
 *
 * Design notes
 *  - Pure: no connection, socket, secret or global. The caller computes
 *    MACs (its secret) over cl_tcp_hs_mac_input and passes them in, so the
 *    code that judges what an unauthenticated peer sent is the code the
 *    fuzzer runs (tests/fuzz/fuzz_tcp_handshake.c).
 *  - A message is read only at its exact length: the caller collects
 *    cl_tcp_hs_len(kind) bytes first, so no field is read past the input.
 *  - Order of the HELLO checks: the proof first, so that with a secret
 *    nothing else about the comm is revealed to a sender without it.
 */
#include "transports/cpu/handshake.h"

#include <stdio.h>
#include <string.h>

#include "collie.h"
#include "base/endian.h"

static const char *const hs_kind_names[] = {"challenge", "hello", "accept"};

size_t cl_tcp_hs_len(cl_tcp_hs_kind kind) {
    switch (kind) {
    case CL_TCP_HS_CHALLENGE: return CL_TCP_HS_CHALLENGE_LEN;
    case CL_TCP_HS_HELLO: return CL_TCP_HS_HELLO_LEN;
    case CL_TCP_HS_ACCEPT: return CL_TCP_HS_ACCEPT_LEN;
    }
    return 0;
}

size_t cl_tcp_hs_encode(cl_tcp_hs_kind kind, const cl_tcp_hs_msg *m, uint8_t *out) {
    size_t len = cl_tcp_hs_len(kind);
    if (!len) return 0;
    memset(out, 0, len);
    cl_put32le(out, CL_TCP_HS_MAGIC);
    switch (kind) {
    case CL_TCP_HS_CHALLENGE:
        cl_put32le(out + 4, m->version);
        memcpy(out + 8, m->nonce, CL_TCP_HS_NONCE);
        break;
    case CL_TCP_HS_HELLO:
        cl_put32le(out + 4, m->version);
        cl_put64le(out + 8, m->comm_id);
        cl_put64le(out + 16, m->generation);
        cl_put32le(out + 24, m->rank);
        cl_put32le(out + 28, m->size);
        memcpy(out + 32, m->nonce, CL_TCP_HS_NONCE);
        memcpy(out + 48, m->mac, CL_TCP_HS_MAC);
        break;
    case CL_TCP_HS_ACCEPT:
        cl_put32le(out + 4, m->status);
        memcpy(out + 8, m->mac, CL_TCP_HS_MAC);
        break;
    }
    return len;
}

int cl_tcp_hs_decode(cl_tcp_hs_kind kind, const uint8_t *in, size_t len, cl_tcp_hs_msg *m,
                     char *why, size_t why_len) {
    memset(m, 0, sizeof *m);
    size_t want = cl_tcp_hs_len(kind);
    if (!want) {
        snprintf(why, why_len, "no handshake message of kind %d", (int)kind);
        return COLLIE_EPROTO;
    }
    if (len != want) {
        snprintf(why, why_len, "handshake %s of %zu bytes, expected %zu", hs_kind_names[kind], len,
                 want);
        return COLLIE_EPROTO;
    }
    if (cl_get32le(in) != CL_TCP_HS_MAGIC) {
        snprintf(why, why_len, "bad handshake magic");
        return COLLIE_EPROTO;
    }
    switch (kind) {
    case CL_TCP_HS_CHALLENGE:
        m->version = cl_get32le(in + 4);
        memcpy(m->nonce, in + 8, CL_TCP_HS_NONCE);
        break;
    case CL_TCP_HS_HELLO:
        m->version = cl_get32le(in + 4);
        m->comm_id = cl_get64le(in + 8);
        m->generation = cl_get64le(in + 16);
        m->rank = cl_get32le(in + 24);
        m->size = cl_get32le(in + 28);
        memcpy(m->nonce, in + 32, CL_TCP_HS_NONCE);
        memcpy(m->mac, in + 48, CL_TCP_HS_MAC);
        break;
    case CL_TCP_HS_ACCEPT:
        m->status = cl_get32le(in + 4);
        memcpy(m->mac, in + 8, CL_TCP_HS_MAC);
        break;
    }
    return COLLIE_OK;
}

size_t cl_tcp_hs_mac_input(const char *label, const uint8_t n1[CL_TCP_HS_NONCE],
                           const uint8_t n2[CL_TCP_HS_NONCE], uint64_t comm_id, uint64_t generation,
                           uint32_t rank, uint32_t size, uint8_t out[CL_TCP_HS_MAC_INPUT]) {
    size_t len = strlen(label);
    if (len > CL_TCP_HS_MAC_INPUT - 56) return 0;
    memcpy(out, label, len);
    cl_put64le(out + len, comm_id);
    cl_put64le(out + len + 8, generation);
    cl_put32le(out + len + 16, rank);
    cl_put32le(out + len + 20, size);
    memcpy(out + len + 24, n1, CL_TCP_HS_NONCE);
    memcpy(out + len + 40, n2, CL_TCP_HS_NONCE);
    return len + 56;
}

bool cl_tcp_hs_mac_equal(const uint8_t a[CL_TCP_HS_MAC], const uint8_t b[CL_TCP_HS_MAC]) {
    uint8_t d = 0;
    for (int i = 0; i < CL_TCP_HS_MAC; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

int cl_tcp_hs_check_challenge(const cl_tcp_hs_self *me, const cl_tcp_hs_msg *m, int peer, char *why,
                              size_t why_len) {
    if (m->version == me->version) return COLLIE_OK;
    snprintf(why, why_len, "rank %d speaks protocol version %u, we speak %u", peer, m->version,
             me->version);
    return COLLIE_EPROTO;
}

int cl_tcp_hs_check_accept(const cl_tcp_hs_msg *m, const uint8_t want[CL_TCP_HS_MAC], int peer,
                           char *why, size_t why_len) {
    if (m->status != 0) {
        snprintf(why, why_len, "rank %d refused our connection (%s)", peer,
                 m->status == CL_TCP_HS_REFUSE_AUTH  ? "authentication failed"
                 : m->status == CL_TCP_HS_REFUSE_SHM ? "it could not make the shared memory of "
                                                       "the link"
                                                     : "comm id or generation mismatch");
        return m->status == CL_TCP_HS_REFUSE_AUTH  ? COLLIE_EAUTH
               : m->status == CL_TCP_HS_REFUSE_SHM ? COLLIE_ESYSTEM
                                                   : COLLIE_EPROTO;
    }
    if (!cl_tcp_hs_mac_equal(want, m->mac)) {
        snprintf(why, why_len, "rank %d failed to authenticate (wrong shared secret?)", peer);
        return COLLIE_EAUTH;
    }
    return COLLIE_OK;
}

uint32_t cl_tcp_hs_judge_hello(const cl_tcp_hs_self *me, const cl_tcp_hs_msg *m,
                               const uint8_t claimed[CL_TCP_HS_MAC],
                               const uint8_t want[CL_TCP_HS_MAC], char *why, size_t why_len) {
    bool proven = !me->auth || cl_tcp_hs_mac_equal(claimed, m->mac);
    if (!proven) {
        snprintf(why, why_len, "%s", CL_TCP_HS_AUTH_FAILED);
        return CL_TCP_HS_REFUSE_AUTH;
    }
    if (m->version != me->version) {
        snprintf(why, why_len, "protocol version %u, expected %u", m->version, me->version);
        return CL_TCP_HS_REFUSE_MISMATCH;
    }
    if (m->comm_id != me->comm_id || m->generation != me->generation ||
        m->size != (uint32_t)me->size) {
        snprintf(why, why_len,
                 "it belongs to comm %016llx generation %llu of size %u, this is comm %016llx "
                 "generation %llu of size %d (%s)",
                 (unsigned long long)m->comm_id, (unsigned long long)m->generation, m->size,
                 (unsigned long long)me->comm_id, (unsigned long long)me->generation, me->size,
                 m->comm_id != me->comm_id ? "another comm's process"
                                           : "a stale process of an earlier incarnation?");
        return CL_TCP_HS_REFUSE_MISMATCH;
    }
    if (me->rank < 0 || m->rank >= (uint32_t)me->rank) {
        snprintf(why, why_len, "it claims rank %u, which must not dial rank %d", m->rank, me->rank);
        return CL_TCP_HS_REFUSE_MISMATCH;
    }
    if (!cl_tcp_hs_mac_equal(want, m->mac)) {
        snprintf(why, why_len, "%s", CL_TCP_HS_AUTH_FAILED);
        return CL_TCP_HS_REFUSE_AUTH;
    }
    return 0;
}
