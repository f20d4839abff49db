/*
 * fuzz_tcp_frame.c — the TCP frame header as a receiver judges it
 * (transports/cpu/frame.c, called by tcp_conn_read.c on every header it reads)
 * and the words of a peer's ABORT.
 *
 * Design notes
 *  - Input: byte 0 = the link (bit 0: shared memory, bit 1: keyed, bit 2:
 *    the MAC required here; required implies keyed, as in tcp_conn_read.c;
 *    bit 3: put this comm's generation into the header, so the checks
 *    behind it are reached), byte 1 = the sender's rank; then a 48-byte
 *    header; what follows is an ABORT's reason (the frame's length of it,
 *    at most what is there).
 *  - Invariants asserted: decode(encode(x)) == x and encode(decode(h)) == h;
 *    a header that passes has our magic and generation, a MAC flag the link
 *    allows (and has it where the link requires it), flags that fit its
 *    kind (a loan only over shared memory and never empty, RTS/CLEARED only
 *    on collective frames, never both RTS and loan/cleared, control frames
 *    bare), a kind that exists, and for data frames: a valid dtype (bar a
 *    barrier) and reduction op (for reducing kinds), no root for kinds
 *    without one, a counts check only for the v collectives, a p2p length
 *    of exactly count elements; an ABORT's length is at most TCP_ABORT_MAX;
 *    only a missing tag on a link that requires one is EAUTH; every
 *    refusal names the sender. An ABORT's words are a NUL-terminated string
 *    within the buffer that names the sender's rank.
 */
#include "tests/fuzz/fuzz.h"

#include "collie.h"
#include "collie_backend.h"
#include "transports/cpu/frame.h"
#include "transports/cpu/cpu.h"

#define FUZZ_GEN 7u

static void check_abort_words(const uint8_t *reason, size_t len, int peer) {
    char out[TCP_ABORT_MAX + 64];
    memset(out, 0x55, sizeof out);
    cl_tcp_frame_abort_words((const char *)reason, len, peer, out, sizeof out);
    size_t n = strnlen(out, sizeof out);
    FUZZ_CHECK(n < sizeof out, "abort words not terminated");
    char name[32];
    snprintf(name, sizeof name, "rank %d ", peer);
    FUZZ_CHECK(strncmp(out, name, strlen(name)) == 0, "abort words '%.60s' do not start with '%s'",
               out, name);
    /* the reason itself (to its first NUL, less "aborted: ") is kept whole */
    const uint8_t *end = memchr(reason, 0, len);
    size_t rl = end ? (size_t)(end - reason) : len;
    if (rl >= 9 && memcmp(reason, "aborted: ", 9) == 0) {
        reason += 9;
        rl -= 9;
    }
    FUZZ_CHECK(n >= rl && memcmp(out + n - rl, reason, rl) == 0, "the reason was not kept whole");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 + CL_TCP_FRAME_HDR) return 0;
    uint8_t fl = data[0];
    cl_tcp_frame_rx rx = {.peer = data[1],
                          .generation = FUZZ_GEN,
                          .shm = fl & 1,
                          .mac_keyed = (fl & 2) || (fl & 4),
                          .mac_required = fl & 4};
    uint8_t h[CL_TCP_FRAME_HDR];
    memcpy(h, data + 2, sizeof h);
    if (fl & 8) h[12] = FUZZ_GEN, h[13] = h[14] = h[15] = 0;
    const uint8_t *rest = data + 2 + sizeof h;
    size_t rest_len = size - 2 - sizeof h;

    cl_tcp_frame f, g;
    memset(&f, 0, sizeof f); /* padding too: the two are compared whole */
    memset(&g, 0, sizeof g);
    cl_tcp_frame_decode(h, &f);
    uint8_t again[CL_TCP_FRAME_HDR];
    cl_tcp_frame_encode(again, &f);
    FUZZ_CHECK(memcmp(again + 4, h + 4, sizeof h - 4) == 0, "encode(decode(h)) != h");
    cl_tcp_frame_decode(again, &g);
    FUZZ_CHECK(memcmp(&f, &g, sizeof f) == 0, "decode(encode(f)) != f");

    char why[400] = "";
    int rc = cl_tcp_frame_check(h, &rx, &f, why, sizeof why);
    bool tagged = f.flags & TCP_FRAME_MAC;
    bool magic = memcmp(h, "CLTF", 4) == 0;
    if (rc != COLLIE_OK) {
        FUZZ_CHECK(rc == COLLIE_EPROTO || rc == COLLIE_EAUTH, "check returned %d", rc);
        FUZZ_CHECK_WHY(why);
        char name[32];
        snprintf(name, sizeof name, "rank %d ", rx.peer);
        FUZZ_CHECK(strncmp(why, name, strlen(name)) == 0,
                   "a refusal that does not name the sender");
        if (rc == COLLIE_EAUTH)
            FUZZ_CHECK(rx.mac_required && !tagged && magic && f.generation == FUZZ_GEN,
                       "EAUTH for something else than a missing tag");
        return 0;
    }
    FUZZ_CHECK(magic && f.generation == FUZZ_GEN, "passed a header of another magic/generation");
    FUZZ_CHECK(!tagged || rx.mac_keyed, "passed a tag on a link without a key");
    FUZZ_CHECK(tagged || !rx.mac_required, "passed an untagged frame where tags are required");
    uint8_t rest_fl = f.flags & (uint8_t)~TCP_FRAME_MAC;
    if (cl_tcp_frame_kind_ctl(f.kind)) {
        FUZZ_CHECK(rest_fl == 0 && f.length == 0, "a control frame with flags or a payload");
        return 0;
    }
    if (rest_fl & TCP_FRAME_LOAN)
        FUZZ_CHECK(rx.shm && f.length > 0 && f.kind != TCP_KIND_ABORT, "a loan it cannot be");
    if (rest_fl & (TCP_FRAME_RTS | TCP_FRAME_CLEARED))
        FUZZ_CHECK(f.kind != TCP_KIND_ABORT && f.step != TCP_P2P_STEP, "RTS/CLEARED off a "
                                                                       "collective frame");
    FUZZ_CHECK(!((rest_fl & TCP_FRAME_RTS) && (rest_fl & (TCP_FRAME_LOAN | TCP_FRAME_CLEARED))),
               "an announcement lent or cleared");
    FUZZ_CHECK(!(rest_fl & ~(TCP_FRAME_LOAN | TCP_FRAME_RTS | TCP_FRAME_CLEARED)),
               "unknown flags 0x%02x", f.flags);
    if (f.kind == TCP_KIND_ABORT) {
        FUZZ_CHECK(f.length <= TCP_ABORT_MAX, "an abort reason of %llu bytes",
                   (unsigned long long)f.length);
        size_t n = rest_len < f.length ? rest_len : (size_t)f.length;
        check_abort_words(rest, n, rx.peer);
        return 0;
    }
    collie_coll_kind k = (collie_coll_kind)f.kind;
    FUZZ_CHECK(f.kind < COLLIE_COLL_NUM_KINDS && k != COLLIE_COLL_RECV, "kind %u", f.kind);
    FUZZ_CHECK((f.step == TCP_P2P_STEP) == (k == COLLIE_COLL_SEND), "step %u of kind %u", f.step,
               f.kind);
    FUZZ_CHECK(k == COLLIE_COLL_BARRIER || f.dtype < COLLIE_NUM_DTYPES, "dtype %u", f.dtype);
    FUZZ_CHECK(!collie_coll_reduces(k) || f.op < COLLIE_NUM_REDOPS, "op %u", f.op);
    FUZZ_CHECK(collie_coll_has_root(k) || f.root == CL_TCP_NO_ROOT, "root %u", f.root);
    FUZZ_CHECK(collie_coll_is_v(k) || f.vcheck == 0, "counts check %u", f.vcheck);
    if (k == COLLIE_COLL_SEND)
        FUZZ_CHECK(f.length == f.count * collie_dtype_size((collie_dtype)f.dtype),
                   "a p2p frame of %llu bytes for %llu elements", (unsigned long long)f.length,
                   (unsigned long long)f.count);
    return 0;
}

/* ---- seeds: a header of every kind, as the senders write them ---------------------------- */

static void seed(const char *dir, const char *name, uint8_t fl, const cl_tcp_frame *f,
                 const char *reason) {
    uint8_t buf[2 + CL_TCP_FRAME_HDR + 128] = {fl, 1};
    cl_tcp_frame_encode(buf + 2, f);
    size_t rl = reason ? strlen(reason) : 0;
    memcpy(buf + 2 + CL_TCP_FRAME_HDR, reason ? reason : "", rl);
    fuzz_seed_write(dir, name, buf, 2 + CL_TCP_FRAME_HDR + rl);
}

static void fuzz_seeds(const char *dir) {
    char name[64];
    for (unsigned k = 0; k < COLLIE_COLL_NUM_KINDS; k++) {
        if (k == COLLIE_COLL_RECV) continue;
        bool p2p = k == COLLIE_COLL_SEND;
        cl_tcp_frame f = {.kind = (uint8_t)k,
                          .dtype = COLLIE_FP32,
                          .op = COLLIE_SUM,
                          .step = p2p ? TCP_P2P_STEP : 1,
                          .generation = FUZZ_GEN,
                          .seq = 5,
                          .count = 16,
                          .length = 64,
                          .root = collie_coll_has_root((collie_coll_kind)k) ? 0 : CL_TCP_NO_ROOT,
                          .vcheck = collie_coll_is_v((collie_coll_kind)k) ? 0x1234 : 0};
        snprintf(name, sizeof name, "%s", collie_coll_kind_name((collie_coll_kind)k));
        seed(dir, name, 0, &f, NULL);
        if (p2p) continue;
        f.flags = TCP_FRAME_RTS | TCP_FRAME_MAC;
        snprintf(name, sizeof name, "%s-rts-tagged", collie_coll_kind_name((collie_coll_kind)k));
        seed(dir, name, 4, &f, NULL);
        f.flags = TCP_FRAME_LOAN;
        snprintf(name, sizeof name, "%s-loan-shm", collie_coll_kind_name((collie_coll_kind)k));
        seed(dir, name, 1, &f, NULL);
        f.flags = TCP_FRAME_CLEARED;
        snprintf(name, sizeof name, "%s-cleared", collie_coll_kind_name((collie_coll_kind)k));
        seed(dir, name, 0, &f, NULL);
    }
    static const struct {
        uint8_t kind;
        const char *name;
    } ctl[] = {{TCP_KIND_BYE, "bye"},
               {TCP_KIND_CREDIT, "credit"},
               {TCP_KIND_CTS, "cts"},
               {TCP_KIND_GONE, "gone"},
               {TCP_KIND_HEARTBEAT, "heartbeat"}};
    for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++) {
        cl_tcp_frame f = {.kind = ctl[i].kind, .generation = FUZZ_GEN, .root = CL_TCP_NO_ROOT};
        if (ctl[i].kind == TCP_KIND_CREDIT) f.count = 4096, f.root = 1 << 24;
        if (ctl[i].kind == TCP_KIND_CTS || ctl[i].kind == TCP_KIND_GONE) f.seq = 9, f.step = 2;
        seed(dir, ctl[i].name, 0, &f, NULL);
    }
    static const char *reasons[] = {"aborted: rank 1 timed out", "rank 1 hit a mismatch",
                                    "watchdog: stalled\nseq 4"};
    for (size_t i = 0; i < 3; i++) {
        cl_tcp_frame f = {.kind = TCP_KIND_ABORT,
                          .generation = FUZZ_GEN,
                          .root = CL_TCP_NO_ROOT,
                          .length = strlen(reasons[i])};
        snprintf(name, sizeof name, "abort-%zu", i);
        seed(dir, name, 0, &f, reasons[i]);
    }
}

FUZZ_SEEDS_MAIN(fuzz_seeds)
