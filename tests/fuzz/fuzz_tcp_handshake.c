/*
 * fuzz_tcp_handshake.c — the TCP handshake's parser and verdicts
 * (transports/cpu/handshake.c), the first bytes an unauthenticated peer
 * reaches: the acceptor judging a HELLO, the dialer a CHALLENGE and an
 * ACCEPT. tcp_setup.c calls exactly these functions.
 *
 * Design notes
 *  - Input: byte 0 = flags (bit 0: the job has a secret; bits 1-2: the
 *    message kind, 3 = HELLO too; bit 3: put the right MAC into the message
 *    for the comm it claims, so that with a secret the checks behind the
 *    proof are reached as well); byte 2 = the comm's size (1 + it mod 16),
 *    byte 1 = this rank (mod the size); the rest is the message as it came off the
 *    socket (any length: tcp_setup.c hands over exactly the length its
 *    phase expects, the parser must refuse any other).
 *  - The MACs are computed as the library does: HMAC-SHA256 under the
 *    secret over cl_tcp_hs_mac_input, zeros without a secret.
 *  - Invariants asserted: decoding succeeds iff the length is the kind's
 *    and the magic ours, and a decoded message re-encodes to the same bytes;
 *    a refusal always says why; a CHALLENGE passes iff its version is ours;
 *    an ACCEPT passes iff its status is 0 and its MAC proves the acceptor,
 *    and a refusal maps to its status (2 EAUTH, 3 ESYSTEM, else EPROTO); a
 *    HELLO is accepted only for this comm, generation, size and version,
 *    from a rank below this one (so below the size), with the MAC for this
 *    comm; with a secret, a HELLO that does not prove it for the comm it
 *    claims is refused as AUTH with the fixed words (nothing of the comm
 *    leaks to a prober).
 */
#include "tests/fuzz/fuzz.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "collie.h"
#include "transports/cpu/handshake.h"

#define FUZZ_COMM 0x1122334455667788ull
#define FUZZ_GEN  3ull
#define FUZZ_VER  5u

static const char fuzz_secret[] = "fuzz-secret";

static void mac_for(bool auth, const char *label, const uint8_t *n1, const uint8_t *n2, uint64_t id,
                    uint64_t gen, uint32_t rank, uint32_t size, uint8_t out[CL_TCP_HS_MAC]) {
    uint8_t msg[CL_TCP_HS_MAC_INPUT];
    size_t len = cl_tcp_hs_mac_input(label, n1, n2, id, gen, rank, size, msg);
    FUZZ_CHECK(len > 0 && len <= sizeof msg, "mac input of %zu bytes", len);
    memset(out, 0, CL_TCP_HS_MAC);
    if (!auth) return;
    unsigned int olen = CL_TCP_HS_MAC;
    FUZZ_CHECK(HMAC(EVP_sha256(), fuzz_secret, sizeof fuzz_secret - 1, msg, len, out, &olen),
               "HMAC failed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    uint8_t fl = data[0];
    bool auth = fl & 1, fix_mac = fl & 8;
    cl_tcp_hs_kind kind = (cl_tcp_hs_kind)((fl >> 1) & 3);
    if (kind > CL_TCP_HS_ACCEPT) kind = CL_TCP_HS_HELLO;
    cl_tcp_hs_self me = {.comm_id = FUZZ_COMM,
                         .generation = FUZZ_GEN,
                         .version = FUZZ_VER,
                         .rank = data[1] % (1 + data[2] % 16), /* a rank of the comm */
                         .size = 1 + data[2] % 16,
                         .auth = auth};
    const uint8_t *in = data + 3;
    size_t len = size - 3;
    static const uint8_t nonce_mine[CL_TCP_HS_NONCE] = {0xa5, 1, 2, 3};
    static const uint8_t nonce_peer[CL_TCP_HS_NONCE] = {0x5a, 9, 8, 7};
    uint8_t buf[CL_TCP_HS_MAX_LEN];
    if (fix_mac && len == cl_tcp_hs_len(kind) && kind != CL_TCP_HS_CHALLENGE) {
        /* the message as a peer that knows the secret would send it */
        memcpy(buf, in, len);
        cl_tcp_hs_msg t;
        char w[200];
        if (cl_tcp_hs_decode(kind, buf, len, &t, w, sizeof w) == COLLIE_OK) {
            if (kind == CL_TCP_HS_HELLO)
                mac_for(auth, "collie-tcp hello", nonce_mine, t.nonce, t.comm_id, t.generation,
                        t.rank, t.size, t.mac);
            else
                mac_for(auth, "collie-tcp accept", nonce_mine, nonce_peer, FUZZ_COMM, FUZZ_GEN,
                        (uint32_t)me.rank, (uint32_t)me.size, t.mac);
            cl_tcp_hs_encode(kind, &t, buf);
            in = buf;
        }
    }

    cl_tcp_hs_msg m;
    char why[240] = "";
    int rc = cl_tcp_hs_decode(kind, in, len, &m, why, sizeof why);
    bool magic = len >= 4 && in[0] == 0x43 && in[1] == 0x4c && in[2] == 0x54 && in[3] == 0x48;
    FUZZ_CHECK((rc == COLLIE_OK) == (len == cl_tcp_hs_len(kind) && magic),
               "decode of %zu bytes of kind %d returned %d", len, (int)kind, rc);
    if (rc != COLLIE_OK) {
        FUZZ_CHECK(rc == COLLIE_EPROTO, "decode returned %d", rc);
        FUZZ_CHECK_WHY(why);
        return 0;
    }
    uint8_t again[CL_TCP_HS_MAX_LEN];
    FUZZ_CHECK(cl_tcp_hs_encode(kind, &m, again) == len && memcmp(again, in, len) == 0,
               "a %d message re-encodes differently", (int)kind);

    why[0] = '\0';
    if (kind == CL_TCP_HS_CHALLENGE) {
        rc = cl_tcp_hs_check_challenge(&me, &m, 1, why, sizeof why);
        FUZZ_CHECK((rc == COLLIE_OK) == (m.version == FUZZ_VER), "challenge verdict %d", rc);
        if (rc != COLLIE_OK) FUZZ_CHECK_WHY(why);
        return 0;
    }
    if (kind == CL_TCP_HS_ACCEPT) {
        uint8_t want[CL_TCP_HS_MAC];
        mac_for(auth, "collie-tcp accept", nonce_mine, nonce_peer, FUZZ_COMM, FUZZ_GEN,
                (uint32_t)me.rank, (uint32_t)me.size, want);
        rc = cl_tcp_hs_check_accept(&m, want, me.rank, why, sizeof why);
        bool good = m.status == 0 && memcmp(m.mac, want, sizeof want) == 0;
        FUZZ_CHECK((rc == COLLIE_OK) == good, "accept verdict %d for status %u", rc, m.status);
        if (m.status == CL_TCP_HS_REFUSE_AUTH)
            FUZZ_CHECK(rc == COLLIE_EAUTH, "status 2 gave %d", rc);
        if (m.status == CL_TCP_HS_REFUSE_SHM)
            FUZZ_CHECK(rc == COLLIE_ESYSTEM, "status 3 gave %d", rc);
        if (m.status != 0 && m.status != 2 && m.status != 3)
            FUZZ_CHECK(rc == COLLIE_EPROTO, "status %u gave %d", m.status, rc);
        if (rc != COLLIE_OK) FUZZ_CHECK_WHY(why);
        return 0;
    }
    /* the acceptor (this rank) judges a HELLO; its nonce came in the CHALLENGE */
    uint8_t want[CL_TCP_HS_MAC], claimed[CL_TCP_HS_MAC];
    mac_for(auth, "collie-tcp hello", nonce_mine, m.nonce, FUZZ_COMM, FUZZ_GEN, m.rank,
            (uint32_t)me.size, want);
    mac_for(auth, "collie-tcp hello", nonce_mine, m.nonce, m.comm_id, m.generation, m.rank, m.size,
            claimed);
    uint32_t refuse = cl_tcp_hs_judge_hello(&me, &m, claimed, want, why, sizeof why);
    bool proven = !auth || memcmp(claimed, m.mac, sizeof claimed) == 0;
    if (!proven) {
        FUZZ_CHECK(refuse == CL_TCP_HS_REFUSE_AUTH && strcmp(why, CL_TCP_HS_AUTH_FAILED) == 0,
                   "an unproven hello got refusal %u: '%s'", refuse, why);
        return 0;
    }
    if (refuse == 0) {
        FUZZ_CHECK(m.version == FUZZ_VER && m.comm_id == FUZZ_COMM && m.generation == FUZZ_GEN &&
                       m.size == (uint32_t)me.size,
                   "accepted a hello of another comm");
        FUZZ_CHECK(m.rank < (uint32_t)me.rank && m.rank < m.size,
                   "accepted rank %u at rank %d of %d", m.rank, me.rank, me.size);
        FUZZ_CHECK(memcmp(want, m.mac, sizeof want) == 0, "accepted a hello without its MAC");
        return 0;
    }
    FUZZ_CHECK(refuse == CL_TCP_HS_REFUSE_MISMATCH || refuse == CL_TCP_HS_REFUSE_AUTH, "refusal %u",
               refuse);
    FUZZ_CHECK_WHY(why);
    return 0;
}

/* ---- seeds ----------------------------------------------------------------------------- */

static void seed(const char *dir, const char *name, uint8_t fl, uint8_t rank, uint8_t size,
                 cl_tcp_hs_kind kind, const cl_tcp_hs_msg *m) {
    uint8_t buf[3 + CL_TCP_HS_MAX_LEN] = {fl, rank, size};
    size_t len = cl_tcp_hs_encode(kind, m, buf + 3);
    fuzz_seed_write(dir, name, buf, 3 + len);
}

static void fuzz_seeds(const char *dir) {
    cl_tcp_hs_msg ch = {.version = FUZZ_VER, .nonce = {0x5a, 9, 8, 7}};
    seed(dir, "challenge", 0 << 1, 1, 3, CL_TCP_HS_CHALLENGE, &ch);
    ch.version = 4;
    seed(dir, "challenge-old-version", 0 << 1, 1, 3, CL_TCP_HS_CHALLENGE, &ch);
    cl_tcp_hs_msg hello = {.version = FUZZ_VER,
                           .comm_id = FUZZ_COMM,
                           .generation = FUZZ_GEN,
                           .rank = 1,
                           .size = 4,
                           .nonce = {0x5a, 9, 8, 7}};
    seed(dir, "hello-no-secret", 1 << 1, 3, 3, CL_TCP_HS_HELLO, &hello);
    seed(dir, "hello-secret-fixed-mac", 1 | 1 << 1 | 8, 3, 3, CL_TCP_HS_HELLO, &hello);
    seed(dir, "hello-secret-unproven", 1 | 1 << 1, 3, 3, CL_TCP_HS_HELLO, &hello);
    hello.generation = 2;
    seed(dir, "hello-stale-generation", 1 | 1 << 1 | 8, 3, 3, CL_TCP_HS_HELLO, &hello);
    hello.generation = FUZZ_GEN;
    hello.rank = 3;
    seed(dir, "hello-rank-too-high", 1 << 1, 3, 3, CL_TCP_HS_HELLO, &hello);
    cl_tcp_hs_msg acc = {0};
    seed(dir, "accept-no-secret", 2 << 1, 1, 3, CL_TCP_HS_ACCEPT, &acc);
    seed(dir, "accept-secret-fixed-mac", 1 | 2 << 1 | 8, 1, 3, CL_TCP_HS_ACCEPT, &acc);
    for (uint32_t st = 1; st <= 3; st++) {
        char name[32];
        acc.status = st;
        snprintf(name, sizeof name, "accept-refused-%u", st);
        seed(dir, name, 2 << 1, 1, 3, CL_TCP_HS_ACCEPT, &acc);
    }
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
