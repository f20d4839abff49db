/*
 * auth.c — HMAC-SHA256 proofs, nonces and token resolution (protocol in
 * auth.h), and the loopback rule of a store without a token.
 *
 * Design notes: stateless and thread-safe (libcrypto's HMAC() and
 * RAND_bytes are). The label strings give the two directions different
 * proofs, so a server's proof can never be reflected back as a client's.
 */
#include "store/auth.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include "collie.h"
#include "engine/engine.h"

static const char store_auth_server_label[] = "collie-store/1 server";
static const char store_auth_client_label[] = "collie-store/1 client";

int cl_store_auth_random(void *buf, size_t len) {
    if (len > INT32_MAX || RAND_bytes(buf, (int)len) != 1)
        return cl_set_last_error(COLLIE_ESYSTEM, "RAND_bytes failed");
    return COLLIE_OK;
}

int cl_store_auth_proof(const char *token, size_t token_len, bool server,
                        const uint8_t cnonce[CL_STORE_NONCE_LEN],
                        const uint8_t snonce[CL_STORE_NONCE_LEN], uint8_t out[CL_STORE_PROOF_LEN]) {
    const char *label = server ? store_auth_server_label : store_auth_client_label;
    size_t llen = strlen(label);
    uint8_t msg[sizeof store_auth_server_label + 2 * CL_STORE_NONCE_LEN];
    memcpy(msg, label, llen);
    memcpy(msg + llen, cnonce, CL_STORE_NONCE_LEN);
    memcpy(msg + llen + CL_STORE_NONCE_LEN, snonce, CL_STORE_NONCE_LEN);
    unsigned int olen = 0;
    if (token_len > CL_STORE_TOKEN_MAX ||
        !HMAC(EVP_sha256(), token, (int)token_len, msg, llen + 2 * CL_STORE_NONCE_LEN, out,
              &olen) ||
        olen != CL_STORE_PROOF_LEN)
        return cl_set_last_error(COLLIE_ESYSTEM, "HMAC-SHA256 failed");
    return COLLIE_OK;
}

bool cl_store_auth_verify(const char *token, size_t token_len, bool server,
                          const uint8_t cnonce[CL_STORE_NONCE_LEN],
                          const uint8_t snonce[CL_STORE_NONCE_LEN], const uint8_t *proof,
                          size_t len) {
    uint8_t want[CL_STORE_PROOF_LEN];
    if (len != CL_STORE_PROOF_LEN ||
        cl_store_auth_proof(token, token_len, server, cnonce, snonce, want) != COLLIE_OK)
        return false;
    bool ok = CRYPTO_memcmp(want, proof, CL_STORE_PROOF_LEN) == 0;
    OPENSSL_cleanse(want, sizeof want);
    return ok;
}

int cl_store_auth_token(const char *given, const char *who, char **out) {
    *out = NULL;
    const char *t = given ? given : cl_config_get()->store_token;
    if (!t) return COLLIE_OK;
    size_t len = strlen(t);
    if (len == 0)
        return cl_set_last_error(COLLIE_EINVAL, "%s: the token is empty (pass NULL for none)", who);
    if (len > CL_STORE_TOKEN_MAX)
        return cl_set_last_error(COLLIE_EINVAL, "%s: the token is %zu bytes, at most %d allowed",
                                 who, len, CL_STORE_TOKEN_MAX);
    if (!(*out = cl_strdup(t))) return COLLIE_ENOMEM;
    return COLLIE_OK;
}

bool cl_store_sockaddr_is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family != AF_INET6) return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return true;
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

bool cl_store_host_is_loopback(const char *host) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL, *it;
    if (!host || getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) return false;
    bool all = true;
    for (it = ai; it && all; it = it->ai_next)
        all = cl_store_sockaddr_is_loopback(it->ai_addr);
    freeaddrinfo(ai);
    return all;
}
