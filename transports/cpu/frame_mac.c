/*
 * frame_mac.c — the frame MAC (frame_mac.h): ChaCha20-Poly1305 over the
 * frame as associated data, nonce = the frame's number.
 *
 * Design notes
 *  - One EVP_CIPHER_CTX per direction, set up once with the cipher and
 *    the key; each frame only sets the nonce (EVP_EncryptInit_ex with
 *    NULL cipher and key), so a frame costs no allocation.
 *  - Associated data may come in any number of pieces before the (empty)
 *    final: the receiver feeds it as the bytes arrive. EVP lengths are
 *    ints: longer pieces go in slices.
 *  - The direction keys are HMAC-SHA256(session key, label): the two
 *    directions never share a (key, nonce) pair although both count from 0.
 */
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "transports/cpu/frame_mac.h"

bool cl_frame_mac_init(cl_frame_mac *m, const uint8_t session_key[32], bool from_dialer) {
    static const char d2a[] = "collie frame mac: dialer to acceptor";
    static const char a2d[] = "collie frame mac: acceptor to dialer";
    const char *label = from_dialer ? d2a : a2d;
    unsigned int len = 0;
    memset(m, 0, sizeof *m);
    if (!HMAC(EVP_sha256(), session_key, 32, (const unsigned char *)label, strlen(label), m->key,
              &len) ||
        len != sizeof m->key)
        return false;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx) return false;
    if (EVP_EncryptInit_ex(ctx, EVP_chacha20_poly1305(), NULL, m->key, NULL) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return false;
    }
    m->ctx = ctx;
    return true;
}

void cl_frame_mac_fini(cl_frame_mac *m) {
    if (m->ctx) EVP_CIPHER_CTX_free(m->ctx);
    OPENSSL_cleanse(m->key, sizeof m->key);
    m->ctx = NULL;
}

bool cl_frame_mac_begin(cl_frame_mac *m, uint64_t n) {
    uint8_t nonce[12] = {0};
    for (int i = 0; i < 8; i++)
        nonce[4 + i] = (uint8_t)(n >> (56 - 8 * i));
    return m->ctx && EVP_EncryptInit_ex(m->ctx, NULL, NULL, NULL, nonce) == 1;
}

bool cl_frame_mac_update(cl_frame_mac *m, const void *p, size_t len) {
    const unsigned char *b = p;
    while (len > 0) {
        int piece = len > (1u << 30) ? (1 << 30) : (int)len, out = 0;
        if (EVP_EncryptUpdate(m->ctx, NULL, &out, b, piece) != 1) return false;
        b += piece;
        len -= (size_t)piece;
    }
    return true;
}

bool cl_frame_mac_end(cl_frame_mac *m, uint8_t tag[CL_FRAME_MAC_TAG]) {
    unsigned char none[16];
    int out = 0;
    return EVP_EncryptFinal_ex(m->ctx, none, &out) == 1 &&
           EVP_CIPHER_CTX_ctrl(m->ctx, EVP_CTRL_AEAD_GET_TAG, CL_FRAME_MAC_TAG, tag) == 1;
}

bool cl_frame_mac_check(cl_frame_mac *m, const uint8_t tag[CL_FRAME_MAC_TAG]) {
    uint8_t want[CL_FRAME_MAC_TAG];
    return cl_frame_mac_end(m, want) && CRYPTO_memcmp(want, tag, CL_FRAME_MAC_TAG) == 0;
}

bool cl_frame_mac_tag(cl_frame_mac *m, uint64_t n, const void *hdr, size_t hdr_len,
                      const void *payload, size_t len, uint8_t tag[CL_FRAME_MAC_TAG]) {
    return cl_frame_mac_begin(m, n) && cl_frame_mac_update(m, hdr, hdr_len) &&
           cl_frame_mac_update(m, payload, len) && cl_frame_mac_end(m, tag);
}
