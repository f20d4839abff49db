/*
 * frame.h — the TCP transport's frame header (its layout is in cpu.h):
 * encoding, decoding and the checks a receiver makes of a header before it
 * acts on it, and the words of a peer's ABORT, as pure functions.
 * tcp_conn_read.c calls them on every header it reads;
 * tests/fuzz/fuzz_tcp_frame.c feeds them.
 */
#ifndef CL_TCP_FRAME_H
#define CL_TCP_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CL_TCP_FRAME_HDR 48
#define CL_TCP_NO_ROOT   0xffffffffu /* the root field of kinds without one */

/* A header, decoded (cpu.h: offsets). */
typedef struct cl_tcp_frame {
    uint8_t kind, dtype, op, flags;
    uint32_t step, generation;
    uint64_t seq, count, length;
    uint32_t root, vcheck;
} cl_tcp_frame;

/* What the receiver of a link knows when a header comes. */
typedef struct cl_tcp_frame_rx {
    int peer;            /* the sender's rank, for messages */
    uint32_t generation; /* the comm's generation (its low 32 bits) */
    bool shm;            /* the link is shared memory (a lent payload may come) */
    bool mac_keyed;      /* the link has a session key: a tagged frame may come */
    bool mac_required;   /* ... and COLLIE_FRAME_MAC is on here: every frame carries a tag */
} cl_tcp_frame_rx;

void cl_tcp_frame_encode(uint8_t h[CL_TCP_FRAME_HDR], const cl_tcp_frame *f);
void cl_tcp_frame_decode(const uint8_t h[CL_TCP_FRAME_HDR], cl_tcp_frame *f);

/* cl_tcp_frame_kind_ctl: a frame of a header alone that the reader acts on
 * itself: BYE, CREDIT, CTS, GONE, HEARTBEAT (an ABORT carries its reason; RTS are
 * collective frames). */
bool cl_tcp_frame_kind_ctl(uint8_t kind);

/* cl_tcp_frame_check: decode header h into f and check it as the receiver
 * `rx` must before acting on it: magic, generation, the MAC flag against
 * the link, the flags (a loan only over shared memory, RTS/CLEARED only on
 * collective frames, control frames bare), the kind, and the fields every
 * kind has fixed (p2p: a send whose length is count elements of a valid
 * dtype; collective: a valid dtype and reduction op where they matter, no
 * root for kinds without one, a counts check only for the v collectives;
 * ABORT: a reason of at most TCP_ABORT_MAX bytes). Returns COLLIE_OK,
 * COLLIE_EPROTO (malformed) or COLLIE_EAUTH (an untagged frame where the
 * MAC is required: the stream is refused), with `why` naming the sender and
 * the fault. */
int cl_tcp_frame_check(const uint8_t h[CL_TCP_FRAME_HDR], const cl_tcp_frame_rx *rx,
                       cl_tcp_frame *f, char *why, size_t why_len);

/* cl_tcp_frame_abort_words: the failure a peer's ABORT frame (its reason,
 * `len` bytes, not NUL-terminated; up to its first NUL) stands for, in the
 * words of the store's abort notice (comm_ctl.c): the reason as the peer's
 * comm worded it, named after `peer` unless it names it already. Writes a
 * NUL-terminated string into out. */
void cl_tcp_frame_abort_words(const char *reason, size_t len, int peer, char *out, size_t out_len);

#endif
