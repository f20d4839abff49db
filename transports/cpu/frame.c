/*
 * frame.c — the TCP frame header: encoding, decoding, the receiver's checks,
 * an ABORT's words (contracts in frame.h, layout in cpu.h).
 *
 * Design notes
 *  - Pure: no connection, no I/O. tcp_conn_read.c hands every header it reads
 *    to cl_tcp_frame_check before it matches, parks or acts on it, so what a
 *    peer controls in a header is judged by code the fuzzer runs
 *    (tests/fuzz/fuzz_tcp_frame.c).
 *  - What can be checked from the header alone is checked here: the fields
 *    every sender writes the same way for a kind (cl_tcp_frame_header,
 *    tcp_exec.c). What needs this rank's post (the arguments, the counts
 *    check's value, the frame's length against the slot) stays with the
 *    matching in tcp_conn_match.c.
 *  - Order: magic and generation, then the MAC flag (an untagged frame on a
 *    link that requires tags is refused as EAUTH before anything else is
 *    judged), then flags, kind and fields.
 */
#include "transports/cpu/frame.h"

#include <stdio.h>
#include <string.h>

#include "collie.h"
#include "collie_backend.h"
#include "base/endian.h"
#include "transports/cpu/cpu.h"

void cl_tcp_frame_encode(uint8_t h[CL_TCP_FRAME_HDR], const cl_tcp_frame *f) {
    cl_put32le(h, TCP_FRAME_MAGIC);
    h[4] = f->kind;
    h[5] = f->dtype;
    h[6] = f->op;
    h[7] = f->flags;
    cl_put32le(h + 8, f->step);
    cl_put32le(h + 12, f->generation);
    cl_put64le(h + 16, f->seq);
    cl_put64le(h + 24, f->count);
    cl_put64le(h + 32, f->length);
    cl_put32le(h + 40, f->root);
    cl_put32le(h + 44, f->vcheck);
}

void cl_tcp_frame_decode(const uint8_t h[CL_TCP_FRAME_HDR], cl_tcp_frame *f) {
    f->kind = h[4];
    f->dtype = h[5];
    f->op = h[6];
    f->flags = h[7];
    f->step = cl_get32le(h + 8);
    f->generation = cl_get32le(h + 12);
    f->seq = cl_get64le(h + 16);
    f->count = cl_get64le(h + 24);
    f->length = cl_get64le(h + 32);
    f->root = cl_get32le(h + 40);
    f->vcheck = cl_get32le(h + 44);
}

bool cl_tcp_frame_kind_ctl(uint8_t kind) {
    return kind == TCP_KIND_BYE || kind == TCP_KIND_CREDIT || kind == TCP_KIND_CTS ||
           kind == TCP_KIND_GONE || kind == TCP_KIND_HEARTBEAT;
}

/* Byte 7: a lent payload (only over shared memory, never empty, never an
 * ABORT), an announcement or a cleared frame (collective data frames only;
 * an announcement is never lent); control frames carry no payload. The MAC
 * bit is judged apart. */
static bool frame_flags_valid(const cl_tcp_frame *f, bool shm) {
    uint8_t fl = f->flags & (uint8_t)~TCP_FRAME_MAC;
    if (cl_tcp_frame_kind_ctl(f->kind)) return fl == 0 && f->length == 0;
    if (fl & ~(TCP_FRAME_LOAN | TCP_FRAME_RTS | TCP_FRAME_CLEARED)) return false;
    if ((fl & TCP_FRAME_LOAN) && (!shm || f->kind == TCP_KIND_ABORT || !f->length)) return false;
    if (!(fl & (TCP_FRAME_RTS | TCP_FRAME_CLEARED))) return true;
    if (f->kind == TCP_KIND_ABORT || f->step == TCP_P2P_STEP) return false;
    return !((fl & TCP_FRAME_RTS) && (fl & (TCP_FRAME_LOAN | TCP_FRAME_CLEARED)));
}

/* The fields a data frame of its kind has fixed; NULL or what is wrong. */
static const char *frame_fields_wrong(const cl_tcp_frame *f) {
    collie_coll_kind k = (collie_coll_kind)f->kind;
    bool p2p = f->step == TCP_P2P_STEP;
    if (f->kind >= COLLIE_COLL_NUM_KINDS) return "an unknown kind";
    if (p2p != (k == COLLIE_COLL_SEND) || k == COLLIE_COLL_RECV)
        return p2p ? "a point-to-point frame that is no send" : "a collective frame of a send";
    if (k != COLLIE_COLL_BARRIER && f->dtype >= COLLIE_NUM_DTYPES) return "an unknown dtype";
    if (collie_coll_reduces(k) && f->op >= COLLIE_NUM_REDOPS) return "an unknown reduction op";
    if (!collie_coll_has_root(k) && f->root != CL_TCP_NO_ROOT)
        return "a root for a kind without one";
    if (!collie_coll_is_v(k) && f->vcheck != 0) return "a counts check for a kind without counts";
    if (p2p) { /* the sender's length: count elements (tcp_exec.c, work_start_p2p) */
        uint64_t es = cl_dtype_size((collie_dtype)f->dtype);
        if (f->length != f->count * es) return "a length that is not its count's";
    }
    return NULL;
}

int cl_tcp_frame_check(const uint8_t h[CL_TCP_FRAME_HDR], const cl_tcp_frame_rx *rx,
                       cl_tcp_frame *f, char *why, size_t why_len) {
    cl_tcp_frame_decode(h, f);
    int peer = rx->peer;
    if (cl_get32le(h) != TCP_FRAME_MAGIC) {
        snprintf(why, why_len, "rank %d sent a malformed frame (bad magic 0x%08x)", peer,
                 cl_get32le(h));
        return COLLIE_EPROTO;
    }
    if (f->generation != rx->generation) {
        snprintf(why, why_len, "rank %d sent a malformed frame (generation %u, this comm's is %u)",
                 peer, f->generation, rx->generation);
        return COLLIE_EPROTO;
    }
    bool tagged = f->flags & TCP_FRAME_MAC;
    if (tagged && !rx->mac_keyed) {
        snprintf(why, why_len,
                 "rank %d sent a malformed frame (a MAC tag on a link without a session key: no "
                 "secret, or shared memory)",
                 peer);
        return COLLIE_EPROTO;
    }
    if (!tagged && rx->mac_required) {
        snprintf(why, why_len,
                 "rank %d sends frames without a MAC (COLLIE_FRAME_MAC=0 there?); this rank "
                 "requires one (the job has a secret and COLLIE_FRAME_MAC=1 here): set "
                 "COLLIE_FRAME_MAC the same on every rank",
                 peer);
        return COLLIE_EAUTH;
    }
    if (!frame_flags_valid(f, rx->shm)) {
        snprintf(why, why_len,
                 "rank %d sent a malformed frame (flags 0x%02x on a frame of kind %u)", peer,
                 f->flags, f->kind);
        return COLLIE_EPROTO;
    }
    if (cl_tcp_frame_kind_ctl(f->kind)) return COLLIE_OK;
    if (f->kind == TCP_KIND_ABORT) {
        if (f->length <= TCP_ABORT_MAX) return COLLIE_OK;
        snprintf(why, why_len,
                 "rank %d sent a malformed frame (an abort reason of %llu bytes, at most %d)", peer,
                 (unsigned long long)f->length, TCP_ABORT_MAX);
        return COLLIE_EPROTO;
    }
    const char *wrong = frame_fields_wrong(f);
    if (!wrong) return COLLIE_OK;
    snprintf(why, why_len,
             "rank %d sent a malformed frame (%s: kind %u, dtype %u, op %u, step %u, count %llu, "
             "length %llu, root %u, counts check %u)",
             peer, wrong, f->kind, f->dtype, f->op, f->step, (unsigned long long)f->count,
             (unsigned long long)f->length, f->root, f->vcheck);
    return COLLIE_EPROTO;
}

void cl_tcp_frame_abort_words(const char *reason, size_t len, int peer, char *out, size_t out_len) {
    const char *end = memchr(reason, '\0', len);
    size_t n = end ? (size_t)(end - reason) : len;
    if (n >= 9 && strncmp(reason, "aborted: ", 9) == 0) { /* the comm's wording of its abort */
        reason += 9;
        n -= 9;
    }
    char prefix[32];
    int p = snprintf(prefix, sizeof prefix, "rank %d ", peer);
    if (n >= (size_t)p && strncmp(reason, prefix, (size_t)p) == 0) /* it names its rank already */
        snprintf(out, out_len, "%.*s", (int)n, reason);
    else
        snprintf(out, out_len, "rank %d failed: %.*s", peer, (int)n, reason);
}
