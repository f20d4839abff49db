/*
 * siphash.c — SipHash-2-4, written from the paper's reference description.
 * Checked against the paper's test vector in tests/test_store_proto.c.
 */
#include "store/siphash.h"

#define CL_SIP_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

#define CL_SIP_ROUND(v0, v1, v2, v3)                                                               \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = CL_SIP_ROTL(v1, 13);                                                                  \
        v1 ^= v0;                                                                                  \
        v0 = CL_SIP_ROTL(v0, 32);                                                                  \
        v2 += v3;                                                                                  \
        v3 = CL_SIP_ROTL(v3, 16);                                                                  \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = CL_SIP_ROTL(v3, 21);                                                                  \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = CL_SIP_ROTL(v1, 17);                                                                  \
        v1 ^= v2;                                                                                  \
        v2 = CL_SIP_ROTL(v2, 32);                                                                  \
    } while (0)

static uint64_t store_sip_rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

uint64_t cl_store_siphash(const uint8_t key[16], const void *data, size_t len) {
    const uint8_t *in = data;
    uint64_t k0 = store_sip_rd64(key), k1 = store_sip_rd64(key + 8);
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
    size_t left = len & 7;
    const uint8_t *end = in + (len - left);
    for (; in != end; in += 8) {
        uint64_t m = store_sip_rd64(in);
        v3 ^= m;
        CL_SIP_ROUND(v0, v1, v2, v3);
        CL_SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < left; i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    CL_SIP_ROUND(v0, v1, v2, v3);
    CL_SIP_ROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    for (int i = 0; i < 4; i++)
        CL_SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}
