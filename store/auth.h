/*
 * auth.h — the store's optional shared-secret authentication.
 *
 * Mutual challenge-response with HMAC-SHA256 (OpenSSL libcrypto):
 *
 *   client → server  HELLO  has_token, cnonce (32 random bytes)
 *   server → client  HELLO  auth_required, snonce (32 random bytes),
 *                           sproof = HMAC(token, "collie-store/1 server" | cnonce | snonce)
 *   client → server  AUTH   cproof = HMAC(token, "collie-store/1 client" | cnonce | snonce)
 *   server → client  AUTH   OK or COLLIE_EAUTH
 *
 * The server proves itself first (over the client's fresh nonce), so a
 * client never talks to an impostor; the client's proof covers the server's
 * fresh nonce, so a recorded exchange cannot be replayed. Proofs are compared
 * in constant time (CRYPTO_memcmp). The token itself never crosses the wire.
 *
 * Below: the loopback rule of a store without a token.
 */
#ifndef CL_STORE_AUTH_H
#define CL_STORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include "store/proto.h"

/* Longest accepted token (bytes). */
#define CL_STORE_TOKEN_MAX 4096

/* cl_store_auth_random: fill buf with cryptographically random bytes.
 * Returns COLLIE_OK or COLLIE_ESYSTEM (RAND_bytes failed). */
int cl_store_auth_random(void *buf, size_t len);

/* cl_store_auth_proof: the server's (server = true) or the client's proof
 * for this pair of nonces. Returns COLLIE_OK or COLLIE_ESYSTEM. */
int cl_store_auth_proof(const char *token, size_t token_len, bool server,
                        const uint8_t cnonce[CL_STORE_NONCE_LEN],
                        const uint8_t snonce[CL_STORE_NONCE_LEN], uint8_t out[CL_STORE_PROOF_LEN]);

/* cl_store_auth_verify: does `proof` (len bytes, from the peer) match the
 * proof we compute? Constant time in the proof's content. */
bool cl_store_auth_verify(const char *token, size_t token_len, bool server,
                          const uint8_t cnonce[CL_STORE_NONCE_LEN],
                          const uint8_t snonce[CL_STORE_NONCE_LEN], const uint8_t *proof,
                          size_t len);

/* cl_store_auth_token: resolve the token to use: `given` if not NULL, else
 * COLLIE_STORE_TOKEN, else none (*out = NULL). A token that is empty or too
 * long is COLLIE_EINVAL (collie_last_error says why; `who` names the
 * caller). *out is malloc'd. */
int cl_store_auth_token(const char *given, const char *who, char **out);

/* ---- the loopback rule (docs/security.md) ---------------------------------------------- */
/* Without a secret, nothing is served beyond loopback and no comm trusts a
 * store beyond it, unless the user opts in (COLLIE_INSECURE=1, the server's
 * opts.insecure, collie-store --insecure). */

/* cl_store_sockaddr_is_loopback: 127.0.0.0/8, ::1, or ::ffff:127.x. */
bool cl_store_sockaddr_is_loopback(const struct sockaddr *sa);

/* cl_store_host_is_loopback: does every address `host` resolves to lie on
 * loopback? (Blocking: not on the loop thread.) A host that does not
 * resolve is not loopback. */
bool cl_store_host_is_loopback(const char *host);

#endif
