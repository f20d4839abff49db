/*
 * mac_bench.c — the cost of the keyed MACs libcrypto offers, on a frame
 * header (48 B, the cost per message) and on 1 MiB (the cost per byte):
 * the measurement that chose the TCP frame MAC (transports/cpu/frame_mac.h).
 * Median of 7 runs of each; one core. `make bench-mac`.
 */
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned char key[32] = {1, 2, 3, 4};
static unsigned char tag[64];

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* one tag with an EVP_MAC (HMAC, BLAKE2b, SipHash), or an AEAD over the
 * frame as associated data (nonce per frame) */
typedef struct mac_alg {
    const char *label, *mac, *digest;
    const EVP_CIPHER *(*aead)(void);
} mac_alg;

static double run(const mac_alg *a, const unsigned char *buf, size_t len, int iters) {
    EVP_MAC_CTX *mc = NULL;
    EVP_CIPHER_CTX *cc = NULL;
    if (a->mac) {
        EVP_MAC *m = EVP_MAC_fetch(NULL, a->mac, NULL);
        if (!m) return -1;
        mc = EVP_MAC_CTX_new(m);
        EVP_MAC_free(m);
        OSSL_PARAM p[2] = {OSSL_PARAM_END, OSSL_PARAM_END};
        if (a->digest) p[0] = OSSL_PARAM_construct_utf8_string("digest", (char *)a->digest, 0);
        if (!EVP_MAC_init(mc, key, strcmp(a->mac, "SIPHASH") ? 32 : 16, p)) return -1;
    } else {
        cc = EVP_CIPHER_CTX_new();
        if (EVP_EncryptInit_ex(cc, a->aead(), NULL, key, NULL) != 1) return -1;
    }
    double t0 = now();
    for (int i = 0; i < iters; i++) {
        size_t tl;
        int ol;
        if (mc) {
            EVP_MAC_init(mc, NULL, 0, NULL);
            EVP_MAC_update(mc, buf, len);
            EVP_MAC_final(mc, tag, &tl, sizeof tag);
        } else {
            unsigned char iv[12] = {0};
            memcpy(iv + 4, &i, sizeof i);
            EVP_EncryptInit_ex(cc, NULL, NULL, NULL, iv);
            EVP_EncryptUpdate(cc, NULL, &ol, buf, (int)len);
            EVP_EncryptFinal_ex(cc, tag, &ol);
            EVP_CIPHER_CTX_ctrl(cc, EVP_CTRL_AEAD_GET_TAG, 16, tag);
        }
    }
    double t = (now() - t0) / iters;
    EVP_MAC_CTX_free(mc);
    EVP_CIPHER_CTX_free(cc);
    return t;
}

int main(void) {
    static const mac_alg algs[] = {
        {"HMAC-SHA256", "HMAC", "SHA256", NULL},
        {"HMAC-SHA512", "HMAC", "SHA512", NULL},
        {"BLAKE2b-MAC", "BLAKE2BMAC", NULL, NULL},
        {"SipHash-2-4", "SIPHASH", NULL, NULL},
        {"AES-128-GMAC", NULL, NULL, EVP_aes_128_gcm},
        {"ChaCha20-Poly1305 (AD only)", NULL, NULL, EVP_chacha20_poly1305},
    };
    size_t big = 1 << 20;
    unsigned char *buf = calloc(1, big);
    if (!buf) return 1;
    printf("| MAC | 48 B frame header (us) | 1 MiB (us) | 1 MiB (GB/s) |\n|---|---|---|---|\n");
    for (size_t k = 0; k < sizeof algs / sizeof algs[0]; k++) {
        double small[7], large[7];
        for (int r = 0; r < 7; r++) {
            small[r] = run(&algs[k], buf, 48, 20000);
            large[r] = run(&algs[k], buf, big, 30);
        }
        qsort(small, 7, sizeof small[0], cmp);
        qsort(large, 7, sizeof large[0], cmp);
        if (small[3] < 0) {
            printf("| %s | not in this libcrypto | | |\n", algs[k].label);
            continue;
        }
        printf("| %s | %.3f | %.1f | %.2f |\n", algs[k].label, small[3] * 1e6, large[3] * 1e6,
               (double)big / large[3] / 1e9);
    }
    free(buf);
    return 0;
}
