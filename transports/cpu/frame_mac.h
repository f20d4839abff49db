/*
 * frame_mac.h — the MAC that binds a TCP frame to its session (a job with a
 * secret): a tag over the whole frame, header and payload, keyed per
 * connection and direction, numbered so that no frame can be dropped,
 * replayed, reordered or moved to another connection unnoticed.
 *
 * Design notes
 *  - Algorithm: ChaCha20-Poly1305 (libcrypto's AEAD) used for
 *    authentication only: the frame is the associated data, nothing is
 *    encrypted, the 16-byte tag follows the payload. The nonce is the
 *    frame's number in its direction (64 bits, from 0), never reused under
 *    one key: each connection has its own session key (the handshake's,
 *    from the secret and both nonces) and each direction its own key
 *    derived from it. Chosen by measurement (bench/mac_bench.c, `make
 *    bench-mac`; bench/RESULTS.md, "Frame MAC cost"): the fastest per byte
 *    of libcrypto's keyed MACs on these machines (AES-GMAC next, HMAC-SHA256
 *    and SipHash several times slower), at a fraction of a microsecond per
 *    header.
 *  - Numbering is implicit: both ends count the frames of a direction. The
 *    sender numbers a frame only once its first byte is written (a frame
 *    that is dropped before that, its work ended, takes no number), so the
 *    numbers on the stream have no gaps.
 *  - Pure functions of their inputs (no I/O, no state of the transport):
 *    the fuzzers reach them directly.
 */
#ifndef CL_TCP_FRAME_MAC_H
#define CL_TCP_FRAME_MAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CL_FRAME_MAC_TAG 16 /* bytes of the tag after a frame's payload */

/* One direction of one connection: its key and a reusable cipher context. */
typedef struct cl_frame_mac {
    void *ctx; /* EVP_CIPHER_CTX */
    uint8_t key[32];
} cl_frame_mac;

/* cl_frame_mac_init: the key of one direction from the connection's
 * session key; `from_dialer` says which direction (frames the dialer
 * sends, or the acceptor). false when libcrypto has no memory. */
bool cl_frame_mac_init(cl_frame_mac *m, const uint8_t session_key[32], bool from_dialer);
void cl_frame_mac_fini(cl_frame_mac *m);

/* Streaming: begin frame number `n`, feed its bytes in order (any
 * pieces), then end: the tag (cl_frame_mac_end) or whether `tag` is the
 * right one, compared in constant time (cl_frame_mac_check). false from
 * begin/update/end on a libcrypto failure. */
bool cl_frame_mac_begin(cl_frame_mac *m, uint64_t n);
bool cl_frame_mac_update(cl_frame_mac *m, const void *p, size_t len);
bool cl_frame_mac_end(cl_frame_mac *m, uint8_t tag[CL_FRAME_MAC_TAG]);
bool cl_frame_mac_check(cl_frame_mac *m, const uint8_t tag[CL_FRAME_MAC_TAG]);

/* cl_frame_mac_tag: the tag of frame `n` made of hdr then payload. */
bool cl_frame_mac_tag(cl_frame_mac *m, uint64_t n, const void *hdr, size_t hdr_len,
                      const void *payload, size_t len, uint8_t tag[CL_FRAME_MAC_TAG]);

#endif
