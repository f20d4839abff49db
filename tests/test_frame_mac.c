/*
 * test_frame_mac.c — the TCP frame MAC (transports/tcp/frame_mac.h): a tag
 * fed in any pieces equals the one-shot tag, and every change the MAC is
 * there to catch is caught: a flipped bit anywhere in header or payload, a
 * frame under another number (dropped, replayed or reordered), in the other
 * direction, or under another connection's key; a truncated payload.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transports/tcp/frame_mac.h"
#include "runner.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng();
}

static const uint8_t session[32] = {7, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3,
                                    2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5};

/* the streamed tag (random pieces) equals the one-shot tag, and checks */
static void test_pieces_equal_one_shot(void **state) {
    (void)state;
    cl_frame_mac tx, rx;
    assert_true(cl_frame_mac_init(&tx, session, true));
    assert_true(cl_frame_mac_init(&rx, session, true));
    size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 4096, 100003, 1 << 20};
    uint8_t hdr[48];
    uint8_t *payload = malloc(1 << 20);
    assert_non_null(payload);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        fill(hdr, sizeof hdr);
        fill(payload, n);
        uint8_t tag[CL_FRAME_MAC_TAG];
        assert_true(cl_frame_mac_tag(&tx, k, hdr, sizeof hdr, payload, n, tag));
        for (int round = 0; round < 4; round++) {
            assert_true(cl_frame_mac_begin(&rx, k));
            size_t off = 0; /* the header in two pieces, the payload in random ones */
            assert_true(cl_frame_mac_update(&rx, hdr, 20));
            assert_true(cl_frame_mac_update(&rx, hdr + 20, sizeof hdr - 20));
            while (off < n) {
                size_t piece = 1 + rng() % (n - off < 9000 ? n - off : 9000);
                assert_true(cl_frame_mac_update(&rx, payload + off, piece));
                off += piece;
            }
            assert_true(cl_frame_mac_check(&rx, tag));
        }
    }
    free(payload);
    cl_frame_mac_fini(&tx);
    cl_frame_mac_fini(&rx);
}

/* every bit of a 48-byte header and a sample of the payload's bits */
static void test_any_flipped_bit_fails(void **state) {
    (void)state;
    cl_frame_mac m;
    assert_true(cl_frame_mac_init(&m, session, false));
    uint8_t hdr[48], payload[777], tag[CL_FRAME_MAC_TAG];
    fill(hdr, sizeof hdr);
    fill(payload, sizeof payload);
    assert_true(cl_frame_mac_tag(&m, 42, hdr, sizeof hdr, payload, sizeof payload, tag));
    for (size_t bit = 0; bit < 8 * sizeof hdr; bit++) {
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_true(cl_frame_mac_begin(&m, 42));
        assert_true(cl_frame_mac_update(&m, hdr, sizeof hdr));
        assert_true(cl_frame_mac_update(&m, payload, sizeof payload));
        assert_false(cl_frame_mac_check(&m, tag));
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    for (int i = 0; i < 200; i++) {
        size_t bit = rng() % (8 * sizeof payload);
        payload[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        uint8_t t2[CL_FRAME_MAC_TAG];
        assert_true(cl_frame_mac_tag(&m, 42, hdr, sizeof hdr, payload, sizeof payload, t2));
        assert_memory_not_equal(t2, tag, sizeof tag);
        payload[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    /* a flipped bit of the tag itself */
    for (int bit = 0; bit < 8 * CL_FRAME_MAC_TAG; bit++) {
        uint8_t bad[CL_FRAME_MAC_TAG];
        memcpy(bad, tag, sizeof bad);
        bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_true(cl_frame_mac_begin(&m, 42));
        assert_true(cl_frame_mac_update(&m, hdr, sizeof hdr));
        assert_true(cl_frame_mac_update(&m, payload, sizeof payload));
        assert_false(cl_frame_mac_check(&m, bad));
    }
    cl_frame_mac_fini(&m);
}

/* the same bytes under another number, direction or session, or cut short */
static void test_number_direction_session_length(void **state) {
    (void)state;
    cl_frame_mac d2a, a2d, other;
    uint8_t session2[32];
    memcpy(session2, session, sizeof session2);
    session2[31] ^= 1;
    assert_true(cl_frame_mac_init(&d2a, session, true));
    assert_true(cl_frame_mac_init(&a2d, session, false));
    assert_true(cl_frame_mac_init(&other, session2, true));
    uint8_t hdr[48], payload[256], t[CL_FRAME_MAC_TAG], u[CL_FRAME_MAC_TAG];
    fill(hdr, sizeof hdr);
    fill(payload, sizeof payload);
    assert_true(cl_frame_mac_tag(&d2a, 5, hdr, sizeof hdr, payload, sizeof payload, t));
    uint64_t others[] = {0, 4, 6, 5ull << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        assert_true(cl_frame_mac_tag(&d2a, others[i], hdr, sizeof hdr, payload, sizeof payload, u));
        assert_memory_not_equal(t, u, sizeof t);
    }
    assert_true(cl_frame_mac_tag(&a2d, 5, hdr, sizeof hdr, payload, sizeof payload, u));
    assert_memory_not_equal(t, u, sizeof t);
    assert_true(cl_frame_mac_tag(&other, 5, hdr, sizeof hdr, payload, sizeof payload, u));
    assert_memory_not_equal(t, u, sizeof t);
    assert_true(cl_frame_mac_tag(&d2a, 5, hdr, sizeof hdr, payload, sizeof payload - 1, u));
    assert_memory_not_equal(t, u, sizeof t);
    /* the boundary between header and payload is part of nothing: the MAC
     * covers the byte stream, and the header fixes the payload's length */
    assert_true(cl_frame_mac_tag(&d2a, 5, hdr, sizeof hdr, payload, sizeof payload, u));
    assert_memory_equal(t, u, sizeof t);
    cl_frame_mac_fini(&d2a);
    cl_frame_mac_fini(&a2d);
    cl_frame_mac_fini(&other);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_equal_one_shot),
        cmocka_unit_test(test_any_flipped_bit_fails),
        cmocka_unit_test(test_number_direction_session_length),
    };
    return cltest_main(tests, NULL, NULL);
}
